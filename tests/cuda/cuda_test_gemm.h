/*
 * cuda_test_gemm.h — the projections' test and timing entry points for tests/gpu_test_gemm.c: the
 * sm_90a small-M kernel (k_gemm_sm90.cu) in a chosen configuration, cuBLASLt, and the tuning that
 * picks between them, each on host data or timed with the weights read from HBM; and the kernel's
 * variants (stages left out, candidate changes) that the decomposition probe times beside it.
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
 * (each call reads them from HBM; one copy after squad_gemm_test_weights_l2(t, 1)), calls back to
 * back in a graph (median of several replays).
 * What runs: SQUAD_GEMM_TIME_LT cuBLASLt tuned without the sm_90a kernel; SQUAD_GEMM_TIME_SM90 the
 * kernel in configuration cfg; SQUAD_GEMM_TIME_TUNED the full tuning's choice, returned in chosen
 * ({0, 0, 0}: a cuBLASLt algorithm). */
enum { SQUAD_GEMM_TIME_LT = 0, SQUAD_GEMM_TIME_SM90 = 1, SQUAD_GEMM_TIME_TUNED = 2 };
int squad_gemm_test_time(squad_gemm_test *t, int what, int M, int N, int K, int acc, const int *cfg, int *chosen,
                         double *us, squad_err *err);
/* on 1: the timings that follow read one copy of the weights (from L2 after the first call) instead
 * of rotating them from HBM, so a call with its weights at hand can be set beside one from HBM */
void squad_gemm_test_weights_l2(squad_gemm_test *t, int on);

/* The sm_90a kernel's variants for the decomposition probe (docs/cuda.md), the numbers of
 * cuda_internal.cuh's CU_SM90_VAR_* (the .cu checks that they agree). Each leaves out what the one
 * after it adds: LAUNCH (the launch alone: a kernel that only waits for the previous grid, launched
 * as the product), EMPTY (+ the barriers' initialisation), LOADS (+ every TMA load), MAIN (+ the
 * wgmma chain), STAGED (+ the accumulators staged and the cluster barriers), REDUCED (+ the split-K
 * sums: all but Y), FULL (the product). Candidate changes to the product: PREFETCH (both tensor maps
 * prefetched at the start), TRIGGER_MAIN / TRIGGER_START (the next grid may launch after the main
 * loop / at the start). Offered for nt <= 2 (M <= 128 in one token tile). */
enum {
    SQUAD_GEMM_VAR_FULL = 0,
    SQUAD_GEMM_VAR_LAUNCH,
    SQUAD_GEMM_VAR_EMPTY,
    SQUAD_GEMM_VAR_LOADS,
    SQUAD_GEMM_VAR_MAIN,
    SQUAD_GEMM_VAR_STAGED,
    SQUAD_GEMM_VAR_REDUCED,
    SQUAD_GEMM_VAR_PREFETCH,
    SQUAD_GEMM_VAR_TRIGGER_MAIN,
    SQUAD_GEMM_VAR_TRIGGER_START,
    SQUAD_GEMM_N_VARS
};
/* squad_gemm_test_run with the sm_90a kernel's variant var of configuration cfg (one that writes Y:
 * FULL or a candidate change). */
int squad_gemm_test_run_variant(squad_gemm_test *t, const float *X, const float *W, const float *R0, float *Y, int M,
                                int N, int K, int acc, const int *cfg, int var, int *guard_ok, squad_err *err);
/* squad_gemm_test_time's SQUAD_GEMM_TIME_SM90 for variant var of configuration cfg. */
int squad_gemm_test_time_variant(squad_gemm_test *t, int M, int N, int K, int acc, const int *cfg, int var, double *us,
                                 squad_err *err);

/* The plan file (SQUAD_GEMM_PLANS, which the caller points at a fresh path): a cuBLASLt record and an
 * sm_90a record written by one store and read back by another. 0 when both come back equal, else
 * -1 with the reason in why. */
int squad_gemm_test_plan_file(char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
