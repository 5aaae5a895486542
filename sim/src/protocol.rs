//! The life of one simulated host in a run, over the real pool code ([`Pool`], [`Participant`]).
//!
//! A host's thread ([`run_host`]) waits for the baton, opens the pool through its own cache and
//! clock, attaches to its slot and claims its partition ([`attach`]), runs its operations
//! ([`HostRun::operate`], turn by turn: see [`crate::steps`]), waits for the others and reads
//! every live owner's keys ([`HostRun::finish`]), and detaches ([`detach`]). A host may instead
//! crash at a memory step: the memory model unwinds its thread and [`crashed`] records it, for its
//! successor to take over.

use crate::ctx::Ctx;
use crate::host::SimCrash;
use crate::sched::{SimStuck, STUCK_AFTER_LEASES};
use crate::steps::{attach_options, claim_done, claim_started, fail, Halt, HostRun};
use crate::sync::lock;
use cxlkv_runtime::coherence::set_drop_site;
use cxlkv_runtime::mem::SharedMemory;
use cxlkv_runtime::participant::Participant;
use cxlkv_runtime::pool::Pool;
use cxlkv_runtime::watch::set_liveness_rule;
use std::sync::Arc;

/// The thread of host `h`: waits for the baton, runs [`host_main`], and records how it ended (a
/// simulated crash, a stuck run, a panic).
pub(crate) fn run_host(ctx: &Ctx, h: usize) {
    set_drop_site(ctx.site);
    set_liveness_rule(ctx.rule);
    ctx.sched.wait_turn(h);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| host_main(ctx, h)));
    match r {
        Ok(()) => {}
        Err(p) if p.is::<SimStuck>() => ctx.fail(format!(
            "no progress: the run did not finish within {STUCK_AFTER_LEASES} leases of simulated time (a livelock, or a wait that never ends)"
        )),
        Err(p) if p.is::<SimCrash>() => crashed(ctx, h),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            ctx.fail(format!("host {h} panicked: {msg}"));
        }
    }
    lock(&ctx.model).finished[h] = true;
    ctx.sched.finish(h);
}

/// The crash step: host `h`'s memory dropped its unpublished lines and unwound it. Its heartbeat
/// stands still from here on, for its successor's watch to see.
fn crashed(ctx: &Ctx, h: usize) {
    let mut m = lock(&ctx.model);
    m.crashed = Some(h);
    m.done_ops[h] = true;
    m.log(format!("host {h}: CRASH (unpublished lines dropped)"));
    ctx.sched.unpark_all();
}

/// Host `h`'s run: attach, operations, the end-of-run barrier and check, detach.
fn host_main(ctx: &Ctx, h: usize) {
    let Ok((pool, me, attach_time)) = attach(ctx, h) else {
        return;
    };
    let mut run = HostRun::new(ctx, h, &pool, &me, attach_time);
    if run.operate().is_err() {
        return;
    }
    let Ok((adopted, owner)) = run.finish() else {
        return;
    };
    detach(ctx, h, me, adopted, owner);
}

/// The attach step: host `h` opens the pool through its cache and clock and claims its slot and
/// partition. Returns the pool, the participant and the time before the attach (its first
/// heartbeat is no older).
fn attach(ctx: &Ctx, h: usize) -> Result<(Pool, Participant, u64), Halt> {
    let who = format!("host {h}");
    let mem: Arc<dyn SharedMemory> = ctx.hosts[h].clone();
    let pool = Pool::open_with_clock(mem, ctx.clocks[h].clone())
        .map_err(|e| fail(ctx, format!("{who}: open: {e}")))?;
    let attach_time = ctx.sched.now();
    claim_started(ctx, h as u32);
    let me = Participant::attach_slot(&pool, h as u32, attach_options())
        .map_err(|e| fail(ctx, format!("{who}: attach: {e}")))?;
    claim_done(ctx, h as u32, Some((h, attach_time)));
    if me.partition() != Some(h as u32) {
        return Err(fail(ctx, format!("{who}: attached without its partition")));
    }
    Ok((pool, me, attach_time))
}

/// The detach step: a participant that is not presumed dead releases its partition (owner word
/// holder 0); the final check reads that from memory. Each flag is taken right before its detach:
/// a detach is memory steps, during which the simulated clock runs on and this host's own lease
/// may lapse before the next one.
fn detach(
    ctx: &Ctx,
    h: usize,
    me: Participant,
    adopted: Option<(Participant, usize)>,
    owner: bool,
) {
    lock(&ctx.model).leaving[h] = true;
    if let Some((a, c)) = adopted {
        let releases = !a.presumed_dead();
        lock(&ctx.model).released.insert(c as u32, releases);
        drop(a);
    }
    if owner {
        let releases = !me.presumed_dead();
        lock(&ctx.model).released.insert(h as u32, releases);
    }
    drop(me);
}
