"""What is particular to HAProxy, on real HAProxy processes: an HA pair kept in step (a pod is
served only when both instances serve it, released only when neither routes to it), a dead
instance and a restarted one that lost its runtime servers, a server let take traffic only once
its health check passed, a drain that ends with the last session, the runtime API over TLS with
client certificates, and a backend HAProxy cannot add servers to."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from resourceconsist.adapters.haproxy import (
    OPTIONS_ANNOTATION,
    HAProxyAdapter,
    RuntimeAPI,
    RuntimeAPIUnavailable,
    RuntimeTLS,
)
from resourceconsist.cluster import certs, kube
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, async_wait_for
from resourceconsist.testing.haproxy import Backend, LocalHAProxy, PodServers
from resourceconsist.wire import GateReason

from .conftest import adapter_on, flz, haproxy_service, our_servers, pod_finalizers, ready_pod, ready_pods, up


def _status(url: str, timeout: float = 5) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


async def _served_on(haproxy: LocalHAProxy, names: set[str]) -> bool:
    found = our_servers(haproxy)
    return set(found) == names and all(up(r) for r in found.values())


async def test_an_ha_pair_in_step_through_a_dead_and_a_restarted_instance(
    cluster: Cluster, run_manager: Any, pod_servers: PodServers
) -> None:
    with LocalHAProxy(["web"]) as a, LocalHAProxy(["web"]) as b:
        await haproxy_service(cluster, pod_servers)
        await ready_pods(cluster, pod_servers, ["web-0", "web-1"])
        async with run_manager(adapter_on(a.address, b.address, resync=0.5)):

            async def both() -> bool:
                return await _served_on(a, {"web-0", "web-1"}) and await _served_on(b, {"web-0", "web-1"})

            await async_wait_for(both, timeout=30, message="both pods UP on both instances")
            await async_wait_for(
                lambda: _holds(cluster, ["web-0", "web-1"], flz()), timeout=30, message="both pods served"
            )

            # B dies: its socket is dead. A leaving pod is taken out of A at once, but stays
            # while B, unread, may still route to it; a new pod is added to A, not served.
            b.kill()
            await cluster.delete(kube.POD, "web-0")
            await ready_pod(cluster, pod_servers, "web-2")
            await async_wait_for(
                lambda: _served_on(a, {"web-1", "web-2"}), timeout=30, message="A: web-0 removed, web-2 added"
            )
            held = await pod_finalizers(cluster, "web-0")
            assert held is not None, "web-0 stays while B may route to it"
            assert lifecycle.guard_finalizer("web") in held or flz() in held
            assert flz() not in (await pod_finalizers(cluster, "web-2") or []), "not served while B is down"

            # B comes back as a new process without any runtime server: web-0 goes, the others
            # are registered on B again.
            b.start()
            await async_wait_for(
                lambda: _served_on(b, {"web-1", "web-2"}), timeout=30, message="B re-registered"
            )

            async def web0_gone() -> bool:
                return await cluster.get(kube.POD, "web-0") is None

            await async_wait_for(
                web0_gone, timeout=30, message="web-0 released once no instance routes to it"
            )
            await async_wait_for(
                lambda: _holds(cluster, ["web-1", "web-2"], flz()), timeout=30, message="web-2 served on both"
            )

            # A restarts mid-run: its servers come back within the resync.
            a.restart()
            assert our_servers(a) == {}
            await async_wait_for(lambda: _served_on(a, {"web-1", "web-2"}), timeout=30, message="A back")
            for _ in range(6):
                assert _status(a.url()) == 200


async def _holds(cluster: Cluster, names: list[str], finalizer: str) -> bool:
    return all([finalizer in (await pod_finalizers(cluster, n) or []) for n in names])


async def test_a_server_takes_traffic_only_once_its_health_check_passed(
    cluster: Cluster, run_manager: Any, haproxy: LocalHAProxy, pod_servers: PodServers
) -> None:
    # HAProxy 2.6 marks a server leaving maintenance UP at once, whatever its check says: a pod
    # that does not answer would be sent requests until its check failed. The adapter lets a
    # server out of maintenance only once its check passed there. Checks tolerant of a busy test
    # process (the pods' servers share it): a check waits up to 500 ms, and three must fail.
    tolerant = "check inter 500ms fastinter 100ms downinter 100ms rise 1 fall 3"
    await haproxy_service(cluster, pod_servers, **{OPTIONS_ANNOTATION: tolerant})
    await ready_pod(cluster, pod_servers, "web-0")
    gate = lifecycle.readiness_gate("web")
    failures: list[int] = []
    sent = 0
    stop = asyncio.Event()

    async def traffic() -> None:
        nonlocal sent
        while not stop.is_set():
            status = await asyncio.to_thread(_status, haproxy.url())
            sent += 1
            if status != 200:
                failures.append(status)

    async with run_manager(adapter_on(haproxy.address)):
        await async_wait_for(lambda: _served_on(haproxy, {"web-0"}), timeout=30, message="web-0 UP")
        sender = asyncio.create_task(traffic())
        try:
            ip = await ready_pod(cluster, pod_servers, "web-1", gate=gate, serve=False)

            async def in_maintenance() -> bool:
                row = our_servers(haproxy).get("web-1")
                return row is not None and row["status"] == "MAINT" and row["check_status"] == "L4CON"

            await async_wait_for(in_maintenance, timeout=30, message="web-1 added, its check failing")
            seen = sent
            await async_wait_for(lambda: sent >= seen + 50, timeout=30, message="50 requests meanwhile")
            pod = await cluster.get(kube.POD, "web-1")
            assert (lifecycle.pod_condition(pod or {}, gate) or {}).get("reason") == GateReason.NOT_SERVING
            assert our_servers(haproxy)["web-1"]["status"] == "MAINT"

            pod_servers.start(ip, "web-1")
            await async_wait_for(
                lambda: _served_on(haproxy, {"web-0", "web-1"}), timeout=30, message="web-1 UP"
            )

            async def gate_open() -> bool:
                found = await cluster.get(kube.POD, "web-1")
                return (lifecycle.pod_condition(found or {}, gate) or {}).get("reason") == GateReason.SERVING

            await async_wait_for(gate_open, timeout=30, message="web-1's gate True")
            seen = sent
            await async_wait_for(lambda: sent >= seen + 20, timeout=30, message="20 more requests")
        finally:
            stop.set()
            await sender
    assert failures == [], f"{len(failures)} of {sent} requests failed: {sorted(set(failures))}"
    assert pod_servers.served(ip) > 0, "web-1 took requests once served"


async def test_a_drain_ends_with_the_last_session_and_lets_it_finish(
    cluster: Cluster, run_manager: Any, haproxy: LocalHAProxy, pod_servers: PodServers
) -> None:
    await haproxy_service(cluster, pod_servers, **{"resource-consist.kusionstack.io/drain-seconds": "30"})
    await ready_pod(cluster, pod_servers, "web-0")
    async with run_manager(adapter_on(haproxy.address)):
        await async_wait_for(lambda: _holds(cluster, ["web-0"], flz()), timeout=30, message="web-0 served")
        await async_wait_for(lambda: _served_on(haproxy, {"web-0"}), timeout=30, message="web-0 UP")
        long_request = asyncio.create_task(asyncio.to_thread(_status, haproxy.url(path="/sleep/2"), 10))
        await async_wait_for(
            lambda: our_servers(haproxy)["web-0"]["scur"] == "1", timeout=10, message="the request in flight"
        )
        started = time.monotonic()
        await cluster.delete(kube.POD, "web-0")
        await async_wait_for(
            lambda: our_servers(haproxy)["web-0"]["status"].startswith("DRAIN"),
            timeout=10,
            message="draining",
        )

        async def gone() -> bool:
            return await cluster.get(kube.POD, "web-0") is None

        await async_wait_for(gone, timeout=30, message="web-0 gone")
        took = time.monotonic() - started
        assert await long_request == 200, "the established request finished"
        assert "web-0" not in our_servers(haproxy)
        assert took < 15, f"the drain waited {took:.1f}s: it should end with the last session, not after 30s"


async def test_a_backend_haproxy_cannot_fill_is_refused_on_the_gate(
    cluster: Cluster, run_manager: Any, pod_servers: PodServers
) -> None:
    gate = lifecycle.readiness_gate("web")
    other = lifecycle.readiness_gate("static")
    with LocalHAProxy([Backend("web"), Backend("static", balance="static-rr")]) as haproxy:
        await haproxy_service(cluster, pod_servers, backend="missing")
        await haproxy_service(cluster, pod_servers, name="static", backend="static")
        await ready_pod(cluster, pod_servers, "web-0", gate=gate)
        await ready_pod(cluster, pod_servers, "static-0", app="static", gate=other)
        async with run_manager(adapter_on(haproxy.address)):

            async def refused(pod: str, gate_type: str, words: str) -> bool:
                found = lifecycle.pod_condition(await cluster.get(kube.POD, pod) or {}, gate_type) or {}
                return found.get("reason") == GateReason.PROVIDER_REFUSED and words in found.get(
                    "message", ""
                )

            await async_wait_for(
                lambda: refused("web-0", gate, "backend 'missing' does not exist"),
                timeout=30,
                message="missing",
            )
            await async_wait_for(
                lambda: refused("static-0", other, "dynamic load balancing"), timeout=30, message="static-rr"
            )
        assert our_servers(haproxy, "static") == {}


def test_the_runtime_api_over_tls_takes_only_its_client_certificates(tmp_path: Path) -> None:
    with LocalHAProxy(["web"], tls=True) as haproxy:
        ca, cert, key = haproxy.client_files()
        api = RuntimeAPI(haproxy.tls_address, tls=RuntimeTLS(str(ca), str(cert), str(key)), timeout=5)
        stat = api.stat()
        assert stat.backends["web"] == "roundrobin"
        # A certificate of another CA is refused by HAProxy's TLS handshake.
        stranger_ca = certs.make_ca("stranger")
        stranger = certs.make_signed(stranger_ca, "intruder", server=False, client=True)
        (tmp_path / "s.crt").write_bytes(stranger.cert_pem)
        (tmp_path / "s.key").write_bytes(stranger.key_pem)
        intruder = RuntimeAPI(
            haproxy.tls_address,
            tls=RuntimeTLS(str(ca), str(tmp_path / "s.crt"), str(tmp_path / "s.key")),
            timeout=5,
        )
        with pytest.raises(RuntimeAPIUnavailable):
            intruder.stat()
        assert HAProxyAdapter([api]).instances == (api,)
