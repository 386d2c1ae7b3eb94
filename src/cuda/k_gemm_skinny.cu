/*
 * k_gemm_skinny.cu — a weight-streaming GEMM for few rows (M <= CU_SKINNY_MAX_M): the
 * projections of a cache hit's question, where cuBLASLt spends ~2x the time of one read of W.
 *
 * Y[M][N] = X[M][K] W[N][K]^T, bf16 W and X, fp32 accumulation; acc = 0: Y bf16; acc = 1: Y fp32
 * += (the residual add). k_gemm.cu chooses it per shape (timed against cuBLASLt when tuning).
 *
 * Design:
 *  - The weight dominates the bytes (16.8 MB for the 0.8B GDN in_proj against 32 KB..512 KB of
 *    X), so each CTA owns BN rows of W (a column tile of Y) and every row of X (MT of them, M
 *    padded to 16 / 32 / 64 / 128; M > 128 takes a second M tile in grid z, whose W read mostly
 *    hits L2 because both tiles run in the same wave). W is read exactly once from HBM, with
 *    16-byte cp.async loads (a CTA's W tile row is 128 contiguous bytes per stage) and an L2
 *    evict-first policy so it does not push the activations out of L2. X is re-read from L2 by
 *    every column tile (M / BN times the W bytes: why BN is as large as the registers allow).
 *  - Tensor cores: mma.sync m16n8k16 with W as the A operand (16 output columns n) and X as B
 *    (8 rows m), so M is padded only to 8 per fragment and fragments past M are skipped
 *    (warp-uniform). 8 warps as 4 (n) x 2 (m): a warp holds (BN / 4) x (MT / 2) fp32
 *    accumulators, 64 registers a thread at BN = MT = 128.
 *  - Pipeline: SKINNY_STAGES stages of BK = 64 along K (W tile and X tile per stage, rows padded
 *    to 144 bytes so ldmatrix's 8 rows land in distinct banks), cp.async groups, one barrier per
 *    stage. K tails (K a multiple of 8) and N / M tails are zero-filled by cp.async (src-size 0).
 *  - Filling the SMs: column tiles x M tiles are often fewer than the SMs (N = 1024: 8..16), so K
 *    is split over the CTAs of one thread-block cluster (up to 8, the portable size). Each CTA
 *    writes its partial tile (fp32) to its own shared memory; after a cluster barrier each CTA
 *    reduces a 1 / splits share of the tile by reading every rank's partial through distributed
 *    shared memory in rank order (deterministic, no atomics, no workspace), applies the epilogue
 *    (bf16 store, or fp32 read-add-write of Y) with 16-byte / 8-byte coalesced accesses, and a
 *    second cluster barrier keeps every CTA's shared memory alive until all reads are done.
 *    Without a split the cluster has one CTA and the same code runs.
 *  - One launch, no allocation, no host sync: capturable in a CUDA graph.
 * Expected speed: the bytes are W (N K 2) from HBM plus X (M K 2 per column tile) from L2; at
 * M <= 64 the kernel should stream W near HBM bandwidth (one CTA keeps 3 stages = 24..48 KB of W
 * in flight); at M = 128 the mma.sync work and the shared-memory fragment reads are about as long
 * as the W read, so expect ~60-70 % of HBM bandwidth; M = 256 is usually cuBLASLt's (the tuner
 * decides).
 */
#include "cuda_internal.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define SKINNY_THREADS 256
#define SKINNY_WARPS_N 4 /* warps along the column tile */
#define SKINNY_WARPS_M 2 /* warps along the rows of X */
#define SKINNY_BK 64     /* K per pipeline stage: 128 bytes of each W row */
#define SKINNY_LDS (SKINNY_BK + 8) /* shared row stride in elements (144 bytes: conflict-free ldmatrix) */
#define SKINNY_STAGES 4
#define SKINNY_MAX_SPLITS 8 /* K splits = cluster size (the portable maximum) */
#define SKINNY_MT_MAX 128   /* the largest M tile; larger M takes several tiles */

template <int BN, int MT>
struct skinny_shape {
    static constexpr int WN = BN / SKINNY_WARPS_N; /* columns per warp: 16 or 32 */
    static constexpr int WM = MT / SKINNY_WARPS_M; /* rows per warp: 8 .. 64 */
    static constexpr int FN = WN / 16;             /* 16-column A fragments per warp */
    static constexpr int FM = WM / 8;              /* 8-row B fragments per warp */
    static constexpr int STAGE_ELEMS = (BN + MT) * SKINNY_LDS;
    static constexpr int PIPE_BYTES = SKINNY_STAGES * STAGE_ELEMS * 2;
    static constexpr int LDP = BN + 4; /* partial tile row stride (floats): conflict-free fragment stores */
    static constexpr int PART_BYTES = MT * LDP * 4;
    static constexpr int SMEM_BYTES = PIPE_BYTES > PART_BYTES ? PIPE_BYTES : PART_BYTES;
    static_assert(WN % 16 == 0 && WM % 8 == 0, "tile shape");
};

/* 16-byte async copy with an L2 cache policy (the weights: evict first). */
__device__ __forceinline__ void skinny_cp_async16_policy(void *smem, const void *gmem, int src_bytes,
                                                         uint64_t policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(cu_smem_addr(smem)),
                 "l"(gmem), "r"(src_bytes), "l"(policy));
}
__device__ __forceinline__ void skinny_ldmatrix_x2(uint32_t r[2], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(cu_smem_addr(p)));
}

/* grid (splits, column tiles, M tiles), cluster (splits, 1, 1); steps: BK steps per split. */
template <int BN, int MT>
__global__ void __launch_bounds__(SKINNY_THREADS, 1)
    skinny_gemm_kernel(const bf16 *__restrict__ W, const bf16 *__restrict__ X, void *__restrict__ Y, int M, int N,
                       int K, int acc, int steps) {
    using S = skinny_shape<BN, MT>;
    extern __shared__ __align__(16) unsigned char skinny_smem[];
    bf16 *pipe = reinterpret_cast<bf16 *>(skinny_smem);
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int splits = (int)cluster.num_blocks();
    const int n0 = blockIdx.y * BN, m0 = blockIdx.z * MT;
    const int k_steps = (K + SKINNY_BK - 1) / SKINNY_BK;
    const int kt0 = rank * steps;
    const int n_steps = max(0, min(k_steps, kt0 + steps) - kt0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wn = warp % SKINNY_WARPS_N, wm = warp / SKINNY_WARPS_N;
    uint64_t w_policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(w_policy));

    /* one stage: W rows [n0, n0 + BN) and X rows [m0, m0 + MT), K columns [kt BK, kt BK + BK) */
    auto load_stage = [&](int slot, int kt) {
        bf16 *Ws = pipe + slot * S::STAGE_ELEMS;
        bf16 *Xs = Ws + BN * SKINNY_LDS;
        const int k = kt * SKINNY_BK;
        constexpr int W_CHUNKS = BN * (SKINNY_BK / 8), X_CHUNKS = MT * (SKINNY_BK / 8);
#pragma unroll
        for (int i = 0; i < (W_CHUNKS + SKINNY_THREADS - 1) / SKINNY_THREADS; i++) {
            const int c = tid + i * SKINNY_THREADS;
            if (W_CHUNKS % SKINNY_THREADS == 0 || c < W_CHUNKS) {
                const int r = c >> 3, gk = k + 8 * (c & 7), gn = n0 + r;
                const bool ok = gn < N && gk < K;
                skinny_cp_async16_policy(Ws + r * SKINNY_LDS + 8 * (c & 7), ok ? W + (size_t)gn * K + gk : W,
                                         ok ? 16 : 0, w_policy);
            }
        }
#pragma unroll
        for (int i = 0; i < (X_CHUNKS + SKINNY_THREADS - 1) / SKINNY_THREADS; i++) {
            const int c = tid + i * SKINNY_THREADS;
            if (X_CHUNKS % SKINNY_THREADS == 0 || c < X_CHUNKS) {
                const int r = c >> 3, gk = k + 8 * (c & 7), gm = m0 + r;
                const bool ok = gm < M && gk < K;
                cu_cp_async16(Xs + r * SKINNY_LDS + 8 * (c & 7), ok ? X + (size_t)gm * K + gk : X, ok ? 16 : 0);
            }
        }
    };

    float accum[S::FN][S::FM][4];
#pragma unroll
    for (int fn = 0; fn < S::FN; fn++)
#pragma unroll
        for (int fm = 0; fm < S::FM; fm++)
#pragma unroll
            for (int q = 0; q < 4; q++) accum[fn][fm][q] = 0.f;

    /* this warp's rows of X: [m0 + wm WM, m0 + wm WM + WM); fragments at or past M are skipped */
    const int warp_m = wm * S::WM;
    const int warp_n = wn * S::WN;
#pragma unroll
    for (int s = 0; s < SKINNY_STAGES - 1; s++) {
        if (s < n_steps) load_stage(s, kt0 + s);
        cu_cp_async_commit(); /* empty groups too: the wait count below stays uniform */
    }
    for (int it = 0; it < n_steps; it++) {
        cu_cp_async_wait<SKINNY_STAGES - 2>(); /* this thread's copies of stage `it` are done */
        __syncthreads();                       /* everyone's are, and stage it - 1 is consumed */
        {
            const int next = it + SKINNY_STAGES - 1;
            if (next < n_steps) load_stage(next % SKINNY_STAGES, kt0 + next);
            cu_cp_async_commit();
        }
        const bf16 *Ws = pipe + (it % SKINNY_STAGES) * S::STAGE_ELEMS;
        const bf16 *Xs = Ws + BN * SKINNY_LDS;
#pragma unroll
        for (int ks = 0; ks < SKINNY_BK / 16; ks++) {
            /* A (W, 16 columns x 16 k): matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) */
            uint32_t a[S::FN][4];
#pragma unroll
            for (int fn = 0; fn < S::FN; fn++)
                cu_ldmatrix_x4(a[fn], Ws + (warp_n + 16 * fn + (lane & 15)) * SKINNY_LDS + 16 * ks + 8 * (lane >> 4));
            /* B (X, 16 k x 8 rows, "col": X rows are B's columns): b0 = k 0-7, b1 = k 8-15 */
            uint32_t b[S::FM][2];
#pragma unroll
            for (int p = 0; p < S::FM / 2; p++) {
                const int mr = warp_m + 16 * p;
                b[2 * p][0] = b[2 * p][1] = b[2 * p + 1][0] = b[2 * p + 1][1] = 0u;
                if (m0 + mr < M) { /* matrices: (rows 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15) */
                    uint32_t r4[4];
                    cu_ldmatrix_x4(r4, Xs + (mr + 8 * (lane >> 4) + (lane & 7)) * SKINNY_LDS + 16 * ks +
                                           8 * ((lane >> 3) & 1));
                    b[2 * p][0] = r4[0];
                    b[2 * p][1] = r4[1];
                    b[2 * p + 1][0] = r4[2];
                    b[2 * p + 1][1] = r4[3];
                }
            }
            if (S::FM & 1) { /* a single 8-row fragment (MT = 16): lanes 0-15 give the addresses */
                const int mr = warp_m + 8 * (S::FM - 1);
                b[S::FM - 1][0] = b[S::FM - 1][1] = 0u;
                if (m0 + mr < M)
                    skinny_ldmatrix_x2(b[S::FM - 1],
                                       Xs + (mr + (lane & 7)) * SKINNY_LDS + 16 * ks + 8 * ((lane >> 3) & 1));
            }
#pragma unroll
            for (int fm = 0; fm < S::FM; fm++) {
                if (m0 + warp_m + 8 * fm >= M) continue; /* warp-uniform */
#pragma unroll
                for (int fn = 0; fn < S::FN; fn++) cu_mma16816(accum[fn][fm], a[fn], b[fm][0], b[fm][1]);
            }
        }
    }
    cu_cp_async_wait<0>();
    __syncthreads(); /* the pipeline's shared memory becomes the partial tile */

    /* partial tile P[m][n] (fp32): d0, d1 = (column r, rows 2c, 2c + 1), d2, d3 = column r + 8 */
    float *P = reinterpret_cast<float *>(skinny_smem);
#pragma unroll
    for (int fn = 0; fn < S::FN; fn++)
#pragma unroll
        for (int fm = 0; fm < S::FM; fm++) {
            const int n = warp_n + 16 * fn + (lane >> 2);
            const int m = warp_m + 8 * fm + 2 * (lane & 3);
            P[m * S::LDP + n] = accum[fn][fm][0];
            P[(m + 1) * S::LDP + n] = accum[fn][fm][1];
            P[m * S::LDP + n + 8] = accum[fn][fm][2];
            P[(m + 1) * S::LDP + n + 8] = accum[fn][fm][3];
        }
    cluster.sync(); /* every rank's partial tile is written and visible cluster-wide */

    /* this rank's share of the tile, 4 columns a thread; sums in rank order (deterministic) */
    constexpr int GROUPS_PER_ROW = BN / 4;
    for (int g = rank * SKINNY_THREADS + tid; g < MT * GROUPS_PER_ROW; g += splits * SKINNY_THREADS) {
        const int ml = g / GROUPS_PER_ROW, nl = 4 * (g % GROUPS_PER_ROW);
        const int gm = m0 + ml, gn = n0 + nl;
        if (gm >= M || gn >= N) continue; /* N is a multiple of 8: a group is all in or all out */
        float4 s = *reinterpret_cast<const float4 *>(cluster.map_shared_rank(P, 0) + ml * S::LDP + nl);
        for (int src = 1; src < splits; src++) {
            const float4 v = *reinterpret_cast<const float4 *>(cluster.map_shared_rank(P, src) + ml * S::LDP + nl);
            s.x += v.x;
            s.y += v.y;
            s.z += v.z;
            s.w += v.w;
        }
        const size_t off = (size_t)gm * N + gn;
        if (acc) {
            float4 *y = reinterpret_cast<float4 *>(static_cast<float *>(Y) + off);
            float4 o = *y;
            o.x += s.x;
            o.y += s.y;
            o.z += s.z;
            o.w += s.w;
            *y = o;
        } else {
            uint2 o;
            o.x = cu_pack_bf16(s.x, s.y);
            o.y = cu_pack_bf16(s.z, s.w);
            *reinterpret_cast<uint2 *>(static_cast<bf16 *>(Y) + off) = o;
        }
    }
    cluster.sync(); /* no CTA leaves while another still reads its shared memory */
}

/* ---- host ------------------------------------------------------------------------------------ */

/* The instantiations: column tile BN in {64, 128}, M tile MT in {16, 32, 64, 128}. */
#define SKINNY_FOR_EACH(X_) \
    X_(64, 16) X_(64, 32) X_(64, 64) X_(64, 128) X_(128, 16) X_(128, 32) X_(128, 64) X_(128, 128)

template <int BN, int MT>
static cudaError_t skinny_launch(const bf16 *W, const bf16 *X, void *Y, int M, int N, int K, int acc,
                                 const cu_skinny_cfg *c, cudaStream_t st, int occupancy_only, int *max_clusters) {
    using S = skinny_shape<BN, MT>;
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3((unsigned)c->splits, (unsigned)((N + BN - 1) / BN), (unsigned)c->m_tiles);
    lc.blockDim = dim3(SKINNY_THREADS, 1, 1);
    lc.dynamicSmemBytes = S::SMEM_BYTES;
    lc.stream = st;
    cudaLaunchAttribute at[1] = {};
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)c->splits;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    lc.attrs = at;
    lc.numAttrs = 1;
    if (occupancy_only) return cudaOccupancyMaxActiveClusters(max_clusters, skinny_gemm_kernel<BN, MT>, &lc);
    return cudaLaunchKernelEx(&lc, skinny_gemm_kernel<BN, MT>, W, X, Y, M, N, K, acc, c->steps);
}

/* Dispatch on (bn, mt): the launch, or (occupancy_only) the number of co-resident clusters. */
static cudaError_t skinny_dispatch(const bf16 *W, const bf16 *X, void *Y, int M, int N, int K, int acc,
                                   const cu_skinny_cfg *c, cudaStream_t st, int occupancy_only, int *max_clusters) {
#define SKINNY_CASE(BN_, MT_)                                                                              \
    if (c->bn == BN_ && c->mt == MT_)                                                                      \
        return skinny_launch<BN_, MT_>(W, X, Y, M, N, K, acc, c, st, occupancy_only, max_clusters);
    SKINNY_FOR_EACH(SKINNY_CASE)
#undef SKINNY_CASE
    return cudaErrorInvalidValue;
}

int cu_gemm_skinny_supported(int M, int N, int K, int acc, int f32) {
    (void)acc;
    return !f32 && M >= 1 && M <= CU_SKINNY_MAX_M && N >= 8 && K >= 8 && N % 8 == 0 && K % 8 == 0;
}

int cu_gemm_skinny_init(squad_err *err) {
#define SKINNY_ATTR(BN_, MT_)                                                                              \
    CU_TRY(cudaFuncSetAttribute(skinny_gemm_kernel<BN_, MT_>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                skinny_shape<BN_, MT_>::SMEM_BYTES));
    SKINNY_FOR_EACH(SKINNY_ATTR)
#undef SKINNY_ATTR
    return 0;
}

/* Fraction of n_sm one-CTA-per-SM slots that `ctas` CTAs keep busy over their waves. */
static double skinny_fill(int ctas, int n_sm) {
    const int waves = (ctas + n_sm - 1) / n_sm;
    return (double)ctas / ((double)waves * n_sm);
}

int cu_gemm_skinny_plan(int M, int N, int K, int n_sm, cu_skinny_cfg *cfg, squad_err *err) {
    if (!cu_gemm_skinny_supported(M, N, K, 0, 0))
        return cu_err(err, SQUAD_E_UNSUPPORTED, "skinny GEMM: %d x %d x %d not supported", M, N, K);
    if (n_sm < 1) n_sm = 1;
    cu_skinny_cfg c;
    memset(&c, 0, sizeof c);
    c.mt = M <= 16 ? 16 : M <= 32 ? 32 : M <= 64 ? 64 : SKINNY_MT_MAX;
    c.m_tiles = (M + c.mt - 1) / c.mt;
    const int k_steps = (K + SKINNY_BK - 1) / SKINNY_BK;
    double best_fill = -1.0;
    /* the wider column tile first (half the X re-reads); the narrower one only if it fills more SMs */
    static const int bns[] = {128, 64};
    for (int i = 0; i < 2; i++) {
        const int bn = bns[i];
        const int tiles = ((N + bn - 1) / bn) * c.m_tiles;
        int splits = tiles >= n_sm ? 1 : n_sm / tiles;
        if (splits > SKINNY_MAX_SPLITS) splits = SKINNY_MAX_SPLITS;
        if (splits > k_steps / 2) splits = k_steps / 2; /* at least 2 K steps per CTA */
        if (splits < 1) splits = 1;
        const int steps = (k_steps + splits - 1) / splits;
        splits = (k_steps + steps - 1) / steps; /* no CTA without K steps */
        const double fill = skinny_fill(tiles * splits, n_sm);
        if (fill > best_fill + 0.05) {
            best_fill = fill;
            c.bn = bn;
            c.splits = splits;
            c.steps = steps;
        }
    }
    /* a cluster of `splits` CTAs must fit on the device at all */
    while (c.splits > 1) {
        int clusters = 0;
        const cudaError_t e = skinny_dispatch(NULL, NULL, NULL, M, N, K, 0, &c, 0, 1, &clusters);
        if (e != cudaSuccess) return cu_fail(err, "cudaOccupancyMaxActiveClusters", e, __FILE__, __LINE__);
        if (clusters >= 1) break;
        c.splits /= 2;
        c.steps = (k_steps + c.splits - 1) / c.splits;
        c.splits = (k_steps + c.steps - 1) / c.steps;
    }
    *cfg = c;
    return 0;
}

int cu_gemm_skinny(const cu_skinny_cfg *cfg, const bf16 *W, const bf16 *X, void *Y, int M, int N, int K, int acc,
                   cudaStream_t st, squad_err *err) {
    if (!cu_gemm_skinny_supported(M, N, K, acc, 0) || cfg->m_tiles * cfg->mt < M || cfg->splits < 1 ||
        cfg->splits > SKINNY_MAX_SPLITS || (long)cfg->splits * cfg->steps * SKINNY_BK < K)
        return cu_err(err, SQUAD_E_UNSUPPORTED, "skinny GEMM: plan does not fit %d x %d x %d", M, N, K);
    const cudaError_t e = skinny_dispatch(W, X, Y, M, N, K, acc, cfg, st, 0, NULL);
    if (e != cudaSuccess) return cu_fail(err, "skinny GEMM launch", e, __FILE__, __LINE__);
    CU_LAUNCH_CHECK("skinny GEMM");
    return 0;
}
