/*
 * token_cache.c — the token cache (token_cache.h): the hook's get and put over the LRU map.
 */
#include "server/token_cache.h"

#include <stdint.h>

#include "hash_index.h"

typedef struct token_hit {
    squad_idvec *out;
    squad_err *err;
} token_hit;

static int append_ids(void *ctx, const void *val, size_t vlen) {
    token_hit *h = ctx;
    return squad_idvec_append(h->out, val, vlen / sizeof(int32_t), h->err) < 0 ? -1 : 1;
}

/* The key's pieces: the flags, then the text. */
static void text_key(const unsigned *flags, const char *text, size_t len, squad_bytes key[2]) {
    key[0] = (squad_bytes){flags, sizeof *flags};
    key[1] = (squad_bytes){text, len};
}

/* 1 and the ids appended on a hit, 0 on a miss, SQUAD_E_NOMEM when they could not be appended. */
static int cache_get(void *ctx, unsigned flags, const char *text, size_t len, squad_idvec *out, squad_err *err) {
    squad_bytes key[2];
    text_key(&flags, text, len, key);
    token_hit h = {out, err};
    int rc = squad_lru_map_get(ctx, squad_hash_bytes(flags, text, len), key, 2, append_ids, &h);
    return rc < 0 ? SQUAD_E_NOMEM : rc;
}

static void cache_put(void *ctx, unsigned flags, const char *text, size_t len, const int32_t *ids, size_t n) {
    squad_bytes key[2];
    text_key(&flags, text, len, key);
    const squad_bytes val = {ids, n * sizeof *ids};
    squad_lru_map_put(ctx, squad_hash_bytes(flags, text, len), key, 2, &val, 1, NULL); /* a cache may forget */
}

void srv_token_cache_attach(squad_tokenizer *tok, squad_lru_map *map, size_t min_bytes) {
    if (!map) {
        squad_tokenizer_set_text_cache(tok, NULL);
        return;
    }
    const squad_tok_text_cache tc = {min_bytes, cache_get, cache_put, map};
    squad_tokenizer_set_text_cache(tok, &tc);
}
