// C-simulation test bench, SCORE_TOPK selection: runs cxlkv_ndp_top() on every case of a
// selection golden set (NAME.gsel, written by the Rust reference: runtime/src/ndp/select.rs via
// ndp-emulator/examples/golden_select.rs) and checks, per list:
//   - the hit count and the indices: identical;
//   - the scores: bit for bit (0 ulp, -0 == +0);
//   - the left-out mass: within SELECT_MASS_TOL (absolute), the tolerance fpga/README.md states
//     for the kernel's f64 exp (exact with the C library's exp, as here);
//   - the gathered value rows (FLAG_GATHER_V) of every hit;
// and, for a refused selection, the status (CXLKV_NDP_ERR_ARGS) and the reference's detail.
#include <cmath>

#include "tb_common.h"

namespace {
constexpr double SELECT_MASS_TOL = 1e-6;
}

int run_select(Reader& r, const std::string& name, int& passed, int& failed) {
    const uint32_t dtype = r.u32(), dim = r.u32(), tokens = r.u32(), bt = r.u32(),
                   nblocks = r.u32(), ncases = r.u32();
    const uint32_t words = dtype == CXLKV_HLS_DTYPE_F32 ? 2 : 1;
    std::vector<uint16_t> keys;
    r.raw(keys, size_t(tokens) * dim * words);
    if (!r.ok || bt == 0) {
        std::printf("FAIL %s: truncated header\n", name.c_str());
        return -1;
    }
    std::vector<cxlkv_hls_block> blocks(nblocks);
    for (uint32_t b = 0; b < nblocks; ++b) {
        uint32_t start = b * bt, end = start + bt < tokens ? start + bt : tokens;
        blocks[b].k_elem = uint64_t(start) * dim * words;
        blocks[b].v_elem = blocks[b].k_elem;
        blocks[b].bounds_elem = 0;
        blocks[b].tokens = end - start;
        blocks[b].base = start;
    }
    int file_pass = 0, file_fail = 0, refused = 0;
    double worst_mass = 0.0;
    for (uint32_t ci = 0; ci < ncases; ++ci) {
        const uint32_t g = r.u32(), k = r.u32(), group_max = r.u32();
        cxlkv_ndp_select sel;
        std::memset(&sel, 0, sizeof sel);
        sel.sinks = r.u64();
        sel.window_start = r.u64();
        sel.window_end = r.u64();
        sel.exclude_start = r.u64();
        sel.exclude_end = r.u64();
        sel.options = r.u32();
        sel.top_p = r.f32();
        sel.scale = r.f32();
        std::vector<float> q;
        r.raw(q, size_t(g) * dim);
        const uint32_t want_status = r.u32(), want_detail = r.u32();
        uint32_t lists = 0;
        std::vector<uint32_t> want_count;
        std::vector<float> want_left;
        std::vector<std::vector<cxlkv_ndp_hit> > want;
        if (want_status == CXLKV_NDP_OK) {
            lists = r.u32();
            for (uint32_t l = 0; r.ok && l < lists && l < 64; ++l) {
                want_count.push_back(r.u32());
                want_left.push_back(r.f32());
                want.emplace_back();
                r.raw(want.back(), want_count.back());
            }
        }
        if (!r.ok || lists > 64) {
            std::printf("FAIL %s: truncated case %u\n", name.c_str(), ci);
            ++file_fail;
            break;
        }
        cxlkv_ndp_cmd cmd;
        std::memset(&cmd, 0, sizeof cmd);
        cmd.tag = ci + 1;
        cmd.opcode = CXLKV_NDP_OP_SCORE_TOPK;
        cmd.flags = uint16_t(CXLKV_NDP_FLAG_SELECT | CXLKV_NDP_FLAG_GATHER_V |
                             (group_max ? CXLKV_NDP_FLAG_GROUP_MAX : 0));
        cmd.k = k;
        cmd.dtype = uint8_t(dtype);
        cmd.group = uint8_t(g);
        cmd.dim = dim;
        cmd.nblocks = nblocks;
        const uint32_t nl = group_max ? 1 : g, per = k < tokens ? k : tokens;
        std::vector<cxlkv_ndp_hit> got(size_t(nl) * per);
        std::vector<uint16_t> rows(size_t(nl) * per * dim * words);
        std::vector<cxlkv_ndp_list_info> res(nl);
        cxlkv_ndp_attend noatt;
        std::memset(&noatt, 0, sizeof noatt);
        cxlkv_ndp_cpl cpl;
        std::memset(&cpl, 0, sizeof cpl);
        auto run = [&](const cxlkv_ndp_cmd& cm, const cxlkv_ndp_select& s) {
            cxlkv_ndp_top(cm, s, noatt, keys.data(), keys.data(), q.data(), nullptr,
                          blocks.data(), nullptr, got.data(), rows.data(), nullptr, nullptr,
                          res.data(), &cpl);
        };
        // Refused whatever the selection: FLAG_PRUNE with it, unknown options, reserved fields.
        if (ci == 0) {
            cxlkv_ndp_cmd pc = cmd;
            pc.flags |= CXLKV_NDP_FLAG_PRUNE;
            run(pc, sel);
            bool ok = cpl.status == CXLKV_NDP_ERR_ARGS && cpl.detail == CXLKV_NDP_DETAIL_BAD_OPTIONS;
            cxlkv_ndp_select bs = sel;
            bs.options |= 8;
            run(cmd, bs);
            ok = ok && cpl.status == CXLKV_NDP_ERR_ARGS && cpl.detail == CXLKV_NDP_DETAIL_BAD_OPTIONS;
            bs = sel;
            bs.candidates = 1;
            run(cmd, bs);
            ok = ok && cpl.status == CXLKV_NDP_ERR_ARGS && cpl.detail == CXLKV_NDP_DETAIL_BAD_OPTIONS;
            bs = sel;
            bs.scale = NAN;
            run(cmd, bs);
            ok = ok && cpl.status == CXLKV_NDP_ERR_ARGS && cpl.detail == CXLKV_NDP_DETAIL_BAD_SCALE;
            if (!ok) {
                std::printf("FAIL %s: a malformed selection was not refused\n", name.c_str());
                ++file_fail;
            }
        }
        run(cmd, sel);
        std::string why;
        char msg[256];
        if (cpl.status != want_status || (want_status != CXLKV_NDP_OK && cpl.detail != want_detail)) {
            std::snprintf(msg, sizeof msg, "status %u detail %u, the reference %u detail %u",
                          cpl.status, cpl.detail, want_status, want_detail);
            why = msg;
        }
        if (want_status != CXLKV_NDP_OK) ++refused;
        for (uint32_t l = 0; why.empty() && l < lists; ++l) {
            if (lists != nl || res[l].count != want_count[l]) {
                std::snprintf(msg, sizeof msg, "list %u: %u hits, the reference %u", l,
                              res[l].count, want_count[l]);
                why = msg;
                break;
            }
            for (uint32_t i = want_count[l]; why.empty() && i < per; ++i) {
                const cxlkv_ndp_hit h = got[size_t(l) * per + i];
                if (h.token != 0xFFFFFFFFu || !(h.score == -INFINITY)) why = "padding hit wrong";
            }
            for (uint32_t i = 0; why.empty() && i < want_count[l]; ++i) {
                const cxlkv_ndp_hit h = got[size_t(l) * per + i], w = want[l][i];
                if (h.token != w.token || !same_score(h.score, w.score)) {
                    std::snprintf(msg, sizeof msg, "list %u hit %u: got (%u, %.9g) want (%u, %.9g)",
                                  l, i, h.token, double(h.score), w.token, double(w.score));
                    why = msg;
                } else if (std::memcmp(&rows[(size_t(l) * per + i) * dim * words],
                                       &keys[size_t(w.token) * dim * words],
                                       dim * words * 2) != 0) {
                    std::snprintf(msg, sizeof msg, "list %u: gathered row %u differs", l, i);
                    why = msg;
                }
            }
            const double e = std::fabs(double(res[l].left_out_mass) - double(want_left[l]));
            worst_mass = e > worst_mass ? e : worst_mass;
            if (why.empty() && !(e <= SELECT_MASS_TOL)) {
                std::snprintf(msg, sizeof msg, "list %u: left-out mass %.9g, the reference %.9g",
                              l, double(res[l].left_out_mass), double(want_left[l]));
                why = msg;
            }
        }
        if (why.empty()) {
            ++file_pass;
        } else {
            ++file_fail;
            std::printf("FAIL %s case %u (g %u k %u group_max %u): %s\n", name.c_str(), ci, g, k,
                        group_max, why.c_str());
        }
    }
    std::printf("%-24s dtype %u d %3u tokens %4u blocks %2u: %d/%u selection cases passed "
                "(%d refused as the reference; max left-out mass error %.2g)\n",
                name.c_str(), dtype, dim, tokens, nblocks, file_pass, ncases, refused, worst_mass);
    passed += file_pass;
    failed += file_fail + int(ncases) - file_pass - file_fail;
    return 0;
}
