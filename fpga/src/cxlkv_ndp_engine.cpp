// The emulator's engine: the HLS kernel's templates with the device ABI's limits, behind a C ABI.
#include "cxlkv_ndp_engine.h"

#include <new>

#include "cxlkv_ndp_attend.h"
#include "cxlkv_ndp_kernel.h"
#include "cxlkv_ndp_select.h"
#include "cxlkv_ndp_sparse.h"

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
    float qf[EGMAX][EDMAX]; // a quantized block's folded queries
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

struct cxlkv_hls_attend {
    uint32_t g, dim;
    float scale;
    float q[EGMAX][EDMAX];
    float qf[EGMAX][EDMAX]; // a quantized block's folded queries
    Partials<EGMAX, EDMAX> acc, blk;
    float sbuf[ATTEND_TILE][EGMAX]; // a tile's scaled scores
};

namespace {
bool shape_ok(uint32_t g, uint32_t dim, const float* queries) {
    return g != 0 && g <= uint32_t(EGMAX) && dim >= 16 && dim <= uint32_t(EDMAX) &&
           dim % LANES == 0 && queries != nullptr;
}

void load_queries(float q[EGMAX][EDMAX], uint32_t g, uint32_t dim, const float* queries) {
    for (uint32_t qi = 0; qi < uint32_t(EGMAX); ++qi)
        for (uint32_t d = 0; d < uint32_t(EDMAX); ++d)
            q[qi][d] = (qi < g && d < dim) ? queries[qi * dim + d] : 0.0f;
}
}  // namespace

extern "C" cxlkv_hls_attend* cxlkv_hls_attend_new(uint32_t g, const float* queries, uint32_t dim,
                                                  float scale) {
    if (!shape_ok(g, dim, queries)) return nullptr;
    cxlkv_hls_attend* s = new (std::nothrow) cxlkv_hls_attend;
    if (s == nullptr) return nullptr;
    s->g = g;
    s->dim = dim;
    s->scale = scale;
    load_queries(s->q, g, dim, queries);
    partials_clear<EGMAX, EDMAX>(s->acc);
    return s;
}

extern "C" void cxlkv_hls_attend_free(cxlkv_hls_attend* s) { delete s; }

extern "C" int cxlkv_hls_attend_block(cxlkv_hls_attend* s, const uint16_t* keys,
                                      const uint16_t* values, uint32_t rows, uint8_t dtype) {
    if (dtype < CXLKV_HLS_DTYPE_F16 || dtype > CXLKV_HLS_DTYPE_F32) return -1;
    attend_block<EGMAX, EDMAX>(keys, values, nullptr, rows, s->dim, row_words(dtype, s->dim),
                               dtype, s->q, s->g, s->scale, s->sbuf, s->blk, s->acc);
    return 0;
}

extern "C" void cxlkv_hls_attend_finish(const cxlkv_hls_attend* s, float* out, float* max,
                                        float* sum) {
    for (uint32_t qi = 0; qi < s->g; ++qi) {
        for (uint32_t d = 0; d < s->dim; ++d) out[qi * s->dim + d] = s->acc.out[qi][d];
        max[qi] = s->acc.max[qi];
        sum[qi] = s->acc.sum[qi];
    }
}

struct cxlkv_hls_sel {
    uint32_t g, k, dim;
    bool group_max;
    cxlkv_ndp_select p;
    float q[EGMAX][EDMAX];
    float qf[EGMAX][EDMAX]; // a quantized block's folded queries
    SelList<EKMAX> lists[EGMAX];
    Hit chosen[EKMAX];
};

extern "C" cxlkv_hls_sel* cxlkv_hls_sel_new(uint32_t g, uint32_t k, uint32_t group_max,
                                            const float* queries, uint32_t dim,
                                            const cxlkv_ndp_select* sel) {
    if (!shape_ok(g, dim, queries) || k == 0 || k > uint32_t(EKMAX) || sel == nullptr)
        return nullptr;
    cxlkv_hls_sel* s = new (std::nothrow) cxlkv_hls_sel;
    if (s == nullptr) return nullptr;
    s->g = g;
    s->k = k;
    s->dim = dim;
    s->group_max = group_max != 0;
    s->p = *sel;
    load_queries(s->q, g, dim, queries);
    for (int l = 0; l < EGMAX; ++l) sel_clear<EKMAX>(s->lists[l]);
    return s;
}

extern "C" void cxlkv_hls_sel_free(cxlkv_hls_sel* s) { delete s; }

extern "C" int cxlkv_hls_sel_block(cxlkv_hls_sel* s, const uint16_t* keys, uint32_t rows,
                                   uint32_t base, uint8_t dtype) {
    if (dtype < CXLKV_HLS_DTYPE_F16 || dtype > CXLKV_HLS_DTYPE_F32) return -1;
    select_block<EGMAX, EDMAX, EKMAX>(keys, rows, base, s->dim, dtype, s->q, s->g, s->k,
                                      s->group_max, s->p, s->lists);
    return 0;
}

extern "C" int cxlkv_hls_sel_finish(cxlkv_hls_sel* s, cxlkv_ndp_hit* hits,
                                    cxlkv_ndp_list_info* info) {
    const uint32_t lists = s->group_max ? 1 : s->g;
    Hit* chosen = s->chosen; // the finish pass's sorting network
    for (uint32_t l = 0; l < lists; ++l) {
        float left = 0.0f;
        int n = sel_finish<EKMAX>(s->lists[l], s->p, s->k, chosen, &left);
        if (n < 0) return -int(CXLKV_NDP_DETAIL_TOO_MANY_FORCED);
        info[l].count = uint32_t(n);
        info[l].left_out_mass = left;
        for (int i = 0; i < n; ++i) {
            hits[size_t(l) * s->k + i].token = chosen[i].index;
            hits[size_t(l) * s->k + i].score = chosen[i].score;
        }
    }
    return int(lists);
}

// ABI 1.2: quantized blocks.

extern "C" void cxlkv_hls_fold(const float* queries, uint32_t g, uint32_t dim, const float* ks,
                               float* out) {
    for (uint32_t qi = 0; qi < g; ++qi)
        for (uint32_t d = 0; d < dim; ++d) out[qi * dim + d] = queries[qi * dim + d] * ks[d];
}

extern "C" int cxlkv_hls_scan_block_q(cxlkv_hls_scan* s, const uint16_t* keys, uint32_t rows,
                                      uint32_t base, uint8_t dtype, const float* ks) {
    if (!is_quantized(dtype)) return -1;
    fold_queries<EGMAX, EDMAX>(s->q, ks, s->g, s->dim, s->qf);
    scan_block<EGMAX, EDMAX, EKMAX>(keys, rows, base, s->dim, dtype, s->qf, s->g, s->k, s->group_max,
                                    s->lists, s->count);
    return 0;
}

extern "C" int cxlkv_hls_sel_block_q(cxlkv_hls_sel* s, const uint16_t* keys, uint32_t rows,
                                     uint32_t base, uint8_t dtype, const float* ks) {
    if (!is_quantized(dtype)) return -1;
    fold_queries<EGMAX, EDMAX>(s->q, ks, s->g, s->dim, s->qf);
    select_block<EGMAX, EDMAX, EKMAX>(keys, rows, base, s->dim, dtype, s->qf, s->g, s->k,
                                      s->group_max, s->p, s->lists);
    return 0;
}

extern "C" int cxlkv_hls_attend_block_q(cxlkv_hls_attend* s, const uint16_t* keys,
                                        const uint16_t* values, uint32_t rows, uint8_t dtype,
                                        const float* ks, const float* vs) {
    if (!is_quantized(dtype)) return -1;
    fold_queries<EGMAX, EDMAX>(s->q, ks, s->g, s->dim, s->qf);
    attend_block<EGMAX, EDMAX>(keys, values, vs, rows, s->dim, row_words(dtype, s->dim), dtype,
                               s->qf, s->g, s->scale, s->sbuf, s->blk, s->acc);
    return 0;
}

extern "C" int cxlkv_hls_dequant_row(const uint16_t* src, uint32_t dim, uint8_t dtype,
                                     float scale, float* dst) {
    if (!is_quantized(dtype)) return -1;
    for (uint32_t d = 0; d < dim; ++d)
        dst[d] = (dtype == CXLKV_HLS_DTYPE_I8 ? i8_at(src, d) : i4_at(src, d)) * scale;
    return 0;
}

// ABI 1.2: the sparse ATTEND.

struct cxlkv_hls_sparse {
    uint32_t g, k, dim;
    float scale;
    cxlkv_ndp_select p;
    float q[EGMAX][EDMAX];
    SelList<EKMAX> lists[EGMAX];
    Hit chosen[EKMAX];
    uint32_t u[EGMAX * EKMAX], a[EGMAX * EKMAX], tmp[EGMAX * EKMAX];
    int nu;  // |U| once the union is taken, else -1
    Partials<EGMAX, EDMAX> part;
    float sbuf[ATTEND_TILE][EGMAX];
};

extern "C" cxlkv_hls_sparse* cxlkv_hls_sparse_new(uint32_t g, uint32_t k, const float* queries,
                                                  uint32_t dim, float scale,
                                                  const cxlkv_ndp_select* sel) {
    if (!shape_ok(g, dim, queries) || k == 0 || k > uint32_t(EKMAX) || sel == nullptr)
        return nullptr;
    cxlkv_hls_sparse* s = new (std::nothrow) cxlkv_hls_sparse;
    if (s == nullptr) return nullptr;
    s->g = g;
    s->k = k;
    s->dim = dim;
    s->scale = scale;
    s->p = *sel;
    s->nu = -1;
    load_queries(s->q, g, dim, queries);
    for (int l = 0; l < EGMAX; ++l) sel_clear<EKMAX>(s->lists[l]);
    partials_clear<EGMAX, EDMAX>(s->part);
    return s;
}

extern "C" void cxlkv_hls_sparse_free(cxlkv_hls_sparse* s) { delete s; }

extern "C" int cxlkv_hls_sparse_block(cxlkv_hls_sparse* s, const uint16_t* keys, uint32_t rows,
                                      uint32_t base, uint8_t dtype) {
    if (dtype < CXLKV_HLS_DTYPE_F16 || dtype > CXLKV_HLS_DTYPE_F32) return -1;
    select_block<EGMAX, EDMAX, EKMAX>(keys, rows, base, s->dim, dtype, s->q, s->g, s->k, false,
                                      s->p, s->lists);
    return 0;
}

extern "C" int cxlkv_hls_sparse_union(cxlkv_hls_sparse* s, uint32_t* tokens) {
    const int nu = sparse_union<EKMAX>(s->lists, s->g, s->p, s->k, s->chosen, s->u, s->a, s->tmp);
    if (nu < 0) return -int(CXLKV_NDP_DETAIL_TOO_MANY_FORCED);
    s->nu = nu;
    for (int i = 0; i < nu; ++i) tokens[i] = s->u[i];
    return nu;
}

extern "C" int cxlkv_hls_sparse_rows(cxlkv_hls_sparse* s, const uint16_t* keys,
                                     const uint16_t* values, uint32_t rows, uint8_t dtype) {
    if (dtype < CXLKV_HLS_DTYPE_F16 || dtype > CXLKV_HLS_DTYPE_F32 || s->nu < 0 ||
        rows != uint32_t(s->nu))
        return -1;
    attend_rows<EGMAX, EDMAX>(keys, values, nullptr, rows, s->dim, row_words(dtype, s->dim), dtype,
                              s->q, s->g, s->scale, s->sbuf, s->part);
    return 0;
}

extern "C" void cxlkv_hls_sparse_finish(const cxlkv_hls_sparse* s, float* out, float* max,
                                        float* sum, cxlkv_ndp_list_info* info) {
    const uint32_t nu = s->nu < 0 ? 0 : uint32_t(s->nu);
    for (uint32_t qi = 0; qi < s->g; ++qi) {
        for (uint32_t d = 0; d < s->dim; ++d) out[qi * s->dim + d] = s->part.out[qi][d];
        max[qi] = s->part.max[qi];
        sum[qi] = s->part.sum[qi];
        info[qi].count = nu;
        info[qi].left_out_mass = sparse_left_out<EKMAX>(s->lists[qi], s->part.max[qi], s->part.sum[qi]);
    }
}
