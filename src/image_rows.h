/*
 * image_rows.h — what a row's images mean for its tokens (docs/images.md): the checks of a row's
 * image runs against the model, the M-RoPE positions of the row, and the "key tokens" the caches
 * see in place of each image's run.
 *
 * A row with images holds, for each image, a run of exactly `tokens` <|image_pad|> ids
 * (config.image_token_id) starting at images[k].pos; the runs ascend and no <|image_pad|> appears
 * outside them. Positions (transformers' get_rope_index for images, t = 1): text token i before
 * any image is at (i, i, i); an image's token at merged row r, column c is at (s, s + r, s + c),
 * s the position its run starts at; the text after the image continues at s + max(h, w) / merge.
 * A text-only row keeps position = index on every axis.
 *
 * Key tokens: the state cache and the scheduler compare rows by their ids. In a row's key view
 * each image's run is replaced by negative pseudo-tokens derived from its identity (real ids are
 * never negative), so a repeated screenshot keys and verifies like repeated text and another image
 * never matches: the first SQUAD_IMAGE_KEY_WORDS positions of the run carry the identity's 128
 * bits 31 at a time, every other position a 31-bit hash of the identity and its index. A
 * text-only row's key view is its ids, unchanged.
 */
#ifndef SQUAD_IMAGE_ROWS_H
#define SQUAD_IMAGE_ROWS_H

#include <stdint.h>

#include "model.h"
#include "squad.h"

/* Positions of a run that carry the identity's bits (31 a position: 5 cover 128 bits). */
#define SQUAD_IMAGE_KEY_WORDS 5

/* 0 when the row's images fit the model and its ids (nothing to check for a text-only row of a
 * model without a tower), else SQUAD_E_INVALID and why: no tower, more than
 * SQUAD_MAX_IMAGES_PER_ROW images, an image without pixels, a grid that is not the one the model's
 * processor gives the image, a token count that is not the grid's, runs out of order or outside
 * the ids, a run that is not exactly its image's <|image_pad|> ids, an <|image_pad|> outside every
 * run (a model with a tower only: a text-only model's rows are not checked for it). */
int squad_image_row_check(const squad_model *model, const squad_row *row, squad_err *err);

/* The row's image tokens (the sum of its images' token counts). */
int squad_image_row_tokens(const squad_row *row);

/* Image tokens of the row before index i (the row of the tower outputs token i would take). */
int squad_image_row_tokens_before(const squad_row *row, int i);

/* The M-RoPE positions of a checked row with images, [n_ids][3] (t, h, w) into pos. */
void squad_image_row_positions(const squad_config *cfg, const squad_row *row, int32_t *pos);

/* The row's key view into key[n_ids]: its ids with each image run replaced by the key tokens. */
void squad_image_row_key_ids(const squad_row *row, int32_t *key);

#endif /* SQUAD_IMAGE_ROWS_H */
