//! The shared KV block pool: geometry, create/open with validation, and the optimistic read path.
//!
//! A [`Pool`] is a handle on pool memory that anyone may read. Writing needs a
//! [`Participant`](crate::participant::Participant) (see [`Pool::attach`]): a slot in the
//! participant table and, usually, one data partition that it alone writes.
//!
//! Reads are optimistic and write nothing shared: find the key's index slot (seqlock version
//! `v`), copy the block header and payload, check key, sequence number and CRCs, re-read the slot
//! and accept only if its version is still `v`. Anything else is retried a bounded number of times
//! and then reported as a miss, so a torn, stale or foreign copy is never returned.

use crate::clock::{Clock, SystemClock};
use crate::coherence::{self, Site};
use crate::format::{
    self, decode_entry, BlockHeader, Codec, CoherenceMode, Superblock, BLOCK_HEADER_SIZE,
    DEVICE_AREA_SIZE, ENTRY_EMPTY, ENTRY_TOMBSTONE, INDEX_SLOT_SIZE, MAGIC,
    MAX_BLOCKS_PER_PARTITION, MAX_PINS, PAGE, PARTITION_HEADER_SIZE, SUPERBLOCK_SIZE,
    VERSION_MAJOR, VERSION_MINOR,
};
use crate::key::Key;
use crate::sync::{fence, spin_loop, Ordering};
use crate::watch::Watch;
use cxlkv_shm::mem::read_obj;
use cxlkv_shm::mem::{MemError, Result as MemResult, SharedMemory};
use cxlkv_shm::region::{Access, Backend, Region, RegionError, RegionOptions};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// Errors of pool operations.
#[derive(Debug, Error)]
pub enum PoolError {
    /// Mapping the pool's memory failed.
    #[error(transparent)]
    Region(#[from] RegionError),
    /// A shared-memory access was out of range (a corrupt structure pointed outside the pool).
    #[error(transparent)]
    Mem(#[from] MemError),
    /// The memory is smaller than the pool it claims to hold, or than a superblock.
    #[error("pool truncated: memory has {size} bytes, the pool needs {needed}")]
    Truncated {
        /// Bytes available.
        size: u64,
        /// Bytes required.
        needed: u64,
    },
    /// Not a cxlkv pool.
    #[error("not a cxlkv pool: magic {found:02x?}, expected {MAGIC:02x?}")]
    BadMagic {
        /// The bytes found at offset 0.
        found: [u8; 8],
    },
    /// A pool of a format version this build cannot read.
    #[error("unsupported pool format {major}.{minor}; this build reads {VERSION_MAJOR}.x{}", version_hint(*.major))]
    UnsupportedVersion {
        /// Major version found.
        major: u16,
        /// Minor version found.
        minor: u16,
    },
    /// The superblock's CRC does not match its bytes.
    #[error("superblock corrupt: stored CRC {stored:#010x}, computed {computed:#010x}")]
    SuperblockCrc {
        /// CRC in the superblock.
        stored: u32,
        /// CRC of its bytes.
        computed: u32,
    },
    /// The superblock's geometry is inconsistent.
    #[error("superblock geometry invalid: {0}")]
    Geometry(String),
    /// A coherence mode this build does not implement.
    #[error("pool coherence mode {0} is not supported by this build")]
    UnsupportedCoherence(u32),
    /// Parameters of `create` that cannot make a pool.
    #[error("bad pool configuration: {0}")]
    BadConfig(String),
    /// A payload larger than a block.
    #[error("payload of {len} bytes exceeds the {capacity} bytes that fit (one block for a reservation, a typed KV block or a pin; the partition's room for an object put)")]
    PayloadTooLarge {
        /// Payload length.
        len: u64,
        /// Block capacity.
        capacity: u64,
    },
    /// A reservation committed with an expected CRC-32C (the first value) that its bytes do not
    /// have (their CRC-32C, the second).
    #[error("payload CRC-32C {1:#010x} is not the expected {0:#010x}; nothing was published")]
    PayloadCrc(u32, u32),
    /// The caller's buffer cannot hold the block.
    #[error("buffer of {capacity} bytes is too small for a block of {needed} bytes")]
    BufferTooSmall {
        /// Bytes the block needs.
        needed: u64,
        /// Bytes the buffer has.
        capacity: u64,
    },
    /// `lookup_prefix` of an empty chain.
    #[error("empty key chain")]
    EmptyKeyChain,
    /// Every participant slot is held by a live participant.
    #[error("all {0} participant slots are in use")]
    NoFreeParticipant(u32),
    /// This participant owns no partition (all are held by live participants), so it cannot write.
    #[error("participant {participant} owns no partition: all are held by live participants")]
    NoPartition {
        /// The participant.
        participant: u32,
    },
    /// The participant's partition was taken over by another (this one was presumed dead).
    #[error("partition {partition} was taken over (generation now {generation}); this participant is fenced")]
    Fenced {
        /// The partition.
        partition: u32,
        /// Its current owner generation.
        generation: u32,
    },
    /// The key lives in a partition this participant does not own.
    #[error("key {key} lives in partition {partition}, which this participant does not own")]
    NotOwner {
        /// The key.
        key: Key,
        /// Its partition.
        partition: u32,
    },
    /// The participant holds as many pins as its pin table has entries.
    #[error(
        "pin table full: this participant holds all {0} pins of its table (the pool's \
         pins_per_participant; create the pool with a larger one, e.g. `cxlkv pool create --pins N`, \
         or release pins sooner)"
    )]
    PinTableFull(u64),
    /// No block can be freed: every block of the partition is pinned.
    #[error("partition {0} is full and every block is pinned")]
    PartitionFull(u32),
    /// A typed KV block whose layout does not fit its payload.
    #[error("bad KV block: {0}")]
    BadKvBlock(String),
    /// A put of a tenant at its quota, with none of its own blocks left to evict.
    #[error(
        "tenant {tenant} is at its quota of {quota} blocks and has no unpinned block of its own \
         to evict (raise it with `cxlkv pool tenant set POOL NAME --quota BLOCKS`)"
    )]
    QuotaExceeded {
        /// The tenant's id.
        tenant: u32,
        /// Its quota in blocks.
        quota: u64,
    },
    /// A tenant that is not declared where it must be.
    #[error(
        "tenant {0:?} is not declared in this pool: declare it (`cxlkv pool create --tenant NAME`, \
         `cxlkv pool tenant add`); a software-coherent pool registers no tenant on attach"
    )]
    UnknownTenant(String),
    /// The pool's tenant table has no free entry.
    #[error("the pool's tenant table is full (all {0} entries declared)")]
    TenantTableFull(u32),
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, PoolError>;

/// What an [`PoolError::UnsupportedVersion`] message adds for a known older format.
fn version_hint(major: u16) -> &'static str {
    match major {
        1 => {
            " (format 1 pools hold wall-clock heartbeats, which format 2 replaced with counters; \
              detach every participant and create the pool again)"
        }
        2 => {
            " (format 2 pools lack the claim words and generation-tagged index slots that fence a \
              writer held up mid-write, and their block headers carry the CRC over other bytes; \
              detach every participant and create the pool again)"
        }
        _ => "",
    }
}

/// Parameters of a new pool.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Payload capacity of a block; a multiple of 4 KiB.
    pub block_size: u64,
    /// Participant slots.
    pub participants: u32,
    /// Data partitions (default: one per participant).
    pub partitions: Option<u32>,
    /// A participant whose heartbeat counter an observer watched stand still for longer than this
    /// (on the observer's own monotonic clock) is dead and may be taken over.
    pub lease: Duration,
    /// Coherence mode recorded in the superblock.
    pub coherence: CoherenceMode,
    /// Pins each participant can hold at once: its pin table's entries (0 = the default,
    /// [`format::DEFAULT_PINS`]; at most [`format::MAX_PINS`]). The participant slot grows with it.
    pub pins_per_participant: u32,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            block_size: 256 << 10,
            participants: 8,
            partitions: None,
            lease: Duration::from_secs(2),
            coherence: CoherenceMode::Hardware,
            pins_per_participant: 0,
        }
    }
}

const MIN_POOL_FOR_SB: u64 = SUPERBLOCK_SIZE;
const PARTITION_ALIGN: u64 = 64 << 10;
/// Optimistic-read attempts before a get reports a miss.
pub const READ_RETRIES: u32 = 16;
const SEQLOCK_SPINS: u32 = 1000;

fn round_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

/// Byte layout of a partition holding `blocks` blocks: (index_off, headers_off, payloads_off, size).
fn partition_layout(blocks: u64, block_size: u64) -> Option<(u64, u64, u64, u64, u64)> {
    let slots = (blocks.checked_mul(2)?)
        .max(2)
        .checked_next_power_of_two()?;
    let index_off = PARTITION_HEADER_SIZE;
    let headers_off = round_up(
        index_off.checked_add(slots.checked_mul(INDEX_SLOT_SIZE)?)?,
        PAGE,
    )?;
    let payloads_off = round_up(
        headers_off.checked_add(blocks.checked_mul(BLOCK_HEADER_SIZE)?)?,
        PAGE,
    )?;
    let size = round_up(
        payloads_off.checked_add(blocks.checked_mul(block_size)?)?,
        PAGE,
    )?;
    Some((slots, index_off, headers_off, payloads_off, size))
}

/// Plans the superblock of a pool of `size` bytes.
pub fn plan(size: u64, cfg: &PoolConfig) -> Result<Superblock> {
    let bad = |m: String| Err(PoolError::BadConfig(m));
    if cfg.block_size == 0 || !cfg.block_size.is_multiple_of(PAGE) {
        return bad(format!(
            "block size {} is not a positive multiple of 4096",
            cfg.block_size
        ));
    }
    if cfg.participants == 0 || cfg.participants > 4096 {
        return bad(format!(
            "participants must be 1..=4096, got {}",
            cfg.participants
        ));
    }
    let partitions = cfg.partitions.unwrap_or(cfg.participants);
    if partitions == 0 || partitions > 4096 {
        return bad(format!("partitions must be 1..=4096, got {partitions}"));
    }
    let lease_ns = u64::try_from(cfg.lease.as_nanos()).unwrap_or(u64::MAX);
    if lease_ns < 1_000_000 {
        return bad("lease must be at least 1 ms".into());
    }
    if cfg.pins_per_participant > MAX_PINS {
        return bad(format!(
            "pins per participant must be 1..={MAX_PINS} (0 = the default {}), got {}",
            format::DEFAULT_PINS,
            cfg.pins_per_participant
        ));
    }
    let pins = if cfg.pins_per_participant == 0 {
        format::DEFAULT_PINS
    } else {
        cfg.pins_per_participant
    };
    let table_off = SUPERBLOCK_SIZE;
    let device_area_off =
        table_off + u64::from(cfg.participants) * format::SlotLayout::new(pins).size;
    let partition_off = round_up(device_area_off + DEVICE_AREA_SIZE, PARTITION_ALIGN).unwrap();
    let per_partition = size.saturating_sub(partition_off) / u64::from(partitions) / PAGE * PAGE;
    let fits = |b: u64| partition_layout(b, cfg.block_size).is_some_and(|l| l.4 <= per_partition);
    // Largest block count that fits: binary search over [0, per_partition / block_size].
    let (mut lo, mut hi) = (
        0u64,
        (per_partition / cfg.block_size).min(MAX_BLOCKS_PER_PARTITION),
    );
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid
        } else {
            hi = mid - 1
        }
    }
    if lo == 0 {
        // Saturating: a huge block size must get this message, not an overflow panic.
        let need = partition_layout(1, cfg.block_size)
            .map_or(0, |l| l.4)
            .saturating_mul(u64::from(partitions))
            .saturating_add(partition_off);
        return bad(format!(
            "{size} bytes cannot hold {partitions} partitions of at least one {}-byte block (need about {need})",
            cfg.block_size
        ));
    }
    let (slots, index_off, headers_off, payloads_off, stride) =
        partition_layout(lo, cfg.block_size).expect("fits");
    let mut sb = Superblock {
        magic: MAGIC,
        version_major: VERSION_MAJOR,
        version_minor: VERSION_MINOR,
        coherence: cfg.coherence as u32,
        uuid: random_uuid(),
        pool_size: partition_off + u64::from(partitions) * stride,
        block_size: cfg.block_size,
        participants: cfg.participants,
        partitions,
        blocks_per_partition: lo as u32,
        index_slots: slots as u32,
        participant_table_off: table_off,
        device_area_off,
        device_area_size: DEVICE_AREA_SIZE,
        partition_off,
        partition_stride: stride,
        index_off,
        block_headers_off: headers_off,
        payloads_off,
        lease_ns,
        created_ns: now_ns(),
        pins_per_participant: pins,
        ..Default::default()
    };
    sb.crc = sb.compute_crc();
    Ok(sb)
}

/// Nanoseconds since the Unix epoch on this host's wall clock (see [`crate::clock`]).
pub fn now_ns() -> u64 {
    crate::clock::system_now_ns()
}

fn random_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if f.read_exact(&mut u).is_ok() {
            return u;
        }
    }
    let k = Key::from_bytes(
        &[
            now_ns().to_le_bytes(),
            u64::from(std::process::id()).to_le_bytes(),
        ]
        .concat(),
    );
    k.0.to_le_bytes()
}

/// Validates a superblock against the memory it was read from.
pub fn validate_superblock(sb: &Superblock, mem_size: u64) -> Result<()> {
    if sb.magic != MAGIC {
        return Err(PoolError::BadMagic { found: sb.magic });
    }
    if sb.version_major != VERSION_MAJOR {
        return Err(PoolError::UnsupportedVersion {
            major: sb.version_major,
            minor: sb.version_minor,
        });
    }
    let computed = sb.compute_crc();
    if computed != sb.crc {
        return Err(PoolError::SuperblockCrc {
            stored: sb.crc,
            computed,
        });
    }
    // The one word of the superblock outside its CRC must be zero, so that no flipped byte of the
    // 256-byte superblock goes unnoticed (it used to be ignored).
    if sb.reserved2 != 0 {
        return Err(PoolError::Geometry(format!(
            "reserved word after the CRC is {:#x}, expected 0",
            sb.reserved2
        )));
    }
    CoherenceMode::from_code(sb.coherence).ok_or(PoolError::UnsupportedCoherence(sb.coherence))?;
    // Recompute the geometry from the counts and require the stored offsets to match exactly: a
    // superblock that passes is one `plan` could have written, so every derived offset is sane.
    let geo = |m: &str| PoolError::Geometry(m.to_string());
    if sb.block_size == 0 || !sb.block_size.is_multiple_of(PAGE) {
        return Err(geo("block size is not a positive multiple of 4096"));
    }
    if sb.participants == 0 || sb.participants > 4096 || sb.partitions == 0 || sb.partitions > 4096
    {
        return Err(geo("participant or partition count out of range"));
    }
    if sb.blocks_per_partition == 0 || u64::from(sb.blocks_per_partition) > MAX_BLOCKS_PER_PARTITION
    {
        return Err(geo("blocks per partition out of range"));
    }
    let (slots, index_off, headers_off, payloads_off, stride) =
        partition_layout(u64::from(sb.blocks_per_partition), sb.block_size)
            .ok_or_else(|| geo("partition size overflows"))?;
    // 0 (every 3.0 pool) means the default table, whose slot is format 3.0's 4 KiB.
    if sb.pins_per_participant > MAX_PINS {
        return Err(PoolError::Geometry(format!(
            "pins per participant is {}, at most {MAX_PINS} allowed",
            sb.pins_per_participant
        )));
    }
    let table_off = SUPERBLOCK_SIZE;
    let device_area_off = table_off + u64::from(sb.participants) * sb.slot_layout().size;
    let partition_off = round_up(device_area_off + DEVICE_AREA_SIZE, PARTITION_ALIGN).unwrap();
    let expect = [
        ("index_slots", u64::from(sb.index_slots), slots),
        ("participant_table_off", sb.participant_table_off, table_off),
        ("device_area_off", sb.device_area_off, device_area_off),
        ("device_area_size", sb.device_area_size, DEVICE_AREA_SIZE),
        ("partition_off", sb.partition_off, partition_off),
        ("partition_stride", sb.partition_stride, stride),
        ("index_off", sb.index_off, index_off),
        ("block_headers_off", sb.block_headers_off, headers_off),
        ("payloads_off", sb.payloads_off, payloads_off),
    ];
    for (name, found, want) in expect {
        if found != want {
            return Err(PoolError::Geometry(format!(
                "{name} is {found}, expected {want}"
            )));
        }
    }
    let pool_size = stride
        .checked_mul(u64::from(sb.partitions))
        .and_then(|v| v.checked_add(partition_off))
        .ok_or_else(|| geo("pool size overflows"))?;
    if sb.pool_size != pool_size {
        return Err(PoolError::Geometry(format!(
            "pool_size is {}, expected {pool_size}",
            sb.pool_size
        )));
    }
    if pool_size > mem_size {
        return Err(PoolError::Truncated {
            size: mem_size,
            needed: pool_size,
        });
    }
    if sb.lease_ns < 1_000_000 {
        return Err(geo("lease shorter than 1 ms"));
    }
    Ok(())
}

/// Where a key was found: enough to read, pin or replace it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Partition.
    pub partition: u32,
    /// Index slot number within the partition.
    pub slot: u32,
    /// Seqlock version of the slot when it was read (even).
    pub version: u64,
    /// Block number within the partition.
    pub block: u32,
    /// Sequence number of the block.
    pub seq: u64,
}

/// Result of probing one partition's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The key is there.
    Found(Location),
    /// The key is not in this partition.
    Absent,
    /// A slot on the probe path stayed mid-update (its writer may have died); retry or miss.
    Busy,
}

/// What a successful read found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// Payload bytes.
    pub len: u64,
    /// Payload codec.
    pub codec: Codec,
    /// Where the block lives.
    pub location: Location,
}

/// A located block with a validated header, for in-place readers. See [`Pool::block_ref`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRef {
    /// The key.
    pub key: Key,
    /// Where the block lives and the slot version it was found under.
    pub location: Location,
    /// Its header (a private copy).
    pub header: BlockHeader,
    /// Pool offset of its payload.
    pub payload_off: u64,
}

fn probe_counters(partitions: u32) -> Box<[AtomicU64]> {
    (0..partitions).map(|_| AtomicU64::new(0)).collect()
}

/// Destination of an optimistic read: hands out a buffer of exactly the payload's length.
pub(crate) trait ReadBuf {
    /// A buffer of `len` bytes, or [`PoolError::BufferTooSmall`].
    fn sized(&mut self, len: usize) -> Result<&mut [u8]>;
}

impl ReadBuf for Vec<u8> {
    fn sized(&mut self, len: usize) -> Result<&mut [u8]> {
        self.resize(len, 0);
        Ok(&mut self[..])
    }
}

/// A caller's fixed buffer as a read destination.
pub(crate) struct SliceBuf<'a>(pub(crate) &'a mut [u8]);

impl ReadBuf for SliceBuf<'_> {
    fn sized(&mut self, len: usize) -> Result<&mut [u8]> {
        let capacity = self.0.len() as u64;
        self.0.get_mut(..len).ok_or(PoolError::BufferTooSmall {
            needed: len as u64,
            capacity,
        })
    }
}

/// A handle on a pool. Cheap to clone; all clones share one mapping. A handle reads as one
/// tenant (format 3.2, [`crate::tenant`]): 0, the pool's public space, unless scoped with
/// [`Pool::for_tenant`] or held by a participant that attached as a tenant.
#[derive(Clone)]
pub struct Pool {
    pub(crate) inner: Arc<PoolInner>,
    /// The tenant whose blocks this handle reads, besides tenant 0's (0: tenant 0's only).
    pub(crate) tenant: u32,
}

pub(crate) struct PoolInner {
    pub(crate) mem: Arc<dyn SharedMemory>,
    pub(crate) sb: Superblock,
    /// Layout of its participant slots (from `sb`).
    pub(crate) slots: format::SlotLayout,
    pub(crate) backend: Option<Backend>,
    pub(crate) clock: Arc<dyn Clock>,
    /// This handle's watch of the participants' heartbeat counters ([`crate::watch`]).
    pub(crate) watch: Watch,
    /// Index probes of each partition through this mapping (all its handles), for
    /// [`Pool::partition_probes`].
    pub(crate) probes: Box<[AtomicU64]>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("backend", &self.inner.backend)
            .field("superblock", &self.inner.sb)
            .finish()
    }
}

impl Pool {
    /// Formats `mem` as a new pool. The whole participant table and every partition header and
    /// index are cleared; the superblock is written last, so a crash mid-create leaves no pool.
    pub fn create(mem: Arc<dyn SharedMemory>, cfg: &PoolConfig) -> Result<Pool> {
        let sb = plan(mem.size(), cfg)?;
        mem.set_coherence(cfg.coherence);
        mem.fill(0, SUPERBLOCK_SIZE, 0)?;
        mem.fill(
            sb.participant_table_off,
            u64::from(sb.participants) * sb.slot_layout().size,
            0,
        )?;
        mem.fill(sb.device_area_off, sb.device_area_size, 0)?;
        for p in 0..sb.partitions {
            let base = sb.partition_off + u64::from(p) * sb.partition_stride;
            // Header, index and block headers; payloads need no clearing.
            mem.fill(base, sb.payloads_off, 0)?;
        }
        // Pairs with the acquires of slots, owner words and index slots by every later reader.
        coherence::publish(&*mem, Site::FormatWrite, 0, sb.pool_size);
        // The superblock goes last: readers that see its magic see a formatted pool. Pairs with
        // the acquire in `open`.
        cxlkv_shm::mem::write_obj(&*mem, 0, &sb)?;
        coherence::publish(&*mem, Site::SuperblockWrite, 0, SUPERBLOCK_SIZE);
        Ok(Pool {
            inner: Arc::new(PoolInner {
                mem,
                slots: sb.slot_layout(),
                sb,
                backend: None,
                clock: Arc::new(SystemClock),
                watch: Watch::default(),
                probes: probe_counters(sb.partitions),
            }),
            tenant: 0,
        })
    }

    /// Opens an existing pool in `mem`, validating its superblock.
    pub fn open(mem: Arc<dyn SharedMemory>) -> Result<Pool> {
        Self::open_with_clock(mem, Arc::new(SystemClock))
    }

    /// [`open`](Self::open) with the clocks this party's heartbeats and liveness judgements read
    /// (the simulator gives each simulated host its own).
    pub fn open_with_clock(mem: Arc<dyn SharedMemory>, clock: Arc<dyn Clock>) -> Result<Pool> {
        if mem.size() < MIN_POOL_FOR_SB {
            return Err(PoolError::Truncated {
                size: mem.size(),
                needed: MIN_POOL_FOR_SB,
            });
        }
        // The mode is not known before the superblock is read: invalidate it as software
        // coherence does (harmless on coherent memory). Pairs with the publish of the superblock
        // in `create`.
        mem.set_coherence(CoherenceMode::Software);
        coherence::acquire(&*mem, Site::SuperblockRead, 0, SUPERBLOCK_SIZE);
        let sb: Superblock = read_obj(&*mem, 0)?;
        validate_superblock(&sb, mem.size())?;
        mem.set_coherence(CoherenceMode::from_code(sb.coherence).expect("validated"));
        Ok(Pool {
            inner: Arc::new(PoolInner {
                mem,
                slots: sb.slot_layout(),
                sb,
                backend: None,
                clock,
                watch: Watch::default(),
                probes: probe_counters(sb.partitions),
            }),
            tenant: 0,
        })
    }

    /// Creates memory on `backend` of `size` bytes and formats a pool in it. What it creates is
    /// private to its owner (mode 0600): [`Pool::create_on_with`] with [`Access::default`].
    pub fn create_on(
        backend: &Backend,
        size: u64,
        cfg: &PoolConfig,
        opts: &RegionOptions,
    ) -> Result<Pool> {
        Self::create_on_with(backend, size, cfg, opts, &Access::default())
    }

    /// [`Pool::create_on`] giving the backing file the owner, group and mode of `access` before
    /// the pool is formatted in it ([`Region::create_with`]; a device-DAX device must already
    /// grant no more than `access`). Who can open the file can read and write every block of
    /// the pool: the pool is the trust boundary (docs/SECURITY.md).
    pub fn create_on_with(
        backend: &Backend,
        size: u64,
        cfg: &PoolConfig,
        opts: &RegionOptions,
        access: &Access,
    ) -> Result<Pool> {
        // Plan first so a bad configuration creates no file.
        plan(size, cfg)?;
        let region = Region::create_with(backend, size, opts, access)?;
        match Pool::create(Arc::new(region), cfg) {
            Ok(mut pool) => {
                Arc::get_mut(&mut pool.inner).expect("fresh pool").backend = Some(backend.clone());
                Ok(pool)
            }
            Err(e) => {
                let _ = Region::unlink(backend);
                Err(e)
            }
        }
    }

    /// Maps the pool on `backend` and opens it.
    pub fn open_on(backend: &Backend, opts: &RegionOptions) -> Result<Pool> {
        Self::open_region(backend, Region::open(backend, opts)?)
    }

    /// Maps the pool on `backend` for reading only ([`Region::open_read_only`]) and opens it:
    /// enough to inspect it (superblock, statistics, check) with read permission alone. Anything
    /// that writes (attaching, puts) fails with `MemError::ReadOnly`.
    pub fn open_on_read_only(backend: &Backend, opts: &RegionOptions) -> Result<Pool> {
        Self::open_region(backend, Region::open_read_only(backend, opts)?)
    }

    fn open_region(backend: &Backend, region: Region) -> Result<Pool> {
        let mut pool = Pool::open(Arc::new(region))?;
        Arc::get_mut(&mut pool.inner).expect("fresh pool").backend = Some(backend.clone());
        Ok(pool)
    }

    /// The superblock (a private copy; it is immutable).
    pub fn superblock(&self) -> &Superblock {
        &self.inner.sb
    }

    /// The memory the pool lives in.
    pub fn memory(&self) -> &Arc<dyn SharedMemory> {
        &self.inner.mem
    }

    /// The backend the pool was created or opened on, if known.
    pub fn backend(&self) -> Option<&Backend> {
        self.inner.backend.as_ref()
    }

    /// Payload capacity of a block.
    pub fn block_size(&self) -> u64 {
        self.inner.sb.block_size
    }

    /// Nanoseconds since the Unix epoch on this party's wall clock ([`crate::clock`]).
    pub fn now_ns(&self) -> u64 {
        self.inner.clock.now_ns()
    }

    /// Nanoseconds on this party's monotonic clock ([`crate::clock`]): what leases are measured on.
    pub fn monotonic_ns(&self) -> u64 {
        self.inner.clock.monotonic_ns()
    }

    /// This handle's watch of the participants' heartbeats, shared by its clones.
    pub(crate) fn watch(&self) -> &Watch {
        &self.inner.watch
    }

    /// This party's clock.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    pub(crate) fn mem(&self) -> &dyn SharedMemory {
        &*self.inner.mem
    }

    pub(crate) fn slot_off(&self, participant: u32) -> u64 {
        self.inner.sb.participant_table_off + u64::from(participant) * self.inner.slots.size
    }

    /// Layout of this pool's participant slots (pin table size, hotlist, counter lines).
    pub fn slot_layout(&self) -> &format::SlotLayout {
        &self.inner.slots
    }

    pub(crate) fn partition_off(&self, p: u32) -> u64 {
        self.inner.sb.partition_off + u64::from(p) * self.inner.sb.partition_stride
    }

    pub(crate) fn index_slot_off(&self, p: u32, slot: u32) -> u64 {
        self.partition_off(p) + self.inner.sb.index_off + u64::from(slot) * INDEX_SLOT_SIZE
    }

    pub(crate) fn header_off(&self, p: u32, block: u32) -> u64 {
        self.partition_off(p)
            + self.inner.sb.block_headers_off
            + u64::from(block) * BLOCK_HEADER_SIZE
    }

    pub(crate) fn payload_off(&self, p: u32, block: u32) -> u64 {
        self.partition_off(p)
            + self.inner.sb.payloads_off
            + u64::from(block) * self.inner.sb.block_size
    }

    pub(crate) fn home_slot(&self, key: Key) -> u32 {
        (key.lo() & u64::from(self.inner.sb.index_slots - 1)) as u32
    }

    /// A consistent snapshot of an index slot: (version, key, entry), or `None` if it stayed
    /// mid-update for the whole spin budget.
    pub fn read_slot(&self, p: u32, slot: u32) -> Result<Option<(u64, Key, u64)>> {
        Ok(read_slot_at(self.mem(), self.index_slot_off(p, slot))?)
    }

    /// Current version of a slot (for the final check of an optimistic read).
    pub(crate) fn slot_version(&self, p: u32, slot: u32) -> Result<u64> {
        Ok(slot_version_at(self.mem(), self.index_slot_off(p, slot))?)
    }

    /// Probes partition `p` for `key`.
    pub(crate) fn probe(&self, p: u32, key: Key) -> Result<Probe> {
        let n = self.inner.sb.index_slots;
        let mask = n - 1;
        let start = self.home_slot(key);
        for i in 0..n {
            let slot = (start + i) & mask;
            let Some((version, k, entry)) = self.read_slot(p, slot)? else {
                return Ok(Probe::Busy);
            };
            if format::slot_version::quarantined(version) {
                // Left mid-update by a fenced former owner: passed like a tombstone, never trusted.
                continue;
            }
            match entry {
                ENTRY_EMPTY => return Ok(Probe::Absent),
                ENTRY_TOMBSTONE => continue,
                _ if k != key => continue,
                _ => {
                    let Some((block, seq)) = decode_entry(entry) else {
                        continue;
                    };
                    if block >= self.inner.sb.blocks_per_partition {
                        // A corrupt entry: treat as absent rather than read outside the partition.
                        return Ok(Probe::Absent);
                    }
                    return Ok(Probe::Found(Location {
                        partition: p,
                        slot,
                        version,
                        block,
                        seq,
                    }));
                }
            }
        }
        Ok(Probe::Absent)
    }

    /// Finds `key` in any partition this handle's tenant may read (tagged with it or 0).
    pub fn locate(&self, key: Key) -> Result<Option<Location>> {
        self.prefetch_home_slots(key);
        for _ in 0..READ_RETRIES {
            let mut busy = false;
            for p in 0..self.inner.sb.partitions {
                if !self.reads_partition(p)? {
                    continue;
                }
                self.inner.probes[p as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                match self.probe(p, key)? {
                    Probe::Found(loc) => return Ok(Some(loc)),
                    Probe::Absent => {}
                    Probe::Busy => busy = true,
                }
            }
            if !busy {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// Reads and validates a block header for `loc`; `None` if it does not match the index entry
    /// or belongs to a tenant this handle does not read.
    pub(crate) fn checked_header(&self, key: Key, loc: &Location) -> Result<Option<BlockHeader>> {
        Ok(self
            .checked_header_any(key, loc)?
            .filter(|h| self.reads_tenant(h.tenant)))
    }

    /// [`Pool::checked_header`] whatever the block's tenant (recovery keeps every tenant's blocks).
    pub(crate) fn checked_header_any(
        &self,
        key: Key,
        loc: &Location,
    ) -> Result<Option<BlockHeader>> {
        let off = self.header_off(loc.partition, loc.block);
        // Pairs with the publish of the header in the owner's commit.
        coherence::acquire(self.mem(), Site::HeaderRead, off, BLOCK_HEADER_SIZE);
        let h: BlockHeader = read_obj(self.mem(), off)?;
        let ok = h.key_lo == key.lo()
            && h.key_hi == key.hi()
            && h.seq == loc.seq
            && h.len <= self.inner.sb.block_size
            && Codec::from_code(h.codec).is_some()
            && h.header_crc == h.compute_crc();
        Ok(ok.then_some(h))
    }

    /// Copies the block stored under `key` into a new vector; `None` on a miss.
    pub fn get(&self, key: Key) -> Result<Option<(Vec<u8>, BlockInfo)>> {
        let mut v = Vec::new();
        let info = self.read_validated(key, &mut v, &mut 0)?;
        Ok(info.map(|i| (v, i)))
    }

    /// Copies the block stored under `key` into `buf`; returns its info, `None` on a miss, or
    /// [`PoolError::BufferTooSmall`] carrying the needed size.
    pub fn get_into(&self, key: Key, buf: &mut [u8]) -> Result<Option<BlockInfo>> {
        self.read_validated(key, &mut SliceBuf(buf), &mut 0)
    }

    /// Finds `key` and validates its block header, for in-place readers (the NDP device, a
    /// host-side scan). The payload is not checksummed; a reader that scans it in place must call
    /// [`Pool::still_valid`] afterwards (or hold a pin) before trusting what it computed.
    pub fn block_ref(&self, key: Key) -> Result<Option<BlockRef>> {
        self.block_ref_where(key, true)
    }

    /// [`Pool::block_ref`] in the partitions this handle's tenant may read, whatever the tenant
    /// the block's header names: for a reader that checks that tenant itself and reports a
    /// mismatch as such (the NDP device's `ERR_ACCESS`). Other tenants' partitions are still never
    /// probed.
    pub fn block_ref_any_tenant(&self, key: Key) -> Result<Option<BlockRef>> {
        self.block_ref_where(key, false)
    }

    fn block_ref_where(&self, key: Key, own_tenant: bool) -> Result<Option<BlockRef>> {
        for _ in 0..READ_RETRIES {
            let Some(loc) = self.locate(key)? else {
                return Ok(None);
            };
            let header = if own_tenant {
                self.checked_header(key, &loc)?
            } else {
                self.checked_header_any(key, &loc)?
            };
            if let Some(header) = header {
                let payload_off = self.payload_off(loc.partition, loc.block);
                return Ok(Some(BlockRef {
                    key,
                    location: loc,
                    header,
                    payload_off,
                }));
            }
        }
        Ok(None)
    }

    /// True while the index slot behind `r` is unchanged since `r` was taken, i.e. nothing the
    /// reader copied or scanned from the block can have been overwritten.
    pub fn still_valid(&self, r: &BlockRef) -> Result<bool> {
        Ok(self.slot_version(r.location.partition, r.location.slot)? == r.location.version)
    }

    /// Verifies the payload CRC of `r` in place.
    pub fn verify_payload(&self, r: &BlockRef) -> Result<bool> {
        // Pairs with the publish of the payload in the owner's commit.
        coherence::acquire(self.mem(), Site::PayloadRead, r.payload_off, r.header.len);
        Ok(format::crc32c_shared(self.mem(), r.payload_off, r.header.len)? == r.header.payload_crc)
    }

    /// Offset of a partition's first byte (for tools and the device; see docs/FORMAT.md).
    pub fn partition_offset(&self, partition: u32) -> Option<u64> {
        (partition < self.inner.sb.partitions).then(|| self.partition_off(partition))
    }

    /// How many leading keys of `chain` are present (the cached prefix an engine can reuse).
    pub fn lookup_prefix(&self, chain: &[Key]) -> Result<usize> {
        if chain.is_empty() {
            return Err(PoolError::EmptyKeyChain);
        }
        for (i, &k) in chain.iter().enumerate() {
            if self.locate(k)?.is_none() {
                // The rest of the chain may be in another pod (docs/CROSSPOD.md).
                let present = |k| Ok::<_, PoolError>(self.locate(k)?.is_some());
                return Ok(i + crate::crosspod::extend(&chain[i..], present)?);
            }
        }
        Ok(chain.len())
    }

    /// True when `key` is present (index only; no payload read).
    pub fn contains(&self, key: Key) -> Result<bool> {
        Ok(self.locate(key)?.is_some())
    }
}

/// The seqlock read of [`Pool::read_slot`] on the slot at `off` of `mem`. The loom models call it
/// on loom-backed memory (`crate::lockfree`).
pub(crate) fn read_slot_at(mem: &dyn SharedMemory, off: u64) -> MemResult<Option<(u64, Key, u64)>> {
    for _ in 0..SEQLOCK_SPINS {
        // Pairs with the publishes of the odd and the even version in `write_slot`.
        coherence::acquire(mem, Site::IndexRead, off, INDEX_SLOT_SIZE);
        // Acquire pairs with the Release store of the even version in `write_slot`.
        let v1 = mem.load_u64(off, Ordering::Acquire)?;
        if v1 & 1 == 1 {
            spin_loop();
            continue;
        }
        let lo = mem.load_u64(off + 8, Ordering::Relaxed)?;
        let hi = mem.load_u64(off + 16, Ordering::Relaxed)?;
        let entry = mem.load_u64(off + 24, Ordering::Relaxed)?;
        // Orders the field loads before the version re-check; pairs with the Release fence
        // after the odd version store in `write_slot`.
        fence(Ordering::Acquire);
        let v2 = mem.load_u64(off, Ordering::Relaxed)?;
        if v1 == v2 {
            return Ok(Some((v1, Key::from_parts(lo, hi), entry)));
        }
    }
    Ok(None)
}

/// The version re-check of [`Pool::slot_version`] on the slot at `off` of `mem`.
pub(crate) fn slot_version_at(mem: &dyn SharedMemory, off: u64) -> MemResult<u64> {
    // Orders the payload copy before this load; pairs with the writer's Release fence after it
    // makes the slot odd (so a copy that saw new bytes sees the new version).
    fence(Ordering::Acquire);
    // Pairs with the publish of the odd version in `write_slot`.
    coherence::acquire(mem, Site::IndexRead, off, 8);
    mem.load_u64(off, Ordering::Relaxed)
}
