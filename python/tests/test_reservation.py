"""Reserve/commit from Python (the C ABI's cxlkv_participant_reserve / cxlkv_reservation_commit on
the same runtime calls): a writable zero-copy view of the reserved block, published by commit()
or freed by abort(), a `with` block that commits or aborts, no view outliving the commit, and a
commit counted as a put of the reserved length."""

import numpy as np
import pytest

import cxlkv


@pytest.fixture
def me(spec):
    with cxlkv.Pool.create(spec, 8 << 20, block_size=4096, participants=2) as pool:
        with pool.attach() as p:
            yield p


def test_reserve_write_in_place_then_commit(me):
    before = cxlkv.metrics()["put"]
    r = me.reserve("r-1", 100)
    assert len(r) == 100 and r.open and me.get("r-1") is None
    with memoryview(r) as m:
        m[:] = bytes(range(100))
    r.commit()
    assert me.get("r-1") == bytes(range(100)) and not r.open
    with pytest.raises(cxlkv.ClosedError):
        r.commit()

    with me.reserve("r-2", 64) as r2:
        a = np.frombuffer(r2, np.uint8)
        a[:] = 7
        del a
    assert me.get("r-2") == b"\x07" * 64

    r3 = me.reserve("r-3", 10)
    v = memoryview(r3)
    with pytest.raises(BufferError):
        r3.commit()  # a view is still exported
    v.release()
    assert r3.write(b"abc", 7) == 3
    with pytest.raises(cxlkv.BadInputError):
        r3.write(b"abcd", 7)  # past the end
    r3.commit()
    assert me.get("r-3")[7:] == b"abc"
    after = cxlkv.metrics()["put"]
    assert (after["ok"] - before["ok"], after["bytes_in"] - before["bytes_in"]) == (3, 174)


def test_commit_of_a_checked_prefix(me):
    body = bytes(range(100))
    r = me.reserve("p-1", 116)  # a payload and its 16-byte trailer, read in one piece
    with memoryview(r) as m:
        m[:100] = body
        m[100:] = b"\xff" * 16
    r.commit(length=100, crc=cxlkv.crc32c(body))
    assert me.get("p-1") == body
    r = me.reserve("p-2", 100)
    with memoryview(r) as m:
        m[:] = body
    with pytest.raises(cxlkv.BadInputError):
        r.commit(length=100, crc=cxlkv.crc32c(body) ^ 1)
    assert me.get("p-2") is None and not r.open
    r.abort()  # already finished: nothing to do


def test_abort_and_refusals(me):
    with pytest.raises(RuntimeError):
        with me.reserve("r-4", 10) as r4:
            r4.write(b"x" * 10)
            raise RuntimeError("the block raised: the reservation aborts")
    assert not r4.open and me.get("r-4") is None
    r5 = me.reserve("r-5", 8)
    r5.abort()
    r5.abort()  # idempotent
    assert me.get("r-5") is None
    with pytest.raises(cxlkv.BadInputError) as e:
        me.reserve("r-6", 4097)  # more than a block
    assert e.value.code == cxlkv.ERR_PAYLOAD_TOO_LARGE
    # Every block of the partition can still be reserved: aborted ones went back.
    held = [me.reserve("f-%d" % i, 16) for i in range(3)]
    for r in held:
        r.abort()


def _land(addr, payload, crc=None):
    """Writes `payload` and its trailer (length, CRC-32C) at `addr`, as one transfer lands them;
    returns how many bytes landed."""
    import ctypes
    import struct

    crc = cxlkv.crc32c(payload) if crc is None else crc
    data = payload + struct.pack("<QQ", len(payload), crc)
    ctypes.memmove(addr, data, len(data))
    return len(data)


def test_reserve_many_then_commit_trailed(me):
    keys = ["m-%d" % i for i in range(5)]
    batch = me.reserve_many(keys, 4096)
    assert len(batch) == 5 and batch.length == 4096 and batch.stopped is None and batch.open
    assert len(set(batch.addresses)) == 5
    bodies = [bytes([i]) * (100 + i) for i in range(4)]
    sizes = [_land(a, b) for a, b in zip(batch.addresses, bodies)]
    _land(batch.addresses[2], bodies[2], crc=cxlkv.crc32c(bodies[2]) ^ 1)  # a torn transfer
    assert batch.commit_trailed(sizes) == (2, "crc_mismatch")
    assert [me.get(k) for k in keys] == bodies[:2] + [None] * 3
    assert not batch.open
    with pytest.raises(cxlkv.ClosedError):
        batch.commit_trailed(sizes)
    # A size that cannot hold a trailer, or runs past the reservation, ends the batch.
    for bad in (15, 4097):
        batch = me.reserve_many(["s-1", "s-2"], 4096)
        ok = _land(batch.addresses[0], b"first")
        assert batch.commit_trailed([ok, bad]) == (1, "short_read")
        assert me.get("s-1") == b"first" and me.get("s-2") is None
        me.delete("s-1")
    # A trailer whose length does not match the landed size is a mismatch too.
    batch = me.reserve_many(["t-1"], 4096)
    n = _land(batch.addresses[0], b"x" * 50)
    assert batch.commit_trailed([n + 1]) == (0, "crc_mismatch")
    # Fewer sizes than reservations: the rest are freed, which is no failure.
    batch = me.reserve_many(["u-1", "u-2"], 4096)
    assert batch.commit_trailed([_land(batch.addresses[0], b"u")]) == (1, None)
    assert me.get("u-1") == b"u" and me.get("u-2") is None


def test_reserve_many_without_evicting(me):
    for i in range(3):
        me.put("held-%d" % i, b"v")
    keys = ["e-%d" % i for i in range(10_000)]
    free = me.reserve_many(keys, 4096, evict=False)
    # It stops where a block would have to be evicted, and that is no error.
    assert 0 < len(free) < len(keys) and free.stopped is None
    free.abort()
    assert [me.get("held-%d" % i) for i in range(3)] == [b"v"] * 3
    # With eviction it goes on, evicting the committed blocks, until nothing is left to evict.
    full = me.reserve_many(keys, 4096)
    assert len(full) == len(free) + 3 and isinstance(full.stopped, cxlkv.FullError)
    assert [me.get("held-%d" % i) for i in range(3)] == [None] * 3
    full.abort()
    # Aborted, every block is back.
    again = me.reserve_many(keys, 4096, evict=False)
    assert len(again) == len(full)
    again.abort()


def test_keep_free_evicts_ahead(me):
    free = me.reserve_many(["probe-%d" % i for i in range(10_000)], 4096, evict=False)
    blocks = len(free)  # every block of the partition is free
    free.abort()
    for i in range(blocks):
        me.put("k-%d" % i, b"v")
    assert len(me.reserve_many(["x"], 16, evict=False)) == 0  # full: a reservation would evict
    # Room for 3, evicting the 3 least recently used; asking again evicts nothing more.
    assert me.keep_free(3) == 3
    assert [me.get("k-%d" % i) for i in range(4)] == [None, None, None, b"v"]
    assert me.keep_free(3) == 0
    room = me.reserve_many(["y-%d" % i for i in range(5)], 16, evict=False)
    assert len(room) == 3
    room.abort()
    # Never below the newest blocks asked to stay, nor more than half the partition.
    assert me.keep_free(10_000, keep_newest=blocks - 4) == 1
    assert me.get("k-%d" % 4) is None and me.get("k-%d" % 5) == b"v"
    assert me.keep_free(10_000) == blocks // 2 - 4
