"""How every adapter maps its engine's isolation knobs onto the pool's tenants (format 3.2).

Two knobs, one per level:
- **The deployment's tenant**: the adapter's configuration names a `tenant` (declared in the pool
  with `cxlkv pool create --tenant NAME[=QUOTA]` or `cxlkv pool tenant add`) and its secret salt,
  given inline as `tenant_salt` or, better, as the name of an environment variable that holds it
  (`tenant_salt_env`). The adapter's participant attaches as that tenant: it writes the tenant's
  blocks under its quota and reads only its tenant's and tenant 0's blocks.
- **The request's salt** (vLLM's and SGLang's `cache_salt`, LMCache's per-request salt): it salts
  the keys of that request's blocks, together with the tenant's salt (`key_salt`), with the pool's
  keyed hash (`cxlkv.Key.from_bytes(name, salt=key_salt(...))`, unsalted when it is `None`), so requests under another salt form other keys and
  miss, and no one without the salts can form or probe them. Neither salt enters the pool.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Tuple

import cxlkv


def tenant_of(config: Mapping[str, Any]) -> Tuple[Optional[str], Optional[bytes]]:
    """The `(tenant, salt)` an adapter's configuration names, or `(None, None)`. A tenant without
    a salt, a salt without a tenant, or an unset salt variable is a configuration error."""
    tenant = config.get("tenant")
    inline = config.get("tenant_salt")
    env = config.get("tenant_salt_env")
    if inline is not None and env is not None:
        raise ValueError("cxlkv: give the tenant's salt once: tenant_salt or tenant_salt_env")
    salt: Optional[bytes] = None
    if env is not None:
        value = os.environ.get(str(env))
        if not value:
            raise ValueError(
                "cxlkv: tenant_salt_env names %r, which is not set (or empty)" % str(env)
            )
        salt = value.encode()
    elif inline is not None:
        salt = inline if isinstance(inline, bytes) else str(inline).encode()
    if tenant is None:
        if salt is not None:
            raise ValueError("cxlkv: a tenant salt was given without a tenant name (tenant)")
        return None, None
    if not salt:
        raise ValueError(
            "cxlkv: tenant %r needs its secret salt (tenant_salt_env: the name of an environment "
            "variable holding it, or tenant_salt)" % str(tenant)
        )
    return str(tenant), salt


def attach(pool: "cxlkv.Pool", tenant: Optional[str], salt: Optional[bytes]) -> "cxlkv.Participant":
    """A participant of `pool`, attached as `tenant` when one is named."""
    if tenant is None:
        return pool.attach()
    return pool.attach(tenant=tenant, salt=salt)


def key_salt(tenant_salt: Optional[bytes], request_salt: Optional[str]) -> Optional[bytes]:
    """The secret that salts a request's keys: the tenant's salt and the request's, each
    length-prefixed (so no two pairs give the same bytes); `None` when neither is set (unsalted
    keys, as before tenants)."""
    if tenant_salt is None and request_salt is None:
        return None
    out = bytearray(b"cxlkv-adapter-salt-v1\0")
    for part in (tenant_salt or b"", (request_salt or "").encode()):
        out += len(part).to_bytes(4, "little") + part
    out += b"\1" if request_salt is not None else b"\0"
    return bytes(out)
