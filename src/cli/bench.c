/*
 * bench.c — `squad bench`: times rows on a model through the library, the way a user's rows run.
 *
 * Cases: cold rows of each --lengths value (cache off: every token computed), and hits (a state of
 * --state tokens cached once, then rows of that state plus a --suffix-token question). Each case
 * repeats --reps times; the median, min and tokens/s are printed as one JSON line per case, with
 * the process's peak RSS. Token ids are deterministic pseudo-random ids within the vocabulary.
 * With --specialists every row runs routed (or forced to --specialist LABEL): run the same cases
 * without it for the trunk alone. --wrong-guess adds hits whose guessed route the router overturns
 * (time_wrong_guess says how they are made). --batch-routes N adds N hits scored as one batch, of
 * one route and of mixed routes (time_route_batch).
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "options.h"
#include "squad.h"

#define BENCH_MAX_LENGTHS 16
#define BENCH_LETTERS 4

static void bench_help(FILE *f) {
    fprintf(f,
            "usage: squad bench --model DIR [--lengths 512,2048] [--reps N] [--state N --suffix N,...] [options]\n"
            "\n"
            "Times cold rows (cache off) of each length, and, with --state, hits: a state of N tokens\n"
            "cached once, then rows of that state plus a question of each --suffix length. Prints one JSON\n"
            "line per case: median / min milliseconds, tokens per second, peak RSS.\n"
            "\n"
            "  --model DIR        model directory\n"
            "  --lengths L,...    cold row lengths (default 512,2048)\n"
            "  --reps N           repetitions per case, after one untimed warm-up (default 3)\n"
            "  --state N          state length for the hit cases (default: none)\n"
            "  --suffix S,...     question lengths for the hit cases (default 32,128,512)\n"
            "  --specialists DIR  run every row with these specialists (the router decides)\n"
            "  --specialist LABEL with --specialists: force every row to this label\n"
            "  --wrong-guess      with --specialists (the router deciding) and --state: also time hits whose\n"
            "                     guessed route is wrong: each sample's state cached under one route, its\n"
            "                     question routed by the router to another (a second pass; the line's\n"
            "                     \"mispredicted\" counts them)\n"
            "  --batch-routes N   with --specialists and --state: also time N hits on the state scored as one\n"
            "                     batch, every row forced to the first specialist, then the rows' routes\n"
            "                     cycling over the trunk and every specialist (mixed routes in one batch)\n"
            "%s",
            CLI_ENGINE_OPTIONS_HELP);
}

static int parse_list(const char *flag, const char *s, int *out, int cap) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s ? s : "");
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        long v;
        if (n == cap || cli_parse_int(flag, tok, 1, 1 << 20, &v)) return -1;
        out[n++] = (int)v;
    }
    return n;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static long peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024;
}

static void fill_ids(int32_t *ids, int n, int vocab, unsigned seed);

/* What every case line carries besides its timings. */
typedef struct bench_ctx {
    squad_engine *e;
    const squad_specialists *sp; /* NULL: the trunk alone */
    int vocab, threads, reps;
    const char *precision;
} bench_ctx;

static uint64_t mispredictions(squad_engine *e) {
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    return st.mispredictions;
}

/* The state cache's tiers after the hit cases (docs/design.md section 7, "Tiers"): one JSON line. */
static void print_tiers(squad_engine *e) {
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    printf("{\"tiers\": {\"device_bytes\": %zu, \"device_budget_bytes\": %zu, \"checkpoints\": %" PRIu64
           ", \"host_bytes\": %zu, \"host_budget_bytes\": %zu, \"host_checkpoints\": %" PRIu64 ", \"demotions\": %" PRIu64
           ", \"promotions\": %" PRIu64 ", \"host_recomputed\": %" PRIu64 ", \"promote_ms\": %.3f, \"demote_ms\": %.3f"
           ", \"disk_loaded\": %" PRIu64 ", \"disk_refused\": %" PRIu64 "}}\n",
           st.bytes_held, st.budget_bytes, st.checkpoints - st.host_checkpoints, st.host_bytes_held,
           st.host_budget_bytes, st.host_checkpoints, st.demotions, st.promotions, st.host_recomputed,
           st.promote_seconds * 1e3, st.demote_seconds * 1e3, st.disk_loaded, st.disk_refused);
}

/* Sorts the n samples and prints the case line: median / min wall ms, tokens/s of the median, the
 * median CPU ms per thread, and with specialists the last row's route and how many of the timed
 * rows mispredicted (ran a second pass). */
static void print_case(const bench_ctx *c, const char *kind, const squad_row *row, int computed_tokens, double *ms,
                       double *cpu, int n, const squad_result *last, int mispredicted) {
    qsort(ms, (size_t)n, sizeof(double), cmp_double);
    qsort(cpu, (size_t)n, sizeof(double), cmp_double);
    const double med = ms[n / 2];
    /* process CPU time over the threads: on a shared machine wall time measures the neighbours too */
    printf("{\"case\": \"%s\", \"tokens\": %d, \"computed\": %d, \"reused\": %d, \"median_ms\": %.3f, \"min_ms\": %.3f, "
           "\"tokens_per_s\": %.1f, \"median_cpu_ms_per_thread\": %.3f, \"device\": \"%s\", \"precision\": \"%s\", "
           "\"threads\": %d, \"reps\": %d, ",
           kind, row->n_ids, last->computed, last->reused, med, ms[0], computed_tokens / (med / 1e3),
           cpu[n / 2] / c->threads, squad_engine_device(c->e), c->precision, c->threads, n);
    if (c->sp)
        printf("\"route\": \"%s\", \"mispredicted\": %d, \"timed\": %d, ", squad_specialists_label(c->sp, last->route),
               mispredicted, n);
    printf("\"peak_rss_mb\": %ld}\n", peak_rss_mb());
    fflush(stdout);
}

/* Scores row once, its wall and process CPU milliseconds into *ms and *cpu. */
static int score_timed(squad_engine *e, const squad_row *row, squad_result *res, double *ms, double *cpu) {
    squad_err err = {0};
    struct timespec a, b, ca, cb;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ca);
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (squad_engine_score(e, row, res, &err)) {
        fprintf(stderr, "squad bench: %s\n", err.msg);
        return -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cb);
    *ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6;
    *cpu = (cb.tv_sec - ca.tv_sec) * 1e3 + (cb.tv_nsec - ca.tv_nsec) * 1e-6;
    return 0;
}

/* Times one row reps times and prints the case line. With question != NULL, the question_len ids
 * there are refilled before each repetition, so every repetition is a new question (no memo hit). */
static int time_row(const bench_ctx *c, const char *kind, const squad_row *row, int computed_tokens,
                    int32_t *question, int question_len) {
    double *ms = calloc((size_t)c->reps, sizeof(double));
    double *cpu = calloc((size_t)c->reps, sizeof(double));
    squad_result *res = malloc(sizeof *res);
    int rc = ms && res && cpu ? 0 : -1;
    /* one untimed warm-up, as llama-bench does: the first pass pays the weights' page faults and
     * the threads' start, which no later row of a running engine pays */
    if (question) fill_ids(question, question_len, c->vocab, 999u);
    double w_ms, w_cpu;
    if (!rc) rc = score_timed(c->e, row, res, &w_ms, &w_cpu);
    const uint64_t miss0 = rc ? 0 : mispredictions(c->e);
    for (int r = 0; r < c->reps && !rc; r++) {
        if (question) fill_ids(question, question_len, c->vocab, 1000u + (unsigned)r);
        rc = score_timed(c->e, row, res, &ms[r], &cpu[r]);
    }
    if (!rc) print_case(c, kind, row, computed_tokens, ms, cpu, c->reps, res, (int)(mispredictions(c->e) - miss0));
    free(ms), free(res), free(cpu);
    return rc;
}

/* The route (0-based) the router gave the highest probability in res (the lowest on a tie). */
static int router_argmax(const squad_result *res) {
    int best = 0;
    for (int r = 1; r < res->n_routes; r++)
        if (res->route_probs[r] > res->route_probs[best]) best = r;
    return best;
}

/* A route other than avoid, for caching a state under it: label 1, or 2 when the router chose 1. */
static int other_route(int avoid, int n_routes) { return avoid == 1 ? (n_routes > 2 ? 2 : 0) : 1; }

/* The hit whose guessed route is wrong (docs/specialists.md, "Routing a row"). Per attempt, a new
 * state of `state` tokens is cached by a row forced to a route X (untimed), then a new question on
 * that state is scored with the router deciding (timed). Only X has checkpoints there, so X is the
 * guess; when the router picks another route Y, the first pass is dropped and the row runs again
 * under Y from Y's deepest checkpoint, which is none: the row start. X is chosen unlike the router's
 * last decision; an attempt that does not mispredict (the engine's counter says) is not a sample,
 * and another state is drawn, up to WRONG_GUESS_ATTEMPTS x reps attempts. */
#define WRONG_GUESS_ATTEMPTS 4
static int time_wrong_guess(const bench_ctx *c, int state, int suffix, const int32_t *letters) {
    const int n = state + suffix, n_routes = squad_specialists_count(c->sp);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    double *ms = calloc((size_t)c->reps, sizeof(double));
    double *cpu = calloc((size_t)c->reps, sizeof(double));
    squad_result *res = malloc(sizeof *res);
    int rc = ids && ms && cpu && res ? 0 : -1, got = 0, last_route = 1;
    int32_t slot = n - 1, nopt = BENCH_LETTERS;
    squad_row row = {ids, n, &slot, &nopt, 1, letters, BENCH_LETTERS, state, 0, NULL, 0};
    for (int a = 0; !rc && got < c->reps && a < WRONG_GUESS_ATTEMPTS * c->reps; a++) {
        const int x = other_route(last_route, n_routes);
        double t_ms, t_cpu;
        /* states never seen before, by any case of this run: a state cached under the router's
         * route by an earlier sample would make the second pass a restore */
        const unsigned seed = ((unsigned)suffix << 12) + (unsigned)a;
        fill_ids(ids, state, c->vocab, 0x40000000u + seed);
        fill_ids(ids + state, suffix, c->vocab, 0x50000000u + seed);
        row.specialist = x + 1; /* the state cached under x alone */
        if ((rc = score_timed(c->e, &row, res, &t_ms, &t_cpu))) break;
        last_route = router_argmax(res);
        if (last_route == x) continue; /* the router agrees with x on this state: draw another */
        fill_ids(ids + state, suffix, c->vocab, 0x60000000u + seed);
        row.specialist = 0;
        const uint64_t miss0 = mispredictions(c->e);
        if ((rc = score_timed(c->e, &row, res, &ms[got], &cpu[got]))) break;
        last_route = res->route;
        if (mispredictions(c->e) == miss0 + 1) got++;
    }
    if (!rc && got == 0) {
        fprintf(stderr, "squad bench: no wrong guess in %d attempts (the router gives every state route %s)\n",
                WRONG_GUESS_ATTEMPTS * c->reps, squad_specialists_label(c->sp, last_route));
        rc = -1;
    }
    if (!rc) {
        char kind[96];
        snprintf(kind, sizeof kind, "hit wrong guess state %d + question %d", state, suffix);
        print_case(c, kind, &row, suffix, ms, cpu, got, res, got);
    }
    free(ids), free(ms), free(cpu), free(res);
    return rc;
}

/* A batch of n hits on one state (--batch-routes N): the state cached under every route first
 * (untimed; a state's checkpoints belong to the route they ran with), then n rows of that state
 * and a fresh question each scored together with squad_engine_score_batch, every row forced to
 * route 1 ("one route") or row i to route i mod the routes ("mixed routes": the trunk and each
 * specialist in one batch). Wall time of the batch; questions/s of the median. */
static int time_route_batch(const bench_ctx *c, int state, int suffix, int n, int mixed, const int32_t *letters) {
    const int len = state + suffix, n_routes = squad_specialists_count(c->sp);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)len * (size_t)n);
    squad_row *rows = calloc((size_t)n, sizeof *rows);
    squad_result *res = calloc((size_t)n, sizeof *res);
    double *ms = calloc((size_t)c->reps, sizeof(double));
    int32_t slot = len - 1, nopt = BENCH_LETTERS;
    int rc = ids && rows && res && ms ? 0 : -1;
    for (int i = 0; !rc && i < n; i++) {
        int32_t *r = ids + (size_t)i * len;
        fill_ids(r, state, c->vocab, 4242);
        rows[i] = (squad_row){r, len, &slot, &nopt, 1, letters, BENCH_LETTERS, state, mixed ? i % n_routes + 1 : 2, NULL, 0};
    }
    squad_err err = {0};
    for (int rt = 0; !rc && rt < n_routes; rt++) { /* the state under each route */
        squad_row w = rows[0];
        w.specialist = rt + 1;
        fill_ids(ids + state, suffix, c->vocab, 77u + (unsigned)rt);
        if (squad_engine_score(c->e, &w, &res[0], &err)) rc = -1;
    }
    for (int rep = -1; !rc && rep < c->reps; rep++) { /* rep -1: the untimed warm-up */
        for (int i = 0; i < n; i++) {
            const unsigned seed = 0x70000000u + ((unsigned)(rep + 1) << 10) + (unsigned)i;
            fill_ids(ids + (size_t)i * len + state, suffix, c->vocab, seed);
        }
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (squad_engine_score_batch(c->e, rows, n, NULL, res, NULL, NULL, &err)) rc = -1;
        clock_gettime(CLOCK_MONOTONIC, &b);
        if (rep >= 0) ms[rep] = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6;
    }
    if (rc) fprintf(stderr, "squad bench: %s\n", err.msg[0] ? err.msg : "out of memory");
    if (!rc) {
        qsort(ms, (size_t)c->reps, sizeof(double), cmp_double);
        const double med = ms[c->reps / 2];
        int reused = 0, routes = 0;
        unsigned seen[(SQUAD_MAX_ROUTES + 31) / 32] = {0}; /* the routes the rows ran with */
        for (int i = 0; i < n; i++) {
            reused += res[i].reused >= state;
            const int rt = res[i].route;
            if (rt >= 0 && rt < SQUAD_MAX_ROUTES && !(seen[rt / 32] >> (rt % 32) & 1u)) {
                seen[rt / 32] |= 1u << (rt % 32);
                routes++;
            }
        }
        printf("{\"case\": \"batch %d hits, %s: state %d + question %d\", \"rows\": %d, \"routes\": %d, "
               "\"rows_reusing_state\": %d, \"median_ms\": %.3f, \"min_ms\": %.3f, \"questions_per_s\": %.1f, "
               "\"device\": \"%s\", \"precision\": \"%s\", \"peak_rss_mb\": %ld}\n",
               n, mixed ? "mixed routes" : "one route", state, suffix, n, routes, reused, med, ms[0], n / (med / 1e3),
               squad_engine_device(c->e), c->precision, peak_rss_mb());
        fflush(stdout);
    }
    free(ids), free(rows), free(res), free(ms);
    return rc;
}

static void fill_ids(int32_t *ids, int n, int vocab, unsigned seed) {
    unsigned long long s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        ids[i] = (int32_t)((s >> 33) % (unsigned long long)vocab);
    }
}

int cmd_bench(int argc, char **argv) {
    const char *model_dir = NULL, *spec_dir = NULL, *spec_label = NULL;
    int lengths[BENCH_MAX_LENGTHS] = {512, 2048}, n_lengths = 2;
    int suffixes[BENCH_MAX_LENGTHS] = {32, 128, 512}, n_suffixes = 3;
    long reps = 3, state = 0;
    int wrong_guess = 0;
    long batch_routes = 0;
    squad_engine_opts opts;
    squad_engine_opts_default(&opts);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_engine_option(argc, argv, &i, &opts);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            bench_help(stdout);
            return 0;
        }
        if (cli_is_option(a, "--wrong-guess")) {
            if (cli_flag(argv, i)) return 2;
            wrong_guess = 1;
            continue;
        }
        static const char *const VALUE_OPTIONS[] = {"--model", "--specialists", "--specialist", "--batch-routes",
                                                    "--lengths", "--suffix", "--reps", "--state"};
        const char *name = NULL, *val;
        for (size_t k = 0; k < sizeof VALUE_OPTIONS / sizeof VALUE_OPTIONS[0] && !name; k++)
            if (cli_is_option(a, VALUE_OPTIONS[k])) name = VALUE_OPTIONS[k];
        if (!name) {
            fprintf(stderr, "squad bench: unknown option '%s' (see squad bench --help)\n", a);
            return 2;
        }
        if (!(val = cli_option_value(argc, argv, &i))) return 2;
        if (!strcmp(name, "--model")) {
            model_dir = val;
        } else if (!strcmp(name, "--specialists")) {
            spec_dir = val;
        } else if (!strcmp(name, "--specialist")) {
            spec_label = val;
        } else if (!strcmp(name, "--batch-routes")) {
            if (cli_parse_int(name, val, 1, 256, &batch_routes)) return 2;
        } else if (!strcmp(name, "--lengths")) {
            if ((n_lengths = parse_list(name, val, lengths, BENCH_MAX_LENGTHS)) < 0) return 2;
        } else if (!strcmp(name, "--suffix")) {
            if ((n_suffixes = parse_list(name, val, suffixes, BENCH_MAX_LENGTHS)) < 0) return 2;
        } else if (!strcmp(name, "--reps")) {
            if (cli_parse_int(name, val, 1, 1000, &reps)) return 2;
        } else { /* --state */
            if (cli_parse_int(name, val, 1, 1 << 20, &state)) return 2;
        }
    }
    if (!model_dir) {
        fprintf(stderr, "squad bench: --model DIR is required (see squad bench --help)\n");
        return 2;
    }
    squad_err err = {0};
    squad_model *m = squad_model_load(model_dir, &err);
    if (!m) {
        fprintf(stderr, "squad bench: %s\n", err.msg);
        return 2;
    }
    squad_specialists *sp = NULL;
    int forced = 0; /* squad_row.specialist */
    if ((spec_label || wrong_guess) && !spec_dir) {
        fprintf(stderr, "squad bench: %s needs --specialists DIR\n", spec_label ? "--specialist" : "--wrong-guess");
        squad_model_free(m);
        return 2;
    }
    if (state > 0 && opts.cache.budget_bytes == 0) {
        fprintf(stderr, "squad bench: --state times cache hits, which --cache-mb 0 turns off\n");
        squad_model_free(m);
        return 2;
    }
    if (batch_routes && (!spec_dir || spec_label || state == 0)) {
        fprintf(stderr, "squad bench: --batch-routes needs --specialists, --state and no --specialist\n");
        squad_model_free(m);
        return 2;
    }
    if (wrong_guess && (spec_label || state == 0)) {
        fprintf(stderr, "squad bench: --wrong-guess needs --state and the router deciding (no --specialist)\n");
        squad_model_free(m);
        return 2;
    }
    if (spec_dir) {
        sp = squad_specialists_load(m, spec_dir, &err);
        forced = sp && spec_label ? squad_specialists_find(sp, spec_label) + 1 : 0;
        if (!sp || (spec_label && forced == 0)) {
            fprintf(stderr, "squad bench: %s\n", sp ? "--specialist names no label of the specialists" : err.msg);
            squad_specialists_free(sp);
            squad_model_free(m);
            return 2;
        }
        opts.specialists = sp;
    }
    int vocab = squad_model_vocab_size(m);
    int32_t letters[BENCH_LETTERS];
    for (int i = 0; i < BENCH_LETTERS; i++) letters[i] = (int32_t)(i + 1 < vocab ? i + 1 : 0);
    int rc = 0;
    /* the line says which precision ran: bf16 (the default) unless --precision exact was given */
    const char *precision = opts.precision == SQUAD_PRECISION_EXACT ? "exact" : "bf16";
    int threads = opts.threads > 0 ? opts.threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    /* cold rows: the cache off, so every repetition computes the whole row */
    squad_engine_opts cold = opts;
    cold.cache.budget_bytes = 0;
    squad_engine *e = squad_engine_new(m, &cold, &err);
    if (!e) {
        fprintf(stderr, "squad bench: %s\n", err.msg);
        squad_specialists_free(sp);
        squad_model_free(m);
        return 2;
    }
    cli_log_max_tokens("bench", e, m);
    for (int k = 0; k < n_lengths && !rc; k++) {
        int n = lengths[k];
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
        if (!ids) return 2;
        fill_ids(ids, n, vocab, (unsigned)n);
        int32_t slot = n - 1, nopt = BENCH_LETTERS;
        squad_row row = {ids, n, &slot, &nopt, 1, letters, BENCH_LETTERS, -1, forced, NULL, 0};
        const bench_ctx c = {e, sp, vocab, threads, (int)reps, precision};
        rc = time_row(&c, "cold", &row, n, NULL, 0);
        free(ids);
    }
    squad_engine_free(e);
    /* hits: the state cached by a first row, then each question length */
    if (!rc && state > 0) {
        if (batch_routes > opts.max_rows) opts.max_rows = (int)batch_routes; /* the whole batch in flight */
        e = squad_engine_new(m, &opts, &err);
        if (!e) {
            fprintf(stderr, "squad bench: %s\n", err.msg);
            squad_specialists_free(sp);
            squad_model_free(m);
            return 2;
        }
        for (int k = 0; k < n_suffixes && !rc; k++) {
            int n = (int)state + suffixes[k];
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
            if (!ids) return 2;
            fill_ids(ids, (int)state, vocab, 4242);
            int32_t slot = n - 1, nopt = BENCH_LETTERS;
            squad_row row = {ids, n, &slot, &nopt, 1, letters, BENCH_LETTERS, (int)state, forced, NULL, 0};
            squad_result *res = malloc(sizeof *res);
            /* warm the cache with a different question, then time fresh questions (no memo hits) */
            fill_ids(ids + state, suffixes[k], vocab, 99);
            if (!res || squad_engine_score(e, &row, res, &err)) {
                fprintf(stderr, "squad bench: %s\n", res ? err.msg : "out of memory");
                rc = -1;
            }
            free(res);
            char kind[64];
            snprintf(kind, sizeof kind, "hit state %ld + question %d", state, suffixes[k]);
            const bench_ctx c = {e, sp, vocab, threads, (int)reps, precision};
            if (!rc) rc = time_row(&c, kind, &row, suffixes[k], ids + state, suffixes[k]);
            free(ids);
        }
        /* with the router deciding: the same questions when the guess is wrong */
        for (int k = 0; k < n_suffixes && !rc && sp && !forced && wrong_guess; k++) {
            const bench_ctx c = {e, sp, vocab, threads, (int)reps, precision};
            rc = time_wrong_guess(&c, (int)state, suffixes[k], letters);
        }
        /* a batch of one route against a batch mixing the trunk and every specialist */
        for (int k = 0; k < n_suffixes && !rc && batch_routes; k++)
            for (int mixed = 0; mixed <= 1 && !rc; mixed++) {
                const bench_ctx c = {e, sp, vocab, threads, (int)reps, precision};
                rc = time_route_batch(&c, (int)state, suffixes[k], (int)batch_routes, mixed, letters);
            }
        if (!rc) print_tiers(e);
        squad_engine_free(e);
    }
    squad_specialists_free(sp);
    squad_model_free(m);
    return rc ? 1 : 0;
}
