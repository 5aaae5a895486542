"""cxlkv: Python binding of libcxlkv (ctypes), and an LMCache-shaped storage backend.

    from cxlkv import Pool, CxlkvBackend
    pool = Pool.create("shm:mypool", 1 << 30, block_size=256 << 10, participants=8)
    backend = CxlkvBackend(pool)            # attaches a participant
    backend.put("req-1/layer-0/chunk-0", kv_bytes)
    if backend.contains("req-1/layer-0/chunk-0"):
        data = backend.get_blocking("req-1/layer-0/chunk-0")

The library is found through $CXLKV_LIB, else next to this file's repository build
(target/release, then target/debug), else the system loader path.
"""

import ctypes
import os
from ctypes import POINTER, byref, c_char_p, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p

__all__ = ["CxlkvError", "Key", "Pool", "Participant", "Pinned", "CxlkvBackend", "key_chain", "load_library"]

OK, ERR_NOT_FOUND, ERR_BUFFER_TOO_SMALL = 0, 4, 5


class Key(ctypes.Structure):
    """A 128-bit block key."""

    _fields_ = [("lo", c_uint64), ("hi", c_uint64)]

    def __eq__(self, other):
        return isinstance(other, Key) and (self.lo, self.hi) == (other.lo, other.hi)

    def __hash__(self):
        return hash((self.lo, self.hi))

    def __repr__(self):
        return "Key(%032x)" % ((self.hi << 64) | self.lo)


class PoolConfig(ctypes.Structure):
    _fields_ = [("block_size", c_uint64), ("participants", c_uint32), ("lease_ms", c_uint32)]


class PoolInfo(ctypes.Structure):
    _fields_ = [
        ("pool_size", c_uint64),
        ("block_size", c_uint64),
        ("participants", c_uint32),
        ("partitions", c_uint32),
        ("blocks_per_partition", c_uint32),
        ("version_major", ctypes.c_uint16),
        ("version_minor", ctypes.c_uint16),
    ]


class Stats(ctypes.Structure):
    _fields_ = [(n, c_uint64) for n in ("puts", "hits", "misses", "retries", "evictions", "deletes", "pins")]


class CxlkvError(Exception):
    """A libcxlkv call failed: `code` is the cxlkv_result number, `message` the detail."""

    def __init__(self, code, message):
        super().__init__("cxlkv error %d: %s" % (code, message))
        self.code = code
        self.message = message


def load_library(path=None):
    """Loads libcxlkv and declares its functions."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    candidates = [path, os.environ.get("CXLKV_LIB")]
    for profile in ("release", "debug"):
        candidates.append(os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target")), profile, "libcxlkv.so"))
    candidates.append("libcxlkv.so")
    errors = []
    for c in candidates:
        if not c:
            continue
        if os.sep in c and not os.path.exists(c):
            continue
        try:
            lib = ctypes.CDLL(c)
            break
        except OSError as e:
            errors.append(str(e))
    else:
        raise OSError("libcxlkv.so not found (build it with `cargo build -p cxlkv-ffi` or set CXLKV_LIB): %s" % errors)
    H = c_void_p
    sigs = {
        "cxlkv_version": ([], c_char_p),
        "cxlkv_abi_version": ([], c_uint32),
        "cxlkv_last_error_message": ([c_char_p, c_size_t], c_size_t),
        "cxlkv_pool_config_default": ([], PoolConfig),
        "cxlkv_pool_create": ([c_char_p, c_uint64, POINTER(PoolConfig), POINTER(H)], c_uint32),
        "cxlkv_pool_open": ([c_char_p, POINTER(H)], c_uint32),
        "cxlkv_pool_close": ([H], c_uint32),
        "cxlkv_pool_unlink": ([c_char_p], c_uint32),
        "cxlkv_pool_describe": ([H, POINTER(PoolInfo)], c_uint32),
        "cxlkv_pool_lookup_prefix": ([H, POINTER(Key), c_size_t, POINTER(c_size_t)], c_uint32),
        "cxlkv_key_chain": ([c_char_p, c_char_p, c_uint32, c_uint32, POINTER(c_uint32), c_size_t, c_size_t, POINTER(Key), c_size_t, POINTER(c_size_t)], c_uint32),
        "cxlkv_key_from_bytes": ([c_char_p, c_size_t, POINTER(Key)], c_uint32),
        "cxlkv_participant_attach": ([H, POINTER(H)], c_uint32),
        "cxlkv_participant_detach": ([H], c_uint32),
        "cxlkv_participant_id": ([H, POINTER(c_uint32), POINTER(c_uint32)], c_uint32),
        "cxlkv_participant_put": ([H, POINTER(Key), c_char_p, c_size_t], c_uint32),
        "cxlkv_participant_get": ([H, POINTER(Key), c_void_p, c_size_t, POINTER(c_size_t)], c_uint32),
        "cxlkv_participant_delete": ([H, POINTER(Key)], c_uint32),
        "cxlkv_participant_stats": ([H, POINTER(Stats)], c_uint32),
        "cxlkv_participant_pin": ([H, POINTER(Key), POINTER(H), POINTER(POINTER(c_uint8)), POINTER(c_size_t)], c_uint32),
        "cxlkv_pinned_release": ([H], c_uint32),
    }
    for name, (args, res) in sigs.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = res
    return lib


_lib = None


def _L():
    global _lib
    if _lib is None:
        _lib = load_library()
    return _lib


def _check(code):
    if code != OK:
        buf = ctypes.create_string_buffer(512)
        _L().cxlkv_last_error_message(buf, len(buf))
        raise CxlkvError(code, buf.value.decode("utf-8", "replace"))


def _key(k):
    if isinstance(k, Key):
        return k
    if isinstance(k, str):
        k = k.encode()
    if not isinstance(k, (bytes, bytearray)):
        raise TypeError("key must be Key, str or bytes, not %s" % type(k).__name__)
    out = Key()
    _check(_L().cxlkv_key_from_bytes(bytes(k), len(k), byref(out)))
    return out


def key_chain(namespace, model, layer_first, layer_last, tokens, chunk):
    """Keys of `tokens` in chunks of `chunk` tokens: the same keys every engine computes."""
    toks = (c_uint32 * len(tokens))(*tokens)
    n = (len(tokens) + chunk - 1) // chunk if chunk > 0 else 0
    keys = (Key * max(n, 1))()
    count = c_size_t(0)
    _check(_L().cxlkv_key_chain(namespace.encode(), model.encode(), layer_first, layer_last, toks, len(tokens), chunk, keys, n, byref(count)))
    return list(keys[: count.value])


class Pool:
    """An open pool; `close()` (or a `with` block) releases the handle."""

    def __init__(self, handle, spec):
        self._h = handle
        self.spec = spec

    @classmethod
    def create(cls, spec, size, block_size=None, participants=None, lease_ms=None):
        cfg = _L().cxlkv_pool_config_default()
        if block_size is not None:
            cfg.block_size = block_size
        if participants is not None:
            cfg.participants = participants
        if lease_ms is not None:
            cfg.lease_ms = lease_ms
        h = c_void_p()
        _check(_L().cxlkv_pool_create(spec.encode(), size, byref(cfg), byref(h)))
        return cls(h, spec)

    @classmethod
    def open(cls, spec):
        h = c_void_p()
        _check(_L().cxlkv_pool_open(spec.encode(), byref(h)))
        return cls(h, spec)

    def info(self):
        i = PoolInfo()
        _check(_L().cxlkv_pool_describe(self._h, byref(i)))
        return {f: getattr(i, f) for f, _ in PoolInfo._fields_}

    def lookup_prefix(self, keys):
        """How many leading keys of the chain are present."""
        arr = (Key * len(keys))(*[_key(k) for k in keys])
        n = c_size_t(0)
        _check(_L().cxlkv_pool_lookup_prefix(self._h, arr, len(keys), byref(n)))
        return n.value

    def attach(self):
        return Participant(self)

    def unlink(self):
        _check(_L().cxlkv_pool_unlink(self.spec.encode()))

    def close(self):
        if self._h:
            _check(_L().cxlkv_pool_close(self._h))
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Pinned:
    """A pinned block: `memoryview` of the payload in pool memory, valid until `release()`."""

    def __init__(self, handle, ptr, length):
        self._h = handle
        self.length = length
        self._ptr = ptr
        self.view = memoryview((ctypes.c_uint8 * length).from_address(ctypes.addressof(ptr.contents))).cast("B") if length else memoryview(b"")

    def release(self):
        if self._h:
            self.view.release()
            _check(_L().cxlkv_pinned_release(self._h))
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Participant:
    """A participant attached to a pool: writes its own partition, reads all of them."""

    def __init__(self, pool):
        self._h = c_void_p()
        _check(_L().cxlkv_participant_attach(pool._h, byref(self._h)))
        self._buf = ctypes.create_string_buffer(pool.info()["block_size"])

    @property
    def id(self):
        i, p = c_uint32(), c_uint32()
        _check(_L().cxlkv_participant_id(self._h, byref(i), byref(p)))
        return i.value

    def put(self, key, data):
        data = bytes(data)
        _check(_L().cxlkv_participant_put(self._h, byref(_key(key)), data, len(data)))

    def get(self, key):
        """The block's bytes, or None on a miss."""
        n = c_size_t(0)
        code = _L().cxlkv_participant_get(self._h, byref(_key(key)), self._buf, len(self._buf), byref(n))
        if code == ERR_NOT_FOUND:
            return None
        _check(code)
        return self._buf.raw[: n.value]

    def delete(self, key):
        """True if the key was deleted, False if absent."""
        code = _L().cxlkv_participant_delete(self._h, byref(_key(key)))
        if code == ERR_NOT_FOUND:
            return False
        _check(code)
        return True

    def pin(self, key):
        """A Pinned view of the block, or None on a miss."""
        h = c_void_p()
        ptr = POINTER(c_uint8)()
        n = c_size_t(0)
        code = _L().cxlkv_participant_pin(self._h, byref(_key(key)), byref(h), byref(ptr), byref(n))
        if code == ERR_NOT_FOUND:
            return None
        _check(code)
        return Pinned(h, ptr, n.value)

    def stats(self):
        s = Stats()
        _check(_L().cxlkv_participant_stats(self._h, byref(s)))
        return {f: getattr(s, f) for f, _ in Stats._fields_}

    def detach(self):
        if self._h:
            _check(_L().cxlkv_participant_detach(self._h))
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.detach()


class CxlkvBackend:
    """A storage backend in the shape of LMCache's StorageBackendInterface: contains, put,
    get_blocking, pin/unpin, remove, close. Keys are strings or bytes (an engine's cache-key
    text); values are bytes-like."""

    def __init__(self, pool):
        self.pool = pool
        self.me = pool.attach()
        self._pins = {}

    def contains(self, key, pin=False):
        k = _key(key)
        found = self.pool.lookup_prefix([k]) == 1
        if found and pin:
            return self.pin(key)
        return found

    def put(self, key, value):
        self.me.put(key, value)

    submit_put_task = put

    def get_blocking(self, key):
        return self.me.get(key)

    def pin(self, key):
        """Pins the block (kept in place until unpin); False if absent."""
        k = _key(key)
        if k in self._pins:
            return True
        p = self.me.pin(k)
        if p is None:
            return False
        self._pins[k] = p
        return True

    def unpin(self, key):
        p = self._pins.pop(_key(key), None)
        if p is None:
            return False
        p.release()
        return True

    def pinned_view(self, key):
        """The zero-copy memoryview of a pinned block."""
        return self._pins[_key(key)].view

    def remove(self, key):
        self.unpin(key)
        return self.me.delete(key)

    def close(self):
        for p in self._pins.values():
            p.release()
        self._pins.clear()
        self.me.detach()
