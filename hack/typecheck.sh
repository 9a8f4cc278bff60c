#!/usr/bin/env bash
# mypy --strict over the whole package as it installs: resourceconsist/ with adapters/,
# experimental/ and webhook/ mapped under it. mypy cannot follow setuptools' editable
# import hook, so this checks a symlink view of the installed layout (package-view.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
view="$root/build/typeview"
"$root/hack/package-view.sh" "$view"
cd "$view"
exec "${PYTHON:-python3}" -m mypy --config-file "$root/pyproject.toml" -p resourceconsist "$@"
