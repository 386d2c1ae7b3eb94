/*
 * decisions.h — the two decision APIs the ecosystem's clients speak (docs/decisions-api.md): OpenAI's
 * `POST /v1/decisions` and System One's `POST /v1/systemone`, as request -> rows -> response.
 *
 * The HTTP server calls this module from its connection threads:
 *   1. once at start, squad_dapi_ctx_new: finds the label tokens each API needs (the one token that
 *      encoding "\n\n" + label adds after the generation prompt); an API whose labels are not
 *      distinct single tokens is disabled, and squad_dapi_disabled gives the reason (answer 501);
 *   2. per request, squad_dapi_parse: parses and validates the body (every failure is a
 *      squad_dapi_error with the HTTP status and a message naming the field) and renders one row
 *      per question (section C), all rows sharing the same state prefix of state_len tokens;
 *   3. the scheduler scores the rows with want_vocab = 1 (confidence and the diagnostics need the
 *      full-vocabulary figures); squad_dapi_respond builds the response body from the results
 *      (sections A, B, D), once; squad_json_text (json_text.h) writes it with short reals.
 *
 * Request text is always tokenised as plain text: a "<|im_end|>" in a state stays text. An
 * input_image part of a user message (/v1/decisions) is <|vision_start|>, its run of <|image_pad|>
 * ids and <|vision_end|> where the part stands in the state; its rows' images say where.
 *
 * Threads: a ctx is immutable after squad_dapi_ctx_new, and the tokenizer locks its own encoder
 * (tokenizer.h), so several connection threads may parse at once. The prefix is encoded in one call
 * per run of text between special tokens, so a tokenizer text cache recognises a state seen before.
 * squad_dapi_respond and squad_dapi_error_body touch no shared state.
 */
#ifndef SQUAD_DECISIONS_H
#define SQUAD_DECISIONS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "image/loader.h"
#include "squad.h"
#include "tokenizer.h"

typedef enum {
    SQUAD_DAPI_DECISIONS = 0, /* POST /v1/decisions (section A) */
    SQUAD_DAPI_SYSTEMONE = 1, /* POST /v1/systemone (section B) */
    SQUAD_DAPI_COUNT
} squad_dapi;

/* Limits of section A / B (a request over them is a 400 naming the field). */
#define SQUAD_DAPI_MAX_QUESTIONS 64
#define SQUAD_DAPI_MAX_CHOICES 26 /* decisions choice; System One choice criteria */
#define SQUAD_DAPI_MAX_LEVELS 10  /* score levels (both APIs) */
/* prompt_cache_breakpoint positions reported per request; later ones are ignored (a hint). */
#define SQUAD_DAPI_MAX_BREAKPOINTS 4

typedef struct squad_dapi_ctx squad_dapi_ctx;

/* An error answered to the client: HTTP status, OpenAI-style type, the offending field's path
 * ("questions[2].choices", "" when none) and a message that names it. */
typedef struct squad_dapi_error {
    int status;
    char type[48];
    char param[128];
    char message[512];
} squad_dapi_error;

/* A parsed request: its rows (one per question, in question order) and what the response needs. */
typedef struct squad_dapi_req {
    squad_dapi api;
    int n_rows;
    squad_row *rows;   /* rows[i].state_len == state_len; ids[0, state_len) equal in every row */
    int state_len;     /* the shared prefix: the system message and "<|im_start|>user\n{state}\n\n" */
    int n_breakpoints; /* decisions API: positions (token counts, ascending, <= state_len) at which */
    int breakpoints[SQUAD_DAPI_MAX_BREAKPOINTS]; /* the client asked for a cache breakpoint */
    int specialist;    /* index into the ctx's specialist_names the model field named, or -1 */
    const char *model; /* the name the response echoes */
    const char *prefix_text;         /* the rendered text of the prefix (ids[0, state_len)) */
    const char *const *suffix_texts; /* [n_rows] the rendered text of each row after the prefix */
    struct squad_dapi_store *store;  /* owned storage; private */
} squad_dapi_req;

/* Builds the context. tok is borrowed (must outlive the ctx). served_name: the name /v1/models
 * lists; specialist_names[n_specialists]: names that force a specialist (may be NULL, 0).
 * max_tokens > 0 bounds a row's length (the model's limit; longer rows are a 400), 0: no bound.
 * A label problem does not fail this call: it disables that API (squad_dapi_disabled). */
squad_dapi_ctx *squad_dapi_ctx_new(squad_tokenizer *tok, const char *served_name,
                                   const char *const *specialist_names, int n_specialists, int max_tokens,
                                   squad_err *err);
void squad_dapi_ctx_free(squad_dapi_ctx *ctx);

/* NULL when the API can be served, else why not (answer 501 with this text). */
const char *squad_dapi_disabled(const squad_dapi_ctx *ctx, squad_dapi api);

/* Parses, validates and renders a request body (len bytes). 0 and *out on success (free it with
 * squad_dapi_req_free); on failure a negative value, *out NULL and err filled: 400 (malformed
 * JSON, invalid UTF-8, duplicate keys, wrong types, missing / unknown fields, limits, a row longer
 * than max_tokens), 404 (unknown model), 501 (API disabled), 500 (out of memory). */
int squad_dapi_parse(const squad_dapi_ctx *ctx, squad_dapi api, const char *body, size_t len, squad_dapi_req **out,
                     squad_dapi_error *err);
/* The same for a request that may carry images (/v1/decisions' input_image parts, section A), each
 * loaded through images (image/loader.h; NULL: images are refused). A part the loader refuses is a
 * 400 naming the part's image_url, with the loader's message (500 when it ran out of memory). The
 * request owns the loaded images until squad_dapi_req_free. */
int squad_dapi_parse_images(const squad_dapi_ctx *ctx, squad_dapi api, const char *body, size_t len,
                            const squad_image_loader *images, squad_dapi_req **out, squad_dapi_error *err);
void squad_dapi_req_free(squad_dapi_req *req);

/* The fields of a response that are not the rows' answers, as the caller wants them written (values
 * borrowed; NULL: this call's own). The server gives its request memo's placeholders here, so that
 * one rendering serves both the client's answer and the memo's copy (server/request_memo.h). */
typedef struct squad_dapi_fields {
    json_t *id;                 /* System One's "id"; NULL: a new one (squad_dapi_new_id) */
    json_t *created;            /* System One's "created"; NULL: the time now */
    json_t *cached_tokens;      /* the decisions API's usage.input_tokens_details.cached_tokens;
                                 * NULL: the tokens the results restored */
    json_t *cache_write_tokens; /* ... .cache_write_tokens; NULL: the results' cache_written */
} squad_dapi_fields;

/* The response body for the rows' results (results[req->n_rows], each scored with want_vocab = 1;
 * without the vocabulary figures label_mass counts as 1 and argmax_is_label as true), with the
 * per-call fields of f (NULL: all this call's own). NULL on failure. */
json_t *squad_dapi_respond(const squad_dapi_req *req, const squad_result *results, const squad_dapi_fields *f,
                           squad_err *err);

/* A new response id: "decision-" and 24 hex digits from the kernel's random source (the clock when
 * that fails); cap >= 34. */
void squad_dapi_new_id(char *out, size_t cap);

/* Fills err: status, the type that status has, param (may be NULL) and the formatted message. */
void squad_dapi_error_set(squad_dapi_error *err, int status, const char *param, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* {"error": {"message", "type", "param" (null when empty), "code": status}} as JSON text (malloc'd,
 * NUL-terminated); NULL only when out of memory. */
char *squad_dapi_error_body(const squad_dapi_error *err);

#endif /* SQUAD_DECISIONS_H */
