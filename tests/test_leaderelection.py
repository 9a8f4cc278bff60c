"""Leader election on a real Lease: one of two replicas reconciles; when it stops, the standby
takes over promptly because the leader releases the lease."""

from __future__ import annotations

import time

from resourceconsist import kube
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.leaderelection import LeaderElectionConfig
from resourceconsist.manager import Manager
from resourceconsist.testing import Cluster, async_wait_for


async def test_only_the_leader_reconciles_and_a_standby_takes_over(cluster: Cluster) -> None:
    ns = cluster.namespace
    providers = [FakeProvider(), FakeProvider()]
    managers = []
    for i, provider in enumerate(providers):
        election = LeaderElectionConfig(
            namespace=ns,
            name="demo-leader",
            identity=f"replica-{i}",
            lease_duration=6,
            renew_deadline=4,
            retry_period=0.5,
        )
        manager = Manager(cluster.client, namespace=ns, leader_election=election)
        await manager.add(DemoAdapter(provider))
        await manager.start()
        managers.append(manager)
    try:
        await cluster.service("svc")
        await async_wait_for(
            lambda: sum(1 for m in managers if m.leading) == 1, timeout=20, message="exactly one leader"
        )
        leader = next(i for i, m in enumerate(managers) if m.leading)
        standby = 1 - leader
        await async_wait_for(
            lambda: f"{ns}/svc" in providers[leader].vips, timeout=20, message="the leader serving"
        )
        assert providers[standby].vips == {}
        assert not managers[standby].leading

        lease = await cluster.get(kube.LEASE, "demo-leader")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == f"replica-{leader}"

        stopped = time.monotonic()
        await managers[leader].stop(timeout=5)
        await async_wait_for(lambda: managers[standby].leading, timeout=10, message="the standby taking over")
        # Released, not expired: the takeover is much faster than the 6 s lease duration.
        assert time.monotonic() - stopped < 5
        await cluster.patch(kube.SERVICE, "svc", {"metadata": {"labels": {"poke": "1"}}})
        await async_wait_for(
            lambda: f"{ns}/svc" in providers[standby].vips, timeout=20, message="standby serving"
        )
    finally:
        for manager in managers:
            await manager.stop(timeout=5)


async def test_a_held_lease_is_not_taken_before_it_expires(cluster: Cluster) -> None:
    ns = cluster.namespace
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    await cluster.call(
        cluster.client.create,
        kube.LEASE,
        ns,
        {
            "metadata": {"name": "held"},
            "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600, "renewTime": now},
        },
    )
    manager = Manager(
        cluster.client,
        namespace=ns,
        leader_election=LeaderElectionConfig(
            namespace=ns, name="held", identity="me", lease_duration=3, renew_deadline=2, retry_period=0.2
        ),
    )
    await manager.add(DemoAdapter(FakeProvider()))
    await manager.start()
    try:
        elector = manager._elector
        assert elector is not None
        lease_before = await cluster.get(kube.LEASE, "held")
        await async_wait_for(lambda: elector.attempts >= 5, timeout=10, message="five campaign rounds")
        assert not manager.leading
        assert manager.controllers["demo-controller"].reconciles == 0
        lease_after = await cluster.get(kube.LEASE, "held")
        assert lease_before is not None
        assert lease_after is not None
        assert lease_after["spec"]["holderIdentity"] == "someone-else"
        assert lease_after["metadata"]["resourceVersion"] == lease_before["metadata"]["resourceVersion"]
    finally:
        await manager.stop(timeout=5)
