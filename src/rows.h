/*
 * rows.h — rows from JSON (docs/design.md section 5): {"ids": [...], "slots": [...], "nopts": [...],
 * "letters": [...], "state_len": n, "specialist": "label", "images": ["a.png" or "data:..."]}. Parsing checks JSON
 * types and gives messages that name the field; the model-dependent checks (vocabulary, lengths) are
 * squad_row_check's.
 *
 * Images (docs/images.md): a row's JSON names its images (file paths or data: URLs; the caller
 * loads them) and its ids hold ONE <|image_pad|> per image, in order; once the images are loaded,
 * squad_row_expand_images replaces each of those ids by the image's run of `tokens` pads and moves
 * the slots and state_len after it accordingly.
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
    char **image_refs; /* the "images" strings (paths or data: URLs), n_image_refs of them; the
                        * caller loads them (squad_image_load) */
    int n_image_refs;
} squad_row_buf;

/* Parses one JSON line. "letters" may be absent when default_letters is given (the template's). */
int squad_row_parse_json(squad_row_buf *out, const char *text, size_t len, const int32_t *default_letters,
                         int n_default_letters, squad_err *err);
/* The same from a parsed JSON value (the server's {"rows": [...]} elements); root is borrowed. */
int squad_row_parse_value(squad_row_buf *out, json_t *root, const int32_t *default_letters, int n_default_letters,
                          squad_err *err);
void squad_row_buf_free(squad_row_buf *b);

/* The row's one <|image_pad|> (image_token_id) per image expanded to the images' runs: images[k]
 * (loaded, its tokens set) takes the k-th such id, its pos set to where its run starts; slots
 * after an image move by its tokens - 1, and so does state_len when it is past the image. The
 * row's ids, slots and images point into b and images afterwards. SQUAD_E_INVALID when the ids
 * do not hold exactly n_images such ids. */
int squad_row_expand_images(squad_row_buf *b, int image_token_id, squad_row_image *images, int n_images,
                            int max_tokens, squad_err *err);

/* Every "row too long" message has this phrase before its limit (the template's, the decision
 * APIs'), so the caller that chose the limit names it: squad_row_limit_name. */
#define SQUAD_ROW_TOO_LONG "; rows are at most "
/* When err is a "row too long" message, appends " (limit)": which limit it was ("--max-tokens",
 * "the model's positions", ...), since the number alone does not say. */
void squad_row_limit_name(squad_err *err, const char *limit);

#endif
