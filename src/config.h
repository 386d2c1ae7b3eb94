/*
 * config.h — the model configuration read from a Hugging Face config.json.
 *
 * Fields are taken from the top level or from "text_config" (Qwen3_5ForConditionalGeneration).
 * layer_types is honoured exactly as given; no layer pattern is ever assumed. Every missing or
 * inconsistent field is an error that names it.
 */
#ifndef SQUAD_CONFIG_H
#define SQUAD_CONFIG_H

#include <stddef.h>

#include "squad.h"

enum { SQUAD_LAYER_LINEAR = 0, SQUAD_LAYER_FULL = 1 };

#define SQUAD_MAX_LAYERS 256

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
    int layer_types[SQUAD_MAX_LAYERS]; /* SQUAD_LAYER_LINEAR / SQUAD_LAYER_FULL */
} squad_config;

/* Parses config.json text (len bytes, need not be NUL-terminated). */
int squad_config_parse(squad_config *cfg, const char *text, size_t len, squad_err *err);
/* Reads and parses a config.json file. */
int squad_config_load(squad_config *cfg, const char *path, squad_err *err);

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
