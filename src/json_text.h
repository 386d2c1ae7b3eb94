/*
 * json_text.h — a JSON value as the text Python's json.dumps(value, ensure_ascii=False) gives
 * (docs/decisions-api.md section E), so a state or an input_json part renders exactly as the
 * ecosystem's Python servers render it: keys in their order, ", " and ": " separators, non-ASCII
 * as itself, control characters escaped, integers as integers, reals in Python's repr. Also the
 * one reader of JSON requests (squad_json_read_object), which the text's writers and readers share.
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

/* squad's one way of reading a JSON request (every endpoint of the server, the command line's
 * request and row readers), so the same text is refused alike everywhere and in squad's words:
 * valid UTF-8; one JSON value and nothing after it; no key twice in an object; no NUL character
 * (\u0000) in a string (squad's texts are C strings); numbers that fit (integers in 64 bits, reals
 * finite); and an object at the top (the body null, an array, a string or a number is refused).
 * what names the text in messages ("the body", "the request", "a row"). The object, or NULL with
 * err filled (SQUAD_E_INVALID; SQUAD_E_NOMEM). */
json_t *squad_json_read_object(const char *text, size_t len, const char *what, squad_err *err);

/* "an object", "an array", "a string", "a number", "a boolean", "null": v's kind in messages. */
const char *squad_json_kind(const json_t *v);

#endif /* SQUAD_JSON_TEXT_H */
