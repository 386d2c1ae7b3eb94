/*
 * images.h — the server's image loader (image/loader.h) for the request parsers: an image comes as
 * text in the body, a data: URL or bare base64 (squad fetches nothing: a remote URL is refused), and
 * is decoded and sized by the model's own image processor (squad_image_load) under
 * --max-image-pixels, on the connection thread that parses the request.
 *
 * One srv_images per request: it remembers whether an image failed, so /v1/ask can tell a bad image
 * (400, as every API answers an image it cannot use) from a badly shaped request (422).
 */
#ifndef SQUAD_SERVER_IMAGES_H
#define SQUAD_SERVER_IMAGES_H

#include <stdint.h>

#include "image/loader.h"
#include "squad.h"

typedef struct srv_images {
    const squad_model *model;
    const char *served_name; /* named when the model takes no images */
    int64_t max_pixels;      /* --max-image-pixels (0: the decoder's default) */
    int failed;              /* an image could not be used (its message went to the parser) */
    int out_of_memory;
} srv_images;

/* A loader for one request's images (ctx: the request's own, srv_req.images, which outlives the
 * rows that hold them). */
squad_image_loader srv_images_loader(srv_images *ctx, const squad_model *model, const char *served_name,
                                     int64_t max_pixels);

#endif /* SQUAD_SERVER_IMAGES_H */
