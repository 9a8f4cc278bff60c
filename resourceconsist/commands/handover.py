"""``resourceconsist handover``: leave every pod in a state the Go original (KusionStack
ResourceConsist) handles, before it takes over from this controller (docs/wire-contract.md,
"Switching back to the Go original").

The Go original knows the lifecycle finalizer, not the guard (docs/concepts.md, "The guard"):
a pod left with our guard could never be deleted under it. The hand-over reads, for every
employer of the given adapters, what the provider holds now (``get_current_employee``, nothing
mutating), then writes each pod once through the frame's pod writer:

- the provider holds a registration of the pod: the guard is exchanged for the lifecycle
  finalizer and its ``expectedFinalizers`` entry, in one merge patch carrying the pod's
  resourceVersion, so the pod is never without one of the two;
- the provider holds nothing for it: the guard goes, and so does the lifecycle finalizer unless
  the Go original looks after it (a live pod its live employer selects);
- the provider's state is unknown (the lookup failed, no employer of the given adapters owns
  the finalizer): nothing changes, the pod is reported; unknown never releases a pod.

Then every readiness gate of the frame that is not True is opened (the Go original never writes
them), and the report says what is left to do. All of it runs while holding the controller's
leader-election Lease, so no replica of this controller reconciles meanwhile; the command
refuses to start while another holder renews it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from resourceconsist import wire
from resourceconsist.adapter import (
    Employee,
    ReconcileAdapter,
    ReconcileContext,
)
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import SnapshotReader, WatchEvent
from resourceconsist.cluster.kube import KubeClient, KubeObject, Resource
from resourceconsist.errors import ResourceConsistError
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.options import LeaderElectionOptions
from resourceconsist.reconcile.finalizers import patch_employer_annotations, record_annotations
from resourceconsist.reconcile.podwriter import EmployerEntry, PodLocation, PodWriter, PodWriteResult
from resourceconsist.reconcile.profile import AdapterProfile
from resourceconsist.rules import gates, lifecycle
from resourceconsist.runtime.leaderelection import LeaderElector

log = logging.getLogger(__name__)

_GUARD = wire.GUARD_FINALIZER_PREFIX + "/"
_LIFECYCLE = wire.LIFECYCLE_FINALIZER_PREFIX + "/"
#: The message of a gate the hand-over opens.
GATE_MESSAGE = "handed over to a controller that does not manage this readiness gate"


class HandoverError(ResourceConsistError):
    """The hand-over cannot start or go on; the message says what to do."""


class ControllerRunning(HandoverError):
    """Another holder renews the controller's Lease: the controller still runs."""


@dataclass(frozen=True)
class PodDone:
    """What the hand-over did (or, dry run, would do) to one pod's finalizers."""

    pod: str
    employer: str
    action: str  # "lifecycle finalizer" (kept or put on, guard off) or "released"
    #: Whether the pod was (or would be) written; False: it was so already.
    changed: bool = True


@dataclass(frozen=True)
class PodKept:
    """A pod left as it was, with our guard, and why."""

    pod: str
    employer: str
    why: str


@dataclass
class HandoverReport:
    done: list[PodDone] = field(default_factory=list)
    kept: list[PodKept] = field(default_factory=list)
    gates_opened: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dry_run: bool = False

    @property
    def complete(self) -> bool:
        """No pod keeps the guard: the Go original can take over every pod."""
        return not self.kept

    def lines(self) -> list[str]:
        """The report for people, one line per pod and per warning."""
        would = "[dry run] " if self.dry_run else ""
        words = {"lifecycle finalizer": "handed over (lifecycle finalizer, no guard)", "released": "released"}
        out = [f"warning: {w}" for w in self.warnings]
        out += [f"{would}{words[d.action]}: pod {d.pod} ({d.employer})" for d in self.done if d.changed]
        out += [f"{would}opened readiness gate: pod {g}" for g in self.gates_opened]
        out += [f"kept the guard: pod {k.pod} ({k.employer}): {k.why}" for k in self.kept]
        released = sum(d.action == "released" for d in self.done)
        out.append(
            f"{len(self.done) - released} pods with the lifecycle finalizer, {released} released, "
            f"{len(self.gates_opened)} gates opened, {len(self.kept)} pods keep the guard"
            + ("" if self.complete else ": run the hand-over again once their cause is fixed")
        )
        return out


# -- the Lease -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def holding_lease(client: KubeClient, options: LeaderElectionOptions) -> AsyncIterator[asyncio.Event]:
    """Hold the controller's leader-election Lease for the body; yields an event set when it is
    lost. Refuses (``ControllerRunning``) while another holder renews it."""
    elector = LeaderElector(client, options)
    where = f"{elector.namespace}/{options.name}"
    holder = await asyncio.to_thread(elector.holder)
    if holder is not None:
        raise ControllerRunning(
            f"Lease {where} is held by {holder}: the controller still runs; stop it first "
            "(scale its Deployment to 0), then run the hand-over again"
        )
    won, lost, stop = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def started() -> None:
        won.set()

    async def stopped() -> None:
        lost.set()

    campaign = asyncio.create_task(elector.run(started, stopped, stop))
    try:
        try:
            await asyncio.wait_for(won.wait(), timeout=options.renew_deadline + options.retry_period)
        except TimeoutError:
            raise ControllerRunning(
                f"could not take Lease {where} (another replica took it meanwhile?); stop the "
                "controller first, then run the hand-over again"
            ) from None
        log.info("holding Lease %s as %s for the hand-over", where, options.identity)
        yield lost
    finally:
        stop.set()
        await campaign


# -- the hand-over ---------------------------------------------------------------------------------


@dataclass
class _Employer:
    """One employer the hand-over looks at, with what the provider holds for it."""

    obj: KubeObject
    resource: Resource
    adapters: list[AdapterProfile]
    entry: EmployerEntry
    #: Pods the provider holds a registration of; None when a lookup failed.
    held: set[str] | None = None
    error: str = ""
    #: Pods the employer selects; None when unknown.
    selected: set[str] | None = None

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"].get("namespace") or "")

    @property
    def ref(self) -> str:
        return f"{self.resource.kind} {kube.object_key(self.obj)}"


def _digest(finalizer: str) -> str:
    return finalizer.rpartition("/")[2]


def _share_finalizers(employers: Sequence[_Employer]) -> None:
    """Employers of one name in one namespace (of different kinds) share their finalizers (the
    hash is of the name alone, as in Go): a pod any of them holds is held, and one unknown makes
    them all unknown."""
    groups: dict[tuple[str, str], list[_Employer]] = {}
    for employer in employers:
        groups.setdefault((employer.namespace, employer.entry.guard_finalizer), []).append(employer)
    for group in groups.values():
        if len(group) < 2:
            continue
        unknown = next((e for e in group if e.held is None), None)
        held = set().union(*(e.held or set() for e in group))
        for employer in group:
            employer.held = None if unknown is not None else held
            employer.error = unknown.error if unknown is not None else employer.error


class Handover:
    """Hands the pods of one cluster over from the given adapters to the Go original."""

    def __init__(
        self,
        client: KubeClient,
        adapters: Sequence[ReconcileAdapter],
        *,
        namespaces: Sequence[str] | None = None,
        dry_run: bool = False,
    ) -> None:
        """``namespaces``: only these namespaces' pods and employers (None: all)."""
        #: Each adapter as the frame reads it (resourceconsist/reconcile/profile.py).
        self.profiles = [AdapterProfile.of(adapter) for adapter in adapters]
        for profile in self.profiles:
            if profile.employees_in_members():
                raise HandoverError(
                    f"adapter {profile.name} keeps its pods in member clusters; "
                    "the hand-over covers one cluster's pods only"
                )
        self.client = client
        self.namespaces = None if namespaces is None else tuple(namespaces)
        self.dry_run = dry_run
        self.reader = SnapshotReader(client)
        self.report = HandoverReport(dry_run=dry_run)

    def _guarded_adapters(self) -> dict[Resource, list[AdapterProfile]]:
        """The adapters whose pods carry the frame's finalizers, by employer kind."""
        by_kind: dict[Resource, list[AdapterProfile]] = {}
        for profile in self.profiles:
            if profile.follows_lifecycle:
                by_kind.setdefault(profile.employer, []).append(profile)
        return by_kind

    def _list(self, resource: Resource) -> list[KubeObject]:
        """The objects of ``resource`` in the namespaces handed over."""
        if self.namespaces is None:
            return self.reader.list(resource)
        return [obj for namespace in self.namespaces for obj in self.reader.list(resource, namespace)]

    def _pods(self) -> list[KubeObject]:
        return self._list(kube.POD)

    def _employers(self, carried: set[tuple[str, str]]) -> list[_Employer]:
        """Employers an adapter accepts, and any of their kind whose finalizer a pod carries
        (one whose label was taken off still has pods to hand over)."""
        found: list[_Employer] = []
        for resource, adapters in self._guarded_adapters().items():
            for obj in self._list(resource):
                meta = obj["metadata"]
                name, namespace = str(meta["name"]), str(meta.get("namespace") or "")
                event = WatchEvent("ADDED", obj)
                mine = [a for a in adapters if a.watch.employer_predicate(event)]
                if not mine and (namespace, _digest(lifecycle.guard_finalizer(name))) not in carried:
                    continue
                entry = EmployerEntry(
                    key=lifecycle.expected_finalizer_key(resource.kind, namespace, name),
                    lifecycle_finalizer=lifecycle.lifecycle_finalizer(name),
                    guard_finalizer=lifecycle.guard_finalizer(name),
                )
                found.append(_Employer(obj, resource, mine or adapters, entry))
        return found

    async def _consult(self, employer: _Employer) -> None:
        """What the provider holds for the employer, from every adapter that serves it."""
        held: set[str] = set()
        for profile in employer.adapters:
            ctx = self._context(profile, employer)
            try:
                items: list[Employee] = list(
                    await call_adapter(profile.adapter.get_current_employee, ctx, employer.obj)
                )
            except Exception as err:
                employer.error = f"{profile.name}: provider lookup failed: {err}"
                log.warning("%s: %s", employer.ref, employer.error)
                return
            held |= {item.name for item in items if item.name and item.registered()}
        employer.held = held
        employer.selected = await self._selected(employer)

    def _context(self, profile: AdapterProfile, employer: _Employer) -> ReconcileContext:
        """What the hand-over's adapter calls get: the snapshot to read, no writer or recorder."""
        return ReconcileContext(
            reader=self.reader, controller=profile.name, employer_key=kube.object_key(employer.obj)
        )

    async def _selected(self, employer: _Employer) -> set[str] | None:
        """The pods the employer selects, as its controller reads them (the pass's own
        ``AdapterProfile.selected_names``); None when unknown."""
        names: set[str] = set()
        for profile in employer.adapters:
            try:
                names |= set(
                    await profile.selected_names(self._context(profile, employer), employer.obj, self.reader)
                )
            except Exception as err:
                log.info("%s: selected pods unknown: %s", employer.ref, err)
                return None
        return names

    async def run(self) -> HandoverReport:
        """Decide every pod from the provider's answers, write, open the gates; the report."""
        await asyncio.to_thread(self._check_webhook)
        pods = await asyncio.to_thread(self._pods)
        carried = {
            (str(p["metadata"].get("namespace") or ""), _digest(f))
            for p in pods
            for f in lifecycle.get_finalizers(p)
            if f.startswith((_GUARD, _LIFECYCLE))
        }
        employers = await asyncio.to_thread(self._employers, carried)
        for employer in employers:
            await self._consult(employer)
        _share_finalizers(employers)
        owned: set[tuple[str, str]] = set()
        for employer in employers:
            owned.add((employer.namespace, _digest(employer.entry.guard_finalizer)))
            await self._hand_over(employer, pods)
        for pod in pods:
            meta = pod["metadata"]
            namespace = str(meta.get("namespace") or "")
            for f in lifecycle.get_finalizers(pod):
                if f.startswith(_GUARD) and (namespace, _digest(f)) not in owned:
                    self.report.kept.append(
                        PodKept(
                            f"{namespace}/{meta['name']}",
                            f"finalizer {f}",
                            "no employer of the given adapters has this guard (its employer is gone, "
                            "or its adapter was not named): run the controller until it released the "
                            "pod, or name every adapter it ran",
                        )
                    )
        await self._open_gates(pods)
        return self.report

    def _check_webhook(self) -> None:
        """Warn while our mutating webhook is still registered (step 1 of the switch)."""
        try:
            found = self.client.get_or_none(
                kube.MUTATING_WEBHOOK_CONFIGURATION, None, wire.MUTATING_WEBHOOK_CONFIGURATION
            )
        except kube.ApiError as err:  # e.g. no right to read it: say so, and go on
            self.report.warnings.append(
                f"could not check for MutatingWebhookConfiguration {wire.MUTATING_WEBHOOK_CONFIGURATION} "
                f"({err}); make sure it is deleted (docs/wire-contract.md)"
            )
            return
        if found is not None:
            self.report.warnings.append(
                f"MutatingWebhookConfiguration {wire.MUTATING_WEBHOOK_CONFIGURATION} still exists: new "
                "controlled pods get readiness gates nobody opens under the Go original (or cannot be "
                "created while its server is down); delete it (docs/wire-contract.md)"
            )

    async def _hand_over(self, employer: _Employer, pods: list[KubeObject]) -> None:
        """Plan and write each pod of one employer: lifecycle finalizer where the provider holds
        it, nothing of ours where it holds nothing, nothing changed where it is unknown."""
        entry, namespace = employer.entry, employer.namespace
        ours = (entry.guard_finalizer, entry.lifecycle_finalizer)
        in_namespace = {
            str(p["metadata"]["name"]): p
            for p in pods
            if str(p["metadata"].get("namespace") or "") == namespace
        }
        carriers = {n for n, p in in_namespace.items() if set(ours) & set(lifecycle.get_finalizers(p))}
        if employer.held is None:
            for name in sorted(carriers):
                if entry.guard_finalizer in lifecycle.get_finalizers(in_namespace[name]):
                    self.report.kept.append(PodKept(f"{namespace}/{name}", employer.ref, employer.error))
            return
        held = employer.held & set(in_namespace)  # a backend of a pod that is gone blocks nothing
        writer = PodWriter(namespace, self._locate, entry)
        plans: dict[str, str] = {}
        for name in sorted(held):
            writer.swap(name, to_lifecycle=True)
            plans[name] = _SWAP
        for name in sorted(carriers - held):
            writer.remove_finalizer(name, entry.guard_finalizer)
            plans[name] = _UNGUARD
            if self._go_keeps_it(employer, in_namespace[name]):
                continue
            writer.remove_finalizer(name, entry.lifecycle_finalizer)
            plans[name] = _RELEASE
        if not writer.pending:
            return
        if self.dry_run:
            after = {n: _predicted(in_namespace[n], entry, plan) for n, plan in plans.items()}
        else:
            written = await writer.flush()
            for name, err in sorted(written.failed.items()):
                pod = f"{namespace}/{name}"
                log.warning("hand-over of pod %s (%s): write failed: %s", pod, employer.ref, err)
                self.report.kept.append(PodKept(pod, employer.ref, f"write failed: {err}"))
            after = {n: f for n, f in written.finalizers.items() if n not in written.failed}
        for name, finalizers in sorted(after.items()):
            self._record(employer, f"{namespace}/{name}", in_namespace[name], finalizers, name in held)
        if not self.dry_run and any(a.records_lifecycle_finalizers for a in employer.adapters):
            final = {n: lifecycle.get_finalizers(p) for n, p in in_namespace.items()} | after
            await self._update_record(employer, final)

    async def _update_record(self, employer: _Employer, final: dict[str, list[str]]) -> None:
        """Record mode: the employer's record of the pods carrying its lifecycle finalizer names
        the pods that got it, so the Go original releases them once they leave the selection
        (the pass's own record rules, ``reconcile.finalizers.record_annotations``)."""
        lifecycle_finalizer = employer.entry.lifecycle_finalizer
        annotations = record_annotations(
            employer.obj,
            PodWriteResult(),
            expected_record=None,
            adds=(),
            removes=(),
            lifecycle_record=True,
            carriers=final,
            carries_lifecycle=lambda name: lifecycle_finalizer in final.get(name, ()),
        )
        if not annotations:
            return
        try:
            await patch_employer_annotations(self.client, employer.resource, employer.obj, annotations)
        except kube.ApiError as err:
            names = ", ".join(sorted(annotations))
            self.report.warnings.append(f"{employer.ref}: annotation {names} not updated: {err}")

    @staticmethod
    def _go_keeps_it(employer: _Employer, pod: KubeObject) -> bool:
        """Whether the Go original looks after the lifecycle finalizer of a pod the provider
        does not hold: a live pod of a live employer that selects it (it registers the pod, then
        keeps or releases the finalizer by readiness). Such a pod keeps it, so that a run while
        the Go original already works never takes it off a pod the Go original just registered;
        any other pod (deleting, not selected, of a deleting employer) would keep it for ever."""
        if lifecycle.is_deleting(pod) or lifecycle.is_deleting(employer.obj):
            return False
        return employer.selected is None or pod["metadata"]["name"] in employer.selected

    def _record(
        self, employer: _Employer, pod: str, before: KubeObject, after: list[str], held: bool
    ) -> None:
        """Report one pod's outcome from its finalizers after the write."""
        entry = employer.entry
        if entry.guard_finalizer in after:
            self.report.kept.append(PodKept(pod, employer.ref, _DELETING))
            return
        if held and entry.lifecycle_finalizer not in after:
            self.report.warnings.append(
                f"pod {pod} ({employer.ref}) is deleting without a finalizer of ours while the provider "
                "holds it; nothing can be added to a deleting pod"
            )
            return
        action = "lifecycle finalizer" if entry.lifecycle_finalizer in after else "released"
        changed = after != lifecycle.get_finalizers(before) or (held and entry.key not in _entries(before))
        if changed:
            log.info("hand-over: pod %s (%s): %s", pod, employer.ref, action)
        self.report.done.append(PodDone(pod, employer.ref, action, changed))

    def _locate(self, name: str) -> PodLocation:
        return PodLocation(self.client, self.reader, name)

    async def _open_gates(self, pods: list[KubeObject]) -> None:
        """Open (True, ``HandedOver``) every readiness gate of the frame that is not True on a
        live pod: the Go original never writes them, and a closed one keeps its pod un-Ready."""
        now = datetime.datetime.now(datetime.UTC)
        want = gates.GateState(True, wire.GateReason.HANDED_OVER, GATE_MESSAGE)
        for pod in pods:
            meta = pod["metadata"]
            if lifecycle.is_deleting(pod):
                continue
            for gate in lifecycle.readiness_gates(pod):
                condition = lifecycle.pod_condition(pod, gate) or {}
                if not lifecycle.is_readiness_gate(gate) or condition.get("status") == "True":
                    continue
                where = f"{meta.get('namespace')}/{meta['name']} {gate}"
                if not self.dry_run:
                    write = functools.partial(self.client.patch, patch_type="strategic", subresource="status")
                    body = gates.condition_patch(pod, gate, want, now)
                    try:
                        await asyncio.to_thread(write, kube.POD, meta.get("namespace"), meta["name"], body)
                    except kube.NotFound:
                        continue
                    except kube.ApiError as err:
                        self.report.warnings.append(f"readiness gate {where} not opened: {err}")
                        continue
                    log.info("hand-over: pod %s: opened readiness gate", where)
                self.report.gates_opened.append(where)


_DELETING = (
    "deleting while the provider still holds it: no finalizer can be added to a deleting pod; "
    "run the hand-over again once the Go original (or this controller) has deregistered it"
)


def _entries(pod: KubeObject) -> dict[str, str]:
    try:
        return lifecycle.expected_finalizers(pod)
    except lifecycle.MalformedAvailableConditions:
        return {}


#: What the hand-over plans for one pod's finalizers.
_SWAP, _UNGUARD, _RELEASE = "swap", "unguard", "release"


def _predicted(pod: KubeObject, entry: EmployerEntry, plan: str) -> list[str]:
    """The finalizers a dry run expects the write to leave, by the pod writer's rules: a swap
    trades the guard for the lifecycle finalizer unless the pod is deleting (nothing can be
    added then, so it keeps what it has); the others drop the guard, or both."""
    current = lifecycle.get_finalizers(pod)
    if plan == _UNGUARD:
        return [f for f in current if f != entry.guard_finalizer]
    if plan == _RELEASE:
        return [f for f in current if f not in (entry.guard_finalizer, entry.lifecycle_finalizer)]
    if lifecycle.is_deleting(pod):
        return current
    kept = [f for f in current if f != entry.guard_finalizer]
    return kept if entry.lifecycle_finalizer in kept else [*kept, entry.lifecycle_finalizer]


async def hand_over(
    client: KubeClient,
    adapters: Sequence[ReconcileAdapter],
    lease: LeaderElectionOptions,
    *,
    namespaces: Sequence[str] | None = None,
    dry_run: bool = False,
) -> HandoverReport:
    """Hold the controller's Lease and hand every pod over, of ``namespaces`` only unless None
    (docs/wire-contract.md, "Switching back to the Go original")."""
    handover = Handover(client, adapters, namespaces=namespaces, dry_run=dry_run)
    async with holding_lease(client, lease) as lost:
        work = asyncio.create_task(handover.run())
        watch = asyncio.create_task(lost.wait())
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        watch.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            raise HandoverError(
                "lost the controller's Lease during the hand-over (a replica of the controller "
                "started?); stop it, then run the hand-over again"
            )
        return work.result()
