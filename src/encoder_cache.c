/*
 * encoder_cache.c — the encoder cache (encoder_cache.h) over a byte-bounded LRU map: the key is
 * the image's 16-byte identity and the output's float count, the value the output's floats.
 */
#include "encoder_cache.h"

#include <stdlib.h>
#include <string.h>

#include "lru_map.h"
#include "util.h"

#define ENCODER_IDENTITY_BYTES 16

struct squad_encoder_cache {
    squad_lru_map *map;
};

/* The key's pieces: the identity, then the float count. */
#define ENCODER_KEY_PIECES 2

/* The identity is a cryptographic digest: its first 8 bytes are as good a hash as any. */
static uint64_t key_hash(const uint8_t identity[16]) {
    uint64_t h = 0;
    for (int i = 0; i < 8; i++) h |= (uint64_t)identity[i] << (8 * i);
    return h;
}

squad_encoder_cache *squad_encoder_cache_new(size_t budget_bytes, squad_err *err) {
    squad_encoder_cache *c = squad_calloc(1, sizeof *c, err);
    if (!c) return NULL;
    c->map = squad_lru_map_new(budget_bytes, 0, err); /* the engine's: one thread */
    if (!c->map) {
        free(c);
        return NULL;
    }
    return c;
}

void squad_encoder_cache_free(squad_encoder_cache *c) {
    if (!c) return;
    squad_lru_map_free(c->map);
    free(c);
}

typedef struct encoder_hit {
    float *out;
    size_t bytes;
} encoder_hit;

static int copy_rows(void *ctx, const void *val, size_t vlen) {
    const encoder_hit *h = ctx;
    if (vlen != h->bytes) return 0; /* cannot happen: the count is in the key */
    memcpy(h->out, val, vlen);
    return 1;
}

int squad_encoder_cache_get(squad_encoder_cache *c, const uint8_t identity[16], float *out, size_t n_floats) {
    if (!c) return 0;
    const uint64_t count = n_floats;
    const squad_bytes key[ENCODER_KEY_PIECES] = {{identity, ENCODER_IDENTITY_BYTES}, {&count, sizeof count}};
    encoder_hit h = {out, n_floats * sizeof(float)};
    return squad_lru_map_get(c->map, key_hash(identity), key, ENCODER_KEY_PIECES, copy_rows, &h) > 0;
}

int squad_encoder_cache_put(squad_encoder_cache *c, const uint8_t identity[16], const float *rows, size_t n_floats,
                            squad_err *err) {
    if (!c) return 0;
    const uint64_t count = n_floats;
    const squad_bytes key[ENCODER_KEY_PIECES] = {{identity, ENCODER_IDENTITY_BYTES}, {&count, sizeof count}};
    const squad_bytes val = {rows, n_floats * sizeof(float)};
    return squad_lru_map_put(c->map, key_hash(identity), key, ENCODER_KEY_PIECES, &val, 1, err);
}

void squad_encoder_cache_clear(squad_encoder_cache *c) {
    if (c) squad_lru_map_clear(c->map);
}

void squad_encoder_cache_bytes(squad_encoder_cache *c, size_t *held, size_t *budget) {
    *held = *budget = 0;
    if (!c) return;
    squad_lru_map_stats st;
    squad_lru_map_get_stats(c->map, &st);
    *held = st.bytes_held;
    *budget = st.budget_bytes;
}
