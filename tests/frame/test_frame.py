"""The frame beyond the Go scenarios: shared pods under contention, failing adapters, sync and
async adapters off the loop, isolation between controllers, runtime add/stop, shutdown."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

from resourceconsist.adapter import Employee, ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.experimental.demo import DEMO_CONDITION_ANNOTATION, DemoAdapter, FakeProvider
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, WaitTimeout, annotation, async_wait_for, finalizers


async def test_twenty_services_share_twenty_pods_without_losing_an_entry(
    cluster: Cluster, run_manager: Any
) -> None:
    services = [f"svc-{i:02d}" for i in range(20)]
    pods = [f"pod-{i:02d}" for i in range(20)]
    for name in pods:
        await cluster.pod(name, {"app": "shared"})
        await cluster.set_status(name)
    for name in services:
        await cluster.service(name, {"app": "shared"})
    wanted_entries = {
        lifecycle.expected_finalizer_key("Service", cluster.namespace, s): lifecycle.lifecycle_finalizer(s)
        for s in services
    }
    wanted_finalizers = {lifecycle.lifecycle_finalizer(s) for s in services}
    async with run_manager(DemoAdapter(FakeProvider())):

        async def all_guarded() -> bool:
            listing = await cluster.call(cluster.client.list, kube.POD, cluster.namespace)
            return (
                all(
                    lifecycle.expected_finalizers(p) == wanted_entries
                    and set(finalizers(p)) == wanted_finalizers
                    for p in listing["items"]
                )
                and len(listing["items"]) == 20
            )

        await async_wait_for(
            all_guarded, timeout=120, interval=0.5, message="20 entries and 20 finalizers per pod"
        )


async def test_five_services_sharing_flapping_pods_converge_without_a_warning(
    cluster: Cluster, run_manager: Any
) -> None:
    """Five Services share 50 pods whose readiness flips for 15 s: the five controllers' pod
    writes conflict (409) and their retries absorb it. When everything converges, no Warning
    Event is left behind: a conflict a retry resolves is an INFO line and a metric, not a page
    (docs/concepts.md, "When a failure becomes a Warning")."""
    services = [f"svc-{i}" for i in range(5)]
    pods = [f"pod-{i:02d}" for i in range(50)]
    await asyncio.gather(*(cluster.pod(name, {"app": "shared"}) for name in pods))
    await asyncio.gather(*(cluster.set_status(name) for name in pods))
    for name in services:
        await cluster.service(name, {"app": "shared"})
    served = {lifecycle.lifecycle_finalizer(s) for s in services}
    guarded = {lifecycle.guard_finalizer(s) for s in services}
    rng = random.Random(18)
    ready = dict.fromkeys(pods, True)
    adapter = DemoAdapter(FakeProvider())
    async with run_manager(adapter) as manager:
        flips = 0
        deadline = time.monotonic() + 15

        busy: set[str] = set()

        async def flipper() -> None:
            nonlocal flips
            while time.monotonic() < deadline:
                # One flip of a pod at a time, so its last write is the state the test expects.
                name = rng.choice([n for n in pods if n not in busy])
                busy.add(name)
                ready[name] = not ready[name]
                await cluster.set_status(name, ready=ready[name])
                busy.discard(name)
                flips += 1

        await asyncio.gather(*(flipper() for _ in range(8)))

        wrong: dict[str, tuple[bool, list[str]]] = {}

        async def converged() -> bool:
            listing = await cluster.call(cluster.client.list, kube.POD, cluster.namespace)
            wrong.clear()
            for pod in listing["items"]:
                name, held = pod["metadata"]["name"], set(finalizers(pod))
                if held != (served if ready[name] else guarded):
                    wrong[name] = (ready[name], sorted(held))
            return not wrong

        try:
            await async_wait_for(converged, timeout=180, interval=0.5, message="finalizers converged")
        except WaitTimeout:
            raise AssertionError(f"not converged: {wrong}") from None
        listing = await cluster.call(
            cluster.client.list, kube.EVENT, cluster.namespace, field_selector="type=Warning"
        )
        # The controller's own Warnings (the API server's repair loops report theirs too).
        warnings = [
            (e["involvedObject"]["name"], e["reason"], e["message"])
            for e in listing["items"]
            if (e.get("source") or {}).get("component") == adapter.get_controller_name()
        ]
        print(f"{flips} readiness flips; {cluster.client.conflicts['pods']} pod write conflicts retried")
        assert flips > 100
        assert warnings == []
        assert manager is not None


class FlakyDemo(DemoAdapter):
    """Demo adapter whose current-employee read fails for one Service while ``broken`` is set."""

    def __init__(self, provider: FakeProvider, bad: str) -> None:
        super().__init__(provider)
        self.bad = bad
        self.broken = threading.Event()
        self.broken.set()
        self.attempts: list[float] = []

    def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        if employer["metadata"]["name"] == self.bad and self.broken.is_set():
            self.attempts.append(time.monotonic())
            raise RuntimeError("provider is down")
        return super().get_current_employee(ctx, employer)


async def test_a_raising_adapter_warns_records_retries_with_backoff_and_spares_others(
    cluster: Cluster, run_manager: Any
) -> None:
    provider = FakeProvider()
    adapter = FlakyDemo(provider, bad="bad")
    await cluster.service("bad")
    await cluster.service("good")
    await cluster.pod("good-0", {"app": "good"})
    await cluster.set_status("good-0")
    async with run_manager(adapter) as manager:
        await async_wait_for(
            lambda: "good-0" in provider.snapshot().get(f"{cluster.namespace}/good", {}),
            timeout=20,
            message="the good Service converging beside the failing one",
        )

        async def warned() -> bool:
            return (
                "Warning",
                "GetCurrentEmployeesFailed",
                "get current employees failed: provider is down",
            ) in await cluster.events("bad")

        try:
            await async_wait_for(warned, timeout=20, message="a Warning event on the failing Service")
        except WaitTimeout as err:
            # Say what the controller did meanwhile, so a failure here can be told apart from a
            # pass that never ran (no attempts) or an Event that never landed (attempts, no Event).
            seen = await cluster.events("bad")
            raise WaitTimeout(
                f"{err}; failed attempts: {len(adapter.attempts)}; Events on bad: {seen}"
            ) from err

        async def condition() -> str | None:
            return annotation(await cluster.get(kube.SERVICE, "bad"), DEMO_CONDITION_ANNOTATION)

        await async_wait_for(condition, timeout=20, message="error condition recorded")
        assert await condition() == "get current employees failed: provider is down"

        await async_wait_for(lambda: len(adapter.attempts) >= 9, timeout=30, message="several retries")
        gaps = [b - a for a, b in zip(adapter.attempts, adapter.attempts[1:], strict=False)]
        # Per-item exponential backoff (5 ms doubling): once the delays dominate the cost of a
        # reconcile, each gap roughly doubles, so two steps apart they grow well past 2x.
        assert gaps[-1] > 2 * gaps[-3], gaps
        # The queue counts a requeue when a failed pass ends, after the adapter saw its attempt,
        # and an attempt an event of the Service queued is not a requeue: wait for the count (CI
        # once read 7 after 9 attempts).
        queue = manager.controllers["demo-controller"].queue
        await async_wait_for(
            lambda: queue.num_requeues(f"{cluster.namespace}/bad") >= 8, timeout=30, message="8 requeues"
        )

        adapter.broken.clear()
        await cluster.patch(kube.SERVICE, "bad", {"metadata": {"labels": {"poke": "1"}}})

        async def recovered() -> bool:
            return await condition() in (None, "")

        await async_wait_for(recovered, timeout=30, message="condition erased after recovery")


class AsyncDemo(DemoAdapter):
    """The demo with coroutine methods: they run on the loop; the sync ones run off it."""

    def __init__(self, provider: FakeProvider) -> None:
        super().__init__(provider, name="async-demo")
        self.loop_thread = threading.get_ident()
        self.sync_threads: set[int] = set()
        self.async_threads: set[int] = set()

    async def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:  # type: ignore[override]
        self.async_threads.add(threading.get_ident())
        await asyncio.sleep(0)
        return DemoAdapter.get_expected_employee(self, ctx, employer)

    def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        self.sync_threads.add(threading.get_ident())
        return super().get_current_employee(ctx, employer)


async def test_async_methods_run_on_the_loop_and_blocking_ones_off_it(
    cluster: Cluster, run_manager: Any
) -> None:
    provider = FakeProvider()
    adapter = AsyncDemo(provider)
    await cluster.service("svc")
    await cluster.pod("p", {"app": "svc"})
    await cluster.set_status("p")
    async with run_manager(adapter):
        await async_wait_for(
            lambda: "p" in provider.snapshot().get(f"{cluster.namespace}/svc", {}), timeout=20
        )
    assert adapter.async_threads == {threading.get_ident()}
    assert adapter.sync_threads
    assert threading.get_ident() not in adapter.sync_threads


class HungDemo(DemoAdapter):
    """A demo whose provider hangs on every read until released."""

    def __init__(self, name: str) -> None:
        super().__init__(FakeProvider(), name=name)
        self.release = threading.Event()
        self.entered = threading.Event()

    def get_expected_employer(self, ctx: ReconcileContext, employer: KubeObject) -> Any:
        self.entered.set()
        self.release.wait(60)
        return super().get_expected_employer(ctx, employer)


async def test_a_hung_controller_does_not_stall_others_and_stops_at_runtime(
    cluster: Cluster, run_manager: Any
) -> None:
    hung = HungDemo("hung")
    healthy = DemoAdapter(FakeProvider(), name="healthy")
    await cluster.service("svc")
    await cluster.pod("p", {"app": "svc"})
    await cluster.set_status("p")
    try:
        async with run_manager(hung, healthy) as manager:
            await async_wait_for(hung.entered.is_set, timeout=20, message="the hung adapter blocked")
            await async_wait_for(
                lambda: "p" in healthy.provider.snapshot().get(f"{cluster.namespace}/svc", {}),
                timeout=20,
                message="the healthy adapter converging meanwhile",
            )
            started = time.monotonic()
            await manager.stop_controller("hung", timeout=1)
            assert time.monotonic() - started < 5
            assert "hung" not in manager.controllers

            late = DemoAdapter(FakeProvider(), name="late")
            await manager.add(late)
            await async_wait_for(
                lambda: "p" in late.provider.snapshot().get(f"{cluster.namespace}/svc", {}),
                timeout=20,
                message="an adapter added at runtime converging",
            )
            healthy.provider.drop_real_server(f"{cluster.namespace}/svc", "p")
            await cluster.patch(kube.POD, "p", {"metadata": {"labels": {"poke": "1"}}})
            await async_wait_for(
                lambda: "p" in healthy.provider.snapshot().get(f"{cluster.namespace}/svc", {}),
                timeout=20,
                message="the healthy adapter still running after the other stopped",
            )
    finally:
        hung.release.set()


async def test_shutdown_is_graceful_within_its_timeout(cluster: Cluster, run_manager: Any) -> None:
    hung = HungDemo("hung")
    await cluster.service("svc")
    try:
        manager_cm = run_manager(hung)
        manager = await manager_cm.__aenter__()
        await async_wait_for(hung.entered.is_set, timeout=20, message="a reconcile in flight")
        started = time.monotonic()
        await manager.stop(timeout=1)
        assert time.monotonic() - started < 5
        assert not manager.started
        await manager_cm.__aexit__(None, None, None)
    finally:
        hung.release.set()
