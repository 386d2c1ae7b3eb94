/*
 * test_gemm.c — the CPU thread pool (src/cpu/pool.c) and the bf16 GEMM (src/cpu/gemm.c).
 *
 * Pool: every task of every job runs exactly once, for 1, 2 and 5 threads and job sizes below,
 * at and above the thread count, back to back (the spinning path) and after a pause long enough
 * for the workers to fall asleep (the condition-variable path).
 * GEMM: every ISA this CPU has (forced through cpu_pool_set_isa), every algorithm (forced through
 * cpu_gemm_bf16_algo) and both precisions against cpu_gemm_bf16_ref on random data: odd T, N, K,
 * T past one token block,
 * a W pointer off any 64-byte boundary, accumulate on and off. EXACT must be within 1e-6 of the
 * oracle (relative L2); FAST within 1e-2, visibly different from EXACT, and close to the oracle
 * run on x rounded to bf16 (which is what FAST means).
 */
#define _DEFAULT_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/gemm.h"
#include "cpu/pool.h"
#include "testutil.h"
#include "tolerances.h"

/* ---------------------------------------------------------------- pool */

#define MAX_TASKS 64

typedef struct count_ctx {
    atomic_int hits[MAX_TASKS];
    atomic_int bad_thread;
    atomic_int bad_n;
    int threads;
    int n_tasks;
} count_ctx;

static void count_task(void *ctx, int task, int n_tasks) {
    count_ctx *c = ctx;
    if (n_tasks != c->n_tasks || task < 0 || task >= n_tasks) atomic_fetch_add(&c->bad_n, 1);
    else atomic_fetch_add(&c->hits[task], 1);
}

static void count_task_indexed(void *ctx, int task, int n_tasks, int thread) {
    count_ctx *c = ctx;
    if (thread < 0 || thread >= c->threads) atomic_fetch_add(&c->bad_thread, 1);
    count_task(ctx, task, n_tasks);
}

static void test_pool(int threads) {
    squad_err err;
    cpu_pool *p = cpu_pool_new(threads, &err);
    CHECKF(p != NULL, "%s", err.msg);
    if (!p) return;
    CHECK(cpu_pool_threads(p) == threads);
    const int sizes[] = {0, 1, threads - 1, threads, threads + 1, 2 * threads + 3, MAX_TASKS};
    for (int rep = 0; rep < 300; rep++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            int n = sizes[s];
            if (n < 0) continue;
            count_ctx c;
            memset(&c, 0, sizeof c);
            c.threads = threads;
            c.n_tasks = n;
            if (rep & 1)
                cpu_pool_run_indexed(p, count_task_indexed, &c, n);
            else
                cpu_pool_run(p, count_task, &c, n);
            int ok = 1;
            for (int i = 0; i < MAX_TASKS; i++)
                if (atomic_load(&c.hits[i]) != (i < n ? 1 : 0)) ok = 0;
            CHECKF(ok && atomic_load(&c.bad_n) == 0 && atomic_load(&c.bad_thread) == 0,
                   "threads %d n_tasks %d rep %d", threads, n, rep);
        }
        /* Now and then let the workers fall asleep, so the wake-up path is exercised too. */
        if (rep % 100 == 99) usleep(30000);
    }
    cpu_pool_free(p);
}

/* ---------------------------------------------------------------- GEMM */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float rng_unit(void) { return (float)((double)(rng_next() >> 11) / 9007199254740992.0) * 2.0f - 1.0f; }
static int rng_int(int lo, int hi) { return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1)); }

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

typedef struct gemm_case {
    int T, N, K;
    size_t w_offset; /* uint16 elements past a 64-byte boundary */
} gemm_case;

static const char *algo_name(cpu_gemm_algo a) {
    switch (a) {
    case CPU_GEMM_ALGO_DOT: return "dot";
    case CPU_GEMM_ALGO_PACKED: return "packed";
    case CPU_GEMM_ALGO_NOMEM: return "nomem";
    default: return "auto";
    }
}

/* One shape on one pool: every algorithm x precision x accumulate. */
static void test_gemm_case(cpu_pool *pool, const gemm_case *gc) {
    int T = gc->T, N = gc->N, K = gc->K;
    size_t nx = (size_t)T * K, nw = (size_t)N * K, ny = (size_t)T * N;
    float *x = malloc(nx * sizeof *x), *xr = malloc(nx * sizeof *xr);
    uint16_t *wbuf = aligned_alloc(64, ((nw + gc->w_offset) * sizeof(uint16_t) + 63) / 64 * 64);
    float *y0 = malloc(ny * sizeof *y0), *y = malloc(ny * sizeof *y), *ref = malloc(ny * sizeof *ref),
          *ref_fast = malloc(ny * sizeof *ref_fast);
    if (!x || !xr || !wbuf || !y0 || !y || !ref || !ref_fast) {
        CHECK(!"out of memory in the test");
        goto done;
    }
    uint16_t *W = wbuf + gc->w_offset;
    for (size_t i = 0; i < nx; i++) {
        x[i] = rng_unit() * 2.0f;
        xr[i] = squad_bf16_to_f32(squad_f32_to_bf16(x[i]));
    }
    for (size_t i = 0; i < nw; i++) W[i] = squad_f32_to_bf16(rng_unit() * 0.1f);
    for (size_t i = 0; i < ny; i++) y0[i] = rng_unit();

    const cpu_gemm_algo algos[] = {CPU_GEMM_ALGO_AUTO, CPU_GEMM_ALGO_DOT, CPU_GEMM_ALGO_PACKED, CPU_GEMM_ALGO_NOMEM};
    for (int acc = 0; acc <= 1; acc++) {
        memcpy(ref, y0, ny * sizeof *ref);
        memcpy(ref_fast, y0, ny * sizeof *ref);
        cpu_gemm_bf16_ref(ref, x, W, T, N, K, acc);
        cpu_gemm_bf16_ref(ref_fast, xr, W, T, N, K, acc);
        /* Errors are relative to the product's own norm (accumulate must not hide them), plus one
         * fp32 rounding of the final sum y0 + product, which even a perfect kernel makes. */
        double prod2 = 0, ref2 = 0;
        for (size_t i = 0; i < ny; i++) {
            double p = (double)ref[i] - (acc ? (double)y0[i] : 0.0);
            prod2 += p * p;
            ref2 += (double)ref[i] * ref[i];
        }
        double scale = prod2 > 0 ? sqrt(ref2 / prod2) : 1.0; /* converts "relative to ref" */
        double slack = acc ? 1.2e-7 * scale : 0.0;
        for (size_t ai = 0; ai < sizeof algos / sizeof algos[0]; ai++) {
            for (int prec = 0; prec <= 1; prec++) {
                memcpy(y, y0, ny * sizeof *y);
                cpu_gemm_bf16_algo(pool, y, x, W, T, N, K, acc, (cpu_gemm_precision)prec, algos[ai]);
                double e = rel_err(y, ref, ny) * scale;
                const char *what = prec ? "fast" : "exact";
                if (prec == CPU_GEMM_EXACT) {
                    CHECKF(e <= TOL_GEMM_EXACT_REF + slack, "%s %s %s T=%d N=%d K=%d acc=%d off=%zu: rel err %.3g",
                           cpu_isa_name(cpu_pool_isa(pool)), algo_name(algos[ai]), what, T, N, K, acc,
                           gc->w_offset, e);
                } else {
                    double ef = rel_err(y, ref_fast, ny) * scale;
                    /* FAST: bf16 x (error ~2^-9 relative per element) but otherwise an fp32 sum. */
                    CHECKF(e <= TOL_GEMM_BF16_REF && e > TOL_GEMM_BF16_MIN_DIFF && ef <= TOL_GEMM_BF16_BF16REF + slack,
                           "%s %s %s T=%d N=%d K=%d acc=%d off=%zu: rel err %.3g vs exact, %.3g vs bf16-x",
                           cpu_isa_name(cpu_pool_isa(pool)), algo_name(algos[ai]), what, T, N, K, acc,
                           gc->w_offset, e, ef);
                }
            }
        }
    }
done:
    free(x);
    free(xr);
    free(wbuf);
    free(y0);
    free(y);
    free(ref);
    free(ref_fast);
}

static void test_gemm(int threads) {
    squad_err err;
    cpu_pool *pool = cpu_pool_new(threads, &err);
    CHECKF(pool != NULL, "%s", err.msg);
    if (!pool) return;
    cpu_isa best = cpu_detect_isa();
    /* Fixed shapes: the edges of every tiling, a GEMV, a tiny N, a model shape at small T. */
    const gemm_case fixed[] = {
        {1, 1, 1, 0},     {1, 17, 33, 1},   {3, 5, 7, 3},      {12, 32, 64, 0},   {13, 33, 65, 5},
        {1, 1024, 2048, 1}, {2, 16, 1024, 0}, {37, 16, 1024, 7}, {25, 100, 31, 9}, {64, 96, 256, 0},
        {5, 48, 3584, 1}, {130, 70, 129, 2},
        /* longer than one token block of the packed path (512) */
        {600, 37, 45, 3}, {1100, 20, 70, 1}, {150, 20, 3584, 1},
    };
    for (int isa = 0; isa <= (int)best; isa++) {
        cpu_pool_set_isa(pool, (cpu_isa)isa);
        CHECK(cpu_pool_isa(pool) == (cpu_isa)isa);
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) test_gemm_case(pool, &fixed[i]);
        for (int r = 0; r < 12; r++) {
            gemm_case gc = {rng_int(1, 80), rng_int(1, 150), rng_int(1, 700), (size_t)rng_int(0, 31)};
            test_gemm_case(pool, &gc);
        }
    }
    cpu_pool_free(pool);
}

int main(void) {
    test_pool(1);
    test_pool(2);
    test_pool(5);
    test_gemm(1);
    test_gemm(2);
    test_gemm(5);
    /* threads 0: the available cores. */
    squad_err err;
    cpu_pool *p = cpu_pool_new(0, &err);
    CHECK(p != NULL && cpu_pool_threads(p) == cpu_available_cores());
    cpu_pool_free(p);
    return test_summary("test_gemm");
}
