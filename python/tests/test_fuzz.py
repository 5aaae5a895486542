"""Malformed calls through the Python package, by the thousand: a seeded loop draws a method and
its arguments (keys of every accepted type and of wrong ones, buffers of random sizes, read-only
and non-contiguous buffers, offsets and counts past the end, released pins and reservations,
batches of reservations landed with wrong trailers and committed with wrong sizes, detached
participants, bad specs, modes and sizes) and calls it.

- **Crashes**: every call returns or raises a documented exception (`cxlkv.Error`, `TypeError`,
  `ValueError`, `OverflowError`, `BufferError`); anything else (a Rust panic surfaces as
  `pyo3_runtime.PanicException`, a `BaseException`) is counted and fails the test.
- **Wrong reads**: every read that succeeds returns bytes some put stored under that key (a model
  per partition, since two participants may each hold a key).
- **Leaks**: once every handle is released, all participant slots attach again (no slot held;
  a partition still holding a tenant's blocks attaches as that tenant),
  the process holds no more file descriptors than before, and its resident memory grew by less
  than 64 MiB.

`CXLKV_PY_FUZZ_CALLS` sets the number of calls (default 3000; `scripts/fuzz-long.sh` makes
100,000), `CXLKV_PY_FUZZ_SEED` the seed. Skipped when the extension is not importable.

    CXLKV_PY_FUZZ_CALLS=100000 python -m pytest python/tests/test_fuzz.py -q -s
"""

import os
import random
import time

import pytest

cxlkv = pytest.importorskip("cxlkv", reason="the cxlkv extension is not importable (pip install ./python)")
np = pytest.importorskip("numpy")

BLOCK = 4096
KEYS = 24
PARTICIPANTS = 3
EXPECTED = (cxlkv.Error, TypeError, ValueError, OverflowError, BufferError)


def _resources():
    """(resident KiB, open file descriptors) of this process."""
    rss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return rss, len(os.listdir("/proc/self/fd"))


class Fuzz:
    def __init__(self, spec, seed):
        self.r = random.Random(seed)
        self.spec = spec
        self.pool = cxlkv.Pool.create(spec, 4 << 20, block_size=BLOCK, participants=PARTICIPANTS, lease_ms=60_000)
        self.participants = []
        self.detached = []
        self.released = []
        self.pins = []
        self.reservations = []
        self.model = {}  # (partition, key name) -> bytes
        self.calls = self.ok = self.refused = self.crashes = 0
        self.reads = self.wrong = 0

    # Arguments.
    def name(self):
        return "fuzz-%d" % self.r.randrange(KEYS)

    def key(self):
        """A key argument: usually a valid name, else a wrong or odd one."""
        n = self.name()
        return self.r.choice(
            [n] * 8
            + [n.encode(), None, -1, 2**128, 2**200, 1.5, [n], b"", "", object(), cxlkv.Key.from_bytes(n.encode())]
        )

    def data(self, most=BLOCK):
        n = self.r.choice([0, 1, most, self.r.randrange(most + 1), self.r.randrange(most + 1)])
        b = self.r.randbytes(n)
        return b, self.r.choice(
            [b, b, bytearray(b), np.frombuffer(b, np.uint8), memoryview(b), None, 42, "text", np.zeros((3, 3))[:, 0]]
        )

    @staticmethod
    def plain(arg):
        """Whether the library stores `arg` as its bytes (the data arguments it accepts)."""
        return isinstance(arg, (bytes, bytearray, memoryview)) or (
            isinstance(arg, np.ndarray) and arg.dtype == np.uint8
        )

    def who(self):
        """A participant: usually a live one, else a detached one (its calls raise ClosedError)."""
        if not self.participants:
            self.release_holds()
            self.participants.append(self.pool.attach())
        return self.r.choice(self.participants * 12 + self.detached[-3:])

    def release_holds(self):
        """Releases every pin and reservation (they keep a detached participant's slot held)."""
        for pin in self.pins:
            pin.release()
        for res, *_ in self.reservations:
            res.abort()
        self.pins, self.reservations = [], []

    def partition(self, p):
        try:
            return p.partition
        except Exception:
            return None

    @staticmethod
    def norm(key):
        """The key's number (names, bytes and `Key`s of one name are one key), or None."""
        if isinstance(key, str):
            key = key.encode()
        if isinstance(key, bytes):
            return int(cxlkv.Key.from_bytes(key))
        if isinstance(key, cxlkv.Key):
            return int(key)
        return None

    def check_read(self, key, got, how):
        self.reads += 1
        key = self.norm(key)
        if not any(k == key and v == got for (_, k), v in self.model.items()):
            self.wrong += 1
            print("WRONG READ: %s of %s returned %d bytes no put stored" % (how, key, len(got)))

    def stored(self, p, key, arg, raw):
        """Records a successful put of `raw` (when the argument was the same bytes) under `key`."""
        part = self.partition(p)
        if part is not None and self.norm(key) is not None:
            self.model[(part, self.norm(key))] = raw

    # One call.
    def step(self):
        r = self.r
        op = r.randrange(21)
        p = self.who()
        key = self.key()
        if op in (0, 1):
            raw, arg = self.data(3 * BLOCK if r.random() < 0.15 else BLOCK)
            p.put(key, arg)
            if self.plain(arg):
                self.stored(p, key, arg, bytes(raw))
        elif op == 2:
            raw, arg = self.data()
            if p.put_if_absent(key, arg) is True and self.plain(arg):
                self.stored(p, key, arg, raw)
        elif op in (3, 4):
            cap = r.choice([0, 1, BLOCK, 3 * BLOCK, r.randrange(3 * BLOCK)])
            out = r.choice([bytearray(cap), np.zeros(cap, np.uint8), bytes(cap), None, np.zeros((cap, 2))[:, 0]])
            n = p.get_into(key, out)
            if n is not None and isinstance(out, (bytearray, np.ndarray)):
                self.check_read(key, bytes(memoryview(out).cast("B")[:n]), "get_into")
        elif op == 5:
            got = p.get(key)
            if got is not None:
                self.check_read(key, bytes(memoryview(got).cast("B")), "get")
        elif op == 6:
            if p.delete(key):
                self.model.pop((self.partition(p), self.norm(key)), None)
        elif op == 7:
            keys = [self.key() for _ in range(r.randrange(6))]
            raws = [self.data() for _ in keys]
            p.batch_put(keys, [a for _, a in raws])
            for k, (raw, a) in zip(keys, raws):
                if self.plain(a):
                    self.stored(p, k, a, raw)
        elif op == 8:
            keys = [self.key() for _ in range(r.randrange(6))]
            outs = [bytearray(r.choice([0, 10, BLOCK])) for _ in keys]
            lens = p.batch_get_into(keys, outs)
            for k, o, n in zip(keys, outs, lens or []):
                if isinstance(n, int) and n >= 0:
                    self.check_read(k, bytes(o[:n]), "batch_get_into")
        elif op == 9:
            keys = [self.key() for _ in range(r.randrange(6))]
            target = r.choice([p, self.pool])
            r.choice([target.batch_contains, target.lookup_prefix])(r.choice([keys, None, 5, "abc"]))
        elif op == 10:
            r.choice([self.pool, p]).contains(key)
            r.choice([self.pool, p]).length(key)
        elif op == 11:
            pin = p.pin(key)
            if pin is not None:
                with memoryview(pin) as mv, mv.cast("B") as view:
                    got = bytes(view)
                self.check_read(key, got, "pin")
                self.pins.append(pin)
                if len(self.pins) > 8:
                    self.pins.pop(0).release()
        elif op == 12:
            if self.pins and r.random() < 0.8:
                pin = self.pins.pop(r.randrange(len(self.pins)))
                pin.release()
                self.released.append(pin)
            elif self.released:
                pin = r.choice(self.released)
                r.choice([pin.release, pin.__len__, lambda: memoryview(pin), lambda: pin.read_into(bytearray(8))])()
        elif op == 13:
            if self.pins:
                pin = r.choice(self.pins)
                out = bytearray(r.choice([0, 5, BLOCK]))
                pin.read_into(out, r.choice([0, 1, len(pin), len(pin) + 1, -1, 2**70]))
        elif op == 14:
            n = r.choice([0, 1, BLOCK, BLOCK + 1, r.randrange(BLOCK), -1, 2**64])
            res = p.reserve(key, n)
            raw = r.randbytes(n)
            try:
                res.write(raw, 0)
            except BaseException:
                res.abort()
                raise
            # Its partition now: a commit after `p` is detached still lands there.
            self.reservations.append((res, self.partition(p), key, raw))
            if len(self.reservations) > 4:
                self.reservations.pop(0)[0].abort()
            # A write past the end or at a bad offset is refused and changes nothing.
            res.write(raw or b"x", r.choice([1, n, -1, 2**64]))
        elif op == 15:
            if self.reservations:
                res, part, k, raw = self.reservations.pop(r.randrange(len(self.reservations)))
                if r.random() < 0.5:
                    res.commit()
                    if part is not None and self.norm(k) is not None:
                        self.model[(part, self.norm(k))] = raw
                else:
                    res.abort()
                r.choice([res.commit, res.abort, res.__len__])()
        elif op == 16:
            if len(self.participants) < PARTICIPANTS and r.random() < 0.5:
                if r.random() < 0.4:
                    # As a tenant (format 3.2): names and salts valid and not.
                    self.participants.append(
                        self.pool.attach(
                            tenant=r.choice(["t1", "t2", "", "x" * 300, None, 5, b"t1"]),
                            salt=r.choice([b"s1", b"", None, "s1", 5]),
                        )
                    )
                else:
                    self.participants.append(self.pool.attach())
            elif self.participants and r.random() < 0.2:
                # Its pins and reservations would keep its slot held: release them first, mostly.
                if r.random() < 0.8:
                    self.release_holds()
                q = self.participants.pop(r.randrange(len(self.participants)))
                q.detach()
                self.detached.append(q)
                del self.detached[:-8]
        elif op == 17:
            cxlkv.Pool.create(
                r.choice(["bogus:x", "shm:", "file:/nonexistent/x", None, 5]),
                r.choice([0, 4096, 1 << 20, 2**64 - 1, -1]),
                block_size=r.choice([None, 0, 4095, 4096, 2**63, 2**64 - 4096]),
                participants=r.choice([None, 0, 1, 2**31, -1]),
                mode=r.choice([None, 0o600, 0o7777, -1, "rw"]),
                owner=r.choice([None, "no-such-user-cxlkv", 2**40]),
            )
        elif op == 18:
            if r.random() < 0.5:
                cxlkv.Pool.open(r.choice(["shm:cxlkv-py-fuzz-absent", "bogus", "", None, self.spec + "x"]))
            else:
                # The tenant table: declare, set a quota, list (names and quotas valid and not).
                name = r.choice(["t1", "t2", "", "x" * 300, None, 5])
                quota = r.choice([0, 1, 50, -1, 2**64, None, "q"])
                r.choice(
                    [
                        lambda: self.pool.declare_tenant(name, quota),
                        lambda: self.pool.set_tenant_quota(name, quota),
                        self.pool.tenants,
                    ]
                )()
        elif op == 19:
            self.batch(p, key)
        else:
            salt = r.choice([None, None, b"s1", b"", "s1", 5])
            if r.random() < 0.3:
                cxlkv.Key.from_bytes(r.choice([b"n", "n", None, 5]), salt=salt)
                return
            cxlkv.key_chain(
                r.choice(["tenant", "", None]),
                r.choice(["m", None]),
                r.choice([0, 3, -1]),
                r.choice([0, 3, 2**32]),
                r.choice([[r.randrange(50_000) for _ in range(r.randrange(40))], [], [-1], None]),
                r.choice([0, 1, 16, -1]),
                salt=salt,
            )

    def batch(self, p, key):
        """Reservations of many keys (`reserve_many`), landed with trailers whose length or CRC
        may be wrong, committed together with sizes valid and not (`commit_trailed`), or aborted;
        and room kept ahead (`keep_free`)."""
        import ctypes
        import struct

        r = self.r
        if r.random() < 0.2:
            p.keep_free(r.choice([0, 1, 10, 2**64, -1]), r.choice([0, 5, 2**64, -1]))
            return
        keys = r.choice([[self.key() for _ in range(r.randrange(5))], [key, key], None, 5])
        n = r.choice([16, 100, BLOCK, BLOCK + 1, 15, -1, 2**64])
        batch = p.reserve_many(keys, n, evict=r.random() < 0.5)
        part = self.partition(p)
        landed = []
        for addr in batch.addresses:
            body = r.randbytes(r.randrange(n - 15))
            crc = cxlkv.crc32c(body) ^ (1 if r.random() < 0.1 else 0)
            length = len(body) + (1 if r.random() < 0.05 else 0)
            data = body + struct.pack("<QQ", length, crc)
            ctypes.memmove(addr, data, len(data))
            landed.append((len(data), body, length == len(body) and crc == cxlkv.crc32c(body)))
        if r.random() < 0.1:
            batch.abort()
            r.choice([batch.abort, lambda: batch.commit_trailed([20])])()
            return
        sizes = [size for size, _, _ in landed][: r.randrange(len(landed) + 1)]
        if sizes and r.random() < 0.1:
            sizes[r.randrange(len(sizes))] = r.choice([0, 15, n + 1, 2**64, -1])
        done, why = batch.commit_trailed(sizes)
        good = 0
        for size, (landed_size, body, ok) in zip(sizes, landed):
            if size != landed_size or not ok:
                break
            good += 1
        assert done == good, (done, good, why)
        for k, (_, body, _) in zip(keys[:done], landed):
            if part is not None and self.norm(k) is not None:
                self.model[(part, self.norm(k))] = body

    def call(self):
        self.calls += 1
        try:
            self.step()
            self.ok += 1
        except EXPECTED as e:
            self.refused += 1
            if os.environ.get("CXLKV_PY_FUZZ_VERBOSE"):
                print("refused: %s: %s" % (type(e).__name__, str(e)[:90]))
        except Exception as e:  # a documented refusal would be one of EXPECTED
            self.crashes += 1
            print("CRASH: %s: %s" % (type(e).__name__, e))
        except BaseException as e:  # a Rust panic (pyo3_runtime.PanicException)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            self.crashes += 1
            print("CRASH (panic): %s: %s" % (type(e).__name__, e))

    def release_all(self):
        self.release_holds()
        for q in self.participants:
            q.detach()
        self.pins, self.reservations, self.participants, self.detached, self.released = [], [], [], [], []


def test_malformed_calls_never_crash_misread_or_leak(spec):
    calls = int(os.environ.get("CXLKV_PY_FUZZ_CALLS", "3000"))
    seed = int(os.environ.get("CXLKV_PY_FUZZ_SEED", "20261127"))
    f = Fuzz(spec, seed)
    warm = min(calls // 10, 500)
    for _ in range(warm):
        f.call()
    before = _resources()
    start = time.monotonic()
    for _ in range(calls - warm):
        f.call()
    elapsed = time.monotonic() - start
    f.release_all()
    import gc

    gc.collect()
    # Leaks: every slot attaches again, each as the tenant whose blocks its partition still holds
    # (a partition tagged with a tenant is claimed only by that tenant); descriptors and memory
    # back near where they were.
    tenants = [t["name"] for t in f.pool.tenants() if t["id"] != 0 for _ in range(t["partitions"])]
    again = [f.pool.attach(tenant=name, salt=b"s1") for name in tenants]
    again += [f.pool.attach() for _ in range(PARTICIPANTS - len(again))]
    slots_free = sum(1 for q in again if q.partition is not None)
    for q in again:
        q.detach()
    f.pool.close()
    after = _resources()
    rss_growth = (after[0] - before[0]) // 1024
    print(
        "Python: %d calls (%d after warm-up in %.1f s; seed %d; CXLKV_PY_FUZZ_CALLS/_SEED): %d ok, %d refused; "
        "crashes %d, wrong reads %d of %d checked, leaks: slots free %d of %d, fds %+d, resident memory %+d MiB"
        % (
            f.calls, calls - warm, elapsed, seed, f.ok, f.refused, f.crashes, f.wrong, f.reads,
            slots_free, PARTICIPANTS, after[1] - before[1], rss_growth,
        )
    )
    assert f.crashes == 0
    assert f.wrong == 0
    assert slots_free == PARTICIPANTS
    assert after[1] <= before[1]
    assert rss_growth < 64
    # The run must have exercised what it claims: successes, refusals and checked reads.
    assert f.ok > calls // 10 and f.refused > calls // 10 and f.reads > calls // 200


def test_a_released_pin_or_reservation_does_not_hold_the_slot(spec):
    """Found by the loop above: a released pin (or a finished reservation) kept its participant
    attached until the Python object was collected, so after `detach()` the slot stayed held and
    `attach()` failed with FullError while the object was still referenced."""
    with cxlkv.Pool.create(spec, 4 << 20, block_size=BLOCK, participants=2) as pool:
        kept = []
        for _ in range(3):
            me = pool.attach()
            me.put("k", b"v" * 100)
            pin = me.pin("k")
            pin.release()
            res = me.reserve("r", 10)
            res.write(b"x" * 10)
            res.commit()
            aborted = me.reserve("a", 10)
            aborted.abort()
            me.detach()
            kept += [pin, res, aborted]  # still referenced: must not keep `me` attached
        both = [pool.attach(), pool.attach()]
        assert all(q.partition is not None for q in both)
        for q in both:
            q.detach()
