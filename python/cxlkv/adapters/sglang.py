"""SGLang HiCache storage on a cxlkv pool: `CxlkvHiCacheStorage(HiCacheStorage)`.

SGLang loads it with its `dynamic` storage backend:

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "cxlkv",
            "module_path": "cxlkv.adapters.sglang", "class_name": "CxlkvHiCacheStorage",
            "pool": "shm:kv"}'

(`StorageBackendFactory` imports `module_path`, checks the class is a `HiCacheStorage` and calls
`CxlkvHiCacheStorage(storage_config, kwargs)`.) Optional extra-config fields: `namespace`
(separates deployments' keys; default "sglang"); `tenant` with `tenant_salt_env` (the name of an
environment variable holding the tenant's secret salt) or `tenant_salt`: the pool tenant to attach
as (its quota; it reads only its tenant's and the public pages), whose salt keys every page
(`cxlkv.adapters._tenant`; SGLang folds a request's `cache_salt` into its page hashes).

Each HiCache page (a flat tensor, the key a page hash SGLang chains over the prefix) is two pool
objects under keys of (namespace, model, TP rank, page hash): the tensor's bytes, then a small
header (magic, dtype, element count, length) under the same key with "#head" appended, put after
the payload, so a present header names a whole page. Sets are atomic in the pool (an object is
visible only whole); `get` reads the header and copies the payload with one `get_into` straight
into the caller's `target_location` tensor (or a new one): one copy, its CRC checked, also for a
page larger than a block, which with header and payload in one object was copied out of the pool
and then again. `batch_exists` is one `lookup_prefix` over the header keys (the number of leading
pages present), so a second process finds what the first one set.
"""

from __future__ import annotations

import struct
from typing import Any, List, Optional

import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

import cxlkv
from cxlkv.adapters import _tenant

from ._torch import DTYPES as _DTYPES, dtype_name

__all__ = ["CxlkvHiCacheStorage"]

_MAGIC = b"CXLKVSG1"
# magic, dtype name (16 bytes), element count, payload length
_HEAD = struct.Struct("<8s16sQQ")


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor (any dtype), without a copy."""
    t = t.detach()
    if t.device.type != "cpu":
        raise ValueError(
            "cxlkv HiCache storage: pages must be CPU tensors (host pool), not %s" % t.device
        )
    return memoryview(t.contiguous().view(-1).view(torch.uint8).numpy()).cast("B")


class CxlkvHiCacheStorage(HiCacheStorage):
    """A HiCache storage backend whose pages live in a cxlkv pool (see the module's doc)."""

    def __init__(
        self, storage_config: Optional[HiCacheStorageConfig] = None, kwargs: Optional[dict] = None
    ):
        extra = (getattr(storage_config, "extra_config", None) or {}) if storage_config else {}
        spec = extra.get("pool")
        if not spec:
            raise ValueError(
                "cxlkv HiCache storage: set the extra config's \"pool\" to the pool's spec (e.g. shm:kv)"
            )
        model = (
            (getattr(storage_config, "model_name", None) or "model") if storage_config else "model"
        )
        rank = getattr(storage_config, "tp_rank", 0) if storage_config else 0
        size = getattr(storage_config, "tp_size", 1) if storage_config else 1
        self.prefix = "%s/%s/tp%d-of-%d/" % (extra.get("namespace", "sglang"), model, rank, size)
        self.pool = cxlkv.Pool.open(str(spec))
        tenant, tenant_salt = _tenant.tenant_of(extra)
        self._salt = _tenant.key_salt(tenant_salt, None)
        self.me = _tenant.attach(self.pool, tenant, tenant_salt)

    def _key(self, key: str) -> "cxlkv.Key":
        """The key of the page's payload."""
        return cxlkv.Key.from_bytes((self.prefix + str(key)).encode(), salt=self._salt)

    def _head_key(self, key: str) -> "cxlkv.Key":
        """The key of the page's header, put after the payload: the page is present when it is."""
        return cxlkv.Key.from_bytes((self.prefix + str(key) + "#head").encode(), salt=self._salt)

    # --- single pages -------------------------------------------------------------------------

    def set(
        self,
        key: str,
        value: Optional[Any] = None,
        target_location: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        if value is None:
            return False
        payload = _bytes_of(value)
        head = _HEAD.pack(
            _MAGIC,
            dtype_name(value.dtype, "cxlkv HiCache storage").encode(),
            value.numel(),
            len(payload),
        )
        self.me.put(self._key(key), payload)  # from the caller's tensor, no copy before the pool's
        self.me.put(self._head_key(key), head)
        return True

    def get(
        self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None
    ) -> Optional[torch.Tensor]:
        head = self.me.get(self._head_key(key))
        if head is None or len(head) != _HEAD.size:
            return None
        magic, dname, numel, length = _HEAD.unpack(head)
        dname = dname.rstrip(b"\0").decode(errors="replace")
        if magic != _MAGIC or dname not in _DTYPES:
            return None
        dtype = _DTYPES[dname]
        if numel * dtype.itemsize != length:
            return None
        out = target_location
        if out is None:
            out = torch.empty(numel, dtype=dtype)
        elif out.dtype != dtype or out.numel() != numel or not out.is_contiguous():
            return None
        dst = _bytes_of(out)
        try:
            got = self.me.get_into(self._key(key), dst)
        except cxlkv.BadInputError:
            got = None  # the payload is larger than its header says (replaced): a miss
        finally:
            dst.release()
        return out if got == length else None

    def exists(self, key: str) -> bool:
        return self.me.contains(self._head_key(key))

    # --- batches ------------------------------------------------------------------------------

    def batch_get(
        self,
        keys: List[str],
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> List[Optional[torch.Tensor]]:
        targets = target_locations if target_locations is not None else [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, targets)]

    def batch_set(
        self,
        keys: List[str],
        values: Optional[Any] = None,
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        if values is None or len(values) != len(keys):
            return False
        return all(self.set(k, v) for k, v in zip(keys, values))

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        return self.me.lookup_prefix([self._head_key(k) for k in keys])

    def close(self) -> None:
        self.me.detach()
        self.pool.close()
