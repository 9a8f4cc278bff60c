"""The provider sync of one side (the employer, or its employees): expected against current,
the diff, then create, update and delete through the adapter (docs/concepts.md, "One reconcile",
steps 4 and 5). It returns what the provider did; what that means for the pods is the guard's
(resourceconsist/reconcile/guard.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from resourceconsist.adapter import CUDResults, Employee, Employer, ReconcileContext
from resourceconsist.budget import Priority, spending_for
from resourceconsist.cancellation import call_adapter
from resourceconsist.diff import Diff, diff
from resourceconsist.errors import ResourceConsistError
from resourceconsist.kube import KubeObject
from resourceconsist.wire import EventReason

#: The package's logger (``resourceconsist.reconcile``), shared by its modules.
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


class SyncError(ResourceConsistError):
    """create/update/delete raised; the message is the Go frame's ``syncX failed, err: ...``."""


ItemT = TypeVar("ItemT", Employer, Employee)


#: Runs between the diff and the calls: guards pods, returns the ids of creates/updates to hold back.
BeforeCalls = Callable[[Diff[Any], Sequence[Any]], Awaitable[set[str]]]


async def sync(
    ctx: ReconcileContext,
    employer: KubeObject,
    expected: Sequence[ItemT],
    current: Sequence[ItemT],
    create: Callable[..., Any],
    update: Callable[..., Any],
    delete: Callable[..., Any],
    what: str,
    before_calls: BeforeCalls | None = None,
) -> CUDResults[ItemT]:
    """Diff, then create, update, delete; an error aborts, failed items do not.

    Items ``before_calls`` holds back count as failed (so the employer is looked at again)."""
    try:
        planned = diff(expected, current)
    except Exception as err:
        raise SyncError(f"diff {what} failed, err: {err}") from err
    held_back: set[str] = await before_calls(planned, current) if before_calls is not None else set()
    results: CUDResults[ItemT] = CUDResults(unchanged=list(planned.unchanged))
    results.fail_created = [i for i in planned.to_create if i.id in held_back]
    results.fail_updated = [i for i in planned.to_update if i.id in held_back]
    planned.to_create = [i for i in planned.to_create if i.id not in held_back]
    planned.to_update = [i for i in planned.to_update if i.id not in held_back]
    for label, fn, items in (
        ("syncCreate", create, planned.to_create),
        ("syncUpdate", update, planned.to_update),
        ("syncDelete", delete, planned.to_delete),
    ):
        try:
            with spending_for(_priority(label, what, items)):
                succeeded, failed = await call_adapter(fn, ctx, employer, list(items)) if items else ([], [])
        except Exception as err:
            raise SyncError(f"{label} failed, err: {err}") from err
        if label == "syncCreate":
            results.succ_created = list(succeeded)
            results.fail_created += list(failed)
        elif label == "syncUpdate":
            results.succ_updated = list(succeeded)
            results.fail_updated += list(failed)
        else:
            results.succ_deleted, results.fail_deleted = list(succeeded), list(failed)
    return results


def _priority(label: str, what: str, items: Sequence[Any]) -> Priority:
    """The provider budget's priority of one create, update or delete call (docs/concepts.md,
    "The provider budget"): deleting employees removes traffic, deleting an employer is a
    delete, an update that leaves an employee not serving removes traffic (a call mixing it
    with registrations counts as removing: the promise first), the rest registers."""
    if label == "syncDelete":
        return Priority.REMOVE_TRAFFIC if what == EMPLOYEES.what else Priority.DELETE
    if label == "syncUpdate" and any(isinstance(i, Employee) and not i.serves() for i in items):
        return Priority.REMOVE_TRAFFIC
    return Priority.REGISTER


def is_clean(results: CUDResults[Any]) -> bool:
    """Nothing expected remains on the provider and no delete failed (Go's ``isClean``)."""
    return not (
        results.unchanged
        or results.succ_created
        or results.fail_created
        or results.succ_updated
        or results.fail_updated
        or results.fail_deleted
    )


def log_changes(controller: str, key: str, what: str, results: CUDResults[Any]) -> None:
    counts = {
        "created": len(results.succ_created),
        "updated": len(results.succ_updated),
        "deleted": len(results.succ_deleted),
        "failed": len(results.fail_created) + len(results.fail_updated) + len(results.fail_deleted),
    }
    if any(counts.values()):
        log.info("%s %s: %s %s", controller, key, what, " ".join(f"{k}={v}" for k, v in counts.items() if v))
