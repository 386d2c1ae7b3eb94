/*
 * fuzz_tokenizer.c — libFuzzer target: arbitrary bytes as text into the tokenizer.
 *
 * The tokenizer is loaded once from $SQUAD_FUZZ_TOKENIZER, else third_party/qwen3/tokenizer.json
 * (relative to the working directory, then to this source file's repository). For every input:
 * invalid UTF-8 must be refused with the offset squad_utf8_invalid_offset reports, and the valid
 * prefix before it is tokenised instead; valid text must tokenise with and without added-token
 * matching, every id must be inside the vocabulary, and decoding the plain encoding must give back
 * the NFC form of the text (byte-level tokenizers are lossless; set SQUAD_FUZZ_ROUNDTRIP=0 for a
 * tokenizer that is not).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "fuzz_tokenizer_path.h"
#include "tokenizer.h"
#include "utf8.h"

static squad_tokenizer *load_once(void) {
    static squad_tokenizer *tok; /* the harness's own state: one tokenizer for the whole run */
    if (tok) return tok;
    squad_err err = {0};
    tok = fuzz_load_tokenizer(&err);
    if (!tok) {
        fprintf(stderr, "fuzz_tokenizer: cannot load a tokenizer: %s (set SQUAD_FUZZ_TOKENIZER)\n", err.msg);
        abort();
    }
    return tok;
}

static void check_ids(squad_tokenizer *tok, const squad_idvec *v) {
    int vocab = squad_tokenizer_vocab_size(tok);
    for (size_t i = 0; i < v->n; i++)
        if (v->v[i] < 0 || v->v[i] >= vocab) __builtin_trap();
}

/* decode(encode_plain(text)) == NFC(text) */
static void check_round_trip(squad_tokenizer *tok, const uint8_t *text, size_t len, const squad_idvec *plain) {
    const char *rt = getenv("SQUAD_FUZZ_ROUNDTRIP");
    if (rt && !strcmp(rt, "0")) return;
    char *dec = NULL;
    size_t dlen = 0;
    squad_err err;
    if (squad_detokenize(tok, plain->v, plain->n, 0, &dec, &dlen, &err) < 0) __builtin_trap();
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t n = len ? utf8proc_map(text, (utf8proc_ssize_t)len, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE) : 0;
    if (n < 0) __builtin_trap();
    if ((size_t)n != dlen || (n && memcmp(nfc, dec, dlen))) __builtin_trap();
    free(nfc);
    free(dec);
}

static void run_valid(squad_tokenizer *tok, const uint8_t *data, size_t len) {
    squad_err err;
    squad_idvec v = {0}, p = {0};
    if (squad_tokenize_append(tok, (const char *)data, len, 0, &v, &err) < 0) __builtin_trap();
    check_ids(tok, &v);
    if (squad_tokenize_append(tok, (const char *)data, len, SQUAD_TOK_PLAIN, &p, &err) < 0) __builtin_trap();
    check_ids(tok, &p);
    check_round_trip(tok, data, len, &p);
    char *dec = NULL;
    if (squad_detokenize(tok, v.v, v.n, 1, &dec, NULL, &err) < 0) __builtin_trap();
    free(dec);
    squad_idvec_free(&v);
    squad_idvec_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    squad_tokenizer *tok = load_once();
    size_t bad = squad_utf8_invalid_offset((const char *)data, size);
    if (bad < size) {
        squad_err err;
        squad_idvec v = {0};
        char want[48];
        snprintf(want, sizeof want, "byte offset %zu", bad);
        if (squad_tokenize_append(tok, (const char *)data, size, 0, &v, &err) != SQUAD_E_INVALID) __builtin_trap();
        if (!strstr(err.msg, want) || v.n != 0) __builtin_trap();
        squad_idvec_free(&v);
        size = bad; /* the valid prefix still gets tokenised */
    }
    run_valid(tok, data, size);
    return 0;
}
