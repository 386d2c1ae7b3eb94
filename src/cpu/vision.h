/*
 * vision.h — Qwen3.5's vision tower on the CPU: one image's pixel_values in, its merged tokens out.
 *
 *   pixel_values [t h w][C T P P]  (the processor's rows, merge-window order: src/image/preprocess.h)
 *   -> patch embedding (a GEMM with the Conv3d weight) + the learned position grid, bilinearly
 *      interpolated to (h, w)
 *   -> depth x [LayerNorm, qkv, 2D rotary (row, column), non-causal attention over each frame's
 *      patches, proj, residual; LayerNorm, fc1, GELU (tanh), fc2, residual]
 *   -> merger: LayerNorm per patch, m x m patches side by side, fc1, GELU (erf), fc2
 *   -> out [t (h/m) (w/m)][out_hidden_size]: one row per <|image_pad|> token, in token order.
 *
 * The math is transformers 5.x's Qwen3_5VisionModel (its fp32 forward); the GEMMs are the CPU
 * backend's (cpu_gemm_bf16: EXACT fp32 products, or FAST bf16), the attention is spread over the
 * pool by (frame, head, query block). Every output element is computed by one task in a fixed
 * order, so the result does not depend on the number of threads.
 */
#ifndef SQUAD_CPU_VISION_H
#define SQUAD_CPU_VISION_H

#include "cpu/gemm.h"
#include "cpu/pool.h"
#include "model.h"

/* The most patches one image may have (a 16384 x 16384 image at patch 16): keeps every buffer size
 * far inside size_t and int arithmetic. */
#define CPU_VISION_MAX_PATCHES (1 << 20)
/* The largest attention head the tower runs (Qwen3.5's is 64). */
#define CPU_VISION_MAX_HEAD_DIM 512

/* 0 when (t, h, w) is a grid the tower takes (h and w positive multiples of the merge size, at
 * most CPU_VISION_MAX_PATCHES patches), else SQUAD_E_INVALID with a message. */
int cpu_vision_check_grid(const squad_vision_config *v, int t, int h, int w, squad_err *err);

/* Runs the tower of m (m->vision must be bound) on one image: pixel_values has t h w rows of
 * C T P P floats as m's vision_config sizes them (the caller checks that the image processor's
 * patch, temporal and merge sizes are the tower's). out holds
 * t * (h / m) * (w / m) * out_hidden_size floats. 0, SQUAD_E_INVALID (grid; no tower),
 * SQUAD_E_UNSUPPORTED (a head dim over CPU_VISION_MAX_HEAD_DIM) or SQUAD_E_NOMEM. Uses the pool
 * (and its GEMM scratch): not at the same time as another call on the same pool. */
int cpu_vision_forward(cpu_pool *pool, cpu_gemm_precision prec, const squad_model *m, const float *pixel_values,
                       int t, int h, int w, float *out, squad_err *err);

/* The pieces, for tests:
 *  - the position grid table [side * side][Hv] interpolated to (t, h, w): out [t h w][Hv] in
 *    patch (merge-window) order, as transformers' fast_pos_embed_interpolate;
 *  - the 2D rotary's cos / sin per patch of one frame: [h w][head_dim] each, in patch order. */
void cpu_vision_pos_embed(const squad_vision_config *v, const float *table, int t, int h, int w, float *out);
void cpu_vision_rotary(const squad_vision_config *v, int h, int w, float *cos_out, float *sin_out);

#endif /* SQUAD_CPU_VISION_H */
