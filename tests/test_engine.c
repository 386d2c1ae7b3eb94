/*
 * test_engine.c — the CPU engine against the transformers reference fixtures
 * (tests/fixtures/models/<name>/rows.jsonl + expected.jsonl, made by tools/make_fixtures.py):
 * every probability within TOL_CPU_EXACT_REF absolute (tests/tolerances.h). Also continuation: any
 * split of a row into chunks (1, 7, 64, 100, ... tokens) gives the one-pass answer within
 * TOL_CPU_EXACT_CHUNKED, and bad rows give errors.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "rows.h"
#include "squad.h"
#include "testutil.h"
#include "tolerances.h"
#include "util.h"

static const char *FIXTURE_ROOT = "tests/fixtures/models";

static squad_engine *open_engine(squad_model *m, int cache) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = SQUAD_DEVICE_CPU;
    o.threads = 2;
    o.precision = SQUAD_PRECISION_EXACT; /* the fixtures are fp32 references */
    if (!cache) o.cache.budget_bytes = 0;
    squad_err err = {0};
    squad_engine *e = squad_engine_new(m, &o, &err);
    if (!e) fprintf(stderr, "engine: %s\n", err.msg);
    return e;
}

/* Compares a result with an expected line {"probs": [[...], ...]}; returns the worst difference. */
static double compare_expected(const squad_result *r, const squad_row *row, const char *expected) {
    json_error_t je;
    json_t *root = json_loads(expected, 0, &je);
    double worst = 0;
    json_t *probs = json_object_get(root, "probs");
    if (!probs || (int)json_array_size(probs) != row->n_slots) {
        json_decref(root);
        return INFINITY;
    }
    for (int s = 0; s < row->n_slots; s++) {
        json_t *ps = json_array_get(probs, s);
        if ((int)json_array_size(ps) != row->nopts[s]) worst = INFINITY;
        for (int l = 0; l < row->nopts[s] && l < (int)json_array_size(ps); l++) {
            double d = fabs(json_number_value(json_array_get(ps, l)) - r->probs[s][l]);
            if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
        }
    }
    json_decref(root);
    return worst;
}

static void check_fixture(const char *name) {
    char dir[512], rows_path[600], exp_path[600];
    snprintf(dir, sizeof dir, "%s/%.200s", FIXTURE_ROOT, name);
    snprintf(rows_path, sizeof rows_path, "%s/rows.jsonl", dir);
    snprintf(exp_path, sizeof exp_path, "%s/expected.jsonl", dir);
    squad_err err = {0};
    squad_model *m = squad_model_load(dir, &err);
    CHECKF(m != NULL, "load %s: %s", name, err.msg);
    if (!m) return;
    squad_engine *e = open_engine(m, 0);
    CHECK(e != NULL);
    int nr = 0, ne = 0;
    char **rows = test_read_lines(rows_path, &nr), **exp = test_read_lines(exp_path, &ne);
    CHECKF(nr > 0 && nr == ne, "%s: %d rows, %d expected", name, nr, ne);
    double worst_all = 0;
    squad_result *res = malloc(sizeof *res);
    for (int i = 0; e && i < nr && i < ne; i++) {
        squad_row_buf rb;
        int rc = squad_row_parse_json(&rb, rows[i], strlen(rows[i]), NULL, 0, &err);
        CHECKF(rc == 0, "%s row %d: %s", name, i, err.msg);
        if (rc) continue;
        rc = squad_engine_score(e, &rb.row, res, &err);
        CHECKF(rc == 0, "%s row %d: %s", name, i, err.msg);
        if (!rc) {
            double w = compare_expected(res, &rb.row, exp[i]);
            CHECKF(w <= TOL_CPU_EXACT_REF, "%s row %d (%d tokens): worst |diff| %g", name, i, rb.row.n_ids, w);
            if (w > worst_all) worst_all = w;
        }
        squad_row_buf_free(&rb);
    }
    printf("fixture %s: %d rows, worst |diff| %.3g\n", name, nr, worst_all);
    free(res);
    test_free_lines(rows, nr);
    test_free_lines(exp, ne);
    squad_engine_free(e);
    squad_model_free(m);
}

/* A row run in pieces [0, c1), [c1, c2), ... from the working state equals the one-pass answer. */
static void check_splits(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%.200s", FIXTURE_ROOT, name);
    squad_err err = {0};
    squad_model *m = squad_model_load(dir, &err);
    if (!m) return;
    squad_engine *e = open_engine(m, 0);
    int n = 700;
    int32_t *ids = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 7919 + 13) % squad_model_vocab_size(m));
    int32_t slots[3] = {5, 350, n - 1}, nopts[3] = {2, 4, 3}, letters[4] = {1, 2, 3, 4};
    squad_row row = {ids, n, slots, nopts, 3, letters, 4, -1, 0, NULL, 0};
    squad_result *one = calloc(1, sizeof *one), *split = calloc(1, sizeof *split);
    CHECK(e->be->reset(e->be, 0, &err) == 0);
    CHECK(squad_engine_run_span(e, &row, 0, n, one, &err) == 0);
    int pieces[][8] = {{1, 7, 64, 100, 700}, {64, 128, 192, 700}, {3, 4, 5, 699, 700}, {511, 512, 513, 700}};
    for (size_t p = 0; p < sizeof pieces / sizeof pieces[0]; p++) {
        memset(split, 0, sizeof *split);
        CHECK(e->be->reset(e->be, 0, &err) == 0);
        int s = 0;
        for (int k = 0; pieces[p][k]; k++) {
            int rc = squad_engine_run_span(e, &row, s, pieces[p][k], split, &err);
            CHECKF(rc == 0, "span: %s", err.msg);
            s = pieces[p][k];
            if (s == n) break;
        }
        double worst = 0;
        for (int i = 0; i < 3; i++)
            for (int l = 0; l < nopts[i]; l++) worst = fmax(worst, fabs(one->probs[i][l] - split->probs[i][l]));
        CHECKF(worst <= TOL_CPU_EXACT_CHUNKED, "%s split %zu: worst %g", name, p, worst);
    }
    free(one), free(split), free(ids);
    squad_engine_free(e);
    squad_model_free(m);
}

static void check_bad_rows(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%.200s", FIXTURE_ROOT, name);
    squad_err err = {0};
    squad_model *m = squad_model_load(dir, &err);
    if (!m) return;
    squad_engine *e = open_engine(m, 1);
    const char *bad[] = {
        "{\"ids\": [], \"slots\": [0], \"nopts\": [2], \"letters\": [1,2]}",
        "{\"ids\": [1,2,99999], \"slots\": [0], \"nopts\": [2], \"letters\": [1,2]}",
        "{\"ids\": [1,2,3], \"slots\": [2,1], \"nopts\": [2,2], \"letters\": [1,2]}",
        "{\"ids\": [1,2,3], \"slots\": [1,1], \"nopts\": [2,2], \"letters\": [1,2]}",
        "{\"ids\": [1,2,3], \"slots\": [3], \"nopts\": [2], \"letters\": [1,2]}",
        "{\"ids\": [1,2,3], \"slots\": [-1], \"nopts\": [2], \"letters\": [1,2]}",
        "{\"ids\": [1,2,3], \"slots\": [1], \"nopts\": [3], \"letters\": [1,2]}",
        "{\"ids\": [1,2,3], \"slots\": [1], \"nopts\": [0], \"letters\": [1,2]}",
        "{\"ids\": [1,2,3], \"slots\": [1], \"nopts\": [1,2], \"letters\": [1,2]}",
        "{\"ids\": \"abc\", \"slots\": [1], \"nopts\": [1], \"letters\": [1,2]}",
        "{\"ids\": [1.5], \"slots\": [0], \"nopts\": [1], \"letters\": [1,2]}",
        "{\"ids\": [1,2,3], \"slots\": [1], \"nopts\": [1], \"letters\": [1,2], \"state_len\": 9}",
        "{\"ids\": [1,2,3], \"slots\": [], \"nopts\": [], \"letters\": [1,2]}",
        "{\"ids\": [1,2,3], \"slots\": [1], \"nopts\": [1]}",
        "[1,2,3]",
        "{\"ids\": [1,2,3], ",
    };
    squad_result *res = malloc(sizeof *res);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        squad_row_buf rb;
        err.msg[0] = 0;
        int rc = squad_row_parse_json(&rb, bad[i], strlen(bad[i]), NULL, 0, &err);
        if (!rc) {
            rc = squad_engine_score(e, &rb.row, res, &err);
            squad_row_buf_free(&rb);
        }
        CHECKF(rc != 0 && err.msg[0], "bad row %zu accepted: %s", i, bad[i]);
    }
    /* a good row still runs after them */
    int32_t ids[3] = {1, 2, 3}, slots[1] = {2}, nopts[1] = {2}, letters[2] = {1, 2};
    squad_row good = {ids, 3, slots, nopts, 1, letters, 2, -1, 0, NULL, 0};
    CHECK(squad_engine_score(e, &good, res, &err) == 0);
    CHECK_NEAR(res->probs[0][0] + res->probs[0][1], 1.0, TOL_PROB_SUM);
    free(res);
    squad_engine_free(e);
    squad_model_free(m);
}

int main(void) {
    DIR *d = opendir(FIXTURE_ROOT);
    CHECKF(d != NULL, "no fixtures at %s", FIXTURE_ROOT);
    int n = 0;
    if (d) {
        struct dirent *de;
        char names[16][256];
        while ((de = readdir(d)) && n < 16)
            if (de->d_name[0] != '.') snprintf(names[n++], 256, "%s", de->d_name);
        closedir(d);
        for (int i = 0; i < n; i++) check_fixture(names[i]);
        CHECKF(n >= 3, "expected at least 3 fixture models, found %d", n);
    }
    check_splits("tiny-causal");
    check_bad_rows("tiny-causal");
    return test_summary("test_engine");
}
