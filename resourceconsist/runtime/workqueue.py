"""A workqueue with client-go semantics, and its rate limiters, for one asyncio event loop.

Semantics (client-go's ``workqueue.RateLimitingInterface``):
- a key is handed to at most one worker at a time; adding a key while it is being processed
  marks it dirty and hands it out again after ``done``;
- adding a key already waiting coalesces into one entry;
- ``add_after`` delays an add; ``add_rate_limited`` delays it by the rate limiter's verdict
  (per-item exponential backoff combined with an overall token bucket); ``forget`` resets the
  per-item backoff after a success;
- ``shutdown`` wakes every waiting worker with ``None`` and hands out nothing more.

All methods run on the event loop's thread (not thread-safe by design: informer threads
hand their events to the loop first).

Given ``QueueMetrics`` (the controller's ``metrics.QueueSeries``), a queue reports client-go's
workqueue series: adds, delayed adds (retries), how long a key waited and how long its work took;
its depth and the work in progress are read from it when scraped (docs/observability.md).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

# The protocol is part of the adapter API (an adapter may bring its own limiter).
from resourceconsist.adapter import RateLimiter


class ItemExponentialFailureRateLimiter:
    """``base * 2**failures``, capped at ``max_delay``, per item."""

    def __init__(self, base: float = 0.005, max_delay: float = 1000.0) -> None:
        self.base = base
        self.max_delay = max_delay
        self._failures: dict[str, int] = {}

    def when(self, item: str) -> float:
        failures = self._failures.get(item, 0)
        self._failures[item] = failures + 1
        # Cap the exponent so huge failure counts cannot overflow the float.
        return min(self.base * float(2 ** min(failures, 62)), self.max_delay)

    def forget(self, item: str) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: str) -> int:
        return self._failures.get(item, 0)


class BucketRateLimiter:
    """An overall token bucket: ``qps`` tokens a second, at most ``burst`` saved up.

    Each call reserves a token, possibly in the future, and returns how long until it is due,
    like golang.org/x/time/rate's ``Reserve().Delay()``."""

    def __init__(
        self, qps: float = 10.0, burst: int = 100, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def when(self, item: str) -> float:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def forget(self, item: str) -> None:
        return

    def num_requeues(self, item: str) -> int:
        return 0


class MaxOfRateLimiter:
    """The longest delay of several limiters (client-go's ``MaxOfRateLimiter``)."""

    def __init__(self, *limiters: RateLimiter) -> None:
        self.limiters = limiters

    def when(self, item: str) -> float:
        return max(limiter.when(item) for limiter in self.limiters)

    def forget(self, item: str) -> None:
        for limiter in self.limiters:
            limiter.forget(item)

    def num_requeues(self, item: str) -> int:
        return max(limiter.num_requeues(item) for limiter in self.limiters)


def default_controller_rate_limiter() -> RateLimiter:
    """5 ms doubling to 1000 s per item, with an overall 10 qps / burst 100 bucket."""
    return MaxOfRateLimiter(ItemExponentialFailureRateLimiter(0.005, 1000.0), BucketRateLimiter(10.0, 100))


class QueueMetrics(Protocol):
    """Where a ``WorkQueue`` reports what client-go's workqueue metrics count."""

    def track(self, queue: WorkQueue) -> None:
        """``queue`` is the one whose depth and unfinished work are scraped from now on."""

    def added(self) -> None:
        """A key was queued (not one already waiting)."""

    def retried(self) -> None:
        """A key is to be added after a delay (a rate-limited retry, a requeue-after)."""

    def waited(self, seconds: float) -> None:
        """A key was handed to a worker ``seconds`` after it was added."""

    def worked(self, seconds: float) -> None:
        """A worker finished a key after ``seconds``."""


class WorkQueue:
    """A rate-limited, coalescing, delaying queue of string keys."""

    def __init__(
        self, rate_limiter: RateLimiter | None = None, name: str = "", metrics: QueueMetrics | None = None
    ) -> None:
        self.name = name
        self.rate_limiter = rate_limiter or default_controller_rate_limiter()
        self._queue: OrderedDict[str, None] = OrderedDict()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._waiting: dict[str, asyncio.TimerHandle] = {}
        self._waiting_due: dict[str, float] = {}
        self._has_items = asyncio.Event()
        self._shutting_down = False
        self.adds = 0
        self._metrics = metrics
        #: When each queued key was added, and each key being processed was handed out (metrics).
        self._added_at: dict[str, float] = {}
        self._started_at: dict[str, float] = {}
        if metrics is not None:
            metrics.track(self)

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def processing(self) -> set[str]:
        return set(self._processing)

    def holds(self, key: str) -> bool:
        """``key`` is queued, being processed, or due to be added after a delay."""
        return key in self._queue or key in self._dirty or key in self._processing or key in self._waiting

    def claim(self, key: str) -> bool:
        """Take ``key`` as if a worker got it, unless it is queued, processing or waiting: the
        garbage pass (resourceconsist/hooks/orphans.py) holds it like this so that no reconcile of
        the key runs meanwhile; ``done(key)`` gives it back (and queues it if it was added)."""
        if self._shutting_down or self.holds(key):
            return False
        self._processing.add(key)
        return True

    def add(self, key: str) -> None:
        """Queue ``key`` unless it is already waiting; if a worker has it, queue it after ``done``."""
        if self._shutting_down or key in self._dirty:
            return
        self.adds += 1
        self._dirty.add(key)
        if self._metrics is not None:
            self._metrics.added()
            self._added_at.setdefault(key, time.monotonic())
        if key in self._processing:
            return
        self._queue[key] = None
        self._notify()

    def add_after(self, key: str, delay: float) -> None:
        """Add ``key`` after ``delay`` seconds; an earlier pending add-after wins."""
        if self._shutting_down:
            return
        if self._metrics is not None:
            self._metrics.retried()
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        if key in self._waiting:
            if self._waiting_due[key] <= due:
                return
            self._waiting.pop(key).cancel()
        self._waiting_due[key] = due
        self._waiting[key] = loop.call_at(due, self._fire, key)

    def _fire(self, key: str) -> None:
        self._waiting.pop(key, None)
        self._waiting_due.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: str) -> float:
        """Add ``key`` after the rate limiter's delay; return that delay."""
        delay = self.rate_limiter.when(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        self.rate_limiter.forget(key)

    def num_requeues(self, key: str) -> int:
        return self.rate_limiter.num_requeues(key)

    def _notify(self) -> None:
        self._has_items.set()

    async def get(self) -> str | None:
        """The next key to process (marked processing), or ``None`` once shut down (keys still
        queued are dropped: a stopping controller finishes what it holds, starts nothing new)."""
        while not self._queue or self._shutting_down:
            if self._shutting_down:
                return None
            self._has_items.clear()
            await self._has_items.wait()
        key, _ = self._queue.popitem(last=False)
        self._processing.add(key)
        self._dirty.discard(key)
        if self._metrics is not None:
            now = time.monotonic()
            added = self._added_at.pop(key, None)
            if added is not None:
                self._metrics.waited(now - added)
            self._started_at[key] = now
        return key

    def done(self, key: str) -> None:
        """A worker finished ``key``; if it was added meanwhile, queue it again."""
        self._processing.discard(key)
        started = self._started_at.pop(key, None)
        if started is not None and self._metrics is not None:
            self._metrics.worked(time.monotonic() - started)
        if key in self._dirty and not self._shutting_down:
            self._queue[key] = None
            self._notify()

    def unfinished_work(self) -> tuple[float, float]:
        """Seconds of work in progress, summed over the keys being processed, and the longest."""
        now = time.monotonic()
        ages = [now - started for started in tuple(self._started_at.values())]
        return sum(ages), max(ages, default=0.0)

    async def shutdown(self) -> None:
        self._shutting_down = True
        for handle in self._waiting.values():
            handle.cancel()
        self._waiting.clear()
        self._waiting_due.clear()
        self._has_items.set()
