/*
 * cache.c — the cross-request state cache (docs/design.md section 7; interface in cache.h).
 *
 * A row is [state prefix | question suffix]. While the prefix runs, the model state is saved at a
 * few positions (checkpoints); a later row sharing those tokens restores the deepest one and
 * computes only the rest. The pieces:
 *
 *  - A checkpoint at position c: a backend blob with every GDN layer's recurrent state and conv
 *    inputs at c (save_gdn), the route its upper layers ran with (0, the trunk, without
 *    specialists), the router's feature accumulator over [0, c) (with specialists), and a pointer
 *    to its group.
 *  - A group: the checkpoints made by one row share one blob of the attention layers' K / V of
 *    [0, n) (save_kv) and a copy of the tokens [0, n). The tokens are what every lookup is
 *    verified against: a checkpoint is only used when its group's tokens equal the row's.
 *  - Placement (squad_cache_bounds): with p = state_len rounded down to `align`, checkpoints at p
 *    (the same state again), at state_len - tail rounded down (a state that grows at its end), at
 *    the multiples of `stride` (a state whose middle changes), plus extra chunk ends so no chunk is
 *    longer than the backend's largest; only positions beyond the restored one are made. One more,
 *    the fork: the deepest aligned position up to which the row shares tokens with any cached
 *    state. An agent's state changes in its middle where its history ends (a step appended, then
 *    a new page); the row's tokens diverge from the cached state there, and the next state of the
 *    same agent shares the history up to that point again, so a checkpoint there is reused by the
 *    next step instead of restarting from the last stride multiple.
 *  - Two indexes, chained hash tables keyed by a 64-bit hash of a prefix [0, pos) (pos a multiple of
 *    align): the checkpoint index (one entry per checkpoint) and the block index (one entry per
 *    aligned position of each group's tokens, for the fork). A row hashes its prefix block by
 *    block (one pass, each key extends the previous one) and probes from its deepest aligned
 *    position down; the first candidate whose position and tokens match is the deepest. The cost
 *    is a probe per block of the row plus a token comparison per candidate, whatever the number
 *    of cached states; a hash match alone never decides.
 *  - LRU and budget: checkpoints sit on one list, least recently used first. Every byte held
 *    counts: GDN blobs, K / V blobs, token copies, block entries, the structures and both indexes'
 *    bucket arrays. Before each allocation the least recently used checkpoints not pinned by an
 *    open plan are evicted to make room; when what open plans pin leaves too little, nothing is
 *    allocated (that checkpoint is not kept), so the bytes held stay within the budget however
 *    many plans are open (only the indexes' buckets, growing at a commit, may pass it, and are
 *    brought back right after). A group (its K / V, tokens and block entries) is freed with its last checkpoint. A row
 *    keeps only as many of its new checkpoints (the deepest first) as fit the budget on their own,
 *    so a budget too small for one checkpoint caches nothing and still answers the row.
 *
 *  - Images (docs/images.md): the cache sees a row's key view (image_rows.h), each image's run of
 *    <|image_pad|> replaced by negative key tokens derived from the image's identity, so keys and
 *    token checks cover what the image shows and nothing else changes. No checkpoint is placed
 *    inside such a run (a bound between two negative tokens moves down to an aligned position
 *    outside every run, or goes), so no match ever ends inside an image: a state is restored
 *    before an image or after it, never halfway. Text-only rows have no negative ids: their
 *    bounds and keys are untouched.
 *
 *  - Routes (specialists): the upper layers' state (GDN states and attention K / V from `split`
 *    on) depends on the route, so a group (its K / V) and its checkpoints belong to one route and
 *    a lookup for a route only finds that route's. A row whose route the router has not decided
 *    yet guesses the route of the deepest checkpoint it can restore (any route) and defers its
 *    commit until the router, after the row's last chunk, confirms the guess; a wrong guess drops
 *    the pending checkpoints and runs the row again under the right route from that route's deepest
 *    checkpoint (or the row start). This is the simplest correct form: the lower layers are
 *    recomputed on the second pass although their state does not depend on the route.
 *
 *  - Plans and pins: the cache never runs the model. squad_cache_plan_open looks a row up and
 *    returns a plan (the checkpoint to restore, the route, the chunk ends and which of them get
 *    checkpoints); the caller applies it (plan_apply.c, a layer above, never included here): it
 *    restores, runs the spans and saves the GDN blobs the cache hands out (pending: counted in
 *    the budget, not yet found by lookups); the commit joins them to a new group (whose K / V the
 *    caller saves) or to a cached group that already holds the row's [0, p); the close releases
 *    what is left and counts the row. A plan pins the groups
 *    it reads or adds to (a reference count per group), so several plans may be open on one
 *    checkpoint and nothing an open plan reads (the restored GDN blob, the group's K / V read in
 *    place) is evicted under it. The cache lists its open plans so squad_cache_check can verify
 *    every pin and pending byte.
 *
 *  - Tiers (docs/design.md section 7, "Tiers"): with a host budget on a backend whose blobs live in
 *    device memory, eviction from the device budget demotes a checkpoint to host memory instead of
 *    dropping it (its GDN blob, and its group's K / V once no checkpoint of the group is left on
 *    the device); a lookup whose deepest checkpoint is only in host memory promotes it back when
 *    the copy is cheaper than recomputing the tokens it saves over the deepest one on the device
 *    (cost model: bytes at the measured copy bandwidth against tokens at the measured rate of
 *    rows), else it takes the device one. Every checkpoint is in the index whichever tier holds it,
 *    and in that tier's LRU list. A group whose K / V are in host memory holds only host
 *    checkpoints; one whose K / V are on the device may hold both. The host tier has its own byte
 *    count and budget (its checkpoints' and groups' every byte); the device budget is as before
 *    less what moved down. The section "tiers" at the end holds that code, and the import / export
 *    the disk tier (cache_store.c) reads and writes through.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"
#include "hash_index.h"
#include "lru.h"
#include "tier_pool.h"
#include "util.h"

/* The cost model's first figures, before anything is measured: host-to-device copies at PCIe 4
 * x16's practical rate, and a row's recompute at the H200's 0.8B cold rate (4,096 tokens in 13 ms);
 * then each promotion and each row of at least SQUAD_TIER_MIN_ROW_TOKENS computed tokens moves
 * them by SQUAD_TIER_EWMA of the difference. */
#define SQUAD_TIER_COPY_BYTES_PER_S 20e9
#define SQUAD_TIER_ROW_S_PER_TOKEN (13e-3 / 4096)
#define SQUAD_TIER_MIN_ROW_TOKENS 256
#define SQUAD_TIER_EWMA 0.2

/* Prefix hashing: a 64-bit chain over the blocks, each block hashed from the chain so far
 * (squad_hash_ints). */
#define KEY_SEED 0x9e3779b97f4a7c15ull

/* ---- structures ------------------------------------------------------------------------------ */


struct cache_ckpt {
    squad_hnode node;     /* key: hash of the group's tokens [0, pos) */
    int pos;             /* the state after tokens [0, pos) */
    int route;           /* the route its upper layers ran with (0: the trunk) */
    void *gdn;           /* backend blob of gdn_snapshot_bytes */
    double *feat;        /* [feat_dim] router feature sum over [0, pos) (NULL without specialists) */
    int64_t feat_count;
    cache_group *group;
    squad_lru_node lru; /* in its tier's LRU list */
    int on_host;         /* gdn is a host copy (the host tier) */
};

/* A block index entry: the group's tokens [0, pos) exist (for the fork search). */
typedef struct block_entry {
    squad_hnode node;
    int pos;
    cache_group *group;
} block_entry;

struct cache_group {
    int32_t *ids;        /* tokens [0, n_pos): what lookups are verified against */
    void *kv;            /* backend blob: K / V of positions [0, n_pos) */
    block_entry *blocks; /* n_pos / align entries, one per aligned position */
    int n_pos;
    int route;           /* the route its upper layers' K / V were computed with */
    int n_ckpts;         /* freed with its last checkpoint */
    int pins;            /* open plans that read it or add to it: nothing of it is evicted */
    int n_device;        /* its checkpoints on the device (the rest are in the host tier) */
    int kv_on_host;      /* kv is a host copy: every checkpoint of it is in the host tier */
    struct cache_group *prev, *next; /* every group, for checks and teardown */
};

struct squad_cache {
    squad_backend *be;
    squad_cache_opts opts;
    squad_lru lru; /* checkpoints, least recently used first */
    cache_group *groups;
    squad_hindex ckpt_index, block_index;
    size_t n_ckpts, n_groups;
    size_t backend_bytes, host_bytes; /* host_bytes: structures, tokens, block entries (not the buckets) */
    size_t pending_bytes;             /* GDN blobs saved by open plans, not yet committed */
    squad_cache_plan *plans;          /* the open plans */
    uint64_t key_mask; /* all ones; tests narrow it to force hash collisions */
    int feat_dim;      /* router features per checkpoint (0: no specialists) */
    squad_cache_stats stats; /* the counters (the sizes are filled in on request) */
    /* the host tier (off when host_budget is 0) */
    squad_lru host_lru;      /* host-tier checkpoints, least recently used first */
    size_t host_budget;      /* opts.host_budget_bytes where the backend has device blobs, else 0 */
    size_t tier_bytes;       /* every byte of the host tier's checkpoints and groups */
    size_t n_host_ckpts;
    int tier_force;          /* the test hook: 1 always promote, -1 never, 0 the cost model */
    double copy_bytes_per_s; /* measured promotions (starts from the backend's figure) */
    double row_s_per_token;  /* measured rows: wall seconds per token computed */
    squad_tier_pool pool;    /* the host tier's blobs, carved from slabs (tier_pool.h) */
    /* where the pool's slabs come from: the backend, or a test's; slab_reserve: the pool takes
     * its whole budget when it is made (page-locked memory: never pinned while serving) */
    squad_tier_slab_get slab_get;
    squad_tier_slab_put slab_put;
    void *slab_ctx;
    size_t slab_step;
    int slab_reserve;
    double reserve_seconds; /* what the reserve took */
};

/* A checkpoint saved during a row, waiting for its group's K / V before it joins the cache. */
struct cache_pending {
    int pos;
    void *gdn; /* NULL when it is not kept (budget) or its allocation failed */
    double *feat;
    int64_t feat_count;
};

/* ---- small helpers --------------------------------------------------------------------------- */

static int align_down(int x, int align) { return x <= 0 ? 0 : x - x % align; }

/* 1 when position x (the state after tokens [0, x)) falls inside a run of an image's key tokens. */
static int inside_image(const squad_row *row, int x) {
    return x > 0 && x < row->n_ids && row->ids[x - 1] < 0 && row->ids[x] < 0;
}

/* x moved down by align until it is outside every image run (0 when nothing is). */
static int outside_image(const squad_row *row, int x, int align) {
    while (x > 0 && inside_image(row, x)) x -= align;
    return x > 0 ? x : 0;
}

/* The bounds moved out of image runs, dropping those that fall to c0 or below or repeat (the
 * list stays ascending); returns how many are left. */
static int bounds_outside_images(const squad_row *row, int align, int c0, int *bounds, int n) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        const int x = outside_image(row, bounds[i], align);
        if (x > c0 && (m == 0 || x > bounds[m - 1])) bounds[m++] = x;
    }
    return m;
}



/* A checkpoint's host bytes: its structure and its router features. */
static size_t ckpt_host(const squad_cache *c) { return sizeof(cache_ckpt) + (size_t)c->feat_dim * sizeof(double); }

static size_t ckpt_cost(const squad_cache *c) { return ckpt_host(c) + c->be->gdn_snapshot_bytes; }

static size_t group_cost(const squad_cache *c, int n_pos) {
    return sizeof(cache_group) + (size_t)n_pos * (sizeof(int32_t) + c->be->kv_bytes_per_pos) +
           (size_t)(n_pos / c->opts.align) * sizeof(block_entry);
}

static size_t bytes_held(const squad_cache *c) {
    return c->backend_bytes + c->host_bytes + c->pending_bytes + squad_hindex_bytes(&c->ckpt_index) +
           squad_hindex_bytes(&c->block_index);
}

size_t squad_cache_ckpt_cost(const squad_cache *c) { return ckpt_cost(c); }
size_t squad_cache_group_cost(const squad_cache *c, int n_positions) { return group_cost(c, n_positions); }

/* ---- placement ------------------------------------------------------------------------------- */

int squad_cache_bounds(const squad_cache_opts *o, int max_chunk, int c0, int state_len, int fork, int *out,
                       int cap) {
    return squad_cache_bounds_at(o, max_chunk, c0, state_len, fork, NULL, 0, out, cap);
}

int squad_cache_bounds_at(const squad_cache_opts *o, int max_chunk, int c0, int state_len, int fork,
                          const int *marks, int n_marks, int *out, int cap) {
    const int align = o->align;
    const int end = align_down(state_len, align);
    /* the chunk-length cap, aligned so the extra ends are checkpoint positions too; when the
     * backend's chunk is shorter than align, the span runner splits the chunks itself */
    const int step = align_down(max_chunk, align);
    /* the positions that are not stride multiples (fork, tail, end, the caller's marks), ascending */
    if (n_marks < 0 || !marks) n_marks = 0;
    if (n_marks > SQUAD_CACHE_MAX_MARKS) n_marks = SQUAD_CACHE_MAX_MARKS;
    int extra[3 + SQUAD_CACHE_MAX_MARKS], n_extra = 0;
    const int tail = o->tail > 0 ? align_down(state_len - o->tail, align) : 0;
    int candidates[3 + SQUAD_CACHE_MAX_MARKS] = {align_down(fork, align), tail, end};
    for (int i = 0; i < n_marks; i++) candidates[3 + i] = align_down(marks[i], align);
    for (int i = 0; i < 3 + n_marks; i++) {
        const int x = candidates[i];
        if (x <= c0 || x > end) continue;
        int j = n_extra++;
        for (; j > 0 && extra[j - 1] > x; j--) extra[j] = extra[j - 1];
        extra[j] = x;
    }
    long long next_stride = o->stride > 0 ? ((long long)c0 / o->stride + 1) * o->stride : LLONG_MAX;
    int n = 0, last = c0, ei = 0;
    for (;;) {
        int x;
        if (next_stride < end && (ei >= n_extra || align_down((int)next_stride, align) <= extra[ei])) {
            x = align_down((int)next_stride, align);
            next_stride += o->stride;
        } else if (ei < n_extra) {
            x = extra[ei++];
        } else {
            break;
        }
        if (x <= last) continue; /* rounding and coinciding rules can repeat a position */
        while (step > 0 && x - last > step) {
            last += step;
            if (n < cap) out[n] = last;
            n++;
        }
        if (n < cap) out[n] = x;
        n++;
        last = x;
    }
    return n;
}

/* ---- the indexes ----------------------------------------------------------------------------- */

void squad_cache_prefix_keys(const int32_t *ids, int align, int n_blocks, uint64_t *keys) {
    uint64_t h = KEY_SEED;
    for (int k = 0; k < n_blocks; k++) {
        const int32_t *block = ids + (size_t)k * align;
        h = squad_hash_ints(h, block, (size_t)align);
        /* the position joins the key so a prefix and its extension never share one */
        keys[k] = squad_hash_mix(h + (uint64_t)(k + 1) * align * KEY_SEED);
    }
}

/* The deepest checkpoint at a position <= n_blocks * align whose tokens equal ids, of `route`;
 * route < 0: of any route, one of `prefer` when the deepest position has one. */
static cache_ckpt *deepest_ckpt(const squad_cache *c, const int32_t *ids, const uint64_t *keys, int n_blocks,
                                int route, int prefer, int device_only) {
    const int align = c->opts.align;
    for (int k = n_blocks; k >= 1 && c->n_ckpts > 0; k--) {
        const uint64_t key = keys[k - 1] & c->key_mask;
        cache_ckpt *found = NULL;
        for (const squad_hnode *x = squad_hindex_chain(&c->ckpt_index, key); x; x = x->next) {
            cache_ckpt *ck = (cache_ckpt *)x;
            if (x->key != key || ck->pos != k * align || (route >= 0 && ck->route != route)) continue;
            if (device_only && ck->on_host) continue;
            if (found && (found->route == prefer || ck->route != prefer)) continue;
            /* a hash match is only a candidate: the tokens decide */
            if (memcmp(ck->group->ids, ids, (size_t)ck->pos * sizeof *ids) == 0) found = ck;
            if (found && (route >= 0 || found->route == prefer)) return found;
        }
        if (found) return found;
    }
    return NULL;
}

/* The deepest block (lo_block < block <= n_blocks) of a cached group of `route` whose tokens equal
 * ids. */
static const block_entry *deepest_block(const squad_cache *c, const int32_t *ids, const uint64_t *keys, int lo_block,
                                        int n_blocks, int route) {
    const int align = c->opts.align;
    for (int k = n_blocks; k > lo_block && c->n_groups > 0; k--) {
        const uint64_t key = keys[k - 1] & c->key_mask;
        for (const squad_hnode *x = squad_hindex_chain(&c->block_index, key); x; x = x->next) {
            const block_entry *b = (const block_entry *)x;
            if (x->key != key || b->pos != k * align || b->group->route != route) continue;
            if (memcmp(b->group->ids, ids, (size_t)b->pos * sizeof *ids) == 0) return b;
        }
    }
    return NULL;
}

/* squad_cache_lookup for one route (route < 0: any). */
static int lookup_route(const squad_cache *c, const int32_t *ids, int n, int route) {
    const int n_blocks = n / c->opts.align;
    if (n_blocks <= 0 || c->n_ckpts == 0) return 0;
    uint64_t *keys = malloc((size_t)n_blocks * sizeof *keys);
    if (!keys) return 0;
    squad_cache_prefix_keys(ids, c->opts.align, n_blocks, keys);
    const cache_ckpt *x = deepest_ckpt(c, ids, keys, n_blocks, route, 0, 0);
    free(keys);
    return x ? x->pos : 0;
}

int squad_cache_lookup(const squad_cache *c, const int32_t *ids, int n) { return lookup_route(c, ids, n, -1); }

int squad_cache_restorable(const squad_cache *c, const squad_row *row, int route) {
    if (!squad_cache_eligible(c, row)) return 0;
    return lookup_route(c, row->ids, align_down(row->state_len, c->opts.align), route);
}

/* ---- LRU and eviction ------------------------------------------------------------------------ */

static cache_ckpt *ckpt_of(squad_lru_node *n) { return SQUAD_LRU_ENTRY(n, cache_ckpt, lru); }
static const cache_ckpt *ckpt_of_const(const squad_lru_node *n) {
    return SQUAD_LRU_ENTRY(n, const cache_ckpt, lru);
}

/* The tiers (the section at the end). */
static void tier_host_free(squad_cache *c, void *p);
static void *tier_slab_get(void *ctx, size_t bytes);
static void tier_slab_put(void *ctx, void *slab);
static int tier_pool_setup(squad_cache *c, squad_err *err);
static int tier_sync(const squad_cache *c);
static int tier_demote(squad_cache *c, cache_ckpt *k);
static void group_lost_device(squad_cache *c, cache_group *g);

static void group_free(squad_cache *c, cache_group *g) {
    if (g->prev) g->prev->next = g->next;
    else c->groups = g->next;
    if (g->next) g->next->prev = g->prev;
    const int n_blocks = g->n_pos / c->opts.align;
    for (int i = 0; i < n_blocks; i++) squad_hindex_remove(&c->block_index, &g->blocks[i].node);
    squad_hindex_fit(&c->block_index);
    if (g->kv_on_host) {
        tier_host_free(c, g->kv);
        c->tier_bytes -= group_cost(c, g->n_pos);
    } else {
        c->be->release(c->be, g->kv);
        c->backend_bytes -= (size_t)g->n_pos * c->be->kv_bytes_per_pos;
        c->host_bytes -= group_cost(c, g->n_pos) - (size_t)g->n_pos * c->be->kv_bytes_per_pos;
    }
    free(g->blocks);
    free(g->ids);
    free(g);
    c->n_groups--;
}

static void ckpt_evict(squad_cache *c, cache_ckpt *k) {
    squad_hindex_remove(&c->ckpt_index, &k->node);
    squad_hindex_fit(&c->ckpt_index);
    if (k->on_host) {
        squad_lru_unlink(&c->host_lru, &k->lru);
        tier_host_free(c, k->gdn);
        c->tier_bytes -= ckpt_cost(c);
        c->n_host_ckpts--;
        c->stats.host_evicted++;
    } else {
        squad_lru_unlink(&c->lru, &k->lru);
        c->be->release(c->be, k->gdn);
        c->backend_bytes -= c->be->gdn_snapshot_bytes;
        c->host_bytes -= ckpt_host(c);
        k->group->n_device--;
        c->stats.evicted++;
    }
    free(k->feat);
    c->n_ckpts--;
    cache_group *g = k->group;
    const int was_host = k->on_host;
    free(k);
    if (--g->n_ckpts == 0) group_free(c, g); /* its K / V go with its last checkpoint */
    else if (!was_host) group_lost_device(c, g);
}

/* Evicts least recently used checkpoints until `need` more bytes fit the budget, leaving those of
 * pinned groups (an open plan restored from one, reads its K / V, or adds checkpoints to it).
 * 1 when they fit then, 0 when what is pinned leaves too little: the caller allocates nothing, so
 * the bytes held never pass the budget however many plans are open. */
static int make_room(squad_cache *c, size_t need) {
    cache_ckpt *k = ckpt_of(c->lru.oldest);
    while (k && bytes_held(c) + need > c->opts.budget_bytes) {
        cache_ckpt *next = ckpt_of(k->lru.next); /* an unpinned group cannot own it once k is gone */
        if (k->group->pins == 0 && !tier_demote(c, k)) ckpt_evict(c, k); /* down a tier, else out */
        k = next;
    }
    return bytes_held(c) + need <= c->opts.budget_bytes;
}

/* After a row, and after a commit (whose index buckets may have grown): least recently used first
 * until the bytes held are within the budget. */
static void evict_to_budget(squad_cache *c) { (void)make_room(c, 0); }

/* ---- lifetime -------------------------------------------------------------------------------- */

squad_cache *squad_cache_new(squad_backend *be, const squad_cache_opts *opts, squad_err *err) {
    if (!be || !opts) {
        squad_fail(err, SQUAD_E_INVALID, "state cache: no backend or options");
        return NULL;
    }
    if (opts->align <= 0 || opts->tail < 0 || opts->stride < 0 || opts->min_prefix < 0 || opts->max_slots < 1) {
        squad_fail(err, SQUAD_E_INVALID,
                   "state cache: bad options (align %d, tail %d, stride %d, min_prefix %d, max_slots %d)",
                   opts->align, opts->tail, opts->stride, opts->min_prefix, opts->max_slots);
        return NULL;
    }
    squad_cache *c = squad_calloc(1, sizeof *c, err);
    if (!c) return NULL;
    c->be = be;
    c->opts = *opts;
    c->key_mask = ~(uint64_t)0;
    /* the host tier only where the checkpoints are not host memory already */
    c->host_budget = be->blob_to_host && be->blob_from_host ? opts->host_budget_bytes : 0;
    c->copy_bytes_per_s = be->host_copy_bytes_per_s > 0 ? be->host_copy_bytes_per_s : SQUAD_TIER_COPY_BYTES_PER_S;
    c->row_s_per_token = SQUAD_TIER_ROW_S_PER_TOKEN;
    c->slab_get = tier_slab_get;
    c->slab_put = tier_slab_put;
    c->slab_ctx = be;
    c->slab_reserve = be->host_alloc != NULL; /* page-locked: pinned now, never while serving */
    if (tier_pool_setup(c, err)) {
        squad_cache_free(c);
        return NULL;
    }
    return c;
}

void squad_cache_free(squad_cache *c) {
    if (!c) return;
    while (c->plans) squad_cache_plan_close(c, c->plans, SQUAD_PLAN_FAILED, NULL, 0, NULL);
    while (c->host_lru.oldest) ckpt_evict(c, ckpt_of(c->host_lru.oldest));
    while (c->lru.oldest) ckpt_evict(c, ckpt_of(c->lru.oldest));
    tier_sync(c); /* no copy still uses the slabs */
    squad_tier_pool_destroy(&c->pool);
    squad_hindex_free(&c->ckpt_index);
    squad_hindex_free(&c->block_index);
    free(c);
}

int squad_cache_set_feat_dim(squad_cache *c, int dim, squad_err *err) {
    if (c->n_ckpts > 0 || dim < 0) return squad_fail(err, SQUAD_E_INVALID, "state cache: router features set late");
    c->feat_dim = dim;
    return 0;
}

squad_backend *squad_cache_backend(const squad_cache *c) { return c->be; }
int squad_cache_feat_dim(const squad_cache *c) { return c->feat_dim; }

void squad_cache_debug_key_bits(squad_cache *c, int bits) {
    if (c->n_ckpts == 0) c->key_mask = bits >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << bits) - 1);
}

/* ---- a row ----------------------------------------------------------------------------------- */

int squad_cache_eligible(const squad_cache *c, const squad_row *row) {
    if (!c || !row || c->opts.budget_bytes == 0) return 0;
    if (row->state_len < 0 || row->state_len > row->n_ids) return 0;
    const int p = align_down(row->state_len, c->opts.align);
    if (p <= 0 || p < c->opts.min_prefix) return 0;
    if (row->n_slots < 1 || row->n_slots > c->opts.max_slots) return 0;
    for (int i = 0; i < row->n_slots; i++)
        if (row->slots[i] < p) return 0;
    return row->n_ids <= c->be->max_context;
}

/* How many of n new checkpoints (the deepest first) fit the budget on their own, with their group
 * when one is needed and the indexes' buckets for them. */
static int plan_keep(const squad_cache *c, int n, int p, int new_group) {
    const size_t budget = c->opts.budget_bytes;
    const size_t blocks = new_group ? squad_hindex_buckets_for((size_t)(p / c->opts.align)) * sizeof(squad_hnode *) : 0;
    const size_t base = (new_group ? group_cost(c, p) : 0) + blocks;
    int m = n;
    while (m > 0 && base + (size_t)m * ckpt_cost(c) + squad_hindex_buckets_for((size_t)m) * sizeof(squad_hnode *) > budget) m--;
    return m;
}

static void plan_free(squad_cache_plan *pl) {
    free(pl->bounds_buf);
    free(pl->keys);
    free(pl->pending);
    pl->bounds_buf = NULL;
    pl->keys = NULL;
    pl->pending = NULL;
}

static void pin(cache_group *g) {
    if (g) g->pins++;
}

static void unpin(cache_group *g) {
    if (g) g->pins--;
}

static cache_ckpt *tier_choose(squad_cache *c, const int32_t *ids, const uint64_t *keys, int n_blocks, int route,
                               int prefer, cache_ckpt *host);

/* The lookup and the placement of squad_cache_plan_open, before anything is pinned. */
static int plan_row(squad_cache *c, const squad_row *row, int end_only, const int *marks, int n_marks, int route,
                    int prefer, squad_cache_plan *pl, squad_err *err) {
    const int align = c->opts.align;
    pl->end_only = end_only;
    pl->p = outside_image(row, align_down(row->state_len, align), align);
    const int n_blocks = pl->p / align;
    pl->keys = squad_malloc((size_t)n_blocks * sizeof *pl->keys, err);
    if (!pl->keys) return SQUAD_E_NOMEM;
    squad_cache_prefix_keys(row->ids, align, n_blocks, pl->keys);
    pl->best = deepest_ckpt(c, row->ids, pl->keys, n_blocks, route, prefer, 0);
    if (pl->best && pl->best->on_host) /* only in host memory: promote it, or take the device's */
        pl->best = tier_choose(c, row->ids, pl->keys, n_blocks, route, prefer, pl->best);
    pl->route = route >= 0 ? route : pl->best ? pl->best->route : prefer;
    pl->c0 = pl->best ? pl->best->pos : 0;
    if (pl->c0 >= pl->p) return 0; /* the same state again: nothing of the prefix to compute */

    /* how far the row shares tokens with any cached state (at least c0): a group holding all of
     * [0, p) takes the new checkpoints; else the fork becomes a checkpoint */
    int fork = 0;
    const block_entry *shared = deepest_block(c, row->ids, pl->keys, pl->c0 / align, n_blocks, pl->route);
    if (shared && shared->pos == pl->p && !shared->group->kv_on_host) pl->share = shared->group;
    else if (shared) fork = shared->pos;

    /* end-only: no tail, stride or fork positions; the chunk-cap ends still bound chunks (p is the
     * last bound either way, and only it is kept) */
    squad_cache_opts bo = c->opts;
    if (end_only) { /* the caller's marks give way too */
        bo.tail = bo.stride = 0;
        fork = 0;
        n_marks = 0;
    }
    const int max_chunk = c->be->max_chunk;
    const int nb = squad_cache_bounds_at(&bo, max_chunk, pl->c0, row->state_len, fork, marks, n_marks, NULL, 0);
    pl->bounds_buf = squad_malloc((size_t)nb * sizeof *pl->bounds_buf, err);
    pl->pending = squad_calloc((size_t)nb, sizeof *pl->pending, err);
    if (!pl->bounds_buf || !pl->pending) return SQUAD_E_NOMEM;
    pl->n_bounds = squad_cache_bounds_at(&bo, max_chunk, pl->c0, row->state_len, fork, marks, n_marks, pl->bounds_buf, nb);
    pl->n_bounds = bounds_outside_images(row, align, pl->c0, pl->bounds_buf, pl->n_bounds);
    const int wanted = end_only && pl->n_bounds > 0 ? 1 : pl->n_bounds;
    pl->first_kept = pl->n_bounds - plan_keep(c, wanted, pl->p, pl->share == NULL);
    return 0;
}

int squad_cache_plan_open(squad_cache *c, const squad_row *row, int end_only, int route, int prefer,
                          squad_cache_plan *pl, squad_err *err) {
    return squad_cache_plan_open_at(c, row, end_only, NULL, 0, route, prefer, pl, err);
}

int squad_cache_plan_open_at(squad_cache *c, const squad_row *row, int end_only, const int *marks, int n_marks,
                             int route, int prefer, squad_cache_plan *pl, squad_err *err) {
    memset(pl, 0, sizeof *pl);
    if (!squad_cache_eligible(c, row)) return squad_fail(err, SQUAD_E_INVALID, "row is not eligible for the state cache");
    int rc = plan_row(c, row, end_only, marks, n_marks, route, prefer, pl, err);
    if (rc) {
        plan_free(pl);
        return rc;
    }
    pl->bounds = pl->bounds_buf;
    if (pl->best) { /* in use: the most recent, and its group pinned */
        pin(pl->best->group);
        squad_lru_unlink(&c->lru, &pl->best->lru);
        squad_lru_push_newest(&c->lru, &pl->best->lru);
        pl->gdn = pl->best->gdn;
        pl->kv = pl->best->group->kv;
        pl->kv_positions = pl->best->group->n_pos;
        pl->feat = pl->best->feat;
        pl->feat_count = pl->best->feat_count;
    }
    pin(pl->share);
    pl->t_open = squad_now_seconds();
    pl->next = c->plans;
    if (c->plans) c->plans->prev = pl;
    c->plans = pl;
    return 0;
}

/* A pending checkpoint's blob back to the backend. */
static void pending_drop(squad_cache *c, cache_pending *pc) {
    if (!pc->gdn) return;
    free(pc->feat);
    pc->feat = NULL;
    c->be->release(c->be, pc->gdn);
    c->pending_bytes -= ckpt_cost(c);
    pc->gdn = NULL;
}

static void pending_release(squad_cache *c, squad_cache_plan *pl) {
    for (int i = 0; pl->pending && i < pl->n_bounds; i++) pending_drop(c, &pl->pending[i]);
}

void *squad_cache_plan_blob(squad_cache *c, squad_cache_plan *pl, int i, const squad_router_feat *feat) {
    squad_backend *be = c->be;
    squad_err alloc_err = {0};
    if (i < pl->first_kept || i >= pl->n_bounds || pl->pending[i].gdn) return NULL;
    cache_pending *pc = &pl->pending[i];
    pc->pos = pl->bounds[i];
    if (!make_room(c, ckpt_cost(c))) return NULL; /* what open plans pin leaves no room */
    if (c->feat_dim > 0) {
        pc->feat = calloc((size_t)c->feat_dim, sizeof(double));
        if (!pc->feat) return NULL;
        if (feat) memcpy(pc->feat, feat->sum, (size_t)c->feat_dim * sizeof(double));
        pc->feat_count = feat ? feat->count : 0;
    }
    pc->gdn = be->alloc(be, be->gdn_snapshot_bytes, &alloc_err);
    if (!pc->gdn) {
        free(pc->feat);
        pc->feat = NULL;
        return NULL;
    }
    c->pending_bytes += ckpt_cost(c);
    return pc->gdn;
}

void squad_cache_plan_drop(squad_cache *c, squad_cache_plan *pl, int i) {
    if (i >= 0 && i < pl->n_bounds) pending_drop(c, &pl->pending[i]);
}

/* A new group for the row's tokens [0, p) and their block entries, with a K / V blob of p
 * positions still to fill; NULL when memory is short. Not yet listed or indexed (group_link). */
static cache_group *group_new(squad_cache *c, const squad_row *row, int p, int route) {
    squad_backend *be = c->be;
    squad_err alloc_err = {0};
    const int n_blocks = p / c->opts.align;
    if (!make_room(c, group_cost(c, p))) return NULL;
    cache_group *g = calloc(1, sizeof *g);
    int32_t *ids = malloc((size_t)p * sizeof *ids);
    block_entry *blocks = calloc((size_t)n_blocks, sizeof *blocks);
    void *kv = (g && ids && blocks && squad_hindex_reserve(&c->block_index, (size_t)n_blocks) == 0)
                   ? be->alloc(be, (size_t)p * be->kv_bytes_per_pos, &alloc_err)
                   : NULL;
    if (!kv) {
        free(g);
        free(ids);
        free(blocks);
        squad_hindex_fit(&c->block_index);
        return NULL;
    }
    memcpy(ids, row->ids, (size_t)p * sizeof *ids);
    g->ids = ids;
    g->kv = kv;
    g->blocks = blocks;
    g->n_pos = p;
    g->route = route;
    return g;
}

/* A made group whose K / V were not saved: back to the allocator. */
static void group_discard(squad_cache *c, cache_group *g) {
    c->be->release(c->be, g->kv);
    free(g->ids);
    free(g->blocks);
    free(g);
    squad_hindex_fit(&c->block_index);
}

/* A made group joins the cache: listed, its blocks indexed, its bytes counted. */
static void group_link(squad_cache *c, cache_group *g, const uint64_t *keys) {
    const int align = c->opts.align, n_blocks = g->n_pos / align;
    const size_t kv_bytes = (size_t)g->n_pos * c->be->kv_bytes_per_pos;
    for (int i = 0; i < n_blocks; i++) {
        g->blocks[i].node.key = keys[i] & c->key_mask;
        g->blocks[i].pos = (i + 1) * align;
        g->blocks[i].group = g;
        squad_hindex_insert(&c->block_index, &g->blocks[i].node);
    }
    g->next = c->groups;
    if (c->groups) c->groups->prev = g;
    c->groups = g;
    c->n_groups++;
    c->backend_bytes += kv_bytes;
    c->host_bytes += group_cost(c, g->n_pos) - kv_bytes;
}

void squad_cache_commit_begin(squad_cache *c, squad_cache_plan *pl, const squad_row *row, void **kv, int *n) {
    *kv = NULL;
    *n = 0;
    int kept = 0;
    for (int i = 0; i < pl->n_bounds; i++) kept += pl->pending[i].gdn != NULL;
    if (kept == 0 || pl->share || pl->made) return;
    pl->made = group_new(c, row, pl->p, pl->route);
    if (!pl->made) {
        pending_release(c, pl);
        return;
    }
    *kv = pl->made->kv;
    *n = pl->p;
}

/* The plan's pending checkpoints join group g: index, the recent end of the LRU list (shallow
 * first, so the deepest is the most recent). */
static void commit(squad_cache *c, squad_cache_plan *pl, cache_group *g) {
    const int align = c->opts.align;
    for (int i = 0; i < pl->n_bounds; i++) {
        cache_pending *pc = &pl->pending[i];
        if (!pc->gdn) continue;
        cache_ckpt *k = calloc(1, sizeof *k);
        if (!k || squad_hindex_reserve(&c->ckpt_index, 1)) {
            free(k);
            pending_drop(c, pc);
            continue;
        }
        k->node.key = pl->keys[pc->pos / align - 1] & c->key_mask;
        k->pos = pc->pos;
        k->route = pl->route;
        k->gdn = pc->gdn;
        k->feat = pc->feat;
        k->feat_count = pc->feat_count;
        pc->feat = NULL;
        k->group = g;
        pc->gdn = NULL;
        c->pending_bytes -= ckpt_cost(c);
        squad_hindex_insert(&c->ckpt_index, &k->node);
        g->n_ckpts++;
        g->n_device++;
        c->n_ckpts++;
        c->backend_bytes += c->be->gdn_snapshot_bytes;
        c->host_bytes += ckpt_host(c);
        squad_lru_push_newest(&c->lru, &k->lru);
        c->stats.checkpoints_made++;
        if (k->pos > pl->deepest_new) pl->deepest_new = k->pos;
    }
}

void squad_cache_commit_end(squad_cache *c, squad_cache_plan *pl, int saved) {
    cache_group *made = pl->made;
    pl->made = NULL;
    if (saved) {
        if (made) group_discard(c, made);
        pending_release(c, pl);
        return;
    }
    if (made) {
        group_link(c, made, pl->keys);
        commit(c, pl, made);
        if (made->n_ckpts == 0) { /* none joined (memory short): the new group goes with them */
            group_free(c, made);
            return;
        }
        made->pins++; /* read by the rest of the row until the plan closes */
        pl->share = made;
    } else if (pl->share) {
        commit(c, pl, pl->share);
    }
    evict_to_budget(c); /* the indexes' buckets may have grown; what the plan pins stays */
}

static void tier_note_row(squad_cache *c, uint64_t computed, double seconds);

void squad_cache_plan_close(squad_cache *c, squad_cache_plan *pl, squad_plan_end how, const squad_row *row,
                            uint64_t computed, squad_result *out) {
    pending_release(c, pl); /* nothing, unless the row failed or was mispredicted */
    if (pl->made) { /* a commit begun and never ended */
        group_discard(c, pl->made);
        pl->made = NULL;
    }
    if (pl->best) unpin(pl->best->group);
    unpin(pl->share);
    if (pl->prev) pl->prev->next = pl->next;
    else if (c->plans == pl) c->plans = pl->next;
    if (pl->next) pl->next->prev = pl->prev;
    pl->prev = pl->next = NULL;
    plan_free(pl);
    if (how == SQUAD_PLAN_RETRY) {
        c->stats.mispredictions++;
        return;
    }
    evict_to_budget(c);
    if (how != SQUAD_PLAN_DONE) return;

    /* what the row made restorable, if its deepest new checkpoint survived the eviction above (it
     * is the most recent, so only a budget below one checkpoint could take it) */
    if (pl->deepest_new > pl->c0 && lookup_route(c, row->ids, pl->deepest_new, pl->route) == pl->deepest_new)
        out->cache_written = pl->deepest_new - pl->c0;
    if (pl->n_bounds > 0 && pl->first_kept == pl->n_bounds) c->stats.uncacheable++;
    c->stats.rows++;
    if (pl->c0 == pl->p) c->stats.hits++;
    else if (pl->c0 > 0) c->stats.partial++;
    else c->stats.cold++;
    c->stats.tokens_reused += (uint64_t)pl->c0;
    c->stats.tokens_computed += computed;
    tier_note_row(c, computed, squad_now_seconds() - pl->t_open);
}

int squad_cache_pins(const squad_cache *c, const int32_t *ids, int pos) {
    if (pos <= 0 || pos % c->opts.align) return -1;
    for (const cache_ckpt *k = ckpt_of_const(c->lru.oldest); k; k = ckpt_of_const(k->lru.next))
        if (k->pos == pos && memcmp(k->group->ids, ids, (size_t)pos * sizeof *ids) == 0) return k->group->pins;
    return -1;
}

void squad_cache_clear(squad_cache *c) {
    if (!c) return;
    cache_ckpt *k = ckpt_of(c->lru.oldest);
    while (k) {
        cache_ckpt *next = ckpt_of(k->lru.next);
        if (k->group->pins == 0) { /* what an open plan reads stays */
            ckpt_evict(c, k);
            c->stats.evicted--; /* a clear is not an eviction */
        }
        k = next;
    }
    while (c->host_lru.oldest) { /* host-tier groups are never pinned */
        ckpt_evict(c, ckpt_of(c->host_lru.oldest));
        c->stats.host_evicted--;
    }
}

/* ---- statistics and checks ------------------------------------------------------------------- */

void squad_cache_get_stats(const squad_cache *c, squad_cache_stats *out) {
    memset(out, 0, sizeof *out);
    if (!c) return;
    *out = c->stats;
    out->checkpoints = c->n_ckpts;
    out->groups = c->n_groups;
    out->bytes_held = bytes_held(c);
    out->budget_bytes = c->opts.budget_bytes;
    out->host_checkpoints = c->n_host_ckpts;
    out->host_bytes_held = c->tier_bytes;
    out->host_budget_bytes = c->host_budget;
    out->host_slabs_reserved = c->pool.slabs_reserved;
    out->host_slabs_sync = c->pool.slabs_sync;
    out->host_reserve_seconds = c->reserve_seconds;
}

void squad_cache_bytes(const squad_cache *c, size_t *backend_bytes, size_t *host_bytes) {
    *backend_bytes = c->backend_bytes;
    *host_bytes = c->host_bytes + c->pending_bytes + squad_hindex_bytes(&c->ckpt_index) + squad_hindex_bytes(&c->block_index);
}

#define CHECK_FAIL(...)                                                                                       \
    do {                                                                                                      \
        if (why && why_len) snprintf(why, why_len, __VA_ARGS__);                                              \
        return -1;                                                                                            \
    } while (0)

int squad_cache_check(const squad_cache *c, char *why, size_t why_len) {
    const int align = c->opts.align;
    const size_t kvb = c->be->kv_bytes_per_pos;
    size_t be_bytes = 0, host = 0, tier = 0, n_groups = 0, n_ckpts = 0, n_host = 0, n_blocks = 0, in_table;
    uint64_t *keys = NULL;
    for (const cache_group *g = c->groups; g; g = g->next) {
        if (g->next && g->next->prev != g) CHECK_FAIL("group list links broken");
        int count = 0, on_device = 0;
        for (const cache_ckpt *k = ckpt_of_const(c->lru.oldest); k; k = ckpt_of_const(k->lru.next)) on_device += k->group == g;
        count = on_device;
        for (const cache_ckpt *k = ckpt_of_const(c->host_lru.oldest); k; k = ckpt_of_const(k->lru.next)) count += k->group == g;
        if (count != g->n_ckpts || count == 0) CHECK_FAIL("group holds %d checkpoints, counts %d", count, g->n_ckpts);
        if (on_device != g->n_device || (g->kv_on_host && on_device > 0) || (!g->kv_on_host && on_device == 0))
            CHECK_FAIL("group with %d checkpoints on the device (counts %d), K / V %s", on_device, g->n_device,
                       g->kv_on_host ? "in host memory" : "on the device");
        int pins = 0;
        for (const squad_cache_plan *pl = c->plans; pl; pl = pl->next)
            pins += (pl->best && pl->best->group == g) + (pl->share == g);
        if (pins != g->pins) CHECK_FAIL("group pinned %d times by open plans, counts %d", pins, g->pins);
        const int nb = g->n_pos / align;
        uint64_t *nk = realloc(keys, (size_t)(nb > 0 ? nb : 1) * sizeof *keys);
        if (!nk) {
            free(keys);
            CHECK_FAIL("out of memory");
        }
        keys = nk;
        squad_cache_prefix_keys(g->ids, align, nb, keys);
        for (int i = 0; i < nb; i++) {
            const block_entry *b = &g->blocks[i];
            if (b->group != g || b->pos != (i + 1) * align || b->node.key != (keys[i] & c->key_mask) ||
                !squad_hindex_holds(&c->block_index, &b->node)) {
                free(keys);
                CHECK_FAIL("block entry %d of a group of %d positions is wrong", i, g->n_pos);
            }
        }
        n_blocks += (size_t)nb;
        if (g->kv_on_host) {
            tier += group_cost(c, g->n_pos);
        } else {
            be_bytes += (size_t)g->n_pos * kvb;
            host += group_cost(c, g->n_pos) - (size_t)g->n_pos * kvb;
        }
        n_groups++;
    }
    for (int on_host = 0; on_host <= 1; on_host++) {
    const squad_lru *list = on_host ? &c->host_lru : &c->lru;
    const squad_lru_node *prev = NULL;
    for (const cache_ckpt *k = ckpt_of_const(list->oldest); k; prev = &k->lru, k = ckpt_of_const(k->lru.next)) {
        if (k->lru.prev != prev || k->on_host != on_host) {
            free(keys);
            CHECK_FAIL("LRU links broken at checkpoint %d (or it is in the other tier's list)", k->pos);
        }
        if (k->pos <= 0 || k->pos % align || k->pos > k->group->n_pos) {
            free(keys);
            CHECK_FAIL("checkpoint at %d in a group of %d positions", k->pos, k->group->n_pos);
        }
        /* its key is its group's block key at its position */
        if (k->node.key != k->group->blocks[k->pos / align - 1].node.key || !squad_hindex_holds(&c->ckpt_index, &k->node)) {
            free(keys);
            CHECK_FAIL("checkpoint at %d: wrong key or missing from the index", k->pos);
        }
        if (k->route != k->group->route) {
            free(keys);
            CHECK_FAIL("checkpoint at %d of route %d in a group of route %d", k->pos, k->route, k->group->route);
        }
        if (on_host) {
            tier += ckpt_cost(c);
            n_host++;
        } else {
            be_bytes += c->be->gdn_snapshot_bytes;
            host += ckpt_host(c);
        }
        n_ckpts++;
    }
    if (prev != list->newest) {
        free(keys);
        CHECK_FAIL("LRU tail is wrong");
    }
    }
    free(keys);
    if (tier != c->tier_bytes || n_host != c->n_host_ckpts || tier > c->host_budget)
        CHECK_FAIL("host tier: %zu bytes counted %zu (budget %zu), %zu checkpoints counted %zu", tier, c->tier_bytes,
                   c->host_budget, n_host, c->n_host_ckpts);
    size_t pending = 0;
    for (const squad_cache_plan *pl = c->plans; pl; pl = pl->next) {
        if (pl->next && pl->next->prev != pl) CHECK_FAIL("open plan links broken");
        for (int i = 0; i < pl->n_bounds; i++) pending += pl->pending[i].gdn ? ckpt_cost(c) : 0;
    }
    if (squad_hindex_check(&c->ckpt_index, &in_table) || in_table != n_ckpts || n_ckpts != c->n_ckpts)
        CHECK_FAIL("checkpoint index: %zu entries, %zu listed, %zu counted", in_table, n_ckpts, c->n_ckpts);
    if (squad_hindex_check(&c->block_index, &in_table) || in_table != n_blocks)
        CHECK_FAIL("block index: %zu entries, groups have %zu", in_table, n_blocks);
    if (n_groups != c->n_groups) CHECK_FAIL("%zu groups listed, %zu counted", n_groups, c->n_groups);
    if (be_bytes != c->backend_bytes || host != c->host_bytes || c->pending_bytes != pending)
        CHECK_FAIL("bytes: backend %zu counted %zu, host %zu counted %zu, pending %zu counted %zu", be_bytes,
                   c->backend_bytes, host, c->host_bytes, pending, c->pending_bytes);
    return 0;
}

/* ---- tiers: the host tier under the device budget ------------------------------------------- */

/* The pool's slabs: the backend's page-locked memory, or malloc where blobs are host memory. */
static void *tier_slab_get(void *ctx, size_t bytes) {
    squad_backend *be = ctx;
    squad_err e = {0};
    return be->host_alloc ? be->host_alloc(be, bytes, &e) : malloc(bytes);
}

static void tier_slab_put(void *ctx, void *slab) {
    squad_backend *be = ctx;
    if (be->host_alloc) be->host_release(be, slab);
    else free(slab);
}

/* The pool over the host budget, made again: its whole budget reserved when the slabs are pinned
 * (tier_pool.c says why), else empty, growing as blobs need slabs. A reserve the system refuses
 * fails: the slabs it took stay in the pool (squad_cache_free gives them back). */
static int tier_pool_setup(squad_cache *c, squad_err *err) {
    squad_tier_pool_destroy(&c->pool);
    squad_tier_pool_init(&c->pool, c->host_budget, c->slab_step, c->slab_get, c->slab_put, c->slab_ctx);
    c->reserve_seconds = 0;
    if (!c->slab_reserve || c->host_budget == 0) return 0;
    const double t0 = squad_now_seconds();
    const int rc = squad_tier_pool_reserve(&c->pool);
    c->reserve_seconds = squad_now_seconds() - t0;
    if (rc)
        return squad_fail(err, SQUAD_E_NOMEM,
                          "host tier: could pin only %.0f of %.0f MB of host memory (page-locked memory refused: the "
                          "system's limit on locked memory or its free RAM); lower --cache-host-mb",
                          (double)c->pool.slab_bytes / (1 << 20), (double)c->host_budget / (1 << 20));
    return 0;
}

/* Waits for the copies queued (before the host thread reads or writes host-tier bytes). */
static int tier_sync(const squad_cache *c) {
    squad_err e = {0};
    return c->be->tier_sync ? c->be->tier_sync(c->be, &e) : 0;
}

/* A host-tier blob from the pool; when its slabs are fragmented (the budget has room, the slabs do
 * not), the least recently used unpinned host checkpoints go until it fits. NULL when nothing is
 * left to free. */
static void *tier_host_alloc(squad_cache *c, size_t bytes) {
    for (;;) {
        void *p = squad_tier_pool_alloc(&c->pool, bytes);
        if (p) return p;
        cache_ckpt *k = ckpt_of(c->host_lru.oldest);
        while (k && k->group->pins > 0) k = ckpt_of(k->lru.next);
        if (!k) return NULL;
        ckpt_evict(c, k);
    }
}

static void tier_host_free(squad_cache *c, void *p) { squad_tier_pool_free(&c->pool, p); }

/* 1 when a blob of `bytes` can ever come from the pool: a reserved pool's slabs are a step each, so
 * a larger blob (a long group's K / V) is not demoted, and nothing is evicted trying. */
static int tier_blob_fits(const squad_cache *c, size_t bytes) { return bytes <= squad_tier_pool_max_blob(&c->pool); }

/* Bytes from a backend blob to host memory and back (memcpy where blobs are host memory). The
 * backend's copies are queued in order on its copy stream (backend.h), so the bookkeeping may treat
 * them as done: every later reader is ordered after them, and the host thread syncs before it
 * touches host-tier bytes itself. */
static int tier_copy_down(squad_cache *c, void *host, const void *blob, size_t bytes) {
    squad_err e = {0};
    if (c->be->blob_to_host) return c->be->blob_to_host(c->be, host, blob, bytes, &e);
    memcpy(host, blob, bytes);
    return 0;
}

static int tier_copy_up(squad_cache *c, void *blob, const void *host, size_t bytes) {
    squad_err e = {0};
    if (c->be->blob_from_host) return c->be->blob_from_host(c->be, blob, host, bytes, &e);
    memcpy(blob, host, bytes);
    return 0;
}

/* A device blob whose bytes were just queued down to host memory: released after that copy. */
static void tier_release_copied(squad_cache *c, void *blob) {
    if (c->be->release_copied) c->be->release_copied(c->be, blob);
    else c->be->release(c->be, blob);
}

int squad_cache_tier_pays(double bytes, int tokens_saved, double copy_bytes_per_s, double row_s_per_token) {
    return copy_bytes_per_s > 0 && bytes / copy_bytes_per_s < (double)tokens_saved * row_s_per_token;
}

/* The copy bandwidth the cost model uses: the backend's (measured by its copies) where it copies
 * asynchronously, else the cache's own measure of its memcpy promotions. */
static double tier_copy_rate(const squad_cache *c) {
    return c->be->blob_from_host && c->be->host_copy_bytes_per_s > 0 ? c->be->host_copy_bytes_per_s
                                                                     : c->copy_bytes_per_s;
}

/* Drops host-tier checkpoints, least recently used first, until `need` more bytes fit its budget;
 * 1 when they do. Groups an open plan pins keep theirs. */
static int tier_make_room(squad_cache *c, size_t need) {
    if (need > c->host_budget) return 0;
    cache_ckpt *k = ckpt_of(c->host_lru.oldest);
    while (k && c->tier_bytes + need > c->host_budget) {
        cache_ckpt *next = ckpt_of(k->lru.next);
        if (k->group->pins == 0) ckpt_evict(c, k);
        k = next;
    }
    return c->tier_bytes + need <= c->host_budget;
}

/* A group's K / V to host memory (no checkpoint of it is left on the device); 0 when moved. */
static int tier_demote_kv(squad_cache *c, cache_group *g) {
    const size_t kv_bytes = (size_t)g->n_pos * c->be->kv_bytes_per_pos;
    g->pins++; /* room for its K / V must not take its own host checkpoints (and free it) */
    const int room = tier_blob_fits(c, kv_bytes) && tier_make_room(c, group_cost(c, g->n_pos));
    void *host = room ? tier_host_alloc(c, kv_bytes) : NULL;
    g->pins--;
    if (!host) return -1;
    if (tier_copy_down(c, host, g->kv, kv_bytes)) {
        tier_host_free(c, host);
        return -1;
    }
    tier_release_copied(c, g->kv);
    g->kv = host;
    g->kv_on_host = 1;
    c->backend_bytes -= kv_bytes;
    c->host_bytes -= group_cost(c, g->n_pos) - kv_bytes;
    c->tier_bytes += group_cost(c, g->n_pos);
    return 0;
}

/* A group whose last device checkpoint left: its K / V follow its host checkpoints down, or, when
 * the host tier cannot take them, those checkpoints go (nothing holds device K / V for host
 * checkpoints alone, which no eviction would ever reach). */
static void group_lost_device(squad_cache *c, cache_group *g) {
    if (g->n_device > 0 || g->kv_on_host || g->n_ckpts == 0) return;
    const double t0 = squad_now_seconds();
    if (tier_demote_kv(c, g) == 0) {
        c->stats.demote_seconds += squad_now_seconds() - t0;
        return;
    }
    cache_ckpt *k = ckpt_of(c->host_lru.oldest);
    while (k) { /* neither k nor, after the last of them, g may be read once evicted */
        cache_ckpt *next = ckpt_of(k->lru.next);
        if (k->group == g) {
            const int last = g->n_ckpts == 1;
            ckpt_evict(c, k); /* the last one frees g */
            if (last) break;
        }
        k = next;
    }
}

/* Moves an unpinned device checkpoint to the host tier (its GDN blob; its group's K / V too when it
 * was the group's last on the device): 1 when it moved, 0 when the host tier is off or cannot take
 * it (the caller drops it). */
static int tier_demote(squad_cache *c, cache_ckpt *k) {
    if (c->host_budget == 0 || k->on_host) return 0;
    const double t0 = squad_now_seconds();
    cache_group *g = k->group;
    const size_t gdn_bytes = c->be->gdn_snapshot_bytes;
    g->pins++; /* room for k must not take k's own group */
    const int room = tier_blob_fits(c, gdn_bytes) && tier_make_room(c, ckpt_cost(c));
    void *host = room ? tier_host_alloc(c, gdn_bytes) : NULL;
    g->pins--;
    if (!host) return 0;
    if (tier_copy_down(c, host, k->gdn, gdn_bytes)) {
        tier_host_free(c, host);
        return 0;
    }
    tier_release_copied(c, k->gdn);
    k->gdn = host;
    k->on_host = 1;
    squad_lru_unlink(&c->lru, &k->lru);
    squad_lru_push_newest(&c->host_lru, &k->lru);
    c->backend_bytes -= gdn_bytes;
    c->host_bytes -= ckpt_host(c);
    c->tier_bytes += ckpt_cost(c);
    c->n_host_ckpts++;
    g->n_device--;
    c->stats.demotions++;
    c->stats.demote_seconds += squad_now_seconds() - t0;
    group_lost_device(c, g); /* may drop k with the rest when its K / V cannot follow */
    return 1;
}

/* Brings a host-tier checkpoint (and its group's K / V when they are in host memory) back to the
 * device budget, making room there as for any allocation; 0 when it moved. */
static int tier_promote(squad_cache *c, cache_ckpt *k) {
    squad_backend *be = c->be;
    squad_err e = {0};
    cache_group *g = k->group;
    const double t0 = squad_now_seconds();
    const size_t gdn_bytes = be->gdn_snapshot_bytes, kv_bytes = (size_t)g->n_pos * be->kv_bytes_per_pos;
    size_t moved = gdn_bytes;
    g->pins++; /* what makes room leaves k and its group alone */
    const size_t need = ckpt_cost(c) + (g->kv_on_host ? group_cost(c, g->n_pos) : 0);
    void *kv = NULL, *gdn = NULL;
    int ok = make_room(c, need);
    if (ok && g->kv_on_host) ok = (kv = be->alloc(be, kv_bytes, &e)) != NULL && tier_copy_up(c, kv, g->kv, kv_bytes) == 0;
    if (ok) ok = (gdn = be->alloc(be, gdn_bytes, &e)) != NULL && tier_copy_up(c, gdn, k->gdn, gdn_bytes) == 0;
    g->pins--;
    if (!ok) {
        if (kv) be->release(be, kv);
        if (gdn) be->release(be, gdn);
        return -1;
    }
    if (kv) {
        tier_host_free(c, g->kv);
        g->kv = kv;
        g->kv_on_host = 0;
        c->tier_bytes -= group_cost(c, g->n_pos);
        c->backend_bytes += kv_bytes;
        c->host_bytes += group_cost(c, g->n_pos) - kv_bytes;
        moved += kv_bytes;
    }
    tier_host_free(c, k->gdn);
    k->gdn = gdn;
    k->on_host = 0;
    squad_lru_unlink(&c->host_lru, &k->lru);
    squad_lru_push_newest(&c->lru, &k->lru);
    c->tier_bytes -= ckpt_cost(c);
    c->backend_bytes += gdn_bytes;
    c->host_bytes += ckpt_host(c);
    c->n_host_ckpts--;
    g->n_device++;
    const double dt = squad_now_seconds() - t0;
    c->stats.promotions++;
    c->stats.promote_seconds += dt;
    /* memcpy's measured bandwidth, smoothed: the next decision's figure (an asynchronous backend
     * times its copies itself: dt is only what queueing them cost the host thread) */
    if (dt > 0 && !be->blob_from_host) c->copy_bytes_per_s += SQUAD_TIER_EWMA * ((double)moved / dt - c->copy_bytes_per_s);
    return 0;
}

/* A row's deepest checkpoint is only in host memory: promote it when the copy costs less than
 * recomputing the tokens it saves over the deepest device checkpoint, and return what the row
 * restores (the promoted one, or the device one, or NULL). */
static cache_ckpt *tier_choose(squad_cache *c, const int32_t *ids, const uint64_t *keys, int n_blocks, int route,
                               int prefer, cache_ckpt *host) {
    const cache_ckpt *dev = deepest_ckpt(c, ids, keys, n_blocks, route, prefer, 1);
    const int saved = host->pos - (dev ? dev->pos : 0);
    const size_t bytes = c->be->gdn_snapshot_bytes +
                         (host->group->kv_on_host ? (size_t)host->group->n_pos * c->be->kv_bytes_per_pos : 0);
    int promote = squad_cache_tier_pays((double)bytes, saved, tier_copy_rate(c), c->row_s_per_token);
    if (c->tier_force) promote = c->tier_force > 0;
    if (promote && tier_promote(c, host) == 0) return host;
    c->stats.host_recomputed++;
    /* the device one again: making room for a failed promotion may have moved it */
    return deepest_ckpt(c, ids, keys, n_blocks, route, prefer, 1);
}

/* A finished row's wall seconds per token computed, smoothed: what recomputing costs a row. Short
 * rows say more about the step's fixed costs than about tokens, so they are left out. */
static void tier_note_row(squad_cache *c, uint64_t computed, double seconds) {
    if (computed < SQUAD_TIER_MIN_ROW_TOKENS || seconds <= 0) return;
    c->row_s_per_token += SQUAD_TIER_EWMA * (seconds / (double)computed - c->row_s_per_token);
}

int squad_cache_debug_host_tier(squad_cache *c, size_t host_budget, int force, squad_err *err) {
    if (c->n_ckpts > 0) return 0;
    c->host_budget = host_budget;
    c->tier_force = force;
    return tier_pool_setup(c, err);
}

void squad_cache_debug_tier_rates(squad_cache *c, double copy_bytes_per_s, double row_s_per_token) {
    if (copy_bytes_per_s > 0) c->copy_bytes_per_s = copy_bytes_per_s;
    if (row_s_per_token > 0) c->row_s_per_token = row_s_per_token;
}

int squad_cache_debug_tier_slabs(squad_cache *c, squad_tier_slab_get get, squad_tier_slab_put put, void *ctx,
                                 size_t step, int reserve, squad_err *err) {
    if (c->n_ckpts > 0 || !get || !put) return squad_fail(err, SQUAD_E_INVALID, "state cache: slab source set late");
    c->slab_get = get;
    c->slab_put = put;
    c->slab_ctx = ctx;
    c->slab_step = step;
    c->slab_reserve = reserve;
    return tier_pool_setup(c, err);
}

const squad_tier_pool *squad_cache_debug_tier_pool(const squad_cache *c) { return &c->pool; }

/* ---- import / export: what the disk tier (cache_store.c) reads and writes ------------------- */

int squad_cache_export(const squad_cache *c, squad_cache_export_fn fn, void *ctx) {
    /* most recently used first: the device tier's, then the host tier's */
    for (int on_host = 0; on_host <= 1; on_host++) {
        const squad_lru *list = on_host ? &c->host_lru : &c->lru;
        for (const cache_ckpt *k = ckpt_of_const(list->newest); k; k = ckpt_of_const(k->lru.prev)) {
            const cache_group *g = k->group;
            squad_cache_entry v = {g, g->ids, g->n_pos, g->route, g->kv, g->kv_on_host,
                                   k->pos, k->gdn, k->on_host, k->feat, k->feat_count, k->route};
            int rc = fn(ctx, &v);
            if (rc) return rc;
        }
    }
    return 0;
}

int squad_cache_blob_read(const squad_cache *c, void *dst, const void *blob, int on_host, size_t bytes) {
    squad_err e = {0};
    if (on_host || !c->be->blob_to_host) {
        if (on_host && tier_sync(c)) return -1; /* its demotion's copy may still be under way */
        memcpy(dst, blob, bytes);
        return 0;
    }
    if (c->be->blob_to_host(c->be, dst, blob, bytes, &e)) return -1;
    return tier_sync(c);
}

/* Appends n as the least recently used (a file lists the most recent first). */
static void lru_push_oldest(squad_lru *l, squad_lru_node *n) {
    n->next = l->oldest;
    n->prev = NULL;
    if (l->oldest) l->oldest->prev = n;
    else l->newest = n;
    l->oldest = n;
}

/* Where an adopted item goes without evicting anything: 0 the device budget, 1 the host tier, -1
 * neither. */
static int adopt_tier(squad_cache *c, size_t need, int host_only) {
    if (!host_only && bytes_held(c) + need + squad_hindex_buckets_for(c->n_ckpts + 1) * sizeof(squad_hnode *) <=
                          c->opts.budget_bytes)
        return 0;
    if (c->host_budget > 0 && c->tier_bytes + need <= c->host_budget) return 1;
    return -1;
}

/* A new group adopted from host copies of its tokens and K / V; NULL when neither tier has room. */
static cache_group *adopt_group(squad_cache *c, const int32_t *ids, int n_pos, int route, const void *kv_host,
                                size_t ckpt_need) {
    squad_backend *be = c->be;
    squad_err e = {0};
    const size_t kv_bytes = (size_t)n_pos * be->kv_bytes_per_pos;
    const int tier = adopt_tier(c, group_cost(c, n_pos) + ckpt_need, 0);
    if (tier < 0) return NULL;
    const int n_blocks = n_pos / c->opts.align;
    cache_group *g = calloc(1, sizeof *g);
    int32_t *gids = malloc((size_t)n_pos * sizeof *gids);
    block_entry *blocks = calloc((size_t)(n_blocks > 0 ? n_blocks : 1), sizeof *blocks);
    uint64_t *keys = malloc((size_t)(n_blocks > 0 ? n_blocks : 1) * sizeof *keys);
    void *kv = NULL;
    if (g && gids && blocks && keys && squad_hindex_reserve(&c->block_index, (size_t)n_blocks) == 0)
        kv = tier ? squad_tier_pool_alloc(&c->pool, kv_bytes) : be->alloc(be, kv_bytes, &e); /* evicting nothing */
    /* host-tier bytes are written by the host thread only once no copy may still use them */
    if (kv && (tier ? (tier_sync(c) ? -1 : (memcpy(kv, kv_host, kv_bytes), 0)) : tier_copy_up(c, kv, kv_host, kv_bytes))) {
        if (tier) tier_host_free(c, kv);
        else be->release(be, kv);
        kv = NULL;
    }
    if (!kv) {
        free(g);
        free(gids);
        free(blocks);
        free(keys);
        squad_hindex_fit(&c->block_index);
        return NULL;
    }
    memcpy(gids, ids, (size_t)n_pos * sizeof *gids);
    g->ids = gids;
    g->kv = kv;
    g->blocks = blocks;
    g->n_pos = n_pos;
    g->route = route;
    squad_cache_prefix_keys(gids, c->opts.align, n_blocks, keys);
    group_link(c, g, keys);
    free(keys);
    if (tier) { /* group_link counted it on the device */
        g->kv_on_host = 1;
        c->backend_bytes -= kv_bytes;
        c->host_bytes -= group_cost(c, n_pos) - kv_bytes;
        c->tier_bytes += group_cost(c, n_pos);
    }
    return g;
}

int squad_cache_adopt(squad_cache *c, cache_group **group, const squad_cache_entry *in) {
    squad_backend *be = c->be;
    squad_err e = {0};
    const int align = c->opts.align;
    if (in->pos <= 0 || in->pos % align || in->pos > in->n_pos || in->n_pos % align || in->route != in->group_route ||
        in->n_pos > be->max_context)
        return -1;
    if (lookup_route(c, in->ids, in->pos, in->route) == in->pos) return 0; /* held already */
    cache_group *g = *group;
    const int made = g == NULL;
    if (made && !(g = adopt_group(c, in->ids, in->n_pos, in->route, in->kv, ckpt_cost(c)))) return 0;
    const int tier = adopt_tier(c, ckpt_cost(c), g->kv_on_host);
    /* a new group's first checkpoint shares its tier (device K / V need a device checkpoint) */
    cache_ckpt *k = tier >= 0 && (!made || tier == g->kv_on_host) ? calloc(1, sizeof *k) : NULL;
    double *feat = NULL;
    if (k && c->feat_dim > 0 && !(feat = calloc((size_t)c->feat_dim, sizeof *feat))) {
        free(k);
        k = NULL;
    }
    void *gdn = k && squad_hindex_reserve(&c->ckpt_index, 1) == 0
                    ? (tier ? squad_tier_pool_alloc(&c->pool, be->gdn_snapshot_bytes) : be->alloc(be, be->gdn_snapshot_bytes, &e))
                    : NULL;
    if (gdn && tier == 0 && tier_copy_up(c, gdn, in->gdn, be->gdn_snapshot_bytes)) {
        be->release(be, gdn);
        gdn = NULL;
    }
    if (!gdn) {
        free(k);
        free(feat);
        if (made) group_free(c, g);
        return 0;
    }
    if (tier && tier_sync(c)) {
        tier_host_free(c, gdn);
        free(k);
        free(feat);
        if (made) group_free(c, g);
        return 0;
    }
    if (tier) memcpy(gdn, in->gdn, be->gdn_snapshot_bytes);
    if (feat && in->feat) memcpy(feat, in->feat, (size_t)c->feat_dim * sizeof *feat);
    k->node.key = g->blocks[in->pos / align - 1].node.key;
    k->pos = in->pos;
    k->route = in->route;
    k->gdn = gdn;
    k->feat = feat;
    k->feat_count = in->feat_count;
    k->group = g;
    k->on_host = tier;
    squad_hindex_insert(&c->ckpt_index, &k->node);
    g->n_ckpts++;
    c->n_ckpts++;
    if (tier) {
        lru_push_oldest(&c->host_lru, &k->lru);
        c->tier_bytes += ckpt_cost(c);
        c->n_host_ckpts++;
    } else {
        lru_push_oldest(&c->lru, &k->lru);
        g->n_device++;
        c->backend_bytes += be->gdn_snapshot_bytes;
        c->host_bytes += ckpt_host(c);
    }
    *group = g;
    return 1;
}
