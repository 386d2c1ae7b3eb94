/*
 * images.c — the server's image loader (images.h): text to bytes (image/data_url.h), bytes to a
 * row's image (squad_image_load), and the messages a client reads when it fails.
 */
#include "server/images.h"

#include <stdio.h>
#include <stdlib.h>

#include "image/data_url.h"
#include "util.h"

static int srv_image_load(void *ctx, const char *text, size_t len, squad_row_image *out, squad_err *err) {
    srv_images *si = ctx;
    uint8_t *bytes = NULL;
    size_t n = 0;
    int rc = squad_image_text_bytes(text, len, &bytes, &n, err);
    if (rc == 0) rc = squad_image_load(si->model, bytes, n, si->max_pixels, out, err);
    free(bytes);
    if (rc == SQUAD_E_UNSUPPORTED) { /* the model cannot take images at all: name it */
        char why[SQUAD_ERR_MSG];
        snprintf(why, sizeof why, "%s", err->msg);
        squad_fail(err, SQUAD_E_UNSUPPORTED, "the model \"%.200s\" takes no images (%.200s)", si->served_name, why);
    }
    if (rc < 0) {
        si->failed = 1;
        if (rc == SQUAD_E_NOMEM) si->out_of_memory = 1;
    }
    return rc;
}

static void srv_image_release(void *ctx, squad_row_image *image) {
    (void)ctx;
    squad_row_image_free(image);
}

squad_image_loader srv_images_loader(srv_images *ctx, const squad_model *model, const char *served_name,
                                     int64_t max_pixels) {
    *ctx = (srv_images){model, served_name, max_pixels, 0, 0};
    return (squad_image_loader){srv_image_load, srv_image_release, ctx};
}
