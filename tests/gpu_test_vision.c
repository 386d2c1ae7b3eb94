/*
 * gpu_test_vision.c — the vision tower and image chunks on the CUDA backend.
 *
 *  - the tower's attention kernels (non-causal, within a frame: vis_attn on mma.sync, and the
 *    wgmma one at head dim 64 where the GPU is a Hopper) against a double host reference on the same
 *    bf16-rounded inputs, for every head dim each is built for, frames of lengths that are and are
 *    not multiples of their tiles, several frames and heads, and the 0.8B's 1920x1080 frame (8,160
 *    patches, head dim 64): relative L2 within TOL_VISION_ATTN_BF16; the exact path's fp32 kernel
 *    (vis_attn_f32) on the same cases with fp32 inputs: within TOL_VISION_ATTN_EXACT;
 *  - the whole tower (vision_forward) on a tiny-vl checkpoint, on both precisions, against the CPU
 *    tower in fp32 (cpu_vision_forward, EXACT: the reference, equal to transformers), on grids square
 *    and not, one frame and two, larger than the 4 x 4 position grid, one large enough that the
 *    pixels go up in pieces from several threads: max |CUDA - CPU| within TOL_VISION_BF16 (bf16) or
 *    TOL_VISION_EXACT (exact) x max(1, max |CPU|); a bad grid is refused and the backend stays usable;
 *  - image chunks through forward(), on both precisions: positions with three equal axes (start + i)
 *    give the bits of positions = NULL; image rows (embeds) equal to the embedding of a token give
 *    the bits of that token in their place, alone and two image chunks in one batch (each chunk's
 *    rows from its own offset); distinct (t, h, w) positions turn K exactly as interleaved M-RoPE
 *    says (the exact path's K / V read back with save_kv, un-turned by the plain positions and turned
 *    again on the host: within TOL_VISION_MROPE_K; V and the dims past the rotary unchanged).
 * SQUAD_GPU_TEST_QUICK=1 leaves out the 8,160-patch attention case (compute-sanitizer).
 * Exits 77 (skipped) without a GPU.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model.h"
#include "squad.h"
#include "testutil.h"
#include "tolerances.h"
#include "util.h"

#ifdef SQUAD_HAVE_CUDA
#include "cpu/gemm.h"
#include "cpu/pool.h"
#include "cpu/vision.h"
#include "cuda_test_api.h"

static int quick(void) {
    const char *q = getenv("SQUAD_GPU_TEST_QUICK");
    return q && q[0] == '1';
}

/* ---- the attention kernel ---- */

/* The attention kernels under test. */
enum { ATTN_MMA, ATTN_WGMMA, ATTN_F32 };
static const char *const ATTN_NAMES[] = {"mma.sync", "wgmma", "fp32"};

/* kind: ATTN_*; the wgmma kernel is not run where the GPU is not a Hopper (said so, not counted). */
static void test_attn(rng *r, int kind, int hd, int frames, int L, int heads) {
    const int wg = kind == ATTN_WGMMA, f32 = kind == ATTN_F32;
    const size_t n = (size_t)heads * frames * L * hd;
    float *q = calloc(n, sizeof *q), *k = calloc(n, sizeof *k), *v = calloc(n, sizeof *v);
    float *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
    if (!q || !k || !v || !got || !want) {
        CHECK(!"out of memory");
        free(q), free(k), free(v), free(got), free(want);
        return;
    }
    /* scaled so the softmax is neither flat nor one-hot; bf16-exact for the bf16 kernels, which take
     * bf16 inputs (the fp32 kernel gets fp32 values) */
    for (size_t i = 0; i < n; i++) {
        q[i] = (float)(1.5 * rng_norm(r));
        k[i] = (float)(1.5 * rng_norm(r));
        v[i] = (float)rng_norm(r);
        if (!f32) {
            q[i] = squad_bf16_to_f32(squad_f32_to_bf16(q[i]));
            k[i] = squad_bf16_to_f32(squad_f32_to_bf16(k[i]));
            v[i] = squad_bf16_to_f32(squad_f32_to_bf16(v[i]));
        }
    }
    squad_err err = {0};
    const int rc = f32  ? squad_cuda_test_vis_attn_f32(hd, frames, L, heads, q, k, v, got, &err)
                   : wg ? squad_cuda_test_vis_attn_wg(hd, frames, L, heads, q, k, v, got, &err)
                        : squad_cuda_test_vis_attn(hd, frames, L, heads, q, k, v, got, &err);
    if (wg && rc == SQUAD_E_UNSUPPORTED) {
        printf("vision attention (wgmma) hd %d: %s\n", hd, err.msg);
        free(q), free(k), free(v), free(got), free(want);
        return;
    }
    CHECKF(rc == 0, "%s attention hd %d: %s", ATTN_NAMES[kind], hd, err.msg);
    if (rc == 0) {
        cu_ref_vis_attn(hd, frames, L, heads, q, k, v, want);
        double num = 0, den = 0;
        int finite = 1;
        for (size_t i = 0; i < n; i++) {
            finite &= isfinite(got[i]);
            num += (got[i] - want[i]) * (double)(got[i] - want[i]);
            den += (double)want[i] * want[i];
        }
        const double rel = sqrt(num / (den > 0 ? den : 1));
        const char *name = ATTN_NAMES[kind];
        const double tol = f32 ? TOL_VISION_ATTN_EXACT : TOL_VISION_ATTN_BF16;
        printf("vision attention (%s) hd %3d, %d frame(s) of %5d, %2d heads: rel L2 %.2e\n", name, hd, frames, L,
               heads, rel);
        CHECKF(finite, "%s hd %d L %d: a non-finite output (a row the kernel missed)", name, hd, L);
        CHECKF(rel <= tol, "%s hd %d frames %d L %d: rel L2 %.3e over %.1e", name, hd, frames, L, rel, tol);
    }
    free(q), free(k), free(v), free(got), free(want);
}

/* ---- the tower ---- */

/* tol: the bound on max |CUDA - CPU| over max(1, max |CPU|) for the backend's precision. */
static void test_tower_grid(squad_backend *be, const squad_model *m, cpu_pool *pool, rng *r, int t, int h, int w,
                            double tol) {
    const squad_vision_config *v = &m->cfg.vision;
    const int N = t * h * w, K = v->in_channels * v->temporal_patch_size * v->patch_size * v->patch_size;
    const int rows = (int)squad_vision_tokens(v, t, h, w), D = v->out_hidden_size;
    float *px = malloc(sizeof(float) * (size_t)N * K), *got = malloc(sizeof(float) * (size_t)rows * D);
    float *want = malloc(sizeof(float) * (size_t)rows * D);
    if (!px || !got || !want) {
        CHECK(!"out of memory");
        free(px), free(got), free(want);
        return;
    }
    for (size_t i = 0; i < (size_t)N * K; i++) px[i] = (float)(2.0 * rng_unif(r) - 1.0); /* normalised pixels */
    for (size_t i = 0; i < (size_t)rows * D; i++) got[i] = NAN;
    squad_err e1 = {0}, e2 = {0};
    const int grid[3] = {t, h, w};
    const int rc = be->vision_forward(be, px, grid, got, &e1);
    CHECKF(rc == 0, "CUDA tower %dx%dx%d: %s", t, h, w, e1.msg);
    const int rc2 = cpu_vision_forward(pool, CPU_GEMM_EXACT, m, px, t, h, w, want, &e2);
    CHECKF(rc2 == 0, "CPU tower %dx%dx%d: %s", t, h, w, e2.msg);
    if (rc == 0 && rc2 == 0) {
        double worst = 0, mag = 0;
        int finite = 1;
        for (size_t i = 0; i < (size_t)rows * D; i++) {
            finite &= isfinite(got[i]);
            const double d = fabs((double)got[i] - want[i]);
            worst = d > worst ? d : worst;
            mag = fabs(want[i]) > mag ? fabs(want[i]) : mag;
        }
        const double bound = tol * (mag > 1 ? mag : 1);
        printf("vision tower %dx%dx%d (%d rows): max |CUDA - CPU| %.3e (outputs up to %.3f; bound %.3e)\n", t, h, w,
               rows, worst, mag, bound);
        CHECKF(finite, "%dx%dx%d: a non-finite output", t, h, w);
        CHECKF(worst <= bound, "%dx%dx%d: max diff %.3e over %.3e", t, h, w, worst, bound);
        CHECKF(mag > 0, "%dx%dx%d: the reference is all zero", t, h, w);
    }
    free(px), free(got), free(want);
}

static void test_tower(squad_model *m, rng *r, squad_precision prec) {
    const double tol = prec == SQUAD_PRECISION_EXACT ? TOL_VISION_EXACT : TOL_VISION_BF16;
    printf("vision tower, %s:\n", prec == SQUAD_PRECISION_EXACT ? "exact" : "bf16");
    squad_err err = {0};
    squad_engine_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.precision = prec;
    squad_backend *be = squad_cuda_backend_new(m, &opts, 4096, &err);
    CHECKF(be != NULL, "CUDA backend: %s", err.msg);
    cpu_pool *pool = cpu_pool_new(2, &err);
    CHECKF(pool != NULL, "pool: %s", err.msg);
    if (!be || !pool) {
        if (be) be->destroy(be);
        cpu_pool_free(pool);
        return;
    }
    CHECK(be->vision_forward != NULL);
    if (be->vision_forward) {
        /* 1 x 34 x 60: 2,040 patches, enough pieces that the upload's threads start */
        const int grids[][3] = {{1, 4, 4}, {1, 6, 8},   {1, 8, 6},   {2, 4, 6},
                                {1, 2, 2}, {1, 26, 30}, {1, 34, 60}, {1, 4, 4}};
        for (size_t i = 0; i < sizeof grids / sizeof grids[0]; i++)
            test_tower_grid(be, m, pool, r, grids[i][0], grids[i][1], grids[i][2], tol);
        /* a grid that is not a multiple of the merge size: refused, and the tower still runs */
        const int bad[3] = {1, 5, 4};
        float px[1] = {0}, out[1];
        memset(&err, 0, sizeof err);
        CHECK(be->vision_forward(be, px, bad, out, &err) == SQUAD_E_INVALID && err.msg[0]);
        test_tower_grid(be, m, pool, r, 1, 4, 6, tol);
    }
    cpu_pool_free(pool);
    be->destroy(be);
}

/* ---- image chunks ---- */

#define CHUNK_LEN 40
#define IMG_FROM 5 /* the image tokens: [IMG_FROM, IMG_FROM + IMG_LEN) of the chunk */
#define IMG_LEN 12
#define STAND_IN 7 /* the token whose embedding the image rows copy */

typedef struct chunk_run {
    float probs[SQUAD_MAX_SLOTS_PER_ROW][SQUAD_MAX_LETTERS];
    float *hidden; /* [CHUNK_LEN][H] */
} chunk_run;

static void fill_chunk(squad_chunk *ch, const int32_t *ids, const int32_t *letters, int seq) {
    memset(ch, 0, sizeof *ch);
    ch->seq = seq;
    ch->ids = ids;
    ch->start = 0;
    ch->len = CHUNK_LEN;
    ch->n_slots = 2;
    ch->slots[0] = CHUNK_LEN / 2;
    ch->slots[1] = CHUNK_LEN - 1;
    ch->nopts[0] = ch->nopts[1] = 4;
    ch->letters = letters;
    ch->n_letters = 4;
}

/* The batch from fresh slots; the first chunk's hidden rows into out->hidden (may be NULL). */
static int run_batch(squad_backend *be, squad_chunk *chunks, int n, chunk_run *out, int H) {
    squad_err err = {0};
    for (int c = 0; c < n; c++) {
        if (be->reset(be, chunks[c].seq, &err) != 0) {
            CHECKF(0, "reset: %s", err.msg);
            return -1;
        }
        chunks[c].probs = &out[c].probs[0][0];
    }
    if (be->forward(be, chunks, n, &err) != 0) {
        CHECKF(0, "forward: %s", err.msg);
        return -1;
    }
    for (int t = 0; out[0].hidden && t < CHUNK_LEN; t++)
        if (squad_cuda_backend_hidden(be, t, out[0].hidden + (size_t)t * H, &err) != 0) {
            CHECKF(0, "hidden: %s", err.msg);
            return -1;
        }
    return 0;
}

static int same_run(const chunk_run *a, const chunk_run *b, int H) {
    if (memcmp(a->probs, b->probs, sizeof a->probs)) return 0;
    return !a->hidden || !b->hidden || !memcmp(a->hidden, b->hidden, sizeof(float) * CHUNK_LEN * H);
}

/* positions (t, h, w) = (start + i) x 3 against positions NULL, and image rows equal to the stand-in
 * token's embedding against the stand-in token itself: the same bits. */
static void test_chunk_bits(squad_backend *be, const squad_model *m, const char *prec) {
    const int H = m->cfg.hidden_size, img = m->cfg.image_token_id;
    int32_t ids[CHUNK_LEN], ids_img[CHUNK_LEN], ids_ref[CHUNK_LEN], ids2[CHUNK_LEN], ids2_img[CHUNK_LEN];
    int32_t ids2_ref[CHUNK_LEN], pos[CHUNK_LEN * 3];
    const int32_t letters[4] = {10, 11, 12, 13};
    for (int i = 0; i < CHUNK_LEN; i++) {
        ids[i] = 20 + (i * 37) % 200;
        ids2[i] = 30 + (i * 53) % 190;
        const int in_img = i >= IMG_FROM && i < IMG_FROM + IMG_LEN;
        ids_img[i] = in_img ? img : ids[i];
        ids_ref[i] = in_img ? STAND_IN : ids[i];
        ids2_img[i] = in_img ? img : ids2[i];
        ids2_ref[i] = in_img ? STAND_IN + 1 : ids2[i];
        pos[3 * i] = pos[3 * i + 1] = pos[3 * i + 2] = i;
    }
    /* the image rows: each the stand-in's embedding in fp32 (chunk 2: the next token's) */
    float *emb = malloc(sizeof(float) * IMG_LEN * H), *emb2 = malloc(sizeof(float) * IMG_LEN * H);
    chunk_run *runs = calloc(8, sizeof *runs);
    int ok = emb && emb2 && runs;
    for (int i = 0; ok && i < 8; i++) ok = (runs[i].hidden = malloc(sizeof(float) * CHUNK_LEN * H)) != NULL;
    CHECK(ok);
    if (ok) {
        for (int r = 0; r < IMG_LEN; r++)
            for (int d = 0; d < H; d++) {
                emb[(size_t)r * H + d] = squad_bf16_to_f32(m->embed.w[(size_t)STAND_IN * H + d]);
                emb2[(size_t)r * H + d] = squad_bf16_to_f32(m->embed.w[(size_t)(STAND_IN + 1) * H + d]);
            }
        squad_chunk c[2];
        /* positions: NULL against three equal axes */
        fill_chunk(&c[0], ids, letters, 0);
        int rc = run_batch(be, c, 1, &runs[0], H);
        fill_chunk(&c[0], ids, letters, 0);
        c[0].positions = pos;
        rc |= run_batch(be, c, 1, &runs[1], H);
        CHECKF(rc == 0 && same_run(&runs[0], &runs[1], H), "%s: equal-axis positions changed the bits", prec);
        /* image rows against the stand-in token, with and without positions */
        fill_chunk(&c[0], ids_ref, letters, 0);
        rc = run_batch(be, c, 1, &runs[2], H);
        fill_chunk(&c[0], ids_img, letters, 0);
        c[0].embeds = emb;
        rc |= run_batch(be, c, 1, &runs[3], H);
        CHECKF(rc == 0 && same_run(&runs[2], &runs[3], H), "%s: image rows differ from the token they copy", prec);
        fill_chunk(&c[0], ids_img, letters, 0);
        c[0].embeds = emb;
        c[0].positions = pos;
        rc = run_batch(be, c, 1, &runs[4], H);
        CHECKF(rc == 0 && same_run(&runs[2], &runs[4], H), "%s: image rows with positions differ", prec);
        CHECKF(memcmp(runs[0].probs, runs[2].probs, sizeof runs[0].probs) != 0,
               "%s: the stand-in token changed nothing (the check would not see a wrong row)", prec);
        /* two image chunks in one batch: the second's rows come after the first's */
        chunk_run ref[2], got[2];
        memset(ref, 0, sizeof ref);
        memset(got, 0, sizeof got);
        ref[0].hidden = runs[5].hidden;
        got[0].hidden = runs[6].hidden;
        fill_chunk(&c[0], ids_ref, letters, 0);
        fill_chunk(&c[1], ids2_ref, letters, 1);
        rc = run_batch(be, c, 2, ref, H);
        fill_chunk(&c[0], ids_img, letters, 0);
        c[0].embeds = emb;
        fill_chunk(&c[1], ids2_img, letters, 1);
        c[1].embeds = emb2;
        rc |= run_batch(be, c, 2, got, H);
        CHECKF(rc == 0 && same_run(&ref[0], &got[0], H) && same_run(&ref[1], &got[1], H),
               "%s: a batch of two image chunks differs from the stand-ins' batch", prec);
        CHECKF(memcmp(ref[0].probs, ref[1].probs, sizeof ref[0].probs) != 0, "%s: the two chunks agree", prec);
    }
    for (int i = 0; runs && i < 8; i++) free(runs[i].hidden);
    free(runs), free(emb), free(emb2);
}

/* The M-RoPE axis of rotary frequency j (interleaved: transformers' rule; else sections in order). */
static int mrope_axis(const squad_config *c, int j) {
    const int *s = c->mrope_section;
    if (c->mrope_interleaved) return j % 3 == 1 && j < 3 * s[1] ? 1 : j % 3 == 2 && j < 3 * s[2] ? 2 : 0;
    return j < s[0] ? 0 : j < s[0] + s[1] ? 1 : 2;
}

/* Distinct (t, h, w) positions on the exact path: K of the attention layers as M-RoPE turns it. */
static void test_mrope_k(squad_backend *be, const squad_model *m) {
    const squad_config *c = &m->cfg;
    const int hd = c->head_dim, half = c->rotary_dim / 2, nkv = c->num_kv_heads;
    const int n_attn = squad_config_count_layers(c, SQUAD_LAYER_FULL);
    int32_t ids[CHUNK_LEN], pos[CHUNK_LEN * 3];
    const int32_t letters[4] = {10, 11, 12, 13};
    for (int i = 0; i < CHUNK_LEN; i++) {
        ids[i] = 20 + (i * 37) % 200;
        /* an image-like block: t fixed from token 4, h and w over a 6-wide grid, text after it */
        pos[3 * i] = i < 4 ? i : i < 28 ? 4 : i - 18;
        pos[3 * i + 1] = i < 4 ? i : i < 28 ? 4 + (i - 4) / 6 : i - 18;
        pos[3 * i + 2] = i < 4 ? i : i < 28 ? 4 + (i - 4) % 6 : i - 18;
    }
    const size_t bytes = (size_t)CHUNK_LEN * be->kv_bytes_per_pos, n_el = bytes / sizeof(float);
    squad_err err = {0};
    void *blob = be->alloc(be, bytes, &err);
    float *plain = malloc(bytes), *turned = malloc(bytes);
    CHECKF(blob && plain && turned, "buffers: %s", err.msg);
    CHECK(be->kv_bytes_per_pos == (size_t)n_attn * 2 * nkv * hd * sizeof(float));
    if (blob && plain && turned) {
        squad_chunk ch;
        chunk_run run;
        memset(&run, 0, sizeof run);
        fill_chunk(&ch, ids, letters, 0);
        int rc = run_batch(be, &ch, 1, &run, c->hidden_size);
        rc |= be->save_kv(be, 0, blob, CHUNK_LEN, &err);
        rc |= squad_cuda_test_download(plain, blob, bytes, &err);
        fill_chunk(&ch, ids, letters, 0);
        ch.positions = pos;
        rc |= run_batch(be, &ch, 1, &run, c->hidden_size);
        rc |= be->save_kv(be, 0, blob, CHUNK_LEN, &err);
        rc |= squad_cuda_test_download(turned, blob, bytes, &err);
        CHECKF(rc == 0, "runs: %s", err.msg);
        if (rc == 0) {
            double worst = 0, moved = 0;
            int unchanged = 1;
            float inv[512];
            for (int j = 0; j < half; j++)
                inv[j] = 1.0f / powf((float)c->rope_theta, (float)(2 * j) / (float)c->rotary_dim);
            for (int i = 0; i < CHUNK_LEN; i++)
                for (int l = 0; l < n_attn; l++)
                    for (int kv = 0; kv < 2; kv++)
                        for (int g = 0; g < nkv; g++) {
                            const size_t o = ((((size_t)i * n_attn + l) * 2 + kv) * nkv + g) * hd;
                            const float *a = plain + o, *b = turned + o;
                            for (int d = kv ? 0 : c->rotary_dim; d < hd; d++) unchanged &= a[d] == b[d];
                            if (kv) continue;
                            for (int j = 0; j < half; j++) {
                                double s0, c0, s1, c1;
                                const float a0 = (float)i * inv[j], a1 = (float)pos[3 * i + mrope_axis(c, j)] * inv[j];
                                s0 = sin((double)a0), c0 = cos((double)a0), s1 = sin((double)a1), c1 = cos((double)a1);
                                /* un-turn the plain K, turn it by the M-RoPE angle */
                                const double x0 = a[j] * c0 + a[j + half] * s0, x1 = a[j + half] * c0 - a[j] * s0;
                                const double w0 = x0 * c1 - x1 * s1, w1 = x1 * c1 + x0 * s1;
                                const double scale = 1 + fabs(x0) + fabs(x1);
                                const double d0 = fabs(w0 - b[j]) / scale, d1 = fabs(w1 - b[j + half]) / scale;
                                worst = d0 > worst ? d0 : worst;
                                worst = d1 > worst ? d1 : worst;
                                const double mv = fabs((double)a[j] - b[j]);
                                moved = mv > moved ? mv : moved;
                            }
                        }
            printf("M-RoPE K (exact): max deviation %.2e, largest move from plain RoPE %.3f\n", worst, moved);
            CHECKF(worst <= TOL_VISION_MROPE_K, "M-RoPE K: %.3e", worst);
            CHECKF(moved > 1e-3, "positions moved no K (%.3e)", moved);
            CHECK(unchanged);
            (void)n_el;
        }
    }
    if (blob) be->release(be, blob);
    free(plain), free(turned);
}

static void test_chunks(squad_model *m) {
    for (int p = 0; p < 2; p++) {
        const char *name = p ? "bf16" : "exact";
        squad_err err = {0};
        squad_engine_opts opts;
        memset(&opts, 0, sizeof opts);
        opts.precision = p ? SQUAD_PRECISION_BF16 : SQUAD_PRECISION_EXACT;
        opts.max_rows = 4;
        squad_backend *be = squad_cuda_backend_new(m, &opts, 4096, &err);
        CHECKF(be != NULL, "CUDA backend (%s): %s", name, err.msg);
        if (!be) continue;
        test_chunk_bits(be, m, name);
        if (!p) test_mrope_k(be, m);
        printf("image chunks (%s): checked\n", name);
        be->destroy(be);
    }
}

int main(void) {
    if (squad_cuda_device_count() <= 0) {
        printf("gpu_test_vision: no CUDA device, skipped\n");
        return TEST_SKIPPED;
    }
    rng r = {0x5eed5eed12345ull};
    /* hd, frames, L, heads */
    const int ac[][4] = {{16, 3, 5, 2},   {16, 1, 200, 2}, {32, 2, 130, 3}, {64, 1, 64, 1},
                         {64, 2, 1000, 2}, {128, 1, 300, 2}, {64, 1, 4, 12}};
    const int kinds[] = {ATTN_MMA, ATTN_F32}; /* the kernels built for every head dim */
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        for (size_t i = 0; i < sizeof ac / sizeof ac[0]; i++)
            test_attn(&r, kinds[k], ac[i][0], ac[i][1], ac[i][2], ac[i][3]);
        if (!quick()) test_attn(&r, kinds[k], 64, 1, 8160, 1); /* a 1920x1080 screenshot's frame */
    }
    /* the wgmma kernel (head dim 64): a frame shorter than a tile, lengths on and off its 128-query
     * and 64-key tiles, several frames and heads, and the screenshot's frame */
    const int wc[][3] = {{1, 4, 12}, {1, 64, 1}, {1, 128, 2}, {3, 130, 2}, {2, 1000, 2}, {1, 200, 3}};
    for (size_t i = 0; i < sizeof wc / sizeof wc[0]; i++)
        test_attn(&r, ATTN_WGMMA, 64, wc[i][0], wc[i][1], wc[i][2]);
    if (!quick()) test_attn(&r, ATTN_WGMMA, 64, 1, 8160, 1);

    squad_model *m = test_synth_model("tiny-vl", 0);
    CHECK(m != NULL && m->cfg.has_vision && m->vision);
    if (m && m->vision) {
        test_tower(m, &r, SQUAD_PRECISION_BF16);
        test_tower(m, &r, SQUAD_PRECISION_EXACT);
        test_chunks(m);
    }
    if (m) squad_model_free(m);
    return test_summary("gpu_test_vision");
}
#else
int main(void) {
    printf("gpu_test_vision: built without CUDA, skipped\n");
    return TEST_SKIPPED;
}
#endif
