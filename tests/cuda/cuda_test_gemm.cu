/*
 * cuda_test_gemm.cu — implements cuda_test_gemm.h: runs and times the projections' GEMM paths (the
 * sm_90a kernel in a given configuration or one of its probe variants, cuBLASLt, the tuning's choice)
 * for tests/gpu_test_gemm.c.
 *
 * Design: one object holds a stream and three GEMM contexts, none with a plan file: `lt` (cuBLASLt
 * only, untuned: the heuristic's first choice; it also runs the sm_90a kernel in a given configuration),
 * `lt_tuned` (the tuning without the sm_90a kernel) and `all` (the tuning as the backend runs it).
 * Every call allocates its device buffers, checks every CUDA call and frees what it made.
 */
#include "cuda_test_common.cuh"

#include <stdlib.h>

#include "cuda_test_gemm.h"

#define GT_GUARD_ROWS 3              /* poisoned output rows before and after the M valid ones */
#define GT_ROTATE_BYTES (256u << 20) /* weight copies cycled through when timing: 5x the 50 MB L2 */
#define GT_REPS 50                   /* calls per timed graph */
#define GT_REPLAYS 5                 /* timed replays; the median counts */

#define GT_SAME(a, b) ((int)(a) == (int)(b)) /* two unnamed enums' values */
static_assert(GT_SAME(SQUAD_GEMM_VAR_FULL, CU_SM90_VAR_FULL) && GT_SAME(SQUAD_GEMM_VAR_LAUNCH, CU_SM90_VAR_LAUNCH) &&
                  GT_SAME(SQUAD_GEMM_VAR_EMPTY, CU_SM90_VAR_EMPTY) && GT_SAME(SQUAD_GEMM_VAR_LOADS, CU_SM90_VAR_LOADS) &&
                  GT_SAME(SQUAD_GEMM_VAR_MAIN, CU_SM90_VAR_MAIN) && GT_SAME(SQUAD_GEMM_VAR_STAGED, CU_SM90_VAR_STAGED) &&
                  GT_SAME(SQUAD_GEMM_VAR_REDUCED, CU_SM90_VAR_REDUCED) &&
                  GT_SAME(SQUAD_GEMM_VAR_PREFETCH, CU_SM90_VAR_PREFETCH) &&
                  GT_SAME(SQUAD_GEMM_VAR_TRIGGER_MAIN, CU_SM90_VAR_TRIGGER_MAIN) &&
                  GT_SAME(SQUAD_GEMM_VAR_TRIGGER_START, CU_SM90_VAR_TRIGGER_START) &&
                  GT_SAME(SQUAD_GEMM_N_VARS, CU_SM90_N_VARS),
              "the test's variant numbers are the kernel's");

struct squad_gemm_test {
    cudaStream_t st;
    cu_gemm_ctx lt, lt_tuned, all;
    int have_lt, have_lt_tuned, have_all;
    int weights_l2; /* squad_gemm_test_weights_l2 */
};

extern "C" void squad_gemm_test_weights_l2(squad_gemm_test *t, int on) { t->weights_l2 = on != 0; }

extern "C" void squad_gemm_test_free(squad_gemm_test *t) {
    if (!t) return;
    if (t->st) {
        cudaStreamSynchronize(t->st);
        cudaStreamDestroy(t->st);
    }
    if (t->have_lt) cu_gemm_free(&t->lt);
    if (t->have_lt_tuned) cu_gemm_free(&t->lt_tuned);
    if (t->have_all) cu_gemm_free(&t->all);
    free(t);
}

static int ctx_init(cu_gemm_ctx *g, int *have, int sm90_off, squad_err *err) {
    cuda_knobs kn;
    memset(g, 0, sizeof *g);
    int rc = cu_test_knobs(&kn, err);
    if (!rc) rc = cu_gemm_init(g, &kn, err);
    *have = 1; /* cu_gemm_free is safe after a failed init */
    g->sm90_off = sm90_off;
    return rc;
}

extern "C" squad_gemm_test *squad_gemm_test_new(squad_err *err) {
    squad_gemm_test *t = (squad_gemm_test *)calloc(1, sizeof *t);
    if (!t) {
        cu_err(err, SQUAD_E_NOMEM, "out of memory (GEMM test)");
        return NULL;
    }
    int rc = ctx_init(&t->lt, &t->have_lt, 1, err);
    if (!rc) rc = ctx_init(&t->lt_tuned, &t->have_lt_tuned, 1, err);
    if (!rc) rc = ctx_init(&t->all, &t->have_all, 0, err);
    if (!rc) {
        const cudaError_t e = cudaStreamCreateWithFlags(&t->st, cudaStreamNonBlocking);
        if (e != cudaSuccess) rc = cu_fail(err, "cudaStreamCreateWithFlags", e, __FILE__, __LINE__);
    }
    if (rc) {
        squad_gemm_test_free(t);
        return NULL;
    }
    return t;
}

extern "C" int squad_gemm_test_has_sm90(const squad_gemm_test *t) { return t->lt.sm90; }

extern "C" int squad_gemm_test_configs(const squad_gemm_test *t, int M, int N, int K, int (*cfg)[3], int max) {
    cu_sm90_cfg c[CU_SM90_MAX_CFGS];
    const int n = cu_sm90_candidates(&t->lt, M, N, K, 0, c, max < CU_SM90_MAX_CFGS ? max : CU_SM90_MAX_CFGS);
    for (int i = 0; i < n; i++) {
        cfg[i][0] = c[i].wg;
        cfg[i][1] = c[i].nt;
        cfg[i][2] = c[i].splits;
    }
    return n;
}

/* ---- one call on host data ---- */

typedef struct gt_bufs {
    void *p[4];
    int n;
} gt_bufs;

static int gt_alloc(gt_bufs *b, void **out, size_t bytes, squad_err *err) {
    *out = NULL;
    CU_TRY(cudaMalloc(out, bytes));
    b->p[b->n++] = *out;
    return 0;
}
static void gt_free(gt_bufs *b) {
    for (int i = 0; i < b->n; i++) cudaFree(b->p[i]);
    b->n = 0;
}

static int upload_bf16(gt_bufs *b, void **out, const float *h, size_t n, squad_err *err) {
    bf16 *tmp = (bf16 *)malloc(n * sizeof(bf16));
    if (!tmp) return cu_err(err, SQUAD_E_NOMEM, "out of memory (GEMM test upload)");
    for (size_t i = 0; i < n; i++) tmp[i] = __float2bfloat16(h[i]);
    int rc = gt_alloc(b, out, n * sizeof(bf16), err);
    if (!rc) {
        const cudaError_t e = cudaMemcpy(*out, tmp, n * sizeof(bf16), cudaMemcpyHostToDevice);
        if (e != cudaSuccess) rc = cu_fail(err, "cudaMemcpy (upload)", e, __FILE__, __LINE__);
    }
    free(tmp);
    return rc;
}

/* One sm_90a call: the product (var FULL) or one of its variants. */
static int sm90_call(squad_gemm_test *t, const cu_sm90_cfg *c, int var, const void *W, const void *X, void *Y, int M,
                     int N, int K, int acc, squad_err *err) {
    if (var == SQUAD_GEMM_VAR_FULL) return cu_sm90_gemm(&t->lt, c, W, X, Y, M, N, K, acc, t->st, err);
    return cu_sm90_variant_gemm(&t->lt, c, var, W, X, Y, M, N, K, acc, t->st, err);
}

static int run_once(squad_gemm_test *t, gt_bufs *b, const float *X, const float *W, const float *R0, float *Y, int M,
                    int N, int K, int acc, const int *cfg, int var, int *guard_ok, squad_err *err) {
    const size_t es = acc ? sizeof(float) : sizeof(bf16);
    const size_t guard = (size_t)GT_GUARD_ROWS * N, valid = (size_t)M * N, total = valid + 2 * guard;
    void *dX, *dW, *dY;
    int rc;
    if ((rc = upload_bf16(b, &dX, X, (size_t)M * K, err))) return rc;
    if ((rc = upload_bf16(b, &dW, W, (size_t)N * K, err))) return rc;
    if ((rc = gt_alloc(b, &dY, total * es, err))) return rc;
    CU_TRY(cudaMemset(dY, 0xFF, total * es)); /* NaN in bf16 and fp32 */
    char *Yv = (char *)dY + guard * es;
    if (acc) CU_TRY(cudaMemcpy(Yv, R0, valid * es, cudaMemcpyHostToDevice));
    CU_TRY(cudaDeviceSynchronize());
    if (cfg) {
        const cu_sm90_cfg c = {cfg[0], cfg[1], cfg[2]};
        if (var != SQUAD_GEMM_VAR_FULL && (rc = cu_sm90_variant_ready(&c, var, err))) return rc;
        rc = sm90_call(t, &c, var, dW, dX, Yv, M, N, K, acc, err);
    } else {
        rc = cu_gemm(&t->lt, dW, dX, Yv, M, N, K, acc, 0, t->st, err);
    }
    if (rc) return rc;
    CU_TRY(cudaStreamSynchronize(t->st));
    unsigned char *h = (unsigned char *)malloc(total * es);
    if (!h) return cu_err(err, SQUAD_E_NOMEM, "out of memory (GEMM test download)");
    const cudaError_t e = cudaMemcpy(h, dY, total * es, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        free(h);
        return cu_fail(err, "cudaMemcpy (download)", e, __FILE__, __LINE__);
    }
    *guard_ok = 1;
    for (size_t i = 0; i < guard * es; i++)
        if (h[i] != 0xFF || h[(guard + valid) * es + i] != 0xFF) {
            *guard_ok = 0;
            break;
        }
    const unsigned char *v = h + guard * es;
    for (size_t i = 0; i < valid; i++) {
        if (acc) {
            memcpy(&Y[i], v + i * 4, 4);
        } else {
            bf16 x;
            memcpy(&x, v + i * 2, 2);
            Y[i] = __bfloat162float(x);
        }
    }
    free(h);
    return 0;
}

extern "C" int squad_gemm_test_run(squad_gemm_test *t, const float *X, const float *W, const float *R0, float *Y,
                                   int M, int N, int K, int acc, const int *cfg, int *guard_ok, squad_err *err) {
    *guard_ok = 0;
    if (M < 1 || N < 1 || K < 1 || (acc && !R0))
        return cu_err(err, SQUAD_E_INVALID, "GEMM test: bad shape %d x %d x %d", M, N, K);
    gt_bufs b = {{0}, 0};
    const int rc = run_once(t, &b, X, W, R0, Y, M, N, K, acc, cfg, SQUAD_GEMM_VAR_FULL, guard_ok, err);
    cudaDeviceSynchronize();
    gt_free(&b);
    return rc;
}

extern "C" int squad_gemm_test_run_variant(squad_gemm_test *t, const float *X, const float *W, const float *R0,
                                           float *Y, int M, int N, int K, int acc, const int *cfg, int var,
                                           int *guard_ok, squad_err *err) {
    *guard_ok = 0;
    if (M < 1 || N < 1 || K < 1 || (acc && !R0) || !cfg || var < 0 || var >= SQUAD_GEMM_N_VARS)
        return cu_err(err, SQUAD_E_INVALID, "GEMM test: bad variant call %d x %d x %d (variant %d)", M, N, K, var);
    gt_bufs b = {{0}, 0};
    const int rc = run_once(t, &b, X, W, R0, Y, M, N, K, acc, cfg, var, guard_ok, err);
    cudaDeviceSynchronize();
    gt_free(&b);
    return rc;
}

/* ---- timing ---- */

static int call(squad_gemm_test *t, int what, const cu_sm90_cfg *c, int var, const void *W, const void *X, void *Y,
                int M, int N, int K, int acc, squad_err *err) {
    if (what == SQUAD_GEMM_TIME_SM90) return sm90_call(t, c, var, W, X, Y, M, N, K, acc, err);
    return cu_gemm(what == SQUAD_GEMM_TIME_LT ? &t->lt_tuned : &t->all, W, X, Y, M, N, K, acc, 0, t->st, err);
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static int time_graph(squad_gemm_test *t, int what, const cu_sm90_cfg *c, int var, const bf16 *Wb, size_t w_stride,
                      int n_rot, const void *X, void *Y, int M, int N, int K, int acc, double *us, squad_err *err) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t ex = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = 0;
    CU_TRY(cudaStreamBeginCapture(t->st, cudaStreamCaptureModeThreadLocal));
    for (int r = 0; r < GT_REPS && !rc; r++)
        rc = call(t, what, c, var, Wb + (size_t)(r % n_rot) * w_stride, X, Y, M, N, K, acc, err);
    const cudaError_t ce = cudaStreamEndCapture(t->st, &graph);
    if (!rc && ce != cudaSuccess) rc = cu_fail(err, "cudaStreamEndCapture", ce, __FILE__, __LINE__);
    cudaError_t e = cudaSuccess;
    float ms[GT_REPLAYS];
    if (!rc) e = cudaGraphInstantiate(&ex, graph, 0);
    if (!rc && e == cudaSuccess) e = cudaEventCreate(&e0);
    if (!rc && e == cudaSuccess) e = cudaEventCreate(&e1);
    if (!rc && e == cudaSuccess) e = cudaGraphLaunch(ex, t->st); /* warm-up */
    for (int i = 0; !rc && e == cudaSuccess && i < GT_REPLAYS; i++) {
        e = cudaEventRecord(e0, t->st);
        if (e == cudaSuccess) e = cudaGraphLaunch(ex, t->st);
        if (e == cudaSuccess) e = cudaEventRecord(e1, t->st);
        if (e == cudaSuccess) e = cudaEventSynchronize(e1);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms[i], e0, e1);
    }
    if (!rc && e != cudaSuccess) rc = cu_fail(err, "GEMM timing graph", e, __FILE__, __LINE__);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (ex) cudaGraphExecDestroy(ex);
    if (graph) cudaGraphDestroy(graph);
    if (rc) return rc;
    qsort(ms, GT_REPLAYS, sizeof ms[0], cmp_float);
    *us = 1e3 * ms[GT_REPLAYS / 2] / GT_REPS;
    return 0;
}

static int time_once(squad_gemm_test *t, gt_bufs *b, int what, int M, int N, int K, int acc, const int *cfg, int var,
                     int *chosen, double *us, squad_err *err) {
    const size_t w_stride = ((size_t)N * K + 127) / 128 * 128; /* elements between weight copies */
    int n_rot = (int)(GT_ROTATE_BYTES / (w_stride * sizeof(bf16)));
    if (n_rot < 2) n_rot = 2;
    if (t->weights_l2) n_rot = 1; /* one copy: from L2 after the first call, where it fits */
    void *dW, *dX, *dY;
    int rc;
    if ((rc = gt_alloc(b, &dW, w_stride * sizeof(bf16) * n_rot, err))) return rc;
    if ((rc = gt_alloc(b, &dX, (size_t)M * K * sizeof(bf16), err))) return rc;
    if ((rc = gt_alloc(b, &dY, (size_t)M * N * (acc ? sizeof(float) : sizeof(bf16)), err))) return rc;
    CU_TRY(cudaMemsetAsync(dY, 0, (size_t)M * N * (acc ? sizeof(float) : sizeof(bf16)), t->st));
    if ((rc = cu_test_fill_gemm_operands((bf16 *)dW, w_stride * n_rot, (bf16 *)dX, (size_t)M * K, t->st, err)))
        return rc;
    cu_sm90_cfg c = {0, 0, 0};
    if (what == SQUAD_GEMM_TIME_SM90) {
        if (!cfg) return cu_err(err, SQUAD_E_INVALID, "GEMM timing: no configuration");
        c.wg = cfg[0], c.nt = cfg[1], c.splits = cfg[2];
        if (var != SQUAD_GEMM_VAR_FULL && (rc = cu_sm90_variant_ready(&c, var, err))) return rc; /* not in a capture */
    } else {
        /* plan (and tune) outside the capture, as the backend does */
        cu_gemm_ctx *g = what == SQUAD_GEMM_TIME_LT ? &t->lt_tuned : &t->all;
        g->tune = 1;
        rc = cu_gemm(g, dW, dX, dY, M, N, K, acc, 0, t->st, err);
        g->tune = 0;
        if (rc) return rc;
        if (chosen) {
            chosen[0] = chosen[1] = chosen[2] = 0;
            for (int i = 0; i < g->n_plans; i++) {
                const cu_gemm_plan *p = &g->plans[i];
                if (p->M == M && p->N == N && p->K == K && p->acc == acc && !p->f32 && p->kind == CU_GEMM_SM90) {
                    chosen[0] = p->cfg.wg, chosen[1] = p->cfg.nt, chosen[2] = p->cfg.splits;
                }
            }
        }
    }
    CU_TRY(cudaStreamSynchronize(t->st));
    return time_graph(t, what, &c, var, (const bf16 *)dW, w_stride, n_rot, dX, dY, M, N, K, acc, us, err);
}

extern "C" int squad_gemm_test_time(squad_gemm_test *t, int what, int M, int N, int K, int acc, const int *cfg,
                                    int *chosen, double *us, squad_err *err) {
    *us = -1.0;
    if (M < 1 || N < 1 || K < 1 || what < SQUAD_GEMM_TIME_LT || what > SQUAD_GEMM_TIME_TUNED)
        return cu_err(err, SQUAD_E_INVALID, "GEMM timing: bad arguments");
    gt_bufs b = {{0}, 0};
    const int rc = time_once(t, &b, what, M, N, K, acc, cfg, SQUAD_GEMM_VAR_FULL, chosen, us, err);
    cudaStreamSynchronize(t->st);
    gt_free(&b);
    return rc;
}

extern "C" int squad_gemm_test_time_variant(squad_gemm_test *t, int M, int N, int K, int acc, const int *cfg, int var,
                                            double *us, squad_err *err) {
    *us = -1.0;
    if (M < 1 || N < 1 || K < 1 || !cfg || var < 0 || var >= SQUAD_GEMM_N_VARS)
        return cu_err(err, SQUAD_E_INVALID, "GEMM timing: bad variant arguments");
    gt_bufs b = {{0}, 0};
    const int rc = time_once(t, &b, SQUAD_GEMM_TIME_SM90, M, N, K, acc, cfg, var, NULL, us, err);
    cudaStreamSynchronize(t->st);
    gt_free(&b);
    return rc;
}

/* ---- the plan file ---- */

static int rec_same(const cu_plan_rec *a, const cu_plan_rec *b) {
    if (a->M != b->M || a->N != b->N || a->K != b->K || a->acc != b->acc || a->f32 != b->f32 || a->kind != b->kind)
        return 0;
    if (a->kind == CU_GEMM_SM90)
        return a->cfg.wg == b->cfg.wg && a->cfg.nt == b->cfg.nt && a->cfg.splits == b->cfg.splits;
    return !memcmp(&a->algo, &b->algo, sizeof a->algo);
}

extern "C" int squad_gemm_test_plan_file(char *why, size_t why_len) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        snprintf(why, why_len, "no device");
        return -1;
    }
    cu_plan_rec r[2];
    memset(r, 0, sizeof r);
    r[0].M = 32, r[0].N = 1024, r[0].K = 2048, r[0].acc = 1, r[0].kind = CU_GEMM_LT;
    unsigned char *w = (unsigned char *)&r[0].algo;
    for (size_t i = 0; i < sizeof r[0].algo; i++) w[i] = (unsigned char)(i * 37 + 11);
    r[1].M = 128, r[1].N = 8224, r[1].K = 1024, r[1].acc = 0, r[1].kind = CU_GEMM_SM90;
    r[1].cfg.wg = 2, r[1].cfg.nt = 2, r[1].cfg.splits = 3;
    cuda_knobs kn; /* the plan file as a backend would find it (SQUAD_GEMM_PLANS, which the caller set) */
    squad_err kerr = {0, {0}};
    if (cuda_knobs_read(&kn, &kerr)) {
        snprintf(why, why_len, "%s", kerr.msg);
        return -1;
    }
    cu_plan_store a;
    cu_plan_store_init(&a, kn.gemm_plans, dev, 1u << 20);
    if (!a.enabled) {
        cu_plan_store_free(&a);
        snprintf(why, why_len, "the store is off (SQUAD_GEMM_PLANS unset or the device unknown)");
        return -1;
    }
    cu_plan_store_add(&a, &r[0]);
    cu_plan_store_add(&a, &r[1]);
    cu_plan_store_free(&a);
    cu_plan_store b;
    cu_plan_store_init(&b, kn.gemm_plans, dev, 1u << 20);
    int ok = 1;
    for (int i = 0; i < 2 && ok; i++) {
        const cu_plan_rec *f = cu_plan_store_find(&b, r[i].M, r[i].N, r[i].K, r[i].acc, r[i].f32);
        if (!f || !rec_same(f, &r[i])) {
            snprintf(why, why_len, "record %d (%s) %s after a write and a read", i, i ? "sm90a" : "cuBLASLt",
                     f ? "differs" : "is missing");
            ok = 0;
        }
    }
    cu_plan_store_free(&b);
    return ok ? 0 : -1;
}
