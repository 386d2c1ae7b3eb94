/*
 * serve.c — `squad serve`: the HTTP service (docs/server.md). Parses the options, builds the
 * server (src/server/server.h), listens, and waits for SIGINT / SIGTERM; then stops accepting,
 * lets in-flight requests finish (at most --timeout seconds) and exits 0.
 *
 * The signals are blocked before any thread starts, so every thread inherits the mask and the main
 * thread alone takes them, synchronously, with sigwait: no handler runs in the middle of a request.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "options.h"
#include "server/server.h"
#include "util.h"

/* Keys read from --api-key and --api-key-file, at most this many. */
#define SERVE_MAX_KEYS 64
/* Grace for in-flight requests at shutdown when --timeout is 0 (none). */
#define SERVE_SHUTDOWN_GRACE_S 30.0

static void serve_help(FILE *f) {
    fprintf(f,
            "usage: squad serve --model DIR [options]\n"
            "\n"
            "Serves squad's HTTP API (docs/server.md): POST /v1/ask, /v1/score, /v1/decisions, /v1/systemone,\n"
            "/v1/cache/clear; GET /v1/models, /health, /ready, /metrics, /v1/stats. Stops on SIGINT / SIGTERM\n"
            "after in-flight requests finish.\n"
            "\n"
            "options:\n"
            "  --model DIR              a Hugging Face Qwen3.5 model directory with its tokenizer.json\n"
            "  --host ADDR              the address to listen on (default 127.0.0.1: loopback only)\n"
            "  --port N                 the port (default %d; 0: any free port, logged)\n"
            "  --served-model-name NAME the model's name in the APIs (default: DIR's last component)\n"
            "  --api-key KEY            a Bearer key clients must send (repeatable; default: none needed)\n"
            "  --api-key-file FILE      more keys, one a line\n"
            "  --memo-mb N              the request memo's budget (default %d; 0 turns it off)\n"
            "  --token-cache-mb N       the token cache's budget (default %d; 0 turns it off)\n"
            "  --queue N                requests that may wait for the engine (default %d; more: 503)\n"
            "  --max-body BYTES         the largest request body (default %u; more: 413)\n"
            "  --max-questions N        questions in one request (default %d)\n"
            "  --timeout S              seconds a request may wait and run (default %g; then 503; 0: none)\n"
            "  --http-threads N         connection threads (default: the number of cores)\n"
            "  --max-conns-per-ip N     open connections from one client address (default %d; 0: no limit;\n"
            "                           agents behind one gateway share its address)\n"
            "  --max-inflight-body-mb N request bodies being received, all together (default 1/%d of RAM;\n"
            "                           more: 503 with Retry-After)\n"

            "  --cache-dir DIR          the disk tier: the state cache is saved to DIR at shutdown (SIGTERM,\n"
            "                           after the drain) and read back in the background at start (/ready\n"
            "                           does not wait); a file of another model, tokenizer or specialists\n"
            "                           set, or a corrupt record, is refused with a log line\n"
            "  --log-requests           a line on stderr per request\n"
            "  --tokenizer FILE         a tokenizer.json other than DIR/tokenizer.json\n"
            "  --template FILE          a template other than DIR/squad-template.json (for /v1/ask)\n"
            "  --specialists DIR        a specialists directory (docs/specialists.md): a router picks each row's\n"
            "                           adapter; requests may force one (\"specialist\": \"label\", or a decision\n"
            "                           API's model naming it); /v1/models lists each (--max-adapters applies)\n"
            "%s%s"
            "  (batching: --max-rows N rows run at once, 0 the backend's slots, 1 one at a time, and\n"
            "   --batch-tokens N tokens a step, 0 the backend's largest; the scheduler submits at most %d\n"
            "   rows more than --max-rows, docs/server.md)\n"
            "  (on the server --cache-mb defaults to auto: sized from the device memory on CUDA, the\n"
            "   engine's default on the CPU; the log says what it chose)\n",
            SQUAD_SERVE_PORT, SQUAD_SERVE_MEMO_MB, SQUAD_SERVE_TOKEN_CACHE_MB, SQUAD_SERVE_QUEUE,
            (unsigned)SQUAD_SERVE_MAX_BODY, SQUAD_SERVE_MAX_QUESTIONS, SQUAD_SERVE_TIMEOUT_S, SQUAD_SERVE_MAX_CONNS_PER_IP,
            SQUAD_SERVE_INFLIGHT_BODY_RAM_FRACTION, CLI_IMAGE_OPTIONS_HELP, CLI_ENGINE_OPTIONS_HELP,
            SQUAD_SERVE_LOOKAHEAD_ROWS);
}

static void log_line(void *ctx, const char *line) {
    (void)ctx;
    char ts[32];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    fprintf(stderr, "%s squad serve: %s\n", ts, line);
}

typedef struct serve_args {
    squad_server_opts o;
    const char *keys[SERVE_MAX_KEYS];
    char *file_keys; /* --api-key-file's text (the keys point into it) */
    int n_keys;
} serve_args;

/* Keys fail closed: an empty key would be a typo (an unset variable in `--api-key "$KEY"`) that
 * serves without auth, so it stops the start instead. */
static int add_key(serve_args *a, const char *k) {
    if (!*k) {
        fprintf(stderr, "squad serve: --api-key is empty (an unset variable?); refusing to start without the key\n");
        return -1;
    }
    if (a->n_keys == SERVE_MAX_KEYS) {
        fprintf(stderr, "squad serve: at most %d API keys\n", SERVE_MAX_KEYS);
        return -1;
    }
    a->keys[a->n_keys++] = k;
    return 0;
}

/* One key a line; blank lines and lines starting with # are skipped. A file without a key fails
 * closed, as an empty --api-key does. */
static int read_key_file(serve_args *a, const char *path) {
    squad_err err = {0};
    size_t len = 0;
    const int before = a->n_keys;
    if (a->file_keys) { /* the first file's keys point into its text: one file only */
        fprintf(stderr, "squad serve: --api-key-file is given twice; put the keys in one file\n");
        return -1;
    }
    a->file_keys = squad_read_file(path, &len, &err);
    if (!a->file_keys) {
        fprintf(stderr, "squad serve: --api-key-file: %s\n", err.msg);
        return -1;
    }
    for (char *save = NULL, *k = strtok_r(a->file_keys, "\r\n", &save); k; k = strtok_r(NULL, "\r\n", &save)) {
        while (*k == ' ' || *k == '\t') k++;
        char *e = k + strlen(k);
        while (e > k && (e[-1] == ' ' || e[-1] == '\t')) *--e = 0;
        if (*k && *k != '#' && add_key(a, k) < 0) return -1;
    }
    if (a->n_keys == before) {
        fprintf(stderr, "squad serve: --api-key-file %s has no key (empty, or only comments); refusing to start "
                "without one\n", path);
        return -1;
    }
    return 0;
}

/* 0 ok, 1 help printed, 2 usage error (reported). */
static int parse_args(int argc, char **argv, serve_args *a) {
    squad_server_opts *o = &a->o;
    /* serve's own options that take a value (--opt value or --opt=value) */
    static const char *const VALUE_OPTIONS[] = {
        "--model",     "--host",       "--served-model-name", "--tokenizer",         "--template",
        "--specialists", "--api-key",  "--api-key-file",      "--port",              "--memo-mb",
        "--token-cache-mb", "--queue", "--max-body",          "--max-questions",     "--max-conns-per-ip",
        "--max-inflight-body-mb", "--http-threads", "--timeout", "--cache-dir"};
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i], *val = NULL;
        long v;
        /* the engine's batching options, with the bounds squad score gives them (0: the backend's) */
        if (cli_is_option(s, "--max-rows") || cli_is_option(s, "--batch-tokens")) {
            const int rows = cli_is_option(s, "--max-rows");
            const char *name = rows ? "--max-rows" : "--batch-tokens";
            if (!(val = cli_option_value(argc, argv, &i))) return 2;
            if (cli_parse_int(name, val, 0, rows ? SQUAD_SERVE_MAX_ROWS : SQUAD_SERVE_MAX_BATCH_TOKENS, &v)) return 2;
            if (rows) o->engine.max_rows = (int)v;
            else o->engine.batch_tokens = (int)v;
            continue;
        }
        int r = cli_engine_option(argc, argv, &i, &o->engine);
        if (r < 0) return 2;
        if (r > 0) continue;
        if ((r = cli_image_option(argc, argv, &i, &o->max_image_pixels)) != 0) {
            if (r < 0) return 2;
            continue;
        }
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            serve_help(stdout);
            return 1;
        } else if (cli_is_option(s, "--log-requests")) {
            if (cli_flag(argv, i)) return 2;
            o->log_requests = 1;
            continue;
        }
        for (size_t k = 0; k < sizeof VALUE_OPTIONS / sizeof VALUE_OPTIONS[0] && s == argv[i]; k++)
            if (cli_is_option(argv[i], VALUE_OPTIONS[k])) s = VALUE_OPTIONS[k];
        if (s == argv[i]) {
            fprintf(stderr, "squad serve: unknown option '%s' (see squad serve --help)\n", s);
            return 2;
        }
        if (!(val = cli_option_value(argc, argv, &i))) return 2;
        if (!strcmp(s, "--model")) o->model_dir = val;
        else if (!strcmp(s, "--host")) o->host = val;
        else if (!strcmp(s, "--served-model-name")) o->served_name = val;
        else if (!strcmp(s, "--tokenizer")) o->tokenizer_path = val;
        else if (!strcmp(s, "--template")) o->template_path = val;
        else if (!strcmp(s, "--specialists")) o->specialists_dir = val;
        else if (!strcmp(s, "--cache-dir")) o->cache_dir = val;
        else if (!strcmp(s, "--api-key")) {
            if (add_key(a, val) < 0) return 2;
        } else if (!strcmp(s, "--api-key-file")) {
            if (read_key_file(a, val) < 0) return 2;
        } else if (!strcmp(s, "--port")) {
            if (cli_parse_int(s, val, 0, 65535, &v)) return 2;
            o->port = (int)v;
        } else if (!strcmp(s, "--memo-mb")) {
            if (cli_parse_int(s, val, 0, 1L << 20, &v)) return 2;
            o->memo_bytes = (size_t)v << 20;
        } else if (!strcmp(s, "--token-cache-mb")) {
            if (cli_parse_int(s, val, 0, 1L << 20, &v)) return 2;
            o->token_cache_bytes = (size_t)v << 20;
        } else if (!strcmp(s, "--queue")) {
            if (cli_parse_int(s, val, 1, 1L << 20, &v)) return 2;
            o->queue = (int)v;
        } else if (!strcmp(s, "--max-body")) {
            if (cli_parse_int(s, val, 1, 1L << 31, &v)) return 2;
            o->max_body = (size_t)v;
        } else if (!strcmp(s, "--max-questions")) {
            if (cli_parse_int(s, val, 1, SQUAD_MAX_SLOTS_PER_ROW, &v)) return 2;
            o->max_questions = (int)v;
        } else if (!strcmp(s, "--max-conns-per-ip")) {
            if (cli_parse_int(s, val, 0, 1L << 20, &v)) return 2;
            o->max_conns_per_ip = (int)v;
        } else if (!strcmp(s, "--max-inflight-body-mb")) {
            if (cli_parse_int(s, val, 1, 1L << 20, &v)) return 2;
            o->max_inflight_body = (size_t)v << 20;
        } else if (!strcmp(s, "--http-threads")) {
            if (cli_parse_int(s, val, 0, 1024, &v)) return 2;
            o->http_threads = (int)v;
        } else if (!strcmp(s, "--timeout")) {
            char *end = NULL;
            errno = 0;
            double t = strtod(val, &end);
            if (errno || end == val || *end || !(t >= 0) || t > 86400) {
                fprintf(stderr, "squad serve: --timeout must be seconds in 0..86400 (got '%s')\n", val);
                return 2;
            }
            o->timeout_s = t;
        } else {
            fprintf(stderr, "squad serve: unknown option '%s' (see squad serve --help)\n", s);
            return 2;
        }
    }
    if (!o->model_dir) {
        fprintf(stderr, "squad serve: --model DIR is required (see squad serve --help)\n");
        return 2;
    }
    o->api_keys = a->keys;
    o->n_api_keys = a->n_keys;
    return 0;
}

int cmd_serve(int argc, char **argv) {
    serve_args a;
    memset(&a, 0, sizeof a);
    squad_server_opts_default(&a.o);
    int rc = parse_args(argc, argv, &a);
    if (rc) {
        free(a.file_keys);
        return rc == 1 ? 0 : rc;
    }
    a.o.log = log_line;
    squad_err dir_err = {0};
    if (cli_check_model_dir(a.o.model_dir, &dir_err)) { /* the same words as every other command */
        fprintf(stderr, "squad serve: %s\n", dir_err.msg);
        free(a.file_keys);
        return 2;
    }
    /* Block the stop signals before any thread exists; ignore SIGPIPE (a client that hangs up). */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    squad_err err = {0};
    double t0 = squad_now_seconds();
    squad_server *srv = squad_server_new(&a.o, &err);
    if (!srv || squad_server_listen(srv, &err) < 0) {
        fprintf(stderr, "squad serve: %s\n", err.msg);
        squad_server_free(srv);
        free(a.file_keys);
        return 2;
    }
    char line[512];
    const char *host = a.o.host ? a.o.host : "127.0.0.1";
    int v6 = strchr(host, ':') != NULL; /* an IPv6 address goes in brackets in a URL */
    snprintf(line, sizeof line, "listening on http://%s%s%s:%d (model %s; %d API key%s; loaded in %.2f s; the engine "
             "starts now, GET /ready says when it is ready)", v6 ? "[" : "", host, v6 ? "]" : "", squad_server_port(srv),
             a.o.model_dir, a.n_keys, a.n_keys == 1 ? "" : "s", squad_now_seconds() - t0);
    log_line(NULL, line);
    int sig = 0;
    sigwait(&stop, &sig);
    snprintf(line, sizeof line, "%s: stopping (in-flight requests finish first)", sig == SIGINT ? "SIGINT" : "SIGTERM");
    log_line(NULL, line);
    squad_server_shutdown(srv, a.o.timeout_s > 0 ? a.o.timeout_s : SERVE_SHUTDOWN_GRACE_S);
    squad_server_free(srv);
    free(a.file_keys);
    log_line(NULL, "stopped");
    return 0;
}
