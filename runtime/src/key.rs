//! Block keys: 128-bit names of KV blocks that every engine computes the same way.
//!
//! A key names a block by (namespace, model, layer range, token prefix). Keys of a token sequence
//! form a chain: the key of chunk *i* hashes the key of chunk *i − 1* with chunk *i*'s token ids, so
//! a key stands for its whole prefix, and two requests that share a prefix share the keys of its
//! chunks. The hash is XXH3-128 over little-endian fields (docs/FORMAT.md gives the exact bytes).

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
        let mut seed = Vec::with_capacity(namespace.len() + model.len() + 24);
        seed.extend_from_slice(b"cxlkv-key-v1");
        seed.extend_from_slice(&(namespace.len() as u32).to_le_bytes());
        seed.extend_from_slice(namespace.as_bytes());
        seed.extend_from_slice(&(model.len() as u32).to_le_bytes());
        seed.extend_from_slice(model.as_bytes());
        seed.extend_from_slice(&layer_first.to_le_bytes());
        seed.extend_from_slice(&layer_last.to_le_bytes());
        KeyChain {
            prev: Key(xxh3_128(&seed)),
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
    fn parts_round_trip() {
        let k = Key::from_bytes(b"hello");
        assert_eq!(Key::from_parts(k.lo(), k.hi()), k);
    }
}
