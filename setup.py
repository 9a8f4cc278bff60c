"""The build's one addition to pyproject.toml: the git revision baked into the package.

Everything else about the build is declared in pyproject.toml. ``build_py`` writes the file
``resourceconsist/runtime/REVISION`` into the wheel and ``sdist`` into the source distribution (so a
wheel built from it keeps the revision), from ``$RESOURCECONSIST_REVISION`` (the image build
passes it), else the checkout's ``git rev-parse HEAD``, else a ``REVISION`` file already in the
tree (an unpacked sdist); with none of them, nothing is written and the package says
``unknown`` (resourceconsist/runtime/version.py). setuptools has no declarative way to write a file at
build time, hence these two small commands.
"""

from __future__ import annotations

import os
import subprocess
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
    if (HERE / ".git").exists():
        try:
            done = subprocess.run(
                ["git", "-C", str(HERE), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            done = None
        if done is not None and done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    try:
        return (HERE / REVISION).read_text().strip()
    except OSError:
        return ""


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
