// The HLS top function: SCORE_TOPK (full and bound-pruned, per query or group max, optional value
// gather) and GATHER over resolved blocks in card memory. See cxlkv_ndp_kernel.h for the ports
// and fpga/README.md for the pragmas' reasoning.
#include "cxlkv_ndp_kernel.h"

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

// Copies row `row` of block b's values (dim elements of `words` 16-bit words each) to out.
void copy_row(const uint16_t* values, const cxlkv_hls_block& b, uint32_t row, uint32_t words,
              uint16_t* out) {
    const uint16_t* src = values + b.v_elem + uint64_t(row) * words;
COPY:
    for (uint32_t w = 0; w < words; ++w) {
#pragma HLS PIPELINE II = 1
        out[w] = src[w];
    }
}

bool elem_words(uint8_t dtype, uint32_t& words) {
    if (dtype == CXLKV_HLS_DTYPE_F16 || dtype == CXLKV_HLS_DTYPE_BF16) {
        words = 1;
        return true;
    }
    if (dtype == CXLKV_HLS_DTYPE_F32) {
        words = 2;
        return true;
    }
    return false;
}

}  // namespace

extern "C" void cxlkv_ndp_top(cxlkv_ndp_cmd cmd, const uint16_t* keys, const uint16_t* values,
                              const float* queries, const float* bounds,
                              const cxlkv_hls_block* blocks, const uint32_t* tokens,
                              cxlkv_ndp_hit* hits, uint16_t* rows_out, cxlkv_ndp_cpl* cpl) {
#pragma HLS INTERFACE mode = s_axilite port = cmd bundle = control
#pragma HLS AGGREGATE variable = cmd
#pragma HLS INTERFACE mode = m_axi port = keys offset = slave bundle = gmem0 max_read_burst_length = 64 num_read_outstanding = 16
#pragma HLS INTERFACE mode = m_axi port = values offset = slave bundle = gmem1
#pragma HLS INTERFACE mode = m_axi port = queries offset = slave bundle = gmem2
#pragma HLS INTERFACE mode = m_axi port = bounds offset = slave bundle = gmem2
#pragma HLS INTERFACE mode = m_axi port = blocks offset = slave bundle = gmem2
#pragma HLS INTERFACE mode = m_axi port = tokens offset = slave bundle = gmem2
#pragma HLS INTERFACE mode = m_axi port = hits offset = slave bundle = gmem3
#pragma HLS INTERFACE mode = m_axi port = rows_out offset = slave bundle = gmem3
#pragma HLS INTERFACE mode = m_axi port = cpl offset = slave bundle = gmem3
#pragma HLS INTERFACE mode = s_axilite port = return bundle = control

    cxlkv_ndp_cpl c;
    std::memset(&c, 0, sizeof c);
    c.tag = cmd.tag;
    c.status = CXLKV_NDP_OK;
    const uint32_t dim = cmd.dim, n = cmd.nblocks, k = cmd.k, g = cmd.group;
    uint32_t words = 0;
    bool shape_ok = elem_words(cmd.dtype, words) && dim >= 16 && dim <= uint32_t(DMAX) &&
                    dim % LANES == 0 && n >= 1 && n <= uint32_t(MAXB);

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
                copy_row(values, blocks[b], row, dim * words, rows_out + uint64_t(j) * dim * words);
            }
            if (c.status == CXLKV_NDP_OK) c.result_bytes = uint64_t(k) * (8 + dim * words * 2);
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

SCAN:
    for (uint32_t v = 0; v < n; ++v) {
        uint32_t b = order[v];
        if (prune && can_skip<GMAX, KMAX>(ub[b], g, k, group_max, lists, count)) {
            c.blocks_pruned += 1;
            continue;
        }
        const cxlkv_hls_block blk = blocks[b];
        scan_block<GMAX, DMAX, KMAX>(keys + blk.k_elem, blk.tokens, blk.base, dim, cmd.dtype, q, g,
                                     k, group_max, lists, count);
        c.blocks_scanned += 1;
        c.bytes_scanned += uint64_t(blk.tokens) * dim * words * 2;
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
                    copy_row(values, blocks[b], row, dim * words,
                             rows_out + uint64_t(l * per_list + i) * dim * words);
                }
            }
        }
    }
    c.result_bytes = uint64_t(lists_n) * per_list * (8 + (gather ? dim * words * 2 : 0));
    *cpl = c;
}
