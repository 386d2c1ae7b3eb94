/*
 * fuzz_tokenizer_json.c — libFuzzer target: arbitrary bytes as a tokenizer.json.
 *
 * squad_tokenizer_load_buffer must either refuse the input with a message and an error code, or give
 * a tokenizer that encodes and decodes a few fixed texts without crashing, every id inside its
 * vocabulary. It is also a differential test of the two loaders: the fast reader (model.vocab and
 * model.merges read straight from the text) and jansson for the whole file must agree on every input:
 * both refuse it with the same message, or both load it and encode the texts to the same ids.
 * (Seeds: small synthetic tokenizer.json files in tests/fuzz/corpus/fuzz_tokenizer_json.)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static const char *const TEXTS[] = {
    "Hello world", "  it's I'LL  \n\n\tx", "caf\xC3\xA9 e\xCC\x81 \xE6\x97\xA5\xE6\x9C\xAC 12345", "<|s|> <think>a</think>",
    "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "",
};

/* Encodes text with flags: 0 and the ids, or -1 (a regex limit may stop a hostile pattern). */
static int encode(squad_tokenizer *tok, const char *text, unsigned flags, squad_idvec *v) {
    squad_err err;
    err.msg[0] = 0;
    if (squad_tokenize_append(tok, text, strlen(text), flags, v, &err) == 0) return 0;
    if (!err.msg[0]) __builtin_trap(); /* never silently */
    return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    squad_err err, err2;
    err.code = err2.code = 0;
    err.msg[0] = err2.msg[0] = 0;
    squad_tokenizer *tok = squad_tokenizer_load_buffer((const char *)data, size, &err);
    squad_tokenizer *ref = squad_tokenizer_load_buffer_ex((const char *)data, size, SQUAD_TOK_LOAD_GENERIC, &err2);
    if (!tok != !ref) __builtin_trap(); /* the loaders disagree */
    if (!tok) {
        if (!err.msg[0] || err.code >= 0) __builtin_trap();
        if (strcmp(err.msg, err2.msg)) __builtin_trap();
        return 0;
    }
    int vocab = squad_tokenizer_vocab_size(tok);
    if (vocab <= 0 || vocab != squad_tokenizer_vocab_size(ref)) __builtin_trap();
    for (size_t t = 0; t < sizeof TEXTS / sizeof TEXTS[0]; t++) {
        for (unsigned flags = 0; flags <= SQUAD_TOK_PLAIN; flags += SQUAD_TOK_PLAIN) {
            squad_idvec v = {0}, w = {0};
            int r1 = encode(tok, TEXTS[t], flags, &v), r2 = encode(ref, TEXTS[t], flags, &w);
            if (r1 != r2 || v.n != w.n || (v.n && memcmp(v.v, w.v, v.n * sizeof(int32_t)))) __builtin_trap();
            if (r1 == 0) {
                for (size_t i = 0; i < v.n; i++)
                    if (v.v[i] < 0 || v.v[i] >= vocab) __builtin_trap();
                char *dec = NULL;
                if (squad_detokenize(tok, v.v, v.n, flags == 0, &dec, NULL, &err) < 0) __builtin_trap();
                free(dec);
            }
            squad_idvec_free(&v);
            squad_idvec_free(&w);
        }
    }
    squad_tokenizer_free(tok);
    squad_tokenizer_free(ref);
    return 0;
}
