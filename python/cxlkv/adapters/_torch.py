"""The tensor dtypes the torch-based adapters (LMCache, SGLang) store, by the name written in their
records. Imported only by those adapters: it needs torch."""

import torch

DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "uint8": torch.uint8,
    "int8": torch.int8,
}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        DTYPES[_name] = getattr(torch, _name)
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def dtype_name(dtype: "torch.dtype", who: str) -> str:
    """The record name of `dtype`; ValueError naming `who` when it is not storable."""
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError("%s: unsupported dtype %s" % (who, dtype)) from None
