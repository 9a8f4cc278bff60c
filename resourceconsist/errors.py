"""The error tree: every error resourceconsist raises derives from ``ResourceConsistError``.

Two of them are for adapters, to steer the frame from inside a method (controller-runtime's
``TerminalError``, kopf's ``PermanentError``/``TemporaryError``):

- ``PermanentError``: the pass cannot succeed by retrying (a malformed annotation, an
  unsupported setting). The frame records a Warning Event with the message and does not retry
  the employer until it changes (its next watch event brings it back).
- ``RetryAfter``: the pass should be tried again after ``seconds`` (a provider asked to be
  called later, a resource still being provisioned). The frame records a Warning Event and
  requeues the employer after that delay instead of its exponential backoff.

Anything else an adapter raises is retried with the controller's backoff, as in the Go frame.
Whatever error a pass ends with, the guard holds (docs/concepts.md, "The guard"): finalizers are
only released on what the provider confirmed.
"""

from __future__ import annotations


class ResourceConsistError(Exception):
    """The root of resourceconsist's errors."""


class PermanentError(ResourceConsistError):
    """Raised by an adapter: retrying will not help; wait for the employer to change."""


class RetryAfter(ResourceConsistError):
    """Raised by an adapter: try this employer again after ``seconds``."""

    def __init__(self, seconds: float, message: str = "") -> None:
        if seconds < 0:
            raise ValueError(f"RetryAfter needs seconds >= 0, got {seconds}")
        super().__init__(message or f"retry after {seconds:g}s")
        self.seconds = float(seconds)


def steering(err: BaseException | None) -> PermanentError | RetryAfter | None:
    """The adapter's ``PermanentError`` or ``RetryAfter`` behind ``err`` (its cause chain), if any."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, PermanentError | RetryAfter):
            return err
        seen.add(id(err))
        err = err.__cause__
    return None
