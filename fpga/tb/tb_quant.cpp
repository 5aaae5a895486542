// C-simulation test bench, quantized blocks (int8, int4; ABI 1.2): self-generated sets checked
// against the scalar C++ reference of tb_ref.h (no golden file: the Rust kernels gain these
// dtypes in parallel; both follow the same definitions, kernels/src/quant.rs).
//
// Each set quantizes random clustered K and V per block (K per channel, V per token, symmetric,
// round half to even, qmax 127 or 7), stores the codes, the block's key scales [dim] and value
// scales [tokens], and runs cxlkv_ndp_top() on:
//   - SCORE_TOPK (per query and group max, k in {1, 32, 200}, G in {1, 3}, GATHER_V): indices
//     identical and scores bit for bit to the reference (queries folded with each block's key
//     scales, canonical dot product with the codes), gathered rows dequantized (code * the
//     token's scale) bit for bit, bytes scanned = codes + key scales; FLAG_PRUNE refused
//     (DETAIL_BAD_OPTIONS); a GATHER of list 0's tokens in reverse;
//   - SCORE_TOPK with FLAG_SELECT (top-p with sinks and a window, top-k with an exclusion):
//     indices identical, scores bit for bit, left-out mass within 1e-6;
//   - ATTEND (G in {1, 4}, scale 1/sqrt(d) and 4/sqrt(d)): max bit for bit, sum and out within
//     ATTEND_TOL (0 in this build: bit for bit; 1e-5 with the vendor's or a perturbed exp),
//     bytes scanned = K and V codes + key and value scales;
//   - the emulator's engine library (cxlkv_ndp_engine.h: *_block_q, cxlkv_hls_dequant_row, the
//     ABI's limits) on the same commands: hits, lists, masses, partials and rows bit for bit
//     equal to the top function's.
// Odd cases hand the kernel the block list reversed.
#include <cmath>
#include <string>

#include "../src/cxlkv_ndp_engine.h"
#include "tb_common.h"
#include "tb_ref.h"

namespace {

#if defined(CXLKV_HLS_VENDOR) || defined(CXLKV_HLS_EXP_ULP)
constexpr double QUANT_ATTEND_TOL = 1e-5;
#else
constexpr double QUANT_ATTEND_TOL = 0.0;
#endif

struct QSet {
    const char* name;
    uint8_t dtype;
    uint32_t dim, tokens, bt;
};

struct QData {
    uint8_t dtype;
    uint32_t dim, tokens, bt, nblocks, rb;
    std::vector<uint16_t> keys, vals;  // codes, rows of rb bytes, blocks back to back
    std::vector<float> meta;           // per block: key scales [dim], value scales [tokens]
    std::vector<cxlkv_hls_block> blocks;
    const uint8_t* krow(uint32_t t) const {
        return reinterpret_cast<const uint8_t*>(keys.data()) + size_t(t) * rb;
    }
    const uint8_t* vrow(uint32_t t) const {
        return reinterpret_cast<const uint8_t*>(vals.data()) + size_t(t) * rb;
    }
    uint32_t block_of(uint32_t t) const { return t / bt; }
    const float* kscale(uint32_t b) const { return &meta[blocks[b].kscale_elem]; }
    float vscale(uint32_t t) const {
        const uint32_t b = block_of(t);
        return meta[blocks[b].vscale_elem + (t - blocks[b].base)];
    }
};

void put_code(uint8_t* row, uint8_t dtype, uint32_t d, int c) {
    if (dtype == CXLKV_HLS_DTYPE_I8) {
        row[d] = uint8_t(int8_t(c));
    } else {
        const uint8_t nib = uint8_t(c) & 0xf;
        row[d / 2] = (d % 2 == 0) ? uint8_t((row[d / 2] & 0xf0) | nib)
                                  : uint8_t((row[d / 2] & 0x0f) | (nib << 4));
    }
}

int quantize(float x, float s, float qmax) {
    if (s == 0.0f) return 0;
    const float c = std::nearbyint(x / s);  // round half to even (default rounding mode)
    return int(std::max(-qmax, std::min(qmax, c)));
}

QData make(const QSet& set, ref::Rng& rng) {
    QData q;
    q.dtype = set.dtype;
    q.dim = set.dim;
    q.tokens = set.tokens;
    q.bt = set.bt;
    q.nblocks = (set.tokens + set.bt - 1) / set.bt;
    q.rb = ref::row_bytes(set.dtype, set.dim);
    const uint32_t dim = set.dim;
    const float qmax = set.dtype == CXLKV_HLS_DTYPE_I8 ? 127.0f : 7.0f;
    std::vector<float> proto(4 * dim), k(size_t(set.tokens) * dim), v(size_t(set.tokens) * dim);
    for (auto& x : proto) x = rng.normal();
    for (uint32_t t = 0; t < set.tokens; ++t) {
        const float a = 0.5f + float(rng.unit()) * 1.5f;
        for (uint32_t d = 0; d < dim; ++d) {
            // A few channels much larger than the rest (outlier channels, as in real keys).
            const float big = (d % 17 == 3) ? 6.0f : 1.0f;
            k[size_t(t) * dim + d] = big * (a * proto[(t % 4) * dim + d] + 0.4f * rng.normal());
            v[size_t(t) * dim + d] = rng.normal() * (1.0f + float(t % 3));
        }
    }
    // Every fourth token of the first block has an all-zero value row (scale 0, codes 0).
    for (uint32_t t = 0; t < set.bt && t < set.tokens; t += 4)
        for (uint32_t d = 0; d < dim; ++d) v[size_t(t) * dim + d] = 0.0f;
    q.keys.assign((size_t(set.tokens) * q.rb + 1) / 2, 0);
    q.vals.assign((size_t(set.tokens) * q.rb + 1) / 2, 0);
    uint8_t* kb = reinterpret_cast<uint8_t*>(q.keys.data());
    uint8_t* vb = reinterpret_cast<uint8_t*>(q.vals.data());
    for (uint32_t b = 0; b < q.nblocks; ++b) {
        const uint32_t t0 = b * set.bt, t1 = std::min(set.tokens, t0 + set.bt);
        cxlkv_hls_block blk;
        std::memset(&blk, 0, sizeof blk);
        blk.k_elem = uint64_t(t0) * q.rb / 2;
        blk.v_elem = blk.k_elem;
        blk.tokens = t1 - t0;
        blk.base = t0;
        blk.kscale_elem = q.meta.size();
        blk.vscale_elem = q.meta.size() + dim;
        // Key scales per channel over the block's tokens; the last channel all zero in block 1.
        std::vector<float> ks(dim, 0.0f);
        if (b == 1)
            for (uint32_t t = t0; t < t1; ++t) k[size_t(t) * dim + dim - 1] = 0.0f;
        for (uint32_t t = t0; t < t1; ++t)
            for (uint32_t d = 0; d < dim; ++d) ks[d] = std::max(ks[d], std::fabs(k[size_t(t) * dim + d]));
        for (auto& s : ks) s = s / qmax;
        q.meta.insert(q.meta.end(), ks.begin(), ks.end());
        for (uint32_t t = t0; t < t1; ++t) {
            float m = 0.0f;
            for (uint32_t d = 0; d < dim; ++d) m = std::max(m, std::fabs(v[size_t(t) * dim + d]));
            const float vs = m / qmax;
            q.meta.push_back(vs);
            for (uint32_t d = 0; d < dim; ++d) {
                put_code(kb + size_t(t) * q.rb, set.dtype, d, quantize(k[size_t(t) * dim + d], ks[d], qmax));
                put_code(vb + size_t(t) * q.rb, set.dtype, d, quantize(v[size_t(t) * dim + d], vs, qmax));
            }
        }
        q.blocks.push_back(blk);
    }
    return q;
}

// The reference scores of every token for g queries (key-major), each block's queries folded.
std::vector<float> ref_scores(const QData& q, const std::vector<float>& qs, uint32_t g) {
    std::vector<float> s(size_t(q.tokens) * g);
    std::vector<float> f(q.dim);
    for (uint32_t t = 0; t < q.tokens; ++t) {
        const float* ks = q.kscale(q.block_of(t));
        for (uint32_t j = 0; j < g; ++j) {
            for (uint32_t d = 0; d < q.dim; ++d) f[d] = qs[j * q.dim + d] * ks[d];
            s[size_t(t) * g + j] = ref::score(f.data(), q.krow(t), q.dtype, q.dim);
        }
    }
    return s;
}

float dequant(const QData& q, uint32_t t, uint32_t d) {
    return ref::load(q.vrow(t), q.dtype, d) * q.vscale(t);
}

bool row_is_dequantized(const QData& q, const uint16_t* words, uint32_t t) {
    for (uint32_t d = 0; d < q.dim; ++d) {
        const uint32_t x = uint32_t(words[2 * d]) | (uint32_t(words[2 * d + 1]) << 16);
        const float want = dequant(q, t, d);
        uint32_t w;
        std::memcpy(&w, &want, 4);
        if (x != w) return false;
    }
    return true;
}

std::vector<cxlkv_hls_block> order(const QData& q, bool reversed) {
    std::vector<cxlkv_hls_block> b = q.blocks;
    if (reversed) std::reverse(b.begin(), b.end());
    return b;
}

cxlkv_ndp_cmd command(const QData& q, uint8_t op, uint16_t flags, uint32_t k, uint32_t g) {
    cxlkv_ndp_cmd c;
    std::memset(&c, 0, sizeof c);
    c.tag = 1;
    c.opcode = op;
    c.flags = flags;
    c.k = k;
    c.dtype = q.dtype;
    c.group = uint8_t(g);
    c.dim = q.dim;
    c.nblocks = q.nblocks;
    return c;
}

// One SCORE_TOPK case (and the GATHER that follows it); returns the failure or "".
std::string topk_case(const QData& q, ref::Rng& rng, uint32_t g, uint32_t k, bool gmax,
                      bool reversed) {
    std::vector<float> qs(size_t(g) * q.dim);
    for (auto& x : qs) x = rng.normal();
    const std::vector<float> s = ref_scores(q, qs, g);
    const uint32_t lists = gmax ? 1 : g, per = std::min(k, q.tokens);
    std::vector<std::vector<ref::Hit> > want(lists);
    for (uint32_t t = 0; t < q.tokens; ++t) {
        if (gmax) {
            float best = s[size_t(t) * g];
            for (uint32_t j = 1; j < g; ++j) best = s[size_t(t) * g + j] > best ? s[size_t(t) * g + j] : best;
            want[0].push_back({t, best});
        } else {
            for (uint32_t j = 0; j < g; ++j) want[j].push_back({t, s[size_t(t) * g + j]});
        }
    }
    for (auto& l : want) {
        std::stable_sort(l.begin(), l.end(), ref::rank_before);
        l.resize(per);
    }
    const std::vector<cxlkv_hls_block> blocks = order(q, reversed);
    cxlkv_ndp_cmd cmd = command(q, CXLKV_NDP_OP_SCORE_TOPK,
                                uint16_t(CXLKV_NDP_FLAG_GATHER_V | (gmax ? CXLKV_NDP_FLAG_GROUP_MAX : 0)), k, g);
    std::vector<cxlkv_ndp_hit> hits(size_t(lists) * per);
    std::vector<uint16_t> rows(size_t(lists) * per * 2 * q.dim);
    cxlkv_ndp_select nosel;
    std::memset(&nosel, 0, sizeof nosel);
    cxlkv_ndp_attend noatt;
    std::memset(&noatt, 0, sizeof noatt);
    cxlkv_ndp_cpl cpl;
    std::memset(&cpl, 0, sizeof cpl);
    cxlkv_ndp_top(cmd, nosel, noatt, q.keys.data(), q.vals.data(), qs.data(), q.meta.data(),
                  blocks.data(), nullptr, hits.data(), rows.data(), nullptr, nullptr, nullptr, &cpl);
    char msg[256];
    if (cpl.status != CXLKV_NDP_OK) {
        std::snprintf(msg, sizeof msg, "status %u detail %u", cpl.status, cpl.detail);
        return msg;
    }
    const uint64_t want_bytes = uint64_t(q.tokens) * q.rb + 4ull * q.dim * q.nblocks;
    if (cpl.bytes_scanned != want_bytes || cpl.blocks_scanned != q.nblocks)
        return "bytes or blocks scanned wrong";
    if (cpl.result_bytes != uint64_t(lists) * per * (8 + 4 * q.dim)) return "result bytes wrong";
    for (uint32_t l = 0; l < lists; ++l) {
        for (uint32_t i = 0; i < per; ++i) {
            const cxlkv_ndp_hit h = hits[size_t(l) * per + i];
            const ref::Hit w = want[l][i];
            if (h.token != w.t || !same_score(h.score, w.s)) {
                std::snprintf(msg, sizeof msg, "list %u hit %u: got (%u, %.9g) want (%u, %.9g)", l, i,
                              h.token, double(h.score), w.t, double(w.s));
                return msg;
            }
            if (!row_is_dequantized(q, &rows[(size_t(l) * per + i) * 2 * q.dim], w.t))
                return "gathered row is not the dequantized value row";
        }
    }
    // FLAG_PRUNE with a quantized dtype is refused.
    cxlkv_ndp_cmd pc = cmd;
    pc.flags |= CXLKV_NDP_FLAG_PRUNE;
    cxlkv_ndp_top(pc, nosel, noatt, q.keys.data(), q.vals.data(), qs.data(), q.meta.data(),
                  blocks.data(), nullptr, hits.data(), rows.data(), nullptr, nullptr, nullptr, &cpl);
    if (cpl.status != CXLKV_NDP_ERR_ARGS || cpl.detail != CXLKV_NDP_DETAIL_BAD_OPTIONS)
        return "FLAG_PRUNE on quantized blocks not refused";
    // GATHER of list 0's tokens in reverse: dequantized rows.
    std::vector<uint32_t> toks(per);
    for (uint32_t i = 0; i < per; ++i) toks[i] = want[0][per - 1 - i].t;
    cxlkv_ndp_cmd gc = command(q, CXLKV_NDP_OP_GATHER, 0, per, g);
    std::vector<cxlkv_ndp_hit> gh(per);
    std::vector<uint16_t> grows(size_t(per) * 2 * q.dim);
    cxlkv_ndp_top(gc, nosel, noatt, q.keys.data(), q.vals.data(), nullptr, q.meta.data(),
                  blocks.data(), toks.data(), gh.data(), grows.data(), nullptr, nullptr, nullptr, &cpl);
    if (cpl.status != CXLKV_NDP_OK || cpl.result_bytes != uint64_t(per) * (8 + 4 * q.dim))
        return "GATHER failed";
    for (uint32_t i = 0; i < per; ++i)
        if (gh[i].token != toks[i] || !row_is_dequantized(q, &grows[size_t(i) * 2 * q.dim], toks[i]))
            return "GATHER row is not the dequantized value row";
    // The engine library: the same lists, and the dequantized rows.
    cxlkv_hls_scan* es = cxlkv_hls_scan_new(g, k, gmax ? 1 : 0, qs.data(), q.dim);
    if (es == nullptr) return "engine: scan_new failed";
    for (const cxlkv_hls_block& b : blocks)
        cxlkv_hls_scan_block_q(es, &q.keys[b.k_elem], b.tokens, b.base, q.dtype, &q.meta[b.kscale_elem]);
    std::vector<cxlkv_ndp_hit> eh(size_t(lists) * per);
    cxlkv_hls_scan_finish(es, per, eh.data());
    cxlkv_hls_scan_free(es);
    for (size_t i = 0; i < eh.size(); ++i)
        if (eh[i].token != want[i / per][i % per].t || !same_score(eh[i].score, want[i / per][i % per].s))
            return "engine: hit differs";
    std::vector<float> row(q.dim);
    for (uint32_t i = 0; i < per; ++i) {
        const uint32_t t = want[0][i].t;
        const uint16_t* src = &q.vals[size_t(t) * q.rb / 2];
        if (cxlkv_hls_dequant_row(src, q.dim, q.dtype, q.vscale(t), row.data()) != 0 ||
            !row_is_dequantized(q, reinterpret_cast<const uint16_t*>(row.data()), t))
            return "engine: dequantized row differs";
    }
    return "";
}

// One selected SCORE_TOPK case.
std::string select_case(const QData& q, ref::Rng& rng, uint32_t g, uint32_t k,
                        const cxlkv_ndp_select& sel, bool reversed, double& worst) {
    std::vector<float> qs(size_t(g) * q.dim);
    for (auto& x : qs) x = rng.normal();
    const std::vector<float> s = ref_scores(q, qs, g);
    const std::vector<cxlkv_hls_block> blocks = order(q, reversed);
    std::vector<ref::SelRef> lists(g, ref::SelRef(sel, k));
    for (const cxlkv_hls_block& b : blocks)
        for (uint32_t t = b.base; t < b.base + b.tokens; ++t)
            for (uint32_t j = 0; j < g; ++j) lists[j].offer(t, s[size_t(t) * g + j]);
    const uint32_t per = std::min(k, q.tokens);
    cxlkv_ndp_cmd cmd = command(q, CXLKV_NDP_OP_SCORE_TOPK, CXLKV_NDP_FLAG_SELECT, k, g);
    std::vector<cxlkv_ndp_hit> hits(size_t(g) * per);
    std::vector<cxlkv_ndp_list_info> info(g);
    cxlkv_ndp_attend noatt;
    std::memset(&noatt, 0, sizeof noatt);
    cxlkv_ndp_cpl cpl;
    std::memset(&cpl, 0, sizeof cpl);
    cxlkv_ndp_top(cmd, sel, noatt, q.keys.data(), q.vals.data(), qs.data(), q.meta.data(),
                  blocks.data(), nullptr, hits.data(), nullptr, nullptr, nullptr, info.data(), &cpl);
    char msg[256];
    if (cpl.status != CXLKV_NDP_OK) {
        std::snprintf(msg, sizeof msg, "selection: status %u detail %u", cpl.status, cpl.detail);
        return msg;
    }
    for (uint32_t j = 0; j < g; ++j) {
        std::vector<ref::Hit> want;
        float left = 0.0f;
        if (!lists[j].finish(want, left)) return "reference refused the selection";
        if (info[j].count != want.size()) {
            std::snprintf(msg, sizeof msg, "selection list %u: %u hits, the reference %zu", j,
                          info[j].count, want.size());
            return msg;
        }
        for (size_t i = 0; i < want.size(); ++i) {
            const cxlkv_ndp_hit h = hits[size_t(j) * per + i];
            if (h.token != want[i].t || !same_score(h.score, want[i].s)) return "selection hit differs";
        }
        const double e = std::fabs(double(info[j].left_out_mass) - double(left));
        worst = std::max(worst, e);
        if (!(e <= 1e-6)) return "selection left-out mass differs";
    }
    // The engine library: the top function's lists and masses, bit for bit.
    cxlkv_hls_sel* es = cxlkv_hls_sel_new(g, k, 0, qs.data(), q.dim, &sel);
    if (es == nullptr) return "engine: sel_new failed";
    for (const cxlkv_hls_block& b : blocks)
        cxlkv_hls_sel_block_q(es, &q.keys[b.k_elem], b.tokens, b.base, q.dtype, &q.meta[b.kscale_elem]);
    std::vector<cxlkv_ndp_hit> eh(size_t(g) * k);
    std::vector<cxlkv_ndp_list_info> ei(g);
    const int nl = cxlkv_hls_sel_finish(es, eh.data(), ei.data());
    cxlkv_hls_sel_free(es);
    if (nl != int(g)) return "engine: selection failed";
    for (uint32_t j = 0; j < g; ++j) {
        if (ei[j].count != info[j].count || std::memcmp(&ei[j].left_out_mass, &info[j].left_out_mass, 4) != 0)
            return "engine: selection count or mass differs";
        for (uint32_t i = 0; i < ei[j].count; ++i)
            if (eh[size_t(j) * k + i].token != hits[size_t(j) * per + i].token ||
                !same_score(eh[size_t(j) * k + i].score, hits[size_t(j) * per + i].score))
                return "engine: selection hit differs";
    }
    return "";
}

// One ATTEND case.
std::string attend_case(const QData& q, ref::Rng& rng, uint32_t g, float scale, bool reversed,
                        double& worst) {
    std::vector<float> qs(size_t(g) * q.dim);
    for (auto& x : qs) x = rng.normal();
    const std::vector<cxlkv_hls_block> blocks = order(q, reversed);
    std::vector<ref::Part> want(g);
    for (uint32_t j = 0; j < g; ++j) {
        want[j].out.assign(q.dim, 0.0f);
        for (const cxlkv_hls_block& b : blocks) {
            std::vector<float> f(q.dim);
            const float* ks = &q.meta[b.kscale_elem];
            for (uint32_t d = 0; d < q.dim; ++d) f[d] = qs[j * q.dim + d] * ks[d];
            const ref::Part p = ref::attend_rows(f.data(), q.krow(b.base), q.vrow(b.base),
                                                 &q.meta[b.vscale_elem], b.tokens, q.dtype, q.dim, scale);
            ref::merge(want[j], p);
        }
    }
    cxlkv_ndp_cmd cmd = command(q, CXLKV_NDP_OP_ATTEND, 0, 0, g);
    cxlkv_ndp_attend att;
    std::memset(&att, 0, sizeof att);
    att.scale = scale;
    cxlkv_ndp_select nosel;
    std::memset(&nosel, 0, sizeof nosel);
    std::vector<float> out(size_t(g) * q.dim, NAN);
    std::vector<cxlkv_ndp_partial> ms(g);
    cxlkv_ndp_cpl cpl;
    std::memset(&cpl, 0, sizeof cpl);
    cxlkv_ndp_top(cmd, nosel, att, q.keys.data(), q.vals.data(), qs.data(), q.meta.data(),
                  blocks.data(), nullptr, nullptr, nullptr, out.data(), ms.data(), nullptr, &cpl);
    char msg[256];
    if (cpl.status != CXLKV_NDP_OK) {
        std::snprintf(msg, sizeof msg, "ATTEND: status %u", cpl.status);
        return msg;
    }
    const uint64_t want_bytes = 2ull * q.tokens * q.rb + 4ull * (q.dim * q.nblocks + q.tokens);
    if (cpl.bytes_scanned != want_bytes || cpl.blocks_scanned != q.nblocks)
        return "ATTEND: bytes or blocks scanned wrong";
    for (uint32_t j = 0; j < g; ++j) {
        double num = 0.0, den = 0.0;
        for (uint32_t d = 0; d < q.dim; ++d) {
            const double a = out[j * q.dim + d], b = want[j].out[d];
            num += (a - b) * (a - b);
            den += b * b;
        }
        const double e_out = den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
        const double e_sum = std::fabs(double(ms[j].sum) - double(want[j].sum)) / double(want[j].sum);
        worst = std::max(worst, std::max(e_out, e_sum));
        if (!same_score(ms[j].max, want[j].max)) {
            std::snprintf(msg, sizeof msg, "ATTEND query %u: max %.9g, the reference %.9g", j,
                          double(ms[j].max), double(want[j].max));
            return msg;
        }
        if (!(e_out <= QUANT_ATTEND_TOL) || !(e_sum <= QUANT_ATTEND_TOL)) {
            std::snprintf(msg, sizeof msg, "ATTEND query %u: sum error %.3g, out error %.3g", j, e_sum,
                          e_out);
            return msg;
        }
    }
    // The engine library: the top function's partials, bit for bit.
    cxlkv_hls_attend* ea = cxlkv_hls_attend_new(g, qs.data(), q.dim, scale);
    if (ea == nullptr) return "engine: attend_new failed";
    for (const cxlkv_hls_block& b : blocks)
        cxlkv_hls_attend_block_q(ea, &q.keys[b.k_elem], &q.vals[b.v_elem], b.tokens, q.dtype,
                                 &q.meta[b.kscale_elem], &q.meta[b.vscale_elem]);
    std::vector<float> eo(size_t(g) * q.dim), em(g), es(g);
    cxlkv_hls_attend_finish(ea, eo.data(), em.data(), es.data());
    cxlkv_hls_attend_free(ea);
    for (uint32_t j = 0; j < g; ++j)
        if (std::memcmp(&em[j], &ms[j].max, 4) != 0 || std::memcmp(&es[j], &ms[j].sum, 4) != 0)
            return "engine: ATTEND max or sum differs";
    if (std::memcmp(eo.data(), out.data(), eo.size() * 4) != 0) return "engine: ATTEND out differs";
    // The fold: one f32 multiply per element.
    std::vector<float> folded(size_t(g) * q.dim);
    const float* ks = &q.meta[blocks[0].kscale_elem];
    cxlkv_hls_fold(qs.data(), g, q.dim, ks, folded.data());
    for (uint32_t i = 0; i < g * q.dim; ++i) {
        const float w = qs[i] * ks[i % q.dim];
        if (std::memcmp(&folded[i], &w, 4) != 0) return "engine: fold differs";
    }
    return "";
}

}  // namespace

int run_quant(int& passed, int& failed) {
    const QSet sets[] = {
        {"quant_int8_d64_b128", CXLKV_HLS_DTYPE_I8, 64, 500, 128},
        {"quant_int8_d128_b96", CXLKV_HLS_DTYPE_I8, 128, 333, 96},
        {"quant_int4_d64_b96", CXLKV_HLS_DTYPE_I4, 64, 500, 96},
        {"quant_int4_d128_b128", CXLKV_HLS_DTYPE_I4, 128, 400, 128},
    };
    int nsets = 0;
    for (const QSet& set : sets) {
        ref::Rng rng(0x5eed0000u + set.dtype * 131 + set.dim);
        const QData q = make(set, rng);
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
        for (uint32_t g : {1u, 3u})
            for (uint32_t k : {1u, 32u, 200u})
                for (bool gmax : {false, true}) report(topk_case(q, rng, g, k, gmax, ci % 2 == 1), "SCORE_TOPK");
        cxlkv_ndp_select sel;
        std::memset(&sel, 0, sizeof sel);
        sel.scale = 1.0f / std::sqrt(float(set.dim));
        sel.options = CXLKV_NDP_SEL_TOP_P | CXLKV_NDP_SEL_WINDOW;
        sel.top_p = 0.9f;
        sel.sinks = 4;
        sel.window_start = set.tokens - 16;
        sel.window_end = set.tokens;
        report(select_case(q, rng, 3, 128, sel, false, worst_mass), "selection top-p");
        std::memset(&sel, 0, sizeof sel);
        sel.scale = 1.0f / std::sqrt(float(set.dim));
        sel.options = CXLKV_NDP_SEL_EXCLUDE;
        sel.exclude_start = set.tokens - 64;
        sel.exclude_end = set.tokens + 100;
        report(select_case(q, rng, 2, 40, sel, true, worst_mass), "selection top-k");
        for (uint32_t g : {1u, 4u})
            for (float sharp : {1.0f, 4.0f})
                report(attend_case(q, rng, g, sharp / std::sqrt(float(set.dim)), ci % 2 == 1, worst_att),
                       "ATTEND");
        std::printf("%-24s dtype %u d %3u tokens %4u blocks %2u: %d/%d quantized cases passed "
                    "(ATTEND max rel. error %.2g, left-out mass error %.2g)\n",
                    set.name, set.dtype, set.dim, set.tokens, q.nblocks, ok, ci, worst_att, worst_mass);
        passed += ok;
        failed += bad;
        ++nsets;
    }
    return nsets;
}
