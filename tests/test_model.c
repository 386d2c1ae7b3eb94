/*
 * test_model.c — loading checkpoints: synthesized tiny models in both layouts load with every
 * shape checked; bf16 matrices are used in place (zero copy); F32 and F16 checkpoints bind to the
 * same values; tied and untied embeddings; shards; model.visual.* / mtp.* ignored; and clear
 * errors for a missing tensor, a wrong shape, an unsupported dtype, an unexpected tensor, an
 * untied config without lm_head, and missing files.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "synth.h"
#include "testutil.h"
#include "tolerances.h"
#include "util.h"

static char g_root[256];

static const char *dir_in(const char *name) {
    static char buf[32][512];
    static int k;
    k = (k + 1) & 31; /* a ring: callers keep up to 32 names at once */
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_root, name);
    return buf[k];
}

static int synth(const char *preset, const char *dir, squad_synth_layout layout, st_dtype dtype, uint64_t seed) {
    squad_synth_opts o = {.preset = preset, .out_dir = dir, .seed = seed, .layout = layout, .dtype = dtype};
    squad_err e = {0};
    int rc = squad_synth_write(&o, &e);
    CHECKF(rc == 0, "synth %s: %s", preset, e.msg);
    return rc;
}

static squad_model *load_ok(const char *dir) {
    squad_err e = {0};
    squad_model *m = squad_model_load(dir, &e);
    CHECKF(m != NULL, "loading %s: %s", dir, e.msg);
    return m;
}

/* Loading must fail with SQUAD_E_MODEL and a message containing needle. */
static void load_fails(const char *dir, const char *needle) {
    squad_err e = {0};
    squad_model *m = squad_model_load(dir, &e);
    CHECKF(m == NULL && e.code == SQUAD_E_MODEL && strstr(e.msg, needle), "loading %s: code %d msg '%s' (wanted '%s')",
           dir, e.code, m ? "(loaded)" : e.msg, needle);
    squad_model_free(m);
}

static int in_map(const squad_model *m, const void *p) {
    for (int i = 0; i < m->files.n_files; i++) {
        const uint8_t *b = m->files.files[i].map;
        if ((const uint8_t *)p >= b && (const uint8_t *)p < b + m->files.files[i].map_size) return 1;
    }
    return 0;
}

static int mat_ok(const squad_mat *w, int rows, int cols) { return w->w && w->rows == rows && w->cols == cols; }

static void check_shapes(const squad_model *m) {
    const squad_config *c = &m->cfg;
    int H = c->hidden_size, I = c->intermediate_size, C = squad_config_gdn_channels(c);
    CHECK(mat_ok(&m->embed, c->vocab_size, H) && mat_ok(&m->lm_head, c->vocab_size, H) && m->final_norm);
    for (int i = 0; i < c->num_layers; i++) {
        const squad_layer_weights *L = &m->layers[i];
        CHECK(L->kind == c->layer_types[i] && L->input_norm && L->post_norm);
        CHECK(mat_ok(&L->mlp_gate, I, H) && mat_ok(&L->mlp_up, I, H) && mat_ok(&L->mlp_down, H, I));
        if (L->kind == SQUAD_LAYER_LINEAR) {
            int nv = c->lin_num_v_heads, dv = c->lin_v_dim;
            CHECK(mat_ok(&L->in_qkv, C, H) && mat_ok(&L->in_z, nv * dv, H) && mat_ok(&L->in_b, nv, H) &&
                  mat_ok(&L->in_a, nv, H) && mat_ok(&L->out_proj, H, nv * dv));
            CHECK(L->conv_w && L->A_log && L->dt_bias && L->gdn_norm && !L->q_proj.w);
            int in_range = 1;
            for (int h = 0; h < nv; h++) in_range &= expf(L->A_log[h]) >= 0.019f && expf(L->A_log[h]) <= 8.1f; /* synth: [0.5, 8]; fixtures [0.02, 8] */
            CHECK(in_range);
        } else {
            int nh = c->num_heads, nkv = c->num_kv_heads, hd = c->head_dim;
            CHECK(mat_ok(&L->q_proj, nh * 2 * hd, H) && mat_ok(&L->k_proj, nkv * hd, H) &&
                  mat_ok(&L->v_proj, nkv * hd, H) && mat_ok(&L->o_proj, H, nh * hd));
            CHECK(L->q_norm && L->k_norm && !L->in_qkv.w && !L->conv_w);
        }
    }
}

static void test_tiny_causal(void) {
    const char *dir = dir_in("tiny");
    if (synth("tiny", dir, SQUAD_SYNTH_CAUSAL, ST_BF16, 7) != 0) return;
    squad_model *m = load_ok(dir);
    if (!m) return;
    CHECK(m->cfg.hidden_size == 64 && m->cfg.num_layers == 4 && m->cfg.tie_embeddings);
    CHECK(squad_model_vocab_size(m) == 300);
    CHECK(squad_model_max_tokens(m) == 262144); /* max_position_embeddings, as the model says */
    check_shapes(m);
    /* bf16 matrices point into the map; vectors are owned fp32. */
    CHECK(in_map(m, m->embed.w) && in_map(m, m->layers[0].in_qkv.w) && in_map(m, m->layers[3].q_proj.w));
    CHECK(!in_map(m, m->final_norm) && !in_map(m, m->layers[0].conv_w));
    CHECK(m->lm_head.w == m->embed.w); /* tied */
    /* The GDN gated norm weight is around 1, the zero-centred ones around 0. */
    double gn = 0, zn = 0;
    for (int i = 0; i < m->cfg.lin_v_dim; i++) gn += m->layers[0].gdn_norm[i];
    for (int i = 0; i < m->cfg.hidden_size; i++) zn += m->layers[0].input_norm[i];
    CHECK(fabs(gn / m->cfg.lin_v_dim - 1.0) < 0.2 && fabs(zn / m->cfg.hidden_size) < 0.2);
    squad_model_free(m);
}

/* Two models hold the same values (matrices compared as floats; tol for F16 round-off). */
static void compare_models(const squad_model *a, const squad_model *b, double tol, const char *what) {
    double worst = 0;
    int mismatch = 0;
#define CMP_MAT(x, y)                                                                          \
    do {                                                                                       \
        size_t n_ = (size_t)(x).rows * (size_t)(x).cols;                                       \
        if ((x).rows != (y).rows || (x).cols != (y).cols) mismatch = 1;                        \
        for (size_t i_ = 0; !mismatch && i_ < n_; i_++) {                                      \
            double d_ = fabs((double)squad_bf16_to_f32((x).w[i_]) - squad_bf16_to_f32((y).w[i_])); \
            if (d_ > worst) worst = d_;                                                        \
        }                                                                                      \
    } while (0)
#define CMP_VEC(x, y, n)                                    \
    do {                                                    \
        for (int i_ = 0; i_ < (n); i_++) {                  \
            double d_ = fabs((double)(x)[i_] - (y)[i_]);    \
            if (d_ > worst) worst = d_;                     \
        }                                                   \
    } while (0)
    const squad_config *c = &a->cfg;
    CMP_MAT(a->embed, b->embed);
    CMP_MAT(a->lm_head, b->lm_head);
    CMP_VEC(a->final_norm, b->final_norm, c->hidden_size);
    for (int l = 0; l < c->num_layers; l++) {
        const squad_layer_weights *x = &a->layers[l], *y = &b->layers[l];
        CMP_MAT(x->mlp_gate, y->mlp_gate);
        CMP_MAT(x->mlp_up, y->mlp_up);
        CMP_MAT(x->mlp_down, y->mlp_down);
        CMP_VEC(x->input_norm, y->input_norm, c->hidden_size);
        CMP_VEC(x->post_norm, y->post_norm, c->hidden_size);
        if (x->kind == SQUAD_LAYER_LINEAR) {
            CMP_MAT(x->in_qkv, y->in_qkv);
            CMP_MAT(x->in_z, y->in_z);
            CMP_MAT(x->in_b, y->in_b);
            CMP_MAT(x->in_a, y->in_a);
            CMP_MAT(x->out_proj, y->out_proj);
            CMP_VEC(x->conv_w, y->conv_w, squad_config_gdn_channels(c) * c->conv_kernel);
            CMP_VEC(x->A_log, y->A_log, c->lin_num_v_heads);
            CMP_VEC(x->dt_bias, y->dt_bias, c->lin_num_v_heads);
            CMP_VEC(x->gdn_norm, y->gdn_norm, c->lin_v_dim);
        } else {
            CMP_MAT(x->q_proj, y->q_proj);
            CMP_MAT(x->k_proj, y->k_proj);
            CMP_MAT(x->v_proj, y->v_proj);
            CMP_MAT(x->o_proj, y->o_proj);
            CMP_VEC(x->q_norm, y->q_norm, c->head_dim);
            CMP_VEC(x->k_norm, y->k_norm, c->head_dim);
        }
    }
#undef CMP_MAT
#undef CMP_VEC
    CHECKF(!mismatch && worst <= tol, "%s: largest difference %g (tol %g)%s", what, worst, tol,
           mismatch ? ", shapes differ" : "");
}

static void test_dtypes_and_layouts(void) {
    const char *bf = dir_in("mha-bf16"), *f32 = dir_in("mha-f32"), *f16 = dir_in("mha-f16"), *cond = dir_in("mha-cond");
    if (synth("tiny-mha", bf, SQUAD_SYNTH_CAUSAL, ST_BF16, 3) || synth("tiny-mha", f32, SQUAD_SYNTH_CAUSAL, ST_F32, 3) ||
        synth("tiny-mha", f16, SQUAD_SYNTH_CAUSAL, ST_F16, 3) ||
        synth("tiny-mha", cond, SQUAD_SYNTH_CONDITIONAL, ST_BF16, 3))
        return;
    squad_model *a = load_ok(bf), *b = load_ok(f32), *c = load_ok(f16), *d = load_ok(cond);
    if (a && b && c && d) {
        check_shapes(a);
        check_shapes(d);
        CHECK(!a->cfg.tie_embeddings && a->lm_head.w != a->embed.w); /* untied */
        CHECK(d->cfg.nested && !d->cfg.tie_embeddings);
        /* F32 and F16 matrices were converted into owned bf16 buffers. */
        CHECK(!in_map(b, b->embed.w) && !in_map(c, c->layers[0].q_proj.w) && b->n_owned > a->n_owned);
        compare_models(a, b, 0.0, "F32 vs BF16");
        compare_models(a, c, TOL_MODEL_F16_LOAD, "F16 vs BF16");
        compare_models(a, d, 0.0, "conditional vs causal layout");
    }
    squad_model_free(a);
    squad_model_free(b);
    squad_model_free(c);
    squad_model_free(d);

    /* A different seed gives different weights; the same seed the same file. */
    const char *again = dir_in("mha-again");
    synth("tiny-mha", again, SQUAD_SYNTH_CAUSAL, ST_BF16, 3);
    squad_err e;
    size_t n1 = 0, n2 = 0;
    char *p1 = squad_path_join(bf, "model.safetensors", &e), *p2 = squad_path_join(again, "model.safetensors", &e);
    char *f1 = squad_read_file(p1, &n1, &e), *f2 = squad_read_file(p2, &n2, &e);
    CHECK(f1 && f2 && n1 == n2 && !memcmp(f1, f2, n1));
    free(f2);
    synth("tiny-mha", again, SQUAD_SYNTH_CAUSAL, ST_BF16, 4);
    f2 = squad_read_file(p2, &n2, &e);
    CHECK(f1 && f2 && n1 == n2 && memcmp(f1, f2, n1) != 0);
    free(f1);
    free(f2);
    free(p1);
    free(p2);
}

/* ---------------------------------------------------------------------------------------------
 * Rewriting checkpoints for the error cases
 */

typedef struct extra_tensor {
    const char *name;
    int ndim;
    int64_t shape[3];
} extra_tensor;

/* Copies src's tensors into dst/model.safetensors, leaving out `drop` (may be NULL) and adding
 * zero-filled extras; config.json is copied, with `edit` applied (may be NULL). */
static void rewrite(const char *src, const char *dst, const char *drop, const extra_tensor *extras, int n_extras,
                    void (*edit)(json_t *cfg)) {
    squad_err e = {0};
    st_set set;
    if (st_set_open_dir(&set, src, &e) != 0) {
        CHECKF(0, "%s", e.msg);
        return;
    }
    int n = 0;
    for (int f = 0; f < set.n_files; f++) n += set.files[f].n_tensors;
    st_write_tensor *t = calloc((size_t)(n + n_extras), sizeof *t);
    void *zeros = calloc(1, 1 << 20);
    int k = 0;
    for (int f = 0; f < set.n_files; f++)
        for (int i = 0; i < set.files[f].n_tensors; i++) {
            const st_tensor *x = &set.files[f].tensors[i];
            if (drop && !strcmp(x->name, drop)) continue;
            t[k] = (st_write_tensor){x->name, x->dtype, x->ndim, {0}, x->data};
            for (int d = 0; d < x->ndim; d++) t[k].shape[d] = x->shape[d];
            k++;
        }
    for (int i = 0; i < n_extras; i++) {
        t[k] = (st_write_tensor){extras[i].name, ST_BF16, extras[i].ndim, {0}, zeros};
        for (int d = 0; d < extras[i].ndim; d++) t[k].shape[d] = extras[i].shape[d];
        k++;
    }
    mkdir(dst, 0755);
    char *path = squad_path_join(dst, "model.safetensors", &e);
    CHECKF(st_write_file(path, t, k, &e) == 0, "%s", e.msg);
    free(path);
    st_set_close(&set);
    free(t);
    free(zeros);

    char *cin = squad_path_join(src, "config.json", &e), *cout = squad_path_join(dst, "config.json", &e);
    json_error_t je;
    json_t *cfg = json_load_file(cin, 0, &je);
    if (edit) edit(cfg);
    json_dump_file(cfg, cout, JSON_INDENT(2));
    json_decref(cfg);
    free(cin);
    free(cout);
}

static void edit_intermediate(json_t *c) { json_object_set_new(c, "intermediate_size", json_integer(96)); }
static void edit_untie(json_t *c) { json_object_set_new(c, "tie_word_embeddings", json_false()); }
static void edit_max_position(json_t *c) { json_object_set_new(c, "max_position_embeddings", json_integer(1000)); }

/* Replaces, in dir/model.safetensors, the dtype of one tensor by a same-size other dtype. */
static void patch_dtype(const char *dir, const char *from, const char *to) {
    squad_err e;
    char *path = squad_path_join(dir, "model.safetensors", &e);
    size_t n = 0;
    char *buf = squad_read_file(path, &n, &e);
    char *hit = buf ? strstr(buf + 8, from) : NULL;
    CHECK(hit && strlen(from) == strlen(to));
    if (hit) {
        memcpy(hit, to, strlen(to));
        FILE *f = fopen(path, "wb");
        fwrite(buf, 1, n, f);
        fclose(f);
    }
    free(buf);
    free(path);
}

static void test_errors(void) {
    const char *src = dir_in("tiny");
    const char *d1 = dir_in("no-alog"), *d2 = dir_in("bad-shape"), *d3 = dir_in("bad-dtype"), *d4 = dir_in("bias"),
               *d5 = dir_in("untied"), *d6 = dir_in("extras"), *d7 = dir_in("maxpos"), *d8 = dir_in("no-embed");

    rewrite(src, d1, "model.layers.1.linear_attn.A_log", NULL, 0, NULL);
    load_fails(d1, "missing tensor 'model.layers.1.linear_attn.A_log' (expected shape [4])");

    rewrite(src, d2, NULL, NULL, 0, edit_intermediate);
    load_fails(d2, "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [128, 64]; the config needs [96, 64]");

    rewrite(src, d3, NULL, NULL, 0, NULL);
    patch_dtype(d3, "\"model.norm.weight\":{\"dtype\":\"BF16\"", "\"model.norm.weight\":{\"dtype\":\"I16\" ");
    load_fails(d3, "tensor 'model.norm.weight' has dtype I16");

    extra_tensor bias = {"model.layers.3.self_attn.q_proj.bias", 1, {256}};
    rewrite(src, d4, NULL, &bias, 1, NULL);
    load_fails(d4, "unexpected tensor 'model.layers.3.self_attn.q_proj.bias'");
    extra_tensor stray = {"model.layers.4.mlp.up_proj.weight", 2, {128, 64}}; /* a layer the config lacks */
    rewrite(src, d4, NULL, &stray, 1, NULL);
    load_fails(d4, "unexpected tensor 'model.layers.4.mlp.up_proj.weight'");
    extra_tensor wrong_kind = {"model.layers.0.self_attn.q_norm.weight", 1, {32}}; /* layer 0 is linear */
    rewrite(src, d4, NULL, &wrong_kind, 1, NULL);
    load_fails(d4, "unexpected tensor 'model.layers.0.self_attn.q_norm.weight'");

    rewrite(src, d5, NULL, NULL, 0, edit_untie);
    load_fails(d5, "tie_word_embeddings is false: missing tensor 'lm_head.weight' (expected shape [300, 64])");

    /* Vision and MTP tensors, and an lm_head next to tied embeddings, are ignored. */
    extra_tensor extras[3] = {{"model.visual.blocks.0.attn.qkv.weight", 2, {8, 8}},
                              {"mtp.layers.0.mlp.up_proj.weight", 2, {4, 4}},
                              {"lm_head.weight", 2, {300, 64}}};
    rewrite(src, d6, NULL, extras, 3, NULL);
    squad_model *m = load_ok(d6);
    if (m) CHECK(m->lm_head.w == m->embed.w);
    squad_model_free(m);

    rewrite(src, d7, NULL, NULL, 0, edit_max_position);
    m = load_ok(d7);
    if (m) CHECK(squad_model_max_tokens(m) == 1000);
    squad_model_free(m);

    rewrite(src, d8, "model.embed_tokens.weight", NULL, 0, NULL);
    load_fails(d8, "model.embed_tokens.weight");

    /* Missing directory, missing config, missing weights. */
    load_fails(dir_in("does-not-exist"), "does-not-exist");
    char *cfg = squad_path_join(d8, "config.json", &(squad_err){0});
    load_fails(cfg, "not a directory");
    remove(cfg);
    load_fails(d8, "config.json");
    free(cfg);
    const char *empty = dir_in("weightless");
    rewrite(src, empty, NULL, NULL, 0, NULL);
    char *w = squad_path_join(empty, "model.safetensors", &(squad_err){0});
    remove(w);
    free(w);
    load_fails(empty, "model.safetensors");
    /* A corrupt weights file names the file. */
    w = squad_path_join(empty, "model.safetensors", &(squad_err){0});
    FILE *f = fopen(w, "wb");
    fputs("\x10\0\0\0\0\0\0\0{\"a\":1}", f);
    fclose(f);
    load_fails(empty, w);
    free(w);
    /* NULL err is allowed. */
    CHECK(squad_model_load(dir_in("does-not-exist"), NULL) == NULL);
    squad_model_free(NULL);
}

/* The tiny model split over two shards with an index loads the same weights. */
static void test_shards(void) {
    const char *src = dir_in("tiny"), *dst = dir_in("sharded");
    squad_err e = {0};
    st_set set;
    if (st_set_open_dir(&set, src, &e) != 0) return;
    st_file *f = &set.files[0];
    int half = f->n_tensors / 2;
    st_write_tensor *t = calloc((size_t)f->n_tensors, sizeof *t);
    json_t *wm = json_object();
    for (int i = 0; i < f->n_tensors; i++) {
        const st_tensor *x = &f->tensors[i];
        t[i] = (st_write_tensor){x->name, x->dtype, x->ndim, {0}, x->data};
        for (int d = 0; d < x->ndim; d++) t[i].shape[d] = x->shape[d];
        json_object_set_new(wm, x->name, json_string(i < half ? "model-00001-of-00002.safetensors"
                                                              : "model-00002-of-00002.safetensors"));
    }
    mkdir(dst, 0755);
    char *p1 = squad_path_join(dst, "model-00001-of-00002.safetensors", &e);
    char *p2 = squad_path_join(dst, "model-00002-of-00002.safetensors", &e);
    char *pi = squad_path_join(dst, "model.safetensors.index.json", &e);
    CHECK(st_write_file(p1, t, half, &e) == 0 && st_write_file(p2, t + half, f->n_tensors - half, &e) == 0);
    json_t *index = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", wm);
    json_dump_file(index, pi, JSON_INDENT(2));
    json_decref(index);
    char *ci = squad_path_join(src, "config.json", &e), *co = squad_path_join(dst, "config.json", &e);
    size_t n;
    char *text = squad_read_file(ci, &n, &e);
    FILE *fo = fopen(co, "wb");
    fwrite(text, 1, n, fo);
    fclose(fo);
    free(text);
    squad_model *a = load_ok(src), *b = load_ok(dst);
    if (a && b) {
        CHECK(b->files.n_files == 2);
        compare_models(a, b, 0.0, "sharded vs single file");
    }
    squad_model_free(a);
    squad_model_free(b);
    st_set_close(&set);
    free(t);
    free(p1);
    free(p2);
    free(pi);
    free(ci);
    free(co);
}

/* The reference checkpoints that transformers itself wrote (tests/fixtures/models, from
 * tools/make_fixtures.py): flat and nested configs, tied and untied, four shards. */
static void test_transformers_fixtures(void) {
    struct {
        const char *dir;
        int nested, tied, files;
    } fx[] = {{"tests/fixtures/models/tiny-causal", 0, 1, 1},
              {"tests/fixtures/models/tiny-cond-untied", 1, 0, 4},
              {"tests/fixtures/models/small-mha", 0, 1, 1}};
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        squad_model *m = load_ok(fx[i].dir);
        if (!m) continue;
        check_shapes(m);
        CHECKF(m->cfg.nested == fx[i].nested && m->cfg.tie_embeddings == fx[i].tied && m->files.n_files == fx[i].files,
               "%s: nested %d tied %d files %d", fx[i].dir, m->cfg.nested, m->cfg.tie_embeddings, m->files.n_files);
        CHECK(fx[i].tied ? m->lm_head.w == m->embed.w : m->lm_head.w != m->embed.w);
        squad_model_free(m);
    }
}

int main(void) {
    snprintf(g_root, sizeof g_root, "%s", test_tmpdir());
    test_tiny_causal();
    test_dtypes_and_layouts();
    test_errors();
    test_shards();
    test_transformers_fixtures();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_root);
    return test_summary("test_model");
}
