"""One reconcile of one employer: the orchestrator over the step modules, in the order of
docs/concepts.md ("One reconcile"); each step takes what it needs and returns what it decided,
and none imports this module:

1. ``reconcile``   read the employer from the cache; gone: forget it, open its readiness gates
   (``readiness.Gatekeeper.release_gone``), done.
2. ``finalizers.ensure_clean_finalizer``   add the clean finalizer; go on from the answer.
3. ``finalizers.plan_expected_entries``    plan this employer's entry in each selected pod.
4. ``sync.sync_employer``                  the provider sync of the employer.
5. ``sync.sync_employees``  the same for the employees, under the guard (``_sync_employees``):
   before the calls ``guard.before_calls`` guards every pod the provider holds or is about to
   hold; after them ``guard.after_calls`` judges each pod and plans its swaps and releases.
   ``_write``     write each planned pod once, then the employer's record annotations
   (``finalizers.write_planned``); ``telling`` tells the subscribers.
   ``_gates``     this employer's readiness gates, from what the provider confirmed
   (``readiness.Gatekeeper.update``; docs/zero-downtime.md).
6. ``finalizers.release_clean_finalizer``  deleting and clean: drop the clean finalizer.
7. ``statuses.record_statuses`` after success, ``statuses.record_error_conditions`` after failure.
8. ``statuses.requeue``  failed items without an error: requeue after the adapter's interval, or
   a rate-limited retry.

Each pass begins in ``passes.PassFactory``: its context and state, and what it reads of the
cache before the calls (the selected employees, the budget priority). What the reconciler keeps
of an employer between passes is one record (``memory.EmployerMemory``).
Event reasons and messages are the Go frame's, so dashboards and alerts carry over. The guard
invariant these steps keep is written down in docs/concepts.md, "The guard".
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from resourceconsist.adapter import CUDResults, Employee, ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.interfaces import EventSink, ObjectReader, ObjectWriter
from resourceconsist.cluster.kube import EmployerKey, KubeObject
from resourceconsist.flow.budget import spending_for
from resourceconsist.flow.cancellation import Outcome
from resourceconsist.options import DEFAULT_FULL_PASS_EVERY
from resourceconsist.reconcile import finalizers, guard, readiness, statuses, sync
from resourceconsist.reconcile.outcome import DEFAULT_WARN_AFTER_PASSES, DEFAULT_WARN_AFTER_SECONDS, Result
from resourceconsist.reconcile.passes import PassFactory
from resourceconsist.reconcile.podwriter import PodWriteResult, RecentWrites
from resourceconsist.reconcile.profile import AdapterProfile
from resourceconsist.reconcile.state import PassState
from resourceconsist.reconcile.telling import Telling
from resourceconsist.rules.diff import Diff

log = logging.getLogger(__package__)

#: When the guard's writes before the calls took this long (seconds), the pass makes its plan
#: again from the cache before calling (``sync.replanned``): pods turned Ready meanwhile are
#: registered as serving at once instead of a pass later. Shorter writes leave too little time
#: for the pods to move to be worth a second read of the expected items.
REPLAN_AFTER = 0.25


class Reconciler:
    """Runs the reconcile steps of one adapter against one (main) cluster."""

    def __init__(
        self,
        profile: AdapterProfile,
        client: ObjectWriter,
        reader: ObjectReader,
        recorder: EventSink,
        clusters: Mapping[str, tuple[ObjectWriter, ObjectReader]] | None = None,
        *,
        api_down: Callable[[], bool] = lambda: False,
        report_unguarded: Callable[[int], None] = lambda total: None,
        report_retried: Callable[[str], None] = lambda reason: None,
        notify: Callable[[str, EmployerKey, str], None] = lambda what, key, pod: None,
        full_pass_every: float = DEFAULT_FULL_PASS_EVERY,
    ) -> None:
        """The hooks (the controller's): ``api_down`` says whether the main cluster's API server
        is known to be unreachable; ``report_unguarded`` gets the sum of ``unguarded`` whenever
        it may have changed, ``report_retried`` the Event reason of each failure left to a retry
        without a Warning (the metrics); ``notify`` gets (what happened, employer key, pod name
        or "") as a pass decides it, each once per change, and must not block
        (docs/lifecycle-hooks.md, "Subscribers")."""
        #: The adapter as the frame reads it (resourceconsist/reconcile/profile.py).
        self.profile = profile
        self.adapter = profile.adapter
        self.client = client
        self.reader = reader
        self.recorder = recorder
        self.employer_resource = employer_resource = profile.employer
        self.employee_resource = profile.employee
        self.clusters = clusters if clusters is not None else {}
        self.name = profile.name
        #: How each pass begins: its context, its state, what it reads before the calls.
        self.passes = PassFactory(
            profile,
            client,
            reader,
            recorder,
            self.clusters,
            api_down=api_down,
            report_unguarded=report_unguarded,
        )
        #: What the reconciler keeps of each employer between passes, by employer key.
        self._memory = self.passes.memory
        #: What the runtime tells of an employer between its passes (``memory.Memories``): an
        #: employee's event woke it, it changed itself (a full pass next), or it is another
        #: replica's now (``let_go``: what this one kept of it goes; the employer is not touched).
        self.employee_changed = self._memory.employee_changed
        self.employer_changed = self._memory.employer_changed
        self.let_go = self._memory.forget
        #: Pods written by this reconciler that the cache may not show yet, and where pod
        #: employees live (both shared with its passes).
        self.recent, self.pods = self.passes.recent, self.passes.pods
        #: Seconds after which an employer's next pass is a full one whatever changed
        #: (``ReconcileContext.changed`` None; docs/concepts.md, "Work proportional to change").
        self.full_pass_every = full_pass_every
        #: When a failure left to retries becomes a Warning Event: met on this many consecutive
        #: passes, over at least this many seconds (docs/concepts.md, "When a failure becomes a
        #: Warning"). An adapter error stays a Warning at once, as in the Go original.
        self.warn_after_passes: int = DEFAULT_WARN_AFTER_PASSES
        self.warn_after_seconds: float = DEFAULT_WARN_AFTER_SECONDS
        self.report_retried = report_retried
        #: How the steps write the employers, tell the subscribers, and read and write the gates.
        self.employer_writes = finalizers.EmployerWrites(
            client, employer_resource, recorder, self.reader, RecentWrites(employer_resource)
        )
        self.telling = Telling(self._memory, notify, self.name)
        self.gates = readiness.Gatekeeper(
            controller=self.name,
            employer_kind=employer_resource.kind,
            gated=self.pods.gated,
            locate=self.pods.locate,
            recorder=recorder,
            recent=self.recent,
        )

    # -- capabilities and their defaults ------------------------------------------------------------

    @property
    def employees_are_pods(self) -> bool:
        return self.employee_resource == kube.POD

    @property
    def follows_lifecycle(self) -> bool:
        """The employers' pods carry their marks: entries, guard and lifecycle finalizers."""
        return self.profile.follows_lifecycle

    # -- what the runtime reads of the reconciler between passes -----------------------------------

    @property
    def unguarded(self) -> dict[str, int]:
        """Per employer key: registrations the provider held without their pod's guard, as the
        last pass found them (the invariant, live: it should read 0; docs/concepts.md)."""
        return self._memory.unguarded()

    def context(self, key: str) -> ReconcileContext:
        """What the adapter is handed for employer ``key`` ("": no employer; ``PassFactory``)."""
        return self.passes.context(key)

    # -- 1. the whole pass ----------------------------------------------------------------------------

    async def reconcile(self, key: str, *, stand_in: KubeObject | None = None) -> Result:
        """One pass of the employer ``key`` (``namespace/name``, or ``name`` when cluster-scoped);
        with ``stand_in`` (a deleting copy of a gone employer), a pass that removes what the
        provider still holds for it (docs/lifecycle-hooks.md, "Orphans")."""
        key = EmployerKey(key)
        employer = stand_in or self.employer_writes.current(key.namespace_or_none, key.name)
        if employer is None:
            self._memory.forget(key)
            if self.employees_are_pods:
                await self.gates.release_gone(key.namespace, key.name)
            if "" in self.telling.told(key):
                self.telling.tell(key, "", "employer_deleted")
            return Result()
        p = self.passes.begin(
            key,
            employer,
            stand_in=stand_in is not None,
            report_retried=self.report_retried,
            warn_after=(self.warn_after_passes, self.warn_after_seconds),
        )
        began = time.monotonic()
        if not p.stand_in:
            p.ctx.changed = taken = self._memory.take_changes(key, self.full_pass_every)
            # Pods with no event since the last pass that ran to its end are as it found them
            # (docs/concepts.md, "Work proportional to change").
            last = self._memory.of(key).guard if taken is not None else None
            p.recall = guard.GuardRecall(
                last, functools.partial(self._memory.changed_since_last_pass, key, taken)
            )
        completed = False
        try:
            going_on = await finalizers.ensure_clean_finalizer(p.employer, self.employer_writes, p.failures)
            if going_on is None:
                return Result()
            p.employer = going_on
            result = await self._steps(p)
            completed = not p.any_failed
        except BaseException as err:
            if not isinstance(err, asyncio.CancelledError):
                self.telling.tell(key, "", "employer_failing")
            if p.stand_in:
                raise
            if not isinstance(err, asyncio.CancelledError):
                await statuses.record_error_conditions(self.profile, p.ctx, p.employer, err, p.failures)
            raise
        finally:
            p.failures.end_streaks()
            # The pass's scratch ends with it: what an adapter keeps there for the pass (the
            # built-in adapters keep a per-pass object that holds the context) would otherwise
            # hold the context in a cycle, freed only by the garbage collector
            # (docs/benchmarks.md, "Garbage a pass leaves").
            p.ctx.scratch.clear()
            if not p.stand_in:
                if completed:
                    self._memory.of(key).guard = p.recall.found(p.written.done | p.written.failed.keys())
                self._memory.pass_ended(key, began=began, completed=completed, full=p.ctx.changed is None)
        result.collected = p.collected
        if p.collected:
            self._memory.forget(key)
        if not p.deleting and result.requeue_after is None:
            self.telling.tell(key, "", "employer_converged")
        return result

    async def _steps(self, p: PassState) -> Result:
        """Steps 3 to 8, over a live employer that carries its clean finalizer (or a deleting one)."""
        try:
            try:
                if p.follows_lifecycle:  # 3.
                    p.entries = await finalizers.plan_expected_entries(
                        p.employer,
                        selected=functools.partial(self.passes.selected, p),
                        keeps_record=self.profile.records_expected_finalizers,
                        entry=p.entry,
                        pod_of=p.pod_of,
                        writer=p.writer,
                        failures=p.failures,
                        unselected=self.passes.unselected(p),
                        changed=p.ctx.changed,
                    )
                # The pass's provider reads spend the budget at the pass's priority
                # (docs/concepts.md, "The provider budget").
                with spending_for(self.passes.priority(p)):
                    employer_reads, employee_reads = await sync.read_sides(self.adapter, p.ctx, p.employer)
                    p.employer_results, refused, called = await sync.sync_employer(  # 4.
                        self.adapter, p.ctx, p.employer, p.failures, employer_reads
                    )
                    p.refused.update(refused)
                    # After an employer call, the employees are read again (sync.read_sides).
                    await self._sync_employees(p, None if called else employee_reads)  # 5.
            finally:
                # Pod entries planned before a failed step still land: a pod must list the
                # finalizers it needs even while the provider is failing.
                await self._write(p)
                if p.confirmed is not None:
                    finalizers_of = functools.partial(finalizers.finalizers_after, p.written, pod_of=p.pod_of)
                    self.telling.announce(p.key, p.confirmed.verdicts, finalizers_of, p.entry)
        except Exception:
            # The fail-safe of the readiness gates exists for a failing provider: it still runs.
            await self._gates(p)
            raise
        await self._gates(p)
        await p.gates.raise_failures(p.failures)
        result = await self._finish(p)
        # The gates' fail-safe and the adapter's own ask (ReconcileContext.look_again_in) bring
        # the next pass forward; the earliest wins.
        result.sooner(p.gates.recheck, p.ctx.look_again)
        return result

    async def _sync_employees(self, p: PassState, reads: Sequence[Outcome] | None) -> None:
        """5. The employee sync under the guard: before the calls, after them. Calls that are
        slow to answer have their pods' gates say they wait for the registration meanwhile
        (``readiness.Gatekeeper.in_flight``). ``reads``: the employees' reads made already
        (``sync.read_sides``; None: read them here)."""
        registering: asyncio.Task[None] | None = None
        writing = asyncio.Event()
        guard_took = 0.0

        async def before_calls(planned: Diff[Employee], current: Sequence[Employee]) -> set[str]:
            nonlocal registering, guard_took
            blocked: set[str] = set()
            if p.follows_lifecycle:
                p.carriers = self.passes.carriers(p)
                began = time.monotonic()
                guarding = await guard.before_calls(
                    planned,
                    current,
                    entry=p.entry,
                    pod_of=p.pod_of,
                    writer=p.writer,
                    written=p.written,
                    report_unguarded=functools.partial(self._memory.count_unguarded, p.key),
                    controller=self.name,
                    key=p.key,
                    recall=p.recall,
                )
                guard_took = time.monotonic() - began
                p.carriers |= guarding.carrying
                self.telling.guarded(p.key, guarding.guarding)
                blocked = guarding.blocked
            created = {e.name for e in planned.to_create if e.name} - blocked
            changed = {e.name for e in planned.to_update if e.name} - blocked
            if (created or changed) and not p.deleting:
                registering = asyncio.create_task(self._gates_in_flight(p, created, changed, writing))
            return blocked

        settled: set[str] = set()
        settling: list[asyncio.Task[PodWriteResult]] = []

        def after_call(results: CUDResults[Employee], pending: Sequence[Employee]) -> None:
            # A pod whose every item the calls so far confirmed has its verdict now: its swap or
            # release goes out at once, beside the calls still to come, not after all of them.
            # Its entry and guard went out before the calls (before_calls), as the guard wants.
            if not p.follows_lifecycle or p.deleting:
                return
            names = guard.settled(results, pending) - settled
            if not names:
                return
            settled.update(names)
            guard.plan_settled(results, names, p.carriers, p.entry, p.pod_of, p.writer)
            planned = {n for n in names if p.writer.planned(n)}
            if planned:
                settling.append(asyncio.create_task(p.writer.flush(only=planned)))

        def replan() -> Callable[[Employee], bool] | None:
            # Pods turned Ready while the guard wrote for seconds are called for as they are
            # now, not left to the next pass; only pods that carry the guard now may be called
            # for (sync.replanned; docs/concepts.md, "The guard").
            if p.deleting or guard_took < REPLAN_AFTER:
                return None
            if p.ctx.changed is not None:
                # The adapter may read only the pods named changed (ReconcileContext.changed):
                # those of this pass and those that changed since it began.
                since = self._memory.changes_so_far(p.key)
                p.ctx.changed = None if since is None else p.ctx.changed | since

            def may_call(item: Employee) -> bool:
                if not item.name or not item.registered():
                    return True  # the guard asks nothing of it (guard.before_calls)
                return guard.carries_guard(item.name, p.written, p.pod_of, p.entry)

            return may_call

        hook, heard = (before_calls, after_call) if self.employees_are_pods else (None, None)
        try:
            p.employee_results, current_by_id, refused = await sync.sync_employees(
                self.adapter, p.ctx, p.employer, p.failures, hook, heard, replan if hook else None, reads
            )
        finally:
            if registering is not None:
                if not writing.is_set():
                    # The calls answered in time: the gates after them say it all.
                    registering.cancel()
                # Writes under way land before the gates after the calls are decided.
                await asyncio.gather(registering, return_exceptions=True)
            # The settled pods' writes land before the rest is planned from what they wrote.
            for outcome in await asyncio.gather(*settling, return_exceptions=True):
                if isinstance(outcome, PodWriteResult):
                    p.written.merge(outcome)
        p.refused.update(refused)
        if not self.employees_are_pods:  # (following PodOpsLifecycle implies pod employees)
            return
        p.confirmed = guard.after_calls(
            p.employee_results,
            current_by_id,
            follows_lifecycle=p.follows_lifecycle,
            carriers=p.carriers,
            entry=p.entry,
            pod_of=p.pod_of,
            writer=p.writer,
            recall=p.recall,
        )
        p.lifecycle_record = p.follows_lifecycle and self.profile.records_lifecycle_finalizers

    async def _write(self, p: PassState) -> None:
        """Write each planned pod once, then the employer's record annotations (a stand-in's
        employer is not written: a new object may carry its name)."""
        records = await finalizers.write_planned(
            p.employer,
            p.writer,
            p.written,
            plan=p.entries,
            lifecycle_record=p.lifecycle_record,
            carriers=p.carriers,
            entry=p.entry,
            pod_of=p.pod_of,
            writes=None if p.stand_in else self.employer_writes,
            failures=p.failures,
        )
        if records is not None:
            p.expected_clean, p.employer = records.clean, records.employer
            await finalizers.raise_write_failures(p.written, p.entries.adds | p.entries.removes, p.failures)

    async def _gates_in_flight(
        self, p: PassState, created: set[str], changed: set[str], writing: asyncio.Event
    ) -> None:
        """Once the calls have run for ``readiness.IN_FLIGHT_AFTER`` seconds: the gates of the
        pods they register or change say so (``writing`` set from then: the writes are waited
        for, not cancelled). Best effort: a failed write is logged, the gates after the calls
        write again."""
        await asyncio.sleep(readiness.IN_FLIGHT_AFTER)
        writing.set()
        failed = await self.gates.in_flight(p.employer, p.key, created, changed)
        for name, err in sorted(failed.items()):
            log.info("%s %s: pod %s: gate of a call in flight not written: %s", self.name, p.key, name, err)

    async def _gates(self, p: PassState) -> None:
        """This employer's readiness gates, from what the pass confirmed (docs/zero-downtime.md)."""
        if not self.employees_are_pods:
            return
        p.gates = await self.gates.update(
            p.employer,
            p.key,
            confirmed=p.gate_facts(),
            expected=p.confirmed.employed if p.confirmed else set(),
            selected=functools.partial(self.passes.selected, p, fresh=True),
        )

    async def _finish(self, p: PassState) -> Result:
        """6. Release the clean finalizer; 7. record statuses; 8. requeue failed items."""
        if p.clean:
            if p.stand_in:
                p.collected = True
                self.telling.tell(p.key, "", "employer_deleted")
            elif await finalizers.release_clean_finalizer(p.employer, self.employer_writes, p.failures):
                self.telling.tell(p.key, "", "employer_deleted")
        if not p.stand_in:
            results = (p.employer_results, p.employee_results)
            await statuses.record_statuses(self.profile, p.ctx, p.employer, results, p.failures)
        return statuses.requeue(self.profile, p.ctx, p.employer, p.any_failed)
