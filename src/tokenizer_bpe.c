/*
 * tokenizer_bpe.c — byte-pair encoding of one pre-tokenized word: its initial symbols, the merges
 * applied lowest rank first, and a cache of recent words.
 *
 * Design:
 * - Byte-level models work on raw bytes. A ByteLevel pre-tokenizer maps every byte to one of 256
 *   printable characters before BPE; that map is a bijection, so instead of mapping the text we map
 *   the vocabulary once at load time: the 256 single-byte symbols get their ids in a table, merges
 *   are pairs of ids, and a word is BPE'd straight from its bytes. Without a ByteLevel step the
 *   symbols are the word's UTF-8 characters, looked up by their text.
 * - The merge map is open addressing keyed by the pair of ids (Fibonacci hashing).
 * - BPE keeps the symbols of a word in a linked list and the candidate merges in a binary min-heap
 *   ordered by (merge rank, position), so a word of n symbols costs O(n log n); heap entries made
 *   stale by an earlier merge are recognised when popped (their pair no longer has that rank).
 * - Recent words (up to WC_KEY bytes) are kept in a small set-associative cache, bounded in size,
 *   replacing the least recently used entry of a set.
 * - All of it runs under the tokenizer's lock (tokenizer.c): the symbol arrays, the heap and the
 *   cache are the object's scratch.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "utf8.h"
#include "util.h"

/* ---------------------------------------------------------------------------------------------
 * The merge map
 * ------------------------------------------------------------------------------------------- */

static const merge_slot *merge_find(const squad_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> t->mshift);
    for (;;) {
        const merge_slot *m = &t->mmap[i];
        if (m->key == key) return m;
        if (m->key == MERGE_EMPTY) return NULL;
        i = (i + 1) & t->mmask;
    }
}

/* Records a merge; a later merge of the same pair replaces an earlier one (Hugging Face's map does). */
void tok_merge_insert(squad_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> t->mshift);
    while (t->mmap[i].key != MERGE_EMPTY && t->mmap[i].key != key) i = (i + 1) & t->mmask;
    t->mmap[i].key = key;
    t->mmap[i].rank = rank;
    t->mmap[i].id = id;
}

/* ---------------------------------------------------------------------------------------------
 * The word cache
 * ------------------------------------------------------------------------------------------- */

/* Appends the cached ids of word w to out: 1 on a hit, 0 on a miss, <0 on error. */
static int cache_get(squad_tokenizer *t, uint64_t h, const uint8_t *w, size_t n, squad_idvec *out, squad_err *err) {
    wc_entry *set = &t->cache[(h & (WC_SETS - 1)) * WC_WAYS];
    for (int k = 0; k < WC_WAYS; k++) {
        wc_entry *e = &set[k];
        if (e->hash == h && e->klen == n && !memcmp(e->key, w, n)) {
            e->stamp = ++t->cache_clock;
            if (squad_idvec_append(out, e->ids, e->nids, err) < 0) return SQUAD_E_NOMEM;
            return 1;
        }
    }
    return 0;
}

static void cache_put(squad_tokenizer *t, uint64_t h, const uint8_t *w, size_t n, const int32_t *ids, size_t nids) {
    if (n > WC_KEY || nids > WC_IDS || n == 0) return;
    wc_entry *set = &t->cache[(h & (WC_SETS - 1)) * WC_WAYS];
    wc_entry *victim = &set[0];
    for (int k = 0; k < WC_WAYS; k++) {
        if (set[k].klen == 0) { /* an empty way */
            victim = &set[k];
            break;
        }
        if (set[k].stamp < victim->stamp) victim = &set[k];
    }
    victim->hash = h;
    victim->klen = (uint8_t)n;
    victim->nids = (uint8_t)nids;
    victim->stamp = ++t->cache_clock;
    memcpy(victim->key, w, n);
    if (nids) memcpy(victim->ids, ids, nids * sizeof(int32_t));
}

/* ---------------------------------------------------------------------------------------------
 * BPE
 * ------------------------------------------------------------------------------------------- */

static int bpe_reserve(squad_tokenizer *t, size_t n, squad_err *err) {
    if (n > INT32_MAX / 4) return squad_fail(err, SQUAD_E_INVALID, "a word of %zu bytes is too long", n);
    if (n > t->sym_cap) {
        size_t cap = t->sym_cap;
        if (tok_grow((void **)&t->sym, &cap, n, sizeof(int32_t), err) < 0) return SQUAD_E_NOMEM;
        cap = t->sym_cap;
        if (tok_grow((void **)&t->sym_prev, &cap, n, sizeof(int32_t), err) < 0) return SQUAD_E_NOMEM;
        cap = t->sym_cap;
        if (tok_grow((void **)&t->sym_next, &cap, n, sizeof(int32_t), err) < 0) return SQUAD_E_NOMEM;
        t->sym_cap = cap;
    }
    /* each merge pushes at most two entries: 3n bounds the heap */
    if (tok_grow((void **)&t->heap, &t->heap_cap, 3 * n + 4, sizeof(uint64_t), err) < 0) return SQUAD_E_NOMEM;
    return 0;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], last = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (last <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = last;
    return top;
}

/* Symbol building state: Hugging Face holds back an unknown symbol so that fuse_unk can extend it. */
typedef struct sym_builder {
    size_t n;
    int have_unk;
} sym_builder;

static void sym_add(squad_tokenizer *t, sym_builder *b, int32_t id) { t->sym[b->n++] = id; }

/* Adds the symbol for one character (bytes c[0..k)) whose vocabulary id is id (-1: unknown). */
static void sym_add_char(squad_tokenizer *t, sym_builder *b, int32_t id, const uint8_t *c, size_t k) {
    if (id >= 0) {
        if (b->have_unk) sym_add(t, b, t->unk_id);
        b->have_unk = 0;
        sym_add(t, b, id);
        return;
    }
    if (t->byte_fallback) {
        int all = 1;
        for (size_t i = 0; i < k; i++) all &= t->fallback_id[c[i]] >= 0;
        if (all) {
            for (size_t i = 0; i < k; i++) sym_add(t, b, t->fallback_id[c[i]]);
            return;
        }
    }
    if (t->unk_id < 0) return; /* no unk token: the character is dropped */
    if (b->have_unk && !t->fuse_unk) sym_add(t, b, t->unk_id);
    b->have_unk = 1;
}

/* Fills t->sym with the initial symbols of word w; returns their count. */
static size_t bpe_symbols(squad_tokenizer *t, const uint8_t *w, size_t n) {
    sym_builder b = {0, 0};
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++) {
            int32_t id = t->byte_id[w[i]];
            if (id >= 0) {
                sym_add_char(t, &b, id, w + i, 1);
            } else { /* the symbol's text is the byte's alphabet character */
                char c[4];
                size_t k = squad_utf8_encode(t->bl_cp[w[i]], c);
                sym_add_char(t, &b, -1, (const uint8_t *)c, k);
            }
        }
    } else {
        for (size_t i = 0; i < n;) {
            size_t k = squad_utf8_char_len(w[i]);
            if (k > n - i) k = n - i;
            sym_add_char(t, &b, tok_vocab_id(t, (const char *)w + i, k), w + i, k);
            i += k;
        }
    }
    if (b.have_unk) sym_add(t, &b, t->unk_id);
    return b.n;
}

/* Applies merges to t->sym[0..n) lowest rank first (leftmost among equals) and appends the result. */
static int bpe_merge(squad_tokenizer *t, size_t n, squad_idvec *out, squad_err *err) {
    int32_t *sym = t->sym, *prev = t->sym_prev, *next = t->sym_next;
    uint64_t *heap = t->heap;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const merge_slot *m = merge_find(t, sym[i], sym[i + 1]);
        if (m) heap_push(heap, &hn, ((uint64_t)m->rank << 32) | i);
    }
    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        uint32_t rank = (uint32_t)(top >> 32);
        int32_t pos = (int32_t)(uint32_t)top;
        if (sym[pos] < 0) continue; /* merged away */
        int32_t nx = next[pos];
        if (nx < 0) continue;
        const merge_slot *m = merge_find(t, sym[pos], sym[nx]);
        if (!m || m->rank != rank) continue; /* stale: the pair changed since it was queued */
        sym[pos] = m->id;
        int32_t nn = next[nx];
        next[pos] = nn;
        if (nn >= 0) prev[nn] = pos;
        sym[nx] = -1;
        int32_t pv = prev[pos];
        if (pv >= 0 && (m = merge_find(t, sym[pv], sym[pos])) != NULL)
            heap_push(heap, &hn, ((uint64_t)m->rank << 32) | (uint32_t)pv);
        if (nn >= 0 && (m = merge_find(t, sym[pos], sym[nn])) != NULL)
            heap_push(heap, &hn, ((uint64_t)m->rank << 32) | (uint32_t)pos);
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = next[i])
        if (squad_idvec_push(out, sym[i], err) < 0) return SQUAD_E_NOMEM;
    return 0;
}

/* ignore_merges: the id of the whole word when the vocabulary has it, else -1. */
static int whole_word_id(squad_tokenizer *t, const uint8_t *w, size_t n, squad_err *err, int32_t *id) {
    *id = -1;
    if (!t->byte_level) {
        *id = tok_vocab_id(t, (const char *)w, n);
        return 0;
    }
    if (n > SIZE_MAX / 2 - 1 || tok_grow((void **)&t->word_buf, &t->word_cap, 2 * n + 1, 1, err) < 0)
        return squad_fail(err, SQUAD_E_NOMEM, "out of memory (word of %zu bytes)", n);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += squad_utf8_encode(t->bl_cp[w[i]], t->word_buf + k);
    *id = tok_vocab_id(t, t->word_buf, k);
    return 0;
}

/* One pre-tokenized word through the model. */
int tok_bpe_word(squad_tokenizer *t, const uint8_t *w, size_t n, squad_idvec *out, squad_err *err) {
    uint64_t h = 0;
    if (n <= WC_KEY) {
        h = squad_hash_bytes(TOK_HASH_SEED, w, n);
        int hit = cache_get(t, h, w, n, out, err);
        if (hit) return hit < 0 ? hit : 0;
    }
    size_t before = out->n;
    if (t->ignore_merges) {
        int32_t id;
        if (whole_word_id(t, w, n, err, &id) < 0) return SQUAD_E_NOMEM;
        if (id >= 0) return squad_idvec_push(out, id, err);
    }
    if (bpe_reserve(t, n, err) < 0) return err ? err->code : SQUAD_E_NOMEM;
    size_t ns = bpe_symbols(t, w, n);
    if (bpe_merge(t, ns, out, err) < 0) return SQUAD_E_NOMEM;
    if (n <= WC_KEY && out->n > before) cache_put(t, h, w, n, out->v + before, out->n - before);
    return 0;
}
