/*
 * json_text.h — a JSON value as the text Python's json.dumps(value, ensure_ascii=False) gives
 * (docs/decisions-api.md section E), so a state or an input_json part renders exactly as the
 * ecosystem's Python servers render it: keys in their order, ", " and ": " separators, non-ASCII
 * as itself, control characters escaped, integers as integers, reals in Python's repr.
 */
#ifndef SQUAD_JSON_TEXT_H
#define SQUAD_JSON_TEXT_H

#include <jansson.h>
#include <stddef.h>

#include "squad.h"

/* The text of v (malloc'd, NUL-terminated; its length in *len when len is not NULL). NULL with err
 * filled when out of memory or when v holds a NaN or an infinity (which JSON cannot carry). */
char *squad_json_text(const json_t *v, size_t *len, squad_err *err);

/* A double as Python's repr(float) writes it ("0.1", "1e+16", "1.5e-07", "100.0", "-0.0") into buf
 * (at least 32 bytes); returns the length. Finite values only. */
int squad_json_real_text(double d, char *buf, size_t cap);

#endif /* SQUAD_JSON_TEXT_H */
