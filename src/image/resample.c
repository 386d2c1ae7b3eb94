/*
 * resample.c — antialiased bicubic resizing of 8-bit images (resample.h).
 *
 * Design:
 *  - A pass along one axis is described by its taps (bicubic_taps): for each output index, the
 *    first input index, the number of inputs and their int16 weights, all sharing one fixed-point
 *    precision. taps_build computes them exactly as the reference does, in double precision and
 *    in the same order of operations, because a weight that rounds to a different int16 changes a
 *    pixel: the kernel's centre is scale * (i + 0.5) with scale = in / out; when downscaling the
 *    kernel is stretched by the scale (support 2 * scale, evaluated at distance / scale); the
 *    window is [trunc(centre - support + 0.5), trunc(centre + support + 0.5)) clipped to the input;
 *    the weights are divided by their sum; the precision is the largest p < 22 with
 *    round(max weight * 2^(p+1)) < 2^15; a weight becomes round-half-away(w * 2^p).
 *  - A pass sums weight x sample from 2^(p-1) (rounding), shifts right by p and clamps to 0..255.
 *    The horizontal pass walks each output pixel's window; the vertical pass adds whole input rows
 *    into a row of int32 sums, a loop the compiler vectorises. The sums fit int32: the weights'
 *    absolute values add up to under 1.25 x 2^p <= 1.25 x 2^22, times 255.
 *  - This file is compiled with floating-point contraction off (CMakeLists.txt), so a build with
 *    FMA enabled computes the same weights, and with -O3 for the vertical pass's vectorised loop
 *    (a 1920x1080 -> 1920x1088 resize: 40 -> 31 ms of CPU on the development machine).
 */
#include "image/resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* The Keys cubic kernel's parameter in the antialiased path (PIL's and PyTorch's). */
#define KEYS_A (-0.5)
/* The fixed-point precision is capped here, and a weight times 2^p stays below 2^15 (int16). */
#define MAX_PRECISION 22

typedef struct bicubic_taps {
    int ksize;         /* the widest window: weights per output index */
    int *first;        /* [out] first input index */
    int *count;        /* [out] inputs in the window */
    int16_t *weights;  /* [out][ksize] */
    unsigned precision;
} bicubic_taps;

static double keys_cubic(double x) {
    const double a = KEYS_A;
    x = fabs(x);
    if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0.0;
}

static void taps_free(bicubic_taps *t) {
    free(t->first);
    free(t->count);
    free(t->weights);
    memset(t, 0, sizeof *t);
}

static int taps_build(int in_size, int out_size, bicubic_taps *t, squad_err *err) {
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

/* rows rows of in_w pixels -> rows rows of out_w pixels */
static void pass_horizontal(const uint8_t *src, int in_w, int rows, int channels, const bicubic_taps *t, int out_w,
                            uint8_t *dst) {
    const int32_t half = (int32_t)1 << (t->precision - 1);
    for (int y = 0; y < rows; y++) {
        const uint8_t *in = src + (size_t)y * in_w * channels;
        uint8_t *out = dst + (size_t)y * out_w * channels;
        for (int x = 0; x < out_w; x++) {
            const int16_t *k = t->weights + (size_t)x * t->ksize;
            const uint8_t *window = in + (size_t)t->first[x] * channels;
            for (int c = 0; c < channels; c++) {
                int32_t sum = half;
                for (int j = 0; j < t->count[x]; j++) sum += (int32_t)k[j] * window[j * channels + c];
                out[x * channels + c] = round_shift_clamp(sum, t->precision);
            }
        }
    }
}

/* in_h rows -> out_h rows, each row_len bytes; sums is scratch of row_len int32 */
static void pass_vertical(const uint8_t *restrict src, size_t row_len, const bicubic_taps *t, int out_h,
                          uint8_t *restrict dst, int32_t *restrict sums) {
    const int32_t half = (int32_t)1 << (t->precision - 1);
    for (int y = 0; y < out_h; y++) {
        const int16_t *k = t->weights + (size_t)y * t->ksize;
        for (size_t i = 0; i < row_len; i++) sums[i] = half;
        for (int j = 0; j < t->count[y]; j++) {
            const uint8_t *restrict in = src + (size_t)(t->first[y] + j) * row_len;
            const int32_t w = k[j];
            for (size_t i = 0; i < row_len; i++) sums[i] += w * in[i];
        }
        uint8_t *out = dst + (size_t)y * row_len;
        for (size_t i = 0; i < row_len; i++) out[i] = round_shift_clamp(sums[i], t->precision);
    }
}

int squad_resample_bicubic_u8(const uint8_t *src, int in_w, int in_h, int channels, uint8_t *dst, int out_w, int out_h,
                              squad_err *err) {
    if (in_w <= 0 || in_h <= 0 || out_w <= 0 || out_h <= 0 || channels <= 0)
        return squad_fail(err, SQUAD_E_INVALID, "resample: sizes must be positive (%dx%d -> %dx%d, %d channels)", in_w,
                          in_h, out_w, out_h, channels);
    const int horizontal = out_w != in_w, vertical = out_h != in_h;
    if (!horizontal && !vertical) {
        memcpy(dst, src, (size_t)in_w * in_h * channels);
        return 0;
    }
    bicubic_taps th = {0}, tv = {0};
    uint8_t *mid = NULL;
    int32_t *sums = NULL;
    int rc = 0;
    if (horizontal && (rc = taps_build(in_w, out_w, &th, err)) != 0) goto done;
    if (vertical && (rc = taps_build(in_h, out_h, &tv, err)) != 0) goto done;
    const uint8_t *rows = src; /* what the vertical pass reads */
    if (horizontal) {
        uint8_t *target = dst;
        if (vertical) {
            mid = squad_malloc((size_t)out_w * in_h * channels, err);
            if (!mid) {
                rc = SQUAD_E_NOMEM;
                goto done;
            }
            target = mid;
        }
        pass_horizontal(src, in_w, in_h, channels, &th, out_w, target);
        rows = target;
    }
    if (vertical) {
        size_t row_len = (size_t)out_w * channels;
        sums = squad_malloc(sizeof(int32_t) * row_len, err);
        if (!sums) {
            rc = SQUAD_E_NOMEM;
            goto done;
        }
        pass_vertical(rows, row_len, &tv, out_h, dst, sums);
    }
done:
    taps_free(&th);
    taps_free(&tv);
    free(mid);
    free(sums);
    return rc;
}
