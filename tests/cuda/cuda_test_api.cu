/*
 * cuda_test_api.cu — the test entry points of cuda_test_api.h: each uploads host data, runs one
 * kernel group exactly as the backend does (same launchers, same layouts), and downloads the
 * result. Device memory is tracked in a small list and freed on every path.
 */
#include "cuda_test_common.cuh"

#include "cuda/backend_cuda.h"
#include "cuda/k_lora.cuh"
#include "cuda_test_api.h"

#include <stdlib.h>

#define TEST_MAX_BUFS 32

typedef struct tbufs {
    void *p[TEST_MAX_BUFS];
    int n;
} tbufs;

static int talloc(tbufs *b, void **p, size_t bytes, squad_err *err) {
    *p = NULL;
    if (b->n == TEST_MAX_BUFS) return cu_err(err, SQUAD_E_NOMEM, "test: too many buffers");
    CU_TRY(cudaMalloc(p, bytes ? bytes : 16));
    b->p[b->n++] = *p;
    CU_TRY(cudaMemset(*p, 0, bytes ? bytes : 16));
    return 0;
}
/* An output buffer filled with 0xff bytes (NaN in bf16 and fp32): an element the kernel does not
 * write shows up in the comparison. */
static int talloc_poison(tbufs *b, void **p, size_t bytes, squad_err *err) {
    int rc = talloc(b, p, bytes, err);
    if (rc) return rc;
    CU_TRY(cudaMemset(*p, 0xff, bytes ? bytes : 16));
    return 0;
}
static void tfree(tbufs *b) {
    for (int i = 0; i < b->n; i++) cudaFree(b->p[i]);
    b->n = 0;
}

/* fp32 host -> bf16 device (n values) */
static int up_bf16(tbufs *b, bf16 **d, const float *h, size_t n, squad_err *err) {
    int rc = talloc(b, (void **)d, n * 2, err);
    if (rc) return rc;
    uint16_t *t = (uint16_t *)malloc(n * 2 + 2);
    if (!t) return cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
    for (size_t i = 0; i < n; i++) t[i] = squad_f32_to_bf16(h[i]);
    const cudaError_t e = cudaMemcpy(*d, t, n * 2, cudaMemcpyHostToDevice);
    free(t);
    if (e != cudaSuccess) return cu_fail(err, "cudaMemcpy", e, __FILE__, __LINE__);
    return 0;
}
static int up_f32(tbufs *b, float **d, const float *h, size_t n, squad_err *err) {
    int rc = talloc(b, (void **)d, n * 4, err);
    if (rc) return rc;
    CU_TRY(cudaMemcpy(*d, h, n * 4, cudaMemcpyHostToDevice));
    return 0;
}
static int down_bf16(float *h, const bf16 *d, size_t n, squad_err *err) {
    uint16_t *t = (uint16_t *)malloc(n * 2 + 2);
    if (!t) return cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
    const cudaError_t e = cudaMemcpy(t, d, n * 2, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        for (size_t i = 0; i < n; i++) h[i] = squad_bf16_to_f32(t[i]);
    free(t);
    if (e != cudaSuccess) return cu_fail(err, "cudaMemcpy", e, __FILE__, __LINE__);
    return 0;
}
/* A batch of one row (the backend's layout, cu_batch_at) in device memory: the chunk [start,
 * start + len) of a bucket of `rows` tokens, its slot's arena gdn, its own K / V kv_work (position
 * kv_split at index 0) and the blob kv_src below kv_split. */
static int params(tbufs *b, cu_batch *out, int start, int len, int rows, unsigned char *gdn, void *kv_work,
                  const void *kv_src, int kv_split, squad_err *err) {
    const size_t bytes = cu_batch_bytes(1, rows);
    unsigned char *h = (unsigned char *)calloc(1, bytes);
    if (!h) return cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
    cu_chunk_params *p = (cu_chunk_params *)h;
    p[0].start = start;
    p[0].len = len;
    p[0].gdn = gdn;
    p[0].kv_work = kv_work;
    p[0].kv_src = kv_src;
    p[0].kv_split = kv_split;
    p[0].vocab_base = -1;
    p[1].len = rows; /* the whole batch */
    p[1].vocab_base = -1;
    void *d = NULL;
    int rc = talloc(b, &d, bytes, err);
    if (!rc) {
        const cudaError_t e = cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) rc = cu_fail(err, "cudaMemcpy", e, __FILE__, __LINE__);
    }
    free(h);
    if (!rc) *out = cu_batch_at(d, 1, rows);
    return rc;
}

/* fp32 host -> device as bf16 (f32 = 0) or fp32 */
static int up_act(tbufs *b, void **d, const float *h, size_t n, int f32, squad_err *err) {
    return f32 ? up_f32(b, (float **)d, h, n, err) : up_bf16(b, (bf16 **)d, h, n, err);
}
static int down_act(float *h, const void *d, size_t n, int f32, squad_err *err) {
    if (!f32) return down_bf16(h, (const bf16 *)d, n, err);
    CU_TRY(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
    return 0;
}

/* The dims of a GDN test: the args' shape and their launch variant (cu_ref_gdn_args). */
static cu_gdn_dims gdn_test_dims(const cu_ref_gdn_args *a) {
    cu_gdn_dims d;
    memset(&d, 0, sizeof d);
    d.nk = a->nk, d.nv = a->nv, d.dk = a->dk, d.dv = a->dv, d.K = a->K, d.ldP = a->ldP, d.eps = a->eps;
    d.f32 = a->exact != 0;
    d.short_rows = a->short_rows == 0 ? CU_GDN_SHORT_ROWS : a->short_rows < 0 ? 0 : a->short_rows;
    d.prep_split = a->prep_split; /* no SM count here (n_sm 0): 0 is 1 */
    d.conv_groups = a->conv_groups;
    d.fused_rows = a->fused_rows == 0 ? CU_GDN_FUSED_ROWS : a->fused_rows < 0 ? 0 : a->fused_rows;
    return d;
}

extern "C" int squad_cuda_test_gdn_fused(const cu_ref_gdn_args *a) {
    cu_gdn_dims d = gdn_test_dims(a);
    return cu_gdn_supported(&d) && cu_gdn_init(&d, NULL) == 0 && cu_gdn_fused_here(&d, a->rows, 1);
}

static int test_gdn_run(tbufs *b, const cu_ref_gdn_args *a, const cu_gdn_dims *dp, squad_err *err);

static int test_gdn(tbufs *b, const cu_ref_gdn_args *a, squad_err *err) {
    cu_gdn_dims d = gdn_test_dims(a);
    if (!cu_gdn_supported(&d)) return cu_err(err, SQUAD_E_UNSUPPORTED, "test: gdn shape not supported");
    const int rc = cu_gdn_init(&d, err);
    return rc ? rc : test_gdn_run(b, a, &d, err);
}

/* test_gdn's forward with d set up. */
static int test_gdn_run(tbufs *b, const cu_ref_gdn_args *a, const cu_gdn_dims *dp, squad_err *err) {
    const cu_gdn_dims d = *dp;
    const int ex = a->exact != 0;
    int rc = 0;
    const int C = 2 * a->nk * a->dk + a->nv * a->dv, Km1 = a->K - 1;
    /* the device state: S^T [nv][DVP][DKP] (zero padding) on the chunked path, S [nv][dk][dv] exact */
    const int DKP = ex ? a->dv : cu_gdn_pad(a->dk), DVP = ex ? a->dk : cu_gdn_pad(a->dv);
    const size_t nS = (size_t)a->nv * DKP * DVP;
    void *P, *conv0, *Y;
    float *cw, *Al, *dt, *nw, *S0;
    cu_batch prm;
    void *scr;
    if ((rc = up_act(b, &P, a->P, (size_t)a->rows * a->ldP, ex, err))) return rc;
    if ((rc = up_act(b, &conv0, a->conv_state, (size_t)(Km1 > 0 ? Km1 : 1) * C, ex, err))) return rc;
    if ((rc = up_f32(b, &cw, a->conv_w, (size_t)C * a->K, err))) return rc;
    if ((rc = up_f32(b, &Al, a->A_log, a->nv, err))) return rc;
    if ((rc = up_f32(b, &dt, a->dt_bias, a->nv, err))) return rc;
    if ((rc = up_f32(b, &nw, a->norm_w, a->dv, err))) return rc;
    /* (exact: DKP = dv, DVP = dk, so the same index maps S [h][i][j] to [h][i][j]) */
    float *St = (float *)calloc(nS, 4);
    if (!St) return cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
    for (int h = 0; h < a->nv; h++)
        for (int i = 0; i < a->dk; i++)
            for (int j = 0; j < a->dv; j++)
                St[ex ? ((size_t)h * a->dk + i) * a->dv + j : ((size_t)h * DVP + j) * DKP + i] =
                    a->S[((size_t)h * a->dk + i) * a->dv + j];
    rc = up_f32(b, &S0, St, nS, err);
    /* the slot's arena as the backend lays it out: S, then the conv inputs */
    const size_t conv_off = (nS * 4 + 255) & ~(size_t)255, conv_bytes = (size_t)(Km1 > 0 ? Km1 : 1) * C * (ex ? 4 : 2);
    void *arena = NULL;
    float *S = NULL;
    void *conv = NULL;
    if (!rc) rc = talloc(b, &arena, conv_off + conv_bytes, err);
    if (!rc) {
        S = (float *)arena;
        conv = (char *)arena + conv_off;
        cudaError_t e = cudaMemcpy(S, S0, nS * 4, cudaMemcpyDeviceToDevice);
        if (e == cudaSuccess) e = cudaMemcpy(conv, conv0, conv_bytes, cudaMemcpyDeviceToDevice);
        if (e != cudaSuccess) rc = cu_fail(err, "cudaMemcpy", e, __FILE__, __LINE__);
    }
    if (!rc) rc = talloc_poison(b, &Y, (size_t)a->rows * a->nv * a->dv * (ex ? 4 : 2), err);
    if (!rc) rc = params(b, &prm, 0, a->len, a->rows, (unsigned char *)arena, NULL, NULL, 0, err);
    const int blocks = (a->rows + CU_GDN_CHUNK - 1) / CU_GDN_CHUNK;
    if (!rc) rc = talloc(b, &scr, cu_gdn_scratch_bytes(&d, a->rows, blocks), err);
    cu_gdn_scratch s;
    if (!rc) {
        cu_gdn_scratch_bind(&s, scr, &d, a->rows, blocks);
        rc = cu_gdn_forward(&d, P, conv_off, cw, Al, dt, nw, 0, Y, &s, &prm, 0, err);
    }
    if (!rc) {
        const cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) rc = cu_fail(err, "cudaDeviceSynchronize", e, __FILE__, __LINE__);
    }
    if (!rc) rc = down_act(a->Y, Y, (size_t)a->rows * a->nv * a->dv, ex, err);
    if (!rc && Km1 > 0) rc = down_act(a->conv_state, conv, (size_t)Km1 * C, ex, err);
    if (!rc) {
        const cudaError_t e = cudaMemcpy(St, S, nS * 4, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) rc = cu_fail(err, "cudaMemcpy", e, __FILE__, __LINE__);
    }
    if (!rc)
        for (int h = 0; h < a->nv; h++)
            for (int i = 0; i < a->dk; i++)
                for (int j = 0; j < a->dv; j++)
                    a->S[((size_t)h * a->dk + i) * a->dv + j] =
                        St[ex ? ((size_t)h * a->dk + i) * a->dv + j : ((size_t)h * DVP + j) * DKP + i];
    free(St);
    return rc;
}

extern "C" int squad_cuda_test_gdn(const cu_ref_gdn_args *a, squad_err *err) {
    tbufs b = {{0}, 0};
    const int rc = test_gdn(&b, a, err);
    tfree(&b);
    return rc;
}

/* The attention dimensions a test case describes (its K / V in one [pos][nkv][hd] block). */
static cu_attn_dims attn_dims_of(const cu_ref_attn_args *a) {
    cu_attn_dims d;
    memset(&d, 0, sizeof d);
    d.nh = a->nh;
    d.nkv = a->nkv;
    d.hd = a->hd;
    d.rd = a->rd;
    d.ldQKV = a->ld;
    d.eps = a->eps;
    d.max_context = a->max_context;
    d.kv_stride = (size_t)a->nkv * a->hd;
    d.f32 = a->exact != 0;
    return d;
}

static int test_attn(tbufs *b, const cu_ref_attn_args *a, squad_err *err) {
    cu_attn_dims d = attn_dims_of(a);
    const int ex = d.f32;
    const size_t es = ex ? 4 : 2;
    if (!cu_attn_supported(&d)) return cu_err(err, SQUAD_E_UNSUPPORTED, "test: attention shape not supported");
    cuda_knobs knobs;
    int rc = cu_test_knobs(&knobs, err);
    if (!rc) rc = cu_attn_init(&d, knobs.att_sm90, err);
    if (rc) return rc;
    const size_t kvn = (size_t)a->max_context * a->nkv * a->hd;
    void *QKV, *K, *V, *Qb, *out;
    float *qn, *kn, *inv;
    cu_batch prm;
    void *part;
    int dev = 0, nsm = 0;
    CU_TRY(cudaGetDevice(&dev));
    CU_TRY(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    const int span = a->max_context;
    const int splits = cu_attn_splits(&d, 1, a->rows, span, nsm);
    if ((rc = up_act(b, &QKV, a->QKV, (size_t)a->rows * a->ld, ex, err))) return rc;
    /* K and V in one working buffer (K at element 0, V at kvn), found through prm->kv_work as the
     * backend's is */
    void *Kh, *Vh, *KV;
    if ((rc = up_act(b, &Kh, a->K, kvn, ex, err))) return rc;
    if ((rc = up_act(b, &Vh, a->V, kvn, ex, err))) return rc;
    if ((rc = talloc(b, &KV, 2 * kvn * es, err))) return rc;
    CU_TRY(cudaMemcpy(KV, Kh, kvn * es, cudaMemcpyDeviceToDevice));
    CU_TRY(cudaMemcpy((char *)KV + kvn * es, Vh, kvn * es, cudaMemcpyDeviceToDevice));
    K = KV;
    V = (char *)KV + kvn * es;
    if ((rc = up_f32(b, &qn, a->q_norm, a->hd, err))) return rc;
    if ((rc = up_f32(b, &kn, a->k_norm, a->hd, err))) return rc;
    if ((rc = up_f32(b, &inv, a->inv_freq, a->rd / 2 > 0 ? a->rd / 2 : 1, err))) return rc;
    if ((rc = talloc(b, &Qb, (size_t)a->rows * a->nh * a->hd * es, err))) return rc;
    if ((rc = talloc_poison(b, &out, (size_t)a->rows * a->nh * a->hd * es, err))) return rc;
    if ((rc = talloc(b, &part, ex ? 16 : cu_attn_partial_bytes(&d, a->rows, splits), err))) return rc;
    /* the read-in-place blob: K of [0, kv_split) at element 0, V at kvn, like a cache group's blob
     * whose layer offsets are given as bko, bvo; the working buffer's copy becomes NaN */
    ptrdiff_t bko = 0, bvo = 0;
    if (a->kv_split > 0) {
        if (a->kv_split > a->start)
            return cu_err(err, SQUAD_E_INVALID, "test: kv_split %d past the chunk start %d", a->kv_split, a->start);
        void *blob;
        const size_t pre = (size_t)a->kv_split * a->nkv * a->hd * es;
        if ((rc = talloc(b, &blob, 2 * kvn * es, err))) return rc;
        CU_TRY(cudaMemcpy(blob, K, pre, cudaMemcpyDeviceToDevice));
        CU_TRY(cudaMemcpy((char *)blob + kvn * es, V, pre, cudaMemcpyDeviceToDevice));
        CU_TRY(cudaMemset(K, 0xff, pre)); /* all-ones bits: NaN in bf16 and fp32 */
        CU_TRY(cudaMemset(V, 0xff, pre));
        bko = 0;
        bvo = (ptrdiff_t)kvn;
        /* the own K / V starts at kv_split (position kv_split at index 0), as a slot's does */
        const size_t own = (size_t)a->kv_split * a->nkv * a->hd * es;
        if ((rc = params(b, &prm, a->start, a->len, a->rows, NULL, (char *)KV + own, blob, a->kv_split, err)))
            return rc;
    } else if ((rc = params(b, &prm, a->start, a->len, a->rows, NULL, KV, NULL, 0, err))) {
        return rc;
    }
    if ((rc = cu_attn_forward(&d, QKV, qn, kn, inv, 0, (ptrdiff_t)kvn, bko, bvo, Qb, part, splits, out, &prm, 0, err)))
        return rc;
    CU_TRY(cudaDeviceSynchronize());
    if ((rc = down_act(a->out, out, (size_t)a->rows * a->nh * a->hd, ex, err))) return rc;
    const size_t off = (size_t)a->start * a->nkv * a->hd, n = (size_t)a->len * a->nkv * a->hd;
    if ((rc = down_act(a->K + off, (const char *)K + off * es, n, ex, err))) return rc;
    return down_act(a->V + off, (const char *)V + off * es, n, ex, err);
}

extern "C" int squad_cuda_test_attn(const cu_ref_attn_args *a, squad_err *err) {
    tbufs b = {{0}, 0};
    const int rc = test_attn(&b, a, err);
    tfree(&b);
    return rc;
}

extern "C" int squad_cuda_test_attn_sm90(int hd, squad_err *err) {
    cu_attn_dims d;
    memset(&d, 0, sizeof d);
    d.nh = d.nkv = 1;
    d.hd = hd;
    if (!cu_attn_supported(&d)) return cu_err(err, SQUAD_E_UNSUPPORTED, "test: head_dim %d not supported", hd);
    cuda_knobs knobs;
    int rc = cu_test_knobs(&knobs, err);
    if (!rc) rc = cu_attn_init(&d, knobs.att_sm90, err);
    return rc ? -1 : d.sm90 != 0;
}

/* ---- the specialists' widened GEMM input ---- */

/* The device's n_sm (the launchers size their grids with it). */
static int test_n_sm(int *n_sm, squad_err *err) {
    int dev = 0;
    CU_TRY(cudaGetDevice(&dev));
    CU_TRY(cudaDeviceGetAttribute(n_sm, cudaDevAttrMultiProcessorCount, dev));
    return 0;
}

static int test_lora(tbufs *b, const cu_ref_lora_args *a, squad_err *err) {
    if (a->rows < 1 || a->in < 1 || a->R < 1 || a->n_slots < 1 || a->n_slots > CU_REF_LORA_MAX_SLOTS ||
        a->src < 0 || a->src > 3 || (a->src >= 2 && a->ld_src < a->in))
        return cu_err(err, SQUAD_E_INVALID, "test_lora: bad shape");
    const int f32 = a->f32 != 0, lda = cu_lora_lda(a->in), end = a->in + a->n_slots * a->R;
    const int ldw = a->ldw > end ? a->ldw : end;
    /* A in the backend's layout: [n_slots][R][lda], zeros past in */
    const size_t na = (size_t)a->n_slots * a->R * lda;
    float *Ah = (float *)calloc(na, sizeof(float));
    if (!Ah) return cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
    for (size_t row = 0; row < (size_t)a->n_slots * a->R; row++)
        memcpy(Ah + row * lda, a->A + row * a->in, sizeof(float) * (size_t)a->in);
    void *dA = NULL, *dsrc = NULL, *dxw = NULL;
    float *dh = NULL, *dw = NULL;
    int *dslot = NULL;
    int rc = up_act(b, &dA, Ah, na, f32, err);
    free(Ah);
    if (rc) return rc;
    if (a->src == 0) {
        if ((rc = up_f32(b, &dh, a->h, (size_t)a->rows * a->in, err))) return rc;
        if ((rc = up_f32(b, &dw, a->w, (size_t)a->in, err))) return rc;
    } else {
        const size_t n = (size_t)a->rows * (a->src == 1 ? 2 * (size_t)a->in : (size_t)a->ld_src);
        if ((rc = up_act(b, &dsrc, a->x_src, n, f32, err))) return rc;
    }
    if ((rc = talloc(b, (void **)&dslot, sizeof(int) * (size_t)a->rows, err))) return rc;
    CU_TRY(cudaMemcpy(dslot, a->token_slot, sizeof(int) * (size_t)a->rows, cudaMemcpyHostToDevice));
    if ((rc = talloc_poison(b, &dxw, (size_t)a->rows * ldw * (f32 ? 4 : 2), err))) return rc;
    if (a->src == CU_LORA_IN_PLACE) /* x where a mixer writes it: xw's first columns */
        CU_TRY(cudaMemcpy2D(dxw, (size_t)ldw * (f32 ? 4 : 2), dsrc, (size_t)a->ld_src * (f32 ? 4 : 2),
                            (size_t)a->in * (f32 ? 4 : 2), (size_t)a->rows, cudaMemcpyDeviceToDevice));
    cu_lora_input_args k;
    memset(&k, 0, sizeof k);
    k.src = a->src;
    k.h = dh;
    k.w = dw;
    k.eps = a->eps;
    k.x_src = a->src == CU_LORA_IN_PLACE ? NULL : dsrc;
    k.ld_src = a->src == 1 ? 2 * a->in : a->src == CU_LORA_IN_PLACE ? 0 : a->ld_src;
    k.in = a->in;
    k.A = dA;
    k.lda = lda;
    k.R = a->R;
    k.n_slots = a->n_slots;
    k.xw = dxw;
    k.ldw = ldw;
    k.f32 = f32;
    /* no cluster bound (fit zeros): the slices as the shapes alone give them; the backend's
     * forwards run with it */
    int n_sm = 0;
    if ((rc = test_n_sm(&n_sm, err))) return rc;
    if (a->fold_y) { /* the out term folded in: y, out's A (the backend's layout) and B (the weight's) */
        const int flda = cu_lora_lda(a->fold_in);
        const size_t nfa = (size_t)a->n_slots * a->fold_R * flda;
        float *fa = (float *)calloc(nfa, sizeof(float));
        if (!fa) return cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
        for (size_t row = 0; row < (size_t)a->n_slots * a->fold_R; row++)
            memcpy(fa + row * flda, a->fold_A + row * a->fold_in, sizeof(float) * (size_t)a->fold_in);
        void *dy = NULL, *dfa = NULL, *dfb = NULL;
        rc = up_act(b, &dfa, fa, nfa, 0, err);
        free(fa);
        if (!rc) rc = up_act(b, &dy, a->fold_y, (size_t)a->rows * a->fold_in, 0, err);
        if (!rc) rc = up_act(b, &dfb, a->fold_B, (size_t)a->in * a->n_slots * a->fold_R, 0, err);
        if (rc) return rc;
        k.fold_y = dy;
        k.fold_ldy = a->fold_in;
        k.fold_in = a->fold_in;
        k.fold_A = dfa;
        k.fold_lda = flda;
        k.fold_R = a->fold_R;
        k.fold_B = dfb;
        k.fold_ldb = a->n_slots * a->fold_R;
    }
    if ((rc = cu_lora_input(&k, dslot, a->rows, n_sm, 0, err))) return rc;
    CU_TRY(cudaDeviceSynchronize());
    if (a->fold_y && a->h_out)
        CU_TRY(cudaMemcpy(a->h_out, dh, sizeof(float) * (size_t)a->rows * a->in, cudaMemcpyDeviceToHost));
    return down_act(a->xw, dxw, (size_t)a->rows * ldw, f32, err);
}

extern "C" int squad_cuda_test_lora(const cu_ref_lora_args *a, squad_err *err) {
    tbufs b = {{0}, 0};
    const int rc = test_lora(&b, a, err);
    tfree(&b);
    return rc;
}

static int test_rmsnorm(tbufs *b, const float *h, float *out, const float *w, int rows, int H, float eps,
                        squad_err *err) {
    float *dh, *dw;
    bf16 *dx;
    int rc;
    if ((rc = up_f32(b, &dh, h, (size_t)rows * H, err))) return rc;
    if ((rc = up_f32(b, &dw, w, H, err))) return rc;
    if ((rc = talloc_poison(b, (void **)&dx, (size_t)rows * H * 2, err))) return rc;
    if ((rc = cu_rmsnorm(dh, dx, dw, rows, H, eps, 0, 0, err))) return rc;
    CU_TRY(cudaDeviceSynchronize());
    return down_bf16(out, dx, (size_t)rows * H, err);
}

extern "C" int squad_cuda_test_rmsnorm(const float *h, float *out, const float *w, int rows, int H, float eps,
                                       squad_err *err) {
    tbufs b = {{0}, 0};
    const int rc = test_rmsnorm(&b, h, out, w, rows, H, eps, err);
    tfree(&b);
    return rc;
}

static int test_silu_mul(tbufs *b, const float *gu, float *out, int rows, int I, squad_err *err) {
    bf16 *dg, *dout;
    int rc;
    if ((rc = up_bf16(b, &dg, gu, (size_t)rows * 2 * I, err))) return rc;
    if ((rc = talloc_poison(b, (void **)&dout, (size_t)rows * I * 2, err))) return rc;
    if ((rc = cu_silu_mul(dg, dout, rows, I, 0, 0, err))) return rc;
    CU_TRY(cudaDeviceSynchronize());
    return down_bf16(out, dout, (size_t)rows * I, err);
}

extern "C" int squad_cuda_test_silu_mul(const float *gu, float *out, int rows, int I, squad_err *err) {
    tbufs b = {{0}, 0};
    const int rc = test_silu_mul(&b, gu, out, rows, I, err);
    tfree(&b);
    return rc;
}

static int test_gemm(tbufs *b, cu_gemm_ctx *g, const float *X, const float *W, float *Y, int M, int N, int K, int acc,
                     squad_err *err) {
    bf16 *dX, *dW;
    void *dY;
    int rc;
    if ((rc = up_bf16(b, &dX, X, (size_t)M * K, err))) return rc;
    if ((rc = up_bf16(b, &dW, W, (size_t)N * K, err))) return rc;
    if (acc) {
        float *f;
        if ((rc = up_f32(b, &f, Y, (size_t)M * N, err))) return rc;
        dY = f;
    } else if ((rc = talloc_poison(b, &dY, (size_t)M * N * 2, err))) {
        return rc;
    }
    if ((rc = cu_gemm(g, dW, dX, dY, M, N, K, acc, 0, 0, err))) return rc;
    CU_TRY(cudaDeviceSynchronize());
    if (acc) {
        CU_TRY(cudaMemcpy(Y, dY, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
        return 0;
    }
    return down_bf16(Y, (const bf16 *)dY, (size_t)M * N, err);
}

extern "C" int squad_cuda_test_gemm(const float *X, const float *W, float *Y, int M, int N, int K, int accumulate,
                                    squad_err *err) {
    tbufs b = {{0}, 0};
    cu_gemm_ctx g;
    cuda_knobs knobs;
    int rc = cu_test_knobs(&knobs, err); /* a test's plans stay out of the user's plan file */
    if (!rc) rc = cu_gemm_init(&g, &knobs, err);
    if (!rc) rc = test_gemm(&b, &g, X, W, Y, M, N, K, accumulate, err);
    cu_gemm_free(&g);
    tfree(&b);
    return rc;
}

/* uniform values in [-scale, scale) from a hash of the index: no zeros to time on */
static __global__ void test_fill_bf16(bf16 *p, size_t n, uint32_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = __float2bfloat16(scale * ((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f));
    }
}

int cu_test_fill_gemm_operands(bf16 *W, size_t w_elems, bf16 *X, size_t x_elems, cudaStream_t st, squad_err *err) {
    test_fill_bf16<<<1024, 256, 0, st>>>(W, w_elems, 0x1234u, 0.05f);
    CU_LAUNCH_CHECK("test_fill_bf16");
    test_fill_bf16<<<256, 256, 0, st>>>(X, x_elems, 0x9876u, 1.0f);
    CU_LAUNCH_CHECK("test_fill_bf16");
    return 0;
}

#define BENCH_ROTATE_BYTES (256u << 20) /* W copies cycled through: several times the 50 MB L2 */
#define BENCH_REPS 100                  /* calls per timed graph */

/* Instantiates a captured graph, replays it once to warm up and once timed: *ms of the second. */
static cudaError_t time_graph(cudaGraph_t graph, cudaStream_t st, float *ms) {
    cudaGraphExec_t exec = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    if (e == cudaSuccess) e = cudaEventCreate(&e0);
    if (e == cudaSuccess) e = cudaEventCreate(&e1);
    if (e == cudaSuccess) e = cudaGraphLaunch(exec, st);
    if (e == cudaSuccess) e = cudaEventRecord(e0, st);
    if (e == cudaSuccess) e = cudaGraphLaunch(exec, st);
    if (e == cudaSuccess) e = cudaEventRecord(e1, st);
    if (e == cudaSuccess) e = cudaEventSynchronize(e1);
    if (e == cudaSuccess) e = cudaEventElapsedTime(ms, e0, e1);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (exec) cudaGraphExecDestroy(exec);
    return e;
}

/* Times one graph of BENCH_REPS calls (W rotating) after one warm-up replay; *us per call. */
static int bench_graph(cudaStream_t st, cu_gemm_ctx *g, const bf16 *Wbase, size_t w_stride,
                       int n_rot, const bf16 *X, void *Y, int M, int N, int K, int acc, double *us, squad_err *err) {
    cudaGraph_t graph = NULL;
    int rc = 0;
    CU_TRY(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int r = 0; r < BENCH_REPS && !rc; r++) {
        const bf16 *W = Wbase + (size_t)(r % n_rot) * w_stride;
        rc = cu_gemm(g, W, X, Y, M, N, K, acc, 0, st, err);
    }
    const cudaError_t ce = cudaStreamEndCapture(st, &graph);
    if (rc) {
        if (graph) cudaGraphDestroy(graph);
        return rc;
    }
    if (ce != cudaSuccess) return cu_fail(err, "cudaStreamEndCapture", ce, __FILE__, __LINE__);
    float ms = 0.f;
    const cudaError_t e = time_graph(graph, st, &ms);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) return cu_fail(err, "benchmark graph", e, __FILE__, __LINE__);
    *us = 1e3 * ms / BENCH_REPS;
    return 0;
}

static int bench_gemm(tbufs *b, cu_gemm_ctx *g, cudaStream_t st, int M, int N, int K, int acc, double *us_lt,
                      double *us_first, squad_err *err) {
    *us_lt = *us_first = -1.0;
    const size_t w_stride = ((size_t)N * K + 127) / 128 * 128; /* elements between W copies */
    int n_rot = (int)(BENCH_ROTATE_BYTES / (w_stride * 2));
    if (n_rot < 2) n_rot = 2;
    void *dW, *dX, *dY;
    int rc;
    if ((rc = talloc(b, &dW, w_stride * 2 * n_rot, err))) return rc;
    if ((rc = talloc(b, &dX, (size_t)M * K * 2, err))) return rc;
    if ((rc = talloc(b, &dY, (size_t)M * N * (acc ? 4 : 2), err))) return rc;
    CU_TRY(cudaDeviceSynchronize()); /* talloc's memsets run on the legacy stream, st does not wait for it */
    if ((rc = cu_test_fill_gemm_operands((bf16 *)dW, w_stride * n_rot, (bf16 *)dX, (size_t)M * K, st, err)))
        return rc;
    /* cuBLASLt: plan and tune outside the capture, as the backend does */
    g->tune = 1;
    rc = cu_gemm(g, dW, dX, dY, M, N, K, acc, 0, st, err);
    g->tune = 0;
    if (rc) return rc;
    CU_TRY(cudaStreamSynchronize(st));
    if ((rc = bench_graph(st, g, (const bf16 *)dW, w_stride, n_rot, (const bf16 *)dX, dY, M, N, K, acc, us_lt,
                          err)))
        return rc;
    /* cuBLASLt's heuristic first, untuned, from a fresh plan set */
    cu_gemm_ctx g1;
    cuda_knobs knobs;
    if ((rc = cu_test_knobs(&knobs, err)) || (rc = cu_gemm_init(&g1, &knobs, err))) return rc;
    rc = cu_gemm(&g1, dW, dX, dY, M, N, K, acc, 0, st, err);
    if (!rc) rc = bench_graph(st, &g1, (const bf16 *)dW, w_stride, n_rot, (const bf16 *)dX, dY, M, N, K, acc,
                              us_first, err);
    cudaStreamSynchronize(st);
    cu_gemm_free(&g1);
    return rc;
}

/* The fixed cost of a kernel in a graph: n_kernels launches of a kernel that only writes one value
 * per block, back to back in one captured graph (each depends on the previous, as a chunk's do). */
__global__ void bench_touch_kernel(float *out) {
    if (threadIdx.x == 0) out[blockIdx.x] = (float)blockIdx.x;
}

extern "C" int squad_cuda_bench_launch(int n_kernels, int blocks, int threads, double *us_per_kernel,
                                       squad_err *err) {
    *us_per_kernel = -1.0;
    if (n_kernels < 1 || blocks < 1 || threads < 1 || threads > 1024)
        return cu_err(err, SQUAD_E_INVALID, "bench_launch: bad shape");
    float *d = NULL;
    cudaStream_t st = NULL;
    cudaGraph_t graph = NULL;
    float ms = 0.f;
    cudaError_t e = cudaMalloc(&d, sizeof(float) * (size_t)blocks);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        for (int i = 0; i < n_kernels; i++) bench_touch_kernel<<<blocks, threads, 0, st>>>(d);
        e = cudaStreamEndCapture(st, &graph);
    }
    if (e == cudaSuccess) e = time_graph(graph, st, &ms);
    if (graph) cudaGraphDestroy(graph);
    if (st) cudaStreamDestroy(st);
    if (d) cudaFree(d);
    if (e != cudaSuccess) return cu_fail(err, "launch benchmark", e, __FILE__, __LINE__);
    *us_per_kernel = 1e3 * ms / n_kernels;
    return 0;
}

extern "C" int squad_cuda_bench_gemm(int M, int N, int K, int accumulate, double *us_cublaslt, double *us_first,
                                     squad_err *err) {
    tbufs b = {{0}, 0};
    cu_gemm_ctx g;
    cudaStream_t st = NULL;
    cuda_knobs knobs;
    int rc = cu_test_knobs(&knobs, err); /* time the tuning itself, not a stored choice */
    if (!rc) rc = cu_gemm_init(&g, &knobs, err);
    if (!rc) {
        const cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
        if (e != cudaSuccess) rc = cu_fail(err, "cudaStreamCreateWithFlags", e, __FILE__, __LINE__);
    }
    if (!rc) rc = bench_gemm(&b, &g, st, M, N, K, accumulate, us_cublaslt, us_first, err);
    if (st) {
        cudaStreamSynchronize(st);
        cudaStreamDestroy(st);
    }
    cu_gemm_free(&g);
    tfree(&b);
    return rc;
}

/* Every scratch region of the backend filled with 0xff bytes; a region's columns past what the
 * kernels write stay zero (cu_scratch_region). */
extern "C" int squad_cuda_test_poison(squad_backend *be, squad_err *err) {
    cu_scratch_region r[CU_SCRATCH_REGIONS];
    const int n = cu_backend_scratch(be, r, CU_SCRATCH_REGIONS);
    if (n < 0) return cu_err(err, SQUAD_E_INVALID, "poison: not a CUDA backend");
    if (n > CU_SCRATCH_REGIONS) return cu_err(err, SQUAD_E_BACKEND, "poison: %d scratch regions", n);
    CU_TRY(cudaDeviceSynchronize()); /* nothing of the backend's still running on them */
    for (int i = 0; i < n; i++) CU_TRY(cudaMemset2D(r[i].p, r[i].pitch, 0xff, r[i].width, r[i].rows));
    CU_TRY(cudaDeviceSynchronize());
    return 0;
}

extern "C" size_t squad_cuda_test_state_bytes(const squad_backend *be) {
    squad_cuda_info info;
    return squad_cuda_backend_info(be, &info) ? 0 : info.gdn_state_bytes;
}

extern "C" int squad_cuda_test_download(void *host, const void *dev, size_t bytes, squad_err *err) {
    CU_TRY(cudaDeviceSynchronize());
    CU_TRY(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
    return 0;
}

/* ---- the mixers over a batch of rows (one launch each) ------------------------------------------ */

/* A batch buffer of nrows rows of `bucket` tokens in device memory: rows i < n from prm_rows (the
 * rest padding: len 0), the whole-batch row, zero ids and answers. */
static int batch_params(tbufs *b, cu_batch *out, const cu_chunk_params *prm_rows, int n, int nrows, int bucket,
                        squad_err *err) {
    const size_t bytes = cu_batch_bytes(nrows, bucket);
    unsigned char *h = (unsigned char *)calloc(1, bytes);
    if (!h) return cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
    cu_chunk_params *p = (cu_chunk_params *)h;
    for (int r = 0; r < nrows; r++) {
        if (r < n) p[r] = prm_rows[r];
        p[r].vocab_base = -1;
    }
    p[nrows].len = nrows * bucket;
    p[nrows].vocab_base = -1;
    void *d = NULL;
    int rc = talloc(b, &d, bytes, err);
    if (!rc) {
        const cudaError_t e = cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) rc = cu_fail(err, "cudaMemcpy", e, __FILE__, __LINE__);
    }
    free(h);
    if (!rc) *out = cu_batch_at(d, nrows, bucket);
    return rc;
}

/* Host n values (fp32) into device memory at dst as bf16 or fp32. */
static int put_act(void *dst, const float *h, size_t n, int f32, squad_err *err) {
    if (f32) {
        CU_TRY(cudaMemcpy(dst, h, n * 4, cudaMemcpyHostToDevice));
        return 0;
    }
    uint16_t *t = (uint16_t *)malloc(n * 2 + 2);
    if (!t) return cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
    for (size_t i = 0; i < n; i++) t[i] = squad_f32_to_bf16(h[i]);
    const cudaError_t e = cudaMemcpy(dst, t, n * 2, cudaMemcpyHostToDevice);
    free(t);
    return e == cudaSuccess ? 0 : cu_fail(err, "cudaMemcpy", e, __FILE__, __LINE__);
}

/* Whether n device values (bf16 or fp32) are all zero. */
static int all_zero(const void *d, size_t n, int f32, int *zero, squad_err *err) {
    float *h = (float *)malloc(n * 4 + 4);
    if (!h) return cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
    const int rc = down_act(h, d, n, f32, err);
    *zero = 1;
    for (size_t i = 0; !rc && i < n; i++)
        if (h[i] != 0.f) *zero = 0;
    free(h);
    return rc;
}

static int test_gdn_batch(tbufs *b, const cu_ref_gdn_args *rows, int n, int nrows, int *padding_zero, squad_err *err) {
    const cu_ref_gdn_args *a = &rows[0];
    const int ex = a->exact != 0, bucket = a->rows;
    cu_gdn_dims d = gdn_test_dims(a);
    if (!cu_gdn_supported(&d)) return cu_err(err, SQUAD_E_UNSUPPORTED, "test: gdn shape not supported");
    if (n < 1 || nrows < n) return cu_err(err, SQUAD_E_INVALID, "test: %d rows in a batch of %d", n, nrows);
    int rc = cu_gdn_init(&d, err);
    if (rc) return rc;
    const int C = 2 * a->nk * a->dk + a->nv * a->dv, Km1 = a->K - 1;
    const int DKP = ex ? a->dv : cu_gdn_pad(a->dk), DVP = ex ? a->dk : cu_gdn_pad(a->dv);
    const size_t nS = (size_t)a->nv * DKP * DVP, es = ex ? 4 : 2, tokens = (size_t)nrows * bucket;
    const size_t conv_off = (nS * 4 + 255) & ~(size_t)255, conv_n = (size_t)(Km1 > 0 ? Km1 : 1) * C;
    const size_t arena = conv_off + conv_n * es;
    void *P, *Y, *ar, *scr;
    float *cw, *Al, *dt, *nw;
    if ((rc = talloc_poison(b, &P, tokens * a->ldP * es, err))) return rc; /* padding rows never read */
    if ((rc = talloc_poison(b, &Y, tokens * a->nv * a->dv * es, err))) return rc;
    if ((rc = talloc(b, &ar, arena * (size_t)n, err))) return rc;
    /* odd rows start from a restored blob (cu_chunk_params.gdn_in) over a NaN arena: the kernels
     * must read the blob and write every byte of the state into the arena */
    void *blobs;
    if ((rc = talloc(b, &blobs, arena * (size_t)n, err))) return rc;
    CU_TRY(cudaMemset(ar, 0xff, arena * (size_t)n));
    if ((rc = up_f32(b, &cw, a->conv_w, (size_t)C * a->K, err))) return rc;
    if ((rc = up_f32(b, &Al, a->A_log, a->nv, err))) return rc;
    if ((rc = up_f32(b, &dt, a->dt_bias, a->nv, err))) return rc;
    if ((rc = up_f32(b, &nw, a->norm_w, a->dv, err))) return rc;
    float *St = (float *)calloc(nS, 4);
    cu_chunk_params *prm = (cu_chunk_params *)calloc((size_t)n, sizeof *prm);
    if (!St || !prm) rc = cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
    for (int r = 0; r < n && !rc; r++) { /* row r: its P, its arena (S transposed as the kernels keep it) */
        const cu_ref_gdn_args *q = &rows[r];
        unsigned char *own = (unsigned char *)ar + (size_t)r * arena;
        unsigned char *arr = r % 2 ? (unsigned char *)blobs + (size_t)r * arena : own; /* the state's start */
        rc = put_act((char *)P + (size_t)r * bucket * a->ldP * es, q->P, (size_t)bucket * a->ldP, ex, err);
        if (!rc) rc = put_act(arr + conv_off, q->conv_state, conv_n, ex, err);
        for (int h = 0; h < a->nv; h++)
            for (int i = 0; i < a->dk; i++)
                for (int j = 0; j < a->dv; j++)
                    St[ex ? ((size_t)h * a->dk + i) * a->dv + j : ((size_t)h * DVP + j) * DKP + i] =
                        q->S[((size_t)h * a->dk + i) * a->dv + j];
        if (!rc) {
            const cudaError_t e = cudaMemcpy(arr, St, nS * 4, cudaMemcpyHostToDevice);
            if (e != cudaSuccess) rc = cu_fail(err, "cudaMemcpy", e, __FILE__, __LINE__);
        }
        prm[r].len = q->len;
        prm[r].gdn = own;
        prm[r].gdn_in = arr != own ? arr : NULL;
    }
    cu_batch bt;
    const int blocks = nrows * ((bucket + CU_GDN_CHUNK - 1) / CU_GDN_CHUNK);
    if (!rc) rc = batch_params(b, &bt, prm, n, nrows, bucket, err);
    if (!rc) rc = talloc_poison(b, &scr, cu_gdn_scratch_bytes(&d, (int)tokens, blocks), err);
    /* the scan's row groups (cu_gdn_dims.scan_rg) change only which warps share a block: every
     * count must give the same bytes (outputs and every arena), from the same starting arenas; the
     * default (one row group) runs last and its results are the ones returned */
    static const int SCAN_RGS[] = {2, 4, 1};
    const int n_rg = ex ? 1 : (int)(sizeof SCAN_RGS / sizeof SCAN_RGS[0]);
    const size_t ybytes = tokens * a->nv * a->dv * es, abytes = arena * (size_t)n;
    void *ar0 = NULL;
    unsigned char *hbuf = NULL; /* [2][ybytes + abytes]: the first count's bytes, then this one's */
    if (!rc && n_rg > 1) {
        rc = talloc(b, &ar0, abytes, err);
        if (!rc && !(hbuf = (unsigned char *)malloc(2 * (ybytes + abytes))))
            rc = cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
        if (!rc) CU_TRY(cudaMemcpy(ar0, ar, abytes, cudaMemcpyDeviceToDevice));
    }
    cu_gdn_scratch s;
    if (!rc) cu_gdn_scratch_bind(&s, scr, &d, (int)tokens, blocks);
    for (int k = ex ? n_rg - 1 : 0; k < n_rg && !rc; k++) {
        d.scan_rg = ex ? 0 : SCAN_RGS[k];
        if (n_rg > 1) CU_TRY(cudaMemcpy(ar, ar0, abytes, cudaMemcpyDeviceToDevice));
        rc = cu_gdn_forward(&d, P, conv_off, cw, Al, dt, nw, 0, Y, &s, &bt, 0, err);
        if (!rc) {
            const cudaError_t e = cudaDeviceSynchronize();
            if (e != cudaSuccess) rc = cu_fail(err, "cudaDeviceSynchronize", e, __FILE__, __LINE__);
        }
        if (rc || n_rg == 1) break;
        unsigned char *hy = hbuf + (k ? ybytes + abytes : 0), *ha = hy + ybytes;
        CU_TRY(cudaMemcpy(hy, Y, ybytes, cudaMemcpyDeviceToHost));
        CU_TRY(cudaMemcpy(ha, ar, abytes, cudaMemcpyDeviceToHost));
        if (k > 0 && memcmp(hbuf, hy, ybytes + abytes) != 0)
            rc = cu_err(err, SQUAD_E_BACKEND,
                        "test: the GDN mixer with %d scan row groups a block differs from %d", SCAN_RGS[k],
                        SCAN_RGS[0]);
    }
    free(hbuf);
    for (int r = 0; r < n && !rc; r++) {
        const cu_ref_gdn_args *q = &rows[r];
        const unsigned char *arr = (const unsigned char *)ar + (size_t)r * arena;
        rc = down_act(q->Y, (const char *)Y + (size_t)r * bucket * a->nv * a->dv * es, (size_t)bucket * a->nv * a->dv,
                      ex, err);
        if (!rc && Km1 > 0) rc = down_act(q->conv_state, arr + conv_off, conv_n, ex, err);
        if (!rc) {
            const cudaError_t e = cudaMemcpy(St, arr, nS * 4, cudaMemcpyDeviceToHost);
            if (e != cudaSuccess) rc = cu_fail(err, "cudaMemcpy", e, __FILE__, __LINE__);
        }
        for (int h = 0; !rc && h < a->nv; h++)
            for (int i = 0; i < a->dk; i++)
                for (int j = 0; j < a->dv; j++)
                    q->S[((size_t)h * a->dk + i) * a->dv + j] =
                        St[ex ? ((size_t)h * a->dk + i) * a->dv + j : ((size_t)h * DVP + j) * DKP + i];
    }
    *padding_zero = 1;
    if (!rc && nrows > n)
        rc = all_zero((const char *)Y + (size_t)n * bucket * a->nv * a->dv * es, (size_t)(nrows - n) * bucket * a->nv * a->dv,
                      ex, padding_zero, err);
    free(St);
    free(prm);
    return rc;
}

extern "C" int squad_cuda_test_gdn_batch(const cu_ref_gdn_args *rows, int n, int nrows, int *padding_zero,
                                         squad_err *err) {
    tbufs b = {{0}, 0};
    const int rc = test_gdn_batch(&b, rows, n, nrows, padding_zero, err);
    tfree(&b);
    return rc;
}

static int test_attn_batch(tbufs *b, const cu_ref_attn_args *rows, int n, int nrows, int *padding_zero,
                           squad_err *err) {
    const cu_ref_attn_args *a = &rows[0];
    cu_attn_dims d = attn_dims_of(a);
    const int ex = d.f32, bucket = a->rows;
    const size_t es = ex ? 4 : 2, tokens = (size_t)nrows * bucket;
    if (!cu_attn_supported(&d)) return cu_err(err, SQUAD_E_UNSUPPORTED, "test: attention shape not supported");
    if (n < 1 || nrows < n) return cu_err(err, SQUAD_E_INVALID, "test: %d rows in a batch of %d", n, nrows);
    cuda_knobs knobs;
    int rc = cu_test_knobs(&knobs, err);
    if (!rc) rc = cu_attn_init(&d, knobs.att_sm90, err);
    if (rc) return rc;
    const size_t kvn = (size_t)a->max_context * a->nkv * a->hd;
    int dev = 0, nsm = 0;
    CU_TRY(cudaGetDevice(&dev));
    CU_TRY(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    const int splits = cu_attn_splits(&d, nrows, bucket, a->max_context, nsm);
    void *QKV, *Qb, *out, *part, *kv;
    float *qn, *kn, *inv;
    if ((rc = talloc_poison(b, &QKV, tokens * a->ld * es, err))) return rc;
    if ((rc = talloc(b, &Qb, tokens * a->nh * a->hd * es, err))) return rc;
    if ((rc = talloc_poison(b, &out, tokens * a->nh * a->hd * es, err))) return rc;
    if ((rc = talloc_poison(b, &part, ex ? 16 : cu_attn_partial_bytes(&d, (int)tokens, splits), err))) return rc;
    /* per row: a blob [K | V] of max_context positions (its read-in-place prefix, NaN past kv_split)
     * and an own buffer [K | V] holding positions from kv_split on (NaN before the chunk writes) */
    if ((rc = talloc(b, &kv, 4 * kvn * es * (size_t)n, err))) return rc;
    if ((rc = up_f32(b, &qn, a->q_norm, a->hd, err))) return rc;
    if ((rc = up_f32(b, &kn, a->k_norm, a->hd, err))) return rc;
    if ((rc = up_f32(b, &inv, a->inv_freq, a->rd / 2 > 0 ? a->rd / 2 : 1, err))) return rc;
    CU_TRY(cudaMemset(kv, 0xff, 4 * kvn * es * (size_t)n));
    cu_chunk_params *prm = (cu_chunk_params *)calloc((size_t)n, sizeof *prm);
    if (!prm) return cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
    const size_t pos = (size_t)a->nkv * a->hd; /* elements a position */
    for (int r = 0; r < n && !rc; r++) {
        const cu_ref_attn_args *q = &rows[r];
        char *blob = (char *)kv + (size_t)r * 4 * kvn * es, *own = blob + 2 * kvn * es;
        const int split = q->kv_split;
        if (split > q->start) rc = cu_err(err, SQUAD_E_INVALID, "test: kv_split %d past the start %d", split, q->start);
        /* keys below the split from the blob, [split, start) already in the own buffer */
        if (!rc && split > 0) rc = put_act(blob, q->K, (size_t)split * pos, ex, err);
        if (!rc && split > 0) rc = put_act(blob + kvn * es, q->V, (size_t)split * pos, ex, err);
        if (!rc && q->start > split)
            rc = put_act(own, q->K + (size_t)split * pos, (size_t)(q->start - split) * pos, ex, err);
        if (!rc && q->start > split)
            rc = put_act(own + kvn * es, q->V + (size_t)split * pos, (size_t)(q->start - split) * pos, ex, err);
        if (!rc) rc = put_act((char *)QKV + (size_t)r * bucket * a->ld * es, q->QKV, (size_t)bucket * a->ld, ex, err);
        prm[r].start = q->start;
        prm[r].len = q->len;
        prm[r].kv_split = split;
        prm[r].kv_src = split > 0 ? blob : NULL;
        prm[r].kv_work = own;
    }
    cu_batch bt;
    if (!rc) rc = batch_params(b, &bt, prm, n, nrows, bucket, err);
    if (!rc)
        rc = cu_attn_forward(&d, QKV, qn, kn, inv, 0, (ptrdiff_t)kvn, 0, (ptrdiff_t)kvn, Qb, part, splits, out, &bt, 0,
                             err);
    if (!rc) {
        const cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) rc = cu_fail(err, "cudaDeviceSynchronize", e, __FILE__, __LINE__);
    }
    for (int r = 0; r < n && !rc; r++) {
        const cu_ref_attn_args *q = &rows[r];
        const char *own = (const char *)kv + (size_t)r * 4 * kvn * es + 2 * kvn * es;
        const size_t o0 = (size_t)(q->start - q->kv_split) * pos;
        rc = down_act(q->out, (const char *)out + (size_t)r * bucket * a->nh * a->hd * es, (size_t)bucket * a->nh * a->hd,
                      ex, err);
        if (!rc) rc = down_act(q->K + (size_t)q->start * pos, own + o0 * es, (size_t)q->len * pos, ex, err);
        if (!rc) rc = down_act(q->V + (size_t)q->start * pos, own + (kvn + o0) * es, (size_t)q->len * pos, ex, err);
    }
    *padding_zero = 1;
    if (!rc && nrows > n)
        rc = all_zero((const char *)out + (size_t)n * bucket * a->nh * a->hd * es, (size_t)(nrows - n) * bucket * a->nh * a->hd,
                      ex, padding_zero, err);
    free(prm);
    return rc;
}

extern "C" int squad_cuda_test_attn_batch(const cu_ref_attn_args *rows, int n, int nrows, int *padding_zero,
                                          squad_err *err) {
    tbufs b = {{0}, 0};
    const int rc = test_attn_batch(&b, rows, n, nrows, padding_zero, err);
    tfree(&b);
    return rc;
}

/* ---- the specialists' low-rank launches, timed ---- */

/* The 0.8B preset's Gated DeltaNet layer (docs/design.md section 4): hidden 1024, out_proj's input
 * 2048, intermediate 3584. */
#define LB_H 1024
#define LB_VD 2048
#define LB_I 3584
#define LB_SITES 4
#define LB_REPS 20

#define LB_SLOTS 2

/* A value in [-0.5, 0.5) from a 32-bit LCG. */
static float bench_uniform(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) * 0x1p-24f - 0.5f;
}

static int bench_lora(tbufs *b, int rows, int rank, int n_layers, int mode, double *us, squad_err *err) {
    /* the four sites of a GDN layer: producer, x's width, the adapted parts (every projection) */
    const int trunk = mode == SQUAD_BENCH_TRUNK;
    const int fold = mode == SQUAD_BENCH_LORA_FOLD; /* out's term in gate | up's launch: three launches */
    const int SRC[LB_SITES] = {CU_LORA_NORM, CU_LORA_IN_PLACE, CU_LORA_NORM, CU_LORA_SILU};
    static const int IN[LB_SITES] = {LB_H, LB_VD, LB_H, LB_I}, PARTS[LB_SITES] = {4, 1, 2, 1};
    const int rp = (rank + 15) / 16 * 16;
    size_t a_elems = 0;
    int max_ldw = 0;
    for (int j = 0; j < LB_SITES; j++) {
        const int R = PARTS[j] * rp, ldw = IN[j] + LB_SLOTS * R;
        a_elems += (size_t)LB_SLOTS * R * cu_lora_lda(IN[j]);
        if (ldw > max_ldw) max_ldw = ldw;
    }
    const size_t n_h = (size_t)rows * LB_H, n_gu = (size_t)rows * 2 * LB_I, n_mix = (size_t)rows * LB_VD;
    float *host = (float *)malloc(sizeof(float) * (a_elems > n_gu ? a_elems : n_gu));
    int *slots = (int *)malloc(sizeof(int) * (size_t)rows);
    int rc = host && slots ? 0 : cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
    uint32_t seed = 12345u;
    for (int t = 0; !rc && t < rows; t++) slots[t] = trunk ? 0 : 1;
    void *dA = NULL, *dgu = NULL, *dmix = NULL, *dxw = NULL, *dx = NULL, *dmlp = NULL, *dfb = NULL;
    const size_t n_fb = (size_t)LB_H * LB_SLOTS * rp; /* out's B' columns, [H][slots R] */
    float *dh = NULL, *dw = NULL;
    int *dslot = NULL;
    for (size_t i = 0; !rc && i < a_elems; i++) host[i] = bench_uniform(&seed) * 0.05f;
    if (!rc) rc = up_act(b, &dA, host, a_elems, 0, err);
    for (size_t i = 0; !rc && i < n_gu; i++) host[i] = bench_uniform(&seed);
    if (!rc) rc = up_act(b, &dgu, host, n_gu, 0, err);
    if (!rc) rc = up_act(b, &dmix, host, n_mix, 0, err);
    if (!rc) rc = up_f32(b, &dh, host, n_h, err);
    if (!rc) rc = up_f32(b, &dw, host, LB_H, err);
    for (size_t i = 0; !rc && i < n_fb; i++) host[i] = bench_uniform(&seed) * 0.01f; /* h moves little a launch */
    if (!rc) rc = up_act(b, &dfb, host, n_fb, 0, err);
    if (!rc) rc = talloc(b, &dxw, sizeof(bf16) * (size_t)rows * max_ldw, err);
    if (!rc) rc = talloc(b, &dx, sizeof(bf16) * n_h, err);
    if (!rc) rc = talloc(b, &dmlp, sizeof(bf16) * (size_t)rows * LB_I, err);
    if (!rc) rc = talloc(b, (void **)&dslot, sizeof(int) * (size_t)rows, err);
    cudaError_t e = cudaSuccess;
    if (!rc) e = cudaMemcpy(dslot, slots, sizeof(int) * (size_t)rows, cudaMemcpyHostToDevice);
    free(host), free(slots);
    if (rc) return rc;
    if (e != cudaSuccess) return cu_fail(err, "cudaMemcpy", e, __FILE__, __LINE__);
    int n_sm = 0, fit[CU_LORA_FIT_MAX + 1];
    if ((rc = test_n_sm(&n_sm, err)) || (rc = cu_lora_fit(fit, err))) return rc;
    cudaStream_t st = NULL;
    CU_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph = NULL;
    e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    for (int l = 0; e == cudaSuccess && !rc && l < n_layers; l++) {
        if (trunk) {
            rc = cu_rmsnorm(dh, dx, dw, rows, LB_H, 1e-6f, 0, st, err);
            if (!rc) rc = cu_rmsnorm(dh, dx, dw, rows, LB_H, 1e-6f, 0, st, err);
            if (!rc) rc = cu_silu_mul(dgu, dmlp, rows, LB_I, 0, st, err);
            continue;
        }
        size_t at = 0;
        for (int j = 0; j < LB_SITES && !rc; j++) {
            const size_t a_site = (size_t)LB_SLOTS * PARTS[j] * rp * cu_lora_lda(IN[j]);
            if (fold && j == 1) { /* out's A: read by gate | up's launch */
                at += a_site;
                continue;
            }
            cu_lora_input_args k;
            memset(&k, 0, sizeof k);
            k.src = SRC[j];
            k.h = dh;
            k.w = dw;
            k.eps = 1e-6f;
            k.x_src = SRC[j] == CU_LORA_SILU ? dgu : dmix;
            k.ld_src = SRC[j] == CU_LORA_SILU ? 2 * LB_I : LB_VD;
            k.in = IN[j];
            k.R = PARTS[j] * rp;
            k.lda = cu_lora_lda(IN[j]);
            k.A = (const bf16 *)dA + at;
            k.n_slots = LB_SLOTS;
            k.xw = dxw;
            k.ldw = k.in + LB_SLOTS * k.R;
            memcpy(k.fit, fit, sizeof k.fit);
            if (fold && j == 2) {
                k.fold_y = dmix;
                k.fold_ldy = LB_VD;
                k.fold_in = LB_VD;
                k.fold_A = (const bf16 *)dA + at - (size_t)LB_SLOTS * rp * cu_lora_lda(LB_VD);
                k.fold_lda = cu_lora_lda(LB_VD);
                k.fold_R = rp;
                k.fold_B = dfb;
                k.fold_ldb = LB_SLOTS * rp;
            }
            at += a_site;
            rc = cu_lora_input(&k, dslot, rows, n_sm, st, err);
        }
    }
    const cudaError_t ec = e == cudaSuccess ? cudaStreamEndCapture(st, &graph) : e;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0.f;
    e = rc ? cudaSuccess : ec;
    if (!rc && e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
    if (!rc && e == cudaSuccess) e = cudaEventCreate(&e0);
    if (!rc && e == cudaSuccess) e = cudaEventCreate(&e1);
    if (!rc && e == cudaSuccess) e = cudaGraphLaunch(exec, st); /* warm-up */
    if (!rc && e == cudaSuccess) e = cudaEventRecord(e0, st);
    for (int r = 0; !rc && e == cudaSuccess && r < LB_REPS; r++) e = cudaGraphLaunch(exec, st);
    if (!rc && e == cudaSuccess) e = cudaEventRecord(e1, st);
    if (!rc && e == cudaSuccess) e = cudaEventSynchronize(e1);
    if (!rc && e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, e1);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamSynchronize(st);
    cudaStreamDestroy(st);
    if (rc) return rc;
    if (e != cudaSuccess) return cu_fail(err, "lora benchmark", e, __FILE__, __LINE__);
    *us = 1e3 * ms / LB_REPS / n_layers;
    return 0;
}

extern "C" int squad_cuda_lora_fit(int fit[9], squad_err *err) {
    static_assert(CU_LORA_FIT_MAX == 8, "the header's fit[9]");
    return cu_lora_fit(fit, err);
}

extern "C" int squad_cuda_bench_lora(int rows, int rank, int n_layers, int mode, double *us_per_layer,
                                     squad_err *err) {
    *us_per_layer = -1.0;
    if (rows < 1 || rank < 1 || rank > 1024 || n_layers < 1 || n_layers > 64 || mode < SQUAD_BENCH_LORA ||
        mode > SQUAD_BENCH_LORA_FOLD)
        return cu_err(err, SQUAD_E_INVALID, "bench_lora: rows %d, rank %d, layers %d, mode %d", rows, rank,
                      n_layers, mode);
    tbufs b = {{0}, 0};
    const int rc = bench_lora(&b, rows, rank, n_layers, mode, us_per_layer, err);
    tfree(&b);
    return rc;
}
