/*
 * tier_pool.h — the host tier's memory: a few large slabs carved into checkpoint blobs
 * (docs/design.md section 7, "Tiers"; implementation and design in tier_pool.c).
 *
 * Page-locked memory is expensive to get and to give back (cudaHostAlloc / cudaFreeHost pin and
 * unpin every page: tens of milliseconds per 256 MB), so the host tier asks its backend for slabs
 * of SQUAD_TIER_POOL_STEP bytes up to a cap (all of them at once when reserved, else as it grows,
 * one blob's bytes when that is larger) and hands out blobs from them first-fit; a freed blob goes
 * back to its slab and the slabs go back to the backend only when the pool is destroyed.
 *
 * Reserving. A pool over page-locked memory takes its whole cap when it is made
 * (squad_tier_pool_reserve): pinning memory while the engine serves stalls the engine's CUDA calls,
 * whichever thread pins, so a pool that pinned as it grew paid a stall per slab in the middle of
 * the forwards. A reserved pool never takes a slab again; a pool not reserved (malloc slabs, the
 * CPU backend's test hook) grows on demand.
 */
#ifndef SQUAD_TIER_POOL_H
#define SQUAD_TIER_POOL_H

#include <stddef.h>

/* The bytes a slab grows by (a slab is at least one blob). */
#define SQUAD_TIER_POOL_STEP ((size_t)256 << 20)
/* Every blob starts at a multiple of this (copy engines and vector loads like aligned bytes). */
#define SQUAD_TIER_POOL_ALIGN ((size_t)256)

/* Where the slabs come from: page-locked memory on CUDA, malloc on the CPU (tests). */
typedef void *(*squad_tier_slab_get)(void *ctx, size_t bytes); /* NULL: refused */
typedef void (*squad_tier_slab_put)(void *ctx, void *slab);

typedef struct tier_block tier_block;
typedef struct tier_slab tier_slab;

typedef struct squad_tier_pool {
    squad_tier_slab_get get;
    squad_tier_slab_put put;
    void *ctx;
    size_t cap;        /* the most slab bytes held */
    size_t step;       /* a new slab's bytes (at least the blob it is made for) */
    size_t slab_bytes; /* slab bytes held now */
    size_t used_bytes; /* bytes of the blobs handed out (aligned sizes) */
    tier_slab *slabs;
    int n_slabs, cap_slabs;
    /* the slabs taken (n_slabs of them: a slab stays until the pool is destroyed), by how */
    unsigned long long slabs_reserved; /* taken by squad_tier_pool_reserve, before any blob */
    unsigned long long slabs_sync;     /* taken inside an allocation (the pool grew on demand) */
} squad_tier_pool;

/* An empty pool of at most cap slab bytes, growing by step (0: SQUAD_TIER_POOL_STEP) on demand. */
void squad_tier_pool_init(squad_tier_pool *pool, size_t cap, size_t step, squad_tier_slab_get get,
                          squad_tier_slab_put put, void *ctx);
/* Takes slabs of `step` bytes (the last one the rest of the cap, rounded down to
 * SQUAD_TIER_POOL_ALIGN) until the pool's slabs hold its whole cap, so no allocation takes one
 * later. 0, or -1 when the source refuses a slab: the slabs taken so far stay in the pool (usable,
 * and given back by squad_tier_pool_destroy). */
int squad_tier_pool_reserve(squad_tier_pool *pool);
/* A blob of `bytes` from a slab with room, or a new slab when the cap allows; NULL when neither
 * (the caller frees blobs and tries again, or goes without). */
void *squad_tier_pool_alloc(squad_tier_pool *pool, size_t bytes);
/* A blob from squad_tier_pool_alloc back to its slab (NULL: nothing). */
void squad_tier_pool_free(squad_tier_pool *pool, void *blob);
/* The largest blob the pool could ever hand out: its largest slab, or the room a new slab could
 * still take (a blob larger than this fails however many blobs are freed). */
size_t squad_tier_pool_max_blob(const squad_tier_pool *pool);
/* Gives every slab back to where it came from (blobs still out become invalid). The pool is left
 * empty, of the same cap and step, growing on demand. */
void squad_tier_pool_destroy(squad_tier_pool *pool);
/* 0 when every slab's blocks tile it, ordered, with no two free blocks side by side, the byte
 * counts agree and the slabs stay within the cap; else -1 with why filled. */
int squad_tier_pool_check(const squad_tier_pool *pool, char *why, size_t why_len);

#endif /* SQUAD_TIER_POOL_H */
