"""A vLLM engine core without a model, for the vLLM adapter's tests: vLLM's own `Scheduler`
(built as vLLM's CPU connector tests build one), the worker-side connector created and driven
through vLLM's own `ensure_kv_transfer_initialized` and `KVConnectorModelRunnerMixin` hooks (the
calls a model runner makes around its forward), vLLM's `Request` with its own block hasher, and a
stand-in forward pass.

The stand-in forward writes, for every scheduled token, K/V that depend on the whole prefix up to
that token (a running hash of the token ids) into the request's pages of vLLM's paged KV tensors,
in the CPU attention backend's layout `[blocks, kv_heads, block_size, 2 * head_size]`, and samples
the next token from the pages of every position of the request: a page that was loaded wrong
changes the output, as it would with a real model. So a restored run that samples the same tokens
as a cold one read the same KV.

Imported only by the children the tests start (`python -c`); nothing here runs at import but the
imports.
"""

import json
import os
import time

import torch

from vllm import SamplingParams
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer import kv_transfer_state
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.engine.arg_utils import EngineArgs
from vllm.forward_context import set_forward_context
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin

BLOCK = 16
LAYERS = 2
KV_HEADS = 2
HEAD = 16
VOCAB = 1000
EOS = 2

# A model config for ModelConfig to read (no weights: nothing here runs a model).
_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": KV_HEADS * 2 * HEAD,
    "intermediate_size": 128,
    "num_attention_heads": KV_HEADS * 2,
    "num_key_value_heads": KV_HEADS,
    "num_hidden_layers": LAYERS,
    "vocab_size": VOCAB,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": EOS,
}


def kv_transfer_flag(spec, policy="recompute"):
    """The `--kv-transfer-config` value that loads the cxlkv connector."""
    return json.dumps(
        {
            "kv_connector": "CxlkvConnector",
            "kv_connector_module_path": "cxlkv.adapters.vllm",
            "kv_role": "kv_both",
            "kv_load_failure_policy": policy,
            "kv_connector_extra_config": {"pool": spec, "model": "test-llama"},
        }
    )


class Engine:
    """vLLM's scheduler and worker-side connector on `num_blocks` pages of paged KV."""

    def __init__(self, spec, model_dir, num_blocks=512, batched_tokens=512, policy="recompute"):
        os.makedirs(model_dir, exist_ok=True)
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(_MODEL_CONFIG, f)
        # The connector comes from vLLM's own command-line flag, parsed by vLLM's parser.
        parser = FlexibleArgumentParser()
        EngineArgs.add_cli_args(parser)
        args = parser.parse_args(["--kv-transfer-config", kv_transfer_flag(spec, policy)])
        model = ModelConfig(
            model=model_dir, skip_tokenizer_init=True, dtype="float32", seed=0, max_model_len=8192
        )
        scheduler_config = SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=batched_tokens,
            max_model_len=8192,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        )
        cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
        cache.num_gpu_blocks = num_blocks
        self.config = VllmConfig(
            model_config=model,
            scheduler_config=scheduler_config,
            cache_config=cache,
            kv_transfer_config=args.kv_transfer_config,
            device_config=DeviceConfig("cpu"),
        )
        names = ["model.layers.%d.self_attn.attn" % i for i in range(LAYERS)]
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    names,
                    FullAttentionSpec(
                        block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD, dtype=torch.float32
                    ),
                )
            ],
        )
        init_none_hash(sha256)
        self.scheduler = Scheduler(
            vllm_config=self.config,
            kv_cache_config=self.kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.config),
            block_size=BLOCK,
            log_stats=True,
        )
        # What vLLM's `ensure_kv_transfer_initialized` does in a worker, less its tensor-parallel
        # engine-id broadcast (no parallel groups here): the worker-side connector, from the same
        # flag, made the process's KV transfer agent that the model-runner hooks use.
        self.worker = KVConnectorFactory.create_connector(
            config=self.config, role=KVConnectorRole.WORKER, kv_cache_config=self.kv_cache_config
        )
        kv_transfer_state._KV_CONNECTOR_AGENT = self.worker
        # The CPU attention backend's layout: [blocks, kv_heads, block_size, 2 * head_size].
        self.kv = {n: torch.zeros(num_blocks, KV_HEADS, BLOCK, 2 * HEAD) for n in names}
        self.worker.register_kv_caches(self.kv)
        self.requests = {}
        self.outputs = {}
        self.first_step = {}  # request id -> (tokens scheduled in its first step, seconds to it)
        self.scheduled = {}  # request id -> tokens scheduled over all its steps
        self.invalid = set()
        # vLLM's own connector prefix-cache counters (its SchedulerStats, summed over steps):
        # prompt tokens the connector was asked about, and tokens it served.
        self.connector_queries = 0
        self.connector_hits = 0

    def add(self, req_id, tokens, max_tokens=4, salt=None):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        params.update_from_generation_config({}, EOS)
        r = Request(
            request_id=req_id,
            prompt_token_ids=list(tokens),
            sampling_params=params,
            pooling_params=None,
            mm_features=None,
            cache_salt=salt,
            block_hasher=get_request_block_hasher(BLOCK, sha256),
        )
        self.requests[req_id] = r
        self.outputs[req_id] = []
        self._t0 = time.perf_counter()
        self.scheduler.add_request(r)
        return r

    def _kv_of(self, h, layer):
        """The stand-in K/V of one token whose running prefix hash is `h`: [kv_heads, 2 * head]."""
        base = torch.arange(KV_HEADS * 2 * HEAD, dtype=torch.float32).view(KV_HEADS, 2 * HEAD)
        return (h % 65521) + layer * 0.5 + base * 1e-3

    def _forward(self, so):
        """Writes the K/V of every scheduled token and samples from each finished prompt."""
        sampled = {}
        # Tokens computed before this step (the scheduler has already advanced the requests').
        before = {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs}
        cached = so.scheduled_cached_reqs
        before.update(zip(cached.req_ids, cached.num_computed_tokens))
        for req_id, n in so.num_scheduled_tokens.items():
            r = self.requests[req_id]
            ids = self.scheduler.kv_cache_manager.get_block_ids(req_id)[0]
            start = before[req_id]
            tokens = r.all_token_ids
            h = 0
            for p in range(start + n):
                h = (h * 1000003 + tokens[p] + 1) % (1 << 61)
                if p >= start:
                    for i, name in enumerate(self.kv):
                        self.kv[name][ids[p // BLOCK], :, p % BLOCK, :] = self._kv_of(h, i)
            if start + n < r.num_tokens:
                sampled[req_id] = []  # a prefill chunk: nothing sampled yet
                continue
            # "Attention" over every position's page: a wrong page changes the token.
            total = 0.0
            for name in self.kv:
                for p in range(start + n):
                    total += float(self.kv[name][ids[p // BLOCK], 0, p % BLOCK, 0])
            sampled[req_id] = [3 + int(total) % (VOCAB - 3)]
        return sampled

    def step(self):
        so = self.scheduler.schedule()
        for req_id, n in so.num_scheduled_tokens.items():
            self.first_step.setdefault(req_id, (n, time.perf_counter() - self._t0))
            self.scheduled[req_id] = self.scheduled.get(req_id, 0) + n
        with set_forward_context(None, self.config):
            with KVConnectorModelRunnerMixin._get_kv_connector_output(so) as kv_out:
                sampled = self._forward(so)
        self.invalid |= set(kv_out.invalid_block_ids or ())
        req_ids = list(so.num_scheduled_tokens)
        out = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[sampled[r] for r in req_ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=kv_out,
        )
        for eco in self.scheduler.update_from_output(so, out).values():
            stats = eco.scheduler_stats
            c = stats.connector_prefix_cache_stats if stats is not None else None
            if c is not None:
                self.connector_queries += c.queries
                self.connector_hits += c.hits
            for o in eco.outputs:
                self.outputs[o.request_id].extend(o.new_token_ids)
        return so

    def prompt_tokens_computed(self, req_id):
        """How many prompt tokens the forward computed for `req_id` (all its scheduled tokens
        less the decode steps: each output token but the last was fed back once)."""
        return self.scheduled.get(req_id, 0) - max(len(self.outputs[req_id]) - 1, 0)

    def run(self, max_steps=200):
        for _ in range(max_steps):
            if not self.scheduler.has_requests():
                return
            self.step()
        raise AssertionError("requests still unfinished after %d steps" % max_steps)

    def close(self):
        kv_transfer_state._KV_CONNECTOR_AGENT = None
        self.worker.shutdown()
        self.scheduler.shutdown()
