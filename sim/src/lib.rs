//! The non-coherence simulator: many simulated hosts in one process run the real pool protocol
//! (`cxlkv_runtime`'s [`Pool`](cxlkv_runtime::pool::Pool) and
//! [`Participant`](cxlkv_runtime::participant::Participant)) over memory without hardware
//! coherence, interleaved by a seeded scheduler, and a model checks the invariants of
//! docs/COHERENCE.md. A run that breaks one reports the seed and the last operations, and replays
//! from that seed.
//!
//! # What it models
//!
//! - [`SimBacking`] (`backing`): the shared memory, what a CXL device holds. It is itself a
//!   coherent [`SharedMemory`](cxlkv_runtime::mem::SharedMemory) (direct access), used by checkers
//!   that look at memory after a run.
//! - [`SimHost`] (`host`): one host's view, a private write-back cache of 64-byte lines. Reads
//!   return the cached line, stale or not, until the line is acquired; writes (atomics included: a
//!   non-coherent host's atomic store is just a store) reach the backing only when published,
//!   acquired (write back then invalidate, as CLFLUSHOPT does) or evicted at random moments
//!   (partial, out of order). A crash drops every unpublished line.
//! - The scheduler (`sched`): host threads take turns holding a baton; every memory access is a
//!   yield point where the seeded generator picks who runs next, and a tick of the simulated clock.
//!   A run that outlives its deadline is stuck: a violation.
//! - Host clocks (`clock`): each host reads the simulated time through a
//!   [`Clock`](cxlkv_runtime::clock::Clock) of its own (`clock::HostClock`, given to the pool by
//!   `Pool::open_with_clock`): a monotonic clock from an origin of its own and a wall clock, both
//!   off the simulated time by the seed's offset, steps and drift (`SimOptions::clock_skew_ms`).
//!
//! # How a run goes
//!
//! [`run_sim`] runs seeds one after another (`run`). A seed plans its run: the pool's size, how
//! often the scheduler switches hosts, how often caches write back, each host's clocks, and the
//! host's fate: none, a crash at a random memory step, or a stall past its lease (a zombie that
//! must find itself fenced); the crashed or stalled host's successor takes its partition over once
//! its watch found the host dead (`SimOptions::liveness` picks the rule). Every host first
//! reads the whole region (its cache holds garbage from before the format), host 0 formats the
//! pool, and then every host attaches and runs its operations (`protocol` for a host's life,
//! `steps` for each turn): heartbeats, pins held across turns, liveness and hotlist reads, and
//! puts, deletes, gets and pins. The steps tell the model (`model`) what they committed; the
//! checks (`check`) compare it with what the pool returns, during the run and at its end, where
//! every host and then a fresh host read every live owner's keys. The first violation stops the
//! run; [`SimReport`] prints as `cxlkv sim` shows it.
//!
//! # Adding a protocol site to the simulation
//!
//! A publish or acquire site is a [`Site`](cxlkv_runtime::coherence::Site) variant in
//! `cxlkv_runtime::coherence` (its name in `Site::ALL`), called at the protocol point. The
//! simulator must then show that the site is needed: with the runtime's `coherence-teeth` feature,
//! `SimOptions::drop_site` removes it, and `every_site_is_needed` (tests/coherence_sim.rs) requires
//! a violation within its seed budget. If none comes, add a step here that exercises the path (in
//! `steps`) and a check that breaks without the site (in `check`), as the hotlist read and publish
//! steps do for `HotlistRead` and `HotlistWrite`.

mod backing;
mod check;
mod clock;
mod ctx;
mod host;
mod model;
mod protocol;
mod run;
mod sched;
mod steps;
mod sync;

pub use backing::SimBacking;
pub use host::SimHost;
pub use run::{run_sim, sites, SimOptions, SimReport, Violation};
