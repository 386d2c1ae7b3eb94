/*
 * backend_cuda.cu — the CUDA backend (backend.h): weights on the device, sequence slots (one working
 * state per row in flight), and the batched forward: the chunks of a batch grouped by length bucket,
 * each group one CUDA graph replay over all its rows.
 *
 * Design:
 *  - Weights are uploaded once: bf16 matrices, with the projections that read the same input
 *    fused into one matrix (GDN: in_proj_qkv | z | b | a; attention: q | k | v; MLP: gate | up),
 *    so a layer runs 4 (GDN) or 4 (attention) GEMMs. Vectors are fp32.
 *  - Sequence slots (max_seqs = opts->max_rows, DEFAULT_SEQS by default). A slot holds an arena
 *    with every GDN layer's S^T [nv][dv][dk] (fp32, head dims padded as k_gdn.cu instantiates them)
 *    and conv inputs [K-1][C] (bf16), allocated on the slot's first use, so save_gdn / load_gdn /
 *    reset are single copies; and its own K / V, position-major [capacity][attention layer][K | V]
 *    [nkv][hd] (bf16), so the K / V of a range of positions of every layer is one contiguous
 *    range. A slot's own K / V holds only the positions its row computes: from its kv_split on
 *    (position p at index p - kv_split). Below kv_split the positions come from a cache blob
 *    read in place (load_kv stores the pointer; several slots may read one blob), so 64 hits on
 *    4096-token states hold 64 x (question) positions, not 64 x 4096. The own K / V starts at
 *    KV_SLOT_MIN_POSITIONS and doubles (up to max_context) when a chunk reaches past it. The kernels
 *    find every slot's buffers through the batch parameters (cu_chunk_params: kv_src, kv_work,
 *    gdn), never through an address captured into a graph, so a growth (a new buffer, the old one
 *    copied in and freed) leaves every graph valid. max_context is lowered at creation when the
 *    device's free memory, less KV_HEADROOM_BYTES, cannot hold the K / V of that many positions.
 *  - forward(batch): every chunk is padded to a length bucket (CHUNK_BUCKETS); the chunks of one
 *    bucket run together as one replay of the graph keyed by (length bucket, rows bucket, span
 *    bucket): the rows bucket (ROW_BUCKETS) is the group's row count rounded up, the span bucket its
 *    longest start + len. Row r's tokens sit at [r bucket, (r + 1) bucket) of the packed
 *    activations, so the projections and the MLP are one GEMM over rows x bucket tokens, and
 *    every mixer kernel takes all the rows in one launch (a grid dimension over rows) reading its
 *    row's values (start, len, its slot's state and K / V, kv_src, kv_split) from the parameters.
 *    Padding rows have len 0: every per-row kernel skips them (writing zeros where a GEMM reads
 *    them). The parameters of a replay (cu_batch: rows, ids, answers) travel in one host-to-device
 *    copy before it, from a pinned staging area of its own (the replays of one forward are enqueued
 *    back to back and synchronised once). A group whose padded tokens exceed the scratch
 *    (tok_cap) runs as several replays. The group holding the batch's first chunk runs last, so
 *    squad_cuda_backend_hidden reads that chunk.
 *  - Two precisions (opts->precision, as on the CPU): BF16, the fast path — bf16 matrices and
 *    activations on the tensor cores, the chunked delta rule and flash attention (k_gdn.cu,
 *    k_attn.cu); EXACT, the reference path — fp32 matrices and activations, fp32 GEMMs, the
 *    token-by-token delta rule (k_gdn_exact.cu) and fp32 attention. The random test models are so
 *    sensitive that bf16 activations alone move their answers by a few 1e-2 (docs/design.md
 *    section 10); EXACT meets the fixtures, BF16 is what the benchmark times. Both take batches.
 *  - The residual stream h is fp32; out_proj / o_proj / down_proj add into h in the cuBLASLt
 *    epilogue. Per layer: norm, in-GEMM, mixer kernels, out-GEMM(+residual), norm,
 *    gate|up GEMM, silu*mul, down GEMM(+residual).
 *  - Full-vocabulary figures (chunks with vocab): k_vocab.cu's kernels, enqueued after a replay on
 *    the same stream and only when one of its rows asks; the slots of every asking row form one
 *    list, so one pass over the embedding serves a group of slots of several rows.
 *  - Specialists (opts->specialists): the LoRA terms ride inside the projections' own GEMMs
 *    (k_lora.cuh). In the layers from `split` on, each GEMM with a projection some adapter adapts
 *    gets its K widened by n_slots R columns (R: the adapted parts' ranks, each rounded up to 16),
 *    for `max_adapters` resident slots: the weight becomes [W | B'_1 | ... | B'_n] (each slot's
 *    columns hold its adapter's B in the parts' rows, written when the adapter is uploaded into the
 *    slot on demand, the least recently used slot giving way) and its input [x | u_1 | ... | u_n],
 *    made by k_lora.cu in place of the trunk's norm or SiLU (out / o: one launch after the mixer,
 *    or, on a hit's chunks, none: the gate | up norm's launch adds out's term, k_lora_fold),
 *    u_s = s A x for tokens of slot s and zeros elsewhere. Each packed token's adapter slot (0: the
 *    trunk, padding) rides in the batch parameters (cu_batch.token_slot), so rows of different
 *    routes share one forward (mixed_routes 1) and one graph serves every route; a batch whose
 *    routes do not all fit the resident slots is refused with SQUAD_E_UNSUPPORTED and the engine
 *    runs it route by route. Without specialists nothing of this exists (the trunk's K, kernels and
 *    graphs). The router's feature sums (per row, the fp32 h entering router.layer) are in every
 *    graph and copied back only for rows that ask.
 *  - Images (docs/images.md): a model with a vision tower gets it on the device (vision_cuda.cu, behind
 *    vision_forward), and chunks may carry M-RoPE positions and image rows: both travel as data the
 *    graphs read (a per-token tail of the parameter buffer, a fixed buffer of image rows uploaded
 *    before the replays), so an image chunk replays the graph of its shape and a text chunk runs as
 *    before.
 *  - Every CUDA / cuBLASLt call is checked; errors come back through squad_err, never printed.
 *  - The few switches the environment may set (cuda_knobs: graphs or eager, the longest chunk, the
 *    sm_90a kernels, the GEMM plan file) are read and checked once, in build (cuda_knobs_read), and
 *    travel in cu_be and the kernels' arguments; docs/cuda.md's "Switches" lists them.
 */
#include "cuda_internal.cuh"

#include "backend_cuda.h"
#include "cuda_host_tier.cuh"
#include "k_lora.cuh"
#include "vision_cuda.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "config.h"
#include "model.h"
#include "specialists.h"
}

static const int CHUNK_BUCKETS[] = {16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096};
#define N_CHUNK_BUCKETS ((int)(sizeof CHUNK_BUCKETS / sizeof CHUNK_BUCKETS[0]))
/* The longest chunk is CU_DEFAULT_MAX_CHUNK (cuda_internal.cuh), or the smaller bucket SQUAD_MAX_CHUNK
 * (cuda_knobs.max_chunk) asks for: rows longer than it run as several chunks. */
#define SPAN_MIN 1024 /* span buckets: 1024, 2048, ... up to max_context */
#define MAX_SPANS 24
/* A slot's own K / V's first capacity, in positions (it doubles as its row grows, up to
 * max_context): a hit's question fits, and a cold row reaches 4096 in four doublings. */
#define KV_SLOT_MIN_POSITIONS 256
/* Rows buckets of a replay (the graphs' second key); a batch's rows of one length bucket are padded
 * to the next (padding rows cost their GEMM tokens only: at most a third of a replay's). */
static const int ROW_BUCKETS[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256};
#define N_ROW_BUCKETS ((int)(sizeof ROW_BUCKETS / sizeof ROW_BUCKETS[0]))
#define MAX_SEQS 256    /* the most sequence slots (the largest rows bucket) */
#define DEFAULT_SEQS 64 /* max_seqs when opts->max_rows is 0 */
/* A group of short chunks rides in a larger bucket's replay when that pads at most this many tokens
 * (plan_buckets): about a replay's fixed cost in GEMM tokens on the 0.8B model. */
#define MERGE_PAD_TOKENS 512
/* The most tokens the scratch holds (opts->batch_tokens may ask for more than max_chunk). */
#define MAX_BATCH_TOKENS 16384
/* Device memory left aside when bounding max_context by what the K / V may grow to: the state
 * cache's default budget, graphs captured later, cuBLASLt's and the driver's own allocations (the
 * engine's automatic cache budget keeps the same margin). */
#define KV_HEADROOM_BYTES ((size_t)2 << 30)
static_assert(N_CHUNK_BUCKETS <= (int)(sizeof(((squad_cuda_info *)0)->buckets) / sizeof(int)) &&
                  MAX_SPANS <= (int)(sizeof(((squad_cuda_info *)0)->spans) / sizeof(int)),
              "squad_cuda_info must hold every bucket and span");

typedef struct cu_layer {
    int kind;
    /* matrices: bf16, or fp32 on the exact path */
    void *w_in;   /* GDN: [NP][H] (qkv | z | b | a | 0); attention: [ldQKV][H] (q | k | v | 0) */
    void *w_out;  /* GDN out_proj [H][nv dv]; attention o_proj [H][nh hd] */
    void *w_gu;   /* [2I][H] (gate | up) */
    void *w_down; /* [H][I] */
    float *in_norm, *post_norm;
    float *conv_w, *A_log, *dt_bias, *gdn_norm; /* GDN */
    size_t s_off;                               /* GDN: its S in a slot's arena (bytes) */
    size_t conv_off;                            /* GDN: its conv inputs [K-1][C] in the arena */
    float *q_norm, *k_norm;                     /* attention */
    int attn_index;                             /* attention: index among attention layers */
} cu_layer;

/* A sequence slot: one row in flight (the top of the file). */
typedef struct cu_seq {
    unsigned char *gdn; /* the GDN arena (gdn_bytes), NULL until the slot's first use */
    /* load_gdn's blob, not copied: the next forward reads the slot's starting GDN state from it
     * and writes the chunk's final state into the arena (cu_chunk_params.gdn_in), so a restore
     * moves no bytes; NULL once a forward ran (the arena holds the state) or after reset */
    const unsigned char *gdn_src;
    void *kv;           /* own K / V: positions from kv_split on, kv_cap of them; grows (moves) */
    int kv_cap;
    /* load_kv reads a cache blob in place: positions [0, kv_split) are kv_src's (the blob stays
     * valid until the next reset or load_kv of the slot, backend.h) */
    const void *kv_src;
    int kv_split;
} cu_seq;

/* The GEMMs the specialists widen (k_lora.cuh): in a layer from `split` on, each GEMM with a
 * projection some adapter adapts gets n_slots R extra K columns. */
enum { LORA_IN, LORA_OUT, LORA_GU, LORA_DOWN, LORA_SITES };
#define LORA_MAX_PARTS 4 /* projections of one GEMM: GDN qkv | z | b | a */
/* A widened GEMM's K is a multiple of this: rows of 128 bytes in bf16 (the GEMMs' K tiles are 64
 * deep; an odd multiple of 32 elements left the out and down rows 64-byte aligned only) */
#define LORA_K_ALIGN 64
typedef struct lora_site {
    int ext;  /* the extra K: n_slots R, rounded up (0: the site is the trunk's own GEMM) */
    int R;    /* rank columns per slot: every adapted part's largest rank rounded up to 16, summed */
    int in;   /* the GEMM's K before widening (x's width) */
    int n;    /* the GEMM's N (rows of the weight) */
    int lda;  /* A's row stride (cu_lora_lda) */
    int n_parts;
    int proj[LORA_MAX_PARTS]; /* adapted part i: its projection (SQUAD_PROJ_*), */
    int yoff[LORA_MAX_PARTS]; /* its first row of the weight (column of the GEMM's output), */
    int kcol[LORA_MAX_PARTS]; /* its first rank column of a slot's R */
    void **w;                 /* the layer's weight pointer (widened: [n][in + ext]) */
    void *A;                  /* [n_slots][R][lda]: each slot's A rows, the scale folded in */
} lora_site;

typedef struct cu_be {
    const squad_model *m;
    int H, I, V, nl, n_gdn, n_attn, max_context, max_chunk;
    float eps;
    int f32;   /* precision EXACT: fp32 matrices, activations, K / V and the fp32 mixer kernels */
    size_t es; /* bytes of one activation element: 2 (bf16) or 4 */
    cudaStream_t st;
    cu_gemm_ctx gemm;
    cu_layer layers[SQUAD_MAX_LAYERS];
    cu_gdn_dims gd;
    cu_attn_dims ad;
    int NP;    /* GDN in-projection rows (padded to 8) */
    int ldQKV; /* attention in-projection rows (padded to 8) */
    int C;     /* GDN conv channels */
    int n_sm;
    char device_name[256];
    int device; /* the GPU (--device cuda:N): every call that may come from another thread sets it */

    bf16 *embed, *lm_head;
    float *final_norm, *inv_freq;

    size_t gdn_bytes; /* a slot's arena: S of every GDN layer, then conv inputs */
    size_t kv_pos_elems;
    cu_seq *seqs; /* [max_seqs] */
    int max_seqs;
    unsigned char *seq_mark; /* [max_seqs]: forward's check that no slot appears twice */

    /* scratch: tok_cap tokens (a replay's rows x bucket), blk_cap GDN blocks of 64 tokens */
    int tok_cap, blk_cap, max_rb; /* max_rb: the largest rows bucket (>= max_seqs) */
    float *h;
    void *x, *proj, *mix, *qb, *mlp; /* activations (bf16 or fp32) */
    void *gdn_scr, *att_part;
    cu_gdn_scratch scr;
    /* the parameters: one device buffer (every graph's cu_batch points into it) and, per replay of
     * one forward, a pinned staging area of prm_bytes (max_seqs of them: a replay has a row at least) */
    void *prm_dev;
    unsigned char *prm_host;
    size_t prm_bytes, last_upload;
    /* letter probabilities: device [max_rb][CU_MAX_SLOTS][CU_MAX_LETTERS]; host (pinned) the same
     * per row of a forward in replay order [max_seqs][CU_MAX_SLOTS][CU_MAX_LETTERS] */
    float *probs_dev, *probs_host;
    /* the full-vocabulary pass: normed slot rows [max_rb CU_MAX_SLOTS][H], the blocks' partials, the
     * figures (device per replay; host per forward, in replay order) */
    float *vocab_xn;
    void *vocab_parts;
    int vocab_blocks;
    squad_slot_vocab *vocab_dev, *vocab_host;
    int *order;     /* [max_seqs]: a forward's chunks in replay order */
    int *out_row;   /* [max_seqs]: chunk index -> its row in replay order (probs_host, router_host) */
    int *vocab_at;  /* [max_seqs]: chunk index -> its first figure in vocab_host */
    int *lora_at;   /* [max_seqs]: chunk index -> its route's resident adapter slot + 1 (0: the trunk) */
    int *run_bi;    /* [max_seqs]: chunk index -> the length bucket it runs in (plan_buckets) */
    int last_tok0, last_len; /* where the batch's first chunk sits in h after a forward, its real tokens */

    int n_spans, spans[MAX_SPANS];
    int splits[N_CHUNK_BUCKETS][N_ROW_BUCKETS][MAX_SPANS];
    size_t att_part_bytes; /* the partial-results buffer (the largest need over every shape) */
    cudaGraphExec_t graphs[N_CHUNK_BUCKETS][N_ROW_BUCKETS][MAX_SPANS];
    cuda_knobs knobs; /* the switches, read once at creation (graphs: replay captured graphs, else eagerly) */
    unsigned parts; /* the SQUAD_CUDA_PART_* kernel groups enqueue_batch runs: all (set in build), except
                       GEMMs only for plan making and tuning before a capture, and the graphs of
                       chosen groups (cu_backend_capture_parts) */
    int n_graphs;
    double capture_s;
    unsigned long long replays;

    /* specialists (NULL: none): the resident adapters and the router's chunk sum */
    const squad_specialists *sp;
    int n_lora_slots;                  /* max_adapters, or every specialist */
    int *slot_route;                   /* [n_lora_slots]: the route each slot holds, -1: none */
    unsigned long long *slot_used;     /* [n_lora_slots]: the clock of its last use */
    unsigned long long lora_clock, adapter_uploads;
    int lora_out[SQUAD_MAX_LAYERS][SQUAD_PROJ_COUNT]; /* out of an adapted projection, 0: none adapts it */
    int lora_rank[SQUAD_MAX_LAYERS][SQUAD_PROJ_COUNT]; /* its largest rank over the adapters */
    lora_site lsite[SQUAD_MAX_LAYERS][LORA_SITES]; /* the widened GEMMs (ext 0: the trunk's own) */
    void *lora_xw;                     /* a widened GEMM's input [tok_cap][in + ext] (the widest site) */
    size_t lora_xw_bytes;
    int lora_fit[CU_LORA_FIT_MAX + 1]; /* cu_lora_fit: the clusters of each size the GPU holds at once */
    /* The out / o term folded into the gate | up norm's launch (k_lora.cuh's fold_y; not on the exact
     * path): at chunks of up to lora_fold_rows tokens
     * the mixer writes y into lora_fold_y, whose rows' columns past y stay zero (written by nobody),
     * so the widened out GEMM adds y W^T alone and no launch makes out's u. Layers whose out site
     * has another shape than lora_fold_in + ext = lora_fold_ld keep the launch. */
    void *lora_fold_y;                 /* [lora_fold_rows][lora_fold_ld] bf16, NULL: no fold */
    int lora_fold_rows, lora_fold_in, lora_fold_ld;
    float *router_inv;                 /* [tok_cap] */
    double *router_dev;                /* [max_rb][H]: a replay's rows' sums */
    double *router_host;               /* [max_seqs][H], in replay order; pinned */

    /* images (docs/images.md): the vision tower (NULL: the model has none, or vision_why says why the
     * kernels cannot run it), the M-RoPE axis of each rotary frequency (device; NULL when the config's
     * mrope_section does not fit the rotary: chunks with positions are refused), and the image rows'
     * input rows of one forward (tok_cap rows of H fp32, uploaded before its replays; the graphs find
     * them through cu_batch.embeds, a fixed address) */
    cu_vision *vision;
    char vision_why[sizeof(((squad_err *)0)->msg)];
    int *mrope_axis;
    float *img_embeds;
    int *emb_at; /* [max_seqs]: chunk index -> its first row in img_embeds (-1: none) */

    void **allocs;
    int n_allocs, cap_allocs;
    size_t weight_bytes, state_bytes, scratch_bytes;
} cu_be;

static cu_be *impl_of(squad_backend *be) { return (cu_be *)be->impl; }

/* ---- device memory ---------------------------------------------------------------------------- */

enum { MEM_WEIGHT, MEM_STATE, MEM_SCRATCH };

static int dalloc(cu_be *cb, void **p, size_t bytes, int kind, squad_err *err) {
    *p = NULL;
    if (cb->n_allocs == cb->cap_allocs) {
        const int cap = cb->cap_allocs ? 2 * cb->cap_allocs : 256;
        void **na = (void **)realloc(cb->allocs, sizeof *na * (size_t)cap);
        if (!na) return cu_err(err, SQUAD_E_NOMEM, "out of memory (allocation table)");
        cb->allocs = na;
        cb->cap_allocs = cap;
    }
    if (bytes == 0) bytes = 16;
    CU_TRY(cudaMalloc(p, bytes));
    cb->allocs[cb->n_allocs++] = *p;
    /* The zeroing must be finished before the caller fills the buffer: uploads are plain cudaMemcpy
     * calls on the legacy default stream, which does not wait for cb->st (a non-blocking stream),
     * so a memset still queued behind a large one (the K / V cache) could land after the upload and
     * wipe the weights it just wrote. */
    CU_TRY(cudaMemsetAsync(*p, 0, bytes, cb->st));
    CU_TRY(cudaStreamSynchronize(cb->st));
    if (kind == MEM_WEIGHT)
        cb->weight_bytes += bytes;
    else if (kind == MEM_STATE)
        cb->state_bytes += bytes;
    else
        cb->scratch_bytes += bytes;
    return 0;
}

static int upload_vec(cu_be *cb, float **dst, const float *src, size_t n, const char *what, squad_err *err) {
    if (!src) return cu_err(err, SQUAD_E_MODEL, "CUDA backend: missing weight %s", what);
    int rc = dalloc(cb, (void **)dst, n * sizeof(float), MEM_WEIGHT, err);
    if (rc) return rc;
    CU_TRY(cudaMemcpy(*dst, src, n * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
}

/* Uploads matrices one after another as the rows of one device matrix of `rows` rows x cols, bf16
 * as they are or (f32) converted to fp32 through a host staging buffer. */
static int upload_fused(cu_be *cb, void **dst, const squad_mat *const *mats, int n, int rows, int cols, int f32,
                        const char *what, squad_err *err) {
    int rc = dalloc(cb, dst, (size_t)rows * cols * (f32 ? 4 : 2), MEM_WEIGHT, err);
    if (rc) return rc;
    size_t row = 0;
    for (int i = 0; i < n; i++) {
        const squad_mat *m = mats[i];
        if (!m->w || m->cols != cols)
            return cu_err(err, SQUAD_E_MODEL, "CUDA backend: %s: matrix %d missing or %d columns, expected %d",
                              what, i, m->cols, cols);
        if (row + (size_t)m->rows > (size_t)rows)
            return cu_err(err, SQUAD_E_MODEL, "CUDA backend: %s: more rows than expected", what);
        if (!f32) {
            CU_TRY(cudaMemcpy((bf16 *)*dst + row * cols, m->w, (size_t)m->rows * cols * 2, cudaMemcpyHostToDevice));
        } else {
            const size_t n_el = (size_t)m->rows * cols;
            float *tmp = (float *)malloc(n_el * sizeof(float));
            if (!tmp) return cu_err(err, SQUAD_E_NOMEM, "out of memory (%s staging)", what);
            for (size_t i = 0; i < n_el; i++) tmp[i] = squad_bf16_to_f32(m->w[i]);
            const cudaError_t e = cudaMemcpy((float *)*dst + row * cols, tmp, n_el * sizeof(float),
                                             cudaMemcpyHostToDevice);
            free(tmp);
            if (e != cudaSuccess) return cu_fail(err, "cudaMemcpy", e, __FILE__, __LINE__);
        }
        row += (size_t)m->rows;
    }
    return 0;
}

static int round8(int n) { return (n + 7) & ~7; }

/* ---- buckets ------------------------------------------------------------------------------------ */

static int chunk_bucket(int len) {
    for (int i = 0; i < N_CHUNK_BUCKETS; i++)
        if (len <= CHUNK_BUCKETS[i]) return i;
    return -1;
}

/* The bucket cuda_knobs.max_chunk asks for (the largest bucket not above it), and no larger than the
 * context needs (scratch is sized by it). */
static int choose_max_chunk(int want, int max_context) {
    int bi = 0;
    while (bi + 1 < N_CHUNK_BUCKETS && CHUNK_BUCKETS[bi + 1] <= want) bi++;
    while (bi > 0 && CHUNK_BUCKETS[bi - 1] >= max_context) bi--;
    return CHUNK_BUCKETS[bi];
}

static int span_bucket(const cu_be *cb, int keys) {
    for (int i = 0; i < cb->n_spans; i++)
        if (keys <= cb->spans[i]) return i;
    return cb->n_spans - 1;
}

/* The smallest rows bucket holding n rows. */
static int row_bucket(int n) {
    for (int i = 0; i < N_ROW_BUCKETS; i++)
        if (n <= ROW_BUCKETS[i]) return i;
    return N_ROW_BUCKETS - 1;
}

/* GDN blocks of 64 tokens a row of bucket b takes (a row never shares a block). */
static int row_blocks(int bucket) { return (bucket + CU_GDN_CHUNK - 1) / CU_GDN_CHUNK; }

/* Whether a replay of rows bucket rbi and length bucket bi fits the scratch. */
static int shape_fits(const cu_be *cb, int bi, int rbi) {
    const int rows = ROW_BUCKETS[rbi], b = CHUNK_BUCKETS[bi];
    return rows <= cb->max_rb && (long)rows * b <= cb->tok_cap &&
           (long)rows * row_blocks(b) <= cb->blk_cap;
}

/* The most rows one replay of length bucket bi takes (a rows bucket). */
static int max_rows_of(const cu_be *cb, int bi) {
    int r = 0;
    for (int i = 0; i < N_ROW_BUCKETS; i++)
        if (shape_fits(cb, bi, i)) r = ROW_BUCKETS[i];
    return r;
}

/* Span buckets SPAN_MIN, 2 SPAN_MIN, ... up to max_context (the last is max_context itself), and
 * attention's key splits per (bucket, rows bucket, span). Run again when max_context is lowered. */
static int set_spans(cu_be *cb, squad_err *err) {
    cb->n_spans = 0;
    for (long s = SPAN_MIN;; s *= 2) {
        if (cb->n_spans == MAX_SPANS) return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA backend: context too long");
        cb->spans[cb->n_spans++] = (int)(s < cb->max_context ? s : cb->max_context);
        if (s >= cb->max_context) break;
    }
    cb->att_part_bytes = 0;
    for (int bi = 0; cb->n_attn && bi < N_CHUNK_BUCKETS; bi++)
        for (int rbi = 0; rbi < N_ROW_BUCKETS; rbi++) {
            if (!shape_fits(cb, bi, rbi)) continue;
            const int nrows = ROW_BUCKETS[rbi], b = CHUNK_BUCKETS[bi];
            for (int si = 0; si < cb->n_spans; si++) {
                const int sp = cu_attn_splits(&cb->ad, nrows, b, cb->spans[si], cb->n_sm);
                cb->splits[bi][rbi][si] = sp;
                const size_t bytes = cb->f32 ? 0 : cu_attn_partial_bytes(&cb->ad, nrows * b, sp);
                if (bytes > cb->att_part_bytes) cb->att_part_bytes = bytes;
            }
        }
    return 0;
}

/* ---- sequence slots: the GDN arena and the own K / V, grown as rows get longer ---------------- */

static size_t kv_pos_bytes(const cu_be *cb) { return cb->kv_pos_elems * cb->es; }

static int check_seq(const cu_be *cb, int seq, squad_err *err) {
    return seq >= 0 && seq < cb->max_seqs
               ? 0
               : cu_err(err, SQUAD_E_INVALID, "CUDA: sequence slot %d (the backend has %d)", seq, cb->max_seqs);
}

/* The slot's arena, allocated (and zeroed, on the stream) on its first use. */
static int seq_arena(cu_be *cb, cu_seq *q, squad_err *err) {
    if (q->gdn || !cb->gdn_bytes) return 0;
    void *p = NULL;
    const cudaError_t e = cudaMalloc(&p, cb->gdn_bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cu_err(err, e == cudaErrorMemoryAllocation ? SQUAD_E_NOMEM : SQUAD_E_BACKEND,
                      "CUDA backend: no device memory for a sequence slot's state (%.1f MB): %s",
                      (double)cb->gdn_bytes / (1 << 20), cudaGetErrorString(e));
    }
    const cudaError_t ez = cudaMemsetAsync(p, 0, cb->gdn_bytes, cb->st);
    if (ez != cudaSuccess) {
        cudaFree(p);
        return cu_fail(err, "cudaMemsetAsync", ez, __FILE__, __LINE__);
    }
    q->gdn = (unsigned char *)p;
    return 0;
}

/* The K / V positions every slot holds now, together (be->kv_positions). */
static int kv_positions_held(const cu_be *cb) {
    long n = 0;
    for (int s = 0; s < cb->max_seqs; s++) n += cb->seqs[s].kv_cap;
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

/* Makes room in the slot's own K / V for `need` own positions (from its kv_split): a new buffer of
 * the next capacity (doubling from KV_SLOT_MIN_POSITIONS, at most max_context), the old contents
 * copied in on the stream and the old buffer freed once the stream has finished with it. Graphs
 * read the buffer through the parameters, so none needs recapturing. */
static int seq_kv(cu_be *cb, cu_seq *q, int need, squad_err *err) {
    if (!cb->n_attn || need <= q->kv_cap) return 0;
    if (need > cb->max_context)
        return cu_err(err, SQUAD_E_INVALID, "CUDA backend: position %d is past the longest row (%d)", need,
                      cb->max_context);
    long cap = q->kv_cap ? q->kv_cap : KV_SLOT_MIN_POSITIONS;
    while (cap < need) cap *= 2;
    if (cap > cb->max_context) cap = cb->max_context;
    const size_t old_bytes = (size_t)q->kv_cap * kv_pos_bytes(cb), bytes = (size_t)cap * kv_pos_bytes(cb);
    void *nkv = NULL;
    const cudaError_t e = cudaMalloc(&nkv, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cu_err(err, e == cudaErrorMemoryAllocation ? SQUAD_E_NOMEM : SQUAD_E_BACKEND,
                      "CUDA backend: no device memory to grow a slot's K / V to %ld positions (%.1f MB): %s", cap,
                      (double)bytes / (1 << 20), cudaGetErrorString(e));
    }
    cudaError_t ec = old_bytes ? cudaMemcpyAsync(nkv, q->kv, old_bytes, cudaMemcpyDeviceToDevice, cb->st) : cudaSuccess;
    /* the new tail zeroed, so nothing ever reads uninitialised memory there */
    if (ec == cudaSuccess) ec = cudaMemsetAsync((char *)nkv + old_bytes, 0, bytes - old_bytes, cb->st);
    if (ec == cudaSuccess) ec = cudaStreamSynchronize(cb->st);
    if (ec != cudaSuccess) {
        cudaFree(nkv);
        return cu_fail(err, "growing a slot's K / V", ec, __FILE__, __LINE__);
    }
    if (q->kv) cudaFree(q->kv);
    q->kv = nkv;
    q->kv_cap = (int)cap;
    return 0;
}

/* ---- specialists: resident adapters ------------------------------------------------------------ */

/* Frees a weight allocation of `bytes` made by dalloc (a weight replaced by its widened copy). */
static void dfree(cu_be *cb, void *p, size_t bytes) {
    for (int i = 0; i < cb->n_allocs; i++)
        if (cb->allocs[i] == p) {
            cudaFree(p);
            cb->allocs[i] = cb->allocs[--cb->n_allocs];
            cb->weight_bytes -= bytes;
            return;
        }
}

/* Writes value v into element i of a host staging buffer of bf16 or fp32 elements. */
static void stage_put(void *buf, int f32, size_t i, float v) {
    if (f32)
        ((float *)buf)[i] = v;
    else
        ((uint16_t *)buf)[i] = squad_f32_to_bf16(v);
}

/* Uploads route's adapter into slot s: for every widened GEMM, the slot's A block (each part's A
 * at its rank columns, the adapter's scale folded in; zeros past a part's rank and for parts the
 * adapter leaves alone) and the slot's K columns of the weight (each part's B in its rows and rank
 * columns, zeros elsewhere), bf16 or fp32 as the weights. The stream is drained first, so no
 * replay still reads what is replaced; the copies are finished before it returns. */
static int lora_upload(cu_be *cb, int s, int route, squad_err *err) {
    const squad_specialists *sp = cb->sp;
    const squad_adapter *a = &sp->adapters[route];
    const size_t es = cb->es;
    size_t a_elems = 0, b_elems = 0;
    for (int l = sp->split; l < cb->nl; l++)
        for (int k = 0; k < LORA_SITES; k++) {
            const lora_site *st = &cb->lsite[l][k];
            if (!st->ext) continue;
            if ((size_t)st->R * st->lda > a_elems) a_elems = (size_t)st->R * st->lda;
            if ((size_t)st->n * st->R > b_elems) b_elems = (size_t)st->n * st->R;
        }
    CU_TRY(cudaStreamSynchronize(cb->st));
    cb->slot_route[s] = -1;
    void *ha = calloc(a_elems ? a_elems : 1, es), *hb = calloc(b_elems ? b_elems : 1, es);
    if (!ha || !hb) {
        free(ha);
        free(hb);
        return cu_err(err, SQUAD_E_NOMEM, "out of memory (staging adapter '%s')", a->label);
    }
    cudaError_t e = cudaSuccess;
    for (int l = sp->split; l < cb->nl && e == cudaSuccess; l++)
        for (int k = 0; k < LORA_SITES && e == cudaSuccess; k++) {
            const lora_site *st = &cb->lsite[l][k];
            if (!st->ext) continue;
            memset(ha, 0, (size_t)st->R * st->lda * es);
            memset(hb, 0, (size_t)st->n * st->R * es);
            for (int i = 0; i < st->n_parts; i++) {
                const squad_lora_proj *lp = &a->proj[l][st->proj[i]];
                if (!lp->A) continue;
                for (int r = 0; r < lp->r; r++)
                    for (int j = 0; j < lp->in; j++)
                        stage_put(ha, cb->f32, (size_t)(st->kcol[i] + r) * st->lda + j,
                                  a->scale * lp->A[(size_t)r * lp->in + j]);
                for (int o = 0; o < lp->out; o++)
                    for (int r = 0; r < lp->r; r++)
                        stage_put(hb, cb->f32, (size_t)(st->yoff[i] + o) * st->R + st->kcol[i] + r,
                                  lp->B[(size_t)o * lp->r + r]);
            }
            e = cudaMemcpy((char *)st->A + (size_t)s * st->R * st->lda * es, ha, (size_t)st->R * st->lda * es,
                           cudaMemcpyHostToDevice);
            const size_t ldw = (size_t)(st->in + st->ext) * es;
            if (e == cudaSuccess)
                e = cudaMemcpy2D((char *)*st->w + (size_t)(st->in + s * st->R) * es, ldw, hb, (size_t)st->R * es,
                                 (size_t)st->R * es, (size_t)st->n, cudaMemcpyHostToDevice);
        }
    free(ha);
    free(hb);
    /* the copies (legacy stream) finished before a kernel on cb->st reads them */
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return cu_fail(err, "uploading an adapter", e, __FILE__, __LINE__);
    cb->slot_route[s] = route;
    cb->adapter_uploads++;
    return 0;
}

/* The slot (+ 1) the kernels read for route: 0 for the trunk; else the slot holding the route's
 * adapter, uploading it first into a free slot or the least recently used one. */
static int lora_select(cu_be *cb, int route, int *slot, squad_err *err) {
    *slot = 0;
    if (route == 0) return 0;
    cb->lora_clock++;
    int victim = 0;
    for (int s = 0; s < cb->n_lora_slots; s++) {
        if (cb->slot_route[s] == route) {
            cb->slot_used[s] = cb->lora_clock;
            *slot = s + 1;
            return 0;
        }
        /* an empty slot first, else the oldest use */
        const int ve = cb->slot_route[victim] < 0, se = cb->slot_route[s] < 0;
        if ((se && !ve) || (se == ve && cb->slot_used[s] < cb->slot_used[victim])) victim = s;
    }
    const int rc = lora_upload(cb, victim, route, err);
    if (rc) return rc;
    cb->slot_used[victim] = cb->lora_clock;
    *slot = victim + 1;
    return 0;
}

/* Every route of a batch resident at once, each chunk's slot (+ 1, 0: the trunk) in lora_at[]
 * (stage_replay writes it into every token of the chunk: cu_batch.token_slot). A batch with more
 * distinct specialist routes than resident slots is refused with SQUAD_E_UNSUPPORTED before any
 * upload (the engine then runs it route by route). Within the limit no route of the batch evicts
 * another: each selection stamps its slot with a newer clock than any slot used before the batch,
 * so the least recently used slot is never one this batch already chose. */
static int lora_resident(cu_be *cb, const squad_chunk *chunks, int n, squad_err *err) {
    int distinct = 0;
    for (int c = 0; c < n; c++) {
        if (chunks[c].route == 0) continue;
        int seen = 0;
        for (int d = 0; d < c && !seen; d++) seen = chunks[d].route == chunks[c].route;
        distinct += !seen;
    }
    if (distinct > cb->n_lora_slots)
        return cu_err(err, SQUAD_E_UNSUPPORTED,
                      "CUDA forward: a batch of %d specialist routes with %d resident adapter slots (max_adapters): "
                      "run it in parts",
                      distinct, cb->n_lora_slots);
    for (int c = 0; c < n; c++) {
        int slot = 0;
        for (int d = 0; d < c; d++)
            if (chunks[d].route == chunks[c].route) {
                slot = cb->lora_at[d];
                break;
            }
        if (!slot && chunks[c].route != 0) {
            const int rc = lora_select(cb, chunks[c].route, &slot, err);
            if (rc) return rc;
        }
        cb->lora_at[c] = slot;
    }
    return 0;
}

/* The projections of site k of layer l (the fused order of the weight's rows) and their widths;
 * returns how many; *in gets the GEMM's K, *w the layer's weight pointer. */
static int site_projs(cu_be *cb, int l, int k, int ids[LORA_MAX_PARTS], int widths[LORA_MAX_PARTS], int *in,
                      void ***w) {
    const squad_config *c = &cb->m->cfg;
    cu_layer *L = &cb->layers[l];
    const int lin = L->kind == SQUAD_LAYER_LINEAR, nv = c->lin_num_v_heads;
    const int k_out = lin ? nv * c->lin_v_dim : c->num_heads * c->head_dim;
    *in = cb->H;
    if (k == LORA_IN) {
        *w = &L->w_in;
        if (lin) {
            const int id[4] = {SQUAD_PROJ_IN_QKV, SQUAD_PROJ_IN_Z, SQUAD_PROJ_IN_B, SQUAD_PROJ_IN_A};
            const int wd[4] = {cb->C, nv * c->lin_v_dim, nv, nv};
            memcpy(ids, id, sizeof id), memcpy(widths, wd, sizeof wd);
            return 4;
        }
        const int kvd = c->num_kv_heads * c->head_dim;
        const int id[3] = {SQUAD_PROJ_Q, SQUAD_PROJ_K, SQUAD_PROJ_V};
        const int wd[3] = {c->num_heads * 2 * c->head_dim, kvd, kvd};
        memcpy(ids, id, sizeof id), memcpy(widths, wd, sizeof wd);
        return 3;
    }
    if (k == LORA_GU) {
        *w = &L->w_gu;
        ids[0] = SQUAD_PROJ_GATE, ids[1] = SQUAD_PROJ_UP, widths[0] = widths[1] = cb->I;
        return 2;
    }
    if (k == LORA_OUT) {
        *w = &L->w_out;
        *in = k_out;
        ids[0] = lin ? SQUAD_PROJ_OUT : SQUAD_PROJ_O, widths[0] = cb->H;
        return 1;
    }
    *w = &L->w_down;
    *in = cb->I;
    ids[0] = SQUAD_PROJ_DOWN, widths[0] = cb->H;
    return 1;
}

/* Widens the GEMMs of layer l that some adapter adapts (k_lora.cuh): the weight copied into
 * [n][in + ext] (the extra columns zero until an adapter is uploaded), the A blocks allocated
 * (zeros); *max_ldw grows to the widest input. */
static int widen_layer(cu_be *cb, int l, int *max_ldw, squad_err *err) {
    int rc;
    for (int k = 0; k < LORA_SITES; k++) {
        lora_site *st = &cb->lsite[l][k];
        int ids[LORA_MAX_PARTS], widths[LORA_MAX_PARTS], in = 0, at = 0;
        void **w = NULL;
        const int n = site_projs(cb, l, k, ids, widths, &in, &w);
        memset(st, 0, sizeof *st);
        for (int i = 0; i < n; i++) {
            const int p = ids[i];
            if (cb->lora_out[l][p]) {
                if (cb->lora_out[l][p] != widths[i])
                    return cu_err(err, SQUAD_E_INVALID, "specialists: projection %d of layer %d has %d outputs, not %d",
                                  p, l, cb->lora_out[l][p], widths[i]);
                st->proj[st->n_parts] = p;
                st->yoff[st->n_parts] = at;
                st->kcol[st->n_parts] = st->R;
                st->n_parts++;
                st->R += (cb->lora_rank[l][p] + 15) / 16 * 16;
            }
            at += widths[i];
        }
        if (!st->n_parts) continue;
        if (!cb->f32 && in % 8) /* k_lora.cu's vector loads and stores of x */
            return cu_err(err, SQUAD_E_UNSUPPORTED,
                          "specialists on the bf16 path: layer %d's projection input of %d (a multiple of 8 needed)",
                          l, in);
        st->in = in;
        st->n = k == LORA_IN ? (cb->layers[l].kind == SQUAD_LAYER_LINEAR ? cb->NP : cb->ldQKV) : at;
        st->lda = cu_lora_lda(in);
        /* the widened rows a multiple of LORA_K_ALIGN (zeros past the slots' columns) */
        st->ext = (in + cb->n_lora_slots * st->R + LORA_K_ALIGN - 1) / LORA_K_ALIGN * LORA_K_ALIGN - in;
        st->w = w;
        const size_t ldw = (size_t)(in + st->ext) * cb->es;
        void *nw = NULL;
        if ((rc = dalloc(cb, &nw, (size_t)st->n * ldw, MEM_WEIGHT, err))) return rc;
        CU_TRY(cudaMemcpy2D(nw, ldw, *w, (size_t)in * cb->es, (size_t)in * cb->es, (size_t)st->n,
                            cudaMemcpyDeviceToDevice));
        CU_TRY(cudaDeviceSynchronize());
        dfree(cb, *w, (size_t)st->n * in * cb->es);
        *w = nw;
        if ((rc = dalloc(cb, &st->A, (size_t)cb->n_lora_slots * st->R * st->lda * cb->es, MEM_WEIGHT, err))) return rc;
        if (in + st->ext > *max_ldw) *max_ldw = in + st->ext;
    }
    return 0;
}

/* The folded out term's buffer (cu_be.lora_fold_y), sized for the first layer whose out and gate |
 * up sites k_lora_fold takes; none on the exact path. */
#define LORA_FOLD_MAX_ROWS 512 /* a hit's chunks (the small-M GEMM's); longer ones make out's u on its own */
static int setup_lora_fold(cu_be *cb, const squad_specialists *sp, squad_err *err) {
    if (cb->f32) return 0;
    const int rows = cb->tok_cap < LORA_FOLD_MAX_ROWS ? cb->tok_cap : LORA_FOLD_MAX_ROWS;
    for (int l = sp->split; l < cb->nl; l++) {
        const lora_site *so = &cb->lsite[l][LORA_OUT], *sg = &cb->lsite[l][LORA_GU];
        if (!so->ext || !sg->ext || !cu_lora_fold_slices(sg->in, sg->R, so->in, so->R, 16, cb->n_sm))
            continue;
        cb->lora_fold_rows = rows;
        cb->lora_fold_in = so->in;
        cb->lora_fold_ld = so->in + so->ext;
        /* zeros from the allocation: the columns past y are never written */
        return dalloc(cb, &cb->lora_fold_y, (size_t)rows * cb->lora_fold_ld * cb->es, MEM_SCRATCH, err);
    }
    return 0;
}

/* Sets the specialists up at creation: the slots (max_adapters of them, 0 meaning one per
 * specialist), which projections any adapter adapts and with what rank, the widened GEMMs of the
 * layers from split on, their input buffer, and the router's sum. No adapter is uploaded yet. */
static int setup_specialists(cu_be *cb, const squad_specialists *sp, int max_adapters, squad_err *err) {
    const squad_config *c = &cb->m->cfg;
    if (sp->hidden != cb->H || sp->n_layers != cb->nl)
        return cu_err(err, SQUAD_E_INVALID,
                      "specialists %s were loaded for another model (%d layers of %d, not %d of %d)", sp->dir,
                      sp->n_layers, sp->hidden, cb->nl, cb->H);
    if (max_adapters < 0) return cu_err(err, SQUAD_E_INVALID, "--max-adapters %d: must be 0 (all) or more", max_adapters);
    if (sp->router.n_labels < 1 || sp->router.hidden != cb->H || sp->router.layer < 0 || sp->router.layer >= cb->nl ||
        sp->split < 0 || sp->split >= cb->nl)
        return cu_err(err, SQUAD_E_INVALID, "specialists %s: router or split out of range", sp->dir);
    const int n_spec = sp->router.n_labels - 1;
    cb->n_lora_slots = max_adapters == 0 || max_adapters > n_spec ? n_spec : max_adapters;
    if (cb->n_lora_slots < 1) cb->n_lora_slots = 1;
    for (int route = 1; route < sp->router.n_labels; route++) {
        const squad_adapter *a = &sp->adapters[route];
        for (int l = 0; l < cb->nl; l++)
            for (int p = 0; p < SQUAD_PROJ_COUNT; p++) {
                const squad_lora_proj *lp = &a->proj[l][p];
                if (!lp->A) continue;
                /* the loader refuses these; the uploads index with them, so they are checked again */
                const int lin = c->layer_types[l] == SQUAD_LAYER_LINEAR;
                const int gdn_p = p <= SQUAD_PROJ_OUT, att_p = p >= SQUAD_PROJ_Q && p <= SQUAD_PROJ_O;
                if (l < sp->split || (lin && att_p) || (!lin && gdn_p) || lp->r < 1 || lp->r > SQUAD_LORA_MAX_RANK ||
                    !lp->B || (cb->lora_out[l][p] && cb->lora_out[l][p] != lp->out))
                    return cu_err(err, SQUAD_E_INVALID, "specialist '%s': projection %d of layer %d does not fit",
                                  a->label, p, l);
                cb->lora_out[l][p] = lp->out;
                if (lp->r > cb->lora_rank[l][p]) cb->lora_rank[l][p] = lp->r;
            }
    }
    int rc, max_ldw = 0;
    for (int l = sp->split; l < cb->nl; l++)
        if ((rc = widen_layer(cb, l, &max_ldw, err))) return rc;
    /* a part's `in` must be its GEMM's (the loader checks the shapes against the base) */
    for (int route = 1; route < sp->router.n_labels; route++)
        for (int l = sp->split; l < cb->nl; l++)
            for (int k = 0; k < LORA_SITES; k++)
                for (int i = 0; i < cb->lsite[l][k].n_parts; i++) {
                    const lora_site *st = &cb->lsite[l][k];
                    const squad_lora_proj *lp = &sp->adapters[route].proj[l][st->proj[i]];
                    if (lp->A && lp->in != st->in)
                        return cu_err(err, SQUAD_E_INVALID,
                                      "specialist '%s': projection %d of layer %d reads %d, not %d",
                                      sp->adapters[route].label, st->proj[i], l, lp->in, st->in);
                }
    cb->slot_route = (int *)malloc(sizeof(int) * (size_t)cb->n_lora_slots);
    cb->slot_used = (unsigned long long *)calloc((size_t)cb->n_lora_slots, sizeof(unsigned long long));
    if (!cb->slot_route || !cb->slot_used) return cu_err(err, SQUAD_E_NOMEM, "out of memory (adapter slots)");
    for (int s = 0; s < cb->n_lora_slots; s++) cb->slot_route[s] = -1;
    const size_t R = (size_t)cb->tok_cap;
    if ((rc = setup_lora_fold(cb, sp, err))) return rc;
    if (!cb->f32 && (rc = cu_lora_fit(cb->lora_fit, err))) return rc;
    cb->lora_xw_bytes = R * max_ldw * cb->es;
    if (max_ldw && (rc = dalloc(cb, &cb->lora_xw, cb->lora_xw_bytes, MEM_SCRATCH, err))) return rc;
    if ((rc = dalloc(cb, (void **)&cb->router_inv, R * sizeof(float), MEM_SCRATCH, err))) return rc;
    if ((rc = dalloc(cb, (void **)&cb->router_dev, (size_t)cb->max_rb * cb->H * sizeof(double), MEM_SCRATCH, err)))
        return rc;
    CU_TRY(cudaMallocHost((void **)&cb->router_host, (size_t)cb->max_seqs * cb->H * sizeof(double)));
    cb->sp = sp;
    return 0;
}

/* ---- the forward of one replay (enqueued on cb->st; captured into a graph or run eagerly) ------- */

/* The batch view of the parameter buffer for a replay of `nrows` rows of `bucket` tokens. */
static cu_batch batch_of(const cu_be *cb, int nrows, int bucket) {
    cu_batch b = cu_batch_at(cb->prm_dev, nrows, bucket);
    b.embeds = cb->img_embeds;
    return b;
}

/* Layer l's widened GEMM k (LORA_*), or NULL: no specialists, below split, or no adapter adapts it. */
static const lora_site *lora_site_of(const cu_be *cb, int l, int k) {
    if (!cb->sp || l < cb->sp->split) return NULL;
    const lora_site *st = &cb->lsite[l][k];
    return st->ext ? st : NULL;
}

/* Whether layer l's out term folds into its gate | up norm's launch at a chunk of rows tokens. */
static bool lora_fold_at(const cu_be *cb, int l, int rows) {
    const lora_site *so = lora_site_of(cb, l, LORA_OUT), *sg = lora_site_of(cb, l, LORA_GU);
    return cb->lora_fold_y && so && sg && rows <= cb->lora_fold_rows && so->in == cb->lora_fold_in &&
           so->in + so->ext == cb->lora_fold_ld &&
           cu_lora_fold_slices(sg->in, sg->R, so->in, so->R, rows, cb->n_sm) > 0;
}

/* The widened GEMM after site k of layer l in forward order (the next layers' too), or NULL. */
static const lora_site *lora_site_after(const cu_be *cb, int l, int k) {
    for (;;) {
        if (++k == LORA_SITES) {
            k = 0;
            if (++l >= cb->nl) return NULL;
        }
        const lora_site *st = lora_site_of(cb, l, k);
        if (st) return st;
    }
}

/* The widened input [x | u] of layer l's site k into lora_xw (k_lora.cuh), x made by producer src: the norm
 * of h with weight w (CU_LORA_NORM), SiLU * up of x_src (CU_LORA_SILU), a copy of x_src, ld_src
 * apart (CU_LORA_COPY), or already there (CU_LORA_IN_PLACE: the mixer wrote it). */
static int enqueue_lora_input(cu_be *cb, const cu_batch *b, int l, int k, int src, const float *w, const void *x_src,
                              int ld_src, squad_err *err) {
    const int rows = b->nrows * b->bucket;
    const bool fold = lora_fold_at(cb, l, rows); /* out's term rides in gate | up's launch */
    const lora_site *st = lora_site_of(cb, l, k), *next = lora_site_after(cb, l, k);
    cu_lora_input_args a;
    memset(&a, 0, sizeof a);
    a.src = src;
    a.h = cb->h;
    a.w = w;
    a.eps = cb->eps;
    a.x_src = x_src;
    a.ld_src = ld_src;
    a.in = st->in;
    a.A = st->A;
    a.lda = st->lda;
    a.R = st->R;
    a.n_slots = cb->n_lora_slots;
    a.xw = cb->lora_xw;
    a.ldw = st->in + st->ext;
    a.f32 = cb->f32;
    memcpy(a.fit, cb->lora_fit, sizeof a.fit);
    if (next) { /* the next widened input's A into L2 while this one runs */
        a.prefetch = next->A;
        a.prefetch_bytes = (size_t)cb->n_lora_slots * next->R * next->lda * cb->es;
        if (fold && k == LORA_IN) { /* the next launch is the folded one: gate | up's A too */
            const lora_site *sg = lora_site_of(cb, l, LORA_GU);
            a.prefetch2 = sg->A;
            a.prefetch2_bytes = (size_t)cb->n_lora_slots * sg->R * sg->lda * cb->es;
        }
    }
    if (fold && k == LORA_GU) {
        const lora_site *so = lora_site_of(cb, l, LORA_OUT);
        a.fold_y = cb->lora_fold_y;
        a.fold_ldy = cb->lora_fold_ld;
        a.fold_in = so->in;
        a.fold_A = so->A;
        a.fold_lda = so->lda;
        a.fold_R = so->R;
        a.fold_B = (const char *)*so->w + (size_t)so->in * cb->es; /* B' from column in of [H][in + ext] */
        a.fold_ldb = so->in + so->ext;
    }
    return cu_lora_input(&a, b->token_slot, rows, cb->n_sm, cb->st, err);
}

/* The router's sums of the replay's rows (h entering router.layer). */
static int enqueue_router(cu_be *cb, const cu_batch *bt, squad_err *err) {
    for (int r = 0; r < bt->nrows; r++) {
        const size_t t0 = (size_t)r * bt->bucket;
        const int rc = cu_router_sum(cb->h + t0 * cb->H, cb->H, cb->sp->router.eps, bt->prm + r, cb->router_inv + t0,
                                     cb->router_dev + (size_t)r * cb->H, bt->bucket, cb->st, err);
        if (rc) return rc;
    }
    return 0;
}

/* The kernel groups of cb->parts, in forward order, for a replay of rows bucket rbi, length bucket
 * bi and span bucket si. With every group this is the forward; with a subset the groups left out
 * leave their outputs as they were (plan making, the benchmarks' ablation timing). */
static int enqueue_batch(cu_be *cb, int bi, int rbi, int si, squad_err *err) {
    const cu_batch bt = batch_of(cb, ROW_BUCKETS[rbi], CHUNK_BUCKETS[bi]);
    const cu_batch *b = &bt;
    const int rows = bt.nrows * bt.bucket; /* the GEMMs' and norms' tokens */
    const int H = cb->H, I = cb->I;
    const squad_config *cfg = &cb->m->cfg;
    const int f = cb->f32;
    const bool gemm = cb->parts & SQUAD_CUDA_PART_GEMM, norm = cb->parts & SQUAD_CUDA_PART_NORM;
    const bool gdn = cb->parts & SQUAD_CUDA_PART_GDN, attn = cb->parts & SQUAD_CUDA_PART_ATTN;
    const bool silu = cb->parts & SQUAD_CUDA_PART_SILU;
    /* the mixers' own kernels (CU_GDN_*, CU_ATT_* in the bits' order; 0: all) */
    const unsigned gdn_stages = (cb->parts & SQUAD_CUDA_PART_GDN) / SQUAD_CUDA_PART_GDN_CONV;
    const unsigned att_stages = (cb->parts & SQUAD_CUDA_PART_ATTN) / SQUAD_CUDA_PART_ATT_PREP;
    cb->gd.stages = gdn_stages == 15 ? 0 : gdn_stages;
    cb->ad.stages = att_stages == 7 ? 0 : att_stages;
    int rc;
    if (norm && (rc = cu_embed_rmsnorm(cb->embed, b, cb->h, cb->x, cb->layers[0].in_norm, H, cb->eps, f, cb->st, err)))
        return rc;
    for (int l = 0; l < cb->nl; l++) {
        const cu_layer *L = &cb->layers[l];
        const int lin = L->kind == SQUAD_LAYER_LINEAR;
        const int n_in = lin ? cb->NP : cb->ldQKV;
        const int k_out = lin ? cfg->lin_num_v_heads * cfg->lin_v_dim : cfg->num_heads * cfg->head_dim;
        /* the router reads h as it enters its layer (the embeddings for layer 0): each row's sum */
        const bool router_here = cb->sp && norm && l == cb->sp->router.layer;
        if (router_here && (rc = enqueue_router(cb, &bt, err))) return rc;
        /* the specialists' widened GEMMs (k_lora.cuh): their input [x | u] is made in place of the
         * trunk's norm, SiLU or (before out / o) on its own, and the GEMM's K grows by ext */
        const lora_site *s_in = lora_site_of(cb, l, LORA_IN), *s_out = lora_site_of(cb, l, LORA_OUT);
        const lora_site *s_gu = lora_site_of(cb, l, LORA_GU), *s_dn = lora_site_of(cb, l, LORA_DOWN);
        const bool widen = gemm && !cb->gemm.tune; /* the GEMM-only plan making leaves its scratch alone */
        rc = 0;
        if (s_in && norm) /* layer 0's norm came with the embeddings: its x is copied */
            rc = l == 0 ? enqueue_lora_input(cb, b, l, LORA_IN, CU_LORA_COPY, NULL, cb->x, H, err)
                        : enqueue_lora_input(cb, b, l, LORA_IN, CU_LORA_NORM, L->in_norm, NULL, 0, err);
        else if (l > 0 && norm)
            rc = cu_rmsnorm(cb->h, cb->x, L->in_norm, rows, H, cb->eps, f, cb->st, err);
        if (rc) return rc;
        if (gemm && (rc = cu_gemm(&cb->gemm, L->w_in, s_in ? cb->lora_xw : cb->x, cb->proj, rows, n_in,
                                  H + (s_in ? s_in->ext : 0), 0, f, cb->st, err)))
            return rc;
        /* an adapted out / o: the mixer writes its output straight into the widened input's first
         * columns (its row stride the site's), and only u is made after it; folded (lora_fold_at),
         * into lora_fold_y, whose u columns stay zero, and gate | up's launch adds out's term */
        const bool direct = s_out != NULL, fold = lora_fold_at(cb, l, rows);
        void *mix = fold ? cb->lora_fold_y : direct ? cb->lora_xw : cb->mix;
        cb->gd.ldY = cb->ad.ldo = direct ? k_out + s_out->ext : 0;
        if (lin && gdn &&
            (rc = cu_gdn_forward(&cb->gd, cb->proj, L->conv_off, L->conv_w, L->A_log, L->dt_bias, L->gdn_norm, L->s_off,
                                 mix, &cb->scr, b, cb->st, err)))
            return rc;
        if (!lin && attn) {
            /* this layer's K and V at position 0, in elements, in a slot's own buffer and in a blob
             * alike (the same position-major layout); both buffers come from the parameters */
            const size_t kvd = (size_t)cfg->num_kv_heads * cfg->head_dim;
            const ptrdiff_t ko = (ptrdiff_t)((size_t)L->attn_index * 2 * kvd), vo = ko + (ptrdiff_t)kvd;
            rc = cu_attn_forward(&cb->ad, cb->proj, L->q_norm, L->k_norm, cb->inv_freq, ko, vo, ko, vo, cb->qb,
                                 cb->att_part, cb->splits[bi][rbi][si], mix, b, cb->st, err);
            if (rc) return rc;
        }
        cb->gd.ldY = cb->ad.ldo = 0;
        if (s_out && widen && !fold && /* folded: the gate | up norm's launch takes out's term */
            (rc = enqueue_lora_input(cb, b, l, LORA_OUT, direct ? CU_LORA_IN_PLACE : CU_LORA_COPY, NULL, cb->mix, k_out,
                                     err)))
            return rc;
        const void *out_x = s_out ? (fold ? cb->lora_fold_y : cb->lora_xw) : cb->mix;
        if (gemm && (rc = cu_gemm(&cb->gemm, L->w_out, out_x, cb->h, rows, H,
                                  k_out + (s_out ? s_out->ext : 0), 1, f, cb->st, err)))
            return rc;
        if (norm && (rc = s_gu ? enqueue_lora_input(cb, b, l, LORA_GU, CU_LORA_NORM, L->post_norm, NULL, 0, err)
                               : cu_rmsnorm(cb->h, cb->x, L->post_norm, rows, H, cb->eps, f, cb->st, err)))
            return rc;
        if (gemm && (rc = cu_gemm(&cb->gemm, L->w_gu, s_gu ? cb->lora_xw : cb->x, cb->proj, rows, 2 * I,
                                  H + (s_gu ? s_gu->ext : 0), 0, f, cb->st, err)))
            return rc;
        if (silu && (rc = s_dn ? enqueue_lora_input(cb, b, l, LORA_DOWN, CU_LORA_SILU, NULL, cb->proj, 2 * I, err)
                               : cu_silu_mul(cb->proj, cb->mlp, rows, I, f, cb->st, err)))
            return rc;
        if (gemm && (rc = cu_gemm(&cb->gemm, L->w_down, s_dn ? cb->lora_xw : cb->mlp, cb->h, rows, H,
                                  I + (s_dn ? s_dn->ext : 0), 1, f, cb->st, err)))
            return rc;
    }
    if (!norm) return 0;
    return cu_letter_probs(cb->h, cb->final_norm, cb->lm_head, b, CU_MAX_SLOTS, cb->probs_dev, H, cb->eps, cb->st, err);
}

/* The forward of (bucket, rows bucket, span bucket), only the kernel groups in parts, captured into
 * an executable graph. The GEMM plans of the shape are made and tuned first, outside the capture
 * (on scratch outputs only). */
static int capture_batch(cu_be *cb, int bi, int rbi, int si, unsigned parts, cudaGraphExec_t *out, squad_err *err) {
    *out = NULL;
    cb->parts = SQUAD_CUDA_PART_GEMM;
    cb->gemm.tune = 1;
    int rc = enqueue_batch(cb, bi, rbi, si, err);
    cb->parts = SQUAD_CUDA_PART_ALL;
    cb->gemm.tune = 0;
    if (rc) return rc;
    CU_TRY(cudaStreamSynchronize(cb->st));
    CU_TRY(cudaStreamBeginCapture(cb->st, cudaStreamCaptureModeThreadLocal));
    cb->parts = parts;
    rc = enqueue_batch(cb, bi, rbi, si, err);
    cb->parts = SQUAD_CUDA_PART_ALL;
    cb->gd.stages = cb->ad.stages = 0;
    cudaGraph_t g = NULL;
    const cudaError_t ec = cudaStreamEndCapture(cb->st, &g);
    if (rc) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        return rc;
    }
    if (ec != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        return cu_fail(err, "cudaStreamEndCapture", ec, __FILE__, __LINE__);
    }
    cudaGraphExec_t ex = NULL;
    const cudaError_t ei = cudaGraphInstantiate(&ex, g, 0);
    cudaGraphDestroy(g);
    if (ei != cudaSuccess) return cu_fail(err, "cudaGraphInstantiate", ei, __FILE__, __LINE__);
    const cudaError_t eu = cudaGraphUpload(ex, cb->st);
    if (eu != cudaSuccess) {
        cudaGraphExecDestroy(ex);
        return cu_fail(err, "cudaGraphUpload", eu, __FILE__, __LINE__);
    }
    *out = ex;
    return 0;
}

/* The graph of (bucket, rows bucket, span), captured now if it does not exist yet. */
static int get_graph(cu_be *cb, int bi, int rbi, int si, squad_err *err) {
    if (cb->graphs[bi][rbi][si]) return 0;
    const double t0 = cu_now_seconds();
    const int rc = capture_batch(cb, bi, rbi, si, SQUAD_CUDA_PART_ALL, &cb->graphs[bi][rbi][si], err);
    if (rc) return rc;
    cb->n_graphs++;
    cb->capture_s += cu_now_seconds() - t0;
    return 0;
}

/* The smallest span bucket a chunk of bucket bi can have (its real length exceeds the previous
 * bucket's). */
static int min_span_index(const cu_be *cb, int bi) {
    const int prev = bi > 0 ? CHUNK_BUCKETS[bi - 1] : 0;
    return span_bucket(cb, prev + 1);
}

/* Every single-row graph (the rows bucket of one; batches capture theirs on first use). */
static int precapture_all(cu_be *cb, squad_err *err) {
    for (int bi = 0; bi < N_CHUNK_BUCKETS && CHUNK_BUCKETS[bi] <= cb->max_chunk; bi++)
        for (int si = min_span_index(cb, bi); si < cb->n_spans; si++) {
            const int rc = get_graph(cb, bi, 0, si, err);
            if (rc) return rc;
        }
    return 0;
}

/* A replay's parameters (the staging area src: rows, ids and answers up to `bytes`) to the device,
 * ahead of the replay on the same stream. */
static int upload_params(cu_be *cb, const void *src, size_t bytes, squad_err *err) {
    CU_TRY(cudaMemcpyAsync(cb->prm_dev, src, bytes, cudaMemcpyHostToDevice, cb->st));
    cb->last_upload = bytes;
    return 0;
}

/* ---- forward: checks, slot state, the replays ---------------------------------------------------- */

/* Every check of one chunk, before any state changes. */
static int check_chunk(const cu_be *cb, const squad_chunk *ch, int k, squad_err *err) {
    if (check_seq(cb, ch->seq, err)) return SQUAD_E_INVALID;
    if (!ch->ids || ch->len < 1 || ch->len > cb->max_chunk)
        return cu_err(err, SQUAD_E_INVALID, "CUDA forward: chunk %d: length %d outside [1, %d]", k, ch->len,
                      cb->max_chunk);
    if (ch->start < 0 || ch->start > cb->max_context - ch->len)
        return cu_err(err, SQUAD_E_INVALID, "CUDA forward: chunk %d: [%d, %d) beyond the context of %d positions", k,
                      ch->start, ch->start + ch->len, cb->max_context);
    if (ch->n_slots < 0 || ch->n_slots > CU_MAX_SLOTS)
        return cu_err(err, SQUAD_E_INVALID, "CUDA forward: chunk %d: %d slots (at most %d)", k, ch->n_slots,
                      CU_MAX_SLOTS);
    if (ch->n_slots > 0) {
        if (!ch->probs) return cu_err(err, SQUAD_E_INVALID, "CUDA forward: chunk %d: slots but no output", k);
        if (!ch->letters || ch->n_letters < 1 || ch->n_letters > CU_MAX_LETTERS)
            return cu_err(err, SQUAD_E_INVALID, "CUDA forward: chunk %d: %d letters (1..%d)", k, ch->n_letters,
                          CU_MAX_LETTERS);
        for (int j = 0; j < ch->n_letters; j++)
            if (ch->letters[j] < 0 || ch->letters[j] >= cb->V)
                return cu_err(err, SQUAD_E_INVALID, "CUDA forward: letter id %d outside the vocabulary",
                              ch->letters[j]);
    }
    for (int i = 0; i < ch->n_slots; i++)
        if (ch->slots[i] < 0 || ch->slots[i] >= ch->len)
            return cu_err(err, SQUAD_E_INVALID, "CUDA forward: chunk %d: slot %d outside the chunk", k, ch->slots[i]);
    if (ch->route != 0 && (!cb->sp || ch->route < 0 || ch->route >= cb->sp->router.n_labels))
        return cu_err(err, SQUAD_E_INVALID, "CUDA forward: route %d: the backend has %d routes", ch->route,
                      cb->sp ? cb->sp->router.n_labels : 1);
    if (ch->router_sum && !cb->sp)
        return cu_err(err, SQUAD_E_INVALID, "CUDA forward: router features asked without specialists");
    for (int t = 0; t < ch->len; t++)
        if (ch->ids[t] < 0 || ch->ids[t] >= cb->V)
            return cu_err(err, SQUAD_E_INVALID, "CUDA forward: token id %d outside the vocabulary", ch->ids[t]);
    if (ch->positions && cb->n_attn && !cb->mrope_axis)
        return cu_err(err, SQUAD_E_INVALID,
                      "CUDA forward: chunk %d has M-RoPE positions but the model's mrope_section does not split its "
                      "rotary",
                      k);
    if (ch->embeds && !cb->img_embeds)
        return cu_err(err, SQUAD_E_INVALID, "CUDA forward: chunk %d has image embeddings but the model has no vision "
                                            "tower", k);
    return 0;
}

/* The tokens of a chunk that take a row of its embeds (the image token's). */
static int image_tokens(const cu_be *cb, const squad_chunk *ch) {
    int n = 0;
    if (ch->embeds)
        for (int t = 0; t < ch->len; t++) n += ch->ids[t] == cb->m->cfg.image_token_id;
    return n;
}

/* The whole batch checked: sizes, each chunk, no slot twice, the token budget. */
static int check_batch(cu_be *cb, const squad_chunk *chunks, int n, squad_err *err) {
    if (!chunks || n < 1 || n > cb->max_seqs)
        return cu_err(err, SQUAD_E_INVALID, "CUDA forward: a batch of %d chunks (1..%d)", n, cb->max_seqs);
    long tokens = 0;
    int rc = 0;
    memset(cb->seq_mark, 0, (size_t)cb->max_seqs);
    for (int k = 0; k < n && !rc; k++) {
        const squad_chunk *ch = &chunks[k];
        if ((rc = check_chunk(cb, ch, k, err))) break;
        if (cb->seq_mark[ch->seq]) {
            rc = cu_err(err, SQUAD_E_INVALID, "CUDA forward: sequence slot %d appears twice in one batch", ch->seq);
            break;
        }
        cb->seq_mark[ch->seq] = 1;
        tokens += ch->len;
    }
    if (!rc && tokens > cb->tok_cap)
        rc = cu_err(err, SQUAD_E_INVALID, "CUDA forward: a batch of %ld tokens (at most %d)", tokens, cb->tok_cap);
    return rc;
}

/* The slot of each chunk made ready: its arena, its read-in-place prefix no longer than the chunk's
 * start (a chunk that rewrites read-in-place positions keeps reading the blob below its start and
 * writes its own from there; the engine never does this after a restore, the contract allows it),
 * its own K / V large enough for the chunk. */
static int prepare_slots(cu_be *cb, const squad_chunk *chunks, int n, squad_err *err) {
    for (int k = 0; k < n; k++) {
        const squad_chunk *ch = &chunks[k];
        cu_seq *q = &cb->seqs[ch->seq];
        int rc = seq_arena(cb, q, err);
        if (rc) return rc;
        if (ch->start < q->kv_split) {
            q->kv_split = ch->start;
            if (q->kv_split == 0) q->kv_src = NULL;
        }
        if ((rc = seq_kv(cb, q, ch->start + ch->len - q->kv_split, err))) return rc;
    }
    return 0;
}

/* The image chunks' input rows into img_embeds, one after another (cb->emb_at: each chunk's first),
 * ahead of the replays on the stream (the previous forward ended with the stream synchronised, so no
 * replay still reads them). At most tok_cap rows: a batch holds at most that many tokens. */
static int upload_embeds(cu_be *cb, const squad_chunk *chunks, int n, squad_err *err) {
    int next = 0;
    for (int c = 0; c < n; c++) {
        const int k = image_tokens(cb, &chunks[c]);
        cb->emb_at[c] = chunks[c].embeds ? next : -1;
        if (k == 0) continue;
        if (next + k > cb->tok_cap)
            return cu_err(err, SQUAD_E_INVALID, "CUDA forward: %d image rows in one batch (at most %d)", next + k,
                          cb->tok_cap);
        CU_TRY(cudaMemcpyAsync(cb->img_embeds + (size_t)next * cb->H, chunks[c].embeds,
                               (size_t)k * cb->H * sizeof(float), cudaMemcpyHostToDevice, cb->st));
        next += k;
    }
    return 0;
}

/* The length bucket each chunk runs in (cb->run_bi): its own, except that a group of short chunks
 * rides in the next larger group present when that costs at most MERGE_PAD_TOKENS padded tokens and no
 * replay more: every replay reads all the weights and runs all the kernels once (on the 0.8B model
 * about 0.7 ms, the GEMM time of ~500 tokens), so a few padded tokens are cheaper than a pass. */
static void plan_buckets(cu_be *cb, const squad_chunk *chunks, int n) {
    int count[N_CHUNK_BUCKETS] = {0}, to[N_CHUNK_BUCKETS];
    for (int c = 0; c < n; c++) count[chunk_bucket(chunks[c].len)]++;
    for (int i = 0; i < N_CHUNK_BUCKETS; i++) to[i] = i;
    for (int i = 0; i < N_CHUNK_BUCKETS; i++) {
        if (!count[i]) continue;
        int j = i + 1;
        while (j < N_CHUNK_BUCKETS && !count[j]) j++;
        if (j == N_CHUNK_BUCKETS) break;
        const int cap = max_rows_of(cb, j);
        if (cap < 1) continue;
        const long extra = (long)count[i] * (CHUNK_BUCKETS[j] - CHUNK_BUCKETS[i]);
        const int before = (count[j] + cap - 1) / cap, after = (count[j] + count[i] + cap - 1) / cap;
        if (extra <= MERGE_PAD_TOKENS && after == before) {
            count[j] += count[i];
            count[i] = 0;
            to[i] = j;
        }
    }
    for (int i = N_CHUNK_BUCKETS - 1; i >= 0; i--) /* chains: i -> j -> k (j's target is final already) */
        to[i] = to[to[i]];
    for (int c = 0; c < n; c++) cb->run_bi[c] = to[chunk_bucket(chunks[c].len)];
}

/* The replay order: chunks grouped by the bucket they run in (ascending), the group of chunks[0]
 * last and chunks[0] last in it, so it lands in the last replay (squad_cuda_backend_hidden). */
static void replay_order(cu_be *cb, int n) {
    const int b0 = cb->run_bi[0];
    int m = 0;
    for (int bi = 0; bi < N_CHUNK_BUCKETS; bi++) {
        if (bi == b0) continue;
        for (int k = 0; k < n; k++)
            if (cb->run_bi[k] == bi) cb->order[m++] = k;
    }
    for (int k = 1; k < n; k++)
        if (cb->run_bi[k] == b0) cb->order[m++] = k;
    cb->order[m++] = 0;
}

/* Fills the staging area dst with a replay of the chunks order[0 .. k) (k <= nrows, rows bucket
 * nrows, length bucket `bucket`): rows, the whole-replay row, ids, answers. vocab_base counts the
 * replay's full-vocabulary slots. Returns the bytes to upload (through the last row's answers when
 * a row has slots). */
static size_t stage_replay(const cu_be *cb, unsigned char *dst, const squad_chunk *chunks, const int *order, int k,
                           int nrows, int bucket, int *n_vocab, int *max_vocab_slots) {
    cu_chunk_params *rows = (cu_chunk_params *)dst;
    int *ids = (int *)(dst + cu_batch_ids_off(nrows));
    cu_row_answers *ans = (cu_row_answers *)(dst + cu_batch_ans_off(nrows, bucket));
    cu_token_image *img = (cu_token_image *)(dst + cu_batch_img_off(nrows, bucket));
    int last_ans = -1, any_image = 0;
    *n_vocab = 0;
    *max_vocab_slots = 0;
    memset(rows, 0, (size_t)(nrows + 1) * sizeof *rows);
    for (int r = 0; r < nrows; r++) {
        cu_chunk_params *p = &rows[r];
        int *rid = ids + (size_t)r * bucket;
        p->vocab_base = -1;
        if (r >= k) { /* padding: len 0, id 0 */
            memset(rid, 0, (size_t)bucket * sizeof(int));
            continue;
        }
        const squad_chunk *ch = &chunks[order[r]];
        const cu_seq *q = &cb->seqs[ch->seq];
        p->kv_src = q->kv_split > 0 ? q->kv_src : NULL;
        p->kv_work = q->kv;
        p->gdn = q->gdn;
        p->gdn_in = q->gdn_src;
        p->kv_split = q->kv_split;
        p->start = ch->start;
        p->len = ch->len;
        p->n_slots = ch->n_slots;
        memcpy(rid, ch->ids, (size_t)ch->len * sizeof(int));
        memset(rid + ch->len, 0, (size_t)(bucket - ch->len) * sizeof(int));
        if (ch->positions || ch->embeds) { /* an image row: its tokens' positions and input rows */
            cu_token_image *ti = img + (size_t)r * bucket;
            int emb = cb->emb_at[order[r]];
            p->image = (ch->positions ? CU_ROW_POSITIONS : 0) | (ch->embeds ? CU_ROW_EMBEDS : 0);
            for (int t = 0; t < bucket; t++) {
                const int real = t < ch->len, at = ch->start + t;
                ti[t].t = real && ch->positions ? ch->positions[3 * t] : at;
                ti[t].h = real && ch->positions ? ch->positions[3 * t + 1] : at;
                ti[t].w = real && ch->positions ? ch->positions[3 * t + 2] : at;
                ti[t].emb = real && ch->embeds && ch->ids[t] == cb->m->cfg.image_token_id ? emb++ : -1;
            }
            any_image = 1;
        }
        if (ch->n_slots > 0) {
            cu_row_answers *a = &ans[r];
            a->n_letters = ch->n_letters;
            for (int i = 0; i < ch->n_slots; i++) {
                a->slots[i] = ch->slots[i];
                a->nopts[i] = ch->nopts[i] < 1 ? 1 : (ch->nopts[i] > ch->n_letters ? ch->n_letters : ch->nopts[i]);
            }
            memcpy(a->letters, ch->letters, (size_t)ch->n_letters * sizeof(int));
            last_ans = r;
            if (ch->vocab) {
                p->vocab_base = *n_vocab;
                *n_vocab += ch->n_slots;
                if (ch->n_slots > *max_vocab_slots) *max_vocab_slots = ch->n_slots;
            }
        }
    }
    rows[nrows].len = nrows * bucket; /* the whole replay, for the LoRA kernels */
    rows[nrows].vocab_base = -1;
    if (cb->sp) { /* each token's adapter slot, uploaded through them */
        int *ts = (int *)(dst + cu_batch_slot_off(nrows, bucket));
        for (int r = 0; r < nrows; r++) {
            const int len = r < k ? chunks[order[r]].len : 0, slot = r < k ? cb->lora_at[order[r]] : 0;
            for (int t = 0; t < bucket; t++) ts[(size_t)r * bucket + t] = t < len ? slot : 0;
        }
    }
    /* the tail as far as the replay reads it: the image tokens, the adapter slots, or the answers */
    if (any_image) return cu_batch_bytes(nrows, bucket);
    if (cb->sp) return cu_batch_img_off(nrows, bucket);
    return last_ans >= 0 ? cu_batch_ans_off(nrows, bucket) + (size_t)(last_ans + 1) * sizeof(cu_row_answers)
                         : cu_batch_ans_off(nrows, bucket);
}

/* One replay: the chunks order[0 .. k) of length bucket bi (row p0 of the forward's replay order
 * onwards), staged in stage, uploaded, replayed (or run eagerly), and their outputs copied back
 * into the host buffers at their rows (probs, router sums) and figures (vocab, from *vocab_next). */
static int run_replay(cu_be *cb, const squad_chunk *chunks, const int *order, int k, int bi, int p0,
                      unsigned char *stage, int *vocab_next, squad_err *err) {
    const int bucket = CHUNK_BUCKETS[bi];
    const int rbi = row_bucket(k), nrows = ROW_BUCKETS[rbi];
    int span = 0, want_probs = 0, want_router = 0;
    for (int r = 0; r < k; r++) {
        const squad_chunk *ch = &chunks[order[r]];
        if (ch->start + ch->len > span) span = ch->start + ch->len;
        if (ch->n_slots > want_probs) want_probs = ch->n_slots;
        want_router |= ch->router_sum != NULL;
    }
    const int si = span_bucket(cb, span);
    int n_vocab = 0, max_vslots = 0;
    const size_t bytes = stage_replay(cb, stage, chunks, order, k, nrows, bucket, &n_vocab, &max_vslots);
    int rc = upload_params(cb, stage, bytes, err);
    if (rc) return rc;
    if (cb->knobs.graphs) {
        if ((rc = get_graph(cb, bi, rbi, si, err))) return rc;
        CU_TRY(cudaGraphLaunch(cb->graphs[bi][rbi][si], cb->st));
    } else if ((rc = enqueue_batch(cb, bi, rbi, si, err))) {
        return rc;
    }
    cb->replays++;
    const cu_batch b = batch_of(cb, nrows, bucket);
    if (n_vocab > 0) {
        if ((rc = cu_vocab(cb->h, cb->final_norm, cb->lm_head, &b, max_vslots, n_vocab, cb->V, cb->H, cb->eps,
                           cb->vocab_xn, cb->vocab_parts, cb->vocab_blocks, cb->vocab_dev, cb->st, err)))
            return rc;
        CU_TRY(cudaMemcpyAsync(cb->vocab_host + *vocab_next, cb->vocab_dev, (size_t)n_vocab * sizeof(squad_slot_vocab),
                               cudaMemcpyDeviceToHost, cb->st));
        for (int r = 0; r < k; r++) {
            const squad_chunk *ch = &chunks[order[r]];
            if (ch->vocab && ch->n_slots > 0) {
                cb->vocab_at[order[r]] = *vocab_next;
                *vocab_next += ch->n_slots;
            }
        }
    }
    const size_t row_floats = (size_t)CU_MAX_SLOTS * CU_MAX_LETTERS;
    if (want_probs > 0) /* the rows' first want_probs slots, one strided copy */
        CU_TRY(cudaMemcpy2DAsync(cb->probs_host + (size_t)p0 * row_floats, row_floats * sizeof(float), cb->probs_dev,
                                 row_floats * sizeof(float), (size_t)want_probs * CU_MAX_LETTERS * sizeof(float),
                                 (size_t)k, cudaMemcpyDeviceToHost, cb->st));
    if (want_router)
        CU_TRY(cudaMemcpyAsync(cb->router_host + (size_t)p0 * cb->H, cb->router_dev, (size_t)k * cb->H * sizeof(double),
                               cudaMemcpyDeviceToHost, cb->st));
    for (int r = 0; r < k; r++) cb->out_row[order[r]] = p0 + r;
    cb->last_tok0 = (k - 1) * bucket; /* the replay's last row (chunks[0] when this replay is the last) */
    cb->last_len = chunks[order[k - 1]].len;
    return 0;
}

static int be_forward(squad_backend *be, const squad_chunk *chunks, int n_chunks, squad_err *err) {
    cu_be *cb = impl_of(be);
    int rc = check_batch(cb, chunks, n_chunks, err);
    if (rc) return rc;
    cb->last_len = 0;
    if ((rc = prepare_slots(cb, chunks, n_chunks, err))) return rc;
    be->kv_positions = kv_positions_held(cb);
    if (cb->sp && (rc = lora_resident(cb, chunks, n_chunks, err))) return rc;
    if ((rc = upload_embeds(cb, chunks, n_chunks, err))) return rc;
    plan_buckets(cb, chunks, n_chunks);
    replay_order(cb, n_chunks);
    int p0 = 0, n_replays = 0, vocab_next = 0;
    while (p0 < n_chunks) { /* a group of one length bucket, in replays of at most its rows' limit */
        const int bi = cb->run_bi[cb->order[p0]];
        int g = p0;
        while (g < n_chunks && cb->run_bi[cb->order[g]] == bi) g++;
        const int cap = max_rows_of(cb, bi);
        if (cap < 1) return cu_err(err, SQUAD_E_BACKEND, "CUDA forward: bucket %d fits no replay", CHUNK_BUCKETS[bi]);
        for (int r0 = p0; r0 < g; r0 += cap) {
            const int k = g - r0 < cap ? g - r0 : cap;
            rc = run_replay(cb, chunks, cb->order + r0, k, bi, r0, cb->prm_host + (size_t)n_replays * cb->prm_bytes,
                            &vocab_next, err);
            if (rc) return rc;
            n_replays++;
        }
        p0 = g;
    }
    /* every row's forward wrote its whole GDN state into its arena: a restored blob is read no more */
    for (int c = 0; c < n_chunks; c++) cb->seqs[chunks[c].seq].gdn_src = NULL;
    CU_TRY(cudaStreamSynchronize(cb->st));
    const size_t row_floats = (size_t)CU_MAX_SLOTS * CU_MAX_LETTERS;
    for (int c = 0; c < n_chunks; c++) {
        const squad_chunk *ch = &chunks[c];
        const int row = cb->out_row[c];
        if (ch->n_slots > 0)
            memcpy(ch->probs, cb->probs_host + (size_t)row * row_floats,
                   (size_t)ch->n_slots * CU_MAX_LETTERS * sizeof(float));
        if (ch->vocab && ch->n_slots > 0)
            memcpy(ch->vocab, cb->vocab_host + cb->vocab_at[c], (size_t)ch->n_slots * sizeof(squad_slot_vocab));
        if (ch->router_sum) memcpy(ch->router_sum, cb->router_host + (size_t)row * cb->H, (size_t)cb->H * sizeof(double));
    }
    return 0;
}

/* ---- state -------------------------------------------------------------------------------------- */

/* Checkpoint blobs: from the host tier's stream-ordered pool (cuda_host_tier.cu), so neither a
 * save nor a promotion pays cudaMalloc, nor an eviction cudaFree's device-wide synchronisation. */
static void *be_alloc(squad_backend *be, size_t bytes, squad_err *err) {
    cu_be *cb = impl_of(be);
    return cu_tier_blob_alloc(be, cb->device, cb->st, bytes, err);
}

static void be_release(squad_backend *be, void *p) { cu_tier_blob_release(be, impl_of(be)->st, p); }

static int be_reset(squad_backend *be, int seq, squad_err *err) {
    cu_be *cb = impl_of(be);
    if (check_seq(cb, seq, err)) return SQUAD_E_INVALID;
    cu_seq *q = &cb->seqs[seq];
    q->kv_split = 0; /* the blobs read in place are no longer ours to read */
    q->kv_src = NULL;
    q->gdn_src = NULL;
    const int fresh = q->gdn == NULL;
    int rc = seq_arena(cb, q, err); /* a new arena is zeroed already */
    if (rc) return rc;
    if (!fresh && cb->gdn_bytes) CU_TRY(cudaMemsetAsync(q->gdn, 0, cb->gdn_bytes, cb->st));
    return 0;
}

static int be_save_gdn(squad_backend *be, int seq, void *dst, squad_err *err) {
    cu_be *cb = impl_of(be);
    if (check_seq(cb, seq, err)) return SQUAD_E_INVALID;
    cu_seq *q = &cb->seqs[seq];
    int rc = seq_arena(cb, q, err); /* a slot never used holds the zero state */
    if (rc) return rc;
    const void *src = q->gdn_src ? (const void *)q->gdn_src : (const void *)q->gdn; /* restored, not yet run */
    if (cb->gdn_bytes && src != dst)
        CU_TRY(cudaMemcpyAsync(dst, src, cb->gdn_bytes, cudaMemcpyDeviceToDevice, cb->st));
    return 0;
}

static int be_load_gdn(squad_backend *be, int seq, const void *src, squad_err *err) {
    cu_be *cb = impl_of(be);
    if (check_seq(cb, seq, err)) return SQUAD_E_INVALID;
    cu_seq *q = &cb->seqs[seq];
    if (cb->gdn_bytes && !src) return cu_err(err, SQUAD_E_INVALID, "CUDA load_gdn: no blob");
    int rc = seq_arena(cb, q, err); /* where the next forward writes the state it reads from src */
    if (rc) return rc;
    /* no copy: the slot's next forward starts from the blob (cu_seq.gdn_src), which must stay valid
     * until then (the engine's plan pins the checkpoint it restored until the row ends) */
    q->gdn_src = cb->gdn_bytes ? (const unsigned char *)src : NULL;
    return 0;
}

static int be_save_kv(squad_backend *be, int seq, void *dst, int n, squad_err *err) {
    cu_be *cb = impl_of(be);
    if (check_seq(cb, seq, err)) return SQUAD_E_INVALID;
    const cu_seq *q = &cb->seqs[seq];
    /* positions below kv_split from the blob read in place, the rest from the slot's own K / V */
    const int from_blob = n < q->kv_split ? n : q->kv_split;
    if (n < 0 || n > cb->max_context || n - from_blob > q->kv_cap)
        return cu_err(err, SQUAD_E_INVALID, "CUDA save_kv: %d positions (%d held)", n, q->kv_split + q->kv_cap);
    const size_t pb = kv_pos_bytes(cb);
    const size_t blob_bytes = (size_t)from_blob * pb, bytes = (size_t)n * pb;
    if (blob_bytes) CU_TRY(cudaMemcpyAsync(dst, q->kv_src, blob_bytes, cudaMemcpyDeviceToDevice, cb->st));
    if (bytes > blob_bytes)
        CU_TRY(cudaMemcpyAsync((char *)dst + blob_bytes, q->kv, bytes - blob_bytes, cudaMemcpyDeviceToDevice, cb->st));
    return 0;
}

static int be_load_kv(squad_backend *be, int seq, const void *src, int blob_positions, int n, squad_err *err) {
    cu_be *cb = impl_of(be);
    if (check_seq(cb, seq, err)) return SQUAD_E_INVALID;
    if (n < 0 || n > blob_positions || n > cb->max_context || (n > 0 && !src))
        return cu_err(err, SQUAD_E_INVALID, "CUDA load_kv: %d positions of a %d-position blob", n, blob_positions);
    /* read in place (position-major: the blob's prefix has the own buffer's layout); nothing is
     * copied, so a hit costs no K / V traffic beyond what attention reads */
    cu_seq *q = &cb->seqs[seq];
    q->kv_src = n > 0 ? src : NULL;
    q->kv_split = n;
    return 0;
}

/* The device's free memory now (cudaMemGetInfo): what an automatic cache budget is sized from. */
static int be_memory_free(squad_backend *be, size_t *free_bytes, squad_err *err) {
    size_t total = 0;
    *free_bytes = 0;
    CU_TRY(cudaSetDevice(((cu_be *)be->impl)->device)); /* the backend's device, whichever thread asks */
    CU_TRY(cudaMemGetInfo(free_bytes, &total));
    return 0;
}

/* The chunk graphs captured so far and the seconds spent capturing them. */
static void be_graph_stats(const squad_backend *be, int *graphs, double *capture_s) {
    const cu_be *cb = (const cu_be *)be->impl;
    *graphs = cb->n_graphs;
    *capture_s = cb->capture_s;
}

extern "C" int squad_cuda_backend_hidden(const squad_backend *be, int t, float *out, squad_err *err) {
    if (!be || !be->name || strcmp(be->name, "cuda") || !be->impl)
        return cu_err(err, SQUAD_E_INVALID, "not a CUDA backend");
    const cu_be *cb = (const cu_be *)be->impl;
    if (t < 0 || t >= cb->last_len)
        return cu_err(err, SQUAD_E_INVALID, "token %d is outside the last batch's first chunk", t);
    CU_TRY(cudaStreamSynchronize(cb->st));
    CU_TRY(cudaMemcpy(out, cb->h + ((size_t)cb->last_tok0 + t) * cb->H, (size_t)cb->H * sizeof(float),
                      cudaMemcpyDeviceToHost));
    return 0;
}

/* The vision tower on one image (backend.h), on the backend's stream; not at the same time as forward. */
static int be_vision_forward(squad_backend *be, const float *pixel_values, const int grid[3], float *out,
                             squad_err *err) {
    cu_be *cb = impl_of(be);
    if (!cb->vision)
        return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA backend: the vision tower cannot run here: %s", cb->vision_why);
    CU_TRY(cudaSetDevice(cb->device)); /* the backend's device, whichever thread asks */
    return cu_vision_forward(cb->vision, &cb->gemm, cb->st, pixel_values, grid, out, err);
}

int cu_backend_vision(squad_backend *be, cu_vision **v, cu_gemm_ctx **g, cudaStream_t *st, squad_err *err) {
    if (!be || !be->name || strcmp(be->name, "cuda") || !be->impl)
        return cu_err(err, SQUAD_E_INVALID, "the vision tower's internals: not a CUDA backend");
    cu_be *cb = impl_of(be);
    if (!cb->vision)
        return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA backend: no vision tower%s%s", cb->vision_why[0] ? ": " : "",
                      cb->vision_why);
    *v = cb->vision;
    *g = &cb->gemm;
    *st = cb->st;
    return 0;
}

static void be_destroy(squad_backend *be) {
    if (!be) return;
    cu_be *cb = impl_of(be);
    cu_host_tier_detach(be);
    if (cb) {
        if (cb->st) cudaStreamSynchronize(cb->st);
        for (int i = 0; i < N_CHUNK_BUCKETS; i++)
            for (int r = 0; r < N_ROW_BUCKETS; r++)
                for (int j = 0; j < MAX_SPANS; j++)
                    if (cb->graphs[i][r][j]) cudaGraphExecDestroy(cb->graphs[i][r][j]);
        cu_vision_free(cb->vision);
        cu_gemm_free(&cb->gemm);
        for (int i = 0; i < cb->n_allocs; i++) cudaFree(cb->allocs[i]);
        free(cb->allocs);
        for (int s = 0; cb->seqs && s < cb->max_seqs; s++) {
            if (cb->seqs[s].gdn) cudaFree(cb->seqs[s].gdn);
            if (cb->seqs[s].kv) cudaFree(cb->seqs[s].kv);
        }
        free(cb->seqs);
        free(cb->seq_mark);
        free(cb->order);
        free(cb->out_row);
        free(cb->vocab_at);
        free(cb->lora_at);
        free(cb->run_bi);
        free(cb->emb_at);
        if (cb->prm_host) cudaFreeHost(cb->prm_host);
        if (cb->probs_host) cudaFreeHost(cb->probs_host);
        if (cb->vocab_host) cudaFreeHost(cb->vocab_host);
        if (cb->router_host) cudaFreeHost(cb->router_host);
        free(cb->slot_route);
        free(cb->slot_used);
        if (cb->st) cudaStreamDestroy(cb->st);
        cudaGetLastError();
        free(cb);
    }
    free(be);
}

/* ---- creation ----------------------------------------------------------------------------------- */

extern "C" int squad_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

#define CU_MIN_MAJOR 9 /* compute capability the kernels are built for (sm_90: bulk copies, mbarriers) */

extern "C" int squad_cuda_device_usable(void) {
    int major = 0;
    if (squad_cuda_device_count() < 1 ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return major >= CU_MIN_MAJOR;
}

static int check_config(const squad_config *c, squad_err *err) {
    if (c->num_layers < 1 || c->num_layers > SQUAD_MAX_LAYERS)
        return cu_err(err, SQUAD_E_MODEL, "CUDA backend: %d layers", c->num_layers);
    if (c->hidden_size < 32 || c->hidden_size % 8)
        return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA backend: hidden_size %d must be a multiple of 8",
                          c->hidden_size);
    if (c->intermediate_size % 8)
        return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA backend: intermediate_size %d must be a multiple of 8",
                          c->intermediate_size);
    return 0;
}

/* Lowers max_context to what the device can hold: the K / V capacity now plus what the free memory,
 * less KV_HEADROOM_BYTES, can add. Everything else is allocated by now, and the K / V is the only
 * buffer that grows with the rows. The span buckets follow (the partial-results buffer, sized for
 * the longer context, is large enough for the shorter). */
static int bound_context(cu_be *cb, squad_err *err) {
    if (!cb->n_attn) return 0;
    size_t free_bytes = 0, total = 0;
    CU_TRY(cudaMemGetInfo(&free_bytes, &total));
    const size_t room = free_bytes > KV_HEADROOM_BYTES ? free_bytes - KV_HEADROOM_BYTES : 0;
    const size_t fit = room / kv_pos_bytes(cb); /* what one slot's own K / V could grow to */
    if (fit >= (size_t)cb->max_context) return 0;
    cb->max_context = fit > 0 ? (int)fit : 1;
    if (cb->max_chunk > cb->max_context) cb->max_chunk = cb->max_context;
    return set_spans(cb, err);
}

/* The M-RoPE axis of each rotary frequency (cu_attn_dims.mrope_axis), as transformers' interleaved
 * M-RoPE assigns them: frequency j turns by h when j % 3 == 1 and j < 3 section[1], by w when
 * j % 3 == 2 and j < 3 section[2], else by t; without interleaving, the sections follow each other
 * (t, then h, then w). Left NULL when the sections do not split rd / 2 (a text-only config's
 * defaults may not): chunks with positions are then refused. */
static int setup_mrope(cu_be *cb, squad_err *err) {
    const squad_config *c = &cb->m->cfg;
    const int half = c->rotary_dim / 2, *sec = c->mrope_section;
    if (half < 1 || half > 512 || sec[0] < 0 || sec[1] < 0 || sec[2] < 0 || sec[0] + sec[1] + sec[2] != half ||
        c->mrope_interleaved < 0)
        return 0;
    int axis[512];
    for (int j = 0; j < half; j++) {
        if (c->mrope_interleaved)
            axis[j] = j % 3 == 1 && j < 3 * sec[1] ? 1 : j % 3 == 2 && j < 3 * sec[2] ? 2 : 0;
        else
            axis[j] = j < sec[0] ? 0 : j < sec[0] + sec[1] ? 1 : 2;
    }
    int rc = dalloc(cb, (void **)&cb->mrope_axis, (size_t)half * sizeof(int), MEM_WEIGHT, err);
    if (rc) return rc;
    CU_TRY(cudaMemcpy(cb->mrope_axis, axis, (size_t)half * sizeof(int), cudaMemcpyHostToDevice));
    cb->ad.mrope_axis = cb->mrope_axis;
    return 0;
}

/* The vision tower, when the model has one (vision_cuda.cu), and the image rows' input buffer. A tower
 * whose shapes the kernels do not take leaves the text model working: vision_forward then answers
 * with the reason (vision_why). */
static int setup_vision(cu_be *cb, squad_err *err) {
    const squad_model *m = cb->m;
    if (!m->cfg.has_vision) return 0;
    int rc = dalloc(cb, (void **)&cb->img_embeds, (size_t)cb->tok_cap * cb->H * sizeof(float), MEM_SCRATCH, err);
    if (rc) return rc;
    squad_err ve;
    memset(&ve, 0, sizeof ve);
    rc = m->vision ? cu_vision_new(m, cb->f32, &cb->vision, &ve)
                   : cu_err(&ve, SQUAD_E_UNSUPPORTED, "no vision weights bound");
    if (rc == SQUAD_E_UNSUPPORTED) {
        snprintf(cb->vision_why, sizeof cb->vision_why, "%s", ve.msg);
        return 0;
    }
    if (rc) {
        if (err) *err = ve;
        return rc;
    }
    cb->weight_bytes += cu_vision_weight_bytes(cb->vision);
    return 0;
}

static int build(cu_be *cb, const squad_model *m, const squad_engine_opts *opts, int max_context, squad_err *err) {
    const squad_config *c = &m->cfg;
    int rc;
    if ((rc = check_config(c, err))) return rc;
    cb->m = m;
    cb->H = c->hidden_size;
    cb->I = c->intermediate_size;
    cb->V = c->vocab_size;
    cb->nl = c->num_layers;
    cb->eps = c->rms_eps;
    cb->max_context = max_context;
    if ((rc = cuda_knobs_read(&cb->knobs, err))) return rc;
    cb->max_chunk = choose_max_chunk(cb->knobs.max_chunk, max_context);
    /* sequence slots and the scratch of a replay */
    if (opts && (opts->max_rows < 0 || opts->max_rows > MAX_SEQS))
        return cu_err(err, SQUAD_E_INVALID, "CUDA backend: max_rows %d (0: the default %d; at most %d)", opts->max_rows,
                      DEFAULT_SEQS, MAX_SEQS);
    if (opts && opts->batch_tokens < 0)
        return cu_err(err, SQUAD_E_INVALID, "CUDA backend: batch_tokens %d", opts->batch_tokens);
    cb->max_seqs = opts && opts->max_rows > 0 ? opts->max_rows : DEFAULT_SEQS;
    cb->max_rb = ROW_BUCKETS[row_bucket(cb->max_seqs)];
    cb->tok_cap = cb->max_chunk;
    if (opts && opts->batch_tokens > cb->tok_cap)
        cb->tok_cap = opts->batch_tokens < MAX_BATCH_TOKENS ? opts->batch_tokens : MAX_BATCH_TOKENS;
    cb->blk_cap = (cb->tok_cap + CU_GDN_CHUNK - 1) / CU_GDN_CHUNK + cb->max_rb; /* a row's blocks round up */
    cb->seqs = (cu_seq *)calloc((size_t)cb->max_seqs, sizeof(cu_seq));
    cb->seq_mark = (unsigned char *)calloc((size_t)cb->max_seqs, 1);
    cb->order = (int *)calloc((size_t)cb->max_seqs, sizeof(int));
    cb->out_row = (int *)calloc((size_t)cb->max_seqs, sizeof(int));
    cb->vocab_at = (int *)calloc((size_t)cb->max_seqs, sizeof(int));
    cb->lora_at = (int *)calloc((size_t)cb->max_seqs, sizeof(int));
    cb->run_bi = (int *)calloc((size_t)cb->max_seqs, sizeof(int));
    cb->emb_at = (int *)calloc((size_t)cb->max_seqs, sizeof(int));
    if (!cb->seqs || !cb->seq_mark || !cb->order || !cb->out_row || !cb->vocab_at || !cb->lora_at || !cb->run_bi ||
        !cb->emb_at)
        return cu_err(err, SQUAD_E_NOMEM, "out of memory (sequence slots)");
    cb->f32 = opts && opts->precision == SQUAD_PRECISION_EXACT;
    cb->es = cb->f32 ? 4 : 2;
    cb->n_gdn = squad_config_count_layers(c, SQUAD_LAYER_LINEAR);
    cb->n_attn = squad_config_count_layers(c, SQUAD_LAYER_FULL);
    cb->parts = SQUAD_CUDA_PART_ALL;

    cb->device = opts ? opts->device_index : 0;
    if (cb->device < 0 || cb->device >= squad_cuda_device_count())
        return cu_err(err, SQUAD_E_INVALID, "--device cuda:%d: this machine has %d CUDA GPU(s) (cuda:0 .. cuda:%d)",
                      cb->device, squad_cuda_device_count(), squad_cuda_device_count() - 1);
    CU_TRY(cudaSetDevice(cb->device));
    cudaDeviceProp prop;
    CU_TRY(cudaGetDeviceProperties(&prop, cb->device));
    cb->n_sm = prop.multiProcessorCount;
    snprintf(cb->device_name, sizeof cb->device_name, "%s", prop.name);
    if (prop.major < CU_MIN_MAJOR)
        return cu_err(err, SQUAD_E_UNSUPPORTED,
                      "CUDA backend: %s is compute capability %d.%d (%d.0+ needed: the kernels are built for sm_90)",
                      prop.name, prop.major, prop.minor, CU_MIN_MAJOR);
    CU_TRY(cudaStreamCreateWithFlags(&cb->st, cudaStreamNonBlocking));
    if ((rc = cu_gemm_init(&cb->gemm, &cb->knobs, err))) return rc;

    /* dims */
    cb->C = squad_config_gdn_channels(c);
    cb->gd.nk = c->lin_num_k_heads;
    cb->gd.nv = c->lin_num_v_heads;
    cb->gd.dk = c->lin_k_dim;
    cb->gd.dv = c->lin_v_dim;
    cb->gd.K = c->conv_kernel;
    cb->NP = round8(cb->C + c->lin_num_v_heads * c->lin_v_dim + 2 * c->lin_num_v_heads);
    cb->gd.ldP = cb->NP;
    cb->gd.eps = c->rms_eps;
    cb->gd.f32 = cb->f32;
    cb->gd.short_rows = CU_GDN_SHORT_ROWS;
    cb->gd.fused_rows = cb->knobs.gdn_fused_rows;
    cb->gd.n_sm = cb->n_sm; /* scan_rg, prep_split, conv_groups 0: chosen per launch */
    cb->ad.f32 = cb->f32;
    cb->ad.nh = c->num_heads;
    cb->ad.nkv = c->num_kv_heads;
    cb->ad.hd = c->head_dim;
    cb->ad.rd = c->rotary_dim;
    cb->ldQKV = round8(c->num_heads * 2 * c->head_dim + 2 * c->num_kv_heads * c->head_dim);
    cb->ad.ldQKV = cb->ldQKV;
    cb->ad.eps = c->rms_eps;
    cb->ad.max_context = max_context; /* unused by the kernels: the K / V capacity follows the rows */
    cb->kv_pos_elems = (size_t)cb->n_attn * 2 * c->num_kv_heads * c->head_dim;
    cb->ad.kv_stride = cb->kv_pos_elems;
    if (cb->n_gdn) {
        if (!cu_gdn_supported(&cb->gd))
            return cu_err(err, SQUAD_E_UNSUPPORTED,
                              "CUDA backend: linear attention shape nk %d nv %d dk %d dv %d K %d not supported "
                              "(dk, dv padded to 16, 32, 64 or 128; nv a multiple of nk; K <= %d)",
                              cb->gd.nk, cb->gd.nv, cb->gd.dk, cb->gd.dv, cb->gd.K, CU_MAX_CONV_K);
        if ((rc = cu_gdn_init(&cb->gd, err))) return rc;
    }
    if (cb->n_attn) {
        if (!cu_attn_supported(&cb->ad))
            return cu_err(err, SQUAD_E_UNSUPPORTED,
                              "CUDA backend: attention shape nh %d nkv %d hd %d rd %d not supported (hd 16 .. 256)",
                              cb->ad.nh, cb->ad.nkv, cb->ad.hd, cb->ad.rd);
        if ((rc = cu_attn_init(&cb->ad, cb->knobs.att_sm90, err))) return rc;
    }

    if ((rc = set_spans(cb, err))) return rc; /* span buckets, as far as the asked context */

    /* weights */
    if (!m->embed.w || m->embed.rows != cb->V || m->embed.cols != cb->H)
        return cu_err(err, SQUAD_E_MODEL, "CUDA backend: embed_tokens missing or misshapen");
    {
        const squad_mat *e[1] = {&m->embed};
        if ((rc = upload_fused(cb, (void **)&cb->embed, e, 1, cb->V, cb->H, 0, "embed_tokens", err))) return rc;
    }
    if (!m->lm_head.w || m->lm_head.w == m->embed.w) {
        cb->lm_head = cb->embed;
    } else {
        const squad_mat *e[1] = {&m->lm_head};
        if ((rc = upload_fused(cb, (void **)&cb->lm_head, e, 1, cb->V, cb->H, 0, "lm_head", err))) return rc;
    }
    if ((rc = upload_vec(cb, &cb->final_norm, m->final_norm, cb->H, "norm", err))) return rc;
    if (cb->n_attn) {
        const int half = c->rotary_dim / 2;
        float inv[512];
        if (half > 512) return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA backend: rotary_dim %d", c->rotary_dim);
        for (int i = 0; i < half; i++) /* as transformers: 1 / theta^(2i / rd) in fp32 */
            inv[i] = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)c->rotary_dim);
        if ((rc = upload_vec(cb, &cb->inv_freq, inv, half > 0 ? half : 1, "inv_freq", err))) return rc;
        if ((rc = setup_mrope(cb, err))) return rc;
    }
    if ((rc = setup_vision(cb, err))) return rc;
    const size_t s_bytes = cu_gdn_state_bytes(&cb->gd);
    const size_t conv_bytes = ((size_t)(cb->gd.K - 1) * cb->C * cb->es + 255) & ~(size_t)255;
    cb->gdn_bytes = (size_t)cb->n_gdn * (s_bytes + conv_bytes); /* a slot's arena (made on its first use) */
    {
        const size_t conv0 = (size_t)cb->n_gdn * s_bytes;
        int gi = 0, ai = 0;
        for (int l = 0; l < cb->nl; l++) {
            const squad_layer_weights *W = &m->layers[l];
            cu_layer *L = &cb->layers[l];
            L->kind = c->layer_types[l];
            char what[64];
            snprintf(what, sizeof what, "layer %d", l);
            if ((rc = upload_vec(cb, &L->in_norm, W->input_norm, cb->H, "input_layernorm", err))) return rc;
            if ((rc = upload_vec(cb, &L->post_norm, W->post_norm, cb->H, "post_attention_layernorm", err))) return rc;
            const squad_mat *gu[2] = {&W->mlp_gate, &W->mlp_up};
            const int f = cb->f32;
            if ((rc = upload_fused(cb, &L->w_gu, gu, 2, 2 * cb->I, cb->H, f, "mlp gate/up", err))) return rc;
            const squad_mat *dn[1] = {&W->mlp_down};
            if ((rc = upload_fused(cb, &L->w_down, dn, 1, cb->H, cb->I, f, "mlp down", err))) return rc;
            if (L->kind == SQUAD_LAYER_LINEAR) {
                const squad_mat *in[4] = {&W->in_qkv, &W->in_z, &W->in_b, &W->in_a};
                if ((rc = upload_fused(cb, &L->w_in, in, 4, cb->NP, cb->H, f, "linear_attn in_proj", err))) return rc;
                const squad_mat *out[1] = {&W->out_proj};
                if ((rc = upload_fused(cb, &L->w_out, out, 1, cb->H, cb->gd.nv * cb->gd.dv, f, "out_proj", err)))
                    return rc;
                if ((rc = upload_vec(cb, &L->conv_w, W->conv_w, (size_t)cb->C * cb->gd.K, "conv1d", err))) return rc;
                if ((rc = upload_vec(cb, &L->A_log, W->A_log, cb->gd.nv, "A_log", err))) return rc;
                if ((rc = upload_vec(cb, &L->dt_bias, W->dt_bias, cb->gd.nv, "dt_bias", err))) return rc;
                if ((rc = upload_vec(cb, &L->gdn_norm, W->gdn_norm, cb->gd.dv, "linear_attn norm", err))) return rc;
                L->s_off = (size_t)gi * s_bytes;
                L->conv_off = conv0 + (size_t)gi * conv_bytes;
                gi++;
            } else {
                const squad_mat *in[3] = {&W->q_proj, &W->k_proj, &W->v_proj};
                if ((rc = upload_fused(cb, &L->w_in, in, 3, cb->ldQKV, cb->H, f, "self_attn q/k/v_proj", err)))
                    return rc;
                const squad_mat *out[1] = {&W->o_proj};
                if ((rc = upload_fused(cb, &L->w_out, out, 1, cb->H, cb->ad.nh * cb->ad.hd, f, "o_proj", err)))
                    return rc;
                if ((rc = upload_vec(cb, &L->q_norm, W->q_norm, cb->ad.hd, "q_norm", err))) return rc;
                if ((rc = upload_vec(cb, &L->k_norm, W->k_norm, cb->ad.hd, "k_norm", err))) return rc;
                L->attn_index = ai++;
            }
        }
    }

    /* activations and scratch, sized for the largest replay (tok_cap tokens) */
    const size_t R = (size_t)cb->tok_cap;
    int wproj = cb->NP > cb->ldQKV ? cb->NP : cb->ldQKV;
    if (2 * cb->I > wproj) wproj = 2 * cb->I;
    const int wmix = cb->gd.nv * cb->gd.dv > cb->ad.nh * cb->ad.hd ? cb->gd.nv * cb->gd.dv : cb->ad.nh * cb->ad.hd;
    if ((rc = dalloc(cb, (void **)&cb->h, R * cb->H * 4, MEM_SCRATCH, err))) return rc;
    const size_t es = cb->es;
    if ((rc = dalloc(cb, &cb->x, R * cb->H * es, MEM_SCRATCH, err))) return rc;
    if ((rc = dalloc(cb, &cb->proj, R * wproj * es, MEM_SCRATCH, err))) return rc;
    if ((rc = dalloc(cb, &cb->mix, R * wmix * es, MEM_SCRATCH, err))) return rc;
    if ((rc = dalloc(cb, &cb->mlp, R * cb->I * es, MEM_SCRATCH, err))) return rc;
    if (cb->n_attn) {
        if ((rc = dalloc(cb, &cb->qb, R * cb->ad.nh * cb->ad.hd * es, MEM_SCRATCH, err))) return rc;
        if ((rc = dalloc(cb, &cb->att_part, cb->att_part_bytes, MEM_SCRATCH, err))) return rc;
    }
    if (cb->n_gdn) {
        const size_t gb = cu_gdn_scratch_bytes(&cb->gd, cb->tok_cap, cb->blk_cap);
        if ((rc = dalloc(cb, &cb->gdn_scr, gb, MEM_SCRATCH, err))) return rc;
        cu_gdn_scratch_bind(&cb->scr, cb->gdn_scr, &cb->gd, cb->tok_cap, cb->blk_cap);
    }
    /* the parameters: every shape's layout (cu_batch_bytes) fits the largest rows and tokens */
    cb->prm_bytes = cu_align16((size_t)(cb->max_rb + 1) * sizeof(cu_chunk_params) + 2 * (R * sizeof(int) + 16) +
                               (size_t)cb->max_rb * sizeof(cu_row_answers) + R * sizeof(cu_token_image));
    if ((rc = dalloc(cb, &cb->prm_dev, cb->prm_bytes, MEM_SCRATCH, err))) return rc;
    CU_TRY(cudaMallocHost((void **)&cb->prm_host, cb->prm_bytes * (size_t)cb->max_seqs));
    memset(cb->prm_host, 0, cb->prm_bytes * (size_t)cb->max_seqs);
    const size_t row_probs = (size_t)CU_MAX_SLOTS * CU_MAX_LETTERS * sizeof(float);
    if ((rc = dalloc(cb, (void **)&cb->probs_dev, row_probs * (size_t)cb->max_rb, MEM_SCRATCH, err))) return rc;
    CU_TRY(cudaMallocHost((void **)&cb->probs_host, row_probs * (size_t)cb->max_seqs));
    if ((rc = cu_vocab_init(cb->H, err))) return rc;
    cb->vocab_blocks = cu_vocab_blocks(cb->V, cb->n_sm);
    const size_t vslots = (size_t)cb->max_rb * CU_MAX_SLOTS;
    if ((rc = dalloc(cb, (void **)&cb->vocab_xn, vslots * cb->H * sizeof(float), MEM_SCRATCH, err))) return rc;
    if ((rc = dalloc(cb, &cb->vocab_parts, cu_vocab_parts_bytes(cb->vocab_blocks), MEM_SCRATCH, err))) return rc;
    if ((rc = dalloc(cb, (void **)&cb->vocab_dev, vslots * sizeof(squad_slot_vocab), MEM_SCRATCH, err))) return rc;
    CU_TRY(cudaMallocHost((void **)&cb->vocab_host, (size_t)cb->max_seqs * CU_MAX_SLOTS * sizeof(squad_slot_vocab)));
    if (opts && opts->specialists && (rc = setup_specialists(cb, opts->specialists, opts->max_adapters, err))) return rc;
    /* every upload (legacy stream, possibly still in its DMA) done before a kernel on cb->st reads it */
    CU_TRY(cudaDeviceSynchronize());
    if ((rc = bound_context(cb, err))) return rc;

    if (opts && opts->precapture && cb->knobs.graphs && (rc = precapture_all(cb, err))) return rc;
    return 0;
}

extern "C" squad_backend *squad_cuda_backend_new(const squad_model *model, const squad_engine_opts *opts,
                                                 int max_context, squad_err *err) {
    if (!model) {
        cu_err(err, SQUAD_E_INVALID, "CUDA backend: no model");
        return NULL;
    }
    if (max_context < 1) {
        cu_err(err, SQUAD_E_INVALID, "CUDA backend: max_context %d", max_context);
        return NULL;
    }
    if (squad_cuda_device_count() < 1) {
        cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA backend: no CUDA device");
        return NULL;
    }
    squad_backend *be = (squad_backend *)calloc(1, sizeof *be);
    cu_be *cb = (cu_be *)calloc(1, sizeof *cb);
    if (!be || !cb) {
        free(be);
        free(cb);
        cu_err(err, SQUAD_E_NOMEM, "out of memory (CUDA backend)");
        return NULL;
    }
    be->impl = cb;
    be->name = "cuda";
    be->model = model;
    be->alloc = be_alloc;
    be->release = be_release;
    be->reset = be_reset;
    be->save_gdn = be_save_gdn;
    be->load_gdn = be_load_gdn;
    be->save_kv = be_save_kv;
    be->load_kv = be_load_kv;
    be->forward = be_forward;
    be->memory_free = be_memory_free;
    be->graph_stats = be_graph_stats;
    be->vision_forward = model->cfg.has_vision ? be_vision_forward : NULL;
    be->destroy = be_destroy;
    if (build(cb, model, opts, max_context, err)) {
        be_destroy(be);
        return NULL;
    }
    be->max_context = cb->max_context; /* lowered when the device cannot hold the K / V of more */
    be->kv_positions = kv_positions_held(cb);
    be->max_chunk = cb->max_chunk;
    be->max_batch_tokens = cb->tok_cap;
    be->max_seqs = cb->max_seqs;
    be->mixed_routes = 1; /* per-token adapter slots (cu_batch.token_slot) */
    be->gdn_snapshot_bytes = cb->gdn_bytes;
    be->kv_bytes_per_pos = cb->kv_pos_elems * cb->es;
    be->specialists = cb->sp != NULL;
    squad_err tier_err = {};
    if (cu_host_tier_attach(be, cb->device, cb->st, &tier_err)) cu_host_tier_detach(be); /* no host tier only */
    return be;
}

extern "C" int squad_cuda_backend_info(const squad_backend *be, squad_cuda_info *info) {
    if (!be || !be->name || strcmp(be->name, "cuda") || !be->impl) return SQUAD_E_INVALID;
    const cu_be *cb = (const cu_be *)be->impl;
    memset(info, 0, sizeof *info);
    snprintf(info->device, sizeof info->device, "%s", cb->device_name);
    info->sm_count = cb->n_sm;
    info->graphs = cb->n_graphs;
    info->capture_s = cb->capture_s;
    info->replays = cb->replays;
    info->weight_bytes = cb->weight_bytes;
    info->state_bytes = cb->state_bytes + (size_t)kv_positions_held(cb) * kv_pos_bytes(cb);
    for (int s = 0; s < cb->max_seqs; s++) info->state_bytes += cb->seqs[s].gdn ? cb->gdn_bytes : 0;
    info->kv_positions = kv_positions_held(cb);
    info->gdn_state_bytes = (size_t)cb->n_gdn * cu_gdn_state_bytes(&cb->gd);
    info->max_context = cb->max_context;
    info->scratch_bytes = cb->scratch_bytes + cb->gemm.ws_bytes + cb->gemm.rot_bytes;
    snprintf(info->precision, sizeof info->precision, "%s", cb->f32 ? "exact" : "bf16");
    info->n_buckets = N_CHUNK_BUCKETS;
    for (int i = 0; i < N_CHUNK_BUCKETS; i++) info->buckets[i] = CHUNK_BUCKETS[i];
    info->adapter_slots = cb->sp ? cb->n_lora_slots : 0;
    for (int s = 0; cb->sp && s < cb->n_lora_slots; s++) info->adapters_resident += cb->slot_route[s] >= 0;
    info->adapter_uploads = cb->adapter_uploads;
    info->n_spans = cb->n_spans;
    for (int i = 0; i < cb->n_spans; i++) info->spans[i] = cb->spans[i];
    return 0;
}

/* ---- the backend's internals for tests and benchmarks (cuda_internal.cuh; callers outside libsquad) ---- */

/* The tools' batch of nrows chunks [start, start + len): *cb, and its length, rows and span buckets;
 * what: the caller's name in the messages. */
static int tool_batch_shape(squad_backend *be, int nrows, int start, int len, const char *what, cu_be **cbp, int *bi,
                            int *rbi, int *si, squad_err *err) {
    if (!be || !be->name || strcmp(be->name, "cuda") || !be->impl)
        return cu_err(err, SQUAD_E_INVALID, "%s: not a CUDA backend", what);
    cu_be *cb = impl_of(be);
    if (len < 1 || len > cb->max_chunk || start < 0 || start > cb->max_context - len)
        return cu_err(err, SQUAD_E_INVALID, "%s: chunk [%d, %d) outside the backend's limits", what, start, start + len);
    *bi = chunk_bucket(len);
    *si = span_bucket(cb, start + len);
    const int most = max_rows_of(cb, *bi) < cb->max_seqs ? max_rows_of(cb, *bi) : cb->max_seqs;
    if (nrows < 1 || nrows > most)
        return cu_err(err, SQUAD_E_INVALID, "%s: %d rows of %d tokens (at most %d)", what, nrows, len, most);
    *rbi = row_bucket(nrows);
    *cbp = cb;
    return 0;
}

int cu_backend_capture_parts(squad_backend *be, int nrows, int shared, int start, int len, unsigned parts,
                             int want_engine, cu_parts_graph *a, squad_err *err) {
    memset(a, 0, sizeof *a);
    cu_be *cb = NULL;
    int bi = 0, rbi = 0, si = 0;
    if (tool_batch_shape(be, nrows, start, len, "capture of kernel groups", &cb, &bi, &rbi, &si, err))
        return SQUAD_E_INVALID;
    if (parts & ~(unsigned)SQUAD_CUDA_PART_ALL)
        return cu_err(err, SQUAD_E_INVALID, "capture of kernel groups: parts 0x%x", parts);
    const int bucket = CHUNK_BUCKETS[bi];
    int *ids = (int *)malloc((size_t)nrows * len * sizeof(int));
    squad_chunk *ch = (squad_chunk *)calloc((size_t)nrows, sizeof *ch);
    int *order = (int *)malloc((size_t)nrows * sizeof(int));
    if (!ids || !ch || !order) {
        free(ids), free(ch), free(order);
        return cu_err(err, SQUAD_E_NOMEM, "out of memory (capture of kernel groups: ids)");
    }
    /* distinct pseudo-random tokens, as a real question has (the graph's time barely depends on
     * them: 1.680 against 1.689 ms on the 4096+128 hit with every id 0) */
    uint32_t x = 12345u;
    for (int t = 0; t < nrows * len; t++) {
        x = x * 1664525u + 1013904223u;
        ids[t] = (int)((x >> 8) % (uint32_t)cb->V);
    }
    for (int r = 0; r < nrows; r++) {
        ch[r].seq = r;
        ch[r].ids = ids + (size_t)r * len;
        ch[r].start = start;
        ch[r].len = len;
        cb->seqs[r].kv_split = 0;
        cb->seqs[r].kv_src = NULL;
        cb->seqs[r].gdn_src = NULL; /* each row's GDN state from its own arena */
        cb->lora_at[r] = 0; /* the trunk */
        order[r] = r;
    }
    /* row 0's own K / V first (it may move as it grows), then the rows reading it in place */
    int rc = prepare_slots(cb, ch, 1, err);
    for (int r = 1; r < nrows && !rc && shared && start > 0; r++) {
        cb->seqs[r].kv_src = cb->seqs[0].kv;
        cb->seqs[r].kv_split = start;
    }
    if (!rc && nrows > 1) rc = prepare_slots(cb, ch + 1, nrows - 1, err);
    be->kv_positions = kv_positions_held(cb);
    if (!rc) {
        int nv = 0, mv = 0;
        const size_t bytes = stage_replay(cb, cb->prm_host, ch, order, nrows, ROW_BUCKETS[rbi], bucket, &nv, &mv);
        rc = upload_params(cb, cb->prm_host, bytes, err);
    }
    if (!rc) rc = capture_batch(cb, bi, rbi, si, parts, &a->graph, err);
    if (!rc && want_engine) rc = get_graph(cb, bi, rbi, si, err);
    free(ids), free(ch), free(order);
    if (rc) {
        if (a->graph) cudaGraphExecDestroy(a->graph);
        a->graph = NULL;
        return rc;
    }
    a->st = cb->st;
    a->rows = bucket;
    a->engine = want_engine ? cb->graphs[bi][rbi][si] : NULL;
    return 0;
}

int cu_backend_engine_graph(squad_backend *be, int nrows, int start, int len, cudaGraphExec_t *ex, cudaStream_t *st,
                            squad_err *err) {
    *ex = NULL;
    cu_be *cb = NULL;
    int bi = 0, rbi = 0, si = 0;
    if (tool_batch_shape(be, nrows, start, len, "engine graph", &cb, &bi, &rbi, &si, err)) return SQUAD_E_INVALID;
    const int rc = get_graph(cb, bi, rbi, si, err);
    if (rc) return rc;
    *ex = cb->graphs[bi][rbi][si];
    *st = cb->st;
    return 0;
}

int cu_backend_upload_params(squad_backend *be, squad_err *err) {
    cu_be *cb = impl_of(be); /* the last staged replay's bytes, as forward uploads them */
    return upload_params(cb, cb->prm_host, cb->last_upload, err);
}

int cu_backend_scratch(const squad_backend *be, cu_scratch_region *out, int max) {
    if (!be || !be->name || strcmp(be->name, "cuda") || !be->impl) return -1;
    const cu_be *cb = (const cu_be *)be->impl;
    const size_t R = (size_t)cb->tok_cap, es = cb->es;
    int wproj = cb->NP > cb->ldQKV ? cb->NP : cb->ldQKV;
    if (2 * cb->I > wproj) wproj = 2 * cb->I;
    const int wmix = cb->gd.nv * cb->gd.dv > cb->ad.nh * cb->ad.hd ? cb->gd.nv * cb->gd.dv : cb->ad.nh * cb->ad.hd;
    cu_scratch_region r[CU_SCRATCH_REGIONS];
    int n = 0;
    r[n++] = {cb->h, 1, R * cb->H * 4, R * cb->H * 4};
    r[n++] = {cb->x, 1, R * cb->H * es, R * cb->H * es};
    r[n++] = {cb->proj, 1, R * wproj * es, R * wproj * es};
    r[n++] = {cb->mix, 1, R * wmix * es, R * wmix * es};
    r[n++] = {cb->mlp, 1, R * cb->I * es, R * cb->I * es};
    if (cb->lora_xw) r[n++] = {cb->lora_xw, 1, cb->lora_xw_bytes, cb->lora_xw_bytes};
    if (cb->lora_fold_y) /* y's columns; those past it stay zero (the folded out GEMM's u) */
        r[n++] = {cb->lora_fold_y, (size_t)cb->lora_fold_rows, (size_t)cb->lora_fold_ld * es,
                  (size_t)cb->lora_fold_in * es};
    if (cb->n_attn) {
        r[n++] = {cb->qb, 1, R * cb->ad.nh * cb->ad.hd * es, R * cb->ad.nh * cb->ad.hd * es};
        if (cb->att_part_bytes) r[n++] = {cb->att_part, 1, cb->att_part_bytes, cb->att_part_bytes};
    }
    if (cb->n_gdn) {
        const size_t gb = cu_gdn_scratch_bytes(&cb->gd, cb->tok_cap, cb->blk_cap);
        r[n++] = {cb->gdn_scr, 1, gb, gb};
    }
    for (int i = 0; i < n && i < max; i++) out[i] = r[i];
    return n;
}
