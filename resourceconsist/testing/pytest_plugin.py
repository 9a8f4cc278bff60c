"""pytest fixtures for tests against a real control plane (registered as a pytest11 plugin).

- ``control_plane``: one ``LocalControlPlane`` for the whole session;
- ``kube_api``: an official-client ``ApiClient`` with admin rights on it;
- ``namespace``: a fresh namespace per test, deleted afterwards;
- ``wait_for``: ``resourceconsist.testing.wait_for``, to wait for a condition with a deadline;
- ``local_cluster``: one ``LocalCluster`` (controllers, scheduler, kwok nodes) for the session,
  apart from ``control_plane`` so tests that need no controllers do not pay for them;
- ``local_cluster_api`` / ``local_cluster_namespace``: an admin client for it and a fresh
  namespace on it per test, deleted afterwards;
- ``real_node_cluster``: one ``RealNodeCluster`` (a real kubelet, containerd and kube-proxy) for
  the session, the archives of ``real_node_images`` imported into it (default: every ``*.tar``
  in ``default_images_dir()``; a suite overrides that fixture to make them first);
- ``real_node_api`` / ``real_node_namespace``: an admin client for it and a fresh namespace on it
  per test (its ``default`` ServiceAccount made), deleted afterwards.

The fixtures only start a control plane or a cluster when a test asks for one.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from resourceconsist.testing.controlplane import LocalControlPlane
from resourceconsist.testing.localcluster import LocalCluster
from resourceconsist.testing.realnode import RealNodeCluster, default_images_dir
from resourceconsist.testing.wait import wait_for as _wait_for


@pytest.fixture(scope="session")
def control_plane() -> Iterator[LocalControlPlane]:
    """A real etcd + kube-apiserver shared by the session's tests."""
    with LocalControlPlane() as cp:
        yield cp


@pytest.fixture(scope="session")
def kube_api(control_plane: LocalControlPlane) -> Iterator[Any]:
    """An official-client ``ApiClient`` bound to the session's control plane."""
    with control_plane.api_client() as api:
        yield api


def _fresh_namespace(api: Any) -> Iterator[str]:
    from kubernetes import client

    core = client.CoreV1Api(api)
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace(cast(Any, {"metadata": {"name": name}}))
    yield name
    core.delete_namespace(name)


@pytest.fixture
def namespace(kube_api: Any) -> Iterator[str]:
    """A fresh namespace, ``t-<random>``, deleted when the test ends."""
    # No controller-manager runs, so the namespace stays Terminating; its objects stay in
    # etcd but are unique to this test, so they cannot disturb another.
    yield from _fresh_namespace(kube_api)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """A working cluster (docs/testing.md) shared by the session's tests."""
    with LocalCluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def local_cluster_api(local_cluster: LocalCluster) -> Iterator[Any]:
    """An official-client ``ApiClient`` bound to the session's ``LocalCluster``."""
    with local_cluster.api_client() as api:
        yield api


@pytest.fixture
def local_cluster_namespace(local_cluster_api: Any) -> Iterator[str]:
    """A fresh namespace on the session's ``LocalCluster``; deleted when the test ends, and
    there the namespace controller empties it and it goes away."""
    yield from _fresh_namespace(local_cluster_api)


@pytest.fixture(scope="session")
def real_node_images() -> list[Path]:
    """The image archives the session's real node imports: every ``*.tar`` of the image cache."""
    return sorted(default_images_dir().glob("*.tar"))


@pytest.fixture(scope="session")
def real_node_cluster(real_node_images: list[Path]) -> Iterator[RealNodeCluster]:
    """A cluster with one real node (docs/testing.md, "A real node"), shared by the session."""
    with RealNodeCluster(images=real_node_images) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def real_node_api(real_node_cluster: RealNodeCluster) -> Iterator[Any]:
    """An official-client ``ApiClient`` bound to the session's ``RealNodeCluster``."""
    with real_node_cluster.api_client() as api:
        yield api


@pytest.fixture
def real_node_namespace(real_node_api: Any) -> Iterator[str]:
    """A fresh namespace on the session's ``RealNodeCluster``, once its ``default``
    ServiceAccount exists (Pods cannot be created before: ServiceAccount admission is on there);
    deleted when the test ends, its Pods stopped by the kubelet."""
    from kubernetes import client

    core = client.CoreV1Api(real_node_api)
    namespaces = _fresh_namespace(real_node_api)
    name = next(namespaces)
    _wait_for(
        lambda: core.list_namespaced_service_account(name, field_selector="metadata.name=default").items,
        timeout=30,
        message=f"the default ServiceAccount of {name}",
    )
    yield name
    next(namespaces, None)


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    """Wait for a condition with a deadline (see ``resourceconsist.testing.wait_for``)."""
    return _wait_for
