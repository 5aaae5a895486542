"""The bridge's request protocol, one text line each way over its Unix socket; keys only, never
payloads. Requests: `import N KEY...`, `publish N KEY...` (keys as 32 hex digits) and `stat`;
answers `ok N` (how many leading keys were imported or published) or `ok JSON` for `stat`, or
`err TEXT`. Every failure here is `None` (a miss), never an exception that the caller must handle.
"""

import json
import socket

TIMEOUT_S = 2.0


def _key_hex(k):
    return "%032x" % int(k)


def request(path, line, timeout=TIMEOUT_S):
    """Sends one request line; the answer line without its newline, or None on any failure."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(line.encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n") and len(buf) < 1 << 20:
                part = s.recv(65536)
                if not part:
                    break
                buf += part
            return buf.decode().strip() if buf.endswith(b"\n") else None
    except OSError:
        return None


def _count(path, verb, keys, timeout):
    keys = list(keys)
    ans = request(path, "%s %d %s" % (verb, len(keys), " ".join(map(_key_hex, keys))), timeout)
    if ans is None or not ans.startswith("ok "):
        return None
    try:
        n = int(ans[3:])
    except ValueError:
        return None
    return n if 0 <= n <= len(keys) else None


def publish(path, keys, timeout=TIMEOUT_S):
    """Asks the bridge to publish these committed keys; how many it published, None on failure."""
    return _count(path, "publish", keys, timeout)


def import_chain(path, keys, timeout=TIMEOUT_S):
    """Asks the bridge to import the chain `keys`; how many leading keys it imported, or None."""
    return _count(path, "import", keys, timeout)


def stat(path, timeout=TIMEOUT_S):
    """The bridge's metrics as a dict, or None when no bridge answers."""
    ans = request(path, "stat", timeout)
    if ans is None or not ans.startswith("ok "):
        return None
    return json.loads(ans[3:])
