"""Fixtures of the haproxy adapter's tests: a real HAProxy on loopback (Debian's package), real
HTTP servers standing for the pods on loopback IPs, a fault proxy in front of the runtime API,
and helpers that create a Service and ready pods the way a kubelet would report them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from resourceconsist.adapters.haproxy import (
    BACKEND_ANNOTATION,
    OPTIONS_ANNOTATION,
    PORT_ANNOTATION,
    HAProxyAdapter,
    RuntimeAPI,
)
from resourceconsist.cluster import kube
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, finalizers
from resourceconsist.testing.haproxy import LocalHAProxy, PodServers, SocketProxy

#: Fast health checks (a test waits for HAProxy's word in a fraction of a second) that three
#: checks must fail, each waiting up to 300 ms: the pods' servers share a busy test process.
FAST_CHECKS = "check inter 300ms fastinter 100ms downinter 100ms rise 1 fall 3"


@pytest.fixture
def haproxy() -> Iterator[LocalHAProxy]:
    with LocalHAProxy(["web", "api"]) as found:
        yield found


@pytest.fixture
def pod_servers() -> Iterator[PodServers]:
    with PodServers() as servers:
        yield servers


@pytest.fixture
def proxy(haproxy: LocalHAProxy) -> Iterator[SocketProxy]:
    with SocketProxy(haproxy.socket) as found:
        yield found


def adapter_on(*addresses: str, resync: float = 1.0, timeout: float = 2.0) -> HAProxyAdapter:
    return HAProxyAdapter([RuntimeAPI(a, timeout=timeout) for a in addresses], resync_seconds=resync)


async def haproxy_service(
    cluster: Cluster, servers: PodServers, name: str = "web", backend: str = "web", **annotations: str
) -> None:
    found = {
        BACKEND_ANNOTATION: backend,
        PORT_ANNOTATION: str(servers.port),
        OPTIONS_ANNOTATION: FAST_CHECKS,
        **annotations,
    }
    await cluster.service(name, annotations=found)


async def ready_pod(
    cluster: Cluster,
    servers: PodServers,
    name: str,
    *,
    app: str = "web",
    gate: str | None = None,
    serve: bool = True,
) -> str:
    """A pod whose HTTP server listens on a fresh loopback IP (unless ``serve`` is False), Ready
    (or, with ``gate``, carrying that readiness gate with its containers ready); its IP."""
    ip = servers.next_ip()
    if serve:
        servers.start(ip, name)
    if gate is None:
        await cluster.pod(name, {"app": app})
        await cluster.set_status(name, ready=True, ip=ip)
    else:
        body = {
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {
                "containers": [{"name": "app", "image": "app"}],
                "readinessGates": [{"conditionType": gate}],
            },
        }
        await cluster.call(cluster.client.create, kube.POD, cluster.namespace, body)
        await cluster.set_status(name, ready=False, ip=ip)
        await cluster.set_condition(name, "ContainersReady", True)
    return ip


async def ready_pods(cluster: Cluster, servers: PodServers, names: list[str], **kwargs: Any) -> list[str]:
    return list(await asyncio.gather(*(ready_pod(cluster, servers, n, **kwargs) for n in names)))


def flz(service: str = "web") -> str:
    return lifecycle.lifecycle_finalizer(service)


async def pod_finalizers(cluster: Cluster, name: str) -> list[str] | None:
    pod = await cluster.get(kube.POD, name)
    return None if pod is None else finalizers(pod)


def our_servers(haproxy: LocalHAProxy, backend: str = "web") -> dict[str, dict[str, str]]:
    """The servers of ours HAProxy holds in ``backend``, by pod name."""
    found = {}
    for row in haproxy.servers(backend):
        name = row["svname"]
        if name.startswith("rc:"):
            found[name.rsplit(":", 1)[1]] = row
    return found


def up(row: dict[str, str]) -> bool:
    """HAProxy sends the server new traffic: ``UP``, or ``UP 1/3`` (up, a check failed lately)."""
    return row["status"] == "UP" or row["status"].startswith("UP ")
