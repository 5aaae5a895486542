#!/usr/bin/env bash
# The peer benchmark: cxlkv against what a user would pick instead (llama.cpp's own caches,
# LMCache's backends, SGLang's HiCacheFile, Mooncake Store, Redis 7), memcpy and read bandwidth as
# the ceiling, in one run, interleaved, with medians, p99 and the machine's load
# (docs/RESULTS.md, "Peers"; the driver is benches/peers/bench_peers.py).
#   scripts/bench-peers.sh [--quick] [--json] [--only direct,llama_cpp,lmcache,sglang]
#
# It installs what it needs first, the way the test command installs the engines, into a venv
# (CXLKV_PEERS_VENV, default the test command's target/py-venv):
#   - the cxlkv package (pip install ./python) when the venv has none;
#   - redis-server (Debian; scripts/setup.sh installs it) and the redis client (PyPI, pinned);
#   - llama-cpp-python through scripts/setup-engines.sh (cached wheel, pinned) and the SmolLM2
#     GGUF through scripts/fetch-model.sh;
#   - without --quick, also torch, LMCache and SGLang (CXLKV_ENGINES=all scripts/setup-engines.sh)
#     and Mooncake Store (mooncake-transfer-engine-non-cuda from PyPI, which needs Debian's
#     libibverbs1 even for TCP).
# `--quick` runs only the rows whose peers the test command already installs (the direct rows
# without Mooncake, llama.cpp on a 384-token prompt), with fewer rounds: scripts/test.sh runs it.
# CXLKV_PEERS_NO_INSTALL=1 skips the installs (the venv must already hold everything).
#
# The run happens inside a private network namespace (`unshare -n`, only lo up) when this user may
# create one: Redis listens on 127.0.0.1 only, but Mooncake's master and transfer engine bind every
# interface. Without one, the Mooncake rows say so and the others run. Every server is started by
# the driver and stopped by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."

REDIS_PY="redis==8.1.0"
MOONCAKE="mooncake-transfer-engine-non-cuda==0.3.13.post1"
quick=0
for arg in "$@"; do
    [ "$arg" = --quick ] && quick=1
done

venv="${CXLKV_PEERS_VENV:-}"
if [ -z "$venv" ]; then
    target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    venv="$target_dir/py-venv"
fi
py="$venv/bin/python"
log() { echo "bench-peers: $*" >&2; }

apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    log "installing ${missing[*]} (Debian)"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

if [ "${CXLKV_PEERS_NO_INSTALL:-0}" != 1 ]; then
    SECONDS=0
    [ -x "$py" ] || python3 -m venv "$venv"
    pip=("$venv/bin/pip" --disable-pip-version-check -q)
    "${pip[@]}" install "maturin>=1.5,<2" "numpy>=1.23" "$REDIS_PY" >&2
    if ! "$py" -c "import cxlkv" 2>/dev/null; then
        log "installing the cxlkv package (pip install ./python: builds the extension in release)"
        PATH="$venv/bin:$PATH" "${pip[@]}" install --no-build-isolation ./python >&2
    fi
    apt_install redis-server
    if [ "$quick" = 1 ]; then
        ./scripts/setup-engines.sh "$venv" >&2
    else
        CXLKV_ENGINES=all ./scripts/setup-engines.sh "$venv" >&2
        apt_install libibverbs1
        "${pip[@]}" install "$MOONCAKE" >&2 || log "Mooncake Store did not install (its rows say why)"
    fi
    log "installs checked in ${SECONDS} s"
fi
CXLKV_MODEL="${CXLKV_MODEL:-$(./scripts/fetch-model.sh)}"
export CXLKV_MODEL
# LMCache hashes its chunk keys with Python's builtin hash: the second process of the LMCache rows
# finds the first one's chunks only with the same seed (LMCache asks for PYTHONHASHSEED=0 itself).
export PYTHONHASHSEED="${PYTHONHASHSEED:-0}"

driver=("$py" benches/peers/bench_peers.py "$@")
if unshare -n true 2>/dev/null; then
    # Only lo, up: nothing started here can be reached from outside, or reach out.
    exec unshare -n sh -c 'ip link set lo up && exec "$@"' sh "${driver[@]}"
fi
log "cannot create a private network namespace (unshare -n): running without one"
exec "${driver[@]}"
