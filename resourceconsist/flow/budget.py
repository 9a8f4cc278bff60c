"""One API budget per provider account, shared by every controller and worker of a process:
a token bucket whose waiters are served by priority (docs/concepts.md, "The provider budget").

A provider's quota is spent by whoever asks first unless something orders the asks. Under a
throttle the calls that keep the promise — taking traffic off a leaving pod — must not queue
behind registrations and reads. ``ProviderBudget`` hands out one token per provider request:

- ``Priority`` orders the waiters: traffic removals (drains, deregistrations) first, then
  deletes, then registrations and creates, reads last; among equals, first come first served.
  A read takes the priority of the pass it serves (``spending_for``, a context variable the
  frame sets around the provider calls of a pass that removes traffic; worker threads see it,
  since ``call_adapter`` copies the caller's context).
- ``rate`` tokens a second refill the bucket, up to ``burst``; ``None``: no client-side limit,
  every ask is granted at once (the default).
- ``throttled(retry_after=...)`` is the provider's "slow down": the whole account pauses for
  ``Retry-After`` when the provider gave one, else for a backoff that doubles with each throttle
  in a row (``succeeded()`` ends the streak), and the bucket empties so the pause is not
  followed by a burst. The rate is halved too (down to a sixteenth of the configured one), and
  each success gives back a sixteenth of it: a rate set above what the account really allows
  (its quota is shared with other clients of the account, Alibaba's CCM among them) settles
  just under it instead of failing every other request. With no rate set, throttles are only
  counted: each caller's own retry backs off.
- Waiting is cancellable: ``spend`` wakes on the pass's ``current_cancellation()`` and raises
  ``PassCancelled``, so a stop is never held up by a queue (docs/concepts.md, "Stopping within
  the shutdown timeout"). It blocks its thread: call it from a provider call's thread (an
  ``ADAPTER_THREADS`` worker, through ``call_adapter``), never on the event loop.

``budget_for(account)`` is the process's budget of an account (made on first use);
``configure(ProviderBudgetOptions(...))`` sets the rate and burst of all of them (the manager does,
from ``ManagerOptions.provider_budget``). ``ProviderBudgetOptions.share`` is the fraction of the
configured rate this process takes: 1 while a single leader does all the work; a sharded manager
divides it by the ring's ready shards (docs/scaling.md, "The provider budget across shards").
What the budgets did is read by ``resourceconsist.runtime.metrics`` at scrape time (``BudgetStats``;
docs/observability.md).
"""

from __future__ import annotations

import contextvars
import enum
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Final

from resourceconsist.flow.cancellation import Cancellation, current_cancellation
from resourceconsist.options import ProviderBudgetOptions

__all__ = [
    "BudgetStats",
    "Priority",
    "ProviderBudget",
    "budget_for",
    "budgets",
    "configure",
    "current_priority",
    "retry_after_seconds",
    "settings",
    "spending_for",
]


class Priority(enum.IntEnum):
    """Who is served first when the budget is short; lower first."""

    #: Taking traffic off a backend: a drain (weight 0) or a deregistration.
    REMOVE_TRAFFIC = 0
    #: Deleting what no longer routes (a VServer group, a target group).
    DELETE = 1
    #: Registering and creating: a rollout's new backends, their groups and tags.
    REGISTER = 2
    #: Reading, for a pass that removes nothing (and the garbage search).
    READ = 3

    @property
    def label(self) -> str:
        """The metrics label: ``remove_traffic``, ``delete``, ``register``, ``read``."""
        return self.name.lower()


#: The first pause after a throttle without ``Retry-After``, doubled per throttle in a row.
THROTTLE_BASE_SECONDS: Final = 0.5
#: The longest such pause.
THROTTLE_CAP_SECONDS: Final = 16.0
#: The lowest share of the configured rate throttles slow the budget down to, and what each
#: success gives back.
SLOWDOWN_STEP: Final = 1.0 / 16
#: How often a waiter looks at its cancellation (it cannot wait on two events at once); a
#: change of the queue wakes it sooner.
_POLL_SECONDS: Final = 0.2


@dataclass
class BudgetStats:
    """What one budget did, by priority (read by the metrics at scrape time)."""

    #: Requests granted.
    granted: dict[Priority, int] = field(default_factory=lambda: dict.fromkeys(Priority, 0))
    #: Requests that had to wait for a token (or a throttle's pause).
    waits: dict[Priority, int] = field(default_factory=lambda: dict.fromkeys(Priority, 0))
    #: Seconds spent waiting, summed.
    wait_seconds: dict[Priority, float] = field(default_factory=lambda: dict.fromkeys(Priority, 0.0))
    #: Throttling answers of the provider.
    throttles: dict[Priority, int] = field(default_factory=lambda: dict.fromkeys(Priority, 0))
    #: Requests waiting right now.
    queued: dict[Priority, int] = field(default_factory=lambda: dict.fromkeys(Priority, 0))
    #: Requests a second spent now (the configured rate, slowed by recent throttles); None: no limit.
    rate: float | None = None


_PRIORITY: contextvars.ContextVar[Priority | None] = contextvars.ContextVar(
    "resourceconsist_budget_priority", default=None
)


def current_priority(default: Priority = Priority.READ) -> Priority:
    """The priority set by the innermost ``spending_for`` around this code, else ``default``."""
    found = _PRIORITY.get()
    return default if found is None else found


@contextmanager
def spending_for(priority: Priority) -> Iterator[Priority]:
    """Requests made inside (and in the threads started inside) spend at ``priority``: the frame
    sets the priority of a pass and of each create, update and delete call; a provider client
    sets the one of each write it makes, so the reads a write makes (a re-read before a retry)
    spend at the write's."""
    token = _PRIORITY.set(Priority(priority))
    try:
        yield Priority(priority)
    finally:
        _PRIORITY.reset(token)


def retry_after_seconds(value: str | None, *, now: Callable[[], float] = time.time) -> float | None:
    """Seconds an HTTP ``Retry-After`` value asks to wait (a number of seconds or an HTTP date);
    None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now())


class ProviderBudget:
    """A token bucket whose waiters are served by ``Priority``; thread-safe."""

    def __init__(
        self,
        account: str,
        settings: ProviderBudgetOptions | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.account = account
        self._clock = clock
        self._cond = threading.Condition()
        self._settings = settings or ProviderBudgetOptions()
        self._tokens = float(self._settings.burst)
        self._refilled = clock()
        self._paused_until = 0.0
        self._streak = 0
        # The share of the configured rate spent now: halved by a throttle, regained by successes.
        self._pace = 1.0
        self._tickets = itertools.count()
        # Waiters, most urgent first: (priority, arrival).
        self._waiting: list[tuple[Priority, int]] = []
        self.stats = BudgetStats()

    def __repr__(self) -> str:
        rate, burst = self._settings.effective_rate, self._settings.burst
        return f"ProviderBudget({self.account!r}, rate={rate}, burst={burst})"

    @property
    def settings(self) -> ProviderBudgetOptions:
        return self._settings

    def configure(self, settings: ProviderBudgetOptions) -> None:
        """Take a new rate and burst; tokens above the new burst are dropped."""
        with self._cond:
            self._refill(self._clock())
            self._settings = settings
            self._tokens = min(self._tokens, float(settings.burst))
            self._cond.notify_all()

    def spend(
        self,
        priority: Priority | None = None,
        *,
        cancellation: Cancellation | None = None,
        timeout: float | None = None,
    ) -> float:
        """Take one token for one provider request, waiting behind more urgent and earlier asks;
        the seconds waited. ``priority`` None: the current one (``current_priority()``).

        Raises ``PassCancelled`` when ``cancellation`` (default: the pass's) is cancelled, and
        ``TimeoutError`` after ``timeout`` seconds, while waiting; nothing is spent then.
        """
        priority = current_priority() if priority is None else Priority(priority)
        cancellation = cancellation or current_cancellation()
        started = self._clock()
        give_up = None if timeout is None else started + timeout
        with self._cond:
            if self._rate() is None:
                self.stats.granted[priority] += 1
                return 0.0
            ticket = (priority, next(self._tickets))
            heapq.heappush(self._waiting, ticket)
            self.stats.queued[priority] += 1
            if self._waiting[0] == ticket and len(self._waiting) > 1:
                self._cond.notify_all()  # a new head: the one it displaced stops timing its token
            try:
                while True:
                    now = self._clock()
                    self._refill(now)
                    rate = self._rate()
                    if rate is None or (
                        self._waiting[0] == ticket and now >= self._paused_until and self._tokens >= 1.0
                    ):
                        if rate is not None:
                            self._tokens -= 1.0
                        waited = now - started
                        self.stats.granted[priority] += 1
                        if waited > 0:
                            self.stats.waits[priority] += 1
                            self.stats.wait_seconds[priority] += waited
                        return waited
                    if cancellation.cancelled:
                        cancellation.check()
                    if give_up is not None and now >= give_up:
                        raise TimeoutError(
                            f"no {priority.label} request to {self.account} allowed within {timeout:g}s "
                            f"(rate {rate:g}/s): more urgent requests or a throttle hold the budget"
                        )
                    pause = _POLL_SECONDS
                    if self._waiting[0] == ticket:
                        pause = max(self._paused_until - now, (1.0 - self._tokens) / rate, 0.0)
                        pause = min(max(pause, 0.001), _POLL_SECONDS)
                    self._cond.wait(pause)
            finally:
                self.stats.queued[priority] -= 1
                if ticket in self._waiting:
                    self._waiting.remove(ticket)
                    heapq.heapify(self._waiting)
                self._cond.notify_all()

    def throttled(self, priority: Priority | None = None, *, retry_after: float | None = None) -> float:
        """The provider answered "throttled": pause the account for ``retry_after`` seconds, else
        for a backoff doubling with each throttle in a row; the pause (0 with no rate set)."""
        priority = current_priority() if priority is None else Priority(priority)
        with self._cond:
            self.stats.throttles[priority] += 1
            self._streak += 1
            if self._rate() is None:
                return 0.0
            if retry_after is not None:
                pause = max(0.0, retry_after)
            else:
                pause = min(THROTTLE_CAP_SECONDS, THROTTLE_BASE_SECONDS * 2.0 ** (self._streak - 1))
            now = self._clock()
            self._refill(now)
            self._pace = max(SLOWDOWN_STEP, self._pace / 2)
            self._paused_until = max(self._paused_until, now + pause)
            self._tokens = 0.0
            self._cond.notify_all()
            return pause

    def succeeded(self) -> None:
        """A request went through: a throttle after it starts the backoff over, and the budget
        regains a sixteenth of its configured rate."""
        with self._cond:
            self._streak = 0
            if self._pace < 1.0:
                self._refill(self._clock())
                self._pace = min(1.0, self._pace + SLOWDOWN_STEP)

    def queued(self) -> dict[Priority, int]:
        """Requests waiting now, by priority."""
        with self._cond:
            return dict(self.stats.queued)

    def snapshot(self) -> BudgetStats:
        """A copy of ``stats``, taken under the budget's lock."""
        with self._cond:
            stats = self.stats
            return BudgetStats(
                dict(stats.granted),
                dict(stats.waits),
                dict(stats.wait_seconds),
                dict(stats.throttles),
                dict(stats.queued),
                self._rate(),
            )

    def _rate(self) -> float | None:
        rate = self._settings.effective_rate
        return None if rate is None else rate * self._pace

    def _refill(self, now: float) -> None:
        rate = self._rate()
        if rate is not None and now > self._refilled:
            self._tokens = min(float(self._settings.burst), self._tokens + (now - self._refilled) * rate)
        self._refilled = max(self._refilled, now)


_LOCK: Final = threading.Lock()
_BUDGETS: dict[str, ProviderBudget] = {}
_SETTINGS: list[ProviderBudgetOptions] = [ProviderBudgetOptions()]


def budget_for(account: str) -> ProviderBudget:
    """The process's budget of a provider account (e.g. ``alibabacloudslb:cn-hangzhou``), made
    with the configured settings on first use."""
    if not account:
        raise ValueError("a provider budget needs an account name")
    with _LOCK:
        found = _BUDGETS.get(account)
        if found is None:
            found = _BUDGETS[account] = ProviderBudget(account, _SETTINGS[0])
        return found


def in_use() -> bool:
    """Whether the process has a budget at all: without one, no request waits and a priority
    orders nothing, so the frame need not work one out."""
    return bool(_BUDGETS)


def budgets() -> list[ProviderBudget]:
    """Every budget of the process, by account."""
    with _LOCK:
        return [_BUDGETS[name] for name in sorted(_BUDGETS)]


def configure(new: ProviderBudgetOptions) -> None:
    """Set the rate and burst of every budget of the process, present and future."""
    with _LOCK:
        _SETTINGS[0] = new
        present = list(_BUDGETS.values())
    for budget in present:
        budget.configure(new)


def settings() -> ProviderBudgetOptions:
    """The settings every budget of the process runs with."""
    with _LOCK:
        return _SETTINGS[0]
