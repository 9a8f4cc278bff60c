"""The guard invariant (docs/concepts.md, "The guard"), checked from outside the frame.

For every employer and pod: whenever the provider may route the employer's traffic to the pod,
the pod carries the employer's guard or lifecycle finalizer. A ``DeletionWatch`` watches the
real API server and, on every pod DELETED event, asks the fake provider whether it still routes
to that pod: each such moment is an unguarded deletion. Faults are injected at several points
of a pass (before a call, "did it but reported failure", during removal), a pass is stopped in
the middle, and an employer is deleted by an adapter that drops every backend with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.adapter import Employee, ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.experimental.demo import (
    DEMO_QPS,
    DEMO_VIP,
    DemoAdapter,
    FakeProvider,
    RealServer,
    VipStatus,
)
from resourceconsist.reconcile import guard, reconciler
from resourceconsist.reconcile.memory import GuardMemo
from resourceconsist.reconcile.podwriter import EmployerEntry, PodIntent, PodWriter
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, WaitTimeout, async_wait_for, finalizers, wait_for

ENTRY = EmployerEntry(
    key="Service/ns/svc",
    lifecycle_finalizer=lifecycle.lifecycle_finalizer("svc"),
    guard_finalizer=lifecycle.guard_finalizer("svc"),
)
L, G = ENTRY.lifecycle_finalizer, ENTRY.guard_finalizer


def _pod(finalizers: list[str], entries: dict[str, str] | None = None, deleting: bool = False) -> KubeObject:
    meta: dict[str, Any] = {"name": "p", "finalizers": finalizers, "annotations": {}}
    if entries is not None:
        meta["annotations"][wire.AVAILABLE_CONDITIONS_ANNOTATION] = lifecycle.render_available_conditions(
            entries
        )
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


def _apply(pod: KubeObject, body: dict[str, Any] | None) -> KubeObject:
    if body is None:
        return pod
    meta = dict(pod["metadata"])
    meta["annotations"] = {**meta["annotations"], **body["metadata"].get("annotations", {})}
    if "finalizers" in body["metadata"]:
        meta["finalizers"] = body["metadata"]["finalizers"]
    return {"metadata": meta}


# -- the writer's rules, pure -----------------------------------------------------------------------


def test_the_guard_finalizer_is_the_lifecycle_hash_under_our_own_prefix() -> None:
    assert "guard.resource-consist.kusionstack.io/" + L.split("/", 1)[1] == G
    assert G != L


def test_adding_the_lifecycle_finalizer_adds_a_missing_entry() -> None:
    writer = PodWriter("ns", lambda n: None, ENTRY)  # type: ignore[arg-type,return-value]
    writer.swap("p", to_lifecycle=True)
    intent = writer._intents["p"]
    body, deferred = PodWriter._patch_for(_pod([G], entries={}), intent, ENTRY)
    after = _apply(_pod([G], entries={}), body)
    assert finalizers(after) == [L]
    assert lifecycle.expected_finalizers(after) == {ENTRY.key: L}
    assert not deferred


def test_an_entry_removal_waits_while_the_lifecycle_finalizer_stays() -> None:
    intent = PodIntent(remove_entries={ENTRY.key})
    pod = _pod([L], entries={ENTRY.key: L, "Service/ns/other": "x/y"})
    body, deferred = PodWriter._patch_for(pod, intent, ENTRY)
    assert deferred
    assert body is None, "nothing else to write: the entry stays with its finalizer"


def test_releasing_both_finalizers_lets_the_entry_go_in_the_same_write() -> None:
    intent = PodIntent(remove_entries={ENTRY.key}, remove_finalizers={L, G})
    body, deferred = PodWriter._patch_for(_pod([L, "x/keep"], entries={ENTRY.key: L}), intent, ENTRY)
    after = _apply(_pod([L, "x/keep"], entries={ENTRY.key: L}), body)
    assert not deferred
    assert finalizers(after) == ["x/keep"]
    assert lifecycle.expected_finalizers(after) == {}


@pytest.mark.parametrize(("has", "to_lifecycle"), [([L], False), ([G], True)])
def test_a_swap_on_a_deleting_pod_keeps_the_finalizer_it_has(has: list[str], to_lifecycle: bool) -> None:
    writer = PodWriter("ns", lambda n: None, ENTRY)  # type: ignore[arg-type,return-value]
    writer.swap("p", to_lifecycle=to_lifecycle)
    pod = _pod(has, entries={ENTRY.key: L}, deleting=True)
    body, _ = PodWriter._patch_for(pod, writer._intents["p"], ENTRY)
    assert finalizers(_apply(pod, body)) == has


def test_a_swap_on_a_live_pod_is_one_write_with_both_changes() -> None:
    writer = PodWriter("ns", lambda n: None, ENTRY)  # type: ignore[arg-type,return-value]
    writer.swap("p", to_lifecycle=False)
    pod = _pod([L, "x/keep"], entries={ENTRY.key: L})
    body, _ = PodWriter._patch_for(pod, writer._intents["p"], ENTRY)
    assert body is not None
    assert finalizers(_apply(pod, body)) == ["x/keep", G]


def test_a_pod_remembered_as_settled_is_read_again_once_its_event_arrives_mid_pass() -> None:
    # The last pass found p's finalizers matching SERVED; p lost its lifecycle finalizer since.
    # While no event of p has arrived the pass takes it as the last pass found it; once one has
    # (even during this pass), p is read again and its swap planned.
    pods = {"p": _pod([G], entries={ENTRY.key: L})}
    events: set[str] = set()
    reads: list[str] = []

    def pod_of(name: str) -> KubeObject | None:
        reads.append(name)
        return pods.get(name)

    last = GuardMemo(guarded={"p"}, settled={"p": guard.Verdict.SERVED})
    quiet = guard.GuardRecall(last, lambda: frozenset(events))
    writer = PodWriter("ns", lambda n: None, ENTRY)  # type: ignore[arg-type,return-value]
    guard.plan_after_calls({"p": guard.Verdict.SERVED}, {"p"}, ENTRY, pod_of, writer, quiet)
    assert reads == [] and not writer.planned("p"), "no event: taken as the last pass found it"
    assert quiet.now.settled == {"p": guard.Verdict.SERVED}, "and remembered for the next pass"

    events.add("p")
    woken = guard.GuardRecall(last, lambda: frozenset(events))
    guard.plan_after_calls({"p": guard.Verdict.SERVED}, {"p"}, ENTRY, pod_of, writer, woken)
    assert reads == ["p"] and writer.planned("p"), "its event arrived: read again, the swap planned"
    assert woken.now.settled == {}

    # A different verdict, or a full pass (None), reads the pod whatever its events.
    reads.clear()
    other = guard.GuardRecall(last, frozenset)
    routing = {"p": guard.Verdict.ROUTING}
    guard.plan_after_calls(routing, {"p"}, ENTRY, pod_of, PodWriter("ns", lambda n: None, ENTRY), other)  # type: ignore[arg-type,return-value]
    assert reads == ["p"] and other.now.settled == routing, (
        "read: it carries the guard alone, as ROUTING wants"
    )
    full = PodWriter("ns", lambda n: None, ENTRY)  # type: ignore[arg-type,return-value]
    served = {"p": guard.Verdict.SERVED}
    guard.plan_after_calls(served, {"p"}, ENTRY, pod_of, full, guard.GuardRecall(last, lambda: None))
    assert reads == ["p", "p"] and full.planned("p")


def test_a_pod_the_pass_wrote_is_not_remembered_for_the_next_pass() -> None:
    # A pod found guarded before the calls and released after them (or written at all) is read
    # again by the next pass, whether or not its write's event reached the cache by then.
    recall = guard.GuardRecall(None, lambda: None)
    recall.now.guarded |= {"released", "untouched"}
    recall.now.settled.update({"swapped": guard.Verdict.SERVED, "untouched": guard.Verdict.SERVED})
    kept = recall.found({"released", "swapped"})
    assert kept.guarded == {"untouched"}
    assert kept.settled == {"untouched": guard.Verdict.SERVED}


# -- against the real API server ------------------------------------------------------------------


class DeletionWatch:
    """Watches the namespace's pods on the real API server; on each DELETED event asks
    ``routes(pod)`` (the provider's view) and records the pods deleted while still routed."""

    def __init__(self, client: KubeClient, namespace: str, routes: Callable[[str], bool]) -> None:
        self.client, self.namespace, self.routes = client, namespace, routes
        self.deleted: list[str] = []
        self.unguarded: list[str] = []
        listing = client.list(kube.POD, namespace)
        self._stream = client.watch(kube.POD, namespace, listing["metadata"]["resourceVersion"])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._stream:
                if event.get("type") == "DELETED":
                    name = event["object"]["metadata"]["name"]
                    if self.routes(name):
                        self.unguarded.append(name)
                    self.deleted.append(name)
        except Exception:  # the stream is closed at the end of the test
            return

    def close(self) -> None:
        self._stream.close()
        self._thread.join(timeout=10)


def _routes(provider: FakeProvider) -> Callable[[str], bool]:
    def routes(pod: str) -> bool:
        return any(
            rs.traffic_on and rs.weight > 0
            for servers in provider.snapshot().values()
            for name, rs in servers.items()
            if name == pod
        )

    return routes


def _routing_already(provider: FakeProvider, cluster: Cluster, pod: str) -> None:
    """The provider holds the Service's VIP and routes to ``pod`` at weight 100, as a crashed
    controller could have left it."""
    skey = f"{cluster.namespace}/svc"
    provider.real_servers[skey] = {pod: RealServer(cluster.ip_of(pod), True, 100)}
    provider.vips[skey] = VipStatus(vip=DEMO_VIP, qps=DEMO_QPS)


async def _finalizers_of(cluster: Cluster, pod: str) -> list[str]:
    return finalizers(await cluster.get(kube.POD, pod))


class BlockingDemo(DemoAdapter):
    """Demo adapter whose update call for one pod does its work, then waits for ``release``."""

    def __init__(self, provider: FakeProvider, pod: str) -> None:
        super().__init__(provider)
        self.pod = pod
        self.inside = threading.Event()
        self.release = threading.Event()
        self.finalizers_during_call: list[list[str]] = []

    def update_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employee]
    ) -> tuple[list[Employee], list[Employee]]:
        done = super().update_employees(ctx, employer, to_update)
        if any(item.name == self.pod for item in to_update) and not self.release.is_set():
            # What the API server says while the provider already routes to the pod.
            assert ctx.writer is not None
            pod = ctx.writer.get_or_none(kube.POD, employer["metadata"]["namespace"], self.pod)
            self.finalizers_during_call.append(finalizers(pod))
            self.inside.set()
            self.release.wait(30)
        return done


async def test_the_guard_is_on_before_the_call_that_routes_and_holds_a_deleted_pod(
    cluster: Cluster, run_manager: Any, kube_client: KubeClient
) -> None:
    provider = FakeProvider()
    adapter = BlockingDemo(provider, "pod-1")
    watch = DeletionWatch(kube_client, cluster.namespace, _routes(provider))
    try:
        await cluster.service("svc")
        await cluster.pod("pod-1", {"app": "svc"})
        await cluster.set_status("pod-1", ready=False)
        async with run_manager(adapter):
            await async_wait_for(lambda: "pod-1" in provider.snapshot().get(f"{cluster.namespace}/svc", {}))
            await cluster.set_status("pod-1", ready=True)
            await async_wait_for(adapter.inside.is_set, timeout=20, message="the update call")
            assert adapter.finalizers_during_call == [[lifecycle.guard_finalizer("svc")]]
            # The provider routes now, the lifecycle finalizer is not on yet: delete the pod.
            await cluster.delete(kube.POD, "pod-1")
            pod = await cluster.get(kube.POD, "pod-1")
            assert pod is not None and pod["metadata"].get("deletionTimestamp"), "the guard holds the pod"
            adapter.release.set()

            async def gone() -> bool:
                return await cluster.get(kube.POD, "pod-1") is None

            await async_wait_for(gone, timeout=30, message="pod released after deregistration")
        assert watch.deleted == ["pod-1"]
        assert watch.unguarded == []
    finally:
        watch.close()


@pytest.mark.parametrize(
    "fault",
    [
        ("fail_next", "update_rs"),  # refused before doing anything
        ("report_failure_after_doing", "update_rs"),  # did it, said it failed: outcome unknown
        ("fail_next", "delete_rs"),  # removal refused
        ("report_failure_after_doing", "delete_rs"),  # removal done, reported failed
        ("fail_next", "query_rs"),  # the read of the provider's state fails
    ],
)
async def test_faults_at_each_point_of_a_pass_never_let_a_routed_pod_go(
    cluster: Cluster, run_manager: Any, kube_client: KubeClient, fault: tuple[str, str]
) -> None:
    provider = FakeProvider()
    skey = f"{cluster.namespace}/svc"
    watch = DeletionWatch(kube_client, cluster.namespace, _routes(provider))
    try:
        await cluster.service("svc")
        pods = [f"pod-{i}" for i in range(6)]
        for name in pods:
            await cluster.pod(name, {"app": "svc"})
            await cluster.set_status(name, ready=False)
        async with run_manager(DemoAdapter(provider)):
            await async_wait_for(lambda: len(provider.snapshot().get(skey, {})) == 6, timeout=30)
            getattr(provider, fault[0])(fault[1], times=3)
            for name in pods:
                await cluster.set_status(name, ready=True)
            # Delete half of the pods at once, while their registrations are being changed.
            for name in pods[:3]:
                await cluster.delete(kube.POD, name)

            async def converged() -> bool:
                servers = provider.snapshot().get(skey, {})
                if set(servers) != set(pods[3:]) or not all(s.traffic_on for s in servers.values()):
                    return False
                for name in pods[3:]:
                    if await _finalizers_of(cluster, name) != [lifecycle.lifecycle_finalizer("svc")]:
                        return False
                return all([await cluster.get(kube.POD, n) is None for n in pods[:3]])

            await async_wait_for(converged, timeout=60, message="converged after the fault")
        assert sorted(watch.deleted) == pods[:3]
        assert watch.unguarded == []
    finally:
        watch.close()


async def test_a_registration_found_without_its_guard_is_guarded_first(
    cluster: Cluster, run_manager: Any
) -> None:
    provider = FakeProvider()
    skey = f"{cluster.namespace}/svc"
    await cluster.service("svc")
    await cluster.pod("pod-1", {"app": "svc"})
    await cluster.set_status("pod-1", ready=False)
    # A crash between a call and its write left the provider routing to an unguarded pod.
    _routing_already(provider, cluster, "pod-1")
    provider.fail_next("update_rs", times=1000)  # traffic cannot be turned off for now
    async with run_manager(DemoAdapter(provider)) as manager:

        async def guarded() -> bool:
            return lifecycle.guard_finalizer("svc") in await _finalizers_of(cluster, "pod-1")

        await async_wait_for(guarded, timeout=20, message="the routed pod guarded")
        reconciler = manager.controllers["demo-controller"].reconciler
        await async_wait_for(lambda: reconciler.unguarded.get(skey) == 0, timeout=20)
        provider.clear_faults()
        await cluster.patch(kube.SERVICE, "svc", {"metadata": {"annotations": {"poke": "1"}}})

        async def held() -> bool:
            # The demo keeps a not-ready pod registered at weight 0: held by the guard alone.
            rs = provider.snapshot().get(skey, {}).get("pod-1")
            guard = [lifecycle.guard_finalizer("svc")]
            return rs is not None and not rs.traffic_on and await _finalizers_of(cluster, "pod-1") == guard

        await async_wait_for(held, timeout=30, message="traffic off, pod held by its guard")
        await cluster.delete(kube.POD, "pod-1")

        async def gone() -> bool:
            return await cluster.get(kube.POD, "pod-1") is None and not provider.snapshot().get(skey)

        await async_wait_for(gone, timeout=30, message="deregistered, then released")


async def test_a_pass_stopped_in_the_middle_leaves_the_pod_guarded_and_consistent(
    cluster: Cluster, run_manager: Any
) -> None:
    provider = FakeProvider()
    adapter = BlockingDemo(provider, "pod-1")
    await cluster.service("svc")
    await cluster.pod("pod-1", {"app": "svc"})
    await cluster.set_status("pod-1", ready=False)
    async with run_manager(adapter):
        await async_wait_for(lambda: "pod-1" in provider.snapshot().get(f"{cluster.namespace}/svc", {}))
        await cluster.set_status("pod-1", ready=True)
        await async_wait_for(adapter.inside.is_set, timeout=20, message="the update call")
    # The manager stopped mid-call (its timeout cut the pass); the provider routes to the pod.
    adapter.release.set()
    assert provider.snapshot()[f"{cluster.namespace}/svc"]["pod-1"].traffic_on
    pod = await cluster.get(kube.POD, "pod-1")
    assert lifecycle.guard_finalizer("svc") in finalizers(pod)
    for name in finalizers(pod):
        if name.startswith(wire.LIFECYCLE_FINALIZER_PREFIX + "/"):
            assert name in lifecycle.expected_finalizers(pod).values()
    async with run_manager(DemoAdapter(provider)):

        async def served() -> bool:
            return await _finalizers_of(cluster, "pod-1") == [lifecycle.lifecycle_finalizer("svc")]

        await async_wait_for(served, timeout=30, message="the next process finishes the pass")


@pytest.mark.parametrize("record", [False, True])
async def test_deleting_a_service_served_by_the_tutorial_adapter_releases_its_pods(
    cluster: Cluster, run_manager: Any, tmp_path: Path, record: bool, tutorial: dict[str, Any]
) -> None:

    class Recording(tutorial["FileAdapter"]):  # type: ignore[misc,name-defined]
        def follow_pod_ops_lifecycle(self) -> bool:
            return True

        def need_record_lifecycle_finalizer_condition(self) -> bool:
            return record

        def get_selected_employee_names(self, ctx: ReconcileContext, employer: KubeObject) -> list[str]:
            return [p["metadata"]["name"] for p in ctx.reader.pods_selected_by(employer)]

    backends = tutorial["BackendsDir"](tmp_path)
    await cluster.service("web")
    for name in ("web-0", "web-1", "web-2"):
        await cluster.pod(name, {"app": "web"})
        await cluster.set_status(name, ready=True)
    flz = lifecycle.lifecycle_finalizer("web")
    async with run_manager(Recording(backends)):

        async def all_served() -> bool:
            return all([flz in await _finalizers_of(cluster, n) for n in ("web-0", "web-1", "web-2")])

        await async_wait_for(all_served, timeout=30, message="pods served")
        await cluster.delete(kube.SERVICE, "web")

        async def service_gone() -> bool:
            return await cluster.get(kube.SERVICE, "web") is None

        await async_wait_for(service_gone, timeout=30, message="Service released and gone")
        for name in ("web-0", "web-1", "web-2"):
            pod = await cluster.get(kube.POD, name)
            ours = {flz, lifecycle.guard_finalizer("web")}
            assert not ours & set(finalizers(pod)), f"{name} still held: {finalizers(pod)}"
        assert backends.read(cluster.namespace, "web") is None
        # The pods can go now, at once.
        await cluster.delete(kube.POD, "web-0")

        async def pod_gone() -> bool:
            return await cluster.get(kube.POD, "web-0") is None

        await async_wait_for(pod_gone, timeout=10, message="an unguarded pod deletes at once")


async def _recorded(cluster: Cluster, names: str) -> bool:
    """The Service ``svc`` records that the pods ``names`` (comma-separated) got its entry."""
    svc = await cluster.get(kube.SERVICE, "svc")
    annotations = (svc or {}).get("metadata", {}).get("annotations", {})
    return bool(annotations.get(wire.EXPECTED_FINALIZER_ADDED_ANNOTATION) == names)


def _holds_entry(cluster: Cluster, pod: KubeObject | None) -> bool:
    """``pod`` holds the Service ``svc``'s entry in its expectedFinalizers."""
    entry = lifecycle.expected_finalizer_key("Service", cluster.namespace, "svc")
    return lifecycle.expected_finalizers(pod or {}).get(entry) == lifecycle.lifecycle_finalizer("svc")


async def _has_entry(cluster: Cluster, name: str) -> bool:
    """Pod ``name``, read now, holds the Service ``svc``'s entry in its expectedFinalizers."""
    return _holds_entry(cluster, await cluster.get(kube.POD, name))


async def test_record_mode_gives_a_pod_recreated_under_a_recorded_name_its_entry(
    cluster: Cluster, run_manager: Any
) -> None:
    provider = FakeProvider()
    await cluster.service("svc")
    await cluster.pod("pod-1", {"app": "svc"})
    await cluster.set_status("pod-1", ready=True)
    async with run_manager(DemoAdapter(provider)) as manager:  # records which pods got the entry
        await async_wait_for(lambda: _recorded(cluster, "pod-1"), timeout=20, message="entry recorded")
        await manager.stop_controller("demo-controller")
        # While no controller runs, the pod is force-removed and re-created under its name.
        await cluster.patch(kube.POD, "pod-1", {"metadata": {"finalizers": None}})
        await cluster.delete(kube.POD, "pod-1")

        async def gone() -> bool:
            return await cluster.get(kube.POD, "pod-1") is None

        await async_wait_for(gone, timeout=20)
        await cluster.pod("pod-1", {"app": "svc"})
        await cluster.set_status("pod-1", ready=True)
        await manager.add(DemoAdapter(provider))
        await async_wait_for(
            lambda: _has_entry(cluster, "pod-1"), timeout=20, message="the re-created pod's entry"
        )


async def test_record_mode_gives_back_an_entry_taken_off_a_pod_while_it_runs(
    cluster: Cluster, run_manager: Any
) -> None:
    # The passes after the first read only the pods whose events arrived (ReconcileContext.changed):
    # an entry taken off a recorded pod comes back from the pod's own event, not a full pass. The
    # pods are not ready (registered, guarded), so no lifecycle-finalizer swap brings the entry.
    await cluster.service("svc")
    for name in ("pod-1", "pod-2"):
        await cluster.pod(name, {"app": "svc"})
        await cluster.set_status(name, ready=False)
    async with run_manager(DemoAdapter(FakeProvider()), full_pass_every=3600.0):
        await async_wait_for(
            lambda: _recorded(cluster, "pod-1,pod-2"), timeout=20, message="entries recorded"
        )
        assert await _has_entry(cluster, "pod-1") and await _has_entry(cluster, "pod-2")
        # Someone empties pod-1's available conditions while the controller runs.
        gone = {wire.AVAILABLE_CONDITIONS_ANNOTATION: None}
        # The patch's answer is the pod as the patch left it: a read after it races the controller,
        # which may already have given the entry back.
        emptied = await cluster.patch(kube.POD, "pod-1", {"metadata": {"annotations": gone}})
        assert not _holds_entry(cluster, emptied)
        await async_wait_for(lambda: _has_entry(cluster, "pod-1"), timeout=20, message="the entry given back")
        assert await _has_entry(cluster, "pod-2")


async def test_finalizers_taken_off_pods_while_it_runs_come_back_from_the_pods_own_events(
    cluster: Cluster, run_manager: Any
) -> None:
    # The passes after the first take a pod with no event since the last pass as that pass found
    # it (guard.GuardRecall); a finalizer taken off comes back from the pod's own event, not a
    # full pass an hour later: the served pod's lifecycle finalizer, the routed pod's guard.
    await cluster.service("svc")
    await cluster.pod("served", {"app": "svc"})
    await cluster.set_status("served", ready=True)
    await cluster.pod("routed", {"app": "svc"})
    await cluster.set_status("routed", ready=False)
    lifecycle_finalizer, guard_finalizer = (
        lifecycle.lifecycle_finalizer("svc"),
        lifecycle.guard_finalizer("svc"),
    )

    async def carries(name: str, finalizer: str) -> bool:
        return finalizer in finalizers(await cluster.get(kube.POD, name) or {})

    async def both_held() -> bool:
        return await carries("served", lifecycle_finalizer) and await carries("routed", guard_finalizer)

    async with run_manager(DemoAdapter(FakeProvider()), full_pass_every=3600.0):
        await async_wait_for(
            both_held, timeout=20, message="the served pod's and the routed pod's finalizers"
        )
        for _ in range(3):  # steady passes: every pod remembered as settled
            await cluster.patch(kube.SERVICE, "svc", {"metadata": {"labels": {"poke": str(_)}}})
        for name in ("served", "routed"):
            taken = await cluster.patch(kube.POD, name, {"metadata": {"finalizers": None}})
            assert not finalizers(taken), (
                "the patch took them off (the controller may give them back at once)"
            )
        await async_wait_for(both_held, timeout=20, message="the finalizers given back")


async def test_the_unguarded_gauge_shows_a_routed_pod_that_cannot_be_guarded(
    cluster: Cluster, run_manager: Any
) -> None:
    provider = FakeProvider()
    skey = f"{cluster.namespace}/svc"
    await cluster.service("svc")
    await cluster.pod("pod-1", {"app": "svc"})
    await cluster.set_status("pod-1", ready=True)
    # Someone else's finalizer keeps the deleting pod; nothing can be added to it any more.
    await cluster.patch(kube.POD, "pod-1", {"metadata": {"finalizers": ["example.com/hold"]}})
    await cluster.delete(kube.POD, "pod-1")
    _routing_already(provider, cluster, "pod-1")
    provider.fail_next("delete_rs", times=1000)
    async with run_manager(DemoAdapter(provider)) as manager:

        def gauge() -> float | None:
            return manager.metrics.registry.get_sample_value(
                "resourceconsist_unguarded_routing_pods", {"controller": "demo-controller"}
            )

        await async_wait_for(lambda: gauge() == 1, timeout=20, message="the gauge reporting the pod")
        provider.clear_faults()
        await cluster.patch(kube.SERVICE, "svc", {"metadata": {"annotations": {"poke": "1"}}})
        await async_wait_for(lambda: not provider.snapshot().get(skey), timeout=20, message="deregistered")
        await cluster.patch(kube.SERVICE, "svc", {"metadata": {"annotations": {"poke": "2"}}})
        await async_wait_for(lambda: gauge() == 0, timeout=20, message="the gauge back to 0")
    await cluster.patch(kube.POD, "pod-1", {"metadata": {"finalizers": None}})


class DeleteWaitsForTheRegistered(DemoAdapter):
    """Demo adapter that records ``pod`` as the API server holds it when its create call begins,
    and whose delete call in the same pass first waits (with a deadline) for ``pod`` to carry
    the lifecycle finalizer, recording whether it did."""

    def __init__(self, provider: FakeProvider, pod: str) -> None:
        super().__init__(provider)
        self.pod = pod
        self.at_create: list[KubeObject | None] = []
        self.served_before_delete: list[bool] = []

    def _read(self, ctx: ReconcileContext, employer: KubeObject) -> KubeObject | None:
        assert ctx.writer is not None
        return ctx.writer.get_or_none(kube.POD, employer["metadata"]["namespace"], self.pod)

    def create_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]
    ) -> tuple[list[Employee], list[Employee]]:
        if any(item.name == self.pod for item in to_create):
            self.at_create.append(self._read(ctx, employer))
        return super().create_employees(ctx, employer, to_create)

    def delete_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employee]
    ) -> tuple[list[Employee], list[Employee]]:
        if self.at_create and not self.served_before_delete:
            lifecycle_finalizer = lifecycle.lifecycle_finalizer(employer["metadata"]["name"])
            try:
                wait_for(
                    lambda: lifecycle_finalizer in finalizers(self._read(ctx, employer) or {}),
                    timeout=10,
                    message="the registered pod's lifecycle finalizer",
                )
                self.served_before_delete.append(True)
            except WaitTimeout:
                self.served_before_delete.append(False)
        return super().delete_employees(ctx, employer, to_delete)


async def test_a_registered_pods_lifecycle_finalizer_goes_out_once_confirmed_before_the_passs_later_calls(
    cluster: Cluster, run_manager: Any
) -> None:
    """One pass registers a Ready pod and deregisters another: the new pod's entry and guard are
    on before its create call, and its lifecycle finalizer is on before the delete call that
    follows it in the same pass (docs/concepts.md, "The guard")."""
    provider = FakeProvider()
    await cluster.service("svc")
    await cluster.pod("pod-old", {"app": "svc"})
    await cluster.set_status("pod-old", ready=True)
    async with run_manager(DemoAdapter(provider)):

        async def old_served() -> bool:
            return await _finalizers_of(cluster, "pod-old") == [L]

        await async_wait_for(old_served, timeout=30, message="pod-old served")
    # With no controller running: pod-old leaves the Service, pod-new joins it, Ready.
    await cluster.patch(kube.POD, "pod-old", {"metadata": {"labels": {"app": "other"}}})
    await cluster.pod("pod-new", {"app": "svc"})
    await cluster.set_status("pod-new", ready=True)
    adapter = DeleteWaitsForTheRegistered(provider, "pod-new")
    async with run_manager(adapter):

        async def settled() -> bool:
            new, old = await _finalizers_of(cluster, "pod-new"), await _finalizers_of(cluster, "pod-old")
            return new == [L] and old == []

        await async_wait_for(settled, timeout=60, message="pod-new served, pod-old released")
    [at_create] = adapter.at_create
    assert at_create is not None
    assert finalizers(at_create) == [G], "guarded, not yet served, when its create call began"
    assert L in lifecycle.expected_finalizers(at_create).values(), "the entry before the call"
    assert adapter.served_before_delete == [True], "served before the pass's delete call"


class PodsMoveWhileTheGuardWrites(DemoAdapter):
    """Demo adapter whose first expected read of the Service's pods, once it has built its items,
    turns ``ready`` Ready and creates ``late`` (selected by the Service) through the API server
    and waits until the controller's cache shows both, as a kubelet and a ReplicaSet would while
    the guard writes; it records which pods each create and update call carried, and whether
    each served."""

    def __init__(self, provider: FakeProvider, cluster: Cluster, ready: str, late: str) -> None:
        super().__init__(provider)
        self.cluster, self.ready, self.late = cluster, ready, late
        self.moved = False
        self.calls: list[tuple[str, dict[str, bool]]] = []

    def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        items = super().get_expected_employee(ctx, employer)
        if not self.moved and any(i.name == self.ready for i in items):
            self.moved = True
            client, namespace = self.cluster.client, self.cluster.namespace
            status = {
                "status": {
                    "podIP": self.cluster.ip_of(self.ready),
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            }
            client.patch(kube.POD, namespace, self.ready, status, subresource="status")
            body = {
                "metadata": {"name": self.late, "labels": {"app": "svc"}},
                "spec": {"containers": [{"name": "app", "image": "nginx"}]},
            }
            client.create(kube.POD, namespace, body)

            def cache_shows_both() -> bool:
                ready = ctx.reader.get(kube.POD, namespace, self.ready)
                conditions = (ready or {}).get("status", {}).get("conditions") or []
                return ctx.reader.get(kube.POD, namespace, self.late) is not None and any(
                    c["type"] == "Ready" and c["status"] == "True" for c in conditions
                )

            wait_for(cache_shows_both, timeout=10, message="the cache shows the Ready pod and the new one")
        return items

    def create_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]
    ) -> tuple[list[Employee], list[Employee]]:
        self.calls.append(("create", {i.name: i.serves() for i in to_create}))
        return super().create_employees(ctx, employer, to_create)

    def update_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employee]
    ) -> tuple[list[Employee], list[Employee]]:
        self.calls.append(("update", {i.name: i.serves() for i in to_update}))
        return super().update_employees(ctx, employer, to_update)


async def test_a_pod_turned_ready_while_the_guard_wrote_is_registered_serving_in_that_pass(
    cluster: Cluster, run_manager: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard's writes before the calls take time (seconds at 1000 pods); a pod that turned
    Ready meanwhile is registered as serving by that pass's create call, not as not ready and
    updated a pass later; a pod that came meanwhile, not guarded, is not registered by it, and
    the next pass guards it first (docs/concepts.md, "The guard")."""
    # Any guard write counts as long here: the test moves the pods inside the pass itself.
    monkeypatch.setattr(reconciler, "REPLAN_AFTER", 0.0)
    await cluster.service("svc")
    await cluster.pod("pod-a", {"app": "svc"})
    await cluster.set_status("pod-a", ready=False)
    await cluster.pod("pod-b", {"app": "svc"})
    await cluster.set_status("pod-b", ready=False)
    # The Service's load balancer is there already: the pass's first read of the pods is the
    # one its plan is made from (after an employer create they are read again: sync.read_sides).
    provider = FakeProvider()
    provider.put_vip("create_vip", f"{cluster.namespace}/svc", VipStatus(vip=DEMO_VIP, qps=DEMO_QPS))
    adapter = PodsMoveWhileTheGuardWrites(provider, cluster, ready="pod-a", late="pod-late")
    async with run_manager(adapter):

        async def converged() -> bool:
            return await _finalizers_of(cluster, "pod-a") == [L] and await _finalizers_of(
                cluster, "pod-late"
            ) == [G]

        await async_wait_for(converged, timeout=60, message="pod-a served, pod-late guarded")
    first, *later = adapter.calls
    assert first == ("create", {"pod-a": True, "pod-b": False}), (
        "pod-a registered serving in the pass that guarded it"
    )
    assert all("pod-a" not in called for _, called in later), "no later call for pod-a"
    assert ("create", {"pod-late": False}) in later, "pod-late registered by a later pass"
