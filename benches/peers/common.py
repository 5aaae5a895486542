"""What every row group of the peer benchmark shares: the real KV bytes, timing, the row record."""

import os
import statistics
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KV_DIR = os.path.join(ROOT, "data", "kv", "smollm2_devil_2048")


def kv_tensors():
    """The real SmolLM2-135M K/V of data/kv (layers 4 and 17, 2,048 tokens) as KV_2LTD
    `[2, layers, tokens, kv_heads * head_dim]` float16, and the text's token ids."""
    tokens = np.load(os.path.join(KV_DIR, "tokens.npy")).astype(np.int64)
    layers = [
        np.load(os.path.join(KV_DIR, "layer%s_%s.npy" % (l, w))) for l in ("04", "17") for w in "kv"
    ]
    kvh, t, hd = layers[0].shape

    def td(a):  # [kv_heads, tokens, head_dim] -> [tokens, kv_heads * head_dim]
        return np.ascontiguousarray(a.transpose(1, 0, 2).reshape(t, kvh * hd))

    k = np.stack([td(layers[0]), td(layers[2])])
    v = np.stack([td(layers[1]), td(layers[3])])
    return np.ascontiguousarray(np.stack([k, v])), tokens


def kv_bytes(n, seed=0):
    """`n` bytes of real KV (the K/V tensors, tiled), starting `seed` KiB in: different seeds give
    different values of the same size."""
    flat = kv_tensors()[0].reshape(-1).view(np.uint8)
    start = (seed * 4096) % len(flat)
    reps = (start + n + len(flat) - 1) // len(flat)
    return np.ascontiguousarray(np.tile(flat, reps)[start : start + n])


class Samples:
    """Seconds per operation of one side of a row, collected interleaved with the other sides."""

    def __init__(self):
        self.s = []

    def add(self, seconds):
        self.s.append(seconds)

    def time(self, fn, *args):
        t = time.perf_counter()
        out = fn(*args)
        self.add(time.perf_counter() - t)
        return out

    def p50(self):
        return statistics.median(self.s)

    def p99(self):
        s = sorted(self.s)
        return s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]


def row(engine, peer, operation, value_bytes, samples, note=""):
    """One table row; `ratio_cxlkv_over_peer` is filled by `ratios`."""
    p50 = samples.p50()
    return {
        "engine": engine,
        "peer": peer,
        "operation": operation,
        "value_bytes": value_bytes,
        "bytes_per_s": (value_bytes / p50) if value_bytes and p50 > 0 else None,
        "p50_us": p50 * 1e6,
        "p99_us": samples.p99() * 1e6,
        "samples": len(samples.s),
        "ratio_cxlkv_over_peer": None,
        "note": note,
    }


def error_row(engine, peer, operation, error, value_bytes=0):
    """A row whose peer could not be installed or run: the exact error, no figures."""
    return {
        "engine": engine,
        "peer": peer,
        "operation": operation,
        "value_bytes": value_bytes,
        "bytes_per_s": None,
        "p50_us": None,
        "p99_us": None,
        "samples": 0,
        "ratio_cxlkv_over_peer": None,
        "error": error,
        "note": "",
    }


def ratios(rows):
    """Sets each non-cxlkv row's `ratio_cxlkv_over_peer`: how many times faster cxlkv is than that
    peer on the same engine, operation and size, from medians (peer p50 / cxlkv p50; equal to the
    bytes/s ratio where there are bytes). Above 1: cxlkv is faster. A ceiling row (memcpy) gets
    the fraction of the ceiling cxlkv reaches. A row without bytes (the cold request) is compared
    with cxlkv's row of the same operation."""
    ours = {
        (r["engine"], r["operation"], r["value_bytes"]): r
        for r in rows
        if r["peer"].startswith("cxlkv") and r.get("p50_us")
    }
    by_op = {(e, op): r for (e, op, _), r in ours.items()}
    for r in rows:
        c = ours.get((r["engine"], r["operation"], r["value_bytes"]))
        if c is None and not r["value_bytes"]:  # a row without bytes (no cache): any size
            c = by_op.get((r["engine"], r["operation"]))
        if c is None or r is c or not r.get("p50_us"):
            continue
        r["ratio_cxlkv_over_peer"] = r["p50_us"] / c["p50_us"]
    return rows


def load():
    """The machine's load average (1, 5, 15 min) and CPU count, recorded with each run."""
    return {"loadavg": list(os.getloadavg()), "cpus": os.cpu_count()}
