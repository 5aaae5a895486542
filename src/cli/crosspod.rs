//! `cxlkv crosspod`: the pod's bridge to Mooncake Store (docs/CROSSPOD.md). `serve` runs the
//! bridge, which is Python (Mooncake's only published API), under its supervisor:
//! `$CXLKV_PYTHON -m cxlkv.crosspod serve ...` (default `python3`, which must have the cxlkv and
//! mooncake packages). `stat` asks a running bridge for its metrics over its socket.

use super::{Error, Result};
use clap::{Args, Subcommand, ValueEnum};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::time::Duration;

/// The `crosspod` subcommands.
#[derive(Subcommand)]
pub enum CrosspodCommand {
    /// Run the bridge (supervised: restarted when it dies), which is Python:
    /// `$CXLKV_PYTHON -m cxlkv.crosspod serve` with these options (default `python3`, which must
    /// have the cxlkv and mooncake packages).
    Serve(Box<ServeArgs>),
    /// Print a running bridge's metrics: published, imported, bytes, failures by reason, import
    /// latency and where it goes.
    Stat {
        /// The bridge's Unix socket (what CXLKV_CROSSPOD_SOCKET names for the runtimes).
        #[arg(long)]
        socket: String,
        /// Print the bridge's JSON as it is.
        #[arg(long)]
        json: bool,
    },
}

/// The options of `cxlkv crosspod serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// The pool's spec (shm:NAME, file:PATH, ...).
    #[arg(long)]
    pool: String,
    /// The mooncake_master's address.
    #[arg(long, value_name = "HOST:PORT")]
    master: String,
    /// The Unix socket the runtimes ask (what CXLKV_CROSSPOD_SOCKET names for them).
    #[arg(long, value_name = "PATH")]
    socket: String,
    /// The pool tenant the bridge attaches as (and Mooncake's tenant_id); with --salt-env or
    /// --salt.
    #[arg(long, value_name = "NAME")]
    tenant: Option<String>,
    /// The name of an environment variable holding the tenant's salt, in hex.
    #[arg(long, value_name = "VAR")]
    salt_env: Option<String>,
    /// The tenant's salt, in hex (visible in the process list: prefer --salt-env).
    #[arg(long, value_name = "HEX")]
    salt: Option<String>,
    /// The model's name in the store keys.
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// Memory the bridge lends to the store, in MiB.
    #[arg(long, value_name = "N")]
    segment_mib: Option<u64>,
    /// Blocks the bridge keeps free in its partition between requests (evicting ahead), so
    /// that an import of up to that many blocks neither waits on eviction nor asks the store
    /// first (default 64; 0: evict on demand).
    #[arg(long, value_name = "N")]
    keep_free: Option<u64>,
    /// Where the running bridge writes its pid.
    #[arg(long, value_name = "PATH")]
    pid_file: Option<String>,
    /// When blocks are published: writers' publish requests (on-put, the default), evictions
    /// (on-eviction: write-back, asked by the runtime of each participant that evicts),
    /// both, or never.
    #[arg(long, value_name = "POLICY")]
    publish: Option<Publish>,
    /// Do not fault the pool's pages in at start (a pool too large to fault in; imports then
    /// pay first-touch page faults).
    #[arg(long)]
    no_prefault: bool,
}

/// When a bridge publishes blocks (`--publish`; docs/CROSSPOD.md).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Publish {
    /// At every put of a runtime with the bridge configured (write-through), and
    /// when a writer asks (`publish` requests).
    OnPut,
    /// When a participant evicts a block (write-back).
    OnEviction,
    /// Both.
    Both,
    /// Never.
    Never,
}

/// Runs one `crosspod` subcommand.
pub fn run(command: CrosspodCommand) -> Result<ExitCode> {
    match command {
        CrosspodCommand::Serve(serve_args) => {
            let ServeArgs {
                pool,
                master,
                socket,
                tenant,
                salt_env,
                salt,
                model,
                segment_mib,
                keep_free,
                pid_file,
                publish,
                no_prefault,
            } = *serve_args;
            let mut args = vec![
                "--pool".to_owned(),
                pool,
                "--master".to_owned(),
                master,
                "--socket".to_owned(),
                socket,
            ];
            let optional = [
                ("--tenant", tenant),
                ("--salt-env", salt_env),
                ("--salt", salt),
                ("--model", model),
                ("--segment-mib", segment_mib.map(|n| n.to_string())),
                ("--keep-free", keep_free.map(|n| n.to_string())),
                ("--pid-file", pid_file),
                (
                    "--publish",
                    publish.and_then(|p| Some(p.to_possible_value()?.get_name().to_owned())),
                ),
            ];
            for (flag, value) in optional {
                if let Some(v) = value {
                    args.extend([flag.to_owned(), v]);
                }
            }
            if no_prefault {
                args.push("--no-prefault".to_owned());
            }
            serve(&args)
        }
        CrosspodCommand::Stat { socket, json } => stat(&socket, json),
    }
}

fn serve(args: &[String]) -> Result<ExitCode> {
    let python = std::env::var("CXLKV_PYTHON").unwrap_or_else(|_| "python3".into());
    let status = std::process::Command::new(&python)
        .args(["-m", "cxlkv.crosspod", "serve"])
        .args(args)
        .status()
        .map_err(|e| Error::Other(format!("run {python} -m cxlkv.crosspod: {e}")))?;
    Ok(ExitCode::from(
        status.code().unwrap_or(1).clamp(0, 255) as u8
    ))
}

fn stat(socket: &str, json: bool) -> Result<ExitCode> {
    let answer = ask(socket, "stat")
        .map_err(|e| Error::Other(format!("no bridge answers on {socket}: {e}")))?;
    let body = answer
        .strip_prefix("ok ")
        .ok_or_else(|| Error::Other(format!("bridge on {socket} answered {answer:?}")))?;
    if json {
        println!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    let m: serde_json::Value = serde_json::from_str(body)
        .map_err(|e| Error::Other(format!("bridge on {socket}: bad metrics: {e}")))?;
    print!("{}", render(&m));
    Ok(ExitCode::SUCCESS)
}

/// The cross-pod tier's section of `cxlkv pool stat`: the metrics of the bridge that
/// `CXLKV_CROSSPOD_SOCKET` names, or why there are none.
pub fn print_tier() {
    let socket = std::env::var(cxlkv_runtime::crosspod::SOCKET_ENV).unwrap_or_default();
    if socket.is_empty() {
        println!("cross-pod tier: off (CXLKV_CROSSPOD_SOCKET is not set)");
        return;
    }
    let metrics = ask(&socket, "stat").ok().and_then(|a| {
        let body = a.strip_prefix("ok ")?.to_string();
        serde_json::from_str::<serde_json::Value>(&body).ok()
    });
    match metrics {
        Some(m) => println!(
            "cross-pod tier (bridge {socket}):\n{}",
            render(&m).trim_end()
        ),
        None => println!("cross-pod tier: no bridge answers on {socket} (lookups are pod-local)"),
    }
}

/// The metrics as `name value` lines, the import latency as a mean and a maximum.
fn render(m: &serde_json::Value) -> String {
    let n = |k: &str| m.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let mut out = String::new();
    if let Some(policy) = m.get("policy").and_then(serde_json::Value::as_str) {
        out.push_str(&format!("{:<18} {policy}\n", "publish_policy"));
    }
    for k in [
        "published",
        "published_bytes",
        "written_back",
        "imported",
        "imported_bytes",
        "import_requests",
    ] {
        out.push_str(&format!("{k:<18} {}\n", n(k)));
    }
    let mean_us = n("import_ns_total") / n("import_requests").max(1) / 1000;
    out.push_str(&format!(
        "{:<18} mean {mean_us} us, max {} us\n",
        "import_latency",
        n("import_ns_max") / 1000
    ));
    if let Some(p) = m
        .get("import_phase_ns")
        .and_then(serde_json::Value::as_object)
    {
        for (phase, ns) in p {
            let us = ns.as_u64().unwrap_or(0) / n("import_requests").max(1) / 1000;
            out.push_str(&format!("phase.{phase:<12} mean {us} us\n"));
        }
    }
    if let Some(f) = m.get("failures").and_then(serde_json::Value::as_object) {
        for (reason, count) in f {
            out.push_str(&format!("failures.{reason:<9} {count}\n"));
        }
    }
    out
}

fn ask(socket: &str, line: &str) -> std::io::Result<String> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer)?;
    Ok(answer.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_policies_are_passed_by_their_bridge_names() {
        let names: Vec<_> = Publish::value_variants()
            .iter()
            .map(|p| p.to_possible_value().unwrap().get_name().to_owned())
            .collect();
        assert_eq!(names, ["on-put", "on-eviction", "both", "never"]);
    }

    #[test]
    fn render_shows_counts_latency_and_failures() {
        let m = serde_json::json!({"policy": "on-eviction", "published": 3, "written_back": 1,
            "imported": 2, "import_requests": 2,
            "import_ns_total": 4_000_000, "import_ns_max": 3_000_000,
            "import_phase_ns": {"read": 2_000_000}, "failures": {"store_error": 1}});
        let text = render(&m);
        assert!(text.contains("imported           2\n"), "{text}");
        assert!(text.contains("publish_policy     on-eviction\n"), "{text}");
        assert!(text.contains("written_back       1\n"), "{text}");
        assert!(text.contains("mean 2000 us, max 3000 us"), "{text}");
        assert!(text.contains("failures.store_error 1"), "{text}");
        assert!(text.contains("phase.read         mean 1000 us"), "{text}");
    }

    #[test]
    fn no_bridge_is_a_clear_error() {
        let e = stat("/nonexistent/cxlkv-crosspod.sock", false).unwrap_err();
        assert!(e.to_string().contains("no bridge answers"), "{e}");
    }
}
