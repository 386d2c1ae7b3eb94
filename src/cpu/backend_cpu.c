/*
 * backend_cpu.c — the CPU backend (src/backend.h): the reference forward of one chunk on fp32
 * activations with the bf16 weights kept in bf16, spread over a thread pool.
 *
 * Working state, laid out so a checkpoint is one memcpy:
 *   gdn_state  [n_gdn] x { S [nv][dk][dv] fp32, conv inputs [K-1][C] fp32 }  (= one save_gdn blob)
 *   K[la], V[la] [capacity][nkv hd] fp32 per attention layer, grown on demand up to max_context.
 * A save_kv blob is [n_attn][K then V][n][nkv hd].
 *
 * The delta rule runs token by token (op_delta_rule): its result does not depend on where chunks
 * start, so any split of a row gives bit-for-bit the same state; the blocked WY form
 * (op_delta_rule_chunked, what the GPU runs) differs by round-off with the block boundaries, and it
 * is only a few per cent of the CPU's time either way.
 *
 * Scratch activations are sized for CPU_MAX_CHUNK tokens once, at creation, so a forward allocates
 * nothing but the attention's per-call score row. The projections that end a block (out_proj,
 * o_proj, down_proj) accumulate straight into the residual stream h.
 *
 * Full-vocabulary figures (a chunk with vocab): the slots' final-normed rows times the output
 * embedding, one step of CPU_VOCAB_BLOCK vocabulary rows at a time for all the slots together (one
 * GEMM, so each embedding row is read once), each step's logits reduced at once into a running
 * (max, sum of exp, argmax) per slot; only one step's logits exist at any time. The logits are
 * fp32 products (the exact GEMM) in both precisions: the letter logits the probabilities come from
 * are fp32 too, and the two must agree (label_mass is their ratio).
 *
 * Specialists (opts->specialists): in the layers from `split` on, every projection the chunk's
 * route adapts gets its low-rank term right after the shared GEMM, y[t] += s B (A x[t]), in the
 * arithmetic of squad_lora_apply_ref (double sums over the adapter's fp32 weights), one task per
 * block of tokens. The shared weights are never touched, so one backend serves every route. The
 * router's chunk sum is taken from h as it enters router.layer.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend.h"
#include "../specialists.h"
#include "../util.h"
#include "gemm.h"
#include "ops.h"
#include "pool.h"

/* The longest chunk this backend runs at once; longer spans are split by the engine. */
#define CPU_MAX_CHUNK 512
/* Query tokens per attention task (with the kv head's whole group of query heads). */
#define CPU_ATTN_QUERY_BLOCK 16
/* The first K / V allocation, in positions; it doubles as rows grow. */
#define CPU_KV_INITIAL_POSITIONS 1024
/* The working K / V at the longest row may take at most this fraction (1 / N) of the host's
 * physical memory; a longer max_context is lowered to fit (the weights, checkpoints and the rest
 * of the process need the remainder). */
#define CPU_KV_MEMORY_SHARE 2
/* Vocabulary rows per step of the full-vocabulary pass (logits kept: slots x this many floats). */
#define CPU_VOCAB_BLOCK 4096
/* Reduction tasks per slot and step (each one's part of the step's logits). */
#define CPU_VOCAB_PIECES 8
/* Sequence slots when the engine's options do not say (squad_engine_opts.max_rows). */
#define CPU_DEFAULT_SEQS 8
/* Tokens per task of the LoRA low-rank product. */
#define CPU_LORA_TOKENS 16

/* A running reduction of logits: their maximum, the sum of exp(z - max), the maximum's lowest id. */
typedef struct vocab_acc {
    float max;
    double sum;
    int32_t arg;
} vocab_acc;

/* One sequence slot's working state (backend.h): while it is the active slot its arrays live in
 * the backend's gdn_state / K / V / kv_capacity fields instead. */
typedef struct cpu_seq {
    float *gdn_state; /* NULL until the slot is first used */
    float **K, **V;
    int kv_capacity;
} cpu_seq;

typedef struct cpu_backend {
    squad_backend base; /* first: a squad_backend * is a cpu_backend * */
    const squad_model *m;
    cpu_pool *pool;
    cpu_gemm_precision prec;
    int n_gdn, n_attn;
    int slot_of_layer[SQUAD_MAX_LAYERS]; /* index among the layers of its kind */
    size_t gdn_layer_floats;             /* S + conv floats of one GDN layer */
    float *gdn_state;                    /* [n_gdn][gdn_layer_floats] */
    float **K, **V;                      /* [n_attn] -> [kv_capacity][nkv hd] */
    int kv_capacity;
    cpu_seq *seqs; /* [max_seqs]; the active slot's entry is stale while it is active */
    int active;    /* the slot whose state is in gdn_state / K / V */
    float *inv_freq; /* [rd/2] */
    float **conv_kc; /* [n_gdn] -> conv weights transposed to [K][C] */
    float *attn_scratch; /* per thread, attn_scratch_floats each */
    long attn_scratch_floats;
    /* scratch, [CPU_MAX_CHUNK] rows each */
    float *h, *x, *qkv, *conv_out, *z, *gate_a, *gate_b, *g, *beta, *o, *qg, *kk, *vv, *att, *mlp_gate, *mlp_up;
    int last_len; /* tokens of the last chunk run (h holds their residual stream) */
    /* the full-vocabulary pass: normed slot rows [SQUAD_MAX_SLOTS_PER_ROW][H], one step's logits
     * [SQUAD_MAX_SLOTS_PER_ROW][CPU_VOCAB_BLOCK], the reduction tasks' results */
    float *vocab_xn, *vocab_z;
    vocab_acc vocab_parts[SQUAD_MAX_SLOTS_PER_ROW * CPU_VOCAB_PIECES];
    /* specialists: the adapters (borrowed), and the running layer's adapter (NULL: none) */
    const squad_specialists *sp;
    const squad_adapter *lora_adapter;
    int lora_layer;
} cpu_backend;

static cpu_backend *impl_of(squad_backend *be) { return (cpu_backend *)be; }

/* ---- memory ---------------------------------------------------------------------------------- */

/* Checkpoint blobs: not zeroed, since a save always overwrites the whole blob (zeroing would only
 * fault in fresh pages twice). */
static void *cpu_alloc(squad_backend *be, size_t bytes, squad_err *err) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) {
        squad_fail(err, SQUAD_E_NOMEM, "out of memory (%zu bytes for a checkpoint)", bytes);
        return NULL;
    }
    return p;
}
static void cpu_release(squad_backend *be, void *p) { free(p); }

static int kv_dim(const cpu_backend *c) { return c->m->cfg.num_kv_heads * c->m->cfg.head_dim; }

/* Makes room for positions [0, need) in every attention layer's K / V, keeping what is there. */
static int ensure_kv_capacity(cpu_backend *c, int need, squad_err *err) {
    if (need <= c->kv_capacity) return 0;
    if (need > c->base.max_context)
        return squad_fail(err, SQUAD_E_INVALID, "position %d is past the longest supported row (%d)", need,
                          c->base.max_context);
    int cap = c->kv_capacity ? c->kv_capacity : CPU_KV_INITIAL_POSITIONS;
    if (cap > c->base.max_context) cap = c->base.max_context;
    while (cap < need) cap = cap > c->base.max_context / 2 ? c->base.max_context : cap * 2;
    size_t row = sizeof(float) * (size_t)kv_dim(c);
    for (int la = 0; la < c->n_attn; la++) {
        float *nk = realloc(c->K[la], row * (size_t)cap);
        if (!nk) return squad_fail(err, SQUAD_E_NOMEM, "out of memory growing K/V to %d positions", cap);
        c->K[la] = nk;
        float *nv = realloc(c->V[la], row * (size_t)cap);
        if (!nv) return squad_fail(err, SQUAD_E_NOMEM, "out of memory growing K/V to %d positions", cap);
        c->V[la] = nv;
    }
    c->kv_capacity = cap;
    c->base.kv_positions = cap;
    return 0;
}

/* The longest context whose K / V fits the host's share (CPU_KV_MEMORY_SHARE), want or fewer;
 * want when the host's memory cannot be asked. */
static int context_bound(int want, size_t kv_bytes_per_pos) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0 || kv_bytes_per_pos == 0) return want;
    const size_t share = (size_t)pages / CPU_KV_MEMORY_SHARE * (size_t)page;
    const size_t fit = share / kv_bytes_per_pos;
    return fit < (size_t)want ? (int)fit : want;
}

/* Makes seq the active slot (its state in gdn_state / K / V), allocating its GDN state on first use. */
static int select_seq(cpu_backend *c, int seq, squad_err *err) {
    if (seq < 0 || seq >= c->base.max_seqs)
        return squad_fail(err, SQUAD_E_INVALID, "sequence slot %d (the backend has %d)", seq, c->base.max_seqs);
    if (seq == c->active) return 0;
    cpu_seq *to = &c->seqs[seq];
    if (!to->gdn_state) {
        to->gdn_state = squad_aligned_alloc(c->base.gdn_snapshot_bytes ? c->base.gdn_snapshot_bytes : 1, err);
        to->K = squad_calloc((size_t)c->n_attn + 1, sizeof(float *), err);
        to->V = squad_calloc((size_t)c->n_attn + 1, sizeof(float *), err);
        if (!to->gdn_state || !to->K || !to->V) {
            squad_aligned_free(to->gdn_state);
            free(to->K);
            free(to->V);
            memset(to, 0, sizeof *to);
            return squad_fail(err, SQUAD_E_NOMEM, "out of memory for sequence slot %d", seq);
        }
        memset(to->gdn_state, 0, c->base.gdn_snapshot_bytes);
    }
    cpu_seq *from = &c->seqs[c->active];
    from->gdn_state = c->gdn_state;
    from->K = c->K;
    from->V = c->V;
    from->kv_capacity = c->kv_capacity;
    c->gdn_state = to->gdn_state;
    c->K = to->K;
    c->V = to->V;
    c->kv_capacity = to->kv_capacity;
    c->active = seq;
    return 0;
}

static int cpu_reset(squad_backend *be, int seq, squad_err *err) {
    cpu_backend *c = impl_of(be);
    int rc = select_seq(c, seq, err);
    if (rc) return rc;
    memset(c->gdn_state, 0, sizeof(float) * c->gdn_layer_floats * (size_t)c->n_gdn);
    return 0;
}

static int cpu_save_gdn(squad_backend *be, int seq, void *dst, squad_err *err) {
    int rc = select_seq(impl_of(be), seq, err);
    if (rc) return rc;
    memcpy(dst, impl_of(be)->gdn_state, be->gdn_snapshot_bytes);
    return 0;
}

static int cpu_load_gdn(squad_backend *be, int seq, const void *src, squad_err *err) {
    int rc = select_seq(impl_of(be), seq, err);
    if (rc) return rc;
    memcpy(impl_of(be)->gdn_state, src, be->gdn_snapshot_bytes);
    return 0;
}

static int cpu_save_kv(squad_backend *be, int seq, void *dst, int n, squad_err *err) {
    cpu_backend *c = impl_of(be);
    int rc = select_seq(c, seq, err);
    if (rc) return rc;
    if (n < 0 || n > c->kv_capacity) return squad_fail(err, SQUAD_E_INVALID, "save_kv: %d positions not held", n);
    size_t bytes = sizeof(float) * (size_t)kv_dim(c) * (size_t)n;
    char *p = dst;
    for (int la = 0; la < c->n_attn; la++) {
        memcpy(p, c->K[la], bytes);
        p += bytes;
        memcpy(p, c->V[la], bytes);
        p += bytes;
    }
    return 0;
}

static int cpu_load_kv(squad_backend *be, int seq, const void *src, int blob_positions, int n, squad_err *err) {
    cpu_backend *c = impl_of(be);
    if (n < 0 || n > blob_positions) return squad_fail(err, SQUAD_E_INVALID, "load_kv: %d of %d positions", n, blob_positions);
    int rc = select_seq(c, seq, err);
    if (rc) return rc;
    rc = ensure_kv_capacity(c, n, err);
    if (rc) return rc;
    size_t stride = sizeof(float) * (size_t)kv_dim(c) * (size_t)blob_positions;
    size_t bytes = sizeof(float) * (size_t)kv_dim(c) * (size_t)n;
    const char *p = src;
    for (int la = 0; la < c->n_attn; la++) {
        memcpy(c->K[la], p, bytes);
        p += stride;
        memcpy(c->V[la], p, bytes);
        p += stride;
    }
    return 0;
}

/* ---- the forward ----------------------------------------------------------------------------- */

static void gemm(cpu_backend *c, float *y, const float *x, const squad_mat *W, int T, int accumulate) {
    cpu_gemm_bf16(c->pool, y, x, W->w, T, W->rows, W->cols, accumulate, c->prec);
}

typedef struct lora_task {
    const squad_lora_proj *p;
    float scale;
    float *y;
    const float *x;
    int T;
} lora_task;

static void lora_task_run(void *ctx, int task, int n_tasks) {
    const lora_task *l = ctx;
    const int t1 = (task + 1) * CPU_LORA_TOKENS < l->T ? (task + 1) * CPU_LORA_TOKENS : l->T;
    for (int t = task * CPU_LORA_TOKENS; t < t1; t++)
        squad_lora_apply_ref(l->p, l->scale, l->x + (size_t)t * l->p->in, l->y + (size_t)t * l->p->out);
}

/* A projection of the running layer: y = W x (or y += W x), then the running adapter's low-rank
 * term when it adapts this projection. */
static void proj(cpu_backend *c, float *y, const float *x, const squad_mat *W, int T, int accumulate, int proj_id) {
    gemm(c, y, x, W, T, accumulate);
    const squad_adapter *a = c->lora_adapter;
    if (!a) return;
    const squad_lora_proj *p = &a->proj[c->lora_layer][proj_id];
    if (!p->A) return;
    lora_task l = {p, a->scale, y, x, T};
    cpu_pool_run(c->pool, lora_task_run, &l, (T + CPU_LORA_TOKENS - 1) / CPU_LORA_TOKENS);
}

typedef struct delta_task {
    cpu_backend *c;
    float *S;
    int T;
} delta_task;

static void delta_task_run(void *ctx, int task, int n_tasks) {
    delta_task *d = ctx;
    const squad_config *cfg = &d->c->m->cfg;
    int nv = cfg->lin_num_v_heads;
    int h0 = (int)((long)nv * task / n_tasks), h1 = (int)((long)nv * (task + 1) / n_tasks);
    op_delta_rule(d->c->o, d->S, d->c->conv_out, d->c->g, d->c->beta, d->T, squad_config_gdn_channels(cfg),
                  cfg->lin_num_k_heads, nv, cfg->lin_k_dim, cfg->lin_v_dim, h0, h1);
}

/* h += GatedDeltaNet(x) for one chunk, continuing from the layer's state. */
static void gdn_layer(cpu_backend *c, const squad_layer_weights *L, int slot, int T) {
    const squad_config *cfg = &c->m->cfg;
    int C = squad_config_gdn_channels(cfg), K = cfg->conv_kernel;
    int nv = cfg->lin_num_v_heads, dv = cfg->lin_v_dim;
    float *S = c->gdn_state + c->gdn_layer_floats * (size_t)slot;
    float *conv_state = S + (size_t)nv * cfg->lin_k_dim * dv;

    proj(c, c->qkv, c->x, &L->in_qkv, T, 0, SQUAD_PROJ_IN_QKV);
    proj(c, c->z, c->x, &L->in_z, T, 0, SQUAD_PROJ_IN_Z);
    proj(c, c->gate_b, c->x, &L->in_b, T, 0, SQUAD_PROJ_IN_B);
    proj(c, c->gate_a, c->x, &L->in_a, T, 0, SQUAD_PROJ_IN_A);
    op_conv_silu(c->conv_out, c->qkv, conv_state, c->conv_kc[slot], T, C, K);
    op_qk_l2norm(c->conv_out, T, C, cfg->lin_num_k_heads, cfg->lin_k_dim);
    op_gdn_gates(c->g, c->beta, c->gate_a, c->gate_b, L->A_log, L->dt_bias, T, nv);

    delta_task d = {c, S, T};
    int tasks = cpu_pool_threads(c->pool) < nv ? cpu_pool_threads(c->pool) : nv;
    cpu_pool_run(c->pool, delta_task_run, &d, tasks);

    op_gated_rmsnorm(c->o, c->z, L->gdn_norm, T, nv, dv, cfg->rms_eps);
    proj(c, c->h, c->o, &L->out_proj, T, 1, SQUAD_PROJ_OUT);
}

typedef struct attn_task {
    cpu_backend *c;
    int slot, T, pos0, n_blocks;
} attn_task;

/* One task: one kv head's group of query heads over one block of query tokens. */
static void attn_task_run(void *ctx, int task, int n_tasks, int thread) {
    attn_task *a = ctx;
    const squad_config *cfg = &a->c->m->cfg;
    int nh = cfg->num_heads, hd = cfg->head_dim;
    int kvh = task / a->n_blocks, blk = task % a->n_blocks;
    int t0 = blk * CPU_ATTN_QUERY_BLOCK, t1 = t0 + CPU_ATTN_QUERY_BLOCK < a->T ? t0 + CPU_ATTN_QUERY_BLOCK : a->T;
    op_attention_group(a->c->att, a->c->qg, nh * 2 * hd, 2 * hd, a->c->K[a->slot], a->c->V[a->slot], a->pos0, nh,
                       cfg->num_kv_heads, hd, kvh, t0, t1, a->c->attn_scratch + a->c->attn_scratch_floats * thread);
}

/* h += GatedAttention(x) for one chunk at positions [pos0, pos0 + T). */
static void attn_layer(cpu_backend *c, const squad_layer_weights *L, int slot, int T, int pos0) {
    const squad_config *cfg = &c->m->cfg;
    int nh = cfg->num_heads, nkv = cfg->num_kv_heads, hd = cfg->head_dim;
    int q_stride = nh * 2 * hd, kvd = nkv * hd;

    proj(c, c->qg, c->x, &L->q_proj, T, 0, SQUAD_PROJ_Q);
    proj(c, c->kk, c->x, &L->k_proj, T, 0, SQUAD_PROJ_K);
    proj(c, c->vv, c->x, &L->v_proj, T, 0, SQUAD_PROJ_V);
    for (int j = 0; j < nh; j++) op_head_rmsnorm_zc(c->qg + (long)j * 2 * hd, L->q_norm, T, 1, hd, q_stride, cfg->rms_eps);
    op_head_rmsnorm_zc(c->kk, L->k_norm, T, nkv, hd, kvd, cfg->rms_eps);
    op_rope(c->qg, c->inv_freq, T, pos0, nh, 2 * hd, q_stride, cfg->rotary_dim);
    op_rope(c->kk, c->inv_freq, T, pos0, nkv, hd, kvd, cfg->rotary_dim);
    memcpy(c->K[slot] + (long)pos0 * kvd, c->kk, sizeof(float) * (size_t)T * (size_t)kvd);
    memcpy(c->V[slot] + (long)pos0 * kvd, c->vv, sizeof(float) * (size_t)T * (size_t)kvd);

    attn_task a = {c, slot, T, pos0, (T + CPU_ATTN_QUERY_BLOCK - 1) / CPU_ATTN_QUERY_BLOCK};
    cpu_pool_run_indexed(c->pool, attn_task_run, &a, nkv * a.n_blocks);

    op_sigmoid_gate(c->att, c->qg + hd, T, nh, hd, q_stride, 2 * hd);
    proj(c, c->h, c->att, &L->o_proj, T, 1, SQUAD_PROJ_O);
}

/* h += MLP(x) */
static void mlp_block(cpu_backend *c, const squad_layer_weights *L, int T) {
    int I = c->m->cfg.intermediate_size;
    proj(c, c->mlp_gate, c->x, &L->mlp_gate, T, 0, SQUAD_PROJ_GATE);
    proj(c, c->mlp_up, c->x, &L->mlp_up, T, 0, SQUAD_PROJ_UP);
    op_silu_mul(c->mlp_gate, c->mlp_up, (long)T * I);
    proj(c, c->h, c->mlp_gate, &L->mlp_down, T, 1, SQUAD_PROJ_DOWN);
}

/* ---- the full-vocabulary figures ------------------------------------------------------------- */

static const vocab_acc VOCAB_EMPTY = {-INFINITY, 0.0, -1};

/* a and b reduced over the union of their logits (the lowest id wins a tie). */
static vocab_acc vocab_merge(vocab_acc a, vocab_acc b) {
    if (b.arg < 0) return a;
    if (a.arg < 0) return b;
    vocab_acc r;
    r.max = a.max > b.max ? a.max : b.max;
    r.arg = a.max > b.max || (a.max == b.max && a.arg < b.arg) ? a.arg : b.arg;
    r.sum = a.sum * exp((double)a.max - r.max) + b.sum * exp((double)b.max - r.max);
    return r;
}

typedef struct vocab_task {
    cpu_backend *c;
    int n_slots, v0, nb; /* the step: vocabulary rows [v0, v0 + nb) */
} vocab_task;

/* One task: one slot's piece of the step's logits. */
static void vocab_task_run(void *ctx, int task, int n_tasks) {
    const vocab_task *t = ctx;
    const int s = task / CPU_VOCAB_PIECES, piece = task % CPU_VOCAB_PIECES;
    const int i0 = (int)((long)t->nb * piece / CPU_VOCAB_PIECES), i1 = (int)((long)t->nb * (piece + 1) / CPU_VOCAB_PIECES);
    const float *z = t->c->vocab_z + (size_t)s * t->nb;
    vocab_acc a = VOCAB_EMPTY;
    for (int i = i0; i < i1; i++)
        if (z[i] > a.max || a.arg < 0) a.max = z[i], a.arg = t->v0 + i;
    if (a.arg >= 0) {
        a.sum = 0.0;
        for (int i = i0; i < i1; i++) a.sum += (double)expf(z[i] - a.max);
    }
    t->c->vocab_parts[task] = a;
}

/* The final-normed row of h at token t, as op_letter_probs computes it (the same floats). */
static void final_norm_row(float *xn, const float *h, const float *w, int H, float eps) {
    double ss = 0.0;
    for (int i = 0; i < H; i++) ss += (double)h[i] * h[i];
    const float inv = 1.0f / sqrtf((float)(ss / H) + eps);
    for (int i = 0; i < H; i++) xn[i] = h[i] * inv * (1.0f + w[i]);
}

/* log-sum-exp of the letter logits of a slot, in op_letter_probs' arithmetic (double sums). */
static float letters_lse(const float *xn, const uint16_t *E, int H, const int32_t *letters, int n) {
    double logit[SQUAD_MAX_LETTERS], mx = -INFINITY;
    for (int l = 0; l < n; l++) {
        const uint16_t *e = E + (long)letters[l] * H;
        double d = 0.0;
        for (int i = 0; i < H; i++) d += (double)xn[i] * squad_bf16_to_f32(e[i]);
        logit[l] = d;
        if (d > mx) mx = d;
    }
    double sum = 0.0;
    for (int l = 0; l < n; l++) sum += exp(logit[l] - mx);
    return (float)(mx + log(sum));
}

/* Fills ck->vocab for the chunk's slots from h (the chunk's residual stream). */
static void vocab_figures(cpu_backend *c, const squad_chunk *ck) {
    const squad_model *m = c->m;
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size, n = ck->n_slots;
    for (int s = 0; s < n; s++) {
        float *xn = c->vocab_xn + (size_t)s * H;
        final_norm_row(xn, c->h + (long)ck->slots[s] * H, m->final_norm, H, m->cfg.rms_eps);
        const int nl = ck->nopts[s] < ck->n_letters ? ck->nopts[s] : ck->n_letters;
        ck->vocab[s].letters_lse = letters_lse(xn, m->lm_head.w, H, ck->letters, nl);
    }
    vocab_acc acc[SQUAD_MAX_SLOTS_PER_ROW];
    for (int s = 0; s < n; s++) acc[s] = VOCAB_EMPTY;
    for (int v0 = 0; v0 < V; v0 += CPU_VOCAB_BLOCK) {
        vocab_task t = {c, n, v0, V - v0 < CPU_VOCAB_BLOCK ? V - v0 : CPU_VOCAB_BLOCK};
        cpu_gemm_bf16(c->pool, c->vocab_z, c->vocab_xn, m->lm_head.w + (size_t)v0 * H, n, t.nb, H, 0, CPU_GEMM_EXACT);
        cpu_pool_run(c->pool, vocab_task_run, &t, n * CPU_VOCAB_PIECES);
        for (int s = 0; s < n; s++)
            for (int p = 0; p < CPU_VOCAB_PIECES; p++) acc[s] = vocab_merge(acc[s], c->vocab_parts[s * CPU_VOCAB_PIECES + p]);
    }
    for (int s = 0; s < n; s++) {
        ck->vocab[s].vocab_lse = (float)((double)acc[s].max + log(acc[s].sum));
        ck->vocab[s].top_logit = acc[s].max;
        ck->vocab[s].top_token = acc[s].arg;
    }
}

int squad_cpu_backend_hidden(const squad_backend *be, int t, float *out, squad_err *err) {
    if (!be || !be->name || strcmp(be->name, "cpu") != 0)
        return squad_fail(err, SQUAD_E_INVALID, "not a CPU backend");
    const cpu_backend *c = (const cpu_backend *)be;
    if (t < 0 || t >= c->last_len) return squad_fail(err, SQUAD_E_INVALID, "token %d is outside the last chunk", t);
    const int H = c->m->cfg.hidden_size;
    memcpy(out, c->h + (long)t * H, sizeof(float) * (size_t)H);
    return 0;
}

static int forward_one(squad_backend *be, const squad_chunk *ck, squad_err *err) {
    cpu_backend *c = impl_of(be);
    float *probs = ck->probs;
    const squad_model *m = c->m;
    const squad_config *cfg = &m->cfg;
    int T = ck->len, H = cfg->hidden_size;
    if (T < 1 || T > be->max_chunk)
        return squad_fail(err, SQUAD_E_INVALID, "chunk of %d tokens (1..%d)", T, be->max_chunk);
    if (ck->start < 0 || ck->start + T > be->max_context)
        return squad_fail(err, SQUAD_E_INVALID, "chunk [%d, %d) is past the longest supported row (%d)", ck->start,
                          ck->start + T, be->max_context);
    const squad_specialists *sp = c->sp;
    if (ck->route != 0 && (!sp || ck->route < 0 || ck->route >= sp->router.n_labels))
        return squad_fail(err, SQUAD_E_INVALID, "route %d: the backend has %d routes", ck->route,
                          sp ? sp->router.n_labels : 1);
    if (ck->router_sum && !sp) return squad_fail(err, SQUAD_E_INVALID, "router features asked without specialists");
    int rc = select_seq(c, ck->seq, err);
    if (rc) return rc;
    rc = ensure_kv_capacity(c, ck->start + T, err);
    if (rc) return rc;

    for (int t = 0; t < T; t++) {
        int id = ck->ids[t];
        if (id < 0 || id >= cfg->vocab_size)
            return squad_fail(err, SQUAD_E_INVALID, "token id %d is outside the vocabulary (0..%d)", id,
                              cfg->vocab_size - 1);
        const uint16_t *e = m->embed.w + (long)id * H;
        float *hr = c->h + (long)t * H;
        for (int i = 0; i < H; i++) hr[i] = squad_bf16_to_f32(e[i]);
    }
    for (int l = 0; l < cfg->num_layers; l++) {
        const squad_layer_weights *L = &m->layers[l];
        if (ck->router_sum && l == sp->router.layer) {
            memset(ck->router_sum, 0, sizeof(double) * (size_t)H);
            for (int t = 0; t < T; t++) squad_router_norm_add(ck->router_sum, c->h + (long)t * H, H, sp->router.eps);
        }
        c->lora_adapter = sp && ck->route > 0 && l >= sp->split ? &sp->adapters[ck->route] : NULL;
        c->lora_layer = l;
        op_rmsnorm_zc(c->x, c->h, L->input_norm, T, H, cfg->rms_eps);
        if (L->kind == SQUAD_LAYER_LINEAR)
            gdn_layer(c, L, c->slot_of_layer[l], T);
        else
            attn_layer(c, L, c->slot_of_layer[l], T, ck->start);
        op_rmsnorm_zc(c->x, c->h, L->post_norm, T, H, cfg->rms_eps);
        mlp_block(c, L, T);
    }
    c->lora_adapter = NULL;
    for (int s = 0; s < ck->n_slots; s++) {
        int t = ck->slots[s];
        if (t < 0 || t >= T) return squad_fail(err, SQUAD_E_INVALID, "slot %d outside the chunk", t);
        op_letter_probs(probs + (long)s * SQUAD_MAX_LETTERS, c->h + (long)t * H, m->final_norm, cfg->rms_eps,
                        m->lm_head.w, H, ck->letters, ck->n_letters, ck->nopts[s]);
    }
    c->last_len = T;
    if (ck->vocab && ck->n_slots > 0) vocab_figures(c, ck);
    return 0;
}

/* A batch: validated as a whole (distinct slots, the token budget), then chunk by chunk. */
static int cpu_forward(squad_backend *be, const squad_chunk *chunks, int n_chunks, squad_err *err) {
    if (n_chunks < 1 || n_chunks > be->max_seqs)
        return squad_fail(err, SQUAD_E_INVALID, "a batch of %d chunks (1..%d)", n_chunks, be->max_seqs);
    long tokens = 0;
    for (int i = 0; i < n_chunks; i++) {
        const squad_chunk *ck = &chunks[i];
        if (ck->seq < 0 || ck->seq >= be->max_seqs)
            return squad_fail(err, SQUAD_E_INVALID, "sequence slot %d (the backend has %d)", ck->seq, be->max_seqs);
        for (int j = 0; j < i; j++)
            if (chunks[j].seq == ck->seq)
                return squad_fail(err, SQUAD_E_INVALID, "sequence slot %d twice in one batch", ck->seq);
        if (ck->n_slots > 0 && !ck->probs) return squad_fail(err, SQUAD_E_INVALID, "a chunk with slots and no probs");
        tokens += ck->len;
    }
    if (tokens > be->max_batch_tokens)
        return squad_fail(err, SQUAD_E_INVALID, "a batch of %ld tokens (at most %d)", tokens, be->max_batch_tokens);
    for (int i = 0; i < n_chunks; i++) {
        int rc = forward_one(be, &chunks[i], err);
        if (rc) return rc;
    }
    return 0;
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

static void cpu_destroy(squad_backend *be) {
    if (!be) return;
    cpu_backend *c = impl_of(be);
    cpu_pool_free(c->pool);
    if (c->seqs) {
        cpu_seq *act = &c->seqs[c->active];
        act->gdn_state = c->gdn_state;
        act->K = c->K;
        act->V = c->V;
        for (int q = 0; q < c->base.max_seqs; q++) {
            cpu_seq *sq = &c->seqs[q];
            squad_aligned_free(sq->gdn_state);
            for (int la = 0; la < c->n_attn; la++) {
                if (sq->K) free(sq->K[la]);
                if (sq->V) free(sq->V[la]);
            }
            free(sq->K);
            free(sq->V);
        }
        free(c->seqs);
    }
    for (int lg = 0; c->conv_kc && lg < c->n_gdn; lg++) free(c->conv_kc[lg]);
    free(c->conv_kc);
    free(c->inv_freq);
    squad_aligned_free(c->attn_scratch);
    squad_aligned_free(c->vocab_xn);
    squad_aligned_free(c->vocab_z);
    float **scratch[] = {&c->h, &c->x, &c->qkv, &c->conv_out, &c->z, &c->gate_a, &c->gate_b, &c->g, &c->beta,
                         &c->o, &c->qg, &c->kk, &c->vv, &c->att, &c->mlp_gate, &c->mlp_up};
    for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++) squad_aligned_free(*scratch[i]);
    free(c);
}

static float *scratch_rows(int width, squad_err *err) {
    return squad_aligned_alloc(sizeof(float) * (size_t)CPU_MAX_CHUNK * (size_t)(width > 0 ? width : 1), err);
}

squad_backend *squad_cpu_backend_new(const squad_model *model, const squad_engine_opts *opts, int max_context,
                                     squad_err *err) {
    const squad_config *cfg = &model->cfg;
    if (cfg->lin_v_dim > OP_MAX_HEAD_DIM) {
        squad_fail(err, SQUAD_E_UNSUPPORTED, "linear_value_head_dim %d is larger than the CPU backend supports (%d)",
                   cfg->lin_v_dim, OP_MAX_HEAD_DIM);
        return NULL;
    }
    cpu_backend *c = squad_calloc(1, sizeof *c, err);
    if (!c) return NULL;
    c->m = model;
    c->prec = opts && opts->precision == SQUAD_PRECISION_BF16 ? CPU_GEMM_FAST : CPU_GEMM_EXACT;
    squad_backend *be = &c->base;
    be->name = "cpu";
    be->model = model;
    be->max_context = max_context;
    be->max_chunk = CPU_MAX_CHUNK;
    be->max_batch_tokens = CPU_MAX_CHUNK;
    be->mixed_routes = 1;
    be->max_seqs = opts && opts->max_rows > 0 ? opts->max_rows : CPU_DEFAULT_SEQS;
    be->alloc = cpu_alloc;
    be->release = cpu_release;
    be->reset = cpu_reset;
    be->save_gdn = cpu_save_gdn;
    be->load_gdn = cpu_load_gdn;
    be->save_kv = cpu_save_kv;
    be->load_kv = cpu_load_kv;
    be->forward = cpu_forward;
    be->destroy = cpu_destroy;
    be->impl = c;
    if (opts && opts->specialists) {
        const squad_specialists *sp = opts->specialists;
        if (sp->hidden != cfg->hidden_size || sp->n_layers != cfg->num_layers) {
            squad_fail(err, SQUAD_E_INVALID, "specialists %s were loaded for another model (%d layers of %d, not %d of %d)",
                       sp->dir, sp->n_layers, sp->hidden, cfg->num_layers, cfg->hidden_size);
            free(c);
            return NULL;
        }
        c->sp = sp;
        be->specialists = 1;
    }

    for (int l = 0; l < cfg->num_layers; l++)
        c->slot_of_layer[l] = cfg->layer_types[l] == SQUAD_LAYER_LINEAR ? c->n_gdn++ : c->n_attn++;
    int C = squad_config_gdn_channels(cfg);
    c->gdn_layer_floats = (size_t)cfg->lin_num_v_heads * cfg->lin_k_dim * cfg->lin_v_dim +
                          (size_t)(cfg->conv_kernel - 1) * (size_t)C;
    be->gdn_snapshot_bytes = sizeof(float) * c->gdn_layer_floats * (size_t)c->n_gdn;
    be->kv_bytes_per_pos = 2 * sizeof(float) * (size_t)kv_dim(c) * (size_t)c->n_attn;
    be->max_context = context_bound(max_context, be->kv_bytes_per_pos);
    if (be->max_context < 1) {
        squad_fail(err, SQUAD_E_NOMEM, "host memory cannot hold the K / V of one position");
        goto fail;
    }

    c->pool = cpu_pool_new(opts ? opts->threads : 0, err);
    if (!c->pool) goto fail;
    if (cpu_gemm_reserve(c->pool, CPU_MAX_CHUNK,
                         cfg->intermediate_size > cfg->hidden_size ? cfg->intermediate_size : cfg->hidden_size, err))
        goto fail;
    c->seqs = squad_calloc((size_t)be->max_seqs, sizeof(cpu_seq), err);
    if (!c->seqs) goto fail;
    c->gdn_state = squad_aligned_alloc(be->gdn_snapshot_bytes ? be->gdn_snapshot_bytes : 1, err);
    c->K = squad_calloc((size_t)c->n_attn + 1, sizeof(float *), err);
    c->V = squad_calloc((size_t)c->n_attn + 1, sizeof(float *), err);
    c->inv_freq = squad_calloc((size_t)cfg->rotary_dim / 2 + 1, sizeof(float), err);
    if (!c->gdn_state || !c->K || !c->V || !c->inv_freq) goto fail;
    op_rope_inv_freq(c->inv_freq, cfg->rope_theta, cfg->rotary_dim);
    c->attn_scratch_floats = op_attention_scratch_floats(cfg->num_heads, cfg->num_kv_heads, cfg->head_dim,
                                                         CPU_ATTN_QUERY_BLOCK);
    c->attn_scratch = squad_aligned_alloc(sizeof(float) * (size_t)c->attn_scratch_floats *
                                              (size_t)cpu_pool_threads(c->pool), err);
    if (!c->attn_scratch) goto fail;
    c->conv_kc = squad_calloc((size_t)c->n_gdn + 1, sizeof(float *), err);
    if (!c->conv_kc) goto fail;
    for (int l = 0; l < cfg->num_layers; l++) {
        if (cfg->layer_types[l] != SQUAD_LAYER_LINEAR) continue;
        float *w = squad_calloc((size_t)C * (size_t)cfg->conv_kernel, sizeof(float), err);
        if (!w) goto fail;
        op_conv_weights_kc(w, model->layers[l].conv_w, C, cfg->conv_kernel);
        c->conv_kc[c->slot_of_layer[l]] = w;
    }

    int H = cfg->hidden_size, I = cfg->intermediate_size, nv = cfg->lin_num_v_heads, dv = cfg->lin_v_dim;
    int nh = cfg->num_heads, hd = cfg->head_dim, kvd = kv_dim(c);
    struct {
        float **p;
        int width;
    } plan[] = {{&c->h, H},          {&c->x, H},         {&c->qkv, C},          {&c->conv_out, C},
                {&c->z, nv * dv},    {&c->gate_a, nv},   {&c->gate_b, nv},      {&c->g, nv},
                {&c->beta, nv},      {&c->o, nv * dv},   {&c->qg, nh * 2 * hd}, {&c->kk, kvd},
                {&c->vv, kvd},       {&c->att, nh * hd}, {&c->mlp_gate, I},     {&c->mlp_up, I}};
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++)
        if (!(*plan[i].p = scratch_rows(plan[i].width, err))) goto fail;
    c->vocab_xn = squad_aligned_alloc(sizeof(float) * SQUAD_MAX_SLOTS_PER_ROW * (size_t)H, err);
    c->vocab_z = squad_aligned_alloc(sizeof(float) * SQUAD_MAX_SLOTS_PER_ROW * (size_t)CPU_VOCAB_BLOCK, err);
    if (!c->vocab_xn || !c->vocab_z) goto fail;
    return be;
fail:
    cpu_destroy(be);
    return NULL;
}
