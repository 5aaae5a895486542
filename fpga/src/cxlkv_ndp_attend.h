// cxlkv NDP kernel, ATTEND: partial softmax attention of a GQA group over typed K/V blocks.
//
// For G queries and the keys of a command's blocks the kernel returns, per query, the partial of
// kernels/src/partial.rs: the largest scaled score m = max(scale * q.k), the sum of exponentials
// l = sum exp(scale * q.k - m) and the unnormalized output o = sum exp(scale * q.k - m) * v, so
// that the host merges it exactly with its own (log-sum-exp rule).
//
// The computation is the Rust reference's (kernels/src/attend.rs attend_block per block, the
// blocks merged in list order with Partial::merge), operation by operation:
//   per block, per tile of ATTEND_TILE = 64 rows (the reference's CHUNK), with the block's running
//   partial (max, sum, out):
//   phase A, DATAFLOW: key reader -> G-query dot unit -> lane reducer (the SCORE_TOPK stages of
//            cxlkv_ndp_kernel.h: canonical scores, bit for bit) -> score sink (scaled scores into
//            the tile buffer, the tile maximum per query);
//   rescale: a larger tile maximum rescales the running sum and output by exp_neg(old - new);
//   phase B, DATAFLOW: weight unit (w = exp_neg(s - max), sum += w in row order) and value reader
//            -> value accumulator (out += w * v per element, G queries in parallel);
//   per block end: the block's partial into the command's (Partial::merge, two exps per query).
// exp_neg is the reference's polynomial exponential in plain IEEE operations, so everything inside
// a block is bit-exact in hardware too. Only the merge of blocks uses a general exp (f32::exp in the
// reference): the C library's expf in C simulation and in the emulator's engine (bit-identical
// with Rust's on Linux), hls::exp in the synthesized kernel (fpga/README.md, Tolerance).
// Every key and every value row is read once.
#ifndef CXLKV_NDP_ATTEND_H
#define CXLKV_NDP_ATTEND_H

#include "cxlkv_ndp_kernel.h"

namespace cxlkv_hls {

// Rows per tile: the reference's CHUNK (kernels/src/attend.rs); bit-exactness needs them equal.
constexpr uint32_t ATTEND_TILE = 64;

// kernels/src/attend.rs exp_neg: exp(x) for x <= 0 within 2 ulp (Cephes' expf reduction and
// polynomial), no fused operations (build with -ffp-contract=off), bit-identical to the reference.
inline float exp_neg(float x) {
    const float LOG2E = 1.44269504088896340736f;
    const float C1 = 0.6933594f;
    const float C2 = -2.1219444e-4f;
    const float MAGIC = 12582912.0f; // 1.5 * 2^23: rounds to the nearest integer
    x = x > -87.0f ? x : -87.0f;
    float n = (x * LOG2E + MAGIC) - MAGIC;
    float r = (x - n * C1) - n * C2;
    float p = 1.9875691e-4f;
    p = p * r + 1.3981999e-3f;
    p = p * r + 8.333452e-3f;
    p = p * r + 4.1665796e-2f;
    p = p * r + 0.16666665f;
    p = p * r + 0.5f;
    float y = p * r * r + r + 1.0f;
    return y * f32_from_bits(uint32_t(int32_t(n) + 127) << 23);
}

// The partials of G queries: out[g][dim], max[g], sum[g].
template <int GMAX, int DMAX>
struct Partials {
    float out[GMAX][DMAX];
    float max[GMAX];
    float sum[GMAX];
};

// The partial over no keys (Partial::empty): out 0, max -inf, sum 0.
template <int GMAX, int DMAX>
inline void partials_clear(Partials<GMAX, DMAX>& p) {
CLEAR:
    for (int q = 0; q < GMAX; ++q) {
        p.max[q] = -INFINITY;
        p.sum[q] = 0.0f;
        for (int d = 0; d < DMAX; ++d) {
#pragma HLS PIPELINE II = 1
            p.out[q][d] = 0.0f;
        }
    }
}

// Phase A's last stage: scales each score, stores it in the tile buffer and keeps the tile's
// maximum per query (the fold of f32::max from -inf).
template <int GMAX>
inline void score_sink(uint32_t rows, float scale, hls::stream<LaneVals<GMAX> >& in,
                       float s[][GMAX], float m[GMAX]) {
    for (int q = 0; q < GMAX; ++q) m[q] = -INFINITY;
SINK:
    for (uint32_t i = 0; i < rows; ++i) {
#pragma HLS PIPELINE II = 1
        LaneVals<GMAX> v = in.read();
        for (int q = 0; q < GMAX; ++q) {
#pragma HLS UNROLL
            float x = scale * v.v[q];
            s[i][q] = x;
            m[q] = x > m[q] ? x : m[q];
        }
    }
}

// Phase A: the tile's scaled scores and maxima.
template <int GMAX, int DMAX>
inline void tile_scores(const uint16_t* keys, uint32_t rows, uint32_t dim, uint8_t dtype,
                        const float q[GMAX][DMAX], float scale, float s[][GMAX], float m[GMAX]) {
#pragma HLS DATAFLOW
    hls::stream<float> s_keys("a_keys");
    hls::stream<LaneVals<GMAX> > s_lanes("a_lanes");
    hls::stream<LaneVals<GMAX> > s_scores("a_scores");
#pragma HLS STREAM variable = s_keys depth = 64
#pragma HLS STREAM variable = s_lanes depth = 32
#pragma HLS STREAM variable = s_scores depth = 8
    read_keys(keys, rows, dim, dtype, s_keys);
    dot_unit<GMAX, DMAX>(q, rows, dim, s_keys, s_lanes);
    reduce_unit<GMAX>(rows, s_lanes, s_scores);
    score_sink<GMAX>(rows, scale, s_scores, s, m);
}

// Phase B, weights: w = exp_neg(s - m) of every row and query, in row order, added to the running
// sums (as the reference). One row per dim >= 16 cycles reaches this unit, so its loop-carried sum
// (one f32 add) does not limit the pipeline even at II = 8. A quantized block's rows carry
// per-token scales vs: the sum adds w itself and the accumulator gets w * vs[i] (one f32
// multiply, kernels/src/attend.rs attend_block_scaled); vs is null for other blocks.
template <int GMAX>
inline void weight_unit(uint32_t rows, uint32_t g, const float s[][GMAX], const float m[GMAX],
                        const float* vs, hls::stream<LaneVals<GMAX> >& out, float sum[GMAX]) {
WEIGHT:
    for (uint32_t i = 0; i < rows; ++i) {
#pragma HLS PIPELINE II = 1
        LaneVals<GMAX> w;
        const float vsi = vs != nullptr ? vs[i] : 1.0f;
        for (int q = 0; q < GMAX; ++q) {
#pragma HLS UNROLL
            const float wq = uint32_t(q) < g ? exp_neg(s[i][q] - m[q]) : 0.0f;
            sum[q] += wq;
            w.v[q] = vs != nullptr ? wq * vsi : wq;
        }
        out.write(w);
    }
}

// Phase B, accumulator: one value element per cycle, o[q][d] = fma(w[q], v[d], o[q][d]) for the G
// queries in parallel (one rounding, as the reference's fused multiply-add). o[q][d] is touched every dim
// >= 16 elements, the distance that lets the loop run at II = 1.
template <int GMAX, int DMAX>
inline void value_unit(uint32_t rows, uint32_t dim, hls::stream<float>& vin,
                       hls::stream<LaneVals<GMAX> >& win, float out[GMAX][DMAX]) {
    LaneVals<GMAX> w;
    for (int q = 0; q < GMAX; ++q) w.v[q] = 0.0f;
    uint32_t d = 0;
ACC:
    for (uint32_t e = 0; e < rows * dim; ++e) {
#pragma HLS PIPELINE II = 1
#pragma HLS DEPENDENCE variable = out type = inter direction = RAW distance = 16 true
        if (d == 0) w = win.read();
        float x = vin.read();
        for (int q = 0; q < GMAX; ++q) {
#pragma HLS UNROLL
            out[q][d] = fused_mul_add(w.v[q], x, out[q][d]);
        }
        d = (d + 1 == dim) ? 0 : d + 1;
    }
}

// Phase B: the tile's weights and values into the running partial (out and sum).
template <int GMAX, int DMAX>
inline void tile_values(const uint16_t* values, const float* vs, uint32_t rows, uint32_t dim,
                        uint8_t dtype, uint32_t g, const float s[][GMAX], const float m[GMAX],
                        float out[GMAX][DMAX], float sum[GMAX]) {
#pragma HLS DATAFLOW
    hls::stream<float> s_vals("b_vals");
    hls::stream<LaneVals<GMAX> > s_w("b_weights");
#pragma HLS STREAM variable = s_vals depth = 64
#pragma HLS STREAM variable = s_w depth = 8
    read_keys(values, rows, dim, dtype, s_vals);
    weight_unit<GMAX>(rows, g, s, m, vs, s_w, sum);
    value_unit<GMAX, DMAX>(rows, dim, s_vals, s_w, out);
}

// Folds the tile partial t into acc (Partial::merge, query by query).
template <int GMAX, int DMAX>
inline void partials_merge(Partials<GMAX, DMAX>& acc, const Partials<GMAX, DMAX>& t, uint32_t g,
                           uint32_t dim) {
MERGE:
    for (uint32_t q = 0; q < g; ++q) {
        if (t.sum[q] == 0.0f) continue;
        if (acc.sum[q] == 0.0f) {
            acc.max[q] = t.max[q];
            acc.sum[q] = t.sum[q];
            for (uint32_t d = 0; d < dim; ++d) {
#pragma HLS PIPELINE II = 1
                acc.out[q][d] = t.out[q][d];
            }
            continue;
        }
        float mx = acc.max[q] > t.max[q] ? acc.max[q] : t.max[q];
        float a = exp_f32(acc.max[q] - mx), b = exp_f32(t.max[q] - mx);
        for (uint32_t d = 0; d < dim; ++d) {
#pragma HLS PIPELINE II = 1
            float x = acc.out[q][d] * a;
            float y = t.out[q][d] * b;
            acc.out[q][d] = x + y;
        }
        float x = acc.sum[q] * a;
        float y = t.sum[q] * b;
        acc.sum[q] = x + y;
        acc.max[q] = mx;
    }
}

// A larger tile maximum m rescales the running partial p (the reference's online fold).
template <int GMAX, int DMAX>
inline void partials_rescale(Partials<GMAX, DMAX>& p, const float m[GMAX], uint32_t g,
                             uint32_t dim) {
RESCALE:
    for (uint32_t q = 0; q < g; ++q) {
        if (!(m[q] > p.max[q])) continue;
        if (p.sum[q] > 0.0f) {
            const float f = exp_neg(p.max[q] - m[q]);
            p.sum[q] = p.sum[q] * f;
            for (uint32_t d = 0; d < dim; ++d) {
#pragma HLS PIPELINE II = 1
                p.out[q][d] = p.out[q][d] * f;
            }
        }
        p.max[q] = m[q];
    }
}

// One tile (rows <= ATTEND_TILE) of a block's keys and values into the block's running partial
// blk; sbuf and tmax are scratch. vs: the tile's value scales (quantized blocks), else null.
template <int GMAX, int DMAX>
inline void attend_tile(const uint16_t* keys, const uint16_t* values, const float* vs,
                        uint32_t rows, uint32_t dim, uint8_t dtype, const float q[GMAX][DMAX],
                        uint32_t g, float scale, float sbuf[][GMAX], float tmax[GMAX],
                        Partials<GMAX, DMAX>& blk) {
    if (rows == 0) return;
    tile_scores<GMAX, DMAX>(keys, rows, dim, dtype, q, scale, sbuf, tmax);
    partials_rescale<GMAX, DMAX>(blk, tmax, g, dim);
    tile_values<GMAX, DMAX>(values, vs, rows, dim, dtype, g, sbuf, blk.max, blk.out, blk.sum);
}

// One block's partial (rows of keys and values, rw 16-bit words per row) into blk, tile by tile
// (kernels/src/attend.rs attend_block, or attend_block_scaled with value scales vs).
template <int GMAX, int DMAX>
inline void attend_rows(const uint16_t* keys, const uint16_t* values, const float* vs,
                        uint32_t rows, uint32_t dim, uint32_t rw, uint8_t dtype,
                        const float q[GMAX][DMAX], uint32_t g, float scale, float sbuf[][GMAX],
                        Partials<GMAX, DMAX>& blk) {
    float tmax[GMAX];
#pragma HLS ARRAY_PARTITION variable = tmax complete
    partials_clear<GMAX, DMAX>(blk);
TILES:
    for (uint32_t r = 0; r < rows; r += ATTEND_TILE) {
        const uint32_t n = rows - r < ATTEND_TILE ? rows - r : ATTEND_TILE;
        const uint64_t at = uint64_t(r) * rw;
        attend_tile<GMAX, DMAX>(keys + at, values + at, vs != nullptr ? vs + r : nullptr, n, dim,
                                dtype, q, g, scale, sbuf, tmax, blk);
    }
}

// One block (rows of keys and values, rw 16-bit words per row; value scales vs or null) into
// acc: its partial, tile by tile, then the merge.
template <int GMAX, int DMAX>
inline void attend_block(const uint16_t* keys, const uint16_t* values, const float* vs,
                         uint32_t rows, uint32_t dim, uint32_t rw, uint8_t dtype,
                         const float q[GMAX][DMAX], uint32_t g, float scale, float sbuf[][GMAX],
                         Partials<GMAX, DMAX>& blk, Partials<GMAX, DMAX>& acc) {
    attend_rows<GMAX, DMAX>(keys, values, vs, rows, dim, rw, dtype, q, g, scale, sbuf, blk);
    partials_merge<GMAX, DMAX>(acc, blk, g, dim);
}

}  // namespace cxlkv_hls

#endif
