"""The HAProxy adapter: keeps the servers of HAProxy backends consistent with the pods of
Services, on one HAProxy or several kept in step (an HA pair), through HAProxy's runtime API.

``adapter`` holds ``HAProxyAdapter``; ``manage`` one pass of one Service (reading, planning,
converging its servers); ``items`` the employee items; ``config`` the annotations read on
Services and pods and the servers' names; ``runtime`` the runtime API client; ``settings`` what
the environment configures. The registry factories are ``controller_from_env`` and
``webhook_from_env``; usage: docs/haproxy.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from .adapter import CONTROLLER_NAME, DEFAULT_RESYNC_SECONDS, HAProxyAdapter
from .config import (
    BACKEND_ANNOTATION,
    DEFAULT_DRAIN_SECONDS,
    MODE_ANNOTATION,
    OPTIONS_ANNOTATION,
    PORT_ANNOTATION,
    WEIGHT_ANNOTATION,
    HAProxyConfigError,
    is_haproxy_service,
    owner_of,
    server_name,
)
from .runtime import (
    Refusal,
    RuntimeAddress,
    RuntimeAPI,
    RuntimeAPIError,
    RuntimeAPIRefused,
    RuntimeAPIUnavailable,
    RuntimeTLS,
    ServerStat,
    Stat,
)
from .settings import RUNTIME_API_ENV, HAProxySettings

if TYPE_CHECKING:
    from resourceconsist.webhook.adapter import ControlledServiceAdapter

__all__ = [
    "BACKEND_ANNOTATION",
    "CONTROLLER_NAME",
    "DEFAULT_DRAIN_SECONDS",
    "DEFAULT_RESYNC_SECONDS",
    "MODE_ANNOTATION",
    "OPTIONS_ANNOTATION",
    "PORT_ANNOTATION",
    "RUNTIME_API_ENV",
    "WEBHOOK_ADAPTER_NAME",
    "WEIGHT_ANNOTATION",
    "HAProxyAdapter",
    "HAProxyConfigError",
    "HAProxySettings",
    "Refusal",
    "RuntimeAPI",
    "RuntimeAPIError",
    "RuntimeAPIRefused",
    "RuntimeAPIUnavailable",
    "RuntimeAddress",
    "RuntimeTLS",
    "ServerStat",
    "Stat",
    "controller_from_env",
    "is_haproxy_service",
    "owner_of",
    "server_name",
    "webhook_adapter",
    "webhook_from_env",
]


def controller_from_env(environ: Mapping[str, str]) -> HAProxyAdapter:
    """The registry's controller factory: the instances of ``HAPROXY_RUNTIME_API`` (with the TLS
    settings a ``tls://`` address needs), ``HAProxyConfigError`` at start-up naming what to set."""
    settings = HAProxySettings.from_env(environ)
    return HAProxyAdapter(settings.instances(), resync_seconds=settings.resync)


#: Name of the HAProxy webhook adapter; served at ``/mutating-haproxy``.
WEBHOOK_ADAPTER_NAME: Final = "haproxy"


def webhook_adapter() -> ControlledServiceAdapter:
    """The HAProxy webhook adapter: controlled Services that name a backend."""
    from resourceconsist.webhook import ControlledServiceAdapter

    return ControlledServiceAdapter(WEBHOOK_ADAPTER_NAME, predicate=is_haproxy_service)


def webhook_from_env(environ: Mapping[str, str]) -> ControlledServiceAdapter:
    """The registry's webhook factory; the webhook needs no HAProxy."""
    return webhook_adapter()
