"""The sharding ring's rules (docs/scaling.md, "The protocol"): the hash key of an object, the
consistent-hash ring over the shards, a shard's state read from its Lease, and what the sharder
writes to move an object. Pure functions: no control plane."""

from __future__ import annotations

import datetime
from collections import Counter
from typing import Any

import pytest
import xxhash

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.errors import InvalidOptions
from resourceconsist.options import LeaderElectionOptions, ManagerOptions, ShardingOptions
from resourceconsist.runtime.leaderelection import lease_time
from resourceconsist.runtime.sharding.ring import (
    ORPHAN_AFTER,
    HashRing,
    Move,
    Shard,
    ShardState,
    balanced_placement,
    drain_label,
    hash_key,
    label_patch,
    placement,
    resource_hash_key,
    ring_of,
    settle_left,
    shard_label,
    shard_of_lease,
)

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
KEYS = [hash_key("v1", "Service", f"ns-{i % 7}", f"svc-{i}") for i in range(3000)]


def test_label_keys_end_with_the_ring_name() -> None:
    assert shard_label("web") == "shard.alpha.sharding.timebertt.dev/web"
    assert drain_label("web") == "drain.alpha.sharding.timebertt.dev/web"


def test_hash_key_is_group_kind_namespace_name() -> None:
    assert hash_key("v1", "Service", "shop", "cart") == "/Service/shop/cart"
    assert hash_key("apps/v1", "Deployment", "shop", "cart") == "apps/Deployment/shop/cart"
    assert resource_hash_key(kube.SERVICE, "a", "b") == "/Service/a/b"


def test_the_ring_hashes_with_xxhash64_as_the_go_sharder_does() -> None:
    # XXH64 of the empty input with seed 0, the published test vector.
    assert xxhash.xxh64_intdigest(b"") == 0xEF46DB3751D8E999
    ring = HashRing(["only"], tokens=3)
    tokens = sorted(xxhash.xxh64_intdigest(f"only{i}".encode()) for i in range(3))
    assert ring._tokens == tokens


#: Where kubernetes-controller-sharding's own ring (its Go consistenthash package, 100 tokens per
#: node, run once on these keys) places them: ours must agree, key for key, or its sharder and
#: ours would move objects back and forth.
GO_PLACEMENTS = {
    # The n-th digit: the shard of the n-th key.
    ("shard-0", "shard-1", "shard-2"): {
        f"/Service/shop/svc-{i}": f"shard-{digit}" for i, digit in enumerate("011220121220")
    },
    ("web-0", "web-1", "web-2", "web-3"): {
        f"apps/Deployment/ns-{i}/app": f"web-{digit}" for i, digit in enumerate("203332013111")
    },
}


@pytest.mark.parametrize("shards", list(GO_PLACEMENTS))
def test_the_ring_places_keys_where_the_go_sharder_does(shards: tuple[str, ...]) -> None:
    ring = HashRing(shards)
    assert {key: ring.shard_of(key) for key in GO_PLACEMENTS[shards]} == GO_PLACEMENTS[shards]


def test_every_key_goes_to_one_shard_and_the_shares_are_even() -> None:
    ring = HashRing(["a", "b", "c"])
    shares = Counter(ring.shard_of(key) for key in KEYS)
    assert set(shares) == {"a", "b", "c"}
    for shard, count in shares.items():
        assert 600 < count < 1400, f"shard {shard} got {count} of 3000 keys"
    assert HashRing(["c", "b", "a"]).shard_of(KEYS[0]) == ring.shard_of(KEYS[0])


def test_an_added_shard_takes_keys_only_from_the_others_and_about_its_share() -> None:
    before, after = HashRing(["a", "b", "c"]), HashRing(["a", "b", "c", "d"])
    moved = [k for k in KEYS if before.shard_of(k) != after.shard_of(k)]
    assert all(after.shard_of(k) == "d" for k in moved)
    assert 450 < len(moved) < 1050, f"{len(moved)} of 3000 keys moved to the fourth shard"


def test_a_removed_shard_gives_away_only_its_own_keys() -> None:
    before, after = HashRing(["a", "b", "c"]), HashRing(["a", "b"])
    for key in KEYS:
        if before.shard_of(key) != "c":
            assert after.shard_of(key) == before.shard_of(key)


def test_the_preference_meets_every_shard_once_starting_with_the_keys_own() -> None:
    ring = HashRing(["a", "b", "c", "d"])
    for key in KEYS[:200]:
        order = list(ring.preference(key))
        assert sorted(order) == ["a", "b", "c", "d"]
        assert order[0] == ring.shard_of(key)


def _on(desired: dict[str, str], ring: str = "r") -> dict[str, dict[str, str]]:
    """The labels of employers placed as ``desired`` says."""
    return {key: {shard_label(ring): shard} for key, shard in desired.items()}


def test_balanced_placement_bounds_every_shard_and_keeps_the_rings_choice_where_it_can() -> None:
    keys: dict[str, dict[str, str]] = {key: {} for key in KEYS[:1000]}
    ring = HashRing(["shard-0", "shard-1", "shard-2", "shard-3"])
    plain = Counter(ring.shard_of(k) for k in keys)
    assert max(plain.values()) > 275, plain  # the ring alone leaves a shard well above its share
    desired = balanced_placement(keys, ring, "r")
    loads = Counter(desired.values())
    assert set(desired) == set(keys)
    assert max(loads.values()) <= 255, loads  # ceil(1000 / 4 * 1.02)
    assert sum(1 for k in keys if desired[k] == ring.shard_of(k)) > 900
    # A fixed point: placed so, nothing moves; the same from any order of the employers.
    assert balanced_placement(_on(desired), ring, "r") == desired
    assert balanced_placement(dict(reversed(list(_on(desired).items()))), ring, "r") == desired


def test_balanced_placement_moves_about_a_share_to_an_added_shard_and_only_to_it() -> None:
    keys: dict[str, dict[str, str]] = {key: {} for key in KEYS[:1000]}
    before = balanced_placement(keys, HashRing(["a", "b", "c", "d"]), "r")
    after = balanced_placement(_on(before), HashRing(["a", "b", "c", "d", "e"]), "r")
    moved = [k for k in keys if after[k] != before[k]]
    assert all(after[k] == "e" for k in moved)
    assert 180 <= len(moved) <= 204, len(moved)
    assert max(Counter(after.values()).values()) <= 204


def test_balanced_placement_drains_the_draining_first_and_places_a_dead_shards_keys() -> None:
    keys = KEYS[:300]
    ring = HashRing(["a", "b", "c"])
    labels = {k: {shard_label("r"): "a"} for k in keys}  # all on a: 198 must go
    draining = set(keys[:50])
    for k in draining:
        labels[k][drain_label("r")] = "true"
    desired = balanced_placement(labels, ring, "r")
    assert all(desired[k] != "a" for k in draining)
    assert max(Counter(desired.values()).values()) <= 102
    # Off the ring (dead): every key placed among the others, each bounded.
    gone = balanced_placement(_on(desired), HashRing(["b", "c"]), "r")
    assert set(gone.values()) == {"b", "c"} and max(Counter(gone.values()).values()) <= 153


def test_an_empty_ring_places_nothing() -> None:
    assert not HashRing([])
    assert HashRing([]).shard_of("/Service/a/b") is None


def lease(name: str, holder: str | None, renewed: datetime.datetime | None, seconds: int = 10) -> Any:
    spec: dict[str, Any] = {"leaseDurationSeconds": seconds}
    if holder is not None:
        spec["holderIdentity"] = holder
    if renewed is not None:
        spec["acquireTime"] = lease_time(renewed - datetime.timedelta(minutes=5))
        spec["renewTime"] = lease_time(renewed)
    return {"metadata": {"name": name, "labels": {wire.SHARD_RING_LABEL: "ring"}}, "spec": spec}


@pytest.mark.parametrize(
    ("holder", "renewed_ago", "state"),
    [
        ("s", 0, ShardState.READY),
        ("s", 9.9, ShardState.READY),
        ("s", 10, ShardState.EXPIRED),  # renew time + duration reached
        ("s", 19.9, ShardState.EXPIRED),
        ("s", 20, ShardState.UNCERTAIN),  # expired a whole lease duration ago
        ("", 0, ShardState.DEAD),  # released by the shard
        (None, 0, ShardState.DEAD),
        (wire.SHARD_LEASE_TAKEN_BY_SHARDER, 0, ShardState.DEAD),  # taken over by the sharder
        ("someone-else", 0, ShardState.DEAD),  # the holder must be the Lease's name
        ("", 10 + ORPHAN_AFTER.total_seconds(), ShardState.ORPHANED),
    ],
)
def test_shard_state_from_its_lease(holder: str | None, renewed_ago: float, state: ShardState) -> None:
    shard = shard_of_lease(lease("s", holder, NOW - datetime.timedelta(seconds=renewed_ago)), NOW)
    assert (shard.name, shard.state) == ("s", state)


def test_a_lease_without_times_counts_as_just_expired() -> None:
    assert shard_of_lease(lease("s", "s", None), NOW).state == ShardState.EXPIRED


def test_available_shards_are_on_the_ring_and_dead_ones_are_not() -> None:
    assert [s for s in ShardState if s.available] == [
        ShardState.UNCERTAIN,
        ShardState.EXPIRED,
        ShardState.READY,
    ]
    shards = [
        shard_of_lease(lease("ready", "ready", NOW), NOW),
        shard_of_lease(lease("slow", "slow", NOW - datetime.timedelta(seconds=12)), NOW),
        shard_of_lease(lease("gone", "", NOW), NOW),
    ]
    assert ring_of(shards).shards == {"ready", "slow"}


def test_when_a_shard_state_changes_by_the_clock() -> None:
    ready = shard_of_lease(lease("s", "s", NOW - datetime.timedelta(seconds=4)), NOW)
    assert ready.next_change(NOW) == datetime.timedelta(seconds=6)
    expired = shard_of_lease(lease("s", "s", NOW - datetime.timedelta(seconds=14)), NOW)
    assert expired.next_change(NOW) == datetime.timedelta(seconds=6)


def test_the_settle_waits_for_the_youngest_available_shard() -> None:
    def shard(name: str, state: ShardState, acquired_ago: float | None) -> Shard:
        acquired = None if acquired_ago is None else NOW - datetime.timedelta(seconds=acquired_ago)
        return Shard(name, state, NOW, datetime.timedelta(seconds=10), acquired)

    old, young = shard("a", ShardState.READY, 30), shard("b", ShardState.READY, 1)
    assert settle_left([old], NOW, 3.0) <= 0  # a ring that has not changed lately: at once
    assert settle_left([old, young], NOW, 3.0) == pytest.approx(2.0)  # the youngest decides
    # A shard off the ring (its Lease released just now) does not hold the placement back.
    assert settle_left([old, shard("c", ShardState.DEAD, 0)], NOW, 3.0) <= 0
    # A Lease that does not say when it was acquired counts as old; no shard at all: no wait.
    assert settle_left([shard("d", ShardState.READY, None)], NOW, 3.0) == 0
    assert settle_left([], NOW, 3.0) == 0
    # Read from the Lease as the holder wrote it.
    fresh = lease("e", "e", NOW)
    fresh["spec"]["acquireTime"] = lease_time(NOW - datetime.timedelta(seconds=0.5))
    assert settle_left([shard_of_lease(fresh, NOW)], NOW, 3.0) == pytest.approx(2.5, abs=1e-3)


def shards(**states: ShardState) -> dict[str, Shard]:
    return {n: Shard(n, s, NOW, datetime.timedelta(seconds=10)) for n, s in states.items()}


def labels(shard: str | None = None, drain: bool = False) -> dict[str, str]:
    found = {"app": "x"}
    if shard is not None:
        found[shard_label("ring")] = shard
    if drain:
        found[drain_label("ring")] = "true"
    return found


def test_an_unassigned_object_is_assigned_at_once() -> None:
    assert placement(labels(), "a", shards(a=ShardState.READY), "ring") == Move("a", drain=False)


def test_an_object_in_place_is_left_alone() -> None:
    assert placement(labels("a"), "a", shards(a=ShardState.READY), "ring") is None
    assert placement(labels(), None, {}, "ring") is None  # no shard available


def test_an_object_on_an_available_shard_is_drained_first() -> None:
    for state in (ShardState.READY, ShardState.EXPIRED, ShardState.UNCERTAIN):
        found = shards(a=state, b=ShardState.READY)
        assert placement(labels("a"), "b", found, "ring") == Move("a", drain=True)
        # Until its shard has let go, nothing more.
        assert placement(labels("a", drain=True), "b", found, "ring") is None


def test_an_object_of_a_dead_or_unknown_shard_moves_directly() -> None:
    found = shards(a=ShardState.DEAD, b=ShardState.READY)
    assert placement(labels("a"), "b", found, "ring") == Move("b", drain=False)
    assert placement(labels("a", drain=True), "b", found, "ring") == Move("b", drain=False)
    assert placement(labels("vanished"), "b", found, "ring") == Move("b", drain=False)


def test_one_write_per_step_under_the_resource_version() -> None:
    assert label_patch(Move("a", drain=True), "ring", "7") == {
        "metadata": {"resourceVersion": "7", "labels": {drain_label("ring"): "true"}}
    }
    assert label_patch(Move("b", drain=False), "ring", "8") == {
        "metadata": {"resourceVersion": "8", "labels": {shard_label("ring"): "b", drain_label("ring"): None}}
    }


def test_sharding_options_are_checked() -> None:
    ok = ShardingOptions(controller_ring="web", shard_name="pod-0")
    assert ok.lease_options().name == ok.lease_options().identity == "pod-0"
    assert ok.sharder_lease == "web-sharder"
    with pytest.raises(InvalidOptions) as bad:
        ShardingOptions(controller_ring="Web_Ring", shard_name="pod-0")
    assert bad.value.fields == ("controller_ring",)
    with pytest.raises(InvalidOptions) as bad:
        ShardingOptions(controller_ring="web", shard_name="pod/0")
    assert bad.value.fields == ("shard_name",)
    with pytest.raises(InvalidOptions) as bad:
        ShardingOptions(controller_ring="web", shard_name="pod-0", lease_duration=5, renew_deadline=6)
    assert bad.value.fields == ("lease_duration", "renew_deadline")
    with pytest.raises(InvalidOptions) as bad:
        ShardingOptions(controller_ring="web", shard_name="pod-0", placement="even")
    assert bad.value.fields == ("placement",)
    with pytest.raises(InvalidOptions) as bad:
        ShardingOptions(controller_ring="web", shard_name="pod-0", sharder_settle=-1)
    assert bad.value.fields == ("sharder_settle",)
    assert ShardingOptions(controller_ring="web", shard_name="pod-0", sharder_settle=0).sharder_settle == 0
    with pytest.raises(InvalidOptions) as bad:
        ManagerOptions(sharding=ok, leader_election=LeaderElectionOptions())
    assert bad.value.fields == ("sharding", "leader_election")


# -- the command line (docs/scaling.md, "How") ----------------------------------------------


def _run_flags(*argv: str) -> Any:
    import click

    from resourceconsist.commands import cli

    command = cli.run
    assert isinstance(command, click.Command)
    with command.make_context("run", ["--adapter", "demo", *argv]) as context:
        return dict(context.params)


def test_the_cli_builds_the_sharding_options_from_its_flags() -> None:
    from resourceconsist.commands import cli

    assert cli._manager_options(_run_flags()).sharding is None
    options = cli._manager_options(
        _run_flags(
            "--sharding",
            "--controller-ring",
            "shop",
            "--shard-name",
            "pod-1",
            "--leader-election-namespace",
            "ops",
            "--lease-duration",
            "20",
            "--no-sharder",
            "--shard-placement",
            "balanced",
        )
    )
    assert options.sharding == ShardingOptions(
        controller_ring="shop",
        shard_name="pod-1",
        namespace="ops",
        lease_duration=20,
        sharder=False,
        placement="balanced",
    )
    assert options.leader_election is None


def test_the_shard_name_defaults_to_the_pod_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from resourceconsist.commands import cli

    monkeypatch.setenv("POD_NAME", "web-7c9d-x2")
    sharding = cli._manager_options(_run_flags("--sharding")).sharding
    assert sharding is not None
    assert (sharding.controller_ring, sharding.shard_name) == ("resourceconsist", "web-7c9d-x2")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--sharding", "--leader-elect"), "--sharding and --leader-elect exclude each other"),
        (
            ("--sharding", "--controller-ring", "Shop_1"),
            "it ends the shard label's key; adjust --controller-ring",
        ),
        (("--sharding", "--shard-name", "a/b"), "must be a label value"),
        (("--sharding", "--shard-name", "a/b"), "; adjust --shard-name"),
        (
            ("--sharding", "--lease-duration", "5", "--renew-deadline", "8"),
            "; adjust --lease-duration/--renew-deadline",
        ),
    ],
)
def test_bad_sharding_flags_are_usage_errors(argv: tuple[str, ...], message: str) -> None:
    import click

    from resourceconsist.commands import cli

    with pytest.raises(click.UsageError) as err:
        cli._manager_options(_run_flags(*argv))
    assert message in err.value.message


def test_the_webhook_does_not_ride_on_a_sharded_replica() -> None:
    from click.testing import CliRunner

    from resourceconsist.commands import cli

    result = CliRunner().invoke(cli.main, ["run", "--adapter", "demo", "--sharding", "--webhook"])
    assert result.exit_code == 2
    assert "--webhook cannot ride on a sharded replica" in result.output
