"""The lease fence (docs/concepts.md, "Fencing"): its deadline, which code it binds (tasks and
the threads they hand work to), and the checks before provider calls. The process-level proof
(a leader frozen past its Lease, then resumed, sends nothing) is in tests/frame/test_fencing.py;
the check in the Kubernetes client's send step in tests/frame/test_aiokube.py."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from resourceconsist.errors import PassCancelled
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.flow.fence import (
    Fence,
    LeaseLost,
    acting_for,
    check_fence,
    current_fence,
    fence_clock,
    fence_lost,
)


def test_a_fence_is_held_until_its_deadline_and_never_before_it_is_set() -> None:
    fence = Fence("ns/lease")
    assert not fence.held and fence.remaining() == -math.inf
    with pytest.raises(LeaseLost, match="ns/lease is not surely held by this process \\(never held\\)"):
        fence.check()
    fence.hold_until(fence_clock() + 60)
    assert fence.held and 59 < fence.remaining() <= 60
    fence.check()
    fence.hold_until(fence_clock() - 1.5)
    with pytest.raises(LeaseLost, match="its deadline passed 1\\.5"):
        fence.check()
    fence.hold_until(fence_clock() + 60)
    fence.drop()
    assert not fence.held


def test_a_lost_lease_is_a_cancelled_pass() -> None:
    # Everything that gives up on a cancelled pass gives up on a lost Lease too.
    assert issubclass(LeaseLost, PassCancelled)


def test_the_fence_clock_runs_like_the_monotonic_one() -> None:
    before, wall = fence_clock(), time.monotonic()
    time.sleep(0.05)
    assert fence_clock() - before == pytest.approx(time.monotonic() - wall, abs=0.01)


def test_outside_anything_done_for_a_lease_nothing_is_fenced() -> None:
    assert current_fence() is None
    check_fence()
    assert not fence_lost()
    with acting_for(None):
        check_fence()


async def test_tasks_and_their_threads_act_for_the_fence_they_were_started_under() -> None:
    fence = Fence("ns/lease")
    fence.hold_until(fence_clock() + 60)

    async def task() -> list[Fence | None]:
        return [current_fence(), await asyncio.to_thread(current_fence)]

    with acting_for(fence):
        started = asyncio.create_task(task())
    outside = asyncio.create_task(task())
    assert await started == [fence, fence]
    assert await outside == [None, None]


async def test_no_provider_call_starts_for_a_lease_no_longer_held() -> None:
    """``call_adapter`` checks the fence right before the call, in the call's own thread for a
    plain function, and before awaiting a coroutine function."""
    fence = Fence("ns/lease")
    calls: list[str] = []

    def plain() -> str:
        calls.append("plain")
        return "done"

    async def coroutine() -> str:
        calls.append("coroutine")
        return "done"

    with acting_for(fence):
        fence.hold_until(fence_clock() + 60)
        assert await call_adapter(plain) == "done"
        assert await call_adapter(coroutine) == "done"
        fence.hold_until(fence_clock() - 0.001)
        assert fence_lost()
        with pytest.raises(LeaseLost):
            await call_adapter(plain)
        with pytest.raises(LeaseLost):
            await call_adapter(coroutine)
    assert calls == ["plain", "coroutine"]
