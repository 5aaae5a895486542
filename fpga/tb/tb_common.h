// Shared parts of the C-simulation test bench: the golden-file reader and the checks.
#ifndef CXLKV_TB_COMMON_H
#define CXLKV_TB_COMMON_H

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../src/cxlkv_ndp_kernel.h"

struct Reader {
    std::vector<unsigned char> buf;
    size_t at = 0;
    bool ok = true;
    uint32_t u32() {
        uint32_t x = 0;
        if (at + 4 > buf.size()) {
            ok = false;
            return 0;
        }
        std::memcpy(&x, &buf[at], 4);
        at += 4;
        return x;
    }
    uint64_t u64() {
        uint64_t lo = u32();
        return lo | (uint64_t(u32()) << 32);
    }
    float f32() {
        uint32_t b = u32();
        float f;
        std::memcpy(&f, &b, 4);
        return f;
    }
    template <typename T>
    void raw(std::vector<T>& v, size_t n) {
        if (at + n * sizeof(T) > buf.size()) {
            ok = false;
            return;
        }
        v.resize(n);
        std::memcpy(v.data(), &buf[at], n * sizeof(T));
        at += n * sizeof(T);
    }
};

inline bool same_score(float a, float b) {
    uint32_t x, y;
    std::memcpy(&x, &a, 4);
    std::memcpy(&y, &b, 4);
    return x == y || (a == 0.0f && b == 0.0f);
}

// ATTEND sets (NAME.gatt, tb_attend.cpp) and selection sets (NAME.gsel, tb_select.cpp), read
// after their magic; -1 if the file is unreadable.
int run_attend(Reader& r, const std::string& name, int& passed, int& failed);
int run_select(Reader& r, const std::string& name, int& passed, int& failed);
// Self-generated sets with a C++ reference (tb_ref.h): quantized blocks (tb_quant.cpp) and the
// sparse ATTEND (tb_sparse.cpp); each returns its number of sets.
int run_quant(int& passed, int& failed);
int run_sparse(int& passed, int& failed);

#endif
