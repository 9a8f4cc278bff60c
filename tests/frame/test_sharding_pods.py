"""A shard's share of the pods on a real API server (docs/scaling.md, "What a shard's employers
need of pods"): each replica's pod cache holds the pods of its own Services only, and when a
replica leaves, its Services move with their pods to the one left, whose first passes see every
pod: none looks gone, none is deregistered, none loses its finalizer."""

from __future__ import annotations

import asyncio

from resourceconsist import kube, lifecycle
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.manager import Manager
from resourceconsist.options import ManagerOptions, ShardingOptions
from resourceconsist.sharding.ring import shard_label
from resourceconsist.testing import Cluster, async_wait_for, finalizers

RING = "pods"
SERVICES = 6
PODS_EACH = 2


def _replica(cluster: Cluster, shard: str) -> Manager:
    options = ShardingOptions(
        controller_ring=RING,
        shard_name=shard,
        namespace=cluster.namespace,
        lease_duration=6.0,
        renew_deadline=4.0,
        retry_period=0.5,
    )
    return Manager(cluster.client, ManagerOptions(namespace=cluster.namespace, sharding=options))


def _cached_pods(manager: Manager) -> set[str]:
    return {p["metadata"]["name"] for p in manager.informers.informer(kube.POD).store.list()}


async def test_each_replica_caches_its_services_pods_and_a_move_keeps_every_pod_served(
    cluster: Cluster,
) -> None:
    # One provider behind both replicas, as one cloud load balancer account would be.
    provider = FakeProvider()
    pods_of = {f"svc-{i}": {f"svc-{i}-pod-{j}" for j in range(PODS_EACH)} for i in range(SERVICES)}
    for service, pods in pods_of.items():
        await cluster.service(service)
        for pod in pods:
            await cluster.pod(pod, {"app": service})
            await cluster.set_status(pod, ready=True)
    # A pod no Service selects: no replica keeps it.
    await cluster.pod("stray", {"app": "nobody"})
    replicas = {shard: _replica(cluster, shard) for shard in ("shard-a", "shard-b")}
    for manager in replicas.values():
        await manager.add(DemoAdapter(provider))
        await manager.start()
    stopped: set[str] = set()
    lost: list[str] = []

    async def watch_finalizers() -> None:
        # Every pod keeps its Service's lifecycle finalizer from the moment it is served.
        served: set[str] = set()
        while True:
            listing = await cluster.call(cluster.client.list, kube.POD, cluster.namespace)
            for pod in listing["items"]:
                name = pod["metadata"]["name"]
                service = name.rsplit("-pod-", 1)[0]
                has = lifecycle.lifecycle_finalizer(service) in finalizers(pod)
                if has:
                    served.add(name)
                elif name in served:
                    lost.append(name)
            await asyncio.sleep(0.05)

    def all_served() -> bool:
        return all(
            pods <= provider.serving(f"{cluster.namespace}/{service}") for service, pods in pods_of.items()
        )

    async def shards() -> dict[str, str]:
        listing = await cluster.call(cluster.client.list, kube.SERVICE, cluster.namespace)
        return {
            s["metadata"]["name"]: s["metadata"]["labels"].get(shard_label(RING), "")
            for s in listing["items"]
        }

    async def divided() -> bool:
        assigned = await shards()
        if not set(assigned.values()) <= set(replicas) - stopped:
            return False
        return all(
            _cached_pods(manager) == {p for s, shard in assigned.items() if shard == name for p in pods_of[s]}
            for name, manager in replicas.items()
            if name not in stopped
        )

    watcher = asyncio.create_task(watch_finalizers())
    try:
        await async_wait_for(all_served, timeout=60, message="every pod served")
        await async_wait_for(divided, timeout=30, message="each replica caching its Services' pods")
        assert set((await shards()).values()) == set(replicas), "both shards hold Services"
        deletes = provider.calls["delete_rs"]

        # shard-b leaves: its Services and their pods move to shard-a.
        await replicas["shard-b"].stop(timeout=5)
        stopped.add("shard-b")
        await async_wait_for(divided, timeout=60, message="shard-a caching every Service's pods")
        assert _cached_pods(replicas["shard-a"]) == set().union(*pods_of.values())
        await async_wait_for(all_served, timeout=30, message="every pod still served")
        controller = next(iter(replicas["shard-a"].controllers.values()))
        for _ in range(2):  # passes of every Service on shard-a after the move
            passes = controller.reconciles
            for service in pods_of:
                controller.queue.add(f"{cluster.namespace}/{service}")
            await async_wait_for(lambda n=passes: controller.reconciles >= n + SERVICES, message="passes")
        assert all_served()
        assert provider.calls["delete_rs"] == deletes, "no pod was deregistered by the move"
        assert lost == []
    finally:
        watcher.cancel()
        for name, manager in replicas.items():
            if name not in stopped:
                await manager.stop(timeout=5)
