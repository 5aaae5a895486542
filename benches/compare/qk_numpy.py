#!/usr/bin/env python3
"""Q.K + top-k with numpy beside cxlkv's fused kernel, on the same data, one thread each.

numpy:  scores = K @ q   (K float16 [N, d], q float32 [d]; numpy upcasts K and calls BLAS sgemv)
        top    = argpartition(-scores, k)[:k], then sorted by score
cxlkv:  kernels/examples/qk_once (fused score + streaming top-k, cold keys), fed the same .npy files

Both sides run single-threaded (OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS = 1,
--threads 1). Caches: cxlkv flushes the keys (clflush) before every timed run; for numpy the
script sweeps a 1 GiB buffer between runs so the keys are not served from the last-level cache.
Medians of --repeats runs are compared; the script also checks that both top-k sets agree.

usage: python3 benches/compare/qk_numpy.py [--tokens 1048576] [--dim 128] [--k 256]
                                           [--repeats 5] [--seed 1] [--binary PATH]
"""

import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def numpy_topk(keys, q, k):
    scores = keys @ q
    top = np.argpartition(-scores, k - 1)[:k]
    return top[np.argsort(-scores[top], kind="stable")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--binary", help="prebuilt qk_once (default: cargo run --release)")
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    keys = rng.standard_normal((args.tokens, args.dim), dtype=np.float32).astype(np.float16)
    q = rng.standard_normal(args.dim, dtype=np.float32)
    sweep = np.ones(1 << 27, dtype=np.float64)  # 1 GiB, larger than the last-level cache

    times = []
    for _ in range(args.repeats):
        sweep.sum()
        t0 = time.perf_counter()
        top_np = numpy_topk(keys, q, args.k)
        times.append(time.perf_counter() - t0)
    np_secs = float(np.median(times))

    keys32 = keys.astype(np.float32)
    times32 = []
    for _ in range(args.repeats):
        sweep.sum()
        t0 = time.perf_counter()
        numpy_topk(keys32, q, args.k)
        times32.append(time.perf_counter() - t0)
    np32_secs = float(np.median(times32))
    del keys32

    with tempfile.TemporaryDirectory() as tmp:
        kp, qp, ip = (os.path.join(tmp, n) for n in ("keys.npy", "q.npy", "idx.npy"))
        np.save(kp, keys)
        np.save(qp, q.reshape(1, -1))
        flags = ["--keys", kp, "--queries", qp, "--k", str(args.k), "--threads", "1",
                 "--repeats", str(args.repeats), "--topk-out", ip, "--json"]
        if args.binary:
            cmd = [args.binary] + flags
        else:
            cmd = ["cargo", "run", "--quiet", "--release", "-p", "cxlkv-kernels",
                   "--example", "qk_once", "--"] + flags
        out = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout
        report = json.loads(out.strip().splitlines()[-1])
        top_ours = np.load(ip)

    ours = report["kernel_secs"]
    common = len(set(top_np.tolist()) & set(top_ours.tolist()))
    key_bytes = keys.nbytes
    print(f"N={args.tokens} d={args.dim} f16 G=1 k={args.k}, one thread each, medians of {args.repeats}")
    print(f"numpy  K(f16) @ q + argpartition : {np_secs * 1e3:9.2f} ms  {key_bytes / np_secs / 1e9:6.2f} GB/s of keys")
    print(f"numpy  K(f32) @ q + argpartition : {np32_secs * 1e3:9.2f} ms  (keys pre-converted, 2x bytes)")
    print(f"cxlkv  fused score + top-k ({report['isa']}) : {ours * 1e3:9.2f} ms  {report['key_gbps']:6.2f} GB/s"
          f"  ({100 * report['ratio']:.1f} % of streaming read {report['read_gbps']:.2f} GB/s)")
    print(f"speed-up vs numpy f16: {np_secs / ours:.2f}x   vs numpy f32 keys: {np32_secs / ours:.2f}x")
    print(f"top-{args.k} agreement: {common}/{args.k} indices in common")
    print(json.dumps({"numpy_secs": np_secs, "numpy_f32_secs": np32_secs, "cxlkv_secs": ours,
                      "speedup": np_secs / ours, "speedup_vs_f32": np32_secs / ours,
                      "topk_common": common, "k": args.k}))


if __name__ == "__main__":
    main()
