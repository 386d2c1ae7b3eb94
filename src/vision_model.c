/*
 * vision_model.c — binds the vision tower's weights, model.visual.* (see vision_model.h).
 *
 * Design: the names and shapes are transformers 5.x's Qwen3_5VisionModel state dict (checked on
 * the tests/fixtures/models/tiny-cond-untied checkpoint it saved): patch_embed.proj (Conv3d with
 * bias), pos_embed (nn.Embedding), blocks.N.{norm1, norm2} (LayerNorm), blocks.N.attn.{qkv, proj},
 * blocks.N.mlp.{linear_fc1, linear_fc2} (all with biases), merger.{norm, linear_fc1, linear_fc2}.
 * Each is checked against vision_config through model.c's helpers, so a missing or misshapen
 * tensor is an error naming it; any other tensor under model.visual. is an error too (a tower
 * with parts squad does not compute, such as DeepStack mergers, would give other numbers).
 */
#include "vision_model.h"

#include <stdio.h>
#include <string.h>

#include "util.h"

#define VISION_PREFIX "model.visual."
#define VISION_NAME_MAX 160

typedef struct vision_binder {
    squad_model *m;
    char name[VISION_NAME_MAX];
} vision_binder;

static const char *vname(vision_binder *b, int block, const char *suffix) {
    if (block < 0)
        snprintf(b->name, sizeof b->name, VISION_PREFIX "%s", suffix);
    else
        snprintf(b->name, sizeof b->name, VISION_PREFIX "blocks.%d.%s", block, suffix);
    return b->name;
}

static int vmatrix(vision_binder *b, int block, const char *suffix, int rows, int cols, squad_mat *out,
                   squad_err *err) {
    int64_t shape[2] = {rows, cols};
    return squad_model_bind_matrix_nd(b->m, vname(b, block, suffix), shape, 2, out, err);
}

static int vvector(vision_binder *b, int block, const char *suffix, int n, float **out, squad_err *err) {
    int64_t shape[1] = {n};
    return squad_model_bind_floats(b->m, vname(b, block, suffix), shape, 1, out, err);
}

static int bind_block(vision_binder *b, int i, squad_vision_block *k, squad_err *err) {
    const squad_vision_config *v = &b->m->cfg.vision;
    int H = v->hidden_size, I = v->intermediate_size;
    if (vvector(b, i, "norm1.weight", H, &k->norm1_w, err) || vvector(b, i, "norm1.bias", H, &k->norm1_b, err) ||
        vmatrix(b, i, "attn.qkv.weight", 3 * H, H, &k->qkv, err) || vvector(b, i, "attn.qkv.bias", 3 * H, &k->qkv_b, err) ||
        vmatrix(b, i, "attn.proj.weight", H, H, &k->proj, err) || vvector(b, i, "attn.proj.bias", H, &k->proj_b, err) ||
        vvector(b, i, "norm2.weight", H, &k->norm2_w, err) || vvector(b, i, "norm2.bias", H, &k->norm2_b, err) ||
        vmatrix(b, i, "mlp.linear_fc1.weight", I, H, &k->fc1, err) ||
        vvector(b, i, "mlp.linear_fc1.bias", I, &k->fc1_b, err) ||
        vmatrix(b, i, "mlp.linear_fc2.weight", H, I, &k->fc2, err) ||
        vvector(b, i, "mlp.linear_fc2.bias", H, &k->fc2_b, err))
        return err->code;
    return 0;
}

static const char *const BLOCK_TENSORS[] = {
    "norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
    "norm2.weight", "norm2.bias", "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight",
    "mlp.linear_fc2.bias"};
static const char *const TOP_TENSORS[] = {
    "patch_embed.proj.weight", "patch_embed.proj.bias", "pos_embed.weight", "merger.norm.weight", "merger.norm.bias",
    "merger.linear_fc1.weight", "merger.linear_fc1.bias", "merger.linear_fc2.weight", "merger.linear_fc2.bias"};

static int in_list(const char *s, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s, list[i])) return 1;
    return 0;
}

/* Whether rest (a name with "model.visual." removed) is a tensor the tower binds. */
static int is_tower_tensor(const squad_vision_config *v, const char *rest) {
    if (in_list(rest, TOP_TENSORS, sizeof TOP_TENSORS / sizeof TOP_TENSORS[0])) return 1;
    if (strncmp(rest, "blocks.", 7) != 0) return 0;
    const char *p = rest + 7;
    int block = 0, digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 4) block = block * 10 + (*p++ - '0'), digits++;
    if (!digits || *p != '.' || block >= v->depth || (digits > 1 && rest[7] == '0')) return 0;
    return in_list(p + 1, BLOCK_TENSORS, sizeof BLOCK_TENSORS / sizeof BLOCK_TENSORS[0]);
}

static int check_no_unknown(const squad_model *m, squad_err *err) {
    const size_t plen = strlen(VISION_PREFIX);
    for (size_t i = 0; i < m->files.n_slots; i++) {
        const st_tensor *t = m->files.slots[i];
        if (!t || strncmp(t->name, VISION_PREFIX, plen) != 0) continue;
        if (!is_tower_tensor(&m->cfg.vision, t->name + plen))
            return squad_fail(err, SQUAD_E_MODEL,
                              "unexpected tensor '%.200s': not part of the vision tower this config describes", t->name);
    }
    return 0;
}

int squad_vision_bind(squad_model *m, squad_err *err) {
    squad_err local;
    if (!err) err = &local;
    const squad_vision_config *v = &m->cfg.vision;
    squad_vision_weights *w = squad_model_owned_alloc(m, sizeof *w, err);
    if (!w) return err->code;
    w->blocks = squad_model_owned_alloc(m, (size_t)v->depth * sizeof *w->blocks, err);
    if (!w->blocks) return err->code;
    vision_binder b = {.m = m};
    int H = v->hidden_size, mm = v->spatial_merge_size * v->spatial_merge_size;
    int64_t patch_shape[5] = {H, v->in_channels, v->temporal_patch_size, v->patch_size, v->patch_size};
    int64_t pos_shape[2] = {v->num_position_embeddings, H};
    if (squad_model_bind_matrix_nd(m, vname(&b, -1, "patch_embed.proj.weight"), patch_shape, 5, &w->patch, err) ||
        vvector(&b, -1, "patch_embed.proj.bias", H, &w->patch_b, err) ||
        squad_model_bind_floats(m, vname(&b, -1, "pos_embed.weight"), pos_shape, 2, &w->pos_embed, err))
        return err->code;
    for (int i = 0; i < v->depth; i++)
        if (bind_block(&b, i, &w->blocks[i], err) != 0) return err->code;
    if (vvector(&b, -1, "merger.norm.weight", H, &w->merger_norm_w, err) ||
        vvector(&b, -1, "merger.norm.bias", H, &w->merger_norm_b, err) ||
        vmatrix(&b, -1, "merger.linear_fc1.weight", mm * H, mm * H, &w->merger_fc1, err) ||
        vvector(&b, -1, "merger.linear_fc1.bias", mm * H, &w->merger_fc1_b, err) ||
        vmatrix(&b, -1, "merger.linear_fc2.weight", v->out_hidden_size, mm * H, &w->merger_fc2, err) ||
        vvector(&b, -1, "merger.linear_fc2.bias", v->out_hidden_size, &w->merger_fc2_b, err))
        return err->code;
    if (check_no_unknown(m, err) != 0) return err->code;
    m->vision = w;
    return 0;
}
