"""cxlkv: a shared KV pool on CXL memory (or what emulates it) and its near-data device.

    import numpy as np, cxlkv
    with cxlkv.Pool.create("shm:kv", 1 << 30) as pool, pool.attach() as me:
        me.put("req-1/chunk-0", np.arange(1024, dtype=np.float16))
        out = np.empty(1024, np.float16)
        me.get_into("req-1/chunk-0", out)            # zero copy into the caller's array
        with me.pin("req-1/chunk-0") as pin:         # zero-copy view of pool memory
            view = np.frombuffer(pin, np.float16)
            ...
            del view                                 # release views before the pin

Keys are `Key` objects, ints below 2**128, or str/bytes names (hashed). Buffers are any
buffer-protocol object (numpy arrays, bytearray, memoryview...) or a DLPack tensor (a CPU torch
tensor). Errors are `cxlkv.Error` subclasses with `.code` and `.message`. The GIL is released while
data is copied and while the device computes; every class may be used from many threads.
"""

from ._cxlkv import (  # noqa: F401
    BadInputError,
    BadPoolError,
    ClosedError,
    Device,
    Error,
    FencedError,
    FullError,
    IoError,
    Key,
    KvBlock,
    NotFoundError,
    NotOwnerError,
    Participant,
    Pin,
    Pool,
    Reservation,
    ReservationBatch,
    UnavailableError,
    __version__,
    crc32c,
    key_chain,
    metrics,
    metrics_text,
    unlink,
)
from . import _cxlkv

# Result codes (the C ABI's numbers): cxlkv.ERR_NOT_FOUND == 4, ...
globals().update({n: getattr(_cxlkv, n) for n in dir(_cxlkv) if n.startswith("ERR_")})

__all__ = [
    "BadInputError",
    "BadPoolError",
    "ClosedError",
    "CxlkvBackend",
    "Device",
    "Error",
    "FencedError",
    "FullError",
    "IoError",
    "Key",
    "crc32c",
    "KvBlock",
    "NotFoundError",
    "NotOwnerError",
    "Participant",
    "Pin",
    "Pool",
    "Reservation",
    "ReservationBatch",
    "UnavailableError",
    "key_chain",
    "unlink",
]


class CxlkvBackend:
    """A small key-value view of a pool for engine glue code: contains, put, get_blocking,
    get_into, pin/unpin, pinned_view, remove, close. Keys are strings or bytes (an engine's
    cache-key text) or `Key`s; values are any buffer.

    This is not an engine's interface. The engine adapters, each loaded by its engine's own
    mechanism and tested against the engine's own classes, are in `cxlkv.adapters`:
    `cxlkv.adapters.llama_cpp.CxlkvLlamaCache` (llama-cpp-python's `BaseLlamaCache`),
    `cxlkv.adapters.lmcache.CxlkvStorageBackend` (LMCache's `StoragePluginInterface`) and
    `cxlkv.adapters.sglang.CxlkvHiCacheStorage` (SGLang's `HiCacheStorage`)."""

    def __init__(self, pool):
        self.pool = pool
        self.me = pool.attach()
        self._pins = {}

    def contains(self, key, pin=False):
        found = self.me.contains(key)
        if found and pin:
            return self.pin(key)
        return found

    def put(self, key, value):
        self.me.put(key, value)

    submit_put_task = put

    def get_blocking(self, key):
        """The block's bytes, or None."""
        return self.me.get(key)

    def get_into(self, key, out):
        """Zero-copy get into `out`; the length, or None."""
        return self.me.get_into(key, out)

    def pin(self, key):
        """Pins the block (kept in place until unpin); False if absent."""
        k = Key(key)
        if k in self._pins:
            return True
        p = self.me.pin(k)
        if p is None:
            return False
        self._pins[k] = p
        return True

    def unpin(self, key):
        p = self._pins.pop(Key(key), None)
        if p is None:
            return False
        p.release()
        return True

    def pinned_view(self, key):
        """A zero-copy read-only memoryview of a pinned block (release it before unpin)."""
        return memoryview(self._pins[Key(key)])

    def remove(self, key):
        self.unpin(key)
        return self.me.delete(key)

    def close(self):
        for p in self._pins.values():
            p.release()
        self._pins.clear()
        self.me.detach()
