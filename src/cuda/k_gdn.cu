/*
 * k_gdn.cu — the Gated DeltaNet mixer between in_proj and out_proj, as two kernels.
 *
 * The math (DESIGN.md section 1), per value head with state S [dk][dv]:
 *   S_t = exp(g_t) S_{t-1} + k_t delta_t^T,  delta_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t),  o_t = S_t^T q_t.
 * Chunked (WY / UT) form over blocks of C = 64 tokens, gamma_t = sum_{s<=t} g_s inside the block,
 * Gamma_t = exp(gamma_t), S0 the state at the block start:
 *   L[t][j]  = beta_t exp(gamma_t - gamma_j) k_t.k_j   (j < t),   T = (I + L)^-1   (unit lower triangular)
 *   W = T diag(beta Gamma) K,   U = T diag(beta) V,   delta = U - W S0
 *   O = diag(Gamma) Q S0 + P delta,   P[t][j] = exp(gamma_t - gamma_j) q_t.k_j   (j <= t)
 *   S_C = Gamma_last S0 + K'^T delta,   K'_j = exp(gamma_last - gamma_j) k_j
 * Only differences gamma_t - gamma_j with j <= t are exponentiated, so nothing overflows. Padding
 * tokens (position >= len) get g = 0, beta = 0 and q = k = v = 0: their delta rows are exactly 0
 * and the state after the block is the state at the last real token.
 *
 * Kernel A (gdn_prep, grid blocks x heads, all independent): the causal conv over
 * [saved inputs | chunk] + SiLU, L2 norm of q / k, q * dk^-1/2, the gates, then L, T (blockwise
 * 16x16 inverse in fp32), W, U, P, diag(Gamma) Q and K'^T, written to scratch. The Gram products
 * use mma.sync (bf16 in, fp32 accumulate); T, W and U are fp32 FMA.
 * Kernel B (gdn_scan, one block per head, sequential over blocks): the state recurrence. Each warp
 * owns 16 columns of dv and keeps S^T [16][dk] in fp32 mma accumulators for the whole chunk, so
 * the state never leaves registers between blocks. Per block: delta^T = U^T - S^T W^T,
 * O^T = S^T (Gamma Q)^T + delta^T P^T, S^T = Gamma_last S^T + delta^T K' — all mma.sync, the
 * accumulator of one product reused as the A operand of the next (same fragment layout). Block
 * c+1's operands arrive by cp.async while block c computes. The epilogue is the gated RMSNorm
 * (o / rms(o) * w * silu(z)) over the head's dv, fused. Kernel B also moves the conv state on
 * (kernel A, which reads it, has finished).
 * The state is kept transposed, S^T [nv][dv][dk] fp32 (a backend-internal layout).
 * Head dims: the kernels are instantiated for dk, dv padded up to 16, 32, 64 or 128 (DK, DV
 * below); the padding channels of q, k, v are zero, so the padded rows / columns of S stay zero
 * and the gated norm reads only the real dv.
 */
#include "cuda_internal.cuh"
#include "cuda_test_api.h"

#include <math.h>
#include <stdlib.h>

#define GDN_C CU_GDN_CHUNK
#define PREP_THREADS 256
#define PREP_WARPS (PREP_THREADS / 32)

/* ---- kernel A: per (block of 64 tokens, value head) ------------------------------------------- */

struct gdn_prep_args {
    const bf16 *P;
    int ldP;
    const bf16 *conv_state; /* [K-1][C] */
    const float *conv_w;    /* [C][K] */
    const float *A_log, *dt_bias;
    const cu_chunk_params *prm;
    int nk, nv, K, C;
    int dk, dv; /* real head dims (<= DK, DV) */
    int rows;   /* the bucket */
    cu_gdn_scratch scr;
};

template <int DK, int DV>
struct prep_smem {
    static constexpr int LDK = DK + 8; /* bf16 row stride (bank-conflict padding) */
    static constexpr int LDL = GDN_C + 1;
    static constexpr size_t q_off = 0;
    static constexpr size_t k_off = q_off + (size_t)GDN_C * LDK * 2;
    static constexpr size_t v_off = k_off + (size_t)GDN_C * LDK * 2;
    static constexpr size_t l_off = v_off + (size_t)GDN_C * DV * 4;
    static constexpr size_t t_off = l_off + (size_t)GDN_C * LDL * 4;
    static constexpr size_t tmp_off = t_off + (size_t)GDN_C * LDL * 4;
    static constexpr size_t vec_off = tmp_off + (size_t)3 * 16 * 17 * 4;
    static constexpr size_t bytes = vec_off + (size_t)4 * GDN_C * 4;
};

template <int DK, int DV>
__global__ void __launch_bounds__(PREP_THREADS) gdn_prep_kernel(gdn_prep_args a) {
    typedef prep_smem<DK, DV> SM;
    constexpr int LDK = SM::LDK, LDL = SM::LDL;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)(smem + SM::q_off);
    bf16 *Ks = (bf16 *)(smem + SM::k_off);
    float *Vs = (float *)(smem + SM::v_off);
    float *Ls = (float *)(smem + SM::l_off);
    float *Ts = (float *)(smem + SM::t_off);
    float *tmp = (float *)(smem + SM::tmp_off);
    float *gam = (float *)(smem + SM::vec_off);
    float *Gam = gam + GDN_C;
    float *bet = Gam + GDN_C;
    float *gsc = bet + GDN_C;

    const int c = blockIdx.x, h = blockIdx.y;
    const int hk = h / (a.nv / a.nk);
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int len = a.prm->len;
    const int t0 = c * GDN_C;
    const int Km1 = a.K - 1;
    const size_t blk = (size_t)c * a.nv + h;

    for (int e = tid; e < GDN_C * LDL; e += PREP_THREADS) {
        Ls[e] = 0.f;
        Ts[e] = 0.f;
    }

    /* 1. conv + SiLU (+ L2 norm for q, k), one warp per row; lane: channels lane + 32 e */
    {
        constexpr int EQ = (DK + 31) / 32, EV = (DV + 31) / 32;
        const int dk = a.dk, dv = a.dv;
        const float qscale = rsqrtf((float)dk);
        for (int t = w; t < GDN_C; t += PREP_WARPS) {
            const int tt = t0 + t;
            const bool valid = tt < len;
            float q[EQ], k[EQ], v[EV];
#pragma unroll
            for (int e = 0; e < EQ; e++) q[e] = k[e] = 0.f;
#pragma unroll
            for (int e = 0; e < EV; e++) v[e] = 0.f;
            if (valid) {
                for (int j = 0; j < a.K; j++) {
                    const int tau = tt - Km1 + j;
                    const bf16 *row = tau >= 0 ? a.P + (size_t)tau * a.ldP
                                               : a.conv_state + (size_t)(Km1 + tau) * a.C;
#pragma unroll
                    for (int e = 0; e < EQ; e++) {
                        const int i = lane + 32 * e;
                        if (i < dk) {
                            const int cq = hk * dk + i, ck = a.nk * dk + cq;
                            q[e] += a.conv_w[(size_t)cq * a.K + j] * __bfloat162float(row[cq]);
                            k[e] += a.conv_w[(size_t)ck * a.K + j] * __bfloat162float(row[ck]);
                        }
                    }
#pragma unroll
                    for (int e = 0; e < EV; e++) {
                        const int i = lane + 32 * e;
                        if (i < dv) {
                            const int cv = 2 * a.nk * dk + h * dv + i;
                            v[e] += a.conv_w[(size_t)cv * a.K + j] * __bfloat162float(row[cv]);
                        }
                    }
                }
            }
            float sq = 0.f, sk = 0.f;
#pragma unroll
            for (int e = 0; e < EQ; e++) {
                q[e] = cu_silu(q[e]); /* silu(0) = 0: padding channels stay 0 */
                k[e] = cu_silu(k[e]);
                sq += q[e] * q[e];
                sk += k[e] * k[e];
            }
            sq = cu_warp_sum(sq);
            sk = cu_warp_sum(sk);
            const float rq = rsqrtf(sq + 1e-6f) * qscale, rk = rsqrtf(sk + 1e-6f);
#pragma unroll
            for (int e = 0; e < EQ; e++) {
                const int i = lane + 32 * e;
                if (i < DK) {
                    Qs[t * LDK + i] = __float2bfloat16(valid ? q[e] * rq : 0.f);
                    Ks[t * LDK + i] = __float2bfloat16(valid ? k[e] * rk : 0.f);
                }
            }
#pragma unroll
            for (int e = 0; e < EV; e++) {
                const int i = lane + 32 * e;
                if (i < DV) Vs[t * DV + i] = valid ? cu_silu(v[e]) : 0.f;
            }
        }
    }
    /* 2. gates and the cumulative log-decay */
    if (tid < GDN_C) {
        const int tt = t0 + tid;
        float g = 0.f, b = 0.f;
        if (tt < len) {
            const int zoff = a.C + a.nv * a.dv; /* b, a follow q, k, v and z */
            const float bv = __bfloat162float(a.P[(size_t)tt * a.ldP + zoff + h]);
            const float av = __bfloat162float(a.P[(size_t)tt * a.ldP + zoff + a.nv + h]);
            const float x = av + a.dt_bias[h];
            const float sp = x > 20.f ? x : log1pf(__expf(x));
            g = -__expf(a.A_log[h]) * sp;
            b = cu_sigmoid(bv);
        }
        gam[tid] = g;
        bet[tid] = b;
    }
    __syncthreads();
    if (w == 0) {
        const float v0 = gam[2 * lane], v1 = gam[2 * lane + 1];
        float s = v0 + v1;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float u = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += u;
        }
        const float ex = s - (v0 + v1);
        const float g0 = ex + v0, g1 = s;
        const float glast = __shfl_sync(0xffffffffu, s, 31);
        gam[2 * lane] = g0;
        gam[2 * lane + 1] = g1;
        Gam[2 * lane] = __expf(g0);
        Gam[2 * lane + 1] = __expf(g1);
        gsc[2 * lane] = __expf(glast - g0);
        gsc[2 * lane + 1] = __expf(glast - g1);
        if (lane == 31) a.scr.glast[blk] = __expf(glast);
    }
    __syncthreads();

    /* 3. K K^T -> L and Q K^T -> P (mma), warp w: rows 16 (w/2).., cols 32 (w%2).. */
    {
        const int mt = w >> 1, r = lane >> 2, cc = lane & 3;
        bf16 *Pm = a.scr.Pm + blk * GDN_C * GDN_C;
#pragma unroll
        for (int q4 = 0; q4 < 4; q4++) {
            const int nt = (w & 1) * 4 + q4;
            const int i0 = 16 * mt + r, i1 = i0 + 8, j0 = 8 * nt + 2 * cc;
            if (8 * nt > 16 * mt + 15) { /* above the diagonal: P is 0 there */
                *(uint32_t *)(Pm + i0 * GDN_C + j0) = 0u;
                *(uint32_t *)(Pm + i1 * GDN_C + j0) = 0u;
                continue;
            }
            float kk[4] = {0.f, 0.f, 0.f, 0.f}, qk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int ks = 0; ks < DK / 16; ks++) {
                const int k0 = 16 * ks + 2 * cc;
                uint32_t ak[4], aq[4];
                ak[0] = *(const uint32_t *)(Ks + i0 * LDK + k0);
                ak[1] = *(const uint32_t *)(Ks + i1 * LDK + k0);
                ak[2] = *(const uint32_t *)(Ks + i0 * LDK + k0 + 8);
                ak[3] = *(const uint32_t *)(Ks + i1 * LDK + k0 + 8);
                aq[0] = *(const uint32_t *)(Qs + i0 * LDK + k0);
                aq[1] = *(const uint32_t *)(Qs + i1 * LDK + k0);
                aq[2] = *(const uint32_t *)(Qs + i0 * LDK + k0 + 8);
                aq[3] = *(const uint32_t *)(Qs + i1 * LDK + k0 + 8);
                const uint32_t b0 = *(const uint32_t *)(Ks + (8 * nt + r) * LDK + k0);
                const uint32_t b1 = *(const uint32_t *)(Ks + (8 * nt + r) * LDK + k0 + 8);
                cu_mma16816(kk, ak, b0, b1);
                cu_mma16816(qk, aq, b0, b1);
            }
            const int ii[4] = {i0, i0, i1, i1}, jj[4] = {j0, j0 + 1, j0, j0 + 1};
            float pv[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = ii[e], j = jj[e];
                const float dec = j <= i ? __expf(gam[i] - gam[j]) : 0.f;
                if (j < i) Ls[i * LDL + j] = bet[i] * dec * kk[e];
                pv[e] = dec * qk[e];
            }
            *(uint32_t *)(Pm + i0 * GDN_C + j0) = cu_pack_bf16(pv[0], pv[1]);
            *(uint32_t *)(Pm + i1 * GDN_C + j0) = cu_pack_bf16(pv[2], pv[3]);
        }
    }
    __syncthreads();

    /* 4. T = (I + L)^-1: 16x16 diagonal blocks by forward substitution, then block rows */
    if (w < 4 && lane < 16) {
        const int b = w, col = lane;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; r++) {
            float s = r == col ? 1.f : 0.f;
#pragma unroll
            for (int j = 0; j < r; j++) s -= Ls[(16 * b + r) * LDL + 16 * b + j] * x[j];
            x[r] = s;
        }
#pragma unroll
        for (int r = 0; r < 16; r++) Ts[(16 * b + r) * LDL + 16 * b + col] = x[r];
    }
    __syncthreads();
    for (int i = 1; i < 4; i++) {
        for (int e = tid; e < i * 256; e += PREP_THREADS) {
            const int j = e >> 8, rr = (e >> 4) & 15, cc = e & 15;
            float s = 0.f;
            for (int m = j; m < i; m++)
#pragma unroll
                for (int q = 0; q < 16; q++) s += Ls[(16 * i + rr) * LDL + 16 * m + q] * Ts[(16 * m + q) * LDL + 16 * j + cc];
            tmp[(j * 16 + rr) * 17 + cc] = s;
        }
        __syncthreads();
        for (int e = tid; e < i * 256; e += PREP_THREADS) {
            const int j = e >> 8, rr = (e >> 4) & 15, cc = e & 15;
            float s = 0.f;
#pragma unroll
            for (int q = 0; q < 16; q++) s += Ts[(16 * i + rr) * LDL + 16 * i + q] * tmp[(j * 16 + q) * 17 + cc];
            Ts[(16 * i + rr) * LDL + 16 * j + cc] = -s;
        }
        __syncthreads();
    }

    /* 5. W = T diag(beta Gamma) K (warp: 8 rows; lane: columns lane + 32 e) */
    {
        constexpr int EQ = (DK + 31) / 32;
        float acc[8][EQ];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < EQ; e++) acc[i][e] = 0.f;
        const int tmax = 8 * w + 7;
        for (int tp = 0; tp <= tmax; tp++) {
            const float s = bet[tp] * Gam[tp];
            float kv[EQ];
#pragma unroll
            for (int e = 0; e < EQ; e++) kv[e] = lane + 32 * e < DK ? __bfloat162float(Ks[tp * LDK + lane + 32 * e]) : 0.f;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float av = Ts[(8 * w + i) * LDL + tp] * s;
#pragma unroll
                for (int e = 0; e < EQ; e++) acc[i][e] += av * kv[e];
            }
        }
        bf16 *W = a.scr.W + blk * GDN_C * DK;
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < EQ; e++)
                if (lane + 32 * e < DK) W[(8 * w + i) * DK + lane + 32 * e] = __float2bfloat16(acc[i][e]);
    }
    /* U^T = (T diag(beta) V)^T (lane: rows t, warp: DV/8 columns) */
    {
        constexpr int UPW = DV / PREP_WARPS;
        float acc[2][UPW];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < UPW; j++) acc[i][j] = 0.f;
        for (int tp = 0; tp < GDN_C; tp++) {
            const float s = bet[tp];
            const float a0 = Ts[lane * LDL + tp] * s, a1 = Ts[(lane + 32) * LDL + tp] * s;
#pragma unroll
            for (int j = 0; j < UPW; j++) {
                const float vv = Vs[tp * DV + w * UPW + j];
                acc[0][j] += a0 * vv;
                acc[1][j] += a1 * vv;
            }
        }
        float *UT = a.scr.UT + blk * DV * GDN_C;
#pragma unroll
        for (int j = 0; j < UPW; j++) {
            UT[(w * UPW + j) * GDN_C + lane] = acc[0][j];
            UT[(w * UPW + j) * GDN_C + lane + 32] = acc[1][j];
        }
    }
    /* diag(Gamma) Q and K'^T */
    {
        bf16 *Qg = a.scr.Qg + blk * GDN_C * DK;
        for (int e = tid; e < GDN_C * DK; e += PREP_THREADS) {
            const int t = e / DK, d = e % DK;
            Qg[e] = __float2bfloat16(Gam[t] * __bfloat162float(Qs[t * LDK + d]));
        }
        bf16 *KpT = a.scr.KpT + blk * DK * GDN_C;
        for (int e = tid; e < GDN_C * DK; e += PREP_THREADS) {
            const int d = e / GDN_C, t = e % GDN_C;
            KpT[e] = __float2bfloat16(gsc[t] * __bfloat162float(Ks[t * LDK + d]));
        }
    }
}

/* ---- kernel B: one block per value head, sequential over blocks of 64 tokens -------------------- */

struct gdn_scan_args {
    const bf16 *P;
    int ldP;
    bf16 *conv_state; /* [K-1][C], moved on to the chunk's end */
    const float *norm_w;
    float *S; /* [nv][DV][DK] (padded) */
    bf16 *Y;  /* [rows][nv dv] (real dv) */
    const cu_chunk_params *prm;
    int nk, nv, K, C;
    int dv; /* real */
    int rows;
    float eps;
    cu_gdn_scratch scr;
};

template <int DK, int DV>
struct scan_smem {
    static constexpr int LDW = DK + 8;     /* W, Qg rows [64][DK] */
    static constexpr int LDT = GDN_C + 8;  /* K'^T rows [DK][64], P rows [64][64] */
    static constexpr int LDO = DV + 4;     /* O rows (fp32) */
    static constexpr size_t w_off = 0;
    static constexpr size_t q_off = w_off + (size_t)GDN_C * LDW * 2;
    static constexpr size_t k_off = q_off + (size_t)GDN_C * LDW * 2;
    static constexpr size_t p_off = k_off + (size_t)DK * LDT * 2;
    static constexpr size_t stage = p_off + (size_t)GDN_C * LDT * 2;
    static constexpr size_t o_off = 2 * stage;
    static constexpr size_t bytes = o_off + (size_t)GDN_C * LDO * 4;
};

template <int DK, int DV>
__device__ __forceinline__ void scan_prefetch(unsigned char *st, const cu_gdn_scratch &scr, size_t blk, int tid,
                                              int nthreads) {
    typedef scan_smem<DK, DV> SM;
    bf16 *Ws = (bf16 *)(st + SM::w_off), *Qs = (bf16 *)(st + SM::q_off);
    bf16 *Ks = (bf16 *)(st + SM::k_off), *Ps = (bf16 *)(st + SM::p_off);
    const bf16 *W = scr.W + blk * GDN_C * DK, *Q = scr.Qg + blk * GDN_C * DK;
    const bf16 *K = scr.KpT + blk * DK * GDN_C, *Pm = scr.Pm + blk * GDN_C * GDN_C;
    constexpr int SW = DK / 8; /* 16-byte segments per row */
    for (int e = tid; e < GDN_C * SW; e += nthreads) {
        const int r = e / SW, s = e % SW;
        cu_cp_async16(Ws + r * SM::LDW + 8 * s, W + r * DK + 8 * s, 16);
        cu_cp_async16(Qs + r * SM::LDW + 8 * s, Q + r * DK + 8 * s, 16);
    }
    for (int e = tid; e < DK * 8; e += nthreads) {
        const int r = e >> 3, s = e & 7;
        cu_cp_async16(Ks + r * SM::LDT + 8 * s, K + r * GDN_C + 8 * s, 16);
    }
    for (int e = tid; e < GDN_C * 8; e += nthreads) {
        const int r = e >> 3, s = e & 7;
        cu_cp_async16(Ps + r * SM::LDT + 8 * s, Pm + r * GDN_C + 8 * s, 16);
    }
}

template <int DK, int DV>
__global__ void __launch_bounds__(DV * 2) gdn_scan_kernel(gdn_scan_args a) {
    typedef scan_smem<DK, DV> SM;
    constexpr int NW = DV / 16, NT = NW * 32;
    constexpr int NJ = DK / 8;  /* n-tiles of S^T along dk */
    constexpr int NKS = DK / 16; /* k-steps along dk */
    extern __shared__ __align__(16) unsigned char smem[];
    float *Os = (float *)(smem + SM::o_off);
    const int h = blockIdx.x, tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int r = lane >> 2, cc = lane & 3;
    const int len = a.prm->len;
    const int nc = (a.rows + GDN_C - 1) / GDN_C;
    int nreal = (len + GDN_C - 1) / GDN_C;
    if (nreal > nc) nreal = nc;

    /* the conv state moves on: new[j] = [old | P][len + j] (kernel A has read the old one) */
    {
        const int Km1 = a.K - 1;
        for (int ch = h * NT + tid; ch < a.C; ch += a.nv * NT)
            for (int j = 0; j < Km1; j++) {
                const int src = len + j; /* index into [old (K-1) | chunk] */
                const bf16 v = src < Km1 ? a.conv_state[(size_t)src * a.C + ch] : a.P[(size_t)(src - Km1) * a.ldP + ch];
                a.conv_state[(size_t)j * a.C + ch] = v;
            }
    }

    /* S^T slice [16 w .. 16 w + 16) x [0, DK) in accumulators */
    float Sacc[NJ][4];
    float *Sh = a.S + (size_t)h * DV * DK;
    const int n0 = 16 * w + r;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const float2 lo = *(const float2 *)(Sh + (size_t)n0 * DK + 8 * j + 2 * cc);
        const float2 hi = *(const float2 *)(Sh + (size_t)(n0 + 8) * DK + 8 * j + 2 * cc);
        Sacc[j][0] = lo.x;
        Sacc[j][1] = lo.y;
        Sacc[j][2] = hi.x;
        Sacc[j][3] = hi.y;
    }

    scan_prefetch<DK, DV>(smem, a.scr, (size_t)h, tid, NT);
    cu_cp_async_commit();

    const int zoff = a.C; /* z follows q, k, v */
    for (int ci = 0; ci < nreal; ci++) {
        const size_t blk = (size_t)ci * a.nv + h;
        unsigned char *st = smem + (ci & 1) * SM::stage;
        const bf16 *Ws = (const bf16 *)(st + SM::w_off), *Qs = (const bf16 *)(st + SM::q_off);
        const bf16 *Ks = (const bf16 *)(st + SM::k_off), *Ps = (const bf16 *)(st + SM::p_off);

        float D[8][4]; /* delta^T [16][64], initialised with U^T */
        const float *UT = a.scr.UT + blk * DV * GDN_C;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float2 lo = *(const float2 *)(UT + n0 * GDN_C + 8 * j + 2 * cc);
            const float2 hi = *(const float2 *)(UT + (n0 + 8) * GDN_C + 8 * j + 2 * cc);
            D[j][0] = lo.x;
            D[j][1] = lo.y;
            D[j][2] = hi.x;
            D[j][3] = hi.y;
        }
        const float gl = a.scr.glast[blk];

        cu_cp_async_wait<0>();
        __syncthreads();
        if (ci + 1 < nreal) {
            scan_prefetch<DK, DV>(smem + ((ci + 1) & 1) * SM::stage, a.scr, (size_t)(ci + 1) * a.nv + h, tid, NT);
            cu_cp_async_commit();
        }

        /* -S^T as bf16 A fragments */
        uint32_t nS[NKS][4];
#pragma unroll
        for (int ks = 0; ks < NKS; ks++) {
            nS[ks][0] = cu_pack_bf16(-Sacc[2 * ks][0], -Sacc[2 * ks][1]);
            nS[ks][1] = cu_pack_bf16(-Sacc[2 * ks][2], -Sacc[2 * ks][3]);
            nS[ks][2] = cu_pack_bf16(-Sacc[2 * ks + 1][0], -Sacc[2 * ks + 1][1]);
            nS[ks][3] = cu_pack_bf16(-Sacc[2 * ks + 1][2], -Sacc[2 * ks + 1][3]);
        }
        /* delta^T = U^T - S^T W^T;  O^T = -(-S^T Qg^T) */
        float O[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            O[j][0] = O[j][1] = O[j][2] = O[j][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < NKS; ks++) {
                const int k0 = 16 * ks + 2 * cc;
                const uint32_t w0 = *(const uint32_t *)(Ws + (8 * j + r) * SM::LDW + k0);
                const uint32_t w1 = *(const uint32_t *)(Ws + (8 * j + r) * SM::LDW + k0 + 8);
                cu_mma16816(D[j], nS[ks], w0, w1);
                const uint32_t q0 = *(const uint32_t *)(Qs + (8 * j + r) * SM::LDW + k0);
                const uint32_t q1 = *(const uint32_t *)(Qs + (8 * j + r) * SM::LDW + k0 + 8);
                cu_mma16816(O[j], nS[ks], q0, q1);
            }
            O[j][0] = -O[j][0];
            O[j][1] = -O[j][1];
            O[j][2] = -O[j][2];
            O[j][3] = -O[j][3];
        }
        /* delta^T as A fragments (k = tokens) */
        uint32_t dF[4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            dF[ks][0] = cu_pack_bf16(D[2 * ks][0], D[2 * ks][1]);
            dF[ks][1] = cu_pack_bf16(D[2 * ks][2], D[2 * ks][3]);
            dF[ks][2] = cu_pack_bf16(D[2 * ks + 1][0], D[2 * ks + 1][1]);
            dF[ks][3] = cu_pack_bf16(D[2 * ks + 1][2], D[2 * ks + 1][3]);
        }
        /* O^T += delta^T P^T (P lower triangular: k-steps up to the diagonal) */
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int ks = 0; ks <= j / 2; ks++) {
                const int k0 = 16 * ks + 2 * cc;
                const uint32_t p0 = *(const uint32_t *)(Ps + (8 * j + r) * SM::LDT + k0);
                const uint32_t p1 = *(const uint32_t *)(Ps + (8 * j + r) * SM::LDT + k0 + 8);
                cu_mma16816(O[j], dF[ks], p0, p1);
            }
        /* S^T = Gamma_last S^T + delta^T K' */
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            Sacc[j][0] *= gl;
            Sacc[j][1] *= gl;
            Sacc[j][2] *= gl;
            Sacc[j][3] *= gl;
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                const int k0 = 16 * ks + 2 * cc;
                const uint32_t k0v = *(const uint32_t *)(Ks + (8 * j + r) * SM::LDT + k0);
                const uint32_t k1v = *(const uint32_t *)(Ks + (8 * j + r) * SM::LDT + k0 + 8);
                cu_mma16816(Sacc[j], dF[ks], k0v, k1v);
            }
        }
        /* O^T -> Os[t][n] */
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int t = 8 * j + 2 * cc;
            Os[t * SM::LDO + n0] = O[j][0];
            Os[(t + 1) * SM::LDO + n0] = O[j][1];
            Os[t * SM::LDO + n0 + 8] = O[j][2];
            Os[(t + 1) * SM::LDO + n0 + 8] = O[j][3];
        }
        __syncthreads();
        /* gated RMSNorm over the head's real dv, one warp per token row */
        constexpr int EV = (DV + 31) / 32;
        const int dv = a.dv;
        for (int t = w; t < GDN_C; t += NW) {
            const int tt = ci * GDN_C + t;
            if (tt >= a.rows) break;
            bf16 *y = a.Y + (size_t)tt * a.nv * dv + h * dv;
            if (tt >= len) {
                for (int d = lane; d < dv; d += 32) y[d] = __float2bfloat16(0.f);
                continue;
            }
            float o[EV], ss = 0.f;
#pragma unroll
            for (int e = 0; e < EV; e++) {
                const int d = lane + 32 * e;
                o[e] = d < dv ? Os[t * SM::LDO + d] : 0.f;
                ss += o[e] * o[e];
            }
            ss = cu_warp_sum(ss);
            const float rs = rsqrtf(ss / (float)dv + a.eps);
            const bf16 *z = a.P + (size_t)tt * a.ldP + zoff + h * dv;
#pragma unroll
            for (int e = 0; e < EV; e++) {
                const int d = lane + 32 * e;
                if (d < dv) y[d] = __float2bfloat16(o[e] * rs * a.norm_w[d] * cu_silu(__bfloat162float(z[d])));
            }
        }
    }
    cu_cp_async_wait<0>();
    /* rows of padding-only blocks */
    for (int tt = nreal * GDN_C + w; tt < a.rows; tt += NW)
        for (int d = lane; d < a.dv; d += 32) a.Y[(size_t)tt * a.nv * a.dv + h * a.dv + d] = __float2bfloat16(0.f);
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        *(float2 *)(Sh + (size_t)n0 * DK + 8 * j + 2 * cc) = make_float2(Sacc[j][0], Sacc[j][1]);
        *(float2 *)(Sh + (size_t)(n0 + 8) * DK + 8 * j + 2 * cc) = make_float2(Sacc[j][2], Sacc[j][3]);
    }
}

/* ---- host side -------------------------------------------------------------------------------- */

/* Padded head dims instantiated: DK, DV in {16, 32, 64, 128}. */
#define GDN_SHAPES(X)                                                                                   \
    X(16, 16) X(16, 32) X(32, 16) X(32, 32) X(32, 64) X(64, 32) X(64, 64) X(64, 128) X(128, 64) X(128, 128)

int cu_gdn_pad(int x) {
    const int p = (x + 15) & ~15;
    return p == 48 ? 64 : (p > 64 && p < 128 ? 128 : p);
}

static int gdn_shape_ok(int DKP, int DVP) {
#define GDN_SUP(DK_, DV_) if (DKP == DK_ && DVP == DV_) return 1;
    GDN_SHAPES(GDN_SUP)
#undef GDN_SUP
    return 0;
}

int cu_gdn_supported(const cu_gdn_dims *d) {
    const int base = d->nk > 0 && d->nv > 0 && d->nv % d->nk == 0 && d->K >= 1 && d->K <= CU_MAX_CONV_K &&
                     d->dk >= 1 && d->dv >= 1 && d->dk <= 128;
    return base && (d->f32 || gdn_shape_ok(cu_gdn_pad(d->dk), cu_gdn_pad(d->dv)));
}

size_t cu_gdn_state_bytes(const cu_gdn_dims *d) {
    if (d->f32) return (size_t)d->nv * d->dk * d->dv * 4;
    return (size_t)d->nv * cu_gdn_pad(d->dk) * cu_gdn_pad(d->dv) * 4;
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

size_t cu_gdn_scratch_bytes(const cu_gdn_dims *d, int rows) {
    if (d->f32)
        return 2 * align256((size_t)rows * d->nk * d->dk * 4) + 2 * align256((size_t)rows * d->nv * d->dv * 4) +
               2 * align256((size_t)rows * d->nv * 4);
    const size_t nb = (size_t)((rows + GDN_C - 1) / GDN_C) * d->nv;
    const size_t DK = cu_gdn_pad(d->dk), DV = cu_gdn_pad(d->dv);
    return align256(nb * GDN_C * DK * 2) * 2 + align256(nb * DV * GDN_C * 4) + align256(nb * DK * GDN_C * 2) +
           align256(nb * GDN_C * GDN_C * 2) + align256(nb * 4);
}

void cu_gdn_scratch_bind(cu_gdn_scratch *s, void *base, const cu_gdn_dims *d, int rows) {
    const size_t nb = (size_t)((rows + GDN_C - 1) / GDN_C) * d->nv;
    const size_t DK = cu_gdn_pad(d->dk), DV = cu_gdn_pad(d->dv);
    unsigned char *p = (unsigned char *)base;
    memset(s, 0, sizeof *s);
    if (d->f32) {
        s->q = (float *)p;
        p += align256((size_t)rows * d->nk * d->dk * 4);
        s->k = (float *)p;
        p += align256((size_t)rows * d->nk * d->dk * 4);
        s->v = (float *)p;
        p += align256((size_t)rows * d->nv * d->dv * 4);
        s->o = (float *)p;
        p += align256((size_t)rows * d->nv * d->dv * 4);
        s->dec = (float *)p;
        p += align256((size_t)rows * d->nv * 4);
        s->beta = (float *)p;
        return;
    }
    s->W = (bf16 *)p;
    p += align256(nb * GDN_C * DK * 2);
    s->Qg = (bf16 *)p;
    p += align256(nb * GDN_C * DK * 2);
    s->UT = (float *)p;
    p += align256(nb * DV * GDN_C * 4);
    s->KpT = (bf16 *)p;
    p += align256(nb * DK * GDN_C * 2);
    s->Pm = (bf16 *)p;
    p += align256(nb * GDN_C * GDN_C * 2);
    s->glast = (float *)p;
}

int cu_gdn_init(const cu_gdn_dims *d, squad_err *err) {
    if (d->f32) return 0;
    const int DKP = cu_gdn_pad(d->dk), DVP = cu_gdn_pad(d->dv);
#define GDN_INIT(DK_, DV_)                                                                                          \
    if (DKP == DK_ && DVP == DV_) {                                                                                 \
        CU_TRY(cudaFuncSetAttribute(gdn_prep_kernel<DK_, DV_>, cudaFuncAttributeMaxDynamicSharedMemorySize,          \
                                    (int)prep_smem<DK_, DV_>::bytes));                                              \
        CU_TRY(cudaFuncSetAttribute(gdn_scan_kernel<DK_, DV_>, cudaFuncAttributeMaxDynamicSharedMemorySize,          \
                                    (int)scan_smem<DK_, DV_>::bytes));                                              \
        return 0;                                                                                                   \
    }
    GDN_SHAPES(GDN_INIT)
#undef GDN_INIT
    return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA: linear attention head dims dk %d, dv %d not supported", d->dk,
                      d->dv);
}

int cu_gdn_forward(const cu_gdn_dims *d, const void *Pv, void *conv_state_v, const float *conv_w, const float *A_log,
                   const float *dt_bias, const float *norm_w, float *S, void *Yv, const cu_gdn_scratch *scr,
                   const cu_chunk_params *prm, int rows, cudaStream_t st, squad_err *err) {
    if (d->f32)
        return cu_gdn_forward_exact(d, (const float *)Pv, (float *)conv_state_v, conv_w, A_log, dt_bias, norm_w, S,
                                    (float *)Yv, scr, prm, rows, st, err);
    const bf16 *P = (const bf16 *)Pv;
    bf16 *conv_state = (bf16 *)conv_state_v, *Y = (bf16 *)Yv;
    const int C = 2 * d->nk * d->dk + d->nv * d->dv;
    const int nc = (rows + GDN_C - 1) / GDN_C;
    const int DKP = cu_gdn_pad(d->dk), DVP = cu_gdn_pad(d->dv);
    gdn_prep_args pa = {P, d->ldP, conv_state, conv_w, A_log, dt_bias, prm, d->nk, d->nv, d->K, C, d->dk, d->dv, rows,
                        *scr};
    gdn_scan_args sa = {P, d->ldP, conv_state, norm_w, S, Y, prm, d->nk, d->nv, d->K, C, d->dv, rows, d->eps, *scr};
#define GDN_RUN(DK_, DV_)                                                                                          \
    if (DKP == DK_ && DVP == DV_) {                                                                                \
        gdn_prep_kernel<DK_, DV_><<<dim3(nc, d->nv), PREP_THREADS, prep_smem<DK_, DV_>::bytes, st>>>(pa);          \
        CU_LAUNCH_CHECK("gdn_prep_kernel");                                                                        \
        gdn_scan_kernel<DK_, DV_><<<d->nv, DV_ * 2, scan_smem<DK_, DV_>::bytes, st>>>(sa);                          \
        CU_LAUNCH_CHECK("gdn_scan_kernel");                                                                        \
        return 0;                                                                                                  \
    }
    GDN_SHAPES(GDN_RUN)
#undef GDN_RUN
    return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA: linear attention head dims dk %d, dv %d not supported", d->dk,
                      d->dv);
}

/* ---- host reference: the per-token recurrence (the test oracle) -------------------------------- */

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
