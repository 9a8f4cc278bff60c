#!/usr/bin/env bash
# Builds the control-plane binaries that resourceconsist's tests run against
# (kube-apiserver and etcd) from the Go modules pinned in hack/controlplane/,
# into a cache directory. Does nothing when both binaries are already there.
#
#   hack/build-controlplane.sh [DEST]
#
# DEST defaults to $RESOURCECONSIST_ASSETS_DIR, else ~/.cache/resourceconsist/k8s-<version>.
# Prints the directory holding the binaries on its last line; point
# KUBEBUILDER_ASSETS at it (the tests find the default cache by themselves).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/controlplane"
k8s_version="$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$module/go.mod")"
dest="${1:-${RESOURCECONSIST_ASSETS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/resourceconsist/k8s-${k8s_version#v}}}"

if [[ -x "$dest/kube-apiserver" && -x "$dest/etcd" ]]; then
  echo "control plane ${k8s_version} already built" >&2
  echo "$dest"
  exit 0
fi

command -v go >/dev/null || { echo "error: Go is needed to build kube-apiserver and etcd (https://go.dev/doc/install)" >&2; exit 1; }
mkdir -p "$dest"
tmp="$(mktemp -d "$dest/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

cd "$module"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
etcd_version="$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' go.mod)"
ldflags_k8s="-s -w -X k8s.io/component-base/version.gitVersion=${k8s_version} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$k8s_version") -X k8s.io/component-base/version.gitTreeState=clean"

echo "building etcd ${etcd_version} ..." >&2
go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
echo "building kube-apiserver ${k8s_version} (several minutes on 2 cores) ..." >&2
go build -trimpath -ldflags "$ldflags_k8s" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver

# Move into place only when both built, so a half build never looks finished.
mv "$tmp/etcd" "$dest/etcd"
mv "$tmp/kube-apiserver" "$dest/kube-apiserver"
echo "built into $dest" >&2
echo "$dest"
