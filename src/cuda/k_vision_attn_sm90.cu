/*
 * k_vision_attn_sm90.cu — the vision tower's non-causal attention (k_vision.cu's vis_attn) on
 * Hopper's warpgroup MMA, for head dim 64 (the 0.8B tower's). Compiled for sm_90a alone
 * (CMakeLists.txt's SQUAD_CUDA_SM90A_SOURCES), its device code guarded by __CUDA_ARCH_FEAT_SM90_ALL;
 * the tower launches it only where cu_vis_attn_sm90_probe found this cubin running (compute
 * capability 9.0). vis_attn on mma.sync stays: the reference this kernel is tested against, and the
 * path for other head dims and GPUs.
 *
 * Why: at 8,160 patches a screenshot's attention is ~2.45 TFLOP, most of the tower. vis_attn's warps
 * each load every K and V fragment of a tile for their own 16 queries (ldmatrix, 8x over a block);
 * wgmma reads a tile's shared-memory operands once for a warpgroup's 64 queries, and the tensor
 * cores run while the issuing warps do other work.
 *
 * The block (vis_attn's shape): 8 warps = 2 warpgroups, 128 queries of one (head, frame), keys 64 a
 * tile through two cp.async stages (the next tile loads while this one is computed), one barrier a
 * tile. Per tile and warpgroup:
 *   - S[64][64] = Q K^T: 4 wgmma m64n64k16 (16 head dims each), Q and K both K-major from shared
 *     memory (k_wgmma.cuh's wg_m64n64k16);
 *   - the frame's end masked (keys past L score -inf), the online softmax in the exp2 domain on the
 *     accumulators (each warp's 16 rows: the m16n8 layout, as vis_attn's), P packed to bf16;
 *   - O[64][64] += P V: 4 wgmma m64n64k16 with P from registers (the accumulator layout of two n8
 *     groups is the A fragment of one k16 step) and V MN-major from shared memory (the transposed-B
 *     form: head dims, wgmma's N, contiguous).
 * Shared memory holds Q, K and V as 128-byte swizzled rows of 64 head dims (row r's 16-byte chunk q at
 * r 128 + ((q ^ r % 8) 16)), the layout the descriptors name; 16 KB of Q and two stages of 8 KB K +
 * 8 KB V, 48 KB a block, so two blocks share a multiprocessor (registers: __launch_bounds__(256, 2))
 * and one block's softmax overlaps the other's tensor work. cp.async writes through the generic proxy
 * and wgmma reads through the async one: each thread fences (fence.proxy.async) after its copies land,
 * before the barrier that releases the tile. Registers an in-flight wgmma reads or writes are pinned
 * (empty asm) until its wait. Queries past the frame's end load zeros and store nothing.
 */
#include "vision_cuda.cuh"
#include "k_wgmma.cuh"

#include <math.h>

#define VW_HD 64                     /* the head dim this kernel takes */
#define VW_WARPS 8                   /* two warpgroups */
#define VW_THREADS (VW_WARPS * 32)
#define VW_ROWS 128                  /* queries a block: 64 a warpgroup */
#define VW_BN 64                     /* keys a tile */
#define VW_ROW_BYTES 128             /* a swizzled row: 64 head dims of bf16 */
#define VW_ALIGN 1024                /* the swizzle repeats every 8 rows of 128 bytes */
#define VW_Q_BYTES (VW_ROWS * VW_ROW_BYTES)   /* 16 KB */
#define VW_KV_BYTES (VW_BN * VW_ROW_BYTES)    /* 8 KB: K or V of a tile */
#define VW_STAGE_BYTES (2 * VW_KV_BYTES)      /* K then V */
#define VW_SMEM (VW_Q_BYTES + 2 * VW_STAGE_BYTES + VW_ALIGN)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void vw_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* O[64][64] += P[64][16] V[16][64]: P from registers (the A fragment of the warp's 16 rows), V
 * MN-major in shared memory (the transposed-B form). */
__device__ __forceinline__ void vw_pv(float (&d)[8][4], const uint32_t (&pa)[4], uint64_t dv) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
          "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
          "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(pa[0]), "r"(pa[1]), "r"(pa[2]), "r"(pa[3]), "l"(dv), "r"(1)
        : "memory");
}

/* K and V rows [kb, kb + VW_BN) of the frame into a stage: the thread's rows i0 + 32 p, its 16-byte
 * chunk `piece` swizzled (dst: the element offset of row i0's chunk); rows past L zero-filled. */
__device__ __forceinline__ void vw_load_kv(bf16 *Ks, bf16 *Vs, const bf16 *Kg, const bf16 *Vg, int kb, int L, int i0,
                                           int piece, int dst) {
#pragma unroll
    for (int p = 0; p < VW_BN / 32; p++) {
        const int key = kb + i0 + 32 * p;
        const bool ok = key < L;
        const size_t src = (size_t)(ok ? key : 0) * VW_HD + 8 * piece;
        cu_cp_async16(Ks + dst + p * 32 * VW_HD, Kg + src, ok ? 16 : 0);
        cu_cp_async16(Vs + dst + p * 32 * VW_HD, Vg + src, ok ? 16 : 0);
    }
}
#endif

__global__ void __launch_bounds__(VW_THREADS, 2)
    vis_attn_sm90_kernel(const bf16 *__restrict__ Q, const bf16 *__restrict__ K, const bf16 *__restrict__ V,
                         bf16 *__restrict__ out, int N, int L, int heads, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ uint8_t vw_raw[];
    const uint32_t mis = cu_smem_addr(vw_raw) & (VW_ALIGN - 1);
    uint8_t *smem = vw_raw + (mis ? VW_ALIGN - mis : 0);
    bf16 *Qs = (bf16 *)smem;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, wg = w >> 2;
    const int q0 = blockIdx.x * VW_ROWS, head = blockIdx.y, frame = blockIdx.z;
    const size_t base = (size_t)head * N + (size_t)frame * L; /* the frame's first row in [head][N] */
    const bf16 *Qg = Q + base * VW_HD, *Kg = K + base * VW_HD, *Vg = V + base * VW_HD;

    /* the thread's piece of every tile: rows i0 + 32 p, 16-byte chunk `piece`, swizzled by i0 % 8
     * (the same in each of its rows, 32 apart) */
    const int i0 = tid >> 3, piece = tid & 7;
    const int dst = i0 * VW_HD + ((piece ^ (i0 & 7)) << 3);
#pragma unroll
    for (int p = 0; p < VW_ROWS / 32; p++) {
        const int r = q0 + i0 + 32 * p;
        const bool ok = r < L;
        cu_cp_async16(Qs + dst + p * 32 * VW_HD, Qg + (size_t)(ok ? r : 0) * VW_HD + 8 * piece, ok ? 16 : 0);
    }
    {
        bf16 *K0 = (bf16 *)(smem + VW_Q_BYTES);
        vw_load_kv(K0, K0 + VW_KV_BYTES / 2, Kg, Vg, 0, L, i0, piece, dst);
    }
    cu_cp_async_commit();

    const int r4 = lane >> 2, c4 = lane & 3;
    const uint32_t q_base = cu_smem_addr(Qs) + wg * 64 * VW_ROW_BYTES; /* the warpgroup's 64 rows */
    float O[VW_HD / 8][4];
#pragma unroll
    for (int d = 0; d < VW_HD / 8; d++) O[d][0] = O[d][1] = O[d][2] = O[d][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    int stage = 0;
    for (int kb = 0; kb < L; kb += VW_BN, stage ^= 1) {
        /* this tile has landed and is visible to wgmma, and both warpgroups are done with the other
         * stage, which the next tile's copies overwrite while this one is computed */
        cu_cp_async_wait<0>();
        vw_proxy_fence();
        __syncthreads();
        const uint32_t k_base = cu_smem_addr(smem + VW_Q_BYTES + (size_t)stage * VW_STAGE_BYTES);
        const uint32_t v_base = k_base + VW_KV_BYTES;
        float S[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) S[j][0] = S[j][1] = S[j][2] = S[j][3] = 0.f;
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < VW_HD / 16; ks++) /* 16 head dims: 32 bytes along the swizzled row */
            wg_m64n64k16(*reinterpret_cast<float(*)[32]>(&S[0][0]), wg_desc(q_base + ks * 32, 16, 1024),
                         wg_desc(k_base + ks * 32, 16, 1024), ks > 0);
        wg_commit();
        if (kb + VW_BN < L) {
            bf16 *Kn = (bf16 *)(smem + VW_Q_BYTES + (size_t)(stage ^ 1) * VW_STAGE_BYTES);
            vw_load_kv(Kn, Kn + VW_KV_BYTES / 2, Kg, Vg, kb + VW_BN, L, i0, piece, dst);
            cu_cp_async_commit();
        }
        wg_wait<0>();
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) wg_pin(S[j][e]);

        if (kb + VW_BN > L) /* the frame's last tile: keys past its end take no weight */
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int key = kb + 8 * j + 2 * c4;
                if (key >= L) S[j][0] = S[j][2] = -INFINITY;
                if (key + 1 >= L) S[j][1] = S[j][3] = -INFINITY;
            }
        /* online softmax of the thread's two rows (r4 and r4 + 8 of its warp), over a row's 4 lanes */
        float mx0, mx1;
        cu_frag_row_max(S, mx0, mx1);
        /* every tile holds at least one key of the frame (key kb), so the new maxima are finite */
        const float n0 = fmaxf(m0, mx0 * scale_log2), n1 = fmaxf(m1, mx1 * scale_log2);
        const float corr0 = exp2f(m0 - n0), corr1 = exp2f(m1 - n1);
        m0 = n0;
        m1 = n1;
        cu_frag_rescale(O, corr0, corr1);
        float s0 = 0.f, s1 = 0.f;
        uint32_t pa[4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
#pragma unroll
            for (int j = 2 * ks; j < 2 * ks + 2; j++) {
                S[j][0] = exp2f(fmaf(S[j][0], scale_log2, -n0));
                S[j][1] = exp2f(fmaf(S[j][1], scale_log2, -n0));
                S[j][2] = exp2f(fmaf(S[j][2], scale_log2, -n1));
                S[j][3] = exp2f(fmaf(S[j][3], scale_log2, -n1));
                s0 += S[j][0] + S[j][1];
                s1 += S[j][2] + S[j][3];
            }
            pa[ks][0] = cu_pack_bf16(S[2 * ks][0], S[2 * ks][1]);
            pa[ks][1] = cu_pack_bf16(S[2 * ks][2], S[2 * ks][3]);
            pa[ks][2] = cu_pack_bf16(S[2 * ks + 1][0], S[2 * ks + 1][1]);
            pa[ks][3] = cu_pack_bf16(S[2 * ks + 1][2], S[2 * ks + 1][3]);
        }
        l0 = l0 * corr0 + s0;
        l1 = l1 * corr1 + s1;
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ks++) /* 16 keys: 16 rows of 128 bytes */
            vw_pv(O, pa[ks], wg_desc(v_base + ks * 16 * VW_ROW_BYTES, VW_KV_BYTES, 1024));
        wg_commit();
        wg_wait<0>();
        /* the accumulators and the P fragments stay where the wgmma read and wrote them until here */
#pragma unroll
        for (int j = 0; j < VW_HD / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) wg_pin(O[j][e]);
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
#pragma unroll
            for (int e = 0; e < 4; e++) wg_pin_r(pa[ks][e]);
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = 1.f / l0, inv1 = 1.f / l1;
    const int ldo = heads * VW_HD;
    const int qa = q0 + 16 * w + r4, qb = qa + 8; /* warp w: rows 16 w of the block (64 wg + 16 (w % 4)) */
    bf16 *oa = out + ((size_t)frame * L + qa) * ldo + head * VW_HD + 2 * c4;
    bf16 *ob = out + ((size_t)frame * L + qb) * ldo + head * VW_HD + 2 * c4;
#pragma unroll
    for (int d = 0; d < VW_HD / 8; d++) {
        if (qa < L) *reinterpret_cast<uint32_t *>(oa + 8 * d) = cu_pack_bf16(O[d][0] * inv0, O[d][1] * inv0);
        if (qb < L) *reinterpret_cast<uint32_t *>(ob + 8 * d) = cu_pack_bf16(O[d][2] * inv1, O[d][3] * inv1);
    }
#else
    (void)Q, (void)K, (void)V, (void)out, (void)N, (void)L, (void)heads, (void)scale_log2;
#endif
}

/* ---- host side ---------------------------------------------------------------------------------- */

int cu_vis_attn_sm90_probe(int *ok, squad_err *err) {
    const int rc = cu_sm90a_runs(ok, err);
    if (rc || !*ok) return rc;
    CU_TRY(cudaFuncSetAttribute(vis_attn_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, VW_SMEM));
    return 0;
}

int cu_vis_attn_sm90_takes(int hd) { return hd == VW_HD; }

int cu_vis_attn_sm90(const bf16 *Q, const bf16 *K, const bf16 *V, int frames, int L, int heads, int hd, float scale,
                     bf16 *out, cudaStream_t st, squad_err *err) {
    if (hd != VW_HD) return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA vision attention (wgmma): head dim %d (64)", hd);
    if (frames < 1 || L < 1 || frames > 65535 || heads > 65535)
        return cu_err(err, SQUAD_E_INVALID, "CUDA vision attention: %d frames of %d patches, %d heads", frames, L,
                      heads);
    const dim3 grid((unsigned)((L + VW_ROWS - 1) / VW_ROWS), (unsigned)heads, (unsigned)frames);
    const float sl2 = scale * 1.4426950408889634f; /* log2(e) */
    vis_attn_sm90_kernel<<<grid, VW_THREADS, VW_SMEM, st>>>(Q, K, V, out, frames * L, L, heads, sl2);
    CU_LAUNCH_CHECK("vis_attn_sm90_kernel");
    return 0;
}
