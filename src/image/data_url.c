/*
 * data_url.c — strict base64 and data: URL parsing (data_url.h).
 *
 * Design: one pass over the text decodes into a buffer sized for the largest possible output and
 * checks as it goes (alphabet, padding place and count); the length and the canonical padding bits
 * are checked at the end. Errors name the offset of the offending character so a client can find
 * it in what it sent. The data: URL's header is parsed by hand: it is short and its grammar (RFC
 * 2397) is a media type and ';'-separated parameters before the first ','.
 */
#include "image/data_url.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* The value of a base64 character, -1 for any other byte. */
static int base64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static int is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

int squad_base64_decode(const char *text, size_t len, uint8_t **out, size_t *out_len, squad_err *err) {
    *out = NULL;
    *out_len = 0;
    uint8_t *buf = squad_malloc(len / 4 * 3 + 3, err);
    if (!buf) return SQUAD_E_NOMEM;
    size_t n_data = 0, n_pad = 0, n_out = 0;
    uint32_t group = 0; /* the sextets of the current group of four */
    int last_value = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (is_space(c)) continue;
        if (c == '=') {
            if (++n_pad > 2) {
                free(buf);
                return squad_fail(err, SQUAD_E_INVALID, "base64: more than two '=' at offset %zu", i);
            }
            continue;
        }
        int v = base64_value(c);
        if (v < 0) {
            free(buf);
            if (c == '-' || c == '_')
                return squad_fail(err, SQUAD_E_INVALID,
                                  "base64: '%c' at offset %zu is base64url, not standard base64 ('+' and '/')", c, i);
            return squad_fail(err, SQUAD_E_INVALID, "base64: byte 0x%02x at offset %zu is not a base64 character", c, i);
        }
        if (n_pad) {
            free(buf);
            return squad_fail(err, SQUAD_E_INVALID, "base64: data after '=' padding at offset %zu", i);
        }
        group = (group << 6) | (uint32_t)v;
        last_value = v;
        if (++n_data % 4 == 0) {
            buf[n_out++] = (uint8_t)(group >> 16);
            buf[n_out++] = (uint8_t)(group >> 8);
            buf[n_out++] = (uint8_t)group;
            group = 0;
        }
    }
    if (n_data == 0) {
        free(buf);
        return squad_fail(err, SQUAD_E_INVALID, "base64: no data");
    }
    if ((n_data + n_pad) % 4 != 0) {
        free(buf);
        return squad_fail(err, SQUAD_E_INVALID, "base64: %zu characters%s is not a multiple of 4 (missing '=' padding?)",
                          n_data + n_pad, n_pad ? " with padding" : "");
    }
    size_t tail = n_data % 4; /* 2 or 3 characters left: 1 or 2 bytes */
    if (tail) {
        /* the unused low bits of the last character must be zero (canonical encoding) */
        int unused_bits = tail == 2 ? 4 : 2;
        if (last_value & ((1 << unused_bits) - 1)) {
            free(buf);
            return squad_fail(err, SQUAD_E_INVALID, "base64: non-zero bits before the '=' padding (not canonical)");
        }
        group <<= 6 * (4 - tail);
        buf[n_out++] = (uint8_t)(group >> 16);
        if (tail == 3) buf[n_out++] = (uint8_t)(group >> 8);
    }
    *out = buf;
    *out_len = n_out;
    return 0;
}

static int has_prefix_nocase(const char *text, size_t len, const char *prefix) {
    size_t n = strlen(prefix);
    if (len < n) return 0;
    for (size_t i = 0; i < n; i++) {
        char a = text[i], b = prefix[i];
        if (a >= 'A' && a <= 'Z') a = (char)(a - 'A' + 'a');
        if (a != b) return 0;
    }
    return 1;
}

static int equals_nocase(const char *text, size_t len, const char *word) {
    return strlen(word) == len && has_prefix_nocase(text, len, word);
}

/* The image media types squad decodes. */
static int is_supported_image_type(const char *type, size_t len) {
    static const char *const types[] = {"image/png", "image/jpeg", "image/jpg", "image/pjpeg", "image/webp"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (equals_nocase(type, len, types[i])) return 1;
    return 0;
}

int squad_data_url_decode(const char *text, size_t len, uint8_t **out, size_t *out_len, squad_err *err) {
    *out = NULL;
    *out_len = 0;
    if (!has_prefix_nocase(text, len, "data:")) return squad_fail(err, SQUAD_E_INVALID, "data URL: does not start with 'data:'");
    const char *header = text + 5;
    const char *comma = memchr(header, ',', len - 5);
    if (!comma) return squad_fail(err, SQUAD_E_INVALID, "data URL: no ',' before the data");
    size_t header_len = (size_t)(comma - header);

    const char *semi = memchr(header, ';', header_len);
    size_t type_len = semi ? (size_t)(semi - header) : header_len;
    int base64 = 0;
    for (const char *p = semi; p;) { /* the parameters: ";base64" must be the last */
        const char *param = p + 1;
        const char *next = memchr(param, ';', (size_t)(comma - param));
        size_t param_len = next ? (size_t)(next - param) : (size_t)(comma - param);
        base64 = equals_nocase(param, param_len, "base64") && !next;
        p = next;
    }
    if (type_len == 0)
        return squad_fail(err, SQUAD_E_INVALID, "data URL: no media type (the default, text/plain, is not an image)");
    if (!is_supported_image_type(header, type_len)) {
        int shown = type_len > 64 ? 64 : (int)type_len;
        if (has_prefix_nocase(header, type_len, "image/"))
            return squad_fail(err, SQUAD_E_UNSUPPORTED, "data URL: %.*s is not supported (send PNG, JPEG or WebP)", shown,
                              header);
        return squad_fail(err, SQUAD_E_INVALID, "data URL: media type '%.*s' is not an image", shown, header);
    }
    if (!base64) return squad_fail(err, SQUAD_E_INVALID, "data URL: only ';base64' data URLs are taken");
    int rc = squad_base64_decode(comma + 1, len - (size_t)(comma + 1 - text), out, out_len, err);
    if (rc) squad_fail_context(err, "data URL: ");
    return rc;
}

int squad_image_text_bytes(const char *text, size_t len, uint8_t **out, size_t *out_len, squad_err *err) {
    *out = NULL;
    *out_len = 0;
    if (has_prefix_nocase(text, len, "data:")) return squad_data_url_decode(text, len, out, out_len, err);
    if (has_prefix_nocase(text, len, "http://") || has_prefix_nocase(text, len, "https://"))
        return squad_fail(err, SQUAD_E_INVALID, "image: remote URLs are not fetched; send the image as a data: URL");
    const char *scheme_end = len ? memchr(text, ':', len < 32 ? len : 32) : NULL;
    if (scheme_end && scheme_end + 2 < text + len && scheme_end[1] == '/' && scheme_end[2] == '/')
        return squad_fail(err, SQUAD_E_INVALID, "image: only data: URLs are taken");
    return squad_base64_decode(text, len, out, out_len, err);
}
