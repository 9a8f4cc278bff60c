"""``resourceconsist_guard_held_deletion_seconds`` (docs/concepts.md, "What an operator sees under
faults"): how long past its deletion time the oldest pod still carrying a guard finalizer has
waited, read from a running manager's pod cache on a real API server. The chart's alert
ResourceconsistGuardHoldsDeletion reads it (docs/observability.md, "Alerts")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from resourceconsist.cluster import kube
from resourceconsist.experimental.demo import DemoAdapter
from resourceconsist.options import GarbageOptions
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, async_wait_for

pytestmark = pytest.mark.controlplane


def _held(manager: Manager) -> float | None:
    return manager.metrics.registry.get_sample_value(
        "resourceconsist_guard_held_deletion_seconds", {"cluster": ""}
    )


async def test_the_oldest_deletion_a_guard_holds_is_exported_until_it_is_released(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    guard = lifecycle.guard_finalizer("web")
    # A pod nothing selects: no pass touches it, the garbage pass is off; only its guard holds it.
    await cluster.pod("held-0", {"app": "nobody"})
    await cluster.patch(kube.POD, "held-0", {"metadata": {"finalizers": [guard]}})
    async with run_manager(DemoAdapter(), garbage=GarbageOptions(enabled=False)) as manager:
        await async_wait_for(lambda: _held(manager) == 0, timeout=30, message="nothing held yet: 0")
        # Deleted with no grace period: its deletion time is now, and it waits on the guard.
        await cluster.call(
            cluster.client._send,
            "DELETE",
            kube.POD.path(cluster.namespace, "held-0"),
            body={"gracePeriodSeconds": 0},
        )
        await async_wait_for(lambda: (_held(manager) or 0) >= 2, timeout=30, message="the wait counted")
        # A drain within the grace period is no wait: a pod deleted with a minute's grace counts 0
        # (bound to a node: the API server deletes a pod no node runs at once, whatever its grace).
        draining = {
            "metadata": {"name": "draining-0", "labels": {"app": "nobody"}, "finalizers": [guard]},
            "spec": {"nodeName": "node-a", "containers": [{"name": "app", "image": "nginx"}]},
        }
        await cluster.call(cluster.client.create, kube.POD, cluster.namespace, draining)
        await cluster.patch(kube.POD, "held-0", {"metadata": {"finalizers": None}})
        await cluster.call(
            cluster.client._send,
            "DELETE",
            kube.POD.path(cluster.namespace, "draining-0"),
            body={"gracePeriodSeconds": 60},
        )

        async def draining_seen_as_no_wait() -> bool:
            pod = await cluster.get(kube.POD, "draining-0")
            cached = manager.informers.reader().get(kube.POD, cluster.namespace, "draining-0")
            return (
                bool(pod and cached and cached["metadata"].get("deletionTimestamp")) and _held(manager) == 0
            )

        await async_wait_for(draining_seen_as_no_wait, timeout=30, message="released; the drain counts 0")
    await cluster.patch(kube.POD, "draining-0", {"metadata": {"finalizers": None}})
