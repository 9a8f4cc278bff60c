"""pytest fixtures for tests against a real control plane (registered as a pytest11 plugin).

- ``control_plane``: one ``LocalControlPlane`` for the whole session;
- ``kube_api``: an official-client ``ApiClient`` with admin rights on it;
- ``namespace``: a fresh namespace per test, deleted afterwards;
- ``wait_for``: ``resourceconsist.testing.wait_for``, to wait for a condition with a deadline;
- ``local_cluster``: one ``LocalCluster`` (controllers, scheduler, kwok nodes) for the session,
  apart from ``control_plane`` so tests that need no controllers do not pay for them;
- ``local_cluster_api`` / ``local_cluster_namespace``: an admin client for it and a fresh
  namespace on it per test, deleted afterwards.

The fixtures only start a control plane or a cluster when a test asks for one.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from resourceconsist.testing.controlplane import LocalControlPlane
from resourceconsist.testing.localcluster import LocalCluster
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


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    """Wait for a condition with a deadline (see ``resourceconsist.testing.wait_for``)."""
    return _wait_for
