/*
 * test_synth.c — `squad synth` checkpoints: every preset's config.json parses back to the preset;
 * files are deterministic; --tokenizer sizes the vocabulary and copies the file; the conditional
 * layout nests its config; and the qwen3.5-0.8b preset writes exactly the tensor names and shapes
 * that transformers' own model has (tests/fixtures/qwen3.5-0.8b-tensors.json, made by
 * tools/make_fixtures.py). The 0.8B file (~1.5 GB) is written under /tmp, compared from its header
 * only, loaded (zero copy) and deleted: about 5-15 s in a release build, 30 s under ASan, so it
 * runs in both.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "image/preprocess.h"
#include "model.h"
#include "synth.h"
#include "testutil.h"
#include "util.h"

#define TENSORS_FIXTURE "tests/fixtures/qwen3.5-0.8b-tensors.json"

static char g_root[256];

static char *path2(const char *dir, const char *name) {
    squad_err e;
    return squad_path_join(dir, name, &e);
}

static char *read_all(const char *dir, const char *name, size_t *n) {
    squad_err e;
    char *p = path2(dir, name);
    char *text = squad_read_file(p, n, &e);
    free(p);
    return text;
}

static void test_presets(void) {
    CHECK(squad_synth_preset_count() >= 4);
    for (int i = 0; i < squad_synth_preset_count(); i++) {
        const char *name = squad_synth_preset_name(i);
        CHECK(name && squad_synth_preset_summary(i));
        squad_config c;
        squad_err e = {0};
        CHECKF(squad_synth_preset_config(name, &c, &e) == 0, "%s: %s", name, e.msg);
        squad_synth_plan plan;
        CHECK(squad_synth_plan_make(&c, SQUAD_SYNTH_CAUSAL, &plan, &e) == 0);
        int per_layer = 0;
        for (int l = 0; l < c.num_layers; l++) per_layer += c.layer_types[l] == SQUAD_LAYER_LINEAR ? 14 : 11;
        int tower = c.has_vision ? 3 + 12 * c.vision.depth + 6 : 0; /* model.visual.* */
        CHECKF(plan.n == 2 + !c.tie_embeddings + per_layer + tower, "%s: %d tensors", name, plan.n);
        for (int k = 1; k < plan.n; k++) CHECK(strcmp(plan.tensors[k - 1].name, plan.tensors[k].name) < 0);
        squad_synth_plan_free(&plan);
    }
    squad_config c;
    squad_err e = {0};
    CHECK(squad_synth_preset_config("huge", &c, &e) != 0 && strstr(e.msg, "unknown preset 'huge'") &&
          strstr(e.msg, "tiny"));
    /* The named shapes. */
    CHECK(squad_synth_preset_config("tiny", &c, &e) == 0 && c.hidden_size == 64 && c.num_layers == 4 &&
          c.layer_types[3] == SQUAD_LAYER_FULL && c.lin_num_v_heads == 4 && c.lin_num_k_heads == 2 &&
          c.vocab_size == 300);
    CHECK(squad_synth_preset_config("tiny-mha", &c, &e) == 0 && c.num_heads == c.num_kv_heads &&
          c.lin_num_k_heads == c.lin_num_v_heads);
    CHECK(squad_synth_preset_config("tiny-hd256", &c, &e) == 0 && c.head_dim == 256 && c.rotary_dim == 64 &&
          c.num_heads == 4 && c.num_kv_heads == 2 && c.hidden_size == 128 && c.vocab_size == 300);
    CHECK(squad_synth_preset_config("qwen3.5-0.8b", &c, &e) == 0 && c.hidden_size == 1024 && c.num_layers == 24 &&
          c.intermediate_size == 3584 && c.num_heads == 8 && c.num_kv_heads == 2 && c.head_dim == 256 &&
          c.lin_num_k_heads == 16 && c.lin_num_v_heads == 16 && c.lin_k_dim == 128 && c.lin_v_dim == 128 &&
          c.conv_kernel == 4 && c.rotary_dim == 64 && c.rope_theta == 1e7 && c.vocab_size == 248320 &&
          c.tie_embeddings);
}

/* Each small preset, both layouts: written, parsed back equal to the preset, loadable. */
static void test_write_small(void) {
    const char *presets[] = {"tiny", "tiny-mha", "demo"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        for (int layout = 0; layout < 2; layout++) {
            char dir[512];
            snprintf(dir, sizeof dir, "%s/%s-%d", g_root, presets[i], layout);
            squad_synth_opts o = {.preset = presets[i], .out_dir = dir, .seed = 11, .layout = layout};
            squad_err e = {0};
            CHECKF(squad_synth_write(&o, &e) == 0, "%s: %s", presets[i], e.msg);
            squad_config want, got;
            squad_synth_preset_config(presets[i], &want, &e);
            char *cp = path2(dir, "config.json");
            CHECKF(squad_config_load(&got, cp, &e) == 0, "%s", e.msg);
            free(cp);
            CHECK(got.nested == layout);
            got.nested = 0;
            CHECKF(memcmp(&want, &got, sizeof want) == 0, "%s layout %d: config.json does not parse back to the preset",
                   presets[i], layout);
            squad_model *m = squad_model_load(dir, &e);
            CHECKF(m != NULL, "%s: %s", dir, e.msg);
            squad_model_free(m);
            /* transformers' spelling of the layout. */
            size_t n;
            char *text = read_all(dir, "config.json", &n);
            json_t *j = text ? json_loads(text, 0, NULL) : NULL;
            const char *arch = json_string_value(json_array_get(json_object_get(j, "architectures"), 0));
            const char *type = json_string_value(json_object_get(j, "model_type"));
            if (layout == SQUAD_SYNTH_CAUSAL)
                CHECK(arch && !strcmp(arch, "Qwen3_5ForCausalLM") && type && !strcmp(type, "qwen3_5_text"));
            else
                CHECK(arch && !strcmp(arch, "Qwen3_5ForConditionalGeneration") && type && !strcmp(type, "qwen3_5") &&
                      json_is_object(json_object_get(j, "text_config")));
            CHECK(text && n > 0 && text[n - 1] == '\n');
            json_decref(j);
            free(text);
        }
    }
}

static void test_determinism_and_errors(void) {
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/det-a", g_root);
    snprintf(b, sizeof b, "%s/det-b/nested/dir", g_root); /* parents are created */
    squad_synth_opts o = {.preset = "tiny", .out_dir = a, .seed = 99};
    squad_err e = {0};
    CHECK(squad_synth_write(&o, &e) == 0);
    o.out_dir = b;
    CHECKF(squad_synth_write(&o, &e) == 0, "%s", e.msg);
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        size_t n1 = 0, n2 = 0;
        char *x = read_all(a, files[i], &n1), *y = read_all(b, files[i], &n2);
        CHECKF(x && y && n1 == n2 && !memcmp(x, y, n1), "%s differs between two runs", files[i]);
        free(x);
        free(y);
    }
    o.preset = "nope";
    CHECK(squad_synth_write(&o, &e) != 0 && strstr(e.msg, "unknown preset"));
    o.preset = "tiny";
    o.out_dir = "/proc/forbidden/dir";
    CHECK(squad_synth_write(&o, &e) != 0 && strstr(e.msg, "/proc/forbidden"));
    o.out_dir = a;
    o.tokenizer = "/nonexistent/tokenizer.json";
    CHECK(squad_synth_write(&o, &e) != 0 && strstr(e.msg, "/nonexistent/tokenizer.json"));
    /* A stale shard index in the output directory would shadow the new file. */
    char *idx = path2(a, "model.safetensors.index.json");
    FILE *f = fopen(idx, "w");
    fputs("{}", f);
    fclose(f);
    o.tokenizer = NULL;
    CHECK(squad_synth_write(&o, &e) != 0 && strstr(e.msg, "index.json"));
    remove(idx);
    free(idx);
}

static void test_tokenizer(void) {
    char tok[512], dir[512];
    snprintf(tok, sizeof tok, "%s/tok.json", g_root);
    snprintf(dir, sizeof dir, "%s/with-tok", g_root);
    const char *text =
        "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 1100, \"content\": \"<|im_end|>\", \"special\": true}],"
        " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"\\u00e9\": 1000}, \"merges\": []}}";
    FILE *f = fopen(tok, "w");
    fputs(text, f);
    fclose(f);
    squad_synth_opts o = {.preset = "qwen3.5-0.8b", .out_dir = dir, .seed = 1, .tokenizer = tok};
    o.preset = "tiny"; /* the vocabulary follows the tokenizer whatever the preset */
    squad_err e = {0};
    CHECKF(squad_synth_write(&o, &e) == 0, "%s", e.msg);
    squad_model *m = squad_model_load(dir, &e);
    CHECKF(m && squad_model_vocab_size(m) == 1152 && m->embed.rows == 1152, "%s", m ? "" : e.msg); /* 1101 -> 1152 */
    squad_model_free(m);
    size_t n = 0;
    char *copy = read_all(dir, "tokenizer.json", &n);
    CHECK(copy && n == strlen(text) && !memcmp(copy, text, n));
    free(copy);
    /* Writing into the directory that holds the tokenizer itself keeps it. */
    char *inplace = path2(dir, "tokenizer.json");
    o.tokenizer = inplace;
    CHECKF(squad_synth_write(&o, &e) == 0, "%s", e.msg);
    copy = read_all(dir, "tokenizer.json", &n);
    CHECK(copy && n == strlen(text));
    free(copy);
    free(inplace);
    /* Tokenizers without ids, or with bad ones, are refused. */
    f = fopen(tok, "w");
    fputs("{\"model\": {\"vocab\": {}}}", f);
    fclose(f);
    o.tokenizer = tok;
    CHECK(squad_synth_write(&o, &e) != 0 && strstr(e.msg, "no token ids"));
    f = fopen(tok, "w");
    fputs("{\"model\": {\"vocab\": {\"a\": -3}}}", f);
    fclose(f);
    CHECK(squad_synth_write(&o, &e) != 0 && strstr(e.msg, "token id"));
    f = fopen(tok, "w");
    fputs("not json", f);
    fclose(f);
    CHECK(squad_synth_write(&o, &e) != 0 && strstr(e.msg, "tok.json"));
}

/* Every name of `want` ({name: [shape]}) is in the list with that shape, and nothing else is. */
static void compare_names(json_t *want, const char *const *names, const int64_t (*shapes)[3], const int *ndims, int n,
                          const char *what) {
    int missing = 0, extra = 0, wrong = 0;
    for (int i = 0; i < n; i++) {
        json_t *s = json_object_get(want, names[i]);
        if (!s) {
            if (extra++ < 5) fprintf(stderr, "%s: synth writes '%s', transformers does not have it\n", what, names[i]);
            continue;
        }
        int same = json_is_array(s) && (int)json_array_size(s) == ndims[i];
        for (int d = 0; same && d < ndims[i]; d++) same = json_integer_value(json_array_get(s, (size_t)d)) == shapes[i][d];
        if (!same && wrong++ < 5) fprintf(stderr, "%s: '%s' has another shape in transformers\n", what, names[i]);
    }
    const char *k;
    json_t *v;
    json_object_foreach(want, k, v) {
        int found = 0;
        for (int i = 0; i < n && !found; i++) found = !strcmp(names[i], k);
        if (!found && missing++ < 5) fprintf(stderr, "%s: transformers has '%s', synth does not write it\n", what, k);
    }
    CHECKF(missing == 0 && extra == 0 && wrong == 0 && (size_t)n == json_object_size(want),
           "%s: %d missing, %d extra, %d wrong shapes (%d written, %zu expected)", what, missing, extra, wrong, n,
           json_object_size(want));
}

static void compare_plan(json_t *want, squad_synth_layout layout, const char *what) {
    squad_config c;
    squad_synth_plan plan;
    squad_err e = {0};
    squad_synth_preset_config("qwen3.5-0.8b", &c, &e);
    if (squad_synth_plan_make(&c, layout, &plan, &e) != 0) return;
    const char **names = calloc((size_t)plan.n, sizeof *names);
    int64_t(*shapes)[3] = calloc((size_t)plan.n, sizeof *shapes);
    int *ndims = calloc((size_t)plan.n, sizeof *ndims);
    for (int i = 0; i < plan.n; i++) {
        names[i] = plan.tensors[i].name;
        ndims[i] = plan.tensors[i].ndim;
        memcpy(shapes[i], plan.tensors[i].shape, sizeof shapes[i]);
    }
    compare_names(want, names, (const int64_t(*)[3])shapes, ndims, plan.n, what);
    free(names);
    free(shapes);
    free(ndims);
    squad_synth_plan_free(&plan);
}

static void test_08b(void) {
    json_error_t je;
    json_t *fx = json_load_file(TENSORS_FIXTURE, 0, &je);
    CHECKF(fx != NULL, "%s is missing or unreadable (%s); it is made with transformers by tools/make_fixtures.py",
           TENSORS_FIXTURE, je.text);
    json_t *causal = json_object_get(fx, "causal"), *cond = json_object_get(fx, "conditional_text");
    CHECKF(json_is_object(causal), "%s has no \"causal\" object", TENSORS_FIXTURE);
    if (json_is_object(cond)) compare_plan(cond, SQUAD_SYNTH_CONDITIONAL, "conditional layout (plan)");

    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3.5-0.8b", g_root);
    squad_synth_opts o = {.preset = "qwen3.5-0.8b", .out_dir = dir, .seed = 0};
    squad_err e = {0};
    double t0 = squad_now_seconds();
    int rc = squad_synth_write(&o, &e);
    double dt = squad_now_seconds() - t0;
    CHECKF(rc == 0, "%s", e.msg);
    printf("test_synth: qwen3.5-0.8b written in %.1f s\n", dt);
    char *path = path2(dir, "model.safetensors");
    st_file f;
    if (rc == 0 && st_file_open(&f, path, &e) == 0) {
        printf("test_synth: %d tensors, %.2f GB\n", f.n_tensors, f.map_size / 1e9);
        const char **names = calloc((size_t)f.n_tensors, sizeof *names);
        int64_t(*shapes)[3] = calloc((size_t)f.n_tensors, sizeof *shapes);
        int *ndims = calloc((size_t)f.n_tensors, sizeof *ndims);
        int all_bf16 = 1, small_rank = 1;
        for (int i = 0; i < f.n_tensors; i++) {
            names[i] = f.tensors[i].name;
            ndims[i] = f.tensors[i].ndim;
            small_rank &= ndims[i] <= 3;
            for (int d = 0; d < ndims[i] && d < 3; d++) shapes[i][d] = f.tensors[i].shape[d];
            all_bf16 &= f.tensors[i].dtype == ST_BF16;
        }
        CHECK(all_bf16 && small_rank);
        if (json_is_object(causal) && small_rank)
            compare_names(causal, names, (const int64_t(*)[3])shapes, ndims, f.n_tensors, "causal layout (file)");
        free(names);
        free(shapes);
        free(ndims);
        st_file_close(&f);
        /* It loads (bf16 in place: only the vectors are converted). */
        squad_model *m = squad_model_load(dir, &e);
        CHECKF(m != NULL, "%s", e.msg);
        squad_model_free(m);
    } else if (rc == 0) {
        CHECKF(0, "%s", e.msg);
    }
    remove(path);
    free(path);
    path = path2(dir, "config.json");
    remove(path);
    free(path);
    json_decref(fx);
}

/* FNV-1a 64 of a file's bytes (0 when unreadable). */
static uint64_t file_hash(const char *dir, const char *name) {
    size_t n = 0;
    char *text = read_all(dir, name, &n);
    if (!text) return 0;
    uint64_t h = SQUAD_SYNTH_FNV_BASIS;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)text[i]) * 1099511628211ull;
    free(text);
    return h;
}

/* Text-only presets are written byte for byte as before the vision tower existed: hashes of the
 * files written then (seed 7, both layouts). */
static void test_text_only_unchanged(void) {
    static const struct {
        const char *preset;
        int layout;
        uint64_t config, weights;
    } want[] = {
        {"tiny", 0, 0xbed453e93fff6162ull, 0xd828f5871e9d3580ull},
        {"tiny", 1, 0x66ab2791163f7362ull, 0x1527f31937571127ull},
        {"tiny-mha", 0, 0xe9f3e17130381c35ull, 0xadfe7cf00520a427ull},
        {"tiny-mha", 1, 0x4f17f382b73b18baull, 0xa753d23184d5b1f3ull},
        {"tiny-hd256", 0, 0x808f24737d9fb01full, 0xef88e3d547850d84ull},
        {"tiny-hd256", 1, 0x11c38de61c25ed41ull, 0xac68c31746aed2a1ull},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/unchanged-%zu", g_root, i);
        squad_synth_opts o = {.preset = want[i].preset, .out_dir = dir, .seed = 7, .layout = want[i].layout};
        squad_err e = {0};
        CHECKF(squad_synth_write(&o, &e) == 0, "%s", e.msg);
        CHECKF(file_hash(dir, "config.json") == want[i].config, "%s layout %d: config.json changed", want[i].preset,
               want[i].layout);
        CHECKF(file_hash(dir, "model.safetensors") == want[i].weights, "%s layout %d: model.safetensors changed",
               want[i].preset, want[i].layout);
        char *pre = path2(dir, "preprocessor_config.json");
        CHECK(access(pre, F_OK) != 0); /* no tower, no image processor */
        free(pre);
    }
}

/* tiny-vl: the tower in the conditional layout, the ids from the tokenizer (or Qwen3.5's), a
 * processor config, a checkpoint that loads and whose config parses back to the preset. */
static void test_tiny_vl(void) {
    const char *tok = "third_party/qwen3/tokenizer.json";
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tiny-vl", g_root);
    squad_synth_opts o = {.preset = "tiny-vl", .out_dir = dir, .seed = 3, .tokenizer = tok};
    squad_err e = {0};
    CHECKF(squad_synth_write(&o, &e) == 0, "%s", e.msg);
    squad_config want, got;
    CHECK(squad_synth_preset_config("tiny-vl", &want, &e) == 0 && want.has_vision && want.vision.depth == 2 &&
          want.vision.num_position_embeddings == 16 && want.vision.out_hidden_size == want.hidden_size);
    char *cp = path2(dir, "config.json");
    CHECKF(squad_config_load(&got, cp, &e) == 0, "%s", e.msg);
    free(cp);
    /* Qwen3's tokenizer: its ids and its vocabulary (largest id 151668, rounded up to 151680). */
    CHECKF(got.image_token_id == 151655 && got.vision_start_token_id == 151652 && got.vision_end_token_id == 151653,
           "ids %d %d %d", got.image_token_id, got.vision_start_token_id, got.vision_end_token_id);
    CHECK(got.vocab_size == 151680 && got.nested == 1);
    want.vocab_size = got.vocab_size, want.nested = 1;
    want.image_token_id = got.image_token_id;
    want.vision_start_token_id = got.vision_start_token_id;
    want.vision_end_token_id = got.vision_end_token_id;
    CHECK(memcmp(&want, &got, sizeof want) == 0);
    squad_model *m = squad_model_load(dir, &e);
    CHECKF(m && m->vision, "%s", e.msg);
    squad_model_free(m);
    squad_image_proc_config pc;
    char *pp = path2(dir, "preprocessor_config.json");
    CHECKF(squad_image_proc_config_load(&pc, pp, &e) == 0, "%s", e.msg);
    free(pp);
    CHECK(pc.patch_size == 16 && pc.merge_size == 2 && pc.temporal_patch_size == 2 && pc.image_mean[0] == 0.5 &&
          pc.image_std[2] == 0.5 && pc.min_pixels == 1024 && pc.max_pixels == 16384);
    int grid[3];
    CHECK(squad_image_grid(&pc, 64, 64, grid, &e) == 0 && grid[0] == 1 && grid[1] == 4 && grid[2] == 4);
    /* Deterministic. */
    uint64_t h1 = file_hash(dir, "model.safetensors");
    char dir2[512];
    snprintf(dir2, sizeof dir2, "%s/tiny-vl-again", g_root);
    o.out_dir = dir2;
    CHECKF(squad_synth_write(&o, &e) == 0, "%s", e.msg);
    CHECK(h1 != 0 && file_hash(dir2, "model.safetensors") == h1);
    CHECK(file_hash(dir2, "config.json") == file_hash(dir, "config.json"));

    /* Without a tokenizer: Qwen3.5's ids, the vocabulary grown to cover them. */
    snprintf(dir, sizeof dir, "%s/tiny-vl-noid", g_root);
    squad_synth_opts o2 = {.preset = "tiny-vl", .out_dir = dir};
    CHECKF(squad_synth_write(&o2, &e) == 0, "%s", e.msg);
    cp = path2(dir, "config.json");
    CHECKF(squad_config_load(&got, cp, &e) == 0, "%s", e.msg);
    free(cp);
    CHECK(got.image_token_id == 248056 && got.vision_start_token_id == 248053 && got.vision_end_token_id == 248054 &&
          got.vocab_size == 248064);
    m = squad_model_load(dir, &e);
    CHECKF(m && m->vision, "%s", e.msg);
    squad_model_free(m);

    /* --vision on a preset without a tower is an error; the 0.8B's tower has the real shapes. */
    squad_synth_opts o3 = {.preset = "tiny", .out_dir = dir, .vision = 1};
    CHECK(squad_synth_write(&o3, &e) != 0 && strstr(e.msg, "no vision tower"));
    squad_config c;
    CHECK(squad_synth_preset_config("qwen3.5-0.8b", &c, &e) == 0 && !c.has_vision);
    CHECK(squad_synth_preset_config_vision("qwen3.5-0.8b", 1, &c, &e) == 0 && c.has_vision && c.vision.depth == 12 &&
          c.vision.hidden_size == 768 && c.vision.num_heads == 12 && c.vision.intermediate_size == 3072 &&
          c.vision.num_position_embeddings == 2304 && c.vision.out_hidden_size == 1024 &&
          c.vision.position_grid_side == 48);
    squad_synth_plan plan;
    CHECK(squad_synth_plan_make(&c, SQUAD_SYNTH_CONDITIONAL, &plan, &e) == 0);
    int found = 0;
    for (int i = 0; i < plan.n; i++) {
        const squad_synth_tensor *t = &plan.tensors[i];
        if (!strcmp(t->name, "model.visual.patch_embed.proj.weight"))
            found += t->ndim == 5 && t->shape[0] == 768 && t->shape[1] == 3 && t->shape[2] == 2 && t->shape[3] == 16 &&
                     t->shape[4] == 16;
        if (!strcmp(t->name, "model.visual.merger.linear_fc2.weight"))
            found += t->ndim == 2 && t->shape[0] == 1024 && t->shape[1] == 3072;
        if (!strcmp(t->name, "model.visual.blocks.11.attn.qkv.weight"))
            found += t->ndim == 2 && t->shape[0] == 2304 && t->shape[1] == 768;
    }
    CHECK(found == 3);
    squad_synth_plan_free(&plan);
}

int main(void) {
    snprintf(g_root, sizeof g_root, "%s", test_tmpdir());
    test_text_only_unchanged();
    test_tiny_vl();
    test_presets();
    test_write_small();
    test_determinism_and_errors();
    test_tokenizer();
    test_08b();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_root);
    return test_summary("test_synth");
}
