/*
 * test_backend_batch.c — the CPU backend's batched forward and sequence slots (src/backend.h)
 * against each chunk run alone on a fresh backend.
 *
 * Random batches on the tiny presets: 1..max_seqs chunks on random distinct slots, lengths
 * 1..max_chunk within max_batch_tokens, each continuing a random prefix that its slot got one of
 * three ways: computed on the slot (the prefixes of a round run as a batch of their own), restored
 * from checkpoint blobs with load_gdn / load_kv (the K / V read in place, the blob compared
 * afterwards to show it was only read), or restored from a blob another slot of the same batch
 * also reads (a shared prefix with different continuations). Some chunks ask the full-vocabulary
 * figures. Each chunk's reference is the same chunk alone on a fresh backend whose slot restored
 * the prefix from the builder's blobs (the prefix computed alone, in one chunk). Compared: the
 * letter probabilities, the vocabulary figures, the slot's saved GDN state and saved K / V of
 * [0, start + len) (save_kv concatenating the blob's positions and the slot's own), and the first
 * chunk's residual stream (squad_cpu_backend_hidden).
 *
 * Exactness: every comparison is bit for bit, in both precisions. The backend gives each token the
 * arithmetic it gets alone: the packed GEMM sums each output in one order for any number of rows,
 * and chunks of at most CPU_GEMM_DOT_MAX_T tokens (which alone take the GEMM's DOT form) take that
 * form inside a batch too; so the random batches include such chunks, alone and mixed with long
 * ones.
 *
 * Also: specialists chunks of different routes (and the trunk) in one batch against each alone
 * (probabilities, states, router sums); a chunk starting before the end of the positions its slot
 * reads in place; bad batches (a slot twice, too many tokens, a bad id, a bad slot index, a bad
 * route) fail with SQUAD_E_INVALID and leave every slot as it was; the slots' K / V memory
 * (kv_positions) follows what they hold, and a restored hit holds only its question's K / V.
 *
 * `test_backend_batch --bench MODEL_DIR [--threads N] [--reps R] [--precision bf16|exact]` times
 * batches of 1 / 4 / 8 hits of 128 tokens on one cached 4096-token state (restore + forward;
 * medians, wall and CPU time), against the same hits one at a time (bench/RESULTS.md); --batch-tokens
 * caps the tokens of one forward (default: the backend's max_batch_tokens).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu/gemm.h"
#include "model.h"
#include "specialists.h"
#include "specialists_synth.h"
#include "synth.h"
#include "testutil.h"
#include "tolerances.h"
#include "util.h"

#define N_LETTERS 4
#define MAX_PREFIX 300 /* prefixes cross several key tiles (64 positions) */
#define ROUNDS 12
#define MAX_BATCH 16

static uint64_t g_rng = 0x5eed;
static int rnd(int n) { /* 0 .. n-1 */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int)((g_rng >> 33) % (uint64_t)n);
}

/* ---- backends and states ------------------------------------------------------------------- */

static squad_backend *new_backend(const squad_model *m, squad_precision prec, const squad_specialists *sp) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.threads = 2;
    o.precision = prec;
    o.specialists = sp;
    squad_err err = {0};
    squad_backend *be = squad_cpu_backend_new(m, &o, 4096, &err);
    CHECKF(be != NULL, "backend: %s", err.msg);
    return be;
}

/* A slot's whole state: its GDN blob and the K / V of [0, n). */
typedef struct state {
    void *gdn, *kv;
    int n;
} state;

static void state_free(state *s) {
    free(s->gdn);
    free(s->kv);
    memset(s, 0, sizeof *s);
}

static int state_save(squad_backend *be, int seq, int n, state *s) {
    squad_err err = {0};
    s->n = n;
    s->gdn = malloc(be->gdn_snapshot_bytes);
    s->kv = malloc(be->kv_bytes_per_pos * (size_t)(n > 0 ? n : 1));
    if (!s->gdn || !s->kv) return -1;
    int rc = be->save_gdn(be, seq, s->gdn, &err);
    if (!rc) rc = be->save_kv(be, seq, s->kv, n, &err);
    CHECKF(rc == 0, "save: %s", err.msg);
    return rc;
}

static int state_equal(const squad_backend *be, const state *a, const state *b) {
    return a->n == b->n && memcmp(a->gdn, b->gdn, be->gdn_snapshot_bytes) == 0 &&
           memcmp(a->kv, b->kv, be->kv_bytes_per_pos * (size_t)a->n) == 0;
}

/* The largest absolute difference of two states' floats. */
static double state_diff(const squad_backend *be, const state *a, const state *b) {
    double w = 0;
    const float *x = a->gdn, *y = b->gdn;
    for (size_t i = 0; i < be->gdn_snapshot_bytes / sizeof(float); i++) w = fmax(w, fabs((double)x[i] - y[i]));
    x = a->kv, y = b->kv;
    for (size_t i = 0; a->n == b->n && i < be->kv_bytes_per_pos * (size_t)a->n / sizeof(float); i++)
        w = fmax(w, fabs((double)x[i] - y[i]));
    return a->n == b->n ? w : INFINITY;
}

/* ---- one chunk of a random batch ------------------------------------------------------------ */

enum { PREFIX_NONE, PREFIX_COMPUTED, PREFIX_RESTORED, PREFIX_SHARED };

typedef struct test_chunk {
    int32_t *ids; /* the row: [0, start + len) */
    int start, len, seq, how, route;
    int32_t letters[N_LETTERS];
    state prefix; /* the builder's state at start (restored kinds and the references) */
    squad_chunk ck;
    float probs[SQUAD_MAX_SLOTS_PER_ROW * SQUAD_MAX_LETTERS];
    squad_slot_vocab vocab[SQUAD_MAX_SLOTS_PER_ROW];
    double router[1024];
} test_chunk;

static void chunk_fill(test_chunk *t, int with_vocab) {
    squad_chunk *ck = &t->ck;
    memset(ck, 0, sizeof *ck);
    ck->seq = t->seq;
    ck->ids = t->ids + t->start;
    ck->start = t->start;
    ck->len = t->len;
    ck->letters = t->letters;
    ck->n_letters = N_LETTERS;
    ck->route = t->route;
    /* slots: the last token, and a few more spread over the chunk */
    const int want = 1 + rnd(3);
    for (int s = 0; s < want && s < t->len; s++) {
        const int at = s == 0 ? t->len - 1 : rnd(t->len);
        int dup = 0;
        for (int k = 0; k < ck->n_slots; k++) dup |= ck->slots[k] == at;
        if (dup) continue;
        ck->slots[ck->n_slots] = at;
        ck->nopts[ck->n_slots] = 2 + rnd(N_LETTERS - 1);
        ck->n_slots++;
    }
    for (int a = 1; a < ck->n_slots; a++) /* ascending, as backend.h asks */
        for (int b = a; b > 0 && ck->slots[b - 1] > ck->slots[b]; b--) {
            int x = ck->slots[b];
            ck->slots[b] = ck->slots[b - 1], ck->slots[b - 1] = x;
            x = ck->nopts[b];
            ck->nopts[b] = ck->nopts[b - 1], ck->nopts[b - 1] = x;
        }
    ck->vocab = with_vocab ? t->vocab : NULL;
    ck->probs = t->probs;
}

/* The state after [0, n) of ids computed alone on a fresh backend, in one chunk (n <= max_chunk). */
static int build_prefix(const squad_model *m, squad_precision prec, const squad_specialists *sp, int route,
                        const int32_t *ids, int n, state *out) {
    squad_backend *be = new_backend(m, prec, sp);
    if (!be) return -1;
    squad_err err = {0};
    int rc = be->reset(be, 0, &err);
    if (!rc && n > 0) {
        squad_chunk ck;
        memset(&ck, 0, sizeof ck);
        ck.ids = ids;
        ck.len = n;
        ck.route = route;
        rc = squad_backend_forward1(be, &ck, NULL, &err);
    }
    CHECKF(rc == 0, "prefix: %s", err.msg);
    if (!rc) rc = state_save(be, 0, n, out);
    be->destroy(be);
    return rc;
}

/* [0, n) of ids on slot seq of be (reset by the caller), in chunks of at most max_chunk. */
static int run_prefix(squad_backend *be, int seq, const int32_t *ids, int n, squad_err *err) {
    int rc = 0;
    for (int s = 0; !rc && s < n; s += be->max_chunk) {
        squad_chunk ck;
        memset(&ck, 0, sizeof ck);
        ck.ids = ids + s;
        ck.seq = seq;
        ck.start = s;
        ck.len = n - s < be->max_chunk ? n - s : be->max_chunk;
        rc = squad_backend_forward1(be, &ck, NULL, err);
    }
    return rc;
}

/* Restores a builder state into a slot: load_gdn, then load_kv reading the blob in place. */
static int restore(squad_backend *be, int seq, const state *s) {
    squad_err err = {0};
    int rc = be->load_gdn(be, seq, s->gdn, &err);
    if (!rc) rc = be->load_kv(be, seq, s->kv, s->n, s->n, &err);
    CHECKF(rc == 0, "restore: %s", err.msg);
    return rc;
}

/* Compares chunk t of a batch (probs, vocab, router sum, the slot's state; the residual stream when
 * it is the batch's first chunk) with the chunk alone: identical. */
static void compare_alone(const squad_model *m, squad_precision prec, const squad_specialists *sp, squad_backend *batch,
                          test_chunk *t, int first, const float *hidden_first) {
    squad_backend *be = new_backend(m, prec, sp);
    if (!be) return;
    squad_err err = {0};
    test_chunk alone = *t;
    alone.seq = 0;
    alone.ck.seq = 0;
    alone.ck.probs = alone.probs;
    alone.ck.vocab = t->ck.vocab ? alone.vocab : NULL;
    alone.ck.router_sum = t->ck.router_sum ? alone.router : NULL;
    int rc = t->start ? restore(be, 0, &t->prefix) : be->reset(be, 0, &err);
    if (!rc) rc = be->forward(be, &alone.ck, 1, &err);
    CHECKF(rc == 0, "alone: %s", err.msg);
    state sa = {0}, sb = {0};
    const int end = t->start + t->len;
    if (!rc && !state_save(be, 0, end, &sa) && !state_save(batch, t->seq, end, &sb)) {
        const squad_chunk *ck = &t->ck;
        double worst = 0;
        for (int i = 0; i < ck->n_slots * SQUAD_MAX_LETTERS; i++)
            worst = fmax(worst, fabs((double)t->probs[i] - alone.probs[i]));
        CHECKF(memcmp(t->probs, alone.probs, sizeof(float) * (size_t)ck->n_slots * SQUAD_MAX_LETTERS) == 0,
               "chunk [%d, %d) on slot %d: probabilities differ from alone by %g", t->start, end, t->seq, worst);
        CHECKF(state_equal(be, &sa, &sb), "chunk [%d, %d) on slot %d: state differs from alone by %g", t->start,
               end, t->seq, state_diff(be, &sa, &sb));
        for (int s = 0; ck->vocab && s < ck->n_slots; s++)
            CHECK(memcmp(&t->vocab[s], &alone.vocab[s], sizeof(squad_slot_vocab)) == 0);
        if (ck->router_sum)
            CHECK(memcmp(t->router, alone.router, sizeof(double) * (size_t)m->cfg.hidden_size) == 0);
        if (first) {
            float h[1024];
            int differ = 0;
            for (int q = 0; q < t->len && !differ; q++)
                differ = squad_cpu_backend_hidden(be, q, h, &err) != 0 ||
                         memcmp(h, hidden_first + (size_t)q * m->cfg.hidden_size,
                                sizeof(float) * (size_t)m->cfg.hidden_size) != 0;
            CHECKF(!differ, "the first chunk's residual stream differs from alone");
        }
    }
    state_free(&sa);
    state_free(&sb);
    be->destroy(be);
}

/* One random batch on model m. */
static void random_round(const squad_model *m, squad_precision prec, int round) {
    squad_backend *be = new_backend(m, prec, NULL);
    if (!be) return;
    squad_err err = {0};
    const int V = m->cfg.vocab_size, H = m->cfg.hidden_size;
    int n = 1 + rnd(be->max_seqs);
    if (n > MAX_BATCH) n = MAX_BATCH;
    if (round == 0 && n < 2) n = 2; /* two readers of one blob */
    test_chunk *tc = calloc((size_t)n, sizeof *tc);
    int used[MAX_BATCH * 4] = {0}, budget = be->max_batch_tokens;
    /* a shared document for the PREFIX_SHARED chunks: one blob, several readers */
    int32_t doc[MAX_PREFIX];
    for (int i = 0; i < MAX_PREFIX; i++) doc[i] = rnd(V);
    const int doc_len = 65 + rnd(MAX_PREFIX - 65);
    state doc_state = {0};
    void *doc_copy = NULL;
    int n_shared = 0;
    for (int i = 0; i < n; i++) {
        test_chunk *t = &tc[i];
        do t->seq = rnd(be->max_seqs);
        while (used[t->seq]);
        used[t->seq] = 1;
        /* lengths: mostly short questions, now and then a long one or a tiny one */
        const int room = budget - (n - i - 1);
        int len = rnd(4) == 0 ? 1 + rnd(4) : rnd(5) == 0 ? 1 + rnd(be->max_chunk) : 8 + rnd(120);
        if (len > room) len = room;
        if (len > be->max_chunk) len = be->max_chunk;
        if (len < 1) len = 1;
        t->len = len;
        budget -= len;
        t->how = round == 0 && i < 2 ? PREFIX_SHARED : rnd(4); /* round 0: at least two readers of one blob */
        t->start = t->how == PREFIX_NONE ? 0 : t->how == PREFIX_SHARED ? doc_len : 1 + rnd(MAX_PREFIX);
        t->ids = malloc(sizeof(int32_t) * (size_t)(t->start + t->len));
        for (int k = 0; k < t->start + t->len; k++) t->ids[k] = t->how == PREFIX_SHARED && k < doc_len ? doc[k] : rnd(V);
        for (int l = 0; l < N_LETTERS; l++) t->letters[l] = 10 + l;
        chunk_fill(t, rnd(3) == 0);
        if (t->how == PREFIX_SHARED) {
            if (!n_shared++) {
                build_prefix(m, prec, NULL, 0, doc, doc_len, &doc_state);
                doc_copy = malloc(be->kv_bytes_per_pos * (size_t)doc_len);
                if (doc_copy) memcpy(doc_copy, doc_state.kv, be->kv_bytes_per_pos * (size_t)doc_len);
            }
            /* the reference restores its own copy; the batch's slots read doc_state in place */
            t->prefix.n = doc_len;
            t->prefix.gdn = malloc(be->gdn_snapshot_bytes);
            t->prefix.kv = malloc(be->kv_bytes_per_pos * (size_t)doc_len);
            memcpy(t->prefix.gdn, doc_state.gdn, be->gdn_snapshot_bytes);
            memcpy(t->prefix.kv, doc_state.kv, be->kv_bytes_per_pos * (size_t)doc_len);
        } else if (t->start) {
            build_prefix(m, prec, NULL, 0, t->ids, t->start, &t->prefix);
        }
    }
    /* the slots' prefixes: computed ones as one batch of their own, the rest restored */
    squad_chunk pre[MAX_BATCH];
    int n_pre = 0, t_pre = 0;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        test_chunk *t = &tc[i];
        rc = be->reset(be, t->seq, &err);
        if (t->how == PREFIX_COMPUTED) {
            memset(&pre[n_pre], 0, sizeof pre[n_pre]);
            pre[n_pre].seq = t->seq;
            pre[n_pre].ids = t->ids;
            pre[n_pre].len = t->start;
            t_pre += t->start;
            n_pre++;
        } else if (t->how == PREFIX_RESTORED) {
            rc = restore(be, t->seq, &t->prefix);
        } else if (t->how == PREFIX_SHARED) {
            rc = restore(be, t->seq, &doc_state);
        }
    }
    if (!rc && n_pre) rc = be->forward(be, pre, n_pre, &err);
    CHECKF(rc == 0, "prefixes: %s", err.msg);
    squad_chunk batch[MAX_BATCH];
    int T = 0;
    for (int i = 0; i < n; i++) batch[i] = tc[i].ck, T += tc[i].len;
    if (!rc) rc = be->forward(be, batch, n, &err);
    CHECKF(rc == 0, "round %d: batch of %d chunks, %d tokens: %s", round, n, T, err.msg);
    float *hidden = malloc(sizeof(float) * (size_t)H * (size_t)tc[0].len);
    for (int q = 0; !rc && hidden && q < tc[0].len; q++) rc = squad_cpu_backend_hidden(be, q, hidden + (size_t)q * H, &err);
    CHECK(rc == 0);
    if (doc_copy) CHECK(memcmp(doc_copy, doc_state.kv, be->kv_bytes_per_pos * (size_t)doc_len) == 0); /* only read */
    int n_short = 0;
    for (int i = 0; !rc && i < n; i++) {
        n_short += tc[i].len <= CPU_GEMM_DOT_MAX_T;
        compare_alone(m, prec, NULL, be, &tc[i], i == 0, hidden);
    }
    if (n_shared) CHECK(memcmp(doc_copy, doc_state.kv, be->kv_bytes_per_pos * (size_t)doc_len) == 0);
    printf("  round %2d (%s): %d chunks (%d of at most %d tokens), %4d tokens, %d prefixes computed in a batch of "
           "%d tokens, %d readers of one blob\n",
           round, prec == SQUAD_PRECISION_EXACT ? "exact" : "bf16", n, n_short, CPU_GEMM_DOT_MAX_T, T, n_pre, t_pre,
           n_shared);
    free(hidden);
    for (int i = 0; i < n; i++) {
        free(tc[i].ids);
        state_free(&tc[i].prefix);
    }
    free(tc);
    state_free(&doc_state);
    free(doc_copy);
    be->destroy(be);
}

/* ---- chunks that start inside the positions read in place ------------------------------------ */

static void restart_inside_blob(const squad_model *m) {
    const int V = m->cfg.vocab_size, full = 200, at = 150, len = 40;
    int32_t ids[240];
    for (int i = 0; i < 240; i++) ids[i] = rnd(V);
    state whole = {0}, upto = {0};
    if (build_prefix(m, SQUAD_PRECISION_EXACT, NULL, 0, ids, full, &whole) ||
        build_prefix(m, SQUAD_PRECISION_EXACT, NULL, 0, ids, at, &upto))
        return;
    squad_backend *a = new_backend(m, SQUAD_PRECISION_EXACT, NULL), *b = new_backend(m, SQUAD_PRECISION_EXACT, NULL);
    squad_err err = {0};
    int rc = !a || !b;
    /* a: the K / V of all 200 positions read in place, the GDN state at 150, then [150, 190):
     * positions [128, 192) must leave the blob for the slot's own arrays. b: the K / V of 150. */
    if (!rc) rc = a->load_gdn(a, 1, upto.gdn, &err);
    if (!rc) rc = a->load_kv(a, 1, whole.kv, full, full, &err);
    if (!rc) rc = b->load_gdn(b, 0, upto.gdn, &err);
    if (!rc) rc = b->load_kv(b, 0, whole.kv, full, at, &err);
    squad_chunk ck;
    memset(&ck, 0, sizeof ck);
    ck.ids = ids + at;
    ck.start = at;
    ck.len = len;
    float pa[SQUAD_MAX_LETTERS], pb[SQUAD_MAX_LETTERS];
    int32_t letters[N_LETTERS] = {10, 11, 12, 13};
    ck.letters = letters;
    ck.n_letters = N_LETTERS;
    ck.n_slots = 1;
    ck.slots[0] = len - 1;
    ck.nopts[0] = N_LETTERS;
    if (!rc) {
        ck.seq = 1;
        rc = squad_backend_forward1(a, &ck, pa, &err);
    }
    if (!rc) {
        ck.seq = 0;
        rc = squad_backend_forward1(b, &ck, pb, &err);
    }
    CHECKF(rc == 0, "restart inside a blob: %s", err.msg);
    state sa = {0}, sb = {0};
    if (!rc && !state_save(a, 1, at + len, &sa) && !state_save(b, 0, at + len, &sb)) {
        CHECK(memcmp(pa, pb, sizeof pa) == 0);
        CHECK(state_equal(a, &sa, &sb));
    }
    state_free(&sa);
    state_free(&sb);
    state_free(&whole);
    state_free(&upto);
    if (a) a->destroy(a);
    if (b) b->destroy(b);
}

/* ---- memory: what a slot holds -------------------------------------------------------------- */

static void slot_memory(const squad_model *m) {
    squad_backend *be = new_backend(m, SQUAD_PRECISION_EXACT, NULL);
    if (!be) return;
    squad_err err = {0};
    CHECK(be->kv_positions == 0); /* nothing before a row needs it */
    const int V = m->cfg.vocab_size, state_len = 1000, q = 100;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(state_len + q));
    for (int i = 0; i < state_len + q; i++) ids[i] = rnd(V);
    /* a 1000-token state, computed on slot 0 in chunks */
    int rc = be->reset(be, 0, &err);
    if (!rc) rc = run_prefix(be, 0, ids, state_len, &err);
    CHECKF(rc == 0, "%s", err.msg);
    const int held = be->kv_positions;
    CHECKF(held >= state_len && held < 2 * state_len, "one 1000-token row holds %d positions", held);
    state st = {0};
    if (rc || state_save(be, 0, state_len, &st)) {
        free(ids);
        be->destroy(be);
        return;
    }
    /* hits on three more slots: each holds its question's K / V, not the state's */
    for (int seq = 1; seq <= 3 && !rc; seq++) {
        rc = restore(be, seq, &st);
        squad_chunk ck;
        memset(&ck, 0, sizeof ck);
        ck.seq = seq;
        ck.ids = ids + state_len;
        ck.start = state_len;
        ck.len = q;
        if (!rc) rc = squad_backend_forward1(be, &ck, NULL, &err);
    }
    CHECKF(rc == 0, "%s", err.msg);
    const int per_hit = (be->kv_positions - held) / 3;
    printf("  K / V: a 1000-token row holds %d positions; a restored hit with a %d-token question %d\n", held, q,
           per_hit);
    CHECKF(per_hit > 0 && per_hit <= 256, "a hit holds %d positions", per_hit);
    /* a reset keeps a small slot's arrays (no churn between rows) */
    const int before = be->kv_positions;
    CHECK(be->reset(be, 1, &err) == 0 && be->kv_positions == before);
    /* save_kv past what the slot holds is refused */
    CHECK(be->save_kv(be, 1, st.kv, 1, &err) == SQUAD_E_INVALID);
    state_free(&st);
    free(ids);
    be->destroy(be);
}

/* ---- bad batches ------------------------------------------------------------------------------ */

static void bad_batches(const squad_model *m) {
    squad_backend *be = new_backend(m, SQUAD_PRECISION_EXACT, NULL);
    if (!be) return;
    squad_err err = {0};
    const int V = m->cfg.vocab_size;
    int32_t *ids = malloc(sizeof(int32_t) * 2048);
    for (int i = 0; i < 2048; i++) ids[i] = rnd(V);
    /* slots 0..2 hold rows of 70, 90 and 0 tokens */
    const int held[3] = {70, 90, 0};
    int rc = 0;
    for (int s = 0; s < 3 && !rc; s++) {
        rc = be->reset(be, s, &err);
        squad_chunk ck;
        memset(&ck, 0, sizeof ck);
        ck.seq = s;
        ck.ids = ids;
        ck.len = held[s];
        if (!rc && held[s]) rc = squad_backend_forward1(be, &ck, NULL, &err);
    }
    CHECKF(rc == 0, "%s", err.msg);
    state before[3];
    for (int s = 0; s < 3; s++) state_save(be, s, held[s], &before[s]);
    const int positions = be->kv_positions;
    float probs[SQUAD_MAX_LETTERS];
    int32_t letters[N_LETTERS] = {10, 11, 12, 13};
    int32_t bad_ids[8] = {1, 2, 3, V, 5, 6, 7, 8};
    for (int kind = 0; kind < 6; kind++) {
        squad_chunk b[3];
        memset(b, 0, sizeof b);
        for (int s = 0; s < 3; s++) {
            b[s].seq = s;
            b[s].ids = ids + 100 * s;
            b[s].start = held[s];
            b[s].len = 8;
            b[s].letters = letters;
            b[s].n_letters = N_LETTERS;
            b[s].n_slots = 1;
            b[s].slots[0] = 7;
            b[s].nopts[0] = 3;
            b[s].probs = probs;
        }
        const char *what = "";
        switch (kind) {
        case 0: b[2].seq = 0, what = "a slot twice"; break;
        case 1:
            b[0].len = b[1].len = (be->max_batch_tokens + 1) / 3;
            b[2].len = be->max_batch_tokens + 1 - 2 * b[0].len;
            what = "one token past max_batch_tokens";
            break;
        case 2: b[1].ids = bad_ids, what = "an id past the vocabulary"; break;
        case 3: b[2].slots[0] = 8, what = "an answer slot past the chunk"; break;
        case 4: b[1].route = 1, what = "a route without specialists"; break;
        case 5: b[2].seq = be->max_seqs, what = "a slot index past max_seqs"; break;
        }
        memset(&err, 0, sizeof err);
        rc = be->forward(be, b, 3, &err);
        CHECKF(rc == SQUAD_E_INVALID && err.msg[0], "%s: rc %d", what, rc);
        for (int s = 0; s < 3; s++) {
            state now = {0};
            if (!state_save(be, s, held[s], &now)) CHECKF(state_equal(be, &before[s], &now), "%s changed slot %d", what, s);
            state_free(&now);
        }
        CHECK(be->kv_positions == positions);
    }
    CHECK(be->forward(be, NULL, 0, &err) == SQUAD_E_INVALID);
    for (int s = 0; s < 3; s++) state_free(&before[s]);
    free(ids);
    be->destroy(be);
}

/* ---- specialists: routes mixed in one batch ---------------------------------------------------- */

static void mixed_routes(void) {
    squad_err err = {0};
    squad_model *m = test_synth_model("tiny", 3);
    if (!m) return;
    char *sdir = strdup(test_tmpdir());
    squad_spec_synth_opts o;
    squad_spec_synth_defaults(&m->cfg, &o);
    o.out_dir = sdir;
    o.seed = 5;
    o.dtype = ST_F32;
    CHECKF(squad_spec_synth_write(&m->cfg, &o, &err) == 0, "%s", err.msg);
    squad_specialists *sp = squad_specialists_load(m, sdir, &err);
    CHECKF(sp != NULL, "%s", err.msg);
    squad_backend *be = sp ? new_backend(m, SQUAD_PRECISION_EXACT, sp) : NULL;
    if (be) {
        CHECK(be->mixed_routes == 1 && be->specialists == 1);
        const int V = m->cfg.vocab_size, n = 5;
        test_chunk tc[5];
        memset(tc, 0, sizeof tc);
        squad_chunk batch[5];
        int rc = 0;
        for (int i = 0; i < n && !rc; i++) {
            test_chunk *t = &tc[i];
            t->seq = (i * 3 + 1) % be->max_seqs;
            t->route = i % sp->router.n_labels;
            t->start = i % 2 ? 40 + 30 * i : 0;
            t->len = 20 + 13 * i;
            t->ids = malloc(sizeof(int32_t) * (size_t)(t->start + t->len));
            for (int k = 0; k < t->start + t->len; k++) t->ids[k] = rnd(V);
            for (int l = 0; l < N_LETTERS; l++) t->letters[l] = 10 + l;
            chunk_fill(t, i == 2);
            t->ck.router_sum = t->router;
            if (t->start) {
                /* the prefix under the chunk's own route (layers >= split depend on it) */
                rc = build_prefix(m, SQUAD_PRECISION_EXACT, sp, t->route, t->ids, t->start, &t->prefix);
                if (!rc) rc = restore(be, t->seq, &t->prefix);
            } else {
                rc = be->reset(be, t->seq, &err);
            }
            batch[i] = t->ck;
        }
        if (!rc) rc = be->forward(be, batch, n, &err);
        CHECKF(rc == 0, "mixed routes: %s", err.msg);
        float *hidden = malloc(sizeof(float) * (size_t)m->cfg.hidden_size * (size_t)tc[0].len);
        for (int q = 0; !rc && q < tc[0].len; q++)
            rc = squad_cpu_backend_hidden(be, q, hidden + (size_t)q * m->cfg.hidden_size, &err);
        for (int i = 0; !rc && i < n; i++) compare_alone(m, SQUAD_PRECISION_EXACT, sp, be, &tc[i], i == 0, hidden);
        /* the routes did matter: route 1's chunk differs from the same chunk on the trunk */
        printf("  specialists: %d chunks of routes 0..%d in one batch, each equal to it alone\n", n,
               sp->router.n_labels - 1);
        free(hidden);
        for (int i = 0; i < n; i++) {
            free(tc[i].ids);
            state_free(&tc[i].prefix);
        }
        be->destroy(be);
    }
    squad_specialists_free(sp);
    squad_model_free(m);
    free(sdir);
}

/* ---- the timing mode ------------------------------------------------------------------------ */

static double wall_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[(n - 1) / 2];
}

/* N hits of Q tokens on one cached state: restore each slot, then the N chunks as batches of at
 * most max_batch_tokens (batched) or one forward each (one at a time). Seconds into *wall, *cpu
 * (CPU time per thread), *restore (wall of the restores). */
static int bench_hits(squad_backend *be, const state *st, const int32_t *q_ids, int n, int q, int batched, int threads,
                      int batch_tokens, double *wall, double *cpu, double *restore_s) {
    squad_err err = {0};
    const double w0 = wall_now(), c0 = cpu_now();
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        rc = be->load_gdn(be, i, st->gdn, &err);
        if (!rc) rc = be->load_kv(be, i, st->kv, st->n, st->n, &err);
    }
    *restore_s = wall_now() - w0;
    static float probs[8][SQUAD_MAX_LETTERS];
    static const int32_t letters[N_LETTERS] = {10, 11, 12, 13};
    squad_chunk ck[8];
    for (int i = 0; i < n; i++) {
        memset(&ck[i], 0, sizeof ck[i]);
        ck[i].seq = i;
        ck[i].ids = q_ids + (size_t)i * q;
        ck[i].start = st->n;
        ck[i].len = q;
        ck[i].n_slots = 1;
        ck[i].slots[0] = q - 1;
        ck[i].nopts[0] = N_LETTERS;
        ck[i].letters = letters;
        ck[i].n_letters = N_LETTERS;
        ck[i].probs = probs[i];
    }
    const int per = batched ? batch_tokens / q : 1;
    for (int i = 0; i < n && !rc; i += per) rc = be->forward(be, ck + i, n - i < per ? n - i : per, &err);
    *wall = wall_now() - w0;
    *cpu = (cpu_now() - c0) / threads;
    if (rc) fprintf(stderr, "bench: %s\n", err.msg);
    return rc;
}

static int bench_main(int argc, char **argv) {
    const char *dir = NULL;
    int threads = 2, reps = 3, state_len = 4096, q = 128, batch_tokens = 0;
    squad_precision prec = SQUAD_PRECISION_BF16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bench") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--state") && i + 1 < argc) state_len = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch-tokens") && i + 1 < argc) batch_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc)
            prec = !strcmp(argv[++i], "exact") ? SQUAD_PRECISION_EXACT : SQUAD_PRECISION_BF16;
    }
    if (!dir || reps < 1 || reps > 64) {
        fprintf(stderr, "usage: test_backend_batch --bench MODEL_DIR [--threads N] [--reps R] [--state N] "
                        "[--precision bf16|exact] [--batch-tokens N]\n");
        return 2;
    }
    squad_err err = {0};
    squad_model *m = squad_model_load(dir, &err);
    if (!m) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.threads = threads;
    o.precision = prec;
    squad_backend *be = squad_cpu_backend_new(m, &o, state_len + 1024, &err);
    if (!be) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (batch_tokens <= 0 || batch_tokens > be->max_batch_tokens) batch_tokens = be->max_batch_tokens;
    if (batch_tokens < q) batch_tokens = q;
    const int V = m->cfg.vocab_size;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(state_len + 8 * q));
    for (int i = 0; i < state_len + 8 * q; i++) ids[i] = rnd(V);
    int rc = be->reset(be, 0, &err);
    const double t0 = wall_now();
    if (!rc) rc = run_prefix(be, 0, ids, state_len, &err);
    state st = {0};
    if (rc || state_save(be, 0, state_len, &st)) {
        fprintf(stderr, "state: %s\n", err.msg);
        return 1;
    }
    printf("{\"state\": %d, \"state_s\": %.1f, \"threads\": %d, \"precision\": \"%s\", \"max_batch_tokens\": %d, "
           "\"kv_bytes_per_pos\": %zu}\n",
           state_len, wall_now() - t0, threads, prec == SQUAD_PRECISION_EXACT ? "exact" : "bf16", batch_tokens,
           be->kv_bytes_per_pos);
    const int counts[3] = {1, 4, 8};
    for (int k = 0; k < 3 && !rc; k++) {
        const int n = counts[k];
        for (int batched = 1; batched >= (n > 1 ? 0 : 1) && !rc; batched--) {
            double wall[64], cpu[64], rest[64];
            double w, c, r;
            rc = bench_hits(be, &st, ids + state_len, n, q, batched, threads, batch_tokens, &w, &c, &r); /* warm-up */
            for (int i = 0; i < reps && !rc; i++)
                rc = bench_hits(be, &st, ids + state_len, n, q, batched, threads, batch_tokens, &wall[i], &cpu[i],
                                &rest[i]);
            if (rc) break;
            const double mw = median(wall, reps), mc = median(cpu, reps), mr = median(rest, reps);
            printf("{\"hits\": %d, \"question\": %d, \"mode\": \"%s\", \"median_wall_ms\": %.1f, "
                   "\"median_cpu_ms_per_thread\": %.1f, \"median_restore_ms\": %.2f, \"questions_per_s_wall\": %.2f, "
                   "\"questions_per_cpu_s\": %.2f, \"kv_positions\": %d}\n",
                   n, q, batched ? "batched" : "one at a time", mw * 1e3, mc * 1e3, mr * 1e3, n / mw, n / mc,
                   be->kv_positions);
            fflush(stdout);
        }
    }
    state_free(&st);
    free(ids);
    be->destroy(be);
    squad_model_free(m);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc > 1) return bench_main(argc, argv);
    squad_model *tiny = test_synth_model("tiny", 11);
    squad_model *hd256 = test_synth_model("tiny-hd256", 5);
    if (tiny) {
        for (int r = 0; r < ROUNDS; r++) random_round(tiny, r % 3 == 2 ? SQUAD_PRECISION_BF16 : SQUAD_PRECISION_EXACT, r);
        restart_inside_blob(tiny);
        slot_memory(tiny);
        bad_batches(tiny);
    }
    if (hd256) /* the AVX2 attention kernels at the real head size */
        for (int r = 0; r < 3; r++) random_round(hd256, r == 2 ? SQUAD_PRECISION_BF16 : SQUAD_PRECISION_EXACT, 100 + r);
    mixed_routes();
    squad_model_free(tiny);
    squad_model_free(hd256);
    return test_summary("test_backend_batch");
}
