/*
 * vision_cuda.cu — the vision tower on the CUDA backend (vision_cuda.cuh has the design): its
 * weights uploaded once, its scratch grown to the largest image, and the forward of one image.
 *
 * The forward, for N = t h w patches of hidden Hv (x: the fp32 residual stream; xn, wide: the GEMMs'
 * inputs and outputs, bf16 on the bf16 path and fp32 on the exact path, as are the pixels, Q, K, V
 * and att; every GEMM cu_gemm with fp32 accumulation):
 *   x = pos_grid(h, w) + patch_b; x += pixels W_patch^T; the rotary's cos / sin table
 *   per block: xn = LN1(x [+ the previous fc2 bias]); wide = xn W_qkv^T; Q, K, V = rotary(wide + b);
 *              att = attention per frame; x += att W_proj^T; xn = LN2(x + proj_b);
 *              wide = GELU(xn W_fc1^T + b); x += wide W_fc2^T
 *   merger: xn = LN(x + fc2_b) read as [N / m^2][m^2 Hv]; wide = GELU_erf(xn W_1^T + b1);
 *           out = b2; out += wide W_2^T (fp32)
 *
 * Pixels in, rows out. A 1920x1080 screenshot's pixels are 50 MB of fp32 in the caller's pageable
 * memory; a plain copy from there ran at ~5.5 GB/s (the driver stages pageable memory through a
 * small pinned buffer of its own, one piece after another). On the bf16 path the patch GEMM takes
 * bf16, so the host rounds the pixels to bf16 itself (round to nearest even: the bits vis_to_bf16
 * made on the device) into a pinned buffer the tower owns, in pieces of CU_VIS_UPLOAD_ROWS patches
 * shared out among up to CU_VIS_UPLOAD_THREADS threads (the caller one of them); each piece is copied
 * up as soon as it is rounded, so the copies (half the bytes) overlap the rounding. The exact path
 * takes the same route, its fp32 pieces copied (not rounded) into the pinned buffer. The merged rows
 * come down the same way in reverse: into a pinned buffer in CU_VIS_DOWN_PIECES pieces, each copied
 * out to the caller as soon as its event fires. Both pinned buffers grow to the largest image and are
 * freed with the tower.
 *
 * On the bf16 path the attention runs on wgmma (k_vision_attn_sm90.cu) where the GPU and the head dim
 * allow, else on vis_attn (k_vision.cu, mma.sync: the reference the tests compare the wgmma kernel
 * against); on the exact path always on vis_attn_f32 (k_vision.cu). The bf16 upload and the wgmma
 * attention replaced slower paths, measured in one call (docs/cuda.md): fp32 pixels up from pageable
 * memory, and mma.sync attention at head dim 64.
 */
#include "vision_cuda.cuh"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "util.h"
}

#define CU_VIS_UPLOAD_ROWS 256     /* patches a piece of the upload (768 KB of bf16 at K 1536) */
#define CU_VIS_UPLOAD_THREADS 4    /* threads that round the pixels, the caller included */
#define CU_VIS_UPLOAD_MIN_PIECES 8 /* fewer pieces: the caller rounds alone (no threads started) */
#define CU_VIS_DOWN_PIECES 4       /* pieces of the download */

/* The matrices are bf16 on the bf16 path, fp32 on the exact path (cu_gemm's f32 takes either). */
typedef struct cu_vision_block {
    float *n1w, *n1b, *n2w, *n2b;
    void *qkv, *proj, *fc1, *fc2;
    float *qkv_b, *proj_b, *fc1_b, *fc2_b;
} cu_vision_block;

struct cu_vision {
    squad_vision_config cfg;
    int Hv, I, hd, heads, m, K, out, Mm; /* K: C T P P; Mm: m^2 Hv */
    int f32;  /* the exact path: fp32 matrices and activations */
    size_t es; /* bytes of an activation of the GEMMs: 4 (exact) or 2 (bf16) */
    void *patch;
    float *patch_b, *pos, *inv_freq;
    cu_vision_block *blocks;
    float *mnw, *mnb, *mfc1_b, *mfc2_b;
    void *mfc1, *mfc2;
    size_t weight_bytes;
    void **allocs; /* the weights */
    int n_allocs, cap_allocs;
    /* scratch for cap patches (grown, never shrunk) */
    int cap;
    void *scratch;
    float *x, *out_d;
    bf16 *pixb, *xn, *wide, *q, *k, *v, *att; /* the bf16 path's */
    float *pixf, *xnf, *widef, *qf, *kf, *vf, *attf; /* the exact path's: the same buffers */
    float2 *rope; /* the image's rotary table [max(h, w)][hd / 4] (cu_vis_rope_table) */
    /* the pinned staging of the pixels (bf16, or fp32 on the exact path) and of the merged rows (fp32),
     * grown to the largest image */
    void *pix_h;
    size_t pix_h_cap; /* elements */
    float *out_h;
    size_t out_h_cap;
    cudaEvent_t down_ev[CU_VIS_DOWN_PIECES];
    int attn_wg;    /* the attention on wgmma (k_vision_attn_sm90.cu) */
};

/* ---- weights ------------------------------------------------------------------------------------- */

static int vis_alloc(cu_vision *v, void **p, size_t bytes, squad_err *err) {
    *p = NULL;
    if (v->n_allocs == v->cap_allocs) {
        const int cap = v->cap_allocs ? 2 * v->cap_allocs : 64;
        void **na = (void **)realloc(v->allocs, sizeof *na * (size_t)cap);
        if (!na) return cu_err(err, SQUAD_E_NOMEM, "out of memory (vision tower allocation table)");
        v->allocs = na;
        v->cap_allocs = cap;
    }
    const cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cu_err(err, e == cudaErrorMemoryAllocation ? SQUAD_E_NOMEM : SQUAD_E_BACKEND,
                      "CUDA vision tower: no device memory for its weights (%zu bytes): %s", bytes,
                      cudaGetErrorString(e));
    }
    v->allocs[v->n_allocs++] = *p;
    v->weight_bytes += bytes;
    return 0;
}

static int up_vec(cu_vision *v, float **dst, const float *src, size_t n, const char *what, squad_err *err) {
    if (!src) return cu_err(err, SQUAD_E_MODEL, "CUDA vision tower: missing weight %s", what);
    const int rc = vis_alloc(v, (void **)dst, n * sizeof(float), err);
    if (rc) return rc;
    CU_TRY(cudaMemcpy(*dst, src, n * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
}

/* A matrix as it is (bf16), or on the exact path as fp32 (each bf16 value widened on the host). */
static int up_mat(cu_vision *v, void **dst, const squad_mat *m, int rows, int cols, const char *what, squad_err *err) {
    if (!m->w || m->rows != rows || m->cols != cols)
        return cu_err(err, SQUAD_E_MODEL, "CUDA vision tower: %s missing or %dx%d, expected %dx%d", what, m->rows,
                      m->cols, rows, cols);
    const size_t n = (size_t)rows * cols;
    const int rc = vis_alloc(v, dst, n * (v->f32 ? 4 : 2), err);
    if (rc) return rc;
    if (!v->f32) {
        CU_TRY(cudaMemcpy(*dst, m->w, n * 2, cudaMemcpyHostToDevice));
        return 0;
    }
    float *tmp = (float *)malloc(n * sizeof(float));
    if (!tmp) return cu_err(err, SQUAD_E_NOMEM, "out of memory (vision tower: %s staging)", what);
    for (size_t i = 0; i < n; i++) tmp[i] = squad_bf16_to_f32(m->w[i]);
    const cudaError_t e = cudaMemcpy(*dst, tmp, n * sizeof(float), cudaMemcpyHostToDevice);
    free(tmp);
    if (e != cudaSuccess) return cu_fail(err, "cudaMemcpy (vision tower weights)", e, __FILE__, __LINE__);
    return 0;
}

/* The shapes the kernels and the GEMMs take: an error naming the first that is not. */
static int check_shapes(const squad_vision_config *c, int text_hidden, squad_err *err) {
    const int hd = c->head_dim, K = c->in_channels * c->temporal_patch_size * c->patch_size * c->patch_size;
    if (!cu_vis_attn_supported(hd))
        return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA vision tower: head dim %d (16, 32, 64 or 128)", hd);
    if (c->hidden_size > 2048)
        return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA vision tower: hidden size %d (at most 2048)", c->hidden_size);
    /* 16-byte rows for the GEMMs' operands and the kernels' vector accesses */
    if (c->hidden_size % 8 || c->intermediate_size % 8 || c->out_hidden_size % 8 || K % 8)
        return cu_err(err, SQUAD_E_UNSUPPORTED,
                      "CUDA vision tower: hidden %d, intermediate %d, out %d and patch %d must be multiples of 8",
                      c->hidden_size, c->intermediate_size, c->out_hidden_size, K);
    if (c->spatial_merge_size < 1 || c->position_grid_side < 1 || c->out_hidden_size != text_hidden)
        return cu_err(err, SQUAD_E_MODEL, "CUDA vision tower: merge %d, position grid %d, out %d (text hidden %d)",
                      c->spatial_merge_size, c->position_grid_side, c->out_hidden_size, text_hidden);
    return 0;
}

int cu_vision_new(const squad_model *m, int f32, cu_vision **out, squad_err *err) {
    *out = NULL;
    const squad_vision_weights *W = m->vision;
    if (!m->cfg.has_vision || !W) return cu_err(err, SQUAD_E_UNSUPPORTED, "the model has no vision tower");
    const squad_vision_config *c = &m->cfg.vision;
    int rc = check_shapes(c, m->cfg.hidden_size, err);
    if (rc) return rc;
    cu_vision *v = (cu_vision *)calloc(1, sizeof *v);
    if (!v) return cu_err(err, SQUAD_E_NOMEM, "out of memory (vision tower)");
    v->cfg = *c;
    v->f32 = f32 != 0;
    v->es = v->f32 ? sizeof(float) : sizeof(bf16);
    v->Hv = c->hidden_size;
    v->I = c->intermediate_size;
    v->hd = c->head_dim;
    v->heads = c->num_heads;
    v->m = c->spatial_merge_size;
    v->K = c->in_channels * c->temporal_patch_size * c->patch_size * c->patch_size;
    v->out = c->out_hidden_size;
    v->Mm = v->m * v->m * v->Hv;
    const int Hv = v->Hv, I = v->I, side = c->position_grid_side;
    v->blocks = (cu_vision_block *)calloc((size_t)(c->depth > 0 ? c->depth : 1), sizeof *v->blocks);
    if (!v->blocks) rc = cu_err(err, SQUAD_E_NOMEM, "out of memory (vision tower)");
    if (!rc && !v->f32) rc = cu_vis_attn_init(v->hd, err); /* the bf16 path's attention kernels */
    if (!rc && !v->f32 && cu_vis_attn_sm90_takes(v->hd)) rc = cu_vis_attn_sm90_probe(&v->attn_wg, err);
    for (int i = 0; i < CU_VIS_DOWN_PIECES && !rc; i++) {
        const cudaError_t e = cudaEventCreateWithFlags(&v->down_ev[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            v->down_ev[i] = NULL;
            rc = cu_fail(err, "cudaEventCreateWithFlags", e, __FILE__, __LINE__);
        }
    }
    if (!rc) rc = up_mat(v, &v->patch, &W->patch, Hv, v->K, "patch_embed.proj", err);
    if (!rc) rc = up_vec(v, &v->patch_b, W->patch_b, Hv, "patch_embed.proj.bias", err);
    if (!rc) rc = up_vec(v, &v->pos, W->pos_embed, (size_t)side * side * Hv, "pos_embed", err);
    for (int l = 0; l < c->depth && !rc; l++) {
        const squad_vision_block *s = &W->blocks[l];
        cu_vision_block *d = &v->blocks[l];
        if (!rc) rc = up_vec(v, &d->n1w, s->norm1_w, Hv, "norm1.weight", err);
        if (!rc) rc = up_vec(v, &d->n1b, s->norm1_b, Hv, "norm1.bias", err);
        if (!rc) rc = up_mat(v, &d->qkv, &s->qkv, 3 * Hv, Hv, "attn.qkv", err);
        if (!rc) rc = up_vec(v, &d->qkv_b, s->qkv_b, 3 * (size_t)Hv, "attn.qkv.bias", err);
        if (!rc) rc = up_mat(v, &d->proj, &s->proj, Hv, Hv, "attn.proj", err);
        if (!rc) rc = up_vec(v, &d->proj_b, s->proj_b, Hv, "attn.proj.bias", err);
        if (!rc) rc = up_vec(v, &d->n2w, s->norm2_w, Hv, "norm2.weight", err);
        if (!rc) rc = up_vec(v, &d->n2b, s->norm2_b, Hv, "norm2.bias", err);
        if (!rc) rc = up_mat(v, &d->fc1, &s->fc1, I, Hv, "mlp.linear_fc1", err);
        if (!rc) rc = up_vec(v, &d->fc1_b, s->fc1_b, I, "mlp.linear_fc1.bias", err);
        if (!rc) rc = up_mat(v, &d->fc2, &s->fc2, Hv, I, "mlp.linear_fc2", err);
        if (!rc) rc = up_vec(v, &d->fc2_b, s->fc2_b, Hv, "mlp.linear_fc2.bias", err);
    }
    if (!rc) rc = up_vec(v, &v->mnw, W->merger_norm_w, Hv, "merger.norm.weight", err);
    if (!rc) rc = up_vec(v, &v->mnb, W->merger_norm_b, Hv, "merger.norm.bias", err);
    if (!rc) rc = up_mat(v, &v->mfc1, &W->merger_fc1, v->Mm, v->Mm, "merger.linear_fc1", err);
    if (!rc) rc = up_vec(v, &v->mfc1_b, W->merger_fc1_b, v->Mm, "merger.linear_fc1.bias", err);
    if (!rc) rc = up_mat(v, &v->mfc2, &W->merger_fc2, v->out, v->Mm, "merger.linear_fc2", err);
    if (!rc) rc = up_vec(v, &v->mfc2_b, W->merger_fc2_b, v->out, "merger.linear_fc2.bias", err);
    if (!rc) { /* the 2D rotary's frequencies, as the CPU tower computes them */
        const int nf = v->hd / 4, dim = v->hd / 2;
        float inv[32]; /* hd <= 128 */
        for (int j = 0; j < nf; j++) inv[j] = 1.0f / powf((float)c->rope_theta, (float)(2 * j) / (float)dim);
        rc = up_vec(v, &v->inv_freq, inv, (size_t)nf, "the rotary's frequencies", err);
    }
    if (rc) {
        cu_vision_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

void cu_vision_free(cu_vision *v) {
    if (!v) return;
    for (int i = 0; i < v->n_allocs; i++) cudaFree(v->allocs[i]);
    if (v->scratch) cudaFree(v->scratch);
    if (v->pix_h) cudaFreeHost(v->pix_h);
    if (v->out_h) cudaFreeHost(v->out_h);
    for (int i = 0; i < CU_VIS_DOWN_PIECES; i++)
        if (v->down_ev[i]) cudaEventDestroy(v->down_ev[i]);
    cudaGetLastError();
    free(v->allocs);
    free(v->blocks);
    free(v);
}

size_t cu_vision_weight_bytes(const cu_vision *v) { return v ? v->weight_bytes : 0; }

/* ---- scratch ------------------------------------------------------------------------------------- */

/* One device allocation for N patches: pixels, x, xn, wide, Q, K, V, att, out, the rotary table; the
 * pixels and the GEMMs' activations in v->es bytes an element (bf16, or fp32 on the exact path). */
static int ensure_scratch(cu_vision *v, int N, cudaStream_t st, squad_err *err) {
    if (N <= v->cap) return 0;
    const size_t n = (size_t)N, Hv = (size_t)v->Hv, Nm = n / ((size_t)v->m * v->m);
    size_t wide = 3 * Hv > (size_t)v->I ? 3 * Hv : (size_t)v->I;
    if (wide < (size_t)v->Mm / ((size_t)v->m * v->m)) wide = (size_t)v->Mm / ((size_t)v->m * v->m);
    const size_t es = v->es;
    const size_t sizes[] = {n * v->K * es, n * Hv * 4,  n * Hv * es, n * wide * es,
                            n * Hv * es,   n * Hv * es, n * Hv * es, n * Hv * es, Nm * v->out * 4,
                            n * (size_t)(v->hd / 4) * sizeof(float2)};
    enum { PIXB, X, XN, WIDE, Q, K, V, ATT, OUT, ROPE, N_BUF };
    size_t offs[N_BUF], total = 0;
    for (int i = 0; i < N_BUF; i++) {
        offs[i] = total;
        total += (sizes[i] + 255) & ~(size_t)255;
    }
    /* the previous buffer may still be read by work on the stream */
    CU_TRY(cudaStreamSynchronize(st));
    if (v->scratch) cudaFree(v->scratch);
    v->scratch = NULL;
    v->cap = 0;
    const cudaError_t e = cudaMalloc(&v->scratch, total);
    if (e != cudaSuccess) {
        cudaGetLastError();
        v->scratch = NULL;
        return cu_err(err, e == cudaErrorMemoryAllocation ? SQUAD_E_NOMEM : SQUAD_E_BACKEND,
                      "CUDA vision tower: no device memory for an image of %d patches (%.1f MB): %s", N,
                      (double)total / (1 << 20), cudaGetErrorString(e));
    }
    unsigned char *b = (unsigned char *)v->scratch;
    v->pixb = (bf16 *)(b + offs[PIXB]);
    v->x = (float *)(b + offs[X]);
    v->xn = (bf16 *)(b + offs[XN]);
    v->wide = (bf16 *)(b + offs[WIDE]);
    v->q = (bf16 *)(b + offs[Q]);
    v->k = (bf16 *)(b + offs[K]);
    v->v = (bf16 *)(b + offs[V]);
    v->att = (bf16 *)(b + offs[ATT]);
    v->out_d = (float *)(b + offs[OUT]);
    v->rope = (float2 *)(b + offs[ROPE]);
    v->pixf = (float *)v->pixb; /* the exact path's views of the same buffers */
    v->xnf = (float *)v->xn;
    v->widef = (float *)v->wide;
    v->qf = (float *)v->q;
    v->kf = (float *)v->k;
    v->vf = (float *)v->v;
    v->attf = (float *)v->att;
    v->cap = N;
    return 0;
}

/* ---- the forward ---------------------------------------------------------------------------------- */

static int check_grid(const cu_vision *v, const int grid[3], squad_err *err) {
    const int t = grid[0], h = grid[1], w = grid[2], m = v->m;
    if (t < 1 || h < m || w < m || h % m || w % m)
        return cu_err(err, SQUAD_E_INVALID,
                      "image grid %dx%dx%d: t must be positive, h and w positive multiples of the merge size %d", t, h,
                      w, m);
    if ((long long)t * h * w > CU_VISION_MAX_PATCHES)
        return cu_err(err, SQUAD_E_INVALID, "image grid %dx%dx%d has %lld patches, over the limit of %d", t, h, w,
                      (long long)t * h * w, CU_VISION_MAX_PATCHES);
    return 0;
}

/* The forward's elementwise and attention steps in the tower's precision: the bf16 kernels on the
 * bf16 path (attention on wgmma where it runs), their fp32 twins on the exact path, on the same
 * scratch buffers (ensure_scratch's two views). One layer loop below serves both paths. */
static int vis_layernorm(cu_vision *v, const float *bias, const float *w, const float *b, int rows, cudaStream_t st,
                         squad_err *err) {
    return v->f32 ? cu_vis_layernorm_f32(v->x, bias, w, b, v->xnf, rows, v->Hv, st, err)
                  : cu_vis_layernorm(v->x, bias, w, b, v->xn, rows, v->Hv, st, err);
}

static int vis_rope_split(cu_vision *v, const float *qkv_b, int N, int h, int w, cudaStream_t st, squad_err *err) {
    return v->f32 ? cu_vis_rope_split_f32(v->widef, qkv_b, v->rope, N, h, w, v->m, v->heads, v->hd, v->qf, v->kf,
                                          v->vf, st, err)
                  : cu_vis_rope_split(v->wide, qkv_b, v->rope, N, h, w, v->m, v->heads, v->hd, v->q, v->k, v->v, st,
                                      err);
}

static int vis_attn(cu_vision *v, int t, int L, float scale, cudaStream_t st, squad_err *err) {
    if (v->f32) return cu_vis_attn_f32(v->qf, v->kf, v->vf, t, L, v->heads, v->hd, scale, v->attf, st, err);
    return v->attn_wg ? cu_vis_attn_sm90(v->q, v->k, v->v, t, L, v->heads, v->hd, scale, v->att, st, err)
                      : cu_vis_attn(v->q, v->k, v->v, t, L, v->heads, v->hd, scale, v->att, st, err);
}

static int vis_bias_act(cu_vision *v, const float *bias, int rows, int n, int act, cudaStream_t st, squad_err *err) {
    return v->f32 ? cu_vis_bias_act_f32(v->widef, bias, rows, n, act, st, err)
                  : cu_vis_bias_act(v->wide, bias, rows, n, act, st, err);
}

/* From the pixels on the device (v->pixb, or v->pixf on the exact path) to v->out_d on the tower's
 * path, enqueued on st. Every GEMM is cu_gemm with fp32 accumulation, on bf16 operands or, on the
 * exact path (f32 = 1), fp32 operands and output. */
static int run_device(cu_vision *v, cu_gemm_ctx *g, cudaStream_t st, int t, int h, int w, squad_err *err) {
    const int N = t * h * w, L = h * w, Hv = v->Hv, I = v->I, Nm = N / (v->m * v->m), f = v->f32;
    const int act = v->cfg.hidden_act == SQUAD_VISION_ACT_GELU_ERF ? CU_VIS_ACT_GELU_ERF : CU_VIS_ACT_GELU_TANH;
    const float scale = 1.0f / sqrtf((float)v->hd);
    /* the GEMMs' activations (the same memory on both paths, as bf16 or fp32) */
    const void *pix = f ? (const void *)v->pixf : (const void *)v->pixb;
    void *xn = f ? (void *)v->xnf : (void *)v->xn, *wide = f ? (void *)v->widef : (void *)v->wide;
    const void *att = f ? (const void *)v->attf : (const void *)v->att;
    int rc;
    if ((rc = cu_vis_pos_embed(v->pos, v->patch_b, v->cfg.position_grid_side, Hv, t, h, w, v->m, v->x, st, err)))
        return rc;
    if ((rc = cu_gemm(g, v->patch, pix, v->x, N, Hv, v->K, 1, f, st, err))) return rc;
    if ((rc = cu_vis_rope_table(v->inv_freq, h > w ? h : w, v->hd, v->rope, st, err))) return rc;
    const float *pending = NULL; /* the bias of the GEMM that last added into x */
    for (int l = 0; l < v->cfg.depth; l++) {
        const cu_vision_block *b = &v->blocks[l];
        if ((rc = vis_layernorm(v, pending, b->n1w, b->n1b, N, st, err))) return rc;
        if ((rc = cu_gemm(g, b->qkv, xn, wide, N, 3 * Hv, Hv, 0, f, st, err))) return rc;
        if ((rc = vis_rope_split(v, b->qkv_b, N, h, w, st, err))) return rc;
        if ((rc = vis_attn(v, t, L, scale, st, err))) return rc;
        if ((rc = cu_gemm(g, b->proj, att, v->x, N, Hv, Hv, 1, f, st, err))) return rc;
        if ((rc = vis_layernorm(v, b->proj_b, b->n2w, b->n2b, N, st, err))) return rc;
        if ((rc = cu_gemm(g, b->fc1, xn, wide, N, I, Hv, 0, f, st, err))) return rc;
        if ((rc = vis_bias_act(v, b->fc1_b, N, I, act, st, err))) return rc;
        if ((rc = cu_gemm(g, b->fc2, wide, v->x, N, Hv, I, 1, f, st, err))) return rc;
        pending = b->fc2_b;
    }
    /* the merger: each window's m^2 normed patches are consecutive rows, i.e. one row of [Nm][Mm] */
    if ((rc = vis_layernorm(v, pending, v->mnw, v->mnb, N, st, err))) return rc;
    if ((rc = cu_gemm(g, v->mfc1, xn, wide, Nm, v->Mm, v->Mm, 0, f, st, err))) return rc;
    if ((rc = vis_bias_act(v, v->mfc1_b, Nm, v->Mm, CU_VIS_ACT_GELU_ERF, st, err))) return rc;
    if ((rc = cu_vis_rows_init(v->out_d, v->mfc2_b, Nm, v->out, st, err))) return rc;
    return cu_gemm(g, v->mfc2, wide, v->out_d, Nm, v->out, v->Mm, 1, f, st, err);
}

/* ---- pixels up, rows down ---------------------------------------------------------------------------- */

/* A pinned host buffer of at least n elements of `size` bytes (grown, never shrunk; the stream is idle
 * whenever this runs: every call synchronises before it returns). */
static int ensure_pinned(void **buf, size_t *cap, size_t n, size_t size, squad_err *err) {
    if (n <= *cap) return 0;
    if (*buf) cudaFreeHost(*buf);
    *buf = NULL;
    *cap = 0;
    const cudaError_t e = cudaHostAlloc(buf, n * size, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *buf = NULL;
        return cu_err(err, SQUAD_E_NOMEM, "CUDA vision tower: no pinned host memory (%.1f MB): %s",
                      (double)(n * size) / (1 << 20), cudaGetErrorString(e));
    }
    *cap = n;
    return 0;
}

/* The shared state of one upload: pieces handed out by an atomic counter. */
typedef struct vis_upload {
    const float *src;  /* the caller's pixels [N][K] */
    void *stage;       /* pinned [N][K]: bf16, or fp32 (f32) */
    void *dst;         /* the device's [N][K], of the same type */
    size_t K;
    int f32;           /* copy fp32 as it is (the exact path) instead of rounding to bf16 */
    int N, pieces, device;
    cudaStream_t st;
    int next;          /* the next piece to take (atomic) */
    int fail;          /* the first failed copy's cudaError_t (0, cudaSuccess, while none) */
} vis_upload;

/* Takes pieces until none is left: rounds each to bf16 (or copies it, f32) into the pinned stage and
 * copies it up. */
static void *vis_upload_worker(void *arg) {
    vis_upload *u = (vis_upload *)arg;
    for (;;) {
        const int piece = __atomic_fetch_add(&u->next, 1, __ATOMIC_RELAXED);
        if (piece >= u->pieces) break;
        const size_t r0 = (size_t)piece * CU_VIS_UPLOAD_ROWS;
        const size_t r1 = r0 + CU_VIS_UPLOAD_ROWS < (size_t)u->N ? r0 + CU_VIS_UPLOAD_ROWS : (size_t)u->N;
        const float *src = u->src + r0 * u->K;
        const size_t n = (r1 - r0) * u->K, es = u->f32 ? sizeof(float) : sizeof(uint16_t);
        unsigned char *stage = (unsigned char *)u->stage + r0 * u->K * es;
        if (u->f32) {
            memcpy(stage, src, n * sizeof(float));
        } else {
            uint16_t *s16 = (uint16_t *)stage;
            for (size_t i = 0; i < n; i++) s16[i] = squad_f32_to_bf16(src[i]);
        }
        const cudaError_t e = cudaMemcpyAsync((unsigned char *)u->dst + r0 * u->K * es, stage, n * es,
                                              cudaMemcpyHostToDevice, u->st);
        if (e != cudaSuccess) {
            int none = 0;
            __atomic_compare_exchange_n(&u->fail, &none, (int)e, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

static void *vis_upload_thread(void *arg) {
    vis_upload *u = (vis_upload *)arg;
    if (cudaSetDevice(u->device) != cudaSuccess) { /* the stream's device: leave the pieces to the others */
        cudaGetLastError();
        return NULL;
    }
    return vis_upload_worker(arg);
}

/* The pixels rounded to bf16 on the host (the exact path: kept fp32) and copied into v->pixb, piece
 * by piece through the pinned stage (the file's comment). */
static int upload_staged(cu_vision *v, cudaStream_t st, const float *pixel_values, int N, squad_err *err) {
    const size_t K = (size_t)v->K;
    int rc = ensure_pinned(&v->pix_h, &v->pix_h_cap, (size_t)N * K, v->es, err);
    if (rc) return rc;
    vis_upload u;
    memset(&u, 0, sizeof u);
    u.src = pixel_values;
    u.stage = v->pix_h;
    u.dst = v->pixb; /* v->pixf on the exact path: the same buffer */
    u.K = K;
    u.f32 = v->f32;
    u.N = N;
    u.pieces = (N + CU_VIS_UPLOAD_ROWS - 1) / CU_VIS_UPLOAD_ROWS;
    u.st = st;
    CU_TRY(cudaGetDevice(&u.device));
    pthread_t th[CU_VIS_UPLOAD_THREADS];
    int started = 0;
    if (u.pieces >= CU_VIS_UPLOAD_MIN_PIECES) /* a thread that fails to start leaves its share to the rest */
        for (int i = 0; i < CU_VIS_UPLOAD_THREADS - 1; i++)
            if (pthread_create(&th[started], NULL, vis_upload_thread, &u) == 0) started++;
    vis_upload_worker(&u);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (u.fail) return cu_fail(err, "cudaMemcpyAsync (vision pixels)", (cudaError_t)u.fail, __FILE__, __LINE__);
    return 0;
}

/* The checks and the pixels' upload (when it returns, the caller's pixels have been read). */
static int upload_pixels(cu_vision *v, cudaStream_t st, const float *pixel_values, const int grid[3], squad_err *err) {
    if (!pixel_values || !grid) return cu_err(err, SQUAD_E_INVALID, "CUDA vision tower: no pixels or grid");
    int rc = check_grid(v, grid, err);
    if (rc) return rc;
    const int N = grid[0] * grid[1] * grid[2];
    if ((rc = ensure_scratch(v, N, st, err))) return rc;
    return upload_staged(v, st, pixel_values, N, err);
}

/* v->out_d's Nm rows to the caller's out, through the pinned buffer piece by piece; synchronises st. */
static int download_rows(cu_vision *v, cudaStream_t st, size_t Nm, float *out, squad_err *err) {
    const size_t n = Nm * v->out;
    int rc = ensure_pinned((void **)&v->out_h, &v->out_h_cap, n, sizeof(float), err);
    if (rc) return rc;
    size_t off[CU_VIS_DOWN_PIECES + 1];
    for (int i = 0; i <= CU_VIS_DOWN_PIECES; i++) off[i] = Nm * i / CU_VIS_DOWN_PIECES * v->out;
    for (int i = 0; i < CU_VIS_DOWN_PIECES; i++) {
        if (off[i + 1] == off[i]) continue;
        CU_TRY(cudaMemcpyAsync(v->out_h + off[i], v->out_d + off[i], (off[i + 1] - off[i]) * sizeof(float),
                               cudaMemcpyDeviceToHost, st));
        CU_TRY(cudaEventRecord(v->down_ev[i], st));
    }
    for (int i = 0; i < CU_VIS_DOWN_PIECES; i++) {
        if (off[i + 1] == off[i]) continue;
        CU_TRY(cudaEventSynchronize(v->down_ev[i]));
        memcpy(out + off[i], v->out_h + off[i], (off[i + 1] - off[i]) * sizeof(float));
    }
    CU_TRY(cudaStreamSynchronize(st));
    return 0;
}

int cu_vision_forward(cu_vision *v, cu_gemm_ctx *g, cudaStream_t st, const float *pixel_values, const int grid[3],
                      float *out, squad_err *err) {
    if (!out) return cu_err(err, SQUAD_E_INVALID, "CUDA vision tower: no output");
    int rc = upload_pixels(v, st, pixel_values, grid, err);
    if (!rc) rc = run_device(v, g, st, grid[0], grid[1], grid[2], err);
    if (!rc) rc = download_rows(v, st, (size_t)grid[0] * grid[1] * grid[2] / ((size_t)v->m * v->m), out, err);
    if (rc) {
        cudaStreamSynchronize(st); /* nothing of this call left in flight */
        cudaGetLastError();
        return rc;
    }
    return 0;
}

int cu_vision_time(cu_vision *v, cu_gemm_ctx *g, cudaStream_t st, const float *pixel_values, const int grid[3],
                   int reps, double *ms, squad_err *err) {
    int rc = upload_pixels(v, st, pixel_values, grid, err);
    if (rc) {
        cudaStreamSynchronize(st);
        cudaGetLastError();
        return rc;
    }
    cudaEvent_t e0 = NULL, e1 = NULL;
    CU_TRY(cudaEventCreate(&e0));
    cudaError_t e = cudaEventCreate(&e1);
    for (int r = 0; r < reps && !rc && e == cudaSuccess; r++) {
        e = cudaEventRecord(e0, st);
        if (e == cudaSuccess) rc = run_device(v, g, st, grid[0], grid[1], grid[2], err);
        if (!rc && e == cudaSuccess) e = cudaEventRecord(e1, st);
        if (!rc && e == cudaSuccess) e = cudaEventSynchronize(e1);
        float f = 0.f;
        if (!rc && e == cudaSuccess) e = cudaEventElapsedTime(&f, e0, e1);
        ms[r] = f;
    }
    cudaStreamSynchronize(st);
    cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (!rc && e != cudaSuccess) rc = cu_fail(err, "timing the vision tower", e, __FILE__, __LINE__);
    return rc;
}
