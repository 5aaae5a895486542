#!/usr/bin/env bash
# Miri over the unit tests of cxlkv-shm (mappings, the bounds-checked raw memory, cache-line
# maintenance) and cxlkv-kernels (row views, SIMD scans). Miri runs each test in an interpreter
# that checks every pointer access, alignment and aliasing rule.
#
#   ./scripts/miri.sh            # installs nightly + miri with rustup if missing, then runs
#
# Tests Miri cannot run are marked `#[cfg_attr(miri, ignore = "why")]` where they are defined, and
# Miri lists them as ignored with that reason (22 of 46 on 2026-11-26, nightly 2026-05-19):
#   - cxlkv-shm (4 of 15): non-temporal stores and cache-line flushes are inline assembly; the
#     NUMA test maps /dev/shm and calls get_mempolicy(2), foreign calls Miri does not emulate;
#   - cxlkv-kernels (18 of 31): CLFLUSH (`cold`) is an intrinsic Miri lacks; 17 tests sweep
#     whole value spaces or large shapes and take over 45 s each in the interpreter.
# What runs: the bounds-checked raw memory (every `unsafe` path of `RawMemory` but the streaming
# write), region and topology parsing, and the kernels' row views, dtype conversions, top-k,
# attention and partials.
# Not part of scripts/test.sh: it needs a nightly toolchain (a download that moves daily) and
# Miri's own sysroot build; about 30 s of tests once those are built.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

if ! cargo +nightly miri --version >/dev/null 2>&1; then
    command -v rustup >/dev/null || { echo "miri.sh: needs rustup to install nightly with miri" >&2; exit 1; }
    rustup toolchain install nightly --profile minimal --component miri,rust-src
fi
# A target dir of its own: Miri's builds never invalidate the main ones.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/miri"
# Isolation off: the topology tests read /sys.
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
SECONDS=0
cargo +nightly miri setup
cargo +nightly miri test -p cxlkv-shm -p cxlkv-kernels --lib "$@"
echo "miri: ${SECONDS} s"
