"""The testing kit: a real local control plane, a working local cluster, pytest fixtures and
deadline-bound waits (docs/testing.md).

Adapter authors get the same real kube-apiserver + etcd in their own suites, and a cluster
where Deployments roll out on simulated nodes::

    from resourceconsist.testing import LocalCluster, LocalControlPlane

    with LocalControlPlane() as cp:
        api = cp.api_client()
    with LocalCluster(nodes=3) as cluster:
        api = cluster.api_client()
"""

from resourceconsist.testing.cluster import Cluster, annotation, condition, finalizers
from resourceconsist.testing.controlplane import (
    ETCD_VERSION,
    KUBERNETES_VERSION,
    SERVICE_CLUSTER_IP_RANGE,
    ControlPlaneBinariesMissing,
    ControlPlaneError,
    LocalControlPlane,
    default_assets_dir,
    find_binaries,
)
from resourceconsist.testing.localcluster import CONTROLLERS, LocalCluster
from resourceconsist.testing.wait import WaitTimeout, async_wait_for, wait_for

__all__ = [
    "CONTROLLERS",
    "ETCD_VERSION",
    "KUBERNETES_VERSION",
    "SERVICE_CLUSTER_IP_RANGE",
    "Cluster",
    "ControlPlaneBinariesMissing",
    "ControlPlaneError",
    "LocalCluster",
    "LocalControlPlane",
    "WaitTimeout",
    "annotation",
    "async_wait_for",
    "condition",
    "default_assets_dir",
    "finalizers",
    "find_binaries",
    "wait_for",
]
