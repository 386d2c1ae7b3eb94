/*
 * cache.h — the cross-request state cache (docs/design.md section 7).
 *
 * A row is [state prefix | question suffix]. Checkpoints of the model state at chosen positions
 * of the prefix (p, p - tail, multiples of stride; aligned) are kept in backend memory, LRU within
 * a byte budget; a later row restores the deepest checkpoint whose tokens it shares and computes
 * only the rest. Lookup goes through an index of aligned token blocks (never a scan over all
 * cached states), and a candidate is always verified against the tokens.
 */
#ifndef SQUAD_CACHE_H
#define SQUAD_CACHE_H

#include "backend.h"
#include "specialists.h"
#include "squad.h"

typedef struct squad_cache squad_cache;

squad_cache *squad_cache_new(squad_backend *be, const squad_cache_opts *opts, squad_err *err);
void squad_cache_free(squad_cache *cache);

/* 1 when the row may take the cached path (state_len given, p >= min_prefix, slots in the suffix,
 * at most max_slots slots, fits the backend); 0 otherwise. */
int squad_cache_eligible(const squad_cache *cache, const squad_row *row);

/* ---- plans: the cache plans a row, its caller applies the plan, the cache commits ------------
 *
 * squad_cache_plan_open looks a row up and fills a plan: the checkpoint to restore (its blobs and
 * router features; pinned), the route the pass runs with, and the chunk ends of the prefix, the
 * deepest of which get new checkpoints. The caller (a layer above: the scheduler, through
 * plan_apply.c) restores, runs the spans, and at each kept bound asks squad_cache_plan_blob for a
 * blob and saves the working state's GDN part into it; squad_cache_commit_begin / _end then hand
 * it the K / V blob of a new group (when one is needed) and join the checkpoints to the cache;
 * squad_cache_plan_close releases the pins and any blob still pending, and counts the row. The
 * cache never touches a sequence slot and never calls up.
 *
 * A pin is a reference count on a group: while any open plan holds it (the group of the restored
 * checkpoint, the cached group that takes the new checkpoints, the new group itself), none of its
 * checkpoints or K / V (read in place by the restore) is evicted. Several plans may be open at once
 * and may pin the same group. */
typedef struct cache_ckpt cache_ckpt;
typedef struct cache_group cache_group;
typedef struct cache_pending cache_pending;

typedef struct squad_cache_plan {
    /* what the caller applies */
    int route;           /* the route this pass runs with */
    int c0;              /* the restored position (0: start from a reset) */
    int p;               /* the state's end, aligned: the prefix is [c0, p) */
    const void *gdn;     /* the checkpoint to restore (NULL when c0 == 0): its GDN blob, */
    const void *kv;      /* its group's K / V blob of kv_positions positions (read up to c0), */
    int kv_positions;
    const double *feat;  /* and its router features (NULL without specialists) */
    int64_t feat_count;
    const int *bounds;   /* the chunk ends of the prefix, ascending, the last one p */
    int n_bounds;
    int first_kept;      /* bounds[i] with i >= first_kept get a checkpoint */
    /* the cache's own */
    cache_ckpt *best;
    cache_group *share;  /* the group that takes the new checkpoints, pinned: a cached one holding
                          * [0, p) of the route, or the one made for them once committed */
    cache_group *made;   /* the group made for them by squad_cache_commit_begin */
    int end_only;
    int deepest_new;     /* the deepest checkpoint committed (0: none) */
    double t_open;       /* when it opened (the cost model's rate of rows) */
    int *bounds_buf;
    uint64_t *keys;      /* prefix keys of [0, k * align), k = 1..p / align */
    cache_pending *pending; /* [n_bounds] */
    struct squad_cache_plan *prev, *next; /* the open plans */
} squad_cache_plan;

/* Plans an eligible row for one pass. route >= 0: that route's checkpoints only; route < 0: the
 * route of the deepest checkpoint the row can restore (prefer's at equal depth), else prefer.
 * end_only: only the checkpoint at p is kept. Pins what the plan reads and moves the restored
 * checkpoint to the recent end of the LRU list. Non-zero on failure, with nothing held. */
int squad_cache_plan_open(squad_cache *cache, const squad_row *row, int end_only, int route, int prefer,
                          squad_cache_plan *plan, squad_err *err);
/* The same with the caller's marks: up to SQUAD_CACHE_MAX_MARKS more checkpoint positions of the
 * state (a client's cache breakpoints), each rounded down to align; those outside (c0, p] are
 * ignored, and end_only drops them with the tail and stride positions. */
#define SQUAD_CACHE_MAX_MARKS 8
int squad_cache_plan_open_at(squad_cache *cache, const squad_row *row, int end_only, const int *marks, int n_marks,
                             int route, int prefer, squad_cache_plan *pl, squad_err *err);

/* The blob to save the working state's GDN part into at bounds[i] (i >= first_kept), with the
 * router features at that position (feat NULL: zero); evicts unpinned checkpoints to make room.
 * NULL when it cannot be kept (memory short): the row goes on without it. */
void *squad_cache_plan_blob(squad_cache *cache, squad_cache_plan *plan, int i, const squad_router_feat *feat);

/* The plan's saved blob at bounds[i] is dropped (its save failed). */
void squad_cache_plan_drop(squad_cache *cache, squad_cache_plan *plan, int i);

/* Commit, first half: when the plan's pending checkpoints need a new group, makes it (evicting to
 * make room) and sets *kv to its K / V blob, which the caller fills with the working state's K / V
 * of [0, *n) before squad_cache_commit_end; else *kv = NULL (nothing to save). When memory is short
 * the pending checkpoints are dropped and *kv is NULL. The working state must still hold [0, p). */
void squad_cache_commit_begin(squad_cache *cache, squad_cache_plan *plan, const squad_row *row, void **kv, int *n);

/* Commit, second half: saved == 0 (the K / V blob was filled, or none was needed) joins the
 * pending checkpoints to the cache, the deepest the most recent; else drops them and the group. */
void squad_cache_commit_end(squad_cache *cache, squad_cache_plan *plan, int saved);

/* How a plan ends. */
typedef enum {
    SQUAD_PLAN_DONE,    /* the row was answered: it is counted, out->cache_written is set */
    SQUAD_PLAN_RETRY,   /* the route was mispredicted: the row runs again under another plan */
    SQUAD_PLAN_FAILED,  /* the row failed or was cancelled: nothing is counted */
} squad_plan_end;

/* Closes a plan: drops the checkpoints still pending, releases the pins and the plan's memory.
 * DONE and FAILED then bring the cache within its budget (unpinned checkpoints, least recently used
 * first); DONE counts the row (computed: its tokens run over every pass) and sets
 * out->cache_written; RETRY counts a misprediction. */
void squad_cache_plan_close(squad_cache *cache, squad_cache_plan *plan, squad_plan_end how, const squad_row *row,
                            uint64_t computed, squad_result *out);

/* The deepest position a plan for the row would restore now (route >= 0: that route's
 * checkpoints; < 0: any route), 0 when none; touches neither the LRU order nor the counters (the
 * scheduler asks it to decide whether a row waits for another row's pending checkpoint). */
int squad_cache_restorable(const squad_cache *cache, const squad_row *row, int route);

/* The number of open plans holding a pin on the group of the checkpoint at pos whose tokens equal
 * ids[0, pos) (-1: no such checkpoint); for tests. */
int squad_cache_pins(const squad_cache *cache, const int32_t *ids, int pos);

/* The backend the cache's blobs belong to, and the router features per checkpoint (0: none). */
squad_backend *squad_cache_backend(const squad_cache *cache);
int squad_cache_feat_dim(const squad_cache *cache);

/* With specialists: every checkpoint also keeps the router features of its prefix (dim doubles);
 * called on an empty cache before its first row. */
int squad_cache_set_feat_dim(squad_cache *cache, int dim, squad_err *err);

/* Drops every checkpoint and group (the counters stay; a clear is not counted as evictions). */
void squad_cache_clear(squad_cache *cache);

void squad_cache_get_stats(const squad_cache *cache, squad_cache_stats *out);

/* ---- import / export: the disk tier's way in and out (cache_store.c) ------------------------
 *
 * One checkpoint as the cache holds it, or as a file gives it: its group (an opaque key naming it
 * while exporting; its tokens [0, n_pos), route and K / V blob) and itself (position, route, GDN
 * blob, router features). Blobs marked on_host are host memory; the others are backend blobs,
 * read with squad_cache_blob_read. */
typedef struct squad_cache_entry {
    const void *group_key;
    const int32_t *ids;
    int n_pos;
    int group_route;
    const void *kv;
    int kv_on_host;
    int pos;
    const void *gdn;
    int gdn_on_host;
    const double *feat; /* [feat_dim] or NULL */
    int64_t feat_count;
    int route;
} squad_cache_entry;

/* Calls fn for every checkpoint held, most recently used first (the device tier's, then the host
 * tier's); a nonzero return stops the walk and is returned. The cache must not change meanwhile. */
typedef int (*squad_cache_export_fn)(void *ctx, const squad_cache_entry *entry);
int squad_cache_export(const squad_cache *cache, squad_cache_export_fn fn, void *ctx);
/* bytes of a blob (a backend blob, or host memory when on_host) into host memory dst; 0 or < 0. */
int squad_cache_blob_read(const squad_cache *cache, void *dst, const void *blob, int on_host, size_t bytes);

/* Adopts one checkpoint read from a file (entry's blobs in host memory, kv of n_pos positions):
 * into the device budget when it has room, else the host tier, never evicting anything; inserted
 * as the least recently used (a file lists the most recent first). *group: NULL for the first
 * checkpoint of a file's group, then what the call left there (the cache's group, reused so the
 * group's K / V are adopted once). 1 adopted, 0 not (no room, or the same checkpoint is held), -1
 * an inconsistent entry. */
int squad_cache_adopt(squad_cache *cache, cache_group **group, const squad_cache_entry *entry);

#endif /* SQUAD_CACHE_H */
