/*
 * cuda_host_tier.cuh — the CUDA backend's hooks for the state cache's host tier and disk tier
 * (backend.h: host_alloc, host_release, blob_to_host, blob_from_host, release_copied, tier_sync,
 * host_copy_bytes_per_s; docs/design.md section 7, "Tiers"), and the checkpoint blobs' device
 * memory. backend_cuda.cu calls the functions below and nothing else of the tiers.
 */
#ifndef SQUAD_CUDA_HOST_TIER_CUH
#define SQUAD_CUDA_HOST_TIER_CUH

#include <cuda_runtime.h>

#include "backend.h"

/* Sets be's tier hooks: a copy stream of its own on `device`, ordered after `compute` (the
 * backend's stream) by an event, and the host-to-device bandwidth measured once with pinned
 * memory. 0, or SQUAD_E_BACKEND with err filled (the backend then has no host tier: the hooks stay
 * NULL and the cache uses none). */
int cu_host_tier_attach(squad_backend *be, int device, cudaStream_t compute, squad_err *err);
/* Frees what attach made (the backend's destroy, before its stream goes, after the cache has
 * released its blobs). */
void cu_host_tier_detach(squad_backend *be);

/* The backend's alloc / release of checkpoint blobs: from the tier's stream-ordered memory pool,
 * ordered on `compute` (no device-wide synchronisation, memory kept for the next blob), or
 * cudaMalloc / cudaFree when the tier is not attached or the device has no pools. */
void *cu_tier_blob_alloc(squad_backend *be, int device, cudaStream_t compute, size_t bytes, squad_err *err);
void cu_tier_blob_release(squad_backend *be, cudaStream_t compute, void *p);

#endif /* SQUAD_CUDA_HOST_TIER_CUH */
