"""The ``haproxy`` adapter end to end: a real kube-apiserver + etcd, a real HAProxy (Debian's
package) driven through its runtime API, real HTTP servers standing for the pods on loopback IPs
that HAProxy checks and routes to, and requests sent through HAProxy's frontend."""

from __future__ import annotations

import urllib.request
from typing import Any

from resourceconsist.adapters.haproxy import BACKEND_ANNOTATION, MODE_ANNOTATION
from resourceconsist.cluster import kube
from resourceconsist.testing import Cluster, async_wait_for
from resourceconsist.testing.haproxy import LocalHAProxy, PodServers, SocketProxy

from .conftest import adapter_on, flz, haproxy_service, our_servers, pod_finalizers, ready_pods, up


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
            if set(found) != set(names) or any(not up(r) for r in found.values()):
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


async def test_steady_state_reads_and_writes_nothing(
    cluster: Cluster, run_manager: Any, haproxy: LocalHAProxy, pod_servers: PodServers, proxy: SocketProxy
) -> None:
    await haproxy_service(cluster, pod_servers)
    names = ["web-0", "web-1"]
    await ready_pods(cluster, pod_servers, names)
    async with run_manager(adapter_on(proxy.address, resync=0.3)):
        await async_wait_for(
            lambda: _held(cluster, names), timeout=30, message="both pods served and guarded"
        )
        marker = len(proxy.commands)
        # Three resyncs later: the passes read every instance, and write nothing.
        await async_wait_for(
            lambda: len(proxy.lines()[marker:]) >= 6, timeout=30, message="resync passes reading"
        )
        seen = proxy.lines()[marker:]
    assert all(line.startswith("show stat") for line in seen), seen


async def _held(cluster: Cluster, names: list[str]) -> bool:
    return all([flz() in (await pod_finalizers(cluster, n) or []) for n in names])


async def test_a_pod_recreated_under_its_name_with_another_ip_gets_a_new_server(
    cluster: Cluster, run_manager: Any, haproxy: LocalHAProxy, pod_servers: PodServers
) -> None:
    await haproxy_service(cluster, pod_servers)
    await ready_pods(cluster, pod_servers, ["web-0"])
    async with run_manager(adapter_on(haproxy.address)):
        await async_wait_for(lambda: _held(cluster, ["web-0"]), timeout=30, message="web-0 served")
    old = our_servers(haproxy)["web-0"]["addr"]
    # With the controller down, someone force-deletes the pod; a StatefulSet makes it again
    # under its name, elsewhere.
    await cluster.patch(kube.POD, "web-0", {"metadata": {"finalizers": None}})
    await cluster.delete(kube.POD, "web-0")
    await async_wait_for(lambda: _gone(cluster, "web-0"), timeout=30, message="web-0 gone")
    await ready_pods(cluster, pod_servers, ["web-0"])
    async with run_manager(adapter_on(haproxy.address)):

        async def moved() -> bool:
            row = our_servers(haproxy).get("web-0")
            return row is not None and row["addr"] != old and up(row) and await _held(cluster, ["web-0"])

        await async_wait_for(moved, timeout=30, message="web-0's server at its new address, UP")
    assert len(our_servers(haproxy)) == 1
    assert {_get(haproxy.url()) for _ in range(4)} == {"web-0"}


async def _gone(cluster: Cluster, name: str) -> bool:
    return await cluster.get(kube.POD, name) is None


async def test_a_service_moved_to_another_backend_keeps_its_pods_served_through_the_move(
    cluster: Cluster, run_manager: Any, haproxy: LocalHAProxy, pod_servers: PodServers
) -> None:
    await haproxy_service(cluster, pod_servers)
    names = ["web-0", "web-1"]
    await ready_pods(cluster, pod_servers, names)
    async with run_manager(adapter_on(haproxy.address)):
        await async_wait_for(lambda: _held(cluster, names), timeout=30, message="served in web")
        samples: list[tuple[int, int]] = []
        await cluster.patch(kube.SERVICE, "web", {"metadata": {"annotations": {BACKEND_ANNOTATION: "api"}}})

        async def moved() -> bool:
            counts = {b: sum(up(r) for r in our_servers(haproxy, b).values()) for b in ("web", "api")}
            samples.append((counts["web"], counts["api"]))
            return not our_servers(haproxy, "web") and counts["api"] == 2

        await async_wait_for(moved, timeout=30, interval=0.02, message="both pods in api, none left in web")
        assert await _held(cluster, names), "the pods stayed served through the move"
    # Make before break: some backend had both pods up at every look.
    assert all(web == 2 or api == 2 for web, api in samples), samples
    assert {_get(haproxy.url("api")) for _ in range(6)} == set(names)


async def test_observe_mode_guards_pods_by_what_someone_else_put_in_haproxy(
    cluster: Cluster, run_manager: Any, haproxy: LocalHAProxy, pod_servers: PodServers, proxy: SocketProxy
) -> None:
    # The test plays whoever manages the backend's servers (a server-template with DNS discovery,
    # a configuration tool): the adapter only reads, and guards each pod by what it sees.
    await haproxy_service(cluster, pod_servers, **{MODE_ANNOTATION: "observe"})
    ips = dict(
        zip(["web-0", "web-1"], await ready_pods(cluster, pod_servers, ["web-0", "web-1"]), strict=True)
    )
    async with run_manager(adapter_on(proxy.address)):
        await async_wait_for(
            lambda: len(proxy.lines()) >= 4, timeout=30, message="the adapter reading HAProxy"
        )
        assert not await _held(cluster, ["web-0"]), "not served before HAProxy lists it"
        for n, ip in enumerate(ips.values()):
            haproxy.command(f"add server web/srv{n} {ip}:{pod_servers.port}")
            haproxy.command(f"set server web/srv{n} state ready")
        await async_wait_for(lambda: _held(cluster, list(ips)), timeout=30, message="both pods served")

        # web-0 is deleted: held while HAProxy may route to it, released once its server is out.
        await cluster.delete(kube.POD, "web-0")
        looked = len(proxy.lines())
        await async_wait_for(lambda: len(proxy.lines()) >= looked + 3, timeout=30, message="3 more looks")
        pod = await cluster.get(kube.POD, "web-0")
        assert pod is not None and flz() in (pod["metadata"].get("finalizers") or [])
        haproxy.command("set server web/srv0 state maint")
        await async_wait_for(lambda: _gone(cluster, "web-0"), timeout=30, message="web-0 released and gone")
    assert all(line.startswith("show stat") for line in proxy.lines()), "observe mode never writes"
    assert {_get(haproxy.url()) for _ in range(4)} == {"web-1"}


async def test_a_leaving_pod_whose_server_haproxy_already_marked_down_is_removed_without_its_drain_time(
    cluster: Cluster, run_manager: Any, haproxy: LocalHAProxy, pod_servers: PodServers
) -> None:
    # A pod's containers died before its deletion (no preStop, a crash): HAProxy's checks have
    # marked its server DOWN, and "set state drain" leaves a DOWN server's status DOWN. The server
    # takes no traffic and has no session: it is removed at once, not waited on (for ever, when
    # the drain was judged by the status alone; the traffic benchmark's rollout hung on it).
    await haproxy_service(cluster, pod_servers, **{"resource-consist.kusionstack.io/drain-seconds": "60"})
    ip0, ip1 = await ready_pods(cluster, pod_servers, ["web-0", "web-1"])
    async with run_manager(adapter_on(haproxy.address)):
        await async_wait_for(lambda: _held(cluster, ["web-0", "web-1"]), timeout=30, message="both served")
        await async_wait_for(
            lambda: all(up(r) for r in our_servers(haproxy).values()) and len(our_servers(haproxy)) == 2,
            timeout=30,
            message="both servers UP",
        )
        pod_servers.stop(ip1)
        await async_wait_for(
            lambda: our_servers(haproxy)["web-1"]["status"].startswith("DOWN"),
            timeout=30,
            message="web-1's server DOWN by HAProxy's checks",
        )
        await cluster.delete(kube.POD, "web-1")

        async def gone() -> bool:
            return await cluster.get(kube.POD, "web-1") is None and "web-1" not in our_servers(haproxy)

        # Well inside the drain time of 60 s.
        await async_wait_for(gone, timeout=20, message="web-1 and its server gone")
        assert up(our_servers(haproxy)["web-0"])
        assert ip0 != ip1
