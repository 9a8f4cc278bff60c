"""The traffic benchmark's short version as a correctness test (bench/bench_traffic.py;
docs/zero-downtime.md, "Measured under traffic"): on the real node, a Deployment of 2 replicas of
the HTTP test server behind a real HAProxy that the ``haproxy`` adapter keeps (its controller a
``resourceconsist run`` process, the webhook giving the pods their gate and drain), rolled while
the open-loop load generator sends a steady stream of requests to HAProxy's frontend only.

With the readiness gate and the drain on, not one request may fail, with the drain's sleep and
with the drain waiter (whose rollout must not wait the drain time out). With both off and
HAProxy's health checks slowed, the same rollout must lose requests: the instrument sees failures
when there are some.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from resourceconsist.adapters.haproxy import (
    BACKEND_ANNOTATION,
    OPTIONS_ANNOTATION,
    PORT_ANNOTATION,
    webhook_adapter,
)
from resourceconsist.testing import RealNodeCluster
from resourceconsist.testing.haproxy import LocalHAProxy, SocketProxy
from resourceconsist.testing.traffic import (
    APART,
    OFF,
    SLEEP,
    WAIT,
    Protection,
    RunResult,
    Scenario,
    TrafficRig,
    haproxy_target,
)

#: A steady stream: enough to see a failure of a few milliseconds, light on a shared CI machine.
RATE = 200.0
DRAIN_SECONDS = 12
ROLL = Scenario("roll-2", "rolling update of 2 replicas", "roll", replicas=2)


@pytest.fixture
async def rig(real_node_cluster: RealNodeCluster, tmp_path: Path) -> AsyncIterator[TrafficRig]:
    # The manager's image holds the drain waiter; the session's node imported it at start.
    image = f"localhost/resourceconsist:{importlib.metadata.version('resourceconsist')}"
    assert image in real_node_cluster.images_present()
    with (
        LocalHAProxy(["web"], log_failures=True, niceness=APART) as haproxy,
        SocketProxy(haproxy.socket) as proxy,
    ):
        target = haproxy_target(
            haproxy,
            proxy,
            adapter="haproxy",
            webhook=webhook_adapter(),
            service_annotations={BACKEND_ANNOTATION: "web", PORT_ANNOTATION: "http"},
        )
        async with TrafficRig(
            real_node_cluster,
            target,
            tmp_path / "rig",
            rate=RATE,
            drain_seconds=DRAIN_SECONDS,
            replicas_processes=1,
            waiter_image=image,
            settle_timeout=180,
        ) as found:
            yield found


def _said(result: RunResult) -> str:
    return f"{result.summary} {result.failures} HAProxy {result.logged} {result.notes}"


@pytest.mark.parametrize("protection", [SLEEP, WAIT], ids=["sleep", "wait"])
async def test_a_rollout_through_haproxy_fails_no_request_with_gates_and_drain_on(
    rig: TrafficRig, protection: Protection
) -> None:
    result = await rig.run(ROLL, protection)
    print(_said(result))
    assert result.notes == [], _said(result)
    assert result.rolled_seconds is not None and result.settled_seconds is not None
    # Every request was counted, through the whole rollout ...
    assert result.summary["sent"] >= RATE * (result.settled_seconds + 3) * 0.9, _said(result)
    # ... and not one failed: no error status, no refused or reset connection, no timeout.
    assert result.failed == 0, _said(result)
    assert result.summary["longest_gap_seconds"] < 1.0
    if protection is WAIT:
        # The last old pod, deleted as the rollout completed, left as soon as HAProxy let it go,
        # well before the drain time the sleep waits out.
        assert result.settled_seconds - result.rolled_seconds < DRAIN_SECONDS - 4, _said(result)


async def test_with_gates_and_drain_off_and_slow_health_checks_the_same_rollout_fails_requests(
    rig: TrafficRig,
) -> None:
    # HAProxy checks a new server every 3 s and wants 2 passes: a new pod is Ready (its own probe)
    # long before HAProxy sends it anything, and the old ones go at once.
    result = await rig.run(ROLL, OFF, annotations={OPTIONS_ANNOTATION: "check inter 3s rise 2 fall 3"})
    print(_said(result))
    assert result.failed > 0, _said(result)
    assert result.failed_before == 0, _said(result)
    # HAProxy's own log says why: no server to send to, or a server that stopped answering.
    assert result.logged, _said(result)
