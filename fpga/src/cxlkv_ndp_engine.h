/* C ABI of the HLS kernel built as a host library: the device emulator's compute engine
 * (cxlkv-ndpd --engine hls). The functions run the same templates as the HLS top function
 * (cxlkv_ndp_kernel.h), instantiated with the device ABI's limits: k <= 4096, G <= 16, d <= 256.
 * The emulator visits and skips blocks with the cxlkv-kernels rule (the one the top function's
 * bound, visit_order and can_skip reproduce), reading each list's k-th score from here. */
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
/* 1 and the k-th best score of list `list` in *score once the list holds k hits, else 0 (nothing
 * written): what the emulator's pruning rule (cxlkv-kernels, can_skip) reads. */
int cxlkv_hls_kth(const struct cxlkv_hls_scan* s, uint32_t list, float* score);
/* Writes the lists' first per_list hits ([lists][per_list], best first); returns the list count. */
uint32_t cxlkv_hls_scan_finish(const struct cxlkv_hls_scan* s, uint32_t per_list,
                               struct cxlkv_ndp_hit* out);
/* GATHER's row copy: words 16-bit words from src to dst. */
void cxlkv_hls_copy_row(const uint16_t* src, uint32_t words, uint16_t* dst);

#ifdef __cplusplus
}
#endif

#endif
