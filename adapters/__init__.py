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
    from resourceconsist.controller import Controller
    from resourceconsist.manager import Manager

registry = AdapterRegistry()


async def add_to_manager(
    manager: Manager, names: Iterable[str], environ: Mapping[str, str] | None = None
) -> list[Controller]:
    return await registry.add_to_manager(manager, names, environ)


async def add_all_to_manager(manager: Manager, environ: Mapping[str, str] | None = None) -> list[Controller]:
    return await registry.add_all_to_manager(manager, environ)
