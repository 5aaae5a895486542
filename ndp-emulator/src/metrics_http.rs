//! A minimal HTTP endpoint for Prometheus scrapes: `GET /metrics` answers the text a callback
//! renders at that moment; anything else gets 404 (an unknown path) or 405 (another method).
//! One thread serves connections one at a time, each with a read timeout, so a slow client
//! cannot hold it for long. Meant for loopback (`127.0.0.1:PORT`).
//!
//! [`label_pools`] merges the expositions of several pools (a `cxlkv-ndpd` serving more than one)
//! into one, each sample labelled with its pool, each family announced once.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// The content type of the text `prometheus-client` writes (OpenMetrics, ends with `# EOF`).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr` (`HOST:PORT`); a failure is an error that names the address.
pub fn bind(addr: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot listen on {addr} for metrics: {e}"),
        )
    })
}

/// Serves `render()` on `GET /metrics` of `listener` from a new thread. Returns the bound address
/// (the port the system chose, for port 0).
pub fn serve<F>(listener: TcpListener, render: F) -> std::io::Result<SocketAddr>
where
    F: Fn() -> String + Send + 'static,
{
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("cxlkv-metrics-http".into())
        .spawn(move || {
            // A failed accept is skipped; a client that hangs up or sends garbage only loses its
            // own answer.
            for s in listener.incoming().flatten() {
                let _ = answer(s, &render);
            }
        })?;
    Ok(bound)
}

fn answer(mut s: TcpStream, render: &dyn Fn() -> String) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut request = String::new();
    r.read_line(&mut request)?;
    // Skip the headers up to the blank line (bounded, so a flood cannot keep the thread).
    let mut line = String::new();
    for _ in 0..100 {
        line.clear();
        if r.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
            break;
        }
    }
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", CONTENT_TYPE, render()),
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "not found: metrics are at /metrics\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET /metrics\n".to_string(),
        ),
    };
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()
}

/// Merges OpenMetrics expositions (each as [`cxlkv_runtime::metrics::encode_registry`] writes it,
/// ending with `# EOF`), one per pool, into one: every sample gets the label `pool="NAME"`, and
/// each family's `# HELP`, `# TYPE` and `# UNIT` lines appear once (the first exposition's), its
/// samples from every pool right after them, families in the order they first appear.
pub fn label_pools(parts: &[(&str, String)]) -> String {
    // (family name, the part that announced it, its metadata lines, its samples), in order of
    // first appearance.
    let mut families: Vec<(String, usize, Vec<String>, Vec<String>)> = Vec::new();
    for (part, (pool, text)) in parts.iter().enumerate() {
        let value = escape_label(pool);
        let mut current: Option<usize> = None;
        for line in text.lines() {
            if line == "# EOF" || line.is_empty() {
                continue;
            }
            if let Some(meta) = line.strip_prefix("# ") {
                let name = meta.split_whitespace().nth(1).unwrap_or("");
                let i = match families.iter().position(|f| f.0 == name) {
                    Some(i) => i,
                    None => {
                        families.push((name.to_string(), part, Vec::new(), Vec::new()));
                        families.len() - 1
                    }
                };
                // A family's metadata comes from the first pool that announced it, once.
                if families[i].1 == part {
                    families[i].2.push(line.to_string());
                }
                current = Some(i);
                continue;
            }
            let sample = with_label(line, &value);
            match current {
                Some(i) => families[i].3.push(sample),
                // A sample before any metadata (prometheus-client writes none): kept on its own.
                None => families.push((String::new(), part, Vec::new(), vec![sample])),
            }
        }
    }
    let mut out = String::new();
    for (_, _, meta, samples) in &families {
        for l in meta.iter().chain(samples) {
            out.push_str(l);
            out.push('\n');
        }
    }
    out.push_str("# EOF\n");
    out
}

/// `value` escaped for a label value (backslash, double quote, newline).
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Sample line `line` (`name value` or `name{labels} value`) with `pool="value"` first.
fn with_label(line: &str, value: &str) -> String {
    let end = line.find(['{', ' ']).unwrap_or(line.len());
    let (name, rest) = line.split_at(end);
    match rest.strip_prefix('{') {
        Some(r) if r.starts_with('}') => format!("{name}{{pool=\"{value}\"{r}"),
        Some(r) => format!("{name}{{pool=\"{value}\",{r}"),
        None => format!("{name}{{pool=\"{value}\"}}{rest}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_pools_merge_into_one_family_each_with_pool_labels() {
        let a = "# HELP c Commands.\n# TYPE c counter\nc_total 5\n\
                 # HELP h Latency.\n# TYPE h histogram\n# UNIT h seconds\n\
                 h_bucket{le=\"1\",opcode=\"nop\"} 2\nh_count{opcode=\"nop\"} 2\n# EOF\n";
        let b = "# HELP c Commands.\n# TYPE c counter\nc_total 7\n# HELP x Only b.\n\
                 # TYPE x gauge\nx{} 1\n# EOF\n";
        let got = label_pools(&[("shm:a", a.to_string()), ("file:/p\"q", b.to_string())]);
        let want = "# HELP c Commands.\n# TYPE c counter\nc_total{pool=\"shm:a\"} 5\n\
                    c_total{pool=\"file:/p\\\"q\"} 7\n\
                    # HELP h Latency.\n# TYPE h histogram\n# UNIT h seconds\n\
                    h_bucket{pool=\"shm:a\",le=\"1\",opcode=\"nop\"} 2\n\
                    h_count{pool=\"shm:a\",opcode=\"nop\"} 2\n\
                    # HELP x Only b.\n# TYPE x gauge\nx{pool=\"file:/p\\\"q\"} 1\n# EOF\n";
        assert_eq!(got, want);
    }
}
