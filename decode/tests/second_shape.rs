//! A second model shape, read from its own GGUF: the test writes a small Llama-architecture GGUF
//! (random weights, a byte-level gpt2 vocabulary) whose hyper-parameters differ from SmolLM2-135M's
//! in every attention dimension (2 layers, 4 query heads over 1 KV head, head dim 32, RoPE base
//! 50,000), checks that the decoder's configuration is the file's, and that greedy tokens are
//! identical to the dense reference for `pool`, `ndp-exact` (device in a thread and as a
//! `cxlkv-ndpd` process), `topk` with a budget over every position and `topp:1.0`.
//!
//! No registry we can reach ships a second GGUF that this decoder runs (Llama architecture with a
//! gpt2 tokenizer): this file stands in for one, so that nothing in the backends silently depends
//! on SmolLM2's shape. Its tokens are garbage text, but they are a deterministic function of the
//! attention outputs, which is what the comparison needs.

use cxlkv_decode::{DeviceChoice, Env, EnvOptions, ModeSpec};
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_model::{argmax, Attention, Model, WeightFormat};
use std::path::{Path, PathBuf};

/// The shape written to the file.
const LAYERS: usize = 2;
const D_MODEL: usize = 128;
const HEADS: usize = 4;
const KV_HEADS: usize = 1;
const HEAD_DIM: usize = 32;
const FFN: usize = 256;
const CONTEXT: usize = 256;
const ROPE_BASE: f32 = 50_000.0;
/// 256 byte tokens and an end-of-sequence token.
const VOCAB: usize = 257;

/// A GGUF metadata value.
enum Val {
    U32(u32),
    F32(f32),
    Str(String),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

/// GGUF (version 3) writer for F32 tensors: enough for this test.
struct GgufWriter {
    kvs: Vec<(String, Val)>,
    tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl GgufWriter {
    /// Adds tensor `name` with candle-order `dims` (rows first), row-major `data`.
    fn tensor(&mut self, name: &str, dims: &[usize], data: Vec<f32>) {
        assert_eq!(dims.iter().product::<usize>(), data.len(), "{name}");
        self.tensors.push((name.into(), dims.to_vec(), data));
    }

    fn bytes(&self) -> Vec<u8> {
        const ALIGN: usize = 32;
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            match v {
                Val::U32(x) => {
                    out.extend(4u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                Val::F32(x) => {
                    out.extend(6u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                Val::Str(s) => {
                    out.extend(8u32.to_le_bytes());
                    put_str(&mut out, s);
                }
                Val::Strs(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(8u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    for s in items {
                        put_str(&mut out, s);
                    }
                }
                Val::I32s(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(5u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    for x in items {
                        out.extend(x.to_le_bytes());
                    }
                }
            }
        }
        let mut offset = 0usize;
        for (name, dims, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            // GGUF lists dimensions innermost first.
            for d in dims.iter().rev() {
                out.extend((*d as u64).to_le_bytes());
            }
            out.extend(0u32.to_le_bytes()); // F32
            out.extend((offset as u64).to_le_bytes());
            offset += (data.len() * 4).next_multiple_of(ALIGN);
        }
        out.resize(out.len().next_multiple_of(ALIGN), 0);
        for (_, _, data) in &self.tensors {
            let start = out.len();
            out.extend(data.iter().flat_map(|x| x.to_le_bytes()));
            out.resize(start + (data.len() * 4).next_multiple_of(ALIGN), 0);
        }
        out
    }
}

/// GPT-2's byte-to-character map (the vocabulary of a byte-level BPE without merges).
fn byte_tokens() -> Vec<String> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(c).unwrap().to_string()
        })
        .collect()
}

/// Writes the synthetic model to `path`.
fn write_model(path: &Path) {
    let mut rng = SplitMix64::new(0x5eed);
    let mut w = GgufWriter {
        kvs: Vec::new(),
        tensors: Vec::new(),
    };
    let mut tokens = byte_tokens();
    tokens.push("<|end|>".into());
    let mut types = vec![1; 256];
    types.push(3); // control
    let kv = |k: &str, v: Val| (k.to_string(), v);
    w.kvs = vec![
        kv("general.architecture", Val::Str("llama".into())),
        kv("general.name", Val::Str("cxlkv synthetic 2x4x1x32".into())),
        kv("llama.block_count", Val::U32(LAYERS as u32)),
        kv("llama.embedding_length", Val::U32(D_MODEL as u32)),
        kv("llama.attention.head_count", Val::U32(HEADS as u32)),
        kv("llama.attention.head_count_kv", Val::U32(KV_HEADS as u32)),
        kv("llama.feed_forward_length", Val::U32(FFN as u32)),
        kv("llama.context_length", Val::U32(CONTEXT as u32)),
        kv("llama.rope.freq_base", Val::F32(ROPE_BASE)),
        kv("llama.attention.layer_norm_rms_epsilon", Val::F32(1e-5)),
        kv("tokenizer.ggml.model", Val::Str("gpt2".into())),
        kv("tokenizer.ggml.tokens", Val::Strs(tokens)),
        kv("tokenizer.ggml.merges", Val::Strs(Vec::new())),
        kv("tokenizer.ggml.token_type", Val::I32s(types)),
        kv("tokenizer.ggml.eos_token_id", Val::U32(256)),
    ];
    let mut mat = |rows: usize, cols: usize| -> Vec<f32> {
        let s = 1.0 / (cols as f32).sqrt();
        rng.normal_vec(rows * cols).iter().map(|x| x * s).collect()
    };
    let ones = |n: usize| vec![1.0f32; n];
    w.tensor("token_embd.weight", &[VOCAB, D_MODEL], mat(VOCAB, D_MODEL));
    for l in 0..LAYERS {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        w.tensor(&n("attn_norm"), &[D_MODEL], ones(D_MODEL));
        // Larger query/key weights make the attention peaked, so that its output matters.
        let q: Vec<f32> = mat(HEADS * HEAD_DIM, D_MODEL)
            .iter()
            .map(|x| 3.0 * x)
            .collect();
        w.tensor(&n("attn_q"), &[HEADS * HEAD_DIM, D_MODEL], q);
        w.tensor(
            &n("attn_k"),
            &[KV_HEADS * HEAD_DIM, D_MODEL],
            mat(KV_HEADS * HEAD_DIM, D_MODEL),
        );
        w.tensor(
            &n("attn_v"),
            &[KV_HEADS * HEAD_DIM, D_MODEL],
            mat(KV_HEADS * HEAD_DIM, D_MODEL),
        );
        w.tensor(
            &n("attn_output"),
            &[D_MODEL, HEADS * HEAD_DIM],
            mat(D_MODEL, HEADS * HEAD_DIM),
        );
        w.tensor(&n("ffn_norm"), &[D_MODEL], ones(D_MODEL));
        w.tensor(&n("ffn_gate"), &[FFN, D_MODEL], mat(FFN, D_MODEL));
        w.tensor(&n("ffn_up"), &[FFN, D_MODEL], mat(FFN, D_MODEL));
        w.tensor(&n("ffn_down"), &[D_MODEL, FFN], mat(D_MODEL, FFN));
    }
    w.tensor("output_norm.weight", &[D_MODEL], ones(D_MODEL));
    std::fs::write(path, w.bytes()).unwrap();
}

/// The file, removed when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Exactly `n` greedy tokens of `prompt` (through EOS: a fixed count is compared).
fn greedy(model: &Model, attn: &mut dyn Attention, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(n);
    let mut next = argmax(&model.forward(prompt, attn).unwrap()) as u32;
    while out.len() < n {
        out.push(next);
        if out.len() < n {
            next = argmax(&model.forward(&[next], attn).unwrap()) as u32;
        }
    }
    out
}

#[test]
fn a_second_shape_is_read_from_its_gguf_and_decodes_identically() {
    let file = TempFile(
        std::env::temp_dir().join(format!("cxlkv-second-shape-{}.gguf", std::process::id())),
    );
    write_model(&file.0);
    let model = Model::load(&file.0, WeightFormat::F32).unwrap();
    let cfg = model.config();
    assert_eq!(
        (
            cfg.architecture.as_str(),
            cfg.layers,
            cfg.d_model,
            cfg.heads
        ),
        ("llama", LAYERS, D_MODEL, HEADS)
    );
    assert_eq!(
        (cfg.kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab, cfg.context),
        (KV_HEADS, HEAD_DIM, FFN, VOCAB, CONTEXT)
    );
    assert_eq!((cfg.rope_base, cfg.rope_dims), (ROPE_BASE, HEAD_DIM));
    assert_eq!(model.tokenizer().eos(), Some(256));
    let shape = model.attention_shape();
    assert_eq!(
        (shape.layers, shape.heads, shape.kv_heads, shape.head_dim),
        (LAYERS, HEADS, KV_HEADS, HEAD_DIM)
    );
    // The byte vocabulary round-trips text.
    let ids = model.tokenizer().encode("Hello, near-data attention!");
    assert_eq!(
        model.tokenizer().decode(&ids).unwrap(),
        "Hello, near-data attention!"
    );

    let (block, new) = (16, 24);
    let mut rng = SplitMix64::new(3);
    let prompts: Vec<Vec<u32>> = [40usize, 57]
        .iter()
        .map(|&n| (0..n).map(|_| rng.below(256) as u32).collect())
        .collect();
    let dense: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut d = cxlkv_model::Dense::new(shape, cxlkv_kernels::DType::F32).unwrap();
            greedy(&model, &mut d, p, new)
        })
        .collect();
    // Not a constant answer: the tokens depend on the prompt.
    assert_ne!(dense[0], dense[1]);
    let ndpd = cxlkv_test_support::ndpd();
    let longest = prompts.iter().map(Vec::len).max().unwrap();
    // The comparison has teeth: attending to only 2 stored positions per head (no sinks, no
    // window) changes the tokens.
    {
        let env = Env::open(
            &EnvOptions {
                block_tokens: block,
                sinks: 0,
                window: 0,
                ..EnvOptions::default()
            },
            shape,
            longest + new,
        )
        .unwrap();
        let lossy = prompts.iter().enumerate().any(|(i, p)| {
            let mut b = env
                .backend(&ModeSpec::parse("topk:2").unwrap(), 100 + i as u64)
                .unwrap();
            greedy(&model, b.as_mut(), p, new) != dense[i]
        });
        assert!(
            lossy,
            "topk:2 gave the dense tokens: attention does not matter here"
        );
    }
    for device in [DeviceChoice::Thread, DeviceChoice::Ndpd(ndpd)] {
        let opts = EnvOptions {
            device: device.clone(),
            block_tokens: block,
            ..EnvOptions::default()
        };
        let env = Env::open(&opts, shape, longest + new).unwrap();
        let modes: &[&str] = match device {
            DeviceChoice::Thread => &["pool", "ndp-exact", "topk:4096", "topp:1.0"],
            _ => &["pool", "ndp-exact"],
        };
        for (i, prompt) in prompts.iter().enumerate() {
            for (m, mode) in modes.iter().enumerate() {
                let spec = ModeSpec::parse(mode).unwrap();
                let mut b = env.backend(&spec, (i * modes.len() + m) as u64).unwrap();
                let before = b.stats();
                let got = greedy(&model, b.as_mut(), prompt, new);
                assert_eq!(
                    got, dense[i],
                    "{mode} on {device:?}, prompt {i}: greedy tokens differ from dense"
                );
                if *mode != "pool" {
                    let st = b.stats().since(&before);
                    assert!(st.device_commands > 0, "{mode} on {device:?}: {st:?}");
                }
            }
        }
    }
}
