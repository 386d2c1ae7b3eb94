/*
 * long_rows.h — the rows of the long-row test, test_long.c (every backend, against the CPU): n
 * pseudo-random ids from a seed, answer slots at the last two tokens, so every backend scores the
 * same rows for the same seed.
 */
#ifndef SQUAD_TESTS_LONG_ROWS_H
#define SQUAD_TESTS_LONG_ROWS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "squad.h"

#define N_LETTERS 4

typedef struct test_row {
    int32_t *ids; /* malloc'd: free(t->ids) */
    int32_t slots[2], nopts[2], letters[N_LETTERS];
    squad_row row;
} test_row;

/* A row of n ids (seeded) over a vocabulary of `vocab` tokens with state_len given; -1 when memory
 * is short. */
static inline int row_make(test_row *t, int n, int vocab, unsigned seed, int state_len) {
    t->ids = malloc(sizeof(int32_t) * (size_t)n);
    if (!t->ids) return -1;
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 7;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        t->ids[i] = (int32_t)((s >> 33) % (uint64_t)vocab);
    }
    for (int i = 0; i < N_LETTERS; i++) t->letters[i] = 10 + i;
    t->slots[0] = n - 2;
    t->slots[1] = n - 1;
    t->nopts[0] = N_LETTERS;
    t->nopts[1] = N_LETTERS - 1;
    squad_row r = {t->ids, n, t->slots, t->nopts, 2, t->letters, N_LETTERS, state_len, 0, NULL, 0};
    t->row = r;
    return 0;
}

/* The largest difference between two answers' probabilities (INFINITY on a NaN). */
static inline double worst_diff(const squad_result *a, const squad_result *b, const squad_row *row) {
    double w = 0;
    for (int s = 0; s < row->n_slots; s++)
        for (int l = 0; l < row->nopts[s]; l++) {
            const double d = fabs((double)a->probs[s][l] - (double)b->probs[s][l]);
            if (!(d <= w)) w = isnan(d) ? INFINITY : d;
        }
    return w;
}

#endif
