/*
 * gpu_test_kernels.c — each CUDA kernel group against its plain host reference on fresh random
 * inputs (tests/cuda/cuda_test_api.h): the GDN mixer (conv with saved inputs, gates, the chunked
 * delta rule from a nonzero initial state, padding, the gated norm) against the per-token
 * recurrence, chained over two chunks; attention over cached K / V (RoPE offsets, GQA, padding,
 * head dims 16..256) — each on the bf16 path (tensor cores) and the exact fp32 path; RMSNorm, SiLU * up, and the cuBLASLt
 * projection at small and large M (tails, the 0.8B shapes). Outputs are poisoned (NaN)
 * on the device before each run, so an element a kernel does not write fails the comparison.
 * Errors are relative: ||out - ref|| / ||ref|| (bf16 operands: about 1e-3 .. 1e-2).
 * Exits 77 (skipped) without a GPU. SQUAD_GEMM_BENCH=1 instead times tuned against untuned cuBLASLt
 * on the 0.8B shapes.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
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
#include "cuda_test_api.h" /* tests/cuda */

/* ---- random inputs (testutil.h's stream) ---- */
static float bf(float x) { return squad_bf16_to_f32(squad_f32_to_bf16(x)); }
static float *randn(rng *r, size_t n, double sd, int round_bf16) {
    float *p = malloc(n * sizeof *p);
    if (!p) abort();
    for (size_t i = 0; i < n; i++) p[i] = (float)(rng_norm(r) * sd);
    if (round_bf16)
        for (size_t i = 0; i < n; i++) p[i] = bf(p[i]);
    return p;
}

/* relative error over the first n values; NaN anywhere gives +inf */
static double rel_err(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        const double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- GDN ---- */
typedef struct gdn_case {
    int nk, nv, dk, dv, K;
    int rows1, len1, rows2, len2; /* two chunks, the second continuing the first */
} gdn_case;

/* FNV-1a over bytes: the device outputs' bits, compared between launch variants that must agree */
static uint64_t fnv_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* A launch variant of the bf16 mixer (cu_ref_gdn_args: short_rows, prep_split, conv_groups,
 * fused_rows). */
typedef struct gdn_variant {
    int short_rows, prep_split, conv_groups, fused_rows;
} gdn_variant;

/* The in_proj output's row stride of a case: q, k, v, z, b, a, padded and 8-aligned as the backend has it. */
static int gdn_case_ldP(const gdn_case *c) {
    const int C = 2 * c->nk * c->dk + c->nv * c->dv;
    return ((C + c->nv * c->dv + 2 * c->nv + 7) & ~7) + 8;
}

/* 1 when a variant with this fused_rows runs the case's launches as the fused mixer on this GPU. */
static int gdn_case_fused(const gdn_case *c, int fused_rows) {
    cu_ref_gdn_args q;
    memset(&q, 0, sizeof q);
    q.nk = c->nk, q.nv = c->nv, q.dk = c->dk, q.dv = c->dv, q.K = c->K;
    q.ldP = gdn_case_ldP(c);
    q.rows = c->rows1 > c->rows2 ? c->rows1 : c->rows2;
    q.fused_rows = fused_rows;
    return squad_cuda_test_gdn_fused(&q);
}

/* Returns a hash of the device's outputs (both chunks' Y and states, the conv state). */
static uint64_t test_gdn(rng *r, const gdn_case *c, int exact, const gdn_variant *v) {
    const int C = 2 * c->nk * c->dk + c->nv * c->dv;
    const int ldP = gdn_case_ldP(c);
    const size_t nS = (size_t)c->nv * c->dk * c->dv;
    float *conv_w = randn(r, (size_t)C * c->K, 0.5, 0);
    float *A_log = malloc(sizeof(float) * c->nv), *dt = randn(r, c->nv, 0.5, 0), *nw = malloc(sizeof(float) * c->dv);
    for (int h = 0; h < c->nv; h++) A_log[h] = (float)log(0.02 * pow(400.0, rng_unif(r)));
    for (int j = 0; j < c->dv; j++) nw[j] = (float)(1.0 + 0.2 * rng_norm(r));
    /* a nonzero initial state and conv inputs, as after earlier chunks */
    float *S_dev = randn(r, nS, 0.3, 0), *S_ref = malloc(nS * sizeof(float));
    memcpy(S_ref, S_dev, nS * sizeof(float));
    float *cs_dev = randn(r, (size_t)(c->K - 1) * C + 1, 1.0, 1), *cs_ref = malloc(((size_t)(c->K - 1) * C + 1) * 4);
    memcpy(cs_ref, cs_dev, ((size_t)(c->K - 1) * C + 1) * 4);
    double worst_y = 0, worst_s = 0;
    int pad_ok = 1, conv_ok = 1;
    uint64_t bits = 1469598103934665603ull;
    for (int chunk = 0; chunk < 2; chunk++) {
        const int rows = chunk ? c->rows2 : c->rows1, len = chunk ? c->len2 : c->len1;
        float *P = randn(r, (size_t)rows * ldP, 1.0, 1);
        float *Y = malloc(sizeof(float) * rows * c->nv * c->dv), *Yr = calloc((size_t)rows * c->nv * c->dv, 4);
        cu_ref_gdn_args a = {c->nk, c->nv, c->dk, c->dv, c->K, ldP, rows, len, 1e-6f, P, cs_dev, conv_w, A_log, dt, nw,
                             S_dev, Y, exact, v->short_rows, v->prep_split, v->conv_groups, v->fused_rows};
        squad_err err = {0};
        const int rc = squad_cuda_test_gdn(&a, &err);
        CHECKF(rc == 0, "squad_cuda_test_gdn: %s", err.msg);
        cu_ref_gdn_args b = a;
        b.conv_state = cs_ref;
        b.S = S_ref;
        b.Y = Yr;
        cu_ref_gdn(&b);
        const double ey = rel_err(Y, Yr, (size_t)len * c->nv * c->dv);
        const double es = rel_err(S_dev, S_ref, nS);
        if (ey > worst_y) worst_y = ey;
        if (es > worst_s) worst_s = es;
        for (size_t i = (size_t)len * c->nv * c->dv; i < (size_t)rows * c->nv * c->dv; i++)
            if (Y[i] != 0.f) pad_ok = 0;
        for (size_t i = 0; i < (size_t)(c->K - 1) * C; i++)
            if (cs_dev[i] != cs_ref[i]) conv_ok = 0;
        bits = fnv_bytes(bits, Y, sizeof(float) * rows * c->nv * c->dv);
        bits = fnv_bytes(bits, S_dev, nS * sizeof(float));
        /* continue the next chunk from the reference's state on both sides, so errors don't compound */
        memcpy(S_dev, S_ref, nS * sizeof(float));
        free(P);
        free(Y);
        free(Yr);
    }
    printf("gdn %-5s nk %d nv %d dk %d dv %d K %d chunks (%d/%d, %d/%d): rel err Y %.2e S %.2e\n",
           exact ? "exact" : "bf16", c->nk, c->nv, c->dk, c->dv, c->K, c->len1, c->rows1, c->len2, c->rows2, worst_y,
           worst_s);
    CHECKF(worst_y < (exact ? TOL_KERNEL_EXACT : TOL_KERNEL_BF16_GDN_OUT), "gdn output rel err %.3e", worst_y);
    CHECKF(worst_s < (exact ? TOL_KERNEL_EXACT : TOL_KERNEL_BF16_GDN_STATE), "gdn state rel err %.3e", worst_s);
    CHECKF(pad_ok, "gdn padding rows must be written as 0");
    CHECKF(conv_ok, "gdn conv state after the chunk");
    free(conv_w);
    free(A_log);
    free(dt);
    free(nw);
    free(S_dev);
    free(S_ref);
    free(cs_dev);
    free(cs_ref);
    return bits;
}

/* ---- attention ---- */
typedef struct attn_case {
    int nh, nkv, hd, rd;
    int rows, start, len;
    int kv_split; /* keys [0, kv_split) read in place from a separate blob (a cache hit), 0: none */
} attn_case;

static void test_attn(rng *r, const attn_case *c, int exact) {
    const int ld = c->nh * 2 * c->hd + 2 * c->nkv * c->hd + 8;
    const int maxc = c->start + c->rows + 64;
    const size_t kvn = (size_t)maxc * c->nkv * c->hd;
    float *QKV = randn(r, (size_t)c->rows * ld, 1.0, 1);
    float *qn = randn(r, c->hd, 0.2, 0), *kn = randn(r, c->hd, 0.2, 0);
    float *inv = malloc(sizeof(float) * (c->rd / 2 + 1));
    for (int i = 0; i < c->rd / 2; i++) inv[i] = 1.0f / powf(1e7f, (float)(2 * i) / (float)c->rd);
    /* cached K / V of [0, start): normed, rotated keys have entries of size ~1 */
    float *K = randn(r, kvn, 1.0, 1), *V = randn(r, kvn, 1.0, 1);
    float *Kr = malloc(kvn * 4), *Vr = malloc(kvn * 4);
    for (size_t i = (size_t)c->start * c->nkv * c->hd; i < kvn; i++) K[i] = V[i] = NAN; /* must be written */
    memcpy(Kr, K, kvn * 4);
    memcpy(Vr, V, kvn * 4);
    const size_t no = (size_t)c->rows * c->nh * c->hd;
    float *out = malloc(no * 4), *outr = calloc(no, 4);
    cu_ref_attn_args a = {c->nh, c->nkv, c->hd, c->rd, ld, c->rows, c->start, c->len, maxc, 1e-6f, QKV, qn, kn, inv,
                          K, V, out, exact, c->kv_split};
    squad_err err = {0};
    const int rc = squad_cuda_test_attn(&a, &err);
    CHECKF(rc == 0, "squad_cuda_test_attn: %s", err.msg);
    cu_ref_attn_args b = a;
    b.K = Kr;
    b.V = Vr;
    b.out = outr;
    cu_ref_attn(&b);
    const size_t off = (size_t)c->start * c->nkv * c->hd, n = (size_t)c->len * c->nkv * c->hd;
    const double eo = rel_err(out, outr, (size_t)c->len * c->nh * c->hd);
    const double ek = rel_err(K + off, Kr + off, n), ev = rel_err(V + off, Vr + off, n);
    int pad_ok = 1;
    for (size_t i = (size_t)c->len * c->nh * c->hd; i < no; i++)
        if (out[i] != 0.f) pad_ok = 0;
    printf("attn %-5s nh %d nkv %d hd %d rd %d rows %d start %d len %d split %d: rel err out %.2e K %.2e V %.2e\n",
           exact ? "exact" : "bf16", c->nh, c->nkv, c->hd, c->rd, c->rows, c->start, c->len, c->kv_split, eo, ek, ev);
    CHECKF(eo < (exact ? TOL_KERNEL_EXACT : TOL_KERNEL_BF16_ATTN), "attention output rel err %.3e", eo);
    CHECKF(ek < (exact ? TOL_KERNEL_EXACT_KV : TOL_KERNEL_BF16_KV) && ev < (exact ? TOL_KERNEL_EXACT_KV : TOL_KERNEL_BF16_KV), "K / V written to the cache: rel err %.3e %.3e",
           ek, ev);
    CHECKF(pad_ok, "attention padding rows must be written as 0");
    free(QKV);
    free(qn);
    free(kn);
    free(inv);
    free(K);
    free(V);
    free(Kr);
    free(Vr);
    free(out);
    free(outr);
}

/* ---- small ops ---- */
static void test_small(rng *r) {
    squad_err err = {0};
    const int rows = 37, H = 1024, I = 3584;
    float *h = randn(r, (size_t)rows * H, 3.0, 0), *w = randn(r, H, 0.2, 0);
    float *o = malloc(sizeof(float) * rows * H), *orf = malloc(sizeof(float) * rows * H);
    CHECKF(squad_cuda_test_rmsnorm(h, o, w, rows, H, 1e-6f, &err) == 0, "%s", err.msg);
    cu_ref_rmsnorm(h, orf, w, rows, H, 1e-6f);
    double e = rel_err(o, orf, (size_t)rows * H);
    printf("rmsnorm: rel err %.2e\n", e);
    CHECKF(e < TOL_KERNEL_BF16, "rmsnorm rel err %.3e", e);
    float *gu = randn(r, (size_t)rows * 2 * I, 2.0, 1), *m = malloc(sizeof(float) * rows * I),
          *mr = malloc(sizeof(float) * rows * I);
    CHECKF(squad_cuda_test_silu_mul(gu, m, rows, I, &err) == 0, "%s", err.msg);
    cu_ref_silu_mul(gu, mr, rows, I);
    e = rel_err(m, mr, (size_t)rows * I);
    printf("silu_mul: rel err %.2e\n", e);
    CHECKF(e < TOL_KERNEL_BF16, "silu_mul rel err %.3e", e);
    /* projections: bf16 out, and fp32 accumulate into a residual */
    const int M = 77, N = 200, K = 128;
    float *X = randn(r, (size_t)M * K, 1.0, 1), *W = randn(r, (size_t)N * K, 0.1, 1);
    float *Y = malloc(sizeof(float) * M * N), *Yr = malloc(sizeof(float) * M * N), *R0 = randn(r, (size_t)M * N, 1, 0);
    for (int acc = 0; acc < 2; acc++) {
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = acc ? R0[(size_t)i * N + j] : 0;
                for (int k = 0; k < K; k++) s += (double)X[(size_t)i * K + k] * W[(size_t)j * K + k];
                Yr[(size_t)i * N + j] = (float)s;
            }
        if (acc) memcpy(Y, R0, sizeof(float) * M * N);
        CHECKF(squad_cuda_test_gemm(X, W, Y, M, N, K, acc, &err) == 0, "%s", err.msg);
        e = rel_err(Y, Yr, (size_t)M * N);
        printf("gemm %dx%dx%d acc %d: rel err %.2e\n", M, N, K, acc, e);
        CHECKF(e < (acc ? TOL_KERNEL_GEMM_ACC : TOL_KERNEL_BF16), "gemm rel err %.3e", e);
    }
    free(h);
    free(w);
    free(o);
    free(orf);
    free(gu);
    free(m);
    free(mr);
    free(X);
    free(W);
    free(Y);
    free(Yr);
    free(R0);
}

/* ---- the projections at every M a chunk bucket has (a hit's question is small M) ---- */
/* Y = X W^T (+ R0 when acc) in double; the inputs are already bf16 values. */
static void ref_gemm(const float *X, const float *W, const float *R0, float *Y, int M, int N, int K) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = R0 ? R0[(size_t)i * N + j] : 0;
            const float *x = X + (size_t)i * K, *w = W + (size_t)j * K;
            for (int k = 0; k < K; k++) s += (double)x[k] * w[k];
            Y[(size_t)i * N + j] = (float)s;
        }
}

static void test_gemm_case(rng *r, int M, int N, int K, int acc) {
    squad_err err = {0};
    float *X = randn(r, (size_t)M * K, 1.0, 1), *W = randn(r, (size_t)N * K, 1.0 / sqrt((double)K), 1);
    float *R0 = acc ? randn(r, (size_t)M * N, 1.0, 0) : NULL;
    float *Y = malloc(sizeof(float) * M * N), *Yr = malloc(sizeof(float) * M * N);
    if (!Y || !Yr) abort();
    ref_gemm(X, W, R0, Yr, M, N, K);
    if (acc) memcpy(Y, R0, sizeof(float) * M * N);
    const int rc = squad_cuda_test_gemm(X, W, Y, M, N, K, acc, &err);
    CHECKF(rc == 0, "gemm %dx%dx%d acc %d: %s", M, N, K, acc, err.msg);
    if (rc == 0) {
        const double e = rel_err(Y, Yr, (size_t)M * N);
        printf("gemm %dx%dx%d acc %d: rel err %.2e\n", M, N, K, acc, e);
        CHECKF(e < (acc ? TOL_KERNEL_GEMM_ACC : TOL_KERNEL_BF16), "gemm %dx%dx%d acc %d: rel err %.3e", M, N, K, acc, e);
    }
    free(X);
    free(W);
    free(R0);
    free(Y);
    free(Yr);
}

static void test_gemm_shapes(rng *r) {
    static const int ms[] = {1, 5, 16, 32, 64, 100, 128, 192, 256};
    const int n_ms = (int)(sizeof ms / sizeof ms[0]);
    /* small and odd shapes (tails of every tile: N, K multiples of 8 only), every M, both modes */
    static const int small[][2] = {{24, 40}, {16, 16}, {64, 64}, {136, 200}, {200, 128}, {8, 8}, {72, 1032}};
    for (size_t s = 0; s < sizeof small / sizeof small[0]; s++)
        for (int i = 0; i < n_ms; i++)
            for (int acc = 0; acc < 2; acc++) test_gemm_case(r, ms[i], small[s][0], small[s][1], acc);
    /* the 0.8B projections in their own mode (the host reference is the cost: a subset of M);
     * SQUAD_GPU_TEST_QUICK=1 (the sanitizer runs) leaves them out */
    const char *quick = getenv("SQUAD_GPU_TEST_QUICK");
    if (quick && quick[0] == '1') return;
    static const int big[][3] = {{8224, 1024, 0}, {5120, 1024, 0}, {7168, 1024, 0}, {1024, 2048, 1}, {1024, 3584, 1}};
    static const int big_ms[] = {1, 16, 32, 100, 128, 192, 256};
    for (size_t s = 0; s < sizeof big / sizeof big[0]; s++)
        for (size_t i = 0; i < sizeof big_ms / sizeof big_ms[0]; i++)
            test_gemm_case(r, big_ms[i], big[s][0], big[s][1], big[s][2]);
}

/* SQUAD_GEMM_BENCH=1: us per call and GB/s (W + X + Y bytes) of tuned cuBLASLt and cuBLASLt's
 * untuned first choice for the 0.8B projections at the hit path's M and at
 * a cold chunk's. SQUAD_GEMM_BENCH_SHAPES="NxKxACC ..." and SQUAD_GEMM_BENCH_M="M ..." (up to
 * BENCH_MAX each, separated by spaces or commas) time other shapes instead, e.g. the specialists'
 * widened K against the trunk's. */
#define BENCH_MAX 32
static int bench_list(const char *env, int per, int (*out)[3]) {
    int n = 0;
    for (const char *p = env; p && *p && n < BENCH_MAX;) {
        char *end = NULL;
        for (int j = 0; j < 3; j++) out[n][j] = 0;
        for (int j = 0; j < per; j++) {
            const long v = strtol(p, &end, 10);
            if (end == p) return n;
            out[n][j] = (int)v;
            p = end;
            if (j + 1 < per && *p == 'x') p++;
        }
        n++;
        while (*p == ' ' || *p == ',') p++;
    }
    return n;
}

static void bench_gemm_shapes(void) {
    static const int shapes0[][3] = {
        {8224, 1024, 0}, {5120, 1024, 0}, {7168, 1024, 0}, {1024, 2048, 1}, {1024, 3584, 1}};
    static const int ms0[] = {16, 32, 64, 128, 192, 256, 512, 2048};
    int shapes[BENCH_MAX][3], ms[BENCH_MAX][3];
    int n_shapes = bench_list(getenv("SQUAD_GEMM_BENCH_SHAPES"), 3, shapes);
    int n_ms = bench_list(getenv("SQUAD_GEMM_BENCH_M"), 1, ms);
    if (n_shapes < 1) {
        n_shapes = (int)(sizeof shapes0 / sizeof shapes0[0]);
        for (int s = 0; s < n_shapes; s++)
            for (int j = 0; j < 3; j++) shapes[s][j] = shapes0[s][j];
    }
    if (n_ms < 1) {
        n_ms = (int)(sizeof ms0 / sizeof ms0[0]);
        for (int i = 0; i < n_ms; i++) ms[i][0] = ms0[i];
    }
    printf("%5s %5s %5s %3s | %9s %8s | %9s %8s | %s\n", "M", "N", "K", "acc", "tuned us", "GB/s", "first us",
           "GB/s", "first / tuned");
    for (int s = 0; s < n_shapes; s++)
        for (int i = 0; i < n_ms; i++) {
            const int M = ms[i][0], N = shapes[s][0], K = shapes[s][1], acc = shapes[s][2];
            squad_err err = {0};
            double us_lt = -1, us_first = -1;
            const int rc = squad_cuda_bench_gemm(M, N, K, acc, &us_lt, &us_first, &err);
            CHECKF(rc == 0, "bench %dx%dx%d: %s", M, N, K, err.msg);
            if (rc) continue;
            const double bytes = 2.0 * N * K + 2.0 * M * K + (acc ? 8.0 : 2.0) * M * N;
            printf("%5d %5d %5d %3d | %9.2f %8.0f | %9.2f %8.0f | %.2fx\n", M, N, K, acc, us_lt,
                   bytes / us_lt * 1e-3, us_first, bytes / us_first * 1e-3, us_first / us_lt);
        }
    /* the fixed cost of one kernel in a graph, for comparison with the GEMMs' times above */
    static const int shapes_l[][2] = {{1, 32}, {132, 256}, {1024, 256}};
    for (size_t i = 0; i < sizeof shapes_l / sizeof shapes_l[0]; i++) {
        squad_err err = {0};
        double us = -1;
        const int rc = squad_cuda_bench_launch(283, shapes_l[i][0], shapes_l[i][1], &us, &err);
        CHECKF(rc == 0, "bench launch: %s", err.msg);
        printf("graph of 283 dependent near-empty kernels, %d blocks x %d threads: %.2f us a kernel\n",
               shapes_l[i][0], shapes_l[i][1], us);
    }
}

int main(void) {
    if (squad_cuda_device_count() <= 0) {
        printf("gpu_test_kernels: no CUDA device, skipped\n");
        return TEST_SKIPPED;
    }
    rng r = {0x9e3779b97f4a7c15ull};
    const char *bench = getenv("SQUAD_GEMM_BENCH");
    if (bench && bench[0] == '1') {
        bench_gemm_shapes();
        return test_summary("gpu_test_kernels (GEMM benchmark)");
    }
    const gdn_case gc[] = {
        {2, 4, 16, 16, 4, 16, 5, 64, 64},      /* tiny-causal shapes; bucket 16, then a full block */
        {2, 2, 32, 24, 4, 256, 200, 128, 77},  /* dv 24 (padded to 32), padding inside a block */
        {4, 4, 32, 32, 4, 192, 192, 32, 1},    /* 3 blocks, then a single token */
        {4, 4, 64, 64, 3, 128, 100, 384, 300}, /* conv kernel 3 */
        {2, 4, 128, 128, 4, 512, 450, 64, 50}, /* the 0.8B head dims (fewer heads), 8 blocks */
        {16, 16, 128, 128, 4, 128, 128, 16, 3},/* the 0.8B layer */
        {2, 4, 64, 64, 6, 128, 100, 64, 64},   /* conv kernel 6 (prep's 8-tap instance) */
        {2, 2, 128, 128, 8, 256, 256, 64, 33}, /* conv kernel 8 at the 0.8B head dims */
        {4, 4, 31, 32, 2, 64, 40, 128, 128},   /* odd dk (padded to 32), conv kernel 2 */
        {2, 2, 16, 16, 1, 32, 20, 16, 16},     /* conv kernel 1: no saved inputs */
    };
    /* the bf16 path in ten launch variants: the long-chunk or the short-chunk conv and output
     * kernels (short_rows), the prep whole or split over 2 or 4 blocks a (block, head) (prep_split,
     * bounded by the head dims), the conv one tile a block (conv_groups < 0) or pipelined over runs
     * of 16-row groups (3 a block by default here, where the tests give no SM count; 1 or 5 fixed).
     * Each case has the same inputs in every variant, and the variants of one conv tiling must give
     * the same bits: the splits and the conv's blocks change who computes a value, not how. The last
     * variant runs the fused mixer (one kernel a layer) wherever it applies: the tolerances above;
     * where it does not apply, the four kernels' bits. (Where it ran its bits may still equal theirs:
     * its sums differ in order, and bf16 rounding hides that on small cases.) */
    enum { LONG = -1, SHORT = 1000000, NEVER = -1 };
    static const gdn_variant gv[] = {{LONG, 1, 0, NEVER},  {LONG, 4, 0, NEVER},  {SHORT, 1, 0, NEVER},
                                     {SHORT, 2, 0, NEVER}, {SHORT, 4, 0, NEVER}, {LONG, 1, -1, NEVER},
                                     {SHORT, 1, -1, NEVER}, {LONG, 1, 1, NEVER}, {SHORT, 1, 5, NEVER},
                                     {LONG, 2, 1, NEVER},  {SHORT, 1, 0, SHORT}};
    enum { NV = sizeof gv / sizeof gv[0], NC = sizeof gc / sizeof gc[0] };
    uint64_t bits[NV][NC];
    for (int v = 0; v < NV; v++) {
        printf("gdn kernels for %s chunks, prep split %d, conv groups %d%s\n", gv[v].short_rows == LONG ? "long" : "short",
               gv[v].prep_split, gv[v].conv_groups, gv[v].fused_rows > 0 ? ", fused where it applies" : "");
        for (int i = 0; i < NC; i++) {
            rng ri = {0x9e3779b97f4a7c15ull + (uint64_t)i};
            bits[v][i] = test_gdn(&ri, &gc[i], 0, &gv[v]);
            /* long variants tile the conv by 16 tokens (variant 0 the first), short ones by 4 (variant 2) */
            const int first = gv[v].short_rows == LONG ? 0 : 2;
            int fused = 0;
            if (gv[v].fused_rows > 0) {
                fused = gdn_case_fused(&gc[i], gv[v].fused_rows);
                printf("  case %d: %s\n", i, fused ? "fused" : "the four kernels");
            }
            CHECKF(fused || bits[v][i] == bits[first][i], "gdn case %d: variant %d's bits differ from variant %d's", i, v,
                   first);
        }
    }
    static const gdn_variant as_backend = {0, 0, 0, 0};
    for (size_t i = 0; i < sizeof gc / sizeof gc[0]; i++) test_gdn(&r, &gc[i], 1, &as_backend);
    const attn_case ac[] = {
        {4, 2, 32, 8, 64, 0, 64, 0},    /* tiny: one full chunk from position 0 */
        {4, 2, 32, 8, 128, 300, 100, 0},   /* cached keys, padding */
        {2, 1, 64, 32, 16, 1000, 16, 0},   /* a short chunk on a long cache (splits) */
        {4, 4, 16, 4, 256, 64, 200, 0},    /* hd 16, no GQA */
        {8, 2, 128, 32, 192, 70, 150, 0},  /* hd 128 */
        {8, 2, 256, 64, 128, 1500, 128, 0},/* the 0.8B shape: a hit's question on a cached state */
        {8, 2, 256, 64, 512, 0, 500, 0},   /* the 0.8B shape: a cold chunk */
        /* a hit's restored prefix read in place from the cache blob (the working buffer's copy is
         * NaN): the whole prefix, a prefix ending inside a key tile, and the 0.8B hit */
        {4, 2, 32, 8, 128, 300, 100, 300},
        {2, 1, 64, 32, 16, 1000, 16, 957},
        {8, 2, 256, 64, 128, 1500, 128, 1500},
        /* a prefix ending on a key tile's edge with the row's own keys over several tiles, and hd
         * 16 (whose copy passes cover more rows than a tile has) over a prefix */
        {4, 2, 32, 8, 192, 256, 170, 256},
        {4, 4, 16, 4, 96, 130, 90, 130},
    };
    /* the bf16 forward on mma.sync for every head_dim first (head_dim 256 runs on wgmma by default
     * where it can) */
    setenv("SQUAD_ATT_SM90", "0", 1);
    printf("attention forward on mma.sync (SQUAD_ATT_SM90=0)\n");
    for (int exact = 0; exact < 2; exact++)
        for (size_t i = 0; i < sizeof ac / sizeof ac[0]; i++) test_attn(&r, &ac[i], exact);
    /* the bf16 forward on wgmma (head_dim 256 on an H100 / H200 class GPU): the same cases */
    {
        setenv("SQUAD_ATT_SM90", "1", 1);
        squad_err err = {0};
        const int on = squad_cuda_test_attn_sm90(256, &err);
        CHECKF(on >= 0, "squad_cuda_test_attn_sm90: %s", err.msg);
        printf("attention forward on wgmma (SQUAD_ATT_SM90=1): %s\n", on == 1 ? "runs here" : "not on this GPU");
        if (on == 1)
            for (size_t i = 0; i < sizeof ac / sizeof ac[0]; i++) test_attn(&r, &ac[i], 0);
    }
    unsetenv("SQUAD_ATT_SM90");
    test_small(&r);
    test_gemm_shapes(&r);
    return test_summary("gpu_test_kernels");
}
#else
int main(void) {
    printf("gpu_test_kernels: built without CUDA, skipped\n");
    return TEST_SKIPPED;
}
#endif
