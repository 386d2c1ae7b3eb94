/*
 * bench_screenshot.c — a screenshot request through the library, the way an agent's rows run:
 * issue 27's figures.
 *
 *   bench_screenshot --model DIR --image FILE [--device cpu|cuda] [--reps N] [--page N] [--rows-out FILE]
 *                    [--json FILE]
 *
 * The row: a few tokens of preamble, the image (<|vision_start|>, its <|image_pad|> run,
 * <|vision_end|>), --page tokens of page text (300), then three questions of 20 tokens, each
 * ending in an answer slot. The state is everything before the questions. Cases, wall time around
 * squad_engine_score, median and min of --reps, fresh pseudo-random question tokens every
 * repetition (so the memo never answers):
 *   decode        squad_image_load: the file's bytes to pixels, grid and identity (the request's
 *                 parse, before the engine);
 *   cold          an engine with no state cache and no encoder cache: the processor, the tower and
 *                 every token of the row;
 *   encoder hit   no state cache, the encoder cache on and warm: the state was evicted, the tower's
 *                 output was not (every text token computed, the tower skipped);
 *   follow-up     the state cache on and warm: a new question about the same screenshot (the
 *                 state restored, the questions computed).
 * Each case's first row's letter probabilities go to --rows-out (with its time), the input of
 * tools/hf_vision_timing.py, which runs the same rows through transformers on the same weights.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "squad.h"
#include "util.h"

#define PREAMBLE 8
#define QUESTIONS 3
#define QUESTION_LEN 20
#define N_LETTERS 4
#define MAX_REPS 200

typedef struct bench_row {
    int32_t *ids;
    int n, state_len;
    int32_t slots[QUESTIONS], nopts[QUESTIONS], letters[N_LETTERS];
    squad_row_image image;
    squad_row row;
} bench_row;

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Text ids below the special tokens (the image markup among them). */
static int32_t text_id(const squad_config *c, uint64_t *s) {
    int limit = c->vision_start_token_id < c->vocab_size ? c->vision_start_token_id : c->vocab_size;
    return (int32_t)(rng_next(s) % (uint64_t)(limit > 1000 ? limit - 1000 : limit));
}

static int row_build(bench_row *b, const squad_model *m, const squad_row_image *image, int page, uint64_t seed,
                     squad_err *err) {
    const squad_config *c = &m->cfg;
    uint64_t s = seed * 2654435761u + 1;
    b->n = PREAMBLE + 2 + image->tokens + page + QUESTIONS * QUESTION_LEN;
    b->ids = squad_calloc((size_t)b->n, sizeof(int32_t), err);
    if (!b->ids) return err->code;
    int k = 0;
    uint64_t fixed = 12345; /* the preamble and the page are the same in every row: the state */
    for (int i = 0; i < PREAMBLE; i++) b->ids[k++] = text_id(c, &fixed);
    b->ids[k++] = c->vision_start_token_id;
    b->image = *image;
    b->image.pos = k;
    for (int i = 0; i < image->tokens; i++) b->ids[k++] = c->image_token_id;
    b->ids[k++] = c->vision_end_token_id;
    for (int i = 0; i < page; i++) b->ids[k++] = text_id(c, &fixed);
    b->state_len = k;
    for (int q = 0; q < QUESTIONS; q++) {
        for (int i = 0; i < QUESTION_LEN; i++) b->ids[k++] = text_id(c, &s);
        b->slots[q] = k - 1;
        b->nopts[q] = N_LETTERS;
    }
    for (int i = 0; i < N_LETTERS; i++) b->letters[i] = 100 + 7 * i;
    b->row = (squad_row){b->ids, b->n, b->slots, b->nopts, QUESTIONS, b->letters, N_LETTERS, b->state_len, 0,
                         &b->image, 1};
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct case_figure {
    const char *name, *kind;
    double p50, min;
    int reused, computed;
} case_figure;

static void figure(case_figure *f, double *t, int n) {
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    f->p50 = t[n / 2];
    f->min = t[0];
}

static void row_out(FILE *f, const case_figure *c, const bench_row *b, const squad_result *r, const char *image_path) {
    if (!f) return;
    fprintf(f, "{\"case\": \"%s\", \"kind\": \"%s\", \"images\": [\"%s\"], \"state_len\": %d, \"squad_ms\": %.4f, \"ids\": [",
            c->name, c->kind, image_path, b->state_len, c->p50);
    for (int i = 0; i < b->n; i++) fprintf(f, "%s%d", i ? ", " : "", b->ids[i]);
    fprintf(f, "], \"slots\": [%d, %d, %d], \"nopts\": [%d, %d, %d], \"letters\": [", b->slots[0], b->slots[1], b->slots[2],
            N_LETTERS, N_LETTERS, N_LETTERS);
    for (int i = 0; i < N_LETTERS; i++) fprintf(f, "%s%d", i ? ", " : "", b->letters[i]);
    fprintf(f, "], \"probs\": [");
    for (int q = 0; r && q < QUESTIONS; q++) {
        fprintf(f, "%s[", q ? ", " : "");
        for (int i = 0; i < N_LETTERS; i++) fprintf(f, "%s%.9g", i ? ", " : "", r->probs[q][i]);
        fprintf(f, "]");
    }
    fprintf(f, "]}\n");
}

/* Runs reps rows of fresh questions on engine e (after `warm` untimed rows), timing each. */
static int run_case(squad_engine *e, const squad_model *m, const squad_row_image *image, int page, int reps, int warm,
                    uint64_t seed0, case_figure *f, bench_row *first, squad_result *first_result, squad_err *err) {
    double t[MAX_REPS];
    for (int i = -warm; i < reps; i++) {
        bench_row b;
        if (row_build(&b, m, image, page, seed0 + (uint64_t)(i + warm), err)) return err->code;
        squad_result r;
        double t0 = squad_now_seconds();
        int rc = squad_engine_score(e, &b.row, &r, err);
        double dt = squad_now_seconds() - t0;
        if (rc) {
            free(b.ids);
            return rc;
        }
        if (i >= 0) {
            t[i] = dt * 1e3;
            f->reused = r.reused;
            f->computed = r.computed;
        }
        if (i == 0) {
            *first = b;
            *first_result = r;
        } else {
            free(b.ids);
        }
    }
    figure(f, t, reps);
    return 0;
}

static squad_engine *engine_new(squad_model *m, squad_device dev, int state_cache, int encoder_cache,
                                squad_err *err) {
    squad_engine_opts o;
    squad_engine_opts_default(&o);
    o.device = dev;
    if (!state_cache) o.cache.budget_bytes = 0;
    if (!encoder_cache) o.encoder_cache_bytes = 0;
    return squad_engine_new(m, &o, err);
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *image_path = NULL, *rows_out = NULL, *json_out = NULL;
    squad_device dev = SQUAD_DEVICE_AUTO;
    int reps = 20, page = 300;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) model_dir = argv[++i];
        else if (!strcmp(a, "--image") && v) image_path = argv[++i];
        else if (!strcmp(a, "--rows-out") && v) rows_out = argv[++i];
        else if (!strcmp(a, "--json") && v) json_out = argv[++i];
        else if (!strcmp(a, "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--page") && v) page = atoi(argv[++i]);
        else if (!strcmp(a, "--device") && v) {
            const char *d = argv[++i];
            dev = !strcmp(d, "cpu") ? SQUAD_DEVICE_CPU : !strcmp(d, "cuda") ? SQUAD_DEVICE_CUDA : SQUAD_DEVICE_AUTO;
        } else {
            fprintf(stderr, "usage: bench_screenshot --model DIR --image FILE [--device cpu|cuda] [--reps N] [--page N] "
                            "[--rows-out FILE] [--json FILE]\n");
            return 2;
        }
    }
    if (!model_dir || !image_path || reps < 1 || reps > MAX_REPS || page < 0) {
        fprintf(stderr, "bench_screenshot: --model and --image are required; --reps 1..%d\n", MAX_REPS);
        return 2;
    }
    squad_err err = {0};
    squad_model *m = squad_model_load(model_dir, &err);
    if (!m) {
        fprintf(stderr, "bench_screenshot: %s\n", err.msg);
        return 1;
    }
    size_t len = 0;
    uint8_t *bytes = (uint8_t *)squad_read_file(image_path, &len, &err);
    if (!bytes) {
        fprintf(stderr, "bench_screenshot: %s\n", err.msg);
        return 1;
    }
    /* decode: the request's parse */
    double td[MAX_REPS];
    squad_row_image image = {0};
    for (int i = 0; i < reps; i++) {
        if (i) squad_row_image_free(&image);
        double t0 = squad_now_seconds();
        if (squad_image_load(m, bytes, len, 0, &image, &err)) {
            fprintf(stderr, "bench_screenshot: %s: %s\n", image_path, err.msg);
            return 1;
        }
        td[i] = (squad_now_seconds() - t0) * 1e3;
    }
    case_figure fd = {"decode", "decode", 0, 0, 0, 0};
    figure(&fd, td, reps);
    printf("image %s: grid %dx%dx%d, %d tokens; row %d tokens (state %d)\n", image_path, image.grid[0], image.grid[1],
           image.grid[2], image.tokens, PREAMBLE + 2 + image.tokens + page + QUESTIONS * QUESTION_LEN,
           PREAMBLE + 2 + image.tokens + page);

    struct {
        const char *name, *kind;
        int state_cache, encoder_cache, warm;
    } plan[] = {
        {"screenshot cold", "cold", 0, 0, 1},
        {"screenshot encoder hit", "cold", 0, 1, 1},
        {"screenshot follow-up", "hit", 1, 1, 1},
    };
    FILE *rf = rows_out ? fopen(rows_out, "w") : NULL;
    FILE *jf = json_out ? fopen(json_out, "w") : NULL;
    if ((rows_out && !rf) || (json_out && !jf)) {
        fprintf(stderr, "bench_screenshot: cannot write %s\n", rf ? json_out : rows_out);
        return 1;
    }
    printf("| case | p50 ms | min ms | reused | computed |\n| --- | ---: | ---: | ---: | ---: |\n");
    printf("| decode (squad_image_load) | %.3f | %.3f | | |\n", fd.p50, fd.min);
    int status = 0;
    for (size_t k = 0; k < sizeof plan / sizeof plan[0]; k++) {
        squad_engine *e = engine_new(m, dev, plan[k].state_cache, plan[k].encoder_cache, &err);
        if (!e) {
            fprintf(stderr, "bench_screenshot: %s\n", err.msg);
            status = 1;
            break;
        }
        case_figure f = {plan[k].name, plan[k].kind, 0, 0, 0, 0};
        bench_row first = {0};
        squad_result first_r;
        if (run_case(e, m, &image, page, reps, plan[k].warm, 1000 * (k + 1), &f, &first, &first_r, &err)) {
            fprintf(stderr, "bench_screenshot: %s: %s\n", plan[k].name, err.msg);
            squad_engine_free(e);
            status = 1;
            break;
        }
        squad_cache_stats cs;
        squad_engine_cache_stats(e, &cs);
        printf("| %s | %.3f | %.3f | %d | %d |   (encoder hits %llu, misses %llu; %s)\n", f.name, f.p50, f.min, f.reused,
               f.computed, (unsigned long long)cs.encoder_hits, (unsigned long long)cs.encoder_misses,
               squad_engine_device(e));
        row_out(rf, &f, &first, &first_r, image_path);
        if (jf) fprintf(jf, "{\"case\": \"%s\", \"p50_ms\": %.4f, \"min_ms\": %.4f}\n", f.name, f.p50, f.min);
        free(first.ids);
        squad_engine_free(e);
    }
    /* the tower alone, for transformers' side: its row carries no squad time (bench_vision has it) */
    if (rf && !status) {
        bench_row b;
        if (!row_build(&b, m, &image, page, 1, &err)) {
            case_figure ft = {"tower", "tower", 0, 0, 0, 0};
            row_out(rf, &ft, &b, NULL, image_path);
            free(b.ids);
        }
    }
    if (rf) fclose(rf);
    if (jf) fclose(jf);
    squad_row_image_free(&image);
    free(bytes);
    squad_model_free(m);
    return status;
}
