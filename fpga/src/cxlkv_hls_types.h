// Selects the HLS type headers: the vendor's (Vitis HLS) when they are on the include path, our
// small compatibility header (fpga/include/hls_compat: hls::stream, the only HLS type the kernel
// uses; plain C++ integers and floats elsewhere) otherwise or when CXLKV_HLS_COMPAT is set.
#ifndef CXLKV_HLS_TYPES_H
#define CXLKV_HLS_TYPES_H

#if !defined(CXLKV_HLS_COMPAT) && defined(__has_include)
#if __has_include(<hls_stream.h>) && __has_include(<hls_math.h>)
#define CXLKV_HLS_VENDOR 1
#endif
#endif

#ifdef CXLKV_HLS_VENDOR
#include <hls_math.h>
#include <hls_stream.h>
#else
#include "../include/hls_compat/hls_stream.h"
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

namespace cxlkv_hls {
// Fused multiply-add (one rounding), as Rust's f32::mul_add. hls::fma with the vendor library.
inline float fused_mul_add(float a, float b, float c) {
#ifdef CXLKV_HLS_VENDOR
    return hls::fma(a, b, c);
#else
    return std::fma(a, b, c);
#endif
}

// f32 exponential. C simulation and the emulator's engine use the C library's expf, the one
// Rust's f32::exp calls on the reference's platform (glibc), so they agree with the Rust reference
// bit for bit. Vitis HLS's hls::exp is not correctly rounded (a few ulp): the synthesized kernel
// meets the ATTEND tolerance of fpga/README.md, not bit-exactness.
// CXLKV_HLS_EXP_ULP=n (C simulation only, `make csim-ulp`): every exp result moves by n ulp, up or
// down by a bit of the result, standing in for a vendor exp that is not correctly rounded, to show
// that the test bench's tolerances hold for such an exp.
#ifdef CXLKV_HLS_EXP_ULP
template <typename F, typename U>
inline F exp_off_by_ulps(F r) {
    if (!(r > F(0)) || !std::isfinite(r)) return r;
    U b;
    std::memcpy(&b, &r, sizeof b);
    b = ((b >> 3) & 1) ? b + U(CXLKV_HLS_EXP_ULP) : b - U(CXLKV_HLS_EXP_ULP);
    std::memcpy(&r, &b, sizeof b);
    return r;
}
#endif

inline float exp_f32(float x) {
#ifdef CXLKV_HLS_VENDOR
    return hls::exp(x);
#elif defined(CXLKV_HLS_EXP_ULP)
    return exp_off_by_ulps<float, uint32_t>(std::exp(x));
#else
    return std::exp(x);
#endif
}

// f64 exponential (the selection's mass, as the reference computes it in f64).
inline double exp_f64(double x) {
#ifdef CXLKV_HLS_VENDOR
    return hls::exp(x);
#elif defined(CXLKV_HLS_EXP_ULP)
    return exp_off_by_ulps<double, uint64_t>(std::exp(x));
#else
    return std::exp(x);
#endif
}
}  // namespace cxlkv_hls

#endif
