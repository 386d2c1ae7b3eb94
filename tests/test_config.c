/*
 * test_config.c — config.json parsing: both Hugging Face layouts (Qwen3_5ForCausalLM's flat
 * config and Qwen3_5ForConditionalGeneration's text_config), legacy RoPE fields, the
 * full_attention_interval fallback, defaults, and an error naming the field for every missing or
 * inconsistent value. Variants are made by editing a base config with jansson.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "testutil.h"

/* The 0.8B text config as transformers writes it for Qwen3_5ForCausalLM. */
static const char *CAUSAL =
    "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\": \"qwen3_5_text\","
    " \"attention_bias\": false, \"attention_dropout\": 0.0, \"dtype\": \"bfloat16\","
    " \"head_dim\": 256, \"hidden_act\": \"silu\", \"hidden_size\": 1024, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 3584,"
    " \"layer_types\": [\"linear_attention\", \"linear_attention\", \"linear_attention\", \"full_attention\","
    " \"linear_attention\", \"linear_attention\", \"linear_attention\", \"full_attention\","
    " \"linear_attention\", \"linear_attention\", \"linear_attention\", \"full_attention\","
    " \"linear_attention\", \"linear_attention\", \"linear_attention\", \"full_attention\","
    " \"linear_attention\", \"linear_attention\", \"linear_attention\", \"full_attention\","
    " \"linear_attention\", \"linear_attention\", \"linear_attention\", \"full_attention\"],"
    " \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 128, \"linear_num_key_heads\": 16,"
    " \"linear_num_value_heads\": 16, \"linear_value_head_dim\": 128, \"max_position_embeddings\": 262144,"
    " \"num_attention_heads\": 8, \"num_hidden_layers\": 24, \"num_key_value_heads\": 2,"
    " \"rms_norm_eps\": 1e-06,"
    " \"rope_parameters\": {\"mrope_interleaved\": true, \"mrope_section\": [11, 11, 10],"
    " \"partial_rotary_factor\": 0.25, \"rope_theta\": 10000000, \"rope_type\": \"default\"},"
    " \"tie_word_embeddings\": true, \"transformers_version\": \"5.0.0\", \"use_cache\": true,"
    " \"vocab_size\": 248320}";

/* A small conditional-generation config: fields under text_config, tie flag at the top level. */
static const char *NESTED =
    "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\": \"qwen3_5\","
    " \"image_token_id\": 248056, \"tie_word_embeddings\": false,"
    " \"text_config\": {\"model_type\": \"qwen3_5_text\", \"head_dim\": 32, \"hidden_size\": 64,"
    " \"intermediate_size\": 128, \"layer_types\": [\"full_attention\", \"linear_attention\", \"linear_attention\"],"
    " \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 16, \"linear_num_key_heads\": 2,"
    " \"linear_num_value_heads\": 4, \"linear_value_head_dim\": 16, \"num_attention_heads\": 4,"
    " \"num_hidden_layers\": 3, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-05,"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.5,"
    " \"mrope_section\": [4, 2, 2], \"mrope_interleaved\": true},"
    " \"tie_word_embeddings\": true, \"vocab_size\": 300},"
    " \"vision_config\": {\"depth\": 2, \"hidden_size\": 32, \"num_heads\": 2, \"intermediate_size\": 64,"
    " \"out_hidden_size\": 64, \"num_position_embeddings\": 16}}";

static int parse_str(const char *s, squad_config *cfg, squad_err *err) {
    memset(err, 0, sizeof *err);
    return squad_config_parse(cfg, s, strlen(s), err);
}

static int parse_json(json_t *j, squad_config *cfg, squad_err *err) {
    char *s = json_dumps(j, 0);
    int rc = parse_str(s, cfg, err);
    free(s);
    return rc;
}

static json_t *load(const char *s) {
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j) {
        fprintf(stderr, "bad test JSON: %s\n", e.text);
        exit(1);
    }
    return j;
}

/* Parsing must fail with a message containing `needle`. */
#define EXPECT_FAIL(j, needle)                                                                          \
    do {                                                                                                \
        squad_config c_;                                                                                \
        squad_err e_;                                                                                   \
        int rc_ = parse_json((j), &c_, &e_);                                                            \
        CHECKF(rc_ != 0 && strstr(e_.msg, (needle)) != NULL, "rc %d, message '%s', wanted '%s'", rc_, \
               rc_ ? e_.msg : "(none)", (needle));                                                      \
    } while (0)

static void test_causal(void) {
    squad_config c;
    squad_err e;
    int rc = parse_str(CAUSAL, &c, &e);
    CHECKF(rc == 0, "%s", e.msg);
    CHECK(c.hidden_size == 1024 && c.num_layers == 24 && c.intermediate_size == 3584);
    CHECK(c.num_heads == 8 && c.num_kv_heads == 2 && c.head_dim == 256);
    CHECK(c.lin_num_k_heads == 16 && c.lin_num_v_heads == 16 && c.lin_k_dim == 128 && c.lin_v_dim == 128);
    CHECK(c.conv_kernel == 4 && c.vocab_size == 248320);
    CHECK_NEAR(c.rms_eps, 1e-6, 1e-12);
    CHECK_NEAR(c.rope_theta, 1e7, 0);
    CHECK_NEAR(c.partial_rotary_factor, 0.25, 0);
    CHECK(c.rotary_dim == 64);
    CHECK(c.tie_embeddings == 1 && c.max_position == 262144 && c.nested == 0);
    for (int i = 0; i < 24; i++) CHECK(c.layer_types[i] == ((i % 4 == 3) ? SQUAD_LAYER_FULL : SQUAD_LAYER_LINEAR));
    CHECK(squad_config_count_layers(&c, SQUAD_LAYER_FULL) == 6);
    CHECK(squad_config_gdn_channels(&c) == 2 * 16 * 128 + 16 * 128);
}

static void test_nested(void) {
    squad_config c;
    squad_err e;
    int rc = parse_str(NESTED, &c, &e);
    CHECKF(rc == 0, "%s", e.msg);
    CHECK(c.nested == 1 && c.hidden_size == 64 && c.num_layers == 3 && c.vocab_size == 300);
    CHECK(c.layer_types[0] == SQUAD_LAYER_FULL && c.layer_types[1] == SQUAD_LAYER_LINEAR &&
          c.layer_types[2] == SQUAD_LAYER_LINEAR);
    CHECK(c.rotary_dim == 16);
    CHECK_NEAR(c.rms_eps, 1e-5, 1e-12);
    /* The composite model's own (top-level) flag wins over text_config's. */
    CHECK(c.tie_embeddings == 0);
    CHECK(c.max_position == 262144); /* default when absent */

    /* Without a top-level flag, text_config's applies. */
    json_t *j = load(NESTED);
    json_object_del(j, "tie_word_embeddings");
    rc = parse_json(j, &c, &e);
    CHECK(rc == 0 && c.tie_embeddings == 1);
    /* Neither: the transformers default, untied. */
    json_object_del(json_object_get(j, "text_config"), "tie_word_embeddings");
    rc = parse_json(j, &c, &e);
    CHECK(rc == 0 && c.tie_embeddings == 0);
    /* A field only at the top level is still found. */
    json_t *vs = json_object_get(json_object_get(j, "text_config"), "vocab_size");
    json_object_set(j, "vocab_size", vs);
    json_object_del(json_object_get(j, "text_config"), "vocab_size");
    rc = parse_json(j, &c, &e);
    CHECK(rc == 0 && c.vocab_size == 300);
    /* text_config's value wins over the top level's. */
    json_object_set_new(json_object_get(j, "text_config"), "vocab_size", json_integer(512));
    rc = parse_json(j, &c, &e);
    CHECK(rc == 0 && c.vocab_size == 512);
    json_object_set_new(j, "text_config", json_integer(3));
    EXPECT_FAIL(j, "text_config");
    json_decref(j);
}

static void test_legacy_rope_and_interval(void) {
    json_t *j = load(CAUSAL);
    json_object_del(j, "rope_parameters");
    EXPECT_FAIL(j, "rope_theta");
    json_object_set_new(j, "rope_theta", json_real(1e6));
    json_object_set_new(j, "partial_rotary_factor", json_real(0.5));
    squad_config c;
    squad_err e;
    int rc = parse_json(j, &c, &e);
    CHECKF(rc == 0, "%s", e.msg);
    CHECK_NEAR(c.rope_theta, 1e6, 0);
    CHECK(c.rotary_dim == 128);
    json_object_set_new(j, "rope_scaling", load("{\"type\": \"mrope\", \"mrope_section\": [16, 24, 24]}"));
    rc = parse_json(j, &c, &e);
    CHECKF(rc == 0, "%s", e.msg);
    json_object_set_new(j, "rope_scaling", load("{\"rope_type\": \"yarn\", \"factor\": 4.0}"));
    EXPECT_FAIL(j, "rope_scaling.rope_type");
    json_object_del(j, "rope_scaling");
    json_object_del(j, "partial_rotary_factor"); /* default 1.0: the whole head rotates */
    rc = parse_json(j, &c, &e);
    CHECK(rc == 0 && c.rotary_dim == 256);

    /* full_attention_interval derives the pattern only when layer_types is absent. */
    json_object_del(j, "layer_types");
    EXPECT_FAIL(j, "layer_types");
    json_object_set_new(j, "full_attention_interval", json_integer(3));
    rc = parse_json(j, &c, &e);
    CHECKF(rc == 0, "%s", e.msg);
    for (int i = 0; i < 24; i++) CHECK(c.layer_types[i] == ((i % 3 == 2) ? SQUAD_LAYER_FULL : SQUAD_LAYER_LINEAR));
    json_object_set_new(j, "full_attention_interval", json_integer(0));
    EXPECT_FAIL(j, "full_attention_interval");
    json_decref(j);

    /* rope_parameters keyed per layer type. */
    j = load(CAUSAL);
    json_object_set_new(j, "rope_parameters",
                        load("{\"full_attention\": {\"rope_theta\": 5000, \"partial_rotary_factor\": 0.5}}"));
    rc = parse_json(j, &c, &e);
    CHECKF(rc == 0, "%s", e.msg);
    CHECK(c.rotary_dim == 128);
    CHECK_NEAR(c.rope_theta, 5000, 0);
    json_object_set_new(j, "rope_parameters", load("{\"rope_theta\": 100, \"rope_type\": \"linear\"}"));
    EXPECT_FAIL(j, "rope_parameters.rope_type");
    json_object_set_new(j, "rope_parameters", load("{\"rope_theta\": -1}"));
    EXPECT_FAIL(j, "rope_parameters.rope_theta");
    json_object_set_new(j, "rope_parameters", load("{\"partial_rotary_factor\": 0.5}"));
    EXPECT_FAIL(j, "rope_theta");
    json_object_set_new(j, "rope_parameters", load("{\"rope_theta\": 100, \"mrope_section\": \"x\"}"));
    EXPECT_FAIL(j, "mrope_section");
    json_object_set_new(j, "rope_parameters", json_integer(1));
    EXPECT_FAIL(j, "rope_parameters");
    json_decref(j);
}

/* Removing any required field is an error naming it (both layouts). */
static void test_missing_fields(void) {
    static const char *required[] = {
        "hidden_size",          "num_hidden_layers",     "intermediate_size",   "num_attention_heads",
        "num_key_value_heads",  "head_dim",              "linear_num_key_heads", "linear_num_value_heads",
        "linear_key_head_dim",  "linear_value_head_dim", "linear_conv_kernel_dim", "vocab_size",
        "rms_norm_eps",         "rope_parameters",       "layer_types",
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        json_t *j = load(CAUSAL);
        json_object_del(j, required[i]);
        EXPECT_FAIL(j, required[i]);
        json_decref(j);
        j = load(NESTED);
        json_object_del(json_object_get(j, "text_config"), required[i]);
        EXPECT_FAIL(j, required[i]);
        json_decref(j);
    }
}

static void set_and_fail(const char *field, json_t *value, const char *needle) {
    json_t *j = load(CAUSAL);
    json_object_set_new(j, field, value);
    EXPECT_FAIL(j, needle);
    json_decref(j);
}

static void test_inconsistent(void) {
    set_and_fail("hidden_size", json_integer(0), "hidden_size");
    set_and_fail("hidden_size", json_integer(-64), "hidden_size");
    set_and_fail("hidden_size", json_integer(1LL << 40), "hidden_size");
    set_and_fail("hidden_size", json_string("1024"), "hidden_size");
    set_and_fail("hidden_size", json_real(1024.0), "hidden_size");
    set_and_fail("intermediate_size", json_integer(0), "intermediate_size");
    set_and_fail("vocab_size", json_integer(1LL << 31), "vocab_size");
    set_and_fail("num_key_value_heads", json_integer(3), "num_key_value_heads");
    set_and_fail("linear_num_key_heads", json_integer(5), "linear_num_key_heads");
    set_and_fail("linear_conv_kernel_dim", json_integer(0), "linear_conv_kernel_dim");
    set_and_fail("num_hidden_layers", json_integer(SQUAD_MAX_LAYERS + 1), "num_hidden_layers");
    set_and_fail("num_hidden_layers", json_integer(23), "layer_types");
    set_and_fail("rms_norm_eps", json_integer(0), "rms_norm_eps");
    set_and_fail("rms_norm_eps", json_string("1e-6"), "rms_norm_eps");
    set_and_fail("rms_norm_eps", json_real(1e-46), "rms_norm_eps"); /* 0 as a float (found by fuzzing) */
    set_and_fail("tie_word_embeddings", json_integer(1), "tie_word_embeddings");
    set_and_fail("max_position_embeddings", json_integer(0), "max_position_embeddings");
    set_and_fail("layer_types", json_string("linear_attention"), "layer_types");
    /* Products that would overflow: huge head counts times huge head dims. */
    json_t *j = load(CAUSAL);
    json_object_set_new(j, "num_attention_heads", json_integer(4096));
    json_object_set_new(j, "num_key_value_heads", json_integer(4096));
    json_object_set_new(j, "head_dim", json_integer(1 << 20));
    EXPECT_FAIL(j, "head_dim");
    json_decref(j);
    j = load(CAUSAL);
    json_object_set_new(j, "linear_num_value_heads", json_integer(4096));
    json_object_set_new(j, "linear_num_key_heads", json_integer(4096));
    json_object_set_new(j, "linear_value_head_dim", json_integer(1 << 20));
    EXPECT_FAIL(j, "linear_value_head_dim");
    json_decref(j);

    /* A bad layer type names the index. */
    j = load(CAUSAL);
    json_array_set_new(json_object_get(j, "layer_types"), 5, json_string("sliding_attention"));
    EXPECT_FAIL(j, "layer_types[5]");
    json_array_set_new(json_object_get(j, "layer_types"), 5, json_integer(1));
    EXPECT_FAIL(j, "layer_types[5]");
    json_decref(j);

    /* Rotary dims: odd, or a factor above 1 (more than head_dim), or zero. */
    j = load(CAUSAL);
    json_object_set_new(j, "head_dim", json_integer(30));
    json_object_set_new(json_object_get(j, "rope_parameters"), "partial_rotary_factor", json_real(0.1));
    EXPECT_FAIL(j, "partial_rotary_factor");
    json_object_set_new(json_object_get(j, "rope_parameters"), "partial_rotary_factor", json_real(1.5));
    EXPECT_FAIL(j, "partial_rotary_factor");
    json_object_set_new(json_object_get(j, "rope_parameters"), "partial_rotary_factor", json_real(0.0));
    EXPECT_FAIL(j, "partial_rotary_factor");
    json_object_set_new(json_object_get(j, "rope_parameters"), "partial_rotary_factor", json_string("a"));
    EXPECT_FAIL(j, "partial_rotary_factor");
    json_decref(j);

    /* Not JSON, not an object, duplicate keys. */
    squad_config c;
    squad_err e;
    CHECK(parse_str("{\"hidden_size\": ", &c, &e) != 0 && strstr(e.msg, "JSON"));
    CHECK(parse_str("[1, 2]", &c, &e) != 0 && strstr(e.msg, "object"));
    CHECK(parse_str("", &c, &e) != 0);
    CHECK(parse_str("{\"hidden_size\": 1, \"hidden_size\": 2}", &c, &e) != 0);
    /* A buffer that is not NUL-terminated is read only up to len. */
    char buf[8] = {'{', '}', 'x', 'x', 'x', 'x', 'x', 'x'};
    CHECK(squad_config_parse(&c, buf, 2, &e) != 0 && strstr(e.msg, "hidden_size"));
    /* NULL err is allowed. */
    CHECK(squad_config_parse(&c, "{}", 2, NULL) != 0);
}

static void test_load_file(void) {
    const char *dir = test_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(NESTED, f);
    fclose(f);
    squad_config c;
    squad_err e;
    CHECKF(squad_config_load(&c, path, &e) == 0, "%s", e.msg);
    CHECK(c.hidden_size == 64);
    f = fopen(path, "w");
    fputs("{\"hidden_size\": 64}", f);
    fclose(f);
    CHECK(squad_config_load(&c, path, &e) != 0 && strstr(e.msg, path) && strstr(e.msg, "num_hidden_layers"));
    remove(path);
    CHECK(squad_config_load(&c, path, &e) != 0 && strstr(e.msg, path));
    remove(dir);
}

int main(void) {
    test_causal();
    test_nested();
    test_legacy_rope_and_interval();
    test_missing_fields();
    test_inconsistent();
    test_load_file();
    return test_summary("test_config");
}
