"""The cross-pod tier's pieces that need no Mooncake Store (docs/CROSSPOD.md): the pool's CRC-32C
as the bridge checks blocks with it, and the client's rule that any bridge failure or an answer
beyond the question is a miss (None), never an exception or a hang. The end-to-end checks with a
real store are scripts/crosspod.sh test."""

import os
import socket
import threading
import time

import cxlkv
from cxlkv.crosspod import client


def test_crc32c_is_castagnoli():
    assert cxlkv.crc32c(b"123456789") == 0xE3069283
    assert cxlkv.crc32c(bytearray(32)) == 0x8A9136AA
    assert cxlkv.crc32c(b"") == 0


def serve_once(path, answer, delay=0.0):
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    seen = []

    def run():
        conn, _ = srv.accept()
        with conn:
            seen.append(conn.makefile("rb").readline().decode())
            time.sleep(delay)
            try:
                conn.sendall(answer)
            except OSError:
                pass
        srv.close()

    t = threading.Thread(target=run)
    t.start()
    return t, seen


def test_no_bridge_is_a_miss(tmp_path):
    assert client.import_chain(str(tmp_path / "none.sock"), [1, 2]) is None
    assert client.stat(str(tmp_path / "none.sock")) is None


def test_an_answer_beyond_the_question_is_refused(tmp_path):
    path = str(tmp_path / "b.sock")
    t, seen = serve_once(path, b"ok 3\n")
    assert client.import_chain(path, [1, 2]) is None
    t.join()
    assert seen == ["import 2 %032x %032x\n" % (1, 2)]


def test_an_answer_is_read(tmp_path):
    path = str(tmp_path / "b.sock")
    t, _ = serve_once(path, b"ok 1\n")
    assert client.import_chain(path, [cxlkv.Key(7), cxlkv.Key(8)]) == 1
    t.join()


def test_a_silent_bridge_times_out(tmp_path):
    path = str(tmp_path / "b.sock")
    t, _ = serve_once(path, b"ok 1\n", delay=1.0)
    start = time.monotonic()
    assert client.import_chain(path, [1], timeout=0.2) is None
    assert time.monotonic() - start < 0.9
    t.join()
    os.unlink(path)
