//! A minimal HTTP endpoint for Prometheus scrapes: `GET /metrics` answers the text a callback
//! renders at that moment; anything else gets 404 (an unknown path) or 405 (another method).
//! One thread serves connections one at a time, each with a read timeout, so a slow client
//! cannot hold it for long. Meant for loopback (`127.0.0.1:PORT`).

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
