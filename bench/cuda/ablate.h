/*
 * ablate.h — the ablation timing of the CUDA backend, for bench/bench_gpu.c --ablate: what each
 * kernel group costs inside the real chunk graph. Built from bench/cuda into benchcuda, which
 * only the benchmarks (and tests) link; libsquad does not carry it.
 */
#ifndef SQUAD_CUDA_ABLATE_H
#define SQUAD_CUDA_ABLATE_H

#ifdef __cplusplus
extern "C" {
#endif

#include "backend.h"
#include "cuda/backend_cuda.h"

/* Captures the forward of a chunk of len tokens from position start with only the kernel groups in
 * parts (SQUAD_CUDA_PART_*; pseudo-random token ids, no slots), replays it reps times and gives the
 * medians of one replay's times. What each group costs inside the real graph is the time with it
 * minus the time without it (per-kernel profiles serialize and flush, which small chunks feel
 * most). It computes on whatever the buffers hold: the working state (GDN states, the K / V of
 * [start, start + len)) is garbage afterwards, so reset before the next forward. */
typedef struct squad_cuda_timing {
    double gpu_ms;    /* between events recorded before and after the replay */
    double wall_ms;   /* on the host, from before the first event to the replay's end */
    double launch_ms; /* on the host, inside cudaGraphLaunch */
    /* with parts == SQUAD_CUDA_PART_ALL only (else 0): the engine's own graph of the chunk's bucket
     * (the one forward replays) timed the same way, and on the host with the chunk's parameters
     * uploaded before each replay and a stream synchronize after it (forward's steps, no slots) */
    double engine_gpu_ms, engine_wall_ms, params_wall_ms;
} squad_cuda_timing;
int squad_cuda_time_parts(squad_backend *be, int start, int len, unsigned parts, int reps, squad_cuda_timing *out,
                          squad_err *err);
/* The same for a batch: nrows chunks [start, start + len) on sequence slots 0 .. nrows - 1 in one
 * replay (the rows bucket of nrows), with `shared` every row reading the K / V below start in place
 * from row 0's (hits on one cached state), else each from its own (hits on nrows states). The slots'
 * state is garbage afterwards: reset them before their next forward. */
int squad_cuda_time_batch_parts(squad_backend *be, int nrows, int shared, int start, int len, unsigned parts,
                                int reps, squad_cuda_timing *out, squad_err *err);
/* The engine's graph of the last forward's shape (nrows chunks [start, start + len), which that forward
 * ran as one replay) replayed on the parameters it left on the device: its own rows' data (restored
 * blobs read in place, answer slots), where squad_cuda_time_batch_parts replays synthetic rows. gpu_ms,
 * wall_ms and launch_ms as there (the engine_* and params_* figures stay 0). The replays rewrite what
 * the forward wrote (the rows' states and K / V from the same inputs). */
int squad_cuda_time_last_forward(squad_backend *be, int nrows, int start, int len, int reps, squad_cuda_timing *out,
                                 squad_err *err);

#ifdef __cplusplus
}
#endif
#endif
