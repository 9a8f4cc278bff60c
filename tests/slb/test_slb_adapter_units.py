"""Unit tests of the SLB adapter's pure parts: the per-Service requeue backoff, the labels and
annotations it reads, the mode strategy a Service's annotations choose, its items' equality, and
its registration (no control plane needed; a bad mode's Warning event is claimed end to end by
tests/slb/test_slb_adapter.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.adapter import CUDResults, Employee, PodEmployeeStatuses, ReconcileContext
from resourceconsist.adapters import registry
from resourceconsist.adapters.alibabacloudslb import (
    MissingCredentials,
    RequeueBackoff,
    SLBAdapter,
    SLBConfigError,
    config,
    vserver_group_name,
)
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.adapters.alibabacloudslb.credentials import (
    SLB_ACCESS_KEY_ENV,
    SLB_ACCESS_SECRET_ENV,
    SLB_ENDPOINT_ENV,
)
from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.adapters.alibabacloudslb.items import (
    Attached,
    Desired,
    ManagedEmployee,
    ObservedEmployee,
    Traffic,
)
from resourceconsist.adapters.alibabacloudslb.manage import ManageStrategy
from resourceconsist.adapters.alibabacloudslb.observe import ObserveStrategy
from resourceconsist.adapters.alibabacloudslb.slbclient import BackendServer, SLBClient
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject, Resource
from resourceconsist.rules import lifecycle
from resourceconsist.rules.labels import map_selects
from resourceconsist.webhook import ControlledServiceAdapter


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _service(name: str = "web", namespace: str = "ns", **annotations: str) -> dict[str, Any]:
    return {
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {wire.CONTROL_LABEL: "true", LOAD_BALANCER_ID_LABEL: "lb-1"},
            "annotations": annotations,
        },
        "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]},
    }


def _pod(name: str = "p", **annotations: str) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
        "spec": {"containers": [{"name": "app", "ports": [{"name": "http", "containerPort": 9090}]}]},
        "status": {"podIP": "10.0.0.1"},
    }


# ---- backoff ----------------------------------------------------------------------------------


def test_backoff_doubles_while_the_same_items_wait_and_resets_on_progress_and_sync() -> None:
    clock = FakeClock()
    backoff = RequeueBackoff(0.1, 30.0, clock=clock)
    intervals = []
    for _ in range(12):
        intervals.append(backoff.observe("ns/web", ["pod-a|on"]))
        clock.now += intervals[-1] or 0
    assert intervals[:2] == pytest.approx([0.1, 0.1])
    assert intervals[2:6] == pytest.approx([0.2, 0.4, 0.8, 1.6])
    assert intervals[-1] == 30.0, "capped"

    # Progress (another set of items waiting) starts over; so does any new work.
    assert backoff.observe("ns/web", ["pod-b|on"]) == 0.1
    # In sync: the key is forgotten, and an unknown key gets the longest interval in use.
    backoff.observe("ns/other", ["x"])
    clock.now += 5
    assert backoff.observe("ns/other", ["x"]) == 5.0
    assert backoff.observe("ns/web", []) is None
    assert "ns/web" not in backoff.waiting()
    assert backoff.interval(None) == 5.0
    assert backoff.interval("ns/web") == 5.0


def test_backoff_is_capped_by_a_known_deadline() -> None:
    clock = FakeClock()
    backoff = RequeueBackoff(0.1, 30.0, clock=clock)
    backoff.observe("k", ["a"])
    clock.now += 20
    assert backoff.observe("k", ["a"], due_in=2.5) == 2.5
    assert backoff.observe("k", ["a"], due_in=0.0) == 0.1, "never below base"


async def test_requeue_interval_is_per_service() -> None:
    """Two Services end passes concurrently; each gets its own Service's interval."""
    with SLBEmulator() as slb, SLBClient(slb.credentials()) as client:
        adapter = SLBAdapter(client, backoff=RequeueBackoff(0.1, 30.0))
        failed = Employee(id="p", name="p", statuses=PodEmployeeStatuses())

        def ctx(key: str) -> ReconcileContext:
            return ReconcileContext(reader=None, controller="c", employer_key=key)  # type: ignore[arg-type]

        # "slow" has waited 8 s for the same item already.
        await adapter.record_statuses(ctx("ns/slow"), {}, CUDResults(), CUDResults(fail_updated=[failed]))
        adapter.backoff._waiting["ns/slow"].since -= 8

        async def worker(key: str) -> float:
            await adapter.record_statuses(ctx(key), {}, CUDResults(), CUDResults(fail_updated=[failed]))
            await asyncio.sleep(0)  # the other worker ends its pass in between
            return adapter.employer_requeue_interval(ctx(key), {})

        slow, fresh = await asyncio.gather(worker("ns/slow"), worker("ns/fresh"))
        assert fresh == 0.1
        assert slow == pytest.approx(8.0, abs=0.5)

        # A pass with nothing left waiting forgets the Service.
        await adapter.record_statuses(ctx("ns/slow"), {}, CUDResults(), CUDResults(unchanged=[failed]))
        assert "ns/slow" not in adapter.backoff.waiting()


# ---- labels and annotations ---------------------------------------------------------------------


def test_group_name_is_ours_and_fits_slb_limits() -> None:
    assert vserver_group_name(_service()) == "resourceconsist/ns/web"
    long = vserver_group_name(_service("s" * 63, "n" * 63))
    assert len(long) <= 80
    assert long.startswith("resourceconsist/")
    assert long != vserver_group_name(_service("s" * 62 + "t", "n" * 63)), "a hash keeps long names apart"
    assert not long.startswith("k8s/"), "CCM claims k8s/<port>/<svc>/<ns>/<cluster> groups only"


def test_mode_weight_port_type_and_drain_parsing() -> None:
    assert config.mode_of(_service()) is config.Mode.OBSERVE
    assert config.mode_of(_service(**{config.MODE_ANNOTATION: "Manage"})) is config.Mode.MANAGE
    with pytest.raises(SLBConfigError, match="slb-mode"):
        config.mode_of(_service(**{config.MODE_ANNOTATION: "own"}))

    svc = _service(**{config.WEIGHT_ANNOTATION: "30"})
    assert config.backend_weight(_service(), _pod()) == 100
    assert config.backend_weight(svc, _pod()) == 30
    assert config.backend_weight(svc, _pod(**{config.WEIGHT_ANNOTATION: "0"})) == 0
    with pytest.raises(SLBConfigError, match=r"0\.\.100"):
        config.backend_weight(svc, _pod(**{config.WEIGHT_ANNOTATION: "101"}))

    assert config.backend_port(_service(), _pod()) == 8080
    assert config.backend_port(_service(**{config.PORT_ANNOTATION: "http"}), _pod()) == 9090
    assert config.backend_port(_service(**{config.PORT_ANNOTATION: "grpc"}), _pod()) is None
    two_ports = _service()
    two_ports["spec"]["ports"].append({"port": 81})
    with pytest.raises(SLBConfigError, match="2 ports"):
        config.backend_port(two_ports, _pod())

    assert config.backend_type(_service(), _pod()) == "eni"
    assert config.backend_type(_service(), _pod(**{config.BACKEND_TYPE_ANNOTATION: "eci"})) == "eci"
    with pytest.raises(SLBConfigError, match="ECS backends"):
        config.backend_type(_service(**{config.BACKEND_TYPE_ANNOTATION: "ecs"}), _pod())

    assert config.drain_seconds(_service()) == 0.0
    assert config.drain_seconds(_service(**{config.DRAIN_ANNOTATION: "2.5"})) == 2.5
    with pytest.raises(SLBConfigError, match="slb-drain-seconds"):
        config.drain_seconds(_service(**{config.DRAIN_ANNOTATION: "soon"}))


# ---- the mode strategy ----------------------------------------------------------------------------


class PodsReader:
    """In-memory pods, read the way the SLB adapter reads the frame's ObjectReader
    (resourceconsist.cluster.interfaces): all pods, those a Service selects, those holding a finalizer."""

    def __init__(self, *pods: KubeObject) -> None:
        self.pods = list(pods)

    def list(self, resource: Resource, *_: Any) -> list[KubeObject]:
        return list(self.pods) if resource is kube.POD else []

    def pods_selected_by(self, service: KubeObject) -> list[KubeObject]:
        selector = service["spec"]["selector"]
        return [p for p in self.pods if map_selects(selector, p["metadata"].get("labels") or {})]

    def pods_with_finalizer(self, namespace: str, finalizer: str) -> list[KubeObject]:
        return [p for p in self.pods if finalizer in (p["metadata"].get("finalizers") or [])]

    def pods_with_readiness_gate(self, namespace: str, condition_type: str) -> list[KubeObject]:
        return [p for p in self.pods if condition_type in lifecycle.readiness_gates(p)]


def _ctx(reader: PodsReader | None = None) -> ReconcileContext:
    return ReconcileContext(reader=reader or PodsReader(), controller="c", employer_key="ns/web")


@pytest.fixture
def emulated() -> Iterator[tuple[SLBEmulator, SLBAdapter]]:
    with SLBEmulator() as slb, SLBClient(slb.credentials()) as client:
        yield slb, SLBAdapter(client, cluster_name="unit")


async def test_the_mode_annotation_chooses_the_strategy_once_per_pass(
    emulated: tuple[SLBEmulator, SLBAdapter],
) -> None:
    _, adapter = emulated
    chosen = {
        None: ObserveStrategy,
        "": ObserveStrategy,
        "observe": ObserveStrategy,
        "Manage": ManageStrategy,
        " manage ": ManageStrategy,
    }
    for value, strategy_class in chosen.items():
        annotations = {} if value is None else {config.MODE_ANNOTATION: value}
        strategy = adapter.strategy(_ctx(), _service(**annotations))
        assert type(strategy) is strategy_class, f"slb-mode={value!r}"
        assert strategy.error is None and strategy.lb_id == "lb-1"

    manage = adapter.strategy(
        _ctx(), _service(**{config.MODE_ANNOTATION: "manage", config.DRAIN_ANNOTATION: "2.5"})
    )
    assert isinstance(manage, ManageStrategy)
    assert (manage.group_name, manage.drain_seconds) == ("resourceconsist/ns/web", 2.5)

    # Once per pass: an annotation changed during a pass is read by the next pass.
    ctx, service = _ctx(), _service()
    first = adapter.strategy(ctx, service)
    service["metadata"]["annotations"][config.MODE_ANNOTATION] = "manage"
    assert adapter.strategy(ctx, service) is first
    assert type(adapter.strategy(_ctx(), service)) is ManageStrategy


async def test_only_manage_mode_keeps_unselected_pods_that_hold_the_finalizer_selected(
    emulated: tuple[SLBEmulator, SLBAdapter],
) -> None:
    _, adapter = emulated
    selected = _pod("web-0")
    selected["metadata"]["labels"] = {"app": "web"}
    leaving = _pod("old")
    leaving["metadata"]["finalizers"] = [lifecycle.lifecycle_finalizer("web")]
    reader = PodsReader(selected, leaving, _pod("stranger"))
    observe = _service()
    manage = _service(**{config.MODE_ANNOTATION: "manage"})
    assert await adapter.get_selected_employee_names(_ctx(reader), observe) == ["web-0"]
    assert await adapter.get_selected_employee_names(_ctx(reader), manage) == ["web-0", "old"]


async def test_a_bad_mode_is_one_clear_error_from_every_method_that_needs_the_settings(
    emulated: tuple[SLBEmulator, SLBAdapter],
) -> None:
    slb, adapter = emulated
    leaving = _pod("old")
    leaving["metadata"]["finalizers"] = [lifecycle.lifecycle_finalizer("web")]
    ctx = _ctx(PodsReader(leaving))
    service = _service(**{config.MODE_ANNOTATION: "own"})
    message = (
        "Service ns/web: annotation resource-consist.kusionstack.io/slb-mode='own' "
        "is neither 'observe' nor 'manage'"
    )
    calls = [
        adapter.get_expected_employer(ctx, service),
        adapter.get_current_employer(ctx, service),
        adapter.create_employer(ctx, service, []),
        adapter.delete_employer(ctx, service, []),
        adapter.get_expected_employee(ctx, service),
        adapter.get_current_employee(ctx, service),
        adapter.create_employees(ctx, service, []),
        adapter.update_employees(ctx, service, []),
        adapter.delete_employees(ctx, service, []),
    ]
    for call in calls:
        with pytest.raises(SLBConfigError) as raised:
            await call
        assert str(raised.value) == message
    assert not slb.calls, "nothing is asked of SLB while the mode is unknown"
    # The selected names are still served, conservatively: a pod holding our finalizer may still
    # have a backend in our group, so it keeps the finalizer until the mode is fixed.
    assert await adapter.get_selected_employee_names(ctx, service) == ["old"]


def test_a_live_service_needs_a_load_balancer_and_its_mode_s_settings_must_parse(
    emulated: tuple[SLBEmulator, SLBAdapter],
) -> None:
    _, adapter = emulated
    unlabelled = _service()
    del unlabelled["metadata"]["labels"][LOAD_BALANCER_ID_LABEL]
    with pytest.raises(SLBConfigError, match=f"ns/web has no {LOAD_BALANCER_ID_LABEL} label"):
        adapter.strategy(_ctx(), unlabelled).checked()
    unlabelled["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert adapter.strategy(_ctx(), unlabelled).checked().lb_id == "", "a deleting one may lack it"

    bad_drain = _service(**{config.MODE_ANNOTATION: "manage", config.DRAIN_ANNOTATION: "soon"})
    strategy = adapter.strategy(_ctx(), bad_drain)
    assert isinstance(strategy, ManageStrategy)
    with pytest.raises(SLBConfigError, match="slb-drain-seconds"):
        strategy.checked()
    # Observe mode reads no drain time: the same annotation does not stop it.
    assert adapter.strategy(_ctx(), _service(**{config.DRAIN_ANNOTATION: "soon"})).checked()


# ---- items --------------------------------------------------------------------------------------


def _member(weight: int, ip: str = "10.0.0.1", port: int = 80) -> BackendServer:
    return BackendServer(
        server_id="eni-1",
        port=port,
        weight=weight,
        server_type="eni",
        server_ip=ip,
        description="resourceconsist/p",
    )


def _managed(extra: Any) -> ManagedEmployee:
    return ManagedEmployee(id="p", name="p", statuses=PodEmployeeStatuses(extra_status=extra))


def test_managed_items_compare_desired_with_attached_backends() -> None:
    on = _managed(Desired(state="on", backend=_member(100)))
    assert on.equal(_managed(Attached(members=(_member(100),))))
    assert not on.equal(_managed(Attached(members=(_member(50),))))
    assert not on.equal(_managed(Attached(members=(_member(100), _member(0, port=81)))))
    assert not on.equal(_managed(Attached()))
    idle = _managed(Desired(state="idle"))
    assert idle.equal(_managed(Attached()))
    assert idle.equal(_managed(Attached(members=(_member(0),))))
    assert not idle.equal(_managed(Attached(members=(_member(1),))))
    gone = _managed(Desired(state="gone"))
    assert gone.equal(_managed(Attached()))
    assert not gone.equal(_managed(Attached(members=(_member(0),))))
    assert not _managed(Desired(state="pending", reason="no IP")).equal(_managed(Attached()))


def test_what_serves_is_a_backend_at_a_weight_above_0_and_not_reported_unhealthy() -> None:
    # Manage mode: registered at weight 0 (the guard holds) but serving nothing (the gate waits).
    assert _managed(Attached(members=(_member(0),))).registered()
    assert not _managed(Attached(members=(_member(0),))).serves()
    assert _managed(Attached(members=(_member(0), _member(100, port=81)))).serves()
    assert not _managed(Attached()).serves()
    assert _managed(Desired(state="on", backend=_member(100))).serves()
    assert not _managed(Desired(state="on", backend=_member(0))).serves()
    assert not _managed(Desired(state="idle")).serves()
    # Observe mode: listed and not abnormal; unknown health (expected side) serves when listed.

    def observed(on: bool, healthy: bool | None) -> ObservedEmployee:
        extra = Traffic(traffic_on=on, healthy=healthy)
        return ObservedEmployee(id="p", name="p", statuses=PodEmployeeStatuses(extra_status=extra))

    assert observed(True, True).serves() and observed(True, None).serves()
    assert observed(True, False).registered() and not observed(True, False).serves()
    assert not observed(False, None).serves()
    # Health never makes an update: SLB judges it, the adapter cannot change it.
    assert observed(True, None).equal(observed(True, False))
    assert not observed(True, None).equal(observed(False, None))


# ---- registration -------------------------------------------------------------------------------


def test_registered_factories_need_credentials_for_the_controller_only() -> None:
    assert "alibabacloudslb" in registry
    with pytest.raises(MissingCredentials, match="ALIYUN_SLB_AK_KEY"):
        registry.controller("alibabacloudslb", {})
    env = {
        SLB_ACCESS_KEY_ENV: "LTAI5tUnitKeyId",
        SLB_ACCESS_SECRET_ENV: "unit-secret-value",
        SLB_ENDPOINT_ENV: "slb.cn-shanghai.aliyuncs.com",
    }
    adapter = registry.controller("alibabacloudslb", env)
    assert isinstance(adapter, SLBAdapter)
    assert adapter.get_controller_name() == "alibaba-cloud-slb-controller"
    assert "unit-secret-value" not in repr(adapter)
    assert "LTAI5tUnitKeyId" not in repr(adapter)
    adapter.client.close()
    webhook = registry.webhook("alibabacloudslb", {})
    assert isinstance(webhook, ControlledServiceAdapter)
    assert webhook.name == "alibabacloudslb"
