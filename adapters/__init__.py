"""Built-in adapters, by name (Go: ``AddBuiltinControllerAdaptersToMgr``).

``registry`` knows every built-in adapter; ``add_to_manager(manager, ["alibabacloudslb"])``
adds the named ones, ``add_all_to_manager(manager)`` all of them. An unknown name fails with
the list of known names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from resourceconsist.registry import AdapterRegistry

if TYPE_CHECKING:
    from resourceconsist.adapter import ReconcileAdapter, WebhookAdapter
    from resourceconsist.runtime.controller import Controller
    from resourceconsist.runtime.manager import Manager

registry = AdapterRegistry()


# The factories import their adapter on first use: listing the registry does not load every
# provider's SDK.
def _alibabacloudslb_controller(environ: Mapping[str, str]) -> ReconcileAdapter:
    from resourceconsist.adapters.alibabacloudslb import controller_from_env

    return controller_from_env(environ)


def _alibabacloudslb_webhook(environ: Mapping[str, str]) -> WebhookAdapter:
    from resourceconsist.adapters.alibabacloudslb import webhook_from_env

    return webhook_from_env(environ)


registry.register(
    "alibabacloudslb",
    controller=_alibabacloudslb_controller,
    webhook=_alibabacloudslb_webhook,
    description="Alibaba Cloud SLB backends of controlled Services (observe CCM, or manage a VServer group)",
)


async def add_to_manager(
    manager: Manager, names: Iterable[str], environ: Mapping[str, str] | None = None
) -> list[Controller]:
    return await registry.add_to_manager(manager, names, environ)


async def add_all_to_manager(manager: Manager, environ: Mapping[str, str] | None = None) -> list[Controller]:
    return await registry.add_all_to_manager(manager, environ)
