"""The wire contract: every name resourceconsist shares with KusionStack ResourceConsist (Go),
and PodOpsLifecycle, in one place. Names one adapter shares with its provider live in that
adapter (the SLB adapter's label and environment variables: ``adapters/alibabacloudslb``).

These strings are read and written by other controllers; changing one breaks a running cluster.
``tests/api/test_wire.py`` pins each of them byte for byte; docs/wire-contract.md documents them,
with the annotation format, the Event reasons and the failure messages.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

#: Label that opts a Service in for the default controllers and the webhook's objectSelector.
CONTROL_LABEL: Final = "kusionstack.io/control"
CONTROL_LABEL_VALUE: Final = "true"

#: Finalizer the frame keeps on an employer until its provider side is clean.
CLEAN_FINALIZER: Final = "resource-consist.kusionstack.io/clean-finalizer"
#: Prefix of the old per-employer clean finalizer (``<prefix><employer name>``); migrated away from.
OLD_CLEAN_FINALIZER_PREFIX: Final = "resource-consist.kusionstack.io/clean-"

#: Pod annotation listing the finalizers a pod needs before it is service-available.
AVAILABLE_CONDITIONS_ANNOTATION: Final = "pod.kusionstack.io/available-conditions"
#: Key of the map inside that annotation's JSON.
EXPECTED_FINALIZERS_KEY: Final = "expectedFinalizers"
#: Prefix of the lifecycle finalizer one employer puts on a pod (``<prefix>/<hash>``).
LIFECYCLE_FINALIZER_PREFIX: Final = "prot.podopslifecycle.kusionstack.io"
#: Prefix of the guard finalizer one employer puts on a pod before the provider may route to it
#: (``<prefix>/<hash>``, the lifecycle finalizer's hash). Our own name, not the Go original's:
#: it blocks deletion while a registration exists without telling Operating "served"
#: (docs/concepts.md, "The guard").
GUARD_FINALIZER_PREFIX: Final = "guard.resource-consist.kusionstack.io"

#: Employer annotation (record mode): pods whose expected-finalizer entry was added.
EXPECTED_FINALIZER_ADDED_ANNOTATION: Final = (
    "resource-consist.kusionstack.io/employees-expected-finalizer-added"
)
#: Employer annotation (record mode): pods that carry this employer's lifecycle finalizer.
LIFECYCLE_FINALIZER_RECORDED_ANNOTATION: Final = (
    "resource-consist.kusionstack.io/employees-lifecycle-finalizer-recorded"
)

#: Pod readiness gate and condition type of PodOpsLifecycle.
SERVICE_READY_CONDITION: Final = "pod.kusionstack.io/service-ready"

#: Domain of the pod readiness gates the frame owns: one condition type per employer,
#: ``<domain>/<employer name>`` (a hashed form for names that do not fit a qualified name),
#: made by ``lifecycle.readiness_gate`` (docs/zero-downtime.md).
READINESS_GATE_DOMAIN: Final = "readiness.resource-consist.kusionstack.io"
#: Namespace label that lets the webhook change the pod specs of the namespace (readiness
#: gates, preStop hooks); the employers' annotations below say which changes.
READINESS_GATE_INJECT_LABEL: Final = "resource-consist.kusionstack.io/readiness-gate-inject"
READINESS_GATE_INJECT_VALUE: Final = "enabled"
#: Employer annotation, ``"true"``: the webhook gives the pods it selects its readiness gate.
READINESS_GATE_ANNOTATION: Final = "resource-consist.kusionstack.io/readiness-gate"
#: Employer annotation: the fail-safe, off when absent. After this long (``"90"``, ``"90s"``,
#: ``"5m"``) without the provider serving a pod that is otherwise ready, the gate goes True.
READINESS_GATE_TIMEOUT_ANNOTATION: Final = "resource-consist.kusionstack.io/readiness-gate-timeout"
#: Employer annotation: seconds the load balancer needs to let a pod go; the webhook gives the
#: pods it selects a ``preStop`` sleep that long.
DRAIN_SECONDS_ANNOTATION: Final = "resource-consist.kusionstack.io/drain-seconds"
#: Employer annotation: how the drain ends. ``sleep`` (the default): the ``preStop`` sleeps the
#: drain seconds. ``wait``: the ``preStop`` asks the pod's drain waiter (a sidecar the webhook adds),
#: which waits for a manager's word that no provider routes to the pod any more, at most the drain
#: seconds (docs/zero-downtime.md, "A drain that waits for the provider").
DRAIN_MODE_ANNOTATION: Final = "resource-consist.kusionstack.io/drain-mode"
DRAIN_MODES: Final = ("sleep", "wait")
#: The drain waiter: the native sidecar's container name, the port it listens on in the pod, and
#: the path the containers' ``preStop`` hook (an ``httpGet`` the kubelet sends) asks.
DRAIN_WAITER_CONTAINER: Final = "resourceconsist-drain-waiter"
DRAIN_WAITER_PORT: Final = 15381
DRAIN_WAITER_PATH: Final = "/wait"
#: The managers' endpoint the waiter asks (``resourceconsist run --drain-bind-address``):
#: ``GET <path>?namespace=&pod=&uid=&wait=<s>`` answers ``{"released": bool, "holding": [...]}``.
DRAIN_RELEASED_PATH: Final = "/drain/v1/released"

#: Annotation of the Warning Events the frame records for a provider failure that outlasted its
#: retries (docs/concepts.md, "When a failure becomes a Warning"): JSON ``{"operation": ...,
#: "item": ..., "code": ..., "message": ...}``, read by ``resourceconsist explain``.
PROVIDER_FAILURE_ANNOTATION: Final = "resource-consist.kusionstack.io/provider-failure"

#: Annotation of the Events a controller records during a pass: that pass's ``reconcileID``, the
#: key of its log lines (docs/observability.md, "Logs"); a repeat folded into the Event names
#: the last pass that recorded it. The project's own, not the Go original's.
RECONCILE_ID_ANNOTATION: Final = "resource-consist.kusionstack.io/reconcile-id"

#: Separator of a multi-cluster employee name: ``<pod name>#<cluster name>``.
MULTI_CLUSTER_SEPARATOR: Final = "#"

#: Webhook certificates: the Secret (in ``$POD_NAMESPACE``), its keys, and the configurations
#: whose caBundle the bootstrap fills.
POD_NAMESPACE_ENV: Final = "POD_NAMESPACE"
DEFAULT_NAMESPACE: Final = "resourceconsist"
WEBHOOK_CERT_SECRET: Final = "resourceconsist-webhook-certs"
WEBHOOK_CERT_KEYS: Final = ("ca.key", "ca.crt", "tls.key", "tls.crt")
MUTATING_WEBHOOK_CONFIGURATION: Final = "resourceconsist-manager-mutating"
VALIDATING_WEBHOOK_CONFIGURATION: Final = "resourceconsist-manager-validating"


#: Sharding: kubernetes-controller-sharding's label protocol (docs/scaling.md), so that project's
#: sharder can assign employers to this controller's shards. A shard Lease carries the ring label
#: (value: the ControllerRing's name); an employer carries the shard label (key: prefix + ring,
#: value: the shard's name) and, while it is being moved, the drain label (key: prefix + ring).
SHARD_RING_LABEL: Final = "alpha.sharding.timebertt.dev/controllerring"
SHARD_LABEL_PREFIX: Final = "shard.alpha.sharding.timebertt.dev/"
DRAIN_LABEL_PREFIX: Final = "drain.alpha.sharding.timebertt.dev/"
#: The holder the sharder writes into the Lease of a shard gone silent, marking it dead.
SHARD_LEASE_TAKEN_BY_SHARDER: Final = "shardlease-controller"
#: Sharding's pod label (docs/scaling.md, "Pods selected by the API server"), this project's own:
#: the employer a pod's watch events go to. Its value is the one Service that selects the pod or
#: whose marks it carries, or ``EMPLOYER_LABEL_SHARED`` for more than one (or one the writer cannot
#: name). Only ever widened: absent -> a name -> shared, so no shard that saw the pod stops seeing it.
EMPLOYER_LABEL: Final = "resource-consist.kusionstack.io/employer"
#: Not a Service name (those are lower-case DNS labels): every shard watches pods labelled so.
EMPLOYER_LABEL_SHARED: Final = "Shared"


class GateReason(StrEnum):
    """Reasons of the readiness-gate conditions the frame writes on pods (docs/zero-downtime.md)."""

    SERVING = "ProviderServing"  # True: the provider confirmed it serves the pod
    NOT_SERVING = "ProviderNotServing"  # False: a ready pod it does not serve (yet, or any more)
    #: False: the pod's containers or other readiness gates are not ready, so the provider is
    #: not asked to serve it yet.
    CONTAINERS_NOT_READY = "ContainersNotReady"
    #: False: the provider refused the call that would register the pod (the message carries
    #: the provider's code and message).
    PROVIDER_REFUSED = "ProviderRefused"
    EMPLOYER_DELETED = "EmployerDeleted"  # True: the employer is deleted
    NOT_SELECTED = "NotSelected"  # True: the employer no longer employs the pod
    TIMEOUT = "ReadinessGateTimeout"  # True: the fail-safe's timeout ran out (also a Warning Event)
    #: True: ``resourceconsist handover`` opened it for a controller that does not write the
    #: frame's gates (docs/wire-contract.md, "Switching back to the Go original").
    HANDED_OVER = "HandedOver"


class EventReason(StrEnum):
    """Reasons of the Events the frame records on an employer (Warning unless noted)."""

    ENSURE_EMPLOYER_CLEAN_FINALIZER_FAILED = "EnsureEmployerCleanFinalizerFailed"
    ENSURE_EMPLOYER_CLEAN_FINALIZER_SUCCEED = "EnsureEmployerCleanFinalizerSucceed"  # Normal
    ENSURE_EXPECTED_FINALIZER_FAILED = "EnsureExpectedFinalizerFailed"
    GET_EXPECTED_EMPLOYER_FAILED = "GetExpectedEmployerFailed"
    GET_CURRENT_EMPLOYER_FAILED = "GetCurrentEmployerFailed"
    SYNC_EMPLOYER_FAILED = "SyncEmployerFailed"
    GET_EXPECTED_EMPLOYEES_FAILED = "GetExpectedEmployeesFailed"
    GET_CURRENT_EMPLOYEES_FAILED = "GetCurrentEmployeesFailed"
    SYNC_EMPLOYEES_FAILED = "SyncEmployeesFailed"
    CLEAN_EMPLOYER_CLEAN_FINALIZER_FAILED = "CleanEmployerCleanFinalizerFailed"
    CLEAN_EMPLOYER_CLEAN_FINALIZER_SUCCEED = "CleanEmployerCleanFinalizerSucceed"  # Normal
    RECORD_STATUSES_FAILED = "RecordStatusesFailed"
    RECORD_ERROR_CONDITIONS_FAILED = "RecordErrorConditionsFailed"
    #: Beyond Go: a readiness-gate condition could not be written, or an annotation of the
    #: zero-downtime options is unreadable (docs/zero-downtime.md).
    UPDATE_READINESS_GATES_FAILED = "UpdateReadinessGatesFailed"
