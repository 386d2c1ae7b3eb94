/*
 * test_cache_index.c — the state cache's logic in isolation (placement, index, restore order,
 * LRU, byte budget) and the exact-request memo, without a model.
 *
 * A fake backend stands in for the model: its "GDN state" is the position and a hash of every
 * token run so far, its "K / V" of a position is the token and the position, and the span runner
 * checks, before every span, that the working state is exactly the state of the row's tokens
 * [0, start) — so a restore of the wrong checkpoint, of stale K / V, or at the wrong position
 * fails the row. Its answers are a function of the row's tokens up to each slot, so a cached
 * answer must equal the uncached one bit for bit. Its alloc / release count the live bytes, which
 * the cache's accounting is compared with after every row.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"
#include "hash_index.h"
#include "memo.h"
#include "plan_apply.h"
#include "testutil.h"
#include "util.h"

#define FAKE_MAX_CONTEXT 4096
#define FAKE_MAX_CHUNK 256
#define FAKE_GDN_BYTES 96 /* pos + hash + a pattern, like a real snapshot's size matters */
#define FAKE_KV_BYTES 8   /* token and position */
#define FAKE_HASH_SEED 0x1234567887654321ull

typedef struct fake_gdn {
    int64_t pos;
    uint64_t hash;
} fake_gdn;

typedef struct fake {
    squad_backend be; /* first: the cache sees a squad_backend */
    int32_t kv[FAKE_MAX_CONTEXT][2];
    fake_gdn gdn;
    size_t live_bytes, live_blobs;
    long allocs;
    long fail_alloc_at;  /* the alloc with this number fails (-1: never) */
    long spans;
    long fail_span_at;   /* the span with this number fails (-1: never) */
    long violations;     /* spans that found a wrong working state */
    char last_violation[160];
} fake;

typedef struct blob_header {
    size_t bytes;
    size_t pad; /* keeps the payload 16-byte aligned */
} blob_header;

static uint64_t fmix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_tokens(const int32_t *ids, int n) {
    uint64_t h = FAKE_HASH_SEED;
    for (int i = 0; i < n; i++) h = fmix(h ^ (uint32_t)ids[i]);
    return h;
}

static void *fake_alloc(squad_backend *be, size_t bytes, squad_err *err) {
    fake *f = (fake *)be;
    if (f->allocs++ == f->fail_alloc_at) {
        squad_fail(err, SQUAD_E_NOMEM, "fake: alloc %ld fails", f->allocs - 1);
        return NULL;
    }
    blob_header *h = malloc(sizeof *h + bytes);
    if (!h) return NULL;
    h->bytes = bytes;
    f->live_bytes += bytes;
    f->live_blobs++;
    return h + 1;
}

static void fake_release(squad_backend *be, void *p) {
    fake *f = (fake *)be;
    if (!p) return;
    blob_header *h = (blob_header *)p - 1;
    f->live_bytes -= h->bytes;
    f->live_blobs--;
    free(h);
}

static int fake_reset(squad_backend *be, int seq, squad_err *err) {
    fake *f = (fake *)be;
    f->gdn.pos = 0;
    f->gdn.hash = FAKE_HASH_SEED;
    /* a real backend need not clear K / V; this one poisons them so relying on stale ones fails */
    memset(f->kv, 0xff, sizeof f->kv);
    return 0;
}

static int fake_save_gdn(squad_backend *be, int seq, void *dst, squad_err *err) {
    fake *f = (fake *)be;
    memset(dst, 0xab, FAKE_GDN_BYTES);
    memcpy(dst, &f->gdn, sizeof f->gdn);
    return 0;
}

static int fake_load_gdn(squad_backend *be, int seq, const void *src, squad_err *err) {
    fake *f = (fake *)be;
    memcpy(&f->gdn, src, sizeof f->gdn);
    return 0;
}

static int fake_save_kv(squad_backend *be, int seq, void *dst, int n, squad_err *err) {
    fake *f = (fake *)be;
    if (n > f->gdn.pos) return squad_fail(err, SQUAD_E_BACKEND, "fake: save_kv of %d positions at %d", n, (int)f->gdn.pos);
    memcpy(dst, f->kv, (size_t)n * FAKE_KV_BYTES);
    return 0;
}

static int fake_load_kv(squad_backend *be, int seq, const void *src, int blob_positions, int n, squad_err *err) {
    fake *f = (fake *)be;
    if (n > blob_positions) return squad_fail(err, SQUAD_E_BACKEND, "fake: load_kv %d of %d", n, blob_positions);
    memcpy(f->kv, src, (size_t)n * FAKE_KV_BYTES);
    return 0;
}

static void fake_destroy(squad_backend *be) { (void)be; }

static void fake_init(fake *f) {
    memset(f, 0, sizeof *f);
    f->be.name = "fake";
    f->be.max_context = FAKE_MAX_CONTEXT;
    f->be.max_chunk = FAKE_MAX_CHUNK;
    f->be.gdn_snapshot_bytes = FAKE_GDN_BYTES;
    f->be.kv_bytes_per_pos = FAKE_KV_BYTES;
    f->be.alloc = fake_alloc;
    f->be.release = fake_release;
    f->be.max_seqs = 1;
    f->be.reset = fake_reset;
    f->be.save_gdn = fake_save_gdn;
    f->be.load_gdn = fake_load_gdn;
    f->be.save_kv = fake_save_kv;
    f->be.load_kv = fake_load_kv;
    f->be.destroy = fake_destroy;
    f->fail_alloc_at = -1;
    f->fail_span_at = -1;
}

/* The answer of a slot: a function of every token up to and including it. */
static void fake_answer(uint64_t hash_through_slot, int nopts, float *probs) {
    float sum = 0;
    for (int j = 0; j < nopts; j++) {
        probs[j] = 1.0f + (float)((fmix(hash_through_slot + (uint64_t)j) >> 40) & 1023);
        sum += probs[j];
    }
    for (int j = 0; j < nopts; j++) probs[j] /= sum;
}

static int fake_span(void *ctx, const squad_row *row, int start, int end, squad_result *out, squad_err *err) {
    fake *f = ctx;
    if (f->spans++ == f->fail_span_at) return squad_fail(err, SQUAD_E_BACKEND, "fake: span fails");
    /* the working state must be exactly that of the row's tokens [0, start) */
    int bad = f->gdn.pos != start || f->gdn.hash != hash_tokens(row->ids, start);
    for (int i = 0; i < start && !bad; i++) bad = f->kv[i][0] != row->ids[i] || f->kv[i][1] != i;
    if (bad) {
        f->violations++;
        snprintf(f->last_violation, sizeof f->last_violation, "span [%d, %d) from a state at %d", start, end,
                 (int)f->gdn.pos);
        return squad_fail(err, SQUAD_E_BACKEND, "fake: %s", f->last_violation);
    }
    int slot = 0;
    while (slot < row->n_slots && row->slots[slot] < start) slot++;
    for (int i = start; i < end; i++) {
        f->kv[i][0] = row->ids[i];
        f->kv[i][1] = i;
        f->gdn.hash = fmix(f->gdn.hash ^ (uint32_t)row->ids[i]);
        f->gdn.pos = i + 1;
        if (slot < row->n_slots && row->slots[slot] == i) {
            fake_answer(f->gdn.hash, row->nopts[slot], out->probs[slot]);
            slot++;
        }
    }
    out->computed += end - start;
    return 0;
}

/* The uncached answer. */
static void reference(const squad_row *row, squad_result *out) {
    memset(out, 0, sizeof *out);
    out->n_slots = row->n_slots;
    for (int s = 0; s < row->n_slots; s++)
        fake_answer(hash_tokens(row->ids, row->slots[s] + 1), row->nopts[s], out->probs[s]);
}

static int same_answer(const squad_row *row, const squad_result *a, const squad_result *b) {
    if (a->n_slots != b->n_slots) return 0;
    for (int s = 0; s < row->n_slots; s++)
        for (int j = 0; j < SQUAD_MAX_LETTERS; j++)
            if (a->probs[s][j] != b->probs[s][j]) return 0;
    return 1;
}

/* ---- rows -------------------------------------------------------------------------------------- */

#define MAX_ROW 2048

typedef struct test_row {
    int32_t ids[MAX_ROW];
    int32_t slots[4], nopts[4], letters[4];
    squad_row row;
} test_row;

static uint64_t rng_state = 42;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* A row of state tokens `state` (n_state of them) followed by a question of q tokens, one slot at
 * the end (or n_slots spread over the question). */
static void make_row(test_row *t, const int32_t *state, int n_state, int q, int n_slots) {
    memcpy(t->ids, state, (size_t)n_state * sizeof *state);
    for (int i = 0; i < q; i++) t->ids[n_state + i] = 1000 + (int32_t)(rnd() % 5000);
    int n = n_state + q;
    for (int s = 0; s < n_slots; s++) {
        t->slots[s] = n - n_slots + s;
        t->nopts[s] = 2 + s % 3;
    }
    for (int j = 0; j < 4; j++) t->letters[j] = 10 + j;
    t->row = (squad_row){t->ids, n, t->slots, t->nopts, n_slots, t->letters, 4, n_state, 0, NULL, 0};
}

static void random_tokens(int32_t *dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = (int32_t)(rnd() % 50000);
}

/* The cache's accounting against the fake's live allocations and its own structures. */
static void check_accounting(squad_cache *c, fake *f, const char *where) {
    char why[256];
    size_t be_bytes, host;
    squad_cache_bytes(c, &be_bytes, &host);
    squad_cache_stats st;
    squad_cache_get_stats(c, &st);
    CHECKF(squad_cache_check(c, why, sizeof why) == 0, "%s: %s", where, why);
    CHECKF(be_bytes == f->live_bytes, "%s: backend bytes %zu, live %zu", where, be_bytes, f->live_bytes);
    CHECKF(st.bytes_held == be_bytes + host, "%s", where);
    CHECKF(st.bytes_held <= st.budget_bytes, "%s: held %zu > budget %zu", where, st.bytes_held, st.budget_bytes);
}

static squad_cache_opts small_opts(size_t budget) {
    squad_cache_opts o = {budget, 64, 16, 512, 64, 4, 0};
    return o;
}

/* Scores a row through the cache and checks the answer against the reference. */
static int score(squad_cache *c, fake *f, const squad_row *row, squad_result *out) {
    squad_err err = {0};
    squad_result ref;
    reference(row, &ref);
    int rc = squad_plan_run_row(c, fake_span, f, row, out, &err);
    CHECKF(rc == 0, "score: %s", err.msg);
    CHECKF(rc || same_answer(row, out, &ref), "answer differs from the uncached one");
    CHECKF(rc || out->reused + out->computed == row->n_ids, "reused %d + computed %d != %d", out->reused,
           out->computed, row->n_ids);
    return rc;
}

/* ---- placement --------------------------------------------------------------------------------- */

static void test_bounds(void) {
    squad_cache_opts o = small_opts(1 << 20);
    int b[64];
    /* a cold state of 1100 tokens: stride 512, tail 1100-16 -> 1024 (= p), p = 1088 */
    int n = squad_cache_bounds(&o, 4096, 0, 1100, 0, b, 64);
    CHECK(n == 3 && b[0] == 512 && b[1] == 1024 && b[2] == 1088);
    /* state_len 1090: tail 1074 -> 1024; p 1088 */
    n = squad_cache_bounds(&o, 4096, 0, 1090, 0, b, 64);
    CHECK(n == 3 && b[0] == 512 && b[1] == 1024 && b[2] == 1088);
    /* from 1024 only p is left */
    n = squad_cache_bounds(&o, 4096, 1024, 1090, 0, b, 64);
    CHECK(n == 1 && b[0] == 1088);
    /* from p: nothing */
    CHECK(squad_cache_bounds(&o, 4096, 1088, 1090, 0, b, 64) == 0);
    /* chunks no longer than 256: extra ends at 256, 768 */
    n = squad_cache_bounds(&o, 256, 0, 1100, 0, b, 64);
    CHECK(n == 5 && b[0] == 256 && b[1] == 512 && b[2] == 768 && b[3] == 1024 && b[4] == 1088);
    /* a max chunk that is not a multiple of align is rounded down (300 -> 256) */
    n = squad_cache_bounds(&o, 300, 0, 600, 0, b, 64);
    CHECK(n == 3 && b[0] == 256 && b[1] == 512 && b[2] == 576);
    /* too small a buffer: the count is still right */
    CHECK(squad_cache_bounds(&o, 256, 0, 1100, 0, b, 2) == 5);
    /* a fork (the deepest shared position) is one more: rounded down, only between c0 and p */
    n = squad_cache_bounds(&o, 256, 0, 1100, 850, b, 64);
    CHECK(n == 6 && b[0] == 256 && b[1] == 512 && b[2] == 768 && b[3] == 832 && b[4] == 1024 && b[5] == 1088);
    n = squad_cache_bounds(&o, 4096, 512, 1100, 512, b, 64);
    CHECK(n == 2 && b[0] == 1024 && b[1] == 1088);
    n = squad_cache_bounds(&o, 4096, 0, 1100, 1088, b, 64);
    CHECK(n == 3 && b[2] == 1088);
    n = squad_cache_bounds(&o, 4096, 0, 1100, 1050, b, 64); /* the fork coincides with the tail position */
    CHECK(n == 3 && b[0] == 512 && b[1] == 1024 && b[2] == 1088);
    /* no stride, no tail */
    o.stride = 0;
    o.tail = 0;
    n = squad_cache_bounds(&o, 4096, 0, 1100, 0, b, 64);
    CHECK(n == 1 && b[0] == 1088);
    /* a stride that is not a multiple of align: rounded down */
    o.stride = 100;
    n = squad_cache_bounds(&o, 4096, 0, 330, 0, b, 64);
    CHECK(n == 4 && b[0] == 64 && b[1] == 192 && b[2] == 256 && b[3] == 320); /* 100, 200, 300 */
}

static void test_keys(void) {
    int32_t a[256], b[256];
    uint64_t ka[4], kb[4];
    random_tokens(a, 256);
    memcpy(b, a, sizeof a);
    b[130] ^= 1; /* the third block differs */
    squad_cache_prefix_keys(a, 64, 4, ka);
    squad_cache_prefix_keys(b, 64, 4, kb);
    CHECK(ka[0] == kb[0] && ka[1] == kb[1] && ka[2] != kb[2] && ka[3] != kb[3]);
    CHECK(ka[0] != ka[1]);
}

/* squad_hash_ints (four chains, two values a step): every value, its position, the length and the
 * seed reach the hash, whatever lane or tail a value falls in. */
static void test_hash_ints(void) {
    int32_t a[40], b[40];
    random_tokens(a, 40);
    const uint64_t seed = 0x1234;
    for (size_t n = 0; n <= 40; n++) {
        const uint64_t h = squad_hash_ints(seed, a, n);
        CHECK(h == squad_hash_ints(seed, a, n));
        CHECK(h != squad_hash_ints(seed + 1, a, n));
        if (n < 40) CHECK(h != squad_hash_ints(seed, a, n + 1)); /* a prefix differs from its extension */
        for (size_t i = 0; i < n; i++) { /* one value changed */
            memcpy(b, a, sizeof a);
            b[i] ^= 1 << (i % 31);
            CHECK(h != squad_hash_ints(seed, b, n));
        }
        for (size_t i = 0; i + 1 < n; i++) { /* two neighbours swapped (made unequal first) */
            memcpy(b, a, sizeof a);
            b[i + 1] = b[i] + 1;
            const uint64_t hb = squad_hash_ints(seed, b, n);
            const int32_t t = b[i];
            b[i] = b[i + 1];
            b[i + 1] = t;
            CHECK(hb != squad_hash_ints(seed, b, n));
        }
    }
    /* the same values split differently between two chained calls: [0, 3) [3, 10) vs [0, 4) [4, 10) */
    CHECK(squad_hash_ints(squad_hash_ints(seed, a, 3), a + 3, 7) != squad_hash_ints(squad_hash_ints(seed, a, 4), a + 4, 6));
}

/* ---- scenarios --------------------------------------------------------------------------------- */

static void test_scenarios(void) {
    fake f;
    fake_init(&f);
    squad_err err = {0};
    squad_cache_opts o = small_opts(64 << 20);
    squad_cache *c = squad_cache_new(&f.be, &o, &err);
    CHECK(c != NULL);
    static int32_t state[MAX_ROW];
    static test_row t;
    squad_result r;
    random_tokens(state, MAX_ROW);

    /* cold: a state of 700 tokens, p 640 */
    make_row(&t, state, 700, 20, 1);
    score(c, &f, &t.row, &r);
    CHECK(r.reused == 0 && r.computed == 720);
    /* the same state, another question: only the question (and [p, state_len)) is computed */
    make_row(&t, state, 700, 25, 2);
    score(c, &f, &t.row, &r);
    CHECK(r.reused == 640 && r.computed == 85);
    /* one action appended: the state grows to 760; it restores p = 640 of the old state */
    make_row(&t, state, 760, 10, 1);
    score(c, &f, &t.row, &r);
    CHECK(r.reused == 640);
    /* the state's last 20 tokens changed: p = 640 is still shared */
    static int32_t changed[MAX_ROW];
    memcpy(changed, state, sizeof changed);
    random_tokens(changed + 680, 40);
    make_row(&t, changed, 700, 10, 1);
    score(c, &f, &t.row, &r);
    CHECK(r.reused == 640); /* 640 <= 680 still shared */
    random_tokens(changed + 630, 100);
    make_row(&t, changed, 700, 10, 1);
    score(c, &f, &t.row, &r);
    CHECK(r.reused == 512); /* 640 is past the shared 630, the stride checkpoint 512 is not (a fork at 576 is made) */
    /* the middle changed (a new page): the stride checkpoint at 512 is what is left */
    random_tokens(changed + 530, 400);
    make_row(&t, changed, 1300, 10, 1);
    score(c, &f, &t.row, &r);
    CHECK(r.reused == 512);
    /* exactly the same row again: a hit at p */
    score(c, &f, &t.row, &r);
    CHECK(r.reused == 1280 && r.computed == 30);
    /* a row that shares only part of a long state: 1000 tokens of it */
    static int32_t part[MAX_ROW];
    memcpy(part, changed, sizeof part);
    random_tokens(part + 1000, 600);
    make_row(&t, part, 1500, 10, 1);
    score(c, &f, &t.row, &r);
    CHECK(r.reused == 768); /* the 1300-token state's checkpoints: 768 (a chunk-cap end), 1024, 1280 */
    /* an unrelated state: cold */
    static int32_t other[MAX_ROW];
    random_tokens(other, MAX_ROW);
    make_row(&t, other, 300, 10, 1);
    score(c, &f, &t.row, &r);
    CHECK(r.reused == 0);
    /* ineligible rows */
    make_row(&t, other, 300, 10, 1);
    t.row.state_len = -1;
    CHECK(!squad_cache_eligible(c, &t.row));
    t.row.state_len = 100; /* p 64 >= min_prefix 64 */
    CHECK(squad_cache_eligible(c, &t.row));
    t.row.state_len = 60; /* p 0 */
    CHECK(!squad_cache_eligible(c, &t.row));
    t.row.state_len = 300;
    t.slots[0] = 200; /* a slot inside the state */
    CHECK(!squad_cache_eligible(c, &t.row));
    make_row(&t, other, 300, 10, 4);
    CHECK(squad_cache_eligible(c, &t.row));
    t.row.n_slots = 5;
    CHECK(!squad_cache_eligible(c, &t.row));
    CHECK(f.violations == 0);
    squad_cache_stats st;
    squad_cache_get_stats(c, &st);
    CHECK(st.rows == 9 && st.hits == 3 && st.cold == 2 && st.partial == 4);
    CHECK(st.checkpoints_made > 0 && st.evicted == 0);
    check_accounting(c, &f, "scenarios");
    squad_cache_free(c);
    CHECK(f.live_bytes == 0 && f.live_blobs == 0);
}

/* An agent's steps: [goal and history | page]; each action appends a step to the history and
 * brings a new page, so a state shares the previous one up to the end of its history. The fork
 * checkpoint (where the row left the cached state) lets the next step restore there. */
static void test_fork(void) {
    fake f;
    fake_init(&f);
    squad_err err = {0};
    squad_cache_opts o = small_opts(64 << 20);
    squad_cache *c = squad_cache_new(&f.be, &o, &err);
    static int32_t state[MAX_ROW];
    static test_row t;
    squad_result r;
    random_tokens(state, MAX_ROW);
    int history = 300;
    const int step = 50, page = 400;
    /* restored: cold; then the stride chunk end 256 (the history ends at 300: no fork yet); then
     * the forks at the end of the history two steps before, rounded down: 320, 384 */
    const int expect[5] = {0, 256, 256, 320, 384};
    for (int k = 0; k < 5; k++) {
        if (k > 0) {
            random_tokens(state + history, step); /* an action joins the history */
            history += step;
        }
        random_tokens(state + history, page); /* and a new page follows it */
        make_row(&t, state, history + page, 10, 1);
        score(c, &f, &t.row, &r);
        CHECKF(r.reused == expect[k], "step %d: reused %d, expected %d", k, r.reused, expect[k]);
        make_row(&t, state, history + page, 12, 1); /* another question: a hit */
        score(c, &f, &t.row, &r);
        CHECK(r.reused == history + page - (history + page) % 64);
    }
    CHECK(f.violations == 0);
    check_accounting(c, &f, "fork");
    squad_cache_free(c);
    CHECK(f.live_bytes == 0);
}

/* Prefix hashes reduced to 2 bits: every probe finds candidates of other states; only the tokens
 * may decide. */
static void test_collisions(void) {
    fake f;
    fake_init(&f);
    squad_err err = {0};
    squad_cache_opts o = small_opts(64 << 20);
    squad_cache *c = squad_cache_new(&f.be, &o, &err);
    squad_cache_debug_key_bits(c, 2);
    static int32_t states[8][MAX_ROW];
    static test_row t;
    squad_result r;
    for (int s = 0; s < 8; s++) random_tokens(states[s], MAX_ROW);
    for (int round = 0; round < 3; round++)
        for (int s = 0; s < 8; s++) {
            make_row(&t, states[s], 600 + 64 * s, 8, 1);
            score(c, &f, &t.row, &r);
            CHECK(r.reused == (round ? 576 + 64 * s : 0));
        }
    CHECK(f.violations == 0);
    check_accounting(c, &f, "collisions");
    squad_cache_free(c);
    CHECK(f.live_bytes == 0);
}

/* ---- budget ------------------------------------------------------------------------------------ */

static void test_budgets(void) {
    fake f;
    fake_init(&f);
    squad_err err = {0};
    static int32_t state[MAX_ROW];
    static test_row t;
    squad_result r;
    random_tokens(state, MAX_ROW);
    make_row(&t, state, 700, 10, 1);

    /* a budget of zero: the cache takes no rows */
    squad_cache_opts o = small_opts(0);
    squad_cache *c = squad_cache_new(&f.be, &o, &err);
    CHECK(c && !squad_cache_eligible(c, &t.row));
    squad_cache_free(c);

    /* a budget smaller than one checkpoint with its group: rows are answered, nothing is cached */
    o = small_opts(1000);
    c = squad_cache_new(&f.be, &o, &err);
    for (int i = 0; i < 3; i++) {
        score(c, &f, &t.row, &r);
        CHECK(r.reused == 0);
    }
    squad_cache_stats st;
    squad_cache_get_stats(c, &st);
    CHECK(st.checkpoints == 0 && st.bytes_held == 0 && st.rows == 3 && st.cold == 3);
    CHECK(f.live_bytes == 0);
    squad_cache_free(c);

    /* room for the deepest checkpoint and its group only: p is kept, the shallower ones are not */
    c = squad_cache_new(&f.be, &o, &err);
    /* the group, the checkpoint, and the smallest bucket arrays of the two indexes */
    size_t one = squad_cache_group_cost(c, 640) + squad_cache_ckpt_cost(c) + 2 * 16 * sizeof(void *);
    squad_cache_free(c);
    o = small_opts(one);
    c = squad_cache_new(&f.be, &o, &err);
    score(c, &f, &t.row, &r);
    squad_cache_get_stats(c, &st);
    CHECK(st.checkpoints == 1 && st.groups == 1 && st.bytes_held == one);
    score(c, &f, &t.row, &r);
    CHECK(r.reused == 640);
    check_accounting(c, &f, "one checkpoint");
    /* another state evicts it */
    static int32_t other[MAX_ROW];
    random_tokens(other, MAX_ROW);
    make_row(&t, other, 700, 10, 1);
    score(c, &f, &t.row, &r);
    squad_cache_get_stats(c, &st);
    CHECK(st.checkpoints == 1 && st.evicted == 1);
    check_accounting(c, &f, "evicted");
    make_row(&t, state, 700, 10, 1);
    score(c, &f, &t.row, &r);
    CHECK(r.reused == 0);
    squad_cache_free(c);
    CHECK(f.live_bytes == 0);
}

/* LRU order: with room for two states' checkpoints, touching the older one makes the other the
 * victim. */
static void test_lru(void) {
    fake f;
    fake_init(&f);
    squad_err err = {0};
    static int32_t s[3][MAX_ROW];
    static test_row t;
    squad_result r;
    for (int i = 0; i < 3; i++) random_tokens(s[i], MAX_ROW);
    squad_cache_opts o = small_opts(0);
    o.stride = 0;
    o.tail = 0; /* one checkpoint per state (its p: 192, below the chunk cap) */
    o.budget_bytes = 1;
    squad_cache *c = squad_cache_new(&f.be, &o, &err);
    o.budget_bytes = 2 * (squad_cache_group_cost(c, 192) + squad_cache_ckpt_cost(c)) + 2 * 16 * sizeof(void *);
    squad_cache_free(c);
    c = squad_cache_new(&f.be, &o, &err);
    make_row(&t, s[0], 250, 5, 1);
    score(c, &f, &t.row, &r);
    make_row(&t, s[1], 250, 5, 1);
    score(c, &f, &t.row, &r);
    make_row(&t, s[0], 250, 6, 1); /* touch state 0 */
    score(c, &f, &t.row, &r);
    CHECK(r.reused == 192);
    make_row(&t, s[2], 250, 5, 1); /* evicts state 1, the least recently used */
    score(c, &f, &t.row, &r);
    CHECK(squad_cache_lookup(c, s[0], 250) == 192);
    CHECK(squad_cache_lookup(c, s[1], 250) == 0);
    CHECK(squad_cache_lookup(c, s[2], 250) == 192);
    check_accounting(c, &f, "lru");
    squad_cache_free(c);
    CHECK(f.live_bytes == 0);
}

/* A failing span leaves the cache consistent and leaks nothing; a failing allocation only means
 * fewer checkpoints. */
static void test_failures(void) {
    fake f;
    fake_init(&f);
    squad_err err = {0};
    static int32_t state[MAX_ROW];
    static test_row t;
    squad_result r;
    random_tokens(state, MAX_ROW);
    squad_cache_opts o = small_opts(64 << 20);
    squad_cache *c = squad_cache_new(&f.be, &o, &err);
    make_row(&t, state, 1200, 10, 1);
    for (long at = 0; at < 8; at++) {
        f.spans = 0;
        f.fail_span_at = at;
        int rc = squad_plan_run_row(c, fake_span, &f, &t.row, &r, &err);
        CHECK(rc == SQUAD_E_BACKEND || at > 5);
        check_accounting(c, &f, "failed span");
    }
    f.fail_span_at = -1;
    squad_cache_free(c);
    CHECK(f.live_bytes == 0);
    for (long at = 0; at < 8; at++) {
        c = squad_cache_new(&f.be, &o, &err);
        f.allocs = 0;
        f.fail_alloc_at = at;
        score(c, &f, &t.row, &r);
        check_accounting(c, &f, "failed alloc");
        f.fail_alloc_at = -1;
        score(c, &f, &t.row, &r);
        check_accounting(c, &f, "after a failed alloc");
        squad_cache_free(c);
        CHECK(f.live_bytes == 0);
    }
    CHECK(f.violations == 0);
}

/* ---- plans driven by hand (no executor): the cache's side of plan / commit / close ----------- */

/* Restores the plan's checkpoint into the fake (or resets it), as an executor would. */
static int plan_restore(fake *f, const squad_cache_plan *pl, squad_err *err) {
    if (!pl->gdn) return fake_reset(&f->be, 0, err);
    int rc = fake_load_gdn(&f->be, 0, pl->gdn, err);
    return rc ? rc : fake_load_kv(&f->be, 0, pl->kv, pl->kv_positions, pl->c0, err);
}

/* Runs the plan's prefix, saving a blob at every kept bound; counts the blobs saved. */
static int plan_prefix(squad_cache *c, fake *f, const squad_row *row, squad_cache_plan *pl, squad_result *out,
                       int *saved, squad_err *err) {
    int s = pl->c0;
    *saved = 0;
    for (int i = 0; i < pl->n_bounds; i++) {
        int rc = fake_span(f, row, s, pl->bounds[i], out, err);
        if (rc) return rc;
        void *blob = squad_cache_plan_blob(c, pl, i, NULL);
        CHECKF((blob != NULL) == (i >= pl->first_kept), "bound %d of %d: blob %p, first kept %d", i, pl->n_bounds,
               blob, pl->first_kept);
        CHECK(squad_cache_plan_blob(c, pl, i, NULL) == NULL); /* one blob per bound */
        if (blob) {
            fake_save_gdn(&f->be, 0, blob, err);
            (*saved)++;
        }
        s = pl->bounds[i];
    }
    return 0;
}

/* Commits the plan's pending checkpoints with the fake's K / V. */
static void plan_commit(squad_cache *c, fake *f, const squad_row *row, squad_cache_plan *pl) {
    squad_err err = {0};
    void *kv;
    int n;
    squad_cache_commit_begin(c, pl, row, &kv, &n);
    int rc = kv ? fake_save_kv(&f->be, 0, kv, n, &err) : 0;
    CHECKF(rc == 0, "save_kv: %s", err.msg);
    squad_cache_commit_end(c, pl, rc);
}

/* The whole of one plan by hand, its answer checked against the reference. */
static void plan_run(squad_cache *c, fake *f, const squad_row *row, squad_cache_plan *pl, squad_result *out) {
    squad_err err = {0};
    squad_result ref;
    int saved;
    reference(row, &ref);
    memset(out, 0, sizeof *out);
    out->n_slots = row->n_slots;
    CHECKF(plan_restore(f, pl, &err) == 0, "restore: %s", err.msg);
    CHECKF(plan_prefix(c, f, row, pl, out, &saved, &err) == 0, "prefix: %s", err.msg);
    plan_commit(c, f, row, pl);
    CHECKF(fake_span(f, row, pl->p, row->n_ids, out, &err) == 0, "question: %s", err.msg);
    CHECK(same_answer(row, out, &ref));
}

/* A consistency check that allows what open plans hold beyond the budget; their pending blobs
 * are live in the fake but not yet the cache's backend bytes. */
static void check_open(squad_cache *c, fake *f, int pending_blobs, const char *where) {
    char why[256];
    size_t be_bytes, host;
    squad_cache_bytes(c, &be_bytes, &host);
    CHECKF(squad_cache_check(c, why, sizeof why) == 0, "%s: %s", where, why);
    CHECKF(be_bytes + (size_t)pending_blobs * FAKE_GDN_BYTES == f->live_bytes, "%s: backend bytes %zu, live %zu",
           where, be_bytes, f->live_bytes);
}

/* The plan API without the executor: a cold plan's bounds and blobs, its commit and pins, then a
 * hit's plan on what it made. */
static void test_plan_api(void) {
    fake f;
    fake_init(&f);
    squad_err err = {0};
    static int32_t state[MAX_ROW];
    static test_row a, b;
    squad_result r;
    squad_cache_stats st;
    random_tokens(state, MAX_ROW);
    squad_cache_opts o = small_opts(64 << 20);
    squad_cache *c = squad_cache_new(&f.be, &o, &err);
    make_row(&a, state, 1200, 10, 1);
    make_row(&b, state, 1200, 7, 2);

    squad_cache_plan pl;
    CHECK(squad_cache_plan_open(c, &a.row, 0, 0, 0, &pl, &err) == 0);
    int want[32];
    const int nb = squad_cache_bounds(&o, FAKE_MAX_CHUNK, 0, 1200, 0, want, 32);
    CHECK(pl.c0 == 0 && pl.gdn == NULL && pl.p == 1152 && pl.route == 0);
    CHECKF(pl.n_bounds == nb && pl.first_kept == 0, "%d bounds (want %d), first kept %d", pl.n_bounds, nb,
           pl.first_kept);
    for (int i = 0; i < nb && i < pl.n_bounds; i++) CHECK(pl.bounds[i] == want[i]);
    check_open(c, &f, 0, "cold plan open");
    int saved;
    memset(&r, 0, sizeof r);
    CHECK(plan_restore(&f, &pl, &err) == 0 && plan_prefix(c, &f, &a.row, &pl, &r, &saved, &err) == 0);
    CHECK(saved == nb);
    check_open(c, &f, saved, "blobs pending");
    CHECK(squad_cache_lookup(c, a.ids, 1200) == 0); /* pending checkpoints are not found */
    plan_commit(c, &f, &a.row, &pl);
    CHECK(squad_cache_lookup(c, a.ids, 1200) == 1152);
    CHECK(squad_cache_pins(c, a.ids, 1152) == 1); /* the new group, read until the plan closes */
    check_open(c, &f, 0, "committed");
    CHECK(fake_span(&f, &a.row, pl.p, a.row.n_ids, &r, &err) == 0);
    squad_cache_plan_close(c, &pl, SQUAD_PLAN_DONE, &a.row, (uint64_t)a.row.n_ids, &r);
    CHECK(squad_cache_pins(c, a.ids, 1152) == 0);
    CHECK(r.cache_written == 1152);
    squad_cache_get_stats(c, &st);
    CHECK(st.rows == 1 && st.cold == 1 && st.checkpoints_made == (uint64_t)nb && st.checkpoints == (size_t)nb);
    CHECK(st.tokens_computed == (uint64_t)a.row.n_ids && st.tokens_reused == 0);
    check_accounting(c, &f, "cold plan closed");

    /* a hit: the checkpoint at p, nothing of the prefix to run */
    CHECK(squad_cache_plan_open(c, &b.row, 0, 0, 0, &pl, &err) == 0);
    CHECK(pl.c0 == 1152 && pl.n_bounds == 0 && pl.gdn && pl.kv && pl.kv_positions == 1152);
    CHECK(squad_cache_pins(c, b.ids, 1152) == 1);
    plan_run(c, &f, &b.row, &pl, &r);
    squad_cache_plan_close(c, &pl, SQUAD_PLAN_DONE, &b.row, (uint64_t)(b.row.n_ids - pl.c0), &r);
    squad_cache_get_stats(c, &st);
    CHECK(st.rows == 2 && st.hits == 1 && st.tokens_reused == 1152 && r.cache_written == 0);
    CHECK(squad_cache_pins(c, b.ids, 1152) == 0);
    check_accounting(c, &f, "hit plan closed");

    /* a row the cache does not take is refused with nothing held */
    test_row s;
    make_row(&s, state, 40, 5, 1);
    CHECK(squad_cache_plan_open(c, &s.row, 0, 0, 0, &pl, &err) == SQUAD_E_INVALID);
    check_accounting(c, &f, "refused plan");
    squad_cache_free(c);
    CHECK(f.live_bytes == 0 && f.violations == 0);
}

/* Two plans in flight on one checkpoint: pinned twice, released twice, evictable only after both. */
static void test_plan_shared(void) {
    fake f;
    fake_init(&f);
    squad_err err = {0};
    static int32_t state[MAX_ROW];
    static test_row a, b, q;
    squad_result r;
    random_tokens(state, MAX_ROW);
    squad_cache_opts o = small_opts(64 << 20);
    squad_cache *c = squad_cache_new(&f.be, &o, &err);
    make_row(&a, state, 1200, 10, 1);
    make_row(&b, state, 1200, 12, 1);
    make_row(&q, state, 1200, 5, 3);
    score(c, &f, &a.row, &r);
    const int p = 1152;

    squad_cache_plan x, y;
    CHECK(squad_cache_plan_open(c, &b.row, 0, 0, 0, &x, &err) == 0);
    CHECK(squad_cache_plan_open(c, &q.row, 0, 0, 0, &y, &err) == 0);
    CHECK(x.c0 == p && y.c0 == p && x.gdn == y.gdn && x.kv == y.kv);
    CHECK(squad_cache_pins(c, a.ids, p) == 2);
    check_open(c, &f, 0, "two plans open");
    squad_cache_clear(c); /* the pinned group stays, with every checkpoint of it */
    CHECK(squad_cache_lookup(c, a.ids, 1200) == p);
    check_open(c, &f, 0, "cleared under two plans");
    plan_run(c, &f, &b.row, &x, &r);
    squad_cache_plan_close(c, &x, SQUAD_PLAN_DONE, &b.row, (uint64_t)(b.row.n_ids - p), &r);
    CHECK(squad_cache_pins(c, a.ids, p) == 1);
    squad_cache_clear(c);
    CHECK(squad_cache_lookup(c, a.ids, 1200) == p);
    check_open(c, &f, 0, "one plan left");
    plan_run(c, &f, &q.row, &y, &r); /* its blobs were not touched by the clears */
    squad_cache_plan_close(c, &y, SQUAD_PLAN_DONE, &q.row, (uint64_t)(q.row.n_ids - p), &r);
    CHECK(squad_cache_pins(c, a.ids, p) == 0);
    check_accounting(c, &f, "both closed");
    squad_cache_clear(c);
    CHECK(squad_cache_lookup(c, a.ids, 1200) == 0);
    check_accounting(c, &f, "cleared after both");
    squad_cache_free(c);
    CHECK(f.live_bytes == 0 && f.violations == 0);
}

/* Eviction pressure while a plan is in flight: rows of other states through a budget of about two
 * states evict everything but the pinned checkpoint's group (whose blobs the plan then restores)
 * and the state they make beside it; the bytes held never pass the budget. */
static void test_plan_pressure(void) {
    fake f;
    fake_init(&f);
    squad_err err = {0};
    static int32_t state[MAX_ROW], other[MAX_ROW];
    static test_row a, b, t;
    squad_result r;
    squad_cache_stats st;
    random_tokens(state, MAX_ROW);
    squad_cache_opts o = small_opts(64 << 20);
    squad_cache *probe = squad_cache_new(&f.be, &o, &err);
    make_row(&a, state, 1200, 10, 1);
    score(probe, &f, &a.row, &r);
    squad_cache_get_stats(probe, &st);
    const size_t one_state = st.bytes_held;
    squad_cache_free(probe);

    o.budget_bytes = 2 * one_state + one_state / 4;
    squad_cache *c = squad_cache_new(&f.be, &o, &err);
    score(c, &f, &a.row, &r);
    make_row(&b, state, 1200, 9, 2);
    squad_cache_plan x;
    CHECK(squad_cache_plan_open(c, &b.row, 0, 0, 0, &x, &err) == 0 && x.c0 == 1152);
    for (int k = 0; k < 6; k++) {
        random_tokens(other, MAX_ROW);
        make_row(&t, other, 900 + 64 * k, 6, 1);
        score(c, &f, &t.row, &r);
        check_open(c, &f, 0, "a row under a pinned plan");
        squad_cache_get_stats(c, &st);
        CHECKF(st.bytes_held <= st.budget_bytes, "held %zu > budget %zu under a pinned plan", st.bytes_held,
               st.budget_bytes);
        CHECK(r.cache_written > 0); /* room beside the pinned state */
        CHECK(squad_cache_lookup(c, a.ids, 1200) == 1152);
        CHECK(squad_cache_pins(c, a.ids, 1152) == 1);
    }
    squad_cache_get_stats(c, &st);
    CHECK(st.evicted > 0);
    plan_run(c, &f, &b.row, &x, &r);
    squad_cache_plan_close(c, &x, SQUAD_PLAN_DONE, &b.row, (uint64_t)(b.row.n_ids - x.c0), &r);
    check_accounting(c, &f, "the pinned plan closed");
    squad_cache_free(c);

    /* a budget of one and a half states: beside the pinned one another state does not fit, so it
     * is not kept (rather than held past the budget until the plan closes) */
    o.budget_bytes = one_state + one_state / 2;
    c = squad_cache_new(&f.be, &o, &err);
    score(c, &f, &a.row, &r);
    CHECK(squad_cache_plan_open(c, &b.row, 0, 0, 0, &x, &err) == 0 && x.c0 == 1152);
    random_tokens(other, MAX_ROW);
    make_row(&t, other, 1200, 6, 1);
    score(c, &f, &t.row, &r);
    check_open(c, &f, 0, "a state that does not fit beside a pinned one");
    squad_cache_get_stats(c, &st);
    CHECK(r.cache_written == 0 && st.bytes_held <= st.budget_bytes);
    CHECK(squad_cache_lookup(c, a.ids, 1200) == 1152 && squad_cache_lookup(c, t.ids, 1200) == 0);
    plan_run(c, &f, &b.row, &x, &r);
    squad_cache_plan_close(c, &x, SQUAD_PLAN_DONE, &b.row, (uint64_t)(b.row.n_ids - x.c0), &r);
    score(c, &f, &t.row, &r); /* unpinned now: the older state makes room */
    CHECK(r.cache_written > 0 && squad_cache_lookup(c, t.ids, 1200) == 1152);
    check_accounting(c, &f, "after the pinned plan");
    squad_cache_free(c);
    CHECK(f.live_bytes == 0 && f.violations == 0);
}

/* A plan abandoned (a failed or cancelled row) at every stage releases its pins and pending blobs
 * and counts nothing; a retried one (a misprediction) counts a misprediction only. */
static void test_plan_abandoned(void) {
    fake f;
    fake_init(&f);
    squad_err err = {0};
    static int32_t state[MAX_ROW], fresh[MAX_ROW];
    static test_row a, b;
    squad_result r;
    squad_cache_stats before, after;
    random_tokens(state, MAX_ROW);
    squad_cache_opts o = small_opts(64 << 20);
    squad_cache *c = squad_cache_new(&f.be, &o, &err);
    make_row(&a, state, 1200, 10, 1);
    score(c, &f, &a.row, &r);
    for (int stage = 0; stage < 4; stage++) {
        /* a row sharing the first 1024 tokens: restores at 1024, checkpoints beyond it */
        memcpy(fresh, state, sizeof fresh);
        random_tokens(fresh + 1024, 700);
        make_row(&b, fresh, 1600, 8, 1);
        squad_cache_get_stats(c, &before);
        const size_t live = f.live_bytes;
        squad_cache_plan x;
        CHECK(squad_cache_plan_open(c, &b.row, 0, 0, 0, &x, &err) == 0 && x.c0 == 1024 && x.n_bounds > 0);
        CHECK(squad_cache_pins(c, b.ids, 1024) == 1);
        int saved = 0;
        void *kv = NULL;
        int n = 0;
        memset(&r, 0, sizeof r);
        if (stage >= 1) {
            CHECK(plan_restore(&f, &x, &err) == 0 && plan_prefix(c, &f, &b.row, &x, &r, &saved, &err) == 0);
            CHECK(saved > 0 && f.live_bytes == live + (size_t)saved * FAKE_GDN_BYTES);
            check_open(c, &f, saved, "pending before the abandon");
        }
        if (stage >= 2) squad_cache_commit_begin(c, &x, &b.row, &kv, &n);
        if (stage >= 3) {
            CHECK(kv && fake_save_kv(&f.be, 0, kv, n, &err) == 0);
            squad_cache_commit_end(c, &x, 1); /* the K / V save failed */
        }
        if (stage == 2) CHECK(kv && n == 1600 && f.live_bytes > live + (size_t)saved * FAKE_GDN_BYTES);
        squad_cache_plan_close(c, &x, SQUAD_PLAN_FAILED, &b.row, 0, &r);
        CHECKF(f.live_bytes == live, "stage %d: %zu live bytes, %zu before", stage, f.live_bytes, live);
        CHECK(squad_cache_pins(c, b.ids, 1024) == 0);
        CHECK(squad_cache_lookup(c, b.ids, 1600) == 1024);
        squad_cache_get_stats(c, &after);
        CHECK(after.rows == before.rows && after.checkpoints_made == before.checkpoints_made &&
              after.checkpoints == before.checkpoints && after.mispredictions == before.mispredictions);
        check_accounting(c, &f, "abandoned plan");
    }
    /* a retry drops the pending blobs and counts one misprediction */
    squad_cache_get_stats(c, &before);
    const size_t live = f.live_bytes;
    squad_cache_plan x;
    int saved;
    CHECK(squad_cache_plan_open(c, &b.row, 0, 0, 0, &x, &err) == 0);
    CHECK(plan_restore(&f, &x, &err) == 0 && plan_prefix(c, &f, &b.row, &x, &r, &saved, &err) == 0 && saved > 0);
    squad_cache_plan_close(c, &x, SQUAD_PLAN_RETRY, &b.row, 0, &r);
    squad_cache_get_stats(c, &after);
    CHECK(f.live_bytes == live && after.mispredictions == before.mispredictions + 1 && after.rows == before.rows);
    check_accounting(c, &f, "retried plan");
    /* plans left open are closed by squad_cache_free */
    CHECK(squad_cache_plan_open(c, &b.row, 0, 0, 0, &x, &err) == 0);
    CHECK(plan_restore(&f, &x, &err) == 0 && plan_prefix(c, &f, &b.row, &x, &r, &saved, &err) == 0);
    squad_cache_free(c);
    CHECK(f.live_bytes == 0 && f.violations == 0);
}

/* Thousands of agent-like rows (sessions whose states grow, change in the middle and repeat)
 * through a small budget; after every row the answer equals the uncached one, the reuse equals
 * what the index held before the row, and the accounting matches the real allocations. */
#define N_SESSIONS 12
#define N_ROWS 3000

static void test_many_rows(void) {
    fake f;
    fake_init(&f);
    squad_err err = {0};
    squad_cache_opts o = small_opts(0);
    o.budget_bytes = 1;
    squad_cache *probe = squad_cache_new(&f.be, &o, &err);
    /* room for about four full states */
    o.budget_bytes = 4 * (squad_cache_group_cost(probe, 1024) + 6 * squad_cache_ckpt_cost(probe));
    squad_cache_free(probe);
    squad_cache *c = squad_cache_new(&f.be, &o, &err);
    static int32_t sess[N_SESSIONS][MAX_ROW];
    static int len[N_SESSIONS];
    static test_row t;
    squad_result r;
    for (int s = 0; s < N_SESSIONS; s++) {
        random_tokens(sess[s], MAX_ROW);
        len[s] = 64 + (int)(rnd() % 300);
    }
    uint64_t reused = 0;
    for (int i = 0; i < N_ROWS; i++) {
        int s = (int)(rnd() % N_SESSIONS);
        uint32_t what = rnd() % 10;
        if (what < 3 && len[s] < 1700) { /* an action appended */
            random_tokens(sess[s] + len[s], 40);
            len[s] += 10 + (int)(rnd() % 30);
        } else if (what == 3 && len[s] > 600) { /* a new page: the middle changes */
            int from = 300 + (int)(rnd() % (len[s] - 400));
            random_tokens(sess[s] + from, len[s] - from);
        } else if (what == 4) { /* a new session */
            random_tokens(sess[s], MAX_ROW);
            len[s] = 64 + (int)(rnd() % 300);
        }
        make_row(&t, sess[s], len[s], 3 + (int)(rnd() % 30), 1 + (int)(rnd() % 3));
        int expect = squad_cache_lookup(c, t.row.ids, len[s] - len[s] % 64);
        if (score(c, &f, &t.row, &r)) break;
        CHECKF(r.reused == expect, "row %d: reused %d, the index held %d", i, r.reused, expect);
        reused += (uint64_t)r.reused;
        size_t be_bytes, host;
        squad_cache_bytes(c, &be_bytes, &host);
        squad_cache_stats st;
        squad_cache_get_stats(c, &st);
        char why[256];
        if (squad_cache_check(c, why, sizeof why) || be_bytes != f.live_bytes || st.bytes_held > st.budget_bytes) {
            check_accounting(c, &f, "many rows");
            fprintf(stderr, "after row %d\n", i);
            break;
        }
        test_passed++;
    }
    squad_cache_stats st;
    squad_cache_get_stats(c, &st);
    printf("many rows: %llu rows, %llu hits, %llu partial, %llu cold, %llu reused tokens, %llu evicted, "
           "%zu bytes held of %zu\n",
           (unsigned long long)st.rows, (unsigned long long)st.hits, (unsigned long long)st.partial,
           (unsigned long long)st.cold, (unsigned long long)reused, (unsigned long long)st.evicted,
           st.bytes_held, st.budget_bytes);
    CHECK(st.rows == N_ROWS && st.evicted > 0 && st.hits > 0 && st.partial > 0);
    CHECK(f.violations == 0);
    squad_cache_free(c);
    CHECK(f.live_bytes == 0 && f.live_blobs == 0);
}

/* ---- the memo ---------------------------------------------------------------------------------- */

static void test_memo(void) {
    squad_err err = {0};
    static test_row a, b;
    static int32_t state[MAX_ROW];
    random_tokens(state, MAX_ROW);
    make_row(&a, state, 300, 10, 2);
    b = a;
    b.row.ids = b.ids;
    b.row.slots = b.slots;
    b.row.nopts = b.nopts;
    b.row.letters = b.letters;
    squad_result ra, rb, got;
    reference(&a.row, &ra);
    ra.route = 0;
    squad_memo *m = squad_memo_new(1 << 20, &err);
    CHECK(m && !squad_memo_get(m, &a.row, &got));
    CHECK(squad_memo_put(m, &a.row, &ra, &err) == 0);
    CHECK(squad_memo_get(m, &b.row, &got) == 1 && same_answer(&a.row, &got, &ra) && got.reused == 0 &&
          got.computed == 0);
    /* any difference is another request */
    b.ids[5] ^= 1;
    CHECK(!squad_memo_get(m, &b.row, &got));
    b.ids[5] ^= 1;
    b.row.state_len = 299;
    CHECK(!squad_memo_get(m, &b.row, &got));
    b.row.state_len = 300;
    b.nopts[1] = a.nopts[1] + 1;
    CHECK(!squad_memo_get(m, &b.row, &got));
    b.nopts[1] = a.nopts[1];
    b.letters[3] = 99;
    CHECK(!squad_memo_get(m, &b.row, &got));
    b.letters[3] = a.letters[3];
    b.row.n_ids = 309; /* a prefix of the row */
    b.slots[0] = 307;
    b.slots[1] = 308;
    CHECK(!squad_memo_get(m, &b.row, &got));
    /* put again replaces */
    reference(&b.row, &rb);
    CHECK(squad_memo_put(m, &a.row, &rb, &err) == 0);
    CHECK(squad_memo_get(m, &a.row, &got) == 1 && same_answer(&a.row, &got, &rb));
    squad_memo_stats ms;
    squad_memo_get_stats(m, &ms);
    CHECK(ms.entries == 1 && ms.bytes_held <= ms.budget_bytes);
    squad_memo_free(m);

    /* a small budget: LRU, always within it */
    m = squad_memo_new(8 << 10, &err);
    static test_row rows[64];
    for (int i = 0; i < 64; i++) {
        random_tokens(state, 300);
        make_row(&rows[i], state, 100, 5, 1);
        reference(&rows[i].row, &ra);
        CHECK(squad_memo_put(m, &rows[i].row, &ra, &err) == 0);
        squad_memo_get_stats(m, &ms);
        CHECK(ms.bytes_held <= ms.budget_bytes);
        if (i >= 1) CHECK(squad_memo_get(m, &rows[i - 1].row, &got) == 1); /* touch the previous one */
    }
    CHECK(squad_memo_get(m, &rows[63].row, &got) == 1 && squad_memo_get(m, &rows[62].row, &got) == 1);
    CHECK(squad_memo_get(m, &rows[0].row, &got) == 0);
    squad_memo_get_stats(m, &ms);
    CHECK(ms.evicted > 0 && ms.entries > 2 && ms.entries < 64);
    /* an entry larger than the budget is not stored */
    static test_row big;
    random_tokens(state, MAX_ROW);
    make_row(&big, state, 2000, 10, 1);
    reference(&big.row, &ra);
    CHECK(squad_memo_put(m, &big.row, &ra, &err) == 0 && !squad_memo_get(m, &big.row, &got));
    squad_memo_free(m);
    /* a zero budget stores nothing */
    m = squad_memo_new(0, &err);
    CHECK(squad_memo_put(m, &a.row, &ra, &err) == 0 && !squad_memo_get(m, &a.row, &got));
    squad_memo_free(m);
}

int main(void) {
    test_bounds();
    test_keys();
    test_hash_ints();
    test_scenarios();
    test_fork();
    test_collisions();
    test_budgets();
    test_lru();
    test_failures();
    test_plan_api();
    test_plan_shared();
    test_plan_pressure();
    test_plan_abandoned();
    test_many_rows();
    test_memo();
    return test_summary("test_cache_index");
}
