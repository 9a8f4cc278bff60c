"""The build's one addition to pyproject.toml: the git revision baked into the package.

Everything else about the build is declared in pyproject.toml. ``build_py`` writes the file
``resourceconsist/runtime/REVISION`` into the wheel and ``sdist`` into the source distribution
(so a wheel built from it keeps the revision), from ``$RESOURCECONSIST_REVISION`` (the image
build passes it), else a ``REVISION`` file already in the tree (an unpacked sdist), else the
checkout's ``git rev-parse HEAD`` (``-dirty`` when tracked files changed); with none of them,
nothing is written and the package says ``unknown`` (resourceconsist/runtime/version.py).
setuptools has no declarative way to write a file at build time, hence these two small commands.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
REVISION = Path("resourceconsist") / "runtime" / "REVISION"


def _revision() -> str:
    given = os.environ.get("RESOURCECONSIST_REVISION", "").strip()
    if given:
        return given
    try:  # an unpacked sdist: its revision, whatever repository it was unpacked in
        return (HERE / REVISION).read_text().strip()
    except OSError:
        pass
    # The package's own reading of a checkout, loaded by its path: the package is not importable
    # while it is being built.
    spec = importlib.util.spec_from_file_location(
        "_version", HERE / "resourceconsist" / "runtime" / "version.py"
    )
    assert spec is not None and spec.loader is not None
    version = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(version)
    found: str = version.git_revision(HERE)
    return found


class BuildWithRevision(build_py):
    def run(self) -> None:
        super().run()
        revision = _revision()
        if revision and not self.editable_mode:
            target = Path(self.build_lib) / REVISION
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(revision + "\n")


class SdistWithRevision(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        revision = _revision()
        if revision:
            target = Path(base_dir) / REVISION
            if target.is_symlink() or target.exists():
                target.unlink()
            target.write_text(revision + "\n")


setup(cmdclass={"build_py": BuildWithRevision, "sdist": SdistWithRevision})
