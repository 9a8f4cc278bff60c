# Sourced by hack/build-image.sh and hack/build-node-images.sh (from the checkout's top): what an
# image build of this project shares.
#   BUILDAH     buildah with vfs storage: no overlay mounts, no user namespaces, works in a container
#   version     the package version (pyproject.toml), for the OCI labels and the manager's tag
#   revision    the commit, with "-dirty" when the checkout has uncommitted changes
#   SOURCE_DATE_EPOCH  exported; default the last commit's time: every time in the images
#   work        a temporary directory, and `containers`, buildah containers to remove: both
#               cleaned up when the script exits
BUILDAH=(buildah --storage-driver vfs)
version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $revision != unknown && -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then
  revision="${revision}-dirty"
fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

work=$(mktemp -d)
containers=()
cleanup() {
  for c in "${containers[@]}"; do "${BUILDAH[@]}" rm "$c" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT
