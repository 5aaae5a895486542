//! `cxlkv demo`: what cxlkv is for, shown on real data in about a minute.
//!
//! 1. [`sharing`]: participant processes share a real KV cache (SmolLM2-135M's, data/kv/) through
//!    a shared-memory pool: one parks it, another finds the cached prefix and fetches it byte for
//!    byte, a reader pins it and attends over it.
//! 2. [`decode`]: the real model (scripts/fetch-model.sh's SmolLM2-135M, or `--model`) decodes
//!    over a real text at a 2,048-token context with its attention computed next to the memory
//!    (`ndp-exact`); its tokens are checked against `dense`, and the link bytes per token of
//!    `ndp-exact` and `pool` are read from the run.
//! 3. The near-data device's own numbers from that run: commands, bytes read in place, time.
//!
//! `--sweep` adds [`sweep`], the synthetic long-sequence top-k experiment, whose link ratio is
//! always printed beside its attention error. `--json` prints every figure as one object
//! (`sharing`, `decode`, `sweep`) on stdout; the lines for people then go to stderr. The demo
//! fails (exit 1) when the pool checks unclean or a mode's tokens differ from dense's.

mod decode;
pub(crate) mod kv_dir;
mod sharing;
mod sweep;

use super::{Error, Result};
use clap::Args;
use cxlkv::decode::{find_ndpd, DeviceChoice};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

pub use sharing::WorkerArgs;

/// The model file scripts/fetch-model.sh caches by default.
const MODEL_FILE: &str = "cxlkv/models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Arguments of `cxlkv demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// Folder in the format of data/kv/ (meta.json, tokens.npy, layerNN_{q,k,v}.npy).
    #[arg(long)]
    kv_dir: Option<PathBuf>,
    /// Pool backend of part 1 (default: a fresh /dev/shm pool removed at the end).
    #[arg(long)]
    pool: Option<String>,
    /// Keep the part-1 pool afterwards (inspect it with `cxlkv pool stat|check`).
    #[arg(long)]
    keep: bool,
    /// The GGUF model of part 2 (default: $CXLKV_MODEL, else the file scripts/fetch-model.sh
    /// caches).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The text of part 2, UTF-8 (default: The Devil's Dictionary, the token ids of the KV
    /// folder's tokens.npy).
    #[arg(long)]
    text: Option<PathBuf>,
    /// Context of part 2: the text's first N tokens.
    #[arg(long, default_value_t = 2048)]
    context: usize,
    /// Tokens each mode generates in part 2 (one decode step each).
    #[arg(long, default_value_t = 16)]
    generate: usize,
    /// Leave out parts 2 and 3 (the real model): part 1 needs no model.
    #[arg(long)]
    no_decode: bool,
    /// Add the synthetic long-sequence top-k sweep (its link ratio beside its attention error).
    #[arg(long)]
    sweep: bool,
    /// Tokens of the sweep's synthetic sequence (runs at 1/16, 1/4 and all of it).
    #[arg(long, default_value_t = 262_144, requires = "sweep")]
    tokens: usize,
    /// Top-k per decode step of the sweep.
    #[arg(long, default_value_t = 256, requires = "sweep")]
    k: usize,
    /// Run the near-data device as a separate `cxlkv-ndpd` process instead of a thread.
    #[arg(long)]
    device_process: bool,
    /// Print every figure as one JSON object on stdout; the rest goes to stderr.
    #[arg(long)]
    json: bool,
}

/// Part 2's model: `--model`, else `$CXLKV_MODEL`, else scripts/fetch-model.sh's cache.
fn model_path(a: &DemoArgs) -> Result<PathBuf> {
    let path = a
        .model
        .clone()
        .or_else(|| std::env::var_os("CXLKV_MODEL").map(PathBuf::from))
        .unwrap_or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .unwrap_or_default()
                .join(MODEL_FILE)
        });
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Usage(format!(
            "no model at {}: run scripts/fetch-model.sh (./scripts/demo.sh does), give --model \
             FILE or set CXLKV_MODEL; --no-decode leaves out the real-model part",
            path.display()
        )))
    }
}

/// Runs `cxlkv demo`.
pub fn run(a: &DemoArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let json = a.json;
    let say = |line: &str| {
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    let device = if a.device_process && !a.no_decode {
        let ndpd = find_ndpd().ok_or_else(|| {
            Error::Usage(
                "--device-process: cxlkv-ndpd not found next to cxlkv; set CXLKV_NDPD".into(),
            )
        })?;
        DeviceChoice::Ndpd(ndpd)
    } else {
        DeviceChoice::Thread
    };
    // Everything that can be refused is refused before part 1 runs.
    let decode = if a.no_decode {
        None
    } else {
        Some(decode::DecodeOptions {
            model: model_path(a)?,
            text: a.text.clone(),
            kv_dir: a.kv_dir.clone().unwrap_or_else(kv_dir::default_dir),
            context: a.context,
            steps: a.generate,
            device,
        })
    };
    let mut report = serde_json::Map::new();
    let mut ok = true;

    let kv = a.kv_dir.clone().unwrap_or_else(kv_dir::default_dir);
    let part1 = sharing::run(&kv, a.pool.as_deref(), a.keep, &say)?;
    report.insert("sharing".into(), part1.json);
    if !part1.ok {
        ok = false;
    }

    if let Some(o) = decode.filter(|_| ok) {
        say(&format!(
            "\n== part 2: {} decodes a real text with its attention next to the memory ({})",
            o.model
                .file_name()
                .map_or("the model".into(), |f| f.to_string_lossy()),
            decode::MODE
        ));
        let r = decode::run(&o, &|m| eprintln!("demo: {m}"))?;
        for line in r.lines() {
            say(&line);
        }
        ok &= r.identical();
        report.insert("decode".into(), r.to_json());
    }

    if a.sweep && ok {
        say("\n== sweep: near-data top-k on stored keys (real layers, then a synthetic sequence)");
        let opts = sweep::SweepOptions {
            tokens: a.tokens,
            k: a.k,
            device_process: a.device_process,
            kv_dir: a.kv_dir.clone(),
            pool: None,
        };
        use std::io::{IsTerminal, Write};
        let tty = std::io::stderr().is_terminal();
        let r = sweep::run(&opts, &mut |m| {
            // Progress bars redraw in place on a terminal; logs get no bars.
            if tty {
                eprint!("\r{m:<78}");
                let _ = std::io::stderr().flush();
            }
        });
        if tty {
            eprint!("\r{:<78}\r", "");
        }
        let r = r?;
        say(&r.to_string());
        report.insert("sweep".into(), r.to_json());
    }

    let seconds = started.elapsed().as_secs_f64();
    report.insert("seconds".into(), seconds.into());
    report.insert("ok".into(), ok.into());
    if json {
        println!("{}", serde_json::Value::Object(report));
    }
    say(&format!(
        "demo {} in {seconds:.1} s",
        if ok { "finished" } else { "FAILED" }
    ));
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Runs one demo participant process (the hidden `cxlkv demo-worker`).
pub fn worker(a: &WorkerArgs) -> Result<ExitCode> {
    sharing::worker(a)?;
    Ok(ExitCode::SUCCESS)
}
