"""Pod caches limited to a label selector (``ManagerOptions.pod_label_selector``,
``InformerFactory.keep_pods``; docs/concepts.md, "Pods the caches keep"): the selector read as
the API server reads it, the cache keeping the pods it selects and those carrying the frame's
marks, and a guarded pod that loses the label still served, then released once the provider
lets go of it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.cache import InformerFactory, WatchEvent
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.cluster.transform import carries_marks
from resourceconsist.commands import cli
from resourceconsist.commands.cli import main
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.options import ManagerOptions
from resourceconsist.rules import lifecycle
from resourceconsist.rules.labels import InvalidSelector, label_selector_selects, parse_selector
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, LocalControlPlane, async_wait_for, finalizers
from tests.frame.test_guard import DeletionWatch, _routes

CONTROL = f"{wire.CONTROL_LABEL}={wire.CONTROL_LABEL_VALUE}"


@pytest.fixture
def kc(control_plane: LocalControlPlane) -> Iterator[KubeClient]:
    client = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    yield client
    client.close()


# -- the selector and the marks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("", "is empty"),
        ("a=b=c", "'b=c' is not a label value"),
        ("=x", "'' is not a label key"),
        ("a in (b", "is not a label key"),
        ("Bad Key=x", "'Bad Key' is not a label key"),
    ],
)
def test_a_selector_the_api_server_would_refuse_is_refused_naming_the_part_at_fault(
    selector: str, message: str
) -> None:
    with pytest.raises(InvalidSelector, match=message):
        parse_selector(selector)


def test_each_mark_of_the_frame_keeps_a_pod_and_nothing_else_does() -> None:
    def pod(meta: dict[str, Any], spec: dict[str, Any] | None = None) -> KubeObject:
        return {"metadata": {"name": "p", **meta}, "spec": spec or {}}

    assert carries_marks(pod({"finalizers": [lifecycle.guard_finalizer("svc")]}))
    assert carries_marks(pod({"finalizers": ["x/y", lifecycle.lifecycle_finalizer("svc")]}))
    assert carries_marks(pod({"annotations": {wire.AVAILABLE_CONDITIONS_ANNOTATION: "{}"}}))
    assert carries_marks(pod({}, {"readinessGates": [{"conditionType": lifecycle.readiness_gate("svc")}]}))
    assert not carries_marks(pod({"finalizers": ["example.com/other"], "annotations": {"a": "b"}}))
    assert not carries_marks(pod({}, {"readinessGates": [{"conditionType": wire.SERVICE_READY_CONDITION}]}))
    assert not carries_marks(pod({"labels": {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}}))


async def test_the_selector_selects_what_the_api_server_selects(kc: KubeClient, namespace: str) -> None:
    labels = [{}, {"a": "b"}, {"a": "c"}, {"a": "b", "e": "f"}, {"e": "g", "h": "1"}, {"i": "x"}]
    for n, pod_labels in enumerate(labels):
        body = {
            "metadata": {"name": f"p{n}", "labels": pod_labels},
            "spec": {"containers": [{"name": "app", "image": "nginx"}]},
        }
        await asyncio.to_thread(kc.create, kube.POD, namespace, body)
    selectors = [
        "a=b",
        "a==b",
        "a!=b",
        "e in (f,g)",
        "e notin (f)",
        "h",
        "!i",
        "a=b,e",
        "a!=c, !h ,e notin (g)",
    ]
    for selector in selectors:
        listed = await asyncio.to_thread(kc.list, kube.POD, namespace, label_selector=selector)
        by_server = sorted(p["metadata"]["name"] for p in listed["items"])
        parsed = parse_selector(selector)
        by_us = sorted(
            f"p{n}" for n, pod_labels in enumerate(labels) if label_selector_selects(parsed, pod_labels)
        )
        assert by_us == by_server, selector


# -- the cache -------------------------------------------------------------------------------------


async def test_the_cache_keeps_the_selected_and_the_marked_pods_and_a_pod_leaving_both_leaves_it(
    kc: KubeClient, namespace: str
) -> None:
    async def create(name: str, labels: dict[str, str], **meta: Any) -> None:
        body = {
            "metadata": {"name": name, "labels": labels, **meta},
            "spec": {"containers": [{"name": "app", "image": "nginx"}]},
        }
        await asyncio.to_thread(kc.create, kube.POD, namespace, body)

    guard = lifecycle.guard_finalizer("svc")
    control = {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}
    await create("selected", {"app": "svc", **control})
    await create("plain", {"app": "svc"})
    await create("guarded", {"app": "svc"}, finalizers=[guard])
    await create("entry", {}, annotations={wire.AVAILABLE_CONDITIONS_ANNOTATION: '{"expectedFinalizers":{}}'})
    factory = InformerFactory(kc, namespace=namespace)
    factory.keep_pods(CONTROL)
    informer = factory.informer(kube.POD)
    seen: list[WatchEvent] = []
    informer.add_handler(seen.append)
    factory.start(asyncio.get_running_loop())
    try:
        await factory.wait_synced()

        def cached() -> set[str]:
            return {p["metadata"]["name"] for p in informer.store.list()}

        assert cached() == {"selected", "guarded", "entry"}
        with pytest.raises(ValueError, match="already kept by"):
            factory.keep_pods("app=svc")

        # The selected pod loses the label and carries no mark: it leaves the cache, though it
        # still exists; the plain one gains it and comes in.
        await asyncio.to_thread(
            kc.patch, kube.POD, namespace, "selected", {"metadata": {"labels": {wire.CONTROL_LABEL: None}}}
        )
        await asyncio.to_thread(kc.patch, kube.POD, namespace, "plain", {"metadata": {"labels": control}})
        await async_wait_for(lambda: cached() == {"plain", "guarded", "entry"}, message="the cache follows")
        left = [e for e in seen if e.type == "DELETED"]
        assert [e.obj["metadata"]["name"] for e in left] == ["selected"]
        assert left[0].old is not None and wire.CONTROL_LABEL in left[0].old["metadata"]["labels"]
        assert await asyncio.to_thread(kc.get_or_none, kube.POD, namespace, "selected") is not None

        # The guarded pod is released: with no mark and no label, it leaves too.
        await asyncio.to_thread(kc.patch, kube.POD, namespace, "guarded", {"metadata": {"finalizers": None}})
        await async_wait_for(lambda: cached() == {"plain", "entry"}, message="the released pod leaves")
    finally:
        factory.stop()
        pod = await asyncio.to_thread(kc.get_or_none, kube.POD, namespace, "guarded")
        if pod is not None and finalizers(pod):
            await asyncio.to_thread(
                kc.patch, kube.POD, namespace, "guarded", {"metadata": {"finalizers": None}}
            )


def test_a_cache_already_keeping_every_pod_is_not_narrowed_under_its_readers(kc: KubeClient) -> None:
    factory = InformerFactory(kc)
    factory.informer(kube.POD)
    with pytest.raises(ValueError, match="already keeping every pod"):
        factory.keep_pods(CONTROL)


def test_the_flag_sets_the_option() -> None:
    from tests.api.test_options import _flags

    flags = _flags(cli.run, "--pod-label-selector", CONTROL)
    assert cli._manager_options(flags).pod_label_selector == CONTROL
    assert cli._manager_options(_flags(cli.run)).pod_label_selector is None


def test_a_bad_selector_is_refused_by_the_manager_and_the_command_line(kc: KubeClient) -> None:
    with pytest.raises(InvalidSelector, match="is not a label value"):
        Manager(kc, ManagerOptions(pod_label_selector="app=a b"))
    result = CliRunner().invoke(main, ["run", "--adapter", "demo", "--pod-label-selector", "a in (b"])
    assert result.exit_code == 2
    assert "--pod-label-selector" in result.output and "is not a label key" in result.output


# -- the promise ------------------------------------------------------------------------------------


async def test_a_guarded_pod_that_loses_the_label_stays_served_and_is_released_once_the_provider_lets_go(
    cluster: Cluster, run_manager: Any, kube_client: KubeClient
) -> None:
    provider = FakeProvider()
    adapter = DemoAdapter(provider)
    control = {wire.CONTROL_LABEL: wire.CONTROL_LABEL_VALUE}
    served = lifecycle.lifecycle_finalizer("svc")
    watch = DeletionWatch(kube_client, cluster.namespace, _routes(provider))
    routes = _routes(provider)
    try:
        await cluster.service("svc")
        await cluster.pod("pod-1", {"app": "svc", **control})
        # Selected by the Service, but without the label nor any mark: not this cache's pod.
        await cluster.pod("unlabelled", {"app": "svc"})
        for pod in ("pod-1", "unlabelled"):
            await cluster.set_status(pod, ready=True)
        async with run_manager(adapter, pod_label_selector=CONTROL) as manager:
            store = manager.informers.informer(kube.POD).store

            async def served_pod_1() -> bool:
                return routes("pod-1") and served in finalizers(await cluster.get(kube.POD, "pod-1"))

            await async_wait_for(served_pod_1, timeout=30, message="pod-1 served")
            assert store.get(f"{cluster.namespace}/unlabelled") is None
            assert not routes("unlabelled") and finalizers(await cluster.get(kube.POD, "unlabelled")) == []

            await cluster.patch(kube.POD, "pod-1", {"metadata": {"labels": {wire.CONTROL_LABEL: None}}})

            def cached_without_label() -> bool:
                pod = store.get(f"{cluster.namespace}/pod-1")
                return pod is not None and wire.CONTROL_LABEL not in pod["metadata"].get("labels", {})

            # Its marks keep it in the cache: it is not taken as gone, and stays served.
            await async_wait_for(cached_without_label, message="the unlabelled pod-1 in the cache")
            controller = manager.controllers[adapter.get_controller_name()]
            for _ in range(2):  # the second pass began after the cache lost the label
                passes = controller.reconciles
                controller.queue.add(f"{cluster.namespace}/svc")
                await async_wait_for(lambda n=passes: controller.reconciles > n, message="a pass of svc")
            assert routes("pod-1") and served in finalizers(await cluster.get(kube.POD, "pod-1"))

            await cluster.delete(kube.POD, "pod-1")
            pod = await cluster.get(kube.POD, "pod-1")
            assert pod is not None and pod["metadata"].get("deletionTimestamp"), "its finalizer holds it"

            async def gone() -> bool:
                return await cluster.get(kube.POD, "pod-1") is None

            await async_wait_for(gone, timeout=30, message="pod-1 released once the provider let go")
            assert not routes("pod-1")
        assert watch.deleted == ["pod-1"]
        assert watch.unguarded == []
    finally:
        watch.close()
