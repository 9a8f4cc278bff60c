"""What an adapter's optional protocols say for one pass, and their defaults when it does not
implement them (docs/reference/adapter.md, "Optional capabilities and their defaults"):
whether its employers' pods follow PodOpsLifecycle, whether its pod employees live in member
clusters, which records it keeps, and which employees an employer selects.
"""

from __future__ import annotations

from collections.abc import Callable

from resourceconsist.adapter import (
    ExpectedFinalizerRecordOptions,
    MultiClusterOptions,
    ReconcileAdapter,
    ReconcileContext,
    ReconcileLifecycleOptions,
)
from resourceconsist.cluster import kube
from resourceconsist.cluster.interfaces import ObjectReader
from resourceconsist.cluster.kube import KubeObject, Resource
from resourceconsist.flow.cancellation import call_adapter


def follows_lifecycle(adapter: ReconcileAdapter, employee_resource: Resource) -> bool:
    """The employers' pods carry their marks: entries, guard and lifecycle finalizers."""
    if employee_resource != kube.POD:
        return False
    if isinstance(adapter, ReconcileLifecycleOptions):
        return adapter.follow_pod_ops_lifecycle()
    return True


def employees_in_members(adapter: ReconcileAdapter) -> Callable[[], bool]:
    """Asks whether pod employees live in member clusters (named ``pod#cluster``), each time
    (the adapter answers while it runs)."""
    # A runtime-checkable protocol's isinstance walks its members: once here, not per pod.
    if not isinstance(adapter, MultiClusterOptions):
        return lambda: False
    multi_cluster = adapter
    return lambda: not multi_cluster.employee_fed()


def records_lifecycle_finalizers(adapter: ReconcileAdapter) -> bool:
    return (
        isinstance(adapter, ReconcileLifecycleOptions) and adapter.need_record_lifecycle_finalizer_condition()
    )


def records_expected_finalizers(adapter: ReconcileAdapter) -> bool:
    return isinstance(adapter, ExpectedFinalizerRecordOptions) and (
        adapter.need_record_expected_finalizer_condition()
    )


async def selected_names(
    adapter: ReconcileAdapter,
    ctx: ReconcileContext,
    employer: KubeObject,
    employer_resource: Resource,
    reader: ObjectReader,
) -> list[str]:
    """The employees the employer selects: the adapter's answer, else a Service's pods."""
    if isinstance(adapter, ReconcileLifecycleOptions):
        return list(await call_adapter(adapter.get_selected_employee_names, ctx, employer))
    if employer_resource == kube.SERVICE:
        return [pod["metadata"]["name"] for pod in reader.pods_selected_by(employer)]
    return []
