#!/usr/bin/env bash
# Builds the binaries that resourceconsist's tests run against, from pinned Go modules, into a
# cache directory:
#   etcd, kube-apiserver                         LocalControlPlane   (hack/controlplane/)
#   kube-controller-manager, kube-scheduler      LocalCluster        (hack/controlplane/)
#   kwok (simulated nodes and pods)              LocalCluster        (hack/kwok/)
#   helm (renders and lints charts/resourceconsist)  tests, hack/generate-config.sh (hack/helm/)
#   kubelet, kube-proxy                          RealNodeCluster     (hack/controlplane/)
#   vegeta (the open-loop load generator)        resourceconsist.testing.loadgen (hack/vegeta/)
# Each binary is built once: one already in the cache is kept, so an older cache holding only
# etcd and kube-apiserver gets the missing ones. Nothing is built when all nine are there.
#
#   hack/build-controlplane.sh [DEST]
#
# DEST defaults to $RESOURCECONSIST_ASSETS_DIR, else ~/.cache/resourceconsist/k8s-<version>.
# Prints the directory holding the binaries on its last line; point
# KUBEBUILDER_ASSETS at it (the tests find the default cache by themselves).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/controlplane"
kwok_module="$here/kwok"
helm_module="$here/helm"
vegeta_module="$here/vegeta"
k8s_version="$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$module/go.mod")"
dest="${1:-${RESOURCECONSIST_ASSETS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/resourceconsist/k8s-${k8s_version#v}}}"

binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok helm kubelet kube-proxy vegeta)
missing=()
for name in "${binaries[@]}"; do
  [[ -x "$dest/$name" ]] || missing+=("$name")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "control plane ${k8s_version} already built" >&2
  echo "$dest"
  exit 0
fi

command -v go >/dev/null || { echo "error: Go is needed to build ${missing[*]} (https://go.dev/doc/install)" >&2; exit 1; }
mkdir -p "$dest"
tmp="$(mktemp -d "$dest/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

export CGO_ENABLED=0 GOFLAGS=-mod=mod
etcd_version="$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "$module/go.mod")"
kwok_version="$(awk '$1 == "require" && $2 == "sigs.k8s.io/kwok" {print $3; exit}' "$kwok_module/go.mod")"
helm_version="$(awk '$1 == "require" && $2 == "helm.sh/helm/v3" {print $3; exit}' "$helm_module/go.mod")"
vegeta_version="$(awk '$1 == "require" && $2 == "github.com/tsenart/vegeta/v12" {print $3; exit}' "$vegeta_module/go.mod")"
ldflags_k8s="-s -w -X k8s.io/component-base/version.gitVersion=${k8s_version} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$k8s_version") -X k8s.io/component-base/version.gitTreeState=clean"

# build NAME MODULE_DIR PACKAGE LDFLAGS: build one binary and move it into place when done, so
# a half build never looks finished.
build() {
  local name="$1" dir="$2" package="$3" ldflags="$4" started
  started=$SECONDS
  echo "building $name ..." >&2
  (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$tmp/$name" "$package")
  mv "$tmp/$name" "$dest/$name"
  echo "built $name in $((SECONDS - started))s" >&2
}

for name in "${missing[@]}"; do
  case "$name" in
    etcd) build etcd "$module" go.etcd.io/etcd/server/v3 "-s -w" ;;
    kwok) build kwok "$kwok_module" sigs.k8s.io/kwok/cmd/kwok "-s -w" ;;
    # helm prints its version from this variable (`helm version`); unset, it says v3.x-dev.
    helm) build helm "$helm_module" helm.sh/helm/v3/cmd/helm "-s -w -X helm.sh/helm/v3/internal/version.version=${helm_version}" ;;
    # vegeta prints its version from this variable (`vegeta -version`).
    vegeta) build vegeta "$vegeta_module" github.com/tsenart/vegeta/v12 "-s -w -X main.Version=${vegeta_version}" ;;
    *) build "$name" "$module" "k8s.io/kubernetes/cmd/$name" "$ldflags_k8s" ;;
  esac
done
echo "built ${missing[*]} (Kubernetes ${k8s_version}, etcd ${etcd_version}, kwok ${kwok_version}, helm ${helm_version}, vegeta ${vegeta_version}) into $dest" >&2
echo "$dest"
