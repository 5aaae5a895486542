#!/usr/bin/env bash
# Fetch the guest kernel: Debian bookworm-backports linux-image-amd64 (6.12; 6.1 cannot create a
# volatile CXL region), unpacked with dpkg -x, plus an uncompressed vmlinux extracted from the
# bzImage (boots through PVH, which skips ~5 s of in-guest decompression under TCG).
#
#   testbed/qemu/get-kernel.sh        -> prints KDIR=<dir> on stdout
#
# Needs setup-host.sh's private apt configuration under $CACHE/apt.  Env: CACHE.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${CACHE:-$HERE/.cache}"
die() { echo "testbed get-kernel: ERROR: $*" >&2; exit 1; }
A="$CACHE/apt"
[ -f "$A/sources.list" ] || die "no $A/sources.list: run testbed/qemu/setup-host.sh first"
# shellcheck disable=SC1091
CODENAME=$(. /etc/os-release && echo "$VERSION_CODENAME")
APTO=(-o "Dir::Etc::SourceList=$A/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A/cache")
mkdir -p "$CACHE/debs"
cd "$CACHE/debs"
t0=$(date +%s)
# The meta package names the current ABI package.  Reuse a kernel already unpacked when the
# meta package is cached (the download is 106 MB).
if ! ls linux-image-amd64_*.deb >/dev/null 2>&1; then
	apt-get "${APTO[@]}" download -q "linux-image-amd64/$CODENAME-backports" >/dev/null 2>&1 ||
		die "apt-get download linux-image-amd64/$CODENAME-backports failed"
fi
META=$(ls linux-image-amd64_*.deb | head -1)
PKG=$(dpkg-deb -f "$META" Depends | tr ',' '\n' | sed -n 's/^ *\(linux-image-[^ ]*\) .*/\1/p' | head -1)
VER=$(dpkg-deb -f "$META" Depends | sed -n 's/.*(= \([^)]*\)).*/\1/p' | head -1)
[ -n "$PKG" ] && [ -n "$VER" ] || die "cannot resolve the kernel package from $META"
if ! ls "${PKG}"_*.deb >/dev/null 2>&1; then
	apt-get "${APTO[@]}" download -q "$PKG=$VER" >/dev/null 2>&1 || die "apt-get download $PKG=$VER failed"
fi
DEB=$(ls "${PKG}"_*.deb | head -1)
KDIR="$CACHE/kernel-$PKG"
if [ ! -f "$KDIR/vmlinux" ]; then
	rm -rf "$KDIR"
	dpkg -x "$DEB" "$KDIR" || die "dpkg -x $DEB failed"
	BZ=$(ls "$KDIR"/boot/vmlinuz-* | head -1)
	# find the compressed payload inside the bzImage and decompress it
	off=$(LC_ALL=C grep -abo $'\xfd7zXZ\x00' "$BZ" | head -1 | cut -d: -f1 || true)
	if [ -n "$off" ]; then
		tail -c +$((off + 1)) "$BZ" | xz -dc --single-stream >"$KDIR/vmlinux" 2>/dev/null || true
	else
		off=$(LC_ALL=C grep -abo $'\x28\xb5\x2f\xfd' "$BZ" | head -1 | cut -d: -f1 || true)
		[ -n "$off" ] && { tail -c +$((off + 1)) "$BZ" | zstd -qdc >"$KDIR/vmlinux" 2>/dev/null || true; }
	fi
	[ "$(head -c 4 "$KDIR/vmlinux" 2>/dev/null | od -An -tx1 | tr -d ' ')" = 7f454c46 ] ||
		{ rm -f "$KDIR/vmlinux"; die "could not extract an ELF vmlinux from $BZ"; }
fi
echo "testbed get-kernel: $(basename "$DEB") unpacked in $KDIR, $(($(date +%s) - t0))s" >&2
echo "KDIR=$KDIR"
