/*
 * bench_vision.c — the vision tower's time on one image, against the FLOP floor: on the CUDA backend
 * (the default) or on the CPU backend (--device cpu).
 *
 *   bench_vision --model DIR [--reps N] [--grid T,H,W]
 *   bench_vision --model DIR --device cpu [--size WxH] [--threads N] [--precision bf16|exact]
 *                [--reps N] [--peak-gflops G]
 *
 * DIR is a checkpoint with a tower (`squad synth --preset qwen3.5-0.8b --vision --out DIR`: the
 * 0.8B's real tower shapes). The default grid, 1 x 68 x 120, is a 1920x1080 screenshot after the
 * processor (1920x1088: 8,160 patches, 2,040 tokens); the target is <= 8 ms. Pixels are
 * random normalised values (the time does not depend on them). First a check that the tower is the
 * tower: the CUDA output on a small grid (1 x 8 x 12) against the CPU's fp32 tower, held to
 * TOL_VISION_BF16 (tests/tolerances.h; exit 1 beyond it). Then, after one warm-up call (the GEMM
 * plans of the grid's shapes made), N runs of:
 *  - the whole call (be->vision_forward: pixels up from pageable host memory, the tower, rows down),
 *    host clock;
 *  - the device part alone (pixels already on the device), CUDA events;
 *  - one layer's attention alone (random Q / K / V of the grid's frame, every head), on the mma.sync
 *    kernel and on the wgmma one (where the GPU runs it), CUDA events.
 * Printed: p50, min and max of each, and the device part's TFLOP/s (FLOPs counted from the shapes:
 * 2 M N K per GEMM, 4 L^2 hd per head and frame for attention).
 *
 * --device cpu: the CPU backend's vision_forward (src/cpu/vision.c on the backend's pool and
 * precision, bf16 by default) on a screenshot of --size (default 1280x720), its grid the model's
 * processor gives (squad_image_grid with the checkpoint's preprocessor_config.json: smart_resize),
 * random normalised pixels; one warm-up call, then N runs (default 3), host clock. Printed: the grid,
 * the FLOPs, p50 / min / max, the GFLOP/s reached and the floor at a stated peak: --peak-gflops G,
 * else threads x the clock /proc/cpuinfo reports x the FLOPs a core's FMA pipes do a cycle at the
 * instruction set the pool uses (AVX-512: two 512-bit pipes, 64 fp32 FLOP; vdpbf16ps doubles that
 * for bf16 pairs; AVX2: 32), said as such.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "model.h"
#include "squad.h"
#include "util.h"
#include "../tests/tolerances.h"

#include "cpu/gemm.h"
#include "cpu/pool.h"
#include "cpu/vision.h"
#include "image/preprocess.h"
#ifdef SQUAD_HAVE_CUDA
#include "cuda_test_api.h" /* tests/cuda: the device part timed */
#endif

#define CHECK_GRID_H 8
#define CHECK_GRID_W 12
#define MAX_REPS 1000
#define CPU_DEFAULT_REPS 3
#define CPU_DEFAULT_WIDTH 1280
#define CPU_DEFAULT_HEIGHT 720
#define CPU_FLOP_PER_CYCLE_AVX512 64.0 /* a core: two 512-bit FMA pipes x 16 fp32 lanes x 2 */
#define CPU_FLOP_PER_CYCLE_AVX2 32.0   /* two 256-bit FMA pipes x 8 lanes x 2 */
#define CPU_FLOP_PER_CYCLE_SCALAR 2.0
#define CPU_DEFAULT_MHZ 2000.0        /* when /proc/cpuinfo says nothing */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Random normalised pixels for a grid. */
static float *pixels(const squad_vision_config *v, int t, int h, int w, uint64_t seed) {
    const size_t K = (size_t)v->in_channels * v->temporal_patch_size * v->patch_size * v->patch_size;
    const size_t n = (size_t)t * h * w * K;
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; p && i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((double)(seed >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    }
    return p;
}

/* The tower's FLOPs on a grid: its GEMMs and its attention. */
static double tower_flops(const squad_vision_config *v, int t, int h, int w) {
    const double N = (double)t * h * w, L = (double)h * w, H = v->hidden_size, I = v->intermediate_size;
    const double K = (double)v->in_channels * v->temporal_patch_size * v->patch_size * v->patch_size;
    const double mm = (double)v->spatial_merge_size * v->spatial_merge_size, Nm = N / mm, M = mm * H;
    const double per_block = 2 * N * (3 * H * H + H * H + 2 * H * I) + 4 * t * L * L * H;
    return 2 * N * K * H + v->depth * per_block + 2 * Nm * (M * M + M * v->out_hidden_size);
}

/* The clock /proc/cpuinfo reports for the first core (MHz), or 0. */
static double cpu_mhz(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    char line[256];
    double mhz = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "cpu MHz", 7)) {
            const char *c = strchr(line, ':');
            if (c) mhz = atof(c + 1);
            break;
        }
    fclose(f);
    return mhz;
}

/* --device cpu: the CPU backend's tower on a width x height screenshot's grid. */
static int bench_cpu(squad_model *m, int width, int height, int threads, int bf16, int reps, double peak_gflops) {
    if (!m->has_image_proc) {
        fprintf(stderr, "bench_vision: the checkpoint has no preprocessor_config.json (the grid comes from it)\n");
        return 1;
    }
    squad_err err = {0};
    int grid[3];
    if (squad_image_grid(&m->image_proc, width, height, grid, &err) != 0) {
        fprintf(stderr, "bench_vision: grid of %dx%d: %s\n", width, height, err.msg);
        return 1;
    }
    squad_engine_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.precision = bf16 ? SQUAD_PRECISION_BF16 : SQUAD_PRECISION_EXACT;
    opts.threads = threads;
    opts.max_rows = 1;
    squad_backend *be = squad_cpu_backend_new(m, &opts, 256, &err);
    if (!be || !be->vision_forward) {
        fprintf(stderr, "bench_vision: CPU backend: %s\n", be ? "no vision tower" : err.msg);
        if (be) be->destroy(be);
        return 1;
    }
    const squad_vision_config *v = &m->cfg.vision;
    const int t = grid[0], h = grid[1], w = grid[2];
    const size_t rows = (size_t)squad_vision_tokens(v, t, h, w);
    float *px = pixels(v, t, h, w, 1), *out = malloc(rows * v->out_hidden_size * sizeof *out);
    double *ms = malloc(sizeof(double) * (size_t)reps);
    int rc = !px || !out || !ms ? SQUAD_E_NOMEM : 0;
    const double flop = tower_flops(v, t, h, w);
    /* the threads and instruction set the backend's pool gets (a pool made alike, for the figures) */
    cpu_pool *probe = cpu_pool_new(threads, &err);
    const int used = probe ? cpu_pool_threads(probe) : threads;
    const cpu_isa isa = probe ? cpu_pool_isa(probe) : CPU_ISA_SCALAR;
    cpu_pool_free(probe);
    if (!rc) {
        printf("CPU tower (%s, %s), %d threads: %dx%d screenshot -> grid %dx%dx%d (processor): %d patches, %zu tokens, "
               "%.3f TFLOP\n",
               bf16 ? "bf16" : "exact fp32", cpu_isa_name(isa), used, width, height, t, h, w, t * h * w, rows, flop / 1e12);
        rc = be->vision_forward(be, px, grid, out, &err); /* warm-up */
        for (int r = 0; !rc && r < reps; r++) {
            const double t0 = now_s();
            rc = be->vision_forward(be, px, grid, out, &err);
            ms[r] = (now_s() - t0) * 1e3;
        }
        if (rc) fprintf(stderr, "bench_vision: %s\n", err.msg);
    }
    if (!rc) {
        qsort(ms, (size_t)reps, sizeof *ms, cmp_double);
        const double p50 = ms[reps / 2];
        const char *how = "stated by --peak-gflops";
        char said[160];
        if (peak_gflops <= 0) {
            double mhz = cpu_mhz();
            const int from_cpuinfo = mhz > 0;
            if (!from_cpuinfo) mhz = CPU_DEFAULT_MHZ;
            double per_cycle = isa >= CPU_ISA_AVX512   ? CPU_FLOP_PER_CYCLE_AVX512
                               : isa >= CPU_ISA_AVX2 ? CPU_FLOP_PER_CYCLE_AVX2
                                                     : CPU_FLOP_PER_CYCLE_SCALAR;
            if (bf16 && isa >= CPU_ISA_AVX512_BF16) per_cycle *= 2; /* vdpbf16ps: a bf16 pair a lane */
            peak_gflops = used * mhz * 1e-3 * per_cycle;
            snprintf(said, sizeof said, "%d threads x %.0f MHz (%s) x %.0f FLOP a cycle (%s)", used, mhz,
                     from_cpuinfo ? "/proc/cpuinfo" : "assumed", per_cycle, cpu_isa_name(isa));
            how = said;
        }
        const double floor_ms = flop / (peak_gflops * 1e9) * 1e3;
        printf("%-44s p50 %8.1f ms  min %8.1f  max %8.1f  (%.1f GFLOP/s at p50)\n", "CPU tower (vision_forward)", p50,
               ms[0], ms[reps - 1], flop / (p50 * 1e-3) / 1e9);
        printf("FLOP floor at a peak of %.0f GFLOP/s [%s]: %.1f ms; p50 is %.2fx the floor\n", peak_gflops, how,
               floor_ms, p50 / floor_ms);
    }
    free(px), free(out), free(ms);
    be->destroy(be);
    return rc ? 1 : 0;
}

#ifdef SQUAD_HAVE_CUDA
static void print_stats(const char *what, double *ms, int n, double flop) {
    qsort(ms, (size_t)n, sizeof *ms, cmp_double);
    const double p50 = ms[n / 2];
    printf("%-44s p50 %8.3f ms  min %8.3f  max %8.3f", what, p50, ms[0], ms[n - 1]);
    if (flop > 0) printf("  (%.0f TFLOP/s at p50)", flop / (p50 * 1e-3) / 1e12);
    printf("\n");
}

/* The CUDA tower against the CPU's fp32 tower on a small grid: 0 when within TOL_VISION_BF16. */
static int check_tower(squad_backend *be, const squad_model *m) {
    const squad_vision_config *v = &m->cfg.vision;
    const int grid[3] = {1, CHECK_GRID_H, CHECK_GRID_W};
    const size_t rows = (size_t)squad_vision_tokens(v, 1, CHECK_GRID_H, CHECK_GRID_W), n = rows * v->out_hidden_size;
    float *px = pixels(v, 1, CHECK_GRID_H, CHECK_GRID_W, 7), *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
    squad_err err = {0};
    cpu_pool *pool = cpu_pool_new(0, &err);
    int rc = !px || !got || !want || !pool ? SQUAD_E_NOMEM : 0;
    if (!rc) rc = be->vision_forward(be, px, grid, got, &err);
    if (!rc) rc = cpu_vision_forward(pool, CPU_GEMM_EXACT, m, px, 1, CHECK_GRID_H, CHECK_GRID_W, want, &err);
    if (!rc) {
        double worst = 0, mag = 0;
        for (size_t i = 0; i < n; i++) {
            const double d = fabs((double)got[i] - want[i]);
            worst = d > worst || isnan(d) ? d : worst;
            mag = fabs(want[i]) > mag ? fabs(want[i]) : mag;
        }
        const double bound = TOL_VISION_BF16 * (mag > 1 ? mag : 1);
        printf("check 1x%dx%d against the CPU fp32 tower: max |CUDA - CPU| %.3e, outputs up to %.3f, bound %.3e: %s\n",
               CHECK_GRID_H, CHECK_GRID_W, worst, mag, bound, worst <= bound ? "ok" : "FAILED");
        if (!(worst <= bound)) rc = 1;
    } else {
        fprintf(stderr, "bench_vision: check: %s\n", err.msg);
    }
    cpu_pool_free(pool);
    free(px), free(got), free(want);
    return rc;
}

/* The CUDA backend's tower on a grid: the check, then the whole call and the device part. */
static int bench_cuda(squad_model *m, const int grid[3], int reps) {
    squad_err err = {0};
    squad_engine_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.precision = SQUAD_PRECISION_BF16;
    opts.max_rows = 1;
    squad_backend *be = squad_cuda_backend_new(m, &opts, 4096, &err);
    if (!be) {
        fprintf(stderr, "bench_vision: CUDA backend: %s\n", err.msg);
        squad_model_free(m);
        return 1;
    }
    const squad_vision_config *v = &m->cfg.vision;
    printf("vision tower: depth %d, hidden %d, %d heads of %d, MLP %d, patch %d, merge %d, out %d\n", v->depth,
           v->hidden_size, v->num_heads, v->head_dim, v->intermediate_size, v->patch_size, v->spatial_merge_size,
           v->out_hidden_size);
    int rc = be->vision_forward ? check_tower(be, m) : 1;
    const int t = grid[0], h = grid[1], w = grid[2];
    const size_t rows = (size_t)squad_vision_tokens(v, t, h, w);
    float *px = pixels(v, t, h, w, 1), *out = malloc(rows * v->out_hidden_size * sizeof *out);
    double *ms = malloc(sizeof(double) * (size_t)reps);
    if (!rc && (!px || !out || !ms)) rc = SQUAD_E_NOMEM;
    const double flop = tower_flops(v, t, h, w);
    if (!rc) {
        printf("grid %dx%dx%d: %d patches, %zu tokens, %.2f TFLOP\n", t, h, w, t * h * w, rows, flop / 1e12);
        rc = be->vision_forward(be, px, grid, out, &err); /* warm-up: the GEMM plans of these shapes */
        for (int r = 0; !rc && r < reps; r++) {
            const double t0 = now_s();
            rc = be->vision_forward(be, px, grid, out, &err);
            ms[r] = (now_s() - t0) * 1e3;
        }
        if (!rc) print_stats("whole call (pixels up, tower, rows down)", ms, reps, 0);
        if (!rc) rc = squad_cuda_test_vision_time(be, px, grid, reps, ms, &err);
        if (!rc) print_stats("device part (pixels resident)", ms, reps, flop);
        /* one layer's attention alone, on each kernel (one frame of h w patches, every head) */
        const int L = h * w;
        const double attn_flop = 4.0 * L * (double)L * v->head_dim * v->num_heads;
        for (int wg = 0; wg < 2 && !rc; wg++) {
            char what[96];
            snprintf(what, sizeof what, "attention, one layer (%s)", wg ? "wgmma" : "mma.sync");
            const int arc = squad_cuda_test_vis_attn_time(wg, v->head_dim, L, v->num_heads, reps, ms, &err);
            if (arc == 0)
                print_stats(what, ms, reps, attn_flop);
            else if (arc == SQUAD_E_UNSUPPORTED)
                printf("%-44s not on this GPU / head dim: %s\n", what, err.msg);
            else
                rc = arc;
        }
        if (rc) fprintf(stderr, "bench_vision: %s\n", err.msg);
    }
    free(px), free(out), free(ms);
    be->destroy(be);
    return rc ? 1 : 0;
}
#endif

static void usage(void) {
    fprintf(stderr, "usage: bench_vision --model DIR [--device cuda|cpu] [--reps N (1..%d)] [--grid T,H,W (cuda)]\n"
                    "       [--size WxH (cpu)] [--threads N (cpu)] [--precision bf16|exact (cpu)] [--peak-gflops G (cpu)]\n",
            MAX_REPS);
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    int reps = 0, grid[3] = {1, 68, 120}, cpu = 0, width = CPU_DEFAULT_WIDTH, height = CPU_DEFAULT_HEIGHT;
    int threads = 0, bf16 = 1;
    double peak = 0;
    for (int i = 1; i < argc; i++) {
        const int more = i + 1 < argc;
        if (!strcmp(argv[i], "--model") && more)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--reps") && more)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && more) {
            const char *d = argv[++i];
            if (strcmp(d, "cpu") && strcmp(d, "cuda")) {
                usage();
                return 2;
            }
            cpu = !strcmp(d, "cpu");
        } else if (!strcmp(argv[i], "--grid") && more) {
            if (sscanf(argv[++i], "%d,%d,%d", &grid[0], &grid[1], &grid[2]) != 3) {
                fprintf(stderr, "bench_vision: --grid T,H,W\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--size") && more) {
            if (sscanf(argv[++i], "%dx%d", &width, &height) != 2 || width < 1 || height < 1) {
                fprintf(stderr, "bench_vision: --size WxH\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--threads") && more)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--precision") && more) {
            const char *p = argv[++i];
            if (strcmp(p, "bf16") && strcmp(p, "exact")) {
                usage();
                return 2;
            }
            bf16 = !strcmp(p, "bf16");
        } else if (!strcmp(argv[i], "--peak-gflops") && more)
            peak = atof(argv[++i]);
        else {
            usage();
            return 2;
        }
    }
    if (!reps) reps = cpu ? CPU_DEFAULT_REPS : 20;
    if (!dir || reps < 1 || reps > MAX_REPS || threads < 0) {
        usage();
        return 2;
    }
#ifndef SQUAD_HAVE_CUDA
    if (!cpu) {
        printf("bench_vision: built without CUDA (--device cpu times the CPU tower)\n");
        return 0;
    }
#endif
    squad_err err = {0};
    squad_model *m = squad_model_load(dir, &err);
    if (!m) {
        fprintf(stderr, "bench_vision: %s\n", err.msg);
        return 1;
    }
    if (!m->cfg.has_vision) {
        fprintf(stderr, "bench_vision: %s has no vision tower (squad synth --preset qwen3.5-0.8b --vision)\n", dir);
        squad_model_free(m);
        return 1;
    }
    int rc = 1;
    if (cpu) rc = bench_cpu(m, width, height, threads, bf16, reps, peak);
#ifdef SQUAD_HAVE_CUDA
    else
        rc = bench_cuda(m, grid, reps);
#endif
    squad_model_free(m);
    return rc;
}
