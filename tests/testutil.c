/* testutil.c — counters and summary for the test harness (testutil.h). */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "squad.h"
#include "synth.h"

int test_passed, test_failed;

int test_summary(const char *name) {
    printf("%s: %d passed, %d failed\n", name, test_passed, test_failed);
    if (test_passed + test_failed == 0) {
        /* a program that checked nothing proves nothing: a lost fixture or an early return must
         * not read as a pass */
        printf("%s: FAILED: no check ran\n", name);
        return 1;
    }
    return test_failed ? 1 : 0;
}

const char *test_tmpdir(void) {
    static char buf[64];
    strcpy(buf, "/tmp/squad-test-XXXXXX");
    if (!mkdtemp(buf)) return "/tmp";
    return buf;
}

char **test_read_lines(const char *path, int *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char **lines = NULL, *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
        if (line[0] == '\n' || !line[0]) continue;
        char **nl = realloc(lines, sizeof(char *) * (size_t)(*n + 2));
        if (!nl) abort(); /* a test harness out of memory: nothing sensible to report */
        lines = nl;
        lines[(*n)++] = strdup(line);
        lines[*n] = NULL;
    }
    free(line);
    fclose(f);
    return lines;
}

void test_free_lines(char **lines, int n) {
    for (int i = 0; i < n; i++) free(lines[i]);
    free(lines);
}

struct squad_model *test_synth_model(const char *preset, unsigned seed) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), preset);
    squad_synth_opts so;
    memset(&so, 0, sizeof so);
    so.preset = preset;
    so.out_dir = dir;
    so.seed = seed;
    squad_err err = {0};
    if (squad_synth_write(&so, &err)) {
        CHECKF(0, "synth %s: %s", preset, err.msg);
        return NULL;
    }
    squad_model *m = squad_model_load(dir, &err);
    CHECKF(m != NULL, "load %s: %s", preset, err.msg);
    return m;
}

const char *test_backend_arg(int argc, char **argv) {
    const char *which = "cpu";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) which = argv[++i];
        else if (strncmp(argv[i], "--backend=", 10) == 0) which = argv[i] + 10;
        else {
            fprintf(stderr, "usage: %s [--backend cpu|cuda|all]\n", argv[0]);
            return NULL;
        }
    }
    return which;
}

int test_backend_usable(int device) {
    if (device == SQUAD_DEVICE_CPU) return 1;
#ifdef SQUAD_HAVE_CUDA
    return device == SQUAD_DEVICE_CUDA && squad_cuda_device_count() > 0 && squad_cuda_device_usable();
#else
    return 0;
#endif
}

double test_answer_diff(const squad_row *row, const squad_result *a, const squad_result *b) {
    double w = 0;
    for (int s = 0; s < row->n_slots; s++)
        for (int l = 0; l < row->nopts[s]; l++) {
            const double d = fabs((double)a->probs[s][l] - (double)b->probs[s][l]);
            if (!(d <= w)) w = d; /* NaN counts as the worst */
        }
    return w;
}
