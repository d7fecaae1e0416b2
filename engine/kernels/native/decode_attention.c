/*
 * One decode step's attention on the CPU, for a batch of sequences that
 * each add one token: rotate q and k (RoPE, Hugging Face's rotate-half
 * layout), write k and v into the paged cache, and attend over each
 * sequence's pages in place.
 *
 * The torch path (engine/model/attention.py) does the same in ~20 small ops per
 * layer, gathering the pages into padded tensors first; at one sequence
 * those ops' fixed costs are most of a decode step. Here it is one call,
 * with no gathered copy of the keys.
 *
 * Cache layout (engine.attention.KVCache, one layer): [pages * kv_heads,
 * page_size, head_dim] float32; head h of page p is row p * kv_heads + h.
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

static inline float dot(const float *a, const float *b, int64_t n) {
#if defined(__AVX2__) && defined(__FMA__)
    /* The compiler may not reorder a float sum by itself: eight lanes here. */
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    float s = _mm_cvtss_f32(s4);
#else
    float s = 0.0f;
    int64_t i = 0;
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Prefill tokens: q and k of each row of qkv rotated in place, k and v
 * written to the cache rows write_rows[t * Hkv + h] (in a layer's
 * [rows * page_size, head_dim] view, engine.attention.AttentionMetadata's
 * write_index). Attention over them is torch's (scaled_dot_product_attention
 * per chunk), which at prefill sizes does the arithmetic, not overhead. */
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

/* qkv: [B, (Hq + 2 Hkv) * D] (q heads, then k heads, then v heads), q and k
 * rotated in place. page_table: [B, max_pages] page ids. out: [B, Hq * D]. */
int tandem_decode_attention(int64_t B, int64_t Hq, int64_t Hkv, int64_t D, float *qkv, int64_t qkv_stride,
                            const float *cos_table, const float *sin_table, const int64_t *positions,
                            float *k_layer, float *v_layer, const int64_t *page_table, int64_t max_pages,
                            int64_t page_size, int64_t window, float scale, float *out, int64_t out_stride,
                            int threads) {
    if (Hkv <= 0 || Hq % Hkv != 0 || D % 2 != 0) return 1;
    for (int64_t b = 0; b < B; b++) {
        if (positions[b] < 0 || positions[b] / page_size >= max_pages) return 1;
    }
    const int64_t group = Hq / Hkv;
    const int64_t row_elems = page_size * D; /* one head of one page */
    int64_t longest = 0;
    for (int64_t b = 0; b < B; b++) longest = positions[b] + 1 > longest ? positions[b] + 1 : longest;
    int failed = 0;

    #pragma omp parallel num_threads(threads) if (threads > 1 && B * Hq * longest >= 4096)
    {
        #pragma omp for schedule(static)
        for (int64_t b = 0; b < B; b++) {
            const int64_t pos = positions[b];
            float *row = qkv + b * qkv_stride;
            const float *cos = cos_table + pos * D, *sin = sin_table + pos * D;
            for (int64_t h = 0; h < Hq + Hkv; h++) rotate_half(row + h * D, cos, sin, D);
            const int64_t page = page_table[b * max_pages + pos / page_size];
            const int64_t slot = pos % page_size;
            for (int64_t h = 0; h < Hkv; h++) {
                float *k_dst = k_layer + (page * Hkv + h) * row_elems + slot * D;
                float *v_dst = v_layer + (page * Hkv + h) * row_elems + slot * D;
                const float *k_src = row + (Hq + h) * D, *v_src = row + (Hq + Hkv + h) * D;
                for (int64_t i = 0; i < D; i++) {
                    k_dst[i] = k_src[i];
                    v_dst[i] = v_src[i];
                }
            }
        }
        /* The implicit barrier above: every new k/v is in the cache. */
        float *scores = malloc((size_t)longest * sizeof(float));
        if (!scores) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static) collapse(2)
        for (int64_t b = 0; b < B; b++) {
            for (int64_t hq = 0; hq < Hq; hq++) {
                if (!scores) continue;
                const int64_t length = positions[b] + 1;
                const int64_t first = window > 0 && length > window ? length - window : 0;
                const int64_t h = hq / group;
                const float *q = qkv + b * qkv_stride + hq * D;
                float top = -INFINITY;
                for (int64_t j = first; j < length; j++) {
                    const int64_t page = page_table[b * max_pages + j / page_size];
                    const float *key = k_layer + (page * Hkv + h) * row_elems + (j % page_size) * D;
                    float s = dot(q, key, D) * scale;
                    scores[j] = s;
                    top = s > top ? s : top;
                }
                float total = 0.0f;
                for (int64_t j = first; j < length; j++) {
                    scores[j] = expf(scores[j] - top);
                    total += scores[j];
                }
                float *o = out + b * out_stride + hq * D;
                for (int64_t i = 0; i < D; i++) o[i] = 0.0f;
                for (int64_t j = first; j < length; j++) {
                    const int64_t page = page_table[b * max_pages + j / page_size];
                    const float *value = v_layer + (page * Hkv + h) * row_elems + (j % page_size) * D;
                    const float p = scores[j] / total;
                    for (int64_t i = 0; i < D; i++) o[i] += p * value[i];
                }
            }
        }
        free(scores);
    }
    return failed ? 2 : 0;
}
