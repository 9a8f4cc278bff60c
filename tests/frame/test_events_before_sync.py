"""Events that come before the caches their handler reads have synced (docs/concepts.md, "Events
before the caches sync"): they wait for that cache and are mapped again, with no error logged and
none lost; a handler failing for any other reason is logged once with the object's key and every
employer gets a full pass.

Here the controller's rule, in a manager against the real control plane; the step logic
(``ParkedEvents``, ``Informer.when_synced``) is tested in test_cache.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.adapter import EventHandler, Predicate
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheReader, WatchEvent
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.options import ManagerOptions
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, annotation, async_wait_for, finalizers
from resourceconsist.watch import handler


def _loud(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What an operator sees (INFO and above) that looks like a crash: an ERROR or a traceback."""
    return [
        f"{r.levelname} {r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.ERROR or (r.exc_info and r.levelno >= logging.INFO)
    ]


async def test_a_start_with_pod_events_before_the_service_cache_logs_no_error_and_loses_nothing(
    cluster: Cluster, late_service_lists: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    pods = [f"pod-{i}" for i in range(6)]
    for name in pods:
        await cluster.pod(name, {"app": "web"})
        await cluster.set_status(name)
    await cluster.service("web", {"app": "web"})
    manager = Manager(late_service_lists.client, ManagerOptions(namespace=cluster.namespace))
    controller = await manager.add(DemoAdapter(FakeProvider()))
    wanted = lifecycle.lifecycle_finalizer("web")
    starting = asyncio.create_task(manager.start())
    try:
        await async_wait_for(
            lambda: controller.events_waiting().get("services") == len(pods),
            timeout=30,
            message="every pod's event waiting for the Service cache",
        )
        # A pod changes while its events wait.
        await cluster.patch(kube.POD, "pod-0", {"metadata": {"labels": {"tick": "1"}}})
        late_service_lists.release.set()
        await asyncio.wait_for(starting, timeout=60)

        async def all_guarded() -> bool:
            return all(wanted in finalizers(p) for p in await cluster.pods({"app": "web"}))

        await async_wait_for(all_guarded, timeout=60, interval=0.5, message="every pod guarded")
        assert controller.events_waiting() == {}
    finally:
        late_service_lists.release.set()
        await asyncio.gather(starting, return_exceptions=True)
        await manager.stop(timeout=5)
    assert _loud(caplog) == []
    assert any("events wait for the services cache" in r.getMessage() for r in caplog.records)


class _BrokenOnce(DemoAdapter):
    """The demo adapter whose handlers raise on the first event of an object labelled ``broken``
    (a handler bug that one object's state triggers), once for employers, once for employees."""

    def __init__(self, provider: FakeProvider) -> None:
        super().__init__(provider)
        self.failures: list[str] = []

    def _failing_once(self, side: str, handle: EventHandler) -> EventHandler:
        def mapped(event: WatchEvent, reader: CacheReader) -> list[str]:
            if (event.obj["metadata"].get("labels") or {}).get("broken") and side not in self.failures:
                self.failures.append(side)
                raise ValueError(f"this {side} handler cannot read objects labelled broken")
            return handle(event, reader)

        return mapped

    def employer_predicates(self) -> Predicate:
        return handler.control_predicate

    def employee_predicates(self) -> Predicate:
        return handler.accept_all

    def employer_event_handler(self) -> EventHandler:
        return self._failing_once("employer", handler.enqueue_self)

    def employee_event_handler(self) -> EventHandler:
        return self._failing_once("employee", handler.enqueue_services_by_pod)

    def new_employer(self) -> kube.Resource:
        return kube.SERVICE

    def new_employee(self) -> kube.Resource:
        return kube.POD


@asynccontextmanager
async def _broken_once_settled(
    cluster: Cluster, run_manager: Any, adapter: _BrokenOnce
) -> AsyncIterator[Callable[[str], Awaitable[bool]]]:
    """A manager running ``adapter`` on Service web (app=web) with pods steady (app=web) and
    late (app=elsewhere), once steady is guarded and the Service's pass is over: from then on
    only a new event brings the Service a pass. Yields whether a pod holds web's finalizer."""
    await cluster.pod("steady", {"app": "web"})
    await cluster.set_status("steady")
    await cluster.pod("late", {"app": "elsewhere"})
    await cluster.set_status("late")
    await cluster.service("web", {"app": "web"})
    wanted = lifecycle.lifecycle_finalizer("web")

    async def has_finalizer(name: str) -> bool:
        pod = await cluster.get(kube.POD, name)
        return pod is not None and wanted in finalizers(pod)

    async with run_manager(adapter) as manager:
        controller = manager.controllers[adapter.name]

        async def settled() -> bool:
            # The pass recorded steady in the Service, that write's own event has been handled,
            # and nothing more is queued.
            service = controller.reader.get(kube.SERVICE, cluster.namespace, "web")
            recorded = annotation(service, wire.EXPECTED_FINALIZER_ADDED_ANNOTATION) if service else None
            return (
                await has_finalizer("steady")
                and "steady" in (recorded or "")
                and not controller.queue.holds(f"{cluster.namespace}/web")
            )

        await async_wait_for(settled, timeout=60, message="steady guarded and the Service settled")
        assert not await has_finalizer("late")
        yield has_finalizer


def _one_error(caplog: pytest.LogCaptureFixture) -> str:
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(failed) == 1, [r.getMessage() for r in failed]
    assert failed[0].exc_info is not None, "the traceback of the adapter's bug"
    return failed[0].getMessage()


async def test_an_employee_handler_failure_is_logged_once_with_the_pods_key_and_every_employer_passes(
    cluster: Cluster, run_manager: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    adapter = _BrokenOnce(FakeProvider())
    async with _broken_once_settled(cluster, run_manager, adapter) as has_finalizer:
        # The pod joins the Service's selector in the one change its handler cannot map: only
        # the full pass every employer gets makes the Service take it in.
        await cluster.patch(kube.POD, "late", {"metadata": {"labels": {"app": "web", "broken": "yes"}}})
        await async_wait_for(lambda: has_finalizer("late"), timeout=60, message="late guarded")
    message = _one_error(caplog)
    assert f"the employee handler failed on Pod {cluster.namespace}/late" in message
    assert "queued every Service for a full pass" in message
    assert adapter.failures == ["employee"]


async def test_an_employer_handler_failure_is_logged_once_with_its_key_and_it_still_passes(
    cluster: Cluster, run_manager: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    adapter = _BrokenOnce(FakeProvider())
    async with _broken_once_settled(cluster, run_manager, adapter) as has_finalizer:
        # The Service selects late in the one change its handler cannot map.
        body = {"metadata": {"labels": {"broken": "yes"}}, "spec": {"selector": {"app": "elsewhere"}}}
        await cluster.patch(kube.SERVICE, "web", body)
        await async_wait_for(lambda: has_finalizer("late"), timeout=60, message="late guarded")
    message = _one_error(caplog)
    assert f"the employer handler failed on Service {cluster.namespace}/web" in message
    assert "queued it for a full pass" in message
    assert adapter.failures == ["employer"]
