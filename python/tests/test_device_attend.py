"""Tests of the device's ATTEND (`Device.attend`, `Device.merge_partials`) and SCORE_TOPK selection
(`sinks`, `window`, `exclude`, `top_p` with `k` as the cap) from Python, against numpy references.

Every check runs on the host path inside this process (the client's fallback: no device attached,
the same code the device's answers are defined by) and on a `cxlkv-ndpd` process serving the pool
(from $CXLKV_NDPD, else the repository's target/debug or target/release; skipped, saying why,
without one). On the device the answers must equal the host's exactly; against numpy the stated
tolerances hold.

    python -m pytest python/tests/test_device_attend.py -q
"""

import threading
import time

import numpy as np
import pytest

import cxlkv
from conftest import ndpd_binary, start_ndpd, stop_ndpd

# Real shape: head dim 64, 4 blocks of 128 tokens, 2 KV heads, a GQA group of 4 queries, float16.
DIM, TOKENS, NBLOCKS, GROUP, HEADS = 64, 128, 4, 4, 2
SEQ, LAYER, HEAD = 7, 3, 1
ARGS = dict(sequence=SEQ, layer=LAYER, kv_head=HEAD, dtype="f16")
# Attention output vs numpy (float64 over the same float16 K/V): |got - ref| <= ATOL + RTOL * |ref|.
ATOL, RTOL = 2e-5, 1e-4
# Left-out softmax mass vs numpy (float64), absolute.
MASS_TOL = 1e-5


class Setup:
    """A pool holding one sequence's K/V of layer LAYER as NBLOCKS typed float16 blocks, and a
    device client; `k`, `v`: the stored head HEAD as float64 `[tokens, dim]`."""

    def __init__(self, spec, rng_seed, ndpd):
        rng = np.random.default_rng(rng_seed)
        ks = rng.standard_normal((NBLOCKS, HEADS, TOKENS, DIM)).astype(np.float16)
        vs = rng.standard_normal((NBLOCKS, HEADS, TOKENS, DIM)).astype(np.float16)
        self.pool = cxlkv.Pool.create(spec, 64 << 20, block_size=256 << 10, participants=3)
        self.me = self.pool.attach()
        self.blocks = []
        for i in range(NBLOCKS):
            key = "seq%d-l%d-%d" % (SEQ, LAYER, i)
            self.me.put_kv(key, ks[i], vs[i], layer=LAYER, sequence=SEQ, token_offset=i * TOKENS)
            self.blocks.append((key, i * TOKENS))
        self.k = ks[:, HEAD].reshape(-1, DIM).astype(np.float64)
        self.v = vs[:, HEAD].reshape(-1, DIM).astype(np.float64)
        # Peaky enough that top-p sets are small, flat enough that they hold several tokens.
        self.q = (3 * rng.standard_normal((GROUP, DIM))).astype(np.float32)
        self.proc = None
        if ndpd is not None:
            self.proc = start_ndpd(ndpd, spec)
        self.dev = self.me.device(timeout_ms=2000 if ndpd else 100)
        if ndpd is not None:
            deadline = time.monotonic() + 20
            while True:  # the device needs a moment to come up; until then the host answers
                got = self.dev.attend(self.q, DIM, self.blocks, **ARGS)
                if got["stats"]["on_device"] or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            assert got["stats"]["on_device"], got["stats"]

    def close(self):
        self.dev.close()
        if self.proc is not None:
            stop_ndpd(self.proc)
        self.me.detach()
        self.pool.close()


@pytest.fixture(params=["in-process host", "cxlkv-ndpd"])
def setup(request, spec):
    ndpd = None
    if request.param == "cxlkv-ndpd":
        ndpd = ndpd_binary()
        if ndpd is None:
            pytest.skip("no cxlkv-ndpd binary (set CXLKV_NDPD or `cargo build -p cxlkv-ndp`)")
    s = Setup(spec, 11, ndpd)
    s.on_device = ndpd is not None
    try:
        yield s
    finally:
        s.close()


def softmax_ref(q, k, v, scale):
    """numpy float64 reference: scaled scores, their max, sum of exps, softmax output."""
    s = scale * (k @ q.astype(np.float64))
    m = s.max()
    w = np.exp(s - m)
    return s, m, w.sum(), (w @ v) / w.sum()


def test_attend_matches_numpy_softmax(setup):
    d, scale = setup.dev, 1 / np.sqrt(DIM)
    got = d.attend(setup.q, DIM, setup.blocks, **ARGS)
    assert got["stats"]["on_device"] == setup.on_device, got["stats"]
    assert got["out"].shape == (GROUP, DIM) and got["out"].dtype == np.float32
    assert got["max"].shape == (GROUP,) and got["sum"].shape == (GROUP,)
    for g in range(GROUP):
        s, m, total, out = softmax_ref(setup.q[g], setup.k, setup.v, scale)
        assert abs(got["max"][g] - m) <= 1e-5 * max(1.0, abs(m))
        assert abs(got["sum"][g] - total) <= 1e-4 * total
        assert np.allclose(got["output"][g], out, rtol=RTOL, atol=ATOL), np.abs(got["output"][g] - out).max()
        assert np.allclose(got["out"][g] / got["sum"][g], out, rtol=RTOL, atol=ATOL)
    # The device's partials are the host fallback's, bit for bit (same kernel, same block order).
    ref = d.attend(setup.q, DIM, setup.blocks, host=True, **ARGS)
    assert ref["stats"]["path"] == "host (Forced)"
    for name in ("out", "max", "sum", "output"):
        assert np.array_equal(got[name], ref[name]), name
    # An explicit scale is applied to q·k before exp.
    half = d.attend(setup.q, DIM, setup.blocks, scale=0.5 * scale, **ARGS)
    _, m, _, out = softmax_ref(setup.q[0], setup.k, setup.v, 0.5 * scale)
    assert abs(half["max"][0] - m) <= 1e-5 * max(1.0, abs(m))
    assert np.allclose(half["output"][0], out, rtol=RTOL, atol=ATOL)


def test_partials_merge_to_the_whole(setup):
    d = setup.dev
    whole = d.attend(setup.q, DIM, setup.blocks, **ARGS)
    first = d.attend(setup.q, DIM, setup.blocks[:1], **ARGS)
    rest = d.attend(setup.q, DIM, setup.blocks[1:], **ARGS)
    empty = {"out": np.zeros((GROUP, DIM), np.float32), "max": np.full(GROUP, -np.inf, np.float32),
             "sum": np.zeros(GROUP, np.float32)}
    merged = cxlkv.Device.merge_partials([first, empty, rest])
    assert np.allclose(merged["output"], whole["output"], rtol=RTOL, atol=ATOL)
    assert np.array_equal(merged["max"], whole["max"])
    assert np.allclose(merged["sum"], whole["sum"], rtol=1e-5)
    # The documented formula, in numpy, gives the same.
    m = np.maximum(first["max"], rest["max"])
    a, b = np.exp(first["max"] - m), np.exp(rest["max"] - m)
    total = a * first["sum"] + b * rest["sum"]
    out = (a[:, None] * first["out"] + b[:, None] * rest["out"]) / total[:, None]
    assert np.allclose(out, merged["output"], rtol=1e-5, atol=1e-6)
    with pytest.raises(cxlkv.BadInputError):
        cxlkv.Device.merge_partials([])
    with pytest.raises(cxlkv.BadInputError):
        cxlkv.Device.merge_partials([first, {"out": first["out"][:, :16], "max": first["max"], "sum": first["sum"]}])
    with pytest.raises(cxlkv.BadInputError):
        cxlkv.Device.merge_partials([{"out": first["out"]}])


def mass_ref(setup, g, scale, exclude=None):
    """Scores of query g (float64) and softmax weights over the stored tokens less `exclude`."""
    s = setup.k @ setup.q[g].astype(np.float64)
    keep = np.ones(len(s), bool)
    if exclude is not None:
        keep[exclude[0]:exclude[1]] = False
    z = scale * s
    w = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    return s, w / w.sum(), keep


def test_top_p_returns_the_smallest_set_reaching_p(setup):
    d, scale, kmax = setup.dev, 1 / np.sqrt(DIM), 512
    for g in range(GROUP):
        s, w, _ = mass_ref(setup, g, scale)
        order = np.argsort(-s, kind="stable")
        cs = np.cumsum(w[order])
        n = int(np.searchsorted(cs, 0.8)) + 1  # the smallest n with mass >= 0.8
        assert 2 <= n < kmax
        # p midway between the masses of n-1 and n tokens: robust to float rounding.
        p = float((cs[n - 2] + cs[n - 1]) / 2)
        q = setup.q[g:g + 1]
        got = d.score_topk(q, DIM, setup.blocks, k=kmax, top_p=p, **ARGS)
        assert got["stats"]["on_device"] == setup.on_device, got["stats"]
        assert list(got["counts"]) == [n]
        assert got["indices"].shape == (1, n)
        assert set(got["indices"][0]) == set(order[:n])
        assert np.allclose(got["scores"][0], s[got["indices"][0]], rtol=1e-4, atol=1e-3)
        assert np.all(np.diff(got["scores"][0]) <= 0)  # best first
        assert abs(got["left_out_mass"][0] - (1 - cs[n - 1])) <= MASS_TOL
        # k caps the set: k_max below n returns k tokens and leaves out the rest's mass.
        cap = d.score_topk(q, DIM, setup.blocks, k=n - 1, top_p=p, **ARGS)
        assert list(cap["counts"]) == [n - 1] and set(cap["indices"][0]) == set(order[:n - 1])
        assert abs(cap["left_out_mass"][0] - (1 - cs[n - 2])) <= MASS_TOL
        # p = 1 keeps tokens up to the cap and leaves out what the cap cut.
        full = d.score_topk(q, DIM, setup.blocks, k=kmax, top_p=1.0, **ARGS)
        assert full["left_out_mass"][0] <= MASS_TOL + (1 - cs[-1])
    # The device's lists and masses are the host's exactly.
    both = d.score_topk(setup.q, DIM, setup.blocks, k=kmax, top_p=0.7, gather_values=True, **ARGS)
    ref = d.score_topk(setup.q, DIM, setup.blocks, k=kmax, top_p=0.7, gather_values=True, host=True, **ARGS)
    for name in ("indices", "scores", "counts", "left_out_mass", "values"):
        assert np.array_equal(both[name], ref[name]), name
    # Lists differ in length: padded past counts, values are the stored rows of the hits.
    n = both["indices"].shape[1]
    vals = setup.v.astype(np.float16)
    for g in range(GROUP):
        c = int(both["counts"][g])
        assert np.all(both["indices"][g, c:] == 2**32 - 1) and np.all(np.isneginf(both["scores"][g, c:]))
        assert np.array_equal(both["values"][g, :c], vals[both["indices"][g, :c]])
        assert not both["values"][g, c:n].any()


def test_sinks_window_and_exclusion(setup):
    d, scale, k = setup.dev, 1 / np.sqrt(DIM), 24
    total = NBLOCKS * TOKENS
    window = (total - 8, total)
    exclude = (200, 260)
    got = d.score_topk(setup.q, DIM, setup.blocks, k=k, sinks=4, window=window, exclude=exclude, **ARGS)
    assert got["stats"]["on_device"] == setup.on_device, got["stats"]
    assert list(got["counts"]) == [k] * GROUP
    forced = set(range(4)) | set(range(*window))
    for g in range(GROUP):
        s, w, keep = mass_ref(setup, g, scale, exclude)
        idx = set(int(i) for i in got["indices"][g])
        assert forced <= idx  # sinks and window are always in
        assert not idx & set(range(*exclude))  # the excluded range never is
        rest = [int(t) for t in np.argsort(-s, kind="stable") if keep[t] and t not in forced][: k - len(forced)]
        assert idx == forced | set(rest)  # the other slots go to the best-scored candidates
        assert abs(got["left_out_mass"][g] - (1 - w[sorted(idx)].sum())) <= MASS_TOL
    ref = d.score_topk(setup.q, DIM, setup.blocks, k=k, sinks=4, window=window, exclude=exclude, host=True, **ARGS)
    for name in ("indices", "scores", "counts", "left_out_mass"):
        assert np.array_equal(got[name], ref[name]), name
    # Plain top-k reports no left-out mass and equal-length lists.
    plain = d.score_topk(setup.q, DIM, setup.blocks, k=k, **ARGS)
    assert plain["left_out_mass"].shape == (0,) and list(plain["counts"]) == [k] * GROUP


def test_bad_arguments_raise(setup):
    d, q, b = setup.dev, setup.q, setup.blocks
    total = NBLOCKS * TOKENS
    bad = [
        dict(k=8, top_p=0.0),  # p outside (0, 1]
        dict(k=8, top_p=1.5),
        dict(k=8, top_p=float("nan")),
        dict(k=8, window=(total - 4, total + 4)),  # the window reaches past the stored tokens
        dict(k=8, window=(10, 5)),  # reversed
        dict(k=8, exclude=(10, 5)),
        dict(k=4, sinks=8),  # more forced tokens than k
        dict(k=0),
        dict(k=8, scale=float("inf")),
    ]
    for kw in bad:
        with pytest.raises(cxlkv.BadInputError):
            d.score_topk(q, DIM, b, **kw, **ARGS)
    with pytest.raises(cxlkv.BadInputError):
        d.score_topk(q.astype(np.float64), DIM, b, k=8, **ARGS)  # not float32
    with pytest.raises(cxlkv.BadInputError):
        d.attend(q, DIM - 1, b, **ARGS)  # not whole queries
    with pytest.raises(cxlkv.BadInputError):
        d.attend(q[:, :48], 48, b, **ARGS)  # the blocks' dim is 64
    with pytest.raises(cxlkv.BadInputError):
        d.attend(q, DIM, [], **ARGS)
    with pytest.raises(cxlkv.BadInputError):
        d.attend(q, DIM, b, sequence=SEQ, layer=LAYER, kv_head=HEAD, dtype="f8")
    with pytest.raises(cxlkv.BadInputError):
        d.attend(q, DIM, b, scale=float("nan"), **ARGS)
    with pytest.raises(cxlkv.BadInputError, match="missing"):
        d.attend(q, DIM, [("no-such-block", 0)], **ARGS)
    # The client still works after the errors.
    assert d.attend(q, DIM, b, **ARGS)["stats"]["on_device"] == setup.on_device


def test_threads_share_a_device(setup):
    """Four threads attend at once (the GIL is released while the device computes; the client
    serializes them): every answer is the single-threaded one."""
    d = setup.dev
    want = d.attend(setup.q, DIM, setup.blocks, **ARGS)["output"]
    errors, outs = [], []

    def worker():
        try:
            for _ in range(5):
                outs.append(d.attend(setup.q, DIM, setup.blocks, **ARGS)["output"])
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    ts = [threading.Thread(target=worker) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert len(outs) == 20 and all(np.array_equal(o, want) for o in outs)
