"""The llama.cpp adapter (`cxlkv.adapters.llama_cpp.CxlkvLlamaCache`) against the real
llama-cpp-python and the real SmolLM2-135M-Instruct GGUF ($CXLKV_MODEL, else
scripts/fetch-model.sh), each run in a fresh process:

- cold: prompt P2 (a document of >= 2,000 tokens, then question 2) without a cache;
- A: prompt P1 (the same document, question 1) with the cache, which stores its state;
- B: P2 with the cache: restores A's state, so llama.cpp's prompt-eval counter (`n_p_eval` of
  `llama_perf_context`) counts only the tokens after the shared prefix; B's greedy output equals
  the cold run's; the time to first token of B and of the cold run are printed;
- a SIGKILL of A while its state is being put (a thread in A kills A at a delay after the put has
  started, with the GIL released in the copy) leaves nothing B can restore: B then evaluates the
  whole prompt and still answers as the cold run; the pool checks clean.

scripts/setup-engines.sh installs llama-cpp-python into the test venv; without it this file is
skipped, saying so.
"""

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip(
    "llama_cpp",
    reason="llama-cpp-python is not installed (scripts/setup-engines.sh installs it into the test venv)",
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_CTX = 3072
MAX_TOKENS = 16


def document():
    """A deterministic document of about 2,300 tokens (a made-up inventory) and two questions."""
    colors = ["red", "green", "blue", "amber", "violet", "white", "black", "silver"]
    places = ["Oslo", "Lima", "Kyoto", "Perth", "Quito", "Accra", "Hanoi", "Tunis", "Riga"]
    lines = []
    for i in range(1, 121):
        lines.append(
            "Crate %d holds %d %s lamps shipped from %s on day %d."
            % (
                i,
                (i * 37) % 91 + 3,
                colors[i % len(colors)],
                places[(i * 5) % len(places)],
                (i * 11) % 28 + 1,
            )
        )
    doc = "Inventory log of the harbor warehouse.\n" + "\n".join(lines) + "\n\n"
    return doc


P1 = document() + "Question: Which city shipped crate 7? Answer:"
P2 = document() + "Question: How many lamps does crate 12 hold? Answer:"


def model_path():
    p = os.environ.get("CXLKV_MODEL")
    if p and os.path.exists(p):
        return p
    r = subprocess.run(
        [os.path.join(ROOT, "scripts", "fetch-model.sh")], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.fail("scripts/fetch-model.sh failed:\n" + r.stderr)
    return r.stdout.strip().splitlines()[-1]


def child(mode, prompt_name, spec, kill_delay_ms=None, src=None):
    """Runs this file as a child process (`main` below); returns (returncode, json dict or None,
    stdout, stderr)."""
    env = dict(os.environ)
    env["CXLKV_MODEL"] = model_path()
    args = [sys.executable, os.path.abspath(__file__), mode, prompt_name, spec or "-"]
    args += [src or "-", "-" if kill_delay_ms is None else str(kill_delay_ms)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    result = None
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
    return r.returncode, result, r.stdout, r.stderr


def ok_child(*a, **kw):
    rc, res, out, err = child(*a, **kw)
    assert rc == 0 and res is not None, "child %r failed (rc %s):\n%s\n%s" % (
        a,
        rc,
        out,
        err[-4000:],
    )
    return res


def make_pool(tag):
    import cxlkv

    s = "shm:cxlkv-llama-%d-%s" % (os.getpid(), tag)
    # 1 GiB of shm (touched lazily), 256 KiB blocks: a state (tens of MB) is a multi-block
    # object, visible only whole.
    cxlkv.Pool.create(s, 1 << 30, participants=4).close()
    return s


@pytest.fixture(scope="module")
def pools():
    import cxlkv

    specs = []

    def make(tag):
        specs.append(make_pool(tag))
        return specs[-1]

    yield make
    for s in specs:
        try:
            cxlkv.unlink(s)
        except cxlkv.Error:
            pass


@pytest.fixture(scope="module")
def cold():
    """The cold run of P2 in a fresh process, without a cache (shared by the tests)."""
    return ok_child("cold", "P2", None)


@pytest.fixture(scope="module")
def a_run(pools):
    """Process A: P1 with the cache on a fresh pool; (the pool, A's result)."""
    s = pools("a")
    a = ok_child("cache", "P1", s)
    assert a["hit"] is None, "A ran on an empty pool yet restored a state: %r" % a["hit"]
    assert a["stored_bytes"] > 0
    return s, a


def test_second_process_restores_prefix_instead_of_prefill(cold, a_run):
    assert cold["prompt_tokens"] >= 2000, cold["prompt_tokens"]
    s, a = a_run
    b = ok_child("cache", "P2", s)
    print(
        "\ncold: %d prompt tokens, n_p_eval %d, TTFT %.3f s | B: n_p_eval %d, TTFT %.3f s "
        "(cold/B %.1fx), restored %r | A put %.1f MB in %.3f s"
        % (
            cold["prompt_tokens"],
            cold["n_p_eval"],
            cold["ttft_s"],
            b["n_p_eval"],
            b["ttft_s"],
            cold["ttft_s"] / b["ttft_s"],
            b["hit"],
            a["stored_bytes"] / 1e6,
            a["put_s"],
        )
    )
    # B's greedy answer is the cold run's, token for token.
    assert b["completion_ids"] == cold["completion_ids"], (b["text"], cold["text"])
    assert b["text"] == cold["text"]
    # B restored A's state: llama.cpp evaluated only the tokens after the shared prefix.
    assert b["hit"] is not None and b["hit"]["state_tokens"] >= 2000
    shared = len(os.path.commonprefix([a["prompt_ids"], b["prompt_ids"]]))
    assert shared >= 2000
    assert cold["n_p_eval"] >= cold["prompt_tokens"]
    assert b["n_p_eval"] == b["prompt_tokens"] - shared, (b["n_p_eval"], b["prompt_tokens"], shared)


def test_sigkill_of_a_during_its_put_leaves_no_torn_state(pools, cold, a_run):
    """A process restores A's real state from A's pool and puts it, through the adapter, into a
    fresh pool; a thread in it SIGKILLs it at a point inside that put. A process B then finds
    nothing to restore there (no torn state) and the pool checks clean; after a whole put of the
    same state into that pool, B restores it and answers as the cold run."""
    import cxlkv

    src, a = a_run
    put_ms = a["put_s"] * 1000
    killed_mid_put = 0
    for n, frac in enumerate((0.1, 0.5)):
        dst = pools("kill%d" % n)
        delay = max(0.2, put_ms * frac)
        rc, _, out, err = child("copy", "P1", dst, kill_delay_ms=delay, src=src)
        assert rc == -9, "the copier was to be killed by SIGKILL, exited %s:\n%s\n%s" % (
            rc,
            out,
            err[-3000:],
        )
        mid_put = "PUT-ENTERED" in out and "PUT-RETURNED" not in out
        killed_mid_put += mid_put
        with cxlkv.Pool.open(dst) as pool:
            report = pool.check()
            assert report["ok"], report["errors"]
        probe = ok_child("probe", "P2", dst)
        if mid_put:
            # Killed inside the put: the state never became visible; B finds nothing.
            assert probe["hit"] is None, probe["hit"]
        # (Killed after the put: B may find the state, whole: a hit is digest-checked.)
        print(
            "\nkill at %.1f ms of a %.1f ms put: inside the put %s, B's lookup found %r"
            % (delay, put_ms, mid_put, probe["hit"])
        )
    assert killed_mid_put >= 1, "no kill landed inside a put (put took %.1f ms)" % put_ms
    # The same pool after the crash: a whole put, then B restores and answers as the cold run.
    ok_child("copy", "P1", dst, src=src)
    b = ok_child("cache", "P2", dst)
    assert b["hit"] is not None
    assert b["completion_ids"] == cold["completion_ids"], (b["text"], cold["text"])
    assert b["n_p_eval"] < cold["n_p_eval"] // 10


# --- the child process ------------------------------------------------------------------------


def main(argv):
    """cold: P without a cache; cache: P with the cache on `spec`; copy: restore the state of
    P's prefix from the pool `src` and put it into `spec` through the adapter (killed
    `kill_delay_ms` after the put starts, when given); probe: look P up in `spec`'s cache."""
    import threading

    import llama_cpp
    from llama_cpp import Llama

    mode, prompt_name, spec, src, kill = argv[:5]
    kill_delay_ms = None if kill == "-" else float(kill)
    prompt = {"P1": P1, "P2": P2}[prompt_name]
    llm = Llama(model_path=os.environ["CXLKV_MODEL"], n_ctx=N_CTX, verbose=False, seed=1)
    prompt_ids = llm.tokenize(prompt.encode())
    cache = None
    put_s = [0.0]
    if mode != "cold":
        from cxlkv.adapters.llama_cpp import CxlkvLlamaCache

        cache = CxlkvLlamaCache.for_llama(llm, spec)
        real = cache.me

        class Timed:
            """The participant, with its big put timed (and, in a kill run, a SIGKILL of this
            process `kill_delay_ms` after that put started)."""

            def __getattr__(self, name):
                return getattr(real, name)

            def put(self, key, data):
                print("PUT-ENTERED", flush=True)
                if kill_delay_ms is not None:

                    def kill():
                        time.sleep(kill_delay_ms / 1000)
                        os.kill(os.getpid(), 9)

                    threading.Thread(target=kill, daemon=True).start()
                t0 = time.perf_counter()
                real.put(key, data)
                put_s[0] += time.perf_counter() - t0
                print("PUT-RETURNED", flush=True)

        cache.me = Timed()
    res = {"prompt_tokens": len(prompt_ids), "prompt_ids": [int(t) for t in prompt_ids]}
    if mode == "copy":
        state = CxlkvLlamaCache.for_llama(llm, src)[prompt_ids]
        cache[state.input_ids[: state.n_tokens]] = state
    elif mode == "probe":
        try:
            cache[prompt_ids]
        except KeyError:
            pass
    else:
        if cache is not None:
            llm.set_cache(cache)
        llama_cpp.llama_perf_context_reset(llm.ctx)
        t0 = time.perf_counter()
        ttft = None
        text = ""
        for chunk in llm.create_completion(
            prompt, max_tokens=MAX_TOKENS, temperature=0.0, stream=True
        ):
            if ttft is None:
                ttft = time.perf_counter() - t0
            text += chunk["choices"][0]["text"]
        perf = llama_cpp.llama_perf_context(llm.ctx)
        ids = [int(t) for t in llm.input_ids[: llm.n_tokens]]
        res.update(
            completion_ids=ids[len(prompt_ids) :],
            text=text,
            ttft_s=ttft,
            n_p_eval=perf.n_p_eval,
            n_eval=perf.n_eval,
        )
    res.update(
        hit=cache.last_hit if cache else None,
        stored_bytes=cache.cache_size if cache else 0,
        put_s=put_s[0],
    )
    print("RESULT " + json.dumps(res), flush=True)
    if kill_delay_ms is not None:
        time.sleep(60)  # the kill comes during or after the put, never after a clean exit


if __name__ == "__main__":
    main(sys.argv[1:])
