"""Experimental adapters, by name. NOT FOR PRODUCTION: their behaviour and API may change.

``demo`` keeps an in-memory fake provider consistent with controlled Services and their pods;
it exists to show and test the frame.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from resourceconsist.registry import AdapterRegistry

if TYPE_CHECKING:
    from resourceconsist.adapter import ReconcileAdapter, WebhookAdapter
    from resourceconsist.runtime.controller import Controller
    from resourceconsist.runtime.manager import Manager

registry = AdapterRegistry(experimental=True)


def _demo(environ: Mapping[str, str]) -> ReconcileAdapter:
    from resourceconsist.experimental.demo import DemoAdapter

    return DemoAdapter()


def _demo_webhook(environ: Mapping[str, str]) -> WebhookAdapter:
    from resourceconsist.webhook import ControlledServiceAdapter

    return ControlledServiceAdapter("demo")


registry.register(
    "demo", controller=_demo, webhook=_demo_webhook, description="in-memory fake provider (experimental)"
)


async def add_to_manager(
    manager: Manager, names: Iterable[str], environ: Mapping[str, str] | None = None
) -> list[Controller]:
    return await registry.add_to_manager(manager, names, environ)
