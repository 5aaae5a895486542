// cxlkv NDP kernel, SCORE_TOPK selection: forced tokens (attention sinks and a window), an
// excluded range (tokens the host holds), top-p with a k_max cap, and the softmax mass each list
// leaves out. The Rust reference is runtime/src/ndp/select.rs (Selection), which the emulator's
// Rust engine and the host fallback run; this is the same computation, operation by operation.
//
// Per list (one query, or the group's maximum), over the stored tokens S of the command's blocks:
// forced F = ({t < sinks} u window) n S \ exclude, candidates C = S \ exclude. The mass of a token
// is w_t = exp(scale * s_t - M) / Z over C, in f64: a running log-sum-exp (M, Z) in scan order.
// The list is F plus the best-ranked tokens of C \ F: up to k in total, or with top-p the fewest,
// best first, whose mass together with F's reaches p (at most k). Returned best first (higher
// score, then lower token), with the mass of C it leaves out, max(1 - taken, 0).
//
// Hardware: the candidate list is the SCORE_TOPK insertion network of cxlkv_ndp_kernel.h (k
// slots: its first k - |F| hits are the reference's best k - |F|); forced hits go to a buffer in
// arrival order (their masses are summed in that order, as the reference does); the running
// log-sum-exp is one f64 exp, multiply and add per token and list, loop-carried, well within the d
// cycles a token takes through the dot unit. The finish pass walks the forced buffer and the list
// once and sorts the chosen hits with one more insertion network (k cycles).
#ifndef CXLKV_NDP_SELECT_H
#define CXLKV_NDP_SELECT_H

#include "cxlkv_ndp_kernel.h"

namespace cxlkv_hls {

inline bool sel_excluded(const cxlkv_ndp_select& p, uint64_t t) {
    return (p.options & CXLKV_NDP_SEL_EXCLUDE) != 0 && t >= p.exclude_start && t < p.exclude_end;
}

inline bool sel_forced(const cxlkv_ndp_select& p, uint64_t t) {
    bool in_window =
        (p.options & CXLKV_NDP_SEL_WINDOW) != 0 && t >= p.window_start && t < p.window_end;
    return !sel_excluded(p, t) && (t < p.sinks || in_window);
}

// The checks of the reference (Select::from_abi, then Selection::new) that do not need the scan,
// in its order: 0 if the selection is well formed for blocks whose last stored token is end - 1,
// else the CXLKV_NDP_DETAIL_* of the error. More forced tokens than k (DETAIL_TOO_MANY_FORCED)
// shows at the end of the scan.
inline uint32_t sel_check(const cxlkv_ndp_select& p, uint64_t end) {
    if ((p.options & ~CXLKV_NDP_SEL_ALL) != 0 || p.candidates != 0 || p.reserved1 != 0)
        return CXLKV_NDP_DETAIL_BAD_OPTIONS;
    if (!std::isfinite(p.scale)) return CXLKV_NDP_DETAIL_BAD_SCALE;
    if ((p.options & CXLKV_NDP_SEL_TOP_P) != 0 && !(p.top_p > 0.0f && p.top_p <= 1.0f))
        return CXLKV_NDP_DETAIL_BAD_P;
    const bool window = (p.options & CXLKV_NDP_SEL_WINDOW) != 0;
    if (window && p.window_start > p.window_end) return CXLKV_NDP_DETAIL_BAD_WINDOW;
    if ((p.options & CXLKV_NDP_SEL_EXCLUDE) != 0 && p.exclude_start > p.exclude_end)
        return CXLKV_NDP_DETAIL_BAD_EXCLUDE;
    if (window && p.window_end > end) return CXLKV_NDP_DETAIL_BAD_WINDOW;
    return 0;
}

// One list's state during the scan.
template <int KMAX>
struct SelList {
    Hit forced[KMAX]; // forced hits in arrival order
    uint32_t nforced;
    bool overflow;    // more forced tokens than k
    Hit best[KMAX];   // the k best candidates that are not forced, best first
    uint32_t nbest;
    double max;       // running log-sum-exp of the candidates' scaled scores
    double sum;
};

template <int KMAX>
inline void sel_clear(SelList<KMAX>& l) {
    l.nforced = 0;
    l.overflow = false;
    l.nbest = 0;
    l.max = -INFINITY;
    l.sum = 0.0;
}

// Offers token t with (unscaled) score s to a list of at most k hits.
template <int KMAX>
inline void sel_offer(SelList<KMAX>& l, const cxlkv_ndp_select& p, uint32_t k, uint32_t t,
                      float s) {
#pragma HLS INLINE
    if (sel_excluded(p, t)) return;
    double x = double(p.scale) * double(s);
    if (x > l.max) {
        l.sum = l.sum * exp_f64(l.max - x) + 1.0;
        l.max = x;
    } else {
        l.sum += exp_f64(x - l.max);
    }
    if (sel_forced(p, t)) {
        if (l.nforced < k) {
            l.forced[l.nforced].index = t;
            l.forced[l.nforced].score = s;
            ++l.nforced;
        } else {
            l.overflow = true;
        }
    } else {
        list_insert<KMAX>(l.best, l.nbest, k, t, s);
    }
}

// Stage 4 of a selecting scan (in place of topk_unit): every token into every list.
template <int GMAX, int KMAX>
inline void select_unit(uint32_t rows, uint32_t base, uint32_t g, uint32_t k, bool group_max,
                        const cxlkv_ndp_select& p, hls::stream<LaneVals<GMAX> >& in,
                        SelList<KMAX> lists[GMAX]) {
SELECT:
    for (uint32_t i = 0; i < rows; ++i) {
#pragma HLS PIPELINE
        LaneVals<GMAX> s = in.read();
        if (group_max) {
            float best = s.v[0];
            for (int q = 1; q < GMAX; ++q) {
#pragma HLS UNROLL
                if (uint32_t(q) < g && s.v[q] > best) best = s.v[q];
            }
            sel_offer<KMAX>(lists[0], p, k, base + i, best);
        } else {
            for (int q = 0; q < GMAX; ++q) {
#pragma HLS UNROLL
                if (uint32_t(q) < g) sel_offer<KMAX>(lists[q], p, k, base + i, s.v[q]);
            }
        }
    }
}

// One block through reader -> dot -> reduce -> selection.
template <int GMAX, int DMAX, int KMAX>
inline void select_block(const uint16_t* keys, uint32_t rows, uint32_t base, uint32_t dim,
                         uint8_t dtype, const float q[GMAX][DMAX], uint32_t g, uint32_t k,
                         bool group_max, const cxlkv_ndp_select& p, SelList<KMAX> lists[GMAX]) {
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
    select_unit<GMAX, KMAX>(rows, base, g, k, group_max, p, s_scores, lists);
}

// The finished list: the chosen hits best first into out (returns how many), the mass left out
// into *left. Returns -1 if more tokens were forced than k (the command fails).
template <int KMAX>
inline int sel_finish(const SelList<KMAX>& l, const cxlkv_ndp_select& p, uint32_t k, Hit out[KMAX],
                      float* left) {
    if (l.overflow) return -1;
    const uint32_t rest = k - l.nforced;
    const uint32_t nbest = l.nbest < rest ? l.nbest : rest;
    const double scale = double(p.scale);
    uint32_t n = 0;
    double taken = 0.0;
    // Forced hits, their masses summed in arrival order.
FORCED:
    for (uint32_t i = 0; i < l.nforced; ++i) {
        const Hit h = l.forced[i];
        taken += exp_f64(scale * double(h.score) - l.max) / l.sum;
        list_insert<KMAX>(out, n, k, h.index, h.score);
    }
    if ((p.options & CXLKV_NDP_SEL_TOP_P) == 0) {
        // Plain top-k: the candidates' mass is summed on its own, then added.
        double cand = 0.0;
    TAKE_ALL:
        for (uint32_t i = 0; i < nbest; ++i) {
            const Hit h = l.best[i];
            cand += exp_f64(scale * double(h.score) - l.max) / l.sum;
            list_insert<KMAX>(out, n, k, h.index, h.score);
        }
        taken += cand;
    } else {
        const double pp = double(p.top_p);
    TAKE_P:
        for (uint32_t i = 0; i < nbest; ++i) {
            if (taken >= pp || n >= k) break;
            const Hit h = l.best[i];
            taken += exp_f64(scale * double(h.score) - l.max) / l.sum;
            list_insert<KMAX>(out, n, k, h.index, h.score);
        }
    }
    double lo = 1.0 - taken;
    *left = l.sum > 0.0 ? float(lo > 0.0 ? lo : 0.0) : 0.0f;
    return int(n);
}

}  // namespace cxlkv_hls

#endif
