#!/usr/bin/env bash
# Installs what cxlkv needs on a fresh Debian or Ubuntu machine (idempotent).
#   - system libraries: libhwloc (topology), libclang (bindgen for the device ABI), a C toolchain,
#     valgrind (C ABI tests), python3 with venv and headers (the Python package: a venv for
#     pip install ./python; libpython for linking the extension crate in workspace builds),
#     libibverbs1 (Mooncake Store's wheel loads it even for TCP: scripts/crosspod.sh,
#     scripts/bench-peers.sh), redis-server (the peer benchmark's Redis rows);
#   - a Rust toolchain (rustup when reachable, else the distribution's cargo).
set -euo pipefail

need_pkgs=(build-essential pkg-config libhwloc-dev libudev-dev libclang-dev clang valgrind python3 python3-venv python3-dev ca-certificates curl libibverbs1 redis-server)
missing=()
for p in "${need_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# pip fetches the model for the decoder's tests (scripts/fetch-model.sh): Debian's pip only when
# no pip is on the machine.
if ! command -v pip3 >/dev/null && ! command -v pip >/dev/null && ! python3 -m pip --version >/dev/null 2>&1; then
    missing+=(python3-pip)
fi
if ((${#missing[@]})); then
    if ! command -v apt-get >/dev/null; then
        echo "setup: missing packages ${missing[*]} and no apt-get; install them by hand" >&2
        exit 1
    fi
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
    [ -x "$HOME/.cargo/bin/cargo" ] || {
        echo "setup: installing Rust with rustup"
        curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component clippy,rustfmt
    }
fi
export PATH="$HOME/.cargo/bin:$PATH"
cargo --version
