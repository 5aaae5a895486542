//! What both halves of every scenario share: timing helpers, flags in the pool, the SCORE_TOPK
//! request and its comparison with the host reference.

use cxlkv_kernels::{DType, GroupMode};
use cxlkv_runtime::ndp::{BlockSpec, ScoreRequest, TopK};
use cxlkv_runtime::{Key, Participant};
use std::time::{Duration, Instant};

/// KV heads and head dimension of the test blocks; queries per GQA group; k of SCORE_TOPK.
pub const HEADS: usize = 2;
pub const DIM: usize = 64;
pub const GROUP: usize = 4;
pub const TOPK: usize = 16;

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn flag(name: &str) -> Key {
    Key::from_bytes(format!("testbed/flag/{name}").as_bytes())
}

/// Waits until `key` is in the pool; returns its payload.
pub fn wait_key(p: &Participant, key: Key, timeout: Duration, what: &str) -> Res<Vec<u8>> {
    let t = Instant::now();
    loop {
        if let Some((payload, _)) = p.get(key)? {
            return Ok(payload);
        }
        if t.elapsed() > timeout {
            return Err(format!("timed out after {timeout:?} waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

pub fn request<'a>(queries: &'a [f32], blocks: &'a [BlockSpec], sequence: u64) -> ScoreRequest<'a> {
    ScoreRequest {
        queries,
        dim: DIM,
        blocks,
        sequence,
        layer: 0,
        kv_head: 0,
        dtype: DType::F16,
        k: TOPK,
        mode: GroupMode::GroupMax,
        prune: false,
        gather_values: true,
        scale: None,
        select: Default::default(),
    }
}

pub fn same_topk(a: &TopK, b: &TopK) -> Result<(), String> {
    if a.indices != b.indices {
        return Err(format!(
            "indices differ: {:?} vs {:?}",
            a.indices, b.indices
        ));
    }
    let bits = |s: &Vec<Vec<f32>>| s.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
    if bits(&a.scores) != bits(&b.scores) {
        return Err(format!("scores differ: {:?} vs {:?}", a.scores, b.scores));
    }
    if a.values != b.values {
        return Err("gathered values differ".into());
    }
    Ok(())
}
