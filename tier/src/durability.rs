//! What a spill file promises about a write or a removal once the call that made it has returned:
//! the [`SyncPolicy`], and the crash points of a spill ([`SPILL_CRASH_SITES`]).
//!
//! A spill file has no index apart from its records: each record is one write of a header and
//! its payload, and the header carries the CRC of the payload and its own, so a record that
//! validates is whole (a torn one never does, whatever order the device wrote its pages in). What
//! needs ordering is what the recovery scan can see across records:
//!
//! 1. **A new record is durable before anything depends on it**: before [`SpillFile::write_batch`]
//!    returns (the acknowledgement: the tiers then delete the pool copy), and before the record it
//!    supersedes is retired.
//! 2. **A superseded record is retired (its first page zeroed) only after its successor is
//!    durable**: a crash in between leaves both, and the higher sequence number wins at open.
//! 3. **A removal is durable before [`SpillFile::remove`] returns**, so that no removed record
//!    validates again after a crash (its durable zero also covers every retirement written
//!    before it, the trailing ones of earlier batches included).
//!
//! What each policy makes durable, and against what:
//!
//! | policy | `fdatasync` | a crash of the process | a crash of the system (power loss) |
//! | --- | --- | --- | --- |
//! | `none` | never on its own ([`SpillFile::sync`] when the caller asks) | every acknowledged write and removal survives | only what the last [`SpillFile::sync`] covered; anything later may be lost, and a removed record may come back |
//! | `on-batch` | one per `write_batch` (after its records, before it indexes them and retires what they supersede) and one per `remove` | as `none` | every acknowledged write and removal survives |
//! | `always` | every write is `O_DSYNC` (records and retirements alike: durable on completion) | as `none` | as `on-batch`, and each record is durable as soon as its own write completes, before the rest of its batch |
//!
//! "Durable" assumes a device that honours flushes (or has power-loss protection). A process
//! crash cannot lose anything that was written, since completed writes are in the kernel (page
//! cache or device) whatever the process does next: the spill crash test (tier/tests/spill_crash.rs)
//! SIGKILLs a writer at every [`SPILL_CRASH_SITES`] step under each policy and checks that every
//! acknowledged record comes back byte-exact and nothing torn. A power loss cannot be simulated by
//! killing a process; for it, the policies rest on the order above and on `fdatasync(2)` /
//! `O_DSYNC`, which the test checks are issued ([`SpillStats::syncs`](crate::SpillStats)).
//!
//! [`SpillFile::write_batch`]: crate::SpillFile::write_batch
//! [`SpillFile::remove`]: crate::SpillFile::remove
//! [`SpillFile::sync`]: crate::SpillFile::sync

use crate::error::TierError;

/// When a spill file flushes its writes to stable storage (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SyncPolicy {
    /// Never on its own: acknowledged writes survive a process crash, not a power loss.
    #[default]
    None,
    /// One `fdatasync` per call that changes the file: acknowledged writes and removals survive a
    /// power loss.
    OnBatch,
    /// Every write `O_DSYNC`: each record and retirement is durable when its write completes.
    Always,
}

impl SyncPolicy {
    /// Every policy, in the order the docs and benches list them.
    pub const ALL: [SyncPolicy; 3] = [SyncPolicy::None, SyncPolicy::OnBatch, SyncPolicy::Always];

    /// The policy's name, as parsed.
    pub fn name(self) -> &'static str {
        match self {
            SyncPolicy::None => "none",
            SyncPolicy::OnBatch => "on-batch",
            SyncPolicy::Always => "always",
        }
    }
}

impl std::fmt::Display for SyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SyncPolicy {
    type Err = TierError;
    /// Parses `none`, `on-batch` or `always`.
    fn from_str(s: &str) -> Result<Self, TierError> {
        SyncPolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                TierError::BadConfig(format!("sync policy {s:?}: use none, on-batch or always"))
            })
    }
}

/// The crash points of a spill (`CXLKV_CRASH_AT=SITE:N` with the runtime's test-only
/// `crash-points` feature; nothing in a normal build), in the order a write call reaches them,
/// then the removal's:
/// - `spill:begin`: a write call has started, before it has submitted any record;
/// - `spill:record`: one more record of the batch is on the file (reached once per record);
/// - `spill:written`: every record of the batch is on the file, before the batch's sync;
/// - `spill:synced`: after the sync (where the policy has one), before the index takes the
///   records and the records they supersede are retired;
/// - `spill:retired`: the superseded records are retired, before the call returns;
/// - `remove:zeroed`: a removed record's first page is zeroed, before the removal's sync.
pub const SPILL_CRASH_SITES: [&str; 6] = [
    "spill:begin",
    "spill:record",
    "spill:written",
    "spill:synced",
    "spill:retired",
    "remove:zeroed",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_print() {
        for p in SyncPolicy::ALL {
            assert_eq!(p.to_string().parse::<SyncPolicy>().unwrap(), p);
        }
        assert_eq!(SyncPolicy::default(), SyncPolicy::None);
        assert!("fsync".parse::<SyncPolicy>().is_err());
    }
}
