/*
 * bench_cache.c — the state cache on a workload trace (bench/agent_trace.py): the same rows with
 * the cache and without it, through the library on one engine each.
 *
 * Usage: bench_cache --model DIR --rows FILE [--cache-mb X] [--stride N] [--tail N] [--align N]
 *                    [--min-prefix N] [--max-slots N] [--threads N] [--device cpu|cuda]
 *                    [--no-baseline] [--label TEXT]
 *
 * Reports (a readable block, then one JSON line):
 *  - token hit rate: tokens restored / tokens in all rows;
 *  - reuse against the oracle: the oracle of a row is the longest prefix it shares with any earlier
 *    row; "state oracle" caps it at the row's state_len (a state cache never reuses a question),
 *    "full oracle" does not;
 *  - rows per second, p50 / p99 row latency, with and without the cache;
 *  - the peak bytes the cache held (after any row) and its budget;
 *  - whether a hit row's cost scales with its suffix, not its state: the latency of the rows restored
 *    at their state's end fitted as a + b * computed tokens + c * state tokens, with the uncached
 *    cost of a token beside it (c far below it: the state is not paid for again);
 *  - the time a cached row spends outside the backend's forward (the cache's own work);
 *  - the largest difference between the cached and the uncached answers.
 * The exact-request memo is part of the engine; a trace without repeated rows never reaches it.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
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
} bench_args;

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

/* The backend's forward, timed: a row's latency minus its forward time is the cache's own work
 * (lookup, restore, saves, eviction). The backend's functions take no user pointer, so the wrapper
 * finds the real forward and the clock here (a benchmark program: one engine at a time). */
static struct {
    int (*forward)(squad_backend *, const squad_chunk *, float *, squad_err *);
    double seconds;
} timed;

static int timed_forward(squad_backend *be, const squad_chunk *ck, float *probs, squad_err *err) {
    double t0 = squad_now_seconds();
    int rc = timed.forward(be, ck, probs, err);
    timed.seconds += squad_now_seconds() - t0;
    return rc;
}

static int run_rows(squad_model *model, const squad_engine_opts *opts, const trace *t, run_result *out,
                    squad_err *err) {
    squad_engine *e = squad_engine_new(model, opts, err);
    if (!e) return err->code;
    timed.forward = e->be->forward;
    timed.seconds = 0;
    e->be->forward = timed_forward;
    out->latency = calloc((size_t)t->n, sizeof *out->latency);
    out->answers = calloc((size_t)t->n, sizeof *out->answers);
    out->reused = calloc((size_t)t->n, sizeof *out->reused);
    out->computed = calloc((size_t)t->n, sizeof *out->computed);
    if (!out->latency || !out->answers || !out->reused || !out->computed) {
        squad_engine_free(e);
        return squad_fail(err, SQUAD_E_NOMEM, "out of memory");
    }
    double t0 = squad_now_seconds();
    for (int i = 0; i < t->n; i++) {
        double s = squad_now_seconds();
        int rc = squad_engine_score(e, &t->rows[i].row, &out->answers[i], err);
        out->latency[i] = squad_now_seconds() - s;
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
    out->seconds = squad_now_seconds() - t0;
    out->forward_seconds = timed.seconds;
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

/* Hit rows: restored at their state's end. Their latency fitted as a + b * computed + c * state
 * (least squares): b is what a computed token costs, c what a state token adds to a hit row (the
 * restore and the attention over the cached K / V); c << b means the cost follows the suffix. */
typedef struct hit_scaling {
    int n;
    double us_base, us_per_computed, us_per_state; /* a, b, c in microseconds */
    double mean_state, mean_computed;
} hit_scaling;

/* Solves the 3 x 3 system m x = v (Gaussian elimination with partial pivoting); -1 if singular. */
static int solve3(double m[3][3], double v[3], double x[3]) {
    for (int c = 0; c < 3; c++) {
        int piv = c;
        for (int r = c + 1; r < 3; r++)
            if (fabs(m[r][c]) > fabs(m[piv][c])) piv = r;
        if (fabs(m[piv][c]) < 1e-12) return -1;
        for (int k = 0; k < 3; k++) {
            double t = m[c][k];
            m[c][k] = m[piv][k];
            m[piv][k] = t;
        }
        double t = v[c];
        v[c] = v[piv];
        v[piv] = t;
        for (int r = c + 1; r < 3; r++) {
            double f = m[r][c] / m[c][c];
            for (int k = c; k < 3; k++) m[r][k] -= f * m[c][k];
            v[r] -= f * v[c];
        }
    }
    for (int c = 2; c >= 0; c--) {
        double s = v[c];
        for (int k = c + 1; k < 3; k++) s -= m[c][k] * x[k];
        x[c] = s / m[c][c];
    }
    return 0;
}

static hit_scaling hit_rows(const trace *t, const run_result *r, int align) {
    hit_scaling h;
    memset(&h, 0, sizeof h);
    double m[3][3] = {{0}}, v[3] = {0}, x[3] = {0};
    for (int i = 0; i < t->n; i++) {
        const squad_row *row = &t->rows[i].row;
        int p = row->state_len - row->state_len % align;
        if (r->reused[i] == 0 || r->reused[i] != p || r->computed[i] == 0) continue;
        const double f[3] = {1.0, (double)r->computed[i], (double)row->state_len};
        for (int a = 0; a < 3; a++) {
            for (int b = 0; b < 3; b++) m[a][b] += f[a] * f[b];
            v[a] += f[a] * r->latency[i];
        }
        h.mean_state += row->state_len;
        h.mean_computed += r->computed[i];
        h.n++;
    }
    if (h.n < 4 || solve3(m, v, x)) return h;
    h.us_base = 1e6 * x[0];
    h.us_per_computed = 1e6 * x[1];
    h.us_per_state = 1e6 * x[2];
    h.mean_state /= h.n;
    h.mean_computed /= h.n;
    return h;
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
    if (run_rows(model, &a.opts, &t, &cached, &err)) {
        fprintf(stderr, "bench_cache: cached run: %s\n", err.msg);
        return 1;
    }
    if (a.baseline) {
        squad_engine_opts off = a.opts;
        off.cache.budget_bytes = 0; /* the cache and the memo off */
        if (run_rows(model, &off, &t, &plain, &err)) {
            fprintf(stderr, "bench_cache: uncached run: %s\n", err.msg);
            return 1;
        }
    }
    uint64_t reused = 0;
    for (int i = 0; i < t.n; i++) reused += (uint64_t)cached.reused[i];
    hit_scaling h = hit_rows(&t, &cached, a.opts.cache.align);
    const squad_cache_stats *st = &cached.stats;
    double p50c = percentile(cached.latency, t.n, 0.50), p99c = percentile(cached.latency, t.n, 0.99);
    double p50u = a.baseline ? percentile(plain.latency, t.n, 0.50) : 0;
    double p99u = a.baseline ? percentile(plain.latency, t.n, 0.99) : 0;
    double diff = a.baseline ? max_diff(&t, &cached, &plain) : 0;

    printf("state cache on %s: %d rows, %llu tokens (%llu in states)%s%s\n", a.rows, t.n,
           (unsigned long long)tokens, (unsigned long long)state_tokens, *a.label ? ", " : "", a.label);
    printf("  settings: budget %.1f MB, align %d, tail %d, stride %d, min_prefix %d, max_slots %d, device %s\n",
           (double)a.opts.cache.budget_bytes / 1048576.0, a.opts.cache.align, a.opts.cache.tail,
           a.opts.cache.stride, a.opts.cache.min_prefix, a.opts.cache.max_slots,
           a.opts.device == SQUAD_DEVICE_CUDA ? "cuda" : "cpu");
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
    const double us_per_token_uncached = a.baseline ? 1e6 * plain.seconds / (double)tokens : 0;
    printf("  hit rows (restored at their state's end): %d, mean state %.0f, mean computed %.0f tokens; latency fit:\n"
           "    %.1f us + %.2f us per computed token + %.3f us per state token (uncached: %.2f us per token)\n",
           h.n, h.mean_state, h.mean_computed, h.us_base, h.us_per_computed, h.us_per_state, us_per_token_uncached);
    printf("{\"bench\": \"cache\", \"label\": \"%s\", \"rows\": %d, \"tokens\": %llu, \"hit_rate\": %.4f, "
           "\"oracle_state_frac\": %.4f, \"oracle_full_frac\": %.4f, \"rows_per_s\": %.3f, \"p50_ms\": %.3f, "
           "\"p99_ms\": %.3f, \"uncached_rows_per_s\": %.3f, \"uncached_p50_ms\": %.3f, \"uncached_p99_ms\": %.3f, "
           "\"peak_bytes\": %zu, \"budget_bytes\": %zu, \"hit_rows\": %d, \"hit_us_per_computed\": %.3f, "
           "\"hit_us_per_state\": %.4f, \"uncached_us_per_token\": %.3f, \"outside_forward_ms_per_row\": %.4f, "
           "\"max_abs_diff\": %.3g}\n",
           a.label, t.n, (unsigned long long)tokens, (double)reused / (double)tokens,
           oracle_state ? (double)reused / (double)oracle_state : 0,
           oracle_full ? (double)reused / (double)oracle_full : 0, t.n / cached.seconds, 1e3 * p50c, 1e3 * p99c,
           a.baseline ? t.n / plain.seconds : 0, 1e3 * p50u, 1e3 * p99u, cached.peak_bytes, st->budget_bytes, h.n,
           h.us_per_computed, h.us_per_state, us_per_token_uncached,
           1e3 * (cached.seconds - cached.forward_seconds) / t.n, diff);

    run_free(&cached);
    run_free(&plain);
    free(lcp);
    for (int i = 0; i < t.n; i++) squad_row_buf_free(&t.rows[i]);
    free(t.rows);
    squad_model_free(model);
    return 0;
}
