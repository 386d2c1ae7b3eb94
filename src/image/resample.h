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
 */
#ifndef SQUAD_IMAGE_RESAMPLE_H
#define SQUAD_IMAGE_RESAMPLE_H

#include <stdint.h>

#include "squad.h"

/* Resizes src (in_h rows of in_w pixels of `channels` interleaved bytes) into dst (out_h rows of
 * out_w pixels, allocated by the caller). Sizes must be positive. */
int squad_resample_bicubic_u8(const uint8_t *src, int in_w, int in_h, int channels, uint8_t *dst, int out_w, int out_h,
                              squad_err *err);

#endif /* SQUAD_IMAGE_RESAMPLE_H */
