"""Every Python package in the four code folders ships: pyproject.toml lists packages by hand
(they install under one namespace from folders at the top of the checkout, docs/packaging.md),
so a new sub-package missing from the list would work in an editable checkout and be absent
from the wheel users install."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found: set[str] = set()
    for name, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *relative)))
    # A mapped sub-folder (adapters/ under resourceconsist/) is found from its own mapping.
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
    assert listed - found == set(), f"listed packages without a folder: {sorted(listed - found)}"
