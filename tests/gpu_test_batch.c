/*
 * gpu_test_batch.c — the CUDA backend's batched forward (backend.h: sequence slots, forward of a
 * batch of chunks) against the same chunks run one at a time, on the CUDA backend itself and on the
 * CPU backend.
 *
 * Each trial draws a batch of 1..MAX_ROWS rows on distinct random slots: cold rows (from position 0),
 * hits (a cached state restored with load_gdn and load_kv, its K / V read in place; two rows of a
 * trial often restore the same blob) and continued rows (a prefix run alone on the slot first),
 * with mixed lengths across the length buckets, 0..3 answer slots each, the full-vocabulary figures
 * on some. The batch runs as two batched steps (the second continues every row from the state the
 * first left), with the backend's scratch poisoned (NaN) before each step, so a kernel that reads a
 * padding row's or token's unwritten value shows as NaN. Then each row runs alone, step by step,
 * from the same starting state, on the CUDA backend and on the CPU backend (exact). Checks:
 *  - batched against alone (CUDA): every probability within TOL_CUDA_BF16_CACHED (bf16: the issue's
 *    0.01) or TOL_CUDA_EXACT_CPU (exact); the vocabulary figures within TOL_VOCAB_EXACT_CHUNKED /
 *    TOL_VOCAB_CUDA_BF16_CPU; the slot's states after both steps (every GDN layer's S, the K / V of
 *    every position) equal up to round-off (a state of another row would differ by O(1));
 *  - batched against the CPU backend: TOL_CUDA_EXACT_CPU (exact) or TOL_CUDA_BF16_REF (bf16);
 *  - a batch of three 1100-token chunks, more padded tokens than one replay holds (two replays);
 *  - bad batches are refused with SQUAD_E_INVALID (no chunks, too many, a slot out of range or
 *    twice, too many tokens, a bad chunk among good ones) and change no slot's state; the backend
 *    still answers afterwards.
 * On the tiny preset (both precisions) and tiny-hd256 (the 0.8B attention head dim, bf16).
 * SQUAD_GPU_TEST_QUICK=1 runs fewer trials on tiny only (compute-sanitizer).
 * Exits 77 (skipped) without a GPU.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model.h"
#include "squad.h"
#include "testutil.h"
#include "tolerances.h"
#include "util.h"

#ifdef SQUAD_HAVE_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/cuda_test_api.h"

#define MAX_CONTEXT 4096
#define MAX_ROWS 16 /* the backend's slots (opts.max_rows) and the largest batch drawn */
#define N_CTX 3     /* cached states hits restore */
#define MAX_ROW_SLOTS 3
static const int CTX_LEN[N_CTX] = {300, 777, 1500};
static const int32_t LETTERS[4] = {11, 12, 13, 14};
/* lengths across the buckets 16 .. 1024 */
static const int LENS[] = {1, 5, 16, 17, 31, 40, 64, 65, 100, 128, 129, 200, 300, 513, 700};
#define N_LENS ((int)(sizeof LENS / sizeof LENS[0]))
static const char *PREC_NAME[2] = {"exact", "bf16"};

typedef float probs_t[SQUAD_MAX_LETTERS];

typedef struct rng {
    uint64_t s;
} rng;
static uint32_t rnd(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (uint32_t)(r->s >> 11);
}
static int rnd_int(rng *r, int n) { return (int)(rnd(r) % (uint32_t)n); }

enum { ROW_COLD, ROW_HIT, ROW_CONT };

/* One row of a trial: a prefix (a cached state or a chunk run alone, or nothing), then two steps. */
typedef struct brow {
    int kind, ctx, seq;
    int start;           /* where step 1 starts: 0 (cold), the context's length (hit), the prefix's (cont) */
    int len[2];          /* the two steps */
    int32_t *ids;        /* [start + len[0] + len[1]]: row tokens (a hit's first start come from its context) */
    int n_slots[2], slots[2][MAX_ROW_SLOTS], nopts[2][MAX_ROW_SLOTS];
    int vocab;           /* ask for the full-vocabulary figures */
} brow;

/* What a row produced: per step its probabilities and figures; after both steps its states. */
typedef struct rowout {
    probs_t probs[2][MAX_ROW_SLOTS];
    squad_slot_vocab vocab[2][MAX_ROW_SLOTS];
    float *gdn; /* the S part of save_gdn, fp32 */
    void *kv;   /* save_kv of every position, raw */
} rowout;

/* The cached states on one backend. */
typedef struct ctx_set {
    void *gdn[N_CTX], *kv[N_CTX];
} ctx_set;

static int32_t *g_ctx_ids[N_CTX];

/* ---- running ---- */

static void fill_chunk(squad_chunk *ch, const brow *r, int step, int seq, probs_t *probs, squad_slot_vocab *vocab) {
    memset(ch, 0, sizeof *ch);
    ch->seq = seq;
    ch->start = r->start + (step ? r->len[0] : 0);
    ch->len = r->len[step];
    ch->ids = r->ids + ch->start;
    ch->n_slots = r->n_slots[step];
    for (int i = 0; i < ch->n_slots; i++) {
        ch->slots[i] = r->slots[step][i];
        ch->nopts[i] = r->nopts[step][i];
    }
    ch->letters = LETTERS;
    ch->n_letters = 4;
    ch->vocab = r->vocab && ch->n_slots ? vocab : NULL;
    ch->probs = &probs[0][0];
}

/* ids[0, n) on slot seq from its state, in chunks the backend takes, no answers. */
static int run_plain(squad_backend *be, int seq, const int32_t *ids, int start, int n, squad_err *err) {
    for (int s = start; s < start + n; s += be->max_chunk) {
        const int e = s + be->max_chunk < start + n ? s + be->max_chunk : start + n;
        squad_chunk ch;
        memset(&ch, 0, sizeof ch);
        ch.seq = seq;
        ch.ids = ids + s;
        ch.start = s;
        ch.len = e - s;
        const int rc = squad_backend_forward1(be, &ch, NULL, err);
        if (rc) return rc;
    }
    return 0;
}

/* The cached states: each context run cold on slot 0 and saved into backend blobs. */
static int make_ctxs(squad_backend *be, ctx_set *cs, squad_err *err) {
    memset(cs, 0, sizeof *cs);
    for (int i = 0; i < N_CTX; i++) {
        int rc = be->reset(be, 0, err);
        if (!rc) rc = run_plain(be, 0, g_ctx_ids[i], 0, CTX_LEN[i], err);
        if (rc) return rc;
        cs->gdn[i] = be->alloc(be, be->gdn_snapshot_bytes, err);
        cs->kv[i] = be->alloc(be, (size_t)CTX_LEN[i] * be->kv_bytes_per_pos, err);
        if (!cs->gdn[i] || !cs->kv[i]) return err->code ? err->code : SQUAD_E_NOMEM;
        if ((rc = be->save_gdn(be, 0, cs->gdn[i], err))) return rc;
        if ((rc = be->save_kv(be, 0, cs->kv[i], CTX_LEN[i], err))) return rc;
    }
    return 0;
}

static void free_ctxs(squad_backend *be, ctx_set *cs) {
    for (int i = 0; i < N_CTX; i++) {
        be->release(be, cs->gdn[i]);
        be->release(be, cs->kv[i]);
    }
}

/* The row's starting state on slot seq. */
static int setup_row(squad_backend *be, const ctx_set *cs, const brow *r, int seq, squad_err *err) {
    int rc = be->reset(be, seq, err);
    if (rc) return rc;
    if (r->kind == ROW_HIT) {
        rc = be->load_gdn(be, seq, cs->gdn[r->ctx], err);
        if (!rc) rc = be->load_kv(be, seq, cs->kv[r->ctx], CTX_LEN[r->ctx], CTX_LEN[r->ctx], err);
        return rc;
    }
    if (r->kind == ROW_CONT) return run_plain(be, seq, r->ids, 0, r->start, err);
    return 0;
}

/* The slot's states after the row, downloaded: S of every GDN layer and the K / V of every position. */
static int save_states(squad_backend *be, int seq, const brow *r, rowout *o, squad_err *err) {
    const int end = r->start + r->len[0] + r->len[1];
    const size_t sb = squad_cuda_test_state_bytes(be), kb = (size_t)end * be->kv_bytes_per_pos;
    void *g = be->alloc(be, be->gdn_snapshot_bytes, err), *k = be->alloc(be, kb, err);
    o->gdn = malloc(sb ? sb : 4);
    o->kv = malloc(kb);
    int rc = !g || !k || !o->gdn || !o->kv ? SQUAD_E_NOMEM : 0;
    if (!rc) rc = be->save_gdn(be, seq, g, err);
    if (!rc) rc = be->save_kv(be, seq, k, end, err);
    if (!rc && sb) rc = squad_cuda_test_download(o->gdn, g, sb, err);
    if (!rc) rc = squad_cuda_test_download(o->kv, k, kb, err);
    be->release(be, g);
    be->release(be, k);
    return rc;
}

/* Every row alone on be, step by step: on its own slot with its states saved (states), else on slot 0. */
static int run_alone(squad_backend *be, const ctx_set *cs, brow *rows, int n, rowout *out, int states,
                     squad_err *err) {
    for (int i = 0; i < n; i++) {
        const int seq = states ? rows[i].seq : 0;
        int rc = setup_row(be, cs, &rows[i], seq, err);
        for (int step = 0; step < 2 && !rc; step++) {
            squad_chunk ch;
            fill_chunk(&ch, &rows[i], step, seq, out[i].probs[step], out[i].vocab[step]);
            rc = be->forward(be, &ch, 1, err);
        }
        if (!rc && states) rc = save_states(be, seq, &rows[i], &out[i], err);
        if (rc) return rc;
    }
    return 0;
}

/* The rows batched: their starting states, then the two steps as two batches (scratch poisoned
 * before each), then their states. */
static int run_batched(squad_backend *be, const ctx_set *cs, brow *rows, int n, rowout *out, squad_err *err) {
    squad_chunk ch[MAX_ROWS];
    for (int i = 0; i < n; i++) {
        const int rc = setup_row(be, cs, &rows[i], rows[i].seq, err);
        if (rc) return rc;
    }
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < n; i++) fill_chunk(&ch[i], &rows[i], step, rows[i].seq, out[i].probs[step], out[i].vocab[step]);
        int rc = squad_cuda_test_poison(be, err);
        if (!rc) rc = be->forward(be, ch, n, err);
        if (rc) return rc;
    }
    for (int i = 0; i < n; i++) {
        const int rc = save_states(be, rows[i].seq, &rows[i], &out[i], err);
        if (rc) return rc;
    }
    return 0;
}

/* ---- drawing rows ---- */

/* A row on slot seq; force_hit_ctx >= 0: a hit on that context; its first step at most max_len0 tokens
 * (max_len0 < 0: exactly -max_len0). */
static void draw_row(rng *g, brow *r, int vocab_size, int seq, int force_hit_ctx, int max_len0) {
    memset(r, 0, sizeof *r);
    r->seq = seq;
    const int k = rnd_int(g, 10);
    r->kind = force_hit_ctx >= 0 ? ROW_HIT : k < 3 ? ROW_COLD : k < 8 ? ROW_HIT : ROW_CONT;
    r->ctx = force_hit_ctx >= 0 ? force_hit_ctx : rnd_int(g, N_CTX);
    r->start = r->kind == ROW_HIT ? CTX_LEN[r->ctx] : r->kind == ROW_CONT ? 1 + rnd_int(g, 900) : 0;
    r->len[0] = LENS[rnd_int(g, N_LENS)];
    if (max_len0 < 0)
        r->len[0] = -max_len0;
    else if (r->len[0] > max_len0)
        r->len[0] = max_len0;
    r->len[1] = LENS[rnd_int(g, 9)]; /* a short follow-up question */
    const int n = r->start + r->len[0] + r->len[1];
    r->ids = malloc(sizeof(int32_t) * (size_t)n);
    for (int t = 0; t < n; t++) r->ids[t] = (int32_t)rnd_int(g, vocab_size);
    if (r->kind == ROW_HIT) memcpy(r->ids, g_ctx_ids[r->ctx], sizeof(int32_t) * (size_t)r->start);
    for (int step = 0; step < 2; step++) {
        const int len = r->len[step];
        int ns = rnd_int(g, MAX_ROW_SLOTS + 1);
        if (step == 1 && ns == 0) ns = 1; /* every row answers at the end */
        int last = -1;
        for (int i = 0; i < ns; i++) {
            const int lo = last + 1;
            if (lo >= len) break;
            const int s = i == ns - 1 ? len - 1 : lo + rnd_int(g, len - lo);
            r->slots[step][r->n_slots[step]] = s;
            r->nopts[step][r->n_slots[step]] = 2 + rnd_int(g, 3);
            r->n_slots[step]++;
            last = s;
        }
    }
    r->vocab = rnd_int(g, 3) == 0;
}

/* ---- comparing ---- */

static double probs_diff(const brow *rows, int n, rowout *a, rowout *b) {
    double worst = 0;
    for (int i = 0; i < n; i++)
        for (int step = 0; step < 2; step++)
            for (int s = 0; s < rows[i].n_slots[step]; s++)
                for (int l = 0; l < SQUAD_MAX_LETTERS; l++) {
                    const double d = fabs((double)a[i].probs[step][s][l] - b[i].probs[step][s][l]);
                    if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
                }
    return worst;
}

static double vocab_diff(const brow *rows, int n, rowout *a, rowout *b, int *top_bad) {
    double worst = 0;
    for (int i = 0; i < n; i++)
        for (int step = 0; step < 2; step++)
            for (int s = 0; rows[i].vocab && s < rows[i].n_slots[step]; s++) {
                const squad_slot_vocab *x = &a[i].vocab[step][s], *y = &b[i].vocab[step][s];
                const double d[3] = {fabs(x->vocab_lse - y->vocab_lse), fabs(x->letters_lse - y->letters_lse),
                                     fabs(x->top_logit - y->top_logit)};
                for (int k = 0; k < 3; k++)
                    if (!(d[k] <= worst)) worst = isnan(d[k]) ? INFINITY : d[k];
                if (x->top_token != y->top_token && d[2] > 1e-3) (*top_bad)++;
            }
    return worst;
}

/* Worst difference of the states relative to the larger of 1 and the largest value. */
static double state_diff(squad_backend *be, const brow *r, const rowout *a, const rowout *b, int bf) {
    const size_t ns = squad_cuda_test_state_bytes(be) / sizeof(float);
    double worst = 0, big = 1;
    for (size_t i = 0; i < ns; i++) {
        const double d = fabs((double)a->gdn[i] - b->gdn[i]);
        if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
        if (fabs(b->gdn[i]) > big) big = fabs(b->gdn[i]);
    }
    const int end = r->start + r->len[0] + r->len[1];
    const size_t nkv = (size_t)end * be->kv_bytes_per_pos / (bf ? 2 : 4);
    double wk = 0, bk = 1;
    for (size_t i = 0; i < nkv; i++) {
        const float x = bf ? squad_bf16_to_f32(((const uint16_t *)a->kv)[i]) : ((const float *)a->kv)[i];
        const float y = bf ? squad_bf16_to_f32(((const uint16_t *)b->kv)[i]) : ((const float *)b->kv)[i];
        const double d = fabs((double)x - y);
        if (!(d <= wk)) wk = isnan(d) ? INFINITY : d;
        if (fabs(y) > bk) bk = fabs(y);
    }
    const double gs = worst / big, ks = wk / bk;
    return gs > ks ? gs : ks;
}

static void free_outs(rowout *o, int n) {
    for (int i = 0; i < n; i++) {
        free(o[i].gdn);
        free(o[i].kv);
        o[i].gdn = NULL;
        o[i].kv = NULL;
    }
}

/* ---- the trials ---- */

static squad_backend *new_backend(squad_model *m, squad_device dev, squad_precision prec) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = dev;
    o.precision = prec;
    o.threads = 0;
    o.max_rows = MAX_ROWS;
    squad_err err = {0};
    squad_backend *be = dev == SQUAD_DEVICE_CUDA ? squad_cuda_backend_new(m, &o, MAX_CONTEXT, &err)
                                                 : squad_cpu_backend_new(m, &o, MAX_CONTEXT, &err);
    CHECKF(be != NULL, "backend: %s", err.msg);
    return be;
}

/* One trial: n rows batched against alone (CUDA, CPU). */
static void trial(squad_backend *gpu, squad_backend *cpu, const ctx_set *gcs, const ctx_set *ccs, brow *rows, int n,
                  const char *what, int bf) {
    rowout *A = calloc((size_t)n, sizeof *A), *B = calloc((size_t)n, sizeof *B), *C = calloc((size_t)n, sizeof *C);
    squad_err err = {0};
    CHECK(A && B && C);
    if (!A || !B || !C) goto out;
    int rc = run_batched(gpu, gcs, rows, n, A, &err);
    CHECKF(rc == 0, "%s: batched: %s", what, err.msg);
    if (!rc) rc = run_alone(gpu, gcs, rows, n, B, 1, &err);
    CHECKF(rc == 0, "%s: alone: %s", what, err.msg);
    if (!rc) rc = run_alone(cpu, ccs, rows, n, C, 0, &err);
    CHECKF(rc == 0, "%s: cpu: %s", what, err.msg);
    if (rc) goto out;
    const double tol_alone = bf ? TOL_CUDA_BF16_CACHED : TOL_CUDA_EXACT_CPU;
    const double tol_cpu = bf ? TOL_CUDA_BF16_REF : TOL_CUDA_EXACT_CPU;
    const double dab = probs_diff(rows, n, A, B), dac = probs_diff(rows, n, A, C);
    int top_ab = 0, top_ac = 0;
    const double vab = vocab_diff(rows, n, A, B, &top_ab), vac = vocab_diff(rows, n, A, C, &top_ac);
    double sab = 0;
    for (int i = 0; i < n; i++) {
        const double d = state_diff(gpu, &rows[i], &A[i], &B[i], bf);
        if (!(d <= sab)) sab = isnan(d) ? INFINITY : d;
    }
    printf("%s: %2d rows: |batched - alone| %.2e (states %.2e, vocab %.2e), |batched - cpu| %.2e (vocab %.2e)\n",
           what, n, dab, sab, vab, dac, vac);
    CHECKF(dab <= tol_alone, "%s: batched against alone %.3e", what, dab);
    CHECKF(dac <= tol_cpu, "%s: batched against the CPU %.3e", what, dac);
    CHECKF(vab <= (bf ? TOL_VOCAB_CUDA_BF16_CPU : TOL_VOCAB_EXACT_CHUNKED) && top_ab == 0,
           "%s: vocabulary figures batched against alone %.3e (%d top tokens differ)", what, vab, top_ab);
    CHECKF(vac <= (bf ? TOL_VOCAB_CUDA_BF16_CPU : TOL_VOCAB_CUDA_EXACT_CPU), "%s: vocabulary against the CPU %.3e",
           what, vac);
    /* the same kernels on the same values; only a GEMM of another shape rounds differently */
    CHECKF(sab <= (bf ? 5e-2 : 1e-3), "%s: states after the batch against alone %.3e", what, sab);
out:
    if (A) free_outs(A, n);
    if (B) free_outs(B, n);
    free(A), free(B), free(C);
}

/* Bad batches are refused and change nothing; the backend still answers the same afterwards. */
static void test_refusals(squad_backend *gpu, const ctx_set *gcs, int vocab_size) {
    squad_err err = {0};
    rng g = {99};
    brow r;
    draw_row(&g, &r, vocab_size, 3, 1, 700);
    if (r.n_slots[0] == 0) { /* an answer to compare */
        r.slots[0][0] = r.len[0] - 1;
        r.nopts[0][0] = 4;
        r.n_slots[0] = 1;
    }
    probs_t p0[MAX_ROW_SLOTS], p1[MAX_ROW_SLOTS];
    squad_slot_vocab v[MAX_ROW_SLOTS];
    squad_chunk ch[MAX_ROWS + 1];
    CHECK(setup_row(gpu, gcs, &r, 3, &err) == 0);
    fill_chunk(&ch[0], &r, 0, 3, p0, v);
    CHECK(gpu->forward(gpu, ch, 1, &err) == 0); /* the answer to compare with */
    void *before = gpu->alloc(gpu, gpu->gdn_snapshot_bytes, &err), *after = gpu->alloc(gpu, gpu->gdn_snapshot_bytes, &err);
    const size_t sb = squad_cuda_test_state_bytes(gpu);
    float *hb = malloc(sb ? sb : 4), *ha = malloc(sb ? sb : 4);
    CHECK(before && after && hb && ha);
    if (!before || !after || !hb || !ha) goto out;
    CHECK(setup_row(gpu, gcs, &r, 3, &err) == 0);
    CHECK(gpu->save_gdn(gpu, 3, before, &err) == 0);
    fill_chunk(&ch[0], &r, 0, 3, p1, v);
    CHECK(gpu->forward(gpu, ch, 0, &err) == SQUAD_E_INVALID);
    CHECK(gpu->forward(gpu, NULL, 1, &err) == SQUAD_E_INVALID);
    for (int i = 1; i <= MAX_ROWS; i++) {
        ch[i] = ch[0];
        ch[i].seq = i < 3 ? i - 1 : i; /* distinct slots, 3 being chunk 0's */
    }
    CHECK(gpu->forward(gpu, ch, MAX_ROWS + 1, &err) == SQUAD_E_INVALID); /* more chunks than slots */
    ch[1] = ch[0];
    CHECK(gpu->forward(gpu, ch, 2, &err) == SQUAD_E_INVALID); /* slot 3 twice */
    ch[1].seq = MAX_ROWS;
    CHECK(gpu->forward(gpu, ch, 2, &err) == SQUAD_E_INVALID); /* a slot out of range */
    ch[1].seq = -1;
    CHECK(gpu->forward(gpu, ch, 2, &err) == SQUAD_E_INVALID);
    int32_t bad_ids[2] = {1, 1 << 30};
    ch[1].seq = 5;
    ch[1].ids = bad_ids;
    ch[1].start = 0;
    ch[1].len = 2;
    ch[1].n_slots = 0;
    CHECK(gpu->forward(gpu, ch, 2, &err) == SQUAD_E_INVALID); /* a bad token in the second chunk */
    ch[1].ids = r.ids;
    ch[1].route = 1;
    CHECK(gpu->forward(gpu, ch, 2, &err) == SQUAD_E_INVALID); /* a route without specialists */
    ch[1].route = 0;
    /* more tokens than a batch takes: chunks of max_chunk tokens from a long row */
    {
        const int big = gpu->max_chunk, nb = gpu->max_batch_tokens / big + 1;
        int32_t *ids = calloc((size_t)big, sizeof(int32_t));
        squad_chunk bc[MAX_ROWS];
        CHECK(ids != NULL && nb <= MAX_ROWS);
        for (int i = 0; ids && i < nb && i < MAX_ROWS; i++) {
            memset(&bc[i], 0, sizeof bc[i]);
            bc[i].seq = i;
            bc[i].ids = ids;
            bc[i].len = big;
        }
        if (ids && nb <= MAX_ROWS) CHECK(gpu->forward(gpu, bc, nb, &err) == SQUAD_E_INVALID);
        free(ids);
    }
    CHECK(gpu->save_gdn(gpu, 3, after, &err) == 0);
    if (sb) {
        CHECK(squad_cuda_test_download(hb, before, sb, &err) == 0);
        CHECK(squad_cuda_test_download(ha, after, sb, &err) == 0);
        CHECKF(memcmp(hb, ha, sb) == 0, "a refused batch changed a slot's state");
    }
    /* the slot still runs the chunk as before */
    CHECK(gpu->forward(gpu, ch, 1, &err) == 0);
    double d = 0;
    for (int s = 0; s < r.n_slots[0]; s++)
        for (int l = 0; l < SQUAD_MAX_LETTERS; l++) {
            const double x = fabs((double)p0[s][l] - p1[s][l]);
            if (!(x <= d)) d = isnan(x) ? INFINITY : x;
        }
    CHECKF(d == 0, "after the refusals the chunk answers %.3e away", d);
out:
    gpu->release(gpu, before);
    gpu->release(gpu, after);
    free(hb), free(ha);
    free(r.ids);
}

static void test_preset(const char *preset, unsigned seed, squad_precision prec, int n_trials) {
    const int bf = prec == SQUAD_PRECISION_BF16;
    squad_model *m = test_synth_model(preset, seed);
    if (!m) return;
    const int V = squad_model_vocab_size(m);
    rng g = {0x9e3779b97f4a7c15ull ^ seed};
    for (int i = 0; i < N_CTX; i++) {
        g_ctx_ids[i] = malloc(sizeof(int32_t) * (size_t)CTX_LEN[i]);
        for (int t = 0; g_ctx_ids[i] && t < CTX_LEN[i]; t++) g_ctx_ids[i][t] = (int32_t)rnd_int(&g, V);
    }
    squad_backend *gpu = new_backend(m, SQUAD_DEVICE_CUDA, prec);
    squad_backend *cpu = new_backend(m, SQUAD_DEVICE_CPU, SQUAD_PRECISION_EXACT);
    ctx_set gcs, ccs;
    squad_err err = {0};
    int rc = gpu && cpu ? 0 : SQUAD_E_BACKEND;
    CHECK(!gpu || gpu->max_seqs == MAX_ROWS);
    if (!rc) rc = make_ctxs(gpu, &gcs, &err);
    if (!rc) rc = make_ctxs(cpu, &ccs, &err);
    CHECKF(rc == 0, "%s: cached states: %s", preset, err.msg);
    char what[96];
    for (int t = 0; !rc && t < n_trials; t++) {
        const int n = t == 0 ? 1 : t == 1 ? 2 : 1 + rnd_int(&g, MAX_ROWS);
        brow rows[MAX_ROWS];
        int perm[MAX_ROWS];
        for (int i = 0; i < MAX_ROWS; i++) perm[i] = i;
        for (int i = MAX_ROWS - 1; i > 0; i--) {
            const int j = rnd_int(&g, i + 1), x = perm[i];
            perm[i] = perm[j];
            perm[j] = x;
        }
        /* every other trial: the first two rows restore one blob (read in place by both) */
        const int shared = t % 2 == 1 ? rnd_int(&g, N_CTX) : -1;
        int tokens = 0;
        for (int i = 0; i < n; i++) { /* the batch within max_batch_tokens, 16 tokens kept for each row left */
            draw_row(&g, &rows[i], V, perm[i], i < 2 ? shared : -1, gpu->max_batch_tokens - tokens - (n - 1 - i) * 16);
            tokens += rows[i].len[0];
        }
        snprintf(what, sizeof what, "%s %s trial %d", preset, PREC_NAME[bf], t);
        trial(gpu, cpu, &gcs, &ccs, rows, n, what, bf);
        for (int i = 0; i < n; i++) free(rows[i].ids);
    }
    if (!rc) { /* more padded tokens than one replay holds: 3 x 1536 > 4096, so two replays */
        brow rows[3];
        for (int i = 0; i < 3; i++) {
            draw_row(&g, &rows[i], V, i + 4, -1, -1100);
        }
        snprintf(what, sizeof what, "%s %s two replays", preset, PREC_NAME[bf]);
        trial(gpu, cpu, &gcs, &ccs, rows, 3, what, bf);
        for (int i = 0; i < 3; i++) free(rows[i].ids);
    }
    if (!rc) test_refusals(gpu, &gcs, V);
    if (gpu && !rc) free_ctxs(gpu, &gcs);
    if (cpu && !rc) free_ctxs(cpu, &ccs);
    if (gpu) gpu->destroy(gpu);
    if (cpu) cpu->destroy(cpu);
    for (int i = 0; i < N_CTX; i++) free(g_ctx_ids[i]);
    squad_model_free(m);
}

int main(void) {
    if (!squad_cuda_device_usable()) {
        printf("gpu_test_batch: no usable CUDA device, skipped\n");
        return TEST_SKIPPED;
    }
    const int quick = getenv("SQUAD_GPU_TEST_QUICK") && atoi(getenv("SQUAD_GPU_TEST_QUICK")) > 0;
    test_preset("tiny", 7, SQUAD_PRECISION_EXACT, quick ? 3 : 8);
    test_preset("tiny", 7, SQUAD_PRECISION_BF16, quick ? 3 : 8);
    if (!quick) test_preset("tiny-hd256", 8, SQUAD_PRECISION_BF16, 6);
    return test_summary("gpu_test_batch");
}

#else
int main(void) {
    printf("gpu_test_batch: built without CUDA, skipped\n");
    return TEST_SKIPPED;
}
#endif
