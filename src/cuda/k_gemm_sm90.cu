/*
 * k_gemm_sm90.cu — the projections of a short chunk (a cache hit's 32-512 tokens) on Hopper's own
 * instructions: TMA (cp.async.bulk.tensor) streams the weights and the tokens into shared memory,
 * wgmma multiplies them, and a thread-block cluster sums the slices of a split K through distributed
 * shared memory. Offered to k_gemm.cu's tuning as one more candidate per shape, so cuBLASLt still
 * runs every shape where it is faster.
 *
 * Why: with M tokens in the tens or hundreds, a projection is a pass over its weight matrix (a
 * 1024 x 6144 bf16 weight is 12.6 MB, ~3 us at the H200's 4.2 TB/s), and cuBLASLt's kernels, made for
 * large M, took 5.5-8.1 us. Here the weights are wgmma's A operand (64 rows a warpgroup) and the
 * tokens its N dimension (64 a sub-tile), i.e. the kernel computes Y^T = W X^T, so the big operand
 * fills the M = 64 side every instruction needs and a short chunk wastes no weight bytes.
 *
 * Design:
 *   - A block: WG consumer warpgroups (64 weight rows each; 2 or 4 share every token tile, cutting the
 *     tokens' L2 traffic as much), NT token sub-tiles of 64 (NT * 64 tokens, up to 256), and one producer
 *     warp, over a slice of K. Grid: weight-row tiles x K slices x token tiles; the K slices of a
 *     tile form one cluster (up to 8 blocks, the portable cluster size).
 *   - Pipeline: STAGES shared-memory stages of 64 k (one 128-byte swizzle row of bf16) each, each with
 *     a "full" mbarrier (the TMA's bytes landed) and an "empty" one (every consumer warp is done with
 *     it). The producer warp's lane 0 loads both tiles of a stage by TMA (128-byte swizzle,
 *     out-of-range rows and k zero-filled) as soon as the stage is empty; the consumers issue the
 *     stage's 4 x NT wgmma m64n64k16 as one group, then wait only for the previous group
 *     (wgmma.wait_group 1) and release its stage. No block barrier in the loop: one group of wgmma
 *     and STAGES - 1 loads stay in flight. The small tiles (WG 1, NT <= 2) keep their stages within
 *     ~100 KB so two blocks share a multiprocessor.
 *   - Launch with a programmatic dependency on the previous kernel of the stream: the blocks start
 *     as that kernel's blocks exit and load their first stages' weights at once; the tokens, and
 *     every access to Y, wait (griddepcontrol.wait) until that kernel is complete. So the weights
 *     must not be written by the kernel just before (they are model weights, written once).
 *   - Epilogue: the accumulators go (fragment order -> [token][row], rows padded so the stores are
 *     free of bank conflicts) into the block's own shared memory, reused from the stages. With K
 *     split, after a cluster barrier each block of the cluster sums a share of the tile over all the
 *     cluster's blocks' shared memory (in slice order: the bits do not depend on timing, so a
 *     configuration always gives the same bits, the GEMM plan file's promise), and a second cluster
 *     barrier keeps every block's shared memory alive until its readers are done. Then 4 consecutive
 *     rows of one token per thread: a 16-byte fp32 read-add-write into the residual or an 8-byte bf16
 *     store, several of them in flight per thread (element stores where N or Y is not aligned).
 *   - Build: this file alone is compiled for sm_90a (-gencode arch=compute_90a,code=sm_90a; see
 *     CMakeLists.txt), and its device code is guarded by __CUDA_ARCH_FEAT_SM90_ALL so it also
 *     compiles, to nothing, for any other target. At run time cu_sm90_init uses it only on compute
 *     capability 9.0 (the only GPUs an sm_90a cubin loads on), and only after a probe kernel from
 *     the same cubin reports that the Hopper code is in it.
 * The tensor maps are made per call on the host (cuTensorMapEncodeTiled through the runtime's
 * driver entry point, so nothing links libcuda) and passed as __grid_constant__ parameters, which a
 * captured graph keeps; the launch (cudaLaunchKernelEx with the cluster's shape) is captured the same.
 *
 * Variants (test only, cu_sm90_variant_gemm): the kernel's template parameter VAR leaves its later
 * stages out (launch alone, prologue, loads, main loop, staging and cluster barriers, split-K sums)
 * or adds one candidate change (tensor maps prefetched at the start; the next grid let launch
 * early), so a test can time each beside the product and take differences. Every VAR test is a
 * compile-time constant: the product's instantiations (VAR 0) are the code without them.
 */
#include "cuda_internal.cuh"
#include "k_wgmma.cuh"

#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdlib.h>

namespace cg = cooperative_groups;

#define SM90_BK 64          /* k per stage: 64 bf16 = one 128-byte swizzle row */
#define SM90_ROWS 64        /* weight rows per consumer warpgroup (wgmma's M) */
#define SM90_TOK 64         /* tokens per sub-tile (wgmma's N) */
#define SM90_ROW_BYTES 128  /* a tile row in shared memory: SM90_BK bf16 */
#define SM90_SMEM_BIG (200 * 1024)  /* stages of the large tiles: one block a multiprocessor */
#define SM90_SMEM_SMALL (100 * 1024) /* stages of the small tiles: two blocks a multiprocessor */
#define SM90_MAX_STAGES 8
#define SM90_ALIGN 1024     /* the 128-byte swizzle repeats every 8 rows: tiles start on 1024 bytes */
#define SM90_PAD 4          /* floats after each token's row of the staged output tile (banks) */
#define SM90_SPLITS_MAX 8   /* K slices = the blocks of a cluster (the portable cluster size) */
#define SM90_MIN_KB_PER_SPLIT 2 /* a K slice shorter than this spends more on its epilogue than it saves */
#define SM90_GROUP_1 8      /* 16-byte outputs in flight per thread, K unsplit */
#define SM90_GROUP_S 2      /* the same with K split (each reads one partial per slice) */
static const int SM90_SPLIT_CHOICES[] = {1, 2, 3, 4, 6, 8};
#define SM90_N_SPLIT_CHOICES ((int)(sizeof SM90_SPLIT_CHOICES / sizeof SM90_SPLIT_CHOICES[0]))

template <int WG, int NT>
struct sm90_shape {
    static constexpr int a_bytes = WG * SM90_ROWS * SM90_ROW_BYTES;
    static constexpr int b_bytes = NT * SM90_TOK * SM90_ROW_BYTES;
    static constexpr int stage_bytes = a_bytes + b_bytes;
    static constexpr bool small = WG == 1 && NT <= 2;
    static constexpr int budget = small ? SM90_SMEM_SMALL : SM90_SMEM_BIG;
    static constexpr int stages = budget / stage_bytes < SM90_MAX_STAGES ? budget / stage_bytes : SM90_MAX_STAGES;
    static constexpr int rows = WG * SM90_ROWS;  /* weight rows of the block's tile */
    static constexpr int toks = NT * SM90_TOK;   /* tokens of the block's tile */
    static constexpr int ld = rows + SM90_PAD;   /* floats per token in the staged output tile */
    static constexpr int out_bytes = toks * ld * (int)sizeof(float);
    static constexpr int pipe_bytes = stages * stage_bytes;
    static constexpr int smem = (pipe_bytes > out_bytes ? pipe_bytes : out_bytes) + SM90_ALIGN; /* + alignment */
    static constexpr int consumers = 128 * WG;
    static constexpr int threads = consumers + 32; /* + the producer warp */
    static constexpr int min_blocks = small ? 2 : 1;
    /* outputs in flight per thread in the split epilogue: 4 warpgroups (544 threads) get 96 registers */
    static constexpr int group_split = WG == 4 ? 1 : SM90_GROUP_S;
    static_assert(stages >= 2, "at least two pipeline stages");
};

typedef struct sm90_args {
    void *Y;      /* [M][N]: bf16 (acc 0) or fp32 (acc 1, added into) */
    int M, N, K, acc;
    int kb_per_split; /* k blocks (of SM90_BK) per K slice */
} sm90_args;

/* ---- device code (sm_90a only) ---------------------------------------------------------------- */

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The descriptor of a K-major tile stored with the 128-byte swizzle: rows of 128 bytes, 8-row
 * groups SM90_ALIGN (1024) bytes apart. Stepping k by 16 within the swizzle row adds 32 bytes. */
__device__ __forceinline__ uint64_t sm90_desc(uint32_t saddr) { return wg_desc(saddr, 16, SM90_ALIGN); }

__device__ __forceinline__ void sm90_mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(cu_smem_addr(bar)) : "memory");
}

/* A 2-D tile (box) of a tensor map into shared memory, counted on bar; x is the inner (k) coordinate. */
__device__ __forceinline__ void sm90_tma_2d(void *smem, const CUtensorMap *map, int x, int y, uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(cu_smem_addr(smem)),
        "l"((uint64_t)map), "r"(x), "r"(y), "r"(cu_smem_addr(bar))
        : "memory");
}

/* Programmatic dependent launch: waits for the grid before this one in the stream (complete, its
 * memory visible; at once when launched without the attribute). No kernel here triggers its
 * dependents early, so this grid starts launching as the previous one's blocks exit: the overlap a
 * forward's GEMM gets after any kernel, and no more in the back-to-back timings. */
__device__ __forceinline__ void sm90_grid_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

__device__ __forceinline__ void sm90_prefetch_map(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}

/* Test variants only. Programmatic dependent launch, the other half: the next grid of the stream may
 * launch once every block of this one has executed this or exited. */
__device__ __forceinline__ void sm90_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
/* Keeps a value the variant computes but does not write (ptxas deletes unused wgmma results and
 * loads, volatile or not): a store that never runs (acc is 0 or 1), which the compiler cannot know. */
__device__ __forceinline__ void sm90_keep(const sm90_args &a, float v) {
    if (a.acc > 1) *(float *)a.Y = v;
}

/* The output of one tile: the consumer thread ct of nthr writes 4 consecutive rows of one token per
 * item, items [beg, end) of the tile's (token, row / 4) grid, G items in flight at a time. Each item
 * is the sum over the cluster's `splits` staged tiles src[0..splits) in that order (SRC >= splits,
 * a compile-time bound so the loads are all issued before the first add). vec: N and Y allow the
 * 16-byte (fp32) or 8-byte (bf16) accesses; otherwise element by element. SINK (a test variant):
 * the sums are made (sm90_keep), Y is neither read nor written. */
template <int G, int SRC, int RQ, int LD, bool SINK>
__device__ __forceinline__ void sm90_out(const sm90_args &a, const float *const (&src)[SRC], int splits, int row0,
                                         int tok0, int beg, int end, int ct, int nthr, bool vec) {
    float *Yf = (float *)a.Y;
    bf16 *Yb = (bf16 *)a.Y;
    float kept = 0.f; /* SINK: every sum, added up */
    for (int base = beg + ct; base < end; base += G * nthr) {
        float4 p[G][SRC], y[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int idx = base + g * nthr;
            if (idx >= end) continue;
            const int tl = idx / RQ, r4 = idx - tl * RQ, row = row0 + 4 * r4;
            const int off = tl * LD + 4 * r4;
#pragma unroll
            for (int q = 0; q < SRC; q++)
                if (q < splits) p[g][q] = *(const float4 *)(src[q] + off);
            if (!SINK && a.acc && vec && row < a.N) y[g] = *(const float4 *)(Yf + (size_t)(tok0 + tl) * a.N + row);
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int idx = base + g * nthr;
            if (idx >= end) continue;
            const int tl = idx / RQ, r4 = idx - tl * RQ, row = row0 + 4 * r4;
            if (row >= a.N) continue;
            float4 v = p[g][0];
#pragma unroll
            for (int q = 1; q < SRC; q++)
                if (q < splits) {
                    v.x += p[g][q].x;
                    v.y += p[g][q].y;
                    v.z += p[g][q].z;
                    v.w += p[g][q].w;
                }
            if (SINK) {
                kept += (v.x + v.y) + (v.z + v.w);
                continue;
            }
            const size_t o = (size_t)(tok0 + tl) * a.N + row;
            if (vec) { /* N % 4 == 0: row < N means all 4 rows are */
                if (a.acc) {
                    float4 r = y[g];
                    r.x += v.x;
                    r.y += v.y;
                    r.z += v.z;
                    r.w += v.w;
                    *(float4 *)(Yf + o) = r;
                } else {
                    uint2 u;
                    u.x = cu_pack_bf16(v.x, v.y);
                    u.y = cu_pack_bf16(v.z, v.w);
                    *(uint2 *)(Yb + o) = u;
                }
            } else {
                const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int k = 0; k < 4; k++)
                    if (row + k < a.N) {
                        if (a.acc) Yf[o + k] += e[k];
                        else Yb[o + k] = __float2bfloat16(e[k]);
                    }
            }
        }
    }
    if (SINK) sm90_keep(a, kept);
}
#endif

/* Writes 1 when this cubin holds the Hopper code (the guard above was on when it was compiled). */
__global__ void k_sm90_probe(int *out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *out = 1;
#else
    *out = 0;
#endif
}

/* VAR: CU_SM90_VAR_FULL (0) in the product; the test variants leave stages out or add a candidate
 * change (cuda_internal.cuh). A variant that returns early leaves the rest of the body unreachable in
 * its instantiation, which the front end would report (diagnostic 128) for this kernel only. */
#pragma nv_diag_suppress 128
template <int WG, int NT, int VAR>
__global__ void __launch_bounds__(sm90_shape<WG, NT>::threads, sm90_shape<WG, NT>::min_blocks)
    k_gemm_sm90(const __grid_constant__ CUtensorMap tmW, const __grid_constant__ CUtensorMap tmX, const sm90_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (VAR == CU_SM90_VAR_LAUNCH) {
        sm90_grid_wait();
        return;
    }
    if constexpr (VAR == CU_SM90_VAR_TRIGGER_START) sm90_launch_dependents();
    typedef sm90_shape<WG, NT> S;
    extern __shared__ uint8_t sm90_smem_raw[];
    __shared__ uint64_t full[S::stages], empty[S::stages];
    const uint32_t mis = cu_smem_addr(sm90_smem_raw) & (SM90_ALIGN - 1);
    uint8_t *smem = sm90_smem_raw + (mis ? SM90_ALIGN - mis : 0);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int row0 = blockIdx.x * S::rows, tok0 = blockIdx.z * S::toks;
    const int nkb_all = (a.K + SM90_BK - 1) / SM90_BK;
    const int kb0 = blockIdx.y * a.kb_per_split;
    const int nkb = min(a.kb_per_split, nkb_all - kb0); /* >= 1: the host sizes the slices */

    if constexpr (VAR == CU_SM90_VAR_PREFETCH) {
        if (tid == S::consumers) { /* the producer's thread, while thread 0 initialises the barriers */
            sm90_prefetch_map(&tmW);
            sm90_prefetch_map(&tmX);
        }
    }
    if (tid == 0) {
        for (int s = 0; s < S::stages; s++) {
            cu_mbar_init(&full[s], 1);
            cu_mbar_init(&empty[s], 4 * WG); /* one arrival per consumer warp */
        }
        cu_mbar_init_fence();
    }
    __syncthreads();
    if constexpr (VAR == CU_SM90_VAR_EMPTY) {
        sm90_grid_wait();
        return;
    }

    float acc[NT][32];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int r = 0; r < 32; r++) acc[t][r] = 0.f;

    if (warp == 4 * WG) {
        /* the producer: stage i % STAGES gets k block i once its previous contents are consumed */
        if (lane == 0) {
            sm90_prefetch_map(&tmW);
            sm90_prefetch_map(&tmX);
            /* the first stages' weights before the previous grid is done (nothing writes weights),
             * their tokens after it (it may have written them) */
            const int pre = min(S::stages, nkb);
            for (int i = 0; i < pre; i++) {
                cu_mbar_expect_tx(&full[i], S::stage_bytes);
                sm90_tma_2d(smem + i * S::stage_bytes, &tmW, (kb0 + i) * SM90_BK, row0, &full[i]);
            }
            sm90_grid_wait();
            for (int i = 0; i < pre; i++)
                sm90_tma_2d(smem + i * S::stage_bytes + S::a_bytes, &tmX, (kb0 + i) * SM90_BK, tok0, &full[i]);
            for (int i = pre; i < nkb; i++) {
                const int s = i % S::stages;
                if (i >= S::stages) cu_mbar_wait(&empty[s], (unsigned)(i / S::stages - 1) & 1u);
                uint8_t *st = smem + s * S::stage_bytes;
                const int kx = (kb0 + i) * SM90_BK;
                cu_mbar_expect_tx(&full[s], S::stage_bytes);
                sm90_tma_2d(st, &tmW, kx, row0, &full[s]);
                sm90_tma_2d(st + S::a_bytes, &tmX, kx, tok0, &full[s]);
            }
        }
        __syncwarp();
    } else {
        const int wg = warp >> 2;
        for (int i = 0; i < nkb; i++) {
            const int s = i % S::stages;
            cu_mbar_wait(&full[s], (unsigned)(i / S::stages) & 1u);
            if constexpr (VAR == CU_SM90_VAR_LOADS) { /* the stage landed: release it unread */
                if (lane == 0) sm90_mbar_arrive(&empty[s]);
                continue;
            }
            const uint32_t sa = cu_smem_addr(smem + s * S::stage_bytes) + wg * (SM90_ROWS * SM90_ROW_BYTES);
            const uint32_t sb = cu_smem_addr(smem + s * S::stage_bytes + S::a_bytes);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < SM90_BK / 16; kk++)
#pragma unroll
                for (int t = 0; t < NT; t++)
                    wg_m64n64k16(acc[t], sm90_desc(sa + kk * 32),
                                 sm90_desc(sb + t * (SM90_TOK * SM90_ROW_BYTES) + kk * 32), 1);
            wg_commit();
            wg_wait<1>(); /* the previous stage's group is done: its stage is free */
            if (i > 0 && lane == 0) sm90_mbar_arrive(&empty[(i - 1) % S::stages]);
        }
        wg_wait<0>();
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int r = 0; r < 32; r++) wg_pin(acc[t][r]);
        if constexpr (VAR == CU_SM90_VAR_MAIN) {
            float sum = 0.f;
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int r = 0; r < 32; r++) sum += acc[t][r];
            sm90_keep(a, sum);
        }
    }
    __syncthreads(); /* every load landed and every wgmma is done: the stages become the output tile */
    if constexpr (VAR == CU_SM90_VAR_LOADS || VAR == CU_SM90_VAR_MAIN) return;
    if constexpr (VAR == CU_SM90_VAR_TRIGGER_MAIN) sm90_launch_dependents();
    sm90_grid_wait(); /* (done long ago: the producer waited before loading tokens) orders Y's accesses */

    /* accumulator (t, r = 4 j + 2 h + c) of lane l in warp w of warpgroup wg: weight row
     * wg 64 + w 16 + l / 4 + 8 h, token t 64 + 8 j + 2 (l % 4) + c; staged as T[token][row] */
    float *T = (float *)smem;
    if (warp < 4 * WG) {
        const int rl = (warp >> 2) * SM90_ROWS + (warp & 3) * 16 + (lane >> 2), cl = 2 * (lane & 3);
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int c = 0; c < 2; c++)
                        T[(t * SM90_TOK + 8 * j + cl + c) * S::ld + rl + 8 * h] = acc[t][4 * j + 2 * h + c];
    }
    cg::cluster_group cluster = cg::this_cluster();
    const int splits = (int)gridDim.y; /* the cluster: this tile's K slices */
    cluster.sync(); /* every slice's tile is staged (and visible to the cluster) */

    if (VAR != CU_SM90_VAR_STAGED && warp < 4 * WG) {
        const int vt = min(S::toks, a.M - tok0); /* tokens of this tile that exist */
        const int items = vt * (S::rows / 4);
        const int rank = (int)cluster.block_rank();
        const int beg = (int)((long long)items * rank / splits), end = (int)((long long)items * (rank + 1) / splits);
        const bool vec = (a.N & 3) == 0 && ((uintptr_t)a.Y & (a.acc ? 15u : 7u)) == 0;
        if (splits == 1) {
            const float *const src[1] = {T};
            sm90_out<SM90_GROUP_1, 1, S::rows / 4, S::ld, VAR == CU_SM90_VAR_REDUCED>(a, src, 1, row0, tok0, beg, end,
                                                                                   tid, S::consumers, vec);
        } else {
            const float *src[SM90_SPLITS_MAX];
#pragma unroll
            for (int q = 0; q < SM90_SPLITS_MAX; q++) src[q] = cluster.map_shared_rank(T, q < splits ? q : 0);
            sm90_out<S::group_split, SM90_SPLITS_MAX, S::rows / 4, S::ld, VAR == CU_SM90_VAR_REDUCED>(
                a, src, splits, row0, tok0, beg, end, tid, S::consumers, vec);
        }
    }
    if (splits > 1) cluster.sync(); /* no block leaves while the cluster still reads its tile */
#endif
}
#pragma nv_diag_default 128

/* ---- host ------------------------------------------------------------------------------------ */

typedef struct sm90_grid {
    int gx, gy, gz;      /* weight-row tiles, K slices (the cluster), token tiles */
    int kb_per_split;
} sm90_grid;

static int cfg_known(const cu_sm90_cfg *c) {
    const int nt_ok = c->nt == 1 || c->nt == 2 || (c->nt == 4 && c->wg <= 2); /* (4, 4): too many registers */
    return (c->wg == 1 || c->wg == 2 || c->wg == 4) && nt_ok && c->splits >= 1 && c->splits <= SM90_SPLITS_MAX;
}

/* The grid of a configuration; the K slices as even as whole k blocks allow (a requested split
 * that would leave a slice empty becomes fewer slices). */
static sm90_grid grid_of(const cu_sm90_cfg *c, int M, int N, int K) {
    sm90_grid g;
    const int nkb = (K + SM90_BK - 1) / SM90_BK;
    g.gx = (N + c->wg * SM90_ROWS - 1) / (c->wg * SM90_ROWS);
    g.gz = (M + c->nt * SM90_TOK - 1) / (c->nt * SM90_TOK);
    g.kb_per_split = (nkb + c->splits - 1) / c->splits;
    g.gy = (nkb + g.kb_per_split - 1) / g.kb_per_split;
    return g;
}

static int shape_ok(const cu_gemm_ctx *g, int M, int N, int K, int f32) {
    /* K % 8: the tensor maps' row strides are multiples of 16 bytes */
    return g->sm90 && !f32 && M >= 1 && M <= CU_SM90_MAX_M && N >= 1 && K >= 8 && K % 8 == 0;
}

int cu_sm90_usable(const cu_gemm_ctx *g, const cu_sm90_cfg *c, const void *W, const void *X, const void *Y, int M,
                   int N, int K, int f32) {
    if (!shape_ok(g, M, N, K, f32) || !cfg_known(c)) return 0;
    if (((uintptr_t)W & 15) || ((uintptr_t)X & 15) || !Y) return 0; /* TMA's global addresses */
    return 1;
}

int cu_sm90_candidates(const cu_gemm_ctx *g, int M, int N, int K, int f32, cu_sm90_cfg *out, int max) {
    if (!shape_ok(g, M, N, K, f32)) return 0;
    /* the fewest token sub-tiles covering M (at most 4: larger M takes several token tiles), and half
     * as many (twice the token tiles: more blocks without splitting K, the weights' second read
     * from L2) */
    const int need = (M + SM90_TOK - 1) / SM90_TOK;
    const int nt_max = need <= 1 ? 1 : need <= 2 ? 2 : 4;
    int n = 0;
    for (int nt = nt_max; nt >= 1 && nt * 2 >= nt_max; nt /= 2)
        for (int wg = 1; wg <= 4; wg *= 2)
            for (int i = 0; i < SM90_N_SPLIT_CHOICES && n < max; i++) {
                const cu_sm90_cfg c = {wg, nt, SM90_SPLIT_CHOICES[i]};
                if (!cfg_known(&c)) continue;
                const sm90_grid gr = grid_of(&c, M, N, K);
                if (gr.gy != c.splits) continue; /* a duplicate of a smaller split */
                /* 4 warpgroups (a quarter of the tokens' reads from L2) only where the widest split
                 * still fills the GPU */
                if (wg == 4 && gr.gx * gr.gz * SM90_SPLITS_MAX < g->sm90_sms) continue;
                if (c.splits > 1) {
                    if (gr.kb_per_split < SM90_MIN_KB_PER_SPLIT) continue;
                    /* no more splitting once the unsplit tiles already fill the GPU twice over */
                    if (gr.gx * gr.gz * (c.splits - 1) >= 2 * g->sm90_sms) continue;
                }
                out[n++] = c;
            }
    return n;
}

template <int WG, int NT, int VAR = CU_SM90_VAR_FULL>
static cudaError_t set_smem() {
    return cudaFuncSetAttribute(k_gemm_sm90<WG, NT, VAR>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                sm90_shape<WG, NT>::smem);
}

int cu_sm90_init(cu_gemm_ctx *g, int wanted, squad_err *err) {
    g->sm90 = 0;
    if (!wanted) return 0; /* cuda_knobs.gemm_sm90 0: cuBLASLt only */
    int dev = 0, major = 0, minor = 0;
    CU_TRY(cudaGetDevice(&dev));
    CU_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CU_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9 || minor != 0) return 0; /* an sm_90a cubin loads on compute capability 9.0 only */
    CU_TRY(cudaDeviceGetAttribute(&g->sm90_sms, cudaDevAttrMultiProcessorCount, dev));
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn) {
        (void)cudaGetLastError();
        return 0;
    }
    if (set_smem<1, 1>() != cudaSuccess || set_smem<1, 2>() != cudaSuccess || set_smem<1, 4>() != cudaSuccess ||
        set_smem<2, 1>() != cudaSuccess || set_smem<2, 2>() != cudaSuccess || set_smem<2, 4>() != cudaSuccess ||
        set_smem<4, 1>() != cudaSuccess || set_smem<4, 2>() != cudaSuccess) {
        (void)cudaGetLastError(); /* no loadable image of the kernels: cuBLASLt only */
        return 0;
    }
    /* one int: the probe's answer (the split-K sum needs no counters: it stays inside a cluster) */
    CU_TRY(cudaMalloc(&g->sm90_probe, sizeof(int)));
    CU_TRY(cudaMemset(g->sm90_probe, 0, sizeof(int)));
    k_sm90_probe<<<1, 1>>>(g->sm90_probe);
    CU_LAUNCH_CHECK("k_sm90_probe");
    int has = 0;
    CU_TRY(cudaMemcpy(&has, g->sm90_probe, sizeof has, cudaMemcpyDeviceToHost));
    g->sm90_encode = fn;
    g->sm90 = has == 1;
    return 0;
}

void cu_sm90_free(cu_gemm_ctx *g) {
    if (g->sm90_probe) cudaFree(g->sm90_probe);
    g->sm90_probe = NULL;
    g->sm90 = 0;
}

/* A row-major [rows][K] bf16 matrix as a tensor map of (SM90_BK x box_rows) tiles, 128-byte swizzle. */
static int make_map(const cu_gemm_ctx *g, CUtensorMap *m, const void *base, int rows, int K, int box_rows,
                    squad_err *err) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = (PFN_cuTensorMapEncodeTiled_v12000)g->sm90_encode;
    const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)K * sizeof(bf16)};
    const cuuint32_t box[2] = {SM90_BK, (cuuint32_t)box_rows};
    const cuuint32_t elem[2] = {1, 1};
    const CUresult r = encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box, elem,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return cu_err(err, SQUAD_E_BACKEND, "CUDA: cuTensorMapEncodeTiled (%d x %d, box %d) failed (%d)", rows, K,
                      box_rows, (int)r);
    return 0;
}

/* One launch: the grid with the K slices of a tile as one cluster (a cluster of one when K is not split). */
template <int WG, int NT, int VAR = CU_SM90_VAR_FULL>
static cudaError_t launch(const sm90_grid *gr, const CUtensorMap *mw, const CUtensorMap *mx, const sm90_args *a,
                          cudaStream_t st) {
    cudaLaunchAttribute at[2] = {};
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = (unsigned)gr->gy;
    at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization; /* see sm90_grid_wait */
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3((unsigned)gr->gx, (unsigned)gr->gy, (unsigned)gr->gz);
    lc.blockDim = dim3(sm90_shape<WG, NT>::threads);
    lc.dynamicSmemBytes = sm90_shape<WG, NT>::smem;
    lc.stream = st;
    lc.attrs = at;
    lc.numAttrs = 2;
    if (cudaLaunchKernelEx(&lc, k_gemm_sm90<WG, NT, VAR>, *mw, *mx, *a) == cudaSuccess) return cudaSuccess;
    (void)cudaGetLastError(); /* refused with the programmatic dependency: launch plainly ordered */
    lc.numAttrs = 1;
    return cudaLaunchKernelEx(&lc, k_gemm_sm90<WG, NT, VAR>, *mw, *mx, *a);
}

/* What a launch of configuration c takes for this call: its grid, the two tensor maps, the arguments. */
static int call_setup(const cu_gemm_ctx *g, const cu_sm90_cfg *c, const void *W, const void *X, void *Y, int M, int N,
                      int K, int acc, sm90_grid *gr, CUtensorMap *mw, CUtensorMap *mx, sm90_args *a, squad_err *err) {
    if (!cu_sm90_usable(g, c, W, X, Y, M, N, K, 0))
        return cu_err(err, SQUAD_E_BACKEND, "sm_90a GEMM: %d x %d x %d (wg %d, nt %d, splits %d) not supported here",
                      M, N, K, c->wg, c->nt, c->splits);
    *gr = grid_of(c, M, N, K);
    int rc;
    if ((rc = make_map(g, mw, W, N, K, c->wg * SM90_ROWS, err))) return rc;
    if ((rc = make_map(g, mx, X, M, K, c->nt * SM90_TOK, err))) return rc;
    a->Y = Y;
    a->M = M, a->N = N, a->K = K, a->acc = acc ? 1 : 0;
    a->kb_per_split = gr->kb_per_split;
    return 0;
}

int cu_sm90_gemm(const cu_gemm_ctx *g, const cu_sm90_cfg *c, const void *W, const void *X, void *Y, int M, int N,
                 int K, int acc, cudaStream_t st, squad_err *err) {
    sm90_grid gr = {};
    CUtensorMap mw, mx;
    sm90_args a = {};
    const int rc = call_setup(g, c, W, X, Y, M, N, K, acc, &gr, &mw, &mx, &a, err);
    if (rc) return rc;
    cudaError_t e;
    switch (c->wg * 8 + c->nt) {
    case 9: e = launch<1, 1>(&gr, &mw, &mx, &a, st); break;
    case 10: e = launch<1, 2>(&gr, &mw, &mx, &a, st); break;
    case 12: e = launch<1, 4>(&gr, &mw, &mx, &a, st); break;
    case 17: e = launch<2, 1>(&gr, &mw, &mx, &a, st); break;
    case 18: e = launch<2, 2>(&gr, &mw, &mx, &a, st); break;
    case 20: e = launch<2, 4>(&gr, &mw, &mx, &a, st); break;
    case 33: e = launch<4, 1>(&gr, &mw, &mx, &a, st); break;
    default: e = launch<4, 2>(&gr, &mw, &mx, &a, st); break; /* cfg_known leaves only (4, 2) */
    }
    if (e != cudaSuccess) return cu_fail(err, "k_gemm_sm90 (cudaLaunchKernelEx)", e, __FILE__, __LINE__);
    return 0;
}

/* ---- test variants (cuda_internal.cuh's CU_SM90_VAR_*; never launched by the backend) ---------- */

/* The configurations the variants are instantiated for: nt <= 2 (a hit's M <= 128), any wg; 0, or
 * SQUAD_E_INVALID with err filled. */
static int variant_check(const cu_sm90_cfg *c, int var, squad_err *err) {
    if (cfg_known(c) && c->nt <= 2 && var >= 0 && var < CU_SM90_N_VARS) return 0;
    return cu_err(err, SQUAD_E_INVALID, "sm_90a GEMM variant %d of (wg %d, nt %d, splits %d): not built", var, c->wg,
                  c->nt, c->splits);
}

/* One variant of the configurations (wg, nt): ready (its shared-memory limit set) or launched. */
template <int VAR>
static cudaError_t variant_op(const cu_sm90_cfg *c, int ready, const sm90_grid *gr, const CUtensorMap *mw,
                              const CUtensorMap *mx, const sm90_args *a, cudaStream_t st) {
    switch (c->wg * 8 + c->nt) {
    case 9: return ready ? set_smem<1, 1, VAR>() : launch<1, 1, VAR>(gr, mw, mx, a, st);
    case 10: return ready ? set_smem<1, 2, VAR>() : launch<1, 2, VAR>(gr, mw, mx, a, st);
    case 17: return ready ? set_smem<2, 1, VAR>() : launch<2, 1, VAR>(gr, mw, mx, a, st);
    case 18: return ready ? set_smem<2, 2, VAR>() : launch<2, 2, VAR>(gr, mw, mx, a, st);
    case 33: return ready ? set_smem<4, 1, VAR>() : launch<4, 1, VAR>(gr, mw, mx, a, st);
    default: return ready ? set_smem<4, 2, VAR>() : launch<4, 2, VAR>(gr, mw, mx, a, st); /* (4, 2) */
    }
}

static cudaError_t variant_dispatch(const cu_sm90_cfg *c, int var, int ready, const sm90_grid *gr,
                                    const CUtensorMap *mw, const CUtensorMap *mx, const sm90_args *a,
                                    cudaStream_t st) {
    switch (var) {
    case CU_SM90_VAR_FULL: return variant_op<CU_SM90_VAR_FULL>(c, ready, gr, mw, mx, a, st);
    case CU_SM90_VAR_LAUNCH: return variant_op<CU_SM90_VAR_LAUNCH>(c, ready, gr, mw, mx, a, st);
    case CU_SM90_VAR_EMPTY: return variant_op<CU_SM90_VAR_EMPTY>(c, ready, gr, mw, mx, a, st);
    case CU_SM90_VAR_LOADS: return variant_op<CU_SM90_VAR_LOADS>(c, ready, gr, mw, mx, a, st);
    case CU_SM90_VAR_MAIN: return variant_op<CU_SM90_VAR_MAIN>(c, ready, gr, mw, mx, a, st);
    case CU_SM90_VAR_STAGED: return variant_op<CU_SM90_VAR_STAGED>(c, ready, gr, mw, mx, a, st);
    case CU_SM90_VAR_REDUCED: return variant_op<CU_SM90_VAR_REDUCED>(c, ready, gr, mw, mx, a, st);
    case CU_SM90_VAR_PREFETCH: return variant_op<CU_SM90_VAR_PREFETCH>(c, ready, gr, mw, mx, a, st);
    case CU_SM90_VAR_TRIGGER_MAIN: return variant_op<CU_SM90_VAR_TRIGGER_MAIN>(c, ready, gr, mw, mx, a, st);
    default: return variant_op<CU_SM90_VAR_TRIGGER_START>(c, ready, gr, mw, mx, a, st);
    }
}

int cu_sm90_variant_ready(const cu_sm90_cfg *c, int var, squad_err *err) {
    const int rc = variant_check(c, var, err);
    if (rc) return rc;
    const cudaError_t e = variant_dispatch(c, var, 1, NULL, NULL, NULL, NULL, 0);
    if (e != cudaSuccess) return cu_fail(err, "k_gemm_sm90 variant (cudaFuncSetAttribute)", e, __FILE__, __LINE__);
    return 0;
}

int cu_sm90_variant_gemm(const cu_gemm_ctx *g, const cu_sm90_cfg *c, int var, const void *W, const void *X, void *Y,
                         int M, int N, int K, int acc, cudaStream_t st, squad_err *err) {
    sm90_grid gr = {};
    CUtensorMap mw, mx;
    sm90_args a = {};
    int rc = variant_check(c, var, err);
    if (!rc) rc = call_setup(g, c, W, X, Y, M, N, K, acc, &gr, &mw, &mx, &a, err);
    if (rc) return rc;
    const cudaError_t e = variant_dispatch(c, var, 0, &gr, &mw, &mx, &a, st);
    if (e != cudaSuccess) return cu_fail(err, "k_gemm_sm90 variant (cudaLaunchKernelEx)", e, __FILE__, __LINE__);
    return 0;
}
