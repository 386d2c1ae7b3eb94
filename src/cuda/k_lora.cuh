/*
 * k_lora.cuh — the specialists' kernels of the CUDA backend (k_lora.cu): the low-rank terms of an
 * adapted projection and the router's feature sum of a chunk.
 *
 * Design: which adapter a token runs is data, not code. The backend keeps a table in device
 * memory with one entry per (resident adapter slot, layer, projection) and a device array of
 * per-token slots ([rows] ints, 0: the trunk or padding), written before each replay like the
 * chunk parameters. The kernel of an adapted projection is enqueued once per graph and reads each
 * token's slot and the slot's entries at replay time: a token of slot 0, or an entry of rank 0,
 * gets nothing added, so one graph serves every route (and rows of different routes packed into
 * one chunk), and the number of graphs does not depend on the number of specialists.
 *
 * A "site" is one shared GEMM's output with up to CU_LORA_MAX_PARTS adapted projections in it
 * (a fused in-projection: GDN qkv | z | b | a, attention q | k | v, MLP gate | up; or a single
 * projection: out / o / down). One launch covers the whole site.
 */
#ifndef SQUAD_K_LORA_CUH
#define SQUAD_K_LORA_CUH

#include "cuda_internal.cuh"

#define CU_LORA_MAX_PARTS 4

/* One adapted projection of one resident adapter: y += scale * B (A x), in the layout
 * cu_lora_pack writes (the entry's addresses point into a slot buffer):
 *  - bf16 (the fast path, tensor cores): A bf16 [rp][lda], lda = in rounded up to 16; B bf16
 *    [out][rp] (PEFT's own [out][r] layout); rp = r rounded up to 16; the padding is zeros.
 *  - fp32 (the exact path): A fp32 [r][in]; B transposed, fp32 [r][out] (consecutive threads,
 *    consecutive outputs).
 * r 0: this adapter does not adapt the projection. */
typedef struct cu_lora_entry {
    const void *A;
    const void *B;
    int r, in, out;
    int f32; /* the layout: 1 fp32, 0 bf16 */
    float scale;
} cu_lora_entry;

/* Bytes one adapted projection takes in a slot buffer (a multiple of 16, so entries packed one
 * after another stay aligned for vector loads). */
size_t cu_lora_pack_bytes(int r, int in, int out, int f32);

/* Writes the projection's A [r][in] and B [out][r] (fp32, PEFT's layout) into host staging at
 * `host` in the layout above (bf16 rounded to nearest unless f32), and fills en with the device
 * addresses they will have once the staging is copied to `dev`. */
void cu_lora_pack(const float *A, const float *B, int r, int in, int out, float scale, int f32, void *host,
                  const void *dev, cu_lora_entry *en);

/* The adapted projections of one GEMM output. */
typedef struct cu_lora_site {
    const cu_lora_entry *col[CU_LORA_MAX_PARTS]; /* part p's entry in slot 1; slot s: col[p] + (s - 1) * stride */
    int yoff[CU_LORA_MAX_PARTS];                 /* part p's first column in y */
    int out[CU_LORA_MAX_PARTS];                  /* its width (every adapter's out of that projection) */
    int n_parts;
    int stride;   /* entries between one slot's and the next's */
    int n_slots;  /* resident slots: a token slot outside [0, n_slots] counts as 0 */
    int max_rank; /* the largest rank of any entry (sizes shared memory) */
} cu_lora_site;

/* The low-rank terms of a site for every token t < rows with s = token_slot[t] > 0: for each part
 * p whose entry e = col[p][(s - 1) * stride] has a rank,
 *   y[t][yoff[p] + o] += e.scale * sum_k B[o][k] sum_i A[k][i] x[t][i]      (o < e.out)
 * and nothing else of y is read or written. x is [rows][ldx] activations (fp32 when x_f32, else
 * bf16: the tensor-core path, whose entries must be bf16); y is [rows][ldy] (fp32 when y_f32, else
 * bf16). A bf16 x needs bf16 entries and an fp32 x fp32 entries (the backend packs one layout).
 * n_sm, the device's SMs, sizes the grid (k_lora.cu: LORA_GRID_PER_SM, LORA_IN_PER_CW). */
int cu_lora(const cu_lora_site *site, const int *token_slot, const void *x, int ldx, int x_f32, void *y, int ldy,
            int y_f32, int rows, int n_sm, cudaStream_t st, squad_err *err);

/* The router's feature sum of the chunk: sum[j] = sum over t < prm->len of fp32(h[t][j] * inv[t]),
 * inv[t] = 1 / sqrt(fp32(mean(h[t]^2)) + eps), summed in double (squad_router_norm_add's
 * arithmetic, the squares summed in double). h is the fp32 residual stream [rows][H]; inv is
 * scratch [rows]; sum is [H] doubles in device memory. */
int cu_router_sum(const float *h, int H, float eps, const cu_chunk_params *prm, float *inv, double *sum, int rows,
                  cudaStream_t st, squad_err *err);

#endif /* SQUAD_K_LORA_CUH */
