// The emulator's engine: the HLS kernel's templates with the device ABI's limits, behind a C ABI.
#include "cxlkv_ndp_engine.h"

#include <new>

#include "cxlkv_ndp_kernel.h"

using namespace cxlkv_hls;

namespace {
constexpr int EKMAX = CXLKV_NDP_MAX_K;
constexpr int EGMAX = CXLKV_NDP_MAX_GROUP;
constexpr int EDMAX = CXLKV_NDP_MAX_DIM;
}  // namespace

struct cxlkv_hls_scan {
    uint32_t g, k, dim;
    bool group_max;
    float q[EGMAX][EDMAX];
    uint32_t count[EGMAX];
    Hit lists[EGMAX][EKMAX];
};

extern "C" cxlkv_hls_scan* cxlkv_hls_scan_new(uint32_t g, uint32_t k, uint32_t group_max,
                                              const float* queries, uint32_t dim) {
    if (g == 0 || g > uint32_t(EGMAX) || k == 0 || k > uint32_t(EKMAX) || dim < 16 ||
        dim > uint32_t(EDMAX) || dim % LANES != 0 || queries == nullptr)
        return nullptr;
    cxlkv_hls_scan* s = new (std::nothrow) cxlkv_hls_scan;
    if (s == nullptr) return nullptr;
    s->g = g;
    s->k = k;
    s->dim = dim;
    s->group_max = group_max != 0;
    for (uint32_t qi = 0; qi < uint32_t(EGMAX); ++qi) {
        s->count[qi] = 0;
        for (uint32_t d = 0; d < uint32_t(EDMAX); ++d)
            s->q[qi][d] = (qi < g && d < dim) ? queries[qi * dim + d] : 0.0f;
    }
    return s;
}

extern "C" void cxlkv_hls_scan_free(cxlkv_hls_scan* s) { delete s; }

extern "C" int cxlkv_hls_scan_block(cxlkv_hls_scan* s, const uint16_t* keys, uint32_t rows,
                                    uint32_t base, uint8_t dtype) {
    if (dtype < CXLKV_HLS_DTYPE_F16 || dtype > CXLKV_HLS_DTYPE_F32) return -1;
    scan_block<EGMAX, EDMAX, EKMAX>(keys, rows, base, s->dim, dtype, s->q, s->g, s->k,
                                    s->group_max, s->lists, s->count);
    return 0;
}

extern "C" int cxlkv_hls_kth(const cxlkv_hls_scan* s, uint32_t list, float* score) {
    uint32_t lists = s->group_max ? 1 : s->g;
    if (list >= lists || s->count[list] < s->k) return 0;
    *score = s->lists[list][s->k - 1].score;
    return 1;
}

extern "C" uint32_t cxlkv_hls_scan_finish(const cxlkv_hls_scan* s, uint32_t per_list,
                                          cxlkv_ndp_hit* out) {
    uint32_t lists = s->group_max ? 1 : s->g;
    for (uint32_t l = 0; l < lists; ++l) {
        uint32_t n = per_list < s->count[l] ? per_list : s->count[l];
        for (uint32_t i = 0; i < n; ++i) {
            out[l * per_list + i].token = s->lists[l][i].index;
            out[l * per_list + i].score = s->lists[l][i].score;
        }
    }
    return lists;
}

extern "C" void cxlkv_hls_copy_row(const uint16_t* src, uint32_t words, uint16_t* dst) {
    for (uint32_t w = 0; w < words; ++w) dst[w] = src[w];
}
