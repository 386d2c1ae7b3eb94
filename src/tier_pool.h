/*
 * tier_pool.h — the host tier's memory: a few large slabs carved into checkpoint blobs
 * (docs/design.md section 7, "Tiers"; implementation and design in tier_pool.c).
 *
 * Page-locked memory is expensive to get and to give back (cudaHostAlloc / cudaFreeHost pin and
 * unpin every page: tens of milliseconds for a state's bytes), so the host tier asks its backend
 * for slabs of SQUAD_TIER_POOL_STEP bytes (or one blob's bytes when that is larger) as it grows,
 * up to a cap, and hands out blobs from them first-fit; a freed blob goes back to its slab and
 * the slabs go back to the backend only when the pool is destroyed.
 */
#ifndef SQUAD_TIER_POOL_H
#define SQUAD_TIER_POOL_H

#include <stddef.h>

/* The bytes a slab grows by (a slab is at least one blob). */
#define SQUAD_TIER_POOL_STEP ((size_t)256 << 20)
/* Every blob starts at a multiple of this (copy engines and vector loads like aligned bytes). */
#define SQUAD_TIER_POOL_ALIGN ((size_t)256)

/* Where the slabs come from: page-locked memory on CUDA, malloc on the CPU (tests). */
typedef void *(*squad_tier_slab_get)(void *ctx, size_t bytes);
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
    unsigned long long slabs_made; /* calls to get: how often the pool grew */
} squad_tier_pool;

/* An empty pool of at most cap slab bytes, growing by step (0: SQUAD_TIER_POOL_STEP). */
void squad_tier_pool_init(squad_tier_pool *pool, size_t cap, size_t step, squad_tier_slab_get get,
                          squad_tier_slab_put put, void *ctx);
/* A blob of `bytes` from a slab with room, or a new slab when the cap allows; NULL when neither
 * (the caller frees blobs and tries again, or goes without). */
void *squad_tier_pool_alloc(squad_tier_pool *pool, size_t bytes);
/* A blob from squad_tier_pool_alloc back to its slab (NULL: nothing). */
void squad_tier_pool_free(squad_tier_pool *pool, void *blob);
/* Every slab back to where it came from (blobs still out become invalid). */
void squad_tier_pool_destroy(squad_tier_pool *pool);
/* 0 when every slab's blocks tile it, ordered, with no two free blocks side by side, and the byte
 * counts agree; else -1 with why filled. */
int squad_tier_pool_check(const squad_tier_pool *pool, char *why, size_t why_len);

#endif /* SQUAD_TIER_POOL_H */
