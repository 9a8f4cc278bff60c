"""Shared fixtures for frame tests (a manager running adapters on the test's namespace), the
``controlplane`` marker that tells the fast unit tests from those needing kube-apiserver + etcd,
and the ``realnode`` marker of the tests that need a real node (root, containerd; docs/testing.md,
"A real node"), whose images this suite makes first (``real_node_images``).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from resourceconsist.adapter import ReconcileAdapter
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.commands import cli
from resourceconsist.options import ManagerOptions
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, LocalControlPlane

#: The tutorial whose code blocks the tests run (docs/tutorial.md).
TUTORIAL = Path(__file__).resolve().parent.parent / "docs" / "tutorial.md"

#: Fixtures that start (or stand on) the session's real control plane.
CONTROL_PLANE_FIXTURES = frozenset(
    {
        "control_plane",
        "kube_api",
        "namespace",
        "local_cluster",
        "local_cluster_api",
        "local_cluster_namespace",
        "late_service_lists",
        "real_node_cluster",
        "real_node_api",
        "real_node_namespace",
    }
)
#: Fixtures that stand on the session's real node.
REAL_NODE_FIXTURES = frozenset({"real_node_cluster", "real_node_api", "real_node_namespace"})
REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    # The loops run and webhook can serve on: uvloop's by default, and the standard library's,
    # which a Manager built in Python may run on (docs/reference/options.md, "The event loop";
    # docs/testing.md).
    parser.addoption(
        "--event-loop",
        choices=cli.EVENT_LOOPS,
        default=cli.EVENT_LOOPS[0],
        help="the event loop of the async tests (default uvloop, what run and webhook serve on)",
    )


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Every async test on the loop ``--event-loop`` names, made as ``run`` makes it (the standard
    library's: its new loop); one factory, so test names are unchanged."""
    name = config.getoption("--event-loop")
    return {name: cli.loop_factory(name) or asyncio.new_event_loop}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "controlplane: needs a real kube-apiserver + etcd; set on every test using the "
        "control_plane, kube_api or namespace fixture (directly or through another fixture), "
        "by hand on a test that starts its own LocalControlPlane",
    )
    config.addinivalue_line(
        "markers",
        "realnode: needs a real node (root, containerd, runc, the kubelet) or its images; set on every "
        "test using a real_node_* fixture, by hand on the others; such a test is controlplane too",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test whose fixture closure reaches the control plane, so that
    ``pytest -m "not controlplane"`` runs the unit tests alone (CI does, on each Python), and
    every test on the real node ``realnode``. A host runs one real node at a time: the tests that
    start their own run first, before the session's node starts (and holds the host)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if REAL_NODE_FIXTURES & names:
            item.add_marker(pytest.mark.realnode)
        # A real node's test needs the whole set-up (root, its packages, its images): never a unit test.
        if CONTROL_PLANE_FIXTURES & names or item.get_closest_marker("realnode") is not None:
            item.add_marker(pytest.mark.controlplane)

    def own_node(item: pytest.Item) -> bool:
        names = set(getattr(item, "fixturenames", ()))
        return item.get_closest_marker("realnode") is not None and not REAL_NODE_FIXTURES & names

    items.sort(key=lambda item: not own_node(item))


@pytest.fixture(scope="session")
def real_node_images() -> list[Path]:
    """The real node's images, made (or found up to date) by hack/build-node-images.sh, so the
    manager's image is this checkout's code; seconds when nothing changed."""
    done = subprocess.run(
        [str(REPO / "hack" / "build-node-images.sh")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"hack/build-node-images.sh failed:\n{done.stdout}{done.stderr}")
    from resourceconsist.testing.realnode import default_images_dir

    return sorted(default_images_dir().glob("*.tar"))


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
    """``async with run_manager(adapter, ...) as manager:`` runs a manager on the test namespace
    (on ``namespaces`` when given; through ``client`` when given, else the cluster's)."""

    @asynccontextmanager
    async def run(
        *adapters: ReconcileAdapter, client: KubeClient | None = None, **options: Any
    ) -> AsyncIterator[Manager]:
        options.setdefault("namespace", None if "namespaces" in options else cluster.namespace)
        manager = Manager(client or cluster.client, ManagerOptions(**options))
        for adapter in adapters:
            await manager.add(adapter)
        await manager.start()
        try:
            yield manager
        finally:
            await manager.stop(timeout=5)

    return run


@pytest.fixture
def service_account(
    control_plane: LocalControlPlane, kube_client: KubeClient, tmp_path: Path
) -> Iterator[Callable[[dict[str, list[dict[str, Any]]]], KubeClient]]:
    """``service_account({namespace: rules})``: a client of a fresh ServiceAccount whose only
    grants are a Role with ``rules`` in each of those namespaces (RBAC rules, as in a Role), its
    token minted by TokenRequest: what it may not do, the API server refuses (403)."""
    clients: list[KubeClient] = []

    def make(grants: dict[str, list[dict[str, Any]]]) -> KubeClient:
        home = next(iter(grants))
        name = f"sa-{len(clients)}"
        account = kube_client.resource("v1", "ServiceAccount")
        role = kube_client.resource("rbac.authorization.k8s.io/v1", "Role")
        binding = kube_client.resource("rbac.authorization.k8s.io/v1", "RoleBinding")
        kube_client.create(account, home, {"metadata": {"name": name}})
        for namespace, rules in grants.items():
            kube_client.create(role, namespace, {"metadata": {"name": name}, "rules": rules})
            kube_client.create(
                binding,
                namespace,
                {
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": home}],
                },
            )
        token = control_plane.service_account_token(home, name)
        config = control_plane.token_kubeconfig(token, tmp_path / f"{name}.kubeconfig")
        client = KubeClient.from_kubeconfig(str(config), name=name)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@dataclass
class LateServiceLists:
    """A client whose LISTs of Services wait until ``release`` is set."""

    client: KubeClient
    release: threading.Event


@pytest.fixture
def late_service_lists(control_plane: LocalControlPlane) -> Iterator[LateServiceLists]:
    """A client of the control plane that the API server answers Service LISTs late (until
    ``release``): a manager on it gets pod events before its Service cache has synced, what a
    start meets at random (docs/concepts.md, "Events before the caches sync")."""
    client = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    release = threading.Event()
    plain = client.list

    def list_late(resource: kube.Resource, *args: Any, **kwargs: Any) -> Any:
        if resource == kube.SERVICE:
            release.wait(60)
        return plain(resource, *args, **kwargs)

    client.list = list_late  # type: ignore[method-assign]
    yield LateServiceLists(client, release)
    release.set()
    client.close()


@pytest.fixture
def tutorial() -> dict[str, Any]:
    """The names the tutorial's code blocks define, run in order as one module."""
    blocks = re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(), re.S)
    assert len(blocks) >= 5, "the tutorial lost its code blocks"
    namespace: dict[str, Any] = {"__name__": "tutorial"}
    exec(compile("\n".join(blocks), str(TUTORIAL), "exec"), namespace)
    return namespace
