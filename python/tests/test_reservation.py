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
