/* Every layer of one step of the native CPU forward in one call.
 *
 * A decoder layer is six native calls (engine/model/decoder.py's native
 * path: products, RoPE + KV write, attention). Made one by one through
 * ctypes, each costs 10-20 us of argument conversion in Python, more than
 * the work itself for a small model at one sequence: 180 calls a step on
 * the default model. So the model writes its layers once as a program of
 * fixed-width records (the weights', norms' and cache layers' pointers,
 * which live as long as the model), and each step passes only what is its
 * own: its token count, its four activation buffers, its position and page
 * tables and the RoPE tables. The calls are the very functions the
 * per-call path makes, with the same arguments: the same bits. */

#include <stdint.h>
#include <string.h>

int tandem_quant_gemm(int fmt, int64_t M, int64_t N, int64_t K, const float *x, int64_t x_stride,
                      const uint8_t *data, const uint16_t *scales, const uint16_t *mins, const float *bias,
                      float *y, int64_t y_stride, int threads, int input_op, const float *norm_weight, float eps,
                      int accumulate, const float *out_norm, float out_scale);
int tandem_rope_write_kv(int64_t T, int64_t Hq, int64_t Hkv, int64_t D, float *qkv, int64_t qkv_stride,
                         const float *cos_table, const float *sin_table, const int64_t *positions,
                         void *k_layer, void *v_layer, const int64_t *write_rows, int threads,
                         const float *q_norm, const float *k_norm, float eps, int64_t R, int kv_half);
int tandem_paged_attention(int64_t T, int64_t Hq, int64_t Hkv, int64_t D, const float *q, int64_t q_stride,
                           const int64_t *positions, const int64_t *row_table, const int64_t *page_table,
                           int64_t S, int64_t max_pages, int64_t page_size, int64_t window, float scale,
                           const void *k_layer, const void *v_layer, float *out, int64_t out_stride,
                           int threads, float softcap, int kv_half);

/* Words of a program record; the first is the op. */
#define RECORD 20
enum { OP_PRODUCT = 1, OP_ROPE = 2, OP_ATTENTION = 3 };
/* The step's words: the token count, the thread count, the buffers (x,
 * qkv, attention output, gate/up) with their row strides, the position,
 * row, page and KV-write tables, the page table's shape, and the RoPE
 * tables (cos, sin) of up to ROPE_TABLES distinct rotations. */
#define BUFFERS 4
#define ROPE_TABLES 4
enum {
    STEP_TOKENS = 0, STEP_THREADS = 1, STEP_BUFFER = 2, STEP_STRIDE = STEP_BUFFER + BUFFERS,
    STEP_POSITIONS = STEP_STRIDE + BUFFERS, STEP_ROW_TABLE, STEP_PAGE_TABLE, STEP_WRITE_ROWS, STEP_SEQUENCES,
    STEP_MAX_PAGES, STEP_COS, STEP_SIN = STEP_COS + ROPE_TABLES, STEP_WORDS = STEP_SIN + ROPE_TABLES
};

static inline void *pointer(int64_t word) { return (void *)(intptr_t)word; }

static inline float float_word(int64_t word) {
    float value;
    const int32_t bits = (int32_t)word;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* The records (words after the op):
 *   PRODUCT: fmt, N, K, data, scales, mins, bias, input buffer, output buffer, first output column,
 *            input op, norm weight, eps, accumulate, out norm, out scale
 *   ROPE: Hq, Hkv, D, qkv buffer, rope table, k layer, v layer, q norm, k norm, eps, rotary dims, kv half
 *   ATTENTION: Hq, Hkv, D, qkv buffer, output buffer, page size, window, scale, k layer, v layer, softcap,
 *              kv half
 * Floats are stored as their 32 bits. Returns 0, or 1000 * (record + 1) + the failing call's status. */
int tandem_forward_layers(const int64_t *program, int64_t records, const int64_t *step) {
    const int64_t T = step[STEP_TOKENS];
    const int threads = (int)step[STEP_THREADS];
    const int64_t *positions = pointer(step[STEP_POSITIONS]);
    for (int64_t i = 0; i < records; i++) {
        const int64_t *r = program + i * RECORD;
        int status = 1;
        switch (r[0]) {
        case OP_PRODUCT: {
            const int in = (int)r[8], out = (int)r[9];
            if (in < 0 || in >= BUFFERS || out < 0 || out >= BUFFERS) break;
            float *y = (float *)pointer(step[STEP_BUFFER + out]) + r[10];
            status = tandem_quant_gemm((int)r[1], T, r[2], r[3], pointer(step[STEP_BUFFER + in]),
                                       step[STEP_STRIDE + in], pointer(r[4]), pointer(r[5]), pointer(r[6]),
                                       pointer(r[7]), y, step[STEP_STRIDE + out], threads, (int)r[11],
                                       pointer(r[12]), float_word(r[13]), (int)r[14], pointer(r[15]),
                                       float_word(r[16]));
            break;
        }
        case OP_ROPE: {
            const int qkv = (int)r[4], table = (int)r[5];
            if (qkv < 0 || qkv >= BUFFERS || table < 0 || table >= ROPE_TABLES) break;
            status = tandem_rope_write_kv(T, r[1], r[2], r[3], pointer(step[STEP_BUFFER + qkv]), step[STEP_STRIDE + qkv],
                                          pointer(step[STEP_COS + table]), pointer(step[STEP_SIN + table]), positions,
                                          pointer(r[6]), pointer(r[7]), pointer(step[STEP_WRITE_ROWS]), threads,
                                          pointer(r[8]), pointer(r[9]), float_word(r[10]), r[11], (int)r[12]);
            break;
        }
        case OP_ATTENTION: {
            const int qkv = (int)r[4], out = (int)r[5];
            if (qkv < 0 || qkv >= BUFFERS || out < 0 || out >= BUFFERS) break;
            status = tandem_paged_attention(T, r[1], r[2], r[3], pointer(step[STEP_BUFFER + qkv]),
                                            step[STEP_STRIDE + qkv], positions, pointer(step[STEP_ROW_TABLE]),
                                            pointer(step[STEP_PAGE_TABLE]), step[STEP_SEQUENCES],
                                            step[STEP_MAX_PAGES], r[6], r[7], float_word(r[8]), pointer(r[9]),
                                            pointer(r[10]), pointer(step[STEP_BUFFER + out]), step[STEP_STRIDE + out],
                                            threads, float_word(r[11]), (int)r[12]);
            break;
        }
        default:
            break;
        }
        if (status != 0) return (int)(1000 * (i + 1) + status);
    }
    return 0;
}

int tandem_forward_step_words(void) { return STEP_WORDS; }
int tandem_forward_record_words(void) { return RECORD; }
