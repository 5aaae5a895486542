"""The peer benchmark: cxlkv against what a user would pick instead, row by row, through the same
interface as the peer in each row, on the same real data, interleaved, with medians, p99 and the
machine's load (docs/RESULTS.md, "Peers"). Run by scripts/bench-peers.sh, which installs the
peers first:

    python benches/peers/bench_peers.py [--quick] [--json] [--only GROUP,...]

Groups: direct (pool / Redis / Mooncake put and get, memcpy and read bandwidth), llama_cpp,
lmcache, sglang. `--quick` keeps the rows whose peers the test command installs (direct without
Mooncake, llama.cpp on a 384-token prompt) with fewer rounds.
"""

import argparse
import contextlib
import faulthandler
import json
import os
import signal
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The installed cxlkv package, not the source folder python/ (which lacks the extension).

from common import error_row, load, ratios  # noqa: E402

GROUPS = ("direct", "llama_cpp", "lmcache", "sglang")
KIB, MIB = 1 << 10, 1 << 20


def group_direct(a):
    import direct

    if a.quick:
        sizes = [64 * KIB, 256 * KIB, 4 * MIB]
        reps = {64 * KIB: 60, 256 * KIB: 40, 4 * MIB: 10}
        peers = ["redis"]
    else:
        sizes = [64 * KIB, 256 * KIB, 4 * MIB, 64 * MIB]
        reps = {64 * KIB: 300, 256 * KIB: 200, 4 * MIB: 40, 64 * MIB: 10}
        peers = ["redis", "mooncake"]
    return direct.run(sizes, reps, peers)


def group_llama_cpp(a):
    import llama_rows

    return llama_rows.run(a.model, quick=a.quick)


def group_lmcache(a):
    import lmcache_rows

    return lmcache_rows.run(quick=a.quick)


def group_sglang(a):
    import sglang_rows

    return sglang_rows.run(quick=a.quick)


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(rows):
    lines = [
        "| engine | peer | operation | bytes | bytes/s | p50 µs | p99 µs | cxlkv faster by | note |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if r.get("error"):
            lines.append("| %s | %s | %s | %s | | | | | not run: %s |" % (
                r["engine"], r["peer"], r["operation"], fmt(r["value_bytes"] or None, ","),
                r["error"].replace("|", "/").replace("\n", " ")))
            continue
        bps, ratio = r["bytes_per_s"], r["ratio_cxlkv_over_peer"]
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["engine"], r["peer"], r["operation"], fmt(r["value_bytes"] or None, ","),
            "-" if bps is None else "%.2f GB/s" % (bps / 1e9) if bps >= 1e8 else "%.1f MB/s" % (bps / 1e6),
            fmt(r["p50_us"], ",.1f"), fmt(r["p99_us"], ",.1f"),
            "-" if ratio is None else "%.2fx" % ratio, r.get("note", "")))
    return "\n".join(lines)


def main():
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints where a row hangs
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the rows the test command installs, fewer rounds")
    ap.add_argument("--json", action="store_true", help="print one JSON object with a rows array")
    ap.add_argument("--only", default=None, help="comma-separated groups: " + ",".join(GROUPS))
    ap.add_argument("--plot", default=None, help="write the figure (SVG) of the retrieval rows here")
    ap.add_argument("--model", default=os.environ.get("CXLKV_MODEL"), help="the SmolLM2 GGUF (scripts/fetch-model.sh)")
    a = ap.parse_args()
    groups = GROUPS if a.only is None else tuple(a.only.split(","))
    if a.quick and a.only is None:
        groups = ("direct", "llama_cpp")
    for g in groups:
        if g not in GROUPS:
            ap.error("unknown group %r (groups: %s)" % (g, ", ".join(GROUPS)))
    started = time.time()
    before = load()
    rows = []
    for g in groups:
        t = time.time()
        try:
            # Engines print (llama-cpp-python's disk cache, LMCache's logs): stdout is the table's.
            with contextlib.redirect_stdout(sys.stderr):
                rows += globals()["group_" + g](a)
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            rows.append(error_row(g, "-", "all", "%s: %s" % (type(e).__name__, e)))
        print("peers: %s in %.1f s" % (g, time.time() - t), file=sys.stderr)
    ratios(rows)
    out = {
        "command": "scripts/bench-peers.sh" + (" --quick" if a.quick else "") + (" --only " + a.only if a.only else ""),
        "quick": a.quick,
        "load_before": before,
        "load_after": load(),
        "seconds": time.time() - started,
        "cpu": _cpu(),
        "rows": rows,
    }
    if a.plot:
        import figure

        with open(a.plot, "w") as f:
            f.write(figure.svg(figure.bars(rows), figure.title(out)))
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print(table(rows))
        print("\nload average before %s, after %s; %d CPUs; %.0f s" % (
            before["loadavg"], out["load_after"]["loadavg"], before["cpus"], out["seconds"]))
    failed = [r for r in rows if r.get("error") and r["peer"] in ("-", "cxlkv")]
    return 1 if failed else 0


def _cpu():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


if __name__ == "__main__":
    sys.exit(main())
