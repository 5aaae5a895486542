//! The invariants of docs/COHERENCE.md, checked against the [`Model`] while a run goes and after
//! it: reads return a committed version, never an older one ([`check_read`]); a live host never
//! looks dead to a watcher ([`watch_predecessor`]); a hotlist read is one its host published, whole
//! ([`check_hotlist`]); at the end every host and then a fresh checker host read exactly what
//! every live owner committed and holds indexed ([`check_owners`], [`final_check`]), and owner
//! words count the claims and releases ([`final_check`]).

use crate::ctx::{Ctx, LEASE_NS};
use crate::host::SimHost;
use crate::model::{key_of, version_of, Model};
use crate::sync::lock;
use cxlkv_runtime::format::partition;
use cxlkv_runtime::hotness::read_hotlist;
use cxlkv_runtime::mem::SharedMemory;
use cxlkv_runtime::participant::participant_liveness;
use cxlkv_runtime::pool::{self, Pool};
use cxlkv_runtime::watch::Liveness;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Checks a get's result for key `(kh, ki)`: a miss, or exactly a version committed no earlier
/// than `lo` and started no later than the end of the get.
pub(crate) fn check_read(
    ctx: &Ctx,
    who: &str,
    kh: usize,
    ki: usize,
    lo: (u64, bool),
    bytes: Option<&[u8]>,
) {
    let mut m = lock(&ctx.model);
    let hi = m.started.get(&(kh, ki)).copied().unwrap_or(0);
    match bytes {
        None => m.log(format!("{who}: get ({kh},{ki}) miss")),
        Some(b) => match version_of(kh, ki, b) {
            None => m.fail(format!(
                "{who}: get ({kh},{ki}) returned {} bytes that no put wrote",
                b.len()
            )),
            Some(v) if v < lo.0 || (v == lo.0 && lo.1) || v > hi => m.fail(format!(
                "{who}: get ({kh},{ki}) returned version {v}, but version {} ({}) was committed before the get",
                lo.0,
                if lo.1 { "delete" } else { "put" }
            )),
            Some(v) => m.log(format!("{who}: get ({kh},{ki}) -> v{v}")),
        },
    }
}

/// Host `h` reads host `q`'s hotlist (the HotlistRead site). Fails the run on a list `q` never
/// published at or after the one it had completed when the read began (torn or stale), or on no
/// list at all while `q` published nothing during the read.
pub(crate) fn check_hotlist(ctx: &Ctx, pool: &Pool, h: usize, q: usize) -> pool::Result<()> {
    let excused = |m: &Model| m.out_of_watch(q);
    let (busy0, n0) = {
        let m = lock(&ctx.model);
        if excused(&m) {
            return Ok(());
        }
        (m.hl_busy[q], m.hotlists[q].len())
    };
    let got = read_hotlist(pool, q as u32)?;
    let mut m = lock(&ctx.model);
    if excused(&m) {
        return Ok(());
    }
    let (busy1, n1) = (m.hl_busy[q], m.hotlists[q].len());
    match got {
        Some((_, list)) => {
            let valid = (n0 == 0 && list.is_empty())
                || m.hotlists[q][n0.saturating_sub(1)..].contains(&list);
            if !valid {
                m.fail(format!(
                    "host {h}: read a hotlist of {} entries that host {q} never published at or after its publish #{n0}",
                    list.len()
                ));
            } else {
                m.log(format!("host {h}: hotlist of {q}: {} entries", list.len()));
            }
        }
        None if !busy0 && !busy1 && n0 == n1 => m.fail(format!(
            "host {h}: found no valid hotlist of host {q}, which was not publishing"
        )),
        None => m.log(format!("host {h}: hotlist of {q} mid-update")),
    }
    Ok(())
}

/// Host `h` judges its predecessor's liveness from memory (`participant_liveness`, the
/// LivenessRead site, through `h`'s own watch). Fails the run if a host looks dead (or its slot
/// free) although its last published heartbeat is within a lease of `h`'s monotonic clock: no
/// watch of `h` can have seen that heartbeat stand still for longer.
pub(crate) fn watch_predecessor(ctx: &Ctx, pool: &Pool, h: usize) -> pool::Result<()> {
    let n = ctx.hosts.len();
    let q = (h + n - 1) % n;
    let excused = |m: &Model| m.out_of_watch(q);
    let beat_at = {
        let m = lock(&ctx.model);
        if excused(&m) {
            return Ok(());
        }
        m.beat_at[q]
    };
    let seen = participant_liveness(pool, q as u32)?.liveness;
    let now = ctx.sched.now();
    let since = ctx.clocks[h].mono_between(beat_at, now);
    let mut m = lock(&ctx.model);
    if seen.reclaimable() && !excused(&m) && since <= LEASE_NS {
        let looks = if seen == Liveness::Free {
            "free"
        } else {
            "dead"
        };
        m.fail(format!(
            "host {h}: host {q} looks {looks}, but it beat {since} ns ago by host {h}'s clock (lease {LEASE_NS} ns)"
        ));
    } else {
        m.log(format!("host {h}: host {q} {}", seen.name()));
    }
    Ok(())
}

/// Every live owner's keys, read by `pool`'s host (`who`) at the end of its run: each hit is the
/// latest committed version, and the hits are exactly the blocks the owner holds indexed.
pub(crate) fn check_owners(ctx: &Ctx, who: &str, pool: &Pool) {
    if let Err(f) = read_owners(ctx, who, pool) {
        ctx.fail(f);
    }
}

/// After the run: the owner words, then a fresh host reads every key of every live owner's
/// partition ([`check_owners`]).
pub(crate) fn final_check(ctx: &Ctx) {
    let checker: Arc<dyn SharedMemory> = Arc::new(SimHost::new(ctx.backing.clone(), 0));
    let pool = match Pool::open(checker) {
        Ok(p) => p,
        Err(e) => return lock(&ctx.model).fail(format!("checker: open: {e}")),
    };
    if let Err(f) = check_owner_words(ctx, &pool) {
        return lock(&ctx.model).fail(f);
    }
    if let Err(f) = read_owners(ctx, "checker", &pool) {
        lock(&ctx.model).fail(f);
    }
}

/// Owner words: a generation for every claim (at least the completed ones, at most the started
/// ones: a claim in flight at a crash may or may not have landed), and released by a clean detach.
fn check_owner_words(ctx: &Ctx, pool: &Pool) -> Result<(), String> {
    let m = lock(&ctx.model);
    for (&p, &(started, done)) in &m.claims {
        let off = pool.partition_offset(p).expect("valid partition") + partition::OWNER;
        let word = pool
            .memory()
            .load_u64(off, Ordering::Acquire)
            .map_err(|e| format!("checker: owner word of partition {p}: {e}"))?;
        let (gen, holder) = (word >> 32, word & 0xffff_ffff);
        if gen < done || gen > started {
            return Err(format!(
                "checker: partition {p}'s owner generation is {gen} after {done} completed and {started} started claims"
            ));
        }
        if m.released.get(&p) == Some(&true) && holder != 0 {
            return Err(format!(
                "checker: partition {p} was released by its owner's detach, but memory names holder {holder}"
            ));
        }
    }
    Ok(())
}

/// Reads every key of every live owner through `pool`: a hit must be the latest committed version
/// (or, in a crashed owner's partition, the version it had in flight), and the hits of a partition
/// must number the blocks its owner holds indexed.
fn read_owners(ctx: &Ctx, who: &str, pool: &Pool) -> Result<(), String> {
    // A snapshot: the reads below are yield points, during which the model must stay unlocked.
    let (owners, committed, started, crashed) = {
        let m = lock(&ctx.model);
        (
            m.live_blocks.clone(),
            m.committed.clone(),
            m.started.clone(),
            m.crashed,
        )
    };
    for (&h, &n) in &owners {
        let mut hits = 0;
        for i in 0..ctx.keys {
            let (v, deleted) = committed.get(&(h, i)).copied().unwrap_or((0, false));
            let started = started.get(&(h, i)).copied().unwrap_or(0);
            let got = match pool.get(key_of(h, i)) {
                Ok(None) => continue,
                Ok(Some((b, _))) => version_of(h, i, &b),
                Err(e) => return Err(format!("{who}: final get ({h},{i}): {e}")),
            };
            hits += 1;
            let inflight = crashed == Some(h) && got == Some(started);
            if (got != Some(v) || deleted) && !inflight {
                return Err(format!(
                    "{who}: final read of ({h},{i}) finds {got:?}, latest committed is v{v} (deleted={deleted})"
                ));
            }
        }
        if hits != n {
            return Err(format!(
                "{who}: partition {h}'s owner holds {n} blocks indexed, this host reads {hits}"
            ));
        }
    }
    Ok(())
}
