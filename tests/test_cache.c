/*
 * test_cache.c — the state cache on a real model (the engine and the CPU backend).
 *
 * The model is tests/fixtures/models/tiny-causal (made with transformers by
 * tools/make_fixtures.py), or, where that fixture is absent, a synthesized tiny checkpoint. Checks:
 *  - the fixture's agent-like row sequence (cache_rows.jsonl: the same state with several
 *    questions, an action appended, a middle changed, exact repeats, a state longer than stride, a
 *    row sharing part of a long state, interleaved unrelated states, ineligible rows) under several
 *    policies and budgets: every answer equals the uncached engine's and the fixture's
 *    cache_expected.jsonl within TOL_CPU_EXACT_CACHED;
 *  - reuse: each row's `reused` is exactly the position of the checkpoint the index held for it
 *    (looked up before the row), and at least what the earlier runtime's policy gives, simulated
 *    here from its rules (the deepest of p, state_len - tail and stride positions, plus chunk-cap
 *    ends, of earlier rows' states within the tokens shared);
 *  - budgets: zero caches nothing, one too small for a checkpoint caches nothing, a tiny one evicts
 *    and stays within itself after every row;
 *  - per-call options and counters: memo answers counted apart (memo_hits, tokens_memo);
 *    cancellation after k polls on both paths (SQUAD_E_CANCELLED, the cache consistent, the
 *    engine then right); end_checkpoint_only (one checkpoint at p, the same answers);
 *    cache_written; uncacheable; squad_engine_cache_clear; the automatic budget on the CPU;
 *  - thousands of short agent-like rows through a small budget, the backend's alloc / release
 *    wrapped to count the live bytes: after every row the cache's accounting equals the real
 *    allocations and its structures agree (squad_cache_check); a sample of rows is compared with
 *    the uncached answer.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cache_internal.h"
#include "engine.h"
#include "rows.h"
#include "squad.h"
#include "testutil.h"
#include "tolerances.h"
#include "util.h"
#if __has_include("synth.h")
#include "synth.h"
#define HAVE_SYNTH 1
#endif

#define FIXTURE_DIR "tests/fixtures/models/tiny-causal"
#define MAX_ROWS 256
/* the random workload */
#define MANY_ROWS 2000
#define MANY_ROWS_SANITIZED 250 /* ASan + UBSan: the same test, fewer rows */
#define MANY_COMPARE_EVERY 10   /* rows compared with the uncached engine */
#define MANY_SESSIONS 10
#define MANY_FIRST_STATE 120 /* a new session's state: 64 + up to this many tokens */
#define MANY_MAX_STATE 320   /* states stop growing here (the sessions' array holds 640) */

/* ---- a model and rows -------------------------------------------------------------------------- */

typedef struct fixture {
    squad_model *model;
    squad_row_buf rows[MAX_ROWS];
    json_t *expected[MAX_ROWS]; /* the reference probs per row, NULL without the fixture */
    int n;
} fixture;

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static squad_model *open_model(int *from_fixture) {
    squad_err err = {0};
    *from_fixture = file_exists(FIXTURE_DIR "/config.json");
    if (*from_fixture) {
        squad_model *m = squad_model_load(FIXTURE_DIR, &err);
        if (!m) fprintf(stderr, "load %s: %s\n", FIXTURE_DIR, err.msg);
        return m;
    }
#ifdef HAVE_SYNTH
    char dir[256];
    snprintf(dir, sizeof dir, "%s/tiny", test_tmpdir());
    squad_synth_opts so;
    memset(&so, 0, sizeof so);
    so.preset = "tiny";
    so.out_dir = dir;
    so.seed = 7;
    if (squad_synth_write(&so, &err)) {
        fprintf(stderr, "synth: %s\n", err.msg);
        return NULL;
    }
    squad_model *m = squad_model_load(dir, &err);
    if (!m) fprintf(stderr, "load %s: %s\n", dir, err.msg);
    return m;
#else
    fprintf(stderr, "no %s and no synth: nothing to test on\n", FIXTURE_DIR);
    return NULL;
#endif
}

static int read_fixture_rows(fixture *fx) {
    FILE *rf = fopen(FIXTURE_DIR "/cache_rows.jsonl", "r");
    FILE *ef = fopen(FIXTURE_DIR "/cache_expected.jsonl", "r");
    if (!rf || !ef) {
        if (rf) fclose(rf);
        if (ef) fclose(ef);
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    squad_err err = {0};
    while (fx->n < MAX_ROWS && getline(&line, &cap, rf) > 1) {
        if (squad_row_parse_json(&fx->rows[fx->n], line, strlen(line), NULL, 0, &err)) {
            fprintf(stderr, "cache_rows.jsonl line %d: %s\n", fx->n + 1, err.msg);
            break;
        }
        fx->n++;
    }
    for (int i = 0; i < fx->n && getline(&line, &cap, ef) > 1; i++) {
        json_error_t je;
        fx->expected[i] = json_loads(line, 0, &je);
    }
    free(line);
    fclose(rf);
    fclose(ef);
    return fx->n > 0 ? 0 : -1;
}

/* The same kinds of rows when the fixture is absent: states that repeat, grow, change in the
 * middle, longer than a stride, shared in part, interleaved, plus rows that are not eligible. */
static void make_rows(fixture *fx, int vocab) {
    uint64_t s = 99;
#define RND() (s = s * 6364136223846793005ull + 1442695040888963407ull, (int32_t)((s >> 33) % (uint64_t)vocab))
    static int32_t S1[700], S2[1400], S3[400];
    for (int i = 0; i < 700; i++) S1[i] = RND();
    for (int i = 0; i < 1400; i++) S2[i] = RND();
    for (int i = 0; i < 400; i++) S3[i] = RND();
    struct { const int32_t *state; int len; int change_at; int q; int slots; } plan[] = {
        {S1, 600, -1, 12, 1}, {S1, 600, -1, 27, 2}, {S3, 350, -1, 15, 1}, {S1, 620, -1, 22, 1},
        {S1, 600, 290, 12, 1}, {S2, 1300, -1, 20, 3}, {S3, 350, -1, 25, 1}, {S2, 1300, -1, 33, 1},
        {S2, 900, 400, 16, 2}, {S2, 1325, -1, 24, 1}, {S2, 1300, 700, 21, 1}, {S3, 368, -1, 17, 1},
        {S3, 200, -1, 20, 1}, {S1, 638, -1, 19, 4}, {S1, 600, -1, 12, 1},
    };
    int32_t letters[4] = {1, 2, 3, 4};
    for (size_t k = 0; k < sizeof plan / sizeof plan[0] && fx->n < MAX_ROWS; k++) {
        squad_row_buf *b = &fx->rows[fx->n++];
        int n = plan[k].len + plan[k].q;
        b->ids = malloc(sizeof(int32_t) * (size_t)n);
        b->slots = malloc(sizeof(int32_t) * 4);
        b->nopts = malloc(sizeof(int32_t) * 4);
        b->letters = malloc(sizeof letters);
        memcpy(b->ids, plan[k].state, sizeof(int32_t) * (size_t)plan[k].len);
        if (plan[k].change_at >= 0)
            for (int i = plan[k].change_at; i < plan[k].len; i++) b->ids[i] = RND();
        for (int i = plan[k].len; i < n; i++) b->ids[i] = RND();
        for (int j = 0; j < plan[k].slots; j++) {
            b->slots[j] = n - plan[k].slots + j;
            b->nopts[j] = 2 + j % 3;
        }
        memcpy(b->letters, letters, sizeof letters);
        b->row = (squad_row){b->ids, n, b->slots, b->nopts, plan[k].slots, b->letters, 4, plan[k].len, 0, NULL, 0};
    }
    /* an exact repeat, and one row with no state_len */
    if (fx->n + 2 <= MAX_ROWS) {
        squad_row_buf *b = &fx->rows[fx->n++];
        *b = fx->rows[1];
        b->ids = NULL; /* borrowed arrays: not freed twice */
        b = &fx->rows[fx->n++];
        *b = fx->rows[0];
        b->ids = NULL;
        b->row.state_len = -1;
    }
#undef RND
}

static void fixture_free(fixture *fx) {
    for (int i = 0; i < fx->n; i++) {
        if (fx->rows[i].ids) squad_row_buf_free(&fx->rows[i]);
        if (fx->expected[i]) json_decref(fx->expected[i]);
    }
}

/* The largest difference between two answers (over each slot's options). */
static double expected_diff(const squad_row *row, const squad_result *r, json_t *exp) {
    json_t *probs = json_object_get(exp, "probs");
    if (!probs || (int)json_array_size(probs) != row->n_slots) return INFINITY;
    double w = 0;
    for (int s = 0; s < row->n_slots; s++) {
        json_t *ps = json_array_get(probs, s);
        if ((int)json_array_size(ps) != row->nopts[s]) return INFINITY;
        for (int l = 0; l < row->nopts[s]; l++) {
            double d = fabs(json_number_value(json_array_get(ps, l)) - (double)r->probs[s][l]);
            if (!(d <= w)) w = d;
        }
    }
    return w;
}

/* ---- the earlier runtime's policy, simulated ---------------------------------------------------- */

/* The positions checkpointed by a state computed from c0 (the seed's _bounds: multiples of
 * stride below p, state_len - tail and p, rounded down to align, above c0; chunk-cap ends). */
static int policy_bounds(const squad_cache_opts *o, int max_chunk, int c0, int state_len, int *out) {
    int align = o->align, n = 0;
    int e = state_len - state_len % align;
    int cand[512], nc = 0;
    for (int k = o->stride; o->stride > 0 && k < e && nc < 500; k += o->stride)
        if (k - k % align > c0) cand[nc++] = k - k % align;
    if (o->tail > 0 && state_len - o->tail > 0) {
        int t = (state_len - o->tail) - (state_len - o->tail) % align;
        if (t > c0) cand[nc++] = t;
    }
    if (e > c0) cand[nc++] = e;
    for (int i = 1; i < nc; i++) /* insertion sort, then unique */
        for (int j = i; j > 0 && cand[j - 1] > cand[j]; j--) {
            int x = cand[j];
            cand[j] = cand[j - 1];
            cand[j - 1] = x;
        }
    int step = max_chunk - max_chunk % align, s = c0;
    for (int i = 0; i < nc; i++) {
        if (i > 0 && cand[i] == cand[i - 1]) continue;
        while (step > 0 && cand[i] - s > step) {
            s += step;
            out[n++] = s;
        }
        out[n++] = cand[i];
        s = cand[i];
    }
    return n;
}

typedef struct policy_group {
    const int32_t *ids; /* borrowed from the row */
    int n;
    int pos[64];
    int n_pos;
} policy_group;

typedef struct policy {
    squad_cache_opts opts;
    int max_chunk;
    policy_group groups[MAX_ROWS];
    int n_groups;
} policy;

static int policy_eligible(const squad_cache_opts *o, const squad_row *r) {
    if (r->state_len < 0) return 0;
    int p = r->state_len - r->state_len % o->align;
    if (p <= 0 || p < o->min_prefix || r->n_slots < 1 || r->n_slots > o->max_slots) return 0;
    return r->slots[0] >= p;
}

/* The reuse the policy gives a row (and the checkpoints it then makes), with no eviction. */
static int policy_row(policy *P, const squad_row *r) {
    int p = r->state_len - r->state_len % P->opts.align, c0 = 0;
    for (int g = 0; g < P->n_groups; g++) {
        const policy_group *G = &P->groups[g];
        int m = G->n < p ? G->n : p, lcp = 0;
        while (lcp < m && G->ids[lcp] == r->ids[lcp]) lcp++;
        for (int k = 0; k < G->n_pos; k++)
            if (G->pos[k] <= lcp && G->pos[k] > c0) c0 = G->pos[k];
    }
    if (c0 < p && P->n_groups < MAX_ROWS) {
        policy_group *G = &P->groups[P->n_groups++];
        G->ids = r->ids;
        G->n = p;
        G->n_pos = policy_bounds(&P->opts, P->max_chunk, c0, r->state_len, G->pos);
    }
    return c0;
}

/* ---- engines ------------------------------------------------------------------------------------ */

static squad_engine *engine_with(squad_model *m, const squad_cache_opts *co) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = SQUAD_DEVICE_CPU;
    o.threads = 1; /* ctest runs tests side by side on CI's 2 cores */
    o.precision = SQUAD_PRECISION_EXACT; /* compared with the fp32 fixtures */
    o.cache = *co;
    squad_err err = {0};
    squad_engine *e = squad_engine_new(m, &o, &err);
    if (!e) fprintf(stderr, "engine: %s\n", err.msg);
    return e;
}

static squad_cache_opts cache_opts(size_t budget, int min_prefix, int stride) {
    squad_cache_opts o = {budget, 64, 16, stride, min_prefix, 4, 0};
    return o;
}

/* The cost of one checkpoint and of a group of n positions on this engine's backend. */
static size_t budget_for(squad_model *m, int n_pos, int n_ckpts) {
    squad_cache_opts o = cache_opts(1, 64, 512);
    squad_engine *e = engine_with(m, &o);
    if (!e) return 0;
    size_t b = squad_cache_group_cost(e->cache, n_pos) + (size_t)n_ckpts * squad_cache_ckpt_cost(e->cache) +
               16 * sizeof(void *);
    squad_engine_free(e);
    return b;
}

/* ---- the fixture sequence ------------------------------------------------------------------------ */

typedef struct seq_case {
    const char *name;
    squad_cache_opts opts;
    int max_chunk;      /* 0: the backend's own */
    int expect_evicted; /* the budget is too small for the sequence's states */
    int caches_nothing; /* the budget cannot hold one checkpoint */
    int sanitized_rows; /* under the sanitizers: run only this many rows (0: skip the case; -1: all) */
} seq_case;

static void run_sequence(const fixture *fx, const squad_result *plain, const seq_case *sc) {
    const double t0 = squad_now_seconds();
    const int n_rows = !getenv("SQUAD_SANITIZED") || sc->sanitized_rows < 0 ? fx->n
                       : sc->sanitized_rows < fx->n ? sc->sanitized_rows : fx->n;
    if (n_rows == 0) return;
    squad_engine *e = engine_with(fx->model, &sc->opts);
    CHECKF(e != NULL, "%s: engine", sc->name);
    if (!e) return;
    if (sc->max_chunk && e->be->max_chunk > sc->max_chunk) e->be->max_chunk = sc->max_chunk;
    static policy P;
    memset(&P, 0, sizeof P);
    P.opts = sc->opts;
    P.max_chunk = e->be->max_chunk;
    squad_result *r = malloc(sizeof *r);
    squad_err err = {0};
    double worst_plain = 0, worst_exp = 0;
    long reused = 0, policy_reused = 0, equal_policy = 0, eligible_rows = 0;
    for (int i = 0; i < n_rows; i++) {
        const squad_row *row = &fx->rows[i].row;
        const int eligible = policy_eligible(&sc->opts, row) && sc->opts.budget_bytes > 0;
        const int p = row->state_len - row->state_len % sc->opts.align;
        const int held = e->cache && eligible ? squad_cache_lookup(e->cache, row->ids, p) : 0;
        CHECKF(!e->cache || squad_cache_eligible(e->cache, row) == eligible, "%s row %d: eligibility", sc->name, i);
        int rc = squad_engine_score(e, row, r, &err);
        CHECKF(rc == 0, "%s row %d: %s", sc->name, i, err.msg);
        if (rc) continue;
        double d = test_answer_diff(row, r, &plain[i]);
        CHECKF(d <= TOL_CPU_EXACT_CACHED, "%s row %d: |cached - uncached| %.3g", sc->name, i, d);
        if (d > worst_plain) worst_plain = d;
        if (fx->expected[i]) {
            d = expected_diff(row, r, fx->expected[i]);
            CHECKF(d <= TOL_CPU_EXACT_CACHED, "%s row %d: |cached - reference| %.3g", sc->name, i, d);
            if (d > worst_exp) worst_exp = d;
        }
        const int memo_hit = r->computed == 0 && r->reused == row->n_ids;
        if (memo_hit) continue; /* the memo answered an exact repeat: the cache never saw it */
        CHECKF(r->reused + r->computed == row->n_ids, "%s row %d: %d + %d != %d", sc->name, i, r->reused,
               r->computed, row->n_ids);
        if (!eligible) {
            CHECKF(r->reused == 0, "%s row %d: reused %d on the plain path", sc->name, i, r->reused);
            continue;
        }
        eligible_rows++;
        CHECKF(r->reused == held, "%s row %d: reused %d, the index held %d", sc->name, i, r->reused, held);
        CHECKF(r->reused % sc->opts.align == 0 && r->reused <= p, "%s row %d: reused %d", sc->name, i, r->reused);
        int pol = policy_row(&P, row);
        if (!sc->expect_evicted && !sc->caches_nothing)
            CHECKF(r->reused >= pol, "%s row %d: reused %d < the earlier runtime's %d", sc->name, i, r->reused, pol);
        if (sc->caches_nothing) CHECKF(r->reused == 0, "%s row %d: reused %d", sc->name, i, r->reused);
        equal_policy += r->reused == pol;
        reused += r->reused;
        policy_reused += pol;
        squad_cache_stats st;
        squad_engine_cache_stats(e, &st);
        CHECKF(st.bytes_held <= st.budget_bytes, "%s row %d: %zu bytes held, budget %zu", sc->name, i, st.bytes_held,
               st.budget_bytes);
        if (e->cache) {
            char why[256];
            CHECKF(squad_cache_check(e->cache, why, sizeof why) == 0, "%s row %d: %s", sc->name, i, why);
        }
    }
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    if (sc->expect_evicted) CHECKF(st.evicted > 0, "%s: nothing was evicted", sc->name);
    if (sc->caches_nothing) CHECKF(st.checkpoints == 0 && st.bytes_held == 0, "%s: %llu checkpoints", sc->name,
                                   (unsigned long long)st.checkpoints);
    printf("%-22s %3d rows: %2llu hits %2llu partial %2llu cold %2llu plain; reused %ld tokens (policy %ld, equal on "
           "%ld of %ld); %llu made, %llu evicted, %zu bytes held; worst |d| uncached %.2g, reference %.2g (%.1f s)\n",
           sc->name, n_rows, (unsigned long long)st.hits, (unsigned long long)st.partial, (unsigned long long)st.cold,
           (unsigned long long)st.plain, reused, policy_reused, equal_policy, eligible_rows,
           (unsigned long long)st.checkpoints_made, (unsigned long long)st.evicted, st.bytes_held, worst_plain,
           worst_exp, squad_now_seconds() - t0);
    fflush(stdout);
    free(r);
    squad_engine_free(e);
}

static void test_sequence(fixture *fx) {
    /* the uncached answers: a budget of zero, no cache and no memo, every row on the plain path */
    squad_cache_opts off = cache_opts(0, 256, 512);
    squad_engine *e = engine_with(fx->model, &off);
    CHECK(e != NULL);
    if (!e) return;
    squad_result *plain = calloc((size_t)fx->n, sizeof *plain);
    squad_err err = {0};
    double worst = 0;
    for (int i = 0; i < fx->n; i++) {
        CHECKF(squad_engine_score(e, &fx->rows[i].row, &plain[i], &err) == 0, "plain row %d: %s", i, err.msg);
        if (fx->expected[i]) {
            double d = expected_diff(&fx->rows[i].row, &plain[i], fx->expected[i]);
            if (d > worst) worst = d;
        }
    }
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    CHECK(e->cache == NULL && st.rows == 0 && st.bytes_held == 0 && st.plain == (uint64_t)fx->n);
    printf("budget 0 (uncached): %d rows on the plain path, worst |d| against the reference %.2g\n", fx->n, worst);
    fflush(stdout);
    squad_engine_free(e);

    const size_t big = (size_t)64 << 20;
    seq_case cases[] = {
        {"min_prefix 256", cache_opts(big, 256, 512), 0, 0, 0, 0},
        {"min_prefix 64", cache_opts(big, 64, 512), 0, 0, 0, -1},
        {"stride 128, chunk 128", cache_opts(big, 64, 128), 128, 0, 0, -1},
        {"stride 2048 (default)", cache_opts(big, 256, 2048), 0, 0, 0, 0},
        {"tiny budget", cache_opts(budget_for(fx->model, 640, 2), 64, 512), 0, 1, 0, -1},
        {"budget < 1 checkpoint", cache_opts(1000, 64, 512), 0, 0, 1, 8},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) run_sequence(fx, plain, &cases[k]);
    free(plain);
}

/* ---- thousands of rows, the accounting against the real allocations ------------------------------ */

typedef struct blob_rec {
    void *p;
    size_t bytes;
} blob_rec;

/* The wrapped backend's counters. The backend's alloc / release have no user pointer, so the
 * wrapper finds them here (a test program: one engine wrapped at a time). */
static struct {
    void *(*alloc)(squad_backend *, size_t, squad_err *);
    void (*release)(squad_backend *, void *);
    blob_rec *blobs;
    int n, cap;
    size_t live;
    int unknown_release;
} wrap;

static void *wrap_alloc(squad_backend *be, size_t bytes, squad_err *err) {
    void *p = wrap.alloc(be, bytes, err);
    if (!p) return NULL;
    if (wrap.n == wrap.cap) {
        int cap = wrap.cap ? 2 * wrap.cap : 64;
        blob_rec *nb = realloc(wrap.blobs, sizeof *nb * (size_t)cap);
        if (!nb) {
            wrap.release(be, p);
            return NULL;
        }
        wrap.blobs = nb;
        wrap.cap = cap;
    }
    wrap.blobs[wrap.n++] = (blob_rec){p, bytes};
    wrap.live += bytes;
    return p;
}

static void wrap_release(squad_backend *be, void *p) {
    for (int i = 0; i < wrap.n; i++)
        if (wrap.blobs[i].p == p) {
            wrap.live -= wrap.blobs[i].bytes;
            wrap.blobs[i] = wrap.blobs[--wrap.n];
            wrap.release(be, p);
            return;
        }
    wrap.unknown_release++;
    wrap.release(be, p);
}

static void test_many_rows(squad_model *m) {
    const double t0 = squad_now_seconds();
    const int sanitized = getenv("SQUAD_SANITIZED") != NULL;
    const int n_rows = sanitized ? MANY_ROWS_SANITIZED : MANY_ROWS;
    const int vocab = squad_model_vocab_size(m);
    /* room for about three states of ~250 tokens with their checkpoints */
    squad_cache_opts co = cache_opts(3 * budget_for(m, 256, 4), 64, 128);
    squad_engine *e = engine_with(m, &co);
    squad_cache_opts off = cache_opts(0, 64, 128);
    squad_engine *plain = engine_with(m, &off);
    CHECK(e && plain);
    if (!e || !plain) {
        squad_engine_free(e);
        squad_engine_free(plain);
        return;
    }
    memset(&wrap, 0, sizeof wrap);
    wrap.alloc = e->be->alloc;
    wrap.release = e->be->release;
    e->be->alloc = wrap_alloc;
    e->be->release = wrap_release;

    static int32_t sess[MANY_SESSIONS][640], ids[700];
    static int len[MANY_SESSIONS];
    int32_t slots[2], nopts[2] = {3, 4}, letters[4] = {1, 2, 3, 4};
    uint64_t s = 2024;
#define RND(n) (s = s * 6364136223846793005ull + 1442695040888963407ull, (int)((s >> 33) % (uint64_t)(n)))
    for (int k = 0; k < MANY_SESSIONS; k++) {
        for (int i = 0; i < 640; i++) sess[k][i] = RND(vocab);
        len[k] = 64 + RND(MANY_FIRST_STATE);
    }
    squad_result *r = malloc(sizeof *r), *ref = malloc(sizeof *ref);
    squad_err err = {0};
    double worst = 0;
    int compared = 0, failures = 0;
    for (int i = 0; i < n_rows && failures < 5; i++) {
        int k = RND(MANY_SESSIONS), what = RND(10);
        if (what < 3 && len[k] < MANY_MAX_STATE) { /* an action appended */
            int add = 8 + RND(24);
            for (int j = len[k]; j < len[k] + add; j++) sess[k][j] = RND(vocab);
            len[k] += add;
        } else if (what == 3 && len[k] > 160) { /* the middle changes */
            for (int j = 64 + RND(len[k] - 100); j < len[k]; j++) sess[k][j] = RND(vocab);
        } else if (what == 4) { /* a new session */
            for (int j = 0; j < 640; j++) sess[k][j] = RND(vocab);
            len[k] = 64 + RND(MANY_FIRST_STATE);
        }
        int q = 2 + RND(8), n_slots = 1 + RND(2);
        memcpy(ids, sess[k], sizeof(int32_t) * (size_t)len[k]);
        for (int j = 0; j < q; j++) ids[len[k] + j] = RND(vocab);
        int n = len[k] + q;
        for (int j = 0; j < n_slots; j++) slots[j] = n - n_slots + j;
        squad_row row = {ids, n, slots, nopts, n_slots, letters, 4, len[k], 0, NULL, 0};
        int p = len[k] - len[k] % 64;
        int held = squad_cache_lookup(e->cache, ids, p);
        if (squad_engine_score(e, &row, r, &err)) {
            CHECKF(0, "row %d: %s", i, err.msg);
            failures++;
            continue;
        }
        int memo_hit = r->computed == 0 && r->reused == n;
        int ok = memo_hit || r->reused == held;
        size_t be_bytes, host;
        squad_cache_bytes(e->cache, &be_bytes, &host);
        squad_cache_stats st;
        squad_engine_cache_stats(e, &st);
        char why[256] = "";
        ok = ok && be_bytes == wrap.live && st.bytes_held <= st.budget_bytes && wrap.unknown_release == 0 &&
             squad_cache_check(e->cache, why, sizeof why) == 0;
        if (!ok) {
            CHECKF(0, "row %d: reused %d (held %d), backend bytes %zu vs live %zu, held %zu of %zu; %s", i, r->reused,
                   held, be_bytes, wrap.live, st.bytes_held, st.budget_bytes, why);
            failures++;
        }
        if (i % MANY_COMPARE_EVERY == 0) {
            if (squad_engine_score(plain, &row, ref, &err) == 0) {
                double d = test_answer_diff(&row, r, ref);
                if (d > worst) worst = d;
                if (d > TOL_CPU_EXACT_CACHED) {
                    CHECKF(0, "row %d: |cached - uncached| %.3g", i, d);
                    failures++;
                }
                compared++;
            }
        }
    }
#undef RND
    test_passed++;
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    printf("many rows: %d rows (%llu cached: %llu hits, %llu partial, %llu cold), %llu reused / %llu computed tokens, "
           "%llu checkpoints made, %llu evicted, %zu of %zu bytes held; %d compared, worst |d| %.2g (%.1f s)\n",
           n_rows, (unsigned long long)st.rows, (unsigned long long)st.hits, (unsigned long long)st.partial,
           (unsigned long long)st.cold, (unsigned long long)st.tokens_reused, (unsigned long long)st.tokens_computed,
           (unsigned long long)st.checkpoints_made, (unsigned long long)st.evicted, st.bytes_held, st.budget_bytes,
           compared, worst, squad_now_seconds() - t0);
    CHECK(st.evicted > 0 && st.hits > 0 && st.partial > 0);
    squad_engine_free(e); /* releases every blob through the wrapper */
    CHECKF(wrap.live == 0 && wrap.n == 0, "%zu bytes in %d blobs left", wrap.live, wrap.n);
    free(wrap.blobs);
    free(r);
    free(ref);
    squad_engine_free(plain);
}

/* ---- per-call options, counters, clear ------------------------------------------------------------ */

/* A row of its own arrays: ids [0, state_len) from the state, then question tokens, slots at the end. */
typedef struct opt_row {
    int32_t ids[1600], slots[4], nopts[4], letters[4];
    squad_row row;
} opt_row;

static void opt_row_make(opt_row *r, const int32_t *state, int state_len, int q, uint64_t seed, int vocab) {
    memcpy(r->ids, state, sizeof(int32_t) * (size_t)state_len);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 7;
    for (int i = state_len; i < state_len + q; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        r->ids[i] = (int32_t)(x % (uint64_t)vocab);
    }
    const int n = state_len + q;
    r->slots[0] = n - 2;
    r->slots[1] = n - 1;
    r->nopts[0] = 2;
    r->nopts[1] = 4;
    for (int l = 0; l < 4; l++) r->letters[l] = l + 1;
    r->row = (squad_row){r->ids, n, r->slots, r->nopts, 2, r->letters, 4, state_len, 0, NULL, 0};
}

static void random_state(int32_t *s, int n, uint64_t seed, int vocab) {
    uint64_t x = seed * 0xd1b54a32d192ed03ull + 3;
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        s[i] = (int32_t)(x % (uint64_t)vocab);
    }
}

static int cache_consistent(squad_engine *e, const char *what) {
    char why[256] = "";
    const int ok = !e->cache || squad_cache_check(e->cache, why, sizeof why) == 0;
    CHECKF(ok, "%s: cache inconsistent: %s", what, why);
    return ok;
}

/* A cancel callback that says stop at its `at`-th poll (1-based); it counts every poll. */
typedef struct cancel_ctx {
    int polls, at;
} cancel_ctx;
static int cancel_at(void *ctx) {
    cancel_ctx *c = ctx;
    return ++c->polls >= c->at;
}

/* The memo's hits are counted apart from the cache's rows; a memo answer says so. */
static void test_memo_counts(squad_model *m, squad_engine *plain) {
    const int V = squad_model_vocab_size(m);
    squad_cache_opts co = cache_opts((size_t)64 << 20, 64, 512);
    squad_engine *e = engine_with(m, &co);
    CHECK(e != NULL);
    if (!e) return;
    static int32_t state[600];
    random_state(state, 600, 21, V);
    opt_row *r = malloc(sizeof *r);
    squad_result *a = malloc(sizeof *a), *b = malloc(sizeof *b), *ref = malloc(sizeof *ref);
    squad_err err = {0};
    squad_cache_stats st;
    opt_row_make(r, state, 600, 20, 1, V);
    CHECK(squad_engine_score(e, &r->row, a, &err) == 0 && a->memo == 0);
    CHECK(squad_engine_score(e, &r->row, b, &err) == 0);
    CHECK(b->memo == 1 && b->reused == r->row.n_ids && b->computed == 0 && b->cache_written == 0);
    CHECK(test_answer_diff(&r->row, a, b) == 0);
    squad_engine_cache_stats(e, &st);
    CHECKF(st.memo_hits == 1 && st.tokens_memo == (uint64_t)r->row.n_ids && st.rows == 1 && st.hits == 0 &&
               st.plain == 0 && st.tokens_reused == 0,
           "memo %llu / %llu tokens, rows %llu, hits %llu", (unsigned long long)st.memo_hits,
           (unsigned long long)st.tokens_memo, (unsigned long long)st.rows, (unsigned long long)st.hits);
    /* a row on the plain path: the memo answers its repeat too, and plain counts it once */
    r->row.state_len = -1;
    CHECK(squad_engine_score(e, &r->row, a, &err) == 0 && a->memo == 0);
    CHECK(squad_engine_score(e, &r->row, b, &err) == 0 && b->memo == 1);
    CHECK(squad_engine_score(plain, &r->row, ref, &err) == 0 && test_answer_diff(&r->row, b, ref) <= TOL_CPU_EXACT_CACHED);
    squad_engine_cache_stats(e, &st);
    CHECK(st.memo_hits == 2 && st.tokens_memo == 2 * (uint64_t)r->row.n_ids && st.plain == 1 && st.rows == 1);
    free(r), free(a), free(b), free(ref);
    squad_engine_free(e);
}

/* Cancelled after k polls, on the cached and the plain path: SQUAD_E_CANCELLED with a message, the
 * cache consistent, no row counted, and the same engine then answers the row as the uncached one. */
static void test_cancel(squad_model *m, squad_engine *plain) {
    const int V = squad_model_vocab_size(m);
    squad_cache_opts co = cache_opts((size_t)64 << 20, 64, 512);
    squad_engine *e = engine_with(m, &co);
    CHECK(e != NULL);
    if (!e) return;
    opt_row *r = malloc(sizeof *r);
    squad_result *a = malloc(sizeof *a), *ref = malloc(sizeof *ref);
    squad_err err = {0};
    static int32_t state[1400];
    for (int pathway = 0; pathway < 2; pathway++) {
        /* how many polls a whole row of this path makes: one per chunk */
        random_state(state, 1400, 50, V);
        opt_row_make(r, state, 1400, 30, 50, V);
        if (pathway) r->row.state_len = -1;
        cancel_ctx count = {0, 1 << 30};
        squad_score_opts counting = {.cancelled = cancel_at, .cancel_ctx = &count};
        CHECK(squad_engine_score_ex(e, &r->row, &counting, a, &err) == 0);
        const int chunks = count.polls;
        CHECKF(chunks >= 3, "a row of %d tokens polled %d times", r->row.n_ids, chunks);
        squad_engine_cache_clear(e);
        for (int k = 1; k <= chunks; k++) {
            random_state(state, 1400, 100 + (uint64_t)k + 50 * (uint64_t)pathway, V);
            opt_row_make(r, state, 1400, 30, (uint64_t)k, V);
            if (pathway) r->row.state_len = -1;
            squad_cache_stats before, after;
            squad_engine_cache_stats(e, &before);
            cancel_ctx cc = {0, k};
            squad_score_opts so = {.cancelled = cancel_at, .cancel_ctx = &cc};
            err.msg[0] = 0;
            const int rc = squad_engine_score_ex(e, &r->row, &so, a, &err);
            CHECKF(rc == SQUAD_E_CANCELLED && err.code == SQUAD_E_CANCELLED && err.msg[0] && cc.polls == k,
                   "%s path, cancel at poll %d: rc %d, %d polls, \"%s\"", pathway ? "plain" : "cached", k, rc, cc.polls,
                   err.msg);
            cache_consistent(e, "after a cancel");
            squad_engine_cache_stats(e, &after);
            CHECK(after.rows == before.rows && after.plain == before.plain && after.memo_hits == before.memo_hits);
            /* the same engine, the same row, no cancel: the uncached answer, and no memo of the cancelled one */
            CHECK(squad_engine_score(e, &r->row, a, &err) == 0 && a->memo == 0);
            CHECK(squad_engine_score(plain, &r->row, ref, &err) == 0);
            const double d = test_answer_diff(&r->row, a, ref);
            CHECKF(d <= TOL_CPU_EXACT_CACHED, "after a cancel at poll %d: answer off by %.3g", k, d);
            cache_consistent(e, "after the row that followed a cancel");
        }
    }
    free(r), free(a), free(ref);
    squad_engine_free(e);
}

/* end_checkpoint_only: one checkpoint, at p; the same answers; the next row restores p. Also
 * cache_written (cold: p; hit: 0; a grown state: the growth) and its counterpart without the option. */
static void test_end_only(squad_model *m, squad_engine *plain) {
    const int V = squad_model_vocab_size(m);
    static int32_t state[1500];
    random_state(state, 1500, 77, V);
    opt_row *r = malloc(sizeof *r);
    squad_result *a = malloc(sizeof *a), *b = malloc(sizeof *b), *ref = malloc(sizeof *ref);
    squad_err err = {0};
    const int state_len = 1100, p = 1088; /* 1100 rounded down to the alignment (64) */
    squad_cache_opts co = cache_opts((size_t)64 << 20, 64, 512);
    squad_engine *full = engine_with(m, &co), *end = engine_with(m, &co);
    CHECK(full && end);
    if (full && end) {
        const squad_score_opts eo = {.end_checkpoint_only = 1};
        opt_row_make(r, state, state_len, 20, 1, V);
        CHECK(squad_engine_score(plain, &r->row, ref, &err) == 0);
        CHECK(squad_engine_score(full, &r->row, a, &err) == 0);
        CHECK(squad_engine_score_ex(end, &r->row, &eo, b, &err) == 0);
        CHECK(test_answer_diff(&r->row, a, ref) <= TOL_CPU_EXACT_CACHED &&
              test_answer_diff(&r->row, b, ref) <= TOL_CPU_EXACT_CACHED);
        CHECKF(a->cache_written == p && b->cache_written == p, "cache_written %d and %d, p %d", a->cache_written,
               b->cache_written, p);
        squad_cache_stats sf, se;
        squad_engine_cache_stats(full, &sf);
        squad_engine_cache_stats(end, &se);
        CHECKF(se.checkpoints == 1 && se.checkpoints_made == 1 && sf.checkpoints > 1,
               "end-only %llu checkpoints, full %llu", (unsigned long long)se.checkpoints,
               (unsigned long long)sf.checkpoints);
        CHECK(squad_cache_lookup(end->cache, r->ids, p) == p && squad_cache_lookup(end->cache, r->ids, p - 1) == 0);
        CHECK(se.bytes_held < sf.bytes_held);
        cache_consistent(end, "end-only");
        /* another question about the state: both restore p and write nothing */
        opt_row_make(r, state, state_len, 24, 2, V);
        CHECK(squad_engine_score(plain, &r->row, ref, &err) == 0);
        CHECK(squad_engine_score(full, &r->row, a, &err) == 0 && a->reused == p && a->cache_written == 0);
        CHECK(squad_engine_score_ex(end, &r->row, &eo, b, &err) == 0 && b->reused == p && b->cache_written == 0);
        CHECK(test_answer_diff(&r->row, a, ref) <= TOL_CPU_EXACT_CACHED &&
              test_answer_diff(&r->row, b, ref) <= TOL_CPU_EXACT_CACHED);
        /* the state grows by 200 tokens: the new end minus the restored position */
        opt_row_make(r, state, state_len + 200, 20, 3, V);
        CHECK(squad_engine_score_ex(end, &r->row, &eo, b, &err) == 0);
        CHECKF(b->reused == p && b->cache_written == 1280 - p, "grown state: reused %d, cache_written %d", b->reused,
               b->cache_written);
        squad_engine_cache_stats(end, &se);
        CHECK(se.checkpoints == 2 && se.uncacheable == 0);
        cache_consistent(end, "end-only, grown");
    }
    squad_engine_free(full);
    squad_engine_free(end);
    free(r), free(a), free(b), free(ref);
}

/* checkpoints (a client's cache breakpoints): a checkpoint at each asked position (rounded down to
 * the alignment), restored by a later row that shares the state only up to there; end-only drops
 * them; the answers stay those of the plain path. */
static void test_marks(squad_model *m, squad_engine *plain) {
    const int V = squad_model_vocab_size(m);
    static int32_t state[1500];
    random_state(state, 1500, 91, V);
    opt_row *r = malloc(sizeof *r);
    squad_result *a = malloc(sizeof *a), *ref = malloc(sizeof *ref);
    squad_err err = {0};
    const int state_len = 1100, p = 1088, mark = 700, mark_pos = 640; /* 700 rounded down to 64 */
    squad_cache_opts co = cache_opts((size_t)64 << 20, 64, 4096); /* no stride position below p */
    squad_engine *with = engine_with(m, &co), *without = engine_with(m, &co), *end = engine_with(m, &co);
    CHECK(with && without && end && r && a && ref);
    if (with && without && end && r && a && ref) {
        const int marks[2] = {mark, 5000 /* past the state: ignored */};
        const squad_score_opts mo = {.checkpoints = marks, .n_checkpoints = 2};
        const squad_score_opts eo = {.checkpoints = marks, .n_checkpoints = 2, .end_checkpoint_only = 1};
        opt_row_make(r, state, state_len, 20, 1, V);
        CHECK(squad_engine_score(plain, &r->row, ref, &err) == 0);
        CHECK(squad_engine_score_ex(with, &r->row, &mo, a, &err) == 0);
        CHECK(test_answer_diff(&r->row, a, ref) <= TOL_CPU_EXACT_CACHED);
        CHECK(squad_engine_score(without, &r->row, a, &err) == 0);
        CHECK(squad_engine_score_ex(end, &r->row, &eo, a, &err) == 0);
        /* (chunk-length ends are checkpoints too, so look at what is deepest up to the mark) */
        CHECKF(squad_cache_lookup(with->cache, r->ids, mark_pos) == mark_pos, "a checkpoint at %d: lookup gives %d",
               mark_pos, squad_cache_lookup(with->cache, r->ids, mark_pos));
        CHECK(squad_cache_lookup(without->cache, r->ids, mark_pos) < mark_pos);
        CHECK(squad_cache_lookup(end->cache, r->ids, p - 1) == 0);
        /* a state that changes after the mark: restored from it */
        static int32_t changed[1500];
        memcpy(changed, state, sizeof changed);
        for (int i = mark_pos + 10; i < state_len; i++) changed[i] = (changed[i] + 1) % V;
        opt_row_make(r, changed, state_len, 20, 2, V);
        CHECK(squad_engine_score(plain, &r->row, ref, &err) == 0);
        CHECK(squad_engine_score_ex(with, &r->row, &mo, a, &err) == 0);
        CHECKF(a->reused == mark_pos, "changed state: reused %d, want %d", a->reused, mark_pos);
        CHECK(test_answer_diff(&r->row, a, ref) <= TOL_CPU_EXACT_CACHED);
        cache_consistent(with, "marks");
    }
    squad_engine_free(with);
    squad_engine_free(without);
    squad_engine_free(end);
    free(r), free(a), free(ref);
}

/* uncacheable: an eligible row whose new checkpoints do not fit the budget is answered uncached and
 * counted; a hit (nothing new to checkpoint) is not. */
static void test_uncacheable(squad_model *m, squad_engine *plain) {
    const int V = squad_model_vocab_size(m);
    static int32_t state[700];
    random_state(state, 700, 91, V);
    opt_row *r = malloc(sizeof *r);
    squad_result *a = malloc(sizeof *a), *ref = malloc(sizeof *ref);
    squad_err err = {0};
    squad_cache_opts tiny = cache_opts(1000, 64, 512); /* less than one checkpoint */
    squad_engine *e = engine_with(m, &tiny);
    CHECK(e != NULL);
    if (e) {
        opt_row_make(r, state, 600, 20, 1, V);
        CHECK(squad_engine_score(e, &r->row, a, &err) == 0 && squad_engine_score(plain, &r->row, ref, &err) == 0);
        CHECK(test_answer_diff(&r->row, a, ref) <= TOL_CPU_EXACT_CACHED && a->cache_written == 0 && a->reused == 0);
        squad_cache_stats st;
        squad_engine_cache_stats(e, &st);
        CHECK(st.uncacheable == 1 && st.checkpoints == 0 && st.rows == 1);
    }
    squad_engine_free(e);
    squad_cache_opts big = cache_opts((size_t)64 << 20, 64, 512);
    e = engine_with(m, &big);
    CHECK(e != NULL);
    if (e) {
        opt_row_make(r, state, 600, 20, 1, V);
        CHECK(squad_engine_score(e, &r->row, a, &err) == 0 && a->cache_written == 576);
        opt_row_make(r, state, 600, 22, 2, V);
        CHECK(squad_engine_score(e, &r->row, a, &err) == 0 && a->reused == 576);
        squad_cache_stats st;
        squad_engine_cache_stats(e, &st);
        CHECK(st.uncacheable == 0 && st.hits == 1);
    }
    squad_engine_free(e);
    free(r), free(a), free(ref);
}

/* squad_engine_cache_clear drops every checkpoint and memo entry; the counters stay. */
static void test_clear(squad_model *m) {
    const int V = squad_model_vocab_size(m);
    static int32_t state[700];
    random_state(state, 700, 5, V);
    opt_row *r = malloc(sizeof *r);
    squad_result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    squad_err err = {0};
    squad_cache_opts co = cache_opts((size_t)64 << 20, 64, 512);
    squad_engine *e = engine_with(m, &co);
    CHECK(e != NULL);
    if (e) {
        opt_row_make(r, state, 640, 20, 1, V);
        CHECK(squad_engine_score(e, &r->row, a, &err) == 0);
        squad_cache_stats st, st2;
        squad_engine_cache_stats(e, &st);
        CHECK(st.checkpoints > 0 && st.groups == 1);
        squad_engine_cache_clear(e);
        squad_engine_cache_stats(e, &st2);
        CHECK(st2.checkpoints == 0 && st2.groups == 0 && st2.evicted == st.evicted && st2.rows == st.rows &&
              st2.checkpoints_made == st.checkpoints_made);
        size_t be_bytes = 1, host_bytes = 1;
        squad_cache_bytes(e->cache, &be_bytes, &host_bytes);
        CHECK(be_bytes == 0 && st2.bytes_held == host_bytes);
        cache_consistent(e, "after a clear");
        /* the repeat is neither a memo answer nor a hit */
        CHECK(squad_engine_score(e, &r->row, b, &err) == 0 && b->memo == 0 && b->reused == 0);
        CHECK(test_answer_diff(&r->row, a, b) <= TOL_CPU_EXACT_CACHED);
        cache_consistent(e, "a row after a clear");
    }
    squad_engine_free(e);
    /* SQUAD_CACHE_BUDGET_AUTO on the CPU: the default budget */
    squad_cache_opts ao = cache_opts(SQUAD_CACHE_BUDGET_AUTO, 64, 512);
    e = engine_with(m, &ao);
    CHECK(e != NULL);
    if (e) {
        squad_cache_stats st;
        squad_engine_cache_stats(e, &st);
        squad_engine_opts d;
        squad_engine_opts_default(&d);
        CHECKF(st.budget_bytes == d.cache.budget_bytes, "auto budget on the CPU: %zu", st.budget_bytes);
        CHECK(squad_engine_score(e, &r->row, b, &err) == 0 && b->reused == 0);
    }
    squad_engine_free(e);
    free(r), free(a), free(b);
}

static void test_call_options(squad_model *m) {
    squad_cache_opts off = cache_opts(0, 64, 512);
    squad_engine *plain = engine_with(m, &off);
    CHECK(plain != NULL);
    if (!plain) return;
    test_memo_counts(m, plain);
    test_cancel(m, plain);
    test_end_only(m, plain);
    test_marks(m, plain);
    test_uncacheable(m, plain);
    test_clear(m);
    squad_engine_free(plain);
}

int main(void) {
    static fixture fx;
    int from_fixture = 0;
    fx.model = open_model(&from_fixture);
    CHECK(fx.model != NULL);
    if (!fx.model) return test_summary("test_cache");
    if (!from_fixture || read_fixture_rows(&fx)) {
        if (from_fixture) fprintf(stderr, "note: no cache_rows.jsonl in %s: synthetic rows\n", FIXTURE_DIR);
        make_rows(&fx, squad_model_vocab_size(fx.model));
    }
    printf("model: %s, %d rows in the sequence\n", from_fixture ? FIXTURE_DIR : "synthesized tiny", fx.n);
    test_sequence(&fx);
    test_many_rows(fx.model);
    test_call_options(fx.model);
    fixture_free(&fx);
    squad_model_free(fx.model);
    return test_summary("test_cache");
}
