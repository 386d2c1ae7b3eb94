/*
 * fuzz_decisions.c — libFuzzer target: arbitrary bytes as a request body of the decision APIs
 * (src/decisions.h), parsed, rendered and answered.
 *
 * The first byte picks the schema (bit 0: /v1/decisions or /v1/systemone; $FUZZ_DECISIONS_API=0 or
 * 1 pins it, so each schema can be given its own count of runs) and whether a model limit applies
 * (bit 1); the rest is the body. A refused body must come back with a status of section F, a
 * message and an error body. An accepted one must give rows the engine can take (one slot, the last
 * token; labels inside the vocabulary; the same prefix in every row; breakpoints inside the
 * prefix; each image a run of its tokens' <|image_pad|> inside the state), and a response, built from results fabricated from the input's bytes, that serialises
 * and parses back as JSON. Uses the Qwen3 tokenizer ($SQUAD_FUZZ_TOKENIZER, else
 * third_party/qwen3/tokenizer.json from the working directory or this file's repository).
 * input_image parts reach squad's own image entry: the parser hands each image_url to a loader that
 * does what the server's does without a model (the data: URL or base64 to bytes, the decoders under
 * a pixel limit, the grid of the default image processor), so the decoders are fuzzed through the
 * request they arrive in.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decisions.h"
#include "fuzz_tokenizer_path.h"
#include "image/data_url.h"
#include "image/decode.h"
#include "image/loader.h"
#include "image/preprocess.h"
#include "json_text.h"
#include "tokenizer.h"

#define FUZZ_MAX_TOKENS 512
#define FUZZ_MAX_IMAGE_PIXELS (1 << 20) /* decodes stay quick; larger claims are refused by the header */

static squad_tokenizer *tok; /* the harness's own state, loaded once */
static squad_dapi_ctx *ctx[2];
static int pinned_api = -1;
static int32_t image_pad_id = -1;

/* The server's loader without a model: text -> bytes -> pixels -> the default processor's grid. */
static int fuzz_image_load(void *ctx, const char *text, size_t len, squad_row_image *out, squad_err *err) {
    (void)ctx;
    uint8_t *bytes = NULL;
    size_t n = 0;
    int rc = squad_image_text_bytes(text, len, &bytes, &n, err);
    if (rc) return rc;
    squad_image *img = calloc(1, sizeof *img);
    if (!img) {
        free(bytes);
        err->code = SQUAD_E_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return SQUAD_E_NOMEM;
    }
    rc = squad_image_decode(bytes, n, FUZZ_MAX_IMAGE_PIXELS, img, err);
    free(bytes);
    squad_image_proc_config c;
    squad_image_proc_config_default(&c);
    if (!rc) rc = squad_image_grid(&c, img->width, img->height, out->grid, err);
    if (rc) {
        squad_image_free(img);
        free(img);
        return rc;
    }
    out->tokens = out->grid[0] * out->grid[1] * out->grid[2] / (c.merge_size * c.merge_size);
    out->image = img;
    return 0;
}

static void fuzz_image_release(void *ctx, squad_row_image *image) {
    (void)ctx;
    squad_image *img = (squad_image *)image->image;
    if (img) squad_image_free(img);
    free(img);
    image->image = NULL;
}

static const squad_image_loader fuzz_loader = {fuzz_image_load, fuzz_image_release, NULL};

static void load_once(void) {
    if (tok) return;
    squad_err err = {0};
    tok = fuzz_load_tokenizer(&err);
    const char *const specialists[] = {"special-one", "jev-special"};
    if (tok) ctx[0] = squad_dapi_ctx_new(tok, "squad-test", specialists, 2, 0, &err);
    if (ctx[0]) ctx[1] = squad_dapi_ctx_new(tok, "squad-test", specialists, 2, FUZZ_MAX_TOKENS, &err);
    if (!ctx[1]) {
        fprintf(stderr, "fuzz_decisions: %s (set SQUAD_FUZZ_TOKENIZER)\n", err.msg);
        abort();
    }
    image_pad_id = squad_tokenizer_token_id(tok, SQUAD_IMAGE_PAD_TOKEN);
    const char *pin = getenv("FUZZ_DECISIONS_API");
    if (pin) pinned_api = atoi(pin) ? 1 : 0;
}

/* Results from the input's bytes: probabilities that sum to 1, a label mass, a top token. */
static void fabricate(const squad_dapi_req *req, squad_result *res, const uint8_t *data, size_t size) {
    for (int i = 0; i < req->n_rows; i++) {
        squad_result *r = &res[i];
        memset(r, 0, sizeof *r);
        r->n_slots = 1;
        float sum = 0;
        for (int k = 0; k < req->rows[i].n_letters; k++) {
            uint8_t b = size ? data[(size_t)(i * 7 + k) % size] : 1;
            r->probs[0][k] = (float)(b + 1);
            sum += r->probs[0][k];
        }
        for (int k = 0; k < req->rows[i].n_letters; k++) r->probs[0][k] /= sum;
        r->has_vocab = size % 3 != 0;
        r->label_mass[0] = size ? (float)data[(size_t)i % size] / 255.0f : 1.0f;
        r->top_token[0] = size % 2 ? req->rows[i].letters[0] : 7;
        r->reused = req->state_len;
        r->cache_written = i == 0 ? req->state_len : 0;
    }
}

static void check_rows(const squad_dapi_req *req, int limited) {
    int vocab = squad_tokenizer_vocab_size(tok);
    if (req->n_rows < 1 || req->n_rows > SQUAD_DAPI_MAX_QUESTIONS || req->state_len < 1) __builtin_trap();
    if (!req->model || !req->prefix_text || !req->suffix_texts) __builtin_trap();
    for (int k = 0; k < req->n_breakpoints; k++)
        if (req->breakpoints[k] < 1 || req->breakpoints[k] > req->state_len ||
            (k && req->breakpoints[k] <= req->breakpoints[k - 1]))
            __builtin_trap();
    for (int i = 0; i < req->n_rows; i++) {
        const squad_row *row = &req->rows[i];
        if (row->state_len != req->state_len || row->n_ids <= row->state_len) __builtin_trap();
        if (limited && row->n_ids > FUZZ_MAX_TOKENS) __builtin_trap();
        if (row->n_slots != 1 || row->slots[0] != row->n_ids - 1) __builtin_trap();
        if (row->n_letters < 1 || row->n_letters > SQUAD_MAX_LETTERS || row->nopts[0] != row->n_letters)
            __builtin_trap();
        if (memcmp(row->ids, req->rows[0].ids, (size_t)req->state_len * sizeof(int32_t))) __builtin_trap();
        for (int k = 0; k < row->n_letters; k++)
            if (row->letters[k] < 0 || row->letters[k] >= vocab) __builtin_trap();
        for (int k = 0; k < row->n_ids; k++)
            if (row->ids[k] < 0 || row->ids[k] >= vocab) __builtin_trap();
        if (!req->suffix_texts[i]) __builtin_trap();
        for (int k = 0; k < row->n_images; k++) {
            const squad_row_image *im = &row->images[k];
            if (im->tokens < 1 || im->pos < 0 || im->pos + im->tokens > row->state_len) __builtin_trap();
            for (int t = 0; t < im->tokens; t++)
                if (row->ids[im->pos + t] != image_pad_id) __builtin_trap();
        }
    }
}

static void check_response(const squad_dapi_req *req, const uint8_t *data, size_t size) {
    squad_result *res = calloc((size_t)req->n_rows, sizeof *res);
    if (!res) return;
    fabricate(req, res, data, size);
    /* the call's own fields, then placeholders for them (as the server's request memo gives) */
    squad_dapi_fields ph = {json_string("hole-id"), json_string("hole-created"), json_string("hole-cached"),
                            json_string("hole-written")};
    for (int memo = 0; memo < 2; memo++) {
        squad_err err = {0};
        json_t *body = squad_dapi_respond(req, res, memo ? &ph : NULL, &err);
        if (!body) __builtin_trap();
        size_t len;
        char *text = squad_json_text(body, &len, &err);
        if (!text) __builtin_trap();
        json_t *back = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
        if (!back || !json_equal(back, body)) __builtin_trap();
        json_t *answers = json_object_get(back, "answers");
        if (json_array_size(answers) + json_object_size(answers) != (size_t)req->n_rows) __builtin_trap();
        json_decref(back);
        free(text);
        json_decref(body);
    }
    json_decref(ph.id);
    json_decref(ph.created);
    json_decref(ph.cached_tokens);
    json_decref(ph.cache_write_tokens);
    free(res);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_once();
    if (size < 1) return 0;
    squad_dapi api = (squad_dapi)(pinned_api >= 0 ? pinned_api : (data[0] & 1));
    int limited = (data[0] >> 1) & 1;
    squad_dapi_req *req = NULL;
    squad_dapi_error e;
    memset(&e, 0, sizeof e);
    if (squad_dapi_parse_images(ctx[limited], api, (const char *)data + 1, size - 1, &fuzz_loader, &req, &e) != 0) {
        if (req || !e.message[0] || !e.type[0] || (e.status != 400 && e.status != 404)) __builtin_trap();
        char *body = squad_dapi_error_body(&e);
        if (!body) __builtin_trap();
        free(body);
        return 0;
    }
    check_rows(req, limited);
    check_response(req, data, size);
    squad_dapi_req_free(req);
    return 0;
}
