"""The testing kit: a real local control plane, pytest fixtures and deadline-bound waits.

Adapter authors get the same real kube-apiserver + etcd in their own suites::

    from resourceconsist.testing import LocalControlPlane

    with LocalControlPlane() as cp:
        api = cp.api_client()
"""

from resourceconsist.testing.cluster import Cluster, annotation, finalizers
from resourceconsist.testing.controlplane import (
    ETCD_VERSION,
    KUBERNETES_VERSION,
    ControlPlaneBinariesMissing,
    ControlPlaneError,
    LocalControlPlane,
    default_assets_dir,
    find_binaries,
)
from resourceconsist.testing.wait import WaitTimeout, async_wait_for, wait_for

__all__ = [
    "ETCD_VERSION",
    "KUBERNETES_VERSION",
    "Cluster",
    "ControlPlaneBinariesMissing",
    "ControlPlaneError",
    "LocalControlPlane",
    "WaitTimeout",
    "annotation",
    "async_wait_for",
    "default_assets_dir",
    "finalizers",
    "find_binaries",
    "wait_for",
]
