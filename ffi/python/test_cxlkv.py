"""Tests of the ctypes binding and the LMCache-shaped backend, without pytest:
    python3 ffi/python/test_cxlkv.py     (prints "N passed, M failed"; exit status 1 on failure)"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cxlkv  # noqa: E402

SPEC = "shm:cxlkv-pytest-%d" % os.getpid()
results = []


def test(fn):
    try:
        fn()
        results.append((fn.__name__, None))
    except Exception as e:  # noqa: BLE001 - report every failure
        import traceback

        results.append((fn.__name__, traceback.format_exc()))
    return fn


def make_pool(participants=3):
    return cxlkv.Pool.create(SPEC, 16 << 20, block_size=64 << 10, participants=participants)


@test
def test_backend_contains_put_get_remove():
    with make_pool() as pool:
        try:
            b = cxlkv.CxlkvBackend(pool)
            assert not b.contains("k1")
            assert b.get_blocking("k1") is None
            b.put("k1", b"hello kv")
            assert b.contains("k1")
            assert b.get_blocking("k1") == b"hello kv"
            assert b.remove("k1") is True
            assert b.remove("k1") is False
            assert not b.contains("k1")
            b.close()
        finally:
            pool.unlink()


@test
def test_pin_gives_zero_copy_view():
    with make_pool() as pool:
        try:
            b = cxlkv.CxlkvBackend(pool)
            payload = bytes(range(256)) * 10
            b.put(b"blob", payload)
            assert b.pin(b"blob") is True
            assert b.contains(b"blob", pin=True) is True
            assert bytes(b.pinned_view(b"blob")) == payload
            assert b.unpin(b"blob") is True
            assert b.unpin(b"blob") is False
            assert b.pin(b"missing") is False
            b.close()
        finally:
            pool.unlink()


@test
def test_two_participants_share_blocks_and_prefixes():
    with make_pool() as pool:
        try:
            a, r = pool.attach(), pool.attach()
            assert a.id != r.id
            keys = cxlkv.key_chain("ns", "model", 0, 29, list(range(1000)), 256)
            assert len(keys) == 4
            for i, k in enumerate(keys[:3]):
                a.put(k, bytes([i]) * 1000)
            assert pool.lookup_prefix(keys) == 3
            assert r.get(keys[1]) == bytes([1]) * 1000
            again = cxlkv.key_chain("ns", "model", 0, 29, list(range(1000)), 256)
            assert again == keys, "key chains are deterministic"
            try:
                r.delete(keys[0])
                raise AssertionError("a non-owner deleted a block")
            except cxlkv.CxlkvError as e:
                assert e.code == 12, e  # CXLKV_ERR_NOT_OWNER
            assert a.stats()["puts"] == 3 and r.stats()["hits"] == 1
            a.detach()
            r.detach()
        finally:
            pool.unlink()


@test
def test_a_second_process_reads_what_we_wrote():
    with make_pool() as pool:
        try:
            b = cxlkv.CxlkvBackend(pool)
            b.put("shared", b"from the parent")
            code = (
                "import sys; sys.path.insert(0, %r); import cxlkv;"
                "p = cxlkv.Pool.open(%r); b = cxlkv.CxlkvBackend(p);"
                "assert b.get_blocking('shared') == b'from the parent'; b.put('reply', b'from the child'); b.close(); p.close()"
            ) % (os.path.dirname(os.path.abspath(__file__)), SPEC)
            subprocess.run([sys.executable, "-c", code], check=True)
            assert b.get_blocking("reply") == b"from the child"
            b.close()
        finally:
            pool.unlink()


@test
def test_errors_are_exceptions_with_codes():
    try:
        cxlkv.Pool.open("shm:cxlkv-does-not-exist-%d" % os.getpid())
        raise AssertionError("opened a missing pool")
    except cxlkv.CxlkvError as e:
        assert e.code == 7 and "open" in e.message, e  # CXLKV_ERR_IO
    with make_pool(participants=1) as pool:
        try:
            me = pool.attach()
            try:
                pool.attach()
                raise AssertionError("attached past the slot count")
            except cxlkv.CxlkvError as e:
                assert e.code == 9, e  # CXLKV_ERR_NO_PARTICIPANT_SLOT
            try:
                me.put("big", b"x" * (64 << 10 + 1))
                raise AssertionError("stored a payload larger than a block")
            except cxlkv.CxlkvError as e:
                assert e.code == 6, e  # CXLKV_ERR_PAYLOAD_TOO_LARGE
            try:
                cxlkv.key_chain("ns", "m", 0, 0, [1, 2], 0)
                raise AssertionError("chunk 0 accepted")
            except cxlkv.CxlkvError as e:
                assert e.code == 3, e  # CXLKV_ERR_INVALID_ARG
            me.detach()
        finally:
            pool.unlink()


if __name__ == "__main__":
    failed = [(n, tb) for n, tb in results if tb]
    for n, tb in failed:
        print("FAIL %s\n%s" % (n, tb))
    for n, tb in results:
        if not tb:
            print("ok   %s" % n)
    print("%d passed, %d failed" % (len(results) - len(failed), len(failed)))
    sys.exit(1 if failed else 0)
