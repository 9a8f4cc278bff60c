"""``resourceconsist explain``: why a pod is not Ready or cannot be deleted, and why an employer
has not converged, read from the live cluster and the adapter's view of the provider
(docs/explain.md).

Explain only reads: the API server (each kind of the namespace listed once, a snapshot) and the
provider, through the adapter's ``get_*`` methods and its optional ``describe_provider``
(``adapter.ProviderDescribeOptions``). The answers are pydantic models, so ``--output json``
and the readable lines say the same thing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic_core import to_jsonable_python

from resourceconsist import wire
from resourceconsist.adapter import (
    Employee,
    Employer,
    OrphanCollectOptions,
    OwnedItem,
    ProviderBackend,
    ProviderView,
    ReconcileAdapter,
    ReconcileContext,
)
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import SnapshotReader
from resourceconsist.cluster.kube import KubeClient, KubeObject, Resource
from resourceconsist.errors import ResourceConsistError
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.hooks.orphans import CANNOT_LIST, NAME_UNKNOWN, NOT_COMPLETE
from resourceconsist.reconcile.profile import AdapterProfile
from resourceconsist.rules import lifecycle, marks
from resourceconsist.rules.diff import diff

#: How many of an employer's latest Warning Events explain shows.
RECENT_WARNINGS = 5
_SERVICE_NAMES = {"service", "services", "svc"}


class ExplainError(ResourceConsistError):
    """Explain cannot answer (bad argument, unknown kind); the message says what to do."""


# -- answers ------------------------------------------------------------------------------------


class FailureAnswer(BaseModel):
    """A provider failure the controller recorded as a Warning Event once it outlasted its
    retries (docs/concepts.md, "When a failure becomes a Warning"), read from the Event's
    ``resource-consist.kusionstack.io/provider-failure`` annotation."""

    #: ``Kind/namespace/name`` of the employer the Event is about.
    employer: str
    #: The Event's reason, e.g. ``SyncEmployeesFailed``.
    reason: str
    #: The call the provider refused: ``syncCreate``, ``syncUpdate`` or ``syncDelete``.
    operation: str
    #: The provider item's id, and the employee (pod) it stands for.
    item: str
    name: str = ""
    #: The provider's error code and message.
    code: str = ""
    message: str = ""
    #: How many times the Event was recorded, and its first and last time.
    count: int = 1
    first: str | None = None
    last: str | None = None


class GateAnswer(BaseModel):
    """A readiness gate of the pod that is not True."""

    gate: str
    #: The condition's status as Kubernetes writes it: ``False``, ``Unknown``, or ``missing``
    #: (no condition yet).
    status: str
    reason: str = ""
    message: str = ""
    #: The condition's lastTransitionTime: since when it has been so.
    since: str | None = None
    #: ``Kind/namespace/name`` of the employer owning the gate; None for a gate not ours.
    employer: str | None = None
    #: What the provider holds for this pod for that employer (None: nothing, or not consulted).
    provider: ProviderBackend | None = None
    provider_consulted: bool = False
    #: In words: what the gate waits for (the kubelet, the registration, the provider serving).
    pending: str = ""


class FinalizerAnswer(BaseModel):
    """A finalizer of the pod: whose it is and what it waits for."""

    finalizer: str
    role: Literal["guard", "lifecycle", "other"]
    #: ``Kind/namespace/name`` of the employers whose finalizer hash it is (none found: [] ).
    employers: list[str] = Field(default_factory=list)
    #: What the provider still holds for this pod for those employers.
    provider: list[ProviderBackend] = Field(default_factory=list)
    provider_consulted: bool = False
    #: In words: what must happen before it goes.
    pending: str = ""


class GoneEmployerAnswer(BaseModel):
    """An employer that no longer exists while its marks still hold the pod (docs/explain.md,
    "Held by a gone employer")."""

    #: ``Kind/namespace/name``; ``Kind/namespace/#<hash>`` when only its finalizers' hash is left.
    employer: str
    finalizers: list[str] = Field(default_factory=list)
    #: The pod's ``expectedFinalizers`` entry that names it, if any.
    entry: str | None = None
    #: ``yes``: a consulted adapter lists what it holds, so its controller collects it;
    #: ``no``: nothing is collected automatically; ``unknown``: no ``--adapter`` of its kind.
    collectable: Literal["yes", "no", "unknown"] = "unknown"
    #: Why, in words (what the provider still holds for it, when the adapter could list).
    why: str = ""
    #: What the operator must do.
    action: str = ""
    #: The ``kubectl patch`` that releases the pod by hand, for once no load balancer routes to it.
    release_command: str = ""


class PodExplanation(BaseModel):
    kind: Literal["Pod"] = "Pod"
    namespace: str
    name: str
    exists: bool = True
    phase: str = ""
    #: The ``Ready`` condition: True or False, None when the pod has none.
    ready: bool | None = None
    ready_since: str | None = None
    ready_reason: str = ""
    #: The ``ContainersReady`` condition: True or False, None when the pod has none.
    containers_ready: bool | None = None
    deleting: bool = False
    deletion_timestamp: str | None = None
    not_ready: list[GateAnswer] = Field(default_factory=list)
    finalizers: list[FinalizerAnswer] = Field(default_factory=list)
    #: Employers whose provider serves the pod while its containers are not ready (traffic fails).
    served_while_stopped: list[str] = Field(default_factory=list)
    #: Failures of its employers' providers about this pod that outlasted their retries.
    provider_failures: list[FailureAnswer] = Field(default_factory=list)
    #: Adapters whose provider was consulted.
    adapters: list[str] = Field(default_factory=list)
    #: Employers that are gone while their marks still hold the pod.
    gone: list[GoneEmployerAnswer] = Field(default_factory=list)


class ItemChange(BaseModel):
    """One difference between what the provider should hold and what it holds."""

    action: Literal["create", "update", "delete"]
    #: What the change does to the registration: ``register`` (the provider will hold one that
    #: may route), ``deregister`` (it will hold none), ``change`` (it holds one before and after).
    effect: Literal["register", "deregister", "change"] = "change"
    id: str
    name: str = ""
    #: The pod the provider ties the item to (its backend's description, else the item's name).
    pod: str | None = None
    #: Whether that pod exists; None when the item names no pod.
    pod_exists: bool | None = None
    expected: Any = None
    current: Any = None
    #: The provider's last refusal of this item, once it outlasted its retries.
    failure: FailureAnswer | None = None


class EventAnswer(BaseModel):
    type: str
    reason: str
    message: str
    count: int = 1
    first: str | None = None
    last: str | None = None
    #: The provider failure the Event records, when it records one.
    failure: FailureAnswer | None = None


class PodState(BaseModel):
    """A pod the employer selects or holds: its gate, finalizers and backend."""

    name: str
    #: Whether the pod carries this employer's readiness gate, and its condition (None: no
    #: condition yet, or no gate).
    has_gate: bool = False
    gate: bool | None = None
    has_guard: bool = False
    has_lifecycle_finalizer: bool = False
    deleting: bool = False
    provider: ProviderBackend | None = None


class EmployerExplanation(BaseModel):
    kind: str
    namespace: str
    name: str
    exists: bool = True
    deleting: bool = False
    finalizers: list[str] = Field(default_factory=list)
    controller: str | None = None
    provider_consulted: bool = False
    #: None when no adapter was consulted (nothing to compare with).
    converged: bool | None = None
    employer_changes: list[ItemChange] = Field(default_factory=list)
    employee_changes: list[ItemChange] = Field(default_factory=list)
    #: Pods the provider holds a registration of without this employer's guard or lifecycle finalizer.
    unguarded: list[str] = Field(default_factory=list)
    #: Pods carrying this employer's finalizers that the provider holds nothing for (to release).
    to_release: list[str] = Field(default_factory=list)
    #: A provider read that failed, in the adapter's words.
    provider_error: str | None = None
    pods: list[PodState] = Field(default_factory=list)
    warnings: list[EventAnswer] = Field(default_factory=list)
    #: Provider failures that outlasted their retries (latest Event per operation and item).
    failures: list[FailureAnswer] = Field(default_factory=list)
    provider: ProviderView | None = None


# -- reading the cluster --------------------------------------------------------------------------


def _ref(resource: Resource, namespace: str, name: str) -> str:
    return f"{resource.kind}/{namespace}/{name}"


def _status(condition: Mapping[str, Any] | None) -> bool | None:
    """A condition's status as a boolean; None when there is no condition (or it is Unknown)."""
    status = (condition or {}).get("status")
    return True if status == "True" else False if status == "False" else None


def _plain(value: Any) -> Any:
    """An item's statuses as JSON-able data (pydantic models as their fields)."""
    return to_jsonable_python(value, fallback=str)


@dataclass
class _Consulted:
    """One adapter's provider view of one employer."""

    adapter: ReconcileAdapter
    view: ProviderView | None
    error: str | None = None

    def backend(self, pod: str) -> ProviderBackend | None:
        if self.view is None:
            return None
        return next((b for b in self.view.backends if b.employee == pod), None)


class Explainer:
    """Answers explain's questions for one cluster and the given adapters (none: Kubernetes only)."""

    def __init__(self, client: KubeClient, adapters: Sequence[ReconcileAdapter] = ()) -> None:
        self.client = client
        self.adapters = list(adapters)
        #: Each adapter as the frame reads it (resourceconsist/reconcile/profile.py).
        self._profiles = {id(a): AdapterProfile.of(a) for a in self.adapters}
        self.reader = SnapshotReader(client)
        #: What each listing adapter's ``list_owned`` answered, asked once per explain.
        self._owned: dict[str, list[OwnedItem]] = {}
        self._event_cache: dict[tuple[str, str, str], list[EventAnswer]] = {}

    # -- shared pieces ----------------------------------------------------------------------------

    def _profile(self, adapter: ReconcileAdapter) -> AdapterProfile:
        return self._profiles[id(adapter)]

    def _adapters_for(self, resource: Resource) -> list[ReconcileAdapter]:
        return [a for a in self.adapters if self._profile(a).employer == resource]

    def _employer_resources(self) -> list[Resource]:
        found = [kube.SERVICE]
        for adapter in self.adapters:
            resource = self._profile(adapter).employer
            if resource not in found:
                found.append(resource)
        return found

    def _context(self, adapter: ReconcileAdapter, employer: KubeObject | None) -> ReconcileContext:
        """What explain's adapter calls get: the snapshot to read, and no writer or recorder
        (explain writes nothing); ``employer`` None: the call is about no one employer."""
        return ReconcileContext(
            reader=self.reader,
            controller=adapter.get_controller_name(),
            employer_key="" if employer is None else kube.object_key(employer),
        )

    async def _provider_view(self, adapter: ReconcileAdapter, employer: KubeObject) -> _Consulted:
        """The provider's side for one employer: the adapter's description, else its current items."""
        ctx = self._context(adapter, employer)
        try:
            describe = self._profile(adapter).describe
            if describe is not None:
                return _Consulted(adapter, await call_adapter(describe.describe_provider, ctx, employer))
            employers: list[Employer] = await call_adapter(adapter.get_current_employer, ctx, employer)
            employees: list[Employee] = await call_adapter(adapter.get_current_employee, ctx, employer)
        except Exception as err:
            return _Consulted(adapter, None, f"{adapter.get_controller_name()}: {err}")
        return _Consulted(
            adapter,
            ProviderView(
                employer={e.id: _plain(e.statuses) for e in employers},
                backends=[
                    ProviderBackend(
                        employee=e.name,
                        id=e.id,
                        serving=e.serves(),
                        state="registered" if e.registered() else "not registered",
                        details={"statuses": _plain(e.statuses)},
                    )
                    for e in employees
                ],
            ),
        )

    def _employers_by_hash(self, namespace: str, pod: KubeObject) -> dict[str, list[tuple[Resource, str]]]:
        """Employer candidates of the namespace by the hash their finalizers carry: live employers
        of every kind the adapters use, and the names the pod's ``expectedFinalizers`` keys give
        (an employer already gone still names its finalizer)."""
        candidates: dict[tuple[str, str], Resource] = {}
        for resource in self._employer_resources():
            for obj in self.reader.list(resource, namespace):
                candidates[(resource.kind, obj["metadata"]["name"])] = resource
        try:
            entries = lifecycle.expected_finalizers(pod)
        except lifecycle.MalformedAvailableConditions:
            entries = {}
        for key in entries:
            kind, _, rest = key.partition("/")
            name = rest.partition("/")[2]
            if kind and name and (kind, name) not in candidates:
                candidates[(kind, name)] = Resource("", "", kind, "", True)
        by_hash: dict[str, list[tuple[Resource, str]]] = {}
        for (_, name), resource in sorted(candidates.items()):
            digest = lifecycle.lifecycle_finalizer(name).rpartition("/")[2]
            by_hash.setdefault(digest, []).append((resource, name))
        return by_hash

    async def _consult(self, resource: Resource, namespace: str, name: str) -> list[_Consulted]:
        employer = self.reader.get(resource, namespace, name) if resource.plural else None
        if employer is None:
            return []
        return [await self._provider_view(a, employer) for a in self._adapters_for(resource)]

    # -- pods ---------------------------------------------------------------------------------------

    async def pod(self, namespace: str, name: str) -> PodExplanation:
        """Why the pod is not Ready (gates, employers, provider, since when) and what holds it."""
        pod = self.reader.get(kube.POD, namespace, name)
        answer = PodExplanation(namespace=namespace, name=name, adapters=self._names())
        if pod is None:
            answer.exists = False
            return answer
        status = pod.get("status") or {}
        ready = lifecycle.pod_condition(pod, "Ready") or {}
        answer.phase = str(status.get("phase") or "")
        answer.ready = _status(ready)
        answer.ready_since = ready.get("lastTransitionTime")
        answer.ready_reason = str(ready.get("reason") or "")
        answer.containers_ready = _status(lifecycle.pod_condition(pod, "ContainersReady"))
        answer.deleting = lifecycle.is_deleting(pod)
        answer.deletion_timestamp = pod["metadata"].get("deletionTimestamp")
        by_hash = self._employers_by_hash(namespace, pod)
        consulted: dict[tuple[str, str], list[_Consulted]] = {}

        async def views(resource: Resource, employer: str) -> list[_Consulted]:
            key = (resource.kind, employer)
            if key not in consulted:
                consulted[key] = await self._consult(resource, namespace, employer)
            return consulted[key]

        gate_owners = {
            lifecycle.readiness_gate(employer): (resource, employer)
            for owners in by_hash.values()
            for resource, employer in owners
        }
        for gate in lifecycle.readiness_gates(pod):
            cond = lifecycle.pod_condition(pod, gate)
            if cond is not None and cond.get("status") == "True":
                continue
            item = GateAnswer(
                gate=gate,
                status=str(cond.get("status")) if cond is not None else "missing",
                reason=str((cond or {}).get("reason") or ""),
                message=str((cond or {}).get("message") or ""),
                since=(cond or {}).get("lastTransitionTime"),
            )
            owner = gate_owners.get(gate)
            if owner is not None:
                item.employer = _ref(owner[0], namespace, owner[1])
                for view in await views(*owner):
                    item.provider_consulted = item.provider_consulted or view.view is not None
                    item.provider = item.provider or view.backend(name)
                item.pending = _gate_pending(item, containers_ready=answer.containers_ready)
            answer.not_ready.append(item)
        for finalizer in lifecycle.get_finalizers(pod):
            prefix, _, digest = finalizer.rpartition("/")
            role: Literal["guard", "lifecycle", "other"] = (
                "guard"
                if prefix == wire.GUARD_FINALIZER_PREFIX
                else "lifecycle"
                if prefix == wire.LIFECYCLE_FINALIZER_PREFIX
                else "other"
            )
            item_f = FinalizerAnswer(finalizer=finalizer, role=role)
            if role != "other":
                for resource, employer in by_hash.get(digest, []):
                    item_f.employers.append(_ref(resource, namespace, employer))
                    for view in await views(resource, employer):
                        item_f.provider_consulted = item_f.provider_consulted or view.view is not None
                        backend = view.backend(name)
                        if backend is not None:
                            item_f.provider.append(backend)
            item_f.pending = _finalizer_pending(item_f, deleting=answer.deleting)
            answer.finalizers.append(item_f)
            if answer.containers_ready is False and any(b.serving for b in item_f.provider):
                answer.served_while_stopped = sorted({*answer.served_while_stopped, *item_f.employers})
        owners = {(r.kind, e) for owners_ in by_hash.values() for r, e in owners_}
        for kind, employer in sorted(owners):
            for event in self._events(kind, namespace, employer):
                failure = event.failure
                if failure is not None and name in (failure.name, failure.item):
                    answer.provider_failures.append(failure)
        answer.provider_failures = _latest_failures(answer.provider_failures)
        await self._explain_gone(namespace, pod, answer)
        return answer

    # -- employers gone while their marks hold the pod ---------------------------------------------

    async def _explain_gone(self, namespace: str, pod: KubeObject, answer: PodExplanation) -> None:
        """Fill ``answer.gone``, and say of each of their finalizers that its employer is gone."""
        for resource in self._employer_resources():
            if not resource.namespaced:
                continue
            alive = {obj["metadata"]["name"] for obj in self.reader.list(resource, namespace)}
            pods = self.reader.list(kube.POD, namespace)
            known = alive | {n for other in pods for n in marks.entry_names(other, resource.kind)}
            found = marks.holds(pod, resource.kind, known)
            if any(not hold.employer for hold in found):
                # Only a hash is left: the employer's Events may still name it (as the garbage
                # pass looks it up).
                known |= marks.event_names(self.reader.list(kube.EVENT, namespace), resource.kind)
                found = marks.holds(pod, resource.kind, known)
            for hold in found:
                if hold.employer in alive:
                    continue
                answer.gone.append(await self._gone_answer(resource, pod, hold))
        for gone in answer.gone:
            then = {
                "yes": "the controller's garbage pass releases it",
                "no": "the controller cannot collect it: release it by hand (see gone)",
            }.get(gone.collectable, "pass --adapter NAME to learn whether the controller can collect it")
            for item in answer.finalizers:
                if item.finalizer in gone.finalizers:
                    item.pending = f"its employer {gone.employer} is gone; {then}"

    async def _gone_answer(self, resource: Resource, pod: KubeObject, hold: marks.Hold) -> GoneEmployerAnswer:
        """Whether the controller of ``resource`` can collect the gone employer of ``hold``, and
        what the operator must do (resourceconsist/hooks/orphans.py decides the same way)."""
        ref = _ref(resource, hold.namespace, hold.employer or f"#{hold.digest}")
        command = marks.release_command(pod, hold)
        by_hand = f"once no load balancer routes to the pod any more, release it by hand: {command}"
        gone = GoneEmployerAnswer(
            employer=ref, finalizers=list(hold.finalizers), entry=hold.entry, release_command=command
        )
        adapters = self._adapters_for(resource)
        if not hold.employer:
            gone.collectable, gone.why, gone.action = "no", NAME_UNKNOWN, by_hand
            return gone
        if not adapters:
            gone.why = f"no --adapter NAME given for {resource.kind}: explain cannot tell"
            gone.action = (
                "run explain again with --adapter NAME; if that adapter cannot list what it holds, " + by_hand
            )
            return gone
        listing: list[tuple[ReconcileAdapter, OrphanCollectOptions]] = [
            (a, orphans) for a in adapters if (orphans := self._profile(a).orphans) is not None
        ]
        if not listing:
            gone.collectable, gone.why, gone.action = "no", CANNOT_LIST, by_hand
            return gone
        held: list[str] = []
        for adapter, orphans in listing:
            name = adapter.get_controller_name()
            ctx = self._context(adapter, None)
            try:
                if name not in self._owned:
                    self._owned[name] = list(await call_adapter(orphans.list_owned, ctx))
                owned = self._owned[name]
            except Exception as err:
                gone.collectable = "no"
                gone.why = f"listing what the provider holds failed: {name}: {err}"
                gone.action = (
                    "the controller retries and releases nothing meanwhile: fix the provider access, or "
                    + by_hand
                )
                return gone
            held += [item.id for item in owned if item.owner == hold.key]
        if not held and not any(self._profile(a).lists_everything_owned for a, _ in listing):
            gone.collectable, gone.why, gone.action = "no", NOT_COMPLETE, by_hand
            return gone
        gone.collectable = "yes"
        gone.why = (
            f"the provider still holds {', '.join(held)} for it"
            if held
            else "the provider holds nothing for it"
        )
        gone.action = (
            "the controller's garbage pass (at start-up and every 10 minutes) "
            + ("deletes that, then releases the pod" if held else "releases the pod")
            + "; is the controller running?"
        )
        return gone

    def _names(self) -> list[str]:
        return [a.get_controller_name() for a in self.adapters]

    # -- employers ----------------------------------------------------------------------------------

    def resolve_kind(self, kind: str) -> Resource:
        """The employer kind a person typed: ``Service``/``svc``, a kind an adapter employs
        (``Kind`` or its plural, any case), or ``Kind.version.group`` found by discovery."""
        wanted = kind.lower()
        if wanted in _SERVICE_NAMES:
            return kube.SERVICE
        for resource in self._employer_resources():
            if wanted in (resource.kind.lower(), resource.plural.lower()):
                return resource
        name, _, api = kind.partition(".")
        version, _, group = api.partition(".")
        if name and version:
            try:
                return self.client.resource(f"{group}/{version}" if group else version, name)
            except (LookupError, kube.ApiError):
                pass
        raise ExplainError(
            f"unknown employer kind {kind!r}: use Service, a kind an --adapter employs, "
            "or Kind.version.group (e.g. Gateway.v1.gateway.networking.k8s.io)"
        )

    async def employer(self, resource: Resource, namespace: str, name: str) -> EmployerExplanation:
        """Why the employer has not converged: what the provider lacks or holds too much, pods
        guarded wrongly, recent Warning Events."""
        answer = EmployerExplanation(kind=resource.kind, namespace=namespace, name=name)
        employer = self.reader.get(resource, namespace, name)
        events = self._events(resource.kind, namespace, name)
        answer.warnings = events[-RECENT_WARNINGS:]
        answer.failures = _latest_failures([e.failure for e in events if e.failure is not None])
        if employer is None:
            answer.exists = False
            return answer
        answer.deleting = lifecycle.is_deleting(employer)
        answer.finalizers = lifecycle.get_finalizers(employer)
        guard = lifecycle.guard_finalizer(name)
        held = lifecycle.lifecycle_finalizer(name)
        gate = lifecycle.readiness_gate(name)
        pods: dict[str, KubeObject] = {
            p["metadata"]["name"]: p for p in self.reader.pods_selected_by(employer)
        }
        for finalizer in (guard, held):
            for pod in self.reader.pods_with_finalizer(namespace, finalizer):
                pods[pod["metadata"]["name"]] = pod
        adapters = self._adapters_for(resource)
        view: _Consulted | None = None
        if adapters:
            adapter = adapters[0]
            answer.controller = adapter.get_controller_name()
            view = await self._provider_view(adapter, employer)
            answer.provider = view.view
            answer.provider_error = view.error
            answer.provider_consulted = view.view is not None
            if view.view is not None:
                await self._changes(adapter, employer, answer, view.view)
        for pod_name in sorted(pods):
            pod = pods[pod_name]
            finalizers = lifecycle.get_finalizers(pod)
            cond = lifecycle.pod_condition(pod, gate) if gate in lifecycle.readiness_gates(pod) else None
            state = PodState(
                name=pod_name,
                has_gate=gate in lifecycle.readiness_gates(pod),
                gate=_status(cond),
                has_guard=guard in finalizers,
                has_lifecycle_finalizer=held in finalizers,
                deleting=lifecycle.is_deleting(pod),
                provider=view.backend(pod_name) if view is not None else None,
            )
            answer.pods.append(state)
        if view is not None and view.view is not None:
            names = {b.employee for b in view.view.backends if b.state != "not registered"}
            answer.unguarded = sorted(
                n for n in names if n in pods and not ({guard, held} & set(lifecycle.get_finalizers(pods[n])))
            )
            # A pod whose registration is pending keeps its guard for it: not one to release.
            registering = {c.pod for c in answer.employee_changes if c.effect == "register"}
            answer.to_release = sorted(
                p.name
                for p in answer.pods
                if (p.has_guard or p.has_lifecycle_finalizer) and p.name not in names | registering
            )
            answer.converged = not (
                answer.employer_changes or answer.employee_changes or answer.unguarded or answer.to_release
            )
        return answer

    async def _changes(
        self, adapter: ReconcileAdapter, employer: KubeObject, answer: EmployerExplanation, view: ProviderView
    ) -> None:
        """The diff the controller's next pass would act on, expected vs current, both sides;
        each employee change with the pod it concerns and the provider's last refusal of it."""
        ctx = self._context(adapter, employer)
        namespace = answer.namespace
        try:
            for side, expected_fn, current_fn in (
                ("employer", adapter.get_expected_employer, adapter.get_current_employer),
                ("employee", adapter.get_expected_employee, adapter.get_current_employee),
            ):
                expected = await call_adapter(expected_fn, ctx, employer)
                current = await call_adapter(current_fn, ctx, employer)
                planned = diff(expected, current)
                by_id = {c.id: c for c in current}
                changes = [
                    ItemChange(
                        action="create", id=i.id, name=getattr(i, "name", ""), expected=_plain(i.statuses)
                    )
                    for i in planned.to_create
                ]
                changes += [
                    ItemChange(
                        action="update",
                        id=i.id,
                        name=getattr(i, "name", ""),
                        expected=_plain(i.statuses),
                        current=_plain(by_id[i.id].statuses),
                    )
                    for i in planned.to_update
                ]
                changes += [
                    ItemChange(
                        action="delete", id=i.id, name=getattr(i, "name", ""), current=_plain(i.statuses)
                    )
                    for i in planned.to_delete
                ]
                if side == "employer":
                    answer.employer_changes = changes
                else:
                    for change in changes:
                        self._describe_change(change, planned, by_id, view, namespace)
                    answer.employee_changes = changes
                for change in changes:
                    change.failure = next((f for f in reversed(answer.failures) if f.item == change.id), None)
        except Exception as err:
            answer.provider_error = f"{adapter.get_controller_name()}: {err}"

    def _describe_change(
        self,
        change: ItemChange,
        planned: Any,
        by_id: Mapping[str, Employee],
        view: ProviderView,
        namespace: str,
    ) -> None:
        """Say what an employee change does to the registration, and which pod it concerns."""
        expected = next((i for i in [*planned.to_create, *planned.to_update] if i.id == change.id), None)
        current = by_id.get(change.id)
        before = current is not None and current.registered()
        after = expected is not None and expected.registered()
        change.effect = (
            "register" if after and not before else "deregister" if before and not after else "change"
        )
        backend = next((b for b in view.backends if b.id == change.id), None)
        change.pod = (backend.employee if backend is not None else "") or change.name or None
        if change.pod and wire.MULTI_CLUSTER_SEPARATOR not in change.pod:
            change.pod_exists = self.reader.get(kube.POD, namespace, change.pod) is not None

    def _events(self, kind: str, namespace: str, name: str) -> list[EventAnswer]:
        """The Warning Events about one object, oldest first (listed once per object)."""
        key = (kind, namespace, name)
        if key in self._event_cache:
            return self._event_cache[key]
        listing = self.client.list(
            kube.EVENT,
            namespace,
            field_selector=f"involvedObject.name={name},involvedObject.kind={kind},type=Warning",
        )
        employer = f"{kind}/{namespace}/{name}"
        events = [_event_answer(e, employer) for e in listing.get("items") or []]
        events.sort(key=lambda e: e.last or "")
        self._event_cache[key] = events
        return events


def _event_answer(event: KubeObject, employer: str) -> EventAnswer:
    meta = event["metadata"]
    first = event.get("firstTimestamp") or event.get("eventTime") or meta.get("creationTimestamp")
    answer = EventAnswer(
        type=event.get("type", ""),
        reason=event.get("reason", ""),
        message=event.get("message", ""),
        count=int(event.get("count") or 1),
        first=first,
        last=event.get("lastTimestamp") or first,
    )
    raw = (meta.get("annotations") or {}).get(wire.PROVIDER_FAILURE_ANNOTATION)
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        record = None  # not ours to judge: the Event's message still says it
    if isinstance(record, dict):
        answer.failure = FailureAnswer(
            employer=employer,
            reason=answer.reason,
            operation=str(record.get("operation", "")),
            item=str(record.get("item", "")),
            name=str(record.get("name", "")),
            code=str(record.get("code", "")),
            message=str(record.get("message", "")),
            count=answer.count,
            first=answer.first,
            last=answer.last,
        )
    return answer


def _latest_failures(failures: Sequence[FailureAnswer]) -> list[FailureAnswer]:
    """The latest failure of each (employer, operation, item), oldest first."""
    latest: dict[tuple[str, str, str], FailureAnswer] = {}
    for failure in sorted(failures, key=lambda f: f.last or ""):
        latest[(failure.employer, failure.operation, failure.item)] = failure
    return list(latest.values())


def _finalizer_pending(answer: FinalizerAnswer, *, deleting: bool) -> str:
    """What must happen before this finalizer goes, in words (docs/concepts.md, "The guard")."""
    if answer.role == "other":
        return "not ours: the controller that added it removes it"
    if not answer.employers:
        return (
            "no employer of the namespace has this hash (gone?): "
            "remove it by hand once no provider routes to the pod"
        )
    if not answer.provider_consulted:
        return (
            "provider not consulted (pass --adapter NAME): "
            "the controller removes it once the provider holds no backend of the pod"
        )
    held = "; ".join(_backend_words(b) for b in answer.provider)
    if deleting:
        if answer.provider:
            return (
                f"the provider still holds {held}: the controller deregisters it, then removes the finalizer"
            )
        return (
            "the provider holds no backend of the pod: the controller removes it once a pass confirms "
            "that (is the controller running?)"
        )
    if answer.role == "lifecycle":
        if any(b.serving for b in answer.provider):
            return f"the provider serves the pod ({held}); it stays while the pod is served"
        if answer.provider:
            return f"the provider holds {held}: it stays while the provider holds the pod's backend"
        return "the provider holds no backend of the pod: the controller removes it on its next pass"
    if answer.provider:
        return (
            f"the provider holds {held}: the guard holds the pod while it is registered; the controller "
            "swaps it for the lifecycle finalizer once the provider serves the ready pod"
        )
    return (
        "the provider holds no backend of the pod yet: the guard waits for the controller to register "
        "it (a refused registration keeps it: see the provider's failures)"
    )


def _failure_words(failure: FailureAnswer) -> str:
    what = ": ".join(x for x in (failure.code, failure.message) if x) or "no reason given"
    item = failure.name or failure.item
    return (
        f"the provider of {failure.employer} refused {failure.operation} of {item}: {what} "
        f"(x{failure.count}, first {failure.first}, last {failure.last})"
    )


def _yes_no(value: bool | None) -> str:
    return "unknown" if value is None else str(value)


def _gate_pending(gate: GateAnswer, *, containers_ready: bool | None) -> str:
    """What one of the frame's gates that is not True waits for, in words."""
    if containers_ready is not True:
        return "the kubelet: the pod's containers are not ready; the provider is not asked to serve it before"
    if gate.provider is None:
        if not gate.provider_consulted:
            return "the provider (not consulted: pass --adapter NAME to see whether it holds the pod)"
        return (
            "the registration: the provider holds no backend of the pod yet; the controller registers "
            "it, and the gate opens once the provider serves it"
        )
    if gate.provider.serving:
        return "the controller's next pass: the provider serves the pod, so the gate opens"
    return (
        f"the provider to serve the pod: it holds {_backend_words(gate.provider)} but does not route "
        "to it yet (its health check, or its weight)"
    )


def _backend_words(backend: ProviderBackend) -> str:
    state = backend.state
    if backend.serving is not None and state not in ("serving", "not serving"):
        state = ", ".join(w for w in (state, "serving" if backend.serving else "not serving") if w)
    since = f" since {backend.since}" if backend.since else ""
    return f"backend {backend.id} ({state or 'held'}{since})"


# -- readable lines ------------------------------------------------------------------------------


def pod_lines(answer: PodExplanation) -> list[str]:
    """The pod's answer in a few readable lines."""
    ref = f"pod {answer.namespace}/{answer.name}"
    if not answer.exists:
        return [f"{ref}: not found"]
    since = f" since {answer.ready_since}" if answer.ready_since else ""
    reason = f" ({answer.ready_reason})" if answer.ready_reason else ""
    lines = [
        f"{ref}: Ready {_yes_no(answer.ready)}{since}{reason}; phase {answer.phase or 'unknown'}, "
        f"ContainersReady {_yes_no(answer.containers_ready)}"
    ]
    if answer.served_while_stopped:
        lines.append(
            f"  ! the provider of {', '.join(answer.served_while_stopped)} serves this pod but its "
            "containers are not ready: that traffic fails (docs/zero-downtime.md)"
        )
    for failure in answer.provider_failures:
        lines.append(f"  ! {_failure_words(failure)}")
    if answer.ready is not True:
        if answer.containers_ready is not True:
            lines.append(
                "  containers stopped (the pod is deleting)"
                if answer.deleting
                else "  containers are not ready yet (the kubelet's part)"
            )
        for gate in answer.not_ready:
            owner = gate.employer or "not a resourceconsist gate"
            line = f"  gate {gate.gate} = {gate.status}"
            if gate.reason or gate.message:
                line += f" ({': '.join(x for x in (gate.reason, gate.message) if x)})"
            if gate.since:
                line += f" since {gate.since}"
            line += f"; employer {owner}"
            if gate.employer is not None:
                if gate.provider is not None:
                    line += f"; provider: {_backend_words(gate.provider)}"
                elif gate.provider_consulted:
                    line += "; provider: holds no backend of this pod"
                else:
                    line += "; provider: not consulted (pass --adapter NAME)"
            lines.append(line)
            if gate.pending:
                lines.append(f"    waits for {gate.pending}")
    if answer.deleting:
        lines.append(
            f"  deleting (grace period ends {answer.deletion_timestamp}); "
            f"held by {len(answer.finalizers)} finalizer(s)"
        )
    elif answer.finalizers:
        lines.append("  finalizers (they hold the pod once it is deleted):")
    for f in answer.finalizers:
        owners = ", ".join(f.employers) or "unknown employer"
        who = f"{f.role} finalizer of {owners}" if f.role != "other" else "not resourceconsist's"
        lines.append(f"  {f.finalizer} [{who}]: {f.pending}")
    lines += _gone_lines(answer)
    return lines


def _gone_lines(answer: PodExplanation) -> list[str]:
    """One paragraph per employer gone while its marks hold the pod."""
    lines = []
    for gone in answer.gone:
        can = {"yes": "the controller collects it", "no": "the controller CANNOT collect it"}.get(
            gone.collectable, "whether the controller can collect it is unknown"
        )
        lines.append(f"  held by gone {gone.employer}: {can} ({gone.why})")
        lines.append(f"    to do: {gone.action}")
    return lines


def employer_lines(answer: EmployerExplanation) -> list[str]:
    """The employer's answer in a few readable lines."""
    ref = f"{answer.kind} {answer.namespace}/{answer.name}"
    if not answer.exists:
        lines = [f"{ref}: not found"]
    elif answer.converged is None:
        why = answer.provider_error or "no --adapter NAME given for this kind"
        lines = [f"{ref}: provider not consulted ({why}); Kubernetes side only"]
    else:
        state = "converged" if answer.converged else "NOT converged"
        lines = [
            f"{ref}: {state} (controller {answer.controller})" + (", deleting" if answer.deleting else "")
        ]
    if answer.provider_error and answer.converged is not None:
        lines.append(f"  provider read failed: {answer.provider_error}")
    for what, changes in (("employer", answer.employer_changes), ("employee", answer.employee_changes)):
        for c in changes:
            detail = {"create": f"want {c.expected}", "delete": f"holds {c.current}"}.get(
                c.action, f"want {c.expected}, holds {c.current}"
            )
            name = c.id
            if c.pod_exists is False:
                name = f"{c.pod} (pod not found; provider item {c.id})"
            elif c.pod and c.pod != c.id:
                name = f"{c.pod} (provider item {c.id})"
            effect = f"; {c.effect}" if c.action == "update" and c.effect != "change" else ""
            lines.append(f"  {what} {name}: to {c.action}{effect} ({detail})")
            if c.failure is not None:
                lines.append(f"    ! {_failure_words(c.failure)}")
    if answer.unguarded:
        lines.append(f"  registered without this employer's finalizer: {', '.join(answer.unguarded)}")
    if answer.to_release:
        lines.append(
            "  carry its finalizers without a backend (released once a pass confirms the provider "
            f"holds none): {', '.join(answer.to_release)}"
        )
    shown = {(c.failure.operation, c.failure.item) for c in answer.employee_changes if c.failure}
    shown |= {(c.failure.operation, c.failure.item) for c in answer.employer_changes if c.failure}
    for failure in answer.failures:
        if (failure.operation, failure.item) not in shown:
            lines.append(f"  ! {_failure_words(failure)}")
    for pod in answer.pods:
        parts = [
            f"gate {'missing' if pod.gate is None else pod.gate}" if pod.has_gate else "",
            "guard" if pod.has_guard else "",
            "lifecycle finalizer" if pod.has_lifecycle_finalizer else "",
            "deleting" if pod.deleting else "",
        ]
        backend = (
            _backend_words(pod.provider)
            if pod.provider
            else ("no backend" if answer.provider_consulted else "")
        )
        lines.append(f"  pod {pod.name}: " + ", ".join(p for p in [*parts, backend] if p))
    for e in answer.warnings:
        lines.append(f"  Warning {e.reason} x{e.count} (first {e.first}, last {e.last}): {e.message}")
    return lines


# -- the command line ------------------------------------------------------------------------------


def split_ref(ref: str) -> tuple[str, str]:
    """``NS/NAME`` as (namespace, name); a clear error for anything else."""
    namespace, sep, name = ref.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ExplainError(f"{ref!r} is not NAMESPACE/NAME: write it as e.g. default/web")
    return namespace, name


class NotFoundAnswer(ExplainError):
    """The object explained does not exist; ``text`` is the answer to print all the same (the
    command prints it and exits 1, as ``kubectl get`` does for a missing object)."""

    def __init__(self, text: str) -> None:
        super().__init__("not found")
        self.text = text


async def run_explain(
    client: KubeClient, adapters: Sequence[ReconcileAdapter], kind: str | None, ref: str, output: str
) -> str:
    """``resourceconsist explain``: the pod's (``kind`` None) or the employer's answer, as
    readable lines or JSON; ``NotFoundAnswer`` (carrying that answer) when it does not exist."""
    namespace, name = split_ref(ref)
    explainer = Explainer(client, adapters)
    answer: PodExplanation | EmployerExplanation
    if kind is None:
        answer = await explainer.pod(namespace, name)
        text = "\n".join(pod_lines(answer))
    else:
        answer = await explainer.employer(explainer.resolve_kind(kind), namespace, name)
        text = "\n".join(employer_lines(answer))
    if output == "json":
        text = answer.model_dump_json(indent=2)
    if not answer.exists:
        raise NotFoundAnswer(text)
    return text
