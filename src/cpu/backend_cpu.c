/*
 * backend_cpu.c — the CPU backend (src/backend.h): the reference forward on fp32 activations with
 * the bf16 weights kept in bf16, spread over a thread pool, for a batch of chunks of several rows.
 *
 * Sequence slots. Each slot is a cpu_seq that the forward reads and writes directly:
 *   gdn   [n_gdn] x { S [nv][dk][dv] fp32, conv inputs [K-1][C] fp32 }  (= one save_gdn blob),
 *         allocated (zeroed) on the slot's first use;
 *   K / V of every attention layer in two pieces: positions [0, own0) read in place from the blob
 *         the last load_kv named (backend.h keeps it valid until the slot's next reset / load_kv),
 *         positions from own0 on in the slot's own arrays [cap][nkv hd] fp32 per layer. own0 is
 *         the restored length rounded down to a key tile (OP_ATTN_KEY_TILE), the few positions
 *         between it and the restored length copied, so no attention tile straddles the pieces
 *         (op_kv). A hit on a long cached state thus costs its question's K / V, not a copy of the
 *         state's (on the 0.8B shapes, 96 MiB per 4096 positions).
 * A save_kv blob is [n_attn][K then V][n][nkv hd]; save_kv concatenates the two pieces.
 *
 * Memory follows the rows: a slot's own K / V grows to what a chunk needs, in multiples of
 * CPU_KV_STEP positions and by at least half of what it holds (a long row reallocates a few
 * times, not once per chunk); a reset or a load_kv gives memory back when the slot holds
 * CPU_KV_SHRINK_RATIO times what it then needs and the excess is at least CPU_KV_SHRINK_BYTES
 * (a slot that cycles between rows of similar length keeps its arrays; one that served a long row
 * returns them). be->kv_positions is the sum of the slots' own capacities.
 *
 * The batched forward. The chunks' tokens are packed into one token dimension (chunk i at rows
 * [off_i, off_i + len_i), T = sum of lengths <= max_batch_tokens): the embedding, the norms,
 * every projection and the MLP run once over all T rows (one GEMM each); the GDN conv and delta
 * rule run per chunk from its own slot, and attention per chunk over its own [cached K / V |
 * chunk], as pool tasks over (chunk, head group) and (chunk, kv head, query block). The per-token
 * ops (norms, gates, SiLU, RoPE at each token's own position) are spread over the pool in blocks
 * of tokens. Every token's arithmetic is the same whatever else is in the batch: the packed GEMM
 * sums each output in one fixed order for any T, the per-chunk ops see only their chunk, and the
 * per-token ops work row by row; chunks of at most CPU_GEMM_DOT_MAX_T tokens, which alone take
 * the GEMM's DOT form, are packed last and take it in the batch too (layer_gemm). So a chunk's
 * answers and new state equal those of the chunk run alone bit for bit, in both precisions.
 *
 * The delta rule runs token by token (op_delta_rule): its result does not depend on where chunks
 * start, so any split of a row gives bit-for-bit the same state; the blocked WY form
 * (op_delta_rule_chunked, what the GPU runs) differs by round-off with the block boundaries, and it
 * is only a few per cent of the CPU's time either way.
 *
 * Scratch activations are sized for max_batch_tokens rows once, at creation, so a forward
 * allocates nothing unless a slot's K / V grows. The projections that end a block (out_proj,
 * o_proj, down_proj) accumulate straight into the residual stream h.
 *
 * Full-vocabulary figures (chunks with vocab): the slots' final-normed rows of every such chunk of
 * the batch times the output embedding, one step of CPU_VOCAB_BLOCK vocabulary rows at a time for
 * all those slots together (one GEMM, so each embedding row is read once per batch), each step's
 * logits reduced at once into a running (max, sum of exp, argmax) per slot; only one step's logits
 * exist at any time. The logits are fp32 products (the exact GEMM, always its DOT form, whose sums
 * do not depend on how many rows ride along) in both precisions: the letter logits the
 * probabilities come from are fp32 too, and the two must agree (label_mass is their ratio).
 *
 * Specialists (opts->specialists): in the layers from `split` on, every projection a chunk's route
 * adapts gets its low-rank term right after the shared GEMM, y[t] += s B (A x[t]) over that
 * chunk's rows only: double sums over the adapter's fp32 weights, a block of tokens at a time
 * (cpu_lora_apply, src/cpu/lora.c; within rounding of squad_lora_apply_ref, and each token's
 * result independent of the rows beside it). Chunks of different routes share one batch
 * (mixed_routes): the shared weights are never touched. Each chunk's router sum is taken from its rows of h as they enter router.layer.
 *
 * Images (docs/images.md): a chunk's embeds replace the embedding of its <|image_pad|> tokens, row
 * by row in token order (embed_src points each packed row at its source); its positions drive the
 * rotary per token with the frequencies' axes of op_mrope_axes (transformers' interleaved M-RoPE).
 * A chunk without positions takes op_rope at start + t exactly as before.
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
#include "lora.h"
#include "ops.h"
#include "pool.h"
#include "vision.h"

/* The longest chunk this backend runs at once; longer spans are split by the engine. */
#define CPU_MAX_CHUNK 512
/* The most tokens of one batch, all its chunks together (the scratch activations' rows): room for a
 * full chunk and the questions riding with it. It buys no CPU time past 512 (the GEMM works in
 * blocks of at most 512 tokens; 8 hits of 128 tokens on the 0.8B shapes took the same CPU time as
 * one batch of 1024 and as two of 512), and its scratch rows cost resident memory only once a
 * batch that large runs. */
#define CPU_MAX_BATCH_TOKENS 1024
/* Query tokens per attention task (with the kv head's whole group of query heads). */
#define CPU_ATTN_QUERY_BLOCK 16
/* A slot's own K / V grows in multiples of this many positions (and by at least half its size). */
#define CPU_KV_STEP 256
/* A reset / load_kv shrinks a slot's own K / V to what it needs when it holds at least this many
 * times that (in steps) ... */
#define CPU_KV_SHRINK_RATIO 4
/* ... and the excess is at least this many bytes: small arrays are kept for the next row. */
#define CPU_KV_SHRINK_BYTES ((size_t)64 << 20)
/* The working K / V of one row at max_context may take at most this fraction (1 / N) of the host's
 * physical memory; a longer max_context is lowered to fit (the weights, checkpoints and the rest
 * of the process need the remainder). */
#define CPU_KV_MEMORY_SHARE 2
/* Vocabulary rows per step of the full-vocabulary pass (logits kept: rows x this many floats). */
#define CPU_VOCAB_BLOCK 4096
/* Reduction tasks per slot and step (each one's part of the step's logits). */
#define CPU_VOCAB_PIECES 8
/* Slot rows one full-vocabulary pass takes (a batch with more makes several passes). */
#define CPU_VOCAB_ROWS SQUAD_MAX_SLOTS_PER_ROW
/* Sequence slots when the engine's options do not say (squad_engine_opts.max_rows). */
#define CPU_DEFAULT_SEQS 8
/* Tokens per task of the LoRA low-rank product. */
#define CPU_LORA_TOKENS 16
/* Tokens per task of the per-token ops (norms, gates, SiLU, RoPE). */
#define CPU_ROW_TOKENS 16

/* A running reduction of logits: their maximum, the sum of exp(z - max), the maximum's lowest id. */
typedef struct vocab_acc {
    float max;
    double sum;
    int32_t arg;
} vocab_acc;

/* One sequence slot's working state (see the top of the file). */
typedef struct cpu_seq {
    float *gdn;        /* [n_gdn][gdn_layer_floats]; NULL until the slot is first used */
    float **K, **V;    /* [n_attn] -> [cap][nkv hd]: positions [own0, own0 + cap) */
    int own0, cap;     /* own0: a multiple of OP_ATTN_KEY_TILE */
    const float *blob; /* positions [0, own0) read in place: a save_kv blob of blob_positions */
    int blob_positions;
    int n_pos; /* positions [0, n_pos) hold the row's K / V (what save_kv may save) */
} cpu_seq;

typedef struct cpu_backend {
    squad_backend base; /* first: a squad_backend * is a cpu_backend * */
    const squad_model *m;
    cpu_pool *pool;
    cpu_gemm_precision prec;
    int n_gdn, n_attn;
    int slot_of_layer[SQUAD_MAX_LAYERS]; /* index among the layers of its kind */
    size_t gdn_layer_floats;             /* S + conv floats of one GDN layer */
    cpu_seq *seqs;                       /* [max_seqs] */
    float *inv_freq;                     /* [rd/2] */
    unsigned char *rope_axis;            /* [rd/2]: the M-RoPE axis of each frequency */
    int mrope_ok;                        /* the config's mrope_section fits the rotary (positions allowed) */
    float **conv_kc;                     /* [n_gdn] -> conv weights transposed to [K][C] */
    float *attn_scratch;                 /* per thread, attn_scratch_floats each */
    long attn_scratch_floats;
    /* scratch, [max_batch_tokens] rows each */
    float *h, *x, *qkv, *conv_out, *z, *gate_a, *gate_b, *g, *beta, *o, *qg, *kk, *vv, *att, *mlp_gate, *mlp_up;
    int *pos;          /* [max_batch_tokens]: each row's absolute position in its row */
    int *chunk_of_row; /* [max_batch_tokens]: the chunk each row belongs to */
    const float **embed_src; /* [max_batch_tokens]: an image row's embedding (chunk embeds), else NULL */
    /* the running batch: its chunks, each one's first row, slot and (for the running layer) adapter;
     * first_task: per chunk, its first task of the running per-chunk pool job (prefix sums) */
    const squad_chunk *ck;
    int n_chunks, T;
    int T_long; /* rows of the chunks longer than CPU_GEMM_DOT_MAX_T (packed first) */
    int *off;
    cpu_seq **cseq;
    const squad_adapter **lora;
    int *first_task;
    int lora_layer;
    int last_off, last_len; /* the first chunk of the last batch: rows [last_off, + last_len) of h */
    /* the full-vocabulary pass: normed slot rows [CPU_VOCAB_ROWS][H], one step's logits
     * [CPU_VOCAB_ROWS][CPU_VOCAB_BLOCK], the reduction tasks' results */
    float *vocab_xn, *vocab_z;
    vocab_acc vocab_parts[CPU_VOCAB_ROWS * CPU_VOCAB_PIECES];
    /* specialists: the adapters (borrowed) */
    const squad_specialists *sp;
} cpu_backend;

static cpu_backend *impl_of(squad_backend *be) { return (cpu_backend *)be; }

/* ---- memory ---------------------------------------------------------------------------------- */

/* Checkpoint blobs: not zeroed, since a save always overwrites the whole blob (zeroing would only
 * fault in fresh pages twice). */
static void *cpu_alloc(squad_backend *be, size_t bytes, squad_err *err) {
    (void)be;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) {
        squad_fail(err, SQUAD_E_NOMEM, "out of memory (%zu bytes for a checkpoint)", bytes);
        return NULL;
    }
    return p;
}
static void cpu_release(squad_backend *be, void *p) {
    (void)be;
    free(p);
}

static int kv_dim(const cpu_backend *c) { return c->m->cfg.num_kv_heads * c->m->cfg.head_dim; }
static int round_up(int n, int step) { return (n + step - 1) / step * step; }

/* The slot's state into *out, its GDN state allocated (zeroed: a row start) on first use. */
static int seq_get(cpu_backend *c, int seq, cpu_seq **out, squad_err *err) {
    if (seq < 0 || seq >= c->base.max_seqs)
        return squad_fail(err, SQUAD_E_INVALID, "sequence slot %d (the backend has %d)", seq, c->base.max_seqs);
    cpu_seq *s = &c->seqs[seq];
    if (!s->gdn) {
        float *gdn = squad_aligned_alloc(c->base.gdn_snapshot_bytes ? c->base.gdn_snapshot_bytes : 1, err);
        float **K = squad_calloc((size_t)c->n_attn + 1, sizeof(float *), err);
        float **V = squad_calloc((size_t)c->n_attn + 1, sizeof(float *), err);
        if (!gdn || !K || !V) {
            squad_aligned_free(gdn);
            free(K);
            free(V);
            return squad_fail(err, SQUAD_E_NOMEM, "out of memory for sequence slot %d", seq);
        }
        s->gdn = gdn, s->K = K, s->V = V;
    }
    *out = s;
    return 0;
}

/* The slot's own K / V arrays to cap positions, keeping the first min(cap, old) of each. Growing
 * may fail (SQUAD_E_NOMEM, the capacity unchanged: every array still holds the old one); shrinking
 * cannot (an array realloc keeps larger is still large enough). */
static int seq_kv_resize(cpu_backend *c, cpu_seq *s, int cap, squad_err *err) {
    const size_t row = sizeof(float) * (size_t)kv_dim(c);
    for (int la = 0; la < c->n_attn; la++) {
        float **arrays[2] = {&s->K[la], &s->V[la]};
        for (int i = 0; i < 2; i++) {
            if (cap == 0) {
                free(*arrays[i]);
                *arrays[i] = NULL;
                continue;
            }
            float *p = realloc(*arrays[i], row * (size_t)cap);
            if (p) *arrays[i] = p;
            else if (cap > s->cap)
                return squad_fail(err, SQUAD_E_NOMEM, "out of memory growing K/V to %d positions", cap);
        }
    }
    c->base.kv_positions += cap - s->cap;
    s->cap = cap;
    return 0;
}

/* Room in the slot's own K / V for positions up to end (exclusive). */
static int seq_kv_reserve(cpu_backend *c, cpu_seq *s, int end, squad_err *err) {
    const int need = end - s->own0;
    if (need <= s->cap) return 0;
    int cap = round_up(need, CPU_KV_STEP);
    const int grown = round_up(s->cap + s->cap / 2, CPU_KV_STEP);
    if (cap < grown) cap = grown;
    const int most = c->base.max_context - s->own0; /* positions past max_context are never written */
    if (cap > most) cap = most > need ? most : need;
    return seq_kv_resize(c, s, cap, err);
}

/* After a reset / load_kv: the excess back when it is large (CPU_KV_SHRINK_*). */
static void seq_kv_trim(cpu_backend *c, cpu_seq *s, int need) {
    const int keep = round_up(need > 0 ? need : 1, CPU_KV_STEP);
    const size_t excess = (size_t)(s->cap - keep) * c->base.kv_bytes_per_pos;
    if (s->cap >= CPU_KV_SHRINK_RATIO * keep && excess >= CPU_KV_SHRINK_BYTES) seq_kv_resize(c, s, keep, NULL);
}

/* The blob's K (kind 0) or V (kind 1) rows of attention layer la. */
static const float *blob_rows(const cpu_backend *c, const cpu_seq *s, int la, int kind) {
    return s->blob + ((size_t)2 * la + (size_t)kind) * (size_t)s->blob_positions * (size_t)kv_dim(c);
}

/* Moves own0 down to new0 (a tile multiple): positions [new0, own0) copied from the blob in front
 * of the slot's own K / V (a chunk that starts before the end of the positions read in place).
 * All or nothing: on SQUAD_E_NOMEM the slot is unchanged. */
static int seq_kv_lower(cpu_backend *c, cpu_seq *s, int new0, squad_err *err) {
    const int shift = s->own0 - new0, cap = round_up(s->cap + shift, CPU_KV_STEP);
    const size_t row = sizeof(float) * (size_t)kv_dim(c);
    float **fresh = squad_calloc((size_t)2 * c->n_attn + 1, sizeof(float *), err);
    if (!fresh) return squad_fail_context(err, "K/V of sequence slot: ");
    for (int i = 0; i < 2 * c->n_attn; i++)
        if (!(fresh[i] = malloc(row * (size_t)cap))) {
            for (int j = 0; j < i; j++) free(fresh[j]);
            free(fresh);
            return squad_fail(err, SQUAD_E_NOMEM, "out of memory for the K/V of %d positions", cap);
        }
    for (int la = 0; la < c->n_attn; la++)
        for (int kind = 0; kind < 2; kind++) {
            float **own = kind ? &s->V[la] : &s->K[la], *dst = fresh[2 * la + kind];
            memcpy(dst, blob_rows(c, s, la, kind) + (size_t)new0 * kv_dim(c), row * (size_t)shift);
            if (s->cap) memcpy((char *)dst + row * (size_t)shift, *own, row * (size_t)s->cap);
            free(*own);
            *own = dst;
        }
    free(fresh);
    c->base.kv_positions += cap - s->cap;
    s->cap = cap;
    s->own0 = new0;
    if (new0 == 0) s->blob = NULL;
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

static int cpu_reset(squad_backend *be, int seq, squad_err *err) {
    cpu_backend *c = impl_of(be);
    cpu_seq *s;
    int rc = seq_get(c, seq, &s, err);
    if (rc) return rc;
    memset(s->gdn, 0, be->gdn_snapshot_bytes);
    s->blob = NULL;
    s->own0 = 0;
    s->n_pos = 0;
    seq_kv_trim(c, s, 0);
    return 0;
}

static int cpu_save_gdn(squad_backend *be, int seq, void *dst, squad_err *err) {
    cpu_seq *s;
    int rc = seq_get(impl_of(be), seq, &s, err);
    if (rc) return rc;
    memcpy(dst, s->gdn, be->gdn_snapshot_bytes);
    return 0;
}

static int cpu_load_gdn(squad_backend *be, int seq, const void *src, squad_err *err) {
    cpu_seq *s;
    int rc = seq_get(impl_of(be), seq, &s, err);
    if (rc) return rc;
    memcpy(s->gdn, src, be->gdn_snapshot_bytes);
    return 0;
}

static int cpu_save_kv(squad_backend *be, int seq, void *dst, int n, squad_err *err) {
    cpu_backend *c = impl_of(be);
    cpu_seq *s;
    int rc = seq_get(c, seq, &s, err);
    if (rc) return rc;
    if (n < 0 || n > s->n_pos)
        return squad_fail(err, SQUAD_E_INVALID, "save_kv: %d positions asked, the slot holds %d", n, s->n_pos);
    const size_t row = sizeof(float) * (size_t)kv_dim(c);
    const int from_blob = n < s->own0 ? n : s->own0;
    char *p = dst;
    for (int la = 0; la < c->n_attn; la++)
        for (int kind = 0; kind < 2; kind++) {
            const float *own = kind ? s->V[la] : s->K[la];
            if (from_blob) {
                const float *src = blob_rows(c, s, la, kind);
                if ((const void *)src != (const void *)p) memcpy(p, src, row * (size_t)from_blob);
            }
            if (n > from_blob) memcpy(p + row * (size_t)from_blob, own, row * (size_t)(n - from_blob));
            p += row * (size_t)n;
        }
    return 0;
}

/* Reads the blob in place: only the positions past its last whole key tile are copied. */
static int cpu_load_kv(squad_backend *be, int seq, const void *src, int blob_positions, int n, squad_err *err) {
    cpu_backend *c = impl_of(be);
    if (n < 0 || n > blob_positions || n > be->max_context)
        return squad_fail(err, SQUAD_E_INVALID, "load_kv: %d of %d positions (the slot holds at most %d)", n,
                          blob_positions, be->max_context);
    if (n > 0 && !src) return squad_fail(err, SQUAD_E_INVALID, "load_kv: no blob");
    cpu_seq *s;
    int rc = seq_get(c, seq, &s, err);
    if (rc) return rc;
    const int own0 = n / OP_ATTN_KEY_TILE * OP_ATTN_KEY_TILE, tail = n - own0;
    s->own0 = own0; /* the reserve below counts from the new own0 */
    rc = seq_kv_reserve(c, s, n, err);
    if (rc) {
        s->own0 = 0, s->blob = NULL, s->n_pos = 0; /* nothing restored */
        return rc;
    }
    seq_kv_trim(c, s, tail);
    s->blob = own0 ? src : NULL;
    s->blob_positions = blob_positions;
    s->n_pos = n;
    const size_t row = sizeof(float) * (size_t)kv_dim(c);
    for (int la = 0; la < c->n_attn && tail; la++)
        for (int kind = 0; kind < 2; kind++) {
            const float *from = (const float *)src + ((size_t)2 * la + (size_t)kind) * (size_t)blob_positions *
                                                         (size_t)kv_dim(c) + (size_t)own0 * kv_dim(c);
            memcpy(kind ? s->V[la] : s->K[la], from, row * (size_t)tail);
        }
    return 0;
}

/* ---- pool jobs over chunks ------------------------------------------------------------------- */

/* c->first_task[0..n_chunks] from each chunk's task count; returns the total. */
static int chunk_tasks(cpu_backend *c, int (*count)(const cpu_backend *c, int i, const void *arg), const void *arg) {
    c->first_task[0] = 0;
    for (int i = 0; i < c->n_chunks; i++) c->first_task[i + 1] = c->first_task[i] + count(c, i, arg);
    return c->first_task[c->n_chunks];
}

/* The chunk a task of the running per-chunk job belongs to. */
static int chunk_of_task(const cpu_backend *c, int task) {
    int i = 0;
    while (task >= c->first_task[i + 1]) i++;
    return i;
}

/* ---- per-token ops, spread over the pool in blocks of tokens --------------------------------- */

typedef enum row_op {
    ROW_EMBED,        /* h = embedding rows of the tokens */
    ROW_INPUT_NORM,   /* x = rmsnorm(h) with input_norm */
    ROW_POST_NORM,    /* x = rmsnorm(h) with post_norm */
    ROW_GDN_PREP,     /* q / k l2 norms of the conv output, the gates */
    ROW_GDN_NORM,     /* o = gated rmsnorm(o, z) */
    ROW_ATTN_PREP,    /* q / k head norms, RoPE at each token's position */
    ROW_ATTN_GATE,    /* att *= sigmoid(gate) */
    ROW_SILU_MUL      /* mlp_gate = silu(mlp_gate) * mlp_up, row by row */
} row_op;

typedef struct row_job {
    cpu_backend *c;
    const squad_layer_weights *L;
    row_op op;
} row_job;

static void row_task_run(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const row_job *j = ctx;
    cpu_backend *c = j->c;
    const squad_config *cfg = &c->m->cfg;
    const squad_layer_weights *L = j->L;
    const int H = cfg->hidden_size, t0 = task * CPU_ROW_TOKENS;
    const int t1 = t0 + CPU_ROW_TOKENS < c->T ? t0 + CPU_ROW_TOKENS : c->T, n = t1 - t0;
    const int C = squad_config_gdn_channels(cfg), nv = cfg->lin_num_v_heads, dv = cfg->lin_v_dim;
    const int nh = cfg->num_heads, nkv = cfg->num_kv_heads, hd = cfg->head_dim;
    const int q_stride = nh * 2 * hd, kvd = nkv * hd;
    switch (j->op) {
    case ROW_EMBED:
        for (int t = t0; t < t1; t++) {
            const int i = c->chunk_of_row[t];
            float *hr = c->h + (long)t * H;
            if (c->embed_src[t]) { /* an image token: the vision tower's row */
                memcpy(hr, c->embed_src[t], sizeof(float) * (size_t)H);
                continue;
            }
            const uint16_t *e = c->m->embed.w + (long)c->ck[i].ids[t - c->off[i]] * H;
            for (int k = 0; k < H; k++) hr[k] = squad_bf16_to_f32(e[k]);
        }
        break;
    case ROW_INPUT_NORM:
    case ROW_POST_NORM:
        op_rmsnorm_zc(c->x + (long)t0 * H, c->h + (long)t0 * H, j->op == ROW_INPUT_NORM ? L->input_norm : L->post_norm,
                      n, H, cfg->rms_eps);
        break;
    case ROW_GDN_PREP:
        op_qk_l2norm(c->conv_out + (long)t0 * C, n, C, cfg->lin_num_k_heads, cfg->lin_k_dim);
        op_gdn_gates(c->g + (long)t0 * nv, c->beta + (long)t0 * nv, c->gate_a + (long)t0 * nv, c->gate_b + (long)t0 * nv,
                     L->A_log, L->dt_bias, n, nv);
        break;
    case ROW_GDN_NORM:
        op_gated_rmsnorm(c->o + (long)t0 * nv * dv, c->z + (long)t0 * nv * dv, L->gdn_norm, n, nv, dv, cfg->rms_eps);
        break;
    case ROW_ATTN_PREP:
        for (int t = t0; t < t1; t++) {
            float *q = c->qg + (long)t * q_stride, *k = c->kk + (long)t * kvd;
            for (int h = 0; h < nh; h++) op_head_rmsnorm_zc(q + (long)h * 2 * hd, L->q_norm, 1, 1, hd, q_stride, cfg->rms_eps);
            op_head_rmsnorm_zc(k, L->k_norm, 1, nkv, hd, kvd, cfg->rms_eps);
            const squad_chunk *ck = &c->ck[c->chunk_of_row[t]];
            if (ck->positions) { /* M-RoPE: the token's (t, h, w) */
                const int32_t *p3 = ck->positions + 3 * (long)(t - c->off[c->chunk_of_row[t]]);
                op_rope_mrope(q, c->inv_freq, c->rope_axis, p3, nh, 2 * hd, cfg->rotary_dim);
                op_rope_mrope(k, c->inv_freq, c->rope_axis, p3, nkv, hd, cfg->rotary_dim);
            } else {
                op_rope(q, c->inv_freq, 1, c->pos[t], nh, 2 * hd, q_stride, cfg->rotary_dim);
                op_rope(k, c->inv_freq, 1, c->pos[t], nkv, hd, kvd, cfg->rotary_dim);
            }
        }
        break;
    case ROW_ATTN_GATE:
        op_sigmoid_gate(c->att + (long)t0 * nh * hd, c->qg + (long)t0 * q_stride + hd, n, nh, hd, q_stride, 2 * hd);
        break;
    case ROW_SILU_MUL: {
        const long I = cfg->intermediate_size;
        /* row by row, so which elements take the vector form does not depend on the batch */
        for (int t = t0; t < t1; t++) op_silu_mul(c->mlp_gate + t * I, c->mlp_up + t * I, I);
        break;
    }
    }
}

static void rows_run(cpu_backend *c, row_op op, const squad_layer_weights *L) {
    row_job j = {c, L, op};
    cpu_pool_run(c->pool, row_task_run, &j, (c->T + CPU_ROW_TOKENS - 1) / CPU_ROW_TOKENS);
}

/* ---- projections ----------------------------------------------------------------------------- */

/* A layer GEMM over all the batch's rows. The packed algorithm sums each output in the same order
 * for any T, the DOT form (T <= CPU_GEMM_DOT_MAX_T: a GEMV, W streamed once) in another; a chunk
 * that short alone takes the DOT form, so the batch packs such chunks last (rows [T_long, T)) and
 * runs them through the DOT form on their own: every chunk then gets the arithmetic it gets alone,
 * bit for bit, for one more pass over W when the batch mixes short and long chunks. */
static void layer_gemm(cpu_backend *c, float *y, const float *x, const squad_mat *W, int accumulate) {
    const int N = W->rows, K = W->cols, tail = c->T - c->T_long;
    if (c->T_long)
        cpu_gemm_bf16_algo(c->pool, y, x, W->w, c->T_long, N, K, accumulate, c->prec, CPU_GEMM_ALGO_AUTO);
    if (tail)
        cpu_gemm_bf16_algo(c->pool, y + (size_t)c->T_long * N, x + (size_t)c->T_long * K, W->w, tail, N, K, accumulate,
                           c->prec, CPU_GEMM_ALGO_DOT);
}

typedef struct lora_job {
    cpu_backend *c;
    int proj_id;
    float *y;
    const float *x;
} lora_job;

static int lora_count(const cpu_backend *c, int i, const void *arg) {
    const int proj_id = *(const int *)arg;
    const squad_adapter *a = c->lora[i];
    if (!a || !a->proj[c->lora_layer][proj_id].A) return 0;
    return (c->ck[i].len + CPU_LORA_TOKENS - 1) / CPU_LORA_TOKENS;
}

static void lora_task_run(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const lora_job *l = ctx;
    const cpu_backend *c = l->c;
    const int i = chunk_of_task(c, task), blk = task - c->first_task[i];
    const squad_adapter *a = c->lora[i];
    const squad_lora_proj *p = &a->proj[c->lora_layer][l->proj_id];
    const int t0 = c->off[i] + blk * CPU_LORA_TOKENS, end = c->off[i] + c->ck[i].len;
    const int t1 = t0 + CPU_LORA_TOKENS < end ? t0 + CPU_LORA_TOKENS : end;
    cpu_lora_apply(cpu_pool_isa(c->pool), p, a->scale, l->x + (size_t)t0 * p->in, l->y + (size_t)t0 * p->out, t1 - t0);
}

/* A projection of the running layer over all rows: y = W x (or y += W x), then each chunk's
 * adapter's low-rank term on that chunk's rows where its route adapts this projection. */
static void proj(cpu_backend *c, float *y, const float *x, const squad_mat *W, int accumulate, int proj_id) {
    layer_gemm(c, y, x, W, accumulate);
    if (!c->sp) return;
    const int tasks = chunk_tasks(c, lora_count, &proj_id);
    lora_job l = {c, proj_id, y, x};
    if (tasks) cpu_pool_run(c->pool, lora_task_run, &l, tasks);
}

/* ---- the mixers, per chunk ------------------------------------------------------------------- */

typedef struct gdn_job {
    cpu_backend *c;
    int lg;     /* the layer's index among the GDN layers */
    int groups; /* head groups per chunk (delta rule) */
} gdn_job;

/* One task per chunk: its conv from its slot's saved inputs. */
static void conv_task_run(void *ctx, int i, int n_tasks) {
    (void)n_tasks;
    const gdn_job *j = ctx;
    cpu_backend *c = j->c;
    const squad_config *cfg = &c->m->cfg;
    const int C = squad_config_gdn_channels(cfg);
    float *S = c->cseq[i]->gdn + c->gdn_layer_floats * (size_t)j->lg;
    float *conv_state = S + (size_t)cfg->lin_num_v_heads * cfg->lin_k_dim * cfg->lin_v_dim;
    const long r = (long)c->off[i] * C;
    op_conv_silu(c->conv_out + r, c->qkv + r, conv_state, c->conv_kc[j->lg], c->ck[i].len, C, cfg->conv_kernel);
}

/* One task: one chunk's delta rule on one group of value heads. */
static void delta_task_run(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const gdn_job *j = ctx;
    cpu_backend *c = j->c;
    const squad_config *cfg = &c->m->cfg;
    const int nv = cfg->lin_num_v_heads, C = squad_config_gdn_channels(cfg);
    const int i = task / j->groups, grp = task % j->groups;
    const int h0 = (int)((long)nv * grp / j->groups), h1 = (int)((long)nv * (grp + 1) / j->groups);
    const int r = c->off[i];
    float *S = c->cseq[i]->gdn + c->gdn_layer_floats * (size_t)j->lg;
    op_delta_rule(c->o + (long)r * nv * cfg->lin_v_dim, S, c->conv_out + (long)r * C, c->g + (long)r * nv,
                  c->beta + (long)r * nv, c->ck[i].len, C, cfg->lin_num_k_heads, nv, cfg->lin_k_dim, cfg->lin_v_dim,
                  h0, h1);
}

/* h += GatedDeltaNet(x) for every chunk, each continuing from its slot's state. */
static void gdn_layer(cpu_backend *c, const squad_layer_weights *L, int lg) {
    const int nv = c->m->cfg.lin_num_v_heads;
    proj(c, c->qkv, c->x, &L->in_qkv, 0, SQUAD_PROJ_IN_QKV);
    proj(c, c->z, c->x, &L->in_z, 0, SQUAD_PROJ_IN_Z);
    proj(c, c->gate_b, c->x, &L->in_b, 0, SQUAD_PROJ_IN_B);
    proj(c, c->gate_a, c->x, &L->in_a, 0, SQUAD_PROJ_IN_A);
    const int threads = cpu_pool_threads(c->pool);
    gdn_job j = {c, lg, threads < nv ? threads : nv};
    cpu_pool_run(c->pool, conv_task_run, &j, c->n_chunks);
    rows_run(c, ROW_GDN_PREP, L);
    cpu_pool_run(c->pool, delta_task_run, &j, c->n_chunks * j.groups);
    rows_run(c, ROW_GDN_NORM, L);
    proj(c, c->h, c->o, &L->out_proj, 1, SQUAD_PROJ_OUT);
}

typedef struct attn_job {
    cpu_backend *c;
    int la; /* the layer's index among the attention layers */
} attn_job;

static int attn_count(const cpu_backend *c, int i, const void *arg) {
    (void)arg;
    return c->m->cfg.num_kv_heads * ((c->ck[i].len + CPU_ATTN_QUERY_BLOCK - 1) / CPU_ATTN_QUERY_BLOCK);
}

/* One task: one chunk's kv head with its group of query heads over one block of query tokens, over
 * the slot's [blob | own] K / V. */
static void attn_task_run(void *ctx, int task, int n_tasks, int thread) {
    (void)n_tasks;
    const attn_job *a = ctx;
    cpu_backend *c = a->c;
    const squad_config *cfg = &c->m->cfg;
    const int nh = cfg->num_heads, hd = cfg->head_dim;
    const int i = chunk_of_task(c, task), local = task - c->first_task[i];
    const int n_blocks = (c->ck[i].len + CPU_ATTN_QUERY_BLOCK - 1) / CPU_ATTN_QUERY_BLOCK;
    const int kvh = local / n_blocks, blk = local % n_blocks;
    const int T = c->ck[i].len, t0 = blk * CPU_ATTN_QUERY_BLOCK;
    const int t1 = t0 + CPU_ATTN_QUERY_BLOCK < T ? t0 + CPU_ATTN_QUERY_BLOCK : T;
    const cpu_seq *s = c->cseq[i];
    op_kv kv = {NULL, NULL, s->own0, s->K[a->la], s->V[a->la]};
    if (s->own0) kv.K0 = blob_rows(c, s, a->la, 0), kv.V0 = blob_rows(c, s, a->la, 1);
    const int r = c->off[i];
    op_attention_group_kv(c->att + (long)r * nh * hd, c->qg + (long)r * nh * 2 * hd, nh * 2 * hd, 2 * hd, &kv,
                          c->ck[i].start, nh, cfg->num_kv_heads, hd, kvh, t0, t1,
                          c->attn_scratch + c->attn_scratch_floats * thread);
}

/* h += GatedAttention(x) for every chunk, each at its positions over its slot's K / V. */
static void attn_layer(cpu_backend *c, const squad_layer_weights *L, int la) {
    const int kvd = kv_dim(c);
    proj(c, c->qg, c->x, &L->q_proj, 0, SQUAD_PROJ_Q);
    proj(c, c->kk, c->x, &L->k_proj, 0, SQUAD_PROJ_K);
    proj(c, c->vv, c->x, &L->v_proj, 0, SQUAD_PROJ_V);
    rows_run(c, ROW_ATTN_PREP, L);
    for (int i = 0; i < c->n_chunks; i++) {
        cpu_seq *s = c->cseq[i];
        const long at = (long)(c->ck[i].start - s->own0) * kvd, r = (long)c->off[i] * kvd;
        const size_t bytes = sizeof(float) * (size_t)c->ck[i].len * (size_t)kvd;
        memcpy(s->K[la] + at, c->kk + r, bytes);
        memcpy(s->V[la] + at, c->vv + r, bytes);
    }
    attn_job a = {c, la};
    cpu_pool_run_indexed(c->pool, attn_task_run, &a, chunk_tasks(c, attn_count, NULL));
    rows_run(c, ROW_ATTN_GATE, L);
    proj(c, c->h, c->att, &L->o_proj, 1, SQUAD_PROJ_O);
}

/* h += MLP(x) */
static void mlp_block(cpu_backend *c, const squad_layer_weights *L) {
    proj(c, c->mlp_gate, c->x, &L->mlp_gate, 0, SQUAD_PROJ_GATE);
    proj(c, c->mlp_up, c->x, &L->mlp_up, 0, SQUAD_PROJ_UP);
    rows_run(c, ROW_SILU_MUL, L);
    proj(c, c->h, c->mlp_gate, &L->mlp_down, 1, SQUAD_PROJ_DOWN);
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
    int v0, nb; /* the step: vocabulary rows [v0, v0 + nb) */
} vocab_task;

/* One task: one slot row's piece of the step's logits. */
static void vocab_task_run(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
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

/* One pass over the output embedding for n slot rows (already in vocab_xn); their figures into
 * out[r]. The GEMM is forced to its DOT form: each logit is then one dot product whose order does
 * not depend on how many rows share the pass. */
static void vocab_pass(cpu_backend *c, int n, squad_slot_vocab *const *out) {
    const squad_model *m = c->m;
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    vocab_acc acc[CPU_VOCAB_ROWS];
    for (int s = 0; s < n; s++) acc[s] = VOCAB_EMPTY;
    for (int v0 = 0; v0 < V; v0 += CPU_VOCAB_BLOCK) {
        vocab_task t = {c, v0, V - v0 < CPU_VOCAB_BLOCK ? V - v0 : CPU_VOCAB_BLOCK};
        cpu_gemm_bf16_algo(c->pool, c->vocab_z, c->vocab_xn, m->lm_head.w + (size_t)v0 * H, n, t.nb, H, 0,
                           CPU_GEMM_EXACT, CPU_GEMM_ALGO_DOT);
        cpu_pool_run(c->pool, vocab_task_run, &t, n * CPU_VOCAB_PIECES);
        for (int s = 0; s < n; s++)
            for (int p = 0; p < CPU_VOCAB_PIECES; p++) acc[s] = vocab_merge(acc[s], c->vocab_parts[s * CPU_VOCAB_PIECES + p]);
    }
    for (int s = 0; s < n; s++) {
        out[s]->vocab_lse = (float)((double)acc[s].max + log(acc[s].sum));
        out[s]->top_logit = acc[s].max;
        out[s]->top_token = acc[s].arg;
    }
}

/* Fills vocab for the slots of every chunk that asks, CPU_VOCAB_ROWS slot rows per pass. */
static void vocab_figures(cpu_backend *c) {
    const squad_model *m = c->m;
    const int H = m->cfg.hidden_size;
    squad_slot_vocab *out[CPU_VOCAB_ROWS];
    int n = 0;
    for (int i = 0; i < c->n_chunks; i++) {
        const squad_chunk *ck = &c->ck[i];
        if (!ck->vocab) continue;
        for (int s = 0; s < ck->n_slots; s++) {
            float *xn = c->vocab_xn + (size_t)n * H;
            final_norm_row(xn, c->h + (long)(c->off[i] + ck->slots[s]) * H, m->final_norm, H, m->cfg.rms_eps);
            const int nl = ck->nopts[s] < ck->n_letters ? ck->nopts[s] : ck->n_letters;
            ck->vocab[s].letters_lse = letters_lse(xn, m->lm_head.w, H, ck->letters, nl);
            out[n++] = &ck->vocab[s];
            if (n == CPU_VOCAB_ROWS) vocab_pass(c, n, out), n = 0;
        }
    }
    if (n) vocab_pass(c, n, out);
}

/* t indexes the tokens of the first chunk of the last batch (chunks[0], whatever rows of the packed
 * token dimension it took). */
int squad_cpu_backend_hidden(const squad_backend *be, int t, float *out, squad_err *err) {
    if (!be || !be->name || strcmp(be->name, "cpu") != 0)
        return squad_fail(err, SQUAD_E_INVALID, "not a CPU backend");
    const cpu_backend *c = (const cpu_backend *)be;
    if (t < 0 || t >= c->last_len) return squad_fail(err, SQUAD_E_INVALID, "token %d is outside the last chunk", t);
    const int H = c->m->cfg.hidden_size;
    memcpy(out, c->h + (long)(c->last_off + t) * H, sizeof(float) * (size_t)H);
    return 0;
}

/* ---- the batch ------------------------------------------------------------------------------- */

/* Everything about one chunk that can be wrong, checked before any state changes. */
static int check_chunk(const cpu_backend *c, const squad_chunk *ck, squad_err *err) {
    const squad_backend *be = &c->base;
    const squad_config *cfg = &c->m->cfg;
    if (ck->seq < 0 || ck->seq >= be->max_seqs)
        return squad_fail(err, SQUAD_E_INVALID, "sequence slot %d (the backend has %d)", ck->seq, be->max_seqs);
    if (ck->len < 1 || ck->len > be->max_chunk)
        return squad_fail(err, SQUAD_E_INVALID, "chunk of %d tokens (1..%d)", ck->len, be->max_chunk);
    if (!ck->ids) return squad_fail(err, SQUAD_E_INVALID, "a chunk without token ids");
    if (ck->start < 0 || ck->start > be->max_context - ck->len)
        return squad_fail(err, SQUAD_E_INVALID, "chunk [%d, %d) is past the longest supported row (%d)", ck->start,
                          ck->start + ck->len, be->max_context);
    for (int t = 0; t < ck->len; t++)
        if (ck->ids[t] < 0 || ck->ids[t] >= cfg->vocab_size)
            return squad_fail(err, SQUAD_E_INVALID, "token id %d is outside the vocabulary (0..%d)", ck->ids[t],
                              cfg->vocab_size - 1);
    if (ck->n_slots < 0 || ck->n_slots > SQUAD_MAX_SLOTS_PER_ROW)
        return squad_fail(err, SQUAD_E_INVALID, "%d answer slots in a chunk (at most %d)", ck->n_slots,
                          SQUAD_MAX_SLOTS_PER_ROW);
    if (ck->n_slots > 0) {
        if (!ck->probs) return squad_fail(err, SQUAD_E_INVALID, "a chunk with slots and no probs");
        if (!ck->letters || ck->n_letters < 1 || ck->n_letters > SQUAD_MAX_LETTERS)
            return squad_fail(err, SQUAD_E_INVALID, "a chunk with slots and %d option letters (1..%d)", ck->n_letters,
                              SQUAD_MAX_LETTERS);
        for (int l = 0; l < ck->n_letters; l++)
            if (ck->letters[l] < 0 || ck->letters[l] >= cfg->vocab_size)
                return squad_fail(err, SQUAD_E_INVALID, "option letter id %d is outside the vocabulary", ck->letters[l]);
    }
    for (int s = 0; s < ck->n_slots; s++)
        if (ck->slots[s] < 0 || ck->slots[s] >= ck->len)
            return squad_fail(err, SQUAD_E_INVALID, "slot %d outside the chunk", ck->slots[s]);
    const squad_specialists *sp = c->sp;
    if (ck->route != 0 && (!sp || ck->route < 0 || ck->route >= sp->router.n_labels))
        return squad_fail(err, SQUAD_E_INVALID, "route %d: the backend has %d routes", ck->route,
                          sp ? sp->router.n_labels : 1);
    if (ck->router_sum && !sp) return squad_fail(err, SQUAD_E_INVALID, "router features asked without specialists");
    if (ck->positions && !c->mrope_ok)
        return squad_fail(err, SQUAD_E_INVALID, "M-RoPE positions for a model whose mrope_section does not fit its rotary");
    if (ck->embeds && !cfg->has_vision)
        return squad_fail(err, SQUAD_E_INVALID, "image embeddings for a model without a vision tower");
    return 0;
}

/* The batch's slots ready: allocated, their own K / V reaching each chunk's end (and starting at or
 * before its start). Only memory changes here, never what a slot holds. */
static int prepare_slots(cpu_backend *c, squad_err *err) {
    for (int i = 0; i < c->n_chunks; i++) {
        const squad_chunk *ck = &c->ck[i];
        cpu_seq *s;
        int rc = seq_get(c, ck->seq, &s, err);
        if (rc) return rc;
        c->cseq[i] = s;
        if (ck->start < s->own0 && (rc = seq_kv_lower(c, s, ck->start / OP_ATTN_KEY_TILE * OP_ATTN_KEY_TILE, err)))
            return rc;
        if ((rc = seq_kv_reserve(c, s, ck->start + ck->len, err))) return rc;
    }
    return 0;
}

/* Where the chunk's rows (from packed row r) take their embedding: its <|image_pad|> tokens the
 * chunk's embeds in order, every other token (and every token of a chunk without embeds) the
 * embedding table. */
static void image_rows(cpu_backend *c, const squad_chunk *ck, int r) {
    const int H = c->m->cfg.hidden_size, pad = c->m->cfg.image_token_id;
    long k = 0;
    for (int t = 0; t < ck->len; t++)
        c->embed_src[r + t] = ck->embeds && ck->ids[t] == pad ? ck->embeds + (k++) * H : NULL;
}

/* The vision tower (cpu/vision.c) on the backend's pool, in its precision. */
static int cpu_vision(squad_backend *be, const float *pixel_values, const int grid[3], float *out, squad_err *err) {
    cpu_backend *c = be->impl;
    return cpu_vision_forward(c->pool, c->prec, c->m, pixel_values, grid[0], grid[1], grid[2], out, err);
}

/* A batch: validated as a whole (each chunk, distinct slots, the token budget), then run packed. */
static int cpu_forward(squad_backend *be, const squad_chunk *chunks, int n_chunks, squad_err *err) {
    cpu_backend *c = impl_of(be);
    const squad_model *m = c->m;
    const squad_config *cfg = &m->cfg;
    const int H = cfg->hidden_size;
    if (n_chunks < 1 || n_chunks > be->max_seqs || !chunks)
        return squad_fail(err, SQUAD_E_INVALID, "a batch of %d chunks (1..%d)", n_chunks, be->max_seqs);
    long tokens = 0;
    for (int i = 0; i < n_chunks; i++) {
        int rc = check_chunk(c, &chunks[i], err);
        if (rc) return rc;
        for (int j = 0; j < i; j++)
            if (chunks[j].seq == chunks[i].seq)
                return squad_fail(err, SQUAD_E_INVALID, "sequence slot %d twice in one batch", chunks[i].seq);
        tokens += chunks[i].len;
    }
    if (tokens > be->max_batch_tokens)
        return squad_fail(err, SQUAD_E_INVALID, "a batch of %ld tokens (at most %d)", tokens, be->max_batch_tokens);

    c->ck = chunks;
    c->n_chunks = n_chunks;
    c->T = (int)tokens;
    int rc = prepare_slots(c, err);
    if (rc) return rc;
    /* the token dimension: chunks longer than CPU_GEMM_DOT_MAX_T first, then the short ones */
    int r = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) c->T_long = r;
        for (int i = 0; i < n_chunks; i++) {
            if ((chunks[i].len > CPU_GEMM_DOT_MAX_T) != (pass == 0)) continue;
            c->off[i] = r;
            for (int t = 0; t < chunks[i].len; t++) c->pos[r + t] = chunks[i].start + t, c->chunk_of_row[r + t] = i;
            image_rows(c, &chunks[i], r);
            r += chunks[i].len;
        }
    }

    rows_run(c, ROW_EMBED, NULL);
    const squad_specialists *sp = c->sp;
    for (int l = 0; l < cfg->num_layers; l++) {
        const squad_layer_weights *L = &m->layers[l];
        for (int i = 0; sp && i < n_chunks; i++) {
            const squad_chunk *ck = &chunks[i];
            if (ck->router_sum && l == sp->router.layer) {
                memset(ck->router_sum, 0, sizeof(double) * (size_t)H);
                for (int t = 0; t < ck->len; t++)
                    squad_router_norm_add(ck->router_sum, c->h + (long)(c->off[i] + t) * H, H, sp->router.eps);
            }
            c->lora[i] = ck->route > 0 && l >= sp->split ? &sp->adapters[ck->route] : NULL;
        }
        c->lora_layer = l;
        rows_run(c, ROW_INPUT_NORM, L);
        if (L->kind == SQUAD_LAYER_LINEAR)
            gdn_layer(c, L, c->slot_of_layer[l]);
        else
            attn_layer(c, L, c->slot_of_layer[l]);
        rows_run(c, ROW_POST_NORM, L);
        mlp_block(c, L);
    }
    for (int i = 0; i < n_chunks; i++) {
        const squad_chunk *ck = &chunks[i];
        for (int s = 0; s < ck->n_slots; s++)
            op_letter_probs(ck->probs + (long)s * SQUAD_MAX_LETTERS, c->h + (long)(c->off[i] + ck->slots[s]) * H,
                            m->final_norm, cfg->rms_eps, m->lm_head.w, H, ck->letters, ck->n_letters, ck->nopts[s]);
        c->cseq[i]->n_pos = ck->start + ck->len;
    }
    c->last_off = c->off[0];
    c->last_len = chunks[0].len;
    vocab_figures(c);
    return 0;
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

static void cpu_destroy(squad_backend *be) {
    if (!be) return;
    cpu_backend *c = impl_of(be);
    cpu_pool_free(c->pool);
    for (int q = 0; c->seqs && q < c->base.max_seqs; q++) {
        cpu_seq *s = &c->seqs[q];
        squad_aligned_free(s->gdn);
        for (int la = 0; la < c->n_attn; la++) {
            if (s->K) free(s->K[la]);
            if (s->V) free(s->V[la]);
        }
        free(s->K);
        free(s->V);
    }
    free(c->seqs);
    for (int lg = 0; c->conv_kc && lg < c->n_gdn; lg++) free(c->conv_kc[lg]);
    free(c->conv_kc);
    free(c->inv_freq);
    free(c->rope_axis);
    free(c->embed_src);
    free(c->pos);
    free(c->chunk_of_row);
    free(c->off);
    free(c->cseq);
    free(c->lora);
    free(c->first_task);
    squad_aligned_free(c->attn_scratch);
    squad_aligned_free(c->vocab_xn);
    squad_aligned_free(c->vocab_z);
    float **scratch[] = {&c->h, &c->x, &c->qkv, &c->conv_out, &c->z, &c->gate_a, &c->gate_b, &c->g, &c->beta,
                         &c->o, &c->qg, &c->kk, &c->vv, &c->att, &c->mlp_gate, &c->mlp_up};
    for (size_t i = 0; i < sizeof scratch / sizeof scratch[0]; i++) squad_aligned_free(*scratch[i]);
    free(c);
}

/* Scratch activations: not zeroed (every row a forward reads it wrote first), so the pages of rows
 * past the batches actually run are never touched and cost no resident memory: a single row of 512
 * tokens uses what it used before max_batch_tokens grew. */
static float *scratch_rows(int rows, int width, squad_err *err) {
    void *p = NULL;
    const size_t bytes = sizeof(float) * (size_t)rows * (size_t)(width > 0 ? width : 1);
    if (posix_memalign(&p, 64, bytes) != 0) {
        squad_fail(err, SQUAD_E_NOMEM, "out of memory (%zu bytes of scratch activations)", bytes);
        return NULL;
    }
    return p;
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
    be->max_batch_tokens = CPU_MAX_BATCH_TOKENS;
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
    if (model->cfg.has_vision && model->vision) be->vision_forward = cpu_vision;
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

    const int rows = be->max_batch_tokens, seqs = be->max_seqs;
    c->pool = cpu_pool_new(opts ? opts->threads : 0, err);
    if (!c->pool) goto fail;
    if (cpu_gemm_reserve(c->pool, rows,
                         cfg->intermediate_size > cfg->hidden_size ? cfg->intermediate_size : cfg->hidden_size, err))
        goto fail;
    c->seqs = squad_calloc((size_t)seqs, sizeof(cpu_seq), err);
    c->off = squad_calloc((size_t)seqs, sizeof(int), err);
    c->cseq = squad_calloc((size_t)seqs, sizeof(cpu_seq *), err);
    c->lora = squad_calloc((size_t)seqs, sizeof(squad_adapter *), err);
    c->first_task = squad_calloc((size_t)seqs + 1, sizeof(int), err);
    c->pos = squad_calloc((size_t)rows, sizeof(int), err);
    c->chunk_of_row = squad_calloc((size_t)rows, sizeof(int), err);
    c->inv_freq = squad_calloc((size_t)cfg->rotary_dim / 2 + 1, sizeof(float), err);
    c->rope_axis = squad_calloc((size_t)cfg->rotary_dim / 2 + 1, 1, err);
    c->embed_src = squad_calloc((size_t)rows, sizeof(float *), err);
    if (!c->seqs || !c->off || !c->cseq || !c->lora || !c->first_task || !c->pos || !c->chunk_of_row || !c->inv_freq ||
        !c->rope_axis || !c->embed_src)
        goto fail;
    op_rope_inv_freq(c->inv_freq, cfg->rope_theta, cfg->rotary_dim);
    c->mrope_ok = op_mrope_axes(c->rope_axis, cfg->rotary_dim, cfg->mrope_section, cfg->mrope_interleaved > 0) == 0;
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
        if (!(*plan[i].p = scratch_rows(rows, plan[i].width, err))) goto fail;
    c->vocab_xn = squad_aligned_alloc(sizeof(float) * CPU_VOCAB_ROWS * (size_t)H, err);
    c->vocab_z = squad_aligned_alloc(sizeof(float) * CPU_VOCAB_ROWS * (size_t)CPU_VOCAB_BLOCK, err);
    if (!c->vocab_xn || !c->vocab_z) goto fail;
    return be;
fail:
    cpu_destroy(be);
    return NULL;
}
