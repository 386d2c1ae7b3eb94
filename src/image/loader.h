/*
 * loader.h — how the request parsers (template.c for `squad ask` / `/v1/ask`, decisions.c for
 * `/v1/decisions`) obtain a request's images without knowing where they come from.
 *
 * A request names an image by text: a file path or a data: URL on the command line, a data: URL or
 * bare base64 in the HTTP APIs. What that text may be, the pixel limit, and the model whose image
 * processor gives the grid are the caller's (the CLI's or the server's); the parser only needs each
 * image's token count to place its markup, and owns the loaded images until the request's rows are
 * freed. So the caller passes a loader: load turns a text into a squad_row_image (its pos left for
 * the parser to fill), release frees one. A parser given no loader refuses images.
 *
 * Design: a pair of callbacks rather than a call to squad_image_load keeps the parsers below the
 * engine (they never touch a model) and lets their tests place images of any token count without
 * a vision tower.
 */
#ifndef SQUAD_IMAGE_LOADER_H
#define SQUAD_IMAGE_LOADER_H

#include <stddef.h>

#include "squad.h"

typedef struct squad_image_loader {
    /* The image the text names (len bytes, as the request gave it): 0 and *out filled (zeroed
     * first by the caller), or a negative code with a one-line message in err that the parser
     * prefixes with the field's path. */
    int (*load)(void *ctx, const char *text, size_t len, squad_row_image *out, squad_err *err);
    /* Frees what load filled (called once per image load succeeded on). */
    void (*release)(void *ctx, squad_row_image *image);
    void *ctx;
} squad_image_loader;

/* The text of the token that stands for one merged patch of an image (Qwen2-VL onwards); its id
 * is looked up in the tokenizer, never assumed. */
#define SQUAD_IMAGE_PAD_TOKEN "<|image_pad|>"
/* The markup around an image's pad run in Qwen's chat templates. */
#define SQUAD_VISION_START_TOKEN "<|vision_start|>"
#define SQUAD_VISION_END_TOKEN "<|vision_end|>"

#endif /* SQUAD_IMAGE_LOADER_H */
