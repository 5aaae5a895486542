//! Participants: the processes (or hosts) attached to a pool.
//!
//! Attaching claims a slot in the participant table (its "host id") and, when one is free or its
//! owner is dead, a data partition; a participant whose partitions are full claims further ones,
//! each through a further slot of its own (`holdings`). The participant alone writes its slot (heartbeat, counters,
//! pins) and its partition (allocator, index, blocks): there is one writer per cache line, and no
//! cross-host atomic is needed on the data path. The owner's allocator and eviction order live in
//! private memory and are rebuilt from the index when a partition changes hands.
//!
//! Crash model: a participant may die at any instruction. Its heartbeat counter then stands still;
//! once an observer watched it stand still for a lease on its own clock ([`crate::watch`]), that
//! observer may attach in its place: it takes the partition over by bumping the partition's
//! generation, repairs any index slot left mid-update, and keeps every committed block readable.
//!
//! - `state`: the [`Participant`] handle, its options, counters and owner-private state.
//! - `lifecycle`: attach (slot claim), heartbeat thread, detach.
//! - `beat`: the holder's heartbeat counter and its own lease (self-fencing).
//! - `liveness`: what this handle's watch says of others ([`participant_liveness`],
//!   [`participant_dead`]), and when this participant is fenced.
//! - `claim` and `recovery`: taking a partition into ownership and rebuilding its state.
//! - `holdings`: the further partitions a participant claims as it fills and gives back when
//!   empty, each through an extra slot of its own.
//! - `write`, `index` and `reservation`: put, commit, eviction, delete; in-place writes
//!   ([`Reservation`]).
//! - `object`: multi-block objects (put, replacement and eviction as a unit) and
//!   [`Participant::put_if_absent`] ([`PutOutcome`]).
//! - `read` and `pin`: counted reads, and pins that keep a block in place ([`PinnedBlock`]).
//! - `crash`: the crash points of the write protocol ([`CRASH_SITES`]) and [`crash_point`], which
//!   the SSD tier's spill calls too.

mod beat;
mod claim;
mod crash;
mod holdings;
mod index;
mod lifecycle;
pub(crate) mod liveness;
mod object;
mod pin;
mod read;
mod recovery;
mod reservation;
pub(crate) mod state;
mod write;

pub use crash::{crash_point, CRASH_SITES, OBJECT_CRASH_SITES};
#[cfg(loom)]
pub(crate) use index::write_slot_at;
pub use liveness::{participant_dead, participant_liveness};
pub use object::PutOutcome;
pub use pin::{PinnedBlock, RawPin};
pub use reservation::{RawReservation, Reservation};
pub use state::{AttachOptions, Participant, ParticipantStats, Recovery};
