#!/usr/bin/env bash
# mypy --strict over the whole package as it installs: resourceconsist/ with adapters/,
# experimental/ and webhook/ mapped under it. mypy cannot follow setuptools' editable
# import hook, so this assembles a symlink view of the installed layout and checks that.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
view="$root/build/typeview"
rm -rf "$view"
mkdir -p "$view/resourceconsist"
for entry in "$root"/resourceconsist/*; do
  ln -s "$entry" "$view/resourceconsist/$(basename "$entry")"
done
for sub in adapters experimental webhook; do
  ln -s "$root/$sub" "$view/resourceconsist/$sub"
done
cd "$view"
exec "${PYTHON:-python3}" -m mypy --config-file "$root/pyproject.toml" -p resourceconsist "$@"
