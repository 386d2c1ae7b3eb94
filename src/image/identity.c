/*
 * identity.c — BLAKE2b (RFC 7693) and the image identity built on it (identity.h).
 *
 * Design: a plain implementation of the RFC's compression function (12 rounds of the G mixing
 * function over a 16-word state, message words permuted by SIGMA) with streaming update: the last
 * block is always kept back so that final() can compress it with the final-block flag, as the RFC
 * requires even when the input is a whole number of blocks. Tests check it against known answers
 * from another implementation (Python's hashlib).
 */
#include "image/identity.h"

#include <string.h>

static const uint64_t blake2b_iv[8] = {
    0x6a09e667f3bcc908ull, 0xbb67ae8584caa73bull, 0x3c6ef372fe94f82bull, 0xa54ff53a5f1d36f1ull,
    0x510e527fade682d1ull, 0x9b05688c2b3e6c1full, 0x1f83d9abfb41bd6bull, 0x5be0cd19137e2179ull,
};

static const uint8_t blake2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

static inline uint64_t rotr64(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

static inline uint64_t load64_le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

#define BLAKE2B_G(a, b, c, d, x, y)      \
    do {                                 \
        a = a + b + (x);                 \
        d = rotr64(d ^ a, 32);           \
        c = c + d;                       \
        b = rotr64(b ^ c, 24);           \
        a = a + b + (y);                 \
        d = rotr64(d ^ a, 16);           \
        c = c + d;                       \
        b = rotr64(b ^ c, 63);           \
    } while (0)

static void blake2b_compress(squad_blake2b *s, const uint8_t block[128], int last) {
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; i++) m[i] = load64_le(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = s->h[i];
        v[i + 8] = blake2b_iv[i];
    }
    v[12] ^= s->t[0];
    v[13] ^= s->t[1];
    if (last) v[14] = ~v[14];
    for (int r = 0; r < 12; r++) {
        const uint8_t *z = blake2b_sigma[r];
        BLAKE2B_G(v[0], v[4], v[8], v[12], m[z[0]], m[z[1]]);
        BLAKE2B_G(v[1], v[5], v[9], v[13], m[z[2]], m[z[3]]);
        BLAKE2B_G(v[2], v[6], v[10], v[14], m[z[4]], m[z[5]]);
        BLAKE2B_G(v[3], v[7], v[11], v[15], m[z[6]], m[z[7]]);
        BLAKE2B_G(v[0], v[5], v[10], v[15], m[z[8]], m[z[9]]);
        BLAKE2B_G(v[1], v[6], v[11], v[12], m[z[10]], m[z[11]]);
        BLAKE2B_G(v[2], v[7], v[8], v[13], m[z[12]], m[z[13]]);
        BLAKE2B_G(v[3], v[4], v[9], v[14], m[z[14]], m[z[15]]);
    }
    for (int i = 0; i < 8; i++) s->h[i] ^= v[i] ^ v[i + 8];
}

static void counter_add(squad_blake2b *s, uint64_t n) {
    s->t[0] += n;
    if (s->t[0] < n) s->t[1]++;
}

void squad_blake2b_init(squad_blake2b *s, size_t out_len) {
    memset(s, 0, sizeof *s);
    if (out_len < 1) out_len = 1;
    if (out_len > 64) out_len = 64;
    s->out_len = out_len;
    memcpy(s->h, blake2b_iv, sizeof blake2b_iv);
    s->h[0] ^= 0x01010000ull ^ (uint64_t)out_len; /* parameter block: fanout 1, depth 1, no key */
}

void squad_blake2b_update(squad_blake2b *s, const void *data, size_t len) {
    const uint8_t *in = data;
    while (len > 0) {
        if (s->buf_len == sizeof s->buf) { /* a full block with more input after it: not the last */
            counter_add(s, sizeof s->buf);
            blake2b_compress(s, s->buf, 0);
            s->buf_len = 0;
        }
        if (s->buf_len == 0) { /* whole blocks straight from the input, keeping the last back */
            while (len > sizeof s->buf) {
                counter_add(s, sizeof s->buf);
                blake2b_compress(s, in, 0);
                in += sizeof s->buf;
                len -= sizeof s->buf;
            }
        }
        size_t n = sizeof s->buf - s->buf_len;
        if (n > len) n = len;
        memcpy(s->buf + s->buf_len, in, n);
        s->buf_len += n;
        in += n;
        len -= n;
    }
}

void squad_blake2b_final(squad_blake2b *s, uint8_t *out) {
    counter_add(s, s->buf_len);
    memset(s->buf + s->buf_len, 0, sizeof s->buf - s->buf_len);
    blake2b_compress(s, s->buf, 1);
    for (size_t i = 0; i < s->out_len; i++) out[i] = (uint8_t)(s->h[i / 8] >> (8 * (i % 8)));
}

/* The header's first bytes: a new layout gets a new version, so old identities never match. */
static const char identity_tag[16] = "squad-image-v1";

static void store32_le(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

squad_image_id squad_image_identity(const squad_image *img, const int grid[3]) {
    uint8_t header[sizeof identity_tag + 5 * 4];
    memcpy(header, identity_tag, sizeof identity_tag);
    store32_le(header + 16, (uint32_t)img->width);
    store32_le(header + 20, (uint32_t)img->height);
    for (int i = 0; i < 3; i++) store32_le(header + 24 + 4 * i, (uint32_t)grid[i]);
    squad_blake2b s;
    squad_blake2b_init(&s, SQUAD_IMAGE_ID_BYTES);
    squad_blake2b_update(&s, header, sizeof header);
    squad_blake2b_update(&s, img->rgb, (size_t)img->width * (size_t)img->height * 3);
    squad_image_id id;
    squad_blake2b_final(&s, id.bytes);
    return id;
}

uint64_t squad_image_id_key(const squad_image_id *id) { return load64_le(id->bytes); }

void squad_image_id_hex(const squad_image_id *id, char hex[2 * SQUAD_IMAGE_ID_BYTES + 1]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < SQUAD_IMAGE_ID_BYTES; i++) {
        hex[2 * i] = digits[id->bytes[i] >> 4];
        hex[2 * i + 1] = digits[id->bytes[i] & 15];
    }
    hex[2 * SQUAD_IMAGE_ID_BYTES] = 0;
}
