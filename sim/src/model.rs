//! The model of a run: what the hosts committed, started, pinned, published and claimed, as they
//! tell it while holding the baton, which the checks ([`crate::check`]) compare with what the pool
//! lets them read; and the keys and payloads of the workload, whose bytes name their version.

use cxlkv_kernels::rng::SplitMix64;
use cxlkv_runtime::hotness::HotEntry;
use cxlkv_runtime::key::Key;
use std::collections::BTreeMap;

/// The model of what was committed, shared by the host threads (updated while holding the baton).
#[derive(Default)]
pub(crate) struct Model {
    /// Per key `(host, index)`: version committed last (0 = none) and whether it was a delete.
    pub(crate) committed: BTreeMap<(usize, usize), (u64, bool)>,
    /// Per key: version of the last operation started.
    pub(crate) started: BTreeMap<(usize, usize), u64>,
    /// The last version handed out (versions grow across every key).
    pub(crate) next_version: u64,
    /// Bumped by a stall: a pin taken before it is not checked any more (its lease ended).
    pub(crate) epoch: u64,
    /// The host that crashed or stalled (presumed dead), if any.
    pub(crate) crashed: Option<usize>,
    /// The host that stalled past its lease (presumed dead, taken over, then resumed).
    pub(crate) zombie: Option<usize>,
    /// The successor has taken the crashed or stalled host's partition over.
    pub(crate) taken_over: bool,
    /// Hosts done with their operations (the end-of-run barrier).
    pub(crate) done_ops: Vec<bool>,
    /// Host threads that returned (or unwound).
    pub(crate) finished: Vec<bool>,
    /// Indexed blocks per partition at the end of its owner's run (live owners only).
    pub(crate) live_blocks: BTreeMap<usize, usize>,
    /// Indexed blocks of each host after its last completed operation.
    pub(crate) last_live: Vec<usize>,
    /// Partition of the pin each host holds, if any.
    pub(crate) pins: BTreeMap<usize, u32>,
    /// Per partition: pins held when its owner last completed an operation, plus pins taken
    /// since (each may have made the owner's operation in flight unindex one more victim).
    pub(crate) pin_slack: BTreeMap<u32, usize>,
    /// Per host: simulated time of its last heartbeat known to be published (attach or a beat
    /// that returned), 0 before it attached.
    pub(crate) beat_at: Vec<u64>,
    /// Per host: it is detaching (its slot may read as free from then on).
    pub(crate) leaving: Vec<bool>,
    /// Per partition: claims started and claims completed (attach or takeover returned).
    pub(crate) claims: BTreeMap<u32, (u64, u64)>,
    /// Per partition: the last thing that happened to it was a release by a live owner's detach.
    pub(crate) released: BTreeMap<u32, bool>,
    /// Per host: every hotlist it published, oldest first.
    pub(crate) hotlists: Vec<Vec<Vec<HotEntry>>>,
    /// Per host: a hotlist publish is in flight.
    pub(crate) hl_busy: Vec<bool>,
    /// The first invariant that broke.
    pub(crate) violation: Option<String>,
    /// The last events, oldest first (see [`Model::log`]).
    pub(crate) trace: Vec<String>,
    /// Operations run by every host.
    pub(crate) ops: u64,
}

impl Model {
    /// The model of a run of `hosts` hosts before anything happened.
    pub(crate) fn new(hosts: usize) -> Model {
        Model {
            finished: vec![false; hosts],
            done_ops: vec![false; hosts],
            last_live: vec![0; hosts],
            beat_at: vec![0; hosts],
            leaving: vec![false; hosts],
            hotlists: vec![Vec::new(); hosts],
            hl_busy: vec![false; hosts],
            ..Default::default()
        }
    }

    /// Host `q` may legitimately look dead or hold no current hotlist: it crashed, stalled past
    /// its lease, is detaching, or has not attached yet.
    pub(crate) fn out_of_watch(&self, q: usize) -> bool {
        self.crashed == Some(q) || self.zombie == Some(q) || self.leaving[q] || self.beat_at[q] == 0
    }

    /// Adds `s` to the trace (the last 24 events, which a violation reports).
    pub(crate) fn log(&mut self, s: String) {
        if self.trace.len() >= 24 {
            self.trace.remove(0);
        }
        self.trace.push(s);
    }

    /// Records the run's violation (the first one stands).
    pub(crate) fn fail(&mut self, s: String) {
        if self.violation.is_none() {
            self.violation = Some(s);
        }
    }
}

/// The key of index `i` among host `h`'s keys.
pub(crate) fn key_of(h: usize, i: usize) -> Key {
    Key::from_bytes(
        &[
            b"sim".as_slice(),
            &(h as u64).to_le_bytes(),
            &(i as u64).to_le_bytes(),
        ]
        .concat(),
    )
}

/// The bytes a put of version `v` stores under key `(h, i)`.
pub(crate) fn payload(h: usize, i: usize, v: u64) -> Vec<u8> {
    let mut r = SplitMix64::new(v.wrapping_mul(31) ^ ((h as u64) << 40) ^ ((i as u64) << 20));
    let len = 24 + r.below(600) as usize;
    let mut b: Vec<u8> = [
        (h as u64).to_le_bytes(),
        (i as u64).to_le_bytes(),
        v.to_le_bytes(),
    ]
    .concat();
    b.extend((24..len).map(|_| r.next_u64() as u8));
    b
}

/// Version encoded in a payload of key `(h, i)` if the bytes are exactly that version's.
pub(crate) fn version_of(h: usize, i: usize, bytes: &[u8]) -> Option<u64> {
    let v = u64::from_le_bytes(bytes.get(16..24)?.try_into().ok()?);
    (payload(h, i, v) == bytes).then_some(v)
}
