"""A production install (``pip install resourceconsist``, no extras) imports every module it ships,
and runs without the official Kubernetes client.

The check runs in a fresh interpreter where every distribution outside the production dependency
closure (pyproject's ``dependencies``, followed through their own requirements) cannot be
imported: the official ``kubernetes`` client (the ``kubernetes`` extra), pytest, responses, mypy,
import-linter and the rest of the dev and testing extras raise ``ModuleNotFoundError`` there, as
they would in a production image. The pytest plugin is the one module that needs its extra by
nature; the SLB emulator and the conformance suite need the ``testing`` extra and must say so in
their error. In that interpreter the command line answers ``--version`` and ``run --help``, a
kubeconfig is loaded into a client, and a kubeconfig only the official loader reads is refused with
one line naming the extra to install.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

#: Modules that need the ``testing`` extra, and are allowed to (they live in the testing kit).
NEEDS_TESTING_EXTRA = (
    "resourceconsist.adapters.alibabacloudslb.emulator",
    "resourceconsist.adapters.alibabacloudslb.emulator_server",
    "resourceconsist.testing.conformance",
)
#: The package's four folders, mapped under one namespace (pyproject's package-dir); each is walked.
TOPS = (
    "resourceconsist",
    "resourceconsist.adapters",
    "resourceconsist.experimental",
    "resourceconsist.webhook",
)
#: Not imported at all: the pytest plugin (needs pytest) and ``python -m resourceconsist`` (runs the CLI).
NOT_IMPORTED = ("resourceconsist.testing.pytest_plugin", "resourceconsist.__main__")

# Runs in the child interpreter: block the given top-level names, then import every module of
# the package.
CHILD = r"""
import importlib, importlib.abc, json, pkgutil, sys

tops, blocked, not_imported, needs_extra, kubeconfigs = json.loads(sys.argv[1])

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (not in a production install)", name=name)
        return None

sys.meta_path.insert(0, Absent())

report = {"imported": [], "failed": {}, "extra_errors": {}}

def load(name):
    if name in not_imported or name in report["imported"]:
        return None
    try:
        module = importlib.import_module(name)
    except Exception as err:
        target = report["extra_errors"] if name in needs_extra else report["failed"]
        target[name] = f"{type(err).__name__}: {err}"
        return None
    report["imported"].append(name)
    return module

def walk(package):
    module = load(package)
    for info in pkgutil.iter_modules(getattr(module, "__path__", []), package + "."):
        if info.ispkg:
            walk(info.name)
        else:
            load(info.name)

for top in tops:
    walk(top)

# What a production process does: the command line, a kubeconfig loaded into a client.
from click.testing import CliRunner
from resourceconsist.commands.cli import main
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.cluster.kubeconfig import KubeConfigError

runner = CliRunner()
report["cli"] = {
    " ".join(args): [done.exit_code, done.output[:300]]
    for args in (["--version"], ["run", "--help"])
    for done in [runner.invoke(main, args)]
}
client = KubeClient.from_kubeconfig(kubeconfigs["token"])
report["client"] = client.host
client.close()
try:
    KubeClient.from_kubeconfig(kubeconfigs["auth-provider"])
except KubeConfigError as err:
    report["refused"] = str(err)
report["official client loaded"] = "kubernetes" in sys.modules
print(json.dumps(report))
"""


def _production_closure() -> set[str]:
    """Canonical names of the distributions a production install of resourceconsist brings."""
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [("resourceconsist", ("",))]
    while todo:
        dist, extras = todo.pop()
        for raw in metadata.requires(dist) or []:
            req = Requirement(raw)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
                continue
            name = canonicalize_name(req.name)
            if name not in seen:
                seen.add(name)
                todo.append((name, ("", *sorted(req.extras))))
    return seen


def _blocked_modules() -> list[str]:
    """Top-level import names that only distributions outside the production closure provide."""
    allowed = _production_closure() | {"resourceconsist"}
    blocked = set()
    for module, dists in metadata.packages_distributions().items():
        if module.isidentifier() and not any(canonicalize_name(d) in allowed for d in dists):
            blocked.add(module)
    return sorted(blocked - set(sys.stdlib_module_names))


def test_the_production_closure_leaves_out_the_official_client_and_the_extras() -> None:
    closure = _production_closure()
    assert {"pydantic", "aiohttp", "urllib3"} <= closure
    assert not {"kubernetes", "pytest", "responses", "mypy", "import-linter"} & closure
    assert {"kubernetes", "pytest", "_pytest", "responses", "mypy", "importlinter"} <= set(_blocked_modules())


def _kubeconfig(path: Path, user: dict[str, object]) -> str:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return str(path)


def test_every_module_imports_and_the_command_runs_without_the_extras(tmp_path: Path) -> None:
    kubeconfigs = {
        "token": _kubeconfig(tmp_path / "token", {"token": "abc"}),
        "auth-provider": _kubeconfig(tmp_path / "oidc", {"auth-provider": {"name": "oidc", "config": {}}}),
    }
    argument = json.dumps([TOPS, _blocked_modules(), NOT_IMPORTED, NEEDS_TESTING_EXTRA, kubeconfigs])
    done = subprocess.run(
        [sys.executable, "-c", CHILD, argument], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["failed"] == {}, "modules a production install cannot import"
    imported = set(report["imported"])
    # The walk reached every folder of the package, the testing kit's extra-free modules included.
    for name in (
        "resourceconsist.commands.cli",
        "resourceconsist.adapters.alibabacloudslb.slbclient",
        "resourceconsist.experimental.demo",
        "resourceconsist.webhook.server",
        "resourceconsist.testing.localcluster",
    ):
        assert name in imported
    # The emulator needs the testing extra and says which.
    assert set(report["extra_errors"]) == set(NEEDS_TESTING_EXTRA)
    for error in report["extra_errors"].values():
        assert "pip install 'resourceconsist[testing]'" in error
    # The command and the client work; the official client was never loaded.
    assert report["cli"]["--version"][0] == 0 and report["cli"]["--version"][1].startswith("resourceconsist ")
    assert report["cli"]["run --help"][0] == 0, report["cli"]["run --help"]
    assert report["client"] == "127.0.0.1:6443"
    assert report["official client loaded"] is False
    # A kubeconfig only the official loader reads: one line naming the extra.
    assert "auth-provider" in report["refused"]
    assert "pip install 'resourceconsist[kubernetes]'" in report["refused"]
