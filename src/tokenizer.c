/*
 * tokenizer.c — the Hugging Face byte-level BPE tokenizer's entry points (see tokenizer.h for the
 * pipeline): encoding (added tokens split out of the text, the rest normalised, pre-tokenized and
 * BPE'd), decoding, the text cache, and the growable id array.
 *
 * The other parts live beside it (tokenizer_internal.h lists them): tokenizer_pretok.c (normaliser
 * and pre-tokenizer), tokenizer_bpe.c (BPE and the word cache), tokenizer_vocab.c (the vocabulary
 * map and the added-token tries), tokenizer_load.c (tokenizer.json).
 *
 * Design:
 * - Added tokens are split out in two passes, as Hugging Face does: those with "normalized": false
 *   from the raw text, the others from each normalised piece between them. SQUAD_TOK_PLAIN skips
 *   both, so text from a request never becomes a special token.
 * - All mutable scratch (match data, JIT stack, BPE arrays, the word cache) lives in the tokenizer
 *   object, and a mutex in the object serialises encoding, so several threads may encode with one
 *   tokenizer (the server's connection threads). An optional text cache
 *   (squad_tokenizer_set_text_cache) is consulted outside that lock, so a text seen before costs
 *   neither the lock nor the encoding. Decoding reads only immutable tables and takes no lock.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer_internal.h"
#include "utf8.h"
#include "util.h"

/* ---------------------------------------------------------------------------------------------
 * Growable buffers
 * ------------------------------------------------------------------------------------------- */

/* Grows *buf (element size elem) to hold at least need elements. */
int tok_grow(void **buf, size_t *cap, size_t need, size_t elem, squad_err *err) {
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
    if (vec->n == vec->cap && tok_grow((void **)&vec->v, &vec->cap, vec->n + 1, sizeof(int32_t), err) < 0)
        return err ? err->code : SQUAD_E_NOMEM;
    vec->v[vec->n++] = id;
    return 0;
}

int squad_idvec_append(squad_idvec *vec, const int32_t *ids, size_t n, squad_err *err) {
    if (n > SIZE_MAX - vec->n) return squad_fail(err, SQUAD_E_NOMEM, "too many ids");
    if (tok_grow((void **)&vec->v, &vec->cap, vec->n + n, sizeof(int32_t), err) < 0) return SQUAD_E_NOMEM;
    if (n) memcpy(vec->v + vec->n, ids, n * sizeof(int32_t));
    vec->n += n;
    return 0;
}

void squad_idvec_free(squad_idvec *vec) {
    free(vec->v);
    vec->v = NULL;
    vec->n = vec->cap = 0;
}

/* ---------------------------------------------------------------------------------------------
 * Encoding: added tokens, then the pipeline
 * ------------------------------------------------------------------------------------------- */

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
    while (tok_trie_find(tr, s, n, pos, &ms, &me, &a)) {
        pos = me; /* matching resumes after the raw match, whatever is done with it */
        const added_tok *at = &t->added[a];
        if (at->single_word) {
            size_t k;
            int left_ok = ms == 0 || !is_word_char(squad_utf8_prev_char(s, ms, &k));
            int right_ok = me == n || !is_word_char(squad_utf8_decode((const unsigned char *)s + me, &k));
            if (!left_ok || !right_ok) continue;
        }
        size_t start = ms, stop = me;
        if (at->lstrip) {
            while (start > start_offset) {
                size_t k;
                if (!is_unicode_space(squad_utf8_prev_char(s, start, &k))) break;
                start = k;
            }
        }
        if (at->rstrip) {
            while (stop < n) {
                size_t k;
                if (!is_unicode_space(squad_utf8_decode((const unsigned char *)s + stop, &k))) break;
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
    return tok_run_stages(t, 0, s, n, out, err);
}

/* Raw text between non-normalized added tokens: normalise, then the normalised level. */
static int raw_piece(squad_tokenizer *t, const char *s, size_t n, squad_idvec *out, squad_err *err) {
    const char *ns;
    size_t nn;
    char *owned;
    int rc = tok_normalize(t, s, n, &ns, &nn, &owned, err);
    if (rc < 0) return rc;
    if (t->norm_trie.empty) rc = tok_run_stages(t, 0, ns, nn, out, err);
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
        rc = tok_normalize(tok, text, len, &ns, &nn, &owned, err);
        if (rc >= 0) rc = tok_run_stages(tok, 0, ns, nn, out, err);
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
    size_t m = squad_utf8_lossy((const unsigned char *)raw, k, outb);
    free(raw);
    outb[m] = 0;
    *text = outb;
    if (len) *len = m;
    return 0;
}
