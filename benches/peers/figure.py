"""The peer benchmark's figure: for each retrieval row (get, restore, lookup), how many times
faster cxlkv is than the peer (log scale; right of the line at 1: cxlkv faster). Plain SVG, no
plotting library:

    python benches/peers/figure.py RUN.json docs/figures/peers.svg
    (or bench_peers.py --plot docs/figures/peers.svg)
"""

import json
import math
import sys

RETRIEVAL = ("get", "ttft", "contains", "exists", "second process hit")


def bars(rows):
    out = []
    for r in rows:
        ratio = r.get("ratio_cxlkv_over_peer")
        if not ratio or r["peer"].startswith(("memcpy", "read")):
            continue
        if not any(w in r["operation"] for w in RETRIEVAL):
            continue
        size = r["value_bytes"]
        label = "%s: %s, %s%s" % (
            r["engine"].split(" (")[0], r["peer"].split(" (")[0], r["operation"],
            (", %s" % human(size)) if size and "ttft" not in r["operation"] else "")
        out.append((label, ratio))
    return out


def human(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%s B" % format(n, ",")


def svg(items, title):
    lo, hi = 0.1, 100.0
    for _, r in items:
        lo, hi = min(lo, r / 1.5), max(hi, r * 1.5)
    lw, bw, rh, top = 430, 420, 18, 48
    w, h = lw + bw + 60, top + rh * len(items) + 40

    def x(v):
        return lw + bw * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    esc = lambda s: s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # noqa: E731
    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">' % (w, h),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="10" y="18" font-size="13">%s</text>' % esc(title)]
    decade = 10 ** math.floor(math.log10(lo))
    while decade <= hi:
        if decade >= lo:
            o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ccc"/>' % (x(decade), top - 6, x(decade), h - 30))
            o.append('<text x="%.1f" y="%d" text-anchor="middle">%gx</text>' % (x(decade), h - 16, decade))
        decade *= 10
    for i, (label, r) in enumerate(items):
        y = top + i * rh
        x0, x1 = sorted((x(1), x(r)))
        color = "#2a7" if r >= 1 else "#d54"
        o.append('<text x="%d" y="%d" text-anchor="end">%s</text>' % (lw - 6, y + 12, esc(label)))
        o.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>' % (x0, y + 2, max(x1 - x0, 1), rh - 5, color))
        o.append('<text x="%.1f" y="%d">%.2fx</text>' % (max(x(r), x(1)) + 4, y + 12, r))
    o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>' % (x(1), top - 6, x(1), h - 30))
    o.append('<text x="%d" y="%d">cxlkv faster by (peer p50 / cxlkv p50; green: cxlkv faster)</text>' % (lw, h - 4))
    o.append("</svg>")
    return "\n".join(o) + "\n"


def title(run):
    return "cxlkv against its peers on retrieval (%s, %d CPUs, load %.1f)" % (
        run.get("cpu") or "?", run["load_before"]["cpus"], run["load_before"]["loadavg"][0])


def main():
    run = json.load(open(sys.argv[1]))
    items = bars(run["rows"])
    with open(sys.argv[2], "w") as f:
        f.write(svg(items, title(run)))
    print("%s: %d bars" % (sys.argv[2], len(items)))


if __name__ == "__main__":
    main()
