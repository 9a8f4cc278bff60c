"""A shard's share of the pods on a real API server (docs/scaling.md, "What a shard's employers
need of pods"): each replica's pod cache holds the pods of its own Services only, and when a
replica leaves, its Services move with their pods to the one left, whose first passes see every
pod: none looks gone, none is deregistered, none loses its finalizer. And the lists that cost
every replica every pod of the namespace: one at a start, one per wave of Services arriving."""

from __future__ import annotations

import asyncio
import datetime
import json

import pytest

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import Informer, InformerFactory
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.options import ManagerOptions, ShardingOptions
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.manager import Manager, Runnable
from resourceconsist.runtime.sharding.pods import ShardPods
from resourceconsist.runtime.sharding.ring import HashRing, hash_key, shard_label
from resourceconsist.runtime.sharding.shard import ShardGate
from resourceconsist.testing import Cluster, async_wait_for, finalizers

RING = "pods"
SERVICES = 6
PODS_EACH = 2


def _replica(
    cluster: Cluster, shard: str, *, sharder: bool = True, ring: str = RING, pod_employer_label: bool = False
) -> Manager:
    """A sharded replica on short Lease timings (the label tests share it)."""
    options = ShardingOptions(
        controller_ring=ring,
        shard_name=shard,
        namespace=cluster.namespace,
        lease_duration=6.0,
        renew_deadline=4.0,
        retry_period=0.5,
        sharder=sharder,
        pod_employer_label=pod_employer_label,
    )
    return Manager(cluster.client, ManagerOptions(namespace=cluster.namespace, sharding=options))


async def _nothing() -> None:
    pass


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
        ring = HashRing(set(replicas))
        placement = {s: ring.shard_of(hash_key("v1", "Service", cluster.namespace, s)) for s in pods_of}

        async def placed() -> bool:
            return await shards() == placement

        # Placed as the ring over both shards says (a first replica may have taken every Service
        # before the second came: those moved through drains, moves too).
        await async_wait_for(placed, timeout=60, message="the Services placed on both shards")
        await async_wait_for(all_served, timeout=60, message="every pod served")
        await async_wait_for(divided, timeout=30, message="each replica caching its Services' pods")

        # The shard holding the most Services leaves: they move, with their pods, to the other.
        leaving = max(replicas, key=lambda shard: sum(1 for s in placement.values() if s == shard))
        staying = next(shard for shard in replicas if shard != leaving)
        await replicas[leaving].stop(timeout=5)
        stopped.add(leaving)
        await async_wait_for(divided, timeout=60, message=f"{staying} caching every Service's pods")
        assert _cached_pods(replicas[staying]) == set().union(*pods_of.values())
        await async_wait_for(all_served, timeout=30, message="every pod still served")
        controller = next(iter(replicas[staying].controllers.values()))
        for _ in range(2):  # passes of every Service on the staying shard after the move
            passes = controller.reconciles
            for service in pods_of:
                controller.queue.add(f"{cluster.namespace}/{service}")
            await async_wait_for(lambda n=passes: controller.reconciles >= n + SERVICES, message="passes")
        assert all_served()
        assert provider.calls["delete_rs"] == 0, "no pod was deregistered by a move"
        assert lost == []
    finally:
        watcher.cancel()
        for name, manager in replicas.items():
            if name not in stopped:
                await manager.stop(timeout=5)


def _lease(shard: str) -> KubeObject:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec = {"holderIdentity": shard, "acquireTime": now, "renewTime": now, "leaseDurationSeconds": 600}
    return {"metadata": {"name": shard, "namespace": "leases"}, "spec": spec}


def _pod(namespace: str, labels: dict[str, str], services: list[str], finalizers: list[str]) -> KubeObject:
    entries = {
        lifecycle.expected_finalizer_key("Service", namespace, s): lifecycle.lifecycle_finalizer(s)
        for s in services
    }
    annotations = (
        {wire.AVAILABLE_CONDITIONS_ANNOTATION: json.dumps({"expectedFinalizers": entries})}
        if services
        else {}
    )
    meta = {
        "name": "p",
        "namespace": namespace,
        "labels": labels,
        "annotations": annotations,
        "finalizers": finalizers,
    }
    return {"metadata": meta, "spec": {}}


async def test_a_shard_keeps_the_pods_its_services_or_the_ring_name_and_any_it_cannot_name(
    cluster: Cluster,
) -> None:
    gate = ShardGate(cluster.client, RING, "shard-a", Informer(cluster.client, kube.LEASE))
    assert gate.leases is not None
    for shard in ("shard-a", "shard-b"):
        gate.leases.store.upsert(_lease(shard))
    ring = HashRing({"shard-a", "shard-b"})
    ns = cluster.namespace

    def placed_on(shard: str, prefix: str = "gone") -> str:
        return next(
            f"{prefix}-{i}"
            for i in range(1000)
            if ring.shard_of(hash_key("v1", "Service", ns, f"{prefix}-{i}")) == shard
        )

    # Another shard's Service, placed there by the ring too (a Service being moved here would be
    # kept: harmless, and not what this asks).
    theirs = placed_on("shard-b", "theirs")
    await cluster.service("mine", labels={shard_label(RING): "shard-a"})
    await cluster.service(theirs, labels={shard_label(RING): "shard-b"})
    factory = InformerFactory(cluster.client, namespace=ns)
    factory.select(kube.SERVICE, gate.selector)
    factory.informer(kube.SERVICE)
    factory.start(asyncio.get_running_loop())
    try:
        await factory.wait_synced()
        pods = ShardPods(gate, factory.reader(), lambda: True)
        guard = lifecycle.guard_finalizer
        assert pods.keeps(_pod(ns, {"app": "mine"}, [], []))  # selected by its Service
        assert not pods.keeps(_pod(ns, {"app": theirs}, [theirs], [guard(theirs)]))
        assert pods.keeps(_pod(ns, {}, ["mine"], [guard("mine")]))  # unselected, still marked
        assert pods.keeps(_pod(ns, {}, [placed_on("shard-a")], []))  # a gone Service the ring places here
        assert not pods.keeps(_pod(ns, {}, [placed_on("shard-b")], []))
        # A finalizer no entry or gate names: its employer is unknown, so the pod is kept.
        assert pods.keeps(_pod(ns, {"app": theirs}, [theirs], [guard(theirs), guard("nameless")]))
        gated = _pod(ns, {}, [], [])
        gated["spec"]["readinessGates"] = [{"conditionType": lifecycle.readiness_gate("mine")}]
        assert pods.keeps(gated)
        gated["spec"]["readinessGates"] = [{"conditionType": lifecycle.readiness_gate(theirs)}]
        assert not pods.keeps(gated)
        assert not pods.keeps(_pod(ns, {"app": "nobody"}, [], []))
        assert ShardPods(gate, factory.reader(), lambda: False).keeps(_pod(ns, {"app": "nobody"}, [], []))
    finally:
        factory.stop()


async def test_a_shards_service_cache_counts_as_synced_only_within_the_informers_that_listed(
    cluster: Cluster,
) -> None:
    """The replica keeps its "Service cache synced" answer (asked on every pod event), but not
    past a stop of its informers: a new Service cache has not listed, and a pod judged against
    it would be let go of as no Service's."""
    manager = _replica(cluster, "shard-a", sharder=False)
    replica = manager.sharding
    assert replica is not None
    assert not replica._services_synced()
    manager.informers.informer(kube.SERVICE)
    manager.informers.start(asyncio.get_running_loop())
    try:
        await manager.informers.wait_synced()
        assert replica._services_synced()
        assert replica._services_synced()  # the kept answer
    finally:
        await asyncio.to_thread(manager.informers.stop)
    assert not replica._services_synced()  # no Service informer now
    manager.informers.informer(kube.SERVICE)  # a new one, not started: not listed
    assert not replica._services_synced()


@pytest.mark.parametrize("runnable_starts", ["at once", "after the pods' list"])
async def test_a_shard_starting_with_its_services_lists_the_pods_once(
    cluster: Cluster, runnable_starts: str
) -> None:
    # Every list of the pods decodes every pod of the watched namespaces, whatever the shard
    # keeps: a shard lists only when its share grew after its last list. Half the Services are
    # this shard's already, half another's (no replica runs it). A runnable (the webhook
    # server) still starting once the pods' list began must not make the Services look new.
    provider = FakeProvider()
    shard_of = {f"svc-{i}": "shard-a" if i % 2 == 0 else "shard-b" for i in range(SERVICES)}
    pods_of = {s: {f"{s}-pod-{j}" for j in range(PODS_EACH)} for s in shard_of}
    for service, shard in shard_of.items():
        await cluster.service(service, labels={shard_label(RING): shard})
        for pod in pods_of[service]:
            await cluster.pod(pod, {"app": service})
            await cluster.set_status(pod, ready=True)
    mine = {p for s, shard in shard_of.items() if shard == "shard-a" for p in pods_of[s]}
    manager = _replica(cluster, "shard-a", sharder=False)  # the Services stay where they are
    await manager.add(DemoAdapter(provider))

    async def start_after_the_pods_list() -> None:
        if runnable_starts != "at once":  # it reads the caches, as the admission webhook does
            manager.informers.informer(kube.SERVICE)
            pods = manager.informers.informer(kube.POD)
            await async_wait_for(lambda: pods.has_synced, timeout=30, message="the pods listed")

    manager.add_runnable(Runnable("slow", start_after_the_pods_list, _nothing))
    await manager.start()
    try:

        def served() -> bool:
            return all(
                pods_of[s] <= provider.serving(f"{cluster.namespace}/{s}")
                for s, shard in shard_of.items()
                if shard == "shard-a"
            )

        await async_wait_for(served, timeout=60, message="every pod of the shard's Services served")
        pods = manager.informers.informer(kube.POD)
        assert {p["metadata"]["name"] for p in pods.store.list()} == mine
        # The first list waited for the shard's Service cache and kept the share; the Services'
        # arrival in that cache, before the list started, asks for none again.
        assert pods.relists == 1, f"the pods were listed {pods.relists} times"
    finally:
        await manager.stop(timeout=5)


async def test_a_burst_of_services_arriving_on_a_shard_costs_one_list_of_the_pods(cluster: Cluster) -> None:
    # Services moving to a shard one after another (a rebalance labels them one by one) ask for
    # one list of every pod of the namespace once they have stopped arriving, not one each; the
    # pass of each still sees every pod it selects. The pods exist first: the shard lets them go.
    provider = FakeProvider()
    pods_of = {f"svc-{i}": {f"svc-{i}-pod-{j}" for j in range(PODS_EACH)} for i in range(SERVICES)}
    for service, pods in pods_of.items():
        for pod in pods:
            await cluster.pod(pod, {"app": service})
            await cluster.set_status(pod, ready=True)
    manager = _replica(cluster, "shard-a", sharder=False)
    await manager.add(DemoAdapter(provider))
    await manager.start()
    try:
        pods = manager.informers.informer(kube.POD)
        await async_wait_for(lambda: pods.has_synced, timeout=30, message="the pod cache synced")
        assert pods.store.list() == [], "no Service is the shard's yet: every pod let go"
        listed = pods.relists
        for service in pods_of:  # one after another, each write answered before the next
            await cluster.service(service, labels={shard_label(RING): "shard-a"})

        def served() -> bool:
            return all(
                pods <= provider.serving(f"{cluster.namespace}/{service}")
                for service, pods in pods_of.items()
            )

        await async_wait_for(served, timeout=60, message="every pod of the burst's Services served")
        assert _cached_pods(manager) == set().union(*pods_of.values())
        assert provider.calls["delete_rs"] == 0
        assert pods.relists == listed + 1, (
            f"{pods.relists - listed} lists for one burst of {SERVICES} Services"
        )
    finally:
        await manager.stop(timeout=5)
