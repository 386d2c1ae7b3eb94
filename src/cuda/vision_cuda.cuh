/*
 * vision_cuda.cuh — Qwen3.5's vision tower on the CUDA backend: its weights on the device, its
 * scratch, its forward (vision_cuda.cu), and the kernels the forward launches (k_vision.cu).
 *
 * Design: two paths, chosen once at creation from the backend's precision (cu_vision_new's f32).
 *
 * BF16, the fast path: bf16 matrices on the backend's GEMM path (cu_gemm: cuBLASLt or the sm_90a
 * kernel, fp32 accumulation), an fp32 residual stream the GEMMs of the patch embedding, proj and fc2
 * add into (the epilogue's beta = 1, as the text model's out / down), bf16 GEMM inputs made by the
 * kernels between them. The attention runs on wgmma (k_vision_attn_sm90.cu) where the GPU is a
 * Hopper and the head dim 64, else on mma.sync (k_vision.cu). Pixels go up as bf16 rounded on the
 * host into pinned memory.
 *
 * EXACT, the reference path: fp32 activations end to end, the arithmetic class of the CPU backend's
 * tower (src/cpu/vision.c, equal to transformers: fp32 inputs times the bf16 weights' values, fp32
 * sums). The matrices live on the device as fp32 copies of the bf16 weights (an exact conversion:
 * cu_gemm's fp32 path takes both operands in fp32), as the text model's exact path keeps its own; LayerNorm, rotary and GELU write fp32; the attention is a plain fp32 kernel
 * (cu_vis_attn_f32); the pixels go up as fp32 through the same pinned staging.
 *
 * Both: the same buffers and order of operations, only the element type of the GEMMs' inputs and
 * outputs differs. Biases ride in the kernel after each GEMM: the qkv bias in the rotary kernel,
 * proj's and fc2's in the LayerNorm that next reads the residual stream (added to it there, once),
 * fc1's in the GELU, the patch bias with the position grid, the merger's fc2 bias written into the
 * output before its GEMM adds to it. One image at a time, launched eagerly on the backend's stream
 * (no graph: a graph per grid bucket is a later step); the scratch grows to the largest image seen
 * and stays. Rows come down through pinned memory (vision_cuda.cu).
 */
#ifndef SQUAD_VISION_CUDA_CUH
#define SQUAD_VISION_CUDA_CUH

#include "cuda_internal.cuh"

extern "C" {
#include "vision_model.h"
}

/* The most patches one image may have: the CPU tower's limit (a 16384 x 16384 image at patch 16). */
#define CU_VISION_MAX_PATCHES (1 << 20)

/* ---- k_vision.cu: the kernels' launchers (every launch checked) ---- */
enum { CU_VIS_ACT_NONE = 0, CU_VIS_ACT_GELU_TANH = 1, CU_VIS_ACT_GELU_ERF = 2 };
/* The attention head dims the non-causal attention kernel is instantiated for. */
int cu_vis_attn_supported(int hd);
/* Its shared-memory attribute for head dim hd (once, before the first launch). */
int cu_vis_attn_init(int hd, squad_err *err);
/* x[f L + p] = the position grid table [side * side][H] bilinearly interpolated to (h, w) at patch p
 * of a frame (merge-window order, transformers' fast_pos_embed_interpolate) + bias, for each of t
 * frames (L = h w). */
int cu_vis_pos_embed(const float *table, const float *bias, int side, int H, int t, int h, int w, int merge, float *x,
                     cudaStream_t st, squad_err *err);
/* Per row: x += bias (when bias is not NULL; written back), y = bf16(LayerNorm(x) * w + b) with eps
 * SQUAD_VISION_LN_EPS. H at most 2048. */
int cu_vis_layernorm(float *x, const float *bias, const float *w, const float *b, bf16 *y, int rows, int H,
                     cudaStream_t st, squad_err *err);
/* cs [positions][hd / 4] = (cos, sin) of fp32(position inv_freq[j]) (in double, then fp32): the
 * rotary's table for an image whose rows and columns are below `positions`. */
int cu_vis_rope_table(const float *inv_freq, int positions, int hd, float2 *cs, cudaStream_t st, squad_err *err);
/* qkv [N][3 heads hd] (+ bias [3 heads hd]) -> Q, K, V [heads][N][hd], q and k turned by the 2D rotary
 * (the table cs) of each patch (row, column) in its frame of L = h w patches (merge-window order).
 * hd a multiple of 16. */
int cu_vis_rope_split(const bf16 *qkv, const float *bias, const float2 *cs, int N, int h, int w, int merge, int heads,
                      int hd, bf16 *Q, bf16 *K, bf16 *V, cudaStream_t st, squad_err *err);
/* out [N][heads hd] (head h at columns h hd) = softmax(Q K^T scale) V within each frame of L patches
 * (N = frames L), no mask: full attention over the frame. */
int cu_vis_attn(const bf16 *Q, const bf16 *K, const bf16 *V, int frames, int L, int heads, int hd, float scale,
                bf16 *out, cudaStream_t st, squad_err *err);
/* k_vision_attn_sm90.cu: the same attention on Hopper's wgmma (sm_90a), head dim 64 only. The probe
 * sets *ok when its cubin runs on this GPU (compute capability 9.0) and raises its shared-memory limit;
 * cu_vis_attn_sm90 takes cu_vis_attn's arguments. */
int cu_vis_attn_sm90_probe(int *ok, squad_err *err);
int cu_vis_attn_sm90_takes(int hd);
int cu_vis_attn_sm90(const bf16 *Q, const bf16 *K, const bf16 *V, int frames, int L, int heads, int hd, float scale,
                     bf16 *out, cudaStream_t st, squad_err *err);
/* y [rows][n] bf16, in place: act(y + bias). n a multiple of 8. */
int cu_vis_bias_act(bf16 *y, const float *bias, int rows, int n, int act, cudaStream_t st, squad_err *err);
/* The exact path's variants of the above on fp32 activations (same layouts, fp32 in and out):
 * LayerNorm into fp32 y; the rotary and split of fp32 qkv into fp32 Q, K, V; the attention in fp32
 * (a warp per query, online softmax over key tiles: simple, not fast; any L); bias and GELU in
 * place, the GELU evaluated in double and rounded once. */
int cu_vis_layernorm_f32(float *x, const float *bias, const float *w, const float *b, float *y, int rows, int H,
                         cudaStream_t st, squad_err *err);
int cu_vis_rope_split_f32(const float *qkv, const float *bias, const float2 *cs, int N, int h, int w, int merge,
                          int heads, int hd, float *Q, float *K, float *V, cudaStream_t st, squad_err *err);
int cu_vis_attn_f32(const float *Q, const float *K, const float *V, int frames, int L, int heads, int hd, float scale,
                    float *out, cudaStream_t st, squad_err *err);
int cu_vis_bias_act_f32(float *y, const float *bias, int rows, int n, int act, cudaStream_t st, squad_err *err);
/* y [rows][n] fp32 = bias in every row. */
int cu_vis_rows_init(float *y, const float *bias, int rows, int n, cudaStream_t st, squad_err *err);

/* ---- vision_cuda.cu: the tower ---- */
typedef struct cu_vision cu_vision;
/* The tower of m on the device (m->vision bound), or *out NULL with SQUAD_E_UNSUPPORTED and a message
 * when its shapes are outside what the kernels take (the caller keeps the message: the backend then
 * answers every vision_forward with it). f32: the exact path (the backend's precision EXACT), else
 * the bf16 path. Weights are uploaded with plain copies; the caller synchronises the device before
 * the first use. */
int cu_vision_new(const squad_model *m, int f32, cu_vision **out, squad_err *err);
void cu_vision_free(cu_vision *v);
size_t cu_vision_weight_bytes(const cu_vision *v);
/* The backend's vision_forward: pixel_values (host) of grid (t, h, w) in, the merged rows (host) out;
 * synchronises st before it returns. */
int cu_vision_forward(cu_vision *v, cu_gemm_ctx *g, cudaStream_t st, const float *pixel_values, const int grid[3],
                      float *out, squad_err *err);
/* For the benchmark: the pixels uploaded once, then `reps` runs of the device part alone (from the
 * pixels on the device to the merged rows on the device), each timed by events into ms[rep]. */
int cu_vision_time(cu_vision *v, cu_gemm_ctx *g, cudaStream_t st, const float *pixel_values, const int grid[3],
                   int reps, double *ms, squad_err *err);

/* backend_cuda.cu: a CUDA backend's tower, GEMM context and stream (tests and benchmarks); SQUAD_E_INVALID
 * for another backend, SQUAD_E_UNSUPPORTED (with the reason) for one without a tower. */
int cu_backend_vision(squad_backend *be, cu_vision **v, cu_gemm_ctx **g, cudaStream_t *st, squad_err *err);

#endif
