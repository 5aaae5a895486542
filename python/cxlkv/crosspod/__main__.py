"""`python -m cxlkv.crosspod serve ...`: the bridge under its supervisor (restarted when it dies).
`--once` runs the bridge itself, without a supervisor (what the supervisor starts)."""

import argparse
import os
import signal
import subprocess
import sys
import time

from . import KEEP_FREE


def main(argv=None):
    ap = argparse.ArgumentParser(prog="cxlkv crosspod")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the bridge between a pool and Mooncake Store")
    s.add_argument("--pool", required=True, help="pool spec (shm:NAME, file:PATH, ...)")
    s.add_argument("--master", required=True, help="mooncake_master address HOST:PORT")
    s.add_argument("--socket", required=True, help="Unix socket path the runtimes ask")
    s.add_argument("--tenant", help="pool tenant (and Mooncake tenant_id); with --salt")
    s.add_argument("--salt", help="the tenant's salt, hex (visible in the process list)")
    s.add_argument(
        "--salt-env", help="the name of an environment variable holding the tenant's salt, hex"
    )
    s.add_argument("--model", default="default", help="model name in the store keys")
    s.add_argument("--segment-mib", type=int, default=256, help="memory lent to the store")
    s.add_argument("--keep-free", type=int, default=KEEP_FREE, metavar="N",
                   help="blocks kept free in the bridge's partition between requests (evicting "
                   "ahead), so that an import of up to that many neither waits on eviction nor "
                   "asks the store first; 0: evict on demand")
    s.add_argument("--publish", default="on-put",
                   choices=("on-put", "on-eviction", "both", "never"),
                   help="when blocks are published: writers' publish requests (on-put), "
                   "evictions (on-eviction, write-back), both, or never")
    s.add_argument("--pid-file", help="where the running bridge writes its pid")
    s.add_argument("--no-prefault", action="store_true",
                   help="do not fault the pool's pages in at start (imports then pay first touches)")
    s.add_argument("--once", action="store_true", help="no supervisor")
    t = sub.add_parser("stat", help="the bridge's metrics")
    t.add_argument("--socket", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "stat":
        from .client import stat

        m = stat(a.socket)
        if m is None:
            print("no bridge answers on %s" % a.socket, file=sys.stderr)
            return 1
        for k, v in m.items():
            print("%-18s %s" % (k, v))
        return 0
    if not a.once:
        return supervise(sys.argv[1:] if argv is None else argv)
    from .bridge import Bridge

    if a.salt and a.salt_env:
        print("cxlkv crosspod: give the salt once: --salt or --salt-env", file=sys.stderr)
        return 2
    hex_salt = a.salt
    if a.salt_env:
        hex_salt = os.environ.get(a.salt_env)
        if not hex_salt:
            print("cxlkv crosspod: %s (--salt-env) is not set" % a.salt_env, file=sys.stderr)
            return 2
    try:
        salt = bytes.fromhex(hex_salt) if hex_salt else None
    except ValueError:
        print("cxlkv crosspod: the salt is not hex", file=sys.stderr)
        return 2
    b = Bridge(a.pool, a.master, a.tenant, salt, a.model, a.segment_mib << 20, policy=a.publish,
               prefault=not a.no_prefault, keep_free=a.keep_free)
    if a.pid_file:
        with open(a.pid_file + ".tmp", "w") as f:
            f.write("%d\n" % os.getpid())
        os.replace(a.pid_file + ".tmp", a.pid_file)
    b.serve(a.socket)


def supervise(args):
    """Runs the bridge and starts it again when it exits, until SIGTERM."""
    child, stop = None, []

    def on_term(*_):
        stop.append(1)
        if child is not None and child.poll() is None:
            child.terminate()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    while not stop:
        child = subprocess.Popen([sys.executable, "-m", "cxlkv.crosspod"] + args + ["--once"])
        rc = child.wait()
        if not stop:
            print("crosspod: bridge pid %d exited (%s); restarting" % (child.pid, rc),
                  file=sys.stderr, flush=True)
            time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
