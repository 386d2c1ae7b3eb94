/*
 * k_gemm_sm90.cu — the projections of a short chunk (a cache hit's 32-512 tokens) on Hopper's own
 * instructions: TMA (cp.async.bulk.tensor) streams the weights and the tokens into shared memory,
 * wgmma multiplies them. Offered to k_gemm.cu's tuning as one more candidate per shape, so
 * cuBLASLt still runs every shape where it is faster.
 *
 * Why: with M tokens in the tens or hundreds, a projection is a pass over its weight matrix (a
 * 1024 x 6144 bf16 weight is 12.6 MB, ~3 us at the H200's 4.2 TB/s), and cuBLASLt's kernels, made for
 * large M, took 5.5-8.1 us. Here the weights are wgmma's A operand (64 rows a warpgroup) and the
 * tokens its N dimension (64 a sub-tile), i.e. the kernel computes Y^T = W X^T, so the big operand
 * fills the M = 64 side every instruction needs and a short chunk wastes no weight bytes.
 *
 * Design:
 *   - A block: WG consumer warpgroups (64 weight rows each; two share every token tile, halving the
 *     tokens' L2 traffic) and NT token sub-tiles of 64 (NT * 64 tokens, up to 256), over a slice of
 *     K (split K: grid.y). Grid: weight-row tiles x K slices x token tiles.
 *   - Pipeline: STAGES shared-memory stages of 64 k (one 128-byte swizzle row of bf16) each; thread
 *     0 issues both tiles of a stage by TMA (128-byte swizzle, out-of-range rows and k zero-filled),
 *     completing on that stage's mbarrier; every warpgroup waits on it, runs 4 x NT wgmma
 *     m64n64k16, waits for them, and after a block barrier thread 0 refills the stage STAGES steps
 *     ahead. STAGES - 1 loads are in flight while a stage is multiplied.
 *   - Epilogue from the accumulators (row = weight row, column = token): bf16 store, or fp32 added
 *     into the residual. With K split, each block writes its partial tile to the workspace in
 *     register order (coalesced), and the last block of a tile to arrive (a per-tile counter) sums
 *     the partials in slice order and applies the epilogue: the result's bits do not depend on which
 *     block finishes first, so a configuration always gives the same bits (the GEMM plan file's
 *     promise). The last block resets the counter for the next call.
 *   - Build: this file alone is compiled for sm_90a (-gencode arch=compute_90a,code=sm_90a; see
 *     CMakeLists.txt), and its device code is guarded by __CUDA_ARCH_FEAT_SM90_ALL so it also
 *     compiles, to nothing, for any other target. At run time cu_sm90_init uses it only on compute
 *     capability 9.0 (the only GPUs an sm_90a cubin loads on), and only after a probe kernel from
 *     the same cubin reports that the Hopper code is in it.
 * The tensor maps are made per call on the host (cuTensorMapEncodeTiled through the runtime's
 * driver entry point, so nothing links libcuda) and passed as __grid_constant__ parameters, which a
 * captured graph keeps.
 */
#include "cuda_internal.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdlib.h>

#define SM90_BK 64          /* k per stage: 64 bf16 = one 128-byte swizzle row */
#define SM90_ROWS 64        /* weight rows per consumer warpgroup (wgmma's M) */
#define SM90_TOK 64         /* tokens per sub-tile (wgmma's N) */
#define SM90_ROW_BYTES 128  /* a tile row in shared memory: SM90_BK bf16 */
#define SM90_SMEM_BUDGET (200 * 1024) /* of the 227 KB a block may have */
#define SM90_MAX_STAGES 8
#define SM90_ALIGN 1024     /* the 128-byte swizzle repeats every 8 rows: tiles start on 1024 bytes */
#define SM90_SPLITS_MAX 16
#define SM90_MIN_KB_PER_SPLIT 2 /* a K slice shorter than this spends more on its epilogue than it saves */
static const int SM90_SPLIT_CHOICES[] = {1, 2, 3, 4, 6, 8, 12, 16};
#define SM90_N_SPLIT_CHOICES ((int)(sizeof SM90_SPLIT_CHOICES / sizeof SM90_SPLIT_CHOICES[0]))

template <int WG, int NT>
struct sm90_shape {
    static constexpr int a_bytes = WG * SM90_ROWS * SM90_ROW_BYTES;
    static constexpr int b_bytes = NT * SM90_TOK * SM90_ROW_BYTES;
    static constexpr int stage_bytes = a_bytes + b_bytes;
    static constexpr int stages =
        SM90_SMEM_BUDGET / stage_bytes < SM90_MAX_STAGES ? SM90_SMEM_BUDGET / stage_bytes : SM90_MAX_STAGES;
    static constexpr int smem = stages * stage_bytes + SM90_ALIGN; /* + room to align the start */
    static constexpr int threads = 128 * WG;
    static constexpr int regs = NT * 32; /* accumulators per thread */
};

typedef struct sm90_args {
    void *Y;      /* [M][N]: bf16 (acc 0) or fp32 (acc 1, added into) */
    float *part;  /* split K: [tiles][splits][regs][threads] partial tiles */
    int *cnt;     /* split K: [tiles] arrivals */
    int M, N, K, acc;
    int kb_per_split; /* k blocks (of SM90_BK) per K slice */
} sm90_args;

/* ---- device code (sm_90a only) ---------------------------------------------------------------- */

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* A shared-memory matrix descriptor for a K-major tile stored with the 128-byte swizzle: rows of
 * 128 bytes, 8-row groups 1024 bytes apart (the stride offset); the leading offset is unused in
 * this layout (1 by convention). Stepping k by 16 within the swizzle row adds 32 bytes. */
__device__ __forceinline__ uint64_t sm90_desc(uint32_t saddr) {
    uint64_t d = (uint64_t)((saddr & 0x3FFFFu) >> 4);
    d |= (uint64_t)1 << 16;
    d |= (uint64_t)(1024 >> 4) << 32;
    d |= (uint64_t)1 << 62;
    return d;
}

__device__ __forceinline__ void sm90_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void sm90_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void sm90_wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* Keeps the compiler from moving an accumulator's use across the asynchronous wgmma's wait. */
__device__ __forceinline__ void sm90_fence_reg(float &x) { asm volatile("" : "+f"(x)::"memory"); }

/* D[64][64] += A[64][16] B[16][64]: A (weights) and B (tokens) both K-major in shared memory, fp32
 * accumulators in the m64nNk16 fragment layout. */
__device__ __forceinline__ void sm90_wgmma_m64n64k16(float (&d)[32], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(1)
        : "memory");
}

/* A 2-D tile (box) of a tensor map into shared memory, counted on bar; x is the inner (k) coordinate. */
__device__ __forceinline__ void sm90_tma_2d(void *smem, const CUtensorMap *map, int x, int y, uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(cu_smem_addr(smem)),
        "l"((uint64_t)map), "r"(x), "r"(y), "r"(cu_smem_addr(bar))
        : "memory");
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

template <int WG, int NT>
__global__ void __launch_bounds__(128 * WG, 1)
    k_gemm_sm90(const __grid_constant__ CUtensorMap tmW, const __grid_constant__ CUtensorMap tmX, const sm90_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef sm90_shape<WG, NT> S;
    extern __shared__ uint8_t sm90_smem_raw[];
    __shared__ uint64_t full[S::stages];
    __shared__ int is_last;
    const uint32_t mis = cu_smem_addr(sm90_smem_raw) & (SM90_ALIGN - 1);
    uint8_t *smem = sm90_smem_raw + (mis ? SM90_ALIGN - mis : 0);

    const int tid = threadIdx.x;
    const int row0 = blockIdx.x * (WG * SM90_ROWS), tok0 = blockIdx.z * (NT * SM90_TOK);
    const int nkb_all = (a.K + SM90_BK - 1) / SM90_BK;
    const int kb0 = blockIdx.y * a.kb_per_split;
    const int nkb = min(a.kb_per_split, nkb_all - kb0); /* >= 1: the host sizes the slices */

    if (tid == 0) {
        for (int s = 0; s < S::stages; s++) cu_mbar_init(&full[s], 1);
        cu_mbar_init_fence();
    }
    __syncthreads();
    if (tid == 0)
        for (int i = 0; i < S::stages && i < nkb; i++) {
            uint8_t *st = smem + i * S::stage_bytes;
            cu_mbar_expect_tx(&full[i], S::stage_bytes);
            sm90_tma_2d(st, &tmW, (kb0 + i) * SM90_BK, row0, &full[i]);
            sm90_tma_2d(st + S::a_bytes, &tmX, (kb0 + i) * SM90_BK, tok0, &full[i]);
        }

    float acc[NT][32];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int r = 0; r < 32; r++) acc[t][r] = 0.f;

    const int wg = tid >> 7;
    for (int i = 0; i < nkb; i++) {
        const int s = i % S::stages;
        cu_mbar_wait(&full[s], (unsigned)(i / S::stages) & 1u);
        const uint32_t sa = cu_smem_addr(smem + s * S::stage_bytes) + wg * (SM90_ROWS * SM90_ROW_BYTES);
        const uint32_t sb = cu_smem_addr(smem + s * S::stage_bytes + S::a_bytes);
        sm90_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < SM90_BK / 16; kk++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                sm90_wgmma_m64n64k16(acc[t], sm90_desc(sa + kk * 32),
                                     sm90_desc(sb + t * (SM90_TOK * SM90_ROW_BYTES) + kk * 32));
        sm90_wgmma_commit();
        sm90_wgmma_wait0();
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int r = 0; r < 32; r++) sm90_fence_reg(acc[t][r]);
        __syncthreads(); /* every warpgroup is done reading stage s */
        if (tid == 0 && i + S::stages < nkb) {
            uint8_t *st = smem + s * S::stage_bytes;
            const int kx = (kb0 + i + S::stages) * SM90_BK;
            cu_mbar_expect_tx(&full[s], S::stage_bytes);
            sm90_tma_2d(st, &tmW, kx, row0, &full[s]);
            sm90_tma_2d(st + S::a_bytes, &tmX, kx, tok0, &full[s]);
        }
    }

    const int splits = gridDim.y;
    if (splits > 1) {
        const int tile = blockIdx.z * gridDim.x + blockIdx.x;
        const size_t tile_elems = (size_t)S::regs * S::threads;
        float *mine = a.part + ((size_t)tile * splits + blockIdx.y) * tile_elems + tid;
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int r = 0; r < 32; r++) mine[(size_t)(t * 32 + r) * S::threads] = acc[t][r];
        __threadfence();
        __syncthreads();
        if (tid == 0) is_last = atomicAdd(&a.cnt[tile], 1) == splits - 1;
        __syncthreads();
        if (!is_last) return;
        __threadfence();
        const float *base = a.part + (size_t)tile * splits * tile_elems + tid;
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int r = 0; r < 32; r++) {
                float v = 0.f;
                for (int s = 0; s < splits; s++) v += __ldcg(base + s * tile_elems + (size_t)(t * 32 + r) * S::threads);
                acc[t][r] = v;
            }
        if (tid == 0) a.cnt[tile] = 0; /* ready for the next call */
    }

    /* accumulator (t, r = 4 j + 2 h + c) of lane l in warp w of warpgroup wg: weight row
     * wg 64 + w 16 + l / 4 + 8 h, token t 64 + 8 j + 2 (l % 4) + c */
    const int w = (tid >> 5) & 3, l = tid & 31;
    const int rbase = row0 + wg * SM90_ROWS + w * 16 + (l >> 2), cbase = tok0 + 2 * (l & 3);
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int row = rbase + 8 * h, tok = cbase + t * SM90_TOK + 8 * j + c;
                    if (row >= a.N || tok >= a.M) continue;
                    const size_t o = (size_t)tok * a.N + row;
                    const float v = acc[t][4 * j + 2 * h + c];
                    if (a.acc) ((float *)a.Y)[o] += v;
                    else ((bf16 *)a.Y)[o] = __float2bfloat16(v);
                }
#endif
}

/* ---- host ------------------------------------------------------------------------------------ */

typedef struct sm90_grid {
    int gx, gy, gz;      /* weight-row tiles, K slices, token tiles */
    int kb_per_split;
    size_t part_bytes;   /* split K's workspace */
} sm90_grid;

static int cfg_known(const cu_sm90_cfg *c) {
    return (c->wg == 1 || c->wg == 2) && (c->nt == 1 || c->nt == 2 || c->nt == 4) && c->splits >= 1 &&
           c->splits <= SM90_SPLITS_MAX;
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
    g.part_bytes = g.gy > 1 ? (size_t)g.gx * g.gz * g.gy * (c->wg * SM90_ROWS) * (c->nt * SM90_TOK) * sizeof(float) : 0;
    return g;
}

static int shape_ok(const cu_gemm_ctx *g, int M, int N, int K, int f32) {
    /* K % 8: the tensor maps' row strides are multiples of 16 bytes */
    return g->sm90 && !f32 && M >= 1 && M <= CU_SM90_MAX_M && N >= 1 && K >= 8 && K % 8 == 0;
}

static int grid_fits(const cu_gemm_ctx *g, const sm90_grid *gr) {
    if (gr->gy == 1) return 1;
    return gr->gx * gr->gz <= CU_SM90_COUNTERS && gr->part_bytes <= g->ws_bytes && g->ws != NULL;
}

int cu_sm90_usable(const cu_gemm_ctx *g, const cu_sm90_cfg *c, const void *W, const void *X, const void *Y, int M,
                   int N, int K, int f32) {
    if (!shape_ok(g, M, N, K, f32) || !cfg_known(c)) return 0;
    if (((uintptr_t)W & 15) || ((uintptr_t)X & 15) || !Y) return 0; /* TMA's global addresses */
    const sm90_grid gr = grid_of(c, M, N, K);
    return grid_fits(g, &gr);
}

int cu_sm90_candidates(const cu_gemm_ctx *g, int M, int N, int K, int f32, cu_sm90_cfg *out, int max) {
    if (!shape_ok(g, M, N, K, f32)) return 0;
    /* the fewest token sub-tiles covering M (at most 4: larger M takes several token tiles) */
    const int need = (M + SM90_TOK - 1) / SM90_TOK;
    const int nt = need <= 1 ? 1 : need <= 2 ? 2 : 4;
    int n = 0;
    for (int wg = 1; wg <= 2; wg++)
        for (int i = 0; i < SM90_N_SPLIT_CHOICES && n < max; i++) {
            const cu_sm90_cfg c = {wg, nt, SM90_SPLIT_CHOICES[i]};
            const sm90_grid gr = grid_of(&c, M, N, K);
            if (gr.gy != c.splits || !grid_fits(g, &gr)) continue; /* a duplicate, or too large */
            if (c.splits > 1) {
                if (gr.kb_per_split < SM90_MIN_KB_PER_SPLIT) continue;
                /* no more splitting once the unsplit tiles already fill the GPU twice over */
                if (gr.gx * gr.gz * (c.splits - 1) >= 2 * g->sm90_sms) continue;
            }
            out[n++] = c;
        }
    return n;
}

template <int WG, int NT>
static cudaError_t set_smem() {
    return cudaFuncSetAttribute(k_gemm_sm90<WG, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                sm90_shape<WG, NT>::smem);
}

int cu_sm90_init(cu_gemm_ctx *g, squad_err *err) {
    g->sm90 = 0;
    const char *off = getenv("SQUAD_GEMM_SM90"); /* "0": cuBLASLt only (an experiment switch) */
    if (off && off[0] == '0') return 0;
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
        set_smem<2, 1>() != cudaSuccess || set_smem<2, 2>() != cudaSuccess || set_smem<2, 4>() != cudaSuccess) {
        (void)cudaGetLastError(); /* no loadable image of the kernels: cuBLASLt only */
        return 0;
    }
    /* the counters, and one more int for the probe's answer */
    CU_TRY(cudaMalloc(&g->sm90_cnt, sizeof(int) * (CU_SM90_COUNTERS + 1)));
    CU_TRY(cudaMemset(g->sm90_cnt, 0, sizeof(int) * (CU_SM90_COUNTERS + 1)));
    k_sm90_probe<<<1, 1>>>(g->sm90_cnt + CU_SM90_COUNTERS);
    CU_LAUNCH_CHECK("k_sm90_probe");
    int has = 0;
    CU_TRY(cudaMemcpy(&has, g->sm90_cnt + CU_SM90_COUNTERS, sizeof has, cudaMemcpyDeviceToHost));
    g->sm90_encode = fn;
    g->sm90 = has == 1;
    return 0;
}

void cu_sm90_free(cu_gemm_ctx *g) {
    if (g->sm90_cnt) cudaFree(g->sm90_cnt);
    g->sm90_cnt = NULL;
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

template <int WG, int NT>
static void launch(const sm90_grid *gr, const CUtensorMap *mw, const CUtensorMap *mx, const sm90_args *a,
                   cudaStream_t st) {
    k_gemm_sm90<WG, NT><<<dim3(gr->gx, gr->gy, gr->gz), sm90_shape<WG, NT>::threads, sm90_shape<WG, NT>::smem, st>>>(
        *mw, *mx, *a);
}

int cu_sm90_gemm(const cu_gemm_ctx *g, const cu_sm90_cfg *c, const void *W, const void *X, void *Y, int M, int N,
                 int K, int acc, cudaStream_t st, squad_err *err) {
    if (!cu_sm90_usable(g, c, W, X, Y, M, N, K, 0))
        return cu_err(err, SQUAD_E_BACKEND, "sm_90a GEMM: %d x %d x %d (wg %d, nt %d, splits %d) not supported here",
                      M, N, K, c->wg, c->nt, c->splits);
    const sm90_grid gr = grid_of(c, M, N, K);
    CUtensorMap mw, mx;
    int rc;
    if ((rc = make_map(g, &mw, W, N, K, c->wg * SM90_ROWS, err))) return rc;
    if ((rc = make_map(g, &mx, X, M, K, c->nt * SM90_TOK, err))) return rc;
    sm90_args a;
    a.Y = Y;
    a.part = (float *)g->ws;
    a.cnt = g->sm90_cnt;
    a.M = M, a.N = N, a.K = K, a.acc = acc ? 1 : 0;
    a.kb_per_split = gr.kb_per_split;
    switch (c->wg * 8 + c->nt) {
    case 9: launch<1, 1>(&gr, &mw, &mx, &a, st); break;
    case 10: launch<1, 2>(&gr, &mw, &mx, &a, st); break;
    case 12: launch<1, 4>(&gr, &mw, &mx, &a, st); break;
    case 17: launch<2, 1>(&gr, &mw, &mx, &a, st); break;
    case 18: launch<2, 2>(&gr, &mw, &mx, &a, st); break;
    default: launch<2, 4>(&gr, &mw, &mx, &a, st); break; /* cfg_known leaves only (2, 4) */
    }
    CU_LAUNCH_CHECK("k_gemm_sm90");
    return 0;
}
