/*
 * k_attn.cu — gated full attention between q/k/v_proj and o_proj, as three kernels.
 *
 * 1. attn_prep (one block per token): q / k RMSNorm per head (zero-centred weight, fp32), partial
 *    RoPE on the first rd dims (rotate-half within rd, angle = fp32(position * inv_freq) as
 *    transformers computes it, cos / sin in double so long positions keep their accuracy),
 *    positions offset by the chunk start; a row with CU_ROW_POSITIONS turns each frequency by its
 *    token's position on that frequency's M-RoPE axis (cu_attn_dims.mrope_axis). q goes to a
 *    scratch [rows][nh][hd]; k and v of the real tokens go straight into the K / V cache at
 *    [start, start + len) (the cache is indexed by the token's place in the row, never by M-RoPE).
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
 *    On compute capability 9.0 with head_dim 256 the same block runs on wgmma instead
 *    (k_attn_sm90.cu, chosen in cu_attn_init; what the two share is in k_attn.cuh). Each thread
 *    copies fixed 16-byte pieces of a tile (one column, rows 8 apart at hd 256), so a tile's copies
 *    cost one address and a few adds; only a block's last tile and the one crossing a hit's split
 *    choose per key between the blob and the own buffer (per-key choices with branches and
 *    divisions made batching's attn_fwd 10-25 % slower than the single-row kernel's).
 * The exact path (precision EXACT) runs attn_prep on fp32 activations and attn_exact (one warp per
 * query row and head, fp32 online softmax over all keys, gate fused) instead of 2 and 3.
 * A batch: every kernel takes all its rows in one launch (prep, exact: blockIdx.y / .z is the row;
 * attn_fwd: the rows folded into blockIdx.y beside the query tiles; combine: one warp per token of
 * any row) and reads the row's start, len, K / V buffers and split from its parameters. A row's
 * own K / V (prm.kv_work) holds its positions from kv_split on: position p at index p - kv_split.
 * A padding row (len 0) writes zeros and touches no K / V.
 * The host reference the tests compare with, cu_ref_attn, is in cuda_test_ref.cu (tests only).
 */
#include "k_attn.cuh"

#include <math.h>
#include <stdlib.h>

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
    const cu_token_image *img; /* the batch's tokens' M-RoPE positions (rows with CU_ROW_POSITIONS) */
    const int *mrope_axis;     /* [rd/2]: each frequency's axis; NULL: positions ignored */
};

#define ATT_PREP_REGS 8 /* head dims a lane of attn_prep keeps in registers: head_dim 256 / 32 lanes */

template <typename A>
__global__ void attn_prep_kernel(attn_prep_args<A> a) {
    extern __shared__ float sm[];
    const int nwarp = a.nh + a.nkv;
    float *buf = sm;                          /* [nwarp][hd] */
    float *cs = sm + (size_t)nwarp * a.hd;    /* cos [rd/2] */
    float *sn = cs + a.rd / 2;                /* sin [rd/2] */
    const int t = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* The warp's head of q or k (and a k warp's v) is loaded before the row's parameters are read:
     * every token of the bucket has its QKV row, so these loads' round trip overlaps the
     * parameters' and the rotary angles' instead of following them (the v copy at the end was a
     * dependent round trip of its own). A lane's first ATT_PREP_REGS head dims go to registers; larger
     * heads (the exact path's) load the rest where they are used. */
    const A *row = a.QKV + ((size_t)blockIdx.y * a.bucket + t) * a.ld;
    const bool is_q = w < a.nh;
    const int hh = is_q ? w : w - a.nh;
    const A *src = is_q ? row + (size_t)hh * 2 * a.hd : row + (size_t)a.nh * 2 * a.hd + (size_t)hh * a.hd;
    const A *vs = row + (size_t)a.nh * 2 * a.hd + (size_t)a.nkv * a.hd + (size_t)hh * a.hd;
    float xr[ATT_PREP_REGS];
    A vr[ATT_PREP_REGS];
#pragma unroll
    for (int i = 0; i < ATT_PREP_REGS; i++) {
        const int d = lane + 32 * i;
        xr[i] = d < a.hd ? cu_ld(src + d) : 0.f;
        if (!is_q && d < a.hd) vr[i] = vs[d];
    }
    const cu_chunk_params *prm = a.prm + blockIdx.y;
    const int start = prm->start, len = prm->len;
    if (len < 1) return; /* a padding row: attn_fwd / attn_exact write its zeros without q */
    a.Qb += (size_t)blockIdx.y * a.bucket * a.nh * a.hd;
    const int pos = start + t;
    /* the row's own K / V: position p at index p - kv_split (the chunk never starts below it) */
    A *const Kc = (A *)prm->kv_work + a.wko, *const Vc = (A *)prm->kv_work + a.wvo;
    const size_t own = (size_t)(pos - prm->kv_split);
    const int half = a.rd / 2;
    /* M-RoPE: each frequency turns by the token's position on its axis (t, h or w); a text row's
     * three axes are all `pos`, the plain rotary, bit for bit */
    const bool mrope = a.mrope_axis && (prm->image & CU_ROW_POSITIONS);
    int axis_pos[3] = {pos, pos, pos};
    if (mrope) {
        const cu_token_image ti = a.img[(size_t)blockIdx.y * a.bucket + t];
        axis_pos[0] = ti.t, axis_pos[1] = ti.h, axis_pos[2] = ti.w;
    }
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int p = mrope ? axis_pos[a.mrope_axis[i]] : pos;
        const float ang = __fmul_rn((float)p, a.inv_freq[i]);
        double s, c;
        sincos((double)ang, &s, &c);
        cs[i] = (float)c;
        sn[i] = (float)s;
    }
    __syncthreads();
    const float *nw = is_q ? a.q_norm : a.k_norm;
    float *b = buf + (size_t)w * a.hd;
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < ATT_PREP_REGS; i++) {
        const int d = lane + 32 * i;
        if (d < a.hd) {
            b[d] = xr[i];
            ss += xr[i] * xr[i];
        }
    }
    for (int d = lane + 32 * ATT_PREP_REGS; d < a.hd; d += 32) {
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
        A *vd = Vc + own * a.kv_stride + (size_t)hh * a.hd;
#pragma unroll
        for (int i = 0; i < ATT_PREP_REGS; i++)
            if (lane + 32 * i < a.hd) vd[lane + 32 * i] = vr[i];
        for (int d = lane + 32 * ATT_PREP_REGS; d < a.hd; d += 32) vd[d] = vs[d];
    }
}

/* ---- 2. flash attention over [cache | chunk], one split of the keys ------------------------------ */

/* Shared memory: Q [ATT_ROWS][LD], then ATT_STAGES x (K [BN][LD], V [BN][LD]); LD pads a row by 16
 * bytes so the 8 rows of an ldmatrix land in distinct banks. hd 256: 66 KB + 2 x 66 KB = 198 KB. */
template <int HD>
struct att_smem {
    static constexpr int LD = HD + 8;
    static constexpr size_t q_tile = (size_t)ATT_ROWS * LD * 2;
    static constexpr size_t kv_tile = (size_t)CU_ATT_BN * LD * 2;
    static constexpr size_t bytes = q_tile + (size_t)ATT_STAGES * 2 * kv_tile;
};

template <int HD>
__global__ void __launch_bounds__(ATT_THREADS, 1) attn_fwd_kernel(attn_fwd_args a) {
    typedef att_smem<HD> SM;
    static_assert(ATT_STAGES == 2, "the tile loop toggles between two K / V stages");
    constexpr int LD = SM::LD;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)smem;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    att_block b;
    if (!att_begin<HD>(a, b)) return;
    const int start = b.start, len = b.len, tpw = b.tpw, tpw_sh = b.tpw_sh, t0 = b.t0, h0 = b.h0;
    const int k_lo = b.k_lo, k_hi = b.k_hi;
    const int kvh = h0 / (a.nh / a.nkv);
    const att_kv_src kv = att_sources(a);

    /* this thread's piece of every tile (att_lanes) */
    typedef att_lanes<HD> LN;
    constexpr int DSTEP = LN::RP * LD;
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
        att_load_kv<HD, DSTEP>(K0, K0 + CU_ATT_BN * LD, kv, k_lo, k_hi, i0, kv_dst, kv_col);
    }
    cu_cp_async_commit();

    const int c = lane & 3;
    const att_warp_rows wr = att_rows_of(b, w, lane);
    const int h = wr.h, row0 = wr.row0, row1 = wr.row1, lim0 = wr.lim0, lim1 = wr.lim1, limf = wr.limf;
    /* the exclusive key limit of the warp's last row (a warp wholly past the bucket: no work) */
    const int limw = wr.wt0 >= a.rows ? k_lo : min(k_hi, start + min(wr.wt0 + 15, len - 1) + 1);
    float O[HD / 8][4], m0, m1, l0, l1;
    att_acc_clear<HD>(O, m0, m1, l0, l1);

    int stage = 0;
    for (int kb = k_lo; kb < k_hi; kb += CU_ATT_BN, stage ^= 1) {
        /* this tile has landed (the only group in flight), and every warp is done with the previous
         * one, whose stage the next tile's loads overwrite while this one is computed */
        cu_cp_async_wait<0>();
        __syncthreads();
        if (kb + CU_ATT_BN < k_hi) {
            bf16 *Kn = (bf16 *)(smem + SM::q_tile + (size_t)(stage ^ 1) * 2 * SM::kv_tile);
            att_load_kv<HD, DSTEP>(Kn, Kn + CU_ATT_BN * LD, kv, kb + CU_ATT_BN, k_hi, i0, kv_dst, kv_col);
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

        /* the mask and the online softmax's maxima (att_tile_max) */
        float u0, u1, al0, al1;
        att_tile_max(S, kb, c, limf, lim0, lim1, a.scale_log2, m0, m1, u0, u1, al0, al1);
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
        cu_frag_rescale(O, al0, al1);
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
    att_finish<HD>(a, b, O, m0, m1, l0, l1, row0, row1, h, c);
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
    const bf16 *__restrict__ QKV, int ld, bf16 *__restrict__ out, int ldo, const cu_chunk_params *__restrict__ prm,
    int rows, int bucket, int nh, int hd, int splits) {
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
    bf16 *o = out + (size_t)t * ldo + (size_t)h * hd;
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
    int ldo; /* out's row stride */
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
        a.out += tok0 * a.ldo;
    }
    const int start = a.prm->start, len = a.prm->len, hd = a.hd;
    float *out = a.out + (size_t)t * a.ldo + (size_t)h * hd;
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

/* The bf16 forward runs on wgmma wherever it can (head_dim 256 on compute capability 9.0, this
 * build's sm_90a code loading) and want_sm90 (cuda_knobs.att_sm90) allows; else on mma.sync. */
int cu_attn_init(cu_attn_dims *d, int want_sm90, squad_err *err) {
    d->sm90 = 0;
    if (d->f32) return 0;
    int found = 0;
#define ATT_INIT(HD_)                                                                                              \
    if (d->hd == HD_) {                                                                                            \
        CU_TRY(cudaFuncSetAttribute(attn_fwd_kernel<HD_>, cudaFuncAttributeMaxDynamicSharedMemorySize,             \
                                    (int)att_smem<HD_>::bytes));                                                   \
        found = 1;                                                                                                 \
    }
    ATT_SHAPES(ATT_INIT)
#undef ATT_INIT
    if (!found)
        return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA: attention head_dim %d not supported (16, 32, 64, 128, 256)",
                      d->hd);
    if (!want_sm90 || !cu_attn_sm90_takes(d->hd)) return 0;
    int ok = 0;
    const int rc = cu_attn_sm90_probe(&ok, err);
    d->sm90 = ok;
    return rc;
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

int cu_attn_splits(const cu_attn_dims *d, int nrows, int rows, int span, int n_sm) {
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
    const int ldo = d->ldo > 0 ? d->ldo : d->nh * d->hd; /* the output's row stride */
    if (d->f32) {
        attn_prep_args<float> pa = {(const float *)QKVv, d->ldQKV, q_norm, k_norm, inv_freq, wko, wvo,
                                    d->kv_stride, (float *)Qbv, prm, d->nh, d->nkv, d->hd, d->rd, rows, d->eps,
                                    b->img, d->mrope_axis};
        attn_prep_kernel<float><<<dim3((unsigned)rows, nr), 32 * nwarp, psm, st>>>(pa);
        CU_LAUNCH_CHECK("attn_prep_kernel");
        attn_exact_args ea = {(const float *)Qbv, (const float *)QKVv, wko, wvo, bko, bvo,
                              d->kv_stride, d->ldQKV, (float *)outv, ldo, prm, d->nh, d->nkv, d->hd, rows,
                              (float)(1.0 / sqrt((double)d->hd))};
        attn_exact_kernel<<<dim3((unsigned)rows, (unsigned)d->nh, nr), 32, (size_t)d->hd * sizeof(float), st>>>(ea);
        CU_LAUNCH_CHECK("attn_exact_kernel");
        return 0;
    }
    if ((d->ldQKV | ldo) & 1) /* the ending reads the gate and writes out a pair of bf16 at a time */
        return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA: attention row strides %d / %d (even ones only)", d->ldQKV, ldo);
    const bf16 *QKV = (const bf16 *)QKVv;
    bf16 *Qb = (bf16 *)Qbv, *out = (bf16 *)outv;
    const unsigned run = d->stages ? d->stages : CU_ATT_PREP | CU_ATT_FWD | CU_ATT_COMBINE;
    attn_prep_args<bf16> pa = {QKV, d->ldQKV, q_norm, k_norm, inv_freq, wko, wvo, d->kv_stride, Qb, prm,
                               d->nh, d->nkv, d->hd, d->rd, rows, d->eps, b->img, d->mrope_axis};
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
                        QKV, d->ldQKV, out, ldo};
    dim3 grid((unsigned)(d->nh / hpb), (unsigned)tiles * nr, (unsigned)splits);
    int launched = 0;
#define ATT_RUN(HD_)                                                                      \
    if (d->hd == HD_) {                                                                   \
        if (!(run & CU_ATT_FWD)) {                                                        \
        } else if (d->sm90 && cu_attn_sm90_takes(HD_)) {                                  \
            cu_attn_sm90_launch(&fa, grid, st);                                  \
        } else {                                                                          \
            attn_fwd_kernel<HD_><<<grid, ATT_THREADS, att_smem<HD_>::bytes, st>>>(fa);    \
        }                                                                                 \
        launched = 1;                                                                     \
    }
    ATT_SHAPES(ATT_RUN)
#undef ATT_RUN
    if (!launched) return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA: attention head_dim %d not supported", d->hd);
    CU_LAUNCH_CHECK("attn_fwd_kernel");
    if (splits > 1 && (run & CU_ATT_COMBINE)) {
        const unsigned pairs = (unsigned)total * (unsigned)d->nh;
        attn_combine_kernel<<<(pairs + COMBINE_WARPS - 1) / COMBINE_WARPS, COMBINE_WARPS * 32, 0, st>>>(
            Op, Mp, Lp, QKV, d->ldQKV, out, ldo, prm, total, rows, d->nh, d->hd, splits);
        CU_LAUNCH_CHECK("attn_combine_kernel");
    }
    return 0;
}
