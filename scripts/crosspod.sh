#!/usr/bin/env bash
# The cross-pod tier (docs/CROSSPOD.md) against a real Mooncake Store, on one machine.
#   scripts/crosspod.sh test [VENV]    the end-to-end checks of issue #25 (python/tests/crosspod_pods.py)
#   scripts/crosspod.sh bench [VENV]   the import benchmark (benches/crosspod/import.py)
#   scripts/crosspod.sh lmcache [VENV] LMCache in pod A stores chunks, LMCache in pod B finds them
#                                      (python/tests/crosspod_lmcache.py; VENV needs torch and lmcache)
# VENV (default: the test command's target/py-venv) must have the cxlkv package installed
# (pip install ./python); this script adds mooncake-transfer-engine-non-cuda (pinned) from PyPI
# unless CXLKV_CROSSPOD_NO_INSTALL=1, and needs Debian's libibverbs1 (scripts/setup.sh's list).
# Mooncake's transfer listeners and HTTP metadata server bind every interface whatever address is
# configured, so everything runs inside a private network namespace (`unshare -rn`) with only
# `lo` up; without one the run stops and says so. Every process is started and stopped by its pid
# inside the namespace; the namespace ends with the script.
set -euo pipefail
cd "$(dirname "$0")/.."

MOONCAKE="mooncake-transfer-engine-non-cuda==0.3.13.post1"
what="${1:-test}"
case "$what" in
    test) driver=python/tests/crosspod_pods.py ;;
    bench) driver=benches/crosspod/import.py ;;
    lmcache) driver=python/tests/crosspod_lmcache.py ;;
    *)
        echo "usage: scripts/crosspod.sh test|bench|lmcache [VENV]" >&2
        exit 2
        ;;
esac
venv="${2:-${CXLKV_CROSSPOD_VENV:-}}"
if [ -z "$venv" ]; then
    target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    venv="$target_dir/py-venv"
fi
py="$venv/bin/python"

if [ "${CXLKV_CROSSPOD_INSIDE:-0}" != 1 ]; then
    if ! "$py" -c "import cxlkv" 2>/dev/null; then
        echo "crosspod: SKIP: no cxlkv package in $venv (pip install ./python there first)" >&2
        exit 0
    fi
    if [ "${CXLKV_CROSSPOD_NO_INSTALL:-0}" != 1 ] && ! "$py" -c "import mooncake.store" 2>/dev/null; then
        "$venv/bin/pip" install -q --disable-pip-version-check "$MOONCAKE" >&2 ||
            echo "crosspod: $MOONCAKE did not install" >&2
    fi
    if ! "$py" -c "import mooncake.store" 2>/dev/null; then
        echo "crosspod: SKIP: Mooncake Store does not import ($MOONCAKE; it needs Debian's libibverbs1)" >&2
        exit 0
    fi
    if [ "$what" = lmcache ] && ! "$py" -c "import torch, lmcache" 2>/dev/null; then
        echo "crosspod: SKIP: torch and lmcache do not import in $venv (scripts/setup-engines.sh)" >&2
        exit 0
    fi
    if ! unshare -rn true 2>/dev/null; then
        echo "crosspod: SKIP: no private network namespace (unshare -rn); Mooncake binds every interface" >&2
        exit 0
    fi
    SECONDS=0
    rc=0
    CXLKV_CROSSPOD_INSIDE=1 unshare -rn "$0" "$what" "$venv" || rc=$?
    echo "crosspod $what: ${SECONDS} s, exit $rc"
    exit "$rc"
fi

ip link set lo up
links="$(ip -o link show | awk -F': ' '{print $2}' | tr '\n' ' ')"
[ "$links" = "lo " ] || {
    echo "crosspod: not a private network namespace: $links" >&2
    exit 1
}
exec "$py" "$driver"
