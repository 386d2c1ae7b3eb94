/*
 * json_text.c — JSON values as Python's json.dumps(value, ensure_ascii=False) writes them (see
 * json_text.h).
 *
 * Design: one recursive walk appends to a squad_buf (util.h). Strings escape exactly what Python's
 * encoder escapes (the quote, the backslash, and code points below 0x20: \b \t \n \f \r by their
 * short forms, the rest as \u00xx with lowercase hex); everything else, DEL and non-ASCII included,
 * is copied as it is. Reals follow Python's repr: the shortest digit string that reads back as the
 * same double (found by trying 1..17 significant digits, with the neighbours of the correctly
 * rounded string so the asymmetric interval at a power of two is covered too), written in fixed
 * notation when the decimal exponent is in [-4, 16) and in exponent notation ("1e+16", "1.5e-07")
 * otherwise.
 */
#define _POSIX_C_SOURCE 200809L
#include "json_text.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* repr switches to exponent notation outside this range of decimal exponents. */
#define REPR_EXP_MIN (-4)
#define REPR_EXP_MAX 16 /* exclusive */
#define DOUBLE_MAX_DIGITS 17

/* A JSON string literal with Python's escapes. */
static int put_string(squad_buf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    if (squad_buf_put(b, "\"", 1) < 0) return -1;
    size_t run = 0; /* bytes copied as they are, pending */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                memcpy(u, "\\u00", 4);
                u[4] = hex[c >> 4];
                u[5] = hex[c & 15];
                u[6] = 0;
                esc = u;
            }
        }
        if (!esc) continue;
        if (squad_buf_put(b, s + run, i - run) < 0 || squad_buf_puts(b, esc) < 0) return -1;
        run = i + 1;
    }
    if (squad_buf_put(b, s + run, n - run) < 0) return -1;
    return squad_buf_put(b, "\"", 1);
}

/* Adds delta (+1 or -1) to the last digit of a string of decimal digits; 0 when the result keeps
 * its length and does not start with 0, else -1 (such a neighbour has another digit count). */
static int digits_step(char *d, int n, int delta) {
    int i = n - 1;
    if (delta > 0) {
        while (i >= 0 && d[i] == '9') d[i--] = '0';
        if (i < 0) return -1;
        d[i]++;
    } else {
        while (i >= 0 && d[i] == '0') d[i--] = '9';
        if (i < 0) return -1;
        d[i]--;
    }
    return d[0] == '0' ? -1 : 0;
}

/* The double that digits d[0..n) x 10^(e - n + 1) reads back as. */
static double digits_value(int neg, const char *d, int n, int e) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s%.1s.%.*se%d", neg ? "-" : "", d, n - 1, d + 1, e);
    return strtod(buf, NULL);
}

/* The shortest digits (no trailing zeros) that read back as x (finite, nonzero, positive or not):
 * d receives them, *e the decimal exponent of the first digit. Returns the digit count. */
static int shortest_digits(double x, char *d, int *e) {
    int neg = x < 0;
    for (int p = 1; p <= DOUBLE_MAX_DIGITS; p++) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.*e", p - 1, fabs(x));
        /* buf: D[.DDD]e[+-]XX */
        int n = 0;
        for (const char *c = buf; *c && *c != 'e'; c++)
            if (*c != '.') d[n++] = *c;
        int ex = atoi(strchr(buf, 'e') + 1);
        int found = digits_value(neg, d, n, ex) == x;
        for (int delta = -1; !found && delta <= 1; delta += 2) {
            char alt[DOUBLE_MAX_DIGITS + 1];
            memcpy(alt, d, (size_t)n);
            if (digits_step(alt, n, delta) == 0 && digits_value(neg, alt, n, ex) == x) {
                memcpy(d, alt, (size_t)n);
                found = 1;
            }
        }
        if (found || p == DOUBLE_MAX_DIGITS) {
            while (n > 1 && d[n - 1] == '0') n--;
            *e = ex;
            return n;
        }
    }
    return 0; /* not reached */
}

int squad_json_real_text(double x, char *buf, size_t cap) {
    if (x == 0) return snprintf(buf, cap, "%s", signbit(x) ? "-0.0" : "0.0");
    char d[DOUBLE_MAX_DIGITS + 8];
    int e, n = shortest_digits(x, d, &e), k = 0;
    char out[64];
    if (x < 0) out[k++] = '-';
    if (e >= REPR_EXP_MIN && e < REPR_EXP_MAX) {
        if (e < 0) { /* 0.000ddd */
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -e - 1; i++) out[k++] = '0';
            for (int i = 0; i < n; i++) out[k++] = d[i];
        } else { /* ddd[000].[ddd or 0] */
            for (int i = 0; i <= e; i++) out[k++] = i < n ? d[i] : '0';
            out[k++] = '.';
            if (n > e + 1)
                for (int i = e + 1; i < n; i++) out[k++] = d[i];
            else out[k++] = '0';
        }
        out[k] = 0;
    } else { /* d[.ddd]e+XX */
        out[k++] = d[0];
        if (n > 1) {
            out[k++] = '.';
            for (int i = 1; i < n; i++) out[k++] = d[i];
        }
        snprintf(out + k, sizeof out - (size_t)k, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    return snprintf(buf, cap, "%s", out);
}

/* -1 when out of memory (b->oom) or a real is not finite (err says so). */
static int put_value(squad_buf *b, const json_t *v, squad_err *err) {
    char num[64];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        if (squad_buf_put(b, "{", 1) < 0) return -1;
        const char *key;
        json_t *item;
        int first = 1;
        /* json_object_foreach takes a non-const object; iteration does not modify it. */
        json_object_foreach((json_t *)v, key, item) {
            if (!first && squad_buf_put(b, ", ", 2) < 0) return -1;
            first = 0;
            if (put_string(b, key, strlen(key)) < 0 || squad_buf_put(b, ": ", 2) < 0 || put_value(b, item, err) < 0) return -1;
        }
        return squad_buf_put(b, "}", 1);
    }
    case JSON_ARRAY:
        if (squad_buf_put(b, "[", 1) < 0) return -1;
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i && squad_buf_put(b, ", ", 2) < 0) return -1;
            if (put_value(b, json_array_get(v, i), err) < 0) return -1;
        }
        return squad_buf_put(b, "]", 1);
    case JSON_STRING: return put_string(b, json_string_value(v), json_string_length(v));
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return squad_buf_puts(b, num);
    case JSON_REAL: {
        double x = json_real_value(v);
        if (!isfinite(x)) {
            squad_fail(err, SQUAD_E_INVALID, "a JSON number is not finite");
            return -1;
        }
        squad_json_real_text(x, num, sizeof num);
        return squad_buf_puts(b, num);
    }
    case JSON_TRUE: return squad_buf_puts(b, "true");
    case JSON_FALSE: return squad_buf_puts(b, "false");
    case JSON_NULL: return squad_buf_puts(b, "null");
    }
    return -1;
}

char *squad_json_text(const json_t *v, size_t *len, squad_err *err) {
    squad_buf b = {0};
    if (!v) {
        squad_fail(err, SQUAD_E_INVALID, "no JSON value");
        return NULL;
    }
    if (put_value(&b, v, err) < 0 && !b.oom) {
        squad_buf_free(&b);
        return NULL;
    }
    const size_t tried = b.n;
    char *text = squad_buf_take(&b, len);
    if (!text) squad_fail(err, SQUAD_E_NOMEM, "out of memory (%zu bytes of JSON text)", tried);
    return text;
}
