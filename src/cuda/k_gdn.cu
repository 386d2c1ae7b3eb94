/*
 * k_gdn.cu — the Gated DeltaNet mixer between in_proj and out_proj on the tensor cores (the bf16 path).
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
 * Three kernels (v2; bench/CUDA_NOTES.md has v1's figures):
 * A, gdn_prep (grid blocks x heads, all independent, 256 threads): the gates and the cumulative
 *   decay; the causal conv over [saved inputs | chunk] + SiLU with one thread per channel sliding a
 *   register window down the block's 64 rows; the L2 norms of q / k (row sums by segmented warp
 *   sums); K K^T and Q K^T on the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate) giving
 *   L and P; T = (I + L)^-1 in fp32 by forward substitution down each column (4 threads a column);
 *   W and U by fp32 FMA (bf16 there cost too much accuracy). Writes W, U^T, P, diag(Gamma) Q, K'
 *   and Gamma_last to scratch, all row-major and coalesced.
 * B, gdn_scan (one block per value head and 32 columns of dv, sequential over the blocks): only the
 *   recurrence. Each warp keeps S^T [16][dk] in fp32 mma accumulators for the whole chunk;
 *   per block delta^T = U^T - S^T W^T and S^T = Gamma_last S^T + delta^T K' (K' fragments by
 *   ldmatrix.trans), the accumulator of one product reused as the A operand of the next (the same
 *   fragment layout); block c+1's operands
 *   arrive by cp.async while block c computes. Writes S^T at each block start and delta^T (bf16).
 * C, gdn_out (grid blocks x heads, all independent): O = diag(Gamma) Q S + P delta on the tensor
 *   cores, the gated RMSNorm (o / rms(o) * w * silu(z)) in registers, bf16 out; and the conv state
 *   moved on to the chunk's end (A, which read it, has finished).
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

#define GDN_LDT (GDN_C + 8) /* bf16 row stride of [x][64] tiles (bank-conflict padding) */
#define CONV_BATCH 16       /* conv input loads in flight per thread */

template <int DK, int DV>
struct prep_smem {
    static constexpr int LDK = DK + 8; /* bf16 row stride of [64][DK] tiles */
    static constexpr int LDL = GDN_C + 1;
    static constexpr size_t q_off = 0;                                   /* Qs [64][LDK] bf16 */
    static constexpr size_t k_off = q_off + (size_t)GDN_C * LDK * 2;     /* Ks [64][LDK] bf16 */
    static constexpr size_t v_off = k_off + (size_t)GDN_C * LDK * 2;     /* V [64][DV] fp32 */
    static constexpr size_t l_off = v_off + (size_t)GDN_C * DV * 4;      /* L [64][LDL] fp32 */
    static constexpr size_t t_off = l_off + (size_t)GDN_C * LDL * 4;     /* T [64][LDL] fp32 */
    static constexpr size_t vec_off = t_off + (size_t)GDN_C * LDL * 4;
    static constexpr size_t bytes = vec_off + (size_t)6 * GDN_C * 4;
};

/* y[t] = silu(conv(x)[t0 + t]) for one channel over the 64 rows of a block, 0 past len or for a
 * padding channel. The window of the last CU_MAX_CONV_K inputs stays in registers, aligned to its
 * end (win[7] is the newest), so the runtime kernel size never indexes an array. */
__device__ __forceinline__ void conv_rows(const gdn_prep_args &a, int ch, bool real, int t0, int len,
                                          float (&y)[GDN_C]) {
    constexpr int MK = CU_MAX_CONV_K;
    const int K = a.K, Km1 = K - 1, off = MK - K;
    float wv[MK], win[MK];
    /* weights aligned to the window's end: wv[j] multiplies x(t - (MK - 1 - j)) */
#pragma unroll
    for (int j = 0; j < MK; j++) {
        const int jj = j - off;
        wv[j] = real && jj >= 0 ? a.conv_w[(size_t)ch * K + jj] : 0.f;
    }
    /* before the first shift win[m] = x(t0 - (MK - m)), m >= 1, for the K - 1 positions the conv reads
     * ([saved inputs | chunk]); the rest stay 0 (their weights are 0) */
    win[0] = 0.f;
#pragma unroll
    for (int m = 1; m < MK; m++) {
        const int back = MK - m, tau = t0 - back;
        float x = 0.f;
        if (real && back <= Km1 && t0 < len)
            x = tau >= 0 ? __bfloat162float(a.P[(size_t)tau * a.ldP + ch])
                         : __bfloat162float(a.conv_state[(size_t)(Km1 + tau) * a.C + ch]);
        win[m] = x;
    }
    /* the rows' inputs in batches of CONV_BATCH independent loads (one round trip per batch) */
#pragma unroll
    for (int tb = 0; tb < GDN_C; tb += CONV_BATCH) {
        float xb[CONV_BATCH];
#pragma unroll
        for (int u = 0; u < CONV_BATCH; u++) {
            const int tt = t0 + tb + u;
            xb[u] = real && tt < len ? __bfloat162float(a.P[(size_t)tt * a.ldP + ch]) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < CONV_BATCH; u++) {
#pragma unroll
            for (int j = 0; j < MK - 1; j++) win[j] = win[j + 1];
            win[MK - 1] = xb[u];
            float acc = 0.f;
#pragma unroll
            for (int j = 0; j < MK; j++) acc += wv[j] * win[j];
            y[tb + u] = real && t0 + tb + u < len ? cu_silu(acc) : 0.f;
        }
    }
}

template <int DK, int DV>
__global__ void __launch_bounds__(PREP_THREADS, 2) gdn_prep_kernel(gdn_prep_args a) {
    typedef prep_smem<DK, DV> SM;
    constexpr int LDK = SM::LDK, LDL = SM::LDL;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)(smem + SM::q_off);
    bf16 *Ks = (bf16 *)(smem + SM::k_off);
    float *Vs = (float *)(smem + SM::v_off);
    float *Ls = (float *)(smem + SM::l_off);
    float *Ts = (float *)(smem + SM::t_off);
    float *gam = (float *)(smem + SM::vec_off);
    float *Gam = gam + GDN_C, *bet = Gam + GDN_C, *gsc = bet + GDN_C, *ssq = gsc + GDN_C; /* ssq: q then k */

    const int c = blockIdx.x, h = blockIdx.y;
    const int hk = h / (a.nv / a.nk);
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int len = a.prm->len;
    const int t0 = c * GDN_C;
    const size_t blk = (size_t)c * a.nv + h;
    const int dk = a.dk, dv = a.dv;

    /* 0. gates; zero the row sums */
    if (tid < GDN_C) {
        const int tt = t0 + tid;
        float g = 0.f, b = 0.f;
        if (tt < len) {
            const int boff = a.C + a.nv * dv; /* b, a follow q, k, v and z */
            const float bv = __bfloat162float(a.P[(size_t)tt * a.ldP + boff + h]);
            const float av = __bfloat162float(a.P[(size_t)tt * a.ldP + boff + a.nv + h]);
            const float x = av + a.dt_bias[h];
            const float sp = x > 20.f ? x : log1pf(__expf(x));
            g = -__expf(a.A_log[h]) * sp;
            b = cu_sigmoid(bv);
        }
        gam[tid] = g;
        bet[tid] = b;
        ssq[tid] = 0.f;
        ssq[GDN_C + tid] = 0.f;
    }
    __syncthreads();
    if (w == 0) { /* cumulative log-decay (warp 0; the others run the conv meanwhile) */
        const float v0 = gam[2 * lane], v1 = gam[2 * lane + 1];
        float s = v0 + v1;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float u = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += u;
        }
        const float g0 = s - v1, g1 = s;
        const float glast = __shfl_sync(0xffffffffu, s, 31);
        gam[2 * lane] = g0;
        gam[2 * lane + 1] = g1;
        Gam[2 * lane] = __expf(g0);
        Gam[2 * lane + 1] = __expf(g1);
        gsc[2 * lane] = __expf(glast - g0);
        gsc[2 * lane + 1] = __expf(glast - g1);
        if (lane == 31) a.scr.glast[blk] = __expf(glast);
    }

    /* 1. the conv, one thread per channel over the block's rows: v first (fp32, for U) */
    float y[GDN_C];
    for (int i = tid; i < DV; i += PREP_THREADS) {
        conv_rows(a, 2 * a.nk * dk + h * dv + i, i < dv, t0, len, y);
#pragma unroll
        for (int t = 0; t < GDN_C; t++) Vs[t * DV + i] = y[t];
    }
    /* q, k: threads [0, DK) q, [DK, 2 DK) k; per-row sums of squares by segmented warp sums */
    const bool qk = tid < 2 * DK;
    const bool isk = tid >= DK;
    const int i = isk ? tid - DK : tid;
    if (qk) {
        const int ch = isk ? a.nk * dk + hk * dk + i : hk * dk + i;
        conv_rows(a, ch, i < dk, t0, len, y);
    } else {
#pragma unroll
        for (int t = 0; t < GDN_C; t++) y[t] = 0.f;
    }
    constexpr int SEG = DK < 32 ? DK : 32;
#pragma unroll
    for (int t = 0; t < GDN_C; t++) {
        float s2 = y[t] * y[t];
#pragma unroll
        for (int o = SEG / 2; o > 0; o >>= 1) s2 += __shfl_xor_sync(0xffffffffu, s2, o);
        if (qk && (lane & (SEG - 1)) == 0) atomicAdd(&ssq[(isk ? GDN_C : 0) + t], s2);
    }
    __syncthreads();

    /* 2. normalise: Qs, Ks (bf16 for the products), and straight to global (coalesced)
     *    diag(Gamma) Q and K' = diag(exp(gamma_last - gamma)) K */
    if (qk) {
        const float sc = isk ? 1.f : rsqrtf((float)dk);
        bf16 *Qg = a.scr.Qg + blk * GDN_C * DK;
        bf16 *Kp = a.scr.Kp + blk * GDN_C * DK;
#pragma unroll
        for (int t = 0; t < GDN_C; t++) {
            const float v = y[t] * rsqrtf(ssq[(isk ? GDN_C : 0) + t] + 1e-6f) * sc;
            if (!isk) {
                Qs[t * LDK + i] = __float2bfloat16(v);
                Qg[t * DK + i] = __float2bfloat16(Gam[t] * v);
            } else {
                Ks[t * LDK + i] = __float2bfloat16(v);
                Kp[t * DK + i] = __float2bfloat16(gsc[t] * v);
            }
        }
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
            float kk[4] = {0.f, 0.f, 0.f, 0.f}, qk4[4] = {0.f, 0.f, 0.f, 0.f};
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
                cu_mma16816(qk4, aq, b0, b1);
            }
            const int ii[4] = {i0, i0, i1, i1}, jj[4] = {j0, j0 + 1, j0, j0 + 1};
            float pv[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int ri = ii[e], cj = jj[e];
                const float dec = cj <= ri ? __expf(gam[ri] - gam[cj]) : 0.f;
                if (cj < ri) Ls[ri * LDL + cj] = bet[ri] * dec * kk[e];
                pv[e] = dec * qk4[e];
            }
            *(uint32_t *)(Pm + i0 * GDN_C + j0) = cu_pack_bf16(pv[0], pv[1]);
            *(uint32_t *)(Pm + i1 * GDN_C + j0) = cu_pack_bf16(pv[2], pv[3]);
        }
    }
    __syncthreads();

    /* 4. T = (I + L)^-1 by forward substitution down each column, 4 threads per column (the sum over
     *    earlier rows split by j mod 4, combined by two shuffles); only L[i][j < i] is read */
    {
        const int col = tid >> 2, qq = tid & 3;
        float tv[16];
#pragma unroll
        for (int m = 0; m < 16; m++) tv[m] = 0.f;
#pragma unroll
        for (int row = 0; row < GDN_C; row++) {
            float s0 = 0.f, s1 = 0.f;
#pragma unroll
            for (int m = 0; m < 16; m += 2) {
                if (4 * m + qq < row) s0 += Ls[row * LDL + 4 * m + qq] * tv[m];
                if (4 * (m + 1) + qq < row) s1 += Ls[row * LDL + 4 * (m + 1) + qq] * tv[m + 1];
            }
            float s = s0 + s1;
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            const float v = (row == col ? 1.f : 0.f) - s;
            if ((row & 3) == qq) tv[row >> 2] = v;
            if (qq == 0) Ts[row * LDL + col] = v;
        }
    }
    __syncthreads();

    /* 5. W = T diag(beta Gamma) K and U = T diag(beta) V in fp32 FMA (U feeds delta = U - W S, where
     *    bf16 operands cost too much accuracy: bench/CUDA_NOTES.md, v2). T is lower triangular. */
    {
        constexpr int EQ = (DK + 31) / 32;
        float acc[8][EQ];
#pragma unroll
        for (int ii = 0; ii < 8; ii++)
#pragma unroll
            for (int e = 0; e < EQ; e++) acc[ii][e] = 0.f;
        const int tmax = 8 * w + 7;
        for (int tp = 0; tp <= tmax; tp++) {
            const float sb = bet[tp] * Gam[tp];
            float kv[EQ];
#pragma unroll
            for (int e = 0; e < EQ; e++) kv[e] = lane + 32 * e < DK ? __bfloat162float(Ks[tp * LDK + lane + 32 * e]) : 0.f;
#pragma unroll
            for (int ii = 0; ii < 8; ii++) {
                const float av = Ts[(8 * w + ii) * LDL + tp] * sb;
#pragma unroll
                for (int e = 0; e < EQ; e++) acc[ii][e] += av * kv[e];
            }
        }
        bf16 *W = a.scr.W + blk * GDN_C * DK;
#pragma unroll
        for (int ii = 0; ii < 8; ii++)
#pragma unroll
            for (int e = 0; e < EQ; e++)
                if (lane + 32 * e < DK) W[(8 * w + ii) * DK + lane + 32 * e] = __float2bfloat16(acc[ii][e]);
    }
    {
        constexpr int UPW = DV / PREP_WARPS; /* U^T columns per warp; lanes: rows lane, lane + 32 */
        float acc[2][UPW];
#pragma unroll
        for (int ii = 0; ii < 2; ii++)
#pragma unroll
            for (int j = 0; j < UPW; j++) acc[ii][j] = 0.f;
        for (int tp = 0; tp < GDN_C; tp++) {
            const float sb = bet[tp];
            const float a0 = Ts[lane * LDL + tp] * sb, a1 = Ts[(lane + 32) * LDL + tp] * sb;
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
}

/* ---- kernel B: the recurrence; one block per (value head, 32 columns of dv), sequential over blocks */

struct gdn_scan_args {
    float *S; /* [nv][DV][DK] (padded) */
    const cu_chunk_params *prm;
    int nv, rows;
    cu_gdn_scratch scr;
};

template <int DK, int DV>
struct scan_smem {
    static constexpr int BV = DV < 32 ? DV : 32; /* dv columns per block */
    static constexpr int LDW = DK + 8;           /* W and K' rows [64][DK] */
    static constexpr int LDU = GDN_C + 8;        /* U^T rows (fp32) */
    static constexpr size_t w_off = 0;
    static constexpr size_t k_off = w_off + (size_t)GDN_C * LDW * 2;
    static constexpr size_t u_off = k_off + (size_t)GDN_C * LDW * 2;
    static constexpr size_t stage = u_off + (size_t)BV * LDU * 4;
    static constexpr size_t bytes = 2 * stage;
};

template <int DK, int DV>
__device__ __forceinline__ void scan_prefetch(unsigned char *st, const cu_gdn_scratch &scr, size_t blk, int n_base,
                                              int tid, int nthreads) {
    typedef scan_smem<DK, DV> SM;
    bf16 *Ws = (bf16 *)(st + SM::w_off), *Ks = (bf16 *)(st + SM::k_off);
    float *Us = (float *)(st + SM::u_off);
    const bf16 *W = scr.W + blk * GDN_C * DK, *K = scr.Kp + blk * GDN_C * DK;
    const float *U = scr.UT + blk * DV * GDN_C + (size_t)n_base * GDN_C;
    constexpr int SW = DK / 8; /* 16-byte segments per W row */
    for (int e = tid; e < GDN_C * SW; e += nthreads) {
        const int r = e / SW, s = e % SW;
        cu_cp_async16(Ws + r * SM::LDW + 8 * s, W + r * DK + 8 * s, 16);
        cu_cp_async16(Ks + r * SM::LDW + 8 * s, K + r * DK + 8 * s, 16);
    }
    for (int e = tid; e < SM::BV * 16; e += nthreads) {
        const int r = e >> 4, s = e & 15;
        cu_cp_async16(Us + r * SM::LDU + 4 * s, U + r * GDN_C + 4 * s, 16);
    }
}

template <int DK, int DV>
__global__ void __launch_bounds__((DV < 32 ? DV : 32) * 2) gdn_scan_kernel(gdn_scan_args a) {
    typedef scan_smem<DK, DV> SM;
    constexpr int NW = SM::BV / 16, NT = NW * 32;
    constexpr int NJ = DK / 8;   /* n-tiles of S^T along dk */
    constexpr int NKS = DK / 16; /* k-steps along dk */
    extern __shared__ __align__(16) unsigned char smem[];
    const int h = blockIdx.x, n_base = blockIdx.y * SM::BV;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int r = lane >> 2, cc = lane & 3;
    const int len = a.prm->len;
    const int nc = (a.rows + GDN_C - 1) / GDN_C;
    int nreal = (len + GDN_C - 1) / GDN_C;
    if (nreal > nc) nreal = nc;

    /* S^T rows [n0, n0 + 8] of this head in accumulators */
    float Sacc[NJ][4];
    float *Sh = a.S + (size_t)h * DV * DK;
    const int nl = 16 * w + r; /* row inside the block's slice */
    const int n0 = n_base + nl;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const float2 lo = *(const float2 *)(Sh + (size_t)n0 * DK + 8 * j + 2 * cc);
        const float2 hi = *(const float2 *)(Sh + (size_t)(n0 + 8) * DK + 8 * j + 2 * cc);
        Sacc[j][0] = lo.x;
        Sacc[j][1] = lo.y;
        Sacc[j][2] = hi.x;
        Sacc[j][3] = hi.y;
    }

    scan_prefetch<DK, DV>(smem, a.scr, (size_t)h, n_base, tid, NT);
    cu_cp_async_commit();

    for (int ci = 0; ci < nreal; ci++) {
        const size_t blk = (size_t)ci * a.nv + h;
        const unsigned char *st = smem + (ci & 1) * SM::stage;
        const bf16 *Ws = (const bf16 *)(st + SM::w_off), *Ks = (const bf16 *)(st + SM::k_off);
        const float *Us = (const float *)(st + SM::u_off);
        const float gl = a.scr.glast[blk];

        /* the state at the block start, for the output kernel */
        bf16 *Sc = a.scr.Sc + (blk * DV + n0) * DK;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            *(uint32_t *)(Sc + 8 * j + 2 * cc) = cu_pack_bf16(Sacc[j][0], Sacc[j][1]);
            *(uint32_t *)(Sc + 8 * DK + 8 * j + 2 * cc) = cu_pack_bf16(Sacc[j][2], Sacc[j][3]);
        }
        uint32_t nS[NKS][4]; /* -S^T as bf16 A fragments */
#pragma unroll
        for (int ks = 0; ks < NKS; ks++) {
            nS[ks][0] = cu_pack_bf16(-Sacc[2 * ks][0], -Sacc[2 * ks][1]);
            nS[ks][1] = cu_pack_bf16(-Sacc[2 * ks][2], -Sacc[2 * ks][3]);
            nS[ks][2] = cu_pack_bf16(-Sacc[2 * ks + 1][0], -Sacc[2 * ks + 1][1]);
            nS[ks][3] = cu_pack_bf16(-Sacc[2 * ks + 1][2], -Sacc[2 * ks + 1][3]);
        }

        cu_cp_async_wait<0>();
        __syncthreads();
        if (ci + 1 < nreal) {
            scan_prefetch<DK, DV>(smem + ((ci + 1) & 1) * SM::stage, a.scr, (size_t)(ci + 1) * a.nv + h, n_base, tid,
                                  NT);
            cu_cp_async_commit();
        }

        /* delta^T = U^T - S^T W^T */
        float D[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float2 lo = *(const float2 *)(Us + nl * SM::LDU + 8 * j + 2 * cc);
            const float2 hi = *(const float2 *)(Us + (nl + 8) * SM::LDU + 8 * j + 2 * cc);
            D[j][0] = lo.x;
            D[j][1] = lo.y;
            D[j][2] = hi.x;
            D[j][3] = hi.y;
        }
#pragma unroll
        for (int ks = 0; ks < NKS; ks++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int k0 = 16 * ks + 2 * cc;
                const uint32_t w0 = *(const uint32_t *)(Ws + (8 * j + r) * SM::LDW + k0);
                const uint32_t w1 = *(const uint32_t *)(Ws + (8 * j + r) * SM::LDW + k0 + 8);
                cu_mma16816(D[j], nS[ks], w0, w1);
            }
        /* delta^T to global (bf16) and as A fragments (k = tokens) */
        bf16 *dT = a.scr.dT + (blk * DV + n0) * GDN_C;
        uint32_t dF[4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            dF[ks][0] = cu_pack_bf16(D[2 * ks][0], D[2 * ks][1]);
            dF[ks][1] = cu_pack_bf16(D[2 * ks][2], D[2 * ks][3]);
            dF[ks][2] = cu_pack_bf16(D[2 * ks + 1][0], D[2 * ks + 1][1]);
            dF[ks][3] = cu_pack_bf16(D[2 * ks + 1][2], D[2 * ks + 1][3]);
            *(uint32_t *)(dT + 16 * ks + 2 * cc) = dF[ks][0];
            *(uint32_t *)(dT + 8 * GDN_C + 16 * ks + 2 * cc) = dF[ks][1];
            *(uint32_t *)(dT + 16 * ks + 8 + 2 * cc) = dF[ks][2];
            *(uint32_t *)(dT + 8 * GDN_C + 16 * ks + 8 + 2 * cc) = dF[ks][3];
        }
        /* S^T = Gamma_last S^T + delta^T K' */
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            Sacc[j][0] *= gl;
            Sacc[j][1] *= gl;
            Sacc[j][2] *= gl;
            Sacc[j][3] *= gl;
        }
        /* B[k = token][n = dk] = K'[token][dk]: pairs along the token, so ldmatrix.trans from [64][DK] */
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
#pragma unroll
            for (int np = 0; np < NJ / 2; np++) {
                uint32_t kb[4];
                cu_ldmatrix_x4_trans(kb, Ks + (16 * ks + (lane & 15)) * SM::LDW + 16 * np + (lane >> 4) * 8);
                cu_mma16816(Sacc[2 * np], dF[ks], kb[0], kb[1]);
                cu_mma16816(Sacc[2 * np + 1], dF[ks], kb[2], kb[3]);
            }
    }
    cu_cp_async_wait<0>();
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        *(float2 *)(Sh + (size_t)n0 * DK + 8 * j + 2 * cc) = make_float2(Sacc[j][0], Sacc[j][1]);
        *(float2 *)(Sh + (size_t)(n0 + 8) * DK + 8 * j + 2 * cc) = make_float2(Sacc[j][2], Sacc[j][3]);
    }
}

/* ---- kernel C: outputs; one block per (block of 64 tokens, value head), all independent -------- */

struct gdn_out_args {
    const bf16 *P;
    int ldP;
    bf16 *conv_state; /* [K-1][C], moved on to the chunk's end */
    const float *norm_w;
    bf16 *Y; /* [rows][nv dv] */
    const cu_chunk_params *prm;
    int nv, dv, K, C, rows;
    float eps;
    cu_gdn_scratch scr;
};

#define OUT_THREADS 128 /* 4 warps x 16 token rows */

template <int DK, int DV>
struct out_smem {
    static constexpr int LDK = DK + 8;
    static constexpr int LDZ = DV + 8;
    static constexpr size_t q_off = 0;                                  /* Gamma Q [64][LDK] */
    static constexpr size_t s_off = q_off + (size_t)GDN_C * LDK * 2;    /* S^T [DV][LDK] */
    static constexpr size_t p_off = s_off + (size_t)DV * LDK * 2;       /* P [64][LDT] */
    static constexpr size_t d_off = p_off + (size_t)GDN_C * GDN_LDT * 2; /* delta^T [DV][LDT] */
    static constexpr size_t z_off = d_off + (size_t)DV * GDN_LDT * 2;   /* z [64][LDZ] */
    static constexpr size_t bytes = z_off + (size_t)GDN_C * LDZ * 2;
};

template <int DK, int DV>
__global__ void __launch_bounds__(OUT_THREADS) gdn_out_kernel(gdn_out_args a) {
    typedef out_smem<DK, DV> SM;
    constexpr int LDK = SM::LDK, LDT = GDN_LDT;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)(smem + SM::q_off), *Ss = (bf16 *)(smem + SM::s_off);
    bf16 *Ps = (bf16 *)(smem + SM::p_off), *Ds = (bf16 *)(smem + SM::d_off);
    bf16 *Zs = (bf16 *)(smem + SM::z_off);
    const int c = blockIdx.x, h = blockIdx.y;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int r = lane >> 2, cc = lane & 3;
    const int len = a.prm->len, dv = a.dv;
    const int t0 = c * GDN_C;
    const size_t blk = (size_t)c * a.nv + h;

    { /* the conv state moves on: new[j] = [old | P][len + j] (kernel A has read it); every block
       * takes some channels; all loads of a channel before its stores (no round trip per value) */
        const int Km1 = a.K - 1, nthr = gridDim.x * gridDim.y * OUT_THREADS;
        for (int ch = (blockIdx.x * gridDim.y + h) * OUT_THREADS + tid; ch < a.C; ch += nthr) {
            bf16 v[CU_MAX_CONV_K];
#pragma unroll
            for (int j = 0; j < CU_MAX_CONV_K - 1; j++)
                if (j < Km1) {
                    const int src = len + j;
                    v[j] = src < Km1 ? a.conv_state[(size_t)src * a.C + ch] : a.P[(size_t)(src - Km1) * a.ldP + ch];
                }
#pragma unroll
            for (int j = 0; j < CU_MAX_CONV_K - 1; j++)
                if (j < Km1) a.conv_state[(size_t)j * a.C + ch] = v[j];
        }
    }
    const int tend = min(a.rows, t0 + GDN_C); /* rows of this block inside the bucket */
    if (t0 >= len) { /* padding only */
        for (int e = tid; e < (tend - t0) * dv; e += OUT_THREADS)
            a.Y[(size_t)(t0 + e / dv) * a.nv * dv + (size_t)h * dv + e % dv] = __float2bfloat16(0.f);
        return;
    }
    {
        const bf16 *Q = a.scr.Qg + blk * GDN_C * DK, *S = a.scr.Sc + blk * DV * DK;
        const bf16 *Pm = a.scr.Pm + blk * GDN_C * GDN_C, *dT = a.scr.dT + blk * DV * GDN_C;
        constexpr int SK = DK / 8;
        for (int e = tid; e < GDN_C * SK; e += OUT_THREADS)
            cu_cp_async16(Qs + (e / SK) * LDK + 8 * (e % SK), Q + (e / SK) * DK + 8 * (e % SK), 16);
        for (int e = tid; e < DV * SK; e += OUT_THREADS)
            cu_cp_async16(Ss + (e / SK) * LDK + 8 * (e % SK), S + (e / SK) * DK + 8 * (e % SK), 16);
        for (int e = tid; e < GDN_C * 8; e += OUT_THREADS)
            cu_cp_async16(Ps + (e >> 3) * LDT + 8 * (e & 7), Pm + (e >> 3) * GDN_C + 8 * (e & 7), 16);
        for (int e = tid; e < DV * 8; e += OUT_THREADS)
            cu_cp_async16(Ds + (e >> 3) * LDT + 8 * (e & 7), dT + (e >> 3) * GDN_C + 8 * (e & 7), 16);
        const int SZ = dv / 8;
        for (int e = tid; e < GDN_C * SZ; e += OUT_THREADS) {
            const int t = e / SZ, s = e % SZ;
            const bool ok = t0 + t < len;
            const bf16 *src = a.P + (size_t)(ok ? t0 + t : 0) * a.ldP + a.C + (size_t)h * dv + 8 * s;
            cu_cp_async16(Zs + t * SM::LDZ + 8 * s, src, ok ? 16 : 0);
        }
        cu_cp_async_commit();
        cu_cp_async_wait<0>();
        __syncthreads();
    }
    /* O = (Gamma Q) S + P delta: warp w rows 16 w .. 16 w + 15, all DV columns */
    constexpr int NJ = DV / 8;
    float O[NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; j++) O[j][0] = O[j][1] = O[j][2] = O[j][3] = 0.f;
    const int i0 = 16 * w + r, i1 = i0 + 8;
#pragma unroll
    for (int ks = 0; ks < DK / 16; ks++) {
        const int k0 = 16 * ks + 2 * cc;
        uint32_t aq[4];
        aq[0] = *(const uint32_t *)(Qs + i0 * LDK + k0);
        aq[1] = *(const uint32_t *)(Qs + i1 * LDK + k0);
        aq[2] = *(const uint32_t *)(Qs + i0 * LDK + k0 + 8);
        aq[3] = *(const uint32_t *)(Qs + i1 * LDK + k0 + 8);
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const uint32_t b0 = *(const uint32_t *)(Ss + (8 * j + r) * LDK + k0);
            const uint32_t b1 = *(const uint32_t *)(Ss + (8 * j + r) * LDK + k0 + 8);
            cu_mma16816(O[j], aq, b0, b1);
        }
    }
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        if (ks > w) break; /* P is lower triangular */
        const int k0 = 16 * ks + 2 * cc;
        uint32_t ap[4];
        ap[0] = *(const uint32_t *)(Ps + i0 * LDT + k0);
        ap[1] = *(const uint32_t *)(Ps + i1 * LDT + k0);
        ap[2] = *(const uint32_t *)(Ps + i0 * LDT + k0 + 8);
        ap[3] = *(const uint32_t *)(Ps + i1 * LDT + k0 + 8);
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const uint32_t b0 = *(const uint32_t *)(Ds + (8 * j + r) * LDT + k0);
            const uint32_t b1 = *(const uint32_t *)(Ds + (8 * j + r) * LDT + k0 + 8);
            cu_mma16816(O[j], ap, b0, b1);
        }
    }
    /* gated RMSNorm over the real dv: a row's values sit in the 4 lanes of a quad */
    float ss0 = 0.f, ss1 = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        ss0 += O[j][0] * O[j][0] + O[j][1] * O[j][1];
        ss1 += O[j][2] * O[j][2] + O[j][3] * O[j][3];
    }
    ss0 += __shfl_xor_sync(0xffffffffu, ss0, 1);
    ss0 += __shfl_xor_sync(0xffffffffu, ss0, 2);
    ss1 += __shfl_xor_sync(0xffffffffu, ss1, 1);
    ss1 += __shfl_xor_sync(0xffffffffu, ss1, 2);
    const float rs0 = rsqrtf(ss0 / (float)dv + a.eps), rs1 = rsqrtf(ss1 / (float)dv + a.eps);
    const int tt0 = t0 + i0, tt1 = t0 + i1;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int d = 8 * j + 2 * cc;
        if (d >= dv) break;
        const float w0 = a.norm_w[d], w1 = a.norm_w[d + 1];
        if (tt0 < tend) {
            float y0 = 0.f, y1 = 0.f;
            if (tt0 < len) {
                y0 = O[j][0] * rs0 * w0 * cu_silu(__bfloat162float(Zs[i0 * SM::LDZ + d]));
                y1 = O[j][1] * rs0 * w1 * cu_silu(__bfloat162float(Zs[i0 * SM::LDZ + d + 1]));
            }
            *(uint32_t *)(a.Y + (size_t)tt0 * a.nv * dv + (size_t)h * dv + d) = cu_pack_bf16(y0, y1);
        }
        if (tt1 < tend) {
            float y0 = 0.f, y1 = 0.f;
            if (tt1 < len) {
                y0 = O[j][2] * rs1 * w0 * cu_silu(__bfloat162float(Zs[i1 * SM::LDZ + d]));
                y1 = O[j][3] * rs1 * w1 * cu_silu(__bfloat162float(Zs[i1 * SM::LDZ + d + 1]));
            }
            *(uint32_t *)(a.Y + (size_t)tt1 * a.nv * dv + (size_t)h * dv + d) = cu_pack_bf16(y0, y1);
        }
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
    if (!base) return 0;
    if (d->f32) return 1;
    /* the chunked path copies z rows with 16-byte cp.async: z's offset and the row stride in 8s */
    const int C = 2 * d->nk * d->dk + d->nv * d->dv;
    return gdn_shape_ok(cu_gdn_pad(d->dk), cu_gdn_pad(d->dv)) && C % 8 == 0 && d->dv % 8 == 0 && d->ldP % 8 == 0;
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
           align256(nb * GDN_C * GDN_C * 2) + align256(nb * 4) + align256(nb * DV * DK * 2) +
           align256(nb * DV * GDN_C * 2);
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
    s->Kp = (bf16 *)p;
    p += align256(nb * DK * GDN_C * 2);
    s->Pm = (bf16 *)p;
    p += align256(nb * GDN_C * GDN_C * 2);
    s->glast = (float *)p;
    p += align256(nb * 4);
    s->Sc = (bf16 *)p;
    p += align256(nb * DV * DK * 2);
    s->dT = (bf16 *)p;
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
        CU_TRY(cudaFuncSetAttribute(gdn_out_kernel<DK_, DV_>, cudaFuncAttributeMaxDynamicSharedMemorySize,           \
                                    (int)out_smem<DK_, DV_>::bytes));                                               \
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
    gdn_scan_args sa = {S, prm, d->nv, rows, *scr};
    gdn_out_args oa = {P, d->ldP, conv_state, norm_w, Y, prm, d->nv, d->dv, d->K, C, rows, d->eps, *scr};
#define GDN_RUN(DK_, DV_)                                                                                          \
    if (DKP == DK_ && DVP == DV_) {                                                                                \
        constexpr int BV = scan_smem<DK_, DV_>::BV;                                                               \
        gdn_prep_kernel<DK_, DV_><<<dim3(nc, d->nv), PREP_THREADS, prep_smem<DK_, DV_>::bytes, st>>>(pa);          \
        CU_LAUNCH_CHECK("gdn_prep_kernel");                                                                        \
        gdn_scan_kernel<DK_, DV_><<<dim3(d->nv, DV_ / BV), BV * 2, scan_smem<DK_, DV_>::bytes, st>>>(sa);          \
        CU_LAUNCH_CHECK("gdn_scan_kernel");                                                                        \
        gdn_out_kernel<DK_, DV_><<<dim3(nc, d->nv), OUT_THREADS, out_smem<DK_, DV_>::bytes, st>>>(oa);             \
        CU_LAUNCH_CHECK("gdn_out_kernel");                                                                         \
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
