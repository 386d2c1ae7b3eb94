/*
 * util.h — small helpers shared by every module: error reporting into squad_err, checked
 * allocation, a growable byte buffer (squad_buf), whole-file reads, bf16/f16 conversion and a
 * monotonic clock.
 *
 * Every fallible function in squad returns a negative squad error code and fills a squad_err via
 * squad_fail(); nothing here prints or exits.
 */
#ifndef SQUAD_UTIL_H
#define SQUAD_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "squad.h"

#if defined(__GNUC__)
#define SQUAD_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SQUAD_PRINTF(a, b)
#endif

/* Fills err (may be NULL) with code and a formatted message; returns code. */
int squad_fail(squad_err *err, int code, const char *fmt, ...) SQUAD_PRINTF(3, 4);
/* Prefixes err->msg with a formatted context ("loading X: " + old message); returns err->code. */
int squad_fail_context(squad_err *err, const char *fmt, ...) SQUAD_PRINTF(2, 3);

/* Checked allocation: NULL with err filled (SQUAD_E_NOMEM) on failure or overflow. */
void *squad_malloc(size_t n, squad_err *err);
void *squad_calloc(size_t count, size_t size, squad_err *err);
/* 64-byte aligned, zeroed; free with squad_aligned_free. */
void *squad_aligned_alloc(size_t n, squad_err *err);
void squad_aligned_free(void *p);
char *squad_strdup(const char *s, squad_err *err);

/* A growable NUL-terminated byte buffer: JSON answers, request bodies, text to encode. Zero-
 * initialise; oom is set (and stays set) when an append could not allocate, so code that writes a
 * sequence of appends checks once at the end; free with squad_buf_free. The appends return 0, or -1
 * once oom is set. */
typedef struct squad_buf {
    char *s; /* NULL until the first append */
    size_t n, cap;
    int oom;
} squad_buf;

int squad_buf_put(squad_buf *b, const void *p, size_t n);
int squad_buf_puts(squad_buf *b, const char *s);
int squad_buf_printf(squad_buf *b, const char *fmt, ...) SQUAD_PRINTF(2, 3);
/* Empties b, keeping its allocation (and its oom mark). */
void squad_buf_reset(squad_buf *b);
/* Hands the text over (the caller frees it; never NULL for an empty buffer) and empties b; NULL,
 * and b freed, when an append failed. */
char *squad_buf_take(squad_buf *b, size_t *len);
void squad_buf_free(squad_buf *b);

/* Reads a whole file into a NUL-terminated buffer (length in *len). */
char *squad_read_file(const char *path, size_t *len, squad_err *err);
/* dir + "/" + name into a new string. */
char *squad_path_join(const char *dir, const char *name, squad_err *err);
/* mkdir -p: dir and its missing parents (0755); an error when dir ends up not a directory. */
int squad_mkdir_p(const char *dir, squad_err *err);

double squad_now_seconds(void);

static inline float squad_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t squad_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float squad_f16_to_f32(uint16_t h);

#endif /* SQUAD_UTIL_H */
