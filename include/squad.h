/*
 * squad.h — the public API of libsquad.
 *
 * squad answers multiple-choice questions with a Qwen3.5-architecture model (Gated DeltaNet +
 * gated attention). The unit of work is a *row*: token ids, the positions ("slots") whose output
 * predicts an answer letter, how many options each slot has, and the letter token ids. A row may
 * name the length of its state prefix (`state_len`); the engine then keeps model states of that
 * prefix (the state cache) so a later row sharing it costs only its own suffix.
 *
 * Design: every call returns 0 on success and a negative value on failure, filling a squad_err
 * with a one-line message. The library never prints and never exits. Objects are opaque; an
 * engine is single-threaded (one caller at a time), a model may be shared by several engines.
 */
#ifndef SQUAD_H
#define SQUAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SQUAD_ERR_MSG 512

/* Error codes (squad_err.code). */
enum {
    SQUAD_OK = 0,
    SQUAD_E_INVALID = -1, /* bad input: a row, a request, an option */
    SQUAD_E_MODEL = -2,   /* a model directory that is missing, unreadable or inconsistent */
    SQUAD_E_NOMEM = -3,   /* an allocation failed */
    SQUAD_E_IO = -4,      /* a file could not be read or written */
    SQUAD_E_BACKEND = -5, /* the compute backend failed (e.g. a CUDA error) */
    SQUAD_E_UNSUPPORTED = -6
};

typedef struct squad_err {
    int code;
    char msg[SQUAD_ERR_MSG];
} squad_err;

typedef struct squad_model squad_model;
typedef struct squad_engine squad_engine;

/* The largest number of answer slots one row may have. */
#define SQUAD_MAX_SLOTS_PER_ROW 64
/* The largest number of options (letters) a slot may have. */
#define SQUAD_MAX_LETTERS 26

/* A row (DESIGN.md section 2). Arrays are borrowed from the caller for the duration of a call. */
typedef struct squad_row {
    const int32_t *ids;
    int n_ids;
    const int32_t *slots; /* sorted, unique, each in [0, n_ids) */
    const int32_t *nopts; /* per slot, 1..n_letters */
    int n_slots;
    const int32_t *letters; /* option letter token ids */
    int n_letters;
    int state_len; /* length of the shareable state prefix, or -1 when not given */
} squad_row;

/* The answer to a row. probs is [n_slots][SQUAD_MAX_LETTERS]; entries past nopts[i] are 0. */
typedef struct squad_result {
    int n_slots;
    float probs[SQUAD_MAX_SLOTS_PER_ROW][SQUAD_MAX_LETTERS];
    int reused;   /* tokens restored from the state cache */
    int computed; /* tokens run through the model for this row */
    int route;    /* specialist route index (0: the trunk) */
} squad_result;

typedef enum { SQUAD_DEVICE_AUTO = 0, SQUAD_DEVICE_CPU = 1, SQUAD_DEVICE_CUDA = 2 } squad_device;

/* State-cache policy (DESIGN.md section 3). Zero-initialise and call squad_engine_opts_default. */
typedef struct squad_cache_opts {
    size_t budget_bytes; /* 0 disables the cache */
    int align;           /* checkpoints and chunk starts at multiples of this (64) */
    int tail;            /* a checkpoint at p - tail (16) */
    int stride;          /* a checkpoint at every multiple of stride (2048) */
    int min_prefix;      /* rows with a shorter state take the plain path (256) */
    int max_slots;       /* rows with more slots take the plain path (4) */
} squad_cache_opts;

/* Arithmetic of the CPU projections. EXACT: fp32 activations times bf16 weights, equal to an fp32
 * forward up to summation order (the reference's precision). BF16: activations rounded to bf16 for
 * the bf16 dot-product instructions (the llama.cpp-style path; about 1e-3 relative error). */
typedef enum { SQUAD_PRECISION_EXACT = 0, SQUAD_PRECISION_BF16 = 1 } squad_precision;

typedef struct squad_engine_opts {
    squad_device device;
    int threads; /* CPU threads; 0: all available cores */
    squad_precision precision;
    squad_cache_opts cache;
    int precapture; /* CUDA: capture every chunk graph at start */
} squad_engine_opts;

typedef struct squad_cache_stats {
    uint64_t rows, hits, partial, cold, plain;
    uint64_t tokens_reused, tokens_computed;
    uint64_t checkpoints_made, evicted;
    uint64_t checkpoints, groups;
    size_t bytes_held, budget_bytes;
} squad_cache_stats;

void squad_engine_opts_default(squad_engine_opts *opts);

/* Loads config.json and the safetensors weights of a Hugging Face model directory. */
squad_model *squad_model_load(const char *dir, squad_err *err);
void squad_model_free(squad_model *model);
/* Model facts a caller needs to build rows. */
int squad_model_vocab_size(const squad_model *model);
int squad_model_max_tokens(const squad_model *model);

squad_engine *squad_engine_new(squad_model *model, const squad_engine_opts *opts, squad_err *err);
void squad_engine_free(squad_engine *engine);
/* "cpu" or "cuda": the backend the engine runs on. */
const char *squad_engine_device(const squad_engine *engine);

/* Validates a row against the model; 0 when it can be scored, else SQUAD_E_INVALID and why. */
int squad_row_check(const squad_model *model, const squad_row *row, squad_err *err);

/* Answers one row. On a bad row returns SQUAD_E_INVALID and the engine stays usable. */
int squad_engine_score(squad_engine *engine, const squad_row *row, squad_result *out, squad_err *err);

void squad_engine_cache_stats(const squad_engine *engine, squad_cache_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* SQUAD_H */
