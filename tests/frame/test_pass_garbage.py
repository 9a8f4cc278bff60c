"""A pass is freed by reference counting, not by the garbage collector: nothing of it forms a
reference cycle, so the collector never has to find its thousands of objects
(docs/benchmarks.md, "Garbage a pass leaves")."""

from __future__ import annotations

import gc
from collections import Counter
from typing import Any

from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.reconcile.state import PassState
from resourceconsist.testing import Cluster, async_wait_for

PODS = 5


async def test_passes_leave_nothing_for_the_garbage_collector(cluster: Cluster, run_manager: Any) -> None:
    await cluster.service("web")
    for j in range(PODS):
        await cluster.pod(f"web-{j}", {"app": "web"})
        await cluster.set_status(f"web-{j}")
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
