"""pytest fixtures for tests against a real control plane (registered as a pytest11 plugin).

- ``control_plane``: one ``LocalControlPlane`` for the whole session;
- ``kube_api``: an official-client ``ApiClient`` with admin rights on it;
- ``namespace``: a fresh namespace per test, deleted afterwards;
- ``wait_for``: ``resourceconsist.testing.wait_for``, to wait for a condition with a deadline.

The fixtures only start a control plane when a test asks for one.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from resourceconsist.testing.controlplane import LocalControlPlane
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


@pytest.fixture
def namespace(kube_api: Any) -> Iterator[str]:
    """A fresh namespace, ``t-<random>``, deleted when the test ends."""
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace(cast(Any, {"metadata": {"name": name}}))
    yield name
    # No controller-manager runs, so the namespace stays Terminating; its objects stay in
    # etcd but are unique to this test, so they cannot disturb another.
    core.delete_namespace(name)


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    """Wait for a condition with a deadline (see ``resourceconsist.testing.wait_for``)."""
    return _wait_for
