// cxlkv NDP kernel, sparse ATTEND (ATTEND with CXLKV_NDP_FLAG_SELECT, ABI 1.2): per query the
// selection of a selected SCORE_TOPK (sinks, window, exclude, top-k or top-p by exact mass;
// cxlkv_ndp_select.h, one list per query), the union U of the G lists sorted by token, the exact
// partial over U's rows only (the ATTEND unit of cxlkv_ndp_attend.h over the gathered rows as one
// block: tiles of 64 rows in token order, as kernels/src/attend.rs attend_block over the gathered
// set), and per query count = |U| and the softmax mass U leaves out.
//
// Left-out mass of query g: the selection's scan keeps the log-sum-exp (max_g, sum_g) of
// scale * score over every stored token outside exclude (f64, as runtime/src/ndp/select.rs); the
// partial over U gives (m_U, l_U) (f32, scale-space). mass(U) = l_U * exp(m_U - max_g) / sum_g in
// f64, left_out = max(0, 1 - mass(U)) rounded to f32; 0 when no token counts (sum_g = 0).
#ifndef CXLKV_NDP_SPARSE_H
#define CXLKV_NDP_SPARSE_H

#include "cxlkv_ndp_select.h"

namespace cxlkv_hls {

// Sorts a[0..n) ascending (bottom-up merge sort through tmp[n]; n <= G * KMAX).
inline void sort_tokens(uint32_t* a, uint32_t n, uint32_t* tmp) {
SORT_WIDTH:
    for (uint32_t w = 1; w < n; w *= 2) {
    SORT_RUNS:
        for (uint32_t lo = 0; lo < n; lo += 2 * w) {
            const uint32_t mid = lo + w < n ? lo + w : n;
            const uint32_t hi = lo + 2 * w < n ? lo + 2 * w : n;
            uint32_t i = lo, j = mid, o = lo;
        SORT_MERGE:
            while (i < mid || j < hi) {
#pragma HLS PIPELINE II = 1
                tmp[o++] = (j >= hi || (i < mid && a[i] <= a[j])) ? a[i++] : a[j++];
            }
        }
    SORT_BACK:
        for (uint32_t i = 0; i < n; ++i) {
#pragma HLS PIPELINE II = 1
            a[i] = tmp[i];
        }
    }
}

// Merges the ascending tokens a[0..m) into the ascending set u[0..nu) (each token once) through
// tmp; returns the new size.
inline uint32_t union_merge(uint32_t* u, uint32_t nu, const uint32_t* a, uint32_t m,
                            uint32_t* tmp) {
    uint32_t i = 0, j = 0, o = 0;
UNION_MERGE:
    while (i < nu || j < m) {
#pragma HLS PIPELINE II = 1
        uint32_t t;
        if (j >= m || (i < nu && u[i] < a[j])) {
            t = u[i++];
        } else if (i >= nu || a[j] < u[i]) {
            t = a[j++];
        } else {
            t = u[i++];
            ++j;
        }
        tmp[o++] = t;
    }
UNION_BACK:
    for (uint32_t x = 0; x < o; ++x) {
#pragma HLS PIPELINE II = 1
        u[x] = tmp[x];
    }
    return o;
}

// The union of the g finished per-query lists (lists[0..g), each at most k hits): ascending
// tokens into u (room for g * k), its size returned; -1 if a list forced more tokens than k
// (CXLKV_NDP_DETAIL_TOO_MANY_FORCED). chosen (KMAX hits), a and tmp (g * k tokens) are scratch.
template <int KMAX>
inline int sparse_union(const SelList<KMAX>* lists, uint32_t g, const cxlkv_ndp_select& p,
                        uint32_t k, Hit* chosen, uint32_t* u, uint32_t* a, uint32_t* tmp) {
    uint32_t nu = 0;
UNION_LISTS:
    for (uint32_t q = 0; q < g; ++q) {
        float left = 0.0f;
        const int m = sel_finish<KMAX>(lists[q], p, k, chosen, &left);
        if (m < 0) return -1;
        for (int i = 0; i < m; ++i) a[i] = chosen[i].index;
        sort_tokens(a, uint32_t(m), tmp);
        nu = union_merge(u, nu, a, uint32_t(m), tmp);
    }
    return int(nu);
}

// The softmax mass of one query that the union leaves out, from its selection's log-sum-exp
// (l.max, l.sum, f64) and its partial over the union (m_u, l_u: max and sum, f32).
template <int KMAX>
inline float sparse_left_out(const SelList<KMAX>& l, float m_u, float l_u) {
    if (!(l.sum > 0.0)) return 0.0f;
    const double mass = double(l_u) * exp_f64(double(m_u) - l.max) / l.sum;
    const double left = 1.0 - mass;
    return float(left > 0.0 ? left : 0.0);
}

}  // namespace cxlkv_hls

#endif
