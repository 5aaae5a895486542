"""Throughput of the Python package against the limits measured in the same run:

1. batched get of 256 KiB blocks into one numpy array (`batch_get_into`, a row per key) against the
   same gets through the Rust API (`Participant::get_into` in a Rust loop, no interpreter between
   gets, same destination rows);
2. single gets of the same 256 KiB blocks into one numpy array (`get_into`, one Python call per
   block) against memcpy of the same bytes in the same order into one buffer (Rust
   `copy_from_slice`), the floor of any copy;
3. `get_into` of a 64 MiB multi-block object (256 parts of 256 KiB) into one numpy array against
   memcpy of 64 MiB between two numpy arrays (Rust `copy_from_slice`), target >= 0.8. The object
   get checks every part's CRC-32C, as every get of a block does.

    python python/bench.py [--blocks 64] [--repeats 40] [--json]

The Rust reference loops are not in the released wheel; install the package with them first:

    MATURIN_PEP517_ARGS="--features bench-loops" pip install ./python

The two sides of each comparison run back to back (order alternating), `repeats` times; the bench
prints the median of the per-pair ratios (each pair saw the same machine state) and the ratio of
the best rounds. A get is more than a copy: it probes the
index, copies the block header and payload, checks the payload's CRC-32C and re-reads the slot
version, so ratio 2 measures that work too, not Python's overhead alone.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

# The installed package, not the source folder beside this script (which lacks the extension).
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
import cxlkv  # noqa: E402

BLOCK = 256 << 10


def best(fn, repeats):
    return min(fn() for _ in range(repeats))


def main():
    if not hasattr(cxlkv._cxlkv, "_bench_rust_get"):
        sys.exit(
            "bench.py: this cxlkv was built without its Rust reference loops; reinstall it with\n"
            '    MATURIN_PEP517_ARGS="--features bench-loops" pip install ./python'
        )
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=64, help="256 KiB blocks per batch")
    ap.add_argument("--rounds", type=int, default=8, help="batches per timed round")
    ap.add_argument("--repeats", type=int, default=40, help="timed rounds per side")
    ap.add_argument("--object-mib", type=int, default=64, help="size of the multi-block object")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    spec = "shm:cxlkv-pybench-%d" % os.getpid()
    n = a.blocks
    obj_bytes = a.object_mib << 20
    # Two partitions, each with room for the blocks and for the object (256 KiB parts, a manifest).
    size = (2 * n + 64) * BLOCK * 2 + 2 * (obj_bytes + 16 * BLOCK)
    pool = cxlkv.Pool.create(spec, size, block_size=BLOCK, participants=2)
    try:
        me = pool.attach()
        keys = [cxlkv.Key(i + 1) for i in range(n)]
        rng = np.random.default_rng(1)
        data = rng.integers(0, 256, (n, BLOCK), dtype=np.uint8)
        me.batch_put(keys, list(data))
        dst = np.zeros((n, BLOCK), np.uint8)
        assert me.batch_get_into(keys, dst) == [BLOCK] * n and np.array_equal(dst, data)

        def py_batch():
            t = time.perf_counter()
            for _ in range(a.rounds):
                me.batch_get_into(keys, dst)
            return (time.perf_counter() - t) / (a.rounds * n)

        def rust_batch():
            return cxlkv._cxlkv._bench_rust_get(me, keys, dst, a.rounds) / (a.rounds * n)

        row = np.zeros(BLOCK, np.uint8)

        def py_single():
            t = time.perf_counter()
            for _ in range(a.rounds):
                for k in keys:
                    me.get_into(k, row)
            return (time.perf_counter() - t) / (a.rounds * n)

        out = np.zeros(BLOCK, np.uint8)

        def memcpy():  # the same pattern: each block's bytes in turn into one 256 KiB buffer
            return cxlkv._cxlkv._bench_memcpy(data, out, a.rounds) / (a.rounds * n)

        obj = rng.integers(0, 256, obj_bytes, dtype=np.uint8)
        me.put("bench object", obj)
        assert me.length("bench object") == obj_bytes
        obj_dst = np.zeros(obj_bytes, np.uint8)
        obj_copy = np.zeros(obj_bytes, np.uint8)

        def py_object():
            t = time.perf_counter()
            me.get_into("bench object", obj_dst)
            return time.perf_counter() - t

        def memcpy_object():
            return cxlkv._cxlkv._bench_memcpy(obj, obj_copy, 1)

        # Warm up, then time the two sides of each pair back to back (order alternating), many
        # times: each pair's ratio sees the same machine state.
        for f in (py_batch, rust_batch, py_single, memcpy, py_object, memcpy_object):
            f()
        pairs = {"batch": (py_batch, rust_batch), "single": (py_single, memcpy), "object": (py_object, memcpy_object)}
        times = {"py_batch": [], "rust_batch": [], "py_single": [], "memcpy": [], "py_object": [], "memcpy_object": []}
        ratios = {"batch": [], "single": [], "object": []}
        for i in range(a.repeats):
            for name, (pkg, ref) in pairs.items():
                if i % 2:
                    r, p = ref(), pkg()
                else:
                    p, r = pkg(), ref()
                times[pkg.__name__].append(p)
                times[ref.__name__].append(r)
                ratios[name].append(r / p)
        t = {k: min(v) for k, v in times.items()}
        gbs = {k: (obj_bytes if "object" in k else BLOCK) / v / 1e9 for k, v in t.items()}
        report = {
            "block_bytes": BLOCK,
            "blocks_per_batch": n,
            "repeats": a.repeats,
            "best_us_per_block": {k: v * 1e6 for k, v in t.items()},
            "best_GB_per_s": gbs,
            "batched_get_vs_rust_api": {"median": statistics.median(ratios["batch"]), "of_best": t["rust_batch"] / t["py_batch"]},
            "single_get_vs_memcpy": {"median": statistics.median(ratios["single"]), "of_best": t["memcpy"] / t["py_single"]},
            "object_bytes": obj_bytes,
            "object_get_vs_memcpy": {"median": statistics.median(ratios["object"]), "of_best": t["memcpy_object"] / t["py_object"]},
        }
        assert np.array_equal(dst, data) and np.array_equal(row, data[-1]) and np.array_equal(out, data[-1])
        assert np.array_equal(obj_dst, obj) and np.array_equal(obj_copy, obj)
        me.detach()
    finally:
        pool.close()
        cxlkv.unlink(spec)

    if a.json:
        print(json.dumps(report, indent=2))
        return
    b, g = report["batched_get_vs_rust_api"], report["single_get_vs_memcpy"]
    print("256 KiB blocks, %d per batch; %d back-to-back pairs per comparison" % (n, a.repeats))
    print("  batched get into numpy (package)   %7.2f GB/s  %6.1f us/block (best)" % (gbs["py_batch"], t["py_batch"] * 1e6))
    print("  same gets via the Rust API         %7.2f GB/s  %6.1f us/block (best)" % (gbs["rust_batch"], t["rust_batch"] * 1e6))
    print("  -> package / Rust API              %7.3f x median of pairs, %.3f x of best (target >= 0.9)" % (b["median"], b["of_best"]))
    print("  single get_into numpy (package)    %7.2f GB/s  %6.1f us/block (best)" % (gbs["py_single"], t["py_single"] * 1e6))
    print("  memcpy of the same 256 KiB blocks  %7.2f GB/s  %6.1f us/block (best)" % (gbs["memcpy"], t["memcpy"] * 1e6))
    print("  -> single get / memcpy             %7.3f x median of pairs, %.3f x of best" % (g["median"], g["of_best"]))
    o = report["object_get_vs_memcpy"]
    print("%d MiB object (%d parts of 256 KiB)" % (obj_bytes >> 20, obj_bytes // BLOCK))
    print("  get_into numpy (package)           %7.2f GB/s  %6.1f ms (best)" % (gbs["py_object"], t["py_object"] * 1e3))
    print("  memcpy of the same bytes           %7.2f GB/s  %6.1f ms (best)" % (gbs["memcpy_object"], t["memcpy_object"] * 1e3))
    print("  -> object get / memcpy             %7.3f x median of pairs, %.3f x of best (target >= 0.8)" % (o["median"], o["of_best"]))

if __name__ == "__main__":
    main()
