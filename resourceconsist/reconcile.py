"""One reconcile of one employer, in the order of docs/concepts.md ("One reconcile").

Each step is one method of ``Reconciler``:

1. ``reconcile``            read the employer from the cache; gone: done.
2. ``_ensure_clean_finalizer``  add the clean finalizer (dropping the old per-name one) and stop.
3. ``_plan_expected_finalizers`` plan this employer's entry in each selected pod's
   ``available-conditions`` (removal when deleting; record mode tracks who got it).
4. ``_sync_employer``        diff expected vs current employer items; create, update, delete.
5. ``_sync_employees``       the same for employees, then plan lifecycle finalizers.
   ``_write``                 write each planned pod once, then the employer's record annotations.
6. ``_release_clean_finalizer`` deleting and clean: drop the clean finalizer.
7. statuses after success, error conditions after failure (in ``reconcile``).
8. failed items without an error: requeue after the adapter's interval, or a rate-limited retry.

Event reasons and messages are the Go frame's, so dashboards and alerts carry over.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from resourceconsist import kube, lifecycle, wire
from resourceconsist.adapter import (
    CUDResults,
    Employee,
    Employer,
    EmployerRequeueOptions,
    ExpectedFinalizerRecordOptions,
    MultiClusterOptions,
    PodEmployeeStatuses,
    ReconcileAdapter,
    ReconcileContext,
    ReconcileLifecycleOptions,
    ReconcileRequeueOptions,
    StatusRecordOptions,
)
from resourceconsist.cache import CacheReader
from resourceconsist.diff import diff
from resourceconsist.events import EventRecorder
from resourceconsist.kube import ApiError, KubeClient, KubeObject, Resource
from resourceconsist.podwriter import PodLocation, PodWriter
from resourceconsist.wire import EventReason

log = logging.getLogger(__name__)
T = TypeVar("T")


async def call_adapter(fn: Callable[..., Any], *args: Any) -> Any:
    """Await a coroutine method on the loop; run a plain one in a worker thread, never on the loop."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        return await result
    return result


@dataclass
class Result:
    """What the controller does next with the key: nothing, or add it again after a delay."""

    requeue_after: float | None = None


class ReconcileError(Exception):
    """A failed reconcile, already reported as an Event; the controller retries with backoff."""

    def __init__(self, reason: EventReason | None, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class SyncFailedExist(Exception):
    """Some create/update/delete failed without an error and no requeue interval is set."""

    def __init__(self) -> None:
        super().__init__("employer or employees synced failed exist")


@dataclass
class _Pass:
    """State of one reconcile pass."""

    employer: KubeObject
    ctx: ReconcileContext
    writer: PodWriter
    key: str
    deleting: bool
    follows_lifecycle: bool
    expected_key: str = ""
    lifecycle_finalizer: str = ""
    selected: list[str] | None = None
    expected_clean: bool = True
    expected_added_record: list[str] | None = None
    expected_adds: set[str] = field(default_factory=set)
    expected_removes: set[str] = field(default_factory=set)
    lifecycle_adds: list[str] = field(default_factory=list)
    lifecycle_record: bool = False
    employer_results: CUDResults[Employer] = field(default_factory=CUDResults)
    employee_results: CUDResults[Employee] = field(default_factory=CUDResults)


def _record_list(obj: KubeObject, annotation: str) -> list[str]:
    value = (obj.get("metadata", {}).get("annotations") or {}).get(annotation, "")
    return [name for name in value.split(",") if name]


class Reconciler:
    """Runs the reconcile steps of one adapter against one (main) cluster."""

    def __init__(
        self,
        adapter: ReconcileAdapter,
        client: KubeClient,
        reader: CacheReader,
        recorder: EventRecorder,
        employer_resource: Resource,
        employee_resource: Resource,
        clusters: dict[str, tuple[KubeClient, CacheReader]] | None = None,
    ) -> None:
        self.adapter = adapter
        self.client = client
        self.reader = reader
        self.recorder = recorder
        self.employer_resource = employer_resource
        self.employee_resource = employee_resource
        self.clusters = clusters if clusters is not None else {}
        self.name = adapter.get_controller_name()

    # -- capabilities and their defaults ------------------------------------------------------------

    @property
    def employees_are_pods(self) -> bool:
        return self.employee_resource == kube.POD

    def _follows_lifecycle(self) -> bool:
        if not self.employees_are_pods:
            return False
        if isinstance(self.adapter, ReconcileLifecycleOptions):
            return self.adapter.follow_pod_ops_lifecycle()
        return True

    def _records_lifecycle_finalizers(self) -> bool:
        return isinstance(self.adapter, ReconcileLifecycleOptions) and (
            self.adapter.need_record_lifecycle_finalizer_condition()
        )

    def _records_expected_finalizers(self) -> bool:
        return isinstance(self.adapter, ExpectedFinalizerRecordOptions) and (
            self.adapter.need_record_expected_finalizer_condition()
        )

    async def _selected_names(self, p: _Pass) -> list[str]:
        if p.selected is None:
            if isinstance(self.adapter, ReconcileLifecycleOptions):
                p.selected = list(
                    await call_adapter(self.adapter.get_selected_employee_names, p.ctx, p.employer)
                )
            elif self.employer_resource == kube.SERVICE:
                pods = self.reader.pods_selected_by(p.employer)
                p.selected = [pod["metadata"]["name"] for pod in pods]
            else:
                p.selected = []
        return p.selected

    def _locate(self, employee_name: str) -> PodLocation:
        """Where a pod employee lives: ``pod#cluster`` in a member cluster, else the main one."""
        if isinstance(self.adapter, MultiClusterOptions) and not self.adapter.employee_fed():
            pod, sep, cluster = employee_name.rpartition(wire.MULTI_CLUSTER_SEPARATOR)
            if not sep or not pod:
                raise ValueError(f"employee name {employee_name!r} is not <pod>#<cluster>")
            if cluster not in self.clusters:
                raise LookupError(f"employee {employee_name!r}: cluster {cluster!r} is not registered")
            client, reader = self.clusters[cluster]
            return PodLocation(client, reader, pod)
        return PodLocation(self.client, self.reader, employee_name)

    def context(self, key: str) -> ReconcileContext:
        return ReconcileContext(
            reader=self.reader,
            controller=self.name,
            employer_key=key,
            clusters={name: reader for name, (_, reader) in self.clusters.items()},
        )

    # -- events ---------------------------------------------------------------------------------

    async def _fail(self, p: _Pass, reason: EventReason, message: str) -> ReconcileError:
        log.warning("%s %s: %s", self.name, p.key, message)
        await self.recorder.event(p.employer, "Warning", reason, message)
        return ReconcileError(reason, message)

    # -- 1. the whole pass ----------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        namespace, _, name = key.rpartition("/")
        employer = self.reader.get(self.employer_resource, namespace or None, name)
        if employer is None:
            return Result()
        p = _Pass(
            employer=employer,
            ctx=self.context(key),
            writer=PodWriter(namespace, self._locate),
            key=key,
            deleting=lifecycle.is_deleting(employer),
            follows_lifecycle=self._follows_lifecycle(),
        )
        try:
            if await self._ensure_clean_finalizer(p):
                return Result()
            result = await self._steps(p)
        except BaseException as err:
            if isinstance(self.adapter, StatusRecordOptions) and not isinstance(err, asyncio.CancelledError):
                try:
                    await call_adapter(self.adapter.record_error_conditions, p.ctx, p.employer, err)
                except Exception as record_err:
                    await self._fail(
                        p,
                        EventReason.RECORD_ERROR_CONDITIONS_FAILED,
                        f"record error conditions failed: {record_err}",
                    )
            raise
        return result

    async def _steps(self, p: _Pass) -> Result:
        try:
            await self._plan_expected_finalizers(p)
            await self._sync_employer(p)
            await self._sync_employees(p)
        finally:
            # Pod entries planned before a failed step still land: a pod must list the
            # finalizers it needs even while the provider is failing.
            await self._write(p)
        await self._release_clean_finalizer(p)
        if isinstance(self.adapter, StatusRecordOptions):
            try:
                await call_adapter(
                    self.adapter.record_statuses, p.ctx, p.employer, p.employer_results, p.employee_results
                )
            except Exception as err:
                raise await self._fail(
                    p, EventReason.RECORD_STATUSES_FAILED, f"record status failed: {err}"
                ) from err
        if p.employer_results.any_failed or p.employee_results.any_failed:
            if isinstance(self.adapter, EmployerRequeueOptions):
                return Result(requeue_after=self.adapter.employer_requeue_interval(p.ctx, p.employer))
            if isinstance(self.adapter, ReconcileRequeueOptions):
                return Result(requeue_after=self.adapter.employee_sync_requeue_interval())
            raise SyncFailedExist()
        return Result()

    # -- 2. clean finalizer ------------------------------------------------------------------------------

    def _old_clean_finalizer(self, employer: KubeObject) -> str:
        return wire.OLD_CLEAN_FINALIZER_PREFIX + str(employer["metadata"]["name"])

    async def _ensure_clean_finalizer(self, p: _Pass) -> bool:
        """Add the clean finalizer to a live employer that lacks it; True when it wrote."""
        if p.deleting:
            return False
        current = lifecycle.get_finalizers(p.employer)
        if wire.CLEAN_FINALIZER in current:
            return False
        old = self._old_clean_finalizer(p.employer)
        try:
            wrote = await self._patch_employer_finalizers(
                p.employer, add=[wire.CLEAN_FINALIZER], remove=[old]
            )
        except Exception as err:
            raise await self._fail(
                p,
                EventReason.ENSURE_EMPLOYER_CLEAN_FINALIZER_FAILED,
                f"add employer clean finalizer failed: {err}",
            ) from err
        if not wrote:
            # Gone, deleting or already guarded on a fresher copy: its watch event brings the next pass.
            return True
        log.info("%s %s: added clean finalizer", self.name, p.key)
        await self.recorder.event(
            p.employer,
            "Normal",
            EventReason.ENSURE_EMPLOYER_CLEAN_FINALIZER_SUCCEED,
            "add employer clean finalizer succeed",
        )
        return True

    async def _patch_employer_finalizers(
        self, employer: KubeObject, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> bool:
        """Add/remove employer finalizers under optimistic concurrency; True when written."""

        def change(fresh: KubeObject) -> dict[str, Any] | None:
            if add and lifecycle.is_deleting(fresh):
                return None  # the API server forbids new finalizers on a deleting object
            wanted = lifecycle.updated_finalizers(fresh, add=add, remove=remove)
            return None if wanted is None else {"metadata": {"finalizers": wanted}}

        meta = employer["metadata"]
        _, wrote = await self.client.apatch_optimistic(
            self.employer_resource, meta.get("namespace"), meta["name"], change, current=employer
        )
        return wrote

    # -- 3. expected-finalizer entries ------------------------------------------------------------------

    async def _plan_expected_finalizers(self, p: _Pass) -> None:
        if not p.follows_lifecycle:
            return
        meta = p.employer["metadata"]
        p.expected_key = lifecycle.expected_finalizer_key(
            p.employer.get("kind", ""), meta.get("namespace", ""), meta["name"]
        )
        p.lifecycle_finalizer = lifecycle.lifecycle_finalizer(meta["name"])
        try:
            selected = await self._selected_names(p)
        except Exception as err:
            raise await self._fail(
                p,
                EventReason.ENSURE_EXPECTED_FINALIZER_FAILED,
                "ensure employees expected finalizer failed: "
                f"get selected employees' names failed, err: {err}",
            ) from err
        if self._records_expected_finalizers():
            recorded = _record_list(p.employer, wire.EXPECTED_FINALIZER_ADDED_ANNOTATION)
            p.expected_added_record = recorded
            if p.deleting:
                p.expected_removes = set(recorded) | set(selected)
            else:
                p.expected_removes = set(recorded) - set(selected)
                p.expected_adds = set(selected) - set(recorded)
        elif p.deleting:
            p.expected_removes = set(selected)
        else:
            p.expected_adds = set(selected)
        for name in sorted(p.expected_adds):
            p.writer.add_entry(name, p.expected_key, p.lifecycle_finalizer)
        for name in sorted(p.expected_removes):
            p.writer.remove_entry(name, p.expected_key)

    # -- 4. employer -------------------------------------------------------------------------------------

    async def _sync_employer(self, p: _Pass) -> None:
        a = self.adapter
        p.employer_results = await self._sync_side(
            p,
            _EMPLOYER,
            a.get_expected_employer,
            a.get_current_employer,
            (a.create_employer, a.update_employer, a.delete_employer),
        )

    async def _sync_side(
        self,
        p: _Pass,
        side: _Side,
        get_expected: Callable[..., Any],
        get_current: Callable[..., Any],
        cud: tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]],
    ) -> CUDResults[Any]:
        """Expected, current, diff and create/update/delete for one side, with the Go events."""
        try:
            expected = list(await call_adapter(get_expected, p.ctx, p.employer))
        except Exception as err:
            raise await self._fail(p, side.expected_reason, f"get expect {side.what} failed: {err}") from err
        try:
            current = list(await call_adapter(get_current, p.ctx, p.employer))
        except Exception as err:
            raise await self._fail(p, side.current_reason, f"get current {side.what} failed: {err}") from err
        try:
            results = await _sync(p, expected, current, *cud, side.what)
        except _SyncError as err:
            raise await self._fail(p, side.sync_reason, f"sync {side.what} failed: {err}") from err
        _log_changes(self.name, p.key, side.what, results)
        return results

    # -- 5. employees and lifecycle finalizers ------------------------------------------------------------

    async def _sync_employees(self, p: _Pass) -> None:
        a = self.adapter
        results: CUDResults[Employee] = await self._sync_side(
            p,
            _EMPLOYEES,
            a.get_expected_employee,
            a.get_current_employee,
            (a.create_employees, a.update_employees, a.delete_employees),
        )
        p.employee_results = results
        if not p.follows_lifecycle:
            return
        adds: list[str] = [e.name for e in results.succ_created]
        removes: set[str] = {e.name for e in results.succ_deleted}
        for employee in [*results.succ_updated, *results.unchanged]:
            if not isinstance(employee.statuses, PodEmployeeStatuses):
                continue
            if employee.statuses.lifecycle_ready:
                adds.append(employee.name)
            else:
                removes.add(employee.name)
        if self._records_lifecycle_finalizers():
            p.lifecycle_record = True
            recorded = _record_list(p.employer, wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION)
            if recorded:
                selected = set(await self._selected_names(p))
                removes |= {name for name in recorded if name not in selected}
        p.lifecycle_adds = [name for name in dict.fromkeys(adds) if name not in removes]
        for name in p.lifecycle_adds:
            p.writer.add_finalizer(name, p.lifecycle_finalizer)
        for name in sorted(removes):
            p.writer.remove_finalizer(name, p.lifecycle_finalizer)

    # -- pod writes and the employer's record annotations ---------------------------------------------------

    async def _write(self, p: _Pass) -> None:
        if not p.writer.pending and p.expected_added_record is None and not p.lifecycle_record:
            return
        written = await p.writer.flush()
        annotations: dict[str, str] = {}
        if p.expected_added_record is not None:
            kept = [n for n in p.expected_added_record if not (n in p.expected_removes and n in written.done)]
            added = sorted(set(kept) | {n for n in p.expected_adds if n in written.done})
            value = ",".join(added)
            if value != ",".join(p.expected_added_record):
                annotations[wire.EXPECTED_FINALIZER_ADDED_ANNOTATION] = value
        if p.deleting:
            p.expected_clean = all(n in written.done for n in p.expected_removes)
        if p.lifecycle_record:
            recorded = _record_list(p.employer, wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION)
            having = sorted(n for n in p.lifecycle_adds if n in written.done)
            if set(having) != set(recorded):
                annotations[wire.LIFECYCLE_FINALIZER_RECORDED_ANNOTATION] = ",".join(having)
        if annotations:
            await self._patch_employer_annotations(p, annotations)
        entry_failures = {
            n: e for n, e in written.failed.items() if n in p.expected_adds | p.expected_removes
        }
        if entry_failures:
            name, err = sorted(entry_failures.items())[0]
            raise await self._fail(
                p,
                EventReason.ENSURE_EXPECTED_FINALIZER_FAILED,
                f"ensure employees expected finalizer failed: pod {name}: {err}"
                + (f" (and {len(entry_failures) - 1} more pods)" if len(entry_failures) > 1 else ""),
            )
        if written.failed:
            name, err = sorted(written.failed.items())[0]
            raise await self._fail(
                p,
                EventReason.SYNC_EMPLOYEES_FAILED,
                f"sync employees failed: ensureLifecycleFinalizer failed, err: pod {name}: {err}",
            )

    async def _patch_employer_annotations(self, p: _Pass, annotations: dict[str, str]) -> None:
        meta = p.employer["metadata"]
        try:
            patched, _ = await self.client.apatch_optimistic(
                self.employer_resource,
                meta.get("namespace"),
                meta["name"],
                lambda fresh: {"metadata": {"annotations": annotations}},
                current=p.employer,
            )
        except ApiError as err:
            raise await self._fail(
                p,
                EventReason.SYNC_EMPLOYEES_FAILED,
                f"sync employees failed: patch record annotations failed, err: {err}",
            ) from err
        if patched is not None:
            p.employer = patched

    # -- 6. release the clean finalizer ---------------------------------------------------------------

    async def _release_clean_finalizer(self, p: _Pass) -> None:
        if not p.deleting:
            return
        employer_clean = _is_clean(p.employer_results)
        employee_clean = _is_clean(p.employee_results)
        if not (employer_clean and employee_clean and p.expected_clean):
            return
        obsolete = [wire.CLEAN_FINALIZER, self._old_clean_finalizer(p.employer)]
        try:
            if not await self._patch_employer_finalizers(p.employer, remove=obsolete):
                return
        except Exception as err:
            raise await self._fail(
                p,
                EventReason.CLEAN_EMPLOYER_CLEAN_FINALIZER_FAILED,
                f"clean employer clean-finalizer failed: {err}",
            ) from err
        log.info("%s %s: provider side clean, released clean finalizer", self.name, p.key)
        await self.recorder.event(
            p.employer,
            "Normal",
            EventReason.CLEAN_EMPLOYER_CLEAN_FINALIZER_SUCCEED,
            "clean employer clean finalizer succeed",
        )


@dataclass(frozen=True)
class _Side:
    """One side of the sync: its name in messages and its Event reasons."""

    what: str
    expected_reason: EventReason
    current_reason: EventReason
    sync_reason: EventReason


_EMPLOYER = _Side(
    "employer",
    EventReason.GET_EXPECTED_EMPLOYER_FAILED,
    EventReason.GET_CURRENT_EMPLOYER_FAILED,
    EventReason.SYNC_EMPLOYER_FAILED,
)
_EMPLOYEES = _Side(
    "employees",
    EventReason.GET_EXPECTED_EMPLOYEES_FAILED,
    EventReason.GET_CURRENT_EMPLOYEES_FAILED,
    EventReason.SYNC_EMPLOYEES_FAILED,
)


class _SyncError(Exception):
    """create/update/delete raised; the message is the Go frame's ``syncX failed, err: ...``."""


ItemT = TypeVar("ItemT", Employer, Employee)


async def _sync(
    p: _Pass,
    expected: Sequence[ItemT],
    current: Sequence[ItemT],
    create: Callable[..., Any],
    update: Callable[..., Any],
    delete: Callable[..., Any],
    what: str,
) -> CUDResults[ItemT]:
    """Diff, then create, update, delete; an error aborts, failed items do not."""
    try:
        planned = diff(expected, current)
    except Exception as err:
        raise _SyncError(f"diff {what} failed, err: {err}") from err
    results: CUDResults[ItemT] = CUDResults(unchanged=list(planned.unchanged))
    for label, fn, items in (
        ("syncCreate", create, planned.to_create),
        ("syncUpdate", update, planned.to_update),
        ("syncDelete", delete, planned.to_delete),
    ):
        try:
            succeeded, failed = await call_adapter(fn, p.ctx, p.employer, list(items)) if items else ([], [])
        except Exception as err:
            raise _SyncError(f"{label} failed, err: {err}") from err
        if label == "syncCreate":
            results.succ_created, results.fail_created = list(succeeded), list(failed)
        elif label == "syncUpdate":
            results.succ_updated, results.fail_updated = list(succeeded), list(failed)
        else:
            results.succ_deleted, results.fail_deleted = list(succeeded), list(failed)
    return results


def _is_clean(results: CUDResults[Any]) -> bool:
    """Nothing expected remains on the provider and no delete failed (Go's ``isClean``)."""
    return not (
        results.unchanged
        or results.succ_created
        or results.fail_created
        or results.succ_updated
        or results.fail_updated
        or results.fail_deleted
    )


def _log_changes(controller: str, key: str, what: str, results: CUDResults[Any]) -> None:
    counts = {
        "created": len(results.succ_created),
        "updated": len(results.succ_updated),
        "deleted": len(results.succ_deleted),
        "failed": len(results.fail_created) + len(results.fail_updated) + len(results.fail_deleted),
    }
    if any(counts.values()):
        log.info("%s %s: %s %s", controller, key, what, " ".join(f"{k}={v}" for k, v in counts.items() if v))
