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
from resourceconsist.flow.cancellation import Outcome, call_adapter, call_adapter_in_turn
from resourceconsist.reconcile.failures import CALLS, EMPLOYEES, EMPLOYER, PassFailures, Side
from resourceconsist.rules.diff import Diff, by_id, diff
from resourceconsist.wire import EventReason

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
#: Runs after ``before_calls``: None to call the plan as it is; or which items of a plan made
#: again from the cache now may be called (their pod carries the guard): the guard's writes took
#: long enough for the pods to have moved under them (docs/concepts.md, "The guard").
Replan = Callable[[], Callable[[Any], bool] | None]
#: Makes the plan again after ``before_calls`` (``replanned``), or answers None: call it as it is.
Refresh = Callable[[Diff[Any], set[str]], Awaitable[Diff[Any] | None]]


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
    refresh: Refresh | None = None,
) -> CUDResults[ItemT]:
    """Diff, then create, update, delete; an error aborts, failed items do not.

    Items ``before_calls`` holds back count as failed (so the employer is looked at again);
    ``refresh`` may then make the plan again from what the cache holds now; ``after_call``
    hears of each call's answer as it comes."""
    try:
        planned = diff(expected, current)
    except Exception as err:
        raise SyncError(f"diff {what} failed, err: {err}") from err
    held_back: set[str] = await before_calls(planned, current) if before_calls is not None else set()
    results: CUDResults[ItemT] = CUDResults()
    results.fail_created = [i for i in planned.to_create if i.id in held_back]
    results.fail_updated = [i for i in planned.to_update if i.id in held_back]
    planned.to_create = [i for i in planned.to_create if i.id not in held_back]
    planned.to_update = [i for i in planned.to_update if i.id not in held_back]
    if refresh is not None:
        planned = await refresh(planned, held_back) or planned
    results.unchanged = list(planned.unchanged)
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


def replanned(
    planned: Diff[ItemT], fresh: Diff[ItemT], held_back: set[str], may_call: Callable[[ItemT], bool]
) -> Diff[ItemT]:
    """The plan a pass calls after looking again once the guard's writes are in: ``planned``
    (the first plan, less what the guard held back) and ``fresh`` (expected from the cache now,
    against the same current items). A pass that wrote 1000 guards for seconds would otherwise
    register pods as not ready that turned Ready meanwhile, and leave their update to the next
    pass (docs/concepts.md, "The guard"; docs/benchmarks.md, "The tail").

    Item by item, ``fresh`` wins where it only brings the plan up to date: an item now unchanged,
    or a create or update ``may_call`` allows (its pod carries the guard). Otherwise the first
    plan stands: a delete found only now waits for the next pass, and so does a create or update
    whose pod lacks the guard (a pod that came while the guard wrote: the next pass guards it
    first). A create whose pod is no longer expected is dropped (the provider holds nothing of
    it). Every item the provider holds stays in the plan in one of its lists, so the guard
    judges each of their pods after the calls (guard.after_calls)."""
    now: dict[str, tuple[list[ItemT], ItemT]] = {}
    out: Diff[ItemT] = Diff()
    kinds = [(fresh.to_create, out.to_create), (fresh.to_update, out.to_update)]
    kinds += [(fresh.to_delete, out.to_delete), (fresh.unchanged, out.unchanged)]
    for fresh_items, into in kinds:
        for item in fresh_items:
            now[item.id] = (into, item)
    first = [(planned.to_create, out.to_create), (planned.to_update, out.to_update)]
    first += [(planned.to_delete, out.to_delete), (planned.unchanged, out.unchanged)]
    # Ids the first plan had, and those the guard held back: not created from ``fresh`` below.
    seen: set[str] = set(held_back)
    for items, into in first:
        for item in items:
            seen.add(item.id)
            found = now.get(item.id)
            if found is None:
                continue  # a create whose pod is gone from the expected items
            fresh_into, fresh_item = found
            brings_up_to_date = fresh_into is out.unchanged or (
                fresh_into is not out.to_delete and may_call(fresh_item)
            )
            if brings_up_to_date:
                fresh_into.append(fresh_item)
            else:
                into.append(item)
    out.to_create += [i for i in fresh.to_create if i.id not in seen and may_call(i)]
    return out


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
        "failed": len(results.failed),
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
    replan: Replan | None = None,
    reads: Sequence[Outcome] | None = None,
) -> tuple[CUDResults[Any], dict[str, Any], dict[str, str]]:
    """Expected, current, diff and create/update/delete for one side, with the Go events;
    what the provider did, its current items by id, and the provider's reason for each pod
    whose item it refused (for the readiness gates). ``replan`` may have the plan made again
    after ``before_calls`` (``replanned``). ``reads``: the side's two reads made already
    (``read_sides``); else both are made here, in one hand-off for a plain adapter."""
    if reads is None:
        reads = await call_adapter_in_turn((get_expected, get_current), ctx, employer)
    # A read's error is the cause of the pass's, not raised again here: raised, it would take this
    # frame, which holds it, into its traceback (a cycle; flow/cancellation.py's Outcome).
    got_expected, got_current = reads[0], reads[1] if len(reads) > 1 else None
    expected = await _items(got_expected, failures, side.expected_reason, f"get expect {side.what} failed")
    assert got_current is not None  # the expected items were read
    current = await _items(got_current, failures, side.current_reason, f"get current {side.what} failed")

    async def refresh(planned: Diff[Any], held_back: set[str]) -> Diff[Any] | None:
        assert replan is not None  # passed to sync only with one
        may_call = replan()
        if may_call is None:
            return None
        try:
            fresh = diff(list(await call_adapter(get_expected, ctx, employer)), current)
        except Exception as err:  # the first plan stands; the next pass reads again
            log.info(
                "%s %s: %s planned as first read: reading again failed: %s",
                failures.controller,
                failures.key,
                side.what,
                err,
            )
            return None
        return replanned(planned, fresh, held_back, may_call)

    try:
        results = await sync(
            ctx,
            employer,
            expected,
            current,
            *cud,
            side.what,
            before_calls,
            after_call,
            refresh if replan is not None else None,
        )
    except SyncError as err:
        raise await failures.fail(side.sync_reason, f"sync {side.what} failed: {err}") from err
    log_changes(failures.controller, failures.key, side.what, results)
    refused = await failures.report_refused(side, results, ctx.failures) if results.any_failed else {}
    return results, by_id(current, "current"), refused


async def _items(read: Outcome, failures: PassFailures, reason: EventReason, failed: str) -> list[Any]:
    """The items a read answered, as a list; or the pass's error, recorded, when it raised (or
    answered something that is not a list of items)."""
    if read.error is not None:
        raise await failures.fail(reason, f"{failed}: {read.error}") from read.error
    try:
        return list(read.value)
    except Exception as err:
        raise await failures.fail(reason, f"{failed}: {err}") from err


async def read_sides(
    adapter: ReconcileAdapter, ctx: ReconcileContext, employer: KubeObject
) -> tuple[list[Outcome], list[Outcome]]:
    """Steps 4 and 5's reads in one hand-off for a plain adapter, in the order of the steps
    (expected, then current; the employer's, then the employees'), stopping at the first that
    raises: the employer's two outcomes, and the employees' (none when an employer read raised).
    The employees' stand only while the employer's sync calls nothing (``sync_employer`` says
    whether it called): a create, update or delete of the employer may change what its
    employees' reads answer, so after one they are made again (docs/concepts.md, "One
    reconcile")."""
    a = adapter
    reads = (a.get_expected_employer, a.get_current_employer, a.get_expected_employee, a.get_current_employee)
    outcomes = await call_adapter_in_turn(reads, ctx, employer)
    return outcomes[:2], outcomes[2:]


async def sync_employer(
    adapter: ReconcileAdapter,
    ctx: ReconcileContext,
    employer: KubeObject,
    failures: PassFailures,
    reads: Sequence[Outcome] | None = None,
) -> tuple[CUDResults[Employer], dict[str, str], bool]:
    """Step 4: the employer's items; what the provider did, the reasons it refused, and whether
    it made any create, update or delete call (told by the calls themselves, not by what the
    adapter reported of their items)."""
    a = adapter
    cud = (a.create_employer, a.update_employer, a.delete_employer)
    called: list[bool] = []
    results, _, refused = await sync_side(
        ctx,
        employer,
        EMPLOYER,
        a.get_expected_employer,
        a.get_current_employer,
        cud,
        failures,
        after_call=lambda *_: called.append(True),
        reads=reads,
    )
    return results, refused, bool(called)


async def sync_employees(
    adapter: ReconcileAdapter,
    ctx: ReconcileContext,
    employer: KubeObject,
    failures: PassFailures,
    before_calls: BeforeCalls | None,
    after_call: AfterCall | None = None,
    replan: Replan | None = None,
    reads: Sequence[Outcome] | None = None,
) -> tuple[CUDResults[Employee], dict[str, Any], dict[str, str]]:
    """Step 5: the employees' items, ``before_calls`` (the guard) between the diff and the calls,
    ``replan`` after it, ``after_call`` after each call; what the provider did, its current
    items by id, and the reasons it refused, by pod. ``reads``: as ``sync_side``'s."""
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
        replan,
        reads,
    )
