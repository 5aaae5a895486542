/*
 * cxlkv NDP device ABI, version 1.0 (docs/ABI.md is its prose twin).
 *
 * One header for every party: the device model (cxlkv-ndpd), the runtime's client (Rust bindings
 * generated from this file with bindgen and committed; a test fails when they drift) and the HLS
 * kernel. Everything lives in the pool's device area or in pool blocks; every location is an
 * offset, never a pointer. All fields are little-endian; every struct is naturally aligned and free
 * of padding.
 *
 * Device area (offsets from superblock.device_area_off):
 *   0                            struct cxlkv_ndp_regs (4096 bytes)
 *   regs.qp_offset + i*qp_stride queue pair i, served for participant slot i:
 *                                struct cxlkv_ndp_qp_indices, then depth commands, then depth
 *                                completions
 *
 * Ordering rules (ABI.md section "Ordering"):
 *   - the client writes a command slot, then stores sq_tail with Release; the device loads
 *     sq_tail with Acquire before reading slots;
 *   - the device writes a completion slot, then stores cq_tail with Release; the client loads
 *     cq_tail with Acquire before reading completions;
 *   - the device writes the result buffer before the completion that reports it;
 *   - indices are free-running 64-bit counters; slot = index % depth.
 */
#ifndef CXLKV_NDP_H
#define CXLKV_NDP_H

#include <stdint.h>

/* "CXLKVNDP" read as a little-endian u64. */
#define CXLKV_NDP_MAGIC 0x50444E564B4C5843ULL
#define CXLKV_NDP_ABI_MAJOR 1
#define CXLKV_NDP_ABI_MINOR 0

/* Geometry. */
#define CXLKV_NDP_REGS_SIZE 4096
#define CXLKV_NDP_QUEUE_DEPTH 16
#define CXLKV_NDP_CMD_SIZE 64
#define CXLKV_NDP_CPL_SIZE 64
#define CXLKV_NDP_QP_INDICES_SIZE 256
#define CXLKV_NDP_QP_STRIDE 2304
#define CXLKV_NDP_HOTLIST_WINDOW 32
#define CXLKV_NDP_COUNTERS 16

/* Limits the device enforces (also published in the registers). */
#define CXLKV_NDP_MAX_K 4096
#define CXLKV_NDP_MAX_GROUP 16
#define CXLKV_NDP_MAX_BLOCKS 65536
#define CXLKV_NDP_MAX_DIM 256

/* Capability bits (regs.capabilities). */
#define CXLKV_NDP_CAP_SCORE_TOPK (1ULL << 0)
#define CXLKV_NDP_CAP_GATHER (1ULL << 1)
#define CXLKV_NDP_CAP_BUILD_BOUNDS (1ULL << 2)
#define CXLKV_NDP_CAP_HOTLIST (1ULL << 3)
#define CXLKV_NDP_CAP_PRUNE (1ULL << 4)
#define CXLKV_NDP_CAP_FUTEX_WAKE (1ULL << 5)
#define CXLKV_NDP_CAP_PACING (1ULL << 6)

/* Opcodes (cmd.opcode). */
#define CXLKV_NDP_OP_NOP 0
#define CXLKV_NDP_OP_SCORE_TOPK 1
#define CXLKV_NDP_OP_GATHER 2
#define CXLKV_NDP_OP_BUILD_BOUNDS 3
#define CXLKV_NDP_OP_HOTLIST 4

/* SCORE_TOPK flags (cmd.flags). */
#define CXLKV_NDP_FLAG_PRUNE (1u << 0)     /* skip blocks on their key bounds (exact) */
#define CXLKV_NDP_FLAG_GROUP_MAX (1u << 1) /* one list ranked by the group's max; else per query */
#define CXLKV_NDP_FLAG_GATHER_V (1u << 2)  /* return the value rows of the hits */
#define CXLKV_NDP_FLAGS_ALL 0x7u

/* Completion status (cpl.status). */
#define CXLKV_NDP_OK 0
#define CXLKV_NDP_ERR_OPCODE 1        /* unknown opcode */
#define CXLKV_NDP_ERR_RANGE 2         /* args/result range not inside one block of the submitter's partition */
#define CXLKV_NDP_ERR_ARGS 3          /* k, group, dim, flags, counts or lengths out of range */
#define CXLKV_NDP_ERR_BLOCK 4         /* a named block is missing or its header does not validate */
#define CXLKV_NDP_ERR_LAYOUT 5        /* codec, sequence, layer, head, dtype, dim or token offset mismatch */
#define CXLKV_NDP_ERR_STALE 6         /* a block changed while it was scanned; nothing returned */
#define CXLKV_NDP_ERR_RESULT_SIZE 7   /* the result buffer is too small */
#define CXLKV_NDP_ERR_TOKEN 8         /* a token index is in none of the blocks */
#define CXLKV_NDP_ERR_RING 9          /* the submission ring's indices are inconsistent */
#define CXLKV_NDP_ERR_RESTARTED 10    /* pending when a new device instance started; not executed */
#define CXLKV_NDP_ERR_INTERNAL 11     /* the device failed; the command had no effect */
#define CXLKV_NDP_ERR_CHECKSUM 12     /* BUILD_BOUNDS: the payload CRC does not match its header */

/* Device counters (regs.counters[i]). */
#define CXLKV_NDP_CTR_COMMANDS 0
#define CXLKV_NDP_CTR_ERRORS 1
#define CXLKV_NDP_CTR_BYTES_SCANNED 2
#define CXLKV_NDP_CTR_BYTES_RETURNED 3
#define CXLKV_NDP_CTR_BYTES_RECEIVED 4
#define CXLKV_NDP_CTR_BLOCKS_SCANNED 5
#define CXLKV_NDP_CTR_BLOCKS_PRUNED 6
#define CXLKV_NDP_CTR_BUSY_NS 7

/* One entry of the hotlist window and of a HOTLIST result. */
struct cxlkv_ndp_hot_entry {
    uint64_t key_lo;   /* block key */
    uint64_t key_hi;
    uint64_t heat;     /* epoch-decayed access count, fixed point x256 */
    uint64_t accesses; /* accesses since the device started */
};

/* Device registers at offset 0 of the device area. Written by the device only, except the
 * doorbell line, which clients write. */
struct cxlkv_ndp_regs {
    /* line 0: identity, written once per device start; magic last (Release) */
    uint64_t magic;           /* CXLKV_NDP_MAGIC, or 0 while no device is attached */
    uint32_t abi_major;       /* CXLKV_NDP_ABI_MAJOR */
    uint32_t abi_minor;       /* CXLKV_NDP_ABI_MINOR */
    uint64_t capabilities;    /* CXLKV_NDP_CAP_* */
    uint64_t generation;      /* bumped on every device start */
    uint64_t pid;             /* process id of the device model (0 for hardware) */
    uint32_t queue_pairs;     /* queue pairs served: slots 0..queue_pairs */
    uint32_t queue_depth;     /* CXLKV_NDP_QUEUE_DEPTH */
    uint64_t qp_offset;       /* offset of queue pair 0 from the device area */
    uint64_t qp_stride;       /* bytes between queue pairs */
    /* line 1: limits */
    uint32_t max_k;
    uint32_t max_group;
    uint32_t max_blocks;
    uint32_t max_dim;
    uint64_t internal_bw_mbps; /* pacing of scans, MB/s; 0 = unpaced */
    uint64_t link_bw_mbps;     /* modeled link bandwidth, MB/s; 0 = not modeled */
    uint64_t link_latency_ns;  /* modeled link latency */
    uint64_t reserved1[3];
    /* line 2: liveness, device-written */
    uint64_t heartbeat_ns;     /* wall clock (ns since the Unix epoch), refreshed every 10 ms */
    uint64_t sleeping;         /* nonzero while the device may block on the doorbell futex */
    uint64_t reserved2[6];
    /* line 3: doorbell, client-written (fetch-add); the device futex-waits on its low 32 bits */
    uint64_t doorbell;
    uint64_t reserved3[7];
    /* lines 4-5: counters, device-written */
    uint64_t counters[CXLKV_NDP_COUNTERS];
    /* lines 6-: CHMU-style hotlist window, device-written at each epoch end */
    uint64_t hot_epoch;        /* epochs completed */
    uint64_t hot_count;        /* valid entries in hot[] */
    uint64_t hot_epoch_ns;     /* epoch length */
    uint64_t reserved4[5];
    struct cxlkv_ndp_hot_entry hot[CXLKV_NDP_HOTLIST_WINDOW];
    uint8_t reserved5[4096 - 448 - 32 * CXLKV_NDP_HOTLIST_WINDOW];
};

/* Ring indices at the start of a queue pair, one writer per cache line. */
struct cxlkv_ndp_qp_indices {
    uint64_t sq_tail;        /* client: commands written (Release after the slot) */
    uint64_t pad0[7];
    uint64_t sq_head;        /* device: commands consumed */
    uint64_t pad1[7];
    uint64_t cq_tail;        /* device: completions written (Release after the slot); futex word */
    uint64_t pad2[7];
    uint64_t cq_head;        /* client: completions consumed */
    uint64_t cq_waiters;     /* client: nonzero while it may block on the cq_tail futex */
    uint64_t pad3[6];
};

/* A command (64 bytes). Arguments and results live in blocks of the submitter's own partition. */
struct cxlkv_ndp_cmd {
    uint64_t tag;         /* client-chosen, echoed in the completion */
    uint16_t opcode;      /* CXLKV_NDP_OP_* */
    uint16_t flags;       /* CXLKV_NDP_FLAG_* */
    uint32_t k;           /* SCORE_TOPK: hits per list; GATHER: rows; HOTLIST: max entries */
    uint64_t sequence;    /* sequence id every named block must carry */
    uint32_t layer;       /* model layer every named block must carry */
    uint16_t kv_head;     /* KV head to score or gather */
    uint8_t dtype;        /* element type code of K and V (1 f16, 2 bf16, 3 f32) */
    uint8_t group;        /* G: query vectors of the GQA group */
    uint32_t dim;         /* head dimension */
    uint32_t nblocks;     /* entries of the block list */
    uint64_t args_off;    /* pool offset of the arguments */
    uint64_t result_off;  /* pool offset of the result buffer */
    uint32_t args_len;    /* bytes of arguments */
    uint32_t result_len;  /* bytes the result buffer may take */
};

/* A completion (64 bytes). */
struct cxlkv_ndp_cpl {
    uint64_t tag;            /* the command's tag (0 for a ring error) */
    uint32_t status;         /* CXLKV_NDP_OK or CXLKV_NDP_ERR_* */
    uint32_t detail;         /* index of the offending block or token, when there is one */
    uint64_t result_bytes;   /* bytes written to the result buffer */
    uint64_t bytes_scanned;  /* key bytes the device read */
    uint64_t device_ns;      /* execution time on the device, pacing included */
    uint32_t blocks_scanned;
    uint32_t blocks_pruned;
    uint64_t index;          /* free-running completion index of this entry */
    uint64_t generation;     /* device generation that wrote it */
};

/* One entry of a block list (24 bytes): a typed KV block named by key, with the position of its
 * first token, which must match the block's layout. */
struct cxlkv_ndp_block {
    uint64_t key_lo;
    uint64_t key_hi;
    uint64_t token_offset;
};

/* A (token, score) hit. */
struct cxlkv_ndp_hit {
    uint32_t token;
    float score;
};

/* Header of a SCORE_TOPK / GATHER / BUILD_BOUNDS / HOTLIST result (64 bytes), followed by the
 * sections at the offsets it names (from the start of the result buffer). */
struct cxlkv_ndp_result {
    uint32_t lists;          /* SCORE_TOPK: G per query, 1 group max; GATHER: 1 */
    uint32_t per_list;       /* hits (or rows, or hot entries) per list */
    uint32_t dim;            /* elements per value row */
    uint32_t dtype;          /* value element type code */
    uint32_t hits_off;       /* struct cxlkv_ndp_hit [lists][per_list], best first */
    uint32_t values_off;     /* value rows [lists][per_list][dim], when gathered; 0 if none */
    uint32_t mass_off;       /* f32 [nblocks]: softmax mass of list 0's hits per block */
    uint32_t nblocks;        /* blocks named */
    uint64_t bytes_scanned;  /* key bytes read */
    uint32_t blocks_scanned;
    uint32_t blocks_pruned;
    uint32_t bounds_off;     /* BUILD_BOUNDS: f32 [2][dim] min then max; HOTLIST: entries */
    uint32_t bounds_match;   /* BUILD_BOUNDS: 1 if the stored bounds equal the computed ones */
    uint64_t total_bytes;    /* bytes of the whole result */
};

#endif /* CXLKV_NDP_H */
