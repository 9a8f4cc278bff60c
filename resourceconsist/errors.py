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

``InvalidOptions`` is what the options objects (``ManagerOptions``, ``LeaderElectionOptions``,
``GarbageOptions``, ``WebhookOptions``, ``BootstrapOptions``, ``ConnectionLimits``) raise when
built with a value they cannot work with; it names the fields at fault, so the command line can
name its flags (docs/reference/options.md).

``frames_dropped`` keeps an error for later without the frames its traceback holds (a note says
where it was raised instead).
"""

from __future__ import annotations

from typing import TypeVar

_E = TypeVar("_E", bound=BaseException)


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


class PassCancelled(ResourceConsistError):
    """The pass was cancelled (the controller is stopping), its deadline has passed, or the Lease
    it acts for is no longer surely held (``resourceconsist.flow.fence.LeaseLost``). Adapter code
    meeting it gives up: ``ctx.cancellation.check()`` raises it (resourceconsist.flow.cancellation)."""


#: Python's own runtime errors: what a Go program would meet as a panic (a nil dereference, an
#: index out of range, a failed type assertion), not a way an adapter reports a failure.
PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    TypeError,
    AttributeError,
    LookupError,
    NameError,
    ArithmeticError,
    AssertionError,
    RecursionError,
)


def programming_error(err: BaseException | None) -> BaseException | None:
    """The programming error behind ``err`` (its cause chain), if any: a bug, which the
    controller counts as controller-runtime counts a recovered panic (docs/observability.md)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, PROGRAMMING_ERRORS):
            return err
        seen.add(id(err))
        err = err.__cause__
    return None


class InvalidOptions(ResourceConsistError, ValueError):
    """An options object was given a value it cannot work with; ``fields`` names the fields at
    fault (e.g. ``("renew_deadline", "lease_duration")``)."""

    def __init__(self, message: str, *fields: str) -> None:
        super().__init__(message)
        self.fields = fields


def check_seconds(name: str, value: float | None, *, zero: bool = False) -> None:
    """``InvalidOptions`` unless the duration field ``name`` is above 0 seconds (with ``zero``, 0
    too); None (the field is off) passes."""
    if value is None or value > 0 or (zero and value == 0):
        return
    least = "0 or more" if zero else "more than 0"
    raise InvalidOptions(f"{name.replace('_', ' ')} must be {least} seconds (got {value:g})", name)


def check_count(name: str, value: int) -> None:
    """``InvalidOptions`` unless the count field ``name`` is at least 1."""
    if value < 1:
        raise InvalidOptions(f"{name.replace('_', ' ')} must be at least 1 (got {value})", name)


#: The first line of the note ``frames_dropped`` writes; a note of an earlier drop is replaced.
_DROPPED = "Traceback (most recent call last; its frames were not kept):"


def frames_dropped(err: _E) -> _E:
    """``err`` kept for later without its frames: the traceback of ``err`` and of each error it
    was raised from or while handling becomes a note (file, line and function of each frame, what
    a logged traceback shows) and is dropped.

    Why: a frame a traceback holds keeps its caller's frame, and that one its caller's, up to
    the pass; a pass that keeps an adapter's error (to raise it in its turn) in a frame the error
    reaches is a reference cycle, so the pass would wait for the garbage collector instead of
    going when it ends (docs/benchmarks.md, "Garbage a pass leaves")."""
    seen: set[int] = set()
    chain: list[BaseException | None] = [err]
    while chain:
        each = chain.pop()
        if each is None or id(each) in seen:
            continue
        seen.add(id(each))
        chain += (each.__cause__, each.__context__)
        tb = each.__traceback__
        if tb is None:
            continue
        lines = [_DROPPED]
        repeated = 0
        while tb is not None:
            code = tb.tb_frame.f_code
            line = f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}'
            tb = tb.tb_next
            if lines[-3:] == [line] * 3:  # a recursion: counted, as Python's own traceback does
                repeated += 1
                continue
            if repeated:
                lines.append(f"  [Previous line repeated {repeated} more times]")
                repeated = 0
            lines.append(line)
        if repeated:
            lines.append(f"  [Previous line repeated {repeated} more times]")
        notes = [n for n in getattr(each, "__notes__", ()) if not n.startswith(_DROPPED)]
        each.__notes__ = [*notes, "\n".join(lines)]
        each.__traceback__ = None
    return err
