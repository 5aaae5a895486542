//! Pool images for the corruption tests (`corruption.rs`, `corruption_cases.rs`): a pool built
//! with raw and typed blocks, replacements, deletes, a pin, a detached owner, a crashed owner and a
//! crashed reader, captured as bytes together with what is in it; the geometry to find its
//! structures; loading an image into a fresh anonymous region; and a clock that waits out a lease
//! without sleeping, for the takeover of an image's crashed holders.
// Each test crate that includes this module uses a different part of it.
#![allow(dead_code)]

use cxlkv_kernels::rng::SplitMix64;
use cxlkv_kernels::DType;
use cxlkv_runtime::clock::{system_now_ns, Clock};
use cxlkv_runtime::format::{
    self, decode_entry, BlockHeader, IndexSlot, Superblock, BLOCK_HEADER_SIZE, INDEX_SLOT_SIZE,
};
use cxlkv_runtime::kv::{self, KvShape};
use cxlkv_runtime::participant::participant_liveness;
use cxlkv_runtime::{
    check, AttachOptions, Codec, Key, Participant, Pool, PoolConfig, PoolError, Region,
    SharedMemory,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Bytes of the pools under test: 1 MiB device area plus two partitions of 115 4-KiB blocks.
pub const POOL_BYTES: u64 = 2 << 20;
/// Block size of the pools under test.
pub const BLOCK: u64 = 4096;
/// Participant slots of an image.
pub const PARTICIPANTS: u32 = 4;
/// Partitions of an image (one per owner).
pub const PARTITIONS: u32 = 2;
/// Keys put while building an image (half per partition), before replacements and deletes.
pub const KEYS: u64 = 190;

/// What the corruption tests draw from a [`SplitMix64`] beyond its own methods.
pub trait Draw {
    /// True with a chance of `percent` in 100.
    fn chance(&mut self, percent: u64) -> bool;
    /// A byte other than zero (an XOR mask that changes what it touches).
    fn nonzero_byte(&mut self) -> u8;
}

impl Draw for SplitMix64 {
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn nonzero_byte(&mut self) -> u8 {
        1 + self.below(255) as u8
    }
}

/// Payload bytes of `key`'s `version`-th put: a pure function, so a test knows what is right.
pub fn payload(key: Key, version: u64, len: usize) -> Vec<u8> {
    let mut r = SplitMix64::new(
        key.lo() ^ key.hi().rotate_left(17) ^ version.wrapping_mul(0x1234_5678_9abc),
    );
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A typed KV block for `key`: shape and K/V derived from the key; returns (shape, k, v).
pub fn kv_parts(key: Key, i: u64) -> (KvShape, Vec<u8>, Vec<u8>) {
    let dtype = if i.is_multiple_of(2) {
        DType::F32
    } else {
        DType::Bf16
    };
    let mut shape = KvShape {
        dtype,
        layer: i as u32,
        kv_heads: 1 + (i % 3) as u32,
        head_dim: 8 * (1 + (i % 4) as u32),
        tokens: 1 + (i % 16) as u32,
        sequence: i,
        token_offset: 16 * i,
    };
    while shape.payload_bytes().unwrap() > BLOCK as usize {
        shape.tokens -= 1;
    }
    let n = shape.tensor_bytes().unwrap() / dtype.bytes(1);
    let mut r = SplitMix64::new(key.lo());
    let mut tensor = |_| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                let x = (r.below(2001) as f32 - 1000.0) / 64.0;
                match dtype {
                    DType::Bf16 => ((x.to_bits() >> 16) as u16).to_le_bytes().to_vec(),
                    _ => x.to_le_bytes().to_vec(),
                }
            })
            .collect()
    };
    let (k, v) = (tensor(0), tensor(1));
    (shape, k, v)
}

/// A key stored while building an image, and what a read may return for it.
#[derive(Clone, Debug)]
pub struct Stored {
    pub key: Key,
    /// Partition it was put into.
    pub partition: u32,
    /// Its current payload and codec, or `None` once deleted.
    pub value: Option<(Vec<u8>, Codec)>,
}

/// A live index entry of an image: slot → block of `len` payload bytes.
#[derive(Clone, Copy, Debug)]
pub struct LiveBlock {
    pub partition: u32,
    pub slot: u32,
    pub block: u32,
    pub len: u64,
}

/// A pool image: its bytes and what is in it.
pub struct Image {
    pub name: &'static str,
    pub bytes: Vec<u8>,
    pub sb: Superblock,
    pub keys: Vec<Stored>,
    pub live: Vec<LiveBlock>,
}

/// Offsets of an image's structures, computed from its superblock as docs/FORMAT.md describes.
pub struct Geometry(pub Superblock);

impl Geometry {
    /// Participant slot `q`.
    pub fn slot(&self, q: u32) -> u64 {
        self.0.participant_table_off + u64::from(q) * self.0.slot_layout().size
    }
    /// Partition `p` (its header first).
    pub fn partition(&self, p: u32) -> u64 {
        self.0.partition_off + u64::from(p) * self.0.partition_stride
    }
    /// Index slot `s` of partition `p`.
    pub fn index_slot(&self, p: u32, s: u32) -> u64 {
        self.partition(p) + self.0.index_off + u64::from(s) * INDEX_SLOT_SIZE
    }
    /// Header of block `b` of partition `p`.
    pub fn header(&self, p: u32, b: u32) -> u64 {
        self.partition(p) + self.0.block_headers_off + u64::from(b) * BLOCK_HEADER_SIZE
    }
    /// Payload of block `b` of partition `p`.
    pub fn payload(&self, p: u32, b: u32) -> u64 {
        self.partition(p) + self.0.payloads_off + u64::from(b) * self.0.block_size
    }
}

/// The plain-data structure at `off` of `bytes`.
pub fn plain<T: format::Plain>(bytes: &[u8], off: u64) -> T {
    format::from_bytes(&bytes[off as usize..])
}

/// Loads `bytes` into a fresh anonymous region of `size` bytes (≥ 1).
pub fn load(bytes: &[u8], size: u64) -> Arc<Region> {
    let region = Region::anonymous(size).expect("anonymous region");
    let n = bytes.len().min(size as usize);
    region.write(0, &bytes[..n]).expect("load image");
    Arc::new(region)
}

/// A clock whose monotonic reading only [`ManualClock::advance`] moves: a test waits out a lease
/// on it in no time, and no holder's heartbeat moves meanwhile (an image's holders are all gone).
#[derive(Debug, Default)]
pub struct ManualClock {
    mono: AtomicU64,
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        system_now_ns()
    }
    fn monotonic_ns(&self) -> u64 {
        self.mono.load(Ordering::SeqCst)
    }
}

impl ManualClock {
    /// Moves the monotonic clock `ns` on.
    pub fn advance(&self, ns: u64) {
        self.mono.fetch_add(ns, Ordering::SeqCst);
    }
}

/// Opens `bytes` (loaded into a region of `size` bytes) with a [`ManualClock`].
pub fn open_manual(bytes: &[u8], size: u64) -> (Result<Pool, PoolError>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    (
        Pool::open_with_clock(load(bytes, size), clock.clone()),
        clock,
    )
}

/// Watches every slot of `pool`, then lets a lease and a nanosecond pass on `clock`: from then on
/// the pool handle finds every holder whose heartbeat did not move dead (an image's crashed
/// holders), as an observer that waited a lease would.
pub fn wait_out_lease(pool: &Pool, clock: &ManualClock) {
    for q in 0..pool.superblock().participants {
        let _ = participant_liveness(pool, q);
    }
    clock.advance(pool.superblock().lease_ns + 1);
}

/// Attach options without a heartbeat thread (liveness stays deterministic), owning a partition
/// or not.
pub fn no_heartbeat(own_partition: bool) -> AttachOptions {
    AttachOptions {
        heartbeat: false,
        own_partition,
    }
}

/// Builds a pool with raw and typed blocks, replacements, deletes, a pin, one cleanly detached
/// owner, one crashed owner and one crashed reader; `torn` leaves one live index slot mid-update
/// as an owner that died inside a seqlock write would.
pub fn build_image(name: &'static str, seed: u64, torn: bool) -> Image {
    let region = Arc::new(Region::anonymous(POOL_BYTES).unwrap());
    let cfg = PoolConfig {
        block_size: BLOCK,
        participants: PARTICIPANTS,
        partitions: Some(PARTITIONS),
        lease: Duration::from_secs(10),
        ..Default::default()
    };
    let pool = Pool::create(region.clone(), &cfg).unwrap();
    let sb = *pool.superblock();
    let geo = Geometry(sb);
    let a = Participant::attach(&pool, no_heartbeat(true)).unwrap();
    let b = Participant::attach(&pool, no_heartbeat(true)).unwrap();
    let c = Participant::attach(&pool, no_heartbeat(false)).unwrap();
    assert_eq!(
        (a.partition(), b.partition(), c.partition()),
        (Some(0), Some(1), None)
    );
    let mut rng = SplitMix64::new(seed);
    let mut keys = Vec::new();
    let put = |owner: &Participant, key: Key, i: u64, version: u64, rng: &mut SplitMix64| {
        if i.is_multiple_of(3) {
            let (shape, k, v) = kv_parts(key, i + version);
            owner.put_kv(key, &shape, &k, &v).unwrap();
            (kv::encode(&shape, &k, &v).unwrap(), Codec::KvV1)
        } else {
            // Mostly small (debug-build CRCs dominate a case's time), some empty, some full.
            let len = match rng.below(20) {
                0 => 0,
                1 | 2 => BLOCK as usize,
                3..=6 => 1 + rng.below(BLOCK - 1) as usize,
                _ => 1 + rng.below(256) as usize,
            };
            let bytes = payload(key, version, len);
            owner.put(key, &bytes).unwrap();
            (bytes, Codec::Raw)
        }
    };
    for i in 0..KEYS {
        let key = Key::from_bytes(&[name.as_bytes(), &i.to_le_bytes()].concat());
        let owner = if i % 2 == 0 { &a } else { &b };
        let value = put(owner, key, i, 1, &mut rng);
        keys.push(Stored {
            key,
            partition: (i % 2) as u32,
            value: Some(value),
        });
    }
    for i in 0..KEYS {
        let owner = if i % 2 == 0 { &a } else { &b };
        let s = &mut keys[i as usize];
        if rng.chance(20) {
            s.value = Some(put(owner, s.key, i, 2, &mut rng));
        } else if rng.chance(15) {
            assert!(owner.delete(s.key).unwrap());
            s.value = None;
        }
    }
    // A crashed reader's pin on a block of the crashed owner's partition.
    let pinned = keys
        .iter()
        .find(|s| s.partition == 1 && s.value.is_some())
        .unwrap()
        .key;
    std::mem::forget(c.pin(pinned).unwrap().unwrap());
    drop(a); // detaches: partition 0 released, generation kept
    std::mem::forget(b); // crashes: partition 1 still names it
    std::mem::forget(c);
    let mut live = Vec::new();
    let mut bytes = vec![0u8; POOL_BYTES as usize];
    region.read(0, &mut bytes).unwrap();
    for p in 0..sb.partitions {
        for s in 0..sb.index_slots {
            let slot: IndexSlot = plain(&bytes, geo.index_slot(p, s));
            if let Some((block, _)) = decode_entry(slot.entry) {
                let h: BlockHeader = plain(&bytes, geo.header(p, block));
                live.push(LiveBlock {
                    partition: p,
                    slot: s,
                    block,
                    len: h.len,
                });
            }
        }
    }
    let stored = keys.iter().filter(|s| s.value.is_some()).count();
    assert_eq!(
        live.len(),
        stored,
        "{name}: one live index entry per stored key"
    );
    // The crashed holders' heartbeats stand still from here on: a test that watches them for a
    // lease (`wait_out_lease`) finds them dead.
    if torn {
        let victim = live.iter().find(|l| l.partition == 1).unwrap();
        let off = geo.index_slot(victim.partition, victim.slot) as usize;
        let v = u64::from_le_bytes(bytes[off..off + 8].try_into().unwrap());
        bytes[off..off + 8].copy_from_slice(&(v | 1).to_le_bytes());
    }
    let img = Image {
        name,
        bytes,
        sb,
        keys,
        live,
    };
    verify_clean(&img, torn);
    img
}

/// The unmutated image reads back exactly and checks clean (its damage-free baseline).
pub fn verify_clean(img: &Image, torn: bool) {
    let pool = Pool::open(load(&img.bytes, POOL_BYTES)).unwrap();
    let report = check(&pool).unwrap();
    assert!(
        report.ok(),
        "{}: clean image reports damage:\n{report}",
        img.name
    );
    assert_eq!(
        report.notes.iter().any(|n| n.what.contains("mid-update")),
        torn,
        "{}",
        img.name
    );
    let mut misses = 0;
    for s in &img.keys {
        match (pool.get(s.key).unwrap(), &s.value) {
            (Some((got, info)), Some((want, codec))) => {
                assert!(
                    got == *want && info.codec == *codec,
                    "{}: key {} reads back wrong",
                    img.name,
                    s.key
                )
            }
            (None, Some(_)) => misses += 1,
            (Some(_), None) => panic!("{}: deleted key {} still readable", img.name, s.key),
            (None, None) => {}
        }
    }
    // Only the torn slot's key misses (its slot stays odd until an owner repairs it).
    assert_eq!(misses, usize::from(torn), "{}", img.name);
}

/// The images every case starts from (one with a torn index slot), built once per test binary.
pub fn images() -> &'static [Image] {
    static IMAGES: OnceLock<Vec<Image>> = OnceLock::new();
    IMAGES.get_or_init(|| {
        vec![
            build_image("detached-and-crashed", 1, false),
            build_image("torn-slot", 2, true),
        ]
    })
}
