/*
 * cuda_test_common.cuh — what the test API's .cu files (tests/cuda) share beyond the backend's
 * cuda_internal.cuh: the switches a test's kernels run with, and the GEMM timings' operands.
 */
#ifndef SQUAD_CUDA_TEST_COMMON_CUH
#define SQUAD_CUDA_TEST_COMMON_CUH

#include "cuda/cuda_internal.cuh"

/* The backend's switches as a backend made now would read them (a test sets SQUAD_ATT_SM90 or
 * SQUAD_GEMM_SM90 to run the portable kernels), except that the GEMM contexts made here never read
 * or write a plan file: a test's plans stay out of the user's. */
static inline int cu_test_knobs(cuda_knobs *k, squad_err *err) {
    const int rc = cuda_knobs_read(k, err);
    k->gemm_plans[0] = 0;
    return rc;
}

/* The GEMM timings' operands, W (every rotated weight copy) and X, filled with hashed uniform values
 * on st (no zeros to time on; the same values for the same sizes). */
int cu_test_fill_gemm_operands(bf16 *W, size_t w_elems, bf16 *X, size_t x_elems, cudaStream_t st, squad_err *err);

#endif
