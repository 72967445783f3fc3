/* Paged attention on CPU: one task per (sequence b, kv head), walking b's block table straight into the pool.
 *
 * For each logical block the task looks up the physical block, scores its keys against the G * Nq query rows
 * that share the kv head (each K/V row is read once, for all of them), and updates an online softmax per row:
 * running max m, sum l = sum e^(s - m), accumulator o = sum e^(s - m) v, rescaled by e^(m_old - m) when the
 * max grows; o / l is written at the end.  Invariant after block j: o / l is exact softmax attention over the
 * keys of blocks 0..j the row may see.  Only slots < seq_lens[b] are ever read, so garbage (NaN) slots past a
 * sequence's end, and table entries past its last block, never reach the output.  Causal is aligned
 * bottom-right (query i sees key j iff j <= i + seq_len - Nq); a row that sees no key gets l = 0 and o = 0.
 *
 * vLLM csrc/attention/attention_kernels.cuh (paged_attention_kernel, V1); Kwon et al. 2023, Sec. 4.1.
 * The file includes itself once per element type: T = float (paged_attention_f32), T = double (_f64).
 */
#ifndef T
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
#endif

#define T float
#define EXP expf
#define PAGED_ATTENTION paged_attention_f32
#include "paged_decode.c"  /* this file again, with T defined: quoted, so found next to itself */
#undef T
#undef EXP
#undef PAGED_ATTENTION

#define T double
#define EXP exp
#define PAGED_ATTENTION paged_attention_f64
#include "paged_decode.c"

#else

/* Returns 0, or 1 if the per-thread scratch could not be allocated. */
int PAGED_ATTENTION(const T *q, const T *k_cache, const T *v_cache, const int64_t *block_tables,
                    const int64_t *seq_lens, T *out, int64_t B, int64_t H, int64_t Hkv, int64_t Nq, int64_t d,
                    int64_t block_size, int64_t max_blocks, int causal, double scale, int threads)
{
    const int64_t G = H / Hkv, R = G * Nq, bs = block_size;  /* R query rows read one kv head */
    const int64_t scratch = R * d + R * d + R * bs + 2 * R;  /* q * scale, o, scores, m, l */
    if (threads < 1) threads = 1;
    T *pool = malloc(sizeof(T) * scratch * threads);
    int64_t *limit_pool = malloc(sizeof(int64_t) * R * threads);
    if (!pool || !limit_pool) {
        free(pool);
        free(limit_pool);
        return 1;
    }
#pragma omp parallel for schedule(dynamic) num_threads(threads)
    for (int64_t task = 0; task < B * Hkv; task++) {
        const int tid = omp_get_thread_num();
        T *qs = pool + tid * scratch, *o = qs + R * d, *s = o + R * d, *m = s + R * bs, *l = m + R;
        int64_t *limit = limit_pool + tid * R;  /* row r sees keys j < limit[r] */
        const int64_t b = task / Hkv, kvh = task % Hkv, L = seq_lens[b];
        const T *qb = q + (b * H + kvh * G) * Nq * d;  /* (G, Nq, d): heads kvh*G .. kvh*G+G-1 */
        for (int64_t r = 0; r < R; r++) {
            const int64_t i = r % Nq, diag = i + L - Nq + 1;
            limit[r] = causal && diag < L ? diag : L;
            m[r] = -INFINITY;
            l[r] = 0;
            for (int64_t c = 0; c < d; c++) {
                qs[r * d + c] = (T)(qb[r * d + c] * scale);
                o[r * d + c] = 0;
            }
        }
        for (int64_t blk = 0; blk * bs < L; blk++) {
            const int64_t phys = block_tables[b * max_blocks + blk], j0 = blk * bs;
            const int64_t n = L - j0 < bs ? L - j0 : bs;  /* slots of this block inside the sequence */
            const T *kb = k_cache + (phys * Hkv + kvh) * bs * d, *vb = v_cache + (phys * Hkv + kvh) * bs * d;
            const T *kn = kb, *vn = vb;  /* the next physical block: scattered, so the hardware can't guess it */
            if ((blk + 1) * bs < L) {
                const int64_t next = block_tables[b * max_blocks + blk + 1];
                kn = k_cache + (next * Hkv + kvh) * bs * d, vn = v_cache + (next * Hkv + kvh) * bs * d;
            }
            for (int64_t t = 0; t < n; t++) {  /* s = q k^T, each key row read once for all R rows */
                const T *k = kb + t * d;
                for (int64_t c = 0; c < d; c += 64 / sizeof(T)) {  /* one 64-byte line at a time */
                    __builtin_prefetch(kn + t * d + c);
                    __builtin_prefetch(vn + t * d + c);
                }
                int64_t r = 0;
                for (; r + 4 <= R; r += 4) {  /* four rows at a time: k[c] loaded once, four independent sums */
                    const T *q0 = qs + r * d, *q1 = q0 + d, *q2 = q1 + d, *q3 = q2 + d;
                    T dot0 = 0, dot1 = 0, dot2 = 0, dot3 = 0;
                    for (int64_t c = 0; c < d; c++) {
                        dot0 += q0[c] * k[c];
                        dot1 += q1[c] * k[c];
                        dot2 += q2[c] * k[c];
                        dot3 += q3[c] * k[c];
                    }
                    s[r * bs + t] = dot0;
                    s[(r + 1) * bs + t] = dot1;
                    s[(r + 2) * bs + t] = dot2;
                    s[(r + 3) * bs + t] = dot3;
                }
                for (; r < R; r++) {
                    const T *qr = qs + r * d;
                    T dot = 0;
                    for (int64_t c = 0; c < d; c++)
                        dot += qr[c] * k[c];
                    s[r * bs + t] = dot;
                }
                for (r = 0; r < R; r++)  /* past the causal diagonal */
                    if (j0 + t >= limit[r])
                        s[r * bs + t] = -INFINITY;
            }
            for (int64_t r = 0; r < R; r++) {  /* online softmax: s -> p = e^(s - m), rescale o, l if m grows */
                T *sr = s + r * bs, mb = m[r], sum = 0;
                for (int64_t t = 0; t < n; t++)
                    mb = sr[t] > mb ? sr[t] : mb;
                if (mb == -INFINITY) {  /* the row sees no key yet: p = 0 (its o, l stay 0) */
                    for (int64_t t = 0; t < n; t++)
                        sr[t] = 0;
                    continue;
                }
                if (mb > m[r]) {
                    const T alpha = EXP(m[r] - mb);  /* e^(-inf) = 0 on the first key */
                    for (int64_t c = 0; c < d; c++)
                        o[r * d + c] *= alpha;
                    l[r] *= alpha;
                    m[r] = mb;
                }
                for (int64_t t = 0; t < n; t++) {
                    sr[t] = EXP(sr[t] - mb);  /* masked keys: e^(-inf) = 0 */
                    sum += sr[t];
                }
                l[r] += sum;
            }
            int64_t t = 0;
            for (; t + 4 <= n; t += 4) {  /* o += p v, four value rows per pass over o */
                const T *v0 = vb + t * d, *v1 = v0 + d, *v2 = v1 + d, *v3 = v2 + d;
                for (int64_t r = 0; r < R; r++) {
                    const T *p = s + r * bs + t;
                    T *orow = o + r * d;
                    for (int64_t c = 0; c < d; c++)
                        orow[c] += p[0] * v0[c] + p[1] * v1[c] + p[2] * v2[c] + p[3] * v3[c];
                }
            }
            for (; t < n; t++) {
                const T *v = vb + t * d;
                for (int64_t r = 0; r < R; r++) {
                    const T p = s[r * bs + t];
                    T *orow = o + r * d;
                    for (int64_t c = 0; c < d; c++)
                        orow[c] += p * v[c];
                }
            }
        }
        T *ob = out + (b * H + kvh * G) * Nq * d;  /* (G, Nq, d) */
        for (int64_t r = 0; r < R; r++) {
            const T inv = l[r] > 0 ? 1 / l[r] : 0;  /* no visible key: o = 0 */
            for (int64_t c = 0; c < d; c++)
                ob[r * d + c] = o[r * d + c] * inv;
        }
    }
    free(pool);
    free(limit_pool);
    return 0;
}

#endif
