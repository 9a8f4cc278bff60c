"""Manage mode: ``ManageStrategy``, and how a ready pod's backend is built (``annotated_backend``).

The adapter owns one VServer group, ``resourceconsist/<namespace>/<service>``, tagged with the
cluster's name and the Service (``config.group_tags``), and keeps its backends (pod IPs on ENIs,
or ECIs) equal to the ready pods: adds them (weight from an annotation, default 100), sets a
leaving pod's weight to 0 first and removes it later (after an optional drain), and deletes the
group with the Service. It never touches another group (one of that name tagged with another
cluster included), nor a backend of its group that it did not write (ours carry the
``resourceconsist/<pod>`` description). Drain clocks live in the per-Service ``ctx.memo``, which
the frame drops with the Service (docs/alibabacloudslb.md, "Manage").
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from resourceconsist.adapter import (
    Employee,
    Employer,
    Outcome,
    OwnedItem,
    PodEmployeeStatuses,
    ReconcileContext,
    pod_employee_statuses,
)
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.errors import ResourceConsistError
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.rules import lifecycle

from . import config
from .config import LOAD_BALANCER_ID_LABEL, Mode, SLBConfigError
from .items import Attached, Desired, GroupEmployer, GroupStatus, ManagedEmployee
from .search import GroupSearch, claims
from .settings import MISSING_CLUSTER_NAME
from .slbclient import BackendKey, BackendServer, SLBError, SLBNotFound, VServerGroup
from .strategy import Change, ModeStrategy, Tools, log, pod_name

#: Where the drain clocks live in the frame's per-Service ``ctx.memo``.
_DRAIN_KEY: Final = "alibabacloudslb.drain_since"
#: The backends one SLB write changes, each with the id of the item it is for.
_Ops = list[tuple[str, BackendServer]]

_ORPHAN_UNSAFE = re.compile(r"[^A-Za-z0-9.-]")
#: The tail ``config.vserver_group_name`` gives a shortened name.
_SHORTENED = re.compile(r"-[0-9a-f]{10}$")
#: How soon a pass looks again while SLB's health check has not yet passed a backend that a
#: readiness gate waits on: SLB's default health-check interval.
HEALTH_POLL_SECONDS: Final = 2.0


class Unresolved(ResourceConsistError):
    """A ready pod for which no backend can be built yet; the message says why."""


def annotated_backend(service: KubeObject, pod: KubeObject) -> BackendServer:
    """The default resolver: pod IP, ``ServerId`` from the pod's server-id annotation.

    SLB wants the ENI id (``eni-...``) or ECI instance id beside the IP. Nothing in the pod
    object carries the ENI id of a shared-ENI terway pod, and this project has no ECS client, so
    it is read from ``resource-consist.kusionstack.io/slb-backend-server-id``; pass another
    resolver (e.g. one asking ECS ``DescribeNetworkInterfaces`` by IP) to ``SLBAdapter``.
    """
    name = pod_name(pod)
    ip = config.pod_ip(pod)
    if not ip:
        raise Unresolved("the pod has no IP yet")
    port = config.backend_port(service, pod)
    if port is None:
        raise Unresolved(f"the pod declares no container port named by {config.PORT_ANNOTATION} / targetPort")
    server_id = (pod["metadata"].get("annotations") or {}).get(config.SERVER_ID_ANNOTATION, "").strip()
    if not server_id:
        raise Unresolved(f"the pod has no {config.SERVER_ID_ANNOTATION} annotation (its ENI or ECI id)")
    return BackendServer(
        server_id=server_id,
        port=port,
        weight=config.backend_weight(service, pod),
        server_type=config.backend_type(service, pod),
        server_ip=ip,
        description=config.member_description(name),
    )


@dataclass(eq=False)
class ManageStrategy(ModeStrategy):
    """Our VServer group is the employer; one item per relevant pod (and per orphan backend)."""

    mode = Mode.MANAGE

    group_name: str = field(default="", init=False)
    #: The tags our group carries (``config.group_tags``).
    tags: dict[str, str] = field(default_factory=dict, init=False)
    drain_seconds: float = field(default=0.0, init=False)
    group: VServerGroup | None = field(default=None, init=False)
    group_read: bool = field(default=False, init=False)
    expected: list[Employee] | None = field(default=None, init=False)
    current: list[Employee] | None = field(default=None, init=False)
    #: Our backends in the group, by the item (pod or orphan) they belong to.
    attached: dict[str, tuple[BackendServer, ...]] = field(default_factory=dict, init=False)
    #: Whether a pod waits on this Service's readiness gate: then SLB's health decides whether
    #: a backend serves, and is read once per pass (docs/alibabacloudslb.md, "Manage").
    health_matters: bool = field(default=False, init=False)

    def read_settings(self) -> None:
        if not self.tools.cluster_name:
            raise SLBConfigError(f"Service {self.ctx.employer_key}: {MISSING_CLUSTER_NAME}")
        self.group_name = config.vserver_group_name(self.service)
        self.tags = config.group_tags(self.tools.cluster_name, self.service)
        self.drain_seconds = config.drain_seconds(self.service)

    def selected_employee_names(self) -> list[str]:
        """Also the pods still holding our finalizer.

        The frame (record mode) strips the lifecycle finalizer from recorded pods that are no
        longer selected, at once. Here an unselected pod keeps its backend until it is drained
        and removed, so it must keep the finalizer as long: it stays "selected" while it carries
        it, and the normal item flow releases it after the removal.
        """
        names = super().selected_employee_names()
        known = set(names)
        for pod in self.ctx.reader.list(kube.POD, self.namespace):
            if pod_name(pod) not in known and config.carries_finalizer(pod, self.finalizer, self.guard):
                names.append(pod_name(pod))
        return names

    @classmethod
    async def list_owned(cls, tools: Tools, ctx: ReconcileContext, search: GroupSearch) -> list[OwnedItem]:
        """Our VServer groups found by this pass's share of the garbage search (search.py), each
        owned by the Service its tags name (an untagged one from before the tags: the Service
        its name names, unless the name may be shortened, which names no Service for sure).

        Without a cluster name nothing is ours for sure: nothing is listed, so nothing collected.
        The stand-in of a gone owner says manage mode, so collecting a group is this strategy's
        ``delete_employers``.
        """
        services = [s for s in ctx.reader.list(kube.SERVICE) if config.is_slb_service(s)]
        if not tools.cluster_name:
            # Loud only where manage mode is in use: observe mode needs no cluster name.
            managed = any(
                config.MODE_ANNOTATION in (s["metadata"].get("annotations") or {}) for s in services
            )
            level = logging.WARNING if managed else logging.DEBUG
            log.log(level, "%s: no garbage search for VServer groups: %s", tools.name, MISSING_CLUSTER_NAME)
            return []
        named = {config.load_balancer_id(service) for service in services}
        owned: list[OwnedItem] = []
        for lb, group in await search.next_groups(tools.cluster_name, named):
            owner = (
                config.tagged_owner(group.tags)
                if config.CLUSTER_TAG in group.tags
                else _group_owner(group.name)
            )
            if owner is None:
                continue
            owned.append(
                OwnedItem(
                    owner=owner,
                    id=f"VServer group {group.name} ({group.id}) on {lb}",
                    labels={LOAD_BALANCER_ID_LABEL: lb},
                    annotations={config.MODE_ANNOTATION: cls.mode.value},
                )
            )
        return owned

    # -- employer: our VServer group ------------------------------------------------------------------

    async def expected_employers(self) -> list[Employer]:
        if self.deleting:
            return []
        return [GroupEmployer(id=self.group_name, statuses=GroupStatus(load_balancer_id=self.lb_id))]

    async def current_employers(self) -> list[Employer]:
        await self._read_group()
        if self.group is None:
            return []
        if not self.deleting:
            await self._ensure_tags(self.group)
        return [
            GroupEmployer(
                id=self.group_name,
                statuses=GroupStatus(load_balancer_id=self.lb_id, vserver_group_id=self.group.id),
            )
        ]

    async def create_employers(self, to_create: list[Employer]) -> Outcome[Employer]:
        done: list[Employer] = []
        for item in to_create:
            if item.id != self.group_name:
                raise self.not_ours("create", item)
            try:
                group_id = await call_adapter(
                    functools.partial(
                        self.tools.client.create_vserver_group, self.lb_id, item.id, tags=self.tags
                    )
                )
            except SLBError as err:
                return self._deferred("creating VServer group", err, done, to_create)
            self.group = VServerGroup(id=group_id, name=item.id, load_balancer_id=self.lb_id, tags=self.tags)
            self.log(logging.INFO, "created VServer group %s (%s) on %s", item.id, group_id, self.lb_id)
            done.append(item)
        return done, []

    async def delete_employers(self, to_delete: list[Employer]) -> Outcome[Employer]:
        done: list[Employer] = []
        for item in to_delete:
            status = item.statuses
            if (
                not isinstance(status, GroupStatus)
                or item.id != self.group_name
                or not status.vserver_group_id
            ):
                raise self.not_ours("delete", item)
            members = await self._members()
            if members:
                # The group goes only once its backends are drained (weight 0 for the drain
                # seconds) and removed, which the employee side of this pass starts: a listener
                # still attached to it routes to them until then (docs/alibabacloudslb.md, "Tags
                # and the garbage search"). Not done yet, not a failure: a later pass deletes it.
                self.log(
                    logging.INFO,
                    "deleting VServer group %s waits for its %d backends to be drained and removed",
                    item.id,
                    len(members),
                )
                return done, [i for i in to_delete if i not in done]
            try:
                await call_adapter(
                    functools.partial(
                        self.tools.client.delete_vserver_group,
                        status.vserver_group_id,
                        load_balancer_id=status.load_balancer_id,
                    )
                )
            except SLBNotFound:
                pass  # already gone
            except SLBError as err:
                return self._deferred("deleting VServer group", err, done, to_delete)
            self.log(logging.INFO, "deleted VServer group %s (%s)", item.id, status.vserver_group_id)
            self.group = None
            done.append(item)
        return done, []

    def _deferred(
        self, what: str, err: SLBError, done: list[Employer], items: list[Employer]
    ) -> Outcome[Employer]:
        """A transient error ends the call: what is done is done, the rest waits for a later pass."""
        if not err.transient:
            raise err
        self.log(logging.INFO, "%s deferred: %s", what, err)
        for item in items:
            if item not in done:
                self.ctx.fail_item(item.id, f"{err.action}: {err.message}", err.code)
        return done, [i for i in items if i not in done]

    # -- employees --------------------------------------------------------------------------------------

    async def expected_employees(self) -> list[Employee]:
        await self._plan()
        return list(self.expected or [])

    async def current_employees(self) -> list[Employee]:
        if self.current is None:
            await self._plan()
        return list(self.current or [])

    async def change_employees(self, change: Change, items: list[Employee]) -> Outcome[Employee]:
        return await self._converge(items, leaving=change == "delete")

    # -- reading and planning ------------------------------------------------------------------------------

    def _drain_clocks(self) -> dict[BackendKey, float]:
        """When each of the Service's backends was set to weight 0 (kept across passes)."""
        clocks: dict[BackendKey, float] = self.ctx.memo.setdefault(_DRAIN_KEY, {})
        return clocks

    async def _read_group(self) -> None:
        if self.group_read:
            return
        self.group_read = True
        groups = await self.read_load_balancer(
            self.tools.client.describe_vserver_groups,
            f"its VServer group {self.group_name}, if any, is left in place",
        )
        if groups is None:
            return
        named = [g for g in groups if g.name == self.group_name]
        cluster = self.tools.cluster_name
        for other in named:
            if not claims(other, cluster):
                self.log(
                    logging.DEBUG,
                    "VServer group %s (%s) on %s belongs to cluster %r: left alone",
                    other.name,
                    other.id,
                    self.lb_id,
                    other.tags.get(config.CLUSTER_TAG),
                )
        # Ours: tagged with this cluster (this very Service first), else untagged from before the
        # tags; a group tagged with another cluster is never read, changed or deleted.
        uid = self.tags.get(config.SERVICE_UID_TAG)
        ours = sorted(
            (g for g in named if claims(g, cluster)),
            key=lambda g: (
                0 if uid and g.tags.get(config.SERVICE_UID_TAG) == uid else 1,
                0 if config.CLUSTER_TAG in g.tags else 1,
                g.id,
            ),
        )
        if len(ours) > 1:
            self.log(
                logging.WARNING,
                "%d VServer groups named %s on %s (%s); using %s and leaving the others",
                len(ours),
                self.group_name,
                self.lb_id,
                ", ".join(g.id for g in ours),
                ours[0].id,
            )
        self.group = ours[0] if ours else None

    async def _ensure_tags(self, group: VServerGroup) -> None:
        """Give our group the tags it lacks: one made before the tags, or kept by a Service
        re-created under the same name (a new UID). A transient failure waits for a later pass."""
        missing = {k: v for k, v in self.tags.items() if group.tags.get(k) != v}
        if not missing:
            return
        try:
            await call_adapter(
                functools.partial(
                    self.tools.client.tag_vserver_group, group.id, self.tags, load_balancer_id=self.lb_id
                )
            )
        except SLBError as err:
            # Serving never waits on a tag: an untagged group keeps its backends and is still
            # found by name where the search is narrowed to its load balancer
            # (docs/alibabacloudslb.md, "Tags and the garbage search"). A refusal that is not
            # transient (an account whose API takes no tags on groups) is said once per group.
            if err.transient:
                self.log(logging.INFO, "tagging group %s (%s) deferred: %s", group.name, group.id, err)
            elif group.id not in self.tools.told_tag_refusals:
                self.tools.told_tag_refusals.add(group.id)
                self.log(
                    logging.WARNING,
                    "SLB refused tagging VServer group %s (%s): %s; it keeps serving, and the garbage "
                    "search finds it only where --slb-load-balancer names %s",
                    group.name,
                    group.id,
                    err,
                    self.lb_id,
                )
            return
        self.group = group.model_copy(update={"tags": {**group.tags, **self.tags}})
        self.log(
            logging.INFO,
            "tagged VServer group %s (%s) on %s: %s",
            group.name,
            group.id,
            self.lb_id,
            ", ".join(f"{k}={v}" for k, v in sorted(missing.items())),
        )

    async def _members(self) -> list[BackendServer]:
        await self._read_group()
        if self.group is None:
            return []
        try:
            members = await call_adapter(self.tools.client.describe_vserver_group_backends, self.group.id)
        except SLBNotFound:
            self.group = None
            return []
        # Backends someone else put into our group are theirs: never matched, changed or removed.
        return [m for m in members if config.is_our_member_description(m.description)]

    async def _plan(self) -> None:
        """Expected and current items for every pod that matters, from one read of the group.

        Relevant pods: the selected ones, the ones holding our finalizer, and the ones whose IP
        one of our backends carries. Each appears on both sides under its name, so the diff
        yields only updates and unchanged items for pods; our backends that no pod accounts for
        are current-only orphans, which the diff deletes.
        """
        members = await self._members()
        reader = self.ctx.reader
        pods = reader.list(kube.POD, self.namespace)
        selected = set() if self.deleting else {pod_name(p) for p in reader.pods_selected_by(self.service)}
        by_name = {pod_name(p): p for p in pods}
        relevant = {n for n in selected if n in by_name}
        relevant |= {pod_name(p) for p in pods if config.carries_finalizer(p, self.finalizer, self.guard)}

        pods_by_ip: dict[str, list[KubeObject]] = {}
        for pod in pods:
            ip = config.pod_ip(pod)
            if ip:
                pods_by_ip.setdefault(ip, []).append(pod)
        attached: dict[str, list[BackendServer]] = {}
        orphans: list[BackendServer] = []
        for member in members:
            candidates = pods_by_ip.get(member.server_ip or "", [])
            if not candidates:
                orphans.append(member)
                continue
            owner = pod_name(min(candidates, key=lambda p: _pod_rank(p, selected)))
            relevant.add(owner)
            attached.setdefault(owner, []).append(member)

        gate = lifecycle.readiness_gate(str(self.service["metadata"]["name"]))
        self.health_matters = not self.deleting and any(
            _waits_on(by_name[n], gate) for n in relevant if n in selected
        )
        health = await self._health() if self.health_matters and members else None

        expected: list[Employee] = []
        current: list[Employee] = []
        for name in sorted(relevant):
            pod = by_name[name]
            mine = tuple(attached.get(name, ()))
            self.attached[name] = mine
            held = config.carries_finalizer(pod, self.finalizer, self.guard)
            if not self.deleting:
                expected.append(self._expected_item(pod, name in selected))
            elif not (held or mine):
                continue  # nothing to release and nothing to remove
            base = pod_employee_statuses(pod)
            healthy = _healthy(mine, health)
            base.extra_status = Attached(members=mine, healthy=healthy)
            current.append(ManagedEmployee(id=name, name=name, statuses=base))
            if healthy is False and name in selected and any(m.weight > 0 for m in mine):
                # Its gate waits for a health check no watch event will announce.
                self.ctx.look_again_in(HEALTH_POLL_SECONDS)
        for member in orphans:
            orphan = _orphan_name(member)
            self.attached[orphan] = (member,)
            statuses = PodEmployeeStatuses(
                ip=member.server_ip or "", extra_status=Attached(members=(member,))
            )
            current.append(ManagedEmployee(id=orphan, name=orphan, statuses=statuses))

        # Forget drain clocks of backends that no longer exist.
        known = {m.key for m in members}
        clocks = self._drain_clocks()
        for key in [k for k in clocks if k not in known]:
            del clocks[key]
        self.expected, self.current = expected, current

    def _expected_item(self, pod: KubeObject, selected: bool) -> Employee:
        name = pod_name(pod)
        statuses = pod_employee_statuses(pod)
        desired: Desired
        if not selected or lifecycle.is_deleting(pod):
            desired = Desired(state="gone")
        elif not statuses.lifecycle_ready:
            desired = Desired(state="idle")
        else:
            try:
                desired = Desired(state="on", backend=self.tools.resolver(self.service, pod))
            except Unresolved as why:
                desired = Desired(state="pending", reason=str(why))
        # The frame adds the finalizer to updated/unchanged items whose lifecycle_ready is True
        # and removes it when False: True exactly when the pod has its backend, at its weight.
        statuses.lifecycle_ready = desired.state == "on"
        statuses.extra_status = desired
        return ManagedEmployee(id=name, name=name, statuses=statuses)

    # -- writing ----------------------------------------------------------------------------------------

    async def _converge(self, items: Sequence[Employee], *, leaving: bool) -> Outcome[Employee]:
        """Bring each item's backends to its desired state; (done, not done).

        Adds first, then weight changes, then removals, one client call each (the client cuts
        them into batches of 20). A backend that must go is set to weight 0 first and removed
        on a later pass, once it is seen at weight 0 and its drain time has passed; its item is
        "not done" meanwhile, so the frame keeps the pod's finalizer and looks again.
        """
        client = self.tools.client
        now = self.tools.clock()
        clocks = self._drain_clocks()
        adds: list[tuple[str, BackendServer]] = []
        sets: list[tuple[str, BackendServer]] = []
        removes: list[tuple[str, BackendServer]] = []
        not_done: set[str] = set()
        drained: list[tuple[str, BackendServer]] = []

        def retire(item_id: str, member: BackendServer) -> None:
            if member.weight > 0:
                drained.append((item_id, member))
                sets.append((item_id, member.model_copy(update={"weight": 0})))
                not_done.add(item_id)
                return
            since = clocks.setdefault(member.key, now)
            left = since + self.drain_seconds - now
            if left <= 0:
                removes.append((item_id, member))
            else:
                not_done.add(item_id)
                self.drain_due = left if self.drain_due is None else min(self.drain_due, left)

        for item in items:
            members = self.attached.get(item.id)
            if members is None:
                attached = item.attached if isinstance(item, ManagedEmployee) else None
                members = attached.members if attached is not None else ()
            desired = Desired(state="gone") if leaving else _desired_of(item)
            if desired.state == "pending":
                self.log(
                    logging.INFO, "pod %s is ready but has no backend yet: %s", item.name, desired.reason
                )
                not_done.add(item.id)
            elif desired.state == "on" and desired.backend is not None:
                want = desired.backend
                if not any(m.key == want.key for m in members):
                    adds.append((item.id, want))
                clocks.pop(want.key, None)  # wanted again: no longer leaving
                for member in members:
                    if member.key != want.key:
                        retire(item.id, member)  # a stale backend (e.g. the port changed)
                    elif member.weight != want.weight:
                        sets.append((item.id, want))
            elif desired.state == "idle":
                for member in members:
                    if member.weight > 0:
                        sets.append((item.id, member.model_copy(update={"weight": 0})))
            else:
                for member in members:
                    retire(item.id, member)

        if (adds or sets or removes) and self.group is None:
            # No group (its creation is still pending): nothing can be written yet.
            self.log(logging.INFO, "VServer group %s does not exist yet", self.group_name)
            not_done |= {item_id for item_id, _ in (*adds, *sets, *removes)}
        else:
            group = self.group

            def drains_start(ops: _Ops) -> None:
                # The drain of a backend just set to weight 0 starts now.
                for _, member in drained:
                    clocks[member.key] = now

            def drains_end(ops: _Ops) -> None:
                for _, member in ops:
                    clocks.pop(member.key, None)

            # Each write: its words in the log, its backends, its call, and what it does to
            # the drain clocks once written.
            writes: tuple[tuple[str, _Ops, Callable[..., Any], Callable[[_Ops], None]], ...] = (
                ("add", adds, client.add_backend_servers, lambda ops: None),
                ("set weights of", sets, client.set_backend_weights, drains_start),
                ("remove", removes, client.remove_backend_servers, drains_end),
            )
            for action, ops, call, written in writes:
                if not ops or group is None:
                    continue
                try:
                    await call_adapter(
                        functools.partial(
                            call, group.id, [server for _, server in ops], load_balancer_id=self.lb_id
                        )
                    )
                except SLBError as err:
                    if not err.transient:
                        raise
                    self.log(logging.INFO, "could not %s %d backends yet: %s", action, len(ops), err)
                    not_done |= {item_id for item_id, _ in ops}
                    for item_id, _ in ops:
                        self.ctx.fail_item(item_id, f"{err.action}: {err.message}", err.code)
                    continue
                self.log(
                    logging.INFO,
                    "%s %d backends of %s: %s",
                    action,
                    len(ops),
                    group.id,
                    ", ".join(f"{s.server_ip or s.server_id}:{s.port}@{s.weight}" for _, s in ops[:5])
                    + (" ..." if len(ops) > 5 else ""),
                )
                written(ops)
        raised = {item_id for item_id, server in (*adds, *sets) if server.weight > 0}
        done = [
            _health_pending(item) if self.health_matters and item.id in raised else item
            for item in items
            if item.id not in not_done
        ]
        if self.health_matters and raised - not_done:
            self.ctx.look_again_in(HEALTH_POLL_SECONDS)
        return done, [item for item in items if item.id in not_done]

    async def _health(self) -> dict[tuple[str, int], bool] | None:
        """Per backend (server id, port): whether some listener reports it anything but
        ``abnormal`` (``unavailable`` means no health check, not a failed one); None when the
        read fails, which leaves serving to the weight alone for this pass."""
        try:
            reports = await call_adapter(self.tools.client.describe_health_status, self.lb_id)
        except SLBError as err:
            self.log(logging.INFO, "health of %s not read (%s); judging serving by weight", self.lb_id, err)
            return None
        health: dict[tuple[str, int], bool] = {}
        for report in reports:
            key = (report.server_id, report.port)
            health[key] = health.get(key, False) or report.health_status != "abnormal"
        return health


def _waits_on(pod: KubeObject, gate: str) -> bool:
    """Whether the pod's spec carries the readiness gate ``gate``."""
    gates = (pod.get("spec") or {}).get("readinessGates") or ()
    return any(isinstance(g, dict) and g.get("conditionType") == gate for g in gates)


def _healthy(members: Sequence[BackendServer], health: dict[tuple[str, int], bool] | None) -> bool | None:
    """What SLB's health says of a pod's backends: None when it says nothing of them."""
    if health is None:
        return None
    reported = [health[key] for key in ((m.server_id, m.port) for m in members) if key in health]
    return any(reported) if reported else None


def _health_pending(item: Employee) -> Employee:
    """``item`` as this pass leaves it: its backend is in place, its health not yet known."""
    statuses = item.statuses
    if not isinstance(statuses, PodEmployeeStatuses) or not isinstance(statuses.extra_status, Desired):
        return item
    desired = statuses.extra_status.model_copy(update={"health_pending": True})
    return item.model_copy(update={"statuses": statuses.model_copy(update={"extra_status": desired})})


def _orphan_name(member: BackendServer) -> str:
    # A name no pod can have ('~' is not allowed in pod names) but safe in a URL: the frame looks
    # such a name up (404) when it plans finalizers for the deleted item, and finds nothing.
    parts = (member.server_id, str(member.port), member.server_ip or "")
    return "slb-member~" + "~".join(_ORPHAN_UNSAFE.sub("-", part) for part in parts)


def _pod_rank(pod: KubeObject, selected: set[str]) -> tuple[int, int, float]:
    """Sort key choosing which pod owns an IP that several pods report (lowest first): selected,
    then alive and not finished, then the newest (an IP freed by an old pod is the newer one's)."""
    phase = (pod.get("status") or {}).get("phase")
    created = str(pod["metadata"].get("creationTimestamp") or "")
    try:
        age = -datetime.fromisoformat(created).timestamp()
    except ValueError:
        age = 0.0
    return (
        0 if pod_name(pod) in selected else 1,
        (1 if lifecycle.is_deleting(pod) else 0) + (2 if phase in ("Succeeded", "Failed") else 0),
        age,
    )


def _group_owner(group_name: str) -> str | None:
    """The key of the Service whose group ``group_name`` is, when the name traces back to one."""
    if not group_name.startswith(config.GROUP_NAME_PREFIX):
        return None
    namespace, sep, name = group_name[len(config.GROUP_NAME_PREFIX) :].partition("/")
    if not (sep and namespace and name) or _SHORTENED.search(name):
        # A shortened name ends in "-<10 hex digits>" and reads like the full name of another
        # Service: never claim one that may be shortened.
        return None
    probe: KubeObject = {"metadata": {"namespace": namespace, "name": name}}
    return f"{namespace}/{name}" if config.vserver_group_name(probe) == group_name else None


def _desired_of(item: Employee) -> Desired:
    desired = item.desired if isinstance(item, ManagedEmployee) else None
    return desired if desired is not None else Desired(state="gone")
