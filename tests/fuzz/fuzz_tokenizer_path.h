/*
 * fuzz_tokenizer_path.h — the tokenizer the fuzz targets load: $SQUAD_FUZZ_TOKENIZER, else
 * third_party/qwen3/tokenizer.json relative to the working directory, then to the repository this
 * header sits in (found from its own __FILE__, so a fuzzer runs from any directory).
 */
#ifndef SQUAD_FUZZ_TOKENIZER_PATH_H
#define SQUAD_FUZZ_TOKENIZER_PATH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

#define FUZZ_TOKENIZER_REL "third_party/qwen3/tokenizer.json"

static squad_tokenizer *fuzz_load_tokenizer(squad_err *err) {
    const char *env = getenv("SQUAD_FUZZ_TOKENIZER");
    if (env) return squad_tokenizer_load(env, err);
    squad_tokenizer *tok = squad_tokenizer_load(FUZZ_TOKENIZER_REL, err);
    if (tok) return tok;
    char path[4096];
    snprintf(path, sizeof path, "%s", __FILE__);
    char *cut = strstr(path, "tests/fuzz/fuzz_tokenizer_path.h");
    if (!cut) return NULL;
    snprintf(cut, sizeof path - (size_t)(cut - path), "%s", FUZZ_TOKENIZER_REL);
    return squad_tokenizer_load(path, err);
}

#endif
