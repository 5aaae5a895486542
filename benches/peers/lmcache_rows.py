"""LMCache rows: the cxlkv storage plugin against LMCache 0.5.6's own LocalCPUBackend,
LocalDiskBackend and Device-DAX plugin (`plugins/dax_backend.py`, on a /dev/shm file as fake DAX),
and MaruBackend where it installs, all created by LMCache's own `CreateStorageBackends` from one
config and driven through LMCache's storage backend interface:

- put: `batched_submit_put_task` of 64 real 256-token KV_2LTD chunks of SmolLM2 (data/kv: the 8
  chunks of the 2,048-token text under 8 different first tokens, so 64 distinct chained keys;
  393,216 bytes each), timed until every chunk is stored (LocalDisk writes on its own thread:
  until its completion callback);
- get: `get_blocking` of each chunk into LMCache's CPU allocator, bytes checked against the chunk;
- `batched_async_contains` of the 64 keys (latency of the call, submitted to LMCache's event
  loop thread as LMCache does; 20 calls a round);
- a second process's hit: a fresh process with the same config asks `batched_async_contains` for
  the chunks the first one stored.

Each round puts, looks up, gets and removes the chunks on every backend in turn (the order
rotates), so they share the machine's state. Untimed rounds of puts and removes come first, until
every backend has touched all of its storage (first-touch page faults are not a put's cost).
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from common import Samples, error_row, kv_tensors, row

ENGINE = "LMCache"
CH = 256
VARIANTS = 8
# Put-and-drop rounds before the timed ones (see `run`).
WARM_ROUNDS = 24
HERE = os.path.abspath(__file__)


def config_text(spec, disk, dax):
    return (
        "chunk_size: %d\n"
        "local_cpu: true\n"
        "max_local_cpu_size: 1\n"
        'local_disk: "file://%s"\n'
        "max_local_disk_size: 1\n"
        'storage_plugins: ["cxlkv", "dax"]\n'
        "extra_config:\n"
        "  storage_plugin.cxlkv.module_path: cxlkv.adapters.lmcache\n"
        "  storage_plugin.cxlkv.class_name: CxlkvStorageBackend\n"
        '  cxlkv.pool: "%s"\n'
        "  storage_plugin.dax.module_path: lmcache.v1.storage_backend.plugins.dax_backend\n"
        "  storage_plugin.dax.class_name: DaxBackend\n"
        '  dax.device_path: "%s"\n'
        "  dax.max_dax_size: 0.125\n" % (CH, disk, spec, dax)
    )


def setup(cfg_path):
    """LMCache's config, metadata, backends and the chunks with their keys."""
    import torch
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend import CreateStorageBackends
    from lmcache.v1.token_database import ChunkedTokenDatabase

    full, tokens = kv_tensors()
    _, layers, t, hidden = full.shape
    config = LMCacheEngineConfig.from_file(cfg_path)
    metadata = LMCacheMetadata(model_name="SmolLM2-135M-Instruct", world_size=1, local_world_size=1,
                               worker_id=0, local_worker_id=0, kv_dtype=torch.float16,
                               kv_shape=(2, layers, CH, 3, hidden // 3))
    # LMCache runs its event loop on a thread of its own (LocalDisk's writes are tasks on it).
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    backends = CreateStorageBackends(config, metadata, loop, dst_device="cpu")
    db = ChunkedTokenDatabase(config, metadata)
    keys, chunks = [], []
    for v in range(VARIANTS):
        toks = tokens.copy()
        toks[0] = 1000 + v
        keys += [k for (_, _, k) in db.process_tokens(torch.from_numpy(toks))]
        chunks += [np.ascontiguousarray(full[:, :, i * CH : (i + 1) * CH, :]) for i in range(t // CH)]
    return backends, loop, keys, chunks


def names(backends):
    """The backends measured, by the label of their row."""
    out = {}
    for name, b in backends.items():
        cls = type(b).__name__
        label = {"CxlkvStorageBackend": "cxlkv plugin", "LocalCPUBackend": "LocalCPUBackend",
                 "LocalDiskBackend": "LocalDiskBackend", "DaxBackend": "DaxBackend (/dev/shm file)"}.get(cls)
        if label:
            out[label] = b
    return out


def put_all(b, keys, objs):
    done = []
    t = time.perf_counter()
    b.batched_submit_put_task(keys, objs, on_complete_callback=done.append)
    end = time.time() + 60
    while len(done) < len(keys) and not all(b.contains(k) for k in keys):  # noqa: E501
        if time.time() > end:
            raise RuntimeError("%s: puts did not complete in 60 s" % type(b).__name__)
        time.sleep(0.0002)
    return time.perf_counter() - t


def child_main(argv):
    """A second process on the same config: how many of the chunks each backend finds."""
    backends, loop, keys, _ = setup(argv[0])
    out = {}
    for label, b in names(backends).items():
        t = time.perf_counter()
        n = asyncio.run_coroutine_threadsafe(b.batched_async_contains("second", keys), loop).result()
        out[label] = [n, time.perf_counter() - t]
    print("RESULT " + json.dumps(out))
    for b in backends.values():
        try:
            b.close()
        except Exception:
            pass
    os._exit(0)  # LMCache's own threads would keep the process alive


def run(quick=False):
    import torch
    import cxlkv
    from lmcache.v1.memory_management import MemoryFormat

    rows = []
    try:
        import lmcache.v1.storage_backend.maru_backend  # noqa: F401
    except Exception as e:
        rows.append(error_row(ENGINE, "MaruBackend", "all", "import failed: %s: %s (LMCache imports "
                              "`maru` and `maru_lmcache`; neither is on PyPI)" % (type(e).__name__, e)))
    work = tempfile.mkdtemp(prefix="cxlkv-peers-lmcache-")
    spec = "shm:cxlkv-peers-lmcache-%d" % os.getpid()
    dax = "/dev/shm/cxlkv-peers-dax-%d" % os.getpid()
    pool = cxlkv.Pool.create(spec, 512 << 20)  # the default configuration: 8 partitions
    with open(dax, "wb") as f:  # fake DAX: a /dev/shm file of the arena's size
        f.truncate(128 << 20)
    cfg = os.path.join(work, "lmcache.yaml")
    with open(cfg, "w") as f:
        f.write(config_text(spec, os.path.join(work, "disk") + "/", dax))
    reps = 2 if quick else 5
    try:
        backends, loop, keys, chunks = setup(cfg)
        sides = names(backends)
        cpu = backends["LocalCPUBackend"]
        objs = []
        for c in chunks:
            o = cpu.allocate(torch.Size(c.shape), torch.float16, MemoryFormat.KV_2LTD)
            o.tensor.copy_(torch.from_numpy(c))
            objs.append(o)
        nbytes = chunks[0].nbytes
        put = {s: Samples() for s in sides}
        get = {s: Samples() for s in sides}
        has = {s: Samples() for s in sides}
        order = list(sides)
        # Untimed: each backend stores and drops the chunks until it has touched all of its
        # storage once (a fresh 512 MiB pool hands out untouched blocks for about 20 rounds of
        # 24 MiB, and each first touch is a page fault: a cost of a new pool, not of a put).
        for _ in range(0 if quick else WARM_ROUNDS):
            for b in sides.values():
                put_all(b, keys, objs)
                for k in keys:
                    b.remove(k)
        for r in range(reps):
            for s in order[r % len(order) :] + order[: r % len(order)]:
                b = sides[s]
                put[s].add(put_all(b, keys, objs) / len(keys))
                for i in range(20):  # one call is tens of µs: many per round
                    t = time.perf_counter()
                    n = asyncio.run_coroutine_threadsafe(
                        b.batched_async_contains("r%d-%d" % (r, i), keys), loop
                    ).result()
                    has[s].add(time.perf_counter() - t)
                if n != len(keys):
                    raise RuntimeError("%s: batched_async_contains found %d of %d" % (s, n, len(keys)))
                for k, c in zip(keys, chunks):
                    got = get[s].time(b.get_blocking, k)
                    if got is None or got.tensor.numpy().tobytes() != c.tobytes():
                        raise RuntimeError("%s: get_blocking gave wrong bytes" % s)
                    if got is not None and s != "LocalCPUBackend":
                        got.ref_count_down()
                if r < reps - 1:
                    for k in keys:
                        b.remove(k)
        for s in sides:
            rows.append(row(ENGINE, s, "put (per chunk)", nbytes, put[s]))
            rows.append(row(ENGINE, s, "get_blocking", nbytes, get[s]))
            rows.append(row(ENGINE, s, "batched_async_contains (64 keys)", 0, has[s]))
        r = subprocess.run([sys.executable, HERE, "child", cfg], capture_output=True, text=True, timeout=600)
        res = [json.loads(l[7:]) for l in r.stdout.splitlines() if l.startswith("RESULT ")]
        if not res:
            rows.append(error_row(ENGINE, "-", "second process hit", "child failed: %s" % r.stderr[-800:]))
        else:
            for s, (n, secs) in res[0].items():
                smp = Samples()
                smp.add(secs)
                rows.append(row(ENGINE, s, "second process hit", 0, smp,
                                "found %d of %d chunks" % (n, len(keys))))
    finally:
        for b in locals().get("backends", {}).values():
            try:
                b.close()
            except Exception:
                pass
        pool.unlink()
        pool.close()
        shutil.rmtree(work, ignore_errors=True)
        if os.path.exists(dax):
            os.unlink(dax)
    return rows


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "child":
    sys.path.insert(0, os.path.dirname(HERE))
    child_main(sys.argv[2:])
