/*
 * bench.c — `squad bench`: times rows on a model through the library, the way a user's rows run.
 *
 * Cases: cold rows of each --lengths value (cache off: every token computed), and hits (a state of
 * --state tokens cached once, then rows of that state plus a --suffix-token question). Each case
 * repeats --reps times; the median, min and tokens/s are printed as one JSON line per case, with
 * the process's peak RSS. Token ids are deterministic pseudo-random ids within the vocabulary.
 * With --specialists every row runs routed (or forced to --specialist LABEL): run the same cases
 * without it for the trunk alone.
 */
#define _POSIX_C_SOURCE 200809L
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

/* Times one row reps times and prints the case line. With question != NULL, the question_len ids
 * there are refilled before each repetition, so every repetition is a new question (no memo hit). */
static int time_row(squad_engine *e, const char *kind, const squad_row *row, int computed_tokens, int reps,
                    int32_t *question, int question_len, int vocab, int threads, const char *precision) {
    double *ms = calloc((size_t)reps, sizeof(double));
    double *cpu = calloc((size_t)reps, sizeof(double));
    squad_result *res = malloc(sizeof *res);
    if (!ms || !res || !cpu) {
        free(ms), free(res), free(cpu);
        return -1;
    }
    squad_err err = {0};
    int reused = 0, computed = 0;
    /* one untimed warm-up, as llama-bench does: the first pass pays the weights' page faults and
     * the threads' start, which no later row of a running engine pays */
    if (question) fill_ids(question, question_len, vocab, 999u);
    if (squad_engine_score(e, row, res, &err)) {
        fprintf(stderr, "squad bench: %s\n", err.msg);
        free(ms), free(res), free(cpu);
        return -1;
    }
    for (int r = 0; r < reps; r++) {
        if (question) fill_ids(question, question_len, vocab, 1000u + (unsigned)r);
        struct timespec a, b, ca, cb;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ca);
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (squad_engine_score(e, row, res, &err)) {
            fprintf(stderr, "squad bench: %s\n", err.msg);
            free(ms), free(res), free(cpu);
            return -1;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cb);
        ms[r] = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6;
        cpu[r] = (cb.tv_sec - ca.tv_sec) * 1e3 + (cb.tv_nsec - ca.tv_nsec) * 1e-6;
        reused = res->reused, computed = res->computed;
    }
    qsort(ms, (size_t)reps, sizeof(double), cmp_double);
    qsort(cpu, (size_t)reps, sizeof(double), cmp_double);
    double med = ms[reps / 2];
    /* process CPU time over the threads: on a shared machine wall time measures the neighbours too */
    printf("{\"case\": \"%s\", \"tokens\": %d, \"computed\": %d, \"reused\": %d, \"median_ms\": %.3f, \"min_ms\": %.3f, "
           "\"tokens_per_s\": %.1f, \"median_cpu_ms_per_thread\": %.3f, \"device\": \"%s\", \"precision\": \"%s\", \"peak_rss_mb\": %ld}\n",
           kind, row->n_ids, computed, reused, med, ms[0], computed_tokens / (med / 1e3), cpu[reps / 2] / threads,
           squad_engine_device(e), precision, peak_rss_mb());
    fflush(stdout);
    free(ms), free(res), free(cpu);
    return 0;
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
    squad_engine_opts opts;
    squad_engine_opts_default(&opts);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int r = cli_engine_option(argc, argv, &i, &opts);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            bench_help(stdout);
            return 0;
        } else if (!strcmp(a, "--model") && val) {
            model_dir = argv[++i];
        } else if (!strcmp(a, "--specialists") && val) {
            spec_dir = argv[++i];
        } else if (!strcmp(a, "--specialist") && val) {
            spec_label = argv[++i];
        } else if (!strcmp(a, "--lengths") && val) {
            if ((n_lengths = parse_list(a, argv[++i], lengths, BENCH_MAX_LENGTHS)) < 0) return 2;
        } else if (!strcmp(a, "--suffix") && val) {
            if ((n_suffixes = parse_list(a, argv[++i], suffixes, BENCH_MAX_LENGTHS)) < 0) return 2;
        } else if (!strcmp(a, "--reps")) {
            if (cli_parse_int(a, argv[++i], 1, 1000, &reps)) return 2;
        } else if (!strcmp(a, "--state")) {
            if (cli_parse_int(a, argv[++i], 1, 1 << 20, &state)) return 2;
        } else {
            fprintf(stderr, "squad bench: unknown or incomplete option '%s'\n", a);
            return 2;
        }
    }
    if (!model_dir) {
        fprintf(stderr, "squad bench: --model DIR is required\n");
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
    if (spec_label && !spec_dir) {
        fprintf(stderr, "squad bench: --specialist needs --specialists DIR\n");
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
        squad_row row = {ids, n, &slot, &nopt, 1, letters, BENCH_LETTERS, -1, forced};
        rc = time_row(e, "cold", &row, n, (int)reps, NULL, 0, vocab, threads, precision);
        free(ids);
    }
    squad_engine_free(e);
    /* hits: the state cached by a first row, then each question length */
    if (!rc && state > 0) {
        if (opts.cache.budget_bytes == 0) opts.cache.budget_bytes = (size_t)1024 << 20;
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
            squad_row row = {ids, n, &slot, &nopt, 1, letters, BENCH_LETTERS, (int)state, forced};
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
            if (!rc) rc = time_row(e, kind, &row, suffixes[k], (int)reps, ids + state, suffixes[k], vocab, threads,
                                    precision);
            free(ids);
        }
        squad_engine_free(e);
    }
    squad_specialists_free(sp);
    squad_model_free(m);
    return rc ? 1 : 0;
}
