/*
 * bench_gemm.c — GFLOP/s of cpu_gemm_bf16 (FAST and EXACT) against OpenBLAS cblas_sgemm on the
 * Qwen3.5-0.8B projection shapes, with 1 and 2 threads, and the share of the cores' fp32 FMA peak.
 *
 * Usage: bench_gemm [--T 1,128,512,2048] [--threads 1,2] [--seconds S] [--wall] [--no-blas] [--print-isa]
 * (--print-isa: only print the ISA level the CPU kernels would use, and exit.)
 * Times are process CPU time divided by the thread count unless --wall: on a machine shared with
 * other work, wall time measures the neighbours; CPU time measures the code (spin-waits included,
 * so a multi-threaded figure errs low). On a quiet machine use --wall.
 * OpenBLAS gets an fp32 copy of W (it has no bf16 x fp32 GEMM); OPENBLAS_CORETYPE, when set in the
 * environment, forces OpenBLAS's kernel choice: run with it unset for a fair comparison (the
 * program prints the kernel OpenBLAS picked). Every figure is the median of several runs.
 *
 * The peak: cores x clock x fp32 FLOP per cycle per core. Both factors are measured, not assumed:
 * the clock from a chain of dependent integer adds (one per cycle), the FLOP per cycle from 16
 * independent chains of 512-bit (or 256-bit) FMAs, rounded to the nearest power of two. (Zen 4
 * has two 256-bit FMA pipes: 32 FLOP/cycle; Zen 5 has two 512-bit pipes: 64.)
 * vdpbf16ps does twice the FLOP of an fp32 FMA per instruction, so FAST can exceed "100%".
 *
 * A "model" line per T sums the shapes the way the 0.8B model uses them (18 Gated DeltaNet layers:
 * in_proj_qkv, in_proj_z, in_proj_a, in_proj_b, out_proj; 6 attention layers: q_proj (with the
 * gate), k_proj, v_proj, o_proj; 24 MLPs: gate, up, down) into tokens per second of GEMM time.
 */
#define _GNU_SOURCE
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/gemm.h"
#include "cpu/pool.h"

typedef struct shape {
    const char *name;
    int N, K;
    int uses; /* calls per token through the whole model */
} shape;

static const shape SHAPES[] = {
    {"in_proj_qkv", 6144, 1024, 18}, {"in_proj_z", 2048, 1024, 18}, {"in_proj_a/b", 16, 1024, 36},
    {"out_proj/o_proj", 1024, 2048, 24}, {"q_proj", 4096, 1024, 6}, {"k/v_proj", 512, 1024, 12},
    {"gate/up", 3584, 1024, 48}, {"down", 1024, 3584, 24},
};
#define N_SHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the whole process: with one thread (no pool workers, OpenBLAS single-threaded) it
 * counts only the time the benchmark actually ran, so other load on a shared machine does not
 * slow the figures down (it can still evict caches). */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


/* The core clock in GHz: a dependent chain of integer adds retires one per cycle. */
static double measure_ghz(void) {
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        uint64_t n = 200000000ull, v = 0;
        double t0 = cpu_s();
#if defined(__x86_64__)
        for (uint64_t i = 0; i < n; i += 8)
            __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
                             "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
                             : "+r"(v));
#else
        for (uint64_t i = 0; i < n; i++) __asm__ volatile("" : "+r"(v));
#endif
        double dt = cpu_s() - t0;
        /* 8 adds plus the loop's own (fused, parallel) add and branch: ~8 cycles per iteration. */
        double ghz = (double)n / dt * 1e-9;
        if (ghz > best) best = ghz;
    }
    return best;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FMA_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define FMA_ROUNDS 20000000L
/* GFLOP/s of 16 independent chains of zmm FMAs (latency hidden: pure throughput). */
__attribute__((target("avx512f"))) static double fma_gflops_512(void) {
    __m512 b = _mm512_set1_ps(1e-9f), c = _mm512_set1_ps(1.0f), s = _mm512_setzero_ps();
#define FMA_DECL(i) __m512 a##i = _mm512_set1_ps((float)i);
#define FMA_STEP(i) a##i = _mm512_fmadd_ps(a##i, c, b);
#define FMA_SUM(i) s = _mm512_add_ps(s, a##i);
    FMA_CHAINS(FMA_DECL)
    double t0 = cpu_s();
    for (long r = 0; r < FMA_ROUNDS; r++) {
        FMA_CHAINS(FMA_STEP)
    }
    double dt = cpu_s() - t0;
    FMA_CHAINS(FMA_SUM)
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return 2.0 * 16 * 16 * FMA_ROUNDS / dt * 1e-9;
}
/* 12 chains, not 16: AVX2 has 16 ymm registers, and 16 chains plus the two operands spill (which
 * measured Zen 3 at 18 FLOP/cycle instead of its 32). */
#define FMA_CHAINS_256(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
__attribute__((target("avx2,fma"))) static double fma_gflops_256(void) {
    __m256 b = _mm256_set1_ps(1e-9f), c = _mm256_set1_ps(1.0f), s = _mm256_setzero_ps();
#undef FMA_DECL
#undef FMA_STEP
#undef FMA_SUM
#define FMA_DECL(i) __m256 a##i = _mm256_set1_ps((float)i);
#define FMA_STEP(i) a##i = _mm256_fmadd_ps(a##i, c, b);
#define FMA_SUM(i) s = _mm256_add_ps(s, a##i);
    FMA_CHAINS_256(FMA_DECL)
    double t0 = cpu_s();
    for (long r = 0; r < FMA_ROUNDS; r++) {
        FMA_CHAINS_256(FMA_STEP)
    }
    double dt = cpu_s() - t0;
    FMA_CHAINS_256(FMA_SUM)
    float out[8];
    _mm256_storeu_ps(out, s);
    volatile float sink = out[0];
    (void)sink;
    return 2.0 * 8 * 12 * FMA_ROUNDS / dt * 1e-9;
}
#endif

/* fp32 FLOP per cycle per core: the best of a few FMA throughput runs over the clock, rounded to a
 * power of two (the machine may be shared: a run can be slowed, never sped up). */
static int measure_flop_per_cycle(double ghz, double *measured) {
    double best = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    int avx512 = __builtin_cpu_supports("avx512f");
    for (int rep = 0; rep < 5; rep++) {
        double g = avx512 ? fma_gflops_512() : __builtin_cpu_supports("fma") ? fma_gflops_256() : 0;
        if (g > best) best = g;
    }
#endif
    *measured = best / ghz;
    int f = 2;
    while (f * 1.414 < *measured) f *= 2;
    return f;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct bench_data {
    float *x, *y, *Wf;
    uint16_t *W;
} bench_data;

enum { M_FAST = 0, M_EXACT = 1, M_BLAS = 2, N_METHODS = 3 };
static const char *METHOD_NAMES[N_METHODS] = {"squad FAST", "squad EXACT", "OpenBLAS sgemm"};

static void run_once(int method, cpu_pool *pool, bench_data *d, int T, int N, int K) {
    switch (method) {
    case M_FAST: cpu_gemm_bf16(pool, d->y, d->x, d->W, T, N, K, 0, CPU_GEMM_FAST); break;
    case M_EXACT: cpu_gemm_bf16(pool, d->y, d->x, d->W, T, N, K, 0, CPU_GEMM_EXACT); break;
    default:
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, N, K, 1.0f, d->x, K, d->Wf, K, 0.0f, d->y, N);
        break;
    }
}

/* Median seconds per call: at least min_runs runs and about `seconds` in all. */
/* cpu_clock: process CPU time divided by the thread count, the time the call would take with the
 * threads' cores to themselves (spin-waiting counts, so it errs on the slow side); else wall time. */
static double time_method(int method, cpu_pool *pool, bench_data *d, int T, int N, int K, double seconds,
                          int cpu_clock, int threads) {
    enum { MAX_RUNS = 51, MIN_RUNS = 5 };
    double times[MAX_RUNS];
    double (*clk)(void) = cpu_clock ? cpu_s : now_s;
    run_once(method, pool, d, T, N, K); /* warm-up: scratch growth, caches, OpenBLAS buffers */
    int n = 0;
    double start = now_s();
    while (n < MAX_RUNS && (n < MIN_RUNS || now_s() - start < seconds)) {
        double t0 = clk();
        run_once(method, pool, d, T, N, K);
        times[n++] = (clk() - t0) / (cpu_clock ? threads : 1);
    }
    qsort(times, (size_t)n, sizeof times[0], cmp_double);
    return times[n / 2];
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) break;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

int main(int argc, char **argv) {
    int Ts[8] = {1, 128, 512, 2048}, nT = 4;
    int threads_list[8] = {1, 2}, n_threads = 2;
    double seconds = 0.4;
    int use_blas = 1, cpu_clock = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--T") && i + 1 < argc)
            nT = parse_list(argv[++i], Ts, 8);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            n_threads = parse_list(argv[++i], threads_list, 8);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--wall"))
            cpu_clock = 0;
        else if (!strcmp(argv[i], "--no-blas"))
            use_blas = 0;
        else if (!strcmp(argv[i], "--print-isa")) {
            /* the level a new pool gets: the CPU's, lowered by SQUAD_CPU_ISA (bench/run.sh prints it) */
            squad_err err;
            cpu_isa isa;
            if (cpu_effective_isa(&isa, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 2;
            }
            printf("%s\n", cpu_isa_name(isa));
            return 0;
        } else {
            fprintf(stderr, "usage: %s [--T 1,128,512,2048] [--threads 1,2] [--seconds S] [--wall] [--no-blas] [--print-isa]\n",
                    argv[0]);
            return 2;
        }
    }

    int maxT = 1;
    for (int i = 0; i < nT; i++)
        if (Ts[i] > maxT) maxT = Ts[i];
    size_t max_nk = 0, max_tk = 0, max_tn = 0;
    for (int s = 0; s < N_SHAPES; s++) {
        size_t nk = (size_t)SHAPES[s].N * SHAPES[s].K, tk = (size_t)maxT * SHAPES[s].K, tn = (size_t)maxT * SHAPES[s].N;
        if (nk > max_nk) max_nk = nk;
        if (tk > max_tk) max_tk = tk;
        if (tn > max_tn) max_tn = tn;
    }
    bench_data d;
    d.x = malloc(max_tk * sizeof(float));
    d.y = malloc(max_tn * sizeof(float));
    d.Wf = malloc(max_nk * sizeof(float));
    d.W = malloc(max_nk * sizeof(uint16_t));
    if (!d.x || !d.y || !d.Wf || !d.W) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    uint64_t r = 88172645463325252ull;
    for (size_t i = 0; i < max_tk; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        d.x[i] = (float)((double)(r >> 11) / 9007199254740992.0 - 0.5);
    }
    for (size_t i = 0; i < max_nk; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        d.W[i] = squad_f32_to_bf16((float)((double)(r >> 11) / 9007199254740992.0 - 0.5) * 0.05f);
        d.Wf[i] = squad_bf16_to_f32(d.W[i]);
    }

    double ghz = measure_ghz(), fpc_measured;
    int fpc = measure_flop_per_cycle(ghz, &fpc_measured);
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("CPU GEMM benchmark: cpu_gemm_bf16 vs OpenBLAS cblas_sgemm (fp32 W), y[T][N] = x[T][K] W[N][K]^T\n");
    printf("isa: %s; OpenBLAS: %s, kernel %s%s%s\n", cpu_isa_name(cpu_detect_isa()), openblas_get_config(),
           openblas_get_corename(), ct ? ", OPENBLAS_CORETYPE=" : "", ct ? ct : "");
    printf("clock: %.2f GHz (measured: dependent integer add chain, CPU time); fp32 FMA throughput measured at %.1f FLOP/cycle "
           "-> %d FLOP/cycle; fp32 FMA peak per core = %.2f GHz x %d = %.1f GFLOP/s (bf16 vdpbf16ps: twice that)\n",
           ghz, fpc_measured, fpc, ghz, fpc, ghz * fpc);
    printf("median of >= 5 runs per figure; GFLOP/s = 2*T*N*K / time\n\n");

    for (int ti = 0; ti < n_threads; ti++) {
        int threads = threads_list[ti];
        squad_err err;
        cpu_pool *pool = cpu_pool_new(threads, &err);
        if (!pool) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        openblas_set_num_threads(threads);
        double peak = ghz * fpc * threads;
        printf("threads %d: fp32 FMA peak %.1f GFLOP/s; times: %s\n", threads, peak,
               cpu_clock ? "process CPU time / threads (immune to other load on the machine)" : "wall clock");
        printf("%-16s %5s %6s %6s | %10s %10s %10s | %7s %7s %7s | %s\n", "shape", "T", "N", "K", "FAST", "EXACT",
               "OpenBLAS", "FAST%pk", "EXA%pk", "BLAS%pk", "FAST/BLAS");
        for (int tt = 0; tt < nT; tt++) {
            int T = Ts[tt];
            double model_s[N_METHODS] = {0};
            for (int s = 0; s < N_SHAPES; s++) {
                int N = SHAPES[s].N, K = SHAPES[s].K;
                double flop = 2.0 * T * N * K, gf[N_METHODS] = {0};
                for (int m = 0; m < N_METHODS; m++) {
                    if (m == M_BLAS && !use_blas) continue;
                    double t = time_method(m, pool, &d, T, N, K, seconds, cpu_clock, threads);
                    gf[m] = flop / t * 1e-9;
                    model_s[m] += t * SHAPES[s].uses;
                }
                printf("%-16s %5d %6d %6d | %10.1f %10.1f %10.1f | %6.0f%% %6.0f%% %6.0f%% | %.2fx\n", SHAPES[s].name,
                       T, N, K, gf[0], gf[1], gf[2], 100 * gf[0] / peak, 100 * gf[1] / peak, 100 * gf[2] / peak,
                       gf[2] > 0 ? gf[0] / gf[2] : 0.0);
            }
            printf("%-16s %5d  model GEMMs only: tokens/s", "0.8B model", T);
            for (int m = 0; m < N_METHODS; m++)
                if (model_s[m] > 0) printf("  %s %.1f", METHOD_NAMES[m], T / model_s[m]);
            printf("\n");
        }
        printf("\n");
        cpu_pool_free(pool);
    }
    free(d.x);
    free(d.y);
    free(d.Wf);
    free(d.W);
    return 0;
}
