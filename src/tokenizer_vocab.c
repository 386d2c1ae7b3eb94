/*
 * tokenizer_vocab.c — the tokenizer's lookup tables: the vocabulary map (a token's text -> its id)
 * and the tries of added tokens, with the public lookups built on them (squad_tokenizer_token_id,
 * squad_tokenizer_find_added, squad_tokenizer_vocab_size).
 *
 * Design:
 * - The vocabulary map is open addressing over indexes into the key array (150k+ keys, the text in
 *   the tokenizer's arena), at most half full, so a lookup is one hash and a short probe.
 * - Added tokens are matched leftmost-longest, as Hugging Face's AddedVocabulary does, with a byte
 *   trie: the root's children are a table (every match starts there), deeper nodes keep child /
 *   sibling lists since their fan-out is small.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

/* ---------------------------------------------------------------------------------------------
 * The vocabulary map
 * ------------------------------------------------------------------------------------------- */

/* The vocabulary key index of s, or -1. */
static int32_t vocab_find(const squad_tokenizer *t, const char *s, size_t n) {
    if (!t->vmap) return -1;
    size_t i = squad_hash_bytes(TOK_HASH_SEED, s, n) & t->vmask;
    for (;;) {
        uint32_t k = t->vmap[i];
        if (!k) return -1;
        const vocab_key *vk = &t->vkeys[k - 1];
        if (vk->len == n && !memcmp(t->arena + vk->off, s, n)) return (int32_t)(k - 1);
        i = (i + 1) & t->vmask;
    }
}

int32_t tok_vocab_id(const squad_tokenizer *t, const char *s, size_t n) {
    int32_t k = vocab_find(t, s, n);
    return k < 0 ? -1 : t->vkeys[k].id;
}

/* Inserts key index k; returns 1 when the key was already there (the later one replaces it). */
int tok_vocab_insert(squad_tokenizer *t, uint32_t k) {
    const vocab_key *vk = &t->vkeys[k];
    size_t i = squad_hash_bytes(TOK_HASH_SEED, t->arena + vk->off, vk->len) & t->vmask;
    int dup = 0;
    while (t->vmap[i]) {
        const vocab_key *o = &t->vkeys[t->vmap[i] - 1];
        if (o->len == vk->len && !memcmp(t->arena + o->off, t->arena + vk->off, vk->len)) {
            dup = 1;
            break;
        }
        i = (i + 1) & t->vmask;
    }
    t->vmap[i] = k + 1;
    return dup;
}

/* ---------------------------------------------------------------------------------------------
 * Added tokens: the trie and leftmost-longest matching
 * ------------------------------------------------------------------------------------------- */

void tok_trie_init(added_trie *tr) {
    memset(tr, 0, sizeof *tr);
    for (int i = 0; i < 256; i++) tr->root[i] = -1;
    tr->empty = 1;
}

static int trie_new_node(added_trie *tr, uint8_t byte, int32_t *out, squad_err *err) {
    if (tok_grow((void **)&tr->nodes, &tr->cap, tr->n + 1, sizeof(trie_node), err) < 0) return SQUAD_E_NOMEM;
    trie_node *nd = &tr->nodes[tr->n];
    nd->child = nd->sibling = nd->added = -1;
    nd->byte = byte;
    *out = (int32_t)tr->n++;
    return 0;
}

/* Adds s[0..n) (n > 0) for added token index a; the first token of a content wins. */
int tok_trie_add(added_trie *tr, const char *s, size_t n, int32_t a, squad_err *err) {
    const uint8_t *b = (const uint8_t *)s;
    int32_t node = tr->root[b[0]];
    if (node < 0) {
        if (trie_new_node(tr, b[0], &node, err) < 0) return SQUAD_E_NOMEM;
        tr->root[b[0]] = node;
    }
    for (size_t i = 1; i < n; i++) {
        int32_t c = tr->nodes[node].child;
        while (c >= 0 && tr->nodes[c].byte != b[i]) c = tr->nodes[c].sibling;
        if (c < 0) {
            if (trie_new_node(tr, b[i], &c, err) < 0) return SQUAD_E_NOMEM;
            tr->nodes[c].sibling = tr->nodes[node].child;
            tr->nodes[node].child = c;
        }
        node = c;
    }
    if (tr->nodes[node].added < 0) tr->nodes[node].added = a;
    tr->empty = 0;
    return 0;
}

/* The longest token starting at s[i]: its end in *end and index in *a; 0 when none starts there. */
static int trie_longest_at(const added_trie *tr, const char *s, size_t len, size_t i, size_t *end, int32_t *a) {
    int32_t node = tr->root[(uint8_t)s[i]];
    int found = 0;
    size_t j = i + 1;
    while (node >= 0) {
        if (tr->nodes[node].added >= 0) {
            *a = tr->nodes[node].added;
            *end = j;
            found = 1;
        }
        if (j >= len) break;
        int32_t c = tr->nodes[node].child;
        while (c >= 0 && tr->nodes[c].byte != (uint8_t)s[j]) c = tr->nodes[c].sibling;
        node = c;
        j++;
    }
    return found;
}

/* The leftmost-longest match at or after from: 1 with [*ms, *me) and token index *a, else 0. */
int tok_trie_find(const added_trie *tr, const char *s, size_t len, size_t from, size_t *ms, size_t *me,
                     int32_t *a) {
    if (tr->empty) return 0;
    for (size_t i = from; i < len; i++) {
        if (tr->root[(uint8_t)s[i]] < 0) continue;
        if (trie_longest_at(tr, s, len, i, me, a)) {
            *ms = i;
            return 1;
        }
    }
    return 0;
}

int squad_tokenizer_find_added(const squad_tokenizer *tok, const char *s, size_t len, size_t *start, size_t *end,
                               int32_t *id) {
    size_t s1 = 0, e1 = 0, s2 = 0, e2 = 0;
    int32_t a1 = -1, a2 = -1;
    int f1 = tok_trie_find(&tok->raw_trie, s, len, 0, &s1, &e1, &a1);
    int f2 = tok_trie_find(&tok->norm_trie, s, len, 0, &s2, &e2, &a2);
    if (f2 && (!f1 || s2 < s1 || (s2 == s1 && e2 > e1))) {
        s1 = s2;
        e1 = e2;
        a1 = a2;
        f1 = 1;
    }
    if (!f1) return 0;
    *start = s1;
    *end = e1;
    *id = tok->added[a1].id;
    return 1;
}

/* ---------------------------------------------------------------------------------------------
 * Lookups
 * ------------------------------------------------------------------------------------------- */

int32_t squad_tokenizer_token_id(const squad_tokenizer *tok, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; i < tok->n_added; i++) {
        const added_tok *a = &tok->added[i];
        if (a->len == n && !memcmp(tok->arena + a->off, token, n)) return a->id;
    }
    return tok_vocab_id(tok, token, n);
}

int squad_tokenizer_vocab_size(const squad_tokenizer *tok) { return tok->n_ids; }
