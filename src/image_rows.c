/*
 * image_rows.c — a row's image runs: checks, M-RoPE positions and key tokens (image_rows.h).
 */
#include "image_rows.h"

#include <string.h>

#include "hash_index.h"
#include "image/decode.h"
#include "image/preprocess.h"
#include "util.h"

/* The seed of the key tokens' hash past the identity's words. */
#define IMAGE_KEY_SEED 0x6a09e667f3bcc909ull

static int merged_side(const squad_config *cfg, int patches) { return patches / cfg->vision.spatial_merge_size; }

/* One image against the model: pixels present, the grid its processor gives them, the tokens of
 * that grid. */
static int check_image(const squad_model *m, const squad_row_image *im, int k, squad_err *err) {
    const squad_config *cfg = &m->cfg;
    const int merge = cfg->vision.spatial_merge_size;
    if (!im->image || !im->image->rgb || im->image->width < 1 || im->image->height < 1)
        return squad_fail(err, SQUAD_E_INVALID, "images[%d] has no decoded pixels (squad_image_load fills them)", k);
    if (im->grid[0] != 1 || im->grid[1] < merge || im->grid[2] < merge || im->grid[1] % merge || im->grid[2] % merge)
        return squad_fail(err, SQUAD_E_INVALID, "images[%d]: grid %dx%dx%d is not one image of whole %dx%d windows", k,
                          im->grid[0], im->grid[1], im->grid[2], merge, merge);
    if (m->has_image_proc) {
        int grid[3];
        squad_err ge = {0};
        if (squad_image_grid(&m->image_proc, im->image->width, im->image->height, grid, &ge) ||
            memcmp(grid, im->grid, sizeof grid) != 0)
            return squad_fail(err, SQUAD_E_INVALID, "images[%d]: grid %dx%dx%d is not the one the model's processor "
                              "gives a %dx%d image", k, im->grid[0], im->grid[1], im->grid[2], im->image->width,
                              im->image->height);
    }
    const long long tokens = squad_vision_tokens(&cfg->vision, im->grid[0], im->grid[1], im->grid[2]);
    if (im->tokens != tokens)
        return squad_fail(err, SQUAD_E_INVALID, "images[%d]: %d tokens, but its grid %dx%dx%d makes %lld", k, im->tokens,
                          im->grid[0], im->grid[1], im->grid[2], tokens);
    return 0;
}

int squad_image_row_check(const squad_model *m, const squad_row *r, squad_err *err) {
    const squad_config *cfg = &m->cfg;
    if (r->n_images == 0 && !cfg->has_vision) return 0;
    if (r->n_images < 0 || (r->n_images > 0 && !r->images))
        return squad_fail(err, SQUAD_E_INVALID, "n_images %d without images", r->n_images);
    if (r->n_images > 0 && (!cfg->has_vision || !m->vision))
        return squad_fail(err, SQUAD_E_INVALID, "the row has %d images but this model has no vision tower", r->n_images);
    if (r->n_images > SQUAD_MAX_IMAGES_PER_ROW)
        return squad_fail(err, SQUAD_E_INVALID, "%d images; at most %d per row", r->n_images, SQUAD_MAX_IMAGES_PER_ROW);
    const int pad = cfg->image_token_id;
    int next = 0; /* the first index a run may start at */
    for (int k = 0; k < r->n_images; k++) {
        const squad_row_image *im = &r->images[k];
        int rc = check_image(m, im, k, err);
        if (rc) return rc;
        if (im->pos < next || im->pos > r->n_ids - im->tokens)
            return squad_fail(err, SQUAD_E_INVALID, "images[%d] at %d (%d tokens): %s", k, im->pos, im->tokens,
                              im->pos < next ? "images must ascend and not overlap" : "its run is outside the ids");
        for (int i = next; i < im->pos; i++)
            if (r->ids[i] == pad)
                return squad_fail(err, SQUAD_E_INVALID, "ids[%d] is <|image_pad|> (%d) outside every image's run", i, pad);
        for (int i = im->pos; i < im->pos + im->tokens; i++)
            if (r->ids[i] != pad)
                return squad_fail(err, SQUAD_E_INVALID, "images[%d]: ids[%d] = %d inside its run of %d <|image_pad|> (%d)",
                                  k, i, r->ids[i], im->tokens, pad);
        next = im->pos + im->tokens;
        if (next < r->n_ids && r->ids[next] == pad)
            return squad_fail(err, SQUAD_E_INVALID, "images[%d]: its run of <|image_pad|> is longer than its %d tokens",
                              k, im->tokens);
    }
    for (int i = next; i < r->n_ids; i++)
        if (r->ids[i] == pad)
            return squad_fail(err, SQUAD_E_INVALID, "ids[%d] is <|image_pad|> (%d) outside every image's run", i, pad);
    return 0;
}

int squad_image_row_tokens(const squad_row *r) {
    int n = 0;
    for (int k = 0; k < r->n_images; k++) n += r->images[k].tokens;
    return n;
}

int squad_image_row_tokens_before(const squad_row *r, int i) {
    int n = 0;
    for (int k = 0; k < r->n_images; k++) {
        const int in = i - r->images[k].pos;
        n += in <= 0 ? 0 : in < r->images[k].tokens ? in : r->images[k].tokens;
    }
    return n;
}

void squad_image_row_positions(const squad_config *cfg, const squad_row *r, int32_t *pos) {
    int i = 0, next = 0; /* the next index, and the position the next text token takes */
    for (int k = 0; k <= r->n_images; k++) {
        const int run = k < r->n_images ? r->images[k].pos : r->n_ids;
        for (; i < run; i++, next++) pos[3 * i] = pos[3 * i + 1] = pos[3 * i + 2] = next;
        if (k == r->n_images) break;
        const squad_row_image *im = &r->images[k];
        const int rows = merged_side(cfg, im->grid[1]), cols = merged_side(cfg, im->grid[2]);
        for (int j = 0; j < im->tokens; j++, i++) {
            pos[3 * i] = next;
            pos[3 * i + 1] = next + j / cols;
            pos[3 * i + 2] = next + j % cols;
        }
        next += rows > cols ? rows : cols;
    }
}

/* A negative key token from 31 bits. */
static int32_t key_token(uint32_t bits) { return -1 - (int32_t)(bits & 0x7fffffffu); }

/* Bit b of the identity (little-endian bit order over its bytes). */
static uint32_t identity_bits(const uint8_t id[16], int first, int n) {
    uint32_t v = 0;
    for (int b = 0; b < n && first + b < 128; b++) v |= (uint32_t)((id[(first + b) / 8] >> ((first + b) % 8)) & 1) << b;
    return v;
}

void squad_image_row_key_ids(const squad_row *r, int32_t *key) {
    memcpy(key, r->ids, (size_t)r->n_ids * sizeof *key);
    for (int k = 0; k < r->n_images; k++) {
        const squad_row_image *im = &r->images[k];
        const uint64_t h = squad_hash_bytes(IMAGE_KEY_SEED, im->identity, sizeof im->identity);
        for (int j = 0; j < im->tokens; j++) {
            const uint32_t bits = j < SQUAD_IMAGE_KEY_WORDS ? identity_bits(im->identity, 31 * j, 31)
                                                            : (uint32_t)squad_hash_mix(h + (uint64_t)j);
            key[im->pos + j] = key_token(bits);
        }
    }
}
