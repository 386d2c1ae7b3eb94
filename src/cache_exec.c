/*
 * cache_exec.c — executes the state cache's plans on a backend (interface in cache_exec.h).
 *
 * One pass of a row: squad_cache_plan_open says what to restore and where to checkpoint; the
 * working state is restored (load_gdn, then load_kv of the checkpoint's group up to its position;
 * a reset when the plan starts cold); the prefix runs span by span to each planned bound, and at
 * every kept bound the GDN part of the working state is saved into a blob the cache hands out.
 * A route the caller forced (or the trunk, without specialists) is certain, so the checkpoints are
 * committed before the question runs (the working state still holds exactly [0, p) then); a
 * guessed route keeps them pending until the router, after the row's last chunk, confirms it —
 * the question wrote only positions from p on, so the K / V of [0, p) are still the prefix's. A
 * wrong guess closes the plan as a retry and runs the row again under a plan for the router's
 * route. A failure anywhere abandons the plan (its pins and pending blobs go back).
 *
 * The cache never calls the backend's compute or the engine. The steps that touch a sequence slot
 * (restore, save at a bound, commit) are shared with the engine's scheduler (scheduler.c), which
 * runs them for every row in flight, each on its own slot, between batched steps;
 * squad_cache_exec strings them together for one row on slot 0 with a span runner, which is how
 * the cache's policy is tested against a fake backend without a model.
 */
#include "cache_exec.h"

#include <string.h>

#include "cache_internal.h"
#include "util.h"

/* load_gdn overwrites all that reset would clear, so a restore skips the reset (on the GPU a 19 MB
 * memset per hit, on the CPU a 20 MB one for the 0.8B shapes). */
int squad_cache_restore(squad_backend *be, int seq, const squad_cache_plan *pl, squad_router_feat *feat,
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
int squad_cache_save_bound(squad_cache *c, squad_backend *be, int seq, squad_cache_plan *pl, int i,
                           const squad_router_feat *feat, squad_err *err) {
    if (i < pl->first_kept) return 0;
    void *blob = squad_cache_plan_blob(c, pl, i, feat);
    int rc = blob ? be->save_gdn(be, seq, blob, err) : 0;
    if (rc) squad_cache_plan_drop(c, pl, i);
    return rc;
}

int squad_cache_commit(squad_cache *c, squad_backend *be, int seq, const squad_row *row, squad_cache_plan *pl,
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
                      squad_cache_plan *pl, const squad_router_feat *feat, squad_result *out, squad_err *err) {
    int s = pl->c0;
    for (int i = 0; i < pl->n_bounds; i++) {
        const int b = pl->bounds[i];
        int rc = run(ctx, row, s, b, out, err);
        if (!rc) rc = squad_cache_save_bound(c, be, 0, pl, i, feat, err);
        if (rc) return rc;
        s = b;
    }
    return 0;
}

int squad_cache_exec(squad_cache *c, squad_backend *be, squad_span_fn run, void *ctx, const squad_row *row,
                     int end_only, const int *marks, int n_marks, squad_cache_routing *rt, squad_result *out,
                     squad_err *err) {
    if (!squad_cache_eligible(c, row)) return squad_fail(err, SQUAD_E_INVALID, "row is not eligible for the state cache");
    const int feat_dim = squad_cache_feat_dim(c);
    if (rt && (!rt->feat || rt->feat->dim != feat_dim || !rt->run_route || !rt->decide))
        return squad_fail(err, SQUAD_E_INVALID, "state cache: routing without its router features");
    memset(out, 0, sizeof *out);
    out->n_slots = row->n_slots;
    int route = rt ? rt->forced : 0; /* < 0: guess */
    const int prefer = rt ? rt->last_route : 0;
    uint64_t computed = 0;
    if (rt) rt->mispredicted = 0;
    for (;;) {
        squad_cache_plan pl;
        int rc = squad_cache_plan_open_at(c, row, end_only, marks, n_marks, route, prefer, &pl, err);
        if (rc) return rc;
        out->reused = pl.c0;
        out->route = pl.route;
        if (rt) *rt->run_route = pl.route;
        const int guessed = route < 0;
        rc = squad_cache_restore(be, 0, &pl, rt ? rt->feat : NULL, err);
        if (!rc) rc = run_prefix(c, be, run, ctx, row, &pl, rt ? rt->feat : NULL, out, err);
        if (!rc && !guessed) rc = squad_cache_commit(c, be, 0, row, &pl, err);
        if (!rc) rc = run(ctx, row, pl.p, row->n_ids, out, err);
        int decided = pl.route;
        if (!rc && guessed) {
            decided = rt->decide(rt->ctx, err);
            if (decided < 0) rc = decided;
            else if (decided == pl.route) rc = squad_cache_commit(c, be, 0, row, &pl, err);
        }
        computed += (uint64_t)(row->n_ids - pl.c0);
        if (!rc && decided != pl.route) { /* a misprediction: again under the router's route */
            squad_cache_plan_close(c, &pl, SQUAD_PLAN_RETRY, row, computed, out);
            rt->mispredicted = 1;
            route = decided;
            continue;
        }
        squad_cache_plan_close(c, &pl, rc ? SQUAD_PLAN_FAILED : SQUAD_PLAN_DONE, row, computed, out);
        return rc;
    }
}

int squad_cache_score_ex(squad_cache *c, squad_span_fn run, void *ctx, const squad_row *row, int end_only,
                         squad_result *out, squad_err *err) {
    return squad_cache_exec(c, squad_cache_backend(c), run, ctx, row, end_only, NULL, 0, NULL, out, err);
}

int squad_cache_score_with(squad_cache *c, squad_span_fn run, void *ctx, const squad_row *row, squad_result *out,
                           squad_err *err) {
    return squad_cache_score_ex(c, run, ctx, row, 0, out, err);
}
