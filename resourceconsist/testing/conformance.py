"""A provider-neutral conformance suite for adapters (docs/testing.md, "The conformance suite").

What every adapter written on the frame must keep, checked against the adapter's real (or
emulated) provider on a real kube-apiserver + etcd: the guard under provider faults (a pod never
leaves while its provider may route to it), the readiness gates (a gated pod turns Ready only
once the provider serves it), the drain (a deleted pod goes only after the provider let go),
orphans (what a Service deleted while the controller was down left at the provider is collected
and its pods released), ``explain`` (what the provider routes, in its words), the provider
budget (drains before registrations when the budget is short), and passes that go when they
end (no reference cycle holds a pass's context or items for the garbage collector).

An adapter author subclasses ``AdapterConformance`` in a test module and gives it a ``harness``
fixture returning a ``ProviderHarness``: how to build the adapter, how to make a Service it
handles and a pod its provider can serve, how to read what the provider routes to, and how to
inject a fault. The suite needs the kit's pytest plugin (``control_plane``, ``namespace``)::

    class TestMyAdapter(AdapterConformance):
        @pytest.fixture
        def harness(self) -> Iterator[ProviderHarness]:
            with MyProvider() as provider:
                yield MyHarness(provider)

The suite imports no adapter; the harness is the adapter's only way in.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal

try:
    import pytest
except ModuleNotFoundError as err:  # pragma: no cover - exercised by tests/api/test_production_imports.py
    raise ModuleNotFoundError(
        "the conformance suite needs the testing extra: pip install 'resourceconsist[testing]'",
        name=err.name,
    ) from err

from resourceconsist.adapter import Employee, Employer, ReconcileAdapter, ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.flow import budget
from resourceconsist.flow.budget import Priority
from resourceconsist.flow.cancellation import Cancellation
from resourceconsist.options import GarbageOptions, ManagerOptions, ProviderBudgetOptions
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing.cluster import Cluster, condition, finalizers
from resourceconsist.testing.controlplane import LocalControlPlane
from resourceconsist.testing.garbage import collector_finds
from resourceconsist.testing.wait import async_wait_for
from resourceconsist.wire import GateReason

#: The faults a harness injects: every provider call fails (``unavailable``); writes are carried
#: out but their answer is lost (``ambiguous``); every call takes 300 ms more (``slow``).
FaultKind = Literal["unavailable", "ambiguous", "slow"]
#: What a provider write did to a pod: took traffic away from it, or gave it some.
WriteKind = Literal["remove", "register"]


class ProviderHarness(ABC):
    """How the suite drives one adapter on its provider (see the module doc)."""

    #: The adapter's name, for messages.
    name: str = "adapter"

    @abstractmethod
    def adapter(self) -> ReconcileAdapter:
        """A new adapter on the provider (a second call: a restarted controller)."""

    @abstractmethod
    async def service(self, cluster: Cluster, name: str, *, drain_seconds: float = 0.0) -> None:
        """Create a Service the adapter handles, selecting ``app: <name>``, whose leaving pods'
        backends are drained for ``drain_seconds`` before removal."""

    @abstractmethod
    async def pod(self, cluster: Cluster, name: str, *, service: str, gate: bool = False) -> None:
        """Create a pod of ``service`` the provider can serve and report it ready as a kubelet
        would. ``gate``: it carries the Service's readiness gate (then its containers are ready
        and ``Ready`` waits for the gate)."""

    @abstractmethod
    async def set_healthy(self, cluster: Cluster, name: str, healthy: bool) -> None:
        """Make the provider's health checks of the pod pass or fail."""

    @abstractmethod
    def routes(self, cluster: Cluster, service: str) -> set[str]:
        """The pods the provider may route ``service``'s traffic to now (any registration)."""

    @abstractmethod
    def serves(self, cluster: Cluster, service: str) -> set[str]:
        """The pods the provider sends new traffic of ``service`` to now."""

    @abstractmethod
    def fault(self, kind: FaultKind) -> AbstractContextManager[None]:
        """Inject ``kind`` while the context is open."""

    @abstractmethod
    def failed_calls(self) -> int:
        """Provider calls that failed so far (a fault's doing)."""

    @abstractmethod
    def writes(self, cluster: Cluster) -> list[tuple[WriteKind, str]]:
        """The provider writes carried out so far, in order: (kind, pod)."""


async def kubelet_ready_pod(
    cluster: Cluster,
    name: str,
    labels: dict[str, str],
    *,
    gate: str | None = None,
    ip: str | None = None,
    annotations: dict[str, str] | None = None,
) -> None:
    """Create a pod and report it as a kubelet would once its containers run: ``Ready`` with its
    IP; with ``gate`` (a readiness gate it carries), ``ContainersReady`` while ``Ready`` waits."""
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "app"}]}
    if gate is not None:
        spec["readinessGates"] = [{"conditionType": gate}]
    body = {"metadata": {"name": name, "labels": labels, "annotations": annotations or {}}, "spec": spec}
    await cluster.call(cluster.client.create, kube.POD, cluster.namespace, body)
    await cluster.set_status(name, ready=gate is None, ip=ip)
    if gate is not None:
        await cluster.set_condition(name, "ContainersReady", True)


@dataclass
class GuardWatch:
    """Samples the provider's routes every 20 ms and on demand: a pod gone from the API server
    while its provider still routes to it is a violation of the guard."""

    cluster: Cluster
    harness: ProviderHarness
    service: str
    violations: list[str] = field(default_factory=list)
    samples: int = 0

    async def sample(self) -> None:
        routed = self.harness.routes(self.cluster, self.service)
        if not routed:
            self.samples += 1
            return
        pods = {p["metadata"]["name"] for p in await self.cluster.pods()}
        # Read the routes again after the pods: a pod that left after its backend went is no violation.
        still = self.harness.routes(self.cluster, self.service)
        self.violations += sorted((routed & still) - pods)
        self.samples += 1

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[GuardWatch]:
        stop = asyncio.Event()

        async def loop() -> None:
            while not stop.is_set():
                await self.sample()
                await asyncio.sleep(0.02)

        task = asyncio.create_task(loop())
        try:
            yield self
        finally:
            stop.set()
            await task


@dataclass
class Conformance:
    """What one conformance test works with: the namespace, the harness, and a manager runner."""

    cluster: Cluster
    harness: ProviderHarness

    @contextlib.asynccontextmanager
    async def manager(
        self, adapter: ReconcileAdapter | None = None, **options: Any
    ) -> AsyncIterator[Manager]:
        options.setdefault("namespace", self.cluster.namespace)
        options.setdefault("garbage", GarbageOptions(enabled=False))
        manager = Manager(self.cluster.client, ManagerOptions(**options))
        await manager.add(adapter or self.harness.adapter())
        await manager.start()
        try:
            yield manager
        finally:
            await manager.stop(timeout=5)

    async def setup(
        self, service: str, pods: list[str], *, drain_seconds: float = 0.0, gate: bool = False
    ) -> None:
        """The Service and its pods, made by the harness (ready, as a kubelet reports them)."""
        await self.harness.service(self.cluster, service, drain_seconds=drain_seconds)
        for name in pods:
            await self.harness.pod(self.cluster, name, service=service, gate=gate)

    async def finalizers(self, pod: str) -> list[str] | None:
        found = await self.cluster.get(kube.POD, pod)
        return None if found is None else finalizers(found)

    async def gone(self, pod: str) -> bool:
        return await self.cluster.get(kube.POD, pod) is None

    async def served(self, service: str, pods: list[str], timeout: float = 60.0) -> None:
        """Wait until the provider serves exactly ``pods`` and each carries the lifecycle finalizer."""
        held = lifecycle.lifecycle_finalizer(service)

        async def done() -> bool:
            if self.harness.serves(self.cluster, service) != set(pods):
                return False
            return all([held in (await self.finalizers(p) or []) for p in pods])

        await async_wait_for(
            done, timeout=timeout, interval=0.1, message=f"{self.harness.name} serves {pods}"
        )

    async def failures_after(self, before: int, count: int = 3) -> None:
        """Wait until the provider has failed ``count`` more calls (the adapter tried and met the fault)."""
        await async_wait_for(
            lambda: self.harness.failed_calls() >= before + count,
            timeout=60,
            message=f"{count} failed provider calls",
        )


def _queued(*priorities: Priority) -> int:
    """Provider requests waiting now, at these priorities, over every budget of the process."""
    return sum(account.queued().get(p, 0) for account in budget.budgets() for p in priorities)


async def _absent(cluster: Cluster, resource: kube.Resource, name: str) -> bool:
    return await cluster.get(resource, name) is None


async def _quiet(seconds: float) -> None:
    """Wait until no provider request has been asked for ``seconds`` (the passes that the last
    writes brought have ended)."""
    seen: list[float] = [-1.0, time.monotonic()]

    def still() -> bool:
        asked = sum(
            sum(account.snapshot().granted.values()) + sum(account.queued().values())
            for account in budget.budgets()
        )
        if asked != seen[0]:
            seen[:] = [asked, time.monotonic()]
        return time.monotonic() - seen[1] >= seconds

    await async_wait_for(still, timeout=60, interval=0.1, message=f"no provider request for {seconds:g}s")


class AdapterConformance:
    """The suite. Subclass it with a ``harness`` fixture (module doc); each test is one promise."""

    @pytest.fixture
    def conformance(
        self, control_plane: LocalControlPlane, namespace: str, harness: ProviderHarness
    ) -> Iterator[Conformance]:
        client = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
        try:
            yield Conformance(Cluster(client, namespace), harness)
        finally:
            client.close()
            budget.configure(ProviderBudgetOptions())

    async def test_served_pods_carry_the_lifecycle_finalizer_and_their_gate_opens(
        self, conformance: Conformance
    ) -> None:
        c = conformance.cluster
        pods = ["web-0", "web-1"]
        await conformance.setup("web", pods, gate=True)
        async with conformance.manager():
            await conformance.served("web", pods)
            gate = lifecycle.readiness_gate("web")

            async def gates_open() -> bool:
                found = [await c.get(kube.POD, p) for p in pods]
                return all(
                    (lifecycle.pod_condition(p or {}, gate) or {}).get("reason") == GateReason.SERVING
                    for p in found
                )

            await async_wait_for(gates_open, timeout=30, message="the gates True, ProviderServing")
            for name in pods:
                assert condition(await c.get(kube.POD, name), gate) == "True"

    async def test_a_gate_stays_closed_while_the_provider_does_not_serve_the_pod(
        self, conformance: Conformance
    ) -> None:
        c, h = conformance.cluster, conformance.harness
        gate = lifecycle.readiness_gate("web")
        await h.service(c, "web")
        await h.pod(c, "web-0", service="web", gate=True)
        await h.set_healthy(c, "web-0", False)
        async with conformance.manager():

            async def registered_not_serving() -> bool:
                pod = await c.get(kube.POD, "web-0")
                reason = (lifecycle.pod_condition(pod or {}, gate) or {}).get("reason")
                return "web-0" in h.routes(c, "web") and reason == GateReason.NOT_SERVING

            await async_wait_for(registered_not_serving, timeout=60, message="registered, gate False")
            assert "web-0" not in h.serves(c, "web"), "served while its health checks fail"
            assert condition(await c.get(kube.POD, "web-0"), "Ready") != "True", "Ready while not served"
            await h.set_healthy(c, "web-0", True)
            await conformance.served("web", ["web-0"])

            async def open_() -> bool:
                return condition(await c.get(kube.POD, "web-0"), gate) == "True"

            await async_wait_for(open_, timeout=30, message="the gate True once served")

    @pytest.mark.parametrize("kind", [None, "slow"])
    async def test_a_deleted_pod_leaves_only_after_the_provider_let_go(
        self, conformance: Conformance, kind: FaultKind | None
    ) -> None:
        c, h = conformance.cluster, conformance.harness
        pods = ["web-0", "web-1", "web-2"]
        await conformance.setup("web", pods, drain_seconds=1)
        async with conformance.manager():
            await conformance.served("web", pods)
            async with GuardWatch(c, h, "web").running() as watch:
                # "slow": every provider call takes 300 ms more.
                with h.fault(kind) if kind is not None else contextlib.nullcontext():
                    await c.delete(kube.POD, "web-1")
                    await async_wait_for(lambda: conformance.gone("web-1"), timeout=60, message="web-1 gone")
            assert watch.violations == [], f"pods gone while the provider routed to them: {watch.violations}"
            assert "web-1" not in h.routes(c, "web"), "web-1 still routed after it left"
            assert h.serves(c, "web") == {"web-0", "web-2"}, h.serves(c, "web")

    @pytest.mark.parametrize("kind", ["unavailable", "ambiguous"])
    async def test_the_guard_holds_under_provider_faults(
        self, conformance: Conformance, kind: FaultKind
    ) -> None:
        c, h = conformance.cluster, conformance.harness
        pods = ["web-0", "web-1"]
        await conformance.setup("web", pods)
        async with conformance.manager():
            await conformance.served("web", pods)
            async with GuardWatch(c, h, "web").running() as watch:
                before = h.failed_calls()
                with h.fault(kind):
                    await c.delete(kube.POD, "web-0")
                    if kind == "unavailable":
                        await conformance.failures_after(before)
                        # The provider could not be told: it still routes, so the pod stays.
                        assert "web-0" in h.routes(c, "web"), "the provider was told nothing"
                        held = set(await conformance.finalizers("web-0") or [])
                        ours = {lifecycle.guard_finalizer("web"), lifecycle.lifecycle_finalizer("web")}
                        assert held & ours, f"web-0 lost its guard while routed: {held}"
                    else:
                        await async_wait_for(
                            lambda: "web-0" not in h.routes(c, "web"), timeout=60, message="web-0 taken out"
                        )
                await async_wait_for(lambda: conformance.gone("web-0"), timeout=60, message="web-0 gone")
            assert watch.violations == [], f"pods gone while the provider routed to them: {watch.violations}"
            assert h.serves(c, "web") == {"web-1"}, h.serves(c, "web")

    async def test_a_deleted_service_lets_its_pods_go_only_after_the_provider_did(
        self, conformance: Conformance
    ) -> None:
        c, h = conformance.cluster, conformance.harness
        pods = ["web-0", "web-1"]
        await conformance.setup("web", pods)
        async with conformance.manager():
            await conformance.served("web", pods)
            async with GuardWatch(c, h, "web").running() as watch:
                await c.delete(kube.SERVICE, "web")
                await async_wait_for(
                    lambda: _absent(c, kube.SERVICE, "web"), timeout=60, message="the Service gone"
                )
                # Its pods are deleted now: nothing of the Service holds them.
                for name in pods:
                    await c.delete(kube.POD, name)
                for name in pods:
                    await async_wait_for(
                        functools.partial(conformance.gone, name), timeout=30, message=f"{name} gone"
                    )
            assert watch.violations == [], f"pods gone while the provider routed to them: {watch.violations}"
            assert h.routes(c, "web") == set(), "the provider still routes the deleted Service's traffic"

    async def test_what_a_service_deleted_while_down_left_is_collected(
        self, conformance: Conformance
    ) -> None:
        c, h = conformance.cluster, conformance.harness
        pods = ["web-0", "web-1"]
        await conformance.setup("web", pods)
        async with conformance.manager():
            await conformance.served("web", pods)
        # The controller is down; someone deletes the Service, stripping its finalizers.
        await c.patch(kube.SERVICE, "web", {"metadata": {"finalizers": None}})
        await c.delete(kube.SERVICE, "web")
        assert await c.get(kube.SERVICE, "web") is None
        assert h.routes(c, "web") == set(pods), "the provider still routes to the pods"
        async with conformance.manager(garbage=GarbageOptions(interval=None)):

            async def collected() -> bool:
                if h.routes(c, "web"):
                    return False
                held = [await conformance.finalizers(p) or [] for p in pods]
                ours = {lifecycle.lifecycle_finalizer("web"), lifecycle.guard_finalizer("web")}
                return not any(ours & set(f) for f in held)

            await async_wait_for(
                collected, timeout=60, message="the provider side collected, the pods released"
            )

    async def test_explain_says_what_the_provider_routes(self, conformance: Conformance) -> None:
        from resourceconsist.commands.explain import Explainer

        c, h = conformance.cluster, conformance.harness
        await h.service(c, "web")
        await h.pod(c, "web-0", service="web")
        adapter = h.adapter()
        async with conformance.manager(adapter):
            await conformance.served("web", ["web-0"])
            answer = await Explainer(c.client, [h.adapter()]).pod(c.namespace, "web-0")
        ours = [f for f in answer.finalizers if f.role != "other"]
        assert ours, "the pod's finalizer of the Service is explained"
        for found in ours:
            assert found.employers == [f"Service/{c.namespace}/web"], found
            assert found.provider_consulted, found
            assert [b.employee for b in found.provider] == ["web-0"], found
            assert found.provider[0].serving is True, found

    async def test_drains_go_before_registrations_when_the_budget_is_short(
        self, conformance: Conformance
    ) -> None:
        c, h = conformance.cluster, conformance.harness
        leaving, rolling = ("api", "auth"), ("shop", "cart")
        for service in (*leaving, *rolling):
            await h.service(c, service)
            await h.pod(c, f"{service}-old", service=service)
        async with conformance.manager(provider_budget=ProviderBudgetOptions(rate=50.0, burst=5)):
            for service in (*leaving, *rolling):
                await conformance.served(service, [f"{service}-old"])
            await _quiet(seconds=2.0)
            marker = len(h.writes(c))
            # The budget all but stops, and its last tokens are taken: what comes now queues.
            budget.configure(ProviderBudgetOptions(rate=0.01, burst=1))
            for account in budget.budgets():
                with contextlib.suppress(TimeoutError):
                    await asyncio.to_thread(
                        account.spend, Priority.READ, cancellation=Cancellation(), timeout=0.05
                    )
            # The new pods' passes queue first, the leaving pods' after them: first come, first
            # served would register before it drains.
            await asyncio.gather(*(h.pod(c, f"{s}-new", service=s) for s in rolling))
            await async_wait_for(
                lambda: _queued(Priority.READ, Priority.REGISTER) >= len(rolling),
                timeout=60,
                message="the new pods' passes queued",
            )
            await asyncio.gather(*(c.delete(kube.POD, f"{s}-old") for s in leaving))
            # At least one leaving pod's pass waits at its removal priority (another may have a
            # pass of its Service already waiting at a read's: it keeps its place).
            await async_wait_for(
                lambda: _queued(Priority.REMOVE_TRAFFIC) >= 1,
                timeout=60,
                message="a leaving pod's pass queued",
            )
            # A short budget from now on: the queue is served by priority.
            budget.configure(ProviderBudgetOptions(rate=3.0, burst=1))
            for service in leaving:
                await async_wait_for(
                    functools.partial(conformance.gone, f"{service}-old"),
                    timeout=120,
                    message=f"{service}-old gone",
                )
            for service in rolling:
                await conformance.served(service, [f"{service}-old", f"{service}-new"], timeout=120)
        writes = h.writes(c)[marker:]
        first_removal = {pod: i for i, (kind, pod) in reversed(list(enumerate(writes))) if kind == "remove"}
        assert {f"{s}-old" for s in leaving} <= set(first_removal), (
            f"a leaving pod was never drained: {writes}"
        )
        first_registration = min(
            (i for i, (kind, pod) in enumerate(writes) if kind == "register" and pod.endswith("-new")),
            default=None,
        )
        assert first_registration is not None, f"no registration seen in {writes}"
        assert min(first_removal.values()) < first_registration, f"a registration went first: {writes}"

    @pytest.mark.parametrize("kind", [None, "unavailable"])
    async def test_a_pass_leaves_nothing_for_the_garbage_collector(
        self, conformance: Conformance, kind: FaultKind | None
    ) -> None:
        """A pass's context and the adapter's items go when the pass ends, by reference counting,
        also while every provider call fails: a pass in a reference cycle waits for the garbage
        collector, which at thousands of pods costs seconds of CPU and holds megabytes meanwhile.
        An adapter's per-pass object kept in ``ctx.scratch`` may hold the context (the frame empties
        the scratch when the pass ends); an error kept in a frame that its own traceback holds is a
        cycle (``resourceconsist.errors.frames_dropped``)."""
        h = conformance.harness
        await conformance.setup("web", ["web-0", "web-1"])
        async with conformance.manager(resync_period=0.2) as manager:
            await conformance.served("web", ["web-0", "web-1"])
            (controller,) = manager.controllers.values()
            with h.fault(kind) if kind is not None else contextlib.nullcontext():
                if kind is not None:
                    await conformance.failures_after(h.failed_calls())
                with collector_finds() as found:
                    mark = controller.reconciles
                    await async_wait_for(
                        lambda: controller.reconciles >= mark + 10, timeout=60, message="ten more passes"
                    )
        held = found.count(ReconcileContext, Employee, Employer)
        assert held == 0, (
            f"ten passes of {h.name} left {held} contexts and items for the garbage collector (reference "
            f"cycles): {found}"
        )
