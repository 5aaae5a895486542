//! Bad input and corruption: real pool images, truncated, of another format or version, with bytes
//! of the superblock flipped, and — many thousands of times — with random bytes flipped anywhere
//! else. Opening fails with a clear error where it must; otherwise `check` reports live damage, no
//! read path (get, get_into, pin, block_ref) ever returns wrong bytes, and taking the damaged
//! partitions over, then writing and reading, never panics.
//!
//! Every case runs on a fresh anonymous region loaded with an image, from a seed of a hand-written
//! xorshift generator; a failing case prints its seed. `CXLKV_FUZZ_CASES` sets the number of random
//! mutation cases (default 5000), `CXLKV_FUZZ_SEED` the base seed.

use cxlkv_kernels::DType;
use cxlkv_runtime::format::{
    self, decode_entry, BlockHeader, IndexSlot, Superblock, BLOCK_HEADER_SIZE, INDEX_SLOT_SIZE,
    PARTICIPANT_SLOT_SIZE, PINS_PER_PARTICIPANT, PIN_SIZE,
};
use cxlkv_runtime::kv::{self, KvBlock, KvShape};
use cxlkv_runtime::{
    check, AttachOptions, Codec, Key, Participant, Pool, PoolConfig, PoolError, Region,
    SharedMemory,
};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Bytes of the pools under test: 1 MiB device area plus two partitions of 115 4-KiB blocks.
const POOL_BYTES: u64 = 2 << 20;
const BLOCK: u64 = 4096;
const PARTICIPANTS: u32 = 4;
const PARTITIONS: u32 = 2;
/// Keys put while building an image (half per partition), before replacements and deletes.
const KEYS: u64 = 190;

/// xorshift64*: small, seedable, and good enough to pick offsets and bytes.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, so that neighbouring seeds give unrelated streams.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn nonzero_byte(&mut self) -> u8 {
        1 + self.below(255) as u8
    }
}

/// Payload bytes of `key`'s `version`-th put: a pure function, so a test knows what is right.
fn payload(key: Key, version: u64, len: usize) -> Vec<u8> {
    let mut r =
        Rng::new(key.lo() ^ key.hi().rotate_left(17) ^ version.wrapping_mul(0x1234_5678_9abc));
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A typed KV block for `key`: shape and K/V derived from the key; returns (shape, k, v).
fn kv_parts(key: Key, i: u64) -> (KvShape, Vec<u8>, Vec<u8>) {
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
    let n = shape.tensor_bytes().unwrap() / dtype.size();
    let mut r = Rng::new(key.lo());
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
struct Stored {
    key: Key,
    /// Partition it was put into.
    partition: u32,
    /// Its current payload and codec, or `None` once deleted.
    value: Option<(Vec<u8>, Codec)>,
}

/// A live index entry of an image: slot → block of `len` payload bytes.
#[derive(Clone, Copy, Debug)]
struct LiveBlock {
    partition: u32,
    slot: u32,
    block: u32,
    len: u64,
}

/// A pool image: its bytes and what is in it.
struct Image {
    name: &'static str,
    bytes: Vec<u8>,
    sb: Superblock,
    keys: Vec<Stored>,
    live: Vec<LiveBlock>,
}

/// Offsets of an image's structures, computed from its superblock as docs/FORMAT.md describes.
struct Geometry(Superblock);

impl Geometry {
    fn slot(&self, q: u32) -> u64 {
        self.0.participant_table_off + u64::from(q) * PARTICIPANT_SLOT_SIZE
    }
    fn partition(&self, p: u32) -> u64 {
        self.0.partition_off + u64::from(p) * self.0.partition_stride
    }
    fn index_slot(&self, p: u32, s: u32) -> u64 {
        self.partition(p) + self.0.index_off + u64::from(s) * INDEX_SLOT_SIZE
    }
    fn header(&self, p: u32, b: u32) -> u64 {
        self.partition(p) + self.0.block_headers_off + u64::from(b) * BLOCK_HEADER_SIZE
    }
    fn payload(&self, p: u32, b: u32) -> u64 {
        self.partition(p) + self.0.payloads_off + u64::from(b) * self.0.block_size
    }
}

fn plain<T: format::Plain>(bytes: &[u8], off: u64) -> T {
    format::from_bytes(&bytes[off as usize..])
}

/// Loads `bytes` into a fresh anonymous region of `size` bytes (≥ 1).
fn load(bytes: &[u8], size: u64) -> Arc<Region> {
    let region = Region::anonymous(size).expect("anonymous region");
    let n = bytes.len().min(size as usize);
    region.write(0, &bytes[..n]).expect("load image");
    Arc::new(region)
}

fn no_heartbeat(own_partition: bool) -> AttachOptions {
    AttachOptions {
        heartbeat: false,
        own_partition,
    }
}

/// Builds a pool with raw and typed blocks, replacements, deletes, a pin, one cleanly detached
/// owner, one crashed owner and one crashed reader; `torn` leaves one live index slot mid-update
/// as an owner that died inside a seqlock write would.
fn build_image(name: &'static str, seed: u64, torn: bool) -> Image {
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
    let mut rng = Rng::new(seed);
    let mut keys = Vec::new();
    let put = |owner: &Participant, key: Key, i: u64, version: u64, rng: &mut Rng| {
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
    // Every holder died long ago (deterministic liveness, whatever the clock says later).
    for q in 0..sb.participants {
        let off = (geo.slot(q) + format::slot::HEARTBEAT) as usize;
        bytes[off..off + 8].copy_from_slice(&1u64.to_le_bytes());
    }
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
fn verify_clean(img: &Image, torn: bool) {
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

fn images() -> &'static [Image] {
    static IMAGES: OnceLock<Vec<Image>> = OnceLock::new();
    IMAGES.get_or_init(|| {
        vec![
            build_image("detached-and-crashed", 1, false),
            build_image("torn-slot", 2, true),
        ]
    })
}

/// A read result is acceptable when it is a miss or exactly one of the allowed values.
fn acceptable(got: &Option<(Vec<u8>, Codec)>, allowed: &[(Vec<u8>, Codec)]) -> bool {
    match got {
        None => true,
        Some(v) => allowed.contains(v),
    }
}

/// Where a mutation landed, for the report of a failing case.
#[derive(Clone, Debug)]
struct Mutation {
    area: &'static str,
    offset: u64,
}

/// Mutates 1-8 places of `bytes` past the superblock, biased towards the structures.
fn mutate(img: &Image, rng: &mut Rng, bytes: &mut [u8]) -> Vec<Mutation> {
    let geo = Geometry(img.sb);
    let sb = &img.sb;
    let n = 1 + rng.below(8);
    let mut done = Vec::new();
    for _ in 0..n {
        let live = img.live[rng.below(img.live.len() as u64) as usize];
        let (area, offset) = match rng.below(100) {
            0..=11 => {
                let base = geo.slot(rng.below(u64::from(sb.participants)) as u32);
                let within = match rng.below(10) {
                    0..=4 => rng.below(64),
                    5..=7 => format::slot::PINS + rng.below(4 * PIN_SIZE),
                    _ => rng.below(PARTICIPANT_SLOT_SIZE),
                };
                ("participant slot", base + within)
            }
            12..=21 => {
                let base = geo.partition(rng.below(u64::from(sb.partitions)) as u32);
                let within = if rng.chance(80) {
                    rng.below(16)
                } else {
                    rng.below(format::PARTITION_HEADER_SIZE)
                };
                ("partition header", base + within)
            }
            22..=41 => {
                let (p, s) = if rng.chance(75) {
                    (live.partition, live.slot)
                } else {
                    (
                        rng.below(u64::from(sb.partitions)) as u32,
                        rng.below(u64::from(sb.index_slots)) as u32,
                    )
                };
                (
                    "index slot",
                    geo.index_slot(p, s) + rng.below(INDEX_SLOT_SIZE),
                )
            }
            42..=61 => {
                let (p, b) = if rng.chance(75) {
                    (live.partition, live.block)
                } else {
                    (
                        rng.below(u64::from(sb.partitions)) as u32,
                        rng.below(u64::from(sb.blocks_per_partition)) as u32,
                    )
                };
                (
                    "block header",
                    geo.header(p, b) + rng.below(BLOCK_HEADER_SIZE),
                )
            }
            62..=84 => {
                let within = if live.len > 0 && rng.chance(90) {
                    rng.below(live.len)
                } else {
                    rng.below(sb.block_size)
                };
                ("payload", geo.payload(live.partition, live.block) + within)
            }
            _ => (
                "anywhere",
                format::SUPERBLOCK_SIZE + rng.below(sb.pool_size - format::SUPERBLOCK_SIZE),
            ),
        };
        let o = offset as usize;
        match rng.below(10) {
            0..=5 => bytes[o] ^= rng.nonzero_byte(),
            6..=7 => bytes[o] = rng.next() as u8,
            _ => {
                // A whole word set to a value that tends to break arithmetic.
                let w = o & !7;
                let old = u64::from_le_bytes(bytes[w..w + 8].try_into().unwrap());
                let new = match rng.below(9) {
                    0 => 0,
                    1 => 1,
                    2 => u64::MAX,
                    3 => 1 << 63,
                    4 => 1 << 40,
                    5 => old.wrapping_add(1),
                    6 => old.wrapping_sub(1),
                    7 => old ^ (1 << rng.below(64)),
                    _ => rng.next(),
                };
                bytes[w..w + 8].copy_from_slice(&new.to_le_bytes());
            }
        }
        done.push(Mutation { area, offset });
    }
    done
}

/// Why `check` must report an error for this mutated image, if it must: a live block whose index
/// slot is intact (even version) and whose header or payload bytes changed, or a live slot that
/// changed into another live-looking entry.
fn damage_expected(img: &Image, bytes: &[u8]) -> Option<String> {
    let geo = Geometry(img.sb);
    for l in &img.live {
        let so = geo.index_slot(l.partition, l.slot);
        let (old, new): (IndexSlot, IndexSlot) = (plain(&img.bytes, so), plain(bytes, so));
        if new.version & 1 == 1 {
            continue; // mid-update: readers skip it and check notes it; no damage claim
        }
        if (new.key_lo, new.key_hi, new.entry) != (old.key_lo, old.key_hi, old.entry) {
            if decode_entry(new.entry).is_some() {
                return Some(format!(
                    "live index slot {}/{} changed",
                    l.partition, l.slot
                ));
            }
            continue;
        }
        let h = geo.header(l.partition, l.block) as usize;
        if bytes[h..h + BLOCK_HEADER_SIZE as usize] != img.bytes[h..h + BLOCK_HEADER_SIZE as usize]
        {
            return Some(format!(
                "live block header {}/{} changed",
                l.partition, l.block
            ));
        }
        let p = geo.payload(l.partition, l.block) as usize;
        if bytes[p..p + l.len as usize] != img.bytes[p..p + l.len as usize] {
            return Some(format!("live payload {}/{} changed", l.partition, l.block));
        }
    }
    None
}

/// What one mutation case saw (summed into the run's report).
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    cases: u64,
    damage_expected: u64,
    damage_reported: u64,
    hits: u64,
    misses: u64,
    errors: u64,
    takeovers: u64,
    new_puts: u64,
    new_put_hits: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Tally) {
        self.cases += o.cases;
        self.damage_expected += o.damage_expected;
        self.damage_reported += o.damage_reported;
        self.hits += o.hits;
        self.misses += o.misses;
        self.errors += o.errors;
        self.takeovers += o.takeovers;
        self.new_puts += o.new_puts;
        self.new_put_hits += o.new_put_hits;
    }
}

/// Tallies one read result; an error message if it returned bytes that are not allowed.
fn read_ok(
    r: &Result<Option<(Vec<u8>, Codec)>, PoolError>,
    allowed: &[(Vec<u8>, Codec)],
    t: &mut Tally,
) -> Result<(), String> {
    match r {
        Ok(got) if acceptable(got, allowed) => {
            if got.is_some() {
                t.hits += 1
            } else {
                t.misses += 1
            }
            Ok(())
        }
        Ok(got) => Err(format!(
            "returned wrong bytes ({} bytes)",
            got.as_ref().map_or(0, |g| g.0.len())
        )),
        Err(_) => {
            t.errors += 1;
            Ok(())
        }
    }
}

/// Every read path for `key` returns a miss, an error, or exactly an allowed value.
fn read_all_ways(
    pool: &Pool,
    reader: Option<&Participant>,
    key: Key,
    allowed: &[(Vec<u8>, Codec)],
    t: &mut Tally,
) -> Result<(), String> {
    let mut note = |r: &Result<Option<(Vec<u8>, Codec)>, PoolError>, how: &str| {
        read_ok(r, allowed, t).map_err(|m| format!("{how} of key {key} {m}"))
    };
    let got = pool.get(key).map(|o| o.map(|(v, i)| (v, i.codec)));
    note(&got, "Pool::get")?;
    if let Ok(Some((v, Codec::KvV1))) = &got {
        KvBlock::parse(v)
            .map_err(|e| format!("typed block of key {key} read back but does not parse: {e}"))?;
    }
    let mut buf = vec![0u8; BLOCK as usize];
    let got = pool
        .get_into(key, &mut buf)
        .map(|o| o.map(|i| (buf[..i.len as usize].to_vec(), i.codec)));
    note(&got, "Pool::get_into")?;
    if let Some(r) = reader {
        let got = r.get(key).map(|o| o.map(|(v, i)| (v, i.codec)));
        note(&got, "Participant::get")?;
        let got = r.pin(key).and_then(|o| {
            o.map(|pin| {
                let mut v = vec![0u8; pin.len() as usize];
                pin.read(0, &mut v).map(|()| (v, pin.info().codec))
            })
            .transpose()
        });
        note(&got, "Participant::pin")?;
    }
    // In-place readers: a validated header plus a verified payload must be the right bytes.
    if let Ok(Some(r)) = pool.block_ref(key) {
        if matches!(pool.verify_payload(&r), Ok(true)) {
            let mut v = vec![0u8; r.header.len as usize];
            pool.memory()
                .read(r.payload_off, &mut v)
                .map_err(|e| e.to_string())?;
            let codec = Codec::from_code(r.header.codec).ok_or("block_ref passed a bad codec")?;
            note(&Ok(Some((v, codec))), "block_ref + verify_payload")?;
        }
    }
    Ok(())
}

/// One random mutation case: returns its tally, or a description of the property it broke.
/// `scratch` holds a copy of the image on entry and on return (only mutated words are restored).
fn run_random_case(img: &Image, seed: u64, scratch: &mut [u8]) -> Result<Tally, String> {
    let mut rng = Rng::new(seed);
    let mutations = mutate(img, &mut rng, scratch);
    let result = run_case(img, &mut rng, scratch, &mutations);
    for m in &mutations {
        let w = (m.offset & !7) as usize;
        scratch[w..w + 8].copy_from_slice(&img.bytes[w..w + 8]);
    }
    result
}

/// Runs every check on a mutated image `bytes` of `img`; `rng` picks write sizes.
fn run_case(
    img: &Image,
    rng: &mut Rng,
    bytes: &[u8],
    mutations: &[Mutation],
) -> Result<Tally, String> {
    let seed = rng.next();
    let places: Vec<String> = mutations
        .iter()
        .map(|m| format!("{} @ {:#x}", m.area, m.offset))
        .collect();
    let ctx = |m: String| format!("{m}\n  image {}, mutated {}", img.name, places.join(", "));
    let mut t = Tally {
        cases: 1,
        ..Default::default()
    };
    let pool = Pool::open(load(bytes, POOL_BYTES))
        .map_err(|e| ctx(format!("open failed with an intact superblock: {e}")))?;

    let report = check(&pool).map_err(|e| ctx(format!("check failed: {e}")))?;
    if let Some(why) = damage_expected(img, bytes) {
        t.damage_expected += 1;
        if report.ok() {
            return Err(ctx(format!("check reports no damage, but {why}")));
        }
    }
    if !report.ok() {
        t.damage_reported += 1;
    }

    let mut allowed: HashMap<Key, Vec<(Vec<u8>, Codec)>> = img
        .keys
        .iter()
        .map(|s| (s.key, s.value.iter().cloned().collect()))
        .collect();
    let keys: Vec<Key> = img.keys.iter().map(|s| s.key).collect();
    let mut buf = vec![0u8; BLOCK as usize];
    for (i, &k) in keys.iter().enumerate() {
        if i % 3 == 0 {
            read_all_ways(&pool, None, k, &allowed[&k], &mut t).map_err(ctx)?;
        } else {
            let got = pool
                .get_into(k, &mut buf)
                .map(|o| o.map(|i| (buf[..i.len as usize].to_vec(), i.codec)));
            read_ok(&got, &allowed[&k], &mut t)
                .map_err(|m| ctx(format!("Pool::get_into of key {k}: {m}")))?;
        }
    }

    // Take over the damaged partitions (recovery runs on the mutated index), then write and read.
    let mut owners = Vec::new();
    for _ in 0..PARTITIONS {
        if let Ok(p) = Participant::attach(&pool, no_heartbeat(true)) {
            if p.partition().is_some() {
                t.takeovers += 1;
            }
            owners.push(p);
        }
    }
    for (n, x) in owners.iter().enumerate() {
        let Some(part) = x.partition() else { continue };
        let own: Vec<Key> = img
            .keys
            .iter()
            .filter(|s| s.partition == part)
            .map(|s| s.key)
            .collect();
        for (i, &k) in own.iter().enumerate().take(12) {
            if i % 3 == 2 {
                if let Ok(_found) = x.delete(k) {
                    allowed.insert(k, Vec::new());
                }
            } else {
                let bytes = payload(k, 3, 1 + rng.below(BLOCK) as usize);
                match x.put(k, &bytes) {
                    Ok(_) => {
                        allowed.insert(k, vec![(bytes, Codec::Raw)]);
                    }
                    Err(_) => allowed.get_mut(&k).unwrap().push((bytes, Codec::Raw)),
                }
            }
        }
        // Enough new keys to force evictions in a nearly full partition.
        for i in 0..30u64 {
            let k = Key::from_bytes(
                &[
                    b"new".as_slice(),
                    &seed.to_le_bytes(),
                    &[n as u8],
                    &i.to_le_bytes(),
                ]
                .concat(),
            );
            let len = if rng.chance(15) {
                BLOCK
            } else {
                rng.below(300)
            };
            let bytes = payload(k, 1, len as usize);
            let ok = x.put(k, &bytes).is_ok();
            allowed.insert(k, vec![(bytes, Codec::Raw)]);
            if ok {
                t.new_puts += 1;
                match x.get(k) {
                    Ok(Some((v, _))) if allowed[&k].iter().any(|a| a.0 == v) => t.new_put_hits += 1,
                    Ok(Some(_)) => {
                        return Err(ctx(format!("fresh put of {k} reads back wrong bytes")))
                    }
                    _ => {}
                }
            }
        }
    }
    // After the takeover, every fifth key through every read path of the pool and a participant.
    let reader = owners.first();
    for &k in keys.iter().skip((seed % 5) as usize).step_by(5) {
        read_all_ways(&pool, reader, k, &allowed[&k], &mut t).map_err(ctx)?;
    }
    check(&pool).map_err(|e| ctx(format!("check after takeover failed: {e}")))?;
    Ok(t)
}

fn panic_text(e: &Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_flips_are_reported_and_never_return_wrong_bytes() {
    let imgs = images();
    let cases = env_u64("CXLKV_FUZZ_CASES", 5000);
    let base = env_u64("CXLKV_FUZZ_SEED", 0x00c0_ffee);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4) as u64;
    let start = Instant::now();
    let results: Vec<(Tally, Vec<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|th| {
                s.spawn(move || {
                    let mut tally = Tally::default();
                    let mut failures = Vec::new();
                    let mut scratch: Vec<Vec<u8>> = imgs.iter().map(|i| i.bytes.clone()).collect();
                    for i in (th..cases).step_by(threads as usize) {
                        let seed = base.wrapping_mul(0x1_0000_0001).wrapping_add(i);
                        let which = (i % imgs.len() as u64) as usize;
                        let img = &imgs[which];
                        let bytes = &mut scratch[which];
                        match catch_unwind(AssertUnwindSafe(|| run_random_case(img, seed, bytes))) {
                            Ok(Ok(t)) => tally += t,
                            Ok(Err(why)) => {
                                failures.push(format!("case {i} seed {seed:#x}: {why}"))
                            }
                            Err(e) => {
                                failures.push(format!(
                                    "case {i} seed {seed:#x}: PANICKED: {}, image {}",
                                    panic_text(&e),
                                    img.name
                                ));
                                bytes.copy_from_slice(&img.bytes);
                            }
                        }
                        if failures.len() >= 5 {
                            break;
                        }
                    }
                    (tally, failures)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut total = Tally::default();
    let mut failures = Vec::new();
    for (t, f) in results {
        total += t;
        failures.extend(f);
    }
    println!(
        "{} mutation cases in {:.1?} (base seed {base:#x}; rerun one with CXLKV_FUZZ_SEED/CXLKV_FUZZ_CASES): {total:?}",
        total.cases,
        start.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} failing case(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(total.cases, cases);
    // The run must have exercised what it claims: damage to detect, hits, takeovers, fresh writes.
    assert!(total.damage_expected > cases / 4 && total.hits > 0 && total.takeovers > cases);
    assert!(
        total.new_put_hits > total.new_puts / 2,
        "fresh puts after takeover mostly read back: {total:?}"
    );
}

#[test]
fn extreme_values_in_structure_words_never_panic() {
    // Deterministic complement of the random cases: every word of the participant slots (header
    // line and first pins), partition headers, and some live index slots and block headers, set to
    // values that break careless arithmetic.
    let values = [
        0,
        1,
        u64::MAX,
        1 << 63,
        1 << 40,
        format::MAX_SEQ,
        format::MAX_SEQ + 1,
    ];
    let mut failures = Vec::new();
    let mut cases = 0;
    for img in images() {
        let geo = Geometry(img.sb);
        let mut words: Vec<(&'static str, u64)> = Vec::new();
        for q in 0..img.sb.participants {
            words.extend((0..8).map(|w| ("participant slot", geo.slot(q) + 8 * w)));
            words.extend((0..4).map(|w| ("pin", geo.slot(q) + format::slot::PINS + 8 * w)));
        }
        for p in 0..img.sb.partitions {
            words.extend([
                ("partition owner", geo.partition(p)),
                ("partition next seq", geo.partition(p) + 8),
            ]);
        }
        for l in img.live.iter().step_by(img.live.len() / 3) {
            words.extend(
                (0..4).map(|w| ("index slot", geo.index_slot(l.partition, l.slot) + 8 * w)),
            );
            words
                .extend((0..8).map(|w| ("block header", geo.header(l.partition, l.block) + 8 * w)));
        }
        for &(area, offset) in &words {
            for value in values {
                let mut bytes = img.bytes.clone();
                bytes[offset as usize..offset as usize + 8].copy_from_slice(&value.to_le_bytes());
                if bytes == img.bytes {
                    continue;
                }
                cases += 1;
                let m = [Mutation { area, offset }];
                let mut rng = Rng::new(offset ^ value);
                match catch_unwind(AssertUnwindSafe(|| run_case(img, &mut rng, &bytes, &m))) {
                    Ok(Ok(_)) => {}
                    Ok(Err(why)) => {
                        failures.push(format!("{area} word at {offset:#x} = {value:#x}: {why}"))
                    }
                    Err(e) => failures.push(format!(
                        "{area} word at {offset:#x} = {value:#x}: PANICKED: {}",
                        panic_text(&e)
                    )),
                }
            }
        }
    }
    println!("{cases} extreme-value cases");
    assert!(
        failures.is_empty(),
        "{} failing case(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(cases > 1000);
}

#[test]
fn truncated_images_are_refused() {
    let img = &images()[0];
    let pool_size = img.sb.pool_size;
    let mut rng = Rng::new(7);
    let mut lens = vec![
        1,
        8,
        255,
        256,
        4095,
        4096,
        4097,
        8192,
        1 << 20,
        pool_size - 4096,
        pool_size - 1,
    ];
    lens.extend((0..300).map(|_| 1 + rng.below(pool_size - 1)));
    for len in lens {
        let needed = if len < format::SUPERBLOCK_SIZE {
            format::SUPERBLOCK_SIZE
        } else {
            pool_size
        };
        match Pool::open(load(&img.bytes, len)) {
            Err(PoolError::Truncated { size, needed: n }) if size == len && n == needed => {}
            other => panic!("truncated to {len} bytes: expected Truncated, got {other:?}"),
        }
    }
}

#[test]
fn other_formats_are_refused() {
    let mut rng = Rng::new(11);
    let size = 64 << 10;
    let random: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
    let mut with_header = |header: &[u8]| {
        let mut v: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
        v[..header.len()].copy_from_slice(header);
        v
    };
    let files = [
        ("zeroes", vec![0u8; size]),
        ("random bytes", random),
        ("PNG", with_header(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")),
        ("ELF", with_header(b"\x7fELF\x02\x01\x01\0")),
        ("gzip", with_header(b"\x1f\x8b\x08\0")),
        ("near-miss magic", with_header(b"CXLKVPL1")),
        ("lower-case magic", with_header(b"cxlkvpl\0")),
    ];
    for (what, bytes) in files {
        match Pool::open(load(&bytes, size as u64)) {
            Err(e @ PoolError::BadMagic { found }) => {
                assert_eq!(found[..], bytes[..8], "{what}");
                assert!(e.to_string().contains("not a cxlkv pool"), "{what}: {e}");
            }
            other => panic!("{what}: expected BadMagic, got {other:?}"),
        }
    }
    // Right magic, nothing else: version 0.0.
    let mut bare = vec![0u8; size];
    bare[..8].copy_from_slice(&format::MAGIC);
    assert!(matches!(
        Pool::open(load(&bare, size as u64)),
        Err(PoolError::UnsupportedVersion { major: 0, minor: 0 })
    ));
}

fn with_superblock(img: &Image, edit: impl FnOnce(&mut Superblock), fix_crc: bool) -> Vec<u8> {
    let mut sb = img.sb;
    edit(&mut sb);
    if fix_crc {
        sb.crc = sb.compute_crc();
    }
    let mut bytes = img.bytes.clone();
    bytes[..std::mem::size_of::<Superblock>()].copy_from_slice(format::as_bytes(&sb));
    bytes
}

fn reads_back_exactly(pool: &Pool, img: &Image) {
    for s in &img.keys {
        let got = pool.get(s.key).unwrap().map(|(v, i)| (v, i.codec));
        assert_eq!(got, s.value, "key {} in image {}", s.key, img.name);
    }
}

#[test]
fn other_major_versions_are_refused_minor_versions_read() {
    let img = &images()[0];
    for major in [0u16, 2, 3, 0x100, 0xffff] {
        for fix_crc in [true, false] {
            let bytes = with_superblock(img, |sb| sb.version_major = major, fix_crc);
            match Pool::open(load(&bytes, POOL_BYTES)) {
                Err(e @ PoolError::UnsupportedVersion { major: m, minor: 0 }) if m == major => {
                    assert!(e.to_string().contains("unsupported pool format"), "{e}")
                }
                other => panic!("major {major}: expected UnsupportedVersion, got {other:?}"),
            }
        }
    }
    // A newer minor version of v1 only adds what v1 readers may ignore.
    for minor in [1u16, 7, 0xffff] {
        let bytes = with_superblock(img, |sb| sb.version_minor = minor, true);
        let pool = Pool::open(load(&bytes, POOL_BYTES)).unwrap();
        reads_back_exactly(&pool, img);
    }
}

#[test]
fn superblock_flips_are_refused_with_a_clear_error() {
    let img = &images()[0];
    let size = std::mem::size_of::<Superblock>();
    let mut rng = Rng::new(13);
    let mut tried = 0;
    let mut cases: Vec<Vec<(usize, u8)>> = Vec::new();
    for off in 0..size {
        for mask in [0x01, 0x80, 0xff, rng.nonzero_byte()] {
            cases.push(vec![(off, mask)]);
        }
    }
    for _ in 0..2000 {
        let n = 1 + rng.below(8) as usize;
        cases.push(
            (0..n)
                .map(|_| (rng.below(size as u64) as usize, rng.nonzero_byte()))
                .collect(),
        );
    }
    for flips in cases {
        let mut bytes = img.bytes.clone();
        for &(off, mask) in &flips {
            bytes[off] ^= mask;
        }
        if bytes[..size] == img.bytes[..size] {
            continue; // two flips cancelled out
        }
        tried += 1;
        let first = flips.iter().map(|f| f.0).min().unwrap();
        let magic_changed = bytes[..8] != img.bytes[..8];
        let major_changed = bytes[8..10] != img.bytes[8..10];
        match Pool::open(load(&bytes, POOL_BYTES)) {
            Err(PoolError::BadMagic { .. }) if magic_changed => {}
            Err(PoolError::UnsupportedVersion { .. }) if !magic_changed && major_changed => {}
            Err(PoolError::SuperblockCrc { .. }) if !magic_changed && !major_changed => {}
            // Only the word after the CRC is outside it.
            Err(PoolError::Geometry(m))
                if first >= Superblock::CRC_OFF + 4 && m.contains("after the CRC") => {}
            other => panic!("superblock flips {flips:x?}: expected a clear refusal, got {other:?}"),
        }
    }
    assert!(tried > 3000);
    // The rest of the superblock page is reserved: ignored by v1 readers, not covered by the CRC.
    for _ in 0..200 {
        let mut bytes = img.bytes.clone();
        let off = size + rng.below(format::SUPERBLOCK_SIZE - size as u64) as usize;
        bytes[off] ^= rng.nonzero_byte();
        reads_back_exactly(&Pool::open(load(&bytes, POOL_BYTES)).unwrap(), img);
    }
}

#[test]
fn forged_superblocks_with_valid_crc_never_panic() {
    // A superblock whose CRC was recomputed after editing: only a consistent geometry may open,
    // and what opens must be usable without a panic.
    let img = &images()[0];
    let mut rng = Rng::new(17);
    let mut opened = 0;
    for _ in 0..2000 {
        let mut word_rng = rng.clone();
        let bytes = with_superblock(
            img,
            |sb| {
                let raw = format::as_bytes(sb).to_vec();
                let mut raw = raw;
                for _ in 0..1 + word_rng.below(3) {
                    // Any field after the version words, up to the CRC.
                    let off = 12 + word_rng.below(Superblock::CRC_OFF as u64 - 12) as usize;
                    match word_rng.below(3) {
                        0 => raw[off] ^= word_rng.nonzero_byte(),
                        1 => raw[off] = 0,
                        _ => {
                            let w = off & !3;
                            raw[w..w + 4].copy_from_slice(
                                &(word_rng.next() as u32 >> word_rng.below(32)).to_le_bytes(),
                            )
                        }
                    }
                }
                *sb = format::from_bytes(&raw);
            },
            true,
        );
        rng.next();
        rng = word_rng;
        let result = catch_unwind(AssertUnwindSafe(|| {
            if let Ok(pool) = Pool::open(load(&bytes, POOL_BYTES)) {
                check(&pool).unwrap();
                for s in img.keys.iter().take(20) {
                    let _ = pool.get(s.key);
                }
                drop(Participant::attach(&pool, no_heartbeat(true)));
                true
            } else {
                false
            }
        }));
        match result {
            Ok(true) => opened += 1,
            Ok(false) => {}
            Err(_) => panic!("forged superblock panicked: {:x?}", &bytes[..256]),
        }
    }
    // Benign fields (uuid, creation time, lease, reserved words) still open.
    assert!(opened > 0 && opened < 2000, "opened {opened} of 2000");
}

#[test]
fn misuse_returns_typed_errors() {
    // Complements pool_api.rs (put too large, no free slot, bad config, read-only put, empty chain).
    let cfg = PoolConfig {
        block_size: BLOCK,
        participants: 2,
        lease: Duration::from_millis(20),
        ..Default::default()
    };
    let pool = Pool::create(Arc::new(Region::anonymous(POOL_BYTES).unwrap()), &cfg).unwrap();
    let a = Participant::attach(&pool, no_heartbeat(true)).unwrap();
    let k = Key::from_bytes(b"k");
    assert!(
        matches!(a.reserve(k, BLOCK + 1, Codec::Raw), Err(PoolError::PayloadTooLarge { len, capacity: BLOCK }) if len == BLOCK + 1)
    );
    let big = KvShape {
        dtype: DType::F32,
        layer: 0,
        kv_heads: 4,
        head_dim: 64,
        tokens: 16,
        sequence: 0,
        token_offset: 0,
    };
    let t = big.tensor_bytes().unwrap();
    assert!(matches!(
        a.put_kv(k, &big, &vec![0; t], &vec![0; t]),
        Err(PoolError::PayloadTooLarge { .. })
    ));
    let small = KvShape {
        tokens: 1,
        kv_heads: 1,
        head_dim: 8,
        ..big
    };
    assert!(matches!(
        a.put_kv(k, &small, &[0; 8], &[0; 32]),
        Err(PoolError::BadKvBlock(_))
    ));
    assert!(matches!(
        a.put_kv(k, &KvShape { tokens: 0, ..small }, &[], &[]),
        Err(PoolError::BadKvBlock(_))
    ));
    assert!(matches!(
        KvBlock::parse(&[0xab; 100]),
        Err(PoolError::BadKvBlock(_))
    ));
    assert!(matches!(
        pool.lookup_prefix(&[]),
        Err(PoolError::EmptyKeyChain)
    ));
    assert!(a.put(k, b"x").is_ok());
    assert!(matches!(
        a.get_into(k, &mut []),
        Err(PoolError::BufferTooSmall {
            needed: 1,
            capacity: 0
        })
    ));

    // A reader owns no partition: every write is refused.
    let r = Participant::attach(&pool, no_heartbeat(false)).unwrap();
    assert!(matches!(r.delete(k), Err(PoolError::NoPartition { .. })));
    assert!(matches!(
        r.reserve(k, 1, Codec::Raw),
        Err(PoolError::NoPartition { .. })
    ));
    // Pins are bounded per participant.
    let pins: Vec<_> = (0..PINS_PER_PARTICIPANT)
        .map(|_| r.pin(k).unwrap().unwrap())
        .collect();
    assert!(matches!(r.pin(k), Err(PoolError::PinTableFull(n)) if n == PINS_PER_PARTICIPANT));
    drop(pins);
    assert!(r.pin(k).unwrap().is_some());
    drop(r);

    drop(a);
}

#[test]
fn fenced_participant_cannot_write_or_disturb_its_successor() {
    let cfg = PoolConfig {
        block_size: BLOCK,
        participants: 3,
        partitions: Some(1),
        lease: Duration::from_millis(20),
        ..Default::default()
    };
    let pool = Pool::create(Arc::new(Region::anonymous(POOL_BYTES).unwrap()), &cfg).unwrap();
    let a = Participant::attach(&pool, no_heartbeat(true)).unwrap();
    let k = Key::from_bytes(b"k");
    a.put(k, b"x").unwrap();
    // `a` stops beating: after the lease it is presumed dead, and `b` takes its slot and partition.
    std::thread::sleep(Duration::from_millis(60));
    let b = pool.attach().unwrap();
    assert_eq!((b.id(), b.partition()), (a.id(), Some(0)));
    assert!(matches!(a.put(k, b"late"), Err(PoolError::Fenced { .. })));
    assert!(matches!(a.delete(k), Err(PoolError::Fenced { .. })));
    assert_eq!(pool.get(k).unwrap().unwrap().0, b"x");
    // The zombie detaching must not touch the slot it lost: `b` keeps its partition.
    drop(a);
    let c = pool.attach().unwrap();
    assert_eq!(c.partition(), None, "a live owner's partition was taken");
    b.put(k, b"y").unwrap();
    assert_eq!(c.get(k).unwrap().unwrap().0, b"y");
}
