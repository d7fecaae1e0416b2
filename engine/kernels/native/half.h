/* IEEE fp16 <-> fp32, one definition for every kernel source: the KV cache
 * (paged_attention.c) and the packed weights' scales (quant_matmul.c).
 * With F16C the instructions, else plain C with the same bits: fp16 to
 * fp32 is exact, and fp32 to fp16 rounds to nearest even as F16C's
 * _cvtss_sh(x, 0) and ggml's GGML_FP32_TO_FP16 do (a NaN becomes the
 * quiet NaN 0x7E00 with its sign, as F16C makes of a quiet NaN without
 * payload). */
#ifndef TANDEM_HALF_H
#define TANDEM_HALF_H

#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t mant = h & 0x3FF;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { e++; mant <<= 1; } while ((mant & 0x400) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3FF) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

static inline uint16_t float_to_half(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, 0);
#else
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7FFFFFFFu;
    if (mag > 0x7F800000u) return (uint16_t)(sign | 0x7E00u); /* NaN */
    if (mag >= 0x47800000u) return (uint16_t)(sign | 0x7C00u); /* 2^16 and up (and inf): inf */
    uint32_t r, rem, half;
    if (mag < 0x38800000u) { /* under 2^-14: a subnormal half (or zero) */
        if (mag < 0x33000000u) return (uint16_t)sign; /* under 2^-25: zero */
        const uint32_t shift = 126u - (mag >> 23), m = (mag & 0x7FFFFFu) | 0x800000u;
        r = m >> shift;
        rem = m & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
    } else {
        r = ((mag >> 23) - 112u) << 10 | ((mag & 0x7FFFFFu) >> 13);
        rem = mag & 0x1FFFu;
        half = 0x1000u;
    }
    if (rem > half || (rem == half && (r & 1u))) r++; /* a carry moves into the exponent, as it should */
    return (uint16_t)(sign | r);
#endif
}

#endif
