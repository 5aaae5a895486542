#!/usr/bin/env bash
# Checks that what `cargo build --workspace` ships carries no test-only code: neither the
# simulator's teeth (runtime feature `coherence-teeth`: site removal, and the old wall-clock
# liveness rule behind `watch::set_liveness_rule`) nor crash injection (runtime
# feature `crash-points`: `CXLKV_CRASH_AT`, `CXLKV_PAUSE_AT`). Run it right after `cargo build --workspace [--release]`
# (a later `cargo test` rebuilds libcxlkv.so with the test features, as the tests need).
#   scripts/check-shipped.sh [debug|release]
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-debug}"
dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/$profile"
# Markers: the teeth's process-wide drop switch (a static that exists only with `coherence-teeth`)
# and the crash- and pause-point trigger variables (read only with `crash-points`).
fail=0
for art in libcxlkv.so libcxlkv.a lib_cxlkv.so cxlkv cxlkv-ndpd; do
    f="$dir/$art"
    if [ ! -f "$f" ]; then
        echo "check-shipped: $f is missing (run cargo build --workspace first)" >&2
        exit 2
    fi
    teeth=$(nm -a "$f" 2>/dev/null | grep -c DROPPED_EVERYWHERE || true)
    crash=$(grep -c -a -e CXLKV_CRASH_AT -e CXLKV_PAUSE_AT "$f" || true)
    printf '%-12s coherence-teeth symbols: %s, crash-point trigger: %s\n' "$art" "$teeth" "$crash"
    if [ "$teeth" != 0 ] || [ "$crash" != 0 ]; then
        fail=1
    fi
done
# The same, from the feature resolution of a normal (non-test) workspace build.
features=$(cargo tree --workspace -e no-dev,features -i cxlkv-runtime --prefix none 2>/dev/null | grep -E '"(coherence-teeth|crash-points)"' || true)
if [ -n "$features" ]; then
    echo "check-shipped: a normal build enables test-only features: $features"
    fail=1
fi
if [ "$fail" != 0 ]; then
    echo "check-shipped: FAILED: test-only code reaches shipped artifacts" >&2
    exit 1
fi
echo "check-shipped: shipped library and binaries carry no test-only code"
