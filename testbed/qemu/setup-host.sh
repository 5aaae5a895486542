#!/usr/bin/env bash
# Install what the cxlkv QEMU test bed needs on a Debian bookworm host (run as root).
#
#   testbed/qemu/setup-host.sh
#
# QEMU 10 comes from bookworm-backports, reached through a private apt configuration under
# $CACHE/apt (the mirror URI is taken from the host's own apt sources), so /etc/apt is not
# modified.  QEMU 7.2 (bookworm) cannot make a volatile CXL type-3 region; 10 can.
# Installs are never optional: any failure exits non-zero with the reason.
# Env: CACHE [testbed/qemu/.cache]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${CACHE:-$HERE/.cache}"
export DEBIAN_FRONTEND=noninteractive
die() { echo "testbed setup-host: ERROR: $*" >&2; exit 1; }
t0=$(date +%s)

have_all() {
	command -v qemu-system-x86_64 >/dev/null && command -v busybox >/dev/null &&
		command -v ndctl >/dev/null && command -v daxctl >/dev/null && command -v cxl >/dev/null &&
		command -v cpio >/dev/null && command -v xz >/dev/null && command -v zstd >/dev/null &&
		[ -x /bin/busybox ] && qemu-system-x86_64 -device cxl-type3,help 2>/dev/null | grep -q volatile-memdev
}
[ -f /etc/os-release ] || die "no /etc/os-release: this script supports Debian bookworm only"
# shellcheck disable=SC1091
CODENAME=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
if [ -n "$SUDO" ] && ! command -v sudo >/dev/null; then die "not root and no sudo: cannot install packages"; fi

A="$CACHE/apt"
mkdir -p "$A/lists/partial" "$A/cache/archives/partial"
if ! have_all; then
	command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian bookworm only"
	[ "$CODENAME" = bookworm ] || echo "testbed setup-host: warning: tested on bookworm, this is '$CODENAME'" >&2
	$SUDO apt-get update -qq || die "apt-get update failed (no access to the Debian mirror?)"
	$SUDO apt-get install -y -qq --no-install-recommends \
		busybox-static ndctl daxctl cpio gcc libc6-dev binutils xz-utils zstd >/dev/null ||
		die "apt-get install of busybox-static ndctl daxctl cpio gcc libc6-dev binutils xz-utils zstd failed"
fi
# The backports apt config is also what get-kernel.sh uses to fetch the 6.12 kernel.
MIRROR=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' |
	awk -v c="$CODENAME" '$2 == c {print $1; exit}')
[ -n "$MIRROR" ] || die "cannot find the $CODENAME mirror in the apt configuration (run apt-get update?)"
printf 'deb %s %s main\ndeb %s %s-backports main\n' "$MIRROR" "$CODENAME" "$MIRROR" "$CODENAME" >"$A/sources.list"
APTO=(-o "Dir::Etc::SourceList=$A/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A/cache" -o "Dir::Cache::archives=$A/cache/archives")
if [ ! -f "$A/updated" ] || [ -n "$(find "$A/updated" -mmin +1440)" ]; then
	$SUDO apt-get "${APTO[@]}" update -qq || die "apt-get update of $CODENAME-backports ($MIRROR) failed"
	touch "$A/updated"
fi
if ! have_all; then
	# --no-remove: never let apt drop other packages (e.g. an installed backports qemu-utils)
	$SUDO apt-get "${APTO[@]}" install -y -qq --no-install-recommends --no-remove \
		-t "$CODENAME-backports" qemu-system-x86 >/dev/null ||
		die "installing qemu-system-x86 from $CODENAME-backports failed"
fi
have_all || die "after installing, still missing one of qemu-system-x86_64 (with volatile-memdev), busybox, ndctl, daxctl, cxl, cpio, xz, zstd"
echo "testbed setup-host: $(qemu-system-x86_64 --version | head -1); ndctl $(ndctl --version); $(($(date +%s) - t0))s"
