// C-simulation test bench of the HLS kernel: runs cxlkv_ndp_top() on every case of every golden
// set (fpga/golden/*.gold, written by `cargo run -p cxlkv-kernels --example golden`) and checks
// indices exactly and scores bit for bit (tolerance 0 ulp; -0 and +0 compare equal, as the
// ranking does). Pruned cases must also skip exactly as many blocks as the Rust pruned scan.
// Every SCORE_TOPK case is followed by a GATHER of its first list's tokens, checked against the
// key rows of the file (the test bench stores the keys again as the "values" region). The block
// list is handed to the kernel reversed for every other case: results must not depend on it.
//
// After the golden sets, the self-generated ones (quantized blocks, sparse ATTEND; tb_quant.cpp,
// tb_sparse.cpp) run against the C++ reference of tb_ref.h.
//
// Usage: tb GOLDEN_FILE...   Exit status 0 iff every case passed.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tb_common.h"

namespace {

int run_file(const char* path, int& passed, int& failed) {
    Reader r;
    FILE* f = std::fopen(path, "rb");
    if (!f) {
        std::printf("FAIL %s: cannot open\n", path);
        return -1;
    }
    unsigned char tmp[65536];
    size_t n;
    while ((n = std::fread(tmp, 1, sizeof tmp, f)) > 0) r.buf.insert(r.buf.end(), tmp, tmp + n);
    std::fclose(f);
    std::string name(path);
    name = name.substr(name.find_last_of('/') + 1);
    if (r.buf.size() >= 8 && std::memcmp(r.buf.data(), "CXLKVGA1", 8) == 0) {
        r.at = 8;
        return run_attend(r, name, passed, failed);
    }
    if (r.buf.size() >= 8 && std::memcmp(r.buf.data(), "CXLKVGS1", 8) == 0) {
        r.at = 8;
        return run_select(r, name, passed, failed);
    }
    if (r.buf.size() < 8 || std::memcmp(r.buf.data(), "CXLKVGL1", 8) != 0) {
        std::printf("FAIL %s: bad magic\n", path);
        return -1;
    }
    r.at = 8;
    const uint32_t dtype = r.u32(), dim = r.u32(), tokens = r.u32(), bt = r.u32(),
                   nblocks = r.u32(), ncases = r.u32();
    const uint32_t words = dtype == CXLKV_HLS_DTYPE_F32 ? 2 : 1;
    std::vector<uint16_t> keys;
    r.raw(keys, size_t(tokens) * dim * words);
    std::vector<float> bounds;
    r.raw(bounds, size_t(nblocks) * 2 * dim);
    if (!r.ok) {
        std::printf("FAIL %s: truncated header\n", path);
        return -1;
    }
    int file_pass = 0, file_fail = 0;
    for (uint32_t ci = 0; ci < ncases; ++ci) {
        const uint32_t g = r.u32(), k = r.u32(), flags = r.u32(), want_pruned = r.u32();
        std::vector<float> q;
        r.raw(q, size_t(g) * dim);
        const uint32_t lists = r.u32(), per_list = r.u32();
        std::vector<cxlkv_ndp_hit> want;
        r.raw(want, size_t(lists) * per_list);
        if (!r.ok) {
            std::printf("FAIL %s: truncated case %u\n", name.c_str(), ci);
            ++file_fail;
            break;
        }
        // The block list, reversed for odd cases.
        std::vector<cxlkv_hls_block> blocks(nblocks);
        for (uint32_t b = 0; b < nblocks; ++b) {
            uint32_t start = b * bt, end = start + bt < tokens ? start + bt : tokens;
            cxlkv_hls_block blk;
            blk.k_elem = uint64_t(start) * dim * words;
            blk.v_elem = blk.k_elem;
            blk.bounds_elem = uint64_t(b) * 2 * dim;
            blk.tokens = end - start;
            blk.base = start;
            blocks[(ci % 2) ? nblocks - 1 - b : b] = blk;
        }
        std::vector<float> bnd(bounds.size());
        for (uint32_t b = 0; b < nblocks; ++b) {
            uint32_t src = blocks[b].base / bt;
            std::memcpy(&bnd[size_t(b) * 2 * dim], &bounds[size_t(src) * 2 * dim],
                        sizeof(float) * 2 * dim);
            blocks[b].bounds_elem = uint64_t(b) * 2 * dim;
        }
        cxlkv_ndp_cmd cmd;
        std::memset(&cmd, 0, sizeof cmd);
        cmd.tag = ci + 1;
        cmd.opcode = CXLKV_NDP_OP_SCORE_TOPK;
        cmd.flags = uint16_t(flags | CXLKV_NDP_FLAG_GATHER_V);
        cmd.k = k;
        cmd.dtype = uint8_t(dtype);
        cmd.group = uint8_t(g);
        cmd.dim = dim;
        cmd.nblocks = nblocks;
        std::vector<cxlkv_ndp_hit> got(size_t(lists) * per_list + 1);
        std::vector<uint16_t> rows(size_t(lists) * per_list * dim * words + 1);
        cxlkv_ndp_cpl cpl;
        std::memset(&cpl, 0, sizeof cpl);
        cxlkv_ndp_select nosel;
        std::memset(&nosel, 0, sizeof nosel);
        cxlkv_ndp_attend noatt;
        std::memset(&noatt, 0, sizeof noatt);
        cxlkv_ndp_top(cmd, nosel, noatt, keys.data(), keys.data(), q.data(), bnd.data(),
                      blocks.data(), nullptr, got.data(), rows.data(), nullptr, nullptr, nullptr,
                      &cpl);
        std::string why;
        char msg[256];
        if (cpl.status != CXLKV_NDP_OK) {
            std::snprintf(msg, sizeof msg, "status %u", cpl.status);
            why = msg;
        }
        for (size_t i = 0; why.empty() && i < want.size(); ++i) {
            if (got[i].token != want[i].token || !same_score(got[i].score, want[i].score)) {
                std::snprintf(msg, sizeof msg, "hit %zu: got (%u, %.9g) want (%u, %.9g)", i,
                              got[i].token, double(got[i].score), want[i].token,
                              double(want[i].score));
                why = msg;
            }
        }
        if (why.empty() && want_pruned != 0xffffffffu && cpl.blocks_pruned != want_pruned) {
            std::snprintf(msg, sizeof msg, "pruned %u blocks, the reference %u",
                          cpl.blocks_pruned, want_pruned);
            why = msg;
        }
        if (why.empty() && cpl.blocks_scanned + cpl.blocks_pruned != nblocks) {
            why = "scanned + pruned != blocks";
        }
        for (size_t i = 0; why.empty() && i < want.size(); ++i) {
            const uint16_t* src = &keys[size_t(want[i].token) * dim * words];
            if (std::memcmp(&rows[i * dim * words], src, dim * words * 2) != 0) {
                std::snprintf(msg, sizeof msg, "gathered row %zu differs", i);
                why = msg;
            }
        }
        // GATHER of list 0's tokens, in reverse.
        if (why.empty()) {
            std::vector<uint32_t> toks(per_list);
            for (uint32_t i = 0; i < per_list; ++i) toks[i] = want[per_list - 1 - i].token;
            cxlkv_ndp_cmd gc = cmd;
            gc.opcode = CXLKV_NDP_OP_GATHER;
            gc.flags = 0;
            gc.k = per_list;
            std::vector<cxlkv_ndp_hit> gh(per_list + 1);
            std::vector<uint16_t> grows(size_t(per_list) * dim * words + 1);
            cxlkv_ndp_top(gc, nosel, noatt, keys.data(), keys.data(), nullptr, nullptr,
                          blocks.data(), toks.data(), gh.data(), grows.data(), nullptr, nullptr,
                          nullptr, &cpl);
            if (cpl.status != CXLKV_NDP_OK) why = "GATHER failed";
            for (uint32_t i = 0; why.empty() && i < per_list; ++i) {
                const uint16_t* src = &keys[size_t(toks[i]) * dim * words];
                if (gh[i].token != toks[i] ||
                    std::memcmp(&grows[size_t(i) * dim * words], src, dim * words * 2) != 0)
                    why = "GATHER row differs";
            }
        }
        if (why.empty()) {
            ++file_pass;
        } else {
            ++file_fail;
            std::printf("FAIL %s case %u (g %u k %u flags %u): %s\n", name.c_str(), ci, g, k,
                        flags, why.c_str());
        }
    }
    std::printf("%-24s dtype %u d %3u tokens %4u blocks %2u: %d/%u cases passed\n", name.c_str(),
                dtype, dim, tokens, nblocks, file_pass, ncases);
    passed += file_pass;
    failed += file_fail + int(ncases) - file_pass - file_fail;
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::printf("usage: %s GOLDEN_FILE...\n", argv[0]);
        return 2;
    }
    int passed = 0, failed = 0, bad_files = 0;
    for (int i = 1; i < argc; ++i) {
        if (run_file(argv[i], passed, failed) != 0) ++bad_files;
    }
    int generated = run_quant(passed, failed);
    generated += run_sparse(passed, failed);
    std::printf("csim: %d sets, %d passed, %d failed%s\n", argc - 1 - bad_files + generated, passed,
                failed + bad_files, bad_files ? " (unreadable sets counted as failures)" : "");
    return (failed == 0 && bad_files == 0 && passed > 0) ? 0 : 1;
}
