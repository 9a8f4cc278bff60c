"""The end of a pass (docs/concepts.md, "One reconcile", steps 7 and 8): the adapter records
the statuses after success, or error conditions after a failure (``StatusRecordOptions``); and
items failed without an error bring the employer back after the adapter's interval, or fail
the pass for a rate-limited retry (``SyncFailedExist``).
"""

from __future__ import annotations

from typing import Any

from resourceconsist.adapter import CUDResults, ReconcileContext
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.reconcile.failures import PassFailures
from resourceconsist.reconcile.outcome import Result, SyncFailedExist
from resourceconsist.reconcile.profile import AdapterProfile
from resourceconsist.wire import EventReason


async def record_statuses(
    profile: AdapterProfile,
    ctx: ReconcileContext,
    employer: KubeObject,
    results: tuple[CUDResults[Any], CUDResults[Any]],
    failures: PassFailures,
) -> None:
    """7. The adapter records what the employer and employee syncs did (``results``)."""
    record = profile.status_record
    if record is None:
        return
    try:
        await call_adapter(record.record_statuses, ctx, employer, *results)
    except Exception as err:
        raise await failures.fail(EventReason.RECORD_STATUSES_FAILED, f"record status failed: {err}") from err


async def record_error_conditions(
    profile: AdapterProfile,
    ctx: ReconcileContext,
    employer: KubeObject,
    error: BaseException,
    failures: PassFailures,
) -> None:
    """7. After a failed pass, the adapter records its error conditions; a failure to is a
    Warning, and the pass's own error stays the one it raises."""
    record = profile.status_record
    if record is None:
        return
    try:
        await call_adapter(record.record_error_conditions, ctx, employer, error)
    except Exception as record_err:
        await failures.fail(
            EventReason.RECORD_ERROR_CONDITIONS_FAILED,
            f"record error conditions failed: {record_err}",
        )


def requeue(profile: AdapterProfile, ctx: ReconcileContext, employer: KubeObject, any_failed: bool) -> Result:
    """8. Items failed without an error: look again after the adapter's interval
    (``AdapterProfile.requeue_interval``); without one, ``SyncFailedExist`` (a rate-limited retry)."""
    if not any_failed:
        return Result()
    if profile.requeue_interval is not None:
        return Result(requeue_after=profile.requeue_interval(ctx, employer))
    raise SyncFailedExist()
