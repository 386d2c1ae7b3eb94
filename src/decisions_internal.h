/*
 * decisions_internal.h — what the decision APIs' files share (decisions.h is the public side):
 * decisions.c (errors, the context and its labels, parsing helpers, the rows,
 * the response's frame), decisions_openai.c (POST /v1/decisions: its body and its answers) and
 * decisions_systemone.c (POST /v1/systemone: the same). The contract is docs/decisions-api.md.
 */
#ifndef SQUAD_DECISIONS_INTERNAL_H
#define SQUAD_DECISIONS_INTERNAL_H

#include <stdarg.h>
#include <stdio.h>

#include "decisions.h"
#include "image/loader.h"
#include "util.h"

/* ---- the rendering (section C) ---------------------------------------------------------------- */
#define SYSTEM_OPEN "<|im_start|>system\n"
#define SYSTEM_CLOSE "<|im_end|>\n"
#define USER_OPEN "<|im_start|>user\n"
#define STATE_END "\n\n"
#define GENERATION_PROMPT "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
/* The generation prompt's text after its last special token: what a label follows. */
#define SLOT_TAIL "\n\n"
#define MARKUP_OPEN "<|im_start|>"
#define MARKUP_CLOSE "<|im_end|>"

#define CLOSE_LETTER "Answer with the letter of one option only."
#define CLOSE_NOUL "Answer with yes or no only."
#define CLOSE_NUMBER "Answer with the number of one level only."

#define MESSAGE_JOIN "\n\n" /* between messages of one role */
#define PART_JOIN "\n"      /* between parts of one message, and of a question's instructions */

/* Field paths and short labels are cut to their buffers: a cut path still names the field. */
static inline void field_path(char *out, size_t cap, const char *fmt, ...) SQUAD_PRINTF(3, 4);
static inline void field_path(char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, cap, fmt, ap);
    va_end(ap);
}
#define FIELD(buf, ...) field_path(buf, sizeof buf, __VA_ARGS__)

/* Every row repeats the state: a bound on all rows' ids together when no max_tokens bounds them. */
#define MAX_TOTAL_IDS ((size_t)1 << 26)

#define N_NOUL 4
extern const char *const DAPI_NOUL_LABELS[N_NOUL]; /* yes no Yes No */

typedef enum { Q_PREDICATE, Q_CHOICE, Q_SCORE, Q_NOUL, Q_SO_CHOICE, Q_SO_SCORE } qkind;

struct squad_dapi_ctx {
    squad_tokenizer *tok;
    char *served;
    char **specialists;
    int n_specialists;
    int max_tokens;
    int32_t letters[SQUAD_DAPI_MAX_CHOICES]; /* A..Z */
    int32_t digits[SQUAD_DAPI_MAX_LEVELS];   /* 0..9 */
    int32_t noul[N_NOUL];                    /* yes no Yes No */
    char *disabled[SQUAD_DAPI_COUNT];
};

/* One question as parsed: what the response needs besides the probabilities. */
typedef struct dapi_question {
    qkind kind;
    const char *id; /* System One: its key */
    json_t *q;      /* the question object (borrowed from the kept tree) */
    json_t *opts;   /* decisions choices / levels; System One criteria */
    int n_opts;     /* options (noul: the four tokens) */
    int32_t labels[SQUAD_DAPI_MAX_CHOICES];
} dapi_question;

struct squad_dapi_store {
    json_t *root;
    squad_row_image *images; /* [n_images]: every row's images (they are in the state) */
    int n_images;
    squad_image_loader image_loader; /* what loaded them, to release them */
    dapi_question *qs;
    int32_t **ids;
    int32_t *slots, *nopts;
    char *prefix_text;
    char **suffix;
    char *model;
};


/* ---- parsing ---------------------------------------------------------------------------------- */

/* The parse in progress. */
typedef struct parse_state {
    const squad_dapi_ctx *ctx;
    squad_dapi_error *e;
    squad_buf sys, state; /* the system message and the state, as text */
    int have_sys;       /* decisions: a system / developer message was given */
    int have_state;     /* decisions: a user message was given */
    /* breakpoints as byte offsets into the system message or the state */
    size_t bp_off[SQUAD_DAPI_MAX_BREAKPOINTS];
    int bp_in_sys[SQUAD_DAPI_MAX_BREAKPOINTS];
    int n_bp;
    dapi_question *qs;
    int n_q;
    squad_buf *blocks; /* [n_q] */
    /* input_image parts (decisions): loaded through the caller's loader, each standing at a byte
     * offset of the state text (where its markup goes) */
    const squad_image_loader *loader;
    squad_row_image images[SQUAD_MAX_IMAGES_PER_ROW];
    size_t image_off[SQUAD_MAX_IMAGES_PER_ROW];
    int n_images;
} parse_state;

/* ---- shared helpers (decisions.c) ------------------------------------------------------------- */

/* A 400 naming param: -1 with e filled. */
int dapi_bad(squad_dapi_error *e, const char *param, const char *fmt, ...) SQUAD_PRINTF(3, 4);
/* A squad_err as the matching status: -1. */
int dapi_from_err(squad_dapi_error *e, const squad_err *err);
/* A 500, out of memory: -1. */
int dapi_oom(squad_dapi_error *e);
/* Checks that obj has only keys from the NULL-terminated list; names the first other one. */
int dapi_only_keys(parse_state *ps, json_t *obj, const char *where, const char *const *keys);
/* obj[key] with absent and null the same (NULL). */
json_t *dapi_get(json_t *obj, const char *key);
/* A string as it is, anything else as its JSON text (docs/decisions-api.md section E). */
int dapi_put_text(parse_state *ps, squad_buf *b, json_t *v);
/* An option line: "{label}: {name}" or "{label}: {name} - {description}". */
int dapi_option_line(parse_state *ps, squad_buf *b, const char *label, const char *name, size_t name_n,
                     json_t *desc);
/* Starts a block with "Question: {instructions}" when they are not empty. */
int dapi_block_start(parse_state *ps, squad_buf *b, const squad_buf *instr);
/* Ends a block with its closing line. */
int dapi_block_end(parse_state *ps, squad_buf *b, const char *closing);
/* The model a name forces: 0 and *spec (-1: the router decides), or -1 when no model has it. */
int dapi_find_model(const squad_dapi_ctx *c, const char *name, int *spec);
/* The 404 of an unknown model. */
int dapi_not_found(parse_state *ps, const char *name);

/* A probability as the float it is, written with the float's shortest digits. */
json_t *dapi_prob(double p);
/* The slot's label mass (1 without the vocabulary figures) and whether the vocabulary's argmax is
 * one of the row's labels (true without them). */
double dapi_label_mass(const squad_result *res);
int dapi_argmax_is_label(const squad_row *row, const squad_result *res);
/* json_object_set_new / json_array_append_new that remember a failure. */
void dapi_put(json_t *obj, const char *key, json_t *v, int *failed);
void dapi_push(json_t *arr, json_t *v, int *failed);
/* The question's "name", or null. */
json_t *dapi_name_of(const dapi_question *dq);
/* An integer field of the response: the caller's value when it gave one (squad_dapi_fields), else v. */
json_t *dapi_field(json_t *given, json_int_t v);

/* What the response frame computes from the rows and results. */
typedef struct dapi_totals {
    long long input;   /* the rows' tokens */
    long long cached;  /* restored from the state cache */
    long long written; /* newly made restorable */
} dapi_totals;

/* ---- each API --------------------------------------------------------------------------------- */

/* Parses a body's tree into ps (the questions' blocks, the state, the system message); *spec the
 * model's specialist. 0, or -1 with ps->e filled. */
int dapi_openai_parse(parse_state *ps, json_t *root, int *spec);
int dapi_systemone_parse(parse_state *ps, json_t *root, int *spec);
/* The response body around the rows' answers (sections A, B, D); *failed on out of memory. */
json_t *dapi_openai_body(const squad_dapi_req *r, const squad_result *results, const squad_dapi_fields *f,
                         const dapi_totals *t, int *failed);
json_t *dapi_systemone_body(const squad_dapi_req *r, const squad_result *results, const squad_dapi_fields *f,
                            const dapi_totals *t, int *failed);

#endif /* SQUAD_DECISIONS_INTERNAL_H */
