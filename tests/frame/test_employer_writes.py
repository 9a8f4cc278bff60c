"""The employer's own writes (``EmployerWrites`` in resourceconsist/reconcile/finalizers.py;
docs/concepts.md, "Work proportional to change"): a pass that writes its employer goes on from the
write's answer, so the write's watch event, coming back with that answer's resourceVersion, has
nothing a pass has not seen and queues none; any other writer's change of the employer still
brings a pass. A real API server, a real manager; what each pass began from is noted as the pass
is called.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject, Resource
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.reconcile.finalizers import EmployerWrites
from resourceconsist.reconcile.podwriter import RecentWrites
from resourceconsist.runtime.manager import Manager, ManagerOptions
from resourceconsist.testing import Cluster, async_wait_for
from tests.frame.test_reconcile_steps import NS, Events, FakeApi


async def test_the_echo_of_our_employer_write_brings_no_pass_and_anothers_change_does(
    cluster: Cluster,
) -> None:
    # No pod: the only write of the first pass is the Service's clean finalizer.
    await cluster.service("svc", {"app": "nothing"})
    provider = FakeProvider()
    adapter = DemoAdapter(provider)
    manager = Manager(cluster.client, ManagerOptions(namespace=cluster.namespace))
    await manager.add(adapter)
    reconciler = manager.controllers[adapter.get_controller_name()].reconciler
    began: list[tuple[bool, bool]] = []  # per pass: (clean finalizer on, the test's label on)
    reconcile = reconciler.reconcile

    async def noted(key: str, **options: Any) -> Any:
        if key == f"{cluster.namespace}/svc":
            found = reconciler.employer_writes.current(cluster.namespace, "svc") or {"metadata": {}}
            meta = found["metadata"]
            began.append(
                (
                    wire.CLEAN_FINALIZER in (meta.get("finalizers") or []),
                    "touched" in (meta.get("labels") or {}),
                )
            )
        return await reconcile(key, **options)

    reconciler.reconcile = noted  # type: ignore[method-assign]
    await manager.start()
    try:

        async def echoed() -> bool:
            cached = reconciler.reader.get(kube.SERVICE, cluster.namespace, "svc") or {"metadata": {}}
            return wire.CLEAN_FINALIZER in (cached["metadata"].get("finalizers") or [])

        # The first pass wrote the finalizer and went on to the provider; its event reached the cache.
        await async_wait_for(echoed, timeout=20, message="the finalizer's event in the cache")
        await async_wait_for(lambda: f"{cluster.namespace}/svc" in provider.employers(), timeout=20)
        # Another writer changes the Service: its event comes after the echo, on the same watch.
        await cluster.patch(kube.SERVICE, "svc", {"metadata": {"labels": {"touched": "1"}}})
        await async_wait_for(lambda: any(t for _, t in began), timeout=20, message="a pass from the change")
        assert began == [(False, False), (True, True)], began
    finally:
        await manager.stop(timeout=5)


class HeldApi(FakeApi):
    """The in-memory API whose writes wait, once sent, until the test lets them be answered."""

    def __init__(self) -> None:
        super().__init__()
        self.sending = threading.Event()
        self.answer = threading.Event()

    def patch(self, res: Resource, namespace: str | None, name: str, body: Any, **options: Any) -> KubeObject:
        self.sending.set()
        if not self.answer.wait(10):
            raise TimeoutError("the test never let the write be answered")
        return super().patch(res, namespace, name, body, **options)


def _copy(version: str) -> KubeObject:
    return {"metadata": {"namespace": NS, "name": "svc", "resourceVersion": version}}


async def test_events_that_come_while_a_write_is_out_wait_for_its_answer() -> None:
    # The watch may bring a write's echo before its answer: each event of the employer that comes
    # while the write is out waits; the echo is dropped, any other is handed on, in order.
    api = HeldApi()
    api.put(kube.SERVICE, {"kind": "Service", "metadata": {"name": "svc"}})
    writes = EmployerWrites(api, kube.SERVICE, Events(), api, RecentWrites(kube.SERVICE))
    delivered: list[str] = []
    employer = api.get(kube.SERVICE, NS, "svc") or {}
    written = asyncio.create_task(writes.annotations(employer, {"a": "1"}))
    await async_wait_for(api.sending.is_set, timeout=10, message="the write sent")
    echo = str(api.rv + 1)  # the version the in-memory API gives the write
    for version in ("7", echo, "9"):
        assert writes.own_echo(_copy(version), lambda v=version: delivered.append(v))  # type: ignore[misc]
    api.answer.set()
    patched = await written
    assert patched is not None and patched["metadata"]["resourceVersion"] == echo
    assert delivered == ["7", "9"]
    # Nothing out, nothing noted: the next event is news.
    assert not writes.own_echo(_copy("10"), lambda: delivered.append("10"))


async def test_an_echo_after_its_answer_is_dropped_once_and_a_failed_write_hands_every_event_on() -> None:
    api = HeldApi()
    api.answer.set()
    api.put(kube.SERVICE, {"kind": "Service", "metadata": {"name": "svc"}})
    writes = EmployerWrites(api, kube.SERVICE, Events(), api, RecentWrites(kube.SERVICE))
    patched = await writes.annotations(api.get(kube.SERVICE, NS, "svc") or {}, {"a": "1"})
    assert patched is not None
    echo = patched["metadata"]["resourceVersion"]
    never: list[str] = []
    assert writes.own_echo(_copy(echo), lambda: never.append(echo))
    assert not writes.own_echo(_copy(echo), lambda: never.append(echo)), "an echo is dropped once"
    # Another writer's event first: the write's own event after it is news too (it cannot be
    # told from a copy carrying both changes).
    patched = await writes.annotations(api.get(kube.SERVICE, NS, "svc") or {}, {"a": "2"})
    assert patched is not None
    assert not writes.own_echo(_copy("100"), lambda: never.append("100"))
    assert not writes.own_echo(_copy(patched["metadata"]["resourceVersion"]), lambda: never.append("x"))
    assert never == []
    # A write that fails: every event that came meanwhile is handed on.
    api.answer.clear()
    api.refuse.add("svc")
    delivered: list[str] = []
    failing = asyncio.create_task(writes.annotations(api.get(kube.SERVICE, NS, "svc") or {}, {"a": "3"}))
    api.sending.clear()
    await async_wait_for(api.sending.is_set, timeout=10, message="the write sent")
    assert writes.own_echo(_copy(str(api.rv + 1)), lambda: delivered.append("echo-like"))
    api.answer.set()
    with pytest.raises(kube.Conflict):
        await failing
    assert delivered == ["echo-like"]
