/*
 * k_norm.cu — the memory-bound kernels around the projections: the embedding gather fused with
 * layer 0's input RMSNorm, RMSNorm (zero-centred weight, fp32 math, bf16 out for the next GEMM),
 * SiLU(gate) * up, and the letter probabilities at the answer slots. The embedding step also takes
 * an image row's input rows (the vision tower's output) for its image tokens (CU_ROW_EMBEDS).
 *
 * Design: the residual stream h stays fp32 on the device; every GEMM input is bf16 (the fast path)
 * or fp32 (the exact path; the kernels are templated on the activation type). Residual adds
 * happen in the cuBLASLt epilogue (beta = 1 into h), so a norm kernel is the only pass between two
 * GEMMs. One block per token row; sums in fp32. These kernels see a batch as one run of tokens (rows
 * of a batch sit at a uniform stride), except the letter kernel, which runs one block per (slot,
 * row) and never touches the full vocabulary: only the rows of E named by the row's letters.
 * The plain host references (cu_ref_rmsnorm, cu_ref_silu_mul) are in cuda_test_ref.cu (tests only).
 */
#include "cuda_internal.cuh"

#include <math.h>

#define NORM_THREADS 256

/* Sum over the block (NORM_THREADS threads); every thread gets the result. */
__device__ static float block_sum(float v, float *red) {
    v = cu_warp_sum(v);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads(); /* red may still be read by a previous call */
    if (l == 0) red[w] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NORM_THREADS / 32; i++) s += red[i];
    return s;
}

/* A token of a row with CU_ROW_EMBEDS whose img entry names a row of the image embeddings takes that
 * row (fp32, as given) in place of its embedding; every other token reads E as before. */
template <typename A>
__global__ void __launch_bounds__(NORM_THREADS) embed_rmsnorm_kernel(const bf16 *__restrict__ E,
                                                                     const cu_batch b, float *__restrict__ h,
                                                                     A *__restrict__ x, const float *__restrict__ w,
                                                                     int H, float eps) {
    __shared__ float red[NORM_THREADS / 32];
    const int t = blockIdx.x;
    const int emb = b.embeds && (b.prm[t / b.bucket].image & CU_ROW_EMBEDS) ? b.img[t].emb : -1;
    float *hr = h + (size_t)t * H;
    float ss = 0.f;
    if (emb >= 0) {
        const float *e = b.embeds + (size_t)emb * H;
        for (int i = threadIdx.x; i < H; i += NORM_THREADS) {
            const float v = e[i];
            hr[i] = v;
            ss += v * v;
        }
    } else {
        const bf16 *e = E + (size_t)b.ids[t] * H;
        for (int i = threadIdx.x; i < H; i += NORM_THREADS) {
            float v = __bfloat162float(e[i]);
            hr[i] = v;
            ss += v * v;
        }
    }
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / (float)H + eps);
    A *xr = x + (size_t)t * H;
    for (int i = threadIdx.x; i < H; i += NORM_THREADS) cu_st(xr + i, hr[i] * r * (1.f + w[i]));
}

/* 1 / rms(hr[0 .. H)) with eps, over the block (scalar loads: the rows no vector path takes, and a
 * letter slot's row). */
__device__ static float rms_inv(const float *hr, int H, float eps, float *red) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += NORM_THREADS) {
        const float v = hr[i];
        ss += v * v;
    }
    ss = block_sum(ss, red);
    return rsqrtf(ss / (float)H + eps);
}

/* Four outputs at once (p 8-byte aligned for bf16, 16 for fp32). */
__device__ __forceinline__ void st4(bf16 *p, float a, float b, float c, float d) {
    uint2 v;
    v.x = cu_pack_bf16(a, b);
    v.y = cu_pack_bf16(c, d);
    *reinterpret_cast<uint2 *>(p) = v;
}
__device__ __forceinline__ void st4(float *p, float a, float b, float c, float d) {
    *reinterpret_cast<float4 *>(p) = make_float4(a, b, c, d);
}

#define NORM_VEC 4 /* float4s of a row a thread keeps in registers: rows up to 4 x 256 x 4 = 4096 */

/* One block per row. When the row fits (H a multiple of 4, at most 4 NORM_THREADS NORM_VEC) and
 * the pointers are 16-byte aligned, each thread reads its float4s once and keeps them (the first
 * version read h twice with scalar loads: ~1.8 TB/s on a 2048-row chunk); else scalar loops. */
template <typename A>
__global__ void __launch_bounds__(NORM_THREADS) rmsnorm_kernel(const float *__restrict__ h, A *__restrict__ x,
                                                               const float *__restrict__ w, int H, float eps) {
    __shared__ float red[NORM_THREADS / 32];
    const int t = blockIdx.x;
    const float *hr = h + (size_t)t * H;
    A *xr = x + (size_t)t * H;
    const bool vec = H % 4 == 0 && H <= 4 * NORM_THREADS * NORM_VEC &&
                     (((uintptr_t)hr | (uintptr_t)w | (uintptr_t)xr) & 15u) == 0;
    if (vec) {
        float4 v[NORM_VEC];
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < NORM_VEC; k++) {
            const int i = 4 * (threadIdx.x + k * NORM_THREADS);
            v[k] = i < H ? *reinterpret_cast<const float4 *>(hr + i) : make_float4(0.f, 0.f, 0.f, 0.f);
            ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
        }
        ss = block_sum(ss, red);
        const float r = rsqrtf(ss / (float)H + eps);
#pragma unroll
        for (int k = 0; k < NORM_VEC; k++) {
            const int i = 4 * (threadIdx.x + k * NORM_THREADS);
            if (i >= H) break;
            const float4 wv = *reinterpret_cast<const float4 *>(w + i);
            st4(xr + i, v[k].x * r * (1.f + wv.x), v[k].y * r * (1.f + wv.y), v[k].z * r * (1.f + wv.z),
                v[k].w * r * (1.f + wv.w));
        }
        return;
    }
    const float r = rms_inv(hr, H, eps, red);
    for (int i = threadIdx.x; i < H; i += NORM_THREADS) cu_st(xr + i, hr[i] * r * (1.f + w[i]));
}

/* Two outputs per thread (I is even); one row per blockIdx.y. */
__global__ void silu_mul_kernel(const bf16 *__restrict__ gu, bf16 *__restrict__ out, int I) {
    const int t = blockIdx.y;
    const int i = 2 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= I) return;
    const __nv_bfloat162 g = *reinterpret_cast<const __nv_bfloat162 *>(gu + (size_t)t * 2 * I + i);
    const __nv_bfloat162 u = *reinterpret_cast<const __nv_bfloat162 *>(gu + (size_t)t * 2 * I + I + i);
    const float a = cu_silu(__low2float(g)) * __low2float(u);
    const float b = cu_silu(__high2float(g)) * __high2float(u);
    *reinterpret_cast<__nv_bfloat162 *>(out + (size_t)t * I + i) = __floats2bfloat162_rn(a, b);
}
__global__ void silu_mul_f32_kernel(const float *__restrict__ gu, float *__restrict__ out, int I) {
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= I) return;
    const float g = gu[(size_t)t * 2 * I + i], u = gu[(size_t)t * 2 * I + I + i];
    out[(size_t)t * I + i] = g / (1.f + expf(-g)) * u;
}

/* Blocks sharing a row's slots: a block per slot for a row alone (every slot at once), fewer per row
 * as the rows grow (a hit has a handful of slots), never fewer than LETTER_MIN_BLOCKS. */
#define LETTER_MIN_BLOCKS 4

/* Blocks per row taking its slots in turn; xn (the normed row) in dynamic shared memory. */
__global__ void __launch_bounds__(NORM_THREADS) letter_probs_kernel(const float *__restrict__ h,
                                                                    const float *__restrict__ w,
                                                                    const bf16 *__restrict__ E, cu_batch b,
                                                                    float *__restrict__ probs, int H, float eps) {
    extern __shared__ float xn[];
    __shared__ float red[NORM_THREADS / 32];
    __shared__ float logit[CU_MAX_LETTERS];
    const int row = blockIdx.y;
    const int n_slots = b.prm[row].len > 0 ? b.prm[row].n_slots : 0;
    const cu_row_answers *prm = b.ans + row;
    const int nl = prm->n_letters;
    /* a few blocks a row take its slots in turn (a hit has a handful; the grid serves any count) */
    for (int s = blockIdx.x; s < n_slots; s += gridDim.x) {
        const float *hr = h + ((size_t)row * b.bucket + prm->slots[s]) * H;
        const float r = rms_inv(hr, H, eps, red);
        for (int i = threadIdx.x; i < H; i += NORM_THREADS) xn[i] = hr[i] * r * (1.f + w[i]);
        __syncthreads();
        /* warp wp takes letters wp, wp + NW, ...: all of its rows' loads are issued before any sum, 16
         * bytes a lane (H a multiple of 256), so a slot costs about one round trip to the embedding
         * rows, not one per letter and 32-element step */
        constexpr int NW = NORM_THREADS / 32, LPW = (CU_MAX_LETTERS + NW - 1) / NW;
        const int wp = threadIdx.x >> 5, l = threadIdx.x & 31;
        float d[LPW];
#pragma unroll
        for (int q = 0; q < LPW; q++) d[q] = 0.f;
        if (H % 256 == 0) {
            for (int i = 8 * l; i < H; i += 256) {
                uint4 ev[LPW];
#pragma unroll
                for (int q = 0; q < LPW; q++) {
                    const int j = wp + q * NW;
                    ev[q] = j < nl ? *(const uint4 *)(E + (size_t)prm->letters[j] * H + i) : make_uint4(0, 0, 0, 0);
                }
                const float4 x0 = *(const float4 *)(xn + i), x1 = *(const float4 *)(xn + i + 4);
                const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                for (int q = 0; q < LPW; q++) {
                    const __nv_bfloat162 *e2 = (const __nv_bfloat162 *)&ev[q];
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        const float2 ef = __bfloat1622float2(e2[u]);
                        d[q] += xv[2 * u] * ef.x + xv[2 * u + 1] * ef.y;
                    }
                }
            }
        } else {
#pragma unroll
            for (int q = 0; q < LPW; q++) {
                const int j = wp + q * NW;
                if (j >= nl) break;
                const bf16 *e = E + (size_t)prm->letters[j] * H;
                for (int i = l; i < H; i += 32) d[q] += xn[i] * __bfloat162float(e[i]);
            }
        }
#pragma unroll
        for (int q = 0; q < LPW; q++) {
            const float dq = cu_warp_sum(d[q]);
            if (l == 0 && wp + q * NW < nl) logit[wp + q * NW] = dq;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int no = prm->nopts[s];
            if (no > nl) no = nl;
            if (no < 1) no = 1;
            float m = -INFINITY;
            for (int j = 0; j < no; j++) m = fmaxf(m, logit[j]);
            float z = 0.f;
            for (int j = 0; j < no; j++) z += expf(logit[j] - m);
            float *p = probs + ((size_t)row * CU_MAX_SLOTS + s) * CU_MAX_LETTERS;
            for (int j = 0; j < CU_MAX_LETTERS; j++) p[j] = j < no ? expf(logit[j] - m) / z : 0.f;
        }
    }
}

/* ---- launchers ---------------------------------------------------------------------------------- */

int cu_embed_rmsnorm(const bf16 *E, const cu_batch *b, float *h, void *x, const float *w, int H, float eps, int f32,
                     cudaStream_t st, squad_err *err) {
    const int rows = b->nrows * b->bucket;
    if (f32)
        embed_rmsnorm_kernel<float><<<rows, NORM_THREADS, 0, st>>>(E, *b, h, (float *)x, w, H, eps);
    else
        embed_rmsnorm_kernel<bf16><<<rows, NORM_THREADS, 0, st>>>(E, *b, h, (bf16 *)x, w, H, eps);
    CU_LAUNCH_CHECK("embed_rmsnorm_kernel");
    return 0;
}

int cu_rmsnorm(const float *h, void *x, const float *w, int rows, int H, float eps, int f32, cudaStream_t st,
               squad_err *err) {
    if (f32)
        rmsnorm_kernel<float><<<rows, NORM_THREADS, 0, st>>>(h, (float *)x, w, H, eps);
    else
        rmsnorm_kernel<bf16><<<rows, NORM_THREADS, 0, st>>>(h, (bf16 *)x, w, H, eps);
    CU_LAUNCH_CHECK("rmsnorm_kernel");
    return 0;
}

int cu_silu_mul(const void *gu, void *out, int rows, int I, int f32, cudaStream_t st, squad_err *err) {
    const int threads = 256;
    if (f32) {
        dim3 grid((unsigned)((I + threads - 1) / threads), (unsigned)rows);
        silu_mul_f32_kernel<<<grid, threads, 0, st>>>((const float *)gu, (float *)out, I);
    } else {
        if (I % 2) return cu_err(err, SQUAD_E_UNSUPPORTED, "CUDA: intermediate_size %d must be even", I);
        dim3 grid((unsigned)((I / 2 + threads - 1) / threads), (unsigned)rows);
        silu_mul_kernel<<<grid, threads, 0, st>>>((const bf16 *)gu, (bf16 *)out, I);
    }
    CU_LAUNCH_CHECK("silu_mul_kernel");
    return 0;
}

int cu_letter_probs(const float *h, const float *w, const bf16 *E, const cu_batch *b, int max_slots, float *probs,
                    int H, float eps, cudaStream_t st, squad_err *err) {
    if (max_slots < 1) return 0;
    int per_row = CU_MAX_SLOTS / b->nrows;
    if (per_row < LETTER_MIN_BLOCKS) per_row = LETTER_MIN_BLOCKS;
    if (per_row > max_slots) per_row = max_slots;
    const dim3 grid((unsigned)per_row, (unsigned)b->nrows);
    letter_probs_kernel<<<grid, NORM_THREADS, (size_t)H * sizeof(float), st>>>(h, w, E, *b, probs, H, eps);
    CU_LAUNCH_CHECK("letter_probs_kernel");
    return 0;
}
