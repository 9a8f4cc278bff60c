"""What a reconcile pass ends with: its ``Result``, its errors, and the numbers that rule retries."""

from __future__ import annotations

from dataclasses import dataclass

from resourceconsist.errors import ResourceConsistError
from resourceconsist.wire import EventReason

#: The defaults of ``Reconciler.warn_after_passes`` and ``warn_after_seconds``: a failure left to
#: retries (a 409 Conflict, an item the provider refused) becomes a Warning Event once the same
#: failure was met on this many consecutive passes of the employer, over at least this long
#: (docs/concepts.md, "When a failure becomes a Warning").
DEFAULT_WARN_AFTER_PASSES = 3
DEFAULT_WARN_AFTER_SECONDS = 20.0
#: At most this many item failures of one pass become Warning Events (the rest are counted).
MAX_ITEM_WARNINGS = 5
#: A pass that met only 409 Conflicts is tried again after 0.1 s, doubling with each consecutive
#: conflicting pass up to this many seconds (jittered), not after the controller's exponential
#: backoff: another writer is busy, not broken, and 1000 s would leave pods unguarded for long.
MAX_CONFLICT_RETRY_SECONDS = 5.0


@dataclass
class Result:
    """What the controller does next with the key: nothing, or add it again after a delay."""

    requeue_after: float | None = None
    #: A stand-in pass (``reconcile(key, stand_in=...)``): the provider holds nothing any more.
    collected: bool = False

    def sooner(self, *delays: float | None) -> None:
        """Bring the next pass forward to the earliest of ``delays`` (None: no ask)."""
        for delay in delays:
            if delay is not None and (self.requeue_after is None or delay < self.requeue_after):
                self.requeue_after = delay


class ReconcileError(ResourceConsistError):
    """A failed reconcile, already reported as an Event; the controller retries with backoff."""

    def __init__(self, reason: EventReason | None, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class SyncFailedExist(ResourceConsistError):
    """Some create/update/delete failed without an error and no requeue interval is set."""

    def __init__(self) -> None:
        super().__init__("employer or employees synced failed exist")
