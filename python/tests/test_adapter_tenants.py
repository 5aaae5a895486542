"""The engines' isolation knobs reach the pool (`cxlkv.adapters._tenant`): a deployment's tenant
and secret salt, and a request's salt, pick the participant's tenant and salt every key.

Runs where the engines are absent: the mapping itself, and the llama.cpp adapter (llama-cpp-python
is in the test venv; its `LlamaState` is plain data, so no model is loaded) with states stored by
one tenant and looked up by another, by the same tenant with another salt, by a tenant-less cache,
and by the same tenant and salt in a fresh cache. The vLLM connector's tenant test
(test_adapter_vllm.py) runs the same mapping through vLLM's own classes.
"""

import numpy as np
import pytest

import cxlkv
from cxlkv.adapters import _tenant
from conftest import make_pool


def test_a_configuration_names_a_tenant_with_its_salt(monkeypatch):
    assert _tenant.tenant_of({}) == (None, None)
    assert _tenant.tenant_of({"tenant": "acme", "tenant_salt": "s3"}) == ("acme", b"s3")
    monkeypatch.setenv("ACME_SALT", "from-env")
    assert _tenant.tenant_of({"tenant": "acme", "tenant_salt_env": "ACME_SALT"}) == (
        "acme",
        b"from-env",
    )
    for bad, words in [
        ({"tenant": "acme"}, "needs its secret salt"),
        ({"tenant_salt": "s"}, "without a tenant"),
        ({"tenant": "acme", "tenant_salt_env": "CXLKV_NO_SUCH_VAR"}, "not set"),
        ({"tenant": "a", "tenant_salt": "s", "tenant_salt_env": "ACME_SALT"}, "once"),
    ]:
        with pytest.raises(ValueError, match=words):
            _tenant.tenant_of(bad)


def test_the_salts_reach_the_key():
    name = b"engine's own key bytes"
    assert _tenant.key_salt(None, None) is None, "no salt: the keys of before tenants"
    plain = int(cxlkv.Key.from_bytes(name))
    keys = {
        int(cxlkv.Key.from_bytes(name, salt=_tenant.key_salt(t, r)))
        for t, r in [(b"a", None), (b"b", None), (b"a", "req"), (None, "req"), (b"a", "")]
    }
    assert len(keys) == 5 and plain not in keys, "each pair of salts keys differently"
    # Length-prefixed: moving bytes between the two salts gives another key.
    assert _tenant.key_salt(b"ab", "c") != _tenant.key_salt(b"a", "bc")


def _state(tokens):
    llama = pytest.importorskip(
        "llama_cpp.llama", reason="llama-cpp-python is not installed (scripts/setup-engines.sh)"
    )
    blob = bytes(np.random.default_rng(len(tokens)).integers(0, 256, 3000, dtype=np.uint8))
    return llama.LlamaState(
        input_ids=np.asarray(tokens, dtype=np.intc),
        scores=np.zeros((len(tokens), 4), dtype=np.single),
        n_tokens=len(tokens),
        llama_state=blob,
        llama_state_size=len(blob),
        seed=7,
    )


def test_llama_cpp_states_are_found_only_by_their_tenant_and_salt(spec):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from cxlkv.adapters.llama_cpp import CxlkvLlamaCache

    make_pool(spec, participants=8).close()
    tokens = list(range(10, 600))
    state = _state(tokens)
    with cxlkv.Pool.open(spec) as pool:
        alice = CxlkvLlamaCache(pool, "m", chunk_tokens=64, tenant="alice", salt=b"alice-1")
        alice[tokens] = state
        assert tokens in alice
        got = alice[tokens + [1, 2]]
        assert bytes(got.llama_state) == state.llama_state
        # A fresh cache of the same tenant and salt (another engine process) finds it.
        again = CxlkvLlamaCache(pool, "m", chunk_tokens=64, tenant="alice", salt=b"alice-1")
        assert bytes(again[tokens].llama_state) == state.llama_state
        others = [
            CxlkvLlamaCache(pool, "m", chunk_tokens=64, tenant="bob", salt=b"bob-1"),
            CxlkvLlamaCache(pool, "m", chunk_tokens=64, tenant="alice", salt=b"a guess"),
            CxlkvLlamaCache(pool, "m", chunk_tokens=64),
        ]
        for o in others:
            assert tokens not in o
            with pytest.raises(KeyError):
                o[tokens]
        # Bob's own state of the same tokens is his: a second entry, not alice's.
        bob_state = _state(tokens[:-1])
        others[0][tokens] = bob_state
        assert bytes(others[0][tokens].llama_state) == bob_state.llama_state
        assert bytes(alice[tokens].llama_state) == state.llama_state
        used = {t["name"]: t["blocks"] for t in pool.tenants()}
        assert used.get("alice", 0) > 0 and used.get("bob", 0) > 0, used
        for c in [alice, again, *others]:
            c.close()
    with cxlkv.Pool.open(spec) as pool:
        assert pool.check()["ok"]
