"""Pins every wire name byte for byte against the contract (docs/wire-contract.md).

These strings are shared with KusionStack ResourceConsist (Go), PodOpsLifecycle and Alibaba
Cloud; a change here breaks a running cluster. The literals below are written out in full on
purpose: do not derive them from ``resourceconsist.wire``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from resourceconsist import wire
from resourceconsist.adapters.alibabacloudslb import config as slb_config
from resourceconsist.adapters.alibabacloudslb import credentials as slb_credentials
from resourceconsist.adapters.alibabacloudslb import settings as slb_settings
from resourceconsist.rules import lifecycle
from resourceconsist.wire import EventReason, GateReason

PINNED: dict[str, Any] = {
    "CONTROL_LABEL": "kusionstack.io/control",
    "CONTROL_LABEL_VALUE": "true",
    "CLEAN_FINALIZER": "resource-consist.kusionstack.io/clean-finalizer",
    "OLD_CLEAN_FINALIZER_PREFIX": "resource-consist.kusionstack.io/clean-",
    "AVAILABLE_CONDITIONS_ANNOTATION": "pod.kusionstack.io/available-conditions",
    "EXPECTED_FINALIZERS_KEY": "expectedFinalizers",
    "LIFECYCLE_FINALIZER_PREFIX": "prot.podopslifecycle.kusionstack.io",
    "GUARD_FINALIZER_PREFIX": "guard.resource-consist.kusionstack.io",
    "EXPECTED_FINALIZER_ADDED_ANNOTATION": (
        "resource-consist.kusionstack.io/employees-expected-finalizer-added"
    ),
    "LIFECYCLE_FINALIZER_RECORDED_ANNOTATION": (
        "resource-consist.kusionstack.io/employees-lifecycle-finalizer-recorded"
    ),
    "SERVICE_READY_CONDITION": "pod.kusionstack.io/service-ready",
    "MULTI_CLUSTER_SEPARATOR": "#",
    "SHARD_RING_LABEL": "alpha.sharding.timebertt.dev/controllerring",
    "SHARD_LABEL_PREFIX": "shard.alpha.sharding.timebertt.dev/",
    "DRAIN_LABEL_PREFIX": "drain.alpha.sharding.timebertt.dev/",
    "SHARD_LEASE_TAKEN_BY_SHARDER": "shardlease-controller",
    "EMPLOYER_LABEL": "resource-consist.kusionstack.io/employer",
    "EMPLOYER_LABEL_SHARED": "Shared",
    "PROVIDER_FAILURE_ANNOTATION": "resource-consist.kusionstack.io/provider-failure",
    "RECONCILE_ID_ANNOTATION": "resource-consist.kusionstack.io/reconcile-id",
    "READINESS_GATE_DOMAIN": "readiness.resource-consist.kusionstack.io",
    "READINESS_GATE_INJECT_LABEL": "resource-consist.kusionstack.io/readiness-gate-inject",
    "READINESS_GATE_INJECT_VALUE": "enabled",
    "READINESS_GATE_ANNOTATION": "resource-consist.kusionstack.io/readiness-gate",
    "READINESS_GATE_TIMEOUT_ANNOTATION": "resource-consist.kusionstack.io/readiness-gate-timeout",
    "DRAIN_SECONDS_ANNOTATION": "resource-consist.kusionstack.io/drain-seconds",
    "DRAIN_MODE_ANNOTATION": "resource-consist.kusionstack.io/drain-mode",
    "DRAIN_MODES": ("sleep", "wait"),
    "DRAIN_WAITER_CONTAINER": "resourceconsist-drain-waiter",
    "DRAIN_WAITER_PORT": 15381,
    "DRAIN_WAITER_PATH": "/wait",
    "DRAIN_RELEASED_PATH": "/drain/v1/released",
    "POD_NAMESPACE_ENV": "POD_NAMESPACE",
    "DEFAULT_NAMESPACE": "resourceconsist",
    "WEBHOOK_CERT_SECRET": "resourceconsist-webhook-certs",
    "WEBHOOK_CERT_KEYS": ("ca.key", "ca.crt", "tls.key", "tls.crt"),
    "MUTATING_WEBHOOK_CONFIGURATION": "resourceconsist-manager-mutating",
    "VALIDATING_WEBHOOK_CONFIGURATION": "resourceconsist-manager-validating",
}

#: Names the SLB adapter shares with the Go adapter and Alibaba Cloud, pinned where they live.
SLB_PINNED: dict[tuple[ModuleType, str], str] = {
    (slb_config, "LOAD_BALANCER_ID_LABEL"): "service.k8s.alibaba/loadbalancer-id",
    (slb_credentials, "SLB_ACCESS_KEY_ENV"): "ALIYUN_SLB_AK_KEY",
    (slb_credentials, "SLB_ACCESS_SECRET_ENV"): "ALIYUN_SLB_AK_SECRET",
    (slb_credentials, "SLB_ENDPOINT_ENV"): "ALIYUN_SLB_ENDPOINT",
    # Alibaba Cloud's standard credential variables (RRSA, credentials file, ECS RAM role), which
    # the chart and ACK set and the credentials library reads.
    (slb_credentials, "ROLE_ARN_ENV"): "ALIBABA_CLOUD_ROLE_ARN",
    (slb_credentials, "OIDC_PROVIDER_ARN_ENV"): "ALIBABA_CLOUD_OIDC_PROVIDER_ARN",
    (slb_credentials, "OIDC_TOKEN_FILE_ENV"): "ALIBABA_CLOUD_OIDC_TOKEN_FILE",
    (slb_credentials, "ROLE_SESSION_NAME_ENV"): "ALIBABA_CLOUD_ROLE_SESSION_NAME",
    (slb_credentials, "STS_REGION_ENV"): "ALIBABA_CLOUD_STS_REGION",
    (slb_credentials, "STS_VPC_ENV"): "ALIBABA_CLOUD_VPC_ENDPOINT_ENABLED",
    (slb_credentials, "CREDENTIALS_FILE_ENV"): "ALIBABA_CLOUD_CREDENTIALS_FILE",
    (slb_credentials, "ECS_ROLE_ENV"): "ALIBABA_CLOUD_ECS_METADATA",
    # The adapter's own (docs/alibabacloudslb.md): tags on its VServer groups, its settings.
    (slb_config, "CLUSTER_TAG"): "resource-consist.kusionstack.io/cluster",
    (slb_config, "SERVICE_NAMESPACE_TAG"): "resource-consist.kusionstack.io/service-namespace",
    (slb_config, "SERVICE_NAME_TAG"): "resource-consist.kusionstack.io/service-name",
    (slb_config, "SERVICE_UID_TAG"): "resource-consist.kusionstack.io/service-uid",
    (slb_settings, "CLUSTER_NAME_ENV"): "ALIYUN_SLB_CLUSTER_NAME",
    (slb_settings, "LOAD_BALANCERS_ENV"): "ALIYUN_SLB_LOAD_BALANCERS",
    (slb_settings, "GARBAGE_CALL_BUDGET_ENV"): "ALIYUN_SLB_GARBAGE_CALL_BUDGET",
}

EVENT_REASONS: dict[str, str] = {
    "ENSURE_EMPLOYER_CLEAN_FINALIZER_FAILED": "EnsureEmployerCleanFinalizerFailed",
    "ENSURE_EMPLOYER_CLEAN_FINALIZER_SUCCEED": "EnsureEmployerCleanFinalizerSucceed",
    "ENSURE_EXPECTED_FINALIZER_FAILED": "EnsureExpectedFinalizerFailed",
    "GET_EXPECTED_EMPLOYER_FAILED": "GetExpectedEmployerFailed",
    "GET_CURRENT_EMPLOYER_FAILED": "GetCurrentEmployerFailed",
    "SYNC_EMPLOYER_FAILED": "SyncEmployerFailed",
    "GET_EXPECTED_EMPLOYEES_FAILED": "GetExpectedEmployeesFailed",
    "GET_CURRENT_EMPLOYEES_FAILED": "GetCurrentEmployeesFailed",
    "SYNC_EMPLOYEES_FAILED": "SyncEmployeesFailed",
    "CLEAN_EMPLOYER_CLEAN_FINALIZER_FAILED": "CleanEmployerCleanFinalizerFailed",
    "CLEAN_EMPLOYER_CLEAN_FINALIZER_SUCCEED": "CleanEmployerCleanFinalizerSucceed",
    "RECORD_STATUSES_FAILED": "RecordStatusesFailed",
    "RECORD_ERROR_CONDITIONS_FAILED": "RecordErrorConditionsFailed",
    "UPDATE_READINESS_GATES_FAILED": "UpdateReadinessGatesFailed",
}

#: Reasons of the readiness-gate conditions on pods (docs/wire-contract.md).
GATE_REASONS: dict[str, str] = {
    "SERVING": "ProviderServing",
    "NOT_SERVING": "ProviderNotServing",
    "CONTAINERS_NOT_READY": "ContainersNotReady",
    "PROVIDER_REFUSED": "ProviderRefused",
    "EMPLOYER_DELETED": "EmployerDeleted",
    "NOT_SELECTED": "NotSelected",
    "TIMEOUT": "ReadinessGateTimeout",
    "HANDED_OVER": "HandedOver",
}


@pytest.mark.parametrize(("name", "value"), sorted(PINNED.items()))
def test_constant_is_byte_identical(name: str, value: Any) -> None:
    actual = getattr(wire, name)
    assert type(actual) is type(value)
    assert actual == value
    if isinstance(value, str):
        assert actual.encode("utf-8") == value.encode("utf-8")


@pytest.mark.parametrize(
    ("module", "name", "value"),
    [(module, name, value) for (module, name), value in SLB_PINNED.items()],
    ids=[f"{module.__name__.rsplit('.', 1)[-1]}.{name}" for module, name in SLB_PINNED],
)
def test_slb_adapter_wire_name_is_byte_identical(module: ModuleType, name: str, value: str) -> None:
    actual = getattr(module, name)
    assert type(actual) is str
    assert actual.encode("utf-8") == value.encode("utf-8")


def test_every_public_constant_of_wire_is_pinned_here() -> None:
    constants = {name for name in vars(wire) if name.isupper() and not name.startswith("_")}
    assert constants == set(PINNED), "a wire constant was added or removed: pin it in tests/api/test_wire.py"


@pytest.mark.parametrize(("member", "value"), sorted(EVENT_REASONS.items()))
def test_event_reason_is_byte_identical(member: str, value: str) -> None:
    reason = EventReason[member]
    assert reason.value == value
    assert reason == value  # usable wherever a plain string is expected
    assert str(reason) == value
    assert f"{reason}" == value


def test_event_reasons_are_exactly_the_contract_set() -> None:
    assert {reason.name: reason.value for reason in EventReason} == EVENT_REASONS
    assert len(set(EVENT_REASONS.values())) == 14


def test_gate_reasons_are_exactly_the_contract_set() -> None:
    assert {reason.name: reason.value for reason in GateReason} == GATE_REASONS


def test_old_clean_finalizer_for_an_employer() -> None:
    assert wire.OLD_CLEAN_FINALIZER_PREFIX + "demo-svc" == "resource-consist.kusionstack.io/clean-demo-svc"


def test_lifecycle_finalizer_is_built_from_the_prefix_and_a_slash() -> None:
    digest = hashlib.md5(b"demo-svc").hexdigest()[8:24]
    assert lifecycle.lifecycle_finalizer("demo-svc") == "prot.podopslifecycle.kusionstack.io/" + digest
    assert lifecycle.lifecycle_finalizer("demo-svc") == "prot.podopslifecycle.kusionstack.io/ccccca6af890783e"


def test_expected_finalizer_key_format() -> None:
    assert lifecycle.expected_finalizer_key("Service", "ns", "name") == "Service/ns/name"


def test_multi_cluster_employee_name_format() -> None:
    assert "web-0" + wire.MULTI_CLUSTER_SEPARATOR + "member-1" == "web-0#member-1"


def test_guard_finalizer_is_our_prefix_and_the_lifecycle_hash() -> None:
    assert lifecycle.guard_finalizer("demo-svc") == "guard.resource-consist.kusionstack.io/ccccca6af890783e"


def test_readiness_gate_is_our_domain_and_the_name_or_a_hashed_form() -> None:
    assert lifecycle.readiness_gate("demo-svc") == "readiness.resource-consist.kusionstack.io/demo-svc"
    long = "a" * 64
    digest = hashlib.md5(long.encode()).hexdigest()[8:24]
    assert lifecycle.readiness_gate(long) == f"readiness.resource-consist.kusionstack.io/{'a' * 46}-{digest}"
    assert lifecycle.readiness_gate("b" * 63) == "readiness.resource-consist.kusionstack.io/" + "b" * 63


def test_the_wire_contract_page_lists_every_wire_name() -> None:
    """docs/wire-contract.md is the contract people read: each name on the wire is written there."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "wire-contract.md").read_text()
    values = [v for v in PINNED.values() if isinstance(v, str)] + list(GATE_REASONS.values())
    missing = [v for v in values if v not in page]
    assert not missing, f"docs/wire-contract.md does not name {missing}"
