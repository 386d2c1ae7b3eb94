/*
 * vision.c — the vision tower on the CPU (see vision.h).
 *
 * Design:
 *  - The reference is transformers 5.x's Qwen3_5VisionModel in fp32. The patch embedding, qkv, proj,
 *    the MLPs and the merger are cpu_gemm_bf16 calls over all of the image's patches (the bias added
 *    after the product, as nn.Linear does, and the residual after that). Everything else is plain
 *    fp32 loops spread over the pool in blocks of rows.
 *  - Position embedding: fast_pos_embed_interpolate. For each side, linspace(0, side - 1, n) in
 *    float (PyTorch's scalar formula: start + step i below the middle, end - step (n - 1 - i) from
 *    it), the floor by truncation, the ceiling clipped to side - 1, the fraction d; the four corner
 *    weights (1-dh)(1-dw), (1-dh)dw, dh(1-dw), dh dw in float and the four weighted rows summed in
 *    that order; patches then taken in merge-window order (block row, block column, row and column
 *    inside the window), the order of the processor's rows. Frames repeat the same rows.
 *  - 2D rotary: inv_freq[j] = 1 / theta^(2j / (hd/2)) for j < hd/4; a patch at (row, column) rotates
 *    dims [0, hd/4) by row inv_freq, [hd/4, hd/2) by column inv_freq, and the second half of the
 *    head (rotate_half's partner) by the same angles: q' = q cos + rotate_half(q) sin.
 *  - Attention: full, non-causal, within one frame (transformers' cu_seqlens: one sequence per
 *    frame), scale hd^-1/2, softmax in fp32 with the maximum subtracted. A task is (frame, head,
 *    block of queries); its scores row lives in a per-thread scratch of one frame's length. K and V
 *    are first repacked per head ([head][patch][hd]) so the inner loops stream.
 *  - LayerNorm: eps 1e-6 (transformers hard-codes it), biased variance; mean and variance summed in
 *    double. GELU: the block MLP's is the tanh approximation (gelu_pytorch_tanh) or erf (gelu) as
 *    the config says; the merger's is nn.GELU(), erf.
 *  - One arena holds every activation; nothing is kept between calls.
 */
#include "cpu/vision.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "util.h"
#include "vision_model.h"

#define VISION_ROW_BLOCK 16   /* rows per pool task in the row-wise ops */
#define VISION_QUERY_BLOCK 32 /* queries per attention task */

/* ---------------------------------------------------------------------------------------------
 * Grid checks and the position / rotary tables
 */

int cpu_vision_check_grid(const squad_vision_config *v, int t, int h, int w, squad_err *err) {
    int m = v->spatial_merge_size;
    if (t < 1 || h < m || w < m || h % m || w % m)
        return squad_fail(err, SQUAD_E_INVALID,
                          "image grid %dx%dx%d: t must be positive, h and w positive multiples of the merge size %d", t,
                          h, w, m);
    if ((long long)t * h * w > CPU_VISION_MAX_PATCHES)
        return squad_fail(err, SQUAD_E_INVALID, "image grid %dx%dx%d has %lld patches, over the limit of %d", t, h, w,
                          (long long)t * h * w, CPU_VISION_MAX_PATCHES);
    return 0;
}

/* torch.linspace(0, end, n)[i] in float, the scalar formula of PyTorch's CPU kernel. */
static float linspace_at(float end, int n, int i) {
    if (n == 1) return 0.0f;
    float step = end / (float)(n - 1);
    return i < n / 2 ? step * (float)i : end - step * (float)(n - 1 - i);
}

/* The grid coordinate of patch p of one frame (merge-window order) as (row, column). */
static void patch_coords(int p, int w, int m, int *row, int *col) {
    int per_block_row = w * m; /* patches in one row of merge windows */
    int br = p / per_block_row, rest = p % per_block_row;
    int bc = rest / (m * m), in = rest % (m * m);
    *row = br * m + in / m;
    *col = bc * m + in % m;
}

void cpu_vision_pos_embed(const squad_vision_config *v, const float *table, int t, int h, int w, float *out) {
    const int side = v->position_grid_side, H = v->hidden_size, m = v->spatial_merge_size;
    const float end = (float)(side - 1);
    const size_t frame = (size_t)h * w;
    for (size_t p = 0; p < frame; p++) {
        int row, col;
        patch_coords((int)p, w, m, &row, &col);
        float hv = linspace_at(end, h, row), wv = linspace_at(end, w, col);
        int h0 = (int)hv, w0 = (int)wv;
        int h1 = h0 + 1 < side ? h0 + 1 : side - 1, w1 = w0 + 1 < side ? w0 + 1 : side - 1;
        float dh = hv - (float)h0, dw = wv - (float)w0;
        float wt[4] = {(1.0f - dh) * (1.0f - dw), (1.0f - dh) * dw, dh * (1.0f - dw), dh * dw};
        const float *e[4] = {table + ((size_t)h0 * side + w0) * H, table + ((size_t)h0 * side + w1) * H,
                             table + ((size_t)h1 * side + w0) * H, table + ((size_t)h1 * side + w1) * H};
        float *o = out + p * H;
        for (int d = 0; d < H; d++) {
            float a = e[0][d] * wt[0], b = e[1][d] * wt[1], c = e[2][d] * wt[2], f = e[3][d] * wt[3];
            o[d] = ((a + b) + c) + f;
        }
    }
    for (int f = 1; f < t; f++) memcpy(out + f * frame * H, out, frame * H * sizeof *out);
}

void cpu_vision_rotary(const squad_vision_config *v, int h, int w, float *cos_out, float *sin_out) {
    const int hd = v->head_dim, dim = hd / 2, nf = hd / 4, m = v->spatial_merge_size;
    float inv_freq[CPU_VISION_MAX_HEAD_DIM / 4];
    for (int j = 0; j < nf; j++)
        inv_freq[j] = 1.0f / powf((float)v->rope_theta, (float)(2 * j) / (float)dim);
    for (int p = 0; p < h * w; p++) {
        int row, col;
        patch_coords(p, w, m, &row, &col);
        float *c = cos_out + (size_t)p * hd, *s = sin_out + (size_t)p * hd;
        for (int j = 0; j < nf; j++) {
            float ar = (float)row * inv_freq[j], ac = (float)col * inv_freq[j];
            c[j] = c[j + dim] = cosf(ar);
            s[j] = s[j + dim] = sinf(ar);
            c[nf + j] = c[nf + j + dim] = cosf(ac);
            s[nf + j] = s[nf + j + dim] = sinf(ac);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Row-wise ops over the pool
 */

typedef enum row_op { ROW_LAYERNORM, ROW_BIAS, ROW_BIAS_GELU_TANH, ROW_BIAS_GELU_ERF, ROW_BIAS_RESIDUAL } row_op;

typedef struct row_job {
    row_op op;
    int rows, cols;
    float *x;         /* [rows][cols], updated in place (LayerNorm: the input) */
    float *y;         /* LayerNorm: the output; BIAS_RESIDUAL: the residual stream x is added into */
    const float *w;   /* LayerNorm weight / the bias */
    const float *b;   /* LayerNorm bias */
} row_job;

static inline float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

static inline float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }

static void row_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const row_job *j = ctx;
    int r0 = task * VISION_ROW_BLOCK, r1 = r0 + VISION_ROW_BLOCK < j->rows ? r0 + VISION_ROW_BLOCK : j->rows;
    const int n = j->cols;
    for (int r = r0; r < r1; r++) {
        float *x = j->x + (size_t)r * n;
        switch (j->op) {
        case ROW_LAYERNORM: {
            double sum = 0, sq = 0;
            for (int i = 0; i < n; i++) sum += x[i];
            double mean = sum / n;
            for (int i = 0; i < n; i++) sq += (x[i] - mean) * (x[i] - mean);
            float rstd = (float)(1.0 / sqrt(sq / n + (double)SQUAD_VISION_LN_EPS)), fm = (float)mean;
            float *y = j->y + (size_t)r * n;
            for (int i = 0; i < n; i++) y[i] = (x[i] - fm) * rstd * j->w[i] + j->b[i];
            break;
        }
        case ROW_BIAS:
            for (int i = 0; i < n; i++) x[i] += j->w[i];
            break;
        case ROW_BIAS_GELU_TANH:
            for (int i = 0; i < n; i++) x[i] = gelu_tanh(x[i] + j->w[i]);
            break;
        case ROW_BIAS_GELU_ERF:
            for (int i = 0; i < n; i++) x[i] = gelu_erf(x[i] + j->w[i]);
            break;
        case ROW_BIAS_RESIDUAL: {
            float *y = j->y + (size_t)r * n;
            for (int i = 0; i < n; i++) y[i] += x[i] + j->w[i];
            break;
        }
        }
    }
}

static void run_rows(cpu_pool *pool, row_op op, int rows, int cols, float *x, float *y, const float *w,
                     const float *b) {
    row_job j = {op, rows, cols, x, y, w, b};
    cpu_pool_run(pool, row_task, &j, (rows + VISION_ROW_BLOCK - 1) / VISION_ROW_BLOCK);
}

/* y = x W^T + bias, then the row op (ROW_BIAS alone, a GELU, or added into a residual). */
static void linear(cpu_pool *pool, cpu_gemm_precision prec, const squad_mat *W, const float *bias, const float *x,
                   int T, float *y, row_op op, float *residual) {
    cpu_gemm_bf16(pool, y, x, W->w, T, W->rows, W->cols, 0, prec);
    run_rows(pool, op, T, W->rows, y, residual, bias, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Attention
 */

typedef struct attn_job {
    int frames, frame_len, heads, hd, H;
    const float *q;   /* [N][3H] (the qkv buffer; q at column head * hd) */
    const float *k, *v; /* [head][N][hd] */
    float *out;       /* [N][H] */
    float *scores;    /* [threads][frame_len] */
    float scale;
    int q_blocks;     /* query blocks per frame */
} attn_job;

static void attn_task(void *ctx, int task, int n_tasks, int thread) {
    (void)n_tasks;
    const attn_job *a = ctx;
    int qb = task % a->q_blocks, rest = task / a->q_blocks;
    int head = rest % a->heads, frame = rest / a->heads;
    const int L = a->frame_len, hd = a->hd;
    float *s = a->scores + (size_t)thread * L;
    size_t base = (size_t)frame * L;
    const float *K = a->k + ((size_t)head * a->frames * L + base) * hd;
    const float *V = a->v + ((size_t)head * a->frames * L + base) * hd;
    int i0 = qb * VISION_QUERY_BLOCK, i1 = i0 + VISION_QUERY_BLOCK < L ? i0 + VISION_QUERY_BLOCK : L;
    for (int i = i0; i < i1; i++) {
        const float *q = a->q + (base + i) * 3 * (size_t)a->H + (size_t)head * hd;
        float mx = -INFINITY;
        for (int j = 0; j < L; j++) {
            const float *k = K + (size_t)j * hd;
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) dot += q[d] * k[d];
            s[j] = dot * a->scale;
            if (s[j] > mx) mx = s[j];
        }
        double sum = 0;
        for (int j = 0; j < L; j++) {
            s[j] = expf(s[j] - mx);
            sum += s[j];
        }
        float inv = (float)(1.0 / sum);
        float *o = a->out + (base + i) * (size_t)a->H + (size_t)head * hd;
        float acc[CPU_VISION_MAX_HEAD_DIM];
        for (int d = 0; d < hd; d++) acc[d] = 0.0f;
        for (int j = 0; j < L; j++) {
            const float *vj = V + (size_t)j * hd;
            float p = s[j] * inv;
            for (int d = 0; d < hd; d++) acc[d] += p * vj[d];
        }
        for (int d = 0; d < hd; d++) o[d] = acc[d];
    }
}

/* Rotates q and k in the qkv buffer and repacks k and v per head. */
typedef struct rope_job {
    int N, frame_len, heads, hd, H;
    float *qkv;
    const float *cos, *sin; /* [frame_len][hd] */
    float *k, *v;           /* [head][N][hd] */
} rope_job;

static void rotate(float *x, const float *c, const float *s, int hd) {
    float tmp[CPU_VISION_MAX_HEAD_DIM];
    int half = hd / 2;
    for (int d = 0; d < half; d++) tmp[d] = x[d] * c[d] - x[d + half] * s[d];
    for (int d = half; d < hd; d++) tmp[d] = x[d] * c[d] + x[d - half] * s[d];
    memcpy(x, tmp, (size_t)hd * sizeof *x);
}

static void rope_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const rope_job *r = ctx;
    int p0 = task * VISION_ROW_BLOCK, p1 = p0 + VISION_ROW_BLOCK < r->N ? p0 + VISION_ROW_BLOCK : r->N;
    for (int p = p0; p < p1; p++) {
        float *row = r->qkv + (size_t)p * 3 * r->H;
        const float *c = r->cos + (size_t)(p % r->frame_len) * r->hd, *s = r->sin + (size_t)(p % r->frame_len) * r->hd;
        for (int h = 0; h < r->heads; h++) {
            float *q = row + (size_t)h * r->hd, *k = row + r->H + (size_t)h * r->hd, *v = row + 2 * r->H + (size_t)h * r->hd;
            rotate(q, c, s, r->hd);
            rotate(k, c, s, r->hd);
            memcpy(r->k + ((size_t)h * r->N + p) * r->hd, k, (size_t)r->hd * sizeof *k);
            memcpy(r->v + ((size_t)h * r->N + p) * r->hd, v, (size_t)r->hd * sizeof *v);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * The forward
 */

int cpu_vision_forward(cpu_pool *pool, cpu_gemm_precision prec, const squad_model *m, const float *pixel_values,
                       int t, int h, int w, float *out, squad_err *err) {
    squad_err local;
    if (!err) err = &local;
    const squad_vision_config *v = &m->cfg.vision;
    const squad_vision_weights *W = m->vision;
    if (!m->cfg.has_vision || !W) return squad_fail(err, SQUAD_E_INVALID, "the model has no vision tower");
    if (v->head_dim > CPU_VISION_MAX_HEAD_DIM)
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "vision head dim %d is over the CPU's limit of %d", v->head_dim,
                          CPU_VISION_MAX_HEAD_DIM);
    if (cpu_vision_check_grid(v, t, h, w, err) != 0) return err->code;
    const int H = v->hidden_size, I = v->intermediate_size, hd = v->head_dim, heads = v->num_heads;
    const int mm = v->spatial_merge_size * v->spatial_merge_size, L = h * w, N = t * L, Nm = N / mm;
    const int threads = cpu_pool_threads(pool);
    const int wide = I > 3 * H ? I : 3 * H;

    /* One arena: x, xn, qkv / MLP hidden, attention out, k, v, cos, sin, scores, merger hidden. */
    size_t sizes[] = {(size_t)N * H, (size_t)N * H, (size_t)N * wide, (size_t)N * H, (size_t)N * H, (size_t)N * H,
                      (size_t)L * hd, (size_t)L * hd, (size_t)threads * L, (size_t)Nm * mm * H};
    enum { X, XN, WIDE, ATT, KB, VB, COS, SIN, SCORES, MERGED, N_BUF };
    size_t offs[N_BUF], total = 0;
    for (int i = 0; i < N_BUF; i++) {
        offs[i] = total;
        total += (sizes[i] + 15) / 16 * 16; /* 64-byte aligned pieces */
    }
    float *arena = squad_aligned_alloc(total * sizeof(float), err);
    if (!arena) return squad_fail_context(err, "vision tower activations (%zu MB): ", total * sizeof(float) >> 20);
    float *b[N_BUF];
    for (int i = 0; i < N_BUF; i++) b[i] = arena + offs[i];

    /* Patch embedding and the interpolated position grid. */
    cpu_vision_pos_embed(v, W->pos_embed, t, h, w, b[X]);
    linear(pool, prec, &W->patch, W->patch_b, pixel_values, N, b[XN], ROW_BIAS_RESIDUAL, b[X]);
    cpu_vision_rotary(v, h, w, b[COS], b[SIN]);

    const float scale = 1.0f / sqrtf((float)hd);
    for (int l = 0; l < v->depth; l++) {
        const squad_vision_block *k = &W->blocks[l];
        run_rows(pool, ROW_LAYERNORM, N, H, b[X], b[XN], k->norm1_w, k->norm1_b);
        linear(pool, prec, &k->qkv, k->qkv_b, b[XN], N, b[WIDE], ROW_BIAS, NULL);
        rope_job r = {N, L, heads, hd, H, b[WIDE], b[COS], b[SIN], b[KB], b[VB]};
        cpu_pool_run(pool, rope_task, &r, (N + VISION_ROW_BLOCK - 1) / VISION_ROW_BLOCK);
        int q_blocks = (L + VISION_QUERY_BLOCK - 1) / VISION_QUERY_BLOCK;
        attn_job a = {t, L, heads, hd, H, b[WIDE], b[KB], b[VB], b[ATT], b[SCORES], scale, q_blocks};
        cpu_pool_run_indexed(pool, attn_task, &a, t * heads * q_blocks);
        linear(pool, prec, &k->proj, k->proj_b, b[ATT], N, b[XN], ROW_BIAS_RESIDUAL, b[X]);
        run_rows(pool, ROW_LAYERNORM, N, H, b[X], b[XN], k->norm2_w, k->norm2_b);
        linear(pool, prec, &k->fc1, k->fc1_b, b[XN], N, b[WIDE],
               v->hidden_act == SQUAD_VISION_ACT_GELU_ERF ? ROW_BIAS_GELU_ERF : ROW_BIAS_GELU_TANH, NULL);
        linear(pool, prec, &k->fc2, k->fc2_b, b[WIDE], N, b[XN], ROW_BIAS_RESIDUAL, b[X]);
    }

    /* The merger: LayerNorm per patch, then each merge window's patches side by side (they are
     * consecutive rows already), fc1, GELU (erf), fc2. */
    run_rows(pool, ROW_LAYERNORM, N, H, b[X], b[MERGED], W->merger_norm_w, W->merger_norm_b);
    linear(pool, prec, &W->merger_fc1, W->merger_fc1_b, b[MERGED], Nm, b[WIDE], ROW_BIAS_GELU_ERF, NULL);
    linear(pool, prec, &W->merger_fc2, W->merger_fc2_b, b[WIDE], Nm, out, ROW_BIAS, NULL);
    squad_aligned_free(arena);
    return 0;
}
