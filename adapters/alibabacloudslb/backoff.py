"""Per-employer requeue backoff for items that are "not done yet" (not failed with an error).

In observe mode the adapter waits for Alibaba's cloud controller manager (CCM) to catch up; in
manage mode a leaving backend waits for its drain. The frame asks ``employer_requeue_interval``
when to look again. The Go adapter answers 100 ms forever, which polls SLB ten times a second per
Service for as long as CCM lags (minutes, when CCM itself is throttled). Here the interval grows
with how long the *same* set of items has been waiting: it starts at ``base`` and is, from then
on, the time already waited (so it doubles from one requeue to the next), capped at ``cap``. A
different set (progress, or new work) starts over at ``base``; a pass with nothing waiting
forgets the employer. Because the interval depends on elapsed time rather than on a count of
passes, extra passes triggered by watch events do not inflate it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

DEFAULT_BASE_SECONDS: Final = 0.1
DEFAULT_CAP_SECONDS: Final = 30.0


@dataclass
class _Waiting:
    fingerprint: frozenset[str]
    since: float
    interval: float


class RequeueBackoff:
    """Requeue intervals keyed by employer (``namespace/name``); thread-safe."""

    def __init__(
        self,
        base: float = DEFAULT_BASE_SECONDS,
        cap: float = DEFAULT_CAP_SECONDS,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < base <= cap:
            raise ValueError("requeue backoff needs 0 < base <= cap")
        self.base = base
        self.cap = cap
        self._clock = clock
        self._lock = threading.Lock()
        self._waiting: dict[str, _Waiting] = {}

    def observe(self, key: str, waiting: Iterable[str], *, due_in: float | None = None) -> float | None:
        """Record what ``key`` is waiting for after a pass; return the interval to requeue after.

        ``waiting`` identifies the items not done (id plus wanted state); empty means in sync and
        forgets the key (``None`` returned). ``due_in`` is a known deadline (a drain ending), which
        caps the interval so the pass after it is not late.
        """
        fingerprint = frozenset(waiting)
        with self._lock:
            if not fingerprint:
                self._waiting.pop(key, None)
                return None
            now = self._clock()
            state = self._waiting.get(key)
            if state is None or state.fingerprint != fingerprint:
                state = _Waiting(fingerprint, now, self.base)
                self._waiting[key] = state
            else:
                state.interval = min(self.cap, max(self.base, now - state.since))
            if due_in is not None:
                state.interval = min(state.interval, max(due_in, self.base))
            return state.interval

    def interval(self, key: str | None) -> float:
        """The interval last computed for ``key``; for an unknown key the longest one in use
        (never spin), or ``base`` when nothing waits."""
        with self._lock:
            state = self._waiting.get(key) if key is not None else None
            if state is not None:
                return state.interval
            return max((s.interval for s in self._waiting.values()), default=self.base)

    def forget(self, key: str) -> None:
        with self._lock:
            self._waiting.pop(key, None)

    def waiting(self) -> dict[str, float]:
        """Keys still waiting and their current intervals (for tests and metrics)."""
        with self._lock:
            return {key: state.interval for key, state in self._waiting.items()}
