/*
 * specialists.c — loading and validating a specialists directory, the router as a pure function,
 * and the reference LoRA application (see specialists.h).
 *
 * Design:
 *  - squad-specialists.json is read field by field; an unknown field is refused (a typo must not
 *    turn into a default). The router file must hold exactly `weight` [R, H] and `bias` [R].
 *  - An adapter is checked in two halves. adapter_config.json: peft_type LORA, r, lora_alpha,
 *    use_rslora, and every option that would change what the adapter computes (use_dora, bias,
 *    modules_to_save, rank_pattern, alpha_pattern, fan_in_fan_out, ...) must be at its neutral
 *    value; target_modules, when a list, may only name projections squad adapts. Then every tensor
 *    of adapter_model.safetensors is mapped to (layer, projection, A or B) under either checkpoint
 *    layout; a tensor that maps to nothing is an error, never skipped.
 *  - Messages start with "specialist 'LABEL' (DIR): " and name the tensor or field, so the user
 *    sees which adapter and what to fix.
 */
#include "specialists.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model.h"
#include "safetensors.h"
#include "util.h"

/* ---------------------------------------------------------------------------------------------
 * Projections
 */

typedef struct proj_info {
    const char *module; /* path inside a decoder layer */
    const char *name;   /* its last component, as target_modules names it */
    int layer_kind;     /* SQUAD_LAYER_LINEAR / SQUAD_LAYER_FULL, or -1: every layer */
} proj_info;

static const proj_info PROJS[SQUAD_PROJ_COUNT] = {
    [SQUAD_PROJ_IN_QKV] = {"linear_attn.in_proj_qkv", "in_proj_qkv", SQUAD_LAYER_LINEAR},
    [SQUAD_PROJ_IN_Z] = {"linear_attn.in_proj_z", "in_proj_z", SQUAD_LAYER_LINEAR},
    [SQUAD_PROJ_IN_B] = {"linear_attn.in_proj_b", "in_proj_b", SQUAD_LAYER_LINEAR},
    [SQUAD_PROJ_IN_A] = {"linear_attn.in_proj_a", "in_proj_a", SQUAD_LAYER_LINEAR},
    [SQUAD_PROJ_OUT] = {"linear_attn.out_proj", "out_proj", SQUAD_LAYER_LINEAR},
    [SQUAD_PROJ_Q] = {"self_attn.q_proj", "q_proj", SQUAD_LAYER_FULL},
    [SQUAD_PROJ_K] = {"self_attn.k_proj", "k_proj", SQUAD_LAYER_FULL},
    [SQUAD_PROJ_V] = {"self_attn.v_proj", "v_proj", SQUAD_LAYER_FULL},
    [SQUAD_PROJ_O] = {"self_attn.o_proj", "o_proj", SQUAD_LAYER_FULL},
    [SQUAD_PROJ_GATE] = {"mlp.gate_proj", "gate_proj", -1},
    [SQUAD_PROJ_UP] = {"mlp.up_proj", "up_proj", -1},
    [SQUAD_PROJ_DOWN] = {"mlp.down_proj", "down_proj", -1},
};

const char *squad_proj_module(int proj) { return proj >= 0 && proj < SQUAD_PROJ_COUNT ? PROJS[proj].module : NULL; }

int squad_proj_shape(const squad_config *c, int layer, int proj, int *out, int *in) {
    if (layer < 0 || layer >= c->num_layers || proj < 0 || proj >= SQUAD_PROJ_COUNT) return -1;
    if (PROJS[proj].layer_kind >= 0 && PROJS[proj].layer_kind != c->layer_types[layer]) return -1;
    int H = c->hidden_size, I = c->intermediate_size;
    int nvdv = c->lin_num_v_heads * c->lin_v_dim, nv = c->lin_num_v_heads;
    int nh = c->num_heads, nkv = c->num_kv_heads, hd = c->head_dim;
    int o = 0, i = H;
    switch ((squad_proj_id)proj) {
    case SQUAD_PROJ_IN_QKV: o = squad_config_gdn_channels(c); break;
    case SQUAD_PROJ_IN_Z: o = nvdv; break;
    case SQUAD_PROJ_IN_B:
    case SQUAD_PROJ_IN_A: o = nv; break;
    case SQUAD_PROJ_OUT: o = H, i = nvdv; break;
    case SQUAD_PROJ_Q: o = nh * 2 * hd; break;
    case SQUAD_PROJ_K:
    case SQUAD_PROJ_V: o = nkv * hd; break;
    case SQUAD_PROJ_O: o = H, i = nh * hd; break;
    case SQUAD_PROJ_GATE:
    case SQUAD_PROJ_UP: o = I; break;
    case SQUAD_PROJ_DOWN: o = H, i = I; break;
    default: return -1;
    }
    *out = o;
    *in = i;
    return 0;
}

/* The projection whose last module-name component is `name` (as target_modules lists it), or -1. */
static int proj_by_name(const char *name, size_t len) {
    for (int p = 0; p < SQUAD_PROJ_COUNT; p++)
        if (strlen(PROJS[p].name) == len && !strncmp(PROJS[p].name, name, len)) return p;
    return -1;
}

static void proj_name_list(char *buf, size_t cap) {
    buf[0] = 0;
    for (int p = 0; p < SQUAD_PROJ_COUNT; p++) {
        strncat(buf, p ? ", " : "", cap - strlen(buf) - 1);
        strncat(buf, PROJS[p].name, cap - strlen(buf) - 1);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Errors
 */

/* Fails with "specialist 'LABEL' (DIR): " + the formatted message. */
static int adapter_fail(squad_err *err, int code, const squad_adapter *a, const char *fmt, ...) SQUAD_PRINTF(4, 5);
static int adapter_fail(squad_err *err, int code, const squad_adapter *a, const char *fmt, ...) {
    char msg[SQUAD_ERR_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return squad_fail(err, code, "specialist '%s' (%s): %s", a->label, a->dir, msg);
}

/* ---------------------------------------------------------------------------------------------
 * Tensors
 */

static size_t tensor_elems(const st_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

/* Converts a BF16 / F16 / F32 tensor to a new fp32 array; refuses other dtypes and non-finite
 * values. what names the tensor in messages (the caller adds the adapter or file). */
static float *tensor_f32(const st_tensor *t, const char *what, squad_err *err) {
    if (t->dtype == ST_OTHER) {
        squad_fail(err, SQUAD_E_MODEL, "tensor '%s' has dtype %s (BF16, F16 or F32 expected)", what, t->dtype_name);
        return NULL;
    }
    size_t n = tensor_elems(t);
    float *o = squad_malloc((n ? n : 1) * sizeof *o, err);
    if (!o) return NULL;
    for (size_t i = 0; i < n; i++) {
        float v;
        if (t->dtype == ST_F32) {
            memcpy(&v, (const char *)t->data + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const char *)t->data + 2 * i, 2);
            v = t->dtype == ST_BF16 ? squad_bf16_to_f32(h) : squad_f16_to_f32(h);
        }
        if (!isfinite(v)) {
            squad_fail(err, SQUAD_E_MODEL, "tensor '%s' holds a non-finite value at element %zu", what, i);
            free(o);
            return NULL;
        }
        o[i] = v;
    }
    return o;
}

static void shape_str(const st_tensor *t, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* ---------------------------------------------------------------------------------------------
 * Adapter keys
 */

/* The two checkpoint layouts' prefixes of a decoder layer, as peft saves them. */
static const char *const KEY_PREFIXES[] = {
    "base_model.model.model.layers.",
    "base_model.model.model.language_model.layers.",
};
#define PEFT_MODEL_PREFIX "base_model.model."

typedef struct lora_key {
    int layer;
    int proj;
    int is_b;
} lora_key;

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Maps a tensor name to (layer, projection, A / B). On failure returns -1 and writes why into
 * why (a phrase that follows the tensor's name). */
static int parse_lora_key(const char *name, int n_layers, lora_key *k, char *why, size_t cap) {
    if (strstr(name, "lora_magnitude_vector")) {
        snprintf(why, cap, "is a DoRA magnitude vector (DoRA is not supported)");
        return -1;
    }
    if (strstr(name, "lora_embedding_")) {
        snprintf(why, cap, "is an embedding LoRA (squad adapts the decoder layers' projections only)");
        return -1;
    }
    if (strstr(name, ".lora_") && has_suffix(name, ".bias")) {
        snprintf(why, cap, "is a LoRA bias (not supported)");
        return -1;
    }
    const char *rest = NULL;
    for (size_t i = 0; i < sizeof KEY_PREFIXES / sizeof KEY_PREFIXES[0] && !rest; i++)
        if (!strncmp(name, KEY_PREFIXES[i], strlen(KEY_PREFIXES[i]))) rest = name + strlen(KEY_PREFIXES[i]);
    if (!rest) {
        snprintf(why, cap, "is not a LoRA tensor of a decoder layer (squad would drop it)");
        return -1;
    }
    int layer = 0, digits = 0;
    while (*rest >= '0' && *rest <= '9' && digits < 6) layer = layer * 10 + (*rest++ - '0'), digits++;
    if (digits == 0 || *rest != '.' || (digits > 1 && rest[-digits] == '0')) {
        snprintf(why, cap, "has no valid layer index (squad would drop it)");
        return -1;
    }
    rest++;
    if (layer >= n_layers) {
        snprintf(why, cap, "names layer %d but the model has %d layers", layer, n_layers);
        return -1;
    }
    int is_b;
    size_t mod_len;
    if (has_suffix(rest, ".lora_A.weight")) {
        is_b = 0, mod_len = strlen(rest) - strlen(".lora_A.weight");
    } else if (has_suffix(rest, ".lora_B.weight")) {
        is_b = 1, mod_len = strlen(rest) - strlen(".lora_B.weight");
    } else {
        snprintf(why, cap, "is not a lora_A.weight or lora_B.weight tensor (squad would drop it)");
        return -1;
    }
    for (int p = 0; p < SQUAD_PROJ_COUNT; p++) {
        if (strlen(PROJS[p].module) == mod_len && !strncmp(rest, PROJS[p].module, mod_len)) {
            k->layer = layer, k->proj = p, k->is_b = is_b;
            return 0;
        }
    }
    char list[256];
    proj_name_list(list, sizeof list);
    snprintf(why, cap, "adapts module '%.*s', which squad does not adapt (projections: %s)", (int)(mod_len > 80 ? 80 : mod_len),
             rest, list);
    return -1;
}

/* The module path of a LoRA tensor as peft matches target_modules ("model.layers.4.mlp.down_proj"). */
static void module_path(const char *name, char *buf, size_t cap) {
    const char *s = name + strlen(PEFT_MODEL_PREFIX);
    size_t n = strlen(s) - strlen(".lora_A.weight");
    if (n >= cap) n = cap - 1;
    memcpy(buf, s, n);
    buf[n] = 0;
}

/* Whether a list of target_modules names the module at path (peft: equal, or a suffix after a dot). */
static int targets_match(json_t *targets, const char *path) {
    size_t i;
    json_t *v;
    json_array_foreach(targets, i, v) {
        const char *t = json_string_value(v);
        size_t n = strlen(path), m = strlen(t);
        if (!strcmp(path, t) || (n > m && path[n - m - 1] == '.' && !strcmp(path + n - m, t))) return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * adapter_config.json
 */

/* A field that must be absent or at a neutral value: its name and what the neutral values are. */
static int is_neutral(json_t *v) {
    if (!v || json_is_null(v) || json_is_false(v)) return 1;
    if (json_is_array(v)) return json_array_size(v) == 0;
    if (json_is_object(v)) return json_object_size(v) == 0;
    return 0;
}

/* Options that change what an adapter computes; squad implements none of them. */
static const struct {
    const char *field;
    const char *what;
} UNSUPPORTED_OPTIONS[] = {
    {"use_dora", "DoRA"},
    {"modules_to_save", "modules_to_save (fully trained copies of base modules)"},
    {"rank_pattern", "per-module ranks"},
    {"alpha_pattern", "per-module alphas"},
    {"fan_in_fan_out", "fan_in_fan_out (transposed weights)"},
    {"lora_bias", "a LoRA bias"},
    {"layer_replication", "layer replication"},
    {"trainable_token_indices", "trainable token embeddings"},
    {"alora_invocation_tokens", "activated LoRA"},
    {"target_parameters", "LoRA on parameters"},
    {"use_qalora", "QA-LoRA"},
};

static int read_adapter_config(squad_adapter *a, json_t *root, json_t **targets_list, squad_err *err) {
    *targets_list = NULL;
    if (!json_is_object(root)) return adapter_fail(err, SQUAD_E_MODEL, a, "%s is not a JSON object", SQUAD_ADAPTER_CONFIG_FILE);
    json_t *v = json_object_get(root, "peft_type");
    if (v && !(json_is_string(v) && !strcmp(json_string_value(v), "LORA")))
        return adapter_fail(err, SQUAD_E_UNSUPPORTED, a, "%s: field 'peft_type' is not \"LORA\"", SQUAD_ADAPTER_CONFIG_FILE);
    for (size_t i = 0; i < sizeof UNSUPPORTED_OPTIONS / sizeof UNSUPPORTED_OPTIONS[0]; i++)
        if (!is_neutral(json_object_get(root, UNSUPPORTED_OPTIONS[i].field)))
            return adapter_fail(err, SQUAD_E_UNSUPPORTED, a, "%s: field '%s' asks for %s, which squad does not implement",
                                SQUAD_ADAPTER_CONFIG_FILE, UNSUPPORTED_OPTIONS[i].field, UNSUPPORTED_OPTIONS[i].what);
    v = json_object_get(root, "bias");
    if (v && !(json_is_string(v) && !strcmp(json_string_value(v), "none")))
        return adapter_fail(err, SQUAD_E_UNSUPPORTED, a, "%s: field 'bias' is not \"none\" (LoRA biases are not supported)",
                            SQUAD_ADAPTER_CONFIG_FILE);
    v = json_object_get(root, "r");
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > SQUAD_LORA_MAX_RANK)
        return adapter_fail(err, SQUAD_E_MODEL, a, "%s: field 'r' must be an integer in [1, %d]", SQUAD_ADAPTER_CONFIG_FILE,
                            SQUAD_LORA_MAX_RANK);
    a->r = (int)json_integer_value(v);
    v = json_object_get(root, "lora_alpha");
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return adapter_fail(err, SQUAD_E_MODEL, a, "%s: field 'lora_alpha' must be a number", SQUAD_ADAPTER_CONFIG_FILE);
    a->alpha = json_number_value(v);
    v = json_object_get(root, "use_rslora");
    if (v && !json_is_boolean(v))
        return adapter_fail(err, SQUAD_E_MODEL, a, "%s: field 'use_rslora' must be true or false", SQUAD_ADAPTER_CONFIG_FILE);
    a->rslora = v && json_is_true(v);
    a->scale = (float)(a->rslora ? a->alpha / sqrt((double)a->r) : a->alpha / (double)a->r);

    v = json_object_get(root, "target_modules");
    if (json_is_array(v)) {
        if (json_array_size(v) == 0)
            return adapter_fail(err, SQUAD_E_MODEL, a, "%s: field 'target_modules' is empty", SQUAD_ADAPTER_CONFIG_FILE);
        size_t i;
        json_t *t;
        json_array_foreach(v, i, t) {
            const char *s = json_string_value(t);
            if (!s || !s[0])
                return adapter_fail(err, SQUAD_E_MODEL, a, "%s: target_modules[%zu] is not a non-empty string",
                                    SQUAD_ADAPTER_CONFIG_FILE, i);
            const char *last = strrchr(s, '.');
            last = last ? last + 1 : s;
            if (proj_by_name(last, strlen(last)) < 0) {
                char list[256];
                proj_name_list(list, sizeof list);
                return adapter_fail(err, SQUAD_E_UNSUPPORTED, a,
                                    "%s: target_modules names '%.80s', which squad does not adapt (projections: %s)",
                                    SQUAD_ADAPTER_CONFIG_FILE, s, list);
            }
        }
        *targets_list = v;
    } else if (!json_is_string(v)) {
        /* a string is a regular expression (or "all-linear"): the tensors themselves are checked */
        return adapter_fail(err, SQUAD_E_MODEL, a, "%s: field 'target_modules' must be a list or a string",
                            SQUAD_ADAPTER_CONFIG_FILE);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * adapter_model.safetensors
 */

static int read_adapter_tensors(squad_adapter *a, const squad_config *cfg, int split, json_t *targets,
                                const st_file *f, squad_err *err) {
    char why[384];
    const char *layout = KEY_PREFIXES[0]; /* the key layout of the tensors, for names of missing ones */
    if (f->n_tensors == 0)
        return adapter_fail(err, SQUAD_E_MODEL, a, "%s holds no tensors", SQUAD_ADAPTER_WEIGHTS_FILE);
    for (int i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        lora_key k;
        if (parse_lora_key(t->name, cfg->num_layers, &k, why, sizeof why) != 0)
            return adapter_fail(err, SQUAD_E_UNSUPPORTED, a, "tensor '%s' %s", t->name, why);
        if (!strncmp(t->name, KEY_PREFIXES[1], strlen(KEY_PREFIXES[1]))) layout = KEY_PREFIXES[1];
        int out, in;
        if (squad_proj_shape(cfg, k.layer, k.proj, &out, &in) != 0)
            return adapter_fail(err, SQUAD_E_MODEL, a, "tensor '%s': layer %d is a %s layer and has no %s", t->name,
                                k.layer, cfg->layer_types[k.layer] == SQUAD_LAYER_FULL ? "full-attention" : "Gated DeltaNet",
                                PROJS[k.proj].module);
        if (k.layer < split)
            return adapter_fail(err, SQUAD_E_MODEL, a,
                                "tensor '%s' adapts layer %d, below split %d (the layers below split are shared by "
                                "every route)",
                                t->name, k.layer, split);
        if (targets) {
            char path[256];
            module_path(t->name, path, sizeof path);
            if (!targets_match(targets, path))
                return adapter_fail(err, SQUAD_E_MODEL, a, "tensor '%s': its module is not in target_modules", t->name);
        }
        char shape[96];
        shape_str(t, shape, sizeof shape);
        int64_t want0 = k.is_b ? out : a->r, want1 = k.is_b ? a->r : in;
        if (t->ndim != 2 || t->shape[0] != want0 || t->shape[1] != want1)
            return adapter_fail(err, SQUAD_E_MODEL, a,
                                "tensor '%s' has shape %s; %s of %s in layer %d with r = %d must be [%lld, %lld]",
                                t->name, shape, k.is_b ? "lora_B" : "lora_A", PROJS[k.proj].module, k.layer, a->r,
                                (long long)want0, (long long)want1);
        squad_lora_proj *p = &a->proj[k.layer][k.proj];
        float **slot = k.is_b ? &p->B : &p->A;
        if (*slot)
            return adapter_fail(err, SQUAD_E_MODEL, a, "tensor '%s': layer %d's %s is given twice (both key layouts?)",
                                t->name, k.layer, PROJS[k.proj].module);
        if (!(*slot = tensor_f32(t, t->name, err))) return squad_fail_context(err, "specialist '%s' (%s): ", a->label, a->dir);
        p->r = a->r, p->in = in, p->out = out;
    }
    /* every A has its B and every B its A */
    for (int l = 0; l < cfg->num_layers; l++)
        for (int p = 0; p < SQUAD_PROJ_COUNT; p++) {
            squad_lora_proj *q = &a->proj[l][p];
            if (!q->A != !q->B) {
                char name[200];
                snprintf(name, sizeof name, "%s%d.%s.%s.weight", layout, l, PROJS[p].module, q->A ? "lora_B" : "lora_A");
                return adapter_fail(err, SQUAD_E_MODEL, a, "tensor '%s' is missing (its %s is present)", name,
                                    q->A ? "lora_A" : "lora_B");
            }
            a->n_pairs += q->A != NULL;
        }
    return 0;
}

static void adapter_free(squad_adapter *a) {
    if (a->proj)
        for (int l = 0; l < a->n_layers; l++)
            for (int p = 0; p < SQUAD_PROJ_COUNT; p++) {
                free(a->proj[l][p].A);
                free(a->proj[l][p].B);
            }
    free(a->proj);
    free(a->dir);
    free(a->label);
    memset(a, 0, sizeof *a);
}

/* Loads the adapter of `label` from adapter_dir (a->label and a->dir set by the caller). */
static int load_adapter(squad_adapter *a, const squad_config *cfg, int split, squad_err *err) {
    a->n_layers = cfg->num_layers;
    struct stat st;
    if (stat(a->dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return adapter_fail(err, SQUAD_E_MODEL, a, "the adapter directory (specialists.%s in %s) does not exist", a->label,
                            SQUAD_SPECIALISTS_FILE);
    if (!(a->proj = squad_calloc((size_t)cfg->num_layers, sizeof *a->proj, err))) return SQUAD_E_NOMEM;
    char *path = squad_path_join(a->dir, SQUAD_ADAPTER_CONFIG_FILE, err);
    if (!path) return SQUAD_E_NOMEM;
    size_t len;
    char *text = squad_read_file(path, &len, err);
    free(path);
    if (!text) return squad_fail(err, SQUAD_E_MODEL, "specialist '%s' (%s): %s is missing or unreadable", a->label,
                                 a->dir, SQUAD_ADAPTER_CONFIG_FILE);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return adapter_fail(err, SQUAD_E_MODEL, a, "%s: invalid JSON at line %d: %s", SQUAD_ADAPTER_CONFIG_FILE, jerr.line,
                            jerr.text);
    json_t *targets = NULL;
    int rc = read_adapter_config(a, root, &targets, err);
    st_file f = {0};
    int opened = 0;
    if (rc == 0) {
        if (!(path = squad_path_join(a->dir, SQUAD_ADAPTER_WEIGHTS_FILE, err))) {
            rc = SQUAD_E_NOMEM;
        } else {
            rc = st_file_open(&f, path, err);
            free(path);
            if (rc != 0)
                rc = squad_fail_context(err, "specialist '%s' (%s): %s: ", a->label, a->dir, SQUAD_ADAPTER_WEIGHTS_FILE);
            else
                opened = 1;
        }
    }
    if (rc == 0) rc = read_adapter_tensors(a, cfg, split, targets, &f, err);
    if (opened) st_file_close(&f);
    json_decref(root);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * The router file
 */

/* Checks the router file's tensors and converts them (messages without the file prefix). */
static int router_tensors(squad_router *r, const st_file *f, squad_err *err) {
    const st_tensor *w = NULL, *b = NULL;
    for (int i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        if (!strcmp(t->name, "weight"))
            w = t;
        else if (!strcmp(t->name, "bias"))
            b = t;
        else
            return squad_fail(err, SQUAD_E_MODEL, "tensor '%s' is not 'weight' or 'bias' (squad would drop it)", t->name);
    }
    if (!w || !b) return squad_fail(err, SQUAD_E_MODEL, "tensor '%s' is missing", w ? "bias" : "weight");
    char shape[96];
    if (w->ndim != 2 || w->shape[0] != r->n_labels || w->shape[1] != r->hidden) {
        shape_str(w, shape, sizeof shape);
        return squad_fail(err, SQUAD_E_MODEL, "tensor 'weight' has shape %s, expected [%d, %d] (labels x hidden size)",
                          shape, r->n_labels, r->hidden);
    }
    if (b->ndim != 1 || b->shape[0] != r->n_labels) {
        shape_str(b, shape, sizeof shape);
        return squad_fail(err, SQUAD_E_MODEL, "tensor 'bias' has shape %s, expected [%d] (one per label)", shape,
                          r->n_labels);
    }
    if (!(r->weight = tensor_f32(w, "weight", err)) || !(r->bias = tensor_f32(b, "bias", err))) return err->code;
    return 0;
}

static int load_router(squad_specialists *sp, const char *file, squad_err *err) {
    char *path = squad_path_join(sp->dir, file, err);
    if (!path) return SQUAD_E_NOMEM;
    st_file f = {0};
    int rc = st_file_open(&f, path, err);
    free(path);
    if (rc == 0) {
        rc = router_tensors(&sp->router, &f, err);
        st_file_close(&f);
    } else if (rc != SQUAD_E_NOMEM) {
        err->code = rc = SQUAD_E_MODEL;
    }
    if (rc != 0) squad_fail_context(err, "specialists %s: router file %s: ", sp->dir, file);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * squad-specialists.json
 */

static int spec_fail(squad_err *err, const squad_specialists *sp, const char *fmt, ...) SQUAD_PRINTF(3, 4);
static int spec_fail(squad_err *err, const squad_specialists *sp, const char *fmt, ...) {
    char msg[SQUAD_ERR_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return squad_fail(err, SQUAD_E_MODEL, "specialists %s: %s: %s", sp->dir, SQUAD_SPECIALISTS_FILE, msg);
}

static int only_fields(squad_err *err, const squad_specialists *sp, json_t *obj, const char *where,
                       const char *const *allowed) {
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(key, *a);
        if (!ok) return spec_fail(err, sp, "unknown field '%s%.80s'", where, key);
    }
    return 0;
}

static int label_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > SQUAD_SPECIALIST_LABEL_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f || s[i] == '"' || s[i] == '\\') return 0;
    return 1;
}

static int read_index(json_t *v, int lo, int hi, int *out) {
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) return -1;
    *out = (int)json_integer_value(v);
    return 0;
}

/* Reads everything but the adapters; *router_file and *spec point into root. */
static int read_spec(squad_specialists *sp, const squad_config *cfg, json_t *root, const char **router_file,
                     json_t **spec, squad_err *err) {
    static const char *const top[] = {"router", "split", "specialists", NULL};
    static const char *const rfields[] = {"file", "layer", "features", "eps", "labels", NULL};
    if (!json_is_object(root)) return spec_fail(err, sp, "not a JSON object");
    int rc = only_fields(err, sp, root, "", top);
    if (rc) return rc;
    json_t *router = json_object_get(root, "router");
    if (!json_is_object(router)) return spec_fail(err, sp, "field 'router' is missing or not an object");
    if ((rc = only_fields(err, sp, router, "router.", rfields))) return rc;
    if (read_index(json_object_get(root, "split"), 0, cfg->num_layers - 1, &sp->split) != 0)
        return spec_fail(err, sp, "field 'split' must be an integer in [0, %d] (the model has %d layers)",
                         cfg->num_layers - 1, cfg->num_layers);
    json_t *v = json_object_get(router, "file");
    if (!json_is_string(v) || !json_string_value(v)[0])
        return spec_fail(err, sp, "field 'router.file' is missing or not a file name");
    *router_file = json_string_value(v);
    if (read_index(json_object_get(router, "layer"), 0, sp->split, &sp->router.layer) != 0)
        return spec_fail(err, sp, "field 'router.layer' must be an integer in [0, split = %d]", sp->split);
    v = json_object_get(router, "features");
    if (!json_is_string(v) || strcmp(json_string_value(v), "rmsnorm") != 0)
        return spec_fail(err, sp, "field 'router.features' must be \"rmsnorm\" (the only features squad computes)");
    v = json_object_get(router, "eps");
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !(json_number_value(v) < 1))
        return spec_fail(err, sp, "field 'router.eps' must be a number in (0, 1)");
    sp->router.eps = (float)json_number_value(v);
    json_t *labels = json_object_get(router, "labels");
    size_t R = json_is_array(labels) ? json_array_size(labels) : 0;
    if (R < 1 || R > SQUAD_SPECIALISTS_MAX)
        return spec_fail(err, sp, "field 'router.labels' must be a list of 1 to %d labels (label 0 the trunk)",
                         SQUAD_SPECIALISTS_MAX);
    if (!(sp->labels = squad_calloc(R, sizeof *sp->labels, err))) return SQUAD_E_NOMEM;
    if (!(sp->adapters = squad_calloc(R, sizeof *sp->adapters, err))) return SQUAD_E_NOMEM;
    sp->router.n_labels = (int)R;
    for (size_t i = 0; i < R; i++) {
        const char *s = json_string_value(json_array_get(labels, i));
        if (!s || !label_ok(s))
            return spec_fail(err, sp, "router.labels[%zu] must be a string of 1 to %d printable characters", i,
                             SQUAD_SPECIALIST_LABEL_MAX);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(sp->labels[j], s)) return spec_fail(err, sp, "router.labels: label '%s' is given twice", s);
        if (!(sp->labels[i] = squad_strdup(s, err))) return SQUAD_E_NOMEM;
    }
    *spec = json_object_get(root, "specialists");
    if (!json_is_object(*spec)) return spec_fail(err, sp, "field 'specialists' is missing or not an object");
    const char *key;
    json_t *d;
    json_object_foreach(*spec, key, d) {
        int found = -1;
        for (size_t i = 0; i < R && found < 0; i++)
            if (!strcmp(sp->labels[i], key)) found = (int)i;
        if (found < 0) return spec_fail(err, sp, "specialists.%.80s: no such label in router.labels", key);
        if (found == 0)
            return spec_fail(err, sp, "specialists.%.80s: label 0 is the trunk (the base model) and takes no adapter", key);
        if (!json_is_string(d) || !json_string_value(d)[0])
            return spec_fail(err, sp, "specialists.%.80s must be an adapter directory", key);
    }
    for (size_t i = 1; i < R; i++)
        if (!json_object_get(*spec, sp->labels[i]))
            return spec_fail(err, sp, "label '%s' (router.labels[%zu]) has no adapter in 'specialists'", sp->labels[i], i);
    return 0;
}

squad_specialists *squad_specialists_load_config(const squad_config *cfg, const char *dir, squad_err *err) {
    squad_err local;
    if (!err) err = &local;
    squad_specialists *sp = squad_calloc(1, sizeof *sp, err);
    if (!sp) return NULL;
    sp->n_layers = cfg->num_layers;
    sp->hidden = sp->router.hidden = cfg->hidden_size;
    json_t *root = NULL;
    char *path = NULL, *text = NULL;
    int rc = 0;
    if (!(sp->dir = squad_strdup(dir, err)) || !(path = squad_path_join(dir, SQUAD_SPECIALISTS_FILE, err))) {
        rc = SQUAD_E_NOMEM;
        goto done;
    }
    size_t len;
    if (!(text = squad_read_file(path, &len, err))) {
        rc = squad_fail(err, SQUAD_E_MODEL, "specialists %s: %s is missing or unreadable", dir, SQUAD_SPECIALISTS_FILE);
        goto done;
    }
    json_error_t jerr;
    if (!(root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr))) {
        rc = spec_fail(err, sp, "invalid JSON at line %d: %s", jerr.line, jerr.text);
        goto done;
    }
    const char *router_file = NULL;
    json_t *spec = NULL;
    if ((rc = read_spec(sp, cfg, root, &router_file, &spec, err)) != 0) goto done;
    if ((rc = load_router(sp, router_file, err)) != 0) goto done;
    for (int i = 1; i < sp->router.n_labels; i++) {
        squad_adapter *a = &sp->adapters[i];
        const char *sub = json_string_value(json_object_get(spec, sp->labels[i]));
        if (!(a->label = squad_strdup(sp->labels[i], err)) ||
            !(a->dir = sub[0] == '/' ? squad_strdup(sub, err) : squad_path_join(dir, sub, err))) {
            rc = SQUAD_E_NOMEM;
            goto done;
        }
        if ((rc = load_adapter(a, cfg, sp->split, err)) != 0) goto done;
        if (a->n_pairs == 0) {
            rc = adapter_fail(err, SQUAD_E_MODEL, a, "%s holds no LoRA pair", SQUAD_ADAPTER_WEIGHTS_FILE);
            goto done;
        }
    }
    /* the trunk's entry: a label and no weights */
    if (!(sp->adapters[0].label = squad_strdup(sp->labels[0], err))) rc = SQUAD_E_NOMEM;
done:
    json_decref(root);
    free(text);
    free(path);
    if (rc != 0) {
        squad_specialists_free(sp);
        return NULL;
    }
    return sp;
}

/* ---------------------------------------------------------------------------------------------
 * Public API
 */

squad_specialists *squad_specialists_load(const squad_model *model, const char *dir, squad_err *err) {
    squad_err local;
    if (!err) err = &local;
    if (!model || !dir) {
        squad_fail(err, SQUAD_E_INVALID, "squad_specialists_load: no model or no directory");
        return NULL;
    }
    return squad_specialists_load_config(&model->cfg, dir, err);
}

void squad_specialists_free(squad_specialists *sp) {
    if (!sp) return;
    if (sp->adapters)
        for (int i = 0; i < sp->router.n_labels; i++) adapter_free(&sp->adapters[i]);
    free(sp->adapters);
    if (sp->labels)
        for (int i = 0; i < sp->router.n_labels; i++) free(sp->labels[i]);
    free(sp->labels);
    free(sp->router.weight);
    free(sp->router.bias);
    free(sp->dir);
    free(sp);
}

int squad_specialists_count(const squad_specialists *sp) { return sp ? sp->router.n_labels : 0; }

const char *squad_specialists_label(const squad_specialists *sp, int route) {
    return sp && route >= 0 && route < sp->router.n_labels ? sp->labels[route] : NULL;
}

int squad_specialists_find(const squad_specialists *sp, const char *label) {
    for (int i = 0; sp && label && i < sp->router.n_labels; i++)
        if (!strcmp(sp->labels[i], label)) return i;
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * The router
 */

int squad_router_feat_init(squad_router_feat *f, int dim, squad_err *err) {
    memset(f, 0, sizeof *f);
    if (dim < 1) return squad_fail(err, SQUAD_E_INVALID, "router features: dimension %d", dim);
    if (!(f->sum = squad_calloc((size_t)dim, sizeof *f->sum, err))) return SQUAD_E_NOMEM;
    f->dim = dim;
    return 0;
}

void squad_router_feat_free(squad_router_feat *f) {
    free(f->sum);
    memset(f, 0, sizeof *f);
}

void squad_router_feat_reset(squad_router_feat *f) {
    memset(f->sum, 0, (size_t)f->dim * sizeof *f->sum);
    f->count = 0;
}

void squad_router_feat_copy(squad_router_feat *dst, const squad_router_feat *src) {
    memcpy(dst->sum, src->sum, (size_t)src->dim * sizeof *src->sum);
    dst->count = src->count;
}

void squad_router_norm_add(double *sum, const float *x, int dim, float eps) {
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    /* the normalisation in fp32, as docs/design.md section 4 computes every norm */
    float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
    for (int i = 0; i < dim; i++) sum[i] += (double)(x[i] * inv);
}

void squad_router_feat_add(squad_router_feat *f, const float *x, int n, size_t ld, float eps) {
    for (int t = 0; t < n; t++) squad_router_norm_add(f->sum, x + (size_t)t * ld, f->dim, eps);
    f->count += n;
}

void squad_router_feat_add_dsum(squad_router_feat *f, const double *sum, int n) {
    for (int i = 0; i < f->dim; i++) f->sum[i] += sum[i];
    f->count += n;
}

void squad_router_feat_add_sum(squad_router_feat *f, const float *sum, int n) {
    for (int i = 0; i < f->dim; i++) f->sum[i] += sum[i];
    f->count += n;
}

int squad_router_route(const squad_router *r, const squad_router_feat *f, float *logits, float *probs,
                       squad_err *err) {
    if (f->dim != r->hidden)
        return squad_fail(err, SQUAD_E_INVALID, "router: features of dimension %d, the router reads %d", f->dim, r->hidden);
    if (f->count < 1) return squad_fail(err, SQUAD_E_INVALID, "router: no token has been added to the features");
    double z[SQUAD_SPECIALISTS_MAX];
    int best = 0;
    for (int k = 0; k < r->n_labels; k++) {
        const float *w = r->weight + (size_t)k * r->hidden;
        double s = 0;
        for (int i = 0; i < r->hidden; i++) s += (double)w[i] * f->sum[i];
        z[k] = s / (double)f->count + r->bias[k];
        if (z[k] > z[best]) best = k;
        if (logits) logits[k] = (float)z[k];
    }
    if (probs) {
        double tot = 0;
        for (int k = 0; k < r->n_labels; k++) tot += exp(z[k] - z[best]);
        for (int k = 0; k < r->n_labels; k++) probs[k] = (float)(exp(z[k] - z[best]) / tot);
    }
    return best;
}

void squad_lora_apply_ref(const squad_lora_proj *p, float scale, const float *x, float *y) {
    if (!p->A || p->r > SQUAD_LORA_MAX_RANK) return; /* the loader refuses larger ranks */
    double ax[SQUAD_LORA_MAX_RANK];
    for (int k = 0; k < p->r; k++) {
        const float *a = p->A + (size_t)k * p->in;
        double s = 0;
        for (int i = 0; i < p->in; i++) s += (double)a[i] * x[i];
        ax[k] = s;
    }
    for (int o = 0; o < p->out; o++) {
        const float *b = p->B + (size_t)o * p->r;
        double s = 0;
        for (int k = 0; k < p->r; k++) s += (double)b[k] * ax[k];
        y[o] += (float)(scale * s);
    }
}
