/*
 * Weight-only block-quantized matrix products for the CPU:
 * y[M, N] = x[M, K] @ W[N, K]^T (+ bias), W in one of engine/model/quant.py's
 * formats (q8_0, q4_0, q4_1: groups of 32 inputs, fp16 scales, GGML nibble
 * order), x and y float32.
 *
 * Each row of x is first quantized to int8 in groups of 32 with one float
 * scale per group (ggml's q8 activations), so a group's dot product is an
 * integer one. Every output element is then, whatever the step's size, the
 * thread split or the instruction set:
 *
 *     acc = 0
 *     for each group g, in order:
 *         P   = sum of w[i] * x[i] over the group's 32 inputs   (exact, int32;
 *               q4_0 counts w as q - 8)
 *         acc = fma(d_w[g] * d_x[g], (float)P, acc)
 *         q4_1: acc = fma(m_w[g], d_x[g] * sum(x_q[g]), acc)
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
 * mins) as fp16.
 *
 * Built by engine/kernels/native/__init__.py in variants (portable, avx2,
 * avx512vnni) chosen at run time by the CPU's features; OpenMP resolves to
 * the libgomp torch has already loaded.
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

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

enum { FMT_Q8_0 = 0, FMT_Q4_0 = 1, FMT_Q4_1 = 2 };

static inline float half_to_float(uint16_t h) {
#if TANDEM_SIMD
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

/* One row of x to int8 groups: q[K], scale[K/32], the sum of each group's
 * levels, and scale * that sum (what the q4_1 mins multiply). */
static void quantize_row(const float *x, int64_t K, int8_t *q, float *scale, int32_t *level_sum, float *scaled_sum) {
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
        level_sum[g] = sum;
        scaled_sum[g] = d * (float)sum;
    }
}

/* What is done to a row of x before the product (fused so that a decode
 * step pays one call, not three or four small torch ops, per product). */
enum { INPUT_AS_IS = 0, INPUT_RMS_NORM = 1, INPUT_SWIGLU = 2, INPUT_GEGLU = 3 };

/* out = x / rms(x) * weight over n inputs: the sum of squares in double,
 * in order (the same bits in every build). */
static void rms_norm_row(const float *x, int64_t n, const float *weight, float eps, float *out) {
    double squares = 0.0;
    for (int64_t k = 0; k < n; k++) squares += (double)x[k] * x[k];
    float inv = 1.0f / sqrtf((float)(squares / (double)n) + eps);
    for (int64_t k = 0; k < n; k++) out[k] = x[k] * inv * weight[k];
}

static void prepare_row(int input_op, const float *x, int64_t K, const float *norm_weight, float eps, float *out) {
    if (input_op == INPUT_RMS_NORM) {
        rms_norm_row(x, K, norm_weight, eps, out);
    } else if (input_op == INPUT_SWIGLU) { /* x holds gate then up, K each */
        for (int64_t k = 0; k < K; k++) {
            float gate = x[k];
            out[k] = gate / (1.0f + expf(-gate)) * x[K + k];
        }
    } else { /* INPUT_GEGLU: gelu(gate) * up, GELU's tanh form (Gemma) */
        for (int64_t k = 0; k < K; k++) {
            float gate = x[k];
            float inner = 0.7978845608028654f * (gate + 0.044715f * gate * gate * gate);
            out[k] = 0.5f * gate * (1.0f + tanhf(inner)) * x[K + k];
        }
    }
}

/* The quantized rows of x a product reads. */
typedef struct {
    const int8_t *q;     /* [M, K] */
    const float *d;      /* [M, G] */
    const int32_t *sum;  /* [M, G] */
    const float *dsum;   /* [M, G] */
    int64_t K, G;
} QuantizedRows;

/* One weight in the packed layout. */
typedef struct {
    int fmt;
    int64_t N, G;
    const uint8_t *data;    /* [octets, G, 8 * bytes per row group] */
    const uint16_t *scales; /* [octets, G, 8] */
    const uint16_t *mins;   /* [octets, G, 8] or NULL */
} PackedWeight;

static inline int64_t octet_group_bytes(int fmt) { return fmt == FMT_Q8_0 ? OCTET * GROUP : OCTET * GROUP / 2; }

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

#if TANDEM_SIMD == 3
#define TILE_ROWS 4
#define TILE_OCTETS 2
#else
#define TILE_ROWS 4
#define TILE_OCTETS 1
#endif

/* acc[r][o] (8 columns each) for MR rows of x and NO octets starting at
 * `octet`, over every group: the formula at the top of this file, one
 * column per lane. MR and NO are constants at each call site, so the
 * arrays below live in registers. */
static inline __attribute__((always_inline)) void tile(const PackedWeight *w, const QuantizedRows *x, int64_t r0,
                                                       int64_t octet, const int MR, const int NO, __m256 acc[4][2]) {
    const int64_t G = w->G, obytes = octet_group_bytes(w->fmt);
    const uint8_t *base[2];
    const uint16_t *scales[2], *mins[2];
    for (int o = 0; o < NO; o++) {
        base[o] = w->data + (octet + o) * G * obytes;
        scales[o] = w->scales + (octet + o) * G * OCTET;
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
        __m256i p[4][2], q[4][2];
        for (int r = 0; r < MR; r++)
            for (int o = 0; o < NO; o++) p[r][o] = q[r][o] = _mm256_setzero_si256();
        if (w->fmt == FMT_Q8_0) {
            for (int j = 0; j < 8; j++) {
                __m256i wv[2], wabs[2];
                for (int o = 0; o < NO; o++) {
                    wv[o] = _mm256_loadu_si256((const __m256i *)(base[o] + g * obytes + j * 32));
                    wabs[o] = _mm256_sign_epi8(wv[o], wv[o]);
                }
                for (int r = 0; r < MR; r++) {
                    const __m256i xb = _mm256_set1_epi32(load_piece(x->q + (r0 + r) * x->K + g * GROUP + 4 * j));
                    for (int o = 0; o < NO; o++) {
                        const __m256i signed_x = _mm256_sign_epi8(xb, wv[o]);
                        if (split && (j & 1)) q[r][o] = dot_u8s8(q[r][o], wabs[o], signed_x);
                        else p[r][o] = dot_u8s8(p[r][o], wabs[o], signed_x);
                    }
                }
            }
        } else {
#if TANDEM_SIMD == 1
            /* maddubs pairs summed as int16 over the whole group: 16
             * products of at most 15 * 127 per lane, no overflow. */
            __m256i h[4][2];
            for (int r = 0; r < MR; r++)
                for (int o = 0; o < NO; o++) h[r][o] = _mm256_setzero_si256();
#endif
            for (int k = 0; k < 4; k++) {
                __m256i lo[2], hi[2];
                for (int o = 0; o < NO; o++) {
                    const __m256i raw = _mm256_loadu_si256((const __m256i *)(base[o] + g * obytes + k * 32));
                    lo[o] = _mm256_and_si256(raw, low4);
                    hi[o] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
                }
                for (int r = 0; r < MR; r++) {
                    const int8_t *xg = x->q + (r0 + r) * x->K + g * GROUP;
                    const __m256i xl = _mm256_set1_epi32(load_piece(xg + 4 * k));
                    const __m256i xh = _mm256_set1_epi32(load_piece(xg + 16 + 4 * k));
                    for (int o = 0; o < NO; o++) {
#if TANDEM_SIMD == 1
                        h[r][o] = _mm256_add_epi16(h[r][o], _mm256_maddubs_epi16(lo[o], xl));
                        h[r][o] = _mm256_add_epi16(h[r][o], _mm256_maddubs_epi16(hi[o], xh));
#else
                        p[r][o] = dot_u8s8(p[r][o], lo[o], xl);
                        if (split) q[r][o] = dot_u8s8(q[r][o], hi[o], xh);
                        else p[r][o] = dot_u8s8(p[r][o], hi[o], xh);
#endif
                    }
                }
            }
#if TANDEM_SIMD == 1
            for (int r = 0; r < MR; r++)
                for (int o = 0; o < NO; o++) p[r][o] = _mm256_madd_epi16(h[r][o], _mm256_set1_epi16(1));
#endif
        }
        __m256 dw[2], mw[2];
        for (int o = 0; o < NO; o++) {
            dw[o] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales[o] + g * OCTET)));
            if (w->fmt == FMT_Q4_1) mw[o] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mins[o] + g * OCTET)));
        }
        for (int r = 0; r < MR; r++) {
            const int64_t at = (r0 + r) * G + g;
            const __m256 dx = _mm256_set1_ps(x->d[at]);
            for (int o = 0; o < NO; o++) {
                __m256i P = split ? _mm256_add_epi32(p[r][o], q[r][o]) : p[r][o];
                if (w->fmt == FMT_Q4_0) P = _mm256_sub_epi32(P, _mm256_set1_epi32(8 * x->sum[at]));
                acc[r][o] = _mm256_fmadd_ps(_mm256_mul_ps(dw[o], dx), _mm256_cvtepi32_ps(P), acc[r][o]);
                if (w->fmt == FMT_Q4_1) acc[r][o] = _mm256_fmadd_ps(mw[o], _mm256_set1_ps(x->dsum[at]), acc[r][o]);
            }
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
        tile(w, x, r0, octet, MR, NO, acc);                                                        \
        for (int r = 0; r < MR; r++)                                                               \
            for (int o = 0; o < NO; o++)                                                           \
                finish(acc[r][o], bias, scale, (octet + o) * OCTET, w->N, y + (r0 + r) * y_stride, accumulate); \
    } while (0)

static void octets_product(const PackedWeight *w, const QuantizedRows *x, int64_t M, int64_t first, int64_t last,
                           const float *bias, float scale, float *y, int64_t y_stride, int accumulate) {
    for (int64_t r0 = 0; r0 < M; r0 += TILE_ROWS) {
        const int64_t mr = M - r0 < TILE_ROWS ? M - r0 : TILE_ROWS;
        int64_t octet = first;
#if TILE_OCTETS == 2
        /* Two octets per tile where that measured faster: 4-bit weights and
         * more than one row (bench/quant_kernels.py; for q8_0's larger
         * pieces and for a single row, one octet streams the weights
         * better). */
        for (; w->fmt != FMT_Q8_0 && mr > 1 && octet + 2 <= last; octet += 2) {
            switch (mr) {
            case 4: TILE_CASE(4, 2); break;
            case 3: TILE_CASE(3, 2); break;
            case 2: TILE_CASE(2, 2); break;
            default: TILE_CASE(1, 2); break;
            }
        }
#endif
        for (; octet < last; octet++) {
            switch (mr) {
            case 4: TILE_CASE(4, 1); break;
            case 3: TILE_CASE(3, 1); break;
            case 2: TILE_CASE(2, 1); break;
            default: TILE_CASE(1, 1); break;
            }
        }
    }
}

#else /* portable C: the same formula, element by element */

static void octets_product(const PackedWeight *w, const QuantizedRows *x, int64_t M, int64_t first, int64_t last,
                           const float *bias, float scale, float *y, int64_t y_stride, int accumulate) {
    const int64_t G = w->G, obytes = octet_group_bytes(w->fmt);
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
#endif

/* Octets per unit of work: its weights stay in cache while every row of x
 * passes over them. */
#define BLOCK_OCTETS 4

/* y (+)= out_scale * out_op(op(x) @ W^T + bias), W packed. x rows are K
 * floats (2K for the gated inputs); out_op is an RMSNorm times out_norm
 * when that is given (a branch's output norm: Gemma), else nothing; `eps`
 * is both norms'. With `accumulate` the result is added to y (a residual
 * stream). */
int tandem_quant_gemm(int fmt, int64_t M, int64_t N, int64_t K, const float *x, int64_t x_stride,
                      const uint8_t *data, const uint16_t *scales, const uint16_t *mins, const float *bias,
                      float *y, int64_t y_stride, int threads, int input_op, const float *norm_weight, float eps,
                      int accumulate, const float *out_norm, float out_scale) {
    if (K % GROUP != 0 || (fmt == FMT_Q4_1) != (mins != NULL) || fmt < 0 || fmt > 2) return 1;
    if (input_op < 0 || input_op > 3 || (input_op == INPUT_RMS_NORM && norm_weight == NULL)) return 1;
    if (M <= 0 || N <= 0) return 0;
    const int64_t groups = K / GROUP;
    int8_t *xq = malloc((size_t)(M * K));
    float *xd = malloc((size_t)(M * groups) * sizeof(float));
    int32_t *xsum = malloc((size_t)(M * groups) * sizeof(int32_t));
    float *xs = malloc((size_t)(M * groups) * sizeof(float));
    float *prepared = input_op != INPUT_AS_IS ? malloc((size_t)(M * K) * sizeof(float)) : NULL;
    /* With an output norm the product goes to `branch` first: a row's norm
     * needs all of its columns. */
    float *branch = out_norm ? malloc((size_t)(M * N) * sizeof(float)) : NULL;
    if (!xq || !xd || !xsum || !xs || (input_op != INPUT_AS_IS && !prepared) || (out_norm && !branch)) {
        free(xq); free(xd); free(xsum); free(xs); free(prepared); free(branch);
        return 2;
    }
    const PackedWeight w = {fmt, N, groups, data, scales, mins};
    const QuantizedRows rows = {xq, xd, xsum, xs, K, groups};
    const int64_t octets = (N + OCTET - 1) / OCTET;
    const int64_t blocks = (octets + BLOCK_OCTETS - 1) / BLOCK_OCTETS;
    #pragma omp parallel num_threads(threads) if (threads > 1 && M * N * K >= (1 << 16))
    {
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < M; i++) {
            const float *row = x + i * x_stride;
            if (input_op != INPUT_AS_IS) {
                prepare_row(input_op, row, K, norm_weight, eps, prepared + i * K);
                row = prepared + i * K;
            }
            quantize_row(row, K, xq + i * K, xd + i * groups, xsum + i * groups, xs + i * groups);
        }
        #pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t first = b * BLOCK_OCTETS;
            const int64_t last = first + BLOCK_OCTETS < octets ? first + BLOCK_OCTETS : octets;
            if (branch) octets_product(&w, &rows, M, first, last, bias, 1.0f, branch, N, 0);
            else octets_product(&w, &rows, M, first, last, bias, out_scale, y, y_stride, accumulate);
        }
        if (branch) {
            #pragma omp for schedule(static)
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
    free(xq); free(xd); free(xsum); free(xs); free(prepared); free(branch);
    return 0;
}

/* Rows `index` of a packed table, dequantized (embedding lookups of a
 * table tied to the LM head). */
int tandem_quant_take_packed(int fmt, int64_t count, const int64_t *index, int64_t K, const uint8_t *data,
                             const uint16_t *scales, const uint16_t *mins, float *out) {
    if (K % GROUP != 0) return 1;
    const int64_t G = K / GROUP, obytes = octet_group_bytes(fmt);
    #pragma omp parallel for schedule(static) if (count >= 256)
    for (int64_t r = 0; r < count; r++) {
        const int64_t n = index[r], octet = n / OCTET, c = n % OCTET;
        for (int64_t g = 0; g < G; g++) {
            const uint8_t *wg = data + (octet * G + g) * obytes;
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

/* The instruction set this build uses: 0 portable, 1 AVX2, 2 AVX-VNNI, 3 AVX-512 VNNI. */
int tandem_quant_simd(void) { return TANDEM_SIMD; }
