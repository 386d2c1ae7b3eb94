/*
 * test_vision_rows.c — rows with images through the engine on each backend (docs/images.md). One
 * program, parametrised by backend like test_long: `--backend cpu|cuda|all` (default cpu); CTest
 * runs it as test_vision_rows (cpu) and gpu_test_vision_rows (cuda, label gpu, 77 without a GPU).
 * Each backend has its own tolerances (below); the checks that do not touch a backend (the row
 * checks, squad score's form) run once, with the CPU's.
 *  - the fixture rows of tests/fixtures/vision/fixture.json (made by transformers on the tiny-vl
 *    checkpoint `squad synth` writes): squad's M-RoPE positions equal transformers' exactly, the
 *    letter probabilities within TOL_CPU_EXACT_REF (EXACT) and TOL_CPU_BF16_REF (BF16), one row
 *    and all rows batched, the two-image row included;
 *  - a row split into chunks inside an image gives the one-pass answer;
 *  - cached = uncached: the same screenshot with another question is a hit covering the image, a
 *    changed screenshot (another image of the same grid, or one pixel changed) gets no hit past
 *    the image start and is never answered by the memo, a state that grows after the image reuses
 *    it, a state ending inside an image is checkpointed before it; the encoder cache on and off
 *    gives the same answers and its counters move;
 *  - the row checks' messages, squad_image_load on a model without a tower, and the "images" form
 *    of squad score's rows (one <|image_pad|> per image, expanded by squad_row_expand_images).
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "image/decode.h"
#include "image/identity.h"
#include "image_rows.h"
#include "model.h"
#include "rows.h"
#include "squad.h"
#include "synth.h"
#include "testutil.h"
#include "tolerances.h"
#include "util.h"

#define VISION_FIXTURE "tests/fixtures/vision/fixture.json"
#define IMAGES_DIR "tests/fixtures/images"
#define TOKENIZER "third_party/qwen3/tokenizer.json"

/* ---- helpers --------------------------------------------------------------------------------- */

static squad_model *tiny_vl(const char *dir, squad_err *e) {
    squad_synth_opts o = {.preset = "tiny-vl", .out_dir = dir, .seed = 0, .tokenizer = access(TOKENIZER, R_OK) ? NULL : TOKENIZER};
    if (squad_synth_write(&o, e) != 0) return NULL;
    return squad_model_load(dir, e);
}

static int load_image(const squad_model *m, const char *file, squad_row_image *out) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", IMAGES_DIR, file);
    size_t n = 0;
    squad_err e = {0};
    uint8_t *bytes = (uint8_t *)squad_read_file(path, &n, &e);
    int rc = bytes ? squad_image_load(m, bytes, n, 0, out, &e) : -1;
    free(bytes);
    CHECKF(rc == 0, "load %s: %s", file, e.msg);
    return rc;
}

/* A backend the cases run on, and how close its answers must be. */
typedef struct vr_backend {
    const char *name;
    squad_device device;
    int threads;
    double ref[2];  /* against transformers' probabilities: EXACT, BF16 */
    double batched[2]; /* a row in a batch against the row alone: EXACT, BF16 */
    double split;   /* a row run in two spans, cut anywhere, against transformers (EXACT) */
    double cached;  /* cached against uncached (EXACT) */
} vr_backend;

static const vr_backend BACKENDS[] = {
    {"cpu", SQUAD_DEVICE_CPU, 2, {TOL_CPU_EXACT_REF, TOL_CPU_BF16_REF}, {TOL_CPU_EXACT_BATCHED, TOL_CPU_EXACT_BATCHED}, TOL_CPU_EXACT_REF,
     TOL_CPU_EXACT_CACHED},
    /* the CUDA tower runs in fp32 on EXACT, in bf16 on BF16 (docs/images.md) */
    {"cuda", SQUAD_DEVICE_CUDA, 0, {TOL_CUDA_EXACT_IMAGE_REF, TOL_CUDA_BF16_REF}, {TOL_CUDA_EXACT_CACHED, TOL_CUDA_BF16_CACHED_WIDE},
     TOL_CUDA_EXACT_IMAGE_REF,
     TOL_CUDA_EXACT_IMAGE_CACHED},
};

/* The backend of the cases now running (set by main for each --backend in turn). */
static const vr_backend *BE = &BACKENDS[0];

static squad_engine *engine(squad_model *m, squad_precision prec, size_t cache_bytes, size_t encoder_bytes) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = BE->device;
    o.threads = BE->threads;
    o.precision = prec;
    o.cache.budget_bytes = cache_bytes;
    o.cache.align = 16; /* tiny rows: checkpoints every 16 tokens */
    o.cache.tail = 4;
    o.cache.stride = 64;
    o.cache.min_prefix = 16;
    o.encoder_cache_bytes = encoder_bytes;
    squad_err e = {0};
    squad_engine *en = squad_engine_new(m, &o, &e);
    CHECKF(en != NULL, "engine: %s", e.msg);
    return en;
}

static int32_t *json_ints(json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *v = calloc((size_t)*n + 1, sizeof *v);
    for (int i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

/* A fixture row with its images loaded (the images' pos from the runs in its ids). */
typedef struct fx_row {
    squad_row row;
    int32_t *ids, *slots, *nopts, *letters;
    squad_row_image images[4];
    json_t *probs, *positions;
} fx_row;

static int fx_row_load(const squad_model *m, json_t *jr, fx_row *f) {
    memset(f, 0, sizeof *f);
    int n_ids, n_slots, n_nopts, n_letters;
    f->ids = json_ints(json_object_get(jr, "ids"), &n_ids);
    f->slots = json_ints(json_object_get(jr, "slots"), &n_slots);
    f->nopts = json_ints(json_object_get(jr, "nopts"), &n_nopts);
    f->letters = json_ints(json_object_get(jr, "letters"), &n_letters);
    f->probs = json_object_get(jr, "probs");
    f->positions = json_object_get(jr, "mrope_positions");
    json_t *imgs = json_object_get(jr, "images"), *grids = json_object_get(jr, "grids");
    const int n_images = (int)json_array_size(imgs);
    int at = 0;
    for (int k = 0; k < n_images && k < 4; k++) {
        if (load_image(m, json_string_value(json_array_get(imgs, (size_t)k)), &f->images[k])) return -1;
        json_t *g = json_array_get(grids, (size_t)k);
        for (int d = 0; d < 3; d++) CHECK(f->images[k].grid[d] == json_integer_value(json_array_get(g, (size_t)d)));
        while (at < n_ids && f->ids[at] != m->cfg.image_token_id) at++;
        f->images[k].pos = at;
        at += f->images[k].tokens;
    }
    f->row = (squad_row){.ids = f->ids, .n_ids = n_ids, .slots = f->slots, .nopts = f->nopts, .n_slots = n_slots,
                         .letters = f->letters, .n_letters = n_letters, .state_len = -1,
                         .images = f->images, .n_images = n_images};
    return 0;
}

static void fx_row_free(fx_row *f) {
    for (int k = 0; k < f->row.n_images; k++) squad_row_image_free(&f->images[k]);
    free(f->ids), free(f->slots), free(f->nopts), free(f->letters);
}

static double worst_against(const squad_result *r, const fx_row *f) {
    double w = 0;
    for (int s = 0; s < f->row.n_slots; s++) {
        json_t *ps = json_array_get(f->probs, (size_t)s);
        for (int l = 0; l < f->row.nopts[s]; l++) w = fmax(w, fabs(r->probs[s][l] - json_number_value(json_array_get(ps, (size_t)l))));
    }
    return w;
}

/* ---- against transformers -------------------------------------------------------------------- */

static void test_fixture_rows(squad_model *m, json_t *fx) {
    json_t *rows = json_object_get(fx, "rows");
    const int n = (int)json_array_size(rows);
    CHECK(n >= 3);
    fx_row f[8];
    int loaded = 0;
    for (int i = 0; i < n && i < 8; i++, loaded++)
        if (fx_row_load(m, json_array_get(rows, (size_t)i), &f[i])) return;
    int two_images = 0;
    for (int i = 0; i < loaded; i++) {
        squad_err e = {0};
        CHECKF(squad_row_check(m, &f[i].row, &e) == 0, "row %d: %s", i, e.msg);
        two_images |= f[i].row.n_images == 2;
        /* positions: transformers' get_rope_index, exactly */
        int32_t *pos = calloc((size_t)f[i].row.n_ids * 3, sizeof *pos);
        squad_image_row_positions(&m->cfg, &f[i].row, pos);
        int same = json_array_size(f[i].positions) == 3;
        for (int a = 0; same && a < 3; a++) {
            json_t *axis = json_array_get(f[i].positions, (size_t)a);
            same = (int)json_array_size(axis) == f[i].row.n_ids;
            for (int t = 0; same && t < f[i].row.n_ids; t++) same = pos[3 * t + a] == json_integer_value(json_array_get(axis, (size_t)t));
        }
        CHECKF(same, "row %d: M-RoPE positions differ from transformers'", i);
        free(pos);
    }
    CHECK(two_images);
    const squad_precision precs[2] = {SQUAD_PRECISION_EXACT, SQUAD_PRECISION_BF16};
    const double *tols = BE->ref;
    for (int p = 0; p < 2; p++) {
        squad_engine *en = engine(m, precs[p], 0, 0);
        if (!en) return;
        squad_result one[8], batch[8];
        double worst = 0;
        for (int i = 0; i < loaded; i++) {
            squad_err e = {0};
            int rc = squad_engine_score(en, &f[i].row, &one[i], &e);
            CHECKF(rc == 0, "row %d: %s", i, e.msg);
            const double w = worst_against(&one[i], &f[i]);
            CHECKF(w <= tols[p], "%s row %d (%d images): worst %g against transformers",
                   p ? "BF16" : "EXACT", i, f[i].row.n_images, w);
            worst = fmax(worst, w);
        }
        printf("test_vision_rows (%s): %s: %d fixture rows within %.3g of transformers\n", BE->name, p ? "BF16" : "EXACT",
               loaded, worst);
        /* all together in one batch: the same answers (EXACT: the same bits) */
        squad_row rs[8];
        for (int i = 0; i < loaded; i++) rs[i] = f[i].row;
        squad_err e = {0};
        CHECKF(squad_engine_score_batch(en, rs, loaded, NULL, batch, NULL, NULL, &e) == 0, "batch: %s", e.msg);
        for (int i = 0; i < loaded; i++)
            CHECKF(test_answer_diff(&f[i].row, &one[i], &batch[i]) <= BE->batched[p], "batched row %d", i);
        squad_cache_stats st;
        squad_engine_cache_stats(en, &st);
        CHECK(st.image_rows == (uint64_t)(2 * loaded) && st.image_tokens > 0);
        CHECK(st.encoder_budget_bytes == 0 && st.encoder_hits == 0 && st.encoder_misses >= (uint64_t)loaded);
        if (p == 0) {
            /* chunks cut inside an image (squad_engine_run_span: the chunk's image rows are a slice) */
            const fx_row *two = NULL;
            for (int i = 0; i < loaded; i++)
                if (f[i].row.n_images == 2) two = &f[i];
            for (int cut = 1; two && cut < two->row.n_ids; cut += 3) {
                squad_result r;
                memset(&r, 0, sizeof r);
                squad_err se = {0};
                int rc = en->be->reset(en->be, 0, &se);
                if (!rc) rc = squad_engine_run_span(en, &two->row, 0, cut, &r, &se);
                if (!rc) rc = squad_engine_run_span(en, &two->row, cut, two->row.n_ids, &r, &se);
                CHECKF(rc == 0, "split at %d: %s", cut, se.msg);
                r.n_slots = two->row.n_slots;
                CHECKF(worst_against(&r, two) <= BE->split, "split at %d: %g", cut, worst_against(&r, two));
            }
        }
        squad_engine_free(en);
    }
    for (int i = 0; i < loaded; i++) fx_row_free(&f[i]);
}

/* ---- cached = uncached ----------------------------------------------------------------------- */

/* A synthetic row: [text a][<|vision_start|>][image run][<|vision_end|>][text b] as the state,
 * then a question of q tokens whose last two tokens are slots. */
typedef struct syn_row {
    int32_t ids[256];
    int32_t slots[2], nopts[2], letters[3];
    squad_row_image image;
    squad_row row;
} syn_row;

static void syn_make(syn_row *s, const squad_model *m, const squad_row_image *im, int a, int b, int q,
                     unsigned text_seed, unsigned question_seed) {
    memset(s, 0, sizeof *s);
    rng r = {0x1234567u + text_seed};
    int n = 0;
    for (int i = 0; i < a; i++) s->ids[n++] = 1000 + (int32_t)(rng_u32(&r) % 50000);
    s->ids[n++] = m->cfg.vision_start_token_id;
    s->image = *im;
    s->image.pos = n;
    for (int i = 0; i < im->tokens; i++) s->ids[n++] = m->cfg.image_token_id;
    s->ids[n++] = m->cfg.vision_end_token_id;
    for (int i = 0; i < b; i++) s->ids[n++] = 1000 + (int32_t)(rng_u32(&r) % 50000);
    const int state_len = n;
    rng rq = {0x9e37u + question_seed};
    for (int i = 0; i < q; i++) s->ids[n++] = 2000 + (int32_t)(rng_u32(&rq) % 50000);
    s->slots[0] = n - 2, s->slots[1] = n - 1;
    s->nopts[0] = 3, s->nopts[1] = 2;
    s->letters[0] = 32, s->letters[1] = 33, s->letters[2] = 34;
    s->row = (squad_row){.ids = s->ids, .n_ids = n, .slots = s->slots, .nopts = s->nopts, .n_slots = 2,
                         .letters = s->letters, .n_letters = 3, .state_len = state_len,
                         .images = &s->image, .n_images = 1};
}

static int score(squad_engine *en, const squad_row *row, squad_result *out) {
    squad_err e = {0};
    int rc = squad_engine_score(en, row, out, &e);
    CHECKF(rc == 0, "score: %s", e.msg);
    return rc;
}

static void test_cached(squad_model *m) {
    squad_row_image photo, photo_jpg, pixel;
    if (load_image(m, "photo_333x517.png", &photo) || load_image(m, "photo_333x517.jpg", &photo_jpg)) return;
    CHECK(!memcmp(photo.grid, photo_jpg.grid, sizeof photo.grid) &&
          memcmp(photo.identity, photo_jpg.identity, sizeof photo.identity));
    /* the same photo with one pixel changed: another identity */
    squad_image *copy = calloc(1, sizeof *copy);
    *copy = *photo.image;
    const size_t bytes = (size_t)copy->width * copy->height * 3;
    copy->rgb = malloc(bytes);
    memcpy(copy->rgb, photo.image->rgb, bytes);
    copy->rgb[3 * (copy->width * 100 + 50)] ^= 1;
    pixel = photo;
    pixel.image = copy;
    squad_image_id id = squad_image_identity(copy, pixel.grid);
    memcpy(pixel.identity, id.bytes, sizeof pixel.identity);
    CHECK(memcmp(pixel.identity, photo.identity, sizeof pixel.identity) != 0);

    /* the image run sits at [38, 50): state 37 + 14 + 30 = 81 tokens (p = 80), question 12 */
    syn_row A, A2, Bj, Bp, C, D, D2;
    syn_make(&A, m, &photo, 37, 30, 12, 0, 1);
    syn_make(&A2, m, &photo, 37, 30, 12, 0, 2); /* the same screenshot, another question */
    syn_make(&Bj, m, &photo_jpg, 37, 30, 12, 0, 1);
    syn_make(&Bp, m, &pixel, 37, 30, 12, 0, 1);
    syn_make(&C, m, &photo, 37, 50, 12, 0, 3); /* the state grows after the image */
    /* other text: the state ends inside the image (state_len 49, p = 48 in the run [38, 50)) */
    syn_make(&D, m, &photo, 37, 0, 12, 7, 4);
    syn_make(&D2, m, &photo, 37, 0, 12, 7, 5);
    D.row.state_len = D2.row.state_len = 49; /* p = 48: inside the run [38, 50) */
    const int img_start = A.image.pos, img_end = A.image.pos + A.image.tokens;
    CHECK(img_start == 38 && img_end == 50);
    syn_row *all[] = {&A, &A2, &Bj, &Bp, &C, &D, &D2};
    const int n_all = 7;

    squad_engine *plain = engine(m, SQUAD_PRECISION_EXACT, 0, 0);
    squad_engine *cached = engine(m, SQUAD_PRECISION_EXACT, (size_t)64 << 20, SQUAD_ENCODER_CACHE_DEFAULT_BYTES);
    squad_engine *no_enc = engine(m, SQUAD_PRECISION_EXACT, (size_t)64 << 20, 0);
    if (!plain || !cached || !no_enc) return;
    squad_result ref[7], got[7], ne[7];
    for (int i = 0; i < n_all; i++) score(plain, &all[i]->row, &ref[i]);
    CHECK(test_answer_diff(&A.row, &ref[0], &ref[2]) > 1e-6); /* the image matters to the answer */
    for (int i = 0; i < n_all; i++) {
        score(cached, &all[i]->row, &got[i]);
        score(no_enc, &all[i]->row, &ne[i]);
        CHECKF(test_answer_diff(&all[i]->row, &got[i], &ref[i]) <= BE->cached, "row %d cached vs uncached %g", i,
               test_answer_diff(&all[i]->row, &got[i], &ref[i]));
        CHECKF(test_answer_diff(&all[i]->row, &ne[i], &got[i]) == 0, "row %d: encoder cache on / off differ", i);
        CHECK(got[i].memo == 0);
    }
    CHECK(got[0].reused == 0);
    CHECKF(got[1].reused == 80 && got[1].reused > img_end, "same screenshot, other question: reused %d", got[1].reused);
    CHECKF(got[2].reused <= img_start, "another image of the same grid: reused %d", got[2].reused);
    CHECKF(got[3].reused <= img_start, "one pixel changed: reused %d", got[3].reused);
    CHECKF(got[4].reused >= 64 && got[4].reused > img_end, "a state grown after the image: reused %d", got[4].reused);
    CHECKF(D.row.state_len == 49 && got[6].reused == 32, "a state ending inside the image: reused %d (checkpoint "
           "before the image, at 32)", got[6].reused);
    squad_cache_stats st;
    squad_engine_cache_stats(cached, &st);
    /* towers: A, the jpg, the changed pixel; every other row restored past its image or got it from
     * the encoder cache */
    CHECKF(st.encoder_misses == 3, "towers run %llu", (unsigned long long)st.encoder_misses);
    const uint64_t hits0 = st.encoder_hits;
    CHECK(hits0 >= 1 && st.encoder_bytes > 0 && st.encoder_budget_bytes == SQUAD_ENCODER_CACHE_DEFAULT_BYTES);
    CHECK(st.image_rows == (uint64_t)n_all && st.image_tokens == (uint64_t)n_all * 12);
    squad_cache_stats sn;
    squad_engine_cache_stats(no_enc, &sn);
    CHECK(sn.encoder_hits == 0 && sn.encoder_misses > st.encoder_misses && sn.encoder_budget_bytes == 0);

    /* the memo: an exact repeat is answered whole; the same ids around another image are not */
    squad_result again;
    score(cached, &A.row, &again);
    CHECK(again.memo == 1 && test_answer_diff(&A.row, &again, &got[0]) == 0);
    score(cached, &Bp.row, &again);
    CHECK(again.memo == 1 && test_answer_diff(&A.row, &again, &got[3]) == 0);

    /* the disk tier keeps image states: saved, loaded into a fresh engine, the same screenshot with
     * another question restores past the image (the key tokens are stored like ids) */
    char store_dir[600];
    snprintf(store_dir, sizeof store_dir, "%s/store", test_tmpdir());
    squad_cache_store_opts so = {.dir = store_dir};
    squad_cache_store_stats ss;
    squad_err se = {0};
    CHECKF(squad_engine_cache_save(cached, &so, &ss, &se) == 0 && ss.checkpoints > 0, "save: %s", se.msg);
    squad_engine *fresh = engine(m, SQUAD_PRECISION_EXACT, (size_t)64 << 20, SQUAD_ENCODER_CACHE_DEFAULT_BYTES);
    if (fresh) {
        memset(&ss, 0, sizeof ss);
        CHECKF(squad_engine_cache_load(fresh, &so, &ss, &se) == 0 && ss.refused == 0 && ss.checkpoints > 0,
               "load: %s (refused %llu)", se.msg, (unsigned long long)ss.refused);
        score(fresh, &A2.row, &again);
        CHECKF(again.reused == 80 && test_answer_diff(&A2.row, &again, &ref[1]) <= BE->cached,
               "after a restart: reused %d", again.reused);
        /* the same PNG loaded again (another struct, the same identity): a hit; the lossy WebP of the
         * photo (other pixels, the same grid), never seen, is not */
        squad_row_image lossless, lossy;
        if (!load_image(m, "photo_333x517.png", &lossless) && !load_image(m, "photo_333x517.lossy.webp", &lossy)) {
            syn_row W, L;
            syn_make(&W, m, &lossless, 37, 30, 12, 0, 6);
            syn_make(&L, m, &lossy, 37, 30, 12, 0, 6);
            squad_result wr, lr;
            score(plain, &W.row, &wr);
            score(fresh, &W.row, &again);
            CHECKF(again.reused == 80 && test_answer_diff(&W.row, &again, &wr) <= BE->cached,
                   "the PNG loaded again: reused %d", again.reused);
            score(plain, &L.row, &lr);
            score(fresh, &L.row, &again);
            CHECKF(again.reused <= img_start && test_answer_diff(&L.row, &again, &lr) <= BE->cached,
                   "lossy WebP: reused %d", again.reused);
            squad_row_image_free(&lossless);
            squad_row_image_free(&lossy);
        }
        squad_engine_free(fresh);
    }

    /* checkpoints and memo dropped: the screenshot's tower output comes from the encoder cache */
    squad_engine_cache_clear(cached);
    score(cached, &A2.row, &again);
    squad_engine_cache_stats(cached, &st);
    CHECK(again.memo == 0 && again.reused == 0 && test_answer_diff(&A2.row, &again, &ref[1]) <= BE->cached);
    CHECKF(st.encoder_misses == 3 && st.encoder_hits == hits0 + 1, "after a clear: hits %llu misses %llu",
           (unsigned long long)st.encoder_hits, (unsigned long long)st.encoder_misses);

    squad_engine_free(plain);
    squad_engine_free(cached);
    squad_engine_free(no_enc);
    squad_image_free(copy);
    free(copy);
    squad_row_image_free(&photo);
    squad_row_image_free(&photo_jpg);
}

/* ---- checks and loading ---------------------------------------------------------------------- */

static void expect_invalid(const squad_model *m, const squad_row *row, const char *needle) {
    squad_err e = {0};
    const int rc = squad_row_check(m, row, &e);
    CHECKF(rc == SQUAD_E_INVALID && strstr(e.msg, needle), "wanted '%s', got %d '%s'", needle, rc, e.msg);
}

static void test_checks(squad_model *m) {
    squad_row_image photo, small;
    if (load_image(m, "photo_333x517.png", &photo) || load_image(m, "small_64x48.png", &small)) return;
    CHECK(photo.tokens == 12 && photo.grid[0] == 1 && photo.grid[1] == 8 && photo.grid[2] == 6);
    syn_row s;
    syn_make(&s, m, &photo, 5, 5, 4, 0, 1);
    squad_err e = {0};
    CHECKF(squad_row_check(m, &s.row, &e) == 0, "%s", e.msg);
    syn_row b = s;
    b.row.ids = b.ids, b.row.images = &b.image, b.row.slots = b.slots, b.row.nopts = b.nopts, b.row.letters = b.letters;
    b.image.pos = 5; /* on <|vision_start|> */
    expect_invalid(m, &b.row, "inside its run");
    b.image.pos = 6;
    b.ids[10] = 77;
    expect_invalid(m, &b.row, "inside its run");
    b.ids[10] = m->cfg.image_token_id;
    b.ids[2] = m->cfg.image_token_id;
    expect_invalid(m, &b.row, "outside every image's run");
    b.ids[2] = 1000;
    b.image.tokens = 11;
    expect_invalid(m, &b.row, "makes 12");
    b.image.tokens = 12;
    b.image.grid[1] = 4;
    expect_invalid(m, &b.row, "not the one the model's processor gives");
    b.image.grid[1] = 8;
    b.image.pos = b.row.n_ids - 3;
    expect_invalid(m, &b.row, "outside the ids");
    b.image.pos = 6;
    b.ids[18] = m->cfg.image_token_id; /* the run continues past its tokens */
    expect_invalid(m, &b.row, "longer than its 12 tokens");
    b.ids[18] = m->cfg.vision_end_token_id;
    squad_row_image two[2] = {b.image, b.image};
    b.row.images = two, b.row.n_images = 2;
    expect_invalid(m, &b.row, "ascend");
    squad_row_image many[SQUAD_MAX_IMAGES_PER_ROW + 1];
    for (int k = 0; k <= SQUAD_MAX_IMAGES_PER_ROW; k++) many[k] = b.image;
    b.row.images = many, b.row.n_images = SQUAD_MAX_IMAGES_PER_ROW + 1;
    expect_invalid(m, &b.row, "at most 16");
    b.row.images = &b.image, b.row.n_images = 0; /* pads and no images */
    expect_invalid(m, &b.row, "outside every image's run");

    /* a model without a tower */
    squad_model *text = test_synth_model("tiny", 3);
    if (text) {
        char path[600];
        snprintf(path, sizeof path, "%s/small_64x48.png", IMAGES_DIR);
        size_t n = 0;
        uint8_t *bytes = (uint8_t *)squad_read_file(path, &n, &e);
        squad_row_image im;
        CHECK(bytes && squad_image_load(text, bytes, n, 0, &im, &e) == SQUAD_E_UNSUPPORTED &&
              strstr(e.msg, "no vision tower"));
        free(bytes);
        syn_row t;
        memset(&t, 0, sizeof t);
        t.ids[0] = 5, t.ids[1] = 6;
        t.slots[0] = 1, t.nopts[0] = 2, t.letters[0] = 7, t.letters[1] = 8;
        t.row = (squad_row){.ids = t.ids, .n_ids = 2, .slots = t.slots, .nopts = t.nopts, .n_slots = 1,
                            .letters = t.letters, .n_letters = 2, .state_len = -1, .images = &small, .n_images = 1};
        expect_invalid(text, &t.row, "no vision tower");
        squad_model_free(text);
    }
    /* bad bytes: a clear error, no crash */
    const uint8_t junk[16] = "\x89PNG\r\n\x1a\nxxxxxxx";
    squad_row_image im;
    CHECK(squad_image_load(m, junk, sizeof junk, 0, &im, &e) == SQUAD_E_INVALID && e.msg[0]);
    squad_row_image_free(&photo);
    squad_row_image_free(&small);
}

/* squad score's form: one <|image_pad|> per image in ids, expanded by squad. */
static void test_expand(squad_model *m, json_t *fx) {
    json_t *jr = json_array_get(json_object_get(fx, "rows"), 2); /* the two-image row */
    fx_row f;
    if (!jr || fx_row_load(m, jr, &f)) return;
    /* the compact form of the same row: each run down to one pad; slots and state_len in it */
    json_t *compact = json_object();
    json_t *ids = json_array(), *slots = json_array();
    int out = 0;
    int map[256];
    for (int i = 0; i < f.row.n_ids && i < 256; i++) {
        int rest_of_run = 0; /* a run's tokens after its first */
        for (int k = 0; k < f.row.n_images; k++)
            rest_of_run |= i > f.images[k].pos && i < f.images[k].pos + f.images[k].tokens;
        map[i] = rest_of_run ? -1 : out++;
        if (!rest_of_run) json_array_append_new(ids, json_integer(f.row.ids[i]));
    }
    for (int s = 0; s < f.row.n_slots; s++) json_array_append_new(slots, json_integer(map[f.row.slots[s]]));
    json_object_set_new(compact, "ids", ids);
    json_object_set_new(compact, "slots", slots);
    json_object_set_new(compact, "nopts", json_array());
    for (int s = 0; s < f.row.n_slots; s++) json_array_append_new(json_object_get(compact, "nopts"), json_integer(f.row.nopts[s]));
    json_object_set_new(compact, "letters", json_array());
    for (int l = 0; l < f.row.n_letters; l++)
        json_array_append_new(json_object_get(compact, "letters"), json_integer(f.row.letters[l]));
    json_object_set_new(compact, "state_len", json_integer(map[f.images[1].pos + f.images[1].tokens])); /* after image 2 */
    json_object_set_new(compact, "images", json_pack("[s, s]", "small_64x48.png", "photo_333x517.png"));
    char *text = json_dumps(compact, 0);
    squad_row_buf rb;
    squad_err e = {0};
    int rc = squad_row_parse_json(&rb, text, strlen(text), NULL, 0, &e);
    CHECKF(rc == 0 && rb.n_image_refs == 2, "%s", e.msg);
    squad_row_image imgs[2] = {f.images[0], f.images[1]};
    imgs[0].pos = imgs[1].pos = -1;
    if (!rc) {
        rc = squad_row_expand_images(&rb, m->cfg.image_token_id, imgs, 2, 1 << 20, &e);
        CHECKF(rc == 0, "%s", e.msg);
        CHECK(rb.row.n_ids == f.row.n_ids && !memcmp(rb.row.ids, f.row.ids, sizeof(int32_t) * (size_t)f.row.n_ids));
        CHECK(!memcmp(rb.row.slots, f.row.slots, sizeof(int32_t) * (size_t)f.row.n_slots));
        CHECK(imgs[0].pos == f.images[0].pos && imgs[1].pos == f.images[1].pos);
        CHECK(rb.row.state_len == f.images[1].pos + f.images[1].tokens);
        CHECK(rb.row.images == imgs && rb.row.n_images == 2);
        /* the wrong number of pads for the images */
        squad_row_buf rb2;
        squad_row_parse_json(&rb2, text, strlen(text), NULL, 0, &e);
        CHECK(squad_row_expand_images(&rb2, m->cfg.image_token_id, imgs, 1, 1 << 20, &e) == SQUAD_E_INVALID &&
              strstr(e.msg, "one per image"));
        squad_row_buf_free(&rb2);
    }
    squad_row_buf_free(&rb);
    const char *bad = "{\"ids\": [1], \"slots\": [0], \"nopts\": [1], \"letters\": [2], \"images\": [3]}";
    CHECK(squad_row_parse_json(&rb, bad, strlen(bad), NULL, 0, &e) == SQUAD_E_INVALID && strstr(e.msg, "\"images\"[0]"));
    free(text);
    json_decref(compact);
    fx_row_free(&f);
}

int main(int argc, char **argv) {
    const char *which = test_backend_arg(argc, argv);
    if (!which) return 2;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tiny-vl", test_tmpdir());
    squad_err e = {0};
    squad_model *m = tiny_vl(dir, &e);
    CHECKF(m && m->vision && m->has_image_proc, "tiny-vl: %s", e.msg);
    json_error_t je;
    json_t *fx = json_load_file(VISION_FIXTURE, 0, &je);
    CHECKF(fx != NULL, "%s: %s", VISION_FIXTURE, je.text);
    int ran = 0, known = strcmp(which, "all") == 0;
    for (size_t b = 0; b < sizeof BACKENDS / sizeof BACKENDS[0]; b++) {
        if (strcmp(which, "all") != 0 && strcmp(which, BACKENDS[b].name) != 0) continue;
        known = 1;
        if (!test_backend_usable(BACKENDS[b].device)) {
            printf("test_vision_rows: no usable %s backend (no CUDA build or no device), skipped\n", BACKENDS[b].name);
            continue;
        }
        BE = &BACKENDS[b];
        if (m && fx) {
            test_fixture_rows(m, fx);
            test_cached(m);
            if (BE->device == SQUAD_DEVICE_CPU) { /* no backend in these */
                test_checks(m);
                test_expand(m, fx);
            }
        }
        ran++;
    }
    json_decref(fx);
    squad_model_free(m);
    if (!known) {
        fprintf(stderr, "test_vision_rows: unknown backend '%s' (cpu, cuda or all)\n", which);
        return 2;
    }
    if (!ran) return TEST_SKIPPED;
    return test_summary("test_vision_rows");
}
