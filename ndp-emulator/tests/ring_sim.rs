//! The NDP queue pairs and registers on the non-coherence simulator (docs/COHERENCE.md): the host
//! (client) and the device each see the pool through a private write-back cache of 64-byte lines
//! (`cxlkv_sim::SimHost`), as a host and a Type-3 device's engine do without hardware
//! coherence. With every publish/acquire site present, every SCORE_TOPK — submitted in bursts that
//! wrap the rings many times — must be answered by the device, exactly as the host reference. With
//! any one NDP site removed (`coherence-teeth` builds) a run must break: a fallback (the client saw
//! no device, a full ring or no completion), or a wrong answer.
//!
//! This test binary holds one test: it removes sites process-wide, device threads included.

mod common;
use common::*;
use cxlkv_kernels::rng::SplitMix64;
use cxlkv_kernels::{DType, GroupMode};
use cxlkv_ndp::{Device, DeviceConfig};
use cxlkv_runtime::coherence::{set_drop_site_everywhere, Site};
use cxlkv_runtime::ndp::{NdpDevice, NdpOptions, NdpPath};
use cxlkv_runtime::{AttachOptions, CoherenceMode, Participant, Pool, PoolConfig, SharedMemory};
use cxlkv_sim::{SimBacking, SimHost};
use std::sync::Arc;
use std::time::Duration;

/// One run: a pool formatted by the host over fresh simulated memory, a device started on its own
/// view, `rounds` bursts of 1..=12 score commands. `Err` with the first thing that went wrong.
fn run(seed: u64, rounds: usize) -> Result<usize, String> {
    let cfg = PoolConfig {
        block_size: 64 << 10,
        participants: 3,
        coherence: CoherenceMode::Software,
        ..PoolConfig::default()
    };
    let size = 8 << 20;
    let backing = SimBacking::new(size, seed);
    let host = Arc::new(SimHost::new(backing.clone(), seed ^ 1));
    let dev_mem = Arc::new(SimHost::new(backing.clone(), seed ^ 2));
    // Both touched the memory before it was formatted: their caches hold stale lines of the
    // superblock, the participant table and the device area.
    let mut junk = vec![0u8; 1 << 20];
    let _ = host.read(0, &mut junk);
    let _ = dev_mem.read(0, &mut junk);

    let pool = Pool::create(host.clone(), &cfg).map_err(|e| format!("create: {e}"))?;
    let opts = AttachOptions {
        heartbeat: false,
        own_partition: true,
    };
    let p = Arc::new(Participant::attach_slot(&pool, 0, opts).map_err(|e| format!("attach: {e}"))?);
    let (dim, heads, tokens) = (32, 2, 300);
    let (k, v) = random_kv(seed, heads, tokens, dim, DType::F16);
    let s = store(&p, &k, &v, heads, tokens, dim, DType::F16, 100, 7, 1);

    let dev_pool = Pool::open(dev_mem.clone()).map_err(|e| format!("device open: {e}"))?;
    let dev = Device::start(
        dev_pool,
        DeviceConfig {
            workers: 1,
            ..DeviceConfig::default()
        },
    )
    .map_err(|e| format!("device start: {e}"))?;
    let mut ndp = NdpDevice::open(
        p.clone(),
        NdpOptions {
            timeout: Duration::from_secs(2),
            stale_after: Duration::from_secs(2),
            // One staging block (arguments and results) per command of the deepest burst.
            staging: 12,
            ..NdpOptions::default()
        },
    )
    .map_err(|e| format!("client open: {e}"))?;
    let mut rng = SplitMix64::new(seed ^ 0xa5);
    let mut answered = 0;
    let result = (|| {
        for round in 0..rounds {
            // Bursts up to 12 deep on 16-entry rings: the tails wrap, and the credits (heads)
            // decide whether there is room.
            let burst = 1 + (rng.next_u64() % 12) as usize;
            let mut asked = Vec::new();
            let mut tickets = Vec::new();
            for _ in 0..burst {
                let g = 1 + (rng.next_u64() % 3) as usize;
                let kk = 1 + (rng.next_u64() % 40) as usize;
                let h = (rng.next_u64() % heads as u64) as u32;
                let q = rng.normal_vec(g * dim);
                let req = request(&s, h, &q, kk, GroupMode::PerQuery, false, false);
                let t = ndp
                    .submit_score(&req)
                    .map_err(|e| format!("round {round}: submit: {e}"))?;
                tickets.push(t);
                asked.push((h, q, kk));
            }
            for (t, (h, q, kk)) in tickets.into_iter().zip(asked) {
                let got = ndp
                    .wait(t)
                    .map_err(|e| format!("round {round}: wait: {e}"))?;
                if got.stats.path != Some(NdpPath::Device) {
                    return Err(format!(
                        "round {round}: answered by {:?}, not the live device",
                        got.stats.path
                    ));
                }
                let want = reference(&s, h as usize, &q, kk, GroupMode::PerQuery);
                if hits_of(&got) != want {
                    return Err(format!(
                        "round {round}: top-{kk} differs from the reference"
                    ));
                }
                answered += 1;
            }
        }
        Ok(answered)
    })();
    drop(ndp);
    dev.stop();
    result
}

#[test]
fn rings_are_coherent_on_the_simulator_and_every_ndp_site_is_needed() {
    let seeds: u64 = std::env::var("CXLKV_RING_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    for seed in 0..seeds {
        let n = run(seed, 12).unwrap_or_else(|e| panic!("seed {seed}, every site present: {e}"));
        println!("seed {seed}: {n} commands answered by the device, all exact");
    }
    if !set_drop_site_everywhere(None) {
        println!("teeth skipped: this build lacks the coherence-teeth feature");
        return;
    }
    println!("| site | breaking seed | what broke |");
    let mut missed = Vec::new();
    for site in Site::NDP {
        set_drop_site_everywhere(Some(site));
        let broke = (0..seeds).find_map(|seed| run(seed, 12).err().map(|e| (seed, e)));
        set_drop_site_everywhere(None);
        match broke {
            Some((seed, e)) => println!("| {} | {seed} | {e} |", site.name()),
            None => {
                println!("| {} | NOT FOUND in {seeds} seeds |", site.name());
                missed.push(site.name());
            }
        }
    }
    assert!(
        missed.is_empty(),
        "NDP sites whose removal nothing detected: {missed:?}"
    );
}
