"""``ReconcileContext.changed`` against the real control plane: the informers' events name the
employees that changed (the pods the frame wrote included, whose events bring no pass of the
writer but name them for its next one), a failed pass and the periodic full pass each bring a
full one, and the demo adapter's incremental items equal a full rebuild (docs/concepts.md, "Work
proportional to change")."""

from __future__ import annotations

import threading
from typing import Any

from resourceconsist.adapter import Employee, ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.controller import Controller
from resourceconsist.testing import Cluster, async_wait_for, finalizers


class Noting(DemoAdapter):
    """Demo adapter that notes each pass's ``ctx.changed``, its items, and a full rebuild's."""

    def __init__(self, provider: FakeProvider) -> None:
        super().__init__(provider)
        self.lock = threading.Lock()
        self.passes: list[tuple[frozenset[str] | None, list[Any], list[Any]]] = []

    def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        items = super().get_expected_employee(ctx, employer)
        fresh = ReconcileContext(reader=ctx.reader, controller=ctx.controller, employer_key=ctx.employer_key)
        full = super().get_expected_employee(fresh, employer)
        with self.lock:
            self.passes.append((ctx.changed, _items(items), _items(full)))
        return items

    def taken(self) -> list[tuple[frozenset[str] | None, list[Any], list[Any]]]:
        with self.lock:
            passes, self.passes = self.passes, []
        return passes


def _items(items: list[Employee]) -> list[Any]:
    return sorted((i.id, i.statuses.model_dump()) for i in items)


async def _settled(controller: Controller, cluster: Cluster, pods: list[str], ready: set[str]) -> None:
    """Every ready pod carries the lifecycle finalizer, every other one the guard, the
    controller's cache has seen every pod write (so no event is still on its way to name a pod
    in a later pass), and the controller has nothing left to do."""
    flz, guard = lifecycle.lifecycle_finalizer("web"), lifecycle.guard_finalizer("web")

    async def done() -> bool:
        listing = await cluster.call(cluster.client.list, kube.POD, cluster.namespace)
        held = {p["metadata"]["name"]: finalizers(p) for p in listing["items"]}
        cached = {
            p["metadata"]["name"]: p["metadata"]["resourceVersion"]
            for p in controller.reader.list(kube.POD, cluster.namespace)
        }
        return (
            all(((flz if n in ready else guard) in held.get(n, [])) for n in pods)
            and all(
                cached.get(p["metadata"]["name"]) == p["metadata"]["resourceVersion"]
                for p in listing["items"]
            )
            and len(controller.queue) == 0
            and not controller.queue.processing()
        )

    await async_wait_for(done, timeout=60, interval=0.1, message="pods guarded, queue idle")


async def test_one_changed_pod_is_named_alone_and_the_incremental_items_equal_a_full_rebuild(
    cluster: Cluster, run_manager: Any
) -> None:
    pods = [f"web-{i}" for i in range(6)]
    await cluster.service("web", {"app": "web"})
    for name in pods:
        await cluster.pod(name, {"app": "web"})
        await cluster.set_status(name)
    provider = FakeProvider()
    adapter = Noting(provider)
    async with run_manager(adapter) as manager:
        controller = manager.controllers["demo-controller"]
        await _settled(controller, cluster, pods, set(pods))
        assert adapter.taken()[0][0] is None, "the first pass is a full one"

        await cluster.set_status("web-2", ready=False)
        await _settled(controller, cluster, pods, set(pods) - {"web-2"})
        passes = adapter.taken()
        # One pass, from the readiness change. It names web-2 and the pods the last pass wrote,
        # whose events named them without bringing a pass; the event of its own swap of web-2's
        # finalizers brings none either (docs/concepts.md, "A write's echo").
        assert len(passes) == 1, passes
        changed = passes[0][0]
        assert changed is not None and "web-2" in changed and changed <= set(pods), changed
        assert all(items == full for _, items, full in passes)
        assert not provider.snapshot()[f"{cluster.namespace}/web"]["web-2"].traffic_on

        # A failed pass: the next one is full.
        provider.fail_next("update_rs")
        await cluster.set_status("web-3", ready=False)
        await _settled(controller, cluster, pods, set(pods) - {"web-2", "web-3"})
        changes = [changed for changed, _, _ in adapter.taken()]
        # web-3's readiness, and web-2: the event of the last pass's own write named it.
        assert changes[0] == frozenset({"web-2", "web-3"}), "the pass that failed"
        assert changes[1] is None, "the pass after the failure is full"

        # The periodic full pass, whatever changed.
        controller.reconciler.full_pass_every = 0.0
        await cluster.set_status("web-3", ready=True)
        await _settled(controller, cluster, pods, set(pods) - {"web-2"})
        passes = adapter.taken()
        assert passes and all(changed is None for changed, _, _ in passes)
        assert all(items == full for _, items, full in passes)
