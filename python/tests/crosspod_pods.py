"""The cross-pod tier end to end (scripts/crosspod.sh test; docs/CROSSPOD.md): a mooncake_master
and two pods, each with its own pool, supervised bridges (one per tenant) and participant processes,
all inside the private network namespace the script made. Prints one line per check of issue #25
and exits non-zero if any fails. Every process started here is stopped by its pid."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import cxlkv

BLOCK = 256 << 10
PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TENANTS = {"t1": b"salt-one", "t2": b"salt-two", "t3": b"salt-three"}
SERVED = ("t1", "t2")  # tenants whose bridges start with the pods (t3's start in check 7)
procs = []  # (name, Popen): stopped by pid at the end
results = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, limit=20.0):
    end = time.time() + limit
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError("%s exited with %s" % (what, proc.returncode))
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("%s did not listen on %d" % (what, port))


def start(name, argv, log, env=None):
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    procs.append((name, p))
    return p


def stop(p):
    if p.poll() is None:
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()


class Pod:
    def __init__(self, name, work, master, size=192 << 20, segment_mib=96, block=BLOCK + 4096,
                 served=SERVED):
        self.name, self.work, self.master = name, work, master
        self.spec = "shm:cxlkv-xp-%s-%d" % (name, os.getpid())
        self.pool = cxlkv.Pool.create(self.spec, size, block_size=block, participants=16)
        for t in TENANTS:
            self.pool.declare_tenant(t)
        self.segment_mib = segment_mib
        self.log = open(os.path.join(work, "pod-%s.log" % name), "w")
        self.bridges = {}
        for t in served:
            self.start_bridge(t)

    def sock(self, tenant):
        return os.path.join(self.work, "%s-%s.sock" % (self.name, tenant))

    def pid_file(self, tenant):
        return os.path.join(self.work, "%s-%s.pid" % (self.name, tenant))

    def start_bridge(self, tenant, publish="on-put"):
        env = dict(os.environ, CXLKV_CROSSPOD_TEST_PAUSE=os.path.join(self.work, "pause-%s" % self.name))
        argv = [PY, "-m", "cxlkv.crosspod", "serve", "--pool", self.spec, "--master", self.master,
                "--socket", self.sock(tenant), "--tenant", tenant, "--salt", TENANTS[tenant].hex(),
                "--model", "smollm2", "--segment-mib", str(self.segment_mib),
                "--pid-file", self.pid_file(tenant), "--publish", publish]
        self.bridges[tenant] = start("bridge %s/%s" % (self.name, tenant), argv, self.log, env)
        self.wait_bridge(tenant)

    def wait_bridge(self, tenant, old_pid=None, limit=20.0):
        end = time.time() + limit
        while time.time() < end:
            pid = self.bridge_pid(tenant)
            if pid and pid != old_pid and cxlkv.crosspod.stat(self.sock(tenant), 0.5) is not None:
                return pid
            time.sleep(0.1)
        raise RuntimeError("bridge %s/%s did not come up" % (self.name, tenant))

    def bridge_pid(self, tenant):
        try:
            with open(self.pid_file(tenant)) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def run(self, tenant, code, crosspod=True, timeout=60):
        """Runs `code` in a participant process of this pod as `tenant` (`me`, `pool`, `keys`
        are bound; it sets `out`), returns `out`."""
        prelude = ("import cxlkv, json, sys, hashlib, numpy as np\n"
                   "pool = cxlkv.Pool.open(%r)\n"
                   "me = pool.attach(tenant=%r, salt=%r)\n"
                   "args = json.loads(sys.stdin.read())\n"
                   "keys = [cxlkv.Key(int(k)) for k in args.get('keys', [])]\n"
                   "out = None\n") % (self.spec, tenant, TENANTS[tenant])
        env = dict(os.environ, CXLKV_CROSSPOD_WRITE_BACK_MS="2000")
        env.pop("CXLKV_CROSSPOD_SOCKET", None)
        if crosspod:
            env["CXLKV_CROSSPOD_SOCKET"] = self.sock(tenant)
        r = subprocess.run([PY, "-c", prelude + code + "\nme.detach()\nprint(json.dumps(out))"],
                           input=json.dumps(self.args), capture_output=True, text=True, env=env,
                           timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError("participant of pod %s failed: %s" % (self.name, r.stderr[-2000:]))
        return json.loads(r.stdout.strip().splitlines()[-1])

    def call(self, tenant, code, crosspod=True, **args):
        self.args = {k: ([str(int(x)) for x in v] if k == "keys" else v) for k, v in args.items()}
        return self.run(tenant, code, crosspod)


PUT = """
for i, k in enumerate(keys):
    me.put(k, np.random.default_rng(args['seed'] * 1000 + i).integers(0, 256, args['size'], np.uint8))
out = len(keys)
"""
DIGESTS = """
out = []
for k in keys:
    v = me.get(k)
    out.append(None if v is None else hashlib.sha256(bytes(v)).hexdigest())
"""
# Puts key i with args['sizes'][i] bytes.
PUT_SIZES = """
for i, k in enumerate(keys):
    me.put(k, np.random.default_rng(args['seed'] * 1000 + i).integers(0, 256, args['sizes'][i], np.uint8))
out = len(keys)
"""
LOOKUP = "out = me.lookup_prefix(keys)"
LOOKUP_AND_DIGESTS = "n = me.lookup_prefix(keys)\n" + DIGESTS + "\nout = [n, out]"
DELETE = "out = sum(bool(me.delete(k)) for k in keys)"
# Puts `keys`, then (with the pod's bridge stopped by SIGSTOP, pid `stop`) the keys `more`;
# `out`: for each round, the slowest put (s) and this process's write-back counts by result so far.
PUT_WRITE_BACKS = """
import os, re, signal, time
def puts(ks, first):
    slowest = 0.0
    for i, k in enumerate(ks):
        rng = np.random.default_rng(args['seed'] * 1000 + first + i)
        v = rng.integers(0, 256, args['size'], np.uint8)
        t = time.perf_counter()
        me.put(k, v)
        slowest = max(slowest, time.perf_counter() - t)
    found = re.findall(r'cxlkv_crosspod_write_backs_total\\{result="(\\w+)"\\} (\\S+)',
                       cxlkv.metrics_text())
    return [slowest, {r: int(float(n)) for r, n in found if float(n)}]
out = puts(keys, 0)
# The stuck bridge meets the default timeout (the first round's longer one only keeps a loaded
# machine from failing the check).
del os.environ['CXLKV_CROSSPOD_WRITE_BACK_MS']
os.kill(args['stop'], signal.SIGSTOP)
try:
    out += puts([cxlkv.Key(int(k)) for k in args['more']], len(keys))
finally:
    os.kill(args['stop'], signal.SIGCONT)
"""


def expected(seed, n, size=BLOCK):
    return [hashlib.sha256(np.random.default_rng(seed * 1000 + i).integers(0, 256, size, np.uint8)
                           .tobytes()).hexdigest() for i in range(n)]


def chain(tag, tenant, n):
    return cxlkv.key_chain("crosspod-test", tag, 0, 0, list(range(1, 16 * n + 1)), 16,
                           salt=TENANTS[tenant])


def check(num, title, fn):
    t = time.time()
    try:
        ok, detail = fn()
    except Exception as e:  # a check that raises fails, and the others still run
        ok, detail = False, "%s: %s" % (type(e).__name__, e)
    results.append(ok)
    print("check %d %s: %s (%.1f s) %s" % (num, "PASS" if ok else "FAIL", title, time.time() - t,
                                           detail), flush=True)


def stat(pod, tenant="t1"):
    return cxlkv.crosspod.stat(pod.sock(tenant)) or {}


def main():
    import cxlkv.crosspod  # noqa: F401  (the client, for stat and publish)
    import mooncake

    work = tempfile.mkdtemp(prefix="cxlkv-crosspod-")
    master_exe = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
    port = free_port()
    mlog = open(os.path.join(work, "master.log"), "w")
    master = start("mooncake_master", [master_exe, "--port", str(port)], mlog)
    wait_port(port, master, "mooncake_master")
    addr = "127.0.0.1:%d" % port
    a, b = Pod("a", work, addr), Pod("b", work, addr)
    print("work dir %s; master pid %d; bridges %s" % (
        work, master.pid, {"%s/%s" % (p.name, t): p.bridge_pid(t) for p in (a, b) for t in SERVED}),
        flush=True)
    try:
        run_checks(a, b, work, master_exe, port, mlog)
    finally:
        for name, p in reversed(procs):
            stop(p)
        for p in (a, b):
            p.pool.unlink()
    passed = sum(results)
    print("crosspod: %d of %d checks pass" % (passed, len(results)), flush=True)
    return 0 if passed == len(results) else 1


def run_checks(a, b, work, master_exe, port, mlog):
    def one():
        keys = chain("one", "t1", 8)
        a.call("t1", PUT, keys=keys, seed=1, size=BLOCK)
        published = cxlkv.crosspod.publish(a.sock("t1"), keys)
        before = stat(b)["imported"]
        n, digests = b.call("t1", LOOKUP_AND_DIGESTS, keys=keys)
        mid = stat(b)["imported"]
        n2 = b.call("t1", LOOKUP, keys=keys)
        after = stat(b)["imported"]
        ok = (published == 8 and n == 8 and digests == expected(1, 8) and mid - before == 8
              and n2 == 8 and after == mid)
        return ok, "published %s, B found %d, byte-exact %s, imported %d then %d more" % (
            published, n, digests == expected(1, 8), mid - before, after - mid)

    def two():
        keys = chain("two", "t1", 8)
        # No write-through: only what is published explicitly reaches the store.
        a.call("t1", PUT, crosspod=False, keys=keys, seed=2, size=BLOCK)
        published = cxlkv.crosspod.publish(a.sock("t1"), keys[:5])
        n, digests = b.call("t1", LOOKUP_AND_DIGESTS, keys=keys)
        ok = published == 5 and n == 5 and digests[:5] == expected(2, 5) and digests[5:] == [None] * 3
        return ok, "5 of 8 published, B found %d, first 5 byte-exact %s" % (
            n, digests[:5] == expected(2, 5))

    def three():
        keys = chain("three", "t1", 6)
        a.call("t1", PUT, crosspod=False, keys=keys, seed=3, size=BLOCK)
        b.call("t1", PUT, crosspod=False, keys=keys, seed=4, size=BLOCK)
        got = {}
        ts = [threading.Thread(target=lambda p: got.__setitem__(p.name, cxlkv.crosspod.publish(
            p.sock("t1"), keys)), args=(p,)) for p in (a, b)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        b.call("t1", DELETE, keys=keys)
        n, digests = b.call("t1", LOOKUP_AND_DIGESTS, keys=keys)
        whole = [d in (x, y) for d, x, y in zip(digests[:n], expected(3, 6), expected(4, 6))]
        ok = all(whole) and all(d is None for d in digests[n:]) and n > 0
        return ok, "publish answers %s; B re-imported %d of 6, each one pod's whole value: %s" % (
            got, n, all(whole))

    def four():
        keys = chain("four", "t1", 4)
        a.call("t1", PUT, keys=keys, seed=5, size=BLOCK)
        cxlkv.crosspod.publish(a.sock("t1"), keys)
        old = a.bridge_pid("t1")
        os.kill(old, signal.SIGKILL)
        t = time.time()
        n, digests = b.call("t1", LOOKUP_AND_DIGESTS, keys=keys)
        took = time.time() - t
        chk = b.pool.check()
        fails = stat(b)["failures"]
        new = a.wait_bridge("t1", old)
        again = cxlkv.crosspod.publish(a.sock("t1"), keys)
        n2, d2 = b.call("t1", LOOKUP_AND_DIGESTS, keys=keys)
        ok = (n == 0 and digests == [None] * 4 and chk.get("ok", False) and again == 4 and n2 == 4
              and d2 == expected(5, 4))
        return ok, ("A's bridge %d killed: B found %d in %.2f s (failures %s), pool check ok=%s; "
                    "A's bridge restarted as %d, republished %s, B found %d byte-exact %s") % (
            old, n, took, fails, chk.get("ok"), new, again, n2, d2 == expected(5, 4))

    def five():
        keys = chain("five", "t1", 16)
        a.call("t1", PUT, keys=keys, seed=6, size=BLOCK)
        cxlkv.crosspod.publish(a.sock("t1"), keys)
        pause = os.path.join(work, "pause-b")
        open(pause, "w").close()
        out = {}
        th = threading.Thread(target=lambda: out.setdefault("r", b.call("t1", LOOKUP_AND_DIGESTS,
                                                                        keys=keys)))
        th.start()
        time.sleep(1.0)  # the import has reserved and read its blocks and waits on the flag
        old = b.bridge_pid("t1")
        os.kill(old, signal.SIGKILL)
        th.join()
        os.unlink(pause)
        n, digests = out["r"]
        chk = b.pool.check()
        b.wait_bridge("t1", old)
        n2, d2 = b.call("t1", LOOKUP_AND_DIGESTS, keys=keys)
        ok = (n == 0 and digests == [None] * 16 and chk.get("ok", False) and n2 == 16
              and d2 == expected(6, 16))
        return ok, ("B's bridge %d killed mid-import: B found %d, visible %d, pool check %s; after "
                    "restart B imported %d byte-exact %s") % (
            old, n, sum(d is not None for d in digests), json.dumps(chk)[:200], n2,
            d2 == expected(6, 16))

    def six():
        keys = chain("one", "t1", 8)
        stop(dict((n, p) for n, p in procs)["mooncake_master"])
        local = b.call("t1", LOOKUP_AND_DIGESTS, keys=keys)
        m2 = start("mooncake_master (restarted)", [master_exe, "--port", str(port)], mlog)
        wait_port(port, m2, "mooncake_master")
        fresh = chain("six", "t1", 4)
        a.call("t1", PUT, keys=fresh, seed=7, size=BLOCK)
        end, n, pub = time.time() + 30, 0, None
        while time.time() < end and n != 4:
            pub = cxlkv.crosspod.publish(a.sock("t1"), fresh)
            n, d = b.call("t1", LOOKUP_AND_DIGESTS, keys=fresh)
            if n != 4:
                time.sleep(1)
        ok = local[0] == 8 and local[1] == expected(1, 8) and n == 4 and d == expected(7, 4)
        return ok, "master down: B's local hits %d byte-exact %s; after restart publish %s, B found %d" % (
            local[0], local[1] == expected(1, 8), pub, n)

    def seven():
        for p in (a, b):
            p.start_bridge("t3", publish="on-eviction")
        a.pool.set_tenant_quota("t3", 4)
        keys = chain("seven", "t3", 10)
        # 8 puts under a quota of 4: the last 4 each evict the least recent, keys[0..4], which
        # are written back. Then A's bridge is stopped (SIGSTOP: stuck) for 2 more puts: the
        # first eviction waits out the timeout, the next one does not wait at all, and both
        # blocks are dropped as without the tier.
        slow, wb, slow2, wb2 = a.call("t3", PUT_WRITE_BACKS, keys=keys[:8], seed=10, size=BLOCK,
                                      more=[str(int(k)) for k in keys[8:]],
                                      stop=a.bridge_pid("t3"))
        left = a.call("t3", LOOKUP, crosspod=False, keys=keys[:4])
        n, digests = b.call("t3", LOOKUP_AND_DIGESTS, keys=keys[:4])
        gone = b.call("t3", LOOKUP, keys=keys[4:6])
        written = stat(a, "t3").get("written_back")
        ok = (wb == {"published": 4} and left == 0 and n == 4 and digests == expected(10, 4)
              and written == 4 and wb2 == {"published": 4, "timeout": 1, "quiet": 1}
              and slow2 < 0.5 and gone == 0)
        return ok, ("A evicted 4 of 8 under quota 4: write-backs %s (slowest put %.0f ms), A still "
                    "holds %d of them; B found %d byte-exact %s; A's bridge wrote back %s. A's "
                    "bridge stopped for 2 more puts: write-backs %s, slowest put %.0f ms; B finds "
                    "%d of those 2 victims") % (
            wb, slow * 1e3, left, n, digests == expected(10, 4), written, wb2, slow2 * 1e3, gone)

    def eight():
        k1 = chain("eight", "t1", 4)
        k2 = chain("eight", "t2", 4)
        a.call("t1", PUT, keys=k1, seed=8, size=BLOCK)
        a.call("t2", PUT, keys=k2, seed=9, size=BLOCK)
        p1 = cxlkv.crosspod.publish(a.sock("t1"), k1)
        p2 = cxlkv.crosspod.publish(a.sock("t2"), k2)
        cross = b.call("t2", LOOKUP_AND_DIGESTS, keys=k1)  # t2 given t1's keys
        cross2 = b.call("t1", LOOKUP_AND_DIGESTS, keys=k2)
        own = b.call("t2", LOOKUP_AND_DIGESTS, keys=k2)
        ok = (p1 == 4 and p2 == 4 and cross[0] == 0 and cross2[0] == 0 and own[0] == 4
              and own[1] == expected(9, 4))
        return ok, "t2 in B given t1's keys finds %d, t1 given t2's finds %d; t2 finds its own %d" % (
            cross[0], cross2[0], own[0])

    def bad_input():
        pid = b.bridge_pid("t1")
        answers = [cxlkv.crosspod.client.request(b.sock("t1"), line) for line in
                   ("import 2 zz", "publish x", "import 1 " + "f" * 31, "hello")]
        alive = stat(b) != {} and b.bridge_pid("t1") == pid
        ok = all(a and a.startswith("err ") for a in answers) and alive
        return ok, "answers %s; same bridge serving: %s" % (answers, alive)

    def sizes():
        # Small objects and objects of a whole block (no room for the trailer beside it: the
        # import reads those scattered), mixed in one chain.
        full = a.pool.block_size
        lens = [100, full, 1, BLOCK, full, full - 16, full - 15]
        keys = chain("sizes", "t1", len(lens))
        a.call("t1", PUT_SIZES, keys=keys, seed=13, sizes=lens)
        published = cxlkv.crosspod.publish(a.sock("t1"), keys)
        n, digests = b.call("t1", LOOKUP_AND_DIGESTS, keys=keys)
        want = [expected(13, len(lens), size)[i] for i, size in enumerate(lens)]
        ok = published == len(lens) and n == len(lens) and digests == want
        return ok, "payloads of %s bytes (blocks of %d): published %s, B found %d, byte-exact %s" % (
            lens, full, published, n, digests == want)

    def through():
        # Write-through: pod A's participant only puts (its runtime queues each key for its
        # bridge, and its detach waits for the queue); B finds the whole prefix.
        keys = chain("through", "t1", 8)
        before = stat(a)["published"]
        a.call("t1", PUT, keys=keys, seed=14, size=BLOCK)
        published = stat(a)["published"] - before
        n, digests = b.call("t1", LOOKUP_AND_DIGESTS, keys=keys)
        ok = published == 8 and n == 8 and digests == expected(14, 8)
        return ok, "A put 8 with no publish call: its bridge published %d; B found %d, byte-exact %s" % (
            published, n, digests == expected(14, 8))

    def objects():
        # Multi-block objects (values over a block: parts and a manifest) in a chain with single
        # blocks: written through by A's puts, then one more published explicitly; B finds them
        # all byte-exact, and a second lookup is local.
        full = a.pool.block_size
        lens = [BLOCK, 3 * BLOCK + 5, full, 2 * full + 1, 100]
        keys = chain("objects", "t1", len(lens))
        before = stat(a)["published"]
        a.call("t1", PUT_SIZES, keys=keys[:4], seed=15, sizes=lens[:4])
        through = stat(a)["published"] - before
        a.call("t1", PUT_SIZES, crosspod=False, keys=keys[4:], seed=16, sizes=lens[4:])
        published = cxlkv.crosspod.publish(a.sock("t1"), keys)
        imported = stat(b)["imported"]
        n, digests = b.call("t1", LOOKUP_AND_DIGESTS, keys=keys)
        imported = stat(b)["imported"] - imported
        again = b.call("t1", LOOKUP, keys=keys)
        local = stat(b)["imported"] - imported
        want = [expected(15, 4, size)[i] for i, size in enumerate(lens[:4])]
        want += expected(16, 1, lens[4])
        ok = (through == 4 and published == 5 and n == 5 and digests == want and imported == 5
              and again == 5)
        return ok, ("values of %s bytes (blocks of %d): A's puts wrote through %d, an explicit "
                    "publish of all 5 answered %s; B imported %d, found %d, byte-exact %s; again "
                    "%d (local)") % (lens, full, through, published, imported, n, digests == want,
                                     again)

    def object_write_back():
        # An object evicted under A's tenant quota is written back whole and found from B.
        a.pool.set_tenant_quota("t3", 12)
        keys = chain("objwb", "t3", 4)
        sizes = [3 * BLOCK] * 4  # 4 blocks each (parts and manifest): the 4th evicts the 1st
        a.call("t3", PUT_SIZES, keys=keys, seed=17, sizes=sizes)
        left = a.call("t3", LOOKUP, crosspod=False, keys=keys[:1])
        n, digests = b.call("t3", LOOKUP_AND_DIGESTS, keys=keys[:1])
        written = stat(a, "t3").get("written_back")
        ok = left == 0 and n == 1 and digests == expected(17, 1, 3 * BLOCK)
        return ok, ("A evicted its first object under quota 12 (bridge wrote back %s in all, "
                    "A still holds %d); B found %d, byte-exact %s") % (
            written, left, n, digests == expected(17, 1, 3 * BLOCK))

    def missing_chain():
        # Pod B's tenant t2 at its quota (any reservation would evict): a chain the store lacks
        # costs it nothing; one the store has is imported, evicting as a put would.
        held = chain("eight", "t2", 4)  # t2's 4 blocks in B, from check 8
        before = b.call("t2", LOOKUP, crosspod=False, keys=held)
        b.pool.set_tenant_quota("t2", before)
        try:
            n = b.call("t2", LOOKUP, keys=chain("missing", "t2", 6))
            after = b.call("t2", LOOKUP, crosspod=False, keys=held)
            fresh = chain("present", "t2", 2)
            a.call("t2", PUT, keys=fresh, seed=18, size=BLOCK)
            published = cxlkv.crosspod.publish(a.sock("t2"), fresh)
            m, digests = b.call("t2", LOOKUP_AND_DIGESTS, keys=fresh)
        finally:
            b.pool.set_tenant_quota("t2", 0)
        ok = (before == 4 and n == 0 and after == 4 and published == 2 and m == 2
              and digests == expected(18, 2))
        return ok, ("t2 in B at its quota of %d blocks: a chain the store lacks found %d, B still "
                    "holds %d of 4; a published chain of 2 imported %d, byte-exact %s") % (
            before, n, after, m, digests == expected(18, 2))

    check(1, "a prefix put in pod A is found by pod B, byte-exact; B's second read is local", one)
    check(2, "a partial chain is found exactly as far as it exists", two)
    check(3, "both pods publishing the same keys at once leave one whole value", three)
    check(4, "pod A's bridge SIGKILLed: B gets misses, never wrong bytes; pool check passes", four)
    check(5, "B's bridge SIGKILLed mid-import: nothing half-visible, pool check passes", five)
    check(6, "master restarted: local hits keep working, cross-pod hits return", six)
    check(7, "eviction in pod A with write-back: the block is still found from pod B", seven)
    check(8, "tenants across pods never see each other's keys", eight)
    check(9, "(extra) bad requests are refused and the bridge keeps serving", bad_input)
    check(10, "(extra) payloads from 1 byte to a whole block, mixed in one chain", sizes)
    check(11, "(extra) write-through: a put in pod A, with no publish call, is found from pod B", through)
    check(12, "(extra) multi-block objects in a chain: written through, published, imported whole",
          objects)
    check(13, "(extra) a multi-block object evicted in pod A is written back whole", object_write_back)
    check(14, "(extra) a chain the store lacks costs a pool at its quota nothing", missing_chain)

    exe = os.environ.get("CXLKV_BIN") or os.path.join(ROOT, "target", "debug", "cxlkv")
    if os.access(exe, os.X_OK):
        def metrics():
            r = subprocess.run([exe, "crosspod", "stat", "--socket", b.sock("t1")],
                               capture_output=True, text=True, timeout=30)
            imported = [ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("imported ")]
            ps = subprocess.run([exe, "pool", "stat", b.spec, "--watch-ms", "0"],
                                capture_output=True, text=True, timeout=30,
                                env=dict(os.environ, CXLKV_CROSSPOD_SOCKET=b.sock("t1")))
            tier = ps.stdout[ps.stdout.find("cross-pod tier"):]
            ok = (r.returncode == 0 and imported and int(imported[0]) > 0 and ps.returncode == 0
                  and tier.startswith("cross-pod tier (bridge") and "imported" in tier)
            return ok, "`cxlkv crosspod stat` of B's bridge:\n%s\n`cxlkv pool stat` ends:\n%s" % (
                r.stdout.rstrip(), tier.rstrip())

        check(0, "metrics: cxlkv crosspod stat and cxlkv pool stat", metrics)
    else:
        print("metrics: `cxlkv crosspod stat` not run: no %s (cargo build first)" % exe, flush=True)


if __name__ == "__main__":
    sys.exit(main())
