/*
 * model.h — a loaded model: its configuration and its weights bound by Hugging Face names.
 *
 * Matrices stay bf16 in memory ([rows][cols] row-major, as the checkpoint stores them: y = W x),
 * pointing into the mmapped safetensors when the file is bf16, converted once (owned) when it is
 * F16 or F32. Vectors (norm weights, A_log, dt_bias, conv weights) are converted to fp32 (owned).
 * Both Qwen3_5ForCausalLM (model.layers.N...) and Qwen3_5ForConditionalGeneration
 * (model.language_model.layers.N...) layouts are read; mtp.* is ignored. When the config has a
 * vision tower, model.visual.* is bound into `vision` (vision_model.h), else it is ignored too,
 * and its image processor's configuration is read from preprocessor_config.json (or
 * processor_config.json) beside config.json: what squad_image_load turns an image into a grid with.
 */
#ifndef SQUAD_MODEL_H
#define SQUAD_MODEL_H

#include <stdint.h>

#include "config.h"
#include "image/preprocess.h"
#include "safetensors.h"
#include "squad.h"

typedef struct squad_mat {
    const uint16_t *w; /* bf16 [rows][cols] */
    int rows, cols;
} squad_mat;

typedef struct squad_layer_weights {
    int kind;          /* SQUAD_LAYER_LINEAR or SQUAD_LAYER_FULL */
    float *input_norm; /* [H], zero-centred: the op applies (1 + w) */
    float *post_norm;  /* [H], zero-centred */
    squad_mat mlp_gate, mlp_up; /* [I][H] */
    squad_mat mlp_down;         /* [H][I] */

    /* Gated DeltaNet (kind == SQUAD_LAYER_LINEAR) */
    squad_mat in_qkv;   /* [2 nk dk + nv dv][H] */
    squad_mat in_z;     /* [nv dv][H] */
    squad_mat in_b;     /* [nv][H] */
    squad_mat in_a;     /* [nv][H] */
    squad_mat out_proj; /* [H][nv dv] */
    float *conv_w;      /* [C][K] */
    float *A_log;       /* [nv] */
    float *dt_bias;     /* [nv] */
    float *gdn_norm;    /* [dv], a plain weight (not zero-centred) */

    /* Gated attention (kind == SQUAD_LAYER_FULL) */
    squad_mat q_proj; /* [nh 2 hd][H]: per head hd query then hd gate */
    squad_mat k_proj; /* [nkv hd][H] */
    squad_mat v_proj; /* [nkv hd][H] */
    squad_mat o_proj; /* [H][nh hd] */
    float *q_norm;    /* [hd], zero-centred */
    float *k_norm;    /* [hd], zero-centred */
} squad_layer_weights;

struct squad_vision_weights; /* vision_model.h */

struct squad_model {
    squad_config cfg;
    char *dir;
    st_set files;
    squad_mat embed;   /* [V][H] */
    squad_mat lm_head; /* [V][H]: == embed when tied */
    float *final_norm; /* [H], zero-centred */
    squad_layer_weights layers[SQUAD_MAX_LAYERS];
    struct squad_vision_weights *vision; /* the vision tower when cfg.has_vision, else NULL */
    /* the image processor (preprocessor_config.json) of a model with a tower; has_image_proc 0 when
     * the directory has none (squad_image_load then refuses images) */
    squad_image_proc_config image_proc;
    int has_image_proc;
    /* every owned buffer (converted matrices and vectors), freed with the model */
    void **owned;
    int n_owned, cap_owned;
};

/* The model directory exists and is a directory: 0, or SQUAD_E_MODEL with "model directory DIR:
 * why" (squad_model_load's first check; the CLI makes it first, before the tokenizer or template
 * it also reads from the directory, so that every command reports a wrong directory alike). */
int squad_model_dir_check(const char *dir, squad_err *err);

/* The image processor's configuration of a model with a vision tower: preprocessor_config.json,
 * else processor_config.json, in dir (neither: has_image_proc stays 0). Its patch, temporal patch
 * and merge sizes must be the tower's (SQUAD_E_MODEL naming both otherwise). Called by
 * squad_model_load; a no-op for a model without a tower. */
int squad_model_load_image_proc(squad_model *m, const char *dir, squad_err *err);

/* Binds the tensors of an opened set to a model of configuration cfg (used by squad_model_load
 * and by tests). */
int squad_model_bind(squad_model *m, squad_err *err);

/* Binds model.visual.* into m->vision (implemented in vision_model.c; called by squad_model_bind
 * when m->cfg.has_vision). */
int squad_vision_bind(squad_model *m, squad_err *err);

/* The binding helpers squad_model_bind uses, for vision_model.c. Every check and conversion is
 * theirs: a missing tensor, a wrong shape or an unsupported dtype is an error naming the tensor.
 *  - a matrix stored with shape[0] rows and the product of the other dims as columns (a Conv3d's
 *    [out, C, T, P, P] is the matrix [out][C T P P]), kept bf16;
 *  - a tensor of any shape converted to an owned fp32 array;
 *  - a zeroed, 64-byte aligned buffer freed with the model. */
int squad_model_bind_matrix_nd(squad_model *m, const char *name, const int64_t *shape, int ndim, squad_mat *out,
                               squad_err *err);
int squad_model_bind_floats(squad_model *m, const char *name, const int64_t *shape, int ndim, float **out,
                            squad_err *err);
void *squad_model_owned_alloc(squad_model *m, size_t bytes, squad_err *err);

#endif /* SQUAD_MODEL_H */
