/*
 * k_attn.cuh — what attention's two forward kernels share (k_attn.cu's attn_fwd on mma.sync, and
 * k_attn_sm90.cu's on wgmma, sm_90a only): the arguments, the block's place in the batch (row, query
 * tile, head group, split of the keys), the copies of the Q and K / V tiles into shared memory, and
 * the end of a block (normalise and gate, or write the split's partials).
 *
 * Both kernels give a block 8 warps and 128 query rows (tokens x heads of one GQA group: row i of the
 * tile is warp i / 16's row i % 16) and hold a warp's 16 rows in the same fragment layout (the
 * mma.sync m16n8 accumulator, which is also each warp's slice of a wgmma m64 accumulator), so the
 * online softmax and the ending are the same code.
 */
#ifndef SQUAD_K_ATTN_CUH
#define SQUAD_K_ATTN_CUH

#include "cuda_internal.cuh"

#define ATT_WARPS 8 /* attn_fwd: each warp takes 16 query rows (tokens of one head) */
#define ATT_THREADS (32 * ATT_WARPS)
#define ATT_ROWS (16 * ATT_WARPS) /* query rows (token, head) per attn_fwd block */
#define ATT_STAGES 2              /* K / V tiles in shared memory: the next loads while this one runs */

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
    bf16 *out; /* [rows][ldo] */
    int ldo;   /* out's row stride (cu_attn_dims.ldo, or nh hd) */
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
    static constexpr int SEG = HD / 8;
    static constexpr int RP = ATT_THREADS / SEG;
    static constexpr int PASSES = (CU_ATT_BN + RP - 1) / RP;
    static constexpr int Q_PASSES = (ATT_ROWS + RP - 1) / RP;
    static_assert(ATT_THREADS % SEG == 0, "a thread's piece is the same in every row");
};

/* The K and V tile of keys [kb, kb + BN) into Ks / Vs (rows at or past k_hi zero-filled). A tile
 * wholly inside the key range and on one side of split (all but a block's last tile and the one
 * that crosses a hit's split) takes the plain path: no per-key choice. dst: the thread's first
 * piece in the tile, DSTEP: elements from a pass's piece to the next one's (the layouts differ: padded
 * rows for mma.sync, 128-byte swizzled panels for wgmma); col: its first element in a key row
 * (kvh HD + 8 piece). */
template <int HD, int DSTEP>
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
            cu_cp_async16(Ks + dst + p * DSTEP, k + p * step, 16);
            cu_cp_async16(Vs + dst + p * DSTEP, v + p * step, 16);
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
        cu_cp_async16(Ks + dst + p * DSTEP, k, ok ? 16 : 0);
        cu_cp_async16(Vs + dst + p * DSTEP, v, ok ? 16 : 0);
    }
}

/* Row i of a block's Q tile (warp i / 16, its row i % 16) is token t0 + 16 (warp % tpw) + i % 16 of
 * head h0 + warp / tpw, tpw = ATT_WARPS / hpb = 2^tpw_sh warps per head. */
__device__ __forceinline__ void att_row(int i, int t0, int h0, int tpw, int tpw_sh, int *t, int *h) {
    const int wi = i >> 4;
    *t = t0 + 16 * (wi & (tpw - 1)) + (i & 15);
    *h = h0 + (wi >> tpw_sh);
}


/* A block's place: row `row` of the batch, query tile t0 (tokens t0 .. t0 + bt - 1) of heads h0 ..
 * h0 + hpb - 1, keys [k_lo, k_hi) of the row's [0, start + len). */
struct att_block {
    int row, sp, start, len, tpw, tpw_sh, t0, h0, k_lo, k_hi;
};

/* blockIdx.x: the head group (fastest, so a kv head's groups run side by side); blockIdx.y = (query
 * tiles from the last) x nrows + row, so every row's last tiles (the longest key ranges) start first
 * (causal balance); blockIdx.z: the split. Moves a's per-row pointers to the block's row. A block
 * with no keys in its split writes what the ending needs (an empty partial, or zeros) and returns
 * false. */
template <int HD>
__device__ __forceinline__ bool att_begin(attn_fwd_args &a, att_block &b) {
    b.row = blockIdx.y % a.nrows;
    const int qt = a.tiles - 1 - blockIdx.y / a.nrows, hg = blockIdx.x, tid = threadIdx.x;
    b.sp = blockIdx.z;
    a.prm += b.row;
    {
        const size_t tok0 = (size_t)b.row * a.rows;
        a.Qb += tok0 * a.nh * HD;
        a.QKV += tok0 * a.ld;
        a.out += tok0 * a.ldo;
        a.Op += tok0 * a.nh * HD;
        a.Mp += tok0 * a.nh;
        a.Lp += tok0 * a.nh;
    }
    b.start = a.prm->start;
    b.len = a.prm->len;
    b.tpw = ATT_WARPS / a.hpb; /* warps (of 16 tokens) per head: a power of two */
    b.tpw_sh = __ffs(b.tpw) - 1;
    const int bt = 16 * b.tpw; /* tokens per block */
    b.t0 = qt * bt;
    b.h0 = hg * a.hpb;
    b.k_lo = b.k_hi = 0;
    if (b.t0 < b.len) {
        const int kend = b.start + min(b.t0 + bt, b.len);
        const int per = ((kend + a.splits - 1) / a.splits + CU_ATT_BN - 1) / CU_ATT_BN * CU_ATT_BN;
        b.k_lo = b.sp * per;
        b.k_hi = min(kend, b.k_lo + per);
    }
    if (b.k_lo < b.k_hi) return true;
    /* nothing for this split: an empty partial (or zeros, written directly) */
    if (a.splits == 1) {
        for (int e = tid; e < ATT_ROWS * HD; e += ATT_THREADS) {
            int t, h;
            att_row(e / HD, b.t0, b.h0, b.tpw, b.tpw_sh, &t, &h);
            if (t < a.rows) a.out[(size_t)t * a.ldo + (size_t)h * HD + e % HD] = __float2bfloat16(0.f);
        }
        return false;
    }
    if (tid < ATT_ROWS) {
        int t, h;
        att_row(tid, b.t0, b.h0, b.tpw, b.tpw_sh, &t, &h);
        if (t < a.rows) {
            const size_t i = ((size_t)b.sp * a.total + t) * a.nh + h;
            a.Mp[i] = -INFINITY;
            a.Lp[i] = 0.f;
        }
    }
    return false;
}

/* The lane's two query rows of warp w: row0 and row1 = row0 + 8 (tokens) of head h, their exclusive
 * key limits lim0 / lim1 (causal, within the split's [k_lo, k_hi)), the warp's first token wt0 and
 * its limit limf (keys below it are unmasked for every row of the warp). Shared by both forwards. */
struct att_warp_rows {
    int h, row0, row1, lim0, lim1, wt0, limf;
};
__device__ __forceinline__ att_warp_rows att_rows_of(const att_block &b, int w, int lane) {
    att_warp_rows q;
    q.h = b.h0 + (w >> b.tpw_sh);
    q.wt0 = b.t0 + 16 * (w & (b.tpw - 1));
    q.row0 = q.wt0 + (lane >> 2);
    q.row1 = q.row0 + 8;
    q.lim0 = min(b.k_hi, b.start + min(q.row0, b.len - 1) + 1);
    q.lim1 = min(b.k_hi, b.start + min(q.row1, b.len - 1) + 1);
    q.limf = min(b.k_hi, b.start + min(q.wt0, b.len - 1) + 1);
    return q;
}

/* The online softmax's running state of the lane's two rows, cleared: the output accumulators, the
 * maxima (in the exp2 domain, att_tile_max) and the sums. */
template <int HD>
__device__ __forceinline__ void att_acc_clear(float (&O)[HD / 8][4], float &m0, float &m1, float &l0, float &l1) {
#pragma unroll
    for (int j = 0; j < HD / 8; j++) O[j][0] = O[j][1] = O[j][2] = O[j][3] = 0.f;
    m0 = m1 = -INFINITY;
    l0 = l1 = 0.f;
}

/* Where the block's row reads its keys (att_kv_src). */
/* The online softmax's first half for one tile of CU_ATT_BN keys from kb, on a warp's two rows (S:
 * the m16n8 fragments of 8 key groups, c the lane's column pair): keys at or past lim0 / lim1
 * masked (only a tile that reaches past limf, the warp's first row's limit, has any), the rows'
 * maxima, and in the exp2 domain (m kept scaled: p = 2^(s scale - m)) the new maxima into m0 / m1,
 * the subtrahends u0 / u1 of the exponentials (0 for a row with no key yet) and the factors al0 /
 * al1 by which the old sums and outputs shrink. Shared by the mma.sync and wgmma forwards. */
__device__ __forceinline__ void att_tile_max(float (&S)[8][4], int kb, int c, int limf, int lim0, int lim1,
                                             float scale_log2, float &m0, float &m1, float &u0, float &u1,
                                             float &al0, float &al1) {
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
    float mx0, mx1;
    cu_frag_row_max(S, mx0, mx1);
    const float nm0 = fmaxf(m0, mx0 * scale_log2), nm1 = fmaxf(m1, mx1 * scale_log2);
    u0 = nm0 == -INFINITY ? 0.f : nm0;
    u1 = nm1 == -INFINITY ? 0.f : nm1;
    al0 = exp2f(m0 - u0);
    al1 = exp2f(m1 - u1);
    m0 = nm0;
    m1 = nm1;
}

__device__ __forceinline__ att_kv_src att_sources(const attn_fwd_args &a) {
    att_kv_src kv;
    kv.split = a.prm->kv_split;
    kv.stride = a.kv_stride;
    kv.Kc = (const bf16 *)a.prm->kv_work + a.wko;
    kv.Vc = (const bf16 *)a.prm->kv_work + a.wvo;
    /* keys below split: the cache blob read in place (never dereferenced when split is 0) */
    kv.Kb = kv.split > 0 ? (const bf16 *)a.prm->kv_src + a.bko : kv.Kc;
    kv.Vb = kv.split > 0 ? (const bf16 *)a.prm->kv_src + a.bvo : kv.Vc;
    return kv;
}

/* The end of a block, for the lane's rows row0 and row1 = row0 + 8 of head h (c = lane % 4): l
 * summed over the quad; with one split, out = O / l * sigmoid(gate) in bf16 (0 on padding), else
 * the unnormalised O, the running max and the sum go to the split's partials. */
template <int HD>
__device__ __forceinline__ void att_finish(const attn_fwd_args &a, const att_block &b, const float (&O)[HD / 8][4],
                                           float m0, float m1, float l0, float l1, int row0, int row1, int h,
                                           int c) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const int rw[2] = {row0, row1};
    if (a.splits == 1) { /* finish here: normalise, gate, bf16 */
        const float il[2] = {l0 > 0.f ? 1.f / l0 : 0.f, l1 > 0.f ? 1.f / l1 : 0.f};
        /* Both rows' output gates first, a pair of bf16 a load, all in flight together: the stores
         * to out may alias QKV as far as the compiler knows, so a gate load placed after a store
         * waited for it, and the epilogue was a chain of dependent round trips (a cold row's
         * attention forward spent ~a fifth of its time there, docs/cuda.md). The bits are those
         * of __bfloat162float on each half. */
        const bool real[2] = {row0 < a.rows && row0 < b.len, row1 < a.rows && row1 < b.len};
        uint32_t g[2][HD / 8];
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const uint32_t *gate =
                (const uint32_t *)(a.QKV + (size_t)(real[hh] ? rw[hh] : 0) * a.ld + (size_t)h * 2 * HD + HD) + c;
#pragma unroll
            for (int j = 0; j < HD / 8; j++) g[hh][j] = real[hh] ? __ldg(gate + 4 * j) : 0u;
        }
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int t = rw[hh];
            if (t >= a.rows) continue;
            bf16 *o = a.out + (size_t)t * a.ldo + (size_t)h * HD;
#pragma unroll
            for (int j = 0; j < HD / 8; j++) {
                const int d = 8 * j + 2 * c;
                float v0 = 0.f, v1 = 0.f;
                if (real[hh]) {
                    v0 = O[j][2 * hh] * il[hh] * cu_sigmoid(__uint_as_float(g[hh][j] << 16));
                    v1 = O[j][2 * hh + 1] * il[hh] * cu_sigmoid(__uint_as_float(g[hh][j] & 0xffff0000u));
                }
                *(uint32_t *)(o + d) = cu_pack_bf16(v0, v1);
            }
        }
        return;
    }
    /* a key split's partial outputs, maxima and sums, for att_combine */
    const float mm[2] = {m0, m1}, ll[2] = {l0, l1};
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        if (rw[hh] >= a.rows) continue;
        const size_t i = ((size_t)b.sp * a.total + rw[hh]) * a.nh + h;
        float *o = a.Op + i * HD;
#pragma unroll
        for (int j = 0; j < HD / 8; j++) *(float2 *)(o + 8 * j + 2 * c) = make_float2(O[j][2 * hh], O[j][2 * hh + 1]);
        if (c == 0) {
            a.Mp[i] = mm[hh];
            a.Lp[i] = ll[hh];
        }
    }
}

/* ---- k_attn_sm90.cu: the forward on wgmma (sm_90a) ---- */
/* Whether the wgmma forward runs here (*ok: compute capability 9.0 and this build's sm_90a cubin
 * loads); sets its shared-memory limit when it does. */
int cu_attn_sm90_probe(int *ok, squad_err *err);
/* Whether it takes this head_dim. */
int cu_attn_sm90_takes(int hd);
/* attn_fwd's launch, on wgmma (same grid, same arguments, same outputs). */
void cu_attn_sm90_launch(const attn_fwd_args *a, dim3 grid, cudaStream_t st);

#endif
