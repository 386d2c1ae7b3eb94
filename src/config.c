/*
 * config.c — parses a Hugging Face config.json into a squad_config (see config.h).
 *
 * Design:
 *  - Each field is looked up first in "text_config" (Qwen3_5ForConditionalGeneration nests the text
 *    model's fields there) and then at the top level, so both layouts and hand-written variants read
 *    the same way. One exception: tie_word_embeddings of a nested config is taken from the top level
 *    first, because that is the flag the composite model itself (and transformers) acts on.
 *  - Sizes are required, must be integers in a sane range (so that no product computed later can
 *    overflow an int), and must agree with each other; every failure names the offending field.
 *  - layer_types is taken exactly as given. Only when it is absent and "full_attention_interval" is
 *    present is a pattern derived (the one transformers derives: layer i is full when
 *    (i + 1) % interval == 0). Without either the config is an error: no pattern is assumed.
 *  - RoPE comes from "rope_parameters" (possibly keyed per layer type) or from the legacy top-level
 *    rope_theta / partial_rotary_factor / rope_scaling. mrope sections reduce to plain RoPE for text
 *    (all position axes equal), so they are accepted; any other rope_type changes the math and is
 *    refused as unsupported. mrope_section / mrope_interleaved are recorded for the image rows'
 *    positions (transformers' default section [11, 11, 10] when absent).
 *  - "vision_config" (the vision tower of Qwen3_5ForConditionalGeneration) is read only when present:
 *    its sizes are required (no default stands in for a size), its conventions (patch 16, temporal
 *    2, merge 2, 3 channels, gelu_pytorch_tanh) default as in transformers' Qwen3_5VisionConfig, and
 *    the image token ids come from the top level (transformers' defaults when absent). A config
 *    without it is parsed exactly as before: none of these checks apply to text-only models.
 */
#include "config.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Upper bounds that keep every derived size (products of two or three fields) well inside int and
 * size_t arithmetic. They are far above any real Qwen3.5 size. */
#define CFG_MAX_DIM (1 << 20)      /* hidden, intermediate, head dims */
#define CFG_MAX_HEADS (1 << 12)    /* any head count */
#define CFG_MAX_VOCAB (1 << 24)    /* vocabulary */
#define CFG_MAX_CONV_KERNEL 64     /* GDN conv kernel */
#define CFG_MAX_PRODUCT (1 << 26)  /* heads x head_dim products (projection widths) */
#define CFG_DEFAULT_MAX_POSITION 262144

/* Where fields are looked up: the text section (may be NULL) before the root. */
typedef struct cfg_src {
    json_t *text; /* "text_config" object or NULL */
    json_t *root;
} cfg_src;

static json_t *cfg_get(const cfg_src *s, const char *name) {
    json_t *v = NULL;
    if (s->text) v = json_object_get(s->text, name);
    if (!v || json_is_null(v)) v = json_object_get(s->root, name);
    if (v && json_is_null(v)) v = NULL; /* JSON null means "not set", as in transformers */
    return v;
}

/* A required integer field in [lo, hi]. */
static int cfg_int(const cfg_src *s, const char *name, long long lo, long long hi, int *out, squad_err *err) {
    json_t *v = cfg_get(s, name);
    if (!v) return squad_fail(err, SQUAD_E_MODEL, "config.json: missing field '%s'", name);
    if (!json_is_integer(v)) return squad_fail(err, SQUAD_E_MODEL, "config.json: field '%s' must be an integer", name);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return squad_fail(err, SQUAD_E_MODEL, "config.json: field '%s' = %lld is out of range [%lld, %lld]", name, x,
                          lo, hi);
    *out = (int)x;
    return 0;
}

/* A number (integer or real) from a JSON value; returns 0 when v is numeric. */
static int json_number(json_t *v, double *out) {
    if (json_is_integer(v)) {
        *out = (double)json_integer_value(v);
        return 0;
    }
    if (json_is_real(v)) {
        *out = json_real_value(v);
        return 0;
    }
    return -1;
}

/* A positive finite number from an object field; `where` names the place for messages. */
static int obj_positive(json_t *obj, const char *name, const char *where, double *out, squad_err *err) {
    json_t *v = json_object_get(obj, name);
    double x;
    if (json_number(v, &x) != 0)
        return squad_fail(err, SQUAD_E_MODEL, "config.json: field '%s%s' must be a number", where, name);
    if (!(x > 0) || !isfinite(x))
        return squad_fail(err, SQUAD_E_MODEL, "config.json: field '%s%s' = %g must be positive and finite", where,
                          name, x);
    *out = x;
    return 0;
}

/* rope_type values that are plain RoPE for a text model. */
static int rope_type_supported(json_t *params, const char *where, squad_err *err) {
    const char *keys[2] = {"rope_type", "type"};
    for (int i = 0; i < 2; i++) {
        json_t *t = json_object_get(params, keys[i]);
        if (!t || json_is_null(t)) continue;
        if (!json_is_string(t))
            return squad_fail(err, SQUAD_E_MODEL, "config.json: field '%s%s' must be a string", where, keys[i]);
        const char *s = json_string_value(t);
        if (strcmp(s, "default") != 0 && strcmp(s, "mrope") != 0)
            return squad_fail(err, SQUAD_E_UNSUPPORTED,
                              "config.json: field '%s%s' = \"%s\" is not supported (only default / mrope RoPE)", where,
                              keys[i], s);
    }
    /* mrope_section, when given, must at least be a list of non-negative integers. */
    json_t *sec = json_object_get(params, "mrope_section");
    if (sec && !json_is_null(sec)) {
        if (!json_is_array(sec))
            return squad_fail(err, SQUAD_E_MODEL, "config.json: field '%smrope_section' must be an array", where);
        for (size_t i = 0; i < json_array_size(sec); i++) {
            json_t *e = json_array_get(sec, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0)
                return squad_fail(err, SQUAD_E_MODEL,
                                  "config.json: field '%smrope_section' must hold non-negative integers", where);
        }
    }
    return 0;
}

/* mrope_section and mrope_interleaved of a RoPE parameter object (the section already checked to
 * be a list of non-negative integers by rope_type_supported); defaults stay when absent. Text-only
 * models never use them, so nothing here is an error: a section without 3 entries or a
 * non-boolean flag is recorded as -1 and refused only by a config with a vision tower. */
static void rope_mrope(json_t *params, squad_config *cfg) {
    json_t *sec = json_object_get(params, "mrope_section");
    if (sec && !json_is_null(sec)) {
        for (int i = 0; i < 3; i++) {
            long long x = json_array_size(sec) == 3 ? json_integer_value(json_array_get(sec, (size_t)i)) : -1;
            cfg->mrope_section[i] = x > CFG_MAX_DIM ? -1 : (int)x;
        }
    }
    json_t *il = json_object_get(params, "mrope_interleaved");
    if (il && !json_is_null(il)) cfg->mrope_interleaved = json_is_boolean(il) ? json_is_true(il) : -1;
}

/* RoPE theta and partial rotary factor, from rope_parameters or the legacy fields. */
static int cfg_rope(const cfg_src *s, squad_config *cfg, squad_err *err) {
    json_t *params = cfg_get(s, "rope_parameters");
    if (params) {
        if (!json_is_object(params))
            return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'rope_parameters' must be an object");
        const char *where = "rope_parameters.";
        /* transformers allows one parameter set per layer type; attention layers use "full_attention". */
        if (!json_object_get(params, "rope_theta")) {
            json_t *per = json_object_get(params, "full_attention");
            if (json_is_object(per)) {
                params = per;
                where = "rope_parameters.full_attention.";
            }
        }
        if (!json_object_get(params, "rope_theta"))
            return squad_fail(err, SQUAD_E_MODEL, "config.json: missing field '%srope_theta'", where);
        if (obj_positive(params, "rope_theta", where, &cfg->rope_theta, err) != 0) return err->code;
        cfg->partial_rotary_factor = 1.0;
        json_t *f = json_object_get(params, "partial_rotary_factor");
        if (!f || json_is_null(f)) f = cfg_get(s, "partial_rotary_factor");
        if (f && json_number(f, &cfg->partial_rotary_factor) != 0)
            return squad_fail(err, SQUAD_E_MODEL, "config.json: field '%spartial_rotary_factor' must be a number", where);
        if (rope_type_supported(params, where, err) != 0) return err->code;
        rope_mrope(params, cfg);
        return 0;
    }
    /* Legacy layout: rope_theta (and partial_rotary_factor, rope_scaling) at the top level. */
    json_t *theta = cfg_get(s, "rope_theta");
    if (!theta) return squad_fail(err, SQUAD_E_MODEL, "config.json: missing field 'rope_parameters' (or 'rope_theta')");
    if (json_number(theta, &cfg->rope_theta) != 0)
        return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'rope_theta' must be a number");
    if (!(cfg->rope_theta > 0) || !isfinite(cfg->rope_theta))
        return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'rope_theta' = %g must be positive and finite",
                          cfg->rope_theta);
    cfg->partial_rotary_factor = 1.0;
    json_t *f = cfg_get(s, "partial_rotary_factor");
    if (f && json_number(f, &cfg->partial_rotary_factor) != 0)
        return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'partial_rotary_factor' must be a number");
    json_t *scaling = cfg_get(s, "rope_scaling");
    if (scaling) {
        if (!json_is_object(scaling))
            return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'rope_scaling' must be an object");
        if (rope_type_supported(scaling, "rope_scaling.", err) != 0) return err->code;
        rope_mrope(scaling, cfg);
    }
    return 0;
}

static int cfg_layer_types(const cfg_src *s, squad_config *cfg, squad_err *err) {
    json_t *lt = cfg_get(s, "layer_types");
    if (lt) {
        if (!json_is_array(lt))
            return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'layer_types' must be an array of strings");
        if ((long long)json_array_size(lt) != cfg->num_layers)
            return squad_fail(err, SQUAD_E_MODEL,
                              "config.json: field 'layer_types' has %zu entries but num_hidden_layers is %d",
                              json_array_size(lt), cfg->num_layers);
        for (int i = 0; i < cfg->num_layers; i++) {
            const char *t = json_string_value(json_array_get(lt, (size_t)i));
            if (t && !strcmp(t, "linear_attention"))
                cfg->layer_types[i] = SQUAD_LAYER_LINEAR;
            else if (t && !strcmp(t, "full_attention"))
                cfg->layer_types[i] = SQUAD_LAYER_FULL;
            else
                return squad_fail(err, SQUAD_E_MODEL,
                                  "config.json: field 'layer_types[%d]' must be \"linear_attention\" or "
                                  "\"full_attention\"",
                                  i);
        }
        return 0;
    }
    json_t *iv = cfg_get(s, "full_attention_interval");
    if (!iv)
        return squad_fail(err, SQUAD_E_MODEL,
                          "config.json: missing field 'layer_types' (and no 'full_attention_interval' to derive it)");
    if (!json_is_integer(iv) || json_integer_value(iv) < 1 || json_integer_value(iv) > SQUAD_MAX_LAYERS)
        return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'full_attention_interval' must be an integer in [1, %d]",
                          SQUAD_MAX_LAYERS);
    int interval = (int)json_integer_value(iv);
    for (int i = 0; i < cfg->num_layers; i++)
        cfg->layer_types[i] = ((i + 1) % interval == 0) ? SQUAD_LAYER_FULL : SQUAD_LAYER_LINEAR;
    return 0;
}

/* tie_word_embeddings: bool; a nested config's top-level flag wins (see the file comment). */
static int cfg_tie(const cfg_src *s, squad_config *cfg, squad_err *err) {
    json_t *v = json_object_get(s->root, "tie_word_embeddings");
    if ((!v || json_is_null(v)) && s->text) v = json_object_get(s->text, "tie_word_embeddings");
    cfg->tie_embeddings = 0; /* the transformers default */
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v))
        return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'tie_word_embeddings' must be true or false");
    cfg->tie_embeddings = json_is_true(v);
    return 0;
}

/* The sizes, each required and in range. */
static int cfg_sizes(const cfg_src *s, squad_config *c, squad_err *err) {
    struct {
        const char *name;
        long long lo, hi;
        int *out;
    } fields[] = {
        {"hidden_size", 1, CFG_MAX_DIM, &c->hidden_size},
        {"num_hidden_layers", 1, SQUAD_MAX_LAYERS, &c->num_layers},
        {"intermediate_size", 1, CFG_MAX_DIM, &c->intermediate_size},
        {"num_attention_heads", 1, CFG_MAX_HEADS, &c->num_heads},
        {"num_key_value_heads", 1, CFG_MAX_HEADS, &c->num_kv_heads},
        {"head_dim", 1, CFG_MAX_DIM, &c->head_dim},
        {"linear_num_key_heads", 1, CFG_MAX_HEADS, &c->lin_num_k_heads},
        {"linear_num_value_heads", 1, CFG_MAX_HEADS, &c->lin_num_v_heads},
        {"linear_key_head_dim", 1, CFG_MAX_DIM, &c->lin_k_dim},
        {"linear_value_head_dim", 1, CFG_MAX_DIM, &c->lin_v_dim},
        {"linear_conv_kernel_dim", 1, CFG_MAX_CONV_KERNEL, &c->conv_kernel},
        {"vocab_size", 1, CFG_MAX_VOCAB, &c->vocab_size},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (cfg_int(s, fields[i].name, fields[i].lo, fields[i].hi, fields[i].out, err) != 0) return err->code;
    return 0;
}

/* Relations between sizes: head groupings and projection widths that must fit. */
static int cfg_consistency(squad_config *c, squad_err *err) {
    if (c->num_heads % c->num_kv_heads != 0)
        return squad_fail(err, SQUAD_E_MODEL,
                          "config.json: field 'num_attention_heads' (%d) must be a multiple of 'num_key_value_heads' (%d)",
                          c->num_heads, c->num_kv_heads);
    if (c->lin_num_v_heads % c->lin_num_k_heads != 0)
        return squad_fail(err, SQUAD_E_MODEL,
                          "config.json: field 'linear_num_value_heads' (%d) must be a multiple of "
                          "'linear_num_key_heads' (%d)",
                          c->lin_num_v_heads, c->lin_num_k_heads);
    struct {
        const char *what;
        long long v;
    } widths[] = {
        {"num_attention_heads * head_dim * 2 (q_proj rows)", 2LL * c->num_heads * c->head_dim},
        {"num_key_value_heads * head_dim", (long long)c->num_kv_heads * c->head_dim},
        {"linear_num_value_heads * linear_value_head_dim", (long long)c->lin_num_v_heads * c->lin_v_dim},
        {"2 * linear_num_key_heads * linear_key_head_dim + linear_num_value_heads * linear_value_head_dim",
         2LL * c->lin_num_k_heads * c->lin_k_dim + (long long)c->lin_num_v_heads * c->lin_v_dim},
    };
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (widths[i].v > CFG_MAX_PRODUCT)
            return squad_fail(err, SQUAD_E_MODEL, "config.json: %s = %lld is too large (limit %d)", widths[i].what,
                              widths[i].v, CFG_MAX_PRODUCT);
    /* The rotary dims: transformers uses int(head_dim * factor). */
    double f = c->partial_rotary_factor;
    if (!(f > 0) || f > 1.0 || !isfinite(f))
        return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'partial_rotary_factor' = %g must be in (0, 1]", f);
    double rd = floor((double)c->head_dim * f + 1e-9);
    if (rd < 2 || rd > c->head_dim || fmod(rd, 2.0) != 0)
        return squad_fail(err, SQUAD_E_MODEL,
                          "config.json: field 'partial_rotary_factor' (%g) gives a rotary dim of %g for head_dim %d; "
                          "it must be even and in [2, head_dim]",
                          f, rd, c->head_dim);
    c->rotary_dim = (int)rd;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The vision tower
 */

/* An integer field of vision_config in [lo, hi]; `def` < 0 means required. */
static int vision_int(json_t *vc, const char *name, long long lo, long long hi, int def, int *out, squad_err *err) {
    json_t *v = json_object_get(vc, name);
    if (!v || json_is_null(v)) {
        if (def < 0) return squad_fail(err, SQUAD_E_MODEL, "config.json: missing field 'vision_config.%s'", name);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'vision_config.%s' must be an integer", name);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'vision_config.%s' = %lld is out of range [%lld, %lld]",
                          name, x, lo, hi);
    *out = (int)x;
    return 0;
}

/* A top-level token id (transformers' default when absent). It is not checked against the
 * vocabulary here: transformers itself saves configs whose default ids lie outside a small
 * vocabulary; whoever puts images into a row checks that the ids exist. */
static int vision_token_id(json_t *root, const char *name, int def, int *out, squad_err *err) {
    json_t *v = json_object_get(root, name);
    *out = def;
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > CFG_MAX_VOCAB)
            return squad_fail(err, SQUAD_E_MODEL, "config.json: field '%s' must be a token id", name);
        *out = (int)json_integer_value(v);
    }
    return 0;
}

/* The tower's 2D rotary: rope_parameters {"rope_type": "axial", "rope_theta": ...} (transformers
 * 5.x; theta 10000 when absent, as its Qwen3_5VisionRotaryEmbedding defaults). */
static int vision_rope(json_t *vc, squad_vision_config *v, squad_err *err) {
    v->rope_theta = SQUAD_VISION_DEFAULT_ROPE_THETA;
    json_t *rp = json_object_get(vc, "rope_parameters");
    if (!rp || json_is_null(rp)) return 0;
    if (!json_is_object(rp))
        return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'vision_config.rope_parameters' must be an object");
    json_t *t = json_object_get(rp, "rope_type");
    if (t && !json_is_null(t) &&
        (!json_is_string(t) || (strcmp(json_string_value(t), "axial") && strcmp(json_string_value(t), "default"))))
        return squad_fail(err, SQUAD_E_UNSUPPORTED,
                          "config.json: field 'vision_config.rope_parameters.rope_type' must be \"axial\"");
    if (json_object_get(rp, "rope_theta"))
        return obj_positive(rp, "rope_theta", "vision_config.rope_parameters.", &v->rope_theta, err);
    return 0;
}

static int cfg_vision(json_t *root, json_t *vc, squad_config *c, squad_err *err) {
    squad_vision_config *v = &c->vision;
    if (!json_is_object(vc)) return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'vision_config' must be an object");
    struct {
        const char *name;
        long long lo, hi;
        int def;
        int *out;
    } fields[] = {
        {"depth", 1, SQUAD_MAX_LAYERS, -1, &v->depth},
        {"hidden_size", 1, CFG_MAX_DIM, -1, &v->hidden_size},
        {"num_heads", 1, CFG_MAX_HEADS, -1, &v->num_heads},
        {"intermediate_size", 1, CFG_MAX_DIM, -1, &v->intermediate_size},
        {"out_hidden_size", 1, CFG_MAX_DIM, -1, &v->out_hidden_size},
        {"num_position_embeddings", 1, CFG_MAX_DIM, -1, &v->num_position_embeddings},
        {"patch_size", 1, 1024, 16, &v->patch_size},
        {"temporal_patch_size", 1, 64, 2, &v->temporal_patch_size},
        {"spatial_merge_size", 1, 64, 2, &v->spatial_merge_size},
        {"in_channels", 1, 16, 3, &v->in_channels},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (vision_int(vc, fields[i].name, fields[i].lo, fields[i].hi, fields[i].def, fields[i].out, err) != 0)
            return err->code;
    json_t *act = json_object_get(vc, "hidden_act");
    const char *a = act && !json_is_null(act) ? json_string_value(act) : "gelu_pytorch_tanh";
    if (a && (!strcmp(a, "gelu_pytorch_tanh") || !strcmp(a, "gelu_new")))
        v->hidden_act = SQUAD_VISION_ACT_GELU_TANH;
    else if (a && !strcmp(a, "gelu"))
        v->hidden_act = SQUAD_VISION_ACT_GELU_ERF;
    else
        return squad_fail(err, SQUAD_E_UNSUPPORTED,
                          "config.json: field 'vision_config.hidden_act' must be \"gelu_pytorch_tanh\" or \"gelu\"");
    json_t *deep = json_object_get(vc, "deepstack_visual_indexes");
    if (deep && !json_is_null(deep) && (!json_is_array(deep) || json_array_size(deep) != 0))
        return squad_fail(err, SQUAD_E_UNSUPPORTED,
                          "config.json: field 'vision_config.deepstack_visual_indexes' is not empty: DeepStack (Qwen3-VL) "
                          "is not supported, only Qwen3.5's tower without it");
    if (v->hidden_size % v->num_heads != 0 || (v->hidden_size / v->num_heads) % 4 != 0)
        return squad_fail(err, SQUAD_E_MODEL,
                          "config.json: field 'vision_config.hidden_size' (%d) must be num_heads (%d) x a head dim "
                          "that is a multiple of 4 (the 2D rotary)",
                          v->hidden_size, v->num_heads);
    v->head_dim = v->hidden_size / v->num_heads;
    int side = 0;
    while ((long long)(side + 1) * (side + 1) <= v->num_position_embeddings) side++;
    if (side * side != v->num_position_embeddings)
        return squad_fail(err, SQUAD_E_MODEL, "config.json: field 'vision_config.num_position_embeddings' = %d must be a square",
                          v->num_position_embeddings);
    v->position_grid_side = side;
    long long patch_width = (long long)v->in_channels * v->temporal_patch_size * v->patch_size * v->patch_size;
    long long merged_width = (long long)v->hidden_size * v->spatial_merge_size * v->spatial_merge_size;
    if (patch_width > CFG_MAX_PRODUCT || merged_width > CFG_MAX_PRODUCT || 3LL * v->hidden_size > CFG_MAX_PRODUCT)
        return squad_fail(err, SQUAD_E_MODEL, "config.json: the vision tower's patch or merge width is too large");
    if (v->out_hidden_size != c->hidden_size)
        return squad_fail(err, SQUAD_E_MODEL,
                          "config.json: field 'vision_config.out_hidden_size' = %d must equal the text hidden_size %d",
                          v->out_hidden_size, c->hidden_size);
    /* The image rows' positions split the text rotary's frequencies over (t, h, w). */
    int half = c->rotary_dim / 2;
    if (c->mrope_section[0] < 0 || c->mrope_interleaved < 0)
        return squad_fail(err, SQUAD_E_MODEL,
                          "config.json: field 'rope_parameters.mrope_section' must hold 3 integers (t, h, w) and "
                          "'mrope_interleaved' must be true or false");
    if (c->mrope_section[0] + c->mrope_section[1] + c->mrope_section[2] != half)
        return squad_fail(err, SQUAD_E_MODEL,
                          "config.json: field 'mrope_section' [%d, %d, %d] must add up to the rotary dim / 2 = %d",
                          c->mrope_section[0], c->mrope_section[1], c->mrope_section[2], half);
    if (vision_rope(vc, v, err) != 0 ||
        vision_token_id(root, "image_token_id", SQUAD_DEFAULT_IMAGE_TOKEN_ID, &c->image_token_id, err) ||
        vision_token_id(root, "vision_start_token_id", SQUAD_DEFAULT_VISION_START_TOKEN_ID, &c->vision_start_token_id,
                        err) ||
        vision_token_id(root, "vision_end_token_id", SQUAD_DEFAULT_VISION_END_TOKEN_ID, &c->vision_end_token_id, err))
        return err->code;
    c->has_vision = 1;
    return 0;
}

int squad_config_parse(squad_config *cfg, const char *text, size_t len, squad_err *err) {
    squad_err local;
    if (!err) err = &local; /* callers may pass NULL */
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return squad_fail(err, SQUAD_E_MODEL, "config.json: invalid JSON at line %d: %s", jerr.line, jerr.text);
    int rc = 0;
    cfg_src s = {NULL, root};
    if (!json_is_object(root)) {
        rc = squad_fail(err, SQUAD_E_MODEL, "config.json: the top level must be an object");
        goto done;
    }
    json_t *text_cfg = json_object_get(root, "text_config");
    if (text_cfg && !json_is_null(text_cfg)) {
        if (!json_is_object(text_cfg)) {
            rc = squad_fail(err, SQUAD_E_MODEL, "config.json: field 'text_config' must be an object");
            goto done;
        }
        s.text = text_cfg;
        cfg->nested = 1;
    }
    if ((rc = cfg_sizes(&s, cfg, err)) != 0) goto done;
    /* transformers' Qwen3.5 text rotary: section [11, 11, 10] by default, always interleaved. */
    cfg->mrope_section[0] = 11;
    cfg->mrope_section[1] = 11;
    cfg->mrope_section[2] = 10;
    cfg->mrope_interleaved = 1;

    json_t *eps = cfg_get(&s, "rms_norm_eps");
    double e;
    if (!eps) {
        rc = squad_fail(err, SQUAD_E_MODEL, "config.json: missing field 'rms_norm_eps'");
        goto done;
    }
    /* eps is used as a float: it must stay a positive normal float after the conversion. */
    if (json_number(eps, &e) != 0 || !(e >= FLT_MIN) || e > 1.0) {
        rc = squad_fail(err, SQUAD_E_MODEL, "config.json: field 'rms_norm_eps' must be a number in [%g, 1]",
                        (double)FLT_MIN);
        goto done;
    }
    cfg->rms_eps = (float)e;

    cfg->max_position = CFG_DEFAULT_MAX_POSITION;
    json_t *mp = cfg_get(&s, "max_position_embeddings");
    if (mp && (rc = cfg_int(&s, "max_position_embeddings", 1, INT32_MAX, &cfg->max_position, err)) != 0) goto done;

    if ((rc = cfg_tie(&s, cfg, err)) != 0) goto done;
    if ((rc = cfg_rope(&s, cfg, err)) != 0) goto done;
    if ((rc = cfg_layer_types(&s, cfg, err)) != 0) goto done;
    if ((rc = cfg_consistency(cfg, err)) != 0) goto done;
    json_t *vision = json_object_get(root, "vision_config");
    if (vision && !json_is_null(vision)) rc = cfg_vision(root, vision, cfg, err);
done:
    json_decref(root);
    return rc;
}

int squad_config_load(squad_config *cfg, const char *path, squad_err *err) {
    squad_err local;
    if (!err) err = &local; /* callers may pass NULL */
    size_t len = 0;
    char *text = squad_read_file(path, &len, err);
    if (!text) return err->code;
    int rc = squad_config_parse(cfg, text, len, err);
    free(text);
    if (rc != 0) {
        /* Messages start with "config.json: "; name the actual path instead. */
        if (!strncmp(err->msg, "config.json: ", 13)) {
            memmove(err->msg, err->msg + 13, strlen(err->msg + 13) + 1);
            squad_fail_context(err, "%s: ", path);
        }
    }
    return rc;
}
