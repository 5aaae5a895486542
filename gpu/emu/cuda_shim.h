// Just enough of CUDA to run gpu/kernels/attention.cu on the host: each thread of a block is an OS
// thread, blocks run one after another (so `__shared__` arrays can be function statics), warps
// exchange values through a per-warp slot array between two barriers, `__syncthreads` is a
// block-wide barrier. Loads are plain loads, `__expf` is `expf`. For tests of the kernels'
// indexing and arithmetic (gpu/tests/emulated.rs), not of their speed or memory model.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define CXLKV_EMULATE 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
struct uint2 {
    unsigned int x, y;
};
struct uint4 {
    unsigned int x, y, z, w;
};

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 gridDim, blockDim;

namespace emu {
inline std::barrier<> *block_barrier;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline float warp_slots[32][32];
}  // namespace emu

template <class T> inline T __ldg(const T *p) { return *p; }
template <class T> inline T __ldcs(const T *p) { return *p; }
inline float __expf(float x) { return std::exp(x); }
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned int, float x, int o) {
    const unsigned int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    emu::warp_slots[warp][lane] = x;
    emu::warp_barriers[warp]->arrive_and_wait();
    const float y = emu::warp_slots[warp][lane ^ o];
    emu::warp_barriers[warp]->arrive_and_wait();
    return y;
}
inline unsigned int atomicXor(unsigned int *p, unsigned int v) {
    return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED);
}

// IEEE half to float, exact (subnormals, infinities and NaN included).
inline float cxlkv_emu_h2f(unsigned short h) {
    const unsigned int sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    unsigned int bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        int e = 113;
        unsigned int m = man;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        bits = sign | (unsigned int)(e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Runs `kernel` over `grid` blocks of `block.x` threads (block.x a multiple of 32, at most 1024).
template <class F> void emu_launch(dim3 grid, dim3 block, F kernel) {
    gridDim = grid;
    blockDim = block;
    for (unsigned int by = 0; by < grid.y; by++) {
        for (unsigned int bx = 0; bx < grid.x; bx++) {
            std::barrier<> whole(block.x);
            emu::block_barrier = &whole;
            emu::warp_barriers.clear();
            for (unsigned int w = 0; w < (block.x + 31) / 32; w++)
                emu::warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
            std::vector<std::thread> threads;
            for (unsigned int t = 0; t < block.x; t++) {
                threads.emplace_back([=] {
                    threadIdx = dim3{t, 0, 0};
                    blockIdx = dim3{bx, by, 0};
                    kernel();
                });
            }
            for (auto &th : threads) th.join();
        }
    }
}
