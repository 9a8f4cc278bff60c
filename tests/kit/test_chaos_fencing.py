"""The freeze measurement of ``make chaos`` (bench/chaos_fencing.py): which requests it calls late,
which of them came after another replica took the Lease over, and when a frozen replica's Leases
were taken over, worked out from audit records of a known story (docs/chaos.md, "Freezes")."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from chaos_fencing import ApiRequest, Freeze, Identity, ProviderCall, judge, takeovers

from resourceconsist.runtime.sharding.ring import drain_label

LEASE = "resourceconsist-manager"
SECONDS = 6.0


def lease_write(who: str, at: float, name: str = LEASE, code: int = 200) -> ApiRequest:
    return ApiRequest(who, "update", "leases", "", "chaos", name, code, at)


def pod_patch(who: str, at: float, code: int = 200) -> ApiRequest:
    return ApiRequest(who, "patch", "pods", "", "chaos", "pod-1", code, at)


def test_a_leader_frozen_past_its_lease_is_late_after_the_take_over() -> None:
    """a renews at 0, 2, 4 and is frozen at 5; b takes over at 11 and renews; a resumes at 20
    and patches a pod (refused) and calls the provider: both late, both after the take-over. a's
    patch at 3 (before its deadline) and b's are not."""
    a, b = Identity("a", "freeze-leader", LEASE), Identity("b", "freeze-leader", LEASE)
    api = [
        lease_write("a", 0.0),
        lease_write("a", 2.0),
        pod_patch("a", 3.0),
        lease_write("a", 4.0),
        lease_write("b", 4.5, code=409),
        lease_write("b", 11.0),
        pod_patch("b", 12.0),
        lease_write("b", 13.0),
        pod_patch("a", 20.01, code=409),
    ]
    calls = [ProviderCall("a", "AddVServerGroupBackendServers", 20.02, None, "rsp-1")]
    freeze = Freeze("a", "freeze-leader", "leader", "in flight", 5.0, 20.0)

    verdicts = {v.identity: v for v in judge([a, b], api, calls, [freeze], SECONDS)}

    late = verdicts["a"].late
    assert [(item.where, item.accepted, item.after_takeover) for item in late] == [
        ("api", False, True),
        ("provider", True, True),
    ]
    assert late[0].past_deadline is not None and abs(late[0].past_deadline - 10.01) < 1e-6
    assert late[1].after_resume is not None and abs(late[1].after_resume - 0.02) < 1e-6
    assert verdicts["a"].api_writes == 2 and verdicts["a"].lease_writes == 3
    assert verdicts["b"].late == []

    (taken,) = takeovers([a, b], api, [freeze])
    assert (taken.lease, taken.kind, taken.by) == (LEASE, "leader", "b")
    assert taken.seconds is not None and abs(taken.seconds - 6.0) < 1e-6


def test_a_stale_sharder_drain_is_a_sharder_write_by_a_non_holder() -> None:
    """s holds the sharder's Lease (written at 0), is frozen at 1; t takes the sharder's Lease
    over at 8; s resumes at 15 and drains a Service: a late sharder drain, accepted. A shard
    letting go (both labels removed) is no sharder write; s's own shard Lease is taken over too."""
    s = Identity("s", "freeze-sharded", "s", "chaos-sharder", "chaos")
    t = Identity("t", "freeze-sharded", "t", "chaos-sharder", "chaos")
    drain = {"metadata": {"labels": {drain_label("chaos"): "true"}}}
    api = [
        lease_write("s", 0.0, "chaos-sharder"),
        lease_write("s", 0.0, "s"),
        lease_write("t", 0.0, "t"),
        lease_write("t", 8.0, "chaos-sharder"),
        lease_write("t", 13.0, "s"),
        ApiRequest("s", "patch", "services", "", "chaos", "svc-1", 200, 15.1, drain),
    ]
    freeze = Freeze("s", "freeze-sharded", "sharder holder", "after a sharder write", 1.0, 15.0)

    verdicts = {v.identity: v for v in judge([s, t], api, [], [freeze], SECONDS)}

    (late,) = verdicts["s"].late
    assert (late.kind, late.lease) == ("drain", "chaos-sharder")
    assert late.accepted and late.after_takeover
    assert verdicts["s"].sharder("drain", accepted=True) == 1
    taken = {(x.kind, x.by, x.seconds) for x in takeovers([s, t], api, [freeze])}
    assert taken == {("sharder", "t", 7.0), ("shard", "t", 12.0)}
