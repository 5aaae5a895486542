"""Multi-block objects and put_if_absent through the Python package (pytest).

    python -m pytest python/tests/test_objects.py -q
"""


import numpy as np
import pytest

import cxlkv
from conftest import rand_bytes, run_child

BLOCK = 64 << 10


def test_objects_round_trip_at_part_boundaries(spec):
    with cxlkv.Pool.create(spec, 16 << 20, block_size=BLOCK, participants=2) as pool, pool.attach() as me:
        for i, n in enumerate([BLOCK, BLOCK + 1, 2 * BLOCK, 3 * BLOCK + 17]):
            src = rand_bytes(i, n)
            me.put("obj", src)
            assert me.length("obj") == n and pool.length("obj") == n
            dst = np.zeros(n, np.uint8)
            assert me.get_into("obj", dst) == n
            assert np.array_equal(dst, src)
            assert me.get("obj") == src.tobytes()
            with pytest.raises(cxlkv.BadInputError) as e:
                me.get_into("obj", np.zeros(n - 1, np.uint8))
            assert e.value.code == cxlkv.ERR_BUFFER_TOO_SMALL and str(n) in e.value.message
        assert me.length("missing") is None
        # Batches: a list of buffers, and one 2-D array of equal rows.
        keys = ["b%d" % i for i in range(3)]
        vals = [rand_bytes(10 + i, 2 * BLOCK + 5) for i in range(3)]
        me.batch_put(keys, vals)
        rows = np.zeros((3, 2 * BLOCK + 5), np.uint8)
        assert me.batch_get_into(keys, rows) == [2 * BLOCK + 5] * 3
        assert all(np.array_equal(rows[i], vals[i]) for i in range(3))
        outs = [np.zeros(2 * BLOCK + 5, np.uint8) for _ in range(3)]
        assert me.batch_get_into(keys, outs) == [2 * BLOCK + 5] * 3
        assert all(np.array_equal(outs[i], vals[i]) for i in range(3))
        # Pins hold one block: an object is refused, naming its length.
        with pytest.raises(cxlkv.BadInputError) as e:
            me.pin("b0")
        assert e.value.code == cxlkv.ERR_PAYLOAD_TOO_LARGE and str(2 * BLOCK + 5) in e.value.message
        assert me.delete("b0") and me.get("b0") is None and me.length("b0") is None
        # Larger than a partition holds: a clear error, nothing written.
        with pytest.raises(cxlkv.BadInputError) as e:
            me.put("huge", np.zeros(me.max_object_len + 1, np.uint8))
        assert e.value.code == cxlkv.ERR_PAYLOAD_TOO_LARGE
        assert not me.contains("huge")


def test_put_if_absent_across_participants(spec):
    with cxlkv.Pool.create(spec, 16 << 20, block_size=BLOCK, participants=2) as pool:
        a, b = pool.attach(), pool.attach()
        assert a.partition != b.partition
        assert a.put_if_absent("k", b"first") is True
        assert b.put_if_absent("k", b"second") is False
        assert b.get("k") == b"first"
        big = rand_bytes(3, 3 * BLOCK)
        assert b.put_if_absent("big", big) is True
        assert a.put_if_absent("big", rand_bytes(4, 3 * BLOCK)) is False
        assert a.get("big") == big.tobytes()
        a.detach()
        b.detach()


def test_two_processes_object_round_trip_byte_exact(spec):
    n = 5 * BLOCK + 123
    with cxlkv.Pool.create(spec, 16 << 20, block_size=BLOCK, participants=2) as pool:
        run_child(
            "import numpy as np, cxlkv\n"
            "pool = cxlkv.Pool.open(%r); me = pool.attach()\n"
            "me.put('obj', np.random.default_rng(21).integers(0, 256, %d, dtype=np.uint8))\n"
            "me.detach()\n" % (spec, n)
        )
        out = run_child(
            "import numpy as np, cxlkv\n"
            "pool = cxlkv.Pool.open(%r); me = pool.attach()\n"
            "dst = np.empty(me.length('obj'), np.uint8)\n"
            "print(me.get_into('obj', dst))\n"
            "assert np.array_equal(dst, np.random.default_rng(21).integers(0, 256, %d, dtype=np.uint8))\n"
            "me.detach()\n" % (spec, n)
        )
        assert out.strip() == str(n)
        with pool.attach() as me:
            assert me.get("obj") == rand_bytes(21, n).tobytes()
