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
#include "model.h"
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

int main(void) {
    test_config();
    test_bind_fixture();
    return test_summary("test_vision");
}
