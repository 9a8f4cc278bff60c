"""Every import path the README and the docs name exists (issue 34: the modules moved into folders
with no compatibility aliases, and the docs followed).

Three forms are read from README.md and docs/**/*.md: a dotted name (``resourceconsist.cluster.kube``,
``resourceconsist.options.ManagerOptions``, a mkdocstrings ``::: resourceconsist...`` line), an import
statement in a code block (``from resourceconsist.rules import lifecycle``), and a module run with
``python -m``. A dotted name resolves when its longest importable prefix is a module and the rest
are attributes of it.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DOTTED = re.compile(r"(?<![\w.-])resourceconsist(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(r"^\s*from (resourceconsist(?:\.\w+)*) import \(?([\w, ]+)", re.MULTILINE)
RUN_MODULE = re.compile(r"python3? -m (resourceconsist(?:\.\w+)*)")


def _texts() -> dict[str, str]:
    return {str(path.relative_to(ROOT)): path.read_text() for path in DOCS}


def _resolve(dotted: str) -> object:
    """The module or attribute ``dotted`` names; raises what the import raises when none."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        if name == "resourceconsist.__main__":
            raise ImportError(
                "resourceconsist.__main__ runs the command line; name resourceconsist.commands.cli"
            )
        try:
            found: object = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is not None and not name.startswith(error.name):
                raise  # the module exists but one of its own imports is missing
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(f"no module of {dotted}")


def _names() -> list[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for where, text in _texts().items():
        found |= {(where, m) for m in DOTTED.findall(text)}
        for module, names in FROM_IMPORT.findall(text):
            found |= {(where, f"{module}.{n.strip()}") for n in names.split(",") if n.strip()}
        found |= {(where, m) for m in RUN_MODULE.findall(text)}
    return sorted(found)


def test_the_docs_name_paths_at_all() -> None:
    names = {name for _, name in _names()}
    # The walk reads what it should: paths from every form.
    assert "resourceconsist.cluster.kube.KubeClient" in names
    assert "resourceconsist.adapters.alibabacloudslb.emulator_server" in names
    assert len(names) > 50


@pytest.mark.parametrize(("where", "dotted"), _names())
def test_every_documented_path_imports(where: str, dotted: str) -> None:
    try:
        _resolve(dotted)
    except (ImportError, AttributeError) as error:
        pytest.fail(f"{where} names {dotted}, which does not import: {error}")
