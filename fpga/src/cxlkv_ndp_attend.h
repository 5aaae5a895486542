// cxlkv NDP kernel, ATTEND: partial softmax attention of a GQA group over typed K/V blocks.
//
// For G queries and the keys of a command's blocks the kernel returns, per query, the partial of
// kernels/src/partial.rs: the largest scaled score m = max(scale * q.k), the sum of exponentials
// l = sum exp(scale * q.k - m) and the unnormalized output o = sum exp(scale * q.k - m) * v, so
// that the host merges it exactly with its own (log-sum-exp rule).
//
// Structure (one tile = up to TMAX rows of one block, the engine library uses whole blocks):
//   phase A, DATAFLOW: key reader -> G-query dot unit -> lane reducer (the SCORE_TOPK stages of
//            cxlkv_ndp_kernel.h, so scores are the canonical ones, bit for bit) -> score sink
//            (scaled scores into a tile buffer, running tile maximum per query);
//   phase B, DATAFLOW: weight unit (w = exp(s - m) per row and query, tile sums) and value reader
//            -> value accumulator (o += w * v per element, G queries in parallel);
//   merge:   the tile's partial into the command's, as Partial::merge.
// Every key and every value row is read once. The arithmetic is the reference's, operation by
// operation (kernels/src/partial.rs Partial::over_group per tile, then Partial::merge), so with the
// C library's expf (C simulation, the emulator's engine) the partials are bit-identical to the
// Rust reference's over the same tiles; with hls::exp they are within the tolerance that
// fpga/README.md states.
#ifndef CXLKV_NDP_ATTEND_H
#define CXLKV_NDP_ATTEND_H

#include "cxlkv_ndp_kernel.h"

namespace cxlkv_hls {

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

// Phase B, weights: w = exp(s - m) of every row and query, in row order, and the tile sums
// (sum += w in row order, as Partial::over_group). One row per dim >= 16 cycles reaches this
// unit, so its loop-carried sum (one f32 add) does not limit the pipeline even at II = 8.
template <int GMAX>
inline void weight_unit(uint32_t rows, uint32_t g, const float s[][GMAX], const float m[GMAX],
                        hls::stream<LaneVals<GMAX> >& out, float sum[GMAX]) {
    for (int q = 0; q < GMAX; ++q) sum[q] = 0.0f;
WEIGHT:
    for (uint32_t i = 0; i < rows; ++i) {
#pragma HLS PIPELINE II = 1
        LaneVals<GMAX> w;
        for (int q = 0; q < GMAX; ++q) {
#pragma HLS UNROLL
            w.v[q] = uint32_t(q) < g ? exp_f32(s[i][q] - m[q]) : 0.0f;
            sum[q] += w.v[q];
        }
        out.write(w);
    }
}

// Phase B, accumulator: one value element per cycle, o[q][d] += w[q] * v[d] for the G queries in
// parallel (a product, then a sum: two roundings, as the reference). o[q][d] is touched every dim
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
            float p = w.v[q] * x;
            out[q][d] = out[q][d] + p;
        }
        d = (d + 1 == dim) ? 0 : d + 1;
    }
}

// Phase B: the tile's partial (out and sum; the max is phase A's).
template <int GMAX, int DMAX>
inline void tile_values(const uint16_t* values, uint32_t rows, uint32_t dim, uint8_t dtype,
                        uint32_t g, const float s[][GMAX], const float m[GMAX],
                        float out[GMAX][DMAX], float sum[GMAX]) {
#pragma HLS DATAFLOW
    hls::stream<float> s_vals("b_vals");
    hls::stream<LaneVals<GMAX> > s_w("b_weights");
#pragma HLS STREAM variable = s_vals depth = 64
#pragma HLS STREAM variable = s_w depth = 8
    read_keys(values, rows, dim, dtype, s_vals);
    weight_unit<GMAX>(rows, g, s, m, s_w, sum);
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

// One tile (rows <= the buffer's rows) of keys and values into acc; tile and sbuf are scratch.
template <int GMAX, int DMAX>
inline void attend_tile(const uint16_t* keys, const uint16_t* values, uint32_t rows, uint32_t dim,
                        uint8_t dtype, const float q[GMAX][DMAX], uint32_t g, float scale,
                        float sbuf[][GMAX], Partials<GMAX, DMAX>& tile,
                        Partials<GMAX, DMAX>& acc) {
    if (rows == 0) return;
    partials_clear<GMAX, DMAX>(tile);
    tile_scores<GMAX, DMAX>(keys, rows, dim, dtype, q, scale, sbuf, tile.max);
    tile_values<GMAX, DMAX>(values, rows, dim, dtype, g, sbuf, tile.max, tile.out, tile.sum);
    partials_merge<GMAX, DMAX>(acc, tile, g, dim);
}

}  // namespace cxlkv_hls

#endif
