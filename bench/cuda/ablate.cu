/*
 * ablate.cu — squad_cuda_time_parts and squad_cuda_time_batch_parts (ablate.h): graph replays of a
 * chunk, or of a batch of chunks, with kernel groups left out, timed on the GPU and on the host. In
 * benchcuda (bench/cuda), not libsquad: the product never times itself this way, but the
 * kernel work needs the figures.
 *
 * Design: backend_cuda.cu exposes just enough (cu_backend_capture_parts, cuda_internal.cuh: the parameters of a synthetic
 * chunk, a graph of the chosen groups, the engine's own graph of the same shape) and everything
 * about timing lives here: warm-up replays, then `reps` timed ones, medians of each measure.
 */
#include "cuda/cuda_internal.cuh"

#include "ablate.h"

#include <stdlib.h>

#define ABLATE_WARMUPS 2
#define ABLATE_MAX_REPS 10000

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static float median_float(float *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_float);
    return t[n / 2];
}

/* Median times of `reps` replays of ex (after the warm-ups): gpu between events around the replay,
 * wall on the host from before the first event to the end, launch inside cudaGraphLaunch. With
 * `params`, each replay is preceded by the parameters' upload and waited for by a stream
 * synchronize, as forward does (wall only). buf holds 3 * reps floats. */
static cudaError_t time_replays(squad_backend *be, const cu_parts_graph *a, cudaGraphExec_t ex, int params, int reps,
                                float *buf, squad_cuda_timing *out) {
    float *t = buf, *tw = buf + reps, *tl = tw + reps;
    cudaEvent_t e0 = NULL, e1 = NULL;
    squad_err err = {0, {0}};
    cudaError_t e = cudaEventCreate(&e0);
    if (e == cudaSuccess) e = cudaEventCreate(&e1);
    for (int i = 0; i < ABLATE_WARMUPS && e == cudaSuccess; i++) e = cudaGraphLaunch(ex, a->st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(a->st);
    for (int i = 0; i < reps && e == cudaSuccess; i++) {
        const double h0 = cu_now_seconds();
        if (params && cu_backend_upload_params(be, &err)) e = cudaErrorUnknown;
        if (e == cudaSuccess) e = cudaEventRecord(e0, a->st);
        const double h1 = cu_now_seconds();
        if (e == cudaSuccess) e = cudaGraphLaunch(ex, a->st);
        const double h2 = cu_now_seconds();
        if (e == cudaSuccess) e = cudaEventRecord(e1, a->st);
        if (e == cudaSuccess) e = params ? cudaStreamSynchronize(a->st) : cudaEventSynchronize(e1);
        const double h3 = cu_now_seconds();
        if (e == cudaSuccess) e = cudaEventElapsedTime(&t[i], e0, e1);
        tw[i] = (float)((h3 - h0) * 1e3);
        tl[i] = (float)((h2 - h1) * 1e3);
    }
    if (e == cudaSuccess) {
        out->gpu_ms = median_float(t, reps);
        out->wall_ms = median_float(tw, reps);
        out->launch_ms = median_float(tl, reps);
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return e;
}

static int check_reps(int reps, const char *what, squad_err *err) {
    return reps < 1 || reps > ABLATE_MAX_REPS
               ? cu_err(err, SQUAD_E_INVALID, "%s: %d repetitions (1..%d)", what, reps, ABLATE_MAX_REPS)
               : 0;
}

extern "C" int squad_cuda_time_last_forward(squad_backend *be, int nrows, int start, int len, int reps,
                                            squad_cuda_timing *out, squad_err *err) {
    int rc = check_reps(reps, "squad_cuda_time_last_forward", err);
    if (rc) return rc;
    memset(out, 0, sizeof *out);
    cu_parts_graph a;
    memset(&a, 0, sizeof a);
    if ((rc = cu_backend_engine_graph(be, nrows, start, len, &a.engine, &a.st, err))) return rc;
    float *buf = (float *)malloc(sizeof(float) * 3 * (size_t)reps);
    /* the device still holds the last forward's parameters: the replays run on them */
    const cudaError_t e = buf ? time_replays(be, &a, a.engine, 0, reps, buf, out) : cudaErrorMemoryAllocation;
    free(buf);
    if (e != cudaSuccess) rc = cu_fail(err, "squad_cuda_time_last_forward", e, __FILE__, __LINE__);
    return rc;
}

extern "C" int squad_cuda_time_parts(squad_backend *be, int start, int len, unsigned parts, int reps,
                                     squad_cuda_timing *out, squad_err *err) {
    return squad_cuda_time_batch_parts(be, 1, 0, start, len, parts, reps, out, err);
}

extern "C" int squad_cuda_time_batch_parts(squad_backend *be, int nrows, int shared, int start, int len,
                                           unsigned parts, int reps, squad_cuda_timing *out, squad_err *err) {
    if (check_reps(reps, "squad_cuda_time_parts", err)) return SQUAD_E_INVALID;
    memset(out, 0, sizeof *out);
    const int whole = parts == SQUAD_CUDA_PART_ALL;
    cu_parts_graph a;
    int rc = cu_backend_capture_parts(be, nrows, shared, start, len, parts, whole, &a, err);
    if (rc) return rc;
    float *buf = (float *)malloc(sizeof(float) * 3 * (size_t)reps);
    cudaError_t e = buf ? time_replays(be, &a, a.graph, 0, reps, buf, out) : cudaErrorMemoryAllocation;
    cudaGraphExecDestroy(a.graph);
    if (e == cudaSuccess && whole) {
        squad_cuda_timing eng, prm;
        memset(&eng, 0, sizeof eng);
        memset(&prm, 0, sizeof prm);
        e = time_replays(be, &a, a.engine, 0, reps, buf, &eng);
        if (e == cudaSuccess) e = time_replays(be, &a, a.engine, 1, reps, buf, &prm);
        out->engine_gpu_ms = eng.gpu_ms;
        out->engine_wall_ms = eng.wall_ms;
        out->params_wall_ms = prm.wall_ms;
    }
    free(buf);
    if (e != cudaSuccess) rc = cu_fail(err, "squad_cuda_time_parts", e, __FILE__, __LINE__);
    return rc;
}
