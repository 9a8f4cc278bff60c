"""The kube client and informer caches against a real API server: typed errors, list + watch
into an indexed store, selector lookups without scans, prompt stop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from resourceconsist import kube
from resourceconsist.cache import Informer, InformerFactory, Store, WatchEvent
from resourceconsist.errors import ResourceConsistError
from resourceconsist.kube import ApiError, Conflict, KubeClient, NotFound
from resourceconsist.testing import LocalControlPlane, async_wait_for


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


class _OneServiceThenQuiet:
    """The list + watch protocol an Informer reads: one Service, then a watch that stays quiet
    until it is closed (the outside world; the informer under test is the real one)."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def list(self, *_: Any, **__: Any) -> dict[str, Any]:
        svc = {"metadata": {"name": "svc", "namespace": "n", "resourceVersion": "1"}}
        return {"items": [svc], "metadata": {"resourceVersion": "1"}}

    def watch(self, *_: Any, **__: Any) -> _OneServiceThenQuiet:
        return self

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.closed.wait(30)
        return iter(())

    def close(self) -> None:
        self.closed.set()


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
