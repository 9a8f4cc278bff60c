#!/usr/bin/env bash
# Builds the Go original (KusionStack ResourceConsist v0.0.7 on controller-runtime v0.10.3) with
# our benchmark's demo-equivalent adapter (bench/go/main.go) into a cache directory, for
# `bench/bench_pace.py --go` (docs/benchmarks.md). Optional: `make bench` never needs it.
#
#   hack/build-go-original.sh [--sources DIR]
#
# The original and its two KusionStack dependencies (kube-api v0.0.27, kube-utils v0.1.9) are
# resolved through the Go module proxy as pinned in bench/go/go.mod. Where the proxy refuses
# them, --sources DIR (or $GO_ORIGINAL_SOURCES) names a folder holding git clones of the three
# repositories (DIR/resourceconsist, DIR/kube-api, DIR/kube-utils, or DIR/KusionStack+NAME/repo);
# their pinned tags are exported outside the repository and used through `replace`.
# Prints the path of the binary on its last line.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/../bench/go"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/resourceconsist"
dest="$cache/goorig-v0.0.7"
sources="${GO_ORIGINAL_SOURCES:-}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sources) sources="${2:?--sources needs a folder}"; shift 2 ;;
    *) echo "error: unknown argument $1; usage: hack/build-go-original.sh [--sources DIR]" >&2; exit 2 ;;
  esac
done

command -v go >/dev/null || { echo "error: Go is needed to build the Go original (https://go.dev/doc/install)" >&2; exit 1; }
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.goorig.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cp "$module/main.go" "$module/go.mod" "$tmp/"
cd "$tmp"
export CGO_ENABLED=0 GOFLAGS=-mod=mod

declare -A pins=([resourceconsist]=v0.0.7 [kube-api]=v0.0.27 [kube-utils]=v0.1.9)
if [[ -n "$sources" ]]; then
  for name in "${!pins[@]}"; do
    repo=""
    for candidate in "$sources/$name" "$sources/KusionStack+$name/repo"; do
      if git -C "$candidate" rev-parse --git-dir >/dev/null 2>&1; then repo="$candidate"; break; fi
    done
    [[ -n "$repo" ]] || { echo "error: no git clone of KusionStack/$name under $sources" >&2; exit 1; }
    src="$cache/go-original-src/$name-${pins[$name]}"
    if [[ ! -f "$src/go.mod" ]]; then
      rm -rf "$src" && mkdir -p "$src"
      git -C "$repo" archive "${pins[$name]}" | tar -x -C "$src"
    fi
    go mod edit -replace "kusionstack.io/$name=$src"
  done
fi

if ! go mod tidy >"$tmp/tidy.log" 2>&1; then
  cat "$tmp/tidy.log" >&2
  if grep -q "kusionstack.io/.*403" "$tmp/tidy.log"; then
    echo "error: the Go module proxy refuses the kusionstack.io modules (403); pass --sources DIR" \
      "with git clones of KusionStack/resourceconsist, kube-api and kube-utils" >&2
  fi
  exit 1
fi
go build -trimpath -o "$tmp/goorig" .
mkdir -p "$dest"
mv "$tmp/goorig" "$dest/goorig"
echo "$dest/goorig"
