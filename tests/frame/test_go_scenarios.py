"""The Go original's controller scenarios, ported: the demo adapter against a real API server.

Employer: clean finalizer (old one migrated), VIP created, drift corrected, deletion held by a
foreign finalizer. Employees: readiness-gated pod -> traffic on, lifecycle finalizer and record
annotation; service-ready False -> off; back -> on; deleted -> released. Unexpected provider
errors: Warning events with the Go frame's exact message, then convergence. Selector changes.
"""

from __future__ import annotations

from typing import Any

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.experimental.demo import DEMO_QPS, DEMO_VIP, DemoAdapter, FakeProvider, VipStatus
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, annotation, async_wait_for, finalizers


def _entry_key(cluster: Cluster, svc: str) -> str:
    return lifecycle.expected_finalizer_key("Service", cluster.namespace, svc)


async def _entries(cluster: Cluster, pod: str) -> dict[str, str]:
    return lifecycle.expected_finalizers(await cluster.get(kube.POD, pod) or {})


async def test_employer_gets_the_clean_finalizer_and_loses_the_old_one(
    cluster: Cluster, run_manager: Any
) -> None:
    old = wire.OLD_CLEAN_FINALIZER_PREFIX + "svc"
    await cluster.service("svc", finalizers=[old, "example.com/keep"])
    async with run_manager(DemoAdapter()):

        async def migrated() -> bool:
            return finalizers(await cluster.get(kube.SERVICE, "svc")) == [
                "example.com/keep",
                wire.CLEAN_FINALIZER,
            ]

        await async_wait_for(migrated, timeout=20, message="clean finalizer replacing the old one")
        await async_wait_for(
            lambda: cluster.events("svc"), timeout=10, message="an event about the finalizer"
        )
        assert ("Normal", "EnsureEmployerCleanFinalizerSucceed", "add employer clean finalizer succeed") in (
            await cluster.events("svc")
        )


async def test_employer_vip_created_drift_corrected_and_removed_on_deletion(
    cluster: Cluster, run_manager: Any
) -> None:
    provider = FakeProvider()
    key = f"{cluster.namespace}/svc"
    await cluster.service("svc", finalizers=["example.com/foreign"])
    async with run_manager(DemoAdapter(provider)):
        await async_wait_for(
            lambda: provider.vips.get(key) == VipStatus(vip=DEMO_VIP, qps=DEMO_QPS), timeout=20
        )

        provider.set_qps(key, 200)
        # Any change to the Service triggers a reconcile, as in the Go test.
        await cluster.patch(kube.SERVICE, "svc", {"metadata": {"annotations": {"touch": "1"}}})
        await async_wait_for(
            lambda: provider.vips[key].qps == DEMO_QPS, timeout=20, message="QPS back to 100"
        )
        assert provider.calls["update_vip"] == 1

        await cluster.delete(kube.SERVICE, "svc")
        await async_wait_for(lambda: key not in provider.vips, timeout=20, message="VIP removed")

        async def clean_finalizer_released() -> bool:
            svc = await cluster.get(kube.SERVICE, "svc")
            return svc is not None and finalizers(svc) == ["example.com/foreign"]

        await async_wait_for(clean_finalizer_released, timeout=20, message="only the foreign finalizer left")
        svc = await cluster.get(kube.SERVICE, "svc")
        assert svc is not None
        assert svc["metadata"]["deletionTimestamp"]
        await cluster.patch(kube.SERVICE, "svc", {"metadata": {"finalizers": None}})

        async def gone() -> bool:
            return await cluster.get(kube.SERVICE, "svc") is None

        await async_wait_for(gone, timeout=20, message="Service gone")
        assert ("Normal", "CleanEmployerCleanFinalizerSucceed", "clean employer clean finalizer succeed") in (
            await cluster.events("svc")
        )


async def test_pod_traffic_follows_service_ready_and_deletion_releases_it(
    cluster: Cluster, run_manager: Any
) -> None:
    provider = FakeProvider()
    skey = f"{cluster.namespace}/svc"
    flz = lifecycle.lifecycle_finalizer("svc")
    await cluster.service("svc")
    await cluster.pod("pod-1", {"app": "svc"}, readiness_gate=True)
    async with run_manager(DemoAdapter(provider)):
        await cluster.set_status("pod-1", ready=True, service_ready=True)

        def server() -> Any:
            return provider.snapshot().get(skey, {}).get("pod-1")

        await async_wait_for(lambda: server() and server().traffic_on and server().weight == 100, timeout=20)
        assert server().ip == cluster.ip_of("pod-1")

        async def guarded() -> bool:
            pod = await cluster.get(kube.POD, "pod-1")
            svc = await cluster.get(kube.SERVICE, "svc")
            return (
                flz in finalizers(pod)
                and annotation(svc, wire.EXPECTED_FINALIZER_ADDED_ANNOTATION) == "pod-1"
            )

        await async_wait_for(guarded, timeout=20, message="lifecycle finalizer and record annotation")
        assert await _entries(cluster, "pod-1") == {_entry_key(cluster, "svc"): flz}

        await cluster.set_status("pod-1", ready=True, service_ready=False)
        await async_wait_for(
            lambda: not server().traffic_on and server().weight == 0, timeout=20, message="off"
        )

        async def released() -> bool:
            return flz not in finalizers(await cluster.get(kube.POD, "pod-1"))

        await async_wait_for(released, timeout=20, message="finalizer removed from a not-ready pod")

        await cluster.set_status("pod-1", ready=True, service_ready=True)
        await async_wait_for(lambda: server().traffic_on and server().weight == 100, timeout=20, message="on")
        await async_wait_for(guarded, timeout=20, message="finalizer back")

        await cluster.delete(kube.POD, "pod-1")
        await async_wait_for(lambda: server() is None, timeout=20, message="real server removed")

        async def pod_gone() -> bool:
            return await cluster.get(kube.POD, "pod-1") is None

        await async_wait_for(pod_gone, timeout=20, message="pod released and gone")


async def test_provider_reports_failure_after_creating_then_converges(
    cluster: Cluster, run_manager: Any
) -> None:
    provider = FakeProvider()
    provider.report_failure_after_doing("create_vip", message="mock create vip failed")
    provider.report_failure_after_doing("create_rs", message="mock create rs failed")
    skey = f"{cluster.namespace}/svc"
    await cluster.service("svc")
    await cluster.pod("pod-1", {"app": "svc"})
    await cluster.set_status("pod-1")
    async with run_manager(DemoAdapter(provider)):

        async def warned() -> list[tuple[str, str, str]]:
            return [e for e in await cluster.events("svc") if e[0] == "Warning"]

        await async_wait_for(
            lambda: provider.snapshot().get(skey, {}).get("pod-1") is not None and skey in provider.vips,
            timeout=20,
            message="VIP and real server in the provider",
        )
        events = await async_wait_for(warned, timeout=20)
        assert (
            "Warning",
            "SyncEmployerFailed",
            "sync employer failed: syncCreate failed, err: create_vip: mock create vip failed",
        ) in events

        async def employee_warning() -> bool:
            return (
                "Warning",
                "SyncEmployeesFailed",
                "sync employees failed: syncCreate failed, err: create_rs: mock create rs failed",
            ) in await warned()

        await async_wait_for(employee_warning, timeout=20, message="SyncEmployeesFailed event")
        flz = lifecycle.lifecycle_finalizer("svc")

        async def converged() -> bool:
            return flz in finalizers(await cluster.get(kube.POD, "pod-1"))

        await async_wait_for(converged, timeout=20, message="pod guarded after the retries")
        assert provider.calls["create_vip"] == 1
        assert provider.calls["create_rs"] == 1


async def test_selector_changes_move_entry_finalizer_and_real_server(
    cluster: Cluster, run_manager: Any
) -> None:
    provider = FakeProvider()
    skey = f"{cluster.namespace}/svc"
    flz = lifecycle.lifecycle_finalizer("svc")
    await cluster.service("svc")
    await cluster.pod("pod-1", {"app": "svc"})
    await cluster.set_status("pod-1")
    async with run_manager(DemoAdapter(provider)):

        async def selected_state() -> bool:
            pod = await cluster.get(kube.POD, "pod-1")
            return flz in finalizers(pod) and _entry_key(cluster, "svc") in lifecycle.expected_finalizers(
                pod or {}
            )

        await async_wait_for(selected_state, timeout=20, message="pod guarded")

        await cluster.patch(kube.POD, "pod-1", {"metadata": {"labels": {"app": "other"}}})

        async def unselected_state() -> bool:
            pod = await cluster.get(kube.POD, "pod-1")
            return flz not in finalizers(pod) and lifecycle.expected_finalizers(pod or {}) == {}

        await async_wait_for(unselected_state, timeout=20, message="entry and finalizer removed")
        await async_wait_for(lambda: "pod-1" not in provider.snapshot().get(skey, {}), timeout=20)

        # The record annotation is patched after the pod writes: it may still be in flight.
        async def record_emptied() -> bool:
            svc = await cluster.get(kube.SERVICE, "svc")
            return annotation(svc, wire.EXPECTED_FINALIZER_ADDED_ANNOTATION) == ""

        await async_wait_for(record_emptied, timeout=20, message="pod-1 gone from the Service's entry record")

        await cluster.patch(kube.POD, "pod-1", {"metadata": {"labels": {"app": "svc"}}})
        await async_wait_for(selected_state, timeout=20, message="pod guarded again")
        await async_wait_for(lambda: "pod-1" in provider.snapshot().get(skey, {}), timeout=20)


async def test_record_mode_releases_a_pod_whose_server_vanished_before_unselection(
    cluster: Cluster, run_manager: Any
) -> None:
    provider = FakeProvider()
    skey = f"{cluster.namespace}/svc"
    flz = lifecycle.lifecycle_finalizer("svc")
    await cluster.service("svc")
    await cluster.pod("pod-1", {"app": "svc"})
    await cluster.set_status("pod-1")
    async with run_manager(DemoAdapter(provider, record_lifecycle_finalizers=True)) as manager:

        async def recorded() -> bool:
            svc = await cluster.get(kube.SERVICE, "svc")
            pod = await cluster.get(kube.POD, "pod-1")
            return annotation(
                svc, wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION
            ) == "pod-1" and flz in finalizers(pod)

        await async_wait_for(recorded, timeout=20, message="lifecycle finalizer recorded")
        # Stop watching while the provider entry vanishes and the pod leaves the selector, so
        # the controller sees both at once on restart, as in the Go scenario.
        await manager.stop_controller("demo-controller")
        provider.drop_real_server(skey, "pod-1")
        await cluster.patch(kube.POD, "pod-1", {"metadata": {"labels": {"app": "other"}}})
        await manager.add(DemoAdapter(provider, record_lifecycle_finalizers=True))

        async def released() -> bool:
            svc = await cluster.get(kube.SERVICE, "svc")
            pod = await cluster.get(kube.POD, "pod-1")
            return (
                flz not in finalizers(pod)
                and annotation(svc, wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION) == ""
            )

        await async_wait_for(released, timeout=20, message="finalizer removed and record emptied")


async def test_a_takeover_from_go_rewrites_no_unsorted_record(cluster: Cluster, run_manager: Any) -> None:
    """The Go original writes the record annotations unsorted; read as sets, a record with the
    right members is left alone (no write: the Service's resourceVersion stays)."""
    provider = FakeProvider()
    adapter = DemoAdapter(provider, record_lifecycle_finalizers=True)
    await cluster.service("web")
    for pod in ("web-0", "web-1"):
        await cluster.pod(pod, {"app": "web"})
        await cluster.set_status(pod, ready=True)
    records = (wire.EXPECTED_FINALIZER_ADDED_ANNOTATION, wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION)
    async with run_manager(adapter):

        async def recorded() -> bool:
            svc = await cluster.get(kube.SERVICE, "web")
            return all(annotation(svc, a) == "web-0,web-1" for a in records)

        await async_wait_for(recorded, timeout=20, message="both pods recorded")
    # The Go controller ran meanwhile and wrote its records in its own order.
    taken = await cluster.patch(
        kube.SERVICE, "web", {"metadata": {"annotations": dict.fromkeys(records, "web-1,web-0")}}
    )
    async with run_manager(adapter) as manager:
        (controller,) = manager.controllers.values()

        async def passed() -> bool:
            return controller.reconciles >= 1 and len(controller.queue) == 0 and not controller._in_flight

        await async_wait_for(passed, timeout=20, message="a pass of web after the takeover")
        svc = await cluster.get(kube.SERVICE, "web")
    assert svc is not None
    assert svc["metadata"]["resourceVersion"] == taken["metadata"]["resourceVersion"]
    assert all(annotation(svc, a) == "web-1,web-0" for a in records)
