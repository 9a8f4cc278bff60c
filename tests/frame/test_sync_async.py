"""The one rule for sync and async (resourceconsist.cancellation): ``call_adapter`` runs plain
functions off the loop and awaits coroutines on it, and nothing on the loop waits on a thread."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest
from kubernetes import client as k8s

from resourceconsist import kube
from resourceconsist.cache import CacheNotSynced, InformerFactory
from resourceconsist.cancellation import Cancellation, call_adapter, current_cancellation, running_pass
from resourceconsist.errors import ResourceConsistError
from resourceconsist.kube import KubeClient
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
