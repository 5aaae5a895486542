#!/usr/bin/env bash
# Build the test bed's initramfs: busybox, ndctl/daxctl/cxl (with their shared libraries), the
# NVDIMM/DAX/CXL modules of the guest kernel, the static cxlkv binaries and guest/ (init and the
# per-memory scripts).
#
#   KDIR=<unpacked linux-image> BINS="<static binaries>" OUT=<file.cpio.gz> build-initramfs.sh
#
# Env: CACHE (scratch), EXTRA_MODULES.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${CACHE:-$HERE/.cache}"
die() { echo "testbed build-initramfs: ERROR: $*" >&2; exit 1; }
KDIR="${KDIR:?set KDIR to an unpacked linux-image package (get-kernel.sh)}"
BINS="${BINS:?set BINS to the static cxlkv binaries}"
OUT="${OUT:-$CACHE/initramfs.cpio.gz}"
MODULES="nfit nd_pmem dax_pmem device_dax kmem dax_hmem dax_cxl cxl_acpi cxl_pci cxl_mem cxl_pmem ${EXTRA_MODULES:-}"
for t in cpio gzip xz zstd strip readelf; do command -v "$t" >/dev/null || die "missing $t (run setup-host.sh)"; done
[ -x /bin/busybox ] || die "missing /bin/busybox (apt-get install busybox-static)"

t0=$(date +%s.%N)
KVER=$(basename "$(ls -d "$KDIR"/lib/modules/*/ | head -1)")
[ -n "$KVER" ] || die "no lib/modules in $KDIR"
ROOT="$CACHE/initramfs-root"
rm -rf "$ROOT"
mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/sbin,lib,lib64,proc,sys,dev,tmp,run,etc,memory,lib/modules/"$KVER"}

cp /bin/busybox "$ROOT/bin/busybox"
for a in $(/bin/busybox --list); do
	[ "$a" = busybox ] || ln -sf busybox "$ROOT/bin/$a"
done

for b in ndctl daxctl cxl; do
	p=$(command -v "$b") || die "missing $b (apt-get install ndctl daxctl)"
	cp "$p" "$ROOT/usr/bin/$b"
	ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
		d="$ROOT$(dirname "$lib")"; mkdir -p "$d"; cp -L "$lib" "$d/"
	done
done
mkdir -p "$ROOT/etc/ndctl" "$ROOT/etc/daxctl"

# kernel modules: the names above + their depends= closure, decompressed; busybox depmod
MDIR="$KDIR/lib/modules/$KVER"
declare -A seen
find_mod() { find "$MDIR/kernel" -name "$1.ko" -o -name "$1.ko.xz" -o -name "$1.ko.zst" | head -1; }
add_mod() {
	local name="${1//-/_}" f rel dst deps d
	[ -n "${seen[$name]:-}" ] && return 0
	seen[$name]=1
	f=$(find_mod "$name"); [ -z "$f" ] && f=$(find_mod "${name//_/-}")
	[ -z "$f" ] && { echo "  (module $name not in this kernel, skipped)" >&2; return 0; }
	rel="${f#"$MDIR"/}"; rel="${rel%.xz}"; rel="${rel%.zst}"
	dst="$ROOT/lib/modules/$KVER/$rel"; mkdir -p "$(dirname "$dst")"
	case "$f" in
	*.xz) xz -dc "$f" >"$dst" ;;
	*.zst) zstd -qdc "$f" >"$dst" ;;
	*) cp "$f" "$dst" ;;
	esac
	deps=$(grep -a -o 'depends=[A-Za-z0-9_,-]*' "$dst" | head -1 | sed 's/depends=//' || true)
	for d in ${deps//,/ }; do add_mod "$d"; done
}
for m in $MODULES; do add_mod "$m"; done
cp "$MDIR"/modules.builtin* "$ROOT/lib/modules/$KVER/" 2>/dev/null || true
/bin/busybox depmod -b "$ROOT" "$KVER"

for f in $BINS; do
	[ -x "$f" ] || die "missing binary $f"
	if readelf -l "$f" | grep -q INTERP; then die "$f is dynamically linked (build with -C target-feature=+crt-static)"; fi
	strip -o "$ROOT/bin/$(basename "$f")" "$f"
done
cp "$HERE/guest/init" "$ROOT/init"; chmod +x "$ROOT/init"
cp "$HERE"/guest/memory/*.sh "$ROOT/memory/"

mkdir -p "$(dirname "$OUT")"
(cd "$ROOT" && find . | cpio -o -H newc --quiet | gzip -1 >"$OUT")
echo "testbed build-initramfs: $OUT ($(du -h "$OUT" | cut -f1), kernel $KVER, $(find "$ROOT/lib/modules" -name '*.ko' | wc -l) modules) in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')s" >&2
