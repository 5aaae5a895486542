"""The LMCache adapter (`cxlkv.adapters.lmcache.CxlkvStorageBackend`) against the real LMCache
package, each side in a fresh process:

- process 1 builds LMCache's config from a YAML file (`LMCacheEngineConfig.from_file`) naming the
  plugin under `storage_plugins` / `storage_plugin.cxlkv.module_path` / `class_name`; LMCache's
  own `CreateStorageBackends` loads it. The chunks are real SmolLM2-135M K/V (`data/kv/`: layers 4
  and 17 over 2,048 tokens of a real text) as 256-token `KV_2LTD` memory objects
  (`[2, layers, tokens, kv_heads * head_dim]`, float16) allocated from LMCache's own CPU
  allocator, keyed by LMCache's own `ChunkedTokenDatabase` over the text's tokens; it puts them
  with `batched_submit_put_task`;
- process 2 loads the plugin the same way, finds all 8 chunks with one `batched_async_contains`
  (and 3 for a request that shares only the first 3 chunks, 0 for a foreign one), gets each with
  `get_blocking` into LMCache's allocator, and checks its bytes against the same chunk cut from
  `data/kv/` in that process.

Skipped, saying so, where LMCache (and torch) is not installed.
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed (LMCache needs it)")
pytest.importorskip("lmcache", reason="lmcache is not installed")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KV_DIR = os.path.join(ROOT, "data", "kv", "smollm2_devil_2048")
CHUNK = 256


def run(code, spec, tmp_path):
    cfg = tmp_path / "lmcache.yaml"
    cfg.write_text(
        "chunk_size: %d\n"
        "local_cpu: true\n"
        "max_local_cpu_size: 0.5\n"
        'storage_plugins: ["cxlkv"]\n'
        "extra_config:\n"
        "  storage_plugin.cxlkv.module_path: cxlkv.adapters.lmcache\n"
        "  storage_plugin.cxlkv.class_name: CxlkvStorageBackend\n"
        '  cxlkv.pool: "%s"\n' % (CHUNK, spec)
    )
    env = dict(os.environ, PYTHONHASHSEED="0", CXLKV_TEST_CFG=str(cfg), CXLKV_TEST_KV=KV_DIR)
    r = subprocess.run(
        [sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, timeout=300, env=env
    )
    assert r.returncode == 0, "child failed:\n%s\n%s" % (r.stdout, r.stderr[-6000:])
    return r.stdout


# Shared by both processes: LMCache's config, metadata, storage backends and token database, and
# the real K/V chunks.
PRELUDE = r"""
import asyncio, hashlib, json, os
import numpy as np, torch
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.storage_backend import CreateStorageBackends
from lmcache.v1.token_database import ChunkedTokenDatabase
from cxlkv.adapters.lmcache import CxlkvStorageBackend

kv = os.environ["CXLKV_TEST_KV"]
tokens = np.load(os.path.join(kv, "tokens.npy")).astype(np.int64)
layers = [np.load(os.path.join(kv, "layer%s_%s.npy" % (l, w))) for l in ("04", "17") for w in ("k", "v")]
kvh, T, hd = layers[0].shape
def td(a):  # [kv_heads, tokens, head_dim] -> [tokens, kv_heads * head_dim]
    return np.ascontiguousarray(a.transpose(1, 0, 2).reshape(T, kvh * hd))
K = np.stack([td(layers[0]), td(layers[2])])  # [layers, tokens, hidden]
V = np.stack([td(layers[1]), td(layers[3])])
full = np.stack([K, V])                        # KV_2LTD: [2, layers, tokens, hidden]
CH = @CHUNK@

config = LMCacheEngineConfig.from_file(os.environ["CXLKV_TEST_CFG"])
metadata = LMCacheMetadata(model_name="SmolLM2-135M-Instruct", world_size=1, local_world_size=1,
                           worker_id=0, local_worker_id=0, kv_dtype=torch.float16,
                           kv_shape=(2, 2, CH, kvh, hd))
loop = asyncio.new_event_loop()
backends = CreateStorageBackends(config, metadata, loop, dst_device="cpu")
plugin = backends["cxlkv"]
assert isinstance(plugin, CxlkvStorageBackend), backends
db = ChunkedTokenDatabase(config, metadata)
keys = [k for (_, _, k) in db.process_tokens(torch.from_numpy(tokens))]
def chunk(i):
    return np.ascontiguousarray(full[:, :, i * CH:(i + 1) * CH, :])
""".replace("@CHUNK@", str(CHUNK))


def test_plugin_loaded_from_config_round_trips_real_kv_across_processes(tmp_path):
    import cxlkv

    spec = "shm:cxlkv-lmcache-%d" % os.getpid()
    # 256 KiB blocks: each 384 KiB chunk is a multi-block object.
    cxlkv.Pool.create(spec, 256 << 20, block_size=256 << 10, participants=4).close()
    try:
        out = run(
            r"""
assert len(keys) == T // CH == 8, len(keys)
objs = []
for i in range(len(keys)):
    c = chunk(i)
    obj = plugin.local_cpu_backend.allocate(torch.Size(c.shape), torch.float16, MemoryFormat.KV_2LTD)
    obj.tensor.copy_(torch.from_numpy(c))
    objs.append(obj)
done = []
plugin.batched_submit_put_task(keys, objs, on_complete_callback=done.append)
assert done == keys
print("PUT", len(keys), "chunks of", objs[0].get_shape(), objs[0].get_dtype(), objs[0].get_memory_format())
""",
            spec,
            tmp_path,
        )
        assert "PUT 8 chunks" in out, out
        print(out)
        out = run(
            r"""
assert all(plugin.me.length(plugin._key(k)) > plugin.pool.block_size for k in keys)  # multi-block objects
n = loop.run_until_complete(plugin.batched_async_contains("req-1", keys))
assert n == 8, n
other = tokens.copy(); other[3 * CH + 5] += 1       # the same first 3 chunks, then different
okeys = [k for (_, _, k) in db.process_tokens(torch.from_numpy(other))]
n3 = loop.run_until_complete(plugin.batched_async_contains("req-2", okeys))
assert n3 == 3, n3
foreign = [k for (_, _, k) in db.process_tokens(torch.from_numpy(tokens[::-1].copy()))]
assert loop.run_until_complete(plugin.batched_async_contains("req-3", foreign)) == 0
for i, k in enumerate(keys):
    obj = plugin.get_blocking(k)
    assert obj is not None, i
    assert obj.get_memory_format() == MemoryFormat.KV_2LTD and obj.get_dtype() == torch.float16
    assert tuple(obj.get_shape()) == (2, 2, CH, kvh * hd), obj.get_shape()
    got = obj.tensor.numpy()
    assert got.tobytes() == chunk(i).tobytes(), "chunk %d differs" % i
    obj.ref_count_down()
# pinned lookups hold the chunks until the request's get
assert loop.run_until_complete(plugin.batched_async_contains("req-4", keys[:2], pin=True)) == 2
got = loop.run_until_complete(plugin.batched_get_non_blocking("req-4", keys[:2]))
assert [g.tensor.numpy().tobytes() for g in got] == [chunk(0).tobytes(), chunk(1).tobytes()]
assert plugin.get_blocking(okeys[3]) is None
print("GOT 8 chunks byte-exact; contains 8/3/0")
plugin.close()
""",
            spec,
            tmp_path,
        )
        assert "GOT 8 chunks byte-exact" in out, out
        print(out)
    finally:
        cxlkv.unlink(spec)
