/*
 * gpu_test_long.c — long rows on the CUDA backend with the tiny presets, against the CPU backend
 * (the reference) and against itself:
 *  - one CUDA engine through rows of growing and then shrinking length (across the K / V's growth
 *    steps and several span buckets): every answer within TOL_CUDA_EXACT_CPU of the CPU's on the
 *    exact path, and equal to a fresh CUDA engine's on both paths (a growth copies the K / V and
 *    changes nothing else: the bound only leaves room for GEMM algorithms a fresh backend may tune
 *    differently); the K / V capacity grows in steps and keeps its size;
 *  - growth while graphs exist: an engine that captured every graph at start (precapture, with
 *    the first K / V capacity) then runs rows past that capacity; the graphs, which find the K / V
 *    through the chunk parameters, are replayed after the buffer moved, none is recaptured, and the
 *    answers still match the CPU;
 *  - a row exactly at the max_tokens limit and one past it (a clear error; the engine stays usable);
 *  - cached = uncached on a long state, and a state too large for the budget answered uncached;
 *  - the memory bound: a model claiming 2^31 - 1 positions gets what the device's free memory holds,
 *    with the reason SQUAD_LIMIT_MEMORY, and still runs rows.
 * Exits 77 (skipped) without a GPU.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "engine.h"
#include "squad.h"
#include "synth.h"
#include "long_rows.h"
#include "testutil.h"
#include "tolerances.h"

#ifdef SQUAD_HAVE_CUDA
#include "cuda/backend_cuda.h"

/* Across a CUDA slot's K / V growth steps (256 doubling up to 16384) and span buckets (1024 ... 16384). */
static const int LENGTHS[] = {200, 1500, 4500, 9000, 700, 13000, 2500};
#define N_LENGTHS ((int)(sizeof LENGTHS / sizeof LENGTHS[0]))
/* A CUDA sequence slot's first K / V capacity (backend_cuda.cu KV_SLOT_MIN_POSITIONS); a slot holds
 * none before its first row. */
#define CUDA_KV_FIRST 256
static const char *PREC_NAME[2] = {"exact", "bf16"};

static squad_engine *engine(squad_model *m, squad_device dev, squad_precision prec, size_t budget, int max_tokens,
                            int precapture) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = dev;
    o.threads = 0; /* the CPU reference on every core of the GPU machine */
    o.precision = prec;
    o.cache.budget_bytes = budget;
    o.max_tokens = max_tokens;
    o.precapture = precapture;
    squad_err err = {0};
    squad_engine *e = squad_engine_new(m, &o, &err);
    CHECKF(e != NULL, "engine: %s", err.msg);
    return e;
}


static int graphs_of(const squad_engine *e) {
    squad_cuda_info info;
    return squad_cuda_backend_info(e->be, &info) == 0 ? info.graphs : -1;
}

/* Growing and shrinking rows on one CUDA engine: against the CPU (exact path) and a fresh engine. */
static void test_growth(squad_model *m, const char *name, squad_precision prec) {
    const int bf = prec == SQUAD_PRECISION_BF16;
    squad_engine *gpu = engine(m, SQUAD_DEVICE_CUDA, prec, 0, 0, 0);
    squad_engine *cpu = bf ? NULL : engine(m, SQUAD_DEVICE_CPU, SQUAD_PRECISION_EXACT, 0, 0, 0);
    squad_result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    squad_err err = {0};
    CHECK(gpu && (cpu || bf) && a && b);
    CHECK(!gpu || gpu->be->kv_positions == 0);
    int longest = 0, held_before = gpu ? gpu->be->kv_positions : 0;
    for (int k = 0; gpu && (cpu || bf) && a && b && k < N_LENGTHS; k++) {
        const int n = LENGTHS[k];
        test_row t;
        if (row_make(&t, n, squad_model_vocab_size(m), 200 + (unsigned)k, -1)) break;
        int rc = squad_engine_score(gpu, &t.row, a, &err);
        CHECKF(rc == 0, "%s %s row %d: %s", name, PREC_NAME[bf], n, err.msg);
        if (n > longest) longest = n;
        const int held = gpu->be->kv_positions;
        CHECKF(held >= longest && held >= held_before && held < 2 * longest + CUDA_KV_FIRST,
               "%s row %d: K / V holds %d positions (longest %d)", name, n, held, longest);
        held_before = held;
        if (cpu) {
            rc = squad_engine_score(cpu, &t.row, b, &err);
            CHECKF(rc == 0, "%s", err.msg);
            const double d = worst_diff(a, b, &t.row);
            printf("%s %s row of %5d: K / V %5d positions, max |cuda - cpu| %.2e\n", name, PREC_NAME[bf], n, held, d);
            CHECKF(d <= TOL_CUDA_EXACT_CPU, "%s row %d: cuda vs cpu %.3e", name, n, d);
        }
        squad_engine *fresh = engine(m, SQUAD_DEVICE_CUDA, prec, 0, 0, 0);
        if (fresh) {
            rc = squad_engine_score(fresh, &t.row, b, &err);
            CHECKF(rc == 0, "%s", err.msg);
            /* the same kernels on the same K / V; only a GEMM algorithm chosen anew by the fresh
             * backend's tuning (without a shared plan file) could move the last bits */
            const double d = worst_diff(a, b, &t.row);
            printf("%s %s row of %5d: max |grown - fresh| %.2e\n", name, PREC_NAME[bf], n, d);
            CHECKF(d <= (bf ? TOL_CUDA_BF16_CACHED : TOL_CUDA_EXACT_CPU), "%s %s row %d: grown engine against a fresh one %.3e",
                   name, PREC_NAME[bf], n, d);
            squad_engine_free(fresh);
        }
        free(t.ids);
    }
    free(a), free(b);
    squad_engine_free(gpu);
    squad_engine_free(cpu);
}

/* Every graph captured at start, with the first K / V capacity; rows then grow the K / V (the
 * buffer moves) and replay those graphs. None is recaptured, and the answers match the CPU. */
static void test_growth_with_graphs(squad_model *m, const char *name) {
    const int limit = 12000;
    squad_engine *gpu = engine(m, SQUAD_DEVICE_CUDA, SQUAD_PRECISION_EXACT, 0, limit, 1);
    squad_engine *cpu = engine(m, SQUAD_DEVICE_CPU, SQUAD_PRECISION_EXACT, 0, 0, 0);
    squad_result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    squad_err err = {0};
    if (!gpu || !cpu || !a || !b) goto out;
    const int graphs0 = graphs_of(gpu);
    CHECKF(graphs0 > 0 && gpu->be->kv_positions == 0, "%d graphs, K / V %d", graphs0,
           gpu->be->kv_positions);
    const int lens[] = {3000, 6000, limit, 500};
    for (int k = 0; k < 4; k++) {
        test_row t;
        if (row_make(&t, lens[k], squad_model_vocab_size(m), 300 + (unsigned)k, -1)) break;
        int rc = squad_engine_score(gpu, &t.row, a, &err);
        CHECKF(rc == 0, "%s", err.msg);
        rc = squad_engine_score(cpu, &t.row, b, &err);
        CHECKF(rc == 0, "%s", err.msg);
        const double d = worst_diff(a, b, &t.row);
        printf("%s precaptured, row of %5d: K / V %5d positions, graphs %d (at start %d), max |cuda - cpu| %.2e\n",
               name, lens[k], gpu->be->kv_positions, graphs_of(gpu), graphs0, d);
        CHECKF(d <= TOL_CUDA_EXACT_CPU, "%s precaptured row %d: %.3e", name, lens[k], d);
        CHECK(graphs_of(gpu) == graphs0);
        free(t.ids);
    }
    CHECK(gpu->be->kv_positions == limit); /* 256 doubling, capped at the limit */
out:
    free(a), free(b);
    squad_engine_free(gpu);
    squad_engine_free(cpu);
}

static void test_limit(squad_model *m) {
    const int limit = 5000;
    squad_engine *gpu = engine(m, SQUAD_DEVICE_CUDA, SQUAD_PRECISION_BF16, (size_t)64 << 20, limit, 0);
    squad_result *r = malloc(sizeof *r);
    squad_err err = {0};
    test_row at, past;
    at.ids = past.ids = NULL;
    if (!gpu || !r || row_make(&at, limit, squad_model_vocab_size(m), 5, 4096) ||
        row_make(&past, limit + 1, squad_model_vocab_size(m), 5, 4096))
        goto out;
    squad_limit why;
    CHECK(squad_engine_max_tokens(gpu, &why) == limit && why == SQUAD_LIMIT_OPTION);
    CHECKF(squad_engine_score(gpu, &at.row, r, &err) == 0, "%s", err.msg);
    CHECK(gpu->be->kv_positions == limit);
    int rc = squad_engine_score(gpu, &past.row, r, &err);
    CHECKF(rc == SQUAD_E_INVALID && strstr(err.msg, "5001 tokens") && strstr(err.msg, "max_tokens"), "rc %d: %s", rc,
           err.msg);
    CHECKF(squad_engine_score(gpu, &at.row, r, &err) == 0 && r->reused > 0, "%s", err.msg); /* usable; the memo answers */
out:
    free(at.ids);
    free(past.ids);
    free(r);
    squad_engine_free(gpu);
}

static void test_cached(squad_model *m, squad_precision prec) {
    const int bf = prec == SQUAD_PRECISION_BF16;
    const double tol = bf ? TOL_CUDA_BF16_CACHED_WIDE : TOL_CUDA_EXACT_CACHED;
    const int state = 10000, question = 40;
    squad_engine *plain = engine(m, SQUAD_DEVICE_CUDA, prec, 0, 0, 0);
    squad_engine *cached = engine(m, SQUAD_DEVICE_CUDA, prec, (size_t)256 << 20, 0, 0);
    squad_engine *tight = engine(m, SQUAD_DEVICE_CUDA, prec, (size_t)64 << 10, 0, 0); /* below any checkpoint */
    squad_result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    squad_err err = {0};
    for (int q = 0; plain && cached && tight && a && b && q < 2; q++) {
        test_row t;
        if (row_make(&t, state + question, squad_model_vocab_size(m), 77, state)) break;
        uint64_t s = 1000 + (uint64_t)q;
        for (int i = state; i < state + question; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            t.ids[i] = (int32_t)((s >> 33) % (uint64_t)squad_model_vocab_size(m));
        }
        CHECK(squad_engine_score(plain, &t.row, a, &err) == 0);
        CHECK(squad_engine_score(cached, &t.row, b, &err) == 0);
        const double d = worst_diff(a, b, &t.row);
        printf("long state %d, %s, question %d: reused %d, max |cached - uncached| %.2e\n", state, PREC_NAME[bf], q,
               b->reused, d);
        CHECKF(d <= tol, "cached %.3e", d);
        if (q == 1) CHECK(b->reused >= state - 64);
        CHECK(squad_engine_score(tight, &t.row, b, &err) == 0);
        CHECKF(worst_diff(a, b, &t.row) <= tol && b->reused == 0, "tight %.3e", worst_diff(a, b, &t.row));
        free(t.ids);
    }
    if (tight) {
        squad_cache_stats st;
        squad_engine_cache_stats(tight, &st);
        CHECKF(st.uncacheable == 2 && st.checkpoints == 0, "uncacheable %llu", (unsigned long long)st.uncacheable);
    }
    free(a), free(b);
    squad_engine_free(plain);
    squad_engine_free(cached);
    squad_engine_free(tight);
}

/* The tiny preset rewritten to claim INT32_MAX positions (256 bytes of bf16 K / V a position: half a
 * terabyte), so the CUDA backend bounds the context by the device's free memory. */
static void test_memory_bound(void) {
    char dir[600], cfg[700];
    snprintf(dir, sizeof dir, "%s/tiny-huge", test_tmpdir());
    squad_synth_opts so;
    memset(&so, 0, sizeof so);
    so.preset = "tiny";
    so.out_dir = dir;
    so.seed = 31;
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
    CHECK(where != NULL);
    if (!where) return;
    json_object_set_new(where, "max_position_embeddings", json_integer(INT32_MAX));
    CHECK(json_dump_file(root, cfg, JSON_INDENT(2)) == 0);
    json_decref(root);
    squad_model *m = squad_model_load(dir, &err);
    CHECKF(m != NULL, "%s", err.msg);
    if (!m) return;
    squad_engine *e = engine(m, SQUAD_DEVICE_CUDA, SQUAD_PRECISION_BF16, 0, 0, 0);
    if (e) {
        squad_limit why;
        const int n = squad_engine_max_tokens(e, &why);
        squad_cuda_info info;
        squad_cuda_backend_info(e->be, &info);
        printf("memory bound: %d positions (%zu bytes a position), K / V %d positions now, %d span buckets\n", n,
               e->be->kv_bytes_per_pos, e->be->kv_positions, info.n_spans);
        CHECK(why == SQUAD_LIMIT_MEMORY && n > CUDA_KV_FIRST && n < INT32_MAX);
        CHECK(info.max_context == n && info.spans[info.n_spans - 1] == n && e->be->kv_positions == 0);
        squad_result *r = malloc(sizeof *r);
        test_row t;
        if (r && row_make(&t, 5000, squad_model_vocab_size(m), 9, -1) == 0) {
            CHECKF(squad_engine_score(e, &t.row, r, &err) == 0, "%s", err.msg);
            CHECK(e->be->kv_positions == 32 * CUDA_KV_FIRST); /* 256 doubled to 8192 for 5000 positions */
            free(t.ids);
        }
        free(r);
        squad_engine_free(e);
    }
    squad_model_free(m);
}

int main(void) {
    if (squad_cuda_device_count() <= 0 || !squad_cuda_device_usable()) {
        printf("gpu_test_long: no usable CUDA device, skipped\n");
        return TEST_SKIPPED;
    }
    const char *presets[] = {"tiny", "tiny-hd256"};
    for (int p = 0; p < 2; p++) {
        squad_model *m = test_synth_model(presets[p], 21 + (unsigned)p);
        if (!m) continue;
        test_growth(m, presets[p], SQUAD_PRECISION_EXACT);
        test_growth(m, presets[p], SQUAD_PRECISION_BF16);
        test_growth_with_graphs(m, presets[p]);
        if (p == 0) {
            test_limit(m);
            test_cached(m, SQUAD_PRECISION_EXACT);
            test_cached(m, SQUAD_PRECISION_BF16);
        }
        squad_model_free(m);
    }
    test_memory_bound();
    return test_summary("gpu_test_long");
}
#else
int main(void) {
    printf("gpu_test_long: built without CUDA, skipped\n");
    return 77;
}
#endif
