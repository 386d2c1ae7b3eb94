/*
 * tokenizer.c — the Hugging Face byte-level BPE tokenizer (see tokenizer.h for the pipeline).
 *
 * Design:
 * - Byte-level models work on raw bytes. A ByteLevel pre-tokenizer maps every byte to one of 256
 *   printable characters before BPE; that map is a bijection, so instead of mapping the text we map
 *   the vocabulary once at load time: the 256 single-byte symbols get their ids in a table, merges
 *   are pairs of ids, and a word is BPE'd straight from its bytes. Without a ByteLevel step the
 *   symbols are the word's UTF-8 characters, looked up by their text.
 * - BPE keeps the symbols of a word in a linked list and the candidate merges in a binary min-heap
 *   ordered by (merge rank, position), so a word of n symbols costs O(n log n); heap entries made
 *   stale by an earlier merge are recognised when popped (their pair no longer has that rank).
 * - Recent words (up to WC_KEY bytes) are kept in a small set-associative cache, bounded in size,
 *   replacing the least recently used entry of a set.
 * - Regexes are the file's own, translated where Oniguruma (which Hugging Face uses) and PCRE2 differ
 *   (\s also matches U+0085; \h is a hex digit) and compiled with UTF + UCP and JIT. Matches are
 *   iterated exactly as Hugging Face iterates Oniguruma's, so empty matches behave the same.
 * - Loading: model.vocab and model.merges (nearly all of an 11 MB file) are read straight from the
 *   text and jansson parses the rest; on anything unusual the whole file goes through jansson, so the
 *   result never depends on the path (the fuzz target checks both agree).
 * - All mutable scratch (match data, JIT stack, BPE arrays, the cache) lives in the tokenizer object,
 *   and a mutex in the object serialises encoding, so several threads may encode with one tokenizer
 *   (the server's connection threads). An optional text cache (squad_tokenizer_set_text_cache) is
 *   consulted outside that lock, so a text seen before costs neither the lock nor the encoding.
 */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer.h"

#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "util.h"

/* ---------------------------------------------------------------------------------------------
 * Limits and constants
 * ------------------------------------------------------------------------------------------- */

#define TOK_MAX_IDS (1 << 24)      /* the largest token id + 1 we accept */
#define TOK_MAX_STAGES 16          /* pre-tokenizer steps */
#define TOK_MAX_NORM 16            /* normaliser steps */
#define TOK_REGEX_MATCH_LIMIT 20000000u
#define TOK_JIT_STACK_MAX (8u << 20)

#define WC_SETS 8192 /* word cache: sets x ways entries */
#define WC_WAYS 2
#define WC_KEY 32 /* longest cached word, bytes */
#define WC_IDS 7  /* most ids a cached word may have */

enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD };
enum { PT_SPLIT, PT_BYTELEVEL };
enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { DEC_NONE, DEC_BYTELEVEL };

/* The GPT-2 regex a ByteLevel pre-tokenizer with use_regex runs (Hugging Face's, verbatim). */
static const char GPT2_REGEX[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---------------------------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------------------------- */

/* What one token id is. Strings live in the tokenizer's arena. */
typedef struct tok_info {
    uint32_t dec_off, dec_len; /* the bytes the decoder turns it into */
    int32_t key;               /* index into vkeys (its vocabulary key), -1 when not in the vocabulary */
    int32_t added;             /* index into added[], -1 when not an added token */
} tok_info;

/* A vocabulary key: arena bytes and the id it maps to. */
typedef struct vocab_key {
    uint32_t off, len;
    int32_t id;
} vocab_key;

/* One merge: the pair (a, b) packed in key, its rank (line number) and the merged token's id. */
typedef struct merge_slot {
    uint64_t key; /* MERGE_EMPTY when unused */
    uint32_t rank;
    int32_t id;
} merge_slot;
#define MERGE_EMPTY UINT64_MAX

typedef struct added_tok {
    int32_t id;
    uint32_t off, len; /* content in the arena (normalised when normalized is set) */
    uint8_t special, lstrip, rstrip, single_word, normalized;
} added_tok;

/* A byte trie over added-token contents: leftmost-longest matching. The root's children are a
 * table; deeper nodes keep child / sibling lists (fan-out there is small). */
typedef struct trie_node {
    int32_t child, sibling, added;
    uint8_t byte;
} trie_node;

typedef struct added_trie {
    trie_node *nodes;
    size_t n, cap;
    int32_t root[256]; /* node of each first byte, -1 */
    int empty;
} added_trie;

typedef struct pretok_stage {
    int kind;
    pcre2_code *re; /* Split's regex, or ByteLevel's when use_regex */
    int jit;        /* re was JIT-compiled */
    int behavior, invert;
    int add_prefix_space, use_regex;
    char *scratch; /* ByteLevel: the piece with its prefix space */
    size_t scratch_cap;
} pretok_stage;

typedef struct wc_entry {
    uint64_t hash;
    uint32_t stamp;
    uint8_t klen, nids;
    char key[WC_KEY];
    int32_t ids[WC_IDS];
} wc_entry;

struct squad_tokenizer {
    char *arena;
    size_t arena_len, arena_cap;

    tok_info *info;
    int32_t n_ids;

    vocab_key *vkeys;
    size_t n_vkeys, cap_vkeys;
    uint32_t *vmap; /* open addressing: index into vkeys + 1, 0 when empty */
    size_t vmask;

    merge_slot *mmap;
    size_t mmask;
    int mshift; /* 64 - log2(slots): Fibonacci hashing takes the product's top bits */

    added_tok *added;
    int n_added;
    added_trie raw_trie;  /* tokens matched in the raw text */
    added_trie norm_trie; /* tokens matched in the normalised text */

    int norm[TOK_MAX_NORM];
    int n_norm;

    pretok_stage stages[TOK_MAX_STAGES];
    int n_stages;
    int byte_level;           /* a ByteLevel step: BPE symbols are bytes */
    uint16_t bl_cp[256];      /* the byte-level alphabet: byte -> code point */
    int16_t bl_byte[324];     /* and back (-1: not in the alphabet) */
    int32_t byte_id[256];     /* byte-level: the id of each byte's symbol, -1 */
    int32_t fallback_id[256]; /* byte_fallback: the id of <0xXX>, -1 */
    int byte_fallback, ignore_merges, fuse_unk;
    int32_t unk_id;
    int decoder;

    /* scratch */
    wc_entry *cache;
    uint32_t cache_clock;
    int32_t *sym, *sym_prev, *sym_next;
    size_t sym_cap;
    uint64_t *heap;
    size_t heap_cap;
    char *word_buf; /* a word re-spelled for a whole-word vocabulary lookup */
    size_t word_cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    /* concurrency: encoding holds the lock (the scratch above is shared); the text cache is the
     * caller's and has its own */
    pthread_mutex_t lock;
    int lock_ready;
    squad_tok_text_cache text_cache;
};

/* ---------------------------------------------------------------------------------------------
 * Small helpers: hashing, growable buffers, UTF-8
 * ------------------------------------------------------------------------------------------- */

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
    return h;
}


/* Grows *buf (element size elem) to hold at least need elements. */
static int grow(void **buf, size_t *cap, size_t need, size_t elem, squad_err *err) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem) return squad_fail(err, SQUAD_E_NOMEM, "out of memory (buffer of %zu)", need);
        nc *= 2;
    }
    void *nb = realloc(*buf, nc * elem);
    if (!nb) return squad_fail(err, SQUAD_E_NOMEM, "out of memory (%zu bytes)", nc * elem);
    *buf = nb;
    *cap = nc;
    return 0;
}

int squad_idvec_push(squad_idvec *vec, int32_t id, squad_err *err) {
    if (vec->n == vec->cap && grow((void **)&vec->v, &vec->cap, vec->n + 1, sizeof(int32_t), err) < 0)
        return err ? err->code : SQUAD_E_NOMEM;
    vec->v[vec->n++] = id;
    return 0;
}

int squad_idvec_append(squad_idvec *vec, const int32_t *ids, size_t n, squad_err *err) {
    if (n > SIZE_MAX - vec->n) return squad_fail(err, SQUAD_E_NOMEM, "too many ids");
    if (grow((void **)&vec->v, &vec->cap, vec->n + n, sizeof(int32_t), err) < 0) return SQUAD_E_NOMEM;
    if (n) memcpy(vec->v + vec->n, ids, n * sizeof(int32_t));
    vec->n += n;
    return 0;
}

void squad_idvec_free(squad_idvec *vec) {
    free(vec->v);
    vec->v = NULL;
    vec->n = vec->cap = 0;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one. */
static size_t utf8_seq_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;      /* no overlong forms */
        else if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        return 0;
    }
    if (n <= need) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k <= need; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return need + 1;
}

size_t squad_utf8_invalid_offset(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        /* ASCII runs eight bytes at a time */
        while (i + 8 <= len) {
            uint64_t v;
            memcpy(&v, s + i, 8);
            if (v & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_seq_len(s + i, len - i);
        if (!k) return i;
        i += k;
    }
    return len;
}

/* Decodes the (valid) UTF-8 character at s; its length in *k. */
static int32_t utf8_decode(const unsigned char *s, size_t *k) {
    unsigned c = s[0];
    if (c < 0x80) {
        *k = 1;
        return (int32_t)c;
    }
    if (c < 0xE0) {
        *k = 2;
        return (int32_t)(((c & 0x1F) << 6) | (s[1] & 0x3F));
    }
    if (c < 0xF0) {
        *k = 3;
        return (int32_t)(((c & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F));
    }
    *k = 4;
    return (int32_t)(((c & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F));
}

/* Length of the UTF-8 character that starts with byte c (1 for a stray byte). */
static size_t utf8_char_len(unsigned char c) {
    if (c < 0xC0) return 1;
    if (c < 0xE0) return 2;
    if (c < 0xF0) return 3;
    return 4;
}

static size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Rust's char::is_whitespace (the Unicode White_Space property): lstrip / rstrip use it. */
static int is_unicode_space(int32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* A "word" character for single_word added tokens: letters, marks, numbers, connector punctuation. */
static int is_word_char(int32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    utf8proc_category_t cat = utf8proc_category(c);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_NO) || cat == UTF8PROC_CATEGORY_PC;
}

/* The code point that ends at s[end) (the text is valid UTF-8 and end > 0). */
static int32_t utf8_prev_char(const char *s, size_t end, size_t *start) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    size_t k;
    int32_t c = utf8_decode((const unsigned char *)s + i, &k);
    *start = i;
    return c;
}

/* ---------------------------------------------------------------------------------------------
 * The byte-level alphabet: bytes 0..255 <-> 256 printable code points (GPT-2's bytes_to_unicode)
 * ------------------------------------------------------------------------------------------- */

static int byte_is_printable(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); }

/* Fills the byte -> code point table and its inverse (code points 0..323; -1 where none). */
static void byte_alphabet(uint16_t *to_cp, int16_t *to_byte) {
    int n = 0;
    for (int cp = 0; cp < 324; cp++) to_byte[cp] = -1;
    for (int b = 0; b < 256; b++) {
        to_cp[b] = (uint16_t)(byte_is_printable(b) ? b : 256 + n++);
        to_byte[to_cp[b]] = (int16_t)b;
    }
}

/* ---------------------------------------------------------------------------------------------
 * The arena, the vocabulary map and the merge map
 * ------------------------------------------------------------------------------------------- */

/* Copies n bytes into the arena; their offset in *off. */
static int arena_put(squad_tokenizer *t, const char *s, size_t n, uint32_t *off, squad_err *err) {
    if (t->arena_len + n > UINT32_MAX) return squad_fail(err, SQUAD_E_UNSUPPORTED, "tokenizer strings exceed 4 GiB");
    if (grow((void **)&t->arena, &t->arena_cap, t->arena_len + n + 1, 1, err) < 0) return SQUAD_E_NOMEM;
    if (n) memcpy(t->arena + t->arena_len, s, n);
    *off = (uint32_t)t->arena_len;
    t->arena_len += n;
    return 0;
}

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p *= 2;
    return p;
}

/* The vocabulary key index of s, or -1. */
static int32_t vocab_find(const squad_tokenizer *t, const char *s, size_t n) {
    if (!t->vmap) return -1;
    size_t i = hash_bytes(s, n) & t->vmask;
    for (;;) {
        uint32_t k = t->vmap[i];
        if (!k) return -1;
        const vocab_key *vk = &t->vkeys[k - 1];
        if (vk->len == n && !memcmp(t->arena + vk->off, s, n)) return (int32_t)(k - 1);
        i = (i + 1) & t->vmask;
    }
}

static int32_t vocab_id(const squad_tokenizer *t, const char *s, size_t n) {
    int32_t k = vocab_find(t, s, n);
    return k < 0 ? -1 : t->vkeys[k].id;
}

/* Inserts key index k; returns 1 when the key was already there (the later one replaces it). */
static int vocab_insert(squad_tokenizer *t, uint32_t k) {
    const vocab_key *vk = &t->vkeys[k];
    size_t i = hash_bytes(t->arena + vk->off, vk->len) & t->vmask;
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
static void merge_insert(squad_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> t->mshift);
    while (t->mmap[i].key != MERGE_EMPTY && t->mmap[i].key != key) i = (i + 1) & t->mmask;
    t->mmap[i].key = key;
    t->mmap[i].rank = rank;
    t->mmap[i].id = id;
}

/* ---------------------------------------------------------------------------------------------
 * Added tokens: the trie and leftmost-longest matching
 * ------------------------------------------------------------------------------------------- */

static void trie_init(added_trie *tr) {
    memset(tr, 0, sizeof *tr);
    for (int i = 0; i < 256; i++) tr->root[i] = -1;
    tr->empty = 1;
}

static int trie_new_node(added_trie *tr, uint8_t byte, int32_t *out, squad_err *err) {
    if (grow((void **)&tr->nodes, &tr->cap, tr->n + 1, sizeof(trie_node), err) < 0) return SQUAD_E_NOMEM;
    trie_node *nd = &tr->nodes[tr->n];
    nd->child = nd->sibling = nd->added = -1;
    nd->byte = byte;
    *out = (int32_t)tr->n++;
    return 0;
}

/* Adds s[0..n) (n > 0) for added token index a; the first token of a content wins. */
static int trie_add(added_trie *tr, const char *s, size_t n, int32_t a, squad_err *err) {
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
static int trie_find(const added_trie *tr, const char *s, size_t len, size_t from, size_t *ms, size_t *me,
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
    int f1 = trie_find(&tok->raw_trie, s, len, 0, &s1, &e1, &a1);
    int f2 = trie_find(&tok->norm_trie, s, len, 0, &s2, &e2, &a2);
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
        if (grow((void **)&t->sym, &cap, n, sizeof(int32_t), err) < 0) return SQUAD_E_NOMEM;
        cap = t->sym_cap;
        if (grow((void **)&t->sym_prev, &cap, n, sizeof(int32_t), err) < 0) return SQUAD_E_NOMEM;
        cap = t->sym_cap;
        if (grow((void **)&t->sym_next, &cap, n, sizeof(int32_t), err) < 0) return SQUAD_E_NOMEM;
        t->sym_cap = cap;
    }
    /* each merge pushes at most two entries: 3n bounds the heap */
    if (grow((void **)&t->heap, &t->heap_cap, 3 * n + 4, sizeof(uint64_t), err) < 0) return SQUAD_E_NOMEM;
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
                size_t k = utf8_encode(t->bl_cp[w[i]], c);
                sym_add_char(t, &b, -1, (const uint8_t *)c, k);
            }
        }
    } else {
        for (size_t i = 0; i < n;) {
            size_t k = utf8_char_len(w[i]);
            if (k > n - i) k = n - i;
            sym_add_char(t, &b, vocab_id(t, (const char *)w + i, k), w + i, k);
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
        *id = vocab_id(t, (const char *)w, n);
        return 0;
    }
    if (n > SIZE_MAX / 2 - 1 || grow((void **)&t->word_buf, &t->word_cap, 2 * n + 1, 1, err) < 0)
        return squad_fail(err, SQUAD_E_NOMEM, "out of memory (word of %zu bytes)", n);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += utf8_encode(t->bl_cp[w[i]], t->word_buf + k);
    *id = vocab_id(t, t->word_buf, k);
    return 0;
}

/* One pre-tokenized word through the model. */
static int bpe_word(squad_tokenizer *t, const uint8_t *w, size_t n, squad_idvec *out, squad_err *err) {
    uint64_t h = 0;
    if (n <= WC_KEY) {
        h = hash_bytes(w, n);
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

/* ---------------------------------------------------------------------------------------------
 * Pre-tokenization
 * ------------------------------------------------------------------------------------------- */

static int run_stages(squad_tokenizer *t, int stage, const char *p, size_t n, squad_idvec *out, squad_err *err);

static int regex_error(squad_err *err, int rc) {
    PCRE2_UCHAR buf[160];
    if (pcre2_get_error_message(rc, buf, sizeof buf) < 0) strcpy((char *)buf, "unknown error");
    return squad_fail(err, SQUAD_E_INVALID, "pre-tokenizer regex failed: %s", (const char *)buf);
}

/* Finds the next match of re in p[0..n) at or after from: 1 with [*s, *e), 0 when none, <0 error. */
static int regex_find(squad_tokenizer *t, const pretok_stage *st, const char *p, size_t n, size_t from, size_t *s,
                      size_t *e, squad_err *err) {
    int rc = st->jit ? pcre2_jit_match(st->re, (PCRE2_SPTR)p, n, from, 0, t->md, t->mctx)
                     : pcre2_match(st->re, (PCRE2_SPTR)p, n, from, PCRE2_NO_UTF_CHECK, t->md, t->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return regex_error(err, rc);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
    if (ov[0] > ov[1] || ov[1] > n || ov[0] < from) /* \K tricks: refuse rather than guess */
        return squad_fail(err, SQUAD_E_INVALID, "pre-tokenizer regex reported an unusable match");
    *s = ov[0];
    *e = ov[1];
    return 1;
}

/* Split behaviour: segments (start, end, is_match) arrive in order and are folded into pieces the
 * way Hugging Face's NormalizedString::split does, then handed to the next stage. */
typedef struct split_fold {
    squad_tokenizer *t;
    int stage, behavior;
    const char *p;
    squad_idvec *out;
    squad_err *err;
    size_t ps, pe; /* the pending piece */
    int have, pend_match, prev_match;
} split_fold;

static int fold_emit(split_fold *f, size_t s, size_t e) {
    if (e <= s) return 0; /* empty pieces are dropped */
    return run_stages(f->t, f->stage + 1, f->p + s, e - s, f->out, f->err);
}

static int fold_flush(split_fold *f) {
    if (!f->have) return 0;
    f->have = 0;
    return fold_emit(f, f->ps, f->pe);
}

static int fold_pend(split_fold *f, size_t s, size_t e, int is_match) {
    int rc = fold_flush(f);
    f->ps = s;
    f->pe = e;
    f->have = 1;
    f->pend_match = is_match;
    return rc;
}

static int fold_feed(split_fold *f, size_t s, size_t e, int is_match) {
    int rc = 0;
    switch (f->behavior) {
    case SPLIT_ISOLATED:
        rc = fold_emit(f, s, e);
        break;
    case SPLIT_REMOVED:
        if (!is_match) rc = fold_emit(f, s, e);
        break;
    case SPLIT_CONTIGUOUS: /* runs of matches (or of non-matches) become one piece */
        if (f->have && is_match == f->prev_match) f->pe = e;
        else rc = fold_pend(f, s, e, is_match);
        break;
    case SPLIT_MERGED_PREV: /* a match joins the piece before it */
        if (f->have && is_match && !f->prev_match) f->pe = e;
        else rc = fold_pend(f, s, e, is_match);
        break;
    case SPLIT_MERGED_NEXT: /* a match joins the non-match after it */
        if (f->have && f->pend_match && !is_match) {
            f->pe = e;
            rc = fold_flush(f);
        } else {
            rc = fold_flush(f);
            if (rc >= 0) rc = is_match ? fold_pend(f, s, e, 1) : fold_emit(f, s, e);
        }
        break;
    }
    f->prev_match = is_match;
    return rc;
}

/* Splits p[0..n) with the stage's regex, iterating matches as Hugging Face iterates Oniguruma's:
 * an empty match right where the previous match ended is skipped by advancing one character. */
static int split_stage(squad_tokenizer *t, int stage, const pretok_stage *st, int behavior, int invert, const char *p,
                       size_t n, squad_idvec *out, squad_err *err) {
    split_fold f = {t, stage, behavior, p, out, err, 0, 0, 0, 0, 0};
    size_t last_end = 0, last_match_end = 0, prev = 0;
    int have_last = 0, rc;
    while (last_end <= n) {
        size_t s = 0, e = 0;
        rc = regex_find(t, st, p, n, last_end, &s, &e, err);
        if (rc < 0) return rc;
        if (rc == 0) break;
        if (s == e && have_last && last_match_end == e) {
            last_end += last_end < n ? utf8_char_len((unsigned char)p[last_end]) : 1;
            continue;
        }
        last_end = last_match_end = e;
        have_last = 1;
        if (prev != s && (rc = fold_feed(&f, prev, s, invert)) < 0) return rc;
        if ((rc = fold_feed(&f, s, e, !invert)) < 0) return rc;
        prev = e;
    }
    if (prev != n && (rc = fold_feed(&f, prev, n, invert)) < 0) return rc;
    return fold_flush(&f);
}

static int bytelevel_stage(squad_tokenizer *t, int stage, const char *p, size_t n, squad_idvec *out, squad_err *err) {
    pretok_stage *st = &t->stages[stage];
    if (st->add_prefix_space && p[0] != ' ') {
        if (grow((void **)&st->scratch, &st->scratch_cap, n + 1, 1, err) < 0) return SQUAD_E_NOMEM;
        st->scratch[0] = ' ';
        memcpy(st->scratch + 1, p, n);
        p = st->scratch;
        n++;
    }
    if (st->use_regex) return split_stage(t, stage, st, SPLIT_ISOLATED, 0, p, n, out, err);
    return run_stages(t, stage + 1, p, n, out, err);
}

static int run_stages(squad_tokenizer *t, int stage, const char *p, size_t n, squad_idvec *out, squad_err *err) {
    if (n == 0) return 0;
    if (stage == t->n_stages) return bpe_word(t, (const uint8_t *)p, n, out, err);
    const pretok_stage *st = &t->stages[stage];
    if (st->kind == PT_SPLIT) return split_stage(t, stage, st, st->behavior, st->invert, p, n, out, err);
    return bytelevel_stage(t, stage, p, n, out, err);
}

/* ---------------------------------------------------------------------------------------------
 * Normalisation and added-token extraction
 * ------------------------------------------------------------------------------------------- */

/* True when NFC cannot change s: every code point is below U+0300 (nothing there decomposes into a
 * singleton or an excluded pair, and nothing composes without a mark at or above U+0300) or is a CJK
 * ideograph, a precomposed Hangul syllable or an emoji-block symbol (no decomposition, class 0). */
static int nfc_inert(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0xCC) {
            i += u[i] < 0x80 ? 1 : 2;
            continue;
        }
        size_t k;
        int32_t c = utf8_decode(u + i, &k);
        if (!((c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0x1F300 && c <= 0x1FAFF)))
            return 0;
        i += k;
    }
    return 1;
}

static int is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

/* Applies the normaliser: *out is s itself (nothing to do) or a new buffer to free in *owned. */
static int normalize(const squad_tokenizer *t, const char *s, size_t n, const char **out, size_t *out_len,
                     char **owned, squad_err *err) {
    *out = s;
    *out_len = n;
    *owned = NULL;
    if (t->n_norm == 0 || is_ascii(s, n)) return 0; /* every normal form keeps ASCII as it is */
    if (t->n_norm == 1 && t->norm[0] == NORM_NFC && nfc_inert(s, n)) return 0;
    for (int i = 0; i < t->n_norm; i++) {
        int opts = UTF8PROC_STABLE;
        switch (t->norm[i]) {
        case NORM_NFC: opts |= UTF8PROC_COMPOSE; break;
        case NORM_NFD: opts |= UTF8PROC_DECOMPOSE; break;
        case NORM_NFKC: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
        default: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
        }
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)*out, (utf8proc_ssize_t)*out_len, &dst,
                                          (utf8proc_option_t)opts);
        free(*owned);
        *owned = NULL;
        if (m < 0) {
            free(dst);
            return squad_fail(err, m == UTF8PROC_ERROR_NOMEM ? SQUAD_E_NOMEM : SQUAD_E_INVALID,
                              "normalisation failed: %s", utf8proc_errmsg(m));
        }
        *owned = (char *)dst;
        *out = *owned;
        *out_len = (size_t)m;
    }
    return 0;
}

/* A text piece between added tokens, at one of the two levels. */
typedef int (*piece_fn)(squad_tokenizer *t, const char *s, size_t n, squad_idvec *out, squad_err *err);

/* Splits s on the trie's tokens as Hugging Face's AddedVocabulary::find_matches does, sending the text
 * between them to fn. A token with lstrip / rstrip takes the whitespace on that side with it; a
 * single_word token counts only with no word character on either side. */
static int split_added(squad_tokenizer *t, const added_trie *tr, const char *s, size_t n, piece_fn fn,
                       squad_idvec *out, squad_err *err) {
    size_t start_offset = 0, pos = 0, ms, me;
    int32_t a;
    int rc;
    while (trie_find(tr, s, n, pos, &ms, &me, &a)) {
        pos = me; /* matching resumes after the raw match, whatever is done with it */
        const added_tok *at = &t->added[a];
        if (at->single_word) {
            size_t k;
            int left_ok = ms == 0 || !is_word_char(utf8_prev_char(s, ms, &k));
            int right_ok = me == n || !is_word_char(utf8_decode((const unsigned char *)s + me, &k));
            if (!left_ok || !right_ok) continue;
        }
        size_t start = ms, stop = me;
        if (at->lstrip) {
            while (start > start_offset) {
                size_t k;
                if (!is_unicode_space(utf8_prev_char(s, start, &k))) break;
                start = k;
            }
        }
        if (at->rstrip) {
            while (stop < n) {
                size_t k;
                if (!is_unicode_space(utf8_decode((const unsigned char *)s + stop, &k))) break;
                stop += k;
            }
        }
        if (ms < start_offset) continue; /* inside whitespace a previous token's rstrip took */
        if (start_offset < start && (rc = fn(t, s + start_offset, start - start_offset, out, err)) < 0) return rc;
        if ((rc = squad_idvec_push(out, at->id, err)) < 0) return rc;
        start_offset = stop;
        if (pos < stop) pos = stop;
    }
    if (start_offset < n) return fn(t, s + start_offset, n - start_offset, out, err);
    return 0;
}

static int pretok_piece(squad_tokenizer *t, const char *s, size_t n, squad_idvec *out, squad_err *err) {
    return run_stages(t, 0, s, n, out, err);
}

/* Raw text between non-normalized added tokens: normalise, then the normalised level. */
static int raw_piece(squad_tokenizer *t, const char *s, size_t n, squad_idvec *out, squad_err *err) {
    const char *ns;
    size_t nn;
    char *owned;
    int rc = normalize(t, s, n, &ns, &nn, &owned, err);
    if (rc < 0) return rc;
    if (t->norm_trie.empty) rc = run_stages(t, 0, ns, nn, out, err);
    else rc = split_added(t, &t->norm_trie, ns, nn, pretok_piece, out, err);
    free(owned);
    return rc;
}

static int encode(squad_tokenizer *tok, const char *text, size_t len, unsigned flags, squad_idvec *out,
                  squad_err *err) {
    if (!tok || (!text && len)) return squad_fail(err, SQUAD_E_INVALID, "tokenize: no tokenizer or no text");
    size_t bad = squad_utf8_invalid_offset(text, len);
    if (bad < len)
        return squad_fail(err, SQUAD_E_INVALID, "invalid UTF-8 at byte offset %zu (byte 0x%02X)", bad,
                          (unsigned)(unsigned char)text[bad]);
    size_t n0 = out->n;
    int rc;
    if (len == 0) return 0;
    if (flags & SQUAD_TOK_PLAIN) {
        const char *ns;
        size_t nn;
        char *owned;
        rc = normalize(tok, text, len, &ns, &nn, &owned, err);
        if (rc >= 0) rc = run_stages(tok, 0, ns, nn, out, err);
        free(owned);
    } else if (tok->raw_trie.empty) {
        rc = raw_piece(tok, text, len, out, err);
    } else {
        rc = split_added(tok, &tok->raw_trie, text, len, raw_piece, out, err);
    }
    if (rc < 0) out->n = n0;
    return rc < 0 ? rc : 0;
}

int squad_tokenize_append(squad_tokenizer *tok, const char *text, size_t len, unsigned flags, squad_idvec *out,
                          squad_err *err) {
    if (!tok) return squad_fail(err, SQUAD_E_INVALID, "tokenize: no tokenizer or no text");
    const squad_tok_text_cache *tc = &tok->text_cache;
    int cached = tc->get && text && len >= tc->min_bytes;
    if (cached) {
        int hit = tc->get(tc->ctx, flags, text, len, out, err);
        if (hit) return hit < 0 ? hit : 0;
    }
    size_t n0 = out->n;
    pthread_mutex_lock(&tok->lock);
    int rc = encode(tok, text, len, flags, out, err);
    pthread_mutex_unlock(&tok->lock);
    if (rc >= 0 && cached && tc->put) tc->put(tc->ctx, flags, text, len, out->v + n0, out->n - n0);
    return rc;
}

void squad_tokenizer_set_text_cache(squad_tokenizer *tok, const squad_tok_text_cache *cache) {
    if (cache) tok->text_cache = *cache;
    else memset(&tok->text_cache, 0, sizeof tok->text_cache);
}

int squad_tokenize(squad_tokenizer *tok, const char *text, size_t len, int32_t **ids, int *n, squad_err *err) {
    squad_idvec v = {0};
    *ids = NULL;
    *n = 0;
    int rc = squad_tokenize_append(tok, text, len, 0, &v, err);
    if (rc < 0) {
        squad_idvec_free(&v);
        return rc;
    }
    if (v.n > INT32_MAX) {
        squad_idvec_free(&v);
        return squad_fail(err, SQUAD_E_INVALID, "text gives too many tokens");
    }
    if (!v.v && squad_idvec_push(&v, 0, err) == 0) v.n = 0; /* a real (empty) array for the caller */
    if (!v.v) return SQUAD_E_NOMEM;
    *ids = v.v;
    *n = (int)v.n;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Decoding
 * ------------------------------------------------------------------------------------------- */

/* Copies s to out replacing each maximal invalid UTF-8 subsequence by U+FFFD (as Rust's
 * String::from_utf8_lossy does); out holds 3 n bytes. Returns the length written. */
static size_t utf8_lossy(const unsigned char *s, size_t n, char *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        size_t k = utf8_seq_len(s + i, n - i);
        if (k) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
            continue;
        }
        /* the longest prefix of a valid sequence counts as one error */
        size_t skip = 1;
        unsigned c = s[i];
        size_t need = (c >= 0xC2 && c <= 0xDF) ? 1 : (c >= 0xE0 && c <= 0xEF) ? 2 : (c >= 0xF0 && c <= 0xF4) ? 3 : 0;
        if (need && i + 1 < n) {
            unsigned lo = 0x80, hi = 0xBF;
            if (c == 0xE0) lo = 0xA0;
            else if (c == 0xED) hi = 0x9F;
            else if (c == 0xF0) lo = 0x90;
            else if (c == 0xF4) hi = 0x8F;
            if (s[i + 1] >= lo && s[i + 1] <= hi) {
                skip = 2;
                while (skip <= need && i + skip < n && (s[i + skip] & 0xC0) == 0x80) skip++;
            }
        }
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += skip;
    }
    return o;
}

int squad_detokenize(const squad_tokenizer *tok, const int32_t *ids, size_t n, int skip_special, char **text,
                     size_t *len, squad_err *err) {
    *text = NULL;
    if (len) *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->n_ids || (tok->info[id].key < 0 && tok->info[id].added < 0))
            return squad_fail(err, SQUAD_E_INVALID, "token id %d (at %zu) is not in the vocabulary", (int)id, i);
        total += tok->info[id].dec_len + 1;
    }
    char *raw = squad_malloc(total + 1, err);
    if (!raw) return SQUAD_E_NOMEM;
    size_t k = 0;
    int first = 1;
    for (size_t i = 0; i < n; i++) {
        const tok_info *ti = &tok->info[ids[i]];
        if (skip_special && ti->added >= 0 && tok->added[ti->added].special) continue;
        if (tok->decoder == DEC_NONE && !first) raw[k++] = ' '; /* no decoder: tokens joined by spaces */
        memcpy(raw + k, tok->arena + ti->dec_off, ti->dec_len);
        k += ti->dec_len;
        first = 0;
    }
    if (k > (SIZE_MAX - 1) / 3) {
        free(raw);
        return squad_fail(err, SQUAD_E_NOMEM, "decoded text too large");
    }
    char *outb = squad_malloc(3 * k + 1, err);
    if (!outb) {
        free(raw);
        return SQUAD_E_NOMEM;
    }
    size_t m = utf8_lossy((const unsigned char *)raw, k, outb);
    free(raw);
    outb[m] = 0;
    *text = outb;
    if (len) *len = m;
    return 0;
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
    return vocab_id(tok, token, n);
}

int squad_tokenizer_vocab_size(const squad_tokenizer *tok) { return tok->n_ids; }

/* ---------------------------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------------------------- */

/* A boolean field: absent or null gives dflt; anything but true / false is an error. */
static int json_bool_field(json_t *obj, const char *key, int dflt, int *out, const char *where, squad_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) return squad_fail(err, SQUAD_E_MODEL, "%s.%s must be true or false", where, key);
    *out = json_is_true(v);
    return 0;
}

/* A string field that may be absent or null (then *out is NULL). */
static int json_str_field(json_t *obj, const char *key, const char **out, const char *where, squad_err *err) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return squad_fail(err, SQUAD_E_MODEL, "%s.%s must be a string", where, key);
    *out = json_string_value(v);
    return 0;
}

static const char *json_type_of(json_t *obj) {
    json_t *ty = json_object_get(obj, "type");
    return json_is_string(ty) ? json_string_value(ty) : NULL;
}

/* Checks the BPE options squad does not implement; reads the ones it does. */
static int load_model_options(squad_tokenizer *t, json_t *model, const char **unk, squad_err *err) {
    const char *type = json_type_of(model);
    if (json_object_get(model, "type") && !type) return squad_fail(err, SQUAD_E_MODEL, "model.type must be a string");
    if (type && strcmp(type, "BPE"))
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "model type '%s' is not supported (squad reads BPE models only)",
                          type);
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout)) {
        if (!json_is_number(dropout)) return squad_fail(err, SQUAD_E_MODEL, "model.dropout must be a number or null");
        if (json_number_value(dropout) != 0.0)
            return squad_fail(err, SQUAD_E_UNSUPPORTED, "model.dropout %g is not supported (squad is deterministic)",
                              json_number_value(dropout));
    }
    const char *s;
    if (json_str_field(model, "continuing_subword_prefix", &s, "model", err) < 0) return SQUAD_E_MODEL;
    if (s && *s)
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "model.continuing_subword_prefix '%s' is not supported", s);
    if (json_str_field(model, "end_of_word_suffix", &s, "model", err) < 0) return SQUAD_E_MODEL;
    if (s && *s) return squad_fail(err, SQUAD_E_UNSUPPORTED, "model.end_of_word_suffix '%s' is not supported", s);
    if (json_bool_field(model, "byte_fallback", 0, &t->byte_fallback, "model", err) < 0 ||
        json_bool_field(model, "ignore_merges", 0, &t->ignore_merges, "model", err) < 0 ||
        json_bool_field(model, "fuse_unk", 0, &t->fuse_unk, "model", err) < 0 ||
        json_str_field(model, "unk_token", unk, "model", err) < 0)
        return SQUAD_E_MODEL;
    return 0;
}

/* Appends one vocabulary entry (the map is built afterwards by vocab_index). */
static int vocab_add(squad_tokenizer *t, const char *key, size_t n, int32_t id, int64_t *max_id, squad_err *err) {
    if (n > UINT32_MAX) return squad_fail(err, SQUAD_E_MODEL, "a vocabulary key is too long");
    if (t->n_vkeys == t->cap_vkeys &&
        grow((void **)&t->vkeys, &t->cap_vkeys, t->n_vkeys + 1, sizeof(vocab_key), err) < 0)
        return SQUAD_E_NOMEM;
    vocab_key *vk = &t->vkeys[t->n_vkeys];
    vk->len = (uint32_t)n;
    vk->id = id;
    if (arena_put(t, key, n, &vk->off, err) < 0) return SQUAD_E_NOMEM;
    if (id > *max_id) *max_id = id;
    t->n_vkeys++;
    return 0;
}

/* Builds the key -> id map over vkeys. A duplicate key is FAST_BAIL when dups_bail is set (the
 * fast loader leaves such files to jansson, whose object keeps the last value). */
#define FAST_BAIL 1
static int vocab_index(squad_tokenizer *t, int dups_bail, squad_err *err) {
    t->vmask = pow2_at_least(2 * t->n_vkeys + 2) - 1;
    t->vmap = squad_calloc(t->vmask + 1, sizeof(uint32_t), err);
    if (!t->vmap) return SQUAD_E_NOMEM;
    for (size_t k = 0; k < t->n_vkeys; k++)
        if (vocab_insert(t, (uint32_t)k) && dups_bail) return FAST_BAIL;
    return 0;
}

/* model.vocab from the JSON tree; the largest id in *max_id. */
static int load_vocab_json(squad_tokenizer *t, json_t *model, int64_t *max_id, squad_err *err) {
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return squad_fail(err, SQUAD_E_MODEL, "model.vocab must be an object {token: id}");
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= TOK_MAX_IDS)
            return squad_fail(err, SQUAD_E_MODEL, "model.vocab[\"%.60s\"] must be an integer id in [0, %d)", key,
                              TOK_MAX_IDS);
        if (vocab_add(t, key, strlen(key), (int32_t)json_integer_value(val), max_id, err) < 0) return SQUAD_E_NOMEM;
    }
    return vocab_index(t, 0, err);
}

/* Reads the added_tokens array (before the ids table exists: only checks and copies). */
static int load_added(squad_tokenizer *t, json_t *root, int64_t *max_id, squad_err *err) {
    json_t *arr = json_object_get(root, "added_tokens");
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) return squad_fail(err, SQUAD_E_MODEL, "added_tokens must be an array");
    size_t n = json_array_size(arr);
    if (n > TOK_MAX_IDS) return squad_fail(err, SQUAD_E_MODEL, "added_tokens: too many entries");
    t->added = squad_calloc(n ? n : 1, sizeof(added_tok), err);
    if (!t->added) return SQUAD_E_NOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(arr, i);
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if (!json_is_object(o)) return squad_fail(err, SQUAD_E_MODEL, "%s must be an object", where);
        json_t *id = json_object_get(o, "id"), *content = json_object_get(o, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= TOK_MAX_IDS)
            return squad_fail(err, SQUAD_E_MODEL, "%s.id must be an integer in [0, %d)", where, TOK_MAX_IDS);
        if (!json_is_string(content) || json_string_length(content) == 0)
            return squad_fail(err, SQUAD_E_MODEL, "%s.content must be a non-empty string", where);
        int special = 0, lstrip = 0, rstrip = 0, single = 0, normalized = 1;
        if (json_bool_field(o, "special", 0, &special, where, err) < 0 ||
            json_bool_field(o, "lstrip", 0, &lstrip, where, err) < 0 ||
            json_bool_field(o, "rstrip", 0, &rstrip, where, err) < 0 ||
            json_bool_field(o, "single_word", 0, &single, where, err) < 0 ||
            json_bool_field(o, "normalized", 1, &normalized, where, err) < 0)
            return SQUAD_E_MODEL;
        added_tok *a = &t->added[t->n_added++];
        a->id = (int32_t)json_integer_value(id);
        a->len = (uint32_t)json_string_length(content);
        if (memchr(json_string_value(content), 0, a->len))
            return squad_fail(err, SQUAD_E_MODEL, "%s.content contains a NUL character", where);
        if (arena_put(t, json_string_value(content), a->len, &a->off, err) < 0) return SQUAD_E_NOMEM;
        a->special = (uint8_t)special;
        a->lstrip = (uint8_t)lstrip;
        a->rstrip = (uint8_t)rstrip;
        a->single_word = (uint8_t)single;
        a->normalized = (uint8_t)normalized;
        if (a->id > *max_id) *max_id = a->id;
    }
    return 0;
}

/* A merge written "a b" (exactly one space): 1 when it is a "#version" line (no rank), 0 with its parts,
 * or an error. */
static int merge_split(const char *s, size_t n, size_t i, const char **a, size_t *na, const char **b, size_t *nb,
                       squad_err *err) {
    if (n >= 8 && !memcmp(s, "#version", 8)) return 1;
    const char *sp = memchr(s, ' ', n);
    if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1))
        return squad_fail(err, SQUAD_E_MODEL, "model.merges[%zu] \"%.60s\" is not two tokens separated by one space", i,
                          s);
    *a = s;
    *na = (size_t)(sp - s);
    *b = sp + 1;
    *nb = n - *na - 1;
    return 0;
}

/* One merge from the JSON tree: "a b" or ["a", "b"]; 1 for a "#version" line. */
static int merge_parts(json_t *m, size_t i, const char **a, size_t *na, const char **b, size_t *nb, squad_err *err) {
    if (json_is_string(m)) return merge_split(json_string_value(m), json_string_length(m), i, a, na, b, nb, err);
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *na = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *nb = json_string_length(json_array_get(m, 1));
        return 0;
    }
    return squad_fail(err, SQUAD_E_MODEL, "model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", i);
}

/* Merges as read, in rank order, before the map is sized. */
typedef struct merge_list {
    int32_t *v; /* triples: a, b, merged id */
    size_t n, cap;
    char *joined; /* scratch: a + b */
    size_t joined_cap;
} merge_list;

/* Checks merge i (tokens a and b) against the vocabulary and records it. */
static int merge_add(squad_tokenizer *t, merge_list *ml, size_t i, const char *a, size_t na, const char *b, size_t nb,
                     squad_err *err) {
    int32_t ia = vocab_id(t, a, na), ib = vocab_id(t, b, nb);
    if (ia < 0 || ib < 0)
        return squad_fail(err, SQUAD_E_MODEL, "model.merges[%zu]: token \"%.*s\" is not in the vocabulary", i,
                          (int)(ia < 0 ? (na > 60 ? 60 : na) : (nb > 60 ? 60 : nb)), ia < 0 ? a : b);
    if (grow((void **)&ml->joined, &ml->joined_cap, na + nb + 1, 1, err) < 0) return SQUAD_E_NOMEM;
    memcpy(ml->joined, a, na);
    memcpy(ml->joined + na, b, nb);
    int32_t id = vocab_id(t, ml->joined, na + nb);
    if (id < 0)
        return squad_fail(err, SQUAD_E_MODEL, "model.merges[%zu]: the merged token \"%.*s\" is not in the vocabulary",
                          i, (int)(na + nb > 60 ? 60 : na + nb), ml->joined);
    if (ml->n / 3 >= UINT32_MAX / 4) return squad_fail(err, SQUAD_E_MODEL, "model.merges: too many merges");
    if (grow((void **)&ml->v, &ml->cap, ml->n + 3, sizeof(int32_t), err) < 0) return SQUAD_E_NOMEM;
    ml->v[ml->n++] = ia;
    ml->v[ml->n++] = ib;
    ml->v[ml->n++] = id;
    return 0;
}

/* Sizes the merge map for the recorded merges and fills it, rank = order. */
static int merge_index(squad_tokenizer *t, const merge_list *ml, squad_err *err) {
    size_t n = ml->n / 3;
    t->mmask = pow2_at_least(2 * n + 2) - 1;
    t->mshift = 64;
    for (size_t m = t->mmask + 1; m > 1; m >>= 1) t->mshift--;
    t->mmap = squad_malloc((t->mmask + 1) * sizeof(merge_slot), err);
    if (!t->mmap) return SQUAD_E_NOMEM;
    for (size_t i = 0; i <= t->mmask; i++) t->mmap[i].key = MERGE_EMPTY;
    for (size_t r = 0; r < n; r++) merge_insert(t, ml->v[3 * r], ml->v[3 * r + 1], (uint32_t)r, ml->v[3 * r + 2]);
    return 0;
}

static void merge_list_free(merge_list *ml) {
    free(ml->v);
    free(ml->joined);
}

/* model.merges from the JSON tree. */
static int load_merges_json(squad_tokenizer *t, json_t *model, squad_err *err) {
    json_t *merges = json_object_get(model, "merges");
    if (!merges || json_is_null(merges)) merges = NULL;
    else if (!json_is_array(merges)) return squad_fail(err, SQUAD_E_MODEL, "model.merges must be an array");
    size_t n = merges ? json_array_size(merges) : 0;
    merge_list ml = {0};
    int rc = 0;
    for (size_t i = 0; i < n && rc >= 0; i++) {
        const char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        rc = merge_parts(json_array_get(merges, i), i, &a, &na, &b, &nb, err);
        if (rc == 0) rc = merge_add(t, &ml, i, a, na, b, nb, err);
    }
    if (rc >= 0) rc = merge_index(t, &ml, err);
    merge_list_free(&ml);
    return rc < 0 ? rc : 0;
}

/* ---------------------------------------------------------------------------------------------
 * The fast loader: model.vocab and model.merges straight from the text
 *
 * Those two members are nearly all of a tokenizer.json (150k+ entries each); building a jansson tree
 * for them costs most of the load. The scanner below finds them, parses them directly (strictly:
 * anything a JSON parser might read differently makes it give up, FAST_BAIL), and jansson parses
 * the rest of the document with the two members emptied. When the scanner gives up anywhere, the
 * whole file is loaded through jansson instead, so messages and results never depend on the path.
 * ------------------------------------------------------------------------------------------- */

typedef struct fast_text {
    const char *vocab, *vocab_end;   /* the value of model.vocab, or NULL */
    const char *merges, *merges_end; /* the value of model.merges, or NULL */
    char *buf;                       /* scratch for decoded strings */
    size_t cap;
} fast_text;

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

static int hex4(const char *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

/* Decodes the JSON string at *pp (its opening quote) into f->buf (length in *len) and moves *pp past
 * the closing quote. 0, FAST_BAIL for anything unusual (\u0000, lone surrogates, invalid UTF-8, raw
 * control characters, running off the end), or an allocation error. */
static int fast_string(fast_text *f, const char **pp, const char *end, size_t *len, squad_err *err) {
    const char *p = *pp;
    if (p >= end || *p != '"') return FAST_BAIL;
    p++;
    size_t n = 0;
    for (;;) {
        const char *run = p; /* a run of plain characters is copied at once */
        while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20 && (unsigned char)*p < 0x80) p++;
        size_t k = (size_t)(p - run);
        if (grow((void **)&f->buf, &f->cap, n + k + 8, 1, err) < 0) return SQUAD_E_NOMEM;
        memcpy(f->buf + n, run, k);
        n += k;
        if (p >= end) return FAST_BAIL;
        unsigned char c = (unsigned char)*p;
        if (c == '"') break;
        if (c < 0x20) return FAST_BAIL;
        if (c >= 0x80) {
            size_t m = utf8_seq_len((const unsigned char *)p, (size_t)(end - p));
            if (!m) return FAST_BAIL;
            memcpy(f->buf + n, p, m);
            n += m;
            p += m;
            continue;
        }
        /* an escape */
        if (end - p < 2) return FAST_BAIL;
        char e = p[1];
        p += 2;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char out[] = "\"\\/\b\f\n\r\t";
            f->buf[n++] = out[simple - "\"\\/bfnrt"];
            continue;
        }
        if (e != 'u' || end - p < 4) return FAST_BAIL;
        uint32_t cp, lo;
        if (hex4(p, &cp) < 0 || cp == 0 || (cp >= 0xDC00 && cp <= 0xDFFF)) return FAST_BAIL;
        p += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) < 0 || lo < 0xDC00 || lo > 0xDFFF)
                return FAST_BAIL;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p += 6;
        }
        n += utf8_encode(cp, f->buf + n);
    }
    f->buf[n] = 0;
    *len = n;
    *pp = p + 1;
    return 0;
}

/* Skips any JSON value (without checking it: jansson checks what is kept). NULL when lost. */
static const char *fast_skip(fast_text *f, const char *p, const char *end, int depth, squad_err *err) {
    p = skip_ws(p, end);
    if (p >= end || depth > 64) return NULL;
    if (*p == '"') {
        size_t n;
        return fast_string(f, &p, end, &n, err) == 0 ? p : NULL;
    }
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = skip_ws(p + 1, end);
        if (p < end && *p == close) return p + 1;
        for (;;) {
            if (close == '}') {
                size_t n;
                if (fast_string(f, &p, end, &n, err) != 0) return NULL;
                p = skip_ws(p, end);
                if (p >= end || *p != ':') return NULL;
                p++;
            }
            if (!(p = fast_skip(f, p, end, depth + 1, err))) return NULL;
            p = skip_ws(p, end);
            if (p < end && *p == ',') {
                p = skip_ws(p + 1, end);
                continue;
            }
            return p < end && *p == close ? p + 1 : NULL;
        }
    }
    const char *s = p; /* a number or a literal */
    while (p < end && ((*p && strchr("+-.eE", *p)) || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z'))) p++;
    return p > s ? p : NULL;
}

/* Iterates the members of the object at *pp: on each call the next key (decoded, in f->buf) and *pp at
 * its value. 1 with a member, 0 at the end of the object (*pp past it), FAST_BAIL + 1 when lost. */
static int fast_member(fast_text *f, const char **pp, const char *end, int first, size_t *klen, squad_err *err) {
    const char *p = skip_ws(*pp, end);
    if (first) {
        if (p >= end || *p != '{') return FAST_BAIL + 1;
        p = skip_ws(p + 1, end);
        if (p < end && *p == '}') {
            *pp = p + 1;
            return 0;
        }
    } else {
        if (p < end && *p == '}') {
            *pp = p + 1;
            return 0;
        }
        if (p >= end || *p != ',') return FAST_BAIL + 1;
        p = skip_ws(p + 1, end);
    }
    if (fast_string(f, &p, end, klen, err) != 0) return FAST_BAIL + 1;
    p = skip_ws(p, end);
    if (p >= end || *p != ':') return FAST_BAIL + 1;
    *pp = skip_ws(p + 1, end);
    return 1;
}

/* Finds model.vocab and model.merges: 0 when the document's outline was followed to its end. */
static int fast_find(fast_text *f, const char *json, size_t len, squad_err *err) {
    const char *p = json, *end = json + len;
    int seen_model = 0, r, first = 1;
    size_t klen;
    while ((r = fast_member(f, &p, end, first, &klen, err)) == 1) {
        first = 0;
        if (strcmp(f->buf, "model") || klen != 5) {
            if (!(p = fast_skip(f, p, end, 0, err))) return FAST_BAIL;
            continue;
        }
        if (seen_model++ || p >= end || *p != '{') return FAST_BAIL; /* jansson would keep the last one */
        int mfirst = 1, mr;
        while ((mr = fast_member(f, &p, end, mfirst, &klen, err)) == 1) {
            mfirst = 0;
            const char **start = NULL, **stop = NULL;
            if (klen == 5 && !strcmp(f->buf, "vocab")) start = &f->vocab, stop = &f->vocab_end;
            else if (klen == 6 && !strcmp(f->buf, "merges")) start = &f->merges, stop = &f->merges_end;
            if (start && *start) return FAST_BAIL; /* a repeated member */
            const char *v = p;
            if (!(p = fast_skip(f, p, end, 1, err))) return FAST_BAIL;
            if (start) *start = v, *stop = p;
        }
        if (mr != 0) return FAST_BAIL;
    }
    if (r != 0) return FAST_BAIL;
    return skip_ws(p, end) == end && f->vocab && f->merges ? 0 : FAST_BAIL;
}

/* A non-negative JSON integer below TOK_MAX_IDS at *pp (no sign, fraction, exponent or leading zero). */
static int fast_id(const char **pp, const char *end, int32_t *id) {
    const char *p = *pp;
    int64_t v = 0;
    if (p >= end || *p < '0' || *p > '9') return FAST_BAIL;
    if (*p == '0' && p + 1 < end && p[1] >= '0' && p[1] <= '9') return FAST_BAIL;
    while (p < end && *p >= '0' && *p <= '9') {
        v = v * 10 + (*p++ - '0');
        if (v >= TOK_MAX_IDS) return FAST_BAIL;
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return FAST_BAIL;
    *id = (int32_t)v;
    *pp = p;
    return 0;
}

/* model.vocab from the text. dry: only check that it has the shape this reader takes (so that the
 * real pass, run in the generic loader's order, can only meet the errors the generic one would). */
static int fast_vocab(squad_tokenizer *t, fast_text *f, int dry, int64_t *max_id, squad_err *err) {
    const char *p = f->vocab, *end = f->vocab_end;
    int first = 1, r, rc;
    size_t klen;
    while ((r = fast_member(f, &p, end, first, &klen, err)) == 1) {
        first = 0;
        int32_t id;
        if (memchr(f->buf, 0, klen) || fast_id(&p, end, &id) != 0) return FAST_BAIL;
        if (!dry && (rc = vocab_add(t, f->buf, klen, id, max_id, err)) < 0) return rc;
    }
    if (r != 0 || skip_ws(p, end) != end) return FAST_BAIL;
    return dry ? 0 : vocab_index(t, 1, err);
}

/* model.merges from the text (dry: the shape only, as for fast_vocab). */
static int fast_merges(squad_tokenizer *t, fast_text *f, int dry, squad_err *err) {
    const char *p = skip_ws(f->merges, f->merges_end), *end = f->merges_end;
    merge_list ml = {0};
    char *a = NULL;
    size_t acap = 0;
    int rc = 0;
    if (p >= end || *p != '[') return FAST_BAIL;
    p = skip_ws(p + 1, end);
    for (size_t i = 0; rc == 0 && p < end && *p != ']'; i++) {
        const char *pa, *pb;
        size_t na, nb;
        if (i > 0) { /* a comma between elements */
            if (*p != ',') {
                rc = FAST_BAIL;
                break;
            }
            p = skip_ws(p + 1, end);
        }
        if (p < end && *p == '"') {
            rc = fast_string(f, &p, end, &na, err);
            if (rc == 0 && !dry) {
                rc = merge_split(f->buf, na, i, &pa, &na, &pb, &nb, err);
                if (rc == 0) rc = merge_add(t, &ml, i, pa, na, pb, nb, err);
                else if (rc == 1) rc = 0; /* "#version" */
            }
        } else if (p < end && *p == '[') { /* ["a", "b"]: keep a while b is decoded */
            p = skip_ws(p + 1, end);
            if ((rc = fast_string(f, &p, end, &na, err)) != 0) break;
            if (grow((void **)&a, &acap, na + 1, 1, err) < 0) {
                rc = SQUAD_E_NOMEM;
                break;
            }
            memcpy(a, f->buf, na);
            p = skip_ws(p, end);
            if (p >= end || *p != ',') {
                rc = FAST_BAIL;
                break;
            }
            p = skip_ws(p + 1, end);
            if ((rc = fast_string(f, &p, end, &nb, err)) != 0) break;
            p = skip_ws(p, end);
            if (p >= end || *p != ']') {
                rc = FAST_BAIL;
                break;
            }
            p++;
            if (!dry) rc = merge_add(t, &ml, i, a, na, f->buf, nb, err);
        } else {
            rc = FAST_BAIL;
        }
        p = skip_ws(p, end);
    }
    if (rc == 0 && (p >= end || *p != ']' || skip_ws(p + 1, end) != end)) rc = FAST_BAIL;
    if (rc == 0 && !dry) rc = merge_index(t, &ml, err);
    merge_list_free(&ml);
    free(a);
    return rc;
}

/* Normaliser: null, NFC, NFD, NFKC, NFKD, or a Sequence of them. */
static int load_normalizer(squad_tokenizer *t, json_t *n, int depth, squad_err *err) {
    if (!n || json_is_null(n)) return 0;
    if (!json_is_object(n) || depth > 8) return squad_fail(err, SQUAD_E_MODEL, "normalizer must be an object or null");
    const char *type = json_type_of(n);
    if (!type) return squad_fail(err, SQUAD_E_MODEL, "normalizer.type must be a string");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list)) return squad_fail(err, SQUAD_E_MODEL, "normalizer Sequence needs a normalizers array");
        for (size_t i = 0; i < json_array_size(list); i++)
            if (load_normalizer(t, json_array_get(list, i), depth + 1, err) < 0) return err ? err->code : SQUAD_E_MODEL;
        return 0;
    }
    int kind;
    if (!strcmp(type, "NFC")) kind = NORM_NFC;
    else if (!strcmp(type, "NFD")) kind = NORM_NFD;
    else if (!strcmp(type, "NFKC")) kind = NORM_NFKC;
    else if (!strcmp(type, "NFKD")) kind = NORM_NFKD;
    else
        return squad_fail(err, SQUAD_E_UNSUPPORTED,
                          "normalizer type '%s' is not supported (squad implements NFC, NFD, NFKC, NFKD and Sequence)",
                          type);
    if (t->n_norm == TOK_MAX_NORM) return squad_fail(err, SQUAD_E_UNSUPPORTED, "normalizer: too many steps");
    t->norm[t->n_norm++] = kind;
    return 0;
}

/* Rewrites an Oniguruma pattern for PCRE2 where the two read the same escape differently:
 * \s and \S (Oniguruma's white space includes U+0085), \h and \H (a hex digit in Oniguruma).
 * Inside a character class \S and \H are left as they are. */
static char *translate_regex(const char *src, size_t n, size_t *out_len, squad_err *err) {
    if (n > (SIZE_MAX - 16) / 12) {
        squad_fail(err, SQUAD_E_NOMEM, "regex too long");
        return NULL;
    }
    char *out = squad_malloc(12 * n + 16, err);
    if (!out) return NULL;
    size_t o = 0;
    int in_class = 0;
    for (size_t i = 0; i < n;) {
        char c = src[i];
        if (c == '\\' && i + 1 < n) {
            char d = src[i + 1];
            const char *rep = NULL;
            if (d == 's') rep = in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
            else if (d == 'S' && !in_class) rep = "[^\\s\\x{85}]";
            else if (d == 'h') rep = in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
            else if (d == 'H' && !in_class) rep = "[^0-9a-fA-F]";
            if (rep) {
                size_t k = strlen(rep);
                memcpy(out + o, rep, k);
                o += k;
            } else {
                out[o++] = c;
                out[o++] = d;
            }
            i += 2;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            out[o++] = src[i++];
            if (i < n && src[i] == '^') out[o++] = src[i++];
            if (i < n && src[i] == ']') out[o++] = src[i++]; /* a leading ] is literal */
            continue;
        }
        if (c == '[' && in_class && i + 1 < n && src[i + 1] == ':') { /* [:alpha:] */
            const char *end = NULL;
            for (size_t j = i + 2; j + 1 < n; j++)
                if (src[j] == ':' && src[j + 1] == ']') {
                    end = src + j + 2;
                    break;
                }
            if (end) {
                size_t k = (size_t)(end - (src + i));
                memcpy(out + o, src + i, k);
                o += k;
                i += k;
                continue;
            }
        }
        if (c == ']' && in_class) in_class = 0;
        out[o++] = src[i++];
    }
    out[o] = 0;
    *out_len = o;
    return out;
}

static int compile_regex(pretok_stage *st, const char *pattern, size_t n, int literal, const char *where,
                         squad_err *err) {
    int errcode;
    PCRE2_SIZE erroff;
    if (literal) {
        st->re = pcre2_compile((PCRE2_SPTR)pattern, n, PCRE2_UTF | PCRE2_LITERAL, &errcode, &erroff, NULL);
    } else {
        size_t tn;
        char *tr = translate_regex(pattern, n, &tn, err);
        if (!tr) return SQUAD_E_NOMEM;
        st->re = pcre2_compile((PCRE2_SPTR)tr, tn, PCRE2_UTF | PCRE2_UCP, &errcode, &erroff, NULL);
        free(tr);
    }
    if (!st->re) {
        PCRE2_UCHAR buf[160];
        if (pcre2_get_error_message(errcode, buf, sizeof buf) < 0) strcpy((char *)buf, "unknown error");
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "%s: regex \"%.80s\" does not compile with PCRE2: %s", where,
                          pattern, (const char *)buf);
    }
    st->jit = pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

static int parse_behavior(json_t *o, int *out, const char *where, squad_err *err) {
    json_t *b = json_object_get(o, "behavior");
    const char *s = json_is_string(b) ? json_string_value(b) : NULL;
    if (!s) return squad_fail(err, SQUAD_E_MODEL, "%s.behavior must be a string", where);
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    return squad_fail(err, SQUAD_E_UNSUPPORTED, "%s.behavior '%s' is not supported", where, s);
}

static int load_split(pretok_stage *st, json_t *o, const char *where, squad_err *err) {
    st->kind = PT_SPLIT;
    json_t *pat = json_object_get(o, "pattern");
    json_t *re = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
    json_t *str = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
    if (!json_is_string(re) && !json_is_string(str))
        return squad_fail(err, SQUAD_E_MODEL, "%s.pattern must be {\"Regex\": ...} or {\"String\": ...}", where);
    if (parse_behavior(o, &st->behavior, where, err) < 0 ||
        json_bool_field(o, "invert", 0, &st->invert, where, err) < 0)
        return err ? err->code : SQUAD_E_MODEL;
    json_t *p = json_is_string(re) ? re : str;
    if (json_string_length(p) == 0) return squad_fail(err, SQUAD_E_MODEL, "%s.pattern is empty", where);
    return compile_regex(st, json_string_value(p), json_string_length(p), !json_is_string(re), where, err);
}

static int load_bytelevel(pretok_stage *st, json_t *o, const char *where, squad_err *err) {
    st->kind = PT_BYTELEVEL;
    if (json_bool_field(o, "add_prefix_space", 1, &st->add_prefix_space, where, err) < 0 ||
        json_bool_field(o, "use_regex", 1, &st->use_regex, where, err) < 0)
        return err ? err->code : SQUAD_E_MODEL;
    if (st->use_regex) return compile_regex(st, GPT2_REGEX, strlen(GPT2_REGEX), 0, where, err);
    return 0;
}

/* Pre-tokenizer: null, Split, ByteLevel, or a Sequence of them with ByteLevel last. */
static int load_pretokenizer(squad_tokenizer *t, json_t *p, int depth, squad_err *err) {
    if (!p || json_is_null(p)) return 0;
    if (!json_is_object(p) || depth > 8)
        return squad_fail(err, SQUAD_E_MODEL, "pre_tokenizer must be an object or null");
    const char *type = json_type_of(p);
    if (!type) return squad_fail(err, SQUAD_E_MODEL, "pre_tokenizer.type must be a string");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list))
            return squad_fail(err, SQUAD_E_MODEL, "pre_tokenizer Sequence needs a pretokenizers array");
        for (size_t i = 0; i < json_array_size(list); i++)
            if (load_pretokenizer(t, json_array_get(list, i), depth + 1, err) < 0) return err ? err->code : SQUAD_E_MODEL;
        return 0;
    }
    if (t->byte_level)
        return squad_fail(err, SQUAD_E_UNSUPPORTED,
                          "pre_tokenizer: a '%s' step after ByteLevel is not supported (ByteLevel must come last)", type);
    if (t->n_stages == TOK_MAX_STAGES) return squad_fail(err, SQUAD_E_UNSUPPORTED, "pre_tokenizer: too many steps");
    pretok_stage *st = &t->stages[t->n_stages++];
    char where[64];
    snprintf(where, sizeof where, "pre_tokenizer %s (step %d)", type, t->n_stages);
    if (!strcmp(type, "Split")) return load_split(st, p, where, err);
    if (!strcmp(type, "ByteLevel")) {
        t->byte_level = 1;
        return load_bytelevel(st, p, where, err);
    }
    t->n_stages--;
    return squad_fail(err, SQUAD_E_UNSUPPORTED,
                      "pre_tokenizer type '%s' is not supported (squad implements Split, ByteLevel and Sequence)", type);
}

/* Decoder: null (tokens joined by spaces), ByteLevel, or a Sequence of ByteLevel steps. */
static int load_decoder(squad_tokenizer *t, json_t *d, int depth, squad_err *err) {
    if (!d || json_is_null(d)) return 0;
    if (!json_is_object(d) || depth > 8) return squad_fail(err, SQUAD_E_MODEL, "decoder must be an object or null");
    const char *type = json_type_of(d);
    if (!type) return squad_fail(err, SQUAD_E_MODEL, "decoder.type must be a string");
    if (!strcmp(type, "ByteLevel")) {
        t->decoder = DEC_BYTELEVEL;
        return 0;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(d, "decoders");
        if (!json_is_array(list)) return squad_fail(err, SQUAD_E_MODEL, "decoder Sequence needs a decoders array");
        for (size_t i = 0; i < json_array_size(list); i++)
            if (load_decoder(t, json_array_get(list, i), depth + 1, err) < 0) return err ? err->code : SQUAD_E_MODEL;
        return 0;
    }
    return squad_fail(err, SQUAD_E_UNSUPPORTED,
                      "decoder type '%s' is not supported (squad implements ByteLevel and Sequence of it)", type);
}

/* Builds the id table: what each id decodes to, and where it came from. */
static int build_ids(squad_tokenizer *t, int64_t max_id, squad_err *err) {
    size_t count = t->n_vkeys + (size_t)t->n_added;
    if (max_id >= (int64_t)(4 * count + 65536))
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "token ids are too sparse (largest id %lld for %zu tokens)",
                          (long long)max_id, count);
    t->n_ids = (int32_t)(max_id + 1);
    t->info = squad_malloc((size_t)t->n_ids * sizeof(tok_info), err);
    if (!t->info) return SQUAD_E_NOMEM;
    for (int32_t i = 0; i < t->n_ids; i++) t->info[i] = (tok_info){0, 0, -1, -1};
    for (size_t k = 0; k < t->n_vkeys; k++)
        if (t->info[t->vkeys[k].id].key < 0) t->info[t->vkeys[k].id].key = (int32_t)k;
    for (int a = 0; a < t->n_added; a++)
        if (t->info[t->added[a].id].added < 0) t->info[t->added[a].id].added = a;
    char *buf = NULL;
    size_t cap = 0;
    for (int32_t i = 0; i < t->n_ids; i++) {
        tok_info *ti = &t->info[i];
        uint32_t off, len;
        if (ti->added >= 0) {
            off = t->added[ti->added].off;
            len = t->added[ti->added].len;
        } else if (ti->key >= 0) {
            off = t->vkeys[ti->key].off;
            len = t->vkeys[ti->key].len;
        } else {
            continue;
        }
        if (t->decoder != DEC_BYTELEVEL) {
            ti->dec_off = off;
            ti->dec_len = len;
            continue;
        }
        /* ByteLevel: every character maps back to its byte, or the token stays as it is written */
        if (grow((void **)&buf, &cap, (size_t)len + 1, 1, err) < 0) {
            free(buf);
            return SQUAD_E_NOMEM;
        }
        size_t k = 0, j = 0;
        int ok = 1;
        while (j < len && ok) {
            size_t cl = utf8_seq_len((const unsigned char *)t->arena + off + j, len - j);
            size_t used;
            int32_t cp = cl ? utf8_decode((const unsigned char *)t->arena + off + j, &used) : -1;
            int b = cp >= 0 && cp < 324 ? t->bl_byte[cp] : -1;
            if (b < 0) ok = 0;
            else buf[k++] = (char)b;
            j += cl ? cl : 1;
        }
        if (!ok) {
            ti->dec_off = off;
            ti->dec_len = len;
        } else if (arena_put(t, buf, k, &ti->dec_off, err) < 0) {
            free(buf);
            return SQUAD_E_NOMEM;
        } else {
            ti->dec_len = (uint32_t)k;
        }
    }
    free(buf);
    return 0;
}

/* The byte-symbol and byte-fallback tables. */
static void build_byte_tables(squad_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char s[8];
        size_t k = utf8_encode(t->bl_cp[b], s);
        t->byte_id[b] = vocab_id(t, s, k);
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->fallback_id[b] = vocab_id(t, s, strlen(s));
    }
}

/* The added-token tries: content as written for normalized = false, normalised otherwise. */
static int build_tries(squad_tokenizer *t, squad_err *err) {
    trie_init(&t->raw_trie);
    trie_init(&t->norm_trie);
    for (int a = 0; a < t->n_added; a++) {
        added_tok *at = &t->added[a];
        if (!at->normalized) {
            if (trie_add(&t->raw_trie, t->arena + at->off, at->len, a, err) < 0) return SQUAD_E_NOMEM;
            continue;
        }
        const char *ns;
        size_t nn;
        char *owned;
        if (squad_utf8_invalid_offset(t->arena + at->off, at->len) < at->len)
            return squad_fail(err, SQUAD_E_MODEL, "added token %d is not valid UTF-8", (int)at->id);
        if (normalize(t, t->arena + at->off, at->len, &ns, &nn, &owned, err) < 0) return err ? err->code : SQUAD_E_NOMEM;
        int rc = 0;
        if (owned && nn) { /* changed by the normaliser: keep the normalised form (ns is not in the arena) */
            uint32_t off;
            rc = arena_put(t, ns, nn, &off, err);
            if (rc == 0) {
                at->off = off;
                at->len = (uint32_t)nn;
            }
        }
        if (rc == 0 && nn) rc = trie_add(&t->norm_trie, t->arena + at->off, at->len, a, err);
        free(owned);
        if (rc < 0) return rc;
    }
    return 0;
}

static int make_scratch(squad_tokenizer *t, squad_err *err) {
    if (pthread_mutex_init(&t->lock, NULL) != 0) return squad_fail(err, SQUAD_E_NOMEM, "cannot create the tokenizer's lock");
    t->lock_ready = 1;
    t->cache = squad_calloc(WC_SETS * WC_WAYS, sizeof(wc_entry), err);
    if (!t->cache) return SQUAD_E_NOMEM;
    t->md = pcre2_match_data_create(1, NULL);
    t->mctx = pcre2_match_context_create(NULL);
    t->jstack = pcre2_jit_stack_create(32 * 1024, TOK_JIT_STACK_MAX, NULL);
    if (!t->md || !t->mctx || !t->jstack) return squad_fail(err, SQUAD_E_NOMEM, "out of memory (regex scratch)");
    pcre2_jit_stack_assign(t->mctx, NULL, t->jstack);
    pcre2_set_match_limit(t->mctx, TOK_REGEX_MATCH_LIMIT);
    pcre2_set_depth_limit(t->mctx, 100000);
    return 0;
}

static int load_root(squad_tokenizer *t, json_t *root, fast_text *fast, squad_err *err) {
    if (!json_is_object(root)) return squad_fail(err, SQUAD_E_MODEL, "the top level must be a JSON object");
    byte_alphabet(t->bl_cp, t->bl_byte);
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return squad_fail(err, SQUAD_E_MODEL, "\"model\" must be an object");
    const char *unk = NULL;
    int64_t max_id = -1;
    int rc = load_model_options(t, model, &unk, err);
    if (rc == 0) rc = fast ? fast_vocab(t, fast, 0, &max_id, err) : load_vocab_json(t, model, &max_id, err);
    if (rc == 0) rc = fast ? fast_merges(t, fast, 0, err) : load_merges_json(t, model, err);
    if (rc == 0) rc = load_added(t, root, &max_id, err);
    if (rc != 0) return rc; /* an error, or FAST_BAIL */
    if (max_id < 0) return squad_fail(err, SQUAD_E_MODEL, "the tokenizer has no tokens");
    t->unk_id = -1;
    if (unk && (t->unk_id = vocab_id(t, unk, strlen(unk))) < 0)
        return squad_fail(err, SQUAD_E_MODEL, "model.unk_token \"%.60s\" is not in the vocabulary", unk);
    if (load_normalizer(t, json_object_get(root, "normalizer"), 0, err) < 0 ||
        load_pretokenizer(t, json_object_get(root, "pre_tokenizer"), 0, err) < 0 ||
        load_decoder(t, json_object_get(root, "decoder"), 0, err) < 0 || build_ids(t, max_id, err) < 0 ||
        build_tries(t, err) < 0 || make_scratch(t, err) < 0)
        return err ? err->code : SQUAD_E_MODEL;
    build_byte_tables(t);
    return 0;
}

/* Loads from a JSON tree (fast: the vocab and merges found in the text, or NULL). FAST_BAIL when the
 * fast reading gave up. */
static squad_tokenizer *load_tree(json_t *root, fast_text *fast, int *bail, squad_err *err) {
    squad_tokenizer *t = squad_calloc(1, sizeof *t, err);
    if (!t) return NULL;
    int rc = load_root(t, root, fast, err);
    if (rc == 0) return t;
    if (rc == FAST_BAIL) *bail = 1;
    squad_tokenizer_free(t);
    return NULL;
}

/* The whole document through jansson. */
static squad_tokenizer *load_generic(const char *json, size_t len, squad_err *err) {
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!root) {
        squad_fail(err, SQUAD_E_MODEL, "not valid JSON (line %d, column %d): %s", jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    int bail = 0;
    squad_tokenizer *t = load_tree(root, NULL, &bail, err);
    json_decref(root);
    return t;
}

/* The fast loader; *bail set when the generic one must do it instead. */
static squad_tokenizer *load_fast(const char *json, size_t len, int *bail, squad_err *err) {
    fast_text f;
    memset(&f, 0, sizeof f);
    squad_tokenizer *t = NULL;
    *bail = 1;
    int64_t unused = -1;
    if (fast_find(&f, json, len, err) == 0 && fast_vocab(NULL, &f, 1, &unused, err) == 0 &&
        fast_merges(NULL, &f, 1, err) == 0) {
        /* the document with model.vocab as {} and model.merges as [] */
        size_t vs = (size_t)(f.vocab - json), ve = (size_t)(f.vocab_end - json);
        size_t ms = (size_t)(f.merges - json), me = (size_t)(f.merges_end - json);
        size_t s1 = vs < ms ? vs : ms, e1 = vs < ms ? ve : me, s2 = vs < ms ? ms : vs, e2 = vs < ms ? me : ve;
        const char *r1 = vs < ms ? "{}" : "[]", *r2 = vs < ms ? "[]" : "{}";
        char *small = squad_malloc(len, err);
        if (!small) {
            *bail = 0;
        } else {
            size_t n = 0;
            memcpy(small, json, s1), n = s1;
            memcpy(small + n, r1, 2), n += 2;
            memcpy(small + n, json + e1, s2 - e1), n += s2 - e1;
            memcpy(small + n, r2, 2), n += 2;
            memcpy(small + n, json + e2, len - e2), n += len - e2;
            json_t *root = json_loadb(small, n, 0, NULL);
            free(small);
            if (root) {
                *bail = 0;
                t = load_tree(root, &f, bail, err);
                json_decref(root);
            }
        }
    }
    free(f.buf);
    return t;
}

squad_tokenizer *squad_tokenizer_load_buffer_ex(const char *json, size_t len, unsigned flags, squad_err *err) {
    if (!(flags & SQUAD_TOK_LOAD_GENERIC)) {
        int bail = 0;
        squad_tokenizer *t = load_fast(json, len, &bail, err);
        if (t || !bail) return t;
    }
    return load_generic(json, len, err);
}

squad_tokenizer *squad_tokenizer_load_buffer(const char *json, size_t len, squad_err *err) {
    return squad_tokenizer_load_buffer_ex(json, len, 0, err);
}

squad_tokenizer *squad_tokenizer_load(const char *path, squad_err *err) {
    size_t len;
    char *buf = squad_read_file(path, &len, err);
    if (!buf) return NULL;
    squad_tokenizer *t = squad_tokenizer_load_buffer(buf, len, err);
    free(buf);
    if (!t) squad_fail_context(err, "tokenizer %s: ", path);
    return t;
}

void squad_tokenizer_free(squad_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_stages; i++) {
        pcre2_code_free(t->stages[i].re);
        free(t->stages[i].scratch);
    }
    pcre2_match_data_free(t->md);
    pcre2_match_context_free(t->mctx);
    pcre2_jit_stack_free(t->jstack);
    free(t->raw_trie.nodes);
    free(t->norm_trie.nodes);
    free(t->arena);
    free(t->info);
    free(t->vkeys);
    free(t->vmap);
    free(t->mmap);
    free(t->added);
    free(t->cache);
    free(t->sym);
    free(t->sym_prev);
    free(t->sym_next);
    free(t->heap);
    free(t->word_buf);
    if (t->lock_ready) pthread_mutex_destroy(&t->lock);
    free(t);
}
