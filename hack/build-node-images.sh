#!/usr/bin/env bash
# The images of the real-node tier (docs/testing.md, "A real node"), written as archives into
# the image cache that RealNodeCluster imports into its containerd (no registry is reachable):
#
#   pause.tar            localhost/resourceconsist/pause:1        every Pod's sandbox: Debian's
#                                                                 busybox-static, from scratch
#   testserver.tar       localhost/resourceconsist/testserver:1   resourceconsist/testing/testserver.py
#                                                                 on the Debian python3 base
#   manager.tar          localhost/resourceconsist:<version>      the Containerfile (hack/build-image.sh)
#
# Each image is made again only when its inputs changed: a digest of them is kept beside the
# archive (<name>.inputs), so a second run with nothing changed takes seconds. Reproducible
# as hack/build-image.sh says (SOURCE_DATE_EPOCH, OCI labels with the version and revision).
#
#   hack/build-node-images.sh [DEST]
#
# DEST defaults to $RESOURCECONSIST_IMAGES_DIR, else ~/.cache/resourceconsist/images. Needs root,
# buildah, mmdebstrap and busybox-static (apt-get install buildah mmdebstrap busybox-static).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=hack/image-common.sh
source hack/image-common.sh
dest="${1:-${RESOURCECONSIST_IMAGES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/resourceconsist/images}}"
SUITE=bookworm
BASE=localhost/resourceconsist-base:${SUITE}
BUSYBOX=/bin/busybox

for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found; install it: apt-get install buildah mmdebstrap busybox-static" >&2; exit 1; }
done
# busybox-static's binary needs no library: it runs alone in an image made from scratch.
if [[ $(ldd "$BUSYBOX" 2>&1 || true) != *"not a dynamic"* ]]; then
  echo "error: $BUSYBOX is not statically linked; install it: apt-get install busybox-static" >&2
  exit 1
fi
[[ $(id -u) == 0 ]] || { echo "error: run as root (buildah with vfs storage needs it)" >&2; exit 1; }
mkdir -p "$dest"

# inputs FILE...: one digest of the files' names (those in the work directory without it) and
# contents, and of this script.
inputs() {
  for f in "${BASH_SOURCE[0]}" "$@"; do
    printf '%s %s\n' "$(sha256sum <"$f" | cut -d' ' -f1)" "${f#"$work/"}"
  done | sha256sum | cut -d' ' -f1
}
# stale NAME DIGEST: whether NAME.tar is missing or was made from other inputs.
stale() {
  [[ ! -f $dest/$1.tar || $(cat "$dest/$1.inputs" 2>/dev/null) != "$2" ]]
}
# export IMAGE NAME DIGEST: write the archive and the digest it was made from.
export_image() {
  rm -f "$dest/$2.tar" "$dest/$2.inputs"
  "${BUILDAH[@]}" push --quiet "$1" "docker-archive:$dest/$2.tar:$1"
  echo "$3" >"$dest/$2.inputs"
  echo "== $2.tar: $1 ($(du -h "$dest/$2.tar" | cut -f1))"
}
labels() {  # labels TITLE VERSION
  echo --label "org.opencontainers.image.title=$1" --label "org.opencontainers.image.version=$2" \
    --label "org.opencontainers.image.revision=$revision" --label "org.opencontainers.image.licenses=Apache-2.0"
}
started=$SECONDS

# -- pause ---------------------------------------------------------------------------------------
image=localhost/resourceconsist/pause:1
digest=$(inputs "$BUSYBOX" hack/image-common.sh)
if stale pause "$digest"; then
  mkdir -p "$work/pause/bin"
  cp "$BUSYBOX" "$work/pause/bin/busybox"
  # A sandbox's first process: it waits, and exits at once on SIGTERM or SIGINT.
  printf '%s\n' '#!/bin/busybox sh' 'trap "exit 0" TERM INT' 'while :; do /bin/busybox sleep 3600 & wait $!; done' >"$work/pause/pause"
  chmod 0755 "$work/pause/pause" "$work/pause/bin/busybox"
  ctr=$("${BUILDAH[@]}" from scratch)
  containers+=("$ctr")
  "${BUILDAH[@]}" add --quiet "$ctr" "$work/pause/" /
  # shellcheck disable=SC2046
  "${BUILDAH[@]}" config --entrypoint '["/pause"]' --cmd '' $(labels resourceconsist-pause 1) "$ctr"
  "${BUILDAH[@]}" commit --quiet --rm --timestamp "$SOURCE_DATE_EPOCH" "$ctr" "$image" >/dev/null
  containers=()
  export_image "$image" pause "$digest"
else
  echo "== pause.tar: up to date"
fi

# -- the Debian python3 base, for the test server and the manager ---------------------------------
BASE_ONLY=1 hack/build-image.sh
base_id=$("${BUILDAH[@]}" inspect --type image --format '{{.FromImageID}}' "$BASE")
echo "$base_id" >"$work/base-id"

# -- testserver ----------------------------------------------------------------------------------
image=localhost/resourceconsist/testserver:1
digest=$(inputs "$work/base-id" resourceconsist/testing/testserver.py)
if stale testserver "$digest"; then
  ctr=$("${BUILDAH[@]}" from --quiet "$BASE")
  containers+=("$ctr")
  "${BUILDAH[@]}" copy --quiet "$ctr" resourceconsist/testing/testserver.py /testserver.py
  # shellcheck disable=SC2046
  "${BUILDAH[@]}" config --entrypoint '["python3", "/testserver.py"]' --cmd '' --env PYTHONUNBUFFERED=1 \
    --port 8080 $(labels resourceconsist-testserver 1) "$ctr"
  "${BUILDAH[@]}" commit --quiet --rm --timestamp "$SOURCE_DATE_EPOCH" "$ctr" "$image" >/dev/null
  containers=()
  export_image "$image" testserver "$digest"
else
  echo "== testserver.tar: up to date"
fi

# -- the manager ---------------------------------------------------------------------------------
image=localhost/resourceconsist:${version}
mapfile -t sources < <(find resourceconsist adapters experimental webhook -type f \
  ! -name '*.pyc' ! -path '*/__pycache__/*' | LC_ALL=C sort)
digest=$(inputs "$work/base-id" pyproject.toml README.md Containerfile hack/image-constraints.txt hack/build-image.sh hack/image-common.sh "${sources[@]}")
if stale manager "$digest"; then
  rm -f "$dest/manager.inputs"
  IMAGE=$image ARCHIVE="$dest/manager.tar" hack/build-image.sh
  echo "$digest" >"$dest/manager.inputs"
else
  echo "== manager.tar: up to date"
fi
echo "== images in $dest, made in $((SECONDS - started)) s"
