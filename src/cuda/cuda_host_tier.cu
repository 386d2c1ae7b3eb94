/*
 * cuda_host_tier.cu — the CUDA backend's side of the state cache's tiers, and its checkpoint
 * blobs' device memory (interface in cuda_host_tier.cuh; docs/design.md section 7, "Tiers").
 *
 * What makes a tier copy cost its bytes and nothing more:
 *  - No allocation on the copy's path. Checkpoint blobs come from a memory pool of the backend's
 *    own (stream-ordered cudaMallocAsync / cudaFreeAsync, the pool keeping what is freed), not
 *    from cudaMalloc / cudaFree, which synchronise the device and cost milliseconds at these sizes;
 *    page-locked host memory is only taken in large slabs the cache carves up (tier_pool.h), never
 *    per checkpoint, and all of them when the cache is made (a pin while serving stalls the engine).
 *  - No host wait. Copies run on a copy stream of their own, in the order the cache issues them:
 *    each waits for an event recorded on the compute stream (so a blob saved by a forward still in
 *    flight is complete before it is read), and a host-to-device copy records an event the compute
 *    stream waits for (so the forward that reads a promoted blob runs after it, and nothing else
 *    waits). A demoted device blob is freed on the copy stream, after its copy. The host thread
 *    only waits in tier_sync (before it reads or writes host-tier bytes itself: the disk tier, the
 *    cache's teardown).
 *  - One copy per blob, one blob per checkpoint (its GDN states) and per group (its K / V).
 *
 * The bandwidth the cost model uses is measured at attach (one SQUAD_CUDA_TIER_PROBE_BYTES pinned
 * host-to-device copy timed with events) and then from the host-to-device copies themselves: each
 * is timed with a pair of events, read when done, and moves the figure by SQUAD_CUDA_TIER_RATE_EWMA.
 */
#include "cuda_host_tier.cuh"
#include "cuda_internal.cuh"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The probe copy that measures the host-to-device bandwidth at attach. */
#define SQUAD_CUDA_TIER_PROBE_BYTES ((size_t)32 << 20)
/* Timed copies in flight at once (a copy that finds none free goes untimed), and how far one
 * measurement moves the figure. Copies shorter than SQUAD_CUDA_TIER_RATE_MIN_BYTES say more
 * about the per-copy latency than about the bandwidth, and are not timed. */
#define SQUAD_CUDA_TIER_TIMERS 8
#define SQUAD_CUDA_TIER_RATE_EWMA 0.2
#define SQUAD_CUDA_TIER_RATE_MIN_BYTES ((size_t)1 << 20)

typedef struct cu_tier_timer {
    cudaEvent_t start, end;
    size_t bytes; /* 0: free */
} cu_tier_timer;

typedef struct cu_tier {
    int device;
    cudaStream_t compute; /* the backend's: copies are ordered after its work */
    cudaStream_t copy;
    cudaEvent_t ready;    /* compute -> copy: recorded on compute before each copy */
    cudaEvent_t done;     /* copy -> compute: recorded after a host-to-device copy */
    cudaMemPool_t pool;   /* the checkpoint blobs' device memory (NULL: plain cudaMalloc) */
    cu_tier_timer timers[SQUAD_CUDA_TIER_TIMERS];
} cu_tier;

static cu_tier *tier_of(const squad_backend *be) { return (cu_tier *)be->tier_impl; }

/* ---- the checkpoint blobs' device memory ------------------------------------------------------ */

void *cu_tier_blob_alloc(squad_backend *be, int device, cudaStream_t compute, size_t bytes, squad_err *err) {
    void *p = NULL;
    cu_tier *t = be->tier_impl ? tier_of(be) : NULL;
    cudaSetDevice(device);
    const cudaError_t e = t && t->pool ? cudaMallocFromPoolAsync(&p, bytes ? bytes : 16, t->pool, compute)
                                       : cudaMalloc(&p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cu_fail(err, t && t->pool ? "cudaMallocFromPoolAsync" : "cudaMalloc", e, __FILE__, __LINE__);
        if (err && e == cudaErrorMemoryAllocation) err->code = SQUAD_E_NOMEM;
        return NULL;
    }
    return p;
}

void cu_tier_blob_release(squad_backend *be, cudaStream_t compute, void *p) {
    if (!p) return;
    cu_tier *t = be->tier_impl ? tier_of(be) : NULL;
    if (t && t->pool) { /* after the compute stream's work so far, which may read it */
        cudaFreeAsync(p, compute);
        return;
    }
    cudaStreamSynchronize(compute); /* no work still reads it */
    cudaFree(p);
}

/* A pool that keeps what is freed (the cache frees and allocates blobs of the same sizes all the
 * time); NULL where the device has no memory pools. */
static cudaMemPool_t pool_make(int device) {
    int supported = 0;
    if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess || !supported) {
        cudaGetLastError();
        return NULL;
    }
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = NULL;
    if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    uint64_t keep = UINT64_MAX;
    if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) {
        cudaGetLastError();
        cudaMemPoolDestroy(pool);
        return NULL;
    }
    return pool;
}

/* ---- host memory and copies ------------------------------------------------------------------- */

/* A slab of page-locked memory. The cache reserves its slabs on whichever thread creates the
 * engine (the server's engine thread, a CLI's main thread), so this must not depend on the
 * calling thread: the runtime's current device is per thread (a new thread starts on device 0),
 * so the backend's device is set first, and the memory is pinned in that device's context as on the
 * engine's thread; cudaHostAllocPortable on top makes the slab count as pinned memory for every
 * context whichever device was current (under unified addressing it is anyway; the flag costs
 * nothing there and keeps the copies from the slab at full bandwidth for --device cuda:N on a
 * system without it). t->device is written once at attach, before any pool exists. */
static void *tier_host_alloc(squad_backend *be, size_t bytes, squad_err *err) {
    void *p = NULL;
    const cudaError_t set = cudaSetDevice(tier_of(be)->device);
    if (set != cudaSuccess) {
        cudaGetLastError();
        cu_fail(err, "cudaSetDevice", set, __FILE__, __LINE__);
        return NULL;
    }
    const cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 16, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cu_fail(err, "cudaHostAlloc", e, __FILE__, __LINE__);
        if (err && e == cudaErrorMemoryAllocation) err->code = SQUAD_E_NOMEM;
        return NULL;
    }
    return p;
}

static void tier_host_release(squad_backend *be, void *p) {
    if (!p) return;
    cudaSetDevice(tier_of(be)->device);
    cudaStreamSynchronize(tier_of(be)->copy); /* no copy still uses it */
    cudaFreeHost(p);
}

/* Reads the finished timed copies into the bandwidth figure; returns a free timer, or NULL. */
static cu_tier_timer *timers_harvest(squad_backend *be) {
    cu_tier *t = tier_of(be);
    cu_tier_timer *free_one = NULL;
    for (int i = 0; i < SQUAD_CUDA_TIER_TIMERS; i++) {
        cu_tier_timer *x = &t->timers[i];
        if (x->bytes && cudaEventQuery(x->end) == cudaSuccess) {
            float ms = 0;
            if (cudaEventElapsedTime(&ms, x->start, x->end) == cudaSuccess && ms > 0) {
                const double rate = (double)x->bytes / (ms * 1e-3);
                be->host_copy_bytes_per_s = be->host_copy_bytes_per_s > 0
                                                ? be->host_copy_bytes_per_s +
                                                      SQUAD_CUDA_TIER_RATE_EWMA * (rate - be->host_copy_bytes_per_s)
                                                : rate;
            }
            x->bytes = 0;
        }
        cudaGetLastError(); /* a query of a copy not done yet is no error */
        if (!x->bytes && !free_one) free_one = x;
    }
    return free_one;
}

/* One copy queued on the copy stream after the compute stream's work so far; a host-to-device
 * one also orders the compute stream's later work after it, and is timed. */
static int tier_copy(squad_backend *be, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                     squad_err *err) {
    cu_tier *t = tier_of(be);
    const int up = kind == cudaMemcpyHostToDevice;
    CU_TRY(cudaSetDevice(t->device));
    CU_TRY(cudaEventRecord(t->ready, t->compute));
    CU_TRY(cudaStreamWaitEvent(t->copy, t->ready, 0));
    cu_tier_timer *timer = up && bytes >= SQUAD_CUDA_TIER_RATE_MIN_BYTES ? timers_harvest(be) : NULL;
    if (timer) CU_TRY(cudaEventRecord(timer->start, t->copy));
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, kind, t->copy));
    if (timer) {
        CU_TRY(cudaEventRecord(timer->end, t->copy));
        timer->bytes = bytes;
    }
    if (up) {
        CU_TRY(cudaEventRecord(t->done, t->copy));
        CU_TRY(cudaStreamWaitEvent(t->compute, t->done, 0));
    }
    return 0;
}

static int tier_to_host(squad_backend *be, void *host, const void *blob, size_t bytes, squad_err *err) {
    return tier_copy(be, host, blob, bytes, cudaMemcpyDeviceToHost, err);
}

static int tier_from_host(squad_backend *be, void *blob, const void *host, size_t bytes, squad_err *err) {
    return tier_copy(be, blob, host, bytes, cudaMemcpyHostToDevice, err);
}

/* A demoted blob: freed on the copy stream, after the copy that reads it. */
static void tier_release_copied(squad_backend *be, void *blob) {
    cu_tier *t = tier_of(be);
    if (!blob) return;
    if (t->pool) {
        cudaFreeAsync(blob, t->copy);
        return;
    }
    cudaStreamSynchronize(t->copy);
    cudaStreamSynchronize(t->compute);
    cudaFree(blob);
}

static int tier_sync(squad_backend *be, squad_err *err) {
    cu_tier *t = tier_of(be);
    CU_TRY(cudaSetDevice(t->device));
    CU_TRY(cudaStreamSynchronize(t->copy));
    timers_harvest(be);
    return 0;
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
    CU_TRY(cudaEventCreateWithFlags(&t->done, cudaEventDisableTiming));
    for (int i = 0; i < SQUAD_CUDA_TIER_TIMERS; i++) {
        CU_TRY(cudaEventCreate(&t->timers[i].start));
        CU_TRY(cudaEventCreate(&t->timers[i].end));
    }
    t->pool = pool_make(device);
    be->host_copy_bytes_per_s = probe_bandwidth(t);
    be->host_alloc = tier_host_alloc;
    be->host_release = tier_host_release;
    be->blob_to_host = tier_to_host;
    be->blob_from_host = tier_from_host;
    be->release_copied = tier_release_copied;
    be->tier_sync = tier_sync;
    return 0;
}

void cu_host_tier_detach(squad_backend *be) {
    cu_tier *t = be ? tier_of(be) : NULL;
    if (!t) return;
    cudaSetDevice(t->device);
    if (t->copy) {
        cudaStreamSynchronize(t->copy);
        cudaStreamDestroy(t->copy);
    }
    if (t->compute) cudaStreamSynchronize(t->compute);
    if (t->ready) cudaEventDestroy(t->ready);
    if (t->done) cudaEventDestroy(t->done);
    for (int i = 0; i < SQUAD_CUDA_TIER_TIMERS; i++) {
        if (t->timers[i].start) cudaEventDestroy(t->timers[i].start);
        if (t->timers[i].end) cudaEventDestroy(t->timers[i].end);
    }
    /* blobs still out (none once the cache is gone) keep the pool's memory until they are freed */
    if (t->pool) cudaMemPoolDestroy(t->pool);
    cudaGetLastError();
    free(t);
    be->tier_impl = NULL;
    be->host_alloc = NULL;
    be->host_release = NULL;
    be->blob_to_host = NULL;
    be->blob_from_host = NULL;
    be->release_copied = NULL;
    be->tier_sync = NULL;
}
