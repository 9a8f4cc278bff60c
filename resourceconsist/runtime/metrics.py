"""Prometheus metrics of the frame, and the health/metrics HTTP endpoint of a manager.

Each ``Metrics`` has its own registry, so several managers in one process (tests, embedding)
never collide. Served at ``/metrics``; ``/healthz`` answers while the process runs and
``/readyz`` once every controller's caches have synced.

Beside the project's ``resourceconsist_*`` series it exports controller-runtime's standard ones
(reconcile, workqueue, REST client, webhook, leader election, certificate watcher) and the process
and garbage-collector collectors, named, typed and labelled as controller-runtime's, and the
build's version and revision (``resourceconsist_build_info``; docs/observability.md). As the Go
client, it exposes no ``*_created`` series: the exposition leaves them out of this registry's
scrape, without touching prometheus_client's process-wide switch (other registries of an
embedding program keep theirs).

Adapters report their provider calls with ``observe_provider_call``, ``observe_provider_retry``
and ``observe_provider_failure``: the controller binds its ``Metrics`` to every pass it runs
(a context variable, so worker threads see it too), and the frame never imports an adapter.
What each series means for an operator: docs/concepts.md, "What an operator sees under faults".
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from resourceconsist import wire
from resourceconsist.flow import budget
from resourceconsist.runtime.version import build_info

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from resourceconsist.cluster.cache import InformerFactory
    from resourceconsist.cluster.kube import KubeClient
    from resourceconsist.runtime.endpoints import Route

#: ``code`` label of a provider call that succeeded.
OK_CODE = "ok"


class Metrics:
    """Counters and histograms of reconciles, queue depth and provider calls."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        #: controller-runtime's series and the process collectors (docs/observability.md).
        self.standard = StandardSeries(self.registry)
        self._unobserve: dict[str, Callable[[], None]] = {}
        self.reconciles = Counter(
            "resourceconsist_reconcile_total",
            "Reconciles by controller and outcome (success, error, requeue_after, cancelled).",
            ["controller", "outcome"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "resourceconsist_reconcile_seconds",
            "Duration of one reconcile.",
            ["controller"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "resourceconsist_workqueue_depth",
            "Keys waiting in a controller's queue.",
            ["controller"],
            registry=self.registry,
        )
        provider_labels = ["controller", "provider", "operation", "code"]
        self.provider_calls = Counter(
            "resourceconsist_provider_calls_total",
            "Provider API requests (every attempt, retries included) by operation and answer code "
            f"({OK_CODE!r} when it succeeded).",
            provider_labels,
            registry=self.registry,
        )
        self.provider_errors = Counter(
            "resourceconsist_provider_errors_total",
            "Provider API requests that failed, by operation and error code (retried or not).",
            provider_labels,
            registry=self.registry,
        )
        self.provider_retries = Counter(
            "resourceconsist_provider_retries_total",
            "Retries of provider calls, by operation and the error code that caused them.",
            provider_labels,
            registry=self.registry,
        )
        self.provider_failures = Counter(
            "resourceconsist_provider_failures_total",
            "Provider calls that failed for good (not retryable, retries exhausted, or cancelled).",
            provider_labels,
            registry=self.registry,
        )
        self.provider_seconds = Histogram(
            "resourceconsist_provider_request_seconds",
            "Duration of one provider API request.",
            ["controller", "provider", "operation"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "resourceconsist_leader",
            "1 while this replica runs the controllers (holds the Lease, or no leader election), else 0.",
            registry=self.registry,
        )
        #: Set by the reconcile of each controller, never by the frame's plan (docs/concepts.md).
        self.unguarded_routing_pods = Gauge(
            "resourceconsist_unguarded_routing_pods",
            "Pods the provider may route to without their guard, computed from the provider's "
            "current view and the cache; should read 0.",
            ["controller"],
            registry=self.registry,
        )
        #: Failures left to a retry without a Warning Event (docs/concepts.md, "When a failure
        #: becomes a Warning"): a 409 Conflict, or an item the provider refused.
        self.retried_failures = Counter(
            "resourceconsist_retried_failures_total",
            "Failures of a pass left to the next pass without a Warning Event (a conflict, an item "
            "the provider refused), by the Event reason they would carry; a Warning follows only "
            "when the same failure outlasts its retries.",
            ["controller", "reason"],
            registry=self.registry,
        )
        #: One per orphaned provider item or stray sub-resource deleted (docs/lifecycle-hooks.md).
        self.orphans_collected = Counter(
            "resourceconsist_orphans_collected_total",
            "Provider items and cluster-scoped sub-resources deleted because their owner employer "
            "no longer exists.",
            ["controller"],
            registry=self.registry,
        )
        #: Set by each garbage pass (docs/lifecycle-hooks.md, "Gone employers").
        self.pods_held_by_gone_employers = Gauge(
            "resourceconsist_pods_held_by_gone_employers",
            "Pods still carrying the entry, guard or lifecycle finalizer of an employer that no "
            "longer exists, as the controller's last garbage pass found them; should read 0.",
            ["controller"],
            registry=self.registry,
        )
        #: Lifecycle notifications dropped because a controller's subscriber queue was full.
        self.subscriber_drops = Counter(
            "resourceconsist_subscriber_dropped_total",
            "Lifecycle notifications dropped because the subscribers fell behind (queue full).",
            ["controller"],
            registry=self.registry,
        )
        #: Sharding (docs/scaling.md): what this replica's shard and, while it runs it, the sharder did.
        self.shard_drains = Counter(
            "resourceconsist_shard_drains_total",
            "Employers this shard let go of when the sharder asked (the drain handshake).",
            registry=self.registry,
        )
        self.sharder_moves = Counter(
            "resourceconsist_sharder_moves_total",
            "Label writes of the sharder run by this replica: an employer assigned to a shard, or "
            "asked to leave its shard (drain).",
            ["move"],
            registry=self.registry,
        )
        self.sharder_shards = Gauge(
            "resourceconsist_sharder_shards",
            "The ring's shards by state (ready, expired, uncertain, dead), as the sharder run by this "
            "replica last saw them.",
            ["state"],
            registry=self.registry,
        )
        self._kube = _KubeCollector()
        self.registry.register(self._kube)
        # The process's provider budgets, read when scraped (docs/observability.md).
        self.registry.register(_BudgetCollector())
        info = build_info()
        #: 1, labelled with what runs (the Go client's ``go_build_info``, kube's ``*_build_info``).
        self.build_info = Gauge(
            "resourceconsist_build_info",
            "A metric with a constant '1' value labeled by the version, the git revision and the "
            "Python version resourceconsist runs with.",
            ["version", "revision", "python_version"],
            registry=self.registry,
        )
        self.build_info.labels(info.version, info.revision, info.python_version).set(1)

    def observe_reconcile(self, controller: str, outcome: str, seconds: float) -> None:
        self.reconciles.labels(controller, outcome).inc()
        self.reconcile_seconds.labels(controller).observe(seconds)

    def watch_cluster(self, client: KubeClient, informers: InformerFactory, cluster: str = "") -> None:
        """Export ``client``'s 409 conflicts and ``informers``' re-lists (read at scrape time),
        and every request ``client`` sends (``rest_client_*``)."""
        self._kube.sources.append((cluster, client, informers))
        self._unobserve[cluster] = client.observe_requests(self.standard.kube_client(client.host).observe)

    def unwatch_cluster(self, cluster: str) -> None:
        self._kube.sources = [source for source in self._kube.sources if source[0] != cluster]
        unobserve = self._unobserve.pop(cluster, None)
        if unobserve is not None:
            unobserve()

    @contextmanager
    def bound(self, controller: str) -> Iterator[None]:
        """Provider calls made inside (threads started inside included) count for ``controller``."""
        token = _BOUND.set((self, controller))
        try:
            yield
        finally:
            _BOUND.reset(token)

    def exposition(self) -> bytes:
        return generate_latest(_WithoutCreated(self.registry))


#: The metric types prometheus_client gives a ``<name>_created`` sample (its creation time).
_TYPES_WITH_CREATED = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


class _WithoutCreated(Collector):
    """A registry's metrics without their ``*_created`` samples, which the Go client never
    exposes: a dashboard or alert written for controller-runtime has no use for them, and they
    were a quarter of a scrape's lines."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        for metric in self.registry.collect():
            if metric.type in _TYPES_WITH_CREATED:
                created = metric.name + "_created"
                # Each collect builds its metrics afresh: filtering them changes no state.
                metric.samples = [sample for sample in metric.samples if sample.name != created]
            yield metric


class _KubeCollector(Collector):
    """409 conflicts, informer re-lists and the longest a guard has held a pod's deletion, read
    from the clients and caches when scraped."""

    def __init__(self) -> None:
        self.sources: list[tuple[str, KubeClient, InformerFactory]] = []

    def collect(self) -> Iterable[Metric]:
        conflicts = CounterMetricFamily(
            "resourceconsist_kube_conflicts",
            "409 Conflicts met by optimistic-concurrency writes (each one re-reads and retries).",
            labels=["cluster", "resource"],
        )
        relists = CounterMetricFamily(
            "resourceconsist_informer_relists",
            "Full re-lists by the informer caches after the first list (a broken watch, 410 Gone).",
            labels=["cluster", "resource"],
        )
        expired = CounterMetricFamily(
            "resourceconsist_informer_watch_expired",
            "Watches that ended in 410 Gone (resumed from a version too old: the cache fell behind "
            "or was away too long), each followed by a full re-list.",
            labels=["cluster", "resource"],
        )
        held = GaugeMetricFamily(
            "resourceconsist_guard_held_deletion_seconds",
            "Seconds the oldest pod still carrying a guard finalizer has waited past its deletion "
            "time (its grace period over), among the pods the caches hold; 0: none waits.",
            labels=["cluster"],
        )
        now = time.time()
        for cluster, client, informers in self.sources:
            for resource, count in sorted(client.conflicts.items()):
                conflicts.add_metric([cluster, resource], count)
            for informer in informers.informers():
                relists.add_metric([cluster, informer.resource.plural], max(0, informer.relists - 1))
                expired.add_metric([cluster, informer.resource.plural], informer.expired)
            pods = [
                i for i in informers.informers() if i.resource.group == "" and i.resource.plural == "pods"
            ]
            if pods:
                held.add_metric(
                    [cluster], max((_held_past_deletion(p, now) for p in pods[0].store.list()), default=0)
                )
        yield conflicts
        yield relists
        yield expired
        yield held


_GUARD = wire.GUARD_FINALIZER_PREFIX + "/"


def _held_past_deletion(pod: Mapping[str, Any], now: float) -> float:
    """Seconds ``pod`` has waited past its deletion time on a guard finalizer; 0 when it does not.
    (The deletion time is the delete request's plus the grace period: a drain within the grace
    period is not a wait.)"""
    meta = pod.get("metadata") or {}
    deleting = meta.get("deletionTimestamp")
    if not deleting or not any(str(f).startswith(_GUARD) for f in meta.get("finalizers") or ()):
        return 0.0
    return max(0.0, now - datetime.fromisoformat(str(deleting)).timestamp())


class _BudgetCollector(Collector):
    """What the process's provider budgets did (resourceconsist/flow/budget.py), by account and priority."""

    def collect(self) -> Iterable[Metric]:
        labels = ["account", "priority"]
        granted = CounterMetricFamily(
            "resourceconsist_provider_budget_granted",
            "Provider requests the API budget let through, by account and priority.",
            labels=labels,
        )
        waits = CounterMetricFamily(
            "resourceconsist_provider_budget_waits",
            "Provider requests that waited for the API budget (its rate, or a throttle's pause).",
            labels=labels,
        )
        wait_seconds = CounterMetricFamily(
            "resourceconsist_provider_budget_wait_seconds",
            "Seconds provider requests spent waiting for the API budget, summed.",
            labels=labels,
        )
        throttles = CounterMetricFamily(
            "resourceconsist_provider_budget_throttles",
            "Throttling answers of the provider (each pauses the account when a rate is set).",
            labels=labels,
        )
        queued = GaugeMetricFamily(
            "resourceconsist_provider_budget_queued",
            "Provider requests waiting for the API budget now; removals are served first.",
            labels=labels,
        )
        rate = GaugeMetricFamily(
            "resourceconsist_provider_budget_rate",
            "Provider requests a second the API budget spends now: the configured rate, slowed "
            "down after throttling answers; absent without a rate.",
            labels=["account"],
        )
        for spent in budget.budgets():
            stats = spent.snapshot()
            if stats.rate is not None:
                rate.add_metric([spent.account], stats.rate)
            for priority in budget.Priority:
                key = [spent.account, priority.label]
                granted.add_metric(key, stats.granted[priority])
                waits.add_metric(key, stats.waits[priority])
                wait_seconds.add_metric(key, stats.wait_seconds[priority])
                throttles.add_metric(key, stats.throttles[priority])
                queued.add_metric(key, stats.queued[priority])
        yield from (granted, waits, wait_seconds, throttles, queued, rate)


_BOUND: contextvars.ContextVar[tuple[Metrics, str] | None] = contextvars.ContextVar(
    "resourceconsist_metrics", default=None
)


def observe_provider_call(provider: str, operation: str, code: str | None, seconds: float) -> None:
    """One provider API request ended: ``code`` is the error code, ``None`` when it succeeded."""
    bound = _BOUND.get()
    if bound is None:
        return
    metrics, controller = bound
    metrics.provider_calls.labels(controller, provider, operation, code or OK_CODE).inc()
    metrics.provider_seconds.labels(controller, provider, operation).observe(seconds)
    if code is not None:
        metrics.provider_errors.labels(controller, provider, operation, code).inc()


def observe_provider_retry(provider: str, operation: str, code: str) -> None:
    """A provider call is retried after an error with ``code``."""
    bound = _BOUND.get()
    if bound is not None:
        bound[0].provider_retries.labels(bound[1], provider, operation, code).inc()


def observe_provider_failure(provider: str, operation: str, code: str) -> None:
    """A provider call failed for good with ``code`` (no retry left, or not retryable)."""
    bound = _BOUND.get()
    if bound is not None:
        bound[0].provider_failures.labels(bound[1], provider, operation, code).inc()


def probe_routes(
    metrics: Metrics, not_ready: Callable[[], list[str]], *, probes: bool = True, exposition: bool = True
) -> dict[str, Route]:
    """``/healthz`` and ``/readyz`` (``probes``) and ``/metrics`` (``exposition``) of a manager,
    for its endpoint server (resourceconsist/runtime/endpoints.py): on one port, or each on its
    own (``ManagerOptions``, docs/observability.md). ``/readyz`` answers 503 with
    ``not_ready()``'s reasons, one a line, while there are any."""
    from resourceconsist.runtime.endpoints import Reply

    async def healthz(_: Mapping[str, str]) -> Reply:
        return Reply.text("ok")

    async def readyz(_: Mapping[str, str]) -> Reply:
        reasons = not_ready()
        return Reply.text("\n".join(reasons), 503) if reasons else Reply.text("ok")

    async def serve_metrics(_: Mapping[str, str]) -> Reply:
        return Reply(200, metrics.exposition(), CONTENT_TYPE_LATEST)

    routes: dict[str, Route] = {}
    if probes:
        routes |= {"/healthz": healthz, "/readyz": readyz}
    if exposition:
        routes["/metrics"] = serve_metrics
    return routes


# -- controller-runtime's standard series -------------------------------------------------------
# The names, types, labels and buckets every dashboard and alert written for controller-runtime
# operators expects, beside the project's own ``resourceconsist_*`` series (docs/observability.md).
# Label children are made once per controller, queue, API host and webhook path: a reconcile,
# a queue add or an API request looks no label up.

#: ``controller_runtime_reconcile_time_seconds``' buckets (controller-runtime's).
RECONCILE_BUCKETS = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9),
    *(1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0),
    *(15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0),
)
#: Ten-fold buckets from 10 ns to 1000 s: the workqueue's and the webhook's latency histograms.
TENFOLD_BUCKETS = (1e-08, 1e-07, 1e-06, 1e-05, 1e-04, 1e-03, 1e-02, 0.1, 1.0, 10.0, 100.0, 1000.0)
#: ``rest_client_request_duration_seconds``' buckets (client-go's).
REST_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)

#: controller-runtime's ``result`` label of ``controller_runtime_reconcile_total``, by the
#: outcome of ``resourceconsist_reconcile_total``: an abandoned pass is queued again.
RESULT_OF_OUTCOME = {
    "success": "success",
    "error": "error",
    "requeue_after": "requeue_after",
    "cancelled": "requeue",
}
#: The ``code`` of a Kubernetes API request that got no HTTP answer (client-go's).
NO_ANSWER_CODE = "<error>"


class StandardSeries:
    """controller-runtime's reconcile, workqueue, REST client and webhook series, and the
    process and garbage-collector collectors, in one ``Metrics``' registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        controller = ["controller"]
        queue = ["name", "controller"]
        self.reconcile_total = Counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            ["controller", "result"],
            registry=registry,
        )
        self.reconcile_errors = Counter(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller",
            controller,
            registry=registry,
        )
        self.reconcile_time = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            controller,
            buckets=RECONCILE_BUCKETS,
            registry=registry,
        )
        self.terminal_errors = Counter(
            "controller_runtime_terminal_reconcile_errors_total",
            "Total number of terminal reconciliation errors per controller",
            controller,
            registry=registry,
        )
        self.reconcile_panics = Counter(
            "controller_runtime_reconcile_panics_total",
            "Total number of reconciliation panics per controller",
            controller,
            registry=registry,
        )
        self.reconcile_timeouts = Counter(
            "controller_runtime_reconcile_timeouts_total",
            "Total number of reconciliation timeouts per controller",
            controller,
            registry=registry,
        )
        self.max_concurrent = Gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            controller,
            registry=registry,
        )
        self.active_workers = Gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            controller,
            registry=registry,
        )
        self.queue_adds = Counter(
            "workqueue_adds_total", "Total number of adds handled by workqueue", queue, registry=registry
        )
        self.queue_latency = Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            queue,
            buckets=TENFOLD_BUCKETS,
            registry=registry,
        )
        self.work_duration = Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            queue,
            buckets=TENFOLD_BUCKETS,
            registry=registry,
        )
        self.queue_retries = Counter(
            "workqueue_retries_total",
            "Total number of items added to the workqueue with a delay (rate-limited retries, requeue-after)",
            queue,
            registry=registry,
        )
        self.rest_requests = Counter(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            ["code", "method", "host"],
            registry=registry,
        )
        self.rest_duration = Histogram(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb and host.",
            ["verb", "host"],
            buckets=REST_BUCKETS,
            registry=registry,
        )
        self.webhook_requests = Counter(
            "controller_runtime_webhook_requests_total",
            "Total number of admission requests by HTTP status code.",
            ["webhook", "code"],
            registry=registry,
        )
        self.webhook_latency = Histogram(
            "controller_runtime_webhook_latency_seconds",
            "Histogram of the latency of processing admission requests",
            ["webhook"],
            buckets=TENFOLD_BUCKETS,
            registry=registry,
        )
        self.webhook_in_flight = Gauge(
            "controller_runtime_webhook_requests_in_flight",
            "Current number of admission requests being served.",
            ["webhook"],
            registry=registry,
        )
        self.leader_status = Gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, "
            "1 indicates master. 'name' is the string used to identify the lease.",
            ["name"],
            registry=registry,
        )
        self.leader_slowpath = Counter(
            "leader_election_slowpath_total",
            "Total number of slow path exercised in renewing leader leases. 'name' is the string "
            "used to identify the lease.",
            ["name"],
            registry=registry,
        )
        #: Reads of a watched serving certificate (the webhook's, the metrics endpoint's).
        self.certificate_reads = Counter(
            "certwatcher_read_certificate_total", "Total number of certificate reads", registry=registry
        )
        self.certificate_read_errors = Counter(
            "certwatcher_read_certificate_errors_total",
            "Total number of certificate read errors",
            registry=registry,
        )
        # A registry of our own has none of the default collectors: process_* (memory, CPU, open
        # files) and python_* (garbage collector, version) are registered here.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        self.queues: dict[str, QueueSeries] = {}
        self._webhooks: dict[str, WebhookSeries] = {}
        registry.register(_QueueCollector(self.queues))

    def controller(self, name: str, max_concurrent: int) -> ControllerSeries:
        """The series of controller ``name`` (its queue's included), every result at 0 from the start."""
        return ControllerSeries(self, name, max_concurrent)

    def kube_client(self, host: str) -> RestClientSeries:
        """What one Kubernetes client's requests to ``host`` report to (``KubeClient.observe``)."""
        return RestClientSeries(self, host)

    def lease_slowpath(self, name: str) -> Callable[[], None]:
        """What the elector of the Lease ``name`` calls on a slow-path renewal (the series
        starts at 0)."""
        child = self.leader_slowpath.labels(name)
        child.inc(0)
        return child.inc

    def certificate_read(self, ok: bool) -> None:
        """A watched certificate's files were read (``ok``: and loaded); the certificate
        watcher's ``CertificateReloader(on_read=...)``."""
        self.certificate_reads.inc()
        if not ok:
            self.certificate_read_errors.inc()

    def webhook(self, path: str) -> WebhookSeries:
        """The series of the webhook served at ``path`` (made on its first request)."""
        found = self._webhooks.get(path)
        if found is None:
            found = self._webhooks[path] = WebhookSeries(self, path)
        return found


class ControllerSeries:
    """One controller's children of the reconcile series."""

    def __init__(self, series: StandardSeries, controller: str, max_concurrent: int) -> None:
        self._results = {
            result: series.reconcile_total.labels(controller, result)
            for result in ("success", "error", "requeue", "requeue_after")
        }
        self._errors = series.reconcile_errors.labels(controller)
        self._errors.inc(0)
        # controller-runtime starts these at 0 too, so a rate() or increase() sees the first one.
        self._terminal = series.terminal_errors.labels(controller)
        self._terminal.inc(0)
        self._panics = series.reconcile_panics.labels(controller)
        self._panics.inc(0)
        self._timeouts = series.reconcile_timeouts.labels(controller)
        self._timeouts.inc(0)
        self._time = series.reconcile_time.labels(controller)
        #: Workers inside a reconcile now (``controller_runtime_active_workers``).
        self.active = series.active_workers.labels(controller)
        self.active.set(0)
        series.max_concurrent.labels(controller).set(max_concurrent)
        #: The controller's workqueue series (given to its ``WorkQueue``).
        self.queue = series.queues.get(controller) or QueueSeries(series, controller)
        series.queues[controller] = self.queue

    def reconciled(self, outcome: str, seconds: float) -> None:
        """A pass ended with ``outcome`` (``resourceconsist_reconcile_total``'s) after ``seconds``."""
        result = RESULT_OF_OUTCOME.get(outcome, "error")
        self._results[result].inc()
        if result == "error":
            self._errors.inc()
        self._time.observe(seconds)

    def terminal(self) -> None:
        """A pass failed for good: the adapter's ``PermanentError`` (controller-runtime's
        ``TerminalError``), not retried until the employer changes; also an error."""
        self._terminal.inc()

    def panicked(self) -> None:
        """A pass failed on a bug, the frame's or its adapter's: a Python runtime error
        (``errors.PROGRAMMING_ERRORS``: a ``KeyError``, a ``TypeError``, ...) behind its error,
        what a Go program meets as a panic (controller-runtime's recovered panic); also an error."""
        self._panics.inc()

    def timed_out(self) -> None:
        """A pass outlived the reconcile timeout (``ManagerOptions.reconcile_timeout``): its
        cancellation's deadline passed while it ran, however it then ended."""
        self._timeouts.inc()


class QueueSeries:
    """One workqueue's series (``workqueue.QueueMetrics``); its depth, unfinished work and longest
    running processor are read from the queue itself when scraped."""

    def __init__(self, series: StandardSeries, name: str) -> None:
        self.name = name
        self._adds = series.queue_adds.labels(name, name)
        self._latency = series.queue_latency.labels(name, name)
        self._work = series.work_duration.labels(name, name)
        self._retries = series.queue_retries.labels(name, name)
        self.queue: QueueView | None = None

    def track(self, queue: QueueView) -> None:
        self.queue = queue

    def added(self) -> None:
        self._adds.inc()

    def retried(self) -> None:
        self._retries.inc()

    def waited(self, seconds: float) -> None:
        self._latency.observe(seconds)

    def worked(self, seconds: float) -> None:
        self._work.observe(seconds)


class QueueView(Protocol):
    """What the scrape reads from a workqueue (``resourceconsist.runtime.workqueue.WorkQueue``)."""

    def depth_by_priority(self) -> dict[int, int]: ...

    def unfinished_work(self) -> tuple[float, float]: ...


#: The priorities ``workqueue_depth`` always shows, 0 when no key waits at one: the two a
#: controller queues at (resourceconsist/runtime/workqueue.py), so a dashboard's series exist
#: from the start.
QUEUE_PRIORITIES = (0, -100)


class _QueueCollector(Collector):
    """``workqueue_depth``, ``workqueue_unfinished_work_seconds`` and
    ``workqueue_longest_running_processor_seconds``, computed from the queues when scraped."""

    def __init__(self, queues: dict[str, QueueSeries]) -> None:
        self.queues = queues

    def collect(self) -> Iterable[Metric]:
        labels = ["name", "controller"]
        depth = GaugeMetricFamily(
            "workqueue_depth",
            "Current depth of workqueue by workqueue and priority",
            labels=["name", "controller", "priority"],
        )
        unfinished = GaugeMetricFamily(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by "
            "work_duration. Large values indicate stuck workers.",
            labels=labels,
        )
        longest = GaugeMetricFamily(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            labels=labels,
        )
        for series in list(self.queues.values()):
            queue = series.queue
            if queue is None:
                continue
            total, oldest = queue.unfinished_work()
            waiting = dict.fromkeys(QUEUE_PRIORITIES, 0) | queue.depth_by_priority()
            for priority, keys in sorted(waiting.items(), reverse=True):
                depth.add_metric([series.name, series.name, str(priority)], keys)
            unfinished.add_metric([series.name, series.name], total)
            longest.add_metric([series.name, series.name], oldest)
        yield depth
        yield unfinished
        yield longest


class RestClientSeries:
    """``rest_client_requests_total`` and ``rest_client_request_duration_seconds`` of one API host;
    ``observe`` is called by the client's worker threads, one child per method and code."""

    def __init__(self, series: StandardSeries, host: str) -> None:
        self._series = series
        self.host = host
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}

    def observe(self, method: str, status: int, seconds: float) -> None:
        """One request answered with HTTP ``status`` (0: no answer) after ``seconds``."""
        children = self._children.get((method, status))
        if children is None:
            code = str(status) if status else NO_ANSWER_CODE
            children = (
                self._series.rest_requests.labels(code, method, self.host),
                self._series.rest_duration.labels(method, self.host),
            )
            self._children[(method, status)] = children
        children[0].inc()
        children[1].observe(seconds)


class WebhookSeries:
    """One webhook path's request count by HTTP code, latency and requests in flight."""

    def __init__(self, series: StandardSeries, path: str) -> None:
        self._requests = series.webhook_requests
        self.path = path
        self.latency = series.webhook_latency.labels(path)
        #: Requests being answered now (``controller_runtime_webhook_requests_in_flight``).
        self.in_flight = series.webhook_in_flight.labels(path)
        # controller-runtime starts the likely codes at 0, so a rate() sees the first request.
        self._codes = {status: self._requests.labels(path, str(status)) for status in (200, 500)}

    def answered(self, status: int, seconds: float) -> None:
        child = self._codes.get(status)
        if child is None:
            child = self._codes[status] = self._requests.labels(self.path, str(status))
        child.inc()
        self.latency.observe(seconds)
