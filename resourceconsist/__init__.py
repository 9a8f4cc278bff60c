"""resourceconsist: keep external resources consistent with Kubernetes employers and employees.

The public API, importable from the package itself::

    from resourceconsist import Employee, KubeClient, Manager, ReconcileAdapter, add_to_manager

A manager's settings are one ``ManagerOptions`` (with ``LeaderElectionOptions``,
``GarbageOptions``, ``ProviderBudgetOptions``, ``ShardingOptions`` and
``SecureMetricsOptions``); the webhook's are ``resourceconsist.webhook.WebhookOptions``.

Names are loaded on first use (PEP 562), so ``import resourceconsist`` costs nothing a run does
not use. Modules keep their own, fuller APIs (``resourceconsist.testing`` for the testing kit,
``resourceconsist.wire`` for the wire contract: docs/wire-contract.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resourceconsist.lazy import lazy_exports

if TYPE_CHECKING:
    from resourceconsist.adapter import (
        CachedPodFieldsOptions,
        CompleteListingOptions,
        CUDResults,
        Employee,
        Employer,
        EmployerRequeueOptions,
        ExpectedFinalizerRecordOptions,
        MultiClusterOptions,
        OrphanCollectOptions,
        Outcome,
        OwnedItem,
        PodEmployeeStatuses,
        ReconcileAdapter,
        ReconcileContext,
        ReconcileLifecycleOptions,
        ReconcileOptions,
        ReconcileRequeueOptions,
        ReconcileWatchOptions,
        StatusRecordOptions,
        SubResourceOptions,
        pod_employee_statuses,
    )
    from resourceconsist.cluster.cache import CacheReader, WatchEvent
    from resourceconsist.cluster.kube import (
        ApiError,
        Conflict,
        Gone,
        KubeClient,
        KubeObject,
        NotFound,
        Resource,
    )
    from resourceconsist.errors import InvalidOptions, PermanentError, ResourceConsistError, RetryAfter
    from resourceconsist.hooks.subscribers import LifecycleEvent, LifecycleSubscriber
    from resourceconsist.options import (
        GarbageOptions,
        LeaderElectionOptions,
        ManagerOptions,
        ProviderBudgetOptions,
        SecureMetricsOptions,
        ShardingOptions,
    )
    from resourceconsist.runtime.controller import Controller
    from resourceconsist.runtime.manager import Manager, Runnable, add_to_manager

#: The public names, as the block above imports them (the one table of their homes,
#: resourceconsist.lazy); written out as a literal for linters, checked by tests/api/test_public_api.py.
__all__ = (
    "ApiError",
    "CUDResults",
    "CacheReader",
    "CachedPodFieldsOptions",
    "CompleteListingOptions",
    "Conflict",
    "Controller",
    "Employee",
    "Employer",
    "EmployerRequeueOptions",
    "ExpectedFinalizerRecordOptions",
    "GarbageOptions",
    "Gone",
    "InvalidOptions",
    "KubeClient",
    "KubeObject",
    "LeaderElectionOptions",
    "LifecycleEvent",
    "LifecycleSubscriber",
    "Manager",
    "ManagerOptions",
    "MultiClusterOptions",
    "NotFound",
    "OrphanCollectOptions",
    "Outcome",
    "OwnedItem",
    "PermanentError",
    "PodEmployeeStatuses",
    "ProviderBudgetOptions",
    "ReconcileAdapter",
    "ReconcileContext",
    "ReconcileLifecycleOptions",
    "ReconcileOptions",
    "ReconcileRequeueOptions",
    "ReconcileWatchOptions",
    "Resource",
    "ResourceConsistError",
    "RetryAfter",
    "Runnable",
    "SecureMetricsOptions",
    "ShardingOptions",
    "StatusRecordOptions",
    "SubResourceOptions",
    "WatchEvent",
    "add_to_manager",
    "pod_employee_statuses",
)


__getattr__, __dir__ = lazy_exports(__name__)
