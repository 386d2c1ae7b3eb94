/* The CPU backend's LoRA low-rank term, y[t] += s B (A x[t]), for a block of tokens at once.
 *
 * The reference (squad_lora_apply_ref) sums each of u = A x's rank rows and each output of B u as
 * one dependent double chain, so it runs at the FMA unit's latency. Here the same double sums keep
 * many independent chains in flight:
 *
 * - The up product u = A x takes the tokens LORA_GROUP at a time. Each (token, rank row) sum keeps
 *   LORA_LANES partial sums over the input (lane j sums the elements i = j mod LORA_LANES), added
 *   as (l0 + l1) + (l2 + l3), then the elements past the last full step in order. A float times a
 *   float is exact in double, so a fused multiply-add and a multiply then an add give the same
 *   bits: the AVX2 tiles (4 tokens x 2 rank rows, 8 vector chains, each x and A element converted
 *   once per tile) and the plain C loops compute the same u bit for bit.
 * - The down product y += s B u runs over the group's tokens as vector lanes (u stored rank-major,
 *   lanes of absent tokens zero), each output's sum a chain over the rank in order, LORA_OUT_TILE
 *   outputs in flight.
 *
 * Every token's sums depend on its own x only, whatever else rides in its group, so a chunk gets
 * the same bits alone or batched. The results differ from the reference's by rounding only (the
 * order of the double sums), far inside the exact path's 1e-4. */
#include "lora.h"

#include <string.h>

#define LORA_GROUP 4    /* tokens per group: the down product's vector lanes */
#define LORA_LANES 4    /* partial sums per (token, rank row) in the up product */
#define LORA_OUT_TILE 8 /* outputs in flight in the AVX2 down product */

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define LORA_X86 1
#define LORA_AVX2 __attribute__((target("avx2,fma")))
#define LORA_INLINE __attribute__((always_inline)) inline
#else
#define LORA_X86 0
#endif

/* The LORA_LANES partial sums of a dot product, reduced in the one fixed order. */
static double lanes_sum(const double l[LORA_LANES]) { return (l[0] + l[1]) + (l[2] + l[3]); }

/* ---- plain C ---------------------------------------------------------------------------------- */

static double up_dot_c(const float *a, const float *x, int in) {
    double l[LORA_LANES] = {0};
    int i = 0;
    for (; i + LORA_LANES <= in; i += LORA_LANES)
        for (int j = 0; j < LORA_LANES; j++) l[j] += (double)a[i + j] * x[i + j];
    double s = lanes_sum(l);
    for (; i < in; i++) s += (double)a[i] * x[i];
    return s;
}

/* u[k * LORA_GROUP + t] = A[k] . x[t] for the group's nt tokens */
static void up_c(const squad_lora_proj *p, const float *x, int nt, double *u) {
    for (int k = 0; k < p->r; k++)
        for (int t = 0; t < nt; t++) u[k * LORA_GROUP + t] = up_dot_c(p->A + (size_t)k * p->in, x + (size_t)t * p->in, p->in);
}

static void down_c(const squad_lora_proj *p, double scale, const double *u, int nt, float *y) {
    for (int o = 0; o < p->out; o++) {
        const float *b = p->B + (size_t)o * p->r;
        for (int t = 0; t < nt; t++) {
            double s = 0;
            for (int k = 0; k < p->r; k++) s += (double)b[k] * u[k * LORA_GROUP + t];
            y[(size_t)t * p->out + o] += (float)(scale * s);
        }
    }
}

/* ---- AVX2 ------------------------------------------------------------------------------------- */

#if LORA_X86
/* nt tokens x nk rank rows of u (nt <= LORA_GROUP, nk <= 2); constant arguments at every call, so
 * the accumulators stay in registers. The same sums as up_dot_c (see the top of the file). */
LORA_AVX2 static LORA_INLINE void up_tile_avx2(const float *A, const float *x, int in, int nt, int nk, double *u) {
    __m256d acc[LORA_GROUP][2];
    for (int t = 0; t < nt; t++)
        for (int k = 0; k < nk; k++) acc[t][k] = _mm256_setzero_pd();
    int i = 0;
    for (; i + LORA_LANES <= in; i += LORA_LANES) {
        __m256d a[2];
        for (int k = 0; k < nk; k++) a[k] = _mm256_cvtps_pd(_mm_loadu_ps(A + (size_t)k * in + i));
        for (int t = 0; t < nt; t++) {
            const __m256d xv = _mm256_cvtps_pd(_mm_loadu_ps(x + (size_t)t * in + i));
            for (int k = 0; k < nk; k++) acc[t][k] = _mm256_fmadd_pd(a[k], xv, acc[t][k]);
        }
    }
    for (int t = 0; t < nt; t++)
        for (int k = 0; k < nk; k++) {
            double l[LORA_LANES];
            _mm256_storeu_pd(l, acc[t][k]);
            double s = lanes_sum(l);
            for (int j = i; j < in; j++) s += (double)A[(size_t)k * in + j] * x[(size_t)t * in + j];
            u[k * LORA_GROUP + t] = s;
        }
}

LORA_AVX2 static void up_full_avx2(const float *A, const float *x, int in, int nk, double *u) {
    if (nk == 2) up_tile_avx2(A, x, in, LORA_GROUP, 2, u);
    else up_tile_avx2(A, x, in, LORA_GROUP, 1, u);
}

LORA_AVX2 static void up_one_avx2(const float *A, const float *x, int in, int nk, double *u) {
    if (nk == 2) up_tile_avx2(A, x, in, 1, 2, u);
    else up_tile_avx2(A, x, in, 1, 1, u);
}

LORA_AVX2 static void up_avx2(const squad_lora_proj *p, const float *x, int nt, double *u) {
    for (int k = 0; k < p->r; k += 2) {
        const int nk = p->r - k < 2 ? 1 : 2;
        const float *A = p->A + (size_t)k * p->in;
        if (nt == LORA_GROUP) up_full_avx2(A, x, p->in, nk, u + k * LORA_GROUP);
        else
            for (int t = 0; t < nt; t++) up_one_avx2(A, x + (size_t)t * p->in, p->in, nk, u + k * LORA_GROUP + t);
    }
}

LORA_AVX2 static void down_store(const __m256d s, double scale, int nt, float *y, size_t ld) {
    double v[LORA_GROUP];
    _mm256_storeu_pd(v, s);
    for (int t = 0; t < nt; t++) y[(size_t)t * ld] += (float)(scale * v[t]);
}

LORA_AVX2 static void down_avx2(const squad_lora_proj *p, double scale, const double *u, int nt, float *y) {
    const int r = p->r, out = p->out;
    int o = 0;
    for (; o + LORA_OUT_TILE <= out; o += LORA_OUT_TILE) {
        __m256d s[LORA_OUT_TILE];
        for (int j = 0; j < LORA_OUT_TILE; j++) s[j] = _mm256_setzero_pd();
        const float *b = p->B + (size_t)o * r;
        for (int k = 0; k < r; k++) {
            const __m256d uk = _mm256_loadu_pd(u + k * LORA_GROUP);
            for (int j = 0; j < LORA_OUT_TILE; j++)
                s[j] = _mm256_fmadd_pd(_mm256_set1_pd((double)b[(size_t)j * r + k]), uk, s[j]);
        }
        for (int j = 0; j < LORA_OUT_TILE; j++) down_store(s[j], scale, nt, y + o + j, (size_t)out);
    }
    for (; o < out; o++) {
        __m256d s = _mm256_setzero_pd();
        const float *b = p->B + (size_t)o * r;
        for (int k = 0; k < r; k++) s = _mm256_fmadd_pd(_mm256_set1_pd((double)b[k]), _mm256_loadu_pd(u + k * LORA_GROUP), s);
        down_store(s, scale, nt, y + o, (size_t)out);
    }
}
#endif

void cpu_lora_apply(cpu_isa isa, const squad_lora_proj *p, float scale, const float *x, float *y, int n) {
    if (!p->A || p->r < 1 || p->r > SQUAD_LORA_MAX_RANK) return;
    /* rank-major u of one group; lanes of absent tokens stay zero */
    double u[SQUAD_LORA_MAX_RANK * LORA_GROUP];
#if LORA_X86
    const int avx2 = isa >= CPU_ISA_AVX2;
#else
    const int avx2 = 0;
#endif
    for (int t0 = 0; t0 < n; t0 += LORA_GROUP) {
        const int nt = n - t0 < LORA_GROUP ? n - t0 : LORA_GROUP;
        const float *xg = x + (size_t)t0 * p->in;
        float *yg = y + (size_t)t0 * p->out;
        if (nt < LORA_GROUP) memset(u, 0, sizeof(double) * (size_t)p->r * LORA_GROUP);
#if LORA_X86
        if (avx2) {
            up_avx2(p, xg, nt, u);
            down_avx2(p, scale, u, nt, yg);
            continue;
        }
#endif
        (void)avx2;
        up_c(p, xg, nt, u);
        down_c(p, scale, u, nt, yg);
    }
}
