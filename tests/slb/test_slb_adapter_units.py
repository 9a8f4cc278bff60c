"""Unit tests of the SLB adapter's pure parts: the per-Service requeue backoff, the labels and
annotations it reads, its items' equality, and its registration (no control plane needed)."""

from __future__ import annotations

import asyncio
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
from resourceconsist.adapters.alibabacloudslb.items import Attached, Desired, ManagedEmployee
from resourceconsist.adapters.alibabacloudslb.slbclient import BackendServer, SLBClient
from resourceconsist.testing.slb_emulator import SLBEmulator
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
