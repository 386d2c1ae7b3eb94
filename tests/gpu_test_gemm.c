/*
 * gpu_test_gemm.c — the projections' GEMM on the GPU: the sm_90a small-M kernel (k_gemm_sm90.cu) in
 * every configuration the tuning would time, and cuBLASLt's choice, against a plain host reference,
 * then (unless told not to) each shape timed: cuBLASLt tuned alone, the kernel's best configuration,
 * and what the backend's tuning picks between them.
 *
 * Cases: the 0.8B preset's fused projections (GDN in_proj 8224 x 1024, attention q/k/v 5120 x 1024,
 * gate_up 7168 x 1024, out / o 1024 x 2048, down 1024 x 3584) at M = 1, 7, 32, 100, 128, 256, 512
 * tokens, each in both epilogues (bf16 store; fp32 added into a residual), and for the sm_90a kernel
 * alone an odd shape (N 1001, K 1000: partial tiles, no vector stores). Inputs are fresh random
 * bf16 values; the device output is poisoned (NaN) in the rows before and after it, which must stay
 * untouched, and inside it where the bf16 epilogue must write every element (NaN fails the check).
 * The reference accumulates in float64 and is computed once per (shape, M) for both epilogues.
 *
 * Also: the plan file round trip of an sm_90a choice beside a cuBLASLt one.
 *
 * The decomposition probe (SQUAD_GEMM_PROBE=1, instead of everything above; docs/cuda.md): for the
 * model shapes at a hit's M = 32 and 128, the sm_90a kernel's variants that leave its later stages
 * out (launch alone, prologue, loads, main loop, staging and cluster barriers, split-K sums) timed
 * beside the product and beside the candidate changes, in the tuning's configuration and the fastest
 * one, with the weights' HBM floor and cuBLASLt; the differences say where a call's time goes. The
 * product and the candidates, which write Y, are checked against the reference first.
 *
 * Run: gpu_test_gemm (from the build folder; exits 77 without a GPU). SQUAD_GPU_TEST_QUICK=1 (the
 * sanitizer runs): M = 7 and 100 only, no timing. SQUAD_GEMM_TEST_TIME=0: no timing. On a GPU without
 * the sm_90a kernel (any compute capability but 9.0) only the cuBLASLt cases run, and it says so
 * (and the probe exits 77).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "testutil.h"
#include "tolerances.h"
#include "util.h"

#ifdef SQUAD_HAVE_CUDA
#include "cuda_test_gemm.h" /* tests/cuda */

#define MAX_CFGS 32

typedef struct shape {
    const char *name;
    int N, K, acc; /* acc: the epilogue the model uses it with (timed in that one) */
    int odd;       /* not a model shape: the sm_90a kernel's edges only (no cuBLASLt, not timed) */
} shape;
static const shape SHAPES[] = {
    {"gdn in_proj", 8224, 1024, 0, 0}, {"attn qkv", 5120, 1024, 0, 0}, {"mlp gate_up", 7168, 1024, 0, 0},
    {"out / o", 1024, 2048, 1, 0},     {"mlp down", 1024, 3584, 1, 0},
    /* N odd (a partial row tile, no 4-row vector stores, an output not 8-byte aligned), K not a
     * multiple of 64 (the last k block half out of range) */
    {"odd", 1001, 1000, 0, 1},
};
#define N_SHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))
static const int MS[] = {1, 7, 32, 100, 128, 256, 512};
static const int MS_QUICK[] = {7, 100};

/* ---- random inputs (testutil.h's stream), rounded to bf16 ---- */
static float *randn_bf16(rng *r, size_t n, double sd) {
    float *p = malloc(n * sizeof *p);
    if (!p) abort();
    for (size_t i = 0; i < n; i++) p[i] = squad_bf16_to_f32(squad_f32_to_bf16((float)(rng_norm(r) * sd)));
    return p;
}

/* The plain reference: P[m][n] = sum_k X[m][k] W[n][k], float64 accumulation (each product of two
 * bf16 values is exact in float). */
static void ref_product(const float *X, const float *W, float *P, int M, int N, int K) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const float *x = X + (size_t)m * K, *w = W + (size_t)n * K;
            double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            int k = 0;
            for (; k + 4 <= K; k += 4) {
                s0 += (double)(x[k] * w[k]);
                s1 += (double)(x[k + 1] * w[k + 1]);
                s2 += (double)(x[k + 2] * w[k + 2]);
                s3 += (double)(x[k + 3] * w[k + 3]);
            }
            for (; k < K; k++) s0 += (double)(x[k] * w[k]);
            P[(size_t)m * N + n] = (float)((s0 + s1) + (s2 + s3));
        }
}

/* relative L2 error of a (minus sub, when given) against ref; NaN anywhere gives +inf */
static double rel_err(const float *a, const float *sub, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        const double d = ((double)a[i] - (sub ? sub[i] : 0.0)) - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void cfg_name(char *buf, size_t n, const int *cfg) {
    if (cfg) snprintf(buf, n, "sm90a wg %d nt %d splits %d", cfg[0], cfg[1], cfg[2]);
    else snprintf(buf, n, "cuBLASLt");
}

/* The probe's names of the kernel's variants (cuda_test_gemm.h's SQUAD_GEMM_VAR_*). */
static const char *const VAR_NAMES[SQUAD_GEMM_N_VARS] = {"full",   "launch",  "empty",    "loads",     "main",
                                                         "staged", "reduced", "prefetch", "trig_main", "trig_start"};

/* One path (cfg NULL: cuBLASLt; else the sm_90a kernel's variant var, one that writes Y) on one case
 * in one epilogue, checked against the reference. */
static void check_path(squad_gemm_test *t, const shape *s, int M, const float *X, const float *W, const float *R0,
                       const float *P, float *Y, int acc, const int *cfg, int var) {
    squad_err err = {0};
    char name[64];
    cfg_name(name, sizeof name, cfg);
    if (cfg && var != SQUAD_GEMM_VAR_FULL) {
        const size_t used = strlen(name);
        snprintf(name + used, sizeof name - used, " %s", VAR_NAMES[var]);
    }
    int guard_ok = 0;
    const int rc = var == SQUAD_GEMM_VAR_FULL
                       ? squad_gemm_test_run(t, X, W, R0, Y, M, s->N, s->K, acc, cfg, &guard_ok, &err)
                       : squad_gemm_test_run_variant(t, X, W, R0, Y, M, s->N, s->K, acc, cfg, var, &guard_ok, &err);
    CHECKF(rc == 0, "%s M %d acc %d, %s: %s", s->name, M, acc, name, err.msg);
    if (rc) return;
    CHECKF(guard_ok, "%s M %d acc %d, %s: wrote outside its output", s->name, M, acc, name);
    const size_t n = (size_t)M * s->N;
    const double e = acc ? rel_err(Y, R0, P, n) : rel_err(Y, NULL, P, n);
    const double tol = acc ? TOL_GEMM_SM90_ACC : TOL_GEMM_SM90_BF16;
    CHECKF(e < tol, "%s %d x %d x %d acc %d, %s: rel err %.3e (tol %.1e)", s->name, M, s->N, s->K, acc, name, e, tol);
    if (e >= tol || getenv("SQUAD_GEMM_TEST_VERBOSE"))
        printf("  %-12s M %3d acc %d %-28s rel err %.2e\n", s->name, M, acc, name, e);
}

static int test_shapes(squad_gemm_test *t, rng *r, int quick) {
    const int has = squad_gemm_test_has_sm90(t);
    const int *ms = quick ? MS_QUICK : MS;
    const int n_ms = quick ? (int)(sizeof MS_QUICK / sizeof MS_QUICK[0]) : (int)(sizeof MS / sizeof MS[0]);
    int n_paths = 0;
    for (int si = 0; si < N_SHAPES; si++) {
        const shape *s = &SHAPES[si];
        float *W = randn_bf16(r, (size_t)s->N * s->K, 1.0 / sqrt((double)s->K));
        for (int mi = 0; mi < n_ms; mi++) {
            const int M = ms[mi];
            float *X = randn_bf16(r, (size_t)M * s->K, 1.0);
            float *R0 = randn_bf16(r, (size_t)M * s->N, 1.0);
            float *P = malloc(sizeof(float) * M * s->N), *Y = malloc(sizeof(float) * M * s->N);
            if (!P || !Y) abort();
            ref_product(X, W, P, M, s->N, s->K);
            int cfgs[MAX_CFGS][3];
            const int nc = has ? squad_gemm_test_configs(t, M, s->N, s->K, cfgs, MAX_CFGS) : 0;
            if (has) CHECKF(nc > 0, "%s M %d: the sm_90a kernel offers no configuration", s->name, M);
            for (int acc = 0; acc < 2; acc++) {
                if (!s->odd) check_path(t, s, M, X, W, R0, P, Y, acc, NULL, SQUAD_GEMM_VAR_FULL);
                for (int c = 0; c < nc; c++) check_path(t, s, M, X, W, R0, P, Y, acc, cfgs[c], SQUAD_GEMM_VAR_FULL);
                n_paths += !s->odd + nc;
            }
            printf("%-12s %5d x %5d x %5d: %s%d sm_90a configurations, both epilogues\n", s->name, M, s->N, s->K,
                   s->odd ? "" : "cuBLASLt and ", nc);
            free(X);
            free(R0);
            free(P);
            free(Y);
        }
        free(W);
    }
    return n_paths;
}

/* where the timed calls' weights come from (squad_gemm_test_weights_l2) */
static const char *weights_from(int l2) { return l2 ? "from L2 (SQUAD_GEMM_TEST_L2=1)" : "from HBM"; }

/* us per call of cuBLASLt tuned alone, of the sm_90a kernel's best configuration, and of what the
 * full tuning picks; GB/s of the kernel's best (weights + tokens + output bytes); below each row, the
 * us of every configuration the tuning times (what a change to the kernel moved, and where). */
static void time_shapes(squad_gemm_test *t, int l2) {
    const int has = squad_gemm_test_has_sm90(t);
    printf("\ngpu_test_gemm timing: us per call, weights %s\n", weights_from(l2));
    printf("%-12s %4s %5s %5s %3s | %9s | %9s %-14s %7s | %7s | %s\n", "shape", "M", "N", "K", "acc", "LT us",
           "sm90a us", "(wg nt split)", "GB/s", "LT/sm90", "tuning picks (us)");
    for (int si = 0; si < N_SHAPES; si++) {
        const shape *s = &SHAPES[si];
        if (s->odd) continue;
        for (int mi = 0; mi < (int)(sizeof MS / sizeof MS[0]); mi++) {
            const int M = MS[mi];
            squad_err err = {0};
            double lt = -1, best = -1, tuned = -1;
            int best_cfg[3] = {0, 0, 0}, chosen[3] = {0, 0, 0};
            int rc = squad_gemm_test_time(t, SQUAD_GEMM_TIME_LT, M, s->N, s->K, s->acc, NULL, NULL, &lt, &err);
            CHECKF(rc == 0, "timing cuBLASLt %s M %d: %s", s->name, M, err.msg);
            int cfgs[MAX_CFGS][3];
            const int nc = has ? squad_gemm_test_configs(t, M, s->N, s->K, cfgs, MAX_CFGS) : 0;
            char every[MAX_CFGS * 24] = "";
            size_t used = 0;
            for (int c = 0; c < nc; c++) {
                double us = -1;
                rc = squad_gemm_test_time(t, SQUAD_GEMM_TIME_SM90, M, s->N, s->K, s->acc, cfgs[c], NULL, &us, &err);
                CHECKF(rc == 0, "timing sm90a %s M %d: %s", s->name, M, err.msg);
                const int w = snprintf(every + used, sizeof every - used, " (%d %d %d) %.2f", cfgs[c][0], cfgs[c][1],
                                       cfgs[c][2], us);
                if (w > 0 && (size_t)w < sizeof every - used) used += (size_t)w;
                if (rc == 0 && (best < 0 || us < best)) {
                    best = us;
                    memcpy(best_cfg, cfgs[c], sizeof best_cfg);
                }
            }
            rc = squad_gemm_test_time(t, SQUAD_GEMM_TIME_TUNED, M, s->N, s->K, s->acc, NULL, chosen, &tuned, &err);
            CHECKF(rc == 0, "timing the tuning's choice %s M %d: %s", s->name, M, err.msg);
            const double bytes =
                2.0 * s->N * s->K + 2.0 * M * s->K + (double)M * s->N * (s->acc ? 8.0 : 2.0); /* fp32 acc: read + write */
            char cfgbuf[32] = "-", pick[48];
            if (best > 0) snprintf(cfgbuf, sizeof cfgbuf, "(%d %d %d)", best_cfg[0], best_cfg[1], best_cfg[2]);
            if (chosen[0]) snprintf(pick, sizeof pick, "sm90a (%d %d %d) %.2f", chosen[0], chosen[1], chosen[2], tuned);
            else snprintf(pick, sizeof pick, "cuBLASLt %.2f", tuned);
            printf("%-12s %4d %5d %5d %3d | %9.2f | %9.2f %-14s %7.0f | %7.2f | %s\n", s->name, M, s->N, s->K, s->acc,
                   lt, best, cfgbuf, best > 0 ? bytes / (best * 1e3) : 0.0, best > 0 ? lt / best : 0.0, pick);
            if (nc > 1) printf("    every sm90a configuration (wg nt split) us:%s\n", every);
            fflush(stdout);
        }
    }
}

/* ---- the decomposition probe (SQUAD_GEMM_PROBE=1) ---- */

#define PROBE_HBM_BYTES_PER_US 4.3e6 /* the floor's HBM rate: 4.3 TB/s */
#define PROBE_CFGS 2                 /* configurations probed per case: the tuning's pick, then the fastest */
static const int PROBE_MS[] = {32, 128};
/* The columns: the stages as each variant adds one, the product, then the candidate changes. */
static const int PROBE_ORDER[SQUAD_GEMM_N_VARS] = {
    SQUAD_GEMM_VAR_LAUNCH,  SQUAD_GEMM_VAR_EMPTY,   SQUAD_GEMM_VAR_LOADS,    SQUAD_GEMM_VAR_MAIN,
    SQUAD_GEMM_VAR_STAGED,  SQUAD_GEMM_VAR_REDUCED, SQUAD_GEMM_VAR_FULL,     SQUAD_GEMM_VAR_PREFETCH,
    SQUAD_GEMM_VAR_TRIGGER_MAIN, SQUAD_GEMM_VAR_TRIGGER_START};
/* The variants that write Y: checked against the reference before they are timed. */
static const int PROBE_CHECKED[] = {SQUAD_GEMM_VAR_FULL, SQUAD_GEMM_VAR_PREFETCH, SQUAD_GEMM_VAR_TRIGGER_MAIN,
                                    SQUAD_GEMM_VAR_TRIGGER_START};

/* Microseconds per call of one variant (negative after a failure, which is a failed check). */
static double probe_time(squad_gemm_test *t, const shape *s, int M, const int *cfg, int var) {
    squad_err err = {0};
    double us = -1;
    const int rc = squad_gemm_test_time_variant(t, M, s->N, s->K, s->acc, cfg, var, &us, &err);
    CHECKF(rc == 0, "probe %s M %d (%d %d %d) %s: %s", s->name, M, cfg[0], cfg[1], cfg[2], VAR_NAMES[var], err.msg);
    CHECKF(rc != 0 || (isfinite(us) && us > 0), "probe %s M %d (%d %d %d) %s: %.3f us", s->name, M, cfg[0], cfg[1],
           cfg[2], VAR_NAMES[var], us);
    return rc ? -1 : us;
}

/* The configurations to probe: the tuning's pick when it is the kernel, then the fastest of the
 * candidates by the product's time (the variants exist for nt <= 2); their count. every: each
 * candidate's time, for the line under the case. */
static int probe_pick(squad_gemm_test *t, const shape *s, int M, const int *chosen, int (*out)[3], char *every,
                      size_t every_len) {
    int cfgs[MAX_CFGS][3], n = 0;
    double us[MAX_CFGS];
    const int nc = squad_gemm_test_configs(t, M, s->N, s->K, cfgs, MAX_CFGS);
    size_t used = 0;
    every[0] = 0;
    for (int c = 0; c < nc; c++) {
        us[c] = cfgs[c][1] <= 2 ? probe_time(t, s, M, cfgs[c], SQUAD_GEMM_VAR_FULL) : -1;
        const int w = snprintf(every + used, every_len - used, " (%d %d %d) %.2f", cfgs[c][0], cfgs[c][1],
                               cfgs[c][2], us[c]);
        if (w > 0 && (size_t)w < every_len - used) used += (size_t)w;
    }
    if (chosen[0] && chosen[1] <= 2) memcpy(out[n++], chosen, sizeof out[0]);
    while (n < PROBE_CFGS) {
        int best = -1;
        for (int c = 0; c < nc; c++) {
            int taken = us[c] <= 0;
            for (int i = 0; i < n && !taken; i++) taken = !memcmp(out[i], cfgs[c], sizeof out[0]);
            if (!taken && (best < 0 || us[c] < us[best])) best = c;
        }
        if (best < 0) break;
        memcpy(out[n++], cfgs[best], sizeof out[0]);
    }
    return n;
}

/* One case (shape, M): the checks, then one line per probed configuration and the differences. */
static void probe_case(squad_gemm_test *t, rng *r, const shape *s, int M) {
    float *W = randn_bf16(r, (size_t)s->N * s->K, 1.0 / sqrt((double)s->K));
    float *X = randn_bf16(r, (size_t)M * s->K, 1.0);
    float *R0 = randn_bf16(r, (size_t)M * s->N, 1.0);
    float *P = malloc(sizeof(float) * M * s->N), *Y = malloc(sizeof(float) * M * s->N);
    if (!P || !Y) abort();
    ref_product(X, W, P, M, s->N, s->K);
    squad_err err = {0};
    double lt = -1, tuned = -1;
    int chosen[3] = {0, 0, 0};
    int rc = squad_gemm_test_time(t, SQUAD_GEMM_TIME_LT, M, s->N, s->K, s->acc, NULL, NULL, &lt, &err);
    CHECKF(rc == 0, "probe: timing cuBLASLt %s M %d: %s", s->name, M, err.msg);
    rc = squad_gemm_test_time(t, SQUAD_GEMM_TIME_TUNED, M, s->N, s->K, s->acc, NULL, chosen, &tuned, &err);
    CHECKF(rc == 0, "probe: timing the tuning's choice %s M %d: %s", s->name, M, err.msg);
    int cfgs[PROBE_CFGS][3];
    char every[MAX_CFGS * 24];
    const int n = probe_pick(t, s, M, chosen, cfgs, every, sizeof every);
    CHECKF(n > 0, "probe %s M %d: no configuration to probe", s->name, M);
    const double floor_us = 2.0 * s->N * s->K / PROBE_HBM_BYTES_PER_US;
    char pick[48];
    if (chosen[0]) snprintf(pick, sizeof pick, "sm90a (%d %d %d) %.2f", chosen[0], chosen[1], chosen[2], tuned);
    else snprintf(pick, sizeof pick, "cuBLASLt %.2f", tuned);
    for (int c = 0; c < n; c++) {
        for (int i = 0; i < (int)(sizeof PROBE_CHECKED / sizeof PROBE_CHECKED[0]); i++)
            check_path(t, s, M, X, W, R0, P, Y, s->acc, cfgs[c], PROBE_CHECKED[i]);
        double us[SQUAD_GEMM_N_VARS];
        for (int v = 0; v < SQUAD_GEMM_N_VARS; v++) us[v] = probe_time(t, s, M, cfgs[c], v);
        char cfgbuf[24];
        snprintf(cfgbuf, sizeof cfgbuf, "(%d %d %d)", cfgs[c][0], cfgs[c][1], cfgs[c][2]);
        printf("%-12s %4d %-10s %6.2f %6.2f |", s->name, M, cfgbuf, floor_us, lt);
        for (int i = 0; i < SQUAD_GEMM_N_VARS; i++)
            printf(" %10.2f%s", us[PROBE_ORDER[i]], PROBE_ORDER[i] == SQUAD_GEMM_VAR_FULL ? " |" : "");
        printf(" | %s\n", pick);
        printf("    steps: launch %.2f, prologue %+.2f, loads %+.2f, wgmma %+.2f, staging + cluster barriers %+.2f, "
               "split-K sums %+.2f, Y %+.2f; full - floor %+.2f\n",
               us[SQUAD_GEMM_VAR_LAUNCH], us[SQUAD_GEMM_VAR_EMPTY] - us[SQUAD_GEMM_VAR_LAUNCH],
               us[SQUAD_GEMM_VAR_LOADS] - us[SQUAD_GEMM_VAR_EMPTY], us[SQUAD_GEMM_VAR_MAIN] - us[SQUAD_GEMM_VAR_LOADS],
               us[SQUAD_GEMM_VAR_STAGED] - us[SQUAD_GEMM_VAR_MAIN], us[SQUAD_GEMM_VAR_REDUCED] - us[SQUAD_GEMM_VAR_STAGED],
               us[SQUAD_GEMM_VAR_FULL] - us[SQUAD_GEMM_VAR_REDUCED], us[SQUAD_GEMM_VAR_FULL] - floor_us);
    }
    printf("    every sm90a configuration (wg nt split), full us:%s\n", every);
    fflush(stdout);
    free(W);
    free(X);
    free(R0);
    free(P);
    free(Y);
}

static void probe_shapes(squad_gemm_test *t, rng *r, int l2) {
    printf("gpu_test_gemm probe: us per call, calls back to back in one graph, weights %s, the median of "
           "several replays; floor: the weights' bytes at %.1f TB/s; LT: cuBLASLt tuned alone\n",
           weights_from(l2), PROBE_HBM_BYTES_PER_US / 1e6);
    printf("%-12s %4s %-10s %6s %6s |", "shape", "M", "(wg nt sp)", "floor", "LT");
    for (int i = 0; i < SQUAD_GEMM_N_VARS; i++)
        printf(" %10s%s", VAR_NAMES[PROBE_ORDER[i]], PROBE_ORDER[i] == SQUAD_GEMM_VAR_FULL ? " |" : "");
    printf(" | tuning picks (us)\n");
    for (int si = 0; si < N_SHAPES; si++)
        if (!SHAPES[si].odd)
            for (int mi = 0; mi < (int)(sizeof PROBE_MS / sizeof PROBE_MS[0]); mi++)
                probe_case(t, r, &SHAPES[si], PROBE_MS[mi]);
}

/* The plan file keeps an sm_90a choice beside a cuBLASLt one, the latter in the form older files
 * have (5 numbers and 8 hex words), so files written before the kernel existed still read. */
static void test_plan_file(void) {
    char path[512], why[256] = "";
    snprintf(path, sizeof path, "%s/gemm-plans.txt", test_tmpdir());
    setenv("SQUAD_GEMM_PLANS", path, 1);
    CHECKF(squad_gemm_test_plan_file(why, sizeof why) == 0, "plan file: %s", why);
    unsetenv("SQUAD_GEMM_PLANS");
    int n = 0, old_form = 0, sm90 = 0;
    char **lines = test_read_lines(path, &n);
    CHECKF(n == 3, "plan file: %d lines, want a header and 2 records", n);
    for (int i = 1; i < n; i++) {
        int tokens = 0, in = 0;
        for (const char *c = lines[i]; *c; c++) {
            const int sp = *c == ' ' || *c == '\n';
            if (!sp && !in) tokens++;
            in = !sp;
        }
        if (tokens == 13 && !strstr(lines[i], "sm90a")) old_form++;
        if (tokens == 9 && strstr(lines[i], " sm90a ")) sm90++;
    }
    CHECKF(old_form == 1 && sm90 == 1, "plan file: %d cuBLASLt lines in the old form, %d sm90a lines", old_form, sm90);
    test_free_lines(lines, n);
}

int main(void) {
    if (squad_cuda_device_count() <= 0) {
        printf("gpu_test_gemm: no CUDA device, skipped\n");
        return TEST_SKIPPED;
    }
    squad_err err = {0};
    squad_gemm_test *t = squad_gemm_test_new(&err);
    CHECKF(t != NULL, "%s", err.msg);
    if (!t) return test_summary("gpu_test_gemm");
    const char *q = getenv("SQUAD_GPU_TEST_QUICK"), *tm = getenv("SQUAD_GEMM_TEST_TIME");
    const char *pr = getenv("SQUAD_GEMM_PROBE"), *l2v = getenv("SQUAD_GEMM_TEST_L2");
    const int l2 = l2v && l2v[0] == '1';
    squad_gemm_test_weights_l2(t, l2);
    const int quick = q && q[0] == '1', timing = !quick && !(tm && tm[0] == '0');
    rng r = {0x2545f4914f6cdd1dull};
    if (pr && pr[0] == '1') {
        if (!squad_gemm_test_has_sm90(t)) {
            printf("gpu_test_gemm probe: the sm_90a kernel does not run on this GPU, skipped\n");
            squad_gemm_test_free(t);
            return TEST_SKIPPED;
        }
        probe_shapes(t, &r, l2);
        squad_gemm_test_free(t);
        return test_summary("gpu_test_gemm probe");
    }
    if (!squad_gemm_test_has_sm90(t))
        printf("gpu_test_gemm: the sm_90a kernel does not run on this GPU (compute capability 9.0 only): "
               "cuBLASLt cases only\n");
    test_plan_file();
    const int n = test_shapes(t, &r, quick);
    printf("gpu_test_gemm: %d path runs checked\n", n);
    if (timing) time_shapes(t, l2);
    squad_gemm_test_free(t);
    return test_summary("gpu_test_gemm");
}
#else
int main(void) {
    printf("gpu_test_gemm: built without CUDA, skipped\n");
    return TEST_SKIPPED;
}
#endif
