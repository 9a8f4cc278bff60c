"""The sharding ring's pure rules: label keys, the hash key of an object, the consistent-hash
ring, and a shard's state read from its Lease (docs/scaling.md, "The protocol").

They follow kubernetes-controller-sharding's protocol, so that its sharder and ours place every
object on the same shard: the key of an object is ``group/Kind/namespace/name``; the ring holds
``VIRTUAL_NODES`` tokens per available shard, token ``i`` of shard ``s`` being the xxHash64 of
``s + str(i)``; a key goes to the shard of the first token at or after the key's own hash,
wrapping around. No I/O here: the shard side and the sharder (``resourceconsist.runtime.sharding.shard``,
``resourceconsist.runtime.sharding.sharder``) read the Leases and objects and ask these rules.
"""

from __future__ import annotations

import bisect
import datetime
import enum
import functools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from resourceconsist import wire
from resourceconsist.cluster.kube import Resource
from resourceconsist.runtime.leaderelection import parse_lease_time

#: Tokens (virtual nodes) per shard on the ring: more spread the keys more evenly.
VIRTUAL_NODES = 100
#: How far above an even share balanced placement lets a shard's employers go before it moves
#: some (``balanced_placement``): at 1000 employers over 4 shards, 255 at most.
BALANCE_SLACK = 0.02
#: How long a dead shard's Lease stays before the sharder deletes it (the protocol's TTL).
ORPHAN_AFTER = datetime.timedelta(minutes=1)
#: The Lease duration assumed for a Lease that does not say (the protocol's default).
DEFAULT_LEASE_DURATION = datetime.timedelta(seconds=15)


def shard_label(ring: str) -> str:
    """The label on an employer naming its shard in ``ring``."""
    return wire.SHARD_LABEL_PREFIX + ring


def drain_label(ring: str) -> str:
    """The label on an employer telling its shard in ``ring`` to let go of it."""
    return wire.DRAIN_LABEL_PREFIX + ring


def hash_key(api_version: str, kind: str, namespace: str, name: str) -> str:
    """The key an object is placed on the ring by: ``group/Kind/namespace/name`` (the core group
    is empty: a Service's key starts with ``/Service/``)."""
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    return f"{group}/{kind}/{namespace}/{name}"


def resource_hash_key(resource: Resource, namespace: str, name: str) -> str:
    """``hash_key`` of an object of ``resource``: its group and kind from the resource, as a
    cached object (a list's item, a watch's) may not carry ``apiVersion`` and ``kind``."""
    return hash_key(resource.api_version, resource.kind, namespace, name)


def _hash(value: str) -> int:
    return int(xxhash.xxh64_intdigest(value.encode()))


class HashRing:
    """Consistent hashing of keys onto shards, ``tokens`` virtual nodes per shard."""

    def __init__(self, shards: Iterable[str], tokens: int = VIRTUAL_NODES) -> None:
        self.shards = frozenset(shards)
        placed: dict[int, str] = {}
        # Sorted, so that the rare collision of two shards' tokens is settled the same everywhere.
        for shard in sorted(self.shards):
            for i in range(tokens):
                placed.setdefault(_hash(f"{shard}{i}"), shard)
        self._tokens = sorted(placed)
        self._owners = [placed[t] for t in self._tokens]

    def __bool__(self) -> bool:
        return bool(self._tokens)

    def shard_of(self, key: str) -> str | None:
        """The shard ``key`` belongs to; None on an empty ring."""
        return next(self.preference(key), None)

    def preference(self, key: str) -> Iterator[str]:
        """Every shard once, in the order the ring meets them going on from ``key``'s hash: its
        shard first (``shard_of``), then the next one's, and so on."""
        if not self._tokens:
            return
        start = bisect.bisect_left(self._tokens, _hash(key))
        seen: set[str] = set()
        for i in range(start, start + len(self._tokens)):
            owner = self._owners[i % len(self._tokens)]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == len(self.shards):
                    return


class ShardState(enum.IntEnum):
    """A shard's state as its Lease tells it; the higher, the more alive (the protocol's order)."""

    UNKNOWN = 0
    #: Dead for longer than ``ORPHAN_AFTER``: its Lease is deleted.
    ORPHANED = 1
    #: Released by the shard, or taken over by the sharder: its objects move without a drain.
    DEAD = 2
    #: Expired at least a lease duration ago: the sharder takes its Lease over (then it is dead).
    UNCERTAIN = 3
    #: Expired less than a lease duration ago: still on the ring (it may only be slow).
    EXPIRED = 4
    #: Held and renewed in time.
    READY = 5

    @property
    def available(self) -> bool:
        """On the ring: its objects stay, and move away only through a drain."""
        return self >= ShardState.UNCERTAIN

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Shard:
    """One shard of a ring, as its Lease says at ``now``."""

    name: str
    state: ShardState
    #: When the Lease expires (or expired), and its duration.
    expires: datetime.datetime
    lease_duration: datetime.timedelta
    #: When its holder acquired the Lease (None: the Lease does not say).
    acquired: datetime.datetime | None = None

    def next_change(self, now: datetime.datetime) -> datetime.timedelta | None:
        """How long until this shard's state changes by the clock alone (None: never)."""
        moments = {
            ShardState.READY: self.expires,
            ShardState.EXPIRED: self.expires + self.lease_duration,
            ShardState.UNCERTAIN: None,  # the sharder acts on it at once
            ShardState.DEAD: self.expires + ORPHAN_AFTER,
        }
        moment = moments.get(self.state)
        return None if moment is None else max(moment - now, datetime.timedelta(0))


def shard_of_lease(lease: Mapping[str, Any], now: datetime.datetime) -> Shard:
    """The shard a Lease of the ring describes: its name is the Lease's, its state follows from
    the holder and the renew time (docs/scaling.md, "Shard states")."""
    meta = lease.get("metadata") or {}
    spec = lease.get("spec") or {}
    name = str(meta.get("name") or "")
    acquired = parse_lease_time(spec.get("acquireTime"))
    renewed = parse_lease_time(spec.get("renewTime"))
    seconds = spec.get("leaseDurationSeconds")
    if acquired is None or renewed is None or seconds is None:
        duration, expires = DEFAULT_LEASE_DURATION, now
    else:
        duration = datetime.timedelta(seconds=float(seconds))
        expires = renewed + duration
    holder = spec.get("holderIdentity") or ""
    if holder != name:
        # Released by the shard, or taken over by the sharder.
        state = ShardState.ORPHANED if expires + ORPHAN_AFTER <= now else ShardState.DEAD
    elif expires + duration <= now:
        state = ShardState.UNCERTAIN
    elif expires <= now:
        state = ShardState.EXPIRED
    else:
        state = ShardState.READY
    return Shard(name, state, expires, duration, acquired)


def ring_of(shards: Iterable[Shard], tokens: int = VIRTUAL_NODES) -> HashRing:
    """The ring over the available shards: the one made before for the same shards (the sharder
    asks at every round, a shard at every garbage pass, and the shards change rarely)."""
    return _ring_over(frozenset(s.name for s in shards if s.state.available), tokens)


@functools.lru_cache(maxsize=8)
def _ring_over(names: frozenset[str], tokens: int) -> HashRing:
    # A ring is never changed once made, so one can serve every caller; building one hashes
    # ``tokens`` names per shard (about 0.1 ms at 4 shards, at every sharder round before).
    return HashRing(names, tokens)


def settle_left(shards: Iterable[Shard], now: datetime.datetime, settle: float) -> float:
    """Seconds until the youngest available shard has held its Lease ``settle`` seconds (0 or
    less: it has): how long a sharder at a cold start of the ring waits for more shards to
    come (docs/scaling.md, "The sharder"). A Lease that does not say when it was acquired counts
    as old."""
    acquired = [s.acquired for s in shards if s.state.available and s.acquired is not None]
    return settle - (now - max(acquired)).total_seconds() if acquired else 0.0


def budget_share(shards: Iterable[Shard]) -> float:
    """The fraction of the provider budget's configured rate one replica takes: one over the ready
    shards of the ring (at least one), so that the replicas together spend the configured rate
    (docs/scaling.md, "The provider budget across shards")."""
    return 1.0 / max(1, sum(1 for s in shards if s.state == ShardState.READY))


@dataclass(frozen=True)
class Move:
    """What the sharder writes to one object's labels (None: remove the label)."""

    shard: str | None
    drain: bool


def placement(
    labels: Mapping[str, str], desired: str | None, shards: Mapping[str, Shard], ring: str
) -> Move | None:
    """What moves an object whose labels are ``labels`` to ``desired`` (None: nothing to do).

    Unassigned, or on a shard that is not available: assigned at once. On an available shard:
    drained first (the drain label); that shard takes both labels off once it let go, and the
    object is then unassigned. Already draining: nothing until the shard has let go.
    """
    if desired is None:
        return None
    current = labels.get(shard_label(ring), "")
    if current == desired:
        return None
    shard = shards.get(current)
    if current and shard is not None and shard.state.available:
        if drain_label(ring) in labels:
            return None
        return Move(shard=current, drain=True)
    return Move(shard=desired, drain=False)


def balanced_placement(
    employers: Mapping[str, Mapping[str, str]], ring: HashRing, ring_name: str, slack: float = BALANCE_SLACK
) -> dict[str, str]:
    """The shard each employer (its hash key -> its labels) should be on under balanced placement
    (docs/scaling.md, "Balanced placement"), among the shards of ``ring`` (the available ones).

    No shard holds more than ``ceil(N / S * (1 + slack))`` of the ``N`` employers. An employer
    stays where it is while its shard is under that bound (moves cost a drain); of a shard over
    it, the ones draining already go first, then those the ring places elsewhere, then by hash.
    Each employer to place (unassigned, on a shard off the ring, or over a bound), in order of
    its hash, goes to the first shard with room that the ring meets from its hash: the ring's own
    choice when that has room. A function of the labels and the ring only, so a new sharder
    computes what the last one did."""
    shards = ring.shards
    if not shards or not employers:
        return {}
    cap = max(1, math.ceil(len(employers) / len(shards) * (1 + slack)))
    on, draining = shard_label(ring_name), drain_label(ring_name)
    held: dict[str, list[str]] = {}
    to_place: list[str] = []
    for key, labels in employers.items():
        current = labels.get(on, "")
        if current in shards:
            held.setdefault(current, []).append(key)
        else:
            to_place.append(key)
    desired: dict[str, str] = {}
    load: dict[str, int] = dict.fromkeys(shards, 0)
    for shard, keys in held.items():
        keys.sort(key=lambda k: (draining in employers[k], ring.shard_of(k) != shard, _hash(k)))
        for key in keys[:cap]:
            desired[key] = shard
        load[shard] = min(len(keys), cap)
        to_place += keys[cap:]
    for key in sorted(to_place, key=_hash):
        # There is room somewhere: the shards hold at least ``len(shards) * cap >= N``.
        shard = next(s for s in ring.preference(key) if load[s] < cap)
        desired[key] = shard
        load[shard] += 1
    return desired


def label_patch(move: Move, ring: str, resource_version: str) -> dict[str, Any]:
    """The merge patch writing ``move``, under the object's resourceVersion: one write per object
    per step, and none over a change the sharder has not seen."""
    labels: dict[str, str | None] = {drain_label(ring): "true"}
    if not move.drain:
        labels = {shard_label(ring): move.shard, drain_label(ring): None}
    return {"metadata": {"resourceVersion": resource_version, "labels": labels}}
