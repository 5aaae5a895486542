// cxlkv NDP kernel: SCORE_TOPK (full and bound-pruned), GATHER, ATTEND and the sparse ATTEND
// over f16, bf16, f32, int8 and int4 rows, in Vitis-HLS-style C++.
//
// One source, two builds:
//   - the HLS top function cxlkv_ndp_top() (cxlkv_ndp_kernel.cpp), compiled with the hardware
//     configuration below (k <= CXLKV_HLS_KMAX, G <= CXLKV_HLS_GMAX, d <= CXLKV_HLS_DMAX), tested
//     by the C-simulation test bench (fpga/tb) and meant for csynth/cosim (fpga/run_hls.tcl);
//   - the emulator's engine library (cxlkv_ndp_engine.cpp, C ABI in cxlkv_ndp_engine.h), which
//     instantiates the same templates with the ABI's limits (k <= 4096, G <= 16, d <= 256).
//
// Bit-exactness with the Rust reference (kernels/src/lib.rs, "One summation order"): element d of
// a key goes to lane d % 16 of 16 f32 accumulators per query, each lane accumulates with a fused
// multiply-add in increasing d, and the lanes are added pairwise j + j+8, then j + j+4, j + j+2,
// j + j+1. f16 and bf16 convert to f32 exactly. Ranking: higher score first, equal scores
// (-0 == +0) by lower token index. Bounds: the same f64 formula and rounding slack as
// kernels/src/bounds.rs, so a pruned scan returns exactly the full scan's lists.
//
// Build with -ffp-contract=off: the compiler must not fuse the bound's products and sums.
#ifndef CXLKV_NDP_KERNEL_H
#define CXLKV_NDP_KERNEL_H

#include "cxlkv_hls_types.h"

extern "C" {
#include "../../ndp-emulator/include/cxlkv_ndp.h"
}

// Hardware configuration of the top function (override with -D for other builds).
#ifndef CXLKV_HLS_KMAX
#define CXLKV_HLS_KMAX 256
#endif
#ifndef CXLKV_HLS_GMAX
#define CXLKV_HLS_GMAX 4
#endif
#ifndef CXLKV_HLS_DMAX
#define CXLKV_HLS_DMAX 128
#endif
#ifndef CXLKV_HLS_MAX_BLOCKS
#define CXLKV_HLS_MAX_BLOCKS 1024
#endif

// Element type codes (cmd.dtype), as docs/FORMAT.md.
#define CXLKV_HLS_DTYPE_F16 1
#define CXLKV_HLS_DTYPE_BF16 2
#define CXLKV_HLS_DTYPE_F32 3
// Quantized codes (ABI 1.2): int8, one two's-complement byte per element; int4, two elements per
// byte (element 2j in the low nibble of byte j, 2j+1 in the high one), two's-complement 4-bit.
// Keys carry per-channel scales (folded into the queries), values per-token scales.
#define CXLKV_HLS_DTYPE_I8 4
#define CXLKV_HLS_DTYPE_I4 5

// A block of the command after the device's control path resolved its key (index lookup, header
// CRC and layout checks stay with the control path, as in the emulator's resolve_block): where the
// KV head's rows and stored bounds lie in card memory, as element indices of the kernel's ports.
struct cxlkv_hls_block {
    uint64_t k_elem;      // first 16-bit word of the head's key rows in `keys`
    uint64_t v_elem;      // first 16-bit word of the head's value rows in `values`
    uint64_t bounds_elem; // first f32 of min[dim] then max[dim] in `bounds`
    uint32_t tokens;      // rows in the block
    uint32_t base;        // token index of row 0 (the block entry's token_offset)
    // Quantized blocks only (int8, int4), as f32 indices into the same port as the bounds: the
    // head's key scales [dim] (per channel) and value scales [tokens] (per token).
    uint64_t kscale_elem;
    uint64_t vscale_elem;
};

namespace cxlkv_hls {

constexpr int LANES = 16;

struct Hit {
    uint32_t index;
    float score;
};

template <int GMAX>
struct LaneVals {
    float v[GMAX];
};

inline float f32_from_bits(uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
}

inline uint32_t f32_bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b;
}

// Exact IEEE binary16 -> f32 (kernels/src/dtype.rs f16_to_f32).
inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t(h) & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return f32_from_bits(sign);
        // Subnormal: man * 2^-24, exact in f32.
        float v = float(man) * f32_from_bits(0x33800000u);
        return sign ? -v : v;
    }
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man ? (0x00400000u | (man << 13)) : 0));
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

// bfloat16 -> f32: a shift (exact).
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

inline bool is_quantized(uint8_t dtype) {
    return dtype == CXLKV_HLS_DTYPE_I8 || dtype == CXLKV_HLS_DTYPE_I4;
}

// 16-bit words of one row of dim elements (dim a multiple of 16), 0 for an unknown dtype.
inline uint32_t row_words(uint8_t dtype, uint32_t dim) {
    switch (dtype) {
    case CXLKV_HLS_DTYPE_F16:
    case CXLKV_HLS_DTYPE_BF16: return dim;
    case CXLKV_HLS_DTYPE_F32: return 2 * dim;
    case CXLKV_HLS_DTYPE_I8: return dim / 2;
    case CXLKV_HLS_DTYPE_I4: return dim / 4;
    default: return 0;
    }
}

// Element e of a row stream of int8 codes (little-endian words: byte 2w low, 2w+1 high), widened
// exactly to f32.
inline float i8_at(const uint16_t* w, uint32_t e) {
    return float(int8_t(uint8_t(w[e >> 1] >> (8 * (e & 1)))));
}

// Element e of a row stream of int4 codes: byte e/2, its low nibble for even e; within the
// 16-bit word that is bits 4 * (e % 4). Sign-extended from 4 bits, widened exactly to f32.
inline float i4_at(const uint16_t* w, uint32_t e) {
    const uint32_t nib = (uint32_t(w[e >> 2]) >> (4 * (e & 3))) & 0xfu;
    return float(int32_t(nib << 28) >> 28);
}

// The queries folded with a quantized block's key scales: q'[g][d] = q[g][d] * ks[d], one f32
// multiply each (kernels/src/quant.rs fold_key_scales). The score of a quantized key is the
// canonical dot product of q' with its codes.
template <int GMAX, int DMAX>
inline void fold_queries(const float q[GMAX][DMAX], const float* ks, uint32_t g, uint32_t dim,
                         float out[GMAX][DMAX]) {
FOLD:
    for (uint32_t i = 0; i < uint32_t(GMAX) * DMAX; ++i) {
#pragma HLS PIPELINE II = 1
        const uint32_t qi = i / DMAX, d = i % DMAX;
        out[qi][d] = (qi < g && d < dim) ? q[qi][d] * ks[d] : 0.0f;
    }
}

// Ranking: true if (sa, ia) ranks strictly before (sb, ib). C's == already equates -0 and +0.
inline bool beats(float sa, uint32_t ia, float sb, uint32_t ib) {
    return sa > sb || (sa == sb && ia < ib);
}

// Key of f32::total_cmp: integers compare as total_cmp compares the floats.
inline int32_t total_key(float f) {
    int32_t i = int32_t(f32_bits(f));
    return i ^ int32_t(uint32_t(i >> 31) >> 1);
}

// The canonical lane tree.
inline float reduce_lanes(const float l[LANES]) {
#pragma HLS INLINE
    float s[8];
    for (int j = 0; j < 8; ++j) {
#pragma HLS UNROLL
        s[j] = l[j] + l[j + 8];
    }
    float t0 = s[0] + s[4], t1 = s[1] + s[5], t2 = s[2] + s[6], t3 = s[3] + s[7];
    float u0 = t0 + t2, u1 = t1 + t3;
    return u0 + u1;
}

// Upper bound of every computed score q.k with lo <= k <= hi (kernels/src/bounds.rs upper_bound).
inline float upper_bound(const float* q, const float* lo, const float* hi, uint32_t dim) {
    double sum = 0.0, abs = 0.0;
BOUND:
    for (uint32_t d = 0; d < dim; ++d) {
        // Not pipelined to II=1 on purpose: one bound per block and query, off the key stream.
        double qd = q[d], l = lo[d], h = hi[d];
        double a = qd * l, b = qd * h;
        sum += a > b ? a : b;
        double al = std::fabs(l), ah = std::fabs(h);
        abs += std::fabs(qd) * (al > ah ? al : ah);
    }
    double roundings = double(dim / 16 + 4);
    double slack = (roundings + 1.0) * 1.1920928955078125e-07 /* 2^-23 */ * abs +
                   double(dim) * 1.1754943508222875e-38 /* 2^-126 */;
    return float(sum + slack);
}

// Visiting order of a pruned scan: blocks by their group bound, highest first (f32 total order),
// ties by list position; a stable insertion sort (the hardware bounds n by CXLKV_HLS_MAX_BLOCKS).
inline void visit_order(const float* best, uint32_t n, uint32_t* order) {
    for (uint32_t i = 0; i < n; ++i) {
        uint32_t j = i;
        int32_t key = total_key(best[i]);
        while (j > 0 && total_key(best[order[j - 1]]) < key) {
            order[j] = order[j - 1];
            --j;
        }
        order[j] = i;
    }
}

// One top-k list: a sorted array (best first) of at most k <= KMAX hits. Insertion is a
// compare-and-shift network: every slot compares the candidate with itself and its predecessor
// in parallel and either keeps its hit, takes the predecessor's, or takes the candidate. With the
// array fully partitioned this is KMAX comparators and muxes and one insertion per cycle; a
// candidate that does not beat the k-th hit is rejected by one compare.
template <int KMAX>
inline void list_insert(Hit h[KMAX], uint32_t& count, uint32_t k, uint32_t index, float score) {
#pragma HLS INLINE
    if (count >= k && !beats(score, index, h[k - 1].score, h[k - 1].index)) return;
SHIFT:
    for (int i = KMAX - 1; i >= 0; --i) {
#pragma HLS UNROLL
        uint32_t u = uint32_t(i);
        if (u >= k) continue;
        bool here = u >= count || beats(score, index, h[i].score, h[i].index);
        if (!here) continue;
        bool prev = i > 0 && (u - 1 >= count || beats(score, index, h[i - 1].score, h[i - 1].index));
        if (prev) {
            h[i] = h[i - 1];
        } else {
            h[i].index = index;
            h[i].score = score;
        }
    }
    if (count < k) ++count;
}

// Stage 1, key-streaming reader: the block's rows * dim elements, converted exactly to f32
// (f16, bf16, f32, int8 and int4 codes).
inline void read_keys(const uint16_t* keys, uint32_t rows, uint32_t dim, uint8_t dtype,
                      hls::stream<float>& out) {
    uint32_t n = rows * dim;
    if (dtype == CXLKV_HLS_DTYPE_I8 || dtype == CXLKV_HLS_DTYPE_I4) {
        // Codes: one element per cycle from a word read every second (int8) or fourth (int4)
        // element, sign-extended and converted exactly.
    READ_CODES:
        for (uint32_t e = 0; e < n; ++e) {
#pragma HLS PIPELINE II = 1
            out.write(dtype == CXLKV_HLS_DTYPE_I8 ? i8_at(keys, e) : i4_at(keys, e));
        }
    } else if (dtype == CXLKV_HLS_DTYPE_F32) {
        // f32 keys (emulator engine only; two 16-bit words per element, little-endian).
    READ_F32:
        for (uint32_t e = 0; e < n; ++e) {
#pragma HLS PIPELINE II = 2
            out.write(f32_from_bits(uint32_t(keys[2 * e]) | (uint32_t(keys[2 * e + 1]) << 16)));
        }
    } else {
    READ_HALF:
        for (uint32_t e = 0; e < n; ++e) {
#pragma HLS PIPELINE II = 1
            uint16_t raw = keys[e];
            out.write(dtype == CXLKV_HLS_DTYPE_BF16 ? bf16_to_f32(raw) : f16_to_f32(raw));
        }
    }
}

// Stage 2, G-query dot-product unit: one key element per cycle into lane d % 16 of each query's
// 16 accumulators. Lane j of a key is updated every 16th element, so the loop-carried dependence
// on acc has distance 16 (>= the FMA latency) and the loop runs at II = 1. The last 16 elements
// of a key emit each lane's final value to the reducer, so no stage reads an accumulator that is
// still in flight.
template <int GMAX, int DMAX>
inline void dot_unit(const float q[GMAX][DMAX], uint32_t rows, uint32_t dim,
                     hls::stream<float>& in, hls::stream<LaneVals<GMAX> >& out) {
    float acc[GMAX][LANES];
#pragma HLS ARRAY_PARTITION variable = acc complete dim = 0
    uint32_t n = rows * dim;
    uint32_t d = 0;
DOT:
    for (uint32_t e = 0; e < n; ++e) {
#pragma HLS PIPELINE II = 1
#pragma HLS DEPENDENCE variable = acc type = inter direction = RAW distance = 16 true
        float x = in.read();
        uint32_t lane = d % LANES;
        LaneVals<GMAX> o;
        for (int g = 0; g < GMAX; ++g) {
#pragma HLS UNROLL
            float prev = d < uint32_t(LANES) ? 0.0f : acc[g][lane];
            float v = fused_mul_add(q[g][d], x, prev);
            acc[g][lane] = v;
            o.v[g] = v;
        }
        if (d + LANES >= dim) out.write(o);
        d = (d + 1 == dim) ? 0 : d + 1;
    }
}

// Stage 3, reducer: collects the 16 final lanes of a key (lanes 0..15 in order) and adds them in
// the canonical tree: one score per query every 16 cycles, far below the adder's capacity.
template <int GMAX>
inline void reduce_unit(uint32_t rows, hls::stream<LaneVals<GMAX> >& in,
                        hls::stream<LaneVals<GMAX> >& out) {
    float l[GMAX][LANES];
#pragma HLS ARRAY_PARTITION variable = l complete dim = 0
REDUCE:
    for (uint32_t e = 0; e < rows * LANES; ++e) {
#pragma HLS PIPELINE II = 1
        LaneVals<GMAX> v = in.read();
        uint32_t lane = e % LANES;
        for (int g = 0; g < GMAX; ++g) {
#pragma HLS UNROLL
            l[g][lane] = v.v[g];
        }
        if (lane == LANES - 1) {
            LaneVals<GMAX> s;
            for (int g = 0; g < GMAX; ++g) {
#pragma HLS UNROLL
                s.v[g] = reduce_lanes(l[g]);
            }
            out.write(s);
        }
    }
}

// Stage 4, streaming top-k: per query (G lists) or the group's maximum (one list).
template <int GMAX, int KMAX>
inline void topk_unit(uint32_t rows, uint32_t base, uint32_t g, uint32_t k, bool group_max,
                      hls::stream<LaneVals<GMAX> >& in, Hit lists[GMAX][KMAX],
                      uint32_t count[GMAX]) {
TOPK:
    for (uint32_t i = 0; i < rows; ++i) {
#pragma HLS PIPELINE II = 1
        LaneVals<GMAX> s = in.read();
        if (group_max) {
            float best = s.v[0];
            for (int q = 1; q < GMAX; ++q) {
#pragma HLS UNROLL
                if (uint32_t(q) < g && s.v[q] > best) best = s.v[q];
            }
            list_insert<KMAX>(lists[0], count[0], k, base + i, best);
        } else {
            for (int q = 0; q < GMAX; ++q) {
#pragma HLS UNROLL
                if (uint32_t(q) < g) list_insert<KMAX>(lists[q], count[q], k, base + i, s.v[q]);
            }
        }
    }
}

// One block through the dataflow pipeline reader -> dot -> reduce -> top-k.
template <int GMAX, int DMAX, int KMAX>
inline void scan_block(const uint16_t* keys, uint32_t rows, uint32_t base, uint32_t dim,
                       uint8_t dtype, const float q[GMAX][DMAX], uint32_t g, uint32_t k,
                       bool group_max, Hit lists[GMAX][KMAX], uint32_t count[GMAX]) {
#pragma HLS DATAFLOW
    hls::stream<float> s_keys("s_keys");
    hls::stream<LaneVals<GMAX> > s_lanes("s_lanes");
    hls::stream<LaneVals<GMAX> > s_scores("s_scores");
#pragma HLS STREAM variable = s_keys depth = 64
#pragma HLS STREAM variable = s_lanes depth = 32
#pragma HLS STREAM variable = s_scores depth = 8
    read_keys(keys, rows, dim, dtype, s_keys);
    dot_unit<GMAX, DMAX>(q, rows, dim, s_keys, s_lanes);
    reduce_unit<GMAX>(rows, s_lanes, s_scores);
    topk_unit<GMAX, KMAX>(rows, base, g, k, group_max, s_scores, lists, count);
}

// True if no key of a block with per-query bounds ub can enter any list: strictly below every
// list's k-th score (a tie could still win on a lower index). The same rule as can_skip
// in kernels/src/pruned.rs.
template <int GMAX, int KMAX>
inline bool can_skip(const float* ub, uint32_t g, uint32_t k, bool group_max,
                     const Hit lists[GMAX][KMAX], const uint32_t count[GMAX]) {
    if (group_max) {
        float best = -INFINITY;
        for (uint32_t q = 0; q < g; ++q) best = ub[q] > best ? ub[q] : best;
        return count[0] >= k && best < lists[0][k - 1].score;
    }
    for (uint32_t q = 0; q < g; ++q) {
        if (!(count[q] >= k && ub[q] < lists[q][k - 1].score)) return false;
    }
    return true;
}

}  // namespace cxlkv_hls

// The HLS top function (hardware configuration). Ports:
//   cmd      s_axilite: the command descriptor (struct cxlkv_ndp_cmd of the ABI header); opcode,
//            flags, k, dtype, group, dim and nblocks are used.
//   sel      s_axilite: SCORE_TOPK's selection (struct cxlkv_ndp_select, the arguments' tail with
//            FLAG_SELECT; unused without).
//   att      s_axilite: ATTEND's argument tail (struct cxlkv_ndp_attend: the scale). With
//            FLAG_SELECT (sparse ATTEND) sel is the selection and cmd.k the per-query cap.
//   keys     m_axi gmem0: card memory as 16-bit words (key rows).
//   values   m_axi gmem1: card memory as 16-bit words (value rows, GATHER and FLAG_GATHER_V).
//   queries  m_axi gmem2: f32 queries[group][dim] (the command's arguments).
//   bounds   m_axi gmem2: f32 block bounds (min[dim], max[dim] per block) for FLAG_PRUNE, and a
//            quantized block's key scales [dim] and value scales [tokens] (kscale_elem,
//            vscale_elem of its cxlkv_hls_block).
//   blocks   m_axi gmem2: the resolved block list (struct cxlkv_hls_block[nblocks]).
//   tokens   m_axi gmem2: GATHER's token list (u32[k]).
//   hits     m_axi gmem3: result hits [lists][per_list] (struct cxlkv_ndp_hit), best first; a
//            sparse ATTEND's union (ascending tokens, score 0) if not null.
//   rows_out m_axi gmem3: gathered value rows [lists][per_list][dim] (a selected list is padded
//            to per_list with token 0xFFFFFFFF, score -inf and zero rows, as the ABI's result).
//   att_out  m_axi gmem3: ATTEND's outputs, f32 [group][dim] (the result's values section).
//   att_ms   m_axi gmem3: ATTEND's struct cxlkv_ndp_partial [group] (max, sum).
//   info     m_axi gmem3: a selected SCORE_TOPK's struct cxlkv_ndp_list_info [lists]; a sparse
//            ATTEND's [group] (count = |U|, the mass U leaves out).
//   cpl      m_axi gmem3: the completion (status, detail, bytes_scanned, blocks_scanned/pruned,
//            and result_bytes = hits written; the control path adds header and mass).
extern "C" void cxlkv_ndp_top(cxlkv_ndp_cmd cmd, cxlkv_ndp_select sel, cxlkv_ndp_attend att,
                              const uint16_t* keys, const uint16_t* values, const float* queries,
                              const float* bounds, const cxlkv_hls_block* blocks,
                              const uint32_t* tokens, cxlkv_ndp_hit* hits, uint16_t* rows_out,
                              float* att_out, cxlkv_ndp_partial* att_ms,
                              cxlkv_ndp_list_info* info, cxlkv_ndp_cpl* cpl);

#endif
