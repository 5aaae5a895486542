// The HLS top function: SCORE_TOPK (full and bound-pruned, per query or group max, optional
// selection and value gather), GATHER, ATTEND and the sparse ATTEND (FLAG_SELECT) over resolved
// blocks in card memory, f16/bf16/f32 rows and int8/int4 codes with their scales. See
// cxlkv_ndp_kernel.h for the ports and fpga/README.md for the pragmas' reasoning.
#include "cxlkv_ndp_attend.h"
#include "cxlkv_ndp_kernel.h"
#include "cxlkv_ndp_select.h"
#include "cxlkv_ndp_sparse.h"

using namespace cxlkv_hls;

namespace {

constexpr int KMAX = CXLKV_HLS_KMAX;
constexpr int GMAX = CXLKV_HLS_GMAX;
constexpr int DMAX = CXLKV_HLS_DMAX;
constexpr int MAXB = CXLKV_HLS_MAX_BLOCKS;

// The block holding token t, or -1.
int locate(const cxlkv_hls_block* blocks, uint32_t nblocks, uint32_t t, uint32_t& row) {
LOCATE:
    for (uint32_t b = 0; b < nblocks; ++b) {
        uint32_t base = blocks[b].base;
        if (t >= base && t - base < blocks[b].tokens) {
            row = t - base;
            return int(b);
        }
    }
    return -1;
}

// Copies row `row` of block b's values to out: rw 16-bit words as stored, or for a quantized
// block the row dequantized to f32 (x[d] = code[d] * the token's scale, one f32 multiply; 2 * dim
// words), as the ABI returns gathered rows of quantized blocks.
void copy_row(const uint16_t* values, const float* meta, const cxlkv_hls_block& b, uint32_t row,
              uint32_t dim, uint32_t rw, uint8_t dtype, uint16_t* out) {
    const uint16_t* src = values + b.v_elem + uint64_t(row) * rw;
    if (is_quantized(dtype)) {
        const float s = meta[b.vscale_elem + row];
    DEQUANT:
        for (uint32_t d = 0; d < dim; ++d) {
#pragma HLS PIPELINE II = 1
            const float c = dtype == CXLKV_HLS_DTYPE_I8 ? i8_at(src, d) : i4_at(src, d);
            const uint32_t x = f32_bits(c * s);
            out[2 * d] = uint16_t(x);
            out[2 * d + 1] = uint16_t(x >> 16);
        }
        return;
    }
COPY:
    for (uint32_t w = 0; w < rw; ++w) {
#pragma HLS PIPELINE II = 1
        out[w] = src[w];
    }
}

// 16-bit words of a returned (gathered) row: f32 for quantized blocks.
uint32_t out_row_words(uint8_t dtype, uint32_t dim, uint32_t rw) {
    return is_quantized(dtype) ? 2 * dim : rw;
}

// The queries a block is scored with: q itself, or folded with a quantized block's key scales
// into qf. Returns the one to use.
typedef float QueryRow[DMAX];
const QueryRow* block_queries(const QueryRow* q, const float* meta, const cxlkv_hls_block& b,
                              uint8_t dtype, uint32_t g, uint32_t dim, QueryRow* qf) {
    if (!is_quantized(dtype)) return q;
    fold_queries<GMAX, DMAX>(q, meta + b.kscale_elem, g, dim, qf);
    return qf;
}

// Key bytes a scan reads of block b: its key rows, and a quantized block's key scales.
uint64_t key_bytes(const cxlkv_hls_block& b, uint32_t dim, uint32_t rw, uint8_t dtype) {
    return uint64_t(b.tokens) * rw * 2 + (is_quantized(dtype) ? 4ull * dim : 0);
}

// A selecting SCORE_TOPK: every block in list order through reader -> dot -> reduce -> selection,
// then each list's finish pass, its hits (and value rows) and its left-out mass.
void select_scan(const cxlkv_ndp_cmd& cmd, const cxlkv_ndp_select& p, const uint16_t* keys,
                 const uint16_t* values, const float* meta, const cxlkv_hls_block* blocks,
                 const float q[GMAX][DMAX], uint32_t rw, cxlkv_ndp_hit* hits, uint16_t* rows_out,
                 uint32_t per_list, cxlkv_ndp_list_info* info, cxlkv_ndp_cpl& c) {
    const uint32_t g = cmd.group, k = cmd.k, dim = cmd.dim, n = cmd.nblocks;
    const bool group_max = (cmd.flags & CXLKV_NDP_FLAG_GROUP_MAX) != 0;
    const bool gather = (cmd.flags & CXLKV_NDP_FLAG_GATHER_V) != 0;
    uint64_t end = 0;
    for (uint32_t b = 0; b < n; ++b) {
        uint64_t e = uint64_t(blocks[b].base) + blocks[b].tokens;
        end = e > end ? e : end;
    }
    uint32_t bad = sel_check(p, end);
    if (bad != 0) {
        c.status = CXLKV_NDP_ERR_ARGS;
        c.detail = bad;
        return;
    }
    static SelList<KMAX> lists[GMAX];
    for (int l = 0; l < GMAX; ++l) sel_clear<KMAX>(lists[l]);
    float qf[GMAX][DMAX];
#pragma HLS ARRAY_PARTITION variable = qf complete dim = 1
SCAN_SEL:
    for (uint32_t b = 0; b < n; ++b) {
        const cxlkv_hls_block blk = blocks[b];
        select_block<GMAX, DMAX, KMAX>(keys + blk.k_elem, blk.tokens, blk.base, dim, cmd.dtype,
                                       block_queries(q, meta, blk, cmd.dtype, g, dim, qf), g, k,
                                       group_max, p, lists);
        c.blocks_scanned += 1;
        c.bytes_scanned += key_bytes(blk, dim, rw, cmd.dtype);
    }
    const uint32_t orw = out_row_words(cmd.dtype, dim, rw);
    const uint32_t lists_n = group_max ? 1 : g;
    static Hit chosen[KMAX];
OUT_SEL:
    for (uint32_t l = 0; l < lists_n; ++l) {
        float left = 0.0f;
        int m = sel_finish<KMAX>(lists[l], p, k, chosen, &left);
        if (m < 0) {
            c.status = CXLKV_NDP_ERR_ARGS;
            c.detail = CXLKV_NDP_DETAIL_TOO_MANY_FORCED;
            return;
        }
        info[l].count = uint32_t(m);
        info[l].left_out_mass = left;
    SEL_HITS:
        for (uint32_t i = 0; i < per_list; ++i) {
            const uint32_t at = l * per_list + i;
            if (i >= uint32_t(m)) {
                // Padding, as the ABI's result: token 0xFFFFFFFF, score -inf, a zero row.
                hits[at].token = 0xFFFFFFFFu;
                hits[at].score = -INFINITY;
                if (gather) {
                    for (uint32_t w = 0; w < orw; ++w) rows_out[uint64_t(at) * orw + w] = 0;
                }
                continue;
            }
            hits[at].token = chosen[i].index;
            hits[at].score = chosen[i].score;
            if (gather) {
                uint32_t row = 0;
                int b = locate(blocks, n, chosen[i].index, row);
                if (b < 0) {
                    c.status = CXLKV_NDP_ERR_TOKEN;
                    c.detail = at;
                    return;
                }
                copy_row(values, meta, blocks[b], row, dim, rw, cmd.dtype,
                         rows_out + uint64_t(at) * orw);
            }
        }
    }
    c.result_bytes =
        uint64_t(lists_n) * per_list * (8 + (gather ? orw * 2 : 0)) + uint64_t(lists_n) * 8;
}

// ATTEND: the G partials over the blocks, in list order, each block in tiles of ATTEND_TILE rows.
void attend(const cxlkv_ndp_cmd& cmd, float scale, const uint16_t* keys, const uint16_t* values,
            const float* queries, const float* meta, const cxlkv_hls_block* blocks, uint32_t rw,
            float* att_out, cxlkv_ndp_partial* att_ms, cxlkv_ndp_cpl& c) {
    const uint32_t dim = cmd.dim, g = cmd.group;
    float q[GMAX][DMAX];
#pragma HLS ARRAY_PARTITION variable = q complete dim = 1
LOAD_QA:
    for (uint32_t i = 0; i < uint32_t(GMAX) * DMAX; ++i) {
#pragma HLS PIPELINE II = 1
        uint32_t qi = i / DMAX, d = i % DMAX;
        q[qi][d] = (qi < g && d < dim) ? queries[qi * dim + d] : 0.0f;
    }
    static float sbuf[ATTEND_TILE][GMAX];
#pragma HLS ARRAY_PARTITION variable = sbuf complete dim = 2
    static Partials<GMAX, DMAX> acc, blk;
#pragma HLS ARRAY_PARTITION variable = acc.out complete dim = 1
#pragma HLS ARRAY_PARTITION variable = blk.out complete dim = 1
    partials_clear<GMAX, DMAX>(acc);
    const bool quant = is_quantized(cmd.dtype);
    float qf[GMAX][DMAX];
#pragma HLS ARRAY_PARTITION variable = qf complete dim = 1
BLOCKS:
    for (uint32_t b = 0; b < cmd.nblocks; ++b) {
        const cxlkv_hls_block bl = blocks[b];
        attend_block<GMAX, DMAX>(keys + bl.k_elem, values + bl.v_elem,
                                 quant ? meta + bl.vscale_elem : nullptr, bl.tokens, dim, rw,
                                 cmd.dtype, block_queries(q, meta, bl, cmd.dtype, g, dim, qf), g,
                                 scale, sbuf, blk, acc);
        c.blocks_scanned += 1;
        // Key and value rows; a quantized block's key and value scales.
        c.bytes_scanned += 2 * uint64_t(bl.tokens) * rw * 2 + (quant ? 4ull * (dim + bl.tokens) : 0);
    }
OUT_A:
    for (uint32_t qi = 0; qi < g; ++qi) {
        for (uint32_t d = 0; d < dim; ++d) {
#pragma HLS PIPELINE II = 1
            att_out[qi * dim + d] = acc.out[qi][d];
        }
        att_ms[qi].max = acc.max[qi];
        att_ms[qi].sum = acc.sum[qi];
    }
    c.result_bytes = uint64_t(g) * (dim + 2) * 4;
}

// Sparse ATTEND (ATTEND with FLAG_SELECT; cxlkv_ndp_sparse.h): every block in list order through
// reader -> dot -> reduce -> selection (one list per query), the union U of the G lists (ascending
// tokens, written to hits[0..|U|) with score 0 when hits is not null), then the partial over U's
// rows: 64 rows at a time gathered from their blocks into tile buffers and folded by the ATTEND
// unit, exactly as one attend_block over the gathered rows. info[q] = (|U|, left-out mass of q).
// Quantized blocks are not served here (each block scores with its own folded queries, which a
// tile of gathered rows would mix): ERR_ARGS, DETAIL_BAD_OPTIONS.
void sparse_attend(const cxlkv_ndp_cmd& cmd, const cxlkv_ndp_select& p, float scale,
                   const uint16_t* keys, const uint16_t* values, const float* queries,
                   const cxlkv_hls_block* blocks, uint32_t rw, cxlkv_ndp_hit* hits,
                   float* att_out, cxlkv_ndp_partial* att_ms, cxlkv_ndp_list_info* info,
                   cxlkv_ndp_cpl& c) {
    const uint32_t g = cmd.group, k = cmd.k, dim = cmd.dim, n = cmd.nblocks;
    if (is_quantized(cmd.dtype)) {
        c.status = CXLKV_NDP_ERR_ARGS;
        c.detail = CXLKV_NDP_DETAIL_BAD_OPTIONS;
        return;
    }
    uint64_t end = 0;
    for (uint32_t b = 0; b < n; ++b) {
        uint64_t e = uint64_t(blocks[b].base) + blocks[b].tokens;
        end = e > end ? e : end;
    }
    uint32_t bad = sel_check(p, end);
    // The selection's masses and the partials use one scale.
    if (bad == 0 && !(p.scale == scale)) bad = CXLKV_NDP_DETAIL_BAD_SCALE;
    if (bad != 0) {
        c.status = CXLKV_NDP_ERR_ARGS;
        c.detail = bad;
        return;
    }
    float q[GMAX][DMAX];
#pragma HLS ARRAY_PARTITION variable = q complete dim = 1
LOAD_QS:
    for (uint32_t i = 0; i < uint32_t(GMAX) * DMAX; ++i) {
#pragma HLS PIPELINE II = 1
        uint32_t qi = i / DMAX, d = i % DMAX;
        q[qi][d] = (qi < g && d < dim) ? queries[qi * dim + d] : 0.0f;
    }
    static SelList<KMAX> lists[GMAX];
    for (int l = 0; l < GMAX; ++l) sel_clear<KMAX>(lists[l]);
SCAN_SPARSE:
    for (uint32_t b = 0; b < n; ++b) {
        const cxlkv_hls_block blk = blocks[b];
        select_block<GMAX, DMAX, KMAX>(keys + blk.k_elem, blk.tokens, blk.base, dim, cmd.dtype, q,
                                       g, k, false, p, lists);
        c.blocks_scanned += 1;
        c.bytes_scanned += key_bytes(blk, dim, rw, cmd.dtype);
    }
    static Hit chosen[KMAX];
    static uint32_t u[GMAX * KMAX], a[GMAX * KMAX], tmp[GMAX * KMAX];
    const int nu = sparse_union<KMAX>(lists, g, p, k, chosen, u, a, tmp);
    if (nu < 0) {
        c.status = CXLKV_NDP_ERR_ARGS;
        c.detail = CXLKV_NDP_DETAIL_TOO_MANY_FORCED;
        return;
    }
    // The partial over U: tiles of gathered key and value rows.
    static uint16_t kt[ATTEND_TILE * 2 * DMAX], vt[ATTEND_TILE * 2 * DMAX];
    static float sbuf[ATTEND_TILE][GMAX];
#pragma HLS ARRAY_PARTITION variable = sbuf complete dim = 2
    static Partials<GMAX, DMAX> part;
#pragma HLS ARRAY_PARTITION variable = part.out complete dim = 1
    float tmax[GMAX];
#pragma HLS ARRAY_PARTITION variable = tmax complete
    partials_clear<GMAX, DMAX>(part);
SPARSE_TILES:
    for (uint32_t r = 0; r < uint32_t(nu); r += ATTEND_TILE) {
        const uint32_t rows = uint32_t(nu) - r < ATTEND_TILE ? uint32_t(nu) - r : ATTEND_TILE;
    GATHER_TILE:
        for (uint32_t i = 0; i < rows; ++i) {
            uint32_t row = 0;
            const int b = locate(blocks, n, u[r + i], row);
            if (b < 0) {
                c.status = CXLKV_NDP_ERR_TOKEN;
                c.detail = r + i;
                return;
            }
            const uint64_t at = uint64_t(row) * rw;
        COPY_KV:
            for (uint32_t w = 0; w < rw; ++w) {
#pragma HLS PIPELINE II = 1
                kt[i * rw + w] = keys[blocks[b].k_elem + at + w];
                vt[i * rw + w] = values[blocks[b].v_elem + at + w];
            }
        }
        attend_tile<GMAX, DMAX>(kt, vt, nullptr, rows, dim, cmd.dtype, q, g, scale, sbuf, tmax,
                                part);
    }
    c.bytes_scanned += uint64_t(nu) * rw * 2 * 2;
OUT_S:
    for (uint32_t qi = 0; qi < g; ++qi) {
        for (uint32_t d = 0; d < dim; ++d) {
#pragma HLS PIPELINE II = 1
            att_out[qi * dim + d] = part.out[qi][d];
        }
        att_ms[qi].max = part.max[qi];
        att_ms[qi].sum = part.sum[qi];
        info[qi].count = uint32_t(nu);
        info[qi].left_out_mass = sparse_left_out<KMAX>(lists[qi], part.max[qi], part.sum[qi]);
    }
    if (hits != nullptr) {
    OUT_U:
        for (uint32_t i = 0; i < uint32_t(nu); ++i) {
#pragma HLS PIPELINE II = 1
            hits[i].token = u[i];
            hits[i].score = 0.0f;
        }
    }
    c.result_bytes = uint64_t(g) * (dim + 2) * 4 + uint64_t(g) * 8;
}

}  // namespace

extern "C" void cxlkv_ndp_top(cxlkv_ndp_cmd cmd, cxlkv_ndp_select sel, cxlkv_ndp_attend att,
                              const uint16_t* keys, const uint16_t* values, const float* queries,
                              const float* bounds, const cxlkv_hls_block* blocks,
                              const uint32_t* tokens, cxlkv_ndp_hit* hits, uint16_t* rows_out,
                              float* att_out, cxlkv_ndp_partial* att_ms, cxlkv_ndp_list_info* info,
                              cxlkv_ndp_cpl* cpl) {
#pragma HLS INTERFACE mode = s_axilite port = cmd bundle = control
#pragma HLS AGGREGATE variable = cmd
#pragma HLS INTERFACE mode = s_axilite port = sel bundle = control
#pragma HLS AGGREGATE variable = sel
#pragma HLS INTERFACE mode = s_axilite port = att bundle = control
#pragma HLS AGGREGATE variable = att
#pragma HLS INTERFACE mode = m_axi port = keys offset = slave bundle = gmem0 max_read_burst_length = 64 num_read_outstanding = 16
#pragma HLS INTERFACE mode = m_axi port = values offset = slave bundle = gmem1
#pragma HLS INTERFACE mode = m_axi port = queries offset = slave bundle = gmem2
#pragma HLS INTERFACE mode = m_axi port = bounds offset = slave bundle = gmem2
#pragma HLS INTERFACE mode = m_axi port = blocks offset = slave bundle = gmem2
#pragma HLS INTERFACE mode = m_axi port = tokens offset = slave bundle = gmem2
#pragma HLS INTERFACE mode = m_axi port = hits offset = slave bundle = gmem3
#pragma HLS INTERFACE mode = m_axi port = rows_out offset = slave bundle = gmem3
#pragma HLS INTERFACE mode = m_axi port = att_out offset = slave bundle = gmem3
#pragma HLS INTERFACE mode = m_axi port = att_ms offset = slave bundle = gmem3
#pragma HLS INTERFACE mode = m_axi port = info offset = slave bundle = gmem3
#pragma HLS INTERFACE mode = m_axi port = cpl offset = slave bundle = gmem3
#pragma HLS INTERFACE mode = s_axilite port = return bundle = control

    cxlkv_ndp_cpl c;
    std::memset(&c, 0, sizeof c);
    c.tag = cmd.tag;
    c.status = CXLKV_NDP_OK;
    const uint32_t dim = cmd.dim, n = cmd.nblocks, k = cmd.k, g = cmd.group;
    // 16-bit words per stored row (0: unknown dtype) and per returned row (f32 for quantized).
    const uint32_t rw = row_words(cmd.dtype, dim);
    const uint32_t orw = out_row_words(cmd.dtype, dim, rw);
    bool shape_ok = rw != 0 && dim >= 16 && dim <= uint32_t(DMAX) && dim % LANES == 0 && n >= 1 &&
                    n <= uint32_t(MAXB);

    if (cmd.opcode == CXLKV_NDP_OP_GATHER) {
        if (!shape_ok || cmd.flags != 0 || k == 0 || k > CXLKV_NDP_MAX_K) {
            c.status = CXLKV_NDP_ERR_ARGS;
        } else {
        GATHER:
            for (uint32_t j = 0; j < k; ++j) {
                uint32_t row = 0;
                int b = locate(blocks, n, tokens[j], row);
                if (b < 0) {
                    c.status = CXLKV_NDP_ERR_TOKEN;
                    c.detail = j;
                    break;
                }
                hits[j].token = tokens[j];
                hits[j].score = 0.0f;
                copy_row(values, bounds, blocks[b], row, dim, rw, cmd.dtype,
                         rows_out + uint64_t(j) * orw);
            }
            if (c.status == CXLKV_NDP_OK) c.result_bytes = uint64_t(k) * (8 + orw * 2);
        }
        *cpl = c;
        return;
    }
    if (cmd.opcode == CXLKV_NDP_OP_ATTEND) {
        // ATTEND reads K and V of every block: k and flags 0, no pruning. With FLAG_SELECT (the
        // sparse ATTEND) k is the per-query cap, 1..=KMAX, and the arguments end with `sel`.
        const bool sparse = cmd.flags == CXLKV_NDP_FLAG_SELECT;
        if (!shape_ok || g == 0 || g > uint32_t(GMAX) ||
            (sparse ? (k == 0 || k > uint32_t(KMAX)) : (cmd.flags != 0 || k != 0))) {
            c.status = CXLKV_NDP_ERR_ARGS;
        } else if (att.reserved0 != 0 || att.reserved1 != 0) {
            c.status = CXLKV_NDP_ERR_ARGS;
            c.detail = CXLKV_NDP_DETAIL_BAD_OPTIONS;
        } else if (!std::isfinite(att.scale)) {
            c.status = CXLKV_NDP_ERR_ARGS;
            c.detail = CXLKV_NDP_DETAIL_BAD_SCALE;
        } else if (sparse) {
            sparse_attend(cmd, sel, att.scale, keys, values, queries, blocks, rw, hits, att_out,
                          att_ms, info, c);
        } else {
            attend(cmd, att.scale, keys, values, queries, bounds, blocks, rw, att_out, att_ms, c);
        }
        *cpl = c;
        return;
    }
    if (cmd.opcode != CXLKV_NDP_OP_SCORE_TOPK) {
        c.status = CXLKV_NDP_ERR_OPCODE;
        *cpl = c;
        return;
    }
    const uint32_t flags = cmd.flags;
    if (!shape_ok || (flags & ~CXLKV_NDP_FLAGS_ALL) != 0 || k == 0 || k > uint32_t(KMAX) ||
        g == 0 || g > uint32_t(GMAX)) {
        c.status = CXLKV_NDP_ERR_ARGS;
        *cpl = c;
        return;
    }
    const bool group_max = (flags & CXLKV_NDP_FLAG_GROUP_MAX) != 0;
    const bool prune = (flags & CXLKV_NDP_FLAG_PRUNE) != 0;
    const bool selecting = (flags & CXLKV_NDP_FLAG_SELECT) != 0;
    // A selection's mass needs every score: no pruning with it. Quantized blocks are scanned
    // whole (their bounds are of the codes, not of the folded scores; docs/ABI.md).
    if (prune && (selecting || is_quantized(cmd.dtype))) {
        c.status = CXLKV_NDP_ERR_ARGS;
        c.detail = CXLKV_NDP_DETAIL_BAD_OPTIONS;
        *cpl = c;
        return;
    }

    // Queries in on-chip memory: one bank per query, so the dot unit reads G values per cycle.
    float q[GMAX][DMAX];
#pragma HLS ARRAY_PARTITION variable = q complete dim = 1
LOAD_Q:
    for (uint32_t i = 0; i < uint32_t(GMAX) * DMAX; ++i) {
#pragma HLS PIPELINE II = 1
        uint32_t qi = i / DMAX, d = i % DMAX;
        q[qi][d] = (qi < g && d < dim) ? queries[qi * dim + d] : 0.0f;
    }
    static Hit lists[GMAX][KMAX];
#pragma HLS ARRAY_PARTITION variable = lists complete dim = 0
    uint32_t count[GMAX];
#pragma HLS ARRAY_PARTITION variable = count complete
    for (int i = 0; i < GMAX; ++i) count[i] = 0;

    uint64_t total_tokens = 0;
    for (uint32_t b = 0; b < n; ++b) total_tokens += blocks[b].tokens;

    if (selecting) {
        const uint32_t per_list = uint32_t(total_tokens < k ? total_tokens : k);
        select_scan(cmd, sel, keys, values, bounds, blocks, q, rw, hits, rows_out, per_list, info,
                    c);
        *cpl = c;
        return;
    }

    // Bound-pruned mode: per-query bounds of every block, visited by the highest group bound.
    float ub[MAXB][GMAX];
#pragma HLS ARRAY_PARTITION variable = ub complete dim = 2
    float best[MAXB];
    uint32_t order[MAXB];
    if (prune) {
        float lo[DMAX], hi[DMAX];
    BOUNDS:
        for (uint32_t b = 0; b < n; ++b) {
            for (uint32_t d = 0; d < dim; ++d) {
                lo[d] = bounds[blocks[b].bounds_elem + d];
                hi[d] = bounds[blocks[b].bounds_elem + dim + d];
            }
            float m = -INFINITY;
            for (uint32_t qi = 0; qi < g; ++qi) {
                ub[b][qi] = upper_bound(q[qi], lo, hi, dim);
                m = ub[b][qi] > m ? ub[b][qi] : m;
            }
            best[b] = m;
        }
        visit_order(best, n, order);
    } else {
        for (uint32_t b = 0; b < n; ++b) order[b] = b;
    }

    float qf[GMAX][DMAX];
#pragma HLS ARRAY_PARTITION variable = qf complete dim = 1
SCAN:
    for (uint32_t v = 0; v < n; ++v) {
        uint32_t b = order[v];
        if (prune && can_skip<GMAX, KMAX>(ub[b], g, k, group_max, lists, count)) {
            c.blocks_pruned += 1;
            continue;
        }
        const cxlkv_hls_block blk = blocks[b];
        scan_block<GMAX, DMAX, KMAX>(keys + blk.k_elem, blk.tokens, blk.base, dim, cmd.dtype,
                                     block_queries(q, bounds, blk, cmd.dtype, g, dim, qf), g, k,
                                     group_max, lists, count);
        c.blocks_scanned += 1;
        c.bytes_scanned += key_bytes(blk, dim, rw, cmd.dtype);
    }

    const uint32_t lists_n = group_max ? 1 : g;
    const uint32_t per_list = uint32_t(total_tokens < k ? total_tokens : k);
    const bool gather = (flags & CXLKV_NDP_FLAG_GATHER_V) != 0;
OUT:
    for (uint32_t l = 0; l < lists_n; ++l) {
        for (uint32_t i = 0; i < per_list; ++i) {
            Hit h = lists[l][i];
            hits[l * per_list + i].token = h.index;
            hits[l * per_list + i].score = h.score;
            if (gather) {
                uint32_t row = 0;
                int b = locate(blocks, n, h.index, row);
                if (b < 0) {
                    c.status = CXLKV_NDP_ERR_TOKEN;
                    c.detail = l * per_list + i;
                } else {
                    copy_row(values, bounds, blocks[b], row, dim, rw, cmd.dtype,
                             rows_out + uint64_t(l * per_list + i) * orw);
                }
            }
        }
    }
    c.result_bytes = uint64_t(lists_n) * per_list * (8 + (gather ? orw * 2 : 0));
    *cpl = c;
}
