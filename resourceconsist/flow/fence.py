"""The lease fence: what a process does for a Lease it does only while the Lease is surely its own
(docs/concepts.md, "Fencing"; docs/scaling.md, "A frozen replica").

A replica that leads (``--leader-elect``), holds a shard (``--sharding``) or runs the sharder acts
for a Lease. Another replica may take that Lease over once it has not been renewed for the lease
duration; a process stopped meanwhile (a GC pause, a throttled cgroup, SIGSTOP, a live-migrated VM)
is never told: it resumes with its old beliefs, and writes. So every write made for a Lease is
checked against a deadline on a clock that runs while the process is stopped, and refused once it
has passed:

- ``Fence.hold_until`` is set by the Lease's elector after each successful acquire or renew: the
  moment the request was *sent* plus the renew deadline (docs/concepts.md, "Leader election
  timings"), a point before any other replica can take the Lease over (it must see the Lease
  unrenewed for the whole lease duration, counted from a later moment).
- ``acting_for(fence)`` makes it the current fence of the code run inside it: the tasks it
  creates and the threads they hand work to (context variables follow both).
- ``check_fence()`` raises ``LeaseLost`` once the current fence's deadline has passed. The
  transports call it in the same synchronous step that hands a write to the socket (the
  Kubernetes client's, resourceconsist/cluster), and ``call_adapter`` and the provider clients
  before a provider call: no ``await`` and no thread hand-off lies between the check and the send.

``LeaseLost`` is a ``PassCancelled``: the pass that meets it is abandoned before its next write,
without a Warning (a lost Lease is not the employer's failure), and the elector steps down on its
own next attempt. The clock is CLOCK_BOOTTIME where the system has it (it also runs through a
suspend), else CLOCK_MONOTONIC; never wall time, which an operator or NTP may step.

What the fence cannot see, and why the guard holds anyway, is in docs/concepts.md, "Fencing".
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

from resourceconsist.errors import PassCancelled

_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def fence_clock() -> float:
    """Seconds on the fence's clock: one that keeps running while the process is stopped."""
    return time.clock_gettime(_CLOCK)


class LeaseLost(PassCancelled):
    """A write for a Lease this process no longer surely holds: it is not sent."""


class Fence:
    """Until when one Lease is surely held by this process (``fence_clock`` seconds); thread-safe
    in the only way it needs: a float is read and written whole."""

    def __init__(self, name: str) -> None:
        #: The Lease's ``namespace/name``, for messages.
        self.name = name
        self._until = -math.inf

    def hold_until(self, deadline: float) -> None:
        """The Lease is surely held until ``deadline`` (``fence_clock`` seconds)."""
        self._until = deadline

    def drop(self) -> None:
        """The Lease is not held (stepped down, released, lost)."""
        self._until = -math.inf

    def remaining(self) -> float:
        """Seconds left before the deadline (0 or less: writes are refused)."""
        return self._until - fence_clock()

    @property
    def held(self) -> bool:
        return fence_clock() < self._until

    def check(self) -> None:
        """Raise ``LeaseLost`` once the deadline has passed."""
        left = self._until - fence_clock()
        if left <= 0:
            late = "never held" if self._until == -math.inf else f"its deadline passed {-left:.3f}s ago"
            raise LeaseLost(
                f"not sent: the Lease {self.name} is not surely held by this process ({late}); "
                "another replica may hold it"
            )

    def __repr__(self) -> str:
        return f"Fence({self.name!r}, remaining={self.remaining():.3f})"


_CURRENT: contextvars.ContextVar[Fence | None] = contextvars.ContextVar("resourceconsist_fence", default=None)


def current_fence() -> Fence | None:
    """The fence of the code running now; None outside anything done for a Lease."""
    return _CURRENT.get()


def check_fence() -> None:
    """Raise ``LeaseLost`` when the code running now acts for a Lease no longer surely held."""
    fence = _CURRENT.get()
    if fence is not None:
        fence.check()


def fence_lost() -> bool:
    """The code running now acts for a Lease whose deadline has passed."""
    fence = _CURRENT.get()
    return fence is not None and not fence.held


@contextmanager
def acting_for(fence: Fence | None) -> Iterator[None]:
    """Make ``fence`` current for the code run inside (and the tasks and threads it starts);
    None: nothing is fenced (a process that holds no Lease)."""
    token = _CURRENT.set(fence)
    try:
        yield
    finally:
        _CURRENT.reset(token)
