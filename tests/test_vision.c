/*
 * test_vision.c — Qwen3.5's vision tower: its configuration (vision_config, the image token ids,
 * the text rotary's M-RoPE fields), the loading of its weights (model.visual.*), the tiny-vl
 * checkpoint of `squad synth`, and the fp32 CPU tower (src/cpu/vision.c) against hand computations
 * and, when tests/fixtures/vision/ exists, against transformers' own output.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "config.h"
#include "cpu/pool.h"
#include "cpu/vision.h"
#include "image/decode.h"
#include "image/identity.h"
#include "image/preprocess.h"
#include "model.h"
#include "synth.h"
#include "testutil.h"
#include "util.h"
#include "vision_model.h"

#define FIXTURE_COND "tests/fixtures/models/tiny-cond-untied" /* saved by transformers, with a tower */

/* A conditional-generation config with a complete vision_config; variants edit it. */
static const char *BASE =
    "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\": \"qwen3_5\","
    " \"image_token_id\": 151655, \"vision_start_token_id\": 151652, \"vision_end_token_id\": 151653,"
    " \"tie_word_embeddings\": true,"
    " \"text_config\": {\"head_dim\": 32, \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"layer_types\": [\"linear_attention\", \"full_attention\"], \"linear_conv_kernel_dim\": 4,"
    " \"linear_key_head_dim\": 16, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 2,"
    " \"linear_value_head_dim\": 16, \"num_attention_heads\": 2, \"num_hidden_layers\": 2,"
    " \"num_key_value_heads\": 1, \"rms_norm_eps\": 1e-06, \"vocab_size\": 151680,"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e7, \"partial_rotary_factor\": 0.5,"
    " \"mrope_section\": [3, 3, 2], \"mrope_interleaved\": true}},"
    " \"vision_config\": {\"deepstack_visual_indexes\": [], \"depth\": 2, \"hidden_act\": \"gelu_pytorch_tanh\","
    " \"hidden_size\": 32, \"in_channels\": 3, \"intermediate_size\": 48, \"num_heads\": 2,"
    " \"num_position_embeddings\": 16, \"out_hidden_size\": 64, \"patch_size\": 16,"
    " \"rope_parameters\": {\"rope_theta\": 10000.0, \"rope_type\": \"axial\"},"
    " \"spatial_merge_size\": 2, \"temporal_patch_size\": 2}}";

static json_t *base_json(void) {
    json_error_t e;
    json_t *j = json_loads(BASE, 0, &e);
    if (!j) {
        fprintf(stderr, "bad test JSON: %s\n", e.text);
        exit(1);
    }
    return j;
}

static int parse_json(json_t *j, squad_config *c, squad_err *e) {
    char *s = json_dumps(j, 0);
    memset(e, 0, sizeof *e);
    int rc = squad_config_parse(c, s, strlen(s), e);
    free(s);
    return rc;
}

/* A variant of BASE: set (or with value NULL delete) key in the object at path ("" the root). */
static void expect_fail(const char *obj, const char *key, json_t *value, const char *needle) {
    json_t *j = base_json();
    json_t *o = obj[0] ? json_object_get(j, obj) : j;
    if (value)
        json_object_set_new(o, key, value);
    else
        json_object_del(o, key);
    squad_config c;
    squad_err e;
    int rc = parse_json(j, &c, &e);
    CHECKF(rc != 0 && strstr(e.msg, needle), "%s.%s: rc %d, '%s', wanted '%s'", obj, key, rc, rc ? e.msg : "", needle);
    json_decref(j);
}

static void test_config(void) {
    json_t *j = base_json();
    squad_config c;
    squad_err e;
    CHECKF(parse_json(j, &c, &e) == 0, "%s", e.msg);
    const squad_vision_config *v = &c.vision;
    CHECK(c.has_vision == 1);
    CHECK(v->depth == 2 && v->hidden_size == 32 && v->num_heads == 2 && v->head_dim == 16);
    CHECK(v->intermediate_size == 48 && v->hidden_act == SQUAD_VISION_ACT_GELU_TANH);
    CHECK(v->patch_size == 16 && v->temporal_patch_size == 2 && v->spatial_merge_size == 2 && v->in_channels == 3);
    CHECK(v->num_position_embeddings == 16 && v->position_grid_side == 4 && v->out_hidden_size == 64);
    CHECK(v->rope_theta == 10000.0);
    CHECK(c.image_token_id == 151655 && c.vision_start_token_id == 151652 && c.vision_end_token_id == 151653);
    CHECK(c.mrope_section[0] == 3 && c.mrope_section[1] == 3 && c.mrope_section[2] == 2 && c.mrope_interleaved == 1);
    CHECK(squad_vision_tokens(v, 1, 4, 6) == 6);

    /* Defaults: the conventions and the token ids as transformers' classes default them. */
    json_t *vc = json_object_get(j, "vision_config");
    json_object_del(vc, "patch_size");
    json_object_del(vc, "hidden_act");
    json_object_del(vc, "rope_parameters");
    json_object_del(j, "image_token_id");
    json_object_set_new(vc, "deepstack_visual_indexes", json_null());
    CHECKF(parse_json(j, &c, &e) == 0, "%s", e.msg);
    CHECK(c.vision.patch_size == 16 && c.vision.hidden_act == SQUAD_VISION_ACT_GELU_TANH);
    CHECK(c.image_token_id == SQUAD_DEFAULT_IMAGE_TOKEN_ID && c.vision.rope_theta == SQUAD_VISION_DEFAULT_ROPE_THETA);
    json_object_set_new(vc, "hidden_act", json_string("gelu"));
    CHECKF(parse_json(j, &c, &e) == 0 && c.vision.hidden_act == SQUAD_VISION_ACT_GELU_ERF, "%s", e.msg);

    /* Without vision_config: a text-only model, the M-RoPE fields still recorded. */
    json_object_del(j, "vision_config");
    CHECKF(parse_json(j, &c, &e) == 0, "%s", e.msg);
    CHECK(c.has_vision == 0 && c.vision.depth == 0 && c.mrope_section[2] == 2);
    /* A text-only model never fails on M-RoPE fields it does not use. */
    json_object_set_new(json_object_get(json_object_get(j, "text_config"), "rope_parameters"), "mrope_section",
                        json_pack("[i, i]", 4, 4));
    CHECKF(parse_json(j, &c, &e) == 0 && c.mrope_section[0] < 0, "%s", e.msg);
    json_decref(j);

    /* Errors, each naming its field. */
    expect_fail("vision_config", "num_heads", NULL, "'vision_config.num_heads'");
    expect_fail("vision_config", "depth", json_integer(0), "'vision_config.depth' = 0 is out of range");
    expect_fail("vision_config", "num_position_embeddings", json_integer(15), "must be a square");
    expect_fail("vision_config", "num_heads", json_integer(3), "multiple of 4");
    expect_fail("vision_config", "num_heads", json_integer(16), "multiple of 4"); /* head dim 2 */
    expect_fail("vision_config", "out_hidden_size", json_integer(32), "must equal the text hidden_size 64");
    expect_fail("vision_config", "hidden_act", json_string("relu"), "vision_config.hidden_act");
    expect_fail("vision_config", "deepstack_visual_indexes", json_pack("[i]", 1), "DeepStack");
    expect_fail("vision_config", "rope_parameters", json_pack("{s:s}", "rope_type", "2d"), "axial");
    expect_fail("", "image_token_id", json_string("x"), "'image_token_id' must be a token id");
    expect_fail("", "vision_config", json_integer(3), "'vision_config' must be an object");
}

/* A copy of the fixture checkpoint whose config.json has vision_config.key = value (links to the
 * weights); returns the directory (static storage). */
static const char *fixture_variant(const char *key, json_t *value) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/cond-variant", test_tmpdir());
    squad_err e;
    squad_mkdir_p(dir, &e);
    json_error_t je;
    json_t *j = json_load_file(FIXTURE_COND "/config.json", 0, &je);
    if (!j) return NULL;
    json_object_set_new(json_object_get(j, "vision_config"), key, value);
    char path[600], target[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_dump_file(j, path, 0);
    json_decref(j);
    const char *files[] = {"model.safetensors.index.json", "model-00001-of-00004.safetensors",
                           "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
                           "model-00004-of-00004.safetensors"};
    char cwd[400];
    if (!getcwd(cwd, sizeof cwd)) return NULL;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        snprintf(target, sizeof target, "%s/%s/%s", cwd, FIXTURE_COND, files[i]);
        unlink(path);
        if (symlink(target, path) != 0) return NULL;
    }
    return dir;
}

/* The tower's tensors of a checkpoint transformers saved bind with the shapes its config implies. */
static void test_bind_fixture(void) {
    squad_err e;
    squad_model *m = squad_model_load(FIXTURE_COND, &e);
    CHECKF(m != NULL, "%s", e.msg);
    if (!m) return;
    const squad_vision_config *v = &m->cfg.vision;
    const squad_vision_weights *w = m->vision;
    CHECK(m->cfg.has_vision && w != NULL);
    if (w) {
        CHECK(w->patch.rows == v->hidden_size &&
              w->patch.cols == v->in_channels * v->temporal_patch_size * v->patch_size * v->patch_size);
        CHECK(w->blocks[v->depth - 1].qkv.rows == 3 * v->hidden_size && w->blocks[0].fc1.rows == v->intermediate_size);
        CHECK(w->merger_fc1.rows == 4 * v->hidden_size && w->merger_fc2.rows == m->cfg.hidden_size);
        CHECK(w->pos_embed != NULL && w->merger_norm_b != NULL && w->blocks[0].norm1_w != NULL);
    }
    squad_model_free(m);

    /* A config that disagrees with the weights: the error names the tensor. */
    const char *dir = fixture_variant("intermediate_size", json_integer(65));
    m = dir ? squad_model_load(dir, &e) : NULL;
    CHECKF(!m && strstr(e.msg, "model.visual.blocks.0.mlp.linear_fc1.weight") && strstr(e.msg, "[65, 32]"), "%s",
           m ? "(loaded)" : e.msg);
    squad_model_free(m);
    /* A deeper tower than the checkpoint holds: the first missing tensor is named. */
    dir = fixture_variant("depth", json_integer(2));
    m = dir ? squad_model_load(dir, &e) : NULL;
    CHECKF(!m && strstr(e.msg, "missing tensor 'model.visual.blocks.1.norm1.weight'"), "%s", m ? "(loaded)" : e.msg);
    squad_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * The CPU tower's pieces against hand computations
 */

/* Grid position (row, column) of patch p of a frame of width w (merge-window order, merge m):
 * written from the processor's layout, independently of cpu/vision.c. */
static void coords(int p, int w, int m, int *row, int *col) {
    int windows_per_row = w / m, window = p / (m * m), in = p % (m * m);
    *row = (window / windows_per_row) * m + in / m;
    *col = (window % windows_per_row) * m + in % m;
}

static double lin(int n, int side, int i) { return n == 1 ? 0.0 : (double)(side - 1) * i / (n - 1); }

/* Bilinear interpolation reproduces an affine function of the grid: table[r][c][d] = 10 r + c +
 * 100 d gives 10 y + x + 100 d at the interpolated (y, x) of every patch; and a 2 x 2 grid takes
 * the four corners exactly. */
static void test_pos_embed(void) {
    squad_vision_config v = {0};
    v.hidden_size = 3, v.spatial_merge_size = 2, v.position_grid_side = 4, v.num_position_embeddings = 16;
    float table[16 * 3];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++)
            for (int d = 0; d < 3; d++) table[(r * 4 + c) * 3 + d] = (float)(10 * r + c + 100 * d);
    const int grids[][2] = {{2, 2}, {4, 6}, {8, 8}, {6, 2}, {2, 10}};
    for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++) {
        int h = grids[g][0], w = grids[g][1];
        float *out = calloc((size_t)2 * h * w * 3, sizeof *out);
        cpu_vision_pos_embed(&v, table, 2, h, w, out); /* two frames: the second repeats the first */
        double worst = 0;
        for (int p = 0; p < h * w; p++) {
            int row, col;
            coords(p, w, 2, &row, &col);
            for (int d = 0; d < 3; d++) {
                double want = 10 * lin(h, 4, row) + lin(w, 4, col) + 100 * d;
                double e = fabs(out[p * 3 + d] - want);
                if (e > worst) worst = e;
                CHECK(out[(h * w + p) * 3 + d] == out[p * 3 + d]);
            }
        }
        CHECKF(worst < 1e-4, "grid %dx%d: worst %g", h, w, worst); /* float round-off of values up to 233 */
        if (h == 2 && w == 2) /* the corners, exactly, in window order */
            CHECK(out[0] == 0 && out[3] == 3 && out[6] == 30 && out[9] == 33 && out[11] == 233);
        free(out);
    }
}

/* cos / sin of the 2D rotary: rows on the first quarter of the head, columns on the second, the
 * second half repeating the first; inv_freq = theta^(-2j / (hd / 2)). */
static void test_rotary(void) {
    squad_vision_config v = {0};
    v.head_dim = 16, v.spatial_merge_size = 2, v.rope_theta = 10000.0;
    int h = 4, w = 6;
    float c[24 * 16], s[24 * 16];
    cpu_vision_rotary(&v, h, w, c, s);
    double worst = 0;
    for (int p = 0; p < h * w; p++) {
        int row, col;
        coords(p, w, 2, &row, &col);
        for (int d = 0; d < 16; d++) {
            int q = d % 8, j = q % 4;
            double angle = (q < 4 ? row : col) * pow(10000.0, -2.0 * j / 8.0);
            worst = fmax(worst, fabs(c[p * 16 + d] - cos(angle)));
            worst = fmax(worst, fabs(s[p * 16 + d] - sin(angle)));
        }
    }
    CHECKF(worst < 2e-6, "worst %g", worst);
}

/* ---------------------------------------------------------------------------------------------
 * The whole tower: a double-precision transcription of the reference's math (plain loops, no
 * blocking), against which the CPU tower's EXACT path must agree within fp32 round-off.
 */

static void ref_linear(const squad_mat *W, const float *bias, const double *x, int T, double *y) {
    for (int t = 0; t < T; t++)
        for (int n = 0; n < W->rows; n++) {
            double acc = bias[n];
            for (int k = 0; k < W->cols; k++)
                acc += x[(size_t)t * W->cols + k] * squad_bf16_to_f32(W->w[(size_t)n * W->cols + k]);
            y[(size_t)t * W->rows + n] = acc;
        }
}

static void ref_layernorm(const double *x, int T, int n, const float *w, const float *b, double *y) {
    for (int t = 0; t < T; t++) {
        double mean = 0, var = 0;
        for (int i = 0; i < n; i++) mean += x[t * n + i];
        mean /= n;
        for (int i = 0; i < n; i++) var += (x[t * n + i] - mean) * (x[t * n + i] - mean);
        var /= n;
        for (int i = 0; i < n; i++) y[t * n + i] = (x[t * n + i] - mean) / sqrt(var + 1e-6) * w[i] + b[i];
    }
}

static double *ref_tower(const squad_model *m, const float *pv, int h, int w) {
    const squad_vision_config *v = &m->cfg.vision;
    const squad_vision_weights *W = m->vision;
    int H = v->hidden_size, I = v->intermediate_size, hd = v->head_dim, nh = v->num_heads, N = h * w, K = W->patch.cols;
    int S = v->position_grid_side, mg = v->spatial_merge_size;
    double *px = malloc(sizeof(double) * N * K), *x = malloc(sizeof(double) * N * H), *xn = malloc(sizeof(double) * N * H);
    double *qkv = malloc(sizeof(double) * N * 3 * H), *o = malloc(sizeof(double) * N * H);
    double *f1 = malloc(sizeof(double) * N * (I > 4 * H ? I : 4 * H)), *tmp = malloc(sizeof(double) * N * H);
    for (size_t i = 0; i < (size_t)N * K; i++) px[i] = pv[i];
    ref_linear(&W->patch, W->patch_b, px, N, x);
    for (int p = 0; p < N; p++) { /* bilinear position embedding */
        int row, col;
        coords(p, w, mg, &row, &col);
        double y = lin(h, S, row), xx = lin(w, S, col);
        int y0 = (int)y, x0 = (int)xx, y1 = y0 + 1 < S ? y0 + 1 : S - 1, x1 = x0 + 1 < S ? x0 + 1 : S - 1;
        double dy = y - y0, dx = xx - x0;
        for (int d = 0; d < H; d++)
            x[p * H + d] += (1 - dy) * (1 - dx) * W->pos_embed[(y0 * S + x0) * H + d] +
                            (1 - dy) * dx * W->pos_embed[(y0 * S + x1) * H + d] +
                            dy * (1 - dx) * W->pos_embed[(y1 * S + x0) * H + d] + dy * dx * W->pos_embed[(y1 * S + x1) * H + d];
    }
    for (int l = 0; l < v->depth; l++) {
        const squad_vision_block *B = &W->blocks[l];
        ref_layernorm(x, N, H, B->norm1_w, B->norm1_b, xn);
        ref_linear(&B->qkv, B->qkv_b, xn, N, qkv);
        for (int p = 0; p < N; p++) { /* rotary on q and k */
            int row, col;
            coords(p, w, mg, &row, &col);
            for (int part = 0; part < 2; part++)
                for (int hh = 0; hh < nh; hh++) {
                    double *q = qkv + (size_t)p * 3 * H + part * H + hh * hd, r[CPU_VISION_MAX_HEAD_DIM];
                    for (int d = 0; d < hd; d++) {
                        int qd = d % (hd / 2), j = qd % (hd / 4);
                        double a = (qd < hd / 4 ? row : col) * pow(v->rope_theta, -2.0 * j / (hd / 2));
                        double partner = d < hd / 2 ? -q[d + hd / 2] : q[d - hd / 2];
                        r[d] = q[d] * cos(a) + partner * sin(a);
                    }
                    memcpy(q, r, sizeof(double) * hd);
                }
        }
        for (int hh = 0; hh < nh; hh++)
            for (int i = 0; i < N; i++) {
                double sc[4096], mx = -1e300, sum = 0;
                for (int j = 0; j < N; j++) {
                    double dot = 0;
                    for (int d = 0; d < hd; d++) dot += qkv[i * 3 * H + hh * hd + d] * qkv[j * 3 * H + H + hh * hd + d];
                    sc[j] = dot / sqrt((double)hd);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j < N; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (int d = 0; d < hd; d++) {
                    double acc = 0;
                    for (int j = 0; j < N; j++) acc += sc[j] / sum * qkv[j * 3 * H + 2 * H + hh * hd + d];
                    o[i * H + hh * hd + d] = acc;
                }
            }
        ref_linear(&B->proj, B->proj_b, o, N, tmp);
        for (int i = 0; i < N * H; i++) x[i] += tmp[i];
        ref_layernorm(x, N, H, B->norm2_w, B->norm2_b, xn);
        ref_linear(&B->fc1, B->fc1_b, xn, N, f1);
        for (int i = 0; i < N * I; i++) f1[i] = 0.5 * f1[i] * (1 + tanh(sqrt(2 / M_PI) * (f1[i] + 0.044715 * pow(f1[i], 3))));
        ref_linear(&B->fc2, B->fc2_b, f1, N, tmp);
        for (int i = 0; i < N * H; i++) x[i] += tmp[i];
    }
    int Nm = N / (mg * mg), M = mg * mg * H;
    double *out = malloc(sizeof(double) * Nm * v->out_hidden_size);
    ref_layernorm(x, N, H, W->merger_norm_w, W->merger_norm_b, xn); /* xn viewed as [Nm][M] */
    ref_linear(&W->merger_fc1, W->merger_fc1_b, xn, Nm, f1);
    for (int i = 0; i < Nm * M; i++) f1[i] = 0.5 * f1[i] * (1 + erf(f1[i] / sqrt(2.0)));
    ref_linear(&W->merger_fc2, W->merger_fc2_b, f1, Nm, out);
    free(px), free(x), free(xn), free(qkv), free(o), free(f1), free(tmp);
    return out;
}

/* A tiny-vl checkpoint (Qwen3's tokenizer when present: the fixture's command) into dir. */
static squad_model *tiny_vl(const char *dir, squad_err *e) {
    const char *tok = "third_party/qwen3/tokenizer.json";
    squad_synth_opts o = {.preset = "tiny-vl", .out_dir = dir, .seed = 0, .tokenizer = access(tok, R_OK) ? NULL : tok};
    if (squad_synth_write(&o, e) != 0) return NULL;
    return squad_model_load(dir, e);
}

/* Decodes and preprocesses a fixture image with a checkpoint's processor config. */
static int load_patches(const char *dir, const char *file, squad_image_patches *pp) {
    char path[600];
    snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
    squad_image_proc_config pc;
    squad_err e;
    if (squad_image_proc_config_load(&pc, path, &e) != 0) return -1;
    snprintf(path, sizeof path, "tests/fixtures/images/%s", file);
    size_t n;
    uint8_t *bytes = (uint8_t *)squad_read_file(path, &n, &e);
    if (!bytes) return -1;
    squad_image img;
    int rc = squad_image_decode(bytes, n, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, &img, &e);
    free(bytes);
    if (rc != 0) return -1;
    rc = squad_image_preprocess(&pc, &img, pp, &e);
    squad_image_free(&img);
    return rc;
}

static float *run_tower(const squad_model *m, const squad_image_patches *pp, int threads, cpu_gemm_precision prec) {
    squad_err e;
    cpu_pool *pool = cpu_pool_new(threads, &e);
    const squad_vision_config *v = &m->cfg.vision;
    size_t n = (size_t)squad_vision_tokens(v, pp->grid[0], pp->grid[1], pp->grid[2]) * v->out_hidden_size;
    float *out = calloc(n, sizeof *out);
    int rc = pool ? cpu_vision_forward(pool, prec, m, pp->pixel_values, pp->grid[0], pp->grid[1], pp->grid[2], out, &e)
                  : -1;
    CHECKF(rc == 0, "%s", e.msg);
    cpu_pool_free(pool);
    return out;
}

static void test_tower(squad_model *m, const char *dir) {
    const char *files[] = {"small_64x48.png", "photo_333x517.png"};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        squad_image_patches pp;
        int loaded = load_patches(dir, files[f], &pp) == 0;
        CHECKF(loaded, "%s", files[f]);
        if (!loaded) continue;
        const squad_vision_config *v = &m->cfg.vision;
        int ntok = (int)squad_vision_tokens(v, pp.grid[0], pp.grid[1], pp.grid[2]), D = v->out_hidden_size;
        if (f == 0) CHECK(pp.grid[0] == 1 && pp.grid[1] == 4 && pp.grid[2] == 4 && ntok == 4);
        float *a = run_tower(m, &pp, 1, CPU_GEMM_EXACT), *b = run_tower(m, &pp, 2, CPU_GEMM_EXACT);
        float *again = run_tower(m, &pp, 2, CPU_GEMM_EXACT);
        CHECKF(!memcmp(a, b, sizeof(float) * ntok * D), "%s: 1 and 2 threads differ", files[f]);
        CHECK(!memcmp(b, again, sizeof(float) * ntok * D));
        double *ref = ref_tower(m, pp.pixel_values, pp.grid[1], pp.grid[2]);
        double worst = 0, mag = 0;
        int finite = 1;
        for (int i = 0; i < ntok * D; i++) {
            finite &= isfinite(a[i]);
            worst = fmax(worst, fabs(a[i] - ref[i]));
            mag = fmax(mag, fabs(ref[i]));
        }
        CHECKF(finite && mag > 1e-3 && worst <= 1e-5 * fmax(1.0, mag), "%s: worst %g (magnitude %g)", files[f], worst,
               mag);
        printf("test_vision: %s grid %dx%dx%d, %d tokens: CPU tower vs double reference %.3g (max |out| %.3g)\n",
               files[f], pp.grid[0], pp.grid[1], pp.grid[2], ntok, worst, mag);
        /* FAST (bf16 activations into the GEMMs) stays close. */
        float *fast = run_tower(m, &pp, 2, CPU_GEMM_FAST);
        double fw = 0;
        for (int i = 0; i < ntok * D; i++) fw = fmax(fw, fabs(fast[i] - ref[i]));
        CHECKF(fw <= 0.05 * fmax(1.0, mag), "%s: FAST worst %g", files[f], fw);
        free(a), free(b), free(again), free(ref), free(fast);
        squad_image_patches_free(&pp);
    }
    /* Bad grids are errors, not crashes. */
    squad_err e;
    float dummy[64] = {0};
    cpu_pool *pool = cpu_pool_new(1, &e);
    CHECK(cpu_vision_forward(pool, CPU_GEMM_EXACT, m, dummy, 1, 3, 4, dummy, &e) == SQUAD_E_INVALID &&
          strstr(e.msg, "multiples of the merge size"));
    CHECK(cpu_vision_forward(pool, CPU_GEMM_EXACT, m, dummy, 0, 2, 2, dummy, &e) == SQUAD_E_INVALID);
    cpu_pool_free(pool);
}

/* ---------------------------------------------------------------------------------------------
 * Against transformers (tests/fixtures/vision/fixture.json, made by tools/make_vision_fixtures.py)
 */

#define VISION_FIXTURE "tests/fixtures/vision/fixture.json"
#define FIXTURE_TOL 1e-4 /* fp32 against fp32 through the same math: far below this */

static void blake2b_hex(const void *data, size_t n, char hex[33]) {
    squad_blake2b s;
    uint8_t d[16];
    squad_blake2b_init(&s, 16);
    squad_blake2b_update(&s, data, n);
    squad_blake2b_final(&s, d);
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

static int file_blake2b_is(const char *dir, const char *name, const char *want) {
    char path[600], hex[33];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t n;
    squad_err e;
    char *data = squad_read_file(path, &n, &e);
    if (!data) return 0;
    blake2b_hex(data, n, hex);
    free(data);
    return want && !strcmp(hex, want);
}

static void test_fixture(squad_model *m, const char *dir) {
    json_error_t je;
    json_t *fx = json_load_file(VISION_FIXTURE, 0, &je);
    if (!fx) {
        printf("test_vision: no %s (tools/make_vision_fixtures.py makes it): the tower is checked against the "
               "double-precision transcription only\n",
               VISION_FIXTURE);
        return;
    }
    json_t *ck = json_object_get(fx, "checkpoint");
    int same = file_blake2b_is(dir, "config.json", json_string_value(json_object_get(ck, "config_blake2b"))) &&
               file_blake2b_is(dir, "model.safetensors", json_string_value(json_object_get(ck, "weights_blake2b")));
    CHECKF(same, "the fixture was made from another checkpoint than `%s` writes here (is "
                 "third_party/qwen3/tokenizer.json present?)",
           json_string_value(json_object_get(fx, "command")));
    json_t *towers = json_object_get(fx, "towers");
    CHECK(json_array_size(towers) >= 2);
    for (size_t i = 0; same && i < json_array_size(towers); i++) {
        json_t *t = json_array_get(towers, i);
        const char *file = json_string_value(json_object_get(t, "file"));
        squad_image_patches pp;
        int loaded = file && load_patches(dir, file, &pp) == 0;
        CHECKF(loaded, "%s", file ? file : "(no file)");
        if (!loaded) continue;
        json_t *g = json_object_get(t, "grid");
        CHECK(json_integer_value(json_array_get(g, 0)) == pp.grid[0] &&
              json_integer_value(json_array_get(g, 1)) == pp.grid[1] &&
              json_integer_value(json_array_get(g, 2)) == pp.grid[2]);
        char hex[33];
        blake2b_hex(pp.pixel_values, (size_t)pp.n_patches * pp.patch_dim * sizeof(float), hex);
        CHECKF(!strcmp(hex, json_string_value(json_object_get(t, "pv_blake2b"))), "%s: pixel values differ", file);
        const squad_vision_config *v = &m->cfg.vision;
        size_t n = (size_t)squad_vision_tokens(v, pp.grid[0], pp.grid[1], pp.grid[2]) * v->out_hidden_size;
        json_t *vals = json_object_get(t, "values"), *shape = json_object_get(t, "shape");
        CHECK(json_array_size(vals) == n && (size_t)json_integer_value(json_array_get(shape, 1)) == (size_t)v->out_hidden_size);
        float *out = run_tower(m, &pp, 2, CPU_GEMM_EXACT);
        double worst = 0, sum = 0;
        for (size_t k = 0; k < n && k < json_array_size(vals); k++) {
            double ref = json_number_value(json_array_get(vals, k));
            worst = fmax(worst, fabs(out[k] - ref) / fmax(1.0, fabs(ref)));
            sum += out[k];
        }
        CHECKF(worst <= FIXTURE_TOL, "%s: worst %g against transformers", file, worst);
        CHECK_NEAR(sum, json_number_value(json_object_get(t, "sum")), FIXTURE_TOL * n);
        printf("test_vision: %s grid %dx%dx%d: CPU tower vs transformers %.3g\n", file, pp.grid[0], pp.grid[1],
               pp.grid[2], worst);
        free(out);
        squad_image_patches_free(&pp);
    }
    json_decref(fx);
}

int main(void) {
    test_config();
    test_bind_fixture();
    test_pos_embed();
    test_rotary();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tiny-vl", test_tmpdir());
    squad_err e;
    squad_model *m = tiny_vl(dir, &e);
    CHECKF(m && m->vision, "%s", e.msg);
    if (m) test_tower(m, dir);
    if (m) test_fixture(m, dir);
    squad_model_free(m);
    return test_summary("test_vision");
}
