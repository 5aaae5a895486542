"""The result codes of the Python package are the C ABI's: every `CXLKV_ERR_<NAME> = <n>` line of
the committed header (ffi/include/cxlkv.h, itself tied to the runtime's table by the ffi crate's
`the_header_numbers_are_the_runtime_table` test) is `cxlkv.ERR_<NAME> == n`, and the package has
no code the header lacks."""

import os
import re

import cxlkv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def header_codes():
    with open(os.path.join(ROOT, "ffi", "include", "cxlkv.h")) as f:
        text = f.read()
    enum = text[text.index("enum cxlkv_result"):]
    enum = enum[: enum.index("}")]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"CXLKV_(ERR_\w+) = (\d+),", enum)}


def test_err_constants_are_the_headers_numbers():
    c = header_codes()
    assert len(c) == 16 and c["ERR_NULL"] == 1 and c["ERR_UNAVAILABLE"] == 16
    mine = {name: getattr(cxlkv, name) for name in dir(cxlkv) if name.startswith("ERR_")}
    assert mine == c
