// Runs one attention pass of gpu/kernels/attention.cu on the host (cuda_shim.h), as
// cxlkv_gpu::Pass::launch does on a GPU: an attend kernel (dense/pull, or gather) over
// `chunks × heads` blocks, then cxlkv_merge with the optional device partials.
//
//   run IN OUT
// IN: u32 kind (0 = every row, 1 = gather, 2 = every row merged with device partials),
//     u32 dtype (0 = f16, 1 = f32), heads, rows, dim, g, chunks, n_sel, count_b; f32 scale;
//     K and V (heads × rows × dim elements each); queries (heads × g × dim f32);
//     the selection (heads × n_sel u32); the device partials (heads × count_b × g × (dim + 2) f32).
// OUT: heads × g partials of dim + 2 f32 (out, max, sum).
#include "cuda_shim.h"
#include "../kernels/attention.cu"
#include <cstdio>
#include <cstdlib>

static std::vector<char> read_all(const char *path) {
    FILE *f = std::fopen(path, "rb");
    if (!f) {
        std::perror(path);
        std::exit(2);
    }
    std::vector<char> b;
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) b.insert(b.end(), buf, buf + n);
    std::fclose(f);
    return b;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: run IN OUT\n");
        return 2;
    }
    const std::vector<char> in = read_all(argv[1]);
    size_t at = 0;
    auto take = [&](size_t bytes) {
        if (at + bytes > in.size()) {
            std::fprintf(stderr, "input too short\n");
            std::exit(2);
        }
        const char *p = in.data() + at;
        at += bytes;
        return p;
    };
    unsigned int h[9];
    std::memcpy(h, take(sizeof h), sizeof h);
    const unsigned int kind = h[0], dtype = h[1], heads = h[2], rows = h[3], dim = h[4], g = h[5],
                       chunks = h[6], n_sel = h[7], count_b = h[8];
    float scale;
    std::memcpy(&scale, take(4), 4);
    const size_t elem = dtype == 0 ? 2 : 4, kv = (size_t)heads * rows * dim * elem;
    // 16-byte aligned copies, as device allocations and registered rows are.
    std::vector<float4> k(kv / 16 + 1), v(kv / 16 + 1);
    std::memcpy(k.data(), take(kv), kv);
    std::memcpy(v.data(), take(kv), kv);
    std::vector<float> q((size_t)heads * g * dim);
    std::memcpy(q.data(), take(q.size() * 4), q.size() * 4);
    std::vector<unsigned int> sel((size_t)heads * n_sel);
    std::memcpy(sel.data(), take(sel.size() * 4), sel.size() * 4);
    const size_t w = (size_t)g * (dim + 2);
    std::vector<float> b((size_t)heads * count_b * w);
    std::memcpy(b.data(), take(b.size() * 4), b.size() * 4);

    const unsigned int n = kind == 1 ? n_sel : rows;
    const unsigned int chunk = (n + chunks - 1) / chunks;
    const unsigned long long stride = (unsigned long long)rows * dim;
    std::vector<float> parts((size_t)heads * chunks * w), out((size_t)heads * w);
    const void *kp = k.data(), *vp = v.data();
    const dim3 grid{chunks, heads, 1}, block{128, 1, 1};
    if (kind == 1) {
        if (dtype == 0)
            emu_launch(grid, block, [&] {
                cxlkv_gather_f16((const f16_bits *)kp, (const f16_bits *)vp, stride, sel.data(), n,
                                 dim, g, q.data(), scale, chunk, parts.data());
            });
        else
            emu_launch(grid, block, [&] {
                cxlkv_gather_f32((const float *)kp, (const float *)vp, stride, sel.data(), n, dim,
                                 g, q.data(), scale, chunk, parts.data());
            });
    } else {
        if (dtype == 0)
            emu_launch(grid, block, [&] {
                cxlkv_pull_f16((const f16_bits *)kp, (const f16_bits *)vp, stride, n, dim, g,
                               q.data(), scale, chunk, parts.data());
            });
        else
            emu_launch(grid, block, [&] {
                cxlkv_dense_f32((const float *)kp, (const float *)vp, stride, n, dim, g, q.data(),
                                scale, chunk, parts.data());
            });
    }
    emu_launch(dim3{g, heads, 1}, dim3{dim < 128 ? dim : 128, 1, 1}, [&] {
        cxlkv_merge(parts.data(), chunks, kind == 2 ? b.data() : nullptr, kind == 2 ? count_b : 0,
                    dim, g, out.data());
    });
    FILE *f = std::fopen(argv[2], "wb");
    if (!f || std::fwrite(out.data(), 4, out.size(), f) != out.size() || std::fclose(f) != 0) {
        std::perror(argv[2]);
        return 2;
    }
    return 0;
}
