#!/usr/bin/env bash
# Writes hack/image-constraints.txt: every Python package the Containerfile installs, each pinned
# to one version, so that two builds of the same commit install the same code (the image is
# reproducible; docs/install.md, "The image"). The Containerfile's build stage installs under
# these constraints (PIP_CONSTRAINT, which also reaches the wheel's isolated build environment).
# Run it after changing pyproject.toml's dependencies or build requirements, with the python3
# the image has (Debian 12's, 3.11), and commit the result.
#
#   hack/image-constraints.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=hack/image-constraints.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip --disable-pip-version-check --quiet)
# What the build stage installs: the build frontend and the wheel's build requirements, then
# the wheel itself with its dependencies.
requires=$("$work/venv/bin/python" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
mapfile -t requires <<<"$requires"
"${pip[@]}" install 'build>=1.2' "${requires[@]}"
"${pip[@]}" install .
{
  echo "# Written by hack/image-constraints.sh with $("$work/venv/bin/python" --version) on $(date -u +%Y-%m-%d); do not edit."
  echo "# Every package the image installs, pinned (Containerfile, PIP_CONSTRAINT)."
  "${pip[@]}" freeze --all --exclude resourceconsist --exclude pip | LC_ALL=C sort -f
} >"$out"
echo "wrote $out ($(grep -vc '^#' "$out") packages)"
