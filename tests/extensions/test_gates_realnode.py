"""The gated rollout of tests/extensions/test_gates.py on a real node (docs/zero-downtime.md;
docs/testing.md, "A real node"): the kubelet really runs the preStop the webhook injects and
really stops the containers, and the judge is the containers themselves. Traffic goes, as a load
balancer would send it, to every backend the provider serves, at the pod's IP; each request must
be answered by that pod. And the HTTP test server's own log says when it got SIGTERM and stopped
accepting: the provider must have stopped routing to it before.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from resourceconsist import wire
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, RealNodeCluster, async_wait_for
from resourceconsist.testing.realnode import NODE_NAME, TESTSERVER_PORT, http_server_log, http_server_pod_spec
from tests.extensions.test_gates import (
    CONTROLLED,
    ProviderWatch,
    _live,
    _manager,
    _opt_in,
    _webhook,
    _webhook_sees,
)

REPLICAS = 4
DRAIN_SECONDS = 3


@pytest.fixture
def rn(real_node_cluster: RealNodeCluster, real_node_namespace: str) -> Iterator[Cluster]:
    client = KubeClient.from_kubeconfig(str(real_node_cluster.kubeconfig))
    yield Cluster(client, real_node_namespace)
    client.close()


@dataclass
class Traffic:
    """A load balancer's traffic: every 20 ms, one request to each backend the provider serves
    right then, at its pod's IP (from the pods the watch saw), numbered; each must be answered by
    that pod. Records when each pod was last seen served, and every failed request."""

    provider: FakeProvider
    key: str
    watch: ProviderWatch
    sent: int = 0
    answered: dict[str, set[str]] = field(default_factory=dict)
    last_served: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            serving = self.provider.serving(self.key)
            now = time.time()
            for name in sorted(serving):
                self.last_served[name] = now
                ip = ((self.watch.pods.get(name) or {}).get("status") or {}).get("podIP")
                if ip:
                    self._send(name, ip)

    def _send(self, name: str, ip: str) -> None:
        self.sent += 1
        request_id = str(self.sent)
        try:
            with urllib.request.urlopen(
                f"http://{ip}:{TESTSERVER_PORT}/?id={request_id}", timeout=2
            ) as answer:
                body = answer.read().decode()
        except OSError as err:
            self.failures.append(f"{name} ({ip}) request {request_id}: {err}")
            return
        if body != f"{name}\n":
            self.failures.append(f"{name} ({ip}) request {request_id} answered by {body.strip()!r}")
            return
        self.answered.setdefault(name, set()).add(request_id)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


async def test_a_gated_rollout_on_real_containers_drops_no_request_and_stops_no_server_still_routed(
    real_node_cluster: RealNodeCluster, rn: Cluster, tmp_path: Path
) -> None:
    provider = FakeProvider(latency=0.5)  # a load balancer takes time to apply a change
    key = f"{rn.namespace}/web"
    logs = tmp_path / "server-logs"
    await _opt_in(
        rn, {wire.READINESS_GATE_ANNOTATION: "true", wire.DRAIN_SECONDS_ANNOTATION: str(DRAIN_SECONDS)}
    )
    async with _webhook(real_node_cluster, rn, tmp_path) as server:
        await _webhook_sees(server, rn)
        # The template names no gate and no preStop: the webhook adds both; the kubelet runs them.
        await rn.deployment(
            "web",
            REPLICAS,
            labels={"app": "web", **CONTROLLED},
            max_surge="25%",
            max_unavailable=0,
            pod_spec=http_server_pod_spec(logs),
        )
        async with _manager(rn, DemoAdapter(provider)):
            await rn.wait_rollout("web", timeout=120)
            first = _live(await rn.pods({"app": "web"}))
            for pod in first:
                assert pod["spec"]["nodeName"] == NODE_NAME
                assert lifecycle.readiness_gates(pod) == [lifecycle.readiness_gate("web")]
                pre_stop = pod["spec"]["containers"][0]["lifecycle"]["preStop"]
                assert pre_stop == {"sleep": {"seconds": DRAIN_SECONDS}}
            watch = ProviderWatch(rn.client, rn.namespace, provider, key)
            traffic = Traffic(provider, key, watch)
            traffic.start()
            try:
                await async_wait_for(lambda: traffic.sent >= 50, timeout=30, message="traffic flowing")
                await rn.roll("web", "2")

                async def rolled_and_served() -> bool:
                    if not await rn.rollout_done("web"):
                        return False
                    pods = await rn.pods({"app": "web"})
                    return len(pods) == REPLICAS and provider.serving(key) == {
                        p["metadata"]["name"] for p in pods
                    }

                await async_wait_for(rolled_and_served, timeout=180, interval=0.2, message="the rollout")
                assert all(p["spec"]["nodeName"] == NODE_NAME for p in await rn.pods({"app": "web"}))
                old = {p["metadata"]["name"] for p in first}
                await async_wait_for(lambda: old <= watch.gone, timeout=30, message="the old pods gone")
                sent_at_end = traffic.sent
                await async_wait_for(
                    lambda: traffic.sent > sent_at_end + 50, timeout=30, message="more traffic"
                )
            finally:
                traffic.stop()
                watch.close()
    # Not one request failed: every backend the provider served answered, as itself.
    assert traffic.failures == []
    assert traffic.sent > 200
    assert watch.violations == [] and watch.fewest is not None and watch.fewest >= REPLICAS
    for name in old:
        events = http_server_log(logs, name)
        by_kind = {e["event"]: e["t"] for e in events}
        # The kubelet ran the preStop, then sent SIGTERM; the server stopped as a real one does.
        assert [e["event"] for e in events if e["event"] != "served"][-4:] == [
            "sigterm",
            "stopped-accepting",
            "drained",
            "exit",
        ], events
        # The provider had stopped routing to the pod before its server stopped accepting ...
        assert traffic.last_served[name] < by_kind["sigterm"], (name, traffic.last_served[name], by_kind)
        # ... and every request it routed there, the server's own log shows it served.
        served = {e["id"] for e in events if e["event"] == "served"}
        assert traffic.answered.get(name, set()) <= served
        assert all(e["t"] < by_kind["stopped-accepting"] for e in events if e["event"] == "served")
