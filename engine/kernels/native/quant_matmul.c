/*
 * Weight-only block-quantized matrix products for the CPU:
 * y[M, N] = x[M, K] @ W[N, K]^T (+ bias), W in one of engine/model/quant.py's
 * formats, x and y float32:
 *   - q8_0, q4_0, q4_1: groups of 32 inputs, fp16 scales apart, GGML nibble order;
 *   - the raw GGUF blocks, kept byte for byte (ggml's block structs):
 *     q4_K, q5_K (super-blocks of 256: fp16 d and dmin, 8 sub-blocks of 32
 *     with 6-bit scales and mins packed in 12 bytes), q6_K (256: 16
 *     sub-blocks of 16 with int8 scales, fp16 d), q5_0 and q5_1 (32).
 *
 * Each row of x is first quantized to int8 with one float scale per block
 * of inputs (ggml's q8 activations), so a block's dot product is an integer
 * one. Blocks of 32 for q8_0 / q4_* / q5_* (q8_0: scale max|x| / 127);
 * super-blocks of 256 for the K-quants (llama.cpp's q8_K: scale
 * 1 / (127 / max|x|)), which
 *   - gives the same int8 levels llama.cpp's K-quant dot products use, so
 *     a product differs from llama.cpp's only in the order of its float
 *     additions (the comparison a user runs is of the same arithmetic);
 *   - makes a super-block's whole sum one exact int32 (each sub-block's
 *     integer dot product times its integer scale), so the float chain has
 *     two steps per 256 weights instead of sixteen (and one scale per 256
 *     inputs to compute);
 * at the cost of a coarser rounding of x (max over 256 instead of 32), the
 * same as llama.cpp's. Every output element is then, whatever the step's
 * size, the thread split or the instruction set:
 *
 *     acc = 0
 *     for each block g, in order:
 *         P   = sum of w[i] * x[i] over the block's inputs   (exact, int32;
 *               q4_0 / q5_0 count w as q - 8 / q - 16)
 *         q8_0, q4_0, q5_0: acc = fma(d_w[g] * d_x[g], (float)P, acc)
 *         q4_1, q5_1:       the same, then acc = fma(m_w[g], s_x[g], acc), s_x[g] =
 *                           fp16(fp32 scale * sum(x_q[g])) (ggml's block_q8_1.s)
 *         q4_K, q5_K: S = sum over sub-blocks j of scale_j * P_j,
 *                     M = sum over sub-blocks j of min_j * sum(x_q over j)   (exact, int32)
 *                     acc = fma(d_w[g] * d_x[g], (float)S, acc)
 *                     acc = fma(-(dmin_w[g] * d_x[g]), (float)M, acc)
 *         q6_K:       S = sum over its 16 sub-blocks of scale_j * P_j        (exact, int32)
 *                     acc = fma(d_w[g] * d_x[g], (float)S, acc)
 *     y = acc (+ bias) (times a scale, added to y with `accumulate`)
 *
 * so a row's result has the same bits alone, in a batch of 32 or inside a
 * 512-row prefill chunk, and the same bits from the portable C as from the
 * AVX2 or AVX-512 VNNI build (tests/engine/test_quant_kernels.py checks
 * both). Integer sums are exact in any order, which is what lets the SIMD
 * builds reorder them freely.
 *
 * Layout ("packed", engine/model/quant.py PackedQuantizedTensor): the
 * weight's rows are taken eight at a time (an "octet"), and within a group
 * the 4-byte pieces of the eight rows are interleaved, so one 32-byte load
 * holds the same four inputs of eight output columns: a vector lane is an
 * output column, a dot product is 8 multiply-add-4 instructions per group
 * with no horizontal sum, and each loaded weight vector serves up to four
 * rows of x while four rows' broadcast inputs serve two octets (a GEMM's
 * register tile, as llama.cpp's repacked q4_0 kernels do). Per octet and
 * group: q8_0: 8 x 32 bytes (piece j = inputs 4j..4j+3 of the 8 rows);
 * 4-bit: 4 x 32 bytes (piece k holds bytes 4k..4k+3 of each row's 16: low
 * nibbles are inputs 4k.., high nibbles 16+4k..); then 8 scales (and 8
 * mins) as fp16. The raw blocks keep their bytes and only move them: per
 * octet and block, each field of the block (RAW_FIELDS) interleaved across
 * the 8 rows the same way (an fp16 field as 8 x 2 bytes, a wider one in
 * 4-byte pieces), so the packed weight is exactly the file's size and the
 * 6-bit scales, fifth bits and high bits are decoded per lane in registers.
 * One exception: q5_0 / q5_1's 32 fifth bits are reordered within their 4
 * bytes (fifth_bit_order), so that a piece's bits come out with one shift.
 *
 * Built by engine/kernels/native/__init__.py in variants (portable, avx2,
 * avx512vnni) chosen at run time by the CPU's features; OpenMP resolves to
 * the libgomp torch has already loaded.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "half.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define TANDEM_SIMD 3 /* AVX2 + 256-bit vpdpbusd (AVX-512 VNNI), 32 vector registers */
#elif defined(__AVXVNNI__)
#define TANDEM_SIMD 2 /* AVX2 + VEX vpdpbusd (AVX-VNNI) */
#else
#define TANDEM_SIMD 1 /* AVX2 maddubs/madd */
#endif
#else
#define TANDEM_SIMD 0
#endif

#define GROUP 32
#define OCTET 8
#define SUPER 256 /* weights of a K-quant super-block */

enum { FMT_Q8_0 = 0, FMT_Q4_0 = 1, FMT_Q4_1 = 2, FMT_Q4_K = 3, FMT_Q5_K = 4, FMT_Q6_K = 5, FMT_Q5_0 = 6, FMT_Q5_1 = 7 };
#define FORMAT_COUNT 8

static inline int is_raw(int fmt) { return fmt >= FMT_Q4_K; }
static inline int is_k_quant(int fmt) { return fmt >= FMT_Q4_K && fmt <= FMT_Q6_K; }
static inline int is_five_bit(int fmt) { return fmt == FMT_Q5_0 || fmt == FMT_Q5_1; }
/* Weights of a block, and bytes of a raw (GGUF) block: ggml's block structs. */
static inline int64_t block_weights(int fmt) { return is_k_quant(fmt) ? SUPER : GROUP; }
static const int RAW_BYTES[FORMAT_COUNT] = {0, 0, 0, 144, 176, 210, 22, 24};

/* The fields of each raw block, {offset, bytes} in file order, ending with
 * {0, 0} (engine/model/quant.py _RAW_FIELDS). In the packed layout each
 * field of an octet's 8 blocks is stored at 8 * offset: a 2-byte field (an
 * fp16 d or dmin) as 8 rows x 2 bytes (one 16-byte load, 8 lanes), a wider
 * one as pieces of 4 bytes, piece p = bytes 4p..4p+3 of each of the 8 rows
 * (32 bytes, one per lane). */
typedef struct { int offset, bytes; } Field;
static const Field RAW_FIELDS[FORMAT_COUNT][6] = {
    [FMT_Q4_K] = {{0, 2}, {2, 2}, {4, 12}, {16, 128}},
    [FMT_Q5_K] = {{0, 2}, {2, 2}, {4, 12}, {16, 32}, {48, 128}},
    [FMT_Q6_K] = {{0, 128}, {128, 64}, {192, 16}, {208, 2}},
    [FMT_Q5_0] = {{0, 2}, {2, 4}, {6, 16}},
    [FMT_Q5_1] = {{0, 2}, {2, 2}, {4, 4}, {8, 16}},
};

#if TANDEM_SIMD
/* The largest |x| of n inputs (n a multiple of 8): lane by lane as the
 * scalar loop's `a > amax ? a : amax` (max_ps(a, m) is a > m ? a : m, so
 * a NaN input is passed over as there), lanes then combined (the maximum
 * of numbers: any order). */
static inline float max_abs(const float *x, int64_t n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Levels of 32 inputs, x * inv rounded as lrintf rounds (the MXCSR's
 * default: nearest, ties to even) and clamped to +-127, stored to q; the
 * levels as int32 lanes, added in two halves: half[0] inputs 0..15, half[1]
 * 16..31 (per lane, exact). */
static inline void levels32(const float *x, __m256 inv, int8_t *q, __m256i half[2]) {
    __m256i v[4];
    for (int i = 0; i < 4; i++) {
        const __m256i t = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), inv));
        v[i] = _mm256_max_epi32(_mm256_min_epi32(t, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
    }
    /* packs interleave 4-level runs per 128-bit lane: dwords v0[0..3] v1[0..3] v2 v3, v0[4..7] ... */
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    half[0] = _mm256_add_epi32(v[0], v[1]);
    half[1] = _mm256_add_epi32(v[2], v[3]);
}

static inline int32_t sum_lanes(__m256i v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    return _mm_cvtsi128_si32(h);
}
#endif

/* One row of x to int8 groups: q[K], scale[K/32], the sum of each group's
 * levels, and scale * that sum (what the q4_1 / q5_1 mins multiply), as
 * ggml-cpu's quantize_row_q8_0 / q8_1 compute them (x86 AVX2 and the
 * other SIMD paths alike): level = x * (127 / max|x|) rounded to nearest,
 * ties to even, with that very float 127 / max (not 1 / (max / 127), which
 * is an ulp apart for some max and rounds an input on or near a tie the
 * other way: after the first norm of a q8_0 embedding table, hundreds of
 * inputs a prefill sit on ties); the scale max / 127 kept in fp16 as
 * block_q8_0.d, and the scaled sum fp16(fp32 scale * sum) as
 * block_q8_1.s. The products then use the very numbers llama.cpp's do.
 * The SIMD builds compute each level with the same multiply and rounding
 * (a tenth of a 16-row step's time as scalar code). */
static void quantize_row(const float *x, int64_t K, int8_t *q, float *scale, int32_t *level_sum, float *scaled_sum) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
#if TANDEM_SIMD
        const float amax = max_abs(xg, GROUP);
#else
        float amax = 0.0f;
        for (int i = 0; i < GROUP; i++) {
            float a = fabsf(xg[i]);
            amax = a > amax ? a : amax;
        }
#endif
        const float d = amax / 127.0f;
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
#if TANDEM_SIMD
        __m256i half[2];
        levels32(xg, _mm256_set1_ps(inv), q + g * GROUP, half);
        sum = sum_lanes(_mm256_add_epi32(half[0], half[1]));
#else
        for (int i = 0; i < GROUP; i++) {
            int v = (int)lrintf(xg[i] * inv);
            v = v > 127 ? 127 : (v < -127 ? -127 : v);
            q[g * GROUP + i] = (int8_t)v;
            sum += v;
        }
#endif
        scale[g] = half_to_float(float_to_half(d));
        level_sum[g] = sum;
        scaled_sum[g] = half_to_float(float_to_half(d * (float)sum));
    }
}

/* One row of x to int8 super-blocks of 256 for the K-quants: llama.cpp's
 * q8_K (quantize_row_q8_K_ref), level = x * (127 / max|x|) rounded to
 * nearest, ties to even, one scale 1 / (127 / max|x|) per super-block, and
 * the level sums of each 16 inputs. (q8_K's scale is -max/127 with the
 * sign of the input of largest magnitude, which negates levels and scale
 * together: the same products.) */
static void quantize_row_super(const float *x, int64_t K, int8_t *q, float *scale, int16_t *sum16) {
    for (int64_t s = 0; s < K / SUPER; s++) {
        const float *xs = x + s * SUPER;
        int8_t *qs = q + s * SUPER;
#if TANDEM_SIMD
        const float amax = max_abs(xs, SUPER);
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int b = 0; b < SUPER / GROUP; b++) {
            __m256i half[2];
            levels32(xs + b * GROUP, _mm256_set1_ps(inv), qs + b * GROUP, half);
            sum16[s * (SUPER / 16) + 2 * b] = (int16_t)sum_lanes(half[0]);
            sum16[s * (SUPER / 16) + 2 * b + 1] = (int16_t)sum_lanes(half[1]);
        }
#else
        float amax = 0.0f;
        for (int i = 0; i < SUPER; i++) {
            float a = fabsf(xs[i]);
            amax = a > amax ? a : amax;
        }
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < SUPER; i++) {
            int v = (int)lrintf(xs[i] * inv);
            qs[i] = (int8_t)(v > 127 ? 127 : (v < -127 ? -127 : v));
        }
        for (int j = 0; j < SUPER / 16; j++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += qs[16 * j + i];
            sum16[s * (SUPER / 16) + j] = (int16_t)sum;
        }
#endif
        scale[s] = amax > 0.0f ? 1.0f / inv : 0.0f;
    }
}

/* ---- Raw GGUF blocks, one row at a time (file order) ---- */

/* q5_0 / q5_1 packed: bit j of the file's qh (weight j's fifth bit) is
 * stored at bit fifth_bit_order(j): weight 4k + b (the low nibble of byte
 * b of piece k) at bit 8b + k, weight 16 + 4k + b (its high nibble) at
 * 8b + 4 + k, so piece k's bits sit at bit k (low) and 4 + k (high) of
 * each byte (engine/model/quant.py _reorder_fifth_bits does the same). */
static inline int fifth_bit_order(int j) {
    const int high = j >= 16, k = (j % 16) / 4, b = j % 4;
    return 8 * b + 4 * high + k;
}

/* Row c's block in file order, from an octet's packed block. */
static void unpack_block(int fmt, const uint8_t *chunk, int c, uint8_t *out) {
    for (const Field *f = RAW_FIELDS[fmt]; f->bytes; f++) {
        const uint8_t *field = chunk + OCTET * f->offset;
        if (f->bytes == 2) {
            memcpy(out + f->offset, field + 2 * c, 2);
        } else {
            for (int p = 0; p < f->bytes / 4; p++) memcpy(out + f->offset + 4 * p, field + 32 * p + 4 * c, 4);
        }
    }
    if (is_five_bit(fmt)) {
        uint8_t *at = out + (fmt == FMT_Q5_0 ? 2 : 4);
        uint32_t packed, qh = 0;
        memcpy(&packed, at, sizeof packed);
        for (int j = 0; j < 32; j++) qh |= ((packed >> fifth_bit_order(j)) & 1u) << j;
        memcpy(at, &qh, sizeof qh);
    }
}

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return half_to_float(h);
}

/* The 6-bit scale and min of sub-block j of a q4_K / q5_K block (ggml's get_scale_min_k4). */
static inline void k_scale_min(int j, const uint8_t *q, int *scale, int *min) {
    if (j < 4) {
        *scale = q[j] & 63;
        *min = q[j + 4] & 63;
    } else {
        *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Every weight's integer level in a raw block: q4_K 0..15, q5_K and q5_1
 * 0..31, q6_K -32..31, q5_0 -16..15 (ggml's dequantize_row_*). */
static void raw_levels(int fmt, const uint8_t *b, int *level) {
    if (fmt == FMT_Q4_K || fmt == FMT_Q5_K) {
        const uint8_t *qs = b + (fmt == FMT_Q4_K ? 16 : 48), *qh = b + 16;
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                int lo = qs[32 * j + l] & 0xF, hi = qs[32 * j + l] >> 4;
                if (fmt == FMT_Q5_K) {
                    lo |= ((qh[l] >> (2 * j)) & 1) << 4;
                    hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
                }
                level[64 * j + l] = lo;
                level[64 * j + 32 + l] = hi;
            }
    } else if (fmt == FMT_Q6_K) {
        for (int n = 0; n < 2; n++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *ql = b + 64 * n, h = b[128 + 32 * n + l];
                level[128 * n + l] = ((ql[l] & 0xF) | ((h & 3) << 4)) - 32;
                level[128 * n + 32 + l] = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) - 32;
                level[128 * n + 64 + l] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) - 32;
                level[128 * n + 96 + l] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) - 32;
            }
    } else { /* q5_0, q5_1: bit j of qh is weight j's fifth bit */
        const int head = fmt == FMT_Q5_0 ? 2 : 4, offset = fmt == FMT_Q5_0 ? 16 : 0;
        uint32_t qh;
        memcpy(&qh, b + head, sizeof qh);
        const uint8_t *qs = b + head + 4;
        for (int j = 0; j < 16; j++) {
            level[j] = ((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - offset;
            level[j + 16] = ((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - offset;
        }
    }
}

/* A raw block's weights as floats, with gguf-py's operations in its order
 * (gguf.quants.dequantize: the same bits). */
static void dequantize_raw_block(int fmt, const uint8_t *b, float *out) {
    int level[SUPER];
    raw_levels(fmt, b, level);
    if (fmt == FMT_Q4_K || fmt == FMT_Q5_K) {
        const float d = half_at(b), dmin = half_at(b + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k_scale_min(j, b + 4, &sc, &m);
            const float scale = d * (float)sc, offset = dmin * (float)m;
            for (int i = 32 * j; i < 32 * j + 32; i++) out[i] = scale * (float)level[i] - offset;
        }
    } else if (fmt == FMT_Q6_K) {
        const float d = half_at(b + 208);
        for (int j = 0; j < 16; j++) {
            const float scale = d * (float)(int8_t)b[192 + j];
            for (int i = 16 * j; i < 16 * j + 16; i++) out[i] = scale * (float)level[i];
        }
    } else {
        const float d = half_at(b), m = fmt == FMT_Q5_1 ? half_at(b + 2) : 0.0f;
        for (int i = 0; i < GROUP; i++) out[i] = fmt == FMT_Q5_1 ? d * (float)level[i] + m : d * (float)level[i];
    }
}

#if !TANDEM_SIMD
/* The exact integer part of a raw block's product with its int8 inputs,
 * from the block `b` and its levels (raw_levels): q4_K / q5_K: S = sum
 * over sub-blocks j of scale_j * sum(level * x) and M = sum of min_j *
 * sum(x); q6_K: S over its 16 sub-blocks and int8 scales; q5_0 / q5_1:
 * S = sum(level * x). */
static void raw_block_sums(int fmt, const uint8_t *b, const int *level, const int8_t *x, int32_t *S, int32_t *M) {
    int32_t s = 0, m = 0;
    if (fmt == FMT_Q4_K || fmt == FMT_Q5_K) {
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            k_scale_min(j, b + 4, &sc, &mn);
            int32_t dot = 0, sum = 0;
            for (int i = 32 * j; i < 32 * j + 32; i++) {
                dot += level[i] * x[i];
                sum += x[i];
            }
            s += sc * dot;
            m += mn * sum;
        }
    } else if (fmt == FMT_Q6_K) {
        for (int j = 0; j < 16; j++) {
            int32_t dot = 0;
            for (int i = 16 * j; i < 16 * j + 16; i++) dot += level[i] * x[i];
            s += (int8_t)b[192 + j] * dot;
        }
    } else {
        for (int i = 0; i < GROUP; i++) s += level[i] * x[i];
    }
    *S = s;
    *M = m;
}
#endif

/* What is done to a row of x before the product (fused so that a decode
 * step pays one call, not three or four small torch ops, per product). */
enum { INPUT_AS_IS = 0, INPUT_RMS_NORM = 1, INPUT_SWIGLU = 2, INPUT_GEGLU = 3 };

/* out = x / rms(x) * weight over n inputs: the float32 squares summed in
 * double, in order (the same bits in every build), as ggml's rms_norm
 * sums them, so the products' inputs are llama.cpp's to the bit. Up to
 * four rows at once (`rows`, at x_stride and n apart in out): each row's
 * sum is its own chain in order, the four chains interleaved (a chain of
 * dependent double additions is the norm's whole cost). */
static void rms_norm_rows(const float *x, int64_t x_stride, int rows, int64_t n, const float *weight, float eps,
                          float *out) {
    const float *r0 = x, *r1 = rows > 1 ? x + x_stride : x, *r2 = rows > 2 ? x + 2 * x_stride : x,
                *r3 = rows > 3 ? x + 3 * x_stride : x;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int64_t k = 0; k < n; k++) {
        s0 += (double)(r0[k] * r0[k]);
        s1 += (double)(r1[k] * r1[k]);
        s2 += (double)(r2[k] * r2[k]);
        s3 += (double)(r3[k] * r3[k]);
    }
    const double squares[4] = {s0, s1, s2, s3};
    for (int r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        float *o = out + r * n;
        const float inv = 1.0f / sqrtf((float)(squares[r] / (double)n) + eps);
        int64_t k = 0;
#if TANDEM_SIMD
        const __m256 inv8 = _mm256_set1_ps(inv);
        for (; k + 8 <= n; k += 8)
            _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + k), inv8), _mm256_loadu_ps(weight + k)));
#endif
        for (; k < n; k++) o[k] = xr[k] * inv * weight[k];
    }
}

static void rms_norm_row(const float *x, int64_t n, const float *weight, float eps, float *out) {
    rms_norm_rows(x, 0, 1, n, weight, eps, out);
}

/* e^x as ggml-cpu's AVX2 SiLU computes it (ggml_v_expf, after Arm's
 * optimized-routines expf: x = n ln2 + b, e^b by a degree-5 polynomial,
 * times 2^n, with the far ranges scaled in two steps; at most 1.95 ulp
 * off), one fixed sequence of float operations: the scalar code spells
 * out what each SIMD lane does, so every build has the same bits, and the
 * down products' inputs are llama.cpp's on an AVX2 machine. (Attention's
 * softmax keeps its own exp_fixed, paged_attention.c: no llama.cpp
 * arithmetic to match there, its flash attention orders the sums
 * differently anyway.) */
static inline uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#define EXP_SHIFT 0x1.8p23f
#define EXP_LOG2E 0x1.715476p+0f
#define EXP_LN2_HI 0x1.62e4p-1f
#define EXP_LN2_LO 0x1.7f7d1cp-20f
#define EXP_C1 0x1.0e4020p-7f
#define EXP_C2 0x1.573e2ep-5f
#define EXP_C3 0x1.555e66p-3f
#define EXP_C4 0x1.fffdb6p-2f
#define EXP_C5 0x1.ffffecp-1f

static inline float exp_ggml(float x) {
    const float z = fmaf(x, EXP_LOG2E, EXP_SHIFT);
    const float n = z - EXP_SHIFT;
    const float b = fmaf(-n, EXP_LN2_LO, fmaf(-n, EXP_LN2_HI, x));
    const uint32_t e = bits_of(z) << 23;
    const float k = float_of(e + bits_of(1.0f));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(EXP_C1, b, EXP_C2), u, fmaf(EXP_C3, b, EXP_C4)), u, EXP_C5 * b);
    if (!(fabsf(n) > 126.0f)) return fmaf(k, j, k);
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = float_of(g + 0x7f000000u), s2 = float_of(e - g);
    if (fabsf(n) > 192.0f) return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

#if TANDEM_SIMD
static inline __m256 exp_ggml8(__m256 x) {
    const __m256 r = _mm256_set1_ps(EXP_SHIFT);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(EXP_LOG2E), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
    const __m256 far = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), n), _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(EXP_C1), b, _mm256_set1_ps(EXP_C2)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(EXP_C3), b, _mm256_set1_ps(EXP_C4))),
        u, _mm256_mul_ps(_mm256_set1_ps(EXP_C5), b));
    const __m256 near = _mm256_fmadd_ps(k, j, k);
    if (!_mm256_movemask_ps(far)) return near;
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 farther = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), n), _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 scaled = _mm256_blendv_ps(near, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1), far);
    return _mm256_blendv_ps(scaled, _mm256_mul_ps(s1, s1), farther);
}
#endif

/* silu(gate) * up = gate / (1 + e^-gate) * up over n inputs (ggml's
 * swiglu), e^ by exp_ggml. */
static void swiglu_row(const float *gate, const float *up, int64_t n, float *out) {
    int64_t k = 0;
#if TANDEM_SIMD
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; k + 8 <= n; k += 8) {
        const __m256 g = _mm256_loadu_ps(gate + k);
        const __m256 e = exp_ggml8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + k)));
    }
#endif
    for (; k < n; k++) out[k] = gate[k] / (1.0f + exp_ggml(0.0f - gate[k])) * up[k];
}

/* gelu(gate) * up, GELU's tanh form (Gemma), over n inputs: 0.5 x (1 +
 * tanh(u)) is x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3), so
 * with exp_ggml it is a SiLU of 2u: every build the same bits, and eight
 * lanes at a time instead of the C library's tanhf for each input (a
 * sixteenth of a Gemma 3 1B decode step). */
#define GELU_SCALE 0.7978845608028654f
#define GELU_CUBE 0.044715f
static void geglu_row(const float *gate, const float *up, int64_t n, float *out) {
    int64_t k = 0;
#if TANDEM_SIMD
    const __m256 one = _mm256_set1_ps(1.0f), minus_two = _mm256_set1_ps(-2.0f);
    for (; k + 8 <= n; k += 8) {
        const __m256 x = _mm256_loadu_ps(gate + k);
        const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_CUBE), x), x), x);
        const __m256 inner = _mm256_mul_ps(_mm256_set1_ps(GELU_SCALE), _mm256_add_ps(x, cube));
        const __m256 e = exp_ggml8(_mm256_mul_ps(minus_two, inner));
        _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + k)));
    }
#endif
    for (; k < n; k++) {
        const float x = gate[k];
        const float inner = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        out[k] = x / (1.0f + exp_ggml(-2.0f * inner)) * up[k];
    }
}

/* `rows` rows of x (at most 4, x_stride apart) prepared for a product, into out (K apart). */
static void prepare_rows(int input_op, const float *x, int64_t x_stride, int rows, int64_t K,
                         const float *norm_weight, float eps, float *out) {
    if (input_op == INPUT_RMS_NORM) {
        rms_norm_rows(x, x_stride, rows, K, norm_weight, eps, out);
        return;
    }
    for (int r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        float *o = out + r * K;
        if (input_op == INPUT_SWIGLU) { /* x holds gate then up, K each */
            swiglu_row(xr, xr + K, K, o);
        } else { /* INPUT_GEGLU */
            geglu_row(xr, xr + K, K, o);
        }
    }
}

/* The quantized rows of x a product reads: int8 blocks of 32 (G of them
 * per row), or of 256 for the K-quants (G super-blocks, sum16 set). */
typedef struct {
    const int8_t *q;       /* [M, K] */
    const float *d;        /* [M, G] */
    const int32_t *sum;    /* [M, G] (blocks of 32) */
    const float *dsum;     /* [M, G] (blocks of 32) */
    const int16_t *sum16;  /* [M, K / 16] (K-quants) */
    int64_t K, G;
} QuantizedRows;

/* One weight in the packed layout. */
typedef struct {
    int fmt;
    int64_t N, G;
    const uint8_t *data;    /* [octets, G, 8 * bytes per row block] */
    const uint16_t *scales; /* [octets, G, 8], or NULL (raw blocks) */
    const uint16_t *mins;   /* [octets, G, 8] or NULL */
} PackedWeight;

static inline int64_t octet_group_bytes(int fmt) {
    if (is_raw(fmt)) return OCTET * RAW_BYTES[fmt];
    return fmt == FMT_Q8_0 ? OCTET * GROUP : OCTET * GROUP / 2;
}

/* The float chain of one output element over one raw block, from its exact
 * integer sums S and M (raw_block_sums) and the inputs' scale dx (and, for
 * q5_1, dx times the inputs' level sum): the formula at the top of this
 * file. `b` is the block in file order. */
static inline float raw_block_step(int fmt, const uint8_t *b, int32_t S, int32_t M, float dx, float dsum,
                                   float acc) {
    if (fmt == FMT_Q6_K) return fmaf(half_at(b + 208) * dx, (float)S, acc);
    acc = fmaf(half_at(b) * dx, (float)S, acc);
    if (is_k_quant(fmt)) acc = fmaf(-(half_at(b + 2) * dx), (float)M, acc);
    if (fmt == FMT_Q5_1) acc = fmaf(half_at(b + 2), dsum, acc);
    return acc;
}

/* Finish one output element: + bias, times scale, store or add. */
static inline void finish_one(float value, const float *bias, float scale, int64_t n, float *out, int accumulate) {
    if (bias) value = value + bias[n];
    if (scale != 1.0f) value = value * scale;
    *out = accumulate ? *out + value : value;
}

#if !TANDEM_SIMD
/* The portable product for raw blocks: each block of the octet unpacked to
 * file order and its levels decoded once per run of rows, then each row's
 * exact sums and the float chain. */
static void raw_octets_product(const PackedWeight *w, const QuantizedRows *x, int64_t M, int64_t first, int64_t last,
                               const float *bias, float scale, float *y, int64_t y_stride, int accumulate) {
    enum { RUN = 64 };
    const int64_t G = w->G, obytes = octet_group_bytes(w->fmt), bw = block_weights(w->fmt);
    uint8_t block[OCTET][256];
    int level[OCTET][SUPER];
    float acc[RUN][OCTET];
    for (int64_t octet = first; octet < last; octet++) {
        for (int64_t r0 = 0; r0 < M; r0 += RUN) {
            const int64_t rows = M - r0 < RUN ? M - r0 : RUN;
            memset(acc, 0, sizeof acc);
            for (int64_t g = 0; g < G; g++) {
                const uint8_t *chunk = w->data + (octet * G + g) * obytes;
                for (int c = 0; c < OCTET; c++) {
                    unpack_block(w->fmt, chunk, c, block[c]);
                    raw_levels(w->fmt, block[c], level[c]);
                }
                for (int64_t r = 0; r < rows; r++) {
                    const int64_t at = (r0 + r) * G + g;
                    const int8_t *xg = x->q + (r0 + r) * x->K + g * bw;
                    const float dsum = x->dsum ? x->dsum[at] : 0.0f;
                    for (int c = 0; c < OCTET; c++) {
                        int32_t S, Msum;
                        raw_block_sums(w->fmt, block[c], level[c], xg, &S, &Msum);
                        acc[r][c] = raw_block_step(w->fmt, block[c], S, Msum, x->d[at], dsum, acc[r][c]);
                    }
                }
            }
            for (int64_t r = 0; r < rows; r++)
                for (int c = 0; c < OCTET && octet * OCTET + c < w->N; c++) {
                    const int64_t n = octet * OCTET + c;
                    finish_one(acc[r][c], bias, scale, n, y + (r0 + r) * y_stride + n, accumulate);
                }
        }
    }
}
#endif

/* The product's outputs for rows [r0, r0 + mr) and the columns of one
 * octet, as each element's final value (before bias and accumulation). */

#if TANDEM_SIMD
static inline int32_t load_piece(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* p += the 4-input dot products of unsigned w bytes with signed x bytes,
 * per 32-bit lane (exact: no lane can overflow for our operands). */
static inline __m256i dot_u8s8(__m256i p, __m256i w, __m256i x) {
#if TANDEM_SIMD == 3
    return _mm256_dpbusd_epi32(p, w, x);
#elif TANDEM_SIMD == 2
    return _mm256_dpbusd_avx_epi32(p, w, x);
#else
    return _mm256_add_epi32(p, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
}

#define TILE_ROWS 4

/* Whether a tile of mr > 1 rows takes two octets (each row's broadcast
 * inputs then serve both), where that measured faster (bench/quant_kernels.py;
 * for AVX2 bench/kernel_ab.py, the same bits): with 256-bit VNNI's 32
 * registers, every 4/5-bit format; for q8_0's larger pieces, and for a
 * single row, one octet streams the weights better. AVX2 has 16
 * registers: two octets of q4_0 / q4_1 ran 10% faster at 16 rows and
 * 11-25% at 2 and 3; q8_0 8-12% at 2 and 3 rows (at 4, see
 * q8_0_paired_tiles: `tile`'s code for 4 x 2 spilled, the same time); q5_0
 * / q5_1, whose fifth bits take registers too, the same at 2 rows and
 * 7-11% slower from 3. With fewer than TILE_ROWS rows the product is one
 * pass that reads its weight from memory, and two octets are two streams
 * that each tile starts afresh: with an octet's groups under 8 KB (q4_0
 * 6912 x 1152: 4.6 KB) that ran 10% slower from memory, so there one
 * octet at a time continues one stream. */
#define TWO_STREAMS_BYTES 8192
static inline int two_octet_tiles(int fmt, int64_t mr, int64_t octet_bytes) {
#if TANDEM_SIMD == 3
    (void)mr, (void)octet_bytes;
    return fmt != FMT_Q8_0;
#elif TANDEM_SIMD == 1
    if (mr < TILE_ROWS && octet_bytes < TWO_STREAMS_BYTES) return 0;
    return fmt == FMT_Q4_0 || fmt == FMT_Q4_1 || (fmt == FMT_Q8_0 && mr < TILE_ROWS);
#else
    /* AVX-VNNI (16 registers, and no such CPU to measure on yet): one octet. */
    (void)fmt, (void)mr, (void)octet_bytes;
    return 0;
#endif
}

static inline __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* An accumulator updated in order, piece by piece: without it GCC
 * computes the 32 maddubs of a 4-row AVX2 tile's group first and sums them
 * after, spilling most to the stack (16 vector registers hold the tile's
 * accumulators and little more). With it, 16 rows of a q5_0 / q5_1 / q4_1
 * product ran 16-25% faster, q4_0 7-21% (one thread, in-process A/B of
 * the two builds); one row the same. Tried on the K-quant tiles: q4_K 5-8%
 * slower, q6_K within noise; not used there. */
#define KEEP_IN_REGISTER(v) __asm__("" : "+x"(v))

/* Ask for the weight bytes a group or super-block `bytes` long at `at`
 * will need PREFETCH_AHEAD bytes later. A one-row product streams its weight
 * from memory with little arithmetic per byte, and the hardware prefetcher
 * alone left q6_K's reads, which go back and forth within a super-block
 * (scales, then ql and qh in turn), at a quarter of the read bandwidth
 * (bench/quant_kernels.py --rows 1: q6_K 2.7x faster with it, q5_0 and
 * q4_K 1.4x). The tiles ask on their first pass over a block of octets
 * (rows 0..3 of x; later passes find it in cache), with one row, or for
 * the raw layouts (q5_0 / q5_1 and q6_K; q8_0's one-octet tile and q4_K
 * ran 3-8% slower with it at 4 rows), or with two octets on AVX2 (q8_0's
 * paired tiles too: up to 3% faster from memory with it): there each tile starts
 * two streams of an octet's groups where one octet at a time continues
 * one, and for short rows the hardware prefetcher lagged (q4_0 6912 x
 * 1152 from memory, 2 rows, both threads: 19% slower than one octet at a
 * time without it, 9% with it). */
#define PREFETCH_AHEAD 2048
/* always_inline: GCC takes a function that only prefetches for one without
 * effects, and drops its calls. */
static inline __attribute__((always_inline)) void prefetch_weights(const uint8_t *at, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch((const char *)at + PREFETCH_AHEAD + i, _MM_HINT_T0);
}
static inline __m256 load_halves(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* q5_0 / q5_1: the fifth bits of piece k's low nibbles (`high` 0) or high
 * ones, as 0x10 in each byte, from the lane's reordered qh (fifth_bit_order:
 * bit k or 4 + k of each byte). */
static inline __m256i fifth_bits(__m256i qh, int k, int high) {
    const __m256i moved = high ? _mm256_srl_epi16(qh, _mm_cvtsi32_si128(k))
                               : _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - k));
    return _mm256_and_si256(moved, _mm256_set1_epi8(0x10));
}

/* p[r][o] (or q[r][o], every other piece where `split`) += the products of
 * piece j (inputs 4j..4j+3) of a q8_0 group: weights wg[o], rows xg[r]. */
static inline __attribute__((always_inline)) void q8_0_piece(const uint8_t *const wg[2], const int8_t *const xg[4],
                                                             int j, const int MR, const int NO, const int split,
                                                             __m256i p[4][2], __m256i q[4][2]) {
    __m256i wv[2], wabs[2];
    for (int o = 0; o < NO; o++) {
        wv[o] = load32(wg[o] + j * 32);
        wabs[o] = _mm256_sign_epi8(wv[o], wv[o]);
    }
    for (int r = 0; r < MR; r++) {
        const __m256i xb = _mm256_set1_epi32(load_piece(xg[r] + 4 * j));
        for (int o = 0; o < NO; o++) {
            const __m256i signed_x = _mm256_sign_epi8(xb, wv[o]);
            if (split && (j & 1)) q[r][o] = dot_u8s8(q[r][o], wabs[o], signed_x);
            else p[r][o] = dot_u8s8(p[r][o], wabs[o], signed_x);
        }
    }
}

/* A batch's rows pass over each block of octets TILE_ROWS at a time, and
 * each pass would unpack the same 5-bit levels again (nibbles, fifth
 * bits: ten instructions per 32 bytes, a quarter of a tile's work). With
 * more rows than one pass, the first pass stores the unpacked levels of
 * its octets (`levels`: per octet and group, 4 pieces of 32 low-nibble
 * levels then 32 high, 256 bytes; a few KB, in L1 or L2) and the later
 * passes load them. The same levels: the same bits. */
enum { LEVELS_NONE = 0, LEVELS_STORE = 1, LEVELS_LOAD = 2 };
static inline int unpacks_once(int fmt) { return is_five_bit(fmt); }
#define LEVEL_BYTES 256 /* unpacked bytes per octet and group */

/* acc[r][o] (8 columns each) for MR rows of x and NO octets starting at
 * `octet`, over every group: the formula at the top of this file, one
 * column per lane. MR and NO are constants at each call site, so the
 * arrays below live in registers. q8_0, q4_0, q4_1, q5_0, q5_1. */
static inline __attribute__((always_inline)) void tile(const PackedWeight *w, const QuantizedRows *x, int64_t r0,
                                                       int64_t octet, const int MR, const int NO, const int fmt,
                                                       uint8_t *levels, const int mode, __m256 acc[4][2]) {
    const int64_t G = w->G, obytes = octet_group_bytes(fmt);
    /* q5_0 / q5_1 blocks hold their scales: d (and m) at 0 (16), then qh, then the nibbles. */
    const int five = is_five_bit(fmt);
    const int64_t qh_at = fmt == FMT_Q5_1 ? 32 : 16, levels_at = five ? qh_at + 32 : 0;
    const uint8_t *base[2];
    const uint16_t *scales[2], *mins[2];
    for (int o = 0; o < NO; o++) {
        base[o] = w->data + (octet + o) * G * obytes;
        scales[o] = five ? NULL : w->scales + (octet + o) * G * OCTET;
        mins[o] = w->mins ? w->mins + (octet + o) * G * OCTET : NULL;
    }
    for (int r = 0; r < MR; r++)
        for (int o = 0; o < NO; o++) acc[r][o] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    /* vpdpbusd accumulates in place: with few rows and octets in the tile,
     * one accumulator each would be a chain of 8 dependent multiply-adds
     * per group, so small tiles alternate two (integer sums: exact in any
     * order). */
    const int split = TANDEM_SIMD >= 2 && MR * NO <= 2;
    for (int64_t g = 0; g < G; g++) {
        if (r0 == 0 && (MR == 1 || five || (TANDEM_SIMD == 1 && NO == 2)))
            for (int o = 0; o < NO; o++) prefetch_weights(base[o] + g * obytes, obytes);
        __m256i p[4][2], q[4][2];
        for (int r = 0; r < MR; r++)
            for (int o = 0; o < NO; o++) p[r][o] = q[r][o] = _mm256_setzero_si256();
        if (fmt == FMT_Q8_0) {
            const uint8_t *wg[2];
            const int8_t *xg[4];
            for (int o = 0; o < NO; o++) wg[o] = base[o] + g * obytes;
            for (int r = 0; r < MR; r++) xg[r] = x->q + (r0 + r) * x->K + g * GROUP;
            if (TANDEM_SIMD == 1 && MR > 1) {
                /* Unrolled fully, GCC's schedule of the maddubs tile
                 * spilled (bench/quant_kernels.py --rows 16: 5% slower). */
#pragma GCC unroll 2
                for (int j = 0; j < 8; j++) q8_0_piece(wg, xg, j, MR, NO, split, p, q);
            } else {
                for (int j = 0; j < 8; j++) q8_0_piece(wg, xg, j, MR, NO, split, p, q);
            }
        } else {
#if TANDEM_SIMD == 1
            /* maddubs pairs summed as int16 over the whole group: 16
             * products of at most 15 * 127 per lane, no overflow; 5-bit
             * levels (31 * 127) keep low and high nibbles apart (8 each). */
            __m256i h[4][2], h2[4][2];
            for (int r = 0; r < MR; r++)
                for (int o = 0; o < NO; o++) h[r][o] = h2[r][o] = _mm256_setzero_si256();
#endif
            __m256i qh[2];
            for (int o = 0; o < NO; o++)
                qh[o] = five && mode != LEVELS_LOAD ? load32(base[o] + g * obytes + qh_at) : _mm256_setzero_si256();
            for (int k = 0; k < 4; k++) {
                __m256i lo[2], hi[2];
                for (int o = 0; o < NO; o++) {
                    uint8_t *unpacked = mode ? levels + ((o * G + g) * 4 + k) * 64 : NULL;
                    if (mode == LEVELS_LOAD) {
                        lo[o] = load32(unpacked);
                        hi[o] = load32(unpacked + 32);
                        continue;
                    }
                    const __m256i raw = load32(base[o] + g * obytes + levels_at + k * 32);
                    lo[o] = _mm256_and_si256(raw, low4);
                    hi[o] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
                    if (five) {
                        lo[o] = _mm256_or_si256(lo[o], fifth_bits(qh[o], k, 0));
                        hi[o] = _mm256_or_si256(hi[o], fifth_bits(qh[o], k, 1));
                    }
                    if (mode == LEVELS_STORE) {
                        _mm256_storeu_si256((__m256i *)unpacked, lo[o]);
                        _mm256_storeu_si256((__m256i *)(unpacked + 32), hi[o]);
                    }
                }
                for (int r = 0; r < MR; r++) {
                    const int8_t *xg = x->q + (r0 + r) * x->K + g * GROUP;
                    const __m256i xl = _mm256_set1_epi32(load_piece(xg + 4 * k));
                    const __m256i xh = _mm256_set1_epi32(load_piece(xg + 16 + 4 * k));
                    for (int o = 0; o < NO; o++) {
#if TANDEM_SIMD == 1
                        h[r][o] = _mm256_add_epi16(h[r][o], _mm256_maddubs_epi16(lo[o], xl));
                        if (five) h2[r][o] = _mm256_add_epi16(h2[r][o], _mm256_maddubs_epi16(hi[o], xh));
                        else h[r][o] = _mm256_add_epi16(h[r][o], _mm256_maddubs_epi16(hi[o], xh));
                        KEEP_IN_REGISTER(h[r][o]);
                        if (five) KEEP_IN_REGISTER(h2[r][o]);
#else
                        p[r][o] = dot_u8s8(p[r][o], lo[o], xl);
                        if (split) q[r][o] = dot_u8s8(q[r][o], hi[o], xh);
                        else p[r][o] = dot_u8s8(p[r][o], hi[o], xh);
#endif
                    }
                }
            }
#if TANDEM_SIMD == 1
            const __m256i ones = _mm256_set1_epi16(1);
            for (int r = 0; r < MR; r++)
                for (int o = 0; o < NO; o++) {
                    p[r][o] = _mm256_madd_epi16(h[r][o], ones);
                    if (five) p[r][o] = _mm256_add_epi32(p[r][o], _mm256_madd_epi16(h2[r][o], ones));
                }
#endif
        }
        __m256 dw[2], mw[2];
        for (int o = 0; o < NO; o++) {
            if (five) {
                dw[o] = load_halves(base[o] + g * obytes);
                mw[o] = fmt == FMT_Q5_1 ? load_halves(base[o] + g * obytes + 16) : _mm256_setzero_ps();
            } else {
                dw[o] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales[o] + g * OCTET)));
                mw[o] = fmt == FMT_Q4_1 ? load_halves((const uint8_t *)(mins[o] + g * OCTET)) : _mm256_setzero_ps();
            }
        }
        for (int r = 0; r < MR; r++) {
            const int64_t at = (r0 + r) * G + g;
            const __m256 dx = _mm256_set1_ps(x->d[at]);
            for (int o = 0; o < NO; o++) {
                __m256i P = split ? _mm256_add_epi32(p[r][o], q[r][o]) : p[r][o];
                if (fmt == FMT_Q4_0) P = _mm256_sub_epi32(P, _mm256_set1_epi32(8 * x->sum[at]));
                if (fmt == FMT_Q5_0) P = _mm256_sub_epi32(P, _mm256_set1_epi32(16 * x->sum[at]));
                acc[r][o] = _mm256_fmadd_ps(_mm256_mul_ps(dw[o], dx), _mm256_cvtepi32_ps(P), acc[r][o]);
                if (fmt == FMT_Q4_1 || fmt == FMT_Q5_1)
                    acc[r][o] = _mm256_fmadd_ps(mw[o], _mm256_set1_ps(x->dsum[at]), acc[r][o]);
            }
        }
    }
}

/* Two int16 in each 32-bit lane: lane values a (low half) and b (high). */
static inline __m256i int16_pairs(__m256i a, __m256i b) {
    return _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(b, 16));
}

/* Bytes a and b of each 32-bit lane of v as signed int16, a in the low
 * half and b in the high one: each moved to the high byte of its half,
 * then shifted down with its sign. */
static inline __m256i int8_pair(__m256i v, const int a, const int b) {
    const __m256i to_high = _mm256_setr_epi8(
        -1, a, -1, b, -1, 4 + a, -1, 4 + b, -1, 8 + a, -1, 8 + b, -1, 12 + a, -1, 12 + b,
        -1, a, -1, b, -1, 4 + a, -1, 4 + b, -1, 8 + a, -1, 8 + b, -1, 12 + a, -1, 12 + b);
    return _mm256_srai_epi16(_mm256_shuffle_epi8(v, to_high), 8);
}

/* Two int16 as one 32-bit value, a in the low half, to broadcast. */
static inline int32_t int16_pair(int a, int b) {
    return (int32_t)((uint32_t)(uint16_t)a | ((uint32_t)(uint16_t)b << 16));
}

/* The 6-bit scale (or with `min`, the min) of sub-block j of each lane's
 * q4_K / q5_K block, from the three 4-byte pieces of the packed 12 bytes:
 * ggml's get_scale_min_k4, one lane per row. */
static inline __m256i k_scale(__m256i first, __m256i second, __m256i third, int j, int min) {
    const __m256i low = min ? second : first;
    if (j < 4) return _mm256_and_si256(_mm256_srli_epi32(low, 8 * j), _mm256_set1_epi32(63));
    const int k = j - 4;
    const __m256i four = _mm256_and_si256(_mm256_srli_epi32(third, 8 * k + (min ? 4 : 0)), _mm256_set1_epi32(15));
    const __m256i two = _mm256_and_si256(_mm256_srli_epi32(low, 8 * k + 6), _mm256_set1_epi32(3));
    return _mm256_or_si256(four, _mm256_slli_epi32(two, 4));
}

/* Bit `bit` (a run-time count) of every byte, moved to bit 4. */
static inline __m256i bit_to_4(__m256i v, int bit) {
    const __m256i one = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(bit)), _mm256_set1_epi8(1));
    return _mm256_slli_epi16(one, 4);
}

/* acc[r] (8 columns) for MR rows of x and one octet of a K-quant weight,
 * over every super-block: per lane, the exact int32 sums S (and M) of the
 * formula at the top of this file, then its float steps. maddubs sums
 * pairs of level * x into int16, at most 16 products of 15 * 127 (q4_K,
 * one sub-block), 8 of 31 * 127 (q5_K, half a sub-block) or 4 of 63 * 127
 * (q6_K, half a sub-block, levels + 32); each int16 sum is then multiplied
 * by its sub-block's scale into int32 by madd. Exact, as every build. The
 * loops whose count needs no constant stay loops (`unroll 1`): the code
 * stays small enough to compile in seconds and to sit in the I-cache. */
static inline __attribute__((always_inline)) void tile_k(const PackedWeight *w, const QuantizedRows *x, int64_t r0,
                                                         int64_t octet, const int MR, const int fmt, __m256 acc[4]) {
    const int64_t G = w->G, obytes = octet_group_bytes(fmt);
    const uint8_t *base = w->data + octet * G * obytes;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int r = 0; r < MR; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *chunk = base + g * obytes;
        if (r0 == 0 && (MR == 1 || fmt == FMT_Q6_K)) prefetch_weights(chunk, obytes);
        __m256i S[4], h[4], hh[4];
        const int8_t *xs[4];
        const int16_t *sum16[4];
        __m256 dx[4];
        for (int r = 0; r < MR; r++) {
            S[r] = h[r] = hh[r] = _mm256_setzero_si256();
            xs[r] = x->q + (r0 + r) * x->K + g * SUPER;
            sum16[r] = x->sum16 + (r0 + r) * (x->K / 16) + g * (SUPER / 16);
            dx[r] = _mm256_set1_ps(x->d[(r0 + r) * G + g]);
        }
        /* Every sub-block's scale as an int16 pair per lane (for madd). */
        __m256i scale[16];
        if (fmt == FMT_Q6_K) {
            /* Fields: ql 32 pieces at 0, qh 16 pieces at 1024, int8 scales 4 pieces at 1536, d at 1664. */
            const uint8_t *ql = chunk, *qh = chunk + 8 * 128, *scales = chunk + 8 * 192;
            /* Levels are taken as q + 32 (0..63, unsigned for maddubs); the
             * 32 * sum over sub-blocks of scale * sum(x) comes off at the end. */
            __m256i offset[4];
            for (int r = 0; r < MR; r++) offset[r] = _mm256_setzero_si256();
            for (int p = 0; p < 4; p++) {
                const __m256i v = load32(scales + 32 * p);
                for (int b = 0; b < 4; b++) scale[4 * p + b] = int8_pair(v, b, b);
                for (int b = 0; b < 4; b += 2) {
                    const __m256i pair = int8_pair(v, b, b + 1); /* scales 4p + b, 4p + b + 1 */
                    for (int r = 0; r < MR; r++) {
                        const __m256i sums = _mm256_set1_epi32(load_piece((const int8_t *)(sum16[r] + 4 * p + b)));
                        offset[r] = _mm256_add_epi32(offset[r], _mm256_madd_epi16(pair, sums));
                    }
                }
            }
            /* Half n, piece m (0..7) of ql's first and second 32 bytes (A, B)
             * with qh piece 8n + m: A's low nibbles are inputs 128n + 4m
             * (qh bits 0-1), B's low 128n + 32 + 4m (bits 2-3), A's high
             * 128n + 64 + 4m (bits 4-5), B's high 128n + 96 + 4m (bits 6-7):
             * target t in that order, sub-block 8n + 2t + m / 4; two
             * pieces summed in int16 before the scale. */
#pragma GCC unroll 1
            for (int n = 0; n < 2; n++)
#pragma GCC unroll 1
                for (int pair = 0; pair < 4; pair++)
                    for (int t = 0; t < 4; t++) {
                        const __m256i sc = scale[8 * n + 2 * t + pair / 2];
                        for (int e = 0; e < 2; e++) {
                            const int m = 2 * pair + e;
                            const __m256i bits = load32(qh + 32 * (8 * n + m));
                            const __m256i src = load32(ql + 32 * (16 * n + 8 * (t & 1) + m));
                            const __m256i nibble = t < 2 ? _mm256_and_si256(src, low4)
                                                         : _mm256_and_si256(_mm256_srli_epi16(src, 4), low4);
                            const __m256i high = t == 0   ? _mm256_slli_epi16(bits, 4)
                                                 : t == 1 ? _mm256_slli_epi16(bits, 2)
                                                 : t == 2 ? bits
                                                          : _mm256_srli_epi16(bits, 2);
                            const __m256i level =
                                _mm256_or_si256(nibble, _mm256_and_si256(high, _mm256_set1_epi8(0x30)));
                            for (int r = 0; r < MR; r++) {
                                const __m256i xv = _mm256_set1_epi32(load_piece(xs[r] + 128 * n + 32 * t + 4 * m));
                                h[r] = _mm256_add_epi16(h[r], _mm256_maddubs_epi16(level, xv));
                            }
                        }
                        for (int r = 0; r < MR; r++) {
                            S[r] = _mm256_add_epi32(S[r], _mm256_madd_epi16(h[r], sc));
                            h[r] = _mm256_setzero_si256();
                        }
                    }
            const __m256 dw = load_halves(chunk + 8 * 208);
            for (int r = 0; r < MR; r++) {
                S[r] = _mm256_sub_epi32(S[r], _mm256_slli_epi32(offset[r], 5));
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx[r]), _mm256_cvtepi32_ps(S[r]), acc[r]);
            }
            continue;
        }
        /* q4_K / q5_K fields: d at 0, dmin at 16, scales 3 pieces at 32,
         * (q5_K: qh 8 pieces at 128,) nibbles 32 pieces at 128 (q5_K 384).
         * Chunk j of the nibbles: piece 8j + p holds inputs 64j + 4p.. (low
         * nibbles, sub-block 2j) and 64j + 32 + 4p.. (high, 2j + 1). */
        const int five = fmt == FMT_Q5_K;
        const uint8_t *qs = chunk + (five ? 8 * 48 : 8 * 16), *qh = chunk + 8 * 16;
        const __m256i first = load32(chunk + 32), second = load32(chunk + 64), third = load32(chunk + 96);
        __m256i mins[4];
        for (int j = 0; j < 8; j++) {
            const __m256i sc = k_scale(first, second, third, j, 0);
            scale[j] = int16_pairs(sc, sc);
        }
        for (int i = 0; i < 4; i++)
            mins[i] = int16_pairs(k_scale(first, second, third, 2 * i, 1), k_scale(first, second, third, 2 * i + 1, 1));
        const int run = five ? 4 : 8; /* pieces summed in int16 before the scale */
#pragma GCC unroll 1
        for (int j = 0; j < 4; j++) {
            for (int p = 0; p < 8; p++) {
                const __m256i raw = load32(qs + 32 * (8 * j + p));
                __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
                if (five) {
                    const __m256i bits = load32(qh + 32 * p);
                    lo = _mm256_or_si256(lo, bit_to_4(bits, 2 * j));
                    hi = _mm256_or_si256(hi, bit_to_4(bits, 2 * j + 1));
                }
                for (int r = 0; r < MR; r++) {
                    const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_piece(xs[r] + 64 * j + 4 * p)));
                    const __m256i ph =
                        _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_piece(xs[r] + 64 * j + 32 + 4 * p)));
                    h[r] = _mm256_add_epi16(h[r], pl);
                    hh[r] = _mm256_add_epi16(hh[r], ph);
                    if (p % run == run - 1) {
                        S[r] = _mm256_add_epi32(S[r], _mm256_madd_epi16(h[r], scale[2 * j]));
                        S[r] = _mm256_add_epi32(S[r], _mm256_madd_epi16(hh[r], scale[2 * j + 1]));
                        h[r] = hh[r] = _mm256_setzero_si256();
                    }
                }
            }
        }
        /* M = sum of min_j * sum(x over sub-block j), two sub-blocks per madd. */
        __m256i M[4];
        for (int r = 0; r < MR; r++) {
            M[r] = _mm256_setzero_si256();
            for (int i = 0; i < 4; i++) {
                const int16_t *b = sum16[r] + 4 * i;
                const __m256i sums = _mm256_set1_epi32(int16_pair(b[0] + b[1], b[2] + b[3]));
                M[r] = _mm256_add_epi32(M[r], _mm256_madd_epi16(mins[i], sums));
            }
        }
        const __m256 dw = load_halves(chunk), dmin = load_halves(chunk + 16);
        for (int r = 0; r < MR; r++) {
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx[r]), _mm256_cvtepi32_ps(S[r]), acc[r]);
            acc[r] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx[r]), _mm256_cvtepi32_ps(M[r]), acc[r]);
        }
    }
}

/* Finish one octet's 8 columns of one row: + bias, times scale, store or add. */
static inline void finish(__m256 v, const float *bias, float scale, int64_t n0, int64_t N, float *y, int accumulate) {
    if (n0 + OCTET <= N) {
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n0));
        if (scale != 1.0f) v = _mm256_mul_ps(v, _mm256_set1_ps(scale));
        if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(y + n0), v);
        _mm256_storeu_ps(y + n0, v);
        return;
    }
    float lanes[OCTET];
    _mm256_storeu_ps(lanes, v);
    for (int64_t n = n0; n < N; n++) {
        float value = lanes[n - n0];
        if (bias) value = value + bias[n];
        if (scale != 1.0f) value = value * scale;
        y[n] = accumulate ? y[n] + value : value;
    }
}

#define TILE_CASE(MR, NO)                                                                          \
    do {                                                                                           \
        __m256 acc[4][2];                                                                          \
        tile(w, x, r0, octet, MR, NO, fmt, levels ? levels + (octet - first) * w->G * LEVEL_BYTES : NULL,  \
             levels ? mode : LEVELS_NONE, acc);                                                    \
        for (int r = 0; r < MR; r++)                                                               \
            for (int o = 0; o < NO; o++)                                                           \
                finish(acc[r][o], bias, scale, (octet + o) * OCTET, w->N, y + (r0 + r) * y_stride, accumulate); \
    } while (0)

#define K_TILE_CASE(MR)                                                                            \
    do {                                                                                           \
        __m256 acc[4];                                                                             \
        tile_k(w, x, r0, octet, MR, fmt, acc);                                                     \
        for (int r = 0; r < MR; r++)                                                               \
            finish(acc[r], bias, scale, octet * OCTET, w->N, y + (r0 + r) * y_stride, accumulate);  \
    } while (0)

/* Octets [first, last) for rows [r0, r0 + mr) of a weight in format `fmt`. */
static inline __attribute__((always_inline)) void format_octets(const PackedWeight *w, const QuantizedRows *x,
                                                                int64_t r0, int64_t mr, int64_t first, int64_t last,
                                                                const int fmt, const float *bias, float scale,
                                                                float *y, int64_t y_stride, int accumulate,
                                                                uint8_t *levels, const int mode) {
    int64_t octet = first;
    if (is_k_quant(fmt)) {
        for (; octet < last; octet++) {
            switch (mr) {
            case 4: K_TILE_CASE(4); break;
            case 3: K_TILE_CASE(3); break;
            case 2: K_TILE_CASE(2); break;
            default: K_TILE_CASE(1); break;
            }
        }
        return;
    }
    for (; mr > 1 && two_octet_tiles(fmt, mr, w->G * octet_group_bytes(fmt)) && octet + 2 <= last; octet += 2) {
        switch (mr) {
        case 4: TILE_CASE(4, 2); break;
        case 3: TILE_CASE(3, 2); break;
        case 2: TILE_CASE(2, 2); break;
        default: TILE_CASE(1, 2); break;
        }
    }
    for (; octet < last; octet++) {
        switch (mr) {
        case 4: TILE_CASE(4, 1); break;
        case 3: TILE_CASE(3, 1); break;
        case 2: TILE_CASE(2, 1); break;
        default: TILE_CASE(1, 1); break;
        }
    }
}

/* One copy of the tiles: GCC would otherwise clone them for the
 * branch-output call's constant arguments, doubling the build time for
 * nothing. */
#if defined(__GNUC__) && !defined(__clang__)
#define ONE_COPY __attribute__((noinline, noclone))
#else
#define ONE_COPY __attribute__((noinline))
#endif
#if TANDEM_SIMD == 1
/* The most weight bytes per block that q8_0's 4-row passes fetch ahead
 * for the next block: with this block, the next and a batch's rows of x
 * in L2 (512 KB a core on Zen 3). */
#define NEXT_BLOCK_BYTES (128 * 1024)

/* One row's piece of the q8_0 4x2 tile below: its 4 inputs (at X)
 * broadcast, signed by each octet's weights, multiplied by their absolute
 * values, pairs summed to int32 and added to the row's sums P0 and P1. */
#define Q8_0_ROW_PIECE(X, P0, P1)                        \
    "vpbroadcastd " X ", %[xb]\n\t"                      \
    "vpsignb %[v0], %[xb], %[t0]\n\t"                    \
    "vpsignb %[v1], %[xb], %[t1]\n\t"                    \
    "vpmaddubsw %[t0], %[a0], %[t0]\n\t"                 \
    "vpmaddubsw %[t1], %[a1], %[t1]\n\t"                 \
    "vpmaddwd %[ones], %[t0], %[t0]\n\t"                 \
    "vpmaddwd %[ones], %[t1], %[t1]\n\t"                 \
    "vpaddd %[t0], %[" #P0 "], %[" #P0 "]\n\t"           \
    "vpaddd %[t1], %[" #P1 "], %[" #P1 "]\n\t"

/* q8_0 on AVX2, TILE_ROWS rows of x by two octets: each row's broadcast
 * inputs serve 16 columns. The eight int32 sums and the group's operands
 * take all 16 vector registers, so the float sums live in `acc` (memory:
 * one load-fma-store per row, octet and group; the same fma, the same
 * bits, as `tile`). Hand-written loops of one group (operands in L1, Zen
 * 3): 0.48 ns per 32 multiply-adds, against 0.52 for `tile`'s 4 x 1; in
 * the engine 16 rows of q8_0 ran 4-7% faster than with `tile` (bench/kernel_ab.py). */
static inline __attribute__((always_inline)) void q8_0_tile_4x2(const PackedWeight *w, const QuantizedRows *x,
                                                                int64_t r0, int64_t octet, int64_t next_block,
                                                                float acc[TILE_ROWS][2][OCTET]) {
    const int64_t G = w->G, obytes = octet_group_bytes(FMT_Q8_0);
    const uint8_t *base0 = w->data + octet * G * obytes, *base1 = base0 + G * obytes;
    const uint16_t *scales0 = w->scales + octet * G * OCTET, *scales1 = scales0 + G * OCTET;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < TILE_ROWS; r++)
        for (int o = 0; o < 2; o++) _mm256_storeu_ps(acc[r][o], _mm256_setzero_ps());
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *w0 = base0 + g * obytes, *w1 = base1 + g * obytes;
        const int8_t *xg = x->q + r0 * x->K + g * GROUP;
        if (r0 == 0) {
            prefetch_weights(w0, obytes);
            prefetch_weights(w1, obytes);
        } else if (r0 == TILE_ROWS && next_block) {
            for (int64_t i = 0; i < obytes; i += 64) {
                _mm_prefetch((const char *)w0 + next_block + i, _MM_HINT_T1);
                _mm_prefetch((const char *)w1 + next_block + i, _MM_HINT_T1);
            }
        }
        __m256i p[TILE_ROWS][2];
        for (int r = 0; r < TILE_ROWS; r++) p[r][0] = p[r][1] = _mm256_setzero_si256();
        const int8_t *x2 = xg + 2 * x->K;
        __m256i v0, v1, a0, a1, xb, t0, t1;
        /* Written out: GCC either copies each sum after its add (a register
         * move per 32 multiply-adds) or spills sums to the stack; this is
         * the hand-written loop's schedule. */
        __asm__(".irp j,0,1,2,3,4,5,6,7\n\t"
                "vmovdqu \\j*32(%[w0]), %[v0]\n\t"
                "vmovdqu \\j*32(%[w1]), %[v1]\n\t"
                "vpsignb %[v0], %[v0], %[a0]\n\t"
                "vpsignb %[v1], %[v1], %[a1]\n\t"
                Q8_0_ROW_PIECE("\\j*4(%[x0])", p00, p01)
                Q8_0_ROW_PIECE("\\j*4(%[x0],%[s])", p10, p11)
                Q8_0_ROW_PIECE("\\j*4(%[x2])", p20, p21)
                Q8_0_ROW_PIECE("\\j*4(%[x2],%[s])", p30, p31)
                ".endr"
                : [p00] "+x"(p[0][0]), [p01] "+x"(p[0][1]), [p10] "+x"(p[1][0]), [p11] "+x"(p[1][1]),
                  [p20] "+x"(p[2][0]), [p21] "+x"(p[2][1]), [p30] "+x"(p[3][0]), [p31] "+x"(p[3][1]),
                  [v0] "=&x"(v0), [v1] "=&x"(v1), [a0] "=&x"(a0), [a1] "=&x"(a1), [xb] "=&x"(xb),
                  [t0] "=&x"(t0), [t1] "=&x"(t1)
                : [w0] "r"(w0), [w1] "r"(w1), [x0] "r"(xg), [x2] "r"(x2), [s] "r"(x->K), [ones] "x"(ones)
                : "memory");
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales0 + g * OCTET)));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales1 + g * OCTET)));
        for (int r = 0; r < TILE_ROWS; r++) {
            const __m256 dx = _mm256_set1_ps(x->d[(r0 + r) * G + g]);
            _mm256_storeu_ps(acc[r][0], _mm256_fmadd_ps(_mm256_mul_ps(d0, dx), _mm256_cvtepi32_ps(p[r][0]),
                                                        _mm256_loadu_ps(acc[r][0])));
            _mm256_storeu_ps(acc[r][1], _mm256_fmadd_ps(_mm256_mul_ps(d1, dx), _mm256_cvtepi32_ps(p[r][1]),
                                                        _mm256_loadu_ps(acc[r][1])));
        }
        /* The sums stay in memory: without this GCC keeps them in
         * registers and spills the integer sums of the loop above. */
        __asm__ volatile("" : : "r"(acc) : "memory");
    }
}

/* Rows [r0, r0 + TILE_ROWS) of a q8_0 product over octets [first, last). */
ONE_COPY static void q8_0_paired_tiles(const PackedWeight *w, const QuantizedRows *x, int64_t r0, int64_t first,
                                       int64_t last, const float *bias, float scale, float *y, int64_t y_stride,
                                       int accumulate) {
    float acc[TILE_ROWS][2][OCTET];
    /* The thread's next block of octets follows this one (a static
     * schedule of contiguous blocks): its weights go to L2 during the
     * second pass, so that its first pass does not wait on memory. */
    const int64_t block_bytes = (last - first) * w->G * octet_group_bytes(FMT_Q8_0);
    const int64_t next_block = block_bytes <= NEXT_BLOCK_BYTES ? block_bytes : 0;
    int64_t octet = first;
    for (; octet + 2 <= last; octet += 2) {
        q8_0_tile_4x2(w, x, r0, octet, next_block, acc);
        for (int r = 0; r < TILE_ROWS; r++)
            for (int o = 0; o < 2; o++)
                finish(_mm256_loadu_ps(acc[r][o]), bias, scale, (octet + o) * OCTET, w->N, y + (r0 + r) * y_stride,
                       accumulate);
    }
    if (octet < last) format_octets(w, x, r0, TILE_ROWS, octet, last, FMT_Q8_0, bias, scale, y, y_stride, accumulate, NULL, 0);
}
#undef Q8_0_ROW_PIECE
#endif

#define FORMAT_CASE(FMT, MR) \
    case FMT: format_octets(w, x, r0, MR, first, last, FMT, bias, scale, y, y_stride, accumulate, NULL, 0); break
#define UNPACKED_CASE(FMT, MODE) \
    case FMT: format_octets(w, x, r0, TILE_ROWS, first, last, FMT, bias, scale, y, y_stride, accumulate, levels, MODE); break
#define EVERY_FORMAT(MR)          \
    switch (w->fmt) {             \
        FORMAT_CASE(FMT_Q8_0, MR); \
        FORMAT_CASE(FMT_Q4_0, MR); \
        FORMAT_CASE(FMT_Q4_1, MR); \
        FORMAT_CASE(FMT_Q4_K, MR); \
        FORMAT_CASE(FMT_Q5_K, MR); \
        FORMAT_CASE(FMT_Q6_K, MR); \
        FORMAT_CASE(FMT_Q5_0, MR); \
        FORMAT_CASE(FMT_Q5_1, MR); \
    }

/* Rows [r0, r0 + TILE_ROWS) (a batch's bulk), with the tiles compiled once
 * per format as for one row below (16 rows, qwen3-0.6b's MLP shapes, one
 * thread: q4_K 1.18x, q8_0 1.12x, q5_0 1.1x faster); a function of its
 * own, as in octets_product the one-row tiles ran 10% slower beside them. */
ONE_COPY static void whole_tiles(const PackedWeight *w, const QuantizedRows *x, int64_t r0, int64_t first,
                                 int64_t last, const float *bias, float scale, float *y, int64_t y_stride,
                                 int accumulate, uint8_t *levels) {
    if (levels && r0 == 0) {
        switch (w->fmt) { UNPACKED_CASE(FMT_Q5_0, LEVELS_STORE); UNPACKED_CASE(FMT_Q5_1, LEVELS_STORE); }
    } else if (levels) {
        switch (w->fmt) { UNPACKED_CASE(FMT_Q5_0, LEVELS_LOAD); UNPACKED_CASE(FMT_Q5_1, LEVELS_LOAD); }
    } else {
        EVERY_FORMAT(TILE_ROWS)
    }
}

ONE_COPY static void octets_product(const PackedWeight *w, const QuantizedRows *x, int64_t M, int64_t first,
                                    int64_t last, const float *bias, float scale, float *y, int64_t y_stride,
                                    int accumulate, uint8_t *levels) {
    /* `levels` is there only where level_scratch_bytes made room; it
     * serves whole passes (the last, partial pass unpacks its own). */
    for (int64_t r0 = 0; r0 < M; r0 += TILE_ROWS) {
        const int64_t mr = M - r0 < TILE_ROWS ? M - r0 : TILE_ROWS;
        if (mr == TILE_ROWS) {
#if TANDEM_SIMD == 1
            if (w->fmt == FMT_Q8_0) {
                q8_0_paired_tiles(w, x, r0, first, last, bias, scale, y, y_stride, accumulate);
                continue;
            }
#endif
            whole_tiles(w, x, r0, first, last, bias, scale, y, y_stride, accumulate, levels);
            continue;
        }
        if (mr > 1) {
            format_octets(w, x, r0, mr, first, last, w->fmt, bias, scale, y, y_stride, accumulate, NULL, 0);
            continue;
        }
        /* One row (a decode step): its tiles compiled once per format, so
         * that no test of the format is left in their loops (q5_0 and q5_1
         * a third faster, q6_K a sixth, with the weights in cache); the
         * tiles for 2 to TILE_ROWS - 1 rows stay one copy (the build's time). */
        EVERY_FORMAT(1)
    }
}
#undef EVERY_FORMAT
#undef FORMAT_CASE
#undef UNPACKED_CASE

/* Bytes of stored levels a thread's block of octets needs (0: none). */
static size_t level_scratch_bytes(int fmt, int64_t M, int64_t G, int64_t block_octets) {
    return M >= 2 * TILE_ROWS && unpacks_once(fmt) ? (size_t)(block_octets * G * LEVEL_BYTES) : 0;
}

#else /* portable C: the same formula, element by element */

static void octets_product(const PackedWeight *w, const QuantizedRows *x, int64_t M, int64_t first, int64_t last,
                           const float *bias, float scale, float *y, int64_t y_stride, int accumulate,
                           uint8_t *levels) {
    (void)levels;
    const int64_t G = w->G, obytes = octet_group_bytes(w->fmt);
    if (is_raw(w->fmt)) {
        raw_octets_product(w, x, M, first, last, bias, scale, y, y_stride, accumulate);
        return;
    }
    for (int64_t r = 0; r < M; r++) {
        const int8_t *xr = x->q + r * x->K;
        for (int64_t octet = first; octet < last; octet++) {
            for (int c = 0; c < OCTET; c++) {
                const int64_t n = octet * OCTET + c;
                if (n >= w->N) break;
                float acc = 0.0f;
                for (int64_t g = 0; g < G; g++) {
                    const uint8_t *wg = w->data + (octet * G + g) * obytes;
                    const int8_t *xg = xr + g * GROUP;
                    int32_t P = 0;
                    if (w->fmt == FMT_Q8_0) {
                        for (int j = 0; j < 8; j++)
                            for (int b = 0; b < 4; b++) P += (int8_t)wg[j * 32 + c * 4 + b] * xg[4 * j + b];
                    } else {
                        for (int k = 0; k < 4; k++)
                            for (int b = 0; b < 4; b++) {
                                const uint8_t byte = wg[k * 32 + c * 4 + b];
                                P += (byte & 0x0F) * xg[4 * k + b] + (byte >> 4) * xg[16 + 4 * k + b];
                            }
                        if (w->fmt == FMT_Q4_0) P -= 8 * x->sum[r * G + g];
                    }
                    const int64_t at = (octet * G + g) * OCTET + c;
                    acc = fmaf(half_to_float(w->scales[at]) * x->d[r * G + g], (float)P, acc);
                    if (w->fmt == FMT_Q4_1) acc = fmaf(half_to_float(w->mins[at]), x->dsum[r * G + g], acc);
                }
                float value = acc;
                if (bias) value = value + bias[n];
                if (scale != 1.0f) value = value * scale;
                float *out = y + r * y_stride + n;
                *out = accumulate ? *out + value : value;
            }
        }
    }
}
static size_t level_scratch_bytes(int fmt, int64_t M, int64_t G, int64_t block_octets) {
    (void)fmt, (void)M, (void)G, (void)block_octets;
    return 0;
}
#endif

/* Octets per unit of work: its weights stay in cache while every row of x
 * passes over them. */
#define BLOCK_OCTETS 4

/* Octets per block for this product: BLOCK_OCTETS, but one pair for q8_0
 * on AVX2 where a block of 4 would be too large to fetch the next one
 * ahead (NEXT_BLOCK_BYTES: q8_0 from 4096 inputs) and a second whole
 * pass of 4 rows, which does the fetching, runs over it. */
static int64_t block_octets_for(int fmt, int64_t M, int64_t G) {
#if TANDEM_SIMD == 1
    if (fmt == FMT_Q8_0 && M >= 2 * TILE_ROWS && BLOCK_OCTETS * G * octet_group_bytes(fmt) > NEXT_BLOCK_BYTES)
        return 2;
#else
    (void)fmt, (void)M, (void)G;
#endif
    return BLOCK_OCTETS;
}

/* y (+)= out_scale * out_op(op(x) @ W^T + bias), W packed. x rows are K
 * floats (2K for the gated inputs); out_op is an RMSNorm times out_norm
 * when that is given (a branch's output norm: Gemma), else nothing; `eps`
 * is both norms'. With `accumulate` the result is added to y (a residual
 * stream). */
int tandem_quant_gemm(int fmt, int64_t M, int64_t N, int64_t K, const float *x, int64_t x_stride,
                      const uint8_t *data, const uint16_t *scales, const uint16_t *mins, const float *bias,
                      float *y, int64_t y_stride, int threads, int input_op, const float *norm_weight, float eps,
                      int accumulate, const float *out_norm, float out_scale) {
    if (fmt < 0 || fmt >= FORMAT_COUNT || K % block_weights(fmt) != 0) return 1;
    if ((fmt == FMT_Q4_1) != (mins != NULL) || is_raw(fmt) != (scales == NULL)) return 1;
    if (input_op < 0 || input_op > 3 || (input_op == INPUT_RMS_NORM && norm_weight == NULL)) return 1;
    if (M <= 0 || N <= 0) return 0;
    const int k_quant = is_k_quant(fmt);
    const int64_t groups = K / block_weights(fmt);
    int8_t *xq = malloc((size_t)(M * K));
    float *xd = malloc((size_t)(M * groups) * sizeof(float));
    int32_t *xsum = k_quant ? NULL : malloc((size_t)(M * groups) * sizeof(int32_t));
    float *xs = k_quant ? NULL : malloc((size_t)(M * groups) * sizeof(float));
    int16_t *xsum16 = k_quant ? malloc((size_t)(M * K / 16) * sizeof(int16_t)) : NULL;
    float *prepared = input_op != INPUT_AS_IS ? malloc((size_t)(M * K) * sizeof(float)) : NULL;
    /* With an output norm the product goes to `branch` first: a row's norm
     * needs all of its columns. */
    float *branch = out_norm ? malloc((size_t)(M * N) * sizeof(float)) : NULL;
    if (!xq || !xd || (k_quant ? !xsum16 : !xsum || !xs) || (input_op != INPUT_AS_IS && !prepared) ||
        (out_norm && !branch)) {
        free(xq); free(xd); free(xsum); free(xs); free(xsum16); free(prepared); free(branch);
        return 2;
    }
    const PackedWeight w = {fmt, N, groups, data, scales, mins};
    const QuantizedRows rows = {xq, xd, xsum, xs, xsum16, K, groups};
    const int64_t octets = (N + OCTET - 1) / OCTET;
    const int64_t block_octets = block_octets_for(fmt, M, groups);
    const int64_t blocks = (octets + block_octets - 1) / block_octets;
    #pragma omp parallel num_threads(threads) if (threads > 1 && M * N * K >= (1 << 16))
    {
        #pragma omp for schedule(static)
        for (int64_t i0 = 0; i0 < M; i0 += 4) {
            const int rows = M - i0 < 4 ? (int)(M - i0) : 4;
            if (input_op != INPUT_AS_IS)
                prepare_rows(input_op, x + i0 * x_stride, x_stride, rows, K, norm_weight, eps, prepared + i0 * K);
            for (int64_t i = i0; i < i0 + rows; i++) {
                const float *row = input_op != INPUT_AS_IS ? prepared + i * K : x + i * x_stride;
                if (k_quant) quantize_row_super(row, K, xq + i * K, xd + i * groups, xsum16 + i * (K / 16));
                else quantize_row(row, K, xq + i * K, xd + i * groups, xsum + i * groups, xs + i * groups);
            }
        }
        /* Where the block's unpacked levels wait for the later passes; without it (no memory) each pass unpacks. */
        const size_t scratch = level_scratch_bytes(fmt, M, groups, block_octets);
        uint8_t *levels = scratch ? malloc(scratch) : NULL;
        /* nowait: the region's end waits for every thread anyway (a barrier
         * less, and its futex call, per product: ~120 a decode step). */
        #pragma omp for schedule(static) nowait
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t first = b * block_octets;
            const int64_t last = first + block_octets < octets ? first + block_octets : octets;
            if (branch) octets_product(&w, &rows, M, first, last, bias, 1.0f, branch, N, 0, levels);
            else octets_product(&w, &rows, M, first, last, bias, out_scale, y, y_stride, accumulate, levels);
        }
        free(levels);
        if (branch) {
            #pragma omp barrier
            #pragma omp for schedule(static) nowait
            for (int64_t i = 0; i < M; i++) {
                float *b = branch + i * N, *yi = y + i * y_stride;
                rms_norm_row(b, N, out_norm, eps, b);
                for (int64_t n = 0; n < N; n++) {
                    float value = out_scale != 1.0f ? b[n] * out_scale : b[n];
                    yi[n] = accumulate ? yi[n] + value : value;
                }
            }
        }
    }
    free(xq); free(xd); free(xsum); free(xs); free(xsum16); free(prepared); free(branch);
    return 0;
}

/* out[M, K] = op(x) for each row of x (its K inputs, 2K for the gated
 * ops), the input preparation of tandem_quant_gemm on its own: what the
 * tests compare with ggml's arithmetic. */
int tandem_prepare_rows(int input_op, int64_t M, int64_t K, const float *x, int64_t x_stride,
                        const float *norm_weight, float eps, float *out) {
    if (input_op < 1 || input_op > 3 || (input_op == INPUT_RMS_NORM && norm_weight == NULL)) return 1;
    for (int64_t i0 = 0; i0 < M; i0 += 4)
        prepare_rows(input_op, x + i0 * x_stride, x_stride, M - i0 < 4 ? (int)(M - i0) : 4, K, norm_weight, eps,
                     out + i0 * K);
    return 0;
}

/* Rows `index` of a packed table, dequantized (embedding lookups of a
 * table tied to the LM head). */
int tandem_quant_take_packed(int fmt, int64_t count, const int64_t *index, int64_t K, const uint8_t *data,
                             const uint16_t *scales, const uint16_t *mins, float *out) {
    if (fmt < 0 || fmt >= FORMAT_COUNT || K % block_weights(fmt) != 0) return 1;
    const int64_t bw = block_weights(fmt), G = K / bw, obytes = octet_group_bytes(fmt);
    #pragma omp parallel for schedule(static) if (count >= 256)
    for (int64_t r = 0; r < count; r++) {
        const int64_t n = index[r], octet = n / OCTET, c = n % OCTET;
        for (int64_t g = 0; g < G; g++) {
            const uint8_t *wg = data + (octet * G + g) * obytes;
            if (is_raw(fmt)) {
                uint8_t block[256];
                unpack_block(fmt, wg, (int)c, block);
                dequantize_raw_block(fmt, block, out + r * K + g * bw);
                continue;
            }
            const int64_t at = (octet * G + g) * OCTET + c;
            const float d = half_to_float(scales[at]);
            float *o = out + r * K + g * GROUP;
            if (fmt == FMT_Q8_0) {
                for (int j = 0; j < 8; j++)
                    for (int b = 0; b < 4; b++) o[4 * j + b] = d * (float)(int8_t)wg[j * 32 + c * 4 + b];
            } else {
                const float base = fmt == FMT_Q4_1 ? half_to_float(mins[at]) : -8.0f * d;
                for (int k = 0; k < 4; k++)
                    for (int b = 0; b < 4; b++) {
                        const uint8_t byte = wg[k * 32 + c * 4 + b];
                        o[4 * k + b] = d * (float)(byte & 0x0F) + base;
                        o[16 + 4 * k + b] = d * (float)(byte >> 4) + base;
                    }
            }
        }
    }
    return 0;
}

/* Rows `index` of a quantized table, dequantized (embedding lookups). */
int tandem_quant_take_rows(int fmt, int64_t count, const int64_t *index, int64_t K, const uint8_t *data,
                           const uint16_t *scales, const uint16_t *mins, float *out) {
    if (fmt < 0 || fmt >= FORMAT_COUNT || K % block_weights(fmt) != 0) return 1;
    const int64_t bw = block_weights(fmt), groups = K / bw;
    const int64_t row_bytes = is_raw(fmt) ? groups * RAW_BYTES[fmt] : fmt == FMT_Q8_0 ? K : K / 2;
    #pragma omp parallel for schedule(static) if (count >= 256)
    for (int64_t r = 0; r < count; r++) {
        const int64_t n = index[r];
        const uint8_t *w = data + n * row_bytes;
        if (is_raw(fmt)) {
            for (int64_t g = 0; g < groups; g++)
                dequantize_raw_block(fmt, w + g * RAW_BYTES[fmt], out + r * K + g * bw);
            continue;
        }
        for (int64_t g = 0; g < groups; g++) {
            float d = half_to_float(scales[n * groups + g]);
            float *o = out + r * K + g * GROUP;
            if (fmt == FMT_Q8_0) {
                for (int i = 0; i < GROUP; i++) o[i] = d * (float)((const int8_t *)w)[g * GROUP + i];
            } else {
                float base = fmt == FMT_Q4_1 ? half_to_float(mins[n * groups + g]) : -8.0f * d;
                const uint8_t *wg = w + g * (GROUP / 2);
                for (int i = 0; i < GROUP / 2; i++) {
                    o[i] = d * (float)(wg[i] & 0x0F) + base;
                    o[i + GROUP / 2] = d * (float)(wg[i] >> 4) + base;
                }
            }
        }
    }
    return 0;
}

/* The instruction set this build uses: 0 portable, 1 AVX2, 2 AVX-VNNI, 3 AVX-512 VNNI. */
int tandem_quant_simd(void) { return TANDEM_SIMD; }
