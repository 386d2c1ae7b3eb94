/*
 * hash_index.c — the intrusive chained hash table (hash_index.h).
 */
#include "hash_index.h"

#include <stdlib.h>
#include <string.h>

uint64_t squad_hash_mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t pair(const int32_t *v) { return (uint64_t)(uint32_t)v[0] | (uint64_t)(uint32_t)v[1] << 32; }

uint64_t squad_hash_ints(uint64_t h, const int32_t *v, size_t n) {
    /* distinct starting points, so equal values in different chains hash differently */
    uint64_t c0 = h, c1 = h ^ 0x9e3779b97f4a7c15ull, c2 = h ^ 0xc2b2ae3d27d4eb4full, c3 = h ^ 0x165667b19e3779f9ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) { /* two values a step: one 64-bit word, half the multiplies */
        c0 = squad_hash_mix(c0 ^ pair(v + i));
        c1 = squad_hash_mix(c1 ^ pair(v + i + 2));
        c2 = squad_hash_mix(c2 ^ pair(v + i + 4));
        c3 = squad_hash_mix(c3 ^ pair(v + i + 6));
    }
    for (; i < n; i++) c0 = squad_hash_mix(c0 ^ (uint32_t)v[i]); /* the last n mod 8 */
    /* the length joins the fold: [1 2][3] and [1][2 3] hash differently */
    uint64_t x = squad_hash_mix(c0 ^ (uint64_t)n);
    x = squad_hash_mix(x ^ c1);
    x = squad_hash_mix(x ^ c2);
    return squad_hash_mix(x ^ c3);
}

uint64_t squad_hash_bytes(uint64_t seed, const void *key, size_t n) {
    const unsigned char *p = key;
    uint64_t h = squad_hash_mix(0x9e3779b97f4a7c15ull ^ seed ^ ((uint64_t)n << 32));
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    return squad_hash_mix(h ^ w);
}

size_t squad_hindex_buckets_for(size_t n) {
    if (n == 0) return 0;
    size_t b = SQUAD_HINDEX_MIN_BUCKETS;
    while (b < n) b *= 2;
    return b;
}

size_t squad_hindex_bytes(const squad_hindex *t) { return t->n_buckets * sizeof *t->buckets; }

static size_t bucket_of(const squad_hindex *t, uint64_t key) { return (size_t)(key & (t->n_buckets - 1)); }

void squad_hindex_resize(squad_hindex *t, size_t n) {
    if (n == t->n_buckets || (n == 0 && t->n_nodes > 0)) return;
    squad_hnode **nb = NULL;
    if (n > 0) {
        nb = calloc(n, sizeof *nb);
        if (!nb) return;
    }
    for (size_t b = 0; b < t->n_buckets; b++) {
        squad_hnode *x = t->buckets[b];
        while (x) {
            squad_hnode *next = x->next;
            size_t i = (size_t)(x->key & (n - 1));
            x->next = nb[i];
            nb[i] = x;
            x = next;
        }
    }
    free(t->buckets);
    t->buckets = nb;
    t->n_buckets = n;
}

int squad_hindex_reserve(squad_hindex *t, size_t n_more) {
    if (t->n_nodes + n_more > t->n_buckets) squad_hindex_resize(t, squad_hindex_buckets_for(t->n_nodes + n_more));
    return t->n_buckets ? 0 : -1;
}

void squad_hindex_insert(squad_hindex *t, squad_hnode *x) {
    size_t i = bucket_of(t, x->key);
    x->next = t->buckets[i];
    t->buckets[i] = x;
    t->n_nodes++;
}

void squad_hindex_remove(squad_hindex *t, squad_hnode *x) {
    if (t->n_buckets == 0) return;
    squad_hnode **pp = &t->buckets[bucket_of(t, x->key)];
    while (*pp && *pp != x) pp = &(*pp)->next;
    if (*pp) {
        *pp = x->next;
        t->n_nodes--;
    }
    x->next = NULL;
}

void squad_hindex_fit(squad_hindex *t) {
    if (t->n_nodes == 0) squad_hindex_resize(t, 0);
    else if (t->n_nodes * SQUAD_HINDEX_SHRINK_FACTOR < t->n_buckets && t->n_buckets > SQUAD_HINDEX_MIN_BUCKETS)
        squad_hindex_resize(t, squad_hindex_buckets_for(t->n_nodes * 2));
}

const squad_hnode *squad_hindex_chain(const squad_hindex *t, uint64_t key) {
    return t->n_buckets ? t->buckets[bucket_of(t, key)] : NULL;
}

int squad_hindex_holds(const squad_hindex *t, const squad_hnode *x) {
    for (const squad_hnode *y = squad_hindex_chain(t, x->key); y; y = y->next)
        if (y == x) return 1;
    return 0;
}

int squad_hindex_check(const squad_hindex *t, size_t *n) {
    *n = 0;
    for (size_t b = 0; b < t->n_buckets; b++)
        for (const squad_hnode *x = t->buckets[b]; x; x = x->next) {
            if (bucket_of(t, x->key) != b) return -1;
            (*n)++;
        }
    return *n == t->n_nodes && (t->n_nodes > 0 || t->n_buckets == 0) ? 0 : -1;
}

void squad_hindex_free(squad_hindex *t) {
    free(t->buckets);
    t->buckets = NULL;
    t->n_buckets = t->n_nodes = 0;
}
