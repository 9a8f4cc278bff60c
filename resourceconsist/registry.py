"""Adapter registries by name: built-in, experimental, and third-party via entry points.

A registry maps a name to factories for a controller adapter and/or a webhook adapter.
``resourceconsist.adapters.registry`` holds the built-in ones, ``resourceconsist.experimental
.registry`` the experimental ones; third-party packages register theirs under the Python
entry-point group ``resourceconsist.adapters`` (an entry point names a callable that takes the
registry and registers into it), so ``resourceconsist run --adapter theirs`` finds them.
Factories take the process environment, so missing settings fail at start-up with a message.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, TypeAlias

from resourceconsist.errors import ResourceConsistError

# The adapter API (and pydantic) only for the types: ``resourceconsist adapters`` lists the
# registries without loading it (docs/reference/options.md, "Import cost").
if TYPE_CHECKING:
    from resourceconsist.adapter import ReconcileAdapter, WebhookAdapter
    from resourceconsist.runtime.controller import Controller
    from resourceconsist.runtime.manager import Manager

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "resourceconsist.adapters"

ControllerFactory: TypeAlias = "Callable[[Mapping[str, str]], ReconcileAdapter]"
#: Builds a webhook adapter (served by ``resourceconsist.webhook``) from the environment.
WebhookFactory: TypeAlias = "Callable[[Mapping[str, str]], WebhookAdapter]"


class UnknownAdapterError(ResourceConsistError, LookupError):
    """A name no registry knows; the message lists the names that exist."""


@dataclass(frozen=True)
class AdapterEntry:
    name: str
    controller: ControllerFactory | None
    webhook: WebhookFactory | None
    description: str
    experimental: bool


class AdapterRegistry:
    """Named adapter factories."""

    def __init__(self, *, experimental: bool = False) -> None:
        self.experimental = experimental
        self._entries: dict[str, AdapterEntry] = {}

    def register(
        self,
        name: str,
        *,
        controller: ControllerFactory | None = None,
        webhook: WebhookFactory | None = None,
        description: str = "",
    ) -> None:
        if name in self._entries:
            raise ValueError(f"an adapter named {name!r} is already registered")
        if controller is None and webhook is None:
            raise ValueError(f"adapter {name!r} needs a controller or a webhook factory")
        self._entries[name] = AdapterEntry(name, controller, webhook, description, self.experimental)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, name: str) -> AdapterEntry:
        found = self._entries.get(name)
        if found is None:
            raise UnknownAdapterError(
                f"no adapter named {name!r}; known adapters: {', '.join(self.names()) or 'none'}"
            )
        return found

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def controller(self, name: str, environ: Mapping[str, str] | None = None) -> ReconcileAdapter:
        entry = self.entry(name)
        if entry.controller is None:
            raise UnknownAdapterError(f"adapter {name!r} has no controller (it only serves a webhook)")
        return entry.controller(os.environ if environ is None else environ)

    def webhook(self, name: str, environ: Mapping[str, str] | None = None) -> WebhookAdapter:
        entry = self.entry(name)
        if entry.webhook is None:
            raise UnknownAdapterError(f"adapter {name!r} has no webhook adapter")
        return entry.webhook(os.environ if environ is None else environ)

    async def add_to_manager(
        self, manager: Manager, names: Iterable[str], environ: Mapping[str, str] | None = None
    ) -> list[Controller]:
        """Add the controllers of ``names`` (Go: ``AddBuiltinControllerAdaptersToMgr``).

        Every name is resolved and every adapter built before any is added, so one unknown
        name or missing setting leaves the manager untouched."""
        adapters = [self.controller(name, environ) for name in names]
        return [await manager.add(adapter) for adapter in adapters]

    async def add_all_to_manager(
        self, manager: Manager, environ: Mapping[str, str] | None = None
    ) -> list[Controller]:
        names = [n for n in self.names() if self._entries[n].controller is not None]
        return await self.add_to_manager(manager, names, environ)


def combined(*registries: AdapterRegistry, include_entry_points: bool = True) -> AdapterRegistry:
    """One registry holding the entries of ``registries`` plus third-party entry points."""
    merged = AdapterRegistry()
    for registry in registries:
        for name in registry.names():
            merged._entries[name] = registry.entry(name)
    if include_entry_points:
        load_entry_points(merged)
    return merged


def load_entry_points(registry: AdapterRegistry) -> None:
    """Let installed third-party packages register into ``registry``."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            register: Callable[[AdapterRegistry], None] = ep.load()
            register(registry)
        except Exception:
            log.exception("adapter entry point %s (%s) failed to load", ep.name, ep.value)
