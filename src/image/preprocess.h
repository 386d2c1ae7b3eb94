/*
 * preprocess.h — the Qwen2-VL image processor that Qwen3.5 checkpoints name
 * (image_processor_type Qwen2VLImageProcessorFast; in transformers 5.x the default,
 * torchvision-backed Qwen2VLImageProcessor), from decoded RGB to the vision tower's input.
 *
 * The steps, as transformers runs them:
 *  1. smart_resize: each side rounded (half to even) to a multiple of factor = patch_size x
 *     merge_size; when the area leaves [min_pixels, max_pixels], both sides are scaled by
 *     sqrt(area ratio) and floored (too large, at least one factor) or ceiled (too small) to
 *     multiples of factor. An aspect ratio over 200 is an error.
 *  2. Antialiased bicubic resize of the uint8 image to that size (resample.h).
 *  3. Rescale by rescale_factor and normalise by image_mean / image_std, fused as the reference
 *     fuses them: (x - mean / rescale) / (std / rescale) in float32.
 *  4. The frame repeated to temporal_patch_size frames, then cut into patches in the processor's
 *     order: rows are patches grouped by merge window (t, block row, block column, row within
 *     the window, column within the window); a row holds channel, frame, pixel row, pixel column.
 *     The grid (t, h, w) counts patches; merged tokens are t x h x w / merge_size^2.
 *
 * The configuration comes from preprocessor_config.json and is read as transformers 5.x reads it:
 * the class defaults (patch 14, min 56*56, max 28*28*1280, CLIP mean / std, rescale 1/255) overridden
 * by the file's keys; "size" {"shortest_edge", "longest_edge"} gives min / max pixels, and
 * top-level "min_pixels" / "max_pixels" override those.
 */
#ifndef SQUAD_IMAGE_PREPROCESS_H
#define SQUAD_IMAGE_PREPROCESS_H

#include <stddef.h>
#include <stdint.h>

#include "image/decode.h"
#include "squad.h"

/* The largest aspect ratio smart_resize accepts (transformers raises past it). */
#define SQUAD_IMAGE_MAX_ASPECT 200

typedef struct squad_image_proc_config {
    int patch_size;          /* pixels per patch side */
    int temporal_patch_size; /* frames per patch */
    int merge_size;          /* patches per merged token side */
    int64_t min_pixels;      /* size.shortest_edge */
    int64_t max_pixels;      /* size.longest_edge */
    double image_mean[3];
    double image_std[3];
    double rescale_factor;
    int do_resize, do_rescale, do_normalize;
} squad_image_proc_config;

/* transformers' Qwen2VLImageProcessor class defaults (what a config without a key gets). */
void squad_image_proc_config_default(squad_image_proc_config *c);
/* Parses preprocessor_config.json text (or processor_config.json, whose "image_processor" object
 * holds the same keys). Every bad value is an error naming its key. */
int squad_image_proc_config_parse(squad_image_proc_config *c, const char *json, size_t len, squad_err *err);
/* Reads and parses a file. */
int squad_image_proc_config_load(squad_image_proc_config *c, const char *path, squad_err *err);

/* transformers' smart_resize for a height x width image: *out_h x *out_w. */
int squad_image_smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels, int *out_h,
                             int *out_w, squad_err *err);

/* The grid (t, h, w) in patches an image of width x height gets, without processing it. */
int squad_image_grid(const squad_image_proc_config *c, int width, int height, int grid[3], squad_err *err);

typedef struct squad_image_patches {
    int grid[3];          /* t, h, w in patches */
    int resized_width, resized_height;
    int64_t n_patches;    /* grid t x h x w: rows of pixel_values */
    int patch_dim;        /* channels x temporal_patch_size x patch_size^2: columns */
    int64_t n_tokens;     /* n_patches / merge_size^2: the image's <|image_pad|> count */
    float *pixel_values;  /* [n_patches][patch_dim] */
} squad_image_patches;

/* The most threads squad_image_preprocess_threads uses (memory bandwidth, not cores, bounds it). */
#define SQUAD_IMAGE_MAX_THREADS 16

/* Runs the processor on a decoded image with up to `threads` threads (0 or less: the online cores;
 * at most SQUAD_IMAGE_MAX_THREADS, and fewer for a small image), started and joined inside the
 * call; a thread the system refuses is no error (the others do its part). The values do not depend
 * on the number of threads. out is zeroed first; free with squad_image_patches_free. */
int squad_image_preprocess_threads(const squad_image_proc_config *c, const squad_image *img, int threads,
                                   squad_image_patches *out, squad_err *err);
/* squad_image_preprocess_threads with threads 0. */
int squad_image_preprocess(const squad_image_proc_config *c, const squad_image *img, squad_image_patches *out,
                           squad_err *err);
void squad_image_patches_free(squad_image_patches *p);

#endif /* SQUAD_IMAGE_PREPROCESS_H */
