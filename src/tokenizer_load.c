/*
 * tokenizer_load.c — reads a Hugging Face tokenizer.json into a tokenizer object: the model's
 * options, vocabulary and merges, the added tokens, the decoder, and the tables built from them
 * (what each id decodes to, the byte-symbol ids, the added-token tries); then frees it.
 *
 * Design:
 * - model.vocab and model.merges (nearly all of an 11 MB file) are read straight from the text and
 *   jansson parses the rest; on anything unusual the whole file goes through jansson, so the result
 *   never depends on the path (the fuzz target checks both agree).
 * - Anything the file asks for that squad does not implement is refused here, with a message naming
 *   it, rather than tokenised differently later.
 * - Every string lives in one arena owned by the object; the object is immutable after loading
 *   except for its scratch (tokenizer.h).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "utf8.h"
#include "util.h"

/* ---------------------------------------------------------------------------------------------
 * The arena and the byte-level alphabet (bytes 0..255 <-> 256 printable code points: GPT-2's
 * bytes_to_unicode)
 * ------------------------------------------------------------------------------------------- */

/* Copies n bytes into the arena; their offset in *off. */
static int arena_put(squad_tokenizer *t, const char *s, size_t n, uint32_t *off, squad_err *err) {
    if (t->arena_len + n > UINT32_MAX) return squad_fail(err, SQUAD_E_UNSUPPORTED, "tokenizer strings exceed 4 GiB");
    if (tok_grow((void **)&t->arena, &t->arena_cap, t->arena_len + n + 1, 1, err) < 0) return SQUAD_E_NOMEM;
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
 * Loading: the model, the vocabulary, the added tokens and the merges
 * ------------------------------------------------------------------------------------------- */

/* A boolean field: absent or null gives dflt; anything but true / false is an error. */
int tok_json_bool_field(json_t *obj, const char *key, int dflt, int *out, const char *where, squad_err *err) {
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

const char *tok_json_type_of(json_t *obj) {
    json_t *ty = json_object_get(obj, "type");
    return json_is_string(ty) ? json_string_value(ty) : NULL;
}

/* Checks the BPE options squad does not implement; reads the ones it does. */
static int load_model_options(squad_tokenizer *t, json_t *model, const char **unk, squad_err *err) {
    const char *type = tok_json_type_of(model);
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
    if (tok_json_bool_field(model, "byte_fallback", 0, &t->byte_fallback, "model", err) < 0 ||
        tok_json_bool_field(model, "ignore_merges", 0, &t->ignore_merges, "model", err) < 0 ||
        tok_json_bool_field(model, "fuse_unk", 0, &t->fuse_unk, "model", err) < 0 ||
        json_str_field(model, "unk_token", unk, "model", err) < 0)
        return SQUAD_E_MODEL;
    return 0;
}

/* Appends one vocabulary entry (the map is built afterwards by vocab_index). */
static int vocab_add(squad_tokenizer *t, const char *key, size_t n, int32_t id, int64_t *max_id, squad_err *err) {
    if (n > UINT32_MAX) return squad_fail(err, SQUAD_E_MODEL, "a vocabulary key is too long");
    if (t->n_vkeys == t->cap_vkeys &&
        tok_grow((void **)&t->vkeys, &t->cap_vkeys, t->n_vkeys + 1, sizeof(vocab_key), err) < 0)
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
        if (tok_vocab_insert(t, (uint32_t)k) && dups_bail) return FAST_BAIL;
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
        if (tok_json_bool_field(o, "special", 0, &special, where, err) < 0 ||
            tok_json_bool_field(o, "lstrip", 0, &lstrip, where, err) < 0 ||
            tok_json_bool_field(o, "rstrip", 0, &rstrip, where, err) < 0 ||
            tok_json_bool_field(o, "single_word", 0, &single, where, err) < 0 ||
            tok_json_bool_field(o, "normalized", 1, &normalized, where, err) < 0)
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
    int32_t ia = tok_vocab_id(t, a, na), ib = tok_vocab_id(t, b, nb);
    if (ia < 0 || ib < 0)
        return squad_fail(err, SQUAD_E_MODEL, "model.merges[%zu]: token \"%.*s\" is not in the vocabulary", i,
                          (int)(ia < 0 ? (na > 60 ? 60 : na) : (nb > 60 ? 60 : nb)), ia < 0 ? a : b);
    if (tok_grow((void **)&ml->joined, &ml->joined_cap, na + nb + 1, 1, err) < 0) return SQUAD_E_NOMEM;
    memcpy(ml->joined, a, na);
    memcpy(ml->joined + na, b, nb);
    int32_t id = tok_vocab_id(t, ml->joined, na + nb);
    if (id < 0)
        return squad_fail(err, SQUAD_E_MODEL, "model.merges[%zu]: the merged token \"%.*s\" is not in the vocabulary",
                          i, (int)(na + nb > 60 ? 60 : na + nb), ml->joined);
    if (ml->n / 3 >= UINT32_MAX / 4) return squad_fail(err, SQUAD_E_MODEL, "model.merges: too many merges");
    if (tok_grow((void **)&ml->v, &ml->cap, ml->n + 3, sizeof(int32_t), err) < 0) return SQUAD_E_NOMEM;
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
    for (size_t r = 0; r < n; r++) tok_merge_insert(t, ml->v[3 * r], ml->v[3 * r + 1], (uint32_t)r, ml->v[3 * r + 2]);
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
        if (tok_grow((void **)&f->buf, &f->cap, n + k + 8, 1, err) < 0) return SQUAD_E_NOMEM;
        memcpy(f->buf + n, run, k);
        n += k;
        if (p >= end) return FAST_BAIL;
        unsigned char c = (unsigned char)*p;
        if (c == '"') break;
        if (c < 0x20) return FAST_BAIL;
        if (c >= 0x80) {
            size_t m = squad_utf8_seq_len((const unsigned char *)p, (size_t)(end - p));
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
        n += squad_utf8_encode(cp, f->buf + n);
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
            if (tok_grow((void **)&a, &acap, na + 1, 1, err) < 0) {
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

/* ---------------------------------------------------------------------------------------------
 * The decoder and the tables built from everything read
 * ------------------------------------------------------------------------------------------- */

/* Decoder: null (tokens joined by spaces), ByteLevel, or a Sequence of ByteLevel steps. */
static int load_decoder(squad_tokenizer *t, json_t *d, int depth, squad_err *err) {
    if (!d || json_is_null(d)) return 0;
    if (!json_is_object(d) || depth > 8) return squad_fail(err, SQUAD_E_MODEL, "decoder must be an object or null");
    const char *type = tok_json_type_of(d);
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
        if (tok_grow((void **)&buf, &cap, (size_t)len + 1, 1, err) < 0) {
            free(buf);
            return SQUAD_E_NOMEM;
        }
        size_t k = 0, j = 0;
        int ok = 1;
        while (j < len && ok) {
            size_t cl = squad_utf8_seq_len((const unsigned char *)t->arena + off + j, len - j);
            size_t used;
            int32_t cp = cl ? squad_utf8_decode((const unsigned char *)t->arena + off + j, &used) : -1;
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
        size_t k = squad_utf8_encode(t->bl_cp[b], s);
        t->byte_id[b] = tok_vocab_id(t, s, k);
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->fallback_id[b] = tok_vocab_id(t, s, strlen(s));
    }
}

/* The added-token tries: content as written for normalized = false, normalised otherwise. */
static int build_tries(squad_tokenizer *t, squad_err *err) {
    tok_trie_init(&t->raw_trie);
    tok_trie_init(&t->norm_trie);
    for (int a = 0; a < t->n_added; a++) {
        added_tok *at = &t->added[a];
        if (!at->normalized) {
            if (tok_trie_add(&t->raw_trie, t->arena + at->off, at->len, a, err) < 0) return SQUAD_E_NOMEM;
            continue;
        }
        const char *ns;
        size_t nn;
        char *owned;
        if (squad_utf8_invalid_offset(t->arena + at->off, at->len) < at->len)
            return squad_fail(err, SQUAD_E_MODEL, "added token %d is not valid UTF-8", (int)at->id);
        if (tok_normalize(t, t->arena + at->off, at->len, &ns, &nn, &owned, err) < 0) return err ? err->code : SQUAD_E_NOMEM;
        int rc = 0;
        if (owned && nn) { /* changed by the normaliser: keep the normalised form (ns is not in the arena) */
            uint32_t off;
            rc = arena_put(t, ns, nn, &off, err);
            if (rc == 0) {
                at->off = off;
                at->len = (uint32_t)nn;
            }
        }
        if (rc == 0 && nn) rc = tok_trie_add(&t->norm_trie, t->arena + at->off, at->len, a, err);
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

/* ---------------------------------------------------------------------------------------------
 * Loading and freeing
 * ------------------------------------------------------------------------------------------- */

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
    if (unk && (t->unk_id = tok_vocab_id(t, unk, strlen(unk))) < 0)
        return squad_fail(err, SQUAD_E_MODEL, "model.unk_token \"%.60s\" is not in the vocabulary", unk);
    if (tok_load_normalizer(t, json_object_get(root, "normalizer"), 0, err) < 0 ||
        tok_load_pretokenizer(t, json_object_get(root, "pre_tokenizer"), 0, err) < 0 ||
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
