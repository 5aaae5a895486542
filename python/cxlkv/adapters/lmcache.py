"""LMCache storage plugin on a cxlkv pool: `CxlkvStorageBackend(StoragePluginInterface)`.

LMCache loads it from its own configuration (`storage_plugins` and `extra_config`):

    chunk_size: 256
    local_cpu: true
    max_local_cpu_size: 2          # GB; the plugin restores into LMCache's CPU allocator
    storage_plugins: ["cxlkv"]
    extra_config:
      storage_plugin.cxlkv.module_path: cxlkv.adapters.lmcache
      storage_plugin.cxlkv.class_name: CxlkvStorageBackend
      cxlkv.pool: "shm:kv"          # the pool's spec (Pool.open); it must exist
      cxlkv.namespace: "lmcache"    # optional: separates deployments' keys
      cxlkv.tenant: "acme"          # optional: the pool tenant to attach as, with its secret salt
      cxlkv.tenant_salt_env: "ACME_KV_SALT"   # in this environment variable (or cxlkv.tenant_salt)

Every LMCache chunk (a `MemoryObj`, e.g. a 256-token `KV_2LTD` tensor `[2, layers, tokens,
hidden]`) is two pool objects under keys of its `CacheEngineKey` string (model, world size,
worker, chunk hash, dtype, tags): the tensor's bytes alone, then a small header (magic, format,
dtype, shape, payload length) under the same string with "#head" appended. The header is put
after the payload, so a present header names a payload that was whole when it was put; puts are
synchronous and atomic in the pool (an object is visible only whole, also when it spans several
blocks as a multi-block object). `get_blocking` reads the header, allocates the chunk from
LMCache's own allocator (`local_cpu_backend.allocate(shape, dtype, fmt)`) and copies the payload
straight into it with one `get_into` (one copy, its CRC checked; a payload of another length is a
miss). Putting the header apart is what lets the one copy land in LMCache's memory: with header
and payload in one object, a chunk larger than a block was copied out of the pool and then again
into the chunk. `batched_async_contains` is one `lookup_prefix` over the request's header keys
(LMCache chains its chunk hashes, so the leading present keys are the cached prefix), pinning them
when asked (a pool pin of the payload, or a private copy of a payload larger than a block: pins
hold one block). Any process attached to the pool finds the chunks another process put; with the
cross-pod tier configured (`CXLKV_CROSSPOD_SOCKET`), the lookup also imports the chunks other pods
published (payload and header, each a single block: chunks larger than a block stay pod-local).

Tenants (`cxlkv.adapters._tenant`): with `cxlkv.tenant`, the plugin attaches as that pool tenant
(its quota; it reads only its tenant's and the public chunks), and its keys are salted with the
tenant's secret and a chunk's `cache_salt` tag, if LMCache's key carries one (LMCache's
`lmcache.tag.cache_salt` request config): another tenant or salt forms other keys and misses.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading
from concurrent.futures import Future
from typing import Any, Callable, List, Optional, Sequence

import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface

import cxlkv
from cxlkv.adapters import _tenant

from ._read import read_view
from ._torch import DTYPES as _DTYPES, dtype_name

__all__ = ["CxlkvStorageBackend"]

_MAGIC = b"CXLKVLM1"
_MAX_DIMS = 8
# magic, memory format, dtype name (16 bytes), ndim, dims[8], payload length
_HEAD = struct.Struct("<8sI16sI%dQQ" % _MAX_DIMS)
_KEY_MEMO = 1 << 16


def _dtype_name(dtype: torch.dtype) -> str:
    return dtype_name(dtype, "cxlkv LMCache plugin")


class _Held:
    """A pinned chunk: its header's bytes (`head`) and a pool pin of its payload (`pin`) or, for a
    multi-block payload, a private copy (`copy`)."""

    def __init__(self, head, pin=None, copy=None):
        self.head, self.pin, self.copy = head, pin, copy

    @staticmethod
    def take(me, k, hk) -> Optional["_Held"]:
        head = me.get(hk)
        if head is None:
            return None
        try:
            p = me.pin(k)
        except cxlkv.BadInputError as e:
            if e.code != cxlkv.ERR_PAYLOAD_TOO_LARGE:
                raise
            with read_view(me, k) as view:
                return None if view is None else _Held(head, copy=bytes(view))
        return None if p is None else _Held(head, pin=p)

    def release(self):
        if self.pin is not None:
            self.pin.release()
        self.copy = None


class CxlkvStorageBackend(StoragePluginInterface):
    """An LMCache storage plugin whose chunks live in a cxlkv pool (see the module's doc)."""

    def __init__(
        self,
        config=None,
        metadata=None,
        local_cpu_backend=None,
        loop: Optional[asyncio.AbstractEventLoop] = None,
        dst_device: str = "cpu",
    ):
        super().__init__(
            dst_device=dst_device,
            config=config,
            metadata=metadata,
            local_cpu_backend=local_cpu_backend,
            loop=loop,
        )
        extra = (config.extra_config if config is not None else None) or {}
        spec = extra.get("cxlkv.pool")
        if not spec:
            raise ValueError(
                "cxlkv LMCache plugin: set extra_config['cxlkv.pool'] to the pool's spec (e.g. shm:kv)"
            )
        if local_cpu_backend is None:
            raise ValueError(
                "cxlkv LMCache plugin: restores go into LMCache's CPU allocator; "
                "turn on the local CPU backend (local_cpu / max_local_cpu_size > 0)"
            )
        self.namespace = str(extra.get("cxlkv.namespace", "lmcache"))
        self.pool = cxlkv.Pool.open(str(spec))
        tenant, self._tenant_salt = _tenant.tenant_of(
            {k[len("cxlkv.") :]: v for k, v in extra.items() if k.startswith("cxlkv.tenant")}
        )
        self.me = _tenant.attach(self.pool, tenant, self._tenant_salt)
        self._pins = {}
        self._request_pins = {}
        self._key_memo = {}
        self._lock = threading.Lock()

    def __str__(self) -> str:
        return "CxlkvStorageBackend"

    # --- keys and records ---------------------------------------------------------------------

    def _keys(self, key: CacheEngineKey):
        """(payload key, header key) of a chunk. LMCache asks for the same chunks again and again
        (lookup, then get; every request of a shared prefix), and the key's string costs more than
        the pool's lookup, so the pairs of recent chunks are kept (at most _KEY_MEMO of them)."""
        pair = self._key_memo.get(key)
        if pair is None:
            s = "%s/%s" % (self.namespace, key.to_string())
            request_salt = dict(key.tags or ()).get("cache_salt")
            salt = _tenant.key_salt(
                self._tenant_salt, None if request_salt is None else str(request_salt)
            )
            pair = (
                cxlkv.Key.from_bytes(s.encode(), salt=salt),
                cxlkv.Key.from_bytes((s + "#head").encode(), salt=salt),
            )
            if len(self._key_memo) >= _KEY_MEMO:
                self._key_memo.clear()
            self._key_memo[key] = pair
        return pair

    def _key(self, key: CacheEngineKey) -> "cxlkv.Key":
        """The key of the chunk's payload."""
        return self._keys(key)[0]

    def _head_key(self, key: CacheEngineKey) -> "cxlkv.Key":
        """The key of the chunk's header, put after the payload: the chunk is present when it is."""
        return self._keys(key)[1]

    @staticmethod
    def _encode(obj: MemoryObj):
        """(header bytes, a view of the payload) of `obj`."""
        shape = tuple(obj.get_shape())
        if len(shape) > _MAX_DIMS:
            raise ValueError("cxlkv LMCache plugin: %d dims (at most %d)" % (len(shape), _MAX_DIMS))
        payload = memoryview(obj.byte_array).cast("B")
        head = _HEAD.pack(
            _MAGIC,
            obj.get_memory_format().value,
            _dtype_name(obj.get_dtype()).encode(),
            len(shape),
            *(list(shape) + [0] * (_MAX_DIMS - len(shape))),
            len(payload),
        )
        return head, payload

    @staticmethod
    def _decode_head(buf):
        if buf is None or len(buf) != _HEAD.size:
            return None
        fields = _HEAD.unpack_from(buf, 0)
        magic, fmt, dname, ndim = fields[:4]
        dims, length = fields[4 : 4 + _MAX_DIMS], fields[-1]
        dname = dname.rstrip(b"\0").decode(errors="replace")
        if magic != _MAGIC or ndim > _MAX_DIMS or dname not in _DTYPES:
            return None
        shape = torch.Size(dims[:ndim])
        dtype = _DTYPES[dname]
        if shape.numel() * dtype.itemsize != length:
            return None
        return MemoryFormat(fmt), dtype, shape, length

    # --- StorageBackendInterface --------------------------------------------------------------

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        if pin:
            return self.pin(key)
        return self.me.contains(self._head_key(key))

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return False  # puts are synchronous: none is ever in flight

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: List[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Optional[Callable[[CacheEngineKey], None]] = None,
    ) -> None:
        for key, obj in zip(keys, objs, strict=True):
            head, payload = self._encode(obj)
            self.me.put(self._key(key), payload)  # from LMCache's memory, no copy before the pool's
            del payload
            self.me.put(self._head_key(key), head)
            if on_complete_callback is not None:
                try:
                    on_complete_callback(key)
                except Exception:  # the interface: callback errors are not the put's
                    pass
        return None

    async def async_batched_submit_put_task(
        self, keys, objs, transfer_spec=None, on_complete_callback=None
    ):
        self.batched_submit_put_task(keys, objs, transfer_spec, on_complete_callback)

    def _restore(self, head, fill) -> Optional[MemoryObj]:
        """A chunk allocated from LMCache's allocator for the header `head`, its payload written by
        `fill(dst)` (which returns the bytes written, or None for a miss)."""
        head = self._decode_head(head)
        if head is None:
            return None
        fmt, dtype, shape, length = head
        obj = self.local_cpu_backend.allocate(shape, dtype, fmt)
        if obj is None:
            return None
        dst = memoryview(obj.byte_array).cast("B")[:length]
        try:
            got = fill(dst)
        except cxlkv.BadInputError:
            got = None  # the payload is larger than its header says (replaced): a miss
        finally:
            dst.release()
        if got != length:
            obj.ref_count_down()
            return None
        return obj

    def get_blocking(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        k = self._key(key)
        with self._lock:
            ent = self._pins.get(k)
            head, copy = (ent[0].head, ent[0].copy) if ent is not None else (None, None)
        if copy is not None:  # a pinned multi-block payload: this process's copy

            def fill(dst):
                if len(copy) != len(dst):
                    return None
                dst[:] = copy
                return len(dst)

            return self._restore(head, fill)
        # A pool pin of the payload (if any) keeps its block; read it once, straight into the chunk.
        if head is None:
            head = self.me.get(self._head_key(key))
        return self._restore(head, lambda dst: self.me.get_into(k, dst))

    def get_non_blocking(
        self, key: CacheEngineKey, location: Optional[str] = None
    ) -> Optional[Future]:
        f: Future = Future()
        f.set_result(self.get_blocking(key))
        return f

    def batched_get_blocking(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        return [self.get_blocking(k) for k in keys]

    async def batched_get_non_blocking(
        self, lookup_id: str, keys: list, transfer_spec: Any = None
    ) -> list:
        out = []
        for k in keys:
            obj = self.get_blocking(k)
            if obj is None:
                break
            out.append(obj)
        with self._lock:
            for k in self._request_pins.pop(lookup_id, []):
                self._unpin_locked(k)
        return out

    def _found(self, keys: List[CacheEngineKey]) -> int:
        """How many leading chunks of `keys` the pool holds: one `lookup_prefix` over their header
        keys. With a cross-pod bridge (`CXLKV_CROSSPOD_SOCKET`, docs/CROSSPOD.md), over each
        chunk's payload key then its header key instead: the lookup imports what the pod lacks
        from the store, and a chain of headers alone would bring headers whose payloads stayed in
        the other pod."""
        if os.environ.get("CXLKV_CROSSPOD_SOCKET"):
            return self.me.lookup_prefix([x for k in keys for x in self._keys(k)]) // 2
        return self.me.lookup_prefix([self._head_key(k) for k in keys])

    async def batched_async_contains(
        self, lookup_id: str, keys: List[CacheEngineKey], pin: bool = False
    ) -> int:
        n = self._found(keys)
        if pin:
            pinned = []
            for k in keys[:n]:
                if not self.pin(k):
                    break
                pinned.append(k)
            n = len(pinned)
            with self._lock:
                self._request_pins.setdefault(lookup_id, []).extend(pinned)
        return n

    def batched_contains(self, keys: List[CacheEngineKey], pin: bool = False) -> int:
        if pin:
            return super().batched_contains(keys, pin)
        return self._found(keys)

    def pin(self, key: CacheEngineKey) -> bool:
        """Keeps the chunk for this process until `unpin`: its header and a pool pin of its
        payload's block, or, for a payload larger than a block (pins hold one block), a private
        copy taken now."""
        k = self._key(key)
        with self._lock:
            if k in self._pins:
                self._pins[k][1] += 1
                return True
        held = _Held.take(self.me, k, self._head_key(key))
        if held is None:
            return False
        with self._lock:
            if k in self._pins:
                self._pins[k][1] += 1
                held.release()
            else:
                self._pins[k] = [held, 1]
        return True

    def _unpin_locked(self, key: CacheEngineKey) -> bool:
        k = self._key(key)
        ent = self._pins.get(k)
        if ent is None:
            return False
        ent[1] -= 1
        if ent[1] == 0:
            del self._pins[k]
            ent[0].release()
        return True

    def unpin(self, key: CacheEngineKey) -> bool:
        with self._lock:
            return self._unpin_locked(key)

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        k = self._key(key)
        with self._lock:
            ent = self._pins.pop(k, None)
        if ent is not None:
            ent[0].release()
        try:
            had = self.me.delete(self._head_key(key))
            return self.me.delete(k) or had
        except cxlkv.NotOwnerError:
            return False  # another participant's chunk: only its owner removes it

    def touch_cache(self) -> None:
        pass  # the pool keeps its own LRU order on gets and pins

    def get_allocator_backend(self):
        return self.local_cpu_backend

    def close(self) -> None:
        with self._lock:
            pins, self._pins = list(self._pins.values()), {}
            self._request_pins.clear()
        for p, _ in pins:
            p.release()
        self.me.detach()
        self.pool.close()
