"""The LMCache adapter across pods (issue #25): a chunk stored through LMCache in pod A is found
by LMCache in pod B, through the cross-pod tier (docs/CROSSPOD.md) and a real Mooncake Store. The
pods run in python/tests/crosspod_lmcache.py, inside a private network namespace (Mooncake's
listeners bind every interface).

Run: `python -m pytest python/tests/test_crosspod_lmcache.py -s` in a venv with cxlkv, torch,
LMCache and `mooncake-transfer-engine-non-cuda` (docs/CROSSPOD.md, "Tests and benchmark").
Skipped, saying so, where torch, LMCache or Mooncake Store is missing or no private network
namespace can be made.
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed (LMCache needs it)")
pytest.importorskip("lmcache", reason="lmcache is not installed")
pytest.importorskip(
    "mooncake.store",
    reason="Mooncake Store is not installed (mooncake-transfer-engine-non-cuda; needs libibverbs1)",
)

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_chunk_lmcache_stored_in_pod_a_is_found_by_lmcache_in_pod_b():
    if subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode != 0:
        pytest.skip("no private network namespace (unshare -rn); Mooncake binds every interface")
    r = subprocess.run(
        ["unshare", "-rn", sys.executable, os.path.join(HERE, "crosspod_lmcache.py")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(r.stdout)
    assert r.returncode == 0, "pods failed:\n%s\n%s" % (r.stdout, r.stderr[-6000:])
    assert "crosspod lmcache: PASS" in r.stdout
