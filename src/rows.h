/*
 * rows.h — rows from JSON (docs/design.md section 5): {"ids": [...], "slots": [...], "nopts": [...],
 * "letters": [...], "state_len": n, "specialist": "label"}. Parsing checks JSON types and gives messages that name the
 * field; the model-dependent checks (vocabulary, lengths) are squad_row_check's.
 */
#ifndef SQUAD_ROWS_H
#define SQUAD_ROWS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "squad.h"

/* A row that owns its arrays. */
typedef struct squad_row_buf {
    squad_row row; /* points into the arrays below */
    int32_t *ids, *slots, *nopts, *letters;
    char *specialist; /* the "specialist" label the row forces; NULL when absent or "auto" (the
                       * caller maps it to row.specialist with the engine's specialists) */
} squad_row_buf;

/* Parses one JSON line. "letters" may be absent when default_letters is given (the template's). */
int squad_row_parse_json(squad_row_buf *out, const char *text, size_t len, const int32_t *default_letters,
                         int n_default_letters, squad_err *err);
/* The same from a parsed JSON value (the server's {"rows": [...]} elements); root is borrowed. */
int squad_row_parse_value(squad_row_buf *out, json_t *root, const int32_t *default_letters, int n_default_letters,
                          squad_err *err);
void squad_row_buf_free(squad_row_buf *b);

/* Every "row too long" message has this phrase before its limit (the template's, the decision
 * APIs'), so the caller that chose the limit names it: squad_row_limit_name. */
#define SQUAD_ROW_TOO_LONG "; rows are at most "
/* When err is a "row too long" message, appends " (limit)": which limit it was ("--max-tokens",
 * "the model's positions", ...), since the number alone does not say. */
void squad_row_limit_name(squad_err *err, const char *limit);

#endif
