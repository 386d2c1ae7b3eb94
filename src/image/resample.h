/*
 * resample.h — antialiased bicubic resizing of 8-bit images, equal to the reference's.
 *
 * transformers 5.x resizes Qwen2-VL images with torchvision (resize(..., BICUBIC, antialias=True))
 * on the decoded uint8 tensor, which on the CPU runs PyTorch's native uint8 path: separable
 * passes (width first, then height; a pass whose size does not change is skipped), each output
 * sample a weighted sum of the input samples under a Keys cubic kernel (a = -0.5) stretched by the
 * downscaling factor, with the weights normalised, rounded to int16 fixed point at a precision set
 * by the largest weight, and the sums rounded and clamped back to uint8 after each pass. This file
 * is squad's own implementation of that arithmetic; with the same integers in, the same integers
 * come out (docs/images.md says how that was checked).
 *
 * The passes work on ranges of rows (a plan made once, then row ranges), so a caller can spread
 * them over threads and interleave them with its own per-row work (preprocess.c does both); every
 * output byte is the same whatever the split.
 */
#ifndef SQUAD_IMAGE_RESAMPLE_H
#define SQUAD_IMAGE_RESAMPLE_H

#include <stdint.h>

#include "squad.h"

/* One pass's taps: for each output index, the first input index, the number of inputs and their
 * int16 weights (ksize per index), all at one fixed-point precision. */
typedef struct squad_resample_taps {
    int ksize;
    int *first;
    int *count;
    int16_t *weights;
    unsigned precision;
} squad_resample_taps;

/* A resize of in_w x in_h to out_w x out_h: the taps of the passes that run (a side whose size does
 * not change has no pass). Read-only once made, so threads may share it. */
typedef struct squad_resample_plan {
    int in_w, in_h, out_w, out_h, channels;
    int horizontal, vertical; /* which passes run: width (first), height */
    squad_resample_taps th, tv;
} squad_resample_plan;

/* Sizes must be positive. Free with squad_resample_plan_free (also after a failure). */
int squad_resample_plan_init(squad_resample_plan *p, int in_w, int in_h, int channels, int out_w, int out_h,
                             squad_err *err);
void squad_resample_plan_free(squad_resample_plan *p);

/* The width pass on input rows [y0, y1): src is the whole in_w-wide image; dst receives those rows,
 * out_w pixels each, starting at its first byte. Needs p->horizontal. */
void squad_resample_rows_horizontal(const squad_resample_plan *p, const uint8_t *src, int y0, int y1, uint8_t *dst);
/* The height pass for output rows [y0, y1): rows is the whole out_w x in_h image it reads (the width
 * pass's output, or the source when the width does not change); dst receives those rows. Needs
 * p->vertical. */
void squad_resample_rows_vertical(const squad_resample_plan *p, const uint8_t *rows, int y0, int y1, uint8_t *dst);

/* Resizes src (in_h rows of in_w pixels of `channels` interleaved bytes) into dst (out_h rows of
 * out_w pixels, allocated by the caller), on the calling thread. Sizes must be positive. */
int squad_resample_bicubic_u8(const uint8_t *src, int in_w, int in_h, int channels, uint8_t *dst, int out_w, int out_h,
                              squad_err *err);

#endif /* SQUAD_IMAGE_RESAMPLE_H */
