/* cpu_lora_apply (src/cpu/lora.c), the CPU backend's blocked LoRA low-rank term, against the plain
 * reference squad_lora_apply_ref: odd ranks and odd widths (tails of every vector step and tile),
 * block sizes that are not multiples of the token group, both ISAs, each token's result the same
 * bits alone as in any block, and unadapted projections left alone. */
#include <stdlib.h>
#include <string.h>

#include "cpu/lora.h"
#include "cpu/pool.h"
#include "specialists.h"
#include "testutil.h"

/* A deterministic value in [-1, 1). */
static float rnd(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

static float *rnd_vec(size_t n, unsigned *s) {
    float *v = malloc(n * sizeof(float));
    if (v)
        for (size_t i = 0; i < n; i++) v[i] = rnd(s);
    return v;
}

/* One shape: n tokens through the reference (one at a time) and through cpu_lora_apply at isa
 * (all at once, then each alone). */
static void check_shape(cpu_isa isa, int r, int in, int out, int n, unsigned seed) {
    unsigned s = seed;
    float *A = rnd_vec((size_t)r * in, &s), *B = rnd_vec((size_t)out * r, &s), *x = rnd_vec((size_t)n * in, &s);
    float *y0 = rnd_vec((size_t)n * out, &s);
    float *ref = malloc((size_t)n * out * sizeof(float)), *blk = malloc((size_t)n * out * sizeof(float));
    float *one = malloc((size_t)n * out * sizeof(float));
    CHECK(A && B && x && y0 && ref && blk && one);
    if (!(A && B && x && y0 && ref && blk && one)) goto done;
    squad_lora_proj p = {.r = r, .in = in, .out = out, .A = A, .B = B};
    const float scale = 0.75f;
    memcpy(ref, y0, (size_t)n * out * sizeof(float));
    memcpy(blk, y0, (size_t)n * out * sizeof(float));
    memcpy(one, y0, (size_t)n * out * sizeof(float));
    for (int t = 0; t < n; t++) squad_lora_apply_ref(&p, scale, x + (size_t)t * in, ref + (size_t)t * out);
    cpu_lora_apply(isa, &p, scale, x, blk, n);
    for (int t = 0; t < n; t++) cpu_lora_apply(isa, &p, scale, x + (size_t)t * in, one + (size_t)t * out, 1);
    /* the reference's double sums in another order: float rounding of y apart, equal */
    double worst = 0;
    int same = 1, changed = 0;
    for (size_t i = 0; i < (size_t)n * out; i++) {
        const double d = fabs((double)blk[i] - ref[i]), tol = 1e-6 * (1 + fabs((double)ref[i]));
        if (d / tol > worst) worst = d / tol;
        if (memcmp(&blk[i], &one[i], sizeof(float))) same = 0;
        if (blk[i] != y0[i]) changed = 1;
    }
    CHECKF(worst <= 1, "isa %d r %d in %d out %d n %d: %.3g of the tolerance", (int)isa, r, in, out, n, worst);
    CHECKF(same, "isa %d r %d in %d out %d n %d: a token's result depends on its block", (int)isa, r, in, out, n);
    CHECKF(changed, "isa %d r %d in %d out %d n %d: y untouched", (int)isa, r, in, out, n);
done:
    free(A), free(B), free(x), free(y0), free(ref), free(blk), free(one);
}

/* The plain C loops and the AVX2 kernels give the same u bit for bit; their down products differ
 * in the fused multiply-add only, so the two agree far inside the reference tolerance. */
static void check_isas_agree(void) {
    if (cpu_detect_isa() < CPU_ISA_AVX2) return;
    unsigned s = 7;
    const int r = 5, in = 37, out = 19, n = 6;
    float *A = rnd_vec((size_t)r * in, &s), *B = rnd_vec((size_t)out * r, &s), *x = rnd_vec((size_t)n * in, &s);
    float *ya = calloc((size_t)n * out, sizeof(float)), *yc = calloc((size_t)n * out, sizeof(float));
    CHECK(A && B && x && ya && yc);
    if (A && B && x && ya && yc) {
        squad_lora_proj p = {.r = r, .in = in, .out = out, .A = A, .B = B};
        cpu_lora_apply(CPU_ISA_AVX2, &p, 1.0f, x, ya, n);
        cpu_lora_apply(CPU_ISA_SCALAR, &p, 1.0f, x, yc, n);
        for (int i = 0; i < n * out; i++) CHECK_NEAR(ya[i], yc[i], 1e-6 * (1 + fabs(yc[i])));
    }
    free(A), free(B), free(x), free(ya), free(yc);
}

static void check_unadapted(void) {
    float x[4] = {1, 2, 3, 4}, y[2] = {0.5f, -0.5f};
    squad_lora_proj none = {0};
    cpu_lora_apply(CPU_ISA_AVX2, &none, 1.0f, x, y, 1);
    cpu_lora_apply(CPU_ISA_SCALAR, &none, 1.0f, x, y, 1);
    CHECK(y[0] == 0.5f && y[1] == -0.5f);
}

int main(void) {
    static const int ranks[] = {1, 2, 3, 5, 16, 17};
    static const int ins[] = {1, 3, 4, 7, 33, 1027};
    static const int outs[] = {1, 7, 8, 9, 33};
    static const int ns[] = {1, 3, 4, 5, 16, 21};
    cpu_isa isas[2] = {CPU_ISA_SCALAR, cpu_detect_isa() >= CPU_ISA_AVX2 ? CPU_ISA_AVX2 : CPU_ISA_SCALAR};
    unsigned seed = 1;
    for (int ii = 0; ii < 2; ii++)
        for (size_t a = 0; a < sizeof ranks / sizeof *ranks; a++)
            for (size_t b = 0; b < sizeof ins / sizeof *ins; b++)
                for (size_t c = 0; c < sizeof outs / sizeof *outs; c++)
                    for (size_t d = 0; d < sizeof ns / sizeof *ns; d++)
                        check_shape(isas[ii], ranks[a], ins[b], outs[c], ns[d], seed++);
    /* large ranks, up to the largest the loader takes (u on the stack at its bound) */
    for (int ii = 0; ii < 2; ii++) {
        check_shape(isas[ii], 300, 9, 11, 6, seed++);
        check_shape(isas[ii], SQUAD_LORA_MAX_RANK, 5, 3, 5, seed++);
    }
    check_isas_agree();
    check_unadapted();
    return test_summary("test_cpu_lora");
}
