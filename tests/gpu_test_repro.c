/*
 * gpu_test_repro.c — the same rows give the same bits in two processes on the same GPU.
 *
 * The CUDA backend picks each GEMM shape's cuBLASLt algorithm by timing, which is noisy, and keeps
 * the choice in a plan file (src/cuda/gemm_plans.cu) that later processes reuse. This test runs
 * itself as child processes (each: a synthesized demo model on the CUDA backend, rows of 700 and
 * 3000 tokens on both precisions, the probabilities written as raw floats) and checks:
 *  - the first child, with no plan file, writes one (the format's header and at least one shape);
 *  - a second child with that file gives bit-identical probabilities and tunes nothing (the file
 *    is not rewritten: same inode, same bytes);
 *  - a file of another GPU and a corrupt file are ignored and replaced by a valid one;
 *  - without SQUAD_GEMM_PLANS the file goes to $XDG_CACHE_HOME/squad/gemm-plans.txt, and
 *    SQUAD_GEMM_PLANS=off writes none.
 * Two fresh processes (no file) may choose differently and are not compared. Exits 77 (skipped)
 * without a GPU; fails when the model cannot be synthesized.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "squad.h"
#include "synth.h"
#include "testutil.h"

#define PLANS_HEADER "squad-gemm-plans 1 "
#define N_LETTERS 4
#define ROW_SLOTS 3

#ifdef SQUAD_HAVE_CUDA
static const int ROW_LENGTHS[] = {700, 3000};
#define N_ROWS ((int)(sizeof ROW_LENGTHS / sizeof ROW_LENGTHS[0]))

/* ---- the child: run the rows, write the probabilities ---- */

static int child(const char *model_dir, const char *out_path) {
    squad_err err = {0, {0}};
    squad_model *m = squad_model_load(model_dir, &err);
    if (!m) {
        fprintf(stderr, "child: %s\n", err.msg);
        return 1;
    }
    FILE *out = fopen(out_path, "wb");
    int rc = out ? 0 : 1;
    const squad_precision precs[2] = {SQUAD_PRECISION_DEFAULT, SQUAD_PRECISION_EXACT};
    for (int p = 0; p < 2 && !rc; p++) {
        squad_engine_opts o;
        squad_engine_opts_default(&o);
        o.device = SQUAD_DEVICE_CUDA;
        o.precision = precs[p];
        o.cache.budget_bytes = 0; /* every row computed in full */
        squad_engine *e = squad_engine_new(m, &o, &err);
        if (!e) {
            fprintf(stderr, "child: %s\n", err.msg);
            rc = 1;
            break;
        }
        const int vocab = squad_model_vocab_size(m);
        for (int r = 0; r < N_ROWS && !rc; r++) {
            const int n = ROW_LENGTHS[r];
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
            squad_result *res = malloc(sizeof *res);
            if (!ids || !res) {
                free(ids);
                free(res);
                rc = 1;
                break;
            }
            uint32_t x = 2463534242u + (uint32_t)n;
            for (int t = 0; t < n; t++) {
                x ^= x << 13, x ^= x >> 17, x ^= x << 5;
                ids[t] = (int32_t)(x % (uint32_t)vocab);
            }
            const int32_t slots[ROW_SLOTS] = {n / 3, 2 * n / 3, n - 1}, nopts[ROW_SLOTS] = {2, 3, 4};
            const int32_t letters[N_LETTERS] = {1 % vocab, 2 % vocab, 3 % vocab, 4 % vocab};
            const squad_row row = {ids, n, slots, nopts, ROW_SLOTS, letters, N_LETTERS, -1, 0, NULL, 0};
            if (squad_engine_score(e, &row, res, &err)) {
                fprintf(stderr, "child: row of %d: %s\n", n, err.msg);
                rc = 1;
            } else if (fwrite(res->probs, sizeof res->probs[0], ROW_SLOTS, out) != ROW_SLOTS) {
                rc = 1;
            }
            free(ids);
            free(res);
        }
        squad_engine_free(e);
    }
    if (out && fclose(out)) rc = 1;
    squad_model_free(m);
    return rc;
}

/* ---- the parent ---- */

static char self_path[4096];

/* Runs this program as a child on model_dir writing out_path; its exit status (-1: did not run). */
static int run_child(const char *model_dir, const char *out_path) {
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execl(self_path, self_path, "--child", model_dir, out_path, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The whole file (NUL-terminated); NULL when unreadable. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = 0;
    if (len) *len = n;
    return buf;
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* The plan file holds the header and at least one shape line; *first_line gets the header. */
static int plan_file_valid(const char *path, char *first_line, size_t cap) {
    char *s = slurp(path, NULL);
    if (!s) return 0;
    const char *nl = strchr(s, '\n');
    const int ok = nl && !strncmp(s, PLANS_HEADER, strlen(PLANS_HEADER)) && nl[1] != 0;
    if (ok && first_line) snprintf(first_line, cap, "%.*s", (int)(nl - s), s);
    free(s);
    return ok;
}

static int same_bytes(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    const int same = x && y && na == nb && na > 0 && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--child")) return child(argv[2], argv[3]);
    if (squad_cuda_device_count() <= 0) {
        printf("gpu_test_repro: no CUDA device, skipped\n");
        return TEST_SKIPPED;
    }
    const ssize_t sl = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    CHECKF(sl > 0, "readlink /proc/self/exe");
    if (sl <= 0) return test_summary("gpu_test_repro");
    self_path[sl] = 0;

    const char *tmp = test_tmpdir();
    char model[700], plans[700], out_a[700], out_b[700], out_c[700], xdg[700], xdg_file[800];
    snprintf(model, sizeof model, "%s/demo", tmp);
    snprintf(plans, sizeof plans, "%s/plans.txt", tmp);
    snprintf(out_a, sizeof out_a, "%s/a.bin", tmp);
    snprintf(out_b, sizeof out_b, "%s/b.bin", tmp);
    snprintf(out_c, sizeof out_c, "%s/c.bin", tmp);
    snprintf(xdg, sizeof xdg, "%s/xdg", tmp);
    snprintf(xdg_file, sizeof xdg_file, "%s/squad/gemm-plans.txt", xdg);
    squad_synth_opts so;
    memset(&so, 0, sizeof so);
    so.preset = "demo";
    so.out_dir = model;
    so.seed = 11;
    squad_err err = {0, {0}};
    const int synth_rc = squad_synth_write(&so, &err);
    CHECKF(synth_rc == 0, "synth demo: %s", err.msg);
    if (synth_rc) return test_summary("gpu_test_repro");

    /* a first process writes the plan file; a second one reuses it: the same bits, no tuning */
    setenv("SQUAD_GEMM_PLANS", plans, 1);
    CHECKF(run_child(model, out_a) == 0, "first process");
    char header[512] = "";
    CHECKF(plan_file_valid(plans, header, sizeof header), "the first process wrote %s", plans);
    struct stat st1, st2;
    const int s1 = stat(plans, &st1);
    char *before = slurp(plans, NULL);
    CHECKF(run_child(model, out_b) == 0, "second process");
    CHECKF(same_bytes(out_a, out_b), "two processes with one plan file give bit-identical probabilities");
    char *after = slurp(plans, NULL);
    const int s2 = stat(plans, &st2);
    CHECKF(s1 == 0 && s2 == 0 && st1.st_ino == st2.st_ino && before && after && !strcmp(before, after),
           "the second process tuned nothing (the plan file was not rewritten)");
    printf("plan file %s: %s\n", plans, header);

    /* another GPU's file is ignored and replaced (the same shape lines, another header) */
    if (before) {
        const char *lines = strchr(before, '\n');
        char *other = malloc(strlen(before) + 64);
        if (other && lines) {
            sprintf(other, "%sgpu=Some_Other_GPU cc=1.0 sms=1 cublaslt=1 cudart=1 ws=1%s", PLANS_HEADER, lines);
            CHECK(write_text(plans, other) == 0);
            CHECKF(run_child(model, out_c) == 0, "process with another GPU's plan file");
            char h2[512] = "";
            CHECKF(plan_file_valid(plans, h2, sizeof h2) && !strcmp(h2, header),
                   "another GPU's plan file is replaced by this GPU's (%s)", h2);
        }
        free(other);
    }
    /* a corrupt file is ignored and replaced */
    CHECK(write_text(plans, "squad-gemm-plans 1 garbage\n1 2 3 zz\n\x01\x02\n") == 0);
    CHECKF(run_child(model, out_c) == 0, "process with a corrupt plan file");
    char h3[512] = "";
    CHECKF(plan_file_valid(plans, h3, sizeof h3) && !strcmp(h3, header), "a corrupt plan file is replaced (%s)", h3);

    /* the default place, and off */
    setenv("XDG_CACHE_HOME", xdg, 1);
    setenv("SQUAD_GEMM_PLANS", "off", 1);
    CHECKF(run_child(model, out_c) == 0, "process with SQUAD_GEMM_PLANS=off");
    struct stat st3;
    CHECKF(stat(xdg_file, &st3) != 0, "SQUAD_GEMM_PLANS=off writes no plan file");
    unsetenv("SQUAD_GEMM_PLANS");
    CHECKF(run_child(model, out_c) == 0, "process with the default plan file");
    CHECKF(plan_file_valid(xdg_file, NULL, 0), "the plan file goes to $XDG_CACHE_HOME/squad/gemm-plans.txt");
    free(before);
    free(after);
    return test_summary("gpu_test_repro");
}
#else
int main(void) {
    printf("gpu_test_repro: built without CUDA, skipped\n");
    return TEST_SKIPPED;
}
#endif
