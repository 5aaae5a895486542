//! `cxlkv generate`: greedy text generation with a real GGUF model and a chosen attention
//! backend; the text streams to stdout, the statistics go to stderr.

use super::{Error, Result};
use clap::Args;
use cxlkv::model::{attention, generate, Model, WeightFormat};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Arguments of `cxlkv generate`.
#[derive(Args)]
pub struct GenerateArgs {
    /// The model: a Llama-architecture GGUF file (scripts/fetch-model.sh fetches SmolLM2-135M).
    #[arg(long)]
    model: PathBuf,
    /// The prompt text.
    #[arg(
        long,
        required_unless_present = "prompt_file",
        conflicts_with = "prompt_file"
    )]
    prompt: Option<String>,
    /// Read the prompt from this file.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Attention backend (`dense`: private f32 K/V; `dense-f16`: private f16 K/V).
    #[arg(long, default_value = "dense")]
    attention: String,
    /// Tokens to generate at most (stops earlier at the end-of-sequence token).
    #[arg(short = 'n', long = "tokens", default_value_t = 128)]
    n: usize,
    /// Weights: `f32` (dequantized at load, exact) or `quantized` (as stored, 8-bit activations).
    #[arg(long, default_value = "f32")]
    weights: String,
    /// Wrap the prompt as a ChatML user turn (`<|im_start|>user ... <|im_start|>assistant`), for
    /// instruction-tuned models whose vocabulary has those markers.
    #[arg(long)]
    chat: bool,
}

/// Runs `cxlkv generate`.
pub fn run(a: &GenerateArgs) -> Result<ExitCode> {
    if !attention::BACKENDS.iter().any(|(n, _)| *n == a.attention) {
        let known: Vec<String> = attention::BACKENDS
            .iter()
            .map(|(n, what)| format!("  {n}: {what}"))
            .collect();
        return Err(Error::Usage(format!(
            "unknown attention backend {:?}; known:\n{}",
            a.attention,
            known.join("\n")
        )));
    }
    let format: WeightFormat = a.weights.parse().map_err(Error::Usage)?;
    let prompt = match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .map_err(|e| Error::Other(format!("read {}: {e}", f.display())))?,
        (None, None) => return Err(Error::Usage("--prompt or --prompt-file is needed".into())),
    };
    let model_err = |e: cxlkv::model::Error| Error::Other(e.to_string());
    let t = Instant::now();
    let model = Model::load(&a.model, format).map_err(model_err)?;
    let load = t.elapsed();
    let tk = model.tokenizer();
    let ids = if a.chat {
        if tk.token_id("<|im_start|>").is_none() || tk.token_id("<|im_end|>").is_none() {
            return Err(Error::Usage(
                "--chat needs a ChatML vocabulary (<|im_start|>, <|im_end|>)".into(),
            ));
        }
        tk.encode_with_specials(&format!(
            "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        ))
    } else {
        tk.encode(&prompt)
    };
    if ids.is_empty() {
        return Err(Error::Usage("the prompt encodes to no token".into()));
    }
    let mut attn = attention::backend(&a.attention, model.attention_shape()).map_err(model_err)?;
    let cfg = model.config();
    eprintln!(
        "model: {} ({} layers, d_model {}, {} heads / {} KV heads of {}, vocab {}, context {}), \
         weights {:?}, loaded in {:.2?}; attention {}",
        cfg.name.as_deref().unwrap_or(&cfg.architecture),
        cfg.layers,
        cfg.d_model,
        cfg.heads,
        cfg.kv_heads,
        cfg.head_dim,
        cfg.vocab,
        cfg.context,
        format,
        load,
        attn.name()
    );
    let mut stream = tk.stream();
    let mut out = std::io::stdout().lock();
    let stats = generate(&model, attn.as_mut(), &ids, a.n, |id| {
        let text = stream.push(id)?;
        // A closed stdout (`| head`) ends the run; it is not a model error.
        let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
        Ok(())
    })
    .map_err(model_err)?;
    let _ = writeln!(out, "{}", stream.finish());
    eprintln!(
        "prefill: {} tokens in {:.3} s ({:.1} tokens/s); decode: {} tokens in {:.3} s ({:.1} \
         tokens/s){}",
        stats.prompt_tokens,
        stats.prefill.as_secs_f64(),
        stats.prefill_tokens_per_s(),
        stats.generated,
        stats.decode.as_secs_f64(),
        stats.decode_tokens_per_s(),
        if stats.stopped_at_eos {
            "; stopped at end of sequence"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}
