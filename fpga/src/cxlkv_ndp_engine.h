/* C ABI of the HLS kernel built as a host library: the device emulator's compute engine
 * (cxlkv-ndpd --engine hls). The functions run the same templates as the HLS top function
 * (cxlkv_ndp_kernel.h), instantiated with the device ABI's limits: k <= 4096, G <= 16, d <= 256. */
#ifndef CXLKV_NDP_ENGINE_H
#define CXLKV_NDP_ENGINE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cxlkv_hls_scan;
struct cxlkv_ndp_hit;

/* A scan of g queries ([g][dim] f32, copied) for the k best per list (one list if group_max).
 * NULL if g, k or dim is out of range or allocation fails. */
struct cxlkv_hls_scan* cxlkv_hls_scan_new(uint32_t g, uint32_t k, uint32_t group_max,
                                          const float* queries, uint32_t dim);
void cxlkv_hls_scan_free(struct cxlkv_hls_scan* s);
/* Scores rows of keys (rows * dim elements of dtype 1 f16, 2 bf16, 3 f32, as 16-bit words) as
 * tokens base.. and offers them to the lists. 0 on success, -1 on a bad dtype. */
int cxlkv_hls_scan_block(struct cxlkv_hls_scan* s, const uint16_t* keys, uint32_t rows,
                         uint32_t base, uint8_t dtype);
/* 1 if a block with per-query bounds ub[g] can be skipped, else 0. */
int cxlkv_hls_can_skip(const struct cxlkv_hls_scan* s, const float* ub);
/* Writes the lists' first per_list hits ([lists][per_list], best first); returns the list count. */
uint32_t cxlkv_hls_scan_finish(const struct cxlkv_hls_scan* s, uint32_t per_list,
                               struct cxlkv_ndp_hit* out);
/* The bound of kernels/src/bounds.rs. */
float cxlkv_hls_upper_bound(const float* q, const float* lo, const float* hi, uint32_t dim);
/* Visiting order of a pruned scan (group bound best[b], highest first, ties by position). */
void cxlkv_hls_visit_order(const float* best, uint32_t n, uint32_t* order);
/* GATHER's row copy: words 16-bit words from src to dst. */
void cxlkv_hls_copy_row(const uint16_t* src, uint32_t words, uint16_t* dst);

#ifdef __cplusplus
}
#endif

#endif
