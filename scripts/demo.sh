#!/usr/bin/env bash
# README's first command: builds cxlkv (release), fetches the model (scripts/fetch-model.sh:
# SmolLM2-135M, about 100 MB, cached) and runs `cxlkv demo`: processes sharing a real KV cache
# through the pool, then the real model decoding with its attention next to the memory
# (ndp-exact) against dense, and the device's own numbers. Extra arguments go to `cxlkv demo`
# (`--json`, `--sweep`, `--text FILE`, `--context N`, `--model FILE`, `--help`); CXLKV_MODEL or
# `--model FILE` replaces the fetched model, `--no-decode` leaves the model out.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >&2   # stdout stays the demo's own (`--json`)
export PATH="$HOME/.cargo/bin:$PATH"

need_model=1
for a in "$@"; do
    case "$a" in
    --model | --model=* | --no-decode | --help | -h) need_model=0 ;;
    esac
done
if [ "$need_model" = 1 ] && [ -z "${CXLKV_MODEL:-}" ]; then
    CXLKV_MODEL="$(./scripts/fetch-model.sh)"
    export CXLKV_MODEL
fi

# The demo runs `cxlkv` and, with --device-process, `cxlkv-ndpd`: build those two only.
cargo build --release -q -p cxlkv --bin cxlkv -p cxlkv-ndp --bin cxlkv-ndpd
exec ./target/release/cxlkv demo "$@"
