/*
 * test_specialists.c — specialists directories (docs/specialists.md): a synthesized directory
 * loads under both adapter key layouts and both dtypes, with the weights, shapes and scale the
 * files say; the router's feature accumulator gives the same sum whether a row arrives whole or in
 * chunks, and its route and probabilities match a direct computation; the reference LoRA
 * application matches y + s B (A x) written out; and every invalid directory is refused with a
 * message naming the adapter (or the file) and the offending tensor or field.
 *
 * Invalid directories are made by synthesizing a valid one and changing one thing in it: a JSON
 * field (json_edit) or a tensor of a safetensors file (st_edit).
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "safetensors.h"
#include "specialists.h"
#include "specialists_synth.h"
#include "synth.h"
#include "testutil.h"
#include "util.h"

/* the causal key prefix of a decoder layer's adapter tensors */
#define A_PRE "base_model.model.model.layers."

static squad_config g_cfg; /* the "tiny" preset: layers L L L F, H 64, I 128 */

static char *join(const char *dir, const char *name) {
    squad_err e;
    char *p = squad_path_join(dir, name, &e);
    if (!p) abort();
    return p;
}

/* A fresh synthesized directory (split 2: adapters on layers 2 (GDN) and 3 (attention)). */
static char *fresh_dir(squad_synth_layout layout, st_dtype dtype, int rslora) {
    char *dir = strdup(test_tmpdir());
    squad_spec_synth_opts o;
    squad_spec_synth_defaults(&g_cfg, &o);
    o.out_dir = dir;
    o.seed = 7;
    o.layout = layout;
    o.dtype = dtype;
    o.rslora = rslora;
    squad_err e = {0};
    int rc = squad_spec_synth_write(&g_cfg, &o, &e);
    CHECKF(rc == 0, "synth: %s", e.msg);
    return dir;
}

/* ---------------------------------------------------------------------------------------------
 * Editing helpers
 */

/* Sets (value != NULL) or deletes a field of a JSON file; key may be "a.b" for a nested object. */
static void json_edit(const char *dir, const char *file, const char *key, json_t *value) {
    char *path = join(dir, file);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    CHECKF(root != NULL, "%s: %s", path, je.text);
    if (!root) {
        free(path);
        json_decref(value);
        return;
    }
    json_t *obj = root;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", key);
    char *dot = strchr(buf, '.');
    const char *leaf = buf;
    if (dot) {
        *dot = 0;
        obj = json_object_get(root, buf);
        leaf = dot + 1;
    }
    if (value)
        json_object_set_new(obj, leaf, value);
    else
        json_object_del(obj, leaf);
    CHECK(json_dump_file(root, path, JSON_INDENT(2)) == 0);
    json_decref(root);
    free(path);
}

/* The tensors of a file, copied into memory so the file can be rewritten. */
typedef struct tensors {
    st_write_tensor t[512];
    int n;
} tensors;

static void tensors_load(tensors *ts, const char *path) {
    st_file f = {0};
    squad_err e = {0};
    ts->n = 0;
    if (st_file_open(&f, path, &e) != 0) {
        CHECKF(0, "%s: %s", path, e.msg);
        return;
    }
    for (int i = 0; i < f.n_tensors && ts->n < 512; i++) {
        st_write_tensor *w = &ts->t[ts->n++];
        memset(w, 0, sizeof *w);
        w->name = strdup(f.tensors[i].name);
        w->dtype = f.tensors[i].dtype;
        w->ndim = f.tensors[i].ndim;
        for (int d = 0; d < w->ndim; d++) w->shape[d] = f.tensors[i].shape[d];
        void *data = malloc(f.tensors[i].nbytes + 1);
        memcpy(data, f.tensors[i].data, f.tensors[i].nbytes);
        w->data = data;
    }
    st_file_close(&f);
}

static void tensors_save(tensors *ts, const char *path) {
    squad_err e = {0};
    CHECKF(st_write_file(path, ts->t, ts->n, &e) == 0, "%s: %s", path, e.msg);
    for (int i = 0; i < ts->n; i++) {
        free((void *)ts->t[i].name);
        free((void *)ts->t[i].data);
    }
    ts->n = 0;
}

static st_write_tensor *tensors_find(tensors *ts, const char *name) {
    for (int i = 0; i < ts->n; i++)
        if (!strcmp(ts->t[i].name, name)) return &ts->t[i];
    CHECKF(0, "no tensor %s", name);
    return NULL;
}

/* Adds an F32 tensor of the given shape filled with 0.01. */
static void tensors_add(tensors *ts, const char *name, int ndim, int64_t d0, int64_t d1) {
    st_write_tensor *w = &ts->t[ts->n++];
    memset(w, 0, sizeof *w);
    w->name = strdup(name);
    w->dtype = ST_F32;
    w->ndim = ndim;
    w->shape[0] = d0;
    w->shape[1] = d1;
    size_t n = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    float *v = malloc(n * sizeof *v + 4);
    for (size_t i = 0; i < n; i++) v[i] = 0.01f;
    w->data = v;
}

static void tensors_drop(tensors *ts, const char *name) {
    st_write_tensor *w = tensors_find(ts, name);
    if (!w) return;
    free((void *)w->name);
    free((void *)w->data);
    *w = ts->t[--ts->n];
}

/* Replaces a tensor by an F32 one of another shape. */
static void tensors_reshape(tensors *ts, const char *name, int ndim, int64_t d0, int64_t d1) {
    tensors_drop(ts, name);
    tensors_add(ts, name, ndim, d0, d1);
}

enum { OP_ADD, OP_DROP, OP_RESHAPE, OP_NAN, OP_RENAME };

/* One change to one safetensors file of a directory. */
static void st_edit(const char *dir, const char *file, int op, const char *name, int ndim, int64_t d0, int64_t d1,
                    const char *new_name) {
    char *path = join(dir, file);
    tensors *ts = calloc(1, sizeof *ts);
    tensors_load(ts, path);
    st_write_tensor *w;
    switch (op) {
    case OP_ADD: tensors_add(ts, name, ndim, d0, d1); break;
    case OP_DROP: tensors_drop(ts, name); break;
    case OP_RESHAPE: tensors_reshape(ts, name, ndim, d0, d1); break;
    case OP_NAN:
        if ((w = tensors_find(ts, name))) {
            CHECK(w->dtype == ST_BF16);
            ((uint16_t *)w->data)[1] = 0x7fc0; /* a bf16 NaN */
        }
        break;
    case OP_RENAME:
        if ((w = tensors_find(ts, name))) {
            free((void *)w->name);
            w->name = strdup(new_name);
        }
        break;
    }
    tensors_save(ts, path);
    free(ts);
    free(path);
}

/* ---------------------------------------------------------------------------------------------
 * Valid directories
 */

/* The first value of a tensor in a file, as fp32. */
static float file_value(const char *path, const char *name, size_t i) {
    st_file f = {0};
    squad_err e = {0};
    float v = NAN;
    if (st_file_open(&f, path, &e) != 0) return v;
    for (int k = 0; k < f.n_tensors; k++) {
        const st_tensor *t = &f.tensors[k];
        if (strcmp(t->name, name)) continue;
        if (t->dtype == ST_F32)
            memcpy(&v, (const char *)t->data + 4 * i, 4);
        else
            v = squad_bf16_to_f32(((const uint16_t *)t->data)[i]);
    }
    st_file_close(&f);
    return v;
}

static void check_valid(squad_synth_layout layout, st_dtype dtype, int rslora) {
    char *dir = fresh_dir(layout, dtype, rslora);
    squad_err e = {0};
    squad_specialists *sp = squad_specialists_load_config(&g_cfg, dir, &e);
    CHECKF(sp != NULL, "layout %d dtype %d: %s", (int)layout, (int)dtype, e.msg);
    if (!sp) {
        free(dir);
        return;
    }
    CHECK(squad_specialists_count(sp) == 3);
    CHECK(!strcmp(squad_specialists_label(sp, 0), "trunk") && !strcmp(squad_specialists_label(sp, 2), "nav"));
    CHECK(squad_specialists_label(sp, 3) == NULL && squad_specialists_label(sp, -1) == NULL);
    CHECK(squad_specialists_find(sp, "e2e") == 1 && squad_specialists_find(sp, "none") == -1);
    CHECK(sp->split == 2 && sp->router.layer == 2 && sp->router.n_labels == 3 && sp->router.hidden == 64);
    CHECK_NEAR(sp->router.eps, 1e-6, 1e-12);
    CHECK(sp->adapters[0].n_pairs == 0 && sp->adapters[0].proj == NULL);
    for (int a = 1; a < 3; a++) {
        const squad_adapter *ad = &sp->adapters[a];
        CHECK(ad->r == 4 && ad->alpha == 8.0 && ad->rslora == rslora);
        CHECK_NEAR(ad->scale, rslora ? 8.0 / 2.0 : 8.0 / 4.0, 1e-6);
        /* layer 2 (GDN) has 5 + 3 projections, layer 3 (attention) 4 + 3 */
        CHECK(ad->n_pairs == 15);
        int pairs = 0;
        double bsum = 0;
        for (int l = 0; l < g_cfg.num_layers; l++)
            for (int p = 0; p < SQUAD_PROJ_COUNT; p++) {
                const squad_lora_proj *q = &ad->proj[l][p];
                int out, in, has = squad_proj_shape(&g_cfg, l, p, &out, &in) == 0;
                if (l < 2 || !has) {
                    CHECK(q->A == NULL && q->B == NULL);
                    continue;
                }
                pairs++;
                CHECK(q->A && q->B && q->r == 4 && q->out == out && q->in == in);
                for (int k = 0; q->B && k < q->out * q->r; k++) bsum += fabs(q->B[k]);
            }
        CHECK(pairs == 15);
        CHECK(bsum > 0); /* non-zero B: the adapters change the output */
        /* values are the file's */
        char *wpath = join(ad->dir, SQUAD_ADAPTER_WEIGHTS_FILE);
        const char *pre = layout == SQUAD_SYNTH_CONDITIONAL ? "base_model.model.model.language_model." : "base_model.model.model.";
        char name[200];
        snprintf(name, sizeof name, "%slayers.3.self_attn.q_proj.lora_B.weight", pre);
        CHECK(ad->proj[3][SQUAD_PROJ_Q].B[5] == file_value(wpath, name, 5));
        snprintf(name, sizeof name, "%slayers.2.linear_attn.in_proj_qkv.lora_A.weight", pre);
        CHECK(ad->proj[2][SQUAD_PROJ_IN_QKV].A[7] == file_value(wpath, name, 7));
        CHECK(ad->proj[2][SQUAD_PROJ_IN_QKV].out == squad_config_gdn_channels(&g_cfg));
        CHECK(ad->proj[2][SQUAD_PROJ_OUT].in == g_cfg.lin_num_v_heads * g_cfg.lin_v_dim);
        CHECK(ad->proj[3][SQUAD_PROJ_Q].out == 2 * g_cfg.num_heads * g_cfg.head_dim);
        CHECK(ad->proj[3][SQUAD_PROJ_DOWN].in == g_cfg.intermediate_size);
        free(wpath);
    }
    char *rpath = join(dir, "router.safetensors");
    CHECK(sp->router.weight[64 + 3] == file_value(rpath, "weight", 64 + 3));
    CHECK(sp->router.bias[2] == file_value(rpath, "bias", 2));
    free(rpath);
    squad_specialists_free(sp);
    free(dir);
}

/* The public entry point with a loaded model, and determinism of the synthesized files. */
static void check_public_api(void) {
    char *mdir = strdup(test_tmpdir());
    squad_synth_opts so = {0};
    so.preset = "tiny";
    so.out_dir = mdir;
    squad_err e = {0};
    CHECKF(squad_synth_write(&so, &e) == 0, "%s", e.msg);
    squad_model *m = squad_model_load(mdir, &e);
    CHECKF(m != NULL, "%s", e.msg);
    char *d1 = fresh_dir(SQUAD_SYNTH_CAUSAL, ST_BF16, 0), *d2 = fresh_dir(SQUAD_SYNTH_CAUSAL, ST_BF16, 0);
    squad_specialists *sp = m ? squad_specialists_load(m, d1, &e) : NULL;
    CHECKF(sp != NULL, "%s", e.msg);
    CHECK(squad_specialists_count(sp) == 3 && squad_specialists_find(sp, "nav") == 2);
    squad_specialists_free(sp);
    CHECK(squad_specialists_load(NULL, d1, &e) == NULL && e.code == SQUAD_E_INVALID);
    const char *files[] = {"squad-specialists.json", "router.safetensors", "e2e/adapter_config.json",
                           "e2e/adapter_model.safetensors", "nav/adapter_model.safetensors"};
    for (int i = 0; i < 5; i++) {
        char *p1 = join(d1, files[i]), *p2 = join(d2, files[i]);
        size_t n1 = 0, n2 = 0;
        char *a = squad_read_file(p1, &n1, &e), *b = squad_read_file(p2, &n2, &e);
        CHECKF(a && b && n1 == n2 && !memcmp(a, b, n1), "%s differs between two syntheses", files[i]);
        free(a);
        free(b);
        free(p1);
        free(p2);
    }
    /* the two specialists differ */
    char *pa = join(d1, "e2e/adapter_model.safetensors"), *pb = join(d1, "nav/adapter_model.safetensors");
    const char *name = "base_model.model.model.layers.2.mlp.up_proj.lora_B.weight";
    CHECK(file_value(pa, name, 0) != file_value(pb, name, 0));
    free(pa);
    free(pb);
    squad_model_free(m);
    free(d1);
    free(d2);
    free(mdir);
}

/* An adapter_config.json with every field a recent peft writes (at the values peft's LoRA defaults
 * give) loads; a regex target_modules is accepted and the tensors decide. */
static void check_peft_config(void) {
    static const char *peft_json =
        "{\"alora_invocation_tokens\": null, \"alpha_pattern\": {}, \"arrow_config\": null, \"auto_mapping\": null,"
        " \"base_model_name_or_path\": \"base\", \"bias\": \"none\", \"corda_config\": null,"
        " \"ensure_weight_tying\": false, \"eva_config\": null, \"exclude_modules\": null, \"fan_in_fan_out\": false,"
        " \"inference_mode\": true, \"init_lora_weights\": true, \"layer_replication\": null, \"layers_pattern\": null,"
        " \"layers_to_transform\": [2, 3], \"loftq_config\": {}, \"lora_alpha\": 8, \"lora_bias\": false,"
        " \"lora_dropout\": 0.0, \"megatron_config\": null, \"megatron_core\": \"megatron.core\","
        " \"modules_to_save\": null, \"peft_type\": \"LORA\", \"peft_version\": \"0.18.0\", \"qalora_group_size\": 16,"
        " \"r\": 4, \"rank_pattern\": {}, \"revision\": null, \"target_modules\": [\"up_proj\", \"in_proj_b\","
        " \"v_proj\", \"gate_proj\", \"k_proj\", \"in_proj_qkv\", \"o_proj\", \"out_proj\", \"down_proj\","
        " \"in_proj_a\", \"q_proj\", \"in_proj_z\"], \"target_parameters\": null, \"task_type\": \"CAUSAL_LM\","
        " \"trainable_token_indices\": null, \"use_dora\": false, \"use_qalora\": false, \"use_rslora\": false}";
    char *dir = fresh_dir(SQUAD_SYNTH_CAUSAL, ST_BF16, 0);
    char *path = join(dir, "e2e/adapter_config.json");
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(peft_json, f) >= 0 && fclose(f) == 0);
    json_edit(dir, "nav/adapter_config.json", "target_modules", json_string(".*\\.(mlp|self_attn|linear_attn)\\..*"));
    squad_err e = {0};
    squad_specialists *sp = squad_specialists_load_config(&g_cfg, dir, &e);
    CHECKF(sp != NULL, "%s", e.msg);
    CHECK(sp && sp->adapters[1].n_pairs == 15 && sp->adapters[2].n_pairs == 15);
    CHECK(sp && sp->adapters[1].scale == 2.0f);
    squad_specialists_free(sp);
    free(path);
    free(dir);
}

/* An F16 tensor among BF16 ones (each tensor is converted by its own dtype). */
static void check_f16(void) {
    char *dir = fresh_dir(SQUAD_SYNTH_CAUSAL, ST_BF16, 0);
    char *path = join(dir, "e2e/adapter_model.safetensors");
    tensors *ts = calloc(1, sizeof *ts);
    tensors_load(ts, path);
    const char *name = A_PRE "2.mlp.down_proj.lora_A.weight";
    tensors_drop(ts, name);
    st_write_tensor *w = &ts->t[ts->n++];
    memset(w, 0, sizeof *w);
    w->name = strdup(name);
    w->dtype = ST_F16;
    w->ndim = 2;
    w->shape[0] = 4;
    w->shape[1] = 128;
    uint16_t *v = malloc(4 * 128 * sizeof *v);
    for (int i = 0; i < 4 * 128; i++) v[i] = i == 5 ? 0xC100 /* -2.5 */ : 0x3C00 /* 1.0 */;
    w->data = v;
    tensors_save(ts, path);
    free(ts);
    squad_err e = {0};
    squad_specialists *sp = squad_specialists_load_config(&g_cfg, dir, &e);
    CHECKF(sp != NULL, "%s", e.msg);
    if (sp) {
        const float *A = sp->adapters[1].proj[2][SQUAD_PROJ_DOWN].A;
        CHECK(A[0] == 1.0f && A[5] == -2.5f && A[511] == 1.0f);
    }
    squad_specialists_free(sp);
    free(path);
    free(dir);
}

/* ---------------------------------------------------------------------------------------------
 * The router and the reference LoRA
 */

static void check_router(void) {
    enum { H = 6, R = 3, T = 7 };
    float w[R * H], b[R], x[T * H];
    for (int i = 0; i < R * H; i++) w[i] = sinf(0.7f * (float)i + 0.3f);
    for (int i = 0; i < R; i++) b[i] = 0.05f * (float)i;
    for (int i = 0; i < T * H; i++) x[i] = cosf(1.3f * (float)i) * (1.0f + (float)(i % 5));
    squad_router r = {.layer = 1, .eps = 1e-6f, .n_labels = R, .hidden = H, .weight = w, .bias = b};
    squad_err e = {0};
    squad_router_feat whole, parts;
    CHECK(squad_router_feat_init(&whole, H, &e) == 0 && squad_router_feat_init(&parts, H, &e) == 0);
    CHECK(squad_router_route(&r, &whole, NULL, NULL, &e) == SQUAD_E_INVALID && strstr(e.msg, "no token"));
    squad_router_feat_add(&whole, x, T, H, r.eps);
    /* in chunks 3 + 4, the second one added first (a checkpoint restored, then the rest) */
    squad_router_feat_add(&parts, x + 3 * H, 4, H, r.eps);
    squad_router_feat_add(&parts, x, 3, H, r.eps);
    CHECK(whole.count == T && parts.count == T);
    for (int i = 0; i < H; i++) CHECK_NEAR(whole.sum[i], parts.sum[i], 1e-12);
    /* a partial sum computed elsewhere (a backend's chunk) */
    squad_router_feat copy;
    CHECK(squad_router_feat_init(&copy, H, &e) == 0);
    float chunk[H];
    squad_router_feat tmp;
    CHECK(squad_router_feat_init(&tmp, H, &e) == 0);
    squad_router_feat_add(&tmp, x + 2 * H, 5, H, r.eps);
    for (int i = 0; i < H; i++) chunk[i] = (float)tmp.sum[i];
    squad_router_feat_add(&copy, x, 2, H, r.eps);
    squad_router_feat_add_sum(&copy, chunk, 5);
    CHECK(copy.count == T);
    for (int i = 0; i < H; i++) CHECK_NEAR(copy.sum[i], whole.sum[i], 1e-5);
    /* direct: mean of the normalised rows, logits, softmax */
    double f[H] = {0}, z[R];
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < H; i++) ss += (double)x[t * H + i] * x[t * H + i];
        double inv = 1.0 / sqrt(ss / H + 1e-6);
        for (int i = 0; i < H; i++) f[i] += x[t * H + i] * inv / T;
    }
    int best = 0;
    for (int k = 0; k < R; k++) {
        z[k] = b[k];
        for (int i = 0; i < H; i++) z[k] += (double)w[k * H + i] * f[i];
        if (z[k] > z[best]) best = k;
    }
    float logits[R], probs[R];
    int route = squad_router_route(&r, &whole, logits, probs, &e);
    CHECK(route == best);
    double tot = 0;
    for (int k = 0; k < R; k++) tot += exp(z[k]);
    for (int k = 0; k < R; k++) {
        CHECK_NEAR(logits[k], z[k], 1e-5);
        CHECK_NEAR(probs[k], exp(z[k]) / tot, 1e-6);
    }
    /* the bias moves the route: make every other label win in turn */
    for (int want = 0; want < R; want++) {
        float b2[R];
        for (int k = 0; k < R; k++) b2[k] = k == want ? 100.0f : 0.0f;
        squad_router r2 = r;
        r2.bias = b2;
        CHECK(squad_router_route(&r2, &parts, NULL, NULL, &e) == want);
    }
    /* a tie goes to the lowest label */
    float wz[R * H] = {0}, bz[R] = {0.5f, 1.0f, 1.0f};
    squad_router r3 = r;
    r3.weight = wz, r3.bias = bz;
    CHECK(squad_router_route(&r3, &whole, NULL, NULL, &e) == 1);
    /* a feature accumulator of the wrong size */
    squad_router_feat small;
    CHECK(squad_router_feat_init(&small, H - 1, &e) == 0);
    squad_router_feat_add(&small, x, 1, H, r.eps);
    CHECK(squad_router_route(&r, &small, NULL, NULL, &e) == SQUAD_E_INVALID && strstr(e.msg, "dimension"));
    squad_router_feat_copy(&tmp, &whole);
    CHECK(tmp.count == T && tmp.sum[3] == whole.sum[3]);
    squad_router_feat_reset(&tmp);
    CHECK(tmp.count == 0 && tmp.sum[3] == 0);
    squad_router_feat_free(&small);
    squad_router_feat_free(&tmp);
    squad_router_feat_free(&copy);
    squad_router_feat_free(&whole);
    squad_router_feat_free(&parts);
}

static void check_lora_ref(void) {
    /* A [2][3], B [4][2] */
    float A[6] = {1, 2, 3, -1, 0.5f, 0}, B[8] = {1, 0, 0, 1, 2, -1, 0.25f, 0.5f};
    float x[3] = {0.5f, -1, 2}, y[4] = {1, 1, 1, 1};
    squad_lora_proj p = {.r = 2, .in = 3, .out = 4, .A = A, .B = B};
    squad_lora_apply_ref(&p, 0.5f, x, y);
    /* A x = [0.5 - 2 + 6, -0.5 - 0.5 + 0] = [4.5, -1] */
    double ax0 = 4.5, ax1 = -1.0, want[4];
    for (int o = 0; o < 4; o++) want[o] = 1 + 0.5 * (B[2 * o] * ax0 + B[2 * o + 1] * ax1);
    for (int o = 0; o < 4; o++) CHECK_NEAR(y[o], want[o], 1e-6);
    /* an unadapted projection leaves y alone */
    squad_lora_proj none = {0};
    squad_lora_apply_ref(&none, 1.0f, x, y);
    for (int o = 0; o < 4; o++) CHECK_NEAR(y[o], want[o], 1e-6);
}

/* The router of a loaded directory on hidden states: the route a direct computation gives. */
static void check_loaded_router(void) {
    char *dir = fresh_dir(SQUAD_SYNTH_CONDITIONAL, ST_F32, 0);
    squad_err e = {0};
    squad_specialists *sp = squad_specialists_load_config(&g_cfg, dir, &e);
    CHECKF(sp != NULL, "%s", e.msg);
    if (sp) {
        enum { T = 9 };
        float x[T * 64];
        for (int i = 0; i < T * 64; i++) x[i] = sinf(0.37f * (float)i) + 0.1f * (float)(i % 3);
        squad_router_feat f;
        CHECK(squad_router_feat_init(&f, 64, &e) == 0);
        squad_router_feat_add(&f, x, T, 64, sp->router.eps);
        float probs[3];
        int route = squad_router_route(&sp->router, &f, NULL, probs, &e);
        CHECK(route >= 0 && route < 3);
        for (int k = 0; k < 3; k++) CHECK(probs[k] <= probs[route]);
        CHECK_NEAR(probs[0] + probs[1] + probs[2], 1.0, 1e-6);
        squad_router_feat_free(&f);
        squad_specialists_free(sp);
    }
    free(dir);
}

/* ---------------------------------------------------------------------------------------------
 * Refusals: one per invalid case; each message must contain both needles
 */

typedef struct refusal {
    const char *what;
    void (*edit)(const char *dir);
    const char *needle1, *needle2;
} refusal;

static void e_dora(const char *d) { json_edit(d, "e2e/adapter_config.json", "use_dora", json_true()); }
static void e_dora_tensor(const char *d) {
    st_edit(d, "e2e/adapter_model.safetensors", OP_ADD, A_PRE "2.mlp.down_proj.lora_magnitude_vector", 1, 64, 0, NULL);
}
static void e_bias(const char *d) { json_edit(d, "nav/adapter_config.json", "bias", json_string("lora_only")); }
static void e_bias_tensor(const char *d) {
    st_edit(d, "nav/adapter_model.safetensors", OP_ADD, A_PRE "3.self_attn.o_proj.lora_B.bias", 1, 64, 0, NULL);
}
static void e_lora_bias(const char *d) { json_edit(d, "nav/adapter_config.json", "lora_bias", json_true()); }
static void e_unknown_target(const char *d) {
    json_edit(d, "e2e/adapter_config.json", "target_modules", json_pack("[s, s]", "down_proj", "linear_attn.conv1d"));
}
static void e_unmapped_module(const char *d) {
    st_edit(d, "e2e/adapter_model.safetensors", OP_ADD, A_PRE "2.linear_attn.conv1d.lora_A.weight", 2, 4, 4, NULL);
}
static void e_outside_layers(const char *d) {
    st_edit(d, "e2e/adapter_model.safetensors", OP_ADD, "base_model.model.lm_head.lora_A.weight", 2, 4, 64, NULL);
}
static void e_embedding_lora(const char *d) {
    st_edit(d, "nav/adapter_model.safetensors", OP_ADD, "base_model.model.model.embed_tokens.lora_embedding_A", 2, 4,
            300, NULL);
}
static void e_attn_on_gdn(const char *d) {
    st_edit(d, "e2e/adapter_model.safetensors", OP_ADD, A_PRE "2.self_attn.q_proj.lora_A.weight", 2, 4, 64, NULL);
}
static void e_not_in_targets(const char *d) {
    json_edit(d, "e2e/adapter_config.json", "target_modules",
              json_pack("[s,s,s,s,s,s,s,s,s,s,s]", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj",
                        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"));
}
static void e_shape_a(const char *d) {
    st_edit(d, "e2e/adapter_model.safetensors", OP_RESHAPE, A_PRE "2.mlp.down_proj.lora_A.weight", 2, 4, 64, NULL);
}
static void e_shape_b(const char *d) {
    st_edit(d, "nav/adapter_model.safetensors", OP_RESHAPE, A_PRE "3.self_attn.q_proj.lora_B.weight", 2, 10, 4, NULL);
}
static void e_shape_1d(const char *d) {
    st_edit(d, "nav/adapter_model.safetensors", OP_RESHAPE, A_PRE "3.mlp.up_proj.lora_A.weight", 1, 256, 0, NULL);
}
static void e_rank(const char *d) { json_edit(d, "e2e/adapter_config.json", "r", json_integer(8)); }
static void e_modules_to_save(const char *d) {
    json_edit(d, "e2e/adapter_config.json", "modules_to_save", json_pack("[s]", "lm_head"));
}
static void e_rank_pattern(const char *d) {
    json_edit(d, "nav/adapter_config.json", "rank_pattern", json_pack("{s:i}", "down_proj", 8));
}
static void e_peft_type(const char *d) { json_edit(d, "nav/adapter_config.json", "peft_type", json_string("IA3")); }
static void e_no_alpha(const char *d) { json_edit(d, "nav/adapter_config.json", "lora_alpha", NULL); }
static void e_rm(const char *d, const char *f) {
    char *p = join(d, f);
    CHECK(unlink(p) == 0);
    free(p);
}
static void e_no_config(const char *d) { e_rm(d, "e2e/adapter_config.json"); }
static void e_no_weights(const char *d) { e_rm(d, "nav/adapter_model.safetensors"); }
static void e_no_router(const char *d) { e_rm(d, "router.safetensors"); }
static void e_no_spec(const char *d) { e_rm(d, "squad-specialists.json"); }
static void e_label_no_adapter(const char *d) { json_edit(d, "squad-specialists.json", "specialists.nav", NULL); }
static void e_adapter_no_label(const char *d) {
    json_edit(d, "squad-specialists.json", "specialists.xyz", json_string("e2e"));
}
static void e_trunk_adapter(const char *d) {
    json_edit(d, "squad-specialists.json", "specialists.trunk", json_string("e2e"));
}
static void e_dup_label(const char *d) {
    json_edit(d, "squad-specialists.json", "router.labels", json_pack("[s,s,s]", "trunk", "e2e", "e2e"));
}
static void e_missing_adapter_dir(const char *d) {
    json_edit(d, "squad-specialists.json", "specialists.nav", json_string("nowhere"));
}
static void e_duplicate_key(const char *d) {
    char *p = join(d, "squad-specialists.json");
    FILE *f = fopen(p, "w");
    CHECK(f && fputs("{\"router\": {\"file\": \"router.safetensors\", \"layer\": 2, \"features\": \"rmsnorm\","
                     " \"eps\": 1e-6, \"labels\": [\"trunk\", \"e2e\", \"nav\"]}, \"split\": 2,"
                     " \"specialists\": {\"e2e\": \"e2e\", \"nav\": \"nav\", \"nav\": \"e2e\"}}",
                     f) >= 0 && fclose(f) == 0);
    free(p);
}
static void e_below_split(const char *d) {
    json_edit(d, "squad-specialists.json", "split", json_integer(3));
    json_edit(d, "squad-specialists.json", "router.layer", json_integer(3));
}
static void e_router_above_split(const char *d) {
    json_edit(d, "squad-specialists.json", "router.layer", json_integer(3));
}
static void e_split_range(const char *d) { json_edit(d, "squad-specialists.json", "split", json_integer(4)); }
static void e_features(const char *d) { json_edit(d, "squad-specialists.json", "router.features", json_string("mean")); }
static void e_eps(const char *d) { json_edit(d, "squad-specialists.json", "router.eps", NULL); }
static void e_unknown_field(const char *d) { json_edit(d, "squad-specialists.json", "splt", json_integer(2)); }
static void e_unknown_router_field(const char *d) {
    json_edit(d, "squad-specialists.json", "router.temperature", json_real(2.0));
}
static void e_router_weight(const char *d) { st_edit(d, "router.safetensors", OP_RESHAPE, "weight", 2, 3, 32, NULL); }
static void e_router_labels(const char *d) {
    /* four labels, an adapter for the fourth, and a router still sized for three */
    json_edit(d, "squad-specialists.json", "router.labels", json_pack("[s,s,s,s]", "trunk", "e2e", "nav", "ui"));
    json_edit(d, "squad-specialists.json", "specialists.ui", json_string("e2e"));
}
static void e_router_bias(const char *d) { st_edit(d, "router.safetensors", OP_RESHAPE, "bias", 1, 2, 0, NULL); }
static void e_router_extra(const char *d) { st_edit(d, "router.safetensors", OP_ADD, "scale", 1, 3, 0, NULL); }
static void e_router_missing(const char *d) { st_edit(d, "router.safetensors", OP_DROP, "bias", 0, 0, 0, NULL); }
static void e_a_without_b(const char *d) {
    st_edit(d, "e2e/adapter_model.safetensors", OP_DROP, A_PRE "3.mlp.up_proj.lora_B.weight", 0, 0, 0, NULL);
}
static void e_nan(const char *d) {
    st_edit(d, "nav/adapter_model.safetensors", OP_NAN, A_PRE "2.linear_attn.in_proj_z.lora_B.weight", 0, 0, 0, NULL);
}
static void e_layer_range(const char *d) {
    st_edit(d, "e2e/adapter_model.safetensors", OP_ADD, A_PRE "9.mlp.down_proj.lora_A.weight", 2, 4, 128, NULL);
}
static void e_twice(const char *d) {
    st_edit(d, "e2e/adapter_model.safetensors", OP_ADD,
            "base_model.model.model.language_model.layers.3.mlp.down_proj.lora_A.weight", 2, 4, 128, NULL);
}
static void e_unnamed_suffix(const char *d) {
    st_edit(d, "e2e/adapter_model.safetensors", OP_RENAME, A_PRE "3.mlp.down_proj.lora_A.weight", 0, 0, 0,
            A_PRE "3.mlp.down_proj.lora_A.default.weight");
}

static const refusal REFUSALS[] = {
    {"DoRA (use_dora)", e_dora, "'e2e'", "use_dora"},
    {"DoRA magnitude tensor", e_dora_tensor, "'e2e'", A_PRE "2.mlp.down_proj.lora_magnitude_vector"},
    {"LoRA bias (bias field)", e_bias, "'nav'", "'bias'"},
    {"LoRA bias tensor", e_bias_tensor, "'nav'", A_PRE "3.self_attn.o_proj.lora_B.bias"},
    {"LoRA bias (lora_bias field)", e_lora_bias, "'nav'", "lora_bias"},
    {"unknown target module", e_unknown_target, "'e2e'", "linear_attn.conv1d"},
    {"unmapped module tensor", e_unmapped_module, "'e2e'", A_PRE "2.linear_attn.conv1d.lora_A.weight"},
    {"tensor outside the layers", e_outside_layers, "'e2e'", "base_model.model.lm_head.lora_A.weight"},
    {"embedding LoRA", e_embedding_lora, "'nav'", "lora_embedding_A"},
    {"attention projection on a GDN layer", e_attn_on_gdn, "'e2e'", A_PRE "2.self_attn.q_proj.lora_A.weight"},
    {"module not in target_modules", e_not_in_targets, "'e2e'", A_PRE "2.mlp.down_proj.lora_A.weight"},
    {"lora_A shape", e_shape_a, "'e2e'", A_PRE "2.mlp.down_proj.lora_A.weight"},
    {"lora_B shape", e_shape_b, "'nav'", A_PRE "3.self_attn.q_proj.lora_B.weight"},
    {"1-D lora_A", e_shape_1d, "'nav'", A_PRE "3.mlp.up_proj.lora_A.weight"},
    {"rank mismatch", e_rank, "'e2e'", "r = 8"},
    {"modules_to_save", e_modules_to_save, "'e2e'", "modules_to_save"},
    {"rank_pattern", e_rank_pattern, "'nav'", "rank_pattern"},
    {"peft_type", e_peft_type, "'nav'", "peft_type"},
    {"no lora_alpha", e_no_alpha, "'nav'", "lora_alpha"},
    {"missing adapter_config.json", e_no_config, "'e2e'", "adapter_config.json"},
    {"missing adapter_model.safetensors", e_no_weights, "'nav'", "adapter_model.safetensors"},
    {"missing adapter directory", e_missing_adapter_dir, "'nav'", "nowhere"},
    {"a key given twice in the JSON", e_duplicate_key, "squad-specialists.json", "nav"},
    {"missing router file", e_no_router, "router file", "router.safetensors"},
    {"missing squad-specialists.json", e_no_spec, "specialists", "squad-specialists.json"},
    {"label without adapter", e_label_no_adapter, "'nav'", "specialists"},
    {"adapter without label", e_adapter_no_label, "specialists.xyz", "router.labels"},
    {"adapter for the trunk", e_trunk_adapter, "specialists.trunk", "trunk"},
    {"duplicate label", e_dup_label, "'e2e'", "twice"},
    {"adapter weights below split", e_below_split, "'e2e'", "below split 3"},
    {"router layer above split", e_router_above_split, "router.layer", "split = 2"},
    {"split out of range", e_split_range, "'split'", "4 layers"},
    {"router features", e_features, "router.features", "rmsnorm"},
    {"router eps missing", e_eps, "router.eps", "squad-specialists.json"},
    {"unknown field", e_unknown_field, "unknown field", "splt"},
    {"unknown router field", e_unknown_router_field, "unknown field", "router.temperature"},
    {"router weight shape", e_router_weight, "router.safetensors", "'weight'"},
    {"router sized for other labels", e_router_labels, "'weight'", "[4, 64]"},
    {"router bias shape", e_router_bias, "router.safetensors", "'bias'"},
    {"extra router tensor", e_router_extra, "router.safetensors", "'scale'"},
    {"missing router tensor", e_router_missing, "router.safetensors", "'bias' is missing"},
    {"lora_A without lora_B", e_a_without_b, "'e2e'", A_PRE "3.mlp.up_proj.lora_B.weight' is missing"},
    {"non-finite value", e_nan, "'nav'", A_PRE "2.linear_attn.in_proj_z.lora_B.weight"},
    {"layer beyond the model", e_layer_range, "'e2e'", A_PRE "9.mlp.down_proj.lora_A.weight"},
    {"a projection given twice", e_twice, "'e2e'", "language_model.layers.3.mlp.down_proj.lora_A.weight"},
    {"an unrecognised tensor suffix", e_unnamed_suffix, "'e2e'", A_PRE "3.mlp.down_proj.lora_A.default.weight"},
};

static void check_refusals(void) {
    for (size_t i = 0; i < sizeof REFUSALS / sizeof REFUSALS[0]; i++) {
        const refusal *c = &REFUSALS[i];
        char *dir = fresh_dir(SQUAD_SYNTH_CAUSAL, ST_BF16, 0);
        c->edit(dir);
        squad_err e = {0};
        squad_specialists *sp = squad_specialists_load_config(&g_cfg, dir, &e);
        CHECKF(sp == NULL, "%s: loaded", c->what);
        squad_specialists_free(sp);
        CHECKF(e.code < 0 && strstr(e.msg, c->needle1) && strstr(e.msg, c->needle2), "%s: [%s]", c->what, e.msg);
        if (getenv("SQUAD_TEST_VERBOSE")) fprintf(stderr, "%-40s %s\n", c->what, e.msg);
        free(dir);
    }
}

/* ---------------------------------------------------------------------------------------------
 * The reference fixture of tools/make_specialist_fixtures.py (peft's own files), when present
 */

#define FIXTURE "tests/fixtures/specialists"

static void check_fixture(void) {
    if (access(FIXTURE "/manifest.json", R_OK) != 0) {
        /* The fixture is made on the GPU machine (peft, transformers); everything above ran. */
        fprintf(stderr,
                "NOT RUN: %s/manifest.json is absent (tools/make_specialist_fixtures.py makes it), so these "
                "checks did not run: loading peft's own adapter files (adapter count, scales, pair counts, "
                "ranks, router layer) and its expected.jsonl's routes against the loaded adapters\n",
                FIXTURE);
        return;
    }
    squad_err e = {0};
    squad_model *m = squad_model_load(FIXTURE "/base", &e);
    CHECKF(m != NULL, "%s", e.msg);
    squad_specialists *sp = m ? squad_specialists_load(m, FIXTURE "/specialists", &e) : NULL;
    CHECKF(sp != NULL, "peft's adapters: %s", e.msg);
    if (sp) {
        CHECK(squad_specialists_count(sp) == 3 && squad_specialists_find(sp, "e2e") == 1 &&
              squad_specialists_find(sp, "nav") == 2);
        CHECK(sp->split == 3 && sp->router.layer == 2);
        CHECK_NEAR(sp->adapters[1].scale, 8.0 / 4.0, 1e-6);
        CHECK_NEAR(sp->adapters[2].scale, 6.0 / sqrt(8.0), 1e-6);
        /* layers 3 (attention: 4 + 3), 4 (GDN: 5 + 3), 5 (attention: 4 + 3) */
        CHECK(sp->adapters[1].n_pairs == 22 && sp->adapters[2].n_pairs == 22);
        CHECK(sp->adapters[2].r == 8 && sp->adapters[2].proj[4][SQUAD_PROJ_IN_QKV].r == 8);
    }
    int nr = 0, ne = 0;
    char **rows = test_read_lines(FIXTURE "/rows.jsonl", &nr), **exp = test_read_lines(FIXTURE "/expected.jsonl", &ne);
    CHECK(nr > 0 && nr == ne);
    int seen[3] = {0};
    for (int i = 0; i < ne && sp; i++) {
        json_error_t je;
        json_t *j = json_loads(exp[i], 0, &je);
        const char *route = json_string_value(json_object_get(j, "route"));
        int k = route ? squad_specialists_find(sp, route) : -1;
        CHECKF(k >= 0 && k == json_integer_value(json_object_get(j, "route_index")), "expected line %d", i + 1);
        if (k >= 0) seen[k]++;
        json_decref(j);
    }
    CHECK(!sp || (seen[0] > 0 && seen[1] > 0 && seen[2] > 0));
    test_free_lines(rows, nr);
    test_free_lines(exp, ne);
    squad_specialists_free(sp);
    squad_model_free(m);
}

int main(void) {
    squad_err e = {0};
    if (squad_synth_preset_config("tiny", &g_cfg, &e) != 0) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    check_router();
    check_lora_ref();
    check_valid(SQUAD_SYNTH_CAUSAL, ST_BF16, 0);
    check_valid(SQUAD_SYNTH_CONDITIONAL, ST_BF16, 1);
    check_valid(SQUAD_SYNTH_CAUSAL, ST_F32, 1);
    check_valid(SQUAD_SYNTH_CONDITIONAL, ST_F32, 0);
    check_public_api();
    check_peft_config();
    check_f16();
    check_loaded_router();
    check_refusals();
    check_fixture();
    return test_summary("test_specialists");
}
