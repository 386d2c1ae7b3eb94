/*
 * vision_cuda.cu — the vision tower on the CUDA backend (vision_cuda.cuh has the design): its
 * weights uploaded once, its scratch grown to the largest image, and the forward of one image.
 *
 * The forward, for N = t h w patches of hidden Hv (x: the fp32 residual stream; xn, wide: bf16 GEMM
 * inputs and outputs; every GEMM cu_gemm with bf16 operands and fp32 accumulation):
 *   pixels -> bf16; x = pos_grid(h, w) + patch_b; x += pixels W_patch^T
 *   per block: xn = LN1(x [+ the previous fc2 bias]); wide = xn W_qkv^T; Q, K, V = rotary(wide + b);
 *              att = attention per frame; x += att W_proj^T; xn = LN2(x + proj_b);
 *              wide = GELU(xn W_fc1^T + b); x += wide W_fc2^T
 *   merger: xn = LN(x + fc2_b) read as [N / m^2][m^2 Hv]; wide = GELU_erf(xn W_1^T + b1);
 *           out = b2; out += wide W_2^T (fp32)
 */
#include "vision_cuda.cuh"

#include <math.h>
#include <stdlib.h>

typedef struct cu_vision_block {
    float *n1w, *n1b, *n2w, *n2b;
    bf16 *qkv, *proj, *fc1, *fc2;
    float *qkv_b, *proj_b, *fc1_b, *fc2_b;
} cu_vision_block;

struct cu_vision {
    squad_vision_config cfg;
    int Hv, I, hd, heads, m, K, out, Mm; /* K: C T P P; Mm: m^2 Hv */
    bf16 *patch;
    float *patch_b, *pos, *inv_freq;
    cu_vision_block *blocks;
    float *mnw, *mnb, *mfc1_b, *mfc2_b;
    bf16 *mfc1, *mfc2;
    size_t weight_bytes;
    void **allocs; /* the weights */
    int n_allocs, cap_allocs;
    /* scratch for cap patches (grown, never shrunk) */
    int cap;
    void *scratch;
    float *pix, *x, *out_d;
    bf16 *pixb, *xn, *wide, *q, *k, *v, *att;
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

static int up_mat(cu_vision *v, bf16 **dst, const squad_mat *m, int rows, int cols, const char *what, squad_err *err) {
    if (!m->w || m->rows != rows || m->cols != cols)
        return cu_err(err, SQUAD_E_MODEL, "CUDA vision tower: %s missing or %dx%d, expected %dx%d", what, m->rows,
                      m->cols, rows, cols);
    const size_t bytes = (size_t)rows * cols * 2;
    const int rc = vis_alloc(v, (void **)dst, bytes, err);
    if (rc) return rc;
    CU_TRY(cudaMemcpy(*dst, m->w, bytes, cudaMemcpyHostToDevice));
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

int cu_vision_new(const squad_model *m, cu_vision **out, squad_err *err) {
    *out = NULL;
    const squad_vision_weights *W = m->vision;
    if (!m->cfg.has_vision || !W) return cu_err(err, SQUAD_E_UNSUPPORTED, "the model has no vision tower");
    const squad_vision_config *c = &m->cfg.vision;
    int rc = check_shapes(c, m->cfg.hidden_size, err);
    if (rc) return rc;
    cu_vision *v = (cu_vision *)calloc(1, sizeof *v);
    if (!v) return cu_err(err, SQUAD_E_NOMEM, "out of memory (vision tower)");
    v->cfg = *c;
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
    if (!rc) rc = cu_vis_attn_init(v->hd, err);
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
    cudaGetLastError();
    free(v->allocs);
    free(v->blocks);
    free(v);
}

size_t cu_vision_weight_bytes(const cu_vision *v) { return v ? v->weight_bytes : 0; }

/* ---- scratch ------------------------------------------------------------------------------------- */

/* One device allocation for N patches: pixels (fp32 and bf16), x, xn, wide, Q, K, V, att, out. */
static int ensure_scratch(cu_vision *v, int N, cudaStream_t st, squad_err *err) {
    if (N <= v->cap) return 0;
    const size_t n = (size_t)N, Hv = (size_t)v->Hv, Nm = n / ((size_t)v->m * v->m);
    size_t wide = 3 * Hv > (size_t)v->I ? 3 * Hv : (size_t)v->I;
    if (wide < (size_t)v->Mm / ((size_t)v->m * v->m)) wide = (size_t)v->Mm / ((size_t)v->m * v->m);
    const size_t sizes[] = {n * v->K * 4, n * v->K * 2, n * Hv * 4, n * Hv * 2, n * wide * 2,
                            n * Hv * 2,   n * Hv * 2,   n * Hv * 2, n * Hv * 2, Nm * v->out * 4};
    enum { PIX, PIXB, X, XN, WIDE, Q, K, V, ATT, OUT, N_BUF };
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
    v->pix = (float *)(b + offs[PIX]);
    v->pixb = (bf16 *)(b + offs[PIXB]);
    v->x = (float *)(b + offs[X]);
    v->xn = (bf16 *)(b + offs[XN]);
    v->wide = (bf16 *)(b + offs[WIDE]);
    v->q = (bf16 *)(b + offs[Q]);
    v->k = (bf16 *)(b + offs[K]);
    v->v = (bf16 *)(b + offs[V]);
    v->att = (bf16 *)(b + offs[ATT]);
    v->out_d = (float *)(b + offs[OUT]);
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

/* From v->pix (the pixels on the device) to v->out_d, enqueued on st. */
static int run_device(cu_vision *v, cu_gemm_ctx *g, cudaStream_t st, int t, int h, int w, squad_err *err) {
    const int N = t * h * w, L = h * w, Hv = v->Hv, I = v->I, Nm = N / (v->m * v->m);
    const int act = v->cfg.hidden_act == SQUAD_VISION_ACT_GELU_ERF ? CU_VIS_ACT_GELU_ERF : CU_VIS_ACT_GELU_TANH;
    const float scale = 1.0f / sqrtf((float)v->hd);
    int rc;
    if ((rc = cu_vis_to_bf16(v->pix, v->pixb, (size_t)N * v->K, st, err))) return rc;
    if ((rc = cu_vis_pos_embed(v->pos, v->patch_b, v->cfg.position_grid_side, Hv, t, h, w, v->m, v->x, st, err)))
        return rc;
    if ((rc = cu_gemm(g, v->patch, v->pixb, v->x, N, Hv, v->K, 1, 0, st, err))) return rc;
    const float *pending = NULL; /* the bias of the GEMM that last added into x */
    for (int l = 0; l < v->cfg.depth; l++) {
        const cu_vision_block *b = &v->blocks[l];
        if ((rc = cu_vis_layernorm(v->x, pending, b->n1w, b->n1b, v->xn, N, Hv, st, err))) return rc;
        if ((rc = cu_gemm(g, b->qkv, v->xn, v->wide, N, 3 * Hv, Hv, 0, 0, st, err))) return rc;
        if ((rc = cu_vis_rope_split(v->wide, b->qkv_b, v->inv_freq, N, h, w, v->m, v->heads, v->hd, v->q, v->k, v->v,
                                    st, err)))
            return rc;
        if ((rc = cu_vis_attn(v->q, v->k, v->v, t, L, v->heads, v->hd, scale, v->att, st, err))) return rc;
        if ((rc = cu_gemm(g, b->proj, v->att, v->x, N, Hv, Hv, 1, 0, st, err))) return rc;
        if ((rc = cu_vis_layernorm(v->x, b->proj_b, b->n2w, b->n2b, v->xn, N, Hv, st, err))) return rc;
        if ((rc = cu_gemm(g, b->fc1, v->xn, v->wide, N, I, Hv, 0, 0, st, err))) return rc;
        if ((rc = cu_vis_bias_act(v->wide, b->fc1_b, N, I, act, st, err))) return rc;
        if ((rc = cu_gemm(g, b->fc2, v->wide, v->x, N, Hv, I, 1, 0, st, err))) return rc;
        pending = b->fc2_b;
    }
    /* the merger: each window's m^2 normed patches are consecutive rows, i.e. one row of [Nm][Mm] */
    if ((rc = cu_vis_layernorm(v->x, pending, v->mnw, v->mnb, v->xn, N, Hv, st, err))) return rc;
    if ((rc = cu_gemm(g, v->mfc1, v->xn, v->wide, Nm, v->Mm, v->Mm, 0, 0, st, err))) return rc;
    if ((rc = cu_vis_bias_act(v->wide, v->mfc1_b, Nm, v->Mm, CU_VIS_ACT_GELU_ERF, st, err))) return rc;
    if ((rc = cu_vis_rows_init(v->out_d, v->mfc2_b, Nm, v->out, st, err))) return rc;
    return cu_gemm(g, v->mfc2, v->wide, v->out_d, Nm, v->out, v->Mm, 1, 0, st, err);
}

/* The checks and the pixels' upload (pageable host memory: the copy has read them when it returns). */
static int upload_pixels(cu_vision *v, cudaStream_t st, const float *pixel_values, const int grid[3], squad_err *err) {
    if (!pixel_values || !grid) return cu_err(err, SQUAD_E_INVALID, "CUDA vision tower: no pixels or grid");
    int rc = check_grid(v, grid, err);
    if (rc) return rc;
    const int N = grid[0] * grid[1] * grid[2];
    if ((rc = ensure_scratch(v, N, st, err))) return rc;
    CU_TRY(cudaMemcpyAsync(v->pix, pixel_values, (size_t)N * v->K * sizeof(float), cudaMemcpyHostToDevice, st));
    return 0;
}

int cu_vision_forward(cu_vision *v, cu_gemm_ctx *g, cudaStream_t st, const float *pixel_values, const int grid[3],
                      float *out, squad_err *err) {
    if (!out) return cu_err(err, SQUAD_E_INVALID, "CUDA vision tower: no output");
    int rc = upload_pixels(v, st, pixel_values, grid, err);
    if (!rc) rc = run_device(v, g, st, grid[0], grid[1], grid[2], err);
    if (rc) {
        cudaStreamSynchronize(st); /* nothing of this call left in flight */
        cudaGetLastError();
        return rc;
    }
    const size_t Nm = (size_t)grid[0] * grid[1] * grid[2] / ((size_t)v->m * v->m);
    CU_TRY(cudaMemcpyAsync(out, v->out_d, Nm * v->out * sizeof(float), cudaMemcpyDeviceToHost, st));
    CU_TRY(cudaStreamSynchronize(st));
    return 0;
}

int cu_vision_time(cu_vision *v, cu_gemm_ctx *g, cudaStream_t st, const float *pixel_values, const int grid[3],
                   int reps, double *ms, squad_err *err) {
    int rc = upload_pixels(v, st, pixel_values, grid, err);
    if (rc) return rc;
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
