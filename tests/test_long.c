/*
 * test_long.c — long rows on every backend, with the tiny presets (docs/design.md section 8, "The
 * longest row and memory that follows use"). One program, parametrised by backend: `--backend
 * cpu|cuda|all` (default cpu) picks the backends the cases run on; the reference is the CPU's
 * exact path. CTest runs it as test_long (--backend cpu) and as
 * gpu_test_long (--backend cuda, label gpu), which exits 77 (skipped) without CUDA or a GPU.
 *
 * The cases, on each backend:
 *  - options: the max_tokens engine option: 0 takes the model's max_position_embeddings, a smaller
 *    value bounds the engine, negative or past the model's positions is refused; the reason is
 *    reported; nothing is allocated for K / V before a row needs it;
 *  - limit: a row exactly at the limit is answered, one token past it gets a clear error (the
 *    engine's row check refuses it, the model's takes it) and the engine stays usable;
 *  - growth: one engine through rows of growing then shrinking length (across the K / V's growth
 *    steps and CUDA's span buckets): the K / V grows in steps and keeps its size; every answer
 *    equals a fresh engine's on the same row (exactly on the CPU; on CUDA within the bound a GEMM
 *    algorithm tuned anew may move), and on the exact path is within the backend's tolerance of
 *    the reference;
 *  - cached: cached = uncached for a long state (a hit on the second question), and a state too
 *    large for the cache's budget answered uncached and counted as uncacheable;
 *  - memory bound: a model claiming 2^31 - 1 positions, whose K / V at that length no machine
 *    holds, gets the backend's memory bound (the CPU: half the host's memory; CUDA: the device's
 *    free memory, with its span buckets) and the reason SQUAD_LIMIT_MEMORY, and still runs rows.
 * CUDA only (no CPU meaning): growth while captured graphs exist: an engine that captured every
 * graph at start, with the first K / V capacity, runs rows past that capacity; the graphs find the
 * K / V through the chunk parameters and are replayed after the buffer moved, none is recaptured,
 * and the answers still match the reference.
 *
 * What each backend runs (presets, row lengths, the limit) is its plan below: the CPU's sizes keep
 * its run short; CUDA's reach further (more span buckets, both precisions).
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "engine.h"
#include "long_rows.h"
#include "squad.h"
#include "synth.h"
#include "testutil.h"
#include "tolerances.h"

#ifdef SQUAD_HAVE_CUDA
#include "cuda/backend_cuda.h"
#endif

/* A CUDA sequence slot's first K / V capacity (backend_cuda.cu KV_SLOT_MIN_POSITIONS); a slot holds
 * none before its first row. */
#define CUDA_KV_FIRST 256

/* CPU rows cross the K / V's growth steps and CUDA's span buckets (1024, 2048, 4096, 8192). */
static const int CPU_LENGTHS[] = {200, 1500, 3000, 5000, 9000, 700, 2500};
/* CUDA rows cross a slot's K / V growth steps (256 doubling up to 16384) and span buckets (1024 ...
 * 16384). */
static const int CUDA_LENGTHS[] = {200, 1500, 4500, 9000, 700, 13000, 2500};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct preset_plan {
    const char *preset;
    unsigned seed;
    int limit_budgets; /* test_limit's runs: bit 0 without a cache, bit 1 with 64 MB */
    int cached;        /* run test_cached on it */
    int options;       /* run test_options on it */
} preset_plan;

typedef struct backend {
    const char *name;
    squad_device device;
    int threads;
    int n_precisions;
    squad_precision precisions[2];
    preset_plan presets[2];
    const int *lengths;
    int n_lengths;
    unsigned growth_seed;
    int kv_slack;        /* the K / V after rows up to `longest` holds < 2 * longest + kv_slack */
    double fresh_tol[2]; /* grown engine against a fresh one, by precision index */
    int limit, limit_state;
    unsigned limit_seed;
    squad_precision limit_precision;
    int cached_state;
    size_t tight_budget; /* below one checkpoint of the state */
    double cached_tol[2];
    unsigned huge_seed;
} backend;

static const backend BACKENDS[] = {
    {"cpu", SQUAD_DEVICE_CPU, 2, 1, {SQUAD_PRECISION_EXACT, SQUAD_PRECISION_EXACT},
     {{"tiny", 11, 3, 1, 1}, {"tiny-mha", 12, 2, 0, 0}}, /* tiny-mha: two attention layers, MHA, untied */
     CPU_LENGTHS, COUNT(CPU_LENGTHS), 100, 1024, {0.0, 0.0},
     2100, 1024, 3, SQUAD_PRECISION_EXACT, /* past one growth step of the K / V and one span bucket */
     6000, (size_t)128 << 10, /* below one chunk's K / V (512 positions x 512 bytes) */
     {TOL_CPU_EXACT_CACHED, TOL_CPU_EXACT_CACHED}, 11},
    {"cuda", SQUAD_DEVICE_CUDA, 0 /* the reference on every core of the GPU machine */, 2,
     {SQUAD_PRECISION_EXACT, SQUAD_PRECISION_BF16},
     {{"tiny", 21, 2, 1, 1}, {"tiny-hd256", 22, 0, 0, 0}},
     CUDA_LENGTHS, COUNT(CUDA_LENGTHS), 200, CUDA_KV_FIRST, {TOL_CUDA_EXACT_CPU, TOL_CUDA_BF16_CACHED},
     5000, 4096, 5, SQUAD_PRECISION_BF16,
     10000, (size_t)64 << 10,
     {TOL_CUDA_EXACT_CACHED, TOL_CUDA_BF16_CACHED_WIDE}, 31},
};
#define N_BACKENDS COUNT(BACKENDS)

static const char *precision_name(squad_precision p) { return p == SQUAD_PRECISION_BF16 ? "bf16" : "exact"; }

static squad_engine *engine_on(squad_model *m, squad_device dev, int threads, squad_precision prec, size_t budget,
                               int max_tokens, int precapture, squad_err *err) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = dev;
    o.threads = threads;
    o.precision = prec;
    o.cache.budget_bytes = budget;
    o.max_tokens = max_tokens;
    o.precapture = precapture;
    return squad_engine_new(m, &o, err);
}

static squad_engine *engine(squad_model *m, const backend *be, squad_precision prec, size_t budget, int max_tokens,
                            squad_err *err) {
    return engine_on(m, be->device, be->threads, prec, budget, max_tokens, 0, err);
}

/* The reference: the CPU's exact path. */
static squad_engine *reference(squad_model *m, const backend *be, squad_err *err) {
    return engine_on(m, SQUAD_DEVICE_CPU, be->threads, SQUAD_PRECISION_EXACT, 0, 0, 0, err);
}

static void test_options(squad_model *m, const backend *be) {
    squad_err err = {0};
    const squad_precision prec = be->precisions[0];
    const int model_max = squad_model_max_tokens(m);
    CHECK(model_max == 262144); /* the tiny presets' max_position_embeddings, uncapped */
    squad_limit why = SQUAD_LIMIT_MEMORY;
    squad_engine *e = engine(m, be, prec, 0, 0, &err);
    CHECKF(e != NULL, "%s: %s", be->name, err.msg);
    if (e) {
        CHECK(squad_engine_max_tokens(e, &why) == model_max && why == SQUAD_LIMIT_MODEL);
        CHECK(e->be->kv_positions == 0); /* nothing allocated for K / V before a row needs it */
        squad_engine_free(e);
    }
    e = engine(m, be, prec, 0, 3000, &err);
    CHECKF(e != NULL, "%s: %s", be->name, err.msg);
    if (e) {
        CHECK(squad_engine_max_tokens(e, &why) == 3000 && why == SQUAD_LIMIT_OPTION);
        CHECK(squad_engine_max_tokens(e, NULL) == 3000);
        squad_engine_free(e);
    }
    e = engine(m, be, prec, 0, model_max, &err); /* the model's own count is the model's bound */
    CHECKF(e != NULL, "%s: %s", be->name, err.msg);
    if (e) {
        CHECK(squad_engine_max_tokens(e, &why) == model_max && why == SQUAD_LIMIT_MODEL);
        squad_engine_free(e);
    }
    memset(&err, 0, sizeof err);
    e = engine(m, be, prec, 0, -1, &err);
    CHECK(e == NULL && err.code == SQUAD_E_INVALID && strstr(err.msg, "max_tokens -1"));
    memset(&err, 0, sizeof err);
    e = engine(m, be, prec, 0, model_max + 1, &err);
    CHECKF(e == NULL && err.code == SQUAD_E_INVALID && strstr(err.msg, "max_position_embeddings"), "%s", err.msg);
}

/* A row exactly at the engine's limit runs; one token more is refused, on every path. */
static void test_limit(squad_model *m, const backend *be, size_t budget) {
    const int limit = be->limit;
    squad_err err = {0};
    squad_engine *e = engine(m, be, be->limit_precision, budget, limit, &err);
    CHECKF(e != NULL, "%s: %s", be->name, err.msg);
    if (!e) return;
    squad_result *r = malloc(sizeof *r);
    test_row at, past;
    at.ids = past.ids = NULL;
    if (!r || row_make(&at, limit, squad_model_vocab_size(m), be->limit_seed, be->limit_state) ||
        row_make(&past, limit + 1, squad_model_vocab_size(m), be->limit_seed, be->limit_state)) {
        CHECK(0);
        goto out;
    }
    squad_limit why;
    CHECK(squad_engine_max_tokens(e, &why) == limit && why == SQUAD_LIMIT_OPTION);
    CHECK(squad_engine_row_check(e, &at.row, &err) == 0);
    int rc = squad_engine_score(e, &at.row, r, &err);
    CHECKF(rc == 0 && r->computed + r->reused == limit, "%s: %s", be->name, err.msg);
    if (be->device == SQUAD_DEVICE_CUDA) CHECK(e->be->kv_positions == limit); /* 256 doubling, capped at the limit */
    memset(&err, 0, sizeof err);
    rc = squad_engine_score(e, &past.row, r, &err);
    char past_tokens[64], limit_text[32];
    snprintf(past_tokens, sizeof past_tokens, "%d tokens", limit + 1);
    snprintf(limit_text, sizeof limit_text, "%d", limit);
    CHECKF(rc == SQUAD_E_INVALID && strstr(err.msg, past_tokens) && strstr(err.msg, limit_text) &&
               strstr(err.msg, "max_tokens"),
           "%s rc %d: %s", be->name, rc, err.msg);
    CHECK(squad_engine_row_check(e, &past.row, &err) == SQUAD_E_INVALID);
    CHECK(squad_row_check(m, &past.row, &err) == 0); /* the model itself takes it */
    rc = squad_engine_score(e, &at.row, r, &err);    /* still usable */
    CHECKF(rc == 0, "%s: %s", be->name, err.msg);
    if (budget) CHECKF(r->reused > 0, "%s: reused %d", be->name, r->reused); /* the memo or the cache answers */
out:
    free(at.ids);
    free(past.ids);
    free(r);
    squad_engine_free(e);
}

/* One engine through short, long and short rows again: each answer equals a fresh engine's and, on
 * the exact path, the reference's. The K / V grows at the steps and keeps its size. */
static void test_growth(squad_model *m, const char *preset, const backend *be, int p) {
    const squad_precision prec = be->precisions[p];
    const int against_reference = be->device != SQUAD_DEVICE_CPU && prec == SQUAD_PRECISION_EXACT;
    squad_err err = {0};
    squad_engine *e = engine(m, be, prec, 0, 0, &err);
    CHECKF(e != NULL, "%s: %s", be->name, err.msg);
    squad_engine *ref = against_reference ? reference(m, be, &err) : NULL;
    squad_result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    if (!e || (against_reference && !ref) || !a || !b) {
        CHECK(0);
        goto out;
    }
    CHECK(e->be->kv_positions == 0);
    int longest = 0, last_positions = 0;
    for (int k = 0; k < be->n_lengths; k++) {
        const int n = be->lengths[k];
        test_row t;
        if (row_make(&t, n, squad_model_vocab_size(m), be->growth_seed + (unsigned)k, -1)) {
            CHECK(0);
            break;
        }
        int rc = squad_engine_score(e, &t.row, a, &err);
        CHECKF(rc == 0, "%s %s %s row of %d: %s", be->name, preset, precision_name(prec), n, err.msg);
        if (n > longest) longest = n;
        const int held = e->be->kv_positions;
        CHECKF(held >= longest && held >= last_positions && held < 2 * longest + be->kv_slack,
               "%s %s after a row of %d (longest %d): K / V holds %d positions", be->name, preset, n, longest, held);
        last_positions = held;
        if (ref) {
            rc = squad_engine_score(ref, &t.row, b, &err);
            CHECKF(rc == 0, "%s", err.msg);
            const double d = worst_diff(a, b, &t.row);
            printf("%s %s %s row of %5d: K / V %5d positions, max |%s - cpu| %.2e\n", be->name, preset,
                   precision_name(prec), n, held, be->name, d);
            CHECKF(d <= TOL_CUDA_EXACT_CPU, "%s %s row %d: against the reference %.3e", be->name, preset, n, d);
        }
        squad_engine *fresh = engine(m, be, prec, 0, 0, &err);
        CHECKF(fresh != NULL, "%s", err.msg);
        if (fresh) {
            rc = squad_engine_score(fresh, &t.row, b, &err);
            CHECKF(rc == 0, "%s", err.msg);
            /* a growth copies the K / V and changes nothing else; on CUDA only a GEMM algorithm
             * chosen anew by the fresh backend's tuning (without a shared plan file) could move
             * the last bits */
            const double d = worst_diff(a, b, &t.row);
            printf("%s %s %s row of %5d: max |grown - fresh| %.2e\n", be->name, preset, precision_name(prec), n, d);
            CHECKF(d <= be->fresh_tol[p], "%s %s %s row of %d: grown engine differs from a fresh one by %g",
                   be->name, preset, precision_name(prec), n, d);
            CHECK(fresh->be->kv_positions < held || n == longest);
            squad_engine_free(fresh);
        }
        free(t.ids);
    }
out:
    free(a), free(b);
    squad_engine_free(e);
    squad_engine_free(ref);
}

/* A long state through the cache: the first row fills it, a second question on the same state
 * restores it (a hit); both equal the uncached answers. With a budget too small for the state's
 * K / V, the row is answered uncached and counted. */
static void test_cached(squad_model *m, const backend *be, int p) {
    const squad_precision prec = be->precisions[p];
    const double tol = be->cached_tol[p];
    const int state = be->cached_state, question = 40;
    squad_err err = {0};
    squad_engine *plain = engine(m, be, prec, 0, 0, &err);
    squad_engine *cached = engine(m, be, prec, (size_t)256 << 20, 0, &err);
    squad_engine *tight = engine(m, be, prec, be->tight_budget, 0, &err);
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
        const double d = worst_diff(a, b, &t.row);
        printf("%s long state %d, %s, question %d: reused %d, max |cached - uncached| %.2e\n", be->name, state,
               precision_name(prec), q, b->reused, d);
        CHECKF(d <= tol, "%s question %d: cached differs by %g", be->name, q, d);
        if (q == 1)
            CHECKF(b->reused >= state - 64 && b->computed <= question + 64, "reused %d computed %d", b->reused,
                   b->computed);
        CHECK(squad_engine_score(tight, &t.row, b, &err) == 0);
        CHECKF(worst_diff(a, b, &t.row) <= tol, "%s question %d: tight budget differs by %g", be->name, q,
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

/* The tiny preset rewritten to claim INT32_MAX positions: the K / V of that many (hundreds of bytes
 * a position) is a terabyte or so, past what any host or device holds. NULL (a failed check) when
 * it cannot be written or loaded. */
static squad_model *huge_model(unsigned seed) {
    char dir[600], cfg[700];
    snprintf(dir, sizeof dir, "%s/tiny-huge", test_tmpdir());
    squad_synth_opts so;
    memset(&so, 0, sizeof so);
    so.preset = "tiny";
    so.out_dir = dir;
    so.seed = seed;
    squad_err err = {0};
    if (squad_synth_write(&so, &err)) {
        CHECKF(0, "synth: %s", err.msg);
        return NULL;
    }
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(cfg, 0, &je);
    json_t *tc = root ? json_object_get(root, "text_config") : NULL;
    json_t *where = tc ? tc : root;
    CHECK(where && json_object_get(where, "max_position_embeddings"));
    if (!where) return NULL;
    json_object_set_new(where, "max_position_embeddings", json_integer(INT32_MAX));
    CHECK(json_dump_file(root, cfg, JSON_INDENT(2)) == 0);
    json_decref(root);
    squad_model *m = squad_model_load(dir, &err);
    CHECKF(m != NULL, "%s", err.msg);
    if (m) CHECK(squad_model_max_tokens(m) == INT32_MAX);
    return m;
}

/* The backend's own part of the memory bound: the CPU's is half the host's memory. */
static void check_memory_bound_cpu(squad_engine *e, int n) {
    const size_t share = (size_t)sysconf(_SC_PHYS_PAGES) / 2 * (size_t)sysconf(_SC_PAGESIZE);
    printf("cpu memory bound: %d positions (K / V %zu bytes a position, host share %zu MB)\n", n,
           e->be->kv_bytes_per_pos, share >> 20);
    CHECK((size_t)n == share / e->be->kv_bytes_per_pos);
}

#ifdef SQUAD_HAVE_CUDA
/* CUDA's: what the device's free memory holds, the last span bucket ending there. */
static void check_memory_bound_cuda(squad_engine *e, int n) {
    squad_cuda_info info;
    CHECK(squad_cuda_backend_info(e->be, &info) == 0);
    printf("cuda memory bound: %d positions (%zu bytes a position), K / V %d positions now, %d span buckets\n", n,
           e->be->kv_bytes_per_pos, e->be->kv_positions, info.n_spans);
    CHECK(n > CUDA_KV_FIRST);
    CHECK(info.max_context == n && info.spans[info.n_spans - 1] == n);
}
#endif

static void test_memory_bound(const backend *be) {
    squad_model *m = huge_model(be->huge_seed);
    if (!m) return;
    squad_err err = {0};
    const squad_precision prec = be->precisions[be->n_precisions - 1];
    squad_engine *e = engine(m, be, prec, 0, 0, &err);
    CHECKF(e != NULL, "%s: %s", be->name, err.msg);
    if (e) {
        squad_limit why;
        const int n = squad_engine_max_tokens(e, &why);
        CHECK(why == SQUAD_LIMIT_MEMORY && n < INT32_MAX && n > 0);
        CHECK(e->be->kv_positions == 0); /* bounded, not allocated */
        if (be->device == SQUAD_DEVICE_CPU) check_memory_bound_cpu(e, n);
#ifdef SQUAD_HAVE_CUDA
        else check_memory_bound_cuda(e, n);
#endif
        /* rows within the bound still run: on CUDA past a few growth steps */
        const int len = be->device == SQUAD_DEVICE_CPU ? 300 : 5000;
        test_row t;
        squad_result *r = malloc(sizeof *r);
        if (r && row_make(&t, len, squad_model_vocab_size(m), 9, -1) == 0) {
            CHECKF(squad_engine_score(e, &t.row, r, &err) == 0, "%s", err.msg);
            if (be->device == SQUAD_DEVICE_CUDA)
                CHECK(e->be->kv_positions == 32 * CUDA_KV_FIRST); /* 256 doubled to 8192 for 5000 positions */
            free(t.ids);
        }
        free(r);
        squad_engine_free(e);
    }
    squad_model_free(m);
}

#ifdef SQUAD_HAVE_CUDA
static int graphs_of(const squad_engine *e) {
    squad_cuda_info info;
    return squad_cuda_backend_info(e->be, &info) == 0 ? info.graphs : -1;
}

/* CUDA only. Every graph captured at start, with the first K / V capacity; rows then grow the K / V
 * (the buffer moves) and replay those graphs. None is recaptured, and the answers match the CPU. */
static void test_growth_with_graphs(squad_model *m, const char *preset, const backend *be) {
    const int limit = 12000;
    squad_err err = {0};
    squad_engine *gpu = engine_on(m, be->device, be->threads, SQUAD_PRECISION_EXACT, 0, limit, 1, &err);
    CHECKF(gpu != NULL, "%s", err.msg);
    squad_engine *cpu = reference(m, be, &err);
    CHECKF(cpu != NULL, "%s", err.msg);
    squad_result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    if (!gpu || !cpu || !a || !b) goto out;
    const int graphs0 = graphs_of(gpu);
    CHECKF(graphs0 > 0 && gpu->be->kv_positions == 0, "%d graphs, K / V %d", graphs0, gpu->be->kv_positions);
    const int lens[] = {3000, 6000, limit, 500};
    for (int k = 0; k < COUNT(lens); k++) {
        test_row t;
        if (row_make(&t, lens[k], squad_model_vocab_size(m), 300 + (unsigned)k, -1)) break;
        int rc = squad_engine_score(gpu, &t.row, a, &err);
        CHECKF(rc == 0, "%s", err.msg);
        rc = squad_engine_score(cpu, &t.row, b, &err);
        CHECKF(rc == 0, "%s", err.msg);
        const double d = worst_diff(a, b, &t.row);
        printf("%s precaptured, row of %5d: K / V %5d positions, graphs %d (at start %d), max |cuda - cpu| %.2e\n",
               preset, lens[k], gpu->be->kv_positions, graphs_of(gpu), graphs0, d);
        CHECKF(d <= TOL_CUDA_EXACT_CPU, "%s precaptured row %d: %.3e", preset, lens[k], d);
        CHECK(graphs_of(gpu) == graphs0);
        free(t.ids);
    }
    CHECK(gpu->be->kv_positions == limit); /* 256 doubling, capped at the limit */
out:
    free(a), free(b);
    squad_engine_free(gpu);
    squad_engine_free(cpu);
}
#endif

/* 1 when the backend can run here (CUDA: a CUDA build and a usable device). */
static void run_backend(const backend *be) {
    for (int i = 0; i < COUNT(be->presets); i++) {
        const preset_plan *pp = &be->presets[i];
        squad_model *m = test_synth_model(pp->preset, pp->seed);
        if (!m) continue;
        if (pp->options) test_options(m, be);
        if (pp->limit_budgets & 1) test_limit(m, be, 0);
        if (pp->limit_budgets & 2) test_limit(m, be, (size_t)64 << 20);
        for (int p = 0; p < be->n_precisions; p++) test_growth(m, pp->preset, be, p);
#ifdef SQUAD_HAVE_CUDA
        if (be->device == SQUAD_DEVICE_CUDA) test_growth_with_graphs(m, pp->preset, be);
#endif
        if (pp->cached)
            for (int p = 0; p < be->n_precisions; p++) test_cached(m, be, p);
        squad_model_free(m);
    }
    test_memory_bound(be);
}

int main(int argc, char **argv) {
    const char *which = test_backend_arg(argc, argv);
    if (!which) return 2;
    int ran = 0, known = strcmp(which, "all") == 0;
    for (int b = 0; b < N_BACKENDS; b++) {
        const backend *be = &BACKENDS[b];
        if (strcmp(which, "all") != 0 && strcmp(which, be->name) != 0) continue;
        known = 1;
        if (!test_backend_usable(be->device)) {
            printf("test_long: no usable %s backend (no CUDA build or no device), skipped\n", be->name);
            continue;
        }
        run_backend(be);
        ran++;
    }
    if (!known) {
        fprintf(stderr, "test_long: unknown backend '%s' (cpu, cuda or all)\n", which);
        return 2;
    }
    if (!ran) return TEST_SKIPPED;
    return test_summary("test_long");
}
