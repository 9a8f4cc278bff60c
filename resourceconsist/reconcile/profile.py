"""An adapter's profile: what the frame reads of an adapter, resolved once when the adapter is
added (docs/reference/adapter.md, "Optional capabilities and their defaults").

An adapter says what it can do by implementing optional protocols (``resourceconsist.adapter``);
checking one is a runtime-checkable ``isinstance``, which walks every member of the protocol
(about 11 µs on Python 3.11). This module is the only place that asks: ``AdapterProfile.of``
checks each protocol once and keeps the adapter's answer as a typed view, or the default when
it has none. The controller, the pass, the garbage pass, the sub-resources step, explain,
handover and the webhook server read the profile, so none of them imports the controller to
learn what an adapter watches. An adapter's optional methods are looked up when it is added:
one that gains a method later is not seen (add it again).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from resourceconsist.adapter import (
    CachedPodFieldsOptions,
    CompleteListingOptions,
    EmployerRequeueOptions,
    EventHandler,
    ExpectedFinalizerRecordOptions,
    MultiClusterOptions,
    OrphanCollectOptions,
    Predicate,
    ProviderDescribeOptions,
    RateLimiter,
    ReconcileAdapter,
    ReconcileContext,
    ReconcileLifecycleOptions,
    ReconcileOptions,
    ReconcileRequeueOptions,
    ReconcileWatchOptions,
    StatusRecordOptions,
    SubResourceOptions,
    WebhookAdapter,
    WebhookCacheOptions,
)
from resourceconsist.cluster import kube
from resourceconsist.cluster.interfaces import ObjectReader
from resourceconsist.cluster.kube import KubeObject, Resource
from resourceconsist.flow.cancellation import call_adapter
from resourceconsist.watch import handler

#: Workers of a controller whose adapter does not say (``ReconcileOptions``), as in the Go frame.
DEFAULT_MAX_CONCURRENT = 5


@dataclass(frozen=True)
class WatchSpec:
    """The watch options in force for one adapter (its own, or the defaults: Services employ
    the pods they select, filtered by the ``kusionstack.io/control`` label)."""

    employer: Resource
    employee: Resource
    employer_handler: EventHandler
    employee_handler: EventHandler
    employer_predicate: Predicate
    employee_predicate: Predicate


#: The Go frame's defaults (resourceconsist/watch/handler.py).
DEFAULT_WATCH = WatchSpec(
    kube.SERVICE,
    kube.POD,
    handler.enqueue_self,
    handler.enqueue_services_by_pod,
    handler.control_predicate,
    handler.accept_all,
)


def _watch_spec(adapter: ReconcileAdapter) -> WatchSpec:
    if not isinstance(adapter, ReconcileWatchOptions):
        return DEFAULT_WATCH
    return WatchSpec(
        adapter.new_employer(),
        adapter.new_employee(),
        adapter.employer_event_handler(),
        adapter.employee_event_handler(),
        adapter.employer_predicates(),
        adapter.employee_predicates(),
    )


def declared_pod_fields(adapter: object) -> tuple[str, ...]:
    """The pod fields a controller's or a webhook's adapter declared (``CachedPodFieldsOptions``);
    none when it did not."""
    return tuple(adapter.get_cached_pod_fields()) if isinstance(adapter, CachedPodFieldsOptions) else ()


def _requeue_interval(adapter: ReconcileAdapter) -> Callable[[ReconcileContext, KubeObject], float] | None:
    """Who says when an employer whose items failed without an error is looked at again: a
    per-employer interval first (``EmployerRequeueOptions``), else the adapter-wide one."""
    if isinstance(adapter, EmployerRequeueOptions):
        return adapter.employer_requeue_interval
    if isinstance(adapter, ReconcileRequeueOptions):
        interval = adapter
        return lambda ctx, employer: interval.employee_sync_requeue_interval()
    return None


@dataclass(frozen=True, eq=False)
class AdapterProfile:
    """One adapter as the frame reads it: its name, its watch options, its settings, and each
    optional protocol it implements (None: it does not, the default applies)."""

    adapter: ReconcileAdapter
    #: ``get_controller_name()``.
    name: str
    watch: WatchSpec
    #: Workers of its controller (``ReconcileOptions``; ``DEFAULT_MAX_CONCURRENT``).
    max_concurrent: int
    #: Its own rate limiter (``ReconcileOptions``); None: the controller's default.
    rate_limiter: RateLimiter | None
    #: The pod fields it reads beyond the frame's own (``CachedPodFieldsOptions``).
    pod_fields: tuple[str, ...]
    lifecycle: ReconcileLifecycleOptions | None
    multi_cluster: MultiClusterOptions | None
    expected_finalizer_record: ExpectedFinalizerRecordOptions | None
    status_record: StatusRecordOptions | None
    #: Seconds until an employer whose items failed without an error is looked at again; None:
    #: a rate-limited retry (docs/concepts.md, "One reconcile", step 8).
    requeue_interval: Callable[[ReconcileContext, KubeObject], float] | None
    describe: ProviderDescribeOptions | None
    orphans: OrphanCollectOptions | None
    #: ``list_owned`` names everything the provider may route for this adapter (asked once).
    lists_everything_owned: bool
    sub_resources: SubResourceOptions | None

    @classmethod
    def of(cls, adapter: ReconcileAdapter) -> AdapterProfile:
        """Read ``adapter`` once."""
        max_concurrent: int = DEFAULT_MAX_CONCURRENT
        rate_limiter: RateLimiter | None = None
        if isinstance(adapter, ReconcileOptions):
            max_concurrent, rate_limiter = adapter.get_max_concurrent(), adapter.get_rate_limiter()
        complete = adapter if isinstance(adapter, CompleteListingOptions) else None
        return cls(
            adapter=adapter,
            name=adapter.get_controller_name(),
            watch=_watch_spec(adapter),
            max_concurrent=max(1, max_concurrent),
            rate_limiter=rate_limiter,
            pod_fields=declared_pod_fields(adapter),
            lifecycle=adapter if isinstance(adapter, ReconcileLifecycleOptions) else None,
            multi_cluster=adapter if isinstance(adapter, MultiClusterOptions) else None,
            expected_finalizer_record=adapter
            if isinstance(adapter, ExpectedFinalizerRecordOptions)
            else None,
            status_record=adapter if isinstance(adapter, StatusRecordOptions) else None,
            requeue_interval=_requeue_interval(adapter),
            describe=adapter if isinstance(adapter, ProviderDescribeOptions) else None,
            orphans=adapter if isinstance(adapter, OrphanCollectOptions) else None,
            lists_everything_owned=complete is not None and bool(complete.lists_everything_owned()),
            sub_resources=adapter if isinstance(adapter, SubResourceOptions) else None,
        )

    @property
    def employer(self) -> Resource:
        return self.watch.employer

    @property
    def employee(self) -> Resource:
        return self.watch.employee

    @property
    def follows_lifecycle(self) -> bool:
        """The employers' pods carry their marks: entries, guard and lifecycle finalizers."""
        if self.watch.employee != kube.POD:
            return False
        return True if self.lifecycle is None else self.lifecycle.follow_pod_ops_lifecycle()

    def employees_in_members(self) -> bool:
        """Pod employees live in member clusters (named ``pod#cluster``); asked each time, as
        the adapter answers while it runs."""
        return self.multi_cluster is not None and not self.multi_cluster.employee_fed()

    @property
    def records_lifecycle_finalizers(self) -> bool:
        return self.lifecycle is not None and self.lifecycle.need_record_lifecycle_finalizer_condition()

    @property
    def records_expected_finalizers(self) -> bool:
        record = self.expected_finalizer_record
        return record is not None and record.need_record_expected_finalizer_condition()

    async def selected_names(
        self, ctx: ReconcileContext, employer: KubeObject, reader: ObjectReader
    ) -> list[str]:
        """The employees the employer selects: the adapter's answer, else a Service's pods."""
        if self.lifecycle is not None:
            return list(await call_adapter(self.lifecycle.get_selected_employee_names, ctx, employer))
        if self.watch.employer == kube.SERVICE:
            return [pod["metadata"]["name"] for pod in reader.pods_selected_by(employer)]
        return []


@dataclass(frozen=True, eq=False)
class WebhookProfile:
    """A webhook adapter as the webhook server reads it, resolved once when it is added."""

    adapter: WebhookAdapter
    #: The pod fields it reads beyond the frame's own (``CachedPodFieldsOptions``).
    pod_fields: tuple[str, ...]
    #: The resources whose caches it reads (``WebhookCacheOptions``; Services when it does not say).
    cached_resources: tuple[Resource, ...]

    @classmethod
    def of(cls, adapter: WebhookAdapter) -> WebhookProfile:
        cached = (
            tuple(adapter.get_cached_resources())
            if isinstance(adapter, WebhookCacheOptions)
            else (kube.SERVICE,)
        )
        return cls(adapter=adapter, pod_fields=declared_pod_fields(adapter), cached_resources=cached)
