// C-simulation test bench, sparse ATTEND (ATTEND with FLAG_SELECT, ABI 1.2): self-generated sets
// checked against the scalar C++ reference of tb_ref.h:
//   - per query the reference selection (runtime/src/ndp/select.rs's rules: sinks, window,
//     exclude, top-k or top-p by exact mass, fed in block-list order), the union U of the G lists
//     sorted by token, the partial over U's gathered rows (attend_block over the gathered set: one
//     block, tiles of 64 rows), and the left-out mass max(0, 1 - l_U e^{m_U - max_g} / sum_g);
//   - the kernel's union (written to the hits port) must be U exactly, every info count |U|,
//     the partials' max bit for bit and sum and out within ATTEND_TOL (0 in this build: bit for
//     bit; 1e-5 with the vendor's or a perturbed exp), the left-out masses within 1e-6, bytes
//     scanned = every key row + |U| key and value rows;
//   - with one block and k >= its tokens the sparse partial equals plain ATTEND's bit for bit
//     (both are attend_block over the same rows);
//   - the emulator's engine library (cxlkv_hls_sparse_*, the ABI's limits) on the same command:
//     the union, partials and infos bit for bit equal to the top function's;
//   - refusals: select.scale != attend.scale (DETAIL_BAD_SCALE), k = 0, k > KMAX, another flag
//     with FLAG_SELECT, more forced tokens than k (DETAIL_TOO_MANY_FORCED), a window past the
//     stored tokens (DETAIL_BAD_WINDOW), a quantized dtype (DETAIL_BAD_OPTIONS).
// Odd cases hand the kernel the block list reversed (the reference scans in the same order).
#include <cmath>
#include <set>
#include <string>

#include "../src/cxlkv_ndp_engine.h"
#include "tb_common.h"
#include "tb_ref.h"

namespace {

#if defined(CXLKV_HLS_VENDOR) || defined(CXLKV_HLS_EXP_ULP)
constexpr double SPARSE_ATTEND_TOL = 1e-5;
#else
constexpr double SPARSE_ATTEND_TOL = 0.0;
#endif
constexpr double SPARSE_MASS_TOL = 1e-6;

struct SSet {
    const char* name;
    uint8_t dtype;
    uint32_t dim, tokens, bt;
};

struct SData {
    uint8_t dtype;
    uint32_t dim, tokens, nblocks, rb;
    std::vector<uint16_t> keys, vals;
    std::vector<cxlkv_hls_block> blocks;
    const uint8_t* krow(uint32_t t) const {
        return reinterpret_cast<const uint8_t*>(keys.data()) + size_t(t) * rb;
    }
    const uint8_t* vrow(uint32_t t) const {
        return reinterpret_cast<const uint8_t*>(vals.data()) + size_t(t) * rb;
    }
};

SData make(const SSet& set, ref::Rng& rng) {
    SData s;
    s.dtype = set.dtype;
    s.dim = set.dim;
    s.tokens = set.tokens;
    s.nblocks = (set.tokens + set.bt - 1) / set.bt;
    s.rb = ref::row_bytes(set.dtype, set.dim);
    s.keys.assign(size_t(set.tokens) * s.rb / 2, 0);
    s.vals.assign(size_t(set.tokens) * s.rb / 2, 0);
    uint8_t* kb = reinterpret_cast<uint8_t*>(s.keys.data());
    uint8_t* vb = reinterpret_cast<uint8_t*>(s.vals.data());
    std::vector<float> proto(6 * set.dim);
    for (auto& x : proto) x = rng.normal();
    for (uint32_t t = 0; t < set.tokens; ++t) {
        // Clustered keys, a few much longer (so that some tokens dominate a query's mass).
        const float a = (t % 37 == 5) ? 3.0f : 0.4f + float(rng.unit());
        for (uint32_t d = 0; d < set.dim; ++d) {
            ref::store(kb + size_t(t) * s.rb, set.dtype, d,
                       ref::representable(a * proto[(t % 6) * set.dim + d] + 0.3f * rng.normal()));
            ref::store(vb + size_t(t) * s.rb, set.dtype, d, ref::representable(rng.normal()));
        }
    }
    for (uint32_t b = 0; b < s.nblocks; ++b) {
        const uint32_t t0 = b * set.bt, t1 = std::min(set.tokens, t0 + set.bt);
        cxlkv_hls_block blk;
        std::memset(&blk, 0, sizeof blk);
        blk.k_elem = uint64_t(t0) * s.rb / 2;
        blk.v_elem = blk.k_elem;
        blk.tokens = t1 - t0;
        blk.base = t0;
        s.blocks.push_back(blk);
    }
    return s;
}

struct Run {
    cxlkv_ndp_cpl cpl;
    std::vector<cxlkv_ndp_hit> hits;
    std::vector<float> out;
    std::vector<cxlkv_ndp_partial> ms;
    std::vector<cxlkv_ndp_list_info> info;
};

Run run(const SData& s, const std::vector<cxlkv_hls_block>& blocks, const std::vector<float>& qs,
        uint32_t g, uint32_t k, uint16_t flags, const cxlkv_ndp_select& sel, float scale,
        uint8_t dtype) {
    cxlkv_ndp_cmd cmd;
    std::memset(&cmd, 0, sizeof cmd);
    cmd.tag = 7;
    cmd.opcode = CXLKV_NDP_OP_ATTEND;
    cmd.flags = flags;
    cmd.k = k;
    cmd.dtype = dtype;
    cmd.group = uint8_t(g);
    cmd.dim = s.dim;
    cmd.nblocks = uint32_t(blocks.size());
    cxlkv_ndp_attend att;
    std::memset(&att, 0, sizeof att);
    att.scale = scale;
    Run r;
    std::memset(&r.cpl, 0, sizeof r.cpl);
    r.hits.assign(size_t(g) * std::max(k, 1u) + 1, cxlkv_ndp_hit{0xFFFFFFFFu, 0.0f});
    r.out.assign(size_t(g) * s.dim, NAN);
    r.ms.assign(g, cxlkv_ndp_partial{NAN, NAN});
    r.info.assign(g, cxlkv_ndp_list_info{0xFFFFFFFFu, NAN});
    cxlkv_ndp_top(cmd, sel, att, s.keys.data(), s.vals.data(), qs.data(), nullptr, blocks.data(),
                  nullptr, r.hits.data(), nullptr, r.out.data(), r.ms.data(), r.info.data(), &r.cpl);
    return r;
}

std::vector<float> queries(ref::Rng& rng, uint32_t g, uint32_t dim) {
    std::vector<float> q(size_t(g) * dim);
    for (auto& x : q) x = rng.normal();
    return q;
}

// One sparse ATTEND against the reference; "" if it matches.
std::string sparse_case(const SData& s, ref::Rng& rng, uint32_t g, uint32_t k,
                        const cxlkv_ndp_select& sel, bool reversed, double& worst_att,
                        double& worst_mass, double& mean_left, uint32_t& union_size) {
    const std::vector<float> qs = queries(rng, g, s.dim);
    std::vector<cxlkv_hls_block> blocks = s.blocks;
    if (reversed) std::reverse(blocks.begin(), blocks.end());
    // Reference: scores, per-query selection in scan order, the union, the partial over it.
    std::vector<ref::SelRef> lists(g, ref::SelRef(sel, k));
    for (const cxlkv_hls_block& b : blocks)
        for (uint32_t t = b.base; t < b.base + b.tokens; ++t)
            for (uint32_t j = 0; j < g; ++j)
                lists[j].offer(t, ref::score(&qs[j * s.dim], s.krow(t), s.dtype, s.dim));
    std::set<uint32_t> uset;
    for (uint32_t j = 0; j < g; ++j) {
        std::vector<ref::Hit> l;
        float left = 0.0f;
        if (!lists[j].finish(l, left)) return "reference: too many forced";
        for (const ref::Hit& h : l) uset.insert(h.t);
    }
    const std::vector<uint32_t> u(uset.begin(), uset.end());
    std::vector<uint8_t> gk(u.size() * s.rb + 1), gv(u.size() * s.rb + 1);
    for (size_t i = 0; i < u.size(); ++i) {
        std::memcpy(&gk[i * s.rb], s.krow(u[i]), s.rb);
        std::memcpy(&gv[i * s.rb], s.vrow(u[i]), s.rb);
    }
    const Run r = run(s, blocks, qs, g, k, CXLKV_NDP_FLAG_SELECT, sel, sel.scale, s.dtype);
    char msg[256];
    if (r.cpl.status != CXLKV_NDP_OK) {
        std::snprintf(msg, sizeof msg, "status %u detail %u", r.cpl.status, r.cpl.detail);
        return msg;
    }
    for (size_t i = 0; i < u.size(); ++i) {
        if (r.hits[i].token != u[i]) {
            std::snprintf(msg, sizeof msg, "union[%zu] = %u, the reference %u", i, r.hits[i].token, u[i]);
            return msg;
        }
    }
    const uint64_t want_bytes = uint64_t(s.tokens) * s.rb + 2ull * u.size() * s.rb;
    if (r.cpl.bytes_scanned != want_bytes || r.cpl.blocks_scanned != s.nblocks)
        return "bytes or blocks scanned wrong";
    if (r.cpl.result_bytes != uint64_t(g) * (s.dim + 2) * 4 + 8ull * g) return "result bytes wrong";
    union_size = uint32_t(u.size());
    for (uint32_t j = 0; j < g; ++j) {
        const ref::Part p = ref::attend_rows(&qs[j * s.dim], gk.data(), gv.data(), nullptr,
                                             uint32_t(u.size()), s.dtype, s.dim, sel.scale);
        if (r.info[j].count != u.size()) {
            std::snprintf(msg, sizeof msg, "query %u: count %u, |U| = %zu", j, r.info[j].count, u.size());
            return msg;
        }
        if (!same_score(r.ms[j].max, p.max)) {
            std::snprintf(msg, sizeof msg, "query %u: max %.9g, the reference %.9g", j,
                          double(r.ms[j].max), double(p.max));
            return msg;
        }
        double num = 0.0, den = 0.0;
        for (uint32_t d = 0; d < s.dim; ++d) {
            const double a = r.out[j * s.dim + d], b = p.out[d];
            num += (a - b) * (a - b);
            den += b * b;
        }
        const double e_out = den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
        const double e_sum = std::fabs(double(r.ms[j].sum) - double(p.sum)) / double(p.sum);
        worst_att = std::max(worst_att, std::max(e_out, e_sum));
        if (!(e_out <= SPARSE_ATTEND_TOL) || !(e_sum <= SPARSE_ATTEND_TOL)) {
            std::snprintf(msg, sizeof msg, "query %u: sum error %.3g, out error %.3g", j, e_sum, e_out);
            return msg;
        }
        const ref::SelRef& l = lists[j];
        double left = 0.0;
        if (l.sum > 0.0) {
            const double mass = double(p.sum) * std::exp(double(p.max) - l.max) / l.sum;
            left = std::max(0.0, 1.0 - mass);
        }
        const double e = std::fabs(double(r.info[j].left_out_mass) - double(float(left)));
        worst_mass = std::max(worst_mass, e);
        mean_left += left / g;
        if (!(e <= SPARSE_MASS_TOL)) {
            std::snprintf(msg, sizeof msg, "query %u: left-out mass %.9g, the reference %.9g", j,
                          double(r.info[j].left_out_mass), left);
            return msg;
        }
    }
    // The engine library: selection scan, union, partial over the gathered rows, finish.
    cxlkv_hls_sparse* es = cxlkv_hls_sparse_new(g, k, qs.data(), s.dim, sel.scale, &sel);
    if (es == nullptr) return "engine: sparse_new failed";
    for (const cxlkv_hls_block& b : blocks)
        cxlkv_hls_sparse_block(es, &s.keys[b.k_elem], b.tokens, b.base, s.dtype);
    std::vector<uint32_t> eu(size_t(g) * k);
    const int nu = cxlkv_hls_sparse_union(es, eu.data());
    bool same = nu == int(u.size()) && std::equal(u.begin(), u.end(), eu.begin());
    std::vector<float> eo(size_t(g) * s.dim), em(g), esum(g);
    std::vector<cxlkv_ndp_list_info> ei(g);
    if (same) {
        same = cxlkv_hls_sparse_rows(es, reinterpret_cast<const uint16_t*>(gk.data()),
                                     reinterpret_cast<const uint16_t*>(gv.data()), uint32_t(nu),
                                     s.dtype) == 0;
        cxlkv_hls_sparse_finish(es, eo.data(), em.data(), esum.data(), ei.data());
    }
    cxlkv_hls_sparse_free(es);
    if (!same) return "engine: union differs";
    if (std::memcmp(eo.data(), r.out.data(), eo.size() * 4) != 0) return "engine: out differs";
    for (uint32_t j = 0; j < g; ++j)
        if (std::memcmp(&em[j], &r.ms[j].max, 4) != 0 || std::memcmp(&esum[j], &r.ms[j].sum, 4) != 0 ||
            ei[j].count != r.info[j].count ||
            std::memcmp(&ei[j].left_out_mass, &r.info[j].left_out_mass, 4) != 0)
            return "engine: partial or info differs";
    return "";
}

cxlkv_ndp_select topk(float scale) {
    cxlkv_ndp_select sel;
    std::memset(&sel, 0, sizeof sel);
    sel.scale = scale;
    return sel;
}

// The refusals; "" if every one is refused with the expected detail.
std::string refusals(const SData& s, ref::Rng& rng) {
    const std::vector<float> qs = queries(rng, 2, s.dim);
    const float scale = 1.0f / std::sqrt(float(s.dim));
    const cxlkv_ndp_select sel = topk(scale);
    struct Want {
        const char* what;
        uint32_t k;
        uint16_t flags;
        cxlkv_ndp_select sel;
        float scale;
        uint8_t dtype;
        uint32_t detail;  // 0xFFFFFFFF: any
    };
    cxlkv_ndp_select forced = sel;
    forced.sinks = 40;
    cxlkv_ndp_select past = sel;
    past.options = CXLKV_NDP_SEL_WINDOW;
    past.window_start = 0;
    past.window_end = s.tokens + 1;
    const Want cases[] = {
        {"scale mismatch", 16, CXLKV_NDP_FLAG_SELECT, sel, scale * 2.0f, s.dtype, CXLKV_NDP_DETAIL_BAD_SCALE},
        {"k = 0", 0, CXLKV_NDP_FLAG_SELECT, sel, scale, s.dtype, 0xFFFFFFFFu},
        {"k > KMAX", CXLKV_HLS_KMAX + 1, CXLKV_NDP_FLAG_SELECT, sel, scale, s.dtype, 0xFFFFFFFFu},
        {"another flag", 16, CXLKV_NDP_FLAG_SELECT | CXLKV_NDP_FLAG_PRUNE, sel, scale, s.dtype, 0xFFFFFFFFu},
        {"k without FLAG_SELECT", 16, 0, sel, scale, s.dtype, 0xFFFFFFFFu},
        {"too many forced", 16, CXLKV_NDP_FLAG_SELECT, forced, scale, s.dtype, CXLKV_NDP_DETAIL_TOO_MANY_FORCED},
        {"window past the tokens", 16, CXLKV_NDP_FLAG_SELECT, past, scale, s.dtype, CXLKV_NDP_DETAIL_BAD_WINDOW},
        {"quantized dtype", 16, CXLKV_NDP_FLAG_SELECT, sel, scale, CXLKV_HLS_DTYPE_I8, CXLKV_NDP_DETAIL_BAD_OPTIONS},
    };
    for (const Want& w : cases) {
        const Run r = run(s, s.blocks, qs, 2, w.k, w.flags, w.sel, w.scale, w.dtype);
        if (r.cpl.status != CXLKV_NDP_ERR_ARGS || (w.detail != 0xFFFFFFFFu && r.cpl.detail != w.detail))
            return std::string(w.what) + ": not refused with its detail";
    }
    return "";
}

// One block and k >= its tokens: the sparse partial is plain ATTEND's, bit for bit.
std::string full_case(const SData& s, ref::Rng& rng) {
    const uint32_t g = 3;
    const std::vector<float> qs = queries(rng, g, s.dim);
    const std::vector<cxlkv_hls_block> one(1, s.blocks[0]);
    const float scale = 1.0f / std::sqrt(float(s.dim));
    const cxlkv_ndp_select sel = topk(scale);
    const uint32_t k = std::min<uint32_t>(CXLKV_HLS_KMAX, s.blocks[0].tokens + 5);
    const Run a = run(s, one, qs, g, k, CXLKV_NDP_FLAG_SELECT, sel, scale, s.dtype);
    const Run b = run(s, one, qs, g, 0, 0, sel, scale, s.dtype);
    if (a.cpl.status != CXLKV_NDP_OK || b.cpl.status != CXLKV_NDP_OK) return "status";
    if (std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4) != 0 ||
        std::memcmp(a.ms.data(), b.ms.data(), a.ms.size() * sizeof(cxlkv_ndp_partial)) != 0)
        return "sparse ATTEND over every token differs from ATTEND";
    for (uint32_t j = 0; j < g; ++j)
        if (a.info[j].count != s.blocks[0].tokens || !(a.info[j].left_out_mass < 1e-6f))
            return "sparse ATTEND over every token: count or left-out mass wrong";
    return "";
}

}  // namespace

int run_sparse(int& passed, int& failed) {
    const SSet sets[] = {
        {"sparse_f16_d64_b128", CXLKV_HLS_DTYPE_F16, 64, 600, 128},
        {"sparse_bf16_d128_b96", CXLKV_HLS_DTYPE_BF16, 128, 500, 96},
        {"sparse_f32_d64_b200", CXLKV_HLS_DTYPE_F32, 64, 450, 200},
    };
    int nsets = 0;
    for (const SSet& set : sets) {
        ref::Rng rng(0xa77e0000u + set.dtype * 7 + set.dim);
        const SData s = make(set, rng);
        const float scale = 1.0f / std::sqrt(float(set.dim));
        int ok = 0, bad = 0, ci = 0;
        double worst_att = 0.0, worst_mass = 0.0;
        auto report = [&](const std::string& why, const char* what) {
            if (why.empty()) {
                ++ok;
            } else {
                ++bad;
                std::printf("FAIL %s case %d (%s): %s\n", set.name, ci, what, why.c_str());
            }
            ++ci;
        };
        // Selections: plain top-k; sinks and a window; top-p with sinks; top-p with the last 64
        // tokens excluded (the host holds them); a window overlapping an exclusion; sinks only.
        std::vector<std::pair<const char*, std::pair<uint32_t, cxlkv_ndp_select> > > sels;
        cxlkv_ndp_select x = topk(scale);
        sels.push_back({"top-k 16", {16, x}});
        x.sinks = 4;
        x.options = CXLKV_NDP_SEL_WINDOW;
        x.window_start = set.tokens - 32;
        x.window_end = set.tokens;
        sels.push_back({"top-k 64, sinks, window", {64, x}});
        x = topk(scale);
        x.options = CXLKV_NDP_SEL_TOP_P;
        x.top_p = 0.9f;
        x.sinks = 2;
        sels.push_back({"top-p 0.9 cap 128, sinks", {128, x}});
        x = topk(scale);
        x.options = CXLKV_NDP_SEL_TOP_P | CXLKV_NDP_SEL_EXCLUDE;
        x.top_p = 0.5f;
        x.exclude_start = set.tokens - 64;
        x.exclude_end = set.tokens;
        sels.push_back({"top-p 0.5 cap 256, exclude", {256, x}});
        x = topk(scale);
        x.options = CXLKV_NDP_SEL_WINDOW | CXLKV_NDP_SEL_EXCLUDE;
        x.window_start = 90;
        x.window_end = 130;
        x.exclude_start = 100;
        x.exclude_end = 300;
        sels.push_back({"top-k 200, window and exclude", {200, x}});
        // Sinks fill the budget: the queries' best tokens lie outside U, so the left-out mass
        // needs the e^{m_U - max_g} factor.
        x = topk(scale);
        x.sinks = 8;
        sels.push_back({"top-k 8 = sinks", {8, x}});
        double left_small = 0.0;
        uint32_t u_small = 0;
        for (uint32_t g : {1u, 3u, 4u}) {
            for (const auto& c : sels) {
                double mean_left = 0.0;
                uint32_t nu = 0;
                report(sparse_case(s, rng, g, c.second.first, c.second.second, ci % 2 == 1,
                                   worst_att, worst_mass, mean_left, nu),
                       c.first);
                if (c.second.first == 16 && g == 4) {
                    left_small = mean_left;
                    u_small = nu;
                }
            }
        }
        // The smallest budget leaves mass out and the union is larger than one list (G = 4).
        report(left_small > 1e-4 && u_small > 16 ? "" : "top-k 16 at G = 4: no mass left out or no union",
               "budget");
        report(full_case(s, rng), "every token");
        report(refusals(s, rng), "refusals");
        std::printf("%-24s dtype %u d %3u tokens %4u blocks %2u: %d/%d sparse ATTEND cases passed "
                    "(max rel. error %.2g, left-out mass error %.2g; top-k 16 G 4: |U| %u, left out %.3f)\n",
                    set.name, set.dtype, set.dim, set.tokens, s.nblocks, ok, ci, worst_att, worst_mass,
                    u_small, left_small);
        passed += ok;
        failed += bad;
        ++nsets;
    }
    return nsets;
}
