//! Simulated host clocks ([`HostClock`]): each host reads the simulation's time through a clock of
//! its own, as hosts sharing a CXL device do. Its oscillator runs at its own rate (drift); its
//! monotonic clock starts from an origin of its own; its wall clock starts an offset away from the
//! others' and steps forward and back during the run (NTP corrections, a VM resumed after
//! migration). Both are pure functions of the simulation's time, so a seed replays exactly and the
//! checks can compute what any host's clock read at any moment.

use cxlkv_kernels::rng::SplitMix64;
use cxlkv_runtime::clock::Clock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Wall-clock time of every host at the start of a run, before its offset (2023-11-14, in ns
/// since the Unix epoch): far enough from 0 that an offset of either sign stays positive.
const WALL_EPOCH_NS: u64 = 1_700_000_000_000_000_000;

/// Largest drift of a host's oscillator with skew on, in parts per million (±5 %: a hundred times
/// what NTP lets a real clock slew, well inside the factor of two that self-fencing tolerates).
pub(crate) const MAX_DRIFT_PPM: i64 = 50_000;

/// One simulated host's clocks, read off the simulation's clock.
pub(crate) struct HostClock {
    /// The simulation's clock (nanoseconds), shared by every host.
    sim: Arc<AtomicU64>,
    /// The simulation's time when the run started (drift counts from there).
    start: u64,
    /// How far this host's oscillator runs off the simulation's, in parts per million.
    drift_ppm: i64,
    /// This host's monotonic reading at the start.
    mono_origin: u64,
    /// Its wall clock's offset from the simulation's time at the start.
    wall_offset: i64,
    /// Steps of its wall clock: (simulation time, the offset it steps to), in time order.
    steps: Vec<(u64, i64)>,
}

impl HostClock {
    /// The clocks of one host, planned from `rng`: with `skew_ns` > 0 a wall offset within
    /// ±`skew_ns`, one to three steps during the first `span` ns of the run, each to another offset
    /// within ±`skew_ns` (forward or back by up to twice that), and a drift within
    /// ±[`MAX_DRIFT_PPM`]; without, wall clocks that agree and rates that match.
    /// Monotonic origins always differ (nothing may compare two hosts' monotonic readings).
    pub(crate) fn plan(
        sim: Arc<AtomicU64>,
        start: u64,
        skew_ns: u64,
        span: u64,
        rng: &mut SplitMix64,
    ) -> HostClock {
        let mono_origin = rng.below(1 << 50);
        let signed = |rng: &mut SplitMix64, max: u64| -> i64 {
            (rng.below(2 * max + 1) as i64) - max as i64
        };
        let (wall_offset, drift_ppm, mut steps) = if skew_ns == 0 {
            (0, 0, Vec::new())
        } else {
            let steps: Vec<(u64, i64)> = (0..1 + rng.below(3))
                .map(|_| (start + rng.below(span), signed(rng, skew_ns)))
                .collect();
            (
                signed(rng, skew_ns),
                signed(rng, MAX_DRIFT_PPM as u64),
                steps,
            )
        };
        steps.sort_unstable();
        HostClock {
            sim,
            start,
            drift_ppm,
            mono_origin,
            wall_offset,
            steps,
        }
    }

    /// Nanoseconds this host's oscillator counted from the start of the run to simulation time `t`.
    fn local(&self, t: u64) -> u64 {
        let d = i128::from(t.saturating_sub(self.start));
        (d + d * i128::from(self.drift_ppm) / 1_000_000) as u64
    }

    /// This host's monotonic reading at simulation time `t`.
    pub(crate) fn mono_at(&self, t: u64) -> u64 {
        self.mono_origin + self.local(t)
    }

    /// This host's wall-clock reading at simulation time `t`.
    pub(crate) fn wall_at(&self, t: u64) -> u64 {
        let offset = self
            .steps
            .iter()
            .take_while(|&&(at, _)| at <= t)
            .last()
            .map_or(self.wall_offset, |&(_, o)| o);
        (WALL_EPOCH_NS + self.local(t)).saturating_add_signed(offset)
    }

    /// Monotonic nanoseconds this host counts between simulation times `from` and `to`.
    pub(crate) fn mono_between(&self, from: u64, to: u64) -> u64 {
        self.mono_at(to).saturating_sub(self.mono_at(from))
    }

    /// Wall-clock nanoseconds this host counts between `from` and `to` (0 if it stepped back).
    pub(crate) fn wall_between(&self, from: u64, to: u64) -> u64 {
        self.wall_at(to).saturating_sub(self.wall_at(from))
    }

    /// How far this host's wall clock gets from the simulation's time (drift aside), for reports.
    pub(crate) fn max_skew_ns(&self) -> u64 {
        self.steps
            .iter()
            .map(|&(_, o)| o.unsigned_abs())
            .fold(self.wall_offset.unsigned_abs(), u64::max)
    }
}

impl Clock for HostClock {
    fn now_ns(&self) -> u64 {
        self.wall_at(self.sim.load(Ordering::Relaxed))
    }

    fn monotonic_ns(&self) -> u64 {
        self.mono_at(self.sim.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clocks_drift_but_never_step_and_wall_clocks_step() {
        let sim = Arc::new(AtomicU64::new(1000));
        let mut rng = SplitMix64::new(5);
        let c = HostClock::plan(sim.clone(), 1000, 10_000_000_000, 1_000_000, &mut rng);
        assert!(!c.steps.is_empty() && c.drift_ppm.abs() <= MAX_DRIFT_PPM);
        let mut last = c.monotonic_ns();
        for t in (1000..3_000_000).step_by(10_000) {
            sim.store(t, Ordering::Relaxed);
            let m = c.monotonic_ns();
            assert!(m >= last);
            last = m;
        }
        let d = c.mono_between(1000, 1_001_000) as i64;
        assert!((d - (1_000_000 + c.drift_ppm)).abs() <= 1, "{d}");
        let flat = HostClock::plan(sim, 1000, 0, 1_000_000, &mut rng);
        assert_eq!(flat.wall_between(1000, 5000), 4000);
        assert_eq!(flat.max_skew_ns(), 0);
    }
}
