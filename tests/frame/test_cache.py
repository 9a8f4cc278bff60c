"""The kube client and informer caches against a real API server: typed errors, list + watch
into an indexed store, selector lookups without scans, prompt stop; and, on informers fed by a
slow list, how events whose handler read an unsynced cache wait for it (``ParkedEvents``)."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import (
    READINESS_GATE_INDEX,
    CacheNotSynced,
    Informer,
    InformerFactory,
    SnapshotReader,
    Store,
    WatchEvent,
    index_by_readiness_gate,
)
from resourceconsist.cluster.kube import ApiError, Conflict, KubeClient, NotFound, object_key
from resourceconsist.cluster.kubeconfig import Access
from resourceconsist.errors import ResourceConsistError
from resourceconsist.reconcile import readiness
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.parking import ParkedEvents
from resourceconsist.testing import LocalControlPlane, async_wait_for
from resourceconsist.watch import handler


@pytest.fixture
def kc(control_plane: LocalControlPlane) -> KubeClient:
    client = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    yield client
    client.close()


def _pod(name: str, labels: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


def test_client_errors_carry_status_and_reason(kc: KubeClient, namespace: str) -> None:
    with pytest.raises(ApiError) as err:
        kc.get(kube.POD, namespace, "nope")
    assert isinstance(err.value, NotFound)
    assert isinstance(err.value, ResourceConsistError)
    assert err.value.status == 404
    assert err.value.reason == "NotFound"
    assert kc.get_or_none(kube.POD, namespace, "nope") is None
    created = kc.create(kube.POD, namespace, _pod("a", {"app": "x"}))
    stale_rv = created["metadata"]["resourceVersion"]
    kc.patch(kube.POD, namespace, "a", {"metadata": {"labels": {"b": "1"}}})
    with pytest.raises(ApiError) as conflict:
        kc.patch(kube.POD, namespace, "a", {"metadata": {"resourceVersion": stale_rv, "labels": {"c": "1"}}})
    assert isinstance(conflict.value, Conflict)
    assert conflict.value.status == 409


def test_discovery_finds_kinds_and_names_unknown_ones(kc: KubeClient) -> None:
    crd = kc.resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    assert crd.plural == "customresourcedefinitions"
    assert not crd.namespaced
    with pytest.raises(LookupError, match="no kind Nope"):
        kc.resource("v1", "Nope")


def test_store_indexes_follow_updates_and_deletes() -> None:
    store = Store({"label": lambda o: [f"{k}={v}" for k, v in o["metadata"].get("labels", {}).items()]})
    store.upsert({"metadata": {"name": "a", "namespace": "n", "labels": {"x": "1"}}})
    assert [o["metadata"]["name"] for o in store.by_index("label", "x=1")] == ["a"]
    store.upsert({"metadata": {"name": "a", "namespace": "n", "labels": {"x": "2"}}})
    assert store.by_index("label", "x=1") == []
    assert len(store.by_index("label", "x=2")) == 1
    events = store.replace([{"metadata": {"name": "b", "namespace": "n", "resourceVersion": "1"}}])
    assert [(e.type, e.obj["metadata"]["name"]) for e in events] == [("DELETED", "a"), ("ADDED", "b")]
    assert store.by_index("label", "x=2") == []


def _gated(name: str, namespace: str, *gates: str, rv: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv},
        "spec": {"readinessGates": [{"conditionType": g} for g in gates]},
    }


def test_the_readiness_gate_index_follows_adds_updates_deletes_and_relists() -> None:
    store = Store({READINESS_GATE_INDEX: index_by_readiness_gate})

    def names(key: str) -> list[str]:
        return sorted(o["metadata"]["name"] for o in store.by_index(READINESS_GATE_INDEX, key))

    store.upsert(_gated("a", "n", "example.com/web", "other/warm"))
    store.upsert(_gated("b", "n", "example.com/web"))
    store.upsert(_gated("c", "m", "example.com/web"))
    store.upsert(_gated("plain", "n"))
    assert names("n/example.com/web") == ["a", "b"]
    assert names("n/other/warm") == ["a"]
    assert names("m/example.com/web") == ["c"], "a namespace's lookup holds only its own pods"
    store.upsert(_gated("b", "n", "example.com/api", rv="2"))
    assert names("n/example.com/web") == ["a"]
    assert names("n/example.com/api") == ["b"]
    store.delete(_gated("a", "n"))
    assert names("n/example.com/web") == []
    assert names("n/other/warm") == []
    store.replace([_gated("d", "n", "example.com/web"), _gated("c", "m", "example.com/web")])
    assert names("n/example.com/web") == ["d"]
    assert names("n/example.com/api") == [], "a re-list drops the gates of pods no longer listed"
    assert names("m/example.com/web") == ["c"]


async def test_the_cache_finds_gated_pods_whatever_their_labels_and_forgets_deleted_ones(
    kc: KubeClient, namespace: str
) -> None:
    gate = "example.com/web"
    factory = InformerFactory(kc)
    factory.informer(kube.POD)
    for name, gates in (
        ("web-1", [gate]),
        ("web-2", [gate, "example.com/api"]),
        ("api", ["example.com/api"]),
    ):
        pod = _pod(name, {"app": "web"})
        pod["spec"]["readinessGates"] = [{"conditionType": g} for g in gates]  # type: ignore[index]
        await asyncio.to_thread(kc.create, kube.POD, namespace, pod)
    await asyncio.to_thread(kc.create, kube.POD, namespace, _pod("plain", {"app": "web"}))
    factory.start(asyncio.get_running_loop())
    try:
        await factory.wait_synced()
        reader = factory.reader()

        def gated(condition_type: str) -> list[str]:
            return [p["metadata"]["name"] for p in reader.pods_with_readiness_gate(namespace, condition_type)]

        assert gated(gate) == ["web-1", "web-2"]
        assert gated("example.com/api") == ["api", "web-2"]
        assert reader.pods_with_readiness_gate("elsewhere", gate) == []
        # The employer stops selecting the pod: its gate stays, and so does the lookup's answer.
        await asyncio.to_thread(
            kc.patch, kube.POD, namespace, "web-1", {"metadata": {"labels": {"app": "x"}}}
        )
        await async_wait_for(
            lambda: (reader.get(kube.POD, namespace, "web-1") or {})["metadata"]["labels"] == {"app": "x"},
            timeout=10,
            message="the relabelled pod in the cache",
        )
        assert gated(gate) == ["web-1", "web-2"]
        # What the readiness step asks, in one cluster and (named pod#cluster) in member clusters.
        assert [n for n, _ in readiness.gated_pods(namespace, gate, reader)] == ["web-1", "web-2"]
        in_members = readiness.gated_pods(namespace, gate, reader, {"b": reader, "a": reader})
        assert [n for n, _ in in_members] == ["web-1#a", "web-2#a", "web-1#b", "web-2#b"]
        await asyncio.to_thread(kc.delete, kube.POD, namespace, "web-1")
        await async_wait_for(lambda: gated(gate) == ["web-2"], timeout=10, message="web-1 out of the index")
    finally:
        factory.stop()


async def test_informer_lists_watches_and_answers_selector_lookups(kc: KubeClient, namespace: str) -> None:
    factory = InformerFactory(kc)
    pods, services = factory.informer(kube.POD), factory.informer(kube.SERVICE)
    seen: list[WatchEvent] = []
    pods.add_handler(seen.append)
    await asyncio.to_thread(kc.create, kube.POD, namespace, _pod("before", {"app": "web", "tier": "a"}))
    factory.start(asyncio.get_running_loop())
    try:
        await factory.wait_synced()
        reader = factory.reader()
        assert reader.get(kube.POD, namespace, "before") is not None
        await asyncio.to_thread(kc.create, kube.POD, namespace, _pod("after", {"app": "web", "tier": "b"}))
        await asyncio.to_thread(kc.create, kube.POD, namespace, _pod("other", {"app": "db"}))
        svc = {
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
        }
        await asyncio.to_thread(kc.create, kube.SERVICE, namespace, svc)
        await async_wait_for(lambda: len(reader.pods_selected_by(svc)) == 2, timeout=10, message="2 web pods")
        await async_wait_for(
            lambda: reader.get(kube.SERVICE, namespace, "web"), timeout=10, message="service web cached"
        )
        assert sorted(p["metadata"]["name"] for p in reader.pods_selected_by(svc)) == ["after", "before"]
        after = reader.get(kube.POD, namespace, "after")
        assert after is not None
        assert [s["metadata"]["name"] for s in reader.services_selecting(after)] == ["web"]
        other = reader.get(kube.POD, namespace, "other")
        assert other is not None
        assert reader.services_selecting(other) == []
        assert any(e.type == "ADDED" and e.obj["metadata"]["name"] == "after" for e in seen)
        assert all(e.obj.get("kind") == "Pod" for e in seen if e.obj["metadata"]["name"] == "before")

        await asyncio.to_thread(kc.delete, kube.POD, namespace, "other")
        await async_wait_for(
            lambda: any(e.type == "DELETED" and e.obj["metadata"]["name"] == "other" for e in seen),
            timeout=10,
            message="DELETED event of pod other",
        )
        assert reader.get(kube.POD, namespace, "other") is None
        assert services.relists == 1
    finally:
        started = time.monotonic()
        factory.stop()
        assert time.monotonic() - started < 5, "stopping informers must not wait for the watch timeout"


async def test_waiting_for_a_cache_holds_no_thread_of_the_loops_executor(
    kc: KubeClient, namespace: str
) -> None:
    """Passes waiting for a pod list (a shard's cold start) wait on the loop: with every thread of
    the loop's executor blocked, the first list and a re-list are still waited for."""
    await asyncio.to_thread(kc.create, kube.POD, namespace, _pod("web-0", {"app": "web"}))
    factory = InformerFactory(kc, namespaces=(namespace,))
    pods = factory.informer(kube.POD)
    loop = asyncio.get_running_loop()
    release = threading.Event()
    # Far more blocking calls than the executor has threads: whatever else asks it waits.
    blocked = [loop.run_in_executor(None, release.wait) for _ in range(100)]
    factory.start(loop)
    try:
        waiters = [asyncio.ensure_future(pods.wait_synced(timeout=30)) for _ in range(50)]
        await asyncio.wait_for(asyncio.gather(*waiters), timeout=30)
        assert pods.store.get(f"{namespace}/web-0") is not None
        pods.relist()
        assert not pods.current
        await asyncio.wait_for(pods.wait_synced(timeout=30), timeout=30)
        assert pods.current
    finally:
        release.set()
        await asyncio.gather(*blocked)
        factory.stop()


async def test_the_snapshot_reader_answers_the_cache_readers_lookups_from_one_list_per_kind(
    kc: KubeClient, namespace: str
) -> None:
    """explain's reader (docs/explain.md) is the cache's lookups over a store filled once: the
    same answers as the informer-backed reader, and the same moment for every answer of a run."""
    held = _pod("held", {"app": "web", "tier": "a"})
    held["metadata"]["finalizers"] = ["example.com/hold"]  # type: ignore[index]
    for pod in (held, _pod("free", {"app": "web", "tier": "b"}), _pod("other", {"app": "db"})):
        await asyncio.to_thread(kc.create, kube.POD, namespace, pod)
    svc = {
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }
    await asyncio.to_thread(kc.create, kube.SERVICE, namespace, svc)
    factory = InformerFactory(kc)
    factory.informer(kube.POD), factory.informer(kube.SERVICE)
    factory.start(asyncio.get_running_loop())
    try:
        await factory.wait_synced()
        cached, snapshot = factory.reader(), SnapshotReader(kc)

        def answers(reader: Any) -> dict[str, Any]:
            def names(objs: list[dict[str, Any]]) -> list[str]:
                return sorted(o["metadata"]["name"] for o in objs)

            free = reader.get(kube.POD, namespace, "free")
            return {
                "selected": names(reader.pods_selected_by(svc)),
                "finalizer": names(reader.pods_with_finalizer(namespace, "example.com/hold")),
                "services": names(reader.services_selecting(free)),
                "labelled": names(reader.list(kube.POD, namespace, {"matchLabels": {"tier": "b"}})),
                "all": names(reader.list(kube.POD, namespace)),
                "kind": free["kind"],
                "missing": reader.get(kube.POD, namespace, "nobody"),
            }

        expected = {
            "selected": ["free", "held"],
            "finalizer": ["held"],
            "services": ["web"],
            "labelled": ["free"],
            "all": ["free", "held", "other"],
            "kind": "Pod",
            "missing": None,
        }
        assert await asyncio.to_thread(answers, cached) == expected
        assert await asyncio.to_thread(answers, snapshot) == expected
        await asyncio.to_thread(kc.create, kube.POD, namespace, _pod("later", {"app": "web"}))
        assert await asyncio.to_thread(answers, snapshot) == expected, "one list per kind: one moment"
    finally:
        factory.stop()


def test_a_store_replaced_for_one_namespace_keeps_the_others() -> None:
    store = Store()
    store.upsert({"metadata": {"name": "a", "namespace": "one", "resourceVersion": "1"}})
    store.upsert({"metadata": {"name": "b", "namespace": "two", "resourceVersion": "1"}})
    events = store.replace([{"metadata": {"name": "c", "namespace": "one", "resourceVersion": "2"}}], "one")
    assert [(e.type, e.obj["metadata"]["name"]) for e in events] == [("DELETED", "a"), ("ADDED", "c")]
    assert sorted(object_key(o) for o in store.list()) == ["one/c", "two/b"]


READ_PODS = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


async def test_an_informer_of_several_namespaces_holds_them_all_and_asks_for_no_other(
    kc: KubeClient, service_account: Callable[[dict[str, list[dict[str, Any]]]], KubeClient]
) -> None:
    """One informer, a list + watch per namespace, one store: as a ServiceAccount that may read
    pods in two namespaces only, so that any request beyond them (a cluster-wide list, the third
    namespace) would be refused and the cache would never sync."""
    one, two, other = (f"t-{uuid.uuid4().hex[:10]}" for _ in range(3))
    for name in (one, two, other):
        await asyncio.to_thread(kc.create, kube.NAMESPACE, None, {"metadata": {"name": name}})
    for name in (one, two, other):
        await asyncio.to_thread(kc.create, kube.POD, name, _pod("before", {"app": "web"}))
    client = service_account({one: READ_PODS, two: READ_PODS})
    factory = InformerFactory(client, namespaces=(two, one))
    assert factory.namespaces == tuple(sorted((one, two))) and factory.namespace is None
    pods = factory.informer(kube.POD)
    seen: list[WatchEvent] = []
    pods.add_handler(seen.append)
    factory.start(asyncio.get_running_loop())
    try:
        await factory.wait_synced(timeout=30)
        reader = factory.reader()
        assert sorted(object_key(p) for p in reader.list(kube.POD)) == sorted(
            [f"{one}/before", f"{two}/before"]
        )
        assert reader.get(kube.POD, other, "before") is None
        for name in (one, two, other):
            await asyncio.to_thread(kc.create, kube.POD, name, _pod("after", {"app": "web"}))
        await asyncio.to_thread(kc.delete, kube.POD, one, "before")

        def caught_up() -> bool:
            return sorted(object_key(p) for p in reader.list(kube.POD)) == sorted(
                [f"{one}/after", f"{two}/after", f"{two}/before"]
            )

        await async_wait_for(caught_up, timeout=20, message="both namespaces' changes in the one store")
        assert {e.obj["metadata"]["namespace"] for e in seen} == {one, two}
        # The indexes are per namespace as before: a selector lookup in one sees that one only.
        selected = reader.list(kube.POD, two, {"matchLabels": {"app": "web"}})
        assert sorted(p["metadata"]["name"] for p in selected) == ["after", "before"]
        assert pods.relists == 1  # one first list per namespace counts as the informer's first
    finally:
        factory.stop()


async def test_a_watched_namespace_that_may_not_be_read_keeps_the_cache_unsynced_and_says_which(
    kc: KubeClient,
    service_account: Callable[[dict[str, list[dict[str, Any]]]], KubeClient],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A namespace in the list without its Role (docs/security.md, "A namespaced install"): the
    cache never reports synced (so a manager stays unready), and the log names that namespace."""
    readable, forbidden = (f"t-{uuid.uuid4().hex[:10]}" for _ in range(2))
    for name in (readable, forbidden):
        await asyncio.to_thread(kc.create, kube.NAMESPACE, None, {"metadata": {"name": name}})
    factory = InformerFactory(service_account({readable: READ_PODS}), namespaces=(readable, forbidden))
    factory.informer(kube.POD)
    factory.start(asyncio.get_running_loop())
    try:
        with caplog.at_level(logging.WARNING, logger="resourceconsist.cluster.cache"):

            def refused() -> list[str]:
                lines = [r.getMessage() for r in caplog.records]
                return [line for line in lines if f"informer pods in {forbidden}:" in line]

            (line, *_) = await async_wait_for(refused, timeout=20, message="the refused list logged")
        assert "403" in line and not factory.has_synced
        assert not [r for r in caplog.records if f"pods in {readable}:" in r.getMessage()]
    finally:
        factory.stop()


class _OneServiceThenQuiet:
    """The list + watch protocol an Informer reads: one Service, then a watch that stays quiet
    until it is closed (the outside world; the informer under test is the real one). The list
    answers once ``release`` is set (at once unless ``held``): an API server slow to list."""

    def __init__(self, service: dict[str, Any] | None = None, *, held: bool = False) -> None:
        self.service = service or {"metadata": {"name": "svc", "namespace": "n", "resourceVersion": "1"}}
        self.closed = threading.Event()
        self.release = threading.Event()
        if not held:
            self.release.set()

    def list(self, *_: Any, **__: Any) -> dict[str, Any]:
        self.release.wait(30)
        return {"items": [self.service], "metadata": {"resourceVersion": "1"}}

    def watch(self, *_: Any, **__: Any) -> _OneServiceThenQuiet:
        return self

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.closed.wait(30)
        return iter(())

    def close(self) -> None:
        self.closed.set()
        self.release.set()


class _SyncedOnRelease(threading.Event):
    """The informer's "synced" flag, held back at ``set()`` until the test releases it: the
    moment between the first list reaching the store (and its events the loop) and the flag."""

    def __init__(self) -> None:
        super().__init__()
        self.reached = threading.Event()
        self.release = threading.Event()

    def set(self) -> None:
        self.reached.set()
        self.release.wait(30)
        super().set()


async def test_a_handler_added_before_the_informer_says_synced_still_gets_every_object() -> None:
    # A controller subscribing right after the first list's events ran on the loop, but before
    # the informer thread set its synced flag, used to get nothing for the objects listed: a
    # Service with no pods was then never reconciled until the periodic resync.
    informer = Informer(_OneServiceThenQuiet(), kube.SERVICE)  # type: ignore[arg-type]
    informer._synced = synced = _SyncedOnRelease()
    informer.start(asyncio.get_running_loop())
    try:
        await async_wait_for(synced.reached.is_set, timeout=10, message="the list in the store")
        seen: list[WatchEvent] = []
        informer.add_handler(seen.append)
        synced.release.set()
        await async_wait_for(
            lambda: [(e.type, e.obj["metadata"]["name"]) for e in seen],
            timeout=10,
            message="the listed Service delivered to the late handler",
        )
        await informer.wait_synced(10)
        assert [(e.type, e.obj["metadata"]["name"]) for e in seen] == [("ADDED", "svc")]
    finally:
        synced.release.set()
        await asyncio.to_thread(informer.stop)


class _Burst(_OneServiceThenQuiet):
    """As ``_OneServiceThenQuiet``, but its watch first sends ``changes`` of the Service at once
    (a rollout's burst), and says when the informer has taken the last one."""

    def __init__(self, changes: int) -> None:
        super().__init__()
        self.changes = changes
        self.sent = threading.Event()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for rv in range(2, 2 + self.changes):
            meta = {"name": "svc", "namespace": "n", "resourceVersion": str(rv)}
            yield {"type": "MODIFIED", "object": {"metadata": meta}}
        self.sent.set()  # asked for more: the last change is in the store and sent
        self.closed.wait(30)


async def test_a_burst_of_changes_reaches_the_handlers_in_order_with_one_wake_up_of_the_loop() -> None:
    api = _Burst(200)
    informer = Informer(api, kube.SERVICE)  # type: ignore[arg-type]
    versions: list[str] = []
    informer.add_handler(lambda e: versions.append(e.obj["metadata"]["resourceVersion"]))
    batches = 0
    dispatch = informer._dispatch_pending

    def counted() -> None:  # observes the informer's loop calls; the dispatch itself is its own
        nonlocal batches
        batches += 1
        dispatch()

    informer._dispatch_pending = counted  # type: ignore[method-assign]
    informer.start(asyncio.get_running_loop())
    try:
        # The loop is held (this wait blocks it) while the informer thread lists and sends the
        # whole burst, as a busy loop is while a rollout's changes stream in.
        assert api.sent.wait(10), "the burst sent"
        await async_wait_for(lambda: len(versions) == 201, timeout=10, message="every change handled")
        assert versions == [str(rv) for rv in range(1, 202)], "in the order they came"
        assert batches == 1, f"{batches} loop calls for the list and 200 changes sent while it was busy"
    finally:
        api.close()
        await asyncio.to_thread(informer.stop)


# ---- events before the caches sync (docs/concepts.md, "Events before the caches sync") ----------


def _listed_pod(name: str, labels: dict[str, str], rv: str = "1") -> dict[str, Any]:
    """A pod as an informer delivers it (kind set, in namespace n)."""
    meta = {"name": name, "namespace": "n", "labels": labels, "resourceVersion": rv}
    return {"kind": "Pod", "metadata": meta}


@dataclass
class _Parking:
    """A factory whose Service list is held back, its Service informer, and a ``ParkedEvents``
    recording what it hands back."""

    api: _OneServiceThenQuiet
    factory: InformerFactory
    services: Informer
    parked: ParkedEvents
    remapped: list[WatchEvent]

    def unmappable(self, event: WatchEvent) -> CacheNotSynced:
        """The error the default pod handler raises on ``event`` while the Service cache is empty."""
        with pytest.raises(CacheNotSynced) as raised:
            handler.enqueue_services_by_pod(event, self.factory.reader())
        return raised.value


@pytest.fixture
async def parking() -> AsyncIterator[_Parking]:
    web = {
        "metadata": {
            "name": "web",
            "namespace": "n",
            "resourceVersion": "1",
            "labels": {"kusionstack.io/control": "true"},
        },
        "spec": {"selector": {"app": "web"}},
    }
    api = _OneServiceThenQuiet(web, held=True)
    factory = InformerFactory(api)  # type: ignore[arg-type]
    factory.start(asyncio.get_running_loop())
    remapped: list[WatchEvent] = []
    parked = ParkedEvents("test", factory, remapped.append)
    yield _Parking(api, factory, factory.informer(kube.SERVICE), parked, remapped)
    api.close()
    await asyncio.to_thread(factory.stop)


async def test_an_event_whose_cache_has_not_synced_waits_and_is_mapped_once_it_has(parking: _Parking) -> None:
    parked, remapped, reader = parking.parked, parking.remapped, parking.factory.reader()
    a_added = WatchEvent("ADDED", _listed_pod("a", {"app": "other"}))
    a_moved = WatchEvent("MODIFIED", _listed_pod("a", {"app": "web"}, "2"), a_added.obj)
    a_latest = WatchEvent("MODIFIED", _listed_pod("a", {"app": "web", "tick": "3"}, "3"), a_moved.obj)
    b_added = WatchEvent("ADDED", _listed_pod("b", {"app": "web"}))
    for event in (a_added, a_moved, a_latest, b_added):
        err = parking.unmappable(event)
        assert err.resource == kube.SERVICE, "the error names the cache to wait for"
        assert parked.park(event, err)
    assert parked.waiting_for() == {"services": 2}, "kept per object, not per event"
    await asyncio.sleep(0)  # a loop turn: nothing is handed back while the cache has not synced
    assert remapped == [] and not parking.services.has_synced

    parking.api.release.set()
    await async_wait_for(lambda: len(remapped) == 3, timeout=10, message="the parked events handed back")
    # Per object the first (as it was before) and the latest (as it is), in the order they came.
    assert remapped == [a_added, a_latest, b_added]
    assert parked.waiting_for() == {}
    # Now the handler maps them: the Service of pod a's latest state, and of pod b.
    assert handler.enqueue_services_by_pod(a_latest, reader) == ["n/web"]
    assert handler.enqueue_services_by_pod(b_added, reader) == ["n/web"]
    assert handler.enqueue_services_by_pod(a_added, reader) == []


async def test_a_pod_event_reaches_the_services_of_its_copy_before_and_after_the_change(
    parking: _Parking,
) -> None:
    # The handler looks at the old copy only when the change moved labels or finalizers; the
    # answer must not lose the Service of the copy before the change (docs/concepts.md).
    parking.api.release.set()
    await async_wait_for(lambda: parking.services.has_synced, timeout=10, message="the Service cache")
    reader = parking.factory.reader()
    web = _listed_pod("a", {"app": "web"})
    other = _listed_pod("a", {"app": "other"}, "2")
    assert handler.enqueue_services_by_pod(WatchEvent("MODIFIED", other, web), reader) == ["n/web"]
    assert handler.enqueue_services_by_pod(WatchEvent("MODIFIED", web, other), reader) == ["n/web"]
    status_only = {**_listed_pod("a", {"app": "web"}, "3"), "status": {"phase": "Running"}}
    assert handler.enqueue_services_by_pod(WatchEvent("MODIFIED", status_only, web), reader) == ["n/web"]
    assert handler.enqueue_services_by_pod(WatchEvent("MODIFIED", other, other), reader) == []
    # Unselected before and after, but the copy before the change still held web's lifecycle
    # finalizer: web must hear of it to release it.
    guarded = _listed_pod("a", {"app": "other"}, "4")
    guarded["metadata"]["finalizers"] = [lifecycle.lifecycle_finalizer("web")]
    assert handler.enqueue_services_by_pod(WatchEvent("MODIFIED", other, guarded), reader) == ["n/web"]
    assert handler.enqueue_services_by_pod(WatchEvent("MODIFIED", guarded, other), reader) == ["n/web"]


async def test_nothing_to_wait_for_is_refused_and_a_cleared_wait_hands_nothing_back(
    parking: _Parking,
) -> None:
    parked, remapped = parking.parked, parking.remapped
    event = WatchEvent("ADDED", _listed_pod("a", {"app": "web"}))
    # A CacheNotSynced naming no kind gives nothing to wait for: the caller treats it as a failure.
    assert not parked.park(event, CacheNotSynced("somebody's own cache"))
    # Parked, then the subscription stops (the controller stops): the sync hands nothing back.
    assert parked.park(event, parking.unmappable(event))
    parked.clear()
    assert parked.waiting_for() == {}
    after_clear = asyncio.Event()
    parking.services.when_synced(after_clear.set)
    parking.api.release.set()
    await asyncio.wait_for(after_clear.wait(), timeout=10)
    assert remapped == [], "a withdrawn wait is not called back"

    # A re-map that finds the cache still unsynced although this factory's has synced (the
    # handler reads another factory's cache) is refused, so an event cannot bounce forever.
    assert parking.services.has_synced
    assert not parked.park(event, CacheNotSynced("another factory's", kube.SERVICE), again=True)
    # The first time, it waits (the cache may have synced between the read and the park).
    assert parked.park(event, CacheNotSynced("raced the sync", kube.SERVICE))
    await async_wait_for(lambda: remapped == [event], timeout=10, message="handed back at once")


async def test_when_synced_calls_back_after_the_lists_events_and_at_once_when_synced(
    parking: _Parking,
) -> None:
    services = parking.services
    seen: list[str] = []
    services.add_handler(lambda e: seen.append(f"{e.type} {e.obj['metadata']['name']}"))
    services.when_synced(lambda: seen.append("synced"))
    withdrawn = services.when_synced(lambda: seen.append("withdrawn"))
    withdrawn()
    parking.api.release.set()
    await async_wait_for(lambda: "synced" in seen, timeout=10, message="the sync callback")
    assert seen == ["ADDED web", "synced"], "the cache's events reach the handlers first"
    late = asyncio.Event()
    services.when_synced(late.set)
    await asyncio.wait_for(late.wait(), timeout=10)


async def test_a_watch_that_expires_is_counted_and_lists_again() -> None:
    """A watch resumed from a version the API server no longer has (410 Gone, the cache fell
    behind) lists everything again and is counted (``resourceconsist_informer_watch_expired_total``;
    docs/concepts.md). The API server here is a stand-in that keeps its pods and versions, and
    answers the informer's first watch with 410 as a real one answers a watch from too old a
    version; a transient break is not counted."""
    state = {"lists": 0, "watches": 0}
    pods = [{"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "10"}}]

    class ApiServer(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if "watch=" in self.path:
                state["watches"] += 1
                if state["watches"] == 1:
                    gone = {
                        "kind": "Status",
                        "code": 410,
                        "reason": "Expired",
                        "message": "too old resource version",
                    }
                    self._send(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                    return
                if state["watches"] == 2:
                    self._send(b"")  # a watch the server ends: a transient break, resumed
                    return
                threading.Event().wait(5)  # a quiet watch until the test ends
                self._send(b"")
                return
            state["lists"] += 1
            listing = {
                "kind": "PodList",
                "metadata": {"resourceVersion": "10"},
                "items": pods,
            }
            self._send(json.dumps(listing).encode())

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ApiServer)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    client = KubeClient(access=Access(f"http://127.0.0.1:{server.server_address[1]}"))
    informer = Informer(client, kube.POD, namespace="ns")
    informer.start(asyncio.get_running_loop())
    try:
        await async_wait_for(lambda: state["watches"] >= 3, timeout=30, message="a watch after the expiry")
        assert informer.expired == 1
        assert state["lists"] == 2, state  # the first list, and one after the 410 (not after the break)
        assert informer.store.get("ns/a") is not None
    finally:
        informer.signal_stop()
        server.shutdown()
        client.close()
