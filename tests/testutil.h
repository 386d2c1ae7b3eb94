/*
 * testutil.h — the tiny test harness every tests/test_*.c uses: CHECK macros that count
 * failures, and a summary line "N passed, N failed" that CTest logs show. Zero checks is a failure.
 * Tests that need a GPU and find none return TEST_SKIPPED (CTest's SKIP_RETURN_CODE) instead.
 * Also what several tests share: a seeded input stream and a synthesized model.
 */
#ifndef SQUAD_TESTUTIL_H
#define SQUAD_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "squad.h"

extern int test_passed, test_failed;

/* The exit code CTest reports as "skipped" (SKIP_RETURN_CODE in CMakeLists.txt): only for a test
 * that cannot run here at all (no GPU), never for missing fixtures. */
#define TEST_SKIPPED 77

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (cond) {                                                                   \
            test_passed++;                                                            \
        } else {                                                                      \
            test_failed++;                                                            \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                             \
    } while (0)

#define CHECKF(cond, ...)                                                  \
    do {                                                                   \
        if (cond) {                                                        \
            test_passed++;                                                 \
        } else {                                                           \
            test_failed++;                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

#define CHECK_NEAR(a, b, tol) CHECKF(fabs((double)(a) - (double)(b)) <= (tol), "%.9g vs %.9g (tol %g)", (double)(a), (double)(b), (double)(tol))

/* Prints the summary and returns the process exit code: 0 when at least one check ran and none
 * failed, 1 otherwise (a program that ran no check fails). */
int test_summary(const char *name);
/* The non-empty lines of a file (each with its newline), NULL-terminated; *n their count. NULL
 * with *n = 0 when the file cannot be opened. Free with test_free_lines. */
char **test_read_lines(const char *path, int *n);
void test_free_lines(char **lines, int n);
/* A fresh temporary directory (mkdtemp under /tmp); the caller may leave it. */
/* Tests parametrised by backend (`--backend cpu|cuda|all`, CMakeLists' SQUAD_BACKEND_TESTS): the
 * name argv asks for ("cpu" when none), or NULL after a usage line on stderr for anything else. */
const char *test_backend_arg(int argc, char **argv);
/* 1 when the backend of this device can run here: always for the CPU; for CUDA a build with it and
 * a usable GPU. */
int test_backend_usable(int device);
/* The largest |a - b| of two answers to a row over each slot's nopts letters (a NaN counts as the
 * worst): how far apart two ways of computing the same row are. */
double test_answer_diff(const squad_row *row, const squad_result *a, const squad_result *b);
const char *test_tmpdir(void);

/* A seeded xorshift64 stream for test inputs: 32-bit draws, uniform in (0, 1), normal
 * (Box-Muller). Seed s with a non-zero value. */
typedef struct rng {
    uint64_t s;
} rng;
static inline uint32_t rng_u32(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (uint32_t)(r->s >> 11);
}
static inline double rng_unif(rng *r) { return (rng_u32(r) + 0.5) / 4294967296.0; }
static inline double rng_norm(rng *r) {
    return sqrt(-2.0 * log(rng_unif(r))) * cos(6.283185307179586 * rng_unif(r));
}

/* A synthesized preset written to test_tmpdir()/PRESET and loaded; NULL (a failed check) when
 * either step fails. */
struct squad_model;
struct squad_model *test_synth_model(const char *preset, unsigned seed);

#endif
