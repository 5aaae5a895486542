"""The bridge process: one per pod (and tenant), between the pod's pool and Mooncake Store.

It attaches to the pool as a participant of its tenant, registers the pool's mapping with the store
once, and serves requests on a Unix socket (client.py). Store objects, for a pool key K of model M
and tenant T (Mooncake's `tenant_id` is T too): `cxlkv/M/T/K`, the block's payload followed by a
16-byte trailer (its length and CRC-32C), written from the pool's memory and the trailer in one
`batch_put_from_multi_buffers` (a multi-block object: its whole payload, read into a registered
staging buffer, and its trailer). Mooncake makes an object visible only once its put completed, and
keeps the first value of a duplicate put, so two pods publishing at once leave one object, whose
own trailer checks it.

Import of a chain: blocks reserved at full capacity in one call (`Participant.reserve_many`), first
only from free blocks (`evict=False`); where that falls short, one `batch_is_exist` (a question to
the master, no transfer) first ends the chain at the first key the store lacks, so that a missing
chain never makes the pool evict. One `batch_get_into` reads the objects, each whole straight into
its reserved pool memory; its answer gives each object's size. One call commits the leading
blocks (`ReservationBatch.commit_trailed`: each trailer checked, each payload checksummed in place
and committed with the trailer's CRC) and frees the rest. An object larger than a block's capacity
(a payload of a whole block and its trailer) is read again the long way: its size from
`batch_get_replica_desc`, then one `batch_get_into_multi_buffers`, the payload into the pool and
the trailer into a registered buffer; a multi-block object is read into the staging buffer,
checked, and stored by a put (visible only whole). Any store error, short read or mismatch ends
the chain there: a miss, never wrong data.
A bridge killed mid-import leaves reservations, which the pool
reclaims like any dead participant's (`cxlkv pool check`).

Publish policy (`--publish`): `on-put` serves `publish` requests (the runtime's write-through:
every put and commit of a process with CXLKV_CROSSPOD_SOCKET set queues its key, and
a background thread sends what is queued; or a writer's explicit `publish`), `on-eviction` serves
the runtime's `writeback` requests (a participant of the pod about to evict a committed block names it
while it is still indexed; the bridge pins it, publishes it and answers before the space is
reused), `both` serves both, `never` neither. A request the policy does not serve is answered
`off` (the runtime then stops asking for a while).
"""

import json
import os
import re
import socket
import struct
import sys
import threading
import time

import numpy as np

import cxlkv

from . import KEEP_FREE

META = struct.Struct("<QQ")  # payload length, CRC-32C of it (`cxlkv.crc32c`, the pool's own)
MAX_CHAIN = 512  # keys per request: as many trailer slots in the registered buffer
# Where an import's time goes: the master's answer on the chain, the reservations, the payload read, the
# CRC checks and commits.
PHASES = ("index", "reserve", "read", "check_commit")
REASONS = ("store_error", "owner_gone", "crc_mismatch", "short_read", "pool_full", "pool_error")
# Mooncake's code for a read from a segment whose owner is gone (the master still lists the
# object until the owner's lease ends).
TRANSFER_FAIL = -800
OBJECT_NOT_FOUND = -704  # the end of what the store has of a chain: a miss, not a failure


POLICIES = ("on-put", "on-eviction", "both", "never")
KEYS = re.compile(r"(?:[0-9a-f]{32}(?: |$))*")  # a request's keys, space-separated


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = {"published": 0, "published_bytes": 0, "written_back": 0,
                  "imported": 0, "imported_bytes": 0,
                  "import_requests": 0, "import_ns_total": 0, "import_ns_max": 0,
                  "import_phase_ns": {p: 0 for p in PHASES},
                  "failures": {r: 0 for r in REASONS}}

    def add(self, name, n=1):
        with self.lock:
            self.c[name] += n

    def fail(self, reason, n=1):
        with self.lock:
            self.c["failures"][reason] += n

    def phase(self, name, since):
        """Adds the time from `since` (perf_counter_ns) to phase `name`; returns now."""
        now = time.perf_counter_ns()
        with self.lock:
            self.c["import_phase_ns"][name] += now - since
        return now

    def timed(self, ns):
        with self.lock:
            self.c["import_requests"] += 1
            self.c["import_ns_total"] += ns
            self.c["import_ns_max"] = max(self.c["import_ns_max"], ns)

    def snapshot(self):
        with self.lock:
            return json.loads(json.dumps(self.c))


def mapping_of(addr):
    """(start, length) of the mapping of this process that holds `addr` (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return lo, hi - lo
    raise RuntimeError("address %#x is in no mapping" % addr)


def pause_here():
    """Test hook (scripts/crosspod.sh check 5): while the file named by CXLKV_CROSSPOD_TEST_PAUSE
    exists, an import waits between reading into its reservations and committing them."""
    flag = os.environ.get("CXLKV_CROSSPOD_TEST_PAUSE")
    while flag and os.path.exists(flag):
        time.sleep(0.05)


def addr_of(buf):
    return np.frombuffer(buf, np.uint8).ctypes.data


class Bridge:
    def __init__(self, pool_spec, master, tenant=None, salt=None, model="default",
                 segment=256 << 20, host="127.0.0.1", policy="on-put", prefault=True,
                 keep_free=KEEP_FREE):
        from mooncake.store import MooncakeDistributedStore, ReplicaStatus

        if policy not in POLICIES:
            raise ValueError("publish policy %r is not one of %s" % (policy, ", ".join(POLICIES)))
        self.policy = policy
        if keep_free < 0:
            raise ValueError("keep_free must be 0 or more blocks, not %d" % keep_free)
        self.keep_free = min(keep_free, MAX_CHAIN)
        # The bridge's own evictions (of blocks it imported, which the store has) are not offered
        # to a bridge: its runtime must not ask itself while it serves a request.
        os.environ.pop("CXLKV_CROSSPOD_SOCKET", None)
        self.complete = ReplicaStatus.COMPLETE  # a replica whose put has finished

        # Prefaulted: a transfer into the pool never pays a first-touch page fault (an import into
        # fresh pages took twice as long as the same read into warm memory).
        self.pool = cxlkv.Pool.open(pool_spec, prefault=prefault)
        self.me = self.pool.attach(tenant=tenant, salt=salt) if tenant else self.pool.attach()
        self.prefix = "cxlkv/%s/%s/" % (model, tenant or "default")
        self.block_size = self.pool.block_size
        self.metrics = Metrics()
        self.store = MooncakeDistributedStore()
        rc = self.store.setup(host, "P2PHANDSHAKE", segment, 16 << 20, "tcp", "", master,
                              None, False, "", tenant or "default")
        if rc != 0:
            raise RuntimeError("MooncakeDistributedStore.setup(%s) returned %d" % (master, rc))
        # Objects live in this bridge's own segment: they are the pod's blocks, and they go when
        # the pod's bridge goes (a miss elsewhere), not when some other pod's bridge does.
        from mooncake.store import ReplicateConfig

        self.placement = ReplicateConfig()
        self.placement.preferred_segment = self.store.get_hostname()
        # The pool's mapping, registered once: found through a throwaway reservation.
        probe = self.me.reserve(cxlkv.Key.from_bytes(b"cxlkv-crosspod-probe-%d" % os.getpid()), 1)
        view = memoryview(probe)
        base, length = mapping_of(addr_of(view))
        view.release()
        probe.abort()
        rc = self.store.register_buffer(base, length)
        if rc != 0:
            raise RuntimeError("register_buffer of the pool mapping returned %d" % rc)
        self.meta = np.zeros(META.size * MAX_CHAIN, np.uint8)  # registered: the trailers
        rc = self.store.register_buffer(self.meta.ctypes.data, self.meta.nbytes)
        if rc != 0:
            raise RuntimeError("register_buffer of the trailer buffer returned %d" % rc)
        self.stage = None  # registered on the first multi-block object (`_stage`)

    def name(self, key):
        return self.prefix + "%032x" % key

    def publish(self, keys):
        """Puts each committed key's value into the store, in order: runs of single blocks from
        pool memory (payload, then its trailer), a multi-block object through the staging buffer;
        how many leading keys are published afterwards."""
        keys = keys[:MAX_CHAIN]
        done = 0
        while done < len(keys):
            n = self._publish_blocks(keys[done:])
            done += n
            if done == len(keys) or not self._publish_object(keys[done]):
                break
            done += 1
        return done

    def _publish_blocks(self, keys):
        """Publishes the leading run of `keys` that are single committed blocks; how many."""
        pins, names, ptrs, sizes = [], [], [], []
        try:
            for i, k in enumerate(keys):
                try:
                    pin = self.me.pin(cxlkv.Key(k))
                except cxlkv.BadInputError:  # a multi-block object: pins hold one block
                    break
                if pin is None:
                    break
                pins.append(pin)
                view = memoryview(pin)
                names.append(self.name(k))
                ptrs.append(addr_of(view))
                sizes.append(len(view))
                META.pack_into(self.meta, i * META.size, len(view), cxlkv.crc32c(view))
                view.release()
            if not names:
                return 0
            slots = [self.meta.ctypes.data + i * META.size for i in range(len(names))]
            done = self._put(names, [[p, m] for p, m in zip(ptrs, slots)],
                             [[n, META.size] for n in sizes])
        finally:
            for p in pins:
                p.release()
        self.metrics.add("published", done)
        self.metrics.add("published_bytes", sum(sizes[:done]))
        return done

    def _publish_object(self, key):
        """Publishes the multi-block object under `key` as one store object (its payload, read
        with every part's CRC checked into the registered staging buffer, then its trailer);
        False when `key` holds none (a miss, or a single block that changed meanwhile)."""
        k = cxlkv.Key(key)
        length = self.me.length(k)
        if length is None or length <= self.block_size:
            return False
        stage = self._stage(length + META.size)
        if self.me.get_into(k, stage[:length]) != length:
            return False  # replaced meanwhile by a value of another size
        META.pack_into(stage, length, length, cxlkv.crc32c(stage[:length]))
        if self._put([self.name(key)], [[stage.ctypes.data]], [[length + META.size]]) != 1:
            return False
        self.metrics.add("published")
        self.metrics.add("published_bytes", length)
        return True

    def _stage(self, size):
        """The registered staging buffer multi-block objects pass through, grown to hold at least
        `size` bytes (kept for the next object)."""
        if self.stage is None or self.stage.nbytes < size:
            if self.stage is not None:
                self.store.unregister_buffer(self.stage.ctypes.data)
                self.stage = None
            stage = np.empty(-(-size // (1 << 20)) << 20, np.uint8)
            rc = self.store.register_buffer(stage.ctypes.data, stage.nbytes)
            if rc != 0:
                raise RuntimeError("register_buffer of the staging buffer returned %d" % rc)
            self.stage = stage
        return self.stage

    def _put(self, names, ptrs, sizes):
        """How many leading puts left an object in the store (one already there counts: Mooncake
        keeps the first value, and its trailer checks it)."""
        try:
            rcs = self.store.batch_put_from_multi_buffers(names, ptrs, sizes, self.placement)
        except Exception:
            rcs = [-1] * len(names)
        for i, rc in enumerate(rcs):
            if rc != 0 and self.store.is_exist(names[i]) != 1:
                self.metrics.fail("store_error")
                return i
        return len(names)

    def import_chain(self, keys):
        """Imports the leading run of `keys` found in the store; how many are now committed."""
        t0 = time.perf_counter_ns()
        try:
            return self._import(keys[:MAX_CHAIN])
        finally:
            self.metrics.timed(time.perf_counter_ns() - t0)

    def _import(self, keys):
        t = time.perf_counter_ns()
        names = [self.name(k) for k in keys]
        # Blocks the pool has free cost nothing to reserve: then the read itself says how far
        # the chain exists. Where the chain would make the pool evict, one question first finds
        # how far it exists (`batch_is_exist`: the cheapest the store answers; an object whose
        # owner is gone still counts until its lease ends, and its read then fails as a miss),
        # so that a chain the store lacks never costs the pool a block.
        batch = self.me.reserve_many(keys, self.block_size, evict=False)
        n = len(batch)
        if n < len(keys):
            batch.abort()
            batch = None
            try:
                found = self.store.batch_is_exist(names)
            except Exception:
                self.metrics.fail("store_error")
                return 0
            n = next((i for i, e in enumerate(found) if e != 1), len(found))
        t = self.metrics.phase("index", t)
        # Each object read whole into a block reserved at full capacity: the store says each
        # object's size in the read's own answer, so no question on sizes comes first.
        done, larger = self._fill_whole(keys[:n], names[:n], t, batch)
        if not larger:
            return done
        # Objects with no room for their trailer in a block (a payload of a whole block, or a
        # multi-block object): their sizes first, then each run of block payloads read
        # scattered, each multi-block object through the staging buffer.
        t = time.perf_counter_ns()
        names = names[done:n]
        try:
            desc = self.store.batch_get_replica_desc(names)
        except Exception:
            self.metrics.fail("store_error")
            return done
        lens = []
        for name in names:
            size = next((r.get_memory_descriptor().buffer_descriptor.size
                         for r in desc.get(name, ())
                         if r.is_memory_replica() and r.status == self.complete), 0)
            if size <= META.size:
                break
            lens.append(size - META.size)
        t = self.metrics.phase("index", t)
        keys = keys[done:n]
        at = 0
        while at < len(lens):
            run = next((i for i in range(at, len(lens)) if lens[i] > self.block_size), len(lens))
            if run > at:
                more, _ = self._fill(keys[at:run], names[at:run], lens[at:run], t)
                done += more
                if more < run - at:
                    break
                at = run
            if at < len(lens):
                if not self._import_object(keys[at], names[at], lens[at]):
                    break
                done += 1
                at += 1
            t = time.perf_counter_ns()
        return done

    def _import_object(self, key, name, length):
        """Imports the multi-block object `name` of a `length`-byte payload: read into the
        registered staging buffer, its trailer and CRC checked, stored by a put (parts, then the
        manifest: visible only whole). Whether it is now in the pool."""
        if length > self.me.max_object_len:
            self.metrics.fail("pool_full")
            return False
        t = time.perf_counter_ns()
        stage = self._stage(length + META.size)
        rcs = self._get([name], [stage.ctypes.data], [length + META.size], True)
        t = self.metrics.phase("read", t)
        try:
            if not rcs or rcs[0] != length + META.size:
                self._failed(rcs[0] if rcs else -1)
                return False
            stored_len, crc = META.unpack_from(stage, length)
            if stored_len != length or cxlkv.crc32c(stage[:length]) != crc:
                self.metrics.fail("crc_mismatch")
                return False
            pause_here()
            try:
                self.me.put_if_absent(cxlkv.Key(key), stage[:length])
            except cxlkv.FullError:
                self.metrics.fail("pool_full")
                return False
            except cxlkv.Error:
                self.metrics.fail("pool_error")
                return False
        finally:
            self.metrics.phase("check_commit", t)
        self.metrics.add("imported")
        self.metrics.add("imported_bytes", length)
        return True

    def _fill_whole(self, keys, names, t, batch=None):
        """Reserves a block of full capacity per key in one call (unless `batch` holds them
        already), reads each object whole into its block in one `batch_get_into` (whose answer
        gives each object's size) and commits the leading blocks in one call that checks each
        trailer and checksums each payload in place (`ReservationBatch.commit_trailed`).
        (committed, whether the run ended on an object larger than a block's capacity)."""
        capacity = self.block_size
        if batch is None:
            batch = self.me.reserve_many(keys, capacity)
            if batch.stopped is not None:
                self.metrics.fail("pool_full" if isinstance(batch.stopped, cxlkv.FullError)
                                  else "pool_error")
        t = self.metrics.phase("reserve", t)
        done, larger = 0, False
        try:
            rcs = self._get(names[: len(batch)], batch.addresses, [capacity] * len(batch), True)
            t = self.metrics.phase("read", t)
            pause_here()
            n = next((i for i, rc in enumerate(rcs) if not META.size < rc <= capacity), len(rcs))
            if n < len(rcs):
                rc = rcs[n]
                # A read into a block that cannot hold the object fails; the caller reads it
                # scattered. Any other failure is the end of the chain.
                larger = rc < 0 and rc not in (TRANSFER_FAIL, OBJECT_NOT_FOUND)
                if rc > 0:
                    self.metrics.fail("short_read")
                elif not larger:
                    self._failed(rc)
            done, why = batch.commit_trailed(rcs[:n])
            if why is not None:
                self.metrics.fail(why if why in ("short_read", "crc_mismatch") else "pool_error")
            self.metrics.add("imported_bytes", sum(rcs[:done]) - done * META.size)
            self.metrics.phase("check_commit", t)
        finally:
            batch.abort()  # whatever was not committed is freed: nothing half-read is visible
        self.metrics.add("imported", done)
        return done, larger

    def _fill(self, keys, names, lens, t):
        """Reserves, reads, checks and commits the leading run of `keys` (store objects `names`)
        whose payloads of `lens` bytes fit a block: as `_fill_whole` when every block has room
        for the trailer too, else each payload read into its block and its trailer into
        `self.meta` (scattered). (committed, whether the run ended on an object larger than a
        block's capacity)."""
        if all(n + META.size <= self.block_size for n in lens):
            return self._fill_whole(keys, names, t)
        base = self.meta.ctypes.data
        held, ptrs, sizes, done = [], [], [], 0
        try:
            for i, length in enumerate(lens):
                try:
                    r = self.me.reserve(cxlkv.Key(keys[i]), length)
                except cxlkv.FullError:
                    self.metrics.fail("pool_full")
                    break
                except cxlkv.Error:
                    self.metrics.fail("pool_error")
                    break
                view = memoryview(r)
                held.append((r, view))
                ptrs.append([addr_of(view), base + i * META.size])
                sizes.append([length, META.size])
            t = self.metrics.phase("reserve", t)
            rcs = self._get(names[: len(held)], ptrs, sizes, False)
            t = self.metrics.phase("read", t)
            pause_here()
            for i, (r, view) in enumerate(held):
                rc = rcs[i] if i < len(rcs) else OBJECT_NOT_FOUND
                if rc != sum(sizes[i]):
                    self._failed(rc)
                    break
                length = lens[i]
                stored_len, crc = META.unpack_from(self.meta, i * META.size)
                view.release()
                if stored_len != length:
                    self.metrics.fail("crc_mismatch")
                    break
                # One pass over the bytes: the commit checksums them and refuses a mismatch
                # (the block is then freed, nothing published).
                try:
                    r.commit(length=length, crc=crc)
                except cxlkv.BadInputError:
                    self.metrics.fail("crc_mismatch")
                    break
                done += 1
                self.metrics.add("imported_bytes", length)
            self.metrics.phase("check_commit", t)
        finally:
            # Whatever was not committed is given back: nothing half-read becomes visible.
            for r, view in held[done:]:
                view.release()
                r.abort()
        self.metrics.add("imported", done)
        return done, False

    def _failed(self, rc):
        """Counts a read's failure code `rc` (the end of what the store has is not one)."""
        if rc not in (TRANSFER_FAIL, OBJECT_NOT_FOUND):
            self.metrics.fail("store_error" if rc < 0 else "short_read")

    def _get(self, names, ptrs, sizes, whole):
        """Each read's answer (bytes read, or the store's negative code) for `names`: each object
        into its one buffer (`whole`), else scattered into its `ptrs`; [] when the call failed."""
        if not names:
            return []
        try:
            if whole:
                rcs = self.store.batch_get_into(names, ptrs, sizes)
            else:
                rcs = self.store.batch_get_into_multi_buffers(names, ptrs, sizes)
        except Exception:
            self.metrics.fail("store_error")
            return []
        # Every object whose owner is gone is dropped from the store's listing (not only the
        # first), so that a pod that still holds those blocks can publish them again.
        gone = [n for n, rc in zip(names, rcs) if rc == TRANSFER_FAIL]
        if gone:
            self.store.batch_remove(gone, True)
            self.metrics.fail("owner_gone", len(gone))
        return list(rcs)

    def answer(self, line):
        words = line.split()
        if words == ["stat"]:
            return "ok " + json.dumps(dict(self.metrics.snapshot(), policy=self.policy))
        verbs = ("import", "publish", "writeback")
        if len(words) >= 2 and words[0] in verbs and words[1].isdigit():
            n = int(words[1])
            if len(words) != n + 2 or not KEYS.fullmatch(" ".join(words[2:])):
                return "err expected %s N and N keys of 32 hex digits" % words[0]
            keys = [int(w, 16) for w in words[2:]]
            if words[0] == "import":
                return "ok %d" % (self.import_chain(keys) if keys else 0)
            if words[0] == "publish":
                if self.policy not in ("on-put", "both"):
                    return "off"
                return "ok %d" % (self.publish(keys) if keys else 0)
            if self.policy not in ("on-eviction", "both"):
                return "off"
            done = self.publish(keys) if keys else 0
            self.metrics.add("written_back", done)
            return "ok %d" % done
        return "err unknown request (import, publish, writeback, stat)"

    def keep_room(self, imported):
        """After an import of `imported` blocks is answered, off its path: evicts ahead until
        `keep_free` blocks are free, so that the next import of up to that many blocks reserves
        them without evicting and without asking the store first (`_import`). The blocks evicted
        are older imports, which the store holds; the ones just imported stay for their
        reader."""
        if self.keep_free:
            try:
                self.me.keep_free(self.keep_free, imported)
            except cxlkv.Error as e:
                print("crosspod bridge: keeping room: %s" % e, file=sys.stderr, flush=True)

    def serve(self, path):
        if os.path.exists(path):
            os.unlink(path)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(64)
        print("crosspod bridge pid %d serving %s" % (os.getpid(), path), flush=True)
        while True:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(5.0)
                try:
                    line = conn.makefile("rb").readline(1 << 22).decode(errors="replace")
                    try:
                        answer = self.answer(line)
                    except Exception as e:  # a bad request or a pool error: said, and serving on
                        answer = "err %s: %s" % (type(e).__name__, e)
                        print("crosspod bridge: %s" % answer, file=sys.stderr, flush=True)
                    conn.sendall((answer.replace("\n", " ") + "\n").encode())
                    if answer.startswith("ok ") and line.startswith("import "):
                        self.keep_room(int(answer[3:]))
                except OSError as e:
                    print("crosspod bridge: request dropped: %s" % e, file=sys.stderr, flush=True)
