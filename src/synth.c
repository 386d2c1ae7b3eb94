/*
 * synth.c — deterministic random Qwen3.5 checkpoints in the Hugging Face layout (see synth.h).
 *
 * Design:
 *  - A preset is a row of PRESETS: the text-model sizes and the layer pattern. Its squad_config is
 *    built from that row; config.json is written from the squad_config and parsed back with
 *    squad_config_parse before anything else is written, so a synthesized model always loads.
 *  - The plan lists the tensors (Hugging Face names for the chosen layout, shapes, how values are
 *    drawn), sorted by name as transformers' save_pretrained orders them.
 *  - Values: each tensor has its own splitmix64 stream keyed by the seed and the tensor's name
 *    inside the text model (the layout prefix removed), so a tensor does not depend on the others
 *    or on the layout. Per element one 64-bit draw gives four 16-bit uniforms whose sum is a cheap
 *    bell-shaped (Irwin-Hall) variate. Scales follow tools/make_fixtures.py so forward passes
 *    are neither saturated nor uniform: matrices N(0, 1/fan_in), zero-centred norms N(0, 0.2), the
 *    GDN gated-norm weight 1 + N(0, 0.2), exp(A_log) log-uniform in [0.5, 8], dt_bias and conv
 *    weights N(0, 0.5), the output embedding N(0, (f / sqrt(H))^2) with a per-preset factor f.
 *    Values are rounded to bf16 first, so F16 / F32 checkpoints (for tests) hold the same numbers.
 *  - Writing streams blocks of elements through st_writer; memory stays a few MB whatever the size.
 *  - A vision tower (tiny-vl; qwen3.5-0.8b with opts.vision) adds model.visual.* in transformers'
 *    names, keyed by their full names; Conv3d and linear weights N(0, 1/fan_in), LayerNorm weights
 *    1 + N(0, 0.2), biases N(0, 0.1), the position table N(0, 0.5). The image token ids come from the
 *    tokenizer by content (<|image_pad|>, <|vision_start|>, <|vision_end|>), else Qwen3.5's ids, and
 *    the vocabulary grows to cover them. A preprocessor_config.json (Qwen2VLImageProcessorFast with
 *    the tower's patch / merge sizes) makes the directory usable by transformers' AutoProcessor.
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include "synth.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

/* ---------------------------------------------------------------------------------------------
 * Presets
 */

/* A vision tower's shape (transformers' Qwen3_5VisionConfig fields; out_hidden_size is the text
 * hidden size) and the image processor's pixel bounds for it. */
typedef struct synth_tower {
    int depth, hidden, heads, intermediate;
    int patch, temporal, merge, channels, positions;
    long min_pixels, max_pixels; /* preprocessor_config.json size.shortest_edge / longest_edge */
} synth_tower;

/* tiny-vl's tower: a 4 x 4 position grid, so any image larger than 4 x 4 patches interpolates;
 * pixel bounds that keep a 64 x 64 image at 4 x 4 patches and any image at most 8 x 8. */
static const synth_tower TOWER_TINY = {2, 32, 2, 64, 16, 2, 2, 3, 16, 1024, 16384};
/* The 0.8B's tower (its config.json and preprocessor_config.json). */
static const synth_tower TOWER_08B = {12, 768, 12, 3072, 16, 2, 2, 3, 2304, 65536, 16777216};

/* Qwen3.5's image token ids (its tokenizer), used when no tokenizer is given. */
#define QWEN35_IMAGE_PAD_ID 248056
#define QWEN35_VISION_START_ID 248053
#define QWEN35_VISION_END_ID 248054
#define VISION_ROPE_THETA 10000.0

typedef struct synth_preset {
    const char *name;
    const char *summary;
    const char *pattern; /* one letter per layer: L linear_attention, F full_attention */
    int hidden, intermediate;
    int nh, nkv, hd;
    int nk, nv, dk, dv, kernel;
    double rotary_factor, theta;
    int vocab, tied;
    double eps;
    int max_position;
    double out_scale; /* f in N(0, (f / sqrt(H))^2) for the output embedding: chosen on the CPU engine
                         so random 4-option rows give a mean top probability of about 0.55-0.7 */
    int mrope;        /* write mrope_section (as the 0.8B reference config does) */
    const synth_tower *tower; /* the vision tower the preset may have, or NULL */
    int tower_always;         /* 1: the preset always has it (tiny-vl); 0: only with opts.vision */
} synth_preset;

static const synth_preset PRESETS[] = {
    {"tiny", "H 64, 4 layers [lin lin lin full], GQA 4/2 x 32, GDN nk 2 / nv 4 x 16, I 128, vocab 300, tied",
     "LLLF", 64, 128, 4, 2, 32, 2, 4, 16, 16, 4, 0.25, 1e7, 300, 1, 1e-6, 262144, 1.7, 0, NULL, 0},
    {"tiny-mha",
     "H 96, 5 layers [full lin lin full lin], MHA 3/3 x 32, GDN nk 2 / nv 2 (dk 24, dv 32), I 192, vocab 320, "
     "untied",
     "FLLFL", 96, 192, 3, 3, 32, 2, 2, 24, 32, 4, 0.5, 1e6, 320, 0, 1e-6, 262144, 1.5, 0, NULL, 0},
    {"tiny-hd256",
     "H 128, 4 layers [lin lin lin full], GQA 4/2 x 256 (the 0.8B attention head dim, rotary 64), GDN 2/2 x 32, "
     "I 256, vocab 300, tied",
     "LLLF", 128, 256, 4, 2, 256, 2, 2, 32, 32, 4, 0.25, 1e7, 300, 1, 1e-6, 262144, 1.7, 0, NULL, 0},
    {"demo", "H 256, 8 layers ([3 lin, 1 full] x 2), GQA 4/2 x 64, GDN 4/4 x 64, I 768, vocab 248320, tied",
     "LLLFLLLF", 256, 768, 4, 2, 64, 4, 4, 64, 64, 4, 0.25, 1e7, 248320, 1, 1e-6, 262144, 1.7, 0, NULL, 0},
    {"qwen3.5-0.8b",
     "the reference shapes: H 1024, 24 layers ([3 lin, 1 full] x 6), I 3584, GQA 8/2 x 256, GDN 16/16 x 128, "
     "vocab 248320, tied (~1.5 GB)",
     "LLLFLLLFLLLFLLLFLLLFLLLF", 1024, 3584, 8, 2, 256, 16, 16, 128, 128, 4, 0.25, 1e7, 248320, 1, 1e-6, 262144,
     2.0, 1, &TOWER_08B, 0},
    {"tiny-vl",
     "H 32, 2 layers [lin full], GQA 2/1 x 32, GDN 2/2 x 16, I 64, tied, with a vision tower (depth 2, hidden 32, "
     "2 heads, I 64, patch 16, merge 2, a 4x4 position grid); the vocabulary covers the image token ids",
     "LF", 32, 64, 2, 1, 32, 2, 2, 16, 16, 4, 0.5, 1e7, 300, 1, 1e-6, 262144, 1.7, 1, &TOWER_TINY, 1},
};
#define N_PRESETS ((int)(sizeof PRESETS / sizeof PRESETS[0]))

int squad_synth_preset_count(void) { return N_PRESETS; }
const char *squad_synth_preset_name(int i) { return i >= 0 && i < N_PRESETS ? PRESETS[i].name : NULL; }
const char *squad_synth_preset_summary(int i) { return i >= 0 && i < N_PRESETS ? PRESETS[i].summary : NULL; }

static const synth_preset *find_preset(const char *name, squad_err *err) {
    for (int i = 0; i < N_PRESETS; i++)
        if (name && !strcmp(PRESETS[i].name, name)) return &PRESETS[i];
    char list[256] = "";
    for (int i = 0; i < N_PRESETS; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, PRESETS[i].name, sizeof list - strlen(list) - 1);
    }
    squad_fail(err, SQUAD_E_INVALID, "unknown preset '%.64s' (presets: %s)", name ? name : "(none)", list);
    return NULL;
}

/* The mrope_section a preset writes (the rotary half-dims over t, h, w, as the 0.8B's [11, 11, 10]). */
static void preset_mrope_section(int rotary_dim, int sec[3]) {
    int half = rotary_dim / 2;
    sec[0] = sec[1] = (half + 2) / 3;
    sec[2] = half - sec[0] - sec[1];
}

/* The tower's fields of a config (the ids: Qwen3.5's, until a tokenizer says otherwise). */
static void tower_to_config(const synth_tower *t, squad_config *c) {
    squad_vision_config *v = &c->vision;
    c->has_vision = 1;
    v->depth = t->depth;
    v->hidden_size = t->hidden;
    v->num_heads = t->heads;
    v->head_dim = t->hidden / t->heads;
    v->intermediate_size = t->intermediate;
    v->hidden_act = SQUAD_VISION_ACT_GELU_TANH;
    v->patch_size = t->patch;
    v->temporal_patch_size = t->temporal;
    v->spatial_merge_size = t->merge;
    v->in_channels = t->channels;
    v->num_position_embeddings = t->positions;
    v->position_grid_side = (int)lround(sqrt((double)t->positions));
    v->out_hidden_size = c->hidden_size;
    v->rope_theta = VISION_ROPE_THETA;
    c->image_token_id = QWEN35_IMAGE_PAD_ID;
    c->vision_start_token_id = QWEN35_VISION_START_ID;
    c->vision_end_token_id = QWEN35_VISION_END_ID;
}

static void preset_to_config(const synth_preset *p, squad_config *c) {
    memset(c, 0, sizeof *c);
    c->hidden_size = p->hidden;
    c->num_layers = (int)strlen(p->pattern);
    c->intermediate_size = p->intermediate;
    c->num_heads = p->nh;
    c->num_kv_heads = p->nkv;
    c->head_dim = p->hd;
    c->lin_num_k_heads = p->nk;
    c->lin_num_v_heads = p->nv;
    c->lin_k_dim = p->dk;
    c->lin_v_dim = p->dv;
    c->conv_kernel = p->kernel;
    c->vocab_size = p->vocab;
    c->rms_eps = (float)p->eps;
    c->rope_theta = p->theta;
    c->partial_rotary_factor = p->rotary_factor;
    c->rotary_dim = (int)(p->hd * p->rotary_factor);
    c->tie_embeddings = p->tied;
    c->max_position = p->max_position;
    for (int i = 0; i < c->num_layers; i++) c->layer_types[i] = p->pattern[i] == 'F' ? SQUAD_LAYER_FULL : SQUAD_LAYER_LINEAR;
    /* What config.json parses back to: the preset's own section, or transformers' default. */
    c->mrope_section[0] = 11, c->mrope_section[1] = 11, c->mrope_section[2] = 10;
    if (p->mrope) preset_mrope_section(c->rotary_dim, c->mrope_section);
    c->mrope_interleaved = 1;
}

int squad_synth_preset_config_vision(const char *preset, int vision, squad_config *cfg, squad_err *err) {
    squad_err local;
    if (!err) err = &local;
    const synth_preset *p = find_preset(preset, err);
    if (!p) return err->code;
    if (vision && !p->tower)
        return squad_fail(err, SQUAD_E_INVALID, "preset '%s' has no vision tower (--vision: qwen3.5-0.8b, tiny-vl)",
                          p->name);
    preset_to_config(p, cfg);
    if (p->tower && (vision || p->tower_always)) tower_to_config(p->tower, cfg);
    return 0;
}

int squad_synth_preset_config(const char *preset, squad_config *cfg, squad_err *err) {
    return squad_synth_preset_config_vision(preset, 0, cfg, err);
}

/* ---------------------------------------------------------------------------------------------
 * The plan: tensor names, shapes and value kinds
 */

enum {
    KIND_MATRIX,       /* N(0, 1/fan_in) */
    KIND_EMBED_TIED,   /* N(0, (f/sqrt(H))^2): input and output embedding at once */
    KIND_EMBED_INPUT,  /* N(0, 1): an untied input embedding */
    KIND_LM_HEAD,      /* N(0, (f/sqrt(H))^2) */
    KIND_NORM_ZERO,    /* zero-centred RMSNorm weight, N(0, 0.2) */
    KIND_NORM_GATED,   /* the GDN gated norm's plain weight, 1 + N(0, 0.2) */
    KIND_A_LOG,        /* exp(A_log) log-uniform in [0.5, 8] */
    KIND_DT_BIAS,      /* N(0, 0.5) */
    KIND_CONV,         /* N(0, 0.5) */
    KIND_PATCH,        /* the Conv3d patch embedding: N(0, 1/(C T P P)) */
    KIND_LN_WEIGHT,    /* a LayerNorm weight: 1 + N(0, 0.2) */
    KIND_BIAS,         /* N(0, 0.1) */
    KIND_POS_EMBED,    /* the learned position grid: N(0, 0.5) */
};

typedef struct plan_builder {
    squad_synth_plan *plan;
    int cap;
    const char *prefix;
} plan_builder;

static int plan_add(plan_builder *b, const char *top_name, const char *suffix, int kind, int ndim, int64_t d0,
                    int64_t d1, int64_t d2, squad_err *err);

/* The vision tower's tensors (model.visual.*, full names). */
static int plan_tower(plan_builder *b, const squad_config *c, squad_err *err) {
    const squad_vision_config *v = &c->vision;
    int64_t H = v->hidden_size, I = v->intermediate_size, M = (int64_t)v->spatial_merge_size * v->spatial_merge_size * H;
    char s[128];
#define ADDV(kind, ndim, d0, d1, ...)                                                  \
    do {                                                                               \
        snprintf(s, sizeof s, "model.visual." __VA_ARGS__);                            \
        if (plan_add(b, s, NULL, kind, ndim, d0, d1, 0, err) != 0) return err->code; \
    } while (0)
    ADDV(KIND_PATCH, 5, H, v->in_channels, "patch_embed.proj.weight");
    squad_synth_tensor *t = &b->plan->tensors[b->plan->n - 1];
    t->shape[2] = v->temporal_patch_size;
    t->shape[3] = t->shape[4] = v->patch_size;
    ADDV(KIND_BIAS, 1, H, 0, "patch_embed.proj.bias");
    ADDV(KIND_POS_EMBED, 2, v->num_position_embeddings, H, "pos_embed.weight");
    for (int i = 0; i < v->depth; i++) {
        ADDV(KIND_LN_WEIGHT, 1, H, 0, "blocks.%d.norm1.weight", i);
        ADDV(KIND_BIAS, 1, H, 0, "blocks.%d.norm1.bias", i);
        ADDV(KIND_MATRIX, 2, 3 * H, H, "blocks.%d.attn.qkv.weight", i);
        ADDV(KIND_BIAS, 1, 3 * H, 0, "blocks.%d.attn.qkv.bias", i);
        ADDV(KIND_MATRIX, 2, H, H, "blocks.%d.attn.proj.weight", i);
        ADDV(KIND_BIAS, 1, H, 0, "blocks.%d.attn.proj.bias", i);
        ADDV(KIND_LN_WEIGHT, 1, H, 0, "blocks.%d.norm2.weight", i);
        ADDV(KIND_BIAS, 1, H, 0, "blocks.%d.norm2.bias", i);
        ADDV(KIND_MATRIX, 2, I, H, "blocks.%d.mlp.linear_fc1.weight", i);
        ADDV(KIND_BIAS, 1, I, 0, "blocks.%d.mlp.linear_fc1.bias", i);
        ADDV(KIND_MATRIX, 2, H, I, "blocks.%d.mlp.linear_fc2.weight", i);
        ADDV(KIND_BIAS, 1, H, 0, "blocks.%d.mlp.linear_fc2.bias", i);
    }
    ADDV(KIND_LN_WEIGHT, 1, H, 0, "merger.norm.weight");
    ADDV(KIND_BIAS, 1, H, 0, "merger.norm.bias");
    ADDV(KIND_MATRIX, 2, M, M, "merger.linear_fc1.weight");
    ADDV(KIND_BIAS, 1, M, 0, "merger.linear_fc1.bias");
    ADDV(KIND_MATRIX, 2, v->out_hidden_size, M, "merger.linear_fc2.weight");
    ADDV(KIND_BIAS, 1, v->out_hidden_size, 0, "merger.linear_fc2.bias");
#undef ADDV
    return 0;
}

static int plan_add(plan_builder *b, const char *top_name, const char *suffix, int kind, int ndim, int64_t d0,
                    int64_t d1, int64_t d2, squad_err *err) {
    if (b->plan->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        squad_synth_tensor *t = realloc(b->plan->tensors, (size_t)cap * sizeof *t);
        if (!t) return squad_fail(err, SQUAD_E_NOMEM, "out of memory (synth plan)");
        b->plan->tensors = t;
        b->cap = cap;
    }
    squad_synth_tensor *t = &b->plan->tensors[b->plan->n++];
    memset(t, 0, sizeof *t);
    if (top_name)
        snprintf(t->name, sizeof t->name, "%s", top_name);
    else
        snprintf(t->name, sizeof t->name, "%s%s", b->prefix, suffix);
    t->kind = kind;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    return 0;
}

static int plan_layer(plan_builder *b, const squad_config *c, int i, squad_err *err) {
    int64_t H = c->hidden_size, I = c->intermediate_size;
    char s[96];
#define ADD(suffix, kind, ndim, d0, d1, d2)                                                  \
    do {                                                                                     \
        snprintf(s, sizeof s, "layers.%d.%s", i, suffix);                                    \
        if (plan_add(b, NULL, s, kind, ndim, d0, d1, d2, err) != 0) return err->code; \
    } while (0)
    ADD("input_layernorm.weight", KIND_NORM_ZERO, 1, H, 0, 0);
    ADD("post_attention_layernorm.weight", KIND_NORM_ZERO, 1, H, 0, 0);
    ADD("mlp.gate_proj.weight", KIND_MATRIX, 2, I, H, 0);
    ADD("mlp.up_proj.weight", KIND_MATRIX, 2, I, H, 0);
    ADD("mlp.down_proj.weight", KIND_MATRIX, 2, H, I, 0);
    if (c->layer_types[i] == SQUAD_LAYER_LINEAR) {
        int64_t nv = c->lin_num_v_heads, dv = c->lin_v_dim, C = squad_config_gdn_channels(c);
        ADD("linear_attn.in_proj_qkv.weight", KIND_MATRIX, 2, C, H, 0);
        ADD("linear_attn.in_proj_z.weight", KIND_MATRIX, 2, nv * dv, H, 0);
        ADD("linear_attn.in_proj_b.weight", KIND_MATRIX, 2, nv, H, 0);
        ADD("linear_attn.in_proj_a.weight", KIND_MATRIX, 2, nv, H, 0);
        ADD("linear_attn.out_proj.weight", KIND_MATRIX, 2, H, nv * dv, 0);
        ADD("linear_attn.conv1d.weight", KIND_CONV, 3, C, 1, c->conv_kernel);
        ADD("linear_attn.A_log", KIND_A_LOG, 1, nv, 0, 0);
        ADD("linear_attn.dt_bias", KIND_DT_BIAS, 1, nv, 0, 0);
        ADD("linear_attn.norm.weight", KIND_NORM_GATED, 1, dv, 0, 0);
    } else {
        int64_t nh = c->num_heads, nkv = c->num_kv_heads, hd = c->head_dim;
        ADD("self_attn.q_proj.weight", KIND_MATRIX, 2, nh * 2 * hd, H, 0);
        ADD("self_attn.k_proj.weight", KIND_MATRIX, 2, nkv * hd, H, 0);
        ADD("self_attn.v_proj.weight", KIND_MATRIX, 2, nkv * hd, H, 0);
        ADD("self_attn.o_proj.weight", KIND_MATRIX, 2, H, nh * hd, 0);
        ADD("self_attn.q_norm.weight", KIND_NORM_ZERO, 1, hd, 0, 0);
        ADD("self_attn.k_norm.weight", KIND_NORM_ZERO, 1, hd, 0, 0);
    }
#undef ADD
    return 0;
}

static int tensor_by_name(const void *a, const void *b) {
    return strcmp(((const squad_synth_tensor *)a)->name, ((const squad_synth_tensor *)b)->name);
}

int squad_synth_plan_make(const squad_config *c, squad_synth_layout layout, squad_synth_plan *plan, squad_err *err) {
    squad_err local;
    if (!err) err = &local;
    memset(plan, 0, sizeof *plan);
    plan_builder b = {plan, 0, layout == SQUAD_SYNTH_CONDITIONAL ? "model.language_model." : "model."};
    int64_t V = c->vocab_size, H = c->hidden_size;
    int rc = plan_add(&b, NULL, "embed_tokens.weight", c->tie_embeddings ? KIND_EMBED_TIED : KIND_EMBED_INPUT, 2, V, H,
                      0, err);
    if (rc == 0) rc = plan_add(&b, NULL, "norm.weight", KIND_NORM_ZERO, 1, H, 0, 0, err);
    if (rc == 0 && !c->tie_embeddings) rc = plan_add(&b, "lm_head.weight", NULL, KIND_LM_HEAD, 2, V, H, 0, err);
    for (int i = 0; rc == 0 && i < c->num_layers; i++) rc = plan_layer(&b, c, i, err);
    if (rc == 0 && c->has_vision) rc = plan_tower(&b, c, err);
    if (rc != 0) {
        squad_synth_plan_free(plan);
        return rc;
    }
    qsort(plan->tensors, (size_t)plan->n, sizeof *plan->tensors, tensor_by_name);
    return 0;
}

void squad_synth_plan_free(squad_synth_plan *plan) {
    if (!plan) return;
    free(plan->tensors);
    memset(plan, 0, sizeof *plan);
}

/* ---------------------------------------------------------------------------------------------
 * Values
 */

uint64_t squad_synth_rng_next(squad_synth_rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t squad_synth_fnv1a(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

squad_synth_rng squad_synth_rng_keyed(uint64_t seed, uint64_t key) {
    squad_synth_rng r = {seed};
    r.state = squad_synth_rng_next(&r) ^ key;
    squad_synth_rng_next(&r);
    return r;
}

float squad_synth_rng_bell(squad_synth_rng *r, float scale) {
    uint64_t x = squad_synth_rng_next(r);
    int32_t sum = (int32_t)(x & 0xffff) + (int32_t)((x >> 16) & 0xffff) + (int32_t)((x >> 32) & 0xffff) +
                  (int32_t)(x >> 48) + 2 - 131072;
    return (float)sum * scale * (1.7320508f / 65536.0f);
}

/* The stream of one tensor: keyed by the seed and its name inside the text model. */
static squad_synth_rng tensor_rng(uint64_t seed, const char *name, const char *prefix) {
    size_t plen = strlen(prefix);
    if (!strncmp(name, prefix, plen)) name += plen;
    return squad_synth_rng_keyed(seed, squad_synth_fnv1a(SQUAD_SYNTH_FNV_BASIS, name));
}

static inline float rng_uniform(squad_synth_rng *r) { return (float)((squad_synth_rng_next(r) >> 40) * (1.0 / 16777216.0)); }

typedef struct value_params {
    int kind;
    float scale, mean;
} value_params;

static value_params kind_params(const squad_synth_tensor *t, const synth_preset *p) {
    value_params v = {t->kind, 1.0f, 0.0f};
    float inv_sqrt_h = 1.0f / sqrtf((float)p->hidden);
    switch (t->kind) {
    case KIND_MATRIX: v.scale = 1.0f / sqrtf((float)t->shape[1]); break;
    case KIND_EMBED_TIED:
    case KIND_LM_HEAD: v.scale = (float)p->out_scale * inv_sqrt_h; break;
    case KIND_EMBED_INPUT: v.scale = 1.0f; break;
    case KIND_NORM_ZERO: v.scale = 0.2f; break;
    case KIND_NORM_GATED: v.scale = 0.2f, v.mean = 1.0f; break;
    case KIND_DT_BIAS:
    case KIND_CONV:
    case KIND_POS_EMBED: v.scale = 0.5f; break;
    case KIND_PATCH: v.scale = 1.0f / sqrtf((float)(t->shape[1] * t->shape[2] * t->shape[3] * t->shape[4])); break;
    case KIND_LN_WEIGHT: v.scale = 0.2f, v.mean = 1.0f; break;
    case KIND_BIAS: v.scale = 0.1f; break;
    default: break;
    }
    return v;
}

static inline float draw(squad_synth_rng *r, const value_params *v) {
    if (v->kind == KIND_A_LOG) {
        const float lo = -0.69314718f, hi = 2.0794415f; /* log 0.5, log 8 */
        return lo + (hi - lo) * rng_uniform(r);
    }
    return v->mean + squad_synth_rng_bell(r, v->scale);
}

/* f32 -> f16, round to nearest even (for F16 test checkpoints). */
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { /* a subnormal half (or zero) */
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000u;
        int shift = 14 - e;
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* a carry into the exponent is right */
    return (uint16_t)h;
}

#define SYNTH_BLOCK (1 << 16) /* elements generated per block */

/* Streams one tensor's values into the writer. */
static int write_tensor(st_writer *w, const squad_synth_tensor *t, const synth_preset *p, const char *prefix,
                        uint64_t seed, st_dtype dtype, void *buf, squad_err *err) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    squad_synth_rng r = tensor_rng(seed, t->name, prefix);
    value_params v = kind_params(t, p);
    for (size_t done = 0; done < n;) {
        size_t m = n - done < SYNTH_BLOCK ? n - done : SYNTH_BLOCK;
        size_t bytes;
        if (dtype == ST_BF16) {
            uint16_t *o = buf;
            for (size_t i = 0; i < m; i++) o[i] = squad_f32_to_bf16(draw(&r, &v));
            bytes = m * 2;
        } else if (dtype == ST_F16) {
            uint16_t *o = buf;
            for (size_t i = 0; i < m; i++) o[i] = f32_to_f16(squad_bf16_to_f32(squad_f32_to_bf16(draw(&r, &v))));
            bytes = m * 2;
        } else {
            float *o = buf;
            for (size_t i = 0; i < m; i++) o[i] = squad_bf16_to_f32(squad_f32_to_bf16(draw(&r, &v)));
            bytes = m * 4;
        }
        if (st_writer_put(w, buf, bytes, err) != 0) return err->code;
        done += m;
    }
    return 0;
}

static int write_weights(const char *path, const squad_synth_plan *plan, const synth_preset *p, const char *prefix,
                         uint64_t seed, st_dtype dtype, squad_err *err) {
    st_write_tensor *wt = squad_calloc((size_t)plan->n, sizeof *wt, err);
    void *buf = squad_malloc((size_t)SYNTH_BLOCK * 4, err);
    st_writer *w = NULL;
    int rc = SQUAD_E_NOMEM;
    if (!wt || !buf) goto done;
    for (int i = 0; i < plan->n; i++) {
        wt[i].name = plan->tensors[i].name;
        wt[i].dtype = dtype;
        wt[i].ndim = plan->tensors[i].ndim;
        for (int d = 0; d < wt[i].ndim; d++) wt[i].shape[d] = plan->tensors[i].shape[d];
    }
    if (!(w = st_writer_open(path, wt, plan->n, err))) {
        rc = err->code;
        goto done;
    }
    for (int i = 0; i < plan->n; i++) {
        if ((rc = write_tensor(w, &plan->tensors[i], p, prefix, seed, dtype, buf, err)) != 0) {
            st_writer_abort(w);
            goto done;
        }
    }
    rc = st_writer_close(w, err);
done:
    free(wt);
    free(buf);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * config.json
 */

static json_t *layer_types_json(const squad_config *c) {
    json_t *a = json_array();
    for (int i = 0; a && i < c->num_layers; i++)
        if (json_array_append_new(a, json_string(c->layer_types[i] == SQUAD_LAYER_FULL ? "full_attention"
                                                                                       : "linear_attention")) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static const char *dtype_torch_name(st_dtype dt) {
    return dt == ST_F32 ? "float32" : dt == ST_F16 ? "float16" : "bfloat16";
}

/* The text model's fields, as Qwen3_5TextConfig.to_dict() writes them (transformers 5 also keeps
 * partial_rotary_factor beside rope_parameters). */
static json_t *text_config_json(const squad_config *c, const synth_preset *p) {
    json_t *rope = json_pack("{s:s, s:f, s:f}", "rope_type", "default", "rope_theta", c->rope_theta,
                             "partial_rotary_factor", c->partial_rotary_factor);
    if (rope && p->mrope) {
        /* mrope_section splits the rotary half-dims over (t, h, w); for text all are equal. */
        int sec[3];
        preset_mrope_section(c->rotary_dim, sec);
        if (json_object_set_new(rope, "mrope_section", json_pack("[i, i, i]", sec[0], sec[1], sec[2])) != 0 ||
            json_object_set_new(rope, "mrope_interleaved", json_true()) != 0) {
            json_decref(rope);
            rope = NULL;
        }
    }
    json_t *types = layer_types_json(c);
    if (!rope || !types) {
        json_decref(rope);
        json_decref(types);
        return NULL;
    }
    return json_pack(
        "{s:b, s:f, s:n, s:n, s:i, s:s, s:i, s:f, s:i, s:o, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:i, s:i, s:n,"
        " s:f, s:f, s:o, s:b, s:b, s:i}",
        "attention_bias", 0, "attention_dropout", 0.0, "bos_token_id", "eos_token_id", "head_dim", c->head_dim, "hidden_act", "silu", "hidden_size", c->hidden_size,
        "initializer_range", 0.02, "intermediate_size", c->intermediate_size, "layer_types", types,
        "linear_conv_kernel_dim", c->conv_kernel, "linear_key_head_dim", c->lin_k_dim, "linear_num_key_heads",
        c->lin_num_k_heads, "linear_num_value_heads", c->lin_num_v_heads, "linear_value_head_dim", c->lin_v_dim,
        "max_position_embeddings", c->max_position, "model_type", "qwen3_5_text", "num_attention_heads", c->num_heads,
        "num_hidden_layers", c->num_layers, "num_key_value_heads", c->num_kv_heads, "pad_token_id",
        "partial_rotary_factor", c->partial_rotary_factor, "rms_norm_eps", (double)p->eps, "rope_parameters", rope, "tie_word_embeddings", c->tie_embeddings, "use_cache", 1,
        "vocab_size", c->vocab_size);
}

/* vision_config as transformers 5.x writes Qwen3_5VisionConfig. */
static json_t *vision_config_json(const squad_config *c) {
    const squad_vision_config *v = &c->vision;
    return json_pack("{s:i, s:s, s:i, s:i, s:f, s:i, s:s, s:i, s:i, s:i, s:i, s:{s:f, s:s}, s:i, s:i}", "depth",
                     v->depth, "hidden_act", "gelu_pytorch_tanh", "hidden_size", v->hidden_size, "in_channels",
                     v->in_channels, "initializer_range", 0.02, "intermediate_size", v->intermediate_size, "model_type",
                     "qwen3_5_vision", "num_heads", v->num_heads, "num_position_embeddings", v->num_position_embeddings,
                     "out_hidden_size", v->out_hidden_size, "patch_size", v->patch_size, "rope_parameters",
                     "rope_theta", v->rope_theta, "rope_type", "axial", "spatial_merge_size", v->spatial_merge_size,
                     "temporal_patch_size", v->temporal_patch_size);
}

/* The tower's fields of the composite config: vision_config and the image token ids. */
static int add_vision_fields(json_t *root, const squad_config *c) {
    json_t *vc = vision_config_json(c);
    if (!vc || json_object_set_new(root, "vision_config", vc) != 0) return -1;
    if (json_object_set_new(root, "image_token_id", json_integer(c->image_token_id)) != 0 ||
        json_object_set_new(root, "vision_start_token_id", json_integer(c->vision_start_token_id)) != 0 ||
        json_object_set_new(root, "vision_end_token_id", json_integer(c->vision_end_token_id)) != 0)
        return -1;
    return 0;
}

static char *config_text(const squad_config *c, const synth_preset *p, squad_synth_layout layout, st_dtype dtype,
                         squad_err *err) {
    json_t *text = text_config_json(c, p);
    json_t *root = NULL;
    if (text && layout == SQUAD_SYNTH_CAUSAL) {
        root = text;
        if (json_object_set_new(root, "architectures", json_pack("[s]", "Qwen3_5ForCausalLM")) != 0 ||
            json_object_set_new(root, "dtype", json_string(dtype_torch_name(dtype))) != 0) {
            json_decref(root);
            root = NULL;
        }
    } else if (text) {
        /* The composite config: text fields nested; the tie flag the composite model acts on at the top. */
        root = json_pack("{s:[s], s:s, s:s, s:o, s:b}", "architectures", "Qwen3_5ForConditionalGeneration", "dtype",
                         dtype_torch_name(dtype), "model_type", "qwen3_5", "text_config", text, "tie_word_embeddings",
                         c->tie_embeddings);
        if (root && c->has_vision && add_vision_fields(root, c) != 0) {
            json_decref(root);
            root = NULL;
        }
    }
    char *s = root ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(10)) : NULL;
    json_decref(root);
    if (!s) squad_fail(err, SQUAD_E_NOMEM, "out of memory writing config.json");
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Files
 */

static int write_text_file(const char *path, const char *text, size_t len, squad_err *err) {
    FILE *f = fopen(path, "wb");
    if (!f) return squad_fail(err, SQUAD_E_IO, "cannot create %s: %s", path, strerror(errno));
    int bad = fwrite(text, 1, len, f) != len;
    bad |= fclose(f) != 0;
    if (bad) return squad_fail(err, SQUAD_E_IO, "cannot write %s", path);
    return 0;
}

/* Ends a text file with a newline, as transformers' JSON files do. */
static int write_text_file_append_newline(const char *path, squad_err *err) {
    FILE *f = fopen(path, "ab");
    if (!f) return squad_fail(err, SQUAD_E_IO, "cannot open %s: %s", path, strerror(errno));
    int bad = fputc('\n', f) == EOF;
    bad |= fclose(f) != 0;
    if (bad) return squad_fail(err, SQUAD_E_IO, "cannot write %s", path);
    return 0;
}

/* The vocabulary a tokenizer.json needs: its largest id + 1, rounded up to a multiple of 64. */
static int tokenizer_vocab(const char *text, size_t len, const char *path, int *vocab, squad_err *err) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root) return squad_fail(err, SQUAD_E_INVALID, "%s: invalid JSON at line %d: %s", path, jerr.line, jerr.text);
    long long max_id = -1;
    int bad = 0;
    json_t *vocab_j = json_object_get(json_object_get(root, "model"), "vocab");
    if (json_is_object(vocab_j)) {
        const char *k;
        json_t *v;
        json_object_foreach(vocab_j, k, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0) bad = 1;
            else if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
        }
    } else if (json_is_array(vocab_j)) { /* Unigram: [[piece, score], ...], ids are positions */
        max_id = (long long)json_array_size(vocab_j) - 1;
    }
    json_t *added = json_object_get(root, "added_tokens");
    for (size_t i = 0; json_is_array(added) && i < json_array_size(added); i++) {
        json_t *id = json_object_get(json_array_get(added, i), "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0) bad = 1;
        else if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    json_decref(root);
    if (bad) return squad_fail(err, SQUAD_E_INVALID, "%s: a token id is not a non-negative integer", path);
    if (max_id < 0) return squad_fail(err, SQUAD_E_INVALID, "%s: no token ids in model.vocab or added_tokens", path);
    long long v = (max_id + 1 + 63) / 64 * 64;
    if (v > (1 << 24)) return squad_fail(err, SQUAD_E_INVALID, "%s: token id %lld is too large", path, max_id);
    *vocab = (int)v;
    return 0;
}

/* The id of a token given by its content: added_tokens first, then model.vocab; -1 when absent. */
static long long token_id_by_content(json_t *root, const char *content) {
    json_t *added = json_object_get(root, "added_tokens");
    for (size_t i = 0; json_is_array(added) && i < json_array_size(added); i++) {
        json_t *t = json_array_get(added, i);
        const char *c = json_string_value(json_object_get(t, "content"));
        json_t *id = json_object_get(t, "id");
        if (c && !strcmp(c, content) && json_is_integer(id)) return json_integer_value(id);
    }
    json_t *id = json_object_get(json_object_get(json_object_get(root, "model"), "vocab"), content);
    return json_is_integer(id) ? json_integer_value(id) : -1;
}

/* The image token ids of a tokenizer.json, looked up by content. */
static int tokenizer_image_ids(const char *text, size_t len, const char *path, squad_config *c, squad_err *err) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root) return squad_fail(err, SQUAD_E_INVALID, "%s: invalid JSON at line %d: %s", path, jerr.line, jerr.text);
    struct {
        const char *content;
        int *id;
    } tokens[] = {{"<|image_pad|>", &c->image_token_id},
                  {"<|vision_start|>", &c->vision_start_token_id},
                  {"<|vision_end|>", &c->vision_end_token_id}};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < sizeof tokens / sizeof tokens[0]; i++) {
        long long id = token_id_by_content(root, tokens[i].content);
        if (id < 0 || id >= c->vocab_size)
            rc = squad_fail(err, SQUAD_E_INVALID, "%s: no token %s, which a vision tower's image rows need", path,
                            tokens[i].content);
        else
            *tokens[i].id = (int)id;
    }
    json_decref(root);
    return rc;
}

/* preprocessor_config.json for a tower: transformers' Qwen2VLImageProcessorFast with the tower's
 * patch, temporal and merge sizes, mean / std 0.5 (Qwen3.5's) and the preset's pixel bounds. */
static char *preprocessor_text(const squad_config *c, const synth_tower *t) {
    const squad_vision_config *v = &c->vision;
    json_t *root = json_pack(
        "{s:b, s:b, s:b, s:b, s:[f, f, f], s:s, s:[f, f, f], s:i, s:i, s:i, s:f, s:{s:I, s:I}, s:i}",
        "do_convert_rgb", 1, "do_normalize", 1, "do_rescale", 1, "do_resize", 1, "image_mean", 0.5, 0.5, 0.5,
        "image_processor_type", "Qwen2VLImageProcessorFast", "image_std", 0.5, 0.5, 0.5, "merge_size",
        v->spatial_merge_size, "patch_size", v->patch_size, "resample", 3, "rescale_factor", 1.0 / 255.0, "size",
        "longest_edge", (json_int_t)t->max_pixels, "shortest_edge", (json_int_t)t->min_pixels, "temporal_patch_size",
        v->temporal_patch_size);
    char *s = root ? json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(root);
    return s;
}

int squad_synth_write(const squad_synth_opts *o, squad_err *err) {
    squad_err local;
    if (!err) err = &local;
    const synth_preset *p = find_preset(o->preset, err);
    if (!p) return err->code;
    if (!o->out_dir || !o->out_dir[0]) return squad_fail(err, SQUAD_E_INVALID, "no output directory given");
    if (o->dtype != ST_BF16 && o->dtype != ST_F16 && o->dtype != ST_F32)
        return squad_fail(err, SQUAD_E_INVALID, "synth writes BF16, F16 or F32 only");
    squad_config cfg;
    if (squad_synth_preset_config_vision(p->name, o->vision, &cfg, err) != 0) return err->code;
    /* A tower lives in the composite model: the conditional layout. */
    const squad_synth_layout layout = cfg.has_vision ? SQUAD_SYNTH_CONDITIONAL : o->layout;

    char *tok_text = NULL, *cfg_json = NULL, *path = NULL, *pre_json = NULL;
    size_t tok_len = 0;
    squad_synth_plan plan = {0};
    int rc;
    if (o->tokenizer) {
        if (!(tok_text = squad_read_file(o->tokenizer, &tok_len, err))) return err->code;
        if ((rc = tokenizer_vocab(tok_text, tok_len, o->tokenizer, &cfg.vocab_size, err)) != 0) goto done;
        if (cfg.has_vision && (rc = tokenizer_image_ids(tok_text, tok_len, o->tokenizer, &cfg, err)) != 0) goto done;
    } else if (cfg.has_vision) {
        /* Qwen3.5's ids: the vocabulary covers them (rounded up to a multiple of 64, as for a tokenizer). */
        int top = cfg.image_token_id;
        if (cfg.vision_start_token_id > top) top = cfg.vision_start_token_id;
        if (cfg.vision_end_token_id > top) top = cfg.vision_end_token_id;
        int need = (top + 1 + 63) / 64 * 64;
        if (cfg.vocab_size < need) cfg.vocab_size = need;
    }
    if (cfg.has_vision && !(pre_json = preprocessor_text(&cfg, p->tower))) {
        rc = squad_fail(err, SQUAD_E_NOMEM, "out of memory writing preprocessor_config.json");
        goto done;
    }
    /* config.json text first, checked by our own parser against the preset. */
    if (!(cfg_json = config_text(&cfg, p, layout, o->dtype, err))) {
        rc = err->code;
        goto done;
    }
    squad_config check;
    if ((rc = squad_config_parse(&check, cfg_json, strlen(cfg_json), err)) != 0) {
        squad_fail_context(err, "internal error, preset %s: ", p->name);
        goto done;
    }
    if ((rc = squad_mkdir_p(o->out_dir, err)) != 0) goto done;
    /* A stale index would shadow the model.safetensors written here. */
    if (!(path = squad_path_join(o->out_dir, "model.safetensors.index.json", err))) {
        rc = SQUAD_E_NOMEM;
        goto done;
    }
    if (access(path, F_OK) == 0) {
        rc = squad_fail(err, SQUAD_E_INVALID, "%s already exists and would shadow the new weights; use an empty directory",
                        path);
        goto done;
    }
    free(path);
    if ((rc = squad_synth_plan_make(&cfg, layout, &plan, err)) != 0) goto done;
    if (!(path = squad_path_join(o->out_dir, "model.safetensors", err))) {
        rc = SQUAD_E_NOMEM;
        goto done;
    }
    const char *prefix = layout == SQUAD_SYNTH_CONDITIONAL ? "model.language_model." : "model.";
    if ((rc = write_weights(path, &plan, p, prefix, o->seed, o->dtype, err)) != 0) goto done;
    free(path);
    if (!(path = squad_path_join(o->out_dir, "config.json", err))) {
        rc = SQUAD_E_NOMEM;
        goto done;
    }
    if ((rc = write_text_file(path, cfg_json, strlen(cfg_json), err)) != 0 ||
        (rc = write_text_file_append_newline(path, err)) != 0)
        goto done;
    if (pre_json) {
        free(path);
        if (!(path = squad_path_join(o->out_dir, "preprocessor_config.json", err))) {
            rc = SQUAD_E_NOMEM;
            goto done;
        }
        if ((rc = write_text_file(path, pre_json, strlen(pre_json), err)) != 0 ||
            (rc = write_text_file_append_newline(path, err)) != 0)
            goto done;
    }
    if (tok_text) {
        free(path);
        if (!(path = squad_path_join(o->out_dir, "tokenizer.json", err))) {
            rc = SQUAD_E_NOMEM;
            goto done;
        }
        char *src_real = realpath(o->tokenizer, NULL), *dst_real = realpath(path, NULL);
        int same = src_real && dst_real && !strcmp(src_real, dst_real);
        free(src_real);
        free(dst_real);
        if (!same) rc = write_text_file(path, tok_text, tok_len, err);
    }
done:
    squad_synth_plan_free(&plan);
    free(path);
    free(cfg_json);
    free(pre_json);
    free(tok_text);
    return rc;
}
