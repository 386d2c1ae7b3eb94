/*
 * bench_cache.c — the state cache on a workload trace (bench/agent_trace.py): the same rows with
 * the cache and without it, through the library on one engine each.
 *
 * Usage: bench_cache --model DIR --rows FILE [--cache-mb X] [--stride N] [--tail N] [--align N]
 *                    [--min-prefix N] [--max-slots N] [--threads N] [--device cpu|cuda]
 *                    [--clock wall|cpu] [--no-baseline] [--label TEXT]
 *
 * --clock cpu times rows by the process's CPU time (exact with --threads 1 on a machine shared
 * with other work, where wall time measures the neighbours); wall (the default) by the clock.
 *
 * Reports (a readable block, then one JSON line):
 *  - token hit rate: tokens restored / tokens in all rows;
 *  - reuse against the oracle: the oracle of a row is the longest prefix it shares with any earlier
 *    row; "state oracle" caps it at the row's state_len (a state cache never reuses a question),
 *    "full oracle" does not;
 *  - rows per second, p50 / p99 row latency, with and without the cache;
 *  - the peak bytes the cache held (after any row) and its budget;
 *  - whether a hit row's cost scales with its suffix, not its state: the rows restored at their
 *    state's end in thirds by state length, their cached and uncached latency side by side;
 *  - the time a cached row spends outside the backend's forward (the cache's own work);
 *  - the largest difference between the cached and the uncached answers.
 * The exact-request memo is part of the engine; a trace without repeated rows never reaches it.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "forward_timer.h"
#include "rows.h"
#include "squad.h"
#include "util.h"

#define LINE_MAX_BYTES (64 << 20)

typedef struct trace {
    squad_row_buf *rows;
    int n, cap;
} trace;

typedef struct run_result {
    double *latency; /* seconds per row */
    squad_result *answers;
    int *reused, *computed;
    double seconds;
    double forward_seconds; /* inside the backend's forward */
    size_t peak_bytes;
    squad_cache_stats stats;
} run_result;

typedef struct bench_args {
    const char *model, *rows, *label;
    squad_engine_opts opts;
    int baseline;
    int cpu_clock;
} bench_args;

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail_usage(const char *msg) {
    fprintf(stderr, "bench_cache: %s\n(usage at the top of bench/bench_cache.c)\n", msg);
    return 2;
}

static int parse_args(int argc, char **argv, bench_args *a) {
    memset(a, 0, sizeof *a);
    squad_engine_opts_default(&a->opts);
    a->opts.device = SQUAD_DEVICE_CPU;
    a->baseline = 1;
    a->label = "";
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(k, "--no-baseline")) {
            a->baseline = 0;
            takes = 0;
        } else if (!v) {
            return fail_usage("an option lacks its value");
        } else if (!strcmp(k, "--model")) {
            a->model = v;
        } else if (!strcmp(k, "--rows")) {
            a->rows = v;
        } else if (!strcmp(k, "--label")) {
            a->label = v;
        } else if (!strcmp(k, "--cache-mb")) {
            a->opts.cache.budget_bytes = (size_t)(atof(v) * 1048576.0);
        } else if (!strcmp(k, "--stride")) {
            a->opts.cache.stride = atoi(v);
        } else if (!strcmp(k, "--tail")) {
            a->opts.cache.tail = atoi(v);
        } else if (!strcmp(k, "--align")) {
            a->opts.cache.align = atoi(v);
        } else if (!strcmp(k, "--min-prefix")) {
            a->opts.cache.min_prefix = atoi(v);
        } else if (!strcmp(k, "--max-slots")) {
            a->opts.cache.max_slots = atoi(v);
        } else if (!strcmp(k, "--threads")) {
            a->opts.threads = atoi(v);
        } else if (!strcmp(k, "--clock")) {
            if (strcmp(v, "cpu") && strcmp(v, "wall")) return fail_usage("--clock is cpu or wall");
            a->cpu_clock = !strcmp(v, "cpu");
        } else if (!strcmp(k, "--device")) {
            a->opts.device = !strcmp(v, "cuda") ? SQUAD_DEVICE_CUDA : SQUAD_DEVICE_CPU;
        } else {
            return fail_usage("unknown option");
        }
        i += takes;
    }
    if (!a->model || !a->rows) return fail_usage("--model and --rows are required");
    if (a->opts.cache.budget_bytes == 0) return fail_usage("--cache-mb must be positive");
    return 0;
}

static int read_trace(const char *path, trace *t, squad_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return squad_fail(err, SQUAD_E_IO, "cannot open %s", path);
    char *line = malloc(LINE_MAX_BYTES);
    if (!line) {
        fclose(f);
        return squad_fail(err, SQUAD_E_NOMEM, "out of memory");
    }
    int rc = 0;
    while (fgets(line, LINE_MAX_BYTES, f)) {
        size_t len = strlen(line);
        if (len <= 1) continue;
        if (t->n == t->cap) {
            int cap = t->cap ? 2 * t->cap : 256;
            squad_row_buf *nr = realloc(t->rows, (size_t)cap * sizeof *nr);
            if (!nr) {
                rc = squad_fail(err, SQUAD_E_NOMEM, "out of memory");
                break;
            }
            t->rows = nr;
            t->cap = cap;
        }
        rc = squad_row_parse_json(&t->rows[t->n], line, len, NULL, 0, err);
        if (rc) {
            squad_fail_context(err, "%s line %d: ", path, t->n + 1);
            break;
        }
        t->n++;
    }
    free(line);
    fclose(f);
    return rc;
}

/* The longest prefix each row shares with any earlier row (a scan: fine for a benchmark). */
static void oracle(const trace *t, int *lcp) {
    for (int i = 0; i < t->n; i++) {
        const squad_row *r = &t->rows[i].row;
        int best = 0;
        for (int j = 0; j < i; j++) {
            const squad_row *q = &t->rows[j].row;
            int m = r->n_ids < q->n_ids ? r->n_ids : q->n_ids, k = 0;
            while (k < m && r->ids[k] == q->ids[k]) k++;
            if (k > best) best = k;
        }
        lcp[i] = best;
    }
}

static int run_rows(squad_model *model, const squad_engine_opts *opts, double (*now)(void), const trace *t,
                    run_result *out, squad_err *err) {
    squad_engine *e = squad_engine_new(model, opts, err);
    if (!e) return err->code;
    if (forward_timer_wrap(e->be, now)) {
        squad_engine_free(e);
        return squad_fail(err, SQUAD_E_INVALID, "the engines' backends differ: their forward cannot be timed");
    }
    forward_timer.seconds = 0;
    out->latency = calloc((size_t)t->n, sizeof *out->latency);
    out->answers = calloc((size_t)t->n, sizeof *out->answers);
    out->reused = calloc((size_t)t->n, sizeof *out->reused);
    out->computed = calloc((size_t)t->n, sizeof *out->computed);
    if (!out->latency || !out->answers || !out->reused || !out->computed) {
        squad_engine_free(e);
        return squad_fail(err, SQUAD_E_NOMEM, "out of memory");
    }
    double t0 = now();
    for (int i = 0; i < t->n; i++) {
        double s = now();
        int rc = squad_engine_score(e, &t->rows[i].row, &out->answers[i], err);
        out->latency[i] = now() - s;
        if (rc) {
            squad_fail_context(err, "row %d: ", i);
            squad_engine_free(e);
            return rc;
        }
        out->reused[i] = out->answers[i].reused;
        out->computed[i] = out->answers[i].computed;
        squad_cache_stats st;
        squad_engine_cache_stats(e, &st);
        if (st.bytes_held > out->peak_bytes) out->peak_bytes = st.bytes_held;
    }
    out->seconds = now() - t0;
    out->forward_seconds = forward_timer.seconds;
    squad_engine_cache_stats(e, &out->stats);
    squad_engine_free(e);
    return 0;
}

static void run_free(run_result *r) {
    free(r->latency);
    free(r->answers);
    free(r->reused);
    free(r->computed);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(const double *v, int n, double q) {
    double *s = malloc((size_t)n * sizeof *s);
    if (!s || n == 0) {
        free(s);
        return 0;
    }
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    int i = (int)ceil(q * n) - 1;
    double x = s[i < 0 ? 0 : i];
    free(s);
    return x;
}

/* Hit rows: restored at their state's end, sorted by state length and cut into thirds. Per third:
 * the mean state and computed tokens, the mean latency with the cache and (same rows) without it,
 * and the cached microseconds per computed token. When a hit's cost follows its suffix, the cached
 * latency stays flat while the state grows (attention over the cached K / V adds a little per
 * state token), and the uncached one grows with the state. */
#define HIT_PARTS 3

typedef struct hit_part {
    int n;
    double state, computed, cached_ms, uncached_ms, us_per_computed;
} hit_part;

typedef struct hit_row {
    double state, computed, cached_s, uncached_s;
} hit_row;

static int cmp_hit_state(const void *a, const void *b) {
    const hit_row *x = a, *y = b;
    return (x->state > y->state) - (x->state < y->state);
}

/* Fills parts[HIT_PARTS]; returns the number of hit rows. */
static int hit_rows(const trace *t, const run_result *r, const run_result *plain, int align, hit_part *parts) {
    memset(parts, 0, HIT_PARTS * sizeof *parts);
    hit_row *h = malloc((size_t)t->n * sizeof *h);
    if (!h) return 0;
    int n = 0;
    for (int i = 0; i < t->n; i++) {
        const squad_row *row = &t->rows[i].row;
        int p = row->state_len - row->state_len % align;
        if (r->reused[i] == 0 || r->reused[i] != p || r->computed[i] == 0) continue;
        h[n++] = (hit_row){(double)row->state_len, (double)r->computed[i], r->latency[i],
                           plain ? plain->latency[i] : 0};
    }
    qsort(h, (size_t)n, sizeof *h, cmp_hit_state);
    for (int k = 0; k < HIT_PARTS && n >= HIT_PARTS; k++) {
        hit_part *q = &parts[k];
        for (int i = k * n / HIT_PARTS; i < (k + 1) * n / HIT_PARTS; i++) {
            q->state += h[i].state;
            q->computed += h[i].computed;
            q->cached_ms += 1e3 * h[i].cached_s;
            q->uncached_ms += 1e3 * h[i].uncached_s;
            q->n++;
        }
        q->us_per_computed = q->computed > 0 ? 1e3 * q->cached_ms / q->computed : 0;
        q->state /= q->n;
        q->computed /= q->n;
        q->cached_ms /= q->n;
        q->uncached_ms /= q->n;
    }
    free(h);
    return n;
}

static double max_diff(const trace *t, const run_result *a, const run_result *b) {
    double m = 0;
    for (int i = 0; i < t->n; i++) {
        const squad_row *row = &t->rows[i].row;
        for (int s = 0; s < row->n_slots; s++)
            for (int l = 0; l < row->nopts[s]; l++) {
                double d = fabs((double)a->answers[i].probs[s][l] - (double)b->answers[i].probs[s][l]);
                if (d > m) m = d;
            }
    }
    return m;
}

int main(int argc, char **argv) {
    bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc;
    squad_err err = {0};
    trace t = {0};
    if (read_trace(a.rows, &t, &err)) {
        fprintf(stderr, "bench_cache: %s\n", err.msg);
        return 2;
    }
    squad_model *model = squad_model_load(a.model, &err);
    if (!model) {
        fprintf(stderr, "bench_cache: %s\n", err.msg);
        return 2;
    }
    int *lcp = calloc((size_t)t.n + 1, sizeof *lcp);
    if (!lcp) return 2;
    oracle(&t, lcp);
    uint64_t tokens = 0, state_tokens = 0, oracle_full = 0, oracle_state = 0;
    for (int i = 0; i < t.n; i++) {
        const squad_row *r = &t.rows[i].row;
        tokens += (uint64_t)r->n_ids;
        state_tokens += (uint64_t)(r->state_len > 0 ? r->state_len : 0);
        oracle_full += (uint64_t)lcp[i];
        oracle_state += (uint64_t)(lcp[i] < r->state_len ? lcp[i] : (r->state_len > 0 ? r->state_len : 0));
    }

    run_result cached = {0}, plain = {0};
    double (*now)(void) = a.cpu_clock ? cpu_seconds : squad_now_seconds;
    if (run_rows(model, &a.opts, now, &t, &cached, &err)) {
        fprintf(stderr, "bench_cache: cached run: %s\n", err.msg);
        return 1;
    }
    if (a.baseline) {
        squad_engine_opts off = a.opts;
        off.cache.budget_bytes = 0; /* the cache and the memo off */
        if (run_rows(model, &off, now, &t, &plain, &err)) {
            fprintf(stderr, "bench_cache: uncached run: %s\n", err.msg);
            return 1;
        }
    }
    uint64_t reused = 0;
    for (int i = 0; i < t.n; i++) reused += (uint64_t)cached.reused[i];
    hit_part parts[HIT_PARTS];
    const int n_hits = hit_rows(&t, &cached, a.baseline ? &plain : NULL, a.opts.cache.align, parts);
    const squad_cache_stats *st = &cached.stats;
    double p50c = percentile(cached.latency, t.n, 0.50), p99c = percentile(cached.latency, t.n, 0.99);
    double p50u = a.baseline ? percentile(plain.latency, t.n, 0.50) : 0;
    double p99u = a.baseline ? percentile(plain.latency, t.n, 0.99) : 0;
    double diff = a.baseline ? max_diff(&t, &cached, &plain) : 0;

    printf("state cache on %s: %d rows, %llu tokens (%llu in states)%s%s\n", a.rows, t.n,
           (unsigned long long)tokens, (unsigned long long)state_tokens, *a.label ? ", " : "", a.label);
    printf("  settings: budget %.1f MB, align %d, tail %d, stride %d, min_prefix %d, max_slots %d, device %s, "
           "%d threads, %s time\n",
           (double)a.opts.cache.budget_bytes / 1048576.0, a.opts.cache.align, a.opts.cache.tail,
           a.opts.cache.stride, a.opts.cache.min_prefix, a.opts.cache.max_slots,
           a.opts.device == SQUAD_DEVICE_CUDA ? "cuda" : "cpu", a.opts.threads, a.cpu_clock ? "CPU" : "wall");
    printf("  rows: %llu cached (%llu hits, %llu partial, %llu cold), %llu plain; %llu checkpoints made, %llu evicted\n",
           (unsigned long long)st->rows, (unsigned long long)st->hits, (unsigned long long)st->partial,
           (unsigned long long)st->cold, (unsigned long long)st->plain, (unsigned long long)st->checkpoints_made,
           (unsigned long long)st->evicted);
    printf("  token hit rate: %.1f%% (%llu of %llu tokens restored)\n", 100.0 * (double)reused / (double)tokens,
           (unsigned long long)reused, (unsigned long long)tokens);
    printf("  reuse vs oracle: %.1f%% of the state oracle (%llu), %.1f%% of the full oracle (%llu)\n",
           oracle_state ? 100.0 * (double)reused / (double)oracle_state : 0, (unsigned long long)oracle_state,
           oracle_full ? 100.0 * (double)reused / (double)oracle_full : 0, (unsigned long long)oracle_full);
    printf("  cached:   %.2f rows/s, p50 %.2f ms, p99 %.2f ms\n", t.n / cached.seconds, 1e3 * p50c, 1e3 * p99c);
    if (a.baseline)
        printf("  uncached: %.2f rows/s, p50 %.2f ms, p99 %.2f ms (speedup %.2fx; max |dp| %.2g)\n",
               t.n / plain.seconds, 1e3 * p50u, 1e3 * p99u, plain.seconds / cached.seconds, diff);
    printf("  time outside the model's forward (lookup, restore, saves, eviction): %.3f ms per row, %.2f%% of "
           "the cached run\n",
           1e3 * (cached.seconds - cached.forward_seconds) / t.n,
           100.0 * (cached.seconds - cached.forward_seconds) / cached.seconds);
    printf("  peak cache bytes: %.2f MB of %.2f MB\n", (double)cached.peak_bytes / 1048576.0,
           (double)st->budget_bytes / 1048576.0);
    printf("  hit rows (restored at their state's end): %d; by state length, thirds:\n", n_hits);
    for (int k = 0; k < HIT_PARTS && n_hits >= HIT_PARTS; k++)
        printf("    state %6.0f, computed %4.0f tokens: cached %7.2f ms (%6.1f us per computed token), uncached %7.2f ms\n",
               parts[k].state, parts[k].computed, parts[k].cached_ms, parts[k].us_per_computed, parts[k].uncached_ms);
    printf("{\"bench\": \"cache\", \"label\": \"%s\", \"rows\": %d, \"tokens\": %llu, \"hit_rate\": %.4f, "
           "\"oracle_state_frac\": %.4f, \"oracle_full_frac\": %.4f, \"rows_per_s\": %.3f, \"p50_ms\": %.3f, "
           "\"p99_ms\": %.3f, \"uncached_rows_per_s\": %.3f, \"uncached_p50_ms\": %.3f, \"uncached_p99_ms\": %.3f, "
           "\"peak_bytes\": %zu, \"budget_bytes\": %zu, \"hit_rows\": %d, \"hit_state\": [%.0f, %.0f, %.0f], "
           "\"hit_cached_ms\": [%.3f, %.3f, %.3f], \"hit_uncached_ms\": [%.3f, %.3f, %.3f], "
           "\"outside_forward_ms_per_row\": %.4f, \"max_abs_diff\": %.3g}\n",
           a.label, t.n, (unsigned long long)tokens, (double)reused / (double)tokens,
           oracle_state ? (double)reused / (double)oracle_state : 0,
           oracle_full ? (double)reused / (double)oracle_full : 0, t.n / cached.seconds, 1e3 * p50c, 1e3 * p99c,
           a.baseline ? t.n / plain.seconds : 0, 1e3 * p50u, 1e3 * p99u, cached.peak_bytes, st->budget_bytes, n_hits,
           parts[0].state, parts[1].state, parts[2].state, parts[0].cached_ms, parts[1].cached_ms, parts[2].cached_ms,
           parts[0].uncached_ms, parts[1].uncached_ms, parts[2].uncached_ms,
           1e3 * (cached.seconds - cached.forward_seconds) / t.n, diff);

    run_free(&cached);
    run_free(&plain);
    free(lcp);
    for (int i = 0; i < t.n; i++) squad_row_buf_free(&t.rows[i]);
    free(t.rows);
    squad_model_free(model);
    return 0;
}
