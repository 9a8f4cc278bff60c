"""Shared fixtures for frame tests: a manager running adapters on the test's namespace."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from resourceconsist.adapter import ReconcileAdapter
from resourceconsist.kube import KubeClient
from resourceconsist.manager import Manager
from resourceconsist.testing import Cluster, LocalControlPlane


@pytest.fixture
def kube_client(control_plane: LocalControlPlane) -> Any:
    client = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def cluster(kube_client: KubeClient, namespace: str) -> Cluster:
    return Cluster(kube_client, namespace)


@pytest.fixture
def run_manager(cluster: Cluster) -> Callable[..., Any]:
    """``async with run_manager(adapter, ...) as manager:`` runs a manager on the test namespace."""

    @asynccontextmanager
    async def run(*adapters: ReconcileAdapter, **options: Any) -> AsyncIterator[Manager]:
        manager = Manager(cluster.client, namespace=cluster.namespace, **options)
        for adapter in adapters:
            await manager.add(adapter)
        await manager.start()
        try:
            yield manager
        finally:
            await manager.stop(timeout=5)

    return run
