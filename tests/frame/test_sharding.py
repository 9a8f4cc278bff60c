"""Active-active sharding on a real API server (docs/scaling.md): three replicas share thirty
Services of the demo adapter; each Service is acted on by exactly one replica at any moment;
a replica that dies silently loses its Services to the others once its Lease has been silent for
two lease durations; a replica that joins gets its share through the drain handshake.

"Acted on" is what each replica's gate lets through (a Service in its own, label-selected cache
with its shard label and no drain label) and what its workers hold. A sampler reads every
replica together, on the event loop they share, every few milliseconds for the whole test, and
records any Service two replicas would act on at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from resourceconsist import wire
from resourceconsist.adapter import Employer, ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import Informer, WatchEvent
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.options import ManagerOptions, ShardingOptions
from resourceconsist.runtime.leaderelection import lease_time, parse_lease_time
from resourceconsist.runtime.manager import Manager
from resourceconsist.runtime.sharding.ring import HashRing, drain_label, hash_key, shard_label
from resourceconsist.runtime.sharding.sharder import Sharder
from resourceconsist.testing import Cluster, async_wait_for

RING = "demo"
SERVICES = 30
LEASE_SECONDS = 6.0


class Replica:
    """One replica: a manager with its own demo provider, sharing the test's event loop."""

    def __init__(
        self,
        cluster: Cluster,
        shard: str,
        *,
        release_on_cancel: bool = True,
        sharder: bool = True,
        shutdown_timeout: float = 30.0,
        placement: str = "ring",
        settle: float | None = None,
    ) -> None:
        self.shard = shard
        self.provider = FakeProvider()
        options = ShardingOptions(
            controller_ring=RING,
            shard_name=shard,
            namespace=cluster.namespace,
            lease_duration=LEASE_SECONDS,
            renew_deadline=4.0,
            retry_period=0.5,
            release_on_cancel=release_on_cancel,
            sharder=sharder,
            placement=placement,
            **({} if settle is None else {"sharder_settle": settle}),
        )
        self.manager = Manager(
            cluster.client,
            ManagerOptions(namespace=cluster.namespace, sharding=options, shutdown_timeout=shutdown_timeout),
        )
        self.running = False

    async def start(self, adapter: DemoAdapter | None = None) -> None:
        await self.manager.add(adapter or DemoAdapter(self.provider))
        await self.manager.start()
        self.running = True

    async def stop(self) -> None:
        # Sampled until stopped: a pass finishing during the stop still counts.
        await self.manager.stop(timeout=5)
        self.running = False

    def acting_on(self) -> set[str]:
        """The Services this replica may act on now: those its gate lets a pass run on, and those
        a worker holds (a pass, or the let-go write itself, counted as acting to be strict)."""
        sharding = self.manager.sharding
        if not self.running or sharding is None:
            return set()
        gate = sharding.gate
        # A worker still holding a key whose let-go write has landed runs no pass of it: the
        # write itself counts, not the moments until the worker gives the key back.
        held = {
            key for c in self.manager.controllers.values() for key in c.queue.processing()
        } - gate.let_go_of
        if not self.manager.leading or not gate.open:
            # A closed gate (the replica stops) lets no pass start: only the passes running count.
            return held
        store = self.manager.informers.informer(kube.SERVICE).store
        return held | {kube.object_key(obj) for obj in store.list() if gate.assigned(obj)}


async def stop_running(replicas: list[Replica]) -> None:
    """Stop those of ``replicas`` still running (a test's ``finally``)."""
    for replica in replicas:
        if replica.running:
            await replica.stop()


@contextmanager
def sampling(replicas: list[Replica]) -> Iterator[list[str]]:
    """Check, every few milliseconds until the block ends, that no Service is acted on by two
    replicas; yields the list of violations found (empty when none)."""
    violations: list[str] = []
    samples = [0]

    async def sample() -> None:
        while True:
            seen: dict[str, str] = {}
            for replica in replicas:
                for key in replica.acting_on():
                    if key in seen:
                        violations.append(f"{key} acted on by {seen[key]} and {replica.shard}")
                    seen[key] = replica.shard
            samples[0] += 1
            await asyncio.sleep(0.005)

    task = asyncio.get_running_loop().create_task(sample())
    try:
        yield violations
    finally:
        task.cancel()
    assert samples[0] > 0


async def shards_of(cluster: Cluster) -> dict[str, str]:
    """Each Service's shard label ("" when unassigned)."""
    listing = await cluster.call(cluster.client.list, kube.SERVICE, cluster.namespace)
    return {
        obj["metadata"]["name"]: (obj["metadata"].get("labels") or {}).get(shard_label(RING), "")
        for obj in listing.get("items") or []
    }


def placed(cluster: Cluster, shards: set[str], names: list[str]) -> dict[str, str]:
    """Where the ring over ``shards`` places each of the Services ``names``."""
    ring = HashRing(shards)
    return {name: ring.shard_of(hash_key("v1", "Service", cluster.namespace, name)) or "" for name in names}


def names_where(cluster: Cluster, count: int, wanted: Callable[[list[str]], bool]) -> list[str]:
    """The first ``count`` consecutive names ``svc-<i>`` (from ``svc-0``, in steps of ``count``)
    for which ``wanted`` holds: where the ring places a name depends on the test's namespace, so
    a test that needs some names on some shard picks them, deterministically."""
    for start in range(0, 1000 * count, count):
        names = [f"svc-{i}" for i in range(start, start + count)]
        if wanted(names):
            return names
    raise AssertionError(f"no {count} consecutive names svc-<i> place as the test needs")


def served(replicas: list[Replica], cluster: Cluster, expected: dict[str, str]) -> bool:
    """Each Service's VIP is on the provider of the replica it is assigned to."""
    by_shard = {r.shard: r for r in replicas}
    return all(
        f"{cluster.namespace}/{name}" in by_shard[shard].provider.vips for name, shard in expected.items()
    )


async def test_three_replicas_share_thirty_services_one_owner_at_a_time(cluster: Cluster) -> None:
    replicas = [
        Replica(cluster, "shard-0"),
        Replica(cluster, "shard-1"),
        Replica(cluster, "shard-2", release_on_cancel=False),
    ]
    joiner = Replica(cluster, "shard-3")
    everyone = [*replicas, joiner]
    with sampling(everyone) as violations:
        try:
            for replica in replicas:
                await replica.start()
            three_shards = {"shard-0", "shard-1", "shard-2"}
            # Each shard gets some, and so does the joiner of step 3.
            names = names_where(
                cluster,
                SERVICES,
                lambda names: (
                    set(placed(cluster, three_shards, names).values()) == three_shards
                    and "shard-3" in placed(cluster, {"shard-0", "shard-1", "shard-3"}, names).values()
                ),
            )
            for name in names:
                await cluster.service(name)

            # 1. Every Service lands on the shard the ring places it on, and is served there.
            three = placed(cluster, three_shards, names)
            await async_wait_for(
                lambda: _labels_are(cluster, three),
                timeout=60,
                message="the thirty Services assigned as the ring places them",
            )
            await async_wait_for(
                lambda: served(replicas, cluster, three),
                timeout=60,
                message="each Service served by its shard",
            )
            # Each replica caches only its share.
            for replica in replicas:
                mine = {n for n, s in three.items() if s == replica.shard}
                cached = {
                    o["metadata"]["name"]
                    for o in replica.manager.informers.informer(kube.SERVICE).store.list()
                }
                assert cached == mine
                # ... and did the work of its share alone: its provider holds only their VIPs.
                assert {k.rpartition("/")[2] for k in replica.provider.vips} == mine

            # A gone employer's garbage pass would run on the one replica its key hashes to (each
            # replica reads the ring from the Leases at most once a second).
            def garbage_passes() -> dict[str, set[str]]:
                return {
                    name: {
                        r.shard
                        for r in replicas
                        for c in r.manager.controllers.values()
                        if c.handle.watches(f"{cluster.namespace}/{name}")
                    }
                    for name in three
                }

            await async_wait_for(
                lambda: garbage_passes() == {name: {shard} for name, shard in three.items()},
                timeout=10,
                message="each key's garbage pass on its ring owner alone",
            )

            # 2. shard-2 dies without releasing its Lease: its Services move once the Lease has
            # been silent for two lease durations (the protocol's rule), and are served again.
            killed = time.monotonic()
            await replicas[2].stop()
            two = placed(cluster, {"shard-0", "shard-1"}, names)
            await async_wait_for(
                lambda: _labels_are(cluster, two),
                timeout=2 * LEASE_SECONDS + 20,
                message="shard-2's Services reassigned to the live shards",
            )
            moved_after = time.monotonic() - killed
            assert moved_after >= LEASE_SECONDS, (
                f"moved {moved_after:.1f}s after the kill, before the lease expired"
            )
            await async_wait_for(
                lambda: served(replicas, cluster, two), timeout=60, message="the moved Services served again"
            )
            lease = await cluster.get(kube.LEASE, "shard-2")
            assert lease is not None
            assert lease["spec"]["holderIdentity"] == wire.SHARD_LEASE_TAKEN_BY_SHARDER
            # The replica running the sharder reports the dead shard (docs/observability.md).
            await async_wait_for(
                lambda: any(
                    r.manager.sharding is not None
                    and r.manager.sharding.sharder is not None
                    and r.manager.metrics.registry.get_sample_value(
                        "resourceconsist_sharder_shards", {"state": "dead"}
                    )
                    == 1
                    for r in replicas[:2]
                ),
                timeout=30,
                message="resourceconsist_sharder_shards{state=dead} 1",
            )

            # 3. shard-3 joins: its share moves to it through the drain handshake.
            drained_before = sum(
                r.manager.sharding.gate.drained for r in replicas[:2] if r.manager.sharding is not None
            )
            await joiner.start()
            with_joiner = placed(cluster, {"shard-0", "shard-1", "shard-3"}, names)
            to_joiner = {n for n, s in with_joiner.items() if s == "shard-3"}
            assert to_joiner  # chosen so by names_where
            await async_wait_for(
                lambda: _labels_are(cluster, with_joiner),
                timeout=60,
                message="the new shard's share moved to it",
            )
            await async_wait_for(
                lambda: served([*replicas[:2], joiner], cluster, with_joiner),
                timeout=60,
                message="the new shard serving its share",
            )
            drained = sum(
                r.manager.sharding.gate.drained for r in replicas[:2] if r.manager.sharding is not None
            )
            # Each Service that moved to a live shard's successor was let go of by that shard.
            assert drained - drained_before == len(to_joiner)
            reported = sum(
                r.manager.metrics.registry.get_sample_value("resourceconsist_shard_drains_total") or 0
                for r in replicas[:2]
            )
            assert reported == drained
        finally:
            await stop_running(everyone)
    assert violations == [], violations[:5]


async def _labels_are(cluster: Cluster, expected: dict[str, str]) -> bool:
    return await shards_of(cluster) == expected


class TimedDemo(DemoAdapter):
    """The demo adapter, recording when each pass of each Service asks for the expected employer
    and holding the passes of ``held`` while ``hold`` is not set (a slow provider)."""

    def __init__(self, shard: str, provider: FakeProvider) -> None:
        super().__init__(provider)
        self.shard = shard
        self.held = ""
        self.hold = threading.Event()
        #: (Service name, shard, start, end) of each pass, as it asked for the expected employer.
        self.passes: list[tuple[str, str, float, float]] = []
        #: Each pass here, in order: its Service and whether it was a full one (no ``changed``).
        self.full: list[tuple[str, bool]] = []
        #: Passes waiting on ``hold`` now.
        self.waiting = 0

    def get_expected_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        name = employer["metadata"]["name"]
        started = time.monotonic()
        if name == self.held:
            self.waiting += 1
            self.hold.wait(60)
            self.waiting -= 1
        self.passes.append((name, self.shard, started, time.monotonic()))
        self.full.append((name, ctx.changed is None))
        return super().get_expected_employer(ctx, employer)


async def hold_a_pass(
    cluster: Cluster, replicas: list[Replica], adapters: dict[str, TimedDemo], home: dict[str, str], held: str
) -> None:
    """Start ``replicas``, create the Services of ``home``, wait until each is on its shard there
    and ``held`` had a first pass, then start a pass of ``held`` that its shard holds in the middle."""
    owner = adapters[home[held]]
    for replica in replicas:
        await replica.start(adapters[replica.shard])
    for name in home:
        await cluster.service(name)
    await async_wait_for(lambda: _labels_are(cluster, home), timeout=60, message="assigned")
    await async_wait_for(lambda: any(p[0] == held for p in owner.passes), timeout=60, message="a first pass")
    owner.held = held
    await cluster.patch(kube.SERVICE, held, {"metadata": {"annotations": {"touch": "1"}}})
    await async_wait_for(lambda: owner.waiting > 0, timeout=30, message="a pass held")


async def first_pass_once_moved(cluster: Cluster, names: list[str], new_owner: TimedDemo, held: str) -> float:
    """Wait until the Services ``names`` are all on ``new_owner``'s shard (moved there once the old
    shard's Lease went silent) and ``held`` had its first pass there; return when it started."""
    moved = placed(cluster, {new_owner.shard}, names)
    await async_wait_for(
        lambda: _labels_are(cluster, moved),
        timeout=2 * LEASE_SECONDS + 30,
        message=f"the Services moved to {new_owner.shard} once the old shard's Lease went silent",
    )
    await async_wait_for(
        lambda: [p for p in new_owner.passes if p[0] == held],
        timeout=60,
        message=f"{new_owner.shard}'s first pass of {held}",
    )
    return min(p[2] for p in new_owner.passes if p[0] == held)


async def test_balanced_placement_bounds_each_shard_as_shards_join(cluster: Cluster) -> None:
    """Names the ring alone would crowd onto one shard (12 or more of 30 over 3) are spread
    with at most ceil(30 / 3 * 1.02) = 11 each; a fourth shard takes about its share, at most
    ceil(30 / 4 * 1.02) = 8 each after; one owner at a time throughout, every Service served."""
    replicas = [Replica(cluster, f"shard-{i}", placement="balanced") for i in range(3)]
    joiner = Replica(cluster, "shard-3", placement="balanced")
    everyone = [*replicas, joiner]
    three_shards = {"shard-0", "shard-1", "shard-2"}
    names = names_where(
        cluster,
        SERVICES,
        lambda names: max(Counter(placed(cluster, three_shards, names).values()).values()) >= 12,
    )

    async def bounded(shards: set[str], cap: int) -> bool:
        loads = Counter((await shards_of(cluster)).values())
        return set(loads) == shards and max(loads.values()) <= cap

    with sampling(everyone) as violations:
        try:
            for replica in replicas:
                await replica.start()
            for name in names:
                await cluster.service(name)
            await async_wait_for(lambda: bounded(three_shards, 11), timeout=60, message="at most 11 each")
            on = await shards_of(cluster)
            await async_wait_for(
                lambda: served(replicas, cluster, on), timeout=60, message="each Service served by its shard"
            )
            await joiner.start()
            await async_wait_for(
                lambda: bounded({*three_shards, "shard-3"}, 8), timeout=60, message="at most 8 each"
            )
        finally:
            await stop_running(everyone)
    assert violations == []


async def test_a_cold_start_places_over_the_shards_starting_together_with_no_drain(cluster: Cluster) -> None:
    """Thirty Services wait unassigned; shard-0 starts (and runs the sharder), then shard-1 and
    shard-2 a moment later: each Service goes straight to the shard the ring over all three
    places it on. Without the settle the first round puts all thirty on shard-0, and two thirds
    of them are drained away as the others come."""
    # A settle of 10 s, not the default 3: the two later replicas' starts must fall within it
    # even on a loaded machine (with 0 the test counts 20 drains).
    replicas = [Replica(cluster, f"shard-{i}", settle=10.0) for i in range(3)]
    names = [f"svc-{i}" for i in range(SERVICES)]
    for name in names:
        await cluster.service(name)
    try:
        first = replicas[0]
        await first.start()

        def sharder_ran() -> bool:
            sharding = first.manager.sharding
            return sharding is not None and sharding.sharder is not None and sharding.sharder.rounds >= 1

        await async_wait_for(sharder_ran, timeout=30, message="the sharder's first round on shard-0")
        for replica in replicas[1:]:
            await replica.start()
        three = placed(cluster, {r.shard for r in replicas}, names)
        await async_wait_for(
            lambda: _labels_are(cluster, three), timeout=60, message="the Services placed over the three"
        )
        await async_wait_for(
            lambda: served(replicas, cluster, three), timeout=60, message="each Service served"
        )
        sharding = first.manager.sharding
        assert sharding is not None
        moves = {
            move: first.manager.metrics.registry.get_sample_value(
                "resourceconsist_sharder_moves_total", {"move": move}
            )
            for move in ("assign", "drain")
        }
        assert moves == {"assign": SERVICES, "drain": 0}
        assert sum(r.manager.sharding.gate.drained for r in replicas if r.manager.sharding is not None) == 0
    finally:
        await stop_running(replicas)


async def test_the_sharder_runs_no_round_for_lease_renewals_or_employer_status_writes(
    cluster: Cluster,
) -> None:
    """Once ten Services are placed over two shards, neither the shards' Lease renewals (each
    every half second here) nor writes to the Services that change nothing placement reads (an
    annotation, thirty times) make the sharder run a round: it runs only the rounds its clock
    asks for (a Lease's expiry). Without the two filters each renewal and each write asked for
    one (about twenty in the window)."""
    replicas = [Replica(cluster, f"shard-{i}") for i in range(2)]
    names = [f"svc-{i}" for i in range(10)]
    for name in names:
        await cluster.service(name)
    try:
        for replica in replicas:
            await replica.start()
        two = placed(cluster, {r.shard for r in replicas}, names)
        await async_wait_for(lambda: _labels_are(cluster, two), timeout=60, message="the Services placed")
        await async_wait_for(
            lambda: served(replicas, cluster, two), timeout=60, message="each Service served"
        )

        def sharder_of() -> Sharder | None:
            for replica in replicas:
                sharding = replica.manager.sharding
                if sharding is not None and sharding.sharder is not None:
                    return sharding.sharder
            return None

        sharder = sharder_of()
        assert sharder is not None
        renewals = [0]

        def renewed(event: WatchEvent) -> None:
            renewals[0] += event.type == "MODIFIED"

        unsubscribe = sharder.leases.add_handler(renewed)
        try:
            before = sharder.rounds
            for round_ in range(3):
                for name in names:
                    await cluster.call(
                        cluster.client.patch,
                        kube.SERVICE,
                        cluster.namespace,
                        name,
                        {"metadata": {"annotations": {"example.com/written": str(round_)}}},
                    )

            def written_and_renewed() -> bool:
                cache = sharder.cache(kube.SERVICE).store
                seen = [cache.get(f"{cluster.namespace}/{name}") for name in names]
                annotations = [((o or {}).get("metadata") or {}).get("annotations") or {} for o in seen]
                return renewals[0] >= 8 and all(a.get("example.com/written") == "2" for a in annotations)

            await async_wait_for(
                written_and_renewed, timeout=30, message="the writes and eight renewals seen by the sharder"
            )
            rounds = sharder.rounds - before
        finally:
            unsubscribe()
        # The clock's rounds: each shard's Lease (6 s) would expire once in the window at most.
        assert rounds <= 3, f"{rounds} rounds for {renewals[0]} renewals and 30 status writes"
        assert sharder_of() is sharder
    finally:
        await stop_running(replicas)


async def test_an_employer_whose_label_write_met_a_newer_version_is_placed_without_waiting_for_the_resync(
    cluster: Cluster,
) -> None:
    """Someone writes an annotation to a Service just as the sharder labels it (here: its
    employer predicate, called right before the write, in the sharder's worker thread): the write
    meets a newer version (409). The newer version changes nothing placement reads, so its event
    asks for no round; the sharder looks at the Service again by itself and places it within
    seconds, its resync being ten minutes away."""
    ring = "conflict"
    stamp = lease_time(datetime.datetime.now(datetime.UTC))
    await cluster.call(
        cluster.client.create,
        kube.LEASE,
        cluster.namespace,
        {
            "metadata": {"name": "shard-a", "labels": {wire.SHARD_RING_LABEL: ring}},
            "spec": {
                "holderIdentity": "shard-a",
                "leaseDurationSeconds": 600,
                "acquireTime": stamp,
                "renewTime": stamp,
            },
        },
    )
    await cluster.service("svc-x")
    written: list[str] = []

    def accepts(event: WatchEvent) -> bool:
        name = str(event.obj["metadata"]["name"])
        if threading.current_thread() is not threading.main_thread() and not written:
            written.append(name)
            cluster.client.patch(
                kube.SERVICE,
                cluster.namespace,
                name,
                {"metadata": {"annotations": {"example.com/by": "other"}}},
            )
        return True

    conflicts: list[int] = []
    leases = Informer(
        cluster.client,
        kube.LEASE,
        namespace=cluster.namespace,
        label_selector=f"{wire.SHARD_RING_LABEL}={ring}",
    )
    leases.start(asyncio.get_running_loop())
    sharder = Sharder(
        cluster.client,
        ring,
        leases,
        [(kube.SERVICE, accepts)],
        namespaces=[cluster.namespace],
        resync=600.0,
        report=lambda done: conflicts.append(done.conflicts),
    )
    try:
        # Its caches' first lists, with a deadline: a start that cannot list fails here, named.
        await asyncio.wait_for(sharder.start(), timeout=30)

        async def placed_on_shard_a() -> bool:
            obj = await cluster.call(cluster.client.get, kube.SERVICE, cluster.namespace, "svc-x")
            return (obj["metadata"].get("labels") or {}).get(shard_label(ring)) == "shard-a"

        await async_wait_for(placed_on_shard_a, timeout=10, message="svc-x placed on shard-a")
    finally:
        await sharder.stop()
        await asyncio.to_thread(leases.stop)
    assert written == ["svc-x"]
    assert sum(conflicts) >= 1


async def test_a_pass_in_flight_ends_before_the_new_shard_starts(cluster: Cluster) -> None:
    """The drain waits for the pass the old shard is in the middle of: its labels stay until the
    pass ends, and the new shard's first pass of the Service starts after that."""
    names = names_where(
        cluster,
        10,
        lambda names: "shard-2" in placed(cluster, {"shard-0", "shard-1", "shard-2"}, names).values(),
    )
    joined = placed(cluster, {"shard-0", "shard-1", "shard-2"}, names)
    before = placed(cluster, {"shard-0", "shard-1"}, names)
    moving = sorted(n for n in names if joined[n] == "shard-2")
    assert moving  # chosen so by names_where
    held = moving[0]
    replicas = [Replica(cluster, f"shard-{i}") for i in range(3)]
    adapters = {r.shard: TimedDemo(r.shard, r.provider) for r in replicas}
    owner = adapters[before[held]]
    try:
        # A pass of `held` on its owner, held in the middle.
        await hold_a_pass(cluster, replicas[:2], adapters, before, held)
        await replicas[2].start(adapters["shard-2"])

        async def draining() -> bool:
            obj = await cluster.get(kube.SERVICE, held)
            return obj is not None and drain_label(RING) in (obj["metadata"].get("labels") or {})

        await async_wait_for(draining, timeout=60, message="the drain label on the held Service")
        # The owner is still in its pass: it has not let go, and the new shard has not started.
        obj = await cluster.get(kube.SERVICE, held)
        assert obj is not None
        assert obj["metadata"]["labels"][shard_label(RING)] == before[held]
        assert not [p for p in adapters["shard-2"].passes if p[0] == held]

        released = time.monotonic()
        owner.hold.set()
        await async_wait_for(
            lambda: _labels_are(cluster, joined), timeout=60, message="the new shard's share moved to it"
        )
        await async_wait_for(
            lambda: [p for p in adapters["shard-2"].passes if p[0] == held],
            timeout=60,
            message="its first pass",
        )
        first_new = min(p[2] for p in adapters["shard-2"].passes if p[0] == held)
        last_old = max(p[3] for p in owner.passes if p[0] == held)
        assert last_old >= released > 0
        assert first_new > last_old, "the new shard started before the old one's pass ended"
        # ... and with a full pass: it knows nothing of the Service yet.
        assert next(full for name, full in adapters["shard-2"].full if name == held)
    finally:
        owner.hold.set()
        await stop_running(replicas)


async def test_a_stopping_shard_keeps_its_lease_while_a_pass_runs(cluster: Cluster) -> None:
    """A shard stopped without releasing its Lease (as when killed after its stop began) goes on
    renewing it while a pass of its own is still running, even past two lease durations: the
    sharder cannot declare it dead and hand its Services to another shard meanwhile. No pass
    starts on it once its stop has begun; its Services move only after its last pass ended."""
    names = names_where(
        cluster,
        4,
        lambda names: set(placed(cluster, {"shard-0", "shard-1"}, names).values()) == {"shard-0", "shard-1"},
    )
    home = placed(cluster, {"shard-0", "shard-1"}, names)
    held = sorted(n for n in names if home[n] == "shard-1")[0]
    replicas = [Replica(cluster, "shard-0"), Replica(cluster, "shard-1", release_on_cancel=False)]
    adapters = {r.shard: TimedDemo(r.shard, r.provider) for r in replicas}
    stopping = adapters["shard-1"]
    stop: asyncio.Task[None] | None = None
    with sampling(replicas) as violations:
        try:
            await hold_a_pass(cluster, replicas, adapters, home, held)

            # The stop waits for the held pass longer than two lease durations.
            began = time.monotonic()
            stop = asyncio.create_task(replicas[1].manager.stop(timeout=4 * LEASE_SECONDS))
            await async_wait_for(
                lambda: time.monotonic() - began > 2 * LEASE_SECONDS + 2,
                timeout=4 * LEASE_SECONDS,
                message="two lease durations into the stop",
            )
            assert not stop.done()
            lease = await cluster.get(kube.LEASE, "shard-1")
            assert lease is not None
            assert lease["spec"]["holderIdentity"] == "shard-1", "the Lease was taken over during a pass"
            assert (await shards_of(cluster))[held] == "shard-1"
            assert not [p for p in adapters["shard-0"].passes if p[0] == held]

            released = time.monotonic()
            stopping.hold.set()
            await stop
            replicas[1].running = False
            # No pass started on the stopping shard after its stop began.
            assert [p for p in stopping.passes if p[2] >= began] == []
            first_new = await first_pass_once_moved(cluster, names, adapters["shard-0"], held)
            assert first_new > max(p[3] for p in stopping.passes if p[0] == held) >= released
        finally:
            stopping.hold.set()
            if stop is not None:
                await asyncio.gather(stop, return_exceptions=True)
                replicas[1].running = False
            await stop_running(replicas)
    assert violations == [], violations[:5]


POLICY = kube.Resource(
    "admissionregistration.k8s.io",
    "v1",
    "ValidatingAdmissionPolicy",
    "validatingadmissionpolicies",
    namespaced=False,
)
BINDING = kube.Resource(
    "admissionregistration.k8s.io",
    "v1",
    "ValidatingAdmissionPolicyBinding",
    "validatingadmissionpolicybindings",
    namespaced=False,
)


@contextmanager
def renewals_refused(cluster: Cluster, shard: str) -> Iterator[None]:
    """The API server refuses every write by which ``shard`` would renew its own Lease (an
    admission policy), while everything else, the sharder's takeover of that Lease included, is
    let through: a replica cut off from its Lease, alive otherwise."""
    name = f"{cluster.namespace}-refuse-{shard}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["coordination.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["UPDATE"],
                        "resources": ["leases"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": (
                        f"!(object.metadata.namespace == '{cluster.namespace}' && object.metadata.name == "
                        f"'{shard}' && object.spec.holderIdentity == '{shard}')"
                    ),
                    "message": f"the test cuts {shard} off from its Lease",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    cluster.client.create(POLICY, None, policy)
    cluster.client.create(BINDING, None, binding)
    try:
        yield
    finally:
        for res in (BINDING, POLICY):
            with contextlib.suppress(kube.NotFound):
                cluster.client.delete(res, None, name)


async def test_a_shard_cut_off_from_its_lease_abandons_its_passes_before_the_lease_can_move(
    cluster: Cluster,
) -> None:
    """A shard that can no longer renew its Lease steps down and gives a pass it is in the middle
    of (one that ignores cancellation, as a hung provider call does) only until one retry period
    before the Lease could be taken over, not the whole shutdown timeout: the pass is abandoned
    before the renew time last written plus the lease duration, and the sharder's new owner of
    its Services starts after that."""
    names = names_where(
        cluster,
        4,
        lambda names: set(placed(cluster, {"shard-0", "shard-1"}, names).values()) == {"shard-0", "shard-1"},
    )
    home = placed(cluster, {"shard-0", "shard-1"}, names)
    held = sorted(n for n in names if home[n] == "shard-1")[0]
    replicas = [Replica(cluster, "shard-0"), Replica(cluster, "shard-1", shutdown_timeout=120.0)]
    adapters = {r.shard: TimedDemo(r.shard, r.provider) for r in replicas}
    cut_off = replicas[1]
    with sampling(replicas) as violations:
        try:
            await hold_a_pass(cluster, replicas, adapters, home, held)
            with renewals_refused(cluster, "shard-1"):
                await async_wait_for(
                    lambda: not cut_off.manager.leading, timeout=30, message="shard-1 stepping down"
                )
                lease = await cluster.get(kube.LEASE, "shard-1")
                assert lease is not None
                renewed = parse_lease_time(lease["spec"]["renewTime"])
                assert renewed is not None
                (controller,) = cut_off.manager.controllers.values()
                await async_wait_for(
                    lambda: not controller.queue.processing(),
                    timeout=LEASE_SECONDS + 5,
                    interval=0.02,
                    message="the held pass abandoned",
                )
                abandoned, abandoned_at = datetime.datetime.now(datetime.UTC), time.monotonic()
                expires = renewed + datetime.timedelta(seconds=LEASE_SECONDS)
                assert abandoned < expires, f"abandoned at {abandoned}, the Lease expired at {expires}"
                # The sharder takes the silent Lease over and moves its Services to shard-0,
                # whose first pass of the held Service comes after the abandonment.
                assert await first_pass_once_moved(cluster, names, adapters["shard-0"], held) > abandoned_at
        finally:
            adapters["shard-1"].hold.set()
            await stop_running(replicas)
    assert violations == [], violations[:5]


async def test_shards_follow_another_sharder_speaking_the_protocol(cluster: Cluster) -> None:
    """With --no-sharder, the shards only follow the labels, as under kubernetes-controller-
    sharding's sharder; the test writes them as that sharder does: assign, drain, wait for the
    shard to let go, assign again."""
    replicas = [Replica(cluster, f"shard-{i}", sharder=False) for i in range(2)]
    by_shard = {r.shard: r for r in replicas}
    try:
        for replica in replicas:
            await replica.start()
        for name in ("moved", "untouched"):
            await cluster.service(name)
        key = f"{cluster.namespace}/moved"

        async def labels() -> dict[str, str]:
            obj = await cluster.get(kube.SERVICE, "moved")
            assert obj is not None
            return dict(obj["metadata"].get("labels") or {})

        await cluster.patch(kube.SERVICE, "moved", {"metadata": {"labels": {shard_label(RING): "shard-0"}}})
        await async_wait_for(
            lambda: key in by_shard["shard-0"].provider.vips, timeout=60, message="shard-0 serving"
        )

        await cluster.patch(kube.SERVICE, "moved", {"metadata": {"labels": {drain_label(RING): "true"}}})

        async def let_go() -> bool:
            found = await labels()
            return shard_label(RING) not in found and drain_label(RING) not in found

        await async_wait_for(let_go, timeout=60, message="shard-0 removing both labels")
        assert key not in by_shard["shard-1"].provider.vips

        await cluster.patch(kube.SERVICE, "moved", {"metadata": {"labels": {shard_label(RING): "shard-1"}}})
        await async_wait_for(
            lambda: key in by_shard["shard-1"].provider.vips, timeout=60, message="shard-1 serving"
        )
        # Nobody assigns what the outside sharder leaves alone.
        untouched = await cluster.get(kube.SERVICE, "untouched")
        assert untouched is not None
        assert shard_label(RING) not in (untouched["metadata"].get("labels") or {})
        assert all(f"{cluster.namespace}/untouched" not in r.provider.vips for r in replicas)
        assert all(r.manager.sharding is not None and r.manager.sharding.sharder is None for r in replicas)
    finally:
        await stop_running(replicas)
