#!/usr/bin/env bash
# The long-run fuzz (docs/SECURITY.md, "Long-run fuzz"): the four fuzz tests of the test suite at
# the counts the project's reliability goals ask for, in release builds, each timed.
#
#   scripts/fuzz-long.sh                 # 1,000,000 pool images, 100,000 device commands per
#                                        # engine, 100,000 C ABI calls, 100,000 Python calls
#   PYTHON=.venv/bin/python scripts/fuzz-long.sh   # the interpreter with `pip install ./python`
#
# Counts: CXLKV_FUZZ_CASES (mutated pool images), CXLKV_NDP_FUZZ_CASES (malformed commands per
# engine), CXLKV_FFI_FUZZ_CALLS, CXLKV_PY_FUZZ_CALLS; seeds: CXLKV_FUZZ_SEED, CXLKV_FFI_FUZZ_SEED,
# CXLKV_PY_FUZZ_SEED. Each test prints its counts (cases, crashes, wrong reads, leaks) and fails on
# any crash, wrong read or leak; this script prints them and the time each took, and exits non-zero
# if any failed. The Python part is skipped (said so) when PYTHON cannot import cxlkv.
set -uo pipefail
cd "$(dirname "$0")/.."

export CXLKV_FUZZ_CASES="${CXLKV_FUZZ_CASES:-1000000}"
export CXLKV_NDP_FUZZ_CASES="${CXLKV_NDP_FUZZ_CASES:-100000}"
export CXLKV_FFI_FUZZ_CALLS="${CXLKV_FFI_FUZZ_CALLS:-100000}"
export CXLKV_PY_FUZZ_CALLS="${CXLKV_PY_FUZZ_CALLS:-100000}"
PYTHON="${PYTHON:-python3}"
log_dir="$(mktemp -d)"   # one folder per run, kept for its logs
failed=0
summary=()

# run NAME COMMAND...: runs it with its output in $log_dir/NAME.log, prints the count lines and the
# time it took.
run() {
    local name="$1"
    shift
    local log="$log_dir/$name.log" start=$SECONDS rc=0
    echo "== $name: $*"
    "$@" >"$log" 2>&1 || rc=$?
    grep -E "cases|commands in|calls|test result|WRONG|CRASH|PANICKED|skipped|SKIPPED" "$log" | grep -v "^running"
    local took=$((SECONDS - start))
    if [ "$rc" -ne 0 ]; then
        failed=1
        echo "$name FAILED (exit $rc) after $took s; full output in $log"
        summary+=("$name: FAILED after $took s ($log)")
    else
        echo "$name: $took s"
        summary+=("$name: $took s")
    fi
}

echo "building the fuzz tests in release"
cargo test --release -p cxlkv-runtime --test corruption --no-run -q || exit 1
cargo test --release -p cxlkv-ndp --test fuzz --no-run -q || exit 1
cargo test --release -p cxlkv-ffi --lib --no-run -q || exit 1

run pool-images cargo test --release -q -p cxlkv-runtime --test corruption \
    random_flips_are_reported_and_never_return_wrong_bytes -- --nocapture
run device-commands cargo test --release -q -p cxlkv-ndp --test fuzz -- --nocapture --test-threads 1
run c-abi-calls cargo test --release -q -p cxlkv-ffi --lib fuzz:: -- --nocapture
if "$PYTHON" -c "import cxlkv, numpy, pytest" 2>/dev/null; then
    run python-calls "$PYTHON" -m pytest python/tests/test_fuzz.py -q -s
else
    echo "== python-calls: skipped: $PYTHON cannot import cxlkv, numpy and pytest (pip install ./python numpy pytest; set PYTHON)"
    summary+=("python-calls: skipped")
fi

echo
echo "long-run fuzz: images $CXLKV_FUZZ_CASES, device commands $CXLKV_NDP_FUZZ_CASES per engine," \
    "C ABI calls $CXLKV_FFI_FUZZ_CALLS, Python calls $CXLKV_PY_FUZZ_CALLS"
printf '  %s\n' "${summary[@]}"
exit "$failed"
