"""Steady state costs nothing: over several resyncs of 50 Services x 10 pods, the API server's own
request counters show no write, and the provider records no mutating call."""

from __future__ import annotations

import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, LocalControlPlane, annotation, async_wait_for, finalizers

SERVICES, PODS_EACH = 50, 10
_WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION"}
_METRIC = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$")


def api_writes(control_plane: LocalControlPlane) -> Counter[str]:
    """Writes the API server has served, by ``resource/verb``, from its own /metrics."""
    counts: Counter[str] = Counter()
    for line in control_plane.raw_get("/metrics").splitlines():
        match = _METRIC.match(line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        if labels.get("verb") in _WRITE_VERBS and labels.get("resource") in {"pods", "services", "events"}:
            counts[f"{labels['resource']}/{labels['verb']}"] += int(float(match["value"]))
    return counts


def _populate(cluster: Cluster) -> None:
    def make(i: int) -> None:
        svc = f"svc-{i:02d}"
        cluster.client.create(
            kube.SERVICE,
            cluster.namespace,
            {
                "metadata": {"name": svc, "labels": {wire.CONTROL_LABEL: "true"}},
                "spec": {"selector": {"app": svc}, "ports": [{"port": 80}]},
            },
        )
        for j in range(PODS_EACH):
            name = f"{svc}-{j}"
            cluster.client.create(
                kube.POD,
                cluster.namespace,
                {
                    "metadata": {"name": name, "labels": {"app": svc}},
                    "spec": {"containers": [{"name": "c", "image": "x"}]},
                },
            )
            ip = cluster.ip_of(name)
            cluster.client.patch(
                kube.POD,
                cluster.namespace,
                name,
                {
                    "status": {
                        "podIP": ip,
                        "podIPs": [{"ip": ip}],
                        "conditions": [{"type": "Ready", "status": "True"}],
                    }
                },
                subresource="status",
            )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(make, range(SERVICES)))


async def test_steady_state_makes_no_api_write_and_no_provider_mutation(
    control_plane: LocalControlPlane, cluster: Cluster, run_manager: Any
) -> None:
    await cluster.call(_populate, cluster)
    provider = FakeProvider()
    async with run_manager(DemoAdapter(provider), resync_period=1.0) as manager:
        controller = manager.controllers["demo-controller"]

        async def converged() -> bool:
            servers = provider.snapshot()
            if sum(len(v) for v in servers.values()) != SERVICES * PODS_EACH:
                return False
            listing = await cluster.call(cluster.client.list, kube.POD, cluster.namespace)
            return all(
                lifecycle.lifecycle_finalizer(p["metadata"]["labels"]["app"]) in finalizers(p)
                for p in listing["items"]
            )

        await async_wait_for(converged, timeout=120, interval=0.5, message="all 500 pods served and guarded")
        svc = await cluster.get(kube.SERVICE, "svc-00")
        assert annotation(svc, wire.EXPECTED_FINALIZER_ADDED_ANNOTATION) == ",".join(
            f"svc-00-{j}" for j in range(PODS_EACH)
        )

        # Let one full resync round pass, then measure over three more.
        mark = controller.reconciles
        await async_wait_for(
            lambda: controller.reconciles >= mark + SERVICES, timeout=60, message="a resync round"
        )
        writes_before, mutations_before = api_writes(control_plane), provider.mutating_calls()
        client_before = Counter(cluster.client.requests)
        mark = controller.reconciles
        await async_wait_for(
            lambda: controller.reconciles >= mark + 3 * SERVICES, timeout=120, message="three resync rounds"
        )
        writes_after, mutations_after = api_writes(control_plane), provider.mutating_calls()
        client_after = Counter(cluster.client.requests)

    assert controller.reconciles - mark >= 3 * SERVICES
    assert writes_before["pods/POST"] >= SERVICES * PODS_EACH, "the API server's counters were not read"
    assert writes_after - writes_before == Counter(), "the controller wrote to the API server in steady state"
    assert mutations_after == mutations_before, (
        "the controller called a mutating provider API in steady state"
    )
    assert {
        v: client_after[v] - client_before[v] for v in ("post", "put", "patch", "delete")
    } == dict.fromkeys(("post", "put", "patch", "delete"), 0)
