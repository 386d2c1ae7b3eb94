/*
 * template.h — the prompt template: a text request becomes rows (docs/design.md sections 5 and 6).
 *
 * A request is {"state": str, "questions": [{"text": str, "options": [str, ...]}, ...], "system": str?}.
 * Every row starts with the same prefix (the optional system part and the state), tokenised on its
 * own so its tokens never depend on the questions: its length is the row's state_len, the part the
 * engine's state cache shares. Then come the row's questions (one per row by default), each as its
 * question text, lettered options and answer cue; a question's answer slot is the last token of its
 * cue, its nopts the number of options, and every row's letters are the template's letter tokens
 * (each must be one token).
 *
 * Text that comes from the request (state, question, options, system) is always tokenised as plain
 * text: a "<|im_end|>" inside a web page stays text and cannot break the chat markup. Added tokens are
 * recognised only in the template's own strings.
 *
 * A request may also carry "images": [text, ...] (docs/images.md), each loaded through the caller's
 * image loader (image/loader.h: a file or a data: URL on the command line, a data: URL or base64 in
 * the server). Images are part of the state: the prefix part's {state} renders each image through
 * the "image" part, in the order given, then the state's text; the image part's {image} is the
 * image's run of <|image_pad|> ids (the id looked up in the tokenizer), and the row's
 * squad_row_image.pos says where it starts. A request without images gives exactly the ids it gave
 * before images existed.
 *
 * The default template (Qwen chat markup; README.md "Prompt template" documents it exactly) can be
 * overridden field by field with a squad-template.json in the model directory:
 *   system, prefix, question, option, cue, separator, image   strings with {placeholders}
 *   labels, letters                                    arrays of strings (what options show / the
 *                                                      answer tokens)
 *   questions_per_row                                  1..SQUAD_MAX_SLOTS_PER_ROW
 */
#ifndef SQUAD_TEMPLATE_H
#define SQUAD_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "image/loader.h"
#include "squad.h"
#include "tokenizer.h"

#define SQUAD_TEMPLATE_FILE "squad-template.json"
#define SQUAD_LABEL_MAX 16 /* bytes of a display label, with its NUL */

typedef struct squad_template squad_template;

/* The default template. */
squad_template *squad_template_default(squad_err *err);
/* A template from JSON text whose fields override the default's; unknown fields are errors. */
squad_template *squad_template_parse(const char *json, size_t len, squad_err *err);
/* The same from a file. */
squad_template *squad_template_load_file(const char *path, squad_err *err);
/* DIR/squad-template.json when it exists, else the default. */
squad_template *squad_template_load_dir(const char *model_dir, squad_err *err);
void squad_template_free(squad_template *tpl);

/* The rows of one request (owns every array the rows point to). */
typedef struct squad_text_rows {
    squad_row *rows;
    int n_rows;
    int n_questions;
    int *q_row;  /* [n_questions] the row of each question */
    int *q_slot; /* [n_questions] its slot index within that row */
    int state_len;
    int n_letters;
    int32_t letters[SQUAD_MAX_LETTERS];
    char labels[SQUAD_MAX_LETTERS][SQUAD_LABEL_MAX];
    /* the request's images, in its order (every row's images points here: they are in the state) */
    squad_row_image *images;
    int n_images;
    squad_image_loader image_loader; /* what loaded them, to release them */
    /* storage */
    int32_t **row_ids, **row_slots, **row_nopts;
} squad_text_rows;

/* Builds the rows of a request (JSON text). max_tokens > 0 bounds a row's length (the model's limit):
 * a state or a row longer than that is an error. Errors: SQUAD_E_INVALID for a bad request (the
 * message names the field), SQUAD_E_MODEL for a template that does not fit the tokenizer (a letter
 * that is not one token). On error *out is empty. */
int squad_template_build(const squad_template *tpl, squad_tokenizer *tok, const char *request, size_t len,
                         int max_tokens, squad_text_rows *out, squad_err *err);
/* The same for a request that may carry "images", loaded through images (NULL: a request with images
 * is refused). A failure of the loader is returned as it is, its message prefixed with the field
 * ("request.images[1]: PNG: ..."). */
int squad_template_build_images(const squad_template *tpl, squad_tokenizer *tok, const char *request, size_t len,
                                int max_tokens, const squad_image_loader *images, squad_text_rows *out,
                                squad_err *err);
void squad_text_rows_free(squad_text_rows *rows);

/* The template's letters as token ids (each must be one token); returns the count or an error. */
int squad_template_letters(const squad_template *tpl, squad_tokenizer *tok, int32_t *letters, squad_err *err);

#endif /* SQUAD_TEMPLATE_H */
