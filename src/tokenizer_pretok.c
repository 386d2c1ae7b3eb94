/*
 * tokenizer_pretok.c — the normaliser and the pre-tokenizer: a piece of text is normalised (NFC,
 * NFD, NFKC, NFKD or a sequence of them, by utf8proc), then cut into words by the file's Split and
 * ByteLevel steps, each word going on to BPE (tokenizer_bpe.c). Loading both from the file is here
 * too, beside the code that runs them.
 *
 * Design:
 * - Regexes are the file's own, translated where Oniguruma (which Hugging Face uses) and PCRE2 differ
 *   (\s also matches U+0085; \h is a hex digit) and compiled with UTF + UCP and JIT. Matches are
 *   iterated exactly as Hugging Face iterates Oniguruma's, so empty matches behave the same.
 * - The steps run as a recursion over the stage index: a stage hands each piece it cuts to the next
 *   stage, the last one to BPE, so no list of pieces is ever built.
 * - Normalisation is skipped where it cannot change the text: ASCII under every normal form, and
 *   for NFC text whose code points cannot compose or decompose (nfc_inert).
 * - The match data and JIT stack are the tokenizer's scratch, used under its lock (tokenizer.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer_internal.h"
#include "utf8.h"
#include "util.h"

/* The GPT-2 regex a ByteLevel pre-tokenizer with use_regex runs (Hugging Face's, verbatim). */
static const char GPT2_REGEX[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---------------------------------------------------------------------------------------------
 * Pre-tokenization
 * ------------------------------------------------------------------------------------------- */

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
    return tok_run_stages(f->t, f->stage + 1, f->p + s, e - s, f->out, f->err);
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
            last_end += last_end < n ? squad_utf8_char_len((unsigned char)p[last_end]) : 1;
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
        if (tok_grow((void **)&st->scratch, &st->scratch_cap, n + 1, 1, err) < 0) return SQUAD_E_NOMEM;
        st->scratch[0] = ' ';
        memcpy(st->scratch + 1, p, n);
        p = st->scratch;
        n++;
    }
    if (st->use_regex) return split_stage(t, stage, st, SPLIT_ISOLATED, 0, p, n, out, err);
    return tok_run_stages(t, stage + 1, p, n, out, err);
}

int tok_run_stages(squad_tokenizer *t, int stage, const char *p, size_t n, squad_idvec *out, squad_err *err) {
    if (n == 0) return 0;
    if (stage == t->n_stages) return tok_bpe_word(t, (const uint8_t *)p, n, out, err);
    const pretok_stage *st = &t->stages[stage];
    if (st->kind == PT_SPLIT) return split_stage(t, stage, st, st->behavior, st->invert, p, n, out, err);
    return bytelevel_stage(t, stage, p, n, out, err);
}

/* ---------------------------------------------------------------------------------------------
 * Normalisation
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
        int32_t c = squad_utf8_decode(u + i, &k);
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
int tok_normalize(const squad_tokenizer *t, const char *s, size_t n, const char **out, size_t *out_len,
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

/* ---------------------------------------------------------------------------------------------
 * Loading the normaliser and the pre-tokenizer
 * ------------------------------------------------------------------------------------------- */

/* Normaliser: null, NFC, NFD, NFKC, NFKD, or a Sequence of them. */
int tok_load_normalizer(squad_tokenizer *t, json_t *n, int depth, squad_err *err) {
    if (!n || json_is_null(n)) return 0;
    if (!json_is_object(n) || depth > 8) return squad_fail(err, SQUAD_E_MODEL, "normalizer must be an object or null");
    const char *type = tok_json_type_of(n);
    if (!type) return squad_fail(err, SQUAD_E_MODEL, "normalizer.type must be a string");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list)) return squad_fail(err, SQUAD_E_MODEL, "normalizer Sequence needs a normalizers array");
        for (size_t i = 0; i < json_array_size(list); i++)
            if (tok_load_normalizer(t, json_array_get(list, i), depth + 1, err) < 0) return err ? err->code : SQUAD_E_MODEL;
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
        tok_json_bool_field(o, "invert", 0, &st->invert, where, err) < 0)
        return err ? err->code : SQUAD_E_MODEL;
    json_t *p = json_is_string(re) ? re : str;
    if (json_string_length(p) == 0) return squad_fail(err, SQUAD_E_MODEL, "%s.pattern is empty", where);
    return compile_regex(st, json_string_value(p), json_string_length(p), !json_is_string(re), where, err);
}

static int load_bytelevel(pretok_stage *st, json_t *o, const char *where, squad_err *err) {
    st->kind = PT_BYTELEVEL;
    if (tok_json_bool_field(o, "add_prefix_space", 1, &st->add_prefix_space, where, err) < 0 ||
        tok_json_bool_field(o, "use_regex", 1, &st->use_regex, where, err) < 0)
        return err ? err->code : SQUAD_E_MODEL;
    if (st->use_regex) return compile_regex(st, GPT2_REGEX, strlen(GPT2_REGEX), 0, where, err);
    return 0;
}

/* Pre-tokenizer: null, Split, ByteLevel, or a Sequence of them with ByteLevel last. */
int tok_load_pretokenizer(squad_tokenizer *t, json_t *p, int depth, squad_err *err) {
    if (!p || json_is_null(p)) return 0;
    if (!json_is_object(p) || depth > 8)
        return squad_fail(err, SQUAD_E_MODEL, "pre_tokenizer must be an object or null");
    const char *type = tok_json_type_of(p);
    if (!type) return squad_fail(err, SQUAD_E_MODEL, "pre_tokenizer.type must be a string");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list))
            return squad_fail(err, SQUAD_E_MODEL, "pre_tokenizer Sequence needs a pretokenizers array");
        for (size_t i = 0; i < json_array_size(list); i++)
            if (tok_load_pretokenizer(t, json_array_get(list, i), depth + 1, err) < 0) return err ? err->code : SQUAD_E_MODEL;
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
