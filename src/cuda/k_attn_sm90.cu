/*
 * k_attn_sm90.cu — attention's forward (k_attn.cu's attn_fwd) on Hopper's warpgroup MMA, for head_dim
 * 256 (the 0.8B model's). Compiled for sm_90a alone (CMakeLists.txt), its device code guarded by
 * __CUDA_ARCH_FEAT_SM90_ALL; the host (cu_attn_forward) launches it only where cu_attn_init's probe
 * found this cubin running (compute capability 9.0).
 *
 * Why: attn_fwd on mma.sync runs at ~220-295 TFLOP/s, bound by shared-memory fragment loads: each
 * warp loads every K and V fragment of a tile for its own 16 query rows (72 KB a warp a tile). wgmma
 * reads its shared-memory operands once for a warpgroup's 64 rows (96 KB for 64 rows where mma.sync
 * loads 288 KB), and its m64n256 instruction does 16x the work of an m16n8.
 *
 * The same block as attn_fwd (k_attn.cuh): 8 warps, 128 query rows (tokens x heads of a GQA group),
 * keys 64 at a time in two cp.async stages, the same split of the keys, the same online softmax and
 * ending. Differences:
 *   - Shared memory holds Q and the K / V tiles as 128-byte swizzled panels of 64 head dims (row r's
 *     16-byte chunk q at r 128 + ((q ^ r % 8) 16) of its panel), the layout wgmma's descriptors
 *     name: Q and K are K-major operands (head dim contiguous), V the MN-major B of P V (head dim,
 *     wgmma's N, contiguous; the transposed-B form). A thread's rows are 8 apart, so its swizzled
 *     chunk is the same in every row it copies.
 *   - S = Q K^T: warpgroup g (warps 4g .. 4g + 3, tile rows 64g ..) issues 16 m64n64k16 (k = 16 head
 *     dims each) from shared memory; O += P V: 4 m64n256k16 with P from registers (the S
 *     accumulators packed to bf16: the A fragment layout is mma.sync's, the accumulator layout each
 *     warp's m16n8 one, so the softmax is attn_fwd's code).
 *   - cp.async writes through the generic proxy and wgmma reads through the async one: each thread
 *     fences (fence.proxy.async) after its copies land, before the barrier that releases the tile.
 *   - A tile wholly past a warpgroup's rows is skipped by the warpgroup (wgmma is warpgroup-wide);
 *     masked rows inside it are what the per-row limits mask.
 *   - Order within a tile: S's wgmma group is issued, then the next tile's copies (into the other
 *     stage), then the wait; P V as one group once P is packed (issuing it 16 keys at a time as
 *     P's slices were ready measured no faster, docs/cuda.md). Registers an in-flight wgmma reads
 *     (P) or writes (S, O) are pinned (empty asm) until its wait, so the compiler cannot reuse or
 *     move them.
 *   - Both warpgroups still meet at one barrier a tile (the stages are shared): the softmax of one
 *     does not overlap the other's wgmma by design, only by chance (a producer warp with
 *     per-stage barriers and ping-pong between the warpgroups is the next step).
 */
#include "k_attn.cuh"
#include "k_wgmma.cuh"

#define ATS_HD 256              /* the head_dim this kernel takes */
#define ATS_PANEL 64            /* head dims a swizzled panel holds: 128 bytes of bf16 */
#define ATS_ALIGN 1024          /* the swizzle repeats every 8 rows of 128 bytes */
#define ATS_Q_PANEL_BYTES (ATT_ROWS * 128)
#define ATS_KV_PANEL_BYTES (CU_ATT_BN * 128)
#define ATS_Q_BYTES ((ATS_HD / ATS_PANEL) * ATS_Q_PANEL_BYTES)   /* 64 KB */
#define ATS_KV_TILE ((ATS_HD / ATS_PANEL) * ATS_KV_PANEL_BYTES)  /* 32 KB */
#define ATS_SMEM (ATS_Q_BYTES + ATT_STAGES * 2 * ATS_KV_TILE + ATS_ALIGN)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The thread's copies into shared memory, visible to the async proxy (wgmma's operand reads). */
__device__ __forceinline__ void ats_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* S[64][64] (+)= Q[64][16] K^T: both K-major in shared memory; acc 0 overwrites. S's [8][4]
 * fragments are the 32 accumulators of the m64n64k16 layout, in order. */
__device__ __forceinline__ void ats_qk(float (&d)[8][4], uint64_t dq, uint64_t dk, int acc) {
    wg_m64n64k16(*reinterpret_cast<float(*)[32]>(&d[0][0]), dq, dk, acc);
}

/* O[64][256] += P[64][16] V[16][256]: P from registers (the mma.sync A fragment of the warp's 16
 * rows), V MN-major in shared memory (the transposed-B form). */
__device__ __forceinline__ void ats_pv(float (&d)[32][4], const uint32_t (&pa)[4], uint64_t dv) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]),
          "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
          "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]),
          "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]),
          "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]),
          "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]),
          "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),
          "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]),
          "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
        : "r"(pa[0]), "r"(pa[1]), "r"(pa[2]), "r"(pa[3]), "l"(dv), "r"(1)
        : "memory");
}
#endif

__global__ void __launch_bounds__(ATT_THREADS, 1) attn_fwd_sm90_kernel(attn_fwd_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int HD = ATS_HD;
    extern __shared__ uint8_t ats_raw[];
    const uint32_t mis = cu_smem_addr(ats_raw) & (ATS_ALIGN - 1);
    uint8_t *smem = ats_raw + (mis ? ATS_ALIGN - mis : 0);
    bf16 *Qs = (bf16 *)smem;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, wg = w >> 2;
    att_block b;
    if (!att_begin<HD>(a, b)) return;
    const int start = b.start, len = b.len, tpw = b.tpw, tpw_sh = b.tpw_sh, t0 = b.t0, h0 = b.h0;
    const int k_lo = b.k_lo, k_hi = b.k_hi;
    const int kvh = h0 / (a.nh / a.nkv);
    const att_kv_src kv = att_sources(a);

    /* this thread's piece of every tile: rows i0 + 8 p (att_lanes: RP = 8 at hd 256), 16-byte chunk
     * `piece` of a row, i.e. chunk piece % 8 of panel piece / 8, swizzled by the row's i0 % 8 */
    typedef att_lanes<HD> LN;
    static_assert(LN::RP == 8, "a thread's rows share their swizzle phase");
    constexpr int DSTEP = LN::RP * ATS_PANEL; /* elements: 8 rows of a panel */
    const int i0 = tid / LN::SEG, piece = tid % LN::SEG;
    const int sw = (((piece & 7) ^ (i0 & 7)) << 3) + i0 * ATS_PANEL;
    const int q_dst = (piece >> 3) * (ATS_Q_PANEL_BYTES / 2) + sw;
    const int kv_dst = (piece >> 3) * (ATS_KV_PANEL_BYTES / 2) + sw, kv_col = kvh * HD + 8 * piece;

    /* Q tile (rows past the bucket are zero) and the first K / V tiles: one cp.async group */
#pragma unroll
    for (int p = 0; p < LN::Q_PASSES; p++) {
        const int i = i0 + p * LN::RP;
        int t, h;
        att_row(i, t0, h0, tpw, tpw_sh, &t, &h);
        const bool ok = t < a.rows;
        const bf16 *src = a.Qb + ((size_t)(ok ? t : 0) * a.nh + h) * HD + 8 * piece;
        cu_cp_async16(Qs + q_dst + p * DSTEP, src, ok ? 16 : 0);
    }
    {
        bf16 *K0 = (bf16 *)(smem + ATS_Q_BYTES);
        att_load_kv<HD, DSTEP>(K0, K0 + ATS_KV_TILE / 2, kv, k_lo, k_hi, i0, kv_dst, kv_col);
    }
    cu_cp_async_commit();

    const int c = lane & 3;
    const att_warp_rows wr = att_rows_of(b, w, lane);
    const int h = wr.h, row0 = wr.row0, row1 = wr.row1, lim0 = wr.lim0, lim1 = wr.lim1, limf = wr.limf;
    /* keys from limg on are past every row of the warpgroup (its warps' last tokens) */
    int limg = k_lo;
    for (int v = 4 * wg; v < 4 * wg + 4; v++) {
        const int vt0 = t0 + 16 * (v & (tpw - 1));
        if (vt0 < a.rows) limg = max(limg, min(k_hi, start + min(vt0 + 15, len - 1) + 1));
    }
    const uint32_t q_base = cu_smem_addr(Qs) + wg * 64 * 128; /* the warpgroup's 64 rows */

    float O[HD / 8][4], m0, m1, l0, l1;
    att_acc_clear<HD>(O, m0, m1, l0, l1);

    int stage = 0;
    for (int kb = k_lo; kb < k_hi; kb += CU_ATT_BN, stage ^= 1) {
        /* this tile has landed and is visible to wgmma, and every warpgroup is done with the previous
         * one, whose stage the next tile's loads overwrite while this one is computed */
        cu_cp_async_wait<0>();
        ats_proxy_fence();
        __syncthreads();
        /* S = Q K^T goes to the tensor cores first, then the next tile's copies are issued while it
         * runs (they fill the other stage); a warpgroup past the tile (causal) only copies */
        bf16 *const Kn = (bf16 *)(smem + ATS_Q_BYTES + (size_t)(stage ^ 1) * 2 * ATS_KV_TILE);
        const bool next = kb + CU_ATT_BN < k_hi;
        if (kb >= limg) { /* the same in the whole warpgroup */
            if (next) {
                att_load_kv<HD, DSTEP>(Kn, Kn + ATS_KV_TILE / 2, kv, kb + CU_ATT_BN, k_hi, i0, kv_dst, kv_col);
                cu_cp_async_commit();
            }
            continue;
        }
        const uint32_t k_base = cu_smem_addr(smem + ATS_Q_BYTES + (size_t)stage * 2 * ATS_KV_TILE);
        const uint32_t v_base = k_base + ATS_KV_TILE;
        float S[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) S[j][0] = S[j][1] = S[j][2] = S[j][3] = 0.f;
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
            const uint32_t off = (ks & 3) * 32; /* 16 head dims: 32 bytes along the swizzled row */
            ats_qk(S, wg_desc(q_base + (ks >> 2) * ATS_Q_PANEL_BYTES + off, 16, 1024),
                   wg_desc(k_base + (ks >> 2) * ATS_KV_PANEL_BYTES + off, 16, 1024), ks > 0);
        }
        wg_commit();
        if (next) {
            att_load_kv<HD, DSTEP>(Kn, Kn + ATS_KV_TILE / 2, kv, kb + CU_ATT_BN, k_hi, i0, kv_dst, kv_col);
            cu_cp_async_commit();
        }
        wg_wait<0>();
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) wg_pin(S[j][e]);

        /* the mask and the online softmax's maxima (att_tile_max) */
        float u0, u1, al0, al1;
        att_tile_max(S, kb, c, limf, lim0, lim1, a.scale_log2, m0, m1, u0, u1, al0, al1);
        cu_frag_rescale(O, al0, al1);
        /* P = 2^(S scale - m) in bf16, 16 keys (two n8 column groups of S) a slice */
        float s0 = 0.f, s1 = 0.f;
        uint32_t pa[4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
#pragma unroll
            for (int j = 2 * ks; j < 2 * ks + 2; j++) {
                S[j][0] = exp2f(fmaf(S[j][0], a.scale_log2, -u0));
                S[j][1] = exp2f(fmaf(S[j][1], a.scale_log2, -u0));
                S[j][2] = exp2f(fmaf(S[j][2], a.scale_log2, -u1));
                S[j][3] = exp2f(fmaf(S[j][3], a.scale_log2, -u1));
                s0 += S[j][0] + S[j][1];
                s1 += S[j][2] + S[j][3];
            }
            pa[ks][0] = cu_pack_bf16(S[2 * ks][0], S[2 * ks][1]);
            pa[ks][1] = cu_pack_bf16(S[2 * ks][2], S[2 * ks][3]);
            pa[ks][2] = cu_pack_bf16(S[2 * ks + 1][0], S[2 * ks + 1][1]);
            pa[ks][3] = cu_pack_bf16(S[2 * ks + 1][2], S[2 * ks + 1][3]);
        }
        {
            wg_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ks++)
                ats_pv(O, pa[ks], wg_desc(v_base + ks * 2048, ATS_KV_PANEL_BYTES, 1024));
        }
        wg_commit();
        l0 = l0 * al0 + s0;
        l1 = l1 * al1 + s1;
        wg_wait<0>();
        /* the accumulators and the P fragments stay where the wgmma read and wrote them until here */
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) wg_pin(O[j][e]);
#pragma unroll
        for (int ks = 0; ks < 4; ks++)
#pragma unroll
            for (int e = 0; e < 4; e++) wg_pin_r(pa[ks][e]);
    }
    att_finish<HD>(a, b, O, m0, m1, l0, l1, row0, row1, h, c);
#else
    (void)a;
#endif
}

/* ---- host side ---------------------------------------------------------------------------------- */

int cu_attn_sm90_probe(int *ok, squad_err *err) {
    const int rc = cu_sm90a_runs(ok, err);
    if (rc || !*ok) return rc;
    CU_TRY(cudaFuncSetAttribute(attn_fwd_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ATS_SMEM));
    return 0;
}

int cu_attn_sm90_takes(int hd) { return hd == ATS_HD; }

void cu_attn_sm90_launch(const attn_fwd_args *a, dim3 grid, cudaStream_t st) {
    attn_fwd_sm90_kernel<<<grid, ATT_THREADS, ATS_SMEM, st>>>(*a);
}
