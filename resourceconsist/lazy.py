"""Public names of a package loaded on first use (PEP 562): the package root and
``resourceconsist.webhook`` name their exports without importing the modules that hold them, so
importing either loads none of the runtime (docs/reference/options.md, "Import cost").
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose public names live in the modules
    ``homes`` gives, each loaded on first use."""
    namespace = vars(sys.modules[package])

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *homes})

    return getattr_, dir_
