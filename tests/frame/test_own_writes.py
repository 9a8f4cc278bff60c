"""The controller's own writes (``RecentWrites`` in resourceconsist/reconcile/podwriter.py, used for
pods by the passes' ``PodWriter`` and the readiness gates' writes, and for employers by
``EmployerWrites`` in resourceconsist/reconcile/finalizers.py; docs/concepts.md, "Work
proportional to change"): a pass that writes an object goes on from the write's answer, so the
write's watch event, coming back with that answer's resourceVersion, has nothing that pass has
not seen and queues no pass of its employer; any other writer's change still brings a pass, and
a pod's echo is still news to the pod's other employers. Real API server and manager; what each
pass began from is noted as the pass is called. Events that come while a write is out wait for
its answer: tested on an in-memory API whose answers the test holds back.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject, Resource
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.reconcile.finalizers import EmployerWrites
from resourceconsist.reconcile.podwriter import RecentWrites
from resourceconsist.reconcile.reconciler import Reconciler
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.manager import Manager, ManagerOptions
from resourceconsist.testing import Cluster, async_wait_for
from tests.frame.test_reconcile_steps import NS, Events, FakeApi


def _marks(obj: KubeObject | None, mark: str) -> tuple[bool, bool]:
    """(``mark`` among the object's finalizers, the test's ``touched`` label on it)."""
    meta = (obj or {"metadata": {}})["metadata"]
    return mark in (meta.get("finalizers") or []), "touched" in (meta.get("labels") or {})


@contextlib.asynccontextmanager
async def _running(cluster: Cluster, note: Callable[[str, Reconciler], None]) -> AsyncIterator[Reconciler]:
    """A manager with the demo adapter on the test namespace, ``note(key, reconciler)`` called
    as each pass is, before it reads anything."""
    adapter = DemoAdapter(FakeProvider())
    manager = Manager(cluster.client, ManagerOptions(namespace=cluster.namespace))
    await manager.add(adapter)
    reconciler = manager.controllers[adapter.get_controller_name()].reconciler
    reconcile = reconciler.reconcile

    async def noted(key: str, **options: Any) -> Any:
        note(key, reconciler)
        return await reconcile(key, **options)

    reconciler.reconcile = noted  # type: ignore[method-assign]
    await manager.start()
    try:
        yield reconciler
    finally:
        await manager.stop(timeout=5)


def _cached_marks(reconciler: Reconciler, resource: Resource, key: str, mark: str) -> Callable[[], bool]:
    """Whether the controller's cache shows ``mark`` on the object ``namespace/name``: the
    event of the write that put it there came."""
    namespace, _, name = key.partition("/")
    return lambda: _marks(reconciler.reader.get(resource, namespace, name), mark)[0]


async def test_the_echo_of_our_employer_write_brings_no_pass_and_anothers_change_does(
    cluster: Cluster,
) -> None:
    # No pod: the only write of the first pass is the Service's clean finalizer.
    await cluster.service("svc", {"app": "nothing"})
    began: list[tuple[bool, bool]] = []  # per pass: (clean finalizer on, the test's label on)

    def note(key: str, reconciler: Reconciler) -> None:
        if key == f"{cluster.namespace}/svc":
            began.append(
                _marks(reconciler.employer_writes.current(cluster.namespace, "svc"), wire.CLEAN_FINALIZER)
            )

    async with _running(cluster, note) as reconciler:
        # The first pass wrote the finalizer and went on; the write's event reached the cache.
        echoed = _cached_marks(reconciler, kube.SERVICE, f"{cluster.namespace}/svc", wire.CLEAN_FINALIZER)
        await async_wait_for(echoed, timeout=20, message="the finalizer's event in the cache")
        # Another writer changes the Service: its event comes after the echo, on the same watch.
        await cluster.patch(kube.SERVICE, "svc", {"metadata": {"labels": {"touched": "1"}}})
        await async_wait_for(lambda: any(t for _, t in began), timeout=20, message="a pass from the change")
        assert began == [(False, False), (True, True)], began


async def test_the_echo_of_a_pod_write_brings_its_writer_no_pass_and_anothers_change_does(
    cluster: Cluster,
) -> None:
    # A pod not ready: the first pass guards it and registers it (one pod write), and writes the
    # Service's finalizer and records; no write after.
    await cluster.service("svc")
    await cluster.pod("web-0", {"app": "svc"})
    await cluster.set_status("web-0", ready=False)
    guard = lifecycle.guard_finalizer("svc")
    began: list[tuple[bool, bool]] = []  # per pass: (the pod guarded, the test's label on it)

    def note(key: str, reconciler: Reconciler) -> None:
        if key == f"{cluster.namespace}/svc":
            began.append(_marks(reconciler.recent.get(reconciler.reader, cluster.namespace, "web-0"), guard))

    async with _running(cluster, note) as reconciler:
        echoed = _cached_marks(reconciler, kube.POD, f"{cluster.namespace}/web-0", guard)
        await async_wait_for(echoed, timeout=20, message="the pod write's event in the cache")
        await cluster.patch(kube.POD, "web-0", {"metadata": {"labels": {"touched": "1"}}})
        await async_wait_for(lambda: any(t for _, t in began), timeout=20, message="a pass from the change")
        assert began == [(False, False), (True, True)], began


async def test_the_echo_of_a_pod_write_is_news_to_the_pods_other_employers(cluster: Cluster) -> None:
    # Service a serves web-0 first; then Service b, selecting it too, guards it: that write's echo
    # brings a pass of a (news: the pod changed), none of b (its own write).
    await cluster.service("a", {"app": "web"})
    await cluster.pod("web-0", {"app": "web"})
    await cluster.set_status("web-0", ready=False)
    b_guard = lifecycle.guard_finalizer("b")
    began: dict[str, list[tuple[bool, bool]]] = {"a": [], "b": []}  # (b's guard on, touched)

    def note(key: str, reconciler: Reconciler) -> None:
        pod = reconciler.recent.get(reconciler.reader, cluster.namespace, "web-0")
        began[key.rpartition("/")[2]].append(_marks(pod, b_guard))

    async with _running(cluster, note) as reconciler:
        a_echoed = _cached_marks(
            reconciler, kube.POD, f"{cluster.namespace}/web-0", lifecycle.guard_finalizer("a")
        )
        await async_wait_for(a_echoed, timeout=20, message="a's guard in the cache")
        await cluster.service("b", {"app": "web"})
        await async_wait_for(
            _cached_marks(reconciler, kube.POD, f"{cluster.namespace}/web-0", b_guard),
            timeout=20,
            message="b's guard in the cache",
        )
        await async_wait_for(
            lambda: (True, False) in began["a"], timeout=20, message="a's pass from b's write"
        )
        await cluster.patch(kube.POD, "web-0", {"metadata": {"labels": {"touched": "1"}}})
        await async_wait_for(
            lambda: all(any(t for _, t in began[s]) for s in ("a", "b")),
            timeout=20,
            message="passes from the change",
        )
        assert began["a"] == [(False, False), (True, False), (True, True)], began
        assert began["b"] == [(False, False), (True, True)], began


async def test_the_echo_of_a_gate_write_brings_its_writer_no_pass_and_anothers_change_does(
    cluster: Cluster,
) -> None:
    # A pod that carries svc's readiness gate, its containers ready: the first pass guards it,
    # registers it, swaps the guard for the lifecycle finalizer and sets the gate True. No
    # verdict reads the frame's gates (lifecycle.is_lifecycle_ready), so its echo is no news to svc.
    await cluster.service("svc")
    gate = lifecycle.readiness_gate("svc")
    await cluster.pod("web-0", {"app": "svc"}, gated_by=["svc"])
    await cluster.set_status("web-0", ready=False)
    await cluster.set_condition("web-0", "ContainersReady", True)

    def gate_on(pod: KubeObject | None) -> bool:
        return (lifecycle.pod_condition(pod or {}, gate) or {}).get("status") == "True"

    began: list[tuple[bool, bool]] = []  # per pass: (the gate True, the test's label on)

    def note(key: str, reconciler: Reconciler) -> None:
        if key == f"{cluster.namespace}/svc":
            pod = reconciler.recent.get(reconciler.reader, cluster.namespace, "web-0")
            began.append((gate_on(pod), _marks(pod, "")[1]))

    async with _running(cluster, note) as reconciler:
        await async_wait_for(
            lambda: gate_on(reconciler.reader.get(kube.POD, cluster.namespace, "web-0")),
            timeout=20,
            message="the gate's event in the cache",
        )
        await cluster.patch(kube.POD, "web-0", {"metadata": {"labels": {"touched": "1"}}})
        await async_wait_for(lambda: any(t for _, t in began), timeout=20, message="a pass from the change")
        assert began == [(False, False), (True, True)], began


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


async def test_events_that_come_while_a_write_is_out_wait_for_its_answer() -> None:
    # The watch may bring a write's echo before its answer: each event of the employer that comes
    # while the write is out waits; then each is handed on in order, the echo named as the
    # writer's own (the controller drops it), the others as news.
    api = HeldApi()
    api.put(kube.SERVICE, {"kind": "Service", "metadata": {"name": "svc"}})
    writes = EmployerWrites(api, kube.SERVICE, Events(), api, RecentWrites(kube.SERVICE))
    handed: list[tuple[str, str]] = []

    def event(version: str) -> None:
        writes.recent.event(api, NS, "svc", version, lambda by: handed.append((version, by)))

    employer = api.get(kube.SERVICE, NS, "svc") or {}
    written = asyncio.create_task(writes.annotations(employer, {"a": "1"}))
    await async_wait_for(api.sending.is_set, timeout=10, message="the write sent")
    echo = str(api.rv + 1)  # the version the in-memory API gives the write
    for version in ("7", echo, "9"):
        event(version)
    assert handed == [], "the events wait for the answer"
    api.answer.set()
    patched = await written
    assert patched is not None and patched["metadata"]["resourceVersion"] == echo
    assert handed == [("7", ""), (echo, f"{NS}/svc"), ("9", "")]
    # Nothing out: handed on at once; the echo was recognised once.
    event(echo)
    assert handed[-1] == (echo, "")


async def test_an_echo_after_its_answer_is_its_writers_and_a_failed_write_hands_every_event_on() -> None:
    api = HeldApi()
    api.answer.set()
    api.put(kube.SERVICE, {"kind": "Service", "metadata": {"name": "svc"}})
    writes = EmployerWrites(api, kube.SERVICE, Events(), api, RecentWrites(kube.SERVICE))
    handed: list[tuple[str, str]] = []

    def event(version: str) -> None:
        writes.recent.event(api, NS, "svc", version, lambda by: handed.append((version, by)))

    first = await writes.annotations(api.get(kube.SERVICE, NS, "svc") or {}, {"a": "1"})
    second = await writes.annotations(api.get(kube.SERVICE, NS, "svc") or {}, {"a": "2"})
    assert first is not None and second is not None
    one, two = first["metadata"]["resourceVersion"], second["metadata"]["resourceVersion"]
    # Another writer's change that came before the echoes is news; each echo is the writer's.
    event("100")
    event(one)
    event(two)
    assert handed == [("100", ""), (one, f"{NS}/svc"), (two, f"{NS}/svc")]
    # A write that found nothing to write (the copy carries it already) has no echo.
    assert await writes.annotations(api.get(kube.SERVICE, NS, "svc") or {}, {"a": "2"}) is not None
    # A write that fails: every event that came meanwhile is handed on as news.
    api.answer.clear()
    api.sending.clear()
    api.refuse.add("svc")
    failing = asyncio.create_task(writes.annotations(api.get(kube.SERVICE, NS, "svc") or {}, {"a": "3"}))
    await async_wait_for(api.sending.is_set, timeout=10, message="the write sent")
    event(str(api.rv + 1))
    api.answer.set()
    with pytest.raises(kube.Conflict):
        await failing
    assert handed[-1] == (str(api.rv + 1), "")
