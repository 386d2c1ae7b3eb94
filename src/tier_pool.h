/*
 * tier_pool.h — the host tier's memory: a few large slabs carved into checkpoint blobs
 * (docs/design.md section 7, "Tiers"; implementation and design in tier_pool.c).
 *
 * Page-locked memory is expensive to get and to give back (cudaHostAlloc / cudaFreeHost pin and
 * unpin every page: tens of milliseconds for a state's bytes), so the host tier asks its backend
 * for slabs of SQUAD_TIER_POOL_STEP bytes (or one blob's bytes when that is larger) as it grows,
 * up to a cap, and hands out blobs from them first-fit; a freed blob goes back to its slab and
 * the slabs go back to the backend only when the pool is destroyed.
 *
 * Pinning ahead. Even a slab at a time, pinning on the request path costs: a 256 MB
 * cudaHostAlloc takes tens of milliseconds, paid inside the demotion that needed the room. A pool
 * whose slab source is slow (SQUAD_TIER_POOL_SLOW_SLABS) starts a thread of its own that keeps
 * SQUAD_TIER_POOL_AHEAD spare slabs pinned while the cap allows (the spares count against the
 * cap): a growth takes a spare at once and wakes the thread to pin the next; only a growth that
 * finds no spare fitting pins on the caller's thread. The thread starts idle and is woken by the
 * pool's first growth (a pool that never grows never pins). Where the thread cannot be had, the
 * pool grows synchronously, as without the flag.
 */
#ifndef SQUAD_TIER_POOL_H
#define SQUAD_TIER_POOL_H

#include <stddef.h>

/* The bytes a slab grows by (a slab is at least one blob). */
#define SQUAD_TIER_POOL_STEP ((size_t)256 << 20)
/* Every blob starts at a multiple of this (copy engines and vector loads like aligned bytes). */
#define SQUAD_TIER_POOL_ALIGN ((size_t)256)

/* Spare slabs the pinning thread keeps ready (a pool with SQUAD_TIER_POOL_SLOW_SLABS). */
#define SQUAD_TIER_POOL_AHEAD 1

/* squad_tier_pool_init's flags: the slab source is slow (page-locked memory): pin ahead. */
#define SQUAD_TIER_POOL_SLOW_SLABS 1u

/* Where the slabs come from: page-locked memory on CUDA, malloc on the CPU (tests). */
typedef void *(*squad_tier_slab_get)(void *ctx, size_t bytes); /* from any thread */
typedef void (*squad_tier_slab_put)(void *ctx, void *slab);

typedef struct tier_block tier_block;
typedef struct tier_slab tier_slab;
typedef struct tier_ahead tier_ahead;

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
    unsigned long long slabs_made;  /* how often the pool grew (slabs_ahead + slabs_sync) */
    unsigned long long slabs_ahead; /* growths that took a spare pinned ahead (no wait) */
    unsigned long long slabs_sync;  /* growths that pinned on the caller's thread */
    tier_ahead *ahead;              /* the pinning thread and its spares (NULL: none) */
} squad_tier_pool;

/* An empty pool of at most cap slab bytes, growing by step (0: SQUAD_TIER_POOL_STEP). With
 * SQUAD_TIER_POOL_SLOW_SLABS in flags and a cap > 0 it pins ahead on a thread of its own (get is
 * then called from that thread too; put only ever from the pool's caller). */
void squad_tier_pool_init(squad_tier_pool *pool, size_t cap, size_t step, squad_tier_slab_get get,
                          squad_tier_slab_put put, void *ctx, unsigned flags);
/* A blob of `bytes` from a slab with room, or a new slab when the cap allows; NULL when neither
 * (the caller frees blobs and tries again, or goes without). */
void *squad_tier_pool_alloc(squad_tier_pool *pool, size_t bytes);
/* A blob from squad_tier_pool_alloc back to its slab (NULL: nothing). */
void squad_tier_pool_free(squad_tier_pool *pool, void *blob);
/* Stops the pinning thread (waiting for a pin in flight) and gives every slab, spares included,
 * back to where it came from (blobs still out become invalid). The pool is left empty, of the same
 * cap, growing synchronously. */
void squad_tier_pool_destroy(squad_tier_pool *pool);
/* 1 when the pool has its pinning thread. */
int squad_tier_pool_pins_ahead(const squad_tier_pool *pool);
/* The spare slabs ready now, and their bytes (NULL: not wanted). */
int squad_tier_pool_spares(const squad_tier_pool *pool, size_t *spare_bytes);
/* Waits until the pinning thread has nothing left to do (its spares pinned, or the cap or a failed
 * pin stops it): for tests and benchmarks that want the steady state. 0, or -1 without a thread. */
int squad_tier_pool_settle(const squad_tier_pool *pool);
/* 0 when every slab's blocks tile it, ordered, with no two free blocks side by side, the byte
 * counts agree and the slabs with the spares stay within the cap; else -1 with why filled. */
int squad_tier_pool_check(const squad_tier_pool *pool, char *why, size_t why_len);

#endif /* SQUAD_TIER_POOL_H */
