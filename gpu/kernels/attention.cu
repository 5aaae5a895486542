// cxlkv's GPU attention kernels, compiled by NVRTC at run time (gpu/src/kernels.rs lists the entry
// points; gpu/tests/ptx.rs compiles every one of them on a machine without a GPU).
//
// Every kernel computes what the CPU ATTEND computes (cxlkv_kernels::Partial, kernels/src/partial.rs):
// for the G queries of one GQA group and keys i, with scaled scores s_i = scale * q.k_i,
//     m = max s_i,   l = sum exp(s_i - m),   o = sum exp(s_i - m) * v_i      (o unnormalized),
// and partials over disjoint key sets merge by the log-sum-exp rule:
//     m = max(m1, m2),   l = l1 e^(m1-m) + l2 e^(m2-m),   o = o1 e^(m1-m) + o2 e^(m2-m).
//
// Layout: K and V of one KV head are `n` rows of `d` elements (f16 or f32), row-major, row i at
// element offset i * d; the KV heads of a layer follow each other `head_stride` elements apart.
// Queries: g * d f32 per KV head, heads one after the other. A partial is d + 2 floats:
// o[0..d], m, l.
//
// Grid: x = chunks of rows, y = KV heads. The work is split over the rows ("split-K", as
// flash-decoding does): block (b, h) takes rows [b * chunk, (b + 1) * chunk) of head h; each of
// its warps folds every WARPS-th row into an online partial per query, the warps' partials merge
// in shared memory and the block writes one partial per query to
// `parts[((h * chunks + b) * g + j) * (d + 2)]`. `cxlkv_merge` folds lists of partials into one per
// query and head: the block partials of one pass, and the near-data device's partials with the
// GPU's own.
//
//  - cxlkv_dense_*:  K/V in GPU memory (the reference);
//  - cxlkv_pull_*:   K/V read in place from registered host memory over the link (streaming loads:
//                    each byte is read once, keep it out of L1/L2);
//  - cxlkv_gather_*: only the rows that `rows` names (indices into the same K/V), read in place
//                    from registered host memory;
//  - cxlkv_merge:    partials merged per query;
//  - cxlkv_stream:   a plain streaming read of registered memory (the link's bandwidth for kernels).
//
// Limits (checked by the host code before a launch): d <= MAX_D and d a multiple of 32, g <= MAX_G.
//
// The same source also compiles as C++ on the host under gpu/emu/cuda_shim.h (CXLKV_EMULATE), which
// runs each block's threads as OS threads: gpu/tests/emulated.rs checks the kernels' indexing,
// loads and merges against the CPU ATTEND without a GPU.

#define MAX_D 128
#define MAX_G 8
#define PER_LANE (MAX_D / 32)
#define WARPS 4
#define NEG_INF (-__int_as_float(0x7f800000))

typedef unsigned short f16_bits;

__device__ __forceinline__ float h2f(unsigned short b) {
#ifdef CXLKV_EMULATE
    return cxlkv_emu_h2f(b);  // gpu/emu/cuda_shim.h: the same exact conversion on the host
#else
    // f16 -> f32 without cuda_fp16.h (NVRTC has no system headers): the PTX conversion, exact.
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
    return f;
#endif
}

__device__ __forceinline__ float load_elem(const float *p, bool stream) {
    return stream ? __ldcs(p) : __ldg(p);
}

__device__ __forceinline__ float load_elem(const f16_bits *p, bool stream) {
    return h2f(stream ? __ldcs(p) : __ldg(p));
}

// A lane's slice of a row: `per_lane` consecutive elements at `p` into x[0..per_lane), zeros
// after. Two or four elements are one vector load (8 or 16 bytes for f32, 4 or 8 for f16), so a
// warp reads a whole row in one request of up to 512 bytes: over the link, large reads are what
// keep PCIe's per-request overhead small. `p` is aligned to the slice (rows start at multiples of
// 64 bytes of a 16-byte-aligned base; the host checks the base).
__device__ __forceinline__ void load_slice(const float *p, int per_lane, bool stream, float *x) {
    if (per_lane == 4) {
        float4 u = stream ? __ldcs((const float4 *)p) : __ldg((const float4 *)p);
        x[0] = u.x;
        x[1] = u.y;
        x[2] = u.z;
        x[3] = u.w;
    } else if (per_lane == 2) {
        float2 u = stream ? __ldcs((const float2 *)p) : __ldg((const float2 *)p);
        x[0] = u.x;
        x[1] = u.y;
        x[2] = x[3] = 0.0f;
    } else {
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) x[e] = e < per_lane ? load_elem(p + e, stream) : 0.0f;
    }
}

__device__ __forceinline__ void load_slice(const f16_bits *p, int per_lane, bool stream,
                                           float *x) {
    if (per_lane == 4) {
        uint2 u = stream ? __ldcs((const uint2 *)p) : __ldg((const uint2 *)p);
        x[0] = h2f((unsigned short)(u.x & 0xffffu));
        x[1] = h2f((unsigned short)(u.x >> 16));
        x[2] = h2f((unsigned short)(u.y & 0xffffu));
        x[3] = h2f((unsigned short)(u.y >> 16));
    } else if (per_lane == 2) {
        unsigned int u =
            stream ? __ldcs((const unsigned int *)p) : __ldg((const unsigned int *)p);
        x[0] = h2f((unsigned short)(u & 0xffffu));
        x[1] = h2f((unsigned short)(u >> 16));
        x[2] = x[3] = 0.0f;
    } else {
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) x[e] = e < per_lane ? load_elem(p + e, stream) : 0.0f;
    }
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Folds weight-scaled row `v` into the running partial (m, l, acc) of one query, with score s.
__device__ __forceinline__ void fold(float s, const float *v, int per_lane, float &m, float &l,
                                     float *acc) {
    if (s > m) {
        float c = __expf(m - s);  // exp(-inf) = 0 on the first row
        l *= c;
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) acc[e] *= c;
        m = s;
    }
    float w = __expf(s - m);
    l += w;
#pragma unroll
    for (int e = 0; e < PER_LANE; e++)
        if (e < per_lane) acc[e] += w * v[e];
}

// Merges partial (m2, l2, o2) into (m, l, o) by the log-sum-exp rule (Partial::merge).
__device__ __forceinline__ void merge_into(float &m, float &l, float &o, float m2, float l2,
                                           float o2) {
    if (l2 == 0.0f) return;
    if (l == 0.0f) {
        m = m2;
        l = l2;
        o = o2;
        return;
    }
    float mm = fmaxf(m, m2);
    float a = __expf(m - mm), b = __expf(m2 - mm);
    o = o * a + o2 * b;
    l = l * a + l2 * b;
    m = mm;
}

template <typename T>
__device__ void attend_chunk(const T *__restrict__ k, const T *__restrict__ v,
                             unsigned long long head_stride, const unsigned int *__restrict__ rows,
                             unsigned int n, unsigned int d, unsigned int g,
                             const float *__restrict__ q, float scale, unsigned int chunk,
                             float *__restrict__ parts, bool stream) {
    const unsigned int h = blockIdx.y;
    k += h * head_stride;
    v += h * head_stride;
    q += (unsigned long long)h * g * d;
    if (rows) rows += (unsigned long long)h * n;
    parts += (unsigned long long)h * gridDim.x * g * (d + 2);
    __shared__ float sh_o[WARPS][MAX_G][MAX_D];
    __shared__ float sh_ml[WARPS][MAX_G][2];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per_lane = d / 32;
    float qr[MAX_G][PER_LANE];
    float acc[MAX_G][PER_LANE];
    float m[MAX_G], l[MAX_G];
#pragma unroll
    for (int j = 0; j < MAX_G; j++) {
        m[j] = NEG_INF;
        l[j] = 0.0f;
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) {
            acc[j][e] = 0.0f;
            qr[j][e] = (j < (int)g && e < per_lane) ? q[j * d + lane * per_lane + e] : 0.0f;
        }
    }
    const unsigned long long r0 = (unsigned long long)blockIdx.x * chunk;
    unsigned long long r1 = r0 + chunk;
    if (r1 > n) r1 = n;
    for (unsigned long long i = r0 + warp; i < r1; i += WARPS) {
        const unsigned long long row = rows ? rows[i] : i;
        // Lane l holds elements [l * per_lane, (l + 1) * per_lane) of the row.
        float kx[PER_LANE], vx[PER_LANE];
        load_slice(k + row * d + lane * per_lane, per_lane, stream, kx);
        load_slice(v + row * d + lane * per_lane, per_lane, stream, vx);
#pragma unroll
        for (int j = 0; j < MAX_G; j++) {
            if (j < (int)g) {
                float p = 0.0f;
#pragma unroll
                for (int e = 0; e < PER_LANE; e++) p += qr[j][e] * kx[e];
                float s = scale * warp_sum(p);
                fold(s, vx, per_lane, m[j], l[j], acc[j]);
            }
        }
    }
    // The warps' partials into shared memory, then warp 0 merges them and writes the block's.
#pragma unroll
    for (int j = 0; j < MAX_G; j++) {
        if (j < (int)g) {
#pragma unroll
            for (int e = 0; e < PER_LANE; e++)
                if (e < per_lane) sh_o[warp][j][lane * per_lane + e] = acc[j][e];
            if (lane == 0) {
                sh_ml[warp][j][0] = m[j];
                sh_ml[warp][j][1] = l[j];
            }
        }
    }
    __syncthreads();
    if (warp != 0) return;
    for (unsigned int j = 0; j < g; j++) {
        float *dst = parts + ((unsigned long long)blockIdx.x * g + j) * (d + 2);
        for (unsigned int c = lane; c < d; c += 32) {
            float mm = NEG_INF, ll = 0.0f, oo = 0.0f;
            for (int w = 0; w < WARPS; w++)
                merge_into(mm, ll, oo, sh_ml[w][j][0], sh_ml[w][j][1], sh_o[w][j][c]);
            dst[c] = oo;
            if (c == 0) {
                dst[d] = mm;
                dst[d + 1] = ll;
            }
        }
    }
}

extern "C" __global__ void cxlkv_dense_f16(const f16_bits *k, const f16_bits *v,
        unsigned long long head_stride, unsigned int n, unsigned int d, unsigned int g,
        const float *q, float scale, unsigned int chunk, float *parts) {
    attend_chunk(k, v, head_stride, (const unsigned int *)0, n, d, g, q, scale, chunk, parts,
                 false);
}

extern "C" __global__ void cxlkv_dense_f32(const float *k, const float *v,
        unsigned long long head_stride, unsigned int n, unsigned int d, unsigned int g,
        const float *q, float scale, unsigned int chunk, float *parts) {
    attend_chunk(k, v, head_stride, (const unsigned int *)0, n, d, g, q, scale, chunk, parts,
                 false);
}

extern "C" __global__ void cxlkv_pull_f16(const f16_bits *k, const f16_bits *v,
        unsigned long long head_stride, unsigned int n, unsigned int d, unsigned int g,
        const float *q, float scale, unsigned int chunk, float *parts) {
    attend_chunk(k, v, head_stride, (const unsigned int *)0, n, d, g, q, scale, chunk, parts,
                 true);
}

extern "C" __global__ void cxlkv_pull_f32(const float *k, const float *v,
        unsigned long long head_stride, unsigned int n, unsigned int d, unsigned int g,
        const float *q, float scale, unsigned int chunk, float *parts) {
    attend_chunk(k, v, head_stride, (const unsigned int *)0, n, d, g, q, scale, chunk, parts,
                 true);
}

// `n` is the number of selected rows per head; `rows[h * n .. (h + 1) * n]` index head h's K/V
// rows (the host checks them).
extern "C" __global__ void cxlkv_gather_f16(const f16_bits *k, const f16_bits *v,
        unsigned long long head_stride, const unsigned int *rows, unsigned int n, unsigned int d,
        unsigned int g, const float *q, float scale, unsigned int chunk, float *parts) {
    attend_chunk(k, v, head_stride, rows, n, d, g, q, scale, chunk, parts, true);
}

extern "C" __global__ void cxlkv_gather_f32(const float *k, const float *v,
        unsigned long long head_stride, const unsigned int *rows, unsigned int n, unsigned int d,
        unsigned int g, const float *q, float scale, unsigned int chunk, float *parts) {
    attend_chunk(k, v, head_stride, rows, n, d, g, q, scale, chunk, parts, true);
}

// Folds, per KV head h (grid y) and query j (grid x), the `count_a` partials of `a` and the
// `count_b` partials of `b` (each list laid out [head][partial][query][d + 2]; `b` may be null with
// count_b = 0) into `out[(h * g + j) * (d + 2)]`. Threads run over the d columns; m and l are
// merged by every thread the same way, so each column's weights are the same.
extern "C" __global__ void cxlkv_merge(const float *a, unsigned int count_a, const float *b,
                                       unsigned int count_b, unsigned int d, unsigned int g,
                                       float *out) {
    const unsigned int j = blockIdx.x, h = blockIdx.y;
    if (j >= g) return;
    const unsigned long long w = (unsigned long long)g * (d + 2);
    const float *pa = a + h * count_a * w + (unsigned long long)j * (d + 2);
    const float *pb = b ? b + h * count_b * w + (unsigned long long)j * (d + 2) : (const float *)0;
    float *dst = out + (h * (unsigned long long)g + j) * (d + 2);
    for (unsigned int c = threadIdx.x; c < d; c += blockDim.x) {
        float m = NEG_INF, l = 0.0f, o = 0.0f;
        for (unsigned int p = 0; p < count_a; p++)
            merge_into(m, l, o, pa[p * w + d], pa[p * w + d + 1], pa[p * w + c]);
        for (unsigned int p = 0; p < count_b; p++)
            merge_into(m, l, o, pb[p * w + d], pb[p * w + d + 1], pb[p * w + c]);
        dst[c] = o;
        if (c == 0) {
            dst[d] = m;
            dst[d + 1] = l;
        }
    }
}

// Reads `n` 16-byte words with streaming loads, a grid-stride loop; one sum per block so that the
// loads cannot be dropped.
extern "C" __global__ void cxlkv_stream(const uint4 *p, unsigned long long n,
                                        unsigned int *sums) {
    unsigned int s = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        uint4 x = __ldcs(p + i);
        s ^= x.x ^ x.y ^ x.z ^ x.w;
    }
    atomicXor(sums + blockIdx.x, s);
}
