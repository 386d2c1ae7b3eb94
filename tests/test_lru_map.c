/*
 * test_lru_map.c — the byte-bounded LRU map (src/lru_map.h), the structure under the engine's memo
 * and the server's caches:
 *   - the budget is never exceeded: thousands of puts of random sizes and keys, bytes_held (the
 *     entries and the bucket array) checked after each, and against a recount of what is found;
 *   - LRU order: with room for a few entries, the least recently used leaves first, and a get
 *     makes an entry the most recent; evict_to drops the oldest first down to the bytes asked;
 *   - replace: a second put of a key gives the new value and one entry;
 *   - keys: pieces split anywhere are the same key; keys whose hashes collide (one hash for all)
 *     are still told apart by their bytes; a prefix of a key is another key;
 *   - a use that declines (0) counts a miss and leaves the order; one that fails (< 0) counts a hit;
 *   - an entry that cannot fit the budget alone is not stored; a budget of 0 stores nothing;
 *   - stats: hits, misses, stored, evicted and entries add up; clear keeps the counters.
 */
#include <stdlib.h>
#include <string.h>

#include "hash_index.h"
#include "lru_map.h"
#include "testutil.h"

typedef struct got {
    char buf[4096];
    size_t len;
} got;

static int copy_out(void *ctx, const void *val, size_t vlen) {
    got *g = ctx;
    if (vlen > sizeof g->buf) return -1;
    memcpy(g->buf, val, vlen);
    g->len = vlen;
    return 1;
}
static int decline(void *ctx, const void *val, size_t vlen) {
    (void)ctx, (void)val, (void)vlen;
    return 0;
}
static int fail_use(void *ctx, const void *val, size_t vlen) {
    (void)ctx, (void)val, (void)vlen;
    return -7;
}

static uint64_t hash_of(const char *k) { return squad_hash_bytes(0, k, strlen(k)); }

static int put_s(squad_lru_map *m, const char *k, const char *v) {
    const squad_bytes key = {k, strlen(k)}, val = {v, strlen(v)};
    return squad_lru_map_put(m, hash_of(k), &key, 1, &val, 1, NULL);
}

/* 1 and the value in g when k is held. */
static int get_s(squad_lru_map *m, const char *k, got *g) {
    const squad_bytes key = {k, strlen(k)};
    return squad_lru_map_get(m, hash_of(k), &key, 1, copy_out, g);
}

static int holds(squad_lru_map *m, const char *k, const char *want) {
    got g;
    return get_s(m, k, &g) == 1 && g.len == strlen(want) && !memcmp(g.buf, want, g.len);
}

static squad_lru_map_stats stats(squad_lru_map *m) {
    squad_lru_map_stats st;
    squad_lru_map_get_stats(m, &st);
    return st;
}

static void test_replace_and_stats(void) {
    squad_err err = {0};
    squad_lru_map *m = squad_lru_map_new(1 << 16, 0, &err);
    CHECK(m != NULL);
    got g;
    CHECK(get_s(m, "a", &g) == 0);
    CHECK(put_s(m, "a", "first") == 0);
    CHECK(put_s(m, "b", "bee") == 0);
    CHECK(holds(m, "a", "first") && holds(m, "b", "bee"));
    CHECK(put_s(m, "a", "second value") == 0); /* replace */
    CHECK(holds(m, "a", "second value"));
    squad_lru_map_stats st = stats(m);
    CHECK(st.entries == 2 && st.stored == 3 && st.evicted == 0);
    CHECK(st.hits == 3 && st.misses == 1);
    CHECK(st.budget_bytes == 1 << 16 && st.bytes_held > 0);
    /* a prefix of a key, and a key one byte longer, are other keys */
    CHECK(get_s(m, "", &g) == 0 && get_s(m, "aa", &g) == 0);
    /* decline: a miss, no order change; a failing use: its code, counted as a hit */
    const squad_bytes ka = {"a", 1};
    CHECK(squad_lru_map_get(m, hash_of("a"), &ka, 1, decline, NULL) == 0);
    CHECK(squad_lru_map_get(m, hash_of("a"), &ka, 1, fail_use, NULL) == -7);
    st = stats(m);
    CHECK(st.misses == 4 && st.hits == 4);
    squad_lru_map_clear(m);
    st = stats(m);
    CHECK(st.entries == 0 && st.bytes_held == 0 && st.hits == 4 && st.stored == 3); /* counters stay */
    CHECK(get_s(m, "a", &g) == 0);
    squad_lru_map_free(m);

    /* a budget of 0 stores nothing; an entry larger than the budget is not stored */
    m = squad_lru_map_new(0, 0, &err);
    CHECK(put_s(m, "k", "v") == 0 && get_s(m, "k", &g) == 0 && stats(m).entries == 0);
    squad_lru_map_free(m);
    m = squad_lru_map_new(512, SQUAD_LRU_MAP_LOCKED, &err);
    char big[1024];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    CHECK(put_s(m, "big", big) == 0 && get_s(m, "big", &g) == 0 && stats(m).stored == 0);
    squad_lru_map_free(m);
}

/* Pieces split anywhere make the same key; colliding hashes are told apart by the bytes. */
static void test_keys(void) {
    squad_err err = {0};
    squad_lru_map *m = squad_lru_map_new(1 << 16, 0, &err);
    const uint64_t H = 42; /* one hash for every key: every lookup walks one chain */
    const char *whole = "header:ids:slots";
    const squad_bytes one = {whole, strlen(whole)};
    const squad_bytes three[3] = {{whole, 7}, {whole + 7, 4}, {whole + 11, strlen(whole) - 11}};
    const squad_bytes other[2] = {{whole, 7}, {"ids:slotz", 9}};
    const squad_bytes v1[2] = {{"val", 3}, {"ue-1", 4}}, v2 = {"value-2", 7};
    CHECK(squad_lru_map_put(m, H, three, 3, v1, 2, NULL) == 0);
    CHECK(squad_lru_map_put(m, H, other, 2, &v2, 1, NULL) == 0);
    got g;
    CHECK(squad_lru_map_get(m, H, &one, 1, copy_out, &g) == 1 && g.len == 7 && !memcmp(g.buf, "value-1", 7));
    CHECK(squad_lru_map_get(m, H, other, 2, copy_out, &g) == 1 && g.len == 7 && !memcmp(g.buf, "value-2", 7));
    const squad_bytes empty_piece[3] = {{whole, 7}, {"", 0}, {whole + 7, strlen(whole) - 7}};
    CHECK(squad_lru_map_get(m, H, empty_piece, 3, copy_out, &g) == 1 && !memcmp(g.buf, "value-1", 7));
    CHECK(squad_lru_map_get(m, H + 1, &one, 1, copy_out, &g) == 0); /* another hash: not found */
    CHECK(stats(m).entries == 2);
    squad_lru_map_free(m);
}

static void test_lru_order(void) {
    squad_err err = {0};
    /* room for a handful of small entries (each ~70 bytes with its header) besides 16 buckets */
    squad_lru_map *m = squad_lru_map_new(16 * sizeof(void *) + 5 * 72, 0, &err);
    char k[16];
    for (int i = 0; i < 5; i++) {
        snprintf(k, sizeof k, "key-%d", i);
        CHECK(put_s(m, k, "0123456789") == 0);
    }
    const size_t fit = stats(m).entries;
    CHECKF(fit >= 3 && fit <= 5, "%zu entries fit", fit);
    got g;
    /* touch the oldest held: it becomes the most recent, so the next-oldest goes first */
    int oldest = 5 - (int)fit;
    snprintf(k, sizeof k, "key-%d", oldest);
    CHECK(get_s(m, k, &g) == 1);
    CHECK(put_s(m, "key-new", "0123456789") == 0);
    CHECK(get_s(m, k, &g) == 1); /* kept: recently used */
    snprintf(k, sizeof k, "key-%d", oldest + 1);
    CHECK(get_s(m, k, &g) == 0); /* evicted: the least recently used */
    CHECK(stats(m).evicted >= 1);
    CHECK(stats(m).entries + stats(m).evicted == 6);
    /* evict_to: the oldest first; 0 empties it */
    const squad_lru_map_stats before = stats(m);
    squad_lru_map_evict_to(m, before.bytes_held - 1);
    const squad_lru_map_stats after = stats(m);
    CHECK(after.entries == before.entries - 1 && after.evicted == before.evicted + 1);
    CHECK(get_s(m, "key-new", &g) == 1); /* the newest stays */
    squad_lru_map_evict_to(m, 0);
    CHECK(stats(m).entries == 0 && stats(m).bytes_held == 0);
    squad_lru_map_free(m);

    /* a long run: an entry kept fresh is never evicted, others leave oldest first */
    m = squad_lru_map_new(2048, SQUAD_LRU_MAP_LOCKED, &err);
    CHECK(put_s(m, "fresh", "x") == 0);
    for (int i = 0; i < 200; i++) {
        snprintf(k, sizeof k, "n-%d", i);
        CHECK(put_s(m, k, "payload") == 0);
        CHECK(holds(m, "fresh", "x"));
    }
    CHECK(holds(m, "n-199", "payload") && !holds(m, "n-0", "payload"));
    squad_lru_map_free(m);
}

/* Random keys and sizes against a small budget: never over it, and what is held is findable. */
static void test_budget(void) {
    squad_err err = {0};
    const size_t budget = 6000;
    squad_lru_map *m = squad_lru_map_new(budget, 0, &err);
    uint64_t s = 12345;
    static char val[3000];
    memset(val, 'v', sizeof val);
    int over = 0;
    for (int i = 0; i < 5000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        char k[24];
        snprintf(k, sizeof k, "k%llu", (unsigned long long)(s >> 40) % 300);
        const size_t n = (size_t)(s >> 20) % sizeof val;
        const squad_bytes key = {k, strlen(k)}, v = {val, n};
        CHECK(squad_lru_map_put(m, hash_of(k), &key, 1, &v, 1, NULL) == 0);
        if (stats(m).bytes_held > budget) over++;
    }
    CHECKF(over == 0, "%d puts left the map over its budget", over);
    squad_lru_map_stats st = stats(m);
    CHECK(st.stored > 0 && st.evicted > 0 && st.entries > 0);
    /* every key ever used: those found are exactly the entries held */
    size_t found = 0;
    for (int i = 0; i < 300; i++) {
        char k[24];
        snprintf(k, sizeof k, "k%d", i);
        got g;
        if (get_s(m, k, &g) == 1) found++;
    }
    CHECKF(found == st.entries, "%zu found, %zu entries", found, st.entries);
    squad_lru_map_free(m);
}

int main(void) {
    test_replace_and_stats();
    test_keys();
    test_lru_order();
    test_budget();
    return test_summary("test_lru_map");
}
