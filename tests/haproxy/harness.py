"""The conformance suite's harness for the ``haproxy`` adapter (resourceconsist.testing.conformance):
a real HAProxy with one backend per Service, the pods' real HTTP servers on loopback IPs, and the
fault proxy in front of the runtime API through which the adapter talks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from resourceconsist.adapters.haproxy import (
    BACKEND_ANNOTATION,
    OPTIONS_ANNOTATION,
    PORT_ANNOTATION,
    HAProxyAdapter,
    RuntimeAPI,
    owner_of,
)
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster
from resourceconsist.testing.conformance import FaultKind, ProviderHarness, WriteKind, kubelet_ready_pod
from resourceconsist.testing.haproxy import LocalHAProxy, PodServers, SocketProxy

#: Every Service of the suite has a backend of its name.
BACKENDS = ["web", "api", "auth", "shop", "cart"]
FAST_CHECKS = "check inter 300ms fastinter 100ms downinter 100ms rise 1 fall 3"
_REGISTER = ("add server", "enable health")
_REMOVE = ("del server", "shutdown sessions")


def _up(row: dict[str, str]) -> bool:
    return row["status"] == "UP" or row["status"].startswith("UP ")


class HAProxyHarness(ProviderHarness):
    name = "haproxy"

    def __init__(self, haproxy: LocalHAProxy, servers: PodServers, proxy: SocketProxy) -> None:
        self.haproxy, self.servers, self.proxy = haproxy, servers, proxy
        self.ips: dict[str, str] = {}

    def adapter(self) -> HAProxyAdapter:
        # A long resync: a periodic pass waiting for a frozen budget would hold back the pass
        # that drains (the budget test), and nothing here restarts HAProxy.
        return HAProxyAdapter([RuntimeAPI(self.proxy.address, timeout=2)], resync_seconds=30)

    async def service(self, cluster: Cluster, name: str, *, drain_seconds: float = 0.0) -> None:
        annotations = {
            BACKEND_ANNOTATION: name,
            PORT_ANNOTATION: str(self.servers.port),
            OPTIONS_ANNOTATION: FAST_CHECKS,
            "resource-consist.kusionstack.io/drain-seconds": str(int(drain_seconds)),
        }
        await cluster.service(name, annotations=annotations)

    async def pod(self, cluster: Cluster, name: str, *, service: str, gate: bool = False) -> None:
        ip = self.servers.next_ip()
        self.ips[name] = ip
        self.servers.start(ip, name)
        found_gate = lifecycle.readiness_gate(service) if gate else None
        await kubelet_ready_pod(cluster, name, {"app": service}, gate=found_gate, ip=ip)

    async def set_healthy(self, cluster: Cluster, name: str, healthy: bool) -> None:
        self.servers.set_healthy(self.ips[name], healthy)

    def _ours(self, cluster: Cluster, service: str) -> dict[str, list[dict[str, str]]]:
        found: dict[str, list[dict[str, str]]] = {}
        for row in self.haproxy.servers():
            owner = owner_of(row["svname"])
            if owner is not None and (owner.namespace, owner.service) == (cluster.namespace, service):
                found.setdefault(owner.pod, []).append(row)
        return found

    def routes(self, cluster: Cluster, service: str) -> set[str]:
        return set(self._ours(cluster, service))

    def serves(self, cluster: Cluster, service: str) -> set[str]:
        return {
            pod
            for pod, rows in self._ours(cluster, service).items()
            if any(_up(r) and r["uweight"] != "0" for r in rows)
        }

    @contextlib.contextmanager
    def fault(self, kind: FaultKind) -> Iterator[None]:
        if kind == "unavailable":
            self.proxy.fault("drop")
        elif kind == "ambiguous":
            for verb in ("add server", "set server", "del server", "enable health", "shutdown sessions"):
                self.proxy.fault("drop_answer", match=verb)
        else:
            self.proxy.fault("delay", seconds=0.3)
        try:
            yield
        finally:
            self.proxy.clear()

    def failed_calls(self) -> int:
        return len(self.proxy.lines(outcome="drop")) + len(self.proxy.lines(outcome="drop_answer"))

    def writes(self, cluster: Cluster) -> list[tuple[WriteKind, str]]:
        found: list[tuple[WriteKind, str]] = []
        for command in self.proxy.commands:
            if command.outcome not in ("forwarded", "drop_answer"):
                continue
            line = command.line
            kind: WriteKind | None = None
            if line.startswith(_REGISTER) or line.endswith(("state ready",)):
                kind = "register"
            elif line.startswith(_REMOVE) or line.endswith(("state drain", "state maint", "weight 0")):
                kind = "remove"
            if kind is None:
                continue
            server = line.split()[2] if not line.startswith("shutdown") else line.split()[3]
            owner = owner_of(server.split("/", 1)[1])
            if owner is not None and owner.namespace == cluster.namespace:
                found.append((kind, owner.pod))
        return found
