/* The CPU backend's LoRA low-rank term over a block of tokens: y[t] += s B (A x[t]).
 *
 * squad_lora_apply_ref (src/specialists.c) is the plain reference, one token at a time with one
 * dependent double chain per rank row and per output. This is the fast form of the same sums
 * (src/cpu/lora.c says how), within rounding of the reference, and each token's result depends
 * on its own x only, never on how many tokens ride along in the block. */
#ifndef SQUAD_CPU_LORA_H
#define SQUAD_CPU_LORA_H

#include "../specialists.h"
#include "pool.h"

/* x: n rows of p->in floats (row t at x + t * p->in); y: n rows of p->out floats, added to.
 * isa picks the AVX2 kernels (CPU_ISA_AVX2 and above) or the plain C loops; both give the same
 * u = A x bit for bit. An unadapted projection (A NULL) or a rank above SQUAD_LORA_MAX_RANK
 * leaves y alone, as the reference does. */
void cpu_lora_apply(cpu_isa isa, const squad_lora_proj *p, float scale, const float *x, float *y, int n);

#endif
