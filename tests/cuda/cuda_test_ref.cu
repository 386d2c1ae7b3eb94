/*
 * cuda_test_ref.cu — the plain host references of the CUDA kernel groups (cuda_test_api.h): the
 * oracles tests/gpu_test_kernels.c compares the kernels with. Straight loops in double precision
 * over the formulas of docs/design.md, written for clarity, not speed. In testcuda with the
 * test API (tests/cuda); libsquad does not carry them.
 */
#include "cuda/cuda_internal.cuh"
#include "cuda_test_api.h"

#include <math.h>
#include <stdlib.h>

/* ---- the Gated DeltaNet mixer: the per-token recurrence ---------------------------------------- */

extern "C" void cu_ref_gdn(const cu_ref_gdn_args *a) {
    const int nk = a->nk, nv = a->nv, dk = a->dk, dv = a->dv, K = a->K;
    const int C = 2 * nk * dk + nv * dv, Km1 = K - 1;
    const int zoff = C, boff = C + nv * dv, aoff = boff + nv;
    float *y = (float *)calloc((size_t)C, sizeof(float));
    float *qn = (float *)calloc((size_t)nk * dk, sizeof(float)), *kn = (float *)calloc((size_t)nk * dk, sizeof(float));
    double *o = (double *)calloc((size_t)dv, sizeof(double)), *sk = (double *)calloc((size_t)dv, sizeof(double));
    for (int t = 0; t < a->len; t++) {
        for (int ch = 0; ch < C; ch++) {
            double s = 0;
            for (int j = 0; j < K; j++) {
                const int tau = t - Km1 + j;
                const float x = tau >= 0 ? a->P[(size_t)tau * a->ldP + ch] : a->conv_state[(size_t)(Km1 + tau) * C + ch];
                s += (double)a->conv_w[(size_t)ch * K + j] * x;
            }
            y[ch] = (float)(s / (1.0 + exp(-s)));
        }
        for (int hk = 0; hk < nk; hk++) {
            double sq = 0, sk2 = 0;
            for (int i = 0; i < dk; i++) {
                sq += (double)y[hk * dk + i] * y[hk * dk + i];
                sk2 += (double)y[nk * dk + hk * dk + i] * y[nk * dk + hk * dk + i];
            }
            const double rq = 1.0 / sqrt(sq + 1e-6) / sqrt((double)dk), rk = 1.0 / sqrt(sk2 + 1e-6);
            for (int i = 0; i < dk; i++) {
                qn[hk * dk + i] = (float)(y[hk * dk + i] * rq);
                kn[hk * dk + i] = (float)(y[nk * dk + hk * dk + i] * rk);
            }
        }
        const float *row = a->P + (size_t)t * a->ldP;
        for (int h = 0; h < nv; h++) {
            const int hk = h / (nv / nk);
            const double x = (double)row[aoff + h] + a->dt_bias[h];
            const double sp = x > 20 ? x : log1p(exp(x));
            const double g = -exp((double)a->A_log[h]) * sp, beta = 1.0 / (1.0 + exp(-(double)row[boff + h]));
            const double dec = exp(g);
            float *S = a->S + (size_t)h * dk * dv; /* [dk][dv] */
            const float *k = kn + hk * dk, *q = qn + hk * dk, *v = y + 2 * nk * dk + h * dv;
            for (int j = 0; j < dv; j++) {
                double s = 0;
                for (int i = 0; i < dk; i++) {
                    S[(size_t)i * dv + j] = (float)(S[(size_t)i * dv + j] * dec);
                    s += (double)S[(size_t)i * dv + j] * k[i];
                }
                sk[j] = beta * (v[j] - s);
            }
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++) S[(size_t)i * dv + j] = (float)(S[(size_t)i * dv + j] + k[i] * sk[j]);
            double ss = 0;
            for (int j = 0; j < dv; j++) {
                double s = 0;
                for (int i = 0; i < dk; i++) s += (double)S[(size_t)i * dv + j] * q[i];
                o[j] = s;
                ss += s * s;
            }
            const double rs = 1.0 / sqrt(ss / dv + a->eps);
            for (int j = 0; j < dv; j++) {
                const double z = row[zoff + h * dv + j];
                a->Y[(size_t)t * nv * dv + h * dv + j] = (float)(o[j] * rs * a->norm_w[j] * (z / (1.0 + exp(-z))));
            }
        }
    }
    /* the conv state moves on: the last K-1 inputs of [old | chunk] */
    float *old = (float *)malloc(sizeof(float) * (size_t)(Km1 > 0 ? Km1 : 1) * C);
    if (Km1 > 0) memcpy(old, a->conv_state, sizeof(float) * (size_t)Km1 * C);
    for (int j = 0; j < Km1; j++)
        for (int ch = 0; ch < C; ch++) {
            const int src = a->len + j;
            a->conv_state[(size_t)j * C + ch] = src < Km1 ? old[(size_t)src * C + ch] : a->P[(size_t)(src - Km1) * a->ldP + ch];
        }
    free(old);
    free(y);
    free(qn);
    free(kn);
    free(o);
    free(sk);
}

/* ---- gated attention ---------------------------------------------------------------------------- */

extern "C" void cu_ref_attn(const cu_ref_attn_args *a) {
    const int nh = a->nh, nkv = a->nkv, hd = a->hd, rd = a->rd, half = rd / 2;
    const size_t kvd = (size_t)nkv * hd;
    float *q = (float *)malloc(sizeof(float) * (size_t)a->len * nh * hd);
    double *x = (double *)malloc(sizeof(double) * hd), *sc = (double *)malloc(sizeof(double) * (a->start + a->len));
    /* norm + rope of q, k; k, v into the cache */
    for (int t = 0; t < a->len; t++) {
        const int pos = a->start + t;
        const float *row = a->QKV + (size_t)t * a->ld;
        for (int hh = 0; hh < nh + nkv; hh++) {
            const int isq = hh < nh, j = isq ? hh : hh - nh;
            const float *src = isq ? row + (size_t)j * 2 * hd : row + (size_t)nh * 2 * hd + (size_t)j * hd;
            const float *nw = isq ? a->q_norm : a->k_norm;
            double ss = 0;
            for (int d = 0; d < hd; d++) ss += (double)src[d] * src[d];
            const double rr = 1.0 / sqrt(ss / hd + a->eps);
            for (int d = 0; d < hd; d++) x[d] = src[d] * rr * (1.0 + nw[d]);
            float *dst = isq ? q + ((size_t)t * nh + j) * hd : a->K + (size_t)pos * kvd + (size_t)j * hd;
            for (int d = 0; d < hd; d++) {
                double o = x[d];
                if (d < rd) {
                    const int i = d < half ? d : d - half;
                    const float ang = (float)pos * a->inv_freq[i];
                    const double cth = cos((double)ang), sth = sin((double)ang);
                    o = d < half ? x[d] * cth - x[d + half] * sth : x[d] * cth + x[d - half] * sth;
                }
                dst[d] = (float)o;
            }
            if (!isq)
                for (int d = 0; d < hd; d++)
                    a->V[(size_t)pos * kvd + (size_t)j * hd + d] = row[(size_t)nh * 2 * hd + kvd + (size_t)j * hd + d];
        }
    }
    const double scale = 1.0 / sqrt((double)hd);
    for (int t = 0; t < a->len; t++)
        for (int h = 0; h < nh; h++) {
            const int kvh = h / (nh / nkv), nkeys = a->start + t + 1;
            const float *qq = q + ((size_t)t * nh + h) * hd;
            double m = -1e300;
            for (int j = 0; j < nkeys; j++) {
                double s = 0;
                const float *k = a->K + (size_t)j * kvd + (size_t)kvh * hd;
                for (int d = 0; d < hd; d++) s += (double)qq[d] * k[d];
                sc[j] = s * scale;
                if (sc[j] > m) m = sc[j];
            }
            double z = 0;
            for (int j = 0; j < nkeys; j++) z += (sc[j] = exp(sc[j] - m));
            const float *gate = a->QKV + (size_t)t * a->ld + (size_t)h * 2 * hd + hd;
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int j = 0; j < nkeys; j++) o += sc[j] * a->V[(size_t)j * kvd + (size_t)kvh * hd + d];
                a->out[((size_t)t * nh + h) * hd + d] = (float)(o / z / (1.0 + exp(-(double)gate[d])));
            }
        }
    free(q);
    free(x);
    free(sc);
}

/* ---- RMSNorm, SiLU * up ------------------------------------------------------------------------- */

extern "C" void cu_ref_rmsnorm(const float *h, float *out, const float *w, int rows, int H, float eps) {
    for (int t = 0; t < rows; t++) {
        double ss = 0;
        for (int i = 0; i < H; i++) ss += (double)h[(size_t)t * H + i] * h[(size_t)t * H + i];
        const double r = 1.0 / sqrt(ss / H + eps);
        for (int i = 0; i < H; i++) out[(size_t)t * H + i] = (float)(h[(size_t)t * H + i] * r * (1.0 + w[i]));
    }
}

extern "C" void cu_ref_silu_mul(const float *gu, float *out, int rows, int I) {
    for (int t = 0; t < rows; t++)
        for (int i = 0; i < I; i++) {
            const double g = gu[(size_t)t * 2 * I + i], u = gu[(size_t)t * 2 * I + I + i];
            out[(size_t)t * I + i] = (float)(g / (1.0 + exp(-g)) * u);
        }
}

/* ---- the specialists' widened GEMM input ------------------------------------------------------- */

extern "C" void cu_ref_lora(const cu_ref_lora_args *a) {
    const int end = a->in + a->n_slots * a->R, ldw = a->ldw > end ? a->ldw : end;
    const int n = a->in > 0 ? a->in : 1, fR = a->fold_y ? a->fold_R : 0;
    double *x = (double *)malloc(sizeof(double) * (size_t)n), *h2 = (double *)malloc(sizeof(double) * (size_t)n);
    double *uo = (double *)malloc(sizeof(double) * (size_t)(fR > 0 ? fR : 1));
    if (!x || !h2 || !uo) {
        free(x), free(h2), free(uo);
        return;
    }
    for (int t = 0; t < a->rows; t++) {
        double r = 0;
        if (a->src == 0) {
            for (int i = 0; i < a->in; i++) h2[i] = a->h[(size_t)t * a->in + i];
            const int s = a->token_slot[t];
            if (a->fold_y && s >= 1 && s <= a->n_slots) { /* h += B_s (A_s y) */
                for (int k = 0; k < fR; k++) {
                    const float *Ar = a->fold_A + ((size_t)(s - 1) * fR + k) * a->fold_in;
                    uo[k] = 0;
                    for (int i = 0; i < a->fold_in; i++) uo[k] += (double)Ar[i] * a->fold_y[(size_t)t * a->fold_in + i];
                }
                for (int j = 0; j < a->in; j++)
                    for (int k = 0; k < fR; k++)
                        h2[j] += (double)a->fold_B[(size_t)j * a->n_slots * fR + (size_t)(s - 1) * fR + k] * uo[k];
            }
            if (a->fold_y && a->h_out)
                for (int i = 0; i < a->in; i++) a->h_out[(size_t)t * a->in + i] = (float)h2[i];
            double ss = 0;
            for (int i = 0; i < a->in; i++) ss += h2[i] * h2[i];
            r = 1.0 / sqrt(ss / a->in + a->eps);
        }
        for (int i = 0; i < a->in; i++) {
            if (a->src == 0) {
                x[i] = h2[i] * r * (1.0 + a->w[i]);
            } else if (a->src == 1) {
                const double g = a->x_src[(size_t)t * 2 * a->in + i], u = a->x_src[(size_t)t * 2 * a->in + a->in + i];
                x[i] = g / (1.0 + exp(-g)) * u;
            } else { /* a copy, or in place: the same x */
                x[i] = a->x_src[(size_t)t * a->ld_src + i];
            }
        }
        float *o = a->xw + (size_t)t * ldw;
        for (int i = 0; i < a->in; i++) o[i] = (float)x[i];
        const int s = a->token_slot[t];
        for (int q = 1; q <= a->n_slots; q++)
            for (int k = 0; k < a->R; k++) {
                double d = 0;
                if (q == s) {
                    const float *Ar = a->A + ((size_t)(q - 1) * a->R + k) * a->in;
                    for (int i = 0; i < a->in; i++) d += (double)Ar[i] * x[i];
                }
                o[a->in + (q - 1) * a->R + k] = (float)d;
            }
        for (int j = end; j < ldw; j++) o[j] = 0.0f;
    }
    free(x), free(h2), free(uo);
}
