/*
 * fuzz_http.c — libFuzzer target: arbitrary HTTP requests into the server's request handling
 * (squad_server_handle: routing, methods, headers, the API key, body limits, the JSON of /v1/ask,
 * /v1/score, /v1/decisions and /v1/systemone, rendering, the scheduler and the engine, the request
 * memo), in process, without sockets.
 *
 * The input is read as a request:
 *   byte 0      the path: one of PATHS, or (when it is past the table) a path taken from the input
 *               up to the first '\n'
 *   byte 1      the method: one of METHODS
 *   then        header lines "name: value\n" up to an empty line (at most MAX_HEADERS)
 *   the rest    the body
 * so the fuzzer mutates bodies of known endpoints most of the time and everything else some of it.
 *
 * Two servers are made at the first input (see FAST_MAX_TOKENS): a tiny synthesized model carrying
 * the real Qwen3 tokenizer (the decision APIs need its label tokens) and a synthesized specialists
 * directory (routes trunk / e2e / nav: "specialist" labels and model names force them, rows run the
 * router and the adapters) in a temporary directory, with
 * an API key, a small body limit, few questions and a short timeout so that an input costs little. Every response must have
 * a status in 200..599, a content type and a NUL-terminated body of the length reported; every
 * response of an /v1/ path must be a JSON object, and every error (status >= 400) an object with
 * "error".
 */
#define _DEFAULT_SOURCE   /* usleep */
#define _XOPEN_SOURCE 700 /* nftw */
#include <ftw.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "server/server.h"
#include "specialists_synth.h"
#include "synth.h"

/* the tokenizer the other fuzz targets use (fuzz_tokenizer_path.h finds it the same way):
   $SQUAD_FUZZ_TOKENIZER, else this path from the working directory, then from this file's repository */
#define FUZZ_TOKENIZER_REL "third_party/qwen3/tokenizer.json"
#define MAX_HEADERS 8
#define MAX_LINE 512
#define FUZZ_KEY "fuzz-key"
#define FUZZ_MAX_BODY 8192
#define FUZZ_MAX_QUESTIONS 6
#define FUZZ_TIMEOUT_S 5.0
#define READY_WAIT_US 10000
/* Two servers on two copies of the model, their contexts cut short: most inputs go to the one
   whose context (FAST_MAX_TOKENS) is shorter than the chat markup of a decision or ask request, so
   those are refused as too long after parsing, validation and rendering, before the engine, and
   the fuzzer spends its time there rather than on arithmetic; one input in ENGINE_SHARE goes to the
   other (ENGINE_MAX_TOKENS), whose short requests run through the scheduler and the engine and get
   their answers rendered. */
#define FAST_MAX_TOKENS 40
#define ENGINE_MAX_TOKENS 72
#define ENGINE_SHARE 16
#define ENGINE_BITS 0x78 /* byte 1's bits 3-6 all set: one input in ENGINE_SHARE */

#define N_ROUTES 3 /* the synthesized specialists: trunk, e2e, nav */

static const char *const PATHS[] = {
    "/v1/ask", "/v1/score", "/v1/decisions", "/v1/systemone", "/v1/models", "/health", "/ready",
    "/metrics", "/v1/stats", "/v1/cache/clear", "/v1/decisions?x=1", "/",
};
#define N_PATHS (sizeof PATHS / sizeof PATHS[0])
#define N_BODY_PATHS 4 /* the first paths take bodies: they get most of the inputs */
static const char *const METHODS[] = {"POST", "GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "post"};
#define N_METHODS (sizeof METHODS / sizeof METHODS[0])

/* Rewrites max_position_embeddings in dir/config.json. */
static int set_max_position(const char *dir, int n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, JSON_PRESERVE_ORDER, &je);
    if (!cfg) return -1;
    json_t *text = json_object_get(cfg, "text_config");
    json_object_set_new(text ? text : cfg, "max_position_embeddings", json_integer(n));
    int rc = json_dump_file(cfg, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(cfg);
    return rc;
}

/* nftw's callback: removes each entry, a directory after its contents (FTW_DEPTH). */
static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static squad_server *make_server(int max_tokens) {
    squad_err err = {0};
    char dir[] = "/tmp/squad-fuzz-http-XXXXXX";
    if (!mkdtemp(dir)) abort();
    char tok_path[4096];
    const char *env = getenv("SQUAD_FUZZ_TOKENIZER");
    if (env) snprintf(tok_path, sizeof tok_path, "%s", env);
    else if (access(FUZZ_TOKENIZER_REL, R_OK) == 0) snprintf(tok_path, sizeof tok_path, "%s", FUZZ_TOKENIZER_REL);
    else {
        snprintf(tok_path, sizeof tok_path, "%s", __FILE__);
        char *cut = strstr(tok_path, "tests/fuzz/fuzz_http.c");
        if (!cut) abort();
        snprintf(cut, sizeof tok_path - (size_t)(cut - tok_path), "%s", FUZZ_TOKENIZER_REL);
    }
    squad_synth_opts so = {.preset = "tiny", .out_dir = dir, .tokenizer = tok_path};
    if (squad_synth_write(&so, &err) != 0) {
        fprintf(stderr, "fuzz_http: synth: %s\n", err.msg);
        abort();
    }
    if (set_max_position(dir, max_tokens) != 0) abort();
    char spec_dir[4200];
    snprintf(spec_dir, sizeof spec_dir, "%s/specialists", dir);
    squad_config cfg;
    squad_spec_synth_opts sso;
    if (squad_synth_preset_config(so.preset, &cfg, &err) != 0) abort();
    squad_spec_synth_defaults(&cfg, &sso);
    sso.out_dir = spec_dir;
    if (squad_spec_synth_write(&cfg, &sso, &err) != 0) {
        fprintf(stderr, "fuzz_http: specialists synth: %s\n", err.msg);
        abort();
    }
    static const char *const keys[] = {FUZZ_KEY};
    squad_server_opts o;
    squad_server_opts_default(&o);
    o.model_dir = dir;
    o.specialists_dir = spec_dir;
    o.api_keys = keys;
    o.n_api_keys = 1;
    o.max_body = FUZZ_MAX_BODY;
    o.max_questions = FUZZ_MAX_QUESTIONS;
    o.timeout_s = FUZZ_TIMEOUT_S;
    o.engine.threads = 1;
    o.memo_bytes = 4u << 20;
    o.token_cache_bytes = 4u << 20;
    squad_server *srv = squad_server_new(&o, &err);
    if (!srv) {
        fprintf(stderr, "fuzz_http: server: %s\n", err.msg);
        abort();
    }
    int ready;
    while ((ready = squad_server_ready(srv)) == 0) usleep(READY_WAIT_US);
    if (ready < 0) {
        fprintf(stderr, "fuzz_http: the engine did not start\n");
        abort();
    }
    /* loaded (the weights stay mapped): the directory can go, so no run leaves it behind */
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char f[4200];
        snprintf(f, sizeof f, "%s/%s", dir, files[i]);
        unlink(f);
    }
    /* the specialists are read whole at load (host arrays), so their directory can go too */
    if (nftw(spec_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS) != 0) abort();
    rmdir(dir);
    return srv;
}

/* Copies the next line of [*p, end) into out (without its '\n'); 0 when the input is over. */
static int next_line(const uint8_t **p, const uint8_t *end, char *out, size_t cap) {
    if (*p >= end) return 0;
    const uint8_t *nl = memchr(*p, '\n', (size_t)(end - *p));
    const uint8_t *stop = nl ? nl : end;
    size_t n = (size_t)(stop - *p);
    if (n >= cap) n = cap - 1;
    memcpy(out, *p, n);
    out[n] = 0;
    *p = nl ? nl + 1 : end;
    return 1;
}

/* Reports a broken invariant with the response, then aborts (the fuzzer keeps the input). */
static void fail(const char *why, const char *method, const char *path, int status, const char *body) {
    fprintf(stderr, "fuzz_http: %s: %s %s -> %d %s\n", why, method, path, status, body ? body : "(null)");
    abort();
}

static void check_response(const char *method, const char *path, int status, const char *body, size_t len,
                           const char *ctype) {
    if (status < 200 || status > 599 || !body || !ctype) fail("bad status or no body", method, path, status, body);
    if (strlen(body) != len) fail("a body with a NUL or a wrong length", method, path, status, body);
    if (strncmp(path, "/v1/", 4) || !strncmp(path, "/v1/cache/clear", 15) || !strcmp(method, "HEAD")) return;
    json_error_t je;
    /* integers past int64 (a byte budget of SIZE_MAX) are still JSON: read numbers as reals */
    json_t *j = json_loadb(body, len, JSON_DECODE_INT_AS_REAL, &je);
    if (!j || !json_is_object(j)) fail("not a JSON object", method, path, status, body);
    if (status >= 400 && !json_object_get(j, "error")) fail("an error without \"error\"", method, path, status, body);
    /* with specialists every answer names its route, and /v1/models lists the served name and the
       N_ROUTES routes */
    if (status == 200 && !strcmp(path, "/v1/ask") && !json_is_string(json_object_get(j, "route")))
        fail("an /v1/ask answer without its route", method, path, status, body);
    if (status == 200 && !strcmp(path, "/v1/models") && json_array_size(json_object_get(j, "data")) != 1 + N_ROUTES)
        fail("/v1/models without each route", method, path, status, body);
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static squad_server *fast, *engine; /* the harness's own state: two servers for the whole run */
    if (!fast) {
        fast = make_server(FAST_MAX_TOKENS);
        engine = make_server(ENGINE_MAX_TOKENS);
    }
    if (size < 2) return 0;
    /* bits 4-6 of byte 1 pick the server (bits 0-2 and 7 pick the method) */
    /* byte 1: bits 0-2 and 7 pick the method, bits 3-6 the server */
    squad_server *srv = (data[1] & ENGINE_BITS) == ENGINE_BITS ? engine : fast;
    const uint8_t *p = data + 2, *end = data + size;
    char path[MAX_LINE];
    /* most inputs go to the endpoints that read bodies */
    unsigned pick = data[0];
    if (pick < 160) snprintf(path, sizeof path, "%s", PATHS[pick % N_BODY_PATHS]);
    else if (pick < 240) snprintf(path, sizeof path, "%s", PATHS[pick % N_PATHS]);
    else if (!next_line(&p, end, path, sizeof path)) return 0;
    const char *method = METHODS[data[1] % N_METHODS];
    if (data[1] < 128) method = "POST"; /* mostly the method the APIs take */

    char hbuf[MAX_HEADERS][2][MAX_LINE];
    const char *headers[2 * MAX_HEADERS + 2];
    int n = 0;
    char line[MAX_LINE];
    while (n < MAX_HEADERS && next_line(&p, end, line, sizeof line) && line[0]) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        *colon = 0;
        const char *v = colon + 1;
        while (*v == ' ') v++;
        snprintf(hbuf[n][0], MAX_LINE, "%s", line);
        snprintf(hbuf[n][1], MAX_LINE, "%s", v);
        headers[2 * n] = hbuf[n][0];
        headers[2 * n + 1] = hbuf[n][1];
        n++;
    }
    /* the key, unless the input gave an Authorization header of its own */
    int has_auth = 0;
    for (int i = 0; i < n; i++)
        if (!strcasecmp(headers[2 * i], "authorization")) has_auth = 1;
    if (!has_auth) {
        headers[2 * n] = "Authorization";
        headers[2 * n + 1] = "Bearer " FUZZ_KEY;
        n++;
    }
    int status = 0;
    char *body = NULL;
    size_t len = 0;
    const char *ctype = NULL;
    if (squad_server_handle(srv, method, path, headers, n, (const char *)p, (size_t)(end - p), &status, &body, &len,
                            &ctype) != 0)
        abort();
    check_response(method, path, status, body, len, ctype);
    free(body);
    return 0;
}
