/*
 * fuzz_config.c — libFuzzer target for the config.json parser (squad_config_parse).
 *
 * Any byte string must either fail with a message or give a configuration whose invariants hold
 * (the ones the loader and the forward pass rely on without checking again).
 */
#include <stdint.h>
#include <stdlib.h>

#include "config.h"

static void check_config(const squad_config *c) {
    if (c->hidden_size <= 0 || c->num_layers <= 0 || c->num_layers > SQUAD_MAX_LAYERS) __builtin_trap();
    if (c->intermediate_size <= 0 || c->vocab_size <= 0 || c->conv_kernel <= 0) __builtin_trap();
    if (c->num_heads <= 0 || c->num_kv_heads <= 0 || c->num_heads % c->num_kv_heads) __builtin_trap();
    if (c->lin_num_k_heads <= 0 || c->lin_num_v_heads <= 0 || c->lin_num_v_heads % c->lin_num_k_heads)
        __builtin_trap();
    if (c->head_dim <= 0 || c->lin_k_dim <= 0 || c->lin_v_dim <= 0) __builtin_trap();
    if (c->rotary_dim < 2 || c->rotary_dim > c->head_dim || c->rotary_dim % 2) __builtin_trap();
    if (!(c->rms_eps > 0) || !(c->rope_theta > 0) || c->max_position <= 0) __builtin_trap();
    if ((int64_t)squad_config_gdn_channels(c) <= 0) __builtin_trap();
    for (int i = 0; i < c->num_layers; i++)
        if (c->layer_types[i] != SQUAD_LAYER_LINEAR && c->layer_types[i] != SQUAD_LAYER_FULL) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    squad_config cfg;
    squad_err err;
    err.msg[0] = 0;
    if (squad_config_parse(&cfg, (const char *)data, size, &err) == 0)
        check_config(&cfg);
    else if (!err.msg[0])
        __builtin_trap();
    return 0;
}
