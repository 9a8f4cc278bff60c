"""The provider budget across shards (docs/scaling.md, "The provider budget across shards"): a
sharded replica takes one over the ring's ready shards of the configured rate, and follows the
ring as shards come and go, read from the shard Leases on a real API server.

The other shards are Leases written here as a shard writes its own (held by its name, renewed
now, the ring's label): what the replica sees of them is all the share depends on.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pytest

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.flow import budget
from resourceconsist.options import ManagerOptions, ProviderBudgetOptions, ShardingOptions
from resourceconsist.runtime.leaderelection import lease_time
from resourceconsist.runtime.manager import Manager
from resourceconsist.runtime.sharding.ring import Shard, ShardState, budget_share
from resourceconsist.testing import Cluster, async_wait_for

RING = "budget"
RATE = 60.0


@pytest.fixture
def process_budget() -> Iterator[None]:
    """The process's budget settings are global: put the default back after the test."""
    try:
        yield
    finally:
        budget.configure(ProviderBudgetOptions())


def _shard_lease(name: str, *, held: bool = True) -> dict[str, object]:
    now = lease_time(datetime.datetime.now(datetime.UTC))
    return {
        "metadata": {"name": name, "labels": {wire.SHARD_RING_LABEL: RING}},
        "spec": {
            "holderIdentity": name if held else None,
            "leaseDurationSeconds": 600,
            "acquireTime": now,
            "renewTime": now,
        },
    }


def test_one_replica_takes_one_over_the_ready_shards() -> None:
    moment = datetime.datetime.now(datetime.UTC)
    duration = datetime.timedelta(seconds=15)

    def shard(name: str, state: ShardState) -> Shard:
        return Shard(name, state, moment, duration)

    assert budget_share([]) == 1.0
    assert budget_share([shard("a", ShardState.READY)]) == 1.0
    assert budget_share([shard(n, ShardState.READY) for n in "abcd"]) == 0.25
    # Only ready shards spend: an expired, uncertain or dead one is not counted.
    others = [shard("b", ShardState.EXPIRED), shard("c", ShardState.UNCERTAIN), shard("d", ShardState.DEAD)]
    assert budget_share([shard("a", ShardState.READY), *others]) == 1.0


async def test_a_sharded_replica_takes_its_share_as_shards_come_and_go(
    cluster: Cluster, process_budget: None
) -> None:
    sharding = ShardingOptions(
        controller_ring=RING,
        shard_name="a",
        namespace=cluster.namespace,
        lease_duration=6.0,
        renew_deadline=4.0,
        retry_period=0.5,
    )
    options = ManagerOptions(
        namespace=cluster.namespace,
        sharding=sharding,
        provider_budget=ProviderBudgetOptions(rate=RATE, burst=5),
    )
    manager = Manager(cluster.client, options)
    await manager.add(DemoAdapter(FakeProvider()))
    account = budget.budget_for("sharding-budget-test")

    async def spends(rate: float) -> bool:
        found = account.snapshot().rate
        return found is not None and abs(found - rate) < 1e-9

    await manager.start()
    try:
        await async_wait_for(lambda: spends(RATE), timeout=30, message="alone on the ring: the whole rate")
        for other in ("b", "c"):
            await cluster.call(cluster.client.create, kube.LEASE, cluster.namespace, _shard_lease(other))
        await async_wait_for(lambda: spends(RATE / 3), timeout=30, message="three ready shards: a third each")
        # A shard released (a graceful stop) spends nothing any more: the others take its part.
        await cluster.patch(kube.LEASE, "c", _shard_lease("c", held=False))
        await async_wait_for(lambda: spends(RATE / 2), timeout=30, message="one released: a half each")
        await cluster.delete(kube.LEASE, "b")
        await async_wait_for(lambda: spends(RATE), timeout=30, message="alone again: the whole rate")
    finally:
        await manager.stop(timeout=5)
