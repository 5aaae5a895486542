"""Tests of the cxlkv Python package (pytest; the package installed with `pip install ./python`).

    python -m pytest python/tests -q

The device test starts `cxlkv-ndpd` from $CXLKV_NDPD, else from the repository's target/debug or
target/release (`cargo build -p cxlkv-ndp` builds it); without one it is skipped, saying why.
"""

import os
import threading
import time

import numpy as np
import pytest

import cxlkv
from conftest import make_pool, ndpd_binary, rand_bytes, run_child, start_ndpd, stop_ndpd


def test_two_processes_put_then_zero_copy_get_byte_exact(spec):
    with make_pool(spec, block=256 << 10) as pool:
        # Process 1 writes 200 KB of seeded random bytes and a typed block, then exits.
        run_child(
            "import numpy as np, cxlkv\n"
            "pool = cxlkv.Pool.open(%r); me = pool.attach()\n"
            "me.put('blob', np.random.default_rng(7).integers(0, 256, 200_000, dtype=np.uint8))\n"
            "k = np.random.default_rng(8).standard_normal((2, 64, 32)).astype(np.float16)\n"
            "me.put_kv('kv', k, -k, layer=4, sequence=9, token_offset=128)\n"
            "me.detach()\n" % spec
        )
        # Process 2 reads them into its own numpy arrays, zero copy, and reports what it saw.
        out = run_child(
            "import numpy as np, cxlkv, hashlib\n"
            "pool = cxlkv.Pool.open(%r); me = pool.attach()\n"
            "dst = np.zeros(pool.block_size, np.uint8)\n"
            "n = me.get_into('blob', dst)\n"
            "assert n == 200_000, n\n"
            "assert np.array_equal(dst[:n], np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8))\n"
            "b = me.get_kv('kv')\n"
            "k = np.random.default_rng(8).standard_normal((2, 64, 32)).astype(np.float16)\n"
            "assert b.k.tobytes() == k.tobytes() and b.v.tobytes() == (-k).tobytes()\n"
            "assert (b.layer, b.sequence, b.token_offset, b.dtype) == (4, 9, 128, 'f16')\n"
            "with me.pin('blob') as p:\n"
            "    v = np.frombuffer(p, np.uint8); print(hashlib.sha256(v).hexdigest()); del v\n"
            "me.detach()\n" % spec
        )
        import hashlib

        assert out.strip() == hashlib.sha256(rand_bytes(7, 200_000)).hexdigest()
        # And this process sees the same bytes.
        me = pool.attach()
        dst = bytearray(pool.block_size)
        assert me.get_into("blob", dst) == 200_000
        assert bytes(dst[:200_000]) == rand_bytes(7, 200_000).tobytes()
        me.detach()


def test_get_into_writes_the_callers_array_in_place(spec):
    with make_pool(spec) as pool, pool.attach() as me:
        src = np.arange(4096, dtype=np.float32)
        me.put("x", src)
        dst = np.zeros(8192, dtype=np.float32)
        before = dst.__array_interface__["data"][0]
        assert me.get_into("x", dst) == src.nbytes
        assert dst.__array_interface__["data"][0] == before
        assert np.array_equal(dst[:4096], src) and not dst[4096:].any()
        assert me.get_into("missing", dst) is None
        assert me.get("x") == src.tobytes()
        assert me.get("missing") is None


def test_dlpack_tensor_without_buffer_protocol(spec):
    class Tensor:  # what a CPU torch tensor offers: DLPack, no buffer protocol
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, **kw):
            return self._a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    with make_pool(spec) as pool, pool.attach() as me:
        src = np.arange(1000, dtype=np.int32)
        me.put("t", Tensor(src))
        assert me.get("t") == src.tobytes()
        with pytest.raises(cxlkv.BadInputError) as e:
            me.put("t2", object())
        assert e.value.code == cxlkv.ERR_INVALID_ARG


def test_batches(spec):
    with make_pool(spec) as pool, pool.attach() as me:
        keys = cxlkv.key_chain("ns", "model", 0, 29, list(range(2000)), 256)
        assert len(keys) == 8
        assert keys == cxlkv.key_chain("ns", "model", 0, 29, list(range(2000)), 256)
        vals = [rand_bytes(i, 30_000 + i) for i in range(6)]
        me.batch_put(keys[:6], vals)
        assert me.batch_contains(keys) == [True] * 6 + [False] * 2
        assert pool.batch_contains(keys) == me.batch_contains(keys)
        assert pool.lookup_prefix(keys) == 6 and me.lookup_prefix(keys) == 6
        assert pool.lookup_prefix([keys[7]] + keys) == 0
        # One 2-D array, a row per key.
        out = np.zeros((8, 40_000), np.uint8)
        got = me.batch_get_into(keys, out)
        assert got == [30_000 + i for i in range(6)] + [None, None]
        for i in range(6):
            assert np.array_equal(out[i, : got[i]], vals[i])
        assert not out[6:].any()
        # A list of buffers of any kind.
        outs = [bytearray(40_000) for _ in range(3)] + [np.zeros(40_000, np.uint8)]
        got = me.batch_get_into([keys[5], keys[0], "missing", keys[2]], outs)
        assert got == [30_005, 30_000, None, 30_002]
        assert bytes(outs[0][:30_005]) == vals[5].tobytes()
        assert np.array_equal(outs[3][:30_002], vals[2])
        # A row too small names the item; a count mismatch is refused before any copy.
        with pytest.raises(cxlkv.BadInputError) as e:
            me.batch_get_into(keys[:2], np.zeros((2, 100), np.uint8))
        assert e.value.code == cxlkv.ERR_BUFFER_TOO_SMALL and "item 0" in e.value.message
        with pytest.raises(cxlkv.BadInputError):
            me.batch_put(keys[:2], [b"x"])
        with pytest.raises(cxlkv.BadInputError):
            me.batch_get_into(keys[:3], np.zeros(100, np.uint8))


def test_pins_are_context_managers_released_on_exit_and_on_exception(spec):
    with make_pool(spec) as pool, pool.attach() as me:
        payload = rand_bytes(3, 5000)
        me.put("blob", payload)
        # Far more pins than the pin table holds (64): each must be released at the end of its block.
        for i in range(200):
            with me.pin("blob") as p:
                assert len(p) == 5000 and p.pinned
                with memoryview(p) as mv:
                    assert mv.readonly and bytes(mv[:10]) == payload[:10].tobytes()
            assert not p.pinned
        for i in range(100):
            with pytest.raises(ZeroDivisionError):
                with me.pin("blob") as p:
                    1 / 0
            assert not p.pinned
        assert me.stats()["pins"] == 300
        # The view is zero copy and read-only; the pin will not go while a view is exported.
        p = me.pin("blob")
        view = np.frombuffer(p, np.uint8)
        assert np.array_equal(view, payload) and not view.flags.writeable
        with pytest.raises(BufferError):
            p.release()
        assert p.pinned
        del view
        dst = np.zeros(100, np.uint8)
        assert p.read_into(dst, offset=4900) == 100 and np.array_equal(dst, payload[4900:])
        p.release()
        p.release()  # idempotent
        with pytest.raises(cxlkv.ClosedError):
            len(p)
        with pytest.raises(BufferError):
            memoryview(p)
        assert me.pin("missing") is None
        # The pin table holds 64 pins at most: the 65th is FullError, and releasing frees a slot.
        held = [me.pin("blob") for _ in range(64)]
        with pytest.raises(cxlkv.FullError) as e:
            me.pin("blob")
        assert e.value.code == cxlkv.ERR_PIN_TABLE_FULL
        held.pop().release()
        held.append(me.pin("blob"))
        for h in held:
            h.release()


def test_typed_kv_round_trip_as_numpy(spec):
    with make_pool(spec) as pool, pool.attach() as me:
        rng = np.random.default_rng(11)
        for name, dtype, kw in [("f16", np.float16, {}), ("f32", np.float32, {}), ("bf16", np.uint16, {"dtype": "bf16"})]:
            k = rng.standard_normal((3, 40, 16)).astype(np.float32)
            v = rng.standard_normal((3, 40, 16)).astype(np.float32)
            if name == "bf16":
                k, v = (k.view(np.uint32) >> 16).astype(np.uint16), (v.view(np.uint32) >> 16).astype(np.uint16)
            else:
                k, v = k.astype(dtype), v.astype(dtype)
            me.put_kv("kv-" + name, k, v, layer=5, sequence=77, token_offset=40, **kw)
            b = me.get_kv("kv-" + name)
            assert b.dtype == name and b.shape == (3, 40, 16)
            assert (b.layer, b.sequence, b.token_offset) == (5, 77, 40)
            assert b.k.shape == (3, 40, 16) and b.k.tobytes() == k.tobytes() and b.v.tobytes() == v.tobytes()
            if name != "bf16":
                assert b.k.dtype == dtype and np.array_equal(b.k, k)
            with me.pin("kv-" + name) as p:
                z = p.kv()
                assert z.k.tobytes() == k.tobytes() and not z.k.flags.writeable
                del z
        assert me.get_kv("missing") is None
        # A flat buffer with an explicit shape.
        flat = np.ones(2 * 8 * 16, np.float16)
        me.put_kv("flat", flat, flat, shape=(2, 8, 16))
        assert me.get_kv("flat").k.shape == (2, 8, 16)
        with pytest.raises(cxlkv.BadInputError):
            me.put_kv("bad", np.ones((2, 8, 16), np.float16), np.ones((2, 8, 15), np.float16))
        with pytest.raises(cxlkv.BadInputError):
            me.put_kv("bad", np.ones((2, 8, 16), np.int32), np.ones((2, 8, 16), np.int32))
        with pytest.raises(cxlkv.BadInputError) as e:
            me.put_kv("bad", flat, flat)
        assert "shape" in e.value.message
        me.put("raw", b"not a typed block")
        with pytest.raises(cxlkv.BadInputError):
            me.get_kv("raw")


def test_threads_put_and_get_concurrently_byte_exact(spec):
    with make_pool(spec, participants=4, size=64 << 20) as pool:
        shared = pool.attach()
        errors = []

        def worker(t):
            try:
                own = pool.attach() if t % 2 else shared  # half share one participant
                dst = np.zeros(64 << 10, np.uint8)
                for i in range(40):
                    data = rand_bytes(t * 1000 + i, 1000 + 997 * i)
                    key = "t%d-%d" % (t, i)
                    own.put(key, data)
                    n = shared.get_into(key, dst)
                    assert n == data.size and np.array_equal(dst[:n], data), key
                    with own.pin(key) as p:
                        assert bytes(memoryview(p)) == data.tobytes()
                if own is not shared:
                    own.detach()
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append((t, repr(e)))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        # Every block written by every thread is still there, byte-exact (3 participants' partitions
        # hold them all: 240 blocks of at most 40 KB, no eviction).
        dst = np.zeros(64 << 10, np.uint8)
        for t in range(6):
            for i in range(40):
                n = shared.get_into("t%d-%d" % (t, i), dst)
                assert n == 1000 + 997 * i and np.array_equal(dst[:n], rand_bytes(t * 1000 + i, n))
        shared.detach()


def test_errors_are_exceptions_with_code_and_message(spec, tmp_path):
    with pytest.raises(cxlkv.IoError) as e:
        cxlkv.Pool.open("shm:cxlkv-does-not-exist-%d" % os.getpid())
    assert e.value.code == cxlkv.ERR_IO == 7 and "open" in e.value.message
    assert "cxlkv code 7" in str(e.value) and isinstance(e.value, cxlkv.Error)
    with pytest.raises(cxlkv.BadInputError) as e:
        cxlkv.Pool.open("nosuchbackend:x")
    assert e.value.code == cxlkv.ERR_INVALID_ARG
    # A corrupt pool file: garbage, and a good pool with a flipped superblock byte.
    junk = tmp_path / "junk.pool"
    junk.write_bytes(b"\xab" * (1 << 20))
    with pytest.raises(cxlkv.BadPoolError) as e:
        cxlkv.Pool.open("file:%s" % junk)
    assert e.value.code == cxlkv.ERR_BAD_POOL and "magic" in e.value.message
    good = tmp_path / "good.pool"
    cxlkv.Pool.create("file:%s" % good, 8 << 20, block_size=64 << 10).close()
    raw = bytearray(good.read_bytes())
    raw[40] ^= 0xFF
    good.write_bytes(bytes(raw))
    with pytest.raises(cxlkv.BadPoolError) as e:
        cxlkv.Pool.open("file:%s" % good)
    assert e.value.code == cxlkv.ERR_BAD_POOL

    with make_pool(spec, participants=1) as pool:
        me = pool.attach()
        with pytest.raises(cxlkv.FullError) as e:
            pool.attach()
        assert e.value.code == cxlkv.ERR_NO_PARTICIPANT_SLOT
        with pytest.raises(cxlkv.BadInputError) as e:
            me.put("big", b"x" * (me.max_object_len + 1))  # over a block is an object; this is not
        assert e.value.code == cxlkv.ERR_PAYLOAD_TOO_LARGE
        me.put("k", b"y" * 1000)
        with pytest.raises(cxlkv.BadInputError) as e:
            me.get_into("k", bytearray(999))  # wrong size
        assert e.value.code == cxlkv.ERR_BUFFER_TOO_SMALL and "1000" in e.value.message
        with pytest.raises(cxlkv.BadInputError) as e:
            me.get_into("k", b"\0" * 2000)  # read-only
        assert e.value.code == cxlkv.ERR_INVALID_ARG and "read-only" in e.value.message
        with pytest.raises(cxlkv.BadInputError) as e:
            me.get_into("k", np.zeros((40, 40), np.uint8)[:, ::2])  # not contiguous
        assert "contiguous" in e.value.message
        for bad in (3.5, -1, 1 << 128, None, ["k"]):
            with pytest.raises(cxlkv.BadInputError) as e:
                me.get(bad)
            assert e.value.code == cxlkv.ERR_INVALID_ARG and "key" in e.value.message
        with pytest.raises(cxlkv.BadInputError) as e:
            cxlkv.key_chain("ns", "m", 0, 0, [1, 2], 0)
        with pytest.raises(cxlkv.BadInputError) as e:
            pool.lookup_prefix([])
        assert e.value.code == cxlkv.ERR_INVALID_ARG
        me.detach()
        with pytest.raises(cxlkv.ClosedError) as e:
            me.get("k")
        assert e.value.code == cxlkv.ERR_INVALID_HANDLE
        # The process keeps running and the pool keeps working after all of that.
        again = pool.attach()
        assert again.get("k") == b"y" * 1000
        again.detach()
        assert pool.check()["ok"]

    with make_pool(spec + "-2", participants=2) as pool:
        try:
            a, b = pool.attach(), pool.attach()
            a.put("mine", b"1")
            with pytest.raises(cxlkv.NotOwnerError) as e:
                b.delete("mine")
            assert e.value.code == cxlkv.ERR_NOT_OWNER
            assert a.delete("mine") is True and a.delete("mine") is False
            a.detach(), b.detach()
        finally:
            pool.unlink()


def test_pool_create_is_private_by_default_and_takes_mode_owner_group(tmp_path):
    """Pool.create gives the file it creates mode 0600 unless told otherwise (docs/SECURITY.md);
    mode, owner and group are the options of `cxlkv pool create`, and bad ones raise."""
    import stat

    private = tmp_path / "private.pool"
    cxlkv.Pool.create("file:%s" % private, 8 << 20, block_size=4096).close()
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    shared = tmp_path / "shared.pool"
    cxlkv.Pool.create(
        "file:%s" % shared, 8 << 20, block_size=4096, mode=0o640, group=os.getgid()
    ).close()
    st = os.stat(shared)
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == os.getgid()
    bad = tmp_path / "bad.pool"
    with pytest.raises(cxlkv.BadInputError):
        cxlkv.Pool.create("file:%s" % bad, 8 << 20, block_size=4096, mode=0o4755)
    with pytest.raises(cxlkv.BadInputError):
        cxlkv.Pool.create("file:%s" % bad, 8 << 20, block_size=4096, owner="no-such-user-cxlkv")
    assert not bad.exists()


def test_lmcache_shaped_backend(spec):
    with make_pool(spec) as pool:
        b = cxlkv.CxlkvBackend(pool)
        assert not b.contains("k1") and b.get_blocking("k1") is None
        b.put("k1", b"hello kv")
        assert b.contains("k1") and b.get_blocking("k1") == b"hello kv"
        assert b.pin("k1") is True and b.contains("k1", pin=True) is True
        with b.pinned_view("k1") as v:
            assert bytes(v) == b"hello kv"
        assert b.unpin("k1") is True and b.unpin("k1") is False
        assert b.pin("missing") is False
        assert b.remove("k1") is True and b.remove("k1") is False
        b.close()


def test_device_score_topk_and_gather_match_the_host_reference(spec):
    ndpd = ndpd_binary()
    if ndpd is None:
        pytest.skip("no cxlkv-ndpd binary (set CXLKV_NDPD or `cargo build -p cxlkv-ndp`)")
    dim, tokens, nblocks, group, k = 64, 128, 4, 4, 16
    rng = np.random.default_rng(5)
    ks = rng.standard_normal((nblocks, 2, tokens, dim)).astype(np.float16)
    vs = rng.standard_normal((nblocks, 2, tokens, dim)).astype(np.float16)
    with make_pool(spec, size=64 << 20, block=256 << 10) as pool, pool.attach() as me:
        blocks = []
        for i in range(nblocks):
            me.put_kv("seq3-%d" % i, ks[i], vs[i], layer=2, sequence=3, token_offset=i * tokens)
            blocks.append(("seq3-%d" % i, i * tokens))
        q = rng.standard_normal((group, dim)).astype(np.float32)
        args = dict(sequence=3, layer=2, kv_head=1, dtype="f16", k=k)
        dev = start_ndpd(ndpd, spec)
        try:
            with me.device(timeout_ms=2000) as d:
                deadline = time.monotonic() + 20
                while True:  # the device needs a moment to come up; until then the host answers
                    got = d.score_topk(q, dim, blocks, gather_values=True, **args)
                    if got["stats"]["on_device"] or time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
                assert got["stats"]["on_device"], got["stats"]
                ref = d.score_topk(q, dim, blocks, host=True, **args)
                assert ref["stats"]["path"] == "host (Forced)"
                assert got["indices"].shape == (group, k)
                assert np.array_equal(got["indices"], ref["indices"])
                assert np.array_equal(got["scores"], ref["scores"])
                # The exact top-k by numpy, and the gathered rows are the stored V rows of the hits.
                keys_h = ks[:, 1].reshape(-1, dim).astype(np.float32)
                vals_h = vs[:, 1].reshape(-1, dim)
                for g in range(group):
                    s = keys_h @ q[g]
                    idx = got["indices"][g]
                    assert np.allclose(got["scores"][g], s[idx], rtol=1e-4, atol=1e-4)
                    assert got["scores"][g].min() >= np.sort(s)[-k] - 1e-3
                    assert np.array_equal(got["values"][g], vals_h[idx])
                pruned = d.score_topk(q, dim, blocks, prune=True, group_max=True, **args)
                assert pruned["indices"].shape == (1, k)
                toks = [5, 130, 511, 0]
                rows, st = d.gather(blocks, toks, sequence=3, layer=2, kv_head=1, dtype="f16", dim=dim)
                assert np.array_equal(rows, vals_h[toks]) and st["on_device"]
                assert d.nop() > 0
                with pytest.raises(cxlkv.BadInputError):
                    d.score_topk(q, 63, blocks, **args)
                with pytest.raises(cxlkv.BadInputError):
                    d.score_topk(q, dim, [], **args)
        finally:
            stop_ndpd(dev)


def test_device_falls_back_to_the_host_without_a_device(spec):
    with make_pool(spec) as pool, pool.attach() as me:
        k = np.random.default_rng(1).standard_normal((1, 32, 16)).astype(np.float32)
        me.put_kv("b", k, k, sequence=1)
        with me.device(timeout_ms=100) as d:
            q = np.ones(16, np.float32)
            got = d.score_topk(q, 16, [("b", 0)], sequence=1, layer=0, kv_head=0, dtype="f32", k=3)
            assert not got["stats"]["on_device"] and got["stats"]["path"] == "host (Absent)"
            assert list(got["indices"][0]) == list(np.argsort(-(k[0] @ q), kind="stable")[:3])
            with pytest.raises(cxlkv.UnavailableError):
                d.nop()
        with pytest.raises(cxlkv.ClosedError):
            d.score_topk(q, 16, [("b", 0)], sequence=1, layer=0, kv_head=0, dtype="f32", k=3)


def test_metrics_follow_known_operations(spec):
    """cxlkv.metrics() and cxlkv.metrics_text() count this process's operations: the deltas after
    3 puts of 100 bytes and a typed put, 2 hits, 1 miss, a pin, a delete, and device commands that
    fall back to the host (no device runs): a SCORE_TOPK, two ATTENDs of two queries (one asked of
    the host) and one that fails, each counted under its own op."""
    before = cxlkv.metrics()
    with make_pool(spec) as pool, pool.attach() as me:
        for i in range(3):
            me.put("m-%d" % i, bytes([i]) * 100)
        assert me.get("m-0") is not None
        out = bytearray(256)
        assert me.get_into("m-1", out) == 100
        assert me.get("m-none") is None
        with me.pin("m-2") as p:
            assert len(p) == 100
        assert me.delete("m-0")
        k = np.random.default_rng(2).standard_normal((1, 32, 16)).astype(np.float32)
        me.put_kv("m-kv", k, k, sequence=1)
        with me.device(timeout_ms=100) as d:
            q = np.ones(16, np.float32)
            d.score_topk(q, 16, [("m-kv", 0)], sequence=1, layer=0, kv_head=0, dtype="f32", k=3)
            q2 = np.ones((2, 16), np.float32)
            args = dict(layer=0, kv_head=0, dtype="f32")
            a = d.attend(q2, 16, [("m-kv", 0)], sequence=1, **args)
            assert a["sum"].shape == (2,) and float(a["sum"][0]) >= 1.0
            d.attend(q2, 16, [("m-kv", 0)], sequence=1, host=True, **args)
            with pytest.raises(cxlkv.Error):
                d.attend(q2, 16, [("m-kv", 0)], sequence=2, **args)  # a block of another sequence
    after = cxlkv.metrics()

    def delta(op, field):
        return after[op][field] - before[op][field]

    # Three puts and one typed put of K and V (2 x 2048 bytes).
    assert (delta("put", "ok"), delta("put", "bytes_in")) == (4, 300 + 2 * k.nbytes)
    assert (delta("get", "ok"), delta("get", "miss"), delta("get", "bytes_out")) == (2, 1, 200)
    assert (delta("pin", "ok"), delta("pin", "bytes_out")) == (1, 100)
    assert delta("delete", "ok") == 1
    assert delta("get", "latency_count") == 3 and delta("get", "latency_sum_s") > 0
    assert delta("score_topk", "ok") == 1 and delta("score_topk", "bytes_in") == 64
    assert delta("score_topk", "error") == 0
    # ATTEND: 2 queries of dim 16 in (128 bytes), partials out (out, max, sum: 2 x 18 floats).
    assert (delta("attend", "ok"), delta("attend", "error")) == (2, 1)
    assert (delta("attend", "bytes_in"), delta("attend", "bytes_out")) == (2 * 128, 2 * 144)
    assert delta("attend", "latency_count") == 3 and delta("attend", "latency_sum_s") > 0
    fallbacks = after["device_fallbacks"]["absent"] - before["device_fallbacks"]["absent"]
    assert fallbacks == 2  # the SCORE_TOPK and the ATTEND sent to the absent device
    forced = after["device_fallbacks"]["forced"] - before["device_fallbacks"]["forced"]
    assert forced == 1  # the ATTEND asked of the host
    assert after["host_link_bytes"] > before["host_link_bytes"]

    text = cxlkv.metrics_text()
    assert text.rstrip().endswith("# EOF")
    assert "# TYPE cxlkv_ops counter" in text
    assert "# TYPE cxlkv_op_latency_seconds histogram" in text
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert int(samples['cxlkv_ops_total{op="put",result="ok"}']) == after["put"]["ok"]
    assert int(samples['cxlkv_op_latency_seconds_count{op="get"}']) == after["get"]["latency_count"]
    assert int(samples['cxlkv_device_fallbacks_total{reason="absent"}']) >= 1
    assert int(samples['cxlkv_ops_total{op="attend",result="ok"}']) == after["attend"]["ok"]
    assert int(samples['cxlkv_op_out_bytes_total{op="attend"}']) == after["attend"]["bytes_out"]


def test_pin_table_size_and_pool_counters(spec):
    """Pool.create(pins=N) gives each participant N pins (the next is refused, naming the table);
    cxlkv.metrics(pool) and cxlkv.metrics_text(pool) read the counters participants publish in
    their pool slots, here through a second handle on the pool."""
    with cxlkv.Pool.create(spec, 8 << 20, block_size=4096, participants=2, pins=3) as pool:
        assert pool.info()["pins_per_participant"] == 3
        with pool.attach() as me:
            for i, n in enumerate([100, 250, 1000]):
                me.put("c-%d" % i, bytes([i]) * n)
            assert len(me.get("c-0")) == 100
            assert me.get("c-none") is None
            held = [me.pin("c-1") for _ in range(3)]
            with pytest.raises(cxlkv.FullError, match="all 3 pins"):
                me.pin("c-1")
            for p in held:
                p.release()
            with cxlkv.Pool.open(spec) as other:
                m = cxlkv.metrics(other)["participants"][me.id]
                assert (m["puts"], m["bytes_in"]) == (3, 1350)
                assert (m["hits"], m["misses"], m["bytes_out"]) == (1, 1, 100)
                assert (m["pins"], m["pin_full"], m["fallbacks"]) == (3, 1, 0)
                assert m["pid"] == os.getpid() and m["partition"] is not None
                text = cxlkv.metrics_text(other)
                who = '{participant="%d",pid="%d"}' % (me.id, os.getpid())
                samples = dict(l.rsplit(" ", 1) for l in text.splitlines() if not l.startswith("#"))
                assert int(samples["cxlkv_pool_participant_bytes_in_total" + who]) == 1350
                assert int(samples["cxlkv_pool_participant_bytes_out_total" + who]) == 100
                assert 'cxlkv_ops_total{op="put",result="ok"}' in samples
    with pytest.raises(cxlkv.BadInputError):
        cxlkv.Pool.create(spec + "-x", 8 << 20, block_size=4096, pins=70000)
