/*
 * vision_model.h — the weights of Qwen3.5's vision tower (transformers' Qwen3_5VisionModel, saved
 * under model.visual.*), bound by squad_vision_bind (declared in model.h) when the config has a
 * vision_config.
 *
 * Matrices stay bf16 ([rows][cols], y = W x, as the text model's); biases, LayerNorm weights and
 * the position table are fp32. The patch embedding's Conv3d weight [Hv, C, T, P, P] is the matrix
 * [Hv][C T P P]: its stride equals its kernel, so each patch's output is one dot product with the
 * processor's pixel_values row (laid out channel, frame, row, column: the same order).
 */
#ifndef SQUAD_VISION_MODEL_H
#define SQUAD_VISION_MODEL_H

#include "model.h"

/* The LayerNorm epsilon of every norm of the tower: transformers builds them with eps=1e-6 whatever
 * the config says. */
#define SQUAD_VISION_LN_EPS 1e-6f

typedef struct squad_vision_block {
    float *norm1_w, *norm1_b; /* [Hv] LayerNorm before attention */
    squad_mat qkv;            /* [3 Hv][Hv]: q, k, v, each heads x head_dim */
    float *qkv_b;             /* [3 Hv] */
    squad_mat proj;           /* [Hv][Hv] */
    float *proj_b;            /* [Hv] */
    float *norm2_w, *norm2_b; /* [Hv] LayerNorm before the MLP */
    squad_mat fc1;            /* [I][Hv] */
    float *fc1_b;             /* [I] */
    squad_mat fc2;            /* [Hv][I] */
    float *fc2_b;             /* [Hv] */
} squad_vision_block;

typedef struct squad_vision_weights {
    squad_mat patch;   /* [Hv][C T P P]: patch_embed.proj.weight */
    float *patch_b;    /* [Hv] */
    float *pos_embed;  /* [side * side][Hv]: the learned grid, row-major (row, column) */
    squad_vision_block *blocks; /* [depth] */
    float *merger_norm_w, *merger_norm_b; /* [Hv]: applied to each patch before the merge */
    squad_mat merger_fc1; /* [m m Hv][m m Hv] */
    float *merger_fc1_b;  /* [m m Hv] */
    squad_mat merger_fc2; /* [out][m m Hv] */
    float *merger_fc2_b;  /* [out] */
} squad_vision_weights;

#endif /* SQUAD_VISION_MODEL_H */
