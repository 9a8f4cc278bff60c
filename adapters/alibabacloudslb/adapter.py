"""The ``alibabacloudslb`` controller adapter: a Service's pods and an Alibaba Cloud SLB (CLB).

Employer: a Service labelled ``kusionstack.io/control: "true"`` and
``service.k8s.alibaba/loadbalancer-id: <lb id>``. Employees: its pods, with PodOpsLifecycle
followed and lifecycle finalizers recorded on the Service (as the Go adapter does).

Two modes, chosen per Service by the ``resource-consist.kusionstack.io/slb-mode`` annotation:

* ``observe`` (default; the Go adapter's behaviour). Alibaba's cloud controller manager (CCM)
  owns the load balancer; this adapter only reads ``DescribeHealthStatus`` and never calls a
  mutating SLB API. A lifecycle-ready pod should be listed (by pod IP), a pod that is not should
  not; until CCM has caught up, the items are reported "not done" and the Service is looked at
  again after a per-Service backoff (``backoff.RequeueBackoff``), so a pod's lifecycle finalizer
  follows what the load balancer really holds.
* ``manage``. The adapter owns one VServer group, ``resourceconsist/<namespace>/<service>``, and
  keeps its backends (pod IPs on ENIs, or ECIs) equal to the ready pods: adds them (weight from
  an annotation, default 100), sets a leaving pod's weight to 0 first and removes it later (after
  an optional drain), and deletes the group with the Service. It never touches another group, nor
  a backend of its group that it did not write (ours carry the ``resourceconsist/<pod>``
  description).

Each pass keeps what it read in a ``_PassState`` in the frame's per-pass ``ctx.scratch``; drain
clocks live in the per-Service ``ctx.memo``, which the frame drops with the Service. All methods
are coroutines: the blocking SDK runs in worker threads. The per-Service requeue interval comes
through the frame's ``employer_requeue_interval(ctx, employer)``.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, TypeVar

from resourceconsist import handler, kube, lifecycle
from resourceconsist.adapter import (
    CUDResults,
    Employee,
    Employer,
    EventHandler,
    Outcome,
    PodEmployeeStatuses,
    Predicate,
    ReconcileAdapter,
    ReconcileContext,
    pod_employee_statuses,
)
from resourceconsist.cache import CacheReader, WatchEvent
from resourceconsist.cancellation import call_adapter
from resourceconsist.errors import ResourceConsistError
from resourceconsist.kube import KubeObject, Resource, object_key

from . import config
from .backoff import RequeueBackoff
from .config import LOAD_BALANCER_ID_LABEL, Mode, SLBConfigError
from .items import (
    Attached,
    Desired,
    GroupEmployer,
    GroupStatus,
    ManagedEmployee,
    ObservedEmployee,
    Traffic,
)
from .slbclient import BackendKey, BackendServer, SLBClient, SLBError, SLBNotFound, VServerGroup

log = logging.getLogger(__name__)

#: The Go adapter's controller name (Events are reported by it).
CONTROLLER_NAME: Final = "alibaba-cloud-slb-controller"

T = TypeVar("T")
ItemT = TypeVar("ItemT", Employer, Employee)

# The employer whose pass ended last in this task (see the module docstring).


#: Where a pass's state and the drain clocks live in the frame's ``ctx.scratch`` / ``ctx.memo``.
_SCRATCH_KEY: Final = "alibabacloudslb.pass"
_DRAIN_KEY: Final = "alibabacloudslb.drain_since"


class Unresolved(ResourceConsistError):
    """A ready pod for which no backend can be built yet; the message says why."""


#: Builds the backend a ready pod should have in manage mode, from the Service and the pod.
#: Raises ``Unresolved`` while something is missing (the pod waits, without a finalizer) and
#: ``SLBConfigError`` for a bad annotation (a Warning event on the Service).
BackendResolver = Callable[[KubeObject, KubeObject], BackendServer]


def annotated_backend(service: KubeObject, pod: KubeObject) -> BackendServer:
    """The default resolver: pod IP, ``ServerId`` from the pod's server-id annotation.

    SLB wants the ENI id (``eni-...``) or ECI instance id beside the IP. Nothing in the pod
    object carries the ENI id of a shared-ENI terway pod, and this project has no ECS client, so
    it is read from ``resource-consist.kusionstack.io/slb-backend-server-id``; pass another
    resolver (e.g. one asking ECS ``DescribeNetworkInterfaces`` by IP) to ``SLBAdapter``.
    """
    name = str(pod["metadata"]["name"])
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


@dataclass
class _PassState:
    """What one reconcile pass of one Service has learnt so far."""

    ctx: ReconcileContext
    service: KubeObject
    namespace: str
    deleting: bool
    finalizer: str
    guard: str
    error: SLBConfigError | None = None
    mode: Mode | None = None
    lb_id: str = ""
    group_name: str = ""
    drain_seconds: float = 0.0
    group: VServerGroup | None = None
    group_read: bool = False
    expected: list[Employee] | None = None
    current: list[Employee] | None = None
    attached: dict[str, tuple[BackendServer, ...]] = field(default_factory=dict)
    #: Seconds until the earliest drain ends, when a backend waits for one.
    drain_due: float | None = None

    def checked(self) -> _PassState:
        if self.error is not None:
            raise self.error
        return self


def _name(obj: KubeObject) -> str:
    return str(obj["metadata"]["name"])


_ORPHAN_UNSAFE = re.compile(r"[^A-Za-z0-9.-]")


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
        0 if _name(pod) in selected else 1,
        (1 if lifecycle.is_deleting(pod) else 0) + (2 if phase in ("Succeeded", "Failed") else 0),
        age,
    )


class SLBAdapter(ReconcileAdapter):
    """The ``alibabacloudslb`` adapter (Go: ``SlbControllerAdapter``), observe and manage modes."""

    def __init__(
        self,
        client: SLBClient,
        *,
        name: str = CONTROLLER_NAME,
        resolver: BackendResolver = annotated_backend,
        backoff: RequeueBackoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.name = name
        self.resolver = resolver
        self.backoff = backoff or RequeueBackoff()
        self._clock = clock
        # Per employer: when each leaving backend of ours was first seen at (or set to) weight 0.

    def __repr__(self) -> str:
        return f"SLBAdapter(name={self.name!r}, client={self.client!r})"

    def get_controller_name(self) -> str:
        return self.name

    # -- watch options: only Services that name a load balancer ---------------------------------

    def new_employer(self) -> Resource:
        return kube.SERVICE

    def new_employee(self) -> Resource:
        return kube.POD

    def employer_predicates(self) -> Predicate:
        return _service_predicate

    def employee_predicates(self) -> Predicate:
        return _any_event

    def employer_event_handler(self) -> EventHandler:
        return _enqueue_self

    def employee_event_handler(self) -> EventHandler:
        return _enqueue_services_of_pod

    # -- lifecycle options (the Go adapter's) ------------------------------------------------------

    def follow_pod_ops_lifecycle(self) -> bool:
        return True

    def need_record_lifecycle_finalizer_condition(self) -> bool:
        return True

    async def get_selected_employee_names(self, ctx: ReconcileContext, employer: KubeObject) -> list[str]:
        """The pods the selector selects; in manage mode also the pods still holding our finalizer.

        The frame (record mode) strips the lifecycle finalizer from recorded pods that are no
        longer selected, at once. In manage mode an unselected pod keeps its backend until it is
        drained and removed, so it must keep the finalizer as long: it stays "selected" while it
        carries it, and the normal item flow releases it after the removal.
        """
        state = self._begin(ctx, employer)
        names = [_name(pod) for pod in ctx.reader.pods_selected_by(employer)]
        if state.mode is Mode.OBSERVE:
            return names
        known = set(names)
        for pod in ctx.reader.list(kube.POD, state.namespace):
            if _name(pod) not in known and config.carries_finalizer(pod, state.finalizer, state.guard):
                names.append(_name(pod))
        return names

    # -- status recording and requeue: the per-Service backoff -------------------------------------

    async def record_statuses(
        self,
        ctx: ReconcileContext,
        employer: KubeObject,
        employer_results: CUDResults[Employer],
        employee_results: CUDResults[Employee],
    ) -> None:
        key = ctx.employer_key
        found = ctx.scratch.get(_SCRATCH_KEY)
        state = found if isinstance(found, _PassState) else None
        waiting = [
            *_fingerprints("employer", employer_results),
            *_fingerprints("employee", employee_results),
        ]
        interval = self.backoff.observe(key, waiting, due_in=state.drain_due if state else None)
        if interval is not None:
            log.debug(
                "%s %s: %d items not done yet; next look in %.2fs", self.name, key, len(waiting), interval
            )

    async def record_error_conditions(
        self, ctx: ReconcileContext, employer: KubeObject, err: BaseException
    ) -> None:
        """Nothing to record: the frame has already turned the error into a Warning event."""

    def employer_requeue_interval(self, ctx: ReconcileContext, employer: KubeObject) -> float:
        return self.backoff.interval(ctx.employer_key)

    # -- employer: manage mode's VServer group -----------------------------------------------------

    async def get_expected_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        state = self._begin(ctx, employer).checked()
        if state.mode is not Mode.MANAGE or state.deleting:
            return []
        return [GroupEmployer(id=state.group_name, statuses=GroupStatus(load_balancer_id=state.lb_id))]

    async def get_current_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        state = self._begin(ctx, employer).checked()
        if state.mode is not Mode.MANAGE:
            return []  # observe mode: CCM owns everything on the load balancer
        await self._read_group(state)
        if state.group is None:
            return []
        return [
            GroupEmployer(
                id=state.group_name,
                statuses=GroupStatus(load_balancer_id=state.lb_id, vserver_group_id=state.group.id),
            )
        ]

    async def create_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employer]
    ) -> Outcome[Employer]:
        state = self._begin(ctx, employer).checked()
        done: list[Employer] = []
        for item in to_create:
            if state.mode is not Mode.MANAGE or item.id != state.group_name:
                raise SLBConfigError(
                    f"refusing to create VServer group {item.id!r}: not this Service's group"
                )
            try:
                group_id = await call_adapter(self.client.create_vserver_group, state.lb_id, item.id)
            except SLBError as err:
                if not err.transient:
                    raise
                log.info("%s %s: creating VServer group deferred: %s", self.name, ctx.employer_key, err)
                return done, [i for i in to_create if i not in done]
            state.group = VServerGroup(id=group_id, name=item.id, load_balancer_id=state.lb_id)
            log.info(
                "%s %s: created VServer group %s (%s) on %s",
                self.name,
                ctx.employer_key,
                item.id,
                group_id,
                state.lb_id,
            )
            done.append(item)
        return done, []

    async def update_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employer]
    ) -> Outcome[Employer]:
        # A group is its name on its load balancer; nothing else about it is ours to change.
        return to_update, []

    async def delete_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employer]
    ) -> Outcome[Employer]:
        state = self._begin(ctx, employer).checked()
        done: list[Employer] = []
        for item in to_delete:
            status = item.statuses
            if (
                not isinstance(status, GroupStatus)
                or item.id != state.group_name
                or not status.vserver_group_id
            ):
                raise SLBConfigError(
                    f"refusing to delete VServer group {item.id!r}: not this Service's group"
                )
            try:
                await call_adapter(
                    functools.partial(
                        self.client.delete_vserver_group,
                        status.vserver_group_id,
                        load_balancer_id=status.load_balancer_id,
                    )
                )
            except SLBNotFound:
                pass  # already gone
            except SLBError as err:
                if not err.transient:
                    raise
                log.info("%s %s: deleting VServer group deferred: %s", self.name, ctx.employer_key, err)
                return done, [i for i in to_delete if i not in done]
            log.info(
                "%s %s: deleted VServer group %s (%s)",
                self.name,
                ctx.employer_key,
                item.id,
                status.vserver_group_id,
            )
            state.group = None
            done.append(item)
        return done, []

    # -- employees ------------------------------------------------------------------------------------

    async def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        state = self._begin(ctx, employer).checked()
        if state.mode is Mode.MANAGE:
            await self._plan_managed(state)
            return list(state.expected or [])
        if state.deleting:
            return []
        expected: list[Employee] = []
        for pod in ctx.reader.pods_selected_by(employer):
            statuses = pod_employee_statuses(pod)
            statuses.extra_status = Traffic(traffic_on=statuses.lifecycle_ready)
            expected.append(ObservedEmployee(id=_name(pod), name=_name(pod), statuses=statuses))
        return expected

    async def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        state = self._begin(ctx, employer).checked()
        if state.mode is Mode.MANAGE:
            if state.current is None:
                await self._plan_managed(state)
            return list(state.current or [])
        # Pods still holding our guard or finalizer matter whether selected or not: each is
        # released once the load balancer no longer lists its IP (a deleting Service selects none).
        holding = {
            _name(pod): pod
            for finalizer in (state.finalizer, state.guard)
            for pod in ctx.reader.pods_with_finalizer(state.namespace, finalizer)
        }
        selected = [] if state.deleting else ctx.reader.pods_selected_by(employer)
        pods = [
            *selected,
            *(pod for name, pod in sorted(holding.items()) if name not in {_name(p) for p in selected}),
        ]
        # No pod, no question to ask the load balancer.
        listed = await self._listed_ips(state) if pods else set()
        current: list[Employee] = []
        for pod in pods:
            statuses = pod_employee_statuses(pod)
            statuses.extra_status = Traffic(traffic_on=bool(statuses.ip) and statuses.ip in listed)
            current.append(ObservedEmployee(id=_name(pod), name=_name(pod), statuses=statuses))
        return current

    async def create_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]
    ) -> Outcome[Employee]:
        state = self._begin(ctx, employer).checked()
        if state.mode is Mode.MANAGE:
            return await self._converge(state, to_create, leaving=False)
        return self._wait_for_ccm(state, "create", to_create)

    async def update_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employee]
    ) -> Outcome[Employee]:
        state = self._begin(ctx, employer).checked()
        if state.mode is Mode.MANAGE:
            return await self._converge(state, to_update, leaving=False)
        return self._wait_for_ccm(state, "update", to_update)

    async def delete_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employee]
    ) -> Outcome[Employee]:
        state = self._begin(ctx, employer).checked()
        if state.mode is Mode.MANAGE:
            return await self._converge(state, to_delete, leaving=True)
        # Deleting Service, observe mode: a pod is released once CCM no longer lists its IP.
        off: list[Employee] = [
            item for item in to_delete if isinstance(item, ObservedEmployee) and not item.traffic_on
        ]
        return off, [item for item in to_delete if item not in off]

    # -- pass state --------------------------------------------------------------------------------------

    def _begin(self, ctx: ReconcileContext, employer: KubeObject) -> _PassState:
        key = ctx.employer_key
        found = ctx.scratch.get(_SCRATCH_KEY)
        if isinstance(found, _PassState):
            return found
        meta = employer["metadata"]
        state = _PassState(
            ctx=ctx,
            service=employer,
            namespace=str(meta.get("namespace") or ""),
            deleting=lifecycle.is_deleting(employer),
            finalizer=lifecycle.lifecycle_finalizer(str(meta["name"])),
            guard=lifecycle.guard_finalizer(str(meta["name"])),
        )
        try:
            state.mode = config.mode_of(employer)
            state.lb_id = config.load_balancer_id(employer)
            if not state.lb_id and not state.deleting:
                raise SLBConfigError(
                    f"Service {key} has no {LOAD_BALANCER_ID_LABEL} label naming its load balancer"
                )
            if state.mode is Mode.MANAGE:
                state.group_name = config.vserver_group_name(employer)
                state.drain_seconds = config.drain_seconds(employer)
        except SLBConfigError as err:
            # Reported by the first method that needs the settings (a Warning event); the
            # selected names are still served, conservatively, as for manage mode.
            state.error = err
        ctx.scratch[_SCRATCH_KEY] = state
        return state

    @staticmethod
    def _drain_clocks(ctx: ReconcileContext) -> dict[BackendKey, float]:
        """When each of the Service's backends was set to weight 0 (kept across passes)."""
        clocks: dict[BackendKey, float] = ctx.memo.setdefault(_DRAIN_KEY, {})
        return clocks

    # -- observe mode ------------------------------------------------------------------------------------

    async def _listed_ips(self, state: _PassState) -> set[str]:
        if not state.lb_id:
            log.warning(
                "%s %s: deleting Service without %s: treating its pods as out of the load balancer",
                self.name,
                state.ctx.employer_key,
                LOAD_BALANCER_ID_LABEL,
            )
            return set()
        try:
            health = await call_adapter(self.client.describe_health_status, state.lb_id)
        except SLBNotFound:
            if state.deleting:
                return set()  # the load balancer itself is gone: nothing routes to the pods
            raise
        # Any listed backend counts, whatever its health: an "abnormal" one may turn "normal"
        # again while the pod still runs, so only absence means the pod is out of rotation.
        return {ip for backend in health for ip in (backend.server_ip, backend.eni_host) if ip}

    def _wait_for_ccm(self, state: _PassState, what: str, items: list[Employee]) -> Outcome[Employee]:
        if items:
            log.debug(
                "%s %s: waiting for CCM to %s %d backends: %s",
                self.name,
                state.ctx.employer_key,
                what,
                len(items),
                ", ".join(item.id for item in items[:10]),
            )
        return [], list(items)

    # -- manage mode: reading and planning ----------------------------------------------------------------

    async def _read_group(self, state: _PassState) -> None:
        if state.group_read:
            return
        state.group_read = True
        if not state.lb_id:
            log.warning(
                "%s %s: deleting Service without %s: its VServer group %s, if any, is left in place",
                self.name,
                state.ctx.employer_key,
                LOAD_BALANCER_ID_LABEL,
                state.group_name,
            )
            return
        try:
            groups = await call_adapter(self.client.describe_vserver_groups, state.lb_id)
        except SLBNotFound:
            if state.deleting:
                return
            raise
        ours = sorted((g for g in groups if g.name == state.group_name), key=lambda g: g.id)
        if len(ours) > 1:
            log.warning(
                "%s %s: %d VServer groups named %s on %s (%s); using %s and leaving the others",
                self.name,
                state.ctx.employer_key,
                len(ours),
                state.group_name,
                state.lb_id,
                ", ".join(g.id for g in ours),
                ours[0].id,
            )
        state.group = ours[0] if ours else None

    async def _members(self, state: _PassState) -> list[BackendServer]:
        await self._read_group(state)
        if state.group is None:
            return []
        try:
            members = await call_adapter(self.client.describe_vserver_group_backends, state.group.id)
        except SLBNotFound:
            state.group = None
            return []
        # Backends someone else put into our group are theirs: never matched, changed or removed.
        return [m for m in members if config.is_our_member_description(m.description)]

    async def _plan_managed(self, state: _PassState) -> None:
        """Expected and current items for every pod that matters, from one read of the group.

        Relevant pods: the selected ones, the ones holding our finalizer, and the ones whose IP
        one of our backends carries. Each appears on both sides under its name, so the diff
        yields only updates and unchanged items for pods; our backends that no pod accounts for
        are current-only orphans, which the diff deletes.
        """
        members = await self._members(state)
        reader = state.ctx.reader
        service = state.service
        pods = reader.list(kube.POD, state.namespace)
        selected = set() if state.deleting else {_name(p) for p in reader.pods_selected_by(service)}
        by_name = {_name(p): p for p in pods}
        relevant = {n for n in selected if n in by_name}
        relevant |= {_name(p) for p in pods if config.carries_finalizer(p, state.finalizer, state.guard)}

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
            owner = _name(min(candidates, key=lambda p: _pod_rank(p, selected)))
            relevant.add(owner)
            attached.setdefault(owner, []).append(member)

        expected: list[Employee] = []
        current: list[Employee] = []
        for name in sorted(relevant):
            pod = by_name[name]
            mine = tuple(attached.get(name, ()))
            state.attached[name] = mine
            held = config.carries_finalizer(pod, state.finalizer, state.guard)
            if not state.deleting:
                expected.append(self._expected_item(state, pod, name in selected))
            elif not (held or mine):
                continue  # nothing to release and nothing to remove
            base = pod_employee_statuses(pod)
            base.extra_status = Attached(members=mine)
            current.append(ManagedEmployee(id=name, name=name, statuses=base))
        for member in orphans:
            orphan = _orphan_name(member)
            state.attached[orphan] = (member,)
            statuses = PodEmployeeStatuses(
                ip=member.server_ip or "", extra_status=Attached(members=(member,))
            )
            current.append(ManagedEmployee(id=orphan, name=orphan, statuses=statuses))

        # Forget drain clocks of backends that no longer exist.
        known = {m.key for m in members}
        clocks = self._drain_clocks(state.ctx)
        for key in [k for k in clocks if k not in known]:
            del clocks[key]
        state.expected, state.current = expected, current

    def _expected_item(self, state: _PassState, pod: KubeObject, selected: bool) -> Employee:
        name = _name(pod)
        statuses = pod_employee_statuses(pod)
        desired: Desired
        if not selected or lifecycle.is_deleting(pod):
            desired = Desired(state="gone")
        elif not statuses.lifecycle_ready:
            desired = Desired(state="idle")
        else:
            try:
                desired = Desired(state="on", backend=self.resolver(state.service, pod))
            except Unresolved as why:
                desired = Desired(state="pending", reason=str(why))
        # The frame adds the finalizer to updated/unchanged items whose lifecycle_ready is True
        # and removes it when False: True exactly when the pod has its backend, at its weight.
        statuses.lifecycle_ready = desired.state == "on"
        statuses.extra_status = desired
        return ManagedEmployee(id=name, name=name, statuses=statuses)

    # -- manage mode: writing -------------------------------------------------------------------------------

    async def _converge(
        self, state: _PassState, items: Sequence[Employee], *, leaving: bool
    ) -> Outcome[Employee]:
        """Bring each item's backends to its desired state; (done, not done).

        Adds first, then weight changes, then removals, one client call each (the client cuts
        them into batches of 20). A backend that must go is set to weight 0 first and removed
        on a later pass, once it is seen at weight 0 and its drain time has passed; its item is
        "not done" meanwhile, so the frame keeps the pod's finalizer and looks again.
        """
        key = state.ctx.employer_key
        now = self._clock()
        clocks = self._drain_clocks(state.ctx)
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
            left = since + state.drain_seconds - now
            if left <= 0:
                removes.append((item_id, member))
            else:
                not_done.add(item_id)
                state.drain_due = left if state.drain_due is None else min(state.drain_due, left)

        for item in items:
            members = state.attached.get(item.id)
            if members is None:
                attached = item.attached if isinstance(item, ManagedEmployee) else None
                members = attached.members if attached is not None else ()
            desired = Desired(state="gone") if leaving else _desired_of(item)
            if desired.state == "pending":
                log.info(
                    "%s %s: pod %s is ready but has no backend yet: %s",
                    self.name,
                    key,
                    item.name,
                    desired.reason,
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

        if (adds or sets or removes) and state.group is None:
            # No group (its creation is still pending): nothing can be written yet.
            log.info("%s %s: VServer group %s does not exist yet", self.name, key, state.group_name)
            not_done |= {item_id for item_id, _ in (*adds, *sets, *removes)}
        else:
            group = state.group
            for action, ops, call in (
                ("add", adds, self.client.add_backend_servers),
                ("set weights of", sets, self.client.set_backend_weights),
                ("remove", removes, self.client.remove_backend_servers),
            ):
                if not ops or group is None:
                    continue
                try:
                    await call_adapter(
                        functools.partial(
                            call, group.id, [server for _, server in ops], load_balancer_id=state.lb_id
                        )
                    )
                except SLBError as err:
                    if not err.transient:
                        raise
                    log.info("%s %s: could not %s %d backends yet: %s", self.name, key, action, len(ops), err)
                    not_done |= {item_id for item_id, _ in ops}
                    continue
                log.info(
                    "%s %s: %s %d backends of %s: %s",
                    self.name,
                    key,
                    action,
                    len(ops),
                    group.id,
                    ", ".join(f"{s.server_ip or s.server_id}:{s.port}@{s.weight}" for _, s in ops[:5])
                    + (" ..." if len(ops) > 5 else ""),
                )
                if action == "set weights of":
                    # The drain of a backend just set to weight 0 starts now.
                    for _, member in drained:
                        clocks[member.key] = now
                elif action == "remove":
                    for _, member in ops:
                        clocks.pop(member.key, None)
        done = [item for item in items if item.id not in not_done]
        return done, [item for item in items if item.id in not_done]


def _desired_of(item: Employee) -> Desired:
    desired = item.desired if isinstance(item, ManagedEmployee) else None
    return desired if desired is not None else Desired(state="gone")


def _fingerprints(kind: str, results: CUDResults[ItemT]) -> list[str]:
    failed: Iterable[Employer | Employee] = [
        *results.fail_created,
        *results.fail_updated,
        *results.fail_deleted,
    ]
    return [f"{kind}|{item.id}|{item.statuses!r}" for item in failed]


# -- watch handlers and predicates --------------------------------------------------------------------


def _service_predicate(event: WatchEvent) -> bool:
    """Controlled Services naming a load balancer; an update that drops either label still
    passes once (the old object qualified), so the Service gets a last look."""
    if event.type == "MODIFIED":
        return config.is_slb_service(event.obj) or config.is_slb_service(event.old)
    return config.is_slb_service(event.obj)


def _any_event(event: WatchEvent) -> bool:
    return True


def _enqueue_self(event: WatchEvent, reader: CacheReader) -> list[str]:
    return [object_key(event.obj)]


def _enqueue_services_of_pod(event: WatchEvent, reader: CacheReader) -> list[str]:
    """SLB Services selecting the pod before or after the change, and those whose guard or
    lifecycle finalizer the pod still holds (an unselected pod that manage mode is still draining)."""
    return handler.services_of_pod(event, reader, config.is_slb_service)
