"""The conformance suite's harness for the ``alibabacloudslb`` adapter (manage mode) on the SLB
emulator, through the real Alibaba Cloud SDK (resourceconsist.testing.conformance)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from resourceconsist.adapters.alibabacloudslb import (
    DRAIN_ANNOTATION,
    MODE_ANNOTATION,
    SERVER_ID_ANNOTATION,
    SLBAdapter,
    vserver_group_name,
)
from resourceconsist.adapters.alibabacloudslb.config import LOAD_BALANCER_ID_LABEL
from resourceconsist.adapters.alibabacloudslb.emulator import SLBEmulator
from resourceconsist.adapters.alibabacloudslb.slbclient import (
    MUTATING_ACTIONS,
    BackendServer,
    RetryPolicy,
    SLBClient,
)
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster
from resourceconsist.testing.conformance import FaultKind, ProviderHarness, WriteKind, kubelet_ready_pod

RETRY = RetryPolicy(max_attempts=3, base_delay_seconds=0.01, max_delay_seconds=0.05, max_total_seconds=2)
CLUSTER = "conformance"
PORT = 80


class SLBHarness(ProviderHarness):
    name = "alibabacloudslb"

    def __init__(self, slb: SLBEmulator) -> None:
        self.slb = slb
        self.lb = slb.add_load_balancer()
        self.clients: list[SLBClient] = []
        self.unhealthy: set[str] = set()

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def adapter(self) -> SLBAdapter:
        client = SLBClient(self.slb.credentials(), retry=RETRY)
        self.clients.append(client)
        return SLBAdapter(client, cluster_name=CLUSTER, load_balancers=[self.lb])

    async def service(self, cluster: Cluster, name: str, *, drain_seconds: float = 0.0) -> None:
        annotations = {MODE_ANNOTATION: "manage", DRAIN_ANNOTATION: str(drain_seconds)}
        await cluster.service(name, labels={LOAD_BALANCER_ID_LABEL: self.lb}, annotations=annotations)

    async def pod(self, cluster: Cluster, name: str, *, service: str, gate: bool = False) -> None:
        found_gate = lifecycle.readiness_gate(service) if gate else None
        annotations = {SERVER_ID_ANNOTATION: f"eni-{name}"}
        await kubelet_ready_pod(cluster, name, {"app": service}, gate=found_gate, annotations=annotations)

    async def set_healthy(self, cluster: Cluster, name: str, healthy: bool) -> None:
        (self.unhealthy.discard if healthy else self.unhealthy.add)(name)
        self.slb.set_health(self.lb, f"eni-{name}", PORT, "normal" if healthy else "abnormal")

    def _backends(self, cluster: Cluster, service: str) -> list[BackendServer]:
        name = vserver_group_name({"metadata": {"namespace": cluster.namespace, "name": service}})
        group = next((g.id for g in self.slb.vserver_groups(self.lb) if g.name == name), None)
        return self.slb.backends(group) if group is not None else []

    @staticmethod
    def _pod(backend: BackendServer) -> str:
        return str(backend.server_id).removeprefix("eni-")

    def routes(self, cluster: Cluster, service: str) -> set[str]:
        return {self._pod(b) for b in self._backends(cluster, service)}

    def serves(self, cluster: Cluster, service: str) -> set[str]:
        return {
            self._pod(b)
            for b in self._backends(cluster, service)
            if b.weight > 0 and self._pod(b) not in self.unhealthy
        }

    @contextlib.contextmanager
    def fault(self, kind: FaultKind) -> Iterator[None]:
        if kind == "unavailable":
            self.slb.throttle(1.0, code="ServiceUnavailable")
        elif kind == "ambiguous":
            self.slb.set_fault_rates({"execute_fail": 1.0}, actions=MUTATING_ACTIONS)
        else:
            self.slb.set_latency(0.3)
        try:
            yield
        finally:
            self.slb.clear_faults()

    def failed_calls(self) -> int:
        return sum(1 for call in self.slb.calls if call.code is not None)

    def writes(self, cluster: Cluster) -> list[tuple[WriteKind, str]]:
        found: list[tuple[WriteKind, str]] = []
        for call in self.slb.calls:
            if not call.executed:
                continue
            for server in call.backend_servers:
                pod = str(server.get("ServerId", "")).removeprefix("eni-")
                if call.action == "AddVServerGroupBackendServers":
                    found.append(("register", pod))
                elif call.action == "RemoveVServerGroupBackendServers":
                    found.append(("remove", pod))
                elif call.action == "SetVServerGroupAttribute":
                    found.append(("remove" if server.get("Weight") in (0, "0") else "register", pod))
        return found
