#!/usr/bin/env bash
# Builds the runtime image without a container engine or a registry, where buildah installs
# from Debian: the root filesystem scripts/image-rootfs.sh assembles (Debian 12's packages of
# the names distroless cc holds) with the release binaries the Dockerfile's build stage makes
# (`cargo build --release --locked --bins` of the same packages), committed from scratch with
# the Dockerfile's user, then each binary run in it (`--version`) with buildah's chroot
# isolation as that user.
#
#   scripts/image-build.sh [tag]     (default localhost/palisade:ci)
#
# .ci/run runs it; the image stays in buildah's local storage (vfs), one tag, replaced each run.
set -euo pipefail
cd "$(dirname "$0")/.."

tag="${1:-localhost/palisade:ci}"
target="${CARGO_TARGET_DIR:-target}"
# The Dockerfile's PACKAGES.
cargo build --release --locked --bins --quiet \
  -p palisade -p admission -p dispatch -p ingestion -p enrichment -p reaper -p reference-worker

root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
scripts/image-rootfs.sh "$root/rootfs" "$target/release"

buildah() { command buildah --storage-driver vfs "$@"; }
container="$(buildah from scratch)"
buildah copy --quiet "$container" "$root/rootfs/" / >/dev/null
buildah config --user 65532:65532 --port 9090 --env PATH=/usr/local/bin \
  --cmd '["palisade"]' --label org.opencontainers.image.title=palisade "$container"
buildah rmi --force "$tag" >/dev/null 2>&1 || true
buildah commit --quiet --rm "$container" "$tag" >/dev/null

# Each binary starts in the image, as its user.
check="$(buildah from "$tag")"
trap 'buildah rm "$check" >/dev/null 2>&1 || true; rm -rf "$root"' EXIT
for binary in palisade palisade-admission palisade-dispatch palisade-ingestion \
  palisade-enrichment palisade-reaper palisade-worker; do
  buildah run --isolation chroot --user 65532:65532 "$check" -- \
    "/usr/local/bin/$binary" --version >/dev/null ||
    { echo "image-build: $binary does not start in $tag" >&2; exit 1; }
done
echo "image-build: $tag ($(buildah inspect --format '{{.FromImageID}}' "$check" | cut -c1-12)): every binary answers --version as 65532"
