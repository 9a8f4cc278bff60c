"""The testing kit's RealNodeCluster runs Pods in real containers: a real kubelet, containerd,
runc, the CNI bridge and kube-proxy (docs/testing.md, "A real node"). On the session's node: a
Pod of the HTTP test server image runs and answers from its own network namespace, reaches the
API server through the ``kubernetes`` Service with the token the kubelet mounted, and its logs
and exec go through the API server to the kubelet; a deleted Pod's preStop runs and its
container gets SIGTERM; every listener of the node binds to loopback or the kit's bridge; a
second node on the host is refused in one line."""

from __future__ import annotations

import ipaddress
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.testing import (
    KUBERNETES_VERSION,
    Cluster,
    RealNodeCluster,
    RealNodeUnavailable,
    async_wait_for,
    condition,
    wait_for,
)
from resourceconsist.testing.hoststate import listeners_of
from resourceconsist.testing.realnode import (
    BRIDGE,
    BRIDGE_ADDRESS,
    BRIDGE_MAC,
    NODE_NAME,
    PAUSE_IMAGE,
    POD_NETWORK,
    TESTSERVER_IMAGE,
    TESTSERVER_PORT,
    http_server_log,
    http_server_pod_spec,
)


@pytest.fixture
def rn(real_node_cluster: RealNodeCluster, real_node_namespace: str) -> Iterator[Cluster]:
    client = KubeClient.from_kubeconfig(str(real_node_cluster.kubeconfig))
    yield Cluster(client, real_node_namespace)
    client.close()


async def _running_pod(rn: Cluster, name: str, spec: dict[str, Any]) -> KubeObject:
    await rn.call(rn.client.create, kube.POD, rn.namespace, {"metadata": {"name": name}, "spec": spec})

    async def ready() -> KubeObject | None:
        pod = await rn.get(kube.POD, name)
        return pod if condition(pod, "Ready") == "True" else None

    found = await async_wait_for(ready, timeout=60, interval=0.2, message=f"pod {name} Ready")
    assert found is not None and found["spec"]["nodeName"] == NODE_NAME
    return found


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        body: bytes = answer.read()
    return body.decode()


async def test_a_pod_runs_in_a_real_container_and_reaches_the_api_server_through_its_service(
    real_node_cluster: RealNodeCluster, rn: Cluster
) -> None:
    pod = await _running_pod(rn, "web", http_server_pod_spec())
    # Placed on the real node (no other exists), with an address on the kit's bridge network ...
    assert pod["spec"]["nodeName"] == NODE_NAME
    ip = pod["status"]["podIP"]
    assert ipaddress.ip_address(ip) in POD_NETWORK
    assert pod["status"]["hostIP"] == BRIDGE_ADDRESS
    # ... where its server answers the host with the Pod's name (the downward API's).
    assert _get(f"http://{ip}:{TESTSERVER_PORT}/") == "web\n"
    # Its log comes from the kubelet through the API server.
    log = await rn.call(real_node_cluster.pod_log, rn.namespace, "web")
    assert '"event": "listening"' in log
    # In the container: the ServiceAccount token the kubelet mounted, the API server at the
    # kubernetes Service's address (kube-proxy's rules), its certificate naming that address.
    script = (
        "import os, ssl, urllib.request;"
        "d = '/var/run/secrets/kubernetes.io/serviceaccount/';"
        "r = urllib.request.Request('https://' + os.environ['KUBERNETES_SERVICE_HOST'] + '/version',"
        " headers={'Authorization': 'Bearer ' + open(d + 'token').read()});"
        "c = ssl.create_default_context(cafile=d + 'ca.crt');"
        "print(urllib.request.urlopen(r, context=c).read().decode())"
    )
    out = await rn.call(real_node_cluster.exec_in, rn.namespace, "web", ["python3", "-c", script])
    assert f'"gitVersion": "v{KUBERNETES_VERSION}"' in out


async def test_the_bridge_keeps_its_mac_address_when_pods_join_it(rn: Cluster) -> None:
    # A bridge with no MAC of its own takes its ports' lowest: a Pod's new veth could change it,
    # and every Pod's answers to the host were lost until their ARP entries were re-resolved.
    for name in ("mac-a", "mac-b", "mac-c"):
        await _running_pod(rn, name, http_server_pod_spec())
        assert _bridge("address") == BRIDGE_MAC
    # Set by hand (3: NET_ADDR_SET), so the kernel never recalculates it from the ports.
    assert _bridge("addr_assign_type") == "3"


def _bridge(attribute: str) -> str:
    return Path(f"/sys/class/net/{BRIDGE}/{attribute}").read_text().strip()


async def test_a_deleted_pod_runs_its_prestop_then_its_container_gets_sigterm(
    rn: Cluster, tmp_path: Path
) -> None:
    spec = http_server_pod_spec(tmp_path)
    spec["containers"][0]["lifecycle"] = {"preStop": {"sleep": {"seconds": 2}}}
    spec["terminationGracePeriodSeconds"] = 30
    await _running_pod(rn, "stopping", spec)
    deleted = time.time()
    await rn.delete(kube.POD, "stopping")

    def exited() -> list[dict[str, Any]]:
        events = http_server_log(tmp_path, "stopping")
        return events if events and events[-1]["event"] == "exit" else []

    events = await async_wait_for(exited, timeout=60, interval=0.2, message="the server's exit")
    names = [e["event"] for e in events]
    assert names[0] == "listening" and names[-4:] == ["sigterm", "stopped-accepting", "drained", "exit"]
    sigterm = next(e["t"] for e in events if e["event"] == "sigterm")
    # The kubelet ran the 2-second preStop sleep before it sent SIGTERM.
    assert sigterm - deleted >= 2 - 0.1
    await async_wait_for(lambda: _gone(rn, "stopping"), timeout=30, message="the pod removed")


async def _gone(rn: Cluster, name: str) -> bool:
    return await rn.get(kube.POD, name) is None


def test_the_node_is_the_only_node_and_its_images_are_imported(
    real_node_cluster: RealNodeCluster, real_node_api: Any
) -> None:
    from kubernetes import client

    nodes = client.CoreV1Api(real_node_api).list_node().items
    assert [n.metadata.name for n in nodes] == [NODE_NAME]
    present = real_node_cluster.images_present()
    assert PAUSE_IMAGE in present and TESTSERVER_IMAGE in present


def test_the_kubelet_never_collects_images_nor_evicts_for_disk(real_node_cluster: RealNodeCluster) -> None:
    """Imported images cannot be pulled again: the kubelet's own configuration (its configz,
    through the API server's node proxy) has image garbage collection and disk eviction off."""
    raw = real_node_cluster.raw_get(f"/api/v1/nodes/{NODE_NAME}/proxy/configz")
    config = json.loads(raw)["kubeletconfig"]
    assert config["imageGCHighThresholdPercent"] == 100
    assert all(config["evictionHard"][signal] == "0%" for signal in ("nodefs.available", "imagefs.available"))
    assert config["cgroupDriver"] == "cgroupfs" and config["failCgroupV1"] is False


def test_every_listener_of_the_node_is_on_loopback_or_the_bridge(real_node_cluster: RealNodeCluster) -> None:
    pids = set(real_node_cluster.pids) | real_node_cluster.node_pids()
    listening = listeners_of(pids)
    # The API server, the kubelet, kube-proxy, containerd's stream server at least.
    assert len(listening) >= 4, listening
    assert {address.rsplit(":", 1)[0] for address in listening} <= {"127.0.0.1", BRIDGE_ADDRESS}, listening


def test_a_second_node_on_the_same_host_is_refused_in_one_line(real_node_cluster: RealNodeCluster) -> None:
    with pytest.raises(RealNodeUnavailable, match="another real node runs on this host") as refused:
        RealNodeCluster().start()
    assert "\n" not in str(refused.value)
    # The running node is untouched.
    assert real_node_cluster.running
    wait_for(real_node_cluster.node_ready, timeout=10, message="the node still Ready")
