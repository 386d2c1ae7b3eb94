/*
 * k_lora.cu — the specialists' kernels (k_lora.cuh): the low-rank terms of an adapted GEMM output
 * (a "site") and the router's feature sum.
 *
 * Design of the low-rank term. One launch per site; a block owns a tile of LORA_TM tokens and a
 * chunk of one part's output columns, and does both products for them:
 *   1. u = A x for its tokens, the whole rank, into shared memory;
 *   2. y += scale * B u for its columns, added into y in place.
 * The down product is recomputed by every column chunk of a token tile. That is the price of one
 * launch instead of two (no grid-wide barrier between the products), and it is small: the rank is
 * small, so u costs rank / chunk-width of the up product's work per block, and x and A come from
 * L2. The grid aims at LORA_GRID_PER_SM blocks an SM: short chunks (a cache hit's question) get
 * narrow column chunks and many blocks, long chunks wide ones and few recomputations; a floor on
 * the chunk width keeps the recomputation in proportion where `in` is large (out_proj, down_proj).
 *
 * Per-token routes: a block reads its tokens' slots; for each distinct slot among them (one in a
 * row's tile, two where two rows meet) it runs both products with the rows of other slots zeroed
 * in u and left unwritten in y. Slot 0 (the trunk, padding) and entries of rank 0 add nothing.
 *
 * The fast path (bf16 x, bf16 entries) runs both products on the tensor cores (mma.sync m16n8k16,
 * fp32 accumulate): the down product splits `in` over the block's 8 warps (partials reduced in a
 * fixed order through shared memory, so the result is deterministic), u is rounded to bf16 for the
 * up product, whose n8 column tiles the warps share. Operands are loaded straight from global
 * memory in the fragments' layout: A [rp][lda] and B [out][rp] are zero-padded to multiples of 16
 * by cu_lora_pack, so only x needs guards (its tail past `in`, rows past the chunk).
 * At a hit's few tokens the launch is latency-bound (the work is tiny), so the kernel counts
 * dependent trips to memory, not bytes: the slots and the block's entries come in one round (a
 * warp each); a warp loads the x and A fragments of LORA_KB down-product steps before their mmas;
 * the up product loads y with B (as pairs where aligned). A rank-16 site is then about three
 * rounds: slots and entries, x and A, y and B.
 * The exact path (fp32 x, fp32 entries) keeps fp32 FMAs in the arithmetic of the earlier
 * per-token kernels: u[t][k] as lane-strided partial sums reduced with shuffles, y as a sum over k
 * in order.
 *
 * The router's sum follows squad_router_norm_add: squares summed in double, the normalisation in
 * fp32 with round-to-nearest intrinsics (the library is built with --use_fast_math, which would
 * otherwise approximate them), the normalised values summed in double.
 */
#include "k_lora.cuh"

#include <stdlib.h>

extern "C" {
#include "specialists.h"
}

#define LORA_TM 16            /* tokens per block: the mma's M */
#define LORA_THREADS 256
#define LORA_WARPS (LORA_THREADS / 32)
#define LORA_RCH 16           /* rank columns of u per down pass: 2 n8 tiles per warp (rank 16: one pass) */
#define LORA_LDP (LORA_RCH + 8) /* row stride of the down partials (floats): float2 stores conflict-free */
#define LORA_UP_GROUP 4       /* n8 column tiles a warp runs at once in the up product */
#define LORA_SMEM_ENTRIES 32  /* slots whose entries a block reads from shared memory */
static_assert(LORA_THREADS >= 32 + LORA_SMEM_ENTRIES, "lora_load_slots: a warp of slot loads, then the entries");
#define LORA_KB 8             /* k-steps of the down product a warp loads before its mmas */
#define LORA_CW_STEP 64       /* column chunks are multiples of this: one n8 tile per warp */
#define LORA_MIN_BLOCKS 2     /* blocks an SM can hold (caps the registers at 128) */
/* The grid: about LORA_GRID_PER_SM blocks an SM, but column chunks no narrower than the input row
 * width / LORA_IN_PER_CW, so a block's up product is not dwarfed by the down product it repeats
 * (and the repeated reads of x and A stay a small multiple of one pass), and no wider than
 * LORA_CW_MAX, so a long chunk (many token tiles, few column chunks) still has enough blocks in
 * flight for its y read-modify-write. Each can be overridden for experiments by
 * SQUAD_LORA_GRID_PER_SM, SQUAD_LORA_IN_PER_CW and SQUAD_LORA_CW_MAX (0: no such floor / cap). */
#define LORA_GRID_PER_SM 1
#define LORA_IN_PER_CW 8 /* measured on the H200 (rank 16, 0.8B shapes): 8 beats 4 by ~9 % at 32 rows, ~6 % at 128 */
#define LORA_CW_MAX 1024
#define LORA_SMEM_DEFAULT (48 * 1024) /* dynamic shared memory above this needs the attribute */
#define ROUTER_THREADS 256

/* The column chunks of a site's grid: part p's chunks are blockIdx.y in [chunk0[p], chunk0[p + 1]). */
typedef struct lora_grid {
    int cw;
    int chunk0[CU_LORA_MAX_PARTS + 1];
} lora_grid;

static __host__ __device__ __forceinline__ int lora_round(int n, int m) { return (n + m - 1) / m * m; }

/* ---- shared by both paths ---------------------------------------------------------------------- */

/* The block's part: its entries, first column in y and the block's column range [cbeg, cend). */
typedef struct lora_part {
    const cu_lora_entry *col;
    int yoff, cbeg, cend;
} lora_part;

/* Selected with unrolled compares, not indexed: an indexed kernel parameter would go through local
 * memory. */
static __device__ __forceinline__ lora_part lora_block_part(const cu_lora_site &site, const lora_grid &g) {
    const int b = (int)blockIdx.y;
    lora_part r = {site.col[0], site.yoff[0], b * g.cw, 0};
    int out = site.out[0];
#pragma unroll
    for (int p = 1; p < CU_LORA_MAX_PARTS; p++)
        if (p < site.n_parts && g.chunk0[p] <= b) {
            r.col = site.col[p];
            r.yoff = site.yoff[p];
            r.cbeg = (b - g.chunk0[p]) * g.cw;
            out = site.out[p];
        }
    r.cend = min(r.cbeg + g.cw, out);
    return r;
}

/* The tile's token slots into ts (0 past rows or outside [1, n_slots]) and, in the same memory
 * round, the block's part's entries of the first LORA_SMEM_ENTRIES slots into ents (a second
 * warp loads them while the first loads the slots, so reading a slot's entry is no second
 * dependent trip to global memory); returns the mask of the tile's rows with a slot. Every thread
 * gets the same mask. */
static __device__ __forceinline__ unsigned lora_load_slots(int *ts, cu_lora_entry *ents, const lora_part &pt,
                                                           const cu_lora_site &site, const int *token_slot, int t0,
                                                           int rows) {
    if (threadIdx.x < LORA_TM) {
        const int t = t0 + (int)threadIdx.x;
        const int s = t < rows ? token_slot[t] : 0;
        ts[threadIdx.x] = s >= 1 && s <= site.n_slots ? s : 0;
    }
    const int i = (int)threadIdx.x - 32;
    if (i >= 0 && i < min(site.n_slots, LORA_SMEM_ENTRIES)) ents[i] = pt.col[(size_t)i * site.stride];
    __syncthreads();
    unsigned todo = 0;
#pragma unroll
    for (int i = 0; i < LORA_TM; i++)
        if (ts[i] > 0) todo |= 1u << i;
    return todo;
}

/* Slot s's entry of the block's part (s >= 1). */
static __device__ __forceinline__ cu_lora_entry lora_entry(const cu_lora_entry *ents, const lora_part &pt,
                                                           const cu_lora_site &site, int s) {
    return s <= LORA_SMEM_ENTRIES ? ents[s - 1] : pt.col[(size_t)(s - 1) * site.stride];
}

/* The next slot of the tile to run (the lowest row's of todo) and the mask of its rows, taken out
 * of todo. */
static __device__ __forceinline__ int lora_next_slot(const int *ts, unsigned *todo, unsigned *mine) {
    const int s = ts[__ffs(*todo) - 1];
    unsigned m = 0;
#pragma unroll
    for (int i = 0; i < LORA_TM; i++)
        if (ts[i] == s) m |= 1u << i;
    *todo &= ~m;
    *mine = m;
    return s;
}

/* ---- the tensor-core path: bf16 x and entries ---------------------------------------------------- */

/* x[row][k], x[row][k + 1] as one bf16 pair (zeros past rows or in). pair: x rows 4-byte aligned. */
static __device__ __forceinline__ uint32_t lora_x_pair(const bf16 *x, int ldx, int row, int rows, int k, int in,
                                                       int pair) {
    if (row >= rows || k >= in) return 0;
    const bf16 *p = x + (size_t)row * ldx + k;
    if (pair && k + 1 < in) return *reinterpret_cast<const uint32_t *>(p);
    const uint32_t lo = *reinterpret_cast<const unsigned short *>(p);
    const uint32_t hi = k + 1 < in ? *reinterpret_cast<const unsigned short *>(p + 1) : 0u;
    return lo | hi << 16;
}

/* Two adjacent y values as one access (ypair: every pair the kernel touches is aligned for it). */
static __device__ __forceinline__ float2 lora_ld2(const bf16 *p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
}
static __device__ __forceinline__ float2 lora_ld2(const float *p) { return *reinterpret_cast<const float2 *>(p); }
static __device__ __forceinline__ void lora_st2(bf16 *p, float2 v) {
    *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(v.x, v.y);
}
static __device__ __forceinline__ void lora_st2(float *p, float2 v) { *reinterpret_cast<float2 *>(p) = v; }

template <typename Y>
__global__ void __launch_bounds__(LORA_THREADS, LORA_MIN_BLOCKS)
    k_lora_mma(cu_lora_site site, lora_grid g, const int *token_slot, const bf16 *x, int ldx, int xpair, Y *y,
               int ldy, int ypair, int rows) {
    extern __shared__ __align__(16) unsigned char lora_smem[];
    float *part = reinterpret_cast<float *>(lora_smem);        /* [LORA_WARPS][LORA_TM][LORA_LDP] */
    bf16 *U = reinterpret_cast<bf16 *>(part + LORA_WARPS * LORA_TM * LORA_LDP); /* [LORA_TM][ldu] */
    __shared__ int ts[LORA_TM];
    __shared__ cu_lora_entry ents[LORA_SMEM_ENTRIES];
    const int ldu = lora_round(site.max_rank, 16) + 8; /* row stride: u fragment loads conflict-free */
    const int t0 = (int)blockIdx.x * LORA_TM;
    const lora_part pt = lora_block_part(site, g);
    const int cbeg = pt.cbeg, cend = pt.cend;
    unsigned todo = lora_load_slots(ts, ents, pt, site, token_slot, t0, rows);
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    const int ra = t0 + gq, rb = t0 + gq + 8;
    while (todo) {
        unsigned mine;
        const int s = lora_next_slot(ts, &todo, &mine);
        const cu_lora_entry e = lora_entry(ents, pt, site, s);
        if (e.r <= 0 || e.f32) continue;
        const int rp = lora_round(e.r, 16), lda = lora_round(e.in, 16), nks = lda / 16;
        const bf16 *A = static_cast<const bf16 *>(e.A), *B = static_cast<const bf16 *>(e.B);
        /* 1. u = A x, LORA_RCH rank columns at a time, `in` split over the warps */
        for (int k0 = 0; k0 < rp; k0 += LORA_RCH) {
            const int nj = min(LORA_RCH, rp - k0) / 8;
            float acc[LORA_RCH / 8][4] = {};
            /* LORA_KB k-steps a warp: every x and A fragment of them loaded into registers before
             * the first mma, so a warp waits on memory once per LORA_KB steps, not once a step */
            for (int kb = warp; kb < nks; kb += LORA_WARPS * LORA_KB) {
                uint32_t a[LORA_KB][4], bA[LORA_KB][LORA_RCH / 8][2];
#pragma unroll
                for (int q = 0; q < LORA_KB; q++) {
                    const int ks = kb + q * LORA_WARPS, k = ks * 16 + 2 * tq;
                    const bool on = ks < nks;
                    a[q][0] = on ? lora_x_pair(x, ldx, ra, rows, k, e.in, xpair) : 0u;
                    a[q][1] = on ? lora_x_pair(x, ldx, rb, rows, k, e.in, xpair) : 0u;
                    a[q][2] = on ? lora_x_pair(x, ldx, ra, rows, k + 8, e.in, xpair) : 0u;
                    a[q][3] = on ? lora_x_pair(x, ldx, rb, rows, k + 8, e.in, xpair) : 0u;
#pragma unroll
                    for (int j = 0; j < LORA_RCH / 8; j++) {
                        bA[q][j][0] = bA[q][j][1] = 0u;
                        if (on && j < nj) {
                            const bf16 *ar = A + (size_t)(k0 + 8 * j + gq) * lda + k;
                            bA[q][j][0] = *reinterpret_cast<const uint32_t *>(ar);
                            bA[q][j][1] = *reinterpret_cast<const uint32_t *>(ar + 8);
                        }
                    }
                }
#pragma unroll
                for (int q = 0; q < LORA_KB; q++)
#pragma unroll
                    for (int j = 0; j < LORA_RCH / 8; j++)
                        if (kb + q * LORA_WARPS < nks && j < nj) cu_mma16816(acc[j], a[q], bA[q][j][0], bA[q][j][1]);
            }
            float *pw = part + warp * LORA_TM * LORA_LDP;
#pragma unroll
            for (int j = 0; j < LORA_RCH / 8; j++)
                if (j < nj) {
                    *reinterpret_cast<float2 *>(&pw[gq * LORA_LDP + 8 * j + 2 * tq]) =
                        make_float2(acc[j][0], acc[j][1]);
                    *reinterpret_cast<float2 *>(&pw[(gq + 8) * LORA_LDP + 8 * j + 2 * tq]) =
                        make_float2(acc[j][2], acc[j][3]);
                }
            __syncthreads();
            for (int idx = (int)threadIdx.x; idx < LORA_TM * LORA_RCH; idx += LORA_THREADS) {
                const int row = idx / LORA_RCH, c = idx % LORA_RCH;
                if (c >= nj * 8) continue;
                float sum = 0.0f;
#pragma unroll
                for (int w = 0; w < LORA_WARPS; w++) sum += part[(w * LORA_TM + row) * LORA_LDP + c];
                /* rows of other slots (and their possibly non-finite x) drop out here */
                U[row * ldu + k0 + c] = __float2bfloat16((mine >> row) & 1u ? sum : 0.0f);
            }
            __syncthreads();
        }
        /* 2. y += scale B u over the block's columns: LORA_UP_GROUP n8 tiles a warp at a time
         * (tiles warp, warp + 8, ...: narrow chunks still spread over the warps), their y loads and
         * B loads in flight together, then the mmas, then the stores */
        const int nt = (cend - cbeg + 7) / 8, nks2 = rp / 16, yo = pt.yoff;
        const int lim = min(cend, e.out);
        for (int base = 0; base < nt; base += LORA_WARPS * LORA_UP_GROUP) {
            /* y first: its loads and B's in flight together; a lane's two adjacent columns
             * (acc[q][2 h], acc[q][2 h + 1]: row gq + 8 h, columns c0, c0 + 1) as one access when
             * ypair allows */
            float yv[LORA_UP_GROUP][4];
#pragma unroll
            for (int q = 0; q < LORA_UP_GROUP; q++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int lr = gq + 8 * h, c0 = cbeg + (base + warp + LORA_WARPS * q) * 8 + 2 * tq;
                    const Y *py = y + (size_t)(t0 + lr) * ldy + yo + c0;
                    const bool on = (mine >> lr) & 1u;
                    if (on && ypair && c0 + 1 < lim) {
                        const float2 v = lora_ld2(py);
                        yv[q][2 * h] = v.x;
                        yv[q][2 * h + 1] = v.y;
                    } else {
                        yv[q][2 * h] = on && c0 < lim ? cu_ld(py) : 0.0f;
                        yv[q][2 * h + 1] = on && c0 + 1 < lim ? cu_ld(py + 1) : 0.0f;
                    }
                }
            float acc[LORA_UP_GROUP][4] = {};
            for (int ks = 0; ks < nks2; ks++) {
                const int k = ks * 16 + 2 * tq;
                uint32_t a[4], b[LORA_UP_GROUP][2];
                a[0] = *reinterpret_cast<const uint32_t *>(&U[gq * ldu + k]);
                a[1] = *reinterpret_cast<const uint32_t *>(&U[(gq + 8) * ldu + k]);
                a[2] = *reinterpret_cast<const uint32_t *>(&U[gq * ldu + k + 8]);
                a[3] = *reinterpret_cast<const uint32_t *>(&U[(gq + 8) * ldu + k + 8]);
#pragma unroll
                for (int q = 0; q < LORA_UP_GROUP; q++) {
                    const int bcol = cbeg + (base + warp + LORA_WARPS * q) * 8 + gq; /* this lane's B row */
                    b[q][0] = b[q][1] = 0;
                    if (bcol < lim) {
                        const bf16 *br = B + (size_t)bcol * rp + k;
                        b[q][0] = *reinterpret_cast<const uint32_t *>(br);
                        b[q][1] = *reinterpret_cast<const uint32_t *>(br + 8);
                    }
                }
#pragma unroll
                for (int q = 0; q < LORA_UP_GROUP; q++) cu_mma16816(acc[q], a, b[q][0], b[q][1]);
            }
#pragma unroll
            for (int q = 0; q < LORA_UP_GROUP; q++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int lr = gq + 8 * h, c0 = cbeg + (base + warp + LORA_WARPS * q) * 8 + 2 * tq;
                    Y *py = y + (size_t)(t0 + lr) * ldy + yo + c0;
                    if (!((mine >> lr) & 1u)) continue;
                    const float v0 = yv[q][2 * h] + e.scale * acc[q][2 * h];
                    const float v1 = yv[q][2 * h + 1] + e.scale * acc[q][2 * h + 1];
                    if (ypair && c0 + 1 < lim) {
                        lora_st2(py, make_float2(v0, v1));
                    } else {
                        if (c0 < lim) cu_st(py, v0);
                        if (c0 + 1 < lim) cu_st(py + 1, v1);
                    }
                }
        }
        __syncthreads(); /* U and the partials are the next slot's */
    }
}

/* ---- the exact path: fp32 x and entries ----------------------------------------------------------- */

template <typename Y>
__global__ void __launch_bounds__(LORA_THREADS, LORA_MIN_BLOCKS)
    k_lora_f32(cu_lora_site site, lora_grid g, const int *token_slot, const float *x, int ldx, Y *y, int ldy,
               int rows) {
    extern __shared__ __align__(16) unsigned char lora_smem[];
    float *U = reinterpret_cast<float *>(lora_smem); /* [LORA_TM][max_rank] */
    __shared__ int ts[LORA_TM];
    __shared__ cu_lora_entry ents[LORA_SMEM_ENTRIES];
    const int ldu = site.max_rank;
    const int t0 = (int)blockIdx.x * LORA_TM, nrow = min(LORA_TM, rows - t0);
    const lora_part pt = lora_block_part(site, g);
    const int cbeg = pt.cbeg, cend = pt.cend;
    unsigned todo = lora_load_slots(ts, ents, pt, site, token_slot, t0, rows);
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    while (todo) {
        unsigned mine;
        const int s = lora_next_slot(ts, &todo, &mine);
        const cu_lora_entry e = lora_entry(ents, pt, site, s);
        if (e.r <= 0 || !e.f32) continue;
        const float *A = static_cast<const float *>(e.A), *Bt = static_cast<const float *>(e.B);
        /* 1. u[t][k]: a warp per rank row, the tile's tokens at once */
        for (int k = warp; k < e.r; k += LORA_WARPS) {
            float acc[LORA_TM] = {};
            const float *a = A + (size_t)k * e.in;
            for (int i = lane; i < e.in; i += 32) {
                const float av = a[i];
#pragma unroll
                for (int t = 0; t < LORA_TM; t++)
                    if (t < nrow) acc[t] += av * x[(size_t)(t0 + t) * ldx + i];
            }
#pragma unroll
            for (int t = 0; t < LORA_TM; t++) {
                const float v = cu_warp_sum(acc[t]);
                if (lane == 0) U[t * ldu + k] = (mine >> t) & 1u ? v : 0.0f;
            }
        }
        __syncthreads();
        /* 2. a thread per output column, the tile's tokens at once */
        const int lim = min(cend, e.out), yo = pt.yoff;
        for (int c = cbeg + (int)threadIdx.x; c < lim; c += LORA_THREADS) {
            float acc[LORA_TM] = {};
            for (int k = 0; k < e.r; k++) {
                const float b = Bt[(size_t)k * e.out + c];
#pragma unroll
                for (int t = 0; t < LORA_TM; t++) acc[t] += b * U[t * ldu + k];
            }
#pragma unroll
            for (int t = 0; t < LORA_TM; t++)
                if ((mine >> t) & 1u) {
                    Y *py = y + (size_t)(t0 + t) * ldy + yo + c;
                    cu_st(py, cu_ld(py) + e.scale * acc[t]);
                }
        }
        __syncthreads(); /* U is the next slot's */
    }
}

/* ---- host side ------------------------------------------------------------------------------------ */

size_t cu_lora_pack_bytes(int r, int in, int out, int f32) {
    const size_t n = f32 ? ((size_t)r * in + (size_t)r * out) * sizeof(float)
                         : ((size_t)lora_round(r, 16) * lora_round(in, 16) + (size_t)out * lora_round(r, 16)) * 2;
    return (n + 15) & ~(size_t)15;
}

void cu_lora_pack(const float *A, const float *B, int r, int in, int out, float scale, int f32, void *host,
                  const void *dev, cu_lora_entry *en) {
    memset(host, 0, cu_lora_pack_bytes(r, in, out, f32));
    size_t b_off;
    if (f32) {
        float *a = static_cast<float *>(host), *bt = a + (size_t)r * in;
        memcpy(a, A, (size_t)r * in * sizeof(float));
        for (int o = 0; o < out; o++) /* B [out][r] -> B^T [r][out] */
            for (int k = 0; k < r; k++) bt[(size_t)k * out + o] = B[(size_t)o * r + k];
        b_off = (size_t)r * in * sizeof(float);
    } else {
        const int rp = lora_round(r, 16), lda = lora_round(in, 16);
        uint16_t *a = static_cast<uint16_t *>(host), *b = a + (size_t)rp * lda;
        for (int k = 0; k < r; k++)
            for (int i = 0; i < in; i++) a[(size_t)k * lda + i] = squad_f32_to_bf16(A[(size_t)k * in + i]);
        for (int o = 0; o < out; o++)
            for (int k = 0; k < r; k++) b[(size_t)o * rp + k] = squad_f32_to_bf16(B[(size_t)o * r + k]);
        b_off = (size_t)rp * lda * 2;
    }
    en->A = dev;
    en->B = static_cast<const char *>(dev) + b_off;
    en->r = r;
    en->in = in;
    en->out = out;
    en->f32 = f32;
    en->scale = scale;
}

/* An experiment's override from the environment, else def. */
static int lora_env(const char *name, int def, int lo, int hi) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    const int n = atoi(v);
    return n < lo ? lo : n > hi ? hi : n;
}

/* The column chunks (the grid's y) for rows of width `in` split into `tiles` token tiles; returns
 * the number of chunks. */
static int lora_make_grid(const cu_lora_site *site, int tiles, int in, int n_sm, lora_grid *g) {
    const int per_sm = lora_env("SQUAD_LORA_GRID_PER_SM", LORA_GRID_PER_SM, 1, 64);
    const int in_per_cw = lora_env("SQUAD_LORA_IN_PER_CW", LORA_IN_PER_CW, 0, 1 << 20);
    const int cw_max = lora_env("SQUAD_LORA_CW_MAX", LORA_CW_MAX, 0, 1 << 20);
    int total = 0;
    for (int p = 0; p < site->n_parts; p++) total += site->out[p];
    const int want = (per_sm * (n_sm > 0 ? n_sm : 1) + tiles - 1) / tiles;
    g->cw = lora_round((total + want - 1) / want, LORA_CW_STEP);
    if (in_per_cw > 0) g->cw = max(g->cw, lora_round((in + in_per_cw - 1) / in_per_cw, LORA_CW_STEP));
    if (cw_max > 0) g->cw = max(LORA_CW_STEP, min(g->cw, lora_round(cw_max, LORA_CW_STEP)));
    g->chunk0[0] = 0;
    for (int p = 0; p < site->n_parts; p++) g->chunk0[p + 1] = g->chunk0[p] + (site->out[p] + g->cw - 1) / g->cw;
    for (int p = site->n_parts + 1; p <= CU_LORA_MAX_PARTS; p++) g->chunk0[p] = g->chunk0[site->n_parts];
    return g->chunk0[site->n_parts];
}

/* Launches kernel with smem bytes of dynamic shared memory, raising its limit first when needed. */
template <typename K, typename... Args>
static int lora_launch(K kernel, const char *what, dim3 grid, size_t smem, cudaStream_t st, squad_err *err,
                       Args... args) {
    if (smem > LORA_SMEM_DEFAULT)
        CU_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, LORA_THREADS, smem, st>>>(args...);
    CU_LAUNCH_CHECK(what);
    return 0;
}

int cu_lora(const cu_lora_site *site, const int *token_slot, const void *x, int ldx, int x_f32, void *y, int ldy,
            int y_f32, int rows, int n_sm, cudaStream_t st, squad_err *err) {
    if (!site || site->n_parts < 1 || site->n_parts > CU_LORA_MAX_PARTS || rows < 1 || site->stride < 1 ||
        site->n_slots < 0 || site->max_rank < 1 || site->max_rank > SQUAD_LORA_MAX_RANK)
        return cu_err(err, SQUAD_E_INVALID, "cu_lora: %d parts, rows %d, stride %d, max rank %d",
                      site ? site->n_parts : 0, rows, site ? site->stride : 0, site ? site->max_rank : 0);
    for (int p = 0; p < site->n_parts; p++)
        if (site->out[p] < 1 || site->yoff[p] < 0 || site->yoff[p] + site->out[p] > ldy)
            return cu_err(err, SQUAD_E_INVALID, "cu_lora: part %d: columns [%d, %d) of rows of %d", p, site->yoff[p],
                          site->yoff[p] + site->out[p], ldy);
    const int tiles = (rows + LORA_TM - 1) / LORA_TM;
    lora_grid g;
    const dim3 grid((unsigned)tiles, (unsigned)lora_make_grid(site, tiles, ldx, n_sm, &g));
    if (!x_f32) {
        const int xpair = !(ldx & 1) && !((uintptr_t)x & 3);
        /* y pairs: even ldy and part offsets (column chunks start at multiples of LORA_CW_STEP), y
         * aligned for two values */
        int ypair = !(ldy & 1) && !((uintptr_t)y & (y_f32 ? 7 : 3));
        for (int p = 0; p < site->n_parts; p++) ypair = ypair && !(site->yoff[p] & 1);
        const size_t smem = sizeof(float) * LORA_WARPS * LORA_TM * LORA_LDP +
                            sizeof(bf16) * LORA_TM * (size_t)(lora_round(site->max_rank, 16) + 8);
        if (y_f32)
            return lora_launch(k_lora_mma<float>, "k_lora_mma", grid, smem, st, err, *site, g, token_slot,
                               (const bf16 *)x, ldx, xpair, (float *)y, ldy, ypair, rows);
        return lora_launch(k_lora_mma<bf16>, "k_lora_mma", grid, smem, st, err, *site, g, token_slot, (const bf16 *)x,
                           ldx, xpair, (bf16 *)y, ldy, ypair, rows);
    }
    const size_t smem = sizeof(float) * LORA_TM * (size_t)site->max_rank;
    if (y_f32)
        return lora_launch(k_lora_f32<float>, "k_lora_f32", grid, smem, st, err, *site, g, token_slot,
                           (const float *)x, ldx, (float *)y, ldy, rows);
    return lora_launch(k_lora_f32<bf16>, "k_lora_f32", grid, smem, st, err, *site, g, token_slot, (const float *)x,
                       ldx, (bf16 *)y, ldy, rows);
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
