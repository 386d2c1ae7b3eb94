/*
 * k_lora.cu — the specialists' kernels (k_lora.cuh): the low-rank term of an adapted projection
 * and the router's feature sum.
 *
 * Design: the rank is small (r <= 64 in practice), so the two products are plain CUDA rather than
 * tensor-core GEMMs: the down product u = A x gives one warp per rank row of one token (a dot
 * product over `in`, reduced with shuffles), the up product y += s B u one thread per output of
 * one token (r multiply-adds over B^T, whose rows the threads read consecutively). Both read the
 * adapter from the device table at run time (k_lora.cuh), so the same launches serve every route.
 * Only the chunk's real tokens are computed; padding rows keep the shared projection alone (they
 * are masked downstream anyway). The router's sum follows squad_router_norm_add: squares summed in
 * double, the normalisation in fp32 with round-to-nearest intrinsics (the library is built with
 * --use_fast_math, which would otherwise approximate them), the normalised values summed in double.
 */
#include "k_lora.cuh"

#define LORA_THREADS 256
#define LORA_WARPS (LORA_THREADS / 32)
#define ROUTER_THREADS 256

template <typename X>
__global__ void k_lora_down(const cu_lora_entry *col, int stride, const int *slot_dev, const cu_chunk_params *prm,
                            const X *x, int ldx, float *u) {
    const int slot = *slot_dev, t = blockIdx.x;
    if (slot <= 0 || t >= prm->len) return;
    const cu_lora_entry e = col[(size_t)(slot - 1) * stride];
    if (e.r <= 0) return;
    const X *xt = x + (size_t)t * ldx;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int k = warp; k < e.r; k += LORA_WARPS) {
        const float *a = e.A + (size_t)k * e.in;
        float s = 0.0f;
        for (int i = lane; i < e.in; i += 32) s += a[i] * cu_ld(xt + i);
        s = cu_warp_sum(s);
        if (lane == 0) u[(size_t)t * e.r + k] = s;
    }
}

template <typename Y>
__global__ void k_lora_up(const cu_lora_entry *col, int stride, const int *slot_dev, const cu_chunk_params *prm,
                          const float *u, Y *y, int ldy, int yoff) {
    const int slot = *slot_dev, t = blockIdx.y;
    if (slot <= 0 || t >= prm->len) return;
    const cu_lora_entry e = col[(size_t)(slot - 1) * stride];
    const int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (e.r <= 0 || o >= e.out) return;
    const float *ut = u + (size_t)t * e.r;
    float s = 0.0f;
    for (int k = 0; k < e.r; k++) s += e.Bt[(size_t)k * e.out + o] * ut[k];
    Y *p = y + (size_t)t * ldy + yoff + o;
    cu_st(p, cu_ld(p) + e.scale * s);
}

template <typename X, typename Y>
static int launch_lora(const cu_lora_entry *col, int stride, const int *slot_dev, const cu_chunk_params *prm,
                       const X *x, int ldx, Y *y, int ldy, int yoff, int out_max, float *u, int rows, cudaStream_t st,
                       squad_err *err) {
    k_lora_down<X><<<rows, LORA_THREADS, 0, st>>>(col, stride, slot_dev, prm, x, ldx, u);
    CU_LAUNCH_CHECK("k_lora_down");
    const dim3 grid((unsigned)((out_max + LORA_THREADS - 1) / LORA_THREADS), (unsigned)rows);
    k_lora_up<Y><<<grid, LORA_THREADS, 0, st>>>(col, stride, slot_dev, prm, u, y, ldy, yoff);
    CU_LAUNCH_CHECK("k_lora_up");
    return 0;
}

int cu_lora(const cu_lora_entry *col, int stride, const int *slot_dev, const cu_chunk_params *prm, const void *x,
            int ldx, int x_f32, void *y, int ldy, int yoff, int y_f32, int out_max, float *u, int rows,
            cudaStream_t st, squad_err *err) {
    if (rows < 1 || out_max < 1 || stride < 1)
        return cu_err(err, SQUAD_E_INVALID, "cu_lora: rows %d, out %d, stride %d", rows, out_max, stride);
    if (x_f32 && y_f32)
        return launch_lora(col, stride, slot_dev, prm, (const float *)x, ldx, (float *)y, ldy, yoff, out_max, u, rows,
                           st, err);
    if (x_f32)
        return launch_lora(col, stride, slot_dev, prm, (const float *)x, ldx, (bf16 *)y, ldy, yoff, out_max, u, rows,
                           st, err);
    if (y_f32)
        return launch_lora(col, stride, slot_dev, prm, (const bf16 *)x, ldx, (float *)y, ldy, yoff, out_max, u, rows,
                           st, err);
    return launch_lora(col, stride, slot_dev, prm, (const bf16 *)x, ldx, (bf16 *)y, ldy, yoff, out_max, u, rows, st,
                       err);
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
