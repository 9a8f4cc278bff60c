#!/usr/bin/env bash
# Build the Containerfile's image on this machine and smoke-test it from the image's own
# filesystem. No container registry is reachable here, so the base image is a Debian root
# filesystem made by mmdebstrap from Debian packages (python3 + venv), imported with buildah;
# the Containerfile's default base (an official Python slim image) stays what users build on.
# Python packages come through pip, each pinned by hack/image-constraints.txt.
#
#   hack/build-image.sh                 build localhost/resourceconsist:<version>, smoke-test it
#   IMAGE=name:tag SUITE=bookworm hack/build-image.sh
#   ARCHIVE=path.tar hack/build-image.sh    also write it as a docker-archive (what
#                                           hack/build-node-images.sh imports into the real node)
#   REBUILD_BASE=1 hack/build-image.sh      make the Debian base again (else one already made is
#                                           kept: the base changes only with Debian's packages)
#   BASE_ONLY=1 hack/build-image.sh         make the base if there is none, and stop there
#
# Reproducible: SOURCE_DATE_EPOCH (default: the last commit's time) fixes every time in the
# base (mmdebstrap honours it) and in the image (buildah --timestamp), the OCI labels carry the
# package version and the commit (with "-dirty" when the checkout has changes), the base's
# Debian packages are listed in the label dev.resourceconsist.debian-packages (a digest of
# `dpkg-query` name=version lines) and written beside the archive (<archive>.packages).
#
# Prints the build time and the image size. Needs root, buildah and mmdebstrap
# (apt-get install mmdebstrap buildah).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=hack/image-common.sh
source hack/image-common.sh

IMAGE=${IMAGE:-localhost/resourceconsist:${version}}
SUITE=${SUITE:-bookworm}
BASE=localhost/resourceconsist-base:${SUITE}
ARCHIVE=${ARCHIVE:-}
REBUILD_BASE=${REBUILD_BASE:-0}
BASE_ONLY=${BASE_ONLY:-0}

for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found; install it: apt-get install mmdebstrap buildah" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] || { echo "error: run as root (mmdebstrap and buildah with vfs storage need it)" >&2; exit 1; }

start=$SECONDS
base_packages=$("${BUILDAH[@]}" inspect --type image \
  --format '{{index .OCIv1.Config.Labels "dev.resourceconsist.debian-packages"}}' "$BASE" 2>/dev/null || true)
if [[ $REBUILD_BASE == 1 || -z $base_packages ]]; then
  echo "== base: Debian $SUITE with python3 from Debian packages"
  # The local base trusts the CAs this machine trusts (/usr/local/share/ca-certificates), since
  # its connection to the package index may pass through them; pip in the build stage reads the
  # system bundle through PIP_CERT. A base from a registry needs neither.
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='cp -r /usr/local/share/ca-certificates/. "$1/usr/local/share/ca-certificates/"' \
    --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
    --customize-hook='chroot "$1" dpkg-query -W -f="\${Package}=\${Version}\n" | LC_ALL=C sort >'"$work/packages" \
    "$SUITE" "$work/rootfs.tar"
  packages_digest=$(sha256sum "$work/packages" | cut -d' ' -f1)
  base_ctr=$("${BUILDAH[@]}" from scratch)
  containers+=("$base_ctr")
  "${BUILDAH[@]}" add --quiet "$base_ctr" "$work/rootfs.tar" /  # a local tar is unpacked
  "${BUILDAH[@]}" add --quiet "$base_ctr" "$work/packages" /usr/share/resourceconsist-base.packages
  "${BUILDAH[@]}" config --cmd /bin/sh --env PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    --label "dev.resourceconsist.debian-packages=sha256:${packages_digest}" \
    --label "org.opencontainers.image.title=resourceconsist-base" "$base_ctr"
  "${BUILDAH[@]}" commit --quiet --rm --timestamp "$SOURCE_DATE_EPOCH" "$base_ctr" "$BASE" >/dev/null
  containers=()
else
  echo "== base: $BASE (kept; REBUILD_BASE=1 makes it again)"
fi
base_done=$SECONDS
[[ $BASE_ONLY == 1 ]] && exit 0

echo "== image: Containerfile on $BASE (version $version, revision $revision)"
"${BUILDAH[@]}" build --quiet --isolation chroot --layers=false --timestamp "$SOURCE_DATE_EPOCH" \
  --build-arg "BASE_IMAGE=$BASE" --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  --build-arg "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH" \
  -f Containerfile -t "$IMAGE" . >/dev/null
built=$SECONDS

echo "== smoke test, inside the image's filesystem"
config=$("${BUILDAH[@]}" inspect --type image --format '{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' "$IMAGE")
echo "user, entry point: $config"
[[ $config == '65532:65532 [resourceconsist]' ]] || { echo "error: expected user 65532:65532 and entry point resourceconsist" >&2; exit 1; }
labels=$("${BUILDAH[@]}" inspect --type image --format '{{index .OCIv1.Config.Labels "org.opencontainers.image.version"}} {{index .OCIv1.Config.Labels "org.opencontainers.image.revision"}}' "$IMAGE")
[[ $labels == "$version $revision" ]] || { echo "error: labels say '$labels', expected '$version $revision'" >&2; exit 1; }
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

if [[ -n $ARCHIVE ]]; then
  mkdir -p "$(dirname "$ARCHIVE")"
  rm -f "$ARCHIVE"
  "${BUILDAH[@]}" push --quiet "$IMAGE" "docker-archive:$ARCHIVE:$IMAGE"
  "${BUILDAH[@]}" run --isolation chroot "$ctr" -- cat /usr/share/resourceconsist-base.packages >"$ARCHIVE.packages"
  echo "== archive: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
fi

size=$("${BUILDAH[@]}" images --format '{{.Size}}' "$IMAGE")
base_size=$("${BUILDAH[@]}" images --format '{{.Size}}' "$BASE")
echo "== ok: $IMAGE, $size (base $base_size); base made in $((base_done - start)) s, image built in $((built - base_done)) s"
