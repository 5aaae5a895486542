"""The SGLang adapter (`cxlkv.adapters.sglang.CxlkvHiCacheStorage`) against the real SGLang
package, each side in a fresh process:

- process 1 creates the backend through SGLang's own `StorageBackendFactory.create_backend`
  with backend "dynamic" and the extra config `backend_name` / `module_path` / `class_name` /
  `pool` (what `--hicache-storage-backend dynamic --hicache-storage-backend-extra-config` gives);
  the pages are real SmolLM2-135M K/V (`data/kv/`: layers 4 and 17 over 2,048 tokens of a real
  text) in 64-token pages (flat float16 tensors, as HiCache's host pool hands them over), keyed
  by SGLang's own page hashes (`sglang.srt.mem_cache.utils.get_hash_str`, a chain over the
  prefix); it stores them with `batch_set`;
- process 2 creates the backend the same way, finds all 32 pages with one `batch_exists` (5 for
  tokens that differ from page 5 on, 0 for foreign ones), reads them with `batch_get` into its
  own tensors and with `get`, and checks their bytes against the pages cut from `data/kv/` there.

Skipped, saying so, where SGLang (and torch) is not installed.
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed (SGLang needs it)")
pytest.importorskip(
    "sglang.srt.mem_cache.hicache_storage",
    reason="sglang's HiCache storage module does not import here",
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KV_DIR = os.path.join(ROOT, "data", "kv", "smollm2_devil_2048")
PAGE = 64

PRELUDE = r"""
import os
import numpy as np, torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_hash_str
from cxlkv.adapters.sglang import CxlkvHiCacheStorage

kv = os.environ["CXLKV_TEST_KV"]
P = int(os.environ["CXLKV_TEST_PAGE"])
tokens = [int(t) for t in np.load(os.path.join(kv, "tokens.npy"))]
layers = [np.load(os.path.join(kv, "layer%s_%s.npy" % (l, w))) for l in ("04", "17") for w in ("k", "v")]
kvh, T, hd = layers[0].shape
def td(a):
    return a.transpose(1, 0, 2).reshape(T, kvh * hd)
full = np.stack([np.stack([td(layers[0]), td(layers[2])]), np.stack([td(layers[1]), td(layers[3])])])
def page(i):  # [2, layers, P, hidden] of page i, flat, as the host pool hands a page over
    return torch.from_numpy(np.ascontiguousarray(full[:, :, i * P:(i + 1) * P, :]).reshape(-1))

config = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
    attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
    model_name="SmolLM2-135M-Instruct",
    extra_config={"backend_name": "cxlkv", "module_path": "cxlkv.adapters.sglang",
                  "class_name": "CxlkvHiCacheStorage", "pool": os.environ["CXLKV_TEST_SPEC"]})
store = StorageBackendFactory.create_backend("dynamic", config, None)
assert isinstance(store, CxlkvHiCacheStorage), type(store)
keys = get_hash_str(tokens, None, P)
"""


def run(code, spec):
    bindir = os.path.dirname(sys.executable)  # ninja for SGLang's page-hash extension
    env = dict(
        os.environ,
        CXLKV_TEST_KV=KV_DIR,
        CXLKV_TEST_PAGE=str(PAGE),
        CXLKV_TEST_SPEC=spec,
        PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
    )
    r = subprocess.run(
        [sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, timeout=300, env=env
    )
    assert r.returncode == 0, "child failed:\n%s\n%s" % (r.stdout, r.stderr[-6000:])
    return r.stdout


def test_dynamic_backend_round_trips_real_kv_pages_across_processes():
    import cxlkv

    spec = "shm:cxlkv-sglang-%d" % os.getpid()
    cxlkv.Pool.create(spec, 128 << 20, block_size=256 << 10, participants=4).close()
    try:
        out = run(
            r"""
assert len(keys) == T // P == 32, len(keys)
assert store.batch_exists(keys) == 0
assert store.batch_set(keys, [page(i) for i in range(len(keys))]) is True
print("SET", len(keys), "pages of", page(0).numel(), page(0).dtype)
""",
            spec,
        )
        assert "SET 32 pages" in out, out
        print(out)
        out = run(
            r"""
assert store.batch_exists(keys) == 32
other = list(tokens); other[5 * P + 3] += 1
assert store.batch_exists(get_hash_str(other, None, P)) == 5
assert store.batch_exists(get_hash_str(tokens[::-1], None, P)) == 0
assert store.exists(keys[31]) and not store.exists(get_hash_str(other, None, P)[5])
targets = [torch.empty(page(0).numel(), dtype=torch.float16) for _ in keys]
got = store.batch_get(keys, targets)
for i, (g, t) in enumerate(zip(got, targets)):
    assert g is t, i                                 # read into the caller's tensor
    assert g.numpy().tobytes() == page(i).numpy().tobytes(), "page %d differs" % i
g = store.get(keys[7])
assert g.dtype == torch.float16 and g.numpy().tobytes() == page(7).numpy().tobytes()
assert store.get(get_hash_str(other, None, P)[5]) is None
print("GOT 32 pages byte-exact; exists 32/5/0")
store.close()
""",
            spec,
        )
        assert "GOT 32 pages byte-exact" in out, out
        print(out)
    finally:
        cxlkv.unlink(spec)
