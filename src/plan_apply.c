/*
 * plan_apply.c — applies the state cache's plans on a backend's sequence slot (interface and the
 * layering in plan_apply.h).
 *
 * One pass of a row: squad_cache_plan_open says what to restore and where to checkpoint; the
 * slot's working state is restored (load_gdn, then load_kv of the checkpoint's group up to its
 * position; a reset when the plan starts cold); the prefix runs to each planned bound, and at every
 * kept bound the GDN part of the working state is saved into a blob the cache hands out (pending).
 * The commit saves the prefix's K / V once into the new group's blob when the checkpoints need
 * one, and the cache joins them. Who decides when a pass commits (a certain route before the
 * question, a guessed one after the router confirmed it) is the scheduler's business; this file
 * only moves state between the slot and the plan's blobs, and the cache never calls it.
 */
#include "plan_apply.h"

#include <string.h>

#include "util.h"

/* load_gdn overwrites all that reset would clear, so a restore skips the reset (on the GPU a 19 MB
 * memset per hit, on the CPU a 20 MB one for the 0.8B shapes). */
int squad_plan_restore(squad_backend *be, int seq, const squad_cache_plan *pl, squad_router_feat *feat,
                       squad_err *err) {
    if (feat && pl->gdn) {
        memcpy(feat->sum, pl->feat, (size_t)feat->dim * sizeof(double));
        feat->count = pl->feat_count;
    } else if (feat) {
        squad_router_feat_reset(feat);
    }
    if (!pl->gdn) return be->reset(be, seq, err);
    int rc = be->load_gdn(be, seq, pl->gdn, err);
    if (rc) return rc;
    return be->load_kv(be, seq, pl->kv, pl->kv_positions, pl->c0, err);
}

/* A blob the cache cannot give only means that checkpoint is not kept; a failed save fails the
 * row. */
int squad_plan_save_bound(squad_cache *c, squad_backend *be, int seq, squad_cache_plan *pl, int i,
                          const squad_router_feat *feat, squad_err *err) {
    if (i < pl->first_kept) return 0;
    void *blob = squad_cache_plan_blob(c, pl, i, feat);
    int rc = blob ? be->save_gdn(be, seq, blob, err) : 0;
    if (rc) squad_cache_plan_drop(c, pl, i);
    return rc;
}

int squad_plan_commit(squad_cache *c, squad_backend *be, int seq, const squad_row *row, squad_cache_plan *pl,
                      squad_err *err) {
    void *kv;
    int n;
    squad_cache_commit_begin(c, pl, row, &kv, &n);
    const int rc = kv ? be->save_kv(be, seq, kv, n, err) : 0;
    squad_cache_commit_end(c, pl, rc);
    return rc;
}

/* The prefix [c0, p) bound by bound, saving the GDN part at each kept bound (pending). */
static int run_prefix(squad_cache *c, squad_backend *be, squad_span_fn run, void *ctx, const squad_row *row,
                      squad_cache_plan *pl, squad_result *out, squad_err *err) {
    int s = pl->c0;
    for (int i = 0; i < pl->n_bounds; i++) {
        const int b = pl->bounds[i];
        int rc = run(ctx, row, s, b, out, err);
        if (!rc) rc = squad_plan_save_bound(c, be, 0, pl, i, NULL, err);
        if (rc) return rc;
        s = b;
    }
    return 0;
}

int squad_plan_run_row(squad_cache *c, squad_span_fn run, void *ctx, const squad_row *row, squad_result *out,
                       squad_err *err) {
    if (!squad_cache_eligible(c, row)) return squad_fail(err, SQUAD_E_INVALID, "row is not eligible for the state cache");
    squad_backend *be = squad_cache_backend(c);
    memset(out, 0, sizeof *out);
    out->n_slots = row->n_slots;
    squad_cache_plan pl;
    int rc = squad_cache_plan_open(c, row, 0, 0, 0, &pl, err);
    if (rc) return rc;
    out->reused = pl.c0;
    out->route = pl.route;
    rc = squad_plan_restore(be, 0, &pl, NULL, err);
    if (!rc) rc = run_prefix(c, be, run, ctx, row, &pl, out, err);
    if (!rc) rc = squad_plan_commit(c, be, 0, row, &pl, err); /* the trunk's route is certain */
    if (!rc) rc = run(ctx, row, pl.p, row->n_ids, out, err);
    squad_cache_plan_close(c, &pl, rc ? SQUAD_PLAN_FAILED : SQUAD_PLAN_DONE, row, (uint64_t)(row->n_ids - pl.c0), out);
    return rc;
}
