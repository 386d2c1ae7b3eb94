/*
 * decode.c — PNG (libpng), JPEG (libjpeg-turbo) and WebP (libwebp) into 8-bit RGB (decode.h).
 *
 * Design:
 *  - One path per format, each in three steps: read the header, check the dimensions
 *    (check_dimensions: no side zero or over SQUAD_IMAGE_MAX_SIDE, width x height within the
 *    caller's pixel limit), then decode row by row into the RGB buffer, converting each row with
 *    PIL's rules (decode.h). The RGB buffer is allocated only after the check.
 *  - libpng and libjpeg report errors by long jumping out of the library. Each decoder installs
 *    its own handlers that copy the library's message into a context and jump back to a setjmp in
 *    the same function, which frees everything and returns the message; warnings are silenced
 *    (libpng) or treated as errors (libjpeg: its warnings mean corrupt or truncated data, which it
 *    would otherwise fill with grey). Pointers assigned after setjmp are volatile so that they
 *    survive the jump.
 *  - libpng is told to skip the chunks squad never uses (text, ICC profiles, EXIF: zTXt and iCCP
 *    are compressed, so they are decompression bombs of their own) and to bound the memory and
 *    number of the ancillary chunks it keeps.
 *  - A progressive JPEG may carry any number of scans, each a full pass over the image; more than
 *    JPEG_MAX_SCANS is refused (a real encoder writes about ten).
 *  - Animated WebP is refused (squad takes still images); a still one is decoded as RGB, which is
 *    its colour channels without alpha, as PIL's RGBA decode followed by convert("RGB") gives.
 */
#include "image/decode.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

#include "util.h"

/* Scans a progressive JPEG may have (each costs a pass over the whole image). */
#define JPEG_MAX_SCANS 256
/* libpng's bound on one ancillary chunk's memory and on how many it keeps. */
#define PNG_CHUNK_MALLOC_MAX (1 << 20)
#define PNG_CHUNK_CACHE_MAX 128

squad_image_format squad_image_sniff(const uint8_t *data, size_t len) {
    static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (len >= 8 && memcmp(data, png_magic, 8) == 0) return SQUAD_IMAGE_PNG;
    if (len >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return SQUAD_IMAGE_JPEG;
    if (len >= 12 && memcmp(data, "RIFF", 4) == 0 && memcmp(data + 8, "WEBP", 4) == 0) return SQUAD_IMAGE_WEBP;
    return SQUAD_IMAGE_UNKNOWN;
}

const char *squad_image_format_name(squad_image_format format) {
    switch (format) {
    case SQUAD_IMAGE_PNG: return "PNG";
    case SQUAD_IMAGE_JPEG: return "JPEG";
    case SQUAD_IMAGE_WEBP: return "WebP";
    default: return "unknown";
    }
}

/* A name for formats squad recognises but does not decode, so the error says what was sent. */
static const char *other_format_name(const uint8_t *d, size_t len) {
    if (len >= 6 && (memcmp(d, "GIF87a", 6) == 0 || memcmp(d, "GIF89a", 6) == 0)) return "GIF";
    if (len >= 2 && d[0] == 'B' && d[1] == 'M') return "BMP";
    if (len >= 4 && (memcmp(d, "II*\0", 4) == 0 || memcmp(d, "MM\0*", 4) == 0)) return "TIFF";
    if (len >= 12 && memcmp(d + 4, "ftyp", 4) == 0) return "HEIF/AVIF";
    if (len >= 4 && memcmp(d, "\0\0\1\0", 4) == 0) return "ICO";
    if (len >= 5 && (memcmp(d, "<?xml", 5) == 0 || memcmp(d, "<svg", 4) == 0)) return "SVG";
    return NULL;
}

static int check_dimensions(const char *format, int64_t width, int64_t height, int64_t max_pixels, squad_err *err) {
    if (width <= 0 || height <= 0)
        return squad_fail(err, SQUAD_E_INVALID, "%s: the image has no pixels (%lldx%lld)", format, (long long)width,
                          (long long)height);
    if (width > SQUAD_IMAGE_MAX_SIDE || height > SQUAD_IMAGE_MAX_SIDE)
        return squad_fail(err, SQUAD_E_INVALID, "%s: %lldx%lld has a side over %d pixels", format, (long long)width,
                          (long long)height, SQUAD_IMAGE_MAX_SIDE);
    if (width * height > max_pixels)
        return squad_fail(err, SQUAD_E_INVALID, "%s: %lldx%lld is %lld pixels, over the limit of %lld (--max-image-pixels)",
                          format, (long long)width, (long long)height, (long long)(width * height), (long long)max_pixels);
    return 0;
}

static uint8_t *alloc_rgb(int width, int height, squad_err *err) {
    return squad_malloc((size_t)width * (size_t)height * 3, err);
}

/* ---- PNG ---- */

typedef struct png_source {
    const uint8_t *data;
    size_t len, pos;
    char msg[160];
} png_source;

static void png_on_error(png_structp png, png_const_charp msg) {
    png_source *src = png_get_error_ptr(png);
    snprintf(src->msg, sizeof src->msg, "%s", msg ? msg : "decoding failed");
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg; /* the library never prints; warnings (bad ancillary chunks) change nothing we keep */
}

static void png_read_bytes(png_structp png, png_bytep out, size_t n) {
    png_source *src = png_get_io_ptr(png);
    if (n > src->len - src->pos) png_error(png, "the file is truncated");
    memcpy(out, src->data + src->pos, n);
    src->pos += n;
}

/* The rows libpng hands over after the transforms set in decode_png. */
typedef enum png_row_kind { ROW_PALETTE, ROW_GREY16, ROW_GREY, ROW_GREY_ALPHA, ROW_RGB, ROW_RGBA } png_row_kind;

static void png_convert_row(png_row_kind kind, const uint8_t *in, uint8_t *out, int width, const uint8_t *palette) {
    for (int x = 0; x < width; x++, out += 3) {
        switch (kind) {
        case ROW_PALETTE: memcpy(out, palette + 3 * in[x], 3); break;
        case ROW_GREY16: { /* big-endian sample, clamped (PIL's I;16 -> RGB) */
            unsigned v = ((unsigned)in[2 * x] << 8) | in[2 * x + 1];
            out[0] = out[1] = out[2] = (uint8_t)(v > 255 ? 255 : v);
            break;
        }
        case ROW_GREY: out[0] = out[1] = out[2] = in[x]; break;
        case ROW_GREY_ALPHA: out[0] = out[1] = out[2] = in[2 * x]; break;
        case ROW_RGB: memcpy(out, in + 3 * x, 3); break;
        case ROW_RGBA: memcpy(out, in + 4 * x, 3); break;
        }
    }
}

static int png_row_kind_of(int color_type, int bit_depth, int channels, png_row_kind *kind) {
    if (color_type == PNG_COLOR_TYPE_PALETTE && bit_depth == 8 && channels == 1) *kind = ROW_PALETTE;
    else if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth == 16 && channels == 1) *kind = ROW_GREY16;
    else if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth == 8 && channels == 1) *kind = ROW_GREY;
    else if (color_type == PNG_COLOR_TYPE_GRAY_ALPHA && bit_depth == 8 && channels == 2) *kind = ROW_GREY_ALPHA;
    else if (color_type == PNG_COLOR_TYPE_RGB && bit_depth == 8 && channels == 3) *kind = ROW_RGB;
    else if (color_type == PNG_COLOR_TYPE_RGB_ALPHA && bit_depth == 8 && channels == 4) *kind = ROW_RGBA;
    else return -1;
    return 0;
}

static void png_skip_unused_chunks(png_structp png) {
    static const png_byte skipped[] = "iCCP\0iTXt\0tEXt\0zTXt\0sPLT\0eXIf\0";
    png_set_keep_unknown_chunks(png, PNG_HANDLE_CHUNK_NEVER, skipped, (int)(sizeof skipped - 1) / 5);
    png_set_chunk_malloc_max(png, PNG_CHUNK_MALLOC_MAX);
    png_set_chunk_cache_max(png, PNG_CHUNK_CACHE_MAX);
}

static int decode_png(const uint8_t *data, size_t len, int64_t max_pixels, squad_image *out, squad_err *err) {
    png_source src = {data, len, 0, {0}};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
    if (!png) return squad_fail(err, SQUAD_E_NOMEM, "PNG: out of memory");
    png_infop info = png_create_info_struct(png);
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return squad_fail(err, SQUAD_E_NOMEM, "PNG: out of memory");
    }
    uint8_t *volatile rgb = NULL;
    uint8_t *volatile raw = NULL;     /* decoded rows before conversion */
    uint8_t **volatile rows = NULL;   /* row pointers into raw (interlaced images) */
    volatile int rc = 0;
    if (setjmp(png_jmpbuf(png))) {
        rc = squad_fail(err, SQUAD_E_INVALID, "PNG: %s", src.msg[0] ? src.msg : "decoding failed");
        goto done;
    }
    png_set_read_fn(png, &src, png_read_bytes);
    png_skip_unused_chunks(png);
    png_set_benign_errors(png, 1);
    png_read_info(png, info);

    png_uint_32 width, height;
    int bit_depth, color_type, interlace;
    png_get_IHDR(png, info, &width, &height, &bit_depth, &color_type, &interlace, NULL, NULL);
    if ((rc = check_dimensions("PNG", width, height, max_pixels, err)) != 0) goto done;

    /* The palette table: PIL's default palette is a grey ramp, overwritten by the file's entries;
     * an index past them reads the ramp. */
    uint8_t palette[256 * 3];
    for (int i = 0; i < 256; i++) palette[3 * i] = palette[3 * i + 1] = palette[3 * i + 2] = (uint8_t)i;
    if (color_type == PNG_COLOR_TYPE_PALETTE) {
        png_colorp entries = NULL;
        int n_entries = 0;
        if (png_get_PLTE(png, info, &entries, &n_entries) == PNG_INFO_PLTE)
            for (int i = 0; i < n_entries && i < 256; i++) {
                palette[3 * i] = entries[i].red;
                palette[3 * i + 1] = entries[i].green;
                palette[3 * i + 2] = entries[i].blue;
            }
        if (bit_depth < 8) png_set_packing(png); /* one index a byte */
    } else if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) {
        png_set_expand_gray_1_2_4_to_8(png); /* bit replication: PIL's 1, L;2 and L;4 */
    }
    if (bit_depth == 16 && color_type != PNG_COLOR_TYPE_GRAY) png_set_strip_16(png); /* high byte, as PIL */
    int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);

    png_row_kind kind;
    if (png_row_kind_of(png_get_color_type(png, info), png_get_bit_depth(png, info), png_get_channels(png, info),
                        &kind) != 0) {
        rc = squad_fail(err, SQUAD_E_UNSUPPORTED, "PNG: unsupported pixel layout (colour type %d, %d bits)", color_type,
                        bit_depth);
        goto done;
    }
    size_t rowbytes = png_get_rowbytes(png, info);
    rgb = alloc_rgb((int)width, (int)height, err);
    if (!rgb) {
        rc = SQUAD_E_NOMEM;
        goto done;
    }
    if (passes <= 1) { /* one row at a time through one row buffer */
        raw = squad_malloc(rowbytes, err);
        if (!raw) {
            rc = SQUAD_E_NOMEM;
            goto done;
        }
        for (png_uint_32 y = 0; y < height; y++) {
            png_read_row(png, raw, NULL);
            png_convert_row(kind, raw, rgb + (size_t)y * width * 3, (int)width, palette);
        }
    } else { /* interlaced: every pass touches every row, so the whole image is held */
        raw = squad_malloc(rowbytes * height, err);
        rows = squad_malloc(sizeof(uint8_t *) * height, err);
        if (!raw || !rows) {
            rc = SQUAD_E_NOMEM;
            goto done;
        }
        for (png_uint_32 y = 0; y < height; y++) rows[y] = raw + (size_t)y * rowbytes;
        png_read_image(png, rows);
        for (png_uint_32 y = 0; y < height; y++)
            png_convert_row(kind, rows[y], rgb + (size_t)y * width * 3, (int)width, palette);
    }
    out->width = (int)width;
    out->height = (int)height;
    out->format = SQUAD_IMAGE_PNG;
    out->rgb = rgb;
    rgb = NULL;
done:
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    free(raw);
    free(rgb);
    return rc;
}

/* ---- JPEG ---- */

typedef struct jpeg_guard {
    struct jpeg_error_mgr mgr; /* first: libjpeg hands back a pointer to it */
    struct jpeg_progress_mgr progress;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
} jpeg_guard;

static void jpeg_on_error(j_common_ptr cinfo) {
    jpeg_guard *g = (jpeg_guard *)(void *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, g->msg);
    longjmp(g->jump, 1);
}

/* Level -1 is a warning: libjpeg found corrupt or missing data and would go on with grey. */
static void jpeg_on_message(j_common_ptr cinfo, int level) {
    if (level < 0) jpeg_on_error(cinfo);
}

static void jpeg_on_output(j_common_ptr cinfo) { (void)cinfo; }

static void jpeg_on_progress(j_common_ptr cinfo) {
    if (!cinfo->is_decompressor) return;
    j_decompress_ptr d = (j_decompress_ptr)cinfo;
    if (d->input_scan_number > JPEG_MAX_SCANS) {
        jpeg_guard *g = (jpeg_guard *)(void *)cinfo->err;
        snprintf(g->msg, sizeof g->msg, "more than %d progressive scans", JPEG_MAX_SCANS);
        longjmp(g->jump, 1);
    }
}

/* PIL inverts every four-component JPEG (Adobe's convention) and then applies its CMYK -> RGB:
 * (255 - k) - c (255 - k) / 255 with its rounding division. raw is what libjpeg decoded. */
static uint8_t pil_cmyk_channel(uint8_t raw_c, uint8_t raw_k) {
    int c = 255 - raw_c, nk = raw_k; /* nk = 255 - inverted k */
    int t = c * nk + 128;
    int v = nk - (((t >> 8) + t) >> 8);
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

static int decode_jpeg(const uint8_t *data, size_t len, int64_t max_pixels, squad_image *out, squad_err *err) {
    struct jpeg_decompress_struct cinfo;
    jpeg_guard guard;
    memset(&guard, 0, sizeof guard);
    cinfo.err = jpeg_std_error(&guard.mgr);
    guard.mgr.error_exit = jpeg_on_error;
    guard.mgr.emit_message = jpeg_on_message;
    guard.mgr.output_message = jpeg_on_output;
    guard.progress.progress_monitor = jpeg_on_progress;
    uint8_t *volatile rgb = NULL;
    uint8_t *volatile row = NULL;
    volatile int created = 0, rc = 0;
    if (setjmp(guard.jump)) {
        rc = squad_fail(err, SQUAD_E_INVALID, "JPEG: %s", guard.msg[0] ? guard.msg : "decoding failed");
        goto done;
    }
    jpeg_create_decompress(&cinfo);
    created = 1;
    cinfo.progress = &guard.progress;
    jpeg_mem_src(&cinfo, data, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    if ((rc = check_dimensions("JPEG", cinfo.image_width, cinfo.image_height, max_pixels, err)) != 0) goto done;
    switch (cinfo.num_components) { /* PIL's modes L, RGB and CMYK */
    case 1: cinfo.out_color_space = JCS_GRAYSCALE; break;
    case 3: cinfo.out_color_space = JCS_RGB; break;
    case 4: cinfo.out_color_space = JCS_CMYK; break;
    default:
        rc = squad_fail(err, SQUAD_E_UNSUPPORTED, "JPEG: %d colour components are not supported", cinfo.num_components);
        goto done;
    }
    jpeg_start_decompress(&cinfo);
    int width = (int)cinfo.output_width, height = (int)cinfo.output_height, comps = cinfo.output_components;
    if (width != (int)cinfo.image_width || height != (int)cinfo.image_height || comps != cinfo.num_components) {
        rc = squad_fail(err, SQUAD_E_INVALID, "JPEG: the decoder's output does not match the header");
        goto done;
    }
    rgb = alloc_rgb(width, height, err);
    row = squad_malloc((size_t)width * (size_t)comps, err);
    if (!rgb || !row) {
        rc = SQUAD_E_NOMEM;
        goto done;
    }
    while ((int)cinfo.output_scanline < height) {
        int y = (int)cinfo.output_scanline;
        JSAMPROW rowp = row;
        if (jpeg_read_scanlines(&cinfo, &rowp, 1) != 1) {
            rc = squad_fail(err, SQUAD_E_INVALID, "JPEG: the file is truncated");
            goto done;
        }
        uint8_t *o = rgb + (size_t)y * width * 3;
        for (int x = 0; x < width; x++, o += 3) {
            const uint8_t *p = row + (size_t)x * comps;
            if (comps == 1) o[0] = o[1] = o[2] = p[0];
            else if (comps == 3) memcpy(o, p, 3);
            else for (int c = 0; c < 3; c++) o[c] = pil_cmyk_channel(p[c], p[3]);
        }
    }
    /* Whatever follows the last scanline (even a missing end marker) changes no pixel: the
     * decompressor is destroyed without reading it. */
    out->width = width;
    out->height = height;
    out->format = SQUAD_IMAGE_JPEG;
    out->rgb = rgb;
    rgb = NULL;
done:
    if (created) jpeg_destroy_decompress(&cinfo);
    free(row);
    free(rgb);
    return rc;
}

/* ---- WebP ---- */

static const char *webp_status_text(VP8StatusCode s) {
    switch (s) {
    case VP8_STATUS_NOT_ENOUGH_DATA: return "the file is truncated";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "an unsupported feature";
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameters";
    default: return "the bitstream is corrupt";
    }
}

static int decode_webp(const uint8_t *data, size_t len, int64_t max_pixels, squad_image *out, squad_err *err) {
    WebPBitstreamFeatures features;
    VP8StatusCode status = WebPGetFeatures(data, len, &features);
    if (status != VP8_STATUS_OK) return squad_fail(err, SQUAD_E_INVALID, "WebP: %s", webp_status_text(status));
    if (features.has_animation)
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "WebP: animated images are not supported (send one frame)");
    int rc = check_dimensions("WebP", features.width, features.height, max_pixels, err);
    if (rc) return rc;
    size_t stride = (size_t)features.width * 3;
    uint8_t *rgb = alloc_rgb(features.width, features.height, err);
    if (!rgb) return SQUAD_E_NOMEM;
    if (!WebPDecodeRGBInto(data, len, rgb, stride * (size_t)features.height, (int)stride)) {
        free(rgb);
        return squad_fail(err, SQUAD_E_INVALID, "WebP: the image data is corrupt or truncated");
    }
    out->width = features.width;
    out->height = features.height;
    out->format = SQUAD_IMAGE_WEBP;
    out->rgb = rgb;
    return 0;
}

int squad_image_decode(const uint8_t *data, size_t len, int64_t max_pixels, squad_image *out, squad_err *err) {
    memset(out, 0, sizeof *out);
    if (!data || len == 0) return squad_fail(err, SQUAD_E_INVALID, "image: no bytes");
    if (max_pixels <= 0) return squad_fail(err, SQUAD_E_INVALID, "image: the pixel limit must be positive");
    switch (squad_image_sniff(data, len)) {
    case SQUAD_IMAGE_PNG: return decode_png(data, len, max_pixels, out, err);
    case SQUAD_IMAGE_JPEG: return decode_jpeg(data, len, max_pixels, out, err);
    case SQUAD_IMAGE_WEBP: return decode_webp(data, len, max_pixels, out, err);
    default: break;
    }
    const char *other = other_format_name(data, len);
    if (other)
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "image: %s is not supported (send PNG, JPEG or WebP)", other);
    return squad_fail(err, SQUAD_E_INVALID, "image: not a PNG, JPEG or WebP file (unrecognised first bytes)");
}

void squad_image_free(squad_image *img) {
    if (!img) return;
    free(img->rgb);
    img->rgb = NULL;
    img->width = img->height = 0;
}
