"""Reading a value for an adapter with as few copies as the pool allows."""

import threading
from contextlib import contextmanager

import cxlkv

# A multi-block object is copied out into a buffer this thread keeps for the next read: a fresh
# buffer of a few hundred KiB costs more than the copy (zero fill, or page faults of a new
# mapping). Only one read_view per thread uses it at a time; a nested one gets its own buffer.
# Objects above _SCRATCH_MAX get a buffer of their own, so a thread does not keep the largest
# object it ever read.
_scratch = threading.local()
_SCRATCH_MAX = 16 << 20


def _take_scratch(n):
    buf = getattr(_scratch, "buf", None)
    if getattr(_scratch, "busy", False) or n > _SCRATCH_MAX:
        return bytearray(n), False
    if buf is None or len(buf) < n:
        buf = _scratch.buf = bytearray(n)
    _scratch.busy = True
    return buf, True


@contextmanager
def read_view(me, key):
    """Yields a read-only memoryview of the value under `key`, or None on a miss.

    A value within one block is pinned and viewed in place (no copy; the pin is released when the
    block ends). A multi-block object cannot be pinned (a pin holds one block), so it is copied
    once with `get_into` into a buffer of this thread sized by `length`, reused by its next read:
    the view is valid only inside the `with` block."""
    try:
        pin = me.pin(key)
    except cxlkv.BadInputError as e:
        if e.code != cxlkv.ERR_PAYLOAD_TOO_LARGE:
            raise
        pin = False  # a multi-block object
    if pin is None:
        yield None
        return
    if pin is not False:
        with pin:
            view = memoryview(pin)
            try:
                yield view
            finally:
                view.release()
        return
    n = me.length(key)
    if n is None:
        yield None
        return
    buf, mine = _take_scratch(n)
    view = memoryview(buf)[:n]
    try:
        try:
            got = me.get_into(key, view)
        except cxlkv.BadInputError:
            got = None  # replaced by a larger object between length and get_into: a miss
        out = None if got is None else view[:got]
        try:
            yield out
        finally:
            if out is not None:
                out.release()
    finally:
        view.release()
        if mine:
            _scratch.busy = False
