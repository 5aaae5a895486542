"""Tenants inside one pool from Python (format 3.2; docs/PYTHON.md, the Tenants item): a tenant reads,
pins and finds only its own blocks and tenant 0's, even given another tenant's keys; salted keys
depend on the salt; a put past the quota evicts the tenant's own blocks, and with all of them
pinned raises FullError naming the quota; `pool.tenants()` shows use and quota. Tenant B runs in
its own interpreter (`run_child`)."""

import pytest

from conftest import make_pool, run_child

TOKENS = list(range(1, 129))


def test_salted_keys_depend_on_the_salt():
    import cxlkv

    a = cxlkv.key_chain("engine", "m", 0, 31, TOKENS, 16, salt=b"salt-a")
    a2 = cxlkv.key_chain("engine", "m", 0, 31, TOKENS, 16, salt=b"salt-a")
    b = cxlkv.key_chain("engine", "m", 0, 31, TOKENS, 16, salt=b"salt-b")
    plain = cxlkv.key_chain("engine", "m", 0, 31, TOKENS, 16)
    assert a == a2
    assert all(x != y and x != z for x, y, z in zip(a, b, plain))
    assert cxlkv.Key.from_bytes(b"n", salt=b"s") == cxlkv.Key.from_bytes(b"n", salt=b"s")
    assert cxlkv.Key.from_bytes(b"n", salt=b"s") != cxlkv.Key.from_bytes(b"n")


def test_a_tenant_reads_only_its_own_and_the_public_blocks(spec):
    import cxlkv

    with make_pool(spec, participants=4, block=4096) as pool:
        assert pool.declare_tenant("alice") == 1
        public = pool.attach()
        public.put("system prompt", b"shared")
        alice = cxlkv.Participant.attach(pool, tenant="alice", salt=b"salt-a")
        assert alice.tenant == 1 and public.tenant == 0
        keys = cxlkv.key_chain("engine", "m", 0, 31, TOKENS, 16, salt=b"salt-a")
        for i, k in enumerate(keys):
            alice.put(k, bytes([i]) * 1000)
        assert alice.lookup_prefix(keys) == len(keys)
        assert pool.lookup_prefix(keys) == 0  # a pool handle reads as no tenant
        out = run_child(
            """
import cxlkv
pool = cxlkv.Pool.open(%r)
bob = pool.attach(tenant="bob", salt=b"salt-b")
mine = cxlkv.key_chain("engine", "m", 0, 31, %r, 16, salt=b"salt-b")
theirs = cxlkv.key_chain("engine", "m", 0, 31, %r, 16, salt=b"salt-a")
for keys in (mine, theirs):
    assert bob.lookup_prefix(keys) == 0
    for k in keys:
        assert bob.get(k) is None and not bob.contains(k)
        assert bob.pin(k) is None, "bob pinned alice's block"
assert bob.get("system prompt") == b"shared"
print("bob saw none of alice's blocks")
"""
            % (spec, TOKENS, TOKENS)
        )
        assert "saw none" in out
        for i, k in enumerate(keys):
            assert alice.get(k) == bytes([i]) * 1000
        rows = {t["name"]: t for t in pool.tenants()}
        assert rows["alice"]["blocks"] == len(keys) and rows["alice"]["quota"] == 0
        assert rows["bob"]["blocks"] == 0
        alice.detach()
        public.detach()


def test_quota_evicts_the_tenants_own_then_refuses(spec):
    import cxlkv

    with make_pool(spec, participants=3, block=4096) as pool:
        pool.declare_tenant("bob", quota=2)
        bob = pool.attach(tenant="bob", salt=b"s")
        keys = [cxlkv.Key.from_bytes(b"%d" % i, salt=b"s") for i in range(5)]
        for k in keys:
            bob.put(k, b"x" * 100)
        assert bob.get(keys[0]) is None and bob.get(keys[4]) == b"x" * 100
        assert [t["blocks"] for t in pool.tenants() if t["name"] == "bob"] == [2]
        pins = [bob.pin(k) for k in keys[3:]]
        with pytest.raises(cxlkv.FullError, match="quota of 2 blocks"):
            bob.put(cxlkv.Key.from_bytes(b"more", salt=b"s"), b"y")
        for p in pins:
            p.release()
        pool.set_tenant_quota("bob", 3)
        bob.put(cxlkv.Key.from_bytes(b"more", salt=b"s"), b"y")
        assert [t["blocks"] for t in pool.tenants() if t["name"] == "bob"] == [3]
        with pytest.raises(cxlkv.BadInputError):
            pool.attach(tenant="bob")  # a tenant needs its salt
        with pytest.raises(cxlkv.BadInputError):
            pool.declare_tenant("x" * 41)
        bob.detach()
