/*
 * test_decisions.c — the decision APIs (src/decisions.h) against docs/decisions-api.md:
 *
 * - Goldens: tests/fixtures/decisions/cases.json (written by tools/make_decisions_fixture.js, a
 *   second rendering of section C with Hugging Face `tokenizers` and transformers.js for the ids)
 *   gives each request's rows as exact text and Qwen3 token ids, state_len, label tokens and
 *   breakpoint positions; every row squad renders must equal them. The contract's own example
 *   renderings are also checked literally here.
 * - Responses: fabricated squad_result values in, the numbers the formulas of sections A, B and D
 *   give out (probabilities in request order, typed choices, confidence = top x label_mass,
 *   score = sum i p_i, noul folding, diagnostics, usage, the memo's usage).
 * - Errors: every 400 / 404 / 501 of section F for both schemas, each with its status and a message
 *   (and param) naming the field; error bodies.
 * - Labels: a tokenizer whose labels are not single tokens disables the API with a reason.
 * - Images: input_image parts through an image loader that decodes the data: URL or base64 as the
 *   server's does (its token count the bytes' count): the markup where the part stands, the rows'
 *   images and pos, breakpoints around an image, and every refusal (a remote URL, bad base64, a
 *   file_id, detail "low", an image in a system message, too many) naming the part; loaded images
 *   are released once, on success and on failure.
 * Uses the real Qwen3 tokenizer (third_party/qwen3/tokenizer.json); its absence is a failure.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "decisions.h"
#include "image/data_url.h"
#include "json_text.h"
#include "testutil.h"
#include "tokenizer.h"
#include "util.h"

#define QWEN_PATH "third_party/qwen3/tokenizer.json"
#define CASES_PATH "tests/fixtures/decisions/cases.json"
#define SERVED "squad-test"
#define SPECIALIST "jev-mini-2-specialist"

static squad_tokenizer *tok;
static squad_dapi_ctx *ctx;

static int parse(squad_dapi_ctx *c, squad_dapi api, const char *body, squad_dapi_req **req, squad_dapi_error *e) {
    memset(e, 0, sizeof *e);
    return squad_dapi_parse(c, api, body, strlen(body), req, e);
}

static int ids_equal(const int32_t *ids, int n, json_t *expected) {
    if (json_array_size(expected) != (size_t)n) return 0;
    for (int i = 0; i < n; i++)
        if (json_integer_value(json_array_get(expected, (size_t)i)) != ids[i]) return 0;
    return 1;
}

/* ---------------------------------------------------------------------------------------------
 * Goldens
 * ------------------------------------------------------------------------------------------- */

static void check_case(json_t *c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    squad_dapi api = strcmp(json_string_value(json_object_get(c, "api")), "decisions") ? SQUAD_DAPI_SYSTEMONE
                                                                                          : SQUAD_DAPI_DECISIONS;
    json_t *body = json_object_get(c, "body"), *rows = json_object_get(c, "rows"), *bps = json_object_get(c, "breakpoints");
    squad_dapi_req *req = NULL;
    squad_dapi_error e = {0};
    int rc = squad_dapi_parse(ctx, api, json_string_value(body), json_string_length(body), &req, &e);
    CHECKF(rc == 0, "%s: %d %s", name, e.status, e.message);
    if (rc) return;
    CHECKF(req->n_rows == (int)json_array_size(rows), "%s: %d rows", name, req->n_rows);
    CHECKF(req->state_len == json_integer_value(json_object_get(c, "state_len")), "%s: state_len %d", name,
           req->state_len);
    CHECKF(!strcmp(req->prefix_text, json_string_value(json_object_get(c, "prefix_text"))), "%s: prefix text [%s]",
           name, req->prefix_text);
    CHECKF(ids_equal(req->breakpoints, req->n_breakpoints, bps), "%s: %d breakpoints", name, req->n_breakpoints);
    for (int i = 0; i < req->n_rows && i < (int)json_array_size(rows); i++) {
        json_t *er = json_array_get(rows, (size_t)i);
        const squad_row *row = &req->rows[i];
        size_t pn = strlen(req->prefix_text);
        const char *want = json_string_value(json_object_get(er, "text"));
        CHECKF(!strncmp(want, req->prefix_text, pn) && !strcmp(want + pn, req->suffix_texts[i]),
               "%s: row %d text [%s%s]", name, i, req->prefix_text, req->suffix_texts[i]);
        CHECKF(ids_equal(row->ids, row->n_ids, json_object_get(er, "ids")), "%s: row %d ids (%d of them)", name, i,
               row->n_ids);
        CHECK(row->state_len == req->state_len && row->n_slots == 1 && row->slots[0] == row->n_ids - 1);
        CHECKF(ids_equal(row->letters, row->n_letters, json_object_get(er, "labels")), "%s: row %d labels", name, i);
        CHECK(row->nopts[0] == row->n_letters);
        /* every row starts with the same prefix */
        CHECK(!memcmp(row->ids, req->rows[0].ids, (size_t)req->state_len * sizeof(int32_t)));
    }
    CHECK(req->specialist == -1);
    squad_dapi_req_free(req);
}

static void test_goldens(void) {
    json_error_t jerr;
    json_t *root = json_load_file(CASES_PATH, 0, &jerr);
    CHECKF(root != NULL, "%s: %s", CASES_PATH, jerr.text);
    if (!root) return;
    json_t *cases = json_object_get(root, "cases");
    CHECK(json_array_size(cases) >= 10);
    for (size_t i = 0; i < json_array_size(cases); i++) check_case(json_array_get(cases, i));
    printf("goldens: %zu cases\n", json_array_size(cases));
    json_decref(root);
}

/* The contract's examples, as literal text (section C). */
static void test_contract_examples(void) {
    squad_dapi_req *req;
    squad_dapi_error e;
    const char *body = "{\"model\": \"" SERVED "\", \"input\": \"Page: Login\", \"questions\": [{\"type\": \"choice\", "
                       "\"instructions\": \"Which button submits the form?\", \"choices\": [{\"value\": \"Sign in\"}, "
                       "{\"value\": \"Forgot password?\", \"description\": \"a link\"}, {\"value\": true}]}]}";
    CHECKF(parse(ctx, SQUAD_DAPI_DECISIONS, body, &req, &e) == 0, "%s", e.message);
    if (req) {
        CHECK(!strcmp(req->prefix_text, "<|im_start|>user\nPage: Login\n\n"));
        CHECK(!strcmp(req->suffix_texts[0], "Question: Which button submits the form?\nA: \"Sign in\"\n"
                                            "B: \"Forgot password?\" - a link\nC: true\n"
                                            "Answer with the letter of one option only.<|im_end|>\n"
                                            "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        /* letters A, B, C and the slot: the final "\n\n" */
        int32_t a = squad_tokenizer_token_id(tok, "A"), nn = squad_tokenizer_token_id(tok, "ĊĊ");
        CHECK(req->rows[0].letters[0] == a && req->rows[0].letters[2] == a + 2 && req->rows[0].n_letters == 3);
        CHECK(req->rows[0].ids[req->rows[0].n_ids - 1] == nn);
        CHECK(req->model && !strcmp(req->model, SERVED));
        squad_dapi_req_free(req);
    }
    body = "{\"state\": \"s\", \"questions\": {\"q\": {\"type\": \"noul\", \"instructions\": \"Can the user sign in now?\", "
           "\"criteria\": {\"true\": \"both fields are filled\"}}}}";
    CHECKF(parse(ctx, SQUAD_DAPI_SYSTEMONE, body, &req, &e) == 0, "%s", e.message);
    if (req) {
        CHECK(!strncmp(req->suffix_texts[0],
                       "Question: Can the user sign in now?\nyes: both fields are filled\nAnswer with yes or no only.<|im_end|>",
                       strlen("Question: Can the user sign in now?\nyes: both fields are filled\nAnswer with yes or no only.<|im_end|>")));
        CHECK(req->rows[0].n_letters == 4 && req->rows[0].letters[0] == squad_tokenizer_token_id(tok, "yes") &&
              req->rows[0].letters[3] == squad_tokenizer_token_id(tok, "No"));
        CHECK(req->model && !strcmp(req->model, SERVED)); /* absent model: the served name */
        squad_dapi_req_free(req);
    }
    body = "{\"state\": \"s\", \"questions\": {\"q\": {\"type\": \"score\", \"instructions\": \"How?\", "
           "\"criteria\": [\"unclear\", \"fine\"]}}}";
    CHECKF(parse(ctx, SQUAD_DAPI_SYSTEMONE, body, &req, &e) == 0, "%s", e.message);
    if (req) {
        const char *want = "Question: How?\n0: unclear\n1: fine\nAnswer with the number of one level only.<|im_end|>";
        CHECK(!strncmp(req->suffix_texts[0], want, strlen(want)));
        CHECK(req->rows[0].letters[0] == squad_tokenizer_token_id(tok, "0") &&
              req->rows[0].letters[1] == squad_tokenizer_token_id(tok, "1"));
        squad_dapi_req_free(req);
    }
    /* a system message; models: a specialist's name forces it, jev-* leaves it to the router */
    body = "{\"model\": \"" SPECIALIST "\", \"instructions\": \"Be brief.\", \"state\": {\"a\": 1.0}, \"questions\": "
           "{\"q\": {\"type\": \"noul\"}}}";
    CHECKF(parse(ctx, SQUAD_DAPI_SYSTEMONE, body, &req, &e) == 0, "%s", e.message);
    if (req) {
        CHECK(!strcmp(req->prefix_text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{\"a\": 1.0}\n\n"));
        CHECK(!strncmp(req->suffix_texts[0], "Answer with yes or no only.<|im_end|>", 37));
        CHECK(req->specialist == 0 && !strcmp(req->model, SPECIALIST));
        squad_dapi_req_free(req);
    }
    body = "{\"model\": \"" SPECIALIST "\", \"input\": [{\"role\": \"developer\", \"content\": \"\"}, {\"role\": \"user\", "
           "\"content\": \"x\"}], \"questions\": [{\"type\": \"predicate\", \"instructions\": \"\"}]}";
    CHECKF(parse(ctx, SQUAD_DAPI_DECISIONS, body, &req, &e) == 0, "%s", e.message);
    if (req) {
        /* an empty system message is no system message */
        CHECK(!strcmp(req->prefix_text, "<|im_start|>user\nx\n\n"));
        CHECK(!strncmp(req->suffix_texts[0], "A: false\nB: true\nAnswer with the letter of one option only.<|im_end|>", 68));
        CHECK(req->specialist == 0);
        squad_dapi_req_free(req);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Responses
 * ------------------------------------------------------------------------------------------- */

static void fabricate(squad_result *r, const float *p, int n, float mass, int32_t top, int reused, int written) {
    memset(r, 0, sizeof *r);
    r->n_slots = 1;
    for (int i = 0; i < n; i++) r->probs[0][i] = p[i];
    r->has_vocab = 1;
    r->label_mass[0] = mass;
    r->top_token[0] = top;
    r->reused = reused;
    r->cache_written = written;
}

static double num(json_t *v) { return json_number_value(v); }

static json_t *path(json_t *v, const char *p) { /* "a.b.0.c" */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", p);
    for (char *s = strtok(buf, "."); s && v; s = strtok(NULL, "."))
        v = json_is_array(v) ? json_array_get(v, (size_t)atoi(s)) : json_object_get(v, s);
    return v;
}

static void test_decisions_response(void) {
    const char *body =
        "{\"model\": \"" SERVED "\", \"input\": \"Page\", \"questions\": ["
        "{\"type\": \"predicate\", \"instructions\": \"P?\", \"name\": \"p\"},"
        "{\"type\": \"choice\", \"instructions\": \"C?\", \"choices\": [{\"value\": \"x\"}, {\"value\": true}, {\"value\": \"y\"}]},"
        "{\"type\": \"score\", \"instructions\": \"S?\", \"name\": \"s\", \"levels\": [{\"label\": \"lo\"}, {\"label\": \"mid\"}, {\"label\": \"hi\"}]}]}";
    squad_dapi_req *req;
    squad_dapi_error e;
    CHECKF(parse(ctx, SQUAD_DAPI_DECISIONS, body, &req, &e) == 0, "%s", e.message);
    if (!req) return;
    squad_result res[3];
    const float pp[] = {0.2f, 0.8f}, pc[] = {0.1f, 0.7f, 0.2f}, ps[] = {0.25f, 0.25f, 0.5f};
    fabricate(&res[0], pp, 2, 0.9f, req->rows[0].letters[1], 0, 100);
    fabricate(&res[1], pc, 3, 0.5f, 12345, req->state_len, 0);
    fabricate(&res[2], ps, 3, 0.8f, req->rows[2].letters[0], req->state_len, 0);
    squad_err err = {0};
    json_t *r = squad_dapi_respond(req, res, NULL, &err);
    CHECKF(r != NULL, "%s", err.msg);
    if (r) {
        CHECK(!strcmp(json_string_value(path(r, "model")), SERVED));
        CHECK(json_array_size(path(r, "answers")) == 3);
        CHECK(!strcmp(json_string_value(path(r, "answers.0.type")), "predicate"));
        CHECK(!strcmp(json_string_value(path(r, "answers.0.name")), "p"));
        CHECK_NEAR(num(path(r, "answers.0.probability")), 0.8, 1e-7);
        CHECK(json_is_null(path(r, "answers.1.name")));
        CHECK(json_is_true(path(r, "answers.1.choice"))); /* typed as given */
        CHECK(!strcmp(json_string_value(path(r, "answers.1.probabilities.0.value")), "x"));
        CHECK(json_is_true(path(r, "answers.1.probabilities.1.value")));
        CHECK_NEAR(num(path(r, "answers.1.probabilities.0.probability")), 0.1, 1e-7);
        CHECK_NEAR(num(path(r, "answers.1.probabilities.2.probability")), 0.2, 1e-7);
        CHECK_NEAR(num(path(r, "answers.1.confidence")), 0.7 * 0.5, 1e-6);
        CHECK_NEAR(num(path(r, "answers.2.score")), 0 * 0.25 + 1 * 0.25 + 2 * 0.5, 1e-7);
        CHECK(json_integer_value(path(r, "answers.2.probabilities.2.value")) == 2);
        CHECK(!strcmp(json_string_value(path(r, "answers.2.probabilities.1.label")), "mid"));
        CHECK_NEAR(num(path(r, "answers.2.confidence")), 0.5 * 0.8, 1e-6);
        int in = req->rows[0].n_ids + req->rows[1].n_ids + req->rows[2].n_ids;
        CHECK(json_integer_value(path(r, "usage.input_tokens")) == in);
        CHECK(json_integer_value(path(r, "usage.input_tokens_details.cached_tokens")) == 2 * req->state_len);
        CHECK(json_integer_value(path(r, "usage.input_tokens_details.cache_write_tokens")) == 100);
        CHECK(json_integer_value(path(r, "usage.output_tokens")) == 3);
        CHECK(json_integer_value(path(r, "usage.output_tokens_details.reasoning_tokens")) == 0);
        CHECK(json_integer_value(path(r, "usage.total_tokens")) == in + 3);
        CHECK(json_object_size(r) == 3); /* model, answers, usage */
        /* the body serialises with short reals */
        char *t = squad_json_text(r, NULL, &err);
        CHECKF(t && strstr(t, "\"probability\": 0.8}") && strstr(t, "\"score\": 1.25"), "%s", t ? t : err.msg);
        free(t);
        json_decref(r);
    }
    /* the caller's fields (the server's memo placeholders) replace the figures, and only them */
    squad_dapi_fields f = {json_string("id-x"), json_string("created-x"), json_string("cached-x"), json_string("written-x")};
    r = squad_dapi_respond(req, res, &f, &err);
    CHECK(r && !strcmp(json_string_value(path(r, "usage.input_tokens_details.cached_tokens")), "cached-x"));
    CHECK(r && !strcmp(json_string_value(path(r, "usage.input_tokens_details.cache_write_tokens")), "written-x"));
    CHECK(r && json_integer_value(path(r, "usage.total_tokens")) ==
                   req->rows[0].n_ids + req->rows[1].n_ids + req->rows[2].n_ids + 3);
    CHECK(r && json_object_size(r) == 3 && !path(r, "id")); /* id and created are System One's */
    json_decref(r);
    json_decref(f.id);
    json_decref(f.created);
    json_decref(f.cached_tokens);
    json_decref(f.cache_write_tokens);
    /* without the vocabulary figures label_mass counts as 1 */
    res[1].has_vocab = 0;
    r = squad_dapi_respond(req, res, NULL, &err);
    CHECK(r != NULL);
    if (r) CHECK_NEAR(num(path(r, "answers.1.confidence")), 0.7, 1e-6);
    json_decref(r);
    /* a tie goes to the first option */
    const float tie[] = {0.4f, 0.4f, 0.2f};
    fabricate(&res[1], tie, 3, 1.0f, 0, 0, 0);
    r = squad_dapi_respond(req, res, NULL, &err);
    CHECK(r && !strcmp(json_string_value(path(r, "answers.1.choice")), "x"));
    json_decref(r);
    squad_dapi_req_free(req);
}

static void test_systemone_response(void) {
    const char *body = "{\"state\": \"Page\", \"questions\": {"
                       "\"ok\": {\"type\": \"noul\", \"instructions\": \"ok?\"},"
                       "\"pick\": {\"type\": \"choice\", \"criteria\": {\"left\": null, \"right\": \"go right\"}},"
                       "\"rate\": {\"type\": \"score\", \"criteria\": [\"bad\", null, \"good\"]}}}";
    squad_dapi_req *req;
    squad_dapi_error e;
    CHECKF(parse(ctx, SQUAD_DAPI_SYSTEMONE, body, &req, &e) == 0, "%s", e.message);
    if (!req) return;
    squad_result res[3];
    const float pn[] = {0.3f, 0.1f, 0.4f, 0.2f}, pc[] = {0.35f, 0.65f}, ps[] = {0.2f, 0.3f, 0.5f};
    fabricate(&res[0], pn, 4, 0.6f, req->rows[0].letters[2], 50, 50);
    fabricate(&res[1], pc, 2, 0.25f, 7, 100, 0);
    fabricate(&res[2], ps, 3, 0.9f, req->rows[2].letters[1], 100, 0);
    squad_err err = {0};
    json_t *r = squad_dapi_respond(req, res, NULL, &err);
    CHECKF(r != NULL, "%s", err.msg);
    if (r) {
        const char *id = json_string_value(path(r, "id"));
        CHECK(id && !strncmp(id, "decision-", 9) && strlen(id) > 9);
        CHECK(!strcmp(json_string_value(path(r, "object")), "structured_decision"));
        CHECK(json_integer_value(path(r, "created")) > 1700000000);
        CHECK(!strcmp(json_string_value(path(r, "model")), SERVED));
        /* answers in request order */
        const char *k = json_object_iter_key(json_object_iter(path(r, "answers")));
        CHECK(k && !strcmp(k, "ok"));
        CHECK(!strcmp(json_string_value(path(r, "answers.ok.type")), "noul"));
        CHECK_NEAR(num(path(r, "answers.ok.noul")), 0.7, 1e-6); /* yes + Yes */
        CHECK_NEAR(num(path(r, "answers.ok.probabilities.yes")), 0.7, 1e-6);
        CHECK_NEAR(num(path(r, "answers.ok.probabilities.no")), 0.3, 1e-6);
        CHECK_NEAR(num(path(r, "answers.ok.confidence")), 0.7 * 0.6, 1e-6);
        CHECK(!strcmp(json_string_value(path(r, "answers.pick.choice")), "right"));
        CHECK_NEAR(num(path(r, "answers.pick.probabilities.left")), 0.35, 1e-7);
        CHECK_NEAR(num(path(r, "answers.pick.confidence")), 0.65 * 0.25, 1e-6);
        CHECK_NEAR(num(path(r, "answers.rate.score")), 0.3 + 2 * 0.5, 1e-6);
        CHECK(!strcmp(json_string_value(path(r, "answers.rate.legend.0")), "bad"));
        CHECK(!strcmp(json_string_value(path(r, "answers.rate.legend.1")), ""));
        CHECK_NEAR(num(path(r, "answers.rate.probabilities.2")), 0.5, 1e-7);
        CHECK_NEAR(num(path(r, "answers.rate.confidence")), 0.5 * 0.9, 1e-6);
        CHECK_NEAR(num(path(r, "diagnostics.ok.label_mass")), 0.6, 1e-7);
        CHECK(json_is_true(path(r, "diagnostics.ok.argmax_is_label")));
        CHECK(json_is_false(path(r, "diagnostics.pick.argmax_is_label")));
        CHECK(json_is_true(path(r, "diagnostics.rate.argmax_is_label")));
        int in = req->rows[0].n_ids + req->rows[1].n_ids + req->rows[2].n_ids;
        CHECK(json_integer_value(path(r, "usage.input_tokens")) == in);
        CHECK(json_integer_value(path(r, "usage.output_tokens")) == 3);
        /* a second response has another id */
        json_t *r2 = squad_dapi_respond(req, res, NULL, &err);
        CHECK(r2 && strcmp(json_string_value(path(r2, "id")), id));
        json_decref(r2);
        /* the caller's id and time, when given */
        squad_dapi_fields f = {json_string("id-x"), json_integer(42), NULL, NULL};
        r2 = squad_dapi_respond(req, res, &f, &err);
        CHECK(r2 && !strcmp(json_string_value(path(r2, "id")), "id-x") && json_integer_value(path(r2, "created")) == 42);
        CHECK(r2 && json_integer_value(path(r2, "usage.input_tokens")) == in);
        json_decref(r2);
        json_decref(f.id);
        json_decref(f.created);
        json_decref(r);
    }
    res[0].n_slots = 0;
    CHECK(squad_dapi_respond(req, res, NULL, &err) == NULL && err.code == SQUAD_E_INVALID);
    squad_dapi_req_free(req);
}

/* ---------------------------------------------------------------------------------------------
 * Errors (section F)
 * ------------------------------------------------------------------------------------------- */

typedef struct error_case {
    squad_dapi api;
    const char *body;
    int status;
    const char *names; /* must appear in the message (and in param when param is expected) */
    const char *param; /* the expected param, or NULL for none */
} error_case;

#define D SQUAD_DAPI_DECISIONS
#define S SQUAD_DAPI_SYSTEMONE
#define DM "{\"model\": \"" SERVED "\", "
#define Q1 "\"questions\": [{\"type\": \"predicate\", \"instructions\": \"q\"}]"
#define SQ "\"questions\": {\"q\": {\"type\": \"noul\"}}"

static const error_case ERRORS[] = {
    /* malformed JSON, invalid UTF-8, duplicate keys */
    {D, "{\"model\": ", 400, "not valid JSON", NULL},
    {S, "{\"state\": \"a\" \"b\"}", 400, "not valid JSON", NULL},
    {D, DM "\"input\": \"bad \xff byte\", " Q1 "}", 400, "UTF-8", NULL},
    {S, "{\"state\": \"\xc3\x28\", " SQ "}", 400, "UTF-8", NULL},
    {D, DM "\"model\": \"" SERVED "\", \"input\": \"x\", " Q1 "}", 400, "duplicate", NULL},
    {S, "{\"questions\": {\"q\": {\"type\": \"noul\"}, \"q\": {\"type\": \"noul\"}}}", 400, "duplicate", NULL},
    {D, DM "\"input\": [{\"role\": \"user\", \"content\": \"a\", \"role\": \"user\"}], " Q1 "}", 400, "duplicate", NULL},
    {D, "[1, 2]", 400, "JSON object", NULL},
    {S, "\"text\"", 400, "JSON", NULL},
    /* decisions: top level */
    {D, "{\"input\": \"x\", " Q1 "}", 400, "model", "model"},
    {D, "{\"model\": 7, \"input\": \"x\", " Q1 "}", 400, "model", "model"},
    {D, "{\"model\": \"gpt-5\", \"input\": \"x\", " Q1 "}", 404, "gpt-5", "model"},
    {D, DM "\"input\": \"x\", \"temperature\": 0, " Q1 "}", 400, "temperature", "temperature"},
    {D, DM "\"input\": \"x\", \"safety_identifier\": 5, " Q1 "}", 400, "safety_identifier", "safety_identifier"},
    {D, DM "\"input\": \"x\", \"prompt_cache_key\": [], " Q1 "}", 400, "prompt_cache_key", "prompt_cache_key"},
    {D, DM "\"input\": \"x\", \"prompt_cache_options\": 1, " Q1 "}", 400, "prompt_cache_options", "prompt_cache_options"},
    {D, DM Q1 "}", 400, "input", "input"},
    {D, DM "\"input\": 3, " Q1 "}", 400, "input", "input"},
    /* input items and parts */
    {D, DM "\"input\": [\"text\"], " Q1 "}", 400, "input[0]", "input[0]"},
    {D, DM "\"input\": [{\"role\": \"assistant\", \"content\": \"hi\"}], " Q1 "}", 400, "assistant", "input[0].role"},
    {D, DM "\"input\": [{\"content\": \"hi\"}], " Q1 "}", 400, "input[0].role", "input[0].role"},
    {D, DM "\"input\": [{\"role\": \"user\", \"content\": \"a\"}, {\"type\": \"function_call\", \"call_id\": \"c\", "
           "\"name\": \"f\", \"arguments\": \"{}\"}], " Q1 "}", 400, "function_call", "input[1].type"},
    {D, DM "\"input\": [{\"type\": \"function_call_output\", \"call_id\": \"c\", \"output\": \"x\"}], " Q1 "}", 400,
     "function_call_output", "input[0].type"},
    {D, DM "\"input\": [{\"type\": \"custom_tool_call\", \"name\": \"x\"}], " Q1 "}", 400, "custom_tool_call", "input[0].type"},
    {D, DM "\"input\": [{\"role\": \"user\", \"content\": \"a\", \"id\": \"m1\"}], " Q1 "}", 400, "input[0].id", "input[0].id"},
    {D, DM "\"input\": [{\"role\": \"user\", \"content\": 5}], " Q1 "}", 400, "input[0].content", "input[0].content"},
    {D, DM "\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_image\", \"image_url\": \"u\"}]}], " Q1 "}",
     400, "input_image parts are not taken here", "input[0].content[0]"}, /* no image loader */
    {D, DM "\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_text\"}]}], " Q1 "}", 400,
     "input[0].content[0].text", "input[0].content[0].text"},
    {D, DM "\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"a\", \"x\": 1}]}], " Q1 "}",
     400, "input[0].content[0].x", "input[0].content[0].x"},
    {D, DM "\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_json\", \"data\": \"s\"}]}], " Q1 "}", 400,
     "input[0].content[0].data", "input[0].content[0].data"},
    {D, DM "\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"a\", "
           "\"prompt_cache_breakpoint\": {\"mode\": \"auto\"}}]}], " Q1 "}", 400, "prompt_cache_breakpoint",
     "input[0].content[0].prompt_cache_breakpoint"},
    {D, DM "\"input\": [{\"role\": \"user\", \"content\": [3]}], " Q1 "}", 400, "input[0].content[0]", "input[0].content[0]"},
    /* questions */
    {D, DM "\"input\": \"x\"}", 400, "questions", "questions"},
    {D, DM "\"input\": \"x\", \"questions\": {}}", 400, "questions", "questions"},
    {D, DM "\"input\": \"x\", \"questions\": []}", 400, "questions", "questions"},
    {D, DM "\"input\": \"x\", \"questions\": [5]}", 400, "questions[0]", "questions[0]"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"noul\", \"instructions\": \"q\"}]}", 400, "questions[0].type",
     "questions[0].type"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"predicate\"}]}", 400, "questions[0].instructions",
     "questions[0].instructions"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"predicate\", \"instructions\": 4}]}", 400,
     "questions[0].instructions", "questions[0].instructions"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"predicate\", \"instructions\": [{\"type\": \"input_json\", "
           "\"data\": {}}]}]}", 400, "questions[0].instructions[0].type", "questions[0].instructions[0].type"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"predicate\", \"instructions\": \"q\", \"name\": 1}]}", 400,
     "questions[0].name", "questions[0].name"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"predicate\", \"instructions\": \"q\", \"choices\": []}]}", 400,
     "questions[0].choices", "questions[0].choices"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"choice\", \"instructions\": \"q\"}]}", 400,
     "questions[0].choices", "questions[0].choices"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"choice\", \"instructions\": \"q\", \"choices\": "
           "[{\"value\": \"a\"}]}]}", 400, "questions[0].choices", "questions[0].choices"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"choice\", \"instructions\": \"q\", \"choices\": "
           "[{\"value\": \"a\"}, {\"value\": 2}]}]}", 400, "questions[0].choices[1].value", "questions[0].choices[1].value"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"choice\", \"instructions\": \"q\", \"choices\": "
           "[{\"value\": \"a\"}, {\"value\": \"a\"}]}]}", 400, "distinct", "questions[0].choices[1].value"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"choice\", \"instructions\": \"q\", \"choices\": "
           "[{\"value\": false}, {\"value\": false}]}]}", 400, "distinct", "questions[0].choices[1].value"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"choice\", \"instructions\": \"q\", \"choices\": "
           "[{\"value\": \"a\", \"description\": 1}, {\"value\": \"b\"}]}]}", 400, "questions[0].choices[0].description",
     "questions[0].choices[0].description"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"choice\", \"instructions\": \"q\", \"choices\": "
           "[{\"value\": \"a\", \"weight\": 1}, {\"value\": \"b\"}]}]}", 400, "questions[0].choices[0].weight",
     "questions[0].choices[0].weight"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"score\", \"instructions\": \"q\", \"levels\": "
           "[{\"label\": \"a\"}]}]}", 400, "questions[0].levels", "questions[0].levels"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"score\", \"instructions\": \"q\", \"levels\": "
           "[{\"label\": \"a\"}, {\"description\": \"b\"}]}]}", 400, "questions[0].levels[1].label",
     "questions[0].levels[1].label"},
    {D, DM "\"input\": \"x\", \"questions\": [{\"type\": \"score\", \"instructions\": \"q\", \"levels\": "
           "[{\"label\": \"a\"}, {\"label\": \"b\"}], \"choices\": []}]}", 400, "questions[0].choices",
     "questions[0].choices"},
    /* System One */
    {S, "{" SQ "}", 400, "state", "state"},
    {S, "{\"state\": null, " SQ "}", 400, "state", "state"},
    {S, "{\"model\": \"gpt-4o\", " SQ "}", 404, "gpt-4o", "model"},
    {S, "{\"model\": 1, " SQ "}", 400, "model", "model"},
    {S, "{\"temperature\": 1, " SQ "}", 400, "temperature", "temperature"},
    {S, "{\"instructions\": 5, " SQ "}", 400, "instructions", "instructions"},
    {S, "{\"instructions\": true, " SQ "}", 400, "instructions", "instructions"},
    {S, "{\"state\": \"x\"}", 400, "questions", "questions"},
    {S, "{\"questions\": [{\"type\": \"noul\"}]}", 400, "questions", "questions"},
    {S, "{\"questions\": {}}", 400, "questions", "questions"},
    {S, "{\"questions\": {\"q\": 1}}", 400, "questions.q", "questions.q"},
    {S, "{\"questions\": {\"q\": {\"type\": \"predicate\"}}}", 400, "questions.q.type", "questions.q.type"},
    {S, "{\"questions\": {\"q\": {}}}", 400, "questions.q.type", "questions.q.type"},
    {S, "{\"questions\": {\"q\": {\"type\": \"noul\", \"levels\": []}}}", 400, "questions.q.levels", "questions.q.levels"},
    {S, "{\"questions\": {\"q\": {\"type\": \"noul\", \"criteria\": [\"a\"]}}}", 400, "questions.q.criteria",
     "questions.q.criteria"},
    {S, "{\"questions\": {\"q\": {\"type\": \"noul\", \"criteria\": {\"maybe\": \"x\"}}}}", 400,
     "questions.q.criteria.maybe", "questions.q.criteria.maybe"},
    {S, "{\"questions\": {\"q\": {\"type\": \"noul\", \"criteria\": {\"true\": 1}}}}", 400, "questions.q.criteria.true",
     "questions.q.criteria.true"},
    {S, "{\"questions\": {\"q\": {\"type\": \"choice\"}}}", 400, "questions.q.criteria", "questions.q.criteria"},
    {S, "{\"questions\": {\"q\": {\"type\": \"choice\", \"criteria\": {}}}}", 400, "questions.q.criteria",
     "questions.q.criteria"},
    {S, "{\"questions\": {\"q\": {\"type\": \"choice\", \"criteria\": [\"a\", \"b\"]}}}", 400, "questions.q.criteria",
     "questions.q.criteria"},
    {S, "{\"questions\": {\"q\": {\"type\": \"choice\", \"criteria\": {\"a\": 1}}}}", 400, "questions.q.criteria.a",
     "questions.q.criteria.a"},
    {S, "{\"questions\": {\"q\": {\"type\": \"score\", \"criteria\": [\"only\"]}}}", 400, "questions.q.criteria",
     "questions.q.criteria"},
    {S, "{\"questions\": {\"q\": {\"type\": \"score\", \"criteria\": [\"a\", 2]}}}", 400, "questions.q.criteria[1]",
     "questions.q.criteria[1]"},
    {S, "{\"questions\": {\"q\": {\"type\": \"score\", \"criteria\": {\"a\": \"b\"}}}}", 400, "questions.q.criteria",
     "questions.q.criteria"},
};

/* Builds a body with n questions of one kind (limits: 64 questions, 26 choices, 10 levels). */
static char *many(squad_dapi api, const char *what, int n) {
    json_t *root = json_object(), *list = NULL;
    if (api == D) {
        json_object_set_new(root, "model", json_string(SERVED));
        json_object_set_new(root, "input", json_string("x"));
        list = json_array();
        if (!strcmp(what, "questions")) {
            for (int i = 0; i < n; i++) json_array_append_new(list, json_pack("{s:s, s:s}", "type", "predicate", "instructions", "q"));
            json_object_set_new(root, "questions", list);
        } else {
            json_t *q = json_pack("{s:s, s:s}", "type", !strcmp(what, "choices") ? "choice" : "score", "instructions", "q");
            for (int i = 0; i < n; i++) {
                char v[16];
                snprintf(v, sizeof v, "v%d", i);
                json_array_append_new(list, json_pack("{s:s}", !strcmp(what, "choices") ? "value" : "label", v));
            }
            json_object_set_new(q, what, list);
            json_object_set_new(root, "questions", json_pack("[o]", q));
        }
    } else {
        json_t *qs = json_object();
        if (!strcmp(what, "questions")) {
            for (int i = 0; i < n; i++) {
                char id[16];
                snprintf(id, sizeof id, "q%d", i);
                json_object_set_new(qs, id, json_pack("{s:s}", "type", "noul"));
            }
        } else if (!strcmp(what, "choices")) {
            json_t *crit = json_object();
            for (int i = 0; i < n; i++) {
                char id[16];
                snprintf(id, sizeof id, "c%d", i);
                json_object_set_new(crit, id, json_null());
            }
            json_object_set_new(qs, "q", json_pack("{s:s, s:o}", "type", "choice", "criteria", crit));
        } else {
            json_t *crit = json_array();
            for (int i = 0; i < n; i++) json_array_append_new(crit, json_string("level"));
            json_object_set_new(qs, "q", json_pack("{s:s, s:o}", "type", "score", "criteria", crit));
        }
        json_object_set_new(root, "questions", qs);
        json_object_set_new(root, "state", json_string("x"));
    }
    char *s = json_dumps(root, 0);
    json_decref(root);
    return s;
}

static void expect_error(squad_dapi_ctx *c, squad_dapi api, const char *body, int status, const char *names,
                         const char *param, const char *label) {
    squad_dapi_req *req = (squad_dapi_req *)1;
    squad_dapi_error e;
    int rc = parse(c, api, body, &req, &e);
    CHECKF(rc < 0 && req == NULL, "%s: accepted", label);
    CHECKF(e.status == status, "%s: status %d, want %d (%s)", label, e.status, status, e.message);
    CHECKF(strstr(e.message, names) != NULL, "%s: message [%s] does not name %s", label, e.message, names);
    if (param) CHECKF(!strcmp(e.param, param), "%s: param [%s], want [%s]", label, e.param, param);
    else CHECKF(e.param[0] == 0, "%s: param [%s]", label, e.param);
    CHECK(e.type[0] != 0);
    if (rc == 0) squad_dapi_req_free(req);
}

static void test_errors(void) {
    int n = (int)(sizeof ERRORS / sizeof ERRORS[0]);
    for (int i = 0; i < n; i++) {
        char label[32];
        snprintf(label, sizeof label, "error case %d", i);
        expect_error(ctx, ERRORS[i].api, ERRORS[i].body, ERRORS[i].status, ERRORS[i].names, ERRORS[i].param, label);
    }
    /* limits, and the largest sizes accepted */
    static const struct {
        const char *what;
        int max, min;
    } LIMITS[] = {{"questions", SQUAD_DAPI_MAX_QUESTIONS, 1}, {"choices", SQUAD_DAPI_MAX_CHOICES, 2},
                  {"levels", SQUAD_DAPI_MAX_LEVELS, 2}};
    for (int api = 0; api < SQUAD_DAPI_COUNT; api++)
        for (int k = 0; k < 3; k++) {
            int min = (api == S && k == 1) ? 1 : LIMITS[k].min; /* System One choice: 1..26 */
            int sizes[] = {LIMITS[k].max, LIMITS[k].max + 1, min, min - 1};
            for (int j = 0; j < 4; j++) {
                if (sizes[j] == 0 && k == 0) continue; /* zero questions: covered above */
                char *body = many((squad_dapi)api, LIMITS[k].what, sizes[j]);
                squad_dapi_req *req;
                squad_dapi_error e;
                int rc = parse(ctx, (squad_dapi)api, body, &req, &e);
                if (j == 0 || j == 2) {
                    CHECKF(rc == 0, "%s %d accepted (api %d): %s", LIMITS[k].what, sizes[j], api, e.message);
                    if (rc == 0 && k == 0) CHECK(req->n_rows == sizes[j]);
                    if (rc == 0 && k > 0) CHECK(req->rows[0].n_letters == sizes[j]);
                    squad_dapi_req_free(req);
                } else {
                    CHECKF(rc < 0 && e.status == 400 && strstr(e.param, api == D && k ? LIMITS[k].what : api == D ? "questions"
                                                                : k ? "criteria" : "questions"),
                           "%s %d refused (api %d): %d %s [%s]", LIMITS[k].what, sizes[j], api, e.status, e.message, e.param);
                }
                free(body);
            }
        }
    /* rows longer than the model supports */
    squad_err err = {0};
    squad_dapi_ctx *small = squad_dapi_ctx_new(tok, SERVED, NULL, 0, 40, &err);
    CHECK(small != NULL);
    if (small) {
        expect_error(small, D, DM "\"input\": \"short\", \"questions\": [{\"type\": \"predicate\", \"instructions\": "
                                  "\"a long question that makes the row longer than forty tokens in all, surely\"}]}",
                     400, "questions[0]", "questions[0]", "long row (decisions)");
        expect_error(small, S, "{\"state\": \"short\", \"questions\": {\"z\": {\"type\": \"score\", \"criteria\": "
                               "[\"one level text\", \"another level text\", \"a third level text\"]}}}",
                     400, "questions.z", "questions.z", "long row (System One)");
        expect_error(small, D, DM "\"input\": \"a state that by itself is far longer than the forty tokens this model "
                                  "supports, with words and more words and still more words, and then a few more words so that it is long, really "
                                  "long, longer than any row that forty tokens could hold\", " Q1 "}",
                     400, "input", "input", "long state");
        squad_dapi_req *req;
        squad_dapi_error e;
        CHECKF(parse(small, S, "{\"state\": \"s\", " SQ "}", &req, &e) == 0, "%s", e.message);
        squad_dapi_req_free(req);
        squad_dapi_ctx_free(small);
    }
}

static void test_error_body(void) {
    squad_dapi_error e;
    squad_dapi_error_set(&e, 404, "model", "the model \"%s\" does not exist", "x");
    char *s = squad_dapi_error_body(&e);
    json_t *v = s ? json_loads(s, 0, NULL) : NULL;
    CHECK(v != NULL);
    CHECK(v && !strcmp(json_string_value(path(v, "error.message")), "the model \"x\" does not exist"));
    CHECK(v && !strcmp(json_string_value(path(v, "error.type")), "not_found_error"));
    CHECK(v && !strcmp(json_string_value(path(v, "error.param")), "model"));
    CHECK(v && json_integer_value(path(v, "error.code")) == 404);
    json_decref(v);
    free(s);
    squad_dapi_error_set(&e, 400, NULL, "bad");
    s = squad_dapi_error_body(&e);
    v = s ? json_loads(s, 0, NULL) : NULL;
    CHECK(v && json_is_null(path(v, "error.param")) && json_integer_value(path(v, "error.code")) == 400);
    CHECK(v && !strcmp(json_string_value(path(v, "error.type")), "invalid_request_error"));
    json_decref(v);
    free(s);
    /* jansson quotes the text near a syntax error cut at a byte, here inside "é": the body must
     * still be valid JSON (found by the fuzzer) */
    squad_dapi_req *req;
    CHECK(parse(ctx, S, "{\"state\": \"Login\\\xc3\xa9l\"}", &req, &e) < 0 && e.status == 400);
    s = squad_dapi_error_body(&e);
    v = s ? json_loads(s, 0, NULL) : NULL;
    CHECKF(v != NULL, "error body [%s] of message [%s]", s ? s : "(null)", e.message);
    json_decref(v);
    free(s);
}

/* ---------------------------------------------------------------------------------------------
 * Labels that are not single tokens
 * ------------------------------------------------------------------------------------------- */

/* A byte-level tokenizer of the 256 byte symbols plus `merges` (pairs "a b" of symbols), with the
 * chat markup as added tokens when markup is set. */
static squad_tokenizer *tiny_tokenizer(const char *const *merges, int n_merges, int markup) {
    json_t *vocab = json_object(), *mlist = json_array(), *added = json_array();
    int id = 0;
    for (int b = 0, extra = 0; b < 256; b++) { /* GPT-2's printable map of the bytes */
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        int cp = printable ? b : 256 + extra++;
        char u[4] = {0};
        if (cp < 0x80) {
            u[0] = (char)cp;
        } else {
            u[0] = (char)(0xc0 | (cp >> 6));
            u[1] = (char)(0x80 | (cp & 63));
        }
        json_object_set_new(vocab, u, json_integer(id++));
    }
    for (int i = 0; i < n_merges; i++) {
        char a[16], b2[16];
        sscanf(merges[i], "%15s %15s", a, b2);
        char joined[32];
        snprintf(joined, sizeof joined, "%s%s", a, b2);
        json_object_set_new(vocab, joined, json_integer(id++));
        json_array_append_new(mlist, json_string(merges[i]));
    }
    if (markup) {
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id++, "content",
                                               "<|im_start|>", "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                               "special", 1));
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id++, "content",
                                               "<|im_end|>", "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                               "special", 1));
    }
    json_t *root = json_pack("{s:s, s:n, s:n, s:o, s:n, s:{s:s, s:b, s:b, s:b}, s:n, s:{s:s, s:b, s:b, s:b}, "
                             "s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
                             "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer",
                             "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0,
                             "post_processor", "decoder", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                             "use_regex", 0, "model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix",
                             "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab,
                             "merges", mlist);
    if (!root) return NULL;
    char *s = json_dumps(root, 0);
    json_decref(root);
    squad_err err = {0};
    squad_tokenizer *t = s ? squad_tokenizer_load_buffer(s, strlen(s), &err) : NULL;
    if (!t) fprintf(stderr, "tiny tokenizer: %s\n", err.msg);
    free(s);
    return t;
}

static void test_disabled(void) {
    squad_err err = {0};
    /* bytes only: letters and digits are one token each, "yes" is three: System One is off */
    squad_tokenizer *t = tiny_tokenizer(NULL, 0, 1);
    CHECK(t != NULL);
    squad_dapi_ctx *c = t ? squad_dapi_ctx_new(t, SERVED, NULL, 0, 0, &err) : NULL;
    CHECK(c != NULL);
    if (c) {
        CHECK(squad_dapi_disabled(c, D) == NULL);
        const char *why = squad_dapi_disabled(c, S);
        CHECK(why && strstr(why, "\"yes\""));
        expect_error(c, S, "{" SQ "}", 501, "\"yes\"", NULL, "System One disabled");
        squad_dapi_req *req;
        squad_dapi_error e;
        CHECKF(parse(c, D, DM "\"input\": \"x\", " Q1 "}", &req, &e) == 0, "%s", e.message);
        if (req) CHECK(req->rows[0].letters[0] == 'A' && req->rows[0].n_letters == 2);
        squad_dapi_req_free(req);
        squad_dapi_ctx_free(c);
    }
    squad_tokenizer_free(t);
    /* "\n" + "A" merged: after "\n\n" the letter is no longer a token of its own: both are off */
    static const char *const merge_nl_a[] = {"Ċ A"};
    t = tiny_tokenizer(merge_nl_a, 1, 1);
    c = t ? squad_dapi_ctx_new(t, SERVED, NULL, 0, 0, &err) : NULL;
    CHECK(c != NULL);
    if (c) {
        CHECK(squad_dapi_disabled(c, D) && strstr(squad_dapi_disabled(c, D), "\"A\""));
        CHECK(squad_dapi_disabled(c, S) != NULL);
        expect_error(c, D, DM "\"input\": \"x\", " Q1 "}", 501, "\"A\"", NULL, "decisions disabled");
        squad_dapi_ctx_free(c);
    }
    squad_tokenizer_free(t);
    /* no chat markup */
    t = tiny_tokenizer(NULL, 0, 0);
    c = t ? squad_dapi_ctx_new(t, SERVED, NULL, 0, 0, &err) : NULL;
    CHECK(c && squad_dapi_disabled(c, D) && strstr(squad_dapi_disabled(c, D), "<|im_start|>"));
    squad_dapi_ctx_free(c);
    squad_tokenizer_free(t);
    /* the real tokenizer serves both */
    CHECK(squad_dapi_disabled(ctx, D) == NULL && squad_dapi_disabled(ctx, S) == NULL);
    CHECK(squad_dapi_ctx_new(NULL, SERVED, NULL, 0, 0, &err) == NULL && err.code == SQUAD_E_INVALID);
}

/* ---------------------------------------------------------------------------------------------
 * Images
 * ------------------------------------------------------------------------------------------- */

/* The server's text rules (a data: URL or bare base64; a remote URL refused) without a model: an
 * image's token count is its byte count. Counts loads and releases. */
typedef struct byte_images {
    int loads, releases;
} byte_images;

static int bytes_load(void *c, const char *text, size_t len, squad_row_image *out, squad_err *err) {
    uint8_t *bytes = NULL;
    size_t n = 0;
    if (squad_image_text_bytes(text, len, &bytes, &n, err) < 0) return err->code;
    free(bytes);
    out->tokens = (int)n;
    out->grid[0] = 1, out->grid[1] = 2, out->grid[2] = 2 * (int)n;
    out->pos = -1;
    ((byte_images *)c)->loads++;
    return 0;
}

static void bytes_release(void *c, squad_row_image *img) {
    ((byte_images *)c)->releases++;
    img->tokens = -1;
}

static squad_idvec text_ids(const char *text) {
    squad_idvec v = {0};
    squad_err err = {0};
    if (squad_tokenize_append(tok, text, strlen(text), 0, &v, &err) < 0) fprintf(stderr, "tokenize: %s\n", err.msg);
    return v;
}

/* "<|vision_start|>" n x "<|image_pad|>" "<|vision_end|>" appended to b. */
static void image_text(squad_buf *b, int n) {
    squad_buf_puts(b, "<|vision_start|>");
    for (int i = 0; i < n; i++) squad_buf_puts(b, "<|image_pad|>");
    squad_buf_puts(b, "<|vision_end|>");
}

static int parse_img(const char *body, const squad_image_loader *l, squad_dapi_req **req, squad_dapi_error *e) {
    memset(e, 0, sizeof *e);
    return squad_dapi_parse_images(ctx, D, body, strlen(body), l, req, e);
}

static void expect_image_error(const squad_image_loader *l, const char *body, const char *names, const char *param) {
    squad_dapi_req *req = NULL;
    squad_dapi_error e;
    int rc = parse_img(body, l, &req, &e);
    CHECKF(rc < 0 && req == NULL && e.status == 400, "%s: rc %d status %d", body, rc, e.status);
    CHECKF(strstr(e.message, names) != NULL, "message [%s] does not name [%s]", e.message, names);
    CHECKF(!strcmp(e.param, param), "param [%s], want [%s] (%s)", e.param, param, e.message);
    if (rc == 0) squad_dapi_req_free(req);
}

#define PNG3 "data:image/png;base64,AAAA" /* 3 bytes: 3 tokens */
#define B64_5 "AAAAAAA=" /* bare base64, 5 bytes */

static void test_images(void) {
    byte_images f = {0, 0};
    const squad_image_loader l = {bytes_load, bytes_release, &f};
    const int32_t pad = squad_tokenizer_token_id(tok, "<|image_pad|>");
    /* text, an image, text: the markup where the part stands, parts joined by "\n" as always */
    const char *body = DM "\"input\": [{\"role\": \"developer\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": "
                          "[{\"type\": \"input_text\", \"text\": \"Page: Login\"}, {\"type\": \"input_image\", \"image_url\": "
                          "\"" PNG3 "\", \"detail\": \"auto\"}, {\"type\": \"input_text\", \"text\": \"After\"}]}, {\"role\": "
                          "\"user\", \"content\": [{\"type\": \"input_image\", \"image_url\": \"" B64_5 "\", \"detail\": "
                          "\"high\"}]}], \"questions\": [{\"type\": \"predicate\", \"instructions\": \"q1\"}, {\"type\": "
                          "\"predicate\", \"instructions\": \"q2\"}]}";
    squad_dapi_req *req = NULL;
    squad_dapi_error e;
    int rc = parse_img(body, &l, &req, &e);
    CHECKF(rc == 0, "%d %s", e.status, e.message);
    if (rc == 0) {
        squad_buf t = {0};
        squad_buf_puts(&t, "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nPage: Login\n");
        image_text(&t, 3);
        squad_buf_puts(&t, "\nAfter\n\n"); /* the second user message after the blank line that joins them */
        image_text(&t, 5);
        squad_buf_puts(&t, "\n\n");
        CHECKF(!strcmp(req->prefix_text, t.s), "prefix text [%s]", req->prefix_text);
        squad_idvec want = text_ids(t.s);
        free(t.s);
        squad_idvec head = text_ids("<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nPage: Login\n<|vision_start|>");
        CHECKF(req->state_len == (int)want.n, "state_len %d, want %zu", req->state_len, want.n);
        for (int i = 0; i < req->n_rows; i++) {
            const squad_row *row = &req->rows[i];
            CHECK(row->n_ids > (int)want.n && !memcmp(row->ids, want.v, want.n * 4));
            CHECK(row->n_images == 2 && row->images && row->images == req->rows[0].images);
            if (row->n_images != 2) continue;
            CHECK(row->images[0].pos == (int)head.n && row->images[0].tokens == 3 && row->images[1].tokens == 5);
            for (int k = 0; k < 2; k++) {
                const squad_row_image *im = &row->images[k];
                CHECK(im->pos > 0 && row->ids[im->pos - 1] == 151652 && row->ids[im->pos + im->tokens] == 151653);
                for (int j = 0; j < im->tokens; j++) CHECK(row->ids[im->pos + j] == pad);
            }
            /* the text after the state is the text-only request's */
            char suffix[256];
            snprintf(suffix, sizeof suffix, "Question: q%d\nA: false\nB: true\nAnswer with the letter of one option "
                     "only.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", i + 1);
            CHECKF(!strcmp(req->suffix_texts[i], suffix), "suffix [%s]", req->suffix_texts[i]);
        }
        squad_idvec_free(&want);
        squad_idvec_free(&head);
        squad_dapi_req_free(req);
    }
    CHECKF(f.loads == 2 && f.releases == 2, "loads %d releases %d", f.loads, f.releases);

    /* breakpoints around an image: before it a position short of the image, after it past the run */
    body = DM "\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"Before the image\", "
              "\"prompt_cache_breakpoint\": {\"mode\": \"explicit\"}}, {\"type\": \"input_image\", \"image_url\": \"" PNG3
              "\"}, {\"type\": \"input_text\", \"text\": \"after\", \"prompt_cache_breakpoint\": {\"mode\": \"explicit\"}}]}], "
              Q1 "}";
    rc = parse_img(body, &l, &req, &e);
    CHECKF(rc == 0, "%d %s", e.status, e.message);
    if (rc == 0) {
        squad_idvec before = text_ids("<|im_start|>user\nBefore the image");
        CHECKF(req->n_breakpoints == 2, "%d breakpoints", req->n_breakpoints);
        const squad_row_image *im = &req->rows[0].images[0];
        CHECKF(req->n_breakpoints == 2 && req->breakpoints[0] <= (int)before.n && req->breakpoints[0] >= (int)before.n - 1 &&
                   req->breakpoints[0] < im->pos && req->breakpoints[1] > im->pos + im->tokens,
               "breakpoints %d %d, image at %d", req->breakpoints[0], req->breakpoints[1], im->pos);
        squad_idvec_free(&before);
        squad_dapi_req_free(req);
    }

    /* refusals, each naming the part; what was loaded before is released */
    f.loads = f.releases = 0;
#define IMG_INPUT(parts) DM "\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_image\", \"image_url\": \"" \
    PNG3 "\"}, " parts "]}], " Q1 "}"
    expect_image_error(&l, IMG_INPUT("{\"type\": \"input_image\", \"image_url\": \"https://example.com/shot.png\"}"),
                       "input[0].content[1].image_url", "input[0].content[1].image_url");
    expect_image_error(&l, IMG_INPUT("{\"type\": \"input_image\", \"image_url\": \"https://example.com/shot.png\"}"),
                       "remote URLs are not fetched", "input[0].content[1].image_url");
    expect_image_error(&l, IMG_INPUT("{\"type\": \"input_image\", \"image_url\": \"data:image/png;base64,AA*A\"}"),
                       "input[0].content[1].image_url: ", "input[0].content[1].image_url");
    expect_image_error(&l, IMG_INPUT("{\"type\": \"input_image\", \"image_url\": \"AA-_\"}"), "base64",
                       "input[0].content[1].image_url");
    expect_image_error(&l, IMG_INPUT("{\"type\": \"input_image\", \"image_url\": \"data:text/plain;base64,AAAA\"}"),
                       "image", "input[0].content[1].image_url");
    CHECKF(f.loads == 5 && f.releases == 5, "loads %d releases %d", f.loads, f.releases);
    expect_image_error(&l, IMG_INPUT("{\"type\": \"input_image\", \"file_id\": \"file-123\"}"), "fetches nothing",
                       "input[0].content[1].file_id");
    expect_image_error(&l, IMG_INPUT("{\"type\": \"input_image\", \"image_url\": \"" PNG3 "\", \"detail\": \"low\"}"),
                       "not supported", "input[0].content[1].detail");
    expect_image_error(&l, IMG_INPUT("{\"type\": \"input_image\", \"image_url\": \"" PNG3 "\", \"detail\": \"max\"}"),
                       "\"auto\", \"low\" or \"high\"", "input[0].content[1].detail");
    expect_image_error(&l, IMG_INPUT("{\"type\": \"input_image\", \"image_url\": {\"url\": \"" PNG3 "\"}}"),
                       "must be a string", "input[0].content[1].image_url");
    expect_image_error(&l, IMG_INPUT("{\"type\": \"input_image\"}"), "is missing", "input[0].content[1].image_url");
    expect_image_error(&l, IMG_INPUT("{\"type\": \"input_image\", \"image_url\": \"" PNG3 "\", \"size\": 2}"),
                       "unknown field", "input[0].content[1].size");
    expect_image_error(&l, DM "\"input\": [{\"role\": \"system\", \"content\": [{\"type\": \"input_image\", \"image_url\": \""
                              PNG3 "\"}]}], " Q1 "}", "user messages", "input[0].content[0]");
    CHECKF(f.loads == f.releases, "loads %d releases %d", f.loads, f.releases);
    /* at most SQUAD_MAX_IMAGES_PER_ROW images */
    squad_buf many_imgs = {0};
    squad_buf_puts(&many_imgs, DM "\"input\": [{\"role\": \"user\", \"content\": [");
    for (int i = 0; i <= SQUAD_MAX_IMAGES_PER_ROW; i++)
        squad_buf_printf(&many_imgs, "%s{\"type\": \"input_image\", \"image_url\": \"" PNG3 "\"}", i ? ", " : "");
    squad_buf_puts(&many_imgs, "]}], " Q1 "}");
    char where[32];
    snprintf(where, sizeof where, "input[0].content[%d]", SQUAD_MAX_IMAGES_PER_ROW);
    expect_image_error(&l, many_imgs.s, "at most 16 images", where);
    free(many_imgs.s);
    CHECKF(f.loads == f.releases, "loads %d releases %d", f.loads, f.releases);
    /* a row too long with its image: refused, its image released */
    squad_err err = {0};
    squad_dapi_ctx *small = squad_dapi_ctx_new(tok, SERVED, NULL, 0, 40, &err);
    if (small) {
        const char *big = DM "\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_image\", \"image_url\": \""
                             "data:image/png;base64,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"}]}], " Q1 "}";
        f.loads = f.releases = 0;
        rc = squad_dapi_parse_images(small, D, big, strlen(big), &l, &req, &e);
        CHECKF(rc < 0 && e.status == 400 && !strcmp(e.param, "input") && f.loads == 1 && f.releases == 1, "%d %s [%s]",
               e.status, e.message, e.param);
        squad_dapi_ctx_free(small);
    }
}

int main(void) {
    squad_err err = {0};
    tok = squad_tokenizer_load(QWEN_PATH, &err);
    CHECKF(tok != NULL, "%s (run tools/fetch_test_data.sh)", err.msg);
    if (!tok) return test_summary("test_decisions");
    const char *const specialists[] = {SPECIALIST};
    ctx = squad_dapi_ctx_new(tok, SERVED, specialists, 1, 0, &err);
    CHECKF(ctx != NULL, "%s", err.msg);
    if (ctx) {
        test_goldens();
        test_contract_examples();
        test_decisions_response();
        test_systemone_response();
        test_errors();
        test_error_body();
        test_disabled();
        test_images();
        squad_dapi_ctx_free(ctx);
    }
    squad_tokenizer_free(tok);
    return test_summary("test_decisions");
}
