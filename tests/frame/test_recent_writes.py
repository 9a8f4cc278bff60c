"""A pod cache behind this controller's own writes is not taken for current (``RecentWrites`` in
resourceconsist/reconcile/podwriter.py; docs/scaling.md, "Conflicts at a cold start").

A pass writes a pod twice (its guard, then its lifecycle finalizer). When the pod watch lags, the
cache shows the first write's copy while the second's answer is already known; a pass that took
that copy for current wrote the pod a third time, into a 409 Conflict, and met the same stale
copy on every pass until the watch caught up. The same holds for the readiness gates this
controller writes. The pods live on the real API server; the cache is a real store whose watch
events the test delivers by hand, the lag made explicit.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import Store, StoreReader, indexers_for
from resourceconsist.cluster.kube import KubeObject, Resource
from resourceconsist.reconcile import readiness
from resourceconsist.reconcile.pods import PodPlaces
from resourceconsist.reconcile.podwriter import EmployerEntry, PodLocation, PodWriter, RecentWrites
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, finalizers
from tests.extensions.test_gates import gate_writes

ENTRY = EmployerEntry(
    key="Service/ns/svc",
    lifecycle_finalizer=lifecycle.lifecycle_finalizer("svc"),
    guard_finalizer=lifecycle.guard_finalizer("svc"),
)


class LaggingPodCache(StoreReader):
    """A pod cache whose watch events arrive only when the test delivers them."""

    def __init__(self) -> None:
        self.store = Store(indexers_for(kube.POD))

    def _store(self, resource: Resource, namespace: str | None) -> Store:
        return self.store

    def deliver(self, pod: KubeObject) -> None:
        """The watch event of ``pod`` (as the API server answered it) reaches the cache."""
        self.store.upsert(pod)


def _writer(cluster: Cluster, cache: LaggingPodCache, recent: RecentWrites) -> PodWriter:
    return PodWriter(cluster.namespace, lambda name: PodLocation(cluster.client, cache, name), ENTRY, recent)


def _guard(writer: PodWriter, pod: str) -> PodWriter:
    """The first write of a pass: the entry and the guard finalizer, before the provider call."""
    writer.add_entry(pod, ENTRY.key, ENTRY.lifecycle_finalizer)
    writer.add_finalizer(pod, ENTRY.guard_finalizer)
    return writer


def _serve(writer: PodWriter, pod: str) -> PodWriter:
    """The second: the guard traded for the lifecycle finalizer once the provider serves the pod."""
    writer.add_entry(pod, ENTRY.key, ENTRY.lifecycle_finalizer)
    writer.swap(pod, to_lifecycle=True)
    return writer


async def test_a_cache_showing_our_first_write_is_not_taken_for_current_after_our_second(
    cluster: Cluster,
) -> None:
    cache, recent, client = LaggingPodCache(), RecentWrites(), cluster.client
    cache.deliver(await cluster.pod("p", {"app": "svc"}))
    conflicts = client.conflicts["pods"]

    first = await _guard(_writer(cluster, cache, recent), "p").flush()
    assert (first.writes, first.done) == (1, {"p"})
    guarded = await cluster.get(kube.POD, "p")  # the first write's copy, as its event will carry it
    second = await _serve(_writer(cluster, cache, recent), "p").flush()
    assert second.writes == 1, "the second write starts from the first one's answer, not the cache"

    # The lagging watch delivers the first write's event, not yet the second's.
    assert guarded is not None
    cache.deliver(guarded)
    again = await _serve(_writer(cluster, cache, recent), "p").flush()
    assert again.writes == 0
    assert client.conflicts["pods"] == conflicts, "a pod written again from the first write's copy"
    assert ENTRY.lifecycle_finalizer in again.finalizers["p"], "the served pod was seen unserved"

    # The watch catches up: the cache is current, and used again.
    served = await cluster.get(kube.POD, "p")
    assert served is not None and finalizers(served) == [ENTRY.lifecycle_finalizer]
    cache.deliver(served)
    assert recent.get(cache, cluster.namespace, "p") is cache.get(kube.POD, cluster.namespace, "p")
    caught_up = await _serve(_writer(cluster, cache, recent), "p").flush()
    assert (caught_up.writes, client.conflicts["pods"]) == (0, conflicts)


async def test_a_copy_read_again_after_a_conflict_spares_the_next_pass_the_same_conflict(
    cluster: Cluster,
) -> None:
    cache, recent, client = LaggingPodCache(), RecentWrites(), cluster.client
    created = await cluster.pod("p", {"app": "svc"})
    cache.deliver(created)
    # Another writer (an earlier owner of the Service, its own cache) guarded the pod; this
    # cache has not seen it.
    theirs = LaggingPodCache()
    theirs.deliver(created)
    assert (await _guard(_writer(cluster, theirs, RecentWrites()), "p").flush()).writes == 1
    conflicts = client.conflicts["pods"]

    first = await _guard(_writer(cluster, cache, recent), "p").flush()
    assert (first.writes, first.done) == (0, {"p"}), "the fresh copy after the conflict needs nothing"
    assert client.conflicts["pods"] == conflicts + 1

    patches = client.requests_by_resource["patch pods"]
    again = await _guard(_writer(cluster, cache, recent), "p").flush()
    assert (again.writes, again.done) == (0, {"p"})
    assert client.conflicts["pods"] == conflicts + 1, "the next pass conflicted on the same stale copy"
    assert client.requests_by_resource["patch pods"] == patches
    assert ENTRY.guard_finalizer in again.finalizers["p"]


async def test_a_gate_written_a_moment_ago_is_not_written_again_while_the_cache_lags(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    # The next pass began before the watch brought the gate's write to the cache (CI saw the
    # same True gate written twice this way); it must see the condition as written.
    cache, recent = LaggingPodCache(), RecentWrites()
    created = await cluster.pod("p", {"app": "svc"}, gated_by=["svc"])
    cache.deliver(created)
    places = PodPlaces(cluster.client, cache, {}, lambda: False, recent)
    keeper = readiness.Gatekeeper(
        controller="c",
        employer_kind="Service",
        gated=places.gated,
        locate=places.locate,
        recorder=_NoEvents(),
        recent=recent,
    )
    service = {"kind": "Service", "metadata": {"name": "svc", "namespace": cluster.namespace}}
    caplog.set_level(logging.INFO, logger="resourceconsist.reconcile")

    async def selected() -> list[str]:
        return ["p"]

    async def update(serving: set[str]) -> list[str]:
        """One pass's gates; the conditions it wrote."""
        caplog.clear()
        facts = readiness.GateFacts(deleting=False, synced=True, serving=serving)
        outcome = await keeper.update(service, "svc", confirmed=facts, expected={"p"}, selected=selected)
        assert outcome.failures == {}
        return gate_writes(caplog.records, "p")

    assert await update(set()) == [wire.GateReason.CONTAINERS_NOT_READY]
    assert await update(set()) == [], "the pass after saw the cache's copy, not the gate it wrote"
    assert await update({"p"}) == [wire.GateReason.SERVING]
    assert await update({"p"}) == []
    # The watch catches up: the cache is current, and used again (nothing more to write).
    served = await cluster.get(kube.POD, "p")
    assert served is not None
    cache.deliver(served)
    assert recent.get(cache, cluster.namespace, "p") is cache.get(kube.POD, cluster.namespace, "p")
    assert await update({"p"}) == []


class _NoEvents:
    """An Event sink that records nothing (no gate here times out)."""

    async def event(
        self, obj: KubeObject, type_: Any, reason: str, message: str, annotations: Any = None
    ) -> None:
        return None
