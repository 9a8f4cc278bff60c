"""How one pass reports what failed (docs/concepts.md, "When a failure becomes a Warning"): a
Warning Event on the employer at once (``fail``), or, for a failure a retry may resolve (a 409
Conflict, an item the provider refused with a reason), an INFO line and a metric until the
same failure has outlasted its retries, then the Warning. Streaks of failures live in the
employer's memory (``memory.EmployerMemory.streaks``), so they span passes.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resourceconsist import wire
from resourceconsist.adapter import CUDResults, ItemFailure
from resourceconsist.cluster import kube
from resourceconsist.cluster.interfaces import EventSink
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.errors import RetryAfter
from resourceconsist.flow.cancellation import current_cancellation
from resourceconsist.reconcile.memory import Streak
from resourceconsist.reconcile.outcome import MAX_CONFLICT_RETRY_SECONDS, MAX_ITEM_WARNINGS, ReconcileError
from resourceconsist.wire import EventReason

log = logging.getLogger(__package__)


@dataclass(frozen=True)
class Side:
    """One side of the sync: its name in messages and its Event reasons."""

    what: str
    expected_reason: EventReason
    current_reason: EventReason
    sync_reason: EventReason


EMPLOYER = Side(
    "employer",
    EventReason.GET_EXPECTED_EMPLOYER_FAILED,
    EventReason.GET_CURRENT_EMPLOYER_FAILED,
    EventReason.SYNC_EMPLOYER_FAILED,
)
EMPLOYEES = Side(
    "employees",
    EventReason.GET_EXPECTED_EMPLOYEES_FAILED,
    EventReason.GET_CURRENT_EMPLOYEES_FAILED,
    EventReason.SYNC_EMPLOYEES_FAILED,
)


@dataclass(frozen=True)
class Call:
    """One of the sync's three provider calls: its name in the Go frame's messages and Events
    (``syncCreate`` ...), and where its items land in ``CUDResults``."""

    label: str
    succeeded: Callable[[CUDResults[Any]], list[Any]]
    failed: Callable[[CUDResults[Any]], list[Any]]


#: The sync's calls, in the order it makes them.
CREATE = Call("syncCreate", lambda r: r.succ_created, lambda r: r.fail_created)
UPDATE = Call("syncUpdate", lambda r: r.succ_updated, lambda r: r.fail_updated)
DELETE = Call("syncDelete", lambda r: r.succ_deleted, lambda r: r.fail_deleted)
CALLS = (CREATE, UPDATE, DELETE)


class PassFailures:
    """The failures of one pass of one employer, and how each is reported."""

    def __init__(
        self,
        *,
        controller: str,
        key: str,
        employer: Callable[[], KubeObject],
        recorder: EventSink,
        streaks: dict[tuple[str, ...], Streak],
        api_down: Callable[[], bool],
        report_retried: Callable[[str], None],
        warn_after_passes: int,
        warn_after_seconds: float,
    ) -> None:
        self.controller = controller
        self.key = key
        self._employer = employer
        self._recorder = recorder
        self._streaks = streaks
        self._api_down = api_down
        self._report_retried = report_retried
        self._warn_after_passes = warn_after_passes
        self._warn_after_seconds = warn_after_seconds
        #: The failures left to retries met in this pass.
        self.failing: set[tuple[str, ...]] = set()

    async def fail(
        self, reason: EventReason, message: str, annotations: Mapping[str, str] | None = None
    ) -> ReconcileError:
        """A Warning Event on the employer and a log line; the error the pass raises. A pass the
        controller's stop cancelled records none: what failed failed because it was told to
        stop, and a stop is not a failure (docs/concepts.md, "When a failure becomes a Warning";
        the next start runs the pass again)."""
        if current_cancellation().stopped:
            log.info("%s %s: pass stopped: %s", self.controller, self.key, message)
            return ReconcileError(reason, message)
        # While the API server is down the client has said so once; a line per failed pass
        # would repeat it (docs/concepts.md, "What an operator sees under faults").
        level = logging.DEBUG if self._api_down() else logging.WARNING
        log.log(level, "%s %s: %s", self.controller, self.key, message)
        await self._recorder.event(self._employer(), "Warning", reason, message, annotations)
        return ReconcileError(reason, message)

    def outlasted(self, failures: Sequence[tuple[str, ...]]) -> bool:
        """Count this pass for each failure; True when one of them has now been met on
        ``warn_after_passes`` consecutive passes over at least ``warn_after_seconds``."""
        now = time.monotonic()
        outlasted = False
        for failure in failures:
            streak = self._streaks.setdefault(failure, Streak(since=now))
            if failure not in self.failing:
                self.failing.add(failure)
                streak.passes += 1
            if streak.passes >= self._warn_after_passes and now - streak.since >= self._warn_after_seconds:
                outlasted = True
        return outlasted

    def end_streaks(self) -> None:
        """A failure this pass did not meet again was resolved: its streak ends."""
        for failure in [f for f in self._streaks if f not in self.failing]:
            del self._streaks[failure]

    async def fail_unless_retrying(
        self, reason: EventReason, message: str, failures: Sequence[tuple[str, ...]]
    ) -> ReconcileError:
        """A failure a retry may resolve (a 409 Conflict): an INFO line and a metric, until the
        same failure outlasts its retries; then the Warning Event of ``fail``. Its cause is the
        retry it asks for (``errors.steering`` reads the cause chain)."""
        if self.outlasted(failures):
            error = await self.fail(reason, message)
        else:
            self._report_retried(reason)
            # The controller logs the retry at INFO with this message: one line per pass.
            error = ReconcileError(reason, message)
        passes = max((self._streaks[f].passes for f in failures if f in self._streaks), default=1)
        delay = min(MAX_CONFLICT_RETRY_SECONDS, 0.1 * 2 ** (passes - 1)) * random.uniform(0.5, 1.0)
        error.__cause__ = RetryAfter(delay, message)
        return error

    async def pod_writes_failed(
        self, reason: EventReason, message: str, failed: Mapping[str, BaseException]
    ) -> ReconcileError:
        """Pod writes that failed: conflicts only (other writers of the same pods) are left to
        the retry until the same pod outlasts it; anything else is a Warning at once."""
        if all(isinstance(err, kube.Conflict) for err in failed.values()):
            return await self.fail_unless_retrying(
                reason, message, [("conflict", str(reason), name) for name in sorted(failed)]
            )
        return await self.fail(reason, message)

    async def report_refused(
        self, side: Side, results: CUDResults[Any], reasons: Mapping[str, ItemFailure]
    ) -> dict[str, str]:
        """Items the provider refused with a reason (``ReconcileContext.fail_item``, ``reasons``
        by item id); the employees' reasons by pod, for their readiness gates. Each failure is
        an INFO line and a metric until it outlasts its retries, then a Warning Event in the Go
        frame's words, annotated with the operation, item, code and message for
        ``resourceconsist explain``. Items failed without a reason are "not done yet" (a drain,
        a cloud controller catching up): never a Warning."""
        refused: list[tuple[str, Any, ItemFailure]] = []
        for call in CALLS:
            for item in call.failed(results):
                failure = reasons.get(item.id)
                if failure is not None:
                    refused.append((call.label, item, failure))
        by_pod: dict[str, str] = {}
        warnings: list[tuple[str, Any, ItemFailure]] = []
        for label, item, failure in refused:
            cause = f"{failure.code}: {failure.message}" if failure.code else failure.message
            if side is EMPLOYEES and item.name:
                by_pod[item.name] = cause
            # The same failure: the same call refused for the same item with the same code.
            if self.outlasted([(side.what, label, item.id, failure.code or failure.message)]):
                warnings.append((label, item, failure))
            else:
                self._report_retried(side.sync_reason)
        if len(warnings) < len(refused):
            label, item, failure = next(r for r in refused if r not in warnings)
            log.info(
                "%s %s: the provider refused %d %s items, retrying; first: %s %s: %s",
                self.controller,
                self.key,
                len(refused) - len(warnings),
                side.what,
                label,
                item.id,
                failure.message,
            )
        for label, item, failure in sorted(warnings, key=lambda w: (w[0], w[1].id))[:MAX_ITEM_WARNINGS]:
            cause = f"{failure.code}: {failure.message}" if failure.code else failure.message
            record = {
                "operation": label,
                "item": item.id,
                "name": getattr(item, "name", "") or "",
                "code": failure.code,
                "message": failure.message,
            }
            await self.fail(
                side.sync_reason,
                f"sync {side.what} failed: {label} failed, err: {item.id}: {cause}",
                {wire.PROVIDER_FAILURE_ANNOTATION: json.dumps(record, sort_keys=True)},
            )
        return by_pod
