/*
 * utf8.c — UTF-8 validation, stepping back a character and lossy repair (see utf8.h). The ASCII runs
 * that make up most text are checked eight bytes at a time.
 */
#include "utf8.h"

#include <string.h>

size_t squad_utf8_seq_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;      /* no overlong forms */
        else if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        return 0;
    }
    if (n <= need) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k <= need; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return need + 1;
}

size_t squad_utf8_invalid_offset(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        /* ASCII runs eight bytes at a time */
        while (i + 8 <= len) {
            uint64_t v;
            memcpy(&v, s + i, 8);
            if (v & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = squad_utf8_seq_len(s + i, len - i);
        if (!k) return i;
        i += k;
    }
    return len;
}

int32_t squad_utf8_prev_char(const char *s, size_t end, size_t *start) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    size_t k;
    int32_t c = squad_utf8_decode((const unsigned char *)s + i, &k);
    *start = i;
    return c;
}

size_t squad_utf8_lossy(const unsigned char *s, size_t n, char *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        size_t k = squad_utf8_seq_len(s + i, n - i);
        if (k) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
            continue;
        }
        /* the longest prefix of a valid sequence counts as one error */
        size_t skip = 1;
        unsigned c = s[i];
        size_t need = (c >= 0xC2 && c <= 0xDF) ? 1 : (c >= 0xE0 && c <= 0xEF) ? 2 : (c >= 0xF0 && c <= 0xF4) ? 3 : 0;
        if (need && i + 1 < n) {
            unsigned lo = 0x80, hi = 0xBF;
            if (c == 0xE0) lo = 0xA0;
            else if (c == 0xED) hi = 0x9F;
            else if (c == 0xF0) lo = 0x90;
            else if (c == 0xF4) hi = 0x8F;
            if (s[i + 1] >= lo && s[i + 1] <= hi) {
                skip = 2;
                while (skip <= need && i + skip < n && (s[i + skip] & 0xC0) == 0x80) skip++;
            }
        }
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += skip;
    }
    return o;
}
