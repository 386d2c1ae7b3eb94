/*
 * bench_gpu.c — the CUDA backend's benchmark: cold rows and cache hits through the library (the
 * way a user's rows run), each against its floor.
 *
 *   bench_gpu --model DIR [--reps N] [--bw GB/s] [--tflops T] [--rows-out FILE] [--json FILE]
 *   bench_gpu --model DIR --profile cold:N|hit:Q      (one row between cudaProfilerStart / Stop, for ncu)
 *   bench_gpu --model DIR --profile batch:NxQ        (one batched step of N Q-token hits, likewise)
 *   bench_gpu --model DIR --ablate [--reps N]          (each kernel group's share of a chunk's graph)
 *   bench_gpu --model DIR --long [--reps N]            (long rows: cold and hits at 32k / 64k / 128k)
 *   bench_gpu --model DIR --batch [--reps N]           (N = 1 .. 64 concurrent hits in one batched forward)
 *   bench_gpu --model DIR --batch --ablate [--reps N]  (each kernel group's share of a batched step, restores
 *                                                       and host included)
 *
 * Cases: cold rows of 512, 2048, 4096 and 8192 tokens (an engine without a cache: every token
 * computed); hits: a 4096-token state cached once, then rows of that state plus a fresh 32-, 128-
 * or 512-token question (state_len 4096: the cache restores the state and computes the question).
 * Every repetition uses fresh pseudo-random token ids, so the memo never answers. Wall time around
 * squad_engine_score; median and min over --reps. Beside it, each row's time outside the backend's
 * forward (the engine's own work: submission, the memo, the cache's plan and restore, the scheduler,
 * the answer's bookkeeping), from a timed wrapper around the two engines' forward.
 *
 * Floors: FLOPs (projections 2 x params x tokens, causal attention, the chunked delta rule) over
 * --tflops, and the fewest bytes (every projection weight once, the activations each GEMM must
 * read and write once in bf16, a hit's cached K / V read and its GDN state read and written)
 * over --bw; the larger is the floor. Defaults: 790 TFLOP/s and 4300 GB/s, the H200 figures
 * measured on this workplace's machines (tools/hf_timing.py measures them again).
 * The engines run the default precision (SQUAD_PRECISION_DEFAULT: bf16, the fast path the targets are
 * about); each case's first row also runs once through an EXACT (fp32) engine, whose time and
 * probabilities are reported too. --ablate uses the ablation timing of the internal library
 * (bench/cuda/ablate.h), which libsquad does not carry.
 * --rows-out writes one row per case with squad's probabilities (both precisions), for
 * tools/hf_timing.py to run through transformers on the same weights.
 * The default cases run engines of LEGACY_MAX_TOKENS positions (their graphs and memory as they
 * were); --long runs engines of the model's own positions instead: cold rows of 32,768, 65,536 and
 * 131,072 tokens, then each as a cached state with fresh 128-token questions, the hit's answer
 * checked against the same row computed cold, and the device memory in use after each case (the
 * K / V grows with the rows, so it shows what each length costs).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "engine.h"
#include "forward_timer.h"
#include "model.h"
#include "squad.h"
#include "util.h"

#ifdef SQUAD_HAVE_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "ablate.h" /* bench/cuda */
#include "cuda/backend_cuda.h"
#endif

#define N_LETTERS 4
#define STATE_LEN 4096
#define MAX_ROW 8704
/* The default cases' engines: the longest row squad took before rows could reach the model's own
 * positions, so their graphs (span buckets up to it) and memory stay comparable. */
#define LEGACY_MAX_TOKENS 32768
/* --long: the lengths, the question of a hit, and the cache budget that holds the longest state's
 * checkpoints (K / V 12 KB a position, a GDN checkpoint every 2048 positions at ~19 MB). */
static const int LONG_LENGTHS[] = {32768, 65536, 131072};
#define N_LONG ((int)(sizeof LONG_LENGTHS / sizeof LONG_LENGTHS[0]))
#define LONG_QUESTION 128
#define LONG_CACHE_BYTES ((size_t)8 << 30)

typedef struct bench_row {
    int32_t ids[MAX_ROW], slots[1], nopts[1], letters[N_LETTERS];
    squad_row row;
} bench_row;

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static void fill(int32_t *ids, int n, int vocab) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(rnd() % (uint32_t)vocab);
}

static void make_row(bench_row *b, int n, int state_len, int vocab) {
    b->slots[0] = n - 1;
    b->nopts[0] = N_LETTERS;
    for (int i = 0; i < N_LETTERS; i++) b->letters[i] = 32 + 3 * i; /* letter-like ids */
    b->row = (squad_row){b->ids, n, b->slots, b->nopts, 1, b->letters, N_LETTERS, state_len, 0, NULL, 0};
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- floors ---- */

typedef struct cost {
    double flops, bytes;
} cost;

/* A chunk of n tokens at positions [start, start + n). */
static cost cost_of(const squad_config *c, int n, int start) {
    const double H = c->hidden_size, I = c->intermediate_size;
    const double nh = c->num_heads, nkv = c->num_kv_heads, hd = c->head_dim;
    const double nk = c->lin_num_k_heads, nv = c->lin_num_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    const double C = 2 * nk * dk + nv * dv;
    cost r = {0, 0};
    for (int l = 0; l < c->num_layers; l++) {
        double params, act; /* projection parameters, activation elements read + written by the GEMMs */
        const double mlp = 3 * H * I, mlp_act = n * (H + 2 * I + I + H + H);
        if (c->layer_types[l] == SQUAD_LAYER_LINEAR) {
            const double in = C + nv * dv + 2 * nv;
            params = H * in + nv * dv * H + mlp;
            act = n * (H + in + nv * dv + H) + mlp_act;
            /* chunked delta rule per head per 64-token block: K K^T, Q K^T, W, U, delta, O, state */
            const double blocks = ceil(n / 64.0);
            const double per_block = 2 * 64 * 64 * dk * 2 + 2 * 64 * 64 * (dk + dv) + 2 * 64 * dk * dv * 3 +
                                     2 * 64 * 64 * dv;
            r.flops += nv * blocks * per_block;
            r.bytes += 2 * nv * dk * dv * 4; /* the state, read and written */
        } else {
            const double in = nh * 2 * hd + 2 * nkv * hd;
            params = H * in + nh * hd * H + mlp;
            act = n * (H + in + nh * hd + H) + mlp_act;
            /* causal attention: query t sees start + t + 1 keys; QK^T and PV */
            const double keys = (double)n * start + (double)n * (n + 1) / 2;
            r.flops += 4 * nh * hd * keys;
            r.bytes += (double)start * 2 * nkv * hd * 2; /* cached K / V read once */
        }
        r.flops += 2 * params * n;
        r.bytes += 2 * params + 2 * act;
    }
    r.bytes += (double)N_LETTERS * H * 2;
    return r;
}

/* ---- timing ---- */

typedef struct result {
    char name[48];
    int tokens, computed;
    double p50_ms, min_ms;
    double outside_us; /* p50 of a row's time outside the backend's forward */
    cost c;
    double target_ms;
    double exact_ms, bf16_vs_exact;
    float probs_exact[N_LETTERS];
} result;

static int time_case(squad_engine *e, squad_engine *ex, bench_row *b, int n, int state_len, int prefix_fixed, int reps,
                     int vocab, result *out, FILE *rows_out, const char *kind) {
    double *t = calloc((size_t)reps, sizeof(double));
    double *outside = calloc((size_t)reps, sizeof(double));
    squad_result *res = calloc(1, sizeof *res);
    squad_err err = {0};
    int computed = 0;
    if (!t || !outside || !res) {
        fprintf(stderr, "bench_gpu: %s: out of memory\n", out->name);
        free(t);
        free(outside);
        free(res);
        return SQUAD_E_NOMEM;
    }
    for (int r = -2; r < reps; r++) { /* two warm-ups */
        if (prefix_fixed)
            fill(b->ids + prefix_fixed, n - prefix_fixed, vocab);
        else
            fill(b->ids, n, vocab);
        make_row(b, n, state_len, vocab);
        forward_timer.seconds = 0;
        const double t0 = squad_now_seconds();
        const int rc = squad_engine_score(e, &b->row, res, &err);
        const double dt = squad_now_seconds() - t0;
        if (rc) {
            fprintf(stderr, "bench_gpu: %s: %s\n", out->name, err.msg);
            free(t);
            free(outside);
            free(res);
            return rc;
        }
        if (r >= 0) {
            t[r] = dt * 1e3;
            outside[r] = (dt - forward_timer.seconds) * 1e6;
        }
        computed = res->computed;
        if (r == 0 && ex) { /* the same row once on the exact path */
            squad_result *rx = calloc(1, sizeof *rx);
            const double tx = squad_now_seconds();
            const int rcx = squad_engine_score(ex, &b->row, rx, &err);
            out->exact_ms = (squad_now_seconds() - tx) * 1e3;
            if (rcx) fprintf(stderr, "bench_gpu: %s exact: %s\n", out->name, err.msg);
            double d = 0;
            for (int i = 0; i < N_LETTERS; i++) {
                out->probs_exact[i] = rx->probs[0][i];
                if (fabs(rx->probs[0][i] - res->probs[0][i]) > d) d = fabs(rx->probs[0][i] - res->probs[0][i]);
            }
            out->bf16_vs_exact = d;
            free(rx);
        }
        if (r == 0 && rows_out) {
            fprintf(rows_out, "{\"case\": \"%s\", \"kind\": \"%s\", \"state_len\": %d, \"ids\": [", out->name, kind,
                    state_len);
            for (int i = 0; i < n; i++) fprintf(rows_out, "%s%d", i ? "," : "", b->ids[i]);
            fprintf(rows_out, "], \"slots\": [%d], \"nopts\": [%d], \"letters\": [", b->slots[0], b->nopts[0]);
            for (int i = 0; i < N_LETTERS; i++) fprintf(rows_out, "%s%d", i ? "," : "", b->letters[i]);
            fprintf(rows_out, "], \"probs\": [[");
            for (int i = 0; i < N_LETTERS; i++) fprintf(rows_out, "%s%.7g", i ? "," : "", res->probs[0][i]);
            fprintf(rows_out, "]], \"probs_exact\": [[");
            for (int i = 0; i < N_LETTERS; i++) fprintf(rows_out, "%s%.7g", i ? "," : "", out->probs_exact[i]);
            fprintf(rows_out, "]], \"squad_ms\": %.4f}\n", dt * 1e3);
        }
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    qsort(outside, (size_t)reps, sizeof(double), cmp_double);
    out->p50_ms = t[reps / 2];
    out->min_ms = t[0];
    out->outside_us = outside[reps / 2];
    out->computed = computed;
    free(t);
    free(outside);
    free(res);
    return 0;
}

static squad_engine *open_engine(squad_model *m, size_t budget, squad_precision prec, int precapture, squad_err *err) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = SQUAD_DEVICE_CUDA;
    o.precision = prec;
    o.precapture = precapture;
    o.cache.budget_bytes = budget;
    o.max_tokens = LEGACY_MAX_TOKENS < m->cfg.max_position ? LEGACY_MAX_TOKENS : 0;
    return squad_engine_new(m, &o, err);
}

static void print_capture(squad_engine *e, const char *what) {
#ifdef SQUAD_HAVE_CUDA
    squad_cuda_info info;
    if (squad_cuda_backend_info(e->be, &info) == 0)
        printf("%s: %s, %d SMs; %d graphs precaptured in %.2f s; weights %.0f MB, state %.0f MB, scratch %.0f MB\n", what,
               info.device, info.sm_count, info.graphs, info.capture_s, info.weight_bytes / 1048576.0,
               info.state_bytes / 1048576.0, info.scratch_bytes / 1048576.0);
#else
    (void)e;
    (void)what;
#endif
}

#ifdef SQUAD_HAVE_CUDA
static double median_of(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[n / 2];
}

/* A 4096+128 hit through the backend interface, without the engine and the cache: the forward of the
 * question alone (its parameters up, the graph, the probabilities down), and with the restore of a
 * saved state first (reset, load_gdn, load_kv), so what a hit costs beside its graph is visible. */
static int hit_outside_graph(squad_backend *be, int reps, int vocab, squad_err *err) {
    const int Q = 128;
    if (STATE_LEN + Q > be->max_context) return 0;
    void *G = be->alloc(be, be->gdn_snapshot_bytes, err);
    void *KV = G ? be->alloc(be, (size_t)STATE_LEN * be->kv_bytes_per_pos, err) : NULL;
    double *ta = calloc((size_t)reps, sizeof *ta), *tb = calloc((size_t)reps, sizeof *tb);
    double *tc = calloc((size_t)reps, sizeof *tc);
    int32_t ids[128], letters[N_LETTERS];
    int rc = (G && KV && ta && tb && tc) ? 0 : SQUAD_E_NOMEM;
    if (rc && !err->msg[0]) snprintf(err->msg, sizeof err->msg, "out of memory");
    fill(ids, Q, vocab);
    for (int i = 0; i < N_LETTERS; i++) letters[i] = 32 + 3 * i;
    squad_chunk ck;
    memset(&ck, 0, sizeof ck);
    ck.ids = ids;
    ck.start = STATE_LEN;
    ck.len = Q;
    ck.n_slots = 1;
    ck.slots[0] = Q - 1;
    ck.nopts[0] = N_LETTERS;
    ck.letters = letters;
    ck.n_letters = N_LETTERS;
    float probs[SQUAD_MAX_SLOTS_PER_ROW * SQUAD_MAX_LETTERS];
    if (!rc) rc = be->save_gdn(be, 0, G, err);
    if (!rc) rc = be->save_kv(be, 0, KV, STATE_LEN, err);
    for (int r = -2; r < reps && !rc; r++) {
        double t0 = squad_now_seconds();
        rc = squad_backend_forward1(be, &ck, probs, err);
        const double t1 = squad_now_seconds();
        if (!rc) rc = be->reset(be, 0, err);
        if (!rc) rc = be->load_gdn(be, 0, G, err);
        if (!rc) rc = be->load_kv(be, 0, KV, STATE_LEN, STATE_LEN, err);
        if (!rc) rc = squad_backend_forward1(be, &ck, probs, err);
        const double t2 = squad_now_seconds();
        ck.n_slots = 0; /* no answer: no copy back */
        if (!rc) rc = squad_backend_forward1(be, &ck, NULL, err);
        ck.n_slots = 1;
        const double t3 = squad_now_seconds();
        if (r >= 0) {
            ta[r] = (t1 - t0) * 1e3;
            tb[r] = (t2 - t1) * 1e3;
            tc[r] = (t3 - t2) * 1e3;
        }
    }
    if (!rc)
        printf("\nhit 4096+%d through the backend (median of %d): forward (params up, graph, probabilities down) "
               "%.3f ms; without a slot (nothing copied back) %.3f ms; reset + load_gdn + load_kv + forward %.3f ms\n",
               Q, reps, median_of(ta, reps), median_of(tc, reps), median_of(tb, reps));
    free(ta);
    free(tb);
    free(tc);
    be->release(be, G);
    be->release(be, KV);
    return rc;
}
#endif

#ifdef SQUAD_HAVE_CUDA
/* --batch: N concurrent hits in one forward through the backend (its sequence slots and batched
 * forward, without the engine): N = 1, 4, 16, 64 questions of 32 and 128 tokens, each on a cached
 * 4096-token state restored into its own slot as the engine restores (squad_plan_restore: load_gdn,
 * which overwrites all a reset would clear, and load_kv, read in place), on one
 * state shared by every row and on N different states. Per repetition: the restores, then one
 * forward of the N chunks (fresh pseudo-random questions), p50 of reps after two warm-ups; timed
 * with and without the restores (a device synchronisation between them). Floors: N x the FLOPs of
 * one question, and the weights read once plus each row's own bytes (cost_of). */
#define BATCH_MAX_N 64
#define BATCH_MAX_Q 128
static const int BATCH_N[] = {1, 4, 16, 64};
static const int BATCH_Q[] = {32, 128};

/* The N chunks of a batched step: row i on slot i, a question of q tokens (ids[i q, (i + 1) q))
 * after the cached state, one answer slot at its last token, probabilities into probs[i]. */
static void batch_chunks(squad_chunk *ck, int n, int q, const int32_t *ids, const int32_t *letters, float *probs) {
    for (int i = 0; i < n; i++) {
        squad_chunk *k = &ck[i];
        memset(k, 0, sizeof *k);
        k->seq = i;
        k->ids = ids + (size_t)i * q;
        k->start = STATE_LEN;
        k->len = q;
        k->n_slots = 1;
        k->slots[0] = q - 1;
        k->nopts[0] = N_LETTERS;
        k->letters = letters;
        k->n_letters = N_LETTERS;
        k->probs = probs + (size_t)i * SQUAD_MAX_LETTERS;
    }
}

/* The rows' restores as squad_plan_restore does them (no reset): slot i from state 0 (shared)
 * or state i. */
static int batch_restore(squad_backend *be, int n, int shared, void *const *G, void *const *KV, squad_err *err) {
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const int s = shared ? 0 : i;
        rc = be->load_gdn(be, i, G[s], err);
        if (!rc) rc = be->load_kv(be, i, KV[s], STATE_LEN, STATE_LEN, err);
    }
    return rc;
}

/* The backend the batched cases run on: the default precision, BATCH_MAX_N rows of up to
 * BATCH_MAX_Q tokens in one replay. NULL with err set when it cannot be made. */
static squad_backend *batch_backend(squad_model *m, squad_err *err) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = SQUAD_DEVICE_CUDA;
    o.precision = SQUAD_PRECISION_DEFAULT;
    o.max_rows = BATCH_MAX_N;
    o.batch_tokens = BATCH_MAX_N * BATCH_MAX_Q; /* 64 questions of 128 tokens in one replay */
    return squad_cuda_backend_new(m, &o, 8192, err);
}

/* n cached STATE_LEN-token states of fresh ids: each row run on slot 0 and saved into G[s], KV[s]
 * (allocated here; the caller releases them). */
static int batch_states(squad_backend *be, int n, int V, void **G, void **KV, squad_err *err) {
    int32_t *ids = malloc(sizeof(int32_t) * STATE_LEN);
    int rc = ids ? 0 : SQUAD_E_NOMEM;
    for (int s = 0; s < n && !rc; s++) {
        fill(ids, STATE_LEN, V);
        squad_chunk ch;
        memset(&ch, 0, sizeof ch);
        ch.ids = ids;
        ch.len = STATE_LEN;
        G[s] = be->alloc(be, be->gdn_snapshot_bytes, err);
        KV[s] = G[s] ? be->alloc(be, (size_t)STATE_LEN * be->kv_bytes_per_pos, err) : NULL;
        if (!KV[s]) rc = SQUAD_E_NOMEM;
        if (!rc) rc = be->reset(be, 0, err);
        if (!rc) rc = squad_backend_forward1(be, &ch, NULL, err);
        if (!rc) rc = be->save_gdn(be, 0, G[s], err);
        if (!rc) rc = be->save_kv(be, 0, KV[s], STATE_LEN, err);
    }
    free(ids);
    return rc;
}

static int batch_bench(squad_model *m, int reps, double bw, double tflops) {
    const squad_config *c = &m->cfg;
    squad_err err = {0};
    squad_backend *be = batch_backend(m, &err);
    if (!be) {
        fprintf(stderr, "bench_gpu --batch: %s\n", err.msg);
        return 1;
    }
    const int V = c->vocab_size;
    void *G[BATCH_MAX_N] = {0}, *KV[BATCH_MAX_N] = {0};
    int32_t *q_ids = malloc(sizeof(int32_t) * BATCH_MAX_N * BATCH_MAX_Q), letters[N_LETTERS];
    double *ta = calloc((size_t)reps, sizeof(double)), *tb = calloc((size_t)reps, sizeof(double));
    float *probs = malloc(sizeof(float) * BATCH_MAX_N * SQUAD_MAX_LETTERS);
    squad_chunk *ck = calloc(BATCH_MAX_N, sizeof *ck);
    int rc = q_ids && ta && tb && probs && ck ? 0 : SQUAD_E_NOMEM;
    for (int i = 0; i < N_LETTERS; i++) letters[i] = 32 + 3 * i;
    const double t0 = squad_now_seconds();
    if (!rc) rc = batch_states(be, BATCH_MAX_N, V, G, KV, &err);
    if (!rc) printf("\n%d cached %d-token states made in %.2f s\n", BATCH_MAX_N, STATE_LEN, squad_now_seconds() - t0);
    cost cw = cost_of(c, 0, 0);
    int n_lin = 0;
    for (int l = 0; l < c->num_layers; l++) n_lin += c->layer_types[l] == SQUAD_LAYER_LINEAR;
    const double weight_bytes = cw.bytes - (double)N_LETTERS * c->hidden_size * 2 -
                                n_lin * 2.0 * c->lin_num_v_heads * c->lin_k_dim * c->lin_v_dim * 4;
    printf("\nbatched hits through the backend (p50 of %d after 2 warm-ups; ceilings %.0f TFLOP/s, %.0f GB/s)\n", reps,
           tflops, bw);
    printf("| question | N | states | forward ms | restore + forward ms | questions/s | questions/s (forward) | floor ms "
           "| forward / floor | target |\n");
    printf("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    for (int qi = 0; qi < 2 && !rc; qi++)
        for (int ni = 0; ni < 4 && !rc; ni++)
            for (int shared = 1; shared >= 0 && !rc; shared--) {
                const int Q = BATCH_Q[qi], N = BATCH_N[ni];
                if (N == 1 && !shared) continue; /* the same case */
                for (int r = -2; r < reps && !rc; r++) {
                    fill(q_ids, N * Q, V);
                    batch_chunks(ck, N, Q, q_ids, letters, probs);
                    const double ts = squad_now_seconds();
                    rc = batch_restore(be, N, shared, G, KV, &err);
                    cudaDeviceSynchronize();
                    const double tm = squad_now_seconds();
                    if (!rc) rc = be->forward(be, ck, N, &err);
                    const double te = squad_now_seconds();
                    if (r >= 0) {
                        ta[r] = (te - tm) * 1e3;
                        tb[r] = (te - ts) * 1e3;
                    }
                }
                if (rc) break;
                const double fwd = median_of(ta, reps), all = median_of(tb, reps);
                const cost c1 = cost_of(c, Q, STATE_LEN);
                const double flops = N * c1.flops, bytes = N * c1.bytes - (N - 1) * weight_bytes;
                const double tf = flops / (tflops * 1e12) * 1e3, tbb = bytes / (bw * 1e9) * 1e3;
                const double fl = tf > tbb ? tf : tbb;
                char tgt[48] = "-";
                const double want = N == 16 ? (Q == 128 ? 2300 : 5000) : 0;
                if (want > 0)
                    snprintf(tgt, sizeof tgt, ">= %.0f/s %s", want, N / (all * 1e-3) >= want ? "(met)" : "(MISSED)");
                printf("| %d | %d | %s | %.3f | %.3f | %.0f | %.0f | %.3f (%s) | %.1fx | %s |\n", Q, N,
                       shared ? "one" : "N", fwd, all, N / (all * 1e-3), N / (fwd * 1e-3), fl, tf > tbb ? "FLOPs" : "bytes",
                       fwd / fl, tgt);
                fflush(stdout);
            }
    if (rc) fprintf(stderr, "bench_gpu --batch: %s\n", err.msg);
    squad_cuda_info info;
    if (squad_cuda_backend_info(be, &info) == 0)
        printf("graphs %d (captured in %.2f s), K / V %d positions held by the slots, state %.0f MB\n", info.graphs,
               info.capture_s, info.kv_positions, info.state_bytes / 1048576.0);
    for (int s = 0; s < BATCH_MAX_N; s++) {
        be->release(be, G[s]);
        be->release(be, KV[s]);
    }
    be->destroy(be);
    free(q_ids), free(ta), free(tb), free(probs), free(ck);
    return rc ? 1 : 0;
}

/* --profile batch:NxQ: one batched forward of N Q-token hits, each on its own cached state, between
 * cudaProfilerStart / Stop (run under ncu), after BATCH_PROFILE_WARM unprofiled ones (the graph
 * captured, the GEMM plans tuned, so a profile sees the kernels a batched step runs). */
#define BATCH_PROFILE_WARM 3
static int batch_profile(squad_model *m, int n, int q) {
    if (n < 1 || n > BATCH_MAX_N || q < 1 || q > BATCH_MAX_Q) {
        fprintf(stderr, "bench_gpu: --profile batch:NxQ takes N 1..%d, Q 1..%d\n", BATCH_MAX_N, BATCH_MAX_Q);
        return 2;
    }
    squad_err err = {0};
    squad_backend *be = batch_backend(m, &err);
    if (!be) {
        fprintf(stderr, "bench_gpu --profile: %s\n", err.msg);
        return 1;
    }
    const int V = m->cfg.vocab_size;
    void *G[BATCH_MAX_N] = {0}, *KV[BATCH_MAX_N] = {0};
    int32_t *q_ids = malloc(sizeof(int32_t) * (size_t)n * q), letters[N_LETTERS];
    float *probs = malloc(sizeof(float) * (size_t)n * SQUAD_MAX_LETTERS);
    squad_chunk *ck = calloc((size_t)n, sizeof *ck);
    int rc = q_ids && probs && ck ? 0 : SQUAD_E_NOMEM;
    for (int i = 0; i < N_LETTERS; i++) letters[i] = 32 + 3 * i;
    if (!rc) rc = batch_states(be, n, V, G, KV, &err);
    double dt = 0;
    for (int r = 0; r <= BATCH_PROFILE_WARM && !rc; r++) {
        fill(q_ids, n * q, V);
        batch_chunks(ck, n, q, q_ids, letters, probs);
        rc = batch_restore(be, n, 0, G, KV, &err);
        if (cudaDeviceSynchronize() != cudaSuccess && !rc) rc = SQUAD_E_BACKEND;
        if (rc) break;
        if (r == BATCH_PROFILE_WARM) cudaProfilerStart();
        const double ts = squad_now_seconds();
        rc = be->forward(be, ck, n, &err);
        dt = squad_now_seconds() - ts;
        if (r == BATCH_PROFILE_WARM) cudaProfilerStop();
    }
    printf("profile batch:%dx%d: %.3f ms%s%s\n", n, q, dt * 1e3, rc ? ": " : "", rc ? err.msg : "");
    for (int s = 0; s < n; s++) {
        be->release(be, G[s]);
        be->release(be, KV[s]);
    }
    be->destroy(be);
    free(q_ids), free(probs), free(ck);
    return rc ? 1 : 0;
}
#endif

#ifdef SQUAD_HAVE_CUDA
/* The ablation's kernel-group sets: the whole graph, then each group (and each mixer kernel) left
 * out, then the GEMMs alone and nothing (the graph's empty skeleton). */
enum { SET_ALL, SET_NO_GEMM, SET_NO_GDN, SET_NO_GDN_CONV, SET_NO_GDN_PREP, SET_NO_GDN_SCAN, SET_NO_GDN_OUT,
       SET_NO_ATTN, SET_NO_ATT_PREP, SET_NO_ATT_FWD, SET_NO_ATT_COMBINE, SET_NO_NORM, SET_NO_SILU, SET_GEMM_ONLY,
       SET_NOTHING, N_SETS };
static const struct {
    const char *name;
    unsigned parts;
} SETS[N_SETS] = {{"all", SQUAD_CUDA_PART_ALL},
                  {"- GEMMs", SQUAD_CUDA_PART_ALL & ~SQUAD_CUDA_PART_GEMM},
                  {"- GDN", SQUAD_CUDA_PART_ALL & ~SQUAD_CUDA_PART_GDN},
                  {"- gdn conv", SQUAD_CUDA_PART_ALL & ~SQUAD_CUDA_PART_GDN_CONV},
                  {"- gdn prep", SQUAD_CUDA_PART_ALL & ~SQUAD_CUDA_PART_GDN_PREP},
                  {"- gdn scan", SQUAD_CUDA_PART_ALL & ~SQUAD_CUDA_PART_GDN_SCAN},
                  {"- gdn out", SQUAD_CUDA_PART_ALL & ~SQUAD_CUDA_PART_GDN_OUT},
                  {"- attention", SQUAD_CUDA_PART_ALL & ~SQUAD_CUDA_PART_ATTN},
                  {"- att prep", SQUAD_CUDA_PART_ALL & ~SQUAD_CUDA_PART_ATT_PREP},
                  {"- att fwd", SQUAD_CUDA_PART_ALL & ~SQUAD_CUDA_PART_ATT_FWD},
                  {"- att combine", SQUAD_CUDA_PART_ALL & ~SQUAD_CUDA_PART_ATT_COMBINE},
                  {"- norms", SQUAD_CUDA_PART_ALL & ~SQUAD_CUDA_PART_NORM},
                  {"- silu*up", SQUAD_CUDA_PART_ALL & ~SQUAD_CUDA_PART_SILU},
                  {"GEMMs only", SQUAD_CUDA_PART_GEMM},
                  {"nothing", 0}};
#endif

#ifdef SQUAD_HAVE_CUDA
/* --batch --ablate: where a batched step's time goes. For each case (N rows of Q-token questions on
 * cached 4096-token states: one state shared by every row, or N), the batch's graph replayed with
 * one kernel group left out at a time (squad_cuda_time_batch_parts: a group's share is the whole
 * graph's time minus the time without it), then the step through the backend as batch_bench runs
 * it: the restores (load_gdn, load_kv of every row, waited for) and the forward on the host
 * (checks, staging, the parameters' upload, the replay, the probabilities back). Host overhead is
 * the forward's wall time less the graph's GPU time; that difference is parted by replaying the same
 * graph on the step's own rows (squad_cuda_time_last_forward: restored blobs read in place, answer
 * slots) where the ablation's replays run synthetic rows (their states in their own slots). */
#define ABL_BATCH_STATES 16
static const struct {
    int n, q, shared;
} ABL_BATCH_CASES[] = {{1, 128, 1}, {16, 32, 1}, {16, 32, 0}, {16, 128, 1}, {16, 128, 0}};

/* One case's restore and forward through the backend (p50 of reps): restores from G / KV (state i
 * of row i, or state 0 for every row), then the forward of n Q-token chunks with one answer slot. */
static int abl_batch_step(squad_backend *be, void **G, void **KV, int n, int q, int shared, int reps, int V,
                          double *restore_ms, double *forward_ms, squad_err *err) {
    double *ta = calloc((size_t)reps, sizeof(double)), *tb = calloc((size_t)reps, sizeof(double));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * q), letters[N_LETTERS];
    float *probs = malloc(sizeof(float) * (size_t)n * SQUAD_MAX_LETTERS);
    squad_chunk *ck = calloc((size_t)n, sizeof *ck);
    int rc = ta && tb && ids && probs && ck ? 0 : SQUAD_E_NOMEM;
    if (rc) snprintf(err->msg, sizeof err->msg, "out of memory");
    for (int i = 0; i < N_LETTERS; i++) letters[i] = 32 + 3 * i;
    for (int r = -2; r < reps && !rc; r++) {
        fill(ids, n * q, V);
        batch_chunks(ck, n, q, ids, letters, probs);
        const double t0 = squad_now_seconds();
        rc = batch_restore(be, n, shared, G, KV, err);
        if (!rc && cudaDeviceSynchronize() != cudaSuccess) rc = SQUAD_E_BACKEND;
        const double t1 = squad_now_seconds();
        if (!rc) rc = be->forward(be, ck, n, err);
        const double t2 = squad_now_seconds();
        if (r >= 0) {
            ta[r] = (t1 - t0) * 1e3;
            tb[r] = (t2 - t1) * 1e3;
        }
    }
    if (!rc) {
        *restore_ms = median_of(ta, reps);
        *forward_ms = median_of(tb, reps);
    }
    free(ta), free(tb), free(ids), free(probs), free(ck);
    return rc;
}

static int batch_ablate(squad_model *m, int reps) {
    squad_err err = {0};
    squad_backend *be = batch_backend(m, &err);
    if (!be) {
        fprintf(stderr, "bench_gpu --batch --ablate: %s\n", err.msg);
        return 1;
    }
    /* the cached states: rows of STATE_LEN pseudo-random tokens (real values: zeros can time
     * differently) */
    void *G[ABL_BATCH_STATES] = {0}, *KV[ABL_BATCH_STATES] = {0};
    int rc = batch_states(be, ABL_BATCH_STATES, m->cfg.vocab_size, G, KV, &err);
    printf("\nbatch ablation: each case's batch graph replayed (median of %d), kernel groups left out (GPU ms)\n", reps);
    printf("| case |");
    for (int j = 0; j < N_SETS; j++) printf(" %s |", SETS[j].name);
    printf(" engine graph | graph + params (host) | restore (host) | forward (host) | engine graph on the step's rows |"
           "\n| --- |");
    for (int j = 0; j < N_SETS + 5; j++) printf(" ---: |");
    printf("\n");
    const int n_cases = (int)(sizeof ABL_BATCH_CASES / sizeof ABL_BATCH_CASES[0]);
    double t[sizeof ABL_BATCH_CASES / sizeof ABL_BATCH_CASES[0]][N_SETS];
    double eng[sizeof ABL_BATCH_CASES / sizeof ABL_BATCH_CASES[0]], prm[sizeof ABL_BATCH_CASES / sizeof ABL_BATCH_CASES[0]];
    double rst[sizeof ABL_BATCH_CASES / sizeof ABL_BATCH_CASES[0]], fwd[sizeof ABL_BATCH_CASES / sizeof ABL_BATCH_CASES[0]];
    double own[sizeof ABL_BATCH_CASES / sizeof ABL_BATCH_CASES[0]];
    for (int i = 0; i < n_cases && !rc; i++) {
        const int n = ABL_BATCH_CASES[i].n, q = ABL_BATCH_CASES[i].q, sh = ABL_BATCH_CASES[i].shared;
        printf("| %d x %d on %s |", n, q, sh ? "one state" : "N states");
        for (int j = 0; j < N_SETS && !rc; j++) {
            squad_cuda_timing tm;
            rc = squad_cuda_time_batch_parts(be, n, sh, STATE_LEN, q, SETS[j].parts, reps, &tm, &err);
            if (rc) break;
            t[i][j] = tm.gpu_ms;
            if (j == SET_ALL) eng[i] = tm.engine_gpu_ms, prm[i] = tm.params_wall_ms;
            printf(" %.3f |", tm.gpu_ms);
        }
        if (!rc) rc = abl_batch_step(be, G, KV, n, q, sh, reps, m->cfg.vocab_size, &rst[i], &fwd[i], &err);
        squad_cuda_timing lf; /* the same graph on the rows the step just ran (restored blobs, answers) */
        if (!rc) rc = squad_cuda_time_last_forward(be, n, STATE_LEN, q, reps, &lf, &err);
        if (!rc) own[i] = lf.gpu_ms;
        if (!rc) printf(" %.3f | %.3f | %.3f | %.3f | %.3f |\n", eng[i], prm[i], rst[i], fwd[i], own[i]);
        fflush(stdout);
    }
    if (!rc) { /* the shares: a group's time is the whole graph's less the graph without it */
        static const struct {
            const char *name;
            int set;
        } groups[] = {{"GEMMs", SET_NO_GEMM},        {"GDN (all four)", SET_NO_GDN}, {"gdn conv", SET_NO_GDN_CONV},
                      {"gdn prep", SET_NO_GDN_PREP}, {"gdn scan", SET_NO_GDN_SCAN},  {"gdn out", SET_NO_GDN_OUT},
                      {"attention (all three)", SET_NO_ATTN}, {"att prep", SET_NO_ATT_PREP},
                      {"att fwd", SET_NO_ATT_FWD},   {"att combine", SET_NO_ATT_COMBINE}, {"norms", SET_NO_NORM},
                      {"silu*up", SET_NO_SILU}};
        printf("\nbatched step's shares (ms, and %% of restore + forward on the host)\n| part |");
        for (int i = 0; i < n_cases; i++)
            printf(" %d x %d %s |", ABL_BATCH_CASES[i].n, ABL_BATCH_CASES[i].q, ABL_BATCH_CASES[i].shared ? "one" : "N");
        printf("\n| --- |");
        for (int i = 0; i < n_cases; i++) printf(" ---: |");
        printf("\n");
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
            printf("| %s |", groups[g].name);
            for (int i = 0; i < n_cases; i++) {
                const double d = t[i][SET_ALL] - t[i][groups[g].set];
                printf(" %.3f (%.0f%%) |", d, 100 * d / (rst[i] + fwd[i]));
            }
            printf("\n");
        }
        printf("| graph skeleton (nothing) |");
        for (int i = 0; i < n_cases; i++) printf(" %.3f (%.0f%%) |", t[i][SET_NOTHING], 100 * t[i][SET_NOTHING] / (rst[i] + fwd[i]));
        printf("\n| whole graph (GPU) |");
        for (int i = 0; i < n_cases; i++) printf(" %.3f (%.0f%%) |", t[i][SET_ALL], 100 * t[i][SET_ALL] / (rst[i] + fwd[i]));
        printf("\n| host: forward - graph |");
        for (int i = 0; i < n_cases; i++) printf(" %.3f (%.0f%%) |", fwd[i] - eng[i], 100 * (fwd[i] - eng[i]) / (rst[i] + fwd[i]));
        printf("\n| of which the step's rows' data: graph on them - graph |");
        for (int i = 0; i < n_cases; i++) printf(" %.3f |", own[i] - eng[i]);
        printf("\n| of which the host: forward - graph on the step's rows |");
        for (int i = 0; i < n_cases; i++) printf(" %.3f |", fwd[i] - own[i]);
        printf("\n| restore |");
        for (int i = 0; i < n_cases; i++) printf(" %.3f (%.0f%%) |", rst[i], 100 * rst[i] / (rst[i] + fwd[i]));
        printf("\n| restore + forward: questions/s |");
        for (int i = 0; i < n_cases; i++) printf(" %.3f ms: %.0f/s |", rst[i] + fwd[i], ABL_BATCH_CASES[i].n / ((rst[i] + fwd[i]) * 1e-3));
        printf("\n");
    }
    if (rc) fprintf(stderr, "bench_gpu --batch --ablate: %s\n", err.msg);
    for (int s = 0; s < ABL_BATCH_STATES; s++) {
        be->release(be, G[s]);
        be->release(be, KV[s]);
    }
    be->destroy(be);
    return rc ? 1 : 0;
}
#endif

/* --ablate: each case's chunk graph replayed with one kernel group left out at a time, so each group's
 * cost inside the real graph is the full time minus the time without it. */
static int ablate(squad_model *m, int reps) {
#ifdef SQUAD_HAVE_CUDA
    squad_err err = {0};
    squad_engine *e = open_engine(m, 0, SQUAD_PRECISION_DEFAULT, 0, &err);
    if (!e) {
        fprintf(stderr, "bench_gpu: engine: %s\n", err.msg);
        return 2;
    }
    static const struct {
        const char *name;
        int start, len;
    } cases[] = {{"hit 4096+32", STATE_LEN, 32}, {"hit 4096+128", STATE_LEN, 128}, {"hit 4096+512", STATE_LEN, 512},
                 {"cold 2048", 0, 2048},        {"cold 4096", 0, 4096},
                 /* an 8192-token row's second chunk: with cold 4096, a long prefill's per-layer shares */
                 {"8192: 4096+4096", STATE_LEN, 4096}};
    printf("\nablation: one chunk's graph replayed (median of %d), kernel groups left out (ms; max chunk %d)\n",
           reps, e->be->max_chunk);
    printf("| chunk |");
    for (int j = 0; j < N_SETS; j++) printf(" %s |", SETS[j].name);
    printf(" all, on the host |\n| --- |");
    for (int j = 0; j < N_SETS; j++) printf(" ---: |");
    printf(" --- |\n");
    int rc = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !rc; i++) {
        if (cases[i].len > e->be->max_chunk) continue;
        printf("| %s |", cases[i].name);
        squad_cuda_timing all = {0, 0, 0, 0, 0, 0};
        for (int j = 0; j < N_SETS && !rc; j++) {
            squad_cuda_timing tm;
            rc = squad_cuda_time_parts(e->be, cases[i].start, cases[i].len, SETS[j].parts, reps, &tm, &err);
            if (!rc) printf(" %.3f |", tm.gpu_ms);
            if (!rc && j == 0) all = tm;
        }
        printf(" host: %.3f ms a replay (launch + wait), %.3f in cudaGraphLaunch; the engine's graph %.3f (host %.3f, "
               "with the parameters' upload %.3f) |\n",
               all.wall_ms, all.launch_ms, all.engine_gpu_ms, all.engine_wall_ms, all.params_wall_ms);
        fflush(stdout);
    }
    if (!rc) rc = hit_outside_graph(e->be, reps, m->cfg.vocab_size, &err);
    if (rc) fprintf(stderr, "bench_gpu: ablation: %s\n", err.msg);
    squad_engine_free(e);
    return rc ? 1 : 0;
#else
    (void)m;
    (void)reps;
    fprintf(stderr, "bench_gpu: --ablate needs the CUDA backend\n");
    return 2;
#endif
}

/* ---- --long ---- */

/* Device memory in use now (total - free), in MB; -1 without CUDA. */
static double device_used_mb(void) {
#ifdef SQUAD_HAVE_CUDA
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return -1;
    return (double)(total_b - free_b) / 1048576.0;
#else
    return -1;
#endif
}

/* Positions the engine's working K / V holds now. */
static int kv_held(const squad_engine *e) { return e->be->kv_positions; }

typedef struct long_row {
    int32_t *ids, slots[1], nopts[1], letters[N_LETTERS];
    squad_row row;
} long_row;

static void long_make(long_row *b, int n, int state_len) {
    b->slots[0] = n - 1;
    b->nopts[0] = N_LETTERS;
    for (int i = 0; i < N_LETTERS; i++) b->letters[i] = 32 + 3 * i;
    b->row = (squad_row){b->ids, n, b->slots, b->nopts, 1, b->letters, N_LETTERS, state_len, 0, NULL, 0};
}

/* Times reps rows (after one warm-up) of n tokens whose ids from `fixed` on are fresh each time;
 * the last row's answer in *last. */
static int long_time(squad_engine *e, long_row *b, int n, int state_len, int fixed, int reps, int vocab, double *p50,
                     double *min_ms, squad_result *last, squad_err *err) {
    double *t = calloc((size_t)reps, sizeof *t);
    if (!t) return SQUAD_E_NOMEM;
    for (int r = -1; r < reps; r++) {
        fill(b->ids + fixed, n - fixed, vocab);
        long_make(b, n, state_len);
        const double t0 = squad_now_seconds();
        const int rc = squad_engine_score(e, &b->row, last, err);
        if (rc) {
            free(t);
            return rc;
        }
        if (r >= 0) t[r] = (squad_now_seconds() - t0) * 1e3;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    *p50 = t[reps / 2];
    *min_ms = t[0];
    free(t);
    return 0;
}

static int long_bench(squad_model *m, int reps, double bw, double tflops) {
    squad_err err = {0};
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = SQUAD_DEVICE_CUDA;
    o.cache.budget_bytes = 0;
    o.max_tokens = 0; /* the model's positions, or what the memory holds */
    const double base_mb = device_used_mb();
    squad_engine *cold = squad_engine_new(m, &o, &err);
    o.cache.budget_bytes = LONG_CACHE_BYTES;
    squad_engine *hot = cold ? squad_engine_new(m, &o, &err) : NULL;
    const int max_row = LONG_LENGTHS[N_LONG - 1] + LONG_QUESTION;
    long_row *b = calloc(1, sizeof *b);
    squad_result *res = calloc(1, sizeof *res), *ref = calloc(1, sizeof *ref);
    if (b) b->ids = malloc(sizeof(int32_t) * (size_t)max_row);
    if (!cold || !hot || !b || !b->ids || !res || !ref) {
        fprintf(stderr, "bench_gpu --long: %s\n", err.msg[0] ? err.msg : "out of memory");
        return 2;
    }
    squad_limit why;
    const int limit = squad_engine_max_tokens(cold, &why);
    printf("long rows: engines take up to %d tokens (%s); device memory in use before them %.0f MB, after %.0f MB\n",
           limit, why == SQUAD_LIMIT_MEMORY ? "bounded by memory, not the model" : "the model's positions", base_mb,
           device_used_mb());
    printf("| case | p50 ms | min ms | floor ms | p50 / floor | K / V positions held | device MB in use | "
           "max |p_hit - p_cold| |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    int rc = 0;
    for (int k = 0; k < N_LONG && !rc; k++) {
        const int n = LONG_LENGTHS[k];
        if (n + LONG_QUESTION > limit) {
            printf("| cold %d | (past the engine's %d tokens) | | | | | | |\n", n, limit);
            continue;
        }
        double p50 = 0, mn = 0;
        rc = long_time(cold, b, n, -1, 0, reps, m->cfg.vocab_size, &p50, &mn, res, &err);
        if (rc) break;
        cost c = cost_of(&m->cfg, n, 0);
        double tf = c.flops / (tflops * 1e12) * 1e3, tb = c.bytes / (bw * 1e9) * 1e3, fl = tf > tb ? tf : tb;
        printf("| cold %d | %.2f | %.2f | %.2f | %.1fx | %d | %.0f | - |\n", n, p50, mn, fl, p50 / fl, kv_held(cold),
               device_used_mb());
        fflush(stdout);
        /* the state: cached by its first row, then fresh questions (each a hit) */
        const int len = n + LONG_QUESTION;
        fill(b->ids, n, m->cfg.vocab_size);
        fill(b->ids + n, LONG_QUESTION, m->cfg.vocab_size);
        long_make(b, len, n);
        if ((rc = squad_engine_score(hot, &b->row, res, &err))) break;
        rc = long_time(hot, b, len, n, n, reps, m->cfg.vocab_size, &p50, &mn, res, &err);
        if (rc) break;
        /* the last question computed cold: cached = uncached */
        if ((rc = squad_engine_score(cold, &b->row, ref, &err))) break;
        double d = 0;
        for (int i = 0; i < N_LETTERS; i++) d = fmax(d, fabs((double)res->probs[0][i] - (double)ref->probs[0][i]));
        c = cost_of(&m->cfg, LONG_QUESTION, n);
        tf = c.flops / (tflops * 1e12) * 1e3, tb = c.bytes / (bw * 1e9) * 1e3, fl = tf > tb ? tf : tb;
        squad_cache_stats st;
        squad_engine_cache_stats(hot, &st);
        printf("| hit %d+%d | %.3f | %.3f | %.3f | %.1fx | %d | %.0f (cache %.0f MB) | %.2e |\n", n, LONG_QUESTION, p50,
               mn, fl, p50 / fl, kv_held(hot), device_used_mb(), st.bytes_held / 1048576.0, d);
        if (res->computed != LONG_QUESTION)
            printf("note: hit %d computed %d tokens (expected %d from the cache)\n", n, res->computed, LONG_QUESTION);
        fflush(stdout);
    }
    if (rc) fprintf(stderr, "bench_gpu --long: %s\n", err.msg);
    free(b->ids);
    free(b);
    free(res);
    free(ref);
    squad_engine_free(hot);
    squad_engine_free(cold);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *rows_path = NULL, *json_path = NULL, *profile = NULL;
    int reps = 20, do_ablate = 0, do_long = 0, do_batch = 0, reps_given = 0;
    double bw = 4300, tflops = 790;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model_dir = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]), reps_given = 1;
        else if (!strcmp(argv[i], "--long"))
            do_long = 1;
        else if (!strcmp(argv[i], "--batch"))
            do_batch = 1;
        else if (!strcmp(argv[i], "--bw") && i + 1 < argc)
            bw = atof(argv[++i]);
        else if (!strcmp(argv[i], "--tflops") && i + 1 < argc)
            tflops = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rows-out") && i + 1 < argc)
            rows_path = argv[++i];
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json_path = argv[++i];
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc)
            profile = argv[++i];
        else if (!strcmp(argv[i], "--ablate"))
            do_ablate = 1;
        else {
            fprintf(stderr, "usage: bench_gpu --model DIR [--reps N] [--bw GB/s] [--tflops T] [--rows-out FILE] "
                            "[--json FILE] [--ablate] [--long] [--batch]\n");
            return 2;
        }
    }
    if (!model_dir || reps < 1) {
        fprintf(stderr, "bench_gpu: --model DIR is required\n");
        return 2;
    }
    squad_err err = {0};
    const double tl = squad_now_seconds();
    squad_model *m = squad_model_load(model_dir, &err);
    if (!m) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return 2;
    }
    printf("model %s loaded in %.2f s (H %d, %d layers, vocab %d)\n", model_dir, squad_now_seconds() - tl,
           m->cfg.hidden_size, m->cfg.num_layers, m->cfg.vocab_size);
    const int vocab = m->cfg.vocab_size;
    /* the batched cases (the backend's own batched forward: CUDA only); --batch before --ablate
     * alone, --ablate and --long before --profile */
    const int profile_batch = profile && !strncmp(profile, "batch:", 6) && !do_ablate && !do_long;
    if (do_batch || profile_batch) {
#ifdef SQUAD_HAVE_CUDA
        int rc = 0;
        if (do_batch && do_ablate) {
            rc = batch_ablate(m, reps);
        } else if (do_batch) {
            rc = batch_bench(m, reps_given ? reps : 30, bw, tflops);
        } else {
            int n = 0, q = 0;
            if (sscanf(profile + 6, "%dx%d", &n, &q) != 2) n = 0;
            rc = batch_profile(m, n, q);
        }
#else
        const int rc = 1;
        fprintf(stderr, "bench_gpu %s: built without CUDA\n",
                do_batch ? (do_ablate ? "--batch --ablate" : "--batch") : "--profile batch");
#endif
        squad_model_free(m);
        return rc;
    }
    if (do_ablate) {
        const int rc = ablate(m, reps);
        squad_model_free(m);
        return rc;
    }
    if (do_long) { /* a cold 131072-token row takes seconds: fewer repetitions unless asked */
        const int rc = long_bench(m, reps_given ? reps : 3, bw, tflops);
        squad_model_free(m);
        return rc;
    }
    if (profile) { /* one row of the case between cudaProfilerStart / Stop (run under ncu) */
        int n = 0;
        const int hit = !strncmp(profile, "hit:", 4);
        n = atoi(profile + (hit ? 4 : 5));
        squad_engine *e = open_engine(m, hit ? (size_t)1 << 30 : 0, SQUAD_PRECISION_DEFAULT, 0, &err);
        bench_row *b = calloc(1, sizeof *b);
        squad_result *res = calloc(1, sizeof *res);
        if (!e || !b || !res || n < 1 || n > MAX_ROW - STATE_LEN) {
            fprintf(stderr, "bench_gpu: --profile cold:N | hit:Q (%s)\n", e ? "" : err.msg);
            return 2;
        }
        const int len = hit ? STATE_LEN + n : n;
        fill(b->ids, len, vocab);
        for (int r = 0; r < 3; r++) { /* the state into the cache, graphs warm */
            fill(b->ids + (hit ? STATE_LEN : 0), len - (hit ? STATE_LEN : 0), vocab);
            make_row(b, len, hit ? STATE_LEN : -1, vocab);
            if (squad_engine_score(e, &b->row, res, &err)) {
                fprintf(stderr, "bench_gpu: %s\n", err.msg);
                return 1;
            }
        }
        fill(b->ids + (hit ? STATE_LEN : 0), len - (hit ? STATE_LEN : 0), vocab);
        make_row(b, len, hit ? STATE_LEN : -1, vocab);
#ifdef SQUAD_HAVE_CUDA
        cudaProfilerStart();
#endif
        const double tp = squad_now_seconds();
        const int rc = squad_engine_score(e, &b->row, res, &err);
        const double dt = squad_now_seconds() - tp;
#ifdef SQUAD_HAVE_CUDA
        cudaProfilerStop();
#endif
        printf("profile %s: %.3f ms, computed %d, reused %d%s%s\n", profile, dt * 1e3, res->computed, res->reused,
               rc ? ": " : "", rc ? err.msg : "");
        squad_engine_free(e);
        free(b);
        free(res);
        squad_model_free(m);
        return rc ? 1 : 0;
    }
    double t0 = squad_now_seconds();
    squad_engine *cold = open_engine(m, 0, SQUAD_PRECISION_DEFAULT, 1, &err);
    if (!cold) {
        fprintf(stderr, "bench_gpu: engine: %s\n", err.msg);
        return 2;
    }
    printf("cold engine ready in %.2f s (device %s)\n", squad_now_seconds() - t0, squad_engine_device(cold));
    print_capture(cold, "cold engine");
    t0 = squad_now_seconds();
    squad_engine *hot = open_engine(m, (size_t)4 << 30, SQUAD_PRECISION_DEFAULT, 1, &err);
    if (!hot) {
        fprintf(stderr, "bench_gpu: engine: %s\n", err.msg);
        return 2;
    }
    printf("cache engine ready in %.2f s\n", squad_now_seconds() - t0);
    const int outside_known = forward_timer_wrap(cold->be, squad_now_seconds) == 0 &&
                              forward_timer_wrap(hot->be, squad_now_seconds) == 0;
    if (!outside_known) printf("note: the two engines' forwards differ; the time outside it is left out\n");
    t0 = squad_now_seconds();
    squad_engine *exact = open_engine(m, 0, SQUAD_PRECISION_EXACT, 0, &err);
    if (!exact) fprintf(stderr, "bench_gpu: exact engine: %s (exact figures left out)\n", err.msg);
    else printf("exact engine ready in %.2f s\n", squad_now_seconds() - t0);
    FILE *rows_out = rows_path ? fopen(rows_path, "w") : NULL;
    bench_row *b = calloc(1, sizeof *b);
    result res[8];
    int nres = 0, rc = 0;
    const int cold_n[4] = {512, 2048, 4096, 8192};
    const double cold_target[4] = {0, 0, 12.0, 0};
    for (int i = 0; i < 4 && !rc; i++) {
        result *r = &res[nres++];
        memset(r, 0, sizeof *r);
        snprintf(r->name, sizeof r->name, "cold %d", cold_n[i]);
        r->tokens = cold_n[i];
        r->c = cost_of(&m->cfg, cold_n[i], 0);
        r->target_ms = cold_target[i];
        rc = time_case(cold, exact, b, cold_n[i], -1, 0, reps, vocab, r, rows_out, "cold");
    }
    /* hits: one state, cached by its first row, then fresh questions */
    const int q_n[3] = {32, 128, 512};
    const double q_target[3] = {0, 1.0, 0};
    fill(b->ids, STATE_LEN, vocab);
    for (int i = 0; i < 3 && !rc; i++) {
        result *r = &res[nres++];
        memset(r, 0, sizeof *r);
        snprintf(r->name, sizeof r->name, "hit %d+%d", STATE_LEN, q_n[i]);
        r->tokens = q_n[i];
        r->c = cost_of(&m->cfg, q_n[i], STATE_LEN);
        r->target_ms = q_target[i];
        rc = time_case(hot, exact, b, STATE_LEN + q_n[i], STATE_LEN, STATE_LEN, reps, vocab, r, rows_out, "hit");
        if (!rc && r->computed != q_n[i])
            printf("note: %s computed %d tokens (expected %d: the state should come from the cache)\n", r->name,
                   r->computed, q_n[i]);
    }
    if (rows_out) fclose(rows_out);
    if (rc) return 1;
#ifdef SQUAD_HAVE_CUDA
    /* the hit's time outside the engine: the same backend, restore + forward without the cache */
    if (hit_outside_graph(hot->be, reps, vocab, &err)) fprintf(stderr, "bench_gpu: %s\n", err.msg);
#endif
    squad_cache_stats st;
    squad_engine_cache_stats(hot, &st);
    printf("cache: rows %llu, hits %llu, partial %llu, cold %llu, checkpoints %llu, %.1f MB held\n",
           (unsigned long long)st.rows, (unsigned long long)st.hits, (unsigned long long)st.partial,
           (unsigned long long)st.cold, (unsigned long long)st.checkpoints, st.bytes_held / 1048576.0);
    printf("\nceilings: %.0f TFLOP/s bf16, %.0f GB/s; %d reps per case (after 2 warm-ups)\n", tflops, bw, reps);
    printf("| case | p50 ms | min ms | tokens/s (p50) | GFLOP | MB moved | floor ms | p50 / floor | target ms |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    FILE *jf = json_path ? fopen(json_path, "w") : NULL;
    for (int i = 0; i < nres; i++) {
        const result *r = &res[i];
        const double tf = r->c.flops / (tflops * 1e12) * 1e3, tb = r->c.bytes / (bw * 1e9) * 1e3;
        const double floor_ms = tf > tb ? tf : tb;
        char tgt[32] = "-";
        if (r->target_ms > 0) snprintf(tgt, sizeof tgt, "%.1f%s", r->target_ms, r->p50_ms <= r->target_ms ? " (met)" : " (MISSED)");
        printf("| %s | %.3f | %.3f | %.0f | %.1f | %.1f | %.3f (%s) | %.1fx | %s |\n", r->name, r->p50_ms, r->min_ms,
               r->tokens / (r->p50_ms * 1e-3), r->c.flops / 1e9, r->c.bytes / 1e6, floor_ms, tf > tb ? "FLOPs" : "bytes",
               r->p50_ms / floor_ms, tgt);
        if (jf)
            fprintf(jf,
                    "{\"case\": \"%s\", \"p50_ms\": %.4f, \"min_ms\": %.4f, \"gflop\": %.2f, \"mbytes\": %.2f, "
                    "\"floor_ms\": %.4f, \"outside_forward_us\": %.1f}\n",
                    r->name, r->p50_ms, r->min_ms, r->c.flops / 1e9, r->c.bytes / 1e6, floor_ms,
                    outside_known ? r->outside_us : -1.0);
    }
    if (jf) fclose(jf);
    if (outside_known) {
        printf("\neach row's time outside the backend's forward (the engine's own work: the memo, the cache's plan "
               "and restore, the scheduler), p50 us:");
        for (int i = 0; i < nres; i++) printf("%s %s %.1f", i ? "," : "", res[i].name, res[i].outside_us);
        printf("\n");
    }
    printf("\nthe exact path (fp32, no cache: a hit row is computed whole), one row per case:\n");
    printf("| case | exact ms | max |p_bf16 - p_exact| |\n| --- | ---: | ---: |\n");
    for (int i = 0; i < nres && exact; i++) printf("| %s | %.1f | %.2e |\n", res[i].name, res[i].exact_ms, res[i].bf16_vs_exact);
    if (exact) squad_engine_free(exact);
    free(b);
    squad_engine_free(cold);
    squad_engine_free(hot);
    squad_model_free(m);
    return 0;
}
