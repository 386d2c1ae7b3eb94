/*
 * decode.h — PNG, JPEG and WebP bytes in memory into 8-bit RGB, the way the reference pipeline
 * (PIL's Image.open(...).convert("RGB"), which transformers' image processors apply) sees them.
 *
 * What an image becomes (each rule is PIL's; docs/images.md lists them with the reasons):
 *  - alpha is dropped, never blended: RGBA, grey+alpha and transparency keys keep their colour
 *    channels as stored;
 *  - grey images are replicated to R = G = B; 1, 2 and 4-bit grey is scaled to 0..255 by bit
 *    replication; palette images take their palette colours (an index past the palette's end
 *    reads grey (i, i, i), as PIL's default palette ramp does);
 *  - 16-bit PNG samples keep their high byte, except 16-bit grey without alpha, which PIL opens
 *    as a 16-bit integer image and clamps to 255 when converting;
 *  - a four-component (CMYK / YCCK) JPEG is inverted (Adobe convention) and converted with PIL's
 *    formula;
 *  - EXIF orientation is not applied (PIL's convert does not apply it either).
 *
 * Safety: the format is told by its magic bytes; the dimensions are read from the header and
 * checked against a pixel limit before anything is decoded (decompression bombs), so the pixel
 * buffer is the only large allocation. Truncated, corrupt or unsupported input fails with a
 * one-line message; the libraries' error exits are caught (libpng and libjpeg long jumps never
 * leave this file) and nothing is printed. Decoding is re-entrant: no global state.
 */
#ifndef SQUAD_IMAGE_DECODE_H
#define SQUAD_IMAGE_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "squad.h"

/* The default limit on an image's pixel count (width x height, checked from the header before
 * decoding): 32 Mi pixels, about 8K x 4K. The CLI / server option --max-image-pixels sets it. */
#define SQUAD_IMAGE_DEFAULT_MAX_PIXELS ((int64_t)32 << 20)
/* No side may exceed this, whatever the pixel limit (the largest a JPEG can have is 65,535). */
#define SQUAD_IMAGE_MAX_SIDE 65535

typedef enum squad_image_format {
    SQUAD_IMAGE_UNKNOWN = 0,
    SQUAD_IMAGE_PNG,
    SQUAD_IMAGE_JPEG,
    SQUAD_IMAGE_WEBP
} squad_image_format;

/* A decoded image: height rows of width RGB triples, no padding. */
typedef struct squad_image {
    int width, height;
    squad_image_format format; /* what it was decoded from */
    uint8_t *rgb;
} squad_image;

/* The format its first bytes say (SQUAD_IMAGE_UNKNOWN for anything else). */
squad_image_format squad_image_sniff(const uint8_t *data, size_t len);
const char *squad_image_format_name(squad_image_format format);

/* Decodes len bytes into out (zeroed first; free with squad_image_free). max_pixels > 0 bounds
 * width x height; pass SQUAD_IMAGE_DEFAULT_MAX_PIXELS for the default. */
int squad_image_decode(const uint8_t *data, size_t len, int64_t max_pixels, squad_image *out, squad_err *err);
void squad_image_free(squad_image *img);

#endif /* SQUAD_IMAGE_DECODE_H */
