/*
 * k_vocab.cu — the full-vocabulary figures of a chunk's answer slots (backend.h): for each slot
 * the log-sum-exp of its logits over the whole vocabulary, the largest logit and its token id (the
 * lowest on a tie), and the log-sum-exp of its first nopts letters' logits.
 *
 * Design: three kernels, enqueued after the chunk's forward (graph replay or eager) and only for a
 * chunk that asks, so a chunk that does not ask runs exactly what it ran before.
 *  1. vocab_norm: one block per (slot, row) of the batch's rows that ask (prm[r].vocab_base >= 0):
 *     the slot's final-normed row xn (the letter kernel's formula, fp32) to a small buffer at the
 *     slot's figure index vocab_base + i, and the letters' logits (fp32 dot products with the bf16
 *     rows, as the letter kernel) reduced to letters_lse. The slots of every asking row form one
 *     list, so one pass over the embedding serves up to a group of slots of several rows.
 *  2. vocab_partial: blocks over ranges of the vocabulary. A block keeps the rows xn of up to
 *     CU_VOCAB_GROUP slots in shared memory; each warp walks its block's vocabulary rows, every lane
 *     reading 16 bytes of a row at a time, so each embedding row is read once for all of the group's
 *     slots. A warp keeps, per slot, a running maximum, the sum of exp(z - max) and the maximum's
 *     id (online: a larger logit rescales the sum); the block merges its warps and writes one
 *     partial per slot. No logit is stored.
 *  3. vocab_combine: one warp per slot merges the blocks' partials (the sum in double).
 * A chunk with more slots than a group (CU_VOCAB_GROUP, fewer when the hidden size would not fit
 * shared memory) runs 2-3 once per group of slots.
 */
#include "cuda_internal.cuh"

#include <math.h>

#define VOCAB_THREADS 256
#define VOCAB_WARPS (VOCAB_THREADS / 32)
/* Blocks of the vocabulary pass per SM: enough warps in flight to keep the embedding's reads
 * streaming. */
#define VOCAB_BLOCKS_PER_SM 4
/* The most shared memory a block's slot rows may take (the group shrinks for wide models). */
#define VOCAB_SMEM_MAX (160 * 1024)

/* A running reduction of logits (see the top). */
struct vocab_acc {
    float max, sum;
    int arg; /* -1: nothing reduced yet */
    int pad_;
};

/* a and b merged; the lowest id wins a tie. */
__device__ __forceinline__ vocab_acc acc_merge(vocab_acc a, vocab_acc b) {
    if (b.arg < 0) return a;
    if (a.arg < 0) return b;
    vocab_acc r;
    r.max = fmaxf(a.max, b.max);
    r.arg = (a.max > b.max || (a.max == b.max && a.arg < b.arg)) ? a.arg : b.arg;
    r.sum = a.sum * __expf(a.max - r.max) + b.sum * __expf(b.max - r.max);
    r.pad_ = 0;
    return r;
}

__global__ void __launch_bounds__(VOCAB_THREADS) vocab_norm_kernel(const float *__restrict__ h,
                                                                   const float *__restrict__ w,
                                                                   const bf16 *__restrict__ E,
                                                                   cu_batch b, float *__restrict__ xn_all,
                                                                   squad_slot_vocab *__restrict__ out_all, int H,
                                                                   float eps) {
    extern __shared__ float xn[];
    __shared__ float red[VOCAB_WARPS];
    __shared__ float logit[CU_MAX_LETTERS];
    const int s = blockIdx.x, row = blockIdx.y;
    const cu_chunk_params *rp = b.prm + row;
    if (rp->vocab_base < 0 || rp->len < 1 || s >= rp->n_slots) return;
    const cu_row_answers *prm = b.ans + row;
    float *xn_out = xn_all + (size_t)rp->vocab_base * H;
    squad_slot_vocab *out = out_all + rp->vocab_base;
    const float *hr = h + ((size_t)row * b.bucket + prm->slots[s]) * H;
    const int wp = threadIdx.x >> 5, l = threadIdx.x & 31;
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += VOCAB_THREADS) ss += hr[i] * hr[i];
    ss = cu_warp_sum(ss);
    if (l == 0) red[wp] = ss;
    __syncthreads();
    ss = 0.f;
#pragma unroll
    for (int i = 0; i < VOCAB_WARPS; i++) ss += red[i];
    const float r = rsqrtf(ss / (float)H + eps);
    for (int i = threadIdx.x; i < H; i += VOCAB_THREADS) {
        const float v = hr[i] * r * (1.f + w[i]);
        xn[i] = v;
        xn_out[(size_t)s * H + i] = v;
    }
    __syncthreads();
    int no = prm->nopts[s];
    if (no > prm->n_letters) no = prm->n_letters;
    if (no < 1) no = 1;
    for (int j = wp; j < no; j += VOCAB_WARPS) {
        const bf16 *e = E + (size_t)prm->letters[j] * H;
        float d = 0.f;
        for (int i = l; i < H; i += 32) d += xn[i] * __bfloat162float(e[i]);
        d = cu_warp_sum(d);
        if (l == 0) logit[j] = d;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = -INFINITY;
        for (int j = 0; j < no; j++) m = fmaxf(m, logit[j]);
        float z = 0.f;
        for (int j = 0; j < no; j++) z += expf(logit[j] - m);
        out[s].letters_lse = m + logf(z);
    }
}

/* The logit of one vocabulary row for each of the group's g slots (every lane gets the sums). */
template <bool VEC>
__device__ __forceinline__ void row_logits(const bf16 *__restrict__ e, const float *xn, int H, int g, int l,
                                           float d[CU_VOCAB_GROUP]) {
#pragma unroll
    for (int s = 0; s < CU_VOCAB_GROUP; s++) d[s] = 0.f;
    if (VEC) { /* H a multiple of 256: 8 values a lane per step */
        for (int i = 8 * l; i < H; i += 256) {
            const uint4 ev = *(const uint4 *)(e + i);
            const __nv_bfloat162 *e2 = (const __nv_bfloat162 *)&ev;
            float ef[8];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const float2 f = __bfloat1622float2(e2[u]);
                ef[2 * u] = f.x;
                ef[2 * u + 1] = f.y;
            }
#pragma unroll
            for (int s = 0; s < CU_VOCAB_GROUP; s++) {
                if (s >= g) break;
                const float4 x0 = *(const float4 *)(xn + (size_t)s * H + i);
                const float4 x1 = *(const float4 *)(xn + (size_t)s * H + i + 4);
                d[s] += x0.x * ef[0] + x0.y * ef[1] + x0.z * ef[2] + x0.w * ef[3] + x1.x * ef[4] + x1.y * ef[5] +
                        x1.z * ef[6] + x1.w * ef[7];
            }
        }
    } else {
        for (int i = l; i < H; i += 32) {
            const float ev = __bfloat162float(e[i]);
#pragma unroll
            for (int s = 0; s < CU_VOCAB_GROUP; s++) {
                if (s >= g) break;
                d[s] += xn[(size_t)s * H + i] * ev;
            }
        }
    }
#pragma unroll
    for (int s = 0; s < CU_VOCAB_GROUP; s++)
        if (s < g) d[s] = cu_warp_sum(d[s]);
}

template <bool VEC>
__global__ void __launch_bounds__(VOCAB_THREADS) vocab_partial_kernel(const float *__restrict__ xn_g,
                                                                      const bf16 *__restrict__ E, int V, int H, int g,
                                                                      vocab_acc *__restrict__ parts) {
    extern __shared__ float xn[]; /* [g][H] */
    __shared__ vocab_acc wacc[VOCAB_WARPS][CU_VOCAB_GROUP];
    for (int i = threadIdx.x; i < g * H; i += VOCAB_THREADS) xn[i] = xn_g[i];
    __syncthreads();
    const int per_block = (V + gridDim.x - 1) / gridDim.x;
    const int v0 = blockIdx.x * per_block, v1 = min(V, v0 + per_block);
    const int wp = threadIdx.x >> 5, l = threadIdx.x & 31;
    vocab_acc acc[CU_VOCAB_GROUP];
#pragma unroll
    for (int s = 0; s < CU_VOCAB_GROUP; s++) acc[s] = vocab_acc{-INFINITY, 0.f, -1, 0};
    for (int v = v0 + wp; v < v1; v += VOCAB_WARPS) { /* ascending: a tie keeps the earlier id */
        float d[CU_VOCAB_GROUP];
        row_logits<VEC>(E + (size_t)v * H, xn, H, g, l, d);
#pragma unroll
        for (int s = 0; s < CU_VOCAB_GROUP; s++) {
            if (s >= g) break;
            if (acc[s].arg < 0) {
                acc[s] = vocab_acc{d[s], 1.f, v, 0};
            } else if (d[s] > acc[s].max) {
                acc[s].sum = acc[s].sum * __expf(acc[s].max - d[s]) + 1.f;
                acc[s].max = d[s];
                acc[s].arg = v;
            } else {
                acc[s].sum += __expf(d[s] - acc[s].max);
            }
        }
    }
    if (l == 0) {
#pragma unroll
        for (int s = 0; s < CU_VOCAB_GROUP; s++) wacc[wp][s] = acc[s];
    }
    __syncthreads();
    if (threadIdx.x < g) {
        vocab_acc a = wacc[0][threadIdx.x];
        for (int k = 1; k < VOCAB_WARPS; k++) a = acc_merge(a, wacc[k][threadIdx.x]);
        parts[(size_t)blockIdx.x * CU_VOCAB_GROUP + threadIdx.x] = a;
    }
}

/* One warp per slot of the group: the blocks' partials merged; the sum of the rescaled sums in
 * double. */
__global__ void vocab_combine_kernel(const vocab_acc *__restrict__ parts, int n_parts, int g,
                                     squad_slot_vocab *__restrict__ out) {
    const int s = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (s >= g) return;
    float m = -INFINITY;
    int arg = -1;
    for (int b = l; b < n_parts; b += 32) {
        const vocab_acc a = parts[(size_t)b * CU_VOCAB_GROUP + s];
        if (a.arg >= 0 && (arg < 0 || a.max > m || (a.max == m && a.arg < arg))) m = a.max, arg = a.arg;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, m, o);
        const int oa = __shfl_xor_sync(0xffffffffu, arg, o);
        if (oa >= 0 && (arg < 0 || om > m || (om == m && oa < arg))) m = om, arg = oa;
    }
    double sum = 0.0;
    for (int b = l; b < n_parts; b += 32) {
        const vocab_acc a = parts[(size_t)b * CU_VOCAB_GROUP + s];
        if (a.arg >= 0) sum += (double)a.sum * exp((double)a.max - (double)m);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (l == 0) {
        out[s].vocab_lse = (float)((double)m + log(sum));
        out[s].top_logit = m;
        out[s].top_token = arg;
    }
}

/* ---- launchers ---------------------------------------------------------------------------------- */

int cu_vocab_group(int H) {
    const int fit = (int)(VOCAB_SMEM_MAX / ((size_t)H * sizeof(float)));
    return fit < 1 ? 1 : (fit < CU_VOCAB_GROUP ? fit : CU_VOCAB_GROUP);
}

static size_t partial_smem(int H) { return (size_t)cu_vocab_group(H) * H * sizeof(float); }

int cu_vocab_init(int H, squad_err *err) {
    const size_t smem = partial_smem(H);
    CU_TRY(cudaFuncSetAttribute(vocab_partial_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CU_TRY(cudaFuncSetAttribute(vocab_partial_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CU_TRY(cudaFuncSetAttribute(vocab_norm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)(H * sizeof(float))));
    return 0;
}

int cu_vocab_blocks(int V, int n_sm) {
    const int by_sm = n_sm * VOCAB_BLOCKS_PER_SM;
    const int by_rows = (V + VOCAB_WARPS - 1) / VOCAB_WARPS; /* at least a row per warp */
    return by_sm < by_rows ? by_sm : by_rows;
}

int cu_vocab(const float *h, const float *final_norm, const bf16 *E, const cu_batch *b, int max_row_slots,
             int n_slots, int V, int H, float eps, float *xn, void *parts, int n_blocks, squad_slot_vocab *out,
             cudaStream_t st, squad_err *err) {
    if (n_slots < 1 || max_row_slots < 1) return 0;
    const dim3 ngrid((unsigned)max_row_slots, (unsigned)b->nrows);
    vocab_norm_kernel<<<ngrid, VOCAB_THREADS, (size_t)H * sizeof(float), st>>>(h, final_norm, E, *b, xn, out, H, eps);
    CU_LAUNCH_CHECK("vocab_norm_kernel");
    const bool vec = H % 256 == 0;
    const int group = cu_vocab_group(H);
    for (int g0 = 0; g0 < n_slots; g0 += group) {
        const int g = n_slots - g0 < group ? n_slots - g0 : group;
        const float *xg = xn + (size_t)g0 * H;
        if (vec)
            vocab_partial_kernel<true><<<n_blocks, VOCAB_THREADS, partial_smem(H), st>>>(xg, E, V, H, g,
                                                                                       (vocab_acc *)parts);
        else
            vocab_partial_kernel<false><<<n_blocks, VOCAB_THREADS, partial_smem(H), st>>>(xg, E, V, H, g,
                                                                                        (vocab_acc *)parts);
        CU_LAUNCH_CHECK("vocab_partial_kernel");
        vocab_combine_kernel<<<1, 32 * CU_VOCAB_GROUP, 0, st>>>((const vocab_acc *)parts, n_blocks, g, out + g0);
        CU_LAUNCH_CHECK("vocab_combine_kernel");
    }
    return 0;
}

size_t cu_vocab_parts_bytes(int n_blocks) { return (size_t)n_blocks * CU_VOCAB_GROUP * sizeof(vocab_acc); }
