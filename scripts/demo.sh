#!/usr/bin/env bash
# The main job: builds cxlkv (release) and runs `cxlkv demo` on the embedded default (a
# shared-memory pool). README's first command. Extra arguments go to `cxlkv demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q --workspace
exec ./target/release/cxlkv demo "$@"
