/*
 * Attention on the CPU over the paged KV cache, for every token of a step
 * (decodes and prefill chunks alike): rotate q and k (RoPE, Hugging Face's
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
 * kv_heads, page_size, head_dim] float32; head h of page p is row
 * p * kv_heads + h.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

static void rotate_half(float *x, const float *cos, const float *sin, int64_t D) {
    const int64_t half = D / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* The 8-lane sum of the SIMD builds, followed exactly by the portable one,
 * so attention has the same bits from every build (as the products do). */
static inline float dot(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    float s = _mm_cvtss_f32(s4);
#else
    float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lane[l] = fmaf(a[i + l], b[i + l], lane[l]);
    float s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Every row of qkv: q and k rotated in place, k and v written to the cache
 * rows write_rows[t * Hkv + h] (in a layer's [rows * page_size, head_dim]
 * view, engine.model.attention.AttentionMetadata's write_index). */
int tandem_rope_write_kv(int64_t T, int64_t Hq, int64_t Hkv, int64_t D, float *qkv, int64_t qkv_stride,
                         const float *cos_table, const float *sin_table, const int64_t *positions,
                         float *k_layer, float *v_layer, const int64_t *write_rows, int threads) {
    if (D % 2 != 0) return 1;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && T >= 64)
    for (int64_t t = 0; t < T; t++) {
        float *row = qkv + t * qkv_stride;
        const float *cos = cos_table + positions[t] * D, *sin = sin_table + positions[t] * D;
        for (int64_t h = 0; h < Hq + Hkv; h++) rotate_half(row + h * D, cos, sin, D);
        for (int64_t h = 0; h < Hkv; h++) {
            float *k_dst = k_layer + write_rows[t * Hkv + h] * D;
            float *v_dst = v_layer + write_rows[t * Hkv + h] * D;
            const float *k_src = row + (Hq + h) * D, *v_src = row + (Hq + Hkv + h) * D;
            for (int64_t i = 0; i < D; i++) {
                k_dst[i] = k_src[i];
                v_dst[i] = v_src[i];
            }
        }
    }
    return 0;
}

/* One query row against keys [first, length) of its sequence: softmax of
 * the scaled dot products, times the values, into o[D]. Scores are
 * computed four keys at a time (independent sums, each in dot()'s order). */
static void attend(const float *q, const float *k_layer, const float *v_layer, const int64_t *pages, int64_t Hkv,
                   int64_t h, int64_t D, int64_t page_size, int64_t first, int64_t length, float scale,
                   float *scores, float *o) {
    const int64_t row_elems = page_size * D;
#define KEY_AT(layer, j) ((layer) + (pages[(j) / page_size] * Hkv + h) * row_elems + ((j) % page_size) * D)
    float top = -INFINITY;
    int64_t j = first;
    for (; j + 4 <= length; j += 4) {
        const float s0 = dot(q, KEY_AT(k_layer, j), D) * scale;
        const float s1 = dot(q, KEY_AT(k_layer, j + 1), D) * scale;
        const float s2 = dot(q, KEY_AT(k_layer, j + 2), D) * scale;
        const float s3 = dot(q, KEY_AT(k_layer, j + 3), D) * scale;
        scores[j] = s0, scores[j + 1] = s1, scores[j + 2] = s2, scores[j + 3] = s3;
        top = s0 > top ? s0 : top;
        top = s1 > top ? s1 : top;
        top = s2 > top ? s2 : top;
        top = s3 > top ? s3 : top;
    }
    for (; j < length; j++) {
        const float s = dot(q, KEY_AT(k_layer, j), D) * scale;
        scores[j] = s;
        top = s > top ? s : top;
    }
    float total = 0.0f;
    for (j = first; j < length; j++) {
        scores[j] = expf(scores[j] - top);
        total += scores[j];
    }
    for (int64_t i = 0; i < D; i++) o[i] = 0.0f;
    for (j = first; j < length; j++) {
        const float *value = KEY_AT(v_layer, j);
        const float p = scores[j] / total;
        for (int64_t i = 0; i < D; i++) o[i] += p * value[i];
    }
#undef KEY_AT
}

/* q: [T, >= Hq * D] rows at q_stride (the q heads of qkv); every row's own
 * key and value already in the cache. Row t is at positions[t] of the
 * sequence whose pages are page_table[row_table[t]] ([S, max_pages]).
 * out: [T, Hq * D]. `window` > 0: each row sees its last `window` keys. */
int tandem_paged_attention(int64_t T, int64_t Hq, int64_t Hkv, int64_t D, const float *q, int64_t q_stride,
                           const int64_t *positions, const int64_t *row_table, const int64_t *page_table,
                           int64_t S, int64_t max_pages, int64_t page_size, int64_t window, float scale,
                           const float *k_layer, const float *v_layer, float *out, int64_t out_stride,
                           int threads) {
    if (Hkv <= 0 || Hq % Hkv != 0 || page_size <= 0) return 1;
    int64_t longest = 0;
    for (int64_t t = 0; t < T; t++) {
        if (positions[t] < 0 || positions[t] / page_size >= max_pages || row_table[t] < 0 || row_table[t] >= S)
            return 1;
        longest = positions[t] + 1 > longest ? positions[t] + 1 : longest;
    }
    const int64_t group = Hq / Hkv;
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (threads > 1 && T * Hq * longest >= 4096)
    {
        float *scores = malloc((size_t)longest * sizeof(float));
        if (!scores) {
            #pragma omp atomic write
            failed = 1;
        }
        /* Interleaved: a prefill chunk's later rows see more keys. */
        #pragma omp for schedule(static, 1) collapse(2)
        for (int64_t t = 0; t < T; t++) {
            for (int64_t hq = 0; hq < Hq; hq++) {
                if (!scores) continue;
                const int64_t length = positions[t] + 1;
                const int64_t first = window > 0 && length > window ? length - window : 0;
                attend(q + t * q_stride + hq * D, k_layer, v_layer, page_table + row_table[t] * max_pages, Hkv,
                       hq / group, D, page_size, first, length, scale, scores, out + t * out_stride + hq * D);
            }
        }
        free(scores);
    }
    return failed ? 2 : 0;
}
