/*
 * gpu_test_tiers.c — the state cache's host tier on the CUDA backend (docs/design.md section 7,
 * "Tiers"), and the figure: restoring a 4,096-token state from host memory against
 * recomputing it.
 *
 *  - equality: on a synthesized model (the demo preset) with a device budget of one state and a
 *    host tier, states 0..3 cached in turn (0 demoted to pinned host memory), then a new question
 *    on state 0 promotes it back: the answer equals that of an engine that never evicted it (the
 *    same restore point: identical), the cache stays consistent, and the host tier within its
 *    budget; then with promotion refused (the test hook) the row recomputes and answers within
 *    TOL_CUDA_EXACT_CACHED of the uncached engine;
 *  - the figure: on SQUAD_TIERS_MODEL (tools/gpu_run.sh passes the 0.8B preset; default the demo
 *    preset), bf16, a 4,096-token state cached, demoted (a second state through a device budget of
 *    one), then restored by a hit the cost model chose (it must: the copy is far cheaper than the
 *    tokens), against the same hit with the state still on the device (the difference is the
 *    restore) and a cold row of the same length (best of a few); printed with the bytes moved and
 *    the bandwidth the backend measured;
 *  - the breakdown: what a restore's pieces cost alone on a state's bytes — pinning host memory
 *    (cudaHostAlloc: once per slab, all of them when the cache is made) and unpinning it, a device
 *    blob's alloc and release (the backend's pool), the copies up and down (queued, then one sync)
 *    — so a slow restore shows which piece it is;
 *  - the stall probe (test_stall): per-row times of fresh rows through a small device budget without
 *    a host tier and with one (its budget pinned when the cache was made: no pin during the passes,
 *    a first pass and a second on new states), the seconds that pin took, and hits alone against
 *    hits beside a thread pinning host memory (what pinning while serving costs the engine).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cache_internal.h"
#include "engine.h"
#include "squad.h"
#include "synth.h"
#include "testutil.h"
#include "tier_pool.h"
#include "tolerances.h"
#include "util.h"

#ifdef SQUAD_HAVE_CUDA

#define EQ_STATE 1024
#define FIG_STATE 4096
#define QUESTION 16
#define COLD_REPEATS 3

typedef struct grow {
    int32_t *ids;
    int32_t slots[2], nopts[2], letters[4];
    squad_row row;
} grow;

static void fill(int32_t *v, int n, uint64_t seed, int vocab) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 11;
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        v[i] = (int32_t)(x % (uint64_t)vocab);
    }
}

static int grow_make(grow *r, int state_len, int state, int q, int vocab) {
    const int n = state_len + QUESTION;
    r->ids = malloc((size_t)n * sizeof *r->ids);
    if (!r->ids) return -1;
    fill(r->ids, state_len, 1000 + (uint64_t)state, vocab);
    fill(r->ids + state_len, QUESTION, 7000 + (uint64_t)state * 31 + (uint64_t)q, vocab);
    r->slots[0] = n - 2;
    r->slots[1] = n - 1;
    r->nopts[0] = 2;
    r->nopts[1] = 4;
    for (int l = 0; l < 4; l++) r->letters[l] = l + 1;
    r->row = (squad_row){r->ids, n, r->slots, r->nopts, 2, r->letters, 4, state_len, 0, NULL, 0};
    return 0;
}

static squad_engine *cuda_engine(squad_model *m, squad_precision prec, size_t budget, size_t host) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = SQUAD_DEVICE_CUDA;
    o.precision = prec;
    o.cache.budget_bytes = budget;
    o.cache.host_budget_bytes = host;
    o.max_tokens = squad_model_max_tokens(m) < 8192 ? 0 : 8192;
    squad_err err = {0};
    squad_engine *e = squad_engine_new(m, &o, &err);
    CHECKF(e != NULL, "engine: %s", err.msg);
    return e;
}

static int score(squad_engine *e, const squad_row *row, squad_result *out) {
    squad_err err = {0};
    const int rc = squad_engine_score(e, row, out, &err);
    CHECKF(rc == 0, "score: %s", err.msg);
    return rc;
}

/* The bytes a state of n positions costs in the cache (its group and its checkpoints at most). */
static size_t state_budget(squad_engine *e, int n) {
    return squad_cache_group_cost(e->cache, n) + 4 * squad_cache_ckpt_cost(e->cache) + 4096;
}

static void test_equality(squad_model *m, int force) {
    const int V = squad_model_vocab_size(m);
    squad_engine *probe = cuda_engine(m, SQUAD_PRECISION_EXACT, (size_t)1 << 30, 0);
    if (!probe) return;
    const size_t one = state_budget(probe, EQ_STATE);
    squad_engine_free(probe);
    squad_engine *e = cuda_engine(m, SQUAD_PRECISION_EXACT, one, 8 * one);
    squad_engine *big = cuda_engine(m, SQUAD_PRECISION_EXACT, (size_t)1 << 30, 0);
    squad_engine *plain = cuda_engine(m, SQUAD_PRECISION_EXACT, 0, 0);
    if (!e || !big || !plain) goto done;
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    CHECKF(st.host_budget_bytes == 8 * one, "the CUDA backend's host tier: %zu bytes", st.host_budget_bytes);
    CHECK(e->be->blob_to_host != NULL && e->be->host_copy_bytes_per_s > 0);
    squad_err err = {0};
    if (force) CHECKF(squad_cache_debug_host_tier(e->cache, 8 * one, force, &err) == 0, "host tier: %s", err.msg);
    grow r;
    squad_result a, b, c;
    for (int s = 0; s < 4; s++) {
        if (grow_make(&r, EQ_STATE, s, 0, V)) break;
        score(e, &r.row, &a);
        if (s == 0) score(big, &r.row, &b);
        free(r.ids);
        char why[256] = "";
        CHECKF(squad_cache_check(e->cache, why, sizeof why) == 0, "after state %d: %s", s, why);
    }
    squad_engine_cache_stats(e, &st);
    CHECKF(st.demotions > 0 && st.host_checkpoints > 0, "demotions %llu, host checkpoints %llu",
           (unsigned long long)st.demotions, (unsigned long long)st.host_checkpoints);
    CHECKF(st.host_slabs_reserved > 0 && st.host_slabs_sync == 0, "host slabs: %llu reserved, %llu on demand",
           (unsigned long long)st.host_slabs_reserved, (unsigned long long)st.host_slabs_sync);
    CHECK(st.host_bytes_held <= st.host_budget_bytes);
    if (grow_make(&r, EQ_STATE, 0, 1, V) == 0) {
        const uint64_t promotions = st.promotions;
        score(e, &r.row, &a);
        score(big, &r.row, &b);
        score(plain, &r.row, &c);
        squad_engine_cache_stats(e, &st);
        if (force >= 0) {
            CHECKF(st.promotions > promotions && a.reused == b.reused, "promotions %llu, reused %d vs %d",
                   (unsigned long long)st.promotions, a.reused, b.reused);
            CHECKF(memcmp(a.probs, b.probs, sizeof a.probs) == 0, "promoted vs never evicted: %.3g", test_answer_diff(&r.row, &a, &b));
        } else {
            CHECKF(st.host_recomputed > 0 && a.reused < b.reused, "recomputed %llu, reused %d",
                   (unsigned long long)st.host_recomputed, a.reused);
        }
        CHECKF(test_answer_diff(&r.row, &a, &c) <= TOL_CUDA_EXACT_CACHED, "against uncached: %.3g", test_answer_diff(&r.row, &a, &c));
        char why[256] = "";
        CHECKF(squad_cache_check(e->cache, why, sizeof why) == 0, "after the promotion: %s", why);
        free(r.ids);
    }
    printf("equality (%s): demotions %llu, promotions %llu, recomputed %llu\n", force >= 0 ? "promote" : "recompute",
           (unsigned long long)st.demotions, (unsigned long long)st.promotions, (unsigned long long)st.host_recomputed);
done:
    squad_engine_free(e);
    squad_engine_free(big);
    squad_engine_free(plain);
}

/* Wall milliseconds since t. */
static double ms_since(double t) { return (squad_now_seconds() - t) * 1e3; }

/* The pieces of a restore of `gdn` + `kv` bytes, each timed alone on the backend's hooks. */
static void breakdown(squad_backend *be, size_t gdn, size_t kv) {
    squad_err err = {0};
    const size_t bytes = gdn + kv;
    double t = squad_now_seconds();
    unsigned char *host = be->host_alloc(be, bytes, &err);
    const double pin_ms = ms_since(t);
    CHECKF(host != NULL, "host_alloc: %s", err.msg);
    if (!host) return;
    memset(host, 1, bytes);
    t = squad_now_seconds();
    void *g = be->alloc(be, gdn, &err), *k = be->alloc(be, kv, &err);
    const double alloc_ms = ms_since(t);
    CHECKF(g && k, "alloc: %s", err.msg);
    double up_ms = 0, down_ms = 0, queue_ms = 0;
    if (g && k) {
        for (int rep = 0; rep < 2; rep++) { /* the second is timed: the first warms the path */
            t = squad_now_seconds();
            int rc = be->blob_from_host(be, g, host, gdn, &err);
            if (!rc) rc = be->blob_from_host(be, k, host + gdn, kv, &err);
            queue_ms = ms_since(t);
            if (!rc) rc = be->tier_sync(be, &err);
            up_ms = ms_since(t);
            CHECKF(rc == 0, "copy up: %s", err.msg);
            t = squad_now_seconds();
            rc = be->blob_to_host(be, host, g, gdn, &err);
            if (!rc) rc = be->blob_to_host(be, host + gdn, k, kv, &err);
            if (!rc) rc = be->tier_sync(be, &err);
            down_ms = ms_since(t);
            CHECKF(rc == 0, "copy down: %s", err.msg);
        }
    }
    t = squad_now_seconds();
    be->release(be, g);
    be->release(be, k);
    const double release_ms = ms_since(t);
    t = squad_now_seconds();
    be->host_release(be, host);
    const double unpin_ms = ms_since(t);
    printf("breakdown of %.1f MB: pin host memory %.3f ms and unpin %.3f ms (now once per %zu MB slab), device "
           "alloc %.3f ms and release %.3f ms (2 blobs, the backend's pool), copy up %.3f ms (%.1f GB/s; queueing "
           "it %.3f ms), copy down %.3f ms (%.1f GB/s)\n",
           (double)bytes / 1e6, pin_ms, unpin_ms, SQUAD_TIER_POOL_STEP >> 20, alloc_ms, release_ms, up_ms,
           (double)bytes / (up_ms * 1e-3) / 1e9, queue_ms, down_ms, (double)bytes / (down_ms * 1e-3) / 1e9);
}

/* The figure: restore of a FIG_STATE-token state from host memory against recomputing it. */
static void test_figure(squad_model *m, const char *name) {
    const int V = squad_model_vocab_size(m);
    squad_engine *probe = cuda_engine(m, SQUAD_PRECISION_BF16, (size_t)1 << 30, 0);
    if (!probe) return;
    const size_t one = state_budget(probe, FIG_STATE);
    const size_t gdn = probe->be->gdn_snapshot_bytes, kvb = probe->be->kv_bytes_per_pos;
    squad_engine_free(probe);
    squad_engine *e = cuda_engine(m, SQUAD_PRECISION_BF16, one, 4 * one);
    squad_engine *cold = cuda_engine(m, SQUAD_PRECISION_BF16, 0, 0);
    if (!e || !cold) goto done;
    grow r0, r1, q, q2;
    if (grow_make(&r0, FIG_STATE, 0, 0, V) || grow_make(&r1, FIG_STATE, 1, 0, V) || grow_make(&q, FIG_STATE, 0, 1, V) ||
        grow_make(&q2, FIG_STATE, 0, 2, V))
        goto done;
    squad_result out;
    score(e, &r0.row, &out);
    score(e, &r1.row, &out); /* state 0 goes down to the host tier */
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    const double p0 = st.promote_seconds;
    double t = squad_now_seconds();
    score(e, &q.row, &out);
    const double hit_s = squad_now_seconds() - t;
    squad_engine_cache_stats(e, &st);
    const double promote_host_s = st.promote_seconds - p0;
    CHECKF(out.reused == FIG_STATE && st.promotions >= 1,
           "figure: the cost model did not restore (reused %d, promotions %llu, recomputed %llu)", out.reused,
           (unsigned long long)st.promotions, (unsigned long long)st.host_recomputed);
    /* the same hit with the state on the device now: what the restore added is the difference */
    t = squad_now_seconds();
    score(e, &q2.row, &out);
    const double device_hit_s = squad_now_seconds() - t;
    double cold_s = 1e9;
    for (int i = 0; i < COLD_REPEATS; i++) {
        t = squad_now_seconds();
        score(cold, &q.row, &out);
        const double dt = squad_now_seconds() - t;
        if (dt < cold_s) cold_s = dt;
    }
    const double bytes = (double)gdn + (double)FIG_STATE * (double)kvb;
    const double restore_s = hit_s - device_hit_s;
    printf("figure (%s, bf16): a %d-token state, %.1f MB (GDN %.1f MB + K/V %.1f MB): restore from host %.3f ms "
           "(the hit's row %.3f ms from host - %.3f ms from the device; %.1f GB/s; the backend's bandwidth %.1f GB/s; "
           "the host thread spent %.3f ms queueing it), recompute (cold row, best of %d) %.3f ms; %llu demotions "
           "queued in %.3f ms\n",
           name, FIG_STATE, bytes / 1e6, (double)gdn / 1e6, (double)FIG_STATE * (double)kvb / 1e6, restore_s * 1e3,
           hit_s * 1e3, device_hit_s * 1e3, restore_s > 0 ? bytes / restore_s / 1e9 : 0.0,
           e->be->host_copy_bytes_per_s / 1e9, promote_host_s * 1e3, COLD_REPEATS, cold_s * 1e3,
           (unsigned long long)st.demotions, st.demote_seconds * 1e3);
    breakdown(e->be, gdn, (size_t)FIG_STATE * kvb);
    free(r0.ids);
    free(r1.ids);
    free(q.ids);
    free(q2.ids);
done:
    squad_engine_free(e);
    squad_engine_free(cold);
}

/* ---- the stall probe: where a demotion's time goes on the scheduler's thread ------------------- */

#define STALL_STATE 1024 /* tokens of each state: short, so a row is a few ms and a stall shows */
#define STALL_ROWS 24    /* distinct states a pass: each row past the device budget demotes or evicts one */
#define STALL_HITS 20    /* hits timed with and without a thread pinning host memory beside them */

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median and max of v[0..n) (v is sorted). */
static void med_max(double *v, int n, double *med, double *max) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    *med = n ? v[n / 2] : 0;
    *max = n ? v[n - 1] : 0;
}

/* One pass of STALL_ROWS fresh states (first + i) through e: each row's wall ms into ms[]; the cache
 * stats' demotions and demote seconds moved by the pass. */
static void stall_pass(squad_engine *e, int first, int vocab, double *ms, unsigned long long *demotions,
                       double *demote_ms) {
    squad_cache_stats st0, st1;
    squad_engine_cache_stats(e, &st0);
    for (int i = 0; i < STALL_ROWS; i++) {
        grow r;
        ms[i] = 0;
        if (grow_make(&r, STALL_STATE, first + i, 0, vocab)) return;
        squad_result out;
        const double t = squad_now_seconds();
        score(e, &r.row, &out);
        ms[i] = ms_since(t);
        free(r.ids);
    }
    squad_engine_cache_stats(e, &st1);
    *demotions = (unsigned long long)(st1.demotions - st0.demotions);
    *demote_ms = (st1.demote_seconds - st0.demote_seconds) * 1e3;
}

typedef struct pinner {
    squad_backend *be;
    volatile int stop;
    int pins;
    double pin_ms;
} pinner;

/* Pins and unpins a slab at a time until told to stop (what pinning while serving would do: why the
 * host tier pins its whole budget when the cache is made). */
static void *pinner_main(void *arg) {
    pinner *p = arg;
    while (!p->stop) {
        squad_err err = {0};
        const double t = squad_now_seconds();
        void *h = p->be->host_alloc(p->be, SQUAD_TIER_POOL_STEP, &err);
        p->pin_ms += ms_since(t);
        if (!h) break;
        p->pins++;
        p->be->host_release(p->be, h);
    }
    return NULL;
}

/* Hits on one cached state, STALL_HITS of them timed, with a thread pinning beside them or not. */
static void stall_hits(squad_engine *e, int vocab, int with_pinner, double *med, double *max, int *pins) {
    const int q0 = with_pinner ? 1 + STALL_HITS : 1; /* new questions each time: no memo hit */
    double ms[STALL_HITS];
    pinner p = {e->be, 0, 0, 0};
    pthread_t th;
    const int started = with_pinner && pthread_create(&th, NULL, pinner_main, &p) == 0;
    for (int i = 0; i < STALL_HITS; i++) {
        grow q;
        ms[i] = 0;
        if (grow_make(&q, STALL_STATE, 999, q0 + i, vocab)) break;
        squad_result out;
        const double t = squad_now_seconds();
        score(e, &q.row, &out);
        ms[i] = ms_since(t);
        free(q.ids);
    }
    if (started) {
        p.stop = 1;
        pthread_join(th, NULL);
    }
    *pins = p.pins;
    med_max(ms, STALL_HITS, med, max);
}

/* Where a demotion's time on the scheduler's thread goes: the same fresh rows through a device budget
 * of two states without a host tier (evicted), and with one whose budget was pinned when the cache
 * was made (a first pass, then a second on new states); then hits alone against hits while another
 * thread pins host memory. Printed, one line each. */
static void test_stall(squad_model *m, const char *name) {
    const int V = squad_model_vocab_size(m);
    squad_engine *probe = cuda_engine(m, SQUAD_PRECISION_BF16, (size_t)1 << 30, 0);
    if (!probe) return;
    const size_t one = state_budget(probe, STALL_STATE);
    squad_engine_free(probe);
    squad_engine *a = cuda_engine(m, SQUAD_PRECISION_BF16, 2 * one, 0);
    squad_engine *b = cuda_engine(m, SQUAD_PRECISION_BF16, 2 * one, (size_t)(3 * STALL_ROWS) * one);
    if (!a || !b) goto done;
    double ms[3][STALL_ROWS];
    unsigned long long dem[3];
    double dem_ms[3];
    stall_pass(a, 0, V, ms[0], &dem[0], &dem_ms[0]);
    stall_pass(b, 0, V, ms[1], &dem[1], &dem_ms[1]);
    stall_pass(b, STALL_ROWS, V, ms[2], &dem[2], &dem_ms[2]);
    CHECKF(dem[0] == 0 && dem[1] > 0 && dem[2] > 0, "stall probe: demotions %llu / %llu / %llu", dem[0], dem[1], dem[2]);
    squad_cache_stats st;
    squad_engine_cache_stats(b, &st);
    static const char *label[3] = {"no host tier (evicted)", "host tier (first pass)", "host tier (second pass)"};
    for (int k = 0; k < 3; k++) {
        printf("stall (%s, bf16, %d-token states): %-36s rows ms:", name, STALL_STATE, label[k]);
        for (int i = 0; i < STALL_ROWS; i++) printf(" %.2f", ms[k][i]);
        double med, max;
        med_max(ms[k] + 2, STALL_ROWS - 2, &med, &max); /* the first two fit the device budget */
        printf("; past the budget: median %.3f max %.3f ms; %llu demotions, %.3f ms of host time in them\n", med, max,
               dem[k], dem_ms[k]);
    }
    printf("stall: the host tier's %.0f MB pinned when the cache was made in %.3f s (%llu slabs reserved), %llu slabs "
           "pinned on the scheduler's thread\n",
           (double)st.host_budget_bytes / (1 << 20), st.host_reserve_seconds, (unsigned long long)st.host_slabs_reserved,
           (unsigned long long)st.host_slabs_sync);
    CHECKF(st.host_slabs_reserved > 0 && st.host_slabs_sync == 0, "stall probe: %llu slabs reserved, %llu on demand",
           (unsigned long long)st.host_slabs_reserved, (unsigned long long)st.host_slabs_sync);
    grow s;
    if (grow_make(&s, STALL_STATE, 999, 0, V) == 0) {
        squad_result out;
        score(a, &s.row, &out); /* the state the hits reuse */
        free(s.ids);
        double med0, max0, med1, max1;
        squad_cache_stats hs0, hs1;
        squad_engine_cache_stats(a, &hs0);
        int pins0, pins1;
        stall_hits(a, V, 0, &med0, &max0, &pins0);
        stall_hits(a, V, 1, &med1, &max1, &pins1);
        squad_engine_cache_stats(a, &hs1);
        CHECKF(hs1.memo_hits == hs0.memo_hits && hs1.hits >= hs0.hits + 2 * STALL_HITS,
               "stall probe: the hits must run (memo hits %llu, hits %llu)", (unsigned long long)(hs1.memo_hits - hs0.memo_hits),
               (unsigned long long)(hs1.hits - hs0.hits));
        printf("stall (%s): %d hits of %d+%d tokens: alone median %.3f max %.3f ms; beside a thread pinning %zu MB "
               "slabs (%d pinned) median %.3f max %.3f ms\n",
               name, STALL_HITS, STALL_STATE, QUESTION, med0, max0, SQUAD_TIER_POOL_STEP >> 20, pins1, med1, max1);
    }
done:
    squad_engine_free(a);
    squad_engine_free(b);
}

int main(void) {
    if (squad_cuda_device_count() <= 0) {
        printf("gpu_test_tiers: no CUDA device, skipped\n");
        return TEST_SKIPPED;
    }
    squad_model *demo = test_synth_model("demo", 7);
    if (demo) {
        test_equality(demo, 1);
        test_equality(demo, -1);
    }
    const char *dir = getenv("SQUAD_TIERS_MODEL");
    if (dir && dir[0]) {
        squad_err err = {0};
        squad_model *m = squad_model_load(dir, &err);
        CHECKF(m != NULL, "%s: %s", dir, err.msg);
        if (m) {
            test_figure(m, dir);
            test_stall(m, dir);
        }
        squad_model_free(m);
    } else if (demo) {
        test_figure(demo, "demo preset");
    }
    squad_model_free(demo);
    return test_summary("gpu_test_tiers");
}
#else
int main(void) {
    printf("gpu_test_tiers: built without CUDA, skipped\n");
    return TEST_SKIPPED;
}
#endif
