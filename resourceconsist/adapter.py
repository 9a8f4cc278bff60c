"""The adapter API: what a user implements to keep one provider consistent with Kubernetes.

``ReconcileAdapter`` holds the required methods, snake-case mirrors of the Go interface so a
Go adapter ports line by line. The optional capabilities are separate protocols the frame
detects on the adapter (the Go type assertions); when one is absent, the frame uses the
defaults documented in docs/reference/adapter.md. Employer and employee items are pydantic models.

``WebhookAdapter`` (with ``EmployerRef``) is what the admission webhook asks of an adapter: the
employers of a pod being created (docs/webhook.md).

Every adapter method may be a plain function or a coroutine; the frame awaits coroutines on
its event loop and runs plain (possibly blocking) functions in worker threads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeAlias, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from resourceconsist.cluster.kube import KubeObject, Resource
from resourceconsist.flow.cancellation import Cancellation
from resourceconsist.rules import lifecycle

if TYPE_CHECKING:
    from resourceconsist.cluster.cache import CacheReader, WatchEvent
    from resourceconsist.cluster.interfaces import EventSink, ObjectReader, ObjectWriter

T = TypeVar("T")
ItemT = TypeVar("ItemT")
#: A value, or an awaitable of it: adapter methods may be sync or async.
MaybeAwaitable: TypeAlias = T | Awaitable[T]


class Employer(BaseModel):
    """What the provider holds (or should hold) for an employer, e.g. a load balancer's VIP."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    id: str
    statuses: Any = None

    def equal(self, other: Employer) -> bool:
        """Whether the provider's ``other`` already matches this expected item (Go: EmployerEqual)."""
        return self.id == other.id and self.statuses == other.statuses


class Employee(BaseModel):
    """What the provider holds (or should hold) for one employee, e.g. a real server.

    ``name`` is the pod name when PodOpsLifecycle is followed (``<pod>#<cluster>`` when the
    employee lives in a member cluster)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    id: str
    name: str = ""
    statuses: Any = None

    def equal(self, other: Employee) -> bool:
        """Whether the provider's ``other`` already matches this expected item (Go: EmployeeEqual)."""
        return self.id == other.id and self.statuses == other.statuses

    def registered(self) -> bool:
        """Whether the provider holds (current item) or will hold once applied (expected item) a
        registration of this employee that may route traffic to it.

        The frame keeps the employer's guard finalizer on the pod while this is True and releases
        it only after the provider confirmed a change that made it False (docs/concepts.md, "The
        guard"). The default, True, guards every registration; override it when an item can
        stand for "nothing registered" (e.g. a current item with no backend) so a pod the
        provider does not hold can leave without waiting for the controller.
        """
        return True

    def serves(self) -> bool:
        """Whether the provider, holding (current item) or once it holds (expected item) this
        item, sends the pod traffic: registered with a weight above 0, and healthy where the
        provider reports health.

        The frame sets an employer's readiness gate on a pod True only once the provider
        confirmed an item that ``serves()`` for a lifecycle-ready pod, and False while it does
        not (docs/zero-downtime.md). The default is ``registered()``; override it when an item
        can be registered without traffic (weight 0, traffic off, an unhealthy backend), so a
        pod never turns Ready on a registration that does not serve it.
        """
        return self.registered()


class PodEmployeeStatuses(BaseModel):
    """Built-in statuses of a pod employee; ``extra_status`` is provider-specific."""

    ip: str = ""
    ipv6: str = ""
    lifecycle_ready: bool = False
    extra_status: Any = None


def pod_employee_statuses(pod: KubeObject, extra_status: Any = None) -> PodEmployeeStatuses:
    """``PodEmployeeStatuses`` of a pod (Go: GetCommonPodEmployeeStatus)."""
    status = pod.get("status") or {}
    ipv6 = next((p["ip"] for p in status.get("podIPs") or [] if ":" in p.get("ip", "")), "")
    return PodEmployeeStatuses(
        ip=status.get("podIP") or "",
        ipv6=ipv6,
        lifecycle_ready=lifecycle.is_lifecycle_ready(pod),
        extra_status=extra_status,
    )


@dataclass
class CUDResults(Generic[ItemT]):
    """What create/update/delete did in one reconcile, for status recording."""

    succ_created: list[ItemT] = field(default_factory=list)
    fail_created: list[ItemT] = field(default_factory=list)
    succ_updated: list[ItemT] = field(default_factory=list)
    fail_updated: list[ItemT] = field(default_factory=list)
    succ_deleted: list[ItemT] = field(default_factory=list)
    fail_deleted: list[ItemT] = field(default_factory=list)
    unchanged: list[ItemT] = field(default_factory=list)

    @property
    def any_failed(self) -> bool:
        return bool(self.fail_created or self.fail_updated or self.fail_deleted)

    @property
    def failed(self) -> list[ItemT]:
        """Every item a call reported failed: those created, then updated, then deleted."""
        return [*self.fail_created, *self.fail_updated, *self.fail_deleted]


#: (succeeded, failed) as returned by create/update/delete.
Outcome = tuple[list[T], list[T]]


@dataclass(frozen=True)
class ItemFailure:
    """Why the provider refused an item a create/update/delete returns as failed, in the
    provider's words (``ReconcileContext.fail_item``)."""

    message: str
    #: The provider's error code, e.g. ``ServiceUnavailable``; empty when it gives none.
    code: str = ""


@dataclass
class ReconcileContext:
    """What an adapter method gets besides the employer: who is asking, cache-backed reads, a
    writer and an Event recorder, and memory the frame keeps for the employer.

    ``memo`` lives as long as the employer: the frame keeps it between passes and drops it when
    the employer is gone (or its controller stops). ``scratch`` is new for every pass and
    emptied when the pass ends: what one pass has learnt (e.g. one read of the provider shared by
    ``get_expected_*`` and ``get_current_*``); an object kept there may hold the context without
    making the pass a reference cycle. One context is made per pass, and never two passes of one
    employer run at once, so neither needs a lock.

    ``changed`` says what the memo may be stale about (docs/concepts.md, "Work proportional to
    change"): the names of the employees (``pod``, or ``pod#cluster`` in a member cluster) whose
    watch events arrived since this employer's last completed pass, events of the frame's own
    writes included; empty when none did. ``None`` asks for a full pass: rebuild everything
    from the cache, as on the first pass, after a failed one, after the employer itself
    changed, and periodically (``ManagerOptions.full_pass_every``) so that state kept in the memo
    can never drift for long. An adapter that keeps no state ignores it.
    """

    reader: ObjectReader
    controller: str
    employer_key: str
    #: Readers of member clusters by name (multi-cluster adapters only).
    clusters: Mapping[str, ObjectReader] = field(default_factory=dict)
    #: Cancelled when the pass is abandoned (the controller stops); blocking calls check it.
    cancellation: Cancellation = field(default_factory=Cancellation)
    #: Writes to the (main) cluster's API server.
    writer: ObjectWriter | None = None
    #: Records Events, e.g. on the employer (``kubectl describe`` shows them).
    recorder: EventSink | None = None
    memo: dict[str, Any] = field(default_factory=dict)
    scratch: dict[str, Any] = field(default_factory=dict)
    changed: frozenset[str] | None = None
    #: Why the items returned as failed in this pass failed, by item id (``fail_item``).
    failures: dict[str, ItemFailure] = field(default_factory=dict)
    #: Seconds within which the adapter asked for another pass (``look_again_in``); None: none.
    look_again: float | None = None

    def look_again_in(self, seconds: float) -> None:
        """Ask for another pass of this employer within ``seconds``, even when this one converged:
        the provider is still settling something no watch event will announce (a backend's
        health check, for instance, which decides whether it ``serves()``; docs/reference/adapter.md,
        "Looking again"). The earliest ask of a pass wins."""
        if seconds < 0:
            raise ValueError("look_again_in needs a number of seconds >= 0")
        self.look_again = seconds if self.look_again is None else min(self.look_again, seconds)

    def fail_item(self, item_id: str, message: str, code: str = "") -> None:
        """Say why the provider refused the item ``item_id``, which the create/update/delete
        call then returns as failed. An item failed with a reason is a provider failure: the
        frame writes it on the pod's readiness gate, and records a Warning Event when the same
        failure outlasts its retries (docs/concepts.md, "When a failure becomes a Warning").
        An item returned as failed without one is "not done yet" (a drain, a cloud controller
        still catching up): retried, never a Warning. ``message`` must not vary between two
        tries of the same failure (leave request ids out), so that repeats fold into one Event.
        """
        self.failures[item_id] = ItemFailure(message=message, code=code)


class ReconcileAdapter(ABC):
    """The required part of an adapter (Go: ``ReconcileAdapter``)."""

    @abstractmethod
    def get_controller_name(self) -> str: ...

    @abstractmethod
    def get_expected_employer(
        self, ctx: ReconcileContext, employer: KubeObject
    ) -> MaybeAwaitable[list[Employer]]:
        """What the provider should hold for ``employer``."""

    @abstractmethod
    def get_current_employer(
        self, ctx: ReconcileContext, employer: KubeObject
    ) -> MaybeAwaitable[list[Employer]]:
        """What the provider holds now for ``employer``."""

    @abstractmethod
    def create_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employer]
    ) -> MaybeAwaitable[Outcome[Employer]]: ...

    @abstractmethod
    def update_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employer]
    ) -> MaybeAwaitable[Outcome[Employer]]: ...

    @abstractmethod
    def delete_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employer]
    ) -> MaybeAwaitable[Outcome[Employer]]: ...

    @abstractmethod
    def get_expected_employee(
        self, ctx: ReconcileContext, employer: KubeObject
    ) -> MaybeAwaitable[list[Employee]]:
        """What the provider should hold for the employer's employees."""

    @abstractmethod
    def get_current_employee(
        self, ctx: ReconcileContext, employer: KubeObject
    ) -> MaybeAwaitable[list[Employee]]:
        """What the provider holds now for the employer's employees."""

    @abstractmethod
    def create_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]
    ) -> MaybeAwaitable[Outcome[Employee]]: ...

    @abstractmethod
    def update_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employee]
    ) -> MaybeAwaitable[Outcome[Employee]]: ...

    @abstractmethod
    def delete_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employee]
    ) -> MaybeAwaitable[Outcome[Employee]]: ...


# -- optional capabilities (detected with isinstance) --------------------------------------------


@runtime_checkable
class ReconcileOptions(Protocol):
    """Concurrency and rate limiting. Default: 5 workers, 5 ms..1000 s backoff + 10 qps/100 bucket."""

    def get_max_concurrent(self) -> int: ...

    def get_rate_limiter(self) -> RateLimiter: ...


#: Maps a watch event to the keys (``namespace/name`` of employers) to enqueue.
EventHandler = Callable[["WatchEvent", "CacheReader"], list[str]]
#: Whether a watch event is of interest at all.
Predicate = Callable[["WatchEvent"], bool]


@runtime_checkable
class ReconcileWatchOptions(Protocol):
    """What employer and employee are and how their events enqueue employers.
    Default: Service employer, Pod employee, the ``kusionstack.io/control`` predicate."""

    def new_employer(self) -> Resource: ...

    def new_employee(self) -> Resource: ...

    def employer_event_handler(self) -> EventHandler: ...

    def employee_event_handler(self) -> EventHandler: ...

    def employer_predicates(self) -> Predicate: ...

    def employee_predicates(self) -> Predicate: ...


@runtime_checkable
class ReconcileLifecycleOptions(Protocol):
    """PodOpsLifecycle. Default: followed, lifecycle finalizers not recorded, selected pods =
    the pods a Service's selector selects."""

    def follow_pod_ops_lifecycle(self) -> bool: ...

    def need_record_lifecycle_finalizer_condition(self) -> bool: ...

    def get_selected_employee_names(
        self, ctx: ReconcileContext, employer: KubeObject
    ) -> MaybeAwaitable[list[str]]: ...


@runtime_checkable
class ExpectedFinalizerRecordOptions(Protocol):
    """Record on the employer which pods got its expected-finalizer entry. Default: off."""

    def need_record_expected_finalizer_condition(self) -> bool: ...


@runtime_checkable
class StatusRecordOptions(Protocol):
    """Record statuses after a successful reconcile, error conditions after a failed one."""

    def record_statuses(
        self,
        ctx: ReconcileContext,
        employer: KubeObject,
        employer_results: CUDResults[Employer],
        employee_results: CUDResults[Employee],
    ) -> MaybeAwaitable[None]: ...

    def record_error_conditions(
        self, ctx: ReconcileContext, employer: KubeObject, err: BaseException
    ) -> MaybeAwaitable[None]: ...


@runtime_checkable
class ReconcileRequeueOptions(Protocol):
    """Requeue interval (seconds) when some create/update/delete failed without an error."""

    def employee_sync_requeue_interval(self) -> float: ...


@runtime_checkable
class EmployerRequeueOptions(Protocol):
    """Beyond Go: the requeue interval for one employer (e.g. a per-Service backoff while a cloud
    controller catches up). Preferred over ``ReconcileRequeueOptions`` when both are present."""

    def employer_requeue_interval(self, ctx: ReconcileContext, employer: KubeObject) -> float: ...


class ProviderBackend(BaseModel):
    """What the provider holds for one employee, in the provider's words (``resourceconsist
    explain``, docs/explain.md)."""

    #: The employee's name (the pod's, ``<pod>#<cluster>`` in a member cluster).
    employee: str
    id: str
    #: Whether the provider routes traffic to it now; None when the provider cannot tell.
    serving: bool | None = None
    #: The provider's own word for its state, e.g. ``serving``, ``registering``, ``weight 0``.
    state: str = ""
    #: When it entered that state (ISO 8601, UTC), if the provider knows.
    since: str | None = None
    #: Provider-specific facts a person may want (weight, health, address, ...).
    details: dict[str, Any] = Field(default_factory=dict)


class ProviderView(BaseModel):
    """What the provider holds for one employer: its own resource and the employees' backends."""

    employer: dict[str, Any] = Field(default_factory=dict)
    backends: list[ProviderBackend] = Field(default_factory=list)


@runtime_checkable
class ProviderDescribeOptions(Protocol):
    """Describe what the provider holds for an employer, for ``resourceconsist explain``.
    Default: explain reads ``get_current_employer``/``get_current_employee`` and cannot say
    whether a registered backend serves. It must not change the provider."""

    def describe_provider(
        self, ctx: ReconcileContext, employer: KubeObject
    ) -> MaybeAwaitable[ProviderView]: ...


class RateLimiter(Protocol):
    """How long to wait before retrying ``item`` (client-go's ``RateLimiter``); the workqueue's
    (``resourceconsist.runtime.workqueue``) implement it."""

    def when(self, item: str) -> float: ...

    def forget(self, item: str) -> None: ...

    def num_requeues(self, item: str) -> int: ...


@runtime_checkable
class MultiClusterOptions(Protocol):
    """Employer in the main (federation) cluster; employees there (True) or in member clusters."""

    def employee_fed(self) -> bool: ...


@runtime_checkable
class CachedPodFieldsOptions(Protocol):
    """The fields of a pod the adapter reads from the cache beyond the frame's own.

    The pod cache keeps only what the frame reads (``metadata`` but managedFields,
    ``spec.readinessGates``, ``status.conditions``, ``status.phase``, ``status.podIP``,
    ``status.podIPs``: ``resourceconsist.cluster.transform.FRAME_POD_FIELDS``) and the dotted paths
    returned here, e.g. ``["spec.nodeName", "spec.containers.ports"]`` (a path through a list
    keeps the rest of the path in each element). Default: none (docs/tutorial.md, "Fields the
    cache keeps")."""

    def get_cached_pod_fields(self) -> Iterable[str]: ...


# -- beyond Go: orphans, sub-resources (docs/lifecycle-hooks.md) -----------------------------------


@dataclass(frozen=True)
class OwnedItem:
    """Something the provider holds for this controller, and the employer it was made for.

    ``owner`` is the employer's key (``namespace/name``). When that employer no longer exists,
    the frame collects the item with a pass over a *stand-in* of the gone employer: an object
    of the employer's kind with this namespace and name, ``labels`` and ``annotations``, and a
    deletionTimestamp, so the adapter's own ``get_current_*`` finds the item and its own
    ``delete_*`` methods remove it (docs/lifecycle-hooks.md, "Orphans")."""

    owner: str
    #: The provider's name for it, for reports.
    id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class OrphanCollectOptions(Protocol):
    """List what the provider holds for this controller, each item naming its owner employer;
    the frame collects those whose owner is gone. Default: nothing is ever collected.

    ``ctx`` is a context with no employer (``employer_key`` is empty). List only what this
    adapter made (its naming convention, its tag): the frame deletes what is listed. Raise when
    the listing fails: unknown releases nothing (docs/lifecycle-hooks.md, "Gone employers")."""

    def list_owned(self, ctx: ReconcileContext) -> MaybeAwaitable[list[OwnedItem]]: ...


@runtime_checkable
class CompleteListingOptions(Protocol):
    """Whether ``OrphanCollectOptions.list_owned`` names **everything** the provider may route
    for any employer of this adapter (account-wide, not only what live employers point at).

    True: a gone employer whose pods still carry its marks and that the list does not name holds
    nothing at the provider, so its pods are released once a pass over a bare stand-in of it
    (no labels, no annotations) confirms that too. Default (absent, or False): the list may be
    partial, and such pods wait for a person, who is told (docs/lifecycle-hooks.md, "Gone
    employers")."""

    def lists_everything_owned(self) -> bool: ...


@runtime_checkable
class SubResourceOptions(Protocol):
    """Kubernetes objects an employer should own, created and kept up to date by the frame.

    ``sub_resources`` returns the desired objects (``apiVersion``, ``kind``, ``metadata.name``,
    the rest of the body); a namespaced one lives in the employer's namespace and gets an owner
    reference to it, a cluster-scoped one gets owner labels and is collected once its owner is
    gone. ``sub_resource_kinds`` names the cluster-scoped kinds (``(apiVersion, kind)``) the
    stray collector looks through. Default: none."""

    def sub_resources(
        self, ctx: ReconcileContext, employer: KubeObject
    ) -> MaybeAwaitable[list[KubeObject]]: ...

    def sub_resource_kinds(self) -> list[tuple[str, str]]: ...


# -- the webhook adapter API (served by resourceconsist.webhook; docs/webhook.md) -----------------


@dataclass(frozen=True, order=True)
class EmployerRef:
    """One employer of a pod: enough to build its entry in ``expectedFinalizers``, and what the
    employer asks of the pod's spec: its readiness gate, a drain of its drain time on termination,
    ended by a ``preStop`` sleep (``drain_mode`` ``sleep``) or by the drain waiter (``wait``)
    (docs/zero-downtime.md). Two refs are equal when they name the same employer."""

    kind: str
    namespace: str
    name: str
    readiness_gate: bool = field(default=False, compare=False)
    drain_seconds: int | None = field(default=None, compare=False)
    drain_mode: str = field(default="sleep", compare=False)

    @classmethod
    def of(cls, obj: Mapping[str, Any], kind: str | None = None) -> EmployerRef:
        """From a Kubernetes object; ``kind`` overrides ``obj["kind"]``, which LIST items and
        some caches leave out."""
        found = kind or obj.get("kind")
        if not found:
            raise ValueError("the employer object has no kind; pass kind=")
        meta = obj.get("metadata", {})
        return cls(str(found), str(meta.get("namespace") or ""), str(meta["name"]))

    @property
    def expected_finalizer_key(self) -> str:
        """``<Kind>/<namespace>/<name>``, the key of this employer's entry."""
        return lifecycle.expected_finalizer_key(self.kind, self.namespace, self.name)

    @property
    def lifecycle_finalizer(self) -> str:
        """The lifecycle finalizer this employer puts on its pods (the entry's value)."""
        return lifecycle.lifecycle_finalizer(self.name)

    @property
    def gate(self) -> str:
        """The readiness-gate condition type of this employer."""
        return lifecycle.readiness_gate(self.name)


EmployersResult = Iterable[EmployerRef] | Awaitable[Iterable[EmployerRef]]


@runtime_checkable
class WebhookAdapter(Protocol):
    """What the admission webhook (``resourceconsist.webhook``) asks of an adapter that follows
    PodOpsLifecycle: the employers of a pod that is being created.

    ``get_employers_by_employee`` may be a plain function or a coroutine function. Plain ones
    run in a worker thread, so they may block (e.g. on a provider API); coroutines run on the
    event loop and must not. Either way the call is bounded by the server's adapter timeout.
    ``employee`` is the pod being created, with ``metadata.namespace`` filled from the
    request (a pod created without one in its body has none yet); its name may be empty when
    the pod uses ``generateName``. ``reader`` serves lookups from the informer caches.
    """

    @property
    def name(self) -> str: ...

    def get_employers_by_employee(self, employee: KubeObject, reader: CacheReader) -> EmployersResult: ...


@runtime_checkable
class WebhookCacheOptions(Protocol):
    """Optional: the resources whose informer caches the adapter reads.

    The server starts these informers before it reports ready, so the first admission does not
    wait for a cache to fill. Without this capability the server assumes Services.
    """

    def get_cached_resources(self) -> Sequence[Resource]: ...
