/*
 * lru_map.c — the byte-bounded LRU map (lru_map.h).
 *
 * An entry is one allocation: its header (the hash index's node, the LRU list's node, the lengths),
 * then the key bytes, then the value bytes. The bytes held are the entries' allocations plus the
 * index's bucket array. A put inserts first and evicts after, so the bucket array the new entry
 * needed is counted before deciding what stays.
 */
#include "lru_map.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hash_index.h"
#include "lru.h"
#include "util.h"

typedef struct map_entry {
    squad_hnode node;   /* key: the caller's hash */
    squad_lru_node lru; /* in the map's LRU list */
    size_t klen, vlen;
    unsigned char data[]; /* the key, then the value */
} map_entry;

struct squad_lru_map {
    int locked; /* SQUAD_LRU_MAP_LOCKED: lock is used */
    pthread_mutex_t lock;
    size_t budget;
    size_t entry_bytes; /* the entries' allocations (the index's buckets are counted apart) */
    squad_hindex index;
    squad_lru lru; /* least recently used first */
    squad_lru_map_stats stats;
};

static void map_lock(squad_lru_map *m) {
    if (m->locked) pthread_mutex_lock(&m->lock);
}
static void map_unlock(squad_lru_map *m) {
    if (m->locked) pthread_mutex_unlock(&m->lock);
}

static size_t entry_size(const map_entry *e) { return sizeof *e + e->klen + e->vlen; }

/* Every byte held: the entries and the bucket array. */
static size_t held(const squad_lru_map *m) { return m->entry_bytes + squad_hindex_bytes(&m->index); }

static map_entry *entry_of(squad_lru_node *n) { return SQUAD_LRU_ENTRY(n, map_entry, lru); }

static size_t pieces_len(const squad_bytes *b, int n) {
    size_t len = 0;
    for (int i = 0; i < n; i++) len += b[i].n;
    return len;
}

/* Copies the pieces one after another to dst; the byte after them. */
static unsigned char *copy_pieces(unsigned char *dst, const squad_bytes *b, int n) {
    for (int i = 0; i < n; i++) {
        if (b[i].n) memcpy(dst, b[i].p, b[i].n);
        dst += b[i].n;
    }
    return dst;
}

/* 1 when the stored key equals the concatenation of the pieces. */
static int key_equals(const map_entry *e, const squad_bytes *key, int n_key, size_t klen) {
    if (e->klen != klen) return 0;
    size_t at = 0;
    for (int i = 0; i < n_key; i++) {
        if (key[i].n && memcmp(e->data + at, key[i].p, key[i].n)) return 0;
        at += key[i].n;
    }
    return 1;
}

static map_entry *find(const squad_lru_map *m, uint64_t hash, const squad_bytes *key, int n_key, size_t klen) {
    for (const squad_hnode *x = squad_hindex_chain(&m->index, hash); x; x = x->next) {
        if (x->key != hash) continue;
        map_entry *e = SQUAD_HNODE_ENTRY(x, map_entry, node);
        if (key_equals(e, key, n_key, klen)) return e;
    }
    return NULL;
}

static void remove_entry(squad_lru_map *m, map_entry *e) {
    squad_hindex_remove(&m->index, &e->node);
    squad_lru_unlink(&m->lru, &e->lru);
    m->entry_bytes -= entry_size(e);
    free(e);
    if (m->index.n_nodes == 0) squad_hindex_fit(&m->index);
}

squad_lru_map *squad_lru_map_new(size_t budget_bytes, unsigned flags, squad_err *err) {
    squad_lru_map *m = squad_calloc(1, sizeof *m, err);
    if (!m) return NULL;
    m->budget = budget_bytes;
    if (flags & SQUAD_LRU_MAP_LOCKED) {
        if (pthread_mutex_init(&m->lock, NULL) != 0) {
            free(m);
            squad_fail(err, SQUAD_E_NOMEM, "cannot create a cache's lock");
            return NULL;
        }
        m->locked = 1;
    }
    return m;
}

void squad_lru_map_free(squad_lru_map *m) {
    if (!m) return;
    while (m->lru.oldest) remove_entry(m, entry_of(m->lru.oldest));
    squad_hindex_free(&m->index);
    if (m->locked) pthread_mutex_destroy(&m->lock);
    free(m);
}

int squad_lru_map_get(squad_lru_map *m, uint64_t hash, const squad_bytes *key, int n_key, squad_lru_map_use use,
                      void *ctx) {
    const size_t klen = pieces_len(key, n_key);
    map_lock(m);
    map_entry *e = find(m, hash, key, n_key, klen);
    int rc = e ? use(ctx, e->data + e->klen, e->vlen) : 0;
    if (rc == 0) {
        m->stats.misses++;
    } else {
        squad_lru_unlink(&m->lru, &e->lru);
        squad_lru_push_newest(&m->lru, &e->lru);
        m->stats.hits++;
    }
    map_unlock(m);
    return rc;
}

/* Least recently used first, sparing keep (NULL: none), until at most bytes are held. */
static void evict_locked(squad_lru_map *m, size_t bytes, const map_entry *keep) {
    while (held(m) > bytes && m->lru.oldest && entry_of(m->lru.oldest) != keep) {
        remove_entry(m, entry_of(m->lru.oldest));
        m->stats.evicted++;
    }
}

int squad_lru_map_put(squad_lru_map *m, uint64_t hash, const squad_bytes *key, int n_key, const squad_bytes *val,
                      int n_val, squad_err *err) {
    const size_t klen = pieces_len(key, n_key), vlen = pieces_len(val, n_val);
    /* an entry that cannot fit even alone, with the smallest bucket array, is never stored */
    const size_t alone = sizeof(map_entry) + SQUAD_HINDEX_MIN_BUCKETS * sizeof(squad_hnode *);
    if (klen > m->budget || vlen > m->budget || alone + klen + vlen > m->budget) return 0;
    const size_t size = sizeof(map_entry) + klen + vlen;
    map_entry *e = squad_malloc(size, err);
    if (!e) return SQUAD_E_NOMEM;
    e->node.key = hash;
    e->node.next = NULL;
    e->lru.prev = e->lru.next = NULL;
    e->klen = klen;
    e->vlen = vlen;
    copy_pieces(copy_pieces(e->data, key, n_key), val, n_val);
    map_lock(m);
    map_entry *old = find(m, hash, key, n_key, klen);
    if (old) remove_entry(m, old); /* the newer value replaces it */
    if (squad_hindex_reserve(&m->index, 1) < 0) {
        map_unlock(m);
        free(e);
        return squad_fail(err, SQUAD_E_NOMEM, "out of memory for a cache's index");
    }
    squad_hindex_insert(&m->index, &e->node);
    squad_lru_push_newest(&m->lru, &e->lru);
    m->entry_bytes += size;
    m->stats.stored++;
    /* the new entry is the most recent and fits on its own */
    evict_locked(m, m->budget, e);
    squad_hindex_fit(&m->index);
    if (held(m) > m->budget) { /* only when the index could not shrink: give the entry up */
        remove_entry(m, e);
        m->stats.evicted++;
    }
    map_unlock(m);
    return 0;
}

void squad_lru_map_evict_to(squad_lru_map *m, size_t bytes) {
    map_lock(m);
    evict_locked(m, bytes, NULL);
    squad_hindex_fit(&m->index);
    map_unlock(m);
}

void squad_lru_map_clear(squad_lru_map *m) {
    map_lock(m);
    while (m->lru.oldest) remove_entry(m, entry_of(m->lru.oldest));
    map_unlock(m);
}

void squad_lru_map_get_stats(squad_lru_map *m, squad_lru_map_stats *out) {
    map_lock(m);
    *out = m->stats;
    out->entries = m->index.n_nodes;
    out->bytes_held = held(m);
    out->budget_bytes = m->budget;
    map_unlock(m);
}
