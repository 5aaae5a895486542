//! The client side of the cross-pod tier (docs/CROSSPOD.md): when a pool lookup stops short of a
//! key chain, [`extend`] asks the pod's bridge (`cxlkv crosspod serve`, the process that talks to
//! Mooncake Store) to import the rest of the chain into this pool, and returns how many further
//! keys are now present.
//!
//! The bridge is found through the `CXLKV_CROSSPOD_SOCKET` environment variable (a Unix socket
//! path); without it, or with an empty value, nothing is asked and the pool is pod-local. The
//! request carries keys only, never payloads: the bridge reads the store's bytes straight into
//! blocks it reserved in the pool and commits them through the normal single-writer path, so by the
//! time it answers, the imported blocks are ordinary committed blocks.
//!
//! Failure model: every failure here (no bridge listening, a bridge that dies mid-request, a
//! timeout, a malformed answer) is a miss of the rest of the chain, never an error and never a
//! hang. A fresh connection per request makes reconnecting after a bridge restart automatic. The
//! answer is never trusted beyond the chain it was asked about, and the caller re-checks its own
//! pool for what the bridge says it imported.

use crate::key::Key;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The environment variable naming the bridge's Unix socket.
pub const SOCKET_ENV: &str = "CXLKV_CROSSPOD_SOCKET";
/// The environment variable overriding [`DEFAULT_TIMEOUT`] (milliseconds).
pub const TIMEOUT_ENV: &str = "CXLKV_CROSSPOD_TIMEOUT_MS";
/// How long a lookup waits for the bridge before it counts the rest of the chain as a miss.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(2000);

/// The request line for `rest`: `import <count> <key>...`, keys as 32 hex digits.
pub fn request_line(rest: &[Key]) -> String {
    let mut line = format!("import {}", rest.len());
    for k in rest {
        line.push_str(&format!(" {:032x}", k.0));
    }
    line.push('\n');
    line
}

/// Parses the bridge's answer `ok <n>` to a request about `asked` keys: `None` for anything else,
/// including a count above `asked`.
pub fn parse_answer(line: &str, asked: usize) -> Option<usize> {
    let n = line.trim().strip_prefix("ok ")?.parse::<usize>().ok()?;
    (n <= asked).then_some(n)
}

/// Asks the bridge named by the environment to import `rest` (the part of a chain the pool
/// lacks); how many leading keys of `rest` are present afterwards by `present` (the pool's own
/// index, so a bridge's answer is never taken on trust). 0 on any bridge failure or with no bridge;
/// only an error of `present` itself is an error.
pub fn extend<E>(rest: &[Key], present: impl Fn(Key) -> Result<bool, E>) -> Result<usize, E> {
    let said = match std::env::var(SOCKET_ENV) {
        Ok(path) if !path.is_empty() && !rest.is_empty() => {
            ask(&path, rest, timeout()).unwrap_or(0)
        }
        _ => 0,
    };
    for (i, &k) in rest[..said].iter().enumerate() {
        if !present(k)? {
            return Ok(i);
        }
    }
    Ok(said)
}

fn timeout() -> Duration {
    std::env::var(TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map_or(DEFAULT_TIMEOUT, Duration::from_millis)
}

fn ask(path: &str, rest: &[Key], limit: Duration) -> Option<usize> {
    let mut stream = UnixStream::connect(path).ok()?;
    stream.set_read_timeout(Some(limit)).ok()?;
    stream.set_write_timeout(Some(limit)).ok()?;
    stream.write_all(request_line(rest).as_bytes()).ok()?;
    let mut line = String::new();
    // An answer is a few bytes: a bridge that streams more is not one.
    BufReader::new(stream.take(64)).read_line(&mut line).ok()?;
    parse_answer(&line, rest.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn request_names_every_key_in_order() {
        let line = request_line(&[Key(1), Key(u128::MAX)]);
        assert_eq!(
            line,
            format!("import 2 {:032x} {}\n", 1u128, "f".repeat(32))
        );
    }

    #[test]
    fn answers_beyond_the_question_are_refused() {
        assert_eq!(parse_answer("ok 2\n", 3), Some(2));
        assert_eq!(parse_answer("ok 4\n", 3), None);
        assert_eq!(parse_answer("err store down\n", 3), None);
        assert_eq!(parse_answer("ok -1\n", 3), None);
    }

    #[test]
    fn no_listener_is_a_miss() {
        let dir = std::env::temp_dir().join(format!("cxlkv-crosspod-none-{}", std::process::id()));
        assert_eq!(ask(dir.to_str().unwrap(), &[Key(7)], DEFAULT_TIMEOUT), None);
    }

    #[test]
    fn a_silent_bridge_times_out_as_a_miss() {
        let path = std::env::temp_dir().join(format!("cxlkv-crosspod-mute-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let hold = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_millis(500));
            drop(s);
        });
        let t = std::time::Instant::now();
        assert_eq!(
            ask(
                path.to_str().unwrap(),
                &[Key(7)],
                Duration::from_millis(100)
            ),
            None
        );
        assert!(
            t.elapsed() < Duration::from_millis(450),
            "waited {:?}",
            t.elapsed()
        );
        hold.join().unwrap();
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_bridge_answer_is_read() {
        let path = std::env::temp_dir().join(format!("cxlkv-crosspod-ok-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let serve = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut r = BufReader::new(s);
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            r.get_mut().write_all(b"ok 1\n").unwrap();
            line
        });
        assert_eq!(
            ask(path.to_str().unwrap(), &[Key(7), Key(8)], DEFAULT_TIMEOUT),
            Some(1)
        );
        assert_eq!(serve.join().unwrap(), request_line(&[Key(7), Key(8)]));
        let _ = std::fs::remove_file(&path);
    }
}
