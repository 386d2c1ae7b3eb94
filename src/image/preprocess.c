/*
 * preprocess.c — the Qwen2-VL image processor (preprocess.h): configuration, smart_resize, resize,
 * normalisation and the patch layout.
 *
 * Design:
 *  - smart_resize does the reference's arithmetic in the reference's order with doubles (Python's
 *    floats): round() is round-half-to-even (rint in the default rounding mode), the divisions and
 *    square roots are IEEE, floor and ceil are exact. A different rounding would move a side by a
 *    whole factor for sizes like 48 or 80 (1.5 and 2.5 factors).
 *  - Normalisation is a 256-entry table per channel: every output value is one uint8 sample through
 *    the reference's float32 operations ((float)u - mean') / std' with mean' = (float)mean x
 *    (float)(1 / rescale), as torchvision's fused rescale-and-normalise computes it, so the values
 *    are equal to the bit, not just close.
 *  - The patch layout writes each patch's first frame straight from the resized image and copies
 *    it to the other temporal_patch_size - 1 frames (an image is one frame repeated); a patch is
 *    written whole before the next, so the 50 MB of a screenshot's values go out in 6 KB runs.
 *  - Threads: the work is cut into patch rows (patch_size pixel rows), handed out by an atomic
 *    counter to pthreads started and joined inside the call. A unit resizes its pixel rows into
 *    the thread's strip (resample.h's row-range passes) and writes that row's patches, so the
 *    resized image is never stored whole. When both sides change, the width pass runs first over
 *    all input rows (the height pass of a patch row reads a few rows beyond it). Every unit writes
 *    its own bytes and reads only shared inputs: the values do not depend on the split.
 *  - Configuration bounds keep every product (sides, areas, buffer sizes) far from overflow: the
 *    pixel limits are at most SQUAD_IMAGE_PROC_MAX_PIXELS, factors at most a few thousand.
 */
#define _DEFAULT_SOURCE /* madvise */
#include "image/preprocess.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#include "image/resample.h"
#include "util.h"

/* Bounds on configuration values (far above any Qwen checkpoint's: 16, 2, 2, 16 Mi pixels). */
#define PROC_MAX_PATCH 1024
#define PROC_MAX_TEMPORAL 64
#define PROC_MAX_MERGE 64
#define PROC_MAX_FACTOR 4096
#define SQUAD_IMAGE_PROC_MAX_PIXELS ((int64_t)1 << 28)
/* The resample filter transformers calls BICUBIC (PIL's number), the only one supported. */
#define PROC_RESAMPLE_BICUBIC 3
#define PROC_CHANNELS 3
/* Pixel-value buffers this large go in transparent huge pages (alloc_values). */
#define VALUES_HUGE_BYTES ((size_t)2 << 20)
/* A thread per this many pixel values at most (1 MB of output; starting a thread costs tens of us). */
#define VALUES_PER_THREAD ((size_t)256 << 10)
/* Input rows per unit of the width pass when it runs before the height pass. */
#define WIDTH_ROWS_PER_UNIT 16

/* OpenAI CLIP's mean and std: transformers' defaults for this processor class. */
static const double clip_mean[3] = {0.48145466, 0.4578275, 0.40821073};
static const double clip_std[3] = {0.26862954, 0.26130258, 0.27577711};

void squad_image_proc_config_default(squad_image_proc_config *c) {
    memset(c, 0, sizeof *c);
    c->patch_size = 14;
    c->temporal_patch_size = 2;
    c->merge_size = 2;
    c->min_pixels = 56 * 56;
    c->max_pixels = 28 * 28 * 1280;
    memcpy(c->image_mean, clip_mean, sizeof clip_mean);
    memcpy(c->image_std, clip_std, sizeof clip_std);
    c->rescale_factor = 1.0 / 255.0;
    c->do_resize = c->do_rescale = c->do_normalize = 1;
}

/* ---- configuration ---- */

static json_t *present(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int read_int(json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out, squad_err *err) {
    json_t *v = present(obj, key);
    if (!v) return 0;
    if (!json_is_integer(v))
        return squad_fail(err, SQUAD_E_MODEL, "preprocessor config: '%s' must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return squad_fail(err, SQUAD_E_MODEL, "preprocessor config: '%s' = %lld is outside [%lld, %lld]", key, (long long)x,
                          (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

static int read_bool(json_t *obj, const char *key, int *out, squad_err *err) {
    json_t *v = present(obj, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return squad_fail(err, SQUAD_E_MODEL, "preprocessor config: '%s' must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

static int number_of(json_t *v, double *out) {
    if (json_is_integer(v)) *out = (double)json_integer_value(v);
    else if (json_is_real(v)) *out = json_real_value(v);
    else return -1;
    return isfinite(*out) ? 0 : -1;
}

/* A number, or a list of one or three numbers, for the three channels. */
static int read_channels(json_t *obj, const char *key, double out[3], squad_err *err) {
    json_t *v = present(obj, key);
    if (!v) return 0;
    double x[3];
    if (json_is_array(v)) {
        size_t n = json_array_size(v);
        if (n != 1 && n != PROC_CHANNELS)
            return squad_fail(err, SQUAD_E_MODEL, "preprocessor config: '%s' must have 1 or 3 values", key);
        for (size_t i = 0; i < PROC_CHANNELS; i++)
            if (number_of(json_array_get(v, n == 1 ? 0 : i), &x[i]) != 0)
                return squad_fail(err, SQUAD_E_MODEL, "preprocessor config: '%s' must hold numbers", key);
    } else {
        if (number_of(v, &x[0]) != 0)
            return squad_fail(err, SQUAD_E_MODEL, "preprocessor config: '%s' must be a number or a list", key);
        x[1] = x[2] = x[0];
    }
    memcpy(out, x, sizeof x);
    return 0;
}

static int read_sizes(json_t *root, squad_image_proc_config *c, squad_err *err) {
    int64_t v;
    int has_min = 0, has_max = 0;
    json_t *size = present(root, "size");
    if (size) {
        if (!json_is_object(size)) return squad_fail(err, SQUAD_E_MODEL, "preprocessor config: 'size' must be an object");
        v = -1;
        if (read_int(size, "shortest_edge", 1, SQUAD_IMAGE_PROC_MAX_PIXELS, &v, err)) return squad_fail_context(err, "size: ");
        if (v > 0) c->min_pixels = v, has_min = 1;
        v = -1;
        if (read_int(size, "longest_edge", 1, SQUAD_IMAGE_PROC_MAX_PIXELS, &v, err)) return squad_fail_context(err, "size: ");
        if (v > 0) c->max_pixels = v, has_max = 1;
    }
    /* top-level min_pixels / max_pixels override size, as transformers' constructor does */
    int rc;
    v = -1;
    if ((rc = read_int(root, "min_pixels", 1, SQUAD_IMAGE_PROC_MAX_PIXELS, &v, err)) != 0) return rc;
    if (v > 0) c->min_pixels = v, has_min = 1;
    v = -1;
    if ((rc = read_int(root, "max_pixels", 1, SQUAD_IMAGE_PROC_MAX_PIXELS, &v, err)) != 0) return rc;
    if (v > 0) c->max_pixels = v, has_max = 1;
    if (size && (!has_min || !has_max))
        return squad_fail(err, SQUAD_E_MODEL,
                          "preprocessor config: 'size' must contain 'shortest_edge' and 'longest_edge' (or give "
                          "'min_pixels' and 'max_pixels')");
    if (c->min_pixels > c->max_pixels)
        return squad_fail(err, SQUAD_E_MODEL, "preprocessor config: min pixels %lld exceed max pixels %lld",
                          (long long)c->min_pixels, (long long)c->max_pixels);
    return 0;
}

static int check_processor_type(json_t *root, squad_err *err) {
    json_t *type = present(root, "image_processor_type");
    if (!type) return 0;
    static const char prefix[] = "Qwen2VLImageProcessor";
    if (!json_is_string(type) || strncmp(json_string_value(type), prefix, sizeof prefix - 1) != 0)
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "preprocessor config: image_processor_type '%s' is not supported",
                          json_is_string(type) ? json_string_value(type) : "?");
    return 0;
}

static int parse_root(json_t *root, squad_image_proc_config *c, squad_err *err) {
    json_t *nested = present(root, "image_processor"); /* processor_config.json's layout */
    if (nested) {
        if (!json_is_object(nested))
            return squad_fail(err, SQUAD_E_MODEL, "preprocessor config: 'image_processor' must be an object");
        root = nested;
    }
    int rc;
    if ((rc = check_processor_type(root, err)) != 0) return rc;
    int64_t v;
    v = c->patch_size;
    if ((rc = read_int(root, "patch_size", 1, PROC_MAX_PATCH, &v, err)) != 0) return rc;
    c->patch_size = (int)v;
    v = c->temporal_patch_size;
    if ((rc = read_int(root, "temporal_patch_size", 1, PROC_MAX_TEMPORAL, &v, err)) != 0) return rc;
    c->temporal_patch_size = (int)v;
    v = c->merge_size;
    if ((rc = read_int(root, "merge_size", 1, PROC_MAX_MERGE, &v, err)) != 0) return rc;
    c->merge_size = (int)v;
    if (c->patch_size * c->merge_size > PROC_MAX_FACTOR)
        return squad_fail(err, SQUAD_E_MODEL, "preprocessor config: patch_size x merge_size = %d is over %d",
                          c->patch_size * c->merge_size, PROC_MAX_FACTOR);
    if ((rc = read_sizes(root, c, err)) != 0) return rc;
    if ((rc = read_channels(root, "image_mean", c->image_mean, err)) != 0) return rc;
    if ((rc = read_channels(root, "image_std", c->image_std, err)) != 0) return rc;
    for (int i = 0; i < PROC_CHANNELS; i++)
        if (c->image_std[i] == 0.0) return squad_fail(err, SQUAD_E_MODEL, "preprocessor config: 'image_std' has a zero");
    json_t *rescale = present(root, "rescale_factor");
    if (rescale && (number_of(rescale, &c->rescale_factor) != 0 || !(c->rescale_factor > 0)))
        return squad_fail(err, SQUAD_E_MODEL, "preprocessor config: 'rescale_factor' must be a positive number");
    if ((rc = read_bool(root, "do_resize", &c->do_resize, err)) != 0) return rc;
    if ((rc = read_bool(root, "do_rescale", &c->do_rescale, err)) != 0) return rc;
    if ((rc = read_bool(root, "do_normalize", &c->do_normalize, err)) != 0) return rc;
    int convert_rgb = 1;
    if ((rc = read_bool(root, "do_convert_rgb", &convert_rgb, err)) != 0) return rc;
    if (!convert_rgb)
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "preprocessor config: do_convert_rgb false is not supported");
    v = PROC_RESAMPLE_BICUBIC;
    if ((rc = read_int(root, "resample", 0, 5, &v, err)) != 0) return rc;
    if (v != PROC_RESAMPLE_BICUBIC)
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "preprocessor config: resample %lld is not supported (only 3, bicubic)",
                          (long long)v);
    return 0;
}

int squad_image_proc_config_parse(squad_image_proc_config *c, const char *json, size_t len, squad_err *err) {
    squad_image_proc_config_default(c);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return squad_fail(err, SQUAD_E_MODEL, "preprocessor config: invalid JSON at line %d: %s", jerr.line, jerr.text);
    int rc = json_is_object(root) ? parse_root(root, c, err)
                                  : squad_fail(err, SQUAD_E_MODEL, "preprocessor config: not a JSON object");
    json_decref(root);
    if (rc) squad_image_proc_config_default(c);
    return rc;
}

int squad_image_proc_config_load(squad_image_proc_config *c, const char *path, squad_err *err) {
    size_t len = 0;
    char *text = squad_read_file(path, &len, err);
    if (!text) return err ? err->code : SQUAD_E_IO;
    int rc = squad_image_proc_config_parse(c, text, len, err);
    free(text);
    if (rc) squad_fail_context(err, "%s: ", path);
    return rc;
}

/* ---- smart_resize and the grid ---- */

int squad_image_smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels, int *out_h,
                             int *out_w, squad_err *err) {
    if (height <= 0 || width <= 0 || factor <= 0 || min_pixels <= 0 || max_pixels < min_pixels)
        return squad_fail(err, SQUAD_E_INVALID, "smart_resize: bad arguments (%dx%d, factor %d)", width, height, factor);
    double big = height > width ? height : width, small = height > width ? width : height;
    if (big / small > SQUAD_IMAGE_MAX_ASPECT)
        return squad_fail(err, SQUAD_E_INVALID, "image: aspect ratio %.1f (%dx%d) is over %d", big / small, width, height,
                          SQUAD_IMAGE_MAX_ASPECT);
    double h_bar = rint((double)height / factor) * factor; /* round half to even, as Python's round */
    double w_bar = rint((double)width / factor) * factor;
    if (h_bar * w_bar > (double)max_pixels) {
        double beta = sqrt((double)height * (double)width / (double)max_pixels);
        h_bar = fmax(factor, floor((double)height / beta / factor) * factor);
        w_bar = fmax(factor, floor((double)width / beta / factor) * factor);
    } else if (h_bar * w_bar < (double)min_pixels) {
        double beta = sqrt((double)min_pixels / ((double)height * (double)width));
        h_bar = ceil((double)height * beta / factor) * factor;
        w_bar = ceil((double)width * beta / factor) * factor;
    }
    if (!(h_bar >= factor && w_bar >= factor && h_bar <= (1 << 20) && w_bar <= (1 << 20)))
        return squad_fail(err, SQUAD_E_INVALID, "smart_resize: %dx%d resizes to an unusable %.0fx%.0f", width, height, w_bar,
                          h_bar);
    *out_h = (int)h_bar;
    *out_w = (int)w_bar;
    return 0;
}

static int resized_size(const squad_image_proc_config *c, int width, int height, int *rh, int *rw, squad_err *err) {
    int factor = c->patch_size * c->merge_size;
    if (c->do_resize) return squad_image_smart_resize(height, width, factor, c->min_pixels, c->max_pixels, rh, rw, err);
    if (width <= 0 || height <= 0 || width % factor || height % factor)
        return squad_fail(err, SQUAD_E_INVALID, "image: without resizing, %dx%d must be multiples of %d", width, height,
                          factor);
    *rh = height;
    *rw = width;
    return 0;
}

int squad_image_grid(const squad_image_proc_config *c, int width, int height, int grid[3], squad_err *err) {
    int rh, rw;
    int rc = resized_size(c, width, height, &rh, &rw, err);
    if (rc) return rc;
    grid[0] = 1; /* one frame, repeated to temporal_patch_size: one temporal patch */
    grid[1] = rh / c->patch_size;
    grid[2] = rw / c->patch_size;
    return 0;
}

/* ---- normalisation and patches ---- */

/* The float32 value of each uint8 sample per channel, as the reference computes it. */
static void build_value_table(const squad_image_proc_config *c, float table[PROC_CHANNELS][256]) {
    for (int ch = 0; ch < PROC_CHANNELS; ch++) {
        float mean = (float)c->image_mean[ch], std = (float)c->image_std[ch];
        if (c->do_rescale && c->do_normalize) { /* fused: mean and std scaled by 1 / rescale in float32 */
            float inv = (float)(1.0 / c->rescale_factor);
            mean = mean * inv;
            std = std * inv;
        }
        for (int u = 0; u < 256; u++) {
            float x = (float)u;
            if (c->do_normalize) x = (x - mean) / std;
            else if (c->do_rescale) x = x * (float)c->rescale_factor;
            table[ch][u] = x;
        }
    }
}

/* What the threads of one squad_image_preprocess_threads call share: the layout, the resize, and
 * a counter handing out units of work (a phase's units are independent and write disjoint bytes). */
typedef struct proc_job {
    int P, T, M;           /* patch side, frames, merge window side */
    int width;             /* of the resized image */
    int blocks_w;          /* merge windows across */
    size_t plane, patch_dim;
    const float (*table)[256];
    const squad_resample_plan *plan; /* NULL: no resize */
    const uint8_t *src;              /* the decoded image */
    uint8_t *mid;                    /* the width pass's output when both passes run, else NULL */
    float *out;
    int phase;      /* PHASE_WIDTH or PHASE_PATCHES */
    int n_units;    /* the phase's units */
    atomic_int next; /* the next unit to hand out */
} proc_job;

enum { PHASE_WIDTH, PHASE_PATCHES };

/* One thread: the job and its own strip (a patch row's resized pixels). */
typedef struct proc_worker {
    proc_job *job;
    uint8_t *strip;
    pthread_t thread;
} proc_worker;

/* Patch row pr (its P pixel rows in `rows`, one resized image row after another) into its patches:
 * the rows of pixel_values whose merge window is in block row pr / M, at row pr % M inside it.
 * Each patch is written whole (6 KB for Qwen3.5) before the next: channel planes of the first
 * frame from the interleaved samples, then the frame copies. */
static void write_patch_row(const proc_job *j, int pr, const uint8_t *rows) {
    const int P = j->P, T = j->T, M = j->M;
    const size_t stride = (size_t)j->width * PROC_CHANNELS, plane = j->plane;
    const float *t0 = j->table[0], *t1 = j->table[1], *t2 = j->table[2];
    const int bh = pr / M, mh = pr % M;
    for (int bw = 0; bw < j->blocks_w; bw++)
        for (int mw = 0; mw < M; mw++) {
            const size_t row = ((size_t)(bh * j->blocks_w + bw) * M + mh) * M + mw;
            float *patch = j->out + row * j->patch_dim;
            float *r = patch, *g = patch + (size_t)T * plane, *b = patch + (size_t)2 * T * plane;
            const uint8_t *src = rows + (size_t)(bw * M + mw) * P * PROC_CHANNELS;
            for (int py = 0; py < P; py++, src += stride, r += P, g += P, b += P)
                for (int px = 0; px < P; px++) {
                    r[px] = t0[src[3 * px]];
                    g[px] = t1[src[3 * px + 1]];
                    b[px] = t2[src[3 * px + 2]];
                }
            for (int ch = 0; ch < PROC_CHANNELS; ch++) {
                float *frame0 = patch + (size_t)ch * T * plane;
                for (int t = 1; t < T; t++) memcpy(frame0 + t * plane, frame0, plane * sizeof(float));
            }
        }
}

static void run_unit(const proc_job *j, int unit, uint8_t *strip) {
    const squad_resample_plan *plan = j->plan;
    if (j->phase == PHASE_WIDTH) { /* input rows through the width pass, into mid */
        const int y0 = unit * WIDTH_ROWS_PER_UNIT;
        const int y1 = y0 + WIDTH_ROWS_PER_UNIT < plan->in_h ? y0 + WIDTH_ROWS_PER_UNIT : plan->in_h;
        squad_resample_rows_horizontal(plan, j->src, y0, y1, j->mid + (size_t)y0 * plan->out_w * PROC_CHANNELS);
        return;
    }
    const int y0 = unit * j->P; /* a patch row: resize its pixel rows into the strip, then patches */
    const uint8_t *rows = j->src + (size_t)y0 * j->width * PROC_CHANNELS;
    if (plan && plan->vertical) {
        squad_resample_rows_vertical(plan, j->mid ? j->mid : j->src, y0, y0 + j->P, strip);
        rows = strip;
    } else if (plan && plan->horizontal) {
        squad_resample_rows_horizontal(plan, j->src, y0, y0 + j->P, strip);
        rows = strip;
    }
    write_patch_row(j, unit, rows);
}

static void *worker_main(void *arg) {
    proc_worker *w = arg;
    for (int unit; (unit = atomic_fetch_add(&w->job->next, 1)) < w->job->n_units;) run_unit(w->job, unit, w->strip);
    return NULL;
}

/* Runs the job's phase on the calling thread and up to n - 1 more. A thread that cannot be made
 * is no error: the units go to those that run (at least the caller). */
static void run_phase(proc_job *j, int phase, int n_units, proc_worker *workers, int n) {
    j->phase = phase;
    j->n_units = n_units;
    atomic_store(&j->next, 0);
    if (n > n_units) n = n_units;
    int started = 1;
    for (; started < n; started++)
        if (pthread_create(&workers[started].thread, NULL, worker_main, &workers[started]) != 0) break;
    worker_main(&workers[0]);
    for (int i = 1; i < started; i++) pthread_join(workers[i].thread, NULL);
}

/* The threads a call uses: the ask (0 or less: the online cores), at most SQUAD_IMAGE_MAX_THREADS,
 * and at most one per VALUES_PER_THREAD pixel values (a small image is not worth a thread). */
static int proc_threads(int asked, size_t n_values) {
    long n = asked;
    if (n <= 0) n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > SQUAD_IMAGE_MAX_THREADS) n = SQUAD_IMAGE_MAX_THREADS;
    size_t by_work = n_values / VALUES_PER_THREAD;
    if (by_work < (size_t)n) n = by_work > 0 ? (long)by_work : 1;
    return (int)n;
}

/* The pixel values of a screenshot are tens of MB written once: in 2 MB pages where the kernel
 * offers them (one page fault per 2 MB instead of per 4 KB, which was most of the time). */
static float *alloc_values(size_t n, squad_err *err) {
    if (n > SIZE_MAX / sizeof(float)) {
        squad_fail(err, SQUAD_E_NOMEM, "image: %zu pixel values overflow", n);
        return NULL;
    }
    size_t bytes = n * sizeof(float);
#ifdef MADV_HUGEPAGE
    if (bytes >= VALUES_HUGE_BYTES) {
        void *p = NULL;
        size_t rounded = (bytes + VALUES_HUGE_BYTES - 1) / VALUES_HUGE_BYTES * VALUES_HUGE_BYTES;
        if (posix_memalign(&p, VALUES_HUGE_BYTES, rounded) == 0) {
            madvise(p, rounded, MADV_HUGEPAGE); /* advice only: a refusal leaves ordinary pages */
            return p;
        }
    }
#endif
    return squad_malloc(bytes ? bytes : 1, err);
}

int squad_image_preprocess(const squad_image_proc_config *c, const squad_image *img, squad_image_patches *out,
                           squad_err *err) {
    return squad_image_preprocess_threads(c, img, 0, out, err);
}

/* Fills out's sizes for a resized rh x rw image. */
static void patches_shape(const squad_image_proc_config *c, int rh, int rw, squad_image_patches *out) {
    out->grid[0] = 1;
    out->grid[1] = rh / c->patch_size;
    out->grid[2] = rw / c->patch_size;
    out->resized_height = rh;
    out->resized_width = rw;
    out->n_patches = (int64_t)out->grid[0] * out->grid[1] * out->grid[2];
    out->patch_dim = PROC_CHANNELS * c->temporal_patch_size * c->patch_size * c->patch_size;
    out->n_tokens = out->n_patches / ((int64_t)c->merge_size * c->merge_size);
}

int squad_image_preprocess_threads(const squad_image_proc_config *c, const squad_image *img, int threads,
                                   squad_image_patches *out, squad_err *err) {
    memset(out, 0, sizeof *out);
    if (!img || !img->rgb || img->width <= 0 || img->height <= 0)
        return squad_fail(err, SQUAD_E_INVALID, "image: nothing to process");
    int rh, rw;
    int rc = resized_size(c, img->width, img->height, &rh, &rw, err);
    if (rc) return rc;
    patches_shape(c, rh, rw, out);
    const size_t n_values = (size_t)out->n_patches * (size_t)out->patch_dim;
    const int n = proc_threads(threads, n_values);
    squad_resample_plan plan = {0};
    const int resize = rh != img->height || rw != img->width;
    uint8_t *mid = NULL, *strips = NULL;
    proc_worker *workers = NULL;
    if (resize && (rc = squad_resample_plan_init(&plan, img->width, img->height, PROC_CHANNELS, rw, rh, err)) != 0)
        goto fail;
    const size_t strip_bytes = (size_t)c->patch_size * (size_t)rw * PROC_CHANNELS;
    out->pixel_values = alloc_values(n_values, err);
    workers = squad_calloc((size_t)n, sizeof *workers, err);
    if (resize) strips = squad_malloc(strip_bytes * (size_t)n, err);
    if (plan.horizontal && plan.vertical) mid = squad_malloc((size_t)rw * (size_t)img->height * PROC_CHANNELS, err);
    if (!out->pixel_values || !workers || (resize && !strips) || (plan.horizontal && plan.vertical && !mid)) {
        rc = SQUAD_E_NOMEM;
        goto fail;
    }
    float table[PROC_CHANNELS][256];
    build_value_table(c, table);
    proc_job job = {.P = c->patch_size,
                    .T = c->temporal_patch_size,
                    .M = c->merge_size,
                    .width = rw,
                    .blocks_w = out->grid[2] / c->merge_size,
                    .plane = (size_t)c->patch_size * (size_t)c->patch_size,
                    .patch_dim = (size_t)out->patch_dim,
                    .table = (const float(*)[256])table,
                    .plan = resize ? &plan : NULL,
                    .src = img->rgb,
                    .mid = mid,
                    .out = out->pixel_values};
    for (int i = 0; i < n; i++) {
        workers[i].job = &job;
        workers[i].strip = strips ? strips + (size_t)i * strip_bytes : NULL;
    }
    if (mid) run_phase(&job, PHASE_WIDTH, (img->height + WIDTH_ROWS_PER_UNIT - 1) / WIDTH_ROWS_PER_UNIT, workers, n);
    run_phase(&job, PHASE_PATCHES, out->grid[1], workers, n);
    free(mid);
    free(strips);
    free(workers);
    squad_resample_plan_free(&plan);
    return 0;
fail:
    free(mid);
    free(strips);
    free(workers);
    squad_resample_plan_free(&plan);
    squad_image_patches_free(out);
    return rc;
}

void squad_image_patches_free(squad_image_patches *p) {
    if (!p) return;
    free(p->pixel_values);
    memset(p, 0, sizeof *p);
}
