"""The sharder: the smallest coordinator that assigns employers to shards (docs/scaling.md).

One replica at a time runs it (elected on its own Lease, ``ShardingOptions.sharder_lease``). It
watches the ring's shard Leases and every employer its controllers' predicates accept, and on
each change (and every ``resync`` seconds) it makes the labels agree with the ring:

- an unassigned employer, or one on a shard that is no longer available (dead: released, or
  taken over here), gets the shard label of the shard the ring places it on: one write;
- an employer on an available shard that the ring now places elsewhere gets the drain label:
  one write; its shard lets go (``resourceconsist.runtime.sharding.shard``) and takes both labels off,
  and the now unassigned employer gets its new shard: one write.

At a cold start of the ring (no employer on an available shard yet) it waits, before placing
anything, for the shards that start together to hold their Leases (``Sharder.settle``). With the
pod employer label it reads the labeller's cache of every Service rather than watch them again.

It keeps the shard Leases' states as kubernetes-controller-sharding's sharder does: a Lease
expired for a lease duration more is taken over (held by ``shardlease-controller``: the shard is
dead and its employers move without a drain), and a dead one is deleted a minute later. Every
write carries the object's resourceVersion; a conflict is left to the next round, which the
write's own watch event brings.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import Informer, InformerFactory, WatchEvent
from resourceconsist.cluster.kube import Conflict, KubeClient, KubeObject, NotFound, Resource
from resourceconsist.flow.fence import LeaseLost, check_fence
from resourceconsist.runtime.leaderelection import lease_time
from resourceconsist.runtime.sharding.ring import (
    HashRing,
    Shard,
    ShardState,
    balanced_placement,
    drain_label,
    label_patch,
    placement,
    resource_hash_key,
    ring_of,
    settle_left,
    shard_label,
    shard_of_lease,
)

log = logging.getLogger(__name__)

#: The settle (``Sharder.settle``) ends at the latest this many settle times after the sharder
#: started, however long shards keep coming.
SETTLE_AT_MOST = 5
#: Seconds before a round looks again at employers whose label write met a newer version.
CONFLICT_RETRY = 0.2

#: A balanced placement as computed: the ring's shards, each placed employer's (shard label,
#: draining) it was computed from, and the shard of each employer.
_Balanced = tuple[frozenset[str], dict[str, tuple[str, bool]], dict[str, str]]

#: Whether an employer event concerns a controller of this ring (the adapters' employer predicates).
EmployerFilter = Callable[[WatchEvent], bool]


@dataclass
class SharderRound:
    """What one round of the sharder found and wrote."""

    shards: dict[str, ShardState] = field(default_factory=dict)
    assigned: int = 0
    drained: int = 0
    #: Leases of silent shards taken over (their shards are dead now), and dead Leases deleted.
    taken_over: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    #: Writes refused for a newer resourceVersion, and the employers they were for: looked at
    #: again by a round shortly after (the newer version may change nothing placement reads, so
    #: no event of it asks for one: ``Sharder._employer_changed``).
    conflicts: int = 0
    retry: set[tuple[Resource, str]] = field(default_factory=set)
    #: When the next round is due by the clock (a shard's state changes), in seconds.
    next_in: float | None = None
    #: Nothing placed: a cold start of the ring, whose shards may still be coming (``settle``).
    settling: bool = False


class Sharder:
    """Assigns the employers of ``employers`` to the shards of ``ring`` through their labels."""

    def __init__(
        self,
        client: KubeClient,
        ring: str,
        leases: Informer,
        employers: Sequence[tuple[Resource, EmployerFilter]],
        *,
        namespaces: Sequence[str] = (),
        resync: float = 60.0,
        report: Callable[[SharderRound], None] = lambda done: None,
        balanced: bool = False,
        shared: Mapping[Resource, Informer] | None = None,
        settle: float = 0.0,
    ) -> None:
        self.client = client
        self.ring = ring
        #: Balanced placement (``ring.balanced_placement``) instead of the ring's own choice.
        self.balanced = balanced
        self.leases = leases
        self.employers = list(employers)
        #: The namespaces whose employers it places (the manager's; empty: all).
        self.namespaces = tuple(namespaces)
        self.resync = resync
        #: Told each round (the manager's metrics).
        self.report = report
        #: Caches of employers that another part of the replica already keeps, with every
        #: employer of the sharder's namespaces (the pod labeller's every-Service watch): read
        #: here, started and stopped by their owner, so a replica keeps one copy of each Service.
        self.shared = dict(shared or {})
        #: At a cold start of the ring (no employer on an available shard), place nothing until
        #: the youngest shard has held its Lease ``settle`` seconds (at most ``SETTLE_AT_MOST``
        #: times that after the start): replicas started together are placed over together,
        #: not placed on the first and then drained to the others (``ShardingOptions.sharder_settle``).
        self.settle = settle
        self._settled = settle <= 0
        self._told = False
        self._started = 0.0
        self.rounds = 0
        self.last_round: SharderRound | None = None
        self._informers: InformerFactory | None = None
        #: The cache the sharder reads each employer kind from (its own, or ``shared``).
        self._caches: dict[Resource, Informer] = {}
        self._wake = asyncio.Event()
        #: Employers changed since the last round; whether the next round looks at every employer
        #: (at start, after a failure, every ``resync``); the shards' states the last round saw
        #: (when they change, the ring may have: every employer is looked at).
        self._pending: set[tuple[Resource, str]] = set()
        self._full = True
        self._last_full = 0.0
        self._seen: dict[str, ShardState] = {}
        #: The last balanced placement of each kind: the ring's shards and each placed
        #: employer's input it was computed from, and the placement (``_balanced_placement``).
        self._balanced: dict[Resource, _Balanced] = {}
        self._task: asyncio.Task[None] | None = None
        #: The round running in its worker thread, if any (``stop`` waits for it).
        self._round: asyncio.Future[SharderRound] | None = None
        self._unsubscribe: list[Callable[[], None]] = []

    async def start(self) -> None:
        """Watch the employers (all of them: the sharder sees every shard's) and run rounds."""
        loop = asyncio.get_running_loop()
        owned = [resource for resource, _ in self.employers if resource not in self.shared]
        if owned:
            self._informers = InformerFactory(self.client, namespaces=self.namespaces)
        for resource, accepts in self.employers:
            cache = self.shared.get(resource)
            if cache is None:
                assert self._informers is not None
                cache = self._informers.informer(resource)
            self._caches[resource] = cache
            self._unsubscribe.append(
                cache.add_handler(functools.partial(self._employer_changed, resource, accepts))
            )
        if self._informers is not None:
            self._informers.start(loop)
        self._unsubscribe.append(self.leases.add_handler(self._lease_changed))
        for cache in self._caches.values():
            await cache.wait_synced()
        await self.leases.wait_synced()
        self._started = time.monotonic()
        self._task = asyncio.create_task(self._run(), name=f"sharder-{self.ring}")
        log.info("sharder of ring %s started", self.ring)

    async def stop(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._round is not None:
            # A round still running in its thread ends (and reports) before the sharder stops.
            await asyncio.gather(self._round, return_exceptions=True)
            self._round = None
        if self._informers is not None:
            await asyncio.to_thread(self._informers.stop)
            self._informers = None
        self._caches = {}
        log.info("sharder of ring %s stopped", self.ring)

    def cache(self, resource: Resource) -> Informer:
        """The cache the running sharder reads the employers of ``resource`` from."""
        return self._caches[resource]

    def _employer_changed(self, resource: Resource, accepts: EmployerFilter, event: WatchEvent) -> None:
        if event.type == "DELETED":
            return
        if event.type == "MODIFIED" and event.old is not None:
            before = self._placement_input(accepts, event.old)
            if before == self._placement_input(accepts, event.obj):
                # Nothing placement reads of it changed (a status, an annotation, a finalizer:
                # most employer events): no round. The resync still looks at every employer.
                return
        self._pending.add((resource, kube.object_key(event.obj)))
        self._wake.set()

    def _lease_changed(self, event: WatchEvent) -> None:
        if event.type == "MODIFIED" and event.old is not None and _renewed_only(event.old, event.obj):
            # A renewal of a shard in the state the last round saw it in changes no placement: no
            # round (each shard renews every retry period). A shard falling silent is seen by
            # the clock instead (``SharderRound.next_in``: the moment its Lease would expire).
            shard = shard_of_lease(event.obj, datetime.datetime.now(datetime.UTC))
            if self._seen.get(shard.name) == shard.state:
                return
        self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            delay = self.resync
            # The resync: every employer; else the employers that changed (a new Service costs one
            # placement, not N), or every one when a shard's state changed (``round``).
            if time.monotonic() - self._last_full >= self.resync:
                self._full = True
            only = None if self._full else self._pending
            self._full, self._pending = False, set()
            try:
                now = datetime.datetime.now(datetime.UTC)
                # Shielded: a stop cancels this task, not the round in its thread, and waits for
                # that round (``stop``), whose report must not land after the replica cleared it.
                self._round = asyncio.ensure_future(asyncio.to_thread(self.round, now, only))
                done = await asyncio.shield(self._round)
                if done.next_in is not None:
                    delay = min(delay, done.next_in)
                if done.retry:
                    # The cache catches up with the version that refused the write meanwhile.
                    self._pending |= done.retry
                    delay = min(delay, CONFLICT_RETRY)
                # A settling round looked at no employer: the first real one looks at all.
                self._full = self._full or done.settling
            except LeaseLost as err:
                # Its election steps it down on its next attempt; nothing was written.
                log.info("sharder of ring %s: round not run: %s", self.ring, err)
                delay = min(delay, 1.0)
                self._full = True
            except Exception as err:
                quiet = kube.is_unreachable(err) or self.client.reachability.down
                log.log(logging.DEBUG if quiet else logging.WARNING, "sharder of ring %s: %s", self.ring, err)
                delay = min(delay, 1.0)
                self._full = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(delay, 0.05))

    # -- one round (in a worker thread: it writes) -------------------------------------------------

    def round(self, now: datetime.datetime, only: set[tuple[Resource, str]] | None = None) -> SharderRound:
        """Bring the Leases' states and the employers' labels (those of ``only``, when given) in
        line with the ring, once."""
        # A round only while the sharder's Lease is surely held: a sharder resumed from a pause
        # reads a stale Lease cache and must not drain Services beside the real one.
        check_fence()
        done = SharderRound()
        shards: dict[str, Shard] = {}
        for lease in self.leases.store.list():
            shard = shard_of_lease(lease, now)
            if shard.state == ShardState.UNCERTAIN and self._take_over(lease, shard, now):
                done.taken_over.append(shard.name)
                duration = shard.lease_duration
                shard = Shard(shard.name, ShardState.DEAD, now + 2 * duration, duration)
            elif shard.state == ShardState.ORPHANED:
                self._delete(lease)
                done.deleted.append(shard.name)
                continue
            shards[shard.name] = shard
        done.shards = {name: s.state for name, s in shards.items()}
        if done.shards != self._seen:
            only = None
        self._seen = done.shards
        if only is None:
            self._last_full = time.monotonic()
        waits = [w for w in (s.next_change(now) for s in shards.values()) if w is not None]
        done.next_in = min(waits).total_seconds() + 0.05 if waits else None
        ring = ring_of(shards.values())
        wait = self._settling(shards, now) if ring and self._caches else None
        if wait is not None:
            done.settling = True
            done.next_in = min(wait, done.next_in) if done.next_in is not None else wait
        elif ring and self._caches:
            for resource, accepts in self.employers:
                store = self._caches[resource].store
                if only is None:
                    objs = store.list()
                else:
                    keys = sorted(key for r, key in only if r == resource)
                    objs = [o for o in map(store.get, keys) if o is not None]
                shard_of: Callable[[str], str | None] = ring.shard_of
                if self.balanced:
                    shard_of = self._balanced_placement(resource, accepts, store.list, objs, ring).get
                for obj in objs:
                    self._place(resource, accepts, obj, shard_of, shards, done)
        self.rounds += 1
        self.last_round = done
        self.report(done)
        if done.taken_over or done.deleted or (only is None and (done.assigned or done.drained)):
            log.info(
                "sharder of ring %s: assigned %d, draining %d, shards %s%s%s",
                self.ring,
                done.assigned,
                done.drained,
                ", ".join(f"{n}={s}" for n, s in sorted(done.shards.items())) or "none",
                f"; took over the Leases of silent {', '.join(done.taken_over)}" if done.taken_over else "",
                f"; deleted the Leases of dead {', '.join(done.deleted)}" if done.deleted else "",
            )
        return done

    def _settling(self, shards: dict[str, Shard], now: datetime.datetime) -> float | None:
        """Seconds to wait before placing anything (``settle``), or None: place now. Only at a
        cold start of the ring: once an employer is on an available shard, never again."""
        if self._settled:
            return None
        on = shard_label(self.ring)
        available = {name for name, shard in shards.items() if shard.state.available}
        placed = any(
            (obj["metadata"].get("labels") or {}).get(on) in available
            for cache in self._caches.values()
            for obj in cache.store.list()
        )
        left = min(
            settle_left(shards.values(), now, self.settle),
            self._started + SETTLE_AT_MOST * self.settle - time.monotonic(),
        )
        if placed or left <= 0:
            self._settled = True
            return None
        if not self._told:
            self._told = True
            log.info("sharder of ring %s: no employer placed yet; waiting for the shards to come", self.ring)
        return left + 0.05

    def _balanced_placement(
        self,
        resource: Resource,
        accepts: EmployerFilter,
        every: Callable[[], list[KubeObject]],
        objs: list[KubeObject],
        ring: HashRing,
    ) -> dict[str, str]:
        """Balanced placement over every employer of ``resource``: the bound is over all of them,
        even in a round over a few. Computed again only when the ring, or what placement reads of
        one of ``objs`` (accepted, shard and drain labels), differs from the last computation: most
        rounds come from employers' other changes (status, annotations), and the computation
        costs about 10 ms per 1000 employers."""
        cached = self._balanced.get(resource)
        if cached is not None and cached[0] == ring.shards:
            _, seen, desired = cached
            if all(seen.get(_hash_key(resource, o)) == self._placement_input(accepts, o) for o in objs):
                return desired
        inputs: dict[str, tuple[str, bool]] = {}
        labels: dict[str, dict[str, str]] = {}
        for obj in every():
            placed = self._placement_input(accepts, obj)
            if placed is not None:
                key = _hash_key(resource, obj)
                inputs[key] = placed
                labels[key] = obj["metadata"].get("labels") or {}
        desired = balanced_placement(labels, ring, self.ring)
        self._balanced[resource] = (ring.shards, inputs, desired)
        return desired

    def _placement_input(self, accepts: EmployerFilter, obj: KubeObject) -> tuple[str, bool] | None:
        """What balanced placement reads of an employer: its shard and whether it drains; None
        when the sharder does not place it."""
        if not _accepted(accepts, obj):
            return None
        labels = obj["metadata"].get("labels") or {}
        return labels.get(shard_label(self.ring), ""), drain_label(self.ring) in labels

    def _place(
        self,
        resource: Resource,
        accepts: EmployerFilter,
        obj: KubeObject,
        shard_of: Callable[[str], str | None],
        shards: dict[str, Shard],
        done: SharderRound,
    ) -> None:
        meta = obj.get("metadata") or {}
        try:
            if not accepts(WatchEvent("MODIFIED", obj, obj)):
                return
        except Exception:
            log.warning("sharder: the employer predicate failed on %s; not assigned", kube.object_key(obj))
            return
        key = _hash_key(resource, obj)
        move = placement(meta.get("labels") or {}, shard_of(key), shards, self.ring)
        if move is None:
            return
        try:
            self.client.patch(
                resource,
                meta.get("namespace") or None,
                meta["name"],
                label_patch(move, self.ring, str(meta.get("resourceVersion") or "")),
            )
        except Conflict:
            done.conflicts += 1
            done.retry.add((resource, kube.object_key(obj)))
            return
        except NotFound:
            done.conflicts += 1  # gone: its DELETED event is on its way
            return
        if move.drain:
            done.drained += 1
            log.info("sharder: draining %s %s from shard %s", resource.kind, kube.object_key(obj), move.shard)
        else:
            done.assigned += 1
            log.info("sharder: assigned %s %s to shard %s", resource.kind, kube.object_key(obj), move.shard)

    def _take_over(self, lease: KubeObject, shard: Shard, now: datetime.datetime) -> bool:
        """Hold the Lease of a shard silent for two lease durations: it is dead from now on."""
        spec = lease.get("spec") or {}
        body = {
            "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
            "spec": {
                "holderIdentity": wire.SHARD_LEASE_TAKEN_BY_SHARDER,
                "leaseDurationSeconds": max(1, round(2 * shard.lease_duration.total_seconds())),
                "acquireTime": lease_time(now),
                "renewTime": lease_time(now),
                "leaseTransitions": int(spec.get("leaseTransitions") or 0) + 1,
            },
        }
        meta = lease["metadata"]
        try:
            self.client.patch(kube.LEASE, meta.get("namespace"), meta["name"], body)
        except (Conflict, NotFound):
            return False
        log.warning("sharder: shard %s silent for two lease durations; its Lease taken over", shard.name)
        return True

    def _delete(self, lease: KubeObject) -> None:
        meta = lease["metadata"]
        with contextlib.suppress(NotFound):
            self.client.delete(kube.LEASE, meta.get("namespace"), meta["name"])


def _hash_key(resource: Resource, obj: KubeObject) -> str:
    meta = obj["metadata"]
    return resource_hash_key(resource, str(meta.get("namespace") or ""), meta["name"])


def _renewed_only(old: KubeObject, new: KubeObject) -> bool:
    """``new`` is ``old`` renewed: the same holder, duration and labels, a later renewTime."""
    spec, old_spec = dict(new.get("spec") or {}), dict(old.get("spec") or {})
    spec.pop("renewTime", None)
    old_spec.pop("renewTime", None)
    return spec == old_spec and new["metadata"].get("labels") == old["metadata"].get("labels")


def _accepted(accepts: EmployerFilter, obj: KubeObject) -> bool:
    """The predicate's answer, False when it fails (``Sharder._place`` says so)."""
    try:
        return bool(accepts(WatchEvent("MODIFIED", obj, obj)))
    except Exception:
        return False
