/*
 * kvcache.c — the server's bounded byte-string map (see kvcache.h), built on the intrusive hash
 * index and LRU list that the engine's memo and state cache use. An entry is one allocation: its
 * header, then the key bytes, then the value bytes.
 */
#include "server/kvcache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hash_index.h"
#include "lru.h"
#include "util.h"

typedef struct kv_entry {
    squad_hnode node; /* key: the hash */
    squad_lru_node lru;
    uint32_t tag;
    size_t klen, vlen;
    unsigned char data[]; /* key, then value */
} kv_entry;

struct srv_kv {
    pthread_mutex_t lock;
    squad_hindex index;
    squad_lru lru;
    size_t budget, held; /* held: the entries' bytes (the bucket array is added when comparing) */
    uint64_t hits, misses, stored, evicted;
};

/* The key's bytes eight at a time through a multiply-xorshift chain: a few GB/s, enough that a
 * memo hit's hash of a request body is a small part of answering it. */
uint64_t srv_kv_hash(uint32_t tag, const void *key, size_t n) {
    const unsigned char *p = key;
    uint64_t h = squad_hash_mix(0x9e3779b97f4a7c15ull ^ tag ^ ((uint64_t)n << 32));
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

srv_kv *srv_kv_new(size_t budget, squad_err *err) {
    srv_kv *kv = squad_calloc(1, sizeof *kv, err);
    if (!kv) return NULL;
    if (pthread_mutex_init(&kv->lock, NULL) != 0) {
        free(kv);
        squad_fail(err, SQUAD_E_NOMEM, "cannot create a cache lock");
        return NULL;
    }
    kv->budget = budget;
    return kv;
}

static void drop(srv_kv *kv, kv_entry *e) {
    squad_hindex_remove(&kv->index, &e->node);
    squad_lru_unlink(&kv->lru, &e->lru);
    kv->held -= sizeof *e + e->klen + e->vlen;
    free(e);
}

static void drop_all(srv_kv *kv) {
    while (kv->lru.oldest) drop(kv, SQUAD_LRU_ENTRY(kv->lru.oldest, kv_entry, lru));
    squad_hindex_fit(&kv->index);
}

void srv_kv_free(srv_kv *kv) {
    if (!kv) return;
    drop_all(kv);
    squad_hindex_free(&kv->index);
    pthread_mutex_destroy(&kv->lock);
    free(kv);
}

static kv_entry *find(srv_kv *kv, uint64_t hash, uint32_t tag, const void *key, size_t klen) {
    for (const squad_hnode *n = squad_hindex_chain(&kv->index, hash); n; n = n->next) {
        if (n->key != hash) continue;
        kv_entry *e = SQUAD_HNODE_ENTRY(n, kv_entry, node);
        if (e->tag == tag && e->klen == klen && !memcmp(e->data, key, klen)) return e;
    }
    return NULL;
}

int srv_kv_get(srv_kv *kv, uint64_t hash, uint32_t tag, const void *key, size_t klen,
               int (*use)(void *ctx, const void *val, size_t vlen), void *ctx) {
    pthread_mutex_lock(&kv->lock);
    kv_entry *e = find(kv, hash, tag, key, klen);
    int rc = -1;
    if (e) {
        squad_lru_unlink(&kv->lru, &e->lru);
        squad_lru_push_newest(&kv->lru, &e->lru);
        kv->hits++;
        rc = use(ctx, e->data + e->klen, e->vlen);
    } else {
        kv->misses++;
    }
    pthread_mutex_unlock(&kv->lock);
    return rc;
}

void srv_kv_put(srv_kv *kv, uint64_t hash, uint32_t tag, const void *key, size_t klen, const void *val,
                size_t vlen) {
    size_t size = sizeof(kv_entry) + klen + vlen;
    if (size > kv->budget) return;
    kv_entry *e = malloc(size);
    if (!e) return;
    e->node.key = hash;
    e->node.next = NULL;
    e->lru.prev = e->lru.next = NULL;
    e->tag = tag;
    e->klen = klen;
    e->vlen = vlen;
    memcpy(e->data, key, klen);
    memcpy(e->data + klen, val, vlen);
    pthread_mutex_lock(&kv->lock);
    kv_entry *old = find(kv, hash, tag, key, klen);
    if (old) drop(kv, old);
    while (kv->lru.oldest && kv->held + size + squad_hindex_bytes(&kv->index) > kv->budget) {
        drop(kv, SQUAD_LRU_ENTRY(kv->lru.oldest, kv_entry, lru));
        kv->evicted++;
    }
    if (squad_hindex_reserve(&kv->index, 1) < 0) {
        free(e);
    } else {
        squad_hindex_insert(&kv->index, &e->node);
        squad_lru_push_newest(&kv->lru, &e->lru);
        kv->held += size;
        kv->stored++;
    }
    pthread_mutex_unlock(&kv->lock);
}

void srv_kv_clear(srv_kv *kv) {
    pthread_mutex_lock(&kv->lock);
    drop_all(kv);
    pthread_mutex_unlock(&kv->lock);
}

void srv_kv_get_stats(srv_kv *kv, srv_kv_stats *out) {
    pthread_mutex_lock(&kv->lock);
    out->hits = kv->hits;
    out->misses = kv->misses;
    out->stored = kv->stored;
    out->evicted = kv->evicted;
    out->entries = kv->index.n_nodes;
    out->bytes_held = kv->held + squad_hindex_bytes(&kv->index);
    out->budget_bytes = kv->budget;
    pthread_mutex_unlock(&kv->lock);
}
