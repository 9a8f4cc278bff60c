"""One reconcile of one employer: the orchestrator over the step modules, in the order of
docs/concepts.md ("One reconcile"):

1. ``reconcile``                   read the employer from the cache; gone: forget it, open its
   gates (``readiness.gone_employer_changes``), done.
2. ``_ensure_clean_finalizer``     add the clean finalizer (``finalizers``) and stop.
3. ``_plan_expected_finalizers``   plan this employer's entry in each selected pod
   (``finalizers.plan_entries``).
4. ``_sync_employer``              the provider sync of the employer (``sync``).
5. ``_sync_employees``             the same for the employees, guarded (``guard``): the guard
   goes on every pod the provider holds or is about to hold *before* the calls
   (``guard.plan_guard``); after them, each pod's verdict (``guard.judge``) plans its swaps and
   releases (``guard.plan_after_calls``).
   ``_write``                      write each planned pod once, then the employer's record
   annotations (``finalizers.record_annotations``).
   ``_update_gates``               this employer's readiness gates, from what the provider
   confirmed (``readiness.plan_gates``; docs/zero-downtime.md).
6. ``_release_clean_finalizer``    deleting and clean: drop the clean finalizer.
7. statuses after success, error conditions after failure (in ``reconcile``).
8. failed items without an error: requeue after the adapter's interval, or a rate-limited retry.

Each step module takes what it needs and returns what it decided; none imports this one. What
the reconciler keeps of an employer between passes is one record (``memory.EmployerMemory``).
Event reasons and messages are the Go frame's, so dashboards and alerts carry over. The guard
invariant these steps keep is written down in docs/concepts.md, "The guard".
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from resourceconsist import gates, kube, lifecycle, wire
from resourceconsist.adapter import (
    CUDResults,
    Employee,
    EmployerRequeueOptions,
    ExpectedFinalizerRecordOptions,
    MultiClusterOptions,
    ReconcileAdapter,
    ReconcileContext,
    ReconcileLifecycleOptions,
    ReconcileRequeueOptions,
    StatusRecordOptions,
)
from resourceconsist.budget import Priority, spending_for
from resourceconsist.cancellation import call_adapter, current_cancellation
from resourceconsist.diff import Diff
from resourceconsist.interfaces import EventSink, ObjectReader, ObjectWriter
from resourceconsist.kube import ApiError, KubeObject, Resource
from resourceconsist.options import DEFAULT_FULL_PASS_EVERY
from resourceconsist.podwriter import EmployerEntry, PodWriter, RecentWrites
from resourceconsist.reconcile import guard, readiness
from resourceconsist.reconcile.failures import PassFailures
from resourceconsist.reconcile.finalizers import (
    old_clean_finalizer,
    patch_employer_annotations,
    patch_employer_finalizers,
    plan_entries,
    record_annotations,
    record_list,
)
from resourceconsist.reconcile.guard import Verdict
from resourceconsist.reconcile.memory import Memories
from resourceconsist.reconcile.outcome import (
    DEFAULT_WARN_AFTER_PASSES,
    DEFAULT_WARN_AFTER_SECONDS,
    ReconcileError,
    Result,
    SyncFailedExist,
)
from resourceconsist.reconcile.pods import PodPlaces
from resourceconsist.reconcile.state import PassState
from resourceconsist.reconcile.sync import (
    EMPLOYEES,
    EMPLOYER,
    BeforeCalls,
    Side,
    SyncError,
    is_clean,
    log_changes,
    sync,
)
from resourceconsist.wire import EventReason

#: The package's logger (``resourceconsist.reconcile``), shared by its modules.
log = logging.getLogger(__package__)


class Reconciler:
    """Runs the reconcile steps of one adapter against one (main) cluster."""

    def __init__(
        self,
        adapter: ReconcileAdapter,
        client: ObjectWriter,
        reader: ObjectReader,
        recorder: EventSink,
        employer_resource: Resource,
        employee_resource: Resource,
        clusters: Mapping[str, tuple[ObjectWriter, ObjectReader]] | None = None,
        *,
        api_down: Callable[[], bool] = lambda: False,
        report_unguarded: Callable[[int], None] = lambda total: None,
        report_retried: Callable[[str], None] = lambda reason: None,
        notify: Callable[[str, str, str], None] = lambda what, key, pod: None,
        full_pass_every: float = DEFAULT_FULL_PASS_EVERY,
    ) -> None:
        """The hooks (the controller's): ``api_down`` says whether the main cluster's API server
        is known to be unreachable; ``report_unguarded`` gets the sum of ``unguarded`` whenever
        it may have changed, ``report_retried`` the Event reason of each failure left to a retry
        without a Warning (the metrics); ``notify`` gets (what happened, employer key, pod name
        or "") as a pass decides it, each once per change, and must not block
        (docs/lifecycle-hooks.md, "Subscribers")."""
        self.adapter = adapter
        self.client = client
        self.reader = reader
        self.recorder = recorder
        self.employer_resource = employer_resource
        self.employee_resource = employee_resource
        self.clusters = clusters if clusters is not None else {}
        self.name = adapter.get_controller_name()
        # A runtime-checkable protocol's isinstance walks its members: once here, not per pod.
        self._multi_cluster = isinstance(adapter, MultiClusterOptions)
        #: What the reconciler keeps of each employer between passes, by employer key.
        self._memory = Memories()
        #: Seconds after which an employer's next pass is a full one whatever changed
        #: (``ReconcileContext.changed`` None; docs/concepts.md, "Work proportional to change").
        self.full_pass_every = full_pass_every
        self.api_down = api_down
        self.report_unguarded = report_unguarded
        self.notify = notify
        #: Pods written by this reconciler that the cache may not show yet (podwriter.RecentWrites).
        self.recent = RecentWrites()
        #: Where the pod employees live, and their freshest copies.
        self.pods = PodPlaces(client, reader, self.clusters, self._in_members, self.recent)
        #: When a failure left to retries becomes a Warning Event: met on this many consecutive
        #: passes, over at least this many seconds (docs/concepts.md, "When a failure becomes a
        #: Warning"). An adapter error stays a Warning at once, as in the Go original.
        self.warn_after_passes: int = DEFAULT_WARN_AFTER_PASSES
        self.warn_after_seconds: float = DEFAULT_WARN_AFTER_SECONDS
        self.report_retried = report_retried

    # -- capabilities and their defaults ------------------------------------------------------------

    @property
    def employees_are_pods(self) -> bool:
        return self.employee_resource == kube.POD

    @property
    def follows_lifecycle(self) -> bool:
        """The employers' pods carry their marks: entries, guard and lifecycle finalizers."""
        return self._follows_lifecycle()

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

    async def _selected_names(self, p: PassState, *, fresh: bool = False) -> list[str]:
        """The employees the employer selects, read once per pass (``fresh``: read again, for
        decisions about pods that may have reached the cache since)."""
        if p.selected is None or fresh:
            if isinstance(self.adapter, ReconcileLifecycleOptions):
                selected = list(
                    await call_adapter(self.adapter.get_selected_employee_names, p.ctx, p.employer)
                )
            elif self.employer_resource == kube.SERVICE:
                selected = [pod["metadata"]["name"] for pod in self.reader.pods_selected_by(p.employer)]
            else:
                selected = []
            if p.selected is None:
                p.selected = selected
            return selected
        return p.selected

    def _in_members(self) -> bool:
        """Pod employees live in member clusters (named ``pod#cluster``)."""
        return self._multi_cluster and not cast(MultiClusterOptions, self.adapter).employee_fed()

    # -- what changed since an employer's last pass (docs/concepts.md, "Work proportional to change") --

    @property
    def unguarded(self) -> dict[str, int]:
        """Per employer key: registrations the provider held without their pod's guard, as the
        last pass found them (the invariant, live: it should read 0; docs/concepts.md)."""
        return self._memory.unguarded()

    def employee_changed(self, key: str, name: str) -> None:
        """An event of employee ``name`` (``pod`` or ``pod#cluster``) woke employer ``key``."""
        self._memory.employee_changed(key, name)

    def employer_changed(self, key: str) -> None:
        """The employer itself changed (or anything the frame cannot name): a full pass next."""
        self._memory.employer_changed(key)

    def _forget(self, key: str) -> None:
        """Drop what the frame keeps of an employer once it is gone or its leftovers were collected."""
        if self._memory.forget(key):
            self.report_unguarded(sum(self.unguarded.values()))

    def let_go(self, key: str) -> None:
        """The employer is another replica's now (docs/scaling.md): what this one kept of it goes,
        and so does its count in the unguarded gauge; the employer itself is not touched."""
        self._forget(key)

    def context(self, key: str) -> ReconcileContext:
        return ReconcileContext(
            reader=self.reader,
            controller=self.name,
            employer_key=key,
            clusters={name: reader for name, (_, reader) in self.clusters.items()},
            # Set by the controller for the pass it runs (a never-cancelled one outside a pass).
            cancellation=current_cancellation(),
            writer=self.client,
            recorder=self.recorder,
            # No employer (""), as the garbage pass's ``list_owned``: nothing to remember.
            memo=self._memory.of(key).memo if key else {},
        )

    # -- 1. the whole pass ----------------------------------------------------------------------------

    async def reconcile(self, key: str, *, stand_in: KubeObject | None = None) -> Result:
        """One pass; with ``stand_in`` (a deleting copy of a gone employer), a pass that removes
        what the provider still holds for it (docs/lifecycle-hooks.md, "Orphans")."""
        namespace, _, name = key.rpartition("/")
        employer = stand_in or self.reader.get(self.employer_resource, namespace or None, name)
        if employer is None:
            self._forget(key)
            if self.employees_are_pods:
                await self._release_gates_of_gone_employer(namespace, name)
            if "" in self._memory.told(key):
                self._tell(key, "", "employer_deleted")
            return Result()
        follows = self._follows_lifecycle()
        entry: EmployerEntry | None = None
        if follows:
            meta = employer["metadata"]
            entry = EmployerEntry(
                key=lifecycle.expected_finalizer_key(
                    employer.get("kind", ""), meta.get("namespace", ""), meta["name"]
                ),
                lifecycle_finalizer=lifecycle.lifecycle_finalizer(meta["name"]),
                guard_finalizer=lifecycle.guard_finalizer(meta["name"]),
            )
        p = PassState(
            employer=employer,
            ctx=self.context(key),
            writer=PodWriter(namespace, self.pods.locate, entry, self.recent),
            key=key,
            deleting=lifecycle.is_deleting(employer),
            follows_lifecycle=follows,
        )
        p.failures = PassFailures(
            controller=self.name,
            key=key,
            employer=lambda: p.employer,
            recorder=self.recorder,
            streaks=self._memory.of(key).streaks,
            api_down=self.api_down,
            report_retried=self.report_retried,
            warn_after_passes=self.warn_after_passes,
            warn_after_seconds=self.warn_after_seconds,
        )
        if entry is not None:
            p.expected_key = entry.key
            p.lifecycle_finalizer = entry.lifecycle_finalizer
            p.guard_finalizer = entry.guard_finalizer
        p.stand_in = stand_in is not None
        began = time.monotonic()
        if not p.stand_in:
            p.ctx.changed = self._memory.take_changes(key, self.full_pass_every)
        completed = False
        try:
            if await self._ensure_clean_finalizer(p):
                return Result()
            result = await self._steps(p)
            completed = not (p.employer_results.any_failed or p.employee_results.any_failed)
        except BaseException as err:
            if not isinstance(err, asyncio.CancelledError):
                self._tell(key, "", "employer_failing")
            if p.stand_in:
                raise
            if isinstance(self.adapter, StatusRecordOptions) and not isinstance(err, asyncio.CancelledError):
                try:
                    await call_adapter(self.adapter.record_error_conditions, p.ctx, p.employer, err)
                except Exception as record_err:
                    await p.failures.fail(
                        EventReason.RECORD_ERROR_CONDITIONS_FAILED,
                        f"record error conditions failed: {record_err}",
                    )
            raise
        finally:
            p.failures.end_streaks()
            if not p.stand_in:
                if not completed:
                    # Whatever the adapter kept from this pass may be wrong: rebuild it next time.
                    self.employer_changed(key)
                elif p.ctx.changed is None:
                    self._memory.of(key).full_pass_at = began
        result.collected = p.collected
        if p.collected:
            self._forget(key)
        if not p.deleting and result.requeue_after is None:
            self._tell(key, "", "employer_converged")
        return result

    def _tell(self, key: str, pod: str, what: str) -> None:
        """Notify subscribers of a change of state of an employer (pod "") or pod, once."""
        told = self._memory.of(key).told
        if told.get(pod) == what:
            return
        if what == "employer_deleted":
            self._memory.told_deleted(key)
        elif what == "pod_released":
            told.pop(pod, None)
        else:
            told[pod] = what
        try:
            self.notify(what, key, pod)
        except Exception:
            log.exception("%s %s: notifying subscribers of %s failed", self.name, key, what)

    def _announce(self, p: PassState) -> None:
        """Tell subscribers what this pass's confirmed verdicts made true, after the writes."""
        told = self._memory.told(p.key)
        finalizers_of = functools.partial(self._final_finalizers, p)
        for name, what in guard.announcements(p.verdicts, told, finalizers_of, p.entry):
            self._tell(p.key, name, what)

    async def _steps(self, p: PassState) -> Result:
        try:
            try:
                await self._plan_expected_finalizers(p)
                # The pass's reads spend the provider budget at the pass's priority
                # (docs/concepts.md, "The provider budget").
                with spending_for(Priority.REMOVE_TRAFFIC if self._removes_traffic(p) else Priority.READ):
                    await self._sync_employer(p)
                    await self._sync_employees(p)
            finally:
                # Pod entries planned before a failed step still land: a pod must list the
                # finalizers it needs even while the provider is failing.
                await self._write(p)
                self._announce(p)
        except Exception:
            # The fail-safe of the readiness gates exists for a failing provider: it still runs.
            await self._update_gates(p)
            raise
        await self._update_gates(p)
        if p.gate_failures:
            name, err = sorted(p.gate_failures.items())[0]
            raise await p.failures.fail(
                EventReason.UPDATE_READINESS_GATES_FAILED,
                f"update readiness gates failed: pod {name}: {err}"
                + (f" (and {len(p.gate_failures) - 1} more pods)" if len(p.gate_failures) > 1 else ""),
            )
        result = await self._finish(p)
        # The gates' fail-safe and the adapter's own ask (ReconcileContext.look_again_in) bring
        # the next pass forward; the earliest wins.
        for recheck in (p.gate_recheck, p.ctx.look_again):
            if recheck is not None and (result.requeue_after is None or recheck < result.requeue_after):
                result.requeue_after = recheck
        return result

    async def _finish(self, p: PassState) -> Result:
        await self._release_clean_finalizer(p)
        if isinstance(self.adapter, StatusRecordOptions) and not p.stand_in:
            try:
                await call_adapter(
                    self.adapter.record_statuses, p.ctx, p.employer, p.employer_results, p.employee_results
                )
            except Exception as err:
                raise await p.failures.fail(
                    EventReason.RECORD_STATUSES_FAILED, f"record status failed: {err}"
                ) from err
        if p.employer_results.any_failed or p.employee_results.any_failed:
            if isinstance(self.adapter, EmployerRequeueOptions):
                return Result(requeue_after=self.adapter.employer_requeue_interval(p.ctx, p.employer))
            if isinstance(self.adapter, ReconcileRequeueOptions):
                return Result(requeue_after=self.adapter.employee_sync_requeue_interval())
            raise SyncFailedExist()
        return Result()

    # -- 2. clean finalizer ------------------------------------------------------------------------------

    async def _ensure_clean_finalizer(self, p: PassState) -> bool:
        """Add the clean finalizer to a live employer that lacks it; True when it wrote."""
        if p.deleting:
            return False
        current = lifecycle.get_finalizers(p.employer)
        if wire.CLEAN_FINALIZER in current:
            return False
        old = old_clean_finalizer(p.employer)
        try:
            wrote = await patch_employer_finalizers(
                self.client, self.employer_resource, p.employer, add=[wire.CLEAN_FINALIZER], remove=[old]
            )
        except Exception as err:
            raise await p.failures.fail(
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

    # -- 3. expected-finalizer entries ------------------------------------------------------------------

    async def _plan_expected_finalizers(self, p: PassState) -> None:
        if not p.follows_lifecycle:
            return
        try:
            selected = await self._selected_names(p)
        except Exception as err:
            raise await p.failures.fail(
                EventReason.ENSURE_EXPECTED_FINALIZER_FAILED,
                "ensure employees expected finalizer failed: "
                f"get selected employees' names failed, err: {err}",
            ) from err
        if self._records_expected_finalizers():
            p.expected_added_record = record_list(p.employer, wire.EXPECTED_FINALIZER_ADDED_ANNOTATION)
        p.expected_adds, p.expected_removes = plan_entries(
            selected,
            deleting=p.deleting,
            recorded=p.expected_added_record,
            has_entry=lambda name: self._has_entry(p, name),
        )
        if p.stand_in and not self._in_members():
            # Nothing selects a gone employer's pods any more; its entries would stay on them
            # for ever (docs/lifecycle-hooks.md, "Orphans").
            p.expected_removes |= {
                str(pod["metadata"]["name"])
                for pod in self.reader.list(kube.POD, p.writer.namespace)
                if guard.holds_entry(pod, p.expected_key)
            }
        for name in sorted(p.expected_adds):
            p.writer.add_entry(name, p.expected_key, p.lifecycle_finalizer)
        for name in sorted(p.expected_removes):
            p.writer.remove_entry(name, p.expected_key)

    # -- 4. employer -------------------------------------------------------------------------------------

    async def _sync_employer(self, p: PassState) -> None:
        a = self.adapter
        p.employer_results, _ = await self._sync_side(
            p,
            EMPLOYER,
            a.get_expected_employer,
            a.get_current_employer,
            (a.create_employer, a.update_employer, a.delete_employer),
        )

    async def _sync_side(
        self,
        p: PassState,
        side: Side,
        get_expected: Callable[..., Any],
        get_current: Callable[..., Any],
        cud: tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]],
        before_calls: BeforeCalls | None = None,
    ) -> tuple[CUDResults[Any], dict[str, Any]]:
        """Expected, current, diff and create/update/delete for one side, with the Go events;
        what the provider did, and its current items by id."""
        try:
            expected = list(await call_adapter(get_expected, p.ctx, p.employer))
        except Exception as err:
            raise await p.failures.fail(
                side.expected_reason, f"get expect {side.what} failed: {err}"
            ) from err
        try:
            current = list(await call_adapter(get_current, p.ctx, p.employer))
        except Exception as err:
            raise await p.failures.fail(
                side.current_reason, f"get current {side.what} failed: {err}"
            ) from err
        try:
            results = await sync(p.ctx, p.employer, expected, current, *cud, side.what, before_calls)
        except SyncError as err:
            raise await p.failures.fail(side.sync_reason, f"sync {side.what} failed: {err}") from err
        log_changes(self.name, p.key, side.what, results)
        if results.any_failed:
            p.refused.update(await p.failures.report_refused(side, results, p.ctx.failures))
        return results, {item.id: item for item in current}

    # -- 5. employees and lifecycle finalizers ------------------------------------------------------------

    async def _sync_employees(self, p: PassState) -> None:
        a = self.adapter
        results: CUDResults[Employee]
        results, current_by_id = await self._sync_side(
            p,
            EMPLOYEES,
            a.get_expected_employee,
            a.get_current_employee,
            (a.create_employees, a.update_employees, a.delete_employees),
            functools.partial(self._guard_before_calls, p) if p.follows_lifecycle else None,
        )
        p.employee_results = results
        if not self.employees_are_pods:  # (following PodOpsLifecycle implies pod employees)
            return
        verdicts, serves = guard.judge(results, current_by_id)
        if p.follows_lifecycle:
            p.verdicts = guard.plan_after_calls(
                verdicts, p.carriers, p.entry, lambda name: self.pods.get(name, p.writer.namespace), p.writer
            )
            p.lifecycle_record = self._records_lifecycle_finalizers()
        p.serving = {n for n in serves if verdicts.get(n) is Verdict.SERVED}
        p.unknown = {n for n, v in verdicts.items() if v is Verdict.UNKNOWN}
        expected: list[list[Employee]] = [results.succ_created, results.fail_created]
        expected += [results.succ_updated, results.fail_updated, results.unchanged]
        p.employed = {i.name for items in expected for i in items if i.name}
        p.employees_synced = True

    def _removes_traffic(self, p: PassState) -> bool:
        """Whether this pass takes traffic off something, as the cache tells before any provider
        call: the employer is deleting (or gone), or a pod holding its guard or lifecycle
        finalizer is deleting, is no longer selected, or PodOpsLifecycle took it out of service."""
        if p.deleting or p.stand_in:
            return True
        if not p.follows_lifecycle:
            return False
        selected = set(p.selected or ())
        employer_namespace = str(p.employer["metadata"].get("namespace") or "")
        for name in self.pods.carrying(employer_namespace, (p.guard_finalizer, p.lifecycle_finalizer)):
            pod = self.pods.get(name, p.writer.namespace)
            if name not in selected or pod is None or lifecycle.is_deleting(pod):
                return True
            service_ready = lifecycle.pod_condition(pod, wire.SERVICE_READY_CONDITION)
            if service_ready is not None and service_ready.get("status") == "False":
                return True
        return False

    # -- the guard ----------------------------------------------------------------------------------------

    def _has_entry(self, p: PassState, name: str) -> bool:
        """The cached pod holds this employer's entry (a pod not cached yet counts as holding
        it: its watch event brings it to the next pass)."""
        pod = self.pods.get(name, p.writer.namespace)
        # A malformed annotation counts as lacking it; the write reports it.
        return pod is None or guard.holds_entry(pod, p.expected_key)

    async def _guard_before_calls(
        self, p: PassState, planned: Diff[Employee], current: Sequence[Employee]
    ) -> set[str]:
        """Guard every pod the provider holds, or is about to hold, a registration of, before any
        call; return the ids of creates/updates that must wait because their pod could not be
        guarded (gone, deleting, or the write failed).

        Entries planned in step 3 go out in the same write, so a new pod costs one write. A
        registration found without its guard (a crash between a call and its write) is guarded
        here, before anything else (docs/concepts.md, "The guard")."""
        namespace = p.writer.namespace
        employer_namespace = str(p.employer["metadata"].get("namespace") or "")
        p.carriers = self.pods.carrying(employer_namespace, (p.guard_finalizer, p.lifecycle_finalizer))
        held = {item.name for item in current if item.name and item.registered()}
        registering = {
            e.name: e.id for e in [*planned.to_create, *planned.to_update] if e.name and e.registered()
        }
        guarding, unguarded = guard.plan_guard(
            held, registering, lambda name: self.pods.get(name, namespace), p.entry, p.writer
        )
        memory = self._memory.of(p.key)
        if memory.unguarded != unguarded:
            memory.unguarded = unguarded
            self.report_unguarded(sum(self.unguarded.values()))
        # Additions go out now; removals wait for the calls (an entry stays while its
        # lifecycle finalizer does).
        adding = p.writer.adding()
        if adding:
            p.written.merge(await p.writer.flush(only=adding))
        p.carriers |= {n for n, f in p.written.finalizers.items() if guard.guarded(f, p.entry)}
        for name in sorted(guarding):
            if guard.guarded(p.written.finalizers.get(name, []), p.entry) and name not in self._memory.told(
                p.key
            ):
                self._tell(p.key, name, "pod_guarded")
        blocked = {
            item_id
            for name, item_id in registering.items()
            if name in p.written.failed or not self._still_carries(p, name)
        }
        if blocked:
            log.info(
                "%s %s: not registering %d employees whose pods could not be guarded yet",
                self.name,
                p.key,
                len(blocked),
            )
        return blocked

    # -- pod writes and the employer's record annotations ---------------------------------------------------

    async def _write(self, p: PassState) -> None:
        if p.writer.pending:
            p.written.merge(await p.writer.flush())
        written = p.written
        if (
            not written.done
            and not written.failed
            and p.expected_added_record is None
            and not p.lifecycle_record
        ):
            return
        if p.deleting:
            p.expected_clean = all(
                n in written.done and n not in written.deferred for n in p.expected_removes
            ) and not any(self._still_carries(p, n) for n in p.carriers)
        annotations = record_annotations(
            p.employer,
            written,
            expected_record=p.expected_added_record,
            adds=p.expected_adds,
            removes=p.expected_removes,
            lifecycle_record=p.lifecycle_record,
            carriers=p.carriers,
            carries_lifecycle=lambda name: p.lifecycle_finalizer in self._final_finalizers(p, name),
        )
        if annotations and not p.stand_in:
            await self._patch_employer_annotations(p, annotations)
        entry_failures = {
            n: e for n, e in written.failed.items() if n in p.expected_adds | p.expected_removes
        }
        if entry_failures:
            name, err = sorted(entry_failures.items())[0]
            raise await p.failures.pod_writes_failed(
                EventReason.ENSURE_EXPECTED_FINALIZER_FAILED,
                f"ensure employees expected finalizer failed: pod {name}: {err}"
                + (f" (and {len(entry_failures) - 1} more pods)" if len(entry_failures) > 1 else ""),
                entry_failures,
            )
        if written.failed:
            name, err = sorted(written.failed.items())[0]
            raise await p.failures.pod_writes_failed(
                EventReason.SYNC_EMPLOYEES_FAILED,
                f"sync employees failed: ensureLifecycleFinalizer failed, err: pod {name}: {err}",
                written.failed,
            )

    # -- readiness gates (docs/zero-downtime.md) ------------------------------------------------------------

    def _describe_employer(self, employer: KubeObject) -> str:
        kind = employer.get("kind") or self.employer_resource.kind
        return f"{kind} {kube.object_key(employer)}"

    async def _employed(self, p: PassState) -> set[str] | None:
        """The pods this employer employs: those the adapter expects to hold, and those it
        selects; None when the pass could not tell.

        The selection is read afresh, after the caller listed the gated pods: a pod created
        during the pass is in the cache by then, so it is never taken for one the employer
        stopped selecting (which would open its gate before the provider serves it)."""
        if not p.employees_synced:
            return None
        try:
            selected = await self._selected_names(p, fresh=True)
        except Exception as err:
            log.info("%s %s: readiness gates: selected pods unknown: %s", self.name, p.key, err)
            return None
        return p.employed | set(selected)

    async def _update_gates(self, p: PassState) -> None:
        """Set this employer's readiness gate on every live pod that carries it: True once the
        provider confirmed it serves the pod, False while it does not, True when the employer is
        deleting or no longer employs the pod, and True after the employer's fail-safe timeout
        (with a Warning Event on the pod). Only changed conditions are written."""
        if not self.employees_are_pods:
            return
        meta = p.employer["metadata"]
        namespace = str(meta.get("namespace") or "")
        gate = lifecycle.readiness_gate(meta["name"])
        pods = [(n, pod) for n, pod in self.pods.gated(namespace, gate) if not lifecycle.is_deleting(pod)]
        if not pods:
            return
        try:
            timeout = None if p.deleting else gates.gate_timeout(p.employer)
        except gates.InvalidAnnotation as err:
            await self.recorder.event(
                p.employer,
                "Warning",
                EventReason.UPDATE_READINESS_GATES_FAILED,
                f"{err}; the fail-safe is off",
            )
            timeout = None
        facts = readiness.GateFacts(
            deleting=p.deleting,
            synced=p.employees_synced,
            employed=await self._employed(p),
            serving=p.serving,
            unknown=p.unknown,
            refused=p.refused,
        )
        now = datetime.datetime.now(datetime.UTC)
        who = self._describe_employer(p.employer)
        plan = readiness.plan_gates(pods, gate, employer=who, facts=facts, timeout=timeout, now=now)
        p.gate_recheck = plan.recheck
        p.gate_failures = await self._write_gates(namespace, gate, plan.changes, now)

    async def _write_gates(
        self,
        namespace: str,
        gate: str,
        changes: Sequence[readiness.Change],
        now: datetime.datetime,
    ) -> dict[str, BaseException]:
        return await readiness.write_gates(
            namespace,
            gate,
            changes,
            now,
            locate=self.pods.locate,
            recorder=self.recorder,
            controller=self.name,
        )

    async def _release_gates_of_gone_employer(self, namespace: str, name: str) -> None:
        """The employer is gone: its gate goes True on every pod still waiting on it, so no pod
        stays un-Ready for ever (docs/zero-downtime.md)."""
        gate = lifecycle.readiness_gate(name)
        who = f"{self.employer_resource.kind} {namespace}/{name}"
        changes = readiness.gone_employer_changes(self.pods.gated(namespace, gate), gate, who)
        failures = await self._write_gates(namespace, gate, changes, datetime.datetime.now(datetime.UTC))
        if failures:
            pod, err = sorted(failures.items())[0]
            raise ReconcileError(
                EventReason.UPDATE_READINESS_GATES_FAILED,
                f"update readiness gates of deleted {namespace}/{name} failed: pod {pod}: {err}",
            )

    def _final_finalizers(self, p: PassState, name: str) -> list[str]:
        """A pod's finalizers after this pass's writes (from the write, else from the cache)."""
        if name in p.written.finalizers:
            return p.written.finalizers[name]
        if name in p.written.done and name not in p.written.failed:
            return []  # written to and found gone
        pod = self.pods.get(name, p.writer.namespace)
        return lifecycle.get_finalizers(pod) if pod is not None else []

    def _still_carries(self, p: PassState, name: str) -> bool:
        return guard.guarded(self._final_finalizers(p, name), p.entry)

    async def _patch_employer_annotations(self, p: PassState, annotations: dict[str, str]) -> None:
        try:
            patched = await patch_employer_annotations(
                self.client, self.employer_resource, p.employer, annotations
            )
        except ApiError as err:
            message = f"sync employees failed: patch record annotations failed, err: {err}"
            if isinstance(err, kube.Conflict):
                failure = ("conflict", str(EventReason.SYNC_EMPLOYEES_FAILED), "")
                retrying = await p.failures.fail_unless_retrying(
                    EventReason.SYNC_EMPLOYEES_FAILED, message, [failure]
                )
                # Its cause is the retry it asks for (errors.steering reads the cause chain).
                raise retrying from retrying.__cause__
            raise await p.failures.fail(EventReason.SYNC_EMPLOYEES_FAILED, message) from err
        if patched is not None:
            p.employer = patched

    # -- 6. release the clean finalizer ---------------------------------------------------------------

    async def _release_clean_finalizer(self, p: PassState) -> None:
        if not p.deleting:
            return
        employer_clean = is_clean(p.employer_results)
        employee_clean = is_clean(p.employee_results)
        if not (employer_clean and employee_clean and p.expected_clean):
            return
        if p.stand_in:
            p.collected = True
            self._tell(p.key, "", "employer_deleted")
            return
        obsolete = [wire.CLEAN_FINALIZER, old_clean_finalizer(p.employer)]
        try:
            if not await patch_employer_finalizers(
                self.client, self.employer_resource, p.employer, remove=obsolete
            ):
                return
        except Exception as err:
            raise await p.failures.fail(
                EventReason.CLEAN_EMPLOYER_CLEAN_FINALIZER_FAILED,
                f"clean employer clean-finalizer failed: {err}",
            ) from err
        log.info("%s %s: provider side clean, released clean finalizer", self.name, p.key)
        self._tell(p.key, "", "employer_deleted")
        await self.recorder.event(
            p.employer,
            "Normal",
            EventReason.CLEAN_EMPLOYER_CLEAN_FINALIZER_SUCCEED,
            "clean employer clean finalizer succeed",
        )
