/*
 * specialists_synth.h — deterministic random specialists directories for tests (the specialists
 * counterpart of synth.h).
 *
 * squad_spec_synth_write writes, for a model configuration, squad-specialists.json (labels
 * "trunk", "e2e", "nav"), router.safetensors and two PEFT LoRA adapter directories (e2e/, nav/)
 * that adapt every projection of the layers from `split` on, with non-zero A and B, in the key
 * layout of either checkpoint class. The same configuration, options and seed give the same bytes.
 */
#ifndef SQUAD_SPECIALISTS_SYNTH_H
#define SQUAD_SPECIALISTS_SYNTH_H

#include <stdint.h>

#include "config.h"
#include "safetensors.h"
#include "squad.h"
#include "synth.h"

typedef struct squad_spec_synth_opts {
    const char *out_dir;       /* created when missing */
    uint64_t seed;
    squad_synth_layout layout; /* adapter keys: model.layers.N (causal) or model.language_model.layers.N */
    int split;                 /* adapters on layers >= split */
    int router_layer;          /* <= split */
    int rank;
    double alpha;
    int rslora;
    st_dtype dtype;            /* of every tensor written */
} squad_spec_synth_opts;

/* Fills opts for cfg: seed 0, causal keys, split = layers / 2, router layer = split, rank 4,
 * alpha 8, no rslora, bf16 (out_dir left NULL). */
void squad_spec_synth_defaults(const squad_config *cfg, squad_spec_synth_opts *opts);

int squad_spec_synth_write(const squad_config *cfg, const squad_spec_synth_opts *opts, squad_err *err);

#endif /* SQUAD_SPECIALISTS_SYNTH_H */
