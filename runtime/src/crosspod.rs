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
//!
//! Write-back (the bridge's `--publish on-eviction` policy): a participant about to evict a
//! committed block (or multi-block object, under its manifest's key) calls [`write_back`] while it
//! is still indexed, under its owner lock, so its space cannot be reused yet. The request names
//! the key; the bridge pins the block (the pin keeps it from reuse even past our timeout) and
//! publishes it from pool memory, or reads the object whole and publishes that, and answers. The
//! eviction waits at most [`WRITE_BACK_TIMEOUT`], connecting included; past it, or with no bridge,
//! the block is dropped as without the tier; the eviction counts the result in the process
//! metrics (`cxlkv_crosspod_write_backs_total`). After a timeout evictions do not ask for
//! [`QUIET_AFTER_TIMEOUT`], so a stuck bridge costs one wait per interval, not one per put.
//!
//! Write-through (the bridge's `--publish on-put` policy): every put and commit of a process with a
//! bridge configured (a multi-block object under its own key) hands its key to [`on_put`], which queues it and returns at
//! once; one background thread per process sends what is queued as one `publish` request and the
//! bridge publishes the blocks from pool memory. The put never waits for it. A full queue, a dead
//! or slow bridge, or one whose policy does not publish on put (`off`) drops the keys, counted in
//! `cxlkv_crosspod_publishes_total{result}`; [`flush_publishes`] (called at detach) waits a short
//! while for what is queued, so a process that puts and exits still publishes.

use crate::key::Key;
use socket2::{Domain, SockAddr, Socket, Type};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The environment variable naming the bridge's Unix socket.
pub const SOCKET_ENV: &str = "CXLKV_CROSSPOD_SOCKET";
/// The environment variable overriding [`DEFAULT_TIMEOUT`] (milliseconds).
pub const TIMEOUT_ENV: &str = "CXLKV_CROSSPOD_TIMEOUT_MS";
/// How long a lookup waits for the bridge before it counts the rest of the chain as a miss.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(2000);

pub use crate::metrics::crosspod::WriteBack;

/// The environment variable overriding [`WRITE_BACK_TIMEOUT`] (milliseconds).
pub const WRITE_BACK_TIMEOUT_ENV: &str = "CXLKV_CROSSPOD_WRITE_BACK_MS";
/// How long an eviction waits for the bridge to publish its victim, connecting included. It is
/// spent under the evicting participant's owner lock, so it is short.
pub const WRITE_BACK_TIMEOUT: Duration = Duration::from_millis(100);
/// After a write-back timed out, evictions of this process do not ask the bridge for this long.
pub const QUIET_AFTER_TIMEOUT: Duration = Duration::from_secs(1);
/// After the bridge said its policy does not write back, evictions do not ask for this long.
const QUIET_AFTER_OFF: Duration = Duration::from_secs(10);

/// The request line for `rest`: `import <count> <key>...`, keys as 32 hex digits.
pub fn request_line(rest: &[Key]) -> String {
    request("import", rest)
}

/// The request line `<verb> <count> <key>...`, keys as 32 hex digits.
fn request(verb: &str, keys: &[Key]) -> String {
    let mut line = format!("{verb} {}", keys.len());
    for k in keys {
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

/// Offers the block under `key`, about to be evicted, to the bridge named by the environment for
/// write-back (see the module documentation); `None` with no bridge configured. Whatever the
/// result, the caller evicts the block afterwards: this only decides whether a copy survives in
/// the store. The caller counts the result in the process metrics.
pub fn write_back(key: Key) -> Option<WriteBack> {
    let path = std::env::var(SOCKET_ENV).ok().filter(|p| !p.is_empty())?;
    let now = clock_ms();
    let result = match WRITE_BACK_QUIET.get(now) {
        Some(why) => why,
        None => {
            let limit = env_ms(WRITE_BACK_TIMEOUT_ENV, WRITE_BACK_TIMEOUT);
            let r = offer(&path, key, limit);
            match r {
                WriteBack::Timeout => {
                    WRITE_BACK_QUIET.set(now, QUIET_AFTER_TIMEOUT, WriteBack::Quiet)
                }
                WriteBack::Off => WRITE_BACK_QUIET.set(now, QUIET_AFTER_OFF, WriteBack::Off),
                _ => {}
            }
            r
        }
    };
    Some(result)
}

/// The write-back request for `key` and how its answer reads: `ok 1` published, `ok 0` not, `off`
/// the bridge's policy does not write back.
fn offer(path: &str, key: Key, limit: Duration) -> WriteBack {
    offer_keys(path, "writeback", &[key], limit)
        .into_iter()
        .find(|&(_, n)| n > 0)
        .map_or(WriteBack::NotPublished, |(r, _)| r)
}

/// Sends `request` and reads one answer line of at most 64 bytes (an answer is a few bytes: a
/// bridge that streams more is not one), all before `deadline`.
fn read_answer(
    stream: &mut UnixStream,
    request: &[u8],
    deadline: Instant,
) -> std::io::Result<String> {
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::TimedOut))
    };
    stream.set_write_timeout(Some(left()?))?;
    stream.write_all(request)?;
    let mut buf = Vec::with_capacity(64);
    let mut part = [0u8; 64];
    while !buf.ends_with(b"\n") {
        stream.set_read_timeout(Some(left()?))?;
        let n = stream.read(&mut part[..64 - buf.len()])?;
        if n == 0 || buf.len() + n >= 64 && !part[..n].contains(&b'\n') {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
        buf.extend_from_slice(&part[..n]);
    }
    String::from_utf8(buf).map_err(|_| std::io::ErrorKind::InvalidData.into())
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Asking the bridge is paused in this process until a moment (milliseconds of [`clock_ms`]), for
/// a reason counted in place of each request it skips: one for write-back ([`WRITE_BACK_QUIET`]), one
/// for write-through ([`PUBLISH_QUIET`]).
struct QuietState {
    until_ms: AtomicU64,
    why: AtomicU8,
}

impl QuietState {
    const fn new() -> Self {
        QuietState {
            until_ms: AtomicU64::new(0),
            why: AtomicU8::new(0),
        }
    }

    fn get(&self, now: u64) -> Option<WriteBack> {
        if now >= self.until_ms.load(Ordering::Relaxed) {
            return None;
        }
        Some(WriteBack::ALL[usize::from(self.why.load(Ordering::Relaxed))])
    }

    fn set(&self, now: u64, span: Duration, why: WriteBack) {
        self.why.store(why as u8, Ordering::Relaxed);
        let span = u64::try_from(span.as_millis()).unwrap_or(u64::MAX);
        self.until_ms
            .store(now.saturating_add(span), Ordering::Relaxed);
    }
}

/// Write-back's pause.
static WRITE_BACK_QUIET: QuietState = QuietState::new();
/// Write-through's pause.
static PUBLISH_QUIET: QuietState = QuietState::new();

/// Keys the write-through queue holds at most; past it a put's key is dropped (counted).
pub const PUBLISH_QUEUE: usize = 4096;
/// Keys one `publish` request carries at most (the bridge's own limit).
const PUBLISH_BATCH: usize = 512;
/// How long [`flush_publishes`] waits at detach for the queue to drain.
pub const FLUSH_LIMIT: Duration = Duration::from_secs(2);

/// The process's write-through queue and its thread, made at the first put with a bridge.
struct Publisher {
    tx: SyncSender<Key>,
    /// Keys queued and not yet answered for.
    pending: Arc<(Mutex<usize>, Condvar)>,
}

fn publisher() -> Option<&'static Publisher> {
    static PUBLISHER: OnceLock<Option<Publisher>> = OnceLock::new();
    PUBLISHER
        .get_or_init(|| {
            let path = std::env::var(SOCKET_ENV).ok().filter(|p| !p.is_empty())?;
            let (tx, rx) = std::sync::mpsc::sync_channel(PUBLISH_QUEUE);
            let pending = Arc::new((Mutex::new(0usize), Condvar::new()));
            let done = pending.clone();
            std::thread::Builder::new()
                .name("cxlkv-crosspod-publish".into())
                .spawn(move || publish_loop(&path, &rx, &done))
                .ok()?;
            Some(Publisher { tx, pending })
        })
        .as_ref()
}

/// Hands `key`, just committed (a block, or a multi-block object), to the bridge for publishing
/// (write-through; see the module documentation), and returns at once. Nothing without a bridge configured. The
/// result is counted in the process metrics when the bridge answers.
pub fn on_put(key: Key) {
    let Some(p) = publisher() else { return };
    if let Some(why) = PUBLISH_QUIET.get(clock_ms()) {
        crate::metrics::crosspod::record_publish(why, 1);
        return;
    }
    let (count, _) = &*p.pending;
    *count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    if p.tx.try_send(key).is_err() {
        settle(&p.pending, 1);
        crate::metrics::crosspod::record_publish(WriteBack::Dropped, 1);
    }
}

/// Waits at most `limit` for the keys [`on_put`] queued to be answered for; whether none is left.
pub fn flush_publishes(limit: Duration) -> bool {
    let Some(p) = publisher() else { return true };
    let (count, cv) = &*p.pending;
    let guard = count.lock().unwrap_or_else(|e| e.into_inner());
    let (left, _) = cv
        .wait_timeout_while(guard, limit, |n| *n > 0)
        .unwrap_or_else(|e| e.into_inner());
    *left == 0
}

fn settle(pending: &(Mutex<usize>, Condvar), n: usize) {
    let (count, cv) = pending;
    let mut c = count.lock().unwrap_or_else(|e| e.into_inner());
    *c = c.saturating_sub(n);
    cv.notify_all();
}

/// The write-through thread: each wake-up sends everything queued (at most
/// [`PUBLISH_BATCH`] keys a request) and counts the bridge's answer.
fn publish_loop(path: &str, rx: &Receiver<Key>, pending: &(Mutex<usize>, Condvar)) {
    while let Ok(first) = rx.recv() {
        let mut keys = vec![first];
        while keys.len() < PUBLISH_BATCH {
            match rx.try_recv() {
                Ok(k) => keys.push(k),
                Err(_) => break,
            }
        }
        let now = clock_ms();
        let counts = match PUBLISH_QUIET.get(now) {
            Some(why) => vec![(why, keys.len())],
            None => {
                let counts = offer_keys(path, "publish", &keys, timeout());
                match counts.iter().find(|(r, _)| *r != WriteBack::Published) {
                    Some((WriteBack::Off, _)) => {
                        PUBLISH_QUIET.set(now, QUIET_AFTER_OFF, WriteBack::Off)
                    }
                    Some((WriteBack::Timeout | WriteBack::NoBridge, _)) => {
                        PUBLISH_QUIET.set(now, QUIET_AFTER_TIMEOUT, WriteBack::Quiet)
                    }
                    _ => {}
                }
                counts
            }
        };
        for (r, n) in counts {
            crate::metrics::crosspod::record_publish(r, n as u64);
        }
        settle(pending, keys.len());
    }
}

/// One `verb` request (`publish` or `writeback`) for `keys` and how its answer reads, as counts by
/// result: `ok N` published the leading N (the rest not), `off` the bridge's policy does not serve
/// the request.
fn offer_keys(path: &str, verb: &str, keys: &[Key], limit: Duration) -> Vec<(WriteBack, usize)> {
    let all = |r| vec![(r, keys.len())];
    let deadline = Instant::now() + limit;
    let mut stream = match connect_within(path, limit) {
        Ok(s) => s,
        Err(e) if is_timeout(&e) => return all(WriteBack::Timeout),
        Err(_) => return all(WriteBack::NoBridge),
    };
    let line = request(verb, keys);
    match read_answer(&mut stream, line.as_bytes(), deadline) {
        Err(e) if is_timeout(&e) => all(WriteBack::Timeout),
        Err(_) => all(WriteBack::BadAnswer),
        Ok(a) if a.trim() == "off" => all(WriteBack::Off),
        Ok(a) => match parse_answer(&a, keys.len()) {
            Some(n) => vec![
                (WriteBack::Published, n),
                (WriteBack::NotPublished, keys.len() - n),
            ],
            None => all(WriteBack::BadAnswer),
        },
    }
}

/// Milliseconds since this process first asked, from a monotonic clock.
fn clock_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let ms = START.get_or_init(Instant::now).elapsed().as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

fn timeout() -> Duration {
    env_ms(TIMEOUT_ENV, DEFAULT_TIMEOUT)
}

fn env_ms(var: &str, default: Duration) -> Duration {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map_or(default, Duration::from_millis)
}

fn ask(path: &str, rest: &[Key], limit: Duration) -> Option<usize> {
    let mut stream = connect_within(path, limit).ok()?;
    stream.set_read_timeout(Some(limit)).ok()?;
    stream.set_write_timeout(Some(limit)).ok()?;
    stream.write_all(request_line(rest).as_bytes()).ok()?;
    let mut line = String::new();
    // An answer is a few bytes: a bridge that streams more is not one.
    BufReader::new(stream.take(64)).read_line(&mut line).ok()?;
    parse_answer(&line, rest.len())
}

/// Connects to the Unix socket at `path`, waiting at most `limit` (at least 1 ms) for a bridge
/// whose queue of unaccepted connections is full (a stopped or stuck bridge): the connect of
/// `UnixStream` would wait without end there. The limit is the socket's send timeout, which Linux
/// applies to a Unix stream connect; expired, the connect fails with `EAGAIN` (a timeout).
fn connect_within(path: &str, limit: Duration) -> std::io::Result<UnixStream> {
    let addr = SockAddr::unix(path)?;
    // Close-on-exec is set by `Socket::new` on Linux.
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    socket.set_write_timeout(Some(limit.max(Duration::from_millis(1))))?;
    socket.connect(&addr)?;
    Ok(UnixStream::from(std::os::fd::OwnedFd::from(socket)))
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
        let (path, serve) = bridge("ok", b"ok 1\n", Duration::ZERO);
        assert_eq!(ask(&path, &[Key(7), Key(8)], DEFAULT_TIMEOUT), Some(1));
        assert_eq!(serve.join().unwrap(), request_line(&[Key(7), Key(8)]));
        let _ = std::fs::remove_file(&path);
    }

    /// A one-request bridge on a fresh socket that answers `answer` (or stays silent for
    /// `hold`); returns the socket path and the thread, which yields the request it read.
    fn bridge(
        tag: &str,
        answer: &'static [u8],
        hold: Duration,
    ) -> (String, std::thread::JoinHandle<String>) {
        let path =
            std::env::temp_dir().join(format!("cxlkv-crosspod-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let serve = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut r = BufReader::new(s);
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            std::thread::sleep(hold);
            let _ = r.get_mut().write_all(answer);
            line
        });
        (path.to_str().unwrap().to_string(), serve)
    }

    #[test]
    fn write_back_reads_each_answer() {
        let cases: [(&str, &'static [u8], WriteBack); 5] = [
            ("wb-ok", b"ok 1\n", WriteBack::Published),
            ("wb-none", b"ok 0\n", WriteBack::NotPublished),
            ("wb-off", b"off\n", WriteBack::Off),
            ("wb-many", b"ok 2\n", WriteBack::BadAnswer),
            ("wb-err", b"err no\n", WriteBack::BadAnswer),
        ];
        for (tag, answer, want) in cases {
            let (path, serve) = bridge(tag, answer, Duration::ZERO);
            assert_eq!(offer(&path, Key(9), WRITE_BACK_TIMEOUT), want, "{tag}");
            assert_eq!(serve.join().unwrap(), format!("writeback 1 {:032x}\n", 9));
            let _ = std::fs::remove_file(&path);
        }
    }

    #[test]
    fn publish_reads_each_answer() {
        use WriteBack::*;
        type Case = (&'static str, &'static [u8], Vec<(WriteBack, usize)>);
        let cases: [Case; 5] = [
            ("pub-ok", b"ok 2\n", vec![(Published, 2), (NotPublished, 0)]),
            (
                "pub-part",
                b"ok 1\n",
                vec![(Published, 1), (NotPublished, 1)],
            ),
            ("pub-off", b"off\n", vec![(Off, 2)]),
            ("pub-many", b"ok 3\n", vec![(BadAnswer, 2)]),
            ("pub-err", b"err no\n", vec![(BadAnswer, 2)]),
        ];
        for (tag, answer, want) in cases {
            let (path, serve) = bridge(tag, answer, Duration::ZERO);
            assert_eq!(
                offer_keys(&path, "publish", &[Key(7), Key(9)], DEFAULT_TIMEOUT),
                want,
                "{tag}"
            );
            assert_eq!(
                serve.join().unwrap(),
                format!("publish 2 {:032x} {:032x}\n", 7, 9)
            );
            let _ = std::fs::remove_file(&path);
        }
        assert_eq!(
            offer_keys(
                "/nonexistent/cxlkv-bridge",
                "publish",
                &[Key(1)],
                DEFAULT_TIMEOUT
            ),
            vec![(NoBridge, 1)]
        );
    }

    #[test]
    fn a_slow_or_absent_bridge_does_not_hold_an_eviction() {
        let (path, serve) = bridge("wb-slow", b"ok 1\n", Duration::from_millis(600));
        let t = Instant::now();
        assert_eq!(
            offer(&path, Key(9), Duration::from_millis(100)),
            WriteBack::Timeout
        );
        assert!(
            t.elapsed() < Duration::from_millis(450),
            "{:?}",
            t.elapsed()
        );
        serve.join().unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            offer(&path, Key(9), WRITE_BACK_TIMEOUT),
            WriteBack::NoBridge
        );
    }

    #[test]
    fn a_bridge_that_accepts_nothing_times_out_on_connect() {
        let path = std::env::temp_dir().join(format!("cxlkv-crosspod-full-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        // A backlog of 0: the queue of unaccepted connections fills after one.
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
        socket.bind(&SockAddr::unix(&path).unwrap()).unwrap();
        socket.listen(0).unwrap();
        let listener = UnixListener::from(std::os::fd::OwnedFd::from(socket));
        // Fill its queue of unaccepted connections.
        let mut held = Vec::new();
        let t = loop {
            let t = Instant::now();
            match connect_within(path.to_str().unwrap(), Duration::from_millis(100)) {
                Ok(s) => held.push(s),
                Err(e) => break (t, e),
            }
            assert!(held.len() < 64, "the queue never filled");
        };
        assert!(is_timeout(&t.1), "{:?}", t.1);
        assert!(
            t.0.elapsed() < Duration::from_millis(450),
            "{:?}",
            t.0.elapsed()
        );
        drop((held, listener));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn quiet_skips_offers_until_it_ends() {
        WRITE_BACK_QUIET.set(1_000, QUIET_AFTER_TIMEOUT, WriteBack::Quiet);
        assert_eq!(WRITE_BACK_QUIET.get(1_500), Some(WriteBack::Quiet));
        assert_eq!(WRITE_BACK_QUIET.get(2_000), None);
        WRITE_BACK_QUIET.set(1_000, QUIET_AFTER_OFF, WriteBack::Off);
        assert_eq!(WRITE_BACK_QUIET.get(10_999), Some(WriteBack::Off));
        assert_eq!(WRITE_BACK_QUIET.get(11_000), None);
        WRITE_BACK_QUIET.set(0, Duration::ZERO, WriteBack::Quiet);
    }
}
