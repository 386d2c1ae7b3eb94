/*
 * test_vocab.c — the full-vocabulary figures (squad_score_opts.want_vocab) of the CPU backend
 * against a plain full projection computed here in double precision.
 *
 * For a slot whose hidden row is still in the backend (the last chunk of the row), the test reads
 * that row (squad_cpu_backend_hidden), applies the final norm and multiplies it by every row of
 * the output embedding in double, and compares: vocab_lse and letters_lse within
 * TOL_VOCAB_EXACT_LSE relative, top_logit likewise, top_token equal wherever the two largest logits
 * are further apart than the tolerance, label_mass = exp(letters_lse - vocab_lse) (within
 * TOL_VOCAB_LABEL_MASS). A slot in an earlier chunk is compared with a reference backend run up to
 * it (its hidden row differs from the engine's by the GEMMs' round-off across chunk lengths: the
 * looser TOL_VOCAB_EXACT_CHUNKED). Models: the tiny preset with the Qwen tokenizer's
 * vocabulary (151k rows: many steps of the backend's vocabulary pass), the tiny preset itself
 * (300 rows, less than one step) and the untied fixture (lm_head apart from embed_tokens).
 * Paths: plain (several slots, one chunk and several), cached (cold, hit, memo), chunk splits, and
 * bf16 against the exact reference (within TOL_VOCAB_BF16_LSE). Bounds: tests/tolerances.h.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend.h"
#include "engine.h"
#include "model.h"
#include "squad.h"
#include "synth.h"
#include "testutil.h"
#include "tolerances.h"
#include "util.h"

/* Bounds (tests/tolerances.h), relative: TOL_VOCAB_EXACT_LSE for the same hidden row
 * (docs/decisions-api.md section D); TOL_VOCAB_EXACT_CHUNKED for a slot's hidden row from a run of other
 * chunk lengths (the GEMMs' round-off differs with the chunk's shape, and the random test models
 * amplify it); TOL_VOCAB_BF16_LSE for the bf16 engine against the exact one. */
#define QWEN_TOKENIZER "third_party/qwen3/tokenizer.json"
#define UNTIED_FIXTURE "tests/fixtures/models/tiny-cond-untied"

/* ---- the reference ------------------------------------------------------------------------------ */

typedef struct ref_vocab {
    double vocab_lse, letters_lse, top_logit, second_logit;
    int top_token;
} ref_vocab;

/* The figures of a hidden row h (before the final norm), all in double. */
static void reference(const squad_model *m, const float *h, const int32_t *letters, int nopts, ref_vocab *r) {
    const int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    double *xn = malloc(sizeof(double) * (size_t)H), ss = 0;
    for (int i = 0; i < H; i++) ss += (double)h[i] * h[i];
    const double inv = 1.0 / sqrt(ss / H + m->cfg.rms_eps);
    for (int i = 0; i < H; i++) xn[i] = h[i] * inv * (1.0 + m->final_norm[i]);
    double *z = malloc(sizeof(double) * (size_t)V);
    r->top_logit = r->second_logit = -INFINITY;
    r->top_token = -1;
    for (int v = 0; v < V; v++) {
        const uint16_t *e = m->lm_head.w + (size_t)v * H;
        double d = 0;
        for (int i = 0; i < H; i++) d += xn[i] * squad_bf16_to_f32(e[i]);
        z[v] = d;
        if (d > r->top_logit) {
            r->second_logit = r->top_logit;
            r->top_logit = d;
            r->top_token = v;
        } else if (d > r->second_logit) {
            r->second_logit = d;
        }
    }
    double s = 0;
    for (int v = 0; v < V; v++) s += exp(z[v] - r->top_logit);
    r->vocab_lse = r->top_logit + log(s);
    double lm = -INFINITY, ls = 0;
    for (int l = 0; l < nopts; l++) lm = fmax(lm, z[letters[l]]);
    for (int l = 0; l < nopts; l++) ls += exp(z[letters[l]] - lm);
    r->letters_lse = lm + log(ls);
    free(z);
    free(xn);
}

static int rel_close(double a, double b, double tol) { return fabs(a - b) <= tol * fmax(1.0, fabs(b)); }

/* A result's figures at slot i against the reference. */
static void check_slot(const char *what, const squad_result *res, int i, const ref_vocab *r, double tol) {
    CHECKF(res->has_vocab == 1, "%s: has_vocab %d", what, res->has_vocab);
    CHECKF(rel_close(res->vocab_lse[i], r->vocab_lse, tol), "%s slot %d: vocab_lse %.9g vs %.9g", what, i,
           res->vocab_lse[i], r->vocab_lse);
    CHECKF(rel_close(res->letters_lse[i], r->letters_lse, tol), "%s slot %d: letters_lse %.9g vs %.9g", what, i,
           res->letters_lse[i], r->letters_lse);
    CHECKF(rel_close(res->top_logit[i], r->top_logit, tol), "%s slot %d: top_logit %.9g vs %.9g", what, i,
           res->top_logit[i], r->top_logit);
    if (r->top_logit - r->second_logit > 2 * tol * fmax(1.0, fabs(r->top_logit)))
        CHECKF(res->top_token[i] == r->top_token, "%s slot %d: top_token %d vs %d", what, i, res->top_token[i],
               r->top_token);
    const double mass = exp((double)res->letters_lse[i] - res->vocab_lse[i]);
    CHECKF(fabs(res->label_mass[i] - fmin(mass, 1.0)) <= TOL_VOCAB_LABEL_MASS && res->label_mass[i] > 0 &&
               res->label_mass[i] <= 1,
           "%s slot %d: label_mass %.9g, exp(letters - vocab) %.9g", what, i, res->label_mass[i], mass);
}

/* The hidden row of token q of a row, from a fresh run of the backend over [0, q + 1). */
static int hidden_by_run(squad_backend *be, const squad_row *row, int q, float *h, squad_err *err) {
    int rc = be->reset(be, 0, err);
    int s = 0;
    while (!rc && s <= q) {
        squad_chunk ck;
        memset(&ck, 0, sizeof ck);
        ck.ids = row->ids + s;
        ck.start = s;
        ck.len = q + 1 - s < be->max_chunk ? q + 1 - s : be->max_chunk;
        ck.letters = row->letters;
        ck.n_letters = row->n_letters;
        rc = squad_backend_forward1(be, &ck, NULL, err);
        if (!rc && s + ck.len > q) rc = squad_cpu_backend_hidden(be, q - s, h, err);
        s += ck.len;
    }
    return rc;
}

/* ---- models and rows ------------------------------------------------------------------------------ */

static squad_model *synth_model(const char *tokenizer, const char *name) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    squad_synth_opts so;
    memset(&so, 0, sizeof so);
    so.preset = "tiny";
    so.out_dir = dir;
    so.seed = 11;
    so.tokenizer = tokenizer;
    squad_err err = {0};
    if (squad_synth_write(&so, &err)) {
        fprintf(stderr, "synth %s: %s\n", name, err.msg);
        return NULL;
    }
    squad_model *m = squad_model_load(dir, &err);
    if (!m) fprintf(stderr, "load %s: %s\n", dir, err.msg);
    return m;
}

static squad_engine *engine_for(squad_model *m, squad_precision prec, size_t budget) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = SQUAD_DEVICE_CPU;
    o.threads = 2;
    o.precision = prec;
    o.cache.budget_bytes = budget;
    o.cache.min_prefix = 64;
    squad_err err = {0};
    squad_engine *e = squad_engine_new(m, &o, &err);
    if (!e) fprintf(stderr, "engine: %s\n", err.msg);
    return e;
}

static squad_backend *cpu_backend(squad_model *m, squad_precision prec) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.threads = 2;
    o.precision = prec;
    squad_err err = {0};
    squad_backend *be = squad_cpu_backend_new(m, &o, squad_model_max_tokens(m), &err);
    if (!be) fprintf(stderr, "backend: %s\n", err.msg);
    return be;
}

#define MAX_IDS 1400

typedef struct test_row {
    int32_t ids[MAX_IDS], slots[8], nopts[8], letters[6];
    squad_row row;
} test_row;

static void make_row(test_row *t, const squad_model *m, uint64_t seed, int n, const int *slots, int n_slots,
                     int state_len) {
    const int V = m->cfg.vocab_size;
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        t->ids[i] = (int32_t)(x % (uint64_t)V);
    }
    for (int l = 0; l < 6; l++) t->letters[l] = (int32_t)((l * 37 + 5) % V);
    for (int s = 0; s < n_slots; s++) {
        t->slots[s] = slots[s];
        t->nopts[s] = 2 + s % 5;
    }
    squad_row r = {t->ids, n, t->slots, t->nopts, n_slots, t->letters, 6, state_len, 0, NULL, 0};
    t->row = r;
}

/* The slots of a result whose hidden rows are still in the engine's backend (token >= last_start)
 * against the projection of those rows; the others against a reference run. */
static void check_result(const char *what, squad_engine *e, squad_backend *ref_be, const squad_row *row,
                         const squad_result *res, int last_start) {
    const squad_model *m = e->model;
    float *h = malloc(sizeof(float) * (size_t)m->cfg.hidden_size);
    squad_err err = {0};
    for (int i = 0; i < row->n_slots; i++) {
        const int q = row->slots[i];
        ref_vocab r;
        if (q >= last_start) {
            CHECKF(squad_cpu_backend_hidden(e->be, q - last_start, h, &err) == 0, "%s: %s", what, err.msg);
            reference(m, h, row->letters, row->nopts[i], &r);
            check_slot(what, res, i, &r, TOL_VOCAB_EXACT_LSE);
        } else {
            CHECKF(hidden_by_run(ref_be, row, q, h, &err) == 0, "%s: %s", what, err.msg);
            reference(m, h, row->letters, row->nopts[i], &r);
            check_slot(what, res, i, &r, TOL_VOCAB_EXACT_CHUNKED);
        }
    }
    free(h);
}

/* ---- the cases ----------------------------------------------------------------------------------- */

/* Plain rows: one chunk with four slots, then three chunks with slots in each. */
static void test_plain(squad_model *m, const char *name) {
    squad_engine *e = engine_for(m, SQUAD_PRECISION_EXACT, 0);
    squad_backend *ref_be = cpu_backend(m, SQUAD_PRECISION_EXACT);
    CHECK(e && ref_be);
    if (!e || !ref_be) goto out;
    squad_result *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    squad_err err = {0};
    test_row *t = malloc(sizeof *t);
    const squad_score_opts vo = {.want_vocab = 1};
    char what[128];

    const int one[4] = {100, 200, 250, 299};
    make_row(t, m, 1, 300, one, 4, -1);
    CHECKF(squad_engine_score_ex(e, &t->row, &vo, a, &err) == 0, "%s", err.msg);
    snprintf(what, sizeof what, "%s plain one chunk", name);
    check_result(what, e, ref_be, &t->row, a, 0);
    /* the figures do not touch the answer */
    CHECK(squad_engine_score(e, &t->row, b, &err) == 0 && b->has_vocab == 0);
    CHECKF(test_answer_diff(&t->row, a, b) == 0, "%s: probs moved with want_vocab", name);

    /* what asking costs here (printed, not checked: the machine is shared) */
    const int reps = 3;
    double t0 = squad_now_seconds();
    for (int k = 0; k < reps; k++) squad_engine_score(e, &t->row, b, &err);
    double t1 = squad_now_seconds();
    for (int k = 0; k < reps; k++) squad_engine_score_ex(e, &t->row, &vo, b, &err);
    double t2 = squad_now_seconds();
    printf("%s: a 300-token row with 4 slots %.1f ms, with the figures %.1f ms (vocabulary %d)\n", name,
           (t1 - t0) * 1e3 / reps, (t2 - t1) * 1e3 / reps, m->cfg.vocab_size);

    const int many[5] = {5, 511, 512, 1100, 1299};
    make_row(t, m, 2, 1300, many, 5, -1);
    CHECKF(squad_engine_score_ex(e, &t->row, &vo, a, &err) == 0, "%s", err.msg);
    snprintf(what, sizeof what, "%s plain three chunks", name);
    check_result(what, e, ref_be, &t->row, a, 1024);
    free(t);
    free(a);
    free(b);
out:
    squad_engine_free(e);
    if (ref_be) ref_be->destroy(ref_be);
}

/* Chunk splits through squad_engine_run_span: the figures of every split equal the one-pass run's
 * within the cross-chunk bound, and those of the last piece's slots the projection of its rows. */
static void test_splits(squad_model *m) {
    squad_engine *e = engine_for(m, SQUAD_PRECISION_EXACT, 0);
    squad_backend *ref_be = cpu_backend(m, SQUAD_PRECISION_EXACT);
    CHECK(e && ref_be);
    if (!e || !ref_be) goto out;
    squad_result *one = calloc(1, sizeof *one), *split = calloc(1, sizeof *split);
    squad_err err = {0};
    test_row *t = malloc(sizeof *t);
    const int slots[4] = {3, 64, 400, 699};
    make_row(t, m, 3, 700, slots, 4, -1);
    const squad_score_opts vo = {.want_vocab = 1};
    e->call = &vo; /* what squad_engine_score_ex sets while a row runs */
    CHECK(e->be->reset(e->be, 0, &err) == 0 && squad_engine_run_span(e, &t->row, 0, 700, one, &err) == 0);
    one->has_vocab = 1;
    for (int i = 0; i < 4; i++) one->label_mass[i] = (float)fmin(1.0, exp((double)one->letters_lse[i] - one->vocab_lse[i]));
    check_result("splits one pass", e, ref_be, &t->row, one, 512);
    const int pieces[][6] = {{1, 7, 64, 100, 700}, {4, 65, 401, 700}, {3, 4, 699, 700}};
    for (size_t p = 0; p < sizeof pieces / sizeof pieces[0]; p++) {
        memset(split, 0, sizeof *split);
        CHECK(e->be->reset(e->be, 0, &err) == 0);
        int s = 0, last = 0;
        for (int k = 0; pieces[p][k]; k++) {
            CHECKF(squad_engine_run_span(e, &t->row, s, pieces[p][k], split, &err) == 0, "%s", err.msg);
            last = s + (pieces[p][k] - s - 1) / e->be->max_chunk * e->be->max_chunk; /* its last chunk */
            s = pieces[p][k];
        }
        double worst = 0;
        for (int i = 0; i < 4; i++) {
            worst = fmax(worst, fabs(split->vocab_lse[i] - one->vocab_lse[i]) / fmax(1.0, fabs(one->vocab_lse[i])));
            worst = fmax(worst, fabs(split->letters_lse[i] - one->letters_lse[i]) / fmax(1.0, fabs(one->letters_lse[i])));
        }
        CHECKF(worst <= TOL_VOCAB_EXACT_CHUNKED, "split %zu: figures differ by %.3g relative", p, worst);
        /* the last piece is one chunk: its slots against the projection of its rows */
        float *h = malloc(sizeof(float) * (size_t)m->cfg.hidden_size);
        for (int i = 0; i < 4; i++) {
            if (t->slots[i] < last) continue;
            ref_vocab r;
            CHECK(squad_cpu_backend_hidden(e->be, t->slots[i] - last, h, &err) == 0);
            reference(m, h, t->letters, t->nopts[i], &r);
            split->has_vocab = 1;
            split->label_mass[i] = (float)fmin(1.0, exp((double)split->letters_lse[i] - split->vocab_lse[i]));
            check_slot("split last piece", split, i, &r, TOL_VOCAB_EXACT_LSE);
        }
        free(h);
    }
    e->call = NULL;
    free(t);
    free(one);
    free(split);
out:
    squad_engine_free(e);
    if (ref_be) ref_be->destroy(ref_be);
}

/* The cached path: a cold row, a hit with another question, the memo (which keeps the figures). */
static void test_cached(squad_model *m) {
    squad_engine *e = engine_for(m, SQUAD_PRECISION_EXACT, (size_t)64 << 20);
    squad_backend *ref_be = cpu_backend(m, SQUAD_PRECISION_EXACT);
    CHECK(e && ref_be);
    if (!e || !ref_be) goto out;
    squad_result *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    squad_err err = {0};
    test_row *t = malloc(sizeof *t);
    const squad_score_opts vo = {.want_vocab = 1};
    const int slots[3] = {300, 310, 330};
    make_row(t, m, 4, 331, slots, 3, 256);
    CHECKF(squad_engine_score_ex(e, &t->row, &vo, a, &err) == 0, "%s", err.msg);
    CHECK(a->reused == 0 && a->memo == 0);
    check_result("cached cold", e, ref_be, &t->row, a, 256);
    /* the same state, another question: a hit, the suffix one chunk from 256 */
    t->ids[320] = (t->ids[320] + 1) % m->cfg.vocab_size;
    CHECKF(squad_engine_score_ex(e, &t->row, &vo, a, &err) == 0, "%s", err.msg);
    CHECK(a->reused == 256 && a->memo == 0);
    check_result("cached hit", e, ref_be, &t->row, a, 256);
    /* the memo answers the repeat with the same figures */
    CHECK(squad_engine_score_ex(e, &t->row, &vo, b, &err) == 0 && b->memo == 1 && b->has_vocab == 1);
    int same = 1;
    for (int i = 0; i < 3; i++)
        same &= b->vocab_lse[i] == a->vocab_lse[i] && b->letters_lse[i] == a->letters_lse[i] &&
                b->top_logit[i] == a->top_logit[i] && b->top_token[i] == a->top_token[i] &&
                b->label_mass[i] == a->label_mass[i];
    CHECK(same && test_answer_diff(&t->row, a, b) == 0);
    /* a call that does not ask gets no figures from the same entry */
    CHECK(squad_engine_score(e, &t->row, b, &err) == 0 && b->memo == 1 && b->has_vocab == 0 && b->vocab_lse[0] == 0);
    /* an entry made without the figures does not answer a call that asks */
    t->ids[321] = (t->ids[321] + 1) % m->cfg.vocab_size;
    CHECK(squad_engine_score(e, &t->row, b, &err) == 0 && b->memo == 0);
    CHECK(squad_engine_score(e, &t->row, b, &err) == 0 && b->memo == 1);
    CHECK(squad_engine_score_ex(e, &t->row, &vo, a, &err) == 0 && a->memo == 0 && a->has_vocab == 1);
    check_result("cached after a memo entry without figures", e, ref_be, &t->row, a, 256);
    CHECK(squad_engine_score_ex(e, &t->row, &vo, b, &err) == 0 && b->memo == 1 && b->has_vocab == 1 &&
          b->vocab_lse[2] == a->vocab_lse[2]);
    free(t);
    free(a);
    free(b);
out:
    squad_engine_free(e);
    if (ref_be) ref_be->destroy(ref_be);
}

/* bf16: its own rows projected exactly (the pass is fp32), and within TOL_VOCAB_BF16_LSE of the
 * exact engine. */
static void test_bf16(squad_model *m) {
    squad_engine *e = engine_for(m, SQUAD_PRECISION_BF16, 0);
    squad_engine *x = engine_for(m, SQUAD_PRECISION_EXACT, 0);
    squad_backend *ref_be = cpu_backend(m, SQUAD_PRECISION_BF16);
    CHECK(e && x && ref_be);
    if (!e || !x || !ref_be) goto out;
    squad_result *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    squad_err err = {0};
    test_row *t = malloc(sizeof *t);
    const squad_score_opts vo = {.want_vocab = 1};
    const int slots[3] = {50, 150, 299};
    make_row(t, m, 5, 300, slots, 3, -1);
    CHECKF(squad_engine_score_ex(e, &t->row, &vo, a, &err) == 0, "%s", err.msg);
    check_result("bf16 own rows", e, ref_be, &t->row, a, 0);
    CHECKF(squad_engine_score_ex(x, &t->row, &vo, b, &err) == 0, "%s", err.msg);
    /* logits move with bf16 activations by about TOL_VOCAB_BF16_LSE of their scale (the vocabulary's
     * log-sum-exp), so letters_lse is held to that, and label_mass to the two bounds together */
    for (int i = 0; i < 3; i++) {
        const double scale = fmax(1.0, fabs(b->vocab_lse[i]));
        CHECKF(rel_close(a->vocab_lse[i], b->vocab_lse[i], TOL_VOCAB_BF16_LSE),
               "bf16 slot %d: vocab_lse %.6g vs exact %.6g", i, a->vocab_lse[i], b->vocab_lse[i]);
        CHECKF(fabs(a->letters_lse[i] - b->letters_lse[i]) <= TOL_VOCAB_BF16_LSE * scale,
               "bf16 slot %d: letters_lse %.6g vs %.6g", i, a->letters_lse[i], b->letters_lse[i]);
        CHECKF(fabs(log(a->label_mass[i]) - log(b->label_mass[i])) <= 2 * TOL_VOCAB_BF16_LSE * scale,
               "bf16 slot %d: label_mass %.6g vs %.6g", i, a->label_mass[i], b->label_mass[i]);
    }
    free(t);
    free(a);
    free(b);
out:
    squad_engine_free(e);
    squad_engine_free(x);
    if (ref_be) ref_be->destroy(ref_be);
}

int main(void) {
    struct stat st;
    squad_model *big = stat(QWEN_TOKENIZER, &st) == 0 ? synth_model(QWEN_TOKENIZER, "tiny-qwen-vocab") : NULL;
    CHECKF(big != NULL, "no model with the Qwen vocabulary (%s)", QWEN_TOKENIZER);
    squad_model *small = synth_model(NULL, "tiny");
    CHECK(small != NULL);
    squad_err err = {0};
    squad_model *untied = squad_model_load(UNTIED_FIXTURE, &err);
    CHECKF(untied != NULL, "%s: %s", UNTIED_FIXTURE, err.msg);
    if (untied) CHECK(untied->lm_head.w != untied->embed.w);
    if (big) {
        printf("vocabulary of %d rows\n", big->cfg.vocab_size);
        CHECK(big->cfg.vocab_size > 100000);
        test_plain(big, "qwen-vocab");
        test_splits(big);
        test_cached(big);
        test_bf16(big);
    }
    if (small) test_plain(small, "tiny");
    if (untied) {
        test_plain(untied, "untied");
        test_cached(untied);
    }
    squad_model_free(big);
    squad_model_free(small);
    squad_model_free(untied);
    return test_summary("test_vocab");
}
