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
