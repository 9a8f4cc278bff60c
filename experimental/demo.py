"""The experimental ``demo`` adapter and its in-memory fake provider (not for production).

It mirrors the Go original's demo: each controlled Service gets a VIP on the provider
(``demo-remote-VIP``, QPS 100) and each selected pod a real server with traffic on and weight
100 while the pod is lifecycle-ready, off and 0 otherwise (a pod carrying the frame's readiness
gate is lifecycle-ready once its containers are, so it gets traffic before it can be Ready;
docs/zero-downtime.md). A deleting pod's real server is removed at once (the drain). The
provider keeps state like a real one, with an optional latency of its calls, records every
mutating call, and can be told to fail calls or to report failure for a call it carried out, so
tests and people can watch the frame converge through faults.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from resourceconsist.adapter import (
    CUDResults,
    Employee,
    Employer,
    Outcome,
    OwnedItem,
    PodEmployeeStatuses,
    ProviderBackend,
    ProviderView,
    ReconcileAdapter,
    ReconcileContext,
    pod_employee_statuses,
)
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.rules.labels import map_selects

DEMO_VIP = "demo-remote-VIP"
DEMO_QPS = 100
#: Annotation where the demo records the last error (erased after a clean reconcile).
DEMO_CONDITION_ANNOTATION = "resource-consist.kusionstack.io/demo-condition"


class ProviderError(RuntimeError):
    """The fake provider refused (or pretended to refuse) a call."""


class VipStatus(BaseModel):
    vip: str
    qps: int


class TrafficStatus(BaseModel):
    """A real server's traffic switch and weight. Frozen: the adapter shares one instance per
    value among its items (``traffic``): two items a pod at 10k pods, and a model each costs
    about 480 bytes (docs/benchmarks.md, "Memory")."""

    model_config = ConfigDict(frozen=True)

    traffic_on: bool
    traffic_weight: int


@functools.lru_cache(maxsize=256)
def traffic(on: bool, weight: int) -> TrafficStatus:
    """The one ``TrafficStatus`` of these values."""
    return TrafficStatus(traffic_on=on, traffic_weight=weight)


@dataclass
class RealServer:
    ip: str
    traffic_on: bool
    weight: int


@dataclass
class _Fault:
    remaining: int
    carried_out: bool
    message: str


MUTATING_ACTIONS = ("create_vip", "update_vip", "delete_vip", "create_rs", "update_rs", "delete_rs")


@dataclass
class FakeProvider:
    """An in-memory load-balancer provider: a VIP per employer, real servers per employer."""

    vips: dict[str, VipStatus] = field(default_factory=dict)
    real_servers: dict[str, dict[str, RealServer]] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    #: Seconds a real-server call (create, update, delete) takes before its change is in
    #: effect and the call returns, as a real load balancer takes seconds (2-10 s are
    #: reported for SLB). Until then the provider routes as before the call.
    latency: float = 0.0
    _faults: dict[str, _Fault] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    # -- control, for tests and people ---------------------------------------------------------

    def fail_next(self, action: str, times: int = 1, message: str = "injected failure") -> None:
        """The next ``times`` calls of ``action`` fail without doing anything."""
        self._set_fault(action, _Fault(times, False, message))

    def report_failure_after_doing(
        self, action: str, times: int = 1, message: str = "timeout, state unknown"
    ) -> None:
        """The next ``times`` calls of ``action`` do their work, then report failure."""
        self._set_fault(action, _Fault(times, True, message))

    def clear_faults(self) -> None:
        """Forget every pending injected fault."""
        with self._lock:
            self._faults.clear()

    def _set_fault(self, action: str, fault: _Fault) -> None:
        if action not in MUTATING_ACTIONS and action not in ("query_vip", "query_rs", "list_employers"):
            raise ValueError(f"unknown provider action {action!r}")
        with self._lock:
            self._faults[action] = fault

    def set_qps(self, employer: str, qps: int) -> None:
        """Drift: change a VIP's QPS behind the controller's back."""
        with self._lock:
            self.vips[employer] = VipStatus(vip=self.vips[employer].vip, qps=qps)

    def drop_real_server(self, employer: str, pod: str) -> None:
        """Drift: remove a real server behind the controller's back."""
        with self._lock:
            self.real_servers.get(employer, {}).pop(pod, None)

    def employers(self) -> list[str]:
        """The employer keys the provider holds a VIP or real servers for (its "list" API)."""
        fault = self._call("list_employers")
        with self._lock:
            found = sorted(set(self.vips) | set(self.real_servers))
        self._after("list_employers", fault)
        return found

    def mutating_calls(self) -> int:
        with self._lock:
            return sum(self.calls[a] for a in MUTATING_ACTIONS)

    def snapshot(self) -> dict[str, dict[str, RealServer]]:
        with self._lock:
            return {k: dict(v) for k, v in self.real_servers.items()}

    def serving(self, employer: str) -> set[str]:
        """The pods the employer's VIP sends traffic to now (traffic on, weight above 0)."""
        with self._lock:
            servers = self.real_servers.get(employer, {})
            return {pod for pod, rs in servers.items() if rs.traffic_on and rs.weight > 0}

    def _take_effect(self) -> None:
        # Outside the lock: queries answer with the state before the call meanwhile.
        if self.latency > 0:
            time.sleep(self.latency)

    # -- the provider's API ----------------------------------------------------------------------

    def _call(self, action: str) -> _Fault | None:
        """Count the call; raise now for a plain fault, return a fault to raise after the work."""
        with self._lock:
            self.calls[action] += 1
            fault = self._faults.get(action)
            if fault is None:
                return None
            fault.remaining -= 1
            if fault.remaining <= 0:
                del self._faults[action]
        if not fault.carried_out:
            raise ProviderError(f"{action}: {fault.message}")
        return fault

    @staticmethod
    def _after(action: str, fault: _Fault | None) -> None:
        if fault is not None:
            raise ProviderError(f"{action}: {fault.message}")

    def query_vip(self, employer: str) -> VipStatus | None:
        fault = self._call("query_vip")
        with self._lock:
            found = self.vips.get(employer)
        self._after("query_vip", fault)
        return found

    def put_vip(self, action: str, employer: str, status: VipStatus) -> None:
        fault = self._call(action)
        with self._lock:
            if action == "create_vip" and employer in self.vips:
                raise ProviderError(f"create_vip: VIP of {employer} already exists")
            self.vips[employer] = status
        self._after(action, fault)

    def delete_vip(self, employer: str) -> None:
        fault = self._call("delete_vip")
        with self._lock:
            self.vips.pop(employer, None)
        self._after("delete_vip", fault)

    def query_rs(self, employer: str) -> dict[str, RealServer]:
        fault = self._call("query_rs")
        with self._lock:
            found = dict(self.real_servers.get(employer, {}))
        self._after("query_rs", fault)
        return found

    def put_rs(self, action: str, employer: str, servers: dict[str, RealServer]) -> None:
        fault = self._call(action)
        self._take_effect()
        with self._lock:
            group = self.real_servers.setdefault(employer, {})
            if action == "create_rs":
                duplicates = sorted(set(servers) & set(group))
                if duplicates:
                    raise ProviderError(f"create_rs: real servers already exist: {', '.join(duplicates)}")
            group.update(servers)
        self._after(action, fault)

    def delete_rs(self, employer: str, pods: list[str]) -> None:
        fault = self._call("delete_rs")
        self._take_effect()
        with self._lock:
            group = self.real_servers.get(employer, {})
            for pod in pods:
                group.pop(pod, None)
            if not group:
                self.real_servers.pop(employer, None)
        self._after("delete_rs", fault)


class DemoEmployee(Employee):
    """A real server; equal when IP and traffic match (readiness itself is not stored remotely)."""

    def equal(self, other: Employee) -> bool:
        mine, theirs = self.statuses, other.statuses
        if not isinstance(mine, PodEmployeeStatuses) or not isinstance(theirs, PodEmployeeStatuses):
            return super().equal(other)
        # The adapter shares one TrafficStatus per value (``traffic``): the same object is equal
        # without pydantic's field-by-field comparison, which every pass made for every pod.
        extra, their_extra = mine.extra_status, theirs.extra_status
        return self.id == other.id and mine.ip == theirs.ip and (extra is their_extra or extra == their_extra)

    def serves(self) -> bool:
        """Registered with traffic on and a weight above 0 (a real server at weight 0 is held,
        not served)."""
        statuses = self.statuses
        if isinstance(statuses, PodEmployeeStatuses) and isinstance(statuses.extra_status, TrafficStatus):
            return statuses.extra_status.traffic_on and statuses.extra_status.traffic_weight > 0
        return super().serves()


#: ``ReconcileContext.memo`` keys: the expected items by pod, and the current items built last pass.
_EXPECTED = "demo-expected"
_CURRENT = "demo-current"


def _key(employer: KubeObject) -> str:
    return kube.object_key(employer)


class DemoAdapter(ReconcileAdapter):
    """The demo adapter: Service employer, pod employees, PodOpsLifecycle followed."""

    def __init__(
        self,
        provider: FakeProvider | None = None,
        *,
        name: str = "demo-controller",
        record_lifecycle_finalizers: bool = False,
        record_expected_finalizers: bool = True,
    ) -> None:
        self.provider = provider or FakeProvider()
        self.name = name
        self.record_lifecycle_finalizers = record_lifecycle_finalizers
        self.record_expected_finalizers = record_expected_finalizers

    def get_controller_name(self) -> str:
        return self.name

    # -- capabilities --------------------------------------------------------------------------

    def follow_pod_ops_lifecycle(self) -> bool:
        return True

    def need_record_lifecycle_finalizer_condition(self) -> bool:
        return self.record_lifecycle_finalizers

    def need_record_expected_finalizer_condition(self) -> bool:
        return self.record_expected_finalizers

    async def get_selected_employee_names(self, ctx: ReconcileContext, employer: KubeObject) -> list[str]:
        # A read of the frame's cache never blocks: a coroutine, run on the loop with no hand-off
        # to a worker thread (docs/concepts.md, "The runtime").
        return [pod["metadata"]["name"] for pod in ctx.reader.pods_selected_by(employer)]

    async def record_statuses(
        self,
        ctx: ReconcileContext,
        employer: KubeObject,
        employer_results: CUDResults[Employer],
        employee_results: CUDResults[Employee],
    ) -> None:
        # Erase the error condition once a reconcile succeeds; write nothing when there is none.
        # A coroutine: most passes have nothing to erase, and only the write, which blocks, is
        # handed to a worker thread (docs/concepts.md, "The runtime").
        if (employer["metadata"].get("annotations") or {}).get(DEMO_CONDITION_ANNOTATION):
            await call_adapter(self._set_condition, ctx, employer, None)

    def record_error_conditions(
        self, ctx: ReconcileContext, employer: KubeObject, err: BaseException
    ) -> None:
        message = str(err)
        if (employer["metadata"].get("annotations") or {}).get(DEMO_CONDITION_ANNOTATION) != message:
            self._set_condition(ctx, employer, message)

    @staticmethod
    def _set_condition(ctx: ReconcileContext, employer: KubeObject, message: str | None) -> None:
        meta = employer["metadata"]
        body = {"metadata": {"annotations": {DEMO_CONDITION_ANNOTATION: message}}}
        assert ctx.writer is not None, "the frame gives every pass a writer"
        with contextlib.suppress(kube.NotFound):  # the Service is gone: nothing to record
            ctx.writer.patch(kube.SERVICE, meta["namespace"], meta["name"], body)

    def list_owned(self, ctx: ReconcileContext) -> list[OwnedItem]:
        """Every VIP and real-server set the provider holds: all of them are this adapter's
        (docs/lifecycle-hooks.md, "Orphans")."""
        return [OwnedItem(owner=key, id=f"vip {key}") for key in self.provider.employers()]

    def lists_everything_owned(self) -> bool:
        """``list_owned`` names every employer the provider holds anything for."""
        return True

    def describe_provider(self, ctx: ReconcileContext, employer: KubeObject) -> ProviderView:
        """What the fake provider holds for the Service, for ``resourceconsist explain``: the VIP
        and each real server, serving when its traffic is on with a weight above 0."""
        key = _key(employer)
        vip = self.provider.vips.get(key)
        servers = self.provider.snapshot().get(key, {})
        served = self.provider.serving(key)
        backends = []
        for pod, rs in sorted(servers.items()):
            serving = pod in served
            state = "serving" if serving else ("traffic off" if not rs.traffic_on else "weight 0")
            details = {"ip": rs.ip, "traffic_on": rs.traffic_on, "weight": rs.weight}
            backends.append(
                ProviderBackend(employee=pod, id=pod, serving=serving, state=state, details=details)
            )
        return ProviderView(employer={"vip": vip.vip, "qps": vip.qps} if vip else {}, backends=backends)

    # -- employer: the VIP ---------------------------------------------------------------------

    def get_expected_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        if employer["metadata"].get("deletionTimestamp"):
            return []
        return [Employer(id=_key(employer), statuses=VipStatus(vip=DEMO_VIP, qps=DEMO_QPS))]

    def get_current_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        found = self.provider.query_vip(_key(employer))
        return [] if found is None else [Employer(id=_key(employer), statuses=found)]

    def create_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employer]
    ) -> Outcome[Employer]:
        for item in to_create:
            self.provider.put_vip("create_vip", item.id, item.statuses)
        return to_create, []

    def update_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employer]
    ) -> Outcome[Employer]:
        for item in to_update:
            self.provider.put_vip("update_vip", item.id, item.statuses)
        return to_update, []

    def delete_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employer]
    ) -> Outcome[Employer]:
        for item in to_delete:
            self.provider.delete_vip(item.id)
        return to_delete, []

    # -- employees: real servers ---------------------------------------------------------------

    def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        """A real server per selected live pod. The items are kept in ``ctx.memo`` and only the
        pods named in ``ctx.changed`` are looked at again (all of them on a full pass;
        docs/concepts.md, "Work proportional to change")."""
        if employer["metadata"].get("deletionTimestamp"):
            ctx.memo.pop(_EXPECTED, None)
            return []
        known: dict[str, Employee] | None = ctx.memo.get(_EXPECTED)
        if ctx.changed is None or known is None:
            known = {}
            for selected in ctx.reader.pods_selected_by(employer):
                self._refresh(known, selected["metadata"]["name"], selected)
        else:
            selector = (employer.get("spec") or {}).get("selector")
            namespace = employer["metadata"].get("namespace")
            for name in ctx.changed:
                pod = ctx.reader.get(kube.POD, namespace, name)
                if pod is not None and not map_selects(selector, pod["metadata"].get("labels")):
                    pod = None
                self._refresh(known, name, pod)
        ctx.memo[_EXPECTED] = known
        return list(known.values())

    @staticmethod
    def _refresh(known: dict[str, Employee], name: str, pod: KubeObject | None) -> None:
        """Bring the expected item of pod ``name`` up to date (None: not a live selected pod)."""
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            known.pop(name, None)
            return
        statuses = pod_employee_statuses(pod)
        ready = statuses.lifecycle_ready
        statuses.extra_status = traffic(ready, 100 if ready else 0)
        known[name] = DemoEmployee(id=name, name=name, statuses=statuses)

    def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        """The provider's real servers, asked every pass; an item is built again only when its
        real server changed since the last pass (pydantic models are not free at 1000 pods)."""
        built: dict[str, tuple[tuple[str, bool, int], Employee]] = ctx.memo.get(_CURRENT, {})
        current: dict[str, tuple[tuple[str, bool, int], Employee]] = {}
        for pod, rs in sorted(self.provider.query_rs(_key(employer)).items()):
            state = (rs.ip, rs.traffic_on, rs.weight)
            known = built.get(pod)
            if known is None or known[0] != state:
                statuses = PodEmployeeStatuses(ip=rs.ip, extra_status=traffic(rs.traffic_on, rs.weight))
                item = DemoEmployee(id=pod, name=pod, statuses=statuses)
                known = (state, item)
            current[pod] = known
        ctx.memo[_CURRENT] = current
        return [item for _, item in current.values()]

    @staticmethod
    def _servers(items: list[Employee]) -> dict[str, RealServer]:
        servers: dict[str, RealServer] = {}
        for item in items:
            statuses: Any = item.statuses
            traffic: TrafficStatus = statuses.extra_status
            servers[item.id] = RealServer(statuses.ip, traffic.traffic_on, traffic.traffic_weight)
        return servers

    def create_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]
    ) -> Outcome[Employee]:
        self.provider.put_rs("create_rs", _key(employer), self._servers(to_create))
        return to_create, []

    def update_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employee]
    ) -> Outcome[Employee]:
        self.provider.put_rs("update_rs", _key(employer), self._servers(to_update))
        return to_update, []

    def delete_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employee]
    ) -> Outcome[Employee]:
        self.provider.delete_rs(_key(employer), [item.id for item in to_delete])
        return to_delete, []
