"""The curated public API: every name in ``resourceconsist.__all__`` resolves to the object of
its home module, and importing the package alone loads none of the runtime."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import resourceconsist


def test_all_lists_exactly_the_names_with_a_home() -> None:
    assert sorted(resourceconsist.__all__) == sorted(resourceconsist._HOMES)


@pytest.mark.parametrize("name", resourceconsist.__all__)
def test_every_public_name_is_its_home_modules_object(name: str) -> None:
    home = importlib.import_module(resourceconsist._HOMES[name])
    assert getattr(resourceconsist, name) is getattr(home, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        resourceconsist.Nope  # noqa: B018


def test_importing_the_package_loads_no_runtime_module() -> None:
    code = "import sys, resourceconsist; print([m for m in sys.modules if m.startswith('resourceconsist.')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # Only the PEP 562 helper that loads the public names on first use.
    assert out.strip() == "['resourceconsist.lazy']"
