//! Pool format v3: the on-memory structures (docs/FORMAT.md is their prose twin).
//!
//! Every struct here is `#[repr(C)]`, little-endian, free of padding, and valid for every bit
//! pattern, which the [`Plain`] marker states and the layout tests check. Structures are moved in
//! and out of shared memory only by copies ([`mem::read_obj`], [`mem::write_obj`]); words that another
//! party reads while their owner writes them are accessed as atomics by offset (the `*_OFF`
//! constants), never through these structs.
//!
//! Layout of a pool (all offsets from the start of the memory):
//!
//! ```text
//! 0                         superblock (4 KiB, immutable after create)
//! 4 KiB                     participant table: `participants` slots of `SlotLayout::size` bytes
//! device_area_off           device area (NDP registers and queue pairs), `device_area_size` bytes
//! partition_off + i*stride  partition i: header (4 KiB) | index slots | block headers | payloads
//! ```

use cxlkv_shm::mem::{self, SharedMemory};

/// Magic bytes at offset 0 of every pool.
pub const MAGIC: [u8; 8] = *b"CXLKVPL\0";
/// Major version: a reader refuses any other major. 2: the slot's heartbeat is a counter
/// (format 1 held the writer's wall-clock time there, which a format 1 reader would misjudge).
/// 3: writes are fenced in memory (block claim words, generation-tagged index slot versions,
/// quarantined slots; docs/FORMAT.md §8).
pub const VERSION_MAJOR: u16 = 3;
/// Minor version: additions that readers of the same major may ignore. 1: multi-block objects
/// (codecs [`Codec::ObjectPart`] and [`Codec::ObjectManifest`]; a 3.0 reader sees their blocks as
/// unknown codecs and reports them as misses), and the superblock's `pins_per_participant` (0 in a
/// 3.0 pool, read as [`DEFAULT_PINS`]) sizing the participant slot, each slot publishing a second
/// counter line ([`counters::BYTES_IN`] onward). 2: tenants ([`tenant_table`] in the superblock
/// page after the superblock, [`slot::TENANT`], [`partition::TENANT`] and [`partition::LIVE`],
/// [`BlockHeader::tenant`]); a 3.1 reader ignores them all, so it enforces no tenant boundary.
pub const VERSION_MINOR: u16 = 2;
/// Cache line size the format is laid out for.
pub const LINE: u64 = 64;
/// Page size the format aligns to.
pub const PAGE: u64 = 4096;
/// Bytes reserved for the superblock.
pub const SUPERBLOCK_SIZE: u64 = PAGE;
/// Bytes of the device area (NDP registers and queue pairs, sized for the NDP device).
pub const DEVICE_AREA_SIZE: u64 = 1 << 20;
/// Bytes of a partition header.
pub const PARTITION_HEADER_SIZE: u64 = PAGE;
/// Bytes of one index slot.
pub const INDEX_SLOT_SIZE: u64 = 32;
/// Bytes of one block header.
pub const BLOCK_HEADER_SIZE: u64 = 64;
/// Pins one participant can hold at once unless the pool says otherwise (and in a 3.0 pool, whose
/// superblock field reads 0).
pub const DEFAULT_PINS: u32 = 64;
/// Largest pin table a pool may give each participant (2 MiB of pin entries per slot).
pub const MAX_PINS: u32 = 65_536;
/// Bytes reserved for the published hotlist in a participant slot (`crate::hotness::hotlist`).
pub const HOTLIST_SIZE: u64 = 64 + 64 * 24;
/// Bytes of one pin entry.
pub const PIN_SIZE: u64 = 32;

pub use cxlkv_shm::CoherenceMode;

/// Payload encodings of a block (`BlockHeader::codec`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// Opaque bytes (an engine's blob).
    Raw = 0,
    /// A typed KV block: [`KvLayout`] then K, V and key bounds (docs/FORMAT.md).
    KvV1 = 1,
    /// One part of a multi-block object, stored under a derived key ([`ObjectManifest`]).
    ObjectPart = 2,
    /// The manifest of a multi-block object under the user's key: [`ObjectManifest`] then one
    /// [`ObjectPartEntry`] per part. Published last, so an object is visible only whole.
    ObjectManifest = 3,
}

impl Codec {
    /// Decodes the header field.
    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(Self::Raw),
            1 => Some(Self::KvV1),
            2 => Some(Self::ObjectPart),
            3 => Some(Self::ObjectManifest),
            _ => None,
        }
    }
}

/// The plain-data codec lives beside [`SharedMemory`] in `cxlkv-shm`; re-exported here for the
/// layouts below and their users.
pub use cxlkv_shm::mem::{as_bytes, from_bytes, Plain};

/// CRC-32C (Castagnoli, CRC-32/ISCSI), the checksum of every header and payload. Computed with
/// `crc-fast`, which folds with (V)PCLMULQDQ where the CPU has it (about 4x the SSE4.2 `crc32`
/// instruction loop on AVX-512 machines), so that checksumming a copy costs little next to the copy.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// CRC-32C of `len` bytes of shared memory at `offset` that no other party writes meanwhile (a
/// reservation being committed, a block under a pin): read in place where the memory has an
/// address ([`SharedMemory::checksum`]; never borrowed as a slice), else through a small private
/// buffer.
pub fn crc32c_shared(mem: &dyn SharedMemory, offset: u64, len: u64) -> mem::Result<u32> {
    mem.checksum(offset, len, 0)
}

/// Incremental CRC-32C over several pieces; equal to [`crc32c`] of their concatenation.
pub struct Crc32c(crc_fast::Digest);

impl Default for Crc32c {
    fn default() -> Self {
        Crc32c(crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi))
    }
}

impl Crc32c {
    /// Adds bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    /// The CRC of everything added.
    pub fn finish(&self) -> u32 {
        self.0.finalize() as u32
    }
}

/// The superblock: identity and geometry of a pool. Written once at create, immutable after.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Superblock {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`VERSION_MAJOR`].
    pub version_major: u16,
    /// [`VERSION_MINOR`].
    pub version_minor: u16,
    /// [`CoherenceMode`] code.
    pub coherence: u32,
    /// Random identity of this pool.
    pub uuid: [u8; 16],
    /// Bytes of the pool (≤ the size of the memory it lives in).
    pub pool_size: u64,
    /// Payload capacity of one block (a multiple of [`PAGE`]).
    pub block_size: u64,
    /// Number of participant slots.
    pub participants: u32,
    /// Number of data partitions.
    pub partitions: u32,
    /// Blocks in each partition.
    pub blocks_per_partition: u32,
    /// Index slots in each partition (a power of two ≥ 2 × blocks).
    pub index_slots: u32,
    /// Offset of the participant table.
    pub participant_table_off: u64,
    /// Offset of the device area.
    pub device_area_off: u64,
    /// Bytes of the device area.
    pub device_area_size: u64,
    /// Offset of partition 0.
    pub partition_off: u64,
    /// Bytes from one partition to the next.
    pub partition_stride: u64,
    /// Offset of the index inside a partition.
    pub index_off: u64,
    /// Offset of the block-header array inside a partition.
    pub block_headers_off: u64,
    /// Offset of the payload array inside a partition (page-aligned).
    pub payloads_off: u64,
    /// Lease of a participant in nanoseconds: an observer that watched a holder's heartbeat
    /// counter stand still for longer than this, on its own monotonic clock, may declare it dead.
    pub lease_ns: u64,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created_ns: u64,
    /// Pin entries in each participant slot (format 3.1; 0 in a 3.0 pool, meaning
    /// [`DEFAULT_PINS`]). Use [`Superblock::pins`].
    pub pins_per_participant: u32,
    /// Zero.
    pub reserved0: u32,
    /// Zero; room for minor versions.
    pub reserved: [u64; 12],
    /// CRC-32C of every byte before this field.
    pub crc: u32,
    /// Zero.
    pub reserved2: u32,
}
// SAFETY: repr(C), fields laid out without padding (checked by the layout test), integers and
// byte arrays only, so every bit pattern is valid.
unsafe impl Plain for Superblock {}

impl Superblock {
    /// Offset of the `crc` field; the CRC covers `[0, CRC_OFF)`.
    pub const CRC_OFF: usize = std::mem::offset_of!(Superblock, crc);

    /// The CRC this superblock should carry.
    pub fn compute_crc(&self) -> u32 {
        crc32c(&as_bytes(self)[..Self::CRC_OFF])
    }

    /// Pin entries per participant slot (a stored 0, as in every 3.0 pool, means [`DEFAULT_PINS`]).
    pub fn pins(&self) -> u32 {
        if self.pins_per_participant == 0 {
            DEFAULT_PINS
        } else {
            self.pins_per_participant
        }
    }

    /// Layout of this pool's participant slots.
    pub fn slot_layout(&self) -> SlotLayout {
        SlotLayout::new(self.pins())
    }
}

/// Where the regions of a participant slot lie, from the pool's pin-table size. Line 0 (the
/// [`slot`] words) and line 1 (the first [`counters`] line) are fixed; the pin table starts at
/// [`slot::PINS`], then come the hotlist and the second counter line, each line-aligned, and the
/// slot is rounded up to a page. With [`DEFAULT_PINS`] this is the 4 KiB slot of format 3.0 (its
/// second counter line lies in bytes 3.0 left zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotLayout {
    /// Pin entries in the table.
    pub pins: u64,
    /// Offset of the published hotlist ([`HOTLIST_SIZE`] bytes).
    pub hotlist: u64,
    /// Offset of the second counter line ([`counters::BYTES_IN`] onward).
    pub counters2: u64,
    /// Bytes of one slot (a multiple of [`PAGE`]).
    pub size: u64,
}

const fn round_up_const(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

impl SlotLayout {
    /// The layout for `pins` pin entries (0 = [`DEFAULT_PINS`]; at most [`MAX_PINS`], which the
    /// callers check).
    pub const fn new(pins: u32) -> SlotLayout {
        let pins = if pins == 0 { DEFAULT_PINS } else { pins } as u64;
        let hotlist = round_up_const(slot::PINS + pins * PIN_SIZE, LINE);
        let counters2 = round_up_const(hotlist + HOTLIST_SIZE, LINE);
        let size = round_up_const(
            counters2 + round_up_const((counters::COUNT - counters::LINE1) * 8, LINE),
            PAGE,
        );
        SlotLayout {
            pins,
            hotlist,
            counters2,
            size,
        }
    }

    /// Offset, inside a slot, of counter `c` (an index of [`counters`]).
    pub const fn counter(&self, c: u64) -> u64 {
        if c < counters::LINE1 {
            slot::COUNTERS + 8 * c
        } else {
            self.counters2 + 8 * (c - counters::LINE1)
        }
    }

    /// Offset, inside a slot, of pin entry `e`.
    pub const fn pin(&self, e: u64) -> u64 {
        slot::PINS + e * PIN_SIZE
    }
}

/// Word offsets inside a participant slot. Only the slot's holder writes it, except the `token`
/// word, which is claimed with a compare-and-swap.
pub mod slot {
    /// Claim token: 0 = free, else the holder's token.
    pub const TOKEN: u64 = 0;
    /// Generation: bumped on every claim.
    pub const GENERATION: u64 = 8;
    /// Holder's process id.
    pub const PID: u64 = 16;
    /// Heartbeat counter: the holder advances it every eighth of a lease. Its value carries no
    /// time; observers watch it move on their own clocks ([`crate::watch`]).
    pub const HEARTBEAT: u64 = 24;
    /// Partition the holder owns, plus one (0 = none).
    pub const PARTITION: u64 = 32;
    /// Tenant the holder attached as (format 3.2; 0 = none). Written by the holder before its
    /// first heartbeat; the device reads it to check the blocks a queue's commands name.
    pub const TENANT: u64 = 40;
    /// Published counters start here (line 1): see [`super::counters`].
    pub const COUNTERS: u64 = 64;
    /// Pin entries start here (line 2 onward); the pool's [`super::SlotLayout`] places what follows
    /// (hotlist, second counter line) and the slot size.
    pub const PINS: u64 = 128;
}

/// Indices of the counters a participant publishes in its slot (u64 each): the first
/// [`counters::LINE1`] in line 1 (from `slot::COUNTERS`), the rest in the second counter line
/// ([`super::SlotLayout::counters2`]). Only the slot's holder writes either line.
pub mod counters {
    /// Successful puts.
    pub const PUTS: u64 = 0;
    /// Gets that found the key.
    pub const HITS: u64 = 1;
    /// Gets that did not.
    pub const MISSES: u64 = 2;
    /// Optimistic reads retried.
    pub const RETRIES: u64 = 3;
    /// Blocks evicted to make room.
    pub const EVICTIONS: u64 = 4;
    /// Blocks deleted.
    pub const DELETES: u64 = 5;
    /// Pins taken.
    pub const PINS: u64 = 6;
    /// Counters in line 1 (format 3.0's seven).
    pub const LINE1: u64 = 7;
    /// Payload bytes written by puts (second counter line, format 3.1).
    pub const BYTES_IN: u64 = 7;
    /// Payload bytes copied out by gets that hit.
    pub const BYTES_OUT: u64 = 8;
    /// Device requests the host answered itself because the device was unavailable or did not
    /// support them.
    pub const FALLBACKS: u64 = 9;
    /// Pins refused because the pin table was full.
    pub const PIN_FULL: u64 = 10;
    /// Number of counters.
    pub const COUNT: u64 = 11;
    /// Names, in index order.
    pub const NAMES: [&str; COUNT as usize] = [
        "puts",
        "hits",
        "misses",
        "retries",
        "evictions",
        "deletes",
        "pins",
        "bytes_in",
        "bytes_out",
        "fallbacks",
        "pin_full",
    ];
}

/// Word offsets of one pin entry (32 bytes). `seq` is written last (Release) and cleared first.
pub mod pin {
    /// Block sequence number of the pinned block; 0 = entry empty.
    pub const SEQ: u64 = 0;
    /// `partition << 32 | block`.
    pub const WHERE: u64 = 8;
}

/// Word offsets inside a partition header. Only the owner writes it, except `OWNER`, claimed by
/// compare-and-swap.
pub mod partition {
    /// `generation << 32 | (participant + 1)`; participant part 0 = unowned.
    pub const OWNER: u64 = 0;
    /// Next block sequence number to hand out (monotonic across owners). In its own cache line:
    /// the owner writes it, while a successor writes `OWNER` (one writer per line, which
    /// non-coherent memory needs: a stale dirty line written back would undo a takeover).
    pub const NEXT_SEQ: u64 = 64;
    /// Tenant whose blocks the partition holds (format 3.2; 0 = none), in its own cache line,
    /// written by the owner.
    pub const TENANT: u64 = 128;
    /// Live (indexed) blocks of the partition (format 3.2), beside `TENANT` and written by the
    /// owner after every change: what anyone sums to read a tenant's use. A 3.1 owner leaves it
    /// 0, so it is a hint for claimers; the owner's recovery recounts it.
    pub const LIVE: u64 = 136;
}

/// The tenant table (format 3.2): in the superblock page after the 256-byte superblock, outside
/// its CRC (the superblock stays immutable; this table changes). A header line, then
/// [`tenant_table::ENTRIES`] entries of one line each; tenant id = entry index + 1 (0 = no tenant).
/// Every line carries its own CRC-32C over its first 60 bytes in its last 4.
pub mod tenant_table {
    /// Offset of the header line: word 0 the default quota (blocks; 0 = unlimited) of tenants
    /// registered by attaching, CRC at 60. All zeros (a pool of 3.1, or one never given a
    /// default) means unlimited.
    pub const HEADER: u64 = 256;
    /// Offset of entry 0.
    pub const FIRST: u64 = 320;
    /// Bytes of an entry.
    pub const ENTRY_SIZE: u64 = 64;
    /// Entries: the rest of the page.
    pub const ENTRIES: u32 = ((super::PAGE - FIRST) / ENTRY_SIZE) as u32;
    /// Entry word: the tenant's name hash (XXH3-64 of the name, low bit set so it is never 0),
    /// claimed by compare-and-swap from 0 (free).
    pub const STATE: u64 = 0;
    /// Entry word: quota in blocks (0 = unlimited).
    pub const QUOTA: u64 = 8;
    /// Entry bytes: the name, UTF-8, zero-padded.
    pub const NAME: u64 = 16;
    /// Largest name in bytes.
    pub const NAME_MAX: usize = 40;
    /// Entry u32: the name's length.
    pub const NAME_LEN: u64 = 56;
    /// Entry and header u32: CRC-32C of the line's first 60 bytes.
    pub const CRC: u64 = 60;

    /// Offset of the entry of tenant `id` (1-based).
    pub const fn entry(id: u32) -> u64 {
        FIRST + (id as u64 - 1) * ENTRY_SIZE
    }
}

const _: () =
    assert!(tenant_table::FIRST + tenant_table::ENTRIES as u64 * tenant_table::ENTRY_SIZE == PAGE);

/// Index slot (32 bytes): a seqlock-protected mapping key → block. Accessed word by word as
/// atomics; this struct documents the layout and serves the checker's copies.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexSlot {
    /// Seqlock version: odd while the owner rewrites the slot.
    pub version: u64,
    /// Low 64 bits of the key.
    pub key_lo: u64,
    /// High 64 bits of the key.
    pub key_hi: u64,
    /// [`ENTRY_EMPTY`], [`ENTRY_TOMBSTONE`], or `seq << 24 | block`.
    pub entry: u64,
}
// SAFETY: repr(C), four u64, no padding, every bit pattern valid.
unsafe impl Plain for IndexSlot {}

/// Index entry of a slot never used.
pub const ENTRY_EMPTY: u64 = 0;
/// Index entry of a slot whose key was removed (probing continues past it).
pub const ENTRY_TOMBSTONE: u64 = u64::MAX;
/// Bits of an index entry that hold the block number.
pub const ENTRY_BLOCK_BITS: u32 = 24;
/// Largest number of blocks a partition may have.
pub const MAX_BLOCKS_PER_PARTITION: u64 = (1 << ENTRY_BLOCK_BITS) - 1;
/// Largest block sequence number an index entry can hold (the bits above the block number).
pub const MAX_SEQ: u64 = u64::MAX >> ENTRY_BLOCK_BITS;

/// A live index entry's (block, seq), or `None` for empty and tombstone entries.
pub fn decode_entry(entry: u64) -> Option<(u32, u64)> {
    if entry == ENTRY_EMPTY || entry == ENTRY_TOMBSTONE {
        None
    } else {
        Some((
            (entry & MAX_BLOCKS_PER_PARTITION) as u32,
            entry >> ENTRY_BLOCK_BITS,
        ))
    }
}

/// Encodes a live index entry.
pub fn encode_entry(block: u32, seq: u64) -> u64 {
    debug_assert!(u64::from(block) <= MAX_BLOCKS_PER_PARTITION && seq > 0);
    (seq << ENTRY_BLOCK_BITS) | u64::from(block)
}

/// Block header (64 bytes), one per block in the partition's header array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockHeader {
    /// Low 64 bits of the key.
    pub key_lo: u64,
    /// High 64 bits of the key.
    pub key_hi: u64,
    /// Sequence number the block was written under (matches the index entry).
    pub seq: u64,
    /// Payload length in bytes.
    pub len: u64,
    /// [`Codec`] code.
    pub codec: u32,
    /// CRC-32C of the payload's `len` bytes.
    pub payload_crc: u32,
    /// Generation of the partition owner that wrote the block.
    pub owner_generation: u64,
    /// The claim word ([`claim`]): which owner generation took the block for writing, and whether
    /// its write committed. Changed only by compare-and-swap; not covered by `header_crc`.
    pub claim: u64,
    /// Tenant the block belongs to (format 3.2; 0 = no tenant, the pool's public space, and every
    /// block written before 3.2). Written with the header, before the claim word commits; not
    /// covered by `header_crc`, like the claim word.
    pub tenant: u32,
    /// CRC-32C of the first 48 bytes (key to `owner_generation`).
    pub header_crc: u32,
}
// SAFETY: repr(C), fields without padding (layout test), integers only.
unsafe impl Plain for BlockHeader {}

impl BlockHeader {
    /// Offset of `header_crc`.
    pub const CRC_OFF: usize = std::mem::offset_of!(BlockHeader, header_crc);

    /// Offset of the claim word.
    pub const CLAIM_OFF: usize = std::mem::offset_of!(BlockHeader, claim);

    /// The header CRC this header should carry (of the bytes before the claim word).
    pub fn compute_crc(&self) -> u32 {
        crc32c(&as_bytes(self)[..Self::CLAIM_OFF])
    }
}

/// A block's claim word (`BlockHeader::claim`): `generation << 32 | state`, the partition
/// generation of the owner that last changed it. An owner takes a block for writing with a
/// compare-and-swap from a word it read, so a successor that changed the word makes the late
/// writer's swap fail; a block left `WRITING` by another generation than the partition's current
/// one is quarantined: the writer of that generation may still store into it, so it is never
/// reused (docs/COHERENCE.md, Fencing).
pub mod claim {
    /// Never claimed, or its write was abandoned: free.
    pub const IDLE: u64 = 0;
    /// Taken for writing (payload, header): in flight until committed.
    pub const WRITING: u64 = 1;
    /// Its write committed (header written before the index entry was published).
    pub const COMMITTED: u64 = 2;

    /// The word of `state` by generation `generation`.
    pub fn word(generation: u64, state: u64) -> u64 {
        ((generation & 0xffff_ffff) << 32) | state
    }

    /// The generation part of a claim word.
    pub fn generation(word: u64) -> u64 {
        word >> 32
    }

    /// The state part of a claim word.
    pub fn state(word: u64) -> u64 {
        word & 0xffff_ffff
    }

    /// True when a block with this claim word is quarantined under an owner of `generation`:
    /// another generation left it mid-write.
    pub fn quarantined(word: u64, generation: u64) -> bool {
        state(word) == WRITING && self::generation(word) != generation & 0xffff_ffff
    }
}

/// An index slot's version word: `generation << 32 | flags and counter`. The low 31 bits are the
/// seqlock counter (odd while the owner rewrites the slot), bit 31 marks a quarantined slot, and
/// the high 32 bits are the partition generation of the owner that last wrote the word. Owners
/// change it only by compare-and-swap from a word of their own generation, and a new owner retags
/// every slot with its generation when it takes the partition, so a former owner's late swap fails.
pub mod slot_version {
    /// A quarantined slot: a former owner was rewriting it when the partition changed hands and
    /// may still store into its fields. Readers and writers skip it like a tombstone; never reused.
    pub const QUARANTINED: u64 = 1 << 31;
    const COUNTER: u64 = QUARANTINED - 1;

    /// The generation part.
    pub fn generation(v: u64) -> u64 {
        v >> 32
    }

    /// True for a quarantined slot.
    pub fn quarantined(v: u64) -> bool {
        v & QUARANTINED != 0
    }

    /// True while the slot is being rewritten (the counter is odd; quarantined slots never are).
    pub fn odd(v: u64) -> bool {
        v & 1 == 1 && !quarantined(v)
    }

    /// The odd version that starts a rewrite of a slot whose version is `v` (even).
    pub fn begin(v: u64) -> u64 {
        (v & !COUNTER) | (((v & COUNTER) | 1) & COUNTER)
    }

    /// The even version that ends the rewrite started with `odd`.
    pub fn end(odd: u64) -> u64 {
        (odd & !COUNTER) | ((odd & COUNTER).wrapping_add(1) & COUNTER)
    }

    /// `v` with its generation replaced by `generation` (counter and flag kept).
    pub fn retag(v: u64, generation: u64) -> u64 {
        ((generation & 0xffff_ffff) << 32) | (v & 0xffff_ffff)
    }
}

/// Layout descriptor at the start of a typed KV payload ([`Codec::KvV1`]), 64 bytes. K and V follow
/// head-major (`[kv_heads][tokens][head_dim]`), then per-head key bounds as f32
/// (`[kv_heads][2][head_dim]`: element-wise min, then max, over the block's tokens). A quantized
/// block (dtype int8 or int4) stores codes in K and V, bounds of the key codes, and its scales at
/// `scales_off`: per head and channel for K (`[kv_heads][head_dim]` f32), then per head and token
/// for V (`[kv_heads][tokens]` f32). A block may carry a key sketch at `sketch_off`, a low-bit
/// copy of its keys made for scoring only (docs/FORMAT.md, Typed KV payload).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvLayout {
    /// `cxlkv_kernels::DType` code of K and V.
    pub dtype: u32,
    /// Model layer.
    pub layer: u32,
    /// KV heads in the block.
    pub kv_heads: u32,
    /// Elements per head vector.
    pub head_dim: u32,
    /// Tokens in the block.
    pub tokens: u32,
    /// `crate::kv::Sketch` code of the block's key sketch: 0 none (it was a reserved zero before
    /// key sketches), 1 int4 per channel, 2 sign bits with per-channel scales.
    pub sketch: u32,
    /// Sequence the block belongs to (engine-chosen id).
    pub sequence: u64,
    /// Position of the block's first token in its sequence.
    pub token_offset: u64,
    /// Payload offset of K (from the payload start).
    pub k_off: u32,
    /// Payload offset of V.
    pub v_off: u32,
    /// Payload offset of the bounds.
    pub bounds_off: u32,
    /// Payload offset of the scales of a quantized block; zero for f16, bf16 and f32 blocks (it
    /// was the first reserved word before quantized blocks).
    pub scales_off: u32,
    /// Payload offset of the key sketch; zero for a block without one (it was the second
    /// reserved word before key sketches).
    pub sketch_off: u32,
    /// Zero.
    pub reserved1: u32,
}
// SAFETY: repr(C), fields without padding (layout test), integers only.
unsafe impl Plain for KvLayout {}

/// Magic at the start of an object manifest.
pub const OBJECT_MAGIC: [u8; 8] = *b"CXLKVOBJ";
/// Version of the object manifest layout.
pub const OBJECT_VERSION: u32 = 1;

/// Head of an object manifest (64 bytes), the payload of a [`Codec::ObjectManifest`] block;
/// `part_count` [`ObjectPartEntry`]s follow. Every part but the last holds `part_size` bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectManifest {
    /// [`OBJECT_MAGIC`].
    pub magic: [u8; 8],
    /// [`OBJECT_VERSION`].
    pub version: u32,
    /// [`Codec`] of the object's bytes (what a read reports).
    pub codec: u32,
    /// Object length in bytes.
    pub total_len: u64,
    /// Bytes of every part but the last (the pool's block size when written).
    pub part_size: u64,
    /// Per-put nonce the part keys derive from (`partition << 48 | first seq`).
    pub nonce: u64,
    /// Low 64 bits of the object's key.
    pub key_lo: u64,
    /// High 64 bits of the object's key.
    pub key_hi: u64,
    /// Number of parts.
    pub part_count: u32,
    /// CRC-32C of the manifest: these 64 bytes up to this field, then the part table.
    pub crc: u32,
}
// SAFETY: repr(C), fields without padding (layout test), integers and byte arrays only.
unsafe impl Plain for ObjectManifest {}

impl ObjectManifest {
    /// Offset of `crc`.
    pub const CRC_OFF: usize = std::mem::offset_of!(ObjectManifest, crc);
}

/// One part of an object (32 bytes) in its manifest's part table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectPartEntry {
    /// Low 64 bits of the part's key.
    pub key_lo: u64,
    /// High 64 bits of the part's key.
    pub key_hi: u64,
    /// Part length in bytes.
    pub len: u64,
    /// CRC-32C of the part's bytes.
    pub crc: u32,
    /// Zero.
    pub reserved: u32,
}
// SAFETY: repr(C), fields without padding (layout test), integers only.
unsafe impl Plain for ObjectPartEntry {}

// The participant slot's regions fit and are line-aligned: checked at compile time. The default
// layout is format 3.0's (4 KiB slot, hotlist after 64 pins), so 3.0 pools keep their meaning.
const _: () = assert!(slot::PINS.is_multiple_of(LINE));
const _: () = assert!(slot::COUNTERS + counters::LINE1 * 8 <= slot::PINS);
const _: () = assert!(SlotLayout::new(DEFAULT_PINS).size == PAGE);
const _: () = assert!(SlotLayout::new(DEFAULT_PINS).hotlist == 2176);
const _: () = assert!({
    let l = SlotLayout::new(MAX_PINS);
    l.counters2 + (counters::COUNT - counters::LINE1) * 8 <= l.size
});

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn superblock_layout() {
        assert_eq!(size_of::<Superblock>(), 256);
        assert_eq!(offset_of!(Superblock, magic), 0);
        assert_eq!(offset_of!(Superblock, version_major), 8);
        assert_eq!(offset_of!(Superblock, version_minor), 10);
        assert_eq!(offset_of!(Superblock, coherence), 12);
        assert_eq!(offset_of!(Superblock, uuid), 16);
        assert_eq!(offset_of!(Superblock, pool_size), 32);
        assert_eq!(offset_of!(Superblock, block_size), 40);
        assert_eq!(offset_of!(Superblock, participants), 48);
        assert_eq!(offset_of!(Superblock, partitions), 52);
        assert_eq!(offset_of!(Superblock, blocks_per_partition), 56);
        assert_eq!(offset_of!(Superblock, index_slots), 60);
        assert_eq!(offset_of!(Superblock, participant_table_off), 64);
        assert_eq!(offset_of!(Superblock, device_area_off), 72);
        assert_eq!(offset_of!(Superblock, device_area_size), 80);
        assert_eq!(offset_of!(Superblock, partition_off), 88);
        assert_eq!(offset_of!(Superblock, partition_stride), 96);
        assert_eq!(offset_of!(Superblock, index_off), 104);
        assert_eq!(offset_of!(Superblock, block_headers_off), 112);
        assert_eq!(offset_of!(Superblock, payloads_off), 120);
        assert_eq!(offset_of!(Superblock, lease_ns), 128);
        assert_eq!(offset_of!(Superblock, created_ns), 136);
        assert_eq!(offset_of!(Superblock, pins_per_participant), 144);
        assert_eq!(offset_of!(Superblock, reserved0), 148);
        assert_eq!(offset_of!(Superblock, reserved), 152);
        assert_eq!(offset_of!(Superblock, crc), 248);
        assert_eq!(offset_of!(Superblock, reserved2), 252);
    }

    #[test]
    fn slot_layout_grows_with_the_pin_table() {
        let d = SlotLayout::new(0);
        assert_eq!(d, SlotLayout::new(DEFAULT_PINS));
        assert_eq!(
            (d.pins, d.hotlist, d.counters2, d.size),
            (64, 2176, 3776, 4096)
        );
        let l = SlotLayout::new(200);
        assert_eq!(l.hotlist, 128 + 200 * 32);
        assert!(l.counters2 >= l.hotlist + HOTLIST_SIZE);
        assert_eq!(l.size, 8192);
        assert_eq!(l.counter(counters::PUTS), slot::COUNTERS);
        assert_eq!(l.counter(counters::BYTES_IN), l.counters2);
        assert!(l.counter(counters::COUNT - 1) + 8 <= l.size);
        let sb = Superblock::default();
        assert_eq!(sb.pins(), DEFAULT_PINS);
    }

    #[test]
    fn tenant_table_layout() {
        assert_eq!(tenant_table::ENTRIES, 59);
        assert_eq!(tenant_table::entry(1), 320);
        assert_eq!(tenant_table::entry(59) + 64, PAGE);
        assert_eq!(partition::TENANT / LINE, partition::LIVE / LINE);
        assert_eq!(slot::TENANT, 40);
        assert!(size_of::<Superblock>() as u64 <= tenant_table::HEADER);
    }

    #[test]
    fn index_slot_layout() {
        assert_eq!(size_of::<IndexSlot>(), INDEX_SLOT_SIZE as usize);
        assert_eq!(offset_of!(IndexSlot, version), 0);
        assert_eq!(offset_of!(IndexSlot, key_lo), 8);
        assert_eq!(offset_of!(IndexSlot, key_hi), 16);
        assert_eq!(offset_of!(IndexSlot, entry), 24);
    }

    #[test]
    fn block_header_layout() {
        assert_eq!(size_of::<BlockHeader>(), BLOCK_HEADER_SIZE as usize);
        assert_eq!(offset_of!(BlockHeader, key_lo), 0);
        assert_eq!(offset_of!(BlockHeader, key_hi), 8);
        assert_eq!(offset_of!(BlockHeader, seq), 16);
        assert_eq!(offset_of!(BlockHeader, len), 24);
        assert_eq!(offset_of!(BlockHeader, codec), 32);
        assert_eq!(offset_of!(BlockHeader, payload_crc), 36);
        assert_eq!(offset_of!(BlockHeader, owner_generation), 40);
        assert_eq!(offset_of!(BlockHeader, claim), 48);
        assert_eq!(offset_of!(BlockHeader, tenant), 56);
        assert_eq!(offset_of!(BlockHeader, header_crc), 60);
    }

    #[test]
    fn kv_layout_layout() {
        assert_eq!(size_of::<KvLayout>(), 64);
        assert_eq!(offset_of!(KvLayout, dtype), 0);
        assert_eq!(offset_of!(KvLayout, layer), 4);
        assert_eq!(offset_of!(KvLayout, kv_heads), 8);
        assert_eq!(offset_of!(KvLayout, head_dim), 12);
        assert_eq!(offset_of!(KvLayout, tokens), 16);
        assert_eq!(offset_of!(KvLayout, sketch), 20);
        assert_eq!(offset_of!(KvLayout, sequence), 24);
        assert_eq!(offset_of!(KvLayout, token_offset), 32);
        assert_eq!(offset_of!(KvLayout, k_off), 40);
        assert_eq!(offset_of!(KvLayout, v_off), 44);
        assert_eq!(offset_of!(KvLayout, bounds_off), 48);
        assert_eq!(offset_of!(KvLayout, scales_off), 52);
        assert_eq!(offset_of!(KvLayout, sketch_off), 56);
        assert_eq!(offset_of!(KvLayout, reserved1), 60);
    }

    #[test]
    fn object_manifest_layout() {
        assert_eq!(size_of::<ObjectManifest>(), 64);
        assert_eq!(offset_of!(ObjectManifest, version), 8);
        assert_eq!(offset_of!(ObjectManifest, codec), 12);
        assert_eq!(offset_of!(ObjectManifest, total_len), 16);
        assert_eq!(offset_of!(ObjectManifest, part_size), 24);
        assert_eq!(offset_of!(ObjectManifest, nonce), 32);
        assert_eq!(offset_of!(ObjectManifest, key_lo), 40);
        assert_eq!(offset_of!(ObjectManifest, key_hi), 48);
        assert_eq!(offset_of!(ObjectManifest, part_count), 56);
        assert_eq!(offset_of!(ObjectManifest, crc), 60);
        assert_eq!(size_of::<ObjectPartEntry>(), 32);
        assert_eq!(offset_of!(ObjectPartEntry, len), 16);
        assert_eq!(offset_of!(ObjectPartEntry, crc), 24);
    }

    #[test]
    fn crc32c_matches_the_catalogue_and_streams() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut c = Crc32c::default();
        for piece in data.chunks(4097) {
            c.update(piece);
        }
        assert_eq!(c.finish(), crc32c(&data));
    }

    #[test]
    fn entries_round_trip() {
        assert_eq!(decode_entry(encode_entry(5, 77)), Some((5, 77)));
        assert_eq!(decode_entry(ENTRY_EMPTY), None);
        assert_eq!(decode_entry(ENTRY_TOMBSTONE), None);
    }
}
