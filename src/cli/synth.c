/*
 * synth.c — `squad synth`: writes a deterministic random checkpoint in the Hugging Face layout
 * (config.json + model.safetensors, optionally a copied tokenizer.json) from a named preset.
 * A thin layer over squad_synth_write (src/synth.h). Exit 0 on success, 2 on usage or write errors.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "specialists.h"
#include "specialists_synth.h"
#include "synth.h"
#include "util.h"

static void synth_help(FILE *f) {
    fprintf(f,
            "usage: squad synth --preset NAME --out DIR [--seed N] [--tokenizer FILE]\n"
            "                   [--layout causal|conditional] [--dtype bf16|f16|f32]\n"
            "                   [--specialists SDIR [--spec-rank N]]\n"
            "\n"
            "Writes a random Qwen3.5 text checkpoint in the Hugging Face layout: DIR/config.json and\n"
            "DIR/model.safetensors (DIR is created when missing). The same preset, seed, layout, dtype and\n"
            "tokenizer always give byte-identical files. Weights are drawn so that answers are neither\n"
            "saturated nor uniform (matrices ~N(0, 1/fan_in), zero-centred norms ~N(0, 0.2), ...).\n"
            "\n"
            "options:\n"
            "  --preset NAME      the model shape (below)\n"
            "  --out DIR          the output directory\n"
            "  --seed N           the random seed, a non-negative integer (default 0)\n"
            "  --tokenizer FILE   copy this tokenizer.json into DIR and size the vocabulary to cover it\n"
            "                     (largest id in model.vocab / added_tokens + 1, rounded up to a multiple\n"
            "                     of 64), whatever the preset's own vocabulary\n"
            "  --layout L         causal (default): Qwen3_5ForCausalLM, tensors model.layers.N...;\n"
            "                     conditional: Qwen3_5ForConditionalGeneration, fields under text_config,\n"
            "                     tensors model.language_model.layers.N... (no vision weights)\n"
            "  --dtype T          bf16 (default), f16 or f32; all hold the same bf16-rounded values\n"
            "  --specialists SDIR also a random specialists directory for the model (docs/specialists.md):\n"
            "                     labels trunk / e2e / nav, LoRA adapters (lora_alpha 8) on the upper half\n"
            "                     of the layers, the router reading the state entering the first adapted layer\n"
            "  --spec-rank N      the adapters' LoRA rank, 1..1024 (default 4)\n"
            "  -h, --help         this text\n"
            "\n"
            "presets:\n");
    for (int i = 0; i < squad_synth_preset_count(); i++)
        fprintf(f, "  %-14s %s\n", squad_synth_preset_name(i), squad_synth_preset_summary(i));
    fprintf(f,
            "\n"
            "The qwen3.5-0.8b preset writes about 1.5 GB (752M bf16 parameters). Exit status: 0 written, 2 usage or write error.\n");
}

static int parse_seed(const char *text, uint64_t *out) {
    if (!text[0] || text[0] == '-') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end) return -1;
    *out = (uint64_t)v;
    return 0;
}

int cmd_synth(int argc, char **argv) {
    squad_synth_opts o;
    memset(&o, 0, sizeof o);
    const char *spec_dir = NULL;
    long spec_rank = 0; /* 0: squad_spec_synth_defaults' rank */
    o.layout = SQUAD_SYNTH_CAUSAL;
    o.dtype = ST_BF16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            synth_help(stdout);
            return 0;
        }
        static const char *const OPTIONS[] = {"--preset", "--out",   "--seed",        "--tokenizer",
                                              "--layout", "--dtype", "--specialists", "--spec-rank"};
        for (size_t k = 0; k < sizeof OPTIONS / sizeof OPTIONS[0] && a == argv[i]; k++)
            if (cli_is_option(argv[i], OPTIONS[k])) a = OPTIONS[k];
        if (a == argv[i]) {
            fprintf(stderr, "squad synth: unknown option '%s' (see squad synth --help)\n", a);
            return 2;
        }
        if (!(v = cli_option_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "--preset")) {
            o.preset = v;
        } else if (!strcmp(a, "--out")) {
            o.out_dir = v;
        } else if (!strcmp(a, "--specialists")) {
            spec_dir = v;
        } else if (!strcmp(a, "--spec-rank")) {
            char *end;
            errno = 0;
            spec_rank = strtol(v, &end, 10);
            if (errno || *end || end == v || spec_rank < 1 || spec_rank > SQUAD_LORA_MAX_RANK) {
                fprintf(stderr, "squad synth: --spec-rank wants an integer in [1, %d], got '%s'\n", SQUAD_LORA_MAX_RANK,
                        v);
                return 2;
            }
        } else if (!strcmp(a, "--tokenizer")) {
            o.tokenizer = v;
        } else if (!strcmp(a, "--seed")) {
            if (parse_seed(v, &o.seed) != 0) {
                fprintf(stderr, "squad synth: --seed wants a non-negative integer, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--layout")) {
            if (!strcmp(v, "causal")) {
                o.layout = SQUAD_SYNTH_CAUSAL;
            } else if (!strcmp(v, "conditional")) {
                o.layout = SQUAD_SYNTH_CONDITIONAL;
            } else {
                fprintf(stderr, "squad synth: --layout wants causal or conditional, got '%s'\n", v);
                return 2;
            }
        } else { /* --dtype */
            if (!strcmp(v, "bf16")) {
                o.dtype = ST_BF16;
            } else if (!strcmp(v, "f16")) {
                o.dtype = ST_F16;
            } else if (!strcmp(v, "f32")) {
                o.dtype = ST_F32;
            } else {
                fprintf(stderr, "squad synth: --dtype wants bf16, f16 or f32, got '%s'\n", v);
                return 2;
            }
        }
    }
    if (spec_rank && !spec_dir) {
        fprintf(stderr, "squad synth: --spec-rank needs --specialists SDIR\n");
        return 2;
    }
    if (!o.preset || !o.out_dir) {
        fprintf(stderr, "squad synth: --preset and --out are required\n\n");
        synth_help(stderr);
        return 2;
    }
    squad_err err = {0};
    double t0 = squad_now_seconds();
    if (squad_synth_write(&o, &err) != 0) {
        fprintf(stderr, "squad synth: %s\n", err.msg);
        return 2;
    }
    fprintf(stderr, "squad synth: wrote %s (preset %s, seed %llu) in %.1f s\n", o.out_dir, o.preset,
            (unsigned long long)o.seed, squad_now_seconds() - t0);
    if (spec_dir) { /* the adapters' shapes depend on the layers only, not on the vocabulary */
        squad_config cfg;
        squad_spec_synth_opts so;
        if (squad_synth_preset_config(o.preset, &cfg, &err) != 0) {
            fprintf(stderr, "squad synth: %s\n", err.msg);
            return 2;
        }
        squad_spec_synth_defaults(&cfg, &so);
        so.out_dir = spec_dir;
        so.seed = o.seed;
        so.layout = o.layout;
        if (spec_rank) so.rank = (int)spec_rank;
        if (squad_spec_synth_write(&cfg, &so, &err) != 0) {
            fprintf(stderr, "squad synth: %s\n", err.msg);
            return 2;
        }
        fprintf(stderr, "squad synth: wrote specialists %s (rank %d)\n", spec_dir, so.rank);
    }
    return 0;
}
