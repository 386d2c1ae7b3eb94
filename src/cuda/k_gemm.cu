/*
 * k_gemm.cu — the projections through cuBLASLt (see cu_gemm_plan in cuda_internal.cuh).
 *
 * Design: one handle and one workspace per backend; bf16 (fast) or fp32 (exact) operands; a plan
 * per (M, N, K, acc, f32) made on first use and kept for the backend's life, so capturing a chunk
 * graph issues only cublasLtMatmul calls. With g->tune set (the backend's untimed plan pass before
 * each capture, whose outputs are scratch) a new plan times up to GEMM_CANDIDATES of the
 * heuristic's algorithms, plus split-K variants of its first GEMM_SPLITK_BASES, on the real
 * operands and keeps the fastest; otherwise (and always while a stream is being captured) it takes
 * the heuristic's first. A candidate is timed as it runs in a forward: GEMM_TUNE_CALLS calls back to
 * back in one graph, each on another copy of the weights in a buffer of GEMM_ROT_L2X times the L2
 * size, so every call reads its weights from HBM (the model's ~1 GB of weights pass through a 50 MB
 * L2 once per chunk) while the activations stay in L2. Timing with the weights hot in L2 favoured
 * compute-bound tiles that lose in a forward; timing single calls after an L2 flush ranked some shapes
 * differently from back-to-back calls (the 2048 x 1024 x 3584 down-projection lost 11 % to the
 * heuristic's first choice) and left the choice noisy from one engine to the next.
 * Every cuBLASLt status is checked and reported with the call's text.
 *
 * Reproducibility: the timing makes the choice noisy, so a tuned plan's algorithm is written to the
 * plan store (gemm_plans.cu), and a new plan whose shape the store holds takes the stored algorithm
 * (checked by cublasLtMatmulAlgoCheck) instead of tuning: every process on the same GPU model and
 * library versions runs the same algorithms, hence gives the same bits, and only the first tunes.
 * Plans made without tuning take the heuristic's first choice, which is deterministic.
 *
 * On compute capability 9.0 the tuning also times the sm_90a small-M kernel (k_gemm_sm90.cu) in its
 * configurations for the shape, on the same rotated weights, and keeps it where it is the fastest;
 * the plan store records that choice like an algorithm. A plan that chose it still holds the
 * heuristic's algorithm, which runs any call the kernel cannot take (unaligned operands).
 */
#include "cuda_internal.cuh"

#include <stdlib.h>

#define GEMM_WORKSPACE_BYTES (32u << 20)
#define GEMM_CANDIDATES 32 /* heuristic results timed when tuning (8 left the N = 1024 GEMMs at ~500 TFLOP/s) */
#define GEMM_SPLITK_BASES 4 /* heuristic results also timed with K split (GEMM_SPLITK_WAYS) */
static const int GEMM_SPLITK_WAYS[] = {2, 3, 4, 8};
#define GEMM_N_SPLITK_WAYS ((int)(sizeof GEMM_SPLITK_WAYS / sizeof GEMM_SPLITK_WAYS[0]))
#define GEMM_TUNE_CALLS 8   /* back-to-back calls in a candidate's timing graph */
#define GEMM_TUNE_REPLAYS 3 /* timed replays of that graph (after one warm-up); the fastest counts */
#define GEMM_ROT_L2X 2      /* the buffer of weight copies is this many times the L2 size */

#define LT_TRY(call)                                                                                   \
    do {                                                                                               \
        cublasStatus_t s_ = (call);                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                               \
            return cu_err(err, SQUAD_E_BACKEND, "cuBLASLt: %s: %s (%d) at %s:%d", #call,           \
                              cublasLtGetStatusString(s_), (int)s_, __FILE__, __LINE__);               \
    } while (0)

int cu_gemm_init(cu_gemm_ctx *g, const cuda_knobs *knobs, squad_err *err) {
    memset(g, 0, sizeof *g);
    LT_TRY(cublasLtCreate(&g->lt));
    g->ws_bytes = GEMM_WORKSPACE_BYTES;
    CU_TRY(cudaMalloc(&g->ws, g->ws_bytes));
    int dev = 0;
    CU_TRY(cudaGetDevice(&dev));
    cu_plan_store_init(&g->store, knobs->gemm_plans, dev, g->ws_bytes);
    return cu_sm90_init(g, knobs->gemm_sm90, err);
}

static void plan_free(cu_gemm_plan *p) {
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
}

void cu_gemm_free(cu_gemm_ctx *g) {
    for (int i = 0; i < g->n_plans; i++) plan_free(&g->plans[i]);
    free(g->plans);
    if (g->ws) cudaFree(g->ws);
    if (g->rot) cudaFree(g->rot);
    if (g->lt) cublasLtDestroy(g->lt);
    cu_sm90_free(g);
    cu_plan_store_free(&g->store);
    memset(g, 0, sizeof *g);
}

/* A split-K variant of `base` (K in `ways` parts, partial sums reduced in the compute type where
 * the algorithm can), if the algorithm supports it and cuBLASLt accepts it for this plan within
 * the workspace. */
static int splitk_variant(const cu_gemm_ctx *g, const cu_gemm_plan *p, const cublasLtMatmulAlgo_t *base, int ways,
                          cublasLtMatmulAlgo_t *out) {
    int32_t support = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &support, sizeof support,
                                          &written) != CUBLAS_STATUS_SUCCESS ||
        !support)
        return 0;
    uint32_t schemes = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes,
                                          &written) != CUBLAS_STATUS_SUCCESS)
        return 0;
    const uint32_t scheme = (schemes & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                            : (schemes & CUBLASLT_REDUCTION_SCHEME_INPLACE)    ? CUBLASLT_REDUCTION_SCHEME_INPLACE
                            : (schemes & CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE) ? CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE
                                                                                : 0u;
    if (!scheme) return 0;
    *out = *base;
    const int32_t k = ways;
    if (cublasLtMatmulAlgoConfigSetAttribute(out, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &k, sizeof k) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigSetAttribute(out, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) !=
            CUBLAS_STATUS_SUCCESS)
        return 0;
    cublasLtMatmulHeuristicResult_t chk;
    memset(&chk, 0, sizeof chk);
    return cublasLtMatmulAlgoCheck(g->lt, p->desc, p->la, p->lb, p->lc, p->lc, out, &chk) == CUBLAS_STATUS_SUCCESS &&
           chk.state == CUBLAS_STATUS_SUCCESS && chk.workspaceSize <= g->ws_bytes;
}

/* The tuning's buffer of weight copies (zeros: the values do not change the time), made on first use. */
static int ensure_rotation(cu_gemm_ctx *g, cudaStream_t st, squad_err *err) {
    if (g->rot) return 0;
    int dev = 0, l2 = 0;
    CU_TRY(cudaGetDevice(&dev));
    CU_TRY(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    const size_t bytes = (size_t)GEMM_ROT_L2X * (size_t)(l2 > 0 ? l2 : (64 << 20));
    CU_TRY(cudaMalloc(&g->rot, bytes));
    g->rot_bytes = bytes;
    CU_TRY(cudaMemsetAsync(g->rot, 0, bytes, st));
    return 0;
}

/* One tuning candidate: a cuBLASLt algorithm or a configuration of the sm_90a kernel. */
typedef struct gemm_cand {
    int kind; /* CU_GEMM_LT: algo; CU_GEMM_SM90: cfg */
    cublasLtMatmulAlgo_t algo;
    cu_sm90_cfg cfg;
} gemm_cand;

static int run_candidate(cu_gemm_ctx *g, const cu_gemm_plan *p, const gemm_cand *c, const void *W, const void *X,
                         void *Y, cudaStream_t st) {
    if (c->kind == CU_GEMM_SM90) {
        squad_err e = {0};
        return cu_sm90_gemm(g, &c->cfg, W, X, Y, p->M, p->N, p->K, p->acc, st, &e) == 0;
    }
    const float alpha = 1.f, beta = p->acc ? 1.f : 0.f;
    return cublasLtMatmul(g->lt, p->desc, &alpha, W, p->la, X, p->lb, &beta, Y, p->lc, Y, p->lc, &c->algo, g->ws,
                          g->ws_bytes, st) == CUBLAS_STATUS_SUCCESS;
}

/* Milliseconds per call of a candidate, GEMM_TUNE_CALLS calls back to back in one graph, each on the
 * next copy of the weights in g->rot (W itself when one copy does not fit); negative when the
 * candidate refuses these operands. *ev_fail is set when CUDA itself fails. */
static float time_candidate(cu_gemm_ctx *g, const cu_gemm_plan *p, const gemm_cand *c, const void *W, const void *X,
                            void *Y, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int *ev_fail) {
    if (!run_candidate(g, p, c, W, X, Y, st)) {
        (void)cudaGetLastError(); /* a refused launch leaves its error behind */
        return -1.f;
    }
    const size_t w_bytes = ((size_t)p->N * p->K * (p->f32 ? 4 : 2) + 255) & ~(size_t)255;
    size_t n_rot = g->rot_bytes / w_bytes;
    if (n_rot > GEMM_TUNE_CALLS) n_rot = GEMM_TUNE_CALLS;
    cudaGraph_t graph = NULL;
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        *ev_fail = 1;
        return -1.f;
    }
    int ok = 1;
    for (int i = 0; i < GEMM_TUNE_CALLS; i++) {
        const void *Wi = n_rot ? (const void *)((const char *)g->rot + (size_t)(i % n_rot) * w_bytes) : W;
        ok &= run_candidate(g, p, c, Wi, X, Y, st);
    }
    const cudaError_t ec = cudaStreamEndCapture(st, &graph);
    cudaGraphExec_t ex = NULL;
    if (ok && ec == cudaSuccess && cudaGraphInstantiate(&ex, graph, 0) != cudaSuccess) ex = NULL;
    if (graph) cudaGraphDestroy(graph);
    if (!ex) {
        (void)cudaGetLastError();
        return -1.f;
    }
    float best = -1.f;
    for (int r = -1; r < GEMM_TUNE_REPLAYS; r++) { /* r = -1: warm-up */
        float ms = 0.f;
        if (cudaEventRecord(e0, st) != cudaSuccess || cudaGraphLaunch(ex, st) != cudaSuccess ||
            cudaEventRecord(e1, st) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
            *ev_fail = 1;
            break;
        }
        if (r >= 0 && (best < 0.f || ms < best)) best = ms;
    }
    cudaGraphExecDestroy(ex);
    return *ev_fail || best < 0.f ? -1.f : best / GEMM_TUNE_CALLS;
}

/* A stored algorithm still fits this plan's descriptors within the workspace. */
static int algo_usable(const cu_gemm_ctx *g, const cu_gemm_plan *p, const cublasLtMatmulAlgo_t *algo) {
    cublasLtMatmulHeuristicResult_t chk;
    memset(&chk, 0, sizeof chk);
    return cublasLtMatmulAlgoCheck(g->lt, p->desc, p->la, p->lb, p->lc, p->lc, algo, &chk) == CUBLAS_STATUS_SUCCESS &&
           chk.state == CUBLAS_STATUS_SUCCESS && chk.workspaceSize <= g->ws_bytes;
}

/* A tuned plan's choice, for later processes. */
static void remember(cu_gemm_ctx *g, const cu_gemm_plan *p) {
    cu_plan_rec r;
    memset(&r, 0, sizeof r);
    r.M = p->M, r.N = p->N, r.K = p->K, r.acc = p->acc, r.f32 = p->f32;
    r.kind = p->kind;
    r.algo = p->algo;
    r.cfg = p->cfg;
    cu_plan_store_add(&g->store, &r);
}

static int plan_make(cu_gemm_ctx *g, cu_gemm_plan *p, const void *W, const void *X, void *Y, cudaStream_t st,
                     squad_err *err) {
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const cudaDataType_t it = p->f32 ? CUDA_R_32F : CUDA_R_16BF;
    const cudaDataType_t dt = p->acc || p->f32 ? CUDA_R_32F : CUDA_R_16BF;
    LT_TRY(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->la, it, (uint64_t)p->K, (uint64_t)p->N, (int64_t)p->K));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->lb, it, (uint64_t)p->K, (uint64_t)p->M, (int64_t)p->K));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->lc, dt, (uint64_t)p->N, (uint64_t)p->M, (int64_t)p->N));
    cublasLtMatmulPreference_t pref = NULL;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &g->ws_bytes, sizeof g->ws_bytes);
    /* the heuristic's results, then room for the split-K variants */
    cublasLtMatmulHeuristicResult_t res[GEMM_CANDIDATES];
    gemm_cand cand[GEMM_CANDIDATES + GEMM_SPLITK_BASES * GEMM_N_SPLITK_WAYS + CU_SM90_MAX_CFGS];
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    const int tune = g->tune && cudaStreamIsCapturing(st, &cap) == cudaSuccess && cap == cudaStreamCaptureStatusNone;
    int n = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(g->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, tune ? GEMM_CANDIDATES : 1,
                                           res, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS)
        return cu_err(err, SQUAD_E_BACKEND, "cuBLASLt: cublasLtMatmulAlgoGetHeuristic(%d x %d x %d): %s", p->M,
                          p->N, p->K, cublasLtGetStatusString(s));
    if (n < 1)
        return cu_err(err, SQUAD_E_BACKEND, "cuBLASLt: no algorithm for %d x %d x %d", p->M, p->N, p->K);
    p->algo = res[0].algo;
    p->kind = CU_GEMM_LT;
    /* a shape tuned before (by this process or an earlier one): its choice again */
    const cu_plan_rec *stored = cu_plan_store_find(&g->store, p->M, p->N, p->K, p->acc, p->f32);
    if (stored && stored->kind == CU_GEMM_LT && algo_usable(g, p, &stored->algo)) {
        p->algo = stored->algo;
        return 0;
    }
    if (stored && stored->kind == CU_GEMM_SM90 && cu_sm90_usable(g, &stored->cfg, W, X, Y, p->M, p->N, p->K, p->f32)) {
        p->kind = CU_GEMM_SM90;
        p->cfg = stored->cfg;
        return 0;
    }
    if (!tune) return 0;
    int nc = 0;
    memset(cand, 0, sizeof cand);
    for (int i = 0; i < n; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS) cand[nc++].algo = res[i].algo;
    for (int i = 0; i < n && i < GEMM_SPLITK_BASES; i++)
        for (int w = 0; w < GEMM_N_SPLITK_WAYS && res[i].state == CUBLAS_STATUS_SUCCESS; w++)
            if (p->K / GEMM_SPLITK_WAYS[w] >= 256 &&
                splitk_variant(g, p, &res[i].algo, GEMM_SPLITK_WAYS[w], &cand[nc].algo))
                nc++;
    if (!g->sm90_off) {
        cu_sm90_cfg cfgs[CU_SM90_MAX_CFGS];
        const int ns = cu_sm90_candidates(g, p->M, p->N, p->K, p->f32, cfgs, CU_SM90_MAX_CFGS);
        for (int i = 0; i < ns; i++)
            if (cu_sm90_usable(g, &cfgs[i], W, X, Y, p->M, p->N, p->K, p->f32)) {
                cand[nc].kind = CU_GEMM_SM90;
                cand[nc].cfg = cfgs[i];
                nc++;
            }
    }
    if (nc <= 1) {
        remember(g, p);
        return 0;
    }
    const int rf = ensure_rotation(g, st, err);
    if (rf) return rf;
    /* time each candidate and keep the fastest */
    cudaEvent_t e0 = NULL, e1 = NULL;
    CU_TRY(cudaEventCreate(&e0));
    if (cudaEventCreate(&e1) != cudaSuccess) {
        cudaEventDestroy(e0);
        return cu_err(err, SQUAD_E_BACKEND, "CUDA: cudaEventCreate failed");
    }
    float best = 1e30f;
    int ev_fail = 0;
    for (int i = 0; i < nc && !ev_fail; i++) {
        const float ms = time_candidate(g, p, &cand[i], W, X, Y, st, e0, e1, &ev_fail);
        if (ms < 0.f || ms >= best) continue;
        best = ms;
        p->kind = cand[i].kind;
        if (cand[i].kind == CU_GEMM_SM90) p->cfg = cand[i].cfg;
        else p->algo = cand[i].algo;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (ev_fail) {
        const cudaError_t e = cudaGetLastError();
        return cu_fail(err, "GEMM tuning (events)", e, __FILE__, __LINE__);
    }
    remember(g, p);
    return 0;
}

int cu_gemm(cu_gemm_ctx *g, const void *W, const void *X, void *Y, int M, int N, int K, int acc, int f32,
            cudaStream_t st, squad_err *err) {
    cu_gemm_plan *p = NULL;
    for (int i = 0; i < g->n_plans; i++) {
        cu_gemm_plan *q = &g->plans[i];
        if (q->M == M && q->N == N && q->K == K && q->acc == acc && q->f32 == f32) {
            p = q;
            break;
        }
    }
    if (!p) {
        if (g->n_plans == g->cap_plans) {
            const int cap = g->cap_plans ? 2 * g->cap_plans : 64;
            cu_gemm_plan *np = (cu_gemm_plan *)realloc(g->plans, sizeof *np * (size_t)cap);
            if (!np) return cu_err(err, SQUAD_E_NOMEM, "out of memory (GEMM plans)");
            g->plans = np;
            g->cap_plans = cap;
        }
        p = &g->plans[g->n_plans];
        memset(p, 0, sizeof *p);
        p->M = M;
        p->N = N;
        p->K = K;
        p->acc = acc;
        p->f32 = f32;
        const int rc = plan_make(g, p, W, X, Y, st, err);
        if (rc) {
            plan_free(p);
            return rc;
        }
        g->n_plans++;
    }
    if (p->kind == CU_GEMM_SM90 && cu_sm90_usable(g, &p->cfg, W, X, Y, M, N, K, f32))
        return cu_sm90_gemm(g, &p->cfg, W, X, Y, M, N, K, acc, st, err);
    const float alpha = 1.f, beta = acc ? 1.f : 0.f;
    LT_TRY(cublasLtMatmul(g->lt, p->desc, &alpha, W, p->la, X, p->lb, &beta, Y, p->lc, Y, p->lc, &p->algo, g->ws,
                          g->ws_bytes, st));
    return 0;
}
