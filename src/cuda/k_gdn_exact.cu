/*
 * k_gdn_exact.cu — the Gated DeltaNet mixer in fp32, token by token: the exact path
 * (precision EXACT) and the plain device version beside the chunked kernels of k_gdn.cu.
 *
 * Three kernels over fp32 activations:
 *  - prep (one block per token): the causal conv over [saved inputs | chunk] + SiLU, the L2 norm
 *    of q / k per head (q * dk^-1/2), and the gates exp(g) = exp(-exp(A_log) softplus(a + dt_bias)),
 *    beta = sigmoid(b) in double precision; padding rows get zeros;
 *  - scan (one warp per value head and 32 columns of dv): each lane keeps its column of S [dk] in
 *    registers and runs the recurrence of docs/design.md section 4 over the real tokens only
 *    (S = exp(g) S; delta = beta (v - S^T k); S += k delta^T; o = S^T q), so padding never
 *    touches the state;
 *  - norm (one block per token): the gated RMSNorm o / rms(o) * w * silu(z), and the conv state
 *    moved on to the chunk's end (prep, which read it, has finished).
 * The state keeps the natural layout S [nv][dk][dv]. Sequential over tokens, so slower than the
 * chunked form; its value is fp32 arithmetic throughout (the fixtures' precision).
 * A batch: blockIdx.z is the row; each kernel first moves its pointers to the row's tokens and its
 * slot's state (ex_row), and a padding row (len 0) touches no state.
 */
#include "cuda_internal.cuh"

#include <math.h>

#define EX_PREP_THREADS 128
#define EX_MAX_DK 128 /* per-lane register arrays below */

struct gdn_exact_args {
    const float *P;
    int ldP;
    float *conv_state; /* [K-1][C]: the row's, set by ex_row */
    const float *conv_in; /* the conv inputs the chunk starts from (cu_gdn_in: a restored blob's, or conv_state) */
    const float *S_in;    /* the S the chunk starts from (likewise) */
    const float *conv_w, *A_log, *dt_bias, *norm_w;
    float *S; /* [nv][dk][dv]: the row's, set by ex_row */
    float *Y; /* [rows][ldY] */
    const cu_chunk_params *prm; /* the batch's rows, then the row's own */
    size_t s_off, conv_off;     /* this layer's S and conv inputs in a slot's arena */
    int nk, nv, dk, dv, K, C, rows; /* rows: the bucket */
    float eps;
    cu_gdn_scratch scr;
    int ldY; /* Y's row stride (cu_gdn_dims.ldY, or nv dv) */
};

/* a's pointers moved to row blockIdx.z: its tokens, its scratch rows, its slot's state. Returns its len. */
__device__ __forceinline__ int ex_row(gdn_exact_args &a) {
    const size_t tok0 = (size_t)blockIdx.z * a.rows;
    a.prm += blockIdx.z;
    a.P += tok0 * a.ldP;
    a.Y += tok0 * a.ldY;
    a.scr.q += tok0 * a.nk * a.dk;
    a.scr.k += tok0 * a.nk * a.dk;
    a.scr.v += tok0 * a.nv * a.dv;
    a.scr.o += tok0 * a.nv * a.dv;
    a.scr.dec += tok0 * a.nv;
    a.scr.beta += tok0 * a.nv;
    const int len = a.prm->len;
    if (len > 0) {
        a.S = (float *)(a.prm->gdn + a.s_off);
        a.conv_state = (float *)(a.prm->gdn + a.conv_off);
        a.S_in = (const float *)(cu_gdn_in(a.prm) + a.s_off);
        a.conv_in = (const float *)(cu_gdn_in(a.prm) + a.conv_off);
    }
    return len;
}

__device__ static float conv_at(const gdn_exact_args &a, int t, int c) {
    const int Km1 = a.K - 1;
    double s = 0;
    for (int j = 0; j < a.K; j++) {
        const int tau = t - Km1 + j;
        const float x = tau >= 0 ? a.P[(size_t)tau * a.ldP + c] : a.conv_in[(size_t)(Km1 + tau) * a.C + c];
        s += (double)a.conv_w[(size_t)c * a.K + j] * x;
    }
    return (float)(s / (1.0 + exp(-s)));
}

__global__ void __launch_bounds__(EX_PREP_THREADS) gdn_exact_prep_kernel(gdn_exact_args a) {
    const int t = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int len = ex_row(a);
    if (len < 1) return; /* a padding row: nothing reads its scratch */
    const bool valid = t < len;
    const int dk = a.dk;
    /* q and k heads: one warp per head */
    for (int hh = w; hh < 2 * a.nk; hh += EX_PREP_THREADS / 32) {
        const int isq = hh < a.nk, hk = isq ? hh : hh - a.nk;
        const int c0 = isq ? hk * dk : a.nk * dk + hk * dk;
        float y[EX_MAX_DK / 32];
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < EX_MAX_DK / 32; e++) {
            const int i = lane + 32 * e;
            y[e] = valid && i < dk ? conv_at(a, t, c0 + i) : 0.f;
            ss += y[e] * y[e];
        }
        ss = cu_warp_sum(ss);
        float r = (float)(1.0 / sqrt((double)ss + 1e-6));
        if (isq) r = (float)(r / sqrt((double)dk));
        float *dst = (isq ? a.scr.q : a.scr.k) + (size_t)t * a.nk * dk + (size_t)hk * dk;
#pragma unroll
        for (int e = 0; e < EX_MAX_DK / 32; e++) {
            const int i = lane + 32 * e;
            if (i < dk) dst[i] = y[e] * r;
        }
    }
    const int nvd = a.nv * a.dv;
    for (int c = threadIdx.x; c < nvd; c += EX_PREP_THREADS)
        a.scr.v[(size_t)t * nvd + c] = valid ? conv_at(a, t, 2 * a.nk * dk + c) : 0.f;
    for (int h = threadIdx.x; h < a.nv; h += EX_PREP_THREADS) {
        double dec = 1, beta = 0;
        if (valid) {
            const float *row = a.P + (size_t)t * a.ldP + a.C + nvd;
            const double x = (double)row[a.nv + h] + a.dt_bias[h];
            const double sp = x > 20 ? x : log1p(exp(x));
            dec = exp(-exp((double)a.A_log[h]) * sp);
            beta = 1.0 / (1.0 + exp(-(double)row[h]));
        }
        a.scr.dec[(size_t)t * a.nv + h] = (float)dec;
        a.scr.beta[(size_t)t * a.nv + h] = (float)beta;
    }
}

template <int DKP>
__global__ void __launch_bounds__(32) gdn_exact_scan_kernel(gdn_exact_args a) {
    __shared__ float sk[DKP], sq[DKP];
    const int h = blockIdx.x, lane = threadIdx.x;
    const int j = blockIdx.y * 32 + lane;
    const bool ok = j < a.dv;
    const int dk = a.dk, hk = h / (a.nv / a.nk);
    const int len = ex_row(a);
    if (len < 1) return;
    float S[DKP];
    float *Sh = a.S + (size_t)h * dk * a.dv;
    const float *Sh_in = a.S_in + (size_t)h * dk * a.dv;
#pragma unroll
    for (int i = 0; i < DKP; i++) S[i] = ok && i < dk ? Sh_in[(size_t)i * a.dv + j] : 0.f;
    for (int t = 0; t < len; t++) {
        const float *kt = a.scr.k + (size_t)t * a.nk * dk + (size_t)hk * dk;
        const float *qt = a.scr.q + (size_t)t * a.nk * dk + (size_t)hk * dk;
        for (int i = lane; i < DKP; i += 32) {
            sk[i] = i < dk ? kt[i] : 0.f;
            sq[i] = i < dk ? qt[i] : 0.f;
        }
        __syncwarp();
        const float dec = a.scr.dec[(size_t)t * a.nv + h], beta = a.scr.beta[(size_t)t * a.nv + h];
        float kv[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int i = 0; i < DKP; i++) {
            S[i] *= dec;
            kv[i & 3] += S[i] * sk[i];
        }
        const float vj = ok ? a.scr.v[(size_t)t * a.nv * a.dv + (size_t)h * a.dv + j] : 0.f;
        const float delta = beta * (vj - ((kv[0] + kv[1]) + (kv[2] + kv[3])));
        float o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int i = 0; i < DKP; i++) {
            S[i] += sk[i] * delta;
            o[i & 3] += S[i] * sq[i];
        }
        if (ok) a.scr.o[(size_t)t * a.nv * a.dv + (size_t)h * a.dv + j] = (o[0] + o[1]) + (o[2] + o[3]);
        __syncwarp();
    }
#pragma unroll
    for (int i = 0; i < DKP; i++)
        if (ok && i < dk) Sh[(size_t)i * a.dv + j] = S[i];
}

__global__ void __launch_bounds__(EX_PREP_THREADS) gdn_exact_norm_kernel(gdn_exact_args a) {
    const int t = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int len = ex_row(a), dv = a.dv;
    for (int h = w; h < a.nv; h += EX_PREP_THREADS / 32) {
        const float *o = a.scr.o + (size_t)t * a.nv * dv + (size_t)h * dv;
        float *y = a.Y + (size_t)t * a.ldY + (size_t)h * dv;
        if (t >= len) {
            for (int d = lane; d < dv; d += 32) y[d] = 0.f;
            continue;
        }
        float ss = 0.f;
        for (int d = lane; d < dv; d += 32) ss += o[d] * o[d];
        ss = cu_warp_sum(ss);
        const float rs = (float)(1.0 / sqrt((double)ss / dv + a.eps));
        const float *z = a.P + (size_t)t * a.ldP + a.C + (size_t)h * dv;
        for (int d = lane; d < dv; d += 32) {
            const double zz = z[d];
            y[d] = (float)(o[d] * rs * a.norm_w[d] * (zz / (1.0 + exp(-zz))));
        }
    }
    /* the conv state moves on */
    if (len > 0)
        cu_conv_state_shift(a.conv_state, a.conv_in, a.P, a.ldP, a.C, a.K, len, blockIdx.x * EX_PREP_THREADS + threadIdx.x,
                        gridDim.x * EX_PREP_THREADS);
}

int cu_gdn_forward_exact(const cu_gdn_dims *d, const float *P, size_t conv_off, const float *conv_w,
                         const float *A_log, const float *dt_bias, const float *norm_w, size_t s_off, float *Y,
                         const cu_gdn_scratch *scr, const cu_batch *b, cudaStream_t st, squad_err *err) {
    if (d->dk > EX_MAX_DK) return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA exact: dk %d > %d", d->dk, EX_MAX_DK);
    const int C = 2 * d->nk * d->dk + d->nv * d->dv;
    const int rows = b->bucket;
    const unsigned nr = (unsigned)b->nrows;
    gdn_exact_args a = {P, d->ldP, NULL, NULL, NULL, conv_w, A_log, dt_bias, norm_w, NULL, Y, b->prm, s_off, conv_off,
                        d->nk, d->nv, d->dk, d->dv, d->K, C, rows, d->eps, *scr,
                        d->ldY > 0 ? d->ldY : d->nv * d->dv};
    gdn_exact_prep_kernel<<<dim3((unsigned)rows, 1, nr), EX_PREP_THREADS, 0, st>>>(a);
    CU_LAUNCH_CHECK("gdn_exact_prep_kernel");
    const dim3 grid((unsigned)d->nv, (unsigned)((d->dv + 31) / 32), nr);
    const int DKP = cu_gdn_pad(d->dk);
    if (DKP <= 16)
        gdn_exact_scan_kernel<16><<<grid, 32, 0, st>>>(a);
    else if (DKP <= 32)
        gdn_exact_scan_kernel<32><<<grid, 32, 0, st>>>(a);
    else if (DKP <= 64)
        gdn_exact_scan_kernel<64><<<grid, 32, 0, st>>>(a);
    else
        gdn_exact_scan_kernel<128><<<grid, 32, 0, st>>>(a);
    CU_LAUNCH_CHECK("gdn_exact_scan_kernel");
    gdn_exact_norm_kernel<<<dim3((unsigned)rows, 1, nr), EX_PREP_THREADS, 0, st>>>(a);
    CU_LAUNCH_CHECK("gdn_exact_norm_kernel");
    return 0;
}
