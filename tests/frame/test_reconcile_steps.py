"""Unit tests of the reconcile steps' logic against in-memory fakes of the frame's small I/O
protocols (resourceconsist.cluster.interfaces): fast, and exact about the order of writes and calls.

The fakes stand in for the API server only as far as the steps use it (merge patches of
metadata with a resourceVersion precondition, deletion held by finalizers); what the frame
does against the real kube-apiserver is claimed by tests/frame/test_guard.py and
tests/frame/test_go_scenarios.py, which stay the authority.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.adapter import CUDResults, Employee, Employer, PodEmployeeStatuses, ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject, Resource
from resourceconsist.errors import PermanentError, steering
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider, RealServer
from resourceconsist.reconcile import (
    ReconcileError,
    Reconciler,
    Result,
    SyncFailedExist,
    failures,
    guard,
    sync,
)
from resourceconsist.reconcile.memory import Memories
from resourceconsist.reconcile.podwriter import EmployerEntry, PodLocation, PodWriter
from resourceconsist.reconcile.profile import AdapterProfile
from resourceconsist.rules import lifecycle
from resourceconsist.rules.diff import diff
from resourceconsist.rules.labels import map_selects

NS = "ns"
G, L = lifecycle.guard_finalizer("svc"), lifecycle.lifecycle_finalizer("svc")
ENTRY = lifecycle.expected_finalizer_key("Service", NS, "svc")


class FakeApi:
    """In-memory objects behind ObjectReader and ObjectWriter; records every write."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], KubeObject] = {}
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.rv = 0
        self.refuse: set[str] = set()  # names whose writes always conflict
        self.status_writes: list[tuple[str, Any]] = []

    def put(self, res: Resource, obj: KubeObject) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        obj["metadata"].setdefault("namespace", NS)
        self.objects[(res.plural, NS, obj["metadata"]["name"])] = obj

    # -- ObjectReader ----------------------------------------------------------------------------

    def get(self, resource: Resource, namespace: str | None, name: str) -> KubeObject | None:
        found = self.objects.get((resource.plural, namespace or NS, name))
        return copy.deepcopy(found) if found is not None else None

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        label_selector: Mapping[str, Any] | None = None,
    ) -> list[KubeObject]:
        return [
            copy.deepcopy(o)
            for (plural, _, _), o in sorted(self.objects.items())
            if plural == resource.plural
        ]

    def pods_selected_by(self, service: KubeObject) -> list[KubeObject]:
        selector = service.get("spec", {}).get("selector")
        return [p for p in self.list(kube.POD) if map_selects(selector, p["metadata"].get("labels") or {})]

    def pods_with_finalizer(self, namespace: str, finalizer: str) -> list[KubeObject]:
        return [p for p in self.list(kube.POD) if finalizer in (p["metadata"].get("finalizers") or [])]

    def pods_with_readiness_gate(self, namespace: str, condition_type: str) -> list[KubeObject]:
        return [p for p in self.list(kube.POD) if condition_type in lifecycle.readiness_gates(p)]

    # -- ObjectWriter ----------------------------------------------------------------------------

    def get_or_none(self, res: Resource, namespace: str | None, name: str) -> KubeObject | None:
        return self.get(res, namespace, name)

    def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        **_: Any,
    ) -> KubeObject:
        key = (res.plural, namespace or NS, name)
        obj = self.objects.get(key)
        if obj is None:
            raise kube.ApiError.of(404, "NotFound", name)
        if subresource == "status":
            self.status_writes.append((name, copy.deepcopy(body)))
            return copy.deepcopy(obj)
        meta = body.get("metadata", {})
        if (
            name in self.refuse
            or meta.get("resourceVersion", obj["metadata"]["resourceVersion"])
            != (obj["metadata"]["resourceVersion"])
        ):
            raise kube.ApiError.of(409, "Conflict", name)
        obj = copy.deepcopy(obj)
        for field, value in meta.items():
            if field == "annotations":
                obj["metadata"].setdefault("annotations", {}).update(value)
            elif field != "resourceVersion":
                obj["metadata"][field] = value
        self.writes.append((name, copy.deepcopy(meta)))
        if obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
            del self.objects[key]  # the API server lets a released deleting object go
            return obj
        self.put(res, obj)
        return copy.deepcopy(obj)

    def patch_optimistic(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        change: Callable[[KubeObject], dict[str, Any] | None],
        *,
        current: KubeObject | None = None,
        attempts: int = 8,
    ) -> tuple[KubeObject | None, bool]:
        return kube.patch_with_precondition(
            self.get, self.patch, res, namespace, name, change, current, attempts
        )


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    async def event(
        self, obj: KubeObject, type_: Any, reason: str, message: str, annotations: Any = None
    ) -> None:
        self.recorded.append((type_, reason, message))


class Watching(DemoAdapter):
    """Demo adapter that notes each pod's finalizers (from the fake API) at each mutating call."""

    def __init__(self, api: FakeApi, provider: FakeProvider) -> None:
        super().__init__(provider, record_expected_finalizers=False)
        self.api = api
        self.seen: list[tuple[str, str, list[str]]] = []

    def _note(self, call: str, items: list[Employee]) -> None:
        for item in items:
            pod = self.api.get(kube.POD, NS, item.name) or {"metadata": {}}
            self.seen.append((call, item.name, list(pod["metadata"].get("finalizers") or [])))

    def create_employees(self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]) -> Any:
        self._note("create", to_create)
        return super().create_employees(ctx, employer, to_create)

    def update_employees(self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employee]) -> Any:
        self._note("update", to_update)
        return super().update_employees(ctx, employer, to_update)


def _service(api: FakeApi, *, deleting: bool = False) -> None:
    meta: dict[str, Any] = {
        "name": "svc",
        "finalizers": [wire.CLEAN_FINALIZER],
        "labels": {wire.CONTROL_LABEL: "true"},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    api.put(kube.SERVICE, {"kind": "Service", "metadata": meta, "spec": {"selector": {"app": "web"}}})


def _pod(api: FakeApi, name: str, *, ready: bool, finalizers: list[str] | None = None) -> None:
    status = {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": str(ready)}]}
    meta = {"name": name, "labels": {"app": "web"}, "finalizers": finalizers or []}
    api.put(kube.POD, {"metadata": meta, "status": status})


def _reconciler(api: FakeApi, adapter: DemoAdapter, events: Events | None = None) -> Reconciler:
    return Reconciler(AdapterProfile.of(adapter), api, api, events or Events())


def _finalizers(api: FakeApi, name: str) -> list[str]:
    return list((api.get(kube.POD, NS, name) or {"metadata": {}})["metadata"].get("finalizers") or [])


class ServiceWatching(DemoAdapter):
    """Demo adapter that notes, at its VIP's creation, the Service's finalizers as stored in the
    fake API and as handed to the call."""

    def __init__(self, api: FakeApi, provider: FakeProvider) -> None:
        super().__init__(provider)
        self.api = api
        self.seen: list[tuple[list[str], list[str]]] = []

    def create_employer(self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employer]) -> Any:
        stored = self.api.get(kube.SERVICE, NS, "svc") or {"metadata": {}}
        self.seen.append(
            (
                list(stored["metadata"].get("finalizers") or []),
                list(employer["metadata"].get("finalizers") or []),
            )
        )
        return super().create_employer(ctx, employer, to_create)


async def test_a_new_employer_gets_its_clean_finalizer_before_the_provider_holds_anything() -> None:
    # The clean finalizer makes the employer's deletion wait for the provider's clean-up: it is
    # written before the provider is asked for anything, and the pass goes on from the write's
    # answer instead of waiting for its watch event (docs/concepts.md, "One reconcile").
    api, provider = FakeApi(), FakeProvider()
    api.put(
        kube.SERVICE, {"kind": "Service", "metadata": {"name": "svc"}, "spec": {"selector": {"app": "web"}}}
    )
    _pod(api, "web-0", ready=True)
    adapter = ServiceWatching(api, provider)
    await _reconciler(api, adapter).reconcile(f"{NS}/svc")
    assert adapter.seen == [([wire.CLEAN_FINALIZER], [wire.CLEAN_FINALIZER])], "finalized before the VIP"
    assert provider.serving(f"{NS}/svc") == {"web-0"}, "the same pass went on to serve the pod"


async def test_the_guard_and_the_entry_go_on_in_one_write_before_the_call_then_swap_after() -> None:
    api, provider = FakeApi(), FakeProvider()
    _service(api)
    _pod(api, "web-0", ready=True)
    adapter = Watching(api, provider)
    await _reconciler(api, adapter).reconcile(f"{NS}/svc")
    assert adapter.seen == [("create", "web-0", [G])], "guarded before the provider was called"
    writes = [{k: v for k, v in w.items() if k != "resourceVersion"} for n, w in api.writes if n == "web-0"]
    entry = lifecycle.render_available_conditions({ENTRY: L})
    assert writes == [
        {"annotations": {wire.AVAILABLE_CONDITIONS_ANNOTATION: entry}, "finalizers": [G]},
        {"finalizers": [L]},
    ]


async def test_a_call_that_reports_failure_leaves_the_guard_and_adds_no_lifecycle_finalizer() -> None:
    api, provider = FakeApi(), FakeProvider()
    _service(api)
    _pod(api, "web-0", ready=True)
    provider.report_failure_after_doing("create_rs")
    with pytest.raises(ReconcileError, match="syncCreate failed"):
        await _reconciler(api, DemoAdapter(provider)).reconcile(f"{NS}/svc")
    assert provider.snapshot()[f"{NS}/svc"]["web-0"].traffic_on, "the provider did route"
    assert _finalizers(api, "web-0") == [G]


async def test_a_pod_that_cannot_be_guarded_is_not_registered() -> None:
    api, provider = FakeApi(), FakeProvider()
    _service(api)
    _pod(api, "web-0", ready=True)
    _pod(api, "web-1", ready=True)
    api.refuse.add("web-1")  # every write to web-1 conflicts
    adapter = Watching(api, provider)
    with pytest.raises(ReconcileError):  # the entry of web-1 could not be written
        await _reconciler(api, adapter).reconcile(f"{NS}/svc")
    assert [name for _, name, _ in adapter.seen] == ["web-0"]
    assert "web-1" not in provider.snapshot()[f"{NS}/svc"]


async def test_a_not_ready_pod_is_held_by_the_guard_not_by_the_lifecycle_finalizer() -> None:
    api, provider = FakeApi(), FakeProvider()
    _service(api)
    _pod(api, "web-0", ready=True, finalizers=[L])
    provider.put_rs("create_rs", f"{NS}/svc", {"web-0": RealServer("10.0.0.1", True, 100)})
    _pod(api, "web-0", ready=False, finalizers=[L])
    await _reconciler(api, DemoAdapter(provider)).reconcile(f"{NS}/svc")
    assert not provider.snapshot()[f"{NS}/svc"]["web-0"].traffic_on
    assert _finalizers(api, "web-0") == [G], "registered at weight 0: held, not served"


async def test_deleting_an_employer_whose_backends_went_with_it_releases_every_guarded_pod() -> None:
    api, provider = FakeApi(), FakeProvider()
    _service(api, deleting=True)
    _pod(api, "web-0", ready=True, finalizers=[L, "example.com/keep"])
    _pod(api, "web-1", ready=False, finalizers=[G])
    await _reconciler(api, DemoAdapter(provider, record_expected_finalizers=False)).reconcile(f"{NS}/svc")
    assert _finalizers(api, "web-0") == ["example.com/keep"]
    assert _finalizers(api, "web-1") == []
    assert api.get(kube.SERVICE, NS, "svc") is None, "clean finalizer released, the Service went"


async def test_a_permanent_error_reaches_the_controller_through_the_cause_chain() -> None:
    class Broken(DemoAdapter):
        def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
            raise PermanentError("no such load balancer")

    api, events = FakeApi(), Events()
    _service(api)
    with pytest.raises(ReconcileError) as failed:
        await _reconciler(api, Broken(FakeProvider()), events).reconcile(f"{NS}/svc")
    assert isinstance(steering(failed.value), PermanentError)
    assert (
        "Warning",
        "GetCurrentEmployeesFailed",
        "get current employees failed: no such load balancer",
    ) in (events.recorded)


async def test_items_failed_without_an_error_end_the_pass_as_sync_failed() -> None:
    class Slow(DemoAdapter):
        def create_employees(
            self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]
        ) -> Any:
            return [], to_create

    api = FakeApi()
    _service(api)
    _pod(api, "web-0", ready=True)
    with pytest.raises(SyncFailedExist):
        await _reconciler(api, Slow(FakeProvider())).reconcile(f"{NS}/svc")
    assert _finalizers(api, "web-0") == [G], "unknown outcome: the guard stays"


async def test_a_refused_item_becomes_a_warning_only_once_it_outlasted_its_retries() -> None:
    """docs/concepts.md, "When a failure becomes a Warning": the same refusal on 3 consecutive
    passes over at least ``warn_after_seconds``; a pass without it ends the streak."""

    class Refusing(DemoAdapter):
        refuse = True

        def create_employees(
            self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]
        ) -> Any:
            if not self.refuse:
                return super().create_employees(ctx, employer, to_create)
            for item in to_create:
                ctx.fail_item(item.id, "AddVServerGroupBackendServers: busy", "ServiceUnavailable")
            return [], to_create

    api, events = FakeApi(), Events()
    _service(api)
    _pod(api, "web-0", ready=True)
    adapter = Refusing(FakeProvider())
    reconciler = _reconciler(api, adapter, events)
    retried: list[str] = []
    reconciler.report_retried = retried.append

    async def one_pass() -> None:
        with pytest.raises(SyncFailedExist):
            await reconciler.reconcile(f"{NS}/svc")

    # Passes alone are not enough: the failure must also have lasted warn_after_seconds.
    reconciler.warn_after_seconds = 3600.0
    for _ in range(4):
        await one_pass()
    assert events.recorded == [] and retried == ["SyncEmployeesFailed"] * 4
    assert _finalizers(api, "web-0") == [G], "refused: the guard stays"
    reconciler.warn_after_seconds = 0.0
    await one_pass()
    message = (
        "sync employees failed: syncCreate failed, err: web-0: "
        "ServiceUnavailable: AddVServerGroupBackendServers: busy"
    )
    assert events.recorded == [("Warning", "SyncEmployeesFailed", message)]
    # A pass that no longer meets it ends the streak: the next refusal counts from one again.
    adapter.refuse = False
    await reconciler.reconcile(f"{NS}/svc")
    assert _finalizers(api, "web-0") == [L]
    _pod(api, "web-1", ready=True)
    reconciler.employee_changed(f"{NS}/svc", "web-1")  # as its watch event would
    adapter.refuse = True
    await one_pass()
    await one_pass()
    assert len(events.recorded) == 1, "two passes: not yet a Warning"
    await one_pass()
    assert events.recorded[-1][2] == message.replace("web-0", "web-1")


async def test_a_gated_pod_that_reaches_the_cache_during_the_pass_keeps_its_gate_closed() -> None:
    """The selection read at the start of a pass does not know a pod created during it; the
    gate decision must not take that pod for one the employer stopped selecting."""
    gate = lifecycle.readiness_gate("svc")

    class Arriving(DemoAdapter):
        def create_employees(
            self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]
        ) -> Any:
            # A new pod of the Service's rollout appears while the provider is being called.
            api.put(
                kube.POD,
                {
                    "metadata": {"name": "web-new", "labels": {"app": "web"}},
                    "spec": {"readinessGates": [{"conditionType": gate}]},
                    "status": {
                        "podIP": "10.0.0.9",
                        "conditions": [{"type": "ContainersReady", "status": "True"}],
                    },
                },
            )
            return super().create_employees(ctx, employer, to_create)

    api = FakeApi()
    _service(api)
    _pod(api, "web-0", ready=True)
    await _reconciler(api, Arriving(FakeProvider(), record_expected_finalizers=False)).reconcile(f"{NS}/svc")
    for name, body in api.status_writes:
        for condition in body.get("status", {}).get("conditions", []):
            if name == "web-new" and condition.get("type") == gate:
                assert condition["status"] != "True", (
                    f"gate opened before the provider serves it: {condition}"
                )


# -- ReconcileContext.changed (docs/concepts.md, "Work proportional to change") ------------------------


class Noting(DemoAdapter):
    """Demo adapter that notes ``ctx.changed`` at each pass and, beside its incremental items,
    what a full rebuild from the same cache gives."""

    def __init__(self, provider: FakeProvider) -> None:
        super().__init__(provider, record_expected_finalizers=False)
        self.changed: list[frozenset[str] | None] = []
        self.results: list[tuple[list[Any], list[Any]]] = []
        self._last_pass: ReconcileContext | None = None

    def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        items = super().get_expected_employee(ctx, employer)
        if ctx is self._last_pass:
            return items  # read again in the same pass (after the employer's create): noted once
        self._last_pass = ctx
        self.changed.append(ctx.changed)
        fresh = ReconcileContext(reader=ctx.reader, controller=ctx.controller, employer_key=ctx.employer_key)
        full = super().get_expected_employee(fresh, employer)
        self.results.append((_items(items), _items(full)))
        return items


def _items(items: list[Employee]) -> list[Any]:
    return sorted((i.id, i.statuses.model_dump()) for i in items)


async def test_the_first_pass_is_full_then_each_pass_is_told_only_the_employees_named_since() -> None:
    api, provider = FakeApi(), FakeProvider()
    _service(api)
    for i in range(3):
        _pod(api, f"web-{i}", ready=True)
    adapter = Noting(provider)
    reconciler = _reconciler(api, adapter)
    key = f"{NS}/svc"
    await reconciler.reconcile(key)
    reconciler.employee_changed(key, "web-1")
    reconciler.employee_changed(key, "web-2")
    reconciler.employee_changed("ns/other", "web-0")  # another employer's events stay its own
    await reconciler.reconcile(key)
    await reconciler.reconcile(key)
    assert adapter.changed == [None, frozenset({"web-1", "web-2"}), frozenset()]


async def test_a_failed_pass_and_a_changed_employer_each_make_the_next_pass_full() -> None:
    api, provider = FakeApi(), FakeProvider()
    _service(api)
    _pod(api, "web-0", ready=True)
    adapter = Noting(provider)
    reconciler = _reconciler(api, adapter)
    key = f"{NS}/svc"
    await reconciler.reconcile(key)
    provider.fail_next("query_rs")
    reconciler.employee_changed(key, "web-0")
    with pytest.raises(ReconcileError):
        await reconciler.reconcile(key)
    reconciler.employee_changed(key, "web-0")
    await reconciler.reconcile(key)  # after the failure: full
    reconciler.employee_changed(key, "web-0")
    await reconciler.reconcile(key)  # incremental again
    reconciler.employee_changed(key, "web-0")
    reconciler.employer_changed(key)
    await reconciler.reconcile(key)  # the employer changed: full
    assert adapter.changed == [None, frozenset({"web-0"}), None, frozenset({"web-0"}), None]


async def test_a_pass_after_full_pass_every_seconds_is_full_whatever_changed() -> None:
    api, provider = FakeApi(), FakeProvider()
    _service(api)
    _pod(api, "web-0", ready=True)
    adapter = Noting(provider)
    reconciler = _reconciler(api, adapter)
    reconciler.full_pass_every = 0.0
    key = f"{NS}/svc"
    await reconciler.reconcile(key)
    reconciler.employee_changed(key, "web-0")
    await reconciler.reconcile(key)
    assert adapter.changed == [None, None]


async def test_the_demo_adapter_told_what_changed_gives_what_a_full_rebuild_gives() -> None:
    api, provider = FakeApi(), FakeProvider()
    _service(api)
    for i in range(4):
        _pod(api, f"web-{i}", ready=True)
    adapter = Noting(provider)
    reconciler = _reconciler(api, adapter)
    key = f"{NS}/svc"
    await reconciler.reconcile(key)

    def edit(name: str, change: Callable[[KubeObject], None]) -> None:
        pod = api.get(kube.POD, NS, name)
        assert pod is not None
        change(pod)
        api.put(kube.POD, pod)
        reconciler.employee_changed(key, name)

    edit("web-0", lambda p: p["status"]["conditions"][0].update(status="False"))  # not ready
    edit("web-1", lambda p: p["metadata"]["labels"].update(app="other"))  # no longer selected
    edit("web-2", lambda p: p["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"))
    del api.objects[(kube.POD.plural, NS, "web-3")]  # gone
    reconciler.employee_changed(key, "web-3")
    _pod(api, "web-4", ready=True)  # new
    reconciler.employee_changed(key, "web-4")
    await reconciler.reconcile(key)
    incremental, full = adapter.results[-1]
    assert adapter.changed[-1] == frozenset({"web-0", "web-1", "web-2", "web-3", "web-4"})
    assert incremental == full
    assert [name for name, _ in incremental] == ["web-0", "web-4"]
    assert not provider.snapshot()[key]["web-0"].traffic_on


def test_look_again_in_keeps_the_earliest_ask_and_refuses_negative_seconds() -> None:
    # docs/reference/adapter.md, "Looking again": the frame requeues within the earliest ask.
    ctx = ReconcileContext(reader=None, controller="c", employer_key="ns/web")  # type: ignore[arg-type]
    assert ctx.look_again is None
    ctx.look_again_in(5.0)
    ctx.look_again_in(2.0)
    ctx.look_again_in(3.0)
    assert ctx.look_again == 2.0
    with pytest.raises(ValueError, match=">= 0"):
        ctx.look_again_in(-1)


# -- the step modules on their own: what each takes, what it returns --------------------------------------


async def test_the_sync_puts_each_calls_items_in_its_own_results_and_holds_back_what_guard_refused() -> None:
    # reconcile/sync.py: one table of the three calls (failures.CALLS), each call's items in its fields.
    calls: list[tuple[str, list[str]]] = []

    def call(label: str, fail: set[str]) -> Callable[..., tuple[list[Employee], list[Employee]]]:
        def run(ctx: ReconcileContext, employer: KubeObject, items: list[Employee]) -> Any:
            calls.append((label, [i.id for i in items]))
            return [i for i in items if i.id not in fail], [i for i in items if i.id in fail]

        return run

    async def before_calls(planned: Any, current: Any) -> set[str]:
        return {"b"}  # the guard could not go on b's pod

    ctx = ReconcileContext(reader=None, controller="c", employer_key="ns/web")  # type: ignore[arg-type]
    expected = [Employee(id=i, name=f"web-{i}") for i in ("a", "b", "c")]
    current = [Employee(id="z", name="web-z")]
    results = await sync.sync(
        ctx,
        {},
        expected,
        current,
        call("create", {"c"}),
        call("update", set()),
        call("delete", set()),
        "employees",
        before_calls,
    )
    assert calls == [("create", ["a", "c"]), ("delete", ["z"])]
    assert [i.id for i in results.succ_created] == ["a"]
    assert [i.id for i in results.fail_created] == ["b", "c"], "held back first, then refused"
    assert [i.id for i in results.succ_deleted] == ["z"]
    assert not (results.succ_updated or results.fail_updated or results.fail_deleted)
    assert [c.label for c in failures.CALLS] == ["syncCreate", "syncUpdate", "syncDelete"]


def test_a_plan_made_again_after_the_guard_calls_only_for_guarded_pods_and_keeps_every_held_item() -> None:
    # reconcile/sync.py: replanned, the plan of a pass that looked again once the guard wrote.
    def item(name: str, ready: bool) -> Employee:
        return Employee(id=name, name=name, statuses=PodEmployeeStatuses(lifecycle_ready=ready))

    current = [item("a", False), item("d", True), item("e", True), item("g", True), item("h", True)]
    first = diff([item(n, False) for n in "abcfh"] + [item("g", True)], current)
    assert ([i.id for i in first.to_create], [i.id for i in first.to_update]) == (["b", "c", "f"], ["h"])
    first.to_create = [i for i in first.to_create if i.id != "c"]  # held back by the guard
    # Meanwhile: a and b turned Ready, c too, n came (not guarded), e is expected again, f's pod
    # left before it was registered, g's and h's pods left after.
    fresh = diff([item(n, True) for n in "abce"] + [item("n", False)], current)
    plan = sync.replanned(first, fresh, held_back={"c"}, may_call=lambda i: i.name != "n")

    def ids(items: list[Employee]) -> list[tuple[str, bool]]:
        return [(i.id, i.statuses.lifecycle_ready) for i in items]

    assert ids(plan.to_create) == [("b", True)], "c held back, f gone, n not guarded"
    assert ids(plan.to_update) == [("h", False), ("a", True)], "h's update as first planned"
    assert ids(plan.to_delete) == [("d", True)], "a delete found only now (g, h) waits"
    assert ids(plan.unchanged) == [("e", True), ("g", True)], "every item the provider holds is judged"


def test_after_the_calls_the_guard_returns_each_pods_verdict_and_the_gate_facts() -> None:
    # reconcile/guard.py: after_calls decides from what the provider confirmed and plans the swaps.
    ready = PodEmployeeStatuses(lifecycle_ready=True)
    results: CUDResults[Employee] = CUDResults(
        succ_created=[Employee(id="a", name="web-a", statuses=ready)],
        fail_updated=[Employee(id="b", name="web-b")],
        unchanged=[Employee(id="c", name="web-c")],
    )
    entry = EmployerEntry(ENTRY, L, G)
    writer = PodWriter(NS, lambda name: PodLocation(None, None, name), entry)  # type: ignore[arg-type]
    after = guard.after_calls(
        results,
        {"c": Employee(id="c", name="web-c")},
        follows_lifecycle=True,
        carriers={"web-d"},
        entry=entry,
        pod_of=lambda name: None,
        writer=writer,
    )
    assert after.verdicts == {
        "web-a": guard.Verdict.SERVED,
        "web-b": guard.Verdict.UNKNOWN,
        "web-c": guard.Verdict.ROUTING,
        "web-d": guard.Verdict.IDLE,
    }
    assert after.serving == {"web-a"} and after.unknown == {"web-b"}
    assert after.employed == {"web-a", "web-b", "web-c"}
    planned = [name for name in ("web-a", "web-b", "web-c", "web-d") if writer.planned(name)]
    assert planned == ["web-a", "web-c", "web-d"], "web-b's outcome is unknown: untouched"
    assert (
        guard.after_calls(
            results,
            {},
            follows_lifecycle=False,
            carriers=(),
            entry=entry,
            pod_of=lambda n: None,
            writer=writer,
        ).verdicts
        == {}
    ), "an employer that does not follow PodOpsLifecycle plans no swaps"


def test_a_pod_named_by_several_items_gets_the_most_cautious_verdict_and_serves_only_when_served() -> None:
    # guard.judge: several items of one pod (two ports, two backends) merge to the most cautious
    # verdict, and the readiness gates see the pod served only when that verdict is SERVED.
    ready = PodEmployeeStatuses(lifecycle_ready=True)
    results: CUDResults[Employee] = CUDResults(
        succ_created=[Employee(id="a1", name="web-a", statuses=ready), Employee(id="b1", name="web-b")],
        succ_updated=[Employee(id="c1", name="web-c", statuses=ready)],
        succ_deleted=[Employee(id="c2", name="web-c"), Employee(id="d2", name="web-d")],
        fail_updated=[Employee(id="a2", name="web-a", statuses=ready)],
        unchanged=[
            Employee(id="b2", name="web-b", statuses=ready),
            Employee(id="d1", name="web-d", statuses=ready),
        ],
    )
    verdicts, serving = guard.judge(results, {})
    assert verdicts == {
        "web-a": guard.Verdict.UNKNOWN,  # served by one item, the other's call failed
        "web-b": guard.Verdict.ROUTING,  # one item not ready, the other served
        "web-c": guard.Verdict.SERVED,  # served, and another item of it deleted
        "web-d": guard.Verdict.SERVED,
    }
    assert serving == {"web-c", "web-d"}


def test_announcements_name_each_change_once_and_read_no_finalizers_for_what_was_told() -> None:
    # reconcile/guard.py: a steady pass over many served pods tells nothing and reads no pod.
    entry = EmployerEntry(ENTRY, L, G)
    verdicts = {
        "told-served": guard.Verdict.SERVED,
        "told-guarded": guard.Verdict.ROUTING,
        "told-drained": guard.Verdict.ROUTING,
        "never-told-idle": guard.Verdict.IDLE,
        "unknown": guard.Verdict.UNKNOWN,
        "now-served": guard.Verdict.SERVED,
        "now-drained": guard.Verdict.ROUTING,
        "now-guarded": guard.Verdict.ROUTING,
        "now-released": guard.Verdict.IDLE,
        "served-not-yet-written": guard.Verdict.SERVED,
        "released-still-carrying": guard.Verdict.IDLE,
    }
    told = {
        "told-served": "pod_served",
        "told-guarded": "pod_guarded",
        "told-drained": "pod_drained",
        "now-drained": "pod_served",
        "now-released": "pod_guarded",
        "released-still-carrying": "pod_served",
    }
    finalizers = {
        "now-served": [L],
        "now-drained": [G],
        "now-guarded": [G],
        "now-released": [],
        "served-not-yet-written": [G],
        "released-still-carrying": [L],
    }
    read: list[str] = []

    def finalizers_of(name: str) -> list[str]:
        read.append(name)
        return finalizers[name]

    assert guard.announcements(verdicts, told, finalizers_of, entry) == [
        ("now-drained", "pod_drained"),
        ("now-guarded", "pod_guarded"),
        ("now-released", "pod_released"),
        ("now-served", "pod_served"),
    ]
    assert sorted(read) == sorted(finalizers), "only pods whose news would differ are read"


def test_the_unguarded_count_is_reported_when_it_changes_and_when_its_employer_is_forgotten() -> None:
    # reconcile/memory.py: the count lives in the employer's one record.
    reported: list[int] = []
    memories = Memories(reported.append)
    memories.count_unguarded("ns/a", 2)
    memories.count_unguarded("ns/a", 2)
    memories.count_unguarded("ns/b", 0)
    memories.count_unguarded("ns/b", 1)
    assert reported == [2, 2, 3]
    memories.forget("ns/a")
    assert reported[-1] == 1 and memories.unguarded() == {"ns/b": 1}
    memories.forget("ns/never-seen")
    assert reported == [2, 2, 3, 1]


def test_the_next_pass_comes_at_the_earliest_ask() -> None:
    result = Result()
    result.sooner(None, 5.0, 2.0)
    assert result.requeue_after == 2.0
    result.sooner(3.0, None)
    assert result.requeue_after == 2.0


class Reading(DemoAdapter):
    """Demo adapter that notes each read and call with the thread it ran in, and whose employees'
    current read needs the employer on the provider (as a backend group needs its load balancer)."""

    def __init__(self, provider: FakeProvider) -> None:
        super().__init__(provider, record_expected_finalizers=False)
        self.calls: list[tuple[str, int]] = []

    def _note(self, what: str) -> None:
        self.calls.append((what, threading.get_ident()))

    def get_expected_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Any]:
        self._note("expected employer")
        return super().get_expected_employer(ctx, employer)

    def get_current_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Any]:
        self._note("current employer")
        return super().get_current_employer(ctx, employer)

    def create_employer(self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Any]) -> Any:
        self._note("create employer")
        return super().create_employer(ctx, employer, to_create)

    def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        self._note("expected employees")
        return super().get_expected_employee(ctx, employer)

    def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        self._note("current employees")
        if self.provider.query_vip(f"{NS}/svc") is None:
            raise RuntimeError("no load balancer for ns/svc")
        return super().get_current_employee(ctx, employer)


async def test_both_sides_are_read_in_one_hand_off_and_the_employees_again_after_an_employer_call() -> None:
    """``sync.read_sides``: a pass reads expected and current, the employer's then the employees',
    in one worker thread; when the employer's sync calls the provider, the employees' reads are
    made again after it (here the first read fails: the load balancer did not exist yet)."""
    api, provider = FakeApi(), FakeProvider()
    _service(api)
    _pod(api, "web-0", ready=True)
    adapter = Reading(provider)
    reconciler = _reconciler(api, adapter)
    reads = ["expected employer", "current employer", "expected employees", "current employees"]

    await reconciler.reconcile(f"{NS}/svc")
    assert [what for what, _ in adapter.calls] == [*reads, "create employer", *reads[2:]]
    assert len({thread for _, thread in adapter.calls[:4]}) == 1, "the four reads in one hand-off"
    assert provider.serving(f"{NS}/svc") == {"web-0"}, "registered on the reads made after the create"

    adapter.calls.clear()
    await reconciler.reconcile(f"{NS}/svc")
    assert [what for what, _ in adapter.calls] == reads, "nothing to call on the employer: read once"
    assert len({thread for _, thread in adapter.calls}) == 1


class ReportingNothing(Reading):
    """Creates the load balancer but reports no item of the call as done or failed."""

    def create_employer(self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Any]) -> Any:
        super().create_employer(ctx, employer, to_create)
        return [], []


async def test_the_employees_are_read_again_after_an_employer_call_whatever_the_adapter_reported() -> None:
    """Whether the employer's sync called the provider is told by the call, not by the items
    the adapter reported: a create that reports nothing still has the employees read again."""
    api, provider = FakeApi(), FakeProvider()
    _service(api)
    _pod(api, "web-0", ready=True)
    adapter = ReportingNothing(provider)
    await _reconciler(api, adapter).reconcile(f"{NS}/svc")
    reads = ["expected employer", "current employer", "expected employees", "current employees"]
    assert [what for what, _ in adapter.calls] == [*reads, "create employer", *reads[2:]]
    assert provider.serving(f"{NS}/svc") == {"web-0"}
