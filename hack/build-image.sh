#!/usr/bin/env bash
# Build the Containerfile's image on this machine and smoke-test it from the image's own
# filesystem. No container registry is reachable here, so the base image is a Debian root
# filesystem made by mmdebstrap from Debian packages (python3 + venv), imported with buildah;
# the Containerfile's default base (an official Python slim image) stays what users build on.
# Python packages come from the package index through pip, as in any build. Not part of CI.
#
#   hack/build-image.sh                 build localhost/resourceconsist:dev, smoke-test it
#   IMAGE=name:tag SUITE=bookworm hack/build-image.sh
#
# Prints the build time and the image size. Needs root, buildah and mmdebstrap
# (apt-get install mmdebstrap buildah).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

IMAGE=${IMAGE:-localhost/resourceconsist:dev}
SUITE=${SUITE:-bookworm}
BASE=localhost/resourceconsist-base:${SUITE}
# vfs and chroot isolation: no overlay mounts, no user namespaces needed, works in a container.
BUILDAH=(buildah --storage-driver vfs)

for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found; install it: apt-get install mmdebstrap buildah" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] || { echo "error: run as root (mmdebstrap and buildah with vfs storage need it)" >&2; exit 1; }

work=$(mktemp -d)
containers=()
cleanup() {
  for c in "${containers[@]}"; do "${BUILDAH[@]}" rm "$c" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT

start=$SECONDS
echo "== base: Debian $SUITE with python3 from Debian packages"
# The local base trusts the CAs this machine trusts (/usr/local/share/ca-certificates), since
# its connection to the package index may pass through them; pip in the build stage reads the
# system bundle through PIP_CERT. A base from a registry needs neither.
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='cp -r /usr/local/share/ca-certificates/. "$1/usr/local/share/ca-certificates/"' \
  --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
  "$SUITE" "$work/rootfs.tar"
base_ctr=$("${BUILDAH[@]}" from scratch)
containers+=("$base_ctr")
"${BUILDAH[@]}" add --quiet "$base_ctr" "$work/rootfs.tar" /  # a local tar is unpacked
"${BUILDAH[@]}" config --cmd /bin/sh --env PIP_CERT=/etc/ssl/certs/ca-certificates.crt "$base_ctr"
"${BUILDAH[@]}" commit --quiet --rm "$base_ctr" "$BASE" >/dev/null
containers=()
base_done=$SECONDS

echo "== image: Containerfile on $BASE"
"${BUILDAH[@]}" build --quiet --isolation chroot --layers=false \
  --build-arg "BASE_IMAGE=$BASE" --build-arg "REVISION=$(git rev-parse HEAD)" -f Containerfile -t "$IMAGE" . >/dev/null
built=$SECONDS

echo "== smoke test, inside the image's filesystem"
config=$("${BUILDAH[@]}" inspect --type image --format '{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' "$IMAGE")
echo "user, entry point: $config"
[[ $config == '65532:65532 [resourceconsist]' ]] || { echo "error: expected user 65532:65532 and entry point resourceconsist" >&2; exit 1; }
ctr=$("${BUILDAH[@]}" from --quiet "$IMAGE")
containers+=("$ctr")
run() { "${BUILDAH[@]}" run --isolation chroot "$ctr" -- "$@"; }
run sh -c 'echo "uid $(id -u), $(command -v resourceconsist), $(python3 --version)"'
[[ $(run id -u) == 65532 ]] || { echo "error: the image does not run as uid 65532" >&2; exit 1; }
run resourceconsist --version | tee "$work/version.txt"
grep -q "revision $(git rev-parse HEAD)" "$work/version.txt" || { echo "error: the image does not say its revision" >&2; exit 1; }
run resourceconsist --help >"$work/help.txt"
grep -q "Usage: resourceconsist" "$work/help.txt" || { cat "$work/help.txt"; echo "error: resourceconsist --help printed no usage" >&2; exit 1; }
run resourceconsist adapters | tee "$work/adapters.txt"
grep -q "^alibabacloudslb" "$work/adapters.txt" || { echo "error: resourceconsist adapters lists no alibabacloudslb" >&2; exit 1; }

size=$("${BUILDAH[@]}" images --format '{{.Size}}' "$IMAGE")
base_size=$("${BUILDAH[@]}" images --format '{{.Size}}' "$BASE")
echo "== ok: $IMAGE, $size (base $base_size); base made in $((base_done - start)) s, image built in $((built - base_done)) s"
