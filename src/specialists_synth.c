/*
 * specialists_synth.c — deterministic random specialists directories (see specialists_synth.h).
 *
 * Design:
 *  - Every tensor has its own splitmix64 stream keyed by the seed and the tensor's name inside the
 *    text model (the layout prefix removed), as synth.c draws model weights, so both key layouts
 *    hold the same values. Values are bell-shaped (the sum of four uniforms), rounded to bf16 first
 *    so BF16 and F32 directories hold the same numbers.
 *  - Scales make the adapters matter without swamping the base model: A ~ N(0, 1/in), B ~
 *    N(0, (0.5 / r)^2) (peft initialises B to zero; tests need a B that changes the output). The
 *    router weight is N(0, 1) per entry over unit-RMS features, the bias N(0, 0.25).
 *  - The files look like what peft's save_pretrained writes: adapter_config.json with the LoRA
 *    fields squad reads and the neutral values of those it refuses, tensors sorted by name.
 */
#include "specialists_synth.h"
#include "synth.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "specialists.h"
#include "util.h"

static const char *const LABELS[] = {"trunk", "e2e", "nav"};
#define N_LABELS 3
#define ROUTER_FILE "router.safetensors"
#define ROUTER_EPS 1e-6
#define B_SCALE 0.5f
#define ROUTER_W_SCALE 1.0f
#define ROUTER_B_SCALE 0.25f

void squad_spec_synth_defaults(const squad_config *cfg, squad_spec_synth_opts *o) {
    memset(o, 0, sizeof *o);
    o->layout = SQUAD_SYNTH_CAUSAL;
    o->split = cfg->num_layers / 2;
    o->router_layer = o->split;
    o->rank = 4;
    o->alpha = 8.0;
    o->dtype = ST_BF16;
}

/* ---------------------------------------------------------------------------------------------
 * Values
 */

/* The stream of one tensor: the seed and the tensor's key (with the label for adapters). */
static squad_synth_rng key_rng(uint64_t seed, const char *label, const char *key) {
    uint64_t h = squad_synth_fnv1a(SQUAD_SYNTH_FNV_BASIS, label);
    h = squad_synth_fnv1a(h, "/");
    return squad_synth_rng_keyed(seed, squad_synth_fnv1a(h, key));
}

/* A tensor's n values in dtype, into a new buffer. */
static void *draw_tensor(squad_synth_rng r, size_t n, float scale, st_dtype dtype, squad_err *err) {
    size_t es = dtype == ST_F32 ? 4 : 2;
    void *buf = squad_malloc((n ? n : 1) * es, err);
    if (!buf) return NULL;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = squad_f32_to_bf16(squad_synth_rng_bell(&r, scale));
        if (dtype == ST_F32)
            ((float *)buf)[i] = squad_bf16_to_f32(h);
        else
            ((uint16_t *)buf)[i] = h;
    }
    return buf;
}

/* ---------------------------------------------------------------------------------------------
 * Files
 */

static int write_json(const char *dir, const char *name, json_t *root, squad_err *err) {
    if (!root) return squad_fail(err, SQUAD_E_NOMEM, "out of memory writing %s", name);
    char *path = squad_path_join(dir, name, err);
    if (!path) {
        json_decref(root);
        return SQUAD_E_NOMEM;
    }
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) == 0
                 ? 0
                 : squad_fail(err, SQUAD_E_IO, "cannot write %s", path);
    json_decref(root);
    free(path);
    return rc;
}

/* A growing list of tensors to write, each owning its name and data. */
typedef struct tensor_list {
    st_write_tensor *t;
    int n, cap;
} tensor_list;

static void tensor_list_free(tensor_list *l) {
    for (int i = 0; i < l->n; i++) {
        free((void *)l->t[i].name);
        free((void *)l->t[i].data);
    }
    free(l->t);
    memset(l, 0, sizeof *l);
}

/* Appends a 1-D or 2-D tensor drawn from the stream of (label, key). */
static int tensor_list_add(tensor_list *l, const char *name, const char *label, const char *key, int ndim, int64_t d0,
                           int64_t d1, float scale, const squad_spec_synth_opts *o, squad_err *err) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        st_write_tensor *t = realloc(l->t, (size_t)cap * sizeof *t);
        if (!t) return squad_fail(err, SQUAD_E_NOMEM, "out of memory (specialists synth)");
        l->t = t, l->cap = cap;
    }
    st_write_tensor *t = &l->t[l->n];
    memset(t, 0, sizeof *t);
    t->dtype = o->dtype;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    size_t n = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    if (!(t->name = squad_strdup(name, err))) return SQUAD_E_NOMEM;
    if (!(t->data = draw_tensor(key_rng(o->seed, label, key), n, scale, o->dtype, err))) {
        free((void *)t->name);
        return SQUAD_E_NOMEM;
    }
    l->n++;
    return 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const st_write_tensor *)a)->name, ((const st_write_tensor *)b)->name);
}

static int write_tensors(const char *dir, const char *name, tensor_list *l, squad_err *err) {
    qsort(l->t, (size_t)l->n, sizeof *l->t, by_name);
    char *path = squad_path_join(dir, name, err);
    if (!path) return SQUAD_E_NOMEM;
    int rc = st_write_file(path, l->t, l->n, err);
    free(path);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * The directory
 */

static json_t *adapter_config_json(const squad_config *cfg, const squad_spec_synth_opts *o) {
    json_t *targets = json_array(), *layers = json_array();
    for (int p = 0; targets && p < SQUAD_PROJ_COUNT; p++) {
        const char *m = strrchr(squad_proj_module(p), '.') + 1;
        json_array_append_new(targets, json_string(m));
    }
    for (int l = o->split; layers && l < cfg->num_layers; l++) json_array_append_new(layers, json_integer(l));
    if (!targets || !layers) {
        json_decref(targets);
        json_decref(layers);
        return NULL;
    }
    return json_pack("{s:s, s:i, s:f, s:b, s:b, s:s, s:o, s:n, s:b, s:f, s:s, s:n, s:o, s:{}, s:{}, s:b}",
                     "peft_type", "LORA", "r", o->rank, "lora_alpha", o->alpha, "use_rslora", o->rslora, "use_dora", 0,
                     "bias", "none", "target_modules", targets, "modules_to_save", "fan_in_fan_out", 0, "lora_dropout",
                     0.0, "task_type", "CAUSAL_LM", "base_model_name_or_path", "layers_to_transform", layers,
                     "rank_pattern", "alpha_pattern", "inference_mode", 1);
}

static int write_adapter(const squad_config *cfg, const squad_spec_synth_opts *o, const char *label, squad_err *err) {
    char *dir = squad_path_join(o->out_dir, label, err);
    if (!dir) return SQUAD_E_NOMEM;
    tensor_list l = {0};
    int rc = squad_mkdir_p(dir, err);
    if (rc == 0) rc = write_json(dir, SQUAD_ADAPTER_CONFIG_FILE, adapter_config_json(cfg, o), err);
    const char *layout = o->layout == SQUAD_SYNTH_CONDITIONAL ? "base_model.model.model.language_model."
                                                             : "base_model.model.model.";
    for (int layer = o->split; rc == 0 && layer < cfg->num_layers; layer++) {
        for (int p = 0; rc == 0 && p < SQUAD_PROJ_COUNT; p++) {
            int out, in;
            if (squad_proj_shape(cfg, layer, p, &out, &in) != 0) continue;
            char key[160], name[224];
            snprintf(key, sizeof key, "layers.%d.%s.lora_A.weight", layer, squad_proj_module(p));
            snprintf(name, sizeof name, "%s%s", layout, key);
            rc = tensor_list_add(&l, name, label, key, 2, o->rank, in, 1.0f / sqrtf((float)in), o, err);
            snprintf(key, sizeof key, "layers.%d.%s.lora_B.weight", layer, squad_proj_module(p));
            snprintf(name, sizeof name, "%s%s", layout, key);
            if (rc == 0) rc = tensor_list_add(&l, name, label, key, 2, out, o->rank, B_SCALE / (float)o->rank, o, err);
        }
    }
    if (rc == 0) rc = write_tensors(dir, SQUAD_ADAPTER_WEIGHTS_FILE, &l, err);
    tensor_list_free(&l);
    free(dir);
    return rc;
}

int squad_spec_synth_write(const squad_config *cfg, const squad_spec_synth_opts *o, squad_err *err) {
    squad_err local;
    if (!err) err = &local;
    if (!o->out_dir || !o->out_dir[0]) return squad_fail(err, SQUAD_E_INVALID, "no output directory given");
    if (o->split < 0 || o->split >= cfg->num_layers || o->router_layer < 0 || o->router_layer > o->split)
        return squad_fail(err, SQUAD_E_INVALID, "specialists synth: need 0 <= router layer <= split < %d layers",
                          cfg->num_layers);
    if (o->rank < 1 || o->rank > SQUAD_LORA_MAX_RANK)
        return squad_fail(err, SQUAD_E_INVALID, "specialists synth: rank %d out of range", o->rank);
    if (o->dtype != ST_BF16 && o->dtype != ST_F32)
        return squad_fail(err, SQUAD_E_INVALID, "specialists synth writes BF16 or F32 only");
    int rc = squad_mkdir_p(o->out_dir, err);
    if (rc) return rc;

    json_t *labels = json_array(), *spec = json_object();
    for (int i = 0; labels && i < N_LABELS; i++) json_array_append_new(labels, json_string(LABELS[i]));
    for (int i = 1; spec && i < N_LABELS; i++) json_object_set_new(spec, LABELS[i], json_string(LABELS[i]));
    json_t *root = labels && spec ? json_pack("{s:{s:s, s:i, s:s, s:f, s:o}, s:i, s:o}", "router", "file", ROUTER_FILE,
                                              "layer", o->router_layer, "features", "rmsnorm", "eps", ROUTER_EPS,
                                              "labels", labels, "split", o->split, "specialists", spec)
                                  : NULL;
    if (!root) {
        json_decref(labels);
        json_decref(spec);
    }
    if ((rc = write_json(o->out_dir, SQUAD_SPECIALISTS_FILE, root, err)) != 0) return rc;

    tensor_list l = {0};
    rc = tensor_list_add(&l, "weight", "router", "weight", 2, N_LABELS, cfg->hidden_size, ROUTER_W_SCALE, o, err);
    if (rc == 0) rc = tensor_list_add(&l, "bias", "router", "bias", 1, N_LABELS, 0, ROUTER_B_SCALE, o, err);
    if (rc == 0) rc = write_tensors(o->out_dir, ROUTER_FILE, &l, err);
    tensor_list_free(&l);
    for (int i = 1; rc == 0 && i < N_LABELS; i++) rc = write_adapter(cfg, o, LABELS[i], err);
    return rc;
}
