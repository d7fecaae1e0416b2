/*
 * Attention on the CPU over the paged KV cache, for every token of a step
 * (decodes and prefill chunks alike): normalise q and k per head where the
 * family does (Qwen3, Gemma 3), rotate them (RoPE, Hugging Face's
 * rotate-half layout) and write k and v into the cache
 * (tandem_rope_write_kv), then attend each query row over its sequence's
 * pages in place (tandem_paged_attention).
 *
 * Each (token, head) is computed alone, in one order of arithmetic, from
 * the keys and values of its own positions: a token's attention has the
 * same bits whether it is a decode, one row of a prefill chunk of any size,
 * or recomputed after a preemption. With the products' kernels
 * (quant_matmul.c), that makes a reply independent of what else is in its
 * steps and of how its prompt was chunked or cached.
 *
 * Cache layout (engine.model.kv_cache.KVCache, one layer): [pages *
 * kv_heads, page_size, head_dim], float32 or (`kv_half`) fp16 as llama.cpp
 * keeps it: half the memory, and half the bytes attention reads per key,
 * which at a batch's contexts comes from memory rather than cache. A key
 * or value is rounded to fp16 once, when written; read back it is exact
 * in float32, and the arithmetic after is the same for both. Head h of
 * page p is row p * kv_heads + h.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "half.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ATTENTION_SIMD 1
#else
#define ATTENTION_SIMD 0
#endif

/* Element i of a cache row (float32, or fp16 where `half`), as float. */
static inline float cache_at(const void *row, int64_t i, const int half) {
    return half ? half_to_float(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

#if ATTENTION_SIMD
/* Elements i..i+7 of a cache row, as floats. */
static inline __m256 cache_load8(const void *row, int64_t i, const int half) {
    if (half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    return _mm256_loadu_ps((const float *)row + i);
}
#endif

/* A row of D floats into the cache (rounded to fp16 where `half`). */
static inline void cache_store(void *row, const float *src, int64_t D, const int half) {
    if (!half) {
        memcpy(row, src, (size_t)D * sizeof(float));
        return;
    }
    uint16_t *out = row;
    int64_t i = 0;
#if ATTENTION_SIMD
    for (; i + 8 <= D; i += 8)
        _mm_storeu_si128((__m128i *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < D; i++) out[i] = float_to_half(src[i]);
}

/* x = x / rms(x) * weight over one head (Qwen3's and Gemma 3's q/k norms),
 * the sum of squares in double, in order. */
static void head_rms_norm(float *x, const float *weight, int64_t D, float eps) {
    double squares = 0.0;
    for (int64_t i = 0; i < D; i++) squares += (double)x[i] * x[i];
    const float inv = 1.0f / sqrtf((float)(squares / (double)D) + eps);
    for (int64_t i = 0; i < D; i++) x[i] = x[i] * inv * weight[i];
}

/* RoPE on the leading R dimensions of a head (all but for partial rotary,
 * Phi-4-mini); the rest pass through. */
static void rotate_half(float *x, const float *cos, const float *sin, int64_t R) {
    const int64_t half = R / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* The arithmetic of one score and one softmax weight, in an order every
 * build follows exactly (the portable C spells out what the SIMD lanes
 * do), so attention has the same bits from every build, as the products
 * do.
 *
 * dot(q, k): lane l (0..7) sums q[i] * k[i] over i = l, l + 8, ... by fma,
 * then the lanes add as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)),
 * then any tail of n % 8 adds in order. That tree is what the 8-key
 * transposing reduction of the AVX2 build computes per key. */
static inline float lane_tree(const float l[8]) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

static inline float dot(const float *a, const void *key, int64_t n, const int half) {
    int64_t i = 0;
    float lane[8];
#if ATTENTION_SIMD
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), cache_load8(key, i, half), acc);
    _mm256_storeu_ps(lane, acc);
#else
    for (int l = 0; l < 8; l++) lane[l] = 0.0f;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lane[l] = fmaf(a[i + l], cache_at(key, i + l, half), lane[l]);
#endif
    float s = lane_tree(lane);
    for (; i < n; i++) s += a[i] * cache_at(key, i, half);
    return s;
}

/* e^x for x <= 0 (softmax weights), by one fixed sequence of float
 * operations: x = n ln2 + r (Cody-Waite, n = round(x / ln2)), e^r by a
 * degree-6 polynomial (error under 2e-7 relative), times 2^n. Below -87
 * it is e^-87 (~1.6e-38): a weight too small to matter, kept normal. */
#define EXP_LOWEST -87.0f
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f

static inline float exp_fixed(float x) {
    x = x < EXP_LOWEST ? EXP_LOWEST : x;
    const float n = rintf(x * LOG2E);
    float r = fmaf(n, -LN2_HI, x);
    r = fmaf(n, -LN2_LO, r);
    float p = 1.0f / 720.0f;
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#if ATTENTION_SIMD
static inline __m256 exp_fixed8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LOWEST));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

/* Four keys' lane sums (lanes 0..7 each) reduced by lane_tree's tree, one
 * score per lane: hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7,
 * b4+b5, b6+b7], twice gives [k0 (01+23), k1, k2, k3 | k0 (45+67), ...],
 * and the halves add. */
static inline __m128 key_sums4(const __m256 a[4]) {
    const __m256 g = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    return _mm_add_ps(_mm256_castps256_ps128(g), _mm256_extractf128_ps(g, 1));
}

/* dot() of q with 8 keys at once: the same lanes, the same tree. Needs
 * n % 8 == 0. */
static inline __m256 dot8(const float *q, const void *const key[8], int64_t n, const int half) {
    __m256 acc[8];
    for (int k = 0; k < 8; k++) acc[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        for (int k = 0; k < 8; k++) acc[k] = _mm256_fmadd_ps(qv, cache_load8(key[k], i, half), acc[k]);
    }
    return _mm256_set_m128(key_sums4(acc + 4), key_sums4(acc));
}

/* dot() of two query rows with 4 keys: each key's 8 dimensions converted
 * (fp16) and loaded once for both rows, 8 chains; the same bits as dot8. */
static inline void dot4x2(const float *q0, const float *q1, const void *const key[4], int64_t n, const int half,
                          __m128 *s0, __m128 *s1) {
    __m256 a0[4], a1[4];
    for (int k = 0; k < 4; k++) a0[k] = a1[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        __m256 kv[4];
        for (int k = 0; k < 4; k++) kv[k] = cache_load8(key[k], i, half);
        const __m256 qa = _mm256_loadu_ps(q0 + i), qb = _mm256_loadu_ps(q1 + i);
        for (int k = 0; k < 4; k++) {
            a0[k] = _mm256_fmadd_ps(qa, kv[k], a0[k]);
            a1[k] = _mm256_fmadd_ps(qb, kv[k], a1[k]);
        }
    }
    *s0 = key_sums4(a0);
    *s1 = key_sums4(a1);
}
#endif

/* Every row of qkv: q and k normalised per head (when q_norm and k_norm
 * are given, [D] each) and their first R dimensions rotated in place (the
 * tables are [positions, R]), k and v written to the cache rows
 * write_rows[t * Hkv + h] (in a layer's [rows * page_size, head_dim] view,
 * engine.model.attention.AttentionMetadata's write_index). */
int tandem_rope_write_kv(int64_t T, int64_t Hq, int64_t Hkv, int64_t D, float *qkv, int64_t qkv_stride,
                         const float *cos_table, const float *sin_table, const int64_t *positions,
                         void *k_layer, void *v_layer, const int64_t *write_rows, int threads,
                         const float *q_norm, const float *k_norm, float eps, int64_t R, int kv_half) {
    if (R % 2 != 0 || R <= 0 || R > D || (q_norm == NULL) != (k_norm == NULL) || (kv_half & ~1)) return 1;
    const int64_t row_bytes = D * (kv_half ? 2 : 4);
    /* Threads from 16k values a step (Qwen3's 24 heads of 128 at 16 rows:
     * alone, the other thread waited through it, ~1% of a step). */
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && T * (Hq + Hkv) * D >= (1 << 14))
    for (int64_t t = 0; t < T; t++) {
        float *row = qkv + t * qkv_stride;
        const float *cos = cos_table + positions[t] * R, *sin = sin_table + positions[t] * R;
        if (q_norm)
            for (int64_t h = 0; h < Hq + Hkv; h++) head_rms_norm(row + h * D, h < Hq ? q_norm : k_norm, D, eps);
        for (int64_t h = 0; h < Hq + Hkv; h++) rotate_half(row + h * D, cos, sin, R);
        for (int64_t h = 0; h < Hkv; h++) {
            const int64_t at = write_rows[t * Hkv + h] * row_bytes;
            cache_store((char *)k_layer + at, row + (Hq + h) * D, D, kv_half);
            cache_store((char *)v_layer + at, row + (Hq + Hkv + h) * D, D, kv_half);
        }
    }
    return 0;
}

/* Softmax weights of one query row against keys [first, length): the
 * scaled dot products (dot(), or dot8() eight keys at a time: the same
 * bits), capped to softcap * tanh(s / softcap) where softcap > 0 (Gemma 2),
 * exp_fixed() of each minus their maximum, each divided by their total
 * summed in key order. Into scores[first .. length). `rows` query rows of
 * one GQA group share the keys, so each block of keys is read once for all
 * of them; every row's arithmetic is its own. */
static inline __attribute__((always_inline)) void softmax_weights(const float *const q[], int rows,
                                                                  const void *const *key, int64_t D, int64_t first,
                                                                  int64_t length, float scale, float softcap,
                                                                  float *const scores[], const int half) {
    /* Blocks of 8 keys for every row first (rows in pairs: each key read
     * once per pair), then each row's tail and softmax. */
    int64_t blocks_end = first;
    float tops[64];
#if ATTENTION_SIMD
    if (D % 8 == 0) {
        __m256 top8[64];
        for (int r = 0; r < rows; r++) top8[r] = _mm256_set1_ps(-INFINITY);
        const __m256 scale8 = _mm256_set1_ps(scale);
        for (; blocks_end + 8 <= length; blocks_end += 8) {
            const void *const *keys = key + blocks_end;
            int r = 0;
            for (; r + 2 <= rows; r += 2) {
                __m128 lo0, lo1, hi0, hi1;
                dot4x2(q[r], q[r + 1], keys, D, half, &lo0, &lo1);
                dot4x2(q[r], q[r + 1], keys + 4, D, half, &hi0, &hi1);
                const __m256 s0 = _mm256_mul_ps(_mm256_set_m128(hi0, lo0), scale8);
                const __m256 s1 = _mm256_mul_ps(_mm256_set_m128(hi1, lo1), scale8);
                _mm256_storeu_ps(scores[r] + blocks_end, s0);
                _mm256_storeu_ps(scores[r + 1] + blocks_end, s1);
                top8[r] = _mm256_max_ps(top8[r], s0);
                top8[r + 1] = _mm256_max_ps(top8[r + 1], s1);
            }
            if (r < rows) {
                const __m256 s = _mm256_mul_ps(dot8(q[r], keys, D, half), scale8);
                _mm256_storeu_ps(scores[r] + blocks_end, s);
                top8[r] = _mm256_max_ps(top8[r], s);
            }
        }
        for (int r = 0; r < rows; r++) {
            float lanes[8];
            _mm256_storeu_ps(lanes, top8[r]);
            tops[r] = -INFINITY;
            for (int k = 0; k < 8; k++) tops[r] = lanes[k] > tops[r] ? lanes[k] : tops[r];
        }
    } else
#endif
        for (int r = 0; r < rows; r++) tops[r] = -INFINITY;
    for (int r = 0; r < rows; r++) {
        float *sc = scores[r];
        int64_t j = blocks_end;
        float top = tops[r];
        for (; j < length; j++) {
            sc[j] = dot(q[r], key[j], D, half) * scale;
            top = sc[j] > top ? sc[j] : top;
        }
        if (softcap > 0.0f) {
            top = -INFINITY;
            for (j = first; j < length; j++) {
                sc[j] = softcap * tanhf(sc[j] / softcap);
                top = sc[j] > top ? sc[j] : top;
            }
        }
        j = first;
#if ATTENTION_SIMD
        for (; j + 8 <= length; j += 8)
            _mm256_storeu_ps(sc + j, exp_fixed8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), _mm256_set1_ps(top))));
#endif
        for (; j < length; j++) sc[j] = exp_fixed(sc[j] - top);
        float total = 0.0f;
        for (j = first; j < length; j++) total += sc[j];
        j = first;
#if ATTENTION_SIMD
        for (; j + 8 <= length; j += 8)
            _mm256_storeu_ps(sc + j, _mm256_div_ps(_mm256_loadu_ps(sc + j), _mm256_set1_ps(total)));
#endif
        for (; j < length; j++) sc[j] = sc[j] / total;
    }
}

/* out[r][i] = sum over keys j in order of scores[r][j] * value_j[i], each
 * dimension one fma chain; the values are read once for all rows. */
#if ATTENTION_SIMD
/* Rows [r0, r0 + R) and dimensions [i, i + 8 * W): R * W accumulators,
 * each one dimension's chain, whose step per key waits on the last (an
 * fma's latency): a slice keeps 8 chains going where the rows allow, 4
 * rows x 16 dimensions, 2 x 32 (GQA groups of 2: Qwen3). Groups of 3
 * (SmolLM2) measured the same with 3 x 24 as with 3 x 16. */
static inline __attribute__((always_inline)) void weighted_slice(const int R, const int W, int r0, int64_t i,
                                                                 const void *const *value_at, int64_t first,
                                                                 int64_t length, float *const scores[],
                                                                 float *const out[], const int half) {
    __m256 a[4][4];
    for (int r = 0; r < R; r++)
        for (int w = 0; w < W; w++) a[r][w] = _mm256_setzero_ps();
    for (int64_t j = first; j < length; j++) {
        __m256 v[4];
        for (int w = 0; w < W; w++) v[w] = cache_load8(value_at[j], i + 8 * w, half);
        for (int r = 0; r < R; r++) {
            const __m256 p = _mm256_set1_ps(scores[r0 + r][j]);
            for (int w = 0; w < W; w++) a[r][w] = _mm256_fmadd_ps(p, v[w], a[r][w]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int w = 0; w < W; w++) _mm256_storeu_ps(out[r0 + r] + i + 8 * w, a[r][w]);
}
#endif

static inline __attribute__((always_inline)) void weighted_values(int rows, const void *const *value_at, int64_t D,
                                                                  int64_t first, int64_t length,
                                                                  float *const scores[], float *const out[],
                                                                  const int half) {
    int64_t i = 0;
#if ATTENTION_SIMD
    if (rows == 2)
        for (; i + 32 <= D; i += 32) weighted_slice(2, 4, 0, i, value_at, first, length, scores, out, half);
    for (; i + 16 <= D; i += 16) {
        int r0 = 0;
        for (; r0 + 4 <= rows; r0 += 4) weighted_slice(4, 2, r0, i, value_at, first, length, scores, out, half);
        switch (rows - r0) {
        case 3: weighted_slice(3, 2, r0, i, value_at, first, length, scores, out, half); break;
        case 2: weighted_slice(2, 2, r0, i, value_at, first, length, scores, out, half); break;
        case 1: weighted_slice(1, 2, r0, i, value_at, first, length, scores, out, half); break;
        default: break;
        }
    }
#endif
    for (; i < D; i++) {
        for (int r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (int64_t j = first; j < length; j++) acc = fmaf(scores[r][j], cache_at(value_at[j], i, half), acc);
            out[r][i] = acc;
        }
    }
}

/* Where each key and value of one sequence's KV head lies, for keys
 * [first, length): walked page by page, no division per key. */
static void locate_keys(const char *k_layer, const char *v_layer, const int64_t *pages, int64_t Hkv, int64_t h,
                        int64_t D, int64_t page_size, int64_t first, int64_t length, const void **key,
                        const void **value, int64_t element_bytes) {
    const int64_t row_elems = page_size * D * element_bytes;
    int64_t j = first, page = first / page_size, slot = first % page_size;
    while (j < length) {
        const int64_t row = (pages[page] * Hkv + h) * row_elems;
        for (; slot < page_size && j < length; slot++, j++) {
            key[j] = k_layer + row + slot * D * element_bytes;
            value[j] = v_layer + row + slot * D * element_bytes;
        }
        page++;
        slot = 0;
    }
}

/* q: [T, >= Hq * D] rows at q_stride (the q heads of qkv); every row's own
 * key and value already in the cache. Row t is at positions[t] of the
 * sequence whose pages are page_table[row_table[t]] ([S, max_pages]).
 * out: [T, Hq * D]. `window` > 0: each row sees its last `window` keys.
 * `softcap` > 0: scores are soft-capped (softmax_weights). */
int tandem_paged_attention(int64_t T, int64_t Hq, int64_t Hkv, int64_t D, const float *q, int64_t q_stride,
                           const int64_t *positions, const int64_t *row_table, const int64_t *page_table,
                           int64_t S, int64_t max_pages, int64_t page_size, int64_t window, float scale,
                           const void *k_layer, const void *v_layer, float *out, int64_t out_stride,
                           int threads, float softcap, int kv_half) {
    if (Hkv <= 0 || Hq % Hkv != 0 || page_size <= 0 || (kv_half & ~1)) return 1;
    int64_t longest = 0;
    for (int64_t t = 0; t < T; t++) {
        if (positions[t] < 0 || positions[t] / page_size >= max_pages || row_table[t] < 0 || row_table[t] >= S)
            return 1;
        longest = positions[t] + 1 > longest ? positions[t] + 1 : longest;
    }
    const int64_t group = Hq / Hkv;
    if (group > 64) return 1;
    int failed = 0;
    /* Threads where the work (query heads x keys x head size) is worth a
     * fork: for 64-wide heads the 4096 head-keys this was tuned with;
     * Gemma's 256-wide heads reach it with a quarter as many (16 rows x
     * 4 heads of a short chat ran on one thread while the other waited). */
    #pragma omp parallel num_threads(threads) if (threads > 1 && T * Hq * longest * D >= (int64_t)4096 * 64)
    {
        float *scores = malloc((size_t)(group * longest) * sizeof(float));
        const void **key_at = malloc((size_t)longest * sizeof(void *));
        const void **value_at = malloc((size_t)longest * sizeof(void *));
        if (!scores || !key_at || !value_at) {
            free(scores);
            scores = NULL;
            #pragma omp atomic write
            failed = 1;
        }
        /* Interleaved: a prefill chunk's later rows see more keys. */
        #pragma omp for schedule(static, 1) collapse(2) nowait
        for (int64_t t = 0; t < T; t++) {
            for (int64_t h = 0; h < Hkv; h++) {
                if (!scores) continue;
                const int64_t length = positions[t] + 1;
                const int64_t first = window > 0 && length > window ? length - window : 0;
                const float *q_rows[64];
                float *score_rows[64], *out_rows[64];
                for (int64_t g = 0; g < group; g++) {
                    q_rows[g] = q + t * q_stride + (h * group + g) * D;
                    score_rows[g] = scores + g * longest;
                    out_rows[g] = out + t * out_stride + (h * group + g) * D;
                }
                const int64_t *pages = page_table + row_table[t] * max_pages;
                locate_keys(k_layer, v_layer, pages, Hkv, h, D, page_size, first, length, key_at, value_at,
                            kv_half ? 2 : 4);
                /* Compiled once for each cache type: no test of it per key. */
                if (kv_half) {
                    softmax_weights(q_rows, (int)group, key_at, D, first, length, scale, softcap, score_rows, 1);
                    weighted_values((int)group, value_at, D, first, length, score_rows, out_rows, 1);
                } else {
                    softmax_weights(q_rows, (int)group, key_at, D, first, length, scale, softcap, score_rows, 0);
                    weighted_values((int)group, value_at, D, first, length, score_rows, out_rows, 0);
                }
            }
        }
        free(scores);
        free(key_at);
        free(value_at);
    }
    return failed ? 2 : 0;
}
