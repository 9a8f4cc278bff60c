#!/usr/bin/env bash
# Builds the sdist and the wheel with the standard build frontend (`python -m build`: the sdist
# first, then the wheel from that sdist, so a file the sdist misses fails here), installs the
# wheel (not editable) with its `testing` extra into a fresh virtualenv, and checks from a folder
# outside the checkout that what users get works: the command and its subcommands, every
# package and its data files, the pytest plugin and the testing kit on a real control plane
# (docs/install.md, "From a wheel"). `make wheel-check` runs it; CI too.
#
#   hack/wheel-check.sh [DIST]        DIST (default build/dist) keeps the sdist and the wheel
#
# PYTHON (default: the checkout's .venv, else python3) runs the build and makes the virtualenv.
# The control plane's binaries are the testing kit's (hack/build-controlplane.sh, or
# $KUBEBUILDER_ASSETS).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dist="${1:-$repo/build/dist}"
python="${PYTHON:-$repo/.venv/bin/python}"
[[ -x $python ]] || python=python3
export PIP_DISABLE_PIP_VERSION_CHECK=1
started=$SECONDS

if ! "$python" -m build --version >/dev/null 2>&1; then
  echo "error: the build frontend is missing for $python; install the dev extra (make setup) or: $python -m pip install build" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "== sdist and wheel (python -m build) into $dist"
rm -rf "$dist"
"$python" -m build --outdir "$dist" "$repo" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
version="$(awk -F'"' '$1 == "version = " {print $2; exit}' "$repo/pyproject.toml")"
sdist="$dist/resourceconsist-$version.tar.gz"
wheel="$dist/resourceconsist-$version-py3-none-any.whl"
for artifact in "$sdist" "$wheel"; do
  [[ -f $artifact ]] || { echo "error: $artifact was not built; found: $(ls "$dist")" >&2; exit 1; }
done

# Nothing outside the package namespace, and the data files the code opens at run time.
"$python" - "$wheel" <<'PY'
import sys
import zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
tops = {n.split("/")[0] for n in names}
stray = sorted(t for t in tops if t != "resourceconsist" and not t.endswith(".dist-info"))
assert not stray, f"the wheel installs outside resourceconsist/: {stray}"
for data in (
    "resourceconsist/py.typed",
    "resourceconsist/runtime/REVISION",
    "resourceconsist/testing/kwok-stages.yaml",
    "resourceconsist/adapters/py.typed",
    "resourceconsist/webhook/py.typed",
    "resourceconsist/experimental/py.typed",
):
    assert data in names, f"the wheel misses {data}"
print(f"wheel: {len(names)} files, all under resourceconsist/")
PY

echo "== a fresh virtualenv with the wheel and its testing extra"
"$python" -m venv "$work/venv"
venv="$work/venv/bin"
"$venv/python" -m pip install --quiet "$wheel[testing]"
# Never the checkout: run from an empty folder, and check where the package was imported from.
mkdir "$work/outside"
cd "$work/outside"
"$venv/python" - "$repo" <<'PY'
import importlib
import sys
from pathlib import Path

repo = Path(sys.argv[1])
for name in (
    "resourceconsist",
    "resourceconsist.commands.cli",
    "resourceconsist.testing",
    "resourceconsist.adapters.alibabacloudslb",
    "resourceconsist.webhook",
    "resourceconsist.experimental",
):
    module = importlib.import_module(name)
    where = Path(module.__file__ or "").resolve()
    assert repo not in where.parents, f"{name} came from the checkout ({where}), not the wheel"
    assert "site-packages" in where.parts, where
print("imports: every package from site-packages")
PY
"$venv/resourceconsist" --help >/dev/null
"$venv/resourceconsist" demo --help | grep -q "Usage: resourceconsist demo"
"$venv/resourceconsist" run --help | grep -q -- "--adapter"
# The revision the build baked in (setup.py: the sdist carries it, the wheel built from it too).
revision="$(git -C "$repo" rev-parse HEAD)"
"$venv/resourceconsist" --version | grep -q "^resourceconsist $version (revision $revision" \
  || { echo "error: resourceconsist --version does not say $version and revision $revision: $("$venv/resourceconsist" --version)" >&2; exit 1; }
echo "command: resourceconsist --help, demo --help, run --help, --version ($revision)"

# The pytest plugin (an entry point of the wheel) gives a suite outside the checkout the real
# control plane; the kit's Cluster and wait_for drive it.
cat >"$work/outside/test_from_the_wheel.py" <<'PY'
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient
from resourceconsist.testing import wait_for


def test_the_plugin_gives_a_real_control_plane(control_plane, namespace):
    client = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    try:
        service = {"metadata": {"name": "from-the-wheel"}, "spec": {"ports": [{"port": 80}]}}
        client.create(kube.SERVICE, namespace, service)
        found = wait_for(lambda: client.get_or_none(kube.SERVICE, namespace, "from-the-wheel"), timeout=30)
        assert found["spec"]["clusterIP"]  # allocated by the real API server
    finally:
        client.close()
PY
"$venv/python" -m pytest -q -p no:cacheprovider "$work/outside/test_from_the_wheel.py"
echo "wheel check passed in $((SECONDS - started)) s: $(basename "$sdist"), $(basename "$wheel")"
