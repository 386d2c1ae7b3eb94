/*
 * cuda_test_api.h — entry points of the CUDA backend for tests/gpu_test_kernels.c: each runs one
 * kernel group on host data (uploads, launches, downloads; every call checked) so a test can
 * compare it with the plain host reference (cu_ref_*, same header; cuda_test_ref.cu).
 *
 * Host arrays are fp32; on the bf16 path the values the device holds in bf16 (projection outputs,
 * the conv state, K / V) are rounded to bf16 on upload, so a test should round its inputs first
 * (squad_f32_to_bf16) and give the references the same values. With exact set, everything stays
 * fp32 (the EXACT precision's kernels). Compiled only with SQUAD_HAVE_CUDA, from tests/cuda into
 * testcuda, which the test and bench programs link (libsquad does not carry it). GEMM contexts
 * made here never read or write the GEMM plan file (gemm_plans.cu).
 */
#ifndef SQUAD_CUDA_TEST_API_H
#define SQUAD_CUDA_TEST_API_H

#include "squad.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the Gated DeltaNet mixer after in_proj ---- */
typedef struct cu_ref_gdn_args {
    int nk, nv, dk, dv, K; /* heads, head dims, conv kernel */
    int ldP;               /* row stride of P: [q | k | v | z | b | a] then padding */
    int rows, len;         /* bucket rows, real tokens (len <= rows) */
    float eps;
    const float *P;        /* [rows][ldP] */
    float *conv_state;     /* [K-1][C], C = 2 nk dk + nv dv: in / out */
    const float *conv_w;   /* [C][K] */
    const float *A_log, *dt_bias; /* [nv] */
    const float *norm_w;   /* [dv] */
    float *S;              /* [nv][dk][dv]: in / out */
    float *Y;              /* [rows][nv dv] out (rows >= len: 0 from the device, untouched by the reference) */
    int exact;             /* device: the fp32 token-by-token path instead of the chunked bf16 one */
    /* device, bf16: the launch variant (0: as the backend launches it, with no SM count). Every
     * variant of one conv tiling gives the same bits: they change who computes a value, not how. */
    int short_rows;        /* launches of at most this many tokens take the short-chunk conv (4-token
                              tiles) and output kernels; 0: the backend's bound; < 0: never */
    int prep_split;        /* the prep's blocks a (block of 64 tokens, head): 1, 2 or 4; 0: 1 */
    int conv_groups;       /* the pipelined conv's 16-row groups a block; < 0: the one-tile conv on
                              every launch; 0: as chosen without an SM count (3) */
    int fused_rows;        /* launches of at most this many tokens run the fused mixer where it applies
                              (squad_cuda_test_gdn_fused); 0: the backend's bound; < 0: never. Its
                              bits are not the four kernels' (other sums' orders), only within the
                              tolerances */
} cu_ref_gdn_args;
void cu_ref_gdn(const cu_ref_gdn_args *a);
int squad_cuda_test_gdn(const cu_ref_gdn_args *a, squad_err *err);
/* 1 when the dims of a run the fused mixer on this GPU (its rows within fused_rows), else 0. */
int squad_cuda_test_gdn_fused(const cu_ref_gdn_args *a);

/* ---- gated attention after q/k/v_proj ---- */
typedef struct cu_ref_attn_args {
    int nh, nkv, hd, rd;
    int ld;               /* row stride of QKV: [nh (hd q | hd gate) | nkv hd k | nkv hd v] */
    int rows, start, len; /* bucket rows, chunk start, real tokens */
    int max_context;
    float eps;
    const float *QKV;                 /* [rows][ld] */
    const float *q_norm, *k_norm;     /* [hd] */
    const float *inv_freq;            /* [rd/2] */
    float *K, *V;                     /* [max_context][nkv][hd]: [0, start) given, [start, start+len) written */
    float *out;                       /* [rows][nh hd] */
    int exact;                        /* device: the fp32 path instead of bf16 flash attention */
    int kv_split; /* device: K / V of [0, kv_split) read in place from a separate blob (a cache hit's
                     restore); the working buffer's copy of them is poisoned with NaN */
} cu_ref_attn_args;
void cu_ref_attn(const cu_ref_attn_args *a);
int squad_cuda_test_attn(const cu_ref_attn_args *a, squad_err *err);
/* Whether the bf16 attention forward of head_dim hd runs on wgmma here (k_attn_sm90.cu: the
 * SQUAD_ATT_SM90 switch as a backend made now reads it, and a GPU whose sm_90a code loads): 1 or 0,
 * < 0 on an error. */
int squad_cuda_test_attn_sm90(int hd, squad_err *err);

/* ---- the specialists' widened GEMM input (k_lora.cu) ---- */
#define CU_REF_LORA_MAX_SLOTS 4
typedef struct cu_ref_lora_args {
    int src;     /* how x is made (k_lora.cuh's cu_lora_src): 0 the norm, 1 SiLU(gate) * up, 2 a copy,
                    3 in place (x_src put into xw's first columns first, as a mixer writes it) */
    int rows;    /* tokens */
    int in;      /* x's width */
    int ld_src;  /* the copy's source row stride (>= in) */
    int R;       /* rank columns per slot */
    int n_slots; /* resident adapters */
    const float *h, *w; /* the norm: h [rows][in] (fp32 on the device too), w [in] */
    float eps;
    const float *x_src;    /* SiLU: gate | up [rows][2 in]; the copy: [rows][ld_src] */
    const float *A;        /* [n_slots][R][in]: each slot's A rows, the scale folded in */
    const int *token_slot; /* [rows]: slot + 1; 0 or past n_slots: no adapter */
    float *xw;             /* out: [rows][ldw] */
    int ldw;               /* 0: in + n_slots R; more: zeros past the slots' columns */
    int f32;               /* device: the exact path (fp32) or bf16 (x_src, A and xw rounded to bf16) */
    /* The out term folded in (src 0, bf16: cu_lora_input_args.fold_y); fold_y NULL: none. h gets,
     * for each token of slot s, B_s (A_s y): */
    const float *fold_y; /* [rows][fold_in]: the mixer's output */
    const float *fold_A; /* [n_slots][fold_R][fold_in] */
    const float *fold_B; /* [in][n_slots fold_R]: slot s's B for h's column j at j n_slots fold_R + (s - 1) fold_R */
    int fold_in, fold_R;
    float *h_out;        /* out: h with the term [rows][in] (the reference: before u_o's rounding to bf16) */
} cu_ref_lora_args;
/* xw = [x | u_1 | ... | u_n] as k_lora.cuh defines it, in double. */
void cu_ref_lora(const cu_ref_lora_args *a);
/* The same through cu_lora_input (xw poisoned with NaN first: every element must be written). */
int squad_cuda_test_lora(const cu_ref_lora_args *a, squad_err *err);
/* Microseconds per layer of the producers of n_layers Gated DeltaNet layers' GEMM inputs on the
 * 0.8B shapes (bf16), replayed as one CUDA graph, for a chunk of `rows` tokens of one adapter.
 * mode SQUAD_BENCH_LORA: the specialists' cu_lora_input launches (in-projection, out_proj with x
 * in place, gate | up, down; rank `rank` on every projection, two slots); SQUAD_BENCH_TRUNK: the
 * trunk's own (RMSNorm, RMSNorm, SiLU * up). The difference is what the widened inputs cost beyond
 * the trunk, the GEMMs' extra K aside. SQUAD_BENCH_LORA_FOLD: out's term folded into gate | up's
 * launch (cu_lora_input_args.fold_y; rank 16 only), three launches. */
enum { SQUAD_BENCH_LORA = 0, SQUAD_BENCH_TRUNK = 1, SQUAD_BENCH_LORA_FOLD = 2 };
/* fit[k], k = 1 .. 8: clusters of k blocks of the short chain the GPU holds at once (cu_lora_fit). */
int squad_cuda_lora_fit(int fit[9], squad_err *err);
int squad_cuda_bench_lora(int rows, int rank, int n_layers, int mode, double *us_per_layer, squad_err *err);

/* ---- small ops ---- */
void cu_ref_rmsnorm(const float *h, float *out, const float *w, int rows, int H, float eps);
void cu_ref_silu_mul(const float *gu, float *out, int rows, int I);
/* out = RMSNorm(h) * (1 + w) through the device kernel (bf16 out, returned as fp32). */
int squad_cuda_test_rmsnorm(const float *h, float *out, const float *w, int rows, int H, float eps, squad_err *err);
int squad_cuda_test_silu_mul(const float *gu, float *out, int rows, int I, squad_err *err);
/* Y[M][N] = X[M][K] W[N][K]^T through the backend's cuBLASLt path (bf16 in, fp32 accumulate);
 * accumulate != 0: Y += (fp32 out), else Y = (bf16 out, returned as fp32). */
int squad_cuda_test_gemm(const float *X, const float *W, float *Y, int M, int N, int K, int accumulate,
                         squad_err *err);
/* Microseconds per call of tuned cuBLASLt and of cuBLASLt's untuned heuristic first for one shape
 * (random bf16 operands, W rotated over copies that exceed L2 so each call reads W from HBM). */
int squad_cuda_bench_gemm(int M, int N, int K, int accumulate, double *us_cublaslt, double *us_first,
                          squad_err *err);

/* Microseconds per kernel of n_kernels dependent launches of a near-empty kernel (blocks x threads)
 * replayed as one CUDA graph: the fixed cost every kernel of a chunk pays. */
int squad_cuda_bench_launch(int n_kernels, int blocks, int threads, double *us_per_kernel, squad_err *err);

/* ---- the mixers over a batch (tests/gpu_test_batch.c) ---- */
/* n rows of one GDN layer in one batched launch, in a batch of nrows >= n rows (the rest padding,
 * len 0, their inputs NaN): row r is rows[r] (the same dims, weights, bucket `rows` and precision;
 * its own P, len, conv_state, S, updated as squad_cuda_test_gdn does, and Y). *padding_zero: the
 * padding rows' outputs are all 0. */
int squad_cuda_test_gdn_batch(const cu_ref_gdn_args *rows, int n, int nrows, int *padding_zero, squad_err *err);
/* Attention likewise: row r is rows[r] (the same dims, bucket, max_context and precision; its own
 * QKV, start, len, K / V and kv_split: keys below kv_split come from a blob, the rest from the
 * row's own buffer holding positions from kv_split on, as a sequence slot's does). */
int squad_cuda_test_attn_batch(const cu_ref_attn_args *rows, int n, int nrows, int *padding_zero, squad_err *err);

/* ---- the backend's batches (tests/gpu_test_batch.c) ---- */
struct squad_backend;
/* bytes device memory -> host (a blob from be->alloc, for comparing states). */
int squad_cuda_test_download(void *host, const void *dev, size_t bytes, squad_err *err);
/* Fills every scratch buffer of a CUDA backend (activations, kernel scratch, partial results) with
 * 0xff bytes (NaN in bf16 and fp32): a kernel that reads what no kernel of the batch wrote (a padding
 * row's or token's value) then shows up as NaN in the answers. */
int squad_cuda_test_poison(struct squad_backend *be, squad_err *err);
/* The bytes of a save_gdn blob that hold the fp32 recurrent states (every GDN layer's S); the rest
 * are the conv inputs. */
size_t squad_cuda_test_state_bytes(const struct squad_backend *be);

/* ---- the vision tower (tests/gpu_test_vision.c, bench/bench_vision.c; cuda_test_vision.cu) ---- */
/* The tower's non-causal attention kernel on host data: Q, K, V [heads][frames L][hd] fp32 (rounded
 * to bf16 on upload), out [frames L][heads hd] (fp32 from the kernel's bf16). hd 16, 32, 64 or 128. */
int squad_cuda_test_vis_attn(int hd, int frames, int L, int heads, const float *Q, const float *K, const float *V,
                             float *out, squad_err *err);
/* The same on the wgmma kernel (k_vision_attn_sm90.cu); SQUAD_E_UNSUPPORTED where it does not run (a
 * GPU other than compute capability 9.0, or hd other than 64). */
int squad_cuda_test_vis_attn_wg(int hd, int frames, int L, int heads, const float *Q, const float *K,
                                const float *V, float *out, squad_err *err);
/* The exact path's fp32 attention kernel (vis_attn_f32) on the same host data, fp32 throughout (no
 * rounding of the inputs or the output). */
int squad_cuda_test_vis_attn_f32(int hd, int frames, int L, int heads, const float *Q, const float *K,
                                 const float *V, float *out, squad_err *err);
/* One attention kernel (wg: the wgmma one) on one frame of L patches and `heads` heads of random
 * bf16 Q / K / V on the device: a warm-up, then `reps` launches each timed by events into ms[rep].
 * SQUAD_E_UNSUPPORTED as squad_cuda_test_vis_attn_wg. */
int squad_cuda_test_vis_attn_time(int wg, int hd, int L, int heads, int reps, double *ms, squad_err *err);
/* The host reference of the same (softmax(Q K^T / sqrt(hd)) V per frame, in double). */
void cu_ref_vis_attn(int hd, int frames, int L, int heads, const float *Q, const float *K, const float *V, float *out);
/* A CUDA backend's tower on pixel_values of grid (t, h, w): the pixels uploaded once, then `reps`
 * timed runs of the device part alone (ms[rep], by events on the backend's stream). */
int squad_cuda_test_vision_time(struct squad_backend *be, const float *pixel_values, const int grid[3], int reps,
                                double *ms, squad_err *err);

#ifdef __cplusplus
}
#endif
#endif
