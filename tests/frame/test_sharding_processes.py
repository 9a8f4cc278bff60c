"""Sharding the way a cluster runs it (docs/scaling.md): three `resourceconsist run --sharding`
processes of the demo adapter share thirty Services; one is killed with SIGKILL (no Lease
released, nothing cleaned up) and its Services move to the two others once its Lease has been
silent for two lease durations; the survivors keep reconciling new Services."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from resourceconsist import kube, wire
from resourceconsist.sharding.ring import HashRing, hash_key, shard_label
from resourceconsist.testing import Cluster, LocalControlPlane, async_wait_for
from resourceconsist.testing.controlplane import free_port
from resourceconsist.testing.process import CommandProcess

RING = "demo"
SERVICES = 30
LEASE_SECONDS = 6.0


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
