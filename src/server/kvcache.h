/*
 * kvcache.h — a bounded, thread-safe map from byte strings to byte strings, least recently used
 * first out. The server keeps two: the request memo (endpoint + body -> the stored response) and the
 * token cache (a text -> its token ids).
 *
 * A key is a small tag (which endpoint, which tokenizer flags) plus bytes; it is found by a 64-bit
 * hash and always verified by comparing the bytes, so two keys are never confused. Every byte an
 * entry holds (its header, key and value) and the bucket array count against the budget. One mutex
 * guards the map; a hit's value is handed to a callback under that lock, so it is used in place
 * (copied or patched into a response) without a second copy.
 */
#ifndef SQUAD_SERVER_KVCACHE_H
#define SQUAD_SERVER_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "squad.h"

typedef struct srv_kv srv_kv;

typedef struct srv_kv_stats {
    uint64_t hits, misses, stored, evicted;
    size_t entries, bytes_held, budget_bytes;
} srv_kv_stats;

/* A map holding at most budget_bytes (0: one that stores nothing). */
srv_kv *srv_kv_new(size_t budget_bytes, squad_err *err);
void srv_kv_free(srv_kv *kv);

/* The hash the map uses for a key (callers that look up and then store compute it once). */
uint64_t srv_kv_hash(uint32_t tag, const void *key, size_t klen);

/* Looks (tag, key) up. On a hit calls use(ctx, value, vlen) under the map's lock, makes the entry
 * the most recently used and returns use's result (which must be >= 0 for a use that worked);
 * -1 on a miss (use not called). */
int srv_kv_get(srv_kv *kv, uint64_t hash, uint32_t tag, const void *key, size_t klen,
               int (*use)(void *ctx, const void *val, size_t vlen), void *ctx);

/* Stores a copy of (tag, key) -> value, replacing an older entry of that key; entries too large
 * for the whole budget, or when memory is short, are not stored (a cache may forget). */
void srv_kv_put(srv_kv *kv, uint64_t hash, uint32_t tag, const void *key, size_t klen, const void *val,
                size_t vlen);

/* Drops every entry. */
void srv_kv_clear(srv_kv *kv);
void srv_kv_get_stats(srv_kv *kv, srv_kv_stats *out);

#endif /* SQUAD_SERVER_KVCACHE_H */
