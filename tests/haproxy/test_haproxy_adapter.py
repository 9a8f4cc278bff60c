"""The ``haproxy`` adapter end to end: a real kube-apiserver + etcd, a real HAProxy (Debian's
package) driven through its runtime API, real HTTP servers standing for the pods on loopback IPs
that HAProxy checks and routes to, and requests sent through HAProxy's frontend."""

from __future__ import annotations

import urllib.request
from typing import Any

from resourceconsist.cluster import kube
from resourceconsist.testing import Cluster, async_wait_for
from resourceconsist.testing.haproxy import LocalHAProxy, PodServers

from .conftest import adapter_on, flz, haproxy_service, our_servers, pod_finalizers, ready_pods


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as answer:
        return str(answer.read().decode())


async def test_ready_pods_become_checked_servers_and_a_deleted_pod_is_drained_then_removed(
    cluster: Cluster, run_manager: Any, haproxy: LocalHAProxy, pod_servers: PodServers
) -> None:
    await haproxy_service(cluster, pod_servers, **{"resource-consist.kusionstack.io/drain-seconds": "2"})
    names = ["web-0", "web-1", "web-2"]
    await ready_pods(cluster, pod_servers, names)
    async with run_manager(adapter_on(haproxy.address)):

        async def served() -> bool:
            found = our_servers(haproxy)
            if set(found) != set(names) or any(r["status"] != "UP" for r in found.values()):
                return False
            return all([flz() in (await pod_finalizers(cluster, n) or []) for n in names])

        await async_wait_for(served, timeout=30, message="3 servers UP and 3 pods guarded")
        answers = {_get(haproxy.url()) for _ in range(12)}
        assert answers == set(names), "HAProxy routes to every pod"

        await cluster.delete(kube.POD, "web-1")

        async def gone() -> bool:
            return await cluster.get(kube.POD, "web-1") is None

        await async_wait_for(gone, timeout=30, message="web-1 gone")
        assert "web-1" not in our_servers(haproxy)
        assert {_get(haproxy.url()) for _ in range(12)} == {"web-0", "web-2"}
