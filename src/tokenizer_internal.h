/*
 * tokenizer_internal.h — what the tokenizer's files share and nothing else includes: the limits, the
 * tokenizer object's layout and the functions one part of the tokenizer calls in another.
 *
 * The tokenizer is split by concern (tokenizer.h is its only public face):
 *   tokenizer.c          encode (added tokens split out, then the pipeline), decode, the text cache
 *   tokenizer_pretok.c   the normaliser and the pre-tokenizer (the file's regexes run by PCRE2)
 *   tokenizer_bpe.c      BPE over a word: the merge map, the heap of candidate merges, the word cache
 *   tokenizer_vocab.c    the vocabulary map and the added-token trie, and the lookups built on them
 *   tokenizer_load.c     reading tokenizer.json (the fast path for the vocabulary and merges, jansson
 *                        for the rest) into the object, and freeing it
 * Internal functions are named tok_*.
 */
#ifndef SQUAD_TOKENIZER_INTERNAL_H
#define SQUAD_TOKENIZER_INTERNAL_H

#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hash_index.h"
#include "tokenizer.h"

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
 * Shared helpers
 * ------------------------------------------------------------------------------------------- */

/* The vocabulary map and the word cache hash with squad_hash_bytes (hash_index.h), seed TOK_HASH_SEED. */
#define TOK_HASH_SEED 0

/* tokenizer.c: grows *buf (element size elem) to hold at least need elements (doubling). */
int tok_grow(void **buf, size_t *cap, size_t need, size_t elem, squad_err *err);

/* tokenizer_vocab.c: the vocabulary map (key -> id, -1 when absent; tok_vocab_insert adds key index
 * k and returns 1 when that key was there already) and the added-token tries. */
int32_t tok_vocab_id(const squad_tokenizer *t, const char *s, size_t n);
int tok_vocab_insert(squad_tokenizer *t, uint32_t k);
void tok_trie_init(added_trie *tr);
int tok_trie_add(added_trie *tr, const char *s, size_t n, int32_t a, squad_err *err);
/* The leftmost-longest match at or after from: 1 with [*ms, *me) and token index *a, else 0. */
int tok_trie_find(const added_trie *tr, const char *s, size_t len, size_t from, size_t *ms, size_t *me, int32_t *a);

/* tokenizer_bpe.c: records merge (a, b) -> id of rank `rank` (a later merge of the same pair
 * replaces an earlier one); one pre-tokenized word through the model, its ids appended to out. */
void tok_merge_insert(squad_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id);
int tok_bpe_word(squad_tokenizer *t, const uint8_t *w, size_t n, squad_idvec *out, squad_err *err);

/* tokenizer_pretok.c: the normaliser (*out is s itself, or a new buffer returned in *owned to free),
 * the pre-tokenizer from step `stage` on (each word it cuts goes to tok_bpe_word), and loading both
 * from the file. */
int tok_normalize(const squad_tokenizer *t, const char *s, size_t n, const char **out, size_t *out_len, char **owned,
                  squad_err *err);
int tok_run_stages(squad_tokenizer *t, int stage, const char *p, size_t n, squad_idvec *out, squad_err *err);
int tok_load_normalizer(squad_tokenizer *t, json_t *n, int depth, squad_err *err);
int tok_load_pretokenizer(squad_tokenizer *t, json_t *p, int depth, squad_err *err);

/* tokenizer_load.c: typed fields of the file's objects. */
int tok_json_bool_field(json_t *obj, const char *key, int dflt, int *out, const char *where, squad_err *err);
const char *tok_json_type_of(json_t *obj);

#endif /* SQUAD_TOKENIZER_INTERNAL_H */
