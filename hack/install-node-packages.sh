#!/usr/bin/env bash
# Installs, from Debian's packages, what the real-node tier needs (docs/testing.md, "A real
# node"): containerd, runc, the CNI plugins, iptables, conntrack and iproute2 for the node itself;
# buildah, mmdebstrap and busybox-static for its images (hack/build-node-images.sh); e2fsprogs
# (chattr) for a test of leftovers that cannot be removed. Root; installs only what is missing.
#
#   hack/install-node-packages.sh
set -euo pipefail
packages=(containerd runc containernetworking-plugins iptables conntrack iproute2
  buildah mmdebstrap busybox-static e2fsprogs)
missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$package")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "the real node's packages are installed" >&2
  exit 0
fi
[[ $(id -u) == 0 ]] || { echo "error: installing ${missing[*]} needs root" >&2; exit 1; }
echo "installing ${missing[*]} ..." >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
echo "installed ${missing[*]}" >&2
