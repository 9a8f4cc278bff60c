"""Lifecycle subscribers (docs/lifecycle-hooks.md, "Subscribers") on a real kube-apiserver + etcd:
a subscriber sees a pod's life in order (guarded, served, drained, released) and its Service's
convergence and deletion; one that raises and one that hangs beside it change nothing else; the
page's "ready → served" histogram example observes the pod; a full queue drops, counted.
"""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from resourceconsist.cluster import kube
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.hooks.subscribers import EVENTS, LifecycleEvent, LifecycleSubscriber, SubscriberBus
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, async_wait_for, finalizers

PAGE = Path(__file__).resolve().parents[2] / "docs" / "lifecycle-hooks.md"


class Recorder(LifecycleSubscriber):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    async def _note(self, event: LifecycleEvent) -> None:
        self.seen.append((event.what, event.employer, event.pod))

    pod_guarded = pod_served = pod_drained = pod_released = _note
    employer_converged = employer_failing = employer_deleted = _note

    def of(self, pod: str) -> list[str]:
        return [what for what, _, p in self.seen if p == pod]


class Raising(LifecycleSubscriber):
    def __init__(self) -> None:
        self.calls = 0

    def _boom(self, event: LifecycleEvent) -> None:
        self.calls += 1
        raise RuntimeError(f"subscriber bug on {event.what}")

    pod_guarded = pod_served = pod_drained = pod_released = _boom
    employer_converged = employer_failing = employer_deleted = _boom


class Hanging(LifecycleSubscriber):
    """Blocks its worker thread until released: slower than any timeout."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def pod_served(self, event: LifecycleEvent) -> None:
        self.release.wait(30)


def _example() -> Any:
    (block,) = [
        b for b in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S) if "class ReadyToServed" in b
    ]
    namespace: dict[str, Any] = {"__name__": "lifecycle_hooks_example"}
    exec(compile(block, str(PAGE), "exec"), namespace)
    return namespace["ReadyToServed"]


def _role_of(service: str, finalizer: str) -> str:
    """A finalizer by its role for ``service`` (the names hash the Service's name)."""
    roles = {
        lifecycle.lifecycle_finalizer(service): "<lifecycle>",
        lifecycle.guard_finalizer(service): "<guard>",
    }
    return roles.get(finalizer, finalizer)


async def _set_ready(cluster: Cluster, pod: str, ready: bool) -> None:
    """As a kubelet does: IP and the Ready condition with its transition time."""
    ip = cluster.ip_of(pod)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": stamp}
    body = {"status": {"podIP": ip, "podIPs": [{"ip": ip}], "conditions": [condition]}}
    await cluster.call(cluster.client.patch, kube.POD, cluster.namespace, pod, body, subresource="status")


async def test_a_subscriber_sees_a_pod_s_life_in_order_beside_a_raising_and_a_hanging_one(
    cluster: Cluster, run_manager: Any
) -> None:
    provider = FakeProvider()
    recorder, raising, hanging = Recorder(), Raising(), Hanging()
    key, pod = f"{cluster.namespace}/web", f"{cluster.namespace}/web-0"
    await cluster.service("web")
    await cluster.pod("web-0", {"app": "web"})
    try:
        async with run_manager(DemoAdapter(provider)) as manager:
            controller = manager.controllers["demo-controller"]
            controller.subscribers.timeout = 0.2
            histogram = _example()(manager.informers.reader(), manager.metrics.registry)
            for subscriber in (raising, hanging, histogram):
                manager.subscribe(subscriber)
            manager.subscribe(recorder)

            def server() -> Any:
                return provider.snapshot().get(key, {}).get("web-0")

            async def told(what: str) -> bool:
                return what in recorder.of(pod)

            await async_wait_for(lambda: told("pod_guarded"), timeout=30, message="web-0 guarded")
            await _set_ready(cluster, "web-0", True)
            await async_wait_for(lambda: told("pod_served"), timeout=30, message="web-0 served")
            assert server() is not None and server().weight == 100
            await _set_ready(cluster, "web-0", False)
            await async_wait_for(lambda: told("pod_drained"), timeout=30, message="web-0 drained")
            assert server().weight == 0
            await cluster.delete(kube.POD, "web-0")
            await async_wait_for(lambda: told("pod_released"), timeout=30, message="web-0 released")
            assert server() is None

            async def pod_gone() -> bool:
                return await cluster.get(kube.POD, "web-0") is None

            await async_wait_for(pod_gone, timeout=30, message="web-0 gone: nothing held it")
            await cluster.delete(kube.SERVICE, "web")

            async def employer_deleted() -> bool:
                return ("employer_deleted", key, "") in recorder.seen

            await async_wait_for(employer_deleted, timeout=30, message="web deleted")
            assert provider.snapshot() == {} and provider.vips == {}
            served = manager.metrics.registry.get_sample_value(
                "resourceconsist_pod_ready_to_served_seconds_count", {"controller": "demo-controller"}
            )
    finally:
        hanging.release.set()
    assert recorder.of(pod) == ["pod_guarded", "pod_served", "pod_drained", "pod_released"]
    employer = [what for what, k, p in recorder.seen if k == key and not p]
    assert employer[0] == "employer_converged" and employer[-1] == "employer_deleted"
    assert "employer_failing" not in employer
    assert raising.calls == len(recorder.seen), "the raising subscriber was called for every event"
    assert served == 1


async def test_a_raising_subscriber_changes_nothing_else(cluster: Cluster, run_manager: Any) -> None:
    """The same scenario with and without a raising subscriber ends in the same state."""
    ends = []
    for round_, subscribers in enumerate(([], [Raising()])):
        name = f"web{round_}"
        await cluster.service(name)
        await cluster.pod(f"{name}-0", {"app": name})
        await _set_ready(cluster, f"{name}-0", True)
        provider = FakeProvider()
        async with run_manager(DemoAdapter(provider)) as manager:
            for subscriber in subscribers:
                manager.subscribe(subscriber)

            async def served(name: str = name) -> bool:
                pod = await cluster.get(kube.POD, f"{name}-0")
                return lifecycle.lifecycle_finalizer(name) in finalizers(pod)

            await async_wait_for(served, timeout=30, message=f"{name}-0 served")
            pod = await cluster.get(kube.POD, f"{name}-0")
            servers = provider.snapshot()[f"{cluster.namespace}/{name}"]
            ends.append(
                (
                    sorted(_role_of(name, f) for f in finalizers(pod)),
                    sorted((k.replace(name, "<svc>"), s.traffic_on, s.weight) for k, s in servers.items()),
                    manager.controllers["demo-controller"].failures,
                )
            )
    assert ends[0] == ends[1]
    assert ends[1][2] == 0, "no pass failed"


async def test_a_full_queue_drops_and_counts_instead_of_waiting() -> None:
    drops: list[int] = []
    bus = SubscriberBus("c", maxsize=2, on_drop=lambda: drops.append(1))
    bus.add(Recorder())
    for _ in range(5):
        bus.publish("pod_served", "ns/web", "web-0")  # never awaits: the bus is not even started
    assert bus.dropped == 3 and len(drops) == 3


def test_every_event_is_a_subscriber_method_with_a_no_op_default() -> None:
    for what in EVENTS:
        assert getattr(LifecycleSubscriber(), what)(LifecycleEvent("c", what, "ns/e")) is None
