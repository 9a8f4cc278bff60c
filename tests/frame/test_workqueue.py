"""Unit tests for ``resourceconsist.runtime.workqueue``: client-go workqueue semantics and rate limiters.

Delays are asserted on the rate limiters' returned values (with an injected clock for the
bucket); real timers are used only where a timer has to fire, with short delays and every wait
bounded by ``asyncio.wait_for``.
"""

from __future__ import annotations

import asyncio

import pytest

from resourceconsist.runtime.workqueue import (
    LOW_PRIORITY,
    NORMAL_PRIORITY,
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    WorkQueue,
    default_controller_rate_limiter,
)
from resourceconsist.testing import async_wait_for

TIMEOUT = 2.0


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FixedLimiter:
    """A rate limiter that always answers ``delay`` and records every call."""

    def __init__(self, delay: float, requeues: int = 0) -> None:
        self.delay = delay
        self.requeues = requeues
        self.when_calls: list[str] = []
        self.forget_calls: list[str] = []

    def when(self, item: str) -> float:
        self.when_calls.append(item)
        return self.delay

    def forget(self, item: str) -> None:
        self.forget_calls.append(item)

    def num_requeues(self, item: str) -> int:
        return self.requeues


async def settle(rounds: int = 20) -> None:
    """Let every ready callback and task run (no timers involved)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def get(queue: WorkQueue) -> str | None:
    return await asyncio.wait_for(queue.get(), TIMEOUT)


# --- the queue ----------------------------------------------------------------------------


async def test_key_is_never_handed_to_two_workers_and_is_redelivered_once_after_done() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    in_flight: set[str] = set()
    overlaps: list[tuple[int, str]] = []
    deliveries: list[tuple[int, str]] = []
    started: asyncio.Queue[str] = asyncio.Queue()
    releases = [asyncio.Event() for _ in range(10)]

    async def worker(n: int) -> None:
        while True:
            key = await queue.get()
            if key is None:
                return
            if key in in_flight:
                overlaps.append((n, key))
            in_flight.add(key)
            index = len(deliveries)
            deliveries.append((n, key))
            started.put_nowait(key)
            await releases[index].wait()
            in_flight.discard(key)
            queue.done(key)

    workers = [asyncio.create_task(worker(n)) for n in range(3)]
    try:
        queue.add("ns/svc")
        assert await asyncio.wait_for(started.get(), TIMEOUT) == "ns/svc"

        # Added again (several times) while a worker holds it: nobody else gets it.
        queue.add("ns/svc")
        queue.add("ns/svc")
        await settle()
        queue.add("ns/svc")
        await settle()
        assert started.empty()
        assert len(deliveries) == 1
        assert queue.processing() == {"ns/svc"}
        assert len(queue) == 0  # held back until done, not queued

        releases[0].set()  # the worker finishes -> the key is handed out again
        assert await asyncio.wait_for(started.get(), TIMEOUT) == "ns/svc"
        assert len(deliveries) == 2

        releases[1].set()  # not added meanwhile -> not handed out again
        await settle()
        assert started.empty()
        assert len(deliveries) == 2
        assert queue.processing() == set()
        assert len(queue) == 0
        assert overlaps == []
    finally:
        await queue.shutdown()
        for event in releases:
            event.set()
        await asyncio.wait_for(asyncio.gather(*workers), TIMEOUT)


async def test_other_keys_are_processed_concurrently_while_one_is_held() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    queue.add("a")
    queue.add("b")
    assert await get(queue) == "a"
    queue.add("a")  # dirty while processing
    assert await get(queue) == "b"  # "a" is not handed out a second time
    assert queue.processing() == {"a", "b"}
    assert len(queue) == 0
    queue.done("a")
    assert await get(queue) == "a"
    await queue.shutdown()


async def test_repeated_adds_coalesce_and_keep_first_position() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    for key in ["a", "b", "a", "c", "a", "b"]:
        queue.add(key)
    assert len(queue) == 3
    assert [await get(queue), await get(queue), await get(queue)] == ["a", "b", "c"]
    assert len(queue) == 0
    await queue.shutdown()


async def test_key_can_be_added_again_once_taken() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    queue.add("a")
    assert await get(queue) == "a"
    queue.done("a")
    queue.add("a")
    assert len(queue) == 1
    assert await get(queue) == "a"
    await queue.shutdown()


async def test_done_without_new_add_does_not_requeue() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    queue.add("a")
    assert await get(queue) == "a"
    queue.done("a")
    assert len(queue) == 0
    assert queue.processing() == set()
    await queue.shutdown()


async def test_getter_waiting_on_empty_queue_is_woken_by_add() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    waiter = asyncio.create_task(queue.get())
    await settle()
    assert not waiter.done()
    queue.add("late")
    assert await asyncio.wait_for(waiter, TIMEOUT) == "late"
    await queue.shutdown()


async def test_add_after_delays_the_add() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    loop = asyncio.get_running_loop()
    start = loop.time()
    queue.add_after("k", 0.05)
    await settle()
    assert len(queue) == 0  # not yet
    assert await get(queue) == "k"
    # asyncio may fire a timer up to its clock resolution early; allow a small margin.
    assert loop.time() - start >= 0.04
    await queue.shutdown()


async def test_add_after_zero_or_negative_adds_now() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    queue.add_after("zero", 0)
    queue.add_after("negative", -1.0)
    assert len(queue) == 2
    assert [await get(queue), await get(queue)] == ["zero", "negative"]
    await queue.shutdown()


async def test_earlier_add_after_replaces_a_later_pending_one() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    loop = asyncio.get_running_loop()
    start = loop.time()
    queue.add_after("k", 60.0)
    queue.add_after("k", 0.02)  # earlier: wins
    assert await get(queue) == "k"
    assert loop.time() - start < 30.0
    # The 60 s timer was cancelled, nothing else is pending for the key.
    assert queue._waiting == {}
    await queue.shutdown()


async def test_later_add_after_does_not_postpone_a_pending_one() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    loop = asyncio.get_running_loop()
    start = loop.time()
    queue.add_after("k", 0.02)
    queue.add_after("k", 60.0)  # later: ignored
    assert await get(queue) == "k"
    assert loop.time() - start < 30.0
    assert queue._waiting == {}
    queue.done("k")
    await settle()
    assert len(queue) == 0  # fired once, not twice
    await queue.shutdown()


async def test_add_after_coalesces_with_a_key_already_queued() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    queue.add("k")
    queue.add_after("k", 0.01)
    assert await get(queue) == "k"
    # A later timer: once it has fired, the 0.01 s one has fired too (timers run in order).
    queue.add_after("marker", 0.03)
    assert await get(queue) == "marker"
    # The delayed add of "k" fired while "k" was processing: held back until done.
    assert len(queue) == 0
    queue.done("k")
    assert len(queue) == 1
    assert await get(queue) == "k"
    await queue.shutdown()


async def test_add_rate_limited_delay_doubles_per_failure_and_forget_resets() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter(0.005, 1000.0))
    delays = [queue.add_rate_limited("k") for _ in range(5)]
    assert delays == pytest.approx([0.005, 0.01, 0.02, 0.04, 0.08])
    assert queue.num_requeues("k") == 5
    assert queue.num_requeues("other") == 0

    # The first (shortest) delayed add wins; the key arrives once.
    assert await get(queue) == "k"
    queue.done("k")

    queue.forget("k")
    assert queue.num_requeues("k") == 0
    assert queue.add_rate_limited("k") == pytest.approx(0.005)
    assert await get(queue) == "k"
    await queue.shutdown()


async def test_add_rate_limited_returns_the_limiter_verdict() -> None:
    limiter = FixedLimiter(0.0, requeues=7)
    queue = WorkQueue(rate_limiter=limiter)
    assert queue.add_rate_limited("k") == 0.0
    assert limiter.when_calls == ["k"]
    assert len(queue) == 1  # zero delay: added right away
    assert queue.num_requeues("k") == 7
    queue.forget("k")
    assert limiter.forget_calls == ["k"]
    await queue.shutdown()


async def test_default_rate_limiter_is_used_when_none_given() -> None:
    queue = WorkQueue()
    assert isinstance(queue.rate_limiter, MaxOfRateLimiter)
    await queue.shutdown()


async def test_shutdown_wakes_every_waiting_getter_with_none() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    getters = [asyncio.create_task(queue.get()) for _ in range(3)]
    await settle()
    assert not any(getter.done() for getter in getters)

    await queue.shutdown()

    assert await asyncio.wait_for(asyncio.gather(*getters), TIMEOUT) == [None, None, None]
    assert queue.shutting_down


async def test_after_shutdown_adds_are_ignored_and_get_returns_none() -> None:
    queue = WorkQueue(rate_limiter=FixedLimiter(0.0))
    await queue.shutdown()

    queue.add("a")
    queue.add_after("b", 0.01)
    queue.add_after("c", 0)
    queue.add_rate_limited("d")

    assert len(queue) == 0
    assert queue._waiting == {}
    assert await get(queue) is None


async def test_shutdown_drops_queued_keys_and_pending_delayed_adds() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    queue.add("queued")
    queue.add_after("delayed", 0.01)
    await queue.shutdown()
    assert queue._waiting == {}
    assert await get(queue) is None


async def test_done_after_shutdown_does_not_requeue() -> None:
    queue = WorkQueue(rate_limiter=ItemExponentialFailureRateLimiter())
    queue.add("a")
    assert await get(queue) == "a"
    queue.add("a")  # dirty while processing
    await queue.shutdown()
    queue.done("a")
    assert queue.processing() == set()
    assert await get(queue) is None


# --- rate limiters --------------------------------------------------------------------------


def test_item_exponential_doubles_from_5ms() -> None:
    limiter = ItemExponentialFailureRateLimiter()
    assert [limiter.when("k") for _ in range(6)] == pytest.approx([0.005, 0.01, 0.02, 0.04, 0.08, 0.16])
    assert limiter.num_requeues("k") == 6


def test_item_exponential_caps_at_1000s() -> None:
    limiter = ItemExponentialFailureRateLimiter()
    delays = [limiter.when("k") for _ in range(25)]
    # 0.005 * 2**17 = 655.36 s, 0.005 * 2**18 = 1310.72 s -> capped.
    assert delays[17] == pytest.approx(655.36)
    assert delays[18:] == [1000.0] * 7
    assert delays == sorted(delays)


def test_item_exponential_survives_huge_failure_counts() -> None:
    limiter = ItemExponentialFailureRateLimiter()
    for _ in range(2000):
        delay = limiter.when("k")
    assert delay == 1000.0
    assert limiter.num_requeues("k") == 2000


def test_item_exponential_is_per_item_and_forget_resets_one_item() -> None:
    limiter = ItemExponentialFailureRateLimiter(base=1.0, max_delay=100.0)
    assert [limiter.when("a"), limiter.when("a"), limiter.when("a")] == [1.0, 2.0, 4.0]
    assert limiter.when("b") == 1.0
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.num_requeues("b") == 1
    assert limiter.when("a") == 1.0
    assert limiter.when("b") == 2.0
    limiter.forget("never-seen")  # no error


def test_bucket_allows_100_immediately_then_spaces_at_100ms() -> None:
    clock = FakeClock()
    limiter = BucketRateLimiter(clock=clock)
    assert (limiter.qps, limiter.burst) == (10.0, 100)

    burst = [limiter.when(f"item-{n}") for n in range(100)]
    assert burst == [0.0] * 100

    # Every further reservation is 0.1 s after the previous one (x/time/rate Reserve().Delay()).
    assert [limiter.when(f"more-{n}") for n in range(3)] == pytest.approx([0.1, 0.2, 0.3])


def test_bucket_refills_with_time_up_to_burst() -> None:
    clock = FakeClock()
    limiter = BucketRateLimiter(qps=10.0, burst=100, clock=clock)
    for n in range(102):
        limiter.when(f"k{n}")  # 2 tokens in debt

    clock.advance(0.2)  # pays the debt back, nothing saved
    assert limiter.when("x") == pytest.approx(0.1)

    clock.advance(0.35)  # debt of 1 token paid, 2.5 tokens saved
    assert [limiter.when("y") for _ in range(3)] == pytest.approx([0.0, 0.0, 0.05])

    clock.advance(10_000.0)  # saved tokens never exceed the burst
    assert [limiter.when("z") for _ in range(100)] == [0.0] * 100
    assert limiter.when("z") == pytest.approx(0.1)


def test_bucket_with_small_burst_and_other_qps() -> None:
    clock = FakeClock()
    limiter = BucketRateLimiter(qps=4.0, burst=2, clock=clock)
    assert [limiter.when("k") for _ in range(5)] == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.75])


def test_bucket_forget_and_num_requeues_are_inert() -> None:
    clock = FakeClock()
    limiter = BucketRateLimiter(clock=clock)
    for _ in range(101):
        limiter.when("k")
    assert limiter.num_requeues("k") == 0
    limiter.forget("k")
    assert limiter.when("k") == pytest.approx(0.2)  # forget gives no token back


def test_max_of_picks_the_longest_delay() -> None:
    short, long_, middle = FixedLimiter(0.1), FixedLimiter(5.0), FixedLimiter(1.0)
    limiter = MaxOfRateLimiter(short, long_, middle)
    assert limiter.when("k") == 5.0
    # Every limiter is consulted (the bucket must reserve its token even when it is not the max).
    assert short.when_calls == long_.when_calls == middle.when_calls == ["k"]


def test_max_of_forget_reaches_every_limiter_and_num_requeues_is_the_max() -> None:
    a, b = FixedLimiter(0.0, requeues=2), FixedLimiter(0.0, requeues=9)
    limiter = MaxOfRateLimiter(a, b)
    limiter.forget("k")
    assert a.forget_calls == b.forget_calls == ["k"]
    assert limiter.num_requeues("k") == 9


def test_max_of_item_backoff_and_bucket() -> None:
    clock = FakeClock()
    limiter = MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0), BucketRateLimiter(clock=clock)
    )
    # Within the burst the per-item backoff decides.
    assert limiter.when("k") == pytest.approx(0.005)
    assert limiter.when("k") == pytest.approx(0.01)
    for n in range(98):
        limiter.when(f"other-{n}")
    # Bucket exhausted: it decides for a fresh item.
    assert limiter.when("fresh") == pytest.approx(0.1)
    # A long-failing item's backoff beats the bucket.
    for _ in range(10):
        limiter.when("failing")
    assert limiter.when("failing") == pytest.approx(0.005 * 2**10)
    assert limiter.num_requeues("failing") == 11


def test_default_controller_rate_limiter_shape() -> None:
    limiter = default_controller_rate_limiter()
    assert isinstance(limiter, MaxOfRateLimiter)
    item_limiters = [x for x in limiter.limiters if isinstance(x, ItemExponentialFailureRateLimiter)]
    buckets = [x for x in limiter.limiters if isinstance(x, BucketRateLimiter)]
    assert len(limiter.limiters) == 2
    assert [(x.base, x.max_delay) for x in item_limiters] == [(0.005, 1000.0)]
    assert [(x.qps, x.burst) for x in buckets] == [(10.0, 100)]


def test_default_controller_rate_limiter_behaviour() -> None:
    limiter = default_controller_rate_limiter()
    assert [limiter.when("k") for _ in range(3)] == pytest.approx([0.005, 0.01, 0.02])
    assert limiter.num_requeues("k") == 3
    limiter.forget("k")
    assert limiter.num_requeues("k") == 0
    assert limiter.when("k") == pytest.approx(0.005)


def test_each_default_limiter_is_independent() -> None:
    first = default_controller_rate_limiter()
    second = default_controller_rate_limiter()
    for _ in range(5):
        first.when("k")
    assert second.num_requeues("k") == 0
    assert second.when("k") == pytest.approx(0.005)


# -- priorities (controller-runtime's priority queue) ---------------------------------------------


async def _drain(queue: WorkQueue) -> list[str]:
    """Every key the queue hands out now, in order (each done at once)."""
    keys: list[str] = []
    while len(queue):
        key = await asyncio.wait_for(queue.get(), TIMEOUT)
        assert key is not None
        keys.append(key)
        queue.done(key)
    return keys


async def test_a_change_is_handed_out_before_every_key_a_cache_only_listed() -> None:
    queue = WorkQueue()
    for name in ("a", "b", "c"):
        queue.add(f"ns/{name}", LOW_PRIORITY)
    queue.add("ns/changed")
    assert queue.depth_by_priority() == {LOW_PRIORITY: 3, NORMAL_PRIORITY: 1}
    # Keys of one priority in the order they came.
    assert await _drain(queue) == ["ns/changed", "ns/a", "ns/b", "ns/c"]


async def test_a_key_asked_for_again_at_a_higher_priority_moves_up_once() -> None:
    queue = WorkQueue()
    queue.add("ns/a", LOW_PRIORITY)
    queue.add("ns/b", LOW_PRIORITY)
    queue.add("ns/b")  # a change of b while it waits: raised, not added twice
    queue.add("ns/a", LOW_PRIORITY)  # a lower ask changes nothing
    assert queue.depth_by_priority() == {NORMAL_PRIORITY: 1, LOW_PRIORITY: 1}
    assert await _drain(queue) == ["ns/b", "ns/a"]


async def test_a_key_raised_while_processed_comes_back_at_the_higher_priority() -> None:
    queue = WorkQueue()
    queue.add("ns/a", LOW_PRIORITY)
    held = await asyncio.wait_for(queue.get(), TIMEOUT)
    assert held == "ns/a" and queue.priority("ns/a") == LOW_PRIORITY
    queue.add("ns/b", LOW_PRIORITY)
    queue.add("ns/a", LOW_PRIORITY)
    queue.add("ns/a")  # changed while a worker holds it
    queue.done("ns/a")
    assert await _drain(queue) == ["ns/a", "ns/b"]


async def test_a_delayed_add_keeps_its_priority() -> None:
    queue = WorkQueue()
    queue.add_after("ns/late", 0.01, LOW_PRIORITY)
    queue.add_rate_limited("ns/retry", LOW_PRIORITY)
    queue.add("ns/now")
    await async_wait_for(lambda: len(queue) == 3, timeout=TIMEOUT, message="the delayed adds")
    assert queue.depth_by_priority() == {NORMAL_PRIORITY: 1, LOW_PRIORITY: 2}


# -- client-go's workqueue series (docs/observability.md) -------------------------------------


async def test_the_queue_reports_client_gos_workqueue_series() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from resourceconsist.runtime.metrics import Metrics

    metrics = Metrics()
    series = metrics.standard.controller("shop", 3)
    queue = WorkQueue(FixedLimiter(0.01), name="shop", metrics=series.queue)
    labels = {"name": "shop", "controller": "shop"}

    def value(name: str, **more: str) -> float:
        found = metrics.registry.get_sample_value(name, labels | more)
        return 0.0 if found is None else found

    queue.add("ns/a")
    queue.add("ns/a")  # coalesced: one add
    queue.add("ns/b")
    assert value("workqueue_adds_total") == 2
    assert value("workqueue_depth", priority="0") == 2
    assert value("workqueue_depth", priority="-100") == 0  # shown from the start
    key = await asyncio.wait_for(queue.get(), TIMEOUT)
    assert value("workqueue_queue_duration_seconds_count") == 1
    assert value("workqueue_depth", priority="0") == 1
    # Held by a worker: its work is unfinished and the longest running.
    assert value("workqueue_unfinished_work_seconds") > 0
    assert value("workqueue_longest_running_processor_seconds") > 0
    queue.add_rate_limited("ns/c")
    queue.add_after("ns/d", 0)
    assert value("workqueue_retries_total") == 2
    assert key is not None
    queue.done(key)
    assert value("workqueue_work_duration_seconds_count") == 1
    assert value("workqueue_unfinished_work_seconds") == 0
    # A queue made again (a controller restarted) reports under the same series.
    again = WorkQueue(name="shop", metrics=series.queue)
    again.add("ns/e")
    assert value("workqueue_adds_total") == 4  # a, b, d (no delay: added at once), e; c still waits
    assert value("workqueue_depth", priority="0") == 1
    exposition = metrics.exposition().decode()
    families = {family.name for family in text_string_to_metric_families(exposition)}
    assert {"workqueue_depth", "workqueue_adds", "workqueue_retries"} <= families
