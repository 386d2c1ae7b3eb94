/*
 * gemm.h — the CPU backend's matrix multiply: fp32 activations times bf16 weights.
 *
 *   y[t][n] = (accumulate ? y[t][n] : 0) + sum_k x[t][k] * W[n][k]
 *
 * x is fp32 [T][K] row-major, W is bf16 [N][K] row-major exactly as the checkpoint stores it (it
 * may point into an mmapped file: any 2-byte aligned address will do), y is fp32 [T][N] and must
 * not overlap x or W. Every linear layer of the model is one such call, so this is where the CPU
 * engine spends its time. One call at a time per pool (the pool's scratch holds the packed operands).
 *
 * Two precisions:
 *   CPU_GEMM_EXACT  the fp32 product: W widened to fp32, fp32 FMAs. Differs from a double-precision
 *                   sum only by fp32 round-off in the summation order (relative ~1e-7).
 *   CPU_GEMM_FAST   x rounded to bf16 once, bf16 x bf16 products summed in fp32 (vdpbf16ps where
 *                   the CPU has it): the llama.cpp-style bf16 path, about twice the throughput,
 *                   relative error ~1e-3.
 *
 * The kernels are chosen at run time from the pool's ISA (cpu_pool_isa): AVX-512 + AVX512_BF16,
 * AVX-512F, AVX2 + FMA, or scalar. The work is spread over the pool's threads; packed operands
 * live in the pool's scratch buffer, so no call allocates once the scratch is large enough
 * (cpu_gemm_reserve). Should the scratch not grow, the call still completes on a slower path that
 * needs no memory: the function cannot fail.
 */
#ifndef SQUAD_CPU_GEMM_H
#define SQUAD_CPU_GEMM_H

#include <stdint.h>

#include "cpu/pool.h"

typedef enum cpu_gemm_precision { CPU_GEMM_EXACT = 0, CPU_GEMM_FAST = 1 } cpu_gemm_precision;

void cpu_gemm_bf16(cpu_pool *pool, float *y, const float *x, const uint16_t *W, int T, int N, int K, int accumulate,
                   cpu_gemm_precision prec);

/* Grows the pool's scratch so calls with T <= max_T and K <= max_K allocate nothing; 0 or
 * SQUAD_E_NOMEM. Optional: a call that finds the scratch too small grows it itself. */
int cpu_gemm_reserve(cpu_pool *pool, int max_T, int max_K, squad_err *err);

/* The test oracle: plain loops with double accumulation (x in fp32 as given: the EXACT result). */
void cpu_gemm_bf16_ref(float *y, const float *x, const uint16_t *W, int T, int N, int K, int accumulate);

/* AUTO takes the DOT form for T at or below this, the packed one above. The two sum each output in
 * different orders; within one form an output's arithmetic does not depend on T (nor on the other
 * rows), which is what lets the backend batch rows and keep every row's result bit for bit. */
#define CPU_GEMM_DOT_MAX_T 4

/* Which algorithm a call uses; AUTO picks by shape. Tests and benchmarks force the others. */
typedef enum cpu_gemm_algo {
    CPU_GEMM_ALGO_AUTO = 0,
    CPU_GEMM_ALGO_DOT = 1,    /* row-by-row dot products on W in place (T small: a GEMV) */
    CPU_GEMM_ALGO_PACKED = 2, /* packed panels and a register-tiled microkernel (T large) */
    CPU_GEMM_ALGO_NOMEM = 3   /* the no-scratch fallback */
} cpu_gemm_algo;

/* cpu_gemm_bf16 with the algorithm forced (the ISA is the pool's: see cpu_pool_set_isa). */
void cpu_gemm_bf16_algo(cpu_pool *pool, float *y, const float *x, const uint16_t *W, int T, int N, int K,
                        int accumulate, cpu_gemm_precision prec, cpu_gemm_algo algo);

#endif /* SQUAD_CPU_GEMM_H */
