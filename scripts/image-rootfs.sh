#!/usr/bin/env bash
# The runtime image's final contents, assembled as a root filesystem from this machine's Debian
# packages, for checks where the image cannot be pulled or built (no Docker engine, no registry):
# what `gcr.io/distroless/cc-debian12:nonroot` holds (the packages below, unpacked; passwd and
# group with `nonroot`, 65532; the CA bundle; no shell, no package manager) plus the
# Dockerfile's `COPY --from=build /out/ /usr/local/bin/` of palisade's binaries.
#
#   scripts/image-rootfs.sh <root> <directory holding the binaries>
#
# The .deb files are downloaded once with `apt-get download` into the tool cache
# (~/.cache/palisade-tools/image-debs). tests/tests/system/image.rs runs the binaries in the
# result under chroot as user 65532; docs/deploy.md says what that proves and what it does not.
set -euo pipefail

root="${1:?usage: scripts/image-rootfs.sh <root> <binaries directory>}"
binaries="${2:?usage: scripts/image-rootfs.sh <root> <binaries directory>}"

# distroless's static (base-files, netbase, tzdata, ca-certificates), base (libc6, libssl3) and
# cc (libgcc-s1, libgomp1, libstdc++6) images: Debian 12 packages of these names.
PACKAGES="base-files netbase tzdata ca-certificates libc6 libssl3 libgcc-s1 libgomp1 libstdc++6"
BINARIES="palisade palisade-admission palisade-dispatch palisade-ingestion palisade-enrichment palisade-reaper palisade-worker"

debs="$HOME/.cache/palisade-tools/image-debs"
mkdir -p "$debs"
for package in $PACKAGES; do
  if ! compgen -G "$debs/${package}_*.deb" >/dev/null; then
    # shellcheck disable=SC2086
    (cd "$debs" && { apt-get download -q "$package" 2>/dev/null ||
      { apt-get update -qq && apt-get download -q "$package"; }; }) >/dev/null ||
      { echo "image-rootfs: cannot download the Debian package $package (apt-get download)" >&2; exit 1; }
  fi
done

mkdir -p "$root"
for deb in "$debs"/*.deb; do
  dpkg-deb -x "$deb" "$root"
done

# Debian's usrmerge layout, as distroless has it: /lib64 holds the dynamic loader.
for dir in lib lib64 bin sbin; do
  if [ -d "$root/usr/$dir" ] && [ ! -e "$root/$dir" ]; then
    ln -s "usr/$dir" "$root/$dir"
  fi
done

# distroless writes these itself (passwd, group, nsswitch.conf); no package of Debian's does.
mkdir -p "$root/etc" "$root/home/nonroot" "$root/tmp"
chmod 1777 "$root/tmp"
cat > "$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
cat > "$root/etc/group" <<'GROUP'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
GROUP
chown 65532:65532 "$root/home/nonroot"
# As distroless writes it: names resolve from /etc/hosts first, then DNS.
cat > "$root/etc/nsswitch.conf" <<'NSSWITCH'
passwd:         files
group:          files
shadow:         files
gshadow:        files
hosts:          files dns
networks:       files
protocols:      db files
services:       db files
ethers:         db files
rpc:            db files
NSSWITCH
# The CA bundle update-ca-certificates would write (distroless ships it built).
mkdir -p "$root/etc/ssl/certs"
cat "$root"/usr/share/ca-certificates/mozilla/*.crt > "$root/etc/ssl/certs/ca-certificates.crt"

mkdir -p "$root/usr/local/bin"
for binary in $BINARIES; do
  [ -x "$binaries/$binary" ] ||
    { echo "image-rootfs: $binaries/$binary is missing: cargo build --workspace --bins" >&2; exit 1; }
  install -m 0755 "$binaries/$binary" "$root/usr/local/bin/$binary"
done
