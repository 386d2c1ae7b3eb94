/*
 * bench_image.c — the image processor's time on one image: decode once, then the resize alone and
 * the whole processor (resize, normalisation, patch layout) at each thread count asked.
 *
 *   bench_image [--image FILE] [--threads 1,2,...] [--reps N] [--config FILE]
 *
 * Defaults: tests/fixtures/images/ui_1920x1080.png (a 1920x1080 screenshot: 1920x1088, 8,160
 * patches), threads 1 and 2, 5 reps, the Qwen3.5 processor configuration (patch 16, merge 2,
 * temporal 2, mean / std 0.5, 64 Ki to 16 Mi pixels). Wall-clock milliseconds, best and median of
 * the reps. Each rep allocates and frees the pixel values, as a request does (their page faults
 * are part of the figure). Also checks that every thread count gives the same bytes as the first
 * (exit 1 when not).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/decode.h"
#include "image/preprocess.h"
#include "image/resample.h"
#include "util.h"

#define DEFAULT_IMAGE "tests/fixtures/images/ui_1920x1080.png"
#define QWEN35_CONFIG                                                                                                  \
    "{\"patch_size\": 16, \"temporal_patch_size\": 2, \"merge_size\": 2, \"image_mean\": [0.5, 0.5, 0.5],"           \
    " \"image_std\": [0.5, 0.5, 0.5], \"size\": {\"shortest_edge\": 65536, \"longest_edge\": 16777216}}"
#define MAX_REPS 100
#define MAX_COUNTS 16

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, int threads, double *t, int reps) {
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    printf("| %s | %d | %.2f | %.2f |\n", what, threads, 1e3 * t[0], 1e3 * t[reps / 2]);
}

int main(int argc, char **argv) {
    const char *image_path = DEFAULT_IMAGE, *config_path = NULL, *threads_arg = "1,2";
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--image") && v) image_path = argv[++i];
        else if (!strcmp(a, "--threads") && v) threads_arg = argv[++i];
        else if (!strcmp(a, "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--config") && v) config_path = argv[++i];
        else {
            fprintf(stderr, "usage: bench_image [--image FILE] [--threads 1,2,...] [--reps N] [--config FILE]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "bench_image: --reps 1..%d\n", MAX_REPS);
        return 2;
    }
    int counts[MAX_COUNTS], n_counts = 0;
    for (const char *p = threads_arg; *p && n_counts < MAX_COUNTS;) {
        counts[n_counts++] = atoi(p);
        const char *comma = strchr(p, ',');
        if (!comma) break;
        p = comma + 1;
    }
    squad_err err = {0};
    squad_image_proc_config c;
    if ((config_path ? squad_image_proc_config_load(&c, config_path, &err)
                     : squad_image_proc_config_parse(&c, QWEN35_CONFIG, strlen(QWEN35_CONFIG), &err)) != 0) {
        fprintf(stderr, "bench_image: %s\n", err.msg);
        return 1;
    }
    size_t len = 0;
    uint8_t *bytes = (uint8_t *)squad_read_file(image_path, &len, &err);
    squad_image img;
    if (!bytes || squad_image_decode(bytes, len, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, &img, &err) != 0) {
        fprintf(stderr, "bench_image: %s: %s\n", image_path, err.msg);
        free(bytes);
        return 1;
    }
    free(bytes);
    int grid[3];
    if (squad_image_grid(&c, img.width, img.height, grid, &err) != 0) {
        fprintf(stderr, "bench_image: %s\n", err.msg);
        return 1;
    }
    const int rh = grid[1] * c.patch_size, rw = grid[2] * c.patch_size;
    printf("%s: %dx%d -> %dx%d, grid %dx%dx%d; best and median of %d, ms\n\n", image_path, img.width, img.height, rw, rh,
           grid[0], grid[1], grid[2], reps);
    printf("| step | threads | best | median |\n| --- | ---: | ---: | ---: |\n");
    double t[MAX_REPS];
    uint8_t *resized = malloc((size_t)rw * rh * 3);
    if (!resized) return 1;
    for (int r = 0; r < reps; r++) {
        double t0 = squad_now_seconds();
        if (squad_resample_bicubic_u8(img.rgb, img.width, img.height, 3, resized, rw, rh, &err) != 0) {
            fprintf(stderr, "bench_image: %s\n", err.msg);
            return 1;
        }
        t[r] = squad_now_seconds() - t0;
    }
    report("resize (squad_resample_bicubic_u8)", 1, t, reps);
    free(resized);
    float *first = NULL;
    size_t n_values = 0;
    int same = 1;
    for (int k = 0; k < n_counts; k++) {
        for (int r = 0; r < reps; r++) {
            squad_image_patches p;
            double t0 = squad_now_seconds();
            if (squad_image_preprocess_threads(&c, &img, counts[k], &p, &err) != 0) {
                fprintf(stderr, "bench_image: %s\n", err.msg);
                return 1;
            }
            t[r] = squad_now_seconds() - t0;
            n_values = (size_t)p.n_patches * (size_t)p.patch_dim;
            if (!first) {
                first = p.pixel_values;
                p.pixel_values = NULL;
            } else {
                same &= memcmp(first, p.pixel_values, n_values * sizeof(float)) == 0;
            }
            squad_image_patches_free(&p);
        }
        report("processor (squad_image_preprocess_threads)", counts[k], t, reps);
    }
    printf("\nevery thread count gave the same %zu values: %s\n", n_values, same ? "yes" : "NO");
    free(first);
    squad_image_free(&img);
    return same ? 0 : 1;
}
