/*
 * test_specialists_exec.c — rows run with specialists (docs/specialists.md) on the CPU backend:
 * routing, LoRA in the upper layers, and the state cache's guessed route and second pass.
 *
 * On the tiny preset with a synthesized specialists directory (split 2: adapters on layer 2, a
 * Gated DeltaNet layer, and layer 3, an attention layer; the router reading the state entering
 * layer 2), three rows share a 160-token prefix and differ in their suffix. The router is refitted
 * so the three rows route to three different labels. The references are computed apart from the
 * engine:
 *  - the router's features from the residual stream of a copy of the model cut at router.layer
 *    (squad_cpu_backend_hidden), so the route and probabilities come from the router alone;
 *  - each row's answer under every route from one backend forward with that route given
 *    explicitly (no engine, no cache), and, for the adapters, the trunk forward of a copy of the
 *    model whose adapted projections hold W + s B A merged (rounded to bf16, so it agrees only
 *    within TOL_CPU_LORA_MERGED, while the adapters move the answer by much more);
 * and then the engine, without and with the state cache, must give the same routes, router
 * probabilities and answers within 1e-4 for rows whose guess is right, rows whose guess is wrong
 * (the two-pass path, on purpose), rows forced to a specialist and repeats the memo answers,
 * with the misprediction counter counting exactly the wrong guesses.
 *
 * When tests/fixtures/specialists/ exists (tools/make_specialist_fixtures.py: transformers + peft,
 * a float64 reference from the saved files), its rows run in file order through an engine with the
 * state cache and one without, auto-routed and forced to every label: the same route, the router's
 * probabilities and the answers within 1e-4.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cache_internal.h"
#include "engine.h"
#include "model.h"
#include "rows.h"
#include "specialists.h"
#include "specialists_synth.h"
#include "synth.h"
#include "spec_rows.h"
#include "testutil.h"
#include "tolerances.h"
#include "util.h"

#define FIXTURE "tests/fixtures/specialists"

static squad_model *g_m;
static squad_specialists *g_sp;

static test_row g_rows[N_ROWS];
static int g_route[N_ROWS];                          /* the reference route of each row */
static float g_route_probs[N_ROWS][SQUAD_MAX_ROUTES]; /* and the router's probabilities */
static float g_ans[N_ROWS][3][2][SQUAD_MAX_LETTERS]; /* [row][route][slot]: answers by route */

static void make_rows(void) { spec_rows_make(g_rows, squad_model_vocab_size(g_m)); }

/* One forward of a whole row (one chunk) on a fresh CPU backend over model m, with `route`
 * (specialists when sp is given); probs [2][SQUAD_MAX_LETTERS]; hidden, when given, receives the
 * residual stream of every token ([n][H]). */
static int forward_row(const squad_model *m, const squad_specialists *sp, const squad_row *row, int route,
                       float probs[2][SQUAD_MAX_LETTERS], float *hidden) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.threads = 2;
    o.precision = SQUAD_PRECISION_EXACT;
    o.specialists = sp;
    squad_err err = {0};
    squad_backend *be = squad_cpu_backend_new(m, &o, 1024, &err);
    CHECKF(be != NULL, "backend: %s", err.msg);
    if (!be) return -1;
    squad_chunk ck;
    memset(&ck, 0, sizeof ck);
    ck.ids = row->ids;
    ck.len = row->n_ids;
    ck.letters = row->letters;
    ck.n_letters = row->n_letters;
    ck.route = route;
    if (probs) {
        ck.n_slots = row->n_slots;
        for (int i = 0; i < row->n_slots; i++) {
            ck.slots[i] = row->slots[i];
            ck.nopts[i] = row->nopts[i];
        }
    }
    int rc = be->reset(be, 0, &err);
    if (!rc) rc = squad_backend_forward1(be, &ck, probs ? &probs[0][0] : NULL, &err);
    CHECKF(rc == 0, "forward: %s", err.msg);
    const int H = m->cfg.hidden_size;
    for (int t = 0; !rc && hidden && t < row->n_ids; t++) rc = squad_cpu_backend_hidden(be, t, hidden + (size_t)t * H, &err);
    be->destroy(be);
    return rc;
}

/* The router's features of a row, from a copy of the model cut at router.layer. */
static void reference_features(const squad_row *row, squad_router_feat *f) {
    squad_model cut = *g_m;
    cut.cfg.num_layers = g_sp->router.layer;
    const int H = g_m->cfg.hidden_size;
    float *h = malloc(sizeof(float) * (size_t)H * (size_t)row->n_ids);
    if (!h) abort();
    squad_router_feat_reset(f);
    if (forward_row(&cut, NULL, row, 0, NULL, h) == 0) squad_router_feat_add(f, h, row->n_ids, (size_t)H, g_sp->router.eps);
    free(h);
}

/* The router refitted so row k routes to label k: w_k = f_k - mean f, bias_k = -w_k . mean f, so
 * logit_k(f_j) = (f_k - mean) . (f_j - mean), largest (with these rows) at k = j. The test then
 * takes whatever routes the refitted router gives as its reference, and checks they spread. */
static void refit_router(squad_router_feat feats[N_ROWS]) {
    const int H = g_sp->router.hidden;
    for (int i = 0; i < H; i++) {
        double mean = 0;
        for (int k = 0; k < N_ROWS; k++) mean += feats[k].sum[i] / (double)feats[k].count;
        mean /= N_ROWS;
        for (int k = 0; k < N_ROWS; k++) g_sp->router.weight[(size_t)k * H + i] = (float)(feats[k].sum[i] / (double)feats[k].count - mean);
    }
    for (int k = 0; k < N_ROWS; k++) {
        double b = 0;
        for (int i = 0; i < H; i++) {
            double mean = 0;
            for (int j = 0; j < N_ROWS; j++) mean += feats[j].sum[i] / (double)feats[j].count;
            b -= (double)g_sp->router.weight[(size_t)k * H + i] * (mean / N_ROWS);
        }
        g_sp->router.bias[k] = (float)b;
    }
}

/* A copy of the model whose projections in layers >= split hold bf16(W + s B A) for `route`. */
static int merged_model(squad_model *out, int route, uint16_t **owned, int *n_owned) {
    *out = *g_m;
    const squad_adapter *a = &g_sp->adapters[route];
    for (int l = g_sp->split; l < g_m->cfg.num_layers; l++) {
        squad_layer_weights *L = &out->layers[l];
        squad_mat *mats[SQUAD_PROJ_COUNT] = {&L->in_qkv, &L->in_z,   &L->in_b,     &L->in_a,  &L->out_proj, &L->q_proj,
                                             &L->k_proj, &L->v_proj, &L->o_proj,   &L->mlp_gate, &L->mlp_up, &L->mlp_down};
        for (int p = 0; p < SQUAD_PROJ_COUNT; p++) {
            const squad_lora_proj *lp = &a->proj[l][p];
            if (!lp->A) continue;
            squad_mat *W = mats[p];
            if (W->rows != lp->out || W->cols != lp->in) return -1;
            uint16_t *w = malloc(sizeof(uint16_t) * (size_t)W->rows * (size_t)W->cols);
            if (!w) return -1;
            for (int o = 0; o < W->rows; o++)
                for (int i = 0; i < W->cols; i++) {
                    double d = 0;
                    for (int k = 0; k < lp->r; k++) d += (double)lp->B[(size_t)o * lp->r + k] * lp->A[(size_t)k * lp->in + i];
                    const size_t at = (size_t)o * W->cols + i;
                    w[at] = squad_f32_to_bf16((float)(squad_bf16_to_f32(W->w[at]) + a->scale * d));
                }
            W->w = w;
            owned[(*n_owned)++] = w;
        }
    }
    return 0;
}

static double max_diff(const float a[2][SQUAD_MAX_LETTERS], const float b[2][SQUAD_MAX_LETTERS]) {
    double w = 0;
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < N_LETTERS; l++) {
            double d = fabs((double)a[s][l] - b[s][l]);
            if (!(d <= w)) w = d; /* NaN counts as the worst */
        }
    return w;
}

static void build_references(void) {
    squad_router_feat feats[N_ROWS];
    squad_err err = {0};
    for (int k = 0; k < N_ROWS; k++) {
        CHECK(squad_router_feat_init(&feats[k], g_m->cfg.hidden_size, &err) == 0);
        reference_features(&g_rows[k].row, &feats[k]);
    }
    refit_router(feats);
    int seen[3] = {0, 0, 0};
    for (int k = 0; k < N_ROWS; k++) {
        g_route[k] = squad_router_route(&g_sp->router, &feats[k], NULL, g_route_probs[k], &err);
        CHECKF(g_route[k] >= 0 && g_route[k] < 3, "route %d: %s", g_route[k], err.msg);
        if (g_route[k] >= 0 && g_route[k] < 3) seen[g_route[k]] = 1;
        squad_router_feat_free(&feats[k]);
    }
    /* the scenarios below need every label routed to */
    CHECKF(seen[0] && seen[1] && seen[2], "routes %d %d %d", g_route[0], g_route[1], g_route[2]);
    for (int k = 0; k < N_ROWS; k++)
        for (int r = 0; r < 3; r++) forward_row(g_m, g_sp, &g_rows[k].row, r, g_ans[k][r], NULL);
    /* the trunk route equals the model without specialists */
    float plain[2][SQUAD_MAX_LETTERS];
    forward_row(g_m, NULL, &g_rows[0].row, 0, plain, NULL);
    CHECK_NEAR(max_diff(plain, g_ans[0][0]), 0, 1e-6);
    /* each adapter against its merged model: close to it, and far from the trunk */
    for (int r = 1; r < 3; r++) {
        squad_model merged;
        uint16_t *owned[SQUAD_MAX_LAYERS * SQUAD_PROJ_COUNT];
        int n_owned = 0;
        CHECK(merged_model(&merged, r, owned, &n_owned) == 0);
        CHECK(n_owned == 8 + 7); /* layer 2 (GDN: 5 + 3) and layer 3 (attention: 4 + 3) */
        for (int k = 0; k < N_ROWS; k++) {
            float m[2][SQUAD_MAX_LETTERS];
            forward_row(&merged, NULL, &g_rows[k].row, 0, m, NULL);
            const double to_merged = max_diff(m, g_ans[k][r]), to_trunk = max_diff(g_ans[k][0], g_ans[k][r]);
            printf("route %d row %d: %.3g from the merged model, %.3g from the trunk\n", r, k, to_merged, to_trunk);
            CHECKF(to_merged <= TOL_CPU_LORA_MERGED, "route %d row %d: %g from the merged model", r, k, to_merged);
            CHECKF(to_trunk > 5 * TOL_CPU_LORA_MERGED, "route %d row %d: only %g from the trunk", r, k, to_trunk);
        }
        for (int i = 0; i < n_owned; i++) free(owned[i]);
    }
}

static squad_engine *open_engine(int cache) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = SQUAD_DEVICE_CPU;
    o.threads = 2;
    o.precision = SQUAD_PRECISION_EXACT;
    o.specialists = g_sp;
    o.max_adapters = 1;
    o.cache.align = 16;
    o.cache.tail = 16;
    o.cache.stride = 64;
    o.cache.min_prefix = 32;
    if (!cache) o.cache.budget_bytes = 0;
    squad_err err = {0};
    squad_engine *e = squad_engine_new(g_m, &o, &err);
    CHECKF(e != NULL, "engine: %s", err.msg);
    return e;
}

/* Scores row k (forced: a route, or -1 for the router) and checks it against the references. */
static void score_check(squad_engine *e, int k, int forced, int nopts0, int want_reused, int want_memo,
                        const char *what) {
    test_row *t = &g_rows[k];
    squad_row row = t->row;
    int32_t nopts[2] = {nopts0, t->nopts[1]};
    row.nopts = nopts;
    row.specialist = forced + 1;
    squad_result *res = calloc(1, sizeof *res);
    squad_err err = {0};
    int rc = squad_engine_score(e, &row, res, &err);
    CHECKF(rc == 0, "%s: %s", what, err.msg);
    const int route = forced >= 0 ? forced : g_route[k];
    CHECKF(res->route == route, "%s: route %d, expected %d", what, res->route, route);
    CHECKF(res->n_routes == 3, "%s: %d routes", what, res->n_routes);
    for (int r = 0; r < 3; r++) CHECK_NEAR(res->route_probs[r], g_route_probs[k][r], TOL_CPU_EXACT_REF);
    double w = 0;
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < nopts[s]; l++) {
            /* a slot's answer over its first nopts letters: the reference renormalised to them */
            double tot = 0;
            for (int j = 0; j < nopts[s]; j++) tot += g_ans[k][route][s][j];
            double d = fabs(res->probs[s][l] - g_ans[k][route][s][l] / tot);
            if (!(d <= w)) w = d;
        }
    CHECKF(w <= TOL_CPU_EXACT_REF, "%s: answer %g from the reference", what, w);
    if (want_reused >= 0) CHECKF(res->reused == want_reused, "%s: reused %d, expected %d", what, res->reused, want_reused);
    CHECKF(res->memo == want_memo, "%s: memo %d", what, res->memo);
    free(res);
}

static uint64_t mispredictions(squad_engine *e) {
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    return st.mispredictions;
}

/* Off the cache: the guess is the last row's route; a wrong one runs the row again. */
static void check_uncached(void) {
    squad_engine *e = open_engine(0);
    if (!e) return;
    int last = 0;
    uint64_t want = 0;
    const int order[] = {0, 1, 2, 2, 0, 1};
    for (int i = 0; i < 6; i++) {
        const int k = order[i];
        want += g_route[k] != last;
        last = g_route[k];
        score_check(e, k, -1, 4, 0, 0, "uncached");
        CHECKF(mispredictions(e) == want, "uncached row %d: %llu mispredictions, expected %llu", i,
               (unsigned long long)mispredictions(e), (unsigned long long)want);
    }
    for (int r = 0; r < 3; r++) score_check(e, 1, r, 4, 0, 0, "uncached forced");
    CHECK(mispredictions(e) == want); /* a forced route cannot miss */
    uint64_t total = 0;
    for (int r = 0; r < 3; r++) total += squad_engine_route_rows(e, r);
    CHECK(total == 9);
    squad_engine_free(e);
}

/* Through the cache: checkpoints carry their route; a wrong guess drops the first pass's
 * checkpoints and reruns from the right route's deepest checkpoint. */
static void check_cached(void) {
    squad_engine *e = open_engine(1);
    if (!e) return;
    const int p = PREFIX; /* a multiple of align */
    uint64_t want = 0;
    char why[256];
    /* cold: the guess is the trunk (no row before) */
    want += g_route[0] != 0;
    score_check(e, 0, -1, 4, 0, 0, "row 0 cold");
    CHECK(mispredictions(e) == want);
    /* row 1 restores row 0's checkpoint (route of row 0): a wrong guess, then cold under its own */
    want++;
    score_check(e, 1, -1, 4, 0, 0, "row 1 after row 0 (wrong guess)");
    CHECK(mispredictions(e) == want);
    CHECK(squad_cache_check(e->cache, why, sizeof why) == 0);
    /* row 1 again (another nopts: not the memo): its own route's checkpoint, the right guess */
    score_check(e, 1, -1, 3, p, 0, "row 1 again (right guess)");
    CHECK(mispredictions(e) == want);
    /* row 0 again: the guess prefers the last route (row 1's): wrong, then restored under row 0's */
    want++;
    score_check(e, 0, -1, 3, p, 0, "row 0 again (wrong guess, second pass restores)");
    CHECK(mispredictions(e) == want);
    /* row 2 forced to row 1's route: restores that route's checkpoint, cannot miss */
    score_check(e, 2, g_route[1], 4, p, 0, "row 2 forced");
    CHECK(mispredictions(e) == want);
    /* row 2 left to the router: the guess (the forced route, the last one) is wrong */
    want++;
    score_check(e, 2, -1, 4, 0, 0, "row 2 routed");
    CHECK(mispredictions(e) == want);
    /* repeats: the memo answers, and its key tells a forced row from a routed one */
    score_check(e, 2, -1, 4, PREFIX + SUFFIX, 1, "row 2 memo");
    score_check(e, 2, g_route[1], 4, PREFIX + SUFFIX, 1, "row 2 forced memo");
    score_check(e, 2, g_route[0], 4, p, 0, "row 2 forced to row 0's route");
    CHECK(mispredictions(e) == want);
    CHECKF(squad_cache_check(e->cache, why, sizeof why) == 0, "%s", why);
    squad_cache_stats st;
    squad_engine_cache_stats(e, &st);
    CHECK(st.memo_hits == 2);
    squad_engine_free(e);
}

static void check_bad_input(void) {
    squad_engine *e = open_engine(1);
    squad_err err = {0};
    squad_result *res = calloc(1, sizeof *res);
    squad_row row = g_rows[0].row;
    row.specialist = 4; /* routes 0..2 are 1..3 */
    CHECK(e && squad_engine_score(e, &row, res, &err) == SQUAD_E_INVALID && strstr(err.msg, "specialist"));
    row.specialist = -1;
    CHECK(e && squad_engine_score(e, &row, res, &err) == SQUAD_E_INVALID);
    squad_engine_free(e);
    /* an engine without specialists refuses a forced row */
    squad_engine *plain = squad_engine_new(g_m, NULL, &err);
    row.specialist = 1;
    CHECK(plain && squad_engine_score(plain, &row, res, &err) == SQUAD_E_INVALID);
    row.specialist = 0;
    CHECK(plain && squad_engine_score(plain, &row, res, &err) == 0 && res->route == 0 && res->n_routes == 0);
    squad_engine_free(plain);
    /* a backend route out of range */
    float probs[2][SQUAD_MAX_LETTERS];
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.specialists = g_sp;
    squad_backend *be = squad_cpu_backend_new(g_m, &o, 1024, &err);
    squad_chunk ck;
    memset(&ck, 0, sizeof ck);
    ck.ids = g_rows[0].ids;
    ck.len = 8;
    ck.route = 3;
    CHECK(be && be->reset(be, 0, &err) == 0 && squad_backend_forward1(be, &ck, &probs[0][0], &err) == SQUAD_E_INVALID);
    if (be) be->destroy(be);
    o.device = SQUAD_DEVICE_CPU;
    o.max_adapters = -1;
    CHECK(squad_engine_new(g_m, &o, &err) == NULL && err.code == SQUAD_E_INVALID);
    free(res);
}

/* The worst difference between an answer and a JSON [[...], ...] per slot (INFINITY on a shape
 * mismatch). */
static double json_probs_diff(const squad_result *r, const squad_row *row, json_t *probs) {
    if (!json_is_array(probs) || (int)json_array_size(probs) != row->n_slots) return INFINITY;
    double w = 0;
    for (int s = 0; s < row->n_slots; s++) {
        json_t *ps = json_array_get(probs, s);
        if ((int)json_array_size(ps) != row->nopts[s]) return INFINITY;
        for (int l = 0; l < row->nopts[s]; l++) {
            double d = fabs(json_number_value(json_array_get(ps, l)) - r->probs[s][l]);
            if (!(d <= w)) w = d;
        }
    }
    return w;
}

static void check_fixture(void) {
    if (access(FIXTURE "/manifest.json", R_OK) != 0) {
        printf("no %s: the transformers + peft comparison did not run\n", FIXTURE);
        return;
    }
    squad_err err = {0};
    squad_model *m = squad_model_load(FIXTURE "/base", &err);
    CHECKF(m != NULL, "fixture model: %s", err.msg);
    squad_specialists *sp = m ? squad_specialists_load(m, FIXTURE "/specialists", &err) : NULL;
    CHECKF(sp != NULL, "fixture specialists: %s", err.msg);
    int nr = 0, ne = 0;
    char **rows = test_read_lines(FIXTURE "/rows.jsonl", &nr), **exp = test_read_lines(FIXTURE "/expected.jsonl", &ne);
    CHECKF(nr > 0 && nr == ne, "fixture: %d rows, %d expected", nr, ne);
    squad_result *res = malloc(sizeof *res);
    for (int cache = 0; sp && res && cache < 2; cache++) {
        squad_engine_opts o;
        squad_engine_opts_default(&o);
        o.device = SQUAD_DEVICE_CPU;
        o.threads = 2;
        o.precision = SQUAD_PRECISION_EXACT;
        o.specialists = sp;
        o.cache.align = 16;
        o.cache.min_prefix = 32;
        if (!cache) o.cache.budget_bytes = 0;
        squad_engine *e = squad_engine_new(m, &o, &err);
        CHECKF(e != NULL, "fixture engine: %s", err.msg);
        double worst = 0;
        for (int i = 0; e && i < nr && i < ne; i++) {
            squad_row_buf rb;
            json_error_t je;
            json_t *x = json_loads(exp[i], 0, &je);
            int rc = squad_row_parse_json(&rb, rows[i], strlen(rows[i]), NULL, 0, &err);
            CHECKF(rc == 0 && x, "fixture row %d: %s", i + 1, err.msg);
            if (rc || !x) {
                json_decref(x);
                continue;
            }
            const int want = squad_specialists_find(sp, json_string_value(json_object_get(x, "route")));
            for (int forced = -1; forced < sp->router.n_labels; forced++) {
                rb.row.specialist = forced + 1;
                rc = squad_engine_score(e, &rb.row, res, &err);
                CHECKF(rc == 0, "fixture row %d: %s", i + 1, err.msg);
                if (rc) continue;
                const int route = forced >= 0 ? forced : want;
                CHECKF(res->route == route, "fixture row %d (forced %d): route %d, expected %d", i + 1, forced,
                       res->route, route);
                json_t *rp = json_object_get(x, "router_probs");
                for (int k = 0; k < sp->router.n_labels; k++)
                    CHECK_NEAR(res->route_probs[k], json_number_value(json_array_get(rp, (size_t)k)), TOL_CPU_EXACT_REF);
                json_t *probs = forced < 0 ? json_object_get(x, "probs")
                                           : json_object_get(json_object_get(x, "probs_by_route"), sp->labels[forced]);
                const double w = json_probs_diff(res, &rb.row, probs);
                CHECKF(w <= TOL_CPU_EXACT_REF, "fixture row %d (forced %d, cache %d): answer %g from the reference",
                       i + 1, forced, cache, w);
                if (!(w <= worst)) worst = w;
            }
            json_decref(x);
            squad_row_buf_free(&rb);
        }
        printf("fixture (cache %d): %d rows x %d routes, worst |diff| %.3g\n", cache, nr, sp->router.n_labels + 1, worst);
        squad_engine_free(e);
    }
    free(res);
    test_free_lines(rows, nr);
    test_free_lines(exp, ne);
    squad_specialists_free(sp);
    squad_model_free(m);
}

int main(void) {
    squad_err err = {0};
    char *mdir = strdup(test_tmpdir()), *sdir = strdup(test_tmpdir());
    squad_synth_opts so = {0};
    so.preset = "tiny";
    so.out_dir = mdir;
    so.seed = 3;
    CHECKF(squad_synth_write(&so, &err) == 0, "%s", err.msg);
    g_m = squad_model_load(mdir, &err);
    CHECKF(g_m != NULL, "%s", err.msg);
    if (!g_m) return test_summary("test_specialists_exec");
    squad_spec_synth_opts o;
    squad_spec_synth_defaults(&g_m->cfg, &o);
    o.out_dir = sdir;
    o.seed = 5;
    o.dtype = ST_F32;
    CHECKF(squad_spec_synth_write(&g_m->cfg, &o, &err) == 0, "%s", err.msg);
    g_sp = squad_specialists_load(g_m, sdir, &err);
    CHECKF(g_sp != NULL, "%s", err.msg);
    if (g_sp) {
        CHECK(g_sp->split == 2 && g_sp->router.layer == 2 && g_sp->router.n_labels == 3);
        make_rows();
        build_references();
        check_uncached();
        check_cached();
        check_bad_input();
    }
    check_fixture();
    squad_specialists_free(g_sp);
    squad_model_free(g_m);
    free(mdir);
    free(sdir);
    return test_summary("test_specialists_exec");
}
