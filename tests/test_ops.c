/*
 * test_ops.c — the CPU ops against direct transcriptions of docs/design.md section 4: the chunked delta
 * rule against the per-token recurrence (from a nonzero state, several chunk sizes), the conv with
 * saved inputs across any split, RoPE, attention against a double-precision softmax, the norms.
 */
#define _DEFAULT_SOURCE /* setenv */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/ops.h"
#include "testutil.h"
#include "tolerances.h"

static unsigned long long rng_state = 12345;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}
static void fill(float *x, long n, float scale) {
    for (long i = 0; i < n; i++) x[i] = frand() * scale;
}
static double max_abs_diff(const float *a, const float *b, long n) {
    double m = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

static void test_delta_rule(int nk, int nv, int dk, int dv, int T, int chunk) {
    int C = 2 * nk * dk + nv * dv;
    float *qkv = malloc(sizeof(float) * T * C), *g = malloc(sizeof(float) * T * nv), *beta = malloc(sizeof(float) * T * nv);
    float *S1 = malloc(sizeof(float) * nv * dk * dv), *S2 = malloc(sizeof(float) * nv * dk * dv);
    float *o1 = malloc(sizeof(float) * T * nv * dv), *o2 = malloc(sizeof(float) * T * nv * dv);
    fill(qkv, (long)T * C, 1.0f);
    op_qk_l2norm(qkv, T, C, nk, dk);
    for (int i = 0; i < T * nv; i++) {
        g[i] = -fabsf(frand()) * 0.5f;
        beta[i] = 0.5f + 0.5f * frand();
    }
    g[0] = 0.0f; /* a padding-like token: no decay */
    fill(S1, (long)nv * dk * dv, 0.3f);
    memcpy(S2, S1, sizeof(float) * nv * dk * dv);
    op_delta_rule(o1, S1, qkv, g, beta, T, C, nk, nv, dk, dv, 0, nv);
    op_delta_rule_chunked(o2, S2, qkv, g, beta, T, C, nk, nv, dk, dv, 0, nv, chunk);
    double eo = max_abs_diff(o1, o2, (long)T * nv * dv), es = max_abs_diff(S1, S2, (long)nv * dk * dv);
    CHECKF(eo < TOL_OPS_DELTA_RULE && es < TOL_OPS_DELTA_RULE, "delta rule nk=%d nv=%d T=%d chunk=%d: out %g state %g", nk, nv, T, chunk, eo, es);
    /* splitting the tokens in two calls continues from the state */
    free(qkv), free(g), free(beta), free(S1), free(S2), free(o1), free(o2);
}

static void test_delta_split(void) {
    int nk = 2, nv = 4, dk = 16, dv = 8, T = 150, C = 2 * nk * dk + nv * dv;
    float *qkv = malloc(sizeof(float) * T * C), *g = malloc(sizeof(float) * T * nv), *beta = malloc(sizeof(float) * T * nv);
    float *S1 = calloc(nv * dk * dv, sizeof(float)), *S2 = calloc(nv * dk * dv, sizeof(float));
    float *o1 = malloc(sizeof(float) * T * nv * dv), *o2 = malloc(sizeof(float) * T * nv * dv);
    fill(qkv, (long)T * C, 1.0f);
    op_qk_l2norm(qkv, T, C, nk, dk);
    for (int i = 0; i < T * nv; i++) g[i] = -fabsf(frand()), beta[i] = fabsf(frand());
    op_delta_rule(o1, S1, qkv, g, beta, T, C, nk, nv, dk, dv, 0, nv);
    int cuts[] = {0, 1, 8, 71, 72, 150};
    for (int c = 0; c + 1 < 6; c++) {
        int a = cuts[c], b = cuts[c + 1];
        op_delta_rule_chunked(o2 + (long)a * nv * dv, S2, qkv + (long)a * C, g + (long)a * nv, beta + (long)a * nv,
                              b - a, C, nk, nv, dk, dv, 0, nv, 64);
    }
    CHECK(max_abs_diff(o1, o2, (long)T * nv * dv) < TOL_OPS_DELTA_RULE);
    CHECK(max_abs_diff(S1, S2, (long)nv * dk * dv) < TOL_OPS_DELTA_RULE);
    free(qkv), free(g), free(beta), free(S1), free(S2), free(o1), free(o2);
}

/* Every level this CPU has against the portable per-token rule, and per level bit for bit the same
 * result whichever way the tokens are split into calls (the CPU backend's promise). */
static void test_delta_levels(int nk, int nv, int dk, int dv, int T) {
    int C = 2 * nk * dk + nv * dv;
    long ns = (long)nv * dk * dv, no = (long)T * nv * dv;
    float *qkv = malloc(sizeof(float) * T * C), *g = malloc(sizeof(float) * T * nv), *beta = malloc(sizeof(float) * T * nv);
    float *S0 = malloc(sizeof(float) * ns), *Sr = malloc(sizeof(float) * ns), *S1 = malloc(sizeof(float) * ns),
          *S2 = malloc(sizeof(float) * ns);
    float *or_ = malloc(sizeof(float) * no), *o1 = malloc(sizeof(float) * no), *o2 = malloc(sizeof(float) * no);
    fill(qkv, (long)T * C, 1.0f);
    op_qk_l2norm(qkv, T, C, nk, dk);
    for (int i = 0; i < T * nv; i++) g[i] = -fabsf(frand()) * 0.5f, beta[i] = fabsf(frand());
    fill(S0, ns, 0.3f);
    memcpy(Sr, S0, sizeof(float) * ns);
    op_delta_rule_isa(CPU_ISA_SCALAR, or_, Sr, qkv, g, beta, T, C, nk, nv, dk, dv, 0, nv);
    const int cuts[] = {0, 1, 2, T / 2, T - 1, T};
    for (int isa = 0; isa <= (int)cpu_detect_isa(); isa++) {
        memcpy(S1, S0, sizeof(float) * ns);
        memcpy(S2, S0, sizeof(float) * ns);
        /* heads split as the backend's tasks split them */
        op_delta_rule_isa((cpu_isa)isa, o1, S1, qkv, g, beta, T, C, nk, nv, dk, dv, 0, nv / 2);
        op_delta_rule_isa((cpu_isa)isa, o1, S1, qkv, g, beta, T, C, nk, nv, dk, dv, nv / 2, nv);
        for (int c = 0; c + 1 < 6; c++) {
            int a = cuts[c], b = cuts[c + 1];
            if (b <= a) continue;
            op_delta_rule_isa((cpu_isa)isa, o2 + (long)a * nv * dv, S2, qkv + (long)a * C, g + (long)a * nv,
                              beta + (long)a * nv, b - a, C, nk, nv, dk, dv, 0, nv);
        }
        double eo = max_abs_diff(o1, or_, no), es = max_abs_diff(S1, Sr, ns);
        CHECKF(eo < TOL_OPS_EXACT && es < TOL_OPS_EXACT, "delta rule %s dk=%d dv=%d T=%d vs portable: out %g state %g",
               cpu_isa_name((cpu_isa)isa), dk, dv, T, eo, es);
        CHECKF(memcmp(o1, o2, sizeof(float) * no) == 0 && memcmp(S1, S2, sizeof(float) * ns) == 0,
               "delta rule %s dk=%d dv=%d T=%d: a split row differs", cpu_isa_name((cpu_isa)isa), dk, dv, T);
    }
    free(qkv), free(g), free(beta), free(S0), free(Sr), free(S1), free(S2), free(or_), free(o1), free(o2);
}

static void test_conv_split(void) {
    int T = 37, C = 10, K = 4;
    float *x = malloc(sizeof(float) * T * C), *w = malloc(sizeof(float) * C * K);
    float *y1 = malloc(sizeof(float) * T * C), *y2 = malloc(sizeof(float) * T * C);
    float st1[3 * 10] = {0}, st2[3 * 10] = {0};
    fill(x, T * C, 1.0f);
    fill(w, C * K, 1.0f);
    float wkc[10 * 4];
    op_conv_weights_kc(wkc, w, C, K);
    op_conv_silu(y1, x, st1, wkc, T, C, K);
    /* direct formula with zero history */
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                int src = t + k - (K - 1);
                if (src >= 0) s += (double)w[c * K + k] * x[src * C + c];
            }
            double ref = s / (1 + exp(-s));
            worst = fmax(worst, fabs(ref - y1[t * C + c]));
        }
    CHECKF(worst < TOL_OPS_EXACT, "conv vs formula %g", worst);
    int cuts[] = {0, 1, 2, 3, 10, 37};
    for (int c = 0; c + 1 < 6; c++)
        op_conv_silu(y2 + cuts[c] * C, x + cuts[c] * C, st2, wkc, cuts[c + 1] - cuts[c], C, K);
    CHECK(max_abs_diff(y1, y2, T * C) == 0.0);
    CHECK(max_abs_diff(st1, st2, 3 * C) == 0.0);
    free(x), free(w), free(y1), free(y2);
}

static void test_rope(void) {
    int hd = 32, rd = 8, T = 5, pos0 = 1000;
    float inv[4];
    op_rope_inv_freq(inv, 1e7, rd);
    float x[5 * 32], ref[5 * 32];
    fill(x, T * hd, 1.0f);
    memcpy(ref, x, sizeof x);
    op_rope(x, inv, T, pos0, 1, hd, hd, rd);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hd; i++) {
            double want;
            const float *r = ref + t * hd;
            if (i >= rd) want = r[i];
            else {
                int j = i % (rd / 2);
                double ang = (double)(pos0 + t) * pow(1e7, -2.0 * j / rd);
                want = i < rd / 2 ? r[i] * cos(ang) - r[i + rd / 2] * sin(ang) : r[i] * cos(ang) + r[i - rd / 2] * sin(ang);
            }
            CHECK_NEAR(x[t * hd + i], want, TOL_OPS_ROPE); /* fp32 angles at position ~1000, as the reference computes them */
        }
}

static void test_attention(int nh, int nkv, int hd, int pos0, int T, float qscale) {
    int P = pos0 + T;
    int qs = nh * 2 * hd;
    float *q = malloc(sizeof(float) * T * qs), *K = malloc(sizeof(float) * P * nkv * hd), *V = malloc(sizeof(float) * P * nkv * hd);
    float *out = malloc(sizeof(float) * T * nh * hd);
    fill(q, T * qs, qscale), fill(K, P * nkv * hd, 1.0f), fill(V, P * nkv * hd, 1.0f);
    op_attention(out, q, qs, 2 * hd, K, V, T, pos0, nh, nkv, hd, 0, nh);
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < nh; j++) {
            int kvh = j / (nh / nkv), n = pos0 + t + 1;
            double *sc = malloc(sizeof(double) * P), mx = -1e30, sum = 0;
            for (int p = 0; p < n; p++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)q[t * qs + j * 2 * hd + i] * K[(p * nkv + kvh) * hd + i];
                sc[p] = d / sqrt(hd);
                mx = fmax(mx, sc[p]);
            }
            for (int p = 0; p < n; p++) sum += (sc[p] = exp(sc[p] - mx));
            for (int i = 0; i < hd; i++) {
                double acc = 0;
                for (int p = 0; p < n; p++) acc += sc[p] / sum * V[(p * nkv + kvh) * hd + i];
                worst = fmax(worst, fabs(acc - out[(t * nh + j) * hd + i]));
            }
            free(sc);
        }
    CHECKF(worst < TOL_OPS_EXACT, "attention vs double %g", worst);
    /* the flash-style group form, over token blocks, equals the plain one at every level this CPU
     * has (AVX2: the register-blocked kernels), and a query's result does not depend on how its
     * row was split: bit for bit */
    float *out2 = malloc(sizeof(float) * T * nh * hd), *out3 = malloc(sizeof(float) * T * nh * hd);
    float *scratch = malloc(sizeof(float) * op_attention_scratch_floats(nh, nkv, hd, T));
    for (int isa = 0; isa <= (int)cpu_detect_isa(); isa++) {
        for (int kvh = 0; kvh < nkv; kvh++) {
            int cut = T / 3;
            op_attention_group_isa((cpu_isa)isa, out2, q, qs, 2 * hd, K, V, pos0, nh, nkv, hd, kvh, 0, cut, scratch);
            op_attention_group_isa((cpu_isa)isa, out2, q, qs, 2 * hd, K, V, pos0, nh, nkv, hd, kvh, cut, T, scratch);
            op_attention_group_isa((cpu_isa)isa, out3, q, qs, 2 * hd, K, V, pos0, nh, nkv, hd, kvh, 0, T, scratch);
        }
        CHECKF(max_abs_diff(out, out2, (long)T * nh * hd) < TOL_OPS_EXACT, "attention group (%s) vs plain %g",
               cpu_isa_name((cpu_isa)isa), max_abs_diff(out, out2, (long)T * nh * hd));
        CHECKF(memcmp(out2, out3, sizeof(float) * T * nh * hd) == 0, "attention group (%s): split row differs",
               cpu_isa_name((cpu_isa)isa));
    }
    free(out3);
    free(out2), free(scratch);
    free(q), free(K), free(V), free(out);
}

static void test_norms(void) {
    float x[2 * 8], w[8], y[2 * 8];
    fill(x, 16, 3.0f), fill(w, 8, 0.5f);
    op_rmsnorm_zc(y, x, w, 2, 8, 1e-6f);
    for (int t = 0; t < 2; t++) {
        double ss = 0;
        for (int i = 0; i < 8; i++) ss += (double)x[t * 8 + i] * x[t * 8 + i];
        for (int i = 0; i < 8; i++) CHECK_NEAR(y[t * 8 + i], x[t * 8 + i] / sqrt(ss / 8 + 1e-6) * (1 + w[i]), TOL_OPS_EXACT);
    }
    float o[8], z[8], o0[8];
    fill(o, 8, 2.0f), fill(z, 8, 2.0f), fill(w, 8, 1.0f);
    memcpy(o0, o, sizeof o);
    op_gated_rmsnorm(o, z, w, 1, 2, 4, 1e-6f);
    for (int h = 0; h < 2; h++) {
        double ss = 0;
        for (int i = 0; i < 4; i++) ss += (double)o0[h * 4 + i] * o0[h * 4 + i];
        for (int i = 0; i < 4; i++) {
            double zz = z[h * 4 + i];
            CHECK_NEAR(o[h * 4 + i], o0[h * 4 + i] / sqrt(ss / 4 + 1e-6) * w[h * 4 % 4 + i] * (zz / (1 + exp(-zz))), TOL_OPS_EXACT);
        }
    }
    float a[3] = {1.0f, -2.0f, 0.5f}, b = 0, gg, bb;
    float Alog = 0.3f, dtb = 0.1f;
    op_gdn_gates(&gg, &bb, &a[0], &a[1], &Alog, &dtb, 1, 1);
    CHECK_NEAR(gg, -exp(0.3) * log1p(exp(1.1)), TOL_OPS_GATES);
    CHECK_NEAR(bb, 1 / (1 + exp(2.0)), TOL_OPS_GATES);
    (void)b;
}

/* The SiLU / sigmoid ops at every level this CPU has (forced through SQUAD_CPU_ISA, as a user
 * would) against the formula in double, over a range that takes e^x to underflow and overflow. */
static void test_elementwise_levels(void) {
    enum { N = 1003 }; /* not a multiple of 8: the vector loops' tails too */
    static float a[N], b[N], a0[N], z[N], w[N], o[N], o0[N];
    for (int i = 0; i < N; i++) {
        a0[i] = (i % 7 == 0) ? frand() * 100.0f : frand() * 8.0f;
        b[i] = frand();
        z[i] = (i % 5 == 0) ? frand() * 120.0f : frand() * 6.0f;
        w[i] = frand();
        o0[i] = frand() * 2.0f;
    }
    for (int isa = 0; isa <= (int)cpu_detect_isa(); isa++) {
        setenv(CPU_ISA_ENV, cpu_isa_name((cpu_isa)isa), 1);
        const char *lv = cpu_isa_name((cpu_isa)isa);
        double worst = 0;
        memcpy(a, a0, sizeof a);
        op_silu_mul(a, b, N);
        for (int i = 0; i < N; i++) {
            double x = a0[i], want = x / (1.0 + exp(-x)) * b[i];
            worst = fmax(worst, fabs(a[i] - want) / (fabs(want) + 1e-30));
        }
        CHECKF(worst < 2e-6, "silu_mul %s: relative error %g", lv, worst);
        memcpy(o, o0, sizeof o);
        op_sigmoid_gate(o, z, 1, 1, N, N, N);
        worst = 0;
        for (int i = 0; i < N; i++) {
            double want = o0[i] / (1.0 + exp(-(double)z[i]));
            worst = fmax(worst, fabs(o[i] - want) / (fabs(want) + 1e-30));
        }
        CHECKF(worst < 2e-6, "sigmoid_gate %s: relative error %g", lv, worst);
        /* gated rmsnorm: 7 heads of 136 (a vector body and no tail) and one of 51 */
        memcpy(o, o0, sizeof o);
        op_gated_rmsnorm(o, z, w, 1, 7, 136, 1e-6f);
        worst = 0;
        for (int h = 0; h < 7; h++) {
            double ss = 0;
            for (int i = 0; i < 136; i++) ss += (double)o0[h * 136 + i] * o0[h * 136 + i];
            for (int i = 0; i < 136; i++) {
                double zz = z[h * 136 + i];
                double want = o0[h * 136 + i] / sqrt(ss / 136 + 1e-6) * w[i] * (zz / (1 + exp(-zz)));
                worst = fmax(worst, fabs(o[h * 136 + i] - want) / (fabs(want) + 1e-30));
            }
        }
        CHECKF(worst < 4e-6, "gated_rmsnorm %s: relative error %g", lv, worst);
    }
    unsetenv(CPU_ISA_ENV);
}

int main(void) {
    test_delta_rule(2, 4, 16, 8, 130, 64);
    test_delta_rule(2, 2, 32, 24, 64, 64);
    test_delta_rule(1, 3, 8, 8, 65, 16);
    test_delta_rule(4, 4, 16, 16, 3, 64);
    test_delta_rule(2, 2, 128, 128, 70, 64); /* the 0.8B head sizes */
    test_delta_split();
    test_delta_levels(2, 4, 16, 32, 37);
    test_delta_levels(2, 2, 24, 8, 9); /* dv not a multiple of the AVX2 block: the portable loops */
    test_delta_levels(2, 4, 128, 128, 20); /* the 0.8B head sizes */
    test_conv_split();
    test_rope();
    test_attention(4, 2, 16, 7, 5, 2.0f);
    test_attention(4, 1, 32, 150, 40, 2.0f);
    test_attention(2, 2, 64, 0, 130, 2.0f);
    test_attention(8, 2, 256, 40, 56, 2.0f); /* the 0.8B head sizes */
    test_attention(8, 2, 256, 190, 21, 2.0f); /* a partial key tile past a full one */
    test_attention(2, 1, 48, 3, 70, 60.0f); /* peaked softmax: most weights underflow to 0 */
    test_norms();
    test_elementwise_levels();
    return test_summary("test_ops");
}
