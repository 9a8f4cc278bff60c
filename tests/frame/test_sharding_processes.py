"""Sharding the way a cluster runs it (docs/scaling.md): three `resourceconsist run --sharding`
processes of the demo adapter share thirty Services; one is killed with SIGKILL (no Lease
released, nothing cleaned up) and its Services move to the two others once its Lease has been
silent for two lease durations; the survivors keep reconciling new Services. And four processes
starting cold over Ready pods guard every pod without a pod write answered 409 Conflict."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.sharding.ring import HashRing, hash_key, shard_label
from resourceconsist.testing import Cluster, LocalControlPlane, async_wait_for, finalizers
from resourceconsist.testing.controlplane import free_port
from resourceconsist.testing.process import CommandProcess

RING = "demo"
SERVICES = 30
LEASE_SECONDS = 6.0
#: The cold start: replicas, Services and pods per Service.
COLD_REPLICAS, COLD_SERVICES, COLD_PODS = 4, 8, 25
_WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION"}


def _replica(kubeconfig: Path, namespace: str, shard: str) -> CommandProcess:
    port = free_port()
    args = [
        *("run", "--adapter", "demo", "--kubeconfig", str(kubeconfig), "--namespace", namespace),
        *("--sharding", "--controller-ring", RING, "--shard-name", shard),
        *("--leader-election-namespace", namespace, "--lease-duration", str(LEASE_SECONDS)),
        *("--renew-deadline", "4", "--retry-period", "0.5"),
        *("--health-probe-bind-address", f"127.0.0.1:{port}", "--metrics-bind-address", "0"),
    ]
    return CommandProcess(args, dict(os.environ), port)


async def _labels(cluster: Cluster) -> dict[str, str]:
    listing = await cluster.call(cluster.client.list, kube.SERVICE, cluster.namespace)
    return {
        o["metadata"]["name"]: (o["metadata"].get("labels") or {}).get(shard_label(RING), "")
        for o in listing.get("items") or []
    }


def _placed(namespace: str, shards: set[str], names: list[str]) -> dict[str, str]:
    ring = HashRing(shards)
    return {n: ring.shard_of(hash_key("v1", "Service", namespace, n)) or "" for n in names}


async def test_a_killed_shard_process_loses_its_services_to_the_others(
    cluster: Cluster, control_plane: LocalControlPlane
) -> None:
    ns = cluster.namespace
    names = [f"svc-{i}" for i in range(SERVICES)]
    replicas = [await asyncio.to_thread(_replica, control_plane.kubeconfig, ns, f"p-{i}") for i in range(3)]
    try:
        for replica in replicas:
            await async_wait_for(replica.ready, timeout=90, message="the replica ready")
        for name in names:
            await cluster.service(name)
        three = _placed(ns, {"p-0", "p-1", "p-2"}, names)

        async def assigned(expected: dict[str, str]) -> bool:
            return await _labels(cluster) == expected

        await async_wait_for(lambda: assigned(three), timeout=90, message="the Services assigned by the ring")

        async def finalized(name: str) -> bool:
            obj = await cluster.get(kube.SERVICE, name)
            return obj is not None and wire.CLEAN_FINALIZER in (obj["metadata"].get("finalizers") or [])

        for name in names:
            await async_wait_for(lambda n=name: finalized(n), timeout=60, message=f"{name} reconciled")

        killed = time.monotonic()
        replicas[2].process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(replicas[2].process.wait, 10)
        two = _placed(ns, {"p-0", "p-1"}, names)
        await async_wait_for(
            lambda: assigned(two),
            timeout=2 * LEASE_SECONDS + 30,
            message="p-2's Services moved to p-0 and p-1",
        )
        assert time.monotonic() - killed >= LEASE_SECONDS
        lease = await cluster.get(kube.LEASE, "p-2")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == wire.SHARD_LEASE_TAKEN_BY_SHARDER

        # The survivors keep reconciling: a new Service is assigned and gets its first pass.
        await cluster.service("late")
        late = _placed(ns, {"p-0", "p-1"}, ["late"])["late"]
        await async_wait_for(
            lambda: assigned({**two, "late": late}), timeout=60, message="the late Service assigned"
        )
        await async_wait_for(lambda: finalized("late"), timeout=60, message="the late Service reconciled")
    finally:
        for replica in replicas:
            await asyncio.to_thread(replica.stop, 20)


async def _ready_pods(cluster: Cluster, services: list[str], pods_each: int) -> list[str]:
    """``pods_each`` Ready pods behind each Service (made before any replica runs)."""
    names = [(f"{svc}-{j}", svc) for svc in services for j in range(pods_each)]

    async def make(name: str, svc: str) -> None:
        await cluster.pod(name, {"app": svc})
        await cluster.set_status(name)

    await asyncio.gather(*(make(name, svc) for name, svc in names))
    return [name for name, _ in names]


async def test_replicas_starting_cold_guard_every_pod_without_a_conflicting_write(
    cluster: Cluster, control_plane: LocalControlPlane
) -> None:
    """Four replicas start at once over Ready pods: as each joins, the sharder moves Services to
    it, and each replica writes its pods twice (guard, then lifecycle finalizer) while its pod
    watch, decoding every pod event of the namespace on a busy machine, lags behind its own
    writes. Each pod has one owner at a time, and a new owner lists the pods after the old one
    let go, so no writer's view of a pod may be older than the pod: not one pod write may be
    answered 409 Conflict (docs/scaling.md, "Conflicts at a cold start")."""
    ns = cluster.namespace
    services = [f"svc-{i}" for i in range(COLD_SERVICES)]
    for name in services:
        await cluster.service(name)
    pods = await _ready_pods(cluster, services, COLD_PODS)
    before = await asyncio.to_thread(control_plane.requests_served, "pods", _WRITE_VERBS)
    replicas = [
        await asyncio.to_thread(_replica, control_plane.kubeconfig, ns, f"c-{i}")
        for i in range(COLD_REPLICAS)
    ]
    try:

        async def guarded() -> bool:
            for replica in replicas:
                replica.ready()  # raises, with its output, if a replica ended
            listing = await cluster.call(cluster.client.list, kube.POD, ns)
            return all(
                lifecycle.lifecycle_finalizer(p["metadata"]["labels"]["app"]) in finalizers(p)
                for p in listing["items"]
            )

        await async_wait_for(guarded, timeout=240, interval=0.5, message="every pod guarded by its Service")
    finally:
        # Stopped before counting: every write the replicas ever made is in the count.
        for replica in replicas:
            await asyncio.to_thread(replica.stop, 20)
    after = await asyncio.to_thread(control_plane.requests_served, "pods", _WRITE_VERBS)
    writes = after - before
    assert writes["200"] >= len(pods), f"the API server's counters were not read: {dict(writes)}"
    assert writes["409"] == 0, (
        f"{writes['409']} pod writes answered 409 Conflict for {len(pods)} pods "
        f"({writes['200'] / len(pods):.2f} pod writes per pod landed)"
    )
