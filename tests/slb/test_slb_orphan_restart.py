"""A manage-mode Service force-deleted while the controller is down, end to end: the real
kube-apiserver + etcd, the SLB emulator served as its own HTTPS process, and the controller as
``resourceconsist run --adapter alibabacloudslb --slb-cluster-name ...`` processes that are stopped
and started again (docs/alibabacloudslb.md, "Tags and the garbage search").

The Service's load balancer is named by no other Service, so only the tags find its group: after
the restart the group is collected, its pods released and a pod's deletion completes; a Service
re-created under the same name keeps its group (re-tagged with its new UID); groups tagged with
another cluster, on that very load balancer too, are left as they were.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from resourceconsist.adapters.alibabacloudslb import (
    CLUSTER_TAG,
    LOAD_BALANCER_ID_LABEL,
    MODE_ANNOTATION,
    SERVER_ID_ANNOTATION,
    SERVICE_NAME_TAG,
    SERVICE_NAMESPACE_TAG,
    SERVICE_UID_TAG,
)
from resourceconsist.adapters.alibabacloudslb.emulator_server import EmulatorAdmin, served_emulator
from resourceconsist.cluster import kube
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, LocalControlPlane, async_wait_for, finalizers
from resourceconsist.testing.controlplane import free_port
from resourceconsist.testing.process import CommandProcess

CLUSTER = "restart-test"
OTHER = "another-cluster"
ALONE = "lb-alone"
FLZ = lifecycle.lifecycle_finalizer("web")
GUARD = lifecycle.guard_finalizer("web")
PODS = ["web-0", "web-1"]


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[tuple[dict[str, str], EmulatorAdmin]]:
    """The emulator server process with load balancer ``lb-alone``; its start-up line and admin."""
    with served_emulator(tmp_path / "slb", ALONE) as served:
        yield served


def _controller_process(kubeconfig: Path, namespace: str, info: dict[str, str]) -> CommandProcess:
    """One ``resourceconsist run`` process against the control plane and the emulator."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ALIYUN_", "ALIBABA_CLOUD_"))},
        "ALIYUN_SLB_AK_KEY": info["access_key_id"],
        "ALIYUN_SLB_AK_SECRET": info["access_key_secret"],
        "ALIYUN_SLB_ENDPOINT": info["endpoint"],
        "ALIBABA_CLOUD_REGION_ID": info["region_id"],
        # The SDK's own setting for the CA that signed the emulator's certificate.
        "ALIBABA_CLOUD_CA_BUNDLE": info["ca_bundle"],
    }
    args = [
        *("run", "--adapter", "alibabacloudslb", "--slb-cluster-name", CLUSTER),
        *("--kubeconfig", str(kubeconfig), "--namespace", namespace),
        *("--health-probe-bind-address", f"127.0.0.1:{port}", "--metrics-bind-address", "0"),
        *("--garbage-interval", "1"),
    ]
    return CommandProcess(args, env, port)


@asynccontextmanager
async def _controller(
    cluster: Cluster, kubeconfig: Path, info: dict[str, str]
) -> AsyncIterator[CommandProcess]:
    controller = await asyncio.to_thread(_controller_process, kubeconfig, cluster.namespace, info)
    try:
        await async_wait_for(controller.ready, timeout=90, message="the controller ready")
        yield controller
    finally:
        await asyncio.to_thread(controller.stop)


def _groups(admin: EmulatorAdmin, name: str | None = None) -> list[dict[str, Any]]:
    return [g for g in admin.state()["groups"] if name is None or g["name"] == name]


def _ours(admin: EmulatorAdmin, name: str) -> list[dict[str, Any]]:
    return [g for g in _groups(admin, name) if g["tags"].get(CLUSTER_TAG) == CLUSTER]


def _describe_load_balancers_calls(admin: EmulatorAdmin) -> int:
    return sum(n for (action, _), n in admin.call_counts().items() if action == "DescribeLoadBalancers")


async def _serve_web(cluster: Cluster, admin: EmulatorAdmin, group_name: str) -> dict[str, Any]:
    """Service ``web`` in manage mode on ``lb-alone``, two ready pods; its group once both are in."""
    await cluster.service(
        "web", labels={LOAD_BALANCER_ID_LABEL: ALONE}, annotations={MODE_ANNOTATION: "manage"}
    )
    for index, name in enumerate(PODS):
        await cluster.pod(
            name, {"app": "web"}, readiness_gate=True, annotations={SERVER_ID_ANNOTATION: f"eni-{index}"}
        )
        await cluster.set_status(name, ready=True, service_ready=True)

    async def served() -> dict[str, Any] | None:
        found = _ours(admin, group_name)
        if len(found) != 1 or sorted(b["Weight"] for b in found[0]["backends"]) != [100, 100]:
            return None
        for name in PODS:
            if FLZ not in finalizers(await cluster.get(kube.POD, name)):
                return None
        return found[0]

    group: dict[str, Any] = await async_wait_for(
        served, timeout=90, message="web served at weight 100, pods guarded"
    )
    return group


async def _force_delete(cluster: Cluster) -> None:
    """What an operator did with the controller down: finalizers stripped, Service deleted."""
    await cluster.patch(kube.SERVICE, "web", {"metadata": {"finalizers": None}})
    await cluster.delete(kube.SERVICE, "web")

    async def gone() -> bool:
        return await cluster.get(kube.SERVICE, "web") is None

    await async_wait_for(gone, timeout=30, message="Service web gone")


async def test_a_force_deleted_services_group_on_a_load_balancer_no_one_names_is_collected_after_restart(
    control_plane: LocalControlPlane,
    cluster: Cluster,
    emulator: tuple[dict[str, str], EmulatorAdmin],
) -> None:
    info, admin = emulator
    name = f"resourceconsist/{cluster.namespace}/web"
    foreign_tags = {
        CLUSTER_TAG: OTHER,
        SERVICE_NAMESPACE_TAG: cluster.namespace,
        SERVICE_NAME_TAG: "web",
        SERVICE_UID_TAG: "uid-of-theirs",
    }
    # Another cluster's group of the same name on the same load balancer, and one of a Service
    # that cluster no longer has.
    foreign = admin.add_vserver_group(ALONE, name, tags=foreign_tags)
    foreign_gone = admin.add_vserver_group(
        ALONE, f"resourceconsist/{cluster.namespace}/gone", tags={**foreign_tags, SERVICE_NAME_TAG: "gone"}
    )
    foreign_before = {g["id"]: g for g in _groups(admin) if g["id"] in (foreign, foreign_gone)}

    async with _controller(cluster, control_plane.kubeconfig, info):
        group = await _serve_web(cluster, admin, name)
    service_uid = group["tags"][SERVICE_UID_TAG]
    assert group["tags"] == {
        CLUSTER_TAG: CLUSTER,
        SERVICE_NAMESPACE_TAG: cluster.namespace,
        SERVICE_NAME_TAG: "web",
        SERVICE_UID_TAG: service_uid,
    }
    await _force_delete(cluster)
    # Down time: the group still routes to both pods, which keep the Service's finalizer.
    assert sorted(b["Weight"] for b in _ours(admin, name)[0]["backends"]) == [100, 100]

    async with _controller(cluster, control_plane.kubeconfig, info) as controller:

        async def collected_and_released() -> bool:
            if _ours(admin, name):
                return False
            for pod in PODS:
                held = finalizers(await cluster.get(kube.POD, pod))
                if FLZ in held or GUARD in held:
                    return False
            return True

        await async_wait_for(
            collected_and_released, timeout=90, message="the orphaned group collected and its pods released"
        )
        # Drained before the group went: each backend set to weight 0, then removed from it at
        # weight 0; none went with the group at full weight (issue 33).
        history, _ = admin.history()
        mine = [c for c in history if c["vserver_group_id"] == group["id"]]
        drained = [c for c in mine if c["change"] == "weight" and c["Weight"] == 0]
        removed = [c for c in mine if c["change"] == "removed"]
        assert len(drained) == len(removed) == len(PODS), mine
        assert all(c["old_weight"] == 0 for c in removed), removed
        assert max(c["seq"] for c in drained) < min(c["seq"] for c in removed)
        await cluster.delete(kube.POD, "web-0")

        async def deleted() -> bool:
            return await cluster.get(kube.POD, "web-0") is None

        await async_wait_for(deleted, timeout=30, message="web-0's deletion completes")
        # Later garbage passes leave the other cluster's groups alone too.
        passes = _describe_load_balancers_calls(admin)
        await async_wait_for(
            lambda: _describe_load_balancers_calls(admin) >= passes + 2,
            timeout=60,
            message="two more garbage passes",
        )
        assert f"gone {cluster.namespace}/web" in controller.output
    foreign_after = {g["id"]: g for g in _groups(admin) if g["id"] in (foreign, foreign_gone)}
    assert foreign_after == foreign_before, "another cluster's groups are never changed or collected"
    history, _ = admin.history()
    assert not [c for c in history if c["vserver_group_id"] in (foreign, foreign_gone)]


async def test_a_service_recreated_under_the_same_name_keeps_its_group_after_restart(
    control_plane: LocalControlPlane,
    cluster: Cluster,
    emulator: tuple[dict[str, str], EmulatorAdmin],
) -> None:
    info, admin = emulator
    name = f"resourceconsist/{cluster.namespace}/web"
    async with _controller(cluster, control_plane.kubeconfig, info):
        group = await _serve_web(cluster, admin, name)
    await _force_delete(cluster)
    recreated = await cluster.service(
        "web", labels={LOAD_BALANCER_ID_LABEL: ALONE}, annotations={MODE_ANNOTATION: "manage"}
    )
    new_uid = recreated["metadata"]["uid"]
    assert new_uid != group["tags"][SERVICE_UID_TAG]

    async with _controller(cluster, control_plane.kubeconfig, info):

        def retagged() -> bool:
            found = _ours(admin, name)
            return len(found) == 1 and found[0]["tags"][SERVICE_UID_TAG] == new_uid

        await async_wait_for(retagged, timeout=90, message="the kept group tagged with the new Service's UID")
        passes = _describe_load_balancers_calls(admin)
        await async_wait_for(
            lambda: _describe_load_balancers_calls(admin) >= passes + 2,
            timeout=60,
            message="two garbage passes with the re-created Service in place",
        )
        (kept,) = _ours(admin, name)
        assert kept["id"] == group["id"]
        assert sorted(b["Weight"] for b in kept["backends"]) == [100, 100]
        for pod in PODS:
            assert FLZ in finalizers(await cluster.get(kube.POD, pod)), f"{pod} still guarded"
