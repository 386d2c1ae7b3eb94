/*
 * test_batch.c — the engine's batching scheduler (src/scheduler.c, docs/batching.md) on the CPU
 * backend, exact precision, the tiny preset.
 *
 * The reference for every batched answer is the same row run one at a time (an engine with
 * max_rows 1, rows scored in order): batching may only move where chunks are cut, so every
 * probability agrees within TOL_CPU_EXACT_BATCHED and the routes are identical. The scenarios:
 *  - random mixes of hits, partial hits, cold rows and plain rows (no state, too many slots) of
 *    different lengths and slot counts, submitted in waves between steps (continuous batching),
 *    with per-row options, under several row counts and token budgets; after every step the cache
 *    is consistent (squad_cache_check: pins, pending bytes, indexes) and within its budget, and
 *    every row in flight that restored a checkpoint holds a pin on it. One run is under eviction
 *    pressure (a budget of about two states);
 *  - one checkpoint restored by several rows at once (pinned once per row while in flight);
 *  - rows that share a new state compute it once (tokens_computed);
 *  - a row that fails validation inside a batch fails alone; a cancelled row ends alone; a
 *    backend error ends the rows in flight and the engine stays usable;
 *  - a row cancelled mid-flight (a deadline) leaves at the next step with the tokens it ran
 *    counted, none of its pending checkpoints visible, the others answered as alone, and the same
 *    row later answered as uncached;
 *  - rows of different specialists in one batch, with a wrong guess, on a backend that mixes
 *    routes and on one that runs them one route at a time.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cache_internal.h"
#include "engine.h"
#include "model.h"
#include "specialists.h"
#include "specialists_synth.h"
#include "testutil.h"
#include "tolerances.h"
#include "util.h"

#define MAX_IDS 1600
#define N_LETTERS 4
#define MAX_ROWS_TEST 96

static squad_model *g_m;
static int g_V;

/* ---- rows ------------------------------------------------------------------------------------ */

typedef struct trow {
    int32_t ids[MAX_IDS];
    int32_t slots[8], nopts[8], letters[N_LETTERS];
    squad_row row;
    squad_score_opts opts;
} trow;

static uint64_t g_rng = 0x5eed;
static uint32_t rnd(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 33);
}
static int rnd_in(int lo, int hi) { return lo + (int)(rnd() % (uint32_t)(hi - lo + 1)); }

static void fill_random(int32_t *dst, int n, int lo, int hi) {
    for (int i = 0; i < n; i++) dst[i] = (int32_t)rnd_in(lo, hi);
}

/* A row of `prefix` (state_len tokens; -1: no state) and a question of q tokens with n_slots slots
 * in it (the last on the last token). */
static void make_row(trow *t, const int32_t *prefix, int plen, int state_len, int q, int n_slots) {
    memset(t, 0, sizeof *t);
    memcpy(t->ids, prefix, (size_t)plen * sizeof *prefix);
    fill_random(t->ids + plen, q, 0, g_V - 1);
    const int n = plen + q;
    for (int i = 0; i < n_slots; i++) t->slots[i] = n - 1 - (n_slots - 1 - i) * (q / n_slots > 1 ? q / n_slots : 1);
    for (int i = 0; i < n_slots; i++) t->nopts[i] = 2 + (int)(rnd() % 3);
    for (int l = 0; l < N_LETTERS; l++) t->letters[l] = 10 + l;
    t->row = (squad_row){t->ids, n, t->slots, t->nopts, n_slots, t->letters, N_LETTERS, state_len, 0, NULL, 0};
}

/* ---- engines --------------------------------------------------------------------------------- */

/* An engine on the CPU in exact arithmetic; stride: the cache's checkpoints inside a long prefix. */
static squad_engine *engine_new_stride(const squad_model *m, int max_rows, int batch_tokens, size_t budget,
                                       const squad_specialists *sp, int stride) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = SQUAD_DEVICE_CPU;
    o.threads = 2;
    o.precision = SQUAD_PRECISION_EXACT;
    o.cache.budget_bytes = budget;
    o.cache.align = 64;
    o.cache.tail = 16;
    o.cache.stride = stride;
    o.cache.min_prefix = 128;
    o.max_rows = max_rows;
    o.batch_tokens = batch_tokens;
    o.specialists = sp;
    squad_err err = {0};
    squad_engine *e = squad_engine_new((squad_model *)m, &o, &err);
    CHECKF(e != NULL, "engine: %s", err.msg);
    return e;
}

static squad_engine *engine_new(const squad_model *m, int max_rows, int batch_tokens, size_t budget,
                                const squad_specialists *sp) {
    return engine_new_stride(m, max_rows, batch_tokens, budget, sp, 256);
}

/* The rows one at a time on a max_rows 1 engine (the reference). */
static void score_alone(const squad_model *m, const squad_specialists *sp, trow *rows, int n, squad_result *ref) {
    squad_engine *e = engine_new(m, 1, 0, (size_t)64 << 20, sp);
    if (!e) return;
    CHECK(e->sched.max_rows == 1);
    squad_err err = {0};
    for (int i = 0; i < n; i++)
        CHECKF(squad_engine_score_ex(e, &rows[i].row, &rows[i].opts, &ref[i], &err) == 0, "alone row %d: %s", i,
               err.msg);
    squad_engine_free(e);
}

/* How a submitted row ended. */
typedef struct ended {
    int calls, rc;
    squad_err err;
} ended;

static void on_done(void *ctx, int rc, const squad_err *err) {
    ended *d = ctx;
    d->calls++;
    d->rc = rc;
    d->err = *err;
}

/* After a step: the cache consistent and within its budget, and every row in flight that restored
 * a checkpoint holding a pin on its group. */
static void check_in_flight(squad_engine *e, const char *what) {
    if (!e->cache) return;
    char why[256] = "";
    CHECKF(squad_cache_check(e->cache, why, sizeof why) == 0, "%s: %s", what, why);
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    CHECKF(st.bytes_held <= st.budget_bytes, "%s: held %zu > budget %zu", what, st.bytes_held, st.budget_bytes);
    for (int i = 0; i < e->sched.max_rows; i++) {
        const squad_sched_row *r = e->sched.slots[i];
        if (!r || !r->plan_open || r->plan.c0 == 0) continue;
        CHECKF(squad_cache_pins(e->cache, r->row.ids, r->plan.c0) >= 1, "%s: a restored checkpoint at %d unpinned",
               what, r->plan.c0);
    }
}

/* The rows through the scheduler in waves: a few submitted, a few steps, more submitted. */
static void score_waves(squad_engine *e, trow *rows, int n, squad_result *out, ended *ends) {
    squad_err err = {0};
    int next = 0, steps = 0;
    memset(ends, 0, sizeof *ends * (size_t)n);
    while (next < n || squad_engine_pending(e) > 0) {
        for (int k = rnd_in(0, 6); k > 0 && next < n; k--, next++) {
            const int rc = squad_engine_submit(e, &rows[next].row, &rows[next].opts, &out[next], on_done, &ends[next], &err);
            CHECKF(rc == 0, "submit row %d: %s", next, err.msg);
        }
        for (int k = rnd_in(1, 3); k > 0 && squad_engine_pending(e) > 0; k--) {
            const int left = squad_engine_step(e, &err);
            CHECKF(left >= 0, "step: %s", err.msg);
            CHECK(left == squad_engine_pending(e));
            check_in_flight(e, "after a step");
            steps++;
        }
    }
    for (int i = 0; i < n; i++) CHECKF(ends[i].calls == 1, "row %d: done called %d times", i, ends[i].calls);
}

/* ---- random mixes ------------------------------------------------------------------------------ */

static int make_mix(trow *rows, int n) {
    static int32_t base[3][MAX_IDS], fresh[MAX_IDS];
    const int base_len[3] = {400, 700, 1000};
    for (int b = 0; b < 3; b++) fill_random(base[b], base_len[b], 0, g_V - 1);
    for (int i = 0; i < n; i++) {
        trow *t = &rows[i];
        const int b = rnd_in(0, 2), kind = rnd_in(0, 4);
        const int q = rnd_in(8, 120), slots = rnd_in(1, 3);
        if (kind == 0) { /* a hit (after the first row of that state) */
            make_row(t, base[b], base_len[b], base_len[b], q, slots);
        } else if (kind == 1) { /* a partial hit: the state shares its start with a cached one */
            const int keep = rnd_in(64, base_len[b]), len = keep + rnd_in(1, 300);
            memcpy(fresh, base[b], (size_t)keep * sizeof *fresh);
            fill_random(fresh + keep, len - keep, 0, g_V - 1);
            make_row(t, fresh, len, len, q, slots);
        } else if (kind == 2) { /* cold: a new state */
            const int len = rnd_in(130, 900);
            fill_random(fresh, len, 0, g_V - 1);
            make_row(t, fresh, len, len, q, slots);
        } else if (kind == 3) { /* plain: no state */
            const int len = rnd_in(1, 600);
            fill_random(fresh, len, 0, g_V - 1);
            make_row(t, fresh, len, -1, q, slots);
        } else { /* plain: more slots than the cache takes */
            make_row(t, base[b], base_len[b], base_len[b], q + 8, rnd_in(5, 6));
        }
        t->opts.want_vocab = i % 3 == 0;
        t->opts.end_checkpoint_only = i % 4 == 1;
    }
    return n;
}

static void check_mix(int max_rows, int batch_tokens, size_t budget, int n, uint64_t seed, const char *what) {
    g_rng = seed;
    trow *rows = calloc((size_t)n, sizeof *rows);
    squad_result *ref = calloc((size_t)n, sizeof *ref), *got = calloc((size_t)n, sizeof *got);
    ended *ends = calloc((size_t)n, sizeof *ends);
    if (!rows || !ref || !got || !ends) abort();
    make_mix(rows, n);
    score_alone(g_m, NULL, rows, n, ref);
    squad_engine *e = engine_new(g_m, max_rows, batch_tokens, budget, NULL);
    double worst = 0;
    if (e) {
        score_waves(e, rows, n, got, ends);
        for (int i = 0; i < n; i++) {
            CHECKF(ends[i].rc == 0, "%s row %d: %s", what, i, ends[i].err.msg);
            const double d = test_answer_diff(&rows[i].row, &got[i], &ref[i]);
            CHECKF(d <= TOL_CPU_EXACT_BATCHED, "%s row %d (%d tokens, state %d): batched %.3g from alone", what, i,
                   rows[i].row.n_ids, rows[i].row.state_len, d);
            if (d > worst) worst = d;
            CHECK(got[i].route == ref[i].route && got[i].n_slots == rows[i].row.n_slots);
            CHECK(got[i].reused + got[i].computed >= rows[i].row.n_ids || got[i].memo);
            if (rows[i].opts.want_vocab) {
                CHECK(got[i].has_vocab);
                for (int s = 0; s < rows[i].row.n_slots; s++)
                    CHECK_NEAR(got[i].vocab_lse[s], ref[i].vocab_lse[s], TOL_VOCAB_EXACT_CHUNKED * (1 + fabs(ref[i].vocab_lse[s])));
            }
        }
        squad_cache_stats st;
        squad_engine_cache_stats(e, &st);
        printf("%-34s %d rows: %llu hits %llu partial %llu cold %llu plain %llu memo, %llu evicted; worst %.3g\n", what,
               n, (unsigned long long)st.hits, (unsigned long long)st.partial, (unsigned long long)st.cold,
               (unsigned long long)st.plain, (unsigned long long)st.memo_hits, (unsigned long long)st.evicted, worst);
        if (budget < ((size_t)1 << 20)) CHECKF(st.evicted > 0, "%s: no eviction under pressure", what);
        CHECK(squad_engine_pending(e) == 0);
        squad_engine_free(e);
    }
    free(rows), free(ref), free(got), free(ends);
}

/* A budget of about two states of 700 tokens, from the cache's own costs. */
static size_t pressure_budget(void) {
    squad_engine *probe = engine_new(g_m, 1, 0, (size_t)64 << 20, NULL);
    if (!probe) return 0;
    const size_t b = 2 * (squad_cache_group_cost(probe->cache, 700) + 4 * squad_cache_ckpt_cost(probe->cache));
    squad_engine_free(probe);
    return b;
}

/* ---- one checkpoint, several rows ------------------------------------------------------------ */

static void check_shared_restore(void) {
    static trow rows[5];
    static int32_t state[512];
    g_rng = 77;
    fill_random(state, 512, 0, g_V - 1);
    for (int i = 0; i < 5; i++) make_row(&rows[i], state, 512, 512, i ? 300 : 20, 2);
    squad_result ref[5], got[5];
    score_alone(g_m, NULL, rows, 5, ref);
    squad_engine *e = engine_new(g_m, 8, 128, (size_t)64 << 20, NULL);
    if (!e) return;
    squad_err err = {0};
    CHECK(squad_engine_score(e, &rows[0].row, &got[0], &err) == 0 && got[0].cache_written == 512);
    ended ends[5] = {{0}};
    for (int i = 1; i < 5; i++) CHECK(squad_engine_submit(e, &rows[i].row, NULL, &got[i], on_done, &ends[i], &err) == 0);
    CHECK(squad_engine_step(e, &err) == 4);
    /* all four restored the checkpoint at 512 and read its group in place: four pins */
    CHECKF(squad_cache_pins(e->cache, state, 512) == 4, "pins %d", squad_cache_pins(e->cache, state, 512));
    squad_engine_cache_clear(e); /* what is pinned stays */
    CHECK(squad_cache_lookup(e->cache, state, 512) == 512);
    int steps = 1;
    while (squad_engine_pending(e) > 0) {
        CHECK(squad_engine_step(e, &err) >= 0);
        check_in_flight(e, "shared restore");
        steps++;
    }
    CHECKF(steps >= 4 * 300 / 128, "%d steps for 1200 tokens at 128 a step", steps);
    CHECK(squad_cache_pins(e->cache, state, 512) == 0);
    for (int i = 1; i < 5; i++) {
        CHECK(ends[i].calls == 1 && ends[i].rc == 0 && got[i].reused == 512 && got[i].computed == 300);
        CHECK(test_answer_diff(&rows[i].row, &got[i], &ref[i]) <= TOL_CPU_EXACT_BATCHED);
    }
    squad_engine_free(e);
}

/* ---- a long cold row riding with hits: cut to what they leave ---------------------------------- */

static void check_long_row_cut(void) {
    enum { N_HITS = 3, Q = 40, BUDGET = 256 };
    static trow cold, warm, hits[N_HITS];
    static int32_t state[640], fresh[1500];
    g_rng = 555;
    fill_random(state, 640, 0, g_V - 1);
    fill_random(fresh, 1500, 0, g_V - 1);
    make_row(&cold, fresh, 1500, 1500, 20, 1);
    make_row(&warm, state, 640, 640, 10, 1);
    for (int i = 0; i < N_HITS; i++) make_row(&hits[i], state, 640, 640, Q, 2);
    squad_engine *e = engine_new(g_m, 8, BUDGET, (size_t)64 << 20, NULL);
    if (!e) return;
    squad_err err = {0};
    squad_result wr, cr, hr[N_HITS];
    CHECK(squad_engine_score(e, &warm.row, &wr, &err) == 0);
    ended ce = {0}, he[N_HITS] = {{0}};
    CHECK(squad_engine_submit(e, &cold.row, NULL, &cr, on_done, &ce, &err) == 0); /* first in */
    for (int i = 0; i < N_HITS; i++) CHECK(squad_engine_submit(e, &hits[i].row, NULL, &hr[i], on_done, &he[i], &err) == 0);
    /* one step: each hit's whole question, and the cold row what is left, cut to 64s */
    CHECK(squad_engine_step(e, &err) == 1);
    for (int i = 0; i < N_HITS; i++) CHECK(he[i].calls == 1 && he[i].rc == 0 && hr[i].computed == Q);
    CHECKF(cr.computed == (BUDGET - N_HITS * Q) / 64 * 64, "the cold row ran %d tokens", cr.computed);
    while (squad_engine_pending(e) > 0) CHECK(squad_engine_step(e, &err) >= 0);
    CHECK(ce.calls == 1 && ce.rc == 0 && cr.computed == cold.row.n_ids);
    squad_engine_free(e);
}

/* ---- a long cold row under a steady flow of hits: whole chunks often enough ------------------ */

/* The row in flight whose result is `out` (NULL when none). */
static const squad_sched_row *in_flight_row(const squad_engine *e, const squad_result *out) {
    for (int i = 0; i < e->sched.max_rows; i++)
        if (e->sched.slots[i] && e->sched.slots[i]->out == out) return e->sched.slots[i];
    return NULL;
}

/* Three hits of 48 tokens arrive every step and take 144 of the step's 256 tokens, so the cold row
 * submitted first would get the leftover cut (64 tokens) step after step. The policy: a row that
 * got less than its whole want SCHED_STARVE_STEPS steps in a row runs its whole want at the next
 * step (the hits of that step wait one step). Checked step by step against the row's want, and
 * every hit answered within a few steps of its arrival. */
static void check_cut_row_keeps_pace(void) {
    enum { BUDGET = 256, Q = 48, PER_STEP = 3, MAX_HITS = 96, COLD = 1500 };
    static trow cold, warm, hits[MAX_HITS];
    static int32_t state[640], fresh[COLD];
    g_rng = 777;
    fill_random(state, 640, 0, g_V - 1);
    fill_random(fresh, COLD, 0, g_V - 1);
    make_row(&cold, fresh, COLD, COLD, 20, 1);
    make_row(&warm, state, 640, 640, 10, 1);
    for (int i = 0; i < MAX_HITS; i++) make_row(&hits[i], state, 640, 640, Q, 1);
    /* stride 4096: no checkpoint inside the cold row's prefix but near its end: long wants */
    squad_engine *e = engine_new_stride(g_m, 16, BUDGET, (size_t)64 << 20, NULL, 4096);
    if (!e) return;
    squad_err err = {0};
    static squad_result wr, cr, hr[MAX_HITS];
    static ended ce, he[MAX_HITS];
    static int sent_at[MAX_HITS];
    memset(&ce, 0, sizeof ce);
    memset(he, 0, sizeof he);
    CHECK(squad_engine_score(e, &warm.row, &wr, &err) == 0);
    CHECK(squad_engine_submit(e, &cold.row, NULL, &cr, on_done, &ce, &err) == 0);
    int sent = 0, step = 0, shorted = 0, worst_shorted = 0, cut_steps = 0, whole_steps = 0;
    while (ce.calls == 0 && step < 200) {
        for (int k = 0; k < PER_STEP && sent < MAX_HITS; k++, sent++) {
            CHECK(squad_engine_submit(e, &hits[sent].row, NULL, &hr[sent], on_done, &he[sent], &err) == 0);
            sent_at[sent] = step;
        }
        const squad_sched_row *r = in_flight_row(e, &cr);
        const int want = r ? squad_sched_want(&e->sched, r) : -1, before = r ? r->pos : 0;
        CHECK(squad_engine_step(e, &err) >= 0);
        step++;
        if (!r) continue;
        r = in_flight_row(e, &cr);
        const int got = r ? r->pos - before : want; /* gone: it ran its end */
        if (got < want) {
            cut_steps++;
            shorted++;
        } else {
            whole_steps++;
            shorted = 0;
        }
        if (shorted > worst_shorted) worst_shorted = shorted;
        for (int i = 0; i < sent; i++)
            if (he[i].calls == 0) CHECKF(step - sent_at[i] <= 4, "hit %d waited %d steps", i, step - sent_at[i]);
    }
    CHECKF(ce.calls == 1 && ce.rc == 0 && cr.computed == cold.row.n_ids, "the cold row: done %d, rc %d, %d tokens",
           ce.calls, ce.rc, (int)cr.computed);
    CHECKF(worst_shorted <= SCHED_STARVE_STEPS, "the cold row got less than its want %d steps in a row",
           worst_shorted);
    CHECKF(cut_steps > 0 && whole_steps > 0, "both kinds of step happened (%d cut, %d whole)", cut_steps,
           whole_steps);
    /* hits keep flowing: each answered within a few steps of its arrival */
    while (squad_engine_pending(e) > 0) {
        CHECK(squad_engine_step(e, &err) >= 0);
        step++;
        for (int i = 0; i < sent; i++)
            if (he[i].calls == 0) CHECKF(step - sent_at[i] <= 4, "hit %d waited %d steps", i, step - sent_at[i]);
    }
    for (int i = 0; i < sent; i++) CHECKF(he[i].calls == 1 && he[i].rc == 0, "hit %d: done %d", i, he[i].calls);
    squad_engine_free(e);
}

/* Two rows starved by a flow of hits: the older goes first, whatever their wants. An older cold
 * row of 1,500 tokens (want 256: its chunks end far away) and a younger one of 100 (want 100) get
 * nothing while five 48-token hits a step take 240 of the 256 tokens; once both are starved, the
 * older runs its whole want and the younger waits (shortest-first would run the younger first, and
 * a long row could wait behind a stream of shorter starved rows). */
static void check_starved_in_order(void) {
    enum { BUDGET = 256, Q = 48, PER_STEP = 5, MAX_HITS = 40 };
    static trow old_row, young, warm, hits[MAX_HITS];
    static int32_t state[640], fresh[1500], fresh2[100];
    g_rng = 999;
    fill_random(state, 640, 0, g_V - 1);
    fill_random(fresh, 1500, 0, g_V - 1);
    fill_random(fresh2, 100, 0, g_V - 1);
    make_row(&old_row, fresh, 1500, 1500, 20, 1);
    make_row(&young, fresh2, 80, -1, 20, 1);
    make_row(&warm, state, 640, 640, 10, 1);
    for (int i = 0; i < MAX_HITS; i++) make_row(&hits[i], state, 640, 640, Q, 1);
    squad_engine *e = engine_new_stride(g_m, 16, BUDGET, (size_t)64 << 20, NULL, 4096);
    if (!e) return;
    squad_err err = {0};
    static squad_result wr, orr, yr, hr[MAX_HITS];
    static ended oe, ye, he[MAX_HITS];
    CHECK(squad_engine_score(e, &warm.row, &wr, &err) == 0);
    int sent = 0;
    for (int k = 0; k < PER_STEP; k++, sent++) /* the hits of the first step come first */
        CHECK(squad_engine_submit(e, &hits[sent].row, NULL, &hr[sent], on_done, &he[sent], &err) == 0);
    CHECK(squad_engine_submit(e, &old_row.row, NULL, &orr, on_done, &oe, &err) == 0);
    CHECK(squad_engine_submit(e, &young.row, NULL, &yr, on_done, &ye, &err) == 0);
    int checked = 0;
    for (int step = 0; step < 8 && sent + PER_STEP <= MAX_HITS; step++) {
        const squad_sched_row *o = in_flight_row(e, &orr), *y = in_flight_row(e, &yr); /* joined at a step */
        const int both_starved = o && y && o->shorted >= SCHED_STARVE_STEPS && y->shorted >= SCHED_STARVE_STEPS;
        const int o_want = o ? squad_sched_want(&e->sched, o) : 0, o_pos = o ? o->pos : 0, y_pos = y ? y->pos : 0;
        CHECK(squad_engine_step(e, &err) >= 0);
        if (both_starved && !checked) { /* the rows again: one that ran to its end has left */
            o = in_flight_row(e, &orr);
            y = in_flight_row(e, &yr);
            const int o_ran = o ? o->pos - o_pos : old_row.row.n_ids - o_pos, y_ran = y ? y->pos - y_pos : -1;
            CHECKF(o_ran == o_want, "the older starved row ran %d of its %d", o_ran, o_want);
            CHECKF(y_ran == 0, "the younger starved row ran before the older (%d; -1: to its end)", y_ran);
            checked = 1;
        }
        for (int k = 0; k < PER_STEP; k++, sent++)
            CHECK(squad_engine_submit(e, &hits[sent].row, NULL, &hr[sent], on_done, &he[sent], &err) == 0);
    }
    CHECKF(checked, "both rows were starved at once (%d)", checked);
    while (squad_engine_pending(e) > 0) CHECK(squad_engine_step(e, &err) >= 0);
    CHECK(oe.calls == 1 && oe.rc == 0 && ye.calls == 1 && ye.rc == 0);
    for (int i = 0; i < sent; i++) CHECK(he[i].calls == 1 && he[i].rc == 0);
    squad_engine_free(e);
}

/* ---- a new state shared by rows in flight: computed once ------------------------------------- */

static void check_shared_prefix_once(void) {
    enum { N = 5, P = 1024 };
    static trow rows[N];
    static int32_t state[P];
    g_rng = 91;
    fill_random(state, P, 0, g_V - 1);
    uint64_t want = P;
    for (int i = 0; i < N; i++) {
        make_row(&rows[i], state, P, P, 30 + 9 * i, 1 + i % 3);
        want += (uint64_t)(rows[i].row.n_ids - P);
    }
    squad_result ref[N], got[N];
    score_alone(g_m, NULL, rows, N, ref);
    squad_engine *e = engine_new(g_m, 8, 0, (size_t)64 << 20, NULL);
    if (!e) return;
    squad_row in[N];
    for (int i = 0; i < N; i++) in[i] = rows[i].row;
    int rcs[N];
    squad_err errs[N], err = {0};
    CHECKF(squad_engine_score_batch(e, in, N, NULL, got, rcs, errs, &err) == 0, "%s", err.msg);
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    CHECKF(st.tokens_computed == want, "computed %llu tokens, the state once is %llu",
           (unsigned long long)st.tokens_computed, (unsigned long long)want);
    CHECK(st.cold == 1 && st.hits == N - 1);
    for (int i = 0; i < N; i++) CHECK(rcs[i] == 0 && test_answer_diff(&rows[i].row, &got[i], &ref[i]) <= TOL_CPU_EXACT_BATCHED);
    squad_engine_free(e);
}

/* ---- rows that fail alone -------------------------------------------------------------------- */

typedef struct cancel_ctx {
    int polls, at;
} cancel_ctx;
static int cancel_at(void *ctx) {
    cancel_ctx *c = ctx;
    return ++c->polls >= c->at;
}

/* A forward that fails at its n-th call, around the backend's own. */
static int (*g_forward)(squad_backend *, const squad_chunk *, int, squad_err *);
static int g_fail_at, g_calls;
static int failing_forward(squad_backend *be, const squad_chunk *ck, int n, squad_err *err) {
    if (++g_calls == g_fail_at) return squad_fail(err, SQUAD_E_BACKEND, "injected failure at forward %d", g_calls);
    return g_forward(be, ck, n, err);
}

static void check_failures(void) {
    enum { N = 5 };
    static trow rows[N];
    static int32_t state[N][700];
    g_rng = 123;
    for (int i = 0; i < N; i++) {
        fill_random(state[i], 700, 0, g_V - 1);
        make_row(&rows[i], state[i], 700, 700, 40, 2);
    }
    squad_result ref[N], got[N];
    score_alone(g_m, NULL, rows, N, ref);
    squad_engine *e = engine_new(g_m, 8, 256, (size_t)64 << 20, NULL);
    if (!e) return;
    squad_err err = {0}, errs[N];
    int rcs[N];

    /* validation: row 1's slot is past its end, row 3 forces a specialist the engine lacks */
    squad_row in[N];
    for (int i = 0; i < N; i++) in[i] = rows[i].row;
    int32_t bad_slot[2] = {5, 900};
    in[1].slots = bad_slot;
    in[3].specialist = 2;
    int rc = squad_engine_score_batch(e, in, N, NULL, got, rcs, errs, &err);
    CHECK(rc == SQUAD_E_INVALID && rcs[1] == SQUAD_E_INVALID && rcs[3] == SQUAD_E_INVALID);
    CHECK(errs[1].msg[0] && errs[3].msg[0] && strcmp(err.msg, errs[1].msg) == 0);
    for (int i = 0; i < N; i++)
        if (i != 1 && i != 3) CHECK(rcs[i] == 0 && test_answer_diff(&rows[i].row, &got[i], &ref[i]) <= TOL_CPU_EXACT_BATCHED);
    squad_engine_cache_clear(e);

    /* a cancel: row 2 stops at its third poll (one poll per chunk it takes part in) */
    cancel_ctx cc = {0, 3};
    squad_score_opts so = {.cancelled = cancel_at, .cancel_ctx = &cc};
    ended ends[N] = {{0}};
    squad_cache_stats before, after;
    squad_engine_cache_stats(e, &before);
    for (int i = 0; i < N; i++)
        CHECK(squad_engine_submit(e, &rows[i].row, i == 2 ? &so : NULL, &got[i], on_done, &ends[i], &err) == 0);
    while (squad_engine_pending(e) > 0) {
        CHECK(squad_engine_step(e, &err) >= 0);
        check_in_flight(e, "with a cancel");
    }
    CHECK(ends[2].rc == SQUAD_E_CANCELLED && ends[2].err.code == SQUAD_E_CANCELLED && cc.polls == 3);
    for (int i = 0; i < N; i++)
        if (i != 2) CHECK(ends[i].rc == 0 && test_answer_diff(&rows[i].row, &got[i], &ref[i]) <= TOL_CPU_EXACT_BATCHED);
    squad_engine_cache_stats(e, &after);
    CHECK(after.rows == before.rows + N - 1);
    CHECK(squad_cache_pins(e->cache, state[0], 640) == 0);

    /* a backend error at the third forward: every row in flight ends with it */
    squad_engine_cache_clear(e);
    g_forward = e->be->forward;
    g_calls = 0;
    g_fail_at = 3;
    e->be->forward = failing_forward;
    memset(ends, 0, sizeof ends);
    for (int i = 0; i < N; i++) CHECK(squad_engine_submit(e, &rows[i].row, NULL, &got[i], on_done, &ends[i], &err) == 0);
    int failed_steps = 0;
    while (squad_engine_pending(e) > 0)
        if (squad_engine_step(e, &err) < 0) failed_steps++;
    CHECK(failed_steps == 1 && err.code == SQUAD_E_BACKEND);
    for (int i = 0; i < N; i++) CHECK(ends[i].calls == 1 && ends[i].rc == SQUAD_E_BACKEND);
    check_in_flight(e, "after a backend error");
    e->be->forward = g_forward;
    CHECK(squad_engine_score(e, &rows[0].row, &got[0], &err) == 0); /* still usable */
    CHECK(test_answer_diff(&rows[0].row, &got[0], &ref[0]) <= TOL_CPU_EXACT_BATCHED);
    squad_engine_free(e);
}

/* ---- a deadline: a row cancelled mid-flight leaves at the next step -------------------------- */

/* A cancel callback the caller flips (a deadline passed, a client gone); it counts its polls. */
typedef struct stop_flag {
    int stop, polls;
} stop_flag;
static int stop_when_set(void *ctx) {
    stop_flag *f = ctx;
    f->polls++;
    return f->stop;
}

/* A cold row with a long state (the victim) is cancelled mid-prefix among three others: a row of the
 * same state waiting for the victim's checkpoint, a hit on another state and a plain row. The
 * victim leaves at the very next step (polled once there, though that step's budget would have
 * gone to a starved row first) with SQUAD_E_CANCELLED and computed equal to the tokens it ran,
 * short of its length; none of its pending checkpoints becomes visible and no row of it is
 * counted; the others are answered as alone; and the same row asked again later is answered as
 * the uncached engine answers it, from the checkpoint the waiting row committed instead. */
static void check_cancel_mid_flight(void) {
    enum { N = 4, P = 1000, VICTIM = 0, TWIN = 1, HIT = 2, PLAIN = 3, BUDGET = 192 };
    static trow rows[N], warm;
    static int32_t state[P], other[700], plain[400];
    g_rng = 4242;
    fill_random(state, P, 0, g_V - 1);
    fill_random(other, 700, 0, g_V - 1);
    fill_random(plain, 400, 0, g_V - 1);
    make_row(&rows[VICTIM], state, P, P, 40, 2);
    make_row(&rows[TWIN], state, P, P, 25, 1);
    make_row(&rows[HIT], other, 700, 700, 30, 2);
    make_row(&rows[PLAIN], plain, 400, -1, 20, 1);
    make_row(&warm, other, 700, 700, 10, 1);
    squad_result ref[N], got[N], warm_out, later, uncached;
    score_alone(g_m, NULL, rows, N, ref);
    squad_engine *e = engine_new(g_m, 8, BUDGET, (size_t)64 << 20, NULL);
    squad_engine *off = engine_new(g_m, 1, 0, 0, NULL); /* no cache, no memo */
    if (!e || !off) {
        squad_engine_free(e);
        squad_engine_free(off);
        return;
    }
    squad_err err = {0};
    CHECK(squad_engine_score(e, &warm.row, &warm_out, &err) == 0); /* the hit's state cached */
    stop_flag flag = {0, 0};
    squad_score_opts so = {.cancelled = stop_when_set, .cancel_ctx = &flag};
    ended ends[N] = {{0}};
    for (int i = 0; i < N; i++)
        CHECK(squad_engine_submit(e, &rows[i].row, i == VICTIM ? &so : NULL, &got[i], on_done, &ends[i], &err) == 0);
    for (int k = 0; k < 2; k++) { /* the victim runs into its prefix; the twin waits for its checkpoint */
        CHECK(squad_engine_step(e, &err) > 0);
        check_in_flight(e, "before the cancel");
    }
    const squad_sched_row *v = in_flight_row(e, &got[VICTIM]);
    const int ran = v ? v->pos : -1;
    CHECKF(ran > 0 && ran < P - P % 64, "the victim ran %d tokens before the cancel", ran);
    CHECK(v && v->plan_open && !v->committed);
    CHECK(ends[TWIN].calls == 0 && in_flight_row(e, &got[TWIN]) == NULL);

    flag.stop = 1; /* the deadline passes */
    const int polls = flag.polls;
    CHECK(squad_engine_step(e, &err) > 0);
    check_in_flight(e, "the step of the cancel");
    CHECKF(ends[VICTIM].calls == 1 && ends[VICTIM].rc == SQUAD_E_CANCELLED &&
               ends[VICTIM].err.code == SQUAD_E_CANCELLED && ends[VICTIM].err.msg[0],
           "the victim: %d calls, rc %d", ends[VICTIM].calls, ends[VICTIM].rc);
    CHECK(flag.polls == polls + 1 && in_flight_row(e, &got[VICTIM]) == NULL);
    CHECKF(got[VICTIM].computed == ran && got[VICTIM].computed < rows[VICTIM].row.n_ids,
           "the victim ran %d tokens, computed says %d", ran, got[VICTIM].computed);
    CHECK(got[VICTIM].memo == 0 && got[VICTIM].reused == 0 && got[VICTIM].probs[0][0] == 0.0f);
    CHECK(squad_cache_lookup(e->cache, state, P) == 0); /* its pending checkpoints went with it */

    while (squad_engine_pending(e) > 0) {
        CHECK(squad_engine_step(e, &err) >= 0);
        check_in_flight(e, "after the cancel");
    }
    CHECK(flag.polls == polls + 1); /* never polled again */
    for (int i = 0; i < N; i++) {
        if (i == VICTIM) continue;
        CHECKF(ends[i].calls == 1 && ends[i].rc == 0, "row %d: %d calls, rc %d (%s)", i, ends[i].calls, ends[i].rc,
               ends[i].err.msg);
        const double d = test_answer_diff(&rows[i].row, &got[i], &ref[i]);
        CHECKF(d <= TOL_CPU_EXACT_BATCHED, "row %d beside a cancel: %.3g from alone", i, d);
        CHECK(got[i].route == ref[i].route);
    }
    CHECK(got[TWIN].reused == 0 && got[HIT].reused == 640); /* the twin computed the state itself */
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    CHECKF(st.rows == 3 && st.cold == 2 && st.hits == 1 && st.plain == 1 && st.memo_hits == 0,
           "rows %llu cold %llu hits %llu plain %llu memo %llu", (unsigned long long)st.rows,
           (unsigned long long)st.cold, (unsigned long long)st.hits, (unsigned long long)st.plain,
           (unsigned long long)st.memo_hits);

    /* the same row again: the twin's checkpoint at p, the uncached engine's answer, no memo of it */
    CHECK(squad_engine_score(e, &rows[VICTIM].row, &later, &err) == 0);
    CHECK(squad_engine_score(off, &rows[VICTIM].row, &uncached, &err) == 0);
    CHECK(later.memo == 0 && later.reused == P - P % 64 && later.computed == rows[VICTIM].row.n_ids - later.reused);
    const double d = test_answer_diff(&rows[VICTIM].row, &later, &uncached);
    CHECKF(d <= TOL_CPU_EXACT_CACHED, "the cancelled row asked again: %.3g from uncached", d);
    check_in_flight(e, "after the row asked again");
    squad_engine_free(off);
    squad_engine_free(e);
}

/* ---- specialists ------------------------------------------------------------------------------ */

/* A forward that refuses a batch mixing routes (as a backend without segmented adapters may),
 * before touching any state. */
static int g_refused;
static int refusing_forward(squad_backend *be, const squad_chunk *ck, int n, squad_err *err) {
    for (int i = 1; i < n; i++)
        if (ck[i].route != ck[0].route) {
            g_refused++;
            return squad_fail(err, SQUAD_E_UNSUPPORTED, "a batch of %d routes", 2);
        }
    return g_forward(be, ck, n, err);
}

/* The router's features of a row, from a copy of the model cut at router.layer. */
static void features(const squad_specialists *sp, const squad_row *row, squad_router_feat *f) {
    squad_model cut = *g_m;
    cut.cfg.num_layers = sp->router.layer;
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.threads = 2;
    o.precision = SQUAD_PRECISION_EXACT;
    squad_err err = {0};
    squad_backend *be = squad_cpu_backend_new(&cut, &o, MAX_IDS, &err);
    const int H = g_m->cfg.hidden_size;
    float *h = malloc(sizeof(float) * (size_t)H * (size_t)row->n_ids);
    squad_router_feat_reset(f);
    squad_chunk ck;
    memset(&ck, 0, sizeof ck);
    ck.letters = row->letters;
    ck.n_letters = row->n_letters;
    int rc = be && h ? be->reset(be, 0, &err) : -1;
    for (int s = 0; !rc && s < row->n_ids; s += ck.len) { /* chunk by chunk; hidden rows of each */
        ck.ids = row->ids + s;
        ck.start = s;
        ck.len = row->n_ids - s < be->max_chunk ? row->n_ids - s : be->max_chunk;
        rc = squad_backend_forward1(be, &ck, NULL, &err);
        for (int t = 0; !rc && t < ck.len; t++) rc = squad_cpu_backend_hidden(be, t, h + (size_t)(s + t) * H, &err);
    }
    CHECKF(rc == 0, "features: %s", err.msg);
    if (!rc) squad_router_feat_add(f, h, row->n_ids, (size_t)H, sp->router.eps);
    free(h);
    if (be) be->destroy(be);
}

/* Rows drawn from three token ranges; the router refitted so each range routes to its own label. */
static void check_specialists(void) {
    char *mdir = strdup(test_tmpdir());
    squad_err err = {0};
    squad_spec_synth_opts so;
    squad_spec_synth_defaults(&g_m->cfg, &so);
    so.out_dir = mdir;
    so.seed = 5;
    so.dtype = ST_F32;
    CHECKF(squad_spec_synth_write(&g_m->cfg, &so, &err) == 0, "%s", err.msg);
    squad_specialists *sp = squad_specialists_load(g_m, mdir, &err);
    CHECKF(sp != NULL, "%s", err.msg);
    free(mdir);
    if (!sp) return;
    const int R = sp->router.n_labels, H = sp->router.hidden;
    enum { N = 12 };
    static trow rows[N];
    static int32_t state[3][600], fresh[700];
    g_rng = 4242;
    const int span = g_V / 3;
    for (int k = 0; k < 3; k++) fill_random(state[k], 600, k * span, k * span + span - 1);
    /* the refit: w_k = f_k - mean f, b_k = -w_k . mean f */
    squad_router_feat f[3];
    double mean[4096] = {0};
    CHECK(H <= 4096 && R == 3);
    for (int k = 0; k < 3; k++) {
        trow probe;
        make_row(&probe, state[k], 600, 600, 1, 1);
        CHECK(squad_router_feat_init(&f[k], H, &err) == 0);
        features(sp, &probe.row, &f[k]);
        for (int i = 0; i < H; i++) mean[i] += f[k].sum[i] / (double)f[k].count / 3;
    }
    for (int k = 0; k < 3; k++) {
        double b = 0;
        for (int i = 0; i < H; i++) {
            const double w = f[k].sum[i] / (double)f[k].count - mean[i];
            sp->router.weight[(size_t)k * H + i] = (float)w;
            b -= w * mean[i];
        }
        sp->router.bias[k] = (float)b;
        squad_router_feat_free(&f[k]);
    }
    /* rows: hits and cold rows of the three ranges, some forced to a route, some cached, some not */
    for (int i = 0; i < N; i++) {
        const int k = i % 3;
        if (i % 4 == 3) {
            fill_random(fresh, 500, k * span, k * span + span - 1);
            make_row(&rows[i], fresh, 500, -1, 20, 1); /* plain */
        } else {
            make_row(&rows[i], state[k], 600, 600, rnd_in(10, 60), rnd_in(1, 2));
        }
        /* question tokens of the row's own range, so its route stays the range's */
        for (int j = rows[i].row.n_ids - 1; j >= 600 || (rows[i].row.state_len < 0 && j >= 480); j--)
            rows[i].ids[j] = (int32_t)rnd_in(k * span, k * span + span - 1);
        rows[i].row.specialist = i % 5 == 4 ? 1 + (k + 1) % R : 0; /* forced to another route */
    }
    squad_result ref[N], got[N];
    score_alone(g_m, sp, rows, N, ref);
    int routes_seen[3] = {0, 0, 0};
    for (int i = 0; i < N; i++) routes_seen[ref[i].route] = 1;
    CHECKF(routes_seen[0] && routes_seen[1] && routes_seen[2], "the rows route to only some labels");
    /* mixed 1: one forward for all routes; 0: the scheduler runs one route at a time; -1: the
     * backend says it mixes them but refuses (SQUAD_E_UNSUPPORTED), and the step runs them apart */
    for (int mixed = 1; mixed >= -1; mixed--) {
        squad_engine *e = engine_new(g_m, 8, 0, (size_t)64 << 20, sp);
        if (!e) break;
        e->be->mixed_routes = mixed != 0;
        g_refused = 0;
        if (mixed < 0) {
            g_forward = e->be->forward;
            e->be->forward = refusing_forward;
        }
        squad_row in[N];
        for (int i = 0; i < N; i++) in[i] = rows[i].row;
        int rcs[N];
        squad_err errs[N];
        CHECKF(squad_engine_score_batch(e, in, N, NULL, got, rcs, errs, &err) == 0, "specialists: %s", err.msg);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            CHECKF(got[i].route == ref[i].route, "mixed %d row %d: route %d, alone %d", mixed, i, got[i].route,
                   ref[i].route);
            const double d = test_answer_diff(&rows[i].row, &got[i], &ref[i]);
            CHECKF(d <= TOL_CPU_EXACT_BATCHED, "mixed %d row %d: %.3g from alone", mixed, i, d);
            if (d > worst) worst = d;
            for (int r = 0; r < R; r++) CHECK_NEAR(got[i].route_probs[r], ref[i].route_probs[r], TOL_CPU_EXACT_BATCHED);
        }
        squad_cache_stats st;
        squad_engine_cache_stats(e, &st);
        printf("specialists (%s): %d rows, %llu mispredictions, worst %.3g\n",
               mixed > 0 ? "mixed routes" : mixed == 0 ? "one route at a time" : "mixed batches refused", N,
               (unsigned long long)st.mispredictions, worst);
        CHECK(st.mispredictions > 0); /* the first rows guess the trunk; two ranges route elsewhere */
        if (mixed < 0) {
            CHECK(g_refused > 0);
            e->be->forward = g_forward;
        }
        char why[256] = "";
        CHECKF(squad_cache_check(e->cache, why, sizeof why) == 0, "%s", why);
        squad_engine_free(e);
    }
    squad_specialists_free(sp);
}

/* ---- options --------------------------------------------------------------------------------- */

static void check_options(void) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = SQUAD_DEVICE_CPU;
    o.threads = 1;
    squad_err err = {0};
    o.max_rows = -1;
    CHECK(squad_engine_new(g_m, &o, &err) == NULL && err.code == SQUAD_E_INVALID && strstr(err.msg, "max_rows"));
    o.max_rows = 0;
    o.batch_tokens = -5;
    CHECK(squad_engine_new(g_m, &o, &err) == NULL && err.code == SQUAD_E_INVALID && strstr(err.msg, "batch_tokens"));
    o.batch_tokens = 1 << 30; /* more than the backend's: what it has */
    squad_engine *e = squad_engine_new(g_m, &o, &err);
    CHECK(e && e->sched.batch_tokens == e->be->max_batch_tokens && e->sched.max_rows == e->be->max_seqs);
    squad_engine_free(e);
}

int main(void) {
    g_m = test_synth_model("tiny", 11);
    if (!g_m) return test_summary("test_batch");
    g_V = squad_model_vocab_size(g_m);
    check_options();
    const int sanitized = getenv("SQUAD_SANITIZED") != NULL;
    const int n = sanitized ? 24 : 64;
    check_mix(8, 0, (size_t)64 << 20, n, 1, "8 rows, the backend's budget");
    check_mix(4, 200, (size_t)64 << 20, n, 2, "4 rows, 200 tokens a step");
    check_mix(8, 96, (size_t)64 << 20, n, 3, "8 rows, 96 tokens a step");
    check_mix(3, 0, pressure_budget(), n, 4, "3 rows, eviction pressure");
    check_shared_restore();
    check_long_row_cut();
    check_cut_row_keeps_pace();
    check_starved_in_order();
    check_shared_prefix_once();
    check_failures();
    check_cancel_mid_flight();
    check_specialists();
    squad_model_free(g_m);
    return test_summary("test_batch");
}
