/*
 * utf8.h — UTF-8 helpers for every module that reads or writes text: validation (the offset of the
 * first invalid sequence, which the tokenizer, the server and the decision APIs report), the length
 * of a valid sequence, decoding and encoding one code point, stepping back one character, and the
 * lossy repair Hugging Face's decoders apply.
 *
 * Design: valid means RFC 3629 UTF-8 (no overlong form, no surrogate, nothing above U+10FFFF), the
 * rule Rust's str and so Hugging Face tokenizers apply, so squad refuses exactly the texts they do.
 * decode / encode / char_len are inline because the tokenizer calls them once per character. This
 * module depends on nothing but the C library (the lowest layer, beside util).
 */
#ifndef SQUAD_UTF8_H
#define SQUAD_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Offset of the first invalid UTF-8 sequence in s, or len when s is valid UTF-8. */
size_t squad_utf8_invalid_offset(const char *s, size_t len);

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one. */
size_t squad_utf8_seq_len(const unsigned char *s, size_t n);

/* The code point that ends at s[end) in valid UTF-8 (end > 0); where it starts in *start. */
int32_t squad_utf8_prev_char(const char *s, size_t end, size_t *start);

/* Copies s to out replacing each maximal invalid UTF-8 subsequence by U+FFFD (as Rust's
 * String::from_utf8_lossy does); out holds 3 n bytes. Returns the length written. */
size_t squad_utf8_lossy(const unsigned char *s, size_t n, char *out);

/* Decodes the (valid) UTF-8 character at s; its length in *k. */
static inline int32_t squad_utf8_decode(const unsigned char *s, size_t *k) {
    unsigned c = s[0];
    if (c < 0x80) {
        *k = 1;
        return (int32_t)c;
    }
    if (c < 0xE0) {
        *k = 2;
        return (int32_t)(((c & 0x1F) << 6) | (s[1] & 0x3F));
    }
    if (c < 0xF0) {
        *k = 3;
        return (int32_t)(((c & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F));
    }
    *k = 4;
    return (int32_t)(((c & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F));
}

/* Length of the UTF-8 character that starts with byte c (1 for a stray byte). */
static inline size_t squad_utf8_char_len(unsigned char c) {
    if (c < 0xC0) return 1;
    if (c < 0xE0) return 2;
    if (c < 0xF0) return 3;
    return 4;
}

/* Writes code point cp (at most U+10FFFF) as UTF-8 to out (room for 4 bytes); returns its length. */
static inline size_t squad_utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

#endif /* SQUAD_UTF8_H */
