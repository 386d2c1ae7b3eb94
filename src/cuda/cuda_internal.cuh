/*
 * cuda_internal.cuh — what the CUDA backend's .cu files share: error checks that fill a squad_err
 * (never print, never exit), bf16 helpers, the mma.sync / ldmatrix / cp.async wrappers, the
 * device-resident chunk parameters, the host launchers of every kernel, and the few internals of
 * the backend that the tests (tests/cuda) and the ablation timing (bench/cuda) use.
 *
 * Design: every shape that varies from chunk to chunk of one bucket (chunk start, real length,
 * ids, slots, nopts, letters) lives in one device struct (cu_chunk_params) that the host writes
 * before a graph replay, so a captured graph serves every chunk of its shape. Kernels read it
 * through a pointer; nothing about a chunk is baked into a kernel argument except its bucket.
 */
#ifndef SQUAD_CUDA_INTERNAL_CUH
#define SQUAD_CUDA_INTERNAL_CUH

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "backend.h"
#include "util.h"
}

typedef __nv_bfloat16 bf16;

/* ---- limits and tile sizes ------------------------------------------------------------------ */
#define CU_MAX_SLOTS SQUAD_MAX_SLOTS_PER_ROW /* slots of one chunk */
#define CU_MAX_LETTERS SQUAD_MAX_LETTERS
#define CU_GDN_CHUNK 64    /* tokens per block of the chunked delta rule (WY / UT form) */
#define CU_GDN_LDW(dk) ((dk) + 8)        /* row stride of W and K' (bf16, padded dk): no bank conflicts */
#define CU_GDN_LDU (CU_GDN_CHUNK + 8)    /* row stride of U^T (fp32) */
#define CU_ATT_BN 64       /* keys per attention inner step */
#define CU_MAX_CONV_K 8    /* the largest conv kernel supported */

/* A batch in device memory: the graphs of one shape (length bucket, rows bucket, span bucket) read
 * every per-row value at replay time. Row r of a replay of `nrows` rows holds its tokens at
 * [r bucket, (r + 1) bucket) of the packed activations (a uniform stride, so the projections and
 * the MLP are one GEMM over nrows x bucket tokens); a padding row has len 0 and every per-row
 * kernel skips it (writing zeros where a GEMM reads its activations). */
typedef struct cu_chunk_params {
    /* A cache hit's K / V read in place: positions [0, kv_split) of every attention layer come from
     * the blob kv_src (the cache group's, position-major like the working buffer). kv_split 0: none. */
    const void *kv_src;
    /* The row's slot's own K / V ([capacity][attention layer][K | V][nkv][hd]): position
     * kv_split + i at index i, so a hit's slot holds only the positions it writes. Read from here,
     * not baked into the graphs, so the buffer can grow (move) as its row gets longer. */
    void *kv_work;
    /* The row's slot's GDN arena: every GDN layer's S, then the conv inputs (the layers' offsets
     * are kernel arguments, the same in every slot). */
    unsigned char *gdn;
    /* The GDN state the chunk starts from, when not the arena's own: a cache blob a restore named
     * (load_gdn records it instead of copying it into the arena; the arena's layout). The kernels
     * read S and the conv inputs from here and write the chunk's final state into the arena, all
     * of it, so the restore costs no copy. NULL: the arena holds the state (cu_gdn_in). */
    const unsigned char *gdn_in;
    int kv_split;
    int start; /* absolute position of token 0 */
    int len;   /* real tokens; positions [len, bucket) are padding; 0: a padding row */
    int n_slots;    /* answer slots of this row (their values in cu_row_answers) */
    int vocab_base; /* its first slot's index among the replay's full-vocabulary slots; -1: none */
    /* CU_ROW_POSITIONS: the rotary reads each token's (t, h, w) from cu_batch.img (M-RoPE); else every
     * axis is start + i. CU_ROW_EMBEDS: a token whose cu_batch.img emb is >= 0 takes that row of
     * cu_batch.embeds as its input instead of its embedding. 0 for a text-only row. */
    int image;
    int pad_[2]; /* 16-byte multiple */
} cu_chunk_params;
enum { CU_ROW_POSITIONS = 1, CU_ROW_EMBEDS = 2 };
/* A token of an image row (backend.h's squad_chunk.positions and .embeds, per token). */
typedef struct cu_token_image {
    int t, h, w; /* its M-RoPE position on each axis */
    int emb;     /* its row of cu_batch.embeds, or -1: its own embedding */
} cu_token_image;
static_assert(sizeof(cu_token_image) == 16, "one 16-byte load a token");
static_assert(sizeof(cu_chunk_params) % 16 == 0, "rows stay 16-byte aligned");
#ifdef __CUDACC__
/* Where a row's GDN state is read from: the restored blob, else its arena. */
__device__ __forceinline__ const unsigned char *cu_gdn_in(const cu_chunk_params *p) {
    return p->gdn_in ? p->gdn_in : p->gdn;
}
#endif

/* A row's answer slots (read only by the letter and vocabulary kernels). */
typedef struct cu_row_answers {
    int n_letters;
    int slots[CU_MAX_SLOTS]; /* relative to start */
    int nopts[CU_MAX_SLOTS];
    int letters[CU_MAX_LETTERS];
    int pad_[1];
} cu_row_answers;
static_assert(sizeof(cu_row_answers) % 16 == 0, "answers stay 16-byte aligned");

/* What a launcher is told about a batch: device pointers into one parameter buffer laid out
 * [rows' cu_chunk_params | ids (nrows bucket ints) | rows' cu_row_answers | token_slot (nrows bucket
 * ints) | img (nrows bucket cu_token_image)], and the shape. The tail is uploaded only as far as a
 * replay reads it: token_slot with specialists, img when a row has CU_ROW_* set. */
typedef struct cu_batch {
    const cu_chunk_params *prm; /* [nrows] */
    const cu_chunk_params *all; /* prm[nrows]: start 0, len nrows x bucket, no state */
    const int *ids;             /* [nrows * bucket]; padding ids are 0, a valid token */
    const cu_row_answers *ans;  /* [nrows] */
    /* specialists: each token's resident adapter slot + 1 (0: the trunk, padding), for LoRA kernels
     * that read a slot per token; written only when specialists are loaded */
    const int *token_slot;      /* [nrows * bucket] */
    const cu_token_image *img;  /* [nrows * bucket]: read only for rows with CU_ROW_* set */
    const float *embeds;        /* the image rows' input rows [n][H] fp32 (a buffer the backend uploads
                                   before the replays; NULL when the model has no vision tower) */
    int nrows;                  /* rows of the replay (its rows bucket) */
    int bucket;                 /* tokens per row */
} cu_batch;
/* The byte offsets of the parts of a batch's parameter buffer, and its size. */
static inline size_t cu_align16(size_t n) { return (n + 15) & ~(size_t)15; }
/* nrows rows and one more, the whole replay as one row (len nrows x bucket: what k_lora.cu's kernels
 * read to cover every token) */
static inline size_t cu_batch_ids_off(int nrows) { return (size_t)(nrows + 1) * sizeof(cu_chunk_params); }
static inline size_t cu_batch_ans_off(int nrows, int bucket) {
    return cu_batch_ids_off(nrows) + cu_align16((size_t)nrows * bucket * sizeof(int));
}
static inline size_t cu_batch_slot_off(int nrows, int bucket) {
    return cu_batch_ans_off(nrows, bucket) + (size_t)nrows * sizeof(cu_row_answers);
}
static inline size_t cu_batch_img_off(int nrows, int bucket) {
    return cu_batch_slot_off(nrows, bucket) + cu_align16((size_t)nrows * bucket * sizeof(int));
}
static inline size_t cu_batch_bytes(int nrows, int bucket) {
    return cu_batch_img_off(nrows, bucket) + (size_t)nrows * bucket * sizeof(cu_token_image);
}
/* The batch's pointers into a parameter buffer at base (device or host). */
static inline cu_batch cu_batch_at(void *base, int nrows, int bucket) {
    cu_batch b;
    b.prm = (const cu_chunk_params *)base;
    b.all = b.prm + nrows;
    b.ids = (const int *)((const char *)base + cu_batch_ids_off(nrows));
    b.ans = (const cu_row_answers *)((const char *)base + cu_batch_ans_off(nrows, bucket));
    b.token_slot = (const int *)((const char *)base + cu_batch_slot_off(nrows, bucket));
    b.img = (const cu_token_image *)((const char *)base + cu_batch_img_off(nrows, bucket));
    b.embeds = NULL;
    b.nrows = nrows;
    b.bucket = bucket;
    return b;
}

/* ---- the backend's switches ----------------------------------------------------------------------
 * The few environment variables the backend honours, read and checked once when a backend is made
 * (backend_cuda.cu's cuda_knobs_read) and passed where they matter; no kernel launch reads the
 * environment. docs/cuda.md ("Switches") has the one table of them, with why each stays. */
#define CUDA_KNOBS_PATH_BYTES 1024
/* The longest chunk by default (a chunk bucket, backend_cuda.cu): each chunk pays a fixed cost (~280
 * dependent kernels) whatever its length, so longer chunks are cheaper per token; scratch grows with it. */
#define CU_DEFAULT_MAX_CHUNK 4096
typedef struct cuda_knobs {
    int graphs;    /* SQUAD_CUDA_GRAPHS: 1 (default) chunks replay captured graphs; 0 run eagerly (debuggers,
                      sanitizers) */
    int max_chunk; /* SQUAD_MAX_CHUNK: the longest chunk asked for in tokens (the largest bucket not above
                      it; default CU_DEFAULT_MAX_CHUNK; a smaller one takes less scratch memory) */
    int att_sm90;  /* SQUAD_ATT_SM90: 1 (default) attention's forward at head_dim 256 on wgmma where the GPU
                      runs it; 0 the portable mma.sync kernel everywhere */
    int gemm_sm90; /* SQUAD_GEMM_SM90: 1 (default) the GEMM tuning may pick the sm_90a small-M kernel; 0
                      cuBLASLt only */
    int gdn_fused_rows; /* SQUAD_GDN_FUSED_ROWS: rows of at most this many tokens (the bucket) run the
                           GDN mixer as one kernel where it applies (k_gdn.cu's kernel D); default
                           CU_GDN_FUSED_ROWS; 0 never */
    /* SQUAD_GEMM_PLANS: the tuned GEMM plans' file; "" none ("off" or empty), else the variable, else
     * $XDG_CACHE_HOME/squad/gemm-plans.txt, else ~/.cache/squad/gemm-plans.txt */
    char gemm_plans[CUDA_KNOBS_PATH_BYTES];
} cuda_knobs;
/* Fills k from the environment (the defaults where a variable is unset); SQUAD_E_INVALID with a
 * message naming the variable for a value it does not take. */
int cuda_knobs_read(cuda_knobs *k, squad_err *err);

/* ---- error checks ---------------------------------------------------------------------------- */
/* squad_fail's twin, so libsquadcuda needs nothing from libsquad (it links after it). */
static inline int cu_err(squad_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}
static inline double cu_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Fills err with the failing call and CUDA's message; returns SQUAD_E_BACKEND. */
static inline int cu_fail(squad_err *err, const char *call, cudaError_t e, const char *file, int line) {
    return cu_err(err, SQUAD_E_BACKEND, "CUDA: %s: %s (%s) at %s:%d", call, cudaGetErrorString(e),
                      cudaGetErrorName(e), file, line);
}
#define CU_TRY(call)                                                             \
    do {                                                                         \
        cudaError_t e_ = (call);                                                 \
        if (e_ != cudaSuccess) return cu_fail(err, #call, e_, __FILE__, __LINE__); \
    } while (0)
/* After a kernel launch: the launch error (bad configuration, too much shared memory, ...). */
#define CU_LAUNCH_CHECK(what)                                                     \
    do {                                                                          \
        cudaError_t e_ = cudaGetLastError();                                      \
        if (e_ != cudaSuccess) return cu_fail(err, what, e_, __FILE__, __LINE__); \
    } while (0)

/* ---- device helpers -------------------------------------------------------------------------- */
#ifdef __CUDACC__
__device__ __forceinline__ uint32_t cu_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ float cu_silu(float x) { return x / (1.0f + __expf(-x)); }
/* Activations are bf16 (the fast path) or fp32 (the exact path): loads and stores of either. */
__device__ __forceinline__ float cu_ld(const bf16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float cu_ld(const float *p) { return *p; }
__device__ __forceinline__ void cu_st(bf16 *p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ void cu_st(float *p, float v) { *p = v; }
__device__ __forceinline__ float cu_sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

/* The GDN conv state [K-1][C] moves on to the chunk's end: new[j] = [old | P][len + j] for the
 * channels ch = first, first + stride, ... below end; all loads of a channel before its stores (no
 * round trip per value). old is conv_in (the arena's own, or a restored blob's: cu_gdn_in), new goes
 * to the arena's conv_state. Run after everything that reads the old state of those channels (both
 * GDN paths' last kernel; the fused mixer's block after its own first conv). */
template <typename A>
__device__ __forceinline__ void cu_conv_state_shift_range(A *conv_state, const A *conv_in, const A *P, int ldP, int C,
                                                          int K, int len, int first, int end, int stride) {
    const int Km1 = K - 1;
    for (int ch = first; ch < end; ch += stride) {
        A v[CU_MAX_CONV_K];
#pragma unroll
        for (int j = 0; j < CU_MAX_CONV_K - 1; j++)
            if (j < Km1) {
                const int src = len + j;
                v[j] = src < Km1 ? conv_in[(size_t)src * C + ch] : P[(size_t)(src - Km1) * ldP + ch];
            }
#pragma unroll
        for (int j = 0; j < CU_MAX_CONV_K - 1; j++)
            if (j < Km1) conv_state[(size_t)j * C + ch] = v[j];
    }
}
/* Every channel of the state (first, first + stride, ... below C). */
template <typename A>
__device__ __forceinline__ void cu_conv_state_shift(A *conv_state, const A *conv_in, const A *P, int ldP, int C,
                                                    int K, int len, int first, int stride) {
    cu_conv_state_shift_range(conv_state, conv_in, P, ldP, C, K, len, first, C, stride);
}

/* The online softmax's steps on an m16n8 accumulator fragment (mma.sync's C layout, which a warp's
 * share of a wgmma m64nN accumulator has too): a thread holds elements of two rows (e 0-1 row r,
 * e 2-3 row r + 8), and the 4 lanes of a quad hold a row between them. Shared by the attention
 * forwards (text and vision, mma.sync and wgmma). */
/* mx0 / mx1: the maxima of the thread's two rows over NT 8-column tiles, across the quad. */
template <int NT>
__device__ __forceinline__ void cu_frag_row_max(const float (&S)[NT][4], float &mx0, float &mx1) {
    mx0 = -__int_as_float(0x7f800000), mx1 = -__int_as_float(0x7f800000);
#pragma unroll
    for (int j = 0; j < NT; j++) {
        mx0 = fmaxf(mx0, fmaxf(S[j][0], S[j][1]));
        mx1 = fmaxf(mx1, fmaxf(S[j][2], S[j][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
}

/* The two rows' output accumulators scaled by a0 / a1 (the old maxima's correction); skipped by the
 * whole warp once every row's maximum has settled (every factor 1: the same bits either way). */
template <int NJ>
__device__ __forceinline__ void cu_frag_rescale(float (&O)[NJ][4], float a0, float a1) {
    if (!__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) return;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        O[j][0] *= a0;
        O[j][1] *= a0;
        O[j][2] *= a1;
        O[j][3] *= a1;
    }
}

/* D += A(16x16, row) * B(16x8, col), bf16 in, fp32 accumulate. Fragment layout (lane = 4 r + c):
 * a0 (row r, k 2c..2c+1), a1 (row r+8), a2 (row r, k 2c+8..), a3 (row r+8, k 2c+8..);
 * b0 (k 2c..2c+1, n r), b1 (k 2c+8.., n r); d0,d1 (row r, n 2c..2c+1), d2,d3 (row r+8). */
__device__ __forceinline__ void cu_mma16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t cu_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cu_ldmatrix_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(cu_smem_addr(p)));
}
__device__ __forceinline__ void cu_ldmatrix_x4_trans(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(cu_smem_addr(p)));
}
/* 16-byte async copy global -> shared; src_bytes 0 fills the 16 bytes with zeros. */
__device__ __forceinline__ void cu_cp_async16(void *smem, const void *gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(cu_smem_addr(smem)), "l"(gmem),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cu_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cu_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* sm_90 bulk copies (the async proxy) and the shared-memory barriers that count their bytes: one
 * thread arms a barrier with the bytes to expect and issues the copies; every consumer waits for
 * the barrier's phase to flip. A barrier's n-th completion has parity n & 1. */
__device__ __forceinline__ void cu_mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(cu_smem_addr(bar)), "r"(count));
}
/* makes initialised barriers visible to the async proxy (before the block's first barrier) */
__device__ __forceinline__ void cu_mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::); }
__device__ __forceinline__ void cu_mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(cu_smem_addr(bar)), "r"(bytes)
                 : "memory");
}
/* bytes (a multiple of 16, both addresses 16-byte aligned) global -> shared, counted on bar */
__device__ __forceinline__ void cu_bulk_g2s(void *smem, const void *gmem, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     cu_smem_addr(smem)),
                 "l"(gmem), "r"(bytes), "r"(cu_smem_addr(bar))
                 : "memory");
}
__device__ __forceinline__ void cu_mbar_wait(uint64_t *bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n"
        "}\n" ::"r"(cu_smem_addr(bar)),
        "r"(parity)
        : "memory");
}

__device__ __forceinline__ float cu_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float cu_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
#endif

/* ---- cuBLASLt projections (k_gemm.cu) ------------------------------------------------------------
 * Y[M][N] = X[M][K] W[N][K]^T with W a checkpoint matrix (row-major [out][in]) and X row-major
 * activations: in cuBLASLt's column-major terms D (N x M) = op_T(W as K x N) * (X as K x M), the
 * "TN" layout. Fast path (f32 = 0): bf16 W and X, fp32 accumulation; acc = 0: D bf16, beta 0;
 * acc = 1: D fp32 and beta 1 with C = D (the residual add fused into the epilogue). Exact path
 * (f32 = 1): W, X and D fp32, fp32 compute (no TF32). A plan (descriptors + the heuristic's
 * algorithm) is made once per shape and kept, so graph captures reuse it. */
/* A configuration of the sm_90a small-M kernel (k_gemm_sm90.cu): wg consumer warpgroups of 64
 * weight rows each, nt token sub-tiles of 64 per block, K split in `splits` parts. */
typedef struct cu_sm90_cfg {
    int wg, nt, splits;
} cu_sm90_cfg;
enum { CU_GEMM_LT = 0, CU_GEMM_SM90 = 1 }; /* who runs a plan: cuBLASLt or the sm_90a kernel */
typedef struct cu_gemm_plan {
    int M, N, K, acc, f32;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo; /* always valid: the fallback when the sm_90a kernel cannot take a call */
    int kind;                  /* CU_GEMM_LT or CU_GEMM_SM90 (then cfg) */
    cu_sm90_cfg cfg;
} cu_gemm_plan;
/* The algorithms the tuning chose, kept in a text file across processes (gemm_plans.cu), so that a
 * later process runs the same algorithm for each shape (the same bits) and skips the tuning. */
typedef struct cu_plan_rec {
    int M, N, K, acc, f32;
    int kind; /* CU_GEMM_LT: algo; CU_GEMM_SM90: cfg */
    cublasLtMatmulAlgo_t algo;
    cu_sm90_cfg cfg;
} cu_plan_rec;
typedef struct cu_plan_store {
    int enabled;     /* a path is known (cuda_knobs.gemm_plans) */
    int loaded;      /* the file was read (or found missing / unusable) */
    char path[1024];
    char header[512]; /* the file's first line: format, GPU model, cuBLASLt and CUDA versions, workspace */
    cu_plan_rec *recs;
    int n, cap;
} cu_plan_store;
/* Sets the file's path (path: cuda_knobs.gemm_plans; NULL or "": no file) and the header of device
 * dev with a GEMM workspace of ws_bytes (an algorithm may need up to it); reads nothing yet. */
void cu_plan_store_init(cu_plan_store *s, const char *path, int dev, size_t ws_bytes);
/* The stored algorithm of a shape, or NULL; reads the file on the first call. A file that is
 * missing, malformed or of another GPU / library version holds nothing. */
const cu_plan_rec *cu_plan_store_find(cu_plan_store *s, int M, int N, int K, int acc, int f32);
/* Remembers a newly tuned plan and rewrites the file (a temporary file renamed over it, so a
 * reader never sees half a file). A failed write leaves the store working in memory. */
void cu_plan_store_add(cu_plan_store *s, const cu_plan_rec *r);
void cu_plan_store_free(cu_plan_store *s);

typedef struct cu_gemm_ctx {
    cublasLtHandle_t lt;
    void *ws; /* device workspace */
    size_t ws_bytes;
    void *rot; /* the tuning's copies of the weights (made on first use) */
    size_t rot_bytes;
    cu_gemm_plan *plans;
    int n_plans, cap_plans;
    int tune; /* new plans time the heuristic's candidates (their outputs must be scratch) */
    cu_plan_store store; /* tuned plans across processes (on after cu_gemm_init; store.enabled = 0 turns it off) */
    /* the sm_90a small-M kernel (k_gemm_sm90.cu) */
    int sm90;            /* its cubin runs on this GPU (compute capability 9.0 exactly) */
    int sm90_off;        /* the tuning leaves it out (set by a caller, e.g. to time cuBLASLt alone) */
    int sm90_sms;        /* the GPU's multiprocessors (how far its candidates split K) */
    int *sm90_probe;     /* one device int: the probe kernel's answer at start */
    void *sm90_encode;   /* the driver's cuTensorMapEncodeTiled */
} cu_gemm_ctx;
/* knobs: the plan file (gemm_plans) and whether the sm_90a kernel may run (gemm_sm90). */
int cu_gemm_init(cu_gemm_ctx *g, const cuda_knobs *knobs, squad_err *err);
void cu_gemm_free(cu_gemm_ctx *g);
int cu_gemm(cu_gemm_ctx *g, const void *W, const void *X, void *Y, int M, int N, int K, int acc, int f32,
            cudaStream_t st, squad_err *err);

/* ---- the sm_90a small-M projection kernel (k_gemm_sm90.cu) ----
 * Y^T = W X^T on wgmma with the weights as the A operand and the tokens as N, both streamed by TMA;
 * the same operands and epilogues as cu_gemm's bf16 path (acc = 0: Y bf16; acc = 1: Y fp32 +=). */
#define CU_SM90_MAX_M 512      /* the tokens of a hit's chunk; larger chunks stay on cuBLASLt */
#define CU_SM90_MAX_CFGS 32
/* Finds out whether the kernel runs here (sets g->sm90, by a probe kernel from the same cubin); a GPU
 * without it is not an error. */
int cu_sm90_init(cu_gemm_ctx *g, int wanted, squad_err *err);
void cu_sm90_free(cu_gemm_ctx *g);
/* The configurations worth timing for a shape (0 when the kernel does not take it). */
int cu_sm90_candidates(const cu_gemm_ctx *g, int M, int N, int K, int f32, cu_sm90_cfg *out, int max);
/* The kernel takes this call (shape, configuration, 16-byte aligned operands, workspace). */
int cu_sm90_usable(const cu_gemm_ctx *g, const cu_sm90_cfg *c, const void *W, const void *X, const void *Y, int M,
                   int N, int K, int f32);
int cu_sm90_gemm(const cu_gemm_ctx *g, const cu_sm90_cfg *c, const void *W, const void *X, void *Y, int M, int N,
                 int K, int acc, cudaStream_t st, squad_err *err);
/* Test only (tests/cuda/cuda_test_gemm.cu's decomposition probe; the backend never calls these): the
 * kernel with its later stages left out, or with one candidate change, timed beside the product to
 * find where a call's time goes by differences. Each variant is its own instantiation (the product's
 * code is untouched); the probe offers nt <= 2 only (a hit's M <= 128). */
enum {
    CU_SM90_VAR_FULL = 0,      /* the product kernel itself */
    CU_SM90_VAR_LAUNCH,        /* a block that only waits for the previous grid: the launch as the product's */
    CU_SM90_VAR_EMPTY,         /* + the prologue: the pipeline's barriers initialised */
    CU_SM90_VAR_LOADS,         /* + every stage's TMA loads; the consumers release the stages unread */
    CU_SM90_VAR_MAIN,          /* + the wgmma chain: the whole main loop, no epilogue */
    CU_SM90_VAR_STAGED,        /* + the accumulators staged in shared memory and the epilogue's cluster barriers */
    CU_SM90_VAR_REDUCED,       /* + the split-K sums over the cluster's shared memory: all but Y's accesses */
    CU_SM90_VAR_PREFETCH,      /* candidate: the product with both tensor maps prefetched at the kernel's start */
    CU_SM90_VAR_TRIGGER_MAIN,  /* candidate: the product letting the next grid launch after its main loop */
    CU_SM90_VAR_TRIGGER_START, /* candidate: the same at its start (the next grid's weights load meanwhile) */
    CU_SM90_N_VARS
};
/* Readies variant var of configuration c (its shared-memory limit); outside any stream capture. */
int cu_sm90_variant_ready(const cu_sm90_cfg *c, int var, squad_err *err);
/* One call of variant var, as cu_sm90_gemm (which is CU_SM90_VAR_FULL) otherwise; after cu_sm90_variant_ready. */
int cu_sm90_variant_gemm(const cu_gemm_ctx *g, const cu_sm90_cfg *c, int var, const void *W, const void *X, void *Y,
                         int M, int N, int K, int acc, cudaStream_t st, squad_err *err);

/* ---- kernel launchers (host) ----------------------------------------------------------------- */

/* k_norm.cu */
/* In these launchers f32 selects fp32 activations (the exact path) instead of bf16. */
/* h[t] = E[ids[t]] (fp32) and x[t] = RMSNorm(h[t]) * (1 + w), for every token of the batch. */
int cu_embed_rmsnorm(const bf16 *E, const cu_batch *b, float *h, void *x, const float *w, int H, float eps, int f32,
                     cudaStream_t st, squad_err *err);
/* x[t] = RMSNorm(h[t]) * (1 + w). */
int cu_rmsnorm(const float *h, void *x, const float *w, int rows, int H, float eps, int f32, cudaStream_t st,
               squad_err *err);
/* out[t][i] = silu(gu[t][i]) * gu[t][I + i] (gu: [rows][2I]). */
int cu_silu_mul(const void *gu, void *out, int rows, int I, int f32, cudaStream_t st, squad_err *err);
/* The letter probabilities at every row's slots: probs[r][i][j] = softmax over j < nopts[i] of
 * RMSNorm(h[r bucket + slot_i]) * (1 + w) . E[letters[j]]; zero past nopts. probs is
 * [nrows][CU_MAX_SLOTS][CU_MAX_LETTERS]; max_slots bounds every row's n_slots (CU_MAX_SLOTS in a
 * graph, which serves any). */
int cu_letter_probs(const float *h, const float *w, const bf16 *E, const cu_batch *b, int max_slots, float *probs,
                    int H, float eps, cudaStream_t st, squad_err *err);

/* k_vocab.cu: the full-vocabulary figures (backend.h) of the answer slots of the batch's rows that
 * ask (prm[r].vocab_base >= 0: slot i of row r is figure vocab_base + i), n_slots of them in all,
 * into out (device memory, [n_slots]), from h (the batch's fp32 residual stream), the final norm
 * and the output embedding E [V][H]. xn: [n_slots][H] floats of scratch; parts:
 * cu_vocab_parts_bytes. max_row_slots bounds every row's n_slots (the first kernel's grid). */
#define CU_VOCAB_GROUP 8 /* slots one pass over E serves */
int cu_vocab_group(int H); /* the slots a pass serves for this hidden size (<= CU_VOCAB_GROUP) */
int cu_vocab_init(int H, squad_err *err); /* kernel attributes (shared memory) */
int cu_vocab_blocks(int V, int n_sm);     /* blocks of the pass over the vocabulary */
size_t cu_vocab_parts_bytes(int n_blocks);
int cu_vocab(const float *h, const float *final_norm, const bf16 *E, const cu_batch *b, int max_row_slots,
             int n_slots, int V, int H, float eps, float *xn, void *parts, int n_blocks, squad_slot_vocab *out,
             cudaStream_t st, squad_err *err);

/* k_gdn.cu: the Gated DeltaNet mixer after in_proj. */
typedef struct cu_gdn_dims {
    int nk, nv, dk, dv, K; /* heads, head dims, conv kernel */
    int ldP;               /* row stride of the in_proj output P: [q | k | v | z | b | a | pad] */
    float eps;             /* the gated RMSNorm's eps */
    int f32;               /* the exact path (k_gdn_exact.cu): fp32 P, conv state, Y; S [nv][dk][dv] */
    unsigned stages;       /* the bf16 path's kernels that run (CU_GDN_*); 0: all. Only the ablation
                              timing (ablate.cu) leaves some out */
    int short_rows;        /* batches of at most this many tokens take the conv and out kernels
                              spread for short chunks, and the conv also every batch whose rows
                              (bucket) are that short (the backend: CU_GDN_SHORT_ROWS; the tests
                              vary it) */
    int scan_rg;           /* the scan's row groups of 16 S^T rows a block: 1, 2 or 4 (more rows a
                              block: fewer copies of W and K' and fewer, fuller blocks for a batch
                              of many rows); 0: chosen per launch from n_sm (the backend; the tests
                              fix it) */
    int n_sm;              /* the GPU's SMs, for that choice and the prep's split (0: no split) */
    int prep_split;        /* the prep's blocks a (block of 64 tokens, head): 1, 2 or 4 (bounded by
                              the head dims); 0: chosen per launch from n_sm, more on short chunks
                              (the backend; the tests fix it) */
    int conv_groups;       /* the pipelined conv's 16-row groups a block; 0: chosen per launch (the
                              backend); < 0: the one-tile conv on every launch; > 0 fixed. The
                              tests vary it: every form gives the same bits */
    int ldY;               /* the output Y's row stride in elements; 0: nv dv (packed). More when Y is
                              the first columns of a widened GEMM input (k_lora.cuh), so the
                              specialists' out_proj reads it without a copy */
    int fused_rows;        /* launches whose rows (bucket) have at most this many tokens run the fused
                              mixer (one kernel, a block a (row, head)) where cu_gdn_fused_ok holds
                              and, with n_sm set, the launch has a block an SM and rows of more than
                              64 tokens (cu_gdn_fused_here); 0: never (the backend:
                              cuda_knobs.gdn_fused_rows) */
    int fused_fits;        /* set by cu_gdn_init: the fused mixer has an instance for these head dims
                              and this GPU gives a block its shared memory */
} cu_gdn_dims;
#define CU_GDN_SHORT_ROWS 256 /* a hit's question: 4 tokens a conv block, one row tile an out block */
#define CU_GDN_FUSED_ROWS 128 /* the fused mixer's default bound (docs/cuda.md, "The fused mixer") */
enum { CU_GDN_CONV = 1, CU_GDN_PREP = 2, CU_GDN_SCAN = 4, CU_GDN_OUT = 8 };
typedef struct cu_gdn_scratch {
    /* the chunked path (head dims padded) */
    bf16 *Qn, *Kn; /* [rows][nk][dk]: conv + SiLU + L2 norm (q also / sqrt(dk)), written by the conv kernel */
    float *Vn;     /* [rows][nv][dv]: conv + SiLU */
    /* W, K' and U^T, the scan's operands, are stored with the scan's padded shared-memory row
     * strides (CU_GDN_LDW, CU_GDN_LDU) so it copies each as one contiguous bulk copy */
    bf16 *W;      /* [chunks][nv][64][CU_GDN_LDW(dk)] */
    float *UT;    /* [chunks][nv][dv][CU_GDN_LDU] */
    bf16 *Qg;     /* [chunks][nv][64][dk] */
    bf16 *Kp;     /* [chunks][nv][64][CU_GDN_LDW(dk)]: K' = diag(exp(gamma_last - gamma)) K */
    bf16 *Pm;     /* [chunks][nv][64][64] */
    float *glast; /* [chunks][nv] */
    bf16 *Sc;     /* [chunks][nv][dv][dk]: S^T at each block's start (written by the scan) */
    bf16 *dT;     /* [chunks][nv][dv][64]: delta^T (written by the scan) */
    /* the exact path */
    float *q, *k;       /* [rows][nk dk], normed */
    float *v, *o;       /* [rows][nv dv] */
    float *dec, *beta;  /* [rows][nv]: exp(g), beta */
} cu_gdn_scratch;
/* Bytes of one GDN layer's recurrent state S in the backend's layout. */
size_t cu_gdn_state_bytes(const cu_gdn_dims *d);
/* A head dim padded to the kernels' instantiation (16, 32, 64, 128). The state S^T is
 * [nv][pad(dv)][pad(dk)] fp32. */
int cu_gdn_pad(int x);
/* Bytes of scratch for `tokens` tokens in all and `blocks` blocks of 64 tokens (a row's tokens start a
 * new block, so a batch of n rows of bucket b needs n ceil(b / 64) of them). */
size_t cu_gdn_scratch_bytes(const cu_gdn_dims *d, int tokens, int blocks);
void cu_gdn_scratch_bind(cu_gdn_scratch *s, void *base, const cu_gdn_dims *d, int tokens, int blocks);
int cu_gdn_supported(const cu_gdn_dims *d);
/* Whether the fused mixer can run these dims (nv == nk, conv width 4, head dims padded alike, 8-aligned
 * rows, fused_fits); launches of longer rows than fused_rows still take the four kernels. */
int cu_gdn_fused_ok(const cu_gdn_dims *d);
/* Whether a launch of nrows rows of `rows` tokens (the bucket) takes the fused mixer (the rule
 * cu_gdn_forward applies, but for its pointers' 16-byte alignment). */
int cu_gdn_fused_here(const cu_gdn_dims *d, int rows, unsigned nrows);
/* Kernel attributes (shared memory), and d->fused_fits. */
int cu_gdn_init(cu_gdn_dims *d, squad_err *err);
/* Every row of the batch at once (a grid dimension over rows). P: [tokens][ldP] bf16 in_proj output;
 * per row, its slot's arena (prm[r].gdn) holds this layer's S at byte offset s_off ([nv][pad dv][pad dk]
 * fp32, the transposed state; updated) and its conv inputs at conv_off ([K-1][C] bf16; updated);
 * Y: [tokens][nv dv] bf16 (row stride d->ldY when set), the gated-normed output (0 on padding). */
int cu_gdn_forward(const cu_gdn_dims *d, const void *P, size_t conv_off, const float *conv_w, const float *A_log,
                   const float *dt_bias, const float *norm_w, size_t s_off, void *Y, const cu_gdn_scratch *scr,
                   const cu_batch *b, cudaStream_t st, squad_err *err);
/* The exact path: fp32 P, conv inputs and Y; S [nv][dk][dv] fp32. */
int cu_gdn_forward_exact(const cu_gdn_dims *d, const float *P, size_t conv_off, const float *conv_w,
                         const float *A_log, const float *dt_bias, const float *norm_w, size_t s_off, float *Y,
                         const cu_gdn_scratch *scr, const cu_batch *b, cudaStream_t st, squad_err *err);

/* k_attn.cu: gated attention after q/k/v_proj. */
typedef struct cu_attn_dims {
    int nh, nkv, hd, rd; /* heads, head dim, rotary dims */
    int ldQKV;           /* row stride of the projection output: [nh (hd q | hd gate) | nkv hd k | nkv hd v] */
    float eps;
    int max_context;
    size_t kv_stride; /* elements between positions in the K / V cache (position-major cache) */
    int f32;          /* the exact path: fp32 QKV, K / V cache, q scratch and out; fp32 attention */
    unsigned stages;  /* the bf16 path's kernels that run (CU_ATT_*); 0: all (see cu_gdn_dims.stages) */
    int sm90;         /* set by cu_attn_init: 1 the forward runs on wgmma (k_attn_sm90.cu), 0: not */
    int ldo;          /* the output's row stride in elements; 0: nh hd (packed). More when it is the first
                         columns of a widened GEMM input (k_lora.cuh): the specialists' o_proj reads it
                         without a copy */
    /* M-RoPE (device [rd/2]): the position axis (0 t, 1 h, 2 w) of each rotary frequency, for rows with
     * CU_ROW_POSITIONS; NULL: every row turns by start + i (rows' positions ignored) */
    const int *mrope_axis;
} cu_attn_dims;
enum { CU_ATT_PREP = 1, CU_ATT_FWD = 2, CU_ATT_COMBINE = 4 };
int cu_attn_supported(const cu_attn_dims *d);
/* Sets the kernels up for these dims (and d->sm90: whether the forward runs on wgmma, where the GPU
 * can and want_sm90 asks: cuda_knobs.att_sm90). */
int cu_attn_init(cu_attn_dims *d, int want_sm90, squad_err *err);
/* Splits of the key range for a batch of nrows rows of `bucket` query tokens each and keys up to
 * `span`. */
int cu_attn_splits(const cu_attn_dims *d, int nrows, int bucket, int span, int n_sm);
size_t cu_attn_partial_bytes(const cu_attn_dims *d, int tokens, int splits);
/* Every row of the batch at once. QKV: [tokens][ldQKV] bf16; per row, this layer's K / V are at
 * element offsets wko, wvo from its prm[r].kv_work (the slot's first own position, kv_split),
 * kv_stride elements per position, [nkv][hd] each (positions [start, start+len) written);
 * inv_freq [rd/2] fp32; Qb [tokens][nh][hd] scratch; part: partial-results scratch;
 * out: [tokens][nh hd] bf16 (row stride d->ldo when set) = attention * sigmoid(gate) (0 on padding).
 * blob_k_off, blob_v_off: elements from prm[r].kv_src to this layer's K and V at position 0, for the
 * keys below prm[r].kv_split. Both buffers are found through the parameters at run time. */
int cu_attn_forward(const cu_attn_dims *d, const void *QKV, const float *q_norm, const float *k_norm,
                    const float *inv_freq, ptrdiff_t wko, ptrdiff_t wvo, ptrdiff_t blob_k_off, ptrdiff_t blob_v_off,
                    void *Qb, void *part, int splits, void *out, const cu_batch *b, cudaStream_t st,
                    squad_err *err);

/* ---- the backend's internals for tests and benchmarks (backend_cuda.cu) -----------------------
 * What the test API (tests/cuda) and the ablation timing (bench/cuda) need of a backend and cannot
 * get through backend.h; neither is part of libsquad. */
typedef struct cu_parts_graph {
    cudaStream_t st;        /* the backend's stream */
    int rows;               /* the chunk's bucket */
    cudaGraphExec_t graph;  /* the chunk's forward with only the chosen parts (the caller destroys it) */
    cudaGraphExec_t engine; /* with want_engine: the backend's own graph of that bucket and span (the
                               backend's; not to be destroyed) */
} cu_parts_graph;
/* Writes the parameters of a batch of nrows chunks [start, start + len) on slots 0 .. nrows - 1
 * (pseudo-random ids, no answer slots; each row's GDN state from its own arena; with `shared` rows
 * 1 .. read [0, start) in place from row 0's K / V, as hits restored from one cached state do, else
 * each row reads its own), captures its forward with only `parts` (SQUAD_CUDA_PART_*), and with
 * want_engine captures (or finds) the engine's graph of the same shape. */
int cu_backend_capture_parts(squad_backend *be, int nrows, int shared, int start, int len, unsigned parts,
                             int want_engine, cu_parts_graph *a, squad_err *err);
/* The engine's graph of a batch of nrows chunks [start, start + len) (captured first if it is not
 * yet), without touching the slots or the parameters, and the backend's stream. */
int cu_backend_engine_graph(squad_backend *be, int nrows, int start, int len, cudaGraphExec_t *ex, cudaStream_t *st,
                            squad_err *err);
/* The parameters' host-to-device copy forward makes before each replay (timed with it). */
int cu_backend_upload_params(squad_backend *be, squad_err *err);
/* A scratch buffer: `rows` rows `pitch` bytes apart, of which the first `width` bytes of each are
 * what the kernels write (the rest, if any, must stay zero). */
typedef struct cu_scratch_region {
    void *p;
    size_t rows, pitch, width;
} cu_scratch_region;
#define CU_SCRATCH_REGIONS 12
/* The backend's scratch buffers (activations, kernel scratch, partial results) into out (at most max
 * of them); their count (at most CU_SCRATCH_REGIONS), -1 for a backend that is not CUDA's. */
int cu_backend_scratch(const squad_backend *be, cu_scratch_region *out, int max);

#endif
