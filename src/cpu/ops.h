/*
 * ops.h — the CPU backend's operations on fp32 activations, one function per step of
 * docs/design.md section 4. Each is written as the plain loop a reader can check against the math; the ones that
 * cost (the delta rule, attention) are organised so the compiler vectorises the inner loop over a
 * contiguous dimension. tests/test_ops.c checks each against a direct transcription of the formula
 * (and the chunked delta rule against the per-token recurrence).
 *
 * Layouts: token-major, [T][features]; heads are contiguous blocks of a token's features.
 */
#ifndef SQUAD_CPU_OPS_H
#define SQUAD_CPU_OPS_H

#include <stdint.h>

#include "cpu/pool.h"

/* The largest GDN value-head dimension the per-token rule's stack buffer holds. */
#define OP_MAX_HEAD_DIM 1024

/* y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * (1 + w)   (zero-centred weight), rows of n. */
void op_rmsnorm_zc(float *y, const float *x, const float *w, int T, int n, float eps);

/* Per head: x[t][h] = rmsnorm_zc(x[t][h]) over hd values, in place; stride between tokens. */
void op_head_rmsnorm_zc(float *x, const float *w, int T, int n_heads, int hd, int token_stride, float eps);

/* Partial rotary embedding, in place on n_heads heads of hd (first rd dims rotate-half), token t at
 * position pos0 + t; inv_freq [rd/2]. token_stride / head_stride in floats. */
void op_rope(float *x, const float *inv_freq, int T, int pos0, int n_heads, int head_stride, int token_stride,
             int rd);
/* The same for one token at an M-RoPE position (t, h, w): frequency i turns by pos[axis[i]] *
 * inv_freq[i] (op_mrope_axes). With the three positions equal it computes exactly what op_rope does
 * at that position. */
void op_rope_mrope(float *x, const float *inv_freq, const unsigned char *axis, const int32_t pos[3], int n_heads,
                   int head_stride, int rd);
/* The axis (0 t, 1 h, 2 w) of each of the rd / 2 frequencies, as transformers assigns them:
 * interleaved (Qwen3.5's apply_interleaved_mrope: frequency j is h when j % 3 == 1 and j < 3 section[1],
 * w when j % 3 == 2 and j < 3 section[2], else t), or in sections one after the other. 0 when the
 * sections sum to rd / 2, else -1 (axis all t). */
int op_mrope_axes(unsigned char *axis, int rd, const int section[3], int interleaved);
/* inv_freq[i] = theta^(-2i/rd), computed in fp32 as the reference does. */
void op_rope_inv_freq(float *inv_freq, double theta, int rd);

/* Causal depthwise conv1d + SiLU over [saved K-1 inputs | T inputs]: y[t][c] = silu(sum_k
 * w[c][k] * in[t + k - (K-1)][c]); then state <- the last K-1 inputs. x [T][C], state [K-1][C].
 * The weights come transposed, w_kc [K][C] (op_conv_weights_kc), so the inner loop is contiguous. */
void op_conv_silu(float *y, const float *x, float *state, const float *w_kc, int T, int C, int K);
/* w_kc [K][C] from the checkpoint's w_ck [C][K]. */
void op_conv_weights_kc(float *w_kc, const float *w_ck, int C, int K);

/* q, k L2-normalised per head (eps 1e-6), q scaled by dk^-0.5; in place over the conv output. */
void op_qk_l2norm(float *qkv, int T, int C, int nk, int dk);

/* beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias); [T][nv]. */
void op_gdn_gates(float *g, float *beta, const float *a, const float *b, const float *A_log, const float *dt_bias,
                  int T, int nv);

/* The gated delta rule, per value head hv (q/k head hv / (nv / nk)), token by token — the oracle:
 *   S = exp(g_t) S;  S += beta_t k_t (v_t - S^T k_t)^T;  o_t = S^T q_t
 * qkv [T][C] with q at 0, k at nk dk, v at 2 nk dk; S [nv][dk][dv] updated; o [T][nv dv].
 * Heads [h0, h1) only (callers split heads across threads). */
void op_delta_rule(float *o, float *S, const float *qkv, const float *g, const float *beta, int T, int C, int nk,
                   int nv, int dk, int dv, int h0, int h1);
/* op_delta_rule at a given level (tests): CPU_ISA_AVX2 takes S in column blocks held in L1 (dv a
 * multiple of 32), every other level the portable loops; op_delta_rule uses the CPU's level lowered
 * by SQUAD_CPU_ISA. */
void op_delta_rule_isa(cpu_isa isa, float *o, float *S, const float *qkv, const float *g, const float *beta, int T,
                       int C, int nk, int nv, int dk, int dv, int h0, int h1);

/* The same computed in chunks of `chunk` tokens with the WY / UT representation (Yang et al.,
 * Gated Delta Networks): per chunk, intra-chunk terms by small triangular solves, one state update. */
void op_delta_rule_chunked(float *o, float *S, const float *qkv, const float *g, const float *beta, int T, int C,
                           int nk, int nv, int dk, int dv, int h0, int h1, int chunk);

/* o[t][h] = rmsnorm(o[t][h]) * w * silu(z[t][h]) per value head of dv (plain weight). */
void op_gated_rmsnorm(float *o, const float *z, const float *w, int T, int nv, int dv, float eps);

/* Causal attention of T queries at positions pos0..pos0+T-1 over keys [0, pos0 + t]:
 * q [T][q_stride] (head j at j * q_head_stride), K / V [pos][nkv hd], out [T][nh hd]. Query heads
 * [j0, j1) only. scale = hd^-0.5. */
void op_attention(float *out, const float *q, int q_stride, int q_head_stride, const float *K, const float *V,
                  int T, int pos0, int nh, int nkv, int hd, int j0, int j1);

/* Keys per tile of op_attention_group; tiles start at absolute multiples of it, so a query's
 * arithmetic does not depend on how its row was split into chunks. */
#define OP_ATTN_KEY_TILE 64

/* The same attention, flash-style, for the query heads of one kv head (j / (nh / nkv) == kvh) and
 * tokens [t0, t1): keys in tiles of OP_ATTN_KEY_TILE with an online softmax, so each K / V tile is
 * read once for the whole group of queries while it sits in cache. scratch holds
 * op_attention_scratch_floats(...) floats. */
void op_attention_group(float *out, const float *q, int q_stride, int q_head_stride, const float *K, const float *V,
                        int pos0, int nh, int nkv, int hd, int kvh, int t0, int t1, float *scratch);
long op_attention_scratch_floats(int nh, int nkv, int hd, int max_tokens);
/* K / V of one attention layer in two pieces: positions [0, split) are rows of K0 / V0 (a restored
 * checkpoint read in place), positions from split on rows of K1 / V1 counted from split (the
 * slot's own K / V). split is a multiple of OP_ATTN_KEY_TILE, so every key tile lies in one piece
 * and a query's arithmetic is the same as over one contiguous K / V. Rows are nkv hd floats. */
typedef struct op_kv {
    const float *K0, *V0;
    int split;
    const float *K1, *V1;
} op_kv;
static inline const float *op_kv_keys(const op_kv *kv, int pos, int row) {
    return pos < kv->split ? kv->K0 + (long)pos * row : kv->K1 + (long)(pos - kv->split) * row;
}
static inline const float *op_kv_values(const op_kv *kv, int pos, int row) {
    return pos < kv->split ? kv->V0 + (long)pos * row : kv->V1 + (long)(pos - kv->split) * row;
}
/* op_attention_group over K / V in two pieces (the same results as over their concatenation). */
void op_attention_group_kv(float *out, const float *q, int q_stride, int q_head_stride, const op_kv *kv, int pos0,
                           int nh, int nkv, int hd, int kvh, int t0, int t1, float *scratch);
void op_attention_group_kv_isa(cpu_isa isa, float *out, const float *q, int q_stride, int q_head_stride,
                               const op_kv *kv, int pos0, int nh, int nkv, int hd, int kvh, int t0, int t1,
                               float *scratch);
/* op_attention_group at a given level (tests): CPU_ISA_AVX2 takes the register-blocked kernels
 * (hd a multiple of 16, <= 512), every other level the portable loops. op_attention_group uses
 * the CPU's level lowered by SQUAD_CPU_ISA. */
void op_attention_group_isa(cpu_isa isa, float *out, const float *q, int q_stride, int q_head_stride, const float *K,
                            const float *V, int pos0, int nh, int nkv, int hd, int kvh, int t0, int t1,
                            float *scratch);

/* out[t][j] *= sigmoid(gate[t][j]) for the attention output gate; gate head j at j * gate_head_stride
 * within a token row of gate_stride. */
void op_sigmoid_gate(float *out, const float *gate, int T, int nh, int hd, int gate_stride, int gate_head_stride);

/* a[i] = silu(a[i]) * b[i] */
void op_silu_mul(float *a, const float *b, long n);

/* x[i] += y[i] */
void op_add(float *x, const float *y, long n);

/* Letter probabilities at one slot: rmsnorm_zc(h) . E[letters[i]] for i < nopts, softmax (the rest 0).
 * E bf16 [V][H]. */
void op_letter_probs(float *probs, const float *h, const float *norm_w, float eps, const uint16_t *E, int H,
                     const int32_t *letters, int n_letters, int nopts);

#endif /* SQUAD_CPU_OPS_H */
