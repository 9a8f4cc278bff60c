"""The garbage pass (docs/lifecycle-hooks.md, "Orphans") on a real kube-apiserver + etcd: a
Service deleted with its finalizer stripped while the controller was down leaves its VServer
group in the SLB emulator; the next start reports it in dry-run and collects it otherwise,
releasing the pods only once the group is gone. A re-created Service of the same name keeps its
group; an owner whose pass is queued or running, or that a live GET finds, is left alone; the
demo adapter's items are collected the same way (the tutorial's: tests/api/test_tutorial.py).

Gone employers found from their pods' marks (docs/lifecycle-hooks.md, "Gone employers"): a
Service force-deleted while the manager is down has, at the next start, its provider side
collected and its pods released (deleting one completes) for the demo and tutorial adapters,
even when the provider side went first; an adapter that cannot list, or whose listing fails,
releases nothing and tells the operator (Warning Events on pod and Namespace with the kubectl
command, the gauge, ``explain pod``); a re-created Service of the same name keeps its resources.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb import (
    LOAD_BALANCER_ID_LABEL,
    MODE_ANNOTATION,
    SERVER_ID_ANNOTATION,
    SLBAdapter,
)
from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.adapters.alibabacloudslb.slbclient import RetryPolicy, SLBClient, VServerGroup
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheNotSynced, InformerFactory
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.commands.explain import Explainer, pod_lines
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider, VipStatus
from resourceconsist.hooks.orphans import (
    CANNOT_LIST,
    COLLECTED_REASON,
    HELD_BY_GONE_REASON,
    LOOKUP_REFUSED_REASON,
    NAME_UNKNOWN,
    NOT_COMPLETE,
    GarbageReport,
)
from resourceconsist.options import GarbageOptions
from resourceconsist.rules import lifecycle, marks
from resourceconsist.runtime.controller import Controller
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, async_wait_for, condition, finalizers
from resourceconsist.testing.controlplane import free_port

GROUP = "resourceconsist/{ns}/web"
FLZ = lifecycle.lifecycle_finalizer("web")
GUARD = lifecycle.guard_finalizer("web")
START_ONLY = GarbageOptions(interval=None)
OFF = GarbageOptions(enabled=False)


@pytest.fixture
def slb() -> Iterator[SLBEmulator]:
    with SLBEmulator(access_key_id="LTAI5tOrphanKey", access_key_secret="orphan-secret", seed=5) as emulator:
        yield emulator


@pytest.fixture
def slb_client(slb: SLBEmulator) -> Iterator[SLBClient]:
    retry = RetryPolicy(max_attempts=8, base_delay_seconds=0.01, max_delay_seconds=0.05, max_total_seconds=10)
    client = SLBClient(slb.credentials(), retry=retry)
    yield client
    client.close()


def _controller(manager: Manager) -> Controller:
    (controller,) = manager.controllers.values()
    return controller


async def _report(controller: Controller) -> GarbageReport:
    async def ready() -> GarbageReport | None:
        return controller.garbage.last_report

    return await async_wait_for(ready, timeout=30, message="the start-up garbage pass")


def _collected_report(manager: Manager, key: str) -> GarbageReport | None:
    """The garbage pass's latest report once it says ``key`` was collected (a group waits for
    its backends to be drained first: a later pass collects it)."""
    report = _controller(manager).garbage.last_report
    return report if report is not None and report.collected == [key] else None


def _collected(manager: Manager, controller: str) -> float:
    value = manager.metrics.registry.get_sample_value(
        "resourceconsist_orphans_collected_total", {"controller": controller}
    )
    return value or 0.0


def _group(slb: SLBEmulator, lb: str, name: str) -> VServerGroup | None:
    return next((g for g in slb.vserver_groups(lb) if g.name == name), None)


async def _served_web(
    cluster: Cluster, run_manager: Callable[..., Any], slb: SLBEmulator, adapter: SLBAdapter, lb: str
) -> VServerGroup:
    """Service web (manage mode) with ready pod web-0, served by its group; the manager stopped."""
    await cluster.service("web", labels={LOAD_BALANCER_ID_LABEL: lb}, annotations={MODE_ANNOTATION: "manage"})
    await cluster.pod(
        "web-0", {"app": "web"}, readiness_gate=True, annotations={SERVER_ID_ANNOTATION: "eni-a"}
    )
    await cluster.set_status("web-0", ready=True, service_ready=True)
    name = GROUP.format(ns=cluster.namespace)
    async with run_manager(adapter, garbage=GarbageOptions(enabled=False)):

        async def served() -> bool:
            group = _group(slb, lb, name)
            pod = await cluster.get(kube.POD, "web-0")
            return group is not None and bool(slb.backends(group.id)) and FLZ in finalizers(pod)

        await async_wait_for(served, timeout=30, message="web-0 served by the group")
    group = _group(slb, lb, name)
    assert group is not None
    return group


async def _delete_stripped(cluster: Cluster) -> None:
    """Delete Service web as someone would with the controller down: finalizers stripped."""
    await cluster.patch(kube.SERVICE, "web", {"metadata": {"finalizers": None}})
    await cluster.delete(kube.SERVICE, "web")

    async def gone() -> bool:
        return await cluster.get(kube.SERVICE, "web") is None

    await async_wait_for(gone, timeout=30, message="Service web gone")


async def test_a_group_left_by_a_service_deleted_while_down_is_reported_then_collected(
    cluster: Cluster, run_manager: Callable[..., Any], slb: SLBEmulator, slb_client: SLBClient
) -> None:
    lb = slb.add_load_balancer()
    adapter = SLBAdapter(slb_client, cluster_name="orphans", load_balancers=[lb])
    group = await _served_web(cluster, run_manager, slb, adapter, lb)
    await _delete_stripped(cluster)
    key = f"{cluster.namespace}/web"
    assert _group(slb, lb, group.name) is not None, "the group outlives its Service"

    async with run_manager(adapter, garbage=GarbageOptions(interval=None, dry_run=True)) as manager:
        report = await _report(_controller(manager))
        assert report.dry_run
        assert list(report.orphans) == [key]
        assert group.id in report.orphans[key][0]
        assert report.collected == []
        assert _collected(manager, adapter.name) == 0
    assert _group(slb, lb, group.name) is not None, "a dry run deletes nothing"
    assert slb.backends(group.id), "a dry run deletes nothing"
    pod = await cluster.get(kube.POD, "web-0")
    assert FLZ in finalizers(pod)
    assert lifecycle.expected_finalizer_key(
        "Service", cluster.namespace, "web"
    ) in lifecycle.expected_finalizers(pod)

    async with run_manager(adapter, garbage=START_ONLY) as manager:
        # The first garbage pass drains the group's backend (weight 0), so the group waits:
        # pending, tried again after the retry interval, collected once the backend is removed.
        first = await _report(_controller(manager))
        assert first.pending == [key] and first.collected == []
        assert _group(slb, lb, group.name) is not None

        await async_wait_for(
            lambda: _collected_report(manager, key), timeout=30, message="the group collected by a later pass"
        )
        assert _group(slb, lb, group.name) is None
        assert _collected(manager, adapter.name) == 1
        changes = [c for c in slb.backend_changes() if c.vserver_group_id == group.id]
        assert [(c.change, c.backend.weight) for c in changes[-2:]] == [("weight", 0), ("removed", 0)]

        async def released() -> bool:
            held = finalizers(await cluster.get(kube.POD, "web-0"))
            return FLZ not in held and GUARD not in held

        # The same pass released the pod after the provider confirmed the group gone (the guard).
        await async_wait_for(released, timeout=30, message="web-0 released once its backend is gone")
        entries = lifecycle.expected_finalizers(await cluster.get(kube.POD, "web-0"))
        assert lifecycle.expected_finalizer_key("Service", cluster.namespace, "web") not in entries
        events = await cluster.events(cluster.namespace)
        assert any(reason == COLLECTED_REASON and group.id in message for _, reason, message in events)


async def test_a_recreated_service_of_the_same_name_keeps_its_group(
    cluster: Cluster, run_manager: Callable[..., Any], slb: SLBEmulator, slb_client: SLBClient
) -> None:
    lb = slb.add_load_balancer()
    adapter = SLBAdapter(slb_client, cluster_name="orphans", load_balancers=[lb])
    group = await _served_web(cluster, run_manager, slb, adapter, lb)
    await _delete_stripped(cluster)
    await cluster.service("web", labels={LOAD_BALANCER_ID_LABEL: lb}, annotations={MODE_ANNOTATION: "manage"})
    async with run_manager(adapter, garbage=START_ONLY) as manager:
        report = await _report(_controller(manager))
        assert report.orphans == {} and report.collected == []

        async def clean_finalizer() -> bool:
            return wire.CLEAN_FINALIZER in finalizers(await cluster.get(kube.SERVICE, "web"))

        await async_wait_for(clean_finalizer, timeout=30, message="the new Service adopted")
    kept = _group(slb, lb, group.name)
    assert kept is not None and kept.id == group.id
    assert slb.backends(group.id), "web-0 still served by the kept group"
    assert FLZ in finalizers(await cluster.get(kube.POD, "web-0"))


async def test_an_owner_with_a_pass_queued_or_running_is_left_alone(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider = FakeProvider()
    key = f"{cluster.namespace}/ghost"
    provider.vips[key] = VipStatus(vip="demo-remote-VIP", qps=100)
    async with run_manager(DemoAdapter(provider), garbage=GarbageOptions(enabled=False)) as manager:
        controller = _controller(manager)
        # What a worker holds while it runs the key's pass (the workqueue's own bookkeeping).
        assert controller.queue.claim(key)
        try:
            report = await controller.garbage.run_once()
            assert report.skipped == {key: "a pass is queued or running"}
            assert key in provider.vips
        finally:
            controller.queue.done(key)
        report = await controller.garbage.run_once()
        assert report.collected == [key]
        assert key not in provider.vips


class RecreatingProvider(FakeProvider):
    """A provider whose listing is slow enough for someone to re-create the employer meanwhile."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        super().__init__()
        self.client, self.namespace = client, namespace

    def employers(self) -> list[str]:
        found = super().employers()
        # Between the listing and the collector's checks, Service ghost comes back.
        body = {
            "metadata": {"name": "ghost"},
            "spec": {"selector": {"app": "ghost"}, "ports": [{"port": 80}]},
        }
        self.client.create(kube.SERVICE, self.namespace, body)
        return found


async def test_an_owner_recreated_during_the_pass_is_not_collected(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider = RecreatingProvider(cluster.client, cluster.namespace)
    key = f"{cluster.namespace}/ghost"
    provider.vips[key] = VipStatus(vip="demo-remote-VIP", qps=100)
    async with run_manager(DemoAdapter(provider), garbage=GarbageOptions(enabled=False)) as manager:
        report = await _controller(manager).garbage.run_once()
    assert report.collected == [] and report.orphans == {}
    assert key not in report.failed
    assert key in provider.vips


async def test_the_demo_adapter_s_orphans_are_collected_at_start(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider = FakeProvider()
    gone = f"{cluster.namespace}/gone"
    provider.put_vip("create_vip", gone, VipStatus(vip="demo-remote-VIP", qps=100))
    await cluster.service("alive")
    async with run_manager(DemoAdapter(provider), garbage=START_ONLY) as manager:

        async def alive_served() -> bool:
            return f"{cluster.namespace}/alive" in provider.vips

        await async_wait_for(alive_served, timeout=30, message="the live Service's VIP")
        report = await _report(_controller(manager))
        assert report.collected == [gone]
    assert gone not in provider.vips
    assert f"{cluster.namespace}/alive" in provider.vips, "a live employer's items are never collected"


async def test_a_dry_run_never_calls_a_mutating_provider_api(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider = FakeProvider()
    provider.put_vip("create_vip", f"{cluster.namespace}/gone", VipStatus(vip="v", qps=1))
    before = provider.mutating_calls()
    async with run_manager(
        DemoAdapter(provider), garbage=GarbageOptions(interval=None, dry_run=True)
    ) as manager:
        report = await _report(_controller(manager))
    assert list(report.orphans) == [f"{cluster.namespace}/gone"]
    assert provider.mutating_calls() == before


# -- employers gone while their marks remain (docs/lifecycle-hooks.md, "Gone employers") ------------


def _held_gauge(manager: Manager, controller: str) -> float | None:
    return manager.metrics.registry.get_sample_value(
        "resourceconsist_pods_held_by_gone_employers", {"controller": controller}
    )


async def _web_deleted_while_down(cluster: Cluster, run_manager: Callable[..., Any], adapter: Any) -> None:
    """Service web with ready pod web-0, served and holding web's lifecycle finalizer; then,
    with the manager stopped, web deleted as an operator would: finalizers stripped."""
    await cluster.service("web")
    await cluster.pod("web-0", {"app": "web"})
    await cluster.set_status("web-0", ready=True)
    async with run_manager(adapter, garbage=OFF):

        async def served() -> bool:
            return FLZ in finalizers(await cluster.get(kube.POD, "web-0"))

        await async_wait_for(served, timeout=30, message="web-0 served")
    await _delete_stripped(cluster)


async def _demo_web_deleted_while_down(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> tuple[FakeProvider, DemoAdapter, str]:
    """``_web_deleted_while_down`` with the demo adapter: its provider, the adapter, web's key."""
    provider = FakeProvider()
    adapter = DemoAdapter(provider)
    await _web_deleted_while_down(cluster, run_manager, adapter)
    return provider, adapter, f"{cluster.namespace}/web"


def _provider_side_gone(provider: FakeProvider, key: str) -> None:
    """The provider side went too (by hand, or the provider's own clean-up): only marks remain."""
    provider.vips.pop(key)
    provider.real_servers.pop(key)


async def _deleting_web_0(cluster: Cluster) -> None:
    """Delete pod web-0: it stays, deleting, while web's finalizer holds it."""
    await cluster.delete(kube.POD, "web-0")
    pod = await cluster.get(kube.POD, "web-0")
    assert pod is not None and lifecycle.is_deleting(pod) and FLZ in finalizers(pod)


async def _web_0_gone(cluster: Cluster) -> None:
    async def gone() -> bool:
        return await cluster.get(kube.POD, "web-0") is None

    await async_wait_for(gone, timeout=30, message="web-0's deletion completes")


async def test_a_demo_service_force_deleted_while_down_is_collected_and_its_pod_released(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider, adapter, key = await _demo_web_deleted_while_down(cluster, run_manager)
    await _deleting_web_0(cluster)
    assert key in provider.vips and provider.query_rs(key), "the provider side outlives the Service"
    async with run_manager(adapter, garbage=START_ONLY) as manager:
        report = await _report(_controller(manager))
        assert report.collected == [key]
        assert report.held == {key: ["web-0"]} and report.uncollectable == {}
        await _web_0_gone(cluster)
        assert _held_gauge(manager, adapter.name) == 0
    assert key not in provider.vips and not provider.query_rs(key)


async def test_a_gone_demo_service_the_provider_holds_nothing_for_has_its_pod_released(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider, adapter, key = await _demo_web_deleted_while_down(cluster, run_manager)
    _provider_side_gone(provider, key)
    await _deleting_web_0(cluster)
    async with run_manager(adapter, garbage=START_ONLY) as manager:
        report = await _report(_controller(manager))
        assert report.orphans == {} and report.collected == [key]
        await _web_0_gone(cluster)
        events = await cluster.events(cluster.namespace)
        assert any(r == COLLECTED_REASON and "released pods web-0" in m for _, r, m in events)


async def test_the_tutorial_adapter_finds_its_own_after_a_force_delete(
    cluster: Cluster, run_manager: Callable[..., Any], tmp_path: Path, tutorial: dict[str, Any]
) -> None:
    backends = tutorial["BackendsDir"](tmp_path)
    adapter = tutorial["CollectingFileAdapter"](backends)
    await _web_deleted_while_down(cluster, run_manager, adapter)
    await _deleting_web_0(cluster)
    assert backends.read(cluster.namespace, "web") is not None
    async with run_manager(adapter, garbage=START_ONLY) as manager:
        report = await _report(_controller(manager))
        assert report.collected == [f"{cluster.namespace}/web"]
        await _web_0_gone(cluster)
    assert backends.read(cluster.namespace, "web") is None


async def test_an_adapter_that_cannot_list_releases_nothing_and_tells_the_operator(
    cluster: Cluster, run_manager: Callable[..., Any], tmp_path: Path, tutorial: dict[str, Any]
) -> None:
    backends = tutorial["BackendsDir"](tmp_path)
    adapter = tutorial["FileAdapter"](backends)  # no list_owned
    name = adapter.get_controller_name()
    key = f"{cluster.namespace}/web"
    await _web_deleted_while_down(cluster, run_manager, adapter)
    async with run_manager(adapter, garbage=START_ONLY) as manager:
        controller = _controller(manager)
        report = await _report(controller)
        assert report.held == {key: ["web-0"]}
        assert report.uncollectable == {key: CANNOT_LIST}
        assert report.collected == []
        assert _held_gauge(manager, name) == 1
        # Unknown never releases: the file still routes to web-0, and web-0 keeps its finalizer.
        assert backends.read(cluster.namespace, "web")["pods"]["web-0"]["weight"] == 100
        pod = await cluster.get(kube.POD, "web-0")
        assert FLZ in finalizers(pod)
        pod_events = [m for t, r, m in await cluster.events("web-0") if r == HELD_BY_GONE_REASON]
        assert len(pod_events) == 1 and f"Service {key}" in pod_events[0]
        assert CANNOT_LIST in pod_events[0] and "kubectl patch pod web-0" in pod_events[0]
        ns_events = [
            (t, m) for t, r, m in await cluster.events(cluster.namespace) if r == HELD_BY_GONE_REASON
        ]
        assert ns_events == [("Warning", ns_events[0][1])] and "web-0" in ns_events[0][1]
        # A second pass tells nobody again (once per pod and employer per controller lifetime).
        again = await controller.garbage.run_once()
        assert again.uncollectable == {key: CANNOT_LIST}
        assert len([r for _, r, _ in await cluster.events("web-0") if r == HELD_BY_GONE_REASON]) == 1

    # explain pod says which employer is gone, that it cannot be collected, and what to do.
    answer = await Explainer(cluster.client, [adapter]).pod(cluster.namespace, "web-0")
    (gone,) = answer.gone
    assert (gone.employer, gone.collectable, gone.why) == (f"Service/{key}", "no", CANNOT_LIST)
    assert gone.release_command in gone.action and FLZ in gone.finalizers
    text = "\n".join(pod_lines(answer))
    assert f"held by gone Service/{key}: the controller CANNOT collect it" in text
    assert "provider not consulted" not in text
    unknown = (await Explainer(cluster.client).pod(cluster.namespace, "web-0")).gone
    assert [g.collectable for g in unknown] == ["unknown"]

    # The operator checked the provider and runs the command the Event gave: web-0 is released.
    backends.remove(cluster.namespace, "web")
    ops = json.loads(shlex.split(gone.release_command)[-1])
    await cluster.call(cluster.client.patch, kube.POD, cluster.namespace, "web-0", ops, patch_type="json")
    pod = await cluster.get(kube.POD, "web-0")
    assert FLZ not in finalizers(pod) and GUARD not in finalizers(pod)
    assert lifecycle.expected_finalizer_key("Service", cluster.namespace, "web") not in (
        lifecycle.expected_finalizers(pod)
    )
    await cluster.delete(kube.POD, "web-0")
    await _web_0_gone(cluster)


async def test_a_failing_listing_releases_nothing(cluster: Cluster, run_manager: Callable[..., Any]) -> None:
    provider, adapter, key = await _demo_web_deleted_while_down(cluster, run_manager)
    _provider_side_gone(provider, key)  # nothing held: yet a failed listing cannot know that
    provider.fail_next("list_employers", times=1, message="403 Forbidden")
    async with run_manager(adapter, garbage=OFF) as manager:
        report = await _controller(manager).garbage.run_once()
        assert report.list_error is not None and "403 Forbidden" in report.list_error
        assert list(report.uncollectable) == [key] and report.collected == []
        assert FLZ in finalizers(await cluster.get(kube.POD, "web-0"))
        assert _held_gauge(manager, adapter.name) == 1
        # Once the listing answers, the pass releases the pod.
        report = await _controller(manager).garbage.run_once()
        assert report.collected == [key]
        assert _held_gauge(manager, adapter.name) == 0
    assert FLZ not in finalizers(await cluster.get(kube.POD, "web-0"))


async def test_a_recreated_service_of_the_same_name_keeps_its_resources(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider, adapter, key = await _demo_web_deleted_while_down(cluster, run_manager)
    await cluster.service("web")
    async with run_manager(adapter, garbage=START_ONLY) as manager:
        report = await _report(_controller(manager))
        assert report.held == {} and report.collected == [] and report.uncollectable == {}

        async def adopted() -> bool:
            return wire.CLEAN_FINALIZER in finalizers(await cluster.get(kube.SERVICE, "web"))

        await async_wait_for(adopted, timeout=30, message="the new Service adopted")
    assert key in provider.vips and "web-0" in provider.query_rs(key)
    assert FLZ in finalizers(await cluster.get(kube.POD, "web-0"))


async def test_a_gone_employer_no_listed_item_ties_to_one_of_two_controllers_keeps_its_pods(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider, adapter, key = await _demo_web_deleted_while_down(cluster, run_manager)
    _provider_side_gone(provider, key)
    # Another controller of the manager employs Services too: web may have been its employer,
    # and its provider may still route to web-0.
    other = DemoAdapter(FakeProvider(), name="other-controller")
    async with run_manager(adapter, other, garbage=START_ONLY) as manager:
        for controller in manager.controllers.values():
            report = await _report(controller)
            assert report.collected == [] and list(report.uncollectable) == [key]
            assert "of this manager employ Service too" in report.uncollectable[key]
    assert FLZ in finalizers(await cluster.get(kube.POD, "web-0"))


async def test_a_bare_finalizer_is_tied_to_its_gone_employer_by_the_employer_s_events(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider, adapter, key = await _demo_web_deleted_while_down(cluster, run_manager)
    # Only the finalizer is left on web-0: its hash is all that names web.
    await cluster.patch(
        kube.POD, "web-0", {"metadata": {"annotations": {wire.AVAILABLE_CONDITIONS_ANNOTATION: None}}}
    )
    assert any(r == "EnsureEmployerCleanFinalizerSucceed" for _, r, _ in await cluster.events("web"))
    answer = await Explainer(cluster.client, [adapter]).pod(cluster.namespace, "web-0")
    assert [(g.employer, g.collectable) for g in answer.gone] == [(f"Service/{key}", "yes")]
    async with run_manager(adapter, garbage=START_ONLY) as manager:
        report = await _report(_controller(manager))
        assert report.held == {key: ["web-0"]} and report.collected == [key]
    assert FLZ not in finalizers(await cluster.get(kube.POD, "web-0"))
    assert key not in provider.vips


async def test_a_finalizer_of_an_unknown_gone_employer_is_reported_never_released(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    stray = lifecycle.lifecycle_finalizer("nobody-knows")
    await cluster.pod("web-0", {"app": "web"})
    await cluster.patch(kube.POD, "web-0", {"metadata": {"finalizers": [stray]}})
    key = f"{cluster.namespace}/#{marks.name_digest('nobody-knows')}"
    adapter = DemoAdapter(FakeProvider())
    try:
        async with run_manager(adapter, garbage=START_ONLY) as manager:
            report = await _report(_controller(manager))
            assert report.held == {key: ["web-0"]} and report.uncollectable == {key: NAME_UNKNOWN}
            assert _held_gauge(manager, adapter.name) == 1
            (message,) = [m for _, r, m in await cluster.events("web-0") if r == HELD_BY_GONE_REASON]
            assert "an unknown Service" in message and "kubectl patch pod web-0" in message
        assert finalizers(await cluster.get(kube.POD, "web-0")) == [stray]
        answer = await Explainer(cluster.client, [adapter]).pod(cluster.namespace, "web-0")
        assert [(g.collectable, g.why) for g in answer.gone] == [("no", NAME_UNKNOWN)]
    finally:
        await cluster.patch(kube.POD, "web-0", {"metadata": {"finalizers": None}})


class PartialListingDemoAdapter(DemoAdapter):
    """A demo adapter whose list, as far as the frame knows, may miss what the provider holds
    (the SLB adapter's, when a load balancer is named by no live Service and not configured)."""

    def lists_everything_owned(self) -> bool:
        return False


async def test_a_partial_listing_that_names_nothing_of_a_gone_employer_releases_nothing(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider = FakeProvider()
    adapter = PartialListingDemoAdapter(provider)
    key = f"{cluster.namespace}/web"
    await _web_deleted_while_down(cluster, run_manager, adapter)
    # What the partial list misses: the provider still routes to web-0, under another name.
    provider.real_servers["elsewhere/web"] = provider.real_servers.pop(key)
    provider.vips.pop(key)
    async with run_manager(adapter, garbage=START_ONLY) as manager:
        report = await _report(_controller(manager))
        assert report.collected == [] and report.uncollectable == {key: NOT_COMPLETE}
        assert _held_gauge(manager, adapter.name) == 1
    assert FLZ in finalizers(await cluster.get(kube.POD, "web-0"))
    answer = await Explainer(cluster.client, [adapter]).pod(cluster.namespace, "web-0")
    assert [(g.collectable, g.why) for g in answer.gone] == [("no", NOT_COMPLETE)]


async def test_the_issue_s_slb_service_force_deleted_is_never_released_while_its_group_routes(
    cluster: Cluster, run_manager: Callable[..., Any], slb: SLBEmulator, slb_client: SLBClient
) -> None:
    """A manage-mode Service whose load balancer no other Service names (nor the adapter's
    configuration), force-deleted while the manager was down: the adapter's account-wide search
    finds its group by the cluster tag (docs/alibabacloudslb.md, "Tags and the garbage search"),
    the pass collects it, and only then is web-0 released. Never released while it routes."""
    lb = slb.add_load_balancer()
    adapter = SLBAdapter(slb_client, cluster_name="orphans")
    key = f"{cluster.namespace}/web"
    group = await _served_web(cluster, run_manager, slb, adapter, lb)
    await _delete_stripped(cluster)
    async with run_manager(adapter, garbage=START_ONLY) as manager:
        first = await _report(_controller(manager))
        assert first.held == {key: ["web-0"]}
        # Its backend drained first: the group waits for a later garbage pass.
        assert first.pending == [key] and first.uncollectable == {}

        report = await async_wait_for(
            lambda: _collected_report(manager, key), timeout=30, message="the group collected"
        )
        assert report.uncollectable == {}
        assert _held_gauge(manager, adapter.name) == 0
    held = finalizers(await cluster.get(kube.POD, "web-0"))
    assert _group(slb, lb, group.name) is None, "the group is collected"
    assert FLZ not in held and GUARD not in held, "web-0 is released once its group is gone"


async def test_a_gone_employer_that_cannot_be_collected_keeps_no_pod_un_ready(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider = FakeProvider()
    adapter = PartialListingDemoAdapter(provider)
    key = f"{cluster.namespace}/web"
    await _web_deleted_while_down(cluster, run_manager, adapter)
    _provider_side_gone(provider, key)  # nothing listed: the partial list cannot vouch for web
    # web-1 was created while web still existed: the webhook gave it web's gate and entry.
    gate = lifecycle.readiness_gate("web")
    entries = {lifecycle.expected_finalizer_key("Service", cluster.namespace, "web"): FLZ}
    annotations = {wire.AVAILABLE_CONDITIONS_ANNOTATION: lifecycle.render_available_conditions(entries)}
    await cluster.pod("web-1", {"app": "web"}, gated_by=["web"], annotations=annotations)
    async with run_manager(adapter, garbage=START_ONLY) as manager:
        report = await _report(_controller(manager))
        assert report.held == {key: ["web-0", "web-1"]} and report.uncollectable == {key: NOT_COMPLETE}

        async def gate_open() -> bool:
            return condition(await cluster.get(kube.POD, "web-1"), gate) == "True"

        await async_wait_for(gate_open, timeout=30, message="web-1's gate of gone web opened")
    assert FLZ in finalizers(await cluster.get(kube.POD, "web-0")), "the finalizers stay"


async def test_a_release_command_too_long_for_an_event_is_left_to_explain(
    cluster: Cluster, run_manager: Callable[..., Any], tmp_path: Path, tutorial: dict[str, Any]
) -> None:
    adapter = tutorial["FileAdapter"](tutorial["BackendsDir"](tmp_path))
    await _web_deleted_while_down(cluster, run_manager, adapter)
    # web-0 also belongs to 30 employers of another kind: its annotation is long.
    entries = lifecycle.expected_finalizers(await cluster.get(kube.POD, "web-0"))
    entries |= {
        f"Gateway/{cluster.namespace}/gw-{i}": lifecycle.lifecycle_finalizer(f"gw-{i}") for i in range(30)
    }
    value = lifecycle.render_available_conditions(entries)
    await cluster.patch(
        kube.POD, "web-0", {"metadata": {"annotations": {wire.AVAILABLE_CONDITIONS_ANNOTATION: value}}}
    )
    async with run_manager(adapter, garbage=START_ONLY) as manager:
        await _report(_controller(manager))
        (message,) = [m for _, r, m in await cluster.events("web-0") if r == HELD_BY_GONE_REASON]
    assert f"resourceconsist explain pod {cluster.namespace}/web-0" in message and len(message) <= 1024
    (gone,) = (await Explainer(cluster.client, [adapter]).pod(cluster.namespace, "web-0")).gone
    ops = json.loads(shlex.split(gone.release_command)[-1])
    await cluster.call(cluster.client.patch, kube.POD, cluster.namespace, "web-0", ops, patch_type="json")
    pod = await cluster.get(kube.POD, "web-0")
    assert FLZ not in finalizers(pod)
    assert set(lifecycle.expected_finalizers(pod)) == {k for k in entries if k.startswith("Gateway/")}


async def test_a_garbage_pass_before_the_caches_sync_says_so_and_collects_nothing() -> None:
    # An empty cache would make every owner look gone: the pass refuses, with the cache's error.
    configuration = k8s.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"  # an API server that is not there
    client = KubeClient(k8s.ApiClient(configuration))
    provider = FakeProvider()
    provider.put_vip("create_vip", "default/gone", VipStatus(vip="10.0.0.1", qps=1))
    informers = InformerFactory(client)
    try:
        controller = Controller(DemoAdapter(provider), client, informers)
        controller.warm_caches()  # its informers exist, and cannot list
        with pytest.raises(CacheNotSynced, match="caches not synced; no garbage pass"):
            await controller.garbage.run_once()
        assert provider.vips and provider.mutating_calls() == 1  # only the test's own create
    finally:
        await asyncio.to_thread(informers.stop)
        client.close()


#: What a manager of the demo adapter needs in a namespace it watches (docs/security.md).
MANAGER_RULES = [
    {"apiGroups": [""], "resources": ["services", "pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "list"]},
]
#: The same, but a Service may not be looked up by name (a narrowed or half-applied Role).
NO_SERVICE_GET = [
    {"apiGroups": [""], "resources": ["services"], "verbs": ["list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    *MANAGER_RULES[1:],
]


class _DemoWithClusterScopedSubResources(DemoAdapter):
    """The demo adapter, declaring a cluster-scoped sub-resource kind (none made): the garbage
    pass's stray collector lists ClusterRoles of it."""

    def sub_resources(self, ctx: Any, employer: Any) -> list[Any]:
        return []

    def sub_resource_kinds(self) -> list[tuple[str, str]]:
        return [("rbac.authorization.k8s.io/v1", "ClusterRole")]


async def test_a_refused_lookup_makes_that_employer_unknown_and_the_others_go_on(
    cluster: Cluster,
    kube_client: KubeClient,
    run_manager: Callable[..., Any],
    service_account: Callable[[dict[str, list[dict[str, Any]]]], KubeClient],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two namespaces watched by one manager, as a ServiceAccount that may not `get` Services in
    the second: each has a Service force-deleted while the manager was down. The first's is
    collected and its pod released; the second's live lookup answers 403, so that employer is
    unknown, never gone: its pod and its provider side stay, the operator is told what
    permission is missing, and the pass goes on (docs/security.md, "A namespaced install").
    Its stray collector may not list ClusterRoles either: that kind is skipped, said so."""
    other = Cluster(kube_client, f"t-{uuid.uuid4().hex[:10]}")
    await other.call(kube_client.create, kube.NAMESPACE, None, {"metadata": {"name": other.namespace}})
    provider = FakeProvider()
    adapter = _DemoWithClusterScopedSubResources(provider)
    watched = (cluster.namespace, other.namespace)

    for where in (cluster, other):
        await where.service("web")
        await where.pod("web-0", {"app": "web"})
        await where.set_status("web-0", ready=True)
    async with run_manager(adapter, namespaces=watched, garbage=OFF):

        async def served() -> bool:
            pods = [await where.get(kube.POD, "web-0") for where in (cluster, other)]
            return all(FLZ in finalizers(pod) for pod in pods)

        await async_wait_for(served, timeout=30, message="web-0 served in both namespaces")
    for where in (cluster, other):
        await _delete_stripped(where)
        await _deleting_web_0(where)
    gone, unknown = f"{cluster.namespace}/web", f"{other.namespace}/web"
    assert {gone, unknown} <= set(provider.vips)

    client = service_account({cluster.namespace: MANAGER_RULES, other.namespace: NO_SERVICE_GET})
    with caplog.at_level(logging.WARNING, logger="resourceconsist.hooks.orphans"):
        async with run_manager(adapter, client=client, namespaces=watched, garbage=START_ONLY) as manager:
            report = await _report(_controller(manager))
            assert report.collected == [gone]
            assert list(report.unknown) == [unknown]
            assert 'cannot get resource "services"' in report.unknown[unknown]
            assert unknown not in report.held and unknown not in report.failed
            await _web_0_gone(cluster)
    # Unknown, never gone: the pod may not leave, and the provider side stays.
    assert FLZ in finalizers(await other.get(kube.POD, "web-0"))
    assert unknown in provider.vips and provider.query_rs(unknown)
    assert gone not in provider.vips
    (message,) = [m for _, r, m in await other.events(other.namespace) if r == LOOKUP_REFUSED_REASON]
    assert f"Service {unknown} is not in its cache and looking it up was refused (403)" in message
    assert 'cannot get resource "services"' in message
    (line,) = [r.getMessage() for r in caplog.records if "looking it up was refused" in r.getMessage()]
    assert unknown in line and "unknown, never gone" in line
    (strays,) = [r.getMessage() for r in caplog.records if "listing ClusterRole refused" in r.getMessage()]
    assert 'cannot list resource "clusterroles"' in strays
    assert not [r for r in caplog.records if r.exc_info], "no traceback: the pass did not fail"
