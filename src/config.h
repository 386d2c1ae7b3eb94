/*
 * config.h — the model configuration read from a Hugging Face config.json.
 *
 * Fields are taken from the top level or from "text_config" (Qwen3_5ForConditionalGeneration).
 * layer_types is honoured exactly as given; no layer pattern is ever assumed. Every missing or
 * inconsistent field is an error that names it.
 *
 * A config with a "vision_config" object (Qwen3_5ForConditionalGeneration with its vision tower)
 * also fills `vision` and sets has_vision, with the image token ids from the top level; a config
 * without one loads exactly as a text-only model.
 */
#ifndef SQUAD_CONFIG_H
#define SQUAD_CONFIG_H

#include <stddef.h>

#include "squad.h"

enum { SQUAD_LAYER_LINEAR = 0, SQUAD_LAYER_FULL = 1 };

#define SQUAD_MAX_LAYERS 256

/* The vision tower's MLP activation (vision_config.hidden_act). */
enum { SQUAD_VISION_ACT_GELU_TANH = 0, SQUAD_VISION_ACT_GELU_ERF = 1 };

/* The vision tower (transformers' Qwen3_5VisionConfig); every size from config.json. */
typedef struct squad_vision_config {
    int depth;                   /* blocks */
    int hidden_size;             /* Hv */
    int num_heads;               /* heads of each block's attention; head_dim = Hv / num_heads */
    int head_dim;                /* derived, a multiple of 4 (the 2D rotary splits it over rows and columns) */
    int intermediate_size;       /* each block's MLP width */
    int hidden_act;              /* SQUAD_VISION_ACT_* */
    int patch_size;              /* P: a patch is P x P pixels */
    int temporal_patch_size;     /* frames per patch (an image repeats its one frame) */
    int spatial_merge_size;      /* m: the merger joins m x m patches into one token */
    int in_channels;             /* C (3) */
    int num_position_embeddings; /* a square: the learned position grid is side x side */
    int position_grid_side;      /* derived: sqrt(num_position_embeddings) */
    int out_hidden_size;         /* the merger's output: the text model's hidden size */
    double rope_theta;           /* the 2D rotary's base (rope_parameters.rope_theta) */
} squad_vision_config;

#define SQUAD_VISION_DEFAULT_ROPE_THETA 10000.0

/* transformers' Qwen3_5Config defaults for the image token ids (used when config.json omits them). */
#define SQUAD_DEFAULT_IMAGE_TOKEN_ID 248056
#define SQUAD_DEFAULT_VISION_START_TOKEN_ID 248053
#define SQUAD_DEFAULT_VISION_END_TOKEN_ID 248054

typedef struct squad_config {
    int hidden_size;       /* H */
    int num_layers;
    int intermediate_size; /* MLP width */
    int num_heads;         /* nh: full-attention query heads */
    int num_kv_heads;      /* nkv */
    int head_dim;          /* hd */
    int lin_num_k_heads;   /* nk */
    int lin_num_v_heads;   /* nv */
    int lin_k_dim;         /* dk */
    int lin_v_dim;         /* dv */
    int conv_kernel;       /* K */
    int vocab_size;
    float rms_eps;
    double rope_theta;
    double partial_rotary_factor;
    int rotary_dim; /* rd = hd * factor, even */
    int tie_embeddings;
    int max_position; /* max_position_embeddings, or a default */
    int nested;       /* 1 when the fields came from text_config */
    /* M-RoPE: how the rotary's rotary_dim / 2 frequencies split over the (t, h, w) position axes
     * (rope_parameters.mrope_section; transformers' default [11, 11, 10] when absent) and whether
     * they interleave (t h w t h w ...) rather than follow each other. For text-only rows all three
     * axes are equal and this is plain RoPE. */
    int mrope_section[3];
    int mrope_interleaved;
    int has_vision; /* 1 when config.json has a vision_config: the fields below are set */
    squad_vision_config vision;
    int image_token_id;        /* <|image_pad|>: one per merged patch */
    int vision_start_token_id; /* <|vision_start|> */
    int vision_end_token_id;   /* <|vision_end|> */
    int layer_types[SQUAD_MAX_LAYERS]; /* SQUAD_LAYER_LINEAR / SQUAD_LAYER_FULL */
} squad_config;

/* Parses config.json text (len bytes, need not be NUL-terminated). */
int squad_config_parse(squad_config *cfg, const char *text, size_t len, squad_err *err);
/* Reads and parses a config.json file. */
int squad_config_load(squad_config *cfg, const char *path, squad_err *err);

/* Merged tokens of an image of grid (t, h, w) patches: t * (h / m) * (w / m). */
static inline long long squad_vision_tokens(const squad_vision_config *v, int t, int h, int w) {
    int m = v->spatial_merge_size;
    return (long long)t * (h / m) * (w / m);
}

/* Derived sizes. */
static inline int squad_config_gdn_channels(const squad_config *c) { /* conv channels */
    return 2 * c->lin_num_k_heads * c->lin_k_dim + c->lin_num_v_heads * c->lin_v_dim;
}
static inline int squad_config_count_layers(const squad_config *c, int kind) {
    int n = 0;
    for (int i = 0; i < c->num_layers; i++) n += c->layer_types[i] == kind;
    return n;
}

#endif /* SQUAD_CONFIG_H */
