#!/usr/bin/env bash
# Installs the inference engine packages that cxlkv's adapter tests (python/tests/test_adapter_*.py)
# run against, from PyPI, versions pinned, into a venv (default: the test command's
# target/py-venv). The test command (scripts/test.sh) runs it before pytest.
#   scripts/setup-engines.sh [VENV]
#
# - llama-cpp-python 0.3.36: builds llama.cpp from source (cmake and ninja come from PyPI as
#   build requirements; a C/C++ compiler is needed). A lean CPU build: no examples, tests, tools,
#   server or curl; native CPU flags kept (GGML_NATIVE, the default) for speed. The build took
#   814 s on the 2-core machine shared with other builds (2,574 s under heavier load). pip caches
#   the built wheel, so a second run on the same machine takes seconds.
# - With CXLKV_ENGINES=all, also LMCache and SGLang, which need torch: torch 2.15.0 from PyPI (the
#   Linux wheel pulls the CUDA libraries: ~5.3 GB installed; it imports and runs on a CPU-only
#   machine), lmcache 0.5.6 with its dependencies, and sglang 0.5.23 without its dependencies
#   (they include flashinfer, flash-attn and a torch pin of 2.14.1) plus the few its HiCache
#   storage module imports (orjson, pybase64, pillow, ipython) and ninja, with which SGLang
#   compiles its page-hash extension on first use. Not in the test command by default: on the
#   2-core machine it took 661 s (torch) + 230 s (lmcache) + ~150 s (sglang and the rest).
#   The adapter tests skip, saying so, where an engine is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON="llama-cpp-python==0.3.36"
TORCH="torch==2.15.0"
LMCACHE="lmcache==0.5.6"
SGLANG="sglang==0.5.23"
SGLANG_IMPORT_DEPS=(orjson pybase64 pillow ipython ninja)
engines="${CXLKV_ENGINES:-llama_cpp}"
case "$engines" in
    llama_cpp | all) ;;
    *)
        echo "setup-engines: CXLKV_ENGINES must be llama_cpp (the default) or all, not '$engines'" >&2
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

if "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('llama-cpp-python') != '${LLAMA_CPP_PYTHON#*==}')" 2>/dev/null; then
    echo "setup-engines: $LLAMA_CPP_PYTHON already installed in $venv"
else
    echo "setup-engines: installing $LLAMA_CPP_PYTHON into $venv (builds llama.cpp from source; minutes on 2 cores)"
    SECONDS=0
    CMAKE_ARGS="-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF" \
        CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        "${pip[@]}" install -q "$LLAMA_CPP_PYTHON"
    echo "setup-engines: $LLAMA_CPP_PYTHON installed in ${SECONDS} s"
fi
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
