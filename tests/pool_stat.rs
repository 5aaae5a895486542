//! `cxlkv pool stat` reports liveness honestly: a process that looks once cannot tell a live holder
//! from a dead one (`?`), a watch shorter than the lease tells the live (`yes`), and only a watch
//! longer than the lease calls a holder whose heartbeat stood still `DEAD`.

use cxlkv::runtime::region::{Backend, Region, RegionOptions};
use cxlkv::runtime::{AttachOptions, Participant, Pool, PoolConfig};
use std::process::Command;
use std::time::Duration;

/// The `live` column of each participant row of `cxlkv pool stat SPEC ARGS`, by slot.
fn liveness(spec: &str, args: &[&str]) -> Vec<(u32, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_cxlkv"))
        .args(["pool", "stat", spec])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    let rows: Vec<(u32, String)> = text
        .lines()
        .skip_while(|l| !l.starts_with("participants"))
        .skip(2)
        .take_while(|l| !l.starts_with("partitions"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].parse().unwrap(), f[1].to_string())
        })
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    rows
}

#[test]
fn pool_stat_watches_before_it_judges() {
    let name = format!("cxlkv-stat-{}", std::process::id());
    let spec = format!("shm:{name}");
    let backend: Backend = spec.parse().unwrap();
    let cfg = PoolConfig {
        block_size: 4096,
        participants: 3,
        lease: Duration::from_millis(400),
        ..Default::default()
    };
    let pool = Pool::create_on(&backend, 16 << 20, &cfg, &RegionOptions::default()).unwrap();
    let live = pool.attach().unwrap(); // beats every 50 ms
    let hung = Participant::attach(
        &pool,
        AttachOptions {
            heartbeat: false,
            ..Default::default()
        },
    )
    .unwrap();
    let (l, h) = (live.id(), hung.id());
    let col = |rows: &[(u32, String)], id| rows.iter().find(|r| r.0 == id).unwrap().1.clone();

    let once = liveness(&spec, &["--watch-ms", "0"]);
    assert_eq!((col(&once, l), col(&once, h)), ("?".into(), "?".into()));
    let half = liveness(&spec, &["--watch-ms", "200"]);
    assert_eq!((col(&half, l), col(&half, h)), ("yes".into(), "?".into()));
    let full = liveness(&spec, &["--watch-ms", "600"]);
    assert_eq!(
        (col(&full, l), col(&full, h)),
        ("yes".into(), "DEAD".into())
    );

    drop(live);
    std::mem::forget(hung);
    drop(pool);
    Region::unlink(&backend).unwrap();
}

/// The samples of a Prometheus text exposition by `name{labels}`, after checking its shape: every
/// sample's family has a `# TYPE` line before it, and the text ends with `# EOF`.
fn parse_exposition(text: &str) -> std::collections::HashMap<String, f64> {
    let mut types = std::collections::HashMap::new();
    let mut samples = std::collections::HashMap::new();
    assert_eq!(text.lines().last(), Some("# EOF"), "{text}");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            types.insert(name.to_string(), kind.to_string());
        } else if !line.starts_with('#') {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let name = series.split('{').next().unwrap();
            let family = name.strip_suffix("_total").unwrap_or(name);
            let kind = types
                .get(family)
                .unwrap_or_else(|| panic!("no # TYPE before {line}"));
            assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
            samples.insert(series.to_string(), value.parse::<f64>().unwrap());
        }
    }
    samples
}

fn prometheus(spec: &str) -> std::collections::HashMap<String, f64> {
    let out = Command::new(env!("CARGO_BIN_EXE_cxlkv"))
        .args(["pool", "stat", spec, "--watch-ms", "0", "--prometheus"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    parse_exposition(&text)
}

#[test]
fn pool_stat_prometheus_counts_known_operations() {
    let name = format!("cxlkv-stat-prom-{}", std::process::id());
    let spec = format!("shm:{name}");
    let backend: Backend = spec.parse().unwrap();
    let cfg = PoolConfig {
        block_size: 4096,
        participants: 2,
        pins_per_participant: 2,
        ..Default::default()
    };
    let pool = Pool::create_on(&backend, 16 << 20, &cfg, &RegionOptions::default()).unwrap();
    let me = pool.attach().unwrap();
    let (id, pid, part) = (me.id(), std::process::id(), me.partition().unwrap());
    let who = format!("{{participant=\"{id}\",pid=\"{pid}\"}}");
    let series = |m: &str| format!("cxlkv_pool_participant_{m}{who}");
    let partition = |m: &str| format!("cxlkv_pool_partition_{m}{{partition=\"{part}\"}}");

    let before = prometheus(&spec);
    for m in [
        "puts_total",
        "hits_total",
        "misses_total",
        "pins_total",
        "bytes_in_total",
        "bytes_out_total",
        "fallbacks_total",
        "pin_full_total",
    ] {
        assert_eq!(before[&series(m)], 0.0, "{m}");
    }
    assert_eq!(before[&partition("blocks")], 0.0);
    let capacity = before[&partition("capacity_blocks")];
    assert!(capacity > 0.0);

    let key = |i: u64| cxlkv::runtime::Key::from_parts(i, 7);
    let sizes = [100usize, 250, 1000];
    for (i, n) in sizes.iter().enumerate() {
        me.put(key(i as u64), &vec![i as u8; *n]).unwrap();
    }
    assert!(me.get(key(0)).unwrap().is_some());
    assert!(me.get(key(1)).unwrap().is_some());
    assert!(me.get(key(9)).unwrap().is_none());
    // The pool's pin table holds two: the third pin is refused and counted.
    let held = [me.pin(key(2)).unwrap(), me.pin(key(2)).unwrap()];
    assert!(me.pin(key(2)).is_err());
    drop(held);

    let after = prometheus(&spec);
    assert_eq!(after[&series("puts_total")], 3.0);
    assert_eq!(after[&series("hits_total")], 2.0);
    assert_eq!(after[&series("misses_total")], 1.0);
    assert_eq!(after[&series("pins_total")], 2.0);
    assert_eq!(after[&series("pin_full_total")], 1.0);
    // Payload bytes, as another process reads them from the slot: every put, the gets that hit.
    assert_eq!(after[&series("bytes_in_total")], 1350.0);
    assert_eq!(after[&series("bytes_out_total")], 350.0);
    assert_eq!(after[&series("fallbacks_total")], 0.0);
    // The text table has the same counters as columns (puts .. pins, bytes in/out, fallbacks,
    // pin full).
    let out = Command::new(env!("CARGO_BIN_EXE_cxlkv"))
        .args(["pool", "stat", &spec, "--watch-ms", "0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("bytes in") && text.contains("pin full"),
        "{text}"
    );
    let row: Vec<&str> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() == 17 && f[0] == id.to_string() && f[2] == pid.to_string())
        .unwrap_or_else(|| panic!("no row for participant {id}: {text}"));
    assert_eq!(row[6..].join(" "), "3 2 1 0 0 0 2 1350 350 0 1", "{text}");
    assert_eq!(after[&partition("blocks")], 3.0);
    assert_eq!(after[&partition("occupancy_ratio")], 3.0 / capacity);
    assert_eq!(after[&series("occupancy_ratio")], 3.0 / capacity);

    drop(me);
    drop(pool);
    Region::unlink(&backend).unwrap();
}
