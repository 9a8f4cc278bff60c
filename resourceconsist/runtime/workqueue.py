"""A workqueue with client-go semantics, and its rate limiters, for one asyncio event loop.

Semantics (client-go's ``workqueue.RateLimitingInterface``):
- a key is handed to at most one worker at a time; adding a key while it is being processed
  marks it dirty and hands it out again after ``done``;
- adding a key already waiting coalesces into one entry;
- ``add_after`` delays an add; ``add_rate_limited`` delays it by the rate limiter's verdict
  (per-item exponential backoff combined with an overall token bucket); ``forget`` resets the
  per-item backoff after a success;
- ``shutdown`` wakes every waiting worker with ``None`` and hands out nothing more.

Keys have a priority, as in controller-runtime's priority queue: ``get`` hands out the key of the
highest priority first, and keys of one priority in the order they came. The controller queues
a key at ``NORMAL_PRIORITY`` (0) for a change, and at ``LOW_PRIORITY`` (-100, controller-runtime's
``handler.LowPriority``) when a cache only listed the object again (its first list, a resync, a
full pass of every employer): so at start-up, a pass that releases a deleted pod is not queued
behind a sweep of every unchanged Service (docs/observability.md, "The workqueue's priorities").
Adding a key already queued at a higher priority raises it; a retry keeps the priority its key
was handed out with.

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
from typing import Final, Protocol

# The protocol is part of the adapter API (an adapter may bring its own limiter).
from resourceconsist.adapter import RateLimiter

#: The priority of a key queued for a change: an event that changed an object, a retry, a
#: requeue-after (controller-runtime's default, 0).
NORMAL_PRIORITY: Final = 0
#: The priority of a key queued because a cache listed its object again, nothing changed (its
#: first list, a resync, a full pass of every employer): controller-runtime's ``LowPriority``.
LOW_PRIORITY: Final = -100


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
        #: The queued keys by priority, each in the order they came.
        self._queue: dict[int, OrderedDict[str, None]] = {}
        #: The priority of each dirty key (queued, or to be queued again after ``done``).
        self._priority: dict[str, int] = {}
        #: The priority each key being processed was handed out with.
        self._handed: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._waiting: dict[str, asyncio.TimerHandle] = {}
        self._waiting_due: dict[str, float] = {}
        self._waiting_priority: dict[str, int] = {}
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
        return sum(len(keys) for keys in self._queue.values())

    def depth_by_priority(self) -> dict[int, int]:
        """How many keys wait at each priority (``workqueue_depth{priority}``)."""
        return {priority: len(keys) for priority, keys in self._queue.items() if keys}

    def priority(self, key: str) -> int:
        """The priority ``key`` was handed out with (a worker's key), else the one it waits at."""
        return self._handed.get(key, self._priority.get(key, NORMAL_PRIORITY))

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def processing(self) -> set[str]:
        return set(self._processing)

    def holds(self, key: str) -> bool:
        """``key`` is queued, being processed, or due to be added after a delay."""
        return key in self._dirty or key in self._processing or key in self._waiting

    def claim(self, key: str) -> bool:
        """Take ``key`` as if a worker got it, unless it is queued, processing or waiting: the
        garbage pass (resourceconsist/hooks/orphans.py) holds it like this so that no reconcile of
        the key runs meanwhile; ``done(key)`` gives it back (and queues it if it was added)."""
        if self._shutting_down or self.holds(key):
            return False
        self._processing.add(key)
        return True

    def add(self, key: str, priority: int = NORMAL_PRIORITY) -> None:
        """Queue ``key`` at ``priority`` unless it is already waiting (then at the higher of the
        two); if a worker has it, queue it after ``done``."""
        if self._shutting_down:
            return
        if key in self._dirty:
            if priority > self._priority[key]:
                self._raise(key, priority)
            return
        self.adds += 1
        self._dirty.add(key)
        self._priority[key] = priority
        if self._metrics is not None:
            self._metrics.added()
            self._added_at.setdefault(key, time.monotonic())
        if key in self._processing:
            return
        self._enqueue(key, priority)

    def _enqueue(self, key: str, priority: int) -> None:
        keys = self._queue.get(priority)
        if keys is None:
            keys = self._queue[priority] = OrderedDict()
        keys[key] = None
        self._notify()

    def _raise(self, key: str, priority: int) -> None:
        """A dirty key asked for again at a higher priority: it moves up (at the end of its new
        priority's keys), or is queued again at it after ``done``."""
        queued = self._queue.get(self._priority[key])
        self._priority[key] = priority
        if queued is not None and queued.pop(key, 0) is None:
            self._enqueue(key, priority)

    def add_after(self, key: str, delay: float, priority: int = NORMAL_PRIORITY) -> None:
        """Add ``key`` at ``priority`` after ``delay`` seconds; an earlier pending add-after wins
        (at the higher of the two priorities)."""
        if self._shutting_down:
            return
        if self._metrics is not None:
            self._metrics.retried()
        if delay <= 0:
            self.add(key, priority)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        if key in self._waiting:
            self._waiting_priority[key] = max(priority, self._waiting_priority[key])
            if self._waiting_due[key] <= due:
                return
            self._waiting.pop(key).cancel()
        else:
            self._waiting_priority[key] = priority
        self._waiting_due[key] = due
        self._waiting[key] = loop.call_at(due, self._fire, key)

    def _fire(self, key: str) -> None:
        self._waiting.pop(key, None)
        self._waiting_due.pop(key, None)
        self.add(key, self._waiting_priority.pop(key, NORMAL_PRIORITY))

    def add_rate_limited(self, key: str, priority: int = NORMAL_PRIORITY) -> float:
        """Add ``key`` at ``priority`` after the rate limiter's delay; return that delay."""
        delay = self.rate_limiter.when(key)
        self.add_after(key, delay, priority)
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
        while not len(self) or self._shutting_down:
            if self._shutting_down:
                return None
            self._has_items.clear()
            await self._has_items.wait()
        priority = max(p for p, keys in self._queue.items() if keys)
        key, _ = self._queue[priority].popitem(last=False)
        self._processing.add(key)
        self._dirty.discard(key)
        self._priority.pop(key, None)
        self._handed[key] = priority
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
        self._handed.pop(key, None)
        started = self._started_at.pop(key, None)
        if started is not None and self._metrics is not None:
            self._metrics.worked(time.monotonic() - started)
        if key in self._dirty and not self._shutting_down:
            self._enqueue(key, self._priority.get(key, NORMAL_PRIORITY))

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
        self._waiting_priority.clear()
        self._has_items.set()
