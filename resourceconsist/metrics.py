"""Prometheus metrics of the frame, and the health/metrics HTTP endpoint of a manager.

Each ``Metrics`` has its own registry, so several managers in one process (tests, embedding)
never collide. Served at ``/metrics``; ``/healthz`` answers while the process runs and
``/readyz`` once every controller's caches have synced.

Adapters report their provider calls with ``observe_provider_call``, ``observe_provider_retry``
and ``observe_provider_failure``: the controller binds its ``Metrics`` to every pass it runs
(a context variable, so worker threads see it too), and the frame never imports an adapter.
What each series means for an operator: docs/concepts.md, "What an operator sees under faults".
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from aiohttp import web
    from prometheus_client.metrics_core import Metric

    from resourceconsist.cache import InformerFactory
    from resourceconsist.kube import KubeClient

#: ``code`` label of a provider call that succeeded.
OK_CODE = "ok"


class Metrics:
    """Counters and histograms of reconciles, queue depth and provider calls."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
        #: Lifecycle notifications dropped because a controller's subscriber queue was full.
        self.subscriber_drops = Counter(
            "resourceconsist_subscriber_dropped_total",
            "Lifecycle notifications dropped because the subscribers fell behind (queue full).",
            ["controller"],
            registry=self.registry,
        )
        self._kube = _KubeCollector()
        self.registry.register(self._kube)

    def observe_reconcile(self, controller: str, outcome: str, seconds: float) -> None:
        self.reconciles.labels(controller, outcome).inc()
        self.reconcile_seconds.labels(controller).observe(seconds)

    def watch_cluster(self, client: KubeClient, informers: InformerFactory, cluster: str = "") -> None:
        """Export ``client``'s 409 conflicts and ``informers``' re-lists (read at scrape time)."""
        self._kube.sources.append((cluster, client, informers))

    def unwatch_cluster(self, cluster: str) -> None:
        self._kube.sources = [source for source in self._kube.sources if source[0] != cluster]

    @contextmanager
    def bound(self, controller: str) -> Iterator[None]:
        """Provider calls made inside (threads started inside included) count for ``controller``."""
        token = _BOUND.set((self, controller))
        try:
            yield
        finally:
            _BOUND.reset(token)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _KubeCollector(Collector):
    """409 conflicts and informer re-lists, read from the clients and caches when scraped."""

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
        for cluster, client, informers in self.sources:
            for resource, count in sorted(client.conflicts.items()):
                conflicts.add_metric([cluster, resource], count)
            for informer in informers.informers():
                relists.add_metric([cluster, informer.resource.plural], max(0, informer.relists - 1))
        yield conflicts
        yield relists


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


def health_app(metrics: Metrics, ready: Callable[[], bool]) -> web.Application:
    """``/healthz``, ``/readyz`` and ``/metrics`` for a manager."""
    from aiohttp import web  # here: a run without health endpoints never loads aiohttp

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if ready() else web.Response(status=503, text="caches not synced")

    async def serve_metrics(_: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", serve_metrics)
    return app
