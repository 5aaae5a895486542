"""The metrics scenario every front end runs with the same expected numbers (stated in
runtime/tests/front_end_metrics.rs; ffi/tests/metrics.c runs it through C): the runtime counts
inside its operations, so Python counts what C and Rust count, a failed put included (an error
and no bytes).

Also what a process that loads both libraries holds: `libcxlkv.so` and this extension module each
link their own copy of the runtime, so each has its own registry, and a C call is not seen by
`cxlkv.metrics()`."""

import ctypes
import os

import pytest

import cxlkv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIELDS = ("ok", "miss", "error", "bytes_in", "bytes_out", "latency_count")


def delta(before, after, op):
    return [after[op][f] - before[op][f] for f in FIELDS]


def test_the_front_end_scenario_counts_each_call_once(spec):
    with cxlkv.Pool.create(spec, 8 << 20, block_size=4096, participants=2) as pool:
        with pool.attach() as me:
            before = cxlkv.metrics()
            for i in range(3):
                me.put("k-%d" % i, bytes([i]) * 100)
            with pytest.raises(cxlkv.BadInputError) as e:
                me.put("k-9", bytes((8 << 20) + 1))
            assert e.value.code == cxlkv.ERR_PAYLOAD_TOO_LARGE
            assert me.put_if_absent("k-1", bytes(100)) is False
            buf = bytearray(256)
            assert me.get_into("k-0", buf) == 100
            assert len(me.get("k-1")) == 100
            assert me.get_into("none", buf) is None
            with pytest.raises(cxlkv.BadInputError):
                me.get_into("k-2", bytearray(10))
            with me.pin("k-2") as p:
                assert len(p) == 100
            assert me.delete("k-0") is True
            assert me.delete("none") is False
            after = cxlkv.metrics()
    # [ok, miss, error, bytes_in, bytes_out, calls timed], as in Rust and C.
    assert delta(before, after, "put") == [4, 0, 1, 300, 0, 5]
    assert delta(before, after, "get") == [2, 1, 1, 0, 200, 4]
    assert delta(before, after, "pin") == [1, 0, 0, 0, 100, 1]
    assert delta(before, after, "delete") == [1, 1, 0, 0, 0, 2]


def libcxlkv():
    """The C library built beside the daemon ($CXLKV_NDPD's folder), else the repository's."""
    dirs = [os.path.dirname(os.environ["CXLKV_NDPD"])] if os.environ.get("CXLKV_NDPD") else []
    dirs += [os.path.join(ROOT, "target", p) for p in ("debug", "release")]
    for d in dirs:
        path = os.path.join(d, "libcxlkv.so")
        if os.path.isfile(path):
            return path
    pytest.skip("libcxlkv.so not built (cargo build -p cxlkv-ffi)")


def test_the_c_library_in_the_same_process_has_its_own_registry():
    lib = ctypes.CDLL(libcxlkv())
    spec = ("shm:cxlkv-py-two-%d" % os.getpid()).encode()
    pool, me = ctypes.c_void_p(), ctypes.c_void_p()
    key = (ctypes.c_uint64 * 2)(5, 7)
    data = ctypes.create_string_buffer(b"x" * 64, 64)
    ops = ctypes.c_uint64 * 6
    # cxlkv_metrics: struct_size, reserved, then put's six counters first (a caller may pass a
    # struct that ends there: the library writes what fits).
    metrics = type("cxlkv_metrics", (ctypes.Structure,), {
        "_fields_": [("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_uint32), ("put", ops)]})
    before_py = cxlkv.metrics()["put"]["ok"]
    c_before = metrics(struct_size=ctypes.sizeof(metrics))
    assert lib.cxlkv_metrics_read(ctypes.byref(c_before)) == 0
    assert lib.cxlkv_pool_create(spec, ctypes.c_uint64(8 << 20), None, ctypes.byref(pool)) == 0
    try:
        assert lib.cxlkv_participant_attach(pool, ctypes.byref(me)) == 0
        assert lib.cxlkv_participant_put(me, key, data, ctypes.c_size_t(64)) == 0
        assert lib.cxlkv_participant_detach(me) == 0
    finally:
        lib.cxlkv_pool_close(pool)
        lib.cxlkv_pool_unlink(spec)
    c_after = metrics(struct_size=ctypes.sizeof(metrics))
    assert lib.cxlkv_metrics_read(ctypes.byref(c_after)) == 0
    assert c_after.put[0] - c_before.put[0] == 1  # the C library counted its put
    assert cxlkv.metrics()["put"]["ok"] == before_py  # Python's registry did not see it
