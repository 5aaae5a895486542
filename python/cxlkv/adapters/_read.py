"""Reading a value for an adapter with as few copies as the pool allows."""

from contextlib import contextmanager

import cxlkv


@contextmanager
def read_view(me, key):
    """Yields a read-only memoryview of the value under `key`, or None on a miss.

    A value within one block is pinned and viewed in place (no copy; the pin is released when the
    block ends). A multi-block object cannot be pinned (a pin holds one block), so it is copied
    once with `get_into` into a private buffer sized by `length`."""
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
    buf = bytearray(n or 0)
    try:
        got = me.get_into(key, buf) if n is not None else None
    except cxlkv.BadInputError:
        got = None  # replaced by a larger object between length and get_into: a miss
    yield None if got is None else memoryview(buf)[:got]
