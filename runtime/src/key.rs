//! Block keys: 128-bit names of KV blocks that every engine computes the same way.
//!
//! A key names a block by (namespace, model, layer range, token prefix). Keys of a token sequence
//! form a chain: the key of chunk *i* hashes the key of chunk *i − 1* with chunk *i*'s token ids, so
//! a key stands for its whole prefix, and two requests that share a prefix share the keys of its
//! chunks. The hash is XXH3-128 over little-endian fields (docs/FORMAT.md gives the exact bytes).
//!
//! Salted keys (format 3.2, tenants): [`KeyChain::salted`] and [`Key::from_bytes_salted`] replace
//! the chain seed (and the opaque key) with a keyed BLAKE3 hash under a key derived from a secret
//! salt the tenant holds, truncated to 128 bits; chunk keys then continue as in an unsalted chain.
//! Without the salt, nobody can form a salted key, so nobody can probe for (or time) another
//! tenant's prefixes by their tokens. The salt never enters the pool.

use xxhash_rust::xxh3::xxh3_128;

/// A 128-bit block key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Key(pub u128);

impl Key {
    /// Low 64 bits (stored first).
    pub fn lo(self) -> u64 {
        self.0 as u64
    }
    /// High 64 bits.
    pub fn hi(self) -> u64 {
        (self.0 >> 64) as u64
    }
    /// Reassembles a key from its stored halves.
    pub fn from_parts(lo: u64, hi: u64) -> Key {
        Key(u128::from(lo) | (u128::from(hi) << 64))
    }
    /// A key for opaque bytes (an engine's own name for a blob).
    pub fn from_bytes(bytes: &[u8]) -> Key {
        Key(xxh3_128(bytes))
    }

    /// A key for opaque bytes salted with a tenant's secret `salt` ([`Key::from_bytes`]'s twin
    /// for tenants): the keyed BLAKE3 hash of `bytes`, truncated to 128 bits.
    pub fn from_bytes_salted(salt: &[u8], bytes: &[u8]) -> Key {
        keyed(&salt_key(salt), bytes)
    }
}

/// Context string of the key derivation from a tenant's salt (docs/FORMAT.md §6).
pub const SALT_CONTEXT: &str = "cxlkv tenant salt v1";

/// The 32-byte BLAKE3 key derived from a tenant's secret salt.
pub fn salt_key(salt: &[u8]) -> [u8; 32] {
    blake3::derive_key(SALT_CONTEXT, salt)
}

/// The keyed BLAKE3 hash of `bytes` under `key`, its first 16 bytes read little-endian.
fn keyed(key: &[u8; 32], bytes: &[u8]) -> Key {
    let h = blake3::keyed_hash(key, bytes);
    let mut first = [0u8; 16];
    first.copy_from_slice(&h.as_bytes()[..16]);
    Key(u128::from_le_bytes(first))
}

/// The bytes a chain's seed hashes (docs/FORMAT.md §6).
fn seed_bytes(namespace: &str, model: &str, layer_first: u32, layer_last: u32) -> Vec<u8> {
    let mut seed = Vec::with_capacity(namespace.len() + model.len() + 24);
    seed.extend_from_slice(b"cxlkv-key-v1");
    seed.extend_from_slice(&(namespace.len() as u32).to_le_bytes());
    seed.extend_from_slice(namespace.as_bytes());
    seed.extend_from_slice(&(model.len() as u32).to_le_bytes());
    seed.extend_from_slice(model.as_bytes());
    seed.extend_from_slice(&layer_first.to_le_bytes());
    seed.extend_from_slice(&layer_last.to_le_bytes());
    seed
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Builds the key chain of one token sequence.
#[derive(Clone, Debug)]
pub struct KeyChain {
    prev: Key,
}

impl KeyChain {
    /// Starts a chain for `namespace` (tenant, engine instance), `model`, and the layers
    /// `layer_first..=layer_last` that the chain's blocks hold.
    pub fn new(namespace: &str, model: &str, layer_first: u32, layer_last: u32) -> KeyChain {
        KeyChain {
            prev: Key(xxh3_128(&seed_bytes(
                namespace,
                model,
                layer_first,
                layer_last,
            ))),
        }
    }

    /// [`KeyChain::new`] salted with a tenant's secret `salt`: the seed is the keyed BLAKE3 hash
    /// of the same bytes under [`salt_key`]`(salt)`; chunk keys continue as in an unsalted chain.
    /// Two tenants form the same keys only if they hold the same salt.
    pub fn salted(
        salt: &[u8],
        namespace: &str,
        model: &str,
        layer_first: u32,
        layer_last: u32,
    ) -> KeyChain {
        Self::salted_with_key(&salt_key(salt), namespace, model, layer_first, layer_last)
    }

    /// [`KeyChain::salted`] from an already derived key ([`salt_key`]).
    pub fn salted_with_key(
        key: &[u8; 32],
        namespace: &str,
        model: &str,
        layer_first: u32,
        layer_last: u32,
    ) -> KeyChain {
        KeyChain {
            prev: keyed(key, &seed_bytes(namespace, model, layer_first, layer_last)),
        }
    }

    /// The key of the next chunk, holding `tokens`; advances the chain.
    pub fn next_chunk(&mut self, tokens: &[u32]) -> Key {
        let mut buf = Vec::with_capacity(16 + 4 * tokens.len());
        buf.extend_from_slice(&self.prev.0.to_le_bytes());
        for t in tokens {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        self.prev = Key(xxh3_128(&buf));
        self.prev
    }

    /// Keys of `tokens` split into chunks of `chunk` tokens (the last may be shorter).
    pub fn keys(mut self, tokens: &[u32], chunk: usize) -> Vec<Key> {
        tokens
            .chunks(chunk.max(1))
            .map(|c| self.next_chunk(c))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefixes_share_keys() {
        let a: Vec<u32> = (0..100).collect();
        let mut b = a.clone();
        b[70] = 9999;
        let ka = KeyChain::new("ns", "m", 0, 29).keys(&a, 16);
        let kb = KeyChain::new("ns", "m", 0, 29).keys(&b, 16);
        assert_eq!(ka[..4], kb[..4]);
        assert_ne!(ka[4], kb[4]);
        assert_ne!(ka[5], kb[5], "a chunk key depends on its whole prefix");
        let other_model = KeyChain::new("ns", "m2", 0, 29).keys(&a, 16);
        assert_ne!(ka[0], other_model[0]);
    }

    #[test]
    fn salted_chains_differ_by_salt_and_keep_prefix_sharing() {
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[40] = 7777;
        let plain = KeyChain::new("ns", "m", 0, 29).keys(&a, 16);
        let s1 = KeyChain::salted(b"secret-1", "ns", "m", 0, 29).keys(&a, 16);
        let s1_again = KeyChain::salted(b"secret-1", "ns", "m", 0, 29).keys(&a, 16);
        let s1_b = KeyChain::salted(b"secret-1", "ns", "m", 0, 29).keys(&b, 16);
        let s2 = KeyChain::salted(b"secret-2", "ns", "m", 0, 29).keys(&a, 16);
        assert_eq!(s1, s1_again, "the same salt forms the same keys");
        assert_eq!(s1[..2], s1_b[..2], "salted chains still share prefixes");
        assert_ne!(s1[2], s1_b[2]);
        for i in 0..s1.len() {
            assert_ne!(s1[i], plain[i]);
            assert_ne!(s1[i], s2[i]);
        }
        let k = Key::from_bytes_salted(b"secret-1", b"blob");
        assert_ne!(k, Key::from_bytes(b"blob"));
        assert_ne!(k, Key::from_bytes_salted(b"secret-2", b"blob"));
        assert_eq!(k, Key::from_bytes_salted(b"secret-1", b"blob"));
        // The documented rule: keyed BLAKE3 under derive_key(context, salt), first 16 bytes LE.
        let h = blake3::keyed_hash(&blake3::derive_key(SALT_CONTEXT, b"secret-1"), b"blob");
        assert_eq!(k.0.to_le_bytes(), h.as_bytes()[..16]);
    }

    #[test]
    fn parts_round_trip() {
        let k = Key::from_bytes(b"hello");
        assert_eq!(Key::from_parts(k.lo(), k.hi()), k);
    }
}
