//! Clear errors, never panics, for files and requests the decoder cannot serve.

mod common;

use cxlkv_model::{generate, Attention, Dense, Error, Gguf, Model, Result, WeightFormat};

fn scratch(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cxlkv-model-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A GGUF v3 header with no tensors and the given string metadata.
fn gguf_with(kv: &[(&str, &str)]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        b.extend_from_slice(&(k.len() as u64).to_le_bytes());
        b.extend_from_slice(k.as_bytes());
        b.extend_from_slice(&8u32.to_le_bytes()); // string
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        b.extend_from_slice(v.as_bytes());
    }
    b
}

#[test]
fn missing_file() {
    let e = Model::load("/nonexistent/model.gguf", WeightFormat::F32)
        .err()
        .unwrap();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(e.to_string().contains("/nonexistent/model.gguf"), "{e}");
}

#[test]
fn not_a_gguf() {
    let p = scratch("not.gguf", b"PK\x03\x04 this is a zip, not a model");
    let e = Model::load(&p, WeightFormat::F32).err().unwrap();
    assert!(matches!(e, Error::NotGguf { .. }), "{e}");
    let p = scratch("short.gguf", b"GG");
    assert!(matches!(Gguf::open(&p), Err(Error::NotGguf { .. })));
    let p = scratch(
        "truncated.gguf",
        &gguf_with(&[("general.architecture", "llama")])[..30],
    );
    assert!(matches!(Gguf::open(&p), Err(Error::NotGguf { .. })));
}

#[test]
fn unsupported_architecture() {
    let p = scratch(
        "arch.gguf",
        &gguf_with(&[("general.architecture", "gptneox")]),
    );
    let e = Model::load(&p, WeightFormat::F32).err().unwrap();
    assert!(matches!(e, Error::UnsupportedArchitecture { .. }), "{e}");
    assert!(
        e.to_string().contains("gptneox") && e.to_string().contains("llama"),
        "{e}"
    );
    let p = scratch(
        "nokeys.gguf",
        &gguf_with(&[("general.architecture", "llama")]),
    );
    let e = Model::load(&p, WeightFormat::F32).err().unwrap();
    assert!(
        matches!(e, Error::MissingMetadata(ref k) if k.starts_with("llama.")),
        "{e}"
    );
}

/// A backend that claims to hold `held` positions already.
struct Full {
    inner: Dense,
    held: usize,
}

impl Attention for Full {
    fn name(&self) -> &str {
        "full"
    }
    fn len(&self, _layer: usize) -> usize {
        self.held
    }
    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        self.inner.append(layer, k, v)
    }
    fn attend(&mut self, layer: usize, q: &[f32], out: &mut [f32]) -> Result<()> {
        self.inner.attend(layer, q, out)
    }
    fn clear(&mut self) {}
    fn stats(&self) -> cxlkv_model::AttentionStats {
        self.inner.stats()
    }
}

#[test]
fn context_longer_than_the_model() {
    let Some(path) = common::model_path("context_longer_than_the_model") else {
        return;
    };
    let model = Model::load(path, WeightFormat::Quantized).unwrap();
    let ctx = model.config().context;
    let s = model.attention_shape();
    let mut full = Full {
        inner: Dense::new(s, cxlkv_kernels::DType::F32).unwrap(),
        held: ctx - 2,
    };
    let e = model.forward(&[1, 2, 3], &mut full).err().unwrap();
    assert!(
        matches!(e, Error::ContextTooLong { requested, max } if requested == ctx + 1 && max == ctx),
        "{e}"
    );
    let mut dense = Dense::new(s, cxlkv_kernels::DType::F32).unwrap();
    let e = generate(&model, &mut dense, &[1, 2], ctx, |_| Ok(()))
        .err()
        .unwrap();
    assert!(matches!(e, Error::ContextTooLong { .. }), "{e}");
    assert!(dense.is_empty(0), "refused before any work");
    let e = model.forward(&[u32::MAX], &mut dense).err().unwrap();
    assert!(matches!(e, Error::BadToken { .. }), "{e}");
    assert!(matches!(
        model.forward(&[], &mut dense),
        Err(Error::EmptyInput)
    ));
}
