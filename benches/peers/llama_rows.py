"""llama.cpp rows: `CxlkvLlamaCache` against llama-cpp-python's own `LlamaRAMCache` and
`LlamaDiskCache`, all through `Llama.set_cache`, on the SmolLM2-135M GGUF and a prompt of the real
text's token ids (data/kv: 2,048 tokens; `--quick`: 384, one round).

- store: `cache[tokens] = llm.save_state()`, what llama-cpp-python does after a completion
  (value_bytes: the state's llama.cpp size);
- time to first token of a second request sharing the prefix (the prompt less its last 8 tokens,
  then 8 others) in the same process, after `llm.reset()`, so the state comes from the cache: a
  `create_completion(max_tokens=1)`; checked: the first token equals the one of a cold run, and
  llama.cpp's prompt-eval counter counts only the 8 tokens after the prefix (a restore happened);
- the same in a second process (a fresh `Llama` on the same cache), where the cache can cross
  processes;
- two processes sharing one cache: each stores its own state at the same time, then restores the
  other's (checked the same way);
- bytes held (`cache.cache_size`, or the disk cache's directory).

The cold request (no cache) is its own row: the time every cache saves against.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from common import Samples, error_row, kv_tensors, row

ENGINE = "llama.cpp"
N_CTX = 4096
SUFFIX = 8
HERE = os.path.abspath(__file__)


def prompts(n):
    tokens = [int(t) for t in kv_tensors()[1][:n]]
    a = tokens
    b = tokens[: n - SUFFIX] + tokens[SUFFIX : 2 * SUFFIX]
    return a, b


def make_llm(model):
    from llama_cpp import Llama

    return Llama(model_path=model, n_ctx=N_CTX, n_batch=512, n_threads=os.cpu_count(), verbose=False, seed=7)


def make_cache(kind, where, llm):
    import llama_cpp

    if kind == "cxlkv":
        from cxlkv.adapters.llama_cpp import CxlkvLlamaCache

        return CxlkvLlamaCache.for_llama(llm, where)
    if kind == "disk":
        return llama_cpp.LlamaDiskCache(cache_dir=where, capacity_bytes=8 << 30)
    return llama_cpp.LlamaRAMCache(capacity_bytes=8 << 30)


def first_token(llm, prompt):
    """(seconds to the first token, the token, tokens llama.cpp evaluated) of a fresh request."""
    import llama_cpp

    llm.reset()
    llama_cpp.llama_perf_context_reset(llm.ctx)
    t = time.perf_counter()
    llm.create_completion(prompt, max_tokens=1, temperature=0.0)
    s = time.perf_counter() - t
    tok = int(llm.input_ids[llm.n_tokens - 1])
    return s, tok, llama_cpp.llama_perf_context(llm.ctx).n_p_eval


def evaluate(llm, prompt):
    """Evaluates `prompt` from scratch, without a cache."""
    llm.set_cache(None)
    llm.reset()
    llm.eval(prompt)


def store(llm, cache, prompt=None):
    """Stores the context's state as llama-cpp-python does after a completion (evaluating
    `prompt` first when given); returns (seconds of save_state + store, state bytes)."""
    if prompt is not None:
        evaluate(llm, prompt)
    t = time.perf_counter()
    state = llm.save_state()
    cache[list(llm.input_ids[: llm.n_tokens])] = state
    return time.perf_counter() - t, int(state.llama_state_size)


def held(kind, cache, where):
    if kind == "disk":
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(where) for f in fs)
    return int(cache.cache_size)


def child_main(argv):
    """A second process: `llama_rows.py child MODEL KIND WHERE N MODE [FLAGS]`; MODE `restore`
    times the request B through the cache; `share0`/`share1` first stores its own variant of the
    prompt, then (FLAGS.done0/1 files telling each other) waits for the other process's state and
    restores it. Prints one JSON line."""
    model, kind, where, n, mode = argv[0], argv[1], argv[2], int(argv[3]), argv[4]
    flags = argv[5] if len(argv) > 5 else None
    a, b = prompts(n)
    llm = make_llm(model)
    cache = make_cache(kind, where, llm)
    out = {}
    if mode.startswith("share"):
        me = int(mode[-1])
        mine = a[: n - SUFFIX] + a[SUFFIX * (2 + me) : SUFFIX * (3 + me)]
        other = a[: n - SUFFIX] + a[SUFFIX * (3 - me) : SUFFIX * (4 - me)]
        out["store_s"], _ = store(llm, cache, mine)
        open(flags + ".done%d" % me, "w").close()  # mine is stored; then wait for the other's
        deadline = time.time() + 300
        while time.time() < deadline and not os.path.exists(flags + ".done%d" % (1 - me)):
            time.sleep(0.05)
        b = other + [a[0]]
    llm.set_cache(cache)
    out["ttft_s"], out["token"], out["n_p_eval"] = first_token(llm, b)
    out["prompt"] = len(b)
    print("RESULT " + json.dumps(out))


def second_process(model, kind, where, n, mode):
    r = subprocess.run(
        [sys.executable, HERE, "child", model, kind, where, str(n), mode],
        capture_output=True, text=True, timeout=600,
    )
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError("second process failed (rc %d): %s" % (r.returncode, r.stderr[-2000:]))


def run(model, quick=False):
    import cxlkv

    if not model or not os.path.exists(model):
        return [error_row(ENGINE, "-", "all", "no GGUF: set CXLKV_MODEL or --model (scripts/fetch-model.sh)")]
    # The shared prefix must span one of CxlkvLlamaCache's index chunks (256 tokens) to be found.
    n = 384 if quick else 2048
    reps = 1 if quick else 3
    a, b = prompts(n)
    llm = make_llm(model)
    work = tempfile.mkdtemp(prefix="cxlkv-peers-llama-")
    spec = "shm:cxlkv-peers-llama-%d" % os.getpid()
    # The default configuration (8 participants, 8 partitions of 128 MiB); the ~47 MB state of
    # 2,048 tokens and its index entries fit in what one participant claims.
    pool = cxlkv.Pool.create(spec, 1 << 30)
    kinds = ["cxlkv", "ram", "disk"]
    label = {"cxlkv": "cxlkv (CxlkvLlamaCache)", "ram": "LlamaRAMCache", "disk": "LlamaDiskCache"}
    where = {"cxlkv": spec, "ram": None, "disk": os.path.join(work, "disk")}
    rows = []
    try:
        cold = Samples()
        llm.set_cache(None)
        _, cold_tok, cold_eval = first_token(llm, b)  # warm-up
        caches = {k: make_cache(k, where[k], llm) for k in kinds}
        st, ttft = {k: Samples() for k in kinds}, {k: Samples() for k in kinds}
        size, held_bytes = {}, {}
        for r in range(reps):
            llm.set_cache(None)
            s, tok, ev = first_token(llm, b)
            cold.add(s)
            if tok != cold_tok or ev < len(b):
                raise RuntimeError("cold run differs: token %d/%d, evaluated %d" % (tok, cold_tok, ev))
            order = kinds[r % 3 :] + kinds[: r % 3]
            evaluate(llm, a)  # once: each cache stores the same state
            for k in order:
                s, size[k] = store(llm, caches[k])
                st[k].add(s)
                if r == 0:  # one state stored: what the cache holds for it
                    held_bytes[k] = held(k, caches[k], where[k])
            for k in order:
                llm.set_cache(caches[k])
                s, tok, ev = first_token(llm, b)
                if tok != cold_tok or ev > SUFFIX + 1:
                    raise RuntimeError("%s: no restore or a wrong answer (token %d, cold %d; evaluated %d of %d)"
                                       % (k, tok, cold_tok, ev, len(b)))
                ttft[k].add(s)
        note = "prompt %d tokens; %d after the shared prefix" % (len(b), SUFFIX)
        rows.append(row(ENGINE, "no cache (cold)", "ttft, same process", 0, cold, note))
        for k in kinds:
            rows.append(row(ENGINE, label[k], "store state", size[k], st[k],
                            "bytes held for one state: %s" % format(held_bytes[k], ",")))
            rows.append(row(ENGINE, label[k], "ttft, same process", size[k], ttft[k], note))
        # A second process, where the cache can cross processes.
        rows.append(error_row(ENGINE, label["ram"], "ttft, second process",
                              "n/a: LlamaRAMCache is a dict in one process's memory", size["ram"]))
        for k in ("cxlkv", "disk"):
            s2 = Samples()
            for _ in range(1 if quick else 2):
                res = second_process(model, k, where[k], n, "restore")
                if res["token"] != cold_tok or res["n_p_eval"] > SUFFIX + 1:
                    raise RuntimeError("%s second process: no restore or a wrong answer: %r" % (k, res))
                s2.add(res["ttft_s"])
            rows.append(row(ENGINE, label[k], "ttft, second process", size[k], s2,
                            "a fresh process with its own Llama; the model load is not counted"))
        if not quick:
            rows += share(model, n, work, spec, label)
    finally:
        for c in locals().get("caches", {}).values():
            if hasattr(c, "close"):
                c.close()
        pool.unlink()
        pool.close()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def share(model, n, work, spec, label):
    """Two processes on one cache at once: each stores its state, then restores the other's."""
    rows = []
    rows.append(error_row(ENGINE, label["ram"], "two processes share one cache",
                          "n/a: each process has its own LlamaRAMCache"))
    for k, where in (("cxlkv", spec), ("disk", os.path.join(work, "shared-disk"))):
        flags = os.path.join(work, "share-" + k)
        procs = [subprocess.Popen([sys.executable, HERE, "child", model, k, where, str(n), "share%d" % i, flags],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
        outs = [p.communicate(timeout=600) for p in procs]
        res = []
        for p, (o, e) in zip(procs, outs):
            got = [json.loads(line[7:]) for line in o.splitlines() if line.startswith("RESULT ")]
            if p.returncode != 0 or not got:
                rows.append(error_row(ENGINE, label[k], "two processes share one cache",
                                      "a process failed (rc %d): %s" % (p.returncode, e[-500:])))
                break
            res.append(got[0])
        else:
            s = Samples()
            for r in res:
                s.add(r["ttft_s"])
            restored = all(r["n_p_eval"] <= SUFFIX + 2 for r in res)
            rows.append(row(ENGINE, label[k], "two processes share one cache", 0, s,
                            "each restored the other's state: %s (evaluated %s tokens of %d)"
                            % ("yes" if restored else "no", [r["n_p_eval"] for r in res], res[0]["prompt"])))
    return rows


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "child":
    sys.path.insert(0, os.path.dirname(HERE))
    child_main(sys.argv[2:])
