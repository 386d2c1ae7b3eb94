/*
 * gemm.c — fp32 x bf16 matrix multiply for the CPU backend (gemm.h).
 *
 * Design. A call picks a kernel table by the pool's ISA and precision (gemm_select), then spreads
 * tasks over the pool. Two algorithms:
 *  - DOT (T <= DOT_MAX_T): every output is a dot product of an x row with a W row read in place.
 *    A GEMV is memory-bound: W is streamed once whatever the kernel, so packing would only add a
 *    pass. Each task owns a block of W rows and walks every t.
 *  - PACKED (larger T): BLAS-style. Per block of PACK_TB tokens, x is packed once into 8-token
 *    tiles; each task packs one 48-column W panel, PACK_KC deep at a time, into per-thread scratch
 *    and runs an 8 x 48 register-tiled microkernel over every x tile (see "packed GEMM" below).
 * Precision: EXACT widens W to fp32 and uses fp32 FMAs (x as given). FAST rounds x to bf16 once, in
 * the packing, and uses vdpbf16ps (two bf16 products summed into each fp32 lane per instruction:
 * twice the FMA rate); without AVX512_BF16 it runs the fp32 kernels on the rounded x, so every
 * ISA gives FAST the same meaning.
 * AVX2 (no bf16 dot product): 6 x 16 tiles, W widened to fp32 in registers while it is packed,
 * FAST = x rounded to bf16 in the packing; the portable level runs the same driver with plain
 * packers and a 4 x 16 C microkernel.
 * Measured on the development machine (Zen 5, one core, CPU time): the bf16 microkernel at ~95%
 * of the vdpbf16ps peak on cached data; whole calls at T = 512: FAST ~350 GFLOP/s, EXACT ~170,
 * OpenBLAS sgemm ~160 (bench/RESULTS.md). On Zen 3 (AVX2, one core): 68-86 GFLOP/s on the
 * projection shapes at T = 128 and 512, 68-86% of the FMA peak (bench/RESULTS-cpu.md).
 * The kernels are plain C functions compiled with __attribute__((target(...))), so the file builds
 * with the default flags and runs on any x86-64 (and anywhere else through the scalar kernels).
 * Nothing here is global or mutable: packed operands live in the pool's scratch buffer.
 */
#include "cpu/gemm.h"

#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define GEMM_X86 1
#define TARGET_AVX2 __attribute__((target("avx2,fma")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#else
#define GEMM_X86 0
#endif

/* T at or below which AUTO takes the DOT path: W is streamed once either way, and the packed path
 * would pad the x tile (measured: the two meet near T = 4). */
#define DOT_MAX_T CPU_GEMM_DOT_MAX_T
/* W rows one DOT kernel call handles: their partial sums share each load of x. */
#define DOT_ROWS 4
/* W rows per DOT task (a multiple of DOT_ROWS): K x 64 rows x 2 bytes stays in L2 across all t. */
#define DOT_TASK_ROWS 64
/* Tasks per thread the work is cut into, so a thread slowed by other load is caught up by others. */
#define TASKS_PER_THREAD 4

/* ---------------------------------------------------------------- the oracle */

void cpu_gemm_bf16_ref(float *y, const float *x, const uint16_t *W, int T, int N, int K, int accumulate) {
    for (int t = 0; t < T; t++) {
        for (int n = 0; n < N; n++) {
            double s = accumulate ? (double)y[(size_t)t * N + n] : 0.0;
            const float *xr = x + (size_t)t * K;
            const uint16_t *wr = W + (size_t)n * K;
            for (int k = 0; k < K; k++) s += (double)xr[k] * (double)squad_bf16_to_f32(wr[k]);
            y[(size_t)t * N + n] = (float)s;
        }
    }
}

/* ---------------------------------------------------------------- DOT kernels
 * dot_fn: out[r] = sum_k x[k] * W[r*ldw + k] for r < rows (1..DOT_ROWS). x is fp32 (EXACT, or FAST
 * on a CPU without bf16 dot products: then x holds bf16-rounded values) or bf16 (FAST with
 * vdpbf16ps). */
typedef void (*dot_fn)(const void *x, const uint16_t *W, size_t ldw, int rows, int K, float *out);

static void dot_scalar(const void *xv, const uint16_t *W, size_t ldw, int rows, int K, float *out) {
    /* SCALAR_LANES partial sums, as the vector kernels keep: shorter chains, less round-off. */
    enum { SCALAR_LANES = 8 };
    const float *x = xv;
    for (int r = 0; r < rows; r++) {
        const uint16_t *w = W + (size_t)r * ldw;
        float s[SCALAR_LANES] = {0};
        int k = 0;
        for (; k + SCALAR_LANES <= K; k += SCALAR_LANES)
            for (int l = 0; l < SCALAR_LANES; l++) s[l] += x[k + l] * squad_bf16_to_f32(w[k + l]);
        for (; k < K; k++) s[0] += x[k] * squad_bf16_to_f32(w[k]);
        float tot = 0.0f;
        for (int l = 0; l < SCALAR_LANES; l++) tot += s[l];
        out[r] = tot;
    }
}

#if GEMM_X86
TARGET_AVX2 static inline __m256 avx2_load_bf16x8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

TARGET_AVX2 static inline float avx2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

TARGET_AVX2 static void dot_avx2(const void *xv, const uint16_t *W, size_t ldw, int rows, int K, float *out) {
    const float *x = xv;
    __m256 acc[DOT_ROWS];
    for (int r = 0; r < DOT_ROWS; r++) acc[r] = _mm256_setzero_ps();
    int k = 0;
    if (rows == DOT_ROWS) {
        for (; k + 8 <= K; k += 8) {
            __m256 xv8 = _mm256_loadu_ps(x + k);
            for (int r = 0; r < DOT_ROWS; r++)
                acc[r] = _mm256_fmadd_ps(xv8, avx2_load_bf16x8(W + r * ldw + k), acc[r]);
        }
    } else {
        for (; k + 8 <= K; k += 8) {
            __m256 xv8 = _mm256_loadu_ps(x + k);
            for (int r = 0; r < rows; r++) acc[r] = _mm256_fmadd_ps(xv8, avx2_load_bf16x8(W + r * ldw + k), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) {
        float s = avx2_hsum(acc[r]);
        const uint16_t *w = W + r * ldw;
        for (int kk = k; kk < K; kk++) s += x[kk] * squad_bf16_to_f32(w[kk]);
        out[r] = s;
    }
}

TARGET_AVX512 static inline __m512 avx512_load_bf16x16(const uint16_t *p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

TARGET_AVX512 static inline __m512 avx512_load_bf16x16_mask(const uint16_t *p, __mmask16 m) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

TARGET_AVX512 static void dot_avx512(const void *xv, const uint16_t *W, size_t ldw, int rows, int K, float *out) {
    const float *x = xv;
    __m512 acc[DOT_ROWS];
    for (int r = 0; r < DOT_ROWS; r++) acc[r] = _mm512_setzero_ps();
    int k = 0;
    if (rows == DOT_ROWS) {
        for (; k + 16 <= K; k += 16) {
            __m512 x16 = _mm512_loadu_ps(x + k);
            for (int r = 0; r < DOT_ROWS; r++)
                acc[r] = _mm512_fmadd_ps(x16, avx512_load_bf16x16(W + r * ldw + k), acc[r]);
        }
    } else {
        for (; k + 16 <= K; k += 16) {
            __m512 x16 = _mm512_loadu_ps(x + k);
            for (int r = 0; r < rows; r++) acc[r] = _mm512_fmadd_ps(x16, avx512_load_bf16x16(W + r * ldw + k), acc[r]);
        }
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
        __m512 x16 = _mm512_maskz_loadu_ps(m, x + k);
        for (int r = 0; r < rows; r++)
            acc[r] = _mm512_fmadd_ps(x16, avx512_load_bf16x16_mask(W + r * ldw + k, m), acc[r]);
    }
    for (int r = 0; r < rows; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
}

/* x is bf16 here: 32 products per vdpbf16ps, pairs summed in fp32. */
TARGET_AVX512BF16 static void dot_avx512bf16(const void *xv, const uint16_t *W, size_t ldw, int rows, int K,
                                              float *out) {
    const uint16_t *x = xv;
    __m512 acc[DOT_ROWS];
    for (int r = 0; r < DOT_ROWS; r++) acc[r] = _mm512_setzero_ps();
    int k = 0;
    if (rows == DOT_ROWS) {
        for (; k + 32 <= K; k += 32) {
            __m512bh x32 = (__m512bh)_mm512_loadu_si512(x + k);
            for (int r = 0; r < DOT_ROWS; r++)
                acc[r] = _mm512_dpbf16_ps(acc[r], x32, (__m512bh)_mm512_loadu_si512(W + r * ldw + k));
        }
    } else {
        for (; k + 32 <= K; k += 32) {
            __m512bh x32 = (__m512bh)_mm512_loadu_si512(x + k);
            for (int r = 0; r < rows; r++)
                acc[r] = _mm512_dpbf16_ps(acc[r], x32, (__m512bh)_mm512_loadu_si512(W + r * ldw + k));
        }
    }
    if (k < K) {
        __mmask32 m = (__mmask32)((1ull << (K - k)) - 1ull);
        __m512bh x32 = (__m512bh)_mm512_maskz_loadu_epi16(m, x + k);
        for (int r = 0; r < rows; r++)
            acc[r] = _mm512_dpbf16_ps(acc[r], x32, (__m512bh)_mm512_maskz_loadu_epi16(m, W + r * ldw + k));
    }
    for (int r = 0; r < rows; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
}
#endif

/* ---------------------------------------------------------------- packed GEMM
 * For larger T the product is tiled BLAS-style. x is packed once per call into row tiles of MR
 * tokens, k-major inside a tile ([tile][k][MR], zero-padded), so the microkernel broadcasts one
 * value per token straight from memory. Each task owns an NC-column panel of W (and a range of
 * tiles), which it packs k-major ([k][NC], zero-padded) into per-thread scratch one KC-deep slice
 * at a time; the slice stays in L2 while every x tile of the task streams past it. The
 * microkernel keeps an MR x NC block of y in registers (MR x NC/16 zmm accumulators).
 * FAST with vdpbf16ps works on k *pairs*: one 32-bit unit holds x[t][2p], x[t][2p+1] (or
 * W[n][2p], W[n][2p+1]) and one instruction adds both products to each fp32 lane.
 * Other ISAs use fp32 panels (W widened once while packing) and FMAs, with x rounded to bf16 in
 * the packing for FAST.
 */

/* AVX-512 tiles: 8 tokens x 48 columns = 24 zmm accumulators (of 32), 3 for W, the x values
 * come as memory broadcasts. 11 loads per 24 FMAs keep the two FMA pipes fed. */
#define P512_MR 8
#define P512_NC 48
/* AVX2 tiles: 6 tokens x 16 columns = 12 ymm accumulators (of 16). */
#define P256_MR 6
#define P256_NC 16
/* k per AVX2 W slice: 256 x 16 x 4 bytes = 16 KiB, half the L1 (x tiles stream through the rest). */
#define P256_KC 256
/* k (fp32 panels) or k pairs (bf16 panels) per W slice: 512 x 48 x 4 bytes = 96 KiB, in L2. */
#define PACK_KC 512
/* Tokens per block of the packed path: as many as keep the block's packed x within
 * PACK_X_BLOCK_BYTES (L2 + a slice of L3: x is re-read for every W panel), between PACK_TB_MIN
 * and PACK_TB. Measured: K = 3584 in fp32 at 256 tokens instead of 512 runs 20% faster. */
#define PACK_TB 512
#define PACK_TB_MIN 64
#define PACK_X_BLOCK_BYTES (2u << 20)
/* How far ahead (in pairs of one W row) the W packing prefetches. */
#define PACK_PREFETCH_PAIRS 64

/* kern_fn: y[m][c] (+)= sum over kc steps of xp[k][m] * wp[k][c] for m < mv, c < nv. xp and wp
 * point at the slice start; load_y: add to y (else overwrite). */
typedef void (*kern_fn)(const void *xp, const void *wp, int kc, float *y, size_t ldy, int mv, int nv, int load_y);

#if GEMM_X86
/* Writes (or adds) one 16-lane accumulator to y[0..nv) with nv possibly < 16. */
TARGET_AVX512 static inline void p512_store(float *y, __m512 v, int nv, int load_y) {
    if (nv >= 16) {
        if (load_y) v = _mm512_add_ps(v, _mm512_loadu_ps(y));
        _mm512_storeu_ps(y, v);
    } else if (nv > 0) {
        __mmask16 m = (__mmask16)((1u << nv) - 1u);
        if (load_y) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, y));
        _mm512_mask_storeu_ps(y, m, v);
    }
}

/* The AVX-512 microkernels in three widths (NZ zmm = 16 columns each): a panel's last, narrower
 * columns (N = 16, 1000, ...) do not pay for a full 48-column tile. One body, instantiated by macro
 * for fp32 FMA and for vdpbf16ps; the x value per token is a broadcast, W comes in NZ loads. */
#define P512_KERNEL_F32(NAME, NZ)                                                                           \
    TARGET_AVX512 static void NAME(const void *xpv, const void *wpv, int kc, float *y, size_t ldy, int mv,     \
                                   int nv, int load_y) {                                                     \
        const float *xp = xpv, *wp = wpv;                                                                    \
        __m512 acc[P512_MR][NZ];                                                                             \
        _Pragma("GCC unroll 8") for (int m = 0; m < P512_MR; m++)                                            \
            _Pragma("GCC unroll 3") for (int z = 0; z < NZ; z++) acc[m][z] = _mm512_setzero_ps();           \
        for (int k = 0; k < kc; k++) {                                                                       \
            __m512 b[NZ];                                                                                    \
            _Pragma("GCC unroll 3") for (int z = 0; z < NZ; z++) b[z] = _mm512_load_ps(wp + 16 * z);        \
            _Pragma("GCC unroll 8") for (int m = 0; m < P512_MR; m++) {                                      \
                __m512 a = _mm512_set1_ps(xp[m]);                                                            \
                _Pragma("GCC unroll 3") for (int z = 0; z < NZ; z++) acc[m][z] =                             \
                    _mm512_fmadd_ps(a, b[z], acc[m][z]);                                                     \
            }                                                                                                \
            xp += P512_MR;                                                                                   \
            wp += P512_NC;                                                                                   \
        }                                                                                                    \
        for (int m = 0; m < mv; m++)                                                                         \
            for (int z = 0; z < NZ; z++) p512_store(y + (size_t)m * ldy + 16 * z, acc[m][z], nv - 16 * z, load_y); \
    }

#define P512_KERNEL_BF16(NAME, NZ)                                                                          \
    TARGET_AVX512BF16 static void NAME(const void *xpv, const void *wpv, int kc, float *y, size_t ldy, int mv, \
                                       int nv, int load_y) {                                                 \
        const int32_t *xp = xpv; /* bf16 pairs */                                                            \
        const int32_t *wp = wpv;                                                                             \
        __m512 acc[P512_MR][NZ];                                                                             \
        _Pragma("GCC unroll 8") for (int m = 0; m < P512_MR; m++)                                            \
            _Pragma("GCC unroll 3") for (int z = 0; z < NZ; z++) acc[m][z] = _mm512_setzero_ps();           \
        for (int k = 0; k < kc; k++) {                                                                       \
            __m512bh b[NZ];                                                                                  \
            _Pragma("GCC unroll 3") for (int z = 0; z < NZ; z++) b[z] =                                      \
                (__m512bh)_mm512_load_si512(wp + 16 * z);                                                    \
            _Pragma("GCC unroll 8") for (int m = 0; m < P512_MR; m++) {                                      \
                __m512bh a = (__m512bh)_mm512_set1_epi32(xp[m]);                                             \
                _Pragma("GCC unroll 3") for (int z = 0; z < NZ; z++) acc[m][z] =                             \
                    _mm512_dpbf16_ps(acc[m][z], a, b[z]);                                                    \
            }                                                                                                \
            xp += P512_MR;                                                                                   \
            wp += P512_NC;                                                                                   \
        }                                                                                                    \
        for (int m = 0; m < mv; m++)                                                                         \
            for (int z = 0; z < NZ; z++) p512_store(y + (size_t)m * ldy + 16 * z, acc[m][z], nv - 16 * z, load_y); \
    }

P512_KERNEL_F32(kern_512_f32_1, 1)
P512_KERNEL_F32(kern_512_f32_2, 2)
P512_KERNEL_F32(kern_512_f32_3, 3)
P512_KERNEL_BF16(kern_512_bf16_1, 1)
P512_KERNEL_BF16(kern_512_bf16_2, 2)
P512_KERNEL_BF16(kern_512_bf16_3, 3)

/* Transposes a 16 x 16 block of 32-bit elements held in r[0..15] (row i -> column i). Three
 * rounds: 32-bit interleaves, 64-bit interleaves, then 128-bit lane shuffles. */
TARGET_AVX512 static inline __attribute__((always_inline)) void transpose16x16(__m512i r[16]) {
    __m512i a[16], c[16];
    for (int i = 0; i < 16; i += 2) {
        a[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        a[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* c[4g + q], lane L: column 4L + q of rows 4g .. 4g+3 */
    for (int g = 0; g < 4; g++) {
        c[4 * g + 0] = _mm512_unpacklo_epi64(a[4 * g], a[4 * g + 2]);
        c[4 * g + 1] = _mm512_unpackhi_epi64(a[4 * g], a[4 * g + 2]);
        c[4 * g + 2] = _mm512_unpacklo_epi64(a[4 * g + 1], a[4 * g + 3]);
        c[4 * g + 3] = _mm512_unpackhi_epi64(a[4 * g + 1], a[4 * g + 3]);
    }
    for (int q = 0; q < 4; q++) {
        __m512i d0 = _mm512_shuffle_i32x4(c[q], c[4 + q], _MM_SHUFFLE(1, 0, 1, 0));
        __m512i d1 = _mm512_shuffle_i32x4(c[q], c[4 + q], _MM_SHUFFLE(3, 2, 3, 2));
        __m512i d2 = _mm512_shuffle_i32x4(c[8 + q], c[12 + q], _MM_SHUFFLE(1, 0, 1, 0));
        __m512i d3 = _mm512_shuffle_i32x4(c[8 + q], c[12 + q], _MM_SHUFFLE(3, 2, 3, 2));
        r[q] = _mm512_shuffle_i32x4(d0, d2, _MM_SHUFFLE(2, 0, 2, 0));
        r[4 + q] = _mm512_shuffle_i32x4(d0, d2, _MM_SHUFFLE(3, 1, 3, 1));
        r[8 + q] = _mm512_shuffle_i32x4(d1, d3, _MM_SHUFFLE(2, 0, 2, 0));
        r[12 + q] = _mm512_shuffle_i32x4(d1, d3, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* W columns [n0, n0+nv) (rows of W) as bf16 pairs [p0, p0+kc2): [kc2][nc] 32-bit units, zero-padded
 * past nv and past K. 16 W rows x 16 pairs per transpose. Masked loads stop at the
 * slice's and the row's end, so an odd K never reads the next row's first element. */
TARGET_AVX512 static void pack_w_bf16_512(void *wpv, const uint16_t *W, int K, int n0, int nv, int nc, int p0,
                                          int kc2) {
    uint32_t *wp = wpv;
    for (int c0 = 0; c0 < nc; c0 += 16) {
        for (int pb = 0; pb < kc2; pb += 16) {
            int pairs = kc2 - pb < 16 ? kc2 - pb : 16;
            int e = 2 * (p0 + pb);
            int elems = K - e < 2 * pairs ? K - e : 2 * pairs;
            __mmask32 mask = elems >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << elems) - 1u);
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                if (c0 + i >= nv) {
                    r[i] = _mm512_setzero_si512();
                    continue;
                }
                const uint16_t *src = W + (size_t)(n0 + c0 + i) * K + e;
                /* W comes from DRAM once per call: ask for the row's next lines early (the
                 * hardware prefetcher tracks few of these 16-48 strided streams). */
                if (pb + PACK_PREFETCH_PAIRS < kc2) _mm_prefetch((const char *)(src + 2 * PACK_PREFETCH_PAIRS), _MM_HINT_T0);
                r[i] = _mm512_maskz_loadu_epi16(mask, src);
            }
            transpose16x16(r);
            for (int j = 0; j < pairs; j++) _mm512_store_si512(wp + (size_t)(pb + j) * nc + c0, r[j]);
        }
    }
}

/* pack_w_f32 (below) with AVX-512: 16 W rows x 16 k widened to fp32, then transposed. */
TARGET_AVX512 static void pack_w_f32_512(void *wpv, const uint16_t *W, int K, int n0, int nv, int nc, int k0,
                                         int kc) {
    float *wp = wpv;
    for (int c0 = 0; c0 < nc; c0 += 16) {
        for (int kb = 0; kb < kc; kb += 16) {
            int cnt = kc - kb < 16 ? kc - kb : 16;
            __mmask16 mask = (__mmask16)(cnt >= 16 ? 0xffffu : (1u << cnt) - 1u);
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                if (c0 + i < nv) {
                    const uint16_t *src = W + (size_t)(n0 + c0 + i) * K + k0 + kb;
                    if (kb + 2 * PACK_PREFETCH_PAIRS < kc) _mm_prefetch((const char *)(src + 2 * PACK_PREFETCH_PAIRS), _MM_HINT_T0);
                    __m256i h = _mm256_maskz_loadu_epi16(mask, src);
                    r[i] = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
                } else {
                    r[i] = _mm512_setzero_si512();
                }
            }
            transpose16x16(r);
            for (int j = 0; j < cnt; j++) _mm512_store_si512(wp + (size_t)(kb + j) * nc + c0, r[j]);
        }
    }
}

TARGET_AVX2 static inline void p256_store(float *y, __m256 v, int nv, int load_y) {
    if (nv >= 8) {
        if (load_y) v = _mm256_add_ps(v, _mm256_loadu_ps(y));
        _mm256_storeu_ps(y, v);
    } else if (nv > 0) {
        float tmp[8];
        _mm256_storeu_ps(tmp, v);
        for (int c = 0; c < nv; c++) y[c] = load_y ? y[c] + tmp[c] : tmp[c];
    }
}

/* The AVX2 microkernel: 6 tokens x 16 columns in 12 ymm accumulators, 2 ymm of W per k and one
 * broadcast register, 15 of the 16 registers. The accumulators are named variables, never an
 * array indexed by a run-time bound: GCC then keeps all twelve in registers (with an array and a
 * loop to mv for the stores it spilled every accumulator to the stack on every k, halving the
 * rate). A partial tile (mv < 6 or nv < 16) goes through a small buffer after the k loop. */
TARGET_AVX2 static void kern_256_f32(const void *xpv, const void *wpv, int kc, float *y, size_t ldy, int mv, int nv,
                                     int load_y) {
    const float *xp = xpv, *wp = wpv;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#pragma GCC unroll 4
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(wp), b1 = _mm256_load_ps(wp + 8), a;
        a = _mm256_broadcast_ss(xp + 0);
        c00 = _mm256_fmadd_ps(a, b0, c00);
        c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(xp + 1);
        c10 = _mm256_fmadd_ps(a, b0, c10);
        c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(xp + 2);
        c20 = _mm256_fmadd_ps(a, b0, c20);
        c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(xp + 3);
        c30 = _mm256_fmadd_ps(a, b0, c30);
        c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(xp + 4);
        c40 = _mm256_fmadd_ps(a, b0, c40);
        c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(xp + 5);
        c50 = _mm256_fmadd_ps(a, b0, c50);
        c51 = _mm256_fmadd_ps(a, b1, c51);
        xp += P256_MR;
        wp += P256_NC;
    }
    if (mv == P256_MR && nv == P256_NC) {
        float *r0 = y, *r1 = y + ldy, *r2 = y + 2 * ldy, *r3 = y + 3 * ldy, *r4 = y + 4 * ldy, *r5 = y + 5 * ldy;
        if (load_y) {
            c00 = _mm256_add_ps(c00, _mm256_loadu_ps(r0)), c01 = _mm256_add_ps(c01, _mm256_loadu_ps(r0 + 8));
            c10 = _mm256_add_ps(c10, _mm256_loadu_ps(r1)), c11 = _mm256_add_ps(c11, _mm256_loadu_ps(r1 + 8));
            c20 = _mm256_add_ps(c20, _mm256_loadu_ps(r2)), c21 = _mm256_add_ps(c21, _mm256_loadu_ps(r2 + 8));
            c30 = _mm256_add_ps(c30, _mm256_loadu_ps(r3)), c31 = _mm256_add_ps(c31, _mm256_loadu_ps(r3 + 8));
            c40 = _mm256_add_ps(c40, _mm256_loadu_ps(r4)), c41 = _mm256_add_ps(c41, _mm256_loadu_ps(r4 + 8));
            c50 = _mm256_add_ps(c50, _mm256_loadu_ps(r5)), c51 = _mm256_add_ps(c51, _mm256_loadu_ps(r5 + 8));
        }
        _mm256_storeu_ps(r0, c00), _mm256_storeu_ps(r0 + 8, c01);
        _mm256_storeu_ps(r1, c10), _mm256_storeu_ps(r1 + 8, c11);
        _mm256_storeu_ps(r2, c20), _mm256_storeu_ps(r2 + 8, c21);
        _mm256_storeu_ps(r3, c30), _mm256_storeu_ps(r3 + 8, c31);
        _mm256_storeu_ps(r4, c40), _mm256_storeu_ps(r4 + 8, c41);
        _mm256_storeu_ps(r5, c50), _mm256_storeu_ps(r5 + 8, c51);
        return;
    }
    float tile[P256_MR][P256_NC];
    _mm256_storeu_ps(tile[0], c00), _mm256_storeu_ps(tile[0] + 8, c01);
    _mm256_storeu_ps(tile[1], c10), _mm256_storeu_ps(tile[1] + 8, c11);
    _mm256_storeu_ps(tile[2], c20), _mm256_storeu_ps(tile[2] + 8, c21);
    _mm256_storeu_ps(tile[3], c30), _mm256_storeu_ps(tile[3] + 8, c31);
    _mm256_storeu_ps(tile[4], c40), _mm256_storeu_ps(tile[4] + 8, c41);
    _mm256_storeu_ps(tile[5], c50), _mm256_storeu_ps(tile[5] + 8, c51);
    for (int m = 0; m < mv; m++) {
        float *yr = y + (size_t)m * ldy;
        p256_store(yr, _mm256_loadu_ps(tile[m]), nv, load_y);
        p256_store(yr + 8, _mm256_loadu_ps(tile[m] + 8), nv - 8, load_y);
    }
}

/* Transposes the 8 x 8 block of 32-bit elements in r[0..7] (row i -> column i). */
TARGET_AVX2 static inline __attribute__((always_inline)) void transpose8x8(__m256 r[8]) {
    __m256 a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        a[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 8; g += 4) {
        b[g + 0] = _mm256_shuffle_ps(a[g], a[g + 2], _MM_SHUFFLE(1, 0, 1, 0));
        b[g + 1] = _mm256_shuffle_ps(a[g], a[g + 2], _MM_SHUFFLE(3, 2, 3, 2));
        b[g + 2] = _mm256_shuffle_ps(a[g + 1], a[g + 3], _MM_SHUFFLE(1, 0, 1, 0));
        b[g + 3] = _mm256_shuffle_ps(a[g + 1], a[g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int q = 0; q < 4; q++) {
        r[q] = _mm256_permute2f128_ps(b[q], b[4 + q], 0x20);
        r[4 + q] = _mm256_permute2f128_ps(b[q], b[4 + q], 0x31);
    }
}

/* pack_w_f32 (below) with AVX2: 8 W rows x 8 k, each bf16 row piece widened to fp32 in a
 * register (a zero-extend and a shift), then transposed to [k][column]. Whole 8 x 8 blocks only;
 * the ragged edges (past nv, past kc) take the plain loop. */
TARGET_AVX2 static void pack_w_f32_256(void *wpv, const uint16_t *W, int K, int n0, int nv, int nc, int k0, int kc) {
    float *wp = wpv;
    int kc8 = kc & ~7, last = k0 + kc >= K;
    for (int c0 = 0; c0 < nc; c0 += 8) {
        if (c0 + 8 > nv) {
            for (int c = c0; c < c0 + 8; c++)
                for (int k = 0; k < kc; k++)
                    wp[(size_t)k * nc + c] = c < nv ? squad_bf16_to_f32(W[(size_t)(n0 + c) * K + k0 + k]) : 0.0f;
            continue;
        }
        const uint16_t *src = W + (size_t)(n0 + c0) * K + k0;
        for (int kb = 0; kb < kc8; kb += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) {
                /* W comes from DRAM once per call and this copy waits on it: ask for the same
                 * rows' next slice now, so it arrives while the microkernel runs on this one
                 * (once per 64-byte line). Tasks are claimed in descending panel order, so on
                 * the last slice the next panels' first slices are asked for instead. */
                if ((kb & 31) == 0) {
                    if (!last)
                        _mm_prefetch((const char *)(src + (size_t)i * K + kb + kc), _MM_HINT_T0);
                    else /* the first slices of the two panels below, the ones taken next */
                        for (int back = 1; back <= 2 && n0 >= back * nc; back++)
                            _mm_prefetch((const char *)(W + (size_t)(n0 - back * nc + c0 + i) * K + kb), _MM_HINT_T1);
                }
                __m128i h = _mm_loadu_si128((const __m128i *)(src + (size_t)i * K + kb));
                r[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
            }
            transpose8x8(r);
            for (int j = 0; j < 8; j++) _mm256_store_ps(wp + (size_t)(kb + j) * nc + c0, r[j]);
        }
        for (int k = kc8; k < kc; k++)
            for (int c = c0; c < c0 + 8; c++) wp[(size_t)k * nc + c] = squad_bf16_to_f32(W[(size_t)(n0 + c) * K + k0 + k]);
    }
}

/* pack_x_f32 (below) for the AVX2 tiles: each row of the tile read 8 k at a time (rounded to bf16
 * in the register when round: round to nearest even, as squad_f32_to_bf16 does for finite
 * values), written to the tile's column. */
TARGET_AVX2 static inline __m256 avx2_round_bf16(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    __m256i rounded = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), hi);
    /* a NaN stays a (quiet) NaN, as in squad_f32_to_bf16, instead of rounding into infinity */
    __m256i quiet = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x400000)), hi);
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan);
}

TARGET_AVX2 static void pack_x_f32_256(void *xpv, const float *x, int T, int K, int mr, int tile0, int tile1,
                                       int round) {
    float *xp = xpv;
    int K8 = K & ~7;
    for (int tile = tile0; tile < tile1; tile++) {
        float *dst = xp + (size_t)tile * K * mr;
        for (int m = 0; m < mr; m++) {
            int t = tile * mr + m;
            if (t >= T) {
                for (int k = 0; k < K; k++) dst[(size_t)k * mr + m] = 0.0f;
                continue;
            }
            const float *src = x + (size_t)t * K;
            for (int k = 0; k < K8; k += 8) {
                float v[8];
                __m256 r = _mm256_loadu_ps(src + k);
                _mm256_storeu_ps(v, round ? avx2_round_bf16(r) : r);
                for (int j = 0; j < 8; j++) dst[(size_t)(k + j) * mr + m] = v[j];
            }
            for (int k = K8; k < K; k++)
                dst[(size_t)k * mr + m] = round ? squad_bf16_to_f32(squad_f32_to_bf16(src[k])) : src[k];
        }
    }
}
#endif

/* ---------------------------------------------------------------- packing (portable C) */

/* Packs rows [t0, t1) of x into tiles of mr: fp32 [tile][K][mr] (values rounded to bf16 when
 * round), zero-padded past T. */
static void pack_x_f32(void *xpv, const float *x, int T, int K, int mr, int tile0, int tile1, int round) {
    float *xp = xpv;
    for (int tile = tile0; tile < tile1; tile++) {
        float *dst = xp + (size_t)tile * K * mr;
        for (int m = 0; m < mr; m++) {
            int t = tile * mr + m;
            if (t >= T) {
                for (int k = 0; k < K; k++) dst[(size_t)k * mr + m] = 0.0f;
                continue;
            }
            const float *src = x + (size_t)t * K;
            if (round)
                for (int k = 0; k < K; k++) dst[(size_t)k * mr + m] = squad_bf16_to_f32(squad_f32_to_bf16(src[k]));
            else
                for (int k = 0; k < K; k++) dst[(size_t)k * mr + m] = src[k];
        }
    }
}

/* W columns [n0, n0+nv) (rows of W), k in [k0, k0+kc): fp32 [kc][nc], zero-padded. */
static void pack_w_f32(void *wpv, const uint16_t *W, int K, int n0, int nv, int nc, int k0, int kc) {
    float *wp = wpv;
    for (int c = 0; c < nc; c++) {
        if (c >= nv) {
            for (int k = 0; k < kc; k++) wp[(size_t)k * nc + c] = 0.0f;
            continue;
        }
        const uint16_t *src = W + (size_t)(n0 + c) * K + k0;
        for (int k = 0; k < kc; k++) wp[(size_t)k * nc + c] = squad_bf16_to_f32(src[k]);
    }
}

/* The portable microkernel (the scalar level's packed path, and the plain form the vector ones
 * are written from): an C_MR x C_NC tile summed in an array the compiler may vectorise. */
#define C_MR 4
#define C_NC 16
static void kern_c(const void *xpv, const void *wpv, int kc, float *y, size_t ldy, int mv, int nv, int load_y) {
    const float *xp = xpv, *wp = wpv;
    float acc[C_MR][C_NC] = {{0}};
    for (int k = 0; k < kc; k++) {
        for (int m = 0; m < C_MR; m++)
            for (int c = 0; c < C_NC; c++) acc[m][c] += xp[m] * wp[c];
        xp += C_MR;
        wp += C_NC;
    }
    for (int m = 0; m < mv; m++)
        for (int c = 0; c < nv && c < C_NC; c++) y[(size_t)m * ldy + c] = load_y ? y[(size_t)m * ldy + c] + acc[m][c] : acc[m][c];
}

#if GEMM_X86
/* x as bf16 pairs: [tile][K2 = ceil(K/2)][8] 32-bit units, zero-padded past T and past an odd K.
 * With AVX-512: 8 rows x 32 floats -> 16 pairs each (vcvtne2ps2bf16,
 * round to nearest even like squad_f32_to_bf16), transposed to [pair][token]. */
TARGET_AVX512BF16 static void pack_x_bf16_512(void *xpv, const float *x, int T, int K, int mr, int tile0, int tile1,
                                              int round) {
    uint32_t *xp = xpv;
    int K2 = (K + 1) / 2;
    /* Two tiles per transpose: rows 0-7 of the block are tile `tile`, rows 8-15 tile `tile + 1`. */
    for (int tile = tile0; tile < tile1; tile += 2) {
        int two = tile + 1 < tile1;
        uint32_t *dst0 = xp + (size_t)tile * K2 * P512_MR, *dst1 = dst0 + (size_t)K2 * P512_MR;
        for (int pb = 0; pb < K2; pb += 16) {
            int pairs = K2 - pb < 16 ? K2 - pb : 16, e = K - 2 * pb;
            __mmask16 mlo = (__mmask16)(e >= 16 ? 0xffffu : (1u << e) - 1u);
            __mmask16 mhi = (__mmask16)(e >= 32 ? 0xffffu : e > 16 ? (1u << (e - 16)) - 1u : 0u);
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                int t = tile * P512_MR + i;
                if (t >= T || (i >= P512_MR && !two)) {
                    r[i] = _mm512_setzero_si512();
                    continue;
                }
                const float *src = x + (size_t)t * K + 2 * pb;
                __m512 lo = _mm512_maskz_loadu_ps(mlo, src), hi = _mm512_maskz_loadu_ps(mhi, src + 16);
                r[i] = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
            }
            transpose16x16(r);
            for (int j = 0; j < pairs; j++) {
                _mm256_storeu_si256((__m256i *)(dst0 + (size_t)(pb + j) * P512_MR), _mm512_castsi512_si256(r[j]));
                if (two)
                    _mm256_storeu_si256((__m256i *)(dst1 + (size_t)(pb + j) * P512_MR), _mm512_extracti64x4_epi64(r[j], 1));
            }
        }
    }
}

/* pack_x_f32 for 8-token tiles with AVX-512, two tiles per transpose (no rounding: the FAST case
 * without vdpbf16ps keeps the scalar packer). */
TARGET_AVX512 static void pack_x_f32_512(void *xpv, const float *x, int T, int K, int mr, int tile0, int tile1,
                                         int round) {
    if (round) {
        pack_x_f32(xpv, x, T, K, mr, tile0, tile1, round);
        return;
    }
    float *xp = xpv;
    for (int tile = tile0; tile < tile1; tile += 2) {
        int two = tile + 1 < tile1;
        float *dst0 = xp + (size_t)tile * K * P512_MR, *dst1 = dst0 + (size_t)K * P512_MR;
        for (int kb = 0; kb < K; kb += 16) {
            int cnt = K - kb < 16 ? K - kb : 16;
            __mmask16 mask = (__mmask16)(cnt >= 16 ? 0xffffu : (1u << cnt) - 1u);
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                int t = tile * P512_MR + i;
                r[i] = t < T && (i < P512_MR || two)
                           ? _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, x + (size_t)t * K + kb))
                           : _mm512_setzero_si512();
            }
            transpose16x16(r);
            for (int j = 0; j < cnt; j++) {
                _mm256_storeu_si256((__m256i *)(dst0 + (size_t)(kb + j) * P512_MR), _mm512_castsi512_si256(r[j]));
                if (two)
                    _mm256_storeu_si256((__m256i *)(dst1 + (size_t)(kb + j) * P512_MR), _mm512_extracti64x4_epi64(r[j], 1));
            }
        }
    }
}

/* One x row to bf16 for the DOT path. */
TARGET_AVX512BF16 static void x_to_bf16_512(uint16_t *dst, const float *src, int K) {
    int k = 0;
    for (; k + 32 <= K; k += 32)
        _mm512_storeu_si512(dst + k, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + k + 16), _mm512_loadu_ps(src + k)));
    for (; k < K; k++) dst[k] = squad_f32_to_bf16(src[k]);
}
#endif

/* ---------------------------------------------------------------- dispatch */

/* How x is prepared before the kernels run. */
typedef enum x_form {
    X_AS_IS = 0,       /* fp32 x used in place */
    X_ROUNDED_F32 = 1, /* fp32 copy holding bf16-rounded values (FAST without vdpbf16ps) */
    X_BF16 = 2         /* bf16 copy (FAST with vdpbf16ps) */
} x_form;

typedef struct gemm_kernels {
    dot_fn dot;
    x_form xf;   /* DOT: how x is prepared */
    kern_fn kern; /* PACKED microkernel, NULL: no packed path (scalar) */
    kern_fn kern_narrow[2]; /* for a panel's last 1 or 2 zmm of columns (AVX-512), else NULL */
    void (*pack_w)(void *wp, const uint16_t *W, int K, int n0, int nv, int nc, int k0, int kc);
    void (*pack_x)(void *xp, const float *x, int T, int K, int mr, int tile0, int tile1, int round);
    void (*x_to_bf16)(uint16_t *dst, const float *src, int K); /* DOT with X_BF16 */
    int mr, nc;   /* its tile */
    int kc;       /* k steps per packed W slice */
    int pairs;    /* 1: bf16 pair panels, 0: fp32 panels */
} gemm_kernels;

static gemm_kernels gemm_select(cpu_isa isa, cpu_gemm_precision prec) {
    gemm_kernels k;
    memset(&k, 0, sizeof k);
    k.dot = dot_scalar;
    k.xf = prec == CPU_GEMM_FAST ? X_ROUNDED_F32 : X_AS_IS;
    /* the portable level: plain packers and kern_c */
    k.kern = kern_c;
    k.pack_w = pack_w_f32;
    k.pack_x = pack_x_f32;
    k.mr = C_MR;
    k.nc = C_NC;
    k.kc = P256_KC;
#if GEMM_X86
    switch (isa) {
    case CPU_ISA_AVX512_BF16:
        if (prec == CPU_GEMM_FAST) {
            k.dot = dot_avx512bf16;
            k.xf = X_BF16;
            k.kern = kern_512_bf16_3;
            k.kern_narrow[0] = kern_512_bf16_1;
            k.kern_narrow[1] = kern_512_bf16_2;
            k.pack_w = pack_w_bf16_512;
            k.pack_x = pack_x_bf16_512;
            k.x_to_bf16 = x_to_bf16_512;
            k.mr = P512_MR;
            k.nc = P512_NC;
            k.kc = PACK_KC;
            k.pairs = 1;
            break;
        }
        /* EXACT uses the fp32 kernels */
        /* fall through */
    case CPU_ISA_AVX512:
        k.dot = dot_avx512;
        k.kern = kern_512_f32_3;
        k.kern_narrow[0] = kern_512_f32_1;
        k.kern_narrow[1] = kern_512_f32_2;
        k.pack_w = pack_w_f32_512;
        k.pack_x = pack_x_f32_512;
        k.mr = P512_MR;
        k.nc = P512_NC;
        k.kc = PACK_KC;
        break;
    case CPU_ISA_AVX2:
        k.dot = dot_avx2;
        k.kern = kern_256_f32;
        k.pack_w = pack_w_f32_256;
        k.pack_x = pack_x_f32_256;
        k.mr = P256_MR;
        k.nc = P256_NC;
        k.kc = P256_KC;
        break;
    default: break; /* the portable level set above */
    }
#else
    (void)isa;
#endif
    return k;
}

/* ---------------------------------------------------------------- the driver */

typedef struct gemm_job {
    float *y;
    const float *x;
    const uint16_t *W;
    int T, N, K, accumulate;
    cpu_gemm_precision prec;
    gemm_kernels kern;
    /* the task grid: n_blocks x t_blocks */
    int n_blocks, t_blocks;
    int n_block_rows, t_block_rows;
    /* DOT: x as the kernels read it */
    const void *xp;
    void *xbuf;
    int prep_rows_per_task;
    /* PACKED */
    void *xpack;    /* [tiles][Kp][mr] */
    char *wpack;    /* per thread: wpack_stride bytes */
    size_t wpack_stride;
    int tiles, tiles_per_task;
    int Kp; /* k steps the kernel makes over all of K: K (fp32) or ceil(K/2) (pairs) */
} gemm_job;

static int ceil_div(int a, int b) { return (a + b - 1) / b; }
static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static void gemm_prep_task(void *ctx, int task, int n_tasks) {
    gemm_job *j = ctx;
    int t0 = task * j->prep_rows_per_task, t1 = t0 + j->prep_rows_per_task;
    if (t1 > j->T) t1 = j->T;
    size_t K = (size_t)j->K;
    for (int t = t0; t < t1; t++) {
        const float *src = j->x + (size_t)t * K;
        if (j->kern.xf == X_BF16) {
            j->kern.x_to_bf16((uint16_t *)j->xbuf + (size_t)t * K, src, (int)K);
        } else {
            float *dst = (float *)j->xbuf + (size_t)t * K;
            for (size_t k = 0; k < K; k++) dst[k] = squad_bf16_to_f32(squad_f32_to_bf16(src[k]));
        }
    }
}

static void gemm_dot_task(void *ctx, int task, int n_tasks) {
    gemm_job *j = ctx;
    int nb = task % j->n_blocks, tb = task / j->n_blocks;
    int n0 = nb * j->n_block_rows, n1 = n0 + j->n_block_rows;
    int t0 = tb * j->t_block_rows, t1 = t0 + j->t_block_rows;
    if (n1 > j->N) n1 = j->N;
    if (t1 > j->T) t1 = j->T;
    size_t elt = j->kern.xf == X_BF16 ? sizeof(uint16_t) : sizeof(float);
    float out[DOT_ROWS];
    for (int n = n0; n < n1; n += DOT_ROWS) {
        int rows = n1 - n < DOT_ROWS ? n1 - n : DOT_ROWS;
        const uint16_t *w = j->W + (size_t)n * j->K;
        for (int t = t0; t < t1; t++) {
            const char *xr = (const char *)j->xp + (size_t)t * j->K * elt;
            j->kern.dot(xr, w, (size_t)j->K, rows, j->K, out);
            float *yr = j->y + (size_t)t * j->N + n;
            if (j->accumulate)
                for (int r = 0; r < rows; r++) yr[r] += out[r];
            else
                for (int r = 0; r < rows; r++) yr[r] = out[r];
        }
    }
}

static void gemm_pack_x_task(void *ctx, int task, int n_tasks) {
    gemm_job *j = ctx;
    int tile0 = task * j->tiles_per_task, tile1 = tile0 + j->tiles_per_task;
    if (tile1 > j->tiles) tile1 = j->tiles;
    j->kern.pack_x(j->xpack, j->x, j->T, j->K, j->kern.mr, tile0, tile1, j->prec == CPU_GEMM_FAST);
}

static void gemm_packed_task(void *ctx, int task, int n_tasks, int thread) {
    gemm_job *j = ctx;
    const gemm_kernels *kn = &j->kern;
    int nb = task % j->n_blocks, tb = task / j->n_blocks;
    int n0 = nb * kn->nc, nv = j->N - n0 < kn->nc ? j->N - n0 : kn->nc;
    int tile0 = tb * j->t_block_rows, tile1 = tile0 + j->t_block_rows; /* t_block_rows counts tiles here */
    if (tile1 > j->tiles) tile1 = j->tiles;
    void *wp = j->wpack + (size_t)thread * j->wpack_stride;
    /* A narrow last panel takes the kernel that computes only its columns' zmm. */
    kern_fn kern = kn->kern;
    if (kn->kern_narrow[0] && nv <= 16) kern = kn->kern_narrow[0];
    else if (kn->kern_narrow[1] && nv <= 32) kern = kn->kern_narrow[1];
    size_t unit = 4; /* bytes per k step per column / per token: fp32 or a bf16 pair */
    for (int k0 = 0; k0 < j->Kp; k0 += kn->kc) {
        int kc = j->Kp - k0 < kn->kc ? j->Kp - k0 : kn->kc;
        kn->pack_w(wp, j->W, j->K, n0, nv, kn->nc, k0, kc);
        int load_y = j->accumulate || k0 > 0;
        for (int tile = tile0; tile < tile1; tile++) {
            int t = tile * kn->mr;
            int mv = j->T - t < kn->mr ? j->T - t : kn->mr;
            const char *xt = (const char *)j->xpack + ((size_t)tile * j->Kp + k0) * kn->mr * unit;
            kern(xt, wp, kc, j->y + (size_t)t * j->N + n0, (size_t)j->N, mv, nv, load_y);
        }
    }
}

/* The no-scratch path: scalar loops, x rounded on the fly for FAST. Slow; only when memory ran out. */
static void gemm_nomem(float *y, const float *x, const uint16_t *W, int T, int N, int K, int accumulate,
                       cpu_gemm_precision prec) {
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)t * K;
            const uint16_t *wr = W + (size_t)n * K;
            double s = 0.0; /* double: a long chain of fp32 sums would lose accuracy */
            for (int k = 0; k < K; k++) {
                float xv = prec == CPU_GEMM_FAST ? squad_bf16_to_f32(squad_f32_to_bf16(xr[k])) : xr[k];
                s += (double)xv * squad_bf16_to_f32(wr[k]);
            }
            float *o = y + (size_t)t * N + n;
            *o = accumulate ? *o + (float)s : (float)s;
        }
}

/* Scratch for a call, every algorithm and ISA covered. PACKED: x of one token block in tiles of
 * up to P512_MR rows (fp32, K rounded up to even) plus one W slice per thread. DOT: x as bf16 or
 * rounded fp32. */
static size_t gemm_scratch_bytes(int T, int K, int threads, cpu_gemm_algo algo) {
    if (algo == CPU_GEMM_ALGO_DOT) return (size_t)T * (size_t)K * sizeof(float) + 64;
    size_t mr = P512_MR > P256_MR ? P512_MR : P256_MR;
    size_t tb = T < PACK_TB ? (size_t)T : PACK_TB;
    size_t tiles = (tb + mr - 1) / mr + 1;
    size_t xbytes = align64(tiles * mr * ((size_t)K + 1) * sizeof(float));
    size_t wbytes = align64((size_t)PACK_KC * P512_NC * sizeof(float));
    return xbytes + (size_t)threads * wbytes + 64;
}

int cpu_gemm_reserve(cpu_pool *pool, int max_T, int max_K, squad_err *err) {
    if (max_T <= 0 || max_K <= 0) return 0;
    size_t packed = gemm_scratch_bytes(max_T, max_K, cpu_pool_threads(pool), CPU_GEMM_ALGO_PACKED);
    size_t dot = gemm_scratch_bytes(max_T < DOT_MAX_T ? max_T : DOT_MAX_T, max_K, 1, CPU_GEMM_ALGO_DOT);
    if (cpu_pool_scratch(pool, packed > dot ? packed : dot, err)) return 0;
    return squad_fail_context(err, "GEMM scratch: ");
}


static void gemm_run_dot(cpu_pool *pool, gemm_job *j, void *scratch) {
    int threads = cpu_pool_threads(pool), T = j->T, N = j->N;
    j->xp = j->x;
    if (j->kern.xf != X_AS_IS) {
        j->xbuf = scratch;
        j->prep_rows_per_task = ceil_div(T, threads * TASKS_PER_THREAD);
        cpu_pool_run(pool, gemm_prep_task, j, ceil_div(T, j->prep_rows_per_task));
        j->xp = j->xbuf;
    }
    /* Task grid: blocks of W rows; when they are too few to keep every thread busy, T is split too. */
    j->n_block_rows = DOT_TASK_ROWS;
    int want = threads * TASKS_PER_THREAD;
    if (ceil_div(N, j->n_block_rows) < want) j->n_block_rows = ceil_div(ceil_div(N, want), DOT_ROWS) * DOT_ROWS;
    j->n_blocks = ceil_div(N, j->n_block_rows);
    j->t_blocks = 1;
    if (j->n_blocks < want) j->t_blocks = ceil_div(want, j->n_blocks);
    if (j->t_blocks > T) j->t_blocks = T;
    j->t_block_rows = ceil_div(T, j->t_blocks);
    j->t_blocks = ceil_div(T, j->t_block_rows);
    cpu_pool_run(pool, gemm_dot_task, j, j->n_blocks * j->t_blocks);
}

/* One block of at most PACK_TB tokens: pack its x, then every W panel against it. */
static void gemm_run_packed_block(cpu_pool *pool, gemm_job *j, void *scratch) {
    int threads = cpu_pool_threads(pool);
    const gemm_kernels *kn = &j->kern;
    j->Kp = kn->pairs ? (j->K + 1) / 2 : j->K;
    j->tiles = ceil_div(j->T, kn->mr);
    size_t xbytes = align64((size_t)j->tiles * kn->mr * (size_t)j->Kp * 4);
    j->xpack = scratch;
    j->wpack = (char *)scratch + xbytes;
    j->wpack_stride = align64((size_t)kn->kc * kn->nc * 4);

    j->tiles_per_task = ceil_div(j->tiles, threads * TASKS_PER_THREAD);
    j->tiles_per_task += j->tiles_per_task & 1; /* the AVX-512 packers transpose two tiles at once */
    cpu_pool_run(pool, gemm_pack_x_task, j, ceil_div(j->tiles, j->tiles_per_task));

    /* Tasks: one W panel each; when panels are too few for the threads, the tiles are split too. */
    j->n_blocks = ceil_div(j->N, kn->nc);
    int want = threads * TASKS_PER_THREAD;
    j->t_blocks = j->n_blocks >= want ? 1 : ceil_div(want, j->n_blocks);
    if (j->t_blocks > j->tiles) j->t_blocks = j->tiles;
    j->t_block_rows = ceil_div(j->tiles, j->t_blocks);
    j->t_blocks = ceil_div(j->tiles, j->t_block_rows);
    cpu_pool_run_indexed(pool, gemm_packed_task, j, j->n_blocks * j->t_blocks);
}

/* Long inputs go in blocks of PACK_TB tokens, so packed x stays within L3 (and the scratch small)
 * at the price of packing W once per block. */
static void gemm_run_packed(cpu_pool *pool, gemm_job *j, void *scratch) {
    gemm_job whole = *j;
    size_t row_bytes = (size_t)(j->kern.pairs ? (j->K + 1) / 2 : j->K) * 4;
    size_t fit = PACK_X_BLOCK_BYTES / row_bytes;
    int tb = fit > PACK_TB ? PACK_TB : fit < PACK_TB_MIN ? PACK_TB_MIN : (int)fit & ~7;
    for (int t0 = 0; t0 < whole.T; t0 += tb) {
        *j = whole;
        j->T = whole.T - t0 < tb ? whole.T - t0 : tb;
        j->x = whole.x + (size_t)t0 * whole.K;
        j->y = whole.y + (size_t)t0 * whole.N;
        gemm_run_packed_block(pool, j, scratch);
    }
}

void cpu_gemm_bf16_algo(cpu_pool *pool, float *y, const float *x, const uint16_t *W, int T, int N, int K,
                        int accumulate, cpu_gemm_precision prec, cpu_gemm_algo algo) {
    if (T <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate) memset(y, 0, (size_t)T * (size_t)N * sizeof(float));
        return;
    }
    gemm_job j;
    memset(&j, 0, sizeof j);
    j.y = y;
    j.x = x;
    j.W = W;
    j.T = T;
    j.N = N;
    j.K = K;
    j.accumulate = accumulate;
    j.prec = prec;
    j.kern = gemm_select(cpu_pool_isa(pool), prec);
    if (algo == CPU_GEMM_ALGO_AUTO) algo = T <= DOT_MAX_T ? CPU_GEMM_ALGO_DOT : CPU_GEMM_ALGO_PACKED;
    if (algo == CPU_GEMM_ALGO_PACKED && !j.kern.kern) algo = CPU_GEMM_ALGO_DOT;
    if (algo == CPU_GEMM_ALGO_NOMEM) {
        gemm_nomem(y, x, W, T, N, K, accumulate, prec);
        return;
    }
    void *scratch = NULL;
    if (algo == CPU_GEMM_ALGO_PACKED || j.kern.xf != X_AS_IS) {
        squad_err e;
        scratch = cpu_pool_scratch(pool, gemm_scratch_bytes(T, K, cpu_pool_threads(pool), algo), &e);
        if (!scratch) {
            gemm_nomem(y, x, W, T, N, K, accumulate, prec);
            return;
        }
    }
    if (algo == CPU_GEMM_ALGO_PACKED)
        gemm_run_packed(pool, &j, scratch);
    else
        gemm_run_dot(pool, &j, scratch);
}

void cpu_gemm_bf16(cpu_pool *pool, float *y, const float *x, const uint16_t *W, int T, int N, int K, int accumulate,
                   cpu_gemm_precision prec) {
    cpu_gemm_bf16_algo(pool, y, x, W, T, N, K, accumulate, prec, CPU_GEMM_ALGO_AUTO);
}
