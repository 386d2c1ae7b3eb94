/*
 * test_image.c — the image module (src/image/): decoding, base64 and data: URLs, the Qwen2-VL
 * processor and the image identity.
 *
 * - Decoding: images encoded here with libpng, libjpeg and libwebp in every layout squad must read
 *   (RGB, RGBA, grey with and without alpha, 1/2/4/16-bit grey, 16-bit RGB, palettes with indices
 *   past the palette, interlaced, progressive, CMYK JPEG, lossless and lossy WebP) decode to the
 *   pixels PIL's convert("RGB") gives; hostile input (truncations, wrong magic, headers claiming
 *   100000x100000 or zero pixels, other formats) fails with a message.
 * - Base64 and data: URLs: valid forms decode, each malformed form is refused.
 * - The processor: smart_resize against values computed with the reference formula, a 1920x1080
 *   screenshot's grid (1920x1088, 8,160 patches, 2,040 tokens), the patch order against a generic
 *   reshape / permute written out in this file, the normalisation values, the resampler against a
 *   double-precision convolution, and the configuration parser.
 * - The identity: BLAKE2b against hashlib's answers, equal for equal pixels from PNG and WebP,
 *   different for one changed pixel or another grid.
 * - Fixtures from transformers (tests/fixtures/images/, made by tools/make_image_fixtures.py): the
 *   decoded pixels, grids and pixel values against the real processor's. Skipped, with a message,
 *   only when that folder is absent.
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <jpeglib.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <webp/decode.h>
#include <webp/encode.h>

#include "image/data_url.h"
#include "image/decode.h"
#include "image/identity.h"
#include "image/preprocess.h"
#include "image/resample.h"
#include "testutil.h"
#include "util.h"

#define FIXTURES "tests/fixtures/images/"

/* Qwen3.5's preprocessor_config.json (Qwen/Qwen3.5-*: the values every size ships). */
static const char *QWEN35_CONFIG =
    "{\"size\": {\"longest_edge\": 16777216, \"shortest_edge\": 65536}, \"patch_size\": 16,"
    " \"temporal_patch_size\": 2, \"merge_size\": 2, \"image_mean\": [0.5, 0.5, 0.5],"
    " \"image_std\": [0.5, 0.5, 0.5], \"processor_class\": \"Qwen3VLProcessor\","
    " \"image_processor_type\": \"Qwen2VLImageProcessorFast\"}";

/* ---- helpers: growable buffers, encoders, image makers ---- */

typedef struct membuf {
    uint8_t *p;
    size_t n, cap;
} membuf;

static void membuf_put(membuf *b, const void *data, size_t len) {
    if (b->n + len > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + len) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) abort();
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, len);
    b->n += len;
}

static uint8_t *random_bytes(size_t n, uint64_t seed) {
    rng r = {seed};
    uint8_t *p = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rng_u32(&r);
    return p;
}

/* A smooth RGB picture (gradients plus a little noise): what lossy codecs keep well. */
static uint8_t *smooth_rgb(int w, int h, uint64_t seed) {
    rng r = {seed};
    uint8_t *p = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *o = p + ((size_t)y * w + x) * 3;
            o[0] = (uint8_t)(x * 255 / (w > 1 ? w - 1 : 1));
            o[1] = (uint8_t)(y * 255 / (h > 1 ? h - 1 : 1));
            o[2] = (uint8_t)((x + y) * 2 + (rng_u32(&r) & 3));
        }
    return p;
}

static void png_write_to(png_structp png, png_bytep data, size_t len) { membuf_put(png_get_io_ptr(png), data, len); }
static void png_flush_none(png_structp png) { (void)png; }

/* Encodes rows of packed samples (libpng's layout for the colour type and depth). */
static membuf encode_png(int w, int h, int color_type, int depth, int interlace, const uint8_t *rows, size_t rowbytes,
                         const png_color *palette, int n_palette, const png_byte *trns, int n_trns) {
    membuf out = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        free(out.p);
        membuf none = {0};
        return none;
    }
    png_set_write_fn(png, &out, png_write_to, png_flush_none);
    png_set_check_for_invalid_index(png, 0); /* some tests write indices past the palette on purpose */
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth, color_type,
                 interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (palette) png_set_PLTE(png, info, palette, n_palette);
    if (trns) png_set_tRNS(png, info, trns, n_trns, NULL);
    png_write_info(png, info);
    png_bytep *ptrs = malloc(sizeof(png_bytep) * (size_t)h);
    for (int y = 0; y < h; y++) ptrs[y] = (png_bytep)rows + (size_t)y * rowbytes;
    png_write_image(png, ptrs);
    png_write_end(png, NULL);
    free(ptrs);
    png_destroy_write_struct(&png, &info);
    return out;
}

static membuf encode_png_rgb(const uint8_t *rgb, int w, int h) {
    return encode_png(w, h, PNG_COLOR_TYPE_RGB, 8, 0, rgb, (size_t)w * 3, NULL, 0, NULL, 0);
}

/* JPEG at quality q from samples of comps components in colour space cs. */
static membuf encode_jpeg(const uint8_t *samples, int w, int h, int comps, J_COLOR_SPACE cs, int q, int progressive) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    unsigned char *buf = NULL;
    unsigned long size = 0;
    jpeg_mem_dest(&c, &buf, &size);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = comps;
    c.in_color_space = cs;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, q, TRUE);
    if (progressive) jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(samples + (size_t)c.next_scanline * w * comps);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    membuf out = {0};
    membuf_put(&out, buf, size);
    free(buf);
    return out;
}

static membuf from_webp(uint8_t *data, size_t size) {
    membuf out = {0};
    if (data && size) membuf_put(&out, data, size);
    WebPFree(data);
    return out;
}

static int decode_ok(const membuf *b, squad_image *img) {
    squad_err err = {0};
    int rc = squad_image_decode(b->p, b->n, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, img, &err);
    if (rc) fprintf(stderr, "  unexpected decode failure: %s\n", err.msg);
    return rc == 0;
}

/* Decoding fails, with a message containing want (when given). */
static void check_decode_fails(const uint8_t *data, size_t len, int64_t max_pixels, const char *want, const char *what) {
    squad_image img;
    squad_err err = {0};
    int rc = squad_image_decode(data, len, max_pixels, &img, &err);
    CHECKF(rc != 0 && img.rgb == NULL, "%s: decoded", what);
    CHECKF(err.msg[0] != 0, "%s: no message", what);
    if (want) CHECKF(strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", what, err.msg, want);
    squad_image_free(&img);
}

static double mean_abs_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += abs((int)a[i] - (int)b[i]);
    return n ? s / (double)n : 0;
}

/* ---- decoding ---- */

static void test_png_layouts(void) {
    const int w = 37, h = 23; /* odd sizes: partial bytes at the end of packed rows */
    uint8_t *src = random_bytes((size_t)w * h * 8, 11);
    squad_image img;

    membuf b = encode_png_rgb(src, w, h);
    if (decode_ok(&b, &img)) {
        CHECK(img.width == w && img.height == h && img.format == SQUAD_IMAGE_PNG);
        CHECK(memcmp(img.rgb, src, (size_t)w * h * 3) == 0);
        squad_image_free(&img);
    }
    free(b.p);

    /* RGBA: the colour channels as stored, whatever the alpha (no blending) */
    b = encode_png(w, h, PNG_COLOR_TYPE_RGB_ALPHA, 8, 0, src, (size_t)w * 4, NULL, 0, NULL, 0);
    if (decode_ok(&b, &img)) {
        int same = 1;
        for (int i = 0; i < w * h; i++) same &= memcmp(img.rgb + 3 * i, src + 4 * i, 3) == 0;
        CHECKF(same, "RGBA PNG: colour channels changed");
        squad_image_free(&img);
    }
    free(b.p);

    /* grey and grey + alpha: replicated */
    for (int alpha = 0; alpha <= 1; alpha++) {
        int ch = alpha ? 2 : 1;
        b = encode_png(w, h, alpha ? PNG_COLOR_TYPE_GRAY_ALPHA : PNG_COLOR_TYPE_GRAY, 8, 0, src, (size_t)w * ch, NULL, 0,
                       NULL, 0);
        if (decode_ok(&b, &img)) {
            int same = 1;
            for (int i = 0; i < w * h; i++)
                for (int c = 0; c < 3; c++) same &= img.rgb[3 * i + c] == src[ch * i];
            CHECKF(same, "grey PNG (alpha %d): not replicated", alpha);
            squad_image_free(&img);
        }
        free(b.p);
    }

    /* 1, 2, 4-bit grey: scaled by bit replication (x 255, 85, 17) */
    for (int depth = 1; depth <= 4; depth *= 2) {
        size_t rowbytes = ((size_t)w * depth + 7) / 8;
        b = encode_png(w, h, PNG_COLOR_TYPE_GRAY, depth, 0, src, rowbytes, NULL, 0, NULL, 0);
        if (decode_ok(&b, &img)) {
            int same = 1, scale = 255 / ((1 << depth) - 1);
            for (int y = 0; y < h; y++)
                for (int x = 0; x < w; x++) {
                    int bit = x * depth, byte = src[(size_t)y * rowbytes + bit / 8];
                    int v = (byte >> (8 - depth - bit % 8)) & ((1 << depth) - 1);
                    for (int c = 0; c < 3; c++) same &= img.rgb[((size_t)y * w + x) * 3 + c] == v * scale;
                }
            CHECKF(same, "%d-bit grey PNG: wrong values", depth);
            squad_image_free(&img);
        }
        free(b.p);
    }

    /* 16-bit grey: clamped to 255 (PIL's I;16 -> RGB); 16-bit RGB: the high byte */
    uint16_t *g16 = malloc(sizeof(uint16_t) * (size_t)w * h);
    uint8_t *g16be = malloc((size_t)w * h * 2);
    for (int i = 0; i < w * h; i++) {
        g16[i] = (uint16_t)((i * 37) % 1000);
        g16be[2 * i] = (uint8_t)(g16[i] >> 8);
        g16be[2 * i + 1] = (uint8_t)g16[i];
    }
    b = encode_png(w, h, PNG_COLOR_TYPE_GRAY, 16, 0, g16be, (size_t)w * 2, NULL, 0, NULL, 0);
    if (decode_ok(&b, &img)) {
        int same = 1;
        for (int i = 0; i < w * h; i++) same &= img.rgb[3 * i] == (g16[i] > 255 ? 255 : g16[i]) && img.rgb[3 * i + 2] == img.rgb[3 * i];
        CHECKF(same, "16-bit grey PNG: not clamped");
        squad_image_free(&img);
    }
    free(b.p);
    b = encode_png(w, h, PNG_COLOR_TYPE_RGB, 16, 0, src, (size_t)w * 6, NULL, 0, NULL, 0);
    if (decode_ok(&b, &img)) {
        int same = 1;
        for (int i = 0; i < w * h * 3; i++) same &= img.rgb[i] == src[2 * i];
        CHECKF(same, "16-bit RGB PNG: not the high bytes");
        squad_image_free(&img);
    }
    free(b.p);
    free(g16);
    free(g16be);

    /* palette: 5 entries and indices up to 9 in 4-bit depth (indices past the palette read grey
     * (i, i, i), PIL's ramp); a tRNS chunk changes nothing */
    png_color pal[5] = {{10, 20, 30}, {200, 100, 50}, {0, 255, 0}, {1, 2, 3}, {250, 251, 252}};
    png_byte trns[3] = {0, 128, 255};
    size_t rowbytes4 = ((size_t)w * 4 + 7) / 8;
    uint8_t *idx = malloc(rowbytes4 * h);
    for (int y = 0; y < h; y++)
        for (size_t k = 0; k < rowbytes4; k++) {
            int hi = (int)((y + 2 * k) % 10), lo = (int)((y + 2 * k + 1) % 10);
            idx[y * rowbytes4 + k] = (uint8_t)(hi << 4 | lo);
        }
    b = encode_png(w, h, PNG_COLOR_TYPE_PALETTE, 4, 0, idx, rowbytes4, pal, 5, trns, 3);
    if (decode_ok(&b, &img)) {
        int same = 1;
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                int byte = idx[y * rowbytes4 + x / 2], i = x % 2 ? byte & 15 : byte >> 4;
                uint8_t want[3] = {(uint8_t)i, (uint8_t)i, (uint8_t)i};
                if (i < 5) want[0] = pal[i].red, want[1] = pal[i].green, want[2] = pal[i].blue;
                same &= memcmp(img.rgb + ((size_t)y * w + x) * 3, want, 3) == 0;
            }
        CHECKF(same, "palette PNG: wrong colours");
        squad_image_free(&img);
    }
    free(b.p);
    free(idx);

    /* interlaced (Adam7) */
    b = encode_png(w, h, PNG_COLOR_TYPE_RGB, 8, 1, src, (size_t)w * 3, NULL, 0, NULL, 0);
    if (decode_ok(&b, &img)) {
        CHECK(memcmp(img.rgb, src, (size_t)w * h * 3) == 0);
        squad_image_free(&img);
    }
    free(b.p);
    free(src);
}

static void test_jpeg(void) {
    const int w = 64, h = 48;
    uint8_t *rgb = smooth_rgb(w, h, 5);
    squad_image img, prog;
    membuf b = encode_jpeg(rgb, w, h, 3, JCS_RGB, 95, 0);
    CHECK(squad_image_sniff(b.p, b.n) == SQUAD_IMAGE_JPEG);
    if (decode_ok(&b, &img)) {
        CHECK(img.width == w && img.height == h && img.format == SQUAD_IMAGE_JPEG);
        double d = mean_abs_diff(img.rgb, rgb, (size_t)w * h * 3);
        CHECKF(d < 2.5, "JPEG q95 mean abs diff %.2f", d);
        /* progressive: the same quantised coefficients, so the same pixels */
        membuf p = encode_jpeg(rgb, w, h, 3, JCS_RGB, 95, 1);
        if (decode_ok(&p, &prog)) {
            CHECK(memcmp(prog.rgb, img.rgb, (size_t)w * h * 3) == 0);
            squad_image_free(&prog);
        }
        /* truncated inside the scans */
        check_decode_fails(p.p, p.n / 2, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "JPEG", "progressive JPEG cut in half");
        free(p.p);
        squad_image_free(&img);
    }
    for (size_t cut = 3; cut < b.n; cut += b.n / 7)
        check_decode_fails(b.p, cut, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "JPEG", "truncated JPEG");
    free(b.p);

    /* grey: R = G = B, close to the source */
    uint8_t *grey = malloc((size_t)w * h);
    for (int i = 0; i < w * h; i++) grey[i] = rgb[3 * i + 1];
    b = encode_jpeg(grey, w, h, 1, JCS_GRAYSCALE, 95, 0);
    if (decode_ok(&b, &img)) {
        int replicated = 1;
        double d = 0;
        for (int i = 0; i < w * h; i++) {
            replicated &= img.rgb[3 * i] == img.rgb[3 * i + 1] && img.rgb[3 * i] == img.rgb[3 * i + 2];
            d += abs(img.rgb[3 * i] - grey[i]);
        }
        CHECK(replicated);
        CHECKF(d / (w * h) < 2.0, "grey JPEG mean abs diff %.2f", d / (w * h));
        squad_image_free(&img);
    }
    free(b.p);
    free(grey);

    /* CMYK, flat (a flat block survives quality 100 exactly): PIL inverts all four components and
     * takes R = (255 - K') (1 - C' / 255) rounded, where C' = 255 - stored C, K' = 255 - stored K */
    const uint8_t cmyk[4] = {10, 200, 50, 30};
    uint8_t *flat = malloc((size_t)16 * 16 * 4);
    for (int i = 0; i < 16 * 16; i++) memcpy(flat + 4 * i, cmyk, 4);
    b = encode_jpeg(flat, 16, 16, 4, JCS_CMYK, 100, 0);
    if (decode_ok(&b, &img)) {
        int nk = cmyk[3], ok = 1;
        for (int c = 0; c < 3; c++) {
            int inverted = 255 - cmyk[c];
            int want = nk - (int)floor(inverted * nk / 255.0 + 0.5);
            ok &= img.rgb[c] == want && img.rgb[3 * 100 + c] == want;
        }
        CHECKF(ok, "CMYK JPEG: got %d %d %d", img.rgb[0], img.rgb[1], img.rgb[2]);
        squad_image_free(&img);
    }
    free(b.p);
    free(flat);
    free(rgb);
}

static void test_webp(void) {
    const int w = 41, h = 29;
    uint8_t *rgba = random_bytes((size_t)w * h * 4, 21);
    for (int i = 0; i < w * h; i++) rgba[4 * i + 3] = (uint8_t)(1 + i % 255); /* never fully transparent */
    uint8_t *rgb = malloc((size_t)w * h * 3);
    for (int i = 0; i < w * h; i++) memcpy(rgb + 3 * i, rgba + 4 * i, 3);
    squad_image img;

    uint8_t *enc = NULL;
    size_t n = WebPEncodeLosslessRGB(rgb, w, h, w * 3, &enc);
    membuf b = from_webp(enc, n);
    CHECK(squad_image_sniff(b.p, b.n) == SQUAD_IMAGE_WEBP);
    if (decode_ok(&b, &img)) {
        CHECK(img.width == w && img.height == h && img.format == SQUAD_IMAGE_WEBP);
        CHECK(memcmp(img.rgb, rgb, (size_t)w * h * 3) == 0);
        squad_image_free(&img);
    }
    for (size_t cut = 1; cut < b.n; cut += b.n / 6 + 1)
        check_decode_fails(b.p, cut, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "WebP", "truncated WebP");
    free(b.p);

    /* lossless with alpha: the colour channels, not blended */
    n = WebPEncodeLosslessRGBA(rgba, w, h, w * 4, &enc);
    b = from_webp(enc, n);
    if (decode_ok(&b, &img)) {
        CHECKF(memcmp(img.rgb, rgb, (size_t)w * h * 3) == 0, "lossless RGBA WebP: colour channels changed");
        squad_image_free(&img);
    }
    free(b.p);

    /* lossy: close */
    uint8_t *smooth = smooth_rgb(64, 48, 9);
    n = WebPEncodeRGB(smooth, 64, 48, 64 * 3, 95, &enc);
    b = from_webp(enc, n);
    if (decode_ok(&b, &img)) {
        double d = mean_abs_diff(img.rgb, smooth, (size_t)64 * 48 * 3);
        CHECKF(d < 4.0, "lossy WebP mean abs diff %.2f", d);
        squad_image_free(&img);
    }
    free(b.p);
    free(smooth);

    /* an animated WebP (a VP8X header with the animation flag) is refused */
    uint8_t anim[30] = {'R', 'I', 'F', 'F', 22, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', 'X', 10, 0, 0, 0,
                        0x02, 0, 0, 0, 9, 0, 0, 9, 0, 0};
    check_decode_fails(anim, sizeof anim, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "WebP", "animated WebP");
    free(rgba);
    free(rgb);
}

/* CRC-32 (PNG's) for hand-made chunks. */
static uint32_t crc32_png(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xffffffffu;
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* A valid PNG with its IHDR's width and height replaced (CRC fixed): what a bomb looks like. */
static membuf png_claiming(uint32_t width, uint32_t height) {
    uint8_t px[3 * 4] = {0};
    membuf b = encode_png_rgb(px, 2, 2);
    put_be32(b.p + 16, width);
    put_be32(b.p + 20, height);
    put_be32(b.p + 29, crc32_png(b.p + 12, 17)); /* type + data of IHDR */
    return b;
}

static void test_hostile(void) {
    membuf b = png_claiming(100000, 100000);
    check_decode_fails(b.p, b.n, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "side over 65535", "PNG claiming 100000x100000");
    free(b.p);
    b = png_claiming(60000, 60000);
    check_decode_fails(b.p, b.n, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "over the limit of 33554432", "PNG claiming 60000x60000");
    free(b.p);
    b = png_claiming(2000, 2000);
    check_decode_fails(b.p, b.n, 1000000, "over the limit of 1000000", "PNG over a caller's limit");
    free(b.p);
    b = png_claiming(0, 16);
    check_decode_fails(b.p, b.n, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "PNG", "PNG of width 0");
    free(b.p);
    b = png_claiming(16, 0);
    check_decode_fails(b.p, b.n, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "PNG", "PNG of height 0");
    free(b.p);
    /* the real 2x2 image, claiming 2x2 again, decodes (the CRC rewrite itself is sound) */
    b = png_claiming(2, 2);
    squad_image img;
    if (decode_ok(&b, &img)) squad_image_free(&img);
    CHECK(b.n > 0);
    free(b.p);

    /* a JPEG whose frame header says height 0 */
    uint8_t *rgb = smooth_rgb(16, 16, 3);
    b = encode_jpeg(rgb, 16, 16, 3, JCS_RGB, 90, 0);
    for (size_t i = 2; i + 9 < b.n; i++)
        if (b.p[i] == 0xff && b.p[i + 1] == 0xc0) { /* SOF0: length, precision, height, width */
            b.p[i + 5] = b.p[i + 6] = 0;
            break;
        }
    check_decode_fails(b.p, b.n, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "JPEG", "JPEG of height 0");
    free(b.p);

    /* truncated PNGs: cut inside the signature, the header and the image data */
    uint8_t *noise = random_bytes(96 * 64 * 3, 4);
    b = encode_png_rgb(noise, 96, 64);
    size_t cuts[] = {0, 1, 7, 8, 20, 33, 40, b.n / 4, b.n / 2, b.n * 3 / 4};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
        check_decode_fails(b.p, cuts[i], SQUAD_IMAGE_DEFAULT_MAX_PIXELS, NULL, "truncated PNG");
    /* a flipped byte in the image data: the CRC or zlib catches it */
    b.p[b.n / 2] ^= 0x55;
    check_decode_fails(b.p, b.n, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "PNG", "PNG with a corrupt IDAT");
    free(b.p);
    free(noise);
    free(rgb);

    /* wrong magic and other formats */
    const uint8_t gif[] = "GIF89a\x01\x00\x01\x00\x00\x00\x00;";
    check_decode_fails(gif, sizeof gif - 1, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "GIF is not supported", "GIF");
    const uint8_t bmp[] = "BM\x3a\0\0\0\0\0\0\0";
    check_decode_fails(bmp, sizeof bmp - 1, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "BMP", "BMP");
    const uint8_t svg[] = "<svg xmlns='http://www.w3.org/2000/svg'/>";
    check_decode_fails(svg, sizeof svg - 1, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "SVG", "SVG");
    const uint8_t text[] = "hello, this is not an image";
    check_decode_fails(text, sizeof text - 1, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "not a PNG, JPEG or WebP", "text");
    const uint8_t png_then_junk[] = "\x89PNG\r\n\x1a\nthis is not a chunk stream at all";
    check_decode_fails(png_then_junk, sizeof png_then_junk - 1, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "PNG", "PNG magic + junk");
    const uint8_t jpeg_then_junk[] = "\xff\xd8\xff\xe0 junk junk junk junk";
    check_decode_fails(jpeg_then_junk, sizeof jpeg_then_junk - 1, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "JPEG", "JPEG magic + junk");
    const uint8_t riff_then_junk[] = "RIFF\x10\0\0\0WEBPVP8 junkjunk";
    check_decode_fails(riff_then_junk, sizeof riff_then_junk - 1, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "WebP", "WebP magic + junk");
    check_decode_fails((const uint8_t *)"", 0, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, "no bytes", "empty input");
}

/* ---- base64 and data: URLs ---- */

static int b64(const char *s, const char *want, size_t want_len) {
    uint8_t *out = NULL;
    size_t n = 0;
    squad_err err = {0};
    int rc = squad_base64_decode(s, strlen(s), &out, &n, &err);
    int ok = rc == 0 && n == want_len && memcmp(out, want, n) == 0;
    if (!ok) fprintf(stderr, "  base64 '%s': rc %d n %zu (%s)\n", s, rc, n, err.msg);
    free(out);
    return ok;
}

static void b64_fails(const char *s, const char *want_msg) {
    uint8_t *out = NULL;
    size_t n = 0;
    squad_err err = {0};
    int rc = squad_base64_decode(s, strlen(s), &out, &n, &err);
    CHECKF(rc != 0 && out == NULL, "base64 '%s' was accepted", s);
    CHECKF(strstr(err.msg, want_msg) != NULL, "base64 '%s': message '%s' lacks '%s'", s, err.msg, want_msg);
    free(out);
}

static void text_fails(const char *s, const char *want_msg) {
    uint8_t *out = NULL;
    size_t n = 0;
    squad_err err = {0};
    int rc = squad_image_text_bytes(s, strlen(s), &out, &n, &err);
    CHECKF(rc != 0 && out == NULL, "image text '%.40s' was accepted", s);
    CHECKF(strstr(err.msg, want_msg) != NULL, "image text '%.40s': message '%s' lacks '%s'", s, err.msg, want_msg);
    free(out);
}

static void test_base64(void) {
    CHECK(b64("TWFu", "Man", 3));
    CHECK(b64("TWE=", "Ma", 2));
    CHECK(b64("TQ==", "M", 1));
    CHECK(b64("TW\r\nFu TW E=\t", "ManMa", 5)); /* whitespace anywhere is skipped */
    CHECK(b64("+/+/", "\xfb\xff\xbf", 3));
    b64_fails("", "no data");
    b64_fails("   ", "no data");
    b64_fails("TWE", "not a multiple of 4");
    b64_fails("TQ", "not a multiple of 4");
    b64_fails("TWFuT", "not a multiple of 4");
    b64_fails("TQ==TQ==", "after '=' padding");
    b64_fails("TQ===", "more than two '='");
    b64_fails("TR==", "not canonical");
    b64_fails("TWF=", "not canonical");
    b64_fails("TW-u", "base64url");
    b64_fails("TW_u", "base64url");
    b64_fails("TW.u", "not a base64 character");
    b64_fails("TWFu\x80", "0x80");

    /* data: URLs around a real PNG */
    uint8_t px[3 * 4] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    membuf png = encode_png_rgb(px, 2, 2);
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *enc = malloc(png.n / 3 * 4 + 8);
    size_t k = 0;
    for (size_t i = 0; i < png.n; i += 3) {
        uint32_t g = (uint32_t)png.p[i] << 16;
        if (i + 1 < png.n) g |= (uint32_t)png.p[i + 1] << 8;
        if (i + 2 < png.n) g |= png.p[i + 2];
        enc[k++] = alphabet[g >> 18 & 63];
        enc[k++] = alphabet[g >> 12 & 63];
        enc[k++] = i + 1 < png.n ? alphabet[g >> 6 & 63] : '=';
        enc[k++] = i + 2 < png.n ? alphabet[g & 63] : '=';
    }
    enc[k] = 0;
    const char *prefixes[] = {"data:image/png;base64,", "DATA:Image/PNG;BASE64,", "data:image/jpeg;base64,",
                              "data:image/webp;name=shot.png;base64,", ""};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        size_t len = strlen(prefixes[i]) + k;
        char *url = malloc(len + 1);
        snprintf(url, len + 1, "%s%s", prefixes[i], enc);
        uint8_t *bytes = NULL;
        size_t n = 0;
        squad_err err = {0};
        int rc = squad_image_text_bytes(url, len, &bytes, &n, &err);
        CHECKF(rc == 0 && n == png.n && memcmp(bytes, png.p, n) == 0, "'%s' + PNG: %s", prefixes[i], err.msg);
        squad_image img;
        if (rc == 0 && squad_image_decode(bytes, n, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, &img, &err) == 0) {
            CHECK(img.width == 2 && memcmp(img.rgb, px, sizeof px) == 0);
            squad_image_free(&img);
        }
        free(bytes);
        free(url);
    }
    free(enc);
    free(png.p);

    text_fails("data:text/plain;base64,TWFu", "not an image");
    text_fails("data:application/octet-stream;base64,TWFu", "not an image");
    text_fails("data:;base64,TWFu", "no media type");
    text_fails("data:image/gif;base64,R0lGODlh", "image/gif is not supported");
    text_fails("data:image/svg+xml;base64,PHN2Zz4=", "not supported");
    text_fails("data:image/png,%89PNG", "only ';base64'");
    text_fails("data:image/png;base64;charset=x,TWFu", "only ';base64'");
    text_fails("data:image/png;base64", "no ','");
    text_fails("data:image/png;base64,TW-u", "base64url");
    text_fails("data:image/png;base64,", "no data");
    text_fails("http://example.com/a.png", "not fetched");
    text_fails("HTTPS://example.com/a.png", "not fetched");
    text_fails("file:///etc/passwd", "only data: URLs");
    text_fails("ftp://x/y.png", "only data: URLs");
}

/* ---- the processor ---- */

static squad_image_proc_config qwen35(void) {
    squad_image_proc_config c;
    squad_err err = {0};
    int rc = squad_image_proc_config_parse(&c, QWEN35_CONFIG, strlen(QWEN35_CONFIG), &err);
    CHECKF(rc == 0, "Qwen3.5 config: %s", err.msg);
    return c;
}

static void test_smart_resize(void) {
    /* (height, width) -> (height, width), computed with transformers' smart_resize formula
     * (factor 32, min 65536, max 16777216); 0 x 0 where it raises (aspect ratio over 200) */
    static const int cases[][4] = {
        {1080, 1920, 1088, 1920}, {1088, 1920, 1088, 1920}, {48, 64, 224, 320},     {517, 333, 512, 320},
        {1, 1, 256, 256},         {10, 2000, 32, 3648},     {16, 3000, 32, 3520},   {80, 80, 256, 256},
        {112, 112, 256, 256},     {720, 1280, 704, 1280},   {4000, 4000, 4000, 4000}, {4100, 4100, 4096, 4096},
        {3000, 5000, 3008, 4992}, {768, 1366, 768, 1376},   {2160, 3840, 2176, 3840}, {65535, 400, 52416, 320},
        {300, 60000, 288, 57920}, {200, 1, 3648, 32},       {1, 200, 32, 3648},     {5000, 25, 4992, 32},
        {400, 720, 384, 704},     {432, 720, 448, 704},     {1000, 1000, 992, 992}, {496, 400, 512, 384},
        {201, 1, 0, 0},           {100, 20001, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int *t = cases[i];
        int h = -1, w = -1;
        squad_err err = {0};
        int rc = squad_image_smart_resize(t[0], t[1], 32, 65536, 16777216, &h, &w, &err);
        if (t[2] == 0) {
            CHECKF(rc != 0 && strstr(err.msg, "aspect ratio"), "%dx%d: no aspect ratio error", t[1], t[0]);
        } else {
            CHECKF(rc == 0 && h == t[2] && w == t[3], "%dx%d (w x h) -> %dx%d, want %dx%d (%s)", t[1], t[0], w, h, t[3], t[2],
                   err.msg);
        }
    }
    /* other factors and limits: Qwen2-VL's (28, 56*56, 28*28*1280) and a small budget */
    int h, w;
    CHECK(squad_image_smart_resize(1080, 1920, 28, 3136, 1003520, &h, &w, NULL) == 0 && h == 728 && w == 1316);
    CHECK(squad_image_smart_resize(1080, 1920, 32, 4096, 262144, &h, &w, NULL) == 0 && h == 384 && w == 672);
    CHECK(squad_image_smart_resize(0, 10, 32, 4096, 262144, &h, &w, NULL) != 0);
}

static void test_screenshot_grid(void) {
    squad_image_proc_config c = qwen35();
    CHECK(c.patch_size == 16 && c.temporal_patch_size == 2 && c.merge_size == 2);
    CHECK(c.min_pixels == 65536 && c.max_pixels == 16777216);
    int grid[3];
    CHECK(squad_image_grid(&c, 1920, 1080, grid, NULL) == 0 && grid[0] == 1 && grid[1] == 68 && grid[2] == 120);

    squad_image img = {1920, 1080, SQUAD_IMAGE_PNG, smooth_rgb(1920, 1080, 7)};
    squad_image_patches p;
    squad_err err = {0};
    double t0 = squad_now_seconds();
    int rc = squad_image_preprocess(&c, &img, &p, &err);
    double t1 = squad_now_seconds();
    CHECKF(rc == 0, "1920x1080: %s", err.msg);
    if (rc == 0) {
        CHECK(p.resized_width == 1920 && p.resized_height == 1088);
        CHECK(p.grid[0] == 1 && p.grid[1] == 68 && p.grid[2] == 120);
        CHECK(p.n_patches == 8160 && p.patch_dim == 1536 && p.n_tokens == 2040);
        int in_range = 1;
        for (int64_t i = 0; i < p.n_patches * p.patch_dim; i++)
            in_range &= p.pixel_values[i] >= -1.0f && p.pixel_values[i] <= 1.0f;
        CHECK(in_range);
        printf("1920x1080 screenshot: grid 1x68x120, 8160 patches, 2040 tokens, processed in %.1f ms\n",
               1e3 * (t1 - t0));
        squad_image_patches_free(&p);
    }
    /* the identity of the same pixels takes */
    t0 = squad_now_seconds();
    squad_image_id id = squad_image_identity(&img, grid);
    t1 = squad_now_seconds();
    char hex[33];
    squad_image_id_hex(&id, hex);
    printf("1920x1080 identity %s in %.1f ms\n", hex, 1e3 * (t1 - t0));
    squad_image_free(&img);
}

/* The reference's layout, written generically: the frames [T][C][H][W] viewed as the 9-d shape
 * (T, C, H/(M P), M, P, W/(M P), M, P) (grid_t = 1), permuted by (2, 5, 3, 6, 1, 0, 4, 7) — the
 * reference's (0, 1, 4, 7, 5, 8, 3, 2, 6, 9) without its batch and grid_t axes — and read row-major. */
static float permuted_value(const float *frames, int T, int C, int H, int W, int P, int M, size_t flat) {
    const int shape[8] = {T, C, H / (M * P), M, P, W / (M * P), M, P};
    const int perm[8] = {2, 5, 3, 6, 1, 0, 4, 7};
    int idx[8];
    size_t rem = flat;
    for (int k = 7; k >= 0; k--) { /* output axis k has the size of input axis perm[k] */
        idx[perm[k]] = (int)(rem % (size_t)shape[perm[k]]);
        rem /= (size_t)shape[perm[k]];
    }
    size_t in = 0;
    for (int k = 0; k < 8; k++) in = in * (size_t)shape[k] + (size_t)idx[k];
    return frames[in];
}

static void test_patch_order(void) {
    /* patch 2, merge 2, 3 frames, no resize or normalisation: values are the samples themselves */
    squad_image_proc_config c;
    const char *cfg = "{\"patch_size\": 2, \"merge_size\": 2, \"temporal_patch_size\": 3, \"do_resize\": false,"
                      " \"do_rescale\": false, \"do_normalize\": false}";
    squad_err err = {0};
    CHECKF(squad_image_proc_config_parse(&c, cfg, strlen(cfg), &err) == 0, "%s", err.msg);
    const int W = 12, H = 8, C = 3, T = 3, P = 2, M = 2;
    squad_image img = {W, H, SQUAD_IMAGE_PNG, malloc((size_t)W * H * 3)};
    float *frames = malloc(sizeof(float) * (size_t)T * C * H * W);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int ch = 0; ch < C; ch++) {
                uint8_t v = (uint8_t)(ch * 96 + y * W + x); /* distinct within a channel */
                img.rgb[((size_t)y * W + x) * 3 + ch] = v;
                for (int t = 0; t < T; t++) frames[(((size_t)t * C + ch) * H + y) * W + x] = v;
            }
    squad_image_patches p;
    int rc = squad_image_preprocess(&c, &img, &p, &err);
    CHECKF(rc == 0, "patch order: %s", err.msg);
    if (rc == 0) {
        CHECK(p.grid[0] == 1 && p.grid[1] == H / P && p.grid[2] == W / P);
        CHECK(p.n_patches == (H / P) * (W / P) && p.patch_dim == C * T * P * P && p.n_tokens == p.n_patches / 4);
        int same = 1;
        for (size_t i = 0; i < (size_t)p.n_patches * p.patch_dim; i++)
            same &= p.pixel_values[i] == permuted_value(frames, T, C, H, W, P, M, i);
        CHECKF(same, "patch order differs from the reference's permutation");
        /* spot check by hand: the second row is the first merge window's top-right patch (x 2..3),
         * its first value channel 0, frame 0, pixel (0, 2) */
        CHECK(p.pixel_values[p.patch_dim] == 2.0f);
        /* row 2 is the window's bottom-left patch: pixel (2, 0) = 2 * W */
        CHECK(p.pixel_values[2 * p.patch_dim] == (float)(2 * W));
        /* row 4 is the next window to the right: pixel (0, 4) */
        CHECK(p.pixel_values[4 * p.patch_dim] == 4.0f);
        squad_image_patches_free(&p);
    }
    /* without resizing, a size off the factor is refused */
    squad_image odd = {10, 8, SQUAD_IMAGE_PNG, img.rgb};
    CHECK(squad_image_preprocess(&c, &odd, &p, &err) != 0 && strstr(err.msg, "multiples of 4"));
    free(frames);
    squad_image_free(&img);
}

static void test_normalisation(void) {
    squad_image_proc_config c = qwen35();
    /* a flat 256x256 image of each level needs no resize; every value is ((float)u - 127.5f) / 127.5f */
    const int levels[] = {0, 1, 127, 128, 200, 255};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        squad_image img = {256, 256, SQUAD_IMAGE_PNG, malloc(256 * 256 * 3)};
        memset(img.rgb, levels[i], 256 * 256 * 3);
        squad_image_patches p;
        if (squad_image_preprocess(&c, &img, &p, NULL) == 0) {
            float want = ((float)levels[i] - 127.5f) / 127.5f;
            CHECK(p.pixel_values[0] == want && p.pixel_values[p.n_patches * p.patch_dim - 1] == want);
            squad_image_patches_free(&p);
        } else {
            CHECK(0);
        }
        squad_image_free(&img);
    }
    CHECK(((float)0 - 127.5f) / 127.5f == -1.0f && ((float)255 - 127.5f) / 127.5f == 1.0f);
}

/* A double-precision antialiased bicubic resize written directly from its definition: every
 * output sample the normalised sum of Keys(a = -0.5) weights over the input samples within the
 * (stretched) support, per axis, width first. The integer resampler must stay within one level
 * of it per pass. */
static double keys(double x) {
    x = fabs(x);
    if (x < 1) return 1.5 * x * x * x - 2.5 * x * x + 1;
    if (x < 2) return -0.5 * x * x * x + 2.5 * x * x - 4 * x + 2;
    return 0;
}

static void resize_axis_double(const double *in, int n_in, int stride, double *out, int n_out, int out_stride) {
    double scale = (double)n_in / n_out, stretch = scale > 1 ? scale : 1;
    for (int i = 0; i < n_out; i++) {
        double center = scale * (i + 0.5), sum = 0, total = 0;
        for (int j = 0; j < n_in; j++) {
            double w = keys((j + 0.5 - center) / stretch);
            sum += w * in[(size_t)j * stride];
            total += w;
        }
        out[(size_t)i * out_stride] = sum / total;
    }
}

static void test_resample(void) {
    static const int sizes[][4] = {{64, 48, 224, 320}, {333, 517, 320, 512}, {100, 40, 37, 13}, {50, 50, 50, 17},
                                   {19, 7, 64, 7},     {200, 120, 33, 100}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int iw = sizes[s][0], ih = sizes[s][1], ow = sizes[s][2], oh = sizes[s][3];
        uint8_t *src = smooth_rgb(iw, ih, 100 + s);
        for (int i = 0; i < iw * ih * 3; i += 7) src[i] = (uint8_t)(src[i] ^ 0x5a); /* some edges */
        uint8_t *dst = malloc((size_t)ow * oh * 3);
        squad_err err = {0};
        CHECKF(squad_resample_bicubic_u8(src, iw, ih, 3, dst, ow, oh, &err) == 0, "%s", err.msg);
        /* the reference: width pass to uint8 (rounded, clamped), then height pass */
        double *row_in = malloc(sizeof(double) * (size_t)iw), *row_out = malloc(sizeof(double) * (size_t)ow);
        double *col_in = malloc(sizeof(double) * (size_t)ih), *col_out = malloc(sizeof(double) * (size_t)oh);
        uint8_t *mid = malloc((size_t)ow * ih * 3);
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < ih; y++) {
                for (int x = 0; x < iw; x++) row_in[x] = src[((size_t)y * iw + x) * 3 + c];
                if (ow == iw) memcpy(row_out, row_in, sizeof(double) * (size_t)iw);
                else resize_axis_double(row_in, iw, 1, row_out, ow, 1);
                for (int x = 0; x < ow; x++) {
                    double v = floor(row_out[x] + 0.5);
                    mid[((size_t)y * ow + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                }
            }
        int max_diff = 0;
        for (int c = 0; c < 3; c++)
            for (int x = 0; x < ow; x++) {
                for (int y = 0; y < ih; y++) col_in[y] = mid[((size_t)y * ow + x) * 3 + c];
                if (oh == ih) memcpy(col_out, col_in, sizeof(double) * (size_t)ih);
                else resize_axis_double(col_in, ih, 1, col_out, oh, 1);
                for (int y = 0; y < oh; y++) {
                    double v = floor(col_out[y] + 0.5);
                    v = v < 0 ? 0 : v > 255 ? 255 : v;
                    int d = abs((int)v - dst[((size_t)y * ow + x) * 3 + c]);
                    if (d > max_diff) max_diff = d;
                }
            }
        CHECKF(max_diff <= 2, "%dx%d -> %dx%d: %d levels from the double-precision resize", iw, ih, ow, oh, max_diff);
        free(row_in);
        free(row_out);
        free(col_in);
        free(col_out);
        free(mid);
        free(src);
        free(dst);
    }
    /* same size: a copy */
    uint8_t *src = random_bytes(30 * 20 * 3, 8), *dst = malloc(30 * 20 * 3);
    CHECK(squad_resample_bicubic_u8(src, 30, 20, 3, dst, 30, 20, NULL) == 0 && memcmp(src, dst, 30 * 20 * 3) == 0);
    /* a flat image stays flat within a level */
    memset(src, 77, 30 * 20 * 3);
    uint8_t *big = malloc(97 * 61 * 3);
    CHECK(squad_resample_bicubic_u8(src, 30, 20, 3, big, 97, 61, NULL) == 0);
    int flat = 1;
    for (int i = 0; i < 97 * 61 * 3; i++) flat &= abs(big[i] - 77) <= 1;
    CHECK(flat);
    CHECK(squad_resample_bicubic_u8(src, 0, 20, 3, dst, 30, 20, NULL) != 0);
    free(big);
    free(src);
    free(dst);
}

/* Every resize case (none, width only, height only, both; up and down) gives the same bytes on any
 * number of threads: images big enough that the processor really splits them (it gives a thread
 * no less than 256 Ki values). */
static void test_threads(void) {
    static const struct {
        int w, h;
        const char *extra; /* config keys besides Qwen3.5's */
    } cases[] = {
        {704, 512, ""},                         /* no resize */
        {700, 512, ""},                         /* width only: 700 -> 704 */
        {704, 500, ""},                         /* height only: 500 -> 512 */
        {1000, 700, ""},                        /* both: 1000x700 -> 992x704 */
        {1920, 1080, ", \"max_pixels\": 262144"}, /* both, a 3x downscale to 672x384 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cfg[512];
        snprintf(cfg, sizeof cfg, "{\"patch_size\": 16, \"merge_size\": 2, \"image_mean\": 0.5, \"image_std\": 0.5%s}",
                 cases[i].extra);
        squad_image_proc_config c;
        squad_err err = {0};
        CHECKF(squad_image_proc_config_parse(&c, cfg, strlen(cfg), &err) == 0, "%s", err.msg);
        squad_image img = {cases[i].w, cases[i].h, SQUAD_IMAGE_PNG, smooth_rgb(cases[i].w, cases[i].h, 40 + i)};
        for (size_t k = 0; k < (size_t)img.width * img.height * 3; k += 5) img.rgb[k] ^= 0x3c; /* edges */
        squad_image_patches one, many;
        CHECKF(squad_image_preprocess_threads(&c, &img, 1, &one, &err) == 0, "%s", err.msg);
        const size_t n = (size_t)one.n_patches * (size_t)one.patch_dim;
        CHECKF(n >= (size_t)1 << 20, "%dx%d: too small to split in four", img.width, img.height);
        static const int counts[] = {2, 3, 5, 16, 0};
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            CHECKF(squad_image_preprocess_threads(&c, &img, counts[k], &many, &err) == 0, "%s", err.msg);
            CHECKF(many.n_patches == one.n_patches && memcmp(one.pixel_values, many.pixel_values, n * sizeof(float)) == 0,
                   "%dx%d: %d threads differ from one", img.width, img.height, counts[k]);
            squad_image_patches_free(&many);
        }
        squad_image_patches_free(&one);
        squad_image_free(&img);
    }
}

/* The height pass's SIMD blocks and its scalar remainder agree: columns are independent, so the
 * first columns of a wide image (in 16-byte blocks) equal a narrow image's (all remainder). */
static void test_resample_blocks(void) {
    static const int widths[][2] = {{5, 21}, {1, 40}, {7, 64}, {16, 17}};
    static const int heights[][2] = {{20, 7}, {7, 20}, {13, 13 * 3 + 1}, {100, 33}};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        for (size_t h = 0; h < sizeof heights / sizeof heights[0]; h++) {
            const int narrow = widths[i][0], wide = widths[i][1], ih = heights[h][0], oh = heights[h][1];
            uint8_t *src = random_bytes((size_t)wide * ih * 3, 900 + i * 10 + h);
            uint8_t *part = malloc((size_t)narrow * ih * 3);
            for (int y = 0; y < ih; y++) memcpy(part + (size_t)y * narrow * 3, src + (size_t)y * wide * 3, (size_t)narrow * 3);
            uint8_t *a = malloc((size_t)wide * oh * 3), *b = malloc((size_t)narrow * oh * 3);
            CHECK(squad_resample_bicubic_u8(src, wide, ih, 3, a, wide, oh, NULL) == 0);
            CHECK(squad_resample_bicubic_u8(part, narrow, ih, 3, b, narrow, oh, NULL) == 0);
            int same = 1;
            for (int y = 0; y < oh; y++)
                same &= memcmp(a + (size_t)y * wide * 3, b + (size_t)y * narrow * 3, (size_t)narrow * 3) == 0;
            CHECKF(same, "height pass %d -> %d: %d columns of %d differ from %d alone", ih, oh, narrow, wide, narrow);
            free(src);
            free(part);
            free(a);
            free(b);
        }
}

static void config_fails(const char *json, const char *want) {
    squad_image_proc_config c;
    squad_err err = {0};
    int rc = squad_image_proc_config_parse(&c, json, strlen(json), &err);
    CHECKF(rc != 0, "config accepted: %s", json);
    CHECKF(strstr(err.msg, want) != NULL, "config %s: message '%s' lacks '%s'", json, err.msg, want);
}

static void test_config(void) {
    squad_image_proc_config c, d;
    squad_image_proc_config_default(&d);
    CHECK(d.patch_size == 14 && d.min_pixels == 3136 && d.max_pixels == 1003520 && d.image_mean[0] == 0.48145466);
    squad_err err = {0};
    CHECK(squad_image_proc_config_parse(&c, "{}", 2, &err) == 0 && memcmp(&c, &d, sizeof c) == 0);
    c = qwen35();
    CHECK(c.image_mean[0] == 0.5 && c.image_std[2] == 0.5 && fabs(c.rescale_factor - 1 / 255.0) < 1e-15);
    CHECK(c.do_resize && c.do_rescale && c.do_normalize);

    /* top-level min / max pixels override size (transformers' constructor) */
    const char *override = "{\"size\": {\"shortest_edge\": 100, \"longest_edge\": 200000}, \"min_pixels\": 4096,"
                           " \"max_pixels\": 262144, \"image_mean\": 0.25}";
    CHECK(squad_image_proc_config_parse(&c, override, strlen(override), &err) == 0 && c.min_pixels == 4096 &&
          c.max_pixels == 262144 && c.image_mean[1] == 0.25);
    const char *legacy = "{\"min_pixels\": 3136, \"max_pixels\": 12845056, \"patch_size\": 14}";
    CHECK(squad_image_proc_config_parse(&c, legacy, strlen(legacy), &err) == 0 && c.max_pixels == 12845056);
    /* processor_config.json's nested layout */
    const char *nested = "{\"image_processor\": {\"patch_size\": 16, \"size\": {\"shortest_edge\": 65536,"
                         " \"longest_edge\": 16777216}}, \"video_processor\": {\"patch_size\": 99}}";
    CHECK(squad_image_proc_config_parse(&c, nested, strlen(nested), &err) == 0 && c.patch_size == 16 &&
          c.min_pixels == 65536);

    config_fails("[]", "not a JSON object");
    config_fails("{", "invalid JSON");
    config_fails("{\"patch_size\": 0}", "'patch_size'");
    config_fails("{\"patch_size\": \"16\"}", "'patch_size' must be an integer");
    config_fails("{\"merge_size\": 2.5}", "'merge_size'");
    config_fails("{\"size\": {\"longest_edge\": 1000}}", "'shortest_edge' and 'longest_edge'");
    config_fails("{\"size\": 5}", "'size' must be an object");
    config_fails("{\"min_pixels\": 5000, \"max_pixels\": 4000}", "exceed");
    config_fails("{\"image_std\": [0.5, 0, 0.5]}", "zero");
    config_fails("{\"image_mean\": [0.5, 0.5]}", "1 or 3 values");
    config_fails("{\"image_mean\": \"x\"}", "'image_mean'");
    config_fails("{\"rescale_factor\": -1}", "rescale_factor");
    config_fails("{\"do_resize\": 1}", "true or false");
    config_fails("{\"do_convert_rgb\": false}", "do_convert_rgb");
    config_fails("{\"resample\": 2}", "only 3");
    config_fails("{\"image_processor_type\": \"SiglipImageProcessor\"}", "SiglipImageProcessor");
    config_fails("{\"patch_size\": 1000, \"merge_size\": 60}", "over 4096");
    config_fails("{\"size\": {\"shortest_edge\": 1, \"longest_edge\": 1000000000000}}", "longest_edge");
}

/* ---- identity ---- */

static void blake2b_hex(const void *data, size_t len, size_t chunk, char hex[33]) {
    squad_blake2b s;
    squad_blake2b_init(&s, 16);
    const uint8_t *p = data;
    for (size_t off = 0; off < len; off += chunk) squad_blake2b_update(&s, p + off, len - off < chunk ? len - off : chunk);
    squad_image_id id;
    squad_blake2b_final(&s, id.bytes);
    squad_image_id_hex(&id, hex);
}

static void test_identity(void) {
    /* BLAKE2b-128 known answers (Python's hashlib.blake2b(m, digest_size=16)) */
    uint8_t seq[768];
    for (int i = 0; i < 768; i++) seq[i] = (uint8_t)i;
    struct {
        const void *data;
        size_t len;
        const char *hex;
    } known[] = {
        {"", 0, "cae66941d9efbd404e4d88758ea67670"},
        {"abc", 3, "cf4ab791c62b8d2b2109c90275287816"},
        {seq, 128, "a74787004ef589e31149183900d0294a"},
        {seq, 129, "aaf1b0371f6d4ee49ee4fb5ddd9c49ef"},
        {seq, 768, "e0892860f9fc0da273b9db57e857c19a"},
    };
    char hex[33];
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        size_t chunks[] = {known[i].len ? known[i].len : 1, 1, 7, 128, 200};
        for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
            blake2b_hex(known[i].data, known[i].len, chunks[k], hex);
            CHECKF(strcmp(hex, known[i].hex) == 0, "BLAKE2b of %zu bytes in chunks of %zu: %s", known[i].len, chunks[k], hex);
        }
    }

    /* the same pixels from PNG and lossless WebP are the same image */
    const int w = 53, h = 31;
    uint8_t *rgb = random_bytes((size_t)w * h * 3, 77);
    membuf png = encode_png_rgb(rgb, w, h);
    uint8_t *enc = NULL;
    size_t n = WebPEncodeLosslessRGB(rgb, w, h, w * 3, &enc);
    membuf webp = from_webp(enc, n);
    squad_image a, b;
    int grid[3] = {1, 16, 16}, grid2[3] = {1, 16, 18};
    if (decode_ok(&png, &a) && decode_ok(&webp, &b)) {
        squad_image_id ia = squad_image_identity(&a, grid), ib = squad_image_identity(&b, grid);
        CHECK(memcmp(ia.bytes, ib.bytes, SQUAD_IMAGE_ID_BYTES) == 0);
        CHECK(squad_image_id_key(&ia) == squad_image_id_key(&ib));
        squad_image_id ig = squad_image_identity(&a, grid2);
        CHECK(memcmp(ia.bytes, ig.bytes, SQUAD_IMAGE_ID_BYTES) != 0);
        b.rgb[3 * (w * 17 + 5) + 1] ^= 1; /* one sample, one bit */
        squad_image_id ic = squad_image_identity(&b, grid);
        CHECK(memcmp(ia.bytes, ic.bytes, SQUAD_IMAGE_ID_BYTES) != 0);
        /* the same bytes under another shape are another image */
        squad_image t = {h, w, SQUAD_IMAGE_PNG, a.rgb};
        squad_image_id it = squad_image_identity(&t, grid);
        CHECK(memcmp(ia.bytes, it.bytes, SQUAD_IMAGE_ID_BYTES) != 0);
        squad_image_free(&a);
        squad_image_free(&b);
    }
    free(png.p);
    free(webp.p);
    free(rgb);
}

/* ---- fixtures from transformers ---- */

/* BLAKE2b-128 of bytes as hex, the fixture's digest of whole buffers. */
static void digest_hex(const void *p, size_t n, char hex[33]) {
    squad_blake2b s;
    squad_blake2b_init(&s, 16);
    squad_blake2b_update(&s, p, n);
    squad_image_id id;
    squad_blake2b_final(&s, id.bytes);
    squad_image_id_hex(&id, hex);
}

/* The digest of float32 values as little-endian bytes (the fixture's layout, whatever the host's). */
static void floats_digest_hex(const float *v, size_t n, char hex[33]) {
    uint8_t *bytes = malloc(n * 4 + 1);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) bytes[4 * i + k] = (uint8_t)(u >> (8 * k));
    }
    digest_hex(bytes, n * 4, hex);
    free(bytes);
}

static int parse_named_config(json_t *configs, const char *name, squad_image_proc_config *c) {
    json_t *cfg = json_object_get(configs, name);
    if (!cfg) return -1;
    char *text = json_dumps(cfg, 0);
    squad_err err = {0};
    int rc = squad_image_proc_config_parse(c, text, strlen(text), &err);
    CHECKF(rc == 0, "fixture config %s: %s", name, err.msg);
    free(text);
    return rc;
}

/* Largest |ours - reference| over a JSON array of floats at positions start + k * stride. */
static double max_float_diff(json_t *ref, const float *ours, size_t n_ours, size_t start, size_t stride, size_t *count) {
    double m = 0;
    for (size_t k = 0; k < json_array_size(ref); k++) {
        size_t at = start + k * stride;
        if (at >= n_ours) return INFINITY;
        double d = fabs((double)ours[at] - json_number_value(json_array_get(ref, k)));
        if (d > m) m = d;
        (*count)++;
    }
    return m;
}

static void fixture_image(json_t *entry, json_t *configs) {
    const char *file = json_string_value(json_object_get(entry, "file"));
    const char *cfg_name = json_string_value(json_object_get(entry, "config"));
    squad_image_proc_config c;
    if (!file || !cfg_name || parse_named_config(configs, cfg_name, &c) != 0) {
        CHECKF(0, "fixture entry without file or config");
        return;
    }
    char path[512];
    snprintf(path, sizeof path, FIXTURES "%s", file);
    size_t len = 0;
    squad_err err = {0};
    char *bytes = squad_read_file(path, &len, &err);
    CHECKF(bytes != NULL, "%s: %s", path, err.msg);
    if (!bytes) return;
    squad_image img;
    int rc = squad_image_decode((const uint8_t *)bytes, len, SQUAD_IMAGE_DEFAULT_MAX_PIXELS, &img, &err);
    free(bytes);
    CHECKF(rc == 0, "%s: %s", file, err.msg);
    if (rc) return;
    CHECK(img.width == json_integer_value(json_object_get(entry, "width")));
    CHECK(img.height == json_integer_value(json_object_get(entry, "height")));
    size_t n_rgb = (size_t)img.width * img.height * 3;

    /* decoded pixels: PIL's convert("RGB") */
    char ours[33];
    digest_hex(img.rgb, n_rgb, ours);
    const char *ref_hash = json_string_value(json_object_get(entry, "rgb_blake2b"));
    int exact_decode = ref_hash && strcmp(ours, ref_hash) == 0;
    json_t *samples = json_object_get(entry, "rgb_samples");
    size_t stride = (size_t)json_integer_value(json_object_get(entry, "rgb_stride"));
    int decode_diff = 0;
    for (size_t k = 0; k < json_array_size(samples) && stride; k++) {
        size_t at = k * stride;
        int d = at < n_rgb ? abs((int)img.rgb[at] - (int)json_integer_value(json_array_get(samples, k))) : 255;
        if (d > decode_diff) decode_diff = d;
    }
    const char *format = squad_image_format_name(img.format);
    int lossless = img.format == SQUAD_IMAGE_PNG || json_is_true(json_object_get(entry, "lossless"));
    if (lossless) CHECKF(exact_decode, "%s: decoded pixels differ from PIL's (max sample diff %d)", file, decode_diff);
    else CHECKF(decode_diff <= 2, "%s: decoded %s pixels differ from PIL's by %d", file, format, decode_diff);

    /* the processor */
    squad_image_patches p;
    rc = squad_image_preprocess(&c, &img, &p, &err);
    CHECKF(rc == 0, "%s: %s", file, err.msg);
    if (rc == 0) {
        json_t *grid = json_object_get(entry, "grid"), *shape = json_object_get(entry, "shape");
        int grid_ok = 1;
        for (int i = 0; i < 3; i++) grid_ok &= p.grid[i] == json_integer_value(json_array_get(grid, (size_t)i));
        CHECKF(grid_ok, "%s (%s): grid %dx%dx%d differs", file, cfg_name, p.grid[0], p.grid[1], p.grid[2]);
        CHECK(p.n_patches == json_integer_value(json_array_get(shape, 0)) &&
              p.patch_dim == json_integer_value(json_array_get(shape, 1)));
        size_t n = (size_t)p.n_patches * (size_t)p.patch_dim, count = 0;
        if (grid_ok && p.n_patches == json_integer_value(json_array_get(shape, 0))) {
            double m = max_float_diff(json_object_get(entry, "pv_samples"), p.pixel_values, n, 0,
                                      (size_t)json_integer_value(json_object_get(entry, "pv_stride")), &count);
            double m1 = max_float_diff(json_object_get(entry, "first_patch"), p.pixel_values, n, 0, 1, &count);
            double m2 = max_float_diff(json_object_get(entry, "last_patch"), p.pixel_values, n, n - (size_t)p.patch_dim, 1,
                                       &count);
            m = fmax(m, fmax(m1, m2));
            double sum = 0;
            for (size_t i = 0; i < n; i++) sum += p.pixel_values[i];
            char pv_hex[33];
            floats_digest_hex(p.pixel_values, n, pv_hex);
            const char *ref_pv = json_string_value(json_object_get(entry, "pv_blake2b"));
            int bit_equal = ref_pv && strcmp(pv_hex, ref_pv) == 0;
            double ref_sum = json_number_value(json_object_get(entry, "pv_sum"));
            double abs_sum = json_number_value(json_object_get(entry, "pv_abs_sum"));
            printf("fixture %-28s %-8s %5dx%-5d %s decode %s, grid %dx%dx%d, pixel values %s: max diff %.3g over %zu "
                   "samples, sum %.6f vs %.6f\n",
                   file, cfg_name, img.width, img.height, format, exact_decode ? "exact" : "close", p.grid[0], p.grid[1],
                   p.grid[2], bit_equal ? "bit-equal" : "NOT bit-equal", m, count, sum, ref_sum);
            if (exact_decode) CHECKF(bit_equal, "%s (%s): pixel values are not bit-equal to the reference's", file, cfg_name);
            /* the same bytes whatever the number of threads (more than the cores included) */
            static const int thread_counts[] = {1, 2, 3, 7, 16};
            for (size_t k = 0; k < sizeof thread_counts / sizeof thread_counts[0]; k++) {
                squad_image_patches q;
                int qrc = squad_image_preprocess_threads(&c, &img, thread_counts[k], &q, &err);
                CHECKF(qrc == 0, "%s with %d threads: %s", file, thread_counts[k], err.msg);
                if (qrc) continue;
                char q_hex[33];
                floats_digest_hex(q.pixel_values, n, q_hex);
                CHECKF(q.n_patches == p.n_patches && strcmp(q_hex, pv_hex) == 0, "%s: %d threads give other values",
                       file, thread_counts[k]);
                squad_image_patches_free(&q);
            }
            /* exact pixels in give bit-equal values out; a decoder difference of a level or two
             * (another libjpeg / libwebp build) moves values by at most a few levels of 1/127.5 */
            double tol = exact_decode ? 1e-6 : 4.0 / 127.5 + 1e-6;
            CHECKF(m <= tol, "%s (%s): pixel values differ by %.3g (tolerance %.3g)", file, cfg_name, m, tol);
            CHECKF(fabs(sum - ref_sum) <= (exact_decode ? 1e-6 : 1e-2) * fmax(1.0, abs_sum), "%s: sum %.9g vs %.9g", file,
                   sum, ref_sum);
        }
        squad_image_patches_free(&p);
    }
    squad_image_free(&img);
}

static void test_fixtures(void) {
    struct stat st;
    if (stat(FIXTURES, &st) != 0) {
        printf("SKIPPED the transformers fixture comparison: %s is absent (make it with "
               "python3 tools/make_image_fixtures.py %s on a machine with transformers)\n",
               FIXTURES, FIXTURES);
        return;
    }
    json_error_t jerr;
    json_t *root = json_load_file(FIXTURES "fixture.json", 0, &jerr);
    CHECKF(root != NULL, "%sfixture.json: %s", FIXTURES, jerr.text);
    if (!root) return;
    json_t *configs = json_object_get(root, "configs");
    json_t *versions = json_object_get(root, "versions");
    char *v = json_dumps(versions, JSON_COMPACT);
    printf("fixtures from %s\n", v ? v : "?");
    free(v);

    json_t *grids = json_object_get(root, "grids");
    int grid_checks = 0;
    for (size_t i = 0; i < json_array_size(grids); i++) {
        json_t *g = json_array_get(grids, i);
        squad_image_proc_config c;
        if (parse_named_config(configs, json_string_value(json_object_get(g, "config")), &c) != 0) continue;
        int w = (int)json_integer_value(json_object_get(g, "width")), h = (int)json_integer_value(json_object_get(g, "height"));
        int grid[3];
        squad_err err = {0};
        int rc = squad_image_grid(&c, w, h, grid, &err);
        json_t *ref = json_object_get(g, "grid");
        if (!ref) {
            CHECKF(rc != 0, "%dx%d: the reference raised, squad gave a grid", w, h);
        } else {
            int same = rc == 0;
            for (int k = 0; k < 3 && same; k++) same = grid[k] == json_integer_value(json_array_get(ref, (size_t)k));
            CHECKF(same, "%dx%d: grid differs from the reference (%s)", w, h, err.msg);
        }
        grid_checks++;
    }
    CHECKF(grid_checks > 0, "fixture.json has no grids");
    printf("fixture grids: %d sizes compared\n", grid_checks);

    json_t *images = json_object_get(root, "images");
    CHECKF(json_array_size(images) > 0, "fixture.json has no images");
    for (size_t i = 0; i < json_array_size(images); i++) fixture_image(json_array_get(images, i), configs);
    json_decref(root);
}

int main(void) {
    test_png_layouts();
    test_jpeg();
    test_webp();
    test_hostile();
    test_base64();
    test_smart_resize();
    test_screenshot_grid();
    test_patch_order();
    test_normalisation();
    test_resample();
    test_resample_blocks();
    test_threads();
    test_config();
    test_identity();
    test_fixtures();
    return test_summary("test_image");
}
