"""The provider sync of one side (``sync_employer``, ``sync_employees``): expected against
current, the diff, then create, update and delete through the adapter, one table of the three
calls (``failures.CALLS``; docs/concepts.md, "One reconcile", steps 4 and 5). It returns what
the provider did; what that means for the pods is the guard's (resourceconsist/reconcile/guard.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from resourceconsist.adapter import CUDResults, Employee, Employer, ReconcileAdapter, ReconcileContext
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.errors import ResourceConsistError
from resourceconsist.flow.budget import Priority, spending_for
from resourceconsist.flow.cancellation import call_adapter, call_adapter_pair
from resourceconsist.reconcile.failures import CALLS, EMPLOYEES, EMPLOYER, PassFailures, Side
from resourceconsist.rules.diff import Diff, diff

#: The package's logger (``resourceconsist.reconcile``), shared by its modules.
log = logging.getLogger(__package__)


class SyncError(ResourceConsistError):
    """create/update/delete raised; the message is the Go frame's ``syncX failed, err: ...``."""


ItemT = TypeVar("ItemT", Employer, Employee)


#: Runs between the diff and the calls: guards pods, returns the ids of creates/updates to hold back.
BeforeCalls = Callable[[Diff[Any], Sequence[Any]], Awaitable[set[str]]]
#: Runs, without waiting, after each create, update or delete call that answered: the results so
#: far and the items of the calls still to come (the guard writes what the answers so far settle).
AfterCall = Callable[[CUDResults[Any], Sequence[Any]], None]


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
    after_call: AfterCall | None = None,
) -> CUDResults[ItemT]:
    """Diff, then create, update, delete; an error aborts, failed items do not.

    Items ``before_calls`` holds back count as failed (so the employer is looked at again);
    ``after_call`` hears of each call's answer as it comes."""
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
    batches = (planned.to_create, planned.to_update, planned.to_delete)
    for i, (call, fn, items) in enumerate(zip(CALLS, (create, update, delete), batches, strict=True)):
        try:
            with spending_for(_priority(call.label, what, items)):
                succeeded, failed = await call_adapter(fn, ctx, employer, list(items)) if items else ([], [])
        except Exception as err:
            raise SyncError(f"{call.label} failed, err: {err}") from err
        call.succeeded(results).extend(succeeded)
        call.failed(results).extend(failed)
        if after_call is not None and items:
            after_call(results, [item for later in batches[i + 1 :] for item in later])
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


async def sync_side(
    ctx: ReconcileContext,
    employer: KubeObject,
    side: Side,
    get_expected: Callable[..., Any],
    get_current: Callable[..., Any],
    cud: tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]],
    failures: PassFailures,
    before_calls: BeforeCalls | None = None,
    after_call: AfterCall | None = None,
) -> tuple[CUDResults[Any], dict[str, Any], dict[str, str]]:
    """Expected, current, diff and create/update/delete for one side, with the Go events;
    what the provider did, its current items by id, and the provider's reason for each pod
    whose item it refused (for the readiness gates)."""
    # Both reads in one hand-off for a plain adapter (``call_adapter_pair``), in this order.
    got_expected, got_current = await call_adapter_pair(get_expected, get_current, ctx, employer)
    try:
        if got_expected.error is not None:
            raise got_expected.error
        expected = list(got_expected.value)
    except Exception as err:
        raise await failures.fail(side.expected_reason, f"get expect {side.what} failed: {err}") from err
    try:
        assert got_current is not None  # the expected items were read
        if got_current.error is not None:
            raise got_current.error
        current = list(got_current.value)
    except Exception as err:
        raise await failures.fail(side.current_reason, f"get current {side.what} failed: {err}") from err
    try:
        results = await sync(ctx, employer, expected, current, *cud, side.what, before_calls, after_call)
    except SyncError as err:
        raise await failures.fail(side.sync_reason, f"sync {side.what} failed: {err}") from err
    log_changes(failures.controller, failures.key, side.what, results)
    refused = await failures.report_refused(side, results, ctx.failures) if results.any_failed else {}
    return results, {item.id: item for item in current}, refused


async def sync_employer(
    adapter: ReconcileAdapter, ctx: ReconcileContext, employer: KubeObject, failures: PassFailures
) -> tuple[CUDResults[Employer], dict[str, str]]:
    """Step 4: the employer's items; what the provider did, and the reasons it refused."""
    a = adapter
    cud = (a.create_employer, a.update_employer, a.delete_employer)
    results, _, refused = await sync_side(
        ctx, employer, EMPLOYER, a.get_expected_employer, a.get_current_employer, cud, failures
    )
    return results, refused


async def sync_employees(
    adapter: ReconcileAdapter,
    ctx: ReconcileContext,
    employer: KubeObject,
    failures: PassFailures,
    before_calls: BeforeCalls | None,
    after_call: AfterCall | None = None,
) -> tuple[CUDResults[Employee], dict[str, Any], dict[str, str]]:
    """Step 5: the employees' items, ``before_calls`` (the guard) between the diff and the calls,
    ``after_call`` after each call; what the provider did, its current items by id, and the
    reasons it refused, by pod."""
    a = adapter
    cud = (a.create_employees, a.update_employees, a.delete_employees)
    return await sync_side(
        ctx,
        employer,
        EMPLOYEES,
        a.get_expected_employee,
        a.get_current_employee,
        cud,
        failures,
        before_calls,
        after_call,
    )
