/*
 * ops.c — the CPU backend's operations (see ops.h): fp32 arithmetic, written close to the math of
 * docs/design.md section 4 so each can be checked by reading. Inner loops run over a contiguous
 * dimension (features, dv) so -O2 vectorises them; the costly ones (the delta rule, attention)
 * take a head range so the backend can split heads across threads.
 */
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../util.h"

/* The L2 normalisation epsilon of q and k in the GDN layer (fixed by the architecture). */
#define GDN_L2NORM_EPS 1e-6f
/* Longest chunk op_delta_rule_chunked handles in its stack buffers. */
#define DELTA_MAX_CHUNK 64
/* softplus(x) = x above this (torch's default threshold). */
#define SOFTPLUS_THRESHOLD 20.0f

/* The hot loops are compiled for AVX-512, AVX2 and plain x86-64 and picked at load time (GCC's
 * target_clones), so the library runs on any x86-64 yet uses the wide units where they exist. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define OPS_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OPS_HOT
#endif

/* Hand-written AVX2 kernels (attention, the delta rule) are taken only at exactly the AVX2 level:
 * an AVX-512 CPU keeps the target_clones code above, and SQUAD_CPU_ISA=scalar the plain loops. */
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define OPS_X86 1
#define OPS_AVX2 __attribute__((target("avx2,fma")))
#else
#define OPS_X86 0
#endif

/* The level the hand-written kernels dispatch on: the CPU's, lowered by SQUAD_CPU_ISA as the pool's
 * is (an unknown name there already failed the pool's creation: here it leaves the CPU's level). */
static cpu_isa ops_isa(void) {
    cpu_isa isa;
    squad_err err;
    cpu_effective_isa(&isa, &err);
    return isa;
}

#if OPS_X86
/* e^x for 8 lanes: x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts), e^r by a degree-6 polynomial
 * (Cephes' expf coefficients, about 1 ulp), times 2^n built in the exponent bits. x below
 * EXP_UNDERFLOW gives exactly 0 (so a masked score of -inf contributes nothing), above
 * EXP_OVERFLOW +inf. */
#define EXP_UNDERFLOW (-87.33654f)
#define EXP_OVERFLOW 88.72283f
OPS_AVX2 static inline __m256 exp256(__m256 x) {
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 ln2_hi = _mm256_set1_ps(0.693359375f), ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_UNDERFLOW), _CMP_LT_OQ);
    __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_OVERFLOW), _CMP_GT_OQ);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_UNDERFLOW)), _mm256_set1_ps(EXP_OVERFLOW));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, ln2_hi, xc);
    r = _mm256_fnmadd_ps(n, ln2_lo, r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n for n in [-126, 128]: n = 128 only at the clamp, where p * 2^127 * 2 is done in two steps */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i half = _mm256_srai_epi32(ni, 1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
    return _mm256_andnot_ps(under, y);
}

/* silu(x) = x / (1 + e^-x) and sigmoid(x) = 1 / (1 + e^-x), 8 lanes (as the scalar forms below,
 * with exp256 for expf: within a few ulp of them). */
OPS_AVX2 static inline __m256 silu256(__m256 x) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}
OPS_AVX2 static inline __m256 sigmoid256(__m256 x) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}
#endif

/* Lanes of the dot product's partial sums: independent accumulators let the compiler vectorise a
 * reduction without reassociating (which strict IEEE arithmetic forbids). */
#define DOT_LANES 16

static inline float vdot(const float *a, const float *b, int n) {
    float acc[DOT_LANES] = {0};
    int i = 0;
    for (; i + DOT_LANES <= n; i += DOT_LANES)
        for (int l = 0; l < DOT_LANES; l++) acc[l] += a[i + l] * b[i + l];
    float s = 0.0f;
    for (int l = 0; l < DOT_LANES; l++) s += acc[l];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

OPS_HOT void op_rmsnorm_zc(float *y, const float *x, const float *w, int T, int n, float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (long)t * n;
        float *yr = y + (long)t * n;
        float ss = 0.0f;
        for (int i = 0; i < n; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = 0; i < n; i++) yr[i] = xr[i] * inv * (1.0f + w[i]);
    }
}

void op_head_rmsnorm_zc(float *x, const float *w, int T, int n_heads, int hd, int token_stride, float eps) {
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (long)t * token_stride + (long)h * hd;
            op_rmsnorm_zc(v, v, w, 1, hd, eps);
        }
}

void op_rope_inv_freq(float *inv_freq, double theta, int rd) {
    for (int i = 0; i < rd / 2; i++)
        inv_freq[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)rd);
}

void op_rope(float *x, const float *inv_freq, int T, int pos0, int n_heads, int head_stride, int token_stride,
             int rd) {
    int half = rd / 2;
    for (int t = 0; t < T; t++) {
        float pos = (float)(pos0 + t);
        for (int i = 0; i < half; i++) {
            float ang = pos * inv_freq[i];
            float c = cosf(ang), s = sinf(ang);
            for (int h = 0; h < n_heads; h++) {
                float *v = x + (long)t * token_stride + (long)h * head_stride;
                float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * c - x2 * s;
                v[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

void op_rope_mrope(float *x, const float *inv_freq, const unsigned char *axis, const int32_t pos[3], int n_heads,
                   int head_stride, int rd) {
    int half = rd / 2;
    for (int i = 0; i < half; i++) {
        float ang = (float)pos[axis[i]] * inv_freq[i];
        float c = cosf(ang), s = sinf(ang);
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (long)h * head_stride;
            float x1 = v[i], x2 = v[i + half];
            v[i] = x1 * c - x2 * s;
            v[i + half] = x2 * c + x1 * s;
        }
    }
}

int op_mrope_axes(unsigned char *axis, int rd, const int section[3], int interleaved) {
    const int half = rd / 2;
    memset(axis, 0, (size_t)(half > 0 ? half : 0));
    if (section[0] < 0 || section[1] < 0 || section[2] < 0 || section[0] + section[1] + section[2] != half) return -1;
    for (int j = 0; j < half; j++) {
        if (interleaved) axis[j] = (j % 3 == 1 && j < 3 * section[1]) ? 1 : (j % 3 == 2 && j < 3 * section[2]) ? 2 : 0;
        else axis[j] = j < section[0] ? 0 : j < section[0] + section[1] ? 1 : 2;
    }
    return 0;
}

void op_conv_weights_kc(float *w_kc, const float *w_ck, int C, int K) {
    for (int c = 0; c < C; c++)
        for (int k = 0; k < K; k++) w_kc[(long)k * C + c] = w_ck[(long)c * K + k];
}

#if OPS_X86
/* x[i] = silu(x[i]) for the whole 8-lane part of a row; returns how far it got. */
OPS_AVX2 static int silu_row_avx2(float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, silu256(_mm256_loadu_ps(x + i)));
    return i;
}
#endif

OPS_HOT void op_conv_silu(float *y, const float *x, float *state, const float *w_kc, int T, int C, int K) {
    int hist = K - 1;
#if OPS_X86
    int avx2 = ops_isa() == CPU_ISA_AVX2;
#endif
    for (int t = 0; t < T; t++) {
        float *yr = y + (long)t * C;
        for (int c = 0; c < C; c++) yr[c] = 0.0f;
        for (int k = 0; k < K; k++) {
            int src = t + k - hist; /* < 0: from the saved inputs */
            const float *in = src < 0 ? state + (long)(hist + src) * C : x + (long)src * C;
            const float *wk = w_kc + (long)k * C;
            for (int c = 0; c < C; c++) yr[c] += wk[c] * in[c];
        }
        int c = 0;
#if OPS_X86
        if (avx2) c = silu_row_avx2(yr, C);
#endif
        for (; c < C; c++) yr[c] = silu(yr[c]);
    }
    /* the last K-1 inputs of [state | x] become the new state */
    if (T >= hist) {
        memcpy(state, x + (long)(T - hist) * C, sizeof(float) * (size_t)hist * (size_t)C);
    } else {
        memmove(state, state + (long)T * C, sizeof(float) * (size_t)(hist - T) * (size_t)C);
        memcpy(state + (long)(hist - T) * C, x, sizeof(float) * (size_t)T * (size_t)C);
    }
}

void op_qk_l2norm(float *qkv, int T, int C, int nk, int dk) {
    float qscale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < 2 * nk; h++) {
            float *v = qkv + (long)t * C + (long)h * dk;
            float ss = 0.0f;
            for (int i = 0; i < dk; i++) ss += v[i] * v[i];
            float inv = 1.0f / sqrtf(ss + GDN_L2NORM_EPS);
            if (h < nk) inv *= qscale; /* q heads come first */
            for (int i = 0; i < dk; i++) v[i] *= inv;
        }
}

void op_gdn_gates(float *g, float *beta, const float *a, const float *b, const float *A_log, const float *dt_bias,
                  int T, int nv) {
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nv; h++) {
            long i = (long)t * nv + h;
            float x = a[i] + dt_bias[h];
            float sp = x > SOFTPLUS_THRESHOLD ? x : log1pf(expf(x));
            g[i] = -expf(A_log[h]) * sp;
            beta[i] = sigmoidf(b[i]);
        }
}

/* One pass over S per token: the update and output of token t are fused with the decay and the
 * S^T k read of token t + 1, row by row of S. Each element sees exactly the operations of the
 * two-pass form in the same order, so the result is the same; the state is streamed once, not
 * twice (it does not fit the L1 cache). */
OPS_HOT static void delta_rule_c(float *o, float *S, const float *qkv, const float *g, const float *beta, int T, int C,
                                 int nk, int nv, int dk, int dv, int h0, int h1) {
    int group = nv / nk;
    float kv[OP_MAX_HEAD_DIM], kv_next[OP_MAX_HEAD_DIM];
    if (T < 1) return;
    for (int h = h0; h < h1; h++) {
        float *Sh = S + (long)h * dk * dv;
        int hk = h / group;
        const float *q_of = qkv + (long)hk * dk;
        const float *k_of = qkv + (long)nk * dk + (long)hk * dk;
        const float *v_of = qkv + 2L * nk * dk + (long)h * dv;
        /* token 0: decay and read S^T k */
        float decay = expf(g[h]);
        for (int j = 0; j < dv; j++) kv[j] = 0.0f;
        for (int i = 0; i < dk; i++) {
            float *Si = Sh + (long)i * dv;
            float ki = k_of[i];
            for (int j = 0; j < dv; j++) {
                Si[j] *= decay;
                kv[j] += Si[j] * ki;
            }
        }
        for (int t = 0; t < T; t++) {
            const float *q = q_of + (long)t * C, *k = k_of + (long)t * C, *v = v_of + (long)t * C;
            float bt = beta[(long)t * nv + h];
            for (int j = 0; j < dv; j++) kv[j] = bt * (v[j] - kv[j]);
            float *out = o + (long)t * nv * dv + (long)h * dv;
            for (int j = 0; j < dv; j++) out[j] = 0.0f;
            if (t + 1 < T) {
                const float *kn = k + C;
                float dn = expf(g[(long)(t + 1) * nv + h]);
                for (int j = 0; j < dv; j++) kv_next[j] = 0.0f;
                for (int i = 0; i < dk; i++) {
                    float *Si = Sh + (long)i * dv;
                    float ki = k[i], qi = q[i], kni = kn[i];
                    for (int j = 0; j < dv; j++) {
                        float sij = Si[j] + ki * kv[j];
                        out[j] += sij * qi;
                        sij *= dn;
                        kv_next[j] += sij * kni;
                        Si[j] = sij;
                    }
                }
                memcpy(kv, kv_next, sizeof(float) * (size_t)dv);
            } else {
                for (int i = 0; i < dk; i++) {
                    float *Si = Sh + (long)i * dv;
                    float ki = k[i], qi = q[i];
                    for (int j = 0; j < dv; j++) {
                        Si[j] += ki * kv[j];
                        out[j] += Si[j] * qi;
                    }
                }
            }
        }
    }
}

#if OPS_X86
/* Columns of S one pass of delta_rule_avx2 keeps: DELTA_VECS ymm. Four, not two: the output and
 * the next token's S^T k are sums over the rows of S, chains of dependent FMAs (4 cycles each);
 * four independent chains of each keep both FMA pipes busy where two left them half idle. */
#define DELTA_VECS 4
#define DELTA_COLS (8 * DELTA_VECS)

/* The per-token rule on AVX2, one block of DELTA_COLS columns of S at a time through every token.
 * Column j of S only ever meets column j of kv, v and o, so the blocks are independent; a block
 * (dk x 32 floats, 16 KiB at dk = 128) stays in L1 across the tokens where the whole 64 KiB state
 * of delta_rule_c is streamed from L2 once a token. Per element the operations (and their FMAs)
 * are those of delta_rule_c's fused pass in the same order, so the result is the same whichever
 * tokens a call holds. */
OPS_AVX2 static void delta_rule_avx2(float *o, float *S, const float *qkv, const float *g, const float *beta, int T,
                                     int C, int nk, int nv, int dk, int dv, int h0, int h1) {
    int group = nv / nk;
    for (int h = h0; h < h1; h++) {
        int hk = h / group;
        const float *q_of = qkv + (long)hk * dk;
        const float *k_of = qkv + (long)nk * dk + (long)hk * dk;
        const float *v_of = qkv + 2L * nk * dk + (long)h * dv;
        for (int j0 = 0; j0 < dv; j0 += DELTA_COLS) {
            float *Sb = S + (long)h * dk * dv + j0;
            __m256 kv[DELTA_VECS], acc_o[DELTA_VECS], acc_n[DELTA_VECS];
            /* token 0: decay and read S^T k */
            __m256 decay = _mm256_set1_ps(expf(g[h]));
#pragma GCC unroll 4
            for (int c = 0; c < DELTA_VECS; c++) kv[c] = _mm256_setzero_ps();
            for (int i = 0; i < dk; i++) {
                float *Si = Sb + (long)i * dv;
                __m256 ki = _mm256_broadcast_ss(k_of + i);
#pragma GCC unroll 4
                for (int c = 0; c < DELTA_VECS; c++) {
                    __m256 sv = _mm256_mul_ps(_mm256_loadu_ps(Si + 8 * c), decay);
                    _mm256_storeu_ps(Si + 8 * c, sv);
                    kv[c] = _mm256_fmadd_ps(sv, ki, kv[c]);
                }
            }
            for (int t = 0; t < T; t++) {
                const float *q = q_of + (long)t * C, *k = k_of + (long)t * C, *v = v_of + (long)t * C + j0;
                __m256 bt = _mm256_set1_ps(beta[(long)t * nv + h]);
#pragma GCC unroll 4
                for (int c = 0; c < DELTA_VECS; c++) {
                    kv[c] = _mm256_mul_ps(bt, _mm256_sub_ps(_mm256_loadu_ps(v + 8 * c), kv[c]));
                    acc_o[c] = _mm256_setzero_ps();
                    acc_n[c] = _mm256_setzero_ps();
                }
                if (t + 1 < T) {
                    const float *kn = k + C;
                    __m256 dn = _mm256_set1_ps(expf(g[(long)(t + 1) * nv + h]));
                    for (int i = 0; i < dk; i++) {
                        float *Si = Sb + (long)i * dv;
                        __m256 ki = _mm256_broadcast_ss(k + i), qi = _mm256_broadcast_ss(q + i);
                        __m256 kni = _mm256_broadcast_ss(kn + i);
#pragma GCC unroll 4
                        for (int c = 0; c < DELTA_VECS; c++) {
                            __m256 sv = _mm256_fmadd_ps(ki, kv[c], _mm256_loadu_ps(Si + 8 * c));
                            acc_o[c] = _mm256_fmadd_ps(sv, qi, acc_o[c]);
                            sv = _mm256_mul_ps(sv, dn);
                            acc_n[c] = _mm256_fmadd_ps(sv, kni, acc_n[c]);
                            _mm256_storeu_ps(Si + 8 * c, sv);
                        }
                    }
                } else {
                    for (int i = 0; i < dk; i++) {
                        float *Si = Sb + (long)i * dv;
                        __m256 ki = _mm256_broadcast_ss(k + i), qi = _mm256_broadcast_ss(q + i);
#pragma GCC unroll 4
                        for (int c = 0; c < DELTA_VECS; c++) {
                            __m256 sv = _mm256_fmadd_ps(ki, kv[c], _mm256_loadu_ps(Si + 8 * c));
                            _mm256_storeu_ps(Si + 8 * c, sv);
                            acc_o[c] = _mm256_fmadd_ps(sv, qi, acc_o[c]);
                        }
                    }
                }
                float *out = o + (long)t * nv * dv + (long)h * dv + j0;
#pragma GCC unroll 4
                for (int c = 0; c < DELTA_VECS; c++) {
                    _mm256_storeu_ps(out + 8 * c, acc_o[c]);
                    kv[c] = acc_n[c];
                }
            }
        }
    }
}
#endif

void op_delta_rule_isa(cpu_isa isa, float *o, float *S, const float *qkv, const float *g, const float *beta, int T,
                       int C, int nk, int nv, int dk, int dv, int h0, int h1) {
#if OPS_X86
    if (isa == CPU_ISA_AVX2 && dv % DELTA_COLS == 0) {
        delta_rule_avx2(o, S, qkv, g, beta, T, C, nk, nv, dk, dv, h0, h1);
        return;
    }
#endif
    (void)isa;
    delta_rule_c(o, S, qkv, g, beta, T, C, nk, nv, dk, dv, h0, h1);
}

void op_delta_rule(float *o, float *S, const float *qkv, const float *g, const float *beta, int T, int C, int nk,
                   int nv, int dk, int dv, int h0, int h1) {
    op_delta_rule_isa(ops_isa(), o, S, qkv, g, beta, T, C, nk, nv, dk, dv, h0, h1);
}

/* One chunk of L <= DELTA_MAX_CHUNK tokens for one value head (see ops.h). With G the cumulative
 * sum of g inside the chunk and S0 the state entering it, the per-token rule unrolls to
 *   u_i = beta_i (v_i - e^{G_i} S0^T k_i - sum_{j<i} e^{G_i - G_j} (k_i . k_j) u_j)   (a triangular solve)
 *   o_t = e^{G_t} S0^T q_t + sum_{i<=t} e^{G_t - G_i} (q_t . k_i) u_i
 *   S_L = e^{G_L} S0 + sum_i e^{G_L - G_i} k_i u_i^T
 * All exponents are <= 0 (g <= 0), so nothing overflows. */
OPS_HOT static void delta_chunk_head(float *o, int o_stride, float *Sh, const float *q, const float *k, const float *v,
                             int qk_stride, int v_stride, const float *g, const float *beta, int gb_stride, int L,
                             int dk, int dv, float *u /* [L][dv] */) {
    float G[DELTA_MAX_CHUNK];
    float acc = 0.0f;
    for (int t = 0; t < L; t++) {
        acc += g[(long)t * gb_stride];
        G[t] = acc;
    }
    /* u_i: right-hand side, then forward substitution */
    for (int i = 0; i < L; i++) {
        const float *ki = k + (long)i * qk_stride;
        float *ui = u + (long)i * dv;
        float bi = beta[(long)i * gb_stride];
        float gi = expf(G[i]);
        for (int j = 0; j < dv; j++) ui[j] = 0.0f;
        for (int a = 0; a < dk; a++) {
            const float *Sa = Sh + (long)a * dv;
            float ka = ki[a] * gi;
            for (int j = 0; j < dv; j++) ui[j] += Sa[j] * ka;
        }
        const float *vi = v + (long)i * v_stride;
        for (int j = 0; j < dv; j++) ui[j] = bi * (vi[j] - ui[j]);
        for (int jj = 0; jj < i; jj++) {
            float c = bi * expf(G[i] - G[jj]) * vdot(ki, k + (long)jj * qk_stride, dk);
            const float *uj = u + (long)jj * dv;
            for (int j = 0; j < dv; j++) ui[j] -= c * uj[j];
        }
    }
    /* outputs */
    for (int t = 0; t < L; t++) {
        const float *qt = q + (long)t * qk_stride;
        float *ot = o + (long)t * o_stride;
        float gt = expf(G[t]);
        for (int j = 0; j < dv; j++) ot[j] = 0.0f;
        for (int a = 0; a < dk; a++) {
            const float *Sa = Sh + (long)a * dv;
            float qa = qt[a] * gt;
            for (int j = 0; j < dv; j++) ot[j] += Sa[j] * qa;
        }
        for (int i = 0; i <= t; i++) {
            float c = expf(G[t] - G[i]) * vdot(qt, k + (long)i * qk_stride, dk);
            const float *ui = u + (long)i * dv;
            for (int j = 0; j < dv; j++) ot[j] += c * ui[j];
        }
    }
    /* the state leaving the chunk */
    float gL = expf(G[L - 1]);
    for (int a = 0; a < dk; a++) {
        float *Sa = Sh + (long)a * dv;
        for (int j = 0; j < dv; j++) Sa[j] *= gL;
        for (int i = 0; i < L; i++) {
            float c = expf(G[L - 1] - G[i]) * k[(long)i * qk_stride + a];
            const float *ui = u + (long)i * dv;
            for (int j = 0; j < dv; j++) Sa[j] += c * ui[j];
        }
    }
}

void op_delta_rule_chunked(float *o, float *S, const float *qkv, const float *g, const float *beta, int T, int C,
                           int nk, int nv, int dk, int dv, int h0, int h1, int chunk) {
    if (chunk > DELTA_MAX_CHUNK || chunk < 1) chunk = DELTA_MAX_CHUNK;
    int group = nv / nk;
    float *u = malloc(sizeof(float) * (size_t)chunk * (size_t)dv);
    if (!u) { /* no scratch: the per-token form needs none and gives the same result */
        op_delta_rule(o, S, qkv, g, beta, T, C, nk, nv, dk, dv, h0, h1);
        return;
    }
    for (int h = h0; h < h1; h++) {
        int hk = h / group;
        for (int t0 = 0; t0 < T; t0 += chunk) {
            int L = T - t0 < chunk ? T - t0 : chunk;
            const float *row = qkv + (long)t0 * C;
            delta_chunk_head(o + (long)t0 * nv * dv + (long)h * dv, nv * dv, S + (long)h * dk * dv,
                             row + (long)hk * dk, row + (long)nk * dk + (long)hk * dk,
                             row + 2L * nk * dk + (long)h * dv, C, C, g + (long)t0 * nv + h,
                             beta + (long)t0 * nv + h, nv, L, dk, dv, u);
        }
    }
    free(u);
}

#if OPS_X86
/* x[i] = x[i] * inv * w[i] * silu(z[i]) for the 8-lane part of a head; returns how far it got. */
OPS_AVX2 static int gated_scale_avx2(float *x, const float *z, const float *w, float inv, int n) {
    __m256 iv = _mm256_set1_ps(inv);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), iv), _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(v, silu256(_mm256_loadu_ps(z + i))));
    }
    return i;
}
#endif

void op_gated_rmsnorm(float *o, const float *z, const float *w, int T, int nv, int dv, float eps) {
#if OPS_X86
    int avx2 = ops_isa() == CPU_ISA_AVX2;
#endif
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nv; h++) {
            float *x = o + (long)t * nv * dv + (long)h * dv;
            const float *zz = z + (long)t * nv * dv + (long)h * dv;
            float ss = 0.0f;
            for (int i = 0; i < dv; i++) ss += x[i] * x[i];
            float inv = 1.0f / sqrtf(ss / (float)dv + eps);
            int i = 0;
#if OPS_X86
            if (avx2) i = gated_scale_avx2(x, zz, w, inv, dv);
#endif
            for (; i < dv; i++) x[i] = x[i] * inv * w[i] * silu(zz[i]);
        }
}

OPS_HOT void op_attention(float *out, const float *q, int q_stride, int q_head_stride, const float *K, const float *V,
                  int T, int pos0, int nh, int nkv, int hd, int j0, int j1) {
    int group = nh / nkv;
    int kv_stride = nkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int n_keys_max = pos0 + T;
    float *score = malloc(sizeof(float) * (size_t)n_keys_max);
    float acc_stack[512];
    float *acc = hd <= 512 ? acc_stack : malloc(sizeof(float) * (size_t)hd);
    if (!score || !acc) { /* cannot happen for sane sizes; leave zeros rather than crash */
        free(score);
        if (acc != acc_stack) free(acc);
        for (int t = 0; t < T; t++)
            for (int j = j0; j < j1; j++) memset(out + (long)t * nh * hd + (long)j * hd, 0, sizeof(float) * hd);
        return;
    }
    for (int j = j0; j < j1; j++) {
        int kvh = j / group;
        for (int t = 0; t < T; t++) {
            const float *qt = q + (long)t * q_stride + (long)j * q_head_stride;
            int n = pos0 + t + 1;
            float mx = -INFINITY;
            for (int p = 0; p < n; p++) {
                float d = vdot(qt, K + (long)p * kv_stride + (long)kvh * hd, hd) * scale;
                score[p] = d;
                if (d > mx) mx = d;
            }
            float sum = 0.0f;
            for (int p = 0; p < n; p++) {
                score[p] = expf(score[p] - mx);
                sum += score[p];
            }
            float inv = 1.0f / sum;
            for (int i = 0; i < hd; i++) acc[i] = 0.0f;
            for (int p = 0; p < n; p++) {
                const float *vp = V + (long)p * kv_stride + (long)kvh * hd;
                float w = score[p] * inv;
                for (int i = 0; i < hd; i++) acc[i] += w * vp[i];
            }
            memcpy(out + (long)t * nh * hd + (long)j * hd, acc, sizeof(float) * (size_t)hd);
        }
    }
    free(score);
    if (acc != acc_stack) free(acc);
}

long op_attention_scratch_floats(int nh, int nkv, int hd, int max_tokens) {
    long rows = (long)max_tokens * (nh / nkv);
    return rows * hd + rows * OP_ATTN_KEY_TILE + 2 * rows;
}

OPS_HOT static void attention_group_c(float *out, const float *q, int q_stride, int q_head_stride, const op_kv *kv,
                                     int pos0, int nh, int nkv, int hd, int kvh, int t0, int t1, float *scratch) {
    int group = nh / nkv, kv_stride = nkv * hd;
    int rows = (t1 - t0) * group;
    float scale = 1.0f / sqrtf((float)hd);
    float *acc = scratch, *sc = acc + (long)rows * hd, *mx = sc + (long)rows * OP_ATTN_KEY_TILE, *den = mx + rows;
    for (int r = 0; r < rows; r++) {
        mx[r] = -INFINITY;
        den[r] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * (size_t)rows * (size_t)hd);
    int end = pos0 + t1; /* keys the last query sees */
    for (int k0 = 0; k0 < end; k0 += OP_ATTN_KEY_TILE) {
        int k1 = k0 + OP_ATTN_KEY_TILE < end ? k0 + OP_ATTN_KEY_TILE : end;
        /* the tile's first key and value (a tile lies in one piece of kv) */
        const float *Kt = op_kv_keys(kv, k0, kv_stride), *Vt = op_kv_values(kv, k0, kv_stride);
        for (int r = 0; r < rows; r++) {
            int t = t0 + r / group, j = kvh * group + r % group;
            int n_keys = pos0 + t + 1; /* causal: keys [0, pos0 + t] */
            if (k0 >= n_keys) continue;
            int kend = k1 < n_keys ? k1 : n_keys;
            const float *qr = q + (long)t * q_stride + (long)j * q_head_stride;
            float *s_r = sc + (long)r * OP_ATTN_KEY_TILE;
            float tile_max = -INFINITY;
            for (int p = k0; p < kend; p++) {
                float d = vdot(qr, Kt + (long)(p - k0) * kv_stride + (long)kvh * hd, hd) * scale;
                s_r[p - k0] = d;
                if (d > tile_max) tile_max = d;
            }
            float m_new = tile_max > mx[r] ? tile_max : mx[r];
            float corr = expf(mx[r] - m_new); /* 0 on the first tile (mx = -inf) */
            float *a = acc + (long)r * hd;
            if (corr != 1.0f) {
                den[r] *= corr;
                for (int i = 0; i < hd; i++) a[i] *= corr;
            }
            for (int p = k0; p < kend; p++) {
                float e = expf(s_r[p - k0] - m_new);
                den[r] += e;
                const float *vp = Vt + (long)(p - k0) * kv_stride + (long)kvh * hd;
                for (int i = 0; i < hd; i++) a[i] += e * vp[i];
            }
            mx[r] = m_new;
        }
    }
    for (int r = 0; r < rows; r++) {
        int t = t0 + r / group, j = kvh * group + r % group;
        float inv = 1.0f / den[r];
        float *o = out + (long)t * nh * hd + (long)j * hd;
        const float *a = acc + (long)r * hd;
        for (int i = 0; i < hd; i++) o[i] = a[i] * inv;
    }
}

/* ---- attention on AVX2: the two products as register-blocked kernels -------------------------
 * Per key tile (OP_ATTN_KEY_TILE keys, at absolute multiples of it, as attention_group_c):
 *  1. scores: each ATTN_SUB-key slice of K is transposed into kt [hd][ATTN_SUB] (an L1-sized panel),
 *     then a 6-row x 16-key kernel sums q[r][d] * kt[d][c] over d with the q values broadcast from
 *     the query rows in place: the GEMM microkernel's shape, 12 accumulators;
 *  2. the online softmax per row: tile max, correction of the running sum and accumulator, the
 *     exponentials (exp256, 8 at a time; a key a row may not see gets exactly 0);
 *  3. acc[r][d] += p[r][c] V[c][d]: a 6-row x 16-dim kernel over the tile's keys, the V slice for
 *     16 dims (tile x 64 bytes) staying in L1 across the row blocks.
 * Each score is one sequential sum over d and each acc element one sequential sum over keys, the
 * same whichever block the row falls in, so a query's result does not depend on the other rows of
 * its task nor on how its row was split into chunks. Scratch: op_attention_scratch_floats, the
 * same as the portable form (kt lives on the stack). */
#if OPS_X86
#define ATTN_MR 6
#define ATTN_SUB 16
/* hd this kernel takes: kt is a stack array of ATTN_MAX_HD x ATTN_SUB floats (32 KiB at 512). */
#define ATTN_MAX_HD 512

/* Scores of up to 6 rows against one transposed slice: s[m][c] = scale * sum_d q_m[d] kt[d][c]. */
OPS_AVX2 static void attn_scores_6x16(const float *const qr[ATTN_MR], const float *kt, int hd, float scale,
                                      float *s, int s_stride) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const float *q0 = qr[0], *q1 = qr[1], *q2 = qr[2], *q3 = qr[3], *q4 = qr[4], *q5 = qr[5];
#pragma GCC unroll 4
    for (int d = 0; d < hd; d++) {
        __m256 b0 = _mm256_load_ps(kt + (long)d * ATTN_SUB), b1 = _mm256_load_ps(kt + (long)d * ATTN_SUB + 8), a;
        a = _mm256_broadcast_ss(q0 + d);
        c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(q1 + d);
        c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(q2 + d);
        c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(q3 + d);
        c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(q4 + d);
        c40 = _mm256_fmadd_ps(a, b0, c40), c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(q5 + d);
        c50 = _mm256_fmadd_ps(a, b0, c50), c51 = _mm256_fmadd_ps(a, b1, c51);
    }
    __m256 sc = _mm256_set1_ps(scale);
    float *s0 = s, *s1 = s + s_stride, *s2 = s + 2 * s_stride, *s3 = s + 3 * s_stride, *s4 = s + 4 * s_stride,
          *s5 = s + 5 * s_stride;
    _mm256_storeu_ps(s0, _mm256_mul_ps(c00, sc)), _mm256_storeu_ps(s0 + 8, _mm256_mul_ps(c01, sc));
    _mm256_storeu_ps(s1, _mm256_mul_ps(c10, sc)), _mm256_storeu_ps(s1 + 8, _mm256_mul_ps(c11, sc));
    _mm256_storeu_ps(s2, _mm256_mul_ps(c20, sc)), _mm256_storeu_ps(s2 + 8, _mm256_mul_ps(c21, sc));
    _mm256_storeu_ps(s3, _mm256_mul_ps(c30, sc)), _mm256_storeu_ps(s3 + 8, _mm256_mul_ps(c31, sc));
    _mm256_storeu_ps(s4, _mm256_mul_ps(c40, sc)), _mm256_storeu_ps(s4 + 8, _mm256_mul_ps(c41, sc));
    _mm256_storeu_ps(s5, _mm256_mul_ps(c50, sc)), _mm256_storeu_ps(s5 + 8, _mm256_mul_ps(c51, sc));
}

/* acc_m[d0 .. d0+16) += sum_c p_m[c] V[c][d0 ..] for up to 6 rows (acc rows and p rows by pointer). */
OPS_AVX2 static void attn_pv_6x16(float *const ar[ATTN_MR], const float *const pr[ATTN_MR], const float *v,
                                  long v_stride, int n_keys) {
    __m256 c00 = _mm256_loadu_ps(ar[0]), c01 = _mm256_loadu_ps(ar[0] + 8);
    __m256 c10 = _mm256_loadu_ps(ar[1]), c11 = _mm256_loadu_ps(ar[1] + 8);
    __m256 c20 = _mm256_loadu_ps(ar[2]), c21 = _mm256_loadu_ps(ar[2] + 8);
    __m256 c30 = _mm256_loadu_ps(ar[3]), c31 = _mm256_loadu_ps(ar[3] + 8);
    __m256 c40 = _mm256_loadu_ps(ar[4]), c41 = _mm256_loadu_ps(ar[4] + 8);
    __m256 c50 = _mm256_loadu_ps(ar[5]), c51 = _mm256_loadu_ps(ar[5] + 8);
    const float *p0 = pr[0], *p1 = pr[1], *p2 = pr[2], *p3 = pr[3], *p4 = pr[4], *p5 = pr[5];
#pragma GCC unroll 4
    for (int c = 0; c < n_keys; c++) {
        const float *vc = v + (long)c * v_stride;
        __m256 b0 = _mm256_loadu_ps(vc), b1 = _mm256_loadu_ps(vc + 8), a;
        a = _mm256_broadcast_ss(p0 + c);
        c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(p1 + c);
        c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(p2 + c);
        c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(p3 + c);
        c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(p4 + c);
        c40 = _mm256_fmadd_ps(a, b0, c40), c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(p5 + c);
        c50 = _mm256_fmadd_ps(a, b0, c50), c51 = _mm256_fmadd_ps(a, b1, c51);
    }
    _mm256_storeu_ps(ar[5], c50), _mm256_storeu_ps(ar[5] + 8, c51);
    _mm256_storeu_ps(ar[4], c40), _mm256_storeu_ps(ar[4] + 8, c41);
    _mm256_storeu_ps(ar[3], c30), _mm256_storeu_ps(ar[3] + 8, c31);
    _mm256_storeu_ps(ar[2], c20), _mm256_storeu_ps(ar[2] + 8, c21);
    _mm256_storeu_ps(ar[1], c10), _mm256_storeu_ps(ar[1] + 8, c11);
    _mm256_storeu_ps(ar[0], c00), _mm256_storeu_ps(ar[0] + 8, c01);
}

/* kt[d][c] = K[k0 + c][d] for c < n (zero past n), d < hd (a multiple of 8): 8 x 8 transposes. */
OPS_AVX2 static void attn_transpose_keys(float *kt, const float *K, long kv_stride, int n, int hd) {
    for (int c0 = 0; c0 < ATTN_SUB; c0 += 8) {
        for (int d0 = 0; d0 < hd; d0 += 8) {
            __m256 r[8], a[8], b[8];
            for (int i = 0; i < 8; i++)
                r[i] = c0 + i < n ? _mm256_loadu_ps(K + (long)(c0 + i) * kv_stride + d0) : _mm256_setzero_ps();
            for (int i = 0; i < 8; i += 2) {
                a[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                a[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int g = 0; g < 8; g += 4) {
                b[g + 0] = _mm256_shuffle_ps(a[g], a[g + 2], _MM_SHUFFLE(1, 0, 1, 0));
                b[g + 1] = _mm256_shuffle_ps(a[g], a[g + 2], _MM_SHUFFLE(3, 2, 3, 2));
                b[g + 2] = _mm256_shuffle_ps(a[g + 1], a[g + 3], _MM_SHUFFLE(1, 0, 1, 0));
                b[g + 3] = _mm256_shuffle_ps(a[g + 1], a[g + 3], _MM_SHUFFLE(3, 2, 3, 2));
            }
            for (int qd = 0; qd < 4; qd++) {
                _mm256_store_ps(kt + (long)(d0 + qd) * ATTN_SUB + c0, _mm256_permute2f128_ps(b[qd], b[4 + qd], 0x20));
                _mm256_store_ps(kt + (long)(d0 + 4 + qd) * ATTN_SUB + c0, _mm256_permute2f128_ps(b[qd], b[4 + qd], 0x31));
            }
        }
    }
}

OPS_AVX2 static void attention_group_avx2(float *out, const float *q, int q_stride, int q_head_stride, const op_kv *kv,
                                          int pos0, int nh, int nkv, int hd, int kvh, int t0, int t1, float *scratch) {
    int group = nh / nkv, kv_stride = nkv * hd;
    int rows = (t1 - t0) * group;
    float scale = 1.0f / sqrtf((float)hd);
    float *acc = scratch, *sc = acc + (long)rows * hd, *mx = sc + (long)rows * OP_ATTN_KEY_TILE, *den = mx + rows;
    float kt[ATTN_MAX_HD * ATTN_SUB] __attribute__((aligned(32)));
    /* a row's query, its first key past what it may see, its scores and its accumulator */
    const float *qrow[ATTN_MR];
    float *arow[ATTN_MR];
    const float *prow[ATTN_MR];
    for (int r = 0; r < rows; r++) {
        mx[r] = -INFINITY;
        den[r] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * (size_t)rows * (size_t)hd);
    int end = pos0 + t1;
    for (int k0 = 0; k0 < end; k0 += OP_ATTN_KEY_TILE) {
        int k1 = k0 + OP_ATTN_KEY_TILE < end ? k0 + OP_ATTN_KEY_TILE : end;
        /* the tile's first key and value of this kv head (a tile lies in one piece of kv) */
        const float *Kt = op_kv_keys(kv, k0, kv_stride) + (long)kvh * hd;
        const float *Vt = op_kv_values(kv, k0, kv_stride) + (long)kvh * hd;
        int first_row = 0; /* rows before it see no key of this tile (causal) */
        while (first_row < rows && pos0 + t0 + first_row / group + 1 <= k0) first_row++;
        int ntile = k1 - k0, nsub = (ntile + ATTN_SUB - 1) / ATTN_SUB * ATTN_SUB;
        /* 1. scores for every row of the task that sees the tile */
        for (int c0 = 0; c0 < ntile; c0 += ATTN_SUB) {
            int n = ntile - c0 < ATTN_SUB ? ntile - c0 : ATTN_SUB;
            attn_transpose_keys(kt, Kt + (long)c0 * kv_stride, kv_stride, n, hd);
            for (int r0 = first_row; r0 < rows; r0 += ATTN_MR) {
                float *s0 = sc + (long)r0 * OP_ATTN_KEY_TILE + c0;
                for (int m = 0; m < ATTN_MR; m++) {
                    int r = r0 + m < rows ? r0 + m : r0; /* past the end: recompute row r0, unused */
                    qrow[m] = q + (long)(t0 + r / group) * q_stride + (long)(kvh * group + r % group) * q_head_stride;
                }
                if (r0 + ATTN_MR <= rows) {
                    attn_scores_6x16(qrow, kt, hd, scale, s0, OP_ATTN_KEY_TILE);
                } else {
                    float tmp[ATTN_MR * ATTN_SUB];
                    attn_scores_6x16(qrow, kt, hd, scale, tmp, ATTN_SUB);
                    for (int m = 0; r0 + m < rows; m++) memcpy(s0 + (long)m * OP_ATTN_KEY_TILE, tmp + m * ATTN_SUB, sizeof(float) * ATTN_SUB);
                }
            }
        }
        /* 2. online softmax, row by row */
        for (int r = first_row; r < rows; r++) {
            int n_keys = pos0 + t0 + r / group + 1;
            int visible = n_keys - k0 < ntile ? n_keys - k0 : ntile;
            float *s_r = sc + (long)r * OP_ATTN_KEY_TILE;
            for (int c = visible; c < nsub; c++) s_r[c] = -INFINITY;
            float tile_max = -INFINITY;
            for (int c = 0; c < visible; c++) tile_max = s_r[c] > tile_max ? s_r[c] : tile_max;
            float m_new = tile_max > mx[r] ? tile_max : mx[r];
            float corr = expf(mx[r] - m_new);
            if (corr != 1.0f) {
                float *a = acc + (long)r * hd;
                den[r] *= corr;
                __m256 cv = _mm256_set1_ps(corr);
                for (int i = 0; i < hd; i += 8) _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), cv));
            }
            __m256 mv = _mm256_set1_ps(m_new), sum = _mm256_setzero_ps();
            for (int c = 0; c < nsub; c += 8) {
                __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s_r + c), mv));
                _mm256_storeu_ps(s_r + c, e);
                sum = _mm256_add_ps(sum, e);
            }
            float lanes[8];
            _mm256_storeu_ps(lanes, sum);
            den[r] += ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
            mx[r] = m_new;
        }
        /* 3. acc += p V, 16 dims at a time across every row block */
        for (int d0 = 0; d0 < hd; d0 += 16) {
            for (int r0 = first_row; r0 < rows; r0 += ATTN_MR) {
                float dummy[16]; /* the accumulator of a row past the end: computed, dropped */
                for (int m = 0; m < ATTN_MR; m++) {
                    int real = r0 + m < rows;
                    int r = real ? r0 + m : r0;
                    arow[m] = real ? acc + (long)r * hd + d0 : dummy;
                    prow[m] = sc + (long)r * OP_ATTN_KEY_TILE;
                }
                if (r0 + ATTN_MR > rows) memcpy(dummy, acc + (long)r0 * hd + d0, sizeof dummy);
                /* ntile, not nsub: V past the tile's end may not exist */
                attn_pv_6x16(arow, prow, Vt + d0, kv_stride, ntile);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        int t = t0 + r / group, j = kvh * group + r % group;
        float inv = 1.0f / den[r];
        float *o = out + (long)t * nh * hd + (long)j * hd;
        const float *a = acc + (long)r * hd;
        for (int i = 0; i < hd; i++) o[i] = a[i] * inv;
    }
}
#endif

void op_attention_group_kv_isa(cpu_isa isa, float *out, const float *q, int q_stride, int q_head_stride,
                               const op_kv *kv, int pos0, int nh, int nkv, int hd, int kvh, int t0, int t1,
                               float *scratch) {
#if OPS_X86
    if (isa == CPU_ISA_AVX2 && hd % 16 == 0 && hd <= ATTN_MAX_HD) {
        attention_group_avx2(out, q, q_stride, q_head_stride, kv, pos0, nh, nkv, hd, kvh, t0, t1, scratch);
        return;
    }
#endif
    (void)isa;
    attention_group_c(out, q, q_stride, q_head_stride, kv, pos0, nh, nkv, hd, kvh, t0, t1, scratch);
}

void op_attention_group_kv(float *out, const float *q, int q_stride, int q_head_stride, const op_kv *kv, int pos0,
                           int nh, int nkv, int hd, int kvh, int t0, int t1, float *scratch) {
    op_attention_group_kv_isa(ops_isa(), out, q, q_stride, q_head_stride, kv, pos0, nh, nkv, hd, kvh, t0, t1, scratch);
}

void op_attention_group_isa(cpu_isa isa, float *out, const float *q, int q_stride, int q_head_stride, const float *K,
                            const float *V, int pos0, int nh, int nkv, int hd, int kvh, int t0, int t1,
                            float *scratch) {
    const op_kv kv = {NULL, NULL, 0, K, V};
    op_attention_group_kv_isa(isa, out, q, q_stride, q_head_stride, &kv, pos0, nh, nkv, hd, kvh, t0, t1, scratch);
}

void op_attention_group(float *out, const float *q, int q_stride, int q_head_stride, const float *K, const float *V,
                        int pos0, int nh, int nkv, int hd, int kvh, int t0, int t1, float *scratch) {
    op_attention_group_isa(ops_isa(), out, q, q_stride, q_head_stride, K, V, pos0, nh, nkv, hd, kvh, t0, t1, scratch);
}

#if OPS_X86
/* o[i] *= sigmoid(g[i]) for the 8-lane part of a head; returns how far it got. */
OPS_AVX2 static int sigmoid_gate_avx2(float *o, const float *g, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(o + i), sigmoid256(_mm256_loadu_ps(g + i))));
    return i;
}
#endif

void op_sigmoid_gate(float *out, const float *gate, int T, int nh, int hd, int gate_stride, int gate_head_stride) {
#if OPS_X86
    int avx2 = ops_isa() == CPU_ISA_AVX2;
#endif
    for (int t = 0; t < T; t++)
        for (int j = 0; j < nh; j++) {
            float *o = out + (long)t * nh * hd + (long)j * hd;
            const float *gt = gate + (long)t * gate_stride + (long)j * gate_head_stride;
            int i = 0;
#if OPS_X86
            if (avx2) i = sigmoid_gate_avx2(o, gt, hd);
#endif
            for (; i < hd; i++) o[i] *= sigmoidf(gt[i]);
        }
}

#if OPS_X86
OPS_AVX2 static long silu_mul_avx2(float *a, const float *b, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(a + i, _mm256_mul_ps(silu256(_mm256_loadu_ps(a + i)), _mm256_loadu_ps(b + i)));
    return i;
}
#endif

OPS_HOT void op_silu_mul(float *a, const float *b, long n) {
    long i = 0;
#if OPS_X86
    if (ops_isa() == CPU_ISA_AVX2) i = silu_mul_avx2(a, b, n);
#endif
    for (; i < n; i++) a[i] = silu(a[i]) * b[i];
}

void op_add(float *x, const float *y, long n) {
    for (long i = 0; i < n; i++) x[i] += y[i];
}

void op_letter_probs(float *probs, const float *h, const float *norm_w, float eps, const uint16_t *E, int H,
                     const int32_t *letters, int n_letters, int nopts) {
    double ss = 0.0;
    for (int i = 0; i < H; i++) ss += (double)h[i] * h[i];
    float inv = 1.0f / sqrtf((float)(ss / H) + eps);
    double logit[SQUAD_MAX_LETTERS];
    double mx = -INFINITY;
    for (int l = 0; l < nopts && l < n_letters; l++) {
        const uint16_t *e = E + (long)letters[l] * H;
        double d = 0.0;
        for (int i = 0; i < H; i++) d += (double)(h[i] * inv * (1.0f + norm_w[i])) * squad_bf16_to_f32(e[i]);
        logit[l] = d;
        if (d > mx) mx = d;
    }
    double sum = 0.0;
    for (int l = 0; l < nopts && l < n_letters; l++) {
        logit[l] = exp(logit[l] - mx);
        sum += logit[l];
    }
    for (int l = 0; l < SQUAD_MAX_LETTERS; l++) probs[l] = (l < nopts && l < n_letters) ? (float)(logit[l] / sum) : 0.0f;
}
