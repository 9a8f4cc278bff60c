"""Signals that tell the truth, on the SLB adapter in manage mode: a real kube-apiserver + etcd,
the real Alibaba Cloud SDK on its real HTTP path, the stateful SLB emulator with its faults.

A backend at weight 0 carries no traffic, so the pod's readiness gate stays False until the
weight rises. A provider that keeps refusing a registration or a removal shows on the pod's gate
(``ProviderRefused`` with SLB's code), and, once the failure outlasted its retries, as a Warning
Event that ``explain pod`` and ``explain employer`` read back (operation, code, message, count,
first and last time); a backend whose pod is gone is named by that pod, "pod not found".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb import (
    MODE_ANNOTATION,
    SERVER_ID_ANNOTATION,
    WEIGHT_ANNOTATION,
    SLBAdapter,
    vserver_group_name,
)
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.adapters.alibabacloudslb.slbclient import BackendServer, RetryPolicy, SLBClient
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.commands.explain import Explainer, employer_lines, pod_lines
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, async_wait_for, finalizers
from resourceconsist.wire import EventReason, GateReason

ADD = "AddVServerGroupBackendServers"
REMOVE = "RemoveVServerGroupBackendServers"
GATE = lifecycle.readiness_gate("web")
GUARD = lifecycle.guard_finalizer("web")
FLZ = lifecycle.lifecycle_finalizer("web")
#: A failure that never ends, however many passes retry it.
FOREVER = 100_000


@pytest.fixture
def slb() -> Iterator[SLBEmulator]:
    with SLBEmulator(seed=7) as emulator:
        yield emulator


@pytest.fixture
def adapter(slb: SLBEmulator) -> Iterator[SLBAdapter]:
    retry = RetryPolicy(max_attempts=3, base_delay_seconds=0.01, max_delay_seconds=0.05, max_total_seconds=5)
    client = SLBClient(slb.credentials(), retry=retry)
    yield SLBAdapter(client, cluster_name="signals")
    client.close()


async def _service(cluster: Cluster, lb: str, **annotations: str) -> None:
    annotations = {MODE_ANNOTATION: "manage", wire.READINESS_GATE_ANNOTATION: "true", **annotations}
    await cluster.service("web", labels={LOAD_BALANCER_ID_LABEL: lb}, annotations=annotations)


async def _gated_pod(cluster: Cluster, name: str, *, containers_ready: bool = True) -> None:
    """A pod carrying the Service's readiness gate (as the webhook gives it), with an IP; Ready
    False, as the kubelet keeps it while the gate is not True."""
    body = {
        "metadata": {"name": name, "labels": {"app": "web"}, "annotations": {SERVER_ID_ANNOTATION: "eni-1"}},
        "spec": {
            "containers": [{"name": "app", "image": "nginx"}],
            "readinessGates": [{"conditionType": GATE}],
        },
    }
    await cluster.call(cluster.client.create, kube.POD, cluster.namespace, body)
    await _containers(cluster, name, containers_ready)


async def _containers(cluster: Cluster, name: str, ready: bool) -> None:
    ip = cluster.ip_of(name)
    status = "True" if ready else "False"
    conditions = [{"type": "ContainersReady", "status": status}, {"type": "Ready", "status": "False"}]
    body = {"status": {"podIP": ip, "podIPs": [{"ip": ip}], "conditions": conditions}}
    await cluster.call(
        cluster.client.patch,
        kube.POD,
        cluster.namespace,
        name,
        body,
        patch_type="strategic",
        subresource="status",
    )


async def _gate(cluster: Cluster, name: str) -> dict[str, Any]:
    pod = await cluster.get(kube.POD, name)
    return dict(lifecycle.pod_condition(pod, GATE) or {}) if pod is not None else {}


def _group(slb: SLBEmulator, lb: str, namespace: str) -> str | None:
    name = vserver_group_name({"metadata": {"namespace": namespace, "name": "web"}})
    return next((g.id for g in slb.vserver_groups(lb) if g.name == name), None)


def _member(slb: SLBEmulator, group: str, ip: str) -> BackendServer | None:
    return next((b for b in slb.backends(group) if b.server_ip == ip), None)


async def _failure_events(cluster: Cluster) -> list[KubeObject]:
    listing = await cluster.call(
        cluster.client.list,
        kube.EVENT,
        cluster.namespace,
        field_selector="involvedObject.name=web,type=Warning",
    )
    return [
        e
        for e in listing.get("items", [])
        if wire.PROVIDER_FAILURE_ANNOTATION in ((e["metadata"].get("annotations")) or {})
    ]


async def test_a_backend_at_weight_0_keeps_the_gate_false_until_its_weight_rises(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, adapter: SLBAdapter
) -> None:
    lb = slb.add_load_balancer()
    await _service(cluster, lb, **{WEIGHT_ANNOTATION: "0"})
    await _gated_pod(cluster, "web-0")
    async with run_manager(adapter):
        group = await async_wait_for(lambda: _group(slb, lb, cluster.namespace), timeout=30, message="group")
        ip = cluster.ip_of("web-0")
        backend = await async_wait_for(lambda: _member(slb, group, ip), timeout=30, message="the backend")
        assert backend.weight == 0

        async def said_not_serving() -> bool:
            gate = await _gate(cluster, "web-0")
            return gate.get("status") == "False" and gate.get("reason") == GateReason.NOT_SERVING

        await async_wait_for(said_not_serving, timeout=30, message="the gate False: weight 0 serves nothing")
        # Registered at weight 0, the pod stays guarded (the provider may route to it at any time).
        pod = await cluster.get(kube.POD, "web-0")
        assert {GUARD, FLZ} & set(finalizers(pod))
        answer = await Explainer(cluster.client, [adapter]).pod(cluster.namespace, "web-0")
        print("\n".join(pod_lines(answer)))
        assert answer.not_ready[0].provider is not None and answer.not_ready[0].provider.serving is False

        await cluster.patch(kube.SERVICE, "web", {"metadata": {"annotations": {WEIGHT_ANNOTATION: "100"}}})

        async def serving() -> bool:
            gate = await _gate(cluster, "web-0")
            member = _member(slb, group, ip)
            return (
                member is not None
                and member.weight == 100
                and gate.get("status") == "True"
                and gate.get("reason") == GateReason.SERVING
            )

        await async_wait_for(serving, timeout=30, message="weight 100, then the gate True")


async def test_a_backend_slb_reports_abnormal_keeps_the_gate_false_until_its_health_check_passes(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, adapter: SLBAdapter
) -> None:
    # docs/alibabacloudslb.md, "Manage": weight above 0 *and* not reported abnormal. Health
    # changes at SLB, not in Kubernetes: the pass must come back by itself to see it pass.
    lb = slb.add_load_balancer()
    await _service(cluster, lb)
    ip = cluster.ip_of("web-0")
    pods_backend_port = 80
    slb.set_health(lb, "eni-1", pods_backend_port, "abnormal")
    await _gated_pod(cluster, "web-0")
    async with run_manager(adapter):
        group = await async_wait_for(lambda: _group(slb, lb, cluster.namespace), timeout=30, message="group")
        backend = await async_wait_for(lambda: _member(slb, group, ip), timeout=30, message="the backend")
        assert (backend.weight, backend.port) == (100, pods_backend_port)
        health_reads = len(slb.calls_of("DescribeHealthStatus"))

        async def polled_while_abnormal() -> bool:
            gate = await _gate(cluster, "web-0")
            polls = len(slb.calls_of("DescribeHealthStatus")) - health_reads
            return (
                gate.get("status") == "False" and gate.get("reason") == GateReason.NOT_SERVING and polls >= 2
            )

        await async_wait_for(polled_while_abnormal, timeout=30, message="the gate False while unhealthy")
        pod = await cluster.get(kube.POD, "web-0")
        assert GUARD in finalizers(pod) or FLZ in finalizers(pod), "registered: the pod stays guarded"

        slb.set_health(lb, "eni-1", pods_backend_port, "normal")

        async def serving() -> bool:
            gate = await _gate(cluster, "web-0")
            return gate.get("status") == "True" and gate.get("reason") == GateReason.SERVING

        await async_wait_for(serving, timeout=30, message="the gate True once SLB reports it healthy")


async def test_a_registration_the_provider_refuses_shows_on_the_gate_and_in_explain(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, adapter: SLBAdapter
) -> None:
    lb = slb.add_load_balancer()
    await _service(cluster, lb)
    await _gated_pod(cluster, "web-0", containers_ready=False)
    slb.return_5xx(ADD, times=FOREVER)
    async with run_manager(adapter):

        async def gate_is(reason: str) -> bool:
            gate = await _gate(cluster, "web-0")
            return gate.get("status") == "False" and gate.get("reason") == reason

        await async_wait_for(
            lambda: gate_is(GateReason.CONTAINERS_NOT_READY), timeout=30, message="gate: containers not ready"
        )
        explainer = Explainer(cluster.client, [adapter])
        waiting = await explainer.pod(cluster.namespace, "web-0")
        print("\n".join(pod_lines(waiting)))
        assert waiting.not_ready[0].reason == GateReason.CONTAINERS_NOT_READY

        await _containers(cluster, "web-0", True)
        await async_wait_for(
            lambda: gate_is(GateReason.PROVIDER_REFUSED), timeout=30, message="gate: refused"
        )
        gate = await _gate(cluster, "web-0")
        assert "ServiceUnavailable" in gate["message"] and ADD in gate["message"]

        # Once the refusal outlasted its retries (docs/concepts.md), a Warning Event carries it.
        events = await async_wait_for(
            lambda: _failure_events(cluster), timeout=90, interval=1.0, message="the provider-failure Warning"
        )
        assert events[0]["reason"] == EventReason.SYNC_EMPLOYEES_FAILED
        assert events[0]["message"].startswith("sync employees failed: syncUpdate failed, err: web-0: ")

        refused = await Explainer(cluster.client, [adapter]).pod(cluster.namespace, "web-0")
        print("\n".join(pod_lines(refused)))
        assert refused.ready is False and refused.containers_ready is True
        assert refused.not_ready[0].reason == GateReason.PROVIDER_REFUSED
        [failure] = refused.provider_failures
        assert (failure.operation, failure.item, failure.code) == (
            "syncUpdate",
            "web-0",
            "ServiceUnavailable",
        )
        assert failure.count >= 1 and failure.first and failure.last
        guard = next(f for f in refused.finalizers if f.role == "guard")
        assert "waits for the controller to register" in guard.pending
        employer = await Explainer(cluster.client, [adapter]).employer(kube.SERVICE, cluster.namespace, "web")
        print("\n".join(employer_lines(employer)))
        [change] = employer.employee_changes
        assert (change.action, change.effect, change.pod_exists) == ("update", "register", True)
        assert change.failure is not None and change.failure.code == "ServiceUnavailable"

        slb.clear_faults()

        async def served() -> bool:
            gate = await _gate(cluster, "web-0")
            return gate.get("status") == "True" and gate.get("reason") == GateReason.SERVING

        await async_wait_for(served, timeout=60, message="served once SLB accepts the registration")


async def test_a_removal_the_provider_refuses_shows_in_explain_and_a_gone_pod_is_named(
    cluster: Cluster, run_manager: Any, slb: SLBEmulator, adapter: SLBAdapter
) -> None:
    lb = slb.add_load_balancer()
    await _service(cluster, lb)
    await _gated_pod(cluster, "web-0")
    async with run_manager(adapter):
        group = await async_wait_for(lambda: _group(slb, lb, cluster.namespace), timeout=30, message="group")
        ip = cluster.ip_of("web-0")

        async def served() -> bool:
            member = _member(slb, group, ip)
            return (
                member is not None
                and member.weight == 100
                and FLZ in finalizers(await cluster.get(kube.POD, "web-0"))
            )

        await async_wait_for(served, timeout=30, message="web-0 served")
        # A backend of ours whose pod no longer exists (its description names it).
        orphan = BackendServer(
            server_id="eni-9",
            port=80,
            weight=0,
            server_type="eni",
            server_ip="10.250.0.9",
            description="resourceconsist/web-old",
        )
        slb.set_backends(group, [*slb.backends(group), orphan])
        slb.return_5xx(REMOVE, times=FOREVER)
        await cluster.delete(kube.POD, "web-0")

        async def drained() -> bool:
            member = _member(slb, group, ip)
            return member is not None and member.weight == 0

        await async_wait_for(drained, timeout=30, message="web-0 at weight 0, its removal refused")
        events = await async_wait_for(
            lambda: _failure_events(cluster),
            timeout=90,
            interval=1.0,
            message="the provider-failure Warnings",
        )
        assert {e["reason"] for e in events} == {EventReason.SYNC_EMPLOYEES_FAILED}

        explainer = Explainer(cluster.client, [adapter])
        pod = await explainer.pod(cluster.namespace, "web-0")
        print("\n".join(pod_lines(pod)))
        assert pod.deleting and pod.served_while_stopped == []
        assert [(f.operation, f.item, f.code) for f in pod.provider_failures] == [
            ("syncUpdate", "web-0", "ServiceUnavailable")
        ]
        held = [b for f in pod.finalizers for b in f.provider]
        assert held and all(b.serving is False for b in held)
        text = "\n".join(pod_lines(pod))
        assert "that traffic fails" not in text and "ServiceUnavailable" in text

        employer = await explainer.employer(kube.SERVICE, cluster.namespace, "web")
        lines = employer_lines(employer)
        print("\n".join(lines))
        assert employer.converged is False
        by_pod = {c.pod: c for c in employer.employee_changes}
        assert (by_pod["web-0"].action, by_pod["web-0"].effect) == ("update", "deregister")
        assert by_pod["web-0"].failure is not None and by_pod["web-0"].failure.message
        assert (by_pod["web-old"].action, by_pod["web-old"].pod_exists) == ("delete", False)
        assert any("web-old (pod not found" in line for line in lines)
        assert any(f.item == "web-0" and f.code == "ServiceUnavailable" for f in employer.failures)

        slb.clear_faults()

        async def gone() -> bool:
            return await cluster.get(kube.POD, "web-0") is None and not slb.backends(group)

        await async_wait_for(gone, timeout=60, message="the backends removed and the pod gone")
