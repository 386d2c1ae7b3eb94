/*
 * cuda_test_vision.cu — the vision tower's entry points for the tests and the benchmark
 * (cuda_test_api.h): its attention kernels (vis_attn on mma.sync, on wgmma where the GPU runs it,
 * and the exact path's fp32 vis_attn_f32) on host data beside a double-precision host reference, and
 * the device part of a backend's tower timed by events.
 */
#include "cuda_test_common.cuh"

#include <math.h>
#include <stdlib.h>

extern "C" {
#include "cuda_test_api.h"
}
#include "cuda/vision_cuda.cuh"

extern "C" void cu_ref_vis_attn(int hd, int frames, int L, int heads, const float *Q, const float *K, const float *V,
                                float *out) {
    const size_t N = (size_t)frames * L;
    const double scale = 1.0 / sqrt((double)hd);
    double *s = (double *)malloc(sizeof(double) * (size_t)L), *acc = (double *)malloc(sizeof(double) * (size_t)hd);
    if (!s || !acc) {
        free(s), free(acc);
        return;
    }
    for (int h = 0; h < heads; h++)
        for (int f = 0; f < frames; f++)
            for (int i = 0; i < L; i++) {
                const float *q = Q + ((size_t)h * N + (size_t)f * L + i) * hd;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < L; j++) {
                    const float *k = K + ((size_t)h * N + (size_t)f * L + j) * hd;
                    double dot = 0;
                    for (int d = 0; d < hd; d++) dot += (double)q[d] * k[d];
                    s[j] = dot * scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int d = 0; d < hd; d++) acc[d] = 0;
                for (int j = 0; j < L; j++) {
                    const double p = exp(s[j] - mx);
                    const float *v = V + ((size_t)h * N + (size_t)f * L + j) * hd;
                    sum += p;
                    for (int d = 0; d < hd; d++) acc[d] += p * v[d];
                }
                float *o = out + ((size_t)f * L + i) * heads * hd + (size_t)h * hd;
                for (int d = 0; d < hd; d++) o[d] = (float)(acc[d] / sum);
            }
    free(s), free(acc);
}

/* One of the two kernels (wg: the wgmma one) on host data. */
static int vis_attn_on_host(int wg, int hd, int frames, int L, int heads, const float *Q, const float *K,
                            const float *V, float *out, squad_err *err) {
    if (wg) {
        int ok = 0;
        const int rc = cu_vis_attn_sm90_probe(&ok, err);
        if (rc) return rc;
        int dev = 0, major = 0, minor = 0;
        CU_TRY(cudaGetDevice(&dev));
        CU_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        CU_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        if (!ok && major == 9 && minor == 0) /* a Hopper GPU must run it: a failing probe is a bug */
            return cu_err(err, SQUAD_E_BACKEND, "the wgmma vision attention's probe failed on a 9.0 GPU");
        if (!ok || !cu_vis_attn_sm90_takes(hd))
            return cu_err(err, SQUAD_E_UNSUPPORTED, "the wgmma vision attention does not run here (hd %d)", hd);
    }
    const size_t n = (size_t)heads * frames * L * hd;
    uint16_t *h = (uint16_t *)malloc(n * 2);
    if (!h) return cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
    bf16 *d[4] = {NULL, NULL, NULL, NULL};
    int rc = 0;
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 4 && e == cudaSuccess; i++) e = cudaMalloc((void **)&d[i], n * 2);
    const float *src[3] = {Q, K, V};
    for (int i = 0; i < 3 && e == cudaSuccess; i++) {
        for (size_t j = 0; j < n; j++) h[j] = squad_f32_to_bf16(src[i][j]);
        e = cudaMemcpy(d[i], h, n * 2, cudaMemcpyHostToDevice);
    }
    /* the output poisoned (NaN): a row the kernel misses shows */
    if (e == cudaSuccess) e = cudaMemset(d[3], 0xff, n * 2);
    if (e != cudaSuccess) rc = cu_fail(err, "vision attention test buffers", e, __FILE__, __LINE__);
    if (!rc) rc = cu_vis_attn_init(hd, err);
    if (!rc && wg)
        rc = cu_vis_attn_sm90(d[0], d[1], d[2], frames, L, heads, hd, 1.0f / sqrtf((float)hd), d[3], 0, err);
    else if (!rc)
        rc = cu_vis_attn(d[0], d[1], d[2], frames, L, heads, hd, 1.0f / sqrtf((float)hd), d[3], 0, err);
    if (!rc && (e = cudaDeviceSynchronize()) != cudaSuccess) rc = cu_fail(err, "vis_attn", e, __FILE__, __LINE__);
    if (!rc && (e = cudaMemcpy(h, d[3], n * 2, cudaMemcpyDeviceToHost)) != cudaSuccess)
        rc = cu_fail(err, "cudaMemcpy", e, __FILE__, __LINE__);
    if (!rc)
        for (size_t j = 0; j < n; j++) out[j] = squad_bf16_to_f32(h[j]);
    for (int i = 0; i < 4; i++)
        if (d[i]) cudaFree(d[i]);
    free(h);
    return rc;
}

extern "C" int squad_cuda_test_vis_attn(int hd, int frames, int L, int heads, const float *Q, const float *K,
                                        const float *V, float *out, squad_err *err) {
    return vis_attn_on_host(0, hd, frames, L, heads, Q, K, V, out, err);
}

extern "C" int squad_cuda_test_vis_attn_wg(int hd, int frames, int L, int heads, const float *Q, const float *K,
                                           const float *V, float *out, squad_err *err) {
    return vis_attn_on_host(1, hd, frames, L, heads, Q, K, V, out, err);
}

extern "C" int squad_cuda_test_vis_attn_f32(int hd, int frames, int L, int heads, const float *Q, const float *K,
                                            const float *V, float *out, squad_err *err) {
    if (!cu_vis_attn_supported(hd)) return cu_err(err, SQUAD_E_UNSUPPORTED, "vision attention: head dim %d", hd);
    const size_t bytes = (size_t)heads * frames * L * hd * sizeof(float);
    float *d[4] = {NULL, NULL, NULL, NULL};
    int rc = 0;
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 4 && e == cudaSuccess; i++) e = cudaMalloc((void **)&d[i], bytes);
    const float *src[3] = {Q, K, V};
    for (int i = 0; i < 3 && e == cudaSuccess; i++) e = cudaMemcpy(d[i], src[i], bytes, cudaMemcpyHostToDevice);
    /* the output poisoned (NaN): a row the kernel misses shows */
    if (e == cudaSuccess) e = cudaMemset(d[3], 0xff, bytes);
    if (e != cudaSuccess) rc = cu_fail(err, "vision attention (fp32) test buffers", e, __FILE__, __LINE__);
    if (!rc) rc = cu_vis_attn_f32(d[0], d[1], d[2], frames, L, heads, hd, 1.0f / sqrtf((float)hd), d[3], 0, err);
    if (!rc && (e = cudaDeviceSynchronize()) != cudaSuccess) rc = cu_fail(err, "vis_attn_f32", e, __FILE__, __LINE__);
    if (!rc && (e = cudaMemcpy(out, d[3], bytes, cudaMemcpyDeviceToHost)) != cudaSuccess)
        rc = cu_fail(err, "cudaMemcpy", e, __FILE__, __LINE__);
    for (int i = 0; i < 4; i++)
        if (d[i]) cudaFree(d[i]);
    return rc;
}

extern "C" int squad_cuda_test_vis_attn_time(int wg, int hd, int L, int heads, int reps, double *ms, squad_err *err) {
    if (wg) {
        int ok = 0;
        const int rc = cu_vis_attn_sm90_probe(&ok, err);
        if (rc) return rc;
        if (!ok || !cu_vis_attn_sm90_takes(hd))
            return cu_err(err, SQUAD_E_UNSUPPORTED, "the wgmma vision attention does not run here (hd %d)", hd);
    }
    const size_t n = (size_t)heads * L * hd;
    uint16_t *h = (uint16_t *)malloc(n * 2);
    if (!h) return cu_err(err, SQUAD_E_NOMEM, "test: out of memory");
    uint64_t seed = 0x9e3779b97f4a7c15ull; /* values in [-2, 2): a softmax neither flat nor one-hot */
    for (size_t j = 0; j < n; j++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        h[j] = squad_f32_to_bf16((float)((double)(seed >> 40) / (double)(1ull << 24) * 4.0 - 2.0));
    }
    bf16 *d[4] = {NULL, NULL, NULL, NULL};
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = 0;
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 4 && e == cudaSuccess; i++) e = cudaMalloc((void **)&d[i], n * 2);
    for (int i = 0; i < 3 && e == cudaSuccess; i++) e = cudaMemcpy(d[i], h, n * 2, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaEventCreate(&e0);
    if (e == cudaSuccess) e = cudaEventCreate(&e1);
    if (e != cudaSuccess) rc = cu_fail(err, "vision attention timing buffers", e, __FILE__, __LINE__);
    if (!rc) rc = cu_vis_attn_init(hd, err);
    const float scale = 1.0f / sqrtf((float)hd);
    for (int r = -1; r < reps && !rc; r++) { /* r -1: a warm-up */
        if ((e = cudaEventRecord(e0, 0)) != cudaSuccess) break;
        rc = wg ? cu_vis_attn_sm90(d[0], d[1], d[2], 1, L, heads, hd, scale, d[3], 0, err)
                : cu_vis_attn(d[0], d[1], d[2], 1, L, heads, hd, scale, d[3], 0, err);
        if (rc || (e = cudaEventRecord(e1, 0)) != cudaSuccess || (e = cudaEventSynchronize(e1)) != cudaSuccess) break;
        float f = 0.f;
        if ((e = cudaEventElapsedTime(&f, e0, e1)) != cudaSuccess) break;
        if (r >= 0) ms[r] = f;
    }
    if (!rc && e != cudaSuccess) rc = cu_fail(err, "timing the vision attention", e, __FILE__, __LINE__);
    cudaDeviceSynchronize();
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    for (int i = 0; i < 4; i++)
        if (d[i]) cudaFree(d[i]);
    free(h);
    return rc;
}

extern "C" int squad_cuda_test_vision_time(struct squad_backend *be, const float *pixel_values, const int grid[3],
                                           int reps, double *ms, squad_err *err) {
    cu_vision *v = NULL;
    cu_gemm_ctx *g = NULL;
    cudaStream_t st = NULL;
    const int rc = cu_backend_vision(be, &v, &g, &st, err);
    if (rc) return rc;
    return cu_vision_time(v, g, st, pixel_values, grid, reps, ms, err);
}
