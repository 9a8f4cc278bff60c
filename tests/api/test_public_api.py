"""The curated public API: each package that exports lazily (the root and the webhook) writes its
public names once, as its ``TYPE_CHECKING`` imports; its literal ``__all__`` lists exactly those,
every one resolves to the object of its home module, and importing the package alone loads none
of the runtime."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest

import resourceconsist
import resourceconsist.webhook
from resourceconsist.lazy import typing_imports

LAZY_PACKAGES = ("resourceconsist", "resourceconsist.webhook")
PUBLIC_NAMES = [
    (package, name) for package in LAZY_PACKAGES for name in importlib.import_module(package).__all__
]


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_all_lists_exactly_the_names_the_typing_block_imports(package: str) -> None:
    names = importlib.import_module(package).__all__
    assert len(set(names)) == len(names), "a name twice in __all__"
    assert sorted(names) == sorted(typing_imports(package)), (
        f"{package}: add a public name to its TYPE_CHECKING imports and to __all__ alike"
    )


@pytest.mark.parametrize(("package", "name"), PUBLIC_NAMES)
def test_every_public_name_is_its_home_modules_object(package: str, name: str) -> None:
    home = importlib.import_module(typing_imports(package)[name])
    assert getattr(importlib.import_module(package), name) is getattr(home, name)


@contextmanager
def _lazy_package(tmp_path: Path, name: str, typing_block: str, all_line: str = "") -> Iterator[ModuleType]:
    """A throwaway package exporting lazily, its TYPE_CHECKING block being ``typing_block``."""
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from resourceconsist.lazy import lazy_exports\n"
        f"if TYPE_CHECKING:\n    {typing_block}\n{all_line}\n"
        "__getattr__, __dir__ = lazy_exports(__name__)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_a_name_in_the_typing_block_but_not_in_all_fails_the_check(tmp_path: Path) -> None:
    """The check above is not true by construction: a package whose block and ``__all__``
    disagree is told so."""
    block = "from resourceconsist.errors import PermanentError, RetryAfter"
    with _lazy_package(tmp_path, "halfpublic", block, "__all__ = ('PermanentError',)") as module:
        assert sorted(typing_imports("halfpublic")) == ["PermanentError", "RetryAfter"]
        assert sorted(module.__all__) != sorted(typing_imports("halfpublic"))
        assert module.RetryAfter is resourceconsist.RetryAfter  # lazily loaded all the same


def test_a_typing_block_with_anything_but_imports_is_refused(tmp_path: Path) -> None:
    with (
        _lazy_package(tmp_path, "oddblock", "import resourceconsist.errors") as module,
        pytest.raises(TypeError, match="only 'from MODULE import NAME' lines"),
    ):
        module.anything  # noqa: B018


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        resourceconsist.Nope  # noqa: B018


def test_importing_the_package_loads_no_runtime_module() -> None:
    code = "import sys, resourceconsist; print([m for m in sys.modules if m.startswith('resourceconsist.')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # Only the PEP 562 helper that loads the public names on first use.
    assert out.strip() == "['resourceconsist.lazy']"
