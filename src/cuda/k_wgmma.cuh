/*
 * k_wgmma.cuh — Hopper's warpgroup matrix multiply (wgmma) as the sm_90a kernels use it
 * (k_gemm_sm90.cu, k_attn_sm90.cu): shared-memory matrix descriptors, the fence / commit / wait of
 * the asynchronous groups, register pins, and the m64n64k16 product with both operands in shared
 * memory; and the probe that tells the host whether this cubin's sm_90a code runs here.
 *
 * Why one header: the two kernels issue the same instructions; a primitive written once is checked
 * by both kernels' tests. Everything but the probe is device code for the sm_90a target only: it is
 * compiled where __CUDA_ARCH_FEAT_SM90_ALL is defined (the files in CMakeLists.txt's
 * SQUAD_CUDA_SM90A_SOURCES, built for sm_90a alone) and is empty elsewhere.
 */
#ifndef SQUAD_CUDA_K_WGMMA_CUH
#define SQUAD_CUDA_K_WGMMA_CUH

#include "cuda_internal.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* A shared-memory matrix descriptor, 128-byte swizzle; lbo / sbo in bytes (K-major: sbo between
 * 8-row groups, lbo unused, 16 by convention; MN-major: lbo between 64-element panels along MN,
 * sbo between 8-row groups along K). */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    uint64_t d = (uint64_t)((saddr & 0x3FFFFu) >> 4);
    d |= (uint64_t)((lbo >> 4) & 0x3FFFu) << 16;
    d |= (uint64_t)((sbo >> 4) & 0x3FFFu) << 32;
    d |= (uint64_t)1 << 62;
    return d;
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* Waits until at most N of this warp's committed wgmma groups are still running. */
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving a register an in-flight wgmma reads or writes across its wait. */
__device__ __forceinline__ void wg_pin(float &x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void wg_pin_r(uint32_t &x) { asm volatile("" : "+r"(x)::"memory"); }

/* D[64][64] (+)= A[64][16] B[16][64]: both K-major in shared memory (descriptors da, db), fp32
 * accumulators in the m64nNk16 fragment layout; acc 0 overwrites D. */
__device__ __forceinline__ void wg_m64n64k16(float (&d)[32], uint64_t da, uint64_t db, int acc) {
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
        : "l"(da), "l"(db), "r"(acc)
        : "memory");
}
#endif

/* Writes 1 when the cubin it runs from holds the Hopper code (built with __CUDA_ARCH_FEAT_SM90_ALL). */
static __global__ void cu_sm90a_probe_kernel(int *out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *out = 1;
#else
    *out = 0;
#endif
}

/* *ok = 1 when the current device runs the sm_90a code of the file that includes this: compute
 * capability 9.0 (the only one an sm_90a cubin loads on) and the probe kernel, launched from that
 * file, reporting the Hopper build; 0 otherwise. An error only when the probe itself fails. */
static inline int cu_sm90a_runs(int *ok, squad_err *err) {
    *ok = 0;
    int dev = 0, major = 0, minor = 0;
    CU_TRY(cudaGetDevice(&dev));
    CU_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CU_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9 || minor != 0) return 0;
    int *d = NULL, h = 0;
    CU_TRY(cudaMalloc(&d, sizeof(int)));
    cu_sm90a_probe_kernel<<<1, 1>>>(d);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess) return cu_fail(err, "cu_sm90a_probe_kernel", e, __FILE__, __LINE__);
    *ok = h == 1;
    return 0;
}

#endif
