//! Liveness without a shared clock: an observer's watch of heartbeat counters.
//!
//! A slot's holder advances the heartbeat counter of its slot every [`beat_period_ns`]
//! (docs/FORMAT.md §7); the value carries no time. An observer — every [`crate::Pool`] handle keeps
//! one [`Watch`], shared by its clones and the participants attached through it — remembers per
//! slot the holder it saw (token and generation), the counter value, and the time it first saw that
//! value on its **own** monotonic clock ([`crate::clock::Clock::monotonic_ns`]). The rule:
//!
//! - a free slot (token 0) is [`Liveness::Free`];
//! - the first look at a holder, or a look that finds another holder, starts the watch:
//!   [`Liveness::Unknown`] (never dead on a first look);
//! - a counter that moved since the last look: [`Liveness::Live`], and the watch restarts from now;
//! - the same holder with the same counter for **more than a lease** of the observer's clock since
//!   it was first seen at that value: [`Liveness::Dead`]; less: `Live` if this watch ever saw it
//!   move, else `Unknown`.
//!
//! No two hosts' clocks are compared: a wall clock stepped or skewed by seconds changes nothing,
//! and a rate difference only stretches the margins below.
//!
//! The holder's side is self-fencing: it stops writing once its own monotonic clock says more than
//! [`self_fence_ns`] (three quarters of a lease) passed since it read the clock before writing its
//! last beat. An observer declares it dead only after a full lease of *its* clock during which that
//! counter stood still, counted from a moment after that beat was written. So a self-fencing holder
//! has stopped before anyone may take over as long as its clock runs at least three quarters as
//! fast as the observer's, and an operation that passed its check a moment before the fence has the
//! remaining quarter lease to land (docs/COHERENCE.md "Liveness").
//!
//! With the test-only `coherence-teeth` feature, [`set_liveness_rule`] brings back the old rule
//! (the heartbeat word holds the writer's wall clock; dead when older than a lease by the
//! observer's), so that the simulator can show what clock skew does to it.

use std::sync::Mutex;

/// What an observer knows of a participant slot after one look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// No holder: the slot is free.
    Free,
    /// The heartbeat counter moved while this observer watched, within the last lease.
    Live,
    /// Held; this observer has not watched long enough to tell (a first look, or a counter that
    /// stood still for less than a lease and was never seen to move).
    Unknown,
    /// The counter stood still for more than a lease of this observer's monotonic clock.
    Dead,
}

impl Liveness {
    /// True when the slot may be reclaimed: free, or its holder dead.
    pub fn reclaimable(self) -> bool {
        matches!(self, Liveness::Free | Liveness::Dead)
    }

    /// A short word for reports: `free`, `live`, `unknown`, `DEAD`.
    pub fn name(self) -> &'static str {
        match self {
            Liveness::Free => "free",
            Liveness::Live => "live",
            Liveness::Unknown => "unknown",
            Liveness::Dead => "DEAD",
        }
    }
}

/// The words of a participant slot that liveness reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotSighting {
    /// Claim token (0: free).
    pub token: u64,
    /// Slot generation.
    pub generation: u64,
    /// Heartbeat counter.
    pub heartbeat: u64,
}

/// One look's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// What the observer concludes.
    pub liveness: Liveness,
    /// How long (observer's monotonic ns) it has seen the current counter value stand still.
    pub still_ns: u64,
    /// The counter value seen.
    pub heartbeat: u64,
}

/// What an observer remembers of one held slot.
#[derive(Clone, Copy, Debug)]
struct Seen {
    token: u64,
    generation: u64,
    heartbeat: u64,
    /// Observer's monotonic time when it first saw this holder at this counter value.
    since_ns: u64,
    /// This observer saw this holder's counter move at least once.
    moved: bool,
}

/// An observer's watch of every slot's heartbeat counter (one per pool handle).
#[derive(Debug, Default)]
pub struct Watch {
    seen: Mutex<Vec<Option<Seen>>>,
}

impl Watch {
    /// Records a look at slot `q` made at `now_ns` (the observer's monotonic clock) and judges it
    /// under a lease of `lease_ns` (see the module's rule).
    pub fn observe(&self, q: u32, s: SlotSighting, now_ns: u64, lease_ns: u64) -> Verdict {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let i = q as usize;
        if seen.len() <= i {
            seen.resize(i + 1, None);
        }
        let verdict = |liveness, still_ns| Verdict {
            liveness,
            still_ns,
            heartbeat: s.heartbeat,
        };
        if s.token == 0 {
            seen[i] = None;
            return verdict(Liveness::Free, 0);
        }
        let fresh = |moved| Seen {
            token: s.token,
            generation: s.generation,
            heartbeat: s.heartbeat,
            since_ns: now_ns,
            moved,
        };
        match seen[i] {
            Some(w) if (w.token, w.generation) == (s.token, s.generation) => {
                if w.heartbeat != s.heartbeat {
                    seen[i] = Some(fresh(true));
                    return verdict(Liveness::Live, 0);
                }
                let still = now_ns.saturating_sub(w.since_ns);
                let liveness = if still > lease_ns {
                    Liveness::Dead
                } else if w.moved {
                    Liveness::Live
                } else {
                    Liveness::Unknown
                };
                verdict(liveness, still)
            }
            // A first look, or another holder than the one watched: the watch starts now.
            _ => {
                seen[i] = Some(fresh(false));
                verdict(Liveness::Unknown, 0)
            }
        }
    }
}

/// How often a holder advances its counter: an eighth of the lease, so that a holder whose beat
/// comes late by up to five periods still beats before it fences itself.
pub fn beat_period_ns(lease_ns: u64) -> u64 {
    (lease_ns / 8).max(1)
}

/// How long after the clock reading that preceded its last beat a holder stops writing, on its
/// own monotonic clock: three quarters of a lease (see the module's margins).
pub fn self_fence_ns(lease_ns: u64) -> u64 {
    lease_ns / 4 * 3
}

/// The rule that judges liveness (test-only choice: see [`set_liveness_rule`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LivenessRule {
    /// The heartbeat is a counter; observers watch it on their own monotonic clocks.
    #[default]
    Counter,
    /// The rule of pool format 1 (test-only, `coherence-teeth`): the heartbeat is the writer's wall
    /// clock, dead when older than a lease by the observer's wall clock. Correct only while every
    /// host's wall clock agrees to well within a lease.
    Timestamp,
}

#[cfg(feature = "coherence-teeth")]
thread_local! {
    static RULE: std::cell::Cell<LivenessRule> = const { std::cell::Cell::new(LivenessRule::Counter) };
}

/// Test-only: the liveness rule of the calling thread's beats, attaches and liveness judgements
/// from now on. Returns false, doing nothing, in a build without the `coherence-teeth` feature
/// (shipped builds always use [`LivenessRule::Counter`]).
pub fn set_liveness_rule(rule: LivenessRule) -> bool {
    #[cfg(feature = "coherence-teeth")]
    {
        RULE.with(|r| r.set(rule));
        true
    }
    #[cfg(not(feature = "coherence-teeth"))]
    {
        let _ = rule;
        false
    }
}

/// The liveness rule in force in the calling thread.
#[inline]
pub fn liveness_rule() -> LivenessRule {
    #[cfg(feature = "coherence-teeth")]
    {
        RULE.with(|r| r.get())
    }
    #[cfg(not(feature = "coherence-teeth"))]
    {
        LivenessRule::Counter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: u64 = 1000;

    fn at(token: u64, generation: u64, heartbeat: u64) -> SlotSighting {
        SlotSighting {
            token,
            generation,
            heartbeat,
        }
    }

    #[test]
    fn a_first_look_is_never_dead() {
        let w = Watch::default();
        let v = w.observe(3, at(7, 1, 42), 1_000_000, LEASE);
        assert_eq!(v.liveness, Liveness::Unknown);
        assert_eq!(w.observe(0, at(0, 5, 9), 0, LEASE).liveness, Liveness::Free);
    }

    #[test]
    fn a_counter_standing_still_for_a_lease_is_dead() {
        let w = Watch::default();
        w.observe(1, at(7, 1, 42), 100, LEASE);
        assert_eq!(
            w.observe(1, at(7, 1, 42), 1100, LEASE).liveness,
            Liveness::Unknown
        );
        let v = w.observe(1, at(7, 1, 42), 1101, LEASE);
        assert_eq!((v.liveness, v.still_ns), (Liveness::Dead, 1001));
    }

    #[test]
    fn a_moving_counter_is_live_and_restarts_the_watch() {
        let w = Watch::default();
        w.observe(1, at(7, 1, 42), 100, LEASE);
        assert_eq!(
            w.observe(1, at(7, 1, 43), 900, LEASE).liveness,
            Liveness::Live
        );
        assert_eq!(
            w.observe(1, at(7, 1, 43), 1800, LEASE).liveness,
            Liveness::Live
        );
        assert_eq!(
            w.observe(1, at(7, 1, 43), 1901, LEASE).liveness,
            Liveness::Dead
        );
        // A dead holder that beats again is live again.
        assert_eq!(
            w.observe(1, at(7, 1, 44), 1902, LEASE).liveness,
            Liveness::Live
        );
    }

    #[test]
    fn another_holder_restarts_the_watch() {
        let w = Watch::default();
        w.observe(2, at(7, 1, 42), 0, LEASE);
        assert_eq!(
            w.observe(2, at(9, 2, 42), 5000, LEASE).liveness,
            Liveness::Unknown
        );
        assert_eq!(
            w.observe(2, at(9, 2, 42), 5500, LEASE).liveness,
            Liveness::Unknown
        );
        assert_eq!(
            w.observe(2, at(9, 2, 42), 6001, LEASE).liveness,
            Liveness::Dead
        );
        // Freed, then claimed again: a new watch.
        assert_eq!(
            w.observe(2, at(0, 2, 42), 6002, LEASE).liveness,
            Liveness::Free
        );
        assert_eq!(
            w.observe(2, at(9, 2, 42), 9000, LEASE).liveness,
            Liveness::Unknown
        );
    }

    #[test]
    fn the_margins_hold() {
        for lease in [1_000_000, 20_000_000, 2_000_000_000] {
            assert!(6 * beat_period_ns(lease) <= self_fence_ns(lease));
            assert!(4 * self_fence_ns(lease) <= 3 * lease);
        }
    }
}
