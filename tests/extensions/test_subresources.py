"""Employer-owned sub-resources (docs/lifecycle-hooks.md, "Sub-resources") on the working local
cluster, where kube-controller-manager's garbage collector really runs: a PodDisruptionBudget
made for a Service carries an owner reference, is put back when someone changes it, and goes
away with its Service; a cluster-scoped ClusterRole made for it carries owner labels and is
collected by the frame's stray collector once its Service is gone, while a foreign one and a
live Service's stay.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from resourceconsist.adapter import ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, KubeObject, Resource
from resourceconsist.experimental.demo import DemoAdapter
from resourceconsist.hooks.subresources import (
    OWNER_ANNOTATION,
    OWNER_CONTROLLER_LABEL,
    OWNER_UID_LABEL,
    SYNC_FAILED_REASON,
    ensure,
)
from resourceconsist.options import GarbageOptions, ManagerOptions
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, LocalCluster, async_wait_for

PDB = Resource("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets")
CLUSTER_ROLE = Resource("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", namespaced=False)


class GuardedDemo(DemoAdapter):
    """The demo adapter, with a PDB per Service and a ClusterRole per Service."""

    def sub_resources(self, ctx: ReconcileContext, employer: KubeObject) -> list[KubeObject]:
        meta = employer["metadata"]
        return [
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": f"{meta['name']}-drain"},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": employer["spec"]["selector"]}},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": _role(meta["namespace"], meta["name"])},
                "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": ["get"]}],
            },
        ]

    def sub_resource_kinds(self) -> list[tuple[str, str]]:
        return [("rbac.authorization.k8s.io/v1", "ClusterRole")]


def _role(namespace: str, service: str) -> str:
    return f"{namespace}-{service}-view"


@pytest.fixture
def client(local_cluster: LocalCluster) -> Iterator[KubeClient]:
    client = KubeClient.from_kubeconfig(str(local_cluster.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def cluster(client: KubeClient, local_cluster_namespace: str) -> Iterator[Cluster]:
    yield Cluster(client, local_cluster_namespace)
    listing = client.list(CLUSTER_ROLE)
    for role in listing.get("items") or []:
        if role["metadata"]["name"].startswith(local_cluster_namespace):
            with contextlib.suppress(kube.NotFound):
                client.delete(CLUSTER_ROLE, None, role["metadata"]["name"])


@asynccontextmanager
async def running(cluster: Cluster, garbage: GarbageOptions) -> AsyncIterator[Manager]:
    manager = Manager(cluster.client, ManagerOptions(namespace=cluster.namespace, garbage=garbage))
    await manager.add(GuardedDemo())
    await manager.start()
    try:
        yield manager
    finally:
        await manager.stop(timeout=5)


async def _role_of(cluster: Cluster, name: str) -> KubeObject | None:
    return await cluster.call(cluster.client.get_or_none, CLUSTER_ROLE, None, name)


async def _wait(condition: Any, message: str) -> Any:
    return await async_wait_for(condition, timeout=60, message=message)


async def test_a_pdb_sub_resource_is_owned_kept_and_goes_with_its_employer(cluster: Cluster) -> None:
    service = await cluster.service("web")
    async with running(cluster, GarbageOptions(interval=0.5)) as manager:

        async def pdb() -> KubeObject | None:
            return await cluster.get(PDB, "web-drain")

        made = await _wait(pdb, "the PDB made for web")
        (owner,) = made["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Service", "web", service["metadata"]["uid"])
        assert owner["controller"] is True
        assert made["spec"]["selector"] == {"matchLabels": {"app": "web"}}
        role = await _wait(lambda: _role_of(cluster, _role(cluster.namespace, "web")), "the ClusterRole")
        assert role["metadata"]["labels"][OWNER_UID_LABEL] == service["metadata"]["uid"]
        assert role["metadata"]["labels"][OWNER_CONTROLLER_LABEL] == "demo-controller"
        assert role["metadata"]["annotations"][OWNER_ANNOTATION] == f"{cluster.namespace}/web"

        # Someone edits the PDB; the Service's next pass puts it back.
        await cluster.patch(PDB, "web-drain", {"spec": {"maxUnavailable": 3}})
        await cluster.patch(kube.SERVICE, "web", {"metadata": {"annotations": {"touch": "1"}}})

        async def restored() -> bool:
            found = await pdb()
            return found is not None and found["spec"]["maxUnavailable"] == 1

        await _wait(restored, "the PDB restored")

        await cluster.delete(kube.SERVICE, "web")

        async def pdb_gone() -> bool:
            return await pdb() is None

        # No one but kube-controller-manager's garbage collector deletes it.
        await _wait(pdb_gone, "the PDB collected with its Service")

        async def role_gone() -> bool:
            return await _role_of(cluster, _role(cluster.namespace, "web")) is None

        await _wait(role_gone, "the ClusterRole collected by the stray collector")

        def collected() -> float | None:
            return manager.metrics.registry.get_sample_value(
                "resourceconsist_orphans_collected_total", {"controller": "demo-controller"}
            )

        # The collector counts once its DELETE has answered, which may be after this test has
        # seen the ClusterRole gone: wait for the count, then check it counted the one role.
        await _wait(lambda: collected() is not None, "the collection counted")
        assert collected() == 1


async def test_a_cluster_scoped_stray_left_while_down_is_collected_at_start(cluster: Cluster) -> None:
    await cluster.service("web")
    alive = await cluster.service("alive")
    async with running(cluster, GarbageOptions(enabled=False)):
        for name in ("web", "alive"):
            role = _role(cluster.namespace, name)
            await _wait(lambda role=role: _role_of(cluster, role), f"the ClusterRole {role}")
    # A ClusterRole carrying our labels for a Service that never existed, written as the frame
    # would, and a foreign one without them.
    ghost = {**alive, "metadata": {**alive["metadata"], "name": "ghost", "uid": "0000-ghost"}}
    ghost_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": _role(cluster.namespace, "ghost")},
    }
    await cluster.call(ensure, cluster.client, "demo-controller", kube.SERVICE, ghost, ghost_role)
    foreign = _role(cluster.namespace, "foreign")
    await cluster.call(cluster.client.create, CLUSTER_ROLE, None, {"metadata": {"name": foreign}})

    # Deleted with the controller down, finalizers stripped.
    await cluster.patch(kube.SERVICE, "web", {"metadata": {"finalizers": None}})
    await cluster.delete(kube.SERVICE, "web")

    async def service_gone() -> bool:
        return await cluster.get(kube.SERVICE, "web") is None

    await _wait(service_gone, "Service web gone")
    assert await _role_of(cluster, _role(cluster.namespace, "web")) is not None, "nothing else deletes it"

    async with running(cluster, GarbageOptions(interval=None)) as manager:
        (controller,) = manager.controllers.values()

        async def reported() -> Any:
            return controller.garbage.last_report

        report = await _wait(reported, "the start-up garbage pass")
        assert sorted(report.strays) == sorted(
            f"ClusterRole/{_role(cluster.namespace, n)}" for n in ("web", "ghost")
        )
    assert await _role_of(cluster, _role(cluster.namespace, "web")) is None
    assert await _role_of(cluster, _role(cluster.namespace, "ghost")) is None
    assert await _role_of(cluster, _role(cluster.namespace, "alive")) is not None
    assert await _role_of(cluster, foreign) is not None


class MisplacedDemo(DemoAdapter):
    """Declares a ConfigMap in another namespace than its Service's."""

    def sub_resources(self, ctx: ReconcileContext, employer: KubeObject) -> list[KubeObject]:
        return [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m", "namespace": "elsewhere"}}
        ]

    def sub_resource_kinds(self) -> list[tuple[str, str]]:
        return []


async def test_a_sub_resource_in_another_namespace_is_refused_with_a_warning(cluster: Cluster) -> None:
    await cluster.service("web")
    manager = Manager(
        cluster.client, ManagerOptions(namespace=cluster.namespace, garbage=GarbageOptions(enabled=False))
    )
    await manager.add(MisplacedDemo())
    await manager.start()
    try:

        async def warned() -> list[str]:
            return [m for t, reason, m in await cluster.events("web") if reason == SYNC_FAILED_REASON]

        (message, *_) = await _wait(warned, "a Warning event on the Service")
        assert "must live in its employer's namespace" in message and "drop metadata.namespace" in message
    finally:
        await manager.stop(timeout=5)
