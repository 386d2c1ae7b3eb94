/*
 * tier_pool.c — the host tier's slab allocator (interface in tier_pool.h; docs/design.md
 * section 7, "Tiers").
 *
 * The host tier holds a few hundred blobs at most (a GDN blob per checkpoint, a K / V blob per
 * group: megabytes each), so the allocator is the plainest that never pins on the hot path: each
 * slab keeps its blocks in an array ordered by offset that tiles the slab exactly (free and used
 * alike); an allocation takes the first free block that fits, in the oldest slab first, and splits
 * off the rest; a free marks its block free and merges it with free neighbours, so two free blocks
 * are never side by side. The descriptors live outside the slabs: a slab's bytes are only ever the
 * blobs (the copy engine writes them; nothing else there to race with). The pool is used from one
 * thread (the cache's caller). With blobs of a few sizes, first fit keeps fragmentation low; when
 * it is not enough, the cache frees its least recently used host blobs until an allocation fits
 * (cache.c).
 *
 * Reserving (squad_tier_pool_reserve): the host tier's page-locked memory is pinned once, when the
 * cache is made, the whole budget in slabs of SQUAD_TIER_POOL_STEP bytes, and never again while the
 * engine serves. A pin during serving blocks the engine thread's CUDA calls whichever thread pins
 * (pinning ahead on a thread of the pool's own still stalled the engine): on the H200, a 256 MB
 * slab pinned while forwards run stalled the engine ~100 ms, where the same pin alone takes 27 ms,
 * and one fresh row in five paid such a stall while the tier grew. Pinning the budget up front
 * moves that cost to startup (0.4-0.7 s per GB on the H200 machine, before the server is ready),
 * where it costs no request. A budget the system cannot pin (its limit on locked memory, or its
 * free RAM) is then a startup error, not a tier that stalls or stops growing later. A pool that is
 * not reserved (malloc slabs, the CPU backend's test hook) grows on demand, a slab at a time inside
 * the allocation that needs it. A reserved pool's largest blob is a slab
 * (squad_tier_pool_max_blob): a larger one (a group's K / V over 256 MB) is not demoted.
 */
#include "tier_pool.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tier_block {
    size_t off, size;
    int used;
};

struct tier_slab {
    unsigned char *base;
    size_t bytes;
    tier_block *blocks; /* ordered by off, tiling [0, bytes) */
    int n_blocks, cap_blocks;
};

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

void squad_tier_pool_init(squad_tier_pool *pool, size_t cap, size_t step, squad_tier_slab_get get,
                          squad_tier_slab_put put, void *ctx) {
    memset(pool, 0, sizeof *pool);
    pool->cap = cap;
    pool->step = step ? round_up(step, SQUAD_TIER_POOL_ALIGN) : SQUAD_TIER_POOL_STEP;
    pool->get = get;
    pool->put = put;
    pool->ctx = ctx;
}

/* Room for one more block descriptor in s; 0 or -1. */
static int blocks_room(tier_slab *s) {
    if (s->n_blocks < s->cap_blocks) return 0;
    const int cap = s->cap_blocks ? 2 * s->cap_blocks : 16;
    tier_block *nb = realloc(s->blocks, (size_t)cap * sizeof *nb);
    if (!nb) return -1;
    s->blocks = nb;
    s->cap_blocks = cap;
    return 0;
}

/* Takes `need` bytes from the start of free block i of s; the pointer, or NULL when the split's
 * descriptor cannot be had. */
static void *block_take(squad_tier_pool *pool, tier_slab *s, int i, size_t need) {
    tier_block *b = &s->blocks[i];
    if (b->size > need) { /* the rest stays free, right after */
        if (blocks_room(s)) return NULL;
        b = &s->blocks[i];
        memmove(&s->blocks[i + 2], &s->blocks[i + 1], (size_t)(s->n_blocks - i - 1) * sizeof *b);
        s->blocks[i + 1] = (tier_block){b->off + need, b->size - need, 0};
        s->n_blocks++;
        b->size = need;
    }
    b->used = 1;
    pool->used_bytes += need;
    return s->base + b->off;
}

/* ---- growing and reserving ---------------------------------------------------------------------- */

/* The cap's room for new slabs, rounded down to whole aligned blocks. */
static size_t room_left(const squad_tier_pool *pool) {
    if (pool->slab_bytes >= pool->cap) return 0;
    return (pool->cap - pool->slab_bytes) / SQUAD_TIER_POOL_ALIGN * SQUAD_TIER_POOL_ALIGN;
}

/* A new slab of `bytes` (aligned, within the cap's room) from the source, one free block; NULL
 * when the source or a descriptor's memory refuses. `reserved` says which counter it goes to. */
static tier_slab *slab_add(squad_tier_pool *pool, size_t bytes, int reserved) {
    if (pool->n_slabs == pool->cap_slabs) {
        const int cap = pool->cap_slabs ? 2 * pool->cap_slabs : 8;
        tier_slab *ns = realloc(pool->slabs, (size_t)cap * sizeof *ns);
        if (!ns) return NULL;
        pool->slabs = ns;
        pool->cap_slabs = cap;
    }
    tier_slab s = {0};
    s.blocks = malloc(16 * sizeof *s.blocks);
    if (!s.blocks) return NULL;
    s.cap_blocks = 16;
    s.base = pool->get(pool->ctx, bytes);
    if (!s.base) {
        free(s.blocks);
        return NULL;
    }
    s.bytes = bytes;
    s.blocks[0] = (tier_block){0, bytes, 0};
    s.n_blocks = 1;
    pool->slabs[pool->n_slabs] = s;
    pool->slab_bytes += bytes;
    if (reserved) pool->slabs_reserved++;
    else pool->slabs_sync++;
    return &pool->slabs[pool->n_slabs++];
}

/* A slab grown on demand for `need` aligned bytes: a step (or the blob, when larger), or the last
 * room when less is left; NULL when the cap or the source refuses. */
static tier_slab *slab_grow(squad_tier_pool *pool, size_t need) {
    const size_t room = room_left(pool);
    if (need > room) return NULL;
    const size_t bytes = need > pool->step ? need : pool->step;
    return slab_add(pool, bytes > room ? room : bytes, 0);
}

int squad_tier_pool_reserve(squad_tier_pool *pool) {
    for (size_t room = room_left(pool); room > 0; room = room_left(pool))
        if (!slab_add(pool, room < pool->step ? room : pool->step, 1)) return -1;
    return 0;
}

void *squad_tier_pool_alloc(squad_tier_pool *pool, size_t bytes) {
    const size_t need = round_up(bytes ? bytes : 1, SQUAD_TIER_POOL_ALIGN);
    for (int k = 0; k < pool->n_slabs; k++) {
        tier_slab *s = &pool->slabs[k];
        for (int i = 0; i < s->n_blocks; i++)
            if (!s->blocks[i].used && s->blocks[i].size >= need) return block_take(pool, s, i, need);
    }
    tier_slab *s = slab_grow(pool, need);
    return s ? block_take(pool, s, 0, need) : NULL;
}

/* Block i of s merged into block i - 1 (both free). */
static void block_merge_prev(tier_slab *s, int i) {
    s->blocks[i - 1].size += s->blocks[i].size;
    memmove(&s->blocks[i], &s->blocks[i + 1], (size_t)(s->n_blocks - i - 1) * sizeof *s->blocks);
    s->n_blocks--;
}

void squad_tier_pool_free(squad_tier_pool *pool, void *blob) {
    if (!blob) return;
    const unsigned char *p = blob;
    for (int k = 0; k < pool->n_slabs; k++) {
        tier_slab *s = &pool->slabs[k];
        if (p < s->base || p >= s->base + s->bytes) continue;
        const size_t off = (size_t)(p - s->base);
        int lo = 0, hi = s->n_blocks - 1;
        while (lo < hi) { /* the block starting at off */
            const int mid = (lo + hi) / 2;
            if (s->blocks[mid].off < off) lo = mid + 1;
            else hi = mid;
        }
        tier_block *b = &s->blocks[lo];
        if (b->off != off || !b->used) return; /* not a blob of ours: leave everything as it is */
        b->used = 0;
        pool->used_bytes -= b->size;
        if (lo + 1 < s->n_blocks && !s->blocks[lo + 1].used) block_merge_prev(s, lo + 1);
        if (lo > 0 && !s->blocks[lo - 1].used) block_merge_prev(s, lo);
        return;
    }
}

size_t squad_tier_pool_max_blob(const squad_tier_pool *pool) {
    size_t most = room_left(pool);
    for (int k = 0; k < pool->n_slabs; k++)
        if (pool->slabs[k].bytes > most) most = pool->slabs[k].bytes;
    return most;
}

void squad_tier_pool_destroy(squad_tier_pool *pool) {
    for (int k = 0; k < pool->n_slabs; k++) {
        pool->put(pool->ctx, pool->slabs[k].base);
        free(pool->slabs[k].blocks);
    }
    free(pool->slabs);
    squad_tier_pool_init(pool, pool->cap, pool->step, pool->get, pool->put, pool->ctx);
}

#define POOL_FAIL(...)                                                                                        \
    do {                                                                                                      \
        if (why && why_len) snprintf(why, why_len, __VA_ARGS__);                                              \
        return -1;                                                                                            \
    } while (0)

int squad_tier_pool_check(const squad_tier_pool *pool, char *why, size_t why_len) {
    size_t slabs = 0, used = 0;
    for (int k = 0; k < pool->n_slabs; k++) {
        const tier_slab *s = &pool->slabs[k];
        size_t at = 0;
        for (int i = 0; i < s->n_blocks; i++) {
            const tier_block *b = &s->blocks[i];
            if (b->off != at || b->size == 0 || b->size % SQUAD_TIER_POOL_ALIGN)
                POOL_FAIL("slab %d block %d: offset %zu (expected %zu), size %zu", k, i, b->off, at, b->size);
            if (i > 0 && !b->used && !s->blocks[i - 1].used) POOL_FAIL("slab %d: free blocks %d and %d not merged", k, i - 1, i);
            if (b->used) used += b->size;
            at += b->size;
        }
        if (at != s->bytes) POOL_FAIL("slab %d: blocks cover %zu of %zu bytes", k, at, s->bytes);
        slabs += s->bytes;
    }
    if (slabs != pool->slab_bytes || used != pool->used_bytes || slabs > pool->cap)
        POOL_FAIL("pool: slabs %zu counted %zu (cap %zu), used %zu counted %zu", slabs, pool->slab_bytes, pool->cap,
                  used, pool->used_bytes);
    if ((unsigned long long)pool->n_slabs != pool->slabs_reserved + pool->slabs_sync)
        POOL_FAIL("pool: %d slabs, %llu reserved + %llu on demand", pool->n_slabs, pool->slabs_reserved,
                  pool->slabs_sync);
    return 0;
}
