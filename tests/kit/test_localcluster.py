"""The testing kit's LocalCluster is a working cluster: real controllers and scheduler, kwok
nodes playing the kubelet. Deployments roll, readiness gates hold pods and rollouts, the
EndpointSlice follows, namespaces empty and go, finalizers hold terminating pods."""

from __future__ import annotations

import ipaddress
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.testing import (
    CONTROLLERS,
    SERVICE_CLUSTER_IP_RANGE,
    Cluster,
    ControlPlaneBinariesMissing,
    LocalCluster,
    LocalControlPlane,
    async_wait_for,
    condition,
    finalizers,
    wait_for,
)
from resourceconsist.testing.cluster import DEPLOYMENT, ENDPOINT_SLICE
from resourceconsist.testing.controlplane import process_alive
from resourceconsist.testing.localcluster import CLUSTER_BINARIES

GATE = "example.com/lb-ready"


@pytest.fixture
def lc(local_cluster: LocalCluster, local_cluster_namespace: str) -> Iterator[Cluster]:
    client = KubeClient.from_kubeconfig(str(local_cluster.kubeconfig))
    yield Cluster(client, local_cluster_namespace)
    client.close()


def _ready(pod: KubeObject) -> bool:
    return condition(pod, "Ready") == "True"


def _live(pods: list[KubeObject]) -> list[KubeObject]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _template_hash(pod: KubeObject) -> str:
    return str(pod["metadata"]["labels"]["pod-template-hash"])


async def _slice_addresses(lc: Cluster, service: str) -> set[str]:
    """Addresses of the Service's EndpointSlices whose endpoint is ready."""
    listing = await lc.call(
        lc.client.list, ENDPOINT_SLICE, lc.namespace, label_selector=f"kubernetes.io/service-name={service}"
    )
    return {
        address
        for eps in listing.get("items") or []
        for endpoint in eps.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint["addresses"]
    }


async def test_a_deployment_rolls_with_surge_and_no_unavailable_pod_and_the_endpointslice_follows(
    lc: Cluster, local_cluster: LocalCluster
) -> None:
    await lc.service("web", {"app": "web"}, controlled=False)
    await lc.deployment("web", 10, max_surge="25%", max_unavailable=0)
    await lc.wait_rollout("web")

    first = _live(await lc.pods({"app": "web"}))
    assert len(first) == 10 and all(_ready(p) for p in first)
    assert {p["spec"]["nodeName"] for p in first} <= set(local_cluster.node_names)
    assert all(p["status"].get("podIP") for p in first)
    assert len({p["status"]["podIP"] for p in first}) == 10
    await async_wait_for(
        lambda: _addresses_are(lc, "web", {p["status"]["podIP"] for p in first}),
        timeout=30,
        message="the EndpointSlice to hold the 10 first pods",
    )

    await lc.roll("web", "2")
    worst = {"fewest_ready": 10, "most_desired": 10}
    replicasets = await lc.call(lc.client.resource, "apps/v1", "ReplicaSet")

    async def rolled_out() -> bool:
        # Between polls the bounds of maxUnavailable 0 (ready pods) and maxSurge 25% (3 more
        # desired replicas across the Deployment's ReplicaSets: what the deployment controller
        # bounds; the ReplicaSet controller may briefly run ahead of its desired count) hold too.
        live = _live(await lc.pods({"app": "web"}))
        worst["fewest_ready"] = min(worst["fewest_ready"], sum(_ready(p) for p in live))
        listing = await lc.call(lc.client.list, replicasets, lc.namespace)
        desired = sum(int(rs["spec"].get("replicas") or 0) for rs in listing["items"])
        worst["most_desired"] = max(worst["most_desired"], desired)
        return await lc.rollout_done("web")

    await async_wait_for(rolled_out, timeout=120, interval=0.1, message="the rollout to revision 2")
    assert worst["fewest_ready"] >= 10, worst
    assert 10 < worst["most_desired"] <= 13, worst

    second = _live(await lc.pods({"app": "web"}))
    assert len(second) == 10 and all(_ready(p) for p in second)
    assert {_template_hash(p) for p in second}.isdisjoint({_template_hash(p) for p in first})
    old_names = {p["metadata"]["name"] for p in first}

    async def old_pods_gone() -> bool:
        names = {p["metadata"]["name"] for p in await lc.pods({"app": "web"})}
        return names.isdisjoint(old_names)

    await async_wait_for(old_pods_gone, timeout=30, message="the old pods to be deleted")
    await async_wait_for(
        lambda: _addresses_are(lc, "web", {p["status"]["podIP"] for p in second}),
        timeout=30,
        message="the EndpointSlice to hold exactly the new pods",
    )


async def _addresses_are(lc: Cluster, service: str, wanted: set[str]) -> bool:
    return await _slice_addresses(lc, service) == wanted


async def _approve_gates(lc: Cluster, selector: dict[str, str]) -> None:
    """What a load-balancer controller does: set the gate True on pods whose containers run."""
    for pod in _live(await lc.pods(selector)):
        if condition(pod, "ContainersReady") == "True" and condition(pod, GATE) != "True":
            await lc.set_condition(pod["metadata"]["name"], GATE, True)


async def test_a_false_readiness_gate_keeps_a_pod_not_ready_and_holds_the_rollout_until_it_goes_true(
    lc: Cluster,
) -> None:
    selector = {"app": "gated"}
    await lc.deployment("gated", 2, readiness_gates=(GATE,), max_surge=1, max_unavailable=0)

    async def gates_approved_and_rolled_out() -> bool:
        await _approve_gates(lc, selector)
        return await lc.rollout_done("gated")

    await async_wait_for(gates_approved_and_rolled_out, timeout=60, interval=0.2, message="first rollout")
    old = {p["metadata"]["name"] for p in _live(await lc.pods(selector))}

    await lc.roll("gated", "2")

    async def surge_pod_waiting_on_its_gate() -> KubeObject | None:
        for pod in _live(await lc.pods(selector)):
            reason = next(
                (c.get("reason") for c in pod["status"].get("conditions") or [] if c["type"] == "Ready"), None
            )
            if pod["metadata"]["name"] not in old and reason == "ReadinessGatesNotReady":
                return pod
        return None

    # The new pod's containers run, kwok evaluated its gate (absent, so not True): not Ready.
    new = await async_wait_for(surge_pod_waiting_on_its_gate, timeout=30, message="a gated surge pod")
    assert condition(new, "ContainersReady") == "True" and condition(new, "Ready") == "False"
    # A controller saying "not yet" keeps it so; the rollout is held with both old pods up.
    await lc.set_condition(new["metadata"]["name"], GATE, False)
    live = _live(await lc.pods(selector))
    assert {p["metadata"]["name"] for p in live} == old | {new["metadata"]["name"]}
    assert not _ready(next(p for p in live if p["metadata"]["name"] == new["metadata"]["name"]))
    assert not await lc.rollout_done("gated")

    # The gate goes True: the pod becomes Ready, and back to not Ready when it goes False.
    await lc.set_condition(new["metadata"]["name"], GATE, True)

    async def new_pod_ready() -> bool:
        pod = await lc.get(kube.POD, new["metadata"]["name"])
        return pod is not None and _ready(pod)

    await async_wait_for(new_pod_ready, timeout=30, message="the gated pod to become Ready")

    # Approving each new pod's gate as it comes lets the rollout finish.
    await async_wait_for(gates_approved_and_rolled_out, timeout=90, interval=0.2, message="gated rollout")
    final = _live(await lc.pods(selector))
    assert len(final) == 2 and not {p["metadata"]["name"] for p in final} & old
    assert all(_ready(p) and condition(p, GATE) == "True" for p in final)


async def test_readiness_follows_a_gate_in_both_directions(lc: Cluster) -> None:
    await lc.deployment("flip", 1, readiness_gates=(GATE,))

    async def one_pod_with_containers_ready() -> KubeObject | None:
        pods = _live(await lc.pods({"app": "flip"}))
        return pods[0] if pods and condition(pods[0], "ContainersReady") == "True" else None

    name = (await async_wait_for(one_pod_with_containers_ready, timeout=30, message="a running pod"))[
        "metadata"
    ]["name"]

    async def ready_is(value: str) -> bool:
        return condition(await lc.get(kube.POD, name), "Ready") == value

    for gate in (True, False, True):
        await lc.set_condition(name, GATE, gate)
        await async_wait_for(lambda g=gate: ready_is(str(g)), timeout=30, message=f"Ready={gate}")


# What stands for preStop (docs/testing.md): (lifecycle.preStop, grace period, seconds expected).
PRE_STOPS = {
    "sleep-action": ({"sleep": {"seconds": 3}}, 30, 3),
    "exec-sleep": ({"exec": {"command": ["sleep", "3"]}}, 30, 3),
    "shell-sleep": ({"exec": {"command": ["sh", "-c", "sleep 3"]}}, 30, 3),
    "capped-by-grace": ({"exec": {"command": ["/bin/sleep", "600"]}}, 3, 3),
}


@pytest.mark.parametrize("form", PRE_STOPS)
async def test_a_pod_with_a_finalizer_runs_out_its_prestop_then_stops_and_stays_until_released(
    lc: Cluster, form: str
) -> None:
    pre_stop_hook, grace, pre_stop = PRE_STOPS[form]
    body = {
        "metadata": {"name": "held", "finalizers": ["example.com/hold"]},
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "containers": [
                {"name": "app", "image": "registry.example/app:1", "lifecycle": {"preStop": pre_stop_hook}}
            ],
        },
    }
    await lc.call(lc.client.create, kube.POD, lc.namespace, body)

    async def ready() -> bool:
        return _ready(await lc.get(kube.POD, "held") or {})

    await async_wait_for(ready, timeout=30, message="the pod to become Ready")
    await lc.call(lc.client.delete, kube.POD, lc.namespace, "held")
    terminating = await lc.get(kube.POD, "held")
    assert terminating is not None and terminating["metadata"].get("deletionTimestamp")
    assert condition(terminating, "ContainersReady") == "True"  # preStop is running

    async def containers_stopped() -> KubeObject | None:
        found = await lc.get(kube.POD, "held")
        return found if condition(found, "ContainersReady") == "False" else None

    stopped = await async_wait_for(containers_stopped, timeout=30, message="the containers to stop")
    assert condition(stopped, "Ready") == "False"
    assert finalizers(stopped) == ["example.com/hold"]
    (status,) = stopped["status"]["containerStatuses"]
    # The stop came no earlier than deletion start + preStop (kwok's clock; docs/testing.md).
    deletion_start = _time(stopped["metadata"]["deletionTimestamp"]) - timedelta(
        seconds=stopped["metadata"]["deletionGracePeriodSeconds"]
    )
    assert _time(status["state"]["terminated"]["finishedAt"]) >= deletion_start + timedelta(seconds=pre_stop)

    await lc.patch(kube.POD, "held", {"metadata": {"finalizers": None}})

    async def gone() -> bool:
        return await lc.get(kube.POD, "held") is None

    await async_wait_for(gone, timeout=30, message="the released pod to go")


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


async def test_deleting_a_namespace_empties_it_and_it_goes_away(lc: Cluster) -> None:
    name = f"{lc.namespace}-gone"
    await lc.call(lc.client.create, kube.NAMESPACE, None, {"metadata": {"name": name}})
    other = Cluster(lc.client, name)
    await other.service("web", controlled=False)
    await other.deployment("web", 3)
    await other.wait_rollout("web")
    await lc.call(lc.client.delete, kube.NAMESPACE, None, name)

    async def namespace_gone() -> bool:
        return await lc.call(lc.client.get_or_none, kube.NAMESPACE, None, name) is None

    await async_wait_for(namespace_gone, timeout=90, interval=0.5, message=f"namespace {name} to go")
    assert await other.pods() == []


async def test_the_garbage_collector_removes_what_a_deleted_deployment_owned(lc: Cluster) -> None:
    await lc.deployment("owned", 2)
    await lc.wait_rollout("owned")
    await lc.call(lc.client.delete, DEPLOYMENT, lc.namespace, "owned")

    async def pods_gone() -> bool:
        return await lc.pods({"app": "owned"}) == []

    await async_wait_for(pods_gone, timeout=60, message="the orphaned ReplicaSet's pods to go")


async def test_the_service_ip_range_holds_a_thousand_services(lc: Cluster) -> None:
    def create(i: int) -> str:
        body = {"metadata": {"name": f"s-{i}"}, "spec": {"ports": [{"port": 80}]}}
        return str(lc.client.create(kube.SERVICE, lc.namespace, body)["spec"]["clusterIP"])

    with ThreadPoolExecutor(8) as pool:
        ips = await lc.call(lambda: list(pool.map(create, range(1000))))
    network = ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE)
    assert len(set(ips)) == 1000 and all(ipaddress.ip_address(ip) in network for ip in ips)


def test_the_controller_set_is_the_documented_one() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()
    for name in CONTROLLERS:
        assert f"`{name}`" in docs, f"docs/testing.md does not name the controller {name}"


def test_missing_cluster_binaries_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("kube-apiserver", "etcd"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    with pytest.raises(ControlPlaneBinariesMissing) as err:
        LocalCluster().start()
    message = str(err.value)
    assert all(name in message.split(" not found", maxsplit=1)[0] for name in CLUSTER_BINARIES)
    assert "hack/build-controlplane.sh" in message


@pytest.mark.controlplane
def test_a_killed_owner_takes_the_whole_cluster_down() -> None:
    script = (
        "import time\n"
        "from resourceconsist.testing import LocalCluster\n"
        "c = LocalCluster(nodes=1); c.start()\n"
        "print(' '.join(map(str, c.pids)), c.dir, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    *pid_words, directory = owner.stdout.readline().split()
    pids = [int(p) for p in pid_words]
    assert len(pids) == 5 and all(process_alive(p) for p in pids)
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)
    wait_for(lambda: not any(process_alive(p) for p in pids), timeout=15, message="orphans to die")
    with LocalControlPlane():  # the next start of any control plane removes the directory
        pass
    assert not Path(directory).exists()
