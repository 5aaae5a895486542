"""A chunk stored through LMCache in pod A is found by LMCache in pod B (issue #25; run by
python/tests/test_crosspod_lmcache.py inside a private network namespace, whose `lo` it brings up).

A mooncake_master and two pods (crosspod_pods.Pod: each its own pool, of 512 KiB blocks so that a
256-token chunk of SmolLM2-135M K/V, 384 KiB, is one block), each with a bridge for tenant t3 under
the write-back policy (`--publish on-eviction`). LMCache in pod A (the plugin loaded from LMCache's
own YAML config, tenant t3, `CXLKV_CROSSPOD_SOCKET` naming A's bridge) puts the text's 8 chunks
(16 pool blocks: payload and header each) under a quota of 8 blocks, so chunks 0-3 are evicted
and written back. LMCache in pod B (its bridge named) finds exactly those 4 with one
`batched_async_contains` and gets each byte-exact against the same chunk cut from data/kv/.
Prints one line per step; exits non-zero on the first failure. Every process started here is
stopped by its pid."""

import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import crosspod_pods as pods  # noqa: E402
from crosspod_pods import Pod, TENANTS, free_port, start, stop, wait_port  # noqa: E402
from test_adapter_lmcache import KV_DIR, PRELUDE  # noqa: E402

CHUNK = 256
CONFIG = """chunk_size: %d
local_cpu: true
max_local_cpu_size: 0.5
storage_plugins: ["cxlkv"]
extra_config:
  storage_plugin.cxlkv.module_path: cxlkv.adapters.lmcache
  storage_plugin.cxlkv.class_name: CxlkvStorageBackend
  cxlkv.pool: "%s"
  cxlkv.tenant: "t3"
  cxlkv.tenant_salt_env: "CXLKV_TEST_T3_SALT"
"""

PUT_IN_A = r"""
import re
objs = []
for i in range(len(keys)):
    c = chunk(i)
    obj = plugin.local_cpu_backend.allocate(torch.Size(c.shape), torch.float16,
                                            MemoryFormat.KV_2LTD)
    obj.tensor.copy_(torch.from_numpy(c))
    objs.append(obj)
plugin.batched_submit_put_task(keys, objs)
found = re.findall(r'cxlkv_crosspod_write_backs_total\{result="(\w+)"\} (\S+)',
                   cxlkv.metrics_text())
wb = {r: int(float(n)) for r, n in found if float(n)}
# Which chunks pod A still holds, asked of its own pool only (a lookup would import them back).
local = [plugin.me.contains(plugin._key(k)) and plugin.me.contains(plugin._head_key(k))
         for k in keys]
print("A: LMCache put %d chunks of %s under a quota of 8 blocks; write-backs %s; A holds chunks %s"
      % (len(keys), tuple(objs[0].get_shape()), wb, [i for i, x in enumerate(local) if x]))
assert wb == {"published": 8} and local == [False] * 4 + [True] * 4, (wb, local)
plugin.close()
"""

GET_IN_B = r"""
n = loop.run_until_complete(plugin.batched_async_contains("xp-1", keys))
exact = []
for i, k in enumerate(keys[:n]):
    obj = plugin.get_blocking(k)
    exact.append(obj is not None and obj.tensor.numpy().tobytes() == chunk(i).tobytes())
    if obj is not None:
        obj.ref_count_down()
print("B: LMCache finds %d leading chunks of 8 (0-3 were written back in A); byte-exact %s" % (
    n, exact))
assert n == 4 and exact == [True] * 4, (n, exact)
assert plugin.get_blocking(keys[4]) is None  # never published: pod A still holds it
print("B: chunk 4 (never evicted in A) is a miss in B")
plugin.close()
"""


def lmcache(pod, code, work):
    cfg = os.path.join(work, "lmcache-%s.yaml" % pod.name)
    with open(cfg, "w") as f:
        f.write(CONFIG % (CHUNK, pod.spec))
    env = dict(os.environ, PYTHONHASHSEED="0", CXLKV_TEST_CFG=cfg, CXLKV_TEST_KV=KV_DIR,
               CXLKV_TEST_T3_SALT=TENANTS["t3"].decode(), CXLKV_CROSSPOD_SOCKET=pod.sock("t3"),
               CXLKV_CROSSPOD_WRITE_BACK_MS="2000")  # a loaded machine does not fail the check
    prelude = "import cxlkv\n" + PRELUDE.replace("@CHUNK@", str(CHUNK))
    r = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True,
                       timeout=300, env=env)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        raise RuntimeError("LMCache in pod %s failed:\n%s" % (pod.name, r.stderr[-4000:]))


def main():
    import cxlkv.crosspod  # noqa: F401  (the bridges' client)
    import mooncake

    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="cxlkv-crosspod-lmcache-")
    master_exe = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
    port = free_port()
    master = start("mooncake_master", [master_exe, "--port", str(port)],
                   open(os.path.join(work, "master.log"), "w"))
    made = []
    try:
        wait_port(port, master, "mooncake_master")
        for name in ("a", "b"):
            p = Pod(name, work, "127.0.0.1:%d" % port, size=96 << 20, segment_mib=64,
                    block=(512 << 10) + 4096, served=())
            made.append(p)
            p.start_bridge("t3", publish="on-eviction")
        a, b = made
        a.pool.set_tenant_quota("t3", 8)
        lmcache(a, PUT_IN_A, work)
        lmcache(b, GET_IN_B, work)
        print("crosspod lmcache: PASS (%.1f s)" % (time.time() - t0))
        return 0
    finally:
        for _, p in reversed(pods.procs):
            stop(p)
        for p in made:
            p.pool.unlink()


if __name__ == "__main__":
    sys.exit(main())
