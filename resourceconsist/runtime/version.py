"""What is running: the package version, the git revision it was built from, and the Python.

The version is the installed distribution's (its metadata: ``pyproject.toml``'s ``version``).
The revision is baked into the package when it is built: ``setup.py`` writes it to the file
``REVISION`` beside this module, taking ``$RESOURCECONSIST_REVISION`` (the image build passes
it: ``--build-arg REVISION=...``), else the checkout's ``git rev-parse HEAD``; a source
distribution carries the file, so a wheel built from it keeps the revision. An editable install
(a checkout) has no such file and asks git, once. Without either it is ``unknown``.

Shown by ``resourceconsist --version`` and ``resourceconsist version``, in the first log line of
``run`` and ``webhook``, and as ``resourceconsist_build_info{version,revision,python_version}``
(docs/observability.md). Standard library only: ``--version`` loads nothing else.
"""

from __future__ import annotations

import functools
import platform
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Final

#: The distribution whose metadata holds the version.
DISTRIBUTION: Final = "resourceconsist"
#: The file the build writes the revision into, beside this module.
REVISION_FILE: Final = Path(__file__).with_name("REVISION")
#: What a version or revision reads when it cannot be known.
UNKNOWN: Final = "unknown"


@dataclass(frozen=True)
class BuildInfo:
    """The version, revision and Python version of this process (the Go client's build_info)."""

    version: str
    revision: str
    python_version: str

    def line(self) -> str:
        """``resourceconsist 0.1.0 (revision 1a2b3c4..., Python 3.12.3)``."""
        return f"{DISTRIBUTION} {self.version} (revision {self.revision}, Python {self.python_version})"


@functools.cache
def build_info() -> BuildInfo:
    """What is running, read once per process."""
    return BuildInfo(_version(), _revision(), platform.python_version())


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # imported from a source tree that was never installed
        return UNKNOWN


def _revision() -> str:
    try:
        baked = REVISION_FILE.read_text().strip()
    except OSError:
        baked = ""
    return baked or git_revision(Path(__file__).parent) or UNKNOWN


def git_revision(where: Path) -> str:
    """The commit the checkout holding ``where`` is at, ``-dirty`` when files it tracks were
    changed (an editable install; setup.py, building from a checkout); empty outside one."""
    if not any((folder / ".git").exists() for folder in (where, *where.parents)):
        return ""
    try:
        done = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    head = done.stdout.strip()
    if done.returncode != 0 or not head:
        return ""
    dirty = subprocess.run(
        ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=5,
        check=False,
    )
    return f"{head}-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else head
