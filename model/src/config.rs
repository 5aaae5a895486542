//! The model's hyper-parameters, read from the GGUF metadata (`{arch}.*` keys) and checked against
//! each other, so that nothing in the forward is specific to one model.

use crate::error::{Error, Result};
use crate::gguf::Gguf;
use cxlkv_kernels::attention::default_scale;

/// Architectures this decoder runs (`general.architecture`).
pub const SUPPORTED_ARCHITECTURES: &str = "llama, gemma3";

/// Hyper-parameters of a Llama-architecture model.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `general.architecture`.
    pub architecture: String,
    /// `general.name`, if the file has one.
    pub name: Option<String>,
    /// Transformer blocks (`block_count`).
    pub layers: usize,
    /// Width of the residual stream (`embedding_length`).
    pub d_model: usize,
    /// Query heads (`attention.head_count`).
    pub heads: usize,
    /// Key/value heads (`attention.head_count_kv`; grouped-query attention when fewer than
    /// `heads`: query head `h` reads KV head `h / (heads / kv_heads)`).
    pub kv_heads: usize,
    /// Elements per head (`attention.key_length`, else `d_model / heads`).
    pub head_dim: usize,
    /// Hidden width of the SwiGLU MLP (`feed_forward_length`).
    pub ffn: usize,
    /// Vocabulary size (`vocab_size`, else the length of `tokenizer.ggml.tokens`).
    pub vocab: usize,
    /// Positions the model was trained for (`context_length`).
    pub context: usize,
    /// RoPE base frequency (`rope.freq_base`, default 10,000).
    pub rope_base: f32,
    /// Leading dimensions of each head that RoPE rotates (`rope.dimension_count`, default
    /// `head_dim`).
    pub rope_dims: usize,
    /// RMSNorm epsilon (`attention.layer_norm_rms_epsilon`).
    pub eps: f32,
    /// Positions a sliding-window layer sees (`attention.sliding_window`; Gemma 3), if any.
    pub sliding_window: Option<usize>,
    /// With a sliding window, every `swa_pattern`-th layer (`l % swa_pattern == swa_pattern − 1`)
    /// is global and the others slide (llama.cpp's rule for Gemma 3: 6).
    pub swa_pattern: usize,
}

impl Config {
    /// Reads and checks the configuration of `gguf`. Unsupported architectures and RoPE
    /// variants are errors, not silently different models.
    pub fn from_gguf(gguf: &Gguf) -> Result<Config> {
        let arch = gguf.str("general.architecture")?.to_string();
        if !SUPPORTED_ARCHITECTURES.split(", ").any(|a| a == arch) {
            return Err(Error::UnsupportedArchitecture {
                found: arch,
                supported: SUPPORTED_ARCHITECTURES,
            });
        }
        let key = |k: &str| format!("{arch}.{k}");
        let d_model = gguf.usize(&key("embedding_length"))?;
        let heads = gguf.usize(&key("attention.head_count"))?;
        let kv_heads = gguf
            .usize_opt(&key("attention.head_count_kv"))?
            .unwrap_or(heads);
        let head_dim = match gguf.usize_opt(&key("attention.key_length"))? {
            Some(d) => d,
            None if heads > 0 => d_model / heads,
            None => 0,
        };
        let vocab = match gguf.usize_opt(&key("vocab_size"))? {
            Some(v) => v,
            None => gguf.strings("tokenizer.ggml.tokens")?.len(),
        };
        let rope_base = match gguf.get(&key("rope.freq_base")) {
            Some(_) => gguf.f32(&key("rope.freq_base"))?,
            None => 10_000.0,
        };
        let rope_dims = gguf
            .usize_opt(&key("rope.dimension_count"))?
            .unwrap_or(head_dim);
        let cfg = Config {
            name: gguf.str("general.name").ok().map(str::to_string),
            layers: gguf.usize(&key("block_count"))?,
            d_model,
            heads,
            kv_heads,
            head_dim,
            ffn: gguf.usize(&key("feed_forward_length"))?,
            vocab,
            context: gguf.usize(&key("context_length"))?,
            rope_base,
            rope_dims,
            eps: gguf.f32(&key("attention.layer_norm_rms_epsilon"))?,
            sliding_window: match arch.as_str() {
                "gemma3" => gguf
                    .usize_opt(&key("attention.sliding_window"))?
                    .filter(|&w| w > 0),
                _ => None,
            },
            swa_pattern: 6,
            architecture: arch.clone(),
        };
        cfg.check(&key)?;
        if let Ok(kind) = gguf.str(&key("rope.scaling.type")) {
            if kind != "none" {
                return Err(bad(
                    &key("rope.scaling.type"),
                    format!("RoPE scaling {kind:?} is not implemented"),
                ));
            }
        }
        if gguf.has_tensor("rope_freqs.weight") {
            return Err(bad(
                "rope_freqs.weight",
                "per-dimension RoPE frequencies (Llama 3.1 scaling) are not implemented".into(),
            ));
        }
        Ok(cfg)
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// `1/sqrt(head_dim)`, the attention scale. (llama.cpp uses `1/sqrt(d_model / heads)` for
    /// Gemma 3 27B, 62 layers, whose `query_pre_attn_scalar` differs: followed here.)
    pub fn attention_scale(&self) -> f32 {
        if self.architecture == "gemma3" && self.layers == 62 {
            return default_scale(self.d_model / self.heads);
        }
        default_scale(self.head_dim)
    }

    /// True if layer `l` attends to every position (no sliding window).
    pub fn is_global(&self, l: usize) -> bool {
        self.sliding_window.is_none() || l % self.swa_pattern == self.swa_pattern - 1
    }

    fn check(&self, key: &dyn Fn(&str) -> String) -> Result<()> {
        let positive = [
            ("block_count", self.layers),
            ("embedding_length", self.d_model),
            ("attention.head_count", self.heads),
            ("attention.head_count_kv", self.kv_heads),
            ("attention.key_length", self.head_dim),
            ("feed_forward_length", self.ffn),
            ("vocab_size", self.vocab),
            ("context_length", self.context),
        ];
        for (k, v) in positive {
            if v == 0 {
                return Err(bad(&key(k), "must be positive".into()));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(bad(
                &key("attention.head_count_kv"),
                format!(
                    "{} does not divide head_count {}",
                    self.kv_heads, self.heads
                ),
            ));
        }
        if self.rope_dims > self.head_dim || !self.rope_dims.is_multiple_of(2) {
            return Err(bad(
                &key("rope.dimension_count"),
                format!(
                    "{} must be even and at most the head dimension {}",
                    self.rope_dims, self.head_dim
                ),
            ));
        }
        if !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return Err(bad(
                &key("rope.freq_base"),
                format!("{} is not a positive frequency", self.rope_base),
            ));
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(bad(
                &key("attention.layer_norm_rms_epsilon"),
                format!("{} is not a positive epsilon", self.eps),
            ));
        }
        Ok(())
    }
}

fn bad(key: &str, reason: String) -> Error {
    Error::BadMetadata {
        key: key.to_string(),
        reason,
    }
}
