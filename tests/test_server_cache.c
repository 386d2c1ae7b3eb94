/*
 * test_server_cache.c — the server's caches as the server keys them: a locked LRU map (lru_map.h)
 * keyed by a tag (the endpoint, the encode flags) and bytes, and the token cache
 * (src/server/token_cache.h) with concurrent encoders:
 *   - a stored value comes back only for the same tag and the same key bytes; a replaced key gives
 *     its new value; the least recently used entry leaves first when the budget is full; an entry
 *     larger than the budget is not stored; clear empties it; the counters add up;
 *   - four threads encoding the same long texts with one Qwen3 tokenizer (the lock inside it, the
 *     server's token cache attached) get exactly the ids a plain single-threaded encode gives, and
 *     repeated texts are answered by the cache.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hash_index.h"
#include "lru_map.h"
#include "server/token_cache.h"
#include "testutil.h"
#include "tokenizer.h"

#define QWEN_PATH "third_party/qwen3/tokenizer.json"
#define N_THREADS 4
#define N_TEXTS 6
#define ROUNDS 5

static int copy_int(void *ctx, const void *val, size_t vlen) {
    if (vlen != sizeof(int)) return -2;
    memcpy(ctx, val, sizeof(int));
    return 1;
}

/* The server's key: the tag, then the bytes; hashed from the tag as its seed. */
static int get_int(squad_lru_map *kv, uint32_t tag, const char *key, int *out) {
    const squad_bytes k[2] = {{&tag, sizeof tag}, {key, strlen(key)}};
    return squad_lru_map_get(kv, squad_hash_bytes(tag, key, strlen(key)), k, 2, copy_int, out);
}

static void put_int(squad_lru_map *kv, uint32_t tag, const char *key, int v) {
    const squad_bytes k[2] = {{&tag, sizeof tag}, {key, strlen(key)}};
    const squad_bytes val = {&v, sizeof v};
    CHECK(squad_lru_map_put(kv, squad_hash_bytes(tag, key, strlen(key)), k, 2, &val, 1, NULL) == 0);
}

static void test_kv(void) {
    squad_err err = {0};
    squad_lru_map *kv = squad_lru_map_new(1 << 20, SQUAD_LRU_MAP_LOCKED, &err);
    CHECK(kv != NULL);
    int v = 0;
    CHECK(get_int(kv, 1, "alpha", &v) == 0);
    put_int(kv, 1, "alpha", 11);
    put_int(kv, 2, "alpha", 22);
    CHECK(get_int(kv, 1, "alpha", &v) == 1 && v == 11);
    CHECK(get_int(kv, 2, "alpha", &v) == 1 && v == 22);
    CHECK(get_int(kv, 1, "alph", &v) == 0);
    CHECK(get_int(kv, 1, "alphb", &v) == 0);
    put_int(kv, 1, "alpha", 33);
    CHECK(get_int(kv, 1, "alpha", &v) == 1 && v == 33);
    squad_lru_map_stats st;
    squad_lru_map_get_stats(kv, &st);
    CHECK(st.entries == 2);
    CHECK(st.hits == 3 && st.misses == 3);
    squad_lru_map_clear(kv);
    squad_lru_map_get_stats(kv, &st);
    CHECK(st.entries == 0 && st.bytes_held == 0);
    CHECK(get_int(kv, 1, "alpha", &v) == 0);
    squad_lru_map_free(kv);

    /* a budget of a few entries: the least recently used goes first */
    kv = squad_lru_map_new(1024, SQUAD_LRU_MAP_LOCKED, &err);
    char key[32];
    for (int i = 0; i < 64; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        put_int(kv, 0, key, i);
        CHECK(get_int(kv, 0, "key-0", &v) == 1 && v == 0); /* kept fresh: never evicted */
    }
    squad_lru_map_get_stats(kv, &st);
    CHECK(st.bytes_held <= 1024);
    CHECK(st.evicted > 0 && st.entries + st.evicted == 64);
    CHECK(get_int(kv, 0, "key-1", &v) == 0);  /* old and unused: gone */
    CHECK(get_int(kv, 0, "key-63", &v) == 1 && v == 63);
    char big[2048];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    put_int(kv, 0, big, 5); /* larger than the whole budget */
    CHECK(get_int(kv, 0, big, &v) == 0);
    squad_lru_map_free(kv);
}

/* ---- the tokenizer's text cache, four encoders at once ---- */

typedef struct job {
    squad_tokenizer *tok;
    char **texts;
    squad_idvec *want;
    int mismatches, errors;
} job;

static void *encoder(void *arg) {
    job *j = arg;
    for (int r = 0; r < ROUNDS; r++)
        for (int t = 0; t < N_TEXTS; t++) {
            squad_idvec v = {0};
            squad_err err = {0};
            if (squad_tokenize_append(j->tok, j->texts[t], strlen(j->texts[t]), SQUAD_TOK_PLAIN, &v, &err) < 0)
                j->errors++;
            else if (v.n != j->want[t].n || memcmp(v.v, j->want[t].v, v.n * sizeof(int32_t)))
                j->mismatches++;
            squad_idvec_free(&v);
        }
    return NULL;
}

static void test_concurrent_encode(void) {
    squad_err err = {0};
    squad_tokenizer *tok = squad_tokenizer_load(QWEN_PATH, &err);
    CHECKF(tok != NULL, "%s (run tools/fetch_test_data.sh)", err.msg);
    if (!tok) return;
    char *texts[N_TEXTS];
    squad_idvec want[N_TEXTS];
    for (int t = 0; t < N_TEXTS; t++) {
        size_t cap = 8192;
        texts[t] = malloc(cap);
        size_t n = 0;
        /* long and short texts, some under the cache's threshold, words that differ per text */
        int words = t % 2 ? 40 : 900;
        for (int w = 0; w < words && n + 64 < cap; w++)
            n += (size_t)snprintf(texts[t] + n, cap - n, "%s%d caf\xc3\xa9 <|im_end|> ", w % 3 ? "word" : " Item", w * (t + 1));
        memset(&want[t], 0, sizeof want[t]);
        CHECK(squad_tokenize_append(tok, texts[t], strlen(texts[t]), SQUAD_TOK_PLAIN, &want[t], &err) == 0);
    }
    squad_lru_map *kv = squad_lru_map_new(4 << 20, SQUAD_LRU_MAP_LOCKED, &err);
    CHECK(kv != NULL);
    srv_token_cache_attach(tok, kv, SRV_TOKEN_CACHE_MIN_BYTES);
    pthread_t th[N_THREADS];
    job jobs[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        jobs[i] = (job){tok, texts, want, 0, 0};
        pthread_create(&th[i], NULL, encoder, &jobs[i]);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECKF(jobs[i].mismatches == 0 && jobs[i].errors == 0, "thread %d: %d mismatches, %d errors", i,
               jobs[i].mismatches, jobs[i].errors);
    }
    squad_lru_map_stats st;
    squad_lru_map_get_stats(kv, &st);
    int long_texts = N_TEXTS / 2, encodes = N_THREADS * ROUNDS * long_texts;
    CHECKF(st.entries == (size_t)long_texts, "%zu entries", st.entries); /* only the long texts */
    CHECKF(st.hits + st.misses == (uint64_t)encodes, "%llu + %llu", (unsigned long long)st.hits,
           (unsigned long long)st.misses);
    CHECK(st.hits >= (uint64_t)(encodes - N_THREADS * long_texts)); /* at most each thread's first encode misses */
    srv_token_cache_attach(tok, NULL, 0);
    for (int t = 0; t < N_TEXTS; t++) {
        free(texts[t]);
        squad_idvec_free(&want[t]);
    }
    squad_lru_map_free(kv);
    squad_tokenizer_free(tok);
}

int main(void) {
    test_kv();
    test_concurrent_encode();
    return test_summary("test_server_cache");
}
