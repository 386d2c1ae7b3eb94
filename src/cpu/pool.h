/*
 * pool.h — the CPU backend's thread pool: a fixed set of worker threads and a parallel-for.
 *
 * The CPU forward calls cpu_pool_run thousands of times per row (every GEMM, every per-head loop),
 * so a call must cost microseconds, not a thread creation: the workers are made once, spin briefly
 * on a generation counter after each job (the next job usually comes within microseconds) and only
 * then sleep on a condition variable. The calling thread takes tasks too, so a pool of n threads
 * has n - 1 workers. Tasks are handed out dynamically (an atomic counter), which balances uneven
 * tasks and cores that are busy with something else.
 *
 * A pool also owns a scratch buffer (cpu_pool_scratch) that kernels such as the GEMM use for packed
 * operands, so a hot call allocates nothing. One caller at a time: a pool is not re-entrant (a task
 * must not call cpu_pool_run on its own pool).
 */
#ifndef SQUAD_CPU_POOL_H
#define SQUAD_CPU_POOL_H

#include <stddef.h>

#include "util.h"

typedef struct cpu_pool cpu_pool;

/* The instruction sets the CPU kernels are specialised for, in increasing order. Detected once per
 * pool (cpu_pool_isa) so every kernel of the backend dispatches the same way. */
typedef enum cpu_isa {
    CPU_ISA_SCALAR = 0,
    CPU_ISA_AVX2 = 1,        /* AVX2 + FMA */
    CPU_ISA_AVX512 = 2,      /* AVX-512F/BW/VL */
    CPU_ISA_AVX512_BF16 = 3  /* ... + AVX512_BF16 (vdpbf16ps) */
} cpu_isa;

/* The best cpu_isa this CPU supports. */
cpu_isa cpu_detect_isa(void);
const char *cpu_isa_name(cpu_isa isa);
/* cpu_isa_name's names (and "avx512f", "avx512bf16") back to the level; 0, or -1 when unknown. */
int cpu_isa_parse(const char *name, cpu_isa *isa);

/* The environment variable that lowers every new pool's level (tests, benchmarks, a user working
 * round a CPU's fault): SQUAD_CPU_ISA=scalar|avx2|avx512|avx512-bf16. A level above what the CPU
 * has is ignored; an unknown name makes cpu_pool_new fail with SQUAD_E_INVALID. */
#define CPU_ISA_ENV "SQUAD_CPU_ISA"
/* cpu_detect_isa() lowered by SQUAD_CPU_ISA: what a new pool uses. 0, or SQUAD_E_INVALID for an
 * unknown name (then *isa is the detected level). */
int cpu_effective_isa(cpu_isa *isa, squad_err *err);

/* threads 0: the number of cores this process may run on. NULL with err filled on failure. */
cpu_pool *cpu_pool_new(int threads, squad_err *err);
void cpu_pool_free(cpu_pool *p);
/* Threads that run tasks, the caller included (>= 1). */
int cpu_pool_threads(const cpu_pool *p);
/* The ISA the pool's kernels use: cpu_detect_isa() at creation (lowered by SQUAD_CPU_ISA), lowered
 * by cpu_pool_set_isa. */
cpu_isa cpu_pool_isa(const cpu_pool *p);
/* Forces a lower ISA (tests, benchmarks); a level above what the CPU has is clamped to it. */
void cpu_pool_set_isa(cpu_pool *p, cpu_isa isa);

/* Runs fn(ctx, task, n_tasks) for task = 0 .. n_tasks-1 across the threads; returns when all are
 * done. Tasks may run in any order and concurrently. n_tasks <= 0 does nothing. */
void cpu_pool_run(cpu_pool *p, void (*fn)(void *ctx, int task, int n_tasks), void *ctx, int n_tasks);

/* As cpu_pool_run, also passing the index (0 .. threads-1) of the thread running the task, so a task
 * can use per-thread scratch space. Two tasks on one thread never overlap in time. */
void cpu_pool_run_indexed(cpu_pool *p, void (*fn)(void *ctx, int task, int n_tasks, int thread), void *ctx,
                          int n_tasks);

/* A 64-byte aligned scratch buffer of at least bytes, owned by the pool and valid until the next
 * cpu_pool_scratch call or cpu_pool_free. Its contents are not kept when it grows. NULL with err
 * filled when it cannot grow (the old buffer is then kept). */
void *cpu_pool_scratch(cpu_pool *p, size_t bytes, squad_err *err);

/* The number of CPUs this process may run on (sched_getaffinity; sysconf as the fallback). */
int cpu_available_cores(void);

#endif /* SQUAD_CPU_POOL_H */
