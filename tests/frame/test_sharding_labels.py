"""Pods selected by the API server (docs/scaling.md, "Pods selected by the API server"), on a real
API server: with the employer label, each shard is sent only the pods labelled for its Services
(the label written by the shard where no webhook stamped it), and a pod never looks gone to its
owner because its label changed: a pod whose label is taken off stays served and is labelled
again, a pod relabelled into another shard's Service is labelled for it by the sweep, and a fleet
served before the label was on is labelled, marks included, before any pass runs on it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.rules import lifecycle, marks
from resourceconsist.runtime.manager import Manager
from resourceconsist.runtime.sharding import podlabels
from resourceconsist.runtime.sharding.ring import HashRing, hash_key, shard_label
from resourceconsist.testing import Cluster, LocalControlPlane, async_wait_for, finalizers
from tests.frame.test_sharding_pods import _replica as sharded_replica

RING = "labels"


def _replica(cluster: Cluster, shard: str, *, label: bool = True) -> Manager:
    return sharded_replica(cluster, shard, ring=RING, pod_employer_label=label)


def _cached(manager: Manager) -> dict[str, KubeObject]:
    return {p["metadata"]["name"]: p for p in manager.informers.informer(kube.POD).store.list()}


def _seen_by(manager: Manager) -> set[str]:
    """Every pod the replica's pod informer decodes from now on (its ``keep`` sees each one)."""
    informer = manager.informers.informer(kube.POD)
    keep = informer.keep
    assert keep is not None
    seen: set[str] = set()

    def recording(pod: KubeObject) -> bool:
        seen.add(pod["metadata"]["name"])
        return keep(pod)

    informer.keep = recording
    return seen


async def _labels(cluster: Cluster) -> dict[str, str | None]:
    listing = await cluster.call(cluster.client.list, kube.POD, cluster.namespace)
    return {p["metadata"]["name"]: marks.employer_label(p) for p in listing["items"]}


async def _start(replicas: dict[str, Manager], provider: FakeProvider) -> None:
    for manager in replicas.values():
        await manager.add(DemoAdapter(provider))
        await manager.start()


async def _stop(replicas: dict[str, Manager]) -> None:
    for manager in replicas.values():
        await manager.stop(timeout=5)


def _placed_apart(cluster: Cluster, shards: tuple[str, str]) -> tuple[str, str]:
    """A Service name the ring places on each of the two shards."""
    ring = HashRing(set(shards))
    names = [f"svc-{i}" for i in range(100)]
    where = {n: ring.shard_of(hash_key("v1", "Service", cluster.namespace, n)) for n in names}
    return next(n for n in names if where[n] == shards[0]), next(n for n in names if where[n] == shards[1])


async def _serve(cluster: Cluster, pods_of: dict[str, list[str]], labelled: set[str] = frozenset()) -> None:
    for service, pods in pods_of.items():
        await cluster.service(service)
        for pod in pods:
            labels = {"app": service, **({wire.EMPLOYER_LABEL: service} if pod in labelled else {})}
            await cluster.pod(pod, labels)
            await cluster.set_status(pod, ready=True)


def _served(provider: FakeProvider, cluster: Cluster, pods_of: dict[str, list[str]]) -> Callable[[], bool]:
    return lambda: all(set(p) <= provider.serving(f"{cluster.namespace}/{s}") for s, p in pods_of.items())


async def test_each_shard_is_sent_only_the_pods_labelled_for_its_services(cluster: Cluster) -> None:
    provider = FakeProvider()
    shards = ("shard-a", "shard-b")
    a, b = _placed_apart(cluster, shards)
    pods_of = {a: [f"{a}-0", f"{a}-1"], b: [f"{b}-0", f"{b}-1"]}
    # One pod comes labelled, as the webhook stamps it; the shards label the others.
    await _serve(cluster, pods_of, labelled={f"{a}-0"})
    await cluster.pod("stray", {"app": "nobody"})
    replicas = {shard: _replica(cluster, shard) for shard in shards}
    await _start(replicas, provider)
    try:
        await async_wait_for(_served(provider, cluster, pods_of), timeout=60, message="every pod served")
        labels = await _labels(cluster)
        assert labels == {**{p: s for s, ps in pods_of.items() for p in ps}, "stray": None}
        await async_wait_for(
            lambda: (
                set(_cached(replicas["shard-a"])) == set(pods_of[a])
                and set(_cached(replicas["shard-b"])) == set(pods_of[b])
            ),
            timeout=30,
            message="each shard caching its Service's pods",
        )
        seen = {shard: _seen_by(manager) for shard, manager in replicas.items()}
        # Every pod changes; each shard is sent the changes of its own pods only.
        for pod in [*pods_of[a], *pods_of[b], "stray"]:
            await cluster.patch(kube.POD, pod, {"metadata": {"annotations": {"touched": "yes"}}})

        def touched(manager: Manager, pods: list[str]) -> bool:
            cached = _cached(manager)
            return all((cached[p]["metadata"].get("annotations") or {}).get("touched") == "yes" for p in pods)

        await async_wait_for(
            lambda: touched(replicas["shard-a"], pods_of[a]) and touched(replicas["shard-b"], pods_of[b]),
            timeout=30,
            message="the changes in each shard's cache",
        )
        assert seen["shard-a"] <= set(pods_of[a]), seen
        assert seen["shard-b"] <= set(pods_of[b]), seen
        assert replicas["shard-a"].informers.informer(
            kube.POD
        ).label_selector == marks.employer_label_selector([a])
        assert replicas["shard-b"].informers.informer(
            kube.POD
        ).label_selector == marks.employer_label_selector([b])
    finally:
        await _stop(replicas)


async def test_a_pod_whose_label_is_taken_off_stays_served_and_is_labelled_again(cluster: Cluster) -> None:
    provider = FakeProvider()
    pods_of = {"web": ["web-0", "web-1"]}
    await _serve(cluster, pods_of)
    replicas = {"shard-a": _replica(cluster, "shard-a")}
    await _start(replicas, provider)
    lost: list[str] = []
    manager = replicas["shard-a"]

    async def watch() -> None:
        # The pod never leaves the owner's cache, and never loses its finalizer.
        while True:
            if "web-0" not in _cached(manager):
                lost.append("cache")
            pod = await cluster.get(kube.POD, "web-0")
            if pod is None or lifecycle.lifecycle_finalizer("web") not in finalizers(pod):
                lost.append("finalizer")
            await asyncio.sleep(0.02)

    try:
        await async_wait_for(_served(provider, cluster, pods_of), timeout=60, message="every pod served")
        watcher = asyncio.create_task(watch())
        try:
            await cluster.patch(kube.POD, "web-0", {"metadata": {"labels": {wire.EMPLOYER_LABEL: None}}})

            async def labelled_again() -> bool:
                return (await _labels(cluster))["web-0"] is not None

            await async_wait_for(labelled_again, timeout=30, message="web-0 labelled again")
            controller = next(iter(manager.controllers.values()))
            passes = controller.reconciles
            controller.queue.add(f"{cluster.namespace}/web")
            await async_wait_for(lambda: controller.reconciles > passes, timeout=30, message="a pass")
        finally:
            watcher.cancel()
        assert (await _labels(cluster))["web-0"] == "web"
        assert lost == []
        assert provider.calls["delete_rs"] == 0, "no pod was deregistered"
        assert _served(provider, cluster, pods_of)()
    finally:
        await _stop(replicas)


@pytest.mark.parametrize("by", ["the label watch", "the sweep"])
async def test_a_pod_relabelled_into_another_shards_service_is_labelled_for_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, by: str
) -> None:
    # Either the shard that sees the pod's labels change labels it at once, or (that watch
    # stopped: an event missed) the sweep of the shard whose Service now selects it does.
    monkeypatch.setattr(podlabels, "SWEEP_INTERVAL", 0.5 if by == "the sweep" else 3600.0)
    provider = FakeProvider()
    shards = ("shard-a", "shard-b")
    a, b = _placed_apart(cluster, shards)
    pods_of = {a: [f"{a}-0", f"{a}-1"], b: [f"{b}-0"]}
    await _serve(cluster, pods_of)
    replicas = {shard: _replica(cluster, shard) for shard in shards}
    await _start(replicas, provider)
    try:
        await async_wait_for(_served(provider, cluster, pods_of), timeout=60, message="every pod served")
        if by == "the sweep":
            for manager in replicas.values():
                await _labeller(manager).stop()
        # The pod moves from a's selector to b's: b's shard was never sent it, a's still is.
        await cluster.patch(kube.POD, f"{a}-1", {"metadata": {"labels": {"app": b}}})
        moved = {a: [f"{a}-0"], b: [f"{b}-0", f"{a}-1"]}
        await async_wait_for(_served(provider, cluster, moved), timeout=60, message=f"{a}-1 served by {b}")
        assert (await _labels(cluster))[f"{a}-1"] == wire.EMPLOYER_LABEL_SHARED

        async def released() -> bool:
            pod = await cluster.get(kube.POD, f"{a}-1")
            return pod is not None and lifecycle.lifecycle_finalizer(a) not in finalizers(pod)

        await async_wait_for(released, timeout=30, message=f"{a}'s finalizer off {a}-1")
    finally:
        await _stop(replicas)


async def test_a_fleet_served_before_the_label_was_on_is_labelled_marks_included(cluster: Cluster) -> None:
    provider = FakeProvider()
    pods_of = {"web": ["web-0", "web-1", "web-2"]}
    await _serve(cluster, pods_of)
    before = {"shard-a": _replica(cluster, "shard-a", label=False)}
    await _start(before, provider)
    await async_wait_for(_served(provider, cluster, pods_of), timeout=60, message="every pod served")
    await _stop(before)
    # While no controller runs, a pod leaves the Service's selector: only its marks name it.
    await cluster.patch(kube.POD, "web-2", {"metadata": {"labels": {"app": "elsewhere"}}})
    after = {"shard-a": _replica(cluster, "shard-a")}
    await _start(after, provider)
    try:

        async def released() -> bool:
            pod = await cluster.get(kube.POD, "web-2")
            return pod is not None and lifecycle.lifecycle_finalizer("web") not in finalizers(pod)

        await async_wait_for(released, timeout=60, message="the unselected pod released")
        labels = await _labels(cluster)
        assert labels == {"web-0": "web", "web-1": "web", "web-2": "web"}
        assert _served(provider, cluster, {"web": ["web-0", "web-1"]})()
        assert "web-2" not in provider.serving(f"{cluster.namespace}/web")
    finally:
        await _stop(after)


async def test_a_pod_created_without_the_label_is_labelled_at_once_not_at_the_sweep(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No sweep within the test: only the shards' watches of unlabelled pods can label them.
    monkeypatch.setattr(podlabels, "SWEEP_INTERVAL", 3600.0)
    provider = FakeProvider()
    shards = ("shard-a", "shard-b")
    a, b = _placed_apart(cluster, shards)
    await cluster.service(a, {"app": a})
    await cluster.service(b, {"tier": b})
    replicas = {shard: _replica(cluster, shard) for shard in shards}
    await _start(replicas, provider)
    try:

        async def placed() -> bool:
            listing = await cluster.call(cluster.client.list, kube.SERVICE, cluster.namespace)
            on = {s["metadata"]["name"]: (s["metadata"].get("labels") or {}) for s in listing["items"]}
            return on[a].get(shard_label(RING)) == shards[0] and on[b].get(shard_label(RING)) == shards[1]

        await async_wait_for(placed, timeout=30, message="each Service on its shard")
        pod_caches = [r.informers.informer(kube.POD) for r in replicas.values()]
        await async_wait_for(
            lambda: all(i.has_synced and i.current for i in pod_caches),
            timeout=30,
            message="the pods listed",
        )
        # Pods created past the webhook, after the shards' lists: one of each Service's, one
        # both select (each shard labels it for its own: the second write widens to Shared),
        # one no Service selects.
        new = {
            f"{a}-0": {"app": a},
            f"{b}-0": {"tier": b},
            "both-0": {"app": a, "tier": b},
            "stray": {"app": "x"},
        }
        for pod, labels in new.items():
            await cluster.pod(pod, labels)
            await cluster.set_status(pod, ready=True)
        now = {a: [f"{a}-0", "both-0"], b: [f"{b}-0", "both-0"]}
        await async_wait_for(_served(provider, cluster, now), timeout=30, message="the new pods served")
        labels = await _labels(cluster)
        assert labels == {f"{a}-0": a, f"{b}-0": b, "both-0": wire.EMPLOYER_LABEL_SHARED, "stray": None}
        # One write per pod: the first shard to see both-0 labels it for both Services.
        writes = {shard: _labeller(r).labelled for shard, r in replicas.items()}
        assert sum(writes.values()) == 3, writes
    finally:
        await _stop(replicas)


def _labeller(manager: Manager) -> podlabels.PodLabeller:
    assert manager.sharding is not None and manager.sharding.labeller is not None
    return manager.sharding.labeller


async def test_a_new_service_selecting_another_shards_pods_is_sent_them_at_once(
    cluster: Cluster, control_plane: LocalControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No sweep within the test: the shard that watches the pods labels them when it sees the
    # new Service, with no LIST per Service.
    monkeypatch.setattr(podlabels, "SWEEP_INTERVAL", 3600.0)
    provider = FakeProvider()
    shards = ("shard-a", "shard-b")
    a, b = _placed_apart(cluster, shards)
    pods_of = {a: [f"{a}-0", f"{a}-1"]}
    await _serve(cluster, pods_of, labelled={f"{a}-0", f"{a}-1"})
    replicas = {shard: _replica(cluster, shard) for shard in shards}
    await _start(replicas, provider)
    try:
        await async_wait_for(_served(provider, cluster, pods_of), timeout=60, message="every pod served")
        lists = await _pod_lists(control_plane)
        await cluster.service(b, {"app": a})  # b (on shard-b) selects a's pods too
        both = {a: pods_of[a], b: pods_of[a]}
        await async_wait_for(_served(provider, cluster, both), timeout=30, message=f"{b} serving {a}'s pods")
        # shard-b listed its pods again for its new Service (one list, by label), and asked the
        # API server for nothing per Service.
        assert await _pod_lists(control_plane) - lists <= 1
        labels = await _labels(cluster)
        assert labels == dict.fromkeys(pods_of[a], wire.EMPLOYER_LABEL_SHARED)
    finally:
        await _stop(replicas)


async def _pod_lists(control_plane: LocalControlPlane) -> int:
    """LIST requests on pods the API server answered so far (every client)."""
    return sum((await asyncio.to_thread(control_plane.requests_served, "pods", {"LIST"})).values())


def _service_watches(control_plane: LocalControlPlane) -> int:
    """Namespaced watches of Services open on the API server now (every client)."""
    return sum(
        int(value)
        for labels, value in control_plane.metric_samples("apiserver_longrunning_requests")
        if labels.get("resource") == "services"
        and labels.get("verb") == "WATCH"
        and labels.get("scope") == "namespace"
    )


async def test_the_sharders_replica_keeps_one_watch_of_every_service(
    cluster: Cluster, control_plane: LocalControlPlane
) -> None:
    # The labeller watches every Service; the sharder reads that cache, so its replica opens the
    # same Service watches as any other: the shard's own (by its label) and the labeller's.
    before = await asyncio.to_thread(_service_watches, control_plane)
    provider = FakeProvider()
    manager = _replica(cluster, "shard-a")
    await _start({"shard-a": manager}, provider)
    try:
        pods_of = {"web": ["web-0"]}
        await _serve(cluster, pods_of)
        # Placed by the sharder through the shared cache, and served.
        await async_wait_for(_served(provider, cluster, pods_of), timeout=60, message="web served")
        sharding = manager.sharding
        assert sharding is not None and sharding.sharder is not None
        assert await asyncio.to_thread(_service_watches, control_plane) - before == 2
    finally:
        await _stop({"shard-a": manager})
