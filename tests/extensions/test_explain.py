"""``resourceconsist explain`` answers from the cluster's and the provider's true state
(docs/explain.md): a pod held by a finalizer while the provider still routes to it, an employer
that has not converged because the provider refuses a call, and (on the working local cluster)
a pod whose readiness gate waits on the provider.

Each test sets up the state, reads the truth straight from the API server and the fake provider,
and compares explain's JSON fields with it, never with strings explain printed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.commands.explain import Explainer, ExplainError, split_ref
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.options import ManagerOptions
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import (
    Cluster,
    LocalCluster,
    LocalControlPlane,
    async_wait_for,
    condition,
    finalizers,
    run_cli,
)

SERVICE = "web"


async def _serving(cluster: Cluster, provider: FakeProvider, pods: tuple[str, ...]) -> None:
    """Wait until the provider serves ``pods`` and each carries the lifecycle finalizer."""
    key = f"{cluster.namespace}/{SERVICE}"
    held = lifecycle.lifecycle_finalizer(SERVICE)

    async def done() -> bool:
        servers = provider.snapshot().get(key, {})
        if set(servers) != set(pods) or not all(rs.traffic_on for rs in servers.values()):
            return False
        found = [await cluster.get(kube.POD, p) for p in pods]
        return all(held in finalizers(pod) for pod in found)

    await async_wait_for(done, timeout=30, message=f"provider serves {pods}")


async def _setup(cluster: Cluster, provider: FakeProvider, pods: tuple[str, ...]) -> None:
    await cluster.service(SERVICE)
    for name in pods:
        await cluster.pod(name, {"app": SERVICE})
        await cluster.set_status(name, ready=True)
    await _serving(cluster, provider, pods)


async def test_a_pod_held_by_the_lifecycle_finalizer_names_its_employer_and_the_backend_still_held(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider = FakeProvider()
    async with run_manager(DemoAdapter(provider)):
        await _setup(cluster, provider, ("web-0", "web-1"))
        # The provider refuses to let web-1 go: it stays registered, so its finalizer stays.
        provider.fail_next("delete_rs", times=1000)
        await cluster.delete(kube.POD, "web-1")

        async def deleting() -> bool:
            return lifecycle.is_deleting(await cluster.get(kube.POD, "web-1") or {})

        await async_wait_for(deleting, timeout=10)
        await cluster.set_condition("web-1", "ContainersReady", False)  # its containers stopped
        answer = await Explainer(cluster.client, [DemoAdapter(provider)]).pod(cluster.namespace, "web-1")

    truth = await cluster.get(kube.POD, "web-1")
    assert truth is not None and lifecycle.is_deleting(truth)
    server = provider.snapshot()[f"{cluster.namespace}/{SERVICE}"]["web-1"]
    assert answer.deleting
    assert [f.finalizer for f in answer.finalizers] == finalizers(truth)
    ours = [f for f in answer.finalizers if f.role != "other"]
    assert {f.finalizer for f in ours} & {
        lifecycle.lifecycle_finalizer(SERVICE),
        lifecycle.guard_finalizer(SERVICE),
    }
    for f in ours:
        assert f.employers == [f"Service/{cluster.namespace}/{SERVICE}"]
        assert f.provider_consulted
        assert [b.employee for b in f.provider] == ["web-1"]
        assert f.provider[0].serving == (server.traffic_on and server.weight > 0)
        assert f.provider[0].details["weight"] == server.weight
    # The provider still routes to the pod whose containers stopped: explain says so.
    assert server.traffic_on and server.weight > 0
    assert answer.served_while_stopped == [f"Service/{cluster.namespace}/{SERVICE}"]


async def test_a_pod_held_by_a_finalizer_of_an_employer_gone_says_no_employer_has_its_hash(
    cluster: Cluster,
) -> None:
    gone = lifecycle.lifecycle_finalizer("a-service-that-is-gone")
    await cluster.pod("orphan", {"app": "none"})
    await cluster.patch(kube.POD, "orphan", {"metadata": {"finalizers": [gone]}})
    try:
        answer = await Explainer(cluster.client).pod(cluster.namespace, "orphan")
        assert [(f.finalizer, f.role, f.employers) for f in answer.finalizers] == [(gone, "lifecycle", [])]
        assert not answer.finalizers[0].provider_consulted
    finally:
        await cluster.patch(kube.POD, "orphan", {"metadata": {"finalizers": []}})


async def test_an_employer_whose_provider_refuses_a_create_is_not_converged_and_says_which_items(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider = FakeProvider()
    adapter = DemoAdapter(provider)
    async with run_manager(adapter):
        await _setup(cluster, provider, ("web-0",))
        provider.fail_next("create_rs", times=1000, message="quota exceeded")
        await cluster.pod("web-1", {"app": SERVICE})
        await cluster.set_status("web-1", ready=True)

        async def warned() -> bool:
            events = await cluster.events(SERVICE)
            return any(kind == "Warning" and "quota exceeded" in message for kind, _, message in events)

        await async_wait_for(warned, timeout=30, message="a Warning Event about the refused create")
        answer = await Explainer(cluster.client, [adapter]).employer(kube.SERVICE, cluster.namespace, SERVICE)

    held = set(provider.snapshot()[f"{cluster.namespace}/{SERVICE}"])
    selected = {p["metadata"]["name"] for p in await cluster.pods({"app": SERVICE})}
    assert answer.converged is False
    assert answer.provider_consulted and answer.controller == adapter.get_controller_name()
    assert {(c.action, c.id) for c in answer.employee_changes} == {("create", n) for n in selected - held}
    assert answer.employer_changes == []
    assert {b.employee for b in answer.provider.backends} == held if answer.provider else False
    assert any("quota exceeded" in e.message for e in answer.warnings)
    assert {p.name for p in answer.pods} == selected


async def test_a_converged_employer_says_so_and_its_pods_carry_the_lifecycle_finalizer(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    provider = FakeProvider()
    adapter = DemoAdapter(provider)
    async with run_manager(adapter):
        await _setup(cluster, provider, ("web-0", "web-1"))
        answer = await Explainer(cluster.client, [adapter]).employer(kube.SERVICE, cluster.namespace, SERVICE)
    assert answer.converged is True
    assert answer.employee_changes == [] and answer.unguarded == [] and answer.to_release == []
    assert [(p.name, p.has_lifecycle_finalizer, p.provider is not None) for p in answer.pods] == [
        ("web-0", True, True),
        ("web-1", True, True),
    ]


def test_the_command_line_prints_json_that_matches_the_cluster(
    control_plane: LocalControlPlane, cluster: Cluster
) -> None:
    async def setup() -> None:
        await cluster.pod("plain", {"app": "x"})
        await cluster.set_status("plain", ready=False)
        await cluster.patch(kube.POD, "plain", {"metadata": {"finalizers": ["example.com/keep"]}})

    asyncio.run(setup())
    try:
        truth = cluster.client.get(kube.POD, cluster.namespace, "plain")
        args = ["explain", "pod", f"{cluster.namespace}/plain", "--kubeconfig", str(control_plane.kubeconfig)]
        done = run_cli(*args, "--output", "json")
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        ready = next(c for c in truth["status"]["conditions"] if c["type"] == "Ready")
        assert (answer["namespace"], answer["name"]) == (cluster.namespace, "plain")
        assert ready["status"] == "False" and answer["ready"] is False
        assert [(f["finalizer"], f["role"]) for f in answer["finalizers"]] == [("example.com/keep", "other")]
        assert answer["adapters"] == []
    finally:
        cluster.client.patch(kube.POD, cluster.namespace, "plain", {"metadata": {"finalizers": []}})


def test_the_command_line_exits_1_for_an_object_that_does_not_exist(
    control_plane: LocalControlPlane, cluster: Cluster
) -> None:
    """As kubectl does: the answer ("not found", or JSON with "exists": false) and exit code 1;
    the same pod once created: exit code 0."""

    def explain(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli("explain", *args, "--kubeconfig", str(control_plane.kubeconfig))

    missing = explain("pod", f"{cluster.namespace}/here")
    assert missing.returncode == 1, missing.stderr
    assert missing.stdout.strip() == f"pod {cluster.namespace}/here: not found"
    as_json = explain("employer", "Service", f"{cluster.namespace}/nosuch", "--output", "json")
    assert as_json.returncode == 1, as_json.stderr
    assert json.loads(as_json.stdout)["exists"] is False
    asyncio.run(cluster.pod("here", {"app": "x"}))
    present = explain("pod", f"{cluster.namespace}/here")
    assert present.returncode == 0, present.stderr


def test_the_command_line_refuses_a_reference_without_a_namespace() -> None:
    done = run_cli("explain", "pod", "web")
    assert done.returncode == 2
    assert "'web' is not NAMESPACE/NAME" in done.stderr


def test_a_reference_without_a_namespace_is_refused_with_the_form_to_use() -> None:
    with pytest.raises(ExplainError, match="NAMESPACE/NAME"):
        split_ref("web")


async def test_an_unknown_employer_kind_is_refused_with_the_forms_to_use(cluster: Cluster) -> None:
    with pytest.raises(ExplainError, match=r"Kind\.version\.group"):
        Explainer(cluster.client).resolve_kind("Nosuch")


@pytest.fixture
def lc(local_cluster: LocalCluster, local_cluster_namespace: str) -> Iterator[Cluster]:
    client = KubeClient.from_kubeconfig(str(local_cluster.kubeconfig))
    yield Cluster(client, local_cluster_namespace)
    client.close()


async def test_a_gated_pod_the_provider_does_not_serve_names_its_gate_employer_and_since_when(
    lc: Cluster,
) -> None:
    """On the working local cluster: the provider refuses to register the pod, so the Service's
    readiness gate stays False and the pod is not Ready although its containers run."""
    provider = FakeProvider()
    provider.fail_next("create_rs", times=10_000, message="backend quota exceeded")
    adapter = DemoAdapter(provider)
    gate = lifecycle.readiness_gate(SERVICE)
    manager = Manager(lc.client, ManagerOptions(namespace=lc.namespace))
    await manager.add(adapter)
    await manager.start()
    try:
        await lc.service(SERVICE, annotations={wire.READINESS_GATE_ANNOTATION: "true"})
        await lc.deployment(SERVICE, 1, readiness_gates=(gate,))

        def judged_ready(pod: KubeObject) -> bool:
            # The gate's reason follows the containers (docs/zero-downtime.md): wait until the
            # controller has written it for running containers, so explain and the later read
            # see one state.
            gate_condition = lifecycle.pod_condition(pod, gate)
            return (
                condition(pod, "ContainersReady") == "True"
                and gate_condition is not None
                and gate_condition.get("reason") != wire.GateReason.CONTAINERS_NOT_READY
            )

        async def gated() -> KubeObject | None:
            tried = any(kind == "Warning" for kind, _, _ in await lc.events(SERVICE))
            pods = [p for p in await lc.pods({"app": SERVICE}) if judged_ready(p)]
            return pods[0] if tried and pods else None

        pod = await async_wait_for(gated, timeout=60, message="a running pod the provider refused")
        name = pod["metadata"]["name"]
        answer = await Explainer(lc.client, [adapter]).pod(lc.namespace, name)
    finally:
        await manager.stop(timeout=5)

    truth = await lc.get(kube.POD, name)
    assert truth is not None
    cond = lifecycle.pod_condition(truth, gate)
    assert condition(truth, "Ready") == "False" and answer.ready is False
    assert answer.containers_ready is True
    assert [g.gate for g in answer.not_ready] == [gate]
    found = answer.not_ready[0]
    assert found.employer == f"Service/{lc.namespace}/{SERVICE}"
    if cond is None:  # the frame has not written the gate: explain says so
        assert (found.status, found.since) == ("missing", None)
    else:
        assert cond.get("status") != "True"
        assert (found.status, found.reason, found.since) == (
            cond.get("status"),
            cond.get("reason", ""),
            cond.get("lastTransitionTime"),
        )
    assert found.provider_consulted
    assert name not in provider.snapshot().get(f"{lc.namespace}/{SERVICE}", {})
    assert found.provider is None
