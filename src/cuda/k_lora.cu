/*
 * k_lora.cu — the specialists' kernels (k_lora.cuh): the widened input [x | u] of an adapted GEMM
 * (a "site") and the router's feature sum.
 *
 * Design of cu_lora_input. A block owns a tile of LX_TM tokens, a group of the site's rank columns
 * (cw of the R columns every slot has) and a slice of `in`; the slices of one tile and group form a
 * thread-block cluster. Each block
 *   1. makes its slice of x for its tokens (LX_KC at a time, from the producer's inputs: the norm's
 *      h and weight, gate | up, or a copy), keeps it in shared memory and, in the first column
 *      group, writes it to xw;
 *   2. multiplies it by its slot's A rows of its column group on the tensor cores (mma.sync
 *      m16n8k16, fp32 accumulate), the k-steps spread over the block's 8 warps, whose partial sums
 *      it adds in warp order;
 *   3. pushes that sum into the shared memory of the cluster's first block, which adds the slices
 *      in slice order (deterministic, whatever the timing) and writes u for the tokens of that
 *      slot; the first slice's blocks also write zeros into every other slot's columns.
 * The norm's row scale needs the whole row: each block sums the squares of its slice, pushes the
 * sums into every block of the cluster, and each adds them in slice order (the same scale
 * everywhere). On a short slice the norm keeps its h and w in registers from the squares to x, so
 * the slice is read once.
 * At a hit's few tokens the kernel is latency-bound, so it counts dependent steps, not bytes:
 * the grid aims at what the SMs hold at once (narrow column groups, two blocks an SM, up to 8
 * slices, a cluster barrier or two); the tokens' slots and the first A fragments are loaded
 * before waiting for the previous kernel (programmatic dependent launch: neither is written by
 * it), and the next GEMM is let
 * start at once (it loads its weights while this kernel runs, and waits for it before reading
 * xw). A long chunk gets one slice and the widest column groups (x made once). A short chunk's
 * common case runs k_lora_input_short, the same steps with fewer waits (below); the first form
 * stays for the rest.
 * Before out / o the mixer has written x into xw itself (CU_LORA_IN_PLACE): only u is made. On a
 * hit's chunks that launch is folded into the gate | up norm's (k_lora_fold, below: the out GEMM adds
 * y W^T alone and the norm's launch adds s B_o (A_o y) into h before normalising it).
 * A tile whose tokens run several slots (rows of different routes meeting inside 16 tokens, which
 * the backend's bucketed rows never do) runs 1 - 3 once per slot, the rows of other slots dropped
 * from u. Slot 0 (the trunk, padding) gets zeros in every slot's columns.
 * The exact path (fp32 x, A and xw) makes x the same way in fp32 and computes u with fp32 FMAs, a
 * thread per (token, rank column), summing over `in` in order; no clusters.
 *
 * The router's sum follows squad_router_norm_add: squares summed in double, the normalisation in
 * fp32 with round-to-nearest intrinsics (the library is built with --use_fast_math, which would
 * otherwise approximate them), the normalised values summed in double.
 */
#include "k_lora.cuh"

#include <cooperative_groups.h>
#include <stdlib.h>

namespace cg = cooperative_groups;

#define LX_TM 16        /* tokens per block: the mma's M */
#define LX_THREADS 256
#define LX_WARPS (LX_THREADS / 32)
#define LX_KC 512       /* k per chunk of x in shared memory (bf16 path) */
#define LX_KS (LX_KC / 16 / LX_WARPS) /* k-steps of 16 a warp runs per chunk */
#define LX_XLD (LX_KC + 8) /* the chunk's row stride: fragment loads conflict-free, rows 16-byte aligned */
#define LX_CW_MAX 64    /* rank columns of a block (8 n8 tiles): the accumulators' registers */
#define LX_SLICES_MAX 8 /* slices of `in` a tile's blocks split (a cluster: the portable cluster size) */
#define LX_MIN_SLICE 128 /* the narrowest slice: a k-step for each of the 8 warps */
#define LX_REG_UNITS 2  /* the norm keeps a slice's h and w in registers up to this many units a thread */
#define LX_KC_F32 256   /* k per chunk on the exact path */
#define LX_CW_F32 16    /* rank columns of a block on the exact path (LX_THREADS / LX_TM) */
static_assert(LX_KS * 16 * LX_WARPS == LX_KC, "a chunk splits evenly over the warps");
static_assert(LX_TM * LX_CW_F32 == LX_THREADS, "the exact path: a thread per (token, column)");
#define ROUTER_THREADS 256

static __host__ __device__ __forceinline__ int lx_round(int n, int m) { return (n + m - 1) / m * m; }

int cu_lora_lda(int in) { return lx_round(in, 16); }

/* ---- shared by both paths ------------------------------------------------------------------------ */

/* The tile's token slots into ts (0 past rows or outside [1, n_slots]); returns the mask of the
 * tile's rows with a slot (every thread gets the same). */
static __device__ __forceinline__ unsigned lx_load_slots(int *ts, const int *token_slot, int t0, int rows,
                                                         int n_slots) {
    if (threadIdx.x < LX_TM) {
        const int t = t0 + (int)threadIdx.x;
        const int s = t < rows ? token_slot[t] : 0;
        ts[threadIdx.x] = s >= 1 && s <= n_slots ? s : 0;
    }
    __syncthreads();
    unsigned todo = 0;
#pragma unroll
    for (int i = 0; i < LX_TM; i++)
        if (ts[i] > 0) todo |= 1u << i;
    return todo;
}

/* The next slot of the tile (the lowest row's of todo) and the mask of its rows, taken out of todo. */
static __device__ __forceinline__ int lx_next_slot(const int *ts, unsigned *todo, unsigned *mine) {
    const int s = ts[__ffs(*todo) - 1];
    unsigned m = 0;
#pragma unroll
    for (int i = 0; i < LX_TM; i++)
        if (ts[i] == s) m |= 1u << i;
    *todo &= ~m;
    *mine = m;
    return s;
}

/* Zeros into the block's column group [c0, c1) of every slot but each row's own, and (the first
 * group) into the columns past the slots' (ldw beyond in + n_slots R). */
template <typename T>
static __device__ __forceinline__ void lx_zero_others(T *xw, int ldw, int in, int R, int n_slots, const int *ts,
                                                      int t0, int rows, int c0, int c1) {
    const int cw = c1 - c0, n = LX_TM * n_slots * cw;
    for (int idx = (int)threadIdx.x; idx < n; idx += LX_THREADS) {
        const int row = idx / (n_slots * cw), q = (idx / cw) % n_slots + 1, c = c0 + idx % cw;
        if (t0 + row < rows && q != ts[row]) cu_st(xw + (size_t)(t0 + row) * ldw + in + (size_t)(q - 1) * R + c, 0.0f);
    }
    const int end = in + n_slots * R, tail = ldw - end;
    for (int idx = (int)threadIdx.x; c0 == 0 && idx < LX_TM * tail; idx += LX_THREADS) {
        const int row = idx / tail;
        if (t0 + row < rows) cu_st(xw + (size_t)(t0 + row) * ldw + end + idx % tail, 0.0f);
    }
}

/* The norm's row scales of the tile on the exact path: a warp per two rows, rsqrtf(mean of squares
 * + eps) as the trunk's rmsnorm (k_norm.cu) computes it. */
static __device__ __forceinline__ void lx_row_scales(float *rinv, const float *h, int in, float eps, int t0, int rows) {
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    for (int row = warp; row < LX_TM; row += LX_WARPS) {
        const int t = t0 + row;
        float ss = 0.0f;
        if (t < rows)
            for (int i = lane; i < in; i += 32) ss += h[(size_t)t * in + i] * h[(size_t)t * in + i];
        ss = cu_warp_sum(ss);
        if (lane == 0) rinv[row] = rsqrtf(ss / (float)in + eps);
    }
}

/* ---- the tensor-core path: bf16 x, A and xw ---------------------------------------------------------- */

/* silu(g) * u of eight bf16 pairs, packed as bf16: k_norm.cu's silu_mul, value for value. */
static __device__ __forceinline__ uint4 lx_silu8(uint4 g, uint4 u) {
    const uint32_t gv[4] = {g.x, g.y, g.z, g.w}, uv[4] = {u.x, u.y, u.z, u.w};
    uint32_t ov[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const __nv_bfloat162 g2 = *reinterpret_cast<const __nv_bfloat162 *>(&gv[j]);
        const __nv_bfloat162 u2 = *reinterpret_cast<const __nv_bfloat162 *>(&uv[j]);
        const float lo = cu_silu(__low2float(g2)) * __low2float(u2);
        const float hi = cu_silu(__high2float(g2)) * __high2float(u2);
        ov[j] = cu_pack_bf16(lo, hi);
    }
    return make_uint4(ov[0], ov[1], ov[2], ov[3]);
}

/* Row t of a copied x: the copy's source, or xw itself when the mixer wrote x there (IN_PLACE). */
static __device__ __forceinline__ const bf16 *lx_copy_src(const cu_lora_input_args &a, int t) {
    return a.src == CU_LORA_IN_PLACE ? static_cast<const bf16 *>(a.xw) + (size_t)t * a.ldw
                                     : static_cast<const bf16 *>(a.x_src) + (size_t)t * a.ld_src;
}

/* Eight x values of row t from k (k + 8 <= in), as the producer makes them, packed as bf16. */
static __device__ __forceinline__ uint4 lx_make8(const cu_lora_input_args &a, int t, int k, float r) {
    uint4 o;
    if (a.src == CU_LORA_NORM) {
        const float *hr = a.h + (size_t)t * a.in + k;
        const float4 h0 = *reinterpret_cast<const float4 *>(hr), h1 = *reinterpret_cast<const float4 *>(hr + 4);
        const float4 w0 = *reinterpret_cast<const float4 *>(a.w + k);
        const float4 w1 = *reinterpret_cast<const float4 *>(a.w + k + 4);
        o.x = cu_pack_bf16(h0.x * r * (1.f + w0.x), h0.y * r * (1.f + w0.y));
        o.y = cu_pack_bf16(h0.z * r * (1.f + w0.z), h0.w * r * (1.f + w0.w));
        o.z = cu_pack_bf16(h1.x * r * (1.f + w1.x), h1.y * r * (1.f + w1.y));
        o.w = cu_pack_bf16(h1.z * r * (1.f + w1.z), h1.w * r * (1.f + w1.w));
    } else if (a.src == CU_LORA_SILU) {
        const bf16 *gr = static_cast<const bf16 *>(a.x_src) + (size_t)t * 2 * a.in + k;
        o = lx_silu8(*reinterpret_cast<const uint4 *>(gr), *reinterpret_cast<const uint4 *>(gr + a.in));
    } else {
        o = *reinterpret_cast<const uint4 *>(lx_copy_src(a, t) + k);
    }
    return o;
}

/* Programmatic dependent launch (the backend launches these kernels with the attribute): the grid
 * before this one in the stream complete, its memory visible (at once without the attribute).
 * Nothing it writes may be read, and nothing it reads (the previous GEMM's input is xw) written,
 * before this. */
static __device__ __forceinline__ void lx_grid_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
/* Lets the next grid (the GEMM reading xw, which waits for this grid before reading it) start
 * launching now: its weights' loads overlap this grid. */
static __device__ __forceinline__ void lx_launch_next() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/* The most slices a cluster of blocks of NT n8 tiles takes: the first block's shared memory
 * receives every slice's u partials ([slices][LX_TM][8 NT] floats). Wide column groups only come
 * with long chunks (lx_block_cols), whose tiles fill the GPU without slicing. */
static __host__ __device__ constexpr int lx_max_slices(int nt) { return nt == 2 ? LX_SLICES_MAX : nt == 4 ? 2 : 1; }

/* Blocks an SM holds (the registers' bound): two of the narrow column groups a hit's short chunk
 * gets, so its clusters of 8 fill the GPU once over; one of the wider (their accumulators). */
static __host__ __device__ constexpr int lx_blocks_per_sm(int nt) { return nt == 2 ? 2 : 1; }

/* This warp's A fragments of the chunk from k0 (k-steps j LX_WARPS + warp, below ke) for the block's
 * columns [c0, c1); zeros where off. */
template <int NT>
static __device__ __forceinline__ void lx_load_a(uint32_t (&bfr)[LX_KS][NT][2], const bf16 *As, int lda, int k0,
                                                 int ke, int c0, int c1, bool on) {
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
#pragma unroll
    for (int j = 0; j < LX_KS; j++) {
        const int kg = k0 + (j * LX_WARPS + warp) * 16 + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int n = c0 + nt * 8 + gq;
            bfr[j][nt][0] = bfr[j][nt][1] = 0;
            if (on && n < c1 && kg < ke) {
                const bf16 *p = As + (size_t)n * lda + kg;
                bfr[j][nt][0] = *reinterpret_cast<const uint32_t *>(p);
                bfr[j][nt][1] = *reinterpret_cast<const uint32_t *>(p + 8);
            }
        }
    }
}

/* acc += the staged x tile's k-steps of this warp (xs [LX_TM][LX_XLD], the chunk from k0, below ke)
 * times its A fragments bfr, on the tensor cores. */
template <int NT>
static __device__ __forceinline__ void lx_mma_chunk(float (&acc)[NT][4], const bf16 *xs,
                                                    const uint32_t (&bfr)[LX_KS][NT][2], int k0, int ke) {
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
#pragma unroll
    for (int j = 0; j < LX_KS; j++) {
        const int kl = (j * LX_WARPS + warp) * 16 + 2 * tq;
        if (k0 + kl >= ke) break;
        uint32_t af[4];
        af[0] = *reinterpret_cast<const uint32_t *>(&xs[gq * LX_XLD + kl]);
        af[1] = *reinterpret_cast<const uint32_t *>(&xs[(gq + 8) * LX_XLD + kl]);
        af[2] = *reinterpret_cast<const uint32_t *>(&xs[gq * LX_XLD + kl + 8]);
        af[3] = *reinterpret_cast<const uint32_t *>(&xs[(gq + 8) * LX_XLD + kl + 8]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) cu_mma16816(acc[nt], af, bfr[j][nt][0], bfr[j][nt][1]);
    }
}

/* The partials' row stride in red (floats): the block's 8 NT columns, padded against bank conflicts. */
template <int NT>
static __host__ __device__ constexpr int lx_red_ld() { return 8 * NT + 4; }

/* This warp's partials acc into red [LX_WARPS][LX_TM][lx_red_ld]. */
template <int NT>
static __device__ __forceinline__ void lx_store_partials(float *red, const float (&acc)[NT][4]) {
    constexpr int RLD = lx_red_ld<NT>();
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    float *pw = red + (size_t)warp * LX_TM * RLD;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        *reinterpret_cast<float2 *>(&pw[gq * RLD + nt * 8 + 2 * tq]) = make_float2(acc[nt][0], acc[nt][1]);
        *reinterpret_cast<float2 *>(&pw[(gq + 8) * RLD + nt * 8 + 2 * tq]) = make_float2(acc[nt][2], acc[nt][3]);
    }
}

/* The block's slice of u: red's partials summed in warp order (a fixed order: deterministic), to
 * up0's rows of slice z (up0 [slices][LX_TM][8 NT], in this block's or another's shared memory). */
template <int NT>
static __device__ __forceinline__ void lx_sum_partials(const float *red, float *up0, int z) {
    constexpr int CW = 8 * NT, RLD = lx_red_ld<NT>();
    for (int idx = (int)threadIdx.x; idx < LX_TM * CW; idx += LX_THREADS) {
        const int row = idx / CW, c = idx % CW;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < LX_WARPS; w++) sum += red[(w * LX_TM + row) * RLD + c];
        up0[((size_t)z * LX_TM + row) * CW + c] = sum;
    }
}

/* A cluster barrier split in two: every block arrives at its start and waits before its first
 * access to another block's shared memory, which must not come before that block has started. */
static __device__ __forceinline__ void lx_cluster_arrive() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void lx_cluster_wait() {
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

/* Threads < LX_TM: this slice's sums of squares ssp into every block of the cluster (slot z). */
static __device__ __forceinline__ void lx_push_ss(float (&sspart)[LX_SLICES_MAX][LX_TM], float ssp, int ks, int z,
                                                  cg::cluster_group &cluster) {
    if (threadIdx.x >= LX_TM) return;
    if (ks == 1) {
        sspart[0][threadIdx.x] = ssp;
        return;
    }
#pragma unroll
    for (int q = 0; q < LX_SLICES_MAX; q++)
        if (q < ks) *cluster.map_shared_rank(&sspart[z][threadIdx.x], q) = ssp;
}

/* Threads < LX_TM: the rows' scales from the slices' sums of squares, added in slice order. */
static __device__ __forceinline__ void lx_row_scale(float *rinv, const float (&sspart)[LX_SLICES_MAX][LX_TM], int ks,
                                                    int in, float eps) {
    if (threadIdx.x >= LX_TM) return;
    float ss = 0.0f;
    for (int q = 0; q < ks; q++) ss += sspart[q][threadIdx.x];
    rinv[threadIdx.x] = rsqrtf(ss / (float)in + eps);
}

/* The barrier of a tile's blocks: the cluster's, or the block's when the tile is one slice. */
static __device__ __forceinline__ void lx_tile_sync(cg::cluster_group &cluster, int ks) {
    if (ks > 1)
        cluster.sync();
    else
        __syncthreads();
}

/* The norm's row scales in every block of the tile: this slice's sums of squares ssp (threads <
 * LX_TM) pushed into every block once the cluster has started (joined), a barrier, the slices' sums
 * added in slice order (the same scale everywhere), a block barrier. */
static __device__ __forceinline__ void lx_share_row_scale(float *rinv, float (&sspart)[LX_SLICES_MAX][LX_TM], float ssp,
                                                          int ks, int z, int in, float eps, bool &joined,
                                                          cg::cluster_group &cluster) {
    if (!joined) {
        lx_cluster_wait();
        joined = true;
    }
    lx_push_ss(sspart, ssp, ks, z, cluster);
    lx_tile_sync(cluster, ks);
    lx_row_scale(rinv, sspart, ks, in, eps);
    __syncthreads();
}

/* The first block of a tile (after the barrier that brings every slice's part of u): slot s's u of
 * the tile's rows in `mine`, each column the slices' parts added in slice order, bf16 into xw's
 * columns [c0, c1) of slot s. */
template <int NS, int CW>
static __device__ __forceinline__ void lx_store_u(bf16 *xw, int ldw, int in, int R, const float (&upart)[NS][LX_TM][CW],
                                                  int ks, int s, unsigned mine, int t0, int rows, int c0, int c1) {
    for (int idx = (int)threadIdx.x; idx < LX_TM * CW; idx += LX_THREADS) {
        const int row = idx / CW, c = idx % CW, t = t0 + row;
        if (!((mine >> row) & 1u) || t >= rows || c0 + c >= c1) continue;
        float sum = 0.0f;
        for (int q = 0; q < ks; q++) sum += upart[q][row][c];
        xw[(size_t)t * ldw + in + (size_t)(s - 1) * R + c0 + c] = __float2bfloat16(sum);
    }
}

template <int NT>
__global__ void __launch_bounds__(LX_THREADS, lx_blocks_per_sm(NT))
    k_lora_input_mma(cu_lora_input_args a, const int *token_slot, int rows, int slice) {
    constexpr int CW = 8 * NT, RLD = lx_red_ld<NT>();
    constexpr int XS_BYTES = LX_TM * LX_XLD * 2, RED_BYTES = LX_WARPS * LX_TM * RLD * 4;
    __shared__ __align__(16) unsigned char smem[XS_BYTES > RED_BYTES ? XS_BYTES : RED_BYTES];
    __shared__ float upart[lx_max_slices(NT)][LX_TM][CW]; /* the first block: each slice's u, pushed */
    __shared__ float sspart[LX_SLICES_MAX][LX_TM];         /* the norm: each slice's sums of squares, pushed */
    __shared__ float sq[LX_TM * LX_REG_UNITS * LX_THREADS / LX_TM]; /* the norm: a unit's sum of squares */
    __shared__ int ts[LX_TM];
    __shared__ float rinv[LX_TM];
    bf16 *xs = reinterpret_cast<bf16 *>(smem);   /* the chunk of x [LX_TM][LX_XLD] */
    float *red = reinterpret_cast<float *>(smem); /* after the last chunk: [LX_WARPS][LX_TM][RLD] */
    cg::cluster_group cluster = cg::this_cluster();
    const int ks = (int)gridDim.z, z = (int)blockIdx.z; /* the cluster: the tile's slices of `in` */
    bf16 *xw = static_cast<bf16 *>(a.xw);
    const bf16 *A = static_cast<const bf16 *>(a.A);
    const int ldw = a.ldw, t0 = (int)blockIdx.x * LX_TM;
    const int c0 = (int)blockIdx.y * CW, c1 = min(c0 + CW, a.R);
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    const int in16 = lx_round(a.in, 16), kb = z * slice, ke = min(kb + slice, in16);
    lx_launch_next();
    bool joined = ks == 1; /* every block of the cluster has started (lx_cluster_arrive) */
    if (!joined) lx_cluster_arrive();
    /* before the wait, what the previous grid does not write: the slots (the host's copy before
     * the graph) and the first chunk's A fragments of the tile's first slot (an upload) */
    unsigned todo = lx_load_slots(ts, token_slot, t0, rows, a.n_slots);
    const bool writer = blockIdx.y == 0 && a.src != CU_LORA_IN_PLACE; /* x's writers (IN_PLACE: none) */
    const int s_first = todo ? ts[__ffs(todo) - 1] : 0;
    uint32_t bfr[LX_KS][NT][2];
    lx_load_a<NT>(bfr, A + (size_t)(s_first > 0 ? s_first - 1 : 0) * a.R * a.lda, a.lda, kb, ke, c0, c1, s_first > 0);
    lx_grid_wait();
    if (z == 0) lx_zero_others(xw, ldw, a.in, a.R, a.n_slots, ts, t0, rows, c0, c1);
    if (!todo && !writer) return; /* nothing more for the whole cluster (one tile, one column group) */
    /* units of 8 values of x, consecutive threads on consecutive k: upr a row in a chunk */
    const int upr0 = (min(LX_KC, ke - kb) + 7) / 8;
    /* the norm over a short slice keeps its h and w in registers from the sums of squares to x */
    const bool resident = a.src == CU_LORA_NORM && ke - kb <= LX_KC && LX_TM * upr0 <= LX_REG_UNITS * LX_THREADS;
    float hv[LX_REG_UNITS][8], wv[LX_REG_UNITS][8];
    if (a.src == CU_LORA_NORM) {
        float ssp = 0.0f; /* threads < LX_TM: the row's sum of squares over this slice */
        if (resident) {
#pragma unroll
            for (int i = 0; i < LX_REG_UNITS; i++) {
                const int u = (int)threadIdx.x + i * LX_THREADS, row = u / upr0, k = kb + (u % upr0) * 8;
                float sum = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) hv[i][e] = wv[i][e] = 0.0f;
                if (u < LX_TM * upr0 && t0 + row < rows && k < a.in) {
                    const float *hr = a.h + (size_t)(t0 + row) * a.in + k;
                    const float4 h0 = *reinterpret_cast<const float4 *>(hr);
                    const float4 h1 = *reinterpret_cast<const float4 *>(hr + 4);
                    const float4 w0 = *reinterpret_cast<const float4 *>(a.w + k);
                    const float4 w1 = *reinterpret_cast<const float4 *>(a.w + k + 4);
                    hv[i][0] = h0.x, hv[i][1] = h0.y, hv[i][2] = h0.z, hv[i][3] = h0.w;
                    hv[i][4] = h1.x, hv[i][5] = h1.y, hv[i][6] = h1.z, hv[i][7] = h1.w;
                    wv[i][0] = w0.x, wv[i][1] = w0.y, wv[i][2] = w0.z, wv[i][3] = w0.w;
                    wv[i][4] = w1.x, wv[i][5] = w1.y, wv[i][6] = w1.z, wv[i][7] = w1.w;
#pragma unroll
                    for (int e = 0; e < 8; e++) sum += hv[i][e] * hv[i][e];
                }
                if (u < LX_TM * upr0) sq[u] = sum;
            }
            __syncthreads();
            if (threadIdx.x < LX_TM)
                for (int j = 0; j < upr0; j++) ssp += sq[threadIdx.x * upr0 + j];
        } else {
            for (int row = warp; row < LX_TM; row += LX_WARPS) {
                const int t = t0 + row;
                float ss = 0.0f;
                if (t < rows)
                    for (int i = kb + 4 * lane; i < min(ke, a.in); i += 128) {
                        const float4 v = *reinterpret_cast<const float4 *>(a.h + (size_t)t * a.in + i);
                        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
                    }
                ss = cu_warp_sum(ss);
                if (lane == 0) sq[row] = ss;
            }
            __syncthreads();
            if (threadIdx.x < LX_TM) ssp = sq[threadIdx.x];
        }
        /* every block gets every slice's sums (pushed into its shared memory), then adds them in
         * slice order: the same scale in each block */
        lx_share_row_scale(rinv, sspart, ssp, ks, z, a.in, a.eps, joined, cluster);
    }
    bool first = true;
    for (;;) {
        int s = 0;
        unsigned mine = 0;
        if (todo) s = lx_next_slot(ts, &todo, &mine);
        if (!(first && writer) && !s) break;
        const bf16 *As = s ? A + (size_t)(s - 1) * a.R * a.lda : A;
        float acc[NT][4] = {};
        for (int k0 = kb; k0 < ke; k0 += LX_KC) {
            const bool pre = first && k0 == kb; /* the fragments loaded before the wait */
            if (!pre) lx_load_a<NT>(bfr, As, a.lda, k0, ke, c0, c1, s > 0);
            const int kn = min(LX_KC, ke - k0), upr = (kn + 7) / 8;
            if (resident && pre) {
#pragma unroll
                for (int i = 0; i < LX_REG_UNITS; i++) {
                    const int u = (int)threadIdx.x + i * LX_THREADS, row = u / upr, kk = (u % upr) * 8, k = k0 + kk;
                    if (u >= LX_TM * upr) continue;
                    const float r = rinv[row];
                    uint4 v;
                    v.x = cu_pack_bf16(hv[i][0] * r * (1.f + wv[i][0]), hv[i][1] * r * (1.f + wv[i][1]));
                    v.y = cu_pack_bf16(hv[i][2] * r * (1.f + wv[i][2]), hv[i][3] * r * (1.f + wv[i][3]));
                    v.z = cu_pack_bf16(hv[i][4] * r * (1.f + wv[i][4]), hv[i][5] * r * (1.f + wv[i][5]));
                    v.w = cu_pack_bf16(hv[i][6] * r * (1.f + wv[i][6]), hv[i][7] * r * (1.f + wv[i][7]));
                    if (t0 + row < rows && k < a.in && writer)
                        *reinterpret_cast<uint4 *>(xw + (size_t)(t0 + row) * ldw + k) = v;
                    *reinterpret_cast<uint4 *>(xs + row * LX_XLD + kk) = v;
                }
            } else {
                for (int u = (int)threadIdx.x; u < LX_TM * upr; u += LX_THREADS) {
                    const int row = u / upr, kk = (u % upr) * 8, k = k0 + kk, t = t0 + row;
                    uint4 v = make_uint4(0, 0, 0, 0);
                    if (t < rows && k < a.in) {
                        v = lx_make8(a, t, k, a.src == CU_LORA_NORM ? rinv[row] : 0.0f);
                        if (first && writer) *reinterpret_cast<uint4 *>(xw + (size_t)t * ldw + k) = v;
                    }
                    *reinterpret_cast<uint4 *>(xs + row * LX_XLD + kk) = v;
                }
            }
            __syncthreads();
            if (s) lx_mma_chunk<NT>(acc, xs, bfr, k0, ke);
            __syncthreads(); /* xs is the next chunk's */
        }
        first = false;
        if (!s) break;
        /* the warps' partials, their sum in warp order (the block's slice); the first block of the
         * cluster gets every slice's (pushed into its shared memory) and adds them in slice order */
        lx_store_partials<NT>(red, acc);
        __syncthreads();
        if (!joined) {
            lx_cluster_wait();
            joined = true;
        }
        float *up0 = ks > 1 ? cluster.map_shared_rank(&upart[0][0][0], 0) : &upart[0][0][0];
        lx_sum_partials<NT>(red, up0, z);
        lx_tile_sync(cluster, ks); /* every slice's partials are in the first block (and red is free again) */
        if (z == 0) lx_store_u(xw, ldw, a.in, a.R, upart, ks, s, mine, t0, rows, c0, c1);
        if (!todo) break;
        /* another slot of the tile: the first block has read every partial before they are pushed again */
        lx_tile_sync(cluster, ks);
    }
}

/* ---- the short chain: the bf16 path at a hit's short chunks ---------------------------------------------- */

/* The kernel above waits on a dependent step it need not: the tile's slots before loading A (a
 * round trip to memory ahead of the one that matters). This form (k_lora_input_short) takes the
 * common short case (narrow column groups, a slice of at most LX_KC, the norm's at most
 * LX_SHORT_NORM_UNITS units a thread) with
 *   - the slots and the A fragments of the first LX_PRE_SLOTS slots loaded together before the
 *     wait (the tile's slot picks its fragments after; a slot past them loads its own then), and
 *     the next launch's A brought into L2 (a.prefetch);
 *   - every load of the producer's inputs issued before any is used;
 *   - the warps' partials in their own shared memory (no barrier to reuse x's).
 * The norm takes r first (the slices' sums of squares over the cluster, a barrier), then x and its
 * products: the other form's arithmetic, so the same bits for the same slices (the tests compare
 * them). (Applying r to the products' sum instead saves that barrier, but its u differs where bf16
 * rounds, past the cached-against-uncached bounds on the test model, and it measured no faster:
 * docs/specialists.md.) The sums keep a fixed order (warps, then slices): deterministic. */
#define LX_PRE_SLOTS 2        /* slots whose A fragments are loaded before the tokens' slots are known */
#define LX_SHORT_UNITS 4      /* units of 8 x values a thread takes: a slice of up to LX_KC */
#define LX_SHORT_NORM_UNITS 2 /* the norm holds its units' h until r is known: a slice of up to 256 */
static_assert(LX_SHORT_UNITS * LX_THREADS == LX_TM * LX_KC / 8, "a slice of LX_KC in one pass");

/* The grid's threads bring [p, p + bytes) into L2 between them, a 128-byte line each at a time. */
static __device__ __forceinline__ void lx_prefetch_l2(const void *p, size_t bytes) {
    const size_t nthreads = (size_t)gridDim.x * gridDim.y * gridDim.z * LX_THREADS;
    const size_t block = ((size_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    const size_t me = block * LX_THREADS + threadIdx.x;
    for (size_t off = me * 128; off < bytes; off += nthreads * 128)
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(static_cast<const char *>(p) + off));
}

/* The norm's x = bf16(h r (1 + w)) of this thread's units (h in registers, w read again): into xw
 * (writers) and into xs. */
static __device__ __forceinline__ void lx_short_norm_x(bf16 *xw, int ldw, bf16 *xs,
                                                       const float (&hv)[LX_SHORT_NORM_UNITS][8], const float *w,
                                                       const float *rinv, int in, int upr, int units, int t0, int kb,
                                                       int rows, bool writer) {
#pragma unroll
    for (int i = 0; i < LX_SHORT_NORM_UNITS; i++) {
        const int u = (int)threadIdx.x + i * LX_THREADS, row = u / upr, kk = (u % upr) * 8, k = kb + kk;
        if (u >= units) continue;
        uint4 v = make_uint4(0, 0, 0, 0);
        const bool real = t0 + row < rows && k < in;
        if (real) {
            const float r = rinv[row];
            const float4 w0 = *reinterpret_cast<const float4 *>(w + k), w1 = *reinterpret_cast<const float4 *>(w + k + 4);
            v.x = cu_pack_bf16(hv[i][0] * r * (1.f + w0.x), hv[i][1] * r * (1.f + w0.y));
            v.y = cu_pack_bf16(hv[i][2] * r * (1.f + w0.z), hv[i][3] * r * (1.f + w0.w));
            v.z = cu_pack_bf16(hv[i][4] * r * (1.f + w1.x), hv[i][5] * r * (1.f + w1.y));
            v.w = cu_pack_bf16(hv[i][6] * r * (1.f + w1.z), hv[i][7] * r * (1.f + w1.w));
            if (writer) *reinterpret_cast<uint4 *>(xw + (size_t)(t0 + row) * ldw + k) = v;
        }
        *reinterpret_cast<uint4 *>(xs + row * LX_XLD + kk) = v;
    }
}

template <int NT>
__global__ void __launch_bounds__(LX_THREADS, lx_blocks_per_sm(NT))
    k_lora_input_short(cu_lora_input_args a, const int *token_slot, int rows, int slice) {
    constexpr int CW = 8 * NT, RLD = lx_red_ld<NT>();
    __shared__ __align__(16) bf16 xs[LX_TM * LX_XLD];        /* the slice of x (the norm: of h (1 + w)) */
    __shared__ __align__(16) float red[LX_WARPS * LX_TM * RLD]; /* the warps' partials */
    __shared__ float upart[lx_max_slices(NT)][LX_TM][CW];      /* the first block: each slice's u, pushed */
    __shared__ float sspart[LX_SLICES_MAX][LX_TM];             /* the norm: each slice's sums of squares, pushed */
    __shared__ float sq[LX_SHORT_NORM_UNITS * LX_THREADS];      /* the norm: a unit's sum of squares */
    __shared__ int ts[LX_TM];
    __shared__ float rinv[LX_TM];
    cg::cluster_group cluster = cg::this_cluster();
    const int ks = (int)gridDim.z, z = (int)blockIdx.z; /* the cluster: the tile's slices of `in` */
    bf16 *xw = static_cast<bf16 *>(a.xw);
    const bf16 *A = static_cast<const bf16 *>(a.A);
    const int ldw = a.ldw, t0 = (int)blockIdx.x * LX_TM, tid = (int)threadIdx.x;
    const int c0 = (int)blockIdx.y * CW, c1 = min(c0 + CW, a.R);
    const int in16 = lx_round(a.in, 16), kb = z * slice, ke = min(kb + slice, in16);
    const bool norm = a.src == CU_LORA_NORM;
    const bool writer = blockIdx.y == 0 && a.src != CU_LORA_IN_PLACE; /* x's writers */
    lx_launch_next();
    if (ks > 1) lx_cluster_arrive();
    /* 1. before the wait, what the previous grid does not write, all at once: the tile's slots and
     * the A fragments of the first slots */
    int my_slot = 0;
    if (tid < LX_TM) {
        const int t = t0 + tid, sl = t < rows ? token_slot[t] : 0;
        my_slot = sl >= 1 && sl <= a.n_slots ? sl : 0;
    }
    uint32_t bpre[LX_PRE_SLOTS][LX_KS][NT][2];
#pragma unroll
    for (int q = 0; q < LX_PRE_SLOTS; q++)
        lx_load_a<NT>(bpre[q], A + (size_t)q * a.R * a.lda, a.lda, kb, ke, c0, c1, q < a.n_slots);
    if (a.prefetch) lx_prefetch_l2(a.prefetch, a.prefetch_bytes);
    if (a.prefetch2) lx_prefetch_l2(a.prefetch2, a.prefetch2_bytes);
    lx_grid_wait();
    /* 2. the slice of x: every load issued first; units of 8 values, consecutive threads on
     * consecutive k, upr a row */
    const int upr = (ke - kb) / 8, units = LX_TM * upr;
    float hv[LX_SHORT_NORM_UNITS][8]; /* h until r is known (x is made after it, w read then) */
    if (norm) {
#pragma unroll
        for (int i = 0; i < LX_SHORT_NORM_UNITS; i++) {
            const int u = tid + i * LX_THREADS, row = u / upr, k = kb + (u % upr) * 8;
#pragma unroll
            for (int e = 0; e < 8; e++) hv[i][e] = 0.0f;
            if (u < units && t0 + row < rows && k < a.in) {
                const float *hr = a.h + (size_t)(t0 + row) * a.in + k;
                const float4 h0 = *reinterpret_cast<const float4 *>(hr), h1 = *reinterpret_cast<const float4 *>(hr + 4);
                hv[i][0] = h0.x, hv[i][1] = h0.y, hv[i][2] = h0.z, hv[i][3] = h0.w;
                hv[i][4] = h1.x, hv[i][5] = h1.y, hv[i][6] = h1.z, hv[i][7] = h1.w;
            }
        }
#pragma unroll
        for (int i = 0; i < LX_SHORT_NORM_UNITS; i++) {
            const int u = tid + i * LX_THREADS;
            if (u >= units) continue;
            float ss = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) ss += hv[i][e] * hv[i][e];
            sq[u] = ss; /* xs waits for r */
        }
    } else {
        uint4 g[LX_SHORT_UNITS], v[LX_SHORT_UNITS];
#pragma unroll
        for (int i = 0; i < LX_SHORT_UNITS; i++) {
            const int u = tid + i * LX_THREADS, row = u / upr, k = kb + (u % upr) * 8, t = t0 + row;
            g[i] = v[i] = make_uint4(0, 0, 0, 0);
            if (u < units && t < rows && k < a.in) {
                if (a.src == CU_LORA_SILU) {
                    const bf16 *gr = static_cast<const bf16 *>(a.x_src) + (size_t)t * 2 * a.in + k;
                    g[i] = *reinterpret_cast<const uint4 *>(gr);
                    v[i] = *reinterpret_cast<const uint4 *>(gr + a.in);
                } else {
                    g[i] = *reinterpret_cast<const uint4 *>(lx_copy_src(a, t) + k);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < LX_SHORT_UNITS; i++) {
            const int u = tid + i * LX_THREADS, row = u / upr, kk = (u % upr) * 8, k = kb + kk, t = t0 + row;
            if (u >= units) continue;
            const bool real = t < rows && k < a.in;
            const uint4 x = a.src == CU_LORA_SILU && real ? lx_silu8(g[i], v[i]) : g[i];
            if (writer && real) *reinterpret_cast<uint4 *>(xw + (size_t)t * ldw + k) = x;
            *reinterpret_cast<uint4 *>(xs + row * LX_XLD + kk) = x;
        }
    }
    if (tid < LX_TM) ts[tid] = my_slot;
    __syncthreads();
    unsigned todo = 0;
#pragma unroll
    for (int i = 0; i < LX_TM; i++)
        if (ts[i] > 0) todo |= 1u << i;
    if (z == 0) lx_zero_others(xw, ldw, a.in, a.R, a.n_slots, ts, t0, rows, c0, c1);
    if (!todo && !writer) return; /* nothing more for the whole cluster (one tile, one column group) */
    float ssp = 0.0f; /* threads < LX_TM, the norm: the row's sum of squares over this slice */
    if (norm && tid < LX_TM)
        for (int j = 0; j < upr; j++) ssp += sq[tid * upr + j];
    float *up0 = ks > 1 ? cluster.map_shared_rank(&upart[0][0][0], 0) : &upart[0][0][0];
    bool joined = ks == 1; /* every block of the cluster has started (lx_cluster_arrive) */
    if (norm) { /* r first: the slices' sums of squares into every block, a barrier, x */
        lx_share_row_scale(rinv, sspart, ssp, ks, z, a.in, a.eps, joined, cluster);
        lx_short_norm_x(xw, ldw, xs, hv, a.w, rinv, a.in, upr, units, t0, kb, rows, writer);
        __syncthreads();
    }
    bool first = true;
    for (;;) {
        int s = 0;
        unsigned mine = 0;
        if (todo) s = lx_next_slot(ts, &todo, &mine);
        if (!s) break;
        /* 3. the products of the slot's A rows and the slice, the k-steps spread over the warps */
        if (s) {
            uint32_t bfr[LX_KS][NT][2];
            if (first && s <= LX_PRE_SLOTS) {
#pragma unroll
                for (int j = 0; j < LX_KS; j++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            uint32_t f = bpre[0][j][nt][e];
#pragma unroll
                            for (int q = 1; q < LX_PRE_SLOTS; q++)
                                if (s == q + 1) f = bpre[q][j][nt][e];
                            bfr[j][nt][e] = f;
                        }
            } else {
                lx_load_a<NT>(bfr, A + (size_t)(s - 1) * a.R * a.lda, a.lda, kb, ke, c0, c1, true);
            }
            float acc[NT][4] = {};
            lx_mma_chunk<NT>(acc, xs, bfr, kb, ke);
            lx_store_partials<NT>(red, acc);
        }
        __syncthreads();
        if (!joined) { /* every block has started: its shared memory may be written */
            lx_cluster_wait();
            joined = true;
        }
        /* 4. the block's sum in warp order into the first block's shared memory; one barrier */
        lx_sum_partials<NT>(red, up0, z);
        lx_tile_sync(cluster, ks);
        first = false;
        if (z == 0) lx_store_u(xw, ldw, a.in, a.R, upart, ks, s, mine, t0, rows, c0, c1);
        if (!todo) break;
        /* another slot of the tile: the first block has read every partial before they are pushed again */
        lx_tile_sync(cluster, ks);
    }
}

/* ---- the folded out / o term: the post-mixer norm's launch takes out's low-rank term -------------------- */

/* Before gate | up the residual stream is h + y W_o^T + s B_o (A_o y) (y: the mixer's output). The
 * widened out GEMM adds both terms, which needs u_o = A_o y made by a launch of its own between the
 * mixer and that GEMM. k_lora_fold instead lets the out GEMM add y W_o^T alone (its widened input's
 * u columns stay zero) and takes the low-rank term into the launch that follows it, the gate | up
 * norm's, which reads h anyway. A block owns a tile of LX_TM tokens and a slice of h (all of the
 * site's rank columns: one column group, so the cluster is every block that reads the tile's h) and
 * the same-numbered slice of y:
 *   1. u_o's products over its slice of y on the tensor cores, pushed into every block of the
 *      cluster, which add them in slice order and round them to bf16 (the widened GEMM's operand);
 *   2. d = B_o u_o over its slice of h (an m16n8k16 product whose output fragments are h's
 *      registers), h' = h + d written back (the cluster's blocks have all read h by then: step 1's
 *      barrier), the slice's sums of squares of h' pushed into every block;
 *   3. x = bf16(h' r (1 + w)) into xw and into shared memory, then u = A x as the short chain makes
 *      it, the slices' sums added in slice order by the first block.
 * Three cluster barriers in one launch where the other form has one launch (u_o) with one and a
 * second with two. The sums keep fixed orders (k groups, then slices): deterministic. The h' the
 * norm sees and the residual stream gets is (h + y W_o^T) + B_o u_o in fp32 where the widened GEMM
 * summed both products in one accumulator: the same terms, another order of the fp32 sums. */
#define LF_MAX_R 32         /* the gate | up site's rank columns the fold takes: 4 n8 tiles */
#define LF_MAX_RO 16        /* out's rank columns: 2 n8 tiles, one k-step of d's product */
#define LF_MAX_SLICE 256    /* the widest slice of h: its n8 tiles over the 8 warps, LF_HT each */
#define LF_MAX_YSLICE LX_KC /* the widest slice of y (xs holds it) */
#define LF_HT (LF_MAX_SLICE / 8 / LX_WARPS)  /* h's n8 tiles a warp holds */
#define LF_OKG 4                             /* u_o's k groups (warps w / 2; w % 2 picks the n8 tile) */
#define LF_OKS (LF_MAX_YSLICE / 16 / LF_OKG) /* k-steps a warp of u_o's product runs */
#define LF_GKG 2                             /* u's k groups (warps w / 4; w % 4 picks the n8 tile) */
#define LF_GKS (LF_MAX_SLICE / 16 / LF_GKG)  /* k-steps a warp of u's product runs */
#define LF_ORLD (LF_MAX_RO + 4)              /* the partials' row strides (padded against bank conflicts) */
#define LF_GRLD (LF_MAX_R + 4)
#define LF_RED (LF_OKG * LX_TM * LF_ORLD > LF_GKG * LX_TM * LF_GRLD ? LF_OKG * LX_TM * LF_ORLD : LF_GKG * LX_TM * LF_GRLD)
static_assert(LF_OKG * (LF_MAX_RO / 8) == LX_WARPS && LF_GKG * (LF_MAX_R / 8) == LX_WARPS, "a warp per (k group, tile)");

/* This warp's B fragments of a k-ordered operand M [n][ld] for n8 tile n0 / 8, k-steps j0 + g i
 * (i < KS) of the range [kb, ke): zeros where off, past ke or past column n1. */
template <int KS>
static __device__ __forceinline__ void lf_load_frags(uint32_t (&b)[KS][2], const bf16 *M, int ld, int n0, int n1, int kb,
                                                     int ke, int j0, int g, bool on) {
    const int lane = (int)threadIdx.x % 32, gq = lane / 4, tq = lane % 4, n = n0 + gq;
#pragma unroll
    for (int i = 0; i < KS; i++) {
        const int k = kb + (j0 + g * i) * 16 + 2 * tq;
        b[i][0] = b[i][1] = 0;
        if (on && n < n1 && k < ke) {
            const bf16 *p = M + (size_t)n * ld + k;
            b[i][0] = *reinterpret_cast<const uint32_t *>(p);
            b[i][1] = *reinterpret_cast<const uint32_t *>(p + 8);
        }
    }
}

/* acc += xs's k-steps j0 + g i (below kn, local to the slice) times b, on the tensor cores. */
template <int KS>
static __device__ __forceinline__ void lf_mma(float (&acc)[4], const bf16 *xs, const uint32_t (&b)[KS][2], int kn,
                                              int j0, int g) {
    const int lane = (int)threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
#pragma unroll
    for (int i = 0; i < KS; i++) {
        const int kl = (j0 + g * i) * 16 + 2 * tq;
        if ((j0 + g * i) * 16 >= kn) break;
        uint32_t af[4];
        af[0] = *reinterpret_cast<const uint32_t *>(&xs[gq * LX_XLD + kl]);
        af[1] = *reinterpret_cast<const uint32_t *>(&xs[(gq + 8) * LX_XLD + kl]);
        af[2] = *reinterpret_cast<const uint32_t *>(&xs[gq * LX_XLD + kl + 8]);
        af[3] = *reinterpret_cast<const uint32_t *>(&xs[(gq + 8) * LX_XLD + kl + 8]);
        cu_mma16816(acc, af, b[i][0], b[i][1]);
    }
}

/* This warp's accumulators (k group kg, n8 tile nt) into red [k groups][LX_TM][ld]. */
static __device__ __forceinline__ void lf_store_acc(float *red, int ld, int kg, int nt, const float (&acc)[4]) {
    const int lane = (int)threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    float *p = red + (size_t)kg * LX_TM * ld + nt * 8 + 2 * tq;
    *reinterpret_cast<float2 *>(p + gq * ld) = make_float2(acc[0], acc[1]);
    *reinterpret_cast<float2 *>(p + (gq + 8) * ld) = make_float2(acc[2], acc[3]);
}

/* The short chain's slot selection: fragment f of the preloaded slots' (slot s <= LX_PRE_SLOTS). */
template <int KS>
static __device__ __forceinline__ void lf_pick(uint32_t (&b)[KS][2], const uint32_t (&pre)[LX_PRE_SLOTS][KS][2], int s) {
#pragma unroll
    for (int i = 0; i < KS; i++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            uint32_t f = pre[0][i][e];
#pragma unroll
            for (int q = 1; q < LX_PRE_SLOTS; q++)
                if (s == q + 1) f = pre[q][i][e];
            b[i][e] = f;
        }
}

__global__ void __launch_bounds__(LX_THREADS, 1) /* one block an SM: cu_lora_fold_slices sizes the grid so */
    k_lora_fold(cu_lora_input_args a, const int *token_slot, int rows, int slice, int yslice) {
    __shared__ __align__(16) bf16 xs[LX_TM * LX_XLD];       /* the slice of y, then of x */
    __shared__ __align__(16) float red[LF_RED];             /* the warps' partials [k group][LX_TM][ld] */
    __shared__ float uopart[LX_SLICES_MAX][LX_TM][LF_MAX_RO]; /* every block: each slice's u_o, pushed */
    __shared__ float upart[LX_SLICES_MAX][LX_TM][LF_MAX_R];   /* the first block: each slice's u, pushed */
    __shared__ __align__(16) bf16 uo[LX_TM][LF_MAX_RO + 8];  /* the tile's u_o (d's A operand) */
    __shared__ float ssw[LX_WARPS][LX_TM];                  /* each warp's sums of squares of h' */
    __shared__ float sspart[LX_SLICES_MAX][LX_TM];          /* each slice's, pushed */
    __shared__ float rinv[LX_TM];
    __shared__ int ts[LX_TM];
    cg::cluster_group cluster = cg::this_cluster();
    const int ks = (int)gridDim.z, z = (int)blockIdx.z;
    bf16 *xw = static_cast<bf16 *>(a.xw);
    const bf16 *A = static_cast<const bf16 *>(a.A), *Ao = static_cast<const bf16 *>(a.fold_A);
    const bf16 *Bo = static_cast<const bf16 *>(a.fold_B), *y = static_cast<const bf16 *>(a.fold_y);
    const int tid = (int)threadIdx.x, warp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
    const int t0 = (int)blockIdx.x * LX_TM, kb = z * slice, ke = min(kb + slice, a.in);
    const int kbo = z * yslice, keo = min(kbo + yslice, a.fold_in), Ro = a.fold_R;
    lx_launch_next();
    if (ks > 1) lx_cluster_arrive();
    /* before the wait, what the previous grid does not write: the tile's slots (each warp its own
     * copy), the first slots' A_o fragments, the norm's weight */
    int sl = 0;
    if (lane < LX_TM) {
        const int t = t0 + lane, v = t < rows ? token_slot[t] : 0;
        sl = v >= 1 && v <= a.n_slots ? v : 0;
    }
    uint32_t aopre[LX_PRE_SLOTS][LF_OKS][2];
#pragma unroll
    for (int q = 0; q < LX_PRE_SLOTS; q++)
        lf_load_frags<LF_OKS>(aopre[q], Ao + (size_t)q * Ro * a.fold_lda, a.fold_lda, (warp % 2) * 8, Ro, kbo, keo,
                              warp / 2, LF_OKG, q < a.n_slots);
    float wv[LF_HT][2];
#pragma unroll
    for (int i = 0; i < LF_HT; i++) {
        const int c = kb + (warp + LX_WARPS * i) * 8 + 2 * tq;
        wv[i][0] = wv[i][1] = 0.0f;
        if (c < ke) {
            const float2 w2 = *reinterpret_cast<const float2 *>(a.w + c);
            wv[i][0] = w2.x, wv[i][1] = w2.y;
        }
    }
    if (a.prefetch) lx_prefetch_l2(a.prefetch, a.prefetch_bytes);
    if (a.prefetch2) lx_prefetch_l2(a.prefetch2, a.prefetch2_bytes);
    lx_grid_wait();
    /* every load of y's slice and h's before any is used (none waits for the slots); h in d's output
     * fragments: tile warp + 8 i of the slice, rows gq and gq + 8, columns 2 tq and 2 tq + 1 */
    const int yupr = (keo > kbo ? keo - kbo : 0) / 8, yunits = LX_TM * yupr;
    uint4 yv[LF_MAX_YSLICE / 8 * LX_TM / LX_THREADS];
#pragma unroll
    for (int i = 0; i < LF_MAX_YSLICE / 8 * LX_TM / LX_THREADS; i++) {
        const int u = tid + i * LX_THREADS, row = u / max(yupr, 1), k = kbo + (u % max(yupr, 1)) * 8;
        yv[i] = make_uint4(0, 0, 0, 0);
        if (u < yunits && t0 + row < rows)
            yv[i] = *reinterpret_cast<const uint4 *>(y + (size_t)(t0 + row) * a.fold_ldy + k);
    }
    float hv[LF_HT][4];
#pragma unroll
    for (int i = 0; i < LF_HT; i++) {
        const int c = kb + (warp + LX_WARPS * i) * 8 + 2 * tq;
        hv[i][0] = hv[i][1] = hv[i][2] = hv[i][3] = 0.0f;
        if (c < ke) {
            if (t0 + gq < rows) {
                const float2 v = *reinterpret_cast<const float2 *>(a.h + (size_t)(t0 + gq) * a.in + c);
                hv[i][0] = v.x, hv[i][1] = v.y;
            }
            if (t0 + gq + 8 < rows) {
                const float2 v = *reinterpret_cast<const float2 *>(a.h + (size_t)(t0 + gq + 8) * a.in + c);
                hv[i][2] = v.x, hv[i][3] = v.y;
            }
        }
    }
    /* then what waits for the slots: the tile's first slot's A and B_o fragments (used after the
     * first cluster barrier) */
    const unsigned todo0 = __ballot_sync(0xffffffffu, sl != 0) & ((1u << LX_TM) - 1);
    const int s1 = todo0 ? __shfl_sync(0xffffffffu, sl, __ffs(todo0) - 1) : 0; /* the tile's first slot */
    uint32_t ag[LF_GKS][2], bo[LF_HT][2];
    lf_load_frags<LF_GKS>(ag, A + (size_t)(s1 > 0 ? s1 - 1 : 0) * a.R * a.lda, a.lda, (warp % 4) * 8, a.R, kb, ke,
                          warp / 4, LF_GKG, s1 > 0);
#pragma unroll
    for (int i = 0; i < LF_HT; i++) { /* B_o (k = rank column, n = h's column): a row of the out weight */
        const int n = kb + (warp + LX_WARPS * i) * 8 + gq;
        bo[i][0] = bo[i][1] = 0;
        if (s1 > 0 && n < ke) {
            const bf16 *p = Bo + (size_t)n * a.fold_ldb + (size_t)(s1 - 1) * Ro + 2 * tq;
            bo[i][0] = *reinterpret_cast<const uint32_t *>(p);
            bo[i][1] = *reinterpret_cast<const uint32_t *>(p + 8);
        }
    }
    if (warp == 0 && lane < LX_TM) ts[lane] = sl;
#pragma unroll
    for (int i = 0; i < LF_MAX_YSLICE / 8 * LX_TM / LX_THREADS; i++) {
        const int u = tid + i * LX_THREADS;
        if (u < yunits) *reinterpret_cast<uint4 *>(xs + (u / yupr) * LX_XLD + (u % yupr) * 8) = yv[i];
    }
    __syncthreads();
    if (z == 0) lx_zero_others(xw, a.ldw, a.in, a.R, a.n_slots, ts, t0, rows, 0, a.R);
    bool joined = ks == 1; /* every block of the cluster has started (lx_cluster_arrive) */
    float dacc[LF_HT][4] = {};
    if (todo0) {
        /* 1. u_o: each slot's products over the slice; a row keeps its own slot's */
        const int orow = tid / LF_MAX_RO, oc = tid % LF_MAX_RO; /* the (row, column) this thread sums */
        float uo_mine = 0.0f;
        unsigned todo = todo0;
        while (todo) {
            unsigned mine;
            const int s = lx_next_slot(ts, &todo, &mine);
            uint32_t b[LF_OKS][2];
            if (s <= LX_PRE_SLOTS)
                lf_pick<LF_OKS>(b, aopre, s);
            else
                lf_load_frags<LF_OKS>(b, Ao + (size_t)(s - 1) * Ro * a.fold_lda, a.fold_lda, (warp % 2) * 8, Ro, kbo,
                                      keo, warp / 2, LF_OKG, true);
            float acc[4] = {};
            lf_mma<LF_OKS>(acc, xs, b, keo - kbo, warp / 2, LF_OKG);
            lf_store_acc(red, LF_ORLD, warp / 2, warp % 2, acc);
            __syncthreads();
            if ((mine >> orow) & 1u) {
                float sum = 0.0f;
#pragma unroll
                for (int g = 0; g < LF_OKG; g++) sum += red[(g * LX_TM + orow) * LF_ORLD + oc];
                uo_mine = sum;
            }
            if (todo) __syncthreads(); /* red is the next slot's */
        }
        if (!joined) {
            lx_cluster_wait();
            joined = true;
        }
        if (ks == 1) {
            uopart[0][orow][oc] = uo_mine;
        } else {
#pragma unroll
            for (int q = 0; q < LX_SLICES_MAX; q++)
                if (q < ks) *cluster.map_shared_rank(&uopart[z][orow][oc], q) = uo_mine;
        }
        lx_tile_sync(cluster, ks); /* every slice's u_o here, and every block of the tile has read its h */
        {
            float sum = 0.0f;
            for (int q = 0; q < ks; q++) sum += uopart[q][orow][oc];
            uo[orow][oc] = __float2bfloat16(sum);
        }
        __syncthreads();
        /* 2. d = B_o u_o over the slice (each slot's rows through its own B_o), h' = h + d */
        todo = todo0;
        while (todo) {
            unsigned mine;
            const int s = lx_next_slot(ts, &todo, &mine);
            uint32_t af[4];
            const bool r0 = (mine >> gq) & 1u, r1 = (mine >> (gq + 8)) & 1u;
            af[0] = r0 ? *reinterpret_cast<const uint32_t *>(&uo[gq][2 * tq]) : 0u;
            af[1] = r1 ? *reinterpret_cast<const uint32_t *>(&uo[gq + 8][2 * tq]) : 0u;
            af[2] = r0 ? *reinterpret_cast<const uint32_t *>(&uo[gq][2 * tq + 8]) : 0u;
            af[3] = r1 ? *reinterpret_cast<const uint32_t *>(&uo[gq + 8][2 * tq + 8]) : 0u;
#pragma unroll
            for (int i = 0; i < LF_HT; i++) {
                const int n = kb + (warp + LX_WARPS * i) * 8 + gq;
                if (kb + (warp + LX_WARPS * i) * 8 >= ke) break;
                uint32_t b0 = bo[i][0], b1 = bo[i][1];
                if (s != s1) {
                    const bf16 *p = Bo + (size_t)n * a.fold_ldb + (size_t)(s - 1) * Ro + 2 * tq;
                    b0 = *reinterpret_cast<const uint32_t *>(p);
                    b1 = *reinterpret_cast<const uint32_t *>(p + 8);
                }
                cu_mma16816(dacc[i], af, b0, b1);
            }
        }
#pragma unroll
        for (int i = 0; i < LF_HT; i++) {
            const int c = kb + (warp + LX_WARPS * i) * 8 + 2 * tq;
            if (c >= ke) break;
#pragma unroll
            for (int e = 0; e < 4; e++) hv[i][e] += dacc[i][e];
            /* the residual stream gets the term (every reader of this slice of h has read it) */
            if (t0 + gq < rows)
                *reinterpret_cast<float2 *>(a.h + (size_t)(t0 + gq) * a.in + c) = make_float2(hv[i][0], hv[i][1]);
            if (t0 + gq + 8 < rows)
                *reinterpret_cast<float2 *>(a.h + (size_t)(t0 + gq + 8) * a.in + c) = make_float2(hv[i][2], hv[i][3]);
        }
    }
    /* the slice's sums of squares of h' (in order: the warp's tiles, its quad, the warps), into
     * every block; the rows' scales from every slice's, in slice order */
    {
        float s0 = 0.0f, s8 = 0.0f;
#pragma unroll
        for (int i = 0; i < LF_HT; i++) {
            s0 += hv[i][0] * hv[i][0] + hv[i][1] * hv[i][1];
            s8 += hv[i][2] * hv[i][2] + hv[i][3] * hv[i][3];
        }
        s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
        s8 += __shfl_xor_sync(0xffffffffu, s8, 1);
        s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
        s8 += __shfl_xor_sync(0xffffffffu, s8, 2);
        if (tq == 0) ssw[warp][gq] = s0, ssw[warp][gq + 8] = s8;
    }
    __syncthreads();
    float ssp = 0.0f;
    if (tid < LX_TM)
        for (int w = 0; w < LX_WARPS; w++) ssp += ssw[w][tid];
    lx_share_row_scale(rinv, sspart, ssp, ks, z, a.in, a.eps, joined, cluster);
    /* 3. x = bf16(h' r (1 + w)) into xw and xs; then u = A x */
    {
        const float r0 = rinv[gq], r8 = rinv[gq + 8];
#pragma unroll
        for (int i = 0; i < LF_HT; i++) {
            const int cl = (warp + LX_WARPS * i) * 8 + 2 * tq, c = kb + cl;
            if (c >= ke) break;
            const uint32_t x0 = cu_pack_bf16(hv[i][0] * r0 * (1.f + wv[i][0]), hv[i][1] * r0 * (1.f + wv[i][1]));
            const uint32_t x8 = cu_pack_bf16(hv[i][2] * r8 * (1.f + wv[i][0]), hv[i][3] * r8 * (1.f + wv[i][1]));
            *reinterpret_cast<uint32_t *>(&xs[gq * LX_XLD + cl]) = x0;
            *reinterpret_cast<uint32_t *>(&xs[(gq + 8) * LX_XLD + cl]) = x8;
            if (t0 + gq < rows) *reinterpret_cast<uint32_t *>(xw + (size_t)(t0 + gq) * a.ldw + c) = x0;
            if (t0 + gq + 8 < rows) *reinterpret_cast<uint32_t *>(xw + (size_t)(t0 + gq + 8) * a.ldw + c) = x8;
        }
    }
    if (!todo0) return; /* no u for the tile (the first block wrote its zeros) */
    __syncthreads();
    float up_mine[LX_TM * LF_MAX_R / LX_THREADS] = {};
    unsigned todo = todo0;
    while (todo) {
        unsigned mine;
        const int s = lx_next_slot(ts, &todo, &mine);
        uint32_t b[LF_GKS][2];
        if (s == s1) {
#pragma unroll
            for (int i = 0; i < LF_GKS; i++) b[i][0] = ag[i][0], b[i][1] = ag[i][1];
        } else {
            lf_load_frags<LF_GKS>(b, A + (size_t)(s - 1) * a.R * a.lda, a.lda, (warp % 4) * 8, a.R, kb, ke, warp / 4,
                                  LF_GKG, true);
        }
        float acc[4] = {};
        lf_mma<LF_GKS>(acc, xs, b, ke - kb, warp / 4, LF_GKG);
        lf_store_acc(red, LF_GRLD, warp / 4, warp % 4, acc);
        __syncthreads();
#pragma unroll
        for (int e = 0; e < LX_TM * LF_MAX_R / LX_THREADS; e++) {
            const int idx = tid + e * LX_THREADS, row = idx / LF_MAX_R, c = idx % LF_MAX_R;
            if ((mine >> row) & 1u) up_mine[e] = red[row * LF_GRLD + c] + red[(LX_TM + row) * LF_GRLD + c];
        }
        if (todo) __syncthreads(); /* red is the next slot's */
    }
    /* the block's sums into the first block's shared memory; one barrier; the first block adds the
     * slices in order and writes u */
#pragma unroll
    for (int e = 0; e < LX_TM * LF_MAX_R / LX_THREADS; e++) {
        const int idx = tid + e * LX_THREADS, row = idx / LF_MAX_R, c = idx % LF_MAX_R;
        if (ks > 1)
            *cluster.map_shared_rank(&upart[z][row][c], 0) = up_mine[e];
        else
            upart[0][row][c] = up_mine[e];
    }
    lx_tile_sync(cluster, ks);
    if (z == 0)
        for (int idx = tid; idx < LX_TM * LF_MAX_R; idx += LX_THREADS) {
            const int row = idx / LF_MAX_R, c = idx % LF_MAX_R, t = t0 + row, s = ts[row];
            if (!s || t >= rows || c >= a.R) continue;
            float sum = 0.0f;
            for (int q = 0; q < ks; q++) sum += upart[q][row][c];
            xw[(size_t)t * a.ldw + a.in + (size_t)(s - 1) * a.R + c] = __float2bfloat16(sum);
        }
}

/* ---- the exact path: fp32 x, A and xw ------------------------------------------------------------------ */

/* x[t][k] as the producer makes it, in fp32 (the trunk's exact kernels' arithmetic). */
static __device__ __forceinline__ float lx_make1(const cu_lora_input_args &a, int t, int k, float r) {
    if (a.src == CU_LORA_NORM) return a.h[(size_t)t * a.in + k] * r * (1.f + a.w[k]);
    const float *src = static_cast<const float *>(a.x_src);
    if (a.src == CU_LORA_SILU) {
        const float g = src[(size_t)t * 2 * a.in + k], u = src[(size_t)t * 2 * a.in + a.in + k];
        return g / (1.f + expf(-g)) * u;
    }
    if (a.src == CU_LORA_IN_PLACE) return static_cast<const float *>(a.xw)[(size_t)t * a.ldw + k];
    return src[(size_t)t * a.ld_src + k];
}

__global__ void __launch_bounds__(LX_THREADS) k_lora_input_f32(cu_lora_input_args a, const int *token_slot, int rows) {
    __shared__ float xs[LX_TM][LX_KC_F32 + 1];
    __shared__ int ts[LX_TM];
    __shared__ float rinv[LX_TM];
    float *xw = static_cast<float *>(a.xw);
    const float *A = static_cast<const float *>(a.A);
    const int ldw = a.ldw, t0 = (int)blockIdx.x * LX_TM;
    const int c0 = (int)blockIdx.y * LX_CW_F32, c1 = min(c0 + LX_CW_F32, a.R);
    unsigned todo = lx_load_slots(ts, token_slot, t0, rows, a.n_slots);
    lx_zero_others(xw, ldw, a.in, a.R, a.n_slots, ts, t0, rows, c0, c1);
    const bool writer = blockIdx.y == 0 && a.src != CU_LORA_IN_PLACE;
    if (!todo && !writer) return;
    if (a.src == CU_LORA_NORM) {
        lx_row_scales(rinv, a.h, a.in, a.eps, t0, rows);
        __syncthreads();
    }
    const int my_row = (int)threadIdx.x / LX_CW_F32, my_c = c0 + (int)threadIdx.x % LX_CW_F32;
    bool first = true;
    for (;;) {
        int s = 0;
        unsigned mine = 0;
        if (todo) s = lx_next_slot(ts, &todo, &mine);
        if (!(first && writer) && !s) break;
        const float *Ar = s && my_c < c1 ? A + ((size_t)(s - 1) * a.R + my_c) * a.lda : NULL;
        float acc = 0.0f;
        for (int k0 = 0; k0 < a.in; k0 += LX_KC_F32) {
            const int kn = min(LX_KC_F32, a.in - k0);
            for (int u = (int)threadIdx.x; u < LX_TM * LX_KC_F32; u += LX_THREADS) {
                const int row = u / LX_KC_F32, kk = u % LX_KC_F32, t = t0 + row;
                float v = 0.0f;
                if (t < rows && kk < kn) {
                    v = lx_make1(a, t, k0 + kk, a.src == CU_LORA_NORM ? rinv[row] : 0.0f);
                    if (first && writer) xw[(size_t)t * ldw + k0 + kk] = v;
                }
                xs[row][kk] = v;
            }
            __syncthreads();
            if (Ar)
                for (int k = 0; k < kn; k++) acc += Ar[k0 + k] * xs[my_row][k];
            __syncthreads();
        }
        first = false;
        if (!s) break;
        const int t = t0 + my_row;
        if (Ar && ((mine >> my_row) & 1u) && t < rows) xw[(size_t)t * ldw + a.in + (size_t)(s - 1) * a.R + my_c] = acc;
        if (!todo) break;
    }
}

/* ---- host side ------------------------------------------------------------------------------------------- */

static int lx_aligned(const void *p, unsigned bytes) { return ((uintptr_t)p & (bytes - 1)) == 0; }

/* Rank columns a block takes on the tensor-core path: enough column groups for about one block an
 * SM on a short chunk, the widest group (LX_CW_MAX) on a long one. */
static int lx_block_cols(int R, int tiles, int n_sm) {
    const int want = (n_sm + tiles - 1) / tiles; /* groups wanted */
    int cw = lx_round((R + want - 1) / want, 16);
    if (cw > LX_CW_MAX) cw = LX_CW_MAX;
    return cw == 48 ? LX_CW_MAX : cw; /* 16, 32 or 64: the kernel's instances */
}

/* Slices of `in` (the blocks of a cluster) for `blocks` blocks of tiles and column groups: as many
 * as the SMs hold at once, each slice at least LX_MIN_SLICE wide. */
static int lx_slices(int in16, int blocks, int n_sm, int nt) {
    const int cap = lx_max_slices(nt);
    int ks = n_sm * lx_blocks_per_sm(nt) / blocks; /* no second wave */
    if (ks > cap) ks = cap;
    while (ks > 1 && in16 / ks < LX_MIN_SLICE) ks--;
    return ks < 1 ? 1 : ks;
}

template <int NT>
static cudaError_t lx_launch(dim3 grid, int slice, const cu_lora_input_args *a, const int *token_slot, int rows,
                             bool short_chain, cudaStream_t st) {
    cudaLaunchAttribute at[2] = {};
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = grid.z;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization; /* lx_grid_wait */
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lc = {};
    lc.gridDim = grid;
    lc.blockDim = dim3(LX_THREADS);
    lc.dynamicSmemBytes = 0;
    lc.stream = st;
    lc.attrs = at;
    lc.numAttrs = 2;
    void (*kern)(cu_lora_input_args, const int *, int, int) = k_lora_input_mma<NT>;
    if constexpr (NT == 2) /* the short chain's column groups */
        if (short_chain) kern = k_lora_input_short<NT>;
    if (cudaLaunchKernelEx(&lc, kern, *a, token_slot, rows, slice) == cudaSuccess) return cudaSuccess;
    (void)cudaGetLastError(); /* refused with the programmatic dependency: launch plainly ordered */
    lc.numAttrs = 1;
    return cudaLaunchKernelEx(&lc, kern, *a, token_slot, rows, slice);
}


/* k_lora_fold's slices: as many as keep the grid within one block an SM (a hit's few tiles, so its
 * dependent steps are short), at least as many as its slices' widths need (LF_MAX_SLICE of h,
 * LF_MAX_YSLICE of y), at most a portable cluster; the slices of h and of y both whole k-steps. */
int cu_lora_fold_slices(int in, int R, int fold_in, int fold_R, int rows, int n_sm) {
    if (in < 16 || in % 16 || fold_in < 16 || fold_in % 16 || R < 1 || R > LF_MAX_R || fold_R != LF_MAX_RO ||
        rows < 1 || n_sm < 1)
        return 0;
    const int tiles = (rows + LX_TM - 1) / LX_TM;
    int lo = (in + LF_MAX_SLICE - 1) / LF_MAX_SLICE;
    const int lo_y = (fold_in + LF_MAX_YSLICE - 1) / LF_MAX_YSLICE;
    if (lo_y > lo) lo = lo_y;
    if (lo > LX_SLICES_MAX || lo > in / 16) return 0;
    int ks = LX_SLICES_MAX > lo ? LX_SLICES_MAX : lo;
    if (ks > in / 16) ks = in / 16;
    while (ks > lo && tiles * ks > n_sm) ks--;
    /* the slices as k_lora_fold cuts them: whole k-steps, none empty */
    const int slice = lx_round((in + ks - 1) / ks, 16), nz = (in + slice - 1) / slice;
    const int yslice = lx_round((fold_in + nz - 1) / nz, 16);
    return slice <= LF_MAX_SLICE && yslice <= LF_MAX_YSLICE ? nz : 0;
}

/* k_lora_fold's launch (a->fold_y set; the caller checked the shapes and alignments). */
static int lx_launch_fold(const cu_lora_input_args *a, const int *token_slot, int rows, int n_sm, cudaStream_t st,
                          squad_err *err) {
    const int nz = cu_lora_fold_slices(a->in, a->R, a->fold_in, a->fold_R, rows, n_sm);
    if (nz < 1)
        return cu_err(err, SQUAD_E_UNSUPPORTED, "cu_lora_input: no fold for in %d, R %d, out's in %d, R %d, %d rows",
                      a->in, a->R, a->fold_in, a->fold_R, rows);
    const int slice = lx_round((a->in + nz - 1) / nz, 16), yslice = lx_round((a->fold_in + nz - 1) / nz, 16);
    cudaLaunchAttribute at[2] = {};
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = (unsigned)nz;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization; /* lx_grid_wait */
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3((unsigned)((rows + LX_TM - 1) / LX_TM), 1, (unsigned)nz);
    lc.blockDim = dim3(LX_THREADS);
    lc.stream = st;
    lc.attrs = at;
    lc.numAttrs = 2;
    cudaError_t e = cudaLaunchKernelEx(&lc, k_lora_fold, *a, token_slot, rows, slice, yslice);
    if (e != cudaSuccess) { /* refused with the programmatic dependency */
        (void)cudaGetLastError();
        lc.numAttrs = 1;
        e = cudaLaunchKernelEx(&lc, k_lora_fold, *a, token_slot, rows, slice, yslice);
    }
    if (e != cudaSuccess) return cu_fail(err, "k_lora_fold (cudaLaunchKernelEx)", e, __FILE__, __LINE__);
    CU_LAUNCH_CHECK("k_lora_fold");
    return 0;
}

int cu_lora_input(const cu_lora_input_args *a, const int *token_slot, int rows, int n_sm, cudaStream_t st,
                  squad_err *err) {
    if (!a || rows < 1 || a->in < 1 || a->R < 1 || a->n_slots < 1 || a->lda < cu_lora_lda(a->in) ||
        a->ldw < a->in + a->n_slots * a->R ||
        a->src < CU_LORA_NORM || a->src > CU_LORA_IN_PLACE || !a->A || !a->xw || !token_slot)
        return cu_err(err, SQUAD_E_INVALID, "cu_lora_input: rows %d, in %d, R %d, slots %d, lda %d", rows,
                      a ? a->in : 0, a ? a->R : 0, a ? a->n_slots : 0, a ? a->lda : 0);
    if (a->src == CU_LORA_NORM       ? !a->h || !a->w
        : a->src == CU_LORA_IN_PLACE ? 0
                                     : !a->x_src || (a->src == CU_LORA_COPY && a->ld_src < a->in))
        return cu_err(err, SQUAD_E_INVALID, "cu_lora_input: producer %d without its input", a->src);
    const int tiles = (rows + LX_TM - 1) / LX_TM;
    if (a->fold_y) { /* the out term folded in: the norm on the bf16 path only */
        const int ok = a->src == CU_LORA_NORM && !a->f32 && a->fold_A && a->fold_B && a->fold_in > 0 &&
                       a->fold_ldy >= a->fold_in && a->fold_ldy % 8 == 0 && a->fold_lda >= a->fold_in &&
                       a->fold_lda % 2 == 0 && a->fold_ldb % 2 == 0 && a->lda % 2 == 0 && a->ldw % 2 == 0 &&
                       lx_aligned(a->fold_y, 16) && lx_aligned(a->fold_A, 4) && lx_aligned(a->fold_B, 4) &&
                       lx_aligned(a->A, 4) && lx_aligned(a->xw, 4) && lx_aligned(a->h, 8) && lx_aligned(a->w, 8);
        if (!ok)
            return cu_err(err, SQUAD_E_INVALID, "cu_lora_input: the folded out term's operands (in %d, ld %d)",
                          a->fold_in, a->fold_ldy);
        return lx_launch_fold(a, token_slot, rows, n_sm, st, err);
    }
    if (a->f32) {
        const dim3 grid((unsigned)tiles, (unsigned)((a->R + LX_CW_F32 - 1) / LX_CW_F32));
        k_lora_input_f32<<<grid, LX_THREADS, 0, st>>>(*a, token_slot, rows);
        CU_LAUNCH_CHECK("k_lora_input_f32");
        return 0;
    }
    /* vector loads and stores: 8 bf16 (16 bytes) of x, float4s of h and w, 4-byte A fragments */
    int src_ok = 1; /* IN_PLACE: xw's own alignment, checked below */
    if (a->src == CU_LORA_NORM)
        src_ok = lx_aligned(a->h, 16) && lx_aligned(a->w, 16);
    else if (a->src != CU_LORA_IN_PLACE)
        src_ok = lx_aligned(a->x_src, 16) && (a->src != CU_LORA_COPY || a->ld_src % 8 == 0);
    const int ok = a->in % 8 == 0 && a->R % 16 == 0 && a->lda % 8 == 0 && a->ldw % 8 == 0 && lx_aligned(a->xw, 16) &&
                   lx_aligned(a->A, 4) && src_ok;
    if (!ok)
        return cu_err(err, SQUAD_E_UNSUPPORTED,
                      "cu_lora_input: bf16 needs in %% 8 == 0 (%d), R %% 16 == 0 (%d), 16-byte aligned rows", a->in,
                      a->R);
    const int sms = n_sm > 0 ? n_sm : 1, cw = lx_block_cols(a->R, tiles, sms), groups = (a->R + cw - 1) / cw;
    const int in16 = lx_round(a->in, 16);
    int ks = lx_slices(in16, tiles * groups, sms, cw / 8);
    /* the short chain: no second wave of clusters where fewer slices fit in one */
    if (cw == 16)
        while (ks > 1 && a->fit[ks] > 0 && a->fit[ks] < tiles * groups) ks--;
    const int slice = lx_round((in16 + ks - 1) / ks, 16);
    const dim3 grid((unsigned)tiles, (unsigned)groups, (unsigned)((in16 + slice - 1) / slice));
    /* the short chain: narrow column groups and a slice it takes in one pass (the norm's within
     * the units it holds in registers) */
    const int short_units = a->src == CU_LORA_NORM ? LX_SHORT_NORM_UNITS : LX_SHORT_UNITS;
    const bool short_chain = cw == 16 && LX_TM * (slice / 8) <= short_units * LX_THREADS;
    const cudaError_t e = cw == 16   ? lx_launch<2>(grid, slice, a, token_slot, rows, short_chain, st)
                          : cw == 32 ? lx_launch<4>(grid, slice, a, token_slot, rows, false, st)
                                     : lx_launch<8>(grid, slice, a, token_slot, rows, false, st);
    if (e != cudaSuccess) return cu_fail(err, "k_lora_input_mma (cudaLaunchKernelEx)", e, __FILE__, __LINE__);
    CU_LAUNCH_CHECK("k_lora_input_mma");
    return 0;
}

int cu_lora_fit(int fit[CU_LORA_FIT_MAX + 1], squad_err *err) {
    static_assert(CU_LORA_FIT_MAX == LX_SLICES_MAX, "a fit for every cluster size");
    fit[0] = 0;
    for (int k = 1; k <= CU_LORA_FIT_MAX; k++) {
        cudaLaunchAttribute at[1] = {};
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 1;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = (unsigned)k;
        cudaLaunchConfig_t lc = {};
        lc.gridDim = dim3(1, 1, (unsigned)k);
        lc.blockDim = dim3(LX_THREADS);
        lc.attrs = at;
        lc.numAttrs = 1;
        fit[k] = 0;
        const cudaError_t e = cudaOccupancyMaxActiveClusters(&fit[k], k_lora_input_short<2>, &lc);
        if (e != cudaSuccess) return cu_fail(err, "cudaOccupancyMaxActiveClusters", e, __FILE__, __LINE__);
    }
    return 0;
}

/* inv[t] for each real token: one block per token. */
__global__ void k_router_inv(const float *h, int H, float eps, const cu_chunk_params *prm, float *inv) {
    __shared__ double part[ROUTER_THREADS];
    const int t = blockIdx.x;
    if (t >= prm->len) return;
    const float *ht = h + (size_t)t * H;
    double ss = 0.0;
    for (int i = threadIdx.x; i < H; i += ROUTER_THREADS) ss += (double)ht[i] * (double)ht[i];
    part[threadIdx.x] = ss;
    __syncthreads();
    for (int n = ROUTER_THREADS / 2; n > 0; n /= 2) {
        if ((int)threadIdx.x < n) part[threadIdx.x] += part[threadIdx.x + n];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const float ms = (float)(part[0] / (double)H);
        inv[t] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
    }
}

/* sum[j] over the real tokens: one thread per column (consecutive threads, consecutive columns). */
__global__ void k_router_cols(const float *h, int H, const cu_chunk_params *prm, const float *inv, double *sum) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= H) return;
    const int len = prm->len;
    double s = 0.0;
    for (int t = 0; t < len; t++) s += (double)__fmul_rn(h[(size_t)t * H + j], inv[t]);
    sum[j] = s;
}

int cu_router_sum(const float *h, int H, float eps, const cu_chunk_params *prm, float *inv, double *sum, int rows,
                  cudaStream_t st, squad_err *err) {
    if (rows < 1 || H < 1) return cu_err(err, SQUAD_E_INVALID, "cu_router_sum: rows %d, H %d", rows, H);
    k_router_inv<<<rows, ROUTER_THREADS, 0, st>>>(h, H, eps, prm, inv);
    CU_LAUNCH_CHECK("k_router_inv");
    k_router_cols<<<(H + ROUTER_THREADS - 1) / ROUTER_THREADS, ROUTER_THREADS, 0, st>>>(h, H, prm, inv, sum);
    CU_LAUNCH_CHECK("k_router_cols");
    return 0;
}
