"""The Alibaba Cloud SLB (CLB) adapter: keeps a load balancer's backends consistent with the pods a
Service selects, in observe mode (CCM owns the load balancer) or manage mode (we own a VServer group).

``adapter`` holds ``SLBAdapter``, which makes one strategy per pass from the Service's mode
(``strategy`` their shared base, ``observe`` and ``manage`` the two modes and their item planning;
docs/alibabacloudslb.md, "How the adapter is built"), ``items`` the employer/employee models,
``config`` the labels and annotations read on Services and pods, ``backoff`` the per-Service
requeue backoff, ``credentials`` the access key and endpoint, ``slbclient`` the SLB API through the
real Alibaba Cloud SDK; a stateful fake of that API for tests is in the testing kit
(``resourceconsist.adapters.alibabacloudslb.emulator``, installed with the ``testing`` extra). The registry
factories are ``controller_from_env`` and ``webhook_from_env``; usage: ``docs/alibabacloudslb.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from .adapter import CONTROLLER_NAME, SLBAdapter
from .backoff import RequeueBackoff
from .config import (
    BACKEND_TYPE_ANNOTATION,
    CLUSTER_TAG,
    DRAIN_ANNOTATION,
    LOAD_BALANCER_ID_LABEL,
    MODE_ANNOTATION,
    PORT_ANNOTATION,
    SERVER_ID_ANNOTATION,
    SERVICE_NAME_TAG,
    SERVICE_NAMESPACE_TAG,
    SERVICE_UID_TAG,
    WEIGHT_ANNOTATION,
    Mode,
    SLBConfigError,
    vserver_group_name,
)
from .credentials import CredentialsError, MissingCredentials, SLBAccess, SLBCredentials
from .manage import Unresolved, annotated_backend
from .settings import (
    CLUSTER_NAME_ENV,
    DEFAULT_GARBAGE_CALL_BUDGET,
    GARBAGE_CALL_BUDGET_ENV,
    LOAD_BALANCERS_ENV,
    SLBSettings,
)
from .slbclient import SLBClient, call_deadline_from_env
from .strategy import BackendResolver

if TYPE_CHECKING:
    from resourceconsist.webhook.adapter import ControlledServiceAdapter

__all__ = [
    "BACKEND_TYPE_ANNOTATION",
    "CLUSTER_NAME_ENV",
    "CLUSTER_TAG",
    "CONTROLLER_NAME",
    "DEFAULT_GARBAGE_CALL_BUDGET",
    "DRAIN_ANNOTATION",
    "GARBAGE_CALL_BUDGET_ENV",
    "LOAD_BALANCERS_ENV",
    "LOAD_BALANCER_ID_LABEL",
    "MODE_ANNOTATION",
    "PORT_ANNOTATION",
    "SERVER_ID_ANNOTATION",
    "SERVICE_NAMESPACE_TAG",
    "SERVICE_NAME_TAG",
    "SERVICE_UID_TAG",
    "WEBHOOK_ADAPTER_NAME",
    "WEIGHT_ANNOTATION",
    "BackendResolver",
    "CredentialsError",
    "MissingCredentials",
    "Mode",
    "RequeueBackoff",
    "SLBAccess",
    "SLBAdapter",
    "SLBClient",
    "SLBConfigError",
    "SLBCredentials",
    "SLBSettings",
    "Unresolved",
    "annotated_backend",
    "controller_from_env",
    "vserver_group_name",
    "webhook_adapter",
    "webhook_from_env",
]


def controller_from_env(environ: Mapping[str, str]) -> SLBAdapter:
    """The registry's controller factory: credentials from ``environ`` through ``SLBAccess.from_env``
    (RRSA, credentials file, ECS RAM role or a static pair; ``MissingCredentials`` at start-up
    when none is configured), an ``SLBClient`` on them (its call deadline from
    ``ALIYUN_SLB_CALL_DEADLINE_SECONDS``), the adapter on that with the settings of
    ``SLBSettings.from_env`` (cluster name, narrowing load balancers, garbage call budget)."""
    access = SLBAccess.from_env(environ)
    settings = SLBSettings.from_env(environ)
    return SLBAdapter(
        SLBClient(access, call_deadline_seconds=call_deadline_from_env(environ)),
        cluster_name=settings.cluster_name,
        load_balancers=settings.load_balancers,
        garbage_call_budget=settings.garbage_call_budget,
    )


#: Name of the SLB webhook adapter; served at ``/mutating-alibabacloudslb``.
WEBHOOK_ADAPTER_NAME: Final = "alibabacloudslb"


def webhook_adapter() -> ControlledServiceAdapter:
    """The SLB webhook adapter: controlled Services that carry
    ``service.k8s.alibaba/loadbalancer-id`` (the Services the SLB controller manages)."""
    from resourceconsist.webhook import ControlledServiceAdapter, has_label

    return ControlledServiceAdapter(WEBHOOK_ADAPTER_NAME, predicate=has_label(LOAD_BALANCER_ID_LABEL))


def webhook_from_env(environ: Mapping[str, str]) -> ControlledServiceAdapter:
    """The registry's webhook factory; the webhook needs no credentials."""
    return webhook_adapter()
