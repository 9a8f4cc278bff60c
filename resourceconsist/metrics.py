"""Prometheus metrics of the frame, and the health/metrics HTTP endpoint of a manager.

Each ``Metrics`` has its own registry, so several managers in one process (tests, embedding)
never collide. Served at ``/metrics``; ``/healthz`` answers while the process runs and
``/readyz`` once every controller's caches have synced.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Metrics:
    """Counters and histograms of reconciles, queue depth and provider calls."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "resourceconsist_reconcile_total",
            "Reconciles by controller and outcome (success, error, requeue_after).",
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

    def observe_reconcile(self, controller: str, outcome: str, seconds: float) -> None:
        self.reconciles.labels(controller, outcome).inc()
        self.reconcile_seconds.labels(controller).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def health_app(metrics: Metrics, ready: Callable[[], bool]) -> web.Application:
    """``/healthz``, ``/readyz`` and ``/metrics`` for a manager."""

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
