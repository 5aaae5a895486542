#!/usr/bin/env bash
# Miri over the unit tests of the two crates that hold most of the `unsafe`: cxlkv-shm (mappings,
# the bounds-checked raw memory, cache-line maintenance) and cxlkv-kernels (SIMD scans). Miri runs
# each test in an interpreter that checks every pointer access, alignment and aliasing rule.
#
#   ./scripts/miri.sh            # installs nightly + miri with rustup if missing, then runs
#
# Tests Miri cannot run are marked `#[cfg_attr(miri, ignore = "why")]` where they are defined, and
# Miri lists them as ignored with that reason. The kinds:
#   - mmap of files, /dev/shm and devices, NUMA policies, /sys and hwloc (foreign calls Miri does
#     not emulate);
#   - x86 cache-line and non-temporal instructions (CLWB, CLFLUSHOPT, MOVNTDQ) and the AVX2 /
#     AVX-512 kernels' intrinsics Miri lacks; the kernels' portable paths run instead, because
#     `is_x86_feature_detected!` answers false under Miri;
#   - threads spawned by rayon-style pools and wall-clock timing (slow or unsupported).
# Not part of scripts/test.sh: a nightly toolchain and Miri's sysroot are a download and a build
# of their own (minutes), and the interpreter is some hundred times slower than the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

if ! cargo +nightly miri --version >/dev/null 2>&1; then
    command -v rustup >/dev/null || { echo "miri.sh: needs rustup to install nightly with miri" >&2; exit 1; }
    rustup toolchain install nightly --profile minimal --component miri,rust-src
fi
# A target dir of its own: Miri's builds never invalidate the main ones.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/miri"
# Isolation off: the shm tests read the page size and the environment; nothing else escapes.
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
SECONDS=0
cargo +nightly miri setup
cargo +nightly miri test -p cxlkv-shm -p cxlkv-kernels --lib "$@"
echo "miri: ${SECONDS} s"
