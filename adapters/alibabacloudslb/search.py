"""The garbage search: finding this cluster's VServer groups on the account's load balancers,
within a budget of SLB calls per garbage pass.

A Service deleted while the controller was down may have named a load balancer that no live
Service names any more, so its group is looked for everywhere: the region's load balancers page
by page (``DescribeLoadBalancers``), then each one's groups that carry this cluster's tag
(``DescribeVServerGroups`` filtered by SLB itself). An operator can narrow the search to a list
of load balancers (plus those live Services name); there, groups from before the tags (untagged,
named by the adapter's convention) are found too. A sweep that needs more calls than one pass may
make stops where its budget ends, says so in the log, and goes on at the next pass.
docs/alibabacloudslb.md, "Tags and the garbage search".
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from resourceconsist.flow.cancellation import call_adapter

from . import config
from .slbclient import MAX_LOAD_BALANCERS_PER_PAGE, SLBClient, SLBNotFound, VServerGroup

#: The adapter's logger, as strategy.py's: the search's lines read as the adapter's.
log = logging.getLogger("resourceconsist.adapters.alibabacloudslb.adapter")


@dataclass
class GroupSearch:
    """One controller's garbage search and where its current sweep stands (kept across passes)."""

    client: SLBClient
    #: The most SLB calls one pass's ``next_groups`` makes.
    budget: int
    #: When not empty, only these load balancers (and those live Services name) are looked at.
    load_balancers: tuple[str, ...] = ()
    #: For log lines.
    name: str = ""
    #: Load balancers per ``DescribeLoadBalancers`` page.
    page_size: int = MAX_LOAD_BALANCERS_PER_PAGE
    #: Load balancers of the current sweep not looked through yet.
    _queue: deque[str] = field(default_factory=deque, init=False)
    #: The next page of ``DescribeLoadBalancers`` in the current sweep; None: no page is left.
    _next_page: int | None = field(default=None, init=False)
    _sweeping: bool = field(default=False, init=False)
    #: SLB calls the last ``next_groups`` made (for tests and logs).
    last_calls: int = field(default=0, init=False)

    @property
    def narrowed(self) -> bool:
        return bool(self.load_balancers)

    async def next_groups(
        self, cluster_name: str, named: Iterable[str] = ()
    ) -> list[tuple[str, VServerGroup]]:
        """This cluster's groups found by this pass's share of the sweep, with their load balancer.

        ``named``: the load balancers live Services name, added to a narrowed sweep. A group
        tagged with another cluster is never returned; an untagged one only on a narrowed sweep
        and only under the adapter's naming convention.
        """
        if not self._sweeping:
            self._sweeping = True
            if self.narrowed:
                self._queue = deque(sorted({*self.load_balancers, *(lb for lb in named if lb)}))
                self._next_page = None
            else:
                self._queue = deque()
                self._next_page = 1
        calls = 0
        found: list[tuple[str, VServerGroup]] = []
        wanted = {config.CLUSTER_TAG: cluster_name}
        try:
            while self._queue or self._next_page is not None:
                if calls >= self.budget:
                    log.info(
                        "%s: garbage search used its budget of %d SLB calls; %d load balancers%s left "
                        "for the next pass",
                        self.name,
                        self.budget,
                        len(self._queue),
                        " and more pages" if self._next_page is not None else "",
                    )
                    return found
                calls += 1
                if self._queue:
                    lb = self._queue[0]
                    found += await self._groups_of(lb, cluster_name, wanted)
                    self._queue.popleft()
                else:
                    page_number = self._next_page or 1
                    page = await call_adapter(
                        functools.partial(
                            self.client.describe_load_balancers, page_number, page_size=self.page_size
                        )
                    )
                    self._queue.extend(page.load_balancer_ids)
                    self._next_page = None if page.last else page_number + 1
            self._sweeping = False  # done: the next pass starts a new sweep
            return found
        finally:
            self.last_calls = calls

    async def _groups_of(
        self, lb: str, cluster_name: str, wanted: dict[str, str]
    ) -> list[tuple[str, VServerGroup]]:
        try:
            if not self.narrowed:
                tagged = await call_adapter(
                    functools.partial(self.client.describe_vserver_groups, lb, tags=wanted)
                )
                # SLB filtered them; checked again, since a group of another cluster must never pass.
                return [(lb, g) for g in tagged if g.tags.get(config.CLUSTER_TAG) == cluster_name]
            groups = await call_adapter(self.client.describe_vserver_groups, lb)
        except SLBNotFound:
            return []  # the load balancer is gone, and its groups with it
        return [(lb, g) for g in groups if claims(g, cluster_name)]


def claims(group: VServerGroup, cluster_name: str) -> bool:
    """The group is this cluster's: tagged with its name, or untagged and named by the adapter's
    convention (made before the tags; tagged on its Service's next pass)."""
    tagged = group.tags.get(config.CLUSTER_TAG)
    if tagged is not None:
        return tagged == cluster_name
    return group.name.startswith(config.GROUP_NAME_PREFIX)
