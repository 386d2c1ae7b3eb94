/*
 * bench_batch.c — questions per second for N concurrent hits through the batching scheduler
 * (docs/batching.md), against their FLOP and weight-byte floors.
 *
 *   bench_batch [--model DIR | --synth-dir DIR] [--device cpu|cuda] [--threads N]
 *               [--precision bf16|exact] [--ns 1,4,16,64] [--questions 32,128] [--state 4096]
 *               [--reps 3] [--tflops T] [--bw GB/s] [--distinct-prefix]
 *
 * The model: --model DIR, else the qwen3.5-0.8b preset synthesized once into --synth-dir (default
 * /tmp/squad-bench-qwen3.5-0.8b, reused when it holds a model already): the 0.8B shapes with
 * random bf16 weights.
 *
 * Two scenarios, each for every N (default 1, 4, 16, 64 on CUDA; 1, 4, 8 on the CPU) and question
 * length:
 *  - shared: one cached state of --state tokens; N rows of that state plus a fresh question each
 *    (the questions of several agents about one page);
 *  - distinct: N cached states, one per row (N agents, each on its own page). Each state is its own
 *    checkpoint with its own K / V group; to keep the set-up affordable on a CPU they share all
 *    but their last 64 tokens (the cache stores each whole: what a hit reads is the same as for
 *    states with nothing in common). --distinct-prefix makes them share nothing.
 * The N rows go in together through squad_engine_score_batch on an engine of max_rows N (capped
 * by the backend's slots); every repetition draws fresh question tokens, so the memo never
 * answers. Wall time of the batch; questions/s = N / median time. "vs 1" is the speed-up over
 * N times the N = 1 time of the same scenario and question length.
 *
 * Floors of the batch, from the model's shapes: FLOPs (projections 2 x params x tokens; causal
 * attention over the cached state, 4 x hd x keys per query and head; the delta rule ~7 x nv x dk x
 * dv per token and GDN layer) over --tflops, and weight bytes (every projection weight read once
 * per batched step, bf16; ceil(N x q / batch tokens) steps) over --bw. Defaults: the H200's 790
 * TFLOP/s and 4300 GB/s on CUDA (bench_gpu.c), 0.2 TFLOP/s (2 AVX2 cores) and 20 GB/s on the CPU.
 * Until a backend's forward runs a batch as one pass (packed GEMMs), its chunks run one after
 * another and the weight floor is paid per chunk: the table shows what batching buys on that build.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend.h"
#include "engine.h"
#include "model.h"
#include "squad.h"
#include "synth.h"
#include "util.h"

#define N_LETTERS 4
#define MAX_LIST 8
#define DISTINCT_TAIL 64 /* tokens that tell the distinct states apart (unless --distinct-prefix) */
#define DEFAULT_SYNTH_DIR "/tmp/squad-bench-qwen3.5-0.8b"

typedef struct args {
    const char *model, *synth_dir;
    squad_engine_opts opts;
    int ns[MAX_LIST], n_ns;
    int qs[MAX_LIST], n_qs;
    int state, reps, distinct_prefix;
    double tflops, bw;
} args;

static int parse_list(const char *text, int *out, int cap) {
    int n = 0;
    char *copy = strdup(text), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t && n < cap; t = strtok_r(NULL, ",", &save)) {
        const int v = atoi(t);
        if (v < 1) {
            free(copy);
            return -1;
        }
        out[n++] = v;
    }
    free(copy);
    return n;
}

static int usage(const char *why) {
    fprintf(stderr, "bench_batch: %s\n(see the comment at the top of bench/bench_batch.c)\n", why);
    return 2;
}

static int parse_args(int argc, char **argv, args *a) {
    memset(a, 0, sizeof *a);
    squad_engine_opts_default(&a->opts);
    a->synth_dir = DEFAULT_SYNTH_DIR;
    a->state = 4096;
    a->reps = 3;
    const char *ns = NULL, *qs = "32,128";
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--distinct-prefix")) {
            a->distinct_prefix = 1;
            continue;
        }
        if (!v) return usage("an option needs a value");
        i++;
        if (!strcmp(k, "--model")) a->model = v;
        else if (!strcmp(k, "--synth-dir")) a->synth_dir = v;
        else if (!strcmp(k, "--device"))
            a->opts.device = !strcmp(v, "cuda") ? SQUAD_DEVICE_CUDA : !strcmp(v, "cpu") ? SQUAD_DEVICE_CPU : SQUAD_DEVICE_AUTO;
        else if (!strcmp(k, "--threads")) a->opts.threads = atoi(v);
        else if (!strcmp(k, "--precision"))
            a->opts.precision = !strcmp(v, "exact") ? SQUAD_PRECISION_EXACT : SQUAD_PRECISION_BF16;
        else if (!strcmp(k, "--ns")) ns = v;
        else if (!strcmp(k, "--questions")) qs = v;
        else if (!strcmp(k, "--state")) a->state = atoi(v);
        else if (!strcmp(k, "--reps")) a->reps = atoi(v);
        else if (!strcmp(k, "--tflops")) a->tflops = atof(v);
        else if (!strcmp(k, "--bw")) a->bw = atof(v);
        else return usage("unknown option");
    }
    if (a->state < 256 || a->reps < 1) return usage("--state at least 256, --reps at least 1");
    if ((a->n_qs = parse_list(qs, a->qs, MAX_LIST)) < 1) return usage("--questions: a list of lengths");
    if (ns && (a->n_ns = parse_list(ns, a->ns, MAX_LIST)) < 1) return usage("--ns: a list of counts");
    return 0;
}

/* The model: --model, or the 0.8B preset synthesized once. */
static squad_model *load_model(const args *a, squad_err *err) {
    if (a->model) return squad_model_load(a->model, err);
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s/config.json", a->synth_dir);
    struct stat st;
    if (stat(cfg, &st) != 0) {
        fprintf(stderr, "bench_batch: synthesizing qwen3.5-0.8b into %s (once)\n", a->synth_dir);
        squad_synth_opts so;
        memset(&so, 0, sizeof so);
        so.preset = "qwen3.5-0.8b";
        so.out_dir = a->synth_dir;
        so.seed = 1;
        if (squad_synth_write(&so, err)) return NULL;
    }
    return squad_model_load(a->synth_dir, err);
}

static uint64_t g_rng = 0x8a7c;
static int32_t rnd_token(int V) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((g_rng >> 33) % (uint64_t)V);
}

/* ---- floors ---------------------------------------------------------------------------------- */

static double proj_params(const squad_model *m) {
    double p = 0;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        const squad_layer_weights *L = &m->layers[l];
        const squad_mat *mats[] = {&L->mlp_gate, &L->mlp_up, &L->mlp_down, &L->in_qkv, &L->in_z, &L->in_b,
                                   &L->in_a,     &L->out_proj, &L->q_proj, &L->k_proj, &L->v_proj, &L->o_proj};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) p += (double)mats[i]->rows * mats[i]->cols;
    }
    return p;
}

/* FLOPs of n questions of q tokens on states of s tokens. */
static double batch_flops(const squad_model *m, int n, int q, int s) {
    const squad_config *c = &m->cfg;
    const int n_attn = squad_config_count_layers(c, SQUAD_LAYER_FULL);
    const int n_gdn = squad_config_count_layers(c, SQUAD_LAYER_LINEAR);
    const double tokens = (double)n * q;
    const double keys = s + (q + 1) / 2.0; /* mean keys per query */
    const double attn = 4.0 * c->head_dim * keys * c->num_heads * n_attn;
    const double delta = 7.0 * c->lin_num_v_heads * c->lin_k_dim * c->lin_v_dim * n_gdn;
    return tokens * (2.0 * proj_params(m) + attn + delta);
}

/* ---- one case -------------------------------------------------------------------------------- */

typedef struct rowbuf {
    int32_t *ids;
    int32_t slot, nopts, letters[N_LETTERS];
    squad_row row;
} rowbuf;

/* A row of `state` then q fresh tokens, its one slot on the last. */
static void make_row(rowbuf *r, const int32_t *state, int s, int q, int V) {
    memcpy(r->ids, state, (size_t)s * sizeof *state);
    for (int i = 0; i < q; i++) r->ids[s + i] = rnd_token(V);
    r->slot = s + q - 1;
    r->nopts = N_LETTERS;
    for (int l = 0; l < N_LETTERS; l++) r->letters[l] = 10 + l;
    r->row = (squad_row){r->ids, s + q, &r->slot, &r->nopts, 1, r->letters, N_LETTERS, s, 0, NULL, 0};
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median wall seconds of a batch of n hits (shared: all on state 0; else on states 0..n-1). */
static double run_case(squad_engine *e, const args *a, int n, int q, int shared, int32_t **states) {
    const int V = squad_model_vocab_size(e->model), s = a->state;
    squad_err err = {0};
    rowbuf *rows = calloc((size_t)n, sizeof *rows);
    squad_row *in = calloc((size_t)n, sizeof *in);
    squad_result *out = calloc((size_t)n, sizeof *out);
    double *times = calloc((size_t)a->reps, sizeof *times);
    if (!rows || !in || !out || !times) abort();
    for (int i = 0; i < n; i++)
        if (!(rows[i].ids = malloc(sizeof(int32_t) * (size_t)(s + q)))) abort();
    /* one untimed batch (first-use costs: page faults, graphs), then the timed ones */
    for (int rep = -1; rep < a->reps; rep++) {
        for (int i = 0; i < n; i++) {
            make_row(&rows[i], states[shared ? 0 : i], s, q, V);
            in[i] = rows[i].row;
        }
        const double t0 = squad_now_seconds();
        const int rc = squad_engine_score_batch(e, in, n, NULL, out, NULL, NULL, &err);
        const double t = squad_now_seconds() - t0;
        if (rc) fprintf(stderr, "bench_batch: batch: %s\n", err.msg);
        for (int i = 0; i < n; i++)
            if (!rc && out[i].reused != s - s % e->opts.cache.align)
                fprintf(stderr, "bench_batch: row %d restored %d of %d tokens\n", i, out[i].reused, s);
        if (rep >= 0) times[rep] = t;
    }
    qsort(times, (size_t)a->reps, sizeof *times, cmp_double);
    const double med = times[a->reps / 2];
    for (int i = 0; i < n; i++) free(rows[i].ids);
    free(rows), free(in), free(out), free(times);
    return med;
}

int main(int argc, char **argv) {
    args a;
    if (parse_args(argc, argv, &a)) return 2;
    squad_err err = {0};
    squad_model *m = load_model(&a, &err);
    if (!m) {
        fprintf(stderr, "bench_batch: %s\n", err.msg);
        return 1;
    }
    int max_n = 1, max_q = 1;
    for (int i = 0; i < a.n_ns; i++) max_n = a.ns[i] > max_n ? a.ns[i] : max_n;
    for (int i = 0; i < a.n_qs; i++) max_q = a.qs[i] > max_q ? a.qs[i] : max_q;
    if (!a.n_ns) max_n = 64; /* until the device is known: the largest default */
    /* a throwaway engine names the device and a checkpoint's size */
    squad_engine_opts probe_opts = a.opts;
    probe_opts.cache.budget_bytes = 0;
    probe_opts.max_tokens = 1024;
    squad_engine *probe = squad_engine_new(m, &probe_opts, &err);
    if (!probe) {
        fprintf(stderr, "bench_batch: %s\n", err.msg);
        squad_model_free(m);
        return 1;
    }
    const int cuda = !strcmp(squad_engine_device(probe), "cuda");
    const size_t one_state = (size_t)(a.state + 64) * probe->be->kv_bytes_per_pos + probe->be->gdn_snapshot_bytes;
    squad_engine_free(probe);
    if (!a.n_ns) {
        const int cpu_ns[] = {1, 4, 8}, cuda_ns[] = {1, 4, 16, 64};
        a.n_ns = cuda ? 4 : 3;
        memcpy(a.ns, cuda ? cuda_ns : cpu_ns, sizeof(int) * (size_t)a.n_ns);
        max_n = cuda ? 64 : 8;
    }
    if (a.tflops <= 0) a.tflops = cuda ? 790 : 0.2;
    if (a.bw <= 0) a.bw = cuda ? 4300 : 20;
    const int V = squad_model_vocab_size(m);
    int32_t **states = calloc((size_t)max_n, sizeof *states);
    for (int i = 0; i < max_n; i++) {
        states[i] = malloc(sizeof(int32_t) * (size_t)a.state);
        if (i == 0 || a.distinct_prefix) {
            for (int t = 0; t < a.state; t++) states[i][t] = rnd_token(V);
        } else { /* all but the last DISTINCT_TAIL tokens of state 0 */
            memcpy(states[i], states[0], sizeof(int32_t) * (size_t)a.state);
            for (int t = a.state - DISTINCT_TAIL; t < a.state; t++) states[i][t] = rnd_token(V);
        }
    }
    /* one engine for every case: max_n rows in flight, a cache that holds every state (each
     * checkpointed at its end only) */
    squad_engine_opts o = a.opts;
    o.max_rows = max_n;
    o.max_tokens = a.state + max_q + 64;
    o.cache.budget_bytes = (size_t)max_n * one_state * 5 / 4 + ((size_t)64 << 20);
    squad_engine *e = squad_engine_new(m, &o, &err);
    if (!e) {
        fprintf(stderr, "bench_batch: engine: %s\n", err.msg);
        squad_model_free(m);
        return 1;
    }
    if (e->sched.max_rows < max_n)
        fprintf(stderr, "bench_batch: the %s backend runs %d rows at once, not %d\n", squad_engine_device(e),
                e->sched.max_rows, max_n);
    const double t_warm = squad_now_seconds();
    for (int i = 0; i < max_n; i++) { /* the states into the cache (not timed) */
        rowbuf r;
        squad_result res;
        if (!(r.ids = malloc(sizeof(int32_t) * (size_t)(a.state + 8)))) abort();
        make_row(&r, states[i], a.state, 8, V);
        /* state 0 with its tail checkpoint, from which the others (sharing all but their last
         * DISTINCT_TAIL tokens) are partial hits; those with their end checkpoint only */
        const squad_score_opts end_only = {.end_checkpoint_only = i > 0};
        if (squad_engine_score_ex(e, &r.row, &end_only, &res, &err)) fprintf(stderr, "bench_batch: warm-up: %s\n", err.msg);
        free(r.ids);
    }
    fprintf(stderr, "bench_batch: %d states cached in %.1f s\n", max_n, squad_now_seconds() - t_warm);
    const double weight_bytes = 2.0 * proj_params(m);
    printf("bench_batch: %s, %s, threads %d, state %d tokens, %d reps (median); floors at %.3g TFLOP/s, %.0f GB/s\n",
           cuda ? "cuda" : "cpu", a.opts.precision == SQUAD_PRECISION_EXACT ? "exact" : "bf16", a.opts.threads, a.state,
           a.reps, a.tflops, a.bw);
    printf("| scenario | q | N | batch ms | questions/s | vs 1 | steps | FLOP floor ms | weight floor ms | ms / floor |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int shared = 1; shared >= 0; shared--)
        for (int qi = 0; qi < a.n_qs; qi++) {
            double one = 0;
            for (int ni = 0; ni < a.n_ns; ni++) {
                const int n = a.ns[ni], q = a.qs[qi];
                const int steps = (int)(((long)n * q + e->sched.batch_tokens - 1) / e->sched.batch_tokens);
                const double t = run_case(e, &a, n, q, shared, states);
                if (t < 0) continue;
                if (n == 1) one = t;
                const double flop_ms = 1e3 * batch_flops(m, n, q, a.state) / (a.tflops * 1e12);
                const double byte_ms = 1e3 * steps * weight_bytes / (a.bw * 1e9);
                const double floor_ms = flop_ms > byte_ms ? flop_ms : byte_ms;
                char vs[32] = "-";
                if (one > 0) snprintf(vs, sizeof vs, "%.2fx", n * one / t);
                printf("| %s | %d | %d | %.1f | %.3g | %s | %d | %.2f | %.2f | %.1fx |\n", shared ? "shared" : "distinct",
                       q, n, 1e3 * t, n / t, vs, steps, flop_ms, byte_ms, 1e3 * t / floor_ms);
                fflush(stdout);
            }
        }
    for (int i = 0; i < max_n; i++) free(states[i]);
    free(states);
    squad_engine_free(e);
    squad_model_free(m);
    return 0;
}
