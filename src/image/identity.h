/*
 * identity.h — an image's identity for the caches: a 128-bit digest of its decoded pixels and grid.
 *
 * The identity is BLAKE2b (RFC 7693) with a 16-byte output over a versioned header (width, height
 * and the grid t, h, w, little-endian) followed by the RGB bytes. It depends only on the decoded
 * pixels, so a PNG and a lossless WebP of the same picture are the same image; the grid joins it
 * because the same pixels under another processor configuration give the tower other input. A
 * cryptographic digest, so that equal identities can be trusted without keeping the pixels: no
 * client can make a different screenshot collide with another client's to read its cached state.
 */
#ifndef SQUAD_IMAGE_IDENTITY_H
#define SQUAD_IMAGE_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

#include "image/decode.h"

#define SQUAD_IMAGE_ID_BYTES 16

typedef struct squad_image_id {
    uint8_t bytes[SQUAD_IMAGE_ID_BYTES];
} squad_image_id;

/* The identity of img processed to grid (t, h, w). */
squad_image_id squad_image_identity(const squad_image *img, const int grid[3]);
/* The first 8 bytes as a little-endian integer (a hash table key). */
uint64_t squad_image_id_key(const squad_image_id *id);
/* 32 hex digits and a NUL into hex[33]. */
void squad_image_id_hex(const squad_image_id *id, char hex[2 * SQUAD_IMAGE_ID_BYTES + 1]);

/* Unkeyed BLAKE2b with a digest of out_len (1..64) bytes, streaming. */
typedef struct squad_blake2b {
    uint64_t h[8];
    uint64_t t[2];      /* bytes compressed so far */
    uint8_t buf[128];   /* the block not yet compressed */
    size_t buf_len;
    size_t out_len;
} squad_blake2b;

void squad_blake2b_init(squad_blake2b *s, size_t out_len);
void squad_blake2b_update(squad_blake2b *s, const void *data, size_t len);
void squad_blake2b_final(squad_blake2b *s, uint8_t *out);

#endif /* SQUAD_IMAGE_IDENTITY_H */
