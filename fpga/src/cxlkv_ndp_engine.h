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

/* ATTEND: the partials of g queries ([g][dim] f32, copied), scores scaled by `scale` before exp.
 * NULL if g or dim is out of range or allocation fails. */
struct cxlkv_hls_attend;
struct cxlkv_hls_attend* cxlkv_hls_attend_new(uint32_t g, const float* queries, uint32_t dim,
                                              float scale);
void cxlkv_hls_attend_free(struct cxlkv_hls_attend* s);
/* One block (rows keys and rows values of dtype, as 16-bit words): its partials (tiles of 64 rows,
 * as the reference's attend_block), merged into the command's. 0 on success, -1 on a bad dtype. */
int cxlkv_hls_attend_block(struct cxlkv_hls_attend* s, const uint16_t* keys,
                           const uint16_t* values, uint32_t rows, uint8_t dtype);
/* The partials: out [g][dim], max [g], sum [g]. */
void cxlkv_hls_attend_finish(const struct cxlkv_hls_attend* s, float* out, float* max,
                             float* sum);

/* Selected SCORE_TOPK (the ABI's struct cxlkv_ndp_select, copied): g queries, lists of at most k
 * hits (one list if group_max). The control path has checked the selection (options, scale, p,
 * ranges, the window inside the stored tokens). NULL if g, k or dim is out of range or allocation
 * fails. */
struct cxlkv_ndp_select;
struct cxlkv_ndp_list_info;
struct cxlkv_hls_sel;
struct cxlkv_hls_sel* cxlkv_hls_sel_new(uint32_t g, uint32_t k, uint32_t group_max,
                                        const float* queries, uint32_t dim,
                                        const struct cxlkv_ndp_select* sel);
void cxlkv_hls_sel_free(struct cxlkv_hls_sel* s);
/* Scores rows keys as tokens base.. and offers them to the lists (blocks in command order).
 * 0 on success, -1 on a bad dtype. */
int cxlkv_hls_sel_block(struct cxlkv_hls_sel* s, const uint16_t* keys, uint32_t rows,
                        uint32_t base, uint8_t dtype);
/* Writes each list's hits to hits[list * k ..] (best first) and its count and left-out mass to
 * info[list]; returns the list count, or -CXLKV_NDP_DETAIL_TOO_MANY_FORCED (-4) if more tokens
 * were forced than k. */
int cxlkv_hls_sel_finish(struct cxlkv_hls_sel* s, struct cxlkv_ndp_hit* hits,
                         struct cxlkv_ndp_list_info* info);

/* ABI 1.2, quantized blocks (dtype 4 int8, 5 int4): codes with a block's key scales ks[dim] (per
 * channel) and value scales vs[rows] (per token), as docs/FORMAT.md lays them out.
 * The queries folded with key scales: out[g][d] = queries[g][d] * ks[d] (one f32 multiply each):
 * the score of a quantized key is the canonical dot product of the folded query with its codes. */
void cxlkv_hls_fold(const float* queries, uint32_t g, uint32_t dim, const float* ks, float* out);
/* cxlkv_hls_scan_block for a quantized block: its rows scored with the scan's queries folded by
 * ks. 0 on success, -1 if dtype is not 4 or 5. */
int cxlkv_hls_scan_block_q(struct cxlkv_hls_scan* s, const uint16_t* keys, uint32_t rows,
                           uint32_t base, uint8_t dtype, const float* ks);
/* cxlkv_hls_sel_block for a quantized block (queries folded by ks). 0, or -1 on a bad dtype. */
int cxlkv_hls_sel_block_q(struct cxlkv_hls_sel* s, const uint16_t* keys, uint32_t rows,
                          uint32_t base, uint8_t dtype, const float* ks);
/* cxlkv_hls_attend_block for a quantized block: queries folded by ks, each value row weighted by
 * w * vs[i] while the sum adds w (attend_block_scaled). 0, or -1 on a bad dtype. */
int cxlkv_hls_attend_block_q(struct cxlkv_hls_attend* s, const uint16_t* keys,
                             const uint16_t* values, uint32_t rows, uint8_t dtype,
                             const float* ks, const float* vs);
/* A quantized row dequantized for GATHER and GATHER_V: dst[d] = code[d] * scale (f32). 0, or -1
 * on a bad dtype. */
int cxlkv_hls_dequant_row(const uint16_t* src, uint32_t dim, uint8_t dtype, float scale,
                          float* dst);

/* ABI 1.2, sparse ATTEND (ATTEND with FLAG_SELECT; f16, bf16, f32 blocks): g queries, at most k
 * hits per query's list, the selection sel (checked by the control path, sel->scale == scale).
 *   1. cxlkv_hls_sparse_block for every block in command order (the per-query selection scan);
 *   2. cxlkv_hls_sparse_union: the union U of the g lists, ascending tokens;
 *   3. cxlkv_hls_sparse_rows once with U's key rows and value rows gathered in that order
 *      (|U| rows each, contiguous): the partial over them as one block (tiles of 64 rows);
 *   4. cxlkv_hls_sparse_finish: the partials and per query (|U|, left-out mass).
 * NULL if g, k or dim is out of range or allocation fails. */
struct cxlkv_hls_sparse;
struct cxlkv_hls_sparse* cxlkv_hls_sparse_new(uint32_t g, uint32_t k, const float* queries,
                                              uint32_t dim, float scale,
                                              const struct cxlkv_ndp_select* sel);
void cxlkv_hls_sparse_free(struct cxlkv_hls_sparse* s);
/* Scores rows keys as tokens base.. and offers them to the g lists. 0, or -1 on a bad dtype. */
int cxlkv_hls_sparse_block(struct cxlkv_hls_sparse* s, const uint16_t* keys, uint32_t rows,
                           uint32_t base, uint8_t dtype);
/* Writes U (ascending, each token once) to tokens (room for g * k) and returns |U|, or
 * -CXLKV_NDP_DETAIL_TOO_MANY_FORCED (-4) if a list forced more tokens than k. */
int cxlkv_hls_sparse_union(struct cxlkv_hls_sparse* s, uint32_t* tokens);
/* The partial over U's gathered rows (rows = |U| of each, in U's order). 0, or -1 on a bad dtype
 * or a row count other than |U|, or before cxlkv_hls_sparse_union. */
int cxlkv_hls_sparse_rows(struct cxlkv_hls_sparse* s, const uint16_t* keys,
                          const uint16_t* values, uint32_t rows, uint8_t dtype);
/* The partials (out [g][dim], max [g], sum [g]) and info [g] = (|U|, the softmax mass of each
 * query over every stored token outside exclude that U leaves out). */
void cxlkv_hls_sparse_finish(const struct cxlkv_hls_sparse* s, float* out, float* max,
                             float* sum, struct cxlkv_ndp_list_info* info);

#ifdef __cplusplus
}
#endif

#endif
