/*
 * test_long.c — long rows on the CPU backend with the tiny presets (docs/design.md section 8,
 * "The longest row and memory that follows use"):
 *  - the max_tokens engine option: 0 takes the model's max_position_embeddings, a smaller value
 *    bounds the engine, negative or past the model's positions is refused; the reason is reported;
 *  - a row exactly at the limit is answered, one token past it gets a clear error and the engine
 *    stays usable;
 *  - the working K / V grows in steps as rows get longer (rows across several span buckets) and
 *    keeps its size after; every answer of one engine, going from short rows to long ones and
 *    back, equals a fresh engine's answer on the same row;
 *  - cached = uncached for long states (a hit, and a state too large for the cache's budget,
 *    answered uncached and counted as uncacheable);
 *  - the memory bound: a model claiming 2^31 - 1 positions, whose K / V at that length no host
 *    holds, gets the CPU backend's memory bound and the reason SQUAD_LIMIT_MEMORY.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "squad.h"
#include "synth.h"
#include "long_rows.h"
#include "testutil.h"
#include "tolerances.h"

/* Rows that cross the K / V's growth steps and CUDA's span buckets (1024, 2048, 4096, 8192). */
static const int GROWTH_LENGTHS[] = {200, 1500, 3000, 5000, 9000, 700, 2500};
#define N_GROWTH ((int)(sizeof GROWTH_LENGTHS / sizeof GROWTH_LENGTHS[0]))

static squad_engine *cpu_engine(squad_model *m, size_t budget, int max_tokens, squad_err *err) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = SQUAD_DEVICE_CPU;
    o.threads = 2;
    o.precision = SQUAD_PRECISION_EXACT;
    o.cache.budget_bytes = budget;
    o.max_tokens = max_tokens;
    return squad_engine_new(m, &o, err);
}


static void test_options(squad_model *m) {
    squad_err err = {0};
    const int model_max = squad_model_max_tokens(m);
    CHECK(model_max == 262144); /* the tiny presets' max_position_embeddings, uncapped */
    squad_limit why = SQUAD_LIMIT_MEMORY;
    squad_engine *e = cpu_engine(m, 0, 0, &err);
    CHECKF(e != NULL, "%s", err.msg);
    if (e) {
        CHECK(squad_engine_max_tokens(e, &why) == model_max && why == SQUAD_LIMIT_MODEL);
        CHECK(e->be->kv_positions == 0); /* nothing allocated for K / V before a row needs it */
        squad_engine_free(e);
    }
    e = cpu_engine(m, 0, 3000, &err);
    CHECKF(e != NULL, "%s", err.msg);
    if (e) {
        CHECK(squad_engine_max_tokens(e, &why) == 3000 && why == SQUAD_LIMIT_OPTION);
        CHECK(squad_engine_max_tokens(e, NULL) == 3000);
        squad_engine_free(e);
    }
    e = cpu_engine(m, 0, model_max, &err); /* the model's own count is the model's bound */
    CHECKF(e != NULL, "%s", err.msg);
    if (e) {
        CHECK(squad_engine_max_tokens(e, &why) == model_max && why == SQUAD_LIMIT_MODEL);
        squad_engine_free(e);
    }
    memset(&err, 0, sizeof err);
    e = cpu_engine(m, 0, -1, &err);
    CHECK(e == NULL && err.code == SQUAD_E_INVALID && strstr(err.msg, "max_tokens -1"));
    memset(&err, 0, sizeof err);
    e = cpu_engine(m, 0, model_max + 1, &err);
    CHECKF(e == NULL && err.code == SQUAD_E_INVALID && strstr(err.msg, "max_position_embeddings"), "%s", err.msg);
}

/* A row exactly at the engine's limit runs; one token more is refused, on every path. */
static void test_limit(squad_model *m, size_t budget) {
    const int limit = 2100; /* past one growth step of the K / V and one span bucket */
    squad_err err = {0};
    squad_engine *e = cpu_engine(m, budget, limit, &err);
    CHECKF(e != NULL, "%s", err.msg);
    if (!e) return;
    squad_result *r = malloc(sizeof *r);
    test_row at, past;
    if (!r || row_make(&at, limit, squad_model_vocab_size(m), 3, 1024) ||
        row_make(&past, limit + 1, squad_model_vocab_size(m), 3, 1024)) {
        CHECK(0);
        free(r);
        squad_engine_free(e);
        return;
    }
    CHECK(squad_engine_row_check(e, &at.row, &err) == 0);
    int rc = squad_engine_score(e, &at.row, r, &err);
    CHECKF(rc == 0 && r->computed + r->reused == limit, "%s", err.msg);
    memset(&err, 0, sizeof err);
    rc = squad_engine_score(e, &past.row, r, &err);
    CHECKF(rc == SQUAD_E_INVALID && strstr(err.msg, "2101 tokens") && strstr(err.msg, "2100") &&
               strstr(err.msg, "max_tokens"),
           "rc %d: %s", rc, err.msg);
    CHECK(squad_engine_row_check(e, &past.row, &err) == SQUAD_E_INVALID);
    CHECK(squad_row_check(m, &past.row, &err) == 0); /* the model itself takes it */
    rc = squad_engine_score(e, &at.row, r, &err); /* still usable */
    CHECKF(rc == 0, "%s", err.msg);
    free(at.ids);
    free(past.ids);
    free(r);
    squad_engine_free(e);
}

/* One engine through short, long and short rows again: each answer equals a fresh engine's. The
 * K / V grows at the steps and keeps its size. */
static void test_growth(squad_model *m) {
    squad_err err = {0};
    squad_engine *e = cpu_engine(m, 0, 0, &err);
    CHECKF(e != NULL, "%s", err.msg);
    squad_result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    if (!e || !a || !b) {
        CHECK(0);
        squad_engine_free(e);
        free(a), free(b);
        return;
    }
    int longest = 0, last_positions = 0;
    for (int k = 0; k < N_GROWTH; k++) {
        const int n = GROWTH_LENGTHS[k];
        test_row t;
        if (row_make(&t, n, squad_model_vocab_size(m), 100 + (unsigned)k, -1)) {
            CHECK(0);
            break;
        }
        int rc = squad_engine_score(e, &t.row, a, &err);
        CHECKF(rc == 0, "row of %d: %s", n, err.msg);
        if (n > longest) longest = n;
        const int held = e->be->kv_positions;
        CHECKF(held >= longest && held >= last_positions && held < 2 * longest + 1024,
               "after a row of %d (longest %d): K / V holds %d positions", n, longest, held);
        last_positions = held;
        squad_engine *fresh = cpu_engine(m, 0, 0, &err);
        CHECKF(fresh != NULL, "%s", err.msg);
        if (fresh) {
            rc = squad_engine_score(fresh, &t.row, b, &err);
            CHECKF(rc == 0, "%s", err.msg);
            CHECKF(worst_diff(a, b, &t.row) == 0.0, "row of %d: grown engine differs from a fresh one by %g", n,
                   worst_diff(a, b, &t.row));
            CHECK(fresh->be->kv_positions < held || n == longest);
            squad_engine_free(fresh);
        }
        free(t.ids);
    }
    free(a), free(b);
    squad_engine_free(e);
}

/* A long state through the cache: the first row fills it, a second question on the same state
 * restores it (a hit); both equal the uncached answers. With a budget too small for the state's
 * K / V, the row is answered uncached and counted. */
static void test_cached(squad_model *m) {
    const int state = 6000, question = 40;
    squad_err err = {0};
    squad_engine *plain = cpu_engine(m, 0, 0, &err);
    squad_engine *cached = cpu_engine(m, (size_t)256 << 20, 0, &err);
    /* a budget below one chunk's K / V (512 positions x 512 bytes): no checkpoint of the state fits */
    squad_engine *tight = cpu_engine(m, (size_t)128 << 10, 0, &err);
    squad_result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    CHECK(plain && cached && tight && a && b);
    for (int q = 0; plain && cached && tight && a && b && q < 2; q++) {
        test_row t;
        if (row_make(&t, state + question, squad_model_vocab_size(m), 77, state)) break;
        /* the same state, another question */
        uint64_t s = 1000 + (uint64_t)q;
        for (int i = state; i < state + question; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            t.ids[i] = (int32_t)((s >> 33) % (uint64_t)squad_model_vocab_size(m));
        }
        CHECK(squad_engine_score(plain, &t.row, a, &err) == 0);
        CHECK(squad_engine_score(cached, &t.row, b, &err) == 0);
        CHECKF(worst_diff(a, b, &t.row) <= TOL_CPU_EXACT_CACHED, "question %d: cached differs by %g", q,
               worst_diff(a, b, &t.row));
        if (q == 1) CHECKF(b->reused >= state - 64 && b->computed <= question + 64, "reused %d computed %d",
                           b->reused, b->computed);
        CHECK(squad_engine_score(tight, &t.row, b, &err) == 0);
        CHECKF(worst_diff(a, b, &t.row) <= TOL_CPU_EXACT_CACHED, "question %d: tight budget differs by %g", q,
               worst_diff(a, b, &t.row));
        CHECK(b->reused == 0);
        free(t.ids);
    }
    if (tight) {
        squad_cache_stats st;
        squad_engine_cache_stats(tight, &st);
        CHECKF(st.uncacheable == 2 && st.checkpoints == 0 && st.bytes_held <= st.budget_bytes,
               "uncacheable %llu checkpoints %llu", (unsigned long long)st.uncacheable,
               (unsigned long long)st.checkpoints);
    }
    if (cached) {
        squad_cache_stats st;
        squad_engine_cache_stats(cached, &st);
        CHECK(st.hits == 1 && st.uncacheable == 0);
    }
    free(a), free(b);
    squad_engine_free(plain);
    squad_engine_free(cached);
    squad_engine_free(tight);
}

/* The tiny preset rewritten to claim INT32_MAX positions: the K / V of that many (512 bytes a
 * position) is a terabyte, past half of any host's memory, so the engine's limit is the memory's. */
static void test_memory_bound(void) {
    char dir[600], cfg[700];
    snprintf(dir, sizeof dir, "%s/tiny-huge", test_tmpdir());
    squad_synth_opts so;
    memset(&so, 0, sizeof so);
    so.preset = "tiny";
    so.out_dir = dir;
    so.seed = 11;
    squad_err err = {0};
    if (squad_synth_write(&so, &err)) {
        CHECKF(0, "synth: %s", err.msg);
        return;
    }
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(cfg, 0, &je);
    json_t *tc = root ? json_object_get(root, "text_config") : NULL;
    json_t *where = tc ? tc : root;
    CHECK(where && json_object_get(where, "max_position_embeddings"));
    if (!where) return;
    json_object_set_new(where, "max_position_embeddings", json_integer(INT32_MAX));
    CHECK(json_dump_file(root, cfg, JSON_INDENT(2)) == 0);
    json_decref(root);
    squad_model *m = squad_model_load(dir, &err);
    CHECKF(m != NULL, "%s", err.msg);
    if (!m) return;
    CHECK(squad_model_max_tokens(m) == INT32_MAX);
    squad_engine *e = cpu_engine(m, 0, 0, &err);
    CHECKF(e != NULL, "%s", err.msg);
    if (e) {
        squad_limit why;
        const int n = squad_engine_max_tokens(e, &why);
        const size_t share = (size_t)sysconf(_SC_PHYS_PAGES) / 2 * (size_t)sysconf(_SC_PAGESIZE);
        printf("memory bound: %d positions (K / V %zu bytes a position, host share %zu MB)\n", n,
               e->be->kv_bytes_per_pos, share >> 20);
        CHECK(why == SQUAD_LIMIT_MEMORY && n < INT32_MAX && n > 0);
        CHECK((size_t)n == share / e->be->kv_bytes_per_pos);
        CHECK(e->be->kv_positions == 0); /* bounded, not allocated */
        test_row t; /* rows within the bound still run */
        squad_result *r = malloc(sizeof *r);
        if (r && row_make(&t, 300, squad_model_vocab_size(m), 9, -1) == 0) {
            CHECKF(squad_engine_score(e, &t.row, r, &err) == 0, "%s", err.msg);
            free(t.ids);
        }
        free(r);
        squad_engine_free(e);
    }
    squad_model_free(m);
}

int main(void) {
    squad_model *m = test_synth_model("tiny", 11);
    if (m) {
        test_options(m);
        test_limit(m, 0);
        test_limit(m, (size_t)64 << 20);
        test_growth(m);
        test_cached(m);
        squad_model_free(m);
    }
    test_memory_bound();
    squad_model *mha = test_synth_model("tiny-mha", 12); /* two attention layers, MHA, untied */
    if (mha) {
        test_limit(mha, (size_t)64 << 20);
        test_growth(mha);
        squad_model_free(mha);
    }
    return test_summary("test_long");
}
