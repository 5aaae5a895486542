"""Direct put/get rows: the cxlkv pool (Python `Participant`), Redis 7 and Mooncake Store, values
of real KV bytes put by one process and got by another, with memcpy and read bandwidth of the
same bytes as the ceiling.

Each round, for each side in turn (the order rotates every round), the writer process puts a
fresh value (timed there), this process gets it into a buffer it holds (timed here) and checks
its bytes against the value it expects, then the writer removes it. So every side sees the same
machine state, and the memory held stays one value per side.

- cxlkv: `Participant.put` of a numpy array; `get_into` a numpy array (one copy out of the pool,
  its CRC-32C checked).
- Redis: `SET`/`GET` with redis-py over loopback (`GET` returns a new `bytes`).
- Mooncake Store: `put_from`/`get_into` registered numpy buffers, TCP transport on loopback, the
  master a child process; the reader mounts no segment, so every get crosses processes.
- ceiling: numpy `copyto` of the same bytes between two private arrays (memcpy) and a numpy sum
  over them (read bandwidth), interleaved with the gets.

The Redis server and the Mooncake master are started here, on 127.0.0.1 with private ports, and
stopped by their pids. Mooncake's listeners bind every interface: run this inside `unshare -n`
with only `lo` up (scripts/bench-peers.sh does).
"""

import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

import cxlkv
from common import Samples, error_row, kv_bytes, row

ENGINE = "kv store (2 processes)"
MIB = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, timeout=20.0):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError("%s exited with %s" % (what, proc.returncode))
        try:
            with socket.create_connection(("127.0.0.1", port), 0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("%s did not listen on 127.0.0.1:%d in %.0f s" % (what, port, timeout))


def stop(proc):
    """Stops a process this module started, by its pid."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- the clients of each side, the same code in the writer and the reader ----------------------


class CxlkvSide:
    name = "cxlkv"

    def __init__(self, spec):
        self.pool = cxlkv.Pool.open(spec)
        self.me = self.pool.attach()

    def put(self, key, arr):
        self.me.put(cxlkv.Key.from_bytes(key.encode()), arr)

    def get_into(self, key, out):
        return self.me.get_into(cxlkv.Key.from_bytes(key.encode()), out)

    def remove(self, key):
        self.me.delete(cxlkv.Key.from_bytes(key.encode()))

    def close(self):
        self.me.detach()
        self.pool.close()


class RedisSide:
    name = "redis"

    def __init__(self, port):
        import redis

        self.r = redis.Redis(host="127.0.0.1", port=port)

    def put(self, key, arr):
        self.r.set(key, memoryview(arr))

    def get_into(self, key, out):
        v = self.r.get(key)  # redis-py hands back a new bytes object: the client's own copy
        if v is None:
            return None
        out[: len(v)] = np.frombuffer(v, np.uint8)
        return len(v)

    def get(self, key):
        return self.r.get(key)

    def remove(self, key):
        self.r.delete(key)

    def close(self):
        self.r.close()


class MooncakeSide:
    name = "mooncake"

    def __init__(self, master_port, segment, buffers):
        from mooncake.store import MooncakeDistributedStore

        self.s = MooncakeDistributedStore()
        rc = self.s.setup(
            "127.0.0.1", "P2PHANDSHAKE", segment, 64 * MIB, "tcp", "", "127.0.0.1:%d" % master_port
        )
        if rc != 0:
            raise RuntimeError("MooncakeDistributedStore.setup returned %d" % rc)
        self.registered = set()
        for b in buffers:
            self.register(b)

    def register(self, arr):
        if arr.ctypes.data not in self.registered:
            rc = self.s.register_buffer(arr.ctypes.data, arr.nbytes)
            if rc != 0:
                raise RuntimeError("register_buffer returned %d" % rc)
            self.registered.add(arr.ctypes.data)

    def put(self, key, arr):
        rc = self.s.put_from(key, arr.ctypes.data, arr.nbytes)
        if rc != 0:
            raise RuntimeError("Mooncake put_from(%s) returned %d" % (key, rc))

    def get_into(self, key, out):
        n = self.s.get_into(key, out.ctypes.data, out.nbytes)
        return None if n < 0 else n

    def remove(self, key):
        self.s.remove(key, True)

    def close(self):
        self.s.close()


def _writer(conn, cfg):
    """The writer process: opens every side, then puts and removes on command, timing each put."""
    sides, values = {}, {}
    try:
        for size in cfg["sizes"]:
            values[size] = [kv_bytes(size, seed) for seed in range(2)]
        sides["cxlkv"] = CxlkvSide(cfg["spec"])
        if cfg.get("redis_port"):
            sides["redis"] = RedisSide(cfg["redis_port"])
        if cfg.get("mooncake_port"):
            bufs = [v for vs in values.values() for v in vs]
            sides["mooncake"] = MooncakeSide(cfg["mooncake_port"], cfg["mooncake_segment"], bufs)
        conn.send(("ready", sorted(sides)))
    except Exception as e:  # the reader reports it as the row's error
        conn.send(("error", "%s: %s" % (type(e).__name__, e)))
        return
    while True:
        cmd = conn.recv()
        if cmd[0] == "quit":
            break
        op, side, key, size, seed = cmd
        try:
            if op == "put":
                t = time.perf_counter()
                sides[side].put(key, values[size][seed])
                conn.send(("ok", time.perf_counter() - t))
            else:
                sides[side].remove(key)
                conn.send(("ok", 0.0))
        except Exception as e:
            conn.send(("error", "%s: %s" % (type(e).__name__, e)))
    for s in sides.values():
        s.close()
    conn.send(("bye", None))


def _ask(conn, *cmd):
    if cmd:
        conn.send(cmd)
    kind, val = conn.recv()
    if kind == "error":
        raise RuntimeError(val)
    return val


def start_redis(workdir):
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server not found on PATH (Debian package redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--protected-mode", "yes", "--dir", workdir, "--proto-max-bulk-len", "1gb"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    wait_port(port, proc, "redis-server")
    return proc, port


def start_mooncake_master(workdir):
    import mooncake

    exe = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
    port = free_port()
    log = open(os.path.join(workdir, "mooncake_master.log"), "w")
    proc = subprocess.Popen([exe, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    wait_port(port, proc, "mooncake_master")
    return proc, port


def in_private_netns():
    """True when this process sees no network interface but lo (inside `unshare -n`)."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def run(sizes, reps, peers):
    """The rows for `sizes` (bytes) with `reps[size]` rounds each; `peers` names the optional
    sides wanted ("redis", "mooncake")."""
    rows = []
    work = tempfile.mkdtemp(prefix="cxlkv-peers-")
    spec = "shm:cxlkv-peers-%d" % os.getpid()
    # The default configuration (8 participants, 8 partitions of 128 MiB): a participant claims
    # further partitions as it fills, so the writer holds every value of a size at once.
    pool = cxlkv.Pool.create(spec, 1 << 30)
    procs, cfg = [], {"spec": spec, "sizes": sizes, "mooncake_segment": 4 * max(sizes)}
    wanted = {"cxlkv": True}
    try:
        if "redis" in peers:
            try:
                p, cfg["redis_port"] = start_redis(work)
                procs.append(p)
                import redis  # noqa: F401  (the client, checked before any row)
                wanted["redis"] = True
            except Exception as e:
                for op in ("put", "get"):
                    rows.append(error_row(ENGINE, "redis 7", op, "%s: %s" % (type(e).__name__, e)))
                cfg.pop("redis_port", None)
        if "mooncake" in peers:
            try:
                if not in_private_netns():
                    raise RuntimeError(
                        "not inside a private network namespace (Mooncake's listeners bind every "
                        "interface): run under `unshare -n` with only lo up"
                    )
                p, cfg["mooncake_port"] = start_mooncake_master(work)
                procs.append(p)
                wanted["mooncake"] = True
            except Exception as e:
                for op in ("put", "get"):
                    rows.append(error_row(ENGINE, "mooncake store", op, "%s: %s" % (type(e).__name__, e)))
        ctx = mp.get_context("spawn")
        conn, child_conn = ctx.Pipe()
        writer = ctx.Process(target=_writer, args=(child_conn, cfg), daemon=True)
        writer.start()
        try:
            got = _ask(conn)
            rows += _measure(conn, cfg, sizes, reps, got)
        finally:
            try:
                conn.send(("quit",))
                conn.recv()
            except (OSError, EOFError):
                pass
            writer.join(20)
            if writer.is_alive():
                writer.terminate()
    finally:
        for p in procs:
            stop(p)
        pool.unlink()
        pool.close()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def _measure(conn, cfg, sizes, reps, side_names):
    rows = []
    label = {"cxlkv": "cxlkv", "redis": "redis 7", "mooncake": "mooncake store"}
    readers = {"cxlkv": CxlkvSide(cfg["spec"])}
    if "redis" in side_names:
        readers["redis"] = RedisSide(cfg["redis_port"])
    outs = {size: np.empty(size, np.uint8) for size in sizes}
    if "mooncake" in side_names:
        readers["mooncake"] = MooncakeSide(cfg["mooncake_port"], 0, list(outs.values()))
    names = [n for n in ("cxlkv", "redis", "mooncake") if n in readers]
    try:
        for size in sizes:
            expect = [kv_bytes(size, seed) for seed in range(2)]
            src, dst = kv_bytes(size, 0), np.empty(size, np.uint8)
            put = {n: Samples() for n in names}
            get = {n: Samples() for n in names}
            copy, read = Samples(), Samples()
            out = outs[size]
            for r in range(reps[size]):
                seed = r % 2
                order = names[r % len(names) :] + names[: r % len(names)]
                for n in order:
                    key = "peers/%d/%d" % (size, r)
                    put[n].add(_ask(conn, "put", n, key, size, seed))
                    out[:16] = 0
                    got = get[n].time(readers[n].get_into, key, out)
                    if got != size or not np.array_equal(out, expect[seed]):
                        raise RuntimeError("%s: get of %s gave wrong bytes (%s of %d)" % (n, key, got, size))
                    _ask(conn, "remove", n, key, size, seed)
                copy.time(np.copyto, dst, src)
                read.time(np.sum, src.view(np.uint64))
            if not np.array_equal(dst, src):
                raise RuntimeError("memcpy check failed")
            for n in names:
                rows.append(row(ENGINE, label[n], "put", size, put[n]))
                rows.append(row(ENGINE, label[n], "get", size, get[n]))
            rows.append(row(ENGINE, "memcpy (numpy copyto)", "get", size, copy,
                            "ceiling: the same bytes between two private arrays"))
            rows.append(row(ENGINE, "read (numpy sum)", "get", size, read,
                            "ceiling: one pass reading the same bytes"))
            print("peers: direct %d B done" % size, file=sys.stderr)
    finally:
        for s in readers.values():
            s.close()
    return rows
