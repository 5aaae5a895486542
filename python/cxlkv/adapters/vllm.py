"""vLLM KV connector on a cxlkv pool: `CxlkvConnector(KVConnectorBase_V1)`.

vLLM loads it from its own `--kv-transfer-config`:

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "CxlkvConnector",
        "kv_connector_module_path": "cxlkv.adapters.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"pool": "shm:kv"}}'

Optional `kv_connector_extra_config` fields: `namespace` (default "vllm"), `model` (the model's
identity in the keys; default vLLM's model name or path: processes that load the same model under
different paths must name it the same here), `tenant` with `tenant_salt_env` (the name of an
environment variable holding the tenant's secret salt) or `tenant_salt`: the pool tenant this
deployment attaches as (`cxlkv.adapters._tenant`).

Why this seam: `KVConnectorBase_V1` hands the worker vLLM's own paged KV tensors
(`register_kv_caches`), so a block moves between a vLLM page and the pool with one copy each way
(the save writes straight into a reserved pool block, the load reads a pinned, CRC-checked block
straight into the page), and it lets a failed load be reported to vLLM
(`get_block_ids_with_load_errors`; vLLM then recomputes those tokens, or fails the request under
`kv_load_failure_policy: "fail"`). The offloading connector's worker asserts that every transfer
succeeded (a failed transfer would crash the engine), and its secondary tiers see only a copy of
vLLM's CPU tier.

Keys: one pool record per vLLM KV block (all layers), under a key derived from vLLM's own block
hash (`Request.block_hashes`: a chain over the tokens, the LoRA and multimodal inputs and the
request's `cache_salt`; reproducible across processes with vLLM's default sha256, or with
`PYTHONHASHSEED` set for xxhash), the namespace, the model and the block size, keyed (the pool's
salted keys) with the tenant's salt and the request's `cache_salt`, neither of which enters the
pool. Two vLLM processes with the same model, tokens and salts find each other's blocks; a request
under another `cache_salt` forms other keys and misses, and a deployment attached as another
tenant neither forms nor reads them.

A record is a header (magic, dtype, block shape and byte length per layer, layer count) and the
block's bytes of every layer in vLLM's layer order. A load checks the header against this
process's KV layout: a foreign, short or mismatched record is a load error, as is a miss or any
pool error: the connector reports the block to vLLM and never raises into the engine. Records are
published whole (a reserved block is visible only after its commit; a record larger than a pool
block is a multi-block object, visible only whole) and read through a pin, which checks the
payload's CRC, or `get_into`, which does too: a writer killed mid-store leaves no torn record.

Scope: one KV cache group (full-attention models; a hybrid model is refused at start), loads and
saves synchronous within the step (saves in `wait_for_save`, after the forward).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import cxlkv
from cxlkv.adapters import _tenant

from ._read import read_view
from ._torch import dtype_name

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["CxlkvConnector", "CxlkvConnectorMetadata"]

log = logging.getLogger(__name__)

_MAGIC = b"CXLKVVL1"
_MAX_DIMS = 6
# magic, dtype name (16 bytes), layers, block ndim, block dims[6], bytes per layer, payload length
_HEAD = struct.Struct("<8s16sII%dIQQ" % _MAX_DIMS)
_NO_SALT = "no salt"


@dataclass
class _Transfer:
    """The blocks of one request to load or save this step: (vLLM block id, pool key as int)."""

    req_id: str
    salt: Optional[str]
    blocks: List[Tuple[int, int]]


@dataclass
class CxlkvConnectorMetadata(KVConnectorMetadata):
    """What the scheduler side tells the workers for one step (plain data: it is pickled)."""

    loads: List[_Transfer] = field(default_factory=list)
    saves: List[_Transfer] = field(default_factory=list)


class _PoolSide:
    """The pool as one process side of the connector sees it: the participants it attached (one
    per tenant) and the keys it forms. The one place where a request's `cache_salt` meets the
    pool: the salt picks the participant (the pool's tenant, once tenants are attached by name)
    and is part of every key's namespace."""

    def __init__(
        self,
        spec: str,
        namespace: str,
        model: str,
        block_size: int,
        tenant: Optional[str] = None,
        tenant_salt: Optional[bytes] = None,
    ):
        self.pool = cxlkv.Pool.open(spec)
        self._prefix = "cxlkv-vllm-1\0%s\0%s\0bs%d\0" % (namespace, model, block_size)
        self._tenant, self._tenant_salt = tenant, tenant_salt
        self._members: Dict[Optional[str], "cxlkv.Participant"] = {}
        self._lock = threading.Lock()

    def participant(self, salt: Optional[str]) -> "cxlkv.Participant":
        """The participant that reads and writes the blocks of requests salted `salt`: the
        deployment's tenant (`tenant` in the extra config) for every salt; the salt itself keys
        the blocks (`key`)."""
        with self._lock:
            me = self._members.get(salt)
            if me is None:
                me = self._members[salt] = _tenant.attach(self.pool, self._tenant, self._tenant_salt)
            return me

    def key(self, salt: Optional[str], block_hash: bytes) -> int:
        """The pool key of the vLLM block hashed `block_hash` for requests salted `salt`: keyed
        with the tenant's salt and the request's `cache_salt` (neither enters the pool), so
        another salt forms other keys."""
        ns = (self._prefix + ("salt" if salt is not None else _NO_SALT) + "\0").encode()
        salt = _tenant.key_salt(self._tenant_salt, salt)
        return int(cxlkv.Key.from_bytes(ns + bytes(block_hash), salt=salt))

    def close(self) -> None:
        with self._lock:
            members, self._members = list(self._members.values()), {}
        for me in members:
            me.detach()
        self.pool.close()


class _Layout:
    """Where one block lives in each of vLLM's per-layer KV tensors, and its record header."""

    def __init__(self, kv_caches: Dict[str, torch.Tensor], num_blocks: int):
        if not kv_caches:
            raise ValueError("cxlkv vLLM connector: no KV cache tensors registered")
        self.layers: List[Tuple[torch.Tensor, int]] = []
        shapes = set()
        for name, t in kv_caches.items():
            if t.shape[0] == num_blocks:
                dim = 0  # [blocks, ...] (the CPU backend's [blocks, kv_heads, block, 2 * head])
            elif t.dim() > 1 and t.shape[0] == 2 and t.shape[1] == num_blocks:
                dim = 1  # [2, blocks, ...] (K and V apart)
            else:
                raise ValueError(
                    "cxlkv vLLM connector: layer %s's KV tensor %s has no block dimension of %d"
                    % (name, tuple(t.shape), num_blocks)
                )
            self.layers.append((t, dim))
            shapes.add((t.dtype, tuple(t.select(dim, 0).shape)))
        if len(shapes) != 1:
            raise ValueError("cxlkv vLLM connector: layers differ in KV layout: %s" % shapes)
        (self.dtype, self.block_shape), = shapes
        if len(self.block_shape) > _MAX_DIMS:
            raise ValueError("cxlkv vLLM connector: %d block dims" % len(self.block_shape))
        self.layer_bytes = self.layers[0][0].select(self.layers[0][1], 0).numel() * (
            self.layers[0][0].element_size()
        )
        self.payload = self.layer_bytes * len(self.layers)
        self.head = _HEAD.pack(
            _MAGIC,
            dtype_name(self.dtype, "cxlkv vLLM connector").encode(),
            len(self.layers),
            len(self.block_shape),
            *(list(self.block_shape) + [0] * (_MAX_DIMS - len(self.block_shape))),
            self.layer_bytes,
            self.payload,
        )
        self.length = len(self.head) + self.payload

    def block(self, layer: int, block_id: int) -> torch.Tensor:
        t, dim = self.layers[layer]
        return t.select(dim, block_id)

    def _pages(self, record: memoryview):
        """Each layer's payload in `record` as a tensor of one block's shape (a view, no copy);
        views end when the caller's loop does."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a read-only record is only read
            data = torch.frombuffer(record, dtype=torch.uint8)
        for i in range(len(self.layers)):
            off = len(self.head) + i * self.layer_bytes
            yield i, data[off : off + self.layer_bytes].view(self.dtype).view(self.block_shape)

    def write(self, dst: memoryview, block_id: int) -> None:
        """Writes the record of block `block_id` into `dst` (`length` writable bytes)."""
        dst[: len(self.head)] = self.head
        for i, page in self._pages(dst):
            page.copy_(self.block(i, block_id))

    def read(self, src: memoryview, block_id: int) -> bool:
        """Copies the record in `src` into block `block_id`'s pages; False (nothing written) when
        the record is not one of this layout."""
        if len(src) != self.length or bytes(src[: len(self.head)]) != self.head:
            return False
        for i, page in self._pages(src):
            self.block(i, block_id).copy_(page)
        return True


class CxlkvConnector(KVConnectorBase_V1):
    """A vLLM KV connector whose blocks live in a cxlkv pool (see the module's doc)."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self,
        vllm_config: "VllmConfig",
        role: KVConnectorRole,
        kv_cache_config: Optional["KVCacheConfig"] = None,
    ):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        spec = extra.get("pool")
        if not spec:
            raise ValueError(
                "cxlkv vLLM connector: set kv_connector_extra_config's \"pool\" to the pool's "
                "spec (e.g. shm:kv)"
            )
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        if len(groups) > 1:
            raise ValueError(
                "cxlkv vLLM connector: %d KV cache groups; it serves one (full-attention models)"
                % len(groups)
            )
        self._check_hash_is_shared(vllm_config)
        self._block_size = vllm_config.cache_config.block_size
        model = extra.get("model") or vllm_config.model_config.served_model_name
        if isinstance(model, (list, tuple)):
            model = model[0]
        tenant, tenant_salt = _tenant.tenant_of(extra)
        self._side = _PoolSide(
            str(spec),
            str(extra.get("namespace", "vllm")),
            str(model),
            self._block_size,
            tenant,
            tenant_salt,
        )
        # Scheduler side.
        self._requests: Dict[str, "Request"] = {}
        self._saved: Dict[str, int] = {}
        self._hits: Dict[str, Tuple[int, int]] = {}
        self._loads: Dict[str, Tuple[int, int]] = {}
        # Worker side.
        self._layout: Optional[_Layout] = None
        self._num_blocks = getattr(kv_cache_config, "num_blocks", None)
        self._load_errors: set = set()

    @staticmethod
    def _check_hash_is_shared(vllm_config: "VllmConfig") -> None:
        algo = getattr(vllm_config.cache_config, "prefix_caching_hash_algo", "sha256")
        if algo.startswith("xxhash") and os.getenv("PYTHONHASHSEED") is None:
            raise ValueError(
                "cxlkv vLLM connector: prefix_caching_hash_algo %s seeds vLLM's block hashes at "
                "random per process, so no other process would find these blocks; use sha256 "
                "(the default) or set PYTHONHASHSEED to one value in every process" % algo
            )

    # --- scheduler side -----------------------------------------------------------------------

    def _keys(self, request: "Request", first: int, last: int) -> List[int]:
        salt = request.cache_salt
        return [self._side.key(salt, h) for h in request.block_hashes[first:last]]

    def get_num_new_matched_tokens(
        self, request: "Request", num_computed_tokens: int
    ) -> Tuple[Optional[int], bool]:
        self._requests[request.request_id] = request
        # At least the prompt's last token is computed: its logits are the first output.
        last = min(len(request.block_hashes), (request.num_tokens - 1) // self._block_size)
        first = num_computed_tokens // self._block_size
        if last <= first:
            return 0, False
        try:
            me = self._side.participant(request.cache_salt)
            n = me.lookup_prefix(self._keys(request, first, last))
        except cxlkv.Error as e:
            log.warning("cxlkv vLLM connector: lookup failed, counted as a miss: %s", e)
            n = 0
        self._hits[request.request_id] = (first, n)
        if n == 0:
            return 0, False
        return (first + n) * self._block_size - num_computed_tokens, False

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ):
        hit = self._hits.pop(request.request_id, None)
        if num_external_tokens <= 0 or hit is None:
            return
        first, n = hit
        self._loads[request.request_id] = (first, num_external_tokens // self._block_size)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = CxlkvConnectorMetadata()
        manager = self._kv_cache_manager
        for req_id, (first, n) in self._loads.items():
            request = self._requests.get(req_id)
            if request is None or manager is None or n == 0:
                continue
            ids = manager.get_block_ids(req_id)[0]
            keys = self._keys(request, first, first + n)
            meta.loads.append(
                _Transfer(req_id, request.cache_salt, list(zip(ids[first : first + n], keys)))
            )
        self._loads.clear()

        computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        for req_id, before in computed.items():
            request = self._requests.get(req_id)
            if request is None or manager is None:
                continue
            done = before + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            full = min(len(request.block_hashes), done // self._block_size)
            start = self._saved.get(req_id, 0)
            if full <= start:
                continue
            ids = manager.get_block_ids(req_id)[0]
            keys = self._keys(request, start, full)
            meta.saves.append(
                _Transfer(req_id, request.cache_salt, list(zip(ids[start:full], keys)))
            )
            self._saved[req_id] = full
        return meta

    def request_finished(
        self, request: "Request", block_ids: List[int]
    ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        for m in (self._requests, self._saved, self._hits, self._loads):
            m.pop(request.request_id, None)
        return False, None  # saves are done within the step that computed the blocks

    # --- worker side --------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]):
        num_blocks = self._num_blocks
        if num_blocks is None:
            num_blocks = next(iter(kv_caches.values())).shape[0]
        self._layout = _Layout(kv_caches, num_blocks)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, CxlkvConnectorMetadata) or not meta.loads:
            return
        for t in meta.loads:
            failed_at = None
            for i, (block_id, key) in enumerate(t.blocks):
                if not self._load_block(t.salt, block_id, key):
                    failed_at = i
                    break
            if failed_at is not None:
                # vLLM recomputes from the first failed block on: report it and every later one.
                self._load_errors.update(b for b, _ in t.blocks[failed_at:])

    def _load_block(self, salt: Optional[str], block_id: int, key: int) -> bool:
        layout = self._layout
        if layout is None:
            return False
        try:
            me = self._side.participant(salt)
            with read_view(me, key) as view:
                if view is None:
                    log.warning("cxlkv vLLM connector: block %x vanished before its load", key)
                    return False
                if not layout.read(view, block_id):
                    log.warning("cxlkv vLLM connector: block %x is not a record of this layout", key)
                    return False
                return True
        except Exception as e:  # a load error is reported to vLLM, never raised into the engine
            log.warning("cxlkv vLLM connector: loading block %x failed: %s", key, e)
            return False

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are complete when start_load_kv returns

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # saved whole in wait_for_save, after every layer wrote its KV

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        if not isinstance(meta, CxlkvConnectorMetadata) or self._layout is None:
            return
        for t in meta.saves:
            try:
                me = self._side.participant(t.salt)
                present = me.batch_contains([k for _, k in t.blocks])
            except Exception as e:
                log.warning("cxlkv vLLM connector: saving request %s skipped: %s", t.req_id, e)
                continue
            for (block_id, key), there in zip(t.blocks, present):
                # A block whose load failed this step holds no valid KV: never store it.
                if not there and block_id not in self._load_errors:
                    self._save_block(me, block_id, key)

    def _save_block(self, me: "cxlkv.Participant", block_id: int, key: int) -> None:
        layout = self._layout
        try:
            try:
                res = me.reserve(key, layout.length)
            except (cxlkv.BadInputError, cxlkv.UnavailableError):
                res = None  # larger than a block, or memory without stable addresses
            if res is not None:
                with res:
                    view = memoryview(res)
                    try:
                        layout.write(view, block_id)
                    finally:
                        view.release()
                return
            buf = bytearray(layout.length)
            layout.write(memoryview(buf), block_id)
            me.put(key, buf)
        except Exception as e:  # a failed save is a later miss, never an engine error
            log.warning("cxlkv vLLM connector: saving block %x failed: %s", key, e)

    def get_block_ids_with_load_errors(self) -> set:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self):
        self._side.close()
