/*
 * tier_pool.c — the host tier's slab allocator (interface in tier_pool.h; docs/design.md
 * section 7, "Tiers").
 *
 * The host tier holds a few hundred blobs at most (a GDN blob per checkpoint, a K / V blob per
 * group: megabytes each), so the allocator is the plainest that never pins on the hot path: each
 * slab keeps its blocks in an array ordered by offset that tiles the slab exactly (free and used
 * alike); an allocation takes the first free block that fits, in the oldest slab first, and
 * splits off the rest; a free marks its block free and merges it with free neighbours, so two free
 * blocks are never side by side. The descriptors live outside the slabs: a slab's bytes are only
 * ever the blobs (the copy engine writes them; nothing else there to race with). With blobs of a
 * few sizes, first fit keeps fragmentation low; when it is not enough, the cache frees its least
 * recently used host blobs until an allocation fits (cache.c).
 *
 * Pinning ahead (a pool with SQUAD_TIER_POOL_SLOW_SLABS). The thread owns nothing but the spares
 * it pinned; the slabs, their blocks and the counters belong to the pool's caller, who alone
 * allocates and frees blobs. Both sides meet under one mutex over a few numbers: the bytes held in
 * slabs (a mirror of slab_bytes), the spares' bytes, the bytes the thread is pinning and the bytes
 * the caller is pinning itself; their sum never passes the cap, so the thread pins the next spare
 * only into room that no growth has claimed. Two condition variables: `wake` tells the thread
 * there may be work (a spare was taken, the pool grew, stop), `pinned` tells the caller a pin
 * ended (a wait to settle, or to give the spares back when a blob larger than they are needs their
 * room). The thread is armed by a growth and disarmed by a failed pin (it tries again after the
 * next growth, not in a loop); it runs with every signal blocked (the process's signals are for
 * its own threads). A pthread call that fails at the start leaves the pool without its thread,
 * growing synchronously. Later calls cannot fail on a mutex and condition variables that were
 * initialised, but are checked all the same: a lock the caller cannot take refuses the growth at
 * hand rather than risk the cap; a wait or wake the thread cannot do stops it (the pool then grows
 * synchronously, with its spares still used); a wake-up of the thread that is lost costs only the
 * pin ahead it would have started (the next growth pins, as without the thread).
 */
#include "tier_pool.h"

#include <pthread.h>
#include <signal.h>
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

struct tier_ahead {
    pthread_mutex_t lock;
    pthread_cond_t wake;   /* to the thread: a spare was taken, the pool grew, or stop */
    pthread_cond_t pinned; /* to the caller: a pin ended */
    pthread_t thread;
    /* the pool's constants, copied: the thread never reads the pool itself */
    size_t cap, step;
    squad_tier_slab_get get;
    squad_tier_slab_put put;
    void *ctx;
    /* under lock */
    void *spare[SQUAD_TIER_POOL_AHEAD];
    size_t spare_size[SQUAD_TIER_POOL_AHEAD];
    int n_spares;
    size_t spare_bytes;
    size_t held;     /* the pool's slab_bytes */
    size_t pinning;  /* bytes the thread is pinning now (0: none) */
    size_t reserved; /* bytes the caller is pinning itself now */
    int armed;       /* pin ahead (set by a growth, cleared by a failed pin) */
    int stop;
};

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

/* ---- the pinning thread ----------------------------------------------------------------------- */

/* Every byte claimed against the cap: slabs, spares, and the pins in flight on either side. */
static size_t ahead_committed(const tier_ahead *a) { return a->held + a->spare_bytes + a->pinning + a->reserved; }

/* The bytes of the spare the thread should pin now (a step, or the cap's last room), or 0. */
static size_t ahead_wanted(const tier_ahead *a) {
    if (a->stop || !a->armed || a->pinning || a->n_spares >= SQUAD_TIER_POOL_AHEAD) return 0;
    const size_t committed = ahead_committed(a);
    if (committed >= a->cap) return 0;
    const size_t room = (a->cap - committed) / SQUAD_TIER_POOL_ALIGN * SQUAD_TIER_POOL_ALIGN;
    return room < a->step ? room : a->step;
}

static void *ahead_main(void *arg) {
    tier_ahead *a = arg;
    if (pthread_mutex_lock(&a->lock)) return NULL;
    while (!a->stop) {
        const size_t bytes = ahead_wanted(a);
        if (!bytes) {
            if (pthread_cond_wait(&a->wake, &a->lock)) break;
            continue;
        }
        a->pinning = bytes; /* claimed: no growth takes this room meanwhile */
        if (pthread_mutex_unlock(&a->lock)) return NULL;
        void *slab = a->get(a->ctx, bytes);
        if (pthread_mutex_lock(&a->lock)) { /* cannot hand it over: give it back */
            if (slab) a->put(a->ctx, slab);
            return NULL;
        }
        a->pinning = 0;
        if (slab) {
            a->spare[a->n_spares] = slab;
            a->spare_size[a->n_spares++] = bytes;
            a->spare_bytes += bytes;
        } else {
            a->armed = 0; /* the source refused: again after the next growth, not in a loop */
        }
        if (pthread_cond_broadcast(&a->pinned)) break;
    }
    a->stop = 1; /* also when a call failed: nothing is pinned ahead from now on, nobody waits for it */
    pthread_cond_broadcast(&a->pinned);
    pthread_mutex_unlock(&a->lock);
    return NULL;
}

/* The pool's thread, started idle; NULL when a pthread call fails (the pool grows synchronously). */
static tier_ahead *ahead_start(const squad_tier_pool *pool) {
    tier_ahead *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->cap = pool->cap;
    a->step = pool->step;
    a->get = pool->get;
    a->put = pool->put;
    a->ctx = pool->ctx;
    if (pthread_mutex_init(&a->lock, NULL)) goto no_lock;
    if (pthread_cond_init(&a->wake, NULL)) goto no_wake;
    if (pthread_cond_init(&a->pinned, NULL)) goto no_pinned;
    sigset_t all, old;
    sigfillset(&all);
    const int masked = pthread_sigmask(SIG_SETMASK, &all, &old) == 0; /* the thread inherits it */
    const int started = pthread_create(&a->thread, NULL, ahead_main, a) == 0;
    if (masked) pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (started) return a;
    pthread_cond_destroy(&a->pinned);
no_pinned:
    pthread_cond_destroy(&a->wake);
no_wake:
    pthread_mutex_destroy(&a->lock);
no_lock:
    free(a);
    return NULL;
}

/* Stops and joins the thread (a pin in flight finishes first), gives the spares back, frees a. */
static void ahead_stop(tier_ahead *a) {
    const int locked = pthread_mutex_lock(&a->lock) == 0;
    a->stop = 1;
    pthread_cond_broadcast(&a->wake);
    if (locked) pthread_mutex_unlock(&a->lock);
    if (pthread_join(a->thread, NULL)) return; /* not sure it is gone: its memory stays */
    for (int i = 0; i < a->n_spares; i++) a->put(a->ctx, a->spare[i]);
    pthread_cond_destroy(&a->pinned);
    pthread_cond_destroy(&a->wake);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

void squad_tier_pool_init(squad_tier_pool *pool, size_t cap, size_t step, squad_tier_slab_get get,
                          squad_tier_slab_put put, void *ctx, unsigned flags) {
    memset(pool, 0, sizeof *pool);
    pool->cap = cap;
    pool->step = step ? round_up(step, SQUAD_TIER_POOL_ALIGN) : SQUAD_TIER_POOL_STEP;
    pool->get = get;
    pool->put = put;
    pool->ctx = ctx;
    if ((flags & SQUAD_TIER_POOL_SLOW_SLABS) && cap > 0 && get && put) pool->ahead = ahead_start(pool);
}

int squad_tier_pool_pins_ahead(const squad_tier_pool *pool) { return pool->ahead != NULL; }

int squad_tier_pool_spares(const squad_tier_pool *pool, size_t *spare_bytes) {
    tier_ahead *a = pool->ahead;
    int n = 0;
    size_t bytes = 0;
    if (a && pthread_mutex_lock(&a->lock) == 0) {
        n = a->n_spares;
        bytes = a->spare_bytes;
        pthread_mutex_unlock(&a->lock);
    }
    if (spare_bytes) *spare_bytes = bytes;
    return n;
}

int squad_tier_pool_settle(const squad_tier_pool *pool) {
    tier_ahead *a = pool->ahead;
    if (!a || pthread_mutex_lock(&a->lock)) return -1;
    int rc = 0;
    while (!a->stop && (a->pinning || ahead_wanted(a)))
        if (pthread_cond_wait(&a->pinned, &a->lock)) {
            rc = -1;
            break;
        }
    pthread_mutex_unlock(&a->lock);
    return rc;
}

/* Room for one more block descriptor in s; 0 or -1. */
static int blocks_reserve(tier_slab *s) {
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
        if (blocks_reserve(s)) return NULL;
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

/* ---- growing ---------------------------------------------------------------------------------- */

/* The bytes of a slab pinned now for `need` within `room`: a step (or the blob, when larger), or
 * the last room when less is left (need is aligned: it still fits); 0 when need does not fit. */
static size_t grow_bytes(const squad_tier_pool *pool, size_t need, size_t room) {
    if (need > room) return 0;
    const size_t bytes = need > pool->step ? need : pool->step;
    return bytes > room ? room / SQUAD_TIER_POOL_ALIGN * SQUAD_TIER_POOL_ALIGN : bytes;
}

/* A spare of at least `need` bytes, taken into the pool's count (the thread is woken to pin the
 * next); NULL when none fits. */
static void *spare_take(tier_ahead *a, size_t need, size_t *bytes) {
    if (pthread_mutex_lock(&a->lock)) return NULL;
    void *slab = NULL;
    for (int i = 0; i < a->n_spares && !slab; i++) {
        if (a->spare_size[i] < need) continue;
        slab = a->spare[i];
        *bytes = a->spare_size[i];
        a->spare[i] = a->spare[a->n_spares - 1];
        a->spare_size[i] = a->spare_size[a->n_spares - 1];
        a->n_spares--;
        a->spare_bytes -= *bytes;
        a->held += *bytes;
        a->armed = 1;
        pthread_cond_signal(&a->wake);
    }
    pthread_mutex_unlock(&a->lock);
    return slab;
}

/* Pinned on the caller's thread, with the thread's claims counted: when the room left beside
 * the spares and a pin in flight is too small for `need`, the pin is waited for and the spares go
 * back (their room is the blob's). NULL when the cap or the source refuses. */
static void *pin_with_ahead(squad_tier_pool *pool, tier_ahead *a, size_t need, size_t *bytes) {
    void *drop[SQUAD_TIER_POOL_AHEAD];
    int n_drop = 0;
    if (pthread_mutex_lock(&a->lock)) return NULL;
    if (need > a->cap - a->held) { /* not even without the spares */
        pthread_mutex_unlock(&a->lock);
        return NULL;
    }
    if (need > a->cap - ahead_committed(a)) {
        a->armed = 0; /* no new pin while the room is freed */
        while (a->pinning)
            if (pthread_cond_wait(&a->pinned, &a->lock)) {
                pthread_mutex_unlock(&a->lock);
                return NULL;
            }
        for (int i = 0; i < a->n_spares; i++) drop[n_drop++] = a->spare[i];
        a->n_spares = 0;
        a->spare_bytes = 0;
    }
    *bytes = grow_bytes(pool, need, a->cap - ahead_committed(a));
    a->reserved = *bytes;
    pthread_mutex_unlock(&a->lock);
    for (int i = 0; i < n_drop; i++) a->put(a->ctx, drop[i]);
    void *slab = *bytes ? pool->get(pool->ctx, *bytes) : NULL;
    if (pthread_mutex_lock(&a->lock)) { /* the cap could not be kept: not this slab */
        if (slab) pool->put(pool->ctx, slab);
        return NULL;
    }
    a->reserved = 0;
    if (slab) a->held += *bytes;
    a->armed = slab != NULL; /* a failed pin is not retried ahead until the next growth */
    pthread_cond_signal(&a->wake);
    pthread_mutex_unlock(&a->lock);
    return slab;
}

/* A new slab that can hold `need` bytes: a spare pinned ahead when one fits, else pinned now;
 * NULL when the cap or the backend refuses. */
static tier_slab *slab_grow(squad_tier_pool *pool, size_t need) {
    if (pool->slab_bytes >= pool->cap || need > pool->cap - pool->slab_bytes) return NULL;
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
    size_t bytes = 0;
    int ahead = 0;
    if (pool->ahead) {
        s.base = spare_take(pool->ahead, need, &bytes);
        ahead = s.base != NULL;
        if (!s.base) s.base = pin_with_ahead(pool, pool->ahead, need, &bytes);
    } else {
        bytes = grow_bytes(pool, need, pool->cap - pool->slab_bytes);
        s.base = pool->get(pool->ctx, bytes);
    }
    if (!s.base) {
        free(s.blocks);
        return NULL;
    }
    s.bytes = bytes;
    s.blocks[0] = (tier_block){0, bytes, 0};
    s.n_blocks = 1;
    pool->slabs[pool->n_slabs] = s;
    pool->slab_bytes += bytes;
    pool->slabs_made++;
    if (ahead) pool->slabs_ahead++;
    else pool->slabs_sync++;
    return &pool->slabs[pool->n_slabs++];
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

void squad_tier_pool_destroy(squad_tier_pool *pool) {
    if (pool->ahead) ahead_stop(pool->ahead); /* first: its spares and a pin in flight come back */
    for (int k = 0; k < pool->n_slabs; k++) {
        pool->put(pool->ctx, pool->slabs[k].base);
        free(pool->slabs[k].blocks);
    }
    free(pool->slabs);
    squad_tier_pool_init(pool, pool->cap, pool->step, pool->get, pool->put, pool->ctx, 0);
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
    size_t spares = 0;
    if (squad_tier_pool_spares(pool, &spares) && pool->slab_bytes + spares > pool->cap)
        POOL_FAIL("pool: slabs %zu and spares %zu past the cap %zu", pool->slab_bytes, spares, pool->cap);
    if (slabs != pool->slab_bytes || used != pool->used_bytes || slabs > pool->cap)
        POOL_FAIL("pool: slabs %zu counted %zu (cap %zu), used %zu counted %zu", slabs, pool->slab_bytes, pool->cap,
                  used, pool->used_bytes);
    if (pool->slabs_made != pool->slabs_ahead + pool->slabs_sync)
        POOL_FAIL("pool: %llu growths, %llu ahead + %llu pinned then", pool->slabs_made, pool->slabs_ahead,
                  pool->slabs_sync);
    return 0;
}
