/*
 * k_attn.cu — gated full attention between q/k/v_proj and o_proj, as three kernels.
 *
 * 1. attn_prep (one block per token): q / k RMSNorm per head (zero-centred weight, fp32), partial
 *    RoPE on the first rd dims (rotate-half within rd, angle = fp32(position * inv_freq) as
 *    transformers computes it, cos / sin in double so long positions keep their accuracy),
 *    positions offset by the chunk start. q goes to a scratch [rows][nh][hd]; k and v of the real
 *    tokens go straight into the K / V cache at [start, start + len).
 * 2. attn_fwd (FlashAttention-2 style, mma.sync bf16 / fp32 accumulate, never materialises the
 *    score matrix): a block of 8 warps takes 128 query rows and one split of the key range
 *    [0, start + len) of the cache. GQA packing: the rows are the tokens of up to 8 query heads
 *    that share one kv head (0.8B: 32 tokens x 4 heads; a warp = 16 tokens of one head), so each
 *    K / V tile in shared memory feeds every head of the group. Keys go 64 at a time through two
 *    shared-memory stages (cp.async: the next tile's K and V load while this one is computed, one
 *    barrier per tile); online softmax in the exp2 domain. Query row t sees keys j <= start + t
 *    (and j < start + len, so padding rows stay finite); a warp skips a tile wholly past its rows.
 *    Keys below the chunk parameters' kv_split come from a cache blob read in place (a hit's restored
 *    prefix, never copied into the working buffer), the rest from the working buffer. Both are
 *    found through the parameters (kv_src, kv_work) at run time, never baked into a graph: the
 *    working buffer grows, and moves, as rows get longer.
 *    Query tiles launch longest key range first (causal balance). The key range of a split is
 *    computed at run time from the chunk's start, so one captured graph balances every chunk of
 *    its bucket. Partial (unnormalised) O, running max and sum go to scratch.
 * 3. attn_combine (one warp per token and head, only when the keys were split): merges the splits and
 *    multiplies by sigmoid(gate), bf16 out for o_proj. With one split (long chunks: enough
 *    blocks already) attn_fwd normalises, gates and writes the output itself.
 * The exact path (precision EXACT) runs attn_prep on fp32 activations and attn_exact (one warp per
 * query row and head, fp32 online softmax over all keys, gate fused) instead of 2 and 3.
 * A batch: every kernel takes all its rows in one launch (prep, exact: blockIdx.y / .z is the row;
 * attn_fwd: the rows folded into blockIdx.y beside the query tiles; combine: one warp per token of
 * any row) and reads the row's start, len, K / V buffers and split from its parameters. A row's
 * own K / V (prm.kv_work) holds its positions from kv_split on: position p at index p - kv_split.
 * A padding row (len 0) writes zeros and touches no K / V.
 * The host reference the tests compare with, cu_ref_attn, is in cuda_test_ref.cu (tests only).
 */
#include "cuda_internal.cuh"

#include <math.h>
#include <stdlib.h>

#define ATT_WARPS 8 /* attn_fwd: each warp takes 16 query rows (tokens of one head) */
#define ATT_THREADS (32 * ATT_WARPS)
#define ATT_ROWS (16 * ATT_WARPS) /* query rows (token, head) per attn_fwd block */
#define ATT_STAGES 2              /* K / V tiles in shared memory: the next loads while this one runs */
#define ATT_BLOCKS_PER_SM 1       /* resident attn_fwd blocks per SM at hd 256 (registers, shared memory) */
#define ATT_SPLIT_MIN_KEYS 256
#define ATT_SPLIT_MAX 64
#define ATT_SPLIT_ROWS_MAX 8192 /* splits x rows of partial results held */
#define ATT_UNIFORM_SPAN_X 4    /* a chunk whose span is this many times its rows: key ranges ~equal per tile */

/* ---- 1. q / k norm + RoPE + cache write -------------------------------------------------------- */

template <typename A>
struct attn_prep_args {
    const A *QKV;
    int ld;
    const float *q_norm, *k_norm, *inv_freq;
    ptrdiff_t wko, wvo; /* this layer's K and V in the working buffer prm->kv_work */
    size_t kv_stride;
    A *Qb;
    const cu_chunk_params *prm; /* the batch's rows */
    int nh, nkv, hd, rd;
    int bucket; /* tokens per row */
    float eps;
};

template <typename A>
__global__ void attn_prep_kernel(attn_prep_args<A> a) {
    extern __shared__ float sm[];
    const int nwarp = a.nh + a.nkv;
    float *buf = sm;                          /* [nwarp][hd] */
    float *cs = sm + (size_t)nwarp * a.hd;    /* cos [rd/2] */
    float *sn = cs + a.rd / 2;                /* sin [rd/2] */
    const int t = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const cu_chunk_params *prm = a.prm + blockIdx.y;
    const int start = prm->start, len = prm->len;
    if (len < 1) return; /* a padding row: attn_fwd / attn_exact write its zeros without q */
    a.QKV += (size_t)blockIdx.y * a.bucket * a.ld;
    a.Qb += (size_t)blockIdx.y * a.bucket * a.nh * a.hd;
    const int pos = start + t;
    /* the row's own K / V: position p at index p - kv_split (the chunk never starts below it) */
    A *const Kc = (A *)prm->kv_work + a.wko, *const Vc = (A *)prm->kv_work + a.wvo;
    const size_t own = (size_t)(pos - prm->kv_split);
    const int half = a.rd / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float ang = __fmul_rn((float)pos, a.inv_freq[i]);
        double s, c;
        sincos((double)ang, &s, &c);
        cs[i] = (float)c;
        sn[i] = (float)s;
    }
    __syncthreads();
    const A *row = a.QKV + (size_t)t * a.ld;
    const bool is_q = w < a.nh;
    const int hh = is_q ? w : w - a.nh;
    const A *src = is_q ? row + (size_t)hh * 2 * a.hd : row + (size_t)a.nh * 2 * a.hd + (size_t)hh * a.hd;
    const float *nw = is_q ? a.q_norm : a.k_norm;
    float *b = buf + (size_t)w * a.hd;
    float ss = 0.f;
    for (int d = lane; d < a.hd; d += 32) {
        const float x = cu_ld(src + d);
        b[d] = x;
        ss += x * x;
    }
    ss = cu_warp_sum(ss);
    const float r = rsqrtf(ss / (float)a.hd + a.eps);
    for (int d = lane; d < a.hd; d += 32) b[d] = b[d] * r * (1.f + nw[d]);
    __syncwarp();
    A *dst;
    if (is_q)
        dst = a.Qb + ((size_t)t * a.nh + hh) * a.hd;
    else
        dst = t < len ? Kc + own * a.kv_stride + (size_t)hh * a.hd : nullptr;
    for (int d = lane; d < a.hd; d += 32) {
        float o = b[d];
        if (d < half)
            o = b[d] * cs[d] - b[d + half] * sn[d];
        else if (d < a.rd)
            o = b[d] * cs[d - half] + b[d - half] * sn[d - half];
        if (dst) cu_st(dst + d, o);
    }
    if (!is_q && t < len) { /* v passes unchanged */
        const A *vs = row + (size_t)a.nh * 2 * a.hd + (size_t)a.nkv * a.hd + (size_t)hh * a.hd;
        A *vd = Vc + own * a.kv_stride + (size_t)hh * a.hd;
        for (int d = lane; d < a.hd; d += 32) vd[d] = vs[d];
    }
}

/* ---- 2. flash attention over [cache | chunk], one split of the keys ------------------------------ */

struct attn_fwd_args {
    const bf16 *Qb;
    ptrdiff_t wko, wvo; /* this layer's K and V in the working buffer prm->kv_work */
    ptrdiff_t bko, bvo; /* this layer's K and V in the blob prm->kv_src (keys below prm->kv_split) */
    size_t kv_stride;
    const cu_chunk_params *prm; /* the batch's rows */
    int rows, nh, nkv, splits;  /* rows: tokens per row (the bucket) */
    int nrows, tiles;           /* rows of the batch; query tiles per row */
    size_t total;               /* tokens of the batch: the partials' stride between splits */
    int hpb;          /* query heads per block (they share one kv head); ATT_WARPS / hpb warps of 16 tokens each */
    float scale_log2; /* hd^-1/2 * log2(e) */
    float *Op;        /* [splits][rows][nh][hd] */
    float *Mp, *Lp;   /* [splits][rows][nh] */
    /* splits == 1: the block writes out = O / l * sigmoid(gate) itself (no partials, no combine) */
    const bf16 *QKV;
    int ld;
    bf16 *out; /* [rows][nh hd] */
};

/* Shared memory: Q [ATT_ROWS][LD], then ATT_STAGES x (K [BN][LD], V [BN][LD]); LD pads a row by 16
 * bytes so the 8 rows of an ldmatrix land in distinct banks. hd 256: 66 KB + 2 x 66 KB = 198 KB. */
template <int HD>
struct att_smem {
    static constexpr int LD = HD + 8;
    static constexpr size_t q_tile = (size_t)ATT_ROWS * LD * 2;
    static constexpr size_t kv_tile = (size_t)CU_ATT_BN * LD * 2;
    static constexpr size_t bytes = q_tile + (size_t)ATT_STAGES * 2 * kv_tile;
};

/* Where a K / V tile comes from: the row's own K / V (key j at index j - split) and, for keys below
 * split, the cache blob read in place (key j at index j; the own buffer again when split is 0). */
struct att_kv_src {
    const bf16 *Kc, *Vc; /* own */
    const bf16 *Kb, *Vb; /* blob */
    size_t stride;       /* elements between positions */
    int split;
};

/* Which 16-byte pieces of a K / V tile a thread copies: piece tid % SEG of the key rows
 * tid / SEG + p RP, p < PASSES (a fixed column and a fixed stride, so a tile costs one address
 * computation and PASSES adds; with HD 16 a pass covers more rows than a tile has and the threads
 * past the tile's last row copy nothing). The Q tile is copied the same way (its rows: Q_PASSES). */
template <int HD>
struct att_lanes {
    static constexpr int LD = HD + 8;
    static constexpr int SEG = HD / 8;
    static constexpr int RP = ATT_THREADS / SEG;
    static constexpr int PASSES = (CU_ATT_BN + RP - 1) / RP;
    static constexpr int Q_PASSES = (ATT_ROWS + RP - 1) / RP;
    static_assert(ATT_THREADS % SEG == 0, "a thread's piece is the same in every row");
};

/* The K and V tile of keys [kb, kb + BN) into Ks / Vs (rows at or past k_hi zero-filled). A tile
 * wholly inside the key range and on one side of split (all but a block's last tile and the one
 * that crosses a hit's split) takes the plain path: no per-key choice. dst: the thread's first
 * piece in the tile (i0 LD + 8 piece); col: its first element in a key row (kvh HD + 8 piece). */
template <int HD>
__device__ __forceinline__ void att_load_kv(bf16 *Ks, bf16 *Vs, const att_kv_src &src, int kb, int k_hi, int i0,
                                            int dst, int col) {
    typedef att_lanes<HD> L;
    if (L::RP > CU_ATT_BN && i0 >= CU_ATT_BN) return;
    const int split = src.split;
    if (kb + CU_ATT_BN <= k_hi && (kb >= split || kb + CU_ATT_BN <= split)) {
        const bool own = kb >= split;
        const size_t r0 = (size_t)((own ? kb - split : kb) + i0) * src.stride + col;
        const bf16 *k = (own ? src.Kc : src.Kb) + r0, *v = (own ? src.Vc : src.Vb) + r0;
        const size_t step = (size_t)L::RP * src.stride;
#pragma unroll
        for (int p = 0; p < L::PASSES; p++) {
            cu_cp_async16(Ks + dst + p * L::RP * L::LD, k + p * step, 16);
            cu_cp_async16(Vs + dst + p * L::RP * L::LD, v + p * step, 16);
        }
        return;
    }
#pragma unroll
    for (int p = 0; p < L::PASSES; p++) {
        const int j = kb + i0 + p * L::RP;
        const bool ok = j < k_hi, blob = j < split;
        /* a key past k_hi is not read (zero fill): any valid address */
        const size_t r = (size_t)(!ok ? 0 : blob ? j : j - split) * src.stride + col;
        const bf16 *k = (ok && blob ? src.Kb : src.Kc) + r, *v = (ok && blob ? src.Vb : src.Vc) + r;
        cu_cp_async16(Ks + dst + p * L::RP * L::LD, k, ok ? 16 : 0);
        cu_cp_async16(Vs + dst + p * L::RP * L::LD, v, ok ? 16 : 0);
    }
}

/* Row i of a block's Q tile (warp i / 16, its row i % 16) is token t0 + 16 (warp % tpw) + i % 16 of
 * head h0 + warp / tpw, tpw = ATT_WARPS / hpb = 2^tpw_sh warps per head. */
__device__ __forceinline__ void att_row(int i, int t0, int h0, int tpw, int tpw_sh, int *t, int *h) {
    const int wi = i >> 4;
    *t = t0 + 16 * (wi & (tpw - 1)) + (i & 15);
    *h = h0 + (wi >> tpw_sh);
}

template <int HD>
__global__ void __launch_bounds__(ATT_THREADS, 1) attn_fwd_kernel(attn_fwd_args a) {
    typedef att_smem<HD> SM;
    static_assert(ATT_STAGES == 2, "the tile loop toggles between two K / V stages");
    constexpr int LD = SM::LD;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem;
    /* blockIdx.x: the head group (fastest, so a kv head's groups run side by side); blockIdx.y
     * counts query tiles from the last: the longest key ranges start first (causal balance). */
    /* blockIdx.y = (tiles from the last) x nrows + row: every row's last tile first */
    const int hg = blockIdx.x, row = blockIdx.y % a.nrows, qt = a.tiles - 1 - blockIdx.y / a.nrows, sp = blockIdx.z;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    a.prm += row;
    {
        const size_t tok0 = (size_t)row * a.rows;
        a.Qb += tok0 * a.nh * HD;
        a.QKV += tok0 * a.ld;
        a.out += tok0 * a.nh * HD;
        a.Op += tok0 * a.nh * HD;
        a.Mp += tok0 * a.nh;
        a.Lp += tok0 * a.nh;
    }
    const int start = a.prm->start, len = a.prm->len;
    const int tpw = ATT_WARPS / a.hpb; /* warps (of 16 tokens) per head: a power of two */
    const int tpw_sh = __ffs(tpw) - 1;
    const int bt = 16 * tpw; /* tokens per block */
    const int t0 = qt * bt, h0 = hg * a.hpb;
    int k_lo = 0, k_hi = 0;
    if (t0 < len) {
        const int kend = start + min(t0 + bt, len);
        const int per = ((kend + a.splits - 1) / a.splits + CU_ATT_BN - 1) / CU_ATT_BN * CU_ATT_BN;
        k_lo = sp * per;
        k_hi = min(kend, k_lo + per);
    }
    if (k_lo >= k_hi) { /* nothing for this split: an empty partial (or zeros, written directly) */
        if (a.splits == 1) {
            for (int e = tid; e < ATT_ROWS * HD; e += ATT_THREADS) {
                int t, h;
                att_row(e / HD, t0, h0, tpw, tpw_sh, &t, &h);
                if (t < a.rows) a.out[((size_t)t * a.nh + h) * HD + e % HD] = __float2bfloat16(0.f);
            }
            return;
        }
        if (tid < ATT_ROWS) {
            int t, h;
            att_row(tid, t0, h0, tpw, tpw_sh, &t, &h);
            if (t < a.rows) {
                const size_t i = ((size_t)sp * a.total + t) * a.nh + h;
                a.Mp[i] = -INFINITY;
                a.Lp[i] = 0.f;
            }
        }
        return;
    }
    const int kvh = h0 / (a.nh / a.nkv);
    /* keys below split: the cache blob read in place (never dereferenced when split is 0) */
    att_kv_src kv;
    kv.split = a.prm->kv_split;
    kv.stride = a.kv_stride;
    kv.Kc = (const bf16 *)a.prm->kv_work + a.wko;
    kv.Vc = (const bf16 *)a.prm->kv_work + a.wvo;
    kv.Kb = kv.split > 0 ? (const bf16 *)a.prm->kv_src + a.bko : kv.Kc;
    kv.Vb = kv.split > 0 ? (const bf16 *)a.prm->kv_src + a.bvo : kv.Vc;

    /* this thread's piece of every tile (att_lanes) */
    typedef att_lanes<HD> LN;
    const int i0 = tid / LN::SEG, piece = tid % LN::SEG;
    const int kv_dst = i0 * LD + 8 * piece, kv_col = kvh * HD + 8 * piece;

    /* Q tile (rows past the bucket are zero) and the first K / V tiles: one cp.async group */
#pragma unroll
    for (int p = 0; p < LN::Q_PASSES; p++) {
        const int i = i0 + p * LN::RP;
        if (LN::RP * LN::Q_PASSES > ATT_ROWS && i >= ATT_ROWS) break;
        int t, h;
        att_row(i, t0, h0, tpw, tpw_sh, &t, &h);
        const bool ok = t < a.rows;
        const bf16 *src = a.Qb + ((size_t)(ok ? t : 0) * a.nh + h) * HD + 8 * piece;
        cu_cp_async16(Qs + i * LD + 8 * piece, src, ok ? 16 : 0);
    }
    {
        bf16 *K0 = (bf16 *)(smem + SM::q_tile);
        att_load_kv<HD>(K0, K0 + CU_ATT_BN * LD, kv, k_lo, k_hi, i0, kv_dst, kv_col);
    }
    cu_cp_async_commit();

    const int r = lane >> 2, c = lane & 3;
    const int h = h0 + (w >> tpw_sh);
    const int row0 = t0 + 16 * (w & (tpw - 1)) + r, row1 = row0 + 8;
    /* exclusive key limits of the two rows this lane holds, and of the warp's last row */
    const int lim0 = min(k_hi, start + min(row0, len - 1) + 1);
    const int lim1 = min(k_hi, start + min(row1, len - 1) + 1);
    const int wt0 = t0 + 16 * (w & (tpw - 1)); /* the warp's first token; all past the bucket: no work */
    const int limw = wt0 >= a.rows ? k_lo : min(k_hi, start + min(wt0 + 15, len - 1) + 1);
    const int limf = min(k_hi, start + min(wt0, len - 1) + 1); /* keys below it: unmasked for every row */
    float O[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++) O[j][0] = O[j][1] = O[j][2] = O[j][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    int stage = 0;
    for (int kb = k_lo; kb < k_hi; kb += CU_ATT_BN, stage ^= 1) {
        /* this tile has landed (the only group in flight), and every warp is done with the previous
         * one, whose stage the next tile's loads overwrite while this one is computed */
        cu_cp_async_wait<0>();
        __syncthreads();
        if (kb + CU_ATT_BN < k_hi) {
            bf16 *Kn = (bf16 *)(smem + SM::q_tile + (size_t)(stage ^ 1) * 2 * SM::kv_tile);
            att_load_kv<HD>(Kn, Kn + CU_ATT_BN * LD, kv, kb + CU_ATT_BN, k_hi, i0, kv_dst, kv_col);
            cu_cp_async_commit();
        }
        /* every key of this tile is past the warp's rows (causal): it would change nothing; the
         * warp still takes part in the loads and barriers */
        if (kb >= limw) continue;
        const bf16 *Ks = (const bf16 *)(smem + SM::q_tile + (size_t)stage * 2 * SM::kv_tile);
        const bf16 *Vs = Ks + CU_ATT_BN * LD;
        float S[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) S[j][0] = S[j][1] = S[j][2] = S[j][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
            uint32_t qa[4];
            cu_ldmatrix_x4(qa, Qs + (16 * w + (lane & 15)) * LD + 16 * ks + (lane >> 4) * 8);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t kb4[4];
                cu_ldmatrix_x4(kb4, Ks + (16 * np + ((lane >> 4) << 3) + (lane & 7)) * LD + 16 * ks + ((lane >> 3) & 1) * 8);
                cu_mma16816(S[2 * np], qa, kb4[0], kb4[1]);
                cu_mma16816(S[2 * np + 1], qa, kb4[2], kb4[3]);
            }
        }

        /* mask (only a tile that reaches past the warp's first row has masked keys), online
         * softmax in the exp2 domain: m is kept scaled, p = 2^(s scale - m) */
        if (kb + CU_ATT_BN > limf) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int key = kb + 8 * j + 2 * c;
                if (key >= lim0) S[j][0] = -INFINITY;
                if (key + 1 >= lim0) S[j][1] = -INFINITY;
                if (key >= lim1) S[j][2] = -INFINITY;
                if (key + 1 >= lim1) S[j][3] = -INFINITY;
            }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            mx0 = fmaxf(mx0, fmaxf(S[j][0], S[j][1]));
            mx1 = fmaxf(mx1, fmaxf(S[j][2], S[j][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float nm0 = fmaxf(m0, mx0 * a.scale_log2), nm1 = fmaxf(m1, mx1 * a.scale_log2);
        const float u0 = nm0 == -INFINITY ? 0.f : nm0, u1 = nm1 == -INFINITY ? 0.f : nm1;
        const float al0 = exp2f(m0 - u0), al1 = exp2f(m1 - u1);
        m0 = nm0;
        m1 = nm1;
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            S[j][0] = exp2f(fmaf(S[j][0], a.scale_log2, -u0));
            S[j][1] = exp2f(fmaf(S[j][1], a.scale_log2, -u0));
            S[j][2] = exp2f(fmaf(S[j][2], a.scale_log2, -u1));
            S[j][3] = exp2f(fmaf(S[j][3], a.scale_log2, -u1));
            s0 += S[j][0] + S[j][1];
            s1 += S[j][2] + S[j][3];
        }
        l0 = l0 * al0 + s0;
        l1 = l1 * al1 + s1;
        if (__any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) { /* once the maxima settle: skipped */
#pragma unroll
            for (int j = 0; j < HD / 8; j++) {
                O[j][0] *= al0;
                O[j][1] *= al0;
                O[j][2] *= al1;
                O[j][3] *= al1;
            }
        }
        uint32_t pa[4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            pa[ks][0] = cu_pack_bf16(S[2 * ks][0], S[2 * ks][1]);
            pa[ks][1] = cu_pack_bf16(S[2 * ks][2], S[2 * ks][3]);
            pa[ks][2] = cu_pack_bf16(S[2 * ks + 1][0], S[2 * ks + 1][1]);
            pa[ks][3] = cu_pack_bf16(S[2 * ks + 1][2], S[2 * ks + 1][3]);
        }
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
#pragma unroll
            for (int np = 0; np < HD / 16; np++) {
                uint32_t vb[4];
                cu_ldmatrix_x4_trans(vb, Vs + (16 * ks + (lane & 15)) * LD + 16 * np + (lane >> 4) * 8);
                cu_mma16816(O[2 * np], pa[ks], vb[0], vb[1]);
                cu_mma16816(O[2 * np + 1], pa[ks], vb[2], vb[3]);
            }
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (a.splits == 1) { /* finish here: normalise, gate, bf16 */
        const int rw[2] = {row0, row1};
        const float il[2] = {l0 > 0.f ? 1.f / l0 : 0.f, l1 > 0.f ? 1.f / l1 : 0.f};
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int t = rw[hh];
            if (t >= a.rows) continue;
            const bool real = t < len;
            const bf16 *gate = a.QKV + (size_t)t * a.ld + (size_t)h * 2 * HD + HD;
            bf16 *o = a.out + ((size_t)t * a.nh + h) * HD;
#pragma unroll
            for (int j = 0; j < HD / 8; j++) {
                const int d = 8 * j + 2 * c;
                float v0 = 0.f, v1 = 0.f;
                if (real) {
                    v0 = O[j][2 * hh] * il[hh] * cu_sigmoid(__bfloat162float(gate[d]));
                    v1 = O[j][2 * hh + 1] * il[hh] * cu_sigmoid(__bfloat162float(gate[d + 1]));
                }
                *(uint32_t *)(o + d) = cu_pack_bf16(v0, v1);
            }
        }
        return;
    }
    if (row0 < a.rows) {
        const size_t i = ((size_t)sp * a.total + row0) * a.nh + h;
        float *o = a.Op + i * HD;
#pragma unroll
        for (int j = 0; j < HD / 8; j++) *(float2 *)(o + 8 * j + 2 * c) = make_float2(O[j][0], O[j][1]);
        if (c == 0) {
            a.Mp[i] = m0;
            a.Lp[i] = l0;
        }
    }
    if (row1 < a.rows) {
        const size_t i = ((size_t)sp * a.total + row1) * a.nh + h;
        float *o = a.Op + i * HD;
#pragma unroll
        for (int j = 0; j < HD / 8; j++) *(float2 *)(o + 8 * j + 2 * c) = make_float2(O[j][2], O[j][3]);
        if (c == 0) {
            a.Mp[i] = m1;
            a.Lp[i] = l1;
        }
    }
}

/* ---- 3. merge the splits, * sigmoid(gate): one warp per (token, head) -------------------------- */

#define COMBINE_WARPS 8 /* (token, head) pairs per block */
#define COMBINE_BATCH 8 /* split partials loaded at once when there are many */
#if ATT_SPLIT_MAX > 64
#error "attn_combine reads at most two splits a lane"
#endif

/* One warp per (token, head), COMBINE_WARPS to a block: the lanes read the splits' maxima and sums
 * (splits <= ATT_SPLIT_MAX = 2 x 32, two per lane), the weights come from warp reductions, and each
 * lane then sums 4 head-dim values at a time over the splits (float4 loads), so there is no shared
 * memory and no barrier. (A 256-thread block per pair, with two barriers and a serial weight loop,
 * takes ~4x its bytes' time at memory bandwidth.) */
/* acc += sum over the splits of weight * partial, B splits' loads in flight at once (a hit has ~17
 * splits: one at a time they were a chain of dependent round trips; a cold chunk has 2, where a batch
 * doubled the kernel's time). An empty split's partial is never written: weight 0, not read. */
template <int B>
__device__ __forceinline__ void combine_splits(float4 &acc, const float *src, size_t sstride, int splits, float wa,
                                               float wb) {
    for (int s0 = 0; s0 < splits; s0 += B) {
        float wg[B];
        float4 v[B];
#pragma unroll
        for (int u = 0; u < B; u++) {
            const int sp = s0 + u;
            const float wq = __shfl_sync(0xffffffffu, sp < 32 ? wa : wb, sp & 31);
            wg[u] = sp < splits ? wq : 0.f;
            v[u] = wg[u] != 0.f ? *(const float4 *)(src + (size_t)sp * sstride) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < B; u++) {
            acc.x += wg[u] * v[u].x;
            acc.y += wg[u] * v[u].y;
            acc.z += wg[u] * v[u].z;
            acc.w += wg[u] * v[u].w;
        }
    }
}

__global__ void __launch_bounds__(COMBINE_WARPS * 32) attn_combine_kernel(
    const float *__restrict__ Op, const float *__restrict__ Mp, const float *__restrict__ Lp,
    const bf16 *__restrict__ QKV, int ld, bf16 *__restrict__ out, const cu_chunk_params *__restrict__ prm, int rows,
    int bucket, int nh, int hd, int splits) {
    const int pair = blockIdx.x * COMBINE_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (pair >= rows * nh) return;
    const int t = pair / nh, h = pair % nh; /* t: a token of the batch (rows of them) */
    const bool real = t % bucket < prm[t / bucket].len;
    float ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f;
    if (lane < splits) {
        const size_t i = ((size_t)lane * rows + t) * nh + h;
        ma = Mp[i];
        la = Lp[i];
    }
    if (lane + 32 < splits) {
        const size_t i = ((size_t)(lane + 32) * rows + t) * nh + h;
        mb = Mp[i];
        lb = Lp[i];
    }
    const float mmax = cu_warp_max(fmaxf(ma, mb));
    float wa = ma == -INFINITY ? 0.f : exp2f(ma - mmax), wb = mb == -INFINITY ? 0.f : exp2f(mb - mmax);
    const float den = cu_warp_sum(wa * la + wb * lb);
    const float inv = den > 0.f ? 1.f / den : 0.f;
    wa *= inv;
    wb *= inv;
    const bf16 *gate = QKV + (size_t)t * ld + (size_t)h * 2 * hd + hd;
    bf16 *o = out + ((size_t)t * nh + h) * hd;
    for (int d = 4 * lane; d < hd; d += 128) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        if (real) {
            const float *src = Op + ((size_t)t * nh + h) * hd + d;
            const size_t sstride = (size_t)rows * nh * hd; /* between splits */
            if (splits > COMBINE_BATCH / 2) {
                combine_splits<COMBINE_BATCH>(acc, src, sstride, splits, wa, wb);
            } else { /* few splits (a cold chunk): one at a time measured fastest (98 vs 224 us a chunk) */
                for (int sp = 0; sp < splits; sp++) {
                    const float wgt = __shfl_sync(0xffffffffu, sp < 32 ? wa : wb, sp & 31);
                    if (wgt != 0.f) {
                        const float4 v = *(const float4 *)(src + (size_t)sp * sstride);
                        acc.x += wgt * v.x;
                        acc.y += wgt * v.y;
                        acc.z += wgt * v.z;
                        acc.w += wgt * v.w;
                    }
                }
            }
            acc.x *= cu_sigmoid(__bfloat162float(gate[d]));
            acc.y *= cu_sigmoid(__bfloat162float(gate[d + 1]));
            acc.z *= cu_sigmoid(__bfloat162float(gate[d + 2]));
            acc.w *= cu_sigmoid(__bfloat162float(gate[d + 3]));
        }
        *(uint2 *)(o + d) = make_uint2(cu_pack_bf16(acc.x, acc.y), cu_pack_bf16(acc.z, acc.w));
    }
}

/* ---- the exact path: fp32, one warp per (query row, head) --------------------------------------- */

#define ATT_EX_MAX_HD 256

struct attn_exact_args {
    const float *Qb, *QKV;
    ptrdiff_t wko, wvo, bko, bvo; /* as attn_fwd_args */
    size_t kv_stride;
    int ld;
    float *out;
    const cu_chunk_params *prm; /* the batch's rows */
    int nh, nkv, hd;
    int bucket; /* tokens per row */
    float scale;
};

__global__ void __launch_bounds__(32) attn_exact_kernel(attn_exact_args a) {
    extern __shared__ float sq[]; /* [hd] */
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    {
        const size_t tok0 = (size_t)blockIdx.z * a.bucket;
        a.prm += blockIdx.z;
        a.Qb += tok0 * a.nh * a.hd;
        a.QKV += tok0 * a.ld;
        a.out += tok0 * a.nh * a.hd;
    }
    const int start = a.prm->start, len = a.prm->len, hd = a.hd;
    float *out = a.out + ((size_t)t * a.nh + h) * hd;
    if (t >= len) {
        for (int d = lane; d < hd; d += 32) out[d] = 0.f;
        return;
    }
    const float *q = a.Qb + ((size_t)t * a.nh + h) * hd;
    for (int d = lane; d < hd; d += 32) sq[d] = q[d];
    __syncwarp();
    const int kvh = h / (a.nh / a.nkv), nkeys = start + t + 1;
    const int split = a.prm->kv_split;
    const float *const Kc = (const float *)a.prm->kv_work + a.wko, *const Vc = (const float *)a.prm->kv_work + a.wvo;
    const float *Kb = split > 0 ? (const float *)a.prm->kv_src + a.bko : Kc;
    const float *Vb = split > 0 ? (const float *)a.prm->kv_src + a.bvo : Vc;
    float O[ATT_EX_MAX_HD / 32];
#pragma unroll
    for (int e = 0; e < ATT_EX_MAX_HD / 32; e++) O[e] = 0.f;
    double m = -INFINITY, l = 0;
    for (int kb = 0; kb < nkeys; kb += 32) {
        const int j = kb + lane;
        double sc = -INFINITY;
        if (j < nkeys) {
            const float *k = (j < split ? Kb + (size_t)j * a.kv_stride : Kc + (size_t)(j - split) * a.kv_stride) +
                             (size_t)kvh * hd;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            for (int d = 0; d < hd; d++) acc[d & 3] += sq[d] * k[d];
            sc = (double)((acc[0] + acc[1]) + (acc[2] + acc[3])) * a.scale;
        }
        double mx = sc;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const double mn = fmax(m, mx); /* finite: key kb is always valid */
        const float p = j < nkeys ? (float)exp(sc - mn) : 0.f;
        const float alpha = (float)exp(m - mn);
        double ps = p;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        l = l * alpha + ps;
#pragma unroll
        for (int e = 0; e < ATT_EX_MAX_HD / 32; e++) O[e] *= alpha;
        const int nj = nkeys - kb < 32 ? nkeys - kb : 32;
        for (int jj = 0; jj < nj; jj++) {
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            const int jv = kb + jj;
            const float *v = (jv < split ? Vb + (size_t)jv * a.kv_stride : Vc + (size_t)(jv - split) * a.kv_stride) +
                             (size_t)kvh * hd;
#pragma unroll
            for (int e = 0; e < ATT_EX_MAX_HD / 32; e++)
                if (lane + 32 * e < hd) O[e] += pj * v[lane + 32 * e];
        }
        m = mn;
    }
    const float *gate = a.QKV + (size_t)t * a.ld + (size_t)h * 2 * hd + hd;
#pragma unroll
    for (int e = 0; e < ATT_EX_MAX_HD / 32; e++) {
        const int d = lane + 32 * e;
        if (d < hd) out[d] = (float)(O[e] / l / (1.0 + exp(-(double)gate[d])));
    }
}

/* ---- host side ---------------------------------------------------------------------------------- */

#define ATT_SHAPES(X) X(16) X(32) X(64) X(128) X(256)

int cu_attn_supported(const cu_attn_dims *d) {
    if (d->nkv <= 0 || d->nh % d->nkv || d->rd % 2 || d->rd > d->hd) return 0;
    if (d->f32) return d->hd >= 1 && d->hd <= ATT_EX_MAX_HD;
#define ATT_SUP(HD_) if (d->hd == HD_) return 1;
    ATT_SHAPES(ATT_SUP)
#undef ATT_SUP
    return 0;
}

int cu_attn_init(const cu_attn_dims *d, squad_err *err) {
    if (d->f32) return 0;
#define ATT_INIT(HD_)                                                                                              \
    if (d->hd == HD_) {                                                                                            \
        CU_TRY(cudaFuncSetAttribute(attn_fwd_kernel<HD_>, cudaFuncAttributeMaxDynamicSharedMemorySize,             \
                                    (int)att_smem<HD_>::bytes));                                                   \
        return 0;                                                                                                  \
    }
    ATT_SHAPES(ATT_INIT)
#undef ATT_INIT
    return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA: attention head_dim %d not supported (16, 32, 64, 128, 256)", d->hd);
}

/* Query heads per attn_fwd block: the largest power of two <= ATT_WARPS that divides the GQA group
 * (they share one kv head, so each K / V tile in shared memory feeds all of them). */
static int att_heads_per_block(const cu_attn_dims *d) {
    const int g = d->nh / d->nkv;
    int p = ATT_WARPS;
    while (g % p) p >>= 1;
    return p;
}

/* Tokens per attn_fwd block: 16 per warp of one head. */
static int att_tokens_per_block(const cu_attn_dims *d) { return 16 * (ATT_WARPS / att_heads_per_block(d)); }

int cu_attn_splits(const cu_attn_dims *d, int nrows, int rows, int span, int n_sm, int force) {
    const int bt = att_tokens_per_block(d);
    const int base = nrows * ((rows + bt - 1) / bt) * (d->nh / att_heads_per_block(d));
    const int slots = ATT_BLOCKS_PER_SM * n_sm;
    int s;
    if ((size_t)rows * ATT_UNIFORM_SPAN_X <= (size_t)span && base <= slots)
        s = slots / base; /* a short chunk on a long cache: every block has about the same keys, so
                             fill one wave and no more (32 x 5 blocks of a 512-token hit on 132 SMs
                             took 3.11 ms, 32 x 4 2.85) */
    else
        s = (slots + base - 1) / base; /* every SM busy; past that the longest-first order balances */
    if (force > 0) s = force; /* an experiment's fixed count, still bounded below */
    const int by_keys = span / ATT_SPLIT_MIN_KEYS;
    const int by_mem = ATT_SPLIT_ROWS_MAX / (nrows * rows);
    if (s > by_keys) s = by_keys;
    if (s > by_mem) s = by_mem;
    if (s > ATT_SPLIT_MAX) s = ATT_SPLIT_MAX;
    return s < 1 ? 1 : s;
}

size_t cu_attn_partial_bytes(const cu_attn_dims *d, int tokens, int splits) {
    const size_t n = (size_t)splits * tokens * d->nh;
    return n * d->hd * 4 + 2 * n * 4 + 512;
}

int cu_attn_forward(const cu_attn_dims *d, const void *QKVv, const float *q_norm, const float *k_norm,
                    const float *inv_freq, ptrdiff_t wko, ptrdiff_t wvo, ptrdiff_t bko, ptrdiff_t bvo, void *Qbv,
                    void *part, int splits, void *outv, const cu_batch *b, cudaStream_t st, squad_err *err) {
    const int nwarp = d->nh + d->nkv;
    const cu_chunk_params *prm = b->prm;
    const int rows = b->bucket;
    const unsigned nr = (unsigned)b->nrows;
    const int total = b->nrows * b->bucket;
    const size_t psm = ((size_t)nwarp * d->hd + d->rd) * sizeof(float);
    if (d->f32) {
        attn_prep_args<float> pa = {(const float *)QKVv, d->ldQKV, q_norm, k_norm, inv_freq, wko, wvo,
                                    d->kv_stride, (float *)Qbv, prm, d->nh, d->nkv, d->hd, d->rd, rows, d->eps};
        attn_prep_kernel<float><<<dim3((unsigned)rows, nr), 32 * nwarp, psm, st>>>(pa);
        CU_LAUNCH_CHECK("attn_prep_kernel");
        attn_exact_args ea = {(const float *)Qbv, (const float *)QKVv, wko, wvo, bko, bvo,
                              d->kv_stride, d->ldQKV, (float *)outv, prm, d->nh, d->nkv, d->hd, rows,
                              (float)(1.0 / sqrt((double)d->hd))};
        attn_exact_kernel<<<dim3((unsigned)rows, (unsigned)d->nh, nr), 32, (size_t)d->hd * sizeof(float), st>>>(ea);
        CU_LAUNCH_CHECK("attn_exact_kernel");
        return 0;
    }
    const bf16 *QKV = (const bf16 *)QKVv;
    bf16 *Qb = (bf16 *)Qbv, *out = (bf16 *)outv;
    const unsigned run = d->stages ? d->stages : CU_ATT_PREP | CU_ATT_FWD | CU_ATT_COMBINE;
    attn_prep_args<bf16> pa = {QKV, d->ldQKV, q_norm, k_norm, inv_freq, wko, wvo, d->kv_stride, Qb, prm,
                               d->nh, d->nkv, d->hd, d->rd, rows, d->eps};
    if (run & CU_ATT_PREP) {
        attn_prep_kernel<bf16><<<dim3((unsigned)rows, nr), 32 * nwarp, psm, st>>>(pa);
        CU_LAUNCH_CHECK("attn_prep_kernel");
    }

    const size_t n = (size_t)splits * total * d->nh;
    float *Op = (float *)part;
    float *Mp = Op + n * d->hd;
    float *Lp = Mp + n;
    const int hpb = att_heads_per_block(d), bt = att_tokens_per_block(d), tiles = (rows + bt - 1) / bt;
    attn_fwd_args fa = {Qb, wko, wvo, bko, bvo, d->kv_stride, prm, rows, d->nh, d->nkv, splits, b->nrows, tiles,
                        (size_t)total, hpb, (float)(1.0 / sqrt((double)d->hd) * 1.4426950408889634), Op, Mp, Lp,
                        QKV, d->ldQKV, out};
    dim3 grid((unsigned)(d->nh / hpb), (unsigned)tiles * nr, (unsigned)splits);
    int launched = 0;
#define ATT_RUN(HD_)                                                                      \
    if (d->hd == HD_) {                                                                   \
        if (run & CU_ATT_FWD) attn_fwd_kernel<HD_><<<grid, ATT_THREADS, att_smem<HD_>::bytes, st>>>(fa); \
        launched = 1;                                                                     \
    }
    ATT_SHAPES(ATT_RUN)
#undef ATT_RUN
    if (!launched) return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA: attention head_dim %d not supported", d->hd);
    CU_LAUNCH_CHECK("attn_fwd_kernel");
    if (splits > 1 && (run & CU_ATT_COMBINE)) {
        const unsigned pairs = (unsigned)total * (unsigned)d->nh;
        attn_combine_kernel<<<(pairs + COMBINE_WARPS - 1) / COMBINE_WARPS, COMBINE_WARPS * 32, 0, st>>>(
            Op, Mp, Lp, QKV, d->ldQKV, out, prm, total, rows, d->nh, d->hd, splits);
        CU_LAUNCH_CHECK("attn_combine_kernel");
    }
    return 0;
}
