/*
 * memo.c — the exact-request memo (memo.h).
 *
 * One allocation per entry: the structure, then the row's ids, slots, nopts and letters (the
 * copy every hit is verified against), then the answer's probabilities for each slot's options,
 * then the router's probabilities (with specialists), then, when the answer has them, the
 * full-vocabulary figures of each slot. A forced specialist is part of the key: the same tokens
 * forced to another route (or left to the router) are another request.
 * A chained hash table over the 64-bit row hash finds candidates; an LRU list orders eviction.
 * The bytes held are the entries' allocations plus the bucket array, kept within the budget.
 */
#include "memo.h"

#include <stdlib.h>
#include <string.h>

#include "hash_index.h"
#include "lru.h"
#include "util.h"

#define MEMO_HASH_SEED 0x243f6a8885a308d3ull

/* A slot's full-vocabulary figures (squad_result's fields of the same names). */
typedef struct memo_vocab {
    float vocab_lse, letters_lse, top_logit, label_mass;
    int32_t top_token;
} memo_vocab;

typedef struct memo_entry {
    squad_hnode node;   /* key: the hash of the row's content */
    squad_lru_node lru; /* in the memo's LRU list */
    size_t bytes;
    int n_ids, n_slots, n_letters, state_len, specialist, route, n_routes;
    int32_t *ids, *slots, *nopts, *letters; /* inside this allocation */
    float *probs;                           /* the options of each slot, one slot after another */
    float *route_probs;                     /* [n_routes] */
    memo_vocab *vocab;                      /* [n_slots], or NULL when the answer had none */
} memo_entry;

struct squad_memo {
    size_t budget;
    squad_hindex index;
    size_t n_entries;
    size_t entry_bytes; /* the entries' allocations (the index's buckets are counted apart) */
    squad_lru lru; /* entries, least recently used first */
    squad_memo_stats stats;
};

static uint64_t row_key(const squad_row *r) {
    uint64_t h = MEMO_HASH_SEED;
    h = squad_hash_ints(h, r->ids, (size_t)r->n_ids);
    h = squad_hash_ints(h, r->slots, (size_t)r->n_slots);
    h = squad_hash_ints(h, r->nopts, (size_t)r->n_slots);
    h = squad_hash_ints(h, r->letters, (size_t)r->n_letters);
    h = squad_hash_mix(h ^ (uint64_t)(uint32_t)r->specialist);
    return squad_hash_mix(h ^ (uint64_t)(uint32_t)r->state_len);
}

static int same_ints(const int32_t *a, const int32_t *b, int n) { return n == 0 || !memcmp(a, b, (size_t)n * sizeof *a); }

static int entry_matches(const memo_entry *e, const squad_row *r) {
    return e->n_ids == r->n_ids && e->n_slots == r->n_slots && e->n_letters == r->n_letters &&
           e->state_len == r->state_len && e->specialist == r->specialist && same_ints(e->ids, r->ids, r->n_ids) &&
           same_ints(e->slots, r->slots, r->n_slots) && same_ints(e->nopts, r->nopts, r->n_slots) &&
           same_ints(e->letters, r->letters, r->n_letters);
}

static int total_options(const squad_row *r) {
    int n = 0;
    for (int i = 0; i < r->n_slots; i++) n += r->nopts[i];
    return n;
}

/* ---- index and LRU --------------------------------------------------------------------------- */

/* Every byte held: the entries and the bucket array. */
static size_t held(const squad_memo *m) { return m->entry_bytes + squad_hindex_bytes(&m->index); }

static memo_entry *entry_of(squad_lru_node *n) { return SQUAD_LRU_ENTRY(n, memo_entry, lru); }

static memo_entry *find(const squad_memo *m, const squad_row *r, uint64_t key) {
    for (const squad_hnode *x = squad_hindex_chain(&m->index, key); x; x = x->next) {
        memo_entry *e = SQUAD_HNODE_ENTRY(x, memo_entry, node);
        if (x->key == key && entry_matches(e, r)) return e;
    }
    return NULL;
}

static void remove_entry(squad_memo *m, memo_entry *e) {
    squad_hindex_remove(&m->index, &e->node);
    squad_lru_unlink(&m->lru, &e->lru);
    m->entry_bytes -= e->bytes;
    m->n_entries--;
    free(e);
    if (m->n_entries == 0) squad_hindex_fit(&m->index);
}

/* ---- the API --------------------------------------------------------------------------------- */

squad_memo *squad_memo_new(size_t budget_bytes, squad_err *err) {
    squad_memo *m = squad_calloc(1, sizeof *m, err);
    if (m) m->budget = budget_bytes;
    return m;
}

void squad_memo_free(squad_memo *m) {
    if (!m) return;
    squad_memo_clear(m);
    squad_hindex_free(&m->index);
    free(m);
}

int squad_memo_get(squad_memo *m, const squad_row *r, squad_result *out) { return squad_memo_lookup(m, r, 0, out); }

int squad_memo_lookup(squad_memo *m, const squad_row *r, int need_vocab, squad_result *out) {
    if (!m || !r) return 0;
    memo_entry *e = find(m, r, row_key(r));
    if (!e || (need_vocab && !e->vocab)) {
        m->stats.misses++;
        return 0;
    }
    squad_lru_unlink(&m->lru, &e->lru);
    squad_lru_push_newest(&m->lru, &e->lru);
    memset(out, 0, sizeof *out);
    out->n_slots = e->n_slots;
    out->route = e->route;
    out->n_routes = e->n_routes;
    if (e->n_routes) memcpy(out->route_probs, e->route_probs, (size_t)e->n_routes * sizeof *e->route_probs);
    const float *p = e->probs;
    for (int i = 0; i < e->n_slots; i++) {
        memcpy(out->probs[i], p, (size_t)e->nopts[i] * sizeof *p);
        p += e->nopts[i];
    }
    if (need_vocab) {
        out->has_vocab = 1;
        for (int i = 0; i < e->n_slots; i++) {
            out->vocab_lse[i] = e->vocab[i].vocab_lse;
            out->letters_lse[i] = e->vocab[i].letters_lse;
            out->top_logit[i] = e->vocab[i].top_logit;
            out->top_token[i] = e->vocab[i].top_token;
            out->label_mass[i] = e->vocab[i].label_mass;
        }
    }
    m->stats.hits++;
    return 1;
}

int squad_memo_put(squad_memo *m, const squad_row *r, const squad_result *res, squad_err *err) {
    if (!m || !r || !res) return squad_fail(err, SQUAD_E_INVALID, "memo: nothing to store");
    if (r->n_slots > SQUAD_MAX_SLOTS_PER_ROW) return squad_fail(err, SQUAD_E_INVALID, "memo: too many slots");
    if (res->n_routes < 0 || res->n_routes > SQUAD_MAX_ROUTES) return squad_fail(err, SQUAD_E_INVALID, "memo: bad routes");
    for (int i = 0; i < r->n_slots; i++)
        if (r->nopts[i] < 0 || r->nopts[i] > SQUAD_MAX_LETTERS) return squad_fail(err, SQUAD_E_INVALID, "memo: bad nopts");
    const uint64_t key = row_key(r);
    memo_entry *old = find(m, r, key);
    if (old) remove_entry(m, old); /* the newer answer replaces it */

    const size_t n_ints = (size_t)r->n_ids + 2 * (size_t)r->n_slots + (size_t)r->n_letters;
    const size_t n_probs = (size_t)total_options(r) + (size_t)res->n_routes;
    const size_t n_vocab = res->has_vocab ? (size_t)r->n_slots : 0;
    /* the figures after the probabilities, aligned for their struct */
    const size_t vocab_off = (sizeof(memo_entry) + n_ints * sizeof(int32_t) + n_probs * sizeof(float) +
                              _Alignof(memo_vocab) - 1) / _Alignof(memo_vocab) * _Alignof(memo_vocab);
    const size_t bytes = vocab_off + n_vocab * sizeof(memo_vocab);
    if (bytes + SQUAD_HINDEX_MIN_BUCKETS * sizeof(squad_hnode *) > m->budget) return 0; /* never fits */
    memo_entry *e = squad_malloc(bytes, err);
    if (!e) return SQUAD_E_NOMEM;
    memset(e, 0, sizeof *e);
    e->node.key = key;
    e->bytes = bytes;
    e->n_ids = r->n_ids;
    e->n_slots = r->n_slots;
    e->n_letters = r->n_letters;
    e->state_len = r->state_len;
    e->specialist = r->specialist;
    e->route = res->route;
    e->n_routes = res->n_routes;
    e->ids = (int32_t *)(e + 1);
    e->slots = e->ids + r->n_ids;
    e->nopts = e->slots + r->n_slots;
    e->letters = e->nopts + r->n_slots;
    e->probs = (float *)(e->letters + r->n_letters);
    if (r->n_ids) memcpy(e->ids, r->ids, (size_t)r->n_ids * sizeof *e->ids);
    if (r->n_slots) {
        memcpy(e->slots, r->slots, (size_t)r->n_slots * sizeof *e->slots);
        memcpy(e->nopts, r->nopts, (size_t)r->n_slots * sizeof *e->nopts);
    }
    if (r->n_letters) memcpy(e->letters, r->letters, (size_t)r->n_letters * sizeof *e->letters);
    float *p = e->probs;
    for (int i = 0; i < r->n_slots; i++) {
        memcpy(p, res->probs[i], (size_t)r->nopts[i] * sizeof *p);
        p += r->nopts[i];
    }
    e->route_probs = p;
    if (res->n_routes) memcpy(p, res->route_probs, (size_t)res->n_routes * sizeof *p);
    e->vocab = n_vocab ? (memo_vocab *)((char *)e + vocab_off) : NULL;
    for (size_t i = 0; i < n_vocab; i++) {
        e->vocab[i].vocab_lse = res->vocab_lse[i];
        e->vocab[i].letters_lse = res->letters_lse[i];
        e->vocab[i].top_logit = res->top_logit[i];
        e->vocab[i].top_token = res->top_token[i];
        e->vocab[i].label_mass = res->label_mass[i];
    }

    if (squad_hindex_reserve(&m->index, 1)) {
        free(e);
        return squad_fail(err, SQUAD_E_NOMEM, "memo: out of memory for its index");
    }
    squad_hindex_insert(&m->index, &e->node);
    squad_lru_push_newest(&m->lru, &e->lru);
    m->n_entries++;
    m->entry_bytes += bytes;
    m->stats.stored++;
    /* least recently used first; the new entry is the most recent and fits on its own */
    while (held(m) > m->budget && entry_of(m->lru.oldest) != e) {
        remove_entry(m, entry_of(m->lru.oldest));
        m->stats.evicted++;
    }
    squad_hindex_fit(&m->index);
    if (held(m) > m->budget) { /* only when the index could not shrink: give the entry up */
        remove_entry(m, e);
        m->stats.evicted++;
    }
    return 0;
}

void squad_memo_clear(squad_memo *m) {
    if (!m) return;
    while (m->lru.oldest) remove_entry(m, entry_of(m->lru.oldest));
}

void squad_memo_get_stats(const squad_memo *m, squad_memo_stats *out) {
    memset(out, 0, sizeof *out);
    if (!m) return;
    *out = m->stats;
    out->entries = m->n_entries;
    out->bytes_held = held(m);
    out->budget_bytes = m->budget;
}
