/*
 * Weight-only block-quantized matrix products for the CPU:
 * y[M, N] = x[M, K] @ W[N, K]^T (+ bias), W in one of engine/model/quant.py's
 * formats (q8_0, q4_0, q4_1: groups of 32 inputs, fp16 scales, GGML nibble
 * order), x and y float32.
 *
 * Each row of x is first quantized to int8 in groups of 32 with one float
 * scale per group (ggml's q8 activations), so a group's dot product is an
 * integer one: 32 multiply-adds in one AVX2 maddubs/madd pair, scaled once
 * by d_w * d_x. This reads 4.5-8.5 bits per weight instead of 32, and at a
 * decode step the weights' bytes are the cost.
 *
 * Every output element is one row of x against one row of W, reduced in
 * the same order whatever M is and however rows are split over threads, so
 * a row's result does not depend on the batch it arrives in.
 *
 * Built by engine/kernels/native/__init__.py with the platform's C compiler (OpenMP
 * resolves to the libgomp torch has already loaded); without AVX2 the
 * portable C below is used.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define TANDEM_AVX2 1
#else
#define TANDEM_AVX2 0
#endif

#define GROUP 32

enum { FMT_Q8_0 = 0, FMT_Q4_0 = 1, FMT_Q4_1 = 2 };

static inline float half_to_float(uint16_t h) {
#if TANDEM_AVX2
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

/* One row of x to int8 groups: q[K], scale[K/32], and scale * sum(q) per
 * group (what the q4 formats' offset terms multiply). */
static void quantize_row(const float *x, int64_t K, int8_t *q, float *scale, float *scaled_sum) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
        float amax = 0.0f;
        for (int i = 0; i < GROUP; i++) {
            float a = fabsf(xg[i]);
            amax = a > amax ? a : amax;
        }
        float d = amax / 127.0f;
        float inv = d > 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int i = 0; i < GROUP; i++) {
            int v = (int)lrintf(xg[i] * inv);
            v = v > 127 ? 127 : (v < -127 ? -127 : v);
            q[g * GROUP + i] = (int8_t)v;
            sum += v;
        }
        scale[g] = d;
        scaled_sum[g] = d * (float)sum;
    }
}

#if TANDEM_AVX2
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 nibbles of a GGML q4 group as bytes in input order: low nibbles are
 * inputs 0-15, high nibbles 16-31. */
static inline __m256i unpack_nibbles(const uint8_t *p) {
    __m128i raw = _mm_loadu_si128((const __m128i *)p);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

static inline __m256 group_dot_u8(__m256i w_unsigned, __m256i xq) {
    __m256i pairs = _mm256_maddubs_epi16(w_unsigned, xq);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#endif

/* Dot products of one quantized x row against W rows [n0, n1), written to
 * out[0 .. n1 - n0). */
static void rows_dot(int fmt, int64_t K, const uint8_t *data, const uint16_t *scales, const uint16_t *mins,
                     const int8_t *xq, const float *xd, const float *xs, int64_t n0, int64_t n1, float *out,
                     const float *bias) {
    const int64_t groups = K / GROUP;
    const int64_t row_bytes = fmt == FMT_Q8_0 ? K : K / 2;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *w = data + n * row_bytes;
        const uint16_t *d = scales + n * groups;
        float offset = 0.0f; /* the q4 formats' per-group constant terms */
#if TANDEM_AVX2
        const uint16_t *m = mins ? mins + n * groups : NULL;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        int64_t g = 0;
        for (; g + 1 < groups; g += 2) {
            __m256 p0, p1;
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq + g * GROUP));
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq + (g + 1) * GROUP));
            if (fmt == FMT_Q8_0) {
                const __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + g * GROUP));
                const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + (g + 1) * GROUP));
                p0 = group_dot_u8(_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(x0, w0));
                p1 = group_dot_u8(_mm256_sign_epi8(w1, w1), _mm256_sign_epi8(x1, w1));
            } else {
                p0 = group_dot_u8(unpack_nibbles(w + g * (GROUP / 2)), x0);
                p1 = group_dot_u8(unpack_nibbles(w + (g + 1) * (GROUP / 2)), x1);
            }
            const float d0 = half_to_float(d[g]), d1 = half_to_float(d[g + 1]);
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0 * xd[g]), p0, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1 * xd[g + 1]), p1, acc1);
            if (m) {
                offset += half_to_float(m[g]) * xs[g] + half_to_float(m[g + 1]) * xs[g + 1];
            } else if (fmt == FMT_Q4_0) {
                offset -= 8.0f * (d0 * xs[g] + d1 * xs[g + 1]);
            }
        }
        for (; g < groups; g++) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq + g * GROUP));
            __m256 p0;
            if (fmt == FMT_Q8_0) {
                const __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + g * GROUP));
                p0 = group_dot_u8(_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(x0, w0));
            } else {
                p0 = group_dot_u8(unpack_nibbles(w + g * (GROUP / 2)), x0);
            }
            const float d0 = half_to_float(d[g]);
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0 * xd[g]), p0, acc0);
            if (fmt != FMT_Q8_0) offset += m ? half_to_float(m[g]) * xs[g] : -8.0f * d0 * xs[g];
        }
        /* The next rows' weights, while this row's sums finish. */
        _mm_prefetch((const char *)(w + 2 * row_bytes), _MM_HINT_T0);
        float sum = hsum(_mm256_add_ps(acc0, acc1)) + offset;
#else
        float sum = 0.0f;
        for (int64_t g = 0; g < groups; g++) {
            const int8_t *xg = xq + g * GROUP;
            int dot = 0;
            if (fmt == FMT_Q8_0) {
                const int8_t *wg = (const int8_t *)w + g * GROUP;
                for (int i = 0; i < GROUP; i++) dot += wg[i] * xg[i];
            } else {
                const uint8_t *wg = w + g * (GROUP / 2);
                for (int i = 0; i < GROUP / 2; i++) {
                    dot += (wg[i] & 0x0F) * xg[i] + (wg[i] >> 4) * xg[i + GROUP / 2];
                }
            }
            float dw = half_to_float(d[g]);
            sum += dw * xd[g] * (float)dot;
            if (fmt == FMT_Q4_0) offset -= 8.0f * dw * xs[g];
            if (fmt == FMT_Q4_1) offset += half_to_float(mins[n * groups + g]) * xs[g];
        }
        sum += offset;
#endif
        out[n - n0] = bias ? sum + bias[n] : sum;
    }
}

#if TANDEM_AVX2
/* rows_dot for four x rows at once: each weight group is loaded and
 * unpacked once for all four. Every row's arithmetic (two accumulators on
 * alternate groups, the offset terms in pairs) is exactly rows_dot's, so a
 * row's result is the same bits whichever of the two computes it. */
static void rows_dot4(int fmt, int64_t K, const uint8_t *data, const uint16_t *scales, const uint16_t *mins,
                      const int8_t *const xq[4], const float *const xd[4], const float *const xs[4], int64_t n0,
                      int64_t n1, float *const out[4], const float *bias) {
    const int64_t groups = K / GROUP;
    const int64_t row_bytes = fmt == FMT_Q8_0 ? K : K / 2;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *w = data + n * row_bytes;
        const uint16_t *d = scales + n * groups;
        const uint16_t *m = mins ? mins + n * groups : NULL;
        __m256 acc0[4], acc1[4];
        float offset[4];
        for (int r = 0; r < 4; r++) {
            acc0[r] = _mm256_setzero_ps();
            acc1[r] = _mm256_setzero_ps();
            offset[r] = 0.0f;
        }
        int64_t g = 0;
        for (; g + 1 < groups; g += 2) {
            const float d0 = half_to_float(d[g]), d1 = half_to_float(d[g + 1]);
            if (fmt == FMT_Q8_0) {
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + g * GROUP));
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + (g + 1) * GROUP));
                __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);
                for (int r = 0; r < 4; r++) {
                    __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq[r] + g * GROUP));
                    __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq[r] + (g + 1) * GROUP));
                    __m256 p0 = group_dot_u8(a0, _mm256_sign_epi8(x0, w0));
                    __m256 p1 = group_dot_u8(a1, _mm256_sign_epi8(x1, w1));
                    acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * xd[r][g]), p0, acc0[r]);
                    acc1[r] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * xd[r][g + 1]), p1, acc1[r]);
                }
            } else {
                __m256i w0 = unpack_nibbles(w + g * (GROUP / 2));
                __m256i w1 = unpack_nibbles(w + (g + 1) * (GROUP / 2));
                const float m0 = m ? half_to_float(m[g]) : 0.0f, m1 = m ? half_to_float(m[g + 1]) : 0.0f;
                for (int r = 0; r < 4; r++) {
                    __m256 p0 = group_dot_u8(w0, _mm256_loadu_si256((const __m256i *)(xq[r] + g * GROUP)));
                    __m256 p1 = group_dot_u8(w1, _mm256_loadu_si256((const __m256i *)(xq[r] + (g + 1) * GROUP)));
                    acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * xd[r][g]), p0, acc0[r]);
                    acc1[r] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * xd[r][g + 1]), p1, acc1[r]);
                    if (m) {
                        offset[r] += m0 * xs[r][g] + m1 * xs[r][g + 1];
                    } else {
                        offset[r] -= 8.0f * (d0 * xs[r][g] + d1 * xs[r][g + 1]);
                    }
                }
            }
        }
        for (; g < groups; g++) {
            const float d0 = half_to_float(d[g]);
            if (fmt == FMT_Q8_0) {
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + g * GROUP));
                __m256i a0 = _mm256_sign_epi8(w0, w0);
                for (int r = 0; r < 4; r++) {
                    __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq[r] + g * GROUP));
                    __m256 p0 = group_dot_u8(a0, _mm256_sign_epi8(x0, w0));
                    acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * xd[r][g]), p0, acc0[r]);
                }
            } else {
                __m256i w0 = unpack_nibbles(w + g * (GROUP / 2));
                for (int r = 0; r < 4; r++) {
                    __m256 p0 = group_dot_u8(w0, _mm256_loadu_si256((const __m256i *)(xq[r] + g * GROUP)));
                    acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * xd[r][g]), p0, acc0[r]);
                    offset[r] += m ? half_to_float(m[g]) * xs[r][g] : -8.0f * d0 * xs[r][g];
                }
            }
        }
        for (int r = 0; r < 4; r++) {
            float sum = hsum(_mm256_add_ps(acc0[r], acc1[r])) + offset[r];
            out[r][n - n0] = bias ? sum + bias[n] : sum;
        }
    }
}
#endif

/* Rows of W per unit of work: a block's weights stay in cache while every
 * row of x passes over them. */
#define ROW_BLOCK 16

/* What is done to a row of x before the product (fused so that a decode
 * step pays one call, not three or four small torch ops, per product). */
enum { INPUT_AS_IS = 0, INPUT_RMS_NORM = 1, INPUT_SWIGLU = 2 };

static void prepare_row(int input_op, const float *x, int64_t K, const float *norm_weight, float eps, float *out) {
    if (input_op == INPUT_RMS_NORM) {
        double squares = 0.0;
        for (int64_t k = 0; k < K; k++) squares += (double)x[k] * x[k];
        float inv = 1.0f / sqrtf((float)(squares / (double)K) + eps);
        for (int64_t k = 0; k < K; k++) out[k] = x[k] * inv * norm_weight[k];
    } else { /* INPUT_SWIGLU: x holds gate then up, K each */
        for (int64_t k = 0; k < K; k++) {
            float gate = x[k];
            out[k] = gate / (1.0f + expf(-gate)) * x[K + k];
        }
    }
}

/* y (+)= op(x) @ W^T + bias. x rows are K floats (2K for INPUT_SWIGLU);
 * with `accumulate` the product is added to y (a residual stream). */
int tandem_quant_matmul_ex(int fmt, int64_t M, int64_t N, int64_t K, const float *x, int64_t x_stride,
                           const uint8_t *data, const uint16_t *scales, const uint16_t *mins, const float *bias,
                           float *y, int64_t y_stride, int threads, int input_op, const float *norm_weight,
                           float eps, int accumulate) {
    if (K % GROUP != 0 || (fmt == FMT_Q4_1) != (mins != NULL) || fmt < 0 || fmt > 2) return 1;
    if (input_op < 0 || input_op > 2 || (input_op == INPUT_RMS_NORM && norm_weight == NULL)) return 1;
    const int64_t groups = K / GROUP;
    int8_t *xq = malloc((size_t)(M * K));
    float *xd = malloc((size_t)(M * groups) * sizeof(float));
    float *xs = malloc((size_t)(M * groups) * sizeof(float));
    float *prepared = input_op != INPUT_AS_IS ? malloc((size_t)(M * K) * sizeof(float)) : NULL;
    if (!xq || !xd || !xs || (input_op != INPUT_AS_IS && !prepared)) {
        free(xq); free(xd); free(xs); free(prepared);
        return 2;
    }
    const int64_t blocks = (N + ROW_BLOCK - 1) / ROW_BLOCK;
    #pragma omp parallel num_threads(threads) if (threads > 1 && M * N * K >= (1 << 16))
    {
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < M; i++) {
            const float *row = x + i * x_stride;
            if (input_op != INPUT_AS_IS) {
                prepare_row(input_op, row, K, norm_weight, eps, prepared + i * K);
                row = prepared + i * K;
            }
            quantize_row(row, K, xq + i * K, xd + i * groups, xs + i * groups);
        }
        float block_out[ROW_BLOCK];
        #pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            int64_t n0 = b * ROW_BLOCK, n1 = n0 + ROW_BLOCK < N ? n0 + ROW_BLOCK : N;
            int64_t i = 0;
#if TANDEM_AVX2
            for (; i + 4 <= M; i += 4) {
                float *outs[4];
                const int8_t *q4[4];
                const float *d4[4], *s4[4];
                float local[4][ROW_BLOCK];
                for (int r = 0; r < 4; r++) {
                    outs[r] = accumulate ? local[r] : y + (i + r) * y_stride + n0;
                    q4[r] = xq + (i + r) * K;
                    d4[r] = xd + (i + r) * groups;
                    s4[r] = xs + (i + r) * groups;
                }
                rows_dot4(fmt, K, data, scales, mins, q4, d4, s4, n0, n1, outs, bias);
                if (accumulate) {
                    for (int r = 0; r < 4; r++) {
                        float *row = y + (i + r) * y_stride;
                        for (int64_t n = n0; n < n1; n++) row[n] += local[r][n - n0];
                    }
                }
            }
#endif
            for (; i < M; i++) {
                float *out = y + i * y_stride;
                if (!accumulate) {
                    rows_dot(fmt, K, data, scales, mins, xq + i * K, xd + i * groups, xs + i * groups, n0, n1,
                             out + n0, bias);
                } else {
                    rows_dot(fmt, K, data, scales, mins, xq + i * K, xd + i * groups, xs + i * groups, n0, n1,
                             block_out, bias);
                    for (int64_t n = n0; n < n1; n++) out[n] += block_out[n - n0];
                }
            }
        }
    }
    free(xq); free(xd); free(xs); free(prepared);
    return 0;
}

/* Rows `index` of a quantized table, dequantized (embedding lookups). */
int tandem_quant_take_rows(int fmt, int64_t count, const int64_t *index, int64_t K, const uint8_t *data,
                           const uint16_t *scales, const uint16_t *mins, float *out) {
    if (K % GROUP != 0) return 1;
    const int64_t groups = K / GROUP;
    const int64_t row_bytes = fmt == FMT_Q8_0 ? K : K / 2;
    #pragma omp parallel for schedule(static) if (count >= 256)
    for (int64_t r = 0; r < count; r++) {
        const int64_t n = index[r];
        const uint8_t *w = data + n * row_bytes;
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

/* op(x) (INPUT_AS_IS, INPUT_RMS_NORM, INPUT_SWIGLU), optionally rounded
 * as the kernels round their inputs: what a float GEMM with the dequantized
 * weight takes to compute the kernels' product up to summation order. */
int tandem_prepare_inputs(int64_t M, int64_t K, const float *x, int64_t x_stride, int input_op,
                          const float *norm_weight, float eps, int round_to_int8, float *out) {
    if (input_op < 0 || input_op > 2 || (input_op == INPUT_RMS_NORM && norm_weight == NULL)) return 1;
    if (round_to_int8 && K % GROUP != 0) return 1;
    #pragma omp parallel if (M * K >= (1 << 16))
    {
        int8_t q[GROUP];
        float scale, scaled_sum;
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < M; i++) {
            float *row = out + i * K;
            if (input_op == INPUT_AS_IS) {
                for (int64_t k = 0; k < K; k++) row[k] = x[i * x_stride + k];
            } else {
                prepare_row(input_op, x + i * x_stride, K, norm_weight, eps, row);
            }
            if (round_to_int8) {
                for (int64_t g = 0; g < K / GROUP; g++) {
                    quantize_row(row + g * GROUP, GROUP, q, &scale, &scaled_sum);
                    for (int j = 0; j < GROUP; j++) row[g * GROUP + j] = scale * (float)q[j];
                }
            }
        }
    }
    return 0;
}

int tandem_quant_simd(void) { return TANDEM_AVX2; }
