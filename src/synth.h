/*
 * synth.h — deterministic random checkpoints in the Hugging Face layout (`squad synth`).
 *
 * A preset names a Qwen3.5 text configuration (tiny test models up to the 0.8B reference shapes).
 * squad_synth_write writes config.json (as transformers writes it for Qwen3_5ForCausalLM, or the
 * nested Qwen3_5ForConditionalGeneration form) and model.safetensors, whose values come from a
 * seeded generator: the same preset, seed, layout and tokenizer give byte-identical files. Each
 * tensor's values depend only on the seed and the tensor's name inside the text model, so both
 * layouts hold the same weights. The file is streamed tensor by tensor (the 0.8B preset writes
 * about 1.5 GB without holding it in memory).
 *
 * Vision: the tiny-vl preset (and qwen3.5-0.8b with opts.vision) also has a vision tower, written in
 * the Qwen3_5ForConditionalGeneration layout (model.visual.*, a vision_config, the image token ids
 * at the top level) with a preprocessor_config.json for the image processor. Text-only checkpoints
 * are written exactly as before.
 */
#ifndef SQUAD_SYNTH_H
#define SQUAD_SYNTH_H

#include <stdint.h>

#include "config.h"
#include "safetensors.h"
#include "squad.h"

typedef enum { SQUAD_SYNTH_CAUSAL = 0, SQUAD_SYNTH_CONDITIONAL = 1 } squad_synth_layout;

/* Zero-initialised options (plus preset and out_dir) mean: seed 0, causal layout, bf16. */
typedef struct squad_synth_opts {
    const char *preset;  /* a name from squad_synth_preset_name */
    const char *out_dir; /* created when missing */
    uint64_t seed;
    const char *tokenizer;     /* optional tokenizer.json: copied, and the vocabulary sized to cover it */
    squad_synth_layout layout; /* causal (default) or conditional */
    st_dtype dtype;            /* ST_BF16 (default); ST_F16 / ST_F32 hold the same bf16-rounded values */
    int vision;                /* 1: also the preset's vision tower (qwen3.5-0.8b: the real tower's shapes);
                                * tiny-vl always has its tower. A tower implies the conditional layout. */
} squad_synth_opts;

/* The presets, for --help and tests: i in [0, squad_synth_preset_count()). */
int squad_synth_preset_count(void);
const char *squad_synth_preset_name(int i);
const char *squad_synth_preset_summary(int i);

/* The configuration of a preset (vocab_size as the preset has it; the vision tower only for a preset
 * that always has one). */
int squad_synth_preset_config(const char *preset, squad_config *cfg, squad_err *err);
/* The same with the tower a preset may have (vision = 1): an error for a preset without one. */
int squad_synth_preset_config_vision(const char *preset, int vision, squad_config *cfg, squad_err *err);

/* The tensors a checkpoint of cfg holds in a layout, in file order. */
typedef struct squad_synth_tensor {
    char name[128];
    int ndim;
    int64_t shape[5]; /* the vision tower's patch embedding is 5-dimensional */
    int kind; /* how its values are drawn (synth.c) */
} squad_synth_tensor;

typedef struct squad_synth_plan {
    squad_synth_tensor *tensors;
    int n;
} squad_synth_plan;

int squad_synth_plan_make(const squad_config *cfg, squad_synth_layout layout, squad_synth_plan *plan, squad_err *err);
void squad_synth_plan_free(squad_synth_plan *plan);

/* Writes the checkpoint (config.json, model.safetensors, tokenizer.json when given) into out_dir. */
int squad_synth_write(const squad_synth_opts *opts, squad_err *err);

/* The random streams every synthesized file draws from (checkpoints and specialists directories):
 * splitmix64 keyed by the seed and an FNV-1a hash of the tensor's name, so each tensor's values
 * depend on nothing else; bell-shaped values (Irwin-Hall of four 16-bit uniforms, variance 1) times
 * scale. */
#define SQUAD_SYNTH_FNV_BASIS 1469598103934665603ull
typedef struct squad_synth_rng {
    uint64_t state;
} squad_synth_rng;
uint64_t squad_synth_rng_next(squad_synth_rng *r);
uint64_t squad_synth_fnv1a(uint64_t h, const char *s); /* h extended by the bytes of s */
squad_synth_rng squad_synth_rng_keyed(uint64_t seed, uint64_t key);
float squad_synth_rng_bell(squad_synth_rng *r, float scale);

#endif /* SQUAD_SYNTH_H */
