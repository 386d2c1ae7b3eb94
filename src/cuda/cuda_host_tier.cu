/*
 * cuda_host_tier.cu — the CUDA backend's side of the state cache's tiers (interface in
 * cuda_host_tier.cuh; docs/design.md section 7, "Tiers").
 *
 * Checkpoints live in device memory; the host tier keeps demoted ones in page-locked host memory
 * (cudaHostAlloc), and the disk tier reads blobs into ordinary host memory to write them. Copies
 * run on a copy stream of their own: it waits for an event recorded on the compute stream (so a
 * blob saved by a forward still in flight is complete before it is read, and a promoted blob is
 * written before anything later reads it), and the call returns when its copy is done. The copy
 * stream is not the compute stream, so a copy never waits behind graph replays queued later; the
 * host thread does wait for the copy itself (a 4,096-token 0.8B state, ~40 MB, takes about a
 * millisecond over PCIe 5 / NVLink-C2C), which keeps the cache's bookkeeping simple: a demoted
 * device blob is released at once.
 *
 * The bandwidth the cost model starts from is measured at attach: one SQUAD_CUDA_TIER_PROBE_BYTES
 * pinned host-to-device copy timed with events.
 */
#include "cuda_host_tier.cuh"
#include "cuda_internal.cuh"

#include <stdlib.h>
#include <string.h>

/* The probe copy that measures the host-to-device bandwidth at attach. */
#define SQUAD_CUDA_TIER_PROBE_BYTES ((size_t)32 << 20)

typedef struct cu_tier {
    int device;
    cudaStream_t compute; /* the backend's: the copies are ordered after its work */
    cudaStream_t copy;
    cudaEvent_t ready;    /* recorded on compute before each copy */
} cu_tier;

static cu_tier *tier_of(squad_backend *be) { return (cu_tier *)be->tier_impl; }

static void *tier_host_alloc(squad_backend *be, size_t bytes, squad_err *err) {
    void *p = NULL;
    cudaSetDevice(tier_of(be)->device);
    const cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 16, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cu_fail(err, "cudaHostAlloc", e, __FILE__, __LINE__);
        if (err && e == cudaErrorMemoryAllocation) err->code = SQUAD_E_NOMEM;
        return NULL;
    }
    return p;
}

static void tier_host_release(squad_backend *be, void *p) {
    (void)be;
    if (p) cudaFreeHost(p);
}

/* One copy on the copy stream, after the compute stream's work so far; returns when it is done. */
static int tier_copy(squad_backend *be, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, squad_err *err) {
    cu_tier *t = tier_of(be);
    CU_TRY(cudaSetDevice(t->device));
    CU_TRY(cudaEventRecord(t->ready, t->compute));
    CU_TRY(cudaStreamWaitEvent(t->copy, t->ready, 0));
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, kind, t->copy));
    CU_TRY(cudaStreamSynchronize(t->copy));
    return 0;
}

static int tier_to_host(squad_backend *be, void *host, const void *blob, size_t bytes, squad_err *err) {
    return tier_copy(be, host, blob, bytes, cudaMemcpyDeviceToHost, err);
}

static int tier_from_host(squad_backend *be, void *blob, const void *host, size_t bytes, squad_err *err) {
    return tier_copy(be, blob, host, bytes, cudaMemcpyHostToDevice, err);
}

/* Times one pinned host-to-device copy: bytes per second, 0 when the probe could not run. */
static double probe_bandwidth(cu_tier *t) {
    void *host = NULL, *dev = NULL;
    cudaEvent_t a = NULL, b = NULL;
    double rate = 0;
    float ms = 0;
    if (cudaHostAlloc(&host, SQUAD_CUDA_TIER_PROBE_BYTES, cudaHostAllocDefault) == cudaSuccess &&
        cudaMalloc(&dev, SQUAD_CUDA_TIER_PROBE_BYTES) == cudaSuccess && cudaEventCreate(&a) == cudaSuccess &&
        cudaEventCreate(&b) == cudaSuccess) {
        memset(host, 0, SQUAD_CUDA_TIER_PROBE_BYTES);
        /* once to warm the path, once timed */
        cudaMemcpyAsync(dev, host, SQUAD_CUDA_TIER_PROBE_BYTES, cudaMemcpyHostToDevice, t->copy);
        cudaEventRecord(a, t->copy);
        cudaMemcpyAsync(dev, host, SQUAD_CUDA_TIER_PROBE_BYTES, cudaMemcpyHostToDevice, t->copy);
        cudaEventRecord(b, t->copy);
        if (cudaEventSynchronize(b) == cudaSuccess && cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms > 0)
            rate = (double)SQUAD_CUDA_TIER_PROBE_BYTES / (ms * 1e-3);
    }
    cudaGetLastError(); /* a failed probe only leaves the cache's default figure */
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    if (dev) cudaFree(dev);
    if (host) cudaFreeHost(host);
    return rate;
}

int cu_host_tier_attach(squad_backend *be, int device, cudaStream_t compute, squad_err *err) {
    cu_tier *t = (cu_tier *)calloc(1, sizeof *t);
    if (!t) return cu_err(err, SQUAD_E_NOMEM, "out of memory (CUDA host tier)");
    t->device = device;
    t->compute = compute;
    be->tier_impl = t;
    CU_TRY(cudaSetDevice(device));
    CU_TRY(cudaStreamCreateWithFlags(&t->copy, cudaStreamNonBlocking));
    CU_TRY(cudaEventCreateWithFlags(&t->ready, cudaEventDisableTiming));
    be->host_copy_bytes_per_s = probe_bandwidth(t);
    be->host_alloc = tier_host_alloc;
    be->host_release = tier_host_release;
    be->blob_to_host = tier_to_host;
    be->blob_from_host = tier_from_host;
    return 0;
}

void cu_host_tier_detach(squad_backend *be) {
    cu_tier *t = be ? tier_of(be) : NULL;
    if (!t) return;
    if (t->copy) {
        cudaStreamSynchronize(t->copy);
        cudaStreamDestroy(t->copy);
    }
    if (t->ready) cudaEventDestroy(t->ready);
    free(t);
    be->tier_impl = NULL;
    be->host_alloc = NULL;
    be->host_release = NULL;
    be->blob_to_host = NULL;
    be->blob_from_host = NULL;
}
