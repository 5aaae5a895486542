/*
 * cxlkv NDP device ABI, version 1.4 (docs/ABI.md is its prose twin). 1.1 adds ATTEND and SCORE_TOPK
 * selection (CXLKV_NDP_FLAG_SELECT); 1.2 adds the sparse ATTEND (ATTEND with CXLKV_NDP_FLAG_SELECT)
 * and quantized blocks; 1.3 key sketches; 1.4 the tenant check (CXLKV_NDP_CAP_TENANT: a block of
 * another tenant completes with CXLKV_NDP_ERR_ACCESS). An older client's commands mean what they
 * meant.
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
#define CXLKV_NDP_ABI_MINOR 4

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
#define CXLKV_NDP_CAP_ATTEND (1ULL << 7) /* ABI 1.1: CXLKV_NDP_OP_ATTEND */
#define CXLKV_NDP_CAP_SELECT (1ULL << 8) /* ABI 1.1: SCORE_TOPK with CXLKV_NDP_FLAG_SELECT */
#define CXLKV_NDP_CAP_SPARSE_ATTEND (1ULL << 9) /* ABI 1.2: ATTEND with CXLKV_NDP_FLAG_SELECT */
#define CXLKV_NDP_CAP_QUANT (1ULL << 10) /* ABI 1.2: blocks of dtype 4 (int8) and 5 (int4) */
#define CXLKV_NDP_CAP_SKETCH (1ULL << 11) /* ABI 1.3: sparse ATTEND with CXLKV_NDP_SEL_SKETCH, and over int8/int4 blocks */
#define CXLKV_NDP_CAP_TENANT (1ULL << 12) /* ABI 1.4: a command is served only blocks of its queue's
                                           * tenant (participant slot word 40) or of tenant 0 */

/* Opcodes (cmd.opcode). */
#define CXLKV_NDP_OP_NOP 0
#define CXLKV_NDP_OP_SCORE_TOPK 1
#define CXLKV_NDP_OP_GATHER 2
#define CXLKV_NDP_OP_BUILD_BOUNDS 3
#define CXLKV_NDP_OP_HOTLIST 4
#define CXLKV_NDP_OP_ATTEND 5 /* ABI 1.1: partial attention of G queries over a block list */

/* SCORE_TOPK flags (cmd.flags). */
#define CXLKV_NDP_FLAG_PRUNE (1u << 0)     /* skip blocks on their key bounds (exact) */
#define CXLKV_NDP_FLAG_GROUP_MAX (1u << 1) /* one list ranked by the group's max; else per query */
#define CXLKV_NDP_FLAG_GATHER_V (1u << 2)  /* return the value rows of the hits */
#define CXLKV_NDP_FLAG_SELECT (1u << 3)    /* ABI 1.1: args end with struct cxlkv_ndp_select */
#define CXLKV_NDP_FLAGS_ALL 0xFu

/* Options of struct cxlkv_ndp_select (select.options). */
#define CXLKV_NDP_SEL_WINDOW (1u << 0)  /* [window_start, window_end) is always included */
#define CXLKV_NDP_SEL_EXCLUDE (1u << 1) /* [exclude_start, exclude_end) is never returned */
#define CXLKV_NDP_SEL_TOP_P (1u << 2)   /* top_p in (0, 1]: fewest hits reaching that mass, k the cap */
#define CXLKV_NDP_SEL_ALL 0x7u       /* the options a selected SCORE_TOPK takes */
#define CXLKV_NDP_SEL_SKETCH (1u << 3) /* ABI 1.3, sparse ATTEND only: score the blocks' key sketch,
                                        * re-score select.candidates per query on the exact keys */
#define CXLKV_NDP_MAX_CANDIDATES 65536u /* select.candidates at most */

/* cpl.detail of a CXLKV_NDP_ERR_ARGS completion caused by a selection or ATTEND argument. */
#define CXLKV_NDP_DETAIL_BAD_P 1          /* top_p outside (0, 1] */
#define CXLKV_NDP_DETAIL_BAD_WINDOW 2     /* window reversed or past the last stored token */
#define CXLKV_NDP_DETAIL_BAD_EXCLUDE 3    /* exclusion range reversed */
#define CXLKV_NDP_DETAIL_TOO_MANY_FORCED 4 /* more forced tokens (sinks, window) than k */
#define CXLKV_NDP_DETAIL_BAD_OPTIONS 5    /* unknown select.options bits or nonzero reserved fields */
#define CXLKV_NDP_DETAIL_BAD_SCALE 6      /* scale not finite */

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
#define CXLKV_NDP_ERR_ACCESS 13       /* ABI 1.4: a named block belongs to another tenant (detail: its index) */

/* Device counters (regs.counters[i]). */
#define CXLKV_NDP_CTR_COMMANDS 0
#define CXLKV_NDP_CTR_ERRORS 1
#define CXLKV_NDP_CTR_BYTES_SCANNED 2
#define CXLKV_NDP_CTR_BYTES_RETURNED 3
#define CXLKV_NDP_CTR_BYTES_RECEIVED 4
#define CXLKV_NDP_CTR_BLOCKS_SCANNED 5
#define CXLKV_NDP_CTR_BLOCKS_PRUNED 6
#define CXLKV_NDP_CTR_BUSY_NS 7
#define CXLKV_NDP_CTR_REFUSED 8      /* ABI 1.4: commands completed with CXLKV_NDP_ERR_ACCESS */

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
    uint32_t k;           /* SCORE_TOPK: hits per list (the cap with top-p); GATHER: rows;
                           * HOTLIST: max entries; ATTEND: 0 */
    uint64_t sequence;    /* sequence id every named block must carry */
    uint32_t layer;       /* model layer every named block must carry */
    uint16_t kv_head;     /* KV head to score or gather */
    uint8_t dtype;        /* element type code of K and V (1 f16, 2 bf16, 3 f32; 1.2: 4 int8, 5 int4) */
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

/* SCORE_TOPK selection (64 bytes), the last argument when cmd.flags has CXLKV_NDP_FLAG_SELECT:
 * args = f32 queries [G][dim], struct cxlkv_ndp_block [nblocks], struct cxlkv_ndp_select.
 * A selected command scores every stored token (FLAG_PRUNE is refused with it). Per list, the
 * forced tokens F = ({t < sinks} u window) minus exclude, among the stored ones, plus the best of
 * the others: up to k in total, or with SEL_TOP_P the fewest in descending score whose softmax
 * mass (of scale * score over every stored token outside exclude) with F's reaches top_p, at most
 * k. Lists are best first, padded to per_list with token 0xFFFFFFFF; result.bounds_off names
 * struct cxlkv_ndp_list_info [lists]. The block mass of the result uses this scale. */
struct cxlkv_ndp_select {
    float scale;             /* applied to q.k before exp in every mass */
    float top_p;             /* with CXLKV_NDP_SEL_TOP_P: p in (0, 1] */
    uint32_t options;        /* CXLKV_NDP_SEL_* */
    uint32_t candidates;     /* with CXLKV_NDP_SEL_SKETCH: 1..=MAX_CANDIDATES per query; else 0 */
    uint64_t sinks;          /* tokens 0..sinks are always included (0: none) */
    uint64_t window_start;   /* with CXLKV_NDP_SEL_WINDOW: [start, end), end <= last stored token + 1 */
    uint64_t window_end;
    uint64_t exclude_start;  /* with CXLKV_NDP_SEL_EXCLUDE: [start, end) (the host holds it) */
    uint64_t exclude_end;
    uint64_t reserved1;      /* 0 */
};

/* Per list of a selected SCORE_TOPK result (8 bytes): hits returned and the softmax mass of the
 * stored tokens (outside exclude) it does not return. */
struct cxlkv_ndp_list_info {
    uint32_t count;
    float left_out_mass;
};

/* ATTEND arguments' tail (16 bytes): args = f32 queries [G][dim], struct cxlkv_ndp_block
 * [nblocks], struct cxlkv_ndp_attend. cmd.k and cmd.flags are 0. The device reads every key and
 * value row of the blocks (pinned, in place) and returns per query q the partial over all of them:
 * m = max_i scale*q.k_i, l = sum_i exp(scale*q.k_i - m), o = sum_i exp(scale*q.k_i - m) v_i (f32).
 * Result: struct cxlkv_ndp_result with lists = G, per_list = 1, dim, dtype 3 (f32),
 * hits_off -> struct cxlkv_ndp_partial [G], values_off -> f32 o [G][dim], nblocks 0;
 * bytes_scanned counts key and value bytes. */
struct cxlkv_ndp_attend {
    float scale;       /* applied to q.k before exp; finite */
    uint32_t reserved0; /* 0 */
    uint64_t reserved1; /* 0 */
};

/* Sparse ATTEND (ABI 1.2, CXLKV_NDP_CAP_SPARSE_ATTEND): ATTEND with cmd.flags = CXLKV_NDP_FLAG_SELECT and
 * cmd.k in 1..=max_k. args = f32 queries [G][dim], struct cxlkv_ndp_block [nblocks],
 * struct cxlkv_ndp_attend, struct cxlkv_ndp_select (select.scale must equal attend.scale). The device
 * scores every stored key for each query and selects per query exactly as a selected SCORE_TOPK
 * does (sinks, window, exclude, top-k or top-p by exact mass, at most k); U = the union of the G
 * lists, sorted by token. Each query's partial is then computed over U's rows only (gathered in
 * token order, one fused pass in tiles of 64 rows, no block merge). Result: ATTEND's, plus
 * bounds_off -> struct cxlkv_ndp_list_info [G]: count = |U|, left_out_mass = the softmax mass of
 * the query (over every stored token outside exclude) that U does not hold:
 * max(0, 1 - l_U exp(m_U - max_q) / sum_q), (max_q, sum_q) the query's log-sum-exp in f64.
 * bytes_scanned = every key byte scored + |U| key and value rows. Quantized blocks (ABI 1.3, with
 * CAP_QUANT): each block's rows of U scored and attended with its own folded queries and value
 * scales (as ATTEND does), the partials of U's per-block runs merged in token order.
 *
 * With CXLKV_NDP_SEL_SKETCH (ABI 1.3, CXLKV_NDP_CAP_SKETCH; every block must carry a key sketch,
 * else ERR_LAYOUT): every stored token is scored on the sketch (its codes with the queries folded
 * by the sketch's per-channel scales); per query the candidates are the forced tokens plus the
 * `candidates` best by sketch score; C = their union over the group, sorted by token. C's key rows
 * are read and scored exactly, and the selection (top-k, or top-p by mass) is made among C on the
 * exact scores. The mass denominator is C's exact terms (in token order, f64) plus every other
 * stored token's sketch term (per block in list order: summed in f32 with exp_neg against the
 * block's maximum, then rescaled into the f64 sum): left_out_mass is an estimate outside C.
 * result.bounds_match = |C| (rows re-scored). bytes_scanned = the sketch bytes (codes and scales)
 * + |C| key rows + |U| value rows (+ scales of quantized blocks). */

/* max and sum of one query's ATTEND partial (8 bytes). */
struct cxlkv_ndp_partial {
    float max;  /* largest scaled score (-inf over no keys) */
    float sum;  /* sum of exp(scaled score - max) */
};

/* A (token, score) hit. */
struct cxlkv_ndp_hit {
    uint32_t token;
    float score;
};

/* Header of a SCORE_TOPK / GATHER / BUILD_BOUNDS / HOTLIST / ATTEND result (64 bytes), followed by the
 * sections at the offsets it names (from the start of the result buffer). */
struct cxlkv_ndp_result {
    uint32_t lists;          /* SCORE_TOPK: G per query, 1 group max; GATHER: 1; ATTEND: G */
    uint32_t per_list;       /* hits (or rows, or hot entries) per list */
    uint32_t dim;            /* elements per value row */
    uint32_t dtype;          /* value element type code (3 f32 for rows of int8/int4 blocks) */
    uint32_t hits_off;       /* struct cxlkv_ndp_hit [lists][per_list], best first */
    uint32_t values_off;     /* value rows [lists][per_list][dim], when gathered; 0 if none */
    uint32_t mass_off;       /* f32 [nblocks]: softmax mass of list 0's hits per block */
    uint32_t nblocks;        /* blocks named */
    uint64_t bytes_scanned;  /* key bytes read */
    uint32_t blocks_scanned;
    uint32_t blocks_pruned;
    uint32_t bounds_off;     /* BUILD_BOUNDS: f32 [2][dim] min then max; HOTLIST: entries;
                              * SCORE_TOPK with FLAG_SELECT: struct cxlkv_ndp_list_info [lists] */
    uint32_t bounds_match;   /* BUILD_BOUNDS: 1 if the stored bounds equal the computed ones;
                              * sparse ATTEND with SEL_SKETCH: key rows re-scored exactly */
    uint64_t total_bytes;    /* bytes of the whole result */
};

#endif /* CXLKV_NDP_H */
