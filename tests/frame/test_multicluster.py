"""Multi-cluster: the employer lives in the main cluster, its employees in a member cluster
added at runtime, named ``<pod>#<cluster>``; entries and finalizers land on the member's pods."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.adapter import Employee, ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.experimental.demo import DemoAdapter, DemoEmployee, FakeProvider, TrafficStatus
from resourceconsist.options import ManagerOptions
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.manager import Manager
from resourceconsist.testing import Cluster, LocalControlPlane, async_wait_for, finalizers

MEMBER = "member-1"


class MemberPodsDemo(DemoAdapter):
    """The demo adapter with its pods in member clusters (``MultiClusterOptions``)."""

    def employee_fed(self) -> bool:
        return False

    def _member_pods(self, ctx: ReconcileContext, employer: KubeObject) -> list[tuple[str, KubeObject]]:
        return [
            (cluster, pod)
            for cluster, reader in sorted(ctx.clusters.items())
            for pod in reader.pods_selected_by(employer)
        ]

    async def get_selected_employee_names(self, ctx: ReconcileContext, employer: KubeObject) -> list[str]:
        return [f"{p['metadata']['name']}#{c}" for c, p in self._member_pods(ctx, employer)]

    def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        if employer["metadata"].get("deletionTimestamp"):
            return []
        items: list[Employee] = []
        for cluster, pod in self._member_pods(ctx, employer):
            statuses = lifecycle_statuses(pod)
            name = f"{pod['metadata']['name']}#{cluster}"
            items.append(DemoEmployee(id=name, name=name, statuses=statuses))
        return items


def lifecycle_statuses(pod: KubeObject) -> Any:
    from resourceconsist.adapter import pod_employee_statuses

    statuses = pod_employee_statuses(pod)
    ready = statuses.lifecycle_ready
    statuses.extra_status = TrafficStatus(traffic_on=ready, traffic_weight=100 if ready else 0)
    return statuses


@pytest.fixture(scope="module")
def member_plane() -> Iterator[LocalControlPlane]:
    with LocalControlPlane() as cp:
        yield cp


async def test_member_cluster_pods_are_served_and_guarded(
    cluster: Cluster, member_plane: LocalControlPlane
) -> None:
    ns = cluster.namespace
    member_client = KubeClient.from_kubeconfig(str(member_plane.kubeconfig))
    member = Cluster(member_client, ns)
    await member.call(member_client.create, kube.NAMESPACE, None, {"metadata": {"name": ns}})
    provider = FakeProvider()
    manager = Manager(cluster.client, ManagerOptions(namespace=ns))
    await manager.add(MemberPodsDemo(provider))
    await manager.start()
    try:
        await cluster.service("svc")
        await member.pod("web-0", {"app": "svc"})
        await member.set_status("web-0")
        manager.clusters.spawn(MEMBER, member_client)  # added at runtime
        assert manager.clusters.with_client(MEMBER) is member_client
        flz = lifecycle.lifecycle_finalizer("svc")

        async def guarded() -> bool:
            pod = await member.get(kube.POD, "web-0")
            entries = lifecycle.expected_finalizers(pod or {})
            return flz in finalizers(pod) and entries.get(f"Service/{ns}/svc") == flz

        await async_wait_for(guarded, timeout=30, message="the member's pod guarded")
        served = provider.snapshot()[f"{ns}/svc"]
        assert list(served) == [f"web-0#{MEMBER}"]
        svc = await cluster.get(kube.SERVICE, "svc")
        assert (svc or {})["metadata"]["annotations"][
            wire.EXPECTED_FINALIZER_ADDED_ANNOTATION
        ] == f"web-0#{MEMBER}"
        assert await cluster.get(kube.POD, "web-0") is None, "nothing may land in the main cluster"

        # A member pod event reaches the main Service: not ready -> traffic off, finalizer released.
        await member.set_status("web-0", ready=False)
        await async_wait_for(
            lambda: not provider.snapshot()[f"{ns}/svc"][f"web-0#{MEMBER}"].traffic_on,
            timeout=30,
            message="off",
        )

        async def released() -> bool:
            return flz not in finalizers(await member.get(kube.POD, "web-0"))

        await async_wait_for(released, timeout=30, message="finalizer released on the member's pod")
        manager.clusters.stop(MEMBER)
        assert manager.clusters.names() == []
    finally:
        await manager.stop(timeout=5)
        member_client.close()
