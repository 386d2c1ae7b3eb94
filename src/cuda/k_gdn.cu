/*
 * k_gdn.cu — the Gated DeltaNet mixer between in_proj and out_proj on the tensor cores (the bf16 path).
 *
 * The math (docs/design.md section 4), per value head with state S [dk][dv]:
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
 * Four kernels (docs/cuda.md describes them and what they cost):
 * A0, gdn_conv (tiles of 16 tokens, 4 on short chunks, per head segment, a thread per 2 channels): the
 *   causal conv over [saved inputs | chunk] + SiLU for every channel, the L2 norms of q / k; q, k
 *   bf16, v fp32 to scratch. Parallel over tokens, so a short chunk does not wait on a per-block
 *   chain: one tile a block when the blocks fit on the GPU at once, else pipelined (a block walks a
 *   run of 16-row groups, the next group's loads in flight while this one computes).
 * A, gdn_prep (grid blocks x heads, all independent, 256 threads; on short chunks 2 or 4 blocks a
 *   (block, head), each with a share of the outputs: prep_split): the gates and the cumulative
 *   decay; K K^T and Q K^T on the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate) giving
 *   L and P; T = (I + L)^-1 in fp32 by 16 x 16 blocks (substitution on the diagonal, products below);
 *   W and U on the tensor cores with hi + lo bf16 splits of the fp32 operands (plain bf16 there
 *   moves the random test models' answers by ~0.18). Writes W, U^T, P, diag(Gamma) Q, K' and Gamma_last to scratch.
 * B, gdn_scan (one block per value head and 16 columns of dv, sequential over the blocks): only the
 *   recurrence. Two warps keep S^T [16][dk] in fp32 mma accumulators for the whole chunk, each half
 *   of dk (partial deltas summed through shared memory);
 *   per block delta^T = U^T - S^T W^T and S^T = Gamma_last S^T + delta^T K' (K' fragments by
 *   ldmatrix.trans), the accumulator of one product reused as the A operand of the next (the same
 *   fragment layout); block c+1's operands
 *   arrive by bulk copies (one thread, a shared-memory barrier per stage) while block c computes.
 *   Writes S^T at each block start and delta^T (bf16).
 * C, gdn_out (grid blocks x heads, all independent, two warps a 16-row tile, each half of dv;
 *   four tiles a block, or one on short chunks, 8 warps a block either way, the ones beyond the
 *   tiles' only copying; its copies (out_copy) and its math (out_math) are separate steps):
 *   O = diag(Gamma) Q S + P delta on the tensor cores, the gated RMSNorm (o / rms(o) * w * silu(z)) in registers, bf16 out; and the conv state
 *   moved on to the chunk's end (A0, which read it, has finished).
 * D, gdn_fused (a block per (row, value head), for batches of many rows of 65 to 128 tokens): the
 *   whole mixer of a row's head in one block, A0 .. C's steps with every intermediate in shared
 *   memory and S^T in registers for the whole row (kernel D below; docs/cuda.md, "The fused mixer").
 *   Where it runs is measured (cu_gdn_fused_here): on a single row or rows of one block of 64 tokens it
 *   loses to the four kernels' spread.
 * The state is kept transposed, S^T [nv][dv][dk] fp32 (a backend-internal layout).
 * Head dims: the kernels are instantiated for dk, dv padded up to 16, 32, 64 or 128 (DK, DV
 * below); the padding channels of q, k, v are zero, so the padded rows / columns of S stay zero
 * and the gated norm reads only the real dv.
 */
#include "cuda_internal.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GDN_C CU_GDN_CHUNK
#define PREP_THREADS 256

/* The rows of a batch: blockIdx.z is the row, and every kernel first moves its pointers to that
 * row's part of the packed arrays, so the rest of it reads as the forward of one chunk of `bucket`
 * tokens. Row r's tokens start at token r bucket; its blocks of 64 tokens at block r ncb
 * (ncb = ceil(bucket / 64): a row never shares a block with another). */
struct gdn_batch_args {
    size_t s_off, conv_off;     /* this layer's S and conv inputs in a slot's arena (bytes) */
    int bucket, ncb;
};

/* The scratch arrays moved to the row's tokens (tok0) and blocks (blk0 = row ncb). */
__device__ __forceinline__ void gdn_scratch_row(cu_gdn_scratch &s, size_t tok0, size_t blk0, int nk, int nv, int DK,
                                                int DV) {
    const size_t nb = blk0 * nv; /* blocks x heads */
    if (s.Qn) { /* the chunked path */
        s.Qn += tok0 * nk * DK;
        s.Kn += tok0 * nk * DK;
        s.Vn += tok0 * nv * DV;
        s.W += nb * GDN_C * CU_GDN_LDW(DK);
        s.UT += nb * DV * CU_GDN_LDU;
        s.Qg += nb * GDN_C * DK;
        s.Kp += nb * GDN_C * CU_GDN_LDW(DK);
        s.Pm += nb * GDN_C * GDN_C;
        s.glast += nb;
        s.Sc += nb * DV * DK;
        s.dT += nb * DV * GDN_C;
    }
}

/* ---- kernel A0: the causal conv + SiLU and the q / k L2 norms, one block per token --------------- */

struct gdn_conv_args {
    const bf16 *P;
    int ldP;
    const float *conv_w;    /* [C][K] */
    const cu_chunk_params *prm; /* the batch's rows; per row: its own (its saved conv inputs in its arena) */
    gdn_batch_args bt;
    int nk, nv, K, C;
    int dk, dv, DK, DV; /* real and padded head dims */
    cu_gdn_scratch scr;
};

#define CONV_THREADS 64 /* two channels a thread: a head segment of up to 128 (padded) channels */
#define CONV_TT_LONG 16 /* tokens per block */
#define CONV_TT_SHORT 4 /* on short chunks (cu_gdn_dims.short_rows): 4x the blocks, a quarter of the chain */
/* Blocks an SM the registers must allow: the kernel is bound by load latency, so resident warps
 * are its speed. Left to itself the compiler took 80 registers at KC 4, TT 16 once the kernel
 * read its row from the batch (12 blocks an SM instead of 16: a cold row's conv 25 % slower).
 * Up to KC 5: 16 blocks (64 registers), 24 (40) on short chunks, no spills; KC 6 .. 8 spill
 * there and get 12 (85) and 16 (64). */
#define CONV_MIN_BLOCKS(KC, TT) ((KC) <= 5 ? ((TT) <= CONV_TT_SHORT ? 24 : 16) : ((TT) <= CONV_TT_SHORT ? 16 : 12))

/* Block (x, seg): tokens [TT x, TT (x + 1)) of one head segment (q heads, then k heads, then v
 * heads), a thread per pair of channels (bf16x2 loads). Each thread loads its channels'
 * TT + KC - 1 inputs (rows before the chunk come from the saved conv inputs) and KC weights, all
 * before any is used, then slides the kernel down the block in registers: one round of loads a
 * block (a round of loads per token makes each block one long latency chain). KC, the conv kernel
 * size, is a template parameter so no padded taps are computed (computing CU_MAX_CONV_K taps made
 * the kernel issue-bound). q and k rows are L2-normalised (warp sums, then across the block's warps through
 * shared memory; q also scaled by 1 / sqrt(dk)) and written bf16; v is written fp32 (U = T diag(beta)
 * V needs fp32 operands). Padding channels get 0; rows past len are not written (the prep kernel
 * zero-fills them). TT, the tokens of a block, is 16, or 4 on short chunks (with 16, a hit's 128
 * tokens make 384 blocks of 2 warps each running a 16-token chain: latency-bound). */
/* Channels ch, ch + 1 of row tau (bf16 pair bits; 0 past len, for channels not real, or below the
 * chunk without saved inputs): rows before the chunk from conv_in (the row's saved inputs), the
 * others at src, the row in P. The one-tile kernel's loads, as bits. */
__device__ __forceinline__ uint32_t conv_ld_pair(const bf16 *src, const bf16 *conv_in, int C, int KC, int tau,
                                                 int len, int ch, bool r0, bool r1) {
    uint32_t v = 0u;
    if (r0 && tau < len) {
        const bf16 *p = (conv_in == NULL || tau >= 0) ? src : conv_in + (size_t)(KC - 1 + tau) * C + ch;
        if (r1 && ((ch & 1) == 0)) {
            v = __ldg((const unsigned int *)p);
        } else {
            const unsigned short *h = (const unsigned short *)p;
            v = (uint32_t)__ldg(h) | (r1 ? (uint32_t)__ldg(h + 1) << 16 : 0u);
        }
    }
    return v;
}
__device__ __forceinline__ float2 conv_pair_f2(uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v));
}

/* The conv + SiLU of tokens [t0, t0 + TT) of a row (its tokens from tok0 in P) for channels ch and
 * ch + 1 (r0, r1: real), 0 at tokens past len, in two steps. conv_tile_load issues the KC weights'
 * and the chunk's TT + KC - 1 input rows' loads, all before any is used and before the row's length
 * is known (every token of the bucket has its row of P; the rows are clamped into the bucket), so
 * their round trip overlaps the length's instead of following it; rows before the chunk are left 0.
 * conv_tile_finish, once len and the row's saved inputs (conv_in, which only its first blocks
 * read: NULL elsewhere) are known, loads the rows before the chunk from conv_in, zeroes the rows at
 * or past len, and computes. The inputs stay raw bf16 pairs until used (conv_ld_pair's bits). */
template <int KC, int TT>
__device__ __forceinline__ void conv_tile_load(const bf16 *P, int ldP, const float *conv_w, int bucket, int tok0,
                                               int t0, int ch, bool r0, bool r1, float (&w0)[KC], float (&w1)[KC],
                                               uint32_t (&x)[TT + KC - 1]) {
#pragma unroll
    for (int j = 0; j < KC; j++) {
        w0[j] = r0 ? conv_w[(size_t)ch * KC + j] : 0.f;
        w1[j] = r1 ? conv_w[(size_t)(ch + 1) * KC + j] : 0.f;
    }
#pragma unroll
    for (int m = 0; m < TT + KC - 1; m++) { /* x[m]: the inputs at row t0 - (KC - 1) + m */
        const int tau = t0 - (KC - 1) + m;
        const int row = tau < bucket ? tau : bucket - 1;
        x[m] = tau >= 0 ? conv_ld_pair(P + (size_t)(tok0 + row) * ldP + ch, NULL, 0, KC, 0, 1, ch, r0, r1) : 0u;
    }
}
template <int KC, int TT>
__device__ __forceinline__ void conv_tile_finish(uint32_t (&x)[TT + KC - 1], const float (&w0)[KC],
                                                 const float (&w1)[KC], const bf16 *conv_in, int C, int t0, int len,
                                                 int ch, bool r0, bool r1, float2 (&y)[TT]) {
#pragma unroll
    for (int m = 0; m < TT + KC - 1; m++) {
        const int tau = t0 - (KC - 1) + m;
        if (tau >= len)
            x[m] = 0u;
        else if (tau < 0 && conv_in != NULL)
            x[m] = conv_ld_pair(NULL, conv_in, C, KC, tau, len, ch, r0, r1);
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float a0 = 0.f, a1 = 0.f;
#pragma unroll
        for (int j = 0; j < KC; j++) {
            const float2 v = conv_pair_f2(x[t + j]);
            a0 += w0[j] * v.x;
            a1 += w1[j] * v.y;
        }
        const bool live = t0 + t < len;
        y[t] = make_float2(live && r0 ? cu_silu(a0) : 0.f, live && r1 ? cu_silu(a1) : 0.f);
    }
}

/* The TT rows' sums of squares over a warp (each lane's two channels of y) by a halving exchange: at
 * each step a lane keeps half of its rows and sends the other half to its partner (lane bits
 * log2 TT .. 1), so 16 sums cost 16 shuffles (16 warp sums would cost 80); the lane bits left (0, and
 * those above log2 TT + 1 when TT < 16) are summed by plain shuffles. Lane L ends with the sum of row
 * (L >> 1) & (TT - 1); conv_row_lane says which lanes hold a row's sum. */
template <int TT>
__device__ __forceinline__ float conv_row_sums(const float2 (&y)[TT], int lane) {
    static_assert(TT >= 1 && TT <= 16 && (TT & (TT - 1)) == 0, "the exchange halves a power of two rows");
    float q[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) q[t] = y[t].x * y[t].x + y[t].y * y[t].y;
#pragma unroll
    for (int half = TT / 2; half >= 1; half >>= 1) {
        const bool up = (lane & (2 * half)) != 0; /* keeps the upper half of its rows */
#pragma unroll
        for (int k = 0; k < half; k++) {
            const float send = up ? q[k] : q[k + half], keep = up ? q[k + half] : q[k];
            q[k] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * half);
        }
    }
    q[0] += __shfl_xor_sync(0xffffffffu, q[0], 1);
#pragma unroll
    for (int m = 2 * TT; m < 32; m <<= 1) q[0] += __shfl_xor_sync(0xffffffffu, q[0], m);
    return q[0];
}
template <int TT>
__device__ __forceinline__ bool conv_row_lane(int lane) { return (lane & 1) == 0 && (lane & ~(2 * TT - 1)) == 0; }
/* The L2-norm scale of a row from its two warps' sums (in this order: the same bits everywhere). */
#define GDN_QK_NORM_EPS 1e-6f /* the q / k L2 norms' eps (the reference's l2norm) */
__device__ __forceinline__ float conv_row_scale(float s0, float s1, float qs) {
    float ss = 0.f;
    ss += s0;
    ss += s1;
    return rsqrtf(ss + GDN_QK_NORM_EPS) * qs;
}

template <int KC, int TT, int MINB>
__global__ void __launch_bounds__(CONV_THREADS, MINB) gdn_conv_kernel(gdn_conv_args a) {
    constexpr int NW = CONV_THREADS / 32;
    static_assert(NW == 2, "a row's sum is its two warps' (conv_row_scale)");
    __shared__ float red[NW][TT];
    const int t0 = blockIdx.x * TT, seg = blockIdx.y;
    const cu_chunk_params *prm = a.prm + blockIdx.z;
    /* The row's tokens are found by their index in the batch (tok0 + t), not by moving the pointers
     * in `a` to the row: moved pointers live in registers for the whole kernel (64 -> 80 registers
     * at KC 4, TT 16: 12 blocks an SM instead of 16, and a cold row's conv 25 % slower), where
     * unmoved ones stay kernel parameters. The saved inputs are read only by a row's first blocks. */
    const int tok0 = blockIdx.z * a.bt.bucket;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int i = 2 * tid; /* this thread's first channel in the segment */
    const bool isq = seg < a.nk, isv = seg >= 2 * a.nk;
    const int size = isv ? a.dv : a.dk, pad = isv ? a.DV : a.DK;
    const int base = isv ? 2 * a.nk * a.dk + (seg - 2 * a.nk) * a.dv : seg * a.dk;
    /* both channels real, or the first only (odd head dim), or neither */
    const bool r0 = i < size, r1 = i + 1 < size;
    const int ch = base + i;
    float w0[KC], w1[KC];
    uint32_t x[TT + KC - 1];
    conv_tile_load<KC, TT>(a.P, a.ldP, a.conv_w, a.bt.bucket, tok0, t0, ch, r0, r1, w0, w1, x);
    const int len = prm->len;
    if (t0 >= len) return; /* also every block of a padding row */
    const bf16 *conv_in = t0 < KC - 1 ? (const bf16 *)(cu_gdn_in(prm) + a.bt.conv_off) : NULL;
    float2 y[TT];
    conv_tile_finish<KC, TT>(x, w0, w1, conv_in, a.C, t0, len, ch, r0, r1, y);
    if (isv) {
        if (i < pad) {
            float *dst = a.scr.Vn + (size_t)(seg - 2 * a.nk) * pad + i;
#pragma unroll
            for (int t = 0; t < TT; t++)
                if (t0 + t < len) *(float2 *)(dst + (size_t)(tok0 + t0 + t) * a.nv * pad) = y[t];
        }
        return;
    }
    const float q0 = conv_row_sums<TT>(y, lane);
    if (conv_row_lane<TT>(lane)) red[w][(lane >> 1) & (TT - 1)] = q0;
    __syncthreads();
    if (i < pad) {
        const float qs = isq ? rsqrtf((float)a.dk) : 1.f;
        bf16 *dst = (isq ? a.scr.Qn : a.scr.Kn) + (size_t)(isq ? seg : seg - a.nk) * pad + i;
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (t0 + t >= len) break;
            const float sc = conv_row_scale(red[0][t], red[1][t], qs);
            *(uint32_t *)(dst + (size_t)(tok0 + t0 + t) * a.nk * pad) = cu_pack_bf16(y[t].x * sc, y[t].y * sc);
        }
    }
}

/* ---- kernel A0, pipelined: long launches (a cold row's thousands of tokens, a batch of rows) ----- */

/* The one-tile conv above does one round of loads a block: each block waits for its loads, then
 * computes while nothing of its own is in flight, and a launch of many waves of such blocks reads
 * at a third of the bandwidth (2048 tokens: 41-45 us a layer for ~59 MB, ~14 us at 4.2 TB/s; this
 * form takes 27.7, ncu on the H200).
 * This form keeps the loads going: a block owns a run of `ng` groups of CONV_GROUP rows of one head
 * segment and issues the next group's loads before the math of this one, so while it computes, a
 * group's worth of its loads is in flight; the KC - 1 rows a group shares with the next stay in
 * registers (no rows read twice). The grid is about one wave (conv_pipe_groups). Each group is
 * computed as CONV_GROUP / TT tiles of TT rows by the one-tile kernel's arithmetic (the same taps
 * in the same order, conv_row_sums<TT> on the same TT-row tiles, conv_row_scale), so the bits are
 * the one-tile kernel's of the same TT. The raw inputs stay bf16 pairs in registers (half the
 * registers of floats) until used. */
#define CONV_GROUP 16 /* rows a block loads in one round (a 16-row tile, or four 4-row tiles) */
/* Blocks an SM: x (KC + 15 pairs), the next group (16) and y (32 floats) live at once; 10 blocks
 * (96 registers) hold them without spills at KC <= 4, 8 (128) at KC 5 .. 8. (Two groups' loads in
 * flight, or 8-row groups for 4-row tiles, measured no faster: docs/cuda.md.) */
#define CONV_PIPE_MIN_BLOCKS(KC) ((KC) <= 4 ? 10 : 8)

/* Block (x, seg, row): groups [ng x, ng (x + 1)) of G = CONV_GROUP rows of head segment seg (as
 * the one-tile kernel: q heads, then k heads, then v heads; a thread per pair of channels). */
template <int KC, int TT>
__global__ void __launch_bounds__(CONV_THREADS, CONV_PIPE_MIN_BLOCKS(KC))
    gdn_conv_pipe_kernel(gdn_conv_args a, int ng) {
    constexpr int G = CONV_GROUP, NTL = G / TT, NX = G + KC - 1, NW = CONV_THREADS / 32;
    static_assert(G % TT == 0, "a group is whole tiles");
    static_assert(NW == 2, "a row's sum is its two warps' (conv_row_scale)");
    __shared__ float red[2][NW][G]; /* two buffers: a group's sums are read before the next group's barrier */
    const int seg = blockIdx.y;
    const cu_chunk_params *prm = a.prm + blockIdx.z;
    const int len = prm->len;
    const int t0 = blockIdx.x * ng * G;
    if (t0 >= len) return; /* also every block of a padding row */
    int n = (len - t0 + G - 1) / G; /* groups with real rows */
    if (n > ng) n = ng;
    /* pointers stay kernel parameters (moved ones would take registers for the whole kernel) */
    const int tok0 = blockIdx.z * a.bt.bucket;
    const bf16 *conv_in = t0 < KC - 1 ? (const bf16 *)(cu_gdn_in(prm) + a.bt.conv_off) : NULL;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int i = 2 * tid;
    const bool isq = seg < a.nk, isv = seg >= 2 * a.nk;
    const int size = isv ? a.dv : a.dk, pad = isv ? a.DV : a.DK;
    const int base = isv ? 2 * a.nk * a.dk + (seg - 2 * a.nk) * a.dv : seg * a.dk;
    const bool r0 = i < size, r1 = i + 1 < size;
    const int ch = base + i;
    float w0[KC], w1[KC];
#pragma unroll
    for (int j = 0; j < KC; j++) {
        w0[j] = r0 ? a.conv_w[(size_t)ch * KC + j] : 0.f;
        w1[j] = r1 ? a.conv_w[(size_t)(ch + 1) * KC + j] : 0.f;
    }
    /* x[m]: row g0 - (KC - 1) + m of the group at g0 */
    uint32_t x[NX];
    {
        const bf16 *Pb = a.P + (size_t)(tok0 + t0) * a.ldP + ch;
#pragma unroll
        for (int m = 0; m < NX; m++)
            x[m] = conv_ld_pair(Pb + (m - (KC - 1)) * a.ldP, conv_in, a.C, KC, t0 - (KC - 1) + m, len, ch, r0, r1);
    }
    /* group g's rows (0 past the block's groups) */
    auto load_group = [&](uint32_t(&dst)[G], int g) {
        if (g < n) {
            const int gr0 = t0 + g * G;
            const bf16 *Pn = a.P + (size_t)(tok0 + gr0) * a.ldP + ch;
#pragma unroll
            for (int m = 0; m < G; m++) dst[m] = conv_ld_pair(Pn + m * a.ldP, NULL, a.C, KC, gr0 + m, len, ch, r0, r1);
        } else {
#pragma unroll
            for (int m = 0; m < G; m++) dst[m] = 0u;
        }
    };
    const float qs = isq ? rsqrtf((float)a.dk) : 1.f;
#pragma unroll 1
    for (int gi = 0; gi < n; gi++) {
        const int g0 = t0 + gi * G;
        /* the next group's rows first: in flight while this group computes */
        uint32_t nx[G];
        load_group(nx, gi + 1);
        float2 y[G];
#pragma unroll
        for (int t = 0; t < G; t++) {
            float a0 = 0.f, a1 = 0.f;
#pragma unroll
            for (int j = 0; j < KC; j++) {
                const float2 v = conv_pair_f2(x[t + j]);
                a0 += w0[j] * v.x;
                a1 += w1[j] * v.y;
            }
            const bool live = g0 + t < len;
            y[t] = make_float2(live && r0 ? cu_silu(a0) : 0.f, live && r1 ? cu_silu(a1) : 0.f);
        }
        if (isv) {
            if (i < pad) {
                float *dst = a.scr.Vn + (size_t)(seg - 2 * a.nk) * pad + i;
#pragma unroll
                for (int t = 0; t < G; t++)
                    if (g0 + t < len) *(float2 *)(dst + (size_t)(tok0 + g0 + t) * a.nv * pad) = y[t];
            }
        } else {
            float (*rb)[G] = red[gi & 1];
#pragma unroll
            for (int k = 0; k < NTL; k++) {
                const float q0 = conv_row_sums<TT>(*reinterpret_cast<const float2(*)[TT]>(y + k * TT), lane);
                if (conv_row_lane<TT>(lane)) rb[w][k * TT + ((lane >> 1) & (TT - 1))] = q0;
            }
            __syncthreads();
            if (i < pad) {
                bf16 *dst = (isq ? a.scr.Qn : a.scr.Kn) + (size_t)(isq ? seg : seg - a.nk) * pad + i;
#pragma unroll
                for (int t = 0; t < G; t++) {
                    if (g0 + t >= len) break;
                    const float sc = conv_row_scale(rb[0][t], rb[1][t], qs);
                    *(uint32_t *)(dst + (size_t)(tok0 + g0 + t) * a.nk * pad) = cu_pack_bf16(y[t].x * sc, y[t].y * sc);
                }
            }
        }
        /* slide: the last KC - 1 rows stay, the next group's follow */
#pragma unroll
        for (int m = 0; m < KC - 1; m++) x[m] = x[G + m];
#pragma unroll
        for (int m = 0; m < G; m++) x[KC - 1 + m] = nx[m];
    }
}

/* The pipelined conv's groups a block (0: the one-tile kernel instead). The one-tile kernel keeps
 * launches whose blocks all fit on the GPU at once (a hit's question: one wave, and nothing to
 * overlap), and every launch when `fixed` (cu_gdn_dims.conv_groups) is < 0; fixed > 0 sets the
 * groups (the tests' variants: both kernels give the same bits). Otherwise about one
 * wave of pipelined blocks: each (row, segment) gets as many blocks as the wave has room for, and the
 * groups are spread evenly over them; a batch of more (row, segment) pairs than that takes one block
 * a pair. Without an SM count (the tests' launches) 3 groups a block, so the carried rows and a
 * block's partial last run are exercised. */
static int conv_pipe_groups(int rows, int tt, int n_seg, unsigned nrows, int K, int n_sm, int fixed) {
    if (fixed < 0) return 0;
    const int g_row = (rows + CONV_GROUP - 1) / CONV_GROUP;
    if (fixed > 0) return fixed < g_row ? fixed : g_row;
    if (n_sm <= 0) return 3 < g_row ? 3 : g_row;
    const long pairs = (long)n_seg * nrows;
    const long one_tile = (long)((rows + tt - 1) / tt) * pairs;
    if (one_tile <= (long)n_sm * CONV_MIN_BLOCKS(K, tt)) return 0;
    long bx = (long)n_sm * CONV_PIPE_MIN_BLOCKS(K) / pairs; /* blocks a (row, segment) */
    if (bx < 1) bx = 1;
    if (bx > g_row) bx = g_row;
    const int ng = (int)((g_row + bx - 1) / bx);
    return ng;
}

/* The conv kernel for the model's kernel size (1 .. CU_MAX_CONV_K), with 4 tokens a tile on short
 * chunks: pipelined over groups of rows on long launches (conv_pipe_groups), else one tile a block. */
static int launch_gdn_conv(const gdn_conv_args &ca, int rows, bool short_rows, int n_seg, unsigned nrows, int n_sm,
                           int conv_groups, cudaStream_t st, squad_err *err) {
    const int tt = short_rows ? CONV_TT_SHORT : CONV_TT_LONG;
    const int ng = conv_pipe_groups(rows, tt, n_seg, nrows, ca.K, n_sm, conv_groups);
    const dim3 grid((rows + tt - 1) / tt, n_seg, nrows);
    const dim3 pgrid(ng > 0 ? ((rows + CONV_GROUP - 1) / CONV_GROUP + ng - 1) / ng : 1, n_seg, nrows);
    switch (ca.K) {
#define CONV_CASE(KC_)                                                                                             \
    case KC_:                                                                                                      \
        if (ng > 0 && short_rows)                                                                                  \
            gdn_conv_pipe_kernel<KC_, CONV_TT_SHORT><<<pgrid, CONV_THREADS, 0, st>>>(ca, ng);                      \
        else if (ng > 0)                                                                                           \
            gdn_conv_pipe_kernel<KC_, CONV_TT_LONG><<<pgrid, CONV_THREADS, 0, st>>>(ca, ng);                       \
        else if (short_rows)                                                                                       \
            gdn_conv_kernel<KC_, CONV_TT_SHORT, CONV_MIN_BLOCKS(KC_, CONV_TT_SHORT)><<<grid, CONV_THREADS, 0, st>>>(ca); \
        else                                                                                                       \
            gdn_conv_kernel<KC_, CONV_TT_LONG, CONV_MIN_BLOCKS(KC_, CONV_TT_LONG)><<<grid, CONV_THREADS, 0, st>>>(ca); \
        break;
        CONV_CASE(1) CONV_CASE(2) CONV_CASE(3) CONV_CASE(4) CONV_CASE(5) CONV_CASE(6) CONV_CASE(7) CONV_CASE(8)
#undef CONV_CASE
    default:
        return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA: conv kernel size %d not supported", ca.K);
    }
    CU_LAUNCH_CHECK("gdn_conv_kernel");
    return 0;
}

/* ---- kernel A: per (block of 64 tokens, value head) ------------------------------------------- */

struct gdn_prep_args {
    const bf16 *P;
    int ldP;
    const float *A_log, *dt_bias;
    const cu_chunk_params *prm;
    gdn_batch_args bt;
    int nk, nv, C;
    int dk, dv; /* real head dims (<= DK, DV) */
    cu_gdn_scratch scr;
};

#define GDN_LDT (GDN_C + 8) /* bf16 row stride of [x][64] tiles (bank-conflict padding) */

template <int DK, int DV>
struct prep_smem {
    static constexpr int LDK = DK + 8; /* bf16 row stride of [64][DK] tiles */
    static constexpr int LDV = DV + 4; /* fp32 row stride of V (conflict-free B fragments) */
    static constexpr int LDL = GDN_C + 1;
    static constexpr size_t q_off = 0;                                   /* Qs [64][LDK] bf16 */
    static constexpr size_t k_off = q_off + (size_t)GDN_C * LDK * 2;     /* Ks [64][LDK] bf16 */
    static constexpr size_t v_off = k_off + (size_t)GDN_C * LDK * 2;     /* V [64][LDV] fp32 */
    static constexpr size_t l_off = v_off + (size_t)GDN_C * LDV * 4;     /* L [64][LDL] fp32 */
    static constexpr size_t t_off = l_off + (size_t)GDN_C * LDL * 4;     /* T [64][LDL] fp32 */
    static constexpr size_t vec_off = t_off + (size_t)GDN_C * LDL * 4;
    static constexpr size_t bytes = vec_off + (size_t)4 * GDN_C * 4;
};

/* x = hi + lo with hi, lo bf16: products of split operands on the tensor cores keep ~16 bits of
 * mantissa (fp32-like for these sums; plain bf16 moves the random test models' answers by ~0.18) */
__device__ __forceinline__ void split_bf16(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = cu_pack_bf16(x0 - __low2float(h), x1 - __high2float(h));
}

/* The prep's split: SPLIT blocks share one (block of 64 tokens, head). Each computes the gates, L
 * and T = (I + L)^-1 (the block's dependent chain, repeated), and 1 / SPLIT of the rest: P, Gamma Q
 * and K' by rows, W by columns of dk, U^T by columns of dv. On a short chunk the prep is one wave of
 * latency-bound blocks (32 for a 128-token question), so more, shorter blocks finish sooner; a long
 * chunk has blocks enough and keeps 1. Every output element is computed by the same instructions in
 * the same order whatever the split, so the results are the same bits. A split needs 16 columns of
 * dk and dv a block (mma tiles), so small heads run fewer (S). */
#define PREP_SPLIT_MAX 4
template <int DK, int DV, int SPLIT>
struct prep_split {
    static constexpr int S0 = SPLIT < DK / 16 ? SPLIT : DK / 16;
    static constexpr int S = S0 < DV / 16 ? S0 : DV / 16; /* the split actually run */
    static constexpr int ROWS = GDN_C / S;                 /* token rows of P, Gamma Q, K' */
    static constexpr int WB = DK / S, UB = DV / S;         /* columns of W, U^T */
};

/* The gates of a token (g, the log-decay, and beta) from its raw a, b; 0 for a token past the row. */
__device__ __forceinline__ void prep_gate(float raw_a, float raw_b, float a_log, float dt_b, bool live, float &g,
                                          float &b) {
    g = 0.f, b = 0.f;
    if (live) {
        const float x = raw_a + dt_b;
        const float sp = x > 20.f ? x : log1pf(__expf(x));
        g = -__expf(a_log) * sp;
        b = cu_sigmoid(raw_b);
    }
}

/* One warp: the block's cumulative log-decay gamma in place of its gates g (64 of them), Gamma =
 * exp(gamma) and exp(gamma_last - gamma); returns gamma_last (every lane). */
__device__ __forceinline__ float prep_decay(float *gam, float *Gam, float *gsc, int lane) {
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
    return glast;
}

/* Eight bf16 values scaled by f, rounded back to bf16 (diag(Gamma) Q and K' rows). */
__device__ __forceinline__ uint4 prep_scale8(uint4 v, float f) {
    const __nv_bfloat162 *v2 = (const __nv_bfloat162 *)&v;
    uint4 o;
    uint32_t *o2 = (uint32_t *)&o;
#pragma unroll
    for (int u = 0; u < 4; u++) o2[u] = cu_pack_bf16(f * __low2float(v2[u]), f * __high2float(v2[u]));
    return o;
}

/* The prep's steps, shared by the prep kernel and the fused mixer (kernel D): the same
 * instructions in the same order, so both give W, U^T, P and T the same bits. Q, K (bf16) and V
 * (fp32) of one block of 64 tokens are in shared memory, rows DK + 8 and DV + 4 apart. */
template <int DK>
__device__ __forceinline__ void prep_lp(const bf16 *Qs, const bf16 *Ks, float *Ls, const float *gam,
                                        const float *bet, bf16 *Pm, int ldPm, int row0, int prow, int tid) {
    constexpr int LDK = DK + 8, LDL = GDN_C + 1;
    const int w = tid >> 5, lane = tid & 31, r = lane >> 2, cc = lane & 3;
    /* P rows [row0, row0 + prow) go to Pm (rows ldPm apart); L is the block's whole */
    /* 3. K K^T -> L and Q K^T -> P (mma), warp w: rows 16 (w/2).., cols 32 (w%2).. (4 n-tiles). The
     *    k-steps outermost, so the A fragments of K and Q (ldmatrix) are loaded once for the 4 n-tiles
     *    (not once per n-tile by scalar loads). */
    {
        const int mt = w >> 1, i0 = 16 * mt + r, i1 = i0 + 8;
        /* this warp's row tile is among the split's P rows (warp-uniform) */
        const bool pw = 16 * mt >= row0 && 16 * mt < row0 + prow;
        float kk[4][4], qk4[4][4];
#pragma unroll
        for (int q4 = 0; q4 < 4; q4++)
#pragma unroll
            for (int e = 0; e < 4; e++) kk[q4][e] = qk4[q4][e] = 0.f;
        /* n-tiles above the diagonal (P and L are 0 there) are skipped: warp-uniform */
        const int nt0 = (w & 1) * 4;
#pragma unroll
        for (int ks = 0; ks < DK / 16; ks++) {
            const int k0 = 16 * ks + 2 * cc;
            uint32_t ak[4], aq[4] = {0u, 0u, 0u, 0u};
            cu_ldmatrix_x4(ak, Ks + (16 * mt + (lane & 15)) * LDK + 16 * ks + (lane >> 4) * 8);
            if (pw) cu_ldmatrix_x4(aq, Qs + (16 * mt + (lane & 15)) * LDK + 16 * ks + (lane >> 4) * 8);
#pragma unroll
            for (int q4 = 0; q4 < 4; q4++) {
                const int nt = nt0 + q4;
                if (8 * nt > 16 * mt + 15) continue;
                const uint32_t b0 = *(const uint32_t *)(Ks + (8 * nt + r) * LDK + k0);
                const uint32_t b1 = *(const uint32_t *)(Ks + (8 * nt + r) * LDK + k0 + 8);
                cu_mma16816(kk[q4], ak, b0, b1);
                if (pw) cu_mma16816(qk4[q4], aq, b0, b1);
            }
        }
#pragma unroll
        for (int q4 = 0; q4 < 4; q4++) {
            const int nt = nt0 + q4, j0 = 8 * nt + 2 * cc;
            if (8 * nt > 16 * mt + 15) { /* above the diagonal: P is 0 there */
                if (pw) {
                    *(uint32_t *)(Pm + i0 * ldPm + j0) = 0u;
                    *(uint32_t *)(Pm + i1 * ldPm + j0) = 0u;
                }
                continue;
            }
            const int ii[4] = {i0, i0, i1, i1}, jj[4] = {j0, j0 + 1, j0, j0 + 1};
            float pv[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int ri = ii[e], cj = jj[e];
                const float dec = cj <= ri ? __expf(gam[ri] - gam[cj]) : 0.f;
                if (cj < ri) Ls[ri * LDL + cj] = bet[ri] * dec * kk[q4][e];
                pv[e] = dec * qk4[q4][e];
            }
            if (pw) {
                *(uint32_t *)(Pm + i0 * ldPm + j0) = cu_pack_bf16(pv[0], pv[1]);
                *(uint32_t *)(Pm + i1 * ldPm + j0) = cu_pack_bf16(pv[2], pv[3]);
            }
        }
    }
    __syncthreads();

}

/* T = (I + L)^-1 from L in Ls (both [64][GDN_C + 1] fp32); X: 3 x 256 floats of scratch. Ends
 * with a barrier. */
__device__ __forceinline__ void prep_inverse(const float *Ls, float *Ts, float *X, int tid) {
    constexpr int LDL = GDN_C + 1;
    /* 4. T = (I + L)^-1 by blocks of 16: L is strictly lower triangular, so T is unit lower
     *    triangular, and with 16 x 16 blocks T_ii = (I + L_ii)^-1 on the diagonal and, below it,
     *    T_ij = -T_ii X_ij with X_ij = sum_{j <= k < i} L_ik T_kj. Substituting down all 64 rows of
     *    every column is a chain of 64 dependent steps, half of them on zeros above the diagonal (most
     *    of a prep warp's instructions on a short chunk); this is a chain of 16 plus three levels of
     *    small products. */
    {
        /* 4a. the diagonal blocks by forward substitution, a thread a column (the first two warps; the
         *     others wait at the barrier): the sum over earlier rows in four chains by k mod 4, added
         *     pairwise, (k0 + k1) + (k2 + k3), four short independent chains a step where four threads
         *     a column needed two dependent shuffles a step; the column stays in registers, stored after */
        if (tid < GDN_C) {
            const int col = tid, base = col & ~15;
            float tv[16]; /* rows base + rr */
#pragma unroll
            for (int rr = 0; rr < 16; rr++) {
                const int row = base + rr;
                float p4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int m = 0; m < 4; m++)
#pragma unroll
                    for (int qq = 0; qq < 4; qq++)
                        if (4 * m + qq < rr) p4[qq] += Ls[row * LDL + base + 4 * m + qq] * tv[4 * m + qq];
                tv[rr] = (row == col ? 1.f : 0.f) - ((p4[0] + p4[1]) + (p4[2] + p4[3]));
            }
#pragma unroll
            for (int rr = 0; rr < 16; rr++) Ts[(base + rr) * LDL + col] = tv[rr];
        }
        __syncthreads();
        /* 4b. below the diagonal, one block diagonal d at a time (each needs the ones before); X through
         *     shared memory in Q's tile (dead since step 3: 3 x 256 floats fit its 64 x (DK + 8) bf16).
         *     Both products are shared-memory bound (two loads a multiply-add, ncu: the pipe's stalls),
         *     so a thread takes 2 x 2 elements of a block, rows rb, rb + 8 and columns cb, cb + 8: a load
         *     each per multiply-add. Each element keeps its sums (even and odd k apart, added last),
         *     so the results do not depend on the mapping. */
        static_assert(GDN_C == 64 && PREP_THREADS == 256, "the blocked inverse maps 256 threads to 16 x 16 blocks");
        const int q = tid >> 6, rb = (tid >> 3) & 7, cb = tid & 7; /* block q of a diagonal, 2 x 2 elements */
#pragma unroll
        for (int d = 1; d < 4; d++) {
            const int i0 = 16 * (q + d), j0 = 16 * q; /* block (j + d, j), j = q */
            if (q < 4 - d) {
                float s[2][2][2] = {}; /* [row rb, rb + 8][column cb, cb + 8][k even, odd] */
#pragma unroll
                for (int k = 0; k < 16 * d; k++) {
                    const float l0 = Ls[(i0 + rb) * LDL + j0 + k], l1 = Ls[(i0 + rb + 8) * LDL + j0 + k];
                    const float u0 = Ts[(j0 + k) * LDL + j0 + cb], u1 = Ts[(j0 + k) * LDL + j0 + cb + 8];
                    s[0][0][k & 1] += l0 * u0;
                    s[0][1][k & 1] += l0 * u1;
                    s[1][0][k & 1] += l1 * u0;
                    s[1][1][k & 1] += l1 * u1;
                }
#pragma unroll
                for (int a2 = 0; a2 < 2; a2++)
#pragma unroll
                    for (int b2 = 0; b2 < 2; b2++)
                        X[q * 256 + (rb + 8 * a2) * 16 + cb + 8 * b2] = s[a2][b2][0] + s[a2][b2][1];
            }
            __syncthreads();
            if (q < 4 - d) {
                float s[2][2][2] = {}; /* T_ii's rows: 0 past the diagonal (4a stored them) */
#pragma unroll
                for (int m = 0; m < 16; m++) {
                    const float a0 = Ts[(i0 + rb) * LDL + i0 + m], a1 = Ts[(i0 + rb + 8) * LDL + i0 + m];
                    const float x0 = X[q * 256 + m * 16 + cb], x1 = X[q * 256 + m * 16 + cb + 8];
                    s[0][0][m & 1] += a0 * x0;
                    s[0][1][m & 1] += a0 * x1;
                    s[1][0][m & 1] += a1 * x0;
                    s[1][1][m & 1] += a1 * x1;
                }
#pragma unroll
                for (int a2 = 0; a2 < 2; a2++)
#pragma unroll
                    for (int b2 = 0; b2 < 2; b2++)
                        Ts[(i0 + rb + 8 * a2) * LDL + j0 + cb + 8 * b2] = -(s[a2][b2][0] + s[a2][b2][1]);
            }
            __syncthreads();
        }
    }

}

/* W and U^T of the split's columns (prep_split) from T: W [64][CU_GDN_LDW(DK)] bf16 and U^T
 * [DV][CU_GDN_LDU] fp32 (the block's, in global or shared memory). sbg: 64 floats of scratch (L's,
 * dead after the inverse). */
template <int DK, int DV, int SPLIT>
__device__ __forceinline__ void prep_wu(const float *Ts, float *sbg, const float *bet, const float *Gam,
                                        const bf16 *Ks, const float *Vs, bf16 *W, float *UT, int sp, int tid) {
    typedef prep_split<DK, DV, SPLIT> SP;
    constexpr int LDK = DK + 8, LDV = DV + 4, LDL = GDN_C + 1;
    const int w = tid >> 5, lane = tid & 31, r = lane >> 2, cc = lane & 3;
    /* 5. W = T diag(beta Gamma) K and U = T diag(beta) V on the tensor cores with split operands
     *    (A = T diag(.) as hi + lo bf16; K is bf16 already, V fp32 split too: U = Ah Vh + Ah Vl + Al Vh).
     *    Warp w: rows 16 (w / 2).., half (w % 2) of the columns; T is lower triangular, so only the
     *    k-steps up to the warp's row tile contribute. */
    {
        const int mt = w >> 1, half = w & 1;
        const int i0 = 16 * mt + r, i1 = i0 + 8;
        /* A fragments of T diag(s) for k-step ks, split hi / lo */
        auto a_frag = [&](int ks, const float *scale, uint32_t (&ah)[4], uint32_t (&al)[4]) {
            const int k0 = 16 * ks + 2 * cc;
            const float s0 = scale[k0], s1 = scale[k0 + 1], s8 = scale[k0 + 8], s9 = scale[k0 + 9];
            split_bf16(Ts[i0 * LDL + k0] * s0, Ts[i0 * LDL + k0 + 1] * s1, ah[0], al[0]);
            split_bf16(Ts[i1 * LDL + k0] * s0, Ts[i1 * LDL + k0 + 1] * s1, ah[1], al[1]);
            split_bf16(Ts[i0 * LDL + k0 + 8] * s8, Ts[i0 * LDL + k0 + 9] * s9, ah[2], al[2]);
            split_bf16(Ts[i1 * LDL + k0 + 8] * s8, Ts[i1 * LDL + k0 + 9] * s9, ah[3], al[3]);
        };
        if (tid < GDN_C) sbg[tid] = bet[tid] * Gam[tid];
        __syncthreads();

        /* W: the split's columns [sp WB, (sp + 1) WB) of DK, half CW each, CW = WB / 2 (or all 16
         * when WB = 16) */
        constexpr int CW = SP::WB / 2 < 16 ? 16 : SP::WB / 2, NPW = CW / 16;
        const int wc0 = sp * SP::WB + half * CW; /* this warp's first column */
        if (half * CW < SP::WB) {
            float acc[2 * NPW][4];
#pragma unroll
            for (int j = 0; j < 2 * NPW; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                if (ks > mt) break;
                uint32_t ah[4], al[4];
                a_frag(ks, sbg, ah, al);
#pragma unroll
                for (int np = 0; np < NPW; np++) {
                    uint32_t kb[4];
                    cu_ldmatrix_x4_trans(kb, Ks + (16 * ks + (lane & 15)) * LDK + wc0 + 16 * np + (lane >> 4) * 8);
                    cu_mma16816(acc[2 * np], ah, kb[0], kb[1]);
                    cu_mma16816(acc[2 * np], al, kb[0], kb[1]);
                    cu_mma16816(acc[2 * np + 1], ah, kb[2], kb[3]);
                    cu_mma16816(acc[2 * np + 1], al, kb[2], kb[3]);
                }
            }
#pragma unroll
            for (int j = 0; j < 2 * NPW; j++) {
                const int n = wc0 + 8 * j + 2 * cc;
                *(uint32_t *)(W + i0 * CU_GDN_LDW(DK) + n) = cu_pack_bf16(acc[j][0], acc[j][1]);
                *(uint32_t *)(W + i1 * CU_GDN_LDW(DK) + n) = cu_pack_bf16(acc[j][2], acc[j][3]);
            }
        }
        /* U^T: columns [half DV / 2, ...) of DV, B fragments from fp32 V split on the fly */
        {
            constexpr int CU = SP::UB / 2, NJU = CU / 8;
            const int uc0 = sp * SP::UB + half * CU; /* this warp's first column */
            float acc[NJU][4];
#pragma unroll
            for (int j = 0; j < NJU; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                if (ks > mt) break;
                uint32_t ah[4], al[4];
                a_frag(ks, bet, ah, al);
                const int k0 = 16 * ks + 2 * cc;
#pragma unroll
                for (int j = 0; j < NJU; j++) {
                    const int n = uc0 + 8 * j + r;
                    uint32_t bh0, bl0, bh1, bl1;
                    split_bf16(Vs[k0 * LDV + n], Vs[(k0 + 1) * LDV + n], bh0, bl0);
                    split_bf16(Vs[(k0 + 8) * LDV + n], Vs[(k0 + 9) * LDV + n], bh1, bl1);
                    cu_mma16816(acc[j], ah, bh0, bh1);
                    cu_mma16816(acc[j], ah, bl0, bl1);
                    cu_mma16816(acc[j], al, bh0, bh1);
                }
            }
#pragma unroll
            for (int j = 0; j < NJU; j++) {
                const int n = uc0 + 8 * j + 2 * cc;
                UT[n * CU_GDN_LDU + i0] = acc[j][0];
                UT[(n + 1) * CU_GDN_LDU + i0] = acc[j][1];
                UT[n * CU_GDN_LDU + i1] = acc[j][2];
                UT[(n + 1) * CU_GDN_LDU + i1] = acc[j][3];
            }
        }
    }
}

template <int DK, int DV, int SPLIT>
__global__ void __launch_bounds__(PREP_THREADS, 2) gdn_prep_kernel(gdn_prep_args a) {
    typedef prep_smem<DK, DV> SM;
    typedef prep_split<DK, DV, SPLIT> SP;
    constexpr int LDK = SM::LDK, LDV = SM::LDV;
    static_assert(SM::LDK == DK + 8 && SM::LDV == DV + 4 && SM::LDL == GDN_C + 1, "the strides prep_lp .. prep_wu use");
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)(smem + SM::q_off);
    bf16 *Ks = (bf16 *)(smem + SM::k_off);
    float *Vs = (float *)(smem + SM::v_off);
    float *Ls = (float *)(smem + SM::l_off);
    float *Ts = (float *)(smem + SM::t_off);
    float *gam = (float *)(smem + SM::vec_off);
    float *Gam = gam + GDN_C, *bet = Gam + GDN_C, *gsc = bet + GDN_C;

    const int c = blockIdx.x, h = blockIdx.y / SP::S, sp = blockIdx.y % SP::S;
    const int hk = h / (a.nv / a.nk);
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int row0 = sp * SP::ROWS; /* this block's rows of P, Gamma Q, K' */
    const int t0 = c * GDN_C;
    /* The gates' inputs are loaded before the row's length is known: every token of the bucket has
     * its row of P (a padding token's is computed too), and tokens past len are masked below. So the
     * gates' global round trip overlaps the length's instead of following it. */
    float raw_b = 0.f, raw_a = 0.f, a_log = 0.f, dt_b = 0.f;
    if (tid < GDN_C) {
        const int tt = min(t0 + tid, a.bt.bucket - 1);
        const bf16 *prow = a.P + ((size_t)blockIdx.z * a.bt.bucket + tt) * a.ldP + a.C + a.nv * a.dv; /* b, a */
        raw_b = __bfloat162float(prow[h]);
        raw_a = __bfloat162float(prow[a.nv + h]);
        a_log = a.A_log[h];
        dt_b = a.dt_bias[h];
    }
    a.prm += blockIdx.z;
    const int len = a.prm->len;
    /* a block wholly past the row's tokens (a padding row's every block): the scan never reads it,
     * the output kernel writes its zeros without it */
    if (t0 >= len) return;
    {
        const size_t tok0 = (size_t)blockIdx.z * a.bt.bucket;
        gdn_scratch_row(a.scr, tok0, (size_t)blockIdx.z * a.bt.ncb, a.nk, a.nv, DK, DV);
    }
    const size_t blk = (size_t)c * a.nv + h;

    /* the conv kernel's q, k (bf16, normalised) and v (fp32) rows of this block; 0 past len */
    {
        /* Q: the split's rows only; K: all (L needs them); V: the split's U^T columns only */
        constexpr int SK = DK / 8, SV = SP::UB / 4;
        for (int e = tid; e < GDN_C * SK; e += PREP_THREADS) {
            const int t = e / SK, s = e % SK;
            const bool ok = t0 + t < len;
            const size_t src = ((size_t)(ok ? t0 + t : 0) * a.nk + hk) * DK + 8 * s;
            if (SP::S == 1 || (t >= row0 && t < row0 + SP::ROWS))
                cu_cp_async16(Qs + t * LDK + 8 * s, a.scr.Qn + src, ok ? 16 : 0);
            cu_cp_async16(Ks + t * LDK + 8 * s, a.scr.Kn + src, ok ? 16 : 0);
        }
        for (int e = tid; e < GDN_C * SV; e += PREP_THREADS) {
            const int t = e / SV, s = sp * (SP::UB / 4) + e % SV;
            const bool ok = t0 + t < len;
            cu_cp_async16(Vs + t * LDV + 4 * s, a.scr.Vn + ((size_t)(ok ? t0 + t : 0) * a.nv + h) * DV + 4 * s,
                          ok ? 16 : 0);
        }
        cu_cp_async_commit();
    }

    /* 0. gates */
    if (tid < GDN_C) /* b, a follow q, k, v and z in P (loaded at the top) */
        prep_gate(raw_a, raw_b, a_log, dt_b, t0 + tid < len, gam[tid], bet[tid]);
    __syncthreads();
    if (w == 0) { /* cumulative log-decay */
        const float glast = prep_decay(gam, Gam, gsc, lane);
        if (lane == 31 && sp == 0) a.scr.glast[blk] = __expf(glast);
    }
    cu_cp_async_wait<0>();
    __syncthreads();

    /* 2. diag(Gamma) Q and K' = diag(exp(gamma_last - gamma)) K to global, 8 values a thread-step */
    {
        constexpr int SK = DK / 8;
        bf16 *Qg = a.scr.Qg + blk * GDN_C * DK;
        bf16 *Kp = a.scr.Kp + blk * GDN_C * CU_GDN_LDW(DK);
        for (int e = tid; e < SP::ROWS * SK; e += PREP_THREADS) {
            const int t = row0 + e / SK, s = e % SK;
            *(uint4 *)(Qg + t * DK + 8 * s) = prep_scale8(*(const uint4 *)(Qs + t * LDK + 8 * s), Gam[t]);
            *(uint4 *)(Kp + t * CU_GDN_LDW(DK) + 8 * s) = prep_scale8(*(const uint4 *)(Ks + t * LDK + 8 * s), gsc[t]);
        }
    }

    prep_lp<DK>(Qs, Ks, Ls, gam, bet, a.scr.Pm + blk * GDN_C * GDN_C, GDN_C, row0, SP::ROWS, tid);
    prep_inverse(Ls, Ts, reinterpret_cast<float *>(Qs), tid); /* X in Q's tile, dead since step 3 */
    prep_wu<DK, DV, SPLIT>(Ts, Ls, bet, Gam, Ks, Vs, a.scr.W + blk * GDN_C * CU_GDN_LDW(DK),
                           a.scr.UT + blk * DV * CU_GDN_LDU, sp, tid);
}

/* Two m16n8 accumulator tiles (columns 16 ks .. 16 ks + 15 of a product) as an m16k16 bf16 A
 * fragment: mma's accumulator layout is its A operand's, so one product's result feeds the next. */
__device__ __forceinline__ void gdn_acc_to_a(const float (&lo)[4], const float (&hi)[4], uint32_t (&a)[4]) {
    a[0] = cu_pack_bf16(lo[0], lo[1]);
    a[1] = cu_pack_bf16(lo[2], lo[3]);
    a[2] = cu_pack_bf16(hi[0], hi[1]);
    a[3] = cu_pack_bf16(hi[2], hi[3]);
}

/* A warp's S^T in mma accumulators: rows n0 and n0 + 8 of a head's [DV][DK] state, NJ 8-column
 * tiles from dk column kofs (the recurrence of gdn_scan and of the fused mixer). */
template <int DK, int NJ>
__device__ __forceinline__ void gdn_state_load(float (&S)[NJ][4], const float *Sh, int n0, int kofs, int cc) {
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const float2 lo = *(const float2 *)(Sh + (size_t)n0 * DK + kofs + 8 * j + 2 * cc);
        const float2 hi = *(const float2 *)(Sh + (size_t)(n0 + 8) * DK + kofs + 8 * j + 2 * cc);
        S[j][0] = lo.x;
        S[j][1] = lo.y;
        S[j][2] = hi.x;
        S[j][3] = hi.y;
    }
}
template <int DK, int NJ>
__device__ __forceinline__ void gdn_state_store(const float (&S)[NJ][4], float *Sh, int n0, int kofs, int cc) {
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        *(float2 *)(Sh + (size_t)n0 * DK + kofs + 8 * j + 2 * cc) = make_float2(S[j][0], S[j][1]);
        *(float2 *)(Sh + (size_t)(n0 + 8) * DK + kofs + 8 * j + 2 * cc) = make_float2(S[j][2], S[j][3]);
    }
}
/* One block's step of the state: S^T = Gamma_last S^T + delta^T K' over the warp's dk columns, delta^T
 * as bf16 A fragments (k = tokens), K' [64][ldk] bf16 in shared memory (B[k = token][n = dk]: pairs
 * along the token, so ldmatrix.trans). */
template <int NJ>
__device__ __forceinline__ void gdn_state_step(float (&S)[NJ][4], float gl, const uint32_t (&dF)[4][4],
                                               const bf16 *Kp, int ldk, int kofs, int lane) {
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        S[j][0] *= gl;
        S[j][1] *= gl;
        S[j][2] *= gl;
        S[j][3] *= gl;
    }
#pragma unroll
    for (int ks = 0; ks < 4; ks++)
#pragma unroll
        for (int np = 0; np < NJ / 2; np++) {
            uint32_t kb[4];
            cu_ldmatrix_x4_trans(kb, Kp + (16 * ks + (lane & 15)) * ldk + kofs + 16 * np + (lane >> 4) * 8);
            cu_mma16816(S[2 * np], dF[ks], kb[0], kb[1]);
            cu_mma16816(S[2 * np + 1], dF[ks], kb[2], kb[3]);
        }
}

/* ---- kernel B: the recurrence; one block per (value head, 16 rows of S^T), sequential over blocks */

struct gdn_scan_args {
    float *S; /* [nv][DV][DK] (padded): set per row from its arena */
    const cu_chunk_params *prm;
    gdn_batch_args bt;
    int nk, nv, rows; /* rows: the bucket */
    cu_gdn_scratch scr;
};

/* Per block of 64 tokens the scan is a chain of dependent MMAs, and ncu showed it issue-bound per
 * warp (one instruction every ~3 cycles). So the work of one step is spread over many warps:
 * warp (rg, kq) owns S^T rows [16 rg, 16 rg + 16) of the block's slice and dk columns
 * [kq DK / KS, (kq + 1) DK / KS): its part of delta's sum over dk goes through shared memory to the
 * other KS - 1 warps of its row group (every warp adds the KS parts in the same order, so all hold
 * the same delta), and it updates only its own dk columns. The next block's W, K' and U^T arrive
 * while this one computes, as three bulk copies (the prep kernel stores them with the padded row
 * strides used here) issued by one thread and counted on a shared-memory barrier per stage: 16-byte
 * cp.async by the compute warps costs them ~200 of ~600 instructions a step, and dedicated loader
 * warps do not pass compute-sanitizer racecheck. */
#ifndef SQUAD_SCAN_KS
#define SQUAD_SCAN_KS 2 /* warps splitting dk (DK >= 64): 2 measured faster than 4 with 2 row groups */
#endif
#ifndef SQUAD_SCAN_RG
#define SQUAD_SCAN_RG 1 /* row groups of 16 per block: 1 gives twice the blocks of 2, and measured faster */
#endif
/* RG_: the row groups a launch asks for (cu_gdn_dims.scan_rg), bounded by DV / 16. NS_: the
 * stages of W, K' and U^T in shared memory: 2 (the next block's arrive while this one computes),
 * or 1 for rows of one block of 64 tokens (nothing to prefetch): half the shared memory, so more
 * blocks share an SM (a batch of short rows runs thousands of scan blocks). */
template <int DK, int DV, int RG_ = SQUAD_SCAN_RG, int NS_ = 2>
struct scan_smem {
    static constexpr int KS = DK >= 64 ? (SQUAD_SCAN_KS < DK / 32 ? SQUAD_SCAN_KS : DK / 32) : 1;
    static constexpr int RG = RG_ * 16 <= DV ? RG_ : (DV >= 32 ? DV / 16 : 1);
    static constexpr int BV = 16 * RG;                /* S^T rows (dv) per block */
    static constexpr int NWARP = RG * KS;
    static constexpr int LDW = CU_GDN_LDW(DK);        /* W and K' rows [64][DK] */
    static constexpr int LDU = CU_GDN_LDU;            /* U^T rows (fp32) */
    static constexpr unsigned w_bytes = GDN_C * LDW * 2, u_bytes = BV * LDU * 4;
    static constexpr size_t w_off = 0;
    static constexpr size_t k_off = w_off + w_bytes;
    static constexpr size_t u_off = k_off + w_bytes;
    static constexpr size_t stage = u_off + u_bytes;
    static constexpr int NS = NS_;
    static constexpr size_t x_off = NS * stage; /* partial deltas [NWARP][8 float4][32 lanes] */
    static constexpr size_t bar_off = x_off + (KS > 1 ? (size_t)NWARP * 8 * 32 * 16 : 0); /* 2 barriers */
    static constexpr size_t bytes = bar_off + 2 * sizeof(uint64_t);
    static_assert(w_bytes % 16 == 0 && u_bytes % 16 == 0 && stage % 16 == 0, "bulk copies move 16-byte units");
};

/* One thread: block blk's W, K' and this block's U^T rows into a stage, counted on its barrier. */
template <int DK, int DV, int RG_>
__device__ __forceinline__ void scan_fetch(unsigned char *st, uint64_t *bar, const cu_gdn_scratch &scr, size_t blk,
                                           int n_base) {
    typedef scan_smem<DK, DV, RG_> SM; /* the stage's layout (not the stage count) */
    cu_mbar_expect_tx(bar, 2 * SM::w_bytes + SM::u_bytes);
    cu_bulk_g2s(st + SM::w_off, scr.W + blk * GDN_C * SM::LDW, SM::w_bytes, bar);
    cu_bulk_g2s(st + SM::k_off, scr.Kp + blk * GDN_C * SM::LDW, SM::w_bytes, bar);
    cu_bulk_g2s(st + SM::u_off, scr.UT + (blk * DV + n_base) * SM::LDU, SM::u_bytes, bar);
}

template <int DK, int DV, int RG_, int NS_>
__global__ void __launch_bounds__(scan_smem<DK, DV, RG_, NS_>::NWARP * 32) gdn_scan_kernel(gdn_scan_args a) {
    typedef scan_smem<DK, DV, RG_, NS_> SM;
    constexpr int KS = SM::KS;
    constexpr int DKH = DK / KS;  /* this warp's dk columns */
    constexpr int NJ = DKH / 8;   /* n-tiles of S^T along them */
    constexpr int NKS = DKH / 16; /* k-steps along them */
    extern __shared__ __align__(16) unsigned char smem[];
    const int h = blockIdx.x, n_base = blockIdx.y * SM::BV;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int rg = w / KS, kq = w % KS;
    const int r = lane >> 2, cc = lane & 3;
    const int kofs = kq * DKH;
    a.prm += blockIdx.z;
    const int len = a.prm->len;
    if (len < 1) return; /* a padding row: no state to touch */
    a.S = (float *)(a.prm->gdn + a.bt.s_off);
    /* the state at the chunk's start: a restored blob's or the arena's */
    const float *S_in = (const float *)(cu_gdn_in(a.prm) + a.bt.s_off);
    gdn_scratch_row(a.scr, (size_t)blockIdx.z * a.bt.bucket, (size_t)blockIdx.z * a.bt.ncb, a.nk, a.nv, DK, DV);
    const int nreal = (len + GDN_C - 1) / GDN_C; /* the row's blocks holding real tokens */
    float4 *X = (float4 *)(smem + SM::x_off);
    uint64_t *bar = (uint64_t *)(smem + SM::bar_off); /* bar[s]: stage s's copies have landed */
    if (tid == 0) {
        cu_mbar_init(&bar[0], 1);
        cu_mbar_init(&bar[1], 1);
        cu_mbar_init_fence();
    }
    __syncthreads();
    if (tid == 0 && nreal > 0) scan_fetch<DK, DV, RG_>(smem, &bar[0], a.scr, (size_t)h, n_base);

    /* S^T rows n0, n0 + 8 of this head, dk columns [kofs, kofs + DKH), in accumulators */
    float Sacc[NJ][4];
    float *Sh = a.S + (size_t)h * DV * DK;
    const float *Sh_in = S_in + (size_t)h * DV * DK;
    const int nl = 16 * rg + r; /* row inside the block's slice */
    const int n0 = n_base + nl;
    gdn_state_load<DK, NJ>(Sacc, Sh_in, n0, kofs, cc);

    for (int ci = 0; ci < nreal; ci++) {
        const size_t blk = (size_t)ci * a.nv + h;
        const unsigned char *st = smem + (ci & 1) * SM::stage;
        const bf16 *Ws = (const bf16 *)(st + SM::w_off), *Ks = (const bf16 *)(st + SM::k_off);
        const float *Us = (const float *)(st + SM::u_off);
        uint32_t nS[NKS][4]; /* -S^T as bf16 A fragments */
        {
            /* the state at the block start, for the output kernel */
            bf16 *Sc = a.scr.Sc + (blk * DV + n0) * DK + kofs;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                *(uint32_t *)(Sc + 8 * j + 2 * cc) = cu_pack_bf16(Sacc[j][0], Sacc[j][1]);
                *(uint32_t *)(Sc + 8 * DK + 8 * j + 2 * cc) = cu_pack_bf16(Sacc[j][2], Sacc[j][3]);
            }
#pragma unroll
            for (int ks = 0; ks < NKS; ks++) {
                nS[ks][0] = cu_pack_bf16(-Sacc[2 * ks][0], -Sacc[2 * ks][1]);
                nS[ks][1] = cu_pack_bf16(-Sacc[2 * ks][2], -Sacc[2 * ks][3]);
                nS[ks][2] = cu_pack_bf16(-Sacc[2 * ks + 1][0], -Sacc[2 * ks + 1][1]);
                nS[ks][3] = cu_pack_bf16(-Sacc[2 * ks + 1][2], -Sacc[2 * ks + 1][3]);
            }
        }
        cu_mbar_wait(&bar[ci & 1], (unsigned)(ci >> 1) & 1u); /* block ci's operands have landed */
        __syncthreads(); /* and every warp is done with block ci - 1's stage: refill it */
        if (tid == 0 && ci + 1 < nreal)
            scan_fetch<DK, DV, RG_>(smem + ((ci + 1) & 1) * SM::stage, &bar[(ci + 1) & 1], a.scr,
                                    (size_t)(ci + 1) * a.nv + h, n_base);
        const float gl = a.scr.glast[blk];

        /* delta^T = U^T - S^T W^T: this warp's part of the sum over dk (the kq = 0 warp adds U^T) */
        float D[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (kq == 0) {
                const float2 lo = *(const float2 *)(Us + nl * SM::LDU + 8 * j + 2 * cc);
                const float2 hi = *(const float2 *)(Us + (nl + 8) * SM::LDU + 8 * j + 2 * cc);
                D[j][0] = lo.x;
                D[j][1] = lo.y;
                D[j][2] = hi.x;
                D[j][3] = hi.y;
            } else {
                D[j][0] = D[j][1] = D[j][2] = D[j][3] = 0.f;
            }
        }
#pragma unroll
        for (int ks = 0; ks < NKS; ks++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int k0 = kofs + 16 * ks + 2 * cc;
                const uint32_t w0 = *(const uint32_t *)(Ws + (8 * j + r) * SM::LDW + k0);
                const uint32_t w1 = *(const uint32_t *)(Ws + (8 * j + r) * SM::LDW + k0 + 8);
                cu_mma16816(D[j], nS[ks], w0, w1);
            }
        if (KS > 1) { /* sum the row group's KS parts, in rank order in every warp */
#pragma unroll
            for (int q = 0; q < 8; q++)
                X[(w * 8 + q) * 32 + lane] = make_float4(D[q][0], D[q][1], D[q][2], D[q][3]);
            __syncthreads();
            float T[8][4];
#pragma unroll
            for (int q = 0; q < 8; q++) T[q][0] = T[q][1] = T[q][2] = T[q][3] = 0.f;
#pragma unroll
            for (int u = 0; u < KS; u++) {
#pragma unroll
                for (int q = 0; q < 8; q++) {
                    float4 v;
                    if (u == kq)
                        v = make_float4(D[q][0], D[q][1], D[q][2], D[q][3]);
                    else
                        v = X[((rg * KS + u) * 8 + q) * 32 + lane];
                    T[q][0] += v.x;
                    T[q][1] += v.y;
                    T[q][2] += v.z;
                    T[q][3] += v.w;
                }
            }
#pragma unroll
            for (int q = 0; q < 8; q++) D[q][0] = T[q][0], D[q][1] = T[q][1], D[q][2] = T[q][2], D[q][3] = T[q][3];
        }
        /* delta^T to global (bf16) and as A fragments (k = tokens) */
        bf16 *dT = a.scr.dT + (blk * DV + n0) * GDN_C;
        uint32_t dF[4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            gdn_acc_to_a(D[2 * ks], D[2 * ks + 1], dF[ks]);
            if (kq == 0) {
                *(uint32_t *)(dT + 16 * ks + 2 * cc) = dF[ks][0];
                *(uint32_t *)(dT + 8 * GDN_C + 16 * ks + 2 * cc) = dF[ks][1];
                *(uint32_t *)(dT + 16 * ks + 8 + 2 * cc) = dF[ks][2];
                *(uint32_t *)(dT + 8 * GDN_C + 16 * ks + 8 + 2 * cc) = dF[ks][3];
            }
        }
        gdn_state_step<NJ>(Sacc, gl, dF, Ks, SM::LDW, kofs, lane); /* this warp's dk columns */
    }
    gdn_state_store<DK, NJ>(Sacc, Sh, n0, kofs, cc);
}

/* ---- kernel C: outputs; blocks per (block of 64 tokens, value head), all independent ----------- */

struct gdn_out_args {
    const bf16 *P;
    int ldP;
    bf16 *conv_state; /* [K-1][C], moved on to the chunk's end: set per row from its arena */
    const float *norm_w;
    bf16 *Y; /* [rows][ldY] */
    const cu_chunk_params *prm;
    gdn_batch_args bt;
    int nk, nv, dv, K, C, rows; /* rows: the bucket */
    float eps;
    cu_gdn_scratch scr;
    int ldY; /* Y's row stride (cu_gdn_dims.ldY, or nv dv) */
};

/* RT row tiles of 16 tokens a block, two warps (halves of dv) a tile: RT = 4, one block per (block
 * of 64 tokens, head); on short chunks RT = 1 (with RT = 4 a hit's 128 tokens make only 32 blocks
 * of 8 warps; RT = 1 gives four times the blocks, each re-reading S^T and delta^T from L2). */
#define OUT_TILES (GDN_C / 16) /* row tiles in a block of 64 tokens */
#define OUT_RT_LONG OUT_TILES
#define OUT_RT_SHORT 1
/* A block's threads whatever its row tiles: 2 RT warps compute, all of them copy. With RT = 1 a
 * block's two computing warps also issued its ~54 KB of 16-byte copies alone, and ncu put a third
 * of a hit's output kernel in that issue loop (one block an SM, two warps); the other six warps
 * only copy, so the math and its bits are those of two warps a tile. */
#define OUT_THREADS 256

template <int DK, int DV, int RT>
struct out_smem {
    static constexpr int LDK = DK + 8;
    static constexpr int LDZ = DV + 8;
    static constexpr int R = 16 * RT;                                   /* token rows */
    static constexpr size_t q_off = 0;                                  /* Gamma Q [R][LDK] */
    static constexpr size_t s_off = q_off + (size_t)R * LDK * 2;        /* S^T [DV][LDK] */
    static constexpr size_t p_off = s_off + (size_t)DV * LDK * 2;       /* P [R][LDT] */
    static constexpr size_t d_off = p_off + (size_t)R * GDN_LDT * 2;    /* delta^T [DV][LDT] */
    static constexpr size_t z_off = d_off + (size_t)DV * GDN_LDT * 2;   /* z [R][LDZ] */
    static constexpr size_t bytes = z_off + (size_t)R * LDZ * 2;
};

/* The copies of one (block of 64 tokens, head, row tiles [tile0, tile0 + RT)) into a block's shared
 * memory (out_smem): Gamma Q and P rows, S^T and delta^T (Q, S, Pm, dT at the block's scratch), z
 * rows from Prow (the row's P; 0 past len). Issued by all NT threads, not committed. */
template <int DK, int DV, int RT>
__device__ __forceinline__ void out_copy(unsigned char *smem, const bf16 *Q, const bf16 *S, const bf16 *Pm,
                                         const bf16 *dT, const bf16 *Prow, int ldP, int zoff, int t0, int len, int dv,
                                         int tid) {
    typedef out_smem<DK, DV, RT> SM;
    constexpr int LDK = SM::LDK, LDT = GDN_LDT, NT = OUT_THREADS, R = SM::R;
    static_assert(64 * RT <= OUT_THREADS, "two warps a row tile");
    bf16 *Qs = (bf16 *)(smem + SM::q_off), *Ss = (bf16 *)(smem + SM::s_off);
    bf16 *Ps = (bf16 *)(smem + SM::p_off), *Ds = (bf16 *)(smem + SM::d_off);
    bf16 *Zs = (bf16 *)(smem + SM::z_off);
    constexpr int SK = DK / 8;
    for (int e = tid; e < R * SK; e += NT)
        cu_cp_async16(Qs + (e / SK) * LDK + 8 * (e % SK), Q + (e / SK) * DK + 8 * (e % SK), 16);
    for (int e = tid; e < DV * SK; e += NT)
        cu_cp_async16(Ss + (e / SK) * LDK + 8 * (e % SK), S + (e / SK) * DK + 8 * (e % SK), 16);
    for (int e = tid; e < R * 8; e += NT)
        cu_cp_async16(Ps + (e >> 3) * LDT + 8 * (e & 7), Pm + (e >> 3) * GDN_C + 8 * (e & 7), 16);
    for (int e = tid; e < DV * 8; e += NT)
        cu_cp_async16(Ds + (e >> 3) * LDT + 8 * (e & 7), dT + (e >> 3) * GDN_C + 8 * (e & 7), 16);
    const int SZ = dv / 8;
    for (int e = tid; e < R * SZ; e += NT) {
        const int t = e / SZ, s = e % SZ;
        const bool ok = t0 + t < len;
        const bf16 *src = Prow + (size_t)(ok ? t0 + t : 0) * ldP + zoff + 8 * s;
        cu_cp_async16(Zs + t * SM::LDZ + 8 * s, src, ok ? 16 : 0);
    }
}

/* The gated norm's weights of thread tid's output columns (out_math's d = c0 + 8 j + 2 cc, d + 1;
 * 0 past the real dv), loaded into registers at the kernel's start: read where they are used, their
 * global round trip came after the products, at the end of every block's chain. */
template <int DV, int RT>
__device__ __forceinline__ void out_norm_weights(const float *norm_w, int dv, int tid, float (&nw)[DV / 16][2]) {
    const int w = tid >> 5, cc = (tid & 31) & 3;
    const int c0 = (w / RT) * (DV / 2);
#pragma unroll
    for (int j = 0; j < DV / 16; j++) {
        const int d = c0 + 8 * j + 2 * cc;
        nw[j][0] = d < dv ? norm_w[d] : 0.f;
        nw[j][1] = d < dv ? norm_w[d + 1] : 0.f; /* dv is a multiple of 8 (cu_gdn_supported) */
    }
}

/* The outputs of the RT row tiles in shared memory (out_copy's, landed): O = (Gamma Q) S + P delta,
 * the gated RMSNorm (weights nw: out_norm_weights), bf16 rows [t0, tend) of head h to Yrow (the row's
 * Y, rows ldY apart; 0 past len), by the block's first 2 RT warps (the others only meet the
 * barrier). rsq: the two warps' halves of the sums of squares (one __syncthreads inside). */
template <int DK, int DV, int RT>
__device__ __forceinline__ void out_math(const unsigned char *smem, float (&rsq)[2][16 * RT], bf16 *Yrow, size_t ldY,
                                         const float (&nw)[DV / 16][2], int dv, float eps, int t0, int tile0, int len,
                                         int tend, int h, int tid) {
    typedef out_smem<DK, DV, RT> SM;
    constexpr int LDK = SM::LDK, LDT = GDN_LDT;
    const bf16 *Qs = (const bf16 *)(smem + SM::q_off), *Ss = (const bf16 *)(smem + SM::s_off);
    const bf16 *Ps = (const bf16 *)(smem + SM::p_off), *Ds = (const bf16 *)(smem + SM::d_off);
    const bf16 *Zs = (const bf16 *)(smem + SM::z_off);
    const int w = tid >> 5, lane = tid & 31;
    const int r = lane >> 2, cc = lane & 3;
    /* O = (Gamma Q) S + P delta: warp w rows 16 (w % RT) .., columns [CH (w / RT), CH (w / RT + 1)) of
     * DV (two warps a row tile: twice the warps of one a tile, for the same shared memory) */
    constexpr int CH = DV / 2, NJ = CH / 8;
    const int mt = w % RT, c0 = (w / RT) * CH;
    const bool math = w < 2 * RT; /* warp-uniform */
    float O[NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; j++) O[j][0] = O[j][1] = O[j][2] = O[j][3] = 0.f;
    const int i0 = 16 * mt + r, i1 = i0 + 8;
#pragma unroll
    for (int ks = 0; ks < DK / 16; ks++) {
        if (!math) break;
        const int k0 = 16 * ks + 2 * cc;
        uint32_t aq[4];
        aq[0] = *(const uint32_t *)(Qs + i0 * LDK + k0);
        aq[1] = *(const uint32_t *)(Qs + i1 * LDK + k0);
        aq[2] = *(const uint32_t *)(Qs + i0 * LDK + k0 + 8);
        aq[3] = *(const uint32_t *)(Qs + i1 * LDK + k0 + 8);
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const uint32_t b0 = *(const uint32_t *)(Ss + (c0 + 8 * j + r) * LDK + k0);
            const uint32_t b1 = *(const uint32_t *)(Ss + (c0 + 8 * j + r) * LDK + k0 + 8);
            cu_mma16816(O[j], aq, b0, b1);
        }
    }
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        if (!math || ks > tile0 + mt) break; /* P is lower triangular */
        const int k0 = 16 * ks + 2 * cc;
        uint32_t ap[4];
        ap[0] = *(const uint32_t *)(Ps + i0 * LDT + k0);
        ap[1] = *(const uint32_t *)(Ps + i1 * LDT + k0);
        ap[2] = *(const uint32_t *)(Ps + i0 * LDT + k0 + 8);
        ap[3] = *(const uint32_t *)(Ps + i1 * LDT + k0 + 8);
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const uint32_t b0 = *(const uint32_t *)(Ds + (c0 + 8 * j + r) * LDT + k0);
            const uint32_t b1 = *(const uint32_t *)(Ds + (c0 + 8 * j + r) * LDT + k0 + 8);
            cu_mma16816(O[j], ap, b0, b1);
        }
    }
    /* gated RMSNorm over the real dv: a row's values sit in the 4 lanes of a quad of each of the two
     * warps of its row tile; the halves meet in shared memory, added in the same order by both */
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
    if (math && cc == 0) {
        rsq[w / RT][i0] = ss0;
        rsq[w / RT][i1] = ss1;
    }
    __syncthreads();
    if (!math) return;
    ss0 = rsq[0][i0] + rsq[1][i0];
    ss1 = rsq[0][i1] + rsq[1][i1];
    const float rs0 = rsqrtf(ss0 / (float)dv + eps), rs1 = rsqrtf(ss1 / (float)dv + eps);
    const int tt0 = t0 + i0, tt1 = t0 + i1;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int d = c0 + 8 * j + 2 * cc;
        if (d >= dv) break;
        const float w0 = nw[j][0], w1 = nw[j][1];
        if (tt0 < tend) {
            float y0 = 0.f, y1 = 0.f;
            if (tt0 < len) {
                y0 = O[j][0] * rs0 * w0 * cu_silu(__bfloat162float(Zs[i0 * SM::LDZ + d]));
                y1 = O[j][1] * rs0 * w1 * cu_silu(__bfloat162float(Zs[i0 * SM::LDZ + d + 1]));
            }
            *(uint32_t *)(Yrow + (size_t)tt0 * ldY + (size_t)h * dv + d) = cu_pack_bf16(y0, y1);
        }
        if (tt1 < tend) {
            float y0 = 0.f, y1 = 0.f;
            if (tt1 < len) {
                y0 = O[j][2] * rs1 * w0 * cu_silu(__bfloat162float(Zs[i1 * SM::LDZ + d]));
                y1 = O[j][3] * rs1 * w1 * cu_silu(__bfloat162float(Zs[i1 * SM::LDZ + d + 1]));
            }
            *(uint32_t *)(Yrow + (size_t)tt1 * ldY + (size_t)h * dv + d) = cu_pack_bf16(y0, y1);
        }
    }
}

template <int DK, int DV, int RT>
__global__ void __launch_bounds__(OUT_THREADS) gdn_out_kernel(gdn_out_args a) {
    typedef out_smem<DK, DV, RT> SM;
    constexpr int NT = OUT_THREADS, R = SM::R;
    extern __shared__ __align__(16) unsigned char smem[];
    /* blockIdx.x: the block of 64 tokens c and, inside it, row tiles [tile0, tile0 + RT) */
    const int c = blockIdx.x / (OUT_TILES / RT), tile0 = (blockIdx.x % (OUT_TILES / RT)) * RT;
    const int h = blockIdx.y;
    const int tid = threadIdx.x;
    a.prm += blockIdx.z;
    const int len = a.prm->len, dv = a.dv;
    const int t0 = c * GDN_C + 16 * tile0; /* this block's first token */
    const size_t blk = (size_t)c * a.nv + h;
    float nw[DV / 16][2];
    out_norm_weights<DV, RT>(a.norm_w, a.dv, tid, nw);
    {
        const size_t tok0 = (size_t)blockIdx.z * a.bt.bucket;
        a.P += tok0 * a.ldP;
        a.Y += tok0 * a.ldY;
        gdn_scratch_row(a.scr, tok0, (size_t)blockIdx.z * a.bt.ncb, a.nk, a.nv, DK, DV);
    }
    if (len < 1) { /* a padding row: zeros for out_proj, no state */
        const int tend = min(a.rows, t0 + R);
        for (int e = tid; e < (tend - t0) * dv; e += NT)
            a.Y[(size_t)(t0 + e / dv) * a.ldY + (size_t)h * dv + e % dv] = __float2bfloat16(0.f);
        return;
    }
    a.conv_state = (bf16 *)(a.prm->gdn + a.bt.conv_off);

    /* the conv state moves on (gdn_conv, which read it, has finished); every block takes some
     * channels. Its loads and stores go while the block's operands are on their way (issued
     * first): done before them, they put a dependent round trip to memory ahead of most blocks'
     * copies, which a short chunk's one wave of blocks pays in full. */
    const bf16 *conv_in = (const bf16 *)(cu_gdn_in(a.prm) + a.bt.conv_off);
    const int sh_first = (blockIdx.x * gridDim.y + h) * NT + tid, sh_stride = gridDim.x * gridDim.y * NT;
    const int tend = min(a.rows, t0 + R); /* rows of this block inside the bucket */
    if (t0 >= len) { /* padding only (or past a bucket shorter than 64 rows) */
        cu_conv_state_shift(a.conv_state, conv_in, a.P, a.ldP, a.C, a.K, len, sh_first, sh_stride);
        for (int e = tid; e < (tend - t0) * dv; e += NT)
            a.Y[(size_t)(t0 + e / dv) * a.ldY + (size_t)h * dv + e % dv] = __float2bfloat16(0.f);
        return;
    }
    {
        const bf16 *Q = a.scr.Qg + (blk * GDN_C + 16 * tile0) * DK, *S = a.scr.Sc + blk * DV * DK;
        const bf16 *Pm = a.scr.Pm + (blk * GDN_C + 16 * tile0) * GDN_C, *dT = a.scr.dT + blk * DV * GDN_C;
        out_copy<DK, DV, RT>(smem, Q, S, Pm, dT, a.P, a.ldP, a.C + h * dv, t0, len, dv, tid);
        cu_cp_async_commit();
        cu_conv_state_shift(a.conv_state, conv_in, a.P, a.ldP, a.C, a.K, len, sh_first, sh_stride);
        cu_cp_async_wait<0>();
        __syncthreads();
    }
    __shared__ float rsq[2][R];
    out_math<DK, DV, RT>(smem, rsq, a.Y, (size_t)a.ldY, nw, dv, a.eps, t0, tile0, len, tend, h, tid);
}

/* ---- kernel D: the whole mixer of a short row, one block a (row, value head) ------------------ */

/* The four kernels above spread one (block of 64 tokens, head) over many blocks and pass W, U^T,
 * P, Gamma Q, K', S^T and delta^T between them through L2: on short rows (a hit's question, a
 * batch of them) each kernel is a short latency chain, and the launches and round trips are most of
 * the mixer's time. Here one block of 256 threads runs a row's whole mixer for one value head, its
 * blocks of 64 tokens one after another: the conv of its q, k and v channels, the gates, the prep
 * (the same functions as gdn_prep: prep_lp, prep_inverse, prep_wu), the recurrence with S^T in the
 * first DV / 16 warps' accumulators for the whole row (each warp 16 rows of S^T, every dk column:
 * no partial sums), the output O^T = S^T (Gamma Q)^T + delta^T P^T in the same warps and the gated
 * RMSNorm; every intermediate stays in shared memory or registers. Only S, the conv state and Y
 * leave the block. A block reads and writes only its own head's state and channels, so it needs no
 * other block: the conv state of its channels moves on once its first block of tokens has read
 * them. That holds while every value head has its own q / k head (nv == nk, cu_gdn_fused_ok). The
 * arithmetic is the four kernels' (the same conv taps, prep, chain products) except where the sums
 * meet in another order (the q / k norms, the output's products transposed), so the outputs are
 * within the chunked form's round-off of theirs, not the same bits. A block is one long chain (8
 * warps, one block an SM by its shared memory), so it pays only where many rows fill the GPU with
 * such blocks: a single hit's 16 blocks lose to the four kernels' hundreds (cu_gdn_fused_here). */
#define FUSED_THREADS 256
#define FUSED_K 4 /* the conv width it is built for (the Qwen3.5 models'); others run the four kernels */

struct gdn_fused_args {
    const bf16 *P;
    int ldP;
    const float *conv_w, *A_log, *dt_bias, *norm_w;
    bf16 *Y; /* [rows][ldY] */
    int ldY;
    const cu_chunk_params *prm;
    gdn_batch_args bt;
    int nk, nv, dk, dv, C;
    float eps;
};

template <int DK, int DV>
struct fused_smem {
    static constexpr int LDK = DK + 8, LDV = DV + 4, LDL = GDN_C + 1, LDZ = DV + 8;
    static_assert(LDK == CU_GDN_LDW(DK), "K' and W share the prep's row stride");
    static constexpr size_t q_off = 0;                                 /* Q, then Gamma Q [64][LDK] bf16 */
    static constexpr size_t k_off = q_off + (size_t)GDN_C * LDK * 2;   /* K, then K' [64][LDK] bf16 */
    static constexpr size_t w_off = k_off + (size_t)GDN_C * LDK * 2;   /* W [64][LDK] bf16 */
    static constexpr size_t v_off = w_off + (size_t)GDN_C * LDK * 2;   /* V [64][LDV] fp32 */
    static constexpr size_t u_off = v_off + (size_t)GDN_C * LDV * 4;   /* U^T [DV][CU_GDN_LDU] fp32 */
    static constexpr size_t l_off = u_off + (size_t)DV * CU_GDN_LDU * 4; /* L [64][LDL] fp32; then Y's tile */
    static constexpr size_t t_off = l_off + (size_t)GDN_C * LDL * 4;   /* T [64][LDL] fp32 */
    static constexpr size_t x_off = t_off + (size_t)GDN_C * LDL * 4;   /* the inverse's scratch, 3 x 256 */
    static constexpr size_t p_off = x_off + 3 * 256 * 4;               /* P [64][GDN_LDT] bf16 */
    static constexpr size_t z_off = p_off + (size_t)GDN_C * GDN_LDT * 2; /* z [64][LDZ] bf16 */
    static constexpr size_t vec_off = z_off + (size_t)GDN_C * LDZ * 2; /* gamma, Gamma, beta, exp(gl - g) */
    static constexpr size_t rsq_off = vec_off + 4 * GDN_C * 4;         /* [DV / 16][64] sums of squares */
    static constexpr size_t rs_off = rsq_off + (size_t)(DV / 16) * GDN_C * 4; /* [64] the norm's scales */
    static constexpr int NCW = 2 * DK + DV;                            /* conv channels of a head, padded */
    static constexpr size_t cw_off = (rs_off + GDN_C * 4 + 15) / 16 * 16; /* their weights [NCW][FUSED_K] fp32 */
    static constexpr size_t bytes = cw_off + (size_t)NCW * FUSED_K * 4 + 16; /* + Gamma_last */
    static_assert((size_t)GDN_C * LDZ * 2 <= 2 * (size_t)GDN_C * LDL * 4, "Y's tile fits L and T");
    /* the conv's raw inputs, rows [t0 - (KC - 1), t0 + 64) of [q | k | v] (DK, DK, DV channels), over
     * U^T, L and T (written only after the conv) */
    static constexpr int LDR = 2 * DK + DV + 8;
    static constexpr size_t r_off = u_off;
    static_assert((size_t)(GDN_C + CU_MAX_CONV_K - 1) * LDR * 2 <= x_off - u_off, "the raw inputs fit U^T, L, T");
};

/* The channel (in P's rows, the conv state and the conv weights) of offset c in segment seg (0 q,
 * 1 k, 2 v) of value head h. The fused mixer runs only where nv == nk (cu_gdn_fused_ok), so value
 * head h reads q / k head h. */
__device__ __forceinline__ int fused_channel(const gdn_fused_args &a, int h, int seg, int c) {
    return seg == 0 ? h * a.dk + c : seg == 1 ? (a.nk + h) * a.dk + c : 2 * a.nk * a.dk + h * a.dv + c;
}

/* The conv's raw inputs of the block's 64 tokens into Rs (fused_smem::r_off): rows tau = t0 - (KC - 1)
 * .. t0 + 63 of the head's q, k and v channels, one round of 16-byte copies (not committed); rows
 * before the row from the saved inputs (conv_in, [K-1][C], read 4 bytes at a time), 0 at or past len. */
template <int DK, int DV, int KC>
__device__ __forceinline__ void fused_stage(const gdn_fused_args &a, const bf16 *P, const bf16 *conv_in, int h,
                                            int t0, int len, bf16 *Rs, int tid) {
    typedef fused_smem<DK, DV> SM;
    constexpr int NO = SM::NCW / 8, QO = DK / 8; /* octets of a row (padded), of q's */
    for (int e = tid; e < (GDN_C + KC - 1) * NO; e += FUSED_THREADS) {
        const int m = e / NO, oc = e % NO, tau = t0 - (KC - 1) + m;
        const int seg = oc < QO ? 0 : oc < 2 * QO ? 1 : 2, c = 8 * (oc - seg * QO); /* channel in the segment */
        if (c >= (seg == 2 ? a.dv : a.dk)) continue; /* padding: never read */
        const int ch = fused_channel(a, h, seg, c);
        bf16 *d = Rs + m * SM::LDR + 8 * oc;
        if (tau >= 0) { /* (len > 0: a row before the chunk is a real one) */
            cu_cp_async16(d, P + (size_t)(tau < len ? tau : 0) * a.ldP + ch, tau < len ? 16 : 0);
        } else {
            const unsigned *s4 = (const unsigned *)(conv_in + (size_t)(KC - 1 + tau) * a.C + ch);
            *(uint4 *)d = make_uint4(s4[0], s4[1], s4[2], s4[3]);
        }
    }
}

/* The head's conv weights into Cw ([NCW][KC]: q, k, v channels at 0, DK, 2 DK; 0 for padding). */
template <int DK, int DV, int KC>
__device__ __forceinline__ void fused_conv_weights(const gdn_fused_args &a, int h, float *Cw, int tid) {
    typedef fused_smem<DK, DV> SM;
    for (int e = tid; e < SM::NCW * KC; e += FUSED_THREADS) {
        const int cc = e / KC, j = e % KC;
        const int seg = cc < DK ? 0 : cc < 2 * DK ? 1 : 2, c = cc - seg * DK;
        Cw[e] = c < (seg == 2 ? a.dv : a.dk) ? a.conv_w[(size_t)fused_channel(a, h, seg, c) * KC + j] : 0.f;
    }
}

/* The conv + SiLU of the block's 64 tokens [t0, t0 + 64) for the head's q, k (L2-normalised, q also
 * / sqrt(dk); bf16 to Qs, Ks) and v (fp32 to Vs): a half-warp a token, a lane 8 channels, so a
 * row's norm is four shuffles. The taps in gdn_conv's order; 0 for tokens past len and padding
 * channels. */
template <int DK, int DV, int KC>
__device__ __forceinline__ void fused_conv(const gdn_fused_args &a, const bf16 *Rs, const float *Cw, int t0, int len,
                                           bf16 *Qs, bf16 *Ks, float *Vs, int tid) {
    typedef fused_smem<DK, DV> SM;
    static_assert(KC == 4 && SM::cw_off % 16 == 0, "a channel's taps are one aligned float4");
    const int w = tid >> 5, lane = tid & 31, o = lane & 15;
#pragma unroll 1
    for (int seg = 0; seg < 3; seg++) {
        const bool isv = seg == 2;
        const int size = isv ? a.dv : a.dk, pad = isv ? DV : DK;
        const bool real = 8 * o < size, mine = 8 * o < pad; /* size and pad are multiples of 8 */
        const int rs0 = seg * DK + 8 * o; /* the lane's first channel in Rs's rows and Cw */
        /* a channel's KC = 4 taps in one 16-byte load: 8 loads a lane, where 32 scalar ones keep the
         * shared-memory queue full (ncu put a third of the kernel's samples in the conv with them) */
        float wt[8][KC];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 w4 = real ? *(const float4 *)(Cw + (rs0 + i) * KC) : make_float4(0.f, 0.f, 0.f, 0.f);
            wt[i][0] = w4.x, wt[i][1] = w4.y, wt[i][2] = w4.z, wt[i][3] = w4.w; /* past the head: none */
        }
        const float qs = seg == 0 ? rsqrtf((float)a.dk) : 1.f;
#pragma unroll 2
        for (int it = 0; it < GDN_C / 16; it++) {
            const int tl = 2 * w + (lane >> 4) + 16 * it, t = t0 + tl;
            uint4 x[KC];
#pragma unroll
            for (int j = 0; j < KC; j++)
                x[j] = real ? *(const uint4 *)(Rs + (tl + j) * SM::LDR + rs0) : make_uint4(0u, 0u, 0u, 0u);
            float y[8];
#pragma unroll
            for (int i = 0; i < 8; i += 2) {
                float a0 = 0.f, a1 = 0.f;
#pragma unroll
                for (int j = 0; j < KC; j++) {
                    const uint32_t pr = (&x[j].x)[i / 2];
                    const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&pr));
                    a0 += wt[i][j] * v.x;
                    a1 += wt[i + 1][j] * v.y;
                }
                const bool live = t < len && real;
                y[i] = live ? cu_silu(a0) : 0.f;
                y[i + 1] = live ? cu_silu(a1) : 0.f;
            }
            if (isv) {
                if (mine) {
                    float4 *dst = (float4 *)(Vs + tl * SM::LDV + 8 * o);
                    dst[0] = make_float4(y[0], y[1], y[2], y[3]);
                    dst[1] = make_float4(y[4], y[5], y[6], y[7]);
                }
                continue;
            }
            float ss = 0.f;
#pragma unroll
            for (int i = 0; i < 8; i++) ss += y[i] * y[i];
#pragma unroll
            for (int m = 1; m < 16; m <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
            const float sc = rsqrtf(ss + GDN_QK_NORM_EPS) * qs;
            if (mine)
                *(uint4 *)((seg == 0 ? Qs : Ks) + tl * SM::LDK + 8 * o) =
                    make_uint4(cu_pack_bf16(y[0] * sc, y[1] * sc), cu_pack_bf16(y[2] * sc, y[3] * sc),
                               cu_pack_bf16(y[4] * sc, y[5] * sc), cu_pack_bf16(y[6] * sc, y[7] * sc));
        }
    }
}

/* Zeros for rows [r0, r1) of the head's dv columns of Y (the row's, rows ldY apart). */
__device__ __forceinline__ void fused_zero_rows(bf16 *Y, int ldY, int dv, int r0, int r1, int tid) {
    const int n8 = dv / 8;
    for (int e = tid; e < (r1 - r0) * n8; e += FUSED_THREADS)
        *(uint4 *)(Y + (size_t)(r0 + e / n8) * ldY + 8 * (e % n8)) = make_uint4(0u, 0u, 0u, 0u);
}

template <int DK, int DV, int KC>
__global__ void __launch_bounds__(FUSED_THREADS, 1) gdn_fused_kernel(gdn_fused_args a) {
    typedef fused_smem<DK, DV> SM;
    constexpr int LDK = SM::LDK, LDT = GDN_LDT, NKS = DK / 16, NJ = DK / 8;
    constexpr int CW = DV / 16; /* the chain's warps: 16 rows of S^T each */
    static_assert(CW <= FUSED_THREADS / 32 && GDN_C == 64, "a chain warp per 16 rows of S^T, 64-token blocks");
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)(smem + SM::q_off), *Ks = (bf16 *)(smem + SM::k_off), *Ws = (bf16 *)(smem + SM::w_off);
    float *Vs = (float *)(smem + SM::v_off), *UT = (float *)(smem + SM::u_off);
    float *Ls = (float *)(smem + SM::l_off), *Ts = (float *)(smem + SM::t_off), *X = (float *)(smem + SM::x_off);
    bf16 *Ps = (bf16 *)(smem + SM::p_off), *Zs = (bf16 *)(smem + SM::z_off), *Yt = (bf16 *)(smem + SM::l_off);
    float *gam = (float *)(smem + SM::vec_off), *Gam = gam + GDN_C, *bet = Gam + GDN_C, *gsc = bet + GDN_C;
    float *rsq = (float *)(smem + SM::rsq_off), *rsv = (float *)(smem + SM::rs_off);
    float *Cw = (float *)(smem + SM::cw_off), *glast = Cw + SM::NCW * KC;
    static_assert(KC == FUSED_K, "the weights' room is FUSED_K taps a channel");

    const int h = blockIdx.x, tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    const int r = lane >> 2, cc = lane & 3;
    const cu_chunk_params *prm = a.prm + blockIdx.y;
    const int len = prm->len, bucket = a.bt.bucket, dv = a.dv;
    const size_t tok0 = (size_t)blockIdx.y * bucket;
    const bf16 *P = a.P + tok0 * a.ldP;
    bf16 *Y = a.Y + tok0 * a.ldY + (size_t)h * dv;
    if (len < 1) { /* a padding row: zeros for out_proj, no state */
        fused_zero_rows(Y, a.ldY, dv, 0, bucket, tid);
        return;
    }
    const unsigned char *gin = cu_gdn_in(prm);
    const bf16 *conv_in = (const bf16 *)(gin + a.bt.conv_off);
    const bool chain = w < CW; /* warp-uniform */
    const int n0 = 16 * w + r; /* a chain warp's S^T rows n0, n0 + 8 */
    float Sacc[NJ][4];
    float nw0 = 0.f, nw1 = 0.f; /* the gated norm's weights of rows n0, n0 + 8 */
    if (chain) {
        gdn_state_load<DK, NJ>(Sacc, (const float *)(gin + a.bt.s_off) + (size_t)h * DV * DK, n0, 0, cc);
        nw0 = n0 < dv ? a.norm_w[n0] : 0.f;
        nw1 = n0 + 8 < dv ? a.norm_w[n0 + 8] : 0.f;
    }
    const float a_log = a.A_log[h], dt_b = a.dt_bias[h];
    fused_conv_weights<DK, DV, KC>(a, h, Cw, tid); /* read after the first block's barriers */

#pragma unroll 1
    for (int c = 0; c < a.bt.ncb; c++) {
        const int t0 = c * GDN_C, tend = min(bucket, t0 + GDN_C) - t0; /* rows of this block in the bucket */
        if (t0 >= len) { /* padding only */
            fused_zero_rows(Y, a.ldY, dv, t0, t0 + tend, tid);
            continue;
        }
        __syncthreads(); /* the previous block's shared memory is read */
        {   /* z rows (the gated norm's), 0 past len */
            const int n8 = dv / 8;
            for (int e = tid; e < GDN_C * n8; e += FUSED_THREADS) {
                const int t = e / n8, s8 = e % n8;
                const bool ok = t0 + t < len;
                cu_cp_async16(Zs + t * SM::LDZ + 8 * s8, P + (size_t)(ok ? t0 + t : 0) * a.ldP + a.C + h * dv + 8 * s8,
                              ok ? 16 : 0);
            }
            cu_cp_async_commit();
        }
        float raw_b = 0.f, raw_a = 0.f;
        if (tid < GDN_C && t0 + tid < len) {
            const bf16 *prow = P + (size_t)(t0 + tid) * a.ldP + a.C + a.nv * dv; /* b, a */
            raw_b = __bfloat162float(prow[h]);
            raw_a = __bfloat162float(prow[a.nv + h]);
        }
        fused_stage<DK, DV, KC>(a, P, conv_in, h, t0, len, (bf16 *)(smem + SM::r_off), tid);
        cu_cp_async_commit();
        cu_cp_async_wait<0>();
        __syncthreads();
        fused_conv<DK, DV, KC>(a, (const bf16 *)(smem + SM::r_off), Cw, t0, len, Qs, Ks, Vs, tid);
        if (tid < GDN_C) /* the gates, as gdn_prep's */
            prep_gate(raw_a, raw_b, a_log, dt_b, t0 + tid < len, gam[tid], bet[tid]);
        __syncthreads();
        if (c == 0) { /* this head's conv inputs are read: its channels of the state move on */
            bf16 *conv_state = (bf16 *)(prm->gdn + a.bt.conv_off);
#pragma unroll
            for (int seg = 0; seg < 3; seg++) {
                const int c0 = fused_channel(a, h, seg, 0);
                cu_conv_state_shift_range(conv_state, conv_in, P, a.ldP, a.C, KC, len, c0 + tid,
                                          c0 + (seg == 2 ? dv : a.dk), FUSED_THREADS);
            }
        }
        if (w == 0) { /* cumulative log-decay, as gdn_prep's */
            const float gl = prep_decay(gam, Gam, gsc, lane);
            if (lane == 31) *glast = __expf(gl);
        }
        __syncthreads();
        prep_lp<DK>(Qs, Ks, Ls, gam, bet, Ps, LDT, 0, GDN_C, tid);
        prep_inverse(Ls, Ts, X, tid);
        prep_wu<DK, DV, 1>(Ts, Ls, bet, Gam, Ks, Vs, Ws, UT, 0, tid);
        __syncthreads();
        {   /* Gamma Q and K' in place, as gdn_prep's step 2 */
            constexpr int SK = DK / 8;
            for (int e = tid; e < GDN_C * SK; e += FUSED_THREADS) {
                const int t = e / SK, s8 = e % SK;
                uint4 *qp = (uint4 *)(Qs + t * LDK + 8 * s8), *kp = (uint4 *)(Ks + t * LDK + 8 * s8);
                *qp = prep_scale8(*qp, Gam[t]);
                *kp = prep_scale8(*kp, gsc[t]);
            }
        }
        cu_cp_async_wait<0>();
        __syncthreads();
        float O[8][4]; /* O^T rows n0, n0 + 8, the block's 64 tokens */
        if (chain) {
            /* S^T as bf16 A fragments (k = dk), as gdn_scan's */
            uint32_t sF[NKS][4];
#pragma unroll
            for (int ks = 0; ks < NKS; ks++) gdn_acc_to_a(Sacc[2 * ks], Sacc[2 * ks + 1], sF[ks]);
            /* O^T = S^T (Gamma Q)^T: B[k = dk][n = token] = Gamma Q[token][dk] */
#pragma unroll
            for (int j = 0; j < 8; j++) O[j][0] = O[j][1] = O[j][2] = O[j][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < NKS; ks++)
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const bf16 *q = Qs + (8 * j + r) * LDK + 16 * ks + 2 * cc;
                    cu_mma16816(O[j], sF[ks], *(const uint32_t *)q, *(const uint32_t *)(q + 8));
                }
            /* delta^T = U^T - S^T W^T (-S^T: the sign bits flipped, exact) */
            float D[8][4];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float2 lo = *(const float2 *)(UT + n0 * CU_GDN_LDU + 8 * j + 2 * cc);
                const float2 hi = *(const float2 *)(UT + (n0 + 8) * CU_GDN_LDU + 8 * j + 2 * cc);
                D[j][0] = lo.x, D[j][1] = lo.y, D[j][2] = hi.x, D[j][3] = hi.y;
            }
#pragma unroll
            for (int ks = 0; ks < NKS; ks++) {
#pragma unroll
                for (int e = 0; e < 4; e++) sF[ks][e] ^= 0x80008000u;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const bf16 *wp = Ws + (8 * j + r) * LDK + 16 * ks + 2 * cc;
                    cu_mma16816(D[j], sF[ks], *(const uint32_t *)wp, *(const uint32_t *)(wp + 8));
                }
            }
            uint32_t dF[4][4]; /* delta^T as bf16 A fragments (k = tokens) */
#pragma unroll
            for (int ks = 0; ks < 4; ks++) gdn_acc_to_a(D[2 * ks], D[2 * ks + 1], dF[ks]);
            /* O^T += delta^T P^T: B[k = token j][n = token i] = P[i][j], 0 for j > i */
#pragma unroll
            for (int ks = 0; ks < 4; ks++)
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (16 * ks > 8 * j + 7) continue;
                    const bf16 *pp = Ps + (8 * j + r) * LDT + 16 * ks + 2 * cc;
                    cu_mma16816(O[j], dF[ks], *(const uint32_t *)pp, *(const uint32_t *)(pp + 8));
                }
            gdn_state_step<NJ>(Sacc, *glast, dF, Ks, LDK, 0, lane); /* every dk column */
            /* the tokens' sums of squares over this warp's 16 rows (tokens 8 j + 2 cc, + 1) */
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float s0 = O[j][0] * O[j][0] + O[j][2] * O[j][2], s1 = O[j][1] * O[j][1] + O[j][3] * O[j][3];
#pragma unroll
                for (int m = 4; m < 32; m <<= 1) {
                    s0 += __shfl_xor_sync(0xffffffffu, s0, m);
                    s1 += __shfl_xor_sync(0xffffffffu, s1, m);
                }
                if (r == 0) {
                    rsq[w * GDN_C + 8 * j + 2 * cc] = s0;
                    rsq[w * GDN_C + 8 * j + 2 * cc + 1] = s1;
                }
            }
        }
        __syncthreads();
        if (tid < GDN_C) { /* each token's norm scale, its warps' sums in warp order */
            float ss = 0.f;
#pragma unroll
            for (int u = 0; u < CW; u++) ss += rsq[u * GDN_C + tid];
            rsv[tid] = rsqrtf(ss / (float)dv + a.eps);
        }
        __syncthreads();
        if (chain) { /* the gated RMSNorm into Y's tile (L and T are dead). Every value is computed
                      * and only the store is conditional: conditions around the arithmetic
                      * (padding rows, tokens past len) make each element a branch of its own and
                      * run the 32 SiLUs one after another (docs/cuda.md, "The fused mixer") */
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int t = 8 * j + 2 * cc + e;
                    const float rs = rsv[t];
                    const bool live = t0 + t < len;
                    const float y0 = O[j][e] * rs * nw0 * cu_silu(__bfloat162float(Zs[t * SM::LDZ + n0]));
                    const float y1 = O[j][2 + e] * rs * nw1 * cu_silu(__bfloat162float(Zs[t * SM::LDZ + n0 + 8]));
                    if (n0 < dv) Yt[t * SM::LDZ + n0] = __float2bfloat16(live ? y0 : 0.f);
                    if (n0 + 8 < dv) Yt[t * SM::LDZ + n0 + 8] = __float2bfloat16(live ? y1 : 0.f);
                }
        }
        __syncthreads();
        {
            const int n8 = dv / 8;
            for (int e = tid; e < tend * n8; e += FUSED_THREADS) {
                const int t = e / n8, s8 = e % n8;
                *(uint4 *)(Y + (size_t)(t0 + t) * a.ldY + 8 * s8) = *(const uint4 *)(Yt + t * SM::LDZ + 8 * s8);
            }
        }
    }
    if (chain) gdn_state_store<DK, NJ>(Sacc, (float *)(prm->gdn + a.bt.s_off) + (size_t)h * DV * DK, n0, 0, cc);
}

/* ---- host side -------------------------------------------------------------------------------- */

/* Padded head dims instantiated: DK, DV in {16, 32, 64, 128}. */
#define GDN_SHAPES(X)                                                                                   \
    X(16, 16) X(16, 32) X(32, 16) X(32, 32) X(32, 64) X(64, 32) X(64, 64) X(64, 128) X(128, 64) X(128, 128)

/* The fused mixer's instances: DK = DV (padded) in {16, 32, 64, 128}, conv width FUSED_K. */
#define GDN_FUSED_SHAPES(X) X(16) X(32) X(64) X(128)

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

/* The scratch layout: lays the arrays out from `base` (an address; 0 to only count) into s and
 * returns the bytes used, so the size and the binding cannot disagree. */
static size_t gdn_scratch_layout(cu_gdn_scratch *s, uintptr_t base, const cu_gdn_dims *d, int rows, int blocks) {
    const size_t nb = (size_t)blocks * d->nv;
    const size_t DK = cu_gdn_pad(d->dk), DV = cu_gdn_pad(d->dv);
    uintptr_t p = base;
    memset(s, 0, sizeof *s);
#define TAKE(field, type, bytes) (s->field = (type *)p, p += align256(bytes))
    if (d->f32) {
        TAKE(q, float, (size_t)rows * d->nk * d->dk * 4);
        TAKE(k, float, (size_t)rows * d->nk * d->dk * 4);
        TAKE(v, float, (size_t)rows * d->nv * d->dv * 4);
        TAKE(o, float, (size_t)rows * d->nv * d->dv * 4);
        TAKE(dec, float, (size_t)rows * d->nv * 4);
        TAKE(beta, float, (size_t)rows * d->nv * 4);
    } else {
        TAKE(Qn, bf16, (size_t)rows * d->nk * DK * 2);
        TAKE(Kn, bf16, (size_t)rows * d->nk * DK * 2);
        TAKE(Vn, float, (size_t)rows * d->nv * DV * 4);
        TAKE(W, bf16, nb * GDN_C * CU_GDN_LDW(DK) * 2);
        TAKE(Qg, bf16, nb * GDN_C * DK * 2);
        TAKE(UT, float, nb * DV * CU_GDN_LDU * 4);
        TAKE(Kp, bf16, nb * GDN_C * CU_GDN_LDW(DK) * 2);
        TAKE(Pm, bf16, nb * GDN_C * GDN_C * 2);
        TAKE(glast, float, nb * 4);
        TAKE(Sc, bf16, nb * DV * DK * 2);
        TAKE(dT, bf16, nb * DV * GDN_C * 2);
    }
#undef TAKE
    return (size_t)(p - base);
}

size_t cu_gdn_scratch_bytes(const cu_gdn_dims *d, int tokens, int blocks) {
    cu_gdn_scratch s;
    return gdn_scratch_layout(&s, 0, d, tokens, blocks);
}

void cu_gdn_scratch_bind(cu_gdn_scratch *s, void *base, const cu_gdn_dims *d, int tokens, int blocks) {
    (void)gdn_scratch_layout(s, (uintptr_t)base, d, tokens, blocks);
}

/* The scan with RG_ row groups a block: value heads x (DV / 16 RG) slices x rows; one stage when
 * the rows are one block of 64 tokens (nc == 1: nothing to prefetch, scan_smem). */
template <int DK, int DV, int RG_>
static void launch_gdn_scan(const gdn_scan_args &sa, int nv, unsigned nr, int nc, cudaStream_t st) {
    typedef scan_smem<DK, DV, RG_, 2> SM;
    typedef scan_smem<DK, DV, RG_, 1> SM1;
    if (nc == 1)
        gdn_scan_kernel<DK, DV, RG_, 1><<<dim3(nv, DV / SM1::BV, nr), SM1::NWARP * 32, SM1::bytes, st>>>(sa);
    else
        gdn_scan_kernel<DK, DV, RG_, 2><<<dim3(nv, DV / SM::BV, nr), SM::NWARP * 32, SM::bytes, st>>>(sa);
}

/* The prep with `split` blocks a (block, head) (1, 2 or 4, bounded by the head dims: prep_split). */
template <int DK, int DV>
static void launch_gdn_prep(const gdn_prep_args &pa, int nc, int nv, unsigned nr, int split, cudaStream_t st) {
    constexpr size_t sm = prep_smem<DK, DV>::bytes;
    if (split >= 4)
        gdn_prep_kernel<DK, DV, 4><<<dim3(nc, nv * prep_split<DK, DV, 4>::S, nr), PREP_THREADS, sm, st>>>(pa);
    else if (split == 2)
        gdn_prep_kernel<DK, DV, 2><<<dim3(nc, nv * prep_split<DK, DV, 2>::S, nr), PREP_THREADS, sm, st>>>(pa);
    else
        gdn_prep_kernel<DK, DV, 1><<<dim3(nc, nv, nr), PREP_THREADS, sm, st>>>(pa);
}
template <int DK, int DV>
static int prep_init(squad_err *err) {
    constexpr int sm = (int)prep_smem<DK, DV>::bytes;
    CU_TRY(cudaFuncSetAttribute(gdn_prep_kernel<DK, DV, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
    CU_TRY(cudaFuncSetAttribute(gdn_prep_kernel<DK, DV, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
    CU_TRY(cudaFuncSetAttribute(gdn_prep_kernel<DK, DV, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
    return 0;
}

/* The shared memory every scan instantiation of (DK, DV) may take. */
template <int DK, int DV, int RG_>
static cudaError_t scan_attr() {
    cudaError_t e = cudaFuncSetAttribute(gdn_scan_kernel<DK, DV, RG_, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)scan_smem<DK, DV, RG_, 1>::bytes);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gdn_scan_kernel<DK, DV, RG_, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)scan_smem<DK, DV, RG_, 2>::bytes);
    return e;
}
template <int DK, int DV>
static int scan_init(squad_err *err) {
    cudaError_t e = scan_attr<DK, DV, 1>();
    if (e == cudaSuccess) e = scan_attr<DK, DV, 2>();
    if (e == cudaSuccess) e = scan_attr<DK, DV, 4>();
    CU_TRY(e);
    return 0;
}

/* The fused mixer's shared memory for padded head dims D (0: no instance). */
static size_t fused_bytes(int D) {
#define FUSED_BYTES(D_) if (D == D_) return fused_smem<D_, D_>::bytes;
    GDN_FUSED_SHAPES(FUSED_BYTES)
#undef FUSED_BYTES
    return 0;
}

/* The shared memory a block may opt into on the current GPU (0 when it cannot be read). */
static int smem_optin(void) {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return v;
}

int cu_gdn_fused_ok(const cu_gdn_dims *d) {
    if (!d->fused_fits || d->f32 || d->nk != d->nv || d->K != FUSED_K || d->dk % 8 || d->dv % 8 || d->ldP % 8)
        return 0;
    const int ldY = d->ldY > 0 ? d->ldY : d->nv * d->dv;
    return cu_gdn_pad(d->dk) == cu_gdn_pad(d->dv) && ldY % 8 == 0 && (2 * d->nk * d->dk + d->nv * d->dv) % 8 == 0;
}

/* Whether the fused mixer has an instance for these head dims whose shared memory this GPU gives a
 * block (d->fused_fits, asked once, here), and its kernel attribute where it does. */
static int fused_init(cu_gdn_dims *d, squad_err *err) {
    const size_t need = fused_bytes(cu_gdn_pad(d->dk));
    d->fused_fits = need > 0 && need <= (size_t)smem_optin();
    if (!cu_gdn_fused_ok(d)) return 0;
    const int D = cu_gdn_pad(d->dk);
#define FUSED_INIT(D_)                                                                                             \
    if (D == D_)                                                                                                   \
        CU_TRY(cudaFuncSetAttribute(gdn_fused_kernel<D_, D_, FUSED_K>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                    (int)fused_smem<D_, D_>::bytes));
    GDN_FUSED_SHAPES(FUSED_INIT)
#undef FUSED_INIT
    return 0;
}

/* Whether a launch of nr rows of `rows` tokens takes the fused mixer. Where the GPU's SMs are known
 * (the backend), only launches of a block an SM or more, of rows longer than one block of 64 tokens:
 * its blocks are long chains (a (row, head) each), so a launch of fewer loses to the four kernels'
 * hundreds of blocks (a hit: 2.48 against 1.60 ms at 4096+128), and on rows of one block its conv
 * and prep cost more than the four kernels' (16 x 32: 2.92-3.00 against 2.75-2.83 ms), while 16
 * rows of 128 gain (docs/cuda.md, "The fused mixer"). The tests (no
 * SM count) take it for any rows within fused_rows. */
int cu_gdn_fused_here(const cu_gdn_dims *d, int rows, unsigned nr) {
    if (d->fused_rows <= 0 || rows > d->fused_rows || !cu_gdn_fused_ok(d)) return 0;
    return d->n_sm == 0 || ((long)d->nv * nr >= d->n_sm && rows > GDN_C);
}

/* The fused mixer over the launch's rows: a block a (value head, row). */
static int launch_gdn_fused(const cu_gdn_dims *d, const gdn_fused_args &fa, unsigned nr, cudaStream_t st,
                            squad_err *err) {
    const int D = cu_gdn_pad(d->dk);
#define FUSED_RUN(D_)                                                                                              \
    if (D == D_) {                                                                                                 \
        gdn_fused_kernel<D_, D_, FUSED_K><<<dim3(d->nv, nr), FUSED_THREADS, fused_smem<D_, D_>::bytes, st>>>(fa);  \
        CU_LAUNCH_CHECK("gdn_fused_kernel");                                                                       \
        return 0;                                                                                                  \
    }
    GDN_FUSED_SHAPES(FUSED_RUN)
#undef FUSED_RUN
    return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA: no fused GDN mixer for head dims %d", D);
}

int cu_gdn_init(cu_gdn_dims *d, squad_err *err) {
    if (d->f32) return 0;
    const int DKP = cu_gdn_pad(d->dk), DVP = cu_gdn_pad(d->dv);
#define GDN_INIT(DK_, DV_)                                                                                          \
    if (DKP == DK_ && DVP == DV_) {                                                                                 \
        if (int rc_ = prep_init<DK_, DV_>(err)) return rc_;                                                      \
        if (int rc_ = scan_init<DK_, DV_>(err)) return rc_;                                                      \
        CU_TRY(cudaFuncSetAttribute(gdn_out_kernel<DK_, DV_, OUT_RT_LONG>,                                            \
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,                                    \
                                    (int)out_smem<DK_, DV_, OUT_RT_LONG>::bytes));                                  \
        CU_TRY(cudaFuncSetAttribute(gdn_out_kernel<DK_, DV_, OUT_RT_SHORT>,                                           \
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,                                    \
                                    (int)out_smem<DK_, DV_, OUT_RT_SHORT>::bytes));                                 \
        return fused_init(d, err);                                                                                  \
    }
    GDN_SHAPES(GDN_INIT)
#undef GDN_INIT
    return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA: linear attention head dims dk %d, dv %d not supported", d->dk,
                      d->dv);
}

/* The scan's row groups a block: as fixed, else two when that still gives every SM a block. Two
 * scan blocks fit an SM whatever the count (shared memory), so one row group leaves a batch of
 * many rows with 2-warp blocks in many waves, each block copying its head's W and K' for 16 S^T
 * rows. Measured on 16 rows of 32 / 128 tokens (0.8B, H200), the scan's share: 1 row group
 * 0.52 / 0.74 ms, 2 0.47 / 0.66-0.70, 4 0.50 / 0.75; a single row keeps one (its 128 blocks are
 * one wave already; 2 took 0.104 ms against 0.089). */
/* The prep's split (prep_split): as fixed, else on short launches (short_rows: a hit's question,
 * a few of them) the largest that keeps the blocks within what the GPU holds at once (two an SM), so
 * their one wave gets more, shorter blocks; longer launches keep one a (block, head) (not measured
 * split: left as they were). */
static int gdn_prep_split(const cu_gdn_dims *d, long blocks, bool short_rows) {
    if (d->prep_split == 1 || d->prep_split == 2 || d->prep_split == 4) return d->prep_split;
    if (!short_rows) return 1;
    for (int s = PREP_SPLIT_MAX; s > 1; s /= 2)
        if (d->n_sm > 0 && blocks * s <= 2L * d->n_sm) return s;
    return 1;
}

#define GDN_SCAN_RG_MAX 2
static int gdn_scan_rg(const cu_gdn_dims *d, unsigned nrows, int DVP) {
    if (d->scan_rg == 1 || d->scan_rg == 2 || d->scan_rg == 4) return d->scan_rg;
    const long blocks1 = (long)d->nv * (DVP / 16) * nrows; /* with one row group */
    for (int rg = GDN_SCAN_RG_MAX; rg > 1; rg /= 2)
        if (d->n_sm > 0 && 16 * rg <= DVP && blocks1 / rg >= d->n_sm) return rg;
    return 1;
}


/* The output kernel over every block of 64 tokens: one row tile a block on short
 * launches, four on long ones. */
template <int DK, int DV>
static void launch_gdn_out(const gdn_out_args &oa, bool short_rows, int nv, unsigned nr, cudaStream_t st) {
    const int nb = oa.bt.ncb;
    if (short_rows)
        gdn_out_kernel<DK, DV, OUT_RT_SHORT><<<dim3(nb * (OUT_TILES / OUT_RT_SHORT), nv, nr), OUT_THREADS,
                                               out_smem<DK, DV, OUT_RT_SHORT>::bytes, st>>>(oa);
    else
        gdn_out_kernel<DK, DV, OUT_RT_LONG><<<dim3(nb * (OUT_TILES / OUT_RT_LONG), nv, nr), OUT_THREADS,
                                              out_smem<DK, DV, OUT_RT_LONG>::bytes, st>>>(oa);
}

/* The scan over every block of 64 tokens with rg row groups a block. */
template <int DK, int DV>
static void launch_gdn_scan_rg(const gdn_scan_args &sa, int rg, int nv, unsigned nr, cudaStream_t st) {
    const int nb = sa.bt.ncb;
    if (rg == 4)
        launch_gdn_scan<DK, DV, 4>(sa, nv, nr, nb, st);
    else if (rg == 2)
        launch_gdn_scan<DK, DV, 2>(sa, nv, nr, nb, st);
    else
        launch_gdn_scan<DK, DV, 1>(sa, nv, nr, nb, st);
}

/* One layer's mixer after the conv, in one stream: prep, scan, out over every block. */
template <int DK, int DV>
static int gdn_run(const cu_gdn_dims *d, const gdn_prep_args &pa, const gdn_scan_args &sa, const gdn_out_args &oa, int nc, unsigned nr,
                   unsigned run, int prep_split, int scan_rg, bool short_rows, cudaStream_t st, squad_err *err) {
    if (run & CU_GDN_PREP) {
        launch_gdn_prep<DK, DV>(pa, nc, d->nv, nr, prep_split, st);
        CU_LAUNCH_CHECK("gdn_prep_kernel");
    }
    if (run & CU_GDN_SCAN) {
        launch_gdn_scan_rg<DK, DV>(sa, scan_rg, d->nv, nr, st);
        CU_LAUNCH_CHECK("gdn_scan_kernel");
    }
    if (run & CU_GDN_OUT) {
        launch_gdn_out<DK, DV>(oa, short_rows, d->nv, nr, st);
        CU_LAUNCH_CHECK("gdn_out_kernel");
    }
    return 0;
}

int cu_gdn_forward(const cu_gdn_dims *d, const void *Pv, size_t conv_off, const float *conv_w, const float *A_log,
                   const float *dt_bias, const float *norm_w, size_t s_off, void *Yv, const cu_gdn_scratch *scr,
                   const cu_batch *b, cudaStream_t st, squad_err *err) {
    if (d->f32)
        return cu_gdn_forward_exact(d, (const float *)Pv, conv_off, conv_w, A_log, dt_bias, norm_w, s_off, (float *)Yv,
                                    scr, b, st, err);
    const bf16 *P = (const bf16 *)Pv;
    bf16 *Y = (bf16 *)Yv;
    const int rows = b->bucket; /* each row's kernels see one chunk of the bucket */
    const int C = 2 * d->nk * d->dk + d->nv * d->dv;
    const int nc = (rows + GDN_C - 1) / GDN_C;
    const unsigned nr = (unsigned)b->nrows;
    const int DKP = cu_gdn_pad(d->dk), DVP = cu_gdn_pad(d->dv);
    const gdn_batch_args bt = {s_off, conv_off, b->bucket, nc};
    gdn_conv_args ca = {P, d->ldP, conv_w, b->prm, bt, d->nk, d->nv, d->K, C, d->dk, d->dv, DKP, DVP, *scr};
    gdn_prep_args pa = {P, d->ldP, A_log, dt_bias, b->prm, bt, d->nk, d->nv, C, d->dk, d->dv, *scr};
    gdn_scan_args sa = {NULL, b->prm, bt, d->nk, d->nv, rows, *scr};
    gdn_out_args oa = {P,     d->ldP, NULL, norm_w, Y,      b->prm, bt,   d->nk, d->nv, d->dv, d->K, C,
                       rows,  d->eps, *scr, d->ldY > 0 ? d->ldY : d->nv * d->dv};
    const unsigned run = d->stages ? d->stages : CU_GDN_CONV | CU_GDN_PREP | CU_GDN_SCAN | CU_GDN_OUT;
    /* short rows: the whole mixer in one kernel (kernel D), where it applies; in the ablation's
     * stages it is the conv's group (the others leave nothing out) */
    if (cu_gdn_fused_here(d, rows, nr) && ((uintptr_t)P & 15) == 0 && ((uintptr_t)Y & 15) == 0) {
        const gdn_fused_args fa = {P,   d->ldP, conv_w, A_log, dt_bias, norm_w, Y,    oa.ldY,
                                   b->prm, bt,  d->nk, d->nv, d->dk,  d->dv,  C,    d->eps};
        return (run & CU_GDN_CONV) ? launch_gdn_fused(d, fa, nr, st, err) : 0;
    }
    const bool short_rows = rows * b->nrows <= d->short_rows; /* few blocks in all: spread them */
    /* the conv's chain is a row's: short rows take 4 tokens a block however many rows ride along
     * (16 rows of 128 tokens: 0.60-0.70 ms of conv against 0.86 with 16 tokens a block; the out
     * kernel's one-tile blocks are slower there, 0.70-0.79 against 0.51, so it keeps the total) */
    const bool short_conv = short_rows || rows <= d->short_rows;
    const int scan_rg = gdn_scan_rg(d, nr, DVP);
    const int prep_split = gdn_prep_split(d, (long)nc * d->nv * nr, short_rows);
#define GDN_RUN(DK_, DV_)                                                                                          \
    if (DKP == DK_ && DVP == DV_) {                                                                                \
        if (run & CU_GDN_CONV)                                                                                     \
            if (int rc_ = launch_gdn_conv(ca, rows, short_conv, 2 * d->nk + d->nv, nr, d->n_sm, d->conv_groups, st, \
                                          err))                                                                    \
                return rc_;                                                                                        \
        return gdn_run<DK_, DV_>(d, pa, sa, oa, nc, nr, run, prep_split, scan_rg, short_rows, st, err);            \
    }
    GDN_SHAPES(GDN_RUN)
#undef GDN_RUN
    return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA: linear attention head dims dk %d, dv %d not supported", d->dk,
                      d->dv);
}
