"""A pass is freed by reference counting, not by the garbage collector: nothing of it forms a
reference cycle, so the collector never has to find its thousands of objects
(docs/benchmarks.md, "Garbage a pass leaves")."""

from __future__ import annotations

import gc
from collections import Counter
from typing import Any

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.reconcile.state import PassState
from resourceconsist.testing import Cluster, async_wait_for

PODS = 5


def _populate(cluster: Cluster) -> None:
    """A controlled Service ``web`` and its Ready pods."""
    cluster.client.create(
        kube.SERVICE,
        cluster.namespace,
        {
            "metadata": {"name": "web", "labels": {wire.CONTROL_LABEL: "true"}},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
        },
    )
    for j in range(PODS):
        name = f"web-{j}"
        pod = {
            "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        cluster.client.create(kube.POD, cluster.namespace, pod)
        ip = cluster.ip_of(name)
        status = {"podIP": ip, "podIPs": [{"ip": ip}], "conditions": [{"type": "Ready", "status": "True"}]}
        cluster.client.patch(kube.POD, cluster.namespace, name, {"status": status}, subresource="status")


async def test_passes_leave_nothing_for_the_garbage_collector(cluster: Cluster, run_manager: Any) -> None:
    await cluster.call(_populate, cluster)
    provider = FakeProvider()
    async with run_manager(DemoAdapter(provider), resync_period=0.2) as manager:
        controller = manager.controllers["demo-controller"]
        await async_wait_for(
            lambda: len(provider.snapshot().get(f"{cluster.namespace}/web", {})) == PODS,
            timeout=60,
            message="the Service's pods registered",
        )
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds is kept in gc.garbage
        try:
            mark = controller.reconciles
            await async_wait_for(
                lambda: controller.reconciles >= mark + 10, timeout=60, message="ten more passes"
            )
            gc.collect()
            found = Counter(type(o).__name__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert found[PassState.__name__] == 0, (
        f"{found[PassState.__name__]} passes (of 10 or more) were freed by the garbage collector, not by "
        f"reference counting; it found {sum(found.values())} objects: {found.most_common(8)}"
    )
