/*
 * specialists.h — a specialists directory (docs/specialists.md): the router and the LoRA adapters
 * of the fine-tuned variants that share the base model's lower layers.
 *
 * A directory holds squad-specialists.json (the router's file, the layer it reads, its features,
 * eps and labels, label 0 being the trunk; `split`, the first layer adapters may touch; the
 * specialists, label -> PEFT adapter directory), the router's safetensors (weight [R, H], bias [R])
 * and one PEFT LoRA adapter directory per specialist (adapter_config.json,
 * adapter_model.safetensors).
 *
 * Design:
 *  - Loading is strict and complete: every file is read and every tensor is accounted for before
 *    anything is returned. A feature squad does not implement (DoRA, LoRA bias, modules_to_save,
 *    per-module ranks, a tensor on a module squad does not adapt, a tensor below `split`) is
 *    refused with a message that names the adapter and the tensor or field: an adapter tensor is
 *    never silently dropped, so a loaded specialist computes exactly what peft computes.
 *  - Weights are kept as fp32 host arrays, one (A, B) pair per layer and projection, never merged
 *    into the shared weights: backends convert or upload them as they need (bf16 on the GPU), and
 *    the trunk's weights stay shared by every route.
 *  - The router is a pure function of the row: a feature accumulator (sum of the weightless
 *    RMS-normalised hidden states entering the router layer, and their count) that can be carried
 *    across chunks and stored in checkpoints, then logits = W mean + b and argmax. The sum is
 *    double so that the order chunks are added in (cached or not) does not move the route.
 */
#ifndef SQUAD_SPECIALISTS_H
#define SQUAD_SPECIALISTS_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "squad.h"

#define SQUAD_SPECIALISTS_FILE "squad-specialists.json"
#define SQUAD_ADAPTER_CONFIG_FILE "adapter_config.json"
#define SQUAD_ADAPTER_WEIGHTS_FILE "adapter_model.safetensors"
/* The longest label accepted (labels appear in outputs and as served model names). */
#define SQUAD_SPECIALIST_LABEL_MAX 64
/* The most routes (labels, the trunk included) a directory may declare. */
#define SQUAD_SPECIALISTS_MAX SQUAD_MAX_ROUTES
/* The largest LoRA rank accepted (the reference application keeps A x on the stack). */
#define SQUAD_LORA_MAX_RANK 1024

/* The projections of docs/design.md section 4 that an adapter may adapt. */
typedef enum {
    SQUAD_PROJ_IN_QKV = 0, /* linear_attn.in_proj_qkv [2 nk dk + nv dv][H] */
    SQUAD_PROJ_IN_Z,       /* linear_attn.in_proj_z   [nv dv][H] */
    SQUAD_PROJ_IN_B,       /* linear_attn.in_proj_b   [nv][H] */
    SQUAD_PROJ_IN_A,       /* linear_attn.in_proj_a   [nv][H] */
    SQUAD_PROJ_OUT,        /* linear_attn.out_proj    [H][nv dv] */
    SQUAD_PROJ_Q,          /* self_attn.q_proj        [nh 2 hd][H] */
    SQUAD_PROJ_K,          /* self_attn.k_proj        [nkv hd][H] */
    SQUAD_PROJ_V,          /* self_attn.v_proj        [nkv hd][H] */
    SQUAD_PROJ_O,          /* self_attn.o_proj        [H][nh hd] */
    SQUAD_PROJ_GATE,       /* mlp.gate_proj           [I][H] */
    SQUAD_PROJ_UP,         /* mlp.up_proj             [I][H] */
    SQUAD_PROJ_DOWN,       /* mlp.down_proj           [H][I] */
    SQUAD_PROJ_COUNT
} squad_proj_id;

/* "linear_attn.in_proj_qkv", "mlp.down_proj", ...: the module path inside a decoder layer. */
const char *squad_proj_module(int proj);
/* The projection's shape in layer `layer` of cfg (y = W x, W [out][in]); 0 when that layer has it,
 * -1 when it does not (an attention projection on a Gated DeltaNet layer, or the reverse). */
int squad_proj_shape(const squad_config *cfg, int layer, int proj, int *out, int *in);

/* One adapted projection: y += scale * B (A x). A NULL A means the projection is not adapted. */
typedef struct squad_lora_proj {
    int r, in, out;
    float *A; /* [r][in] */
    float *B; /* [out][r] */
} squad_lora_proj;

typedef struct squad_adapter {
    char *label;
    char *dir;      /* the adapter directory as resolved */
    int r;          /* adapter_config.json "r" (every pair has this rank) */
    double alpha;   /* "lora_alpha" */
    int rslora;     /* "use_rslora" */
    float scale;    /* alpha / r, or alpha / sqrt(r) with rslora */
    int n_layers;   /* the base model's layers */
    int n_pairs;    /* adapted projections */
    squad_lora_proj (*proj)[SQUAD_PROJ_COUNT]; /* [n_layers][SQUAD_PROJ_COUNT] */
} squad_adapter;

typedef struct squad_router {
    int layer;      /* reads the hidden state entering this layer (0: the embeddings) */
    float eps;      /* of the weightless RMS normalisation */
    int n_labels;   /* R: routes, the trunk (label 0) included */
    int hidden;     /* H */
    float *weight;  /* [R][H] */
    float *bias;    /* [R] */
} squad_router;

struct squad_specialists {
    char *dir;
    int split;      /* adapters apply to layers >= split */
    int n_layers, hidden;
    squad_router router;
    char **labels;            /* [R] */
    squad_adapter *adapters;  /* [R]; adapters[0] (the trunk) holds no weights */
};

/* Loads a specialists directory against a model configuration (the shapes its adapters must
 * match). squad_specialists_load (squad.h) calls this with the model's configuration. */
squad_specialists *squad_specialists_load_config(const squad_config *cfg, const char *dir, squad_err *err);

/* ---------------------------------------------------------------------------------------------
 * The router
 */

/* The router's feature accumulator over a row's tokens: the sum of x / sqrt(mean(x^2) + eps) and
 * how many tokens it holds. Chunks add to it in any order; a checkpoint stores a copy. */
typedef struct squad_router_feat {
    int dim;
    int64_t count;
    double *sum; /* [dim] */
} squad_router_feat;

int squad_router_feat_init(squad_router_feat *f, int dim, squad_err *err);
void squad_router_feat_free(squad_router_feat *f);
void squad_router_feat_reset(squad_router_feat *f);
/* dst = src (both initialised with the same dim). */
void squad_router_feat_copy(squad_router_feat *dst, const squad_router_feat *src);
/* Adds n tokens' hidden states (x: n rows of f->dim floats, ld floats apart), each normalised
 * with eps. */
void squad_router_feat_add(squad_router_feat *f, const float *x, int n, size_t ld, float eps);
/* Adds a partial sum of n already-normalised tokens computed elsewhere (a backend's chunk). */
void squad_router_feat_add_sum(squad_router_feat *f, const float *sum, int n);
/* The same for a partial sum kept in double (squad_chunk.router_sum). */
void squad_router_feat_add_dsum(squad_router_feat *f, const double *sum, int n);
/* One token's normalised hidden state added to a partial sum: sum += x / sqrt(mean(x^2) + eps),
 * in the arithmetic of squad_router_feat_add (what a CPU backend's chunk sum uses). */
void squad_router_norm_add(double *sum, const float *x, int dim, float eps);

/* The route of the features: logits = weight . (sum / count) + bias, argmax (the lowest label on a
 * tie). logits and probs (softmax of logits), each [R], may be NULL. Returns the route (>= 0), or
 * SQUAD_E_INVALID when the accumulator holds no token or its dim is not the router's. */
int squad_router_route(const squad_router *r, const squad_router_feat *f, float *logits, float *probs,
                       squad_err *err);

/* The reference LoRA application on fp32 vectors: y[out] += scale * B (A x[in]), summed in double. */
void squad_lora_apply_ref(const squad_lora_proj *p, float scale, const float *x, float *y);

#endif /* SQUAD_SPECIALISTS_H */
