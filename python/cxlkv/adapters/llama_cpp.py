"""llama.cpp (llama-cpp-python) prompt cache on a cxlkv pool: `CxlkvLlamaCache(BaseLlamaCache)`.

    from llama_cpp import Llama
    from cxlkv.adapters.llama_cpp import CxlkvLlamaCache

    llm = Llama(model_path="SmolLM2-135M-Instruct.Q4_1.gguf", n_ctx=4096)
    llm.set_cache(CxlkvLlamaCache.for_llama(llm, "shm:kv"))   # the pool: Pool.open(spec)
    llm.create_completion(prompt, max_tokens=16, temperature=0)

llama-cpp-python calls the cache itself: before a completion it asks `cache[prompt_tokens]` for
the stored state with the longest common token prefix and, when that prefix is longer than what
its context already holds, `load_state`s it, so only the tokens after the prefix are evaluated;
after a completion it stores `cache[prompt + completion] = llm.save_state()`. Any process on
the pool finds states that other processes stored.

How a state is stored:
- The state (llama.cpp's context state, the token ids, the seed, the scores when the engine
  reads them) is one pool object under a key of its model and its token ids, with a header (magic,
  version, lengths, the model's identity) and a BLAKE2b digest of everything. A put is atomic in
  the pool (an object becomes visible only once complete), and a restore checks the header and
  the digest too: a torn or foreign object is a miss, never a wrong state.
- Prefix index: the state's valid tokens (`input_ids[:n_tokens]`) are cut into chunks of
  `chunk_tokens`; `cxlkv.key_chain` gives each chunk a key that depends on the whole prefix up to
  it, and under each a small index entry names the state (its key, length and digest). The index
  entries are put after the state, so each names a complete state. A lookup computes the chain of
  the asked tokens, `lookup_prefix` counts its leading keys in the pool, and the entry of the
  longest present key names a state sharing at least that prefix (llama-cpp-python then finds the
  exact common prefix token by token).
- With `logits_all=False` llama-cpp-python never reads `LlamaState.scores` (sampling reads the
  context's own logits, which are part of the context state), so `for_llama` leaves them out (they
  are `n_batch x n_vocab` float32, ~100 MB for a 49k vocabulary): a restored state then has zero
  scores of the same shape. With `logits_all=True` they are stored and restored exactly.
- Capacity is the pool's: its partitions evict least recently used objects; an index entry whose
  state was evicted is skipped. `capacity_bytes` is kept for the base class only.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from typing import Optional, Sequence

import numpy as np

import llama_cpp.llama
from llama_cpp.llama_cache import BaseLlamaCache

import cxlkv
from cxlkv.adapters import _tenant

__all__ = ["CxlkvLlamaCache", "encode_state", "decode_state", "StateFormatError"]

_log = logging.getLogger(__name__)

_STATE_MAGIC = b"CXLKVLS1"
_INDEX_MAGIC = b"CXLKVLI1"
# magic, header length, n_tokens, llama_state_size, seed, n_ctx (input_ids length),
# scores rows, scores cols, scores kept (0/1), model id length
_STATE_HEAD = struct.Struct("<8sIQQqQQQII")
# magic, state key lo, hi, state object length, valid tokens, digest
_INDEX = struct.Struct("<8sQQQQ32s")
_DIGEST = 32


class StateFormatError(ValueError):
    """A stored object is not a whole state of this model (torn, foreign or corrupt)."""


def _digest(*parts) -> bytes:
    h = hashlib.blake2b(digest_size=_DIGEST)
    for p in parts:
        h.update(p)
    return h.digest()


def encode_state(state: "llama_cpp.llama.LlamaState", model_id: str, keep_scores: bool = True):
    """The bytes of `state` as stored: header, model id, input_ids, scores (if kept), the llama
    context state, then a BLAKE2b digest of all of it. Returns (the bytes, the digest)."""
    mid = model_id.encode()
    ids = np.ascontiguousarray(state.input_ids, dtype=np.intc)
    scores = np.ascontiguousarray(state.scores, dtype=np.single)
    rows, cols = scores.shape if scores.ndim == 2 else (0, 0)
    llama_state = memoryview(state.llama_state)[: int(state.llama_state_size)]
    if len(llama_state) != int(state.llama_state_size):
        raise StateFormatError("llama_state is shorter than llama_state_size")
    head = _STATE_HEAD.pack(
        _STATE_MAGIC,
        _STATE_HEAD.size + len(mid),
        int(state.n_tokens),
        int(state.llama_state_size),
        int(state.seed),
        ids.shape[0],
        rows,
        cols,
        1 if keep_scores else 0,
        len(mid),
    )
    parts = [head, mid, ids.tobytes()]
    if keep_scores:
        parts.append(scores.tobytes())
    parts.append(llama_state)
    d = _digest(*parts)
    parts.append(d)
    return b"".join(parts), d


def decode_state(buf, model_id: str) -> "llama_cpp.llama.LlamaState":
    """Parses and verifies what `encode_state` wrote (a bytes-like object); StateFormatError
    when it is torn, corrupt or of another model. The state's `llama_state` is a read-only view
    into `buf` (no copy of the largest part)."""
    mv = memoryview(buf)
    if len(mv) < _STATE_HEAD.size + _DIGEST:
        raise StateFormatError("state object too short (%d bytes)" % len(mv))
    magic, head_len, n_tokens, ls_size, seed, n_ctx, rows, cols, kept, mid_len = (
        _STATE_HEAD.unpack_from(mv, 0)
    )
    if magic != _STATE_MAGIC:
        raise StateFormatError("not a cxlkv llama state (magic %r)" % bytes(magic))
    if head_len != _STATE_HEAD.size + mid_len:
        raise StateFormatError("bad header length %d" % head_len)
    ids_len = 4 * n_ctx
    sc_len = 4 * rows * cols if kept else 0
    body = head_len + ids_len + sc_len + ls_size
    if len(mv) != body + _DIGEST:
        raise StateFormatError(
            "state object has %d bytes, its header says %d" % (len(mv), body + _DIGEST)
        )
    if bytes(mv[body:]) != _digest(mv[:body]):
        raise StateFormatError("state digest mismatch (torn or corrupt)")
    mid = bytes(mv[_STATE_HEAD.size : head_len]).decode(errors="replace")
    if mid != model_id:
        raise StateFormatError("state of model %r, not %r" % (mid, model_id))
    if n_tokens > n_ctx:
        raise StateFormatError("n_tokens %d > n_ctx %d" % (n_tokens, n_ctx))
    off = head_len
    ids = np.frombuffer(mv, np.intc, n_ctx, off).copy()
    off += ids_len
    if kept:
        scores = np.frombuffer(mv, np.single, rows * cols, off).reshape(rows, cols).copy()
    else:
        scores = np.zeros((rows, cols), np.single)
    off += sc_len
    return llama_cpp.llama.LlamaState(
        input_ids=ids,
        scores=scores,
        n_tokens=int(n_tokens),
        # A view of `buf`, not a copy: `Llama.load_state` copies it into the context itself
        # (`from_buffer_copy`), and the state keeps `buf` alive.
        llama_state=mv.toreadonly()[off : off + ls_size],
        llama_state_size=int(ls_size),
        seed=int(seed),
    )


class CxlkvLlamaCache(BaseLlamaCache):
    """A llama-cpp-python cache (`llm.set_cache(...)`) whose states live in a cxlkv pool, shared
    by every process attached to it, found by token prefix.

    `pool` is a `cxlkv.Pool` or a backend spec (`shm:NAME`, `file:PATH`, `dax:PATH`) opened with
    `Pool.open`. `model_id` names the model and the context shape (states are only restored into
    the same); `for_llama` derives it from a `Llama`. `chunk_tokens` is the prefix granularity of
    the index. `namespace` separates deployments' keys. `tenant` and `salt` (the tenant's secret
    bytes, which stay in this process) attach the cache as that pool tenant: it writes under the
    tenant's quota, reads only its tenant's and the public states, and salts every key, so another
    tenant (or salt) neither forms nor finds them (`cxlkv.adapters._tenant`)."""

    def __init__(
        self,
        pool,
        model_id: str,
        *,
        chunk_tokens: int = 256,
        keep_scores: bool = True,
        namespace: str = "llama_cpp",
        capacity_bytes: int = (2 << 30),
        tenant: Optional[str] = None,
        salt: Optional[bytes] = None,
    ):
        super().__init__(capacity_bytes)
        if chunk_tokens <= 0:
            raise ValueError("chunk_tokens must be positive, not %r" % chunk_tokens)
        if isinstance(pool, str):
            pool = cxlkv.Pool.open(pool)
        self.pool = pool
        tenant, salt = _tenant.tenant_of({"tenant": tenant, "tenant_salt": salt})
        self.me = _tenant.attach(pool, tenant, salt)
        self._salt = _tenant.key_salt(salt, None)
        self.model_id = model_id
        self.chunk_tokens = int(chunk_tokens)
        self.keep_scores = bool(keep_scores)
        self.namespace = namespace
        self._stored_bytes = 0
        # What the last lookup found: tokens matched by the index, the state's length.
        self.last_hit: Optional[dict] = None

    @classmethod
    def for_llama(cls, llm: "llama_cpp.llama.Llama", pool, **kw) -> "CxlkvLlamaCache":
        """A cache for `llm`: the model id is its GGUF file's name, size and a digest of its
        metadata, with the context shape (n_ctx, n_batch, n_vocab, logits_all); scores are
        stored only with logits_all."""
        path = getattr(llm, "model_path", "") or ""
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        meta = sorted((str(k), str(v)) for k, v in (getattr(llm, "metadata", None) or {}).items())
        meta_digest = hashlib.blake2b(repr(meta).encode(), digest_size=8).hexdigest()
        logits_all = bool(getattr(llm, "_logits_all", False))
        mid = "%s:%d:%s:ctx%d:batch%d:vocab%d:all%d" % (
            os.path.basename(path),
            size,
            meta_digest,
            llm.n_ctx(),
            llm.n_batch,
            llm.n_vocab(),
            logits_all,
        )
        kw.setdefault("keep_scores", logits_all)
        return cls(pool, mid, **kw)

    # --- keys -------------------------------------------------------------------------------

    def _chain(self, tokens: Sequence[int]):
        return cxlkv.key_chain(
            self.namespace,
            self.model_id,
            0,
            0,
            [int(t) for t in tokens],
            self.chunk_tokens,
            salt=self._salt,
        )

    def _state_key(self, tokens: Sequence[int]) -> "cxlkv.Key":
        h = hashlib.blake2b(digest_size=16)
        h.update(b"cxlkv-llama-state\0%s\0%s\0" % (self.namespace.encode(), self.model_id.encode()))
        h.update(np.asarray(tokens, dtype=np.int64).tobytes())
        if self._salt is not None:
            return cxlkv.Key.from_bytes(h.digest(), salt=self._salt)
        return cxlkv.Key(int.from_bytes(h.digest(), "little"))

    # --- lookup -----------------------------------------------------------------------------

    def _entry(self, key):
        raw = self.me.get(key)
        if raw is None or len(raw) != _INDEX.size:
            return None
        magic, lo, hi, length, n_tokens, digest = _INDEX.unpack(raw)
        if magic != _INDEX_MAGIC:
            return None
        return cxlkv.Key.from_parts(lo, hi), length, n_tokens, digest

    def _find(self, tokens: Sequence[int], load: bool):
        """The (state or None, entry) of the longest stored prefix of `tokens`, or None."""
        if len(tokens) == 0:
            return None
        chain = self._chain(tokens)
        n = self.me.lookup_prefix(chain)
        # The longest present chunk first; an entry whose state is gone (evicted) or fails its
        # checks falls back to the next shorter prefix.
        for i in range(n - 1, -1, -1):
            e = self._entry(chain[i])
            if e is None:
                continue
            skey, length, n_tokens, digest = e
            if not load:
                if self.me.contains(skey):
                    return None, e, i
                continue
            # np.empty, not bytearray: no zero fill of tens of MB that get_into overwrites anyway.
            buf = np.empty(length, np.uint8)
            try:
                got = self.me.get_into(skey, buf)
            except cxlkv.BadInputError:
                continue  # replaced by a longer object since the entry was written
            if got != length or buf[-_DIGEST:].tobytes() != digest:
                continue
            try:
                return decode_state(buf, self.model_id), e, i
            except StateFormatError:
                continue
        return None

    @property
    def cache_size(self) -> int:
        """Bytes of states this cache has stored (the pool's own LRU bounds what stays)."""
        return self._stored_bytes

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._find(key, load=False) is not None

    def __getitem__(self, key: Sequence[int]) -> "llama_cpp.llama.LlamaState":
        found = self._find(key, load=True)
        if found is None:
            self.last_hit = None
            raise KeyError("no stored state shares a prefix with these tokens")
        state, (_, length, n_tokens, _), i = found
        self.last_hit = {
            "chunks": i + 1,
            "indexed_tokens": min((i + 1) * self.chunk_tokens, n_tokens),
            "state_tokens": n_tokens,
            "bytes": length,
        }
        return state

    def __setitem__(self, key: Sequence[int], value: "llama_cpp.llama.LlamaState") -> None:
        n = int(value.n_tokens)
        if n <= 0:
            return
        tokens = np.asarray(value.input_ids[:n], dtype=np.int64)
        blob, digest = encode_state(value, self.model_id, self.keep_scores)
        skey = self._state_key(tokens)
        # The state first, whole and atomically; then the index entries that name it. A state
        # the pool cannot hold is not cached; the completion that saved it goes on.
        try:
            self.me.put(skey, blob)
            entry = _INDEX.pack(_INDEX_MAGIC, skey.lo, skey.hi, len(blob), n, digest)
            chain = self._chain(tokens)
            self.me.batch_put(chain, [entry] * len(chain))
        except (cxlkv.FullError, cxlkv.BadInputError) as e:
            _log.warning(
                "cxlkv llama cache: state of %d tokens (%d bytes) not stored: %s", n, len(blob), e
            )
            return
        self._stored_bytes += len(blob)

    def close(self) -> None:
        """Detaches from the pool (the stored states stay)."""
        self.me.detach()
