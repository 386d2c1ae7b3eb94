/*
 * cuda_test_gemm.h — the projections' test and timing entry points for tests/gpu_test_gemm.c: the
 * sm_90a small-M kernel (k_gemm_sm90.cu) in a chosen configuration, cuBLASLt, and the tuning that
 * picks between them, each on host data or timed with the weights read from HBM.
 *
 * Host arrays are fp32; X and W are rounded to bf16 on upload (a test rounds them first, so its
 * reference sees the same values). Compiled only with SQUAD_HAVE_CUDA, into testcuda. GEMM
 * contexts made here never read or write the GEMM plan file.
 */
#ifndef SQUAD_CUDA_TEST_GEMM_H
#define SQUAD_CUDA_TEST_GEMM_H

#include "squad.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct squad_gemm_test squad_gemm_test;
/* A device stream and GEMM contexts on the current device; NULL with err set on failure. */
squad_gemm_test *squad_gemm_test_new(squad_err *err);
void squad_gemm_test_free(squad_gemm_test *t);
/* 1 when the sm_90a kernel runs on this GPU (compute capability 9.0 and the sm_90a cubin built). */
int squad_gemm_test_has_sm90(const squad_gemm_test *t);
/* The sm_90a configurations the tuning times for a bf16 shape, as {wg, nt, splits}; their count. */
int squad_gemm_test_configs(const squad_gemm_test *t, int M, int N, int K, int (*cfg)[3], int max);

/* One call on host data. acc 0: Y = X W^T stored as bf16 (returned as fp32); acc 1: Y = R0 + X W^T in
 * fp32. cfg: {wg, nt, splits} of the sm_90a kernel, or NULL for cuBLASLt's heuristic choice. The
 * device output is poisoned (bf16 / fp32 NaN) beyond [M][N], before and after it; *guard_ok says
 * whether every poisoned guard element is untouched afterwards. X [M][K], W [N][K], R0 / Y [M][N]. */
int squad_gemm_test_run(squad_gemm_test *t, const float *X, const float *W, const float *R0, float *Y, int M, int N,
                        int K, int acc, const int *cfg, int *guard_ok, squad_err *err);

/* Microseconds per call, random bf16 operands, the weights rotated over copies larger than the L2
 * (each call reads them from HBM), calls back to back in a graph (median of several replays).
 * What runs: SQUAD_GEMM_TIME_LT cuBLASLt tuned without the sm_90a kernel; SQUAD_GEMM_TIME_SM90 the
 * kernel in configuration cfg; SQUAD_GEMM_TIME_TUNED the full tuning's choice, returned in chosen
 * ({0, 0, 0}: a cuBLASLt algorithm). */
enum { SQUAD_GEMM_TIME_LT = 0, SQUAD_GEMM_TIME_SM90 = 1, SQUAD_GEMM_TIME_TUNED = 2 };
int squad_gemm_test_time(squad_gemm_test *t, int what, int M, int N, int K, int acc, const int *cfg, int *chosen,
                         double *us, squad_err *err);

/* The plan file (SQUAD_GEMM_PLANS, which the caller points at a fresh path): a cuBLASLt record and an
 * sm_90a record written by one store and read back by another. 0 when both come back equal, else
 * -1 with the reason in why. */
int squad_gemm_test_plan_file(char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
