/*
 * util.c — error reporting, checked allocation, file reads and conversions (see util.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int squad_fail(squad_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int squad_fail_context(squad_err *err, const char *fmt, ...) {
    if (!err) return SQUAD_E_INVALID;
    char prefix[SQUAD_ERR_MSG];
    char old[SQUAD_ERR_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    old[sizeof old - 1] = 0;
    /* prefix + old message, cut to the buffer */
    size_t pl = strnlen(prefix, sizeof err->msg - 1);
    size_t ol = strnlen(old, sizeof err->msg - 1 - pl);
    memmove(err->msg + pl, old, ol);
    memcpy(err->msg, prefix, pl);
    err->msg[pl + ol] = 0;
    if (err->code == 0) err->code = SQUAD_E_INVALID;
    return err->code;
}

void *squad_malloc(size_t n, squad_err *err) {
    void *p = malloc(n ? n : 1);
    if (!p) squad_fail(err, SQUAD_E_NOMEM, "out of memory (%zu bytes)", n);
    return p;
}

void *squad_calloc(size_t count, size_t size, squad_err *err) {
    if (size && count > SIZE_MAX / size) {
        squad_fail(err, SQUAD_E_NOMEM, "allocation size overflows (%zu x %zu)", count, size);
        return NULL;
    }
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) squad_fail(err, SQUAD_E_NOMEM, "out of memory (%zu x %zu bytes)", count, size);
    return p;
}

void *squad_aligned_alloc(size_t n, squad_err *err) {
    void *p = NULL;
    size_t rounded = (n + 63) & ~(size_t)63;
    if (rounded < n || posix_memalign(&p, 64, rounded ? rounded : 64) != 0) {
        squad_fail(err, SQUAD_E_NOMEM, "out of memory (%zu bytes, aligned)", n);
        return NULL;
    }
    memset(p, 0, rounded ? rounded : 64);
    return p;
}

void squad_aligned_free(void *p) { free(p); }

char *squad_strdup(const char *s, squad_err *err) {
    size_t n = strlen(s) + 1;
    char *p = squad_malloc(n, err);
    if (p) memcpy(p, s, n);
    return p;
}

char *squad_read_file(const char *path, size_t *len, squad_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        squad_fail(err, SQUAD_E_IO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = squad_malloc(cap + 1, err);
    if (!buf) {
        fclose(f);
        return NULL;
    }
    for (;;) {
        if (n == cap) {
            if (cap > (SIZE_MAX >> 2)) {
                free(buf);
                fclose(f);
                squad_fail(err, SQUAD_E_NOMEM, "file %s is too large", path);
                return NULL;
            }
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                squad_fail(err, SQUAD_E_NOMEM, "out of memory reading %s", path);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        squad_fail(err, SQUAD_E_IO, "error reading %s", path);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

char *squad_path_join(const char *dir, const char *name, squad_err *err) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = squad_malloc(a + b + 2, err);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

double squad_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

float squad_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            man &= 0x3ff;
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp - 15 + 127) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int squad_mkdir_p(const char *dir, squad_err *err) {
    char *p = squad_strdup(dir, err);
    if (!p) return SQUAD_E_NOMEM;
    int rc = 0;
    size_t n = strlen(p);
    for (size_t i = 1; i <= n && rc == 0; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char saved = p[i];
        p[i] = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) rc = squad_fail(err, SQUAD_E_IO, "cannot create %s: %s", p, strerror(errno));
        p[i] = saved;
    }
    struct stat st;
    if (rc == 0 && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)))
        rc = squad_fail(err, SQUAD_E_IO, "%s is not a directory", dir);
    free(p);
    return rc;
}

/* ---- squad_buf ------------------------------------------------------------------------------ */

/* The first allocation of a buffer; it doubles from there. */
#define SQUAD_BUF_FIRST_CAP 256

static int buf_reserve(squad_buf *b, size_t more) {
    if (b->oom) return -1;
    if (more > SIZE_MAX - 1 - b->n) {
        b->oom = 1;
        return -1;
    }
    if (b->n + more + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : SQUAD_BUF_FIRST_CAP;
    while (cap < b->n + more + 1) {
        if (cap > SIZE_MAX / 2) {
            b->oom = 1;
            return -1;
        }
        cap *= 2;
    }
    char *s = realloc(b->s, cap);
    if (!s) {
        b->oom = 1;
        return -1;
    }
    b->s = s;
    b->cap = cap;
    return 0;
}

int squad_buf_put(squad_buf *b, const void *p, size_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
    return 0;
}

int squad_buf_puts(squad_buf *b, const char *s) { return squad_buf_put(b, s, strlen(s)); }

int squad_buf_printf(squad_buf *b, const char *fmt, ...) {
    va_list ap;
    char small[256];
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return -1;
    }
    if ((size_t)n < sizeof small) return squad_buf_put(b, small, (size_t)n);
    if (buf_reserve(b, (size_t)n) < 0) return -1;
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
    return 0;
}

void squad_buf_reset(squad_buf *b) {
    b->n = 0;
    if (b->s) b->s[0] = 0;
}

char *squad_buf_take(squad_buf *b, size_t *len) {
    if (b->oom || buf_reserve(b, 0) < 0) {
        squad_buf_free(b);
        return NULL;
    }
    b->s[b->n] = 0; /* a buffer never appended to gets its first allocation here */
    char *s = b->s;
    if (len) *len = b->n;
    memset(b, 0, sizeof *b);
    return s;
}

void squad_buf_free(squad_buf *b) {
    free(b->s);
    memset(b, 0, sizeof *b);
}
