/*
 * k_vision.cu — the vision tower's own kernels (vision_cuda.cuh): everything between its GEMMs.
 *
 *  - vis_pos_embed (a block per patch of one frame): transformers' fast_pos_embed_interpolate as
 *    src/cpu/vision.c computes it (linspace in float by PyTorch's scalar formula, floor by
 *    truncation, ceiling clipped, the four corner weights summed in the same order), with
 *    round-to-nearest intrinsics where --use_fast_math would otherwise contract or approximate, so
 *    the grid coordinates are the CPU's; + the patch embedding's bias. Frames repeat the rows.
 *  - vis_layernorm (a warp per row, the row in registers): the pending bias of the GEMM that last
 *    added into the residual stream added and written back, then mean, variance of the deviations
 *    (two passes over the registers), bf16 out.
 *  - vis_rope_table (once an image): cos and sin of every (position, frequency) the image's rows and
 *    columns need, angle fp32(pos * inv_freq), cos / sin in double as the text model's attn_prep.
 *  - vis_rope_split (a thread per patch, head and 4 rotary pairs: 8-byte loads and stores): the qkv
 *    bias, the 2D rotary from the table (head dims [0, hd/4) by the patch's row, [hd/4, hd/2) by
 *    its column, the second half paired by rotate_half), and the split into head-major Q, K, V for
 *    the attention kernel. hd a multiple of 16, so 4 pairs never straddle the row / column split.
 *  - vis_attn (FlashAttention-2 style on mma.sync m16n8k16, bf16 in, fp32 accumulate): a block of 8
 *    warps takes 128 queries of one (head, frame), each warp 16; keys 64 at a time through two
 *    cp.async stages (the next tile loads while this one is computed, one barrier a tile); online
 *    softmax in the exp2 domain. No mask but the frame's end: the last tile's keys past it score
 *    -inf, queries past it load zeros and store nothing. The text model's attention kernels are
 *    causal, read a K / V cache through the chunk parameters and gate their output; this one is the
 *    non-causal variant over a frame's patches, with no cache and no gate.
 *  - vis_bias_act: bias and GELU (tanh or erf) in place on a bf16 GEMM output, 8 elements (16 bytes)
 *    a thread.
 *  - vis_rows_init: the merger's fc2 bias as the output's starting value (its GEMM adds into it).
 * The exact path (fp32 activations; vis_pos_embed, vis_rope_table and vis_rows_init are shared):
 *  - vis_layernorm with an fp32 output (the same kernel, its output type a template parameter);
 *  - vis_rope_split_f32 (a thread per patch, head and rotary pair): the same bias, rotary and split;
 *  - vis_attn_f32: a warp per query, keys 32 at a time through shared memory, a lane per key for the
 *    scores and an online softmax over the tile; fp32 throughout. Simple, not fast: it is the
 *    reference path's, and the 8,160-patch frame takes it like any other;
 *  - vis_bias_act_f32: bias and GELU in place, the GELU in double (--use_fast_math makes tanhf the
 *    hardware's tanh.approx, ~2^-11 relative; double functions keep their precision).
 */
#include "vision_cuda.cuh"

#include <math.h>

/* ---- position grid ------------------------------------------------------------------------------ */

/* torch.linspace(0, end, n)[i] in float, the scalar formula of PyTorch's CPU kernel (vision.c). */
__device__ static float vis_linspace_at(float end, int n, int i) {
    if (n == 1) return 0.0f;
    const float step = __fdiv_rn(end, (float)(n - 1));
    return i < n / 2 ? __fmul_rn(step, (float)i) : __fsub_rn(end, __fmul_rn(step, (float)(n - 1 - i)));
}

/* The (row, column) of patch p of a frame w patches wide, in merge-window order. */
__device__ __forceinline__ void vis_patch_coords(int p, int w, int m, int *row, int *col) {
    const int per_block_row = w * m, br = p / per_block_row, rest = p % per_block_row;
    const int bc = rest / (m * m), in = rest % (m * m);
    *row = br * m + in / m;
    *col = bc * m + in % m;
}

__global__ void vis_pos_embed_kernel(const float *__restrict__ table, const float *__restrict__ bias, int side, int H,
                                     int t, int h, int w, int m, float *__restrict__ x) {
    const int p = blockIdx.x;
    int row, col;
    vis_patch_coords(p, w, m, &row, &col);
    const float end = (float)(side - 1);
    const float hv = vis_linspace_at(end, h, row), wv = vis_linspace_at(end, w, col);
    const int h0 = (int)hv, w0 = (int)wv;
    const int h1 = h0 + 1 < side ? h0 + 1 : side - 1, w1 = w0 + 1 < side ? w0 + 1 : side - 1;
    const float dh = __fsub_rn(hv, (float)h0), dw = __fsub_rn(wv, (float)w0);
    const float ih = __fsub_rn(1.0f, dh), iw = __fsub_rn(1.0f, dw);
    const float wt0 = __fmul_rn(ih, iw), wt1 = __fmul_rn(ih, dw), wt2 = __fmul_rn(dh, iw), wt3 = __fmul_rn(dh, dw);
    const float *e0 = table + ((size_t)h0 * side + w0) * H, *e1 = table + ((size_t)h0 * side + w1) * H;
    const float *e2 = table + ((size_t)h1 * side + w0) * H, *e3 = table + ((size_t)h1 * side + w1) * H;
    const size_t frame = (size_t)h * w;
    for (int d = threadIdx.x; d < H; d += blockDim.x) {
        const float a = __fmul_rn(e0[d], wt0), b = __fmul_rn(e1[d], wt1), c = __fmul_rn(e2[d], wt2),
                    f = __fmul_rn(e3[d], wt3);
        const float v = __fadd_rn(__fadd_rn(__fadd_rn(a, b), c), f) + bias[d];
        for (int fr = 0; fr < t; fr++) x[((size_t)fr * frame + p) * H + d] = v;
    }
}

/* ---- LayerNorm ---------------------------------------------------------------------------------- */

#define VIS_LN_WARPS 8 /* rows a block */

/* Y: bf16 (the bf16 path's GEMM input) or float (the exact path's); cu_st rounds or stores. */
template <int PER, typename Y>
__global__ void __launch_bounds__(VIS_LN_WARPS * 32)
    vis_layernorm_kernel(float *__restrict__ x, const float *__restrict__ bias, const float *__restrict__ w,
                         const float *__restrict__ b, Y *__restrict__ y, int rows, int H) {
    const int r = blockIdx.x * VIS_LN_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;
    float *xr = x + (size_t)r * H;
    float v[PER];
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int d = lane + 32 * i;
        v[i] = 0.f;
        if (d < H) {
            float a = xr[d];
            if (bias) {
                a += bias[d];
                xr[d] = a;
            }
            v[i] = a;
            sum += a;
        }
    }
    const float mean = cu_warp_sum(sum) / (float)H;
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < PER; i++)
        if (lane + 32 * i < H) sq += (v[i] - mean) * (v[i] - mean);
    const float rstd = rsqrtf(cu_warp_sum(sq) / (float)H + SQUAD_VISION_LN_EPS);
    Y *yr = y + (size_t)r * H;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int d = lane + 32 * i;
        if (d < H) cu_st(yr + d, (v[i] - mean) * rstd * w[d] + b[d]);
    }
}

/* ---- 2D rotary and the head-major split ---------------------------------------------------------- */

__global__ void vis_rope_table_kernel(const float *__restrict__ inv_freq, int positions, int nf,
                                      float2 *__restrict__ cs) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= positions * nf) return;
    const float ang = __fmul_rn((float)(i / nf), inv_freq[i % nf]);
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    cs[i] = make_float2((float)cd, (float)sd);
}

#define VIS_ROPE_PAIRS 4 /* rotary pairs a thread: 8 bytes of bf16 from each half */

/* 4 bf16 at p (8-byte aligned) + 4 bias floats (16-byte aligned) -> 4 floats. */
__device__ __forceinline__ void vis_load4(const bf16 *p, const float *bias, float (&x)[4]) {
    const uint2 u = *reinterpret_cast<const uint2 *>(p);
    const float4 b = *reinterpret_cast<const float4 *>(bias);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.y));
    x[0] = lo.x + b.x;
    x[1] = lo.y + b.y;
    x[2] = hi.x + b.z;
    x[3] = hi.y + b.w;
}

__device__ __forceinline__ void vis_store4(bf16 *p, const float (&x)[4]) {
    uint2 u;
    u.x = cu_pack_bf16(x[0], x[1]);
    u.y = cu_pack_bf16(x[2], x[3]);
    *reinterpret_cast<uint2 *>(p) = u;
}

__global__ void vis_rope_split_kernel(const bf16 *__restrict__ qkv, const float *__restrict__ bias,
                                      const float2 *__restrict__ cs, int N, int h, int w, int m, int heads, int hd,
                                      bf16 *__restrict__ Q, bf16 *__restrict__ K, bf16 *__restrict__ V) {
    const int half = hd / 2, quarter = hd / 4, groups = half / VIS_ROPE_PAIRS;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * heads * groups) return;
    const int g = (int)(i % groups), head = (int)(i / groups % heads), p = (int)(i / ((size_t)groups * heads));
    const int j = g * VIS_ROPE_PAIRS;
    int row, col;
    vis_patch_coords(p % (h * w), w, m, &row, &col);
    const float2 *t = cs + (size_t)(j < quarter ? row : col) * quarter + (j < quarter ? j : j - quarter);
    const int H = heads * hd, d0 = head * hd + j, d1 = d0 + half;
    const bf16 *src = qkv + (size_t)p * 3 * H;
    const size_t o = ((size_t)head * N + p) * hd + j;
    float a0[4], a1[4], r0[4], r1[4];
#pragma unroll
    for (int part = 0; part < 2; part++) { /* q, then k: x' = x cos + rotate_half(x) sin */
        vis_load4(src + part * H + d0, bias + part * H + d0, a0);
        vis_load4(src + part * H + d1, bias + part * H + d1, a1);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 c = t[e];
            r0[e] = a0[e] * c.x - a1[e] * c.y;
            r1[e] = a1[e] * c.x + a0[e] * c.y;
        }
        bf16 *dst = part ? K : Q;
        vis_store4(dst + o, r0);
        vis_store4(dst + o + half, r1);
    }
    vis_load4(src + 2 * H + d0, bias + 2 * H + d0, a0);
    vis_load4(src + 2 * H + d1, bias + 2 * H + d1, a1);
    vis_store4(V + o, a0);
    vis_store4(V + o + half, a1);
}

/* ---- non-causal flash attention within a frame --------------------------------------------------- */

#define VA_WARPS 8
#define VA_THREADS (VA_WARPS * 32)
#define VA_ROWS (VA_WARPS * 16) /* queries a block */
#define VA_BN 64                /* keys a tile */

/* Shared memory: Q [VA_ROWS][LD], then two stages of (K [VA_BN][LD], V [VA_BN][LD]); LD pads a row
 * by 16 bytes so the 8 rows of an ldmatrix fall in distinct banks. hd 64: 18 KB + 36 KB. */
template <int HD>
struct va_smem {
    static constexpr int LD = HD + 8;
    static constexpr size_t q_tile = (size_t)VA_ROWS * LD * 2;
    static constexpr size_t kv_tile = (size_t)VA_BN * LD * 2;
    static constexpr size_t bytes = q_tile + 2 * 2 * kv_tile;
};

/* K and V rows [kb, kb + VA_BN) of the frame into a stage (rows past L zero-filled). */
template <int HD>
__device__ __forceinline__ void va_load_kv(bf16 *Ks, bf16 *Vs, const bf16 *Kg, const bf16 *Vg, int kb, int L) {
    constexpr int LD = va_smem<HD>::LD, PIECES = HD / 8;
    for (int i = threadIdx.x; i < VA_BN * PIECES; i += VA_THREADS) {
        const int r = i / PIECES, c = i % PIECES, key = kb + r;
        const bool ok = key < L;
        const size_t src = (size_t)(ok ? key : 0) * HD + 8 * c;
        cu_cp_async16(Ks + r * LD + 8 * c, Kg + src, ok ? 16 : 0);
        cu_cp_async16(Vs + r * LD + 8 * c, Vg + src, ok ? 16 : 0);
    }
}

template <int HD>
__global__ void __launch_bounds__(VA_THREADS) vis_attn_kernel(const bf16 *__restrict__ Q, const bf16 *__restrict__ K,
                                                             const bf16 *__restrict__ V, bf16 *__restrict__ out,
                                                             int N, int L, int heads, float scale_log2) {
    typedef va_smem<HD> SM;
    constexpr int LD = SM::LD, PIECES = HD / 8, NT = VA_BN / 8, KS = HD / 16;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int q0 = blockIdx.x * VA_ROWS, head = blockIdx.y, frame = blockIdx.z;
    const size_t base = (size_t)head * N + (size_t)frame * L; /* the frame's first row in [head][N] */
    const bf16 *Qg = Q + base * HD, *Kg = K + base * HD, *Vg = V + base * HD;

    for (int i = tid; i < VA_ROWS * PIECES; i += VA_THREADS) {
        const int r = i / PIECES, c = i % PIECES;
        const bool ok = q0 + r < L;
        cu_cp_async16(Qs + r * LD + 8 * c, Qg + (size_t)(ok ? q0 + r : 0) * HD + 8 * c, ok ? 16 : 0);
    }
    {
        bf16 *Ks = (bf16 *)(smem + SM::q_tile);
        va_load_kv<HD>(Ks, Ks + VA_BN * LD, Kg, Vg, 0, L);
    }
    cu_cp_async_commit();

    const int r4 = lane >> 2, c4 = lane & 3;
    uint32_t qf[KS][4];
    float O[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) O[d][0] = O[d][1] = O[d][2] = O[d][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    int stage = 0;
    for (int kb = 0; kb < L; kb += VA_BN, stage ^= 1) {
        /* this tile has landed and every warp is done with the other stage, which the next tile's
         * loads overwrite while this one is computed */
        cu_cp_async_wait<0>();
        __syncthreads();
        if (kb == 0) {
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
                cu_ldmatrix_x4(qf[kk], Qs + (16 * w + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 16 * kk + 8 * (lane >> 4));
        }
        if (kb + VA_BN < L) {
            bf16 *Kn = (bf16 *)(smem + SM::q_tile + (size_t)(stage ^ 1) * 2 * SM::kv_tile);
            va_load_kv<HD>(Kn, Kn + VA_BN * LD, Kg, Vg, kb + VA_BN, L);
            cu_cp_async_commit();
        }
        const bf16 *Ks = (const bf16 *)(smem + SM::q_tile + (size_t)stage * 2 * SM::kv_tile);
        const bf16 *Vs = Ks + VA_BN * LD;

        /* S = Q K^T: 16 rows x 64 keys a warp */
        float S[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) S[j][0] = S[j][1] = S[j][2] = S[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b[4];
                cu_ldmatrix_x4(b, Ks + (16 * np + (lane & 7) + 8 * (lane >> 4)) * LD + 16 * kk + 8 * ((lane >> 3) & 1));
                cu_mma16816(S[2 * np], qf[kk], b[0], b[1]);
                cu_mma16816(S[2 * np + 1], qf[kk], b[2], b[3]);
            }
        if (kb + VA_BN > L) /* the frame's last tile: keys past its end take no weight */
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int key = kb + 8 * j + 2 * c4;
                if (key >= L) S[j][0] = S[j][2] = -INFINITY;
                if (key + 1 >= L) S[j][1] = S[j][3] = -INFINITY;
            }

        /* online softmax of the warp's two rows a thread (r4 and r4 + 8), over the 4 lanes of a row */
        float mx0, mx1;
        cu_frag_row_max(S, mx0, mx1);
        /* every tile holds at least one key of the frame (key kb), so the new maxima are finite */
        const float n0 = fmaxf(m0, mx0 * scale_log2), n1 = fmaxf(m1, mx1 * scale_log2);
        const float corr0 = exp2f(m0 - n0), corr1 = exp2f(m1 - n1);
        m0 = n0;
        m1 = n1;
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            S[j][0] = exp2f(S[j][0] * scale_log2 - n0);
            S[j][1] = exp2f(S[j][1] * scale_log2 - n0);
            S[j][2] = exp2f(S[j][2] * scale_log2 - n1);
            S[j][3] = exp2f(S[j][3] * scale_log2 - n1);
            s0 += S[j][0] + S[j][1];
            s1 += S[j][2] + S[j][3];
        }
        l0 = l0 * corr0 + s0;
        l1 = l1 * corr1 + s1;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            O[d][0] *= corr0;
            O[d][1] *= corr0;
            O[d][2] *= corr1;
            O[d][3] *= corr1;
        }

        /* O += P V: P from the score accumulators (the C layout of two n-tiles is the A layout of
         * one k-step), V by transposed ldmatrix */
#pragma unroll
        for (int ks = 0; ks < VA_BN / 16; ks++) {
            uint32_t a[4];
            a[0] = cu_pack_bf16(S[2 * ks][0], S[2 * ks][1]);
            a[1] = cu_pack_bf16(S[2 * ks][2], S[2 * ks][3]);
            a[2] = cu_pack_bf16(S[2 * ks + 1][0], S[2 * ks + 1][1]);
            a[3] = cu_pack_bf16(S[2 * ks + 1][2], S[2 * ks + 1][3]);
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t b[4];
                cu_ldmatrix_x4_trans(b, Vs + (16 * ks + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 16 * dp + 8 * (lane >> 4));
                cu_mma16816(O[2 * dp], a, b[0], b[1]);
                cu_mma16816(O[2 * dp + 1], a, b[2], b[3]);
            }
        }
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = 1.f / l0, inv1 = 1.f / l1;
    const int ldo = heads * HD;
    const int qa = q0 + 16 * w + r4, qb = qa + 8;
    bf16 *oa = out + ((size_t)frame * L + qa) * ldo + head * HD + 2 * c4;
    bf16 *ob = out + ((size_t)frame * L + qb) * ldo + head * HD + 2 * c4;
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        if (qa < L) *reinterpret_cast<uint32_t *>(oa + 8 * d) = cu_pack_bf16(O[d][0] * inv0, O[d][1] * inv0);
        if (qb < L) *reinterpret_cast<uint32_t *>(ob + 8 * d) = cu_pack_bf16(O[d][2] * inv1, O[d][3] * inv1);
    }
}

/* ---- bias + activation, rows from a bias ---------------------------------------------------------- */

__device__ __forceinline__ float vis_gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float vis_gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }

#define VIS_ACT_VEC 8 /* elements a thread: 16 bytes of bf16 */

/* A thread per 8 elements of a row (16-byte accesses; the column from a 32-bit division). */
template <int ACT>
__global__ void vis_bias_act_kernel(bf16 *__restrict__ y, const float *__restrict__ bias, unsigned total_vecs,
                                    unsigned row_vecs) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total_vecs) return;
    const unsigned c = (i % row_vecs) * VIS_ACT_VEC;
    uint4 *p = reinterpret_cast<uint4 *>(y) + i;
    uint4 u = *p;
    const float4 b0 = *reinterpret_cast<const float4 *>(bias + c), b1 = *reinterpret_cast<const float4 *>(bias + c + 4);
    const float bv[VIS_ACT_VEC] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
    uint32_t *w = reinterpret_cast<uint32_t *>(&u);
#pragma unroll
    for (int k = 0; k < VIS_ACT_VEC / 2; k++) {
        const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w[k]));
        float a = v.x + bv[2 * k], b = v.y + bv[2 * k + 1];
        if (ACT == CU_VIS_ACT_GELU_TANH) a = vis_gelu_tanh(a), b = vis_gelu_tanh(b);
        if (ACT == CU_VIS_ACT_GELU_ERF) a = vis_gelu_erf(a), b = vis_gelu_erf(b);
        w[k] = cu_pack_bf16(a, b);
    }
    *p = u;
}

__global__ void vis_rows_init_kernel(float *__restrict__ y, const float *__restrict__ bias, size_t total, int n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] = bias[i % n];
}

/* ---- the exact path: fp32 activations ----------------------------------------------------------- */

/* The same rotary and split as vis_rope_split_kernel on fp32 qkv into fp32 Q, K, V: a thread per
 * (patch, head, rotary pair). */
__global__ void vis_rope_split_f32_kernel(const float *__restrict__ qkv, const float *__restrict__ bias,
                                          const float2 *__restrict__ cs, int N, int h, int w, int m, int heads,
                                          int hd, float *__restrict__ Q, float *__restrict__ K,
                                          float *__restrict__ V) {
    const int half = hd / 2, quarter = hd / 4;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * heads * half) return;
    const int j = (int)(i % half), head = (int)(i / half % heads), p = (int)(i / ((size_t)half * heads));
    int row, col;
    vis_patch_coords(p % (h * w), w, m, &row, &col);
    const float2 c = cs[(size_t)(j < quarter ? row : col) * quarter + (j < quarter ? j : j - quarter)];
    const int H = heads * hd, d0 = head * hd + j, d1 = d0 + half;
    const float *src = qkv + (size_t)p * 3 * H;
    const size_t o = ((size_t)head * N + p) * hd + j;
#pragma unroll
    for (int part = 0; part < 2; part++) { /* q, then k: x' = x cos + rotate_half(x) sin */
        const float a0 = src[part * H + d0] + bias[part * H + d0], a1 = src[part * H + d1] + bias[part * H + d1];
        float *dst = part ? K : Q;
        dst[o] = a0 * c.x - a1 * c.y;
        dst[o + half] = a1 * c.x + a0 * c.y;
    }
    V[o] = src[2 * H + d0] + bias[2 * H + d0];
    V[o + half] = src[2 * H + d1] + bias[2 * H + d1];
}

/* Non-causal attention in fp32, simple rather than fast: a block of VAF_WARPS warps takes as many
 * consecutive queries of one (head, frame), a warp per query; keys VAF_KEYS at a time through shared
 * memory, a lane per key for the scores (its dot product over the head dim), then an online softmax
 * over the tile (warp max and sum) and P V with each lane holding head dims lane, lane + 32, ....
 * Queries past the frame's end compute on zeros and store nothing; keys past it score -inf. */
#define VAF_WARPS 8
#define VAF_KEYS 32 /* a lane each */

template <int HD>
__global__ void __launch_bounds__(VAF_WARPS * 32)
    vis_attn_f32_kernel(const float *__restrict__ Q, const float *__restrict__ K, const float *__restrict__ V,
                        float *__restrict__ out, int N, int L, int heads, float scale) {
    constexpr int DPL = (HD + 31) / 32; /* head dims a lane holds */
    __shared__ float Ks[VAF_KEYS][HD + 1]; /* + 1: lane j reads row j, a bank each */
    __shared__ float Vs[VAF_KEYS][HD];
    __shared__ float Qs[VAF_WARPS][HD];
    const int wp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y, frame = blockIdx.z, q = blockIdx.x * VAF_WARPS + wp;
    const size_t base = (size_t)head * N + (size_t)frame * L; /* the frame's first row in [head][N] */
    const float *Kg = K + base * HD, *Vg = V + base * HD;
    for (int d = lane; d < HD; d += 32) Qs[wp][d] = q < L ? Q[(base + q) * HD + d] : 0.f;
    float acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.f;
    float mx = -INFINITY, sum = 0.f;
    for (int kb = 0; kb < L; kb += VAF_KEYS) {
        __syncthreads(); /* every warp is done with the previous tile (and Qs is written) */
        for (int i = threadIdx.x; i < VAF_KEYS * HD; i += VAF_WARPS * 32) {
            const int r = i / HD, c = i % HD, key = kb + r;
            Ks[r][c] = key < L ? Kg[(size_t)key * HD + c] : 0.f;
            Vs[r][c] = key < L ? Vg[(size_t)key * HD + c] : 0.f;
        }
        __syncthreads();
        float s = -INFINITY;
        if (kb + lane < L) {
            float dot = 0.f;
#pragma unroll
            for (int d = 0; d < HD; d++) dot += Qs[wp][d] * Ks[lane][d];
            s = dot * scale;
        }
        float tmax = s;
#pragma unroll
        for (int o = 16; o; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
        /* key kb is in the frame, so the new maximum is finite; the first tile's correction is
         * exp(-inf) = 0 against an empty sum */
        const float nmx = fmaxf(mx, tmax), corr = expf(mx - nmx), p = expf(s - nmx);
        mx = nmx;
        float psum = p;
#pragma unroll
        for (int o = 16; o; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
        sum = sum * corr + psum;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] *= corr;
#pragma unroll 8
        for (int j = 0; j < VAF_KEYS; j++) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
            for (int i = 0; i < DPL; i++)
                if (lane + 32 * i < HD) acc[i] += pj * Vs[j][lane + 32 * i];
        }
    }
    if (q >= L) return;
    float *o = out + ((size_t)frame * L + q) * heads * HD + (size_t)head * HD;
#pragma unroll
    for (int i = 0; i < DPL; i++)
        if (lane + 32 * i < HD) o[lane + 32 * i] = acc[i] / sum;
}

/* GELU on the exact path, evaluated in double and rounded once: --use_fast_math turns tanhf into the
 * hardware's tanh.approx (about 2^-11 relative), far coarser than the CPU tower's libm tanhf; double
 * functions keep their full precision under the flag. */
__device__ __forceinline__ float vis_gelu_tanh_exact(float x) {
    const double xd = x, k = 0.7978845608028654; /* sqrt(2 / pi) */
    return (float)(0.5 * xd * (1.0 + tanh(k * (xd + 0.044715 * xd * xd * xd))));
}
__device__ __forceinline__ float vis_gelu_erf_exact(float x) {
    const double xd = x;
    return (float)(0.5 * xd * (1.0 + erf(xd * 0.7071067811865476)));
}

/* y [rows][n] fp32, in place: act(y + bias), the bias and the sum in fp32 as the CPU tower adds them. */
template <int ACT>
__global__ void vis_bias_act_f32_kernel(float *__restrict__ y, const float *__restrict__ bias, size_t total, int n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        float a = y[i] + bias[i % n];
        if (ACT == CU_VIS_ACT_GELU_TANH) a = vis_gelu_tanh_exact(a);
        if (ACT == CU_VIS_ACT_GELU_ERF) a = vis_gelu_erf_exact(a);
        y[i] = a;
    }
}

/* ---- launchers ------------------------------------------------------------------------------------- */

#define VIS_THREADS 256
#define VIS_MAX_GRID 65535u * 16u /* grid-stride loops: enough blocks for any GPU */

static unsigned vis_blocks(size_t n) {
    const size_t b = (n + VIS_THREADS - 1) / VIS_THREADS;
    return b < VIS_MAX_GRID ? (unsigned)(b ? b : 1) : VIS_MAX_GRID;
}

int cu_vis_pos_embed(const float *table, const float *bias, int side, int H, int t, int h, int w, int merge, float *x,
                     cudaStream_t st, squad_err *err) {
    vis_pos_embed_kernel<<<(unsigned)(h * w), VIS_THREADS, 0, st>>>(table, bias, side, H, t, h, w, merge, x);
    CU_LAUNCH_CHECK("vis_pos_embed_kernel");
    return 0;
}

template <typename Y>
static int vis_layernorm_launch(float *x, const float *bias, const float *w, const float *b, Y *y, int rows, int H,
                                cudaStream_t st, squad_err *err) {
    const unsigned blocks = (unsigned)((rows + VIS_LN_WARPS - 1) / VIS_LN_WARPS);
    const unsigned threads = VIS_LN_WARPS * 32;
    if (H <= 32 * 8)
        vis_layernorm_kernel<8, Y><<<blocks, threads, 0, st>>>(x, bias, w, b, y, rows, H);
    else if (H <= 32 * 16)
        vis_layernorm_kernel<16, Y><<<blocks, threads, 0, st>>>(x, bias, w, b, y, rows, H);
    else if (H <= 32 * 32)
        vis_layernorm_kernel<32, Y><<<blocks, threads, 0, st>>>(x, bias, w, b, y, rows, H);
    else if (H <= 32 * 64)
        vis_layernorm_kernel<64, Y><<<blocks, threads, 0, st>>>(x, bias, w, b, y, rows, H);
    else
        return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA vision tower: LayerNorm over %d columns (at most 2048)", H);
    CU_LAUNCH_CHECK("vis_layernorm_kernel");
    return 0;
}

int cu_vis_layernorm(float *x, const float *bias, const float *w, const float *b, bf16 *y, int rows, int H,
                     cudaStream_t st, squad_err *err) {
    return vis_layernorm_launch<bf16>(x, bias, w, b, y, rows, H, st, err);
}

int cu_vis_layernorm_f32(float *x, const float *bias, const float *w, const float *b, float *y, int rows, int H,
                         cudaStream_t st, squad_err *err) {
    return vis_layernorm_launch<float>(x, bias, w, b, y, rows, H, st, err);
}

int cu_vis_rope_table(const float *inv_freq, int positions, int hd, float2 *cs, cudaStream_t st, squad_err *err) {
    const int n = positions * (hd / 4);
    vis_rope_table_kernel<<<vis_blocks((size_t)n), VIS_THREADS, 0, st>>>(inv_freq, positions, hd / 4, cs);
    CU_LAUNCH_CHECK("vis_rope_table_kernel");
    return 0;
}

int cu_vis_rope_split(const bf16 *qkv, const float *bias, const float2 *cs, int N, int h, int w, int merge, int heads,
                      int hd, bf16 *Q, bf16 *K, bf16 *V, cudaStream_t st, squad_err *err) {
    if (hd % (4 * VIS_ROPE_PAIRS))
        return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA vision tower: rotary over head dim %d (a multiple of 16)", hd);
    const size_t n = (size_t)N * heads * (hd / 2 / VIS_ROPE_PAIRS);
    const size_t blocks = (n + VIS_THREADS - 1) / VIS_THREADS;
    if (blocks > 0x7fffffffu) return cu_err(err, SQUAD_E_INVALID, "CUDA vision tower: %d patches", N);
    vis_rope_split_kernel<<<(unsigned)blocks, VIS_THREADS, 0, st>>>(qkv, bias, cs, N, h, w, merge, heads, hd, Q, K,
                                                                    V);
    CU_LAUNCH_CHECK("vis_rope_split_kernel");
    return 0;
}

int cu_vis_attn_supported(int hd) { return hd == 16 || hd == 32 || hd == 64 || hd == 128; }

template <int HD>
static int vis_attn_attr(squad_err *err) {
    CU_TRY(cudaFuncSetAttribute(vis_attn_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)va_smem<HD>::bytes));
    return 0;
}

int cu_vis_attn_init(int hd, squad_err *err) {
    switch (hd) {
    case 16: return vis_attn_attr<16>(err);
    case 32: return vis_attn_attr<32>(err);
    case 64: return vis_attn_attr<64>(err);
    case 128: return vis_attn_attr<128>(err);
    }
    return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA vision tower: head dim %d (16, 32, 64 or 128)", hd);
}

int cu_vis_attn(const bf16 *Q, const bf16 *K, const bf16 *V, int frames, int L, int heads, int hd, float scale,
                bf16 *out, cudaStream_t st, squad_err *err) {
    if (frames < 1 || L < 1 || frames > 65535 || heads > 65535)
        return cu_err(err, SQUAD_E_INVALID, "CUDA vision attention: %d frames of %d patches, %d heads", frames, L,
                      heads);
    const dim3 grid((unsigned)((L + VA_ROWS - 1) / VA_ROWS), (unsigned)heads, (unsigned)frames);
    const int N = frames * L;
    const float sl2 = scale * 1.4426950408889634f; /* log2(e) */
    switch (hd) {
    case 16: vis_attn_kernel<16><<<grid, VA_THREADS, va_smem<16>::bytes, st>>>(Q, K, V, out, N, L, heads, sl2); break;
    case 32: vis_attn_kernel<32><<<grid, VA_THREADS, va_smem<32>::bytes, st>>>(Q, K, V, out, N, L, heads, sl2); break;
    case 64: vis_attn_kernel<64><<<grid, VA_THREADS, va_smem<64>::bytes, st>>>(Q, K, V, out, N, L, heads, sl2); break;
    case 128:
        vis_attn_kernel<128><<<grid, VA_THREADS, va_smem<128>::bytes, st>>>(Q, K, V, out, N, L, heads, sl2);
        break;
    default: return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA vision attention: head dim %d", hd);
    }
    CU_LAUNCH_CHECK("vis_attn_kernel");
    return 0;
}

int cu_vis_bias_act(bf16 *y, const float *bias, int rows, int n, int act, cudaStream_t st, squad_err *err) {
    if (n % VIS_ACT_VEC)
        return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA vision tower: bias over %d columns (a multiple of 8)", n);
    const size_t vecs = (size_t)rows * (n / VIS_ACT_VEC);
    if (vecs > 0x7fffffffu) return cu_err(err, SQUAD_E_INVALID, "CUDA vision tower: %d x %d activations", rows, n);
    const unsigned total = (unsigned)vecs, row_vecs = (unsigned)(n / VIS_ACT_VEC);
    const unsigned blocks = (total + VIS_THREADS - 1) / VIS_THREADS;
    if (act == CU_VIS_ACT_GELU_TANH)
        vis_bias_act_kernel<CU_VIS_ACT_GELU_TANH><<<blocks, VIS_THREADS, 0, st>>>(y, bias, total, row_vecs);
    else if (act == CU_VIS_ACT_GELU_ERF)
        vis_bias_act_kernel<CU_VIS_ACT_GELU_ERF><<<blocks, VIS_THREADS, 0, st>>>(y, bias, total, row_vecs);
    else
        vis_bias_act_kernel<CU_VIS_ACT_NONE><<<blocks, VIS_THREADS, 0, st>>>(y, bias, total, row_vecs);
    CU_LAUNCH_CHECK("vis_bias_act_kernel");
    return 0;
}

int cu_vis_rows_init(float *y, const float *bias, int rows, int n, cudaStream_t st, squad_err *err) {
    const size_t total = (size_t)rows * n;
    vis_rows_init_kernel<<<vis_blocks(total), VIS_THREADS, 0, st>>>(y, bias, total, n);
    CU_LAUNCH_CHECK("vis_rows_init_kernel");
    return 0;
}

/* ---- the exact path's launchers ---- */

int cu_vis_rope_split_f32(const float *qkv, const float *bias, const float2 *cs, int N, int h, int w, int merge,
                          int heads, int hd, float *Q, float *K, float *V, cudaStream_t st, squad_err *err) {
    if (hd % 4) return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA vision tower: rotary over head dim %d", hd);
    const size_t n = (size_t)N * heads * (hd / 2);
    const size_t blocks = (n + VIS_THREADS - 1) / VIS_THREADS;
    if (blocks > 0x7fffffffu) return cu_err(err, SQUAD_E_INVALID, "CUDA vision tower: %d patches", N);
    vis_rope_split_f32_kernel<<<(unsigned)blocks, VIS_THREADS, 0, st>>>(qkv, bias, cs, N, h, w, merge, heads, hd, Q,
                                                                        K, V);
    CU_LAUNCH_CHECK("vis_rope_split_f32_kernel");
    return 0;
}

int cu_vis_attn_f32(const float *Q, const float *K, const float *V, int frames, int L, int heads, int hd, float scale,
                    float *out, cudaStream_t st, squad_err *err) {
    if (frames < 1 || L < 1 || frames > 65535 || heads > 65535)
        return cu_err(err, SQUAD_E_INVALID, "CUDA vision attention: %d frames of %d patches, %d heads", frames, L,
                      heads);
    const dim3 grid((unsigned)((L + VAF_WARPS - 1) / VAF_WARPS), (unsigned)heads, (unsigned)frames);
    const int N = frames * L, threads = VAF_WARPS * 32;
    switch (hd) {
    case 16: vis_attn_f32_kernel<16><<<grid, threads, 0, st>>>(Q, K, V, out, N, L, heads, scale); break;
    case 32: vis_attn_f32_kernel<32><<<grid, threads, 0, st>>>(Q, K, V, out, N, L, heads, scale); break;
    case 64: vis_attn_f32_kernel<64><<<grid, threads, 0, st>>>(Q, K, V, out, N, L, heads, scale); break;
    case 128: vis_attn_f32_kernel<128><<<grid, threads, 0, st>>>(Q, K, V, out, N, L, heads, scale); break;
    default: return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA vision attention (fp32): head dim %d", hd);
    }
    CU_LAUNCH_CHECK("vis_attn_f32_kernel");
    return 0;
}

int cu_vis_bias_act_f32(float *y, const float *bias, int rows, int n, int act, cudaStream_t st, squad_err *err) {
    const size_t total = (size_t)rows * n;
    const unsigned blocks = vis_blocks(total);
    if (act == CU_VIS_ACT_GELU_TANH)
        vis_bias_act_f32_kernel<CU_VIS_ACT_GELU_TANH><<<blocks, VIS_THREADS, 0, st>>>(y, bias, total, n);
    else if (act == CU_VIS_ACT_GELU_ERF)
        vis_bias_act_f32_kernel<CU_VIS_ACT_GELU_ERF><<<blocks, VIS_THREADS, 0, st>>>(y, bias, total, n);
    else
        vis_bias_act_f32_kernel<CU_VIS_ACT_NONE><<<blocks, VIS_THREADS, 0, st>>>(y, bias, total, n);
    CU_LAUNCH_CHECK("vis_bias_act_f32_kernel");
    return 0;
}
