"""One vLLM process (vLLM's CPU build, the real SmolLM2-135M-Instruct) answering one prompt, for the
vLLM adapter's end-to-end test; prints one `RESULT {json}` line.

    python vllm_serve.py MODEL_DIR POOL_SPEC|none PROMPT(1|2) [TOKENS [CACHE_SALT]]
    python vllm_serve.py MODEL_DIR --greedy TEXT...   (16 greedy tokens of each text, plain vLLM,
                                                        and the smallest top-1 margin in nats)

With a pool spec, vLLM loads `cxlkv.adapters.vllm.CxlkvConnector` from its own
`--kv-transfer-config` (here the `kv_transfer_config` engine argument, the same JSON); with `none`,
plain vLLM. The prompt is a document of about 2,200 tokens and one of two questions. The result:
the greedy token ids, time to first token (vLLM's own `first_token_latency`), the prompt's tokens
served from cache (`num_cached_tokens`) and vLLM's external prefix-cache counters
(`vllm:external_prefix_cache_queries` / `_hits`).

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so a SIGKILL of this
process stops it all.
"""

import json
import os
import sys
import time

BLOCK = 32  # the CPU attention backend's block sizes are multiples of 32


def document():
    """A deterministic document (a made-up ship's log) of about 2,200 SmolLM2 tokens."""
    ships = ["Aurora", "Boreas", "Calypso", "Dorado", "Eider", "Fulmar", "Gannet", "Halcyon"]
    ports = ["Bergen", "Cadiz", "Dakar", "Genoa", "Izmir", "Malmo", "Porto", "Tromso", "Varna"]
    cargo = ["salt", "timber", "copper", "wool", "olive oil", "tin", "linen", "coffee"]
    lines = [
        "Day %d: the %s left %s with %d tons of %s and %d crew."
        % (
            i,
            ships[i % len(ships)],
            ports[(i * 7) % len(ports)],
            (i * 53) % 97 + 4,
            cargo[(i * 3) % len(cargo)],
            (i * 13) % 29 + 6,
        )
        for i in range(1, 86)
    ]
    return "Harbor master's log.\n" + "\n".join(lines) + "\n\n"


QUESTIONS = {
    "1": "Question: Which ship left on day 9? Answer:",
    "2": "Question: How many tons did the ship of day 12 carry? Answer:",
}


def greedy(model, texts):
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype="float32", max_model_len=512, block_size=BLOCK, enforce_eager=True)
    outs = llm.generate(texts, SamplingParams(max_tokens=16, temperature=0.0, logprobs=2))
    for o in outs:
        c = o.outputs[0]
        tops = [sorted((lp.logprob for lp in d.values()), reverse=True) for d in c.logprobs]
        margin = min(t[0] - t[1] for t in tops if len(t) > 1)
        print("RESULT " + json.dumps({"text": c.text, "min_margin": margin}), flush=True)


def main():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if sys.argv[2] == "--greedy":
        return greedy(sys.argv[1], sys.argv[3:])
    model, spec, which = sys.argv[1], sys.argv[2], sys.argv[3]
    max_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    salt = sys.argv[5] if len(sys.argv) > 5 else None
    from vllm import LLM, SamplingParams

    kw = {}
    if spec != "none":
        kw["kv_transfer_config"] = {
            "kv_connector": "CxlkvConnector",
            "kv_connector_module_path": "cxlkv.adapters.vllm",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"pool": spec, "model": "SmolLM2-135M-Instruct"},
        }
    t0 = time.perf_counter()
    llm = LLM(
        model=model,
        dtype="float32",
        max_model_len=4096,
        block_size=BLOCK,
        enforce_eager=True,
        max_num_seqs=2,
        max_num_batched_tokens=512,  # chunked prefill: blocks are stored as each chunk ends
        disable_log_stats=False,
        seed=0,
        **kw,
    )
    load_s = time.perf_counter() - t0
    # The chat template puts the document first: both prompts share it as a prefix.
    messages = [{"role": "user", "content": document() + QUESTIONS[which]}]
    prompt = llm.get_tokenizer().apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    request = {"prompt": prompt} if salt is None else {"prompt": prompt, "cache_salt": salt}
    print("GENERATING", flush=True)
    t1 = time.perf_counter()
    out = llm.generate([request], SamplingParams(max_tokens=max_tokens, temperature=0.0))[0]
    wall = time.perf_counter() - t1
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    print(
        "RESULT "
        + json.dumps(
            {
                "tokens": list(out.outputs[0].token_ids),
                "text": out.outputs[0].text,
                "prompt_tokens": len(out.prompt_token_ids),
                "ttft_s": out.metrics.first_token_latency if out.metrics else None,
                "generate_s": wall,
                "load_s": load_s,
                "num_cached_tokens": out.num_cached_tokens,
                "external_queries": metrics.get("vllm:external_prefix_cache_queries"),
                "external_hits": metrics.get("vllm:external_prefix_cache_hits"),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
