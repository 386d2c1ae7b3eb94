/*
 * spec_rows.h — the rows both specialists tests score: test_specialists_exec.c (the CPU against
 * peft's float64 reference) and gpu_test_specialists.c (CUDA against the CPU). One prefix of PREFIX
 * tokens shared by N_ROWS rows, each with its own question of SUFFIX tokens and two answer slots,
 * all drawn from one seeded stream: the GPU test compares against exactly the rows the CPU test
 * checks.
 */
#ifndef SQUAD_TESTS_SPEC_ROWS_H
#define SQUAD_TESTS_SPEC_ROWS_H

#include <stdint.h>
#include <string.h>

#include "squad.h"

#define PREFIX 160
#define SUFFIX 96
#define N_ROWS 3
#define N_LETTERS 4

typedef struct test_row {
    int32_t ids[PREFIX + SUFFIX];
    int32_t slots[2], nopts[2], letters[N_LETTERS];
    squad_row row;
} test_row;

/* A 64-bit LCG step; its high bits. */
static inline uint64_t spec_rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* The N_ROWS rows for a model whose vocabulary has V tokens (letters 10.., state_len PREFIX). */
static inline void spec_rows_make(test_row *rows, int V) {
    uint64_t s = 12345;
    int32_t prefix[PREFIX];
    for (int i = 0; i < PREFIX; i++) prefix[i] = (int32_t)(spec_rng_next(&s) % (uint64_t)V);
    for (int k = 0; k < N_ROWS; k++) {
        test_row *t = &rows[k];
        memcpy(t->ids, prefix, sizeof prefix);
        for (int i = 0; i < SUFFIX; i++) t->ids[PREFIX + i] = (int32_t)(spec_rng_next(&s) % (uint64_t)V);
        t->slots[0] = PREFIX + 40;
        t->slots[1] = PREFIX + SUFFIX - 1;
        t->nopts[0] = 4;
        t->nopts[1] = 3;
        for (int l = 0; l < N_LETTERS; l++) t->letters[l] = 10 + l;
        t->row = (squad_row){t->ids, PREFIX + SUFFIX, t->slots, t->nopts, 2, t->letters, N_LETTERS, PREFIX, 0, NULL, 0};
    }
}

#endif
