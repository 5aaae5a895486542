// Scalar C++ references of the test bench's self-generated sets (tb_quant.cpp, tb_sparse.cpp):
// written from the Rust reference's definitions, not from the kernel's dataflow code.
//   - canonical score (kernels/src/score.rs dot_canonical): lane d % 16, fused multiply-add in
//     increasing d, lanes added j + j+8, j + j+4, j + j+2, j + j+1;
//   - element loads of every dtype (kernels/src/dtype.rs DType::load), int8 and int4 included;
//   - a block's partial (kernels/src/attend.rs attend_block / attend_block_scaled): chunks of 64
//     rows, the chunk maximum rescales with exp_neg, weights exp_neg(scale * s - max) summed
//     unscaled, value rows accumulated with w (or w * vscale[i]) by one fused multiply-add;
//     blocks merged with Partial::merge (std::exp);
//   - the selection of runtime/src/ndp/select.rs (Selection): an online log-sum-exp in scan order
//     over the candidates, forced tokens in arrival order, the best others by rank, top-p by
//     cumulative mass, the list sorted by rank, the left-out mass.
// exp_neg is the kernel's (cxlkv_hls::exp_neg): the Rust polynomial, checked bit for bit against
// the Rust reference by the golden ATTEND sets.
#ifndef CXLKV_TB_REF_H
#define CXLKV_TB_REF_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../src/cxlkv_ndp_attend.h"

namespace ref {

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // Uniform in [0, 1).
    double unit() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
    // Roughly normal (sum of four uniforms, centred).
    float normal() { return float((unit() + unit() + unit() + unit() - 2.0) * 1.7320508); }
    uint32_t below(uint32_t n) { return uint32_t(next() % n); }
};

// Element i of a row stored as little-endian bytes of dtype, as f32 (exact).
inline float load(const uint8_t* row, uint8_t dtype, uint32_t i) {
    switch (dtype) {
    case CXLKV_HLS_DTYPE_F16: {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        return cxlkv_hls::f16_to_f32(h);
    }
    case CXLKV_HLS_DTYPE_BF16: {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        uint32_t b = uint32_t(h) << 16;
        float f;
        std::memcpy(&f, &b, 4);
        return f;
    }
    case CXLKV_HLS_DTYPE_F32: {
        float f;
        std::memcpy(&f, row + 4 * i, 4);
        return f;
    }
    case CXLKV_HLS_DTYPE_I8: return float(int8_t(row[i]));
    default: {  // int4: element 2j low nibble of byte j, 2j+1 high nibble
        const uint8_t b = row[i / 2];
        const int v = (i % 2 == 0) ? (b & 0xf) : (b >> 4);
        return float(v >= 8 ? v - 16 : v);
    }
    }
}

inline uint32_t row_bytes(uint8_t dtype, uint32_t dim) {
    switch (dtype) {
    case CXLKV_HLS_DTYPE_F32: return 4 * dim;
    case CXLKV_HLS_DTYPE_I8: return dim;
    case CXLKV_HLS_DTYPE_I4: return dim / 2;
    default: return 2 * dim;
    }
}

// q . row in the canonical order.
inline float score(const float* q, const uint8_t* row, uint8_t dtype, uint32_t dim) {
    float lanes[16] = {0};
    for (uint32_t d = 0; d < dim; ++d) lanes[d % 16] = std::fma(q[d], load(row, dtype, d), lanes[d % 16]);
    for (uint32_t w = 8; w >= 1; w /= 2)
        for (uint32_t j = 0; j < w; ++j) lanes[j] = lanes[j] + lanes[j + w];
    return lanes[0];
}

struct Part {
    std::vector<float> out;
    float max = -INFINITY;
    float sum = 0.0f;
};

// The partial of one (already folded) query over n rows (keys and values row-major bytes of
// dtype; vs: per-row value scales or null), in chunks of 64 rows.
inline Part attend_rows(const float* q, const uint8_t* keys, const uint8_t* vals, const float* vs,
                        uint32_t n, uint8_t dtype, uint32_t dim, float scale) {
    const uint32_t rb = row_bytes(dtype, dim);
    Part p;
    p.out.assign(dim, 0.0f);
    for (uint32_t r0 = 0; r0 < n; r0 += 64) {
        const uint32_t r1 = std::min(n, r0 + 64);
        std::vector<float> s(r1 - r0);
        float cmax = -INFINITY;
        for (uint32_t i = r0; i < r1; ++i) {
            s[i - r0] = scale * score(q, keys + size_t(i) * rb, dtype, dim);
            if (s[i - r0] > cmax) cmax = s[i - r0];
        }
        if (cmax > p.max) {
            if (p.sum > 0.0f) {
                const float f = cxlkv_hls::exp_neg(p.max - cmax);
                p.sum = p.sum * f;
                for (auto& o : p.out) o = o * f;
            }
            p.max = cmax;
        }
        for (uint32_t i = r0; i < r1; ++i) {
            const float w = cxlkv_hls::exp_neg(s[i - r0] - p.max);
            p.sum += w;
            const float wv = vs != nullptr ? w * vs[i] : w;
            for (uint32_t d = 0; d < dim; ++d)
                p.out[d] = std::fma(wv, load(vals + size_t(i) * rb, dtype, d), p.out[d]);
        }
    }
    return p;
}

// Partial::merge.
inline void merge(Part& a, const Part& b) {
    if (b.sum == 0.0f) return;
    if (a.sum == 0.0f) {
        a = b;
        return;
    }
    const float m = std::max(a.max, b.max);
    const float x = std::exp(a.max - m), y = std::exp(b.max - m);
    for (size_t d = 0; d < a.out.size(); ++d) a.out[d] = a.out[d] * x + b.out[d] * y;
    a.sum = a.sum * x + b.sum * y;
    a.max = m;
}

struct Hit {
    uint32_t t;
    float s;
};

inline bool rank_before(const Hit& a, const Hit& b) { return a.s > b.s || (a.s == b.s && a.t < b.t); }

// One list of the selection over scores offered in scan order.
struct SelRef {
    const cxlkv_ndp_select& p;
    uint32_t k;
    std::vector<Hit> forced, others;
    double max = -INFINITY, sum = 0.0;
    SelRef(const cxlkv_ndp_select& sel, uint32_t kk) : p(sel), k(kk) {}
    bool excluded(uint64_t t) const {
        return (p.options & CXLKV_NDP_SEL_EXCLUDE) && t >= p.exclude_start && t < p.exclude_end;
    }
    bool is_forced(uint64_t t) const {
        const bool win = (p.options & CXLKV_NDP_SEL_WINDOW) && t >= p.window_start && t < p.window_end;
        return !excluded(t) && (t < p.sinks || win);
    }
    void offer(uint32_t t, float s) {
        if (excluded(t)) return;
        const double x = double(p.scale) * double(s);
        if (x > max) {
            sum = sum * std::exp(max - x) + 1.0;
            max = x;
        } else {
            sum += std::exp(x - max);
        }
        (is_forced(t) ? forced : others).push_back({t, s});
    }
    // The list best first and its left-out mass; false if more tokens are forced than k.
    bool finish(std::vector<Hit>& list, float& left) const {
        if (forced.size() > k) return false;
        const size_t rest = k - forced.size();
        std::vector<Hit> best = others;
        std::stable_sort(best.begin(), best.end(), rank_before);
        if (best.size() > rest) best.resize(rest);
        auto w = [&](const Hit& h) { return std::exp(double(p.scale) * double(h.s) - max) / sum; };
        double taken = 0.0;
        for (const Hit& h : forced) taken += w(h);
        list = forced;
        if (!(p.options & CXLKV_NDP_SEL_TOP_P)) {
            double c = 0.0;
            for (const Hit& h : best) c += w(h);
            taken += c;
            list.insert(list.end(), best.begin(), best.end());
        } else {
            for (const Hit& h : best) {
                if (taken >= double(p.top_p) || list.size() >= k) break;
                taken += w(h);
                list.push_back(h);
            }
        }
        std::stable_sort(list.begin(), list.end(), rank_before);
        left = sum > 0.0 ? float(std::max(1.0 - taken, 0.0)) : 0.0f;
        return true;
    }
};

// Stores f32 x as dtype's little-endian bytes at dst (f16: x must be exactly representable as a
// normal f16 or 0; bf16: truncated).
inline void store(uint8_t* dst, uint8_t dtype, uint32_t i, float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    if (dtype == CXLKV_HLS_DTYPE_F32) {
        std::memcpy(dst + 4 * i, &b, 4);
    } else if (dtype == CXLKV_HLS_DTYPE_BF16) {
        const uint16_t h = uint16_t(b >> 16);
        std::memcpy(dst + 2 * i, &h, 2);
    } else {
        uint16_t h = uint16_t((b >> 16) & 0x8000u);
        if ((b & 0x7fffffffu) != 0) {
            const uint32_t e = (b >> 23) & 0xffu;
            h = uint16_t(h | ((e - 112) << 10) | ((b >> 13) & 0x3ffu));
        }
        std::memcpy(dst + 2 * i, &h, 2);
    }
}

// A value exactly representable in f16, bf16 and f32 (8 significant bits, |x| in [2^-6, 8)) or 0.
inline float representable(float x) {
    if (std::fabs(x) < 0.015625f) return 0.0f;
    int e;
    const float m = std::frexp(std::min(std::fabs(x), 7.9f), &e);
    const float r = std::ldexp(std::nearbyint(m * 256.0f) / 256.0f, e);
    return x < 0 ? -r : r;
}

}  // namespace ref

#endif
