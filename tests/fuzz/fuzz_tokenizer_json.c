/*
 * fuzz_tokenizer_json.c — libFuzzer target: arbitrary bytes as a tokenizer.json.
 *
 * squad_tokenizer_load_buffer must either refuse the input with a message and an error code, or give
 * a tokenizer that encodes and decodes a few fixed texts without crashing, every id inside its
 * vocabulary. (Seeds: small synthetic tokenizer.json files in tests/fuzz/corpus/fuzz_tokenizer_json.)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static const char *const TEXTS[] = {
    "Hello world", "  it's I'LL  \n\n\tx", "caf\xC3\xA9 e\xCC\x81 \xE6\x97\xA5\xE6\x9C\xAC 12345", "<|s|> <think>a</think>",
    "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    squad_err err;
    err.code = 0;
    err.msg[0] = 0;
    squad_tokenizer *tok = squad_tokenizer_load_buffer((const char *)data, size, &err);
    if (!tok) {
        if (!err.msg[0] || err.code >= 0) __builtin_trap();
        return 0;
    }
    int vocab = squad_tokenizer_vocab_size(tok);
    if (vocab <= 0) __builtin_trap();
    for (size_t t = 0; t < sizeof TEXTS / sizeof TEXTS[0]; t++) {
        for (unsigned flags = 0; flags <= SQUAD_TOK_PLAIN; flags += SQUAD_TOK_PLAIN) {
            squad_idvec v = {0};
            if (squad_tokenize_append(tok, TEXTS[t], strlen(TEXTS[t]), flags, &v, &err) == 0) {
                for (size_t i = 0; i < v.n; i++)
                    if (v.v[i] < 0 || v.v[i] >= vocab) __builtin_trap();
                char *dec = NULL;
                if (squad_detokenize(tok, v.v, v.n, flags == 0, &dec, NULL, &err) < 0) __builtin_trap();
                free(dec);
            } else if (!err.msg[0]) {
                __builtin_trap(); /* a regex limit may stop a hostile pattern, but never silently */
            }
            squad_idvec_free(&v);
        }
    }
    squad_tokenizer_free(tok);
    return 0;
}
