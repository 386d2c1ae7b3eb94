/*
 * lru_map.h — a byte-bounded map from key bytes to owned value bytes, least recently used first
 * out: the one structure behind every cache that keeps answers by content (the engine's memo, the
 * server's request memo and token cache).
 *
 * A key is given in pieces (squad_bytes[]): the map stores and compares their concatenation, so a
 * caller whose key is a header plus a few arrays (the memo's row) never copies it to look it up.
 * The caller supplies the key's 64-bit hash (squad_hash_bytes / squad_hash_ints in hash_index.h),
 * because it knows the cheapest good hash of its key; a hash match is always verified by comparing
 * the bytes, so two keys are never confused. A value is copied in (also in pieces) and owned by
 * the map.
 *
 * The budget counts every byte the map holds: each entry's header, key and value, and the hash
 * index's bucket array. A put never leaves the map over its budget: it evicts the least recently
 * used entries, and gives the new entry up when even alone it cannot fit.
 *
 * Built on the intrusive hash_index.h and lru.h. Not thread-safe unless made with
 * SQUAD_LRU_MAP_LOCKED, which puts every call under one mutex; a hit's value is handed to a
 * callback under that lock, so it is used in place (copied or patched into an answer) without a
 * second copy.
 */
#ifndef SQUAD_LRU_MAP_H
#define SQUAD_LRU_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "squad.h"

/* A piece of a key or a value. */
typedef struct squad_bytes {
    const void *p;
    size_t n;
} squad_bytes;

typedef struct squad_lru_map squad_lru_map;

typedef struct squad_lru_map_stats {
    uint64_t hits, misses, stored, evicted;
    size_t entries, bytes_held, budget_bytes;
} squad_lru_map_stats;

/* Flags of squad_lru_map_new. */
#define SQUAD_LRU_MAP_LOCKED 1u /* every call under the map's own mutex (shared between threads) */

/* A map holding at most budget_bytes (0: one that stores nothing). */
squad_lru_map *squad_lru_map_new(size_t budget_bytes, unsigned flags, squad_err *err);
void squad_lru_map_free(squad_lru_map *m);

/* What a hit does with its value (vlen bytes, valid during the call only): > 0 uses it (the hit
 * counts and the entry becomes the most recently used), 0 declines it (the entry does not serve
 * this caller: counted as a miss, the order unchanged), < 0 an error of the use (counted as a hit). */
typedef int (*squad_lru_map_use)(void *ctx, const void *val, size_t vlen);

/* Looks the key (the concatenation of key[0, n_key)) up: use's result on a hit, 0 on a miss (use
 * not called). */
int squad_lru_map_get(squad_lru_map *m, uint64_t hash, const squad_bytes *key, int n_key, squad_lru_map_use use,
                      void *ctx);

/* Stores key -> a copy of the concatenation of val[0, n_val), replacing an older entry of that key,
 * then evicts the least recently used others until the map is within its budget. An entry that
 * cannot fit the budget even alone is not stored (a cache may forget). 0, or SQUAD_E_NOMEM (the
 * map stays valid, without the entry). */
int squad_lru_map_put(squad_lru_map *m, uint64_t hash, const squad_bytes *key, int n_key, const squad_bytes *val,
                      int n_val, squad_err *err);

/* Evicts least recently used entries until at most bytes are held (counted as evictions). */
void squad_lru_map_evict_to(squad_lru_map *m, size_t bytes);

/* Drops every entry (the counters stay). */
void squad_lru_map_clear(squad_lru_map *m);

void squad_lru_map_get_stats(squad_lru_map *m, squad_lru_map_stats *out);

#endif /* SQUAD_LRU_MAP_H */
