"""Leader election on a real Lease: one of two replicas reconciles; when it stops, the standby
takes over promptly because the leader releases the lease; when it crashes, within the lease
duration plus one retry period. Timings are settable and checked."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import threading
import time

import pytest

from resourceconsist.cluster import kube
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.options import LeaderElectionOptions, ManagerOptions
from resourceconsist.runtime.leaderelection import LeaderElector, parse_lease_time
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import CLI, Cluster, LocalControlPlane, async_wait_for, run_cli


async def test_only_the_leader_reconciles_and_a_standby_takes_over(cluster: Cluster) -> None:
    ns = cluster.namespace
    providers = [FakeProvider(), FakeProvider()]
    managers = []
    for i, provider in enumerate(providers):
        election = LeaderElectionOptions(
            namespace=ns,
            name="demo-leader",
            identity=f"replica-{i}",
            lease_duration=6,
            renew_deadline=4,
            retry_period=0.5,
        )
        manager = Manager(cluster.client, ManagerOptions(namespace=ns, leader_election=election))
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
        ManagerOptions(
            namespace=ns,
            leader_election=LeaderElectionOptions(
                namespace=ns, name="held", identity="me", lease_duration=3, renew_deadline=2, retry_period=0.2
            ),
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


async def test_a_leader_renews_while_the_loops_executor_is_full(cluster: Cluster) -> None:
    """Every thread of the event loop's executor blocked (passes waiting for a cache, a burst of
    writes at a cold start): the leader still renews its Lease on its own threads, and keeps
    leading past several lease durations instead of stepping down while merely busy."""
    ns = cluster.namespace
    election = LeaderElectionOptions(
        namespace=ns,
        name="busy",
        identity="busy-leader",
        lease_duration=3,
        renew_deadline=2,
        retry_period=0.2,
    )
    manager = Manager(cluster.client, ManagerOptions(namespace=ns, leader_election=election))
    await manager.add(DemoAdapter(FakeProvider()))
    await manager.start()
    release = threading.Event()
    loop = asyncio.get_running_loop()
    try:
        await async_wait_for(lambda: manager.leading, timeout=20, message="leading")
        stepped_down: list[float] = []
        watching = asyncio.create_task(_record_step_downs(manager, stepped_down))
        # Far more blocking calls than the executor has threads: whatever else asks it waits.
        blocked = [loop.run_in_executor(None, release.wait) for _ in range(100)]
        flooded = datetime.datetime.now(datetime.UTC)

        await renewed_after(cluster, "busy", flooded + datetime.timedelta(seconds=3 * 3), "after the flood")
        assert stepped_down == [], "the leader stepped down while only its executor was busy"
        assert manager.leading
        watching.cancel()
        release.set()
        await asyncio.gather(*blocked)
    finally:
        release.set()
        await manager.stop(timeout=5)


async def test_a_leader_slow_to_start_keeps_renewing_and_a_failed_start_steps_down(cluster: Cluster) -> None:
    """Starting to lead (controllers waiting for their caches: minutes at 100k pods) runs beside
    the campaign, so the Lease stays renewed meanwhile; a start that fails steps down and
    campaigns again, never leaving a replica that holds the Lease and runs nothing."""
    options = LeaderElectionOptions(
        namespace=cluster.namespace,
        name="slow",
        identity="slow",
        lease_duration=3,
        renew_deadline=2,
        retry_period=0.2,
    )
    elector = LeaderElector(cluster.client, options)
    release = asyncio.Event()
    starts: list[float] = []
    stops: list[float] = []

    async def start() -> None:
        starts.append(time.monotonic())
        if len(starts) == 1:
            await release.wait()  # the caches are filling
            raise TimeoutError("informer for pods did not sync within 60s")

    async def stop_leading() -> None:
        stops.append(time.monotonic())

    stop = asyncio.Event()
    campaign = asyncio.create_task(elector.run(start, stop_leading, stop))
    try:
        await async_wait_for(lambda: starts, timeout=20, message="leading")
        began = datetime.datetime.now(datetime.UTC)

        await renewed_after(cluster, "slow", began + datetime.timedelta(seconds=3 * 3), "during the start")
        assert elector.leading and stops == [] and len(starts) == 1
        release.set()  # the start fails
        await async_wait_for(
            lambda: len(starts) >= 2, timeout=30, message="leading again after a failed start"
        )
        assert len(stops) == 1 and stops[0] < starts[1]
        assert not campaign.done()
        await async_wait_for(lambda: elector.leading, timeout=10, message="leading")
    finally:
        release.set()
        stop.set()
        await campaign


async def renewed_after(cluster: Cluster, lease: str, moment: datetime.datetime, when: str) -> None:
    """Wait (30 s at most) until the Lease ``lease`` carries a renew time later than ``moment``."""

    async def renewed() -> bool:
        found = await cluster.get(kube.LEASE, lease)
        renew_time = parse_lease_time((found or {}).get("spec", {}).get("renewTime"))
        return renew_time is not None and renew_time > moment

    await async_wait_for(renewed, timeout=30, message=f"the Lease {lease} renewed {when}")


async def _record_step_downs(manager: Manager, into: list[float]) -> None:
    while True:
        if not manager.leading:
            into.append(time.monotonic())
        await asyncio.sleep(0.05)


async def test_after_a_leader_crash_the_standby_leads_within_lease_duration_plus_a_retry_period(
    cluster: Cluster, control_plane: LocalControlPlane
) -> None:
    """The leader is a ``resourceconsist run --leader-elect`` process killed with SIGKILL: it
    never releases the Lease, so the standby must wait for it to expire, and no longer."""
    ns = cluster.namespace
    lease_duration, renew_deadline, retry_period = 4, 3, 0.5
    leader = await asyncio.to_thread(
        subprocess.Popen,
        [
            *CLI,
            "run",
            "--adapter",
            "demo",
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "--namespace",
            ns,
            "--health-probe-bind-address",
            "127.0.0.1:0",
            "--metrics-bind-address",
            "0",
            "--leader-elect",
            "--leader-election-namespace",
            ns,
            "--leader-election-id",
            "crash-leader",
            "--lease-duration",
            str(lease_duration),
            "--renew-deadline",
            str(renew_deadline),
            "--retry-period",
            str(retry_period),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    standby: Manager | None = None
    try:

        async def held_by_the_process() -> bool:
            lease = await cluster.get(kube.LEASE, "crash-leader")
            return bool(lease and lease["spec"].get("holderIdentity"))

        await async_wait_for(held_by_the_process, timeout=60, message="the CLI process leading")
        lease = await cluster.get(kube.LEASE, "crash-leader")
        assert lease is not None
        # The CLI's timings reached the Lease.
        assert lease["spec"]["leaseDurationSeconds"] == lease_duration
        election = LeaderElectionOptions(
            namespace=ns,
            name="crash-leader",
            identity="standby",
            lease_duration=lease_duration,
            renew_deadline=renew_deadline,
            retry_period=retry_period,
        )
        standby = Manager(cluster.client, ManagerOptions(namespace=ns, leader_election=election))
        await standby.add(DemoAdapter(FakeProvider()))
        await standby.start()
        elector = standby._elector
        assert elector is not None
        await async_wait_for(lambda: elector.attempts >= 3, timeout=20, message="the standby campaigning")
        assert not standby.leading
        assert standby.metrics.registry.get_sample_value("resourceconsist_leader") == 0
        # client-go's series of the Lease too (docs/observability.md).
        lease_status = {"name": "crash-leader"}
        assert standby.metrics.registry.get_sample_value("leader_election_master_status", lease_status) == 0

        leader.kill()
        await asyncio.to_thread(leader.wait)
        # The last renewal was at most one retry period before the kill; the lease expires
        # lease_duration after it, and the standby looks once per retry period (plus the time of
        # one API round trip, well under a second here).
        await async_wait_for(
            lambda: standby is not None and standby.leading,
            timeout=lease_duration + retry_period + 1.0,
            interval=0.05,
            message="the standby leading within lease duration + one retry period",
        )
        taken = await cluster.get(kube.LEASE, "crash-leader")
        assert taken is not None
        assert taken["spec"]["holderIdentity"] == "standby"
        assert standby.metrics.registry.get_sample_value("resourceconsist_leader") == 1
        assert standby.metrics.registry.get_sample_value("leader_election_master_status", lease_status) == 1
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()
        if standby is not None:
            await standby.stop(timeout=5)


def test_leader_election_timings_are_checked_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match=r"renew deadline .* must be longer than the retry period"):
        LeaderElectionOptions(namespace="ns", name="l", lease_duration=15, renew_deadline=2, retry_period=2)
    with pytest.raises(ValueError, match=r"lease duration .* must be longer than the renew deadline"):
        LeaderElectionOptions(namespace="ns", name="l", lease_duration=10, renew_deadline=10, retry_period=2)
    done = run_cli(
        "run", "--adapter", "demo", "--leader-elect", "--lease-duration", "5", "--renew-deadline", "8"
    )
    assert done.returncode == 2
    assert "lease duration (5s) must be longer than the renew deadline (8s)" in done.stderr


async def test_the_leader_renews_without_a_read_and_counts_the_slow_path(cluster: Cluster) -> None:
    """client-go's fast path: the leader renews on the Lease it last wrote, one request per
    renewal; when someone else wrote the Lease meanwhile, that write meets a 409 and the
    leader reads the Lease again (the slow path), stays leader, and counts it in
    ``leader_election_slowpath_total``."""
    ns = cluster.namespace
    election = LeaderElectionOptions(
        namespace=ns, name="fast", identity="replica-0", lease_duration=6, renew_deadline=4, retry_period=0.3
    )
    manager = Manager(cluster.client, ManagerOptions(namespace=ns, leader_election=election))

    def slowpaths() -> float:
        found = manager.metrics.registry.get_sample_value("leader_election_slowpath_total", {"name": "fast"})
        return -1.0 if found is None else found

    assert slowpaths() == 0  # shown from the start
    await manager.start()
    try:
        await async_wait_for(lambda: manager.leading, timeout=20, message="leading")

        def lease_requests() -> tuple[int, int]:
            counted = manager.client.requests_by_resource
            return counted["get leases"], counted["patch leases"]

        reads, writes = lease_requests()
        await async_wait_for(lambda: lease_requests()[1] >= writes + 5, timeout=20, message="five renewals")
        assert lease_requests()[0] == reads, "a renewal on the fast path reads nothing"
        assert slowpaths() == 0
        # Someone else writes the Lease: the next renewal's precondition fails.
        await cluster.patch(kube.LEASE, "fast", {"metadata": {"labels": {"touched": "by-admin"}}})
        await async_wait_for(lambda: slowpaths() == 1, timeout=20, message="one slow path")
        renewed = lease_requests()[1]
        await async_wait_for(lambda: lease_requests()[1] >= renewed + 2, timeout=20, message="renewing again")
        assert manager.leading and slowpaths() == 1
        lease = await cluster.get(kube.LEASE, "fast")
        assert lease is not None and lease["spec"]["holderIdentity"] == "replica-0"
    finally:
        await manager.stop(timeout=5)
