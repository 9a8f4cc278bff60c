"""The one rule for sync and async (resourceconsist.flow.cancellation): ``call_adapter`` runs plain
functions off the loop and awaits coroutines on it, and nothing on the loop waits on a thread."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import gc
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s

from resourceconsist import wire
from resourceconsist.adapter import Employee, Employer, OwnedItem, ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import CacheNotSynced, InformerFactory
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.errors import ResourceConsistError
from resourceconsist.experimental.demo import DemoAdapter
from resourceconsist.flow.cancellation import (
    ADAPTER_THREADS,
    Cancellation,
    DaemonThreadExecutor,
    call_adapter,
    call_adapter_in_turn,
    current_cancellation,
    running_pass,
)
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, async_wait_for, collector_finds
from resourceconsist.testing.controlplane import free_port

_seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


async def test_a_plain_function_runs_in_a_worker_thread_with_the_callers_context() -> None:
    loop_thread = threading.get_ident()
    _seen.set("the caller's")
    cancellation = Cancellation()

    def blocking(value: int) -> tuple[int, int, str, Cancellation]:
        return threading.get_ident(), value * 2, _seen.get(), current_cancellation()

    with running_pass(cancellation):
        thread, doubled, seen, current = await call_adapter(blocking, 21)
    assert thread != loop_thread
    assert doubled == 42
    assert seen == "the caller's"
    assert current is cancellation


async def test_a_coroutine_function_runs_on_the_loop() -> None:
    loop_thread = threading.get_ident()

    async def on_loop(value: int) -> tuple[int, int]:
        return threading.get_ident(), value + 1

    assert await call_adapter(on_loop, 1) == (loop_thread, 2)


async def test_an_awaitable_a_plain_function_returns_is_awaited() -> None:
    async def later() -> str:
        return "awaited"

    def plain() -> object:
        return later()

    assert await call_adapter(plain) == "awaited"


async def test_an_unsynced_cache_read_on_the_event_loop_raises_instead_of_blocking_it() -> None:
    # A client of an API server that is not there: the informer lists, fails and never syncs.
    configuration = k8s.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"
    client = KubeClient(k8s.ApiClient(configuration))
    factory = InformerFactory(client)
    factory.start(asyncio.get_running_loop())
    try:
        reader = factory.reader()
        with pytest.raises(CacheNotSynced, match="must not wait: await the informer's wait_synced") as raised:
            reader.get(kube.SERVICE, "default", "web")
        # A TimeoutError (the webhook server reports it as the adapter's failure, not its own
        # deadline) and one of the project's errors.
        assert isinstance(raised.value, TimeoutError)
        assert isinstance(raised.value, ResourceConsistError)
        with pytest.raises(CacheNotSynced):
            reader.services_selecting({"metadata": {"namespace": "default", "labels": {"app": "web"}}})
        assert not factory.has_synced
    finally:
        await call_adapter(factory.stop)
        client.close()


# -- a hung provider fills the adapters' threads only -------------------------------------------------


class HangingForOneEmployer(DemoAdapter):
    """The demo adapter with coroutine methods (they run on the loop, as an async adapter's do).
    For the Service ``stuck``, reading the provider's backends sends as many requests at once as
    ``ADAPTER_THREADS`` has threads, through ``call_adapter`` as an adapter's blocking provider
    client goes, and every one hangs until ``release`` is set: a provider that stopped answering."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release
        self.hung = 0
        self._count = threading.Lock()

    def _hang(self) -> None:
        with self._count:
            self.hung += 1
        self.release.wait()

    async def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:  # type: ignore[override]
        if employer["metadata"]["name"] == "stuck":
            await asyncio.gather(*(call_adapter(self._hang) for _ in range(ADAPTER_THREADS._max_workers)))
        return super().get_current_employee(ctx, employer)

    async def get_selected_employee_names(self, ctx: ReconcileContext, employer: KubeObject) -> list[str]:
        return await super().get_selected_employee_names(ctx, employer)

    async def get_expected_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:  # type: ignore[override]
        return super().get_expected_employer(ctx, employer)

    async def get_current_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:  # type: ignore[override]
        return super().get_current_employer(ctx, employer)

    async def create_employer(
        self, ctx: ReconcileContext, employer: KubeObject, items: list[Employer]
    ) -> Any:  # type: ignore[override]
        return super().create_employer(ctx, employer, items)

    async def update_employer(
        self, ctx: ReconcileContext, employer: KubeObject, items: list[Employer]
    ) -> Any:  # type: ignore[override]
        return super().update_employer(ctx, employer, items)

    async def delete_employer(
        self, ctx: ReconcileContext, employer: KubeObject, items: list[Employer]
    ) -> Any:  # type: ignore[override]
        return super().delete_employer(ctx, employer, items)

    async def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:  # type: ignore[override]
        return super().get_expected_employee(ctx, employer)

    async def create_employees(
        self, ctx: ReconcileContext, employer: KubeObject, items: list[Employee]
    ) -> Any:  # type: ignore[override]
        return super().create_employees(ctx, employer, items)

    async def update_employees(
        self, ctx: ReconcileContext, employer: KubeObject, items: list[Employee]
    ) -> Any:  # type: ignore[override]
        return super().update_employees(ctx, employer, items)

    async def delete_employees(
        self, ctx: ReconcileContext, employer: KubeObject, items: list[Employee]
    ) -> Any:  # type: ignore[override]
        return super().delete_employees(ctx, employer, items)

    async def record_statuses(self, *args: Any) -> None:
        await super().record_statuses(*args)

    async def record_error_conditions(self, *args: Any) -> None:  # type: ignore[override]
        super().record_error_conditions(*args)

    async def list_owned(self, ctx: ReconcileContext) -> list[OwnedItem]:  # type: ignore[override]
        return super().list_owned(ctx)


async def test_a_hung_provider_never_holds_up_the_frames_own_writes(
    cluster: Cluster, run_manager: Callable[..., Any]
) -> None:
    # docs/concepts.md, "The runtime": the finalizers, record annotations and readiness gates
    # that keep the promise are written on the event loop (or the frame's own threads), which a
    # provider that hangs cannot fill.
    release = threading.Event()
    adapter = HangingForOneEmployer(release)
    client, namespace = cluster.client, cluster.namespace
    probe: asyncio.Task[Any] | None = None
    async with run_manager(adapter):
        try:
            await asyncio.to_thread(client.create, kube.SERVICE, namespace, _service("stuck"))
            await async_wait_for(
                lambda: adapter.hung == ADAPTER_THREADS._max_workers,
                timeout=30,
                message="every adapter thread hung in the provider",
            )
            # A call behind them waits for a thread: the adapters' pool is full.
            probe = asyncio.create_task(call_adapter(lambda: "ran"))
            gate = lifecycle.readiness_gate("web")
            pod = {
                "metadata": {"name": "web-0", "labels": {"app": "web"}},
                "spec": {
                    "containers": [{"name": "app", "image": "nginx"}],
                    "readinessGates": [{"conditionType": gate}],
                },
            }
            await asyncio.to_thread(client.create, kube.POD, namespace, pod)
            await asyncio.to_thread(client.create, kube.SERVICE, namespace, _service("web"))

            async def written() -> tuple[KubeObject, KubeObject] | None:
                service = await asyncio.to_thread(client.get, kube.SERVICE, namespace, "web")
                pod = await asyncio.to_thread(client.get, kube.POD, namespace, "web-0")
                annotations = service["metadata"].get("annotations") or {}
                if (
                    wire.CLEAN_FINALIZER in (service["metadata"].get("finalizers") or [])
                    and "web-0" in annotations.get(wire.EXPECTED_FINALIZER_ADDED_ANNOTATION, "")
                    and lifecycle.pod_condition(pod, gate) is not None
                ):
                    return service, pod
                return None

            found = await async_wait_for(
                written, timeout=60, interval=0.2, message="the frame's writes for web"
            )
            assert found is not None
            _, written_pod = found
            condition = lifecycle.pod_condition(written_pod, gate)
            assert condition is not None and condition["status"] == "False"  # not ready: not served
            assert lifecycle.expected_finalizers(written_pod)  # the pod's entry, by the pod writer
            assert adapter.hung == ADAPTER_THREADS._max_workers
            assert not probe.done(), "the adapters' pool had a free thread: the test proves nothing"
        finally:
            release.set()
        assert probe is not None and await probe == "ran"


def _service(name: str) -> KubeObject:
    return {
        "metadata": {"name": name, "labels": {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80}]},
    }


async def test_plain_reads_in_turn_run_in_one_worker_thread_in_order() -> None:
    loop_thread = threading.get_ident()
    seen: list[tuple[str, int]] = []

    def expected(x: int) -> int:
        seen.append(("expected", threading.get_ident()))
        return x + 1

    def current(x: int) -> int:
        seen.append(("current", threading.get_ident()))
        return x + 2

    one, two = await call_adapter_in_turn((expected, current), 1)
    assert (one.value, two.value) == (2, 3)
    assert [what for what, _ in seen] == ["expected", "current"]
    threads = {thread for _, thread in seen}
    assert len(threads) == 1 and loop_thread not in threads, "one hand-off, off the loop"


async def test_reads_in_turn_stop_at_the_first_error_and_await_coroutines_on_the_loop() -> None:
    called: list[str] = []

    def failing(x: int) -> int:
        called.append("first")
        raise ValueError("provider down")

    def never(x: int) -> int:
        called.append("second")
        return x

    outcomes = await call_adapter_in_turn((failing, never), 1)
    assert len(outcomes) == 1 and isinstance(outcomes[0].error, ValueError) and called == ["first"]

    loop_thread = threading.get_ident()

    async def on_loop(x: int) -> int:
        assert threading.get_ident() == loop_thread
        return x * 10

    def broken(x: int) -> int:
        raise KeyError("gone")

    one, two = await call_adapter_in_turn((on_loop, broken), 2)
    assert one.value == 20 and isinstance(two.error, KeyError)
    assert await call_adapter_in_turn((), 3) == [], "nothing to call: no outcome, no hand-off"


async def test_an_error_kept_in_an_outcome_says_where_the_adapter_raised_it() -> None:
    """Its frames are not kept (``frames_dropped``), where they were is: also for a plain call
    among coroutines, whose error is raised in its worker thread."""

    async def on_loop(x: int) -> int:
        return x

    def read_the_provider(x: int) -> int:
        raise KeyError("vip")

    for fns in ((read_the_provider,), (on_loop, read_the_provider)):
        error = (await call_adapter_in_turn(fns, 1))[-1].error
        assert isinstance(error, KeyError)
        text = "".join(traceback.format_exception(error))
        assert "in read_the_provider" in text and __file__ in text, (fns, text)


async def test_outcomes_that_finish_while_the_loop_is_busy_reach_it_in_one_wake_up() -> None:
    """``DaemonThreadExecutor.run_soon``: calls that finish while the loop runs other code hand
    it their outcomes together (one ``call_soon_threadsafe``), errors included, each to its own
    awaiter; ``run_in_executor`` would wake the loop once per call."""
    executor = DaemonThreadExecutor(max_workers=4, name="test-outbox")
    loop = asyncio.get_running_loop()
    wake_ups: list[object] = []
    original = loop.call_soon_threadsafe

    def counting(callback: Callable[..., object], *args: Any, **kwargs: Any) -> asyncio.Handle:
        wake_ups.append(callback)
        return original(callback, *args, **kwargs)

    def answer(i: int) -> int:
        if i == 3:
            raise ValueError("provider down for 3")
        return i * 10

    calls = 8
    finished = threading.Semaphore(0)

    def counted(i: int) -> Callable[[], int]:
        def call() -> int:
            try:
                return answer(i)
            finally:
                finished.release()

        return call

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        futures = [executor.run_soon(counted(i)) for i in range(calls)]
        for _ in range(calls):  # the loop is busy (blocked here) while every call finishes
            assert finished.acquire(timeout=10), "a call never ran"
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        loop.call_soon_threadsafe = original  # type: ignore[method-assign]
        executor.shutdown()
    assert [o if isinstance(o, int) else str(o) for o in outcomes] == [
        0,
        10,
        20,
        "provider down for 3",
        40,
        50,
        60,
        70,
    ]
    assert len(wake_ups) == 1, f"{len(wake_ups)} wake-ups for {calls} calls finished together"


async def test_a_call_cancelled_before_a_worker_takes_it_never_runs() -> None:
    executor = DaemonThreadExecutor(max_workers=1, name="test-cancel")
    release = threading.Event()
    ran: list[str] = []

    def blocking() -> str:
        release.wait(10)
        ran.append("first")
        return "first"

    def queued() -> str:
        ran.append("second")
        return "second"

    first = executor.run_soon(blocking)
    second = executor.run_soon(queued)  # waits: the only worker is busy
    second.cancel()
    release.set()
    assert await first == "first"
    third = executor.run_soon(lambda: "third")  # runs after the cancelled one was passed over
    assert await third == "third"
    executor.shutdown()
    assert ran == ["first"]


async def test_run_soon_runs_every_call_while_workers_come_and_go() -> None:
    """Bursts of more calls than workers from the loop, with pauses long enough for idle workers
    to retire between them: every call runs once, in a daemon thread, and its awaiter gets its
    value (the race of a call put as a worker's wait ends is hit many times here)."""
    executor = DaemonThreadExecutor(max_workers=3, name="test-churn", idle_seconds=0.002)
    daemons: list[bool] = []

    def call(value: int) -> int:
        daemons.append(threading.current_thread().daemon)
        return value

    for burst in range(150):
        size = 1 + burst % 12
        got = await asyncio.wait_for(
            asyncio.gather(*(executor.run_soon(functools.partial(call, i)) for i in range(size))), 10
        )
        assert got == list(range(size)), f"burst {burst}"
        await asyncio.sleep(0.001 * (burst % 8))  # sometimes every worker retires
    assert len(daemons) == sum(1 + b % 12 for b in range(150)) and all(daemons)
    executor.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.run_soon(lambda: 1)


@pytest.mark.parametrize("way", ["run_soon", "submit"])
async def test_a_call_that_raised_leaves_nothing_for_the_garbage_collector(way: str) -> None:
    """The error a worker hands over is kept by its future, which the worker's frame holds: with
    the error's frames kept, each failed call would be a reference cycle."""
    executor = DaemonThreadExecutor(max_workers=1, name="test-raised")

    def fails() -> None:
        raise ValueError("the provider said no")

    try:
        with collector_finds() as found:
            for _ in range(5):
                with pytest.raises(ValueError, match="the provider said no"):
                    if way == "run_soon":
                        await executor.run_soon(fails)
                    else:
                        await asyncio.wrap_future(executor.submit(fails))
    finally:
        executor.shutdown()
    assert found.count(ValueError) == 0, f"failed calls left cycles: {found}"


async def test_shutdown_cancels_the_calls_still_queued() -> None:
    executor = DaemonThreadExecutor(max_workers=1, name="test-shutdown")
    release = threading.Event()
    running = executor.run_soon(lambda: release.wait(10))
    queued = executor.run_soon(lambda: "never")
    executor.shutdown()
    release.set()
    assert await running is True, "a running call is abandoned, not stopped: its outcome still comes"
    with pytest.raises(asyncio.CancelledError):
        await queued


def test_the_pool_keeps_nothing_of_a_loop_once_it_is_gone() -> None:
    """``run_soon``'s outbox per loop is kept weakly: a finished loop (a test's, a short
    ``asyncio.run``) is not held alive by the pool."""
    executor = DaemonThreadExecutor(max_workers=1, name="test-weak")

    async def once() -> int:
        return await executor.run_soon(lambda: 7)

    loop = asyncio.new_event_loop()
    assert loop.run_until_complete(once()) == 7
    gone = weakref.ref(loop)
    loop.close()
    del loop
    gc.collect()
    executor.shutdown()
    assert gone() is None, "the pool still holds the loop"
