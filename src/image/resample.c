/*
 * resample.c — antialiased bicubic resizing of 8-bit images (resample.h).
 *
 * Design:
 *  - A pass along one axis is described by its taps (squad_resample_taps): for each output index, the
 *    first input index, the number of inputs and their int16 weights, all sharing one fixed-point
 *    precision. taps_build computes them exactly as the reference does, in double precision and
 *    in the same order of operations, because a weight that rounds to a different int16 changes a
 *    pixel: the kernel's centre is scale * (i + 0.5) with scale = in / out; when downscaling the
 *    kernel is stretched by the scale (support 2 * scale, evaluated at distance / scale); the
 *    window is [trunc(centre - support + 0.5), trunc(centre + support + 0.5)) clipped to the input;
 *    the weights are divided by their sum; the precision is the largest p < 22 with
 *    round(max weight * 2^(p+1)) < 2^15; a weight becomes round-half-away(w * 2^p).
 *  - A pass sums weight x sample from 2^(p-1) (rounding), shifts right by p and clamps to 0..255.
 *    The sums are integers that fit int32 (the weights' absolute values add up to under
 *    1.25 x 2^p <= 1.25 x 2^22, times 255, and every partial sum is smaller), so any order of
 *    adding them gives the same bytes: that is what lets the passes be vectorised and split.
 *  - The width pass walks each output pixel's window, the three channels of an RGB pixel in one
 *    loop. The height pass, where a screenshot spends its time (1920x1080 -> 1920x1088 is height
 *    only), computes each output row 16 bytes at a time in registers: pairs of input rows
 *    interleaved byte by byte and multiplied by their two weights with pmaddwd (SSE2, in every
 *    x86-64 build), so no int32 row of sums goes through memory; a scalar loop does the rest of
 *    the row and every byte on other targets.
 *  - The passes run on row ranges of a plan made once (squad_resample_plan), so the caller can
 *    spread them over threads; nothing here starts a thread.
 *  - This file is compiled with floating-point contraction off (CMakeLists.txt), so a build with
 *    FMA enabled computes the same weights, and with -O3 for the scalar loops.
 */
#include "image/resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "util.h"

/* The Keys cubic kernel's parameter in the antialiased path (PIL's and PyTorch's). */
#define KEYS_A (-0.5)
/* The fixed-point precision is capped here, and a weight times 2^p stays below 2^15 (int16). */
#define MAX_PRECISION 22
/* Bytes of a row the SIMD height pass does at once (four vectors of four int32 sums). */
#define VERTICAL_BLOCK 16

static double keys_cubic(double x) {
    const double a = KEYS_A;
    x = fabs(x);
    if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0.0;
}

static void taps_free(squad_resample_taps *t) {
    free(t->first);
    free(t->count);
    free(t->weights);
    memset(t, 0, sizeof *t);
}

static int taps_build(int in_size, int out_size, squad_resample_taps *t, squad_err *err) {
    memset(t, 0, sizeof *t);
    const double scale = (double)in_size / (double)out_size;
    const double support = scale >= 1.0 ? 2.0 * scale : 2.0;
    const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    const int ksize = (int)ceil(support) * 2 + 1;
    t->ksize = ksize;
    double *w = squad_calloc((size_t)out_size * (size_t)ksize, sizeof *w, err);
    t->first = squad_malloc(sizeof(int) * (size_t)out_size, err);
    t->count = squad_malloc(sizeof(int) * (size_t)out_size, err);
    t->weights = squad_calloc((size_t)out_size * (size_t)ksize, sizeof(int16_t), err);
    if (!w || !t->first || !t->count || !t->weights) {
        free(w);
        taps_free(t);
        return SQUAD_E_NOMEM;
    }
    double w_max = 0.0;
    for (int64_t i = 0; i < out_size; i++) {
        double *wi = w + i * ksize;
        const double center = scale * ((double)i + 0.5);
        int64_t xmin = (int64_t)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int64_t xend = (int64_t)(center + support + 0.5);
        if (xend > in_size) xend = in_size;
        int64_t xsize = xend - xmin;
        if (xsize < 0) xsize = 0;
        if (xsize > ksize) xsize = ksize; /* rounding can make the window one wider than ksize */
        double total = 0.0;
        for (int64_t j = 0; j < xsize; j++) {
            wi[j] = keys_cubic(((double)(j + xmin) - center + 0.5) * invscale);
            total += wi[j];
        }
        if (total != 0.0)
            for (int64_t j = 0; j < xsize; j++) {
                wi[j] /= total;
                if (wi[j] > w_max) w_max = wi[j];
            }
        t->first[i] = (int)xmin;
        t->count[i] = (int)xsize;
    }
    unsigned p;
    for (p = 0; p < MAX_PRECISION; p++) {
        int next = (int)(0.5 + w_max * (double)(1 << (p + 1)));
        if (next >= (1 << 15)) break;
    }
    t->precision = p;
    for (size_t k = 0; k < (size_t)out_size * (size_t)ksize; k++) {
        double v = w[k] * (double)(1 << p);
        t->weights[k] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
    }
    free(w);
    return 0;
}

static inline uint8_t round_shift_clamp(int32_t sum, unsigned precision) {
    if (sum < 0) return 0;
    int32_t v = sum >> precision;
    return (uint8_t)(v > 255 ? 255 : v);
}

/* One output pixel of the width pass, three channels at once (the RGB case). */
static inline void horizontal_pixel3(const uint8_t *restrict window, const int16_t *restrict k, int count, int32_t half,
                                     unsigned precision, uint8_t *restrict out) {
    int32_t r = half, g = half, b = half;
    for (int j = 0; j < count; j++, window += 3) {
        const int32_t w = k[j];
        r += w * window[0];
        g += w * window[1];
        b += w * window[2];
    }
    out[0] = round_shift_clamp(r, precision);
    out[1] = round_shift_clamp(g, precision);
    out[2] = round_shift_clamp(b, precision);
}

void squad_resample_rows_horizontal(const squad_resample_plan *p, const uint8_t *src, int y0, int y1, uint8_t *dst) {
    const squad_resample_taps *t = &p->th;
    const int channels = p->channels, in_w = p->in_w, out_w = p->out_w;
    const int32_t half = (int32_t)1 << (t->precision - 1);
    for (int y = y0; y < y1; y++) {
        const uint8_t *in = src + (size_t)y * in_w * channels;
        uint8_t *out = dst + (size_t)(y - y0) * out_w * channels;
        for (int x = 0; x < out_w; x++) {
            const int16_t *k = t->weights + (size_t)x * t->ksize;
            const uint8_t *window = in + (size_t)t->first[x] * channels;
            const int count = t->count[x];
            if (channels == 3) {
                horizontal_pixel3(window, k, count, half, t->precision, out + (size_t)x * 3);
                continue;
            }
            for (int c = 0; c < channels; c++) {
                int32_t sum = half;
                for (int j = 0; j < count; j++) sum += (int32_t)k[j] * window[j * channels + c];
                out[(size_t)x * channels + c] = round_shift_clamp(sum, t->precision);
            }
        }
    }
}

/* Bytes [from, row_len) of one height-pass output row, one byte at a time: the inputs are count
 * rows from `first` on, row_len bytes apart. */
static void vertical_row_scalar(const uint8_t *first, size_t row_len, const int16_t *k, int count, unsigned precision,
                                size_t from, uint8_t *out) {
    const int32_t half = (int32_t)1 << (precision - 1);
    for (size_t i = from; i < row_len; i++) {
        int32_t sum = half;
        for (int j = 0; j < count; j++) sum += (int32_t)k[j] * first[(size_t)j * row_len + i];
        out[i] = round_shift_clamp(sum, precision);
    }
}

#if defined(__SSE2__)
/* sums += the products of two rows' 16 bytes (a, b) and their weights (wp: w_a, w_b repeated), by
 * pmaddwd: each int32 lane gets a_i w_a + b_i w_b, exact (bytes and int16 weights into int32). */
static inline void vertical_madd(__m128i a, __m128i b, __m128i wp, __m128i sums[4]) {
    const __m128i zero = _mm_setzero_si128();
    const __m128i lo = _mm_unpacklo_epi8(a, b), hi = _mm_unpackhi_epi8(a, b); /* a0 b0 a1 b1 ... */
    sums[0] = _mm_add_epi32(sums[0], _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), wp));
    sums[1] = _mm_add_epi32(sums[1], _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), wp));
    sums[2] = _mm_add_epi32(sums[2], _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), wp));
    sums[3] = _mm_add_epi32(sums[3], _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), wp));
}

/* The height pass on whole 16-byte blocks of one output row; returns the bytes done. The integer
 * sums are the scalar loop's (exact arithmetic in another order); the shift is arithmetic and the
 * two saturating packs clamp to 0..255 as round_shift_clamp does. */
static size_t vertical_row_sse2(const uint8_t *first, size_t row_len, const int16_t *k, int count, unsigned precision,
                                uint8_t *out) {
    const __m128i half = _mm_set1_epi32((int32_t)1 << (precision - 1));
    const __m128i shift = _mm_cvtsi32_si128((int)precision);
    size_t i = 0;
    for (; i + VERTICAL_BLOCK <= row_len; i += VERTICAL_BLOCK) {
        __m128i sums[4] = {half, half, half, half};
        const uint8_t *in = first + i;
        int j = 0;
        for (; j + 1 < count; j += 2, in += 2 * row_len) {
            const __m128i wp = _mm_unpacklo_epi16(_mm_set1_epi16(k[j]), _mm_set1_epi16(k[j + 1]));
            vertical_madd(_mm_loadu_si128((const __m128i *)in), _mm_loadu_si128((const __m128i *)(in + row_len)), wp,
                          sums);
        }
        if (j < count) {
            const __m128i wp = _mm_unpacklo_epi16(_mm_set1_epi16(k[j]), _mm_setzero_si128());
            vertical_madd(_mm_loadu_si128((const __m128i *)in), _mm_setzero_si128(), wp, sums);
        }
        for (int q = 0; q < 4; q++) sums[q] = _mm_sra_epi32(sums[q], shift);
        const __m128i packed = _mm_packus_epi16(_mm_packs_epi32(sums[0], sums[1]), _mm_packs_epi32(sums[2], sums[3]));
        _mm_storeu_si128((__m128i *)(out + i), packed);
    }
    return i;
}
#endif

void squad_resample_rows_vertical(const squad_resample_plan *p, const uint8_t *rows, int y0, int y1, uint8_t *dst) {
    const squad_resample_taps *t = &p->tv;
    const size_t row_len = (size_t)p->out_w * p->channels;
    for (int y = y0; y < y1; y++) {
        const int16_t *k = t->weights + (size_t)y * t->ksize;
        const uint8_t *first = rows + (size_t)t->first[y] * row_len;
        uint8_t *out = dst + (size_t)(y - y0) * row_len;
        size_t done = 0;
#if defined(__SSE2__)
        done = vertical_row_sse2(first, row_len, k, t->count[y], t->precision, out);
#endif
        vertical_row_scalar(first, row_len, k, t->count[y], t->precision, done, out);
    }
}

void squad_resample_plan_free(squad_resample_plan *p) {
    taps_free(&p->th);
    taps_free(&p->tv);
}

int squad_resample_plan_init(squad_resample_plan *p, int in_w, int in_h, int channels, int out_w, int out_h,
                             squad_err *err) {
    memset(p, 0, sizeof *p);
    if (in_w <= 0 || in_h <= 0 || out_w <= 0 || out_h <= 0 || channels <= 0)
        return squad_fail(err, SQUAD_E_INVALID, "resample: sizes must be positive (%dx%d -> %dx%d, %d channels)", in_w,
                          in_h, out_w, out_h, channels);
    p->in_w = in_w;
    p->in_h = in_h;
    p->out_w = out_w;
    p->out_h = out_h;
    p->channels = channels;
    p->horizontal = out_w != in_w;
    p->vertical = out_h != in_h;
    int rc = 0;
    if (p->horizontal && (rc = taps_build(in_w, out_w, &p->th, err)) != 0) return rc;
    if (p->vertical && (rc = taps_build(in_h, out_h, &p->tv, err)) != 0) return rc;
    return 0;
}

int squad_resample_bicubic_u8(const uint8_t *src, int in_w, int in_h, int channels, uint8_t *dst, int out_w, int out_h,
                              squad_err *err) {
    squad_resample_plan plan;
    int rc = squad_resample_plan_init(&plan, in_w, in_h, channels, out_w, out_h, err);
    if (rc) {
        squad_resample_plan_free(&plan);
        return rc;
    }
    uint8_t *mid = NULL;
    if (plan.horizontal && plan.vertical) {
        mid = squad_malloc((size_t)out_w * in_h * channels, err);
        if (!mid) {
            squad_resample_plan_free(&plan);
            return SQUAD_E_NOMEM;
        }
    }
    if (plan.horizontal) squad_resample_rows_horizontal(&plan, src, 0, in_h, mid ? mid : dst);
    if (plan.vertical) squad_resample_rows_vertical(&plan, mid ? mid : src, 0, out_h, dst);
    if (!plan.horizontal && !plan.vertical) memcpy(dst, src, (size_t)in_w * in_h * channels);
    free(mid);
    squad_resample_plan_free(&plan);
    return 0;
}
