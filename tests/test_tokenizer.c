/*
 * test_tokenizer.c — the tokenizer against Hugging Face `tokenizers`, token for token.
 *
 * - The corpus (tests/fixtures/tokenizer/corpus.jsonl, a few hundred hard strings) through the real
 *   Qwen3 tokenizer (third_party/qwen3/tokenizer.json, fetched by tools/fetch_test_data.sh): every
 *   string must give exactly the reference ids (expected.jsonl, written by
 *   tools/make_tokenizer_fixture.js) and decode back to its NFC form. A missing tokenizer file is a
 *   failure, not a skip.
 * - Small synthetic tokenizers (variants.jsonl) cover what the Qwen file does not use: Split
 *   behaviours and invert, ByteLevel options, merge forms, ignore_merges, byte_fallback / unk,
 *   added-token flags, other normalisers.
 * - Errors: invalid UTF-8 names its byte offset; malformed or unsupported tokenizer.json files are
 *   refused with a message naming the problem; unknown ids do not decode.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "tokenizer.h"
#include "utf8.h"
#include "util.h"

#define QWEN_PATH "third_party/qwen3/tokenizer.json"
#define FIXTURES "tests/fixtures/tokenizer/"

/* Reads a JSON-lines file into an array of parsed values (NULL on failure). */
static json_t *read_jsonl(const char *path) {
    squad_err err = {0};
    size_t len;
    char *buf = squad_read_file(path, &len, &err);
    if (!buf) {
        fprintf(stderr, "%s\n", err.msg);
        return NULL;
    }
    json_t *arr = json_array();
    char *line = buf;
    while (line < buf + len) {
        char *nl = memchr(line, '\n', (size_t)(buf + len - line));
        size_t n = nl ? (size_t)(nl - line) : (size_t)(buf + len - line);
        json_error_t jerr;
        json_t *v = json_loadb(line, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        if (!v) {
            fprintf(stderr, "%s: %s\n", path, jerr.text);
            json_decref(arr);
            free(buf);
            return NULL;
        }
        json_array_append_new(arr, v);
        line += n + 1;
    }
    free(buf);
    return arr;
}

/* 1 when the ids equal the JSON array of expected ids. */
static int ids_equal(const int32_t *ids, size_t n, json_t *expected) {
    if (json_array_size(expected) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(expected, i)) != ids[i]) return 0;
    return 1;
}

static void print_ids(const char *label, const int32_t *ids, size_t n, json_t *expected) {
    fprintf(stderr, "    %s:", label);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n    expected:", n > 40 ? " ..." : "");
    for (size_t i = 0; i < json_array_size(expected) && i < 40; i++)
        fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(expected, i)));
    fprintf(stderr, "\n");
}

/* Encodes text, compares with the expected ids and the decode with want_text; 1 when both match. */
static int check_case(squad_tokenizer *tok, const char *text, size_t len, json_t *expected, const char *want_text,
                      size_t want_len, const char *label) {
    squad_err err = {0};
    squad_idvec v = {0};
    int ok = 1;
    if (squad_tokenize_append(tok, text, len, 0, &v, &err) < 0) {
        fprintf(stderr, "  %s: tokenize failed: %s\n", label, err.msg);
        squad_idvec_free(&v);
        return 0;
    }
    if (!ids_equal(v.v, v.n, expected)) {
        fprintf(stderr, "  %s: ids differ for \"%.60s\"\n", label, text);
        print_ids("got", v.v, v.n, expected);
        ok = 0;
    }
    char *dec = NULL;
    size_t dlen = 0;
    if (squad_detokenize(tok, v.v, v.n, 0, &dec, &dlen, &err) < 0) {
        fprintf(stderr, "  %s: detokenize failed: %s\n", label, err.msg);
        ok = 0;
    } else if (dlen != want_len || memcmp(dec, want_text, dlen)) {
        fprintf(stderr, "  %s: decode differs: \"%.60s\" vs \"%.60s\"\n", label, dec, want_text);
        ok = 0;
    }
    free(dec);
    squad_idvec_free(&v);
    return ok;
}

/* Loads the Qwen tokenizer with the given load flags (the fast reader, or jansson for everything). */
static squad_tokenizer *load_qwen(unsigned flags) {
    squad_err err = {0};
    size_t len = 0;
    char *buf = squad_read_file(QWEN_PATH, &len, &err);
    squad_tokenizer *tok = buf ? squad_tokenizer_load_buffer_ex(buf, len, flags, &err) : NULL;
    free(buf);
    CHECKF(tok != NULL, "%s (run tools/fetch_test_data.sh, which `make deps` calls)", err.msg);
    return tok;
}

static void test_corpus(unsigned load_flags) {
    squad_err err = {0};
    squad_tokenizer *tok = load_qwen(load_flags);
    if (!tok) return;
    printf("loader: %s\n", load_flags & SQUAD_TOK_LOAD_GENERIC ? "jansson for the whole file" : "fast reader");
    json_t *corpus = read_jsonl(FIXTURES "corpus.jsonl"), *expected = read_jsonl(FIXTURES "expected.jsonl");
    CHECK(corpus && expected);
    if (corpus && expected) {
        CHECKF(json_array_size(corpus) == json_array_size(expected), "%zu corpus lines, %zu expected",
               json_array_size(corpus), json_array_size(expected));
        CHECKF(json_array_size(corpus) >= 300, "the corpus has only %zu strings", json_array_size(corpus));
        size_t n = json_array_size(corpus), good = 0;
        for (size_t i = 0; i < n && i < json_array_size(expected); i++) {
            json_t *s = json_array_get(corpus, i), *e = json_array_get(expected, i);
            json_t *nfc = json_object_get(e, "nfc");
            char label[48];
            snprintf(label, sizeof label, "corpus line %zu", i + 1);
            good += check_case(tok, json_string_value(s), json_string_length(s), json_object_get(e, "ids"),
                               json_string_value(nfc), json_string_length(nfc), label);
        }
        printf("corpus: %zu/%zu strings match the reference ids and decode to NFC\n", good, n);
        CHECKF(good == n, "%zu of %zu corpus strings differ", n - good, n);
    }
    json_decref(corpus);
    json_decref(expected);

    /* the special tokens the template relies on */
    CHECK(squad_tokenizer_token_id(tok, "<|im_start|>") == 151644);
    CHECK(squad_tokenizer_token_id(tok, "<|im_end|>") == 151645);
    CHECK(squad_tokenizer_token_id(tok, "\xC4\xA0" "A") == 362); /* "ĠA" */
    CHECK(squad_tokenizer_token_id(tok, "no such token at all") == -1);
    CHECK(squad_tokenizer_vocab_size(tok) == 151669);

    /* SQUAD_TOK_PLAIN: special tokens stay text */
    squad_idvec v = {0};
    CHECK(squad_tokenize_append(tok, "<|im_end|>", 10, SQUAD_TOK_PLAIN, &v, &err) == 0);
    CHECK(v.n > 1);
    for (size_t i = 0; i < v.n; i++) CHECK(v.v[i] != 151645);
    squad_idvec_free(&v);

    /* find_added for template text */
    size_t s, e;
    int32_t id;
    CHECK(squad_tokenizer_find_added(tok, "ab<think>\n", 10, &s, &e, &id) == 1 && s == 2 && e == 9 && id == 151667);
    CHECK(squad_tokenizer_find_added(tok, "plain", 5, &s, &e, &id) == 0);

    /* the same text twice (the second time from the word cache) gives the same ids */
    const char *text = "Caching works: caching works, CACHING WORKS.";
    int32_t *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    CHECK(squad_tokenize(tok, text, strlen(text), &a, &na, &err) == 0);
    CHECK(squad_tokenize(tok, text, strlen(text), &b, &nb, &err) == 0);
    CHECK(na == nb && na > 0 && !memcmp(a, b, (size_t)na * sizeof(int32_t)));
    free(a);
    free(b);

    /* skip_special drops special tokens only */
    int32_t ids[] = {151644, 872, 151667, 151645};
    char *dec = NULL;
    CHECK(squad_detokenize(tok, ids, 4, 1, &dec, NULL, &err) == 0 && dec && !strcmp(dec, "user<think>"));
    free(dec);
    squad_tokenizer_free(tok);
}

static void test_variants(unsigned load_flags) {
    json_t *variants = read_jsonl(FIXTURES "variants.jsonl");
    CHECK(variants != NULL);
    size_t nv = json_array_size(variants), cases = 0, good = 0;
    for (size_t i = 0; i < nv; i++) {
        json_t *v = json_array_get(variants, i);
        const char *name = json_string_value(json_object_get(v, "name"));
        char *js = json_dumps(json_object_get(v, "tokenizer"), JSON_COMPACT);
        squad_err err = {0};
        squad_tokenizer *tok = js ? squad_tokenizer_load_buffer_ex(js, strlen(js), load_flags, &err) : NULL;
        free(js);
        CHECKF(tok != NULL, "variant '%s' does not load: %s", name, err.msg);
        if (!tok) continue;
        json_t *cs = json_object_get(v, "cases");
        for (size_t k = 0; k < json_array_size(cs); k++) {
            json_t *c = json_array_get(cs, k);
            json_t *text = json_object_get(c, "text"), *dec = json_object_get(c, "decoded");
            char label[160];
            snprintf(label, sizeof label, "variant '%s' case %zu", name, k);
            cases++;
            good += check_case(tok, json_string_value(text), json_string_length(text), json_object_get(c, "ids"),
                               json_string_value(dec), json_string_length(dec), label);
        }
        squad_tokenizer_free(tok);
    }
    printf("variants: %zu/%zu cases match in %zu synthetic tokenizers\n", good, cases, nv);
    CHECKF(good == cases && cases > 100, "%zu of %zu variant cases differ", cases - good, cases);
    json_decref(variants);
}

/* A minimal valid tokenizer.json with one field replaced by a JSON fragment, as text. */
static char *tokenizer_with(const char *key, const char *value_json) {
    const char *base =
        "{\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
        "\"use_regex\": true}, \"decoder\": {\"type\": \"ByteLevel\"}, \"added_tokens\": [], "
        "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}}";
    json_t *root = json_loads(base, 0, NULL);
    json_t *val = json_loads(value_json, JSON_DECODE_ANY, NULL);
    if (!root || !val) {
        json_decref(root);
        json_decref(val);
        return NULL;
    }
    if (!strncmp(key, "model.", 6)) json_object_set_new(json_object_get(root, "model"), key + 6, val);
    else json_object_set_new(root, key, val);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

/* Loading must fail with a message that contains want, the same through both loaders. */
static void expect_refused(const char *key, const char *value_json, const char *want) {
    char *js = tokenizer_with(key, value_json);
    CHECK(js != NULL);
    if (!js) return;
    squad_err err = {0}, err2 = {0};
    squad_tokenizer *tok = squad_tokenizer_load_buffer(js, strlen(js), &err);
    CHECKF(tok == NULL, "%s = %s was accepted", key, value_json);
    CHECKF(tok || strstr(err.msg, want), "%s = %s: message \"%s\" lacks \"%s\"", key, value_json, err.msg, want);
    CHECKF(tok || err.code < 0, "no error code");
    squad_tokenizer_free(tok);
    tok = squad_tokenizer_load_buffer_ex(js, strlen(js), SQUAD_TOK_LOAD_GENERIC, &err2);
    CHECKF(!tok && !strcmp(err.msg, err2.msg), "%s = %s: the loaders disagree: \"%s\" vs \"%s\"", key, value_json,
           err.msg, err2.msg);
    squad_tokenizer_free(tok);
    free(js);
}

/* The fast reader's strictness: unusual JSON in the big members goes to jansson and gives the same
 * result (escapes, surrogate pairs, "#version", duplicate keys, whitespace, numbers). */
static void test_fast_reader_fallbacks(void) {
    const char *docs[] = {
        "{\"model\": {\"vocab\": {\"a\": 0, \"\\u00e9\": 1, \"a\\u00e9\": 2, \"\\ud83d\\ude00\": 3}, "
        "\"merges\": [\"#version: 0.2\", \"a \\u00e9\"]}, \"pre_tokenizer\": null}",
        "{\"model\": {\"vocab\": {\"a\": 0, \"a\": 1}, \"merges\": []}}",                 /* duplicate key */
        "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"model\": {\"vocab\": {\"b\": 0}, \"merges\": []}}",
        "{\"model\": {\"vocab\": {\"a\": 1.0}, \"merges\": []}}",                           /* a real id */
        "{\"model\": {\"vocab\": {\"a\": 01}, \"merges\": []}}",                            /* a leading zero */
        "{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [[\"a\", \"b\"]]}}  ",
        "\n {\"model\" :{ \"merges\" : [ \"a b\" ] , \"vocab\" : { \"a\" : 0 , \"b\" : 1 , \"ab\" : 2 } } }\n",
        "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": null}}",
        "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}} trailing",
        "{\"model\": {\"vocab\": {\"\\u0000\": 0}, \"merges\": []}}",
        "{\"model\": {\"vocab\": {\"\\ud800\": 0}, \"merges\": []}}",
        "{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\", \"b a\"]}}",
        "{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"ba\": 3} , \"merges\": [ \"b a\" , \"a b\" ]}}",
        "{\"model\": {\"type\": \"BPG\", \"vocab\": {\"a\": 0, \"b\": 1\x01}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPG\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}",
    };
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        squad_err e1 = {0}, e2 = {0};
        squad_tokenizer *a = squad_tokenizer_load_buffer(docs[i], strlen(docs[i]), &e1);
        squad_tokenizer *b = squad_tokenizer_load_buffer_ex(docs[i], strlen(docs[i]), SQUAD_TOK_LOAD_GENERIC, &e2);
        CHECKF(!a == !b, "doc %zu: fast %s, jansson %s (%s / %s)", i, a ? "loads" : "fails", b ? "loads" : "fails", e1.msg,
               e2.msg);
        if (!a && !b) CHECKF(!strcmp(e1.msg, e2.msg), "doc %zu: \"%s\" vs \"%s\"", i, e1.msg, e2.msg);
        if (a && b) {
            CHECK(squad_tokenizer_vocab_size(a) == squad_tokenizer_vocab_size(b));
            const char *text = "ab\xC3\xA9 a\xC3\xA9\xF0\x9F\x98\x80";
            int32_t *ia = NULL, *ib = NULL;
            int na = 0, nb = 0;
            CHECK(squad_tokenize(a, text, strlen(text), &ia, &na, &e1) == 0);
            CHECK(squad_tokenize(b, text, strlen(text), &ib, &nb, &e2) == 0);
            CHECKF(na == nb && (!na || !memcmp(ia, ib, (size_t)na * 4)), "doc %zu: the loaders tokenise differently", i);
            free(ia);
            free(ib);
        }
        squad_tokenizer_free(a);
        squad_tokenizer_free(b);
    }
}

static void test_load_errors(void) {
    squad_err err = {0};
    squad_tokenizer *tok = squad_tokenizer_load_buffer("not json", 8, &err);
    CHECK(tok == NULL && strstr(err.msg, "not valid JSON"));
    tok = squad_tokenizer_load_buffer("[1,2]", 5, &err);
    CHECK(tok == NULL && strstr(err.msg, "top level"));
    tok = squad_tokenizer_load_buffer("{}", 2, &err);
    CHECK(tok == NULL && strstr(err.msg, "\"model\""));
    tok = squad_tokenizer_load("/nonexistent/tokenizer.json", &err);
    CHECK(tok == NULL && err.code == SQUAD_E_IO && strstr(err.msg, "/nonexistent/tokenizer.json"));

    /* the base itself loads and works */
    char *js = tokenizer_with("truncation", "null");
    tok = js ? squad_tokenizer_load_buffer(js, strlen(js), &err) : NULL;
    CHECKF(tok != NULL, "%s", err.msg);
    if (tok) {
        int32_t *ids = NULL;
        int n = 0;
        CHECK(squad_tokenize(tok, "ab", 2, &ids, &n, &err) == 0 && n == 1 && ids[0] == 2);
        free(ids);
        /* a character the vocabulary lacks (no unk, no fallback) is dropped, as Hugging Face does */
        CHECK(squad_tokenize(tok, "abc", 3, &ids, &n, &err) == 0 && n == 1 && ids[0] == 2);
        free(ids);
    }
    squad_tokenizer_free(tok);
    free(js);

    expect_refused("model.type", "\"Unigram\"", "model type 'Unigram' is not supported");
    expect_refused("model.type", "\"WordPiece\"", "not supported");
    expect_refused("model.vocab", "[1, 2]", "model.vocab must be an object");
    expect_refused("model.vocab", "{\"a\": -1}", "model.vocab");
    expect_refused("model.vocab", "{\"a\": \"zero\"}", "model.vocab");
    expect_refused("model.merges", "[\"a c\"]", "\"c\" is not in the vocabulary");
    expect_refused("model.merges", "[\"b a\"]", "merged token \"ba\" is not in the vocabulary");
    expect_refused("model.merges", "[\"a b c\"]", "two tokens separated by one space");
    expect_refused("model.merges", "[[\"a\"]]", "model.merges[0]");
    expect_refused("model.merges", "{\"a\": 1}", "model.merges must be an array");
    expect_refused("model.dropout", "0.1", "dropout");
    expect_refused("model.continuing_subword_prefix", "\"##\"", "continuing_subword_prefix");
    expect_refused("model.end_of_word_suffix", "\"</w>\"", "end_of_word_suffix");
    expect_refused("model.byte_fallback", "\"yes\"", "byte_fallback must be true or false");
    expect_refused("model.unk_token", "\"<unk>\"", "unk_token \"<unk>\" is not in the vocabulary");
    expect_refused("normalizer", "{\"type\": \"Lowercase\"}", "normalizer type 'Lowercase' is not supported");
    expect_refused("normalizer", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Strip\"}]}",
                   "'Strip' is not supported");
    expect_refused("normalizer", "\"NFC\"", "normalizer must be an object");
    expect_refused("pre_tokenizer", "{\"type\": \"Metaspace\"}", "pre_tokenizer type 'Metaspace' is not supported");
    expect_refused("pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(unclosed\"}, \"behavior\": \"Isolated\"}",
                   "does not compile");
    expect_refused("pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}",
                   "behavior 'Sideways' is not supported");
    expect_refused("pre_tokenizer", "{\"type\": \"Split\", \"pattern\": \"a\", \"behavior\": \"Isolated\"}", "pattern must be");
    expect_refused("pre_tokenizer",
                   "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, {\"type\": \"Split\", "
                   "\"pattern\": {\"String\": \" \"}, \"behavior\": \"Isolated\"}]}",
                   "ByteLevel must come last");
    expect_refused("decoder", "{\"type\": \"WordPiece\"}", "decoder type 'WordPiece' is not supported");
    expect_refused("added_tokens", "[{\"id\": 5}]", "added_tokens[0].content");
    expect_refused("added_tokens", "[{\"id\": -3, \"content\": \"x\"}]", "added_tokens[0].id");
    expect_refused("added_tokens", "[{\"id\": 9, \"content\": \"x\", \"special\": 1}]", "special must be true or false");
    expect_refused("added_tokens", "[{\"id\": 9000000, \"content\": \"x\"}]", "too sparse");
}

static void test_invalid_utf8(void) {
    squad_err err = {0};
    squad_tokenizer *tok = load_qwen(0);
    if (!tok) return;
    struct {
        const char *s;
        size_t len, offset;
    } cases[] = {
        {"abc\xff", 4, 3},           {"\x80", 1, 0},               {"ok \xc3", 4, 3},      /* truncated */
        {"\xc0\xaf", 2, 0},          {"x\xe0\x80\xaf", 4, 1},      /* overlong */
        {"hi \xed\xa0\x80!", 7, 3},  /* a surrogate */
        {"\xf4\x90\x80\x80", 4, 0},  /* above U+10FFFF */
        {"caf\xc3\xa9 \xe2\x82", 8, 6}, {"12345678901234567890\xfe", 21, 20},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        squad_idvec v = {0};
        squad_idvec_push(&v, 7, &err);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", cases[i].offset);
        int rc = squad_tokenize_append(tok, cases[i].s, cases[i].len, 0, &v, &err);
        CHECKF(rc == SQUAD_E_INVALID && strstr(err.msg, want), "case %zu: rc %d, \"%s\"", i, rc, err.msg);
        CHECKF(v.n == 1 && v.v[0] == 7, "case %zu: the output was changed on error", i);
        CHECK(squad_utf8_invalid_offset(cases[i].s, cases[i].len) == cases[i].offset);
        squad_idvec_free(&v);
    }
    CHECK(squad_utf8_invalid_offset("\xf0\x9f\x98\x80 ok", 7) == 7);
    CHECK(squad_utf8_invalid_offset("", 0) == 0);

    /* unknown ids do not decode; invalid byte sequences decode to U+FFFD */
    int32_t bad[] = {1, 999999};
    char *dec = NULL;
    CHECK(squad_detokenize(tok, bad, 2, 0, &dec, NULL, &err) == SQUAD_E_INVALID && strstr(err.msg, "999999"));
    int32_t half[] = {126}; /* "Â": the lone byte 0xC2 */
    size_t dlen = 0;
    CHECK(squad_detokenize(tok, half, 1, 0, &dec, &dlen, &err) == 0 && dlen == 3 && !strcmp(dec, "\xEF\xBF\xBD"));
    free(dec);
    squad_tokenizer_free(tok);
}

int main(void) {
    test_corpus(0);
    test_corpus(SQUAD_TOK_LOAD_GENERIC);
    test_variants(0);
    test_variants(SQUAD_TOK_LOAD_GENERIC);
    test_fast_reader_fallbacks();
    test_load_errors();
    test_invalid_utf8();
    return test_summary("test_tokenizer");
}
