/*
 * test_cache_tiers.c — the state cache's tiers (docs/design.md section 7, "Tiers") on the CPU.
 *
 * The host tier is enabled on the CPU backend through the cache's test hook (copies by memcpy), so
 * the demote / promote bookkeeping runs here as it does over CUDA's device blobs. Checks:
 *  - rows whose checkpoints were demoted and promoted back answer as the uncached engine, and the
 *    same as an engine that never evicted them (the same restore point: identical);
 *  - a state evicted from both tiers is recomputed (cold) and answers the same;
 *  - a row that finds its state only in host memory and is told not to promote recomputes from the
 *    deepest device checkpoint, and answers the same;
 *  - an agent trace (sessions interleaved, each state changing in its middle, growing at its end or
 *    being replaced, as bench/agent_trace.py's) through a device budget a quarter of its working
 *    set: with a host tier that holds the rest, every row that restored something without the tier
 *    restores at least as much with it, the tokens reused add up to at least as many, and a state
 *    found only in host memory is promoted; with every row's checkpoints cut to its end (what the
 *    server asks under load) as well as with all of them;
 *  - the host tier never holds more than its budget, and the cache stays consistent throughout;
 *  - restart: an engine saves, a new engine on the same model loads, and the first repeated
 *    question is a hit with identical probabilities; another model (another synth seed), another
 *    tokenizer file and another specialists set get nothing from the same file;
 *  - a truncated or bit-flipped file loads only its valid records, and those answer correctly;
 *  - the host tier's budget reserved up front (as over page-locked memory): the pool holds exactly
 *    its cap in slabs, the last one the remainder, and no allocation takes a slab afterwards; a
 *    reserve the slab source refuses part-way keeps what it took, the cache reports it as the
 *    error squad_cache_new gives (tested through a backend double whose host_alloc refuses), and
 *    every slab taken is given back; a K / V blob larger than any reserved slab is not demoted and
 *    evicts no other host checkpoint trying.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_internal.h"
#include "engine.h"
#include "specialists.h"
#include "specialists_synth.h"
#include "squad.h"
#include "synth.h"
#include "testutil.h"
#include "tolerances.h"
#include "util.h"

#define STATE_LEN 320 /* p = 320: checkpoints at 256 (stride) and 320 (tail, end) */
#define QUESTION 8
#define N_STATES 6

typedef struct trow {
    int32_t ids[STATE_LEN + QUESTION], slots[2], nopts[2], letters[4];
    squad_row row;
} trow;

static void fill(int32_t *v, int n, uint64_t seed, int vocab) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 11;
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        v[i] = (int32_t)(x % (uint64_t)vocab);
    }
}

/* State `state`, question `q`: a row of its own arrays. */
static void row_make_len(trow *r, int state, int q, int vocab, int state_len) {
    fill(r->ids, state_len, 1000 + (uint64_t)state, vocab);
    fill(r->ids + state_len, QUESTION, 5000 + (uint64_t)state * 131 + (uint64_t)q, vocab);
    const int n = state_len + QUESTION;
    r->slots[0] = n - 2;
    r->slots[1] = n - 1;
    r->nopts[0] = 2;
    r->nopts[1] = 4;
    for (int l = 0; l < 4; l++) r->letters[l] = l + 1;
    r->row = (squad_row){r->ids, n, r->slots, r->nopts, 2, r->letters, 4, state_len, 0, NULL, 0};
}

/* State `state` of STATE_LEN tokens (state_len <= STATE_LEN for row_make_len). */
static void row_make(trow *r, int state, int q, int vocab) { row_make_len(r, state, q, vocab, STATE_LEN); }

static squad_model *synth_model(const char *name, unsigned seed) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
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
    squad_model *m = squad_model_load(dir, &err);
    CHECKF(m != NULL, "load: %s", err.msg);
    return m;
}

static squad_engine *engine(squad_model *m, size_t budget, const squad_specialists *sp) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = SQUAD_DEVICE_CPU;
    o.threads = 1;
    o.precision = SQUAD_PRECISION_EXACT;
    o.cache.budget_bytes = budget;
    o.cache.stride = 256;
    o.cache.min_prefix = 64;
    o.specialists = sp;
    squad_err err = {0};
    squad_engine *e = squad_engine_new(m, &o, &err);
    CHECKF(e != NULL, "engine: %s", err.msg);
    return e;
}

static int consistent(squad_engine *e, const char *what) {
    char why[256] = "";
    const int ok = squad_cache_check(e->cache, why, sizeof why) == 0;
    CHECKF(ok, "%s: %s", what, why);
    return ok;
}

static int score(squad_engine *e, const squad_row *row, squad_result *out) {
    squad_err err = {0};
    const int rc = squad_engine_score(e, row, out, &err);
    CHECKF(rc == 0, "score: %s", err.msg);
    return rc;
}

/* The bytes one state's checkpoints cost: its group and its three checkpoints (256, 320 twice
 * collapses to two: 256 and 320). */
static size_t state_cost(squad_engine *e) {
    return squad_cache_group_cost(e->cache, 320) + 2 * squad_cache_ckpt_cost(e->cache);
}

/* An engine whose device budget holds two states, and one state's cost (measured on a probe
 * engine of the same model); NULL when either engine cannot be made. */
static squad_engine *two_state_engine(squad_model *m, size_t *one) {
    squad_engine *probe = engine(m, (size_t)1 << 30, NULL);
    if (!probe) return NULL;
    *one = state_cost(probe);
    squad_engine_free(probe);
    return engine(m, 2 * *one + 4096, NULL);
}

/* bytes rounded up to the slab pool's alignment (a slab of exactly that many bytes). */
static size_t pool_aligned(size_t bytes) {
    return (bytes + SQUAD_TIER_POOL_ALIGN - 1) / SQUAD_TIER_POOL_ALIGN * SQUAD_TIER_POOL_ALIGN;
}

/* ---- the host tier's slab pool ------------------------------------------------------------- */

typedef struct slab_counts {
    int got, put;
    size_t bytes_out;
} slab_counts;

static void *count_get(void *ctx, size_t bytes) {
    slab_counts *n = ctx;
    void *p = malloc(bytes);
    if (p) {
        n->got++;
        n->bytes_out += bytes;
    }
    return p;
}

static void count_put(void *ctx, void *slab) {
    slab_counts *n = ctx;
    n->put++;
    free(slab);
}

#define POOL_BLOBS 64

/* Random allocations and frees of a few sizes (as the tier's: GDN blobs and K / V blobs of a few
 * lengths): each blob keeps its own pattern (no two overlap), the pool stays consistent, it grows
 * a slab at a time within its cap, refuses past it, reuses freed room, and gives every slab back. */
static void tier_pool_unit(void) {
    slab_counts n = {0};
    const size_t step = 64 << 10, cap = 4 * step;
    squad_tier_pool pool;
    squad_tier_pool_init(&pool, cap, step, count_get, count_put, &n);
    unsigned char *blob[POOL_BLOBS] = {0};
    size_t size[POOL_BLOBS] = {0};
    const size_t sizes[] = {5000, 12288, 1, 40000, 300};
    uint64_t x = 12345;
    char why[256] = "";
    int refused = 0, ok = 1;
    for (int it = 0; it < 4000 && ok; it++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const int i = (int)(x % POOL_BLOBS);
        if (blob[i]) { /* its pattern survived everyone else's writes */
            for (size_t b = 0; b < size[i] && ok; b++) ok = blob[i][b] == (unsigned char)(i * 7 + b);
            CHECKF(ok, "pool blob %d overwritten", i);
            squad_tier_pool_free(&pool, blob[i]);
            blob[i] = NULL;
        } else {
            size[i] = sizes[(x >> 20) % 5];
            blob[i] = squad_tier_pool_alloc(&pool, size[i]);
            if (!blob[i]) {
                refused++;
                continue;
            }
            for (size_t b = 0; b < size[i]; b++) blob[i][b] = (unsigned char)(i * 7 + b);
        }
        if (squad_tier_pool_check(&pool, why, sizeof why)) {
            CHECKF(0, "pool after step %d: %s", it, why);
            ok = 0;
        }
    }
    CHECKF(pool.slab_bytes <= cap && n.bytes_out == pool.slab_bytes, "pool: %zu slab bytes of cap %zu (%zu got)",
           pool.slab_bytes, cap, n.bytes_out);
    CHECKF(n.got <= 4 && n.got == pool.n_slabs, "pool: %d slabs for 4000 steps", n.got);
    CHECKF(refused > 0, "pool: the cap never refused a blob (%d refused)", refused);
    /* everything back: one free block per slab, and a blob of a whole slab fits again */
    for (int i = 0; i < POOL_BLOBS; i++) squad_tier_pool_free(&pool, blob[i]);
    CHECKF(pool.used_bytes == 0 && squad_tier_pool_check(&pool, why, sizeof why) == 0, "pool emptied: %s", why);
    const int slabs = n.got;
    void *whole = squad_tier_pool_alloc(&pool, step);
    CHECKF(whole != NULL && n.got == slabs, "pool: a slab's worth after emptying (%d slabs, was %d)", n.got, slabs);
    squad_tier_pool_free(&pool, (unsigned char *)whole + 256); /* not a blob start: ignored */
    CHECK(pool.used_bytes == step);
    /* a blob larger than the step gets a slab of its own size, within the cap */
    squad_tier_pool_free(&pool, whole);
    squad_tier_pool_destroy(&pool);
    CHECKF(n.put == n.got, "pool: %d slabs given back of %d", n.put, n.got);
    squad_tier_pool_init(&pool, cap, step, count_get, count_put, &n);
    void *big = squad_tier_pool_alloc(&pool, 3 * step + 1000);
    CHECKF(big != NULL && pool.slab_bytes >= 3 * step + 1000, "pool: a blob over the step (%zu)", pool.slab_bytes);
    CHECK(squad_tier_pool_alloc(&pool, cap) == NULL);
    squad_tier_pool_destroy(&pool);
    CHECKF(n.put == n.got, "pool: %d slabs given back of %d", n.put, n.got);
    printf("tier pool: %d slabs for 4000 random steps, %d refused at the cap\n", slabs, refused);
}

/* A slab source that keeps account, as the backend's page-locked memory would: it hands out at
 * most `limit` bytes at once (past that it refuses, as a system out of lockable memory does) and
 * records every slab out with its bytes, their peak, and the gets it refused. */
#define SOURCE_SLABS_MAX 256

typedef struct slab_source {
    size_t limit, out, peak;
    int got, put, refused;
    void *held[SOURCE_SLABS_MAX]; /* the slabs out and their bytes, in the order taken */
    size_t held_bytes[SOURCE_SLABS_MAX];
} slab_source;

static void source_init(slab_source *s, size_t limit) {
    memset(s, 0, sizeof *s);
    s->limit = limit;
}

static void *source_get(void *ctx, size_t bytes) {
    slab_source *s = ctx;
    if (s->got >= SOURCE_SLABS_MAX || bytes > s->limit - s->out) {
        s->refused++;
        return NULL;
    }
    void *p = malloc(bytes);
    if (!p) return NULL;
    s->held[s->got] = p;
    s->held_bytes[s->got++] = bytes;
    s->out += bytes;
    if (s->out > s->peak) s->peak = s->out;
    return p;
}

static void source_put(void *ctx, void *slab) {
    slab_source *s = ctx;
    for (int i = 0; i < s->got; i++)
        if (s->held[i] == slab) {
            s->out -= s->held_bytes[i];
            s->held[i] = NULL;
            s->put++;
            break;
        }
    free(slab);
}

/* The slabs a reserve of `cap` takes at `step` bytes each: whole steps, then the aligned rest. */
static int reserve_slabs(size_t cap, size_t step) {
    const size_t aligned = cap / SQUAD_TIER_POOL_ALIGN * SQUAD_TIER_POOL_ALIGN;
    return (int)(aligned / step + (aligned % step != 0));
}

/* The pool reserved: exactly its cap in slabs (a step each, the last the aligned remainder);
 * random traffic never takes another slab and keeps the pool consistent; a blob over a slab is
 * refused; a reserve the source refuses part-way keeps what it took; a pool that grew first is
 * filled up to its cap; destroy gives every slab back. */
static void tier_pool_reserve_unit(void) {
    const size_t step = 64 << 10, cap = 5 * step + 3 * SQUAD_TIER_POOL_ALIGN + 100;
    char why[256] = "";
    slab_source src;
    squad_tier_pool pool;

    source_init(&src, (size_t)1 << 30);
    squad_tier_pool_init(&pool, cap, step, source_get, source_put, &src);
    CHECK(squad_tier_pool_reserve(&pool) == 0);
    size_t got_bytes = 0;
    int steps = 0;
    for (int i = 0; i < src.got; i++) got_bytes += src.held_bytes[i], steps += src.held_bytes[i] == step;
    CHECKF(src.got == 6 && steps == 5 && src.held_bytes[5] == 3 * SQUAD_TIER_POOL_ALIGN,
           "reserve: %d slabs, %d of a step, last %zu", src.got, steps, src.got ? src.held_bytes[src.got - 1] : 0);
    CHECKF(src.got == reserve_slabs(cap, step), "reserve: %d slabs, expected %d", src.got, reserve_slabs(cap, step));
    CHECKF(got_bytes == 5 * step + 3 * SQUAD_TIER_POOL_ALIGN && pool.slab_bytes == got_bytes && pool.n_slabs == 6,
           "reserve: %zu bytes got, %zu in %d slabs", got_bytes, pool.slab_bytes, pool.n_slabs);
    CHECKF(pool.slabs_reserved == 6 && pool.slabs_sync == 0 && pool.n_slabs == 6,
           "reserve: %llu reserved, %llu on demand", pool.slabs_reserved, pool.slabs_sync);
    CHECK(squad_tier_pool_check(&pool, why, sizeof why) == 0);
    CHECK(squad_tier_pool_reserve(&pool) == 0 && src.got == 6); /* full already: nothing more */
    CHECK(squad_tier_pool_max_blob(&pool) == step);

    /* random traffic of a few sizes, a whole slab among them, and now and then one over a slab */
    unsigned char *blob[POOL_BLOBS] = {0};
    size_t size[POOL_BLOBS] = {0};
    const size_t sizes[] = {5000, 12288, 1, 40000, 300, step, 3 * SQUAD_TIER_POOL_ALIGN, step + 1};
    uint64_t x = 777;
    int ok = 1, refused = 0, over_refused = 0;
    for (int it = 0; it < 4000 && ok; it++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const int i = (int)(x % POOL_BLOBS);
        if (blob[i]) {
            for (size_t b = 0; b < size[i] && ok; b++) ok = blob[i][b] == (unsigned char)(i * 5 + b);
            CHECKF(ok, "reserve: blob %d overwritten", i);
            squad_tier_pool_free(&pool, blob[i]);
            blob[i] = NULL;
        } else {
            size[i] = sizes[(x >> 20) % 8];
            blob[i] = squad_tier_pool_alloc(&pool, size[i]);
            if (blob[i]) {
                CHECKF(size[i] <= step, "reserve: a blob of %zu over a slab of %zu", size[i], step);
                for (size_t b = 0; b < size[i]; b++) blob[i][b] = (unsigned char)(i * 5 + b);
            } else {
                refused++;
                over_refused += size[i] > step;
            }
        }
        if (squad_tier_pool_check(&pool, why, sizeof why) || pool.slabs_sync != 0 || src.got != 6) {
            CHECKF(0, "reserve, random, step %d: %s (%llu slabs on demand, %d got)", it, why, pool.slabs_sync, src.got);
            ok = 0;
        }
    }
    CHECKF(over_refused > 0 && refused > over_refused, "reserve, random: %d refused, %d of them over a slab", refused,
           over_refused);
    for (int i = 0; i < POOL_BLOBS; i++) squad_tier_pool_free(&pool, blob[i]);
    CHECKF(pool.used_bytes == 0 && squad_tier_pool_check(&pool, why, sizeof why) == 0, "reserve, emptied: %s", why);
    printf("tier pool reserved: %d slabs, 4000 random steps, %d refused (%d over a slab), none taken on demand\n", src.got,
           refused, over_refused);
    squad_tier_pool_destroy(&pool);
    CHECKF(src.put == src.got && src.out == 0, "reserve: %d slabs given back of %d", src.put, src.got);
    CHECK(pool.n_slabs == 0 && pool.slab_bytes == 0 && pool.cap == cap); /* empty, the same cap */

    /* the source refuses the third slab: -1, the two taken stay, usable, and go back on destroy */
    source_init(&src, 2 * step + 100);
    squad_tier_pool_init(&pool, 4 * step, step, source_get, source_put, &src);
    CHECK(squad_tier_pool_reserve(&pool) == -1);
    CHECKF(src.got == 2 && src.refused == 1 && pool.n_slabs == 2 && pool.slab_bytes == 2 * step &&
               pool.slabs_reserved == 2 && pool.slabs_sync == 0,
           "reserve refused: %d got, %d refused, %d slabs of %zu bytes", src.got, src.refused, pool.n_slabs,
           pool.slab_bytes);
    void *a = squad_tier_pool_alloc(&pool, step), *b = squad_tier_pool_alloc(&pool, 1000);
    CHECK(a != NULL && b != NULL && squad_tier_pool_check(&pool, why, sizeof why) == 0);
    CHECK(squad_tier_pool_alloc(&pool, step) == NULL); /* the third slab is refused again */
    CHECK(src.got == 2 && src.peak <= 2 * step + 100);
    squad_tier_pool_destroy(&pool);
    CHECKF(src.put == 2 && src.out == 0, "reserve refused: %d of %d slabs given back, %zu bytes out", src.put, src.got,
           src.out);

    /* a pool that grew on demand first: the reserve fills the rest of its cap */
    source_init(&src, (size_t)1 << 30);
    squad_tier_pool_init(&pool, 3 * step, step, source_get, source_put, &src);
    CHECK(squad_tier_pool_alloc(&pool, 100) != NULL && pool.slabs_sync == 1);
    CHECK(squad_tier_pool_reserve(&pool) == 0);
    CHECKF(pool.slab_bytes == 3 * step && pool.slabs_reserved == 2 && pool.n_slabs == 3 &&
               squad_tier_pool_check(&pool, why, sizeof why) == 0,
           "reserve after a growth: %zu bytes, %llu reserved: %s", pool.slab_bytes, pool.slabs_reserved, why);
    squad_tier_pool_destroy(&pool);
    CHECK(src.put == src.got && src.out == 0);
}

/* The cost model on the 0.8B figures (H200): a 4,096-token state (69.9 MB) restores at 55 GB/s in
 * 1.3 ms against 14.4 ms of recompute; a state 64 tokens deeper than the device's costs its GDN
 * blob (19.5 MB, 0.35 ms) against 0.23 ms of recompute: copy the first, recompute the second. */
static void cost_model_unit(void) {
    const double rate = 55e9, per_token = 14.4e-3 / 4096;
    CHECK(squad_cache_tier_pays(69.9e6, 4096, rate, per_token) == 1);
    CHECK(squad_cache_tier_pays(19.5e6, 64, rate, per_token) == 0);
    CHECK(squad_cache_tier_pays(19.5e6, 4096, 0, per_token) == 0); /* no bandwidth: never */
    CHECK(squad_cache_tier_pays(69.9e6, 4096, 0.7e9, per_token) == 0); /* the slow path measured before */
}

/* ---- the host tier ------------------------------------------------------------------------- */

/* States 0..N-1 cached in turn through a device budget of two states; then state 0 again. force:
 * the test hook's (1 promote, -1 recompute, 0 the cost model); copy_rate: the cost model's copy
 * bandwidth (0: as measured), a fast one must promote and a slow one recompute. */
static void host_tier_case(squad_model *m, squad_engine *plain, const char *name, size_t host_states, int force,
                           double copy_rate) {
    const int expect = force ? force : copy_rate >= 1e9 ? 1 : copy_rate > 0 ? -1 : 0;
    const int V = squad_model_vocab_size(m);
    size_t one = 0;
    squad_engine *e = two_state_engine(m, &one);
    if (!e) return;
    const size_t host_budget = host_states * one + 1024;
    squad_err err = {0};
    CHECKF(squad_cache_debug_host_tier(e->cache, host_budget, force, &err) == 0, "%s: %s", name, err.msg);
    squad_cache_debug_tier_rates(e->cache, copy_rate, 0);
    squad_result r, ref;
    trow row;
    squad_cache_stats st;
    for (int s = 0; s < N_STATES; s++) {
        row_make(&row, s, 0, V);
        if (score(e, &row.row, &r)) break;
        squad_engine_cache_stats(e, &st);
        CHECKF(st.host_bytes_held <= host_budget, "%s: host tier %zu bytes over its budget %zu", name,
               st.host_bytes_held, host_budget);
        CHECKF(st.bytes_held <= st.budget_bytes, "%s: device %zu over %zu", name, st.bytes_held, st.budget_bytes);
        consistent(e, name);
    }
    squad_engine_cache_stats(e, &st);
    printf("%s: demotions %llu, host checkpoints %llu (%zu bytes of %zu), host evicted %llu\n", name,
           (unsigned long long)st.demotions, (unsigned long long)st.host_checkpoints, st.host_bytes_held,
           st.host_budget_bytes, (unsigned long long)st.host_evicted);
    CHECKF(st.demotions > 0, "%s: nothing was demoted", name);
    CHECKF(st.host_budget_bytes == host_budget, "%s: host budget %zu", name, st.host_budget_bytes);
    /* state 0 again with a new question (the memo cannot answer it) */
    row_make(&row, 0, 1, V);
    const squad_cache_stats before = st;
    if (score(e, &row.row, &r) || score(plain, &row.row, &ref)) goto done;
    squad_engine_cache_stats(e, &st);
    consistent(e, name);
    CHECKF(test_answer_diff(&row.row, &r, &ref) <= TOL_CPU_EXACT_CACHED, "%s: %.3g from the uncached answer", name,
           test_answer_diff(&row.row, &r, &ref));
    if (host_states >= N_STATES) { /* everything fit the host tier: state 0 was there */
        if (expect > 0) {
            CHECKF(r.reused == STATE_LEN - STATE_LEN % 64, "%s: reused %d after a promotion", name, r.reused);
            CHECKF(st.promotions > before.promotions, "%s: no promotion", name);
            CHECK(st.promote_seconds > 0);
            /* an engine that never evicted state 0 restores the same position: the same answer */
            squad_engine *big = engine(m, (size_t)1 << 30, NULL);
            trow first;
            row_make(&first, 0, 0, V);
            squad_result rb;
            if (big && !score(big, &first.row, &rb) && !score(big, &row.row, &rb))
                CHECKF(memcmp(rb.probs, r.probs, sizeof r.probs) == 0 && rb.reused == r.reused,
                       "%s: promoted answer differs from the never-evicted one", name);
            squad_engine_free(big);
        } else if (expect < 0) {
            CHECKF(r.reused < STATE_LEN - STATE_LEN % 64, "%s: reused %d without promoting", name, r.reused);
            CHECKF(st.host_recomputed > before.host_recomputed, "%s: the recompute was not counted", name);
            CHECK(st.promotions == before.promotions);
        }
    } else { /* state 0 fell out of both tiers */
        CHECKF(r.reused == 0, "%s: reused %d of a state evicted from both tiers", name, r.reused);
        CHECKF(st.host_evicted > 0, "%s: the host tier evicted nothing", name);
    }
    /* the host blobs came from a few slabs, not an allocation each, and the pool agrees with the
     * tier's counts */
    const squad_tier_pool *pool = squad_cache_debug_tier_pool(e->cache);
    char why[256] = "";
    CHECKF(squad_tier_pool_check(pool, why, sizeof why) == 0, "%s: pool: %s", name, why);
    CHECKF(pool->slab_bytes <= host_budget && pool->used_bytes <= st.host_bytes_held,
           "%s: pool slabs %zu, used %zu, host tier %zu of %zu", name, pool->slab_bytes, pool->used_bytes,
           st.host_bytes_held, host_budget);
    CHECKF(pool->n_slabs <= 2 && (st.demotions == 0 || pool->n_slabs >= 1), "%s: %d slabs for %llu demotions", name,
           pool->n_slabs, (unsigned long long)st.demotions);
    /* a clear empties both tiers; the slabs stay for the next demotions */
    squad_engine_cache_clear(e);
    squad_engine_cache_stats(e, &st);
    CHECK(st.checkpoints == 0 && st.host_checkpoints == 0 && st.host_bytes_held == 0);
    CHECKF(pool->used_bytes == 0 && squad_tier_pool_check(pool, why, sizeof why) == 0, "%s: pool after a clear: %s",
           name, why);
    consistent(e, name);
done:
    squad_engine_free(e);
}

/* ---- an agent trace through the tiers ------------------------------------------------------ */

#define AGENT_SESSIONS 6
#define AGENT_STEPS 4
#define AGENT_QUESTIONS 2
#define AGENT_ROWS (AGENT_SESSIONS * AGENT_STEPS * AGENT_QUESTIONS)
#define AGENT_MAX_STATE 1024
#define AGENT_HEADER 72 /* shared by every session: one aligned block of 64 and a little more */

typedef struct agent_session {
    int32_t state[AGENT_MAX_STATE];
    int n, history_end; /* the state's tokens; where its history ends and its page begins */
} agent_session;

typedef struct agent_trace {
    int32_t ids[AGENT_ROWS][AGENT_MAX_STATE + QUESTION];
    int32_t slots[AGENT_ROWS][1], nopts[AGENT_ROWS][1], letters[4];
    squad_row rows[AGENT_ROWS];
} agent_trace;

static uint64_t agent_next(uint64_t *x) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return *x;
}

/* n random tokens into v (the vocabulary's first 4 ids are the letters). */
static void agent_tokens(int32_t *v, int n, uint64_t *x, int vocab) {
    for (int i = 0; i < n; i++) v[i] = 4 + (int32_t)(agent_next(x) % (uint64_t)(vocab - 4));
}

/* The session's next state: a step appended and a new page (most often), or the page's second half
 * changed, or the page grown at its end. */
static void agent_advance(agent_session *s, uint64_t *x, int vocab) {
    const int r = (int)(agent_next(x) % 4);
    if (r == 0 && s->n + 64 <= AGENT_MAX_STATE) { /* the page grows */
        agent_tokens(s->state + s->n, 64, x, vocab);
        s->n += 64;
    } else if (r == 1) { /* part of the page changes */
        const int at = s->history_end + (s->n - s->history_end) / 2;
        agent_tokens(s->state + at, s->n - at, x, vocab);
    } else { /* an action: one more step in the history, then a new page */
        const int step = 24 + (int)(agent_next(x) % 40), page = 160 + (int)(agent_next(x) % 160);
        if (s->history_end + step + page > AGENT_MAX_STATE) s->history_end = AGENT_HEADER + 48; /* old steps trimmed */
        agent_tokens(s->state + s->history_end, step, x, vocab);
        s->history_end += step;
        agent_tokens(s->state + s->history_end, page, x, vocab);
        s->n = s->history_end + page;
    }
}

/* Sessions interleaved at random, each asking AGENT_QUESTIONS questions about each of its states. */
static void agent_trace_make(agent_trace *t, int vocab) {
    static agent_session sessions[AGENT_SESSIONS];
    uint64_t x = 0x5eed5eedull;
    int32_t header[AGENT_HEADER];
    agent_tokens(header, AGENT_HEADER, &x, vocab);
    int asked[AGENT_SESSIONS] = {0};
    for (int i = 0; i < AGENT_SESSIONS; i++) {
        agent_session *s = &sessions[i];
        memcpy(s->state, header, sizeof header);
        agent_tokens(s->state + AGENT_HEADER, 48, &x, vocab); /* the goal */
        s->history_end = AGENT_HEADER + 48;
        agent_tokens(s->state + s->history_end, 256, &x, vocab);
        s->n = s->history_end + 256;
    }
    for (int l = 0; l < 4; l++) t->letters[l] = l;
    for (int k = 0; k < AGENT_ROWS; k++) {
        int i = (int)(agent_next(&x) % AGENT_SESSIONS);
        while (asked[i] == AGENT_STEPS * AGENT_QUESTIONS) i = (i + 1) % AGENT_SESSIONS;
        agent_session *s = &sessions[i];
        memcpy(t->ids[k], s->state, (size_t)s->n * sizeof(int32_t));
        agent_tokens(t->ids[k] + s->n, QUESTION, &x, vocab);
        t->slots[k][0] = s->n + QUESTION - 1;
        t->nopts[k][0] = 4;
        t->rows[k] = (squad_row){t->ids[k], s->n + QUESTION, t->slots[k], t->nopts[k], 1, t->letters, 4, s->n, 0, NULL, 0};
        if (++asked[i] % AGENT_QUESTIONS == 0) agent_advance(s, &x, vocab);
    }
}

typedef struct agent_run {
    int reused[AGENT_ROWS];
    long reused_sum;
    squad_cache_stats st;
} agent_run;

/* The trace through an engine of `budget` bytes (with a host tier of host_budget when > 0, the cost
 * model deciding), one row at a time; answers checked against the uncached engine. 0 when every
 * row was answered. */
static int agent_replay(squad_model *m, squad_engine *plain, const agent_trace *t, size_t budget, size_t host_budget,
                        int end_only, const char *name, agent_run *out) {
    memset(out, 0, sizeof *out);
    squad_engine *e = engine(m, budget, NULL);
    if (!e) return -1;
    slab_source src;
    source_init(&src, (size_t)1 << 40);
    if (host_budget) { /* reserved up front, as over page-locked memory (default 256 MB slabs) */
        squad_err err = {0};
        const int rc = squad_cache_debug_host_tier(e->cache, host_budget, 0, &err) ||
                       squad_cache_debug_tier_slabs(e->cache, source_get, source_put, &src, 0, 1, &err);
        CHECKF(rc == 0, "%s: host tier: %s", name, err.msg);
    }
    squad_score_opts so;
    memset(&so, 0, sizeof so);
    so.end_checkpoint_only = end_only;
    int rc = 0;
    for (int k = 0; k < AGENT_ROWS && rc == 0; k++) {
        squad_result r, ref;
        squad_err err = {0};
        rc = squad_engine_score_ex(e, &t->rows[k], &so, &r, &err);
        CHECKF(rc == 0, "%s, row %d: %s", name, k, err.msg);
        if (rc || score(plain, &t->rows[k], &ref)) break;
        CHECKF(test_answer_diff(&t->rows[k], &r, &ref) <= TOL_CPU_EXACT_CACHED, "%s, row %d: %.3g from the uncached answer", name, k,
               test_answer_diff(&t->rows[k], &r, &ref));
        out->reused[k] = r.reused;
        out->reused_sum += r.reused;
        if (!consistent(e, name)) rc = -1;
    }
    squad_engine_cache_stats(e, &out->st);
    if (host_budget)
        CHECKF(out->st.host_slabs_sync == 0 && out->st.host_slabs_reserved == (uint64_t)src.got &&
                   src.got == reserve_slabs(host_budget, SQUAD_TIER_POOL_STEP),
               "%s: %llu slabs on demand, %llu reserved, %d got", name, (unsigned long long)out->st.host_slabs_sync,
               (unsigned long long)out->st.host_slabs_reserved, src.got);
    printf("%s: hits %llu, partial %llu, cold %llu, reused %ld; demotions %llu, promotions %llu, recomputed %llu, "
           "evicted %llu, host evicted %llu\n",
           name, (unsigned long long)out->st.hits, (unsigned long long)out->st.partial,
           (unsigned long long)out->st.cold, out->reused_sum, (unsigned long long)out->st.demotions,
           (unsigned long long)out->st.promotions, (unsigned long long)out->st.host_recomputed,
           (unsigned long long)out->st.evicted, (unsigned long long)out->st.host_evicted);
    squad_engine_free(e);
    CHECKF(src.put == src.got && src.out == 0, "%s: %d slabs got, %d given back", name, src.got, src.put);
    return rc;
}

/* The trace with room for everything (its working set), then through a device budget a quarter of
 * that without a host tier and with one of 1.25x the working set: the tier must give back every
 * restore the device budget lost it, never fewer. */
static void host_tier_agent_trace(squad_model *m, squad_engine *plain) {
    static agent_trace t;
    agent_trace_make(&t, squad_model_vocab_size(m));
    for (int end_only = 0; end_only <= 1; end_only++) {
        agent_run all, none, tier;
        char name[3][96];
        snprintf(name[0], sizeof name[0], "agent trace%s, room for all", end_only ? " (end only)" : "");
        snprintf(name[1], sizeof name[1], "agent trace%s, a quarter, no host tier", end_only ? " (end only)" : "");
        snprintf(name[2], sizeof name[2], "agent trace%s, a quarter, host tier", end_only ? " (end only)" : "");
        if (agent_replay(m, plain, &t, (size_t)1 << 30, 0, end_only, name[0], &all)) return;
        const size_t working = all.st.bytes_held;
        if (agent_replay(m, plain, &t, working / 4, 0, end_only, name[1], &none) ||
            agent_replay(m, plain, &t, working / 4, working + working / 4, end_only, name[2], &tier))
            return;
        CHECKF(none.st.evicted > 0, "%s: the quarter budget evicted nothing (%zu of %zu)", name[1], none.st.bytes_held,
               working);
        CHECKF(tier.st.demotions > 0 && tier.st.evicted == 0 && tier.st.host_evicted == 0,
               "%s: %llu demotions, %llu evicted, %llu host evicted", name[2], (unsigned long long)tier.st.demotions,
               (unsigned long long)tier.st.evicted, (unsigned long long)tier.st.host_evicted);
        CHECKF(tier.reused_sum >= none.reused_sum, "%s: %ld tokens reused, %ld without the tier", name[2],
               tier.reused_sum, none.reused_sum);
        CHECKF(tier.st.hits + tier.st.partial >= none.st.hits + none.st.partial, "%s: %llu rows restored, %llu without",
               name[2], (unsigned long long)(tier.st.hits + tier.st.partial),
               (unsigned long long)(none.st.hits + none.st.partial));
        /* nothing left either tier: the rows restore what the unbounded cache restores */
        CHECKF(tier.reused_sum == all.reused_sum, "%s: %ld tokens reused, %ld with room for all", name[2],
               tier.reused_sum, all.reused_sum);
        int lost = 0;
        for (int k = 0; k < AGENT_ROWS; k++) lost += tier.reused[k] < none.reused[k] || tier.reused[k] != all.reused[k];
        CHECKF(lost == 0, "%s: %d rows restored less than without the tier or with room for all", name[2], lost);
        /* the device budget lost states the rows came back for: they were promoted */
        CHECKF(tier.st.promotions > 0 && tier.reused_sum > none.reused_sum,
               "%s: %llu promotions, %ld tokens reused against %ld", name[2], (unsigned long long)tier.st.promotions,
               tier.reused_sum, none.reused_sum);
    }
}

/* The host tier over a slab source that is reserved, a slab about a state's blobs: the cache takes
 * its whole budget when the source is set, and rows demoting and promoting never take another
 * slab; the answers hold. Then a source that refuses part of the budget: the cache says so as
 * squad_cache_new would, and freeing the engine gives back every slab taken. */
static void host_tier_reserved(squad_model *m, squad_engine *plain) {
    const int V = squad_model_vocab_size(m);
    size_t one = 0;
    squad_engine *e = two_state_engine(m, &one);
    if (!e) return;
    const size_t host_budget = N_STATES * one + 1024;
    const size_t step = pool_aligned(one);
    slab_source src;
    source_init(&src, (size_t)1 << 30);
    squad_err err = {0};
    CHECK(squad_cache_debug_host_tier(e->cache, host_budget, 1, &err) == 0);
    const int rc = squad_cache_debug_tier_slabs(e->cache, source_get, source_put, &src, one, 1, &err);
    CHECKF(rc == 0, "reserved: %s", err.msg);
    const squad_tier_pool *pool = squad_cache_debug_tier_pool(e->cache);
    const int slabs = reserve_slabs(host_budget, step);
    squad_cache_stats st = {0};
    squad_engine_cache_stats(e, &st);
    CHECKF(src.got == slabs && st.host_slabs_reserved == (uint64_t)slabs && st.host_slabs_sync == 0 &&
               pool->slab_bytes == host_budget / SQUAD_TIER_POOL_ALIGN * SQUAD_TIER_POOL_ALIGN,
           "reserved: %d slabs got (%d expected), %llu reserved, %zu bytes of %zu", src.got, slabs,
           (unsigned long long)st.host_slabs_reserved, pool->slab_bytes, host_budget);
    CHECKF(st.host_reserve_seconds >= 0 && st.host_reserve_seconds < 10, "reserved in %.3f s", st.host_reserve_seconds);
    squad_result r, ref;
    trow row;
    for (int s = 0; s < N_STATES; s++) {
        row_make(&row, s, 0, V);
        if (score(e, &row.row, &r)) break;
        consistent(e, "reserved");
    }
    squad_engine_cache_stats(e, &st);
    printf("host tier reserved: %d slabs in %.6f s, demotions %llu, %llu slabs on demand, peak %zu of %zu\n", src.got,
           st.host_reserve_seconds, (unsigned long long)st.demotions, (unsigned long long)st.host_slabs_sync, src.peak,
           host_budget);
    CHECKF(st.demotions > 0 && st.host_slabs_sync == 0 && src.got == slabs && src.peak <= host_budget,
           "reserved: %llu demotions, %llu slabs on demand, %d got", (unsigned long long)st.demotions,
           (unsigned long long)st.host_slabs_sync, src.got);
    /* state 0 again, promoted from a reserved slab: the uncached answer */
    row_make(&row, 0, 1, V);
    if (!score(e, &row.row, &r) && !score(plain, &row.row, &ref))
        CHECKF(test_answer_diff(&row.row, &r, &ref) <= TOL_CPU_EXACT_CACHED && r.reused > 0,
               "reserved: %.3g from uncached, reused %d", test_answer_diff(&row.row, &r, &ref), r.reused);
    char why[256] = "";
    CHECKF(squad_tier_pool_check(pool, why, sizeof why) == 0, "reserved: pool: %s", why);
    squad_engine_cache_stats(e, &st);
    CHECK(st.host_slabs_sync == 0 && src.got == slabs);
    consistent(e, "reserved");
    squad_engine_free(e);
    CHECKF(src.put == src.got && src.out == 0, "reserved: %d slabs got, %d given back", src.got, src.put);

    /* a source that gives half the budget: the error squad_cache_new gives, every slab back */
    e = engine(m, 2 * one + 4096, NULL);
    if (!e) return;
    source_init(&src, host_budget / 2);
    memset(&err, 0, sizeof err);
    CHECK(squad_cache_debug_host_tier(e->cache, host_budget, 1, &err) == 0);
    CHECK(squad_cache_debug_tier_slabs(e->cache, source_get, source_put, &src, one, 1, &err) == SQUAD_E_NOMEM);
    CHECKF(err.code == SQUAD_E_NOMEM && strstr(err.msg, "host tier: could pin only") &&
               strstr(err.msg, "lower --cache-host-mb"),
           "reserve refused: code %d, \"%s\"", err.code, err.msg);
    CHECKF(src.got > 0 && src.got < slabs && src.refused == 1, "reserve refused: %d of %d slabs, %d refused", src.got,
           slabs, src.refused);
    consistent(e, "reserve refused");
    squad_engine_free(e);
    CHECKF(src.put == src.got && src.out == 0, "reserve refused: %d slabs got, %d given back", src.got, src.put);
}

/* A reserved host tier whose slabs hold a short state's K / V but not a long one's (as a group over
 * 256 MB is on the GPU): short states demoted first stay in host memory while the long states'
 * K / V, which no slab can hold, fail without evicting them (the long states' checkpoints go, as
 * without a tier); no slab is taken on demand, the cache stays consistent, and a short state
 * comes back by promotion with the uncached answer. */
#define SHORT_STATE 128
#define SHORT_STATES 3

static void host_tier_blob_over_slab(squad_model *m, squad_engine *plain) {
    const int V = squad_model_vocab_size(m);
    size_t one = 0;
    squad_engine *e = two_state_engine(m, &one);
    if (!e) return;
    const size_t kv_short = (size_t)SHORT_STATE * e->be->kv_bytes_per_pos;
    const size_t kv_long = (size_t)STATE_LEN * e->be->kv_bytes_per_pos;
    const size_t step = pool_aligned(kv_short);
    CHECKF(kv_long > step && e->be->gdn_snapshot_bytes <= step, "blob over a slab: K / V %zu and GDN %zu, slabs of %zu",
           kv_long, e->be->gdn_snapshot_bytes, step);
    const size_t host_budget = N_STATES * one + 1024;
    slab_source src;
    source_init(&src, (size_t)1 << 30);
    squad_err err = {0};
    const int rc = squad_cache_debug_host_tier(e->cache, host_budget, 1, &err) ||
                   squad_cache_debug_tier_slabs(e->cache, source_get, source_put, &src, step, 1, &err);
    CHECKF(rc == 0, "blob over a slab: %s", err.msg);
    const int slabs = src.got;
    squad_result r, ref;
    trow row;
    squad_cache_stats st = {0};
    for (int s = 0; s < SHORT_STATES + N_STATES; s++) { /* the short states first: the oldest */
        const int is_short = s < SHORT_STATES;
        row_make_len(&row, 100 + s, 0, V, is_short ? SHORT_STATE : STATE_LEN);
        if (score(e, &row.row, &r)) break;
        consistent(e, "blob over a slab");
        squad_engine_cache_stats(e, &st);
        CHECKF(st.host_bytes_held <= host_budget, "blob over a slab: %zu host bytes of %zu", st.host_bytes_held,
               host_budget);
    }
    squad_engine_cache_stats(e, &st);
    printf("host tier, K / V of %zu and %zu bytes over slabs of %zu: %llu demotions, %llu host checkpoints, %llu "
           "evicted, %llu host evicted\n",
           kv_short, kv_long, step, (unsigned long long)st.demotions, (unsigned long long)st.host_checkpoints,
           (unsigned long long)st.evicted, (unsigned long long)st.host_evicted);
    CHECKF(st.host_checkpoints > 0 && st.host_evicted > 0 && st.host_slabs_sync == 0 && src.got == slabs,
           "blob over a slab: %llu host checkpoints, %llu host evicted, %llu slabs on demand",
           (unsigned long long)st.host_checkpoints, (unsigned long long)st.host_evicted,
           (unsigned long long)st.host_slabs_sync);
    const squad_tier_pool *pool = squad_cache_debug_tier_pool(e->cache);
    char why[256] = "";
    CHECKF(squad_tier_pool_check(pool, why, sizeof why) == 0, "blob over a slab: pool %s", why);
    /* the oldest short state again: still in host memory, promoted */
    row_make_len(&row, 100, 1, V, SHORT_STATE);
    const squad_cache_stats before = st;
    if (!score(e, &row.row, &r) && !score(plain, &row.row, &ref)) {
        squad_engine_cache_stats(e, &st);
        CHECKF(test_answer_diff(&row.row, &r, &ref) <= TOL_CPU_EXACT_CACHED && r.reused == SHORT_STATE &&
                   st.promotions > before.promotions,
               "blob over a slab: %.3g from uncached, reused %d, %llu promotions", test_answer_diff(&row.row, &r, &ref),
               r.reused, (unsigned long long)(st.promotions - before.promotions));
    }
    consistent(e, "blob over a slab");
    squad_engine_free(e);
    CHECK(src.put == src.got && src.out == 0);
}

/* A backend double for squad_cache_new: the CPU backend's figures with the host tier's hooks of a
 * device backend, whose page-locked memory gives out after `limit` bytes. The slabs are never
 * touched by the cache (descriptors live outside them), so small stand-ins carry the count. */
typedef struct pin_double {
    squad_backend be;
    size_t limit, pinned;
    int got, released;
} pin_double;

static void *pin_alloc(squad_backend *be, size_t bytes, squad_err *err) {
    pin_double *d = (pin_double *)be;
    if (bytes > d->limit - d->pinned) {
        squad_fail(err, SQUAD_E_NOMEM, "pin double: out of page-locked memory");
        return NULL;
    }
    void *p = malloc(16);
    if (!p) return NULL;
    d->pinned += bytes;
    d->got++;
    return p;
}

static void pin_release(squad_backend *be, void *p) {
    pin_double *d = (pin_double *)be;
    d->released++;
    free(p);
}

static int pin_copy(squad_backend *be, void *dst, const void *src, size_t bytes, squad_err *err) {
    (void)be, (void)err;
    memcpy(dst, src, bytes);
    return 0;
}

/* squad_cache_new over a backend that pins: the whole host budget is reserved at creation (its
 * stats say how many slabs and how long), and a budget the system cannot pin fails the creation
 * with the message the server shows, leaving nothing pinned. */
static void host_tier_reserve_at_creation(squad_model *m) {
    const size_t mb = 1 << 20, budget = 600 * mb; /* two 256 MB slabs and 88 MB */
    squad_engine *cpu = engine(m, mb, NULL);
    if (!cpu) return;
    pin_double d;
    memset(&d, 0, sizeof d);
    d.be = *squad_cache_backend(cpu->cache);
    d.be.host_alloc = pin_alloc;
    d.be.host_release = pin_release;
    d.be.blob_to_host = pin_copy;
    d.be.blob_from_host = pin_copy;
    d.be.tier_sync = NULL;
    d.limit = (size_t)1 << 40;
    squad_cache_opts o = cpu->opts.cache;
    o.host_budget_bytes = budget;
    squad_err err = {0};
    squad_cache *c = squad_cache_new(&d.be, &o, &err);
    CHECKF(c != NULL, "cache over pinned slabs: %s", err.msg);
    if (c) {
        squad_cache_stats st;
        squad_cache_get_stats(c, &st);
        CHECKF(d.got == 3 && d.pinned == budget && st.host_slabs_reserved == 3 && st.host_slabs_sync == 0 &&
                   st.host_budget_bytes == budget && st.host_reserve_seconds >= 0,
               "reserved at creation: %d slabs, %zu bytes pinned, %llu reserved", d.got, d.pinned,
               (unsigned long long)st.host_slabs_reserved);
        squad_cache_free(c);
        CHECKF(d.released == d.got, "reserved at creation: %d of %d slabs given back", d.released, d.got);
    }
    /* 300 MB of page-locked memory for a 600 MB budget: one slab, then the refusal */
    memset(&err, 0, sizeof err);
    d.limit = 300 * mb;
    d.pinned = 0;
    d.got = d.released = 0;
    c = squad_cache_new(&d.be, &o, &err);
    CHECKF(c == NULL && err.code == SQUAD_E_NOMEM &&
               strstr(err.msg, "host tier: could pin only 256 of 600 MB of host memory") &&
               strstr(err.msg, "lower --cache-host-mb"),
           "refused at creation: code %d, \"%s\"", err.code, err.msg);
    CHECKF(d.got == 1 && d.released == 1, "refused at creation: %d slabs pinned, %d given back", d.got, d.released);
    squad_cache_free(c);
    squad_engine_free(cpu);
    printf("host tier at creation: \"%s\"\n", err.msg);
}

/* Without the test hook the CPU backend has no host tier: its blobs are host memory already. */
static void host_tier_off_on_cpu(squad_model *m) {
    /* asked for in MB, and asked to be sized from the machine (the server's default) */
    const size_t asks[2] = {(size_t)64 << 20, SQUAD_CACHE_HOST_AUTO};
    for (int i = 0; i < 2; i++) {
        squad_engine_opts o;
        squad_engine_opts_default(&o);
        o.device = SQUAD_DEVICE_CPU;
        o.threads = 1;
        o.cache.host_budget_bytes = asks[i];
        squad_err err = {0};
        squad_engine *e = squad_engine_new(m, &o, &err);
        CHECKF(e != NULL, "engine with host budget %zu: %s", asks[i], err.msg);
        if (!e) continue;
        squad_cache_stats st;
        squad_engine_cache_stats(e, &st);
        CHECKF(st.host_budget_bytes == 0 && st.budget_bytes == o.cache.budget_bytes,
               "the CPU backend reports a host tier of %zu bytes (asked %zu), device budget %zu", st.host_budget_bytes,
               asks[i], st.budget_bytes);
        squad_engine_free(e);
    }
}

/* ---- the disk tier ------------------------------------------------------------------------- */

static void copy_file(const char *from, const char *to, long keep, long flip_at) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    CHECK(a && b);
    if (!a || !b) {
        if (a) fclose(a);
        if (b) fclose(b);
        return;
    }
    long i = 0;
    int ch;
    while ((ch = fgetc(a)) != EOF && (keep < 0 || i < keep)) {
        if (i == flip_at) ch ^= 0x10;
        fputc(ch, b);
        i++;
    }
    fclose(a);
    fclose(b);
}

static long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

static squad_cache_store_opts store_opts(const char *dir, const char *tok) {
    squad_cache_store_opts o;
    memset(&o, 0, sizeof o);
    o.dir = dir;
    o.tokenizer_path = tok;
    return o;
}

/* Loads dir into a fresh engine on m: the checkpoints adopted. */
static uint64_t load_into(squad_engine *e, const char *dir, const char *tok, squad_cache_store_stats *st) {
    squad_cache_store_opts o = store_opts(dir, tok);
    squad_err err = {0};
    const int rc = squad_engine_cache_load(e, &o, st, &err);
    CHECKF(rc == 0, "load %s: %s", dir, err.msg);
    consistent(e, "after a load");
    return st->checkpoints;
}

static void disk_tier(squad_model *m, squad_model *other, squad_engine *plain) {
    const int V = squad_model_vocab_size(m);
    char dir[600], tok[600], tok2[600], path[700], bad[700];
    snprintf(dir, sizeof dir, "%s/store", test_tmpdir());
    snprintf(tok, sizeof tok, "%s/tokenizer-a.json", test_tmpdir());
    snprintf(tok2, sizeof tok2, "%s/tokenizer-b.json", test_tmpdir());
    FILE *f = fopen(tok, "w");
    if (f) fputs("{\"a\": 1}", f), fclose(f);
    f = fopen(tok2, "w");
    if (f) fputs("{\"a\": 2}", f), fclose(f);
    snprintf(path, sizeof path, "%s/squad-cache.bin", dir);

    squad_engine *a = engine(m, (size_t)1 << 30, NULL);
    if (!a) return;
    trow row;
    squad_result r, ra, rb;
    for (int s = 0; s < 3; s++) {
        row_make(&row, s, 0, V);
        score(a, &row.row, &r);
    }
    squad_cache_store_opts o = store_opts(dir, tok);
    squad_cache_store_stats st;
    squad_err err = {0};
    CHECKF(squad_engine_cache_save(a, &o, &st, &err) == 0, "save: %s", err.msg);
    squad_cache_stats cs;
    squad_engine_cache_stats(a, &cs);
    CHECKF(st.checkpoints == cs.checkpoints && st.groups == cs.groups && cs.disk_saved == st.checkpoints,
           "saved %llu checkpoints / %llu groups of %llu / %llu", (unsigned long long)st.checkpoints,
           (unsigned long long)st.groups, (unsigned long long)cs.checkpoints, (unsigned long long)cs.groups);
    CHECK(file_size(path) == (long)st.bytes);
    const uint64_t saved = st.checkpoints;
    row_make(&row, 1, 7, V); /* a new question on state 1 */
    score(a, &row.row, &ra);

    /* the same model, a new engine: everything loads, the question is a hit, identical */
    squad_engine *b = engine(m, (size_t)1 << 30, NULL);
    if (b) {
        CHECKF(load_into(b, dir, tok, &st) == saved, "loaded %llu of %llu", (unsigned long long)st.checkpoints,
               (unsigned long long)saved);
        CHECK(st.refused == 0);
        score(b, &row.row, &rb);
        squad_engine_cache_stats(b, &cs);
        CHECKF(cs.hits == 1 && rb.reused == ra.reused && rb.reused == 320, "after a restart: hits %llu, reused %d",
               (unsigned long long)cs.hits, rb.reused);
        CHECK(memcmp(ra.probs, rb.probs, sizeof ra.probs) == 0);
        CHECK(cs.disk_loaded == saved);
        /* a second load of the same file adopts nothing new (held already) */
        load_into(b, dir, tok, &st);
        CHECK(st.checkpoints == 0 && st.skipped == saved);
        squad_engine_free(b);
    }
    /* a small budget keeps the most recent states */
    b = engine(m, state_cost(a) + 4096, NULL);
    if (b) {
        load_into(b, dir, tok, &st);
        CHECKF(st.checkpoints == 2 && st.skipped == saved - 2, "small budget: %llu loaded, %llu skipped",
               (unsigned long long)st.checkpoints, (unsigned long long)st.skipped);
        row_make(&row, 2, 9, V); /* state 2 was the most recent */
        score(b, &row.row, &rb);
        CHECKF(rb.reused == 320, "small budget: the most recent state reused %d", rb.reused);
        squad_engine_free(b);
    }
    /* another tokenizer file: refused whole */
    b = engine(m, (size_t)1 << 30, NULL);
    if (b) {
        CHECK(load_into(b, dir, tok2, &st) == 0);
        CHECK(st.refused == saved + st.groups || st.refused > 0);
        squad_engine_cache_stats(b, &cs);
        CHECK(cs.disk_refused > 0 && cs.checkpoints == 0);
        squad_engine_free(b);
    }
    /* another model (another synth seed) */
    if (other) {
        b = engine(other, (size_t)1 << 30, NULL);
        if (b) {
            CHECK(load_into(b, dir, tok, &st) == 0);
            CHECK(st.refused > 0);
            row_make(&row, 1, 7, squad_model_vocab_size(other));
            score(b, &row.row, &rb);
            CHECK(rb.reused == 0);
            squad_engine_free(b);
        }
    }
    /* truncated files: every cut loads only the records before it, each answering correctly */
    const long size = file_size(path);
    snprintf(bad, sizeof bad, "%s/bad", test_tmpdir());
    mkdir(bad, 0755);
    char bad_path[800];
    snprintf(bad_path, sizeof bad_path, "%s/squad-cache.bin", bad);
    const long cuts[] = {0, 10, 64, 64 + 20, size / 3, size / 2, size - 1};
    uint64_t last = 0;
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        copy_file(path, bad_path, cuts[i], -1);
        b = engine(m, (size_t)1 << 30, NULL);
        if (!b) continue;
        const uint64_t n = load_into(b, bad, tok, &st);
        CHECKF(n < saved && n >= last, "cut at %ld: %llu loaded", cuts[i], (unsigned long long)n);
        CHECKF(st.refused >= 1 || cuts[i] == 0 || cuts[i] == 64, "cut at %ld: nothing refused", cuts[i]);
        last = n;
        for (int s = 0; s < 3; s++) { /* whatever loaded answers as the uncached engine */
            row_make(&row, s, 3, V);
            if (score(b, &row.row, &rb) == 0 && score(plain, &row.row, &r) == 0)
                CHECKF(test_answer_diff(&row.row, &rb, &r) <= TOL_CPU_EXACT_CACHED, "cut at %ld, state %d", cuts[i], s);
        }
        squad_engine_free(b);
    }
    /* bit flips: in the header, in a record header, in a group payload, in a checkpoint payload */
    const long flips[] = {20, 64 + 9, 64 + 32 + 100, size - 100};
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        copy_file(path, bad_path, -1, flips[i]);
        b = engine(m, (size_t)1 << 30, NULL);
        if (!b) continue;
        const uint64_t n = load_into(b, bad, tok, &st);
        CHECKF(n < saved && st.refused >= 1, "flip at %ld: %llu loaded, %llu refused", flips[i],
               (unsigned long long)n, (unsigned long long)st.refused);
        if (i == 3) CHECKF(n == saved - 1, "a flip in the last checkpoint: %llu loaded", (unsigned long long)n);
        for (int s = 0; s < 3; s++) {
            row_make(&row, s, 4, V);
            if (score(b, &row.row, &rb) == 0 && score(plain, &row.row, &r) == 0)
                CHECKF(test_answer_diff(&row.row, &rb, &r) <= TOL_CPU_EXACT_CACHED, "flip at %ld, state %d", flips[i], s);
        }
        squad_engine_free(b);
    }
    /* a missing directory loads nothing and is no error */
    b = engine(m, (size_t)1 << 30, NULL);
    if (b) {
        char none[700];
        snprintf(none, sizeof none, "%s/none", test_tmpdir());
        CHECK(load_into(b, none, tok, &st) == 0 && st.refused == 0);
        squad_engine_free(b);
    }
    squad_engine_free(a);
}

/* Another specialists set (another seed) on the same model gets nothing from a file. */
static void disk_tier_specialists(squad_model *m) {
    const int V = squad_model_vocab_size(m);
    squad_specialists *sp[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        char d[600];
        snprintf(d, sizeof d, "%s/spec%d", test_tmpdir(), i);
        squad_spec_synth_opts so;
        squad_spec_synth_defaults(&m->cfg, &so);
        so.out_dir = d;
        so.seed = 100 + (uint64_t)i;
        squad_err err = {0};
        if (squad_spec_synth_write(&m->cfg, &so, &err) || !(sp[i] = squad_specialists_load(m, d, &err))) {
            CHECKF(0, "specialists: %s", err.msg);
            goto done;
        }
    }
    char dir[600];
    snprintf(dir, sizeof dir, "%s/store-spec", test_tmpdir());
    squad_engine *a = engine(m, (size_t)1 << 30, sp[0]);
    squad_engine *b = engine(m, (size_t)1 << 30, sp[0]);
    squad_engine *c = engine(m, (size_t)1 << 30, sp[1]);
    if (a && b && c) {
        trow row;
        squad_result r, ra, rb;
        row_make(&row, 0, 0, V);
        score(a, &row.row, &r);
        squad_cache_store_opts o = store_opts(dir, NULL);
        squad_cache_store_stats st;
        squad_err err = {0};
        CHECKF(squad_engine_cache_save(a, &o, &st, &err) == 0, "save: %s", err.msg);
        const uint64_t saved = st.checkpoints;
        CHECK(saved > 0);
        row_make(&row, 0, 1, V);
        score(a, &row.row, &ra);
        CHECK(load_into(b, dir, NULL, &st) == saved); /* the same set: a hit, the same answer and route */
        score(b, &row.row, &rb);
        CHECK(rb.reused == ra.reused && rb.reused > 0 && rb.route == ra.route);
        CHECK(memcmp(ra.probs, rb.probs, sizeof ra.probs) == 0);
        CHECK(load_into(c, dir, NULL, &st) == 0 && st.refused > 0); /* another set: nothing */
    }
    squad_engine_free(a);
    squad_engine_free(b);
    squad_engine_free(c);
done:
    squad_specialists_free(sp[0]);
    squad_specialists_free(sp[1]);
}

int main(void) {
    tier_pool_unit();
    tier_pool_reserve_unit();
    cost_model_unit();
    squad_model *m = synth_model("model-a", 1);
    squad_model *other = synth_model("model-b", 2);
    if (!m) return test_summary("test_cache_tiers");
    squad_engine *plain = engine(m, 0, NULL);
    if (plain) {
        /* every state fits the host tier: promoted back */
        host_tier_case(m, plain, "host tier, promote", N_STATES, 1, 0);
        /* every state fits the host tier, promotion refused: recomputed from the device's */
        host_tier_case(m, plain, "host tier, recompute", N_STATES, -1, 0);
        /* the cost model decides (either way the answer holds) */
        host_tier_case(m, plain, "host tier, cost model", N_STATES, 0, 0);
        /* the cost model with a copy too fast to lose, then one too slow to win */
        host_tier_case(m, plain, "host tier, cost model, fast copy", N_STATES, 0, 1e15);
        host_tier_case(m, plain, "host tier, cost model, slow copy", N_STATES, 0, 1.0);
        /* a host tier of one state: state 0 falls out of both tiers */
        host_tier_case(m, plain, "host tier, both evicted", 1, 1, 0);
        host_tier_reserved(m, plain);
        host_tier_reserve_at_creation(m);
        host_tier_blob_over_slab(m, plain);
        host_tier_agent_trace(m, plain);
        host_tier_off_on_cpu(m);
        disk_tier(m, other, plain);
        disk_tier_specialists(m);
    }
    squad_engine_free(plain);
    squad_model_free(other);
    squad_model_free(m);
    return test_summary("test_cache_tiers");
}
