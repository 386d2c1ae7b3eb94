/*
 * fuzz_image.c — libFuzzer target for the image module's entries: decoding (PNG, JPEG, WebP),
 * image text (data: URLs and base64), the processor configuration parser, and the processor and
 * identity on whatever decodes.
 *
 * The first byte picks the entry; the rest is its input. Every input must either fail with a
 * message or give a result whose invariants hold: an image within the pixel limit, patches whose
 * count matches the grid and whose values lie in [-1, 1] (mean and std 0.5), a configuration
 * within its bounds. The pixel limit is small (1 Mi pixels) and the processor's budget too, so an
 * input cannot spend the fuzzer's time on one huge image; the header check still sees every size.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image/data_url.h"
#include "image/decode.h"
#include "image/identity.h"
#include "image/preprocess.h"

#define FUZZ_MAX_PIXELS ((int64_t)1 << 20)

static const char *fuzz_config =
    "{\"size\": {\"longest_edge\": 16384, \"shortest_edge\": 1024}, \"patch_size\": 16,"
    " \"temporal_patch_size\": 2, \"merge_size\": 2, \"image_mean\": [0.5, 0.5, 0.5], \"image_std\": [0.5, 0.5, 0.5]}";

static void check_image_and_process(const squad_image *img) {
    if (img->width <= 0 || img->height <= 0 || !img->rgb) __builtin_trap();
    if ((int64_t)img->width * img->height > FUZZ_MAX_PIXELS) __builtin_trap();
    squad_image_proc_config c;
    if (squad_image_proc_config_parse(&c, fuzz_config, strlen(fuzz_config), NULL) != 0) __builtin_trap();
    squad_image_patches p;
    squad_err err;
    err.msg[0] = 0;
    if (squad_image_preprocess(&c, img, &p, &err) != 0) {
        if (!err.msg[0]) __builtin_trap();
        return; /* e.g. an aspect ratio over 200 */
    }
    const int factor = c.patch_size * c.merge_size;
    if (p.resized_width % factor || p.resized_height % factor) __builtin_trap();
    if (p.n_patches != (int64_t)p.grid[0] * p.grid[1] * p.grid[2]) __builtin_trap();
    if (p.n_tokens * c.merge_size * c.merge_size != p.n_patches) __builtin_trap();
    for (int64_t i = 0; i < p.n_patches * p.patch_dim; i++)
        if (!(p.pixel_values[i] >= -1.0f && p.pixel_values[i] <= 1.0f)) __builtin_trap();
    squad_image_id id = squad_image_identity(img, p.grid); /* reads every pixel */
    (void)squad_image_id_key(&id);
    squad_image_patches_free(&p);
}

static void fuzz_decode(const uint8_t *data, size_t size) {
    squad_image img;
    squad_err err;
    err.msg[0] = 0;
    if (squad_image_decode(data, size, FUZZ_MAX_PIXELS, &img, &err) == 0) {
        check_image_and_process(&img);
        squad_image_free(&img);
    } else if (!err.msg[0] || img.rgb) {
        __builtin_trap();
    }
}

static void fuzz_text(const uint8_t *data, size_t size) {
    uint8_t *bytes = NULL;
    size_t n = 0;
    squad_err err;
    err.msg[0] = 0;
    if (squad_image_text_bytes((const char *)data, size, &bytes, &n, &err) == 0) {
        if (!bytes || n == 0 || n > size) __builtin_trap();
        fuzz_decode(bytes, n);
        free(bytes);
    } else if (!err.msg[0] || bytes) {
        __builtin_trap();
    }
}

static void fuzz_config_text(const uint8_t *data, size_t size) {
    squad_image_proc_config c;
    squad_err err;
    err.msg[0] = 0;
    if (squad_image_proc_config_parse(&c, (const char *)data, size, &err) != 0) {
        if (!err.msg[0]) __builtin_trap();
        return;
    }
    if (c.patch_size <= 0 || c.merge_size <= 0 || c.temporal_patch_size <= 0) __builtin_trap();
    if (c.min_pixels <= 0 || c.max_pixels < c.min_pixels) __builtin_trap();
    for (int i = 0; i < 3; i++)
        if (c.image_std[i] == 0.0) __builtin_trap();
    static const int sizes[][2] = {{1, 1}, {1920, 1080}, {7, 1400}, {4000, 3000}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int grid[3];
        if (squad_image_grid(&c, sizes[i][0], sizes[i][1], grid, NULL) == 0) {
            if (grid[0] != 1 || grid[1] <= 0 || grid[2] <= 0) __builtin_trap();
            if (grid[1] % c.merge_size || grid[2] % c.merge_size) __builtin_trap();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    switch (data[0] % 3) {
    case 0: fuzz_decode(data + 1, size - 1); break;
    case 1: fuzz_text(data + 1, size - 1); break;
    default: fuzz_config_text(data + 1, size - 1); break;
    }
    return 0;
}
