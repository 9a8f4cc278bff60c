"""controller-runtime's reconcile series that only move when something goes wrong, the workqueue's
priorities, and the fields of a pass (docs/observability.md), each made to happen on a real
manager against the real API server: an adapter's ``PermanentError`` is a terminal error, an
exception neither the frame nor the adapter meant is a panic, a pass past
``ManagerOptions.reconcile_timeout`` a timeout; at start-up a Service that changed, or whose
pod is being deleted, is reconciled before the Services the cache only listed; every line a pass
logs carries its ``reconcileID``, ``controllerKind`` and ``controllerGroup``, and so does the
Warning Event it records.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.adapter import Employer, ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.errors import PermanentError
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.runtime import logs
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, async_wait_for

CONTROLLER = "demo-controller"


class Failing(DemoAdapter):
    """The demo adapter whose provider read raises ``error`` while ``raising`` is set; a pass
    it is told to ``block`` waits for its cancellation (a provider that does not answer)."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__(FakeProvider())
        self.error = error
        self.raising = threading.Event()
        if error is not None:
            self.raising.set()
        self.block = threading.Event()
        self.reads = 0

    def record_error_conditions(
        self, ctx: ReconcileContext, employer: KubeObject, err: BaseException
    ) -> None:
        """No condition on the Service: its write would itself bring the employer back."""

    def get_current_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        self.reads += 1
        logging.getLogger("tests.adapter").info("reading the provider")
        if self.block.is_set():
            # Waits as a well-behaved adapter does: until the pass's deadline (or a stop).
            ctx.cancellation.wait(60)
            ctx.cancellation.check()
        if self.raising.is_set() and self.error is not None:
            raise self.error
        return super().get_current_employer(ctx, employer)


def _value(manager: Manager, name: str) -> float:
    found = manager.metrics.registry.get_sample_value(name, {"controller": CONTROLLER})
    return 0.0 if found is None else found


def _series(manager: Manager) -> dict[str, float]:
    return {
        name: _value(manager, f"controller_runtime_{name}_total")
        for name in (
            "reconcile_errors",
            "terminal_reconcile_errors",
            "reconcile_panics",
            "reconcile_timeouts",
        )
    }


async def test_a_permanent_error_is_a_terminal_error(cluster: Cluster, run_manager: Any) -> None:
    adapter = Failing(PermanentError("the Service names a load balancer that does not exist"))
    await cluster.service("svc")
    async with run_manager(adapter) as manager:
        await async_wait_for(
            lambda: _series(manager)["terminal_reconcile_errors"] >= 1, timeout=30, message="a terminal error"
        )
        series = _series(manager)
        # A terminal error is an error too (controller-runtime counts both), and nothing else.
        assert series["reconcile_errors"] >= 1
        assert series["reconcile_panics"] == series["reconcile_timeouts"] == 0


async def test_an_exception_nobody_meant_is_a_panic_logged_with_where_it_was_raised(
    cluster: Cluster, run_manager: Any, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = Failing(KeyError("vip"))
    await cluster.service("svc")
    async with run_manager(adapter) as manager:
        await async_wait_for(lambda: _series(manager)["reconcile_panics"] >= 1, timeout=30, message="a panic")
        series = _series(manager)
        assert series["reconcile_errors"] >= series["reconcile_panics"]
        assert series["terminal_reconcile_errors"] == series["reconcile_timeouts"] == 0
        # The log says where the bug is: the adapter's line, as a recovered panic's stack does
        # (the adapter's frames themselves are not kept, resourceconsist.errors.frames_dropped).
        bugs = [
            r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info and "a bug" in r.message
        ]
        assert bugs, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        exc_info = bugs[0].exc_info
        assert exc_info is not None
        text = logging.Formatter().formatException(exc_info)
        assert "KeyError: 'vip'" in text and "in get_current_employer" in text, text
        assert __file__ in text, text
        # Retried with backoff, as controller-runtime retries a recovered panic: it converges.
        adapter.raising.clear()
        await async_wait_for(
            lambda: f"{cluster.namespace}/svc" in adapter.provider.vips, timeout=30, message="converged"
        )


async def test_a_pass_past_the_reconcile_timeout_is_a_timeout(cluster: Cluster, run_manager: Any) -> None:
    adapter = Failing()
    adapter.block.set()
    await cluster.service("svc")
    async with run_manager(adapter, reconcile_timeout=0.5) as manager:
        await async_wait_for(
            lambda: _series(manager)["reconcile_timeouts"] >= 1, timeout=30, message="a timeout"
        )
        adapter.block.clear()
        await async_wait_for(
            lambda: f"{cluster.namespace}/svc" in adapter.provider.vips, timeout=30, message="converged"
        )
        timeouts = _series(manager)["reconcile_timeouts"]
        # Passes within the deadline are no timeouts.
        reads = adapter.reads  # read before the change: its pass may end before the patch returns
        await cluster.patch(kube.SERVICE, "svc", {"metadata": {"annotations": {"touched": "yes"}}})
        await async_wait_for(lambda: adapter.reads > reads, timeout=30, message="a pass after the change")
        assert _series(manager)["reconcile_timeouts"] == timeouts
        assert _series(manager)["reconcile_panics"] == 0


# -- the workqueue's priorities -------------------------------------------------------------------


class Ordered(DemoAdapter):
    """The demo adapter recording the order of its passes; the first one waits for ``go``."""

    def __init__(self) -> None:
        super().__init__(FakeProvider())
        self.order: list[str] = []
        self.go = threading.Event()

    def get_current_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        self.order.append(employer["metadata"]["name"])
        if len(self.order) == 1:
            self.go.wait(30)
        return super().get_current_employer(ctx, employer)


def _depth(manager: Manager, priority: str) -> float:
    found = manager.metrics.registry.get_sample_value(
        "workqueue_depth", {"name": CONTROLLER, "controller": CONTROLLER, "priority": priority}
    )
    return 0.0 if found is None else found


SERVICES = [f"svc-{letter}" for letter in "abcdefgh"]


async def test_a_change_goes_before_the_services_the_cache_only_listed(
    cluster: Cluster, run_manager: Any
) -> None:
    """Eight Services exist at start: their keys come from the cache's first list, at priority
    -100. While the one worker holds the first pass, the last Service changes: its key rises to 0
    and is the next one handed out, not the eighth."""
    for name in SERVICES:
        await cluster.service(name)
    adapter = Ordered()
    async with run_manager(adapter, max_concurrent_reconciles=1) as manager:
        controller = manager.controllers[CONTROLLER]
        await async_wait_for(lambda: adapter.order, timeout=30, message="the first pass")
        await async_wait_for(
            lambda: len(controller.queue) == len(SERVICES) - 1, timeout=30, message="the others queued"
        )
        last = next(name for name in reversed(SERVICES) if name != adapter.order[0])
        await cluster.patch(kube.SERVICE, last, {"metadata": {"annotations": {"changed": "yes"}}})

        def seen() -> bool:
            service = controller.reader.get(kube.SERVICE, cluster.namespace, last)
            return service is not None and "changed" in service["metadata"].get("annotations", {})

        await async_wait_for(seen, timeout=30, message="the change in the cache")
        # The cache holds the change before its event reaches the queue (the informer hands
        # events to the loop after storing them): wait for the key to move to priority 0.
        await async_wait_for(
            lambda: (_depth(manager, "0"), _depth(manager, "-100")) == (1, len(SERVICES) - 2),
            timeout=30,
            message="the changed key at priority 0, the others still at -100",
        )
        adapter.go.set()
        await async_wait_for(lambda: len(adapter.order) >= 2, timeout=30, message="the second pass")
        assert adapter.order[1] == last, adapter.order


async def test_a_service_whose_pod_is_being_deleted_is_not_left_behind_at_start(
    cluster: Cluster, run_manager: Any
) -> None:
    """The same start, but the last Service's pod is being deleted (held by a finalizer): its
    event comes from the cache's first list too, yet a deletion never waits behind the others."""
    for name in SERVICES:
        await cluster.service(name)
    last = SERVICES[-1]
    await cluster.pod("leaving", {"app": last, wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE})
    await cluster.patch(kube.POD, "leaving", {"metadata": {"finalizers": ["example.com/hold"]}})
    await cluster.delete(kube.POD, "leaving")
    adapter = Ordered()
    try:
        async with run_manager(adapter, max_concurrent_reconciles=1) as manager:
            await async_wait_for(lambda: adapter.order, timeout=30, message="the first pass")
            await async_wait_for(
                lambda: _depth(manager, "-100") + _depth(manager, "0") == len(SERVICES) - 1,
                timeout=30,
                message="every other Service queued",
            )
            adapter.go.set()
            await async_wait_for(lambda: len(adapter.order) >= 2, timeout=30, message="the second pass")
            assert last in adapter.order[:2], adapter.order
    finally:
        await cluster.patch(kube.POD, "leaving", {"metadata": {"finalizers": None}})


# -- the fields of a pass -------------------------------------------------------------------------


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """What the process logs, as JSON lines (``logs.setup``); the root logger as it was after."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    stream = io.StringIO()
    logs.setup("info", "json", stream)
    yield stream
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


async def test_every_line_of_a_pass_and_its_warning_carry_its_reconcile_id(
    cluster: Cluster, run_manager: Any, json_lines: io.StringIO
) -> None:
    adapter = Failing(PermanentError("no such load balancer"))
    await cluster.service("svc")
    async with run_manager(adapter) as manager:
        await async_wait_for(
            lambda: _series(manager)["terminal_reconcile_errors"] >= 1, timeout=30, message="a failed pass"
        )

        async def warned() -> list[KubeObject]:
            found = await cluster.call(cluster.client.list, kube.EVENT, cluster.namespace)
            return [e for e in found["items"] if e["reason"] and "no such load balancer" in e["message"]]

        (event,) = await async_wait_for(warned, timeout=30, message="the Warning Event")
    entries = [json.loads(line) for line in json_lines.getvalue().splitlines()]
    reads = [e for e in entries if e["msg"] == "reading the provider"]
    assert reads, "the adapter's own line, from its worker thread"
    first = reads[0]
    assert (first["controller"], first["controllerKind"], first["controllerGroup"]) == (
        CONTROLLER,
        "Service",
        "",
    )
    assert (first["namespace"], first["name"]) == (cluster.namespace, "svc")
    reconcile_id = first["reconcileID"]
    # The frame's lines of the same pass carry the same ID; another pass has another.
    same_pass = [e for e in entries if e.get("reconcileID") == reconcile_id]
    assert any(e["logger"].startswith("resourceconsist.") for e in same_pass), same_pass
    assert len({e["reconcileID"] for e in reads}) == len(reads)
    # The Warning names the last pass that recorded it: one of the passes that logged.
    told = event["metadata"]["annotations"][wire.RECONCILE_ID_ANNOTATION]
    assert told in {e["reconcileID"] for e in reads}
