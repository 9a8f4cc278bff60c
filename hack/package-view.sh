#!/usr/bin/env bash
# Assemble, at $1, a symlink view of the package as it installs: resourceconsist/ with adapters/,
# experimental/ and webhook/ mapped under it (pyproject.toml's package-dir). Tools that read the
# tree rather than import through setuptools' editable hook (mypy, lint-imports) run on it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
view="$1"
rm -rf "$view"
mkdir -p "$view/resourceconsist"
for entry in "$root"/resourceconsist/*; do
  ln -s "$entry" "$view/resourceconsist/$(basename "$entry")"
done
for sub in adapters experimental webhook; do
  ln -s "$root/$sub" "$view/resourceconsist/$sub"
done
