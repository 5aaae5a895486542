"""The cross-pod tier: a bridge between one pod's cxlkv pool and Mooncake Store (docs/CROSSPOD.md).

`python -m cxlkv.crosspod serve --pool SPEC --master HOST:PORT --socket PATH [--tenant NAME --salt
HEX] [--model NAME]` runs the bridge, restarted by its supervisor when it dies. Runtimes find it
through `CXLKV_CROSSPOD_SOCKET=PATH`: `lookup_prefix` (Rust, so the C and Python calls too) asks the
pool first, then the bridge for the rest of the chain. Writers publish committed blocks with
`publish(socket, keys)` (the on-put policy, told by the writer); `stat(socket)` returns the
metrics.
"""

from .client import import_chain, publish, stat  # noqa: F401

# Blocks a bridge keeps free in its partition between requests by default (`--keep-free`): room
# for a chain of 64 blocks (16 MiB of 256 KiB blocks) without eviction or a question to the store.
KEEP_FREE = 64
