/*
 * image_load.c — squad_image_load (squad.h): encoded image bytes to a row's image, with the model's
 * own image processor deciding its grid.
 *
 * Loading is cheap on purpose: decode (image/decode.h), the grid smart_resize gives the decoded
 * size (image/preprocess.h, no resampling), the token count t h w / merge^2, and the identity
 * (image/identity.h), a digest of the decoded pixels and the grid that the state cache, the memo
 * and the encoder cache key on. The pixel values and the vision tower wait until the engine runs a
 * chunk holding the image's tokens (a follow-up question about a cached screenshot never needs
 * them), so the decoded RGB image is kept in the struct for that moment.
 */
#include <stdlib.h>
#include <string.h>

#include "image/decode.h"
#include "image/identity.h"
#include "image/preprocess.h"
#include "model.h"
#include "util.h"

int squad_image_load(const squad_model *model, const uint8_t *bytes, size_t len, int64_t max_pixels,
                     squad_row_image *out, squad_err *err) {
    memset(out, 0, sizeof *out);
    if (!model || !model->cfg.has_vision || !model->vision)
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "this model has no vision tower");
    if (!model->has_image_proc)
        return squad_fail(err, SQUAD_E_UNSUPPORTED,
                          "this model has no image processor (preprocessor_config.json beside config.json)");
    if (!bytes || len == 0) return squad_fail(err, SQUAD_E_INVALID, "image: no bytes");
    squad_image *img = squad_calloc(1, sizeof *img, err);
    if (!img) return SQUAD_E_NOMEM;
    int rc = squad_image_decode(bytes, len, max_pixels > 0 ? max_pixels : SQUAD_IMAGE_DEFAULT_MAX_PIXELS, img, err);
    if (!rc) rc = squad_image_grid(&model->image_proc, img->width, img->height, out->grid, err);
    if (rc) {
        squad_image_free(img);
        free(img);
        memset(out, 0, sizeof *out);
        return rc == SQUAD_E_NOMEM ? rc : SQUAD_E_INVALID;
    }
    const long long tokens = squad_vision_tokens(&model->cfg.vision, out->grid[0], out->grid[1], out->grid[2]);
    if (tokens < 1 || tokens > model->cfg.max_position) {
        squad_fail(err, SQUAD_E_INVALID, "image: %dx%d gives %lld tokens; the model takes at most %d positions",
                   img->width, img->height, tokens, model->cfg.max_position);
        squad_image_free(img);
        free(img);
        memset(out, 0, sizeof *out);
        return SQUAD_E_INVALID;
    }
    out->tokens = (int)tokens;
    const squad_image_id id = squad_image_identity(img, out->grid);
    memcpy(out->identity, id.bytes, sizeof out->identity);
    out->image = img;
    return 0;
}

void squad_row_image_free(squad_row_image *image) {
    if (!image) return;
    squad_image *img = (squad_image *)image->image; /* owned by the struct squad_image_load filled */
    if (img) {
        squad_image_free(img);
        free(img);
    }
    memset(image, 0, sizeof *image);
}
