// C-simulation test bench, ATTEND: runs cxlkv_ndp_top() on every case of an ATTEND golden set
// (NAME.gatt, written by the Rust reference: kernels/examples/golden/attend.rs) and checks each
// query's partial against the reference's:
//   - max: bit for bit (it is the largest scaled canonical score, no exp involved);
//   - sum: relative error <= ATTEND_TOL;
//   - out: Euclidean relative error ||out - ref|| / ||ref|| <= ATTEND_TOL.
// With the C library's exp (this build: the one Rust's f32::exp calls) ATTEND_TOL is 0: sum and
// out must be the reference's bit for bit. With the vendor's hls::exp or a perturbed exp
// (CXLKV_HLS_EXP_ULP, `make csim-ulp`) it is 1e-5, the tolerance fpga/README.md states for the
// block merge's exp. The largest errors seen are printed per set. A command with flags
// must fail with CXLKV_NDP_ERR_ARGS, so must a non-finite scale (DETAIL_BAD_SCALE) and nonzero
// reserved fields (DETAIL_BAD_OPTIONS).
#include <cmath>

#include "tb_common.h"

namespace {

#if defined(CXLKV_HLS_VENDOR) || defined(CXLKV_HLS_EXP_ULP)
constexpr double ATTEND_TOL = 1e-5;
#else
constexpr double ATTEND_TOL = 0.0;
#endif

double rel(double num2, double den2) { return den2 == 0.0 ? std::sqrt(num2) : std::sqrt(num2 / den2); }

}  // namespace

int run_attend(Reader& r, const std::string& name, int& passed, int& failed) {
    const uint32_t dtype = r.u32(), dim = r.u32(), tokens = r.u32(), bt = r.u32(),
                   nblocks = r.u32(), ncases = r.u32();
    const uint32_t words = dtype == CXLKV_HLS_DTYPE_F32 ? 2 : 1;
    std::vector<uint16_t> keys, values;
    r.raw(keys, size_t(tokens) * dim * words);
    r.raw(values, size_t(tokens) * dim * words);
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
    cxlkv_ndp_select nosel;
    std::memset(&nosel, 0, sizeof nosel);
    int file_pass = 0, file_fail = 0;
    double worst_out = 0.0, worst_sum = 0.0;
    for (uint32_t ci = 0; ci < ncases; ++ci) {
        const uint32_t g = r.u32();
        const float scale = r.f32();
        std::vector<float> q, want;
        r.raw(q, size_t(g) * dim);
        r.raw(want, size_t(g) * (dim + 2));
        if (!r.ok) {
            std::printf("FAIL %s: truncated case %u\n", name.c_str(), ci);
            ++file_fail;
            break;
        }
        cxlkv_ndp_cmd cmd;
        std::memset(&cmd, 0, sizeof cmd);
        cmd.tag = ci + 1;
        cmd.opcode = CXLKV_NDP_OP_ATTEND;
        cmd.dtype = uint8_t(dtype);
        cmd.group = uint8_t(g);
        cmd.dim = dim;
        cmd.nblocks = nblocks;
        std::vector<float> got(size_t(g) * dim + 1, NAN);
        std::vector<cxlkv_ndp_partial> ms(g + 1);
        cxlkv_ndp_attend att;
        std::memset(&att, 0, sizeof att);
        att.scale = scale;
        cxlkv_ndp_cpl cpl;
        std::memset(&cpl, 0, sizeof cpl);
        auto run = [&](const cxlkv_ndp_cmd& cm, const cxlkv_ndp_attend& a) {
            cxlkv_ndp_top(cm, nosel, a, keys.data(), values.data(), q.data(), nullptr,
                          blocks.data(), nullptr, nullptr, nullptr, got.data(), ms.data(), nullptr,
                          &cpl);
        };
        run(cmd, att);
        std::string why;
        char msg[256];
        if (cpl.status != CXLKV_NDP_OK) {
            std::snprintf(msg, sizeof msg, "status %u", cpl.status);
            why = msg;
        } else if (cpl.blocks_scanned != nblocks ||
                   cpl.bytes_scanned != 2ull * tokens * dim * words * 2) {
            why = "blocks or bytes scanned wrong";
        }
        for (uint32_t qi = 0; why.empty() && qi < g; ++qi) {
            double num = 0.0, den = 0.0;
            for (uint32_t d = 0; d < dim; ++d) {
                double a = got[qi * dim + d], b = want[qi * dim + d];
                num += (a - b) * (a - b);
                den += b * b;
            }
            const double e_out = rel(num, den);
            const float gm = ms[qi].max, wm = want[g * dim + qi];
            const double gs = ms[qi].sum, ws = want[g * dim + g + qi];
            const double e_sum = std::fabs(gs - ws) / std::fabs(ws);
            worst_out = e_out > worst_out ? e_out : worst_out;
            worst_sum = e_sum > worst_sum ? e_sum : worst_sum;
            if (!same_score(gm, wm)) {
                std::snprintf(msg, sizeof msg, "query %u: max %.9g, the reference %.9g", qi,
                              double(gm), double(wm));
                why = msg;
            } else if (!(e_sum <= ATTEND_TOL) || !(e_out <= ATTEND_TOL)) {
                std::snprintf(msg, sizeof msg, "query %u: sum error %.3g, out error %.3g", qi,
                              e_sum, e_out);
                why = msg;
            }
        }
        // The same command with a flag set, a non-finite scale or a reserved field is refused.
        if (why.empty()) {
            cxlkv_ndp_cmd bad = cmd;
            bad.flags = CXLKV_NDP_FLAG_PRUNE;
            run(bad, att);
            if (cpl.status != CXLKV_NDP_ERR_ARGS) why = "ATTEND with flags not refused";
            cxlkv_ndp_attend a = att;
            a.scale = INFINITY;
            run(cmd, a);
            if (cpl.status != CXLKV_NDP_ERR_ARGS || cpl.detail != CXLKV_NDP_DETAIL_BAD_SCALE)
                why = "ATTEND with an infinite scale not refused";
            a = att;
            a.reserved1 = 1;
            run(cmd, a);
            if (cpl.status != CXLKV_NDP_ERR_ARGS || cpl.detail != CXLKV_NDP_DETAIL_BAD_OPTIONS)
                why = "ATTEND with a reserved field set not refused";
        }
        if (why.empty()) {
            ++file_pass;
        } else {
            ++file_fail;
            std::printf("FAIL %s case %u (g %u scale %g): %s\n", name.c_str(), ci, g,
                        double(scale), why.c_str());
        }
    }
    std::printf("%-24s dtype %u d %3u tokens %4u blocks %2u: %d/%u ATTEND cases passed "
                "(max rel. error: out %.2g, sum %.2g)\n",
                name.c_str(), dtype, dim, tokens, nblocks, file_pass, ncases, worst_out,
                worst_sum);
    passed += file_pass;
    failed += file_fail + int(ncases) - file_pass - file_fail;
    return 0;
}
