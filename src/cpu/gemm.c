/*
 * gemm.c — fp32 x bf16 matrix multiply for the CPU backend (gemm.h).
 *
 * Design. A call picks a kernel table by the pool's ISA and precision, prepares x once (rounded
 * to bf16 for FAST), then spreads tasks over the pool. Two algorithms:
 *  - DOT: every output is a dot product of an x row with a W row read in place. Used for small T
 *    (a GEMV is memory-bound: W is read once, whatever the kernel). Each task owns a block of W
 *    rows and walks every t, so a block of DOT_ROWS W rows stays in L1 across all x rows.
 *  - PACKED (large T): see the section "packed GEMM" below.
 * The kernels are plain C functions compiled with __attribute__((target(...))), so the file builds
 * with the default flags and runs on any x86-64 (and anywhere else through the scalar kernels).
 */
#include "cpu/gemm.h"

#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define GEMM_X86 1
#define TARGET_AVX2 __attribute__((target("avx2,fma")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#else
#define GEMM_X86 0
#endif

/* W rows one DOT kernel call handles: their partial sums share each load of x. */
#define DOT_ROWS 4
/* W rows per DOT task (a multiple of DOT_ROWS): K x 64 rows x 2 bytes stays in L2 across all t. */
#define DOT_TASK_ROWS 64
/* Tasks per thread the work is cut into, so a thread slowed by other load is caught up by others. */
#define TASKS_PER_THREAD 4

/* ---------------------------------------------------------------- the oracle */

void cpu_gemm_bf16_ref(float *y, const float *x, const uint16_t *W, int T, int N, int K, int accumulate) {
    for (int t = 0; t < T; t++) {
        for (int n = 0; n < N; n++) {
            double s = accumulate ? (double)y[(size_t)t * N + n] : 0.0;
            const float *xr = x + (size_t)t * K;
            const uint16_t *wr = W + (size_t)n * K;
            for (int k = 0; k < K; k++) s += (double)xr[k] * (double)squad_bf16_to_f32(wr[k]);
            y[(size_t)t * N + n] = (float)s;
        }
    }
}

/* ---------------------------------------------------------------- DOT kernels
 * dot_fn: out[r] = sum_k x[k] * W[r*ldw + k] for r < rows (1..DOT_ROWS). x is fp32 (EXACT, or FAST
 * on a CPU without bf16 dot products: then x holds bf16-rounded values) or bf16 (FAST with
 * vdpbf16ps). */
typedef void (*dot_fn)(const void *x, const uint16_t *W, size_t ldw, int rows, int K, float *out);

static void dot_scalar(const void *xv, const uint16_t *W, size_t ldw, int rows, int K, float *out) {
    /* SCALAR_LANES partial sums, as the vector kernels keep: shorter chains, less round-off. */
    enum { SCALAR_LANES = 8 };
    const float *x = xv;
    for (int r = 0; r < rows; r++) {
        const uint16_t *w = W + (size_t)r * ldw;
        float s[SCALAR_LANES] = {0};
        int k = 0;
        for (; k + SCALAR_LANES <= K; k += SCALAR_LANES)
            for (int l = 0; l < SCALAR_LANES; l++) s[l] += x[k + l] * squad_bf16_to_f32(w[k + l]);
        for (; k < K; k++) s[0] += x[k] * squad_bf16_to_f32(w[k]);
        float tot = 0.0f;
        for (int l = 0; l < SCALAR_LANES; l++) tot += s[l];
        out[r] = tot;
    }
}

#if GEMM_X86
TARGET_AVX2 static inline __m256 avx2_load_bf16x8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

TARGET_AVX2 static inline float avx2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

TARGET_AVX2 static void dot_avx2(const void *xv, const uint16_t *W, size_t ldw, int rows, int K, float *out) {
    const float *x = xv;
    __m256 acc[DOT_ROWS];
    for (int r = 0; r < DOT_ROWS; r++) acc[r] = _mm256_setzero_ps();
    int k = 0;
    if (rows == DOT_ROWS) {
        for (; k + 8 <= K; k += 8) {
            __m256 xv8 = _mm256_loadu_ps(x + k);
            for (int r = 0; r < DOT_ROWS; r++)
                acc[r] = _mm256_fmadd_ps(xv8, avx2_load_bf16x8(W + r * ldw + k), acc[r]);
        }
    } else {
        for (; k + 8 <= K; k += 8) {
            __m256 xv8 = _mm256_loadu_ps(x + k);
            for (int r = 0; r < rows; r++) acc[r] = _mm256_fmadd_ps(xv8, avx2_load_bf16x8(W + r * ldw + k), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) {
        float s = avx2_hsum(acc[r]);
        const uint16_t *w = W + r * ldw;
        for (int kk = k; kk < K; kk++) s += x[kk] * squad_bf16_to_f32(w[kk]);
        out[r] = s;
    }
}

TARGET_AVX512 static inline __m512 avx512_load_bf16x16(const uint16_t *p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

TARGET_AVX512 static inline __m512 avx512_load_bf16x16_mask(const uint16_t *p, __mmask16 m) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

TARGET_AVX512 static void dot_avx512(const void *xv, const uint16_t *W, size_t ldw, int rows, int K, float *out) {
    const float *x = xv;
    __m512 acc[DOT_ROWS];
    for (int r = 0; r < DOT_ROWS; r++) acc[r] = _mm512_setzero_ps();
    int k = 0;
    if (rows == DOT_ROWS) {
        for (; k + 16 <= K; k += 16) {
            __m512 x16 = _mm512_loadu_ps(x + k);
            for (int r = 0; r < DOT_ROWS; r++)
                acc[r] = _mm512_fmadd_ps(x16, avx512_load_bf16x16(W + r * ldw + k), acc[r]);
        }
    } else {
        for (; k + 16 <= K; k += 16) {
            __m512 x16 = _mm512_loadu_ps(x + k);
            for (int r = 0; r < rows; r++) acc[r] = _mm512_fmadd_ps(x16, avx512_load_bf16x16(W + r * ldw + k), acc[r]);
        }
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
        __m512 x16 = _mm512_maskz_loadu_ps(m, x + k);
        for (int r = 0; r < rows; r++)
            acc[r] = _mm512_fmadd_ps(x16, avx512_load_bf16x16_mask(W + r * ldw + k, m), acc[r]);
    }
    for (int r = 0; r < rows; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
}

/* x is bf16 here: 32 products per vdpbf16ps, pairs summed in fp32. */
TARGET_AVX512BF16 static void dot_avx512bf16(const void *xv, const uint16_t *W, size_t ldw, int rows, int K,
                                              float *out) {
    const uint16_t *x = xv;
    __m512 acc[DOT_ROWS];
    for (int r = 0; r < DOT_ROWS; r++) acc[r] = _mm512_setzero_ps();
    int k = 0;
    if (rows == DOT_ROWS) {
        for (; k + 32 <= K; k += 32) {
            __m512bh x32 = (__m512bh)_mm512_loadu_si512(x + k);
            for (int r = 0; r < DOT_ROWS; r++)
                acc[r] = _mm512_dpbf16_ps(acc[r], x32, (__m512bh)_mm512_loadu_si512(W + r * ldw + k));
        }
    } else {
        for (; k + 32 <= K; k += 32) {
            __m512bh x32 = (__m512bh)_mm512_loadu_si512(x + k);
            for (int r = 0; r < rows; r++)
                acc[r] = _mm512_dpbf16_ps(acc[r], x32, (__m512bh)_mm512_loadu_si512(W + r * ldw + k));
        }
    }
    if (k < K) {
        __mmask32 m = (__mmask32)((1ull << (K - k)) - 1ull);
        __m512bh x32 = (__m512bh)_mm512_maskz_loadu_epi16(m, x + k);
        for (int r = 0; r < rows; r++)
            acc[r] = _mm512_dpbf16_ps(acc[r], x32, (__m512bh)_mm512_maskz_loadu_epi16(m, W + r * ldw + k));
    }
    for (int r = 0; r < rows; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
}
#endif

/* ---------------------------------------------------------------- dispatch */

/* How x is prepared before the kernels run. */
typedef enum x_form {
    X_AS_IS = 0,       /* fp32 x used in place */
    X_ROUNDED_F32 = 1, /* fp32 copy holding bf16-rounded values (FAST without vdpbf16ps) */
    X_BF16 = 2         /* bf16 copy (FAST with vdpbf16ps) */
} x_form;

typedef struct gemm_kernels {
    dot_fn dot;
    x_form xf;
} gemm_kernels;

static gemm_kernels gemm_select(cpu_isa isa, cpu_gemm_precision prec) {
    gemm_kernels k = {dot_scalar, prec == CPU_GEMM_FAST ? X_ROUNDED_F32 : X_AS_IS};
#if GEMM_X86
    switch (isa) {
    case CPU_ISA_AVX512_BF16:
        k.dot = dot_avx512;
        if (prec == CPU_GEMM_FAST) {
            k.dot = dot_avx512bf16;
            k.xf = X_BF16;
        }
        break;
    case CPU_ISA_AVX512: k.dot = dot_avx512; break;
    case CPU_ISA_AVX2: k.dot = dot_avx2; break;
    default: break;
    }
#else
    (void)isa;
#endif
    return k;
}

/* ---------------------------------------------------------------- the driver */

typedef struct gemm_job {
    float *y;
    const float *x;
    const void *xp; /* x as the kernels read it */
    size_t xp_stride; /* elements per row of xp */
    const uint16_t *W;
    int T, N, K, accumulate;
    gemm_kernels kern;
    int n_blocks, t_blocks; /* the task grid: n_blocks x t_blocks */
    int n_block_rows, t_block_rows;
    /* x preparation */
    void *xbuf;
    int prep_rows_per_task;
} gemm_job;

static void gemm_prep_task(void *ctx, int task, int n_tasks) {
    gemm_job *j = ctx;
    int t0 = task * j->prep_rows_per_task, t1 = t0 + j->prep_rows_per_task;
    if (t1 > j->T) t1 = j->T;
    size_t K = (size_t)j->K;
    for (int t = t0; t < t1; t++) {
        const float *src = j->x + (size_t)t * K;
        if (j->kern.xf == X_BF16) {
            uint16_t *dst = (uint16_t *)j->xbuf + (size_t)t * K;
            for (size_t k = 0; k < K; k++) dst[k] = squad_f32_to_bf16(src[k]);
        } else {
            float *dst = (float *)j->xbuf + (size_t)t * K;
            for (size_t k = 0; k < K; k++) dst[k] = squad_bf16_to_f32(squad_f32_to_bf16(src[k]));
        }
    }
}

static void gemm_dot_task(void *ctx, int task, int n_tasks) {
    gemm_job *j = ctx;
    int nb = task % j->n_blocks, tb = task / j->n_blocks;
    int n0 = nb * j->n_block_rows, n1 = n0 + j->n_block_rows;
    int t0 = tb * j->t_block_rows, t1 = t0 + j->t_block_rows;
    if (n1 > j->N) n1 = j->N;
    if (t1 > j->T) t1 = j->T;
    size_t elt = j->kern.xf == X_BF16 ? sizeof(uint16_t) : sizeof(float);
    float out[DOT_ROWS];
    for (int n = n0; n < n1; n += DOT_ROWS) {
        int rows = n1 - n < DOT_ROWS ? n1 - n : DOT_ROWS;
        const uint16_t *w = j->W + (size_t)n * j->K;
        for (int t = t0; t < t1; t++) {
            const char *xr = (const char *)j->xp + (size_t)t * j->xp_stride * elt;
            j->kern.dot(xr, w, (size_t)j->K, rows, j->K, out);
            float *yr = j->y + (size_t)t * j->N + n;
            if (j->accumulate)
                for (int r = 0; r < rows; r++) yr[r] += out[r];
            else
                for (int r = 0; r < rows; r++) yr[r] = out[r];
        }
    }
}

/* The no-scratch path: scalar loops, x rounded on the fly for FAST. Slow; only when memory ran out. */
static void gemm_nomem(float *y, const float *x, const uint16_t *W, int T, int N, int K, int accumulate,
                       cpu_gemm_precision prec) {
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)t * K;
            const uint16_t *wr = W + (size_t)n * K;
            double s = 0.0; /* double: a long chain of fp32 sums would lose accuracy */
            for (int k = 0; k < K; k++) {
                float xv = prec == CPU_GEMM_FAST ? squad_bf16_to_f32(squad_f32_to_bf16(xr[k])) : xr[k];
                s += (double)xv * squad_bf16_to_f32(wr[k]);
            }
            float *o = y + (size_t)t * N + n;
            *o = accumulate ? *o + (float)s : (float)s;
        }
}

static size_t gemm_scratch_bytes(int T, int K) { return (size_t)T * (size_t)K * sizeof(float) + 64; }

int cpu_gemm_reserve(cpu_pool *pool, int max_T, int max_K, squad_err *err) {
    if (max_T <= 0 || max_K <= 0) return 0;
    return cpu_pool_scratch(pool, gemm_scratch_bytes(max_T, max_K), err) ? 0 : squad_fail_context(err, "GEMM scratch: ");
}

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

void cpu_gemm_bf16_algo(cpu_pool *pool, float *y, const float *x, const uint16_t *W, int T, int N, int K,
                        int accumulate, cpu_gemm_precision prec, cpu_gemm_algo algo) {
    if (T <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate) memset(y, 0, (size_t)T * (size_t)N * sizeof(float));
        return;
    }
    gemm_job j;
    memset(&j, 0, sizeof j);
    j.y = y;
    j.x = x;
    j.W = W;
    j.T = T;
    j.N = N;
    j.K = K;
    j.accumulate = accumulate;
    j.kern = gemm_select(cpu_pool_isa(pool), prec);
    int threads = cpu_pool_threads(pool);

    if (algo == CPU_GEMM_ALGO_NOMEM) {
        gemm_nomem(y, x, W, T, N, K, accumulate, prec);
        return;
    }
    j.xp = x;
    j.xp_stride = (size_t)K;
    if (j.kern.xf != X_AS_IS) {
        squad_err e;
        j.xbuf = cpu_pool_scratch(pool, gemm_scratch_bytes(T, K), &e);
        if (!j.xbuf) {
            gemm_nomem(y, x, W, T, N, K, accumulate, prec);
            return;
        }
        j.prep_rows_per_task = ceil_div(T, threads * TASKS_PER_THREAD);
        cpu_pool_run(pool, gemm_prep_task, &j, ceil_div(T, j.prep_rows_per_task));
        j.xp = j.xbuf;
    }

    /* Task grid: blocks of W rows; when they are too few to keep every thread busy, T is split too. */
    j.n_block_rows = DOT_TASK_ROWS;
    int want = threads * TASKS_PER_THREAD;
    if (ceil_div(N, j.n_block_rows) < want) {
        j.n_block_rows = ceil_div(ceil_div(N, want), DOT_ROWS) * DOT_ROWS;
    }
    j.n_blocks = ceil_div(N, j.n_block_rows);
    j.t_blocks = 1;
    if (j.n_blocks < want) j.t_blocks = ceil_div(want, j.n_blocks);
    if (j.t_blocks > T) j.t_blocks = T;
    j.t_block_rows = ceil_div(T, j.t_blocks);
    j.t_blocks = ceil_div(T, j.t_block_rows);
    cpu_pool_run(pool, gemm_dot_task, &j, j.n_blocks * j.t_blocks);
}

void cpu_gemm_bf16(cpu_pool *pool, float *y, const float *x, const uint16_t *W, int T, int N, int K, int accumulate,
                   cpu_gemm_precision prec) {
    cpu_gemm_bf16_algo(pool, y, x, W, T, N, K, accumulate, prec, CPU_GEMM_ALGO_AUTO);
}
