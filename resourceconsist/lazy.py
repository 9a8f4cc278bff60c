"""Public names of a package loaded on first use (PEP 562): the package root and
``resourceconsist.webhook`` name their exports without importing the modules that hold them, so
importing either loads none of the runtime (docs/reference/options.md, "Import cost").

A package writes each public name once, as an import in its ``if TYPE_CHECKING:`` block: that
block is what type checkers and IDEs read, and it is the table this module reads (from the
package's source, on the first lookup) to know which module holds a name. The package's literal
``__all__`` (a computed one would hide the names from linters) must list the same names; a test
fails when it does not (tests/api/test_public_api.py).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def typing_imports(package: str) -> dict[str, str]:
    """Each name ``package``'s ``if TYPE_CHECKING:`` block imports, and the module it comes from."""
    source = Path(str(sys.modules[package].__file__)).read_text(encoding="utf-8")
    homes: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                if not isinstance(statement, ast.ImportFrom):
                    raise TypeError(
                        f"{package}: its TYPE_CHECKING block must hold only 'from MODULE import NAME' "
                        f"lines, the table of its public names (line {statement.lineno})"
                    )
                home = importlib.util.resolve_name("." * statement.level + (statement.module or ""), package)
                for alias in statement.names:
                    homes[alias.asname or alias.name] = home
    return homes


def lazy_exports(package: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose public names live in the modules its
    ``if TYPE_CHECKING:`` block imports them from, each loaded on first use."""
    namespace = vars(sys.modules[package])
    table: dict[str, str] = {}

    def homes() -> dict[str, str]:
        if not table:
            table.update(typing_imports(package))
        return table

    def getattr_(name: str) -> Any:
        home = homes().get(name) if not name.startswith("__") else None
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *homes()})

    return getattr_, dir_
