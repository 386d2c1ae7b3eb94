/*
 * backend_cuda.h — what the CUDA backend (backend_cuda.cu) tells beyond backend.h: its chunk-graph
 * statistics, its shape buckets and state sizes, for the benchmark, the tests and diagnostics.
 */
#ifndef SQUAD_BACKEND_CUDA_H
#define SQUAD_BACKEND_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "backend.h"

typedef struct squad_cuda_info {
    char device[256];      /* the GPU's name */
    int sm_count;
    char precision[8];     /* "bf16" (the fast path) or "exact" (fp32) */
    int graphs;            /* chunk graphs captured so far */
    double capture_s;      /* seconds spent capturing and instantiating them */
    unsigned long long replays;
    size_t weight_bytes;   /* device bytes of weights */
    size_t state_bytes;    /* working state: GDN states + K / V (its capacity now) */
    int kv_positions;      /* positions the K / V holds now (it grows with the rows) */
    size_t gdn_state_bytes; /* the first bytes of a save_gdn blob, which hold every GDN layer's fp32 S
                               (the rest are the conv inputs) */
    int max_context;       /* the longest row the backend takes (lowered when memory is short) */
    size_t scratch_bytes;  /* activations, kernel scratch, cuBLASLt's workspace and the GEMM tuning's weight copies */
    int n_buckets;         /* chunk-length buckets */
    int buckets[24];
    int n_spans;           /* attention-span buckets */
    int spans[24];
    int adapter_slots;     /* specialists: adapters that can be resident at once (0: no specialists) */
    int adapters_resident; /* adapters in device memory now */
    unsigned long long adapter_uploads; /* adapters uploaded so far (a miss of the resident set each) */
} squad_cuda_info;

/* Fills info for a backend made by squad_cuda_backend_new; 0, or SQUAD_E_INVALID for another. */
int squad_cuda_backend_info(const squad_backend *be, squad_cuda_info *info);

/* The kernel groups of a chunk's forward: plan making runs the GEMMs alone, and the ablation timing
 * (bench/cuda/ablate.h, outside libsquad) leaves groups out. */
enum {
    SQUAD_CUDA_PART_GEMM = 1,          /* the projections (cuBLASLt) */
    SQUAD_CUDA_PART_NORM = 2,          /* the embedding, the RMSNorms and the letter probabilities */
    SQUAD_CUDA_PART_SILU = 4,          /* SiLU(gate) * up */
    SQUAD_CUDA_PART_GDN_CONV = 8,      /* the Gated DeltaNet mixer's four kernels (k_gdn.cu) */
    SQUAD_CUDA_PART_GDN_PREP = 16,
    SQUAD_CUDA_PART_GDN_SCAN = 32,
    SQUAD_CUDA_PART_GDN_OUT = 64,
    SQUAD_CUDA_PART_ATT_PREP = 128,    /* attention's three kernels (k_attn.cu) */
    SQUAD_CUDA_PART_ATT_FWD = 256,
    SQUAD_CUDA_PART_ATT_COMBINE = 512,
    SQUAD_CUDA_PART_GDN = 8 | 16 | 32 | 64,
    SQUAD_CUDA_PART_ATTN = 128 | 256 | 512,
    SQUAD_CUDA_PART_ALL = 1023
};

#ifdef __cplusplus
}
#endif
#endif
