"""The testing kit: a real local control plane, a working local cluster, pytest fixtures and
deadline-bound waits (docs/testing.md).

Adapter authors get the same real kube-apiserver + etcd in their own suites, and a cluster
where Deployments roll out on simulated nodes::

    from resourceconsist.testing import LocalCluster, LocalControlPlane

    with LocalControlPlane() as cp:
        api = cp.api_client()
    with LocalCluster(nodes=3) as cluster:
        api = cluster.api_client()
    with RealNodeCluster(images=[archive]) as cluster:  # root: a real kubelet and containerd
        api = cluster.api_client()

The kit is generic: it imports no adapter. A provider's emulator lives beside its adapter (the
SLB one in ``resourceconsist.adapters.alibabacloudslb.emulator`` and ``.emulator_server``, which
need the ``testing`` extra: ``pip install 'resourceconsist[testing]'``).
"""

from resourceconsist.testing.cluster import Cluster, annotation, condition, finalizers, schemaless_crd
from resourceconsist.testing.controlplane import (
    ETCD_VERSION,
    HELM_VERSION,
    KUBERNETES_VERSION,
    SERVICE_CLUSTER_IP_RANGE,
    ControlPlaneBinariesMissing,
    ControlPlaneError,
    LocalControlPlane,
    default_assets_dir,
    find_binaries,
    find_helm,
    find_tool,
    free_port,
)
from resourceconsist.testing.garbage import CollectorFinds, collector_finds
from resourceconsist.testing.localcluster import CONTROLLERS, LocalCluster
from resourceconsist.testing.process import CLI, CommandProcess, run_cli
from resourceconsist.testing.realnode import RealNodeCluster, RealNodeUnavailable, find_image
from resourceconsist.testing.wait import WaitTimeout, async_wait_for, wait_for

__all__ = [
    "CLI",
    "CONTROLLERS",
    "ETCD_VERSION",
    "HELM_VERSION",
    "KUBERNETES_VERSION",
    "SERVICE_CLUSTER_IP_RANGE",
    "Cluster",
    "CollectorFinds",
    "CommandProcess",
    "ControlPlaneBinariesMissing",
    "ControlPlaneError",
    "LocalCluster",
    "LocalControlPlane",
    "RealNodeCluster",
    "RealNodeUnavailable",
    "WaitTimeout",
    "annotation",
    "async_wait_for",
    "collector_finds",
    "condition",
    "default_assets_dir",
    "finalizers",
    "find_binaries",
    "find_helm",
    "find_image",
    "find_tool",
    "free_port",
    "run_cli",
    "schemaless_crd",
    "wait_for",
]
