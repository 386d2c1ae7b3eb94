/*
 * k_lora.cuh — the specialists' kernels of the CUDA backend (k_lora.cu): the input of an adapted
 * projection's GEMM widened with the low-rank products, and the router's feature sum of a chunk.
 *
 * Design: the LoRA term rides inside the projection's own GEMM. For an adapted GEMM (a "site":
 * a fused in-projection, GDN qkv | z | b | a or attention q | k | v, the MLP's gate | up, or a
 * single out / o / down projection) of input width `in`, the backend widens the GEMM's K:
 *   input  xw [rows][in + n_slots R] = [ x | u_1 | ... | u_n ]   (u_s: R columns per slot)
 *   weight W' [out][in + n_slots R]  = [ W | B'_1 | ... | B'_n ]
 * where R is the site's rank width (each adapted part's largest rank, rounded up to 16, summed
 * over the parts), u_s[t] = s A x[t] (the slot's A of every part, the adapter's scale folded in)
 * for a token t of slot s and zeros for the other slots' columns and for trunk tokens, and B'_s
 * puts each part's B in its part's rows and its rank columns (zeros elsewhere). Then
 *   xw W'^T = x W^T + sum over slots of u_s B'_s^T = x W^T + s B (A x)
 * for every token under its own adapter, from the one GEMM: no read-modify-write of the output,
 * no second pass over it, and the GEMM's extra K is n_slots R columns (2 slots x 4 parts x rank
 * 16 = 128 on in = 1024). The weights' extra columns are written when an adapter is uploaded into
 * a slot (zeros while a slot is empty); graphs capture fixed addresses and read each token's slot
 * from device memory, so one graph serves every route and every mix of routes.
 *
 * cu_lora_input writes xw: x itself, made from the site's producer (the RMSNorm before an
 * in-projection or gate | up, SiLU(gate) * up before down; before out / o the mixer writes x into
 * xw itself, with xw's row stride, and the kernel makes u only), and the u columns. Making x here
 * replaces the producer's own kernel, so an adapted in-projection, gate | up or down costs no
 * launch beyond the trunk's; out / o pay one (u alone), except where the gate | up norm's launch
 * takes out's term itself (fold_y below: out's GEMM then reads u columns of zeros).
 */
#ifndef SQUAD_K_LORA_CUH
#define SQUAD_K_LORA_CUH

#include "cuda_internal.cuh"

/* How cu_lora_input makes x (the GEMM's unwidened input). */
typedef enum cu_lora_src {
    CU_LORA_NORM = 0, /* x[t] = RMSNorm(h[t]) * (1 + w): h fp32 [rows][in] (k_norm.cu's rmsnorm) */
    CU_LORA_SILU = 1, /* x[t][i] = silu(gu[t][i]) * gu[t][in + i]: gu [rows][2 in] (k_norm.cu's silu_mul) */
    CU_LORA_COPY = 2, /* x[t] = src[t]: src [rows][ld_src] */
    CU_LORA_IN_PLACE = 3 /* x[t] is already in xw[t][0, in) (the mixer wrote it there): only u is made */
} cu_lora_src;

#define CU_LORA_FIT_MAX 8 /* the largest cluster cu_lora_input makes (the portable cluster size) */

typedef struct cu_lora_input_args {
    int src;              /* cu_lora_src */
    float *h;             /* NORM: the residual stream (written back with fold_y) */
    const float *w;       /* NORM: the norm's weight [in] */
    float eps;            /* NORM */
    const void *x_src;    /* SILU: gu; COPY: x (bf16, or fp32 when f32) */
    int ld_src;           /* COPY: x_src's row stride (SILU: 2 in) */
    int in;               /* x's width (a multiple of 8 on the bf16 path) */
    /* A of every slot: [n_slots][R][lda] (bf16, or fp32 when f32), rank rows past an adapter's
     * rank zero, the adapter's scale folded in; lda >= in */
    const void *A;
    int lda, R, n_slots;
    void *xw;             /* out: [rows][ldw] */
    int ldw;              /* xw's row stride: in + n_slots R, or more (zeros past the slots' columns,
                             a multiple of 8 on the bf16 path) */
    int f32;              /* the exact path: fp32 x, A, xw and fp32 FMAs; else bf16 on the tensor cores */
    /* fit[k]: how many clusters of k blocks of the short chain's narrow form the GPU holds at once
     * (cu_lora_fit; 0: not known). The short chain takes fewer slices of `in` rather than a second
     * wave of clusters: a cluster's blocks share one GPC, so a GPU's slots do not all pack into
     * clusters of 8. */
    int fit[CU_LORA_FIT_MAX + 1];
    /* The short chain brings these bytes into L2 for a later launch (the next widened input's A: its
     * first loads then come from L2, not from device memory, which the weights' stream through L2
     * between launches would leave them in); NULL: none. */
    const void *prefetch, *prefetch2;
    size_t prefetch_bytes, prefetch2_bytes;
    /* The out / o projection's low-rank term folded into the gate | up norm's launch (NORM, bf16,
     * where cu_lora_fold_slices takes the shapes; NULL fold_y: none). Before the norm, for every
     * token t of slot s:
     *   u_o[t][k] = bf16(sum_i fold_A[s - 1][k][i] fold_y[t][i])               (k < fold_R)
     *   h[t][j]  += sum_k fold_B[j fold_ldb + (s - 1) fold_R + k] u_o[t][k]
     * (h written back: the residual stream gets the term), then x and u as NORM makes them from the
     * new h. fold_y is the mixer's output [rows][fold_ldy] (fold_in wide), fold_A out's A blocks
     * [n_slots][fold_R][fold_lda], fold_B out's B' (the widened out weight's columns from fold_in). */
    const void *fold_y;
    int fold_ldy, fold_in;
    const void *fold_A;
    int fold_lda, fold_R;
    const void *fold_B;
    int fold_ldb;
} cu_lora_input_args;

/* For every token t < rows, with s = token_slot[t] (0, or outside [1, n_slots]: no adapter):
 *   xw[t][i]                    = x[t][i]                                  (i < in)
 *   xw[t][in + (s - 1) R + k]   = sum_i A[s - 1][k][i] x[t][i]             (k < R)
 *   xw[t][in + (q - 1) R + k]   = 0                                        (every other slot q)
 *   xw[t][j]                    = 0                              (in + n_slots R <= j < ldw)
 * u is the sum of the products in fp32 in a fixed order (deterministic), rounded like x. With IN_PLACE, x is
 * read from xw and left as it is. n_sm sizes the grid. */
int cu_lora_input(const cu_lora_input_args *a, const int *token_slot, int rows, int n_sm, cudaStream_t st,
                  squad_err *err);

/* The slices (the cluster's blocks) k_lora_fold splits `in` of a tile into for these shapes (x's
 * width in, the gate | up site's R, out's input width fold_in and rank columns fold_R, rows tokens),
 * or 0 when it does not take them (the caller then makes out's u on its own). */
int cu_lora_fold_slices(int in, int R, int fold_in, int fold_R, int rows, int n_sm);

/* fit[k] for k = 1 .. CU_LORA_FIT_MAX (fit[0] = 0), queried from the device (outside any stream
 * capture). */
int cu_lora_fit(int fit[CU_LORA_FIT_MAX + 1], squad_err *err);

/* Elements of one slot's A block (R x lda) and the lda cu_lora_input wants for `in`. */
int cu_lora_lda(int in);

/* The router's feature sum of the chunk: sum[j] = sum over t < prm->len of fp32(h[t][j] * inv[t]),
 * inv[t] = 1 / sqrt(fp32(mean(h[t]^2)) + eps), summed in double (squad_router_norm_add's
 * arithmetic, the squares summed in double). h is the fp32 residual stream [rows][H]; inv is
 * scratch [rows]; sum is [H] doubles in device memory. */
int cu_router_sum(const float *h, int H, float eps, const cu_chunk_params *prm, float *inv, double *sum, int rows,
                  cudaStream_t st, squad_err *err);

#endif /* SQUAD_K_LORA_CUH */
