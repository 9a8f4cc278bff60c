"""The shard side of sharding: what one replica acts on, and how it lets go (docs/scaling.md).

A replica announces itself with its shard Lease (held by ``LeaderElector`` like leader
election's, named after the shard and labeled with the ring); its controllers run only while it
holds it. Its employer cache lists and watches only the employers whose shard label names it
(``ShardGate.selector``). Before each pass the controller asks ``ShardGate.may_act``: the cached
employer must carry this shard's label and no drain label. An employer carrying the drain label
is let go right there, inside the worker that holds its key, so no pass of it runs meanwhile or
afterwards: the shard removes both labels in one write (under the employer's resourceVersion),
the cache drops it, and the sharder assigns it to its new shard, which starts with a full pass.

The ring (``ShardGate.ring_owns``) tells whose a key is when no employer says it: a gone
employer's garbage pass runs on the one replica its key hashes to.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import Informer, WatchEvent
from resourceconsist.cluster.kube import EmployerKey, KubeClient, KubeObject, Resource
from resourceconsist.runtime.sharding.ring import (
    HashRing,
    drain_label,
    resource_hash_key,
    ring_of,
    shard_label,
    shard_of_lease,
)

log = logging.getLogger(__name__)


def _labels(obj: KubeObject | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


class ShardGate:
    """One shard's view of its ring: which employers it may act on, and the drain."""

    def __init__(
        self,
        client: KubeClient,
        ring: str,
        shard: str,
        leases: Informer | None = None,
        *,
        on_drained: Callable[[], None] = lambda: None,
    ) -> None:
        self.client = client
        self.ring = ring
        self.shard = shard
        self.shard_label = shard_label(ring)
        self.drain_label = drain_label(ring)
        #: The ring's shard Leases (for ``ring_owns``); None: no key is known to be this shard's.
        self.leases = leases
        #: Employers this shard let go of so far (drains acknowledged).
        self.drained = 0
        self._on_drained = on_drained
        self._ring_cache: tuple[float, HashRing] | None = None
        #: False from the moment the replica begins to stop: no pass starts here any more, even
        #: before its controllers have stopped (docs/scaling.md, "Stopping").
        self.open = True
        #: Keys whose drain this shard acknowledged (its let-go write landed) and that no pass
        #: has run on since: a worker still holding one of them runs no pass of it. A key leaves
        #: the set only when ``may_act`` lets a pass of it run again (it came back), so a worker
        #: that asks about it again while the cache still shows the drained version is not
        #: taken for acting on it (bounded by the employers this shard ever let go of).
        self.let_go_of: set[str] = set()

    @property
    def selector(self) -> str:
        """The label selector of this shard's employers."""
        return f"{self.shard_label}={self.shard}"

    def assigned(self, obj: KubeObject | None) -> bool:
        """``obj`` is this shard's and not being moved away: a pass of it may run."""
        labels = _labels(obj)
        return labels.get(self.shard_label) == self.shard and self.drain_label not in labels

    def draining(self, obj: KubeObject | None) -> bool:
        """``obj`` is this shard's and the sharder asks it to let go."""
        labels = _labels(obj)
        return labels.get(self.shard_label) == self.shard and self.drain_label in labels

    def left(self, event: WatchEvent) -> bool:
        """A DELETED event of an employer that was not deleted but left this shard (the label-
        selected watch drops it): not a gone employer, and no pass of it is due here."""
        return event.type == "DELETED" and _labels(event.obj).get(self.shard_label) != self.shard

    def ring_owns(self, resource: Resource, key: EmployerKey) -> bool:
        """The ring places ``key`` (of ``resource``) on this shard."""
        ring = self._ring()
        return ring.shard_of(resource_hash_key(resource, key.namespace, key.name)) == self.shard

    def _ring(self) -> HashRing:
        """The ring as the Leases say now; built again at most once a second (a garbage pass asks
        for many keys at once)."""
        now = time.monotonic()
        if self._ring_cache is not None and now - self._ring_cache[0] < 1.0:
            return self._ring_cache[1]
        leases = self.leases.store.list() if self.leases is not None else []
        moment = datetime.datetime.now(datetime.UTC)
        ring = ring_of(shard_of_lease(lease, moment) for lease in leases)
        self._ring_cache = (now, ring)
        return ring

    async def may_act(self, resource: Resource, key: EmployerKey, cached: KubeObject | None) -> bool:
        """Whether a pass of ``key`` may run on this shard now; lets go of a draining employer.

        In the cache: only when it is this shard's and not draining. Not in the cache: a pass
        that finds it gone runs only when the API server says it is gone; one that exists is
        another shard's (or nobody's yet), and this one keeps its hands off. False once the gate
        is closed (the replica stops)."""
        if not self.open:
            return False
        if cached is not None and self.draining(cached):
            # Also when this shard let go of it already and the cache has not caught up: the
            # write is made against the live object and is none when it no longer drains here.
            await asyncio.to_thread(self._let_go, resource, cached)
            return False
        if cached is not None:
            acts = self.assigned(cached)
        else:
            live = await asyncio.to_thread(self.client.get_or_none, resource, key.namespace_or_none, key.name)
            acts = live is None
        if acts:
            self.let_go_of.discard(key)
        return acts

    def _let_go(self, resource: Resource, cached: KubeObject) -> None:
        """Acknowledge the drain: both labels off in one write, unless the employer is no longer
        this shard's draining one (then there is nothing to acknowledge)."""
        meta = cached["metadata"]

        def change(obj: KubeObject) -> dict[str, Any] | None:
            if not self.draining(obj):
                return None
            return {"metadata": {"labels": {self.shard_label: None, self.drain_label: None}}}

        _, wrote = self.client.patch_optimistic(
            resource, meta.get("namespace") or None, meta["name"], change, current=cached
        )
        if wrote:
            # Marked here, as the write lands, not once the worker is back on the event loop:
            # the new shard may have the employer before then.
            self.let_go_of.add(kube.object_key(cached))
            self.drained += 1
            self._on_drained()
            log.info(
                "shard %s let go of %s %s (drained for the ring %s)",
                self.shard,
                resource.kind,
                kube.object_key(cached),
                self.ring,
            )
