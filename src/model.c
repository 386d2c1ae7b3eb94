/*
 * model.c — loads a Hugging Face Qwen3.5 checkpoint directory: config.json, the safetensors set,
 * and the binding of every weight by its Hugging Face name (see model.h).
 *
 * Design:
 *  - The layout is recognised by the embedding's name: "model.embed_tokens.weight"
 *    (Qwen3_5ForCausalLM) or "model.language_model.embed_tokens.weight"
 *    (Qwen3_5ForConditionalGeneration); lm_head.weight is top level in both. mtp.* is never looked
 *    at; model.visual.* only when the config has a vision tower (vision_model.c binds it).
 *  - Every tensor's shape is checked against the configuration; a missing tensor or a wrong shape is
 *    an error naming the tensor and the shape the config implies. A tensor under the text model's
 *    prefix that the architecture does not have (a bias, an expert...) is an error too: silently
 *    ignoring it would compute a different model.
 *  - Matrices stay bf16. A bf16 tensor is used in place inside the read-only map (zero copy); an
 *    F16 / F32 one (or a bf16 one at an odd address) is converted once into an owned buffer.
 *    Vectors and conv weights become owned fp32 arrays. Every owned buffer is recorded in m->owned
 *    and freed with the model.
 */
#define _POSIX_C_SOURCE 200809L
#include "model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util.h"

#define PREFIX_CAUSAL "model."
#define PREFIX_CONDITIONAL "model.language_model."
#define NAME_MAX_LEN 256

/* ---------------------------------------------------------------------------------------------
 * Owned buffers
 */

/* A zeroed, 64-byte aligned buffer recorded in m->owned. */
static void *owned_alloc(squad_model *m, size_t bytes, squad_err *err) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **grown = realloc(m->owned, (size_t)cap * sizeof *grown);
        if (!grown) {
            squad_fail(err, SQUAD_E_NOMEM, "out of memory (model buffer list)");
            return NULL;
        }
        m->owned = grown;
        m->cap_owned = cap;
    }
    void *p = squad_aligned_alloc(bytes, err);
    if (p) m->owned[m->n_owned++] = p;
    return p;
}

/* ---------------------------------------------------------------------------------------------
 * Element conversion (reads through memcpy: tensors in a map need not be aligned)
 */

static float element_f32(const st_tensor *t, size_t i) {
    const uint8_t *p = t->data;
    if (t->dtype == ST_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t->dtype == ST_BF16 ? squad_bf16_to_f32(h) : squad_f16_to_f32(h);
}

/* ---------------------------------------------------------------------------------------------
 * Tensor lookup and checks
 */

static void format_shape(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && k < cap; d++) k += (size_t)snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* Finds name with exactly the expected shape and a supported dtype. */
static const st_tensor *find_checked(const squad_model *m, const char *name, const int64_t *shape, int ndim,
                                     squad_err *err) {
    char want[128], got[128];
    format_shape(want, sizeof want, shape, ndim);
    const st_tensor *t = st_set_find(&m->files, name);
    if (!t) {
        squad_fail(err, SQUAD_E_MODEL, "missing tensor '%s' (expected shape %s)", name, want);
        return NULL;
    }
    int same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        format_shape(got, sizeof got, t->shape, t->ndim);
        squad_fail(err, SQUAD_E_MODEL, "tensor '%s' has shape %s; the config needs %s", name, got, want);
        return NULL;
    }
    if (t->dtype == ST_OTHER) {
        squad_fail(err, SQUAD_E_UNSUPPORTED, "tensor '%s' has dtype %s; only BF16, F16 and F32 are supported", name,
                   t->dtype_name);
        return NULL;
    }
    return t;
}

/* A matrix as bf16, shape[0] rows by the product of the other dims: in place when possible, else
 * converted once. */
static int bind_matrix_nd(squad_model *m, const char *name, const int64_t *shape, int ndim, squad_mat *out,
                          squad_err *err) {
    const st_tensor *t = find_checked(m, name, shape, ndim, err);
    if (!t) return err->code;
    int64_t cols = 1;
    for (int d = 1; d < ndim; d++) cols *= shape[d];
    out->rows = (int)shape[0];
    out->cols = (int)cols;
    if (t->dtype == ST_BF16 && ((uintptr_t)t->data & 1) == 0) {
        out->w = t->data;
        return 0;
    }
    size_t n = (size_t)shape[0] * (size_t)cols;
    uint16_t *w = owned_alloc(m, n * sizeof *w, err);
    if (!w) return squad_fail_context(err, "converting '%s': ", name);
    if (t->dtype == ST_BF16)
        memcpy(w, t->data, n * sizeof *w);
    else
        for (size_t i = 0; i < n; i++) w[i] = squad_f32_to_bf16(element_f32(t, i));
    out->w = w;
    return 0;
}

/* A [rows][cols] matrix as bf16. */
static int bind_matrix(squad_model *m, const char *name, int rows, int cols, squad_mat *out, squad_err *err) {
    int64_t shape[2] = {rows, cols};
    return bind_matrix_nd(m, name, shape, 2, out, err);
}

/* A tensor of the given shape converted to an owned fp32 array. */
static int bind_floats(squad_model *m, const char *name, const int64_t *shape, int ndim, float **out, squad_err *err) {
    const st_tensor *t = find_checked(m, name, shape, ndim, err);
    if (!t) return err->code;
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
    float *v = owned_alloc(m, n * sizeof *v, err);
    if (!v) return squad_fail_context(err, "converting '%s': ", name);
    for (size_t i = 0; i < n; i++) v[i] = element_f32(t, i);
    *out = v;
    return 0;
}

static int bind_vector(squad_model *m, const char *name, int n, float **out, squad_err *err) {
    int64_t shape[1] = {n};
    return bind_floats(m, name, shape, 1, out, err);
}

/* ---------------------------------------------------------------------------------------------
 * Layers
 */

typedef struct bind_ctx {
    squad_model *m;
    const char *prefix; /* "model." or "model.language_model." */
    int layer;
    char name[NAME_MAX_LEN];
} bind_ctx;

static const char *layer_name(bind_ctx *b, const char *suffix) {
    snprintf(b->name, sizeof b->name, "%slayers.%d.%s", b->prefix, b->layer, suffix);
    return b->name;
}

static int layer_matrix(bind_ctx *b, const char *suffix, int rows, int cols, squad_mat *out, squad_err *err) {
    return bind_matrix(b->m, layer_name(b, suffix), rows, cols, out, err);
}

static int layer_vector(bind_ctx *b, const char *suffix, int n, float **out, squad_err *err) {
    return bind_vector(b->m, layer_name(b, suffix), n, out, err);
}

static int bind_gdn(bind_ctx *b, squad_layer_weights *L, squad_err *err) {
    const squad_config *c = &b->m->cfg;
    int H = c->hidden_size, nv = c->lin_num_v_heads, dv = c->lin_v_dim;
    int C = squad_config_gdn_channels(c);
    if (layer_matrix(b, "linear_attn.in_proj_qkv.weight", C, H, &L->in_qkv, err) ||
        layer_matrix(b, "linear_attn.in_proj_z.weight", nv * dv, H, &L->in_z, err) ||
        layer_matrix(b, "linear_attn.in_proj_b.weight", nv, H, &L->in_b, err) ||
        layer_matrix(b, "linear_attn.in_proj_a.weight", nv, H, &L->in_a, err) ||
        layer_matrix(b, "linear_attn.out_proj.weight", H, nv * dv, &L->out_proj, err) ||
        layer_vector(b, "linear_attn.A_log", nv, &L->A_log, err) ||
        layer_vector(b, "linear_attn.dt_bias", nv, &L->dt_bias, err) ||
        layer_vector(b, "linear_attn.norm.weight", dv, &L->gdn_norm, err))
        return err->code;
    int64_t conv_shape[3] = {C, 1, c->conv_kernel}; /* depthwise Conv1d: [channels, 1, kernel] */
    return bind_floats(b->m, layer_name(b, "linear_attn.conv1d.weight"), conv_shape, 3, &L->conv_w, err);
}

static int bind_attention(bind_ctx *b, squad_layer_weights *L, squad_err *err) {
    const squad_config *c = &b->m->cfg;
    int H = c->hidden_size, nh = c->num_heads, nkv = c->num_kv_heads, hd = c->head_dim;
    if (layer_matrix(b, "self_attn.q_proj.weight", nh * 2 * hd, H, &L->q_proj, err) ||
        layer_matrix(b, "self_attn.k_proj.weight", nkv * hd, H, &L->k_proj, err) ||
        layer_matrix(b, "self_attn.v_proj.weight", nkv * hd, H, &L->v_proj, err) ||
        layer_matrix(b, "self_attn.o_proj.weight", H, nh * hd, &L->o_proj, err) ||
        layer_vector(b, "self_attn.q_norm.weight", hd, &L->q_norm, err) ||
        layer_vector(b, "self_attn.k_norm.weight", hd, &L->k_norm, err))
        return err->code;
    return 0;
}

static int bind_layer(bind_ctx *b, squad_err *err) {
    const squad_config *c = &b->m->cfg;
    squad_layer_weights *L = &b->m->layers[b->layer];
    int H = c->hidden_size, I = c->intermediate_size;
    L->kind = c->layer_types[b->layer];
    if (layer_vector(b, "input_layernorm.weight", H, &L->input_norm, err) ||
        layer_vector(b, "post_attention_layernorm.weight", H, &L->post_norm, err) ||
        layer_matrix(b, "mlp.gate_proj.weight", I, H, &L->mlp_gate, err) ||
        layer_matrix(b, "mlp.up_proj.weight", I, H, &L->mlp_up, err) ||
        layer_matrix(b, "mlp.down_proj.weight", H, I, &L->mlp_down, err))
        return err->code;
    return L->kind == SQUAD_LAYER_LINEAR ? bind_gdn(b, L, err) : bind_attention(b, L, err);
}

/* ---------------------------------------------------------------------------------------------
 * Unexpected tensors
 */

static const char *const LAYER_COMMON[] = {"input_layernorm.weight", "post_attention_layernorm.weight",
                                           "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
static const char *const LAYER_GDN[] = {
    "linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight", "linear_attn.in_proj_b.weight",
    "linear_attn.in_proj_a.weight",   "linear_attn.out_proj.weight",  "linear_attn.conv1d.weight",
    "linear_attn.A_log",              "linear_attn.dt_bias",          "linear_attn.norm.weight"};
static const char *const LAYER_ATTN[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                         "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                         "self_attn.q_norm.weight", "self_attn.k_norm.weight"};

static int in_list(const char *s, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s, list[i])) return 1;
    return 0;
}

/* Whether rest (a name with the text-model prefix removed) is a weight this model binds. */
static int is_known_weight(const squad_config *c, const char *rest) {
    if (!strcmp(rest, "embed_tokens.weight") || !strcmp(rest, "norm.weight")) return 1;
    if (strncmp(rest, "layers.", 7) != 0) return 0;
    const char *p = rest + 7;
    int layer = 0, digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 4) layer = layer * 10 + (*p++ - '0'), digits++;
    if (!digits || *p != '.' || layer >= c->num_layers || (digits > 1 && rest[7] == '0')) return 0;
    p++;
    if (in_list(p, LAYER_COMMON, sizeof LAYER_COMMON / sizeof LAYER_COMMON[0])) return 1;
    if (c->layer_types[layer] == SQUAD_LAYER_LINEAR) return in_list(p, LAYER_GDN, sizeof LAYER_GDN / sizeof LAYER_GDN[0]);
    return in_list(p, LAYER_ATTN, sizeof LAYER_ATTN / sizeof LAYER_ATTN[0]);
}

/* Any tensor under the text model's prefix that is not a known weight is an error. */
static int check_no_unknown(const squad_model *m, const char *prefix, squad_err *err) {
    size_t plen = strlen(prefix);
    for (size_t i = 0; i < m->files.n_slots; i++) {
        const st_tensor *t = m->files.slots[i];
        if (!t || strncmp(t->name, prefix, plen) != 0) continue;
        const char *rest = t->name + plen;
        /* Under "model." the vision tower and the conditional layout's own prefix are not ours. */
        if (!strcmp(prefix, PREFIX_CAUSAL) && (!strncmp(rest, "visual.", 7) || !strncmp(rest, "language_model.", 15)))
            continue;
        if (!is_known_weight(&m->cfg, rest))
            return squad_fail(err, SQUAD_E_MODEL,
                              "unexpected tensor '%.200s': not part of the Qwen3.5 text model this config describes",
                              t->name);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Binding and loading
 */

int squad_model_bind(squad_model *m, squad_err *err) {
    squad_err local;
    if (!err) err = &local;
    const squad_config *c = &m->cfg;
    const char *prefix;
    if (st_set_find(&m->files, PREFIX_CONDITIONAL "embed_tokens.weight"))
        prefix = PREFIX_CONDITIONAL;
    else if (st_set_find(&m->files, PREFIX_CAUSAL "embed_tokens.weight"))
        prefix = PREFIX_CAUSAL;
    else
        return squad_fail(err, SQUAD_E_MODEL,
                          "missing tensor 'model.embed_tokens.weight' (or 'model.language_model.embed_tokens.weight'), "
                          "expected shape [%d, %d]",
                          c->vocab_size, c->hidden_size);
    char name[NAME_MAX_LEN];
    snprintf(name, sizeof name, "%sembed_tokens.weight", prefix);
    if (bind_matrix(m, name, c->vocab_size, c->hidden_size, &m->embed, err) != 0) return err->code;
    snprintf(name, sizeof name, "%snorm.weight", prefix);
    if (bind_vector(m, name, c->hidden_size, &m->final_norm, err) != 0) return err->code;
    if (c->tie_embeddings) {
        m->lm_head = m->embed; /* a stored lm_head.weight is ignored, as transformers does */
    } else if (bind_matrix(m, "lm_head.weight", c->vocab_size, c->hidden_size, &m->lm_head, err) != 0) {
        return squad_fail_context(err, "tie_word_embeddings is false: ");
    }
    bind_ctx b = {.m = m, .prefix = prefix};
    for (b.layer = 0; b.layer < c->num_layers; b.layer++)
        if (bind_layer(&b, err) != 0) return err->code;
    if (check_no_unknown(m, prefix, err) != 0) return err->code;
    return c->has_vision ? squad_vision_bind(m, err) : 0;
}

int squad_model_dir_check(const char *dir, squad_err *err) {
    struct stat st;
    if (stat(dir, &st) != 0) return squad_fail(err, SQUAD_E_MODEL, "model directory %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return squad_fail(err, SQUAD_E_MODEL, "model directory %s: not a directory", dir);
    return 0;
}

int squad_model_bind_matrix_nd(squad_model *m, const char *name, const int64_t *shape, int ndim, squad_mat *out,
                               squad_err *err) {
    return bind_matrix_nd(m, name, shape, ndim, out, err);
}

int squad_model_bind_floats(squad_model *m, const char *name, const int64_t *shape, int ndim, float **out,
                            squad_err *err) {
    return bind_floats(m, name, shape, ndim, out, err);
}

void *squad_model_owned_alloc(squad_model *m, size_t bytes, squad_err *err) { return owned_alloc(m, bytes, err); }

/* The file names transformers' AutoImageProcessor reads the processor from, in its order. */
static const char *const IMAGE_PROC_FILES[] = {"preprocessor_config.json", "processor_config.json"};

int squad_model_load_image_proc(squad_model *m, const char *dir, squad_err *err) {
    m->has_image_proc = 0;
    if (!m->cfg.has_vision) return 0;
    for (size_t i = 0; i < sizeof IMAGE_PROC_FILES / sizeof IMAGE_PROC_FILES[0]; i++) {
        char *path = squad_path_join(dir, IMAGE_PROC_FILES[i], err);
        if (!path) return SQUAD_E_NOMEM;
        struct stat st;
        if (stat(path, &st) != 0) {
            free(path);
            continue;
        }
        int rc = squad_image_proc_config_load(&m->image_proc, path, err);
        free(path);
        if (rc) return rc;
        const squad_vision_config *v = &m->cfg.vision;
        const squad_image_proc_config *p = &m->image_proc;
        if (p->patch_size != v->patch_size || p->temporal_patch_size != v->temporal_patch_size ||
            p->merge_size != v->spatial_merge_size)
            return squad_fail(err, SQUAD_E_MODEL,
                              "%s/%s: patch %d, temporal patch %d, merge %d, but the vision tower's are %d, %d, %d", dir,
                              IMAGE_PROC_FILES[i], p->patch_size, p->temporal_patch_size, p->merge_size, v->patch_size,
                              v->temporal_patch_size, v->spatial_merge_size);
        m->has_image_proc = 1;
        return 0;
    }
    return 0;
}

squad_model *squad_model_load(const char *dir, squad_err *err) {
    squad_err local;
    if (!err) err = &local;
    if (squad_model_dir_check(dir, err) != 0) return NULL;
    squad_model *m = squad_calloc(1, sizeof *m, err);
    if (!m) return NULL;
    char *cfg_path = NULL;
    int rc = SQUAD_E_NOMEM;
    if (!(m->dir = squad_strdup(dir, err)) || !(cfg_path = squad_path_join(dir, "config.json", err))) goto fail;
    if ((rc = squad_config_load(&m->cfg, cfg_path, err)) != 0) goto fail;
    if ((rc = st_set_open_dir(&m->files, dir, err)) != 0) goto fail;
    if ((rc = squad_model_bind(m, err)) != 0) {
        squad_fail_context(err, "%s: ", dir);
        goto fail;
    }
    if ((rc = squad_model_load_image_proc(m, dir, err)) != 0) goto fail;
    free(cfg_path);
    return m;
fail:
    /* Whatever went wrong, a model that cannot be loaded is a model error for the caller. */
    if (rc != SQUAD_E_NOMEM) err->code = SQUAD_E_MODEL;
    free(cfg_path);
    squad_model_free(m);
    return NULL;
}

void squad_model_free(squad_model *m) {
    if (!m) return;
    st_set_close(&m->files);
    for (int i = 0; i < m->n_owned; i++) squad_aligned_free(m->owned[i]);
    free(m->owned);
    free(m->dir);
    free(m);
}

int squad_model_vocab_size(const squad_model *m) { return m->cfg.vocab_size; }

int squad_model_max_tokens(const squad_model *m) { return m->cfg.max_position; }
