"""The real-node tier's images (hack/build-node-images.sh; docs/testing.md, "The images"), read
from the archives the node imports: each names its image, carries the OCI labels with the version
and a commit of this checkout's history, the manager's runs as uid 65532 with the `resourceconsist` entry
point and lists its Debian packages, and the pause image is busybox alone."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from resourceconsist.testing.realnode import PAUSE_IMAGE, TESTSERVER_IMAGE

pytestmark = pytest.mark.realnode
REPO = Path(__file__).resolve().parents[2]


def _config(archive: Path) -> tuple[list[str], dict[str, Any], int]:
    """A docker-archive's image names, its image configuration, and its layers' count."""
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        (entry,) = manifest
        config = json.load(tar.extractfile(entry["Config"]))  # type: ignore[arg-type]
    return entry["RepoTags"], config, len(entry["Layers"])


def _in_history(revision: str) -> bool:
    """A commit of this checkout's history (the image is made again only when its inputs change,
    so it may name the commit it was made at, before later ones that changed none of them)."""
    commit = revision.removesuffix("-dirty")
    done = subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=REPO, check=False)
    return len(commit) == 40 and done.returncode == 0


def test_the_images_name_themselves_and_carry_the_version_and_the_commit(
    real_node_images: list[Path],
) -> None:
    archives = {p.name: p for p in real_node_images}
    assert {"pause.tar", "testserver.tar", "manager.tar"} <= set(archives)

    version = subprocess.run(
        [
            "python3",
            "-c",
            "import tomllib; print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout.strip()
    names, config, layers = _config(archives["manager.tar"])
    assert names == [f"localhost/resourceconsist:{version}"]
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == version
    assert _in_history(labels["org.opencontainers.image.revision"])
    assert labels["dev.resourceconsist.debian-packages"].startswith("sha256:")
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Entrypoint"] == ["resourceconsist"]
    assert (archives["manager.tar"].parent / "manager.tar.packages").read_text().count("python3") >= 1
    names, config, _ = _config(archives["testserver.tar"])
    assert names == [TESTSERVER_IMAGE]
    assert config["config"]["Entrypoint"] == ["python3", "/testserver.py"]
    names, config, layers = _config(archives["pause.tar"])
    assert names == [PAUSE_IMAGE] and layers == 1
    assert _in_history(config["config"]["Labels"]["org.opencontainers.image.revision"])
    assert archives["pause.tar"].stat().st_size < 5 * 1024 * 1024
