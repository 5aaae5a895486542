"""Helpers shared by the Python tests, written once (the Rust tests' counterpart is the
`cxlkv-test-support` crate):

- `ndpd_binary()` finds `cxlkv-ndpd` ($CXLKV_NDPD, else the repository's target/debug or
  target/release) and `start_ndpd(ndpd, spec)` runs it on a pool until it says it serves;
- the `spec` fixture names a fresh shared-memory pool, removed after the test;
- `make_pool` creates a pool on a spec;
- `rng(seed)` and `rand_bytes(seed, n)` are the seeded generators the tests draw data from;
- `run_child(code)` runs code in a fresh interpreter.

`cxlkv` is imported inside the helpers, so that collecting tests never needs the extension.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ndpd_binary():
    """The `cxlkv-ndpd` binary, or None when there is none (the caller skips, saying why)."""
    env = os.environ.get("CXLKV_NDPD")
    if env:
        return env
    for profile in ("debug", "release"):
        p = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), profile, "cxlkv-ndpd")
        if os.path.exists(p):
            return p
    return None


def start_ndpd(ndpd, spec):
    """`ndpd --pool SPEC`, returned once it printed its `serving` line; stop it with
    `stop_ndpd`."""
    proc = subprocess.Popen([ndpd, "--pool", spec], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = []
    for line in proc.stdout:
        said.append(line)
        if "serving" in line:
            return proc
    proc.wait(timeout=10)
    raise AssertionError("%s did not start serving: %r %s" % (ndpd, "".join(said), proc.stderr.read()))


def stop_ndpd(proc):
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def spec(request):
    """A fresh `shm:` pool spec for one test, unlinked after it."""
    import cxlkv

    module = request.module.__name__.removeprefix("test_")
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", "%s-%s" % (module[:12], request.node.name[:48]))
    s = "shm:cxlkv-py-%d-%s" % (os.getpid(), name)
    yield s
    try:
        cxlkv.unlink(s)
    except cxlkv.Error:
        pass


def make_pool(spec, participants=3, size=32 << 20, block=64 << 10):
    import cxlkv

    return cxlkv.Pool.create(spec, size, block_size=block, participants=participants)


def rng(seed):
    """numpy's seeded generator: every test's random data comes from one of these."""
    import numpy as np

    return np.random.default_rng(seed)


def rand_bytes(seed, n):
    import numpy as np

    return rng(seed).integers(0, 256, n, dtype=np.uint8)


def run_child(code):
    """Runs `code` in a fresh interpreter; returns its stdout (fails the test on a non-zero exit)."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "child failed:\n%s\n%s" % (r.stdout, r.stderr)
    return r.stdout
