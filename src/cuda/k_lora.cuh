/*
 * k_lora.cuh — the specialists' kernels of the CUDA backend (k_lora.cu): the low-rank term of an
 * adapted projection and the router's feature sum of a chunk.
 *
 * Design: which adapter a chunk runs is data, not code. The backend keeps a table in device
 * memory with one entry per (resident adapter slot, layer, projection) and one device word, the
 * chunk's slot (0: the trunk), written before each replay like the chunk parameters. The kernels
 * of an adapted projection are enqueued once per graph and read the slot and the entry at replay
 * time: slot 0 or an entry of rank 0 returns at once, so one graph serves every route and the
 * number of graphs does not depend on the number of specialists.
 */
#ifndef SQUAD_K_LORA_CUH
#define SQUAD_K_LORA_CUH

#include "cuda_internal.cuh"

/* One adapted projection of one resident adapter: y += scale * B (A x). A is [r][in] and Bt is
 * B transposed, [r][out] (so the threads of one output row read consecutive addresses); both fp32
 * in device memory. r 0: this adapter does not adapt the projection. */
typedef struct cu_lora_entry {
    const float *A;
    const float *Bt;
    int r, in, out;
    float scale;
} cu_lora_entry;

/* The low-rank term of one projection for the chunk's real tokens (t < prm->len):
 *   u[t][k]            = sum_i A[k][i] x[t][i]                  (u: scratch, [rows][max rank])
 *   y[t][yoff + o]    += scale * sum_k B[o][k] u[t][k]          (o < the entry's out)
 * with the entry col[(slot - 1) * stride], slot = *slot_dev; nothing when the slot is 0 or the
 * entry's rank is 0. x is [rows][ldx] activations (fp32 when x_f32, else bf16); y is [rows][ldy]
 * (fp32 when y_f32, else bf16). out_max bounds every entry's out (the grid's width). */
int cu_lora(const cu_lora_entry *col, int stride, const int *slot_dev, const cu_chunk_params *prm, const void *x,
            int ldx, int x_f32, void *y, int ldy, int yoff, int y_f32, int out_max, float *u, int rows,
            cudaStream_t st, squad_err *err);

/* The router's feature sum of the chunk: sum[j] = sum over t < prm->len of fp32(h[t][j] * inv[t]),
 * inv[t] = 1 / sqrt(fp32(mean(h[t]^2)) + eps), summed in double (squad_router_norm_add's
 * arithmetic, the squares summed in double). h is the fp32 residual stream [rows][H]; inv is
 * scratch [rows]; sum is [H] doubles in device memory. */
int cu_router_sum(const float *h, int H, float eps, const cu_chunk_params *prm, float *inv, double *sum, int rows,
                  cudaStream_t st, squad_err *err);

#endif /* SQUAD_K_LORA_CUH */
