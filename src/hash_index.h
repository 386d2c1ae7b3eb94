/*
 * hash_index.h — an intrusive chained hash table keyed by 64-bit hashes, shared by the state
 * cache's indexes and the LRU map (lru_map.h), and the hashes they are keyed by.
 *
 * An entry embeds a squad_hnode (its key and its bucket link); the table owns only the bucket
 * array, a power of two sized for the entries (grown by squad_hindex_reserve, shrunk by
 * squad_hindex_fit). Keys are already well mixed hashes, so a bucket is the key's low bits. When a
 * new bucket array cannot be allocated the old one is kept: chains get longer, lookups stay
 * correct. Callers verify a candidate's content (a key match is not proof).
 */
#ifndef SQUAD_HASH_INDEX_H
#define SQUAD_HASH_INDEX_H

#include <stddef.h>
#include <stdint.h>

/* The smallest bucket array, and how empty an array may get before squad_hindex_fit shrinks it. */
#define SQUAD_HINDEX_MIN_BUCKETS 16
#define SQUAD_HINDEX_SHRINK_FACTOR 4

typedef struct squad_hnode {
    uint64_t key;
    struct squad_hnode *next; /* the next entry in its bucket */
} squad_hnode;

typedef struct squad_hindex {
    squad_hnode **buckets;
    size_t n_buckets; /* 0 or a power of two */
    size_t n_nodes;
} squad_hindex;

/* The entry of type `type` whose member `member` is the node n. */
#define SQUAD_HNODE_ENTRY(n, type, member) ((type *)(void *)((char *)(n) - offsetof(type, member)))

/* The hashes the indexes are keyed by (the state cache's prefix keys, the memo's row keys).
 * squad_hash_mix is splitmix64's finaliser. squad_hash_ints hashes v[0, n) from h in four
 * independent chains, each taking two values (one 64-bit word) a step, folded together with n at
 * the end. A chain step is a ~12-cycle dependent multiply chain: one chain a value over a
 * 4224-token row took ~33 us on the development machine, three times per cache hit (memo lookup,
 * prefix keys, memo store), the host's largest part of a hit; this takes a few us. */
uint64_t squad_hash_mix(uint64_t x);
uint64_t squad_hash_ints(uint64_t h, const int32_t *v, size_t n);
/* Bytes p[0, n) from seed, eight at a time through a multiply-xorshift chain: a few GB/s, enough
 * that the hash of a request body is a small part of answering it from the server's memo. */
uint64_t squad_hash_bytes(uint64_t seed, const void *p, size_t n);

/* The buckets an index wants for n entries (0 when empty). */
size_t squad_hindex_buckets_for(size_t n);
/* Bytes of the bucket array. */
size_t squad_hindex_bytes(const squad_hindex *t);
/* Moves every entry into a bucket array of n (a power of two; 0 only when empty). */
void squad_hindex_resize(squad_hindex *t, size_t n);
/* Buckets for n_more further entries; -1 when the index has none and none can be allocated. */
int squad_hindex_reserve(squad_hindex *t, size_t n_more);
/* Adds x (needs a bucket array: squad_hindex_reserve first). */
void squad_hindex_insert(squad_hindex *t, squad_hnode *x);
void squad_hindex_remove(squad_hindex *t, squad_hnode *x);
/* A smaller bucket array when it is mostly empty; none when empty. */
void squad_hindex_fit(squad_hindex *t);
/* The chain that entries with this key are in (NULL when the index has no buckets). */
const squad_hnode *squad_hindex_chain(const squad_hindex *t, uint64_t key);
/* 1 when x is in its bucket. */
int squad_hindex_holds(const squad_hindex *t, const squad_hnode *x);
/* Every entry in its right bucket and the count right: 0, and the count in *n; else -1. */
int squad_hindex_check(const squad_hindex *t, size_t *n);
/* Frees the bucket array (the entries are the caller's). */
void squad_hindex_free(squad_hindex *t);

#endif /* SQUAD_HASH_INDEX_H */
