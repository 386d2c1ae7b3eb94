/*
 * scheduler.c — the engine's batching scheduler: continuous batching of rows over the backend's
 * sequence slots (docs/batching.md; interface in scheduler.h).
 *
 * Rows taken in (squad_engine_submit) wait in a FIFO queue. At most max_rows of them are *in
 * flight*, each owning one sequence slot of the backend. A step (squad_sched_step):
 *
 *  1. Admission. Queued rows take the free slots, oldest first. A row on the state cache's path
 *     opens its plan (cache.h) now, in that order, and restores its checkpoint into its slot (or
 *     resets it); a plain row resets its slot. A queued row whose deepest useful checkpoint is
 *     still pending in an in-flight row's open plan (a kept bound of that plan, at most as deep as
 *     the tokens the two rows share, deeper than what the cache could restore now) waits for that
 *     plan's commit instead of computing the same prefix again, and rows behind it may go first:
 *     a request's questions about a new page compute the page once. Likewise a row whose exact
 *     twin is in flight waits for the memo to hold the twin's answer.
 *  2. Packing. Every row in flight wants its next chunk: from its position to its next target (the
 *     plan's next bound while in the prefix, so that every chunk end lands on a bound; the row's end
 *     after it), at most the longest chunk (max_chunk, or batch_tokens when smaller). The step's
 *     token budget (batch_tokens) goes first, whole, to rows that got less than their whole want
 *     SCHED_STARVE_STEPS steps in a row (oldest first: shortest-first among them would let a long
 *     row wait behind ever newer shorter ones), then to the shortest wants (the hits' questions), whole;
 *     the rows left over are *cut* to what remains of the budget, rounded down to SCHED_CUT_ALIGN
 *     tokens, oldest first. So a long cold row never holds the short rows riding with it for more
 *     than one chunk: it takes what the short ones leave; and a steady flow of short rows never
 *     keeps it to leftovers for long: every (SCHED_STARVE_STEPS + 1)-th step it runs a whole chunk
 *     first (the short rows then wait that one step). Counting only the steps that gave a row
 *     nothing would let leftovers of 64 tokens a step drag a cold row of 1,000 tokens over 16 steps
 *     while its own hits, stuck behind its checkpoint, wait with it: the latency tail.
 *  3. Forward. One be->forward over every packed chunk (or one per route when the backend cannot
 *     mix routes, or refuses a mixed batch with SQUAD_E_UNSUPPORTED).
 *  4. Advance. Each row copies its chunk's answers and router features, moves its position, and
 *     steps its state machine: at a kept bound it saves the GDN part into the plan's blob; at p,
 *     a certain route (forced, or no specialists) commits the plan (slot's K / V of [0, p)); at the
 *     row's end a guessed route is decided by the router: a confirmed guess commits, a wrong one
 *     closes the plan as RETRY and the row runs again in its slot from the router's route's
 *     deepest checkpoint (off the cache: from a reset). A finished row closes its plan, frees
 *     its slot and joins the step's ended list.
 *
 * The scheduler sits below the engine and never calls it: squad_sched_step hands the rows that
 * left back (answered, answered by the memo, failed), and the engine does the rest of a row's end
 * (router probabilities, memo insert, counters, done). It reads the memo (a queued row's twin may
 * have been answered) but never writes it; what it needs from above (the route a guess starts
 * from) comes in as an argument of the step.
 *
 * Images (docs/images.md). A row with images carries its M-RoPE positions and a key view of its
 * ids (image_rows.h) that the state cache, the memo twin check and the wait for a pending plan
 * compare instead of the ids, so a screenshot is part of the state. The vision tower runs lazily,
 * between packing and the forward: only for an image whose tokens a chunk of this step holds and
 * whose rows the row has not got, from the encoder cache when it has them (a row restored past its
 * images never needs them). A tower that fails ends its row alone before the forward.
 *
 * Every row's chunks continue its own slot's state, so batching changes where a row's chunks are
 * cut (round-off only: docs/design.md section 5) and nothing else. The cancel callback (a caller
 * gone, a deadline passed) is polled once a step for every row taken in: a queued row at
 * admission, a row in flight right after it, before the budget is shared out. A cancelled row
 * leaves at that step boundary, whether or not the step would have given it tokens: it runs no
 * further chunk and takes no budget from the others. A cancelled or failing row ends alone (its
 * plan abandoned: pending checkpoints dropped, those committed kept as valid states, pins
 * released; its slot freed; out->computed still counts the tokens it ran). A failed forward ends
 * every row in flight with its error, and the engine stays usable.
 */
#include "scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "image/preprocess.h"
#include "image_rows.h"
#include "plan_apply.h"
#include "util.h"

static int min_int(int a, int b) { return a < b ? a : b; }

/* ---- setup ----------------------------------------------------------------------------------- */

int squad_sched_init(squad_sched *s, squad_backend *be, squad_cache *cache, squad_memo *memo,
                     const squad_specialists *sp, const squad_engine_opts *o, squad_err *err) {
    memset(s, 0, sizeof *s);
    s->be = be;
    s->cache = cache;
    s->memo = memo;
    s->sp = sp;
    s->align = o->cache.align;
    /* the processor runs before the tower, while the backend's own threads wait: on the CPU it gets
     * as many as the backend (0: the cores), on CUDA the machine's cores (0) */
    s->image_threads = strcmp(be->name, "cpu") == 0 ? o->threads : 0;
    if (o->max_rows < 0) return squad_fail(err, SQUAD_E_INVALID, "max_rows %d: 0 (the backend's) or more", o->max_rows);
    if (o->batch_tokens < 0)
        return squad_fail(err, SQUAD_E_INVALID, "batch_tokens %d: 0 (the backend's) or more", o->batch_tokens);
    s->max_rows = o->max_rows > 0 && o->max_rows < be->max_seqs ? o->max_rows : be->max_seqs;
    s->batch_tokens = o->batch_tokens > 0 && o->batch_tokens < be->max_batch_tokens ? o->batch_tokens
                                                                                      : be->max_batch_tokens;
    if (s->max_rows < 1 || min_int(be->max_chunk, s->batch_tokens) < 1)
        return squad_fail(err, SQUAD_E_BACKEND, "the %s backend has %d slots and %d-token batches", be->name,
                          be->max_seqs, be->max_batch_tokens);
    s->slots = squad_calloc((size_t)s->max_rows, sizeof *s->slots, err);
    s->batch = squad_calloc((size_t)s->max_rows, sizeof *s->batch, err);
    s->chunks = squad_calloc((size_t)s->max_rows, sizeof *s->chunks, err);
    s->sub = squad_calloc((size_t)s->max_rows, sizeof *s->sub, err);
    s->want = squad_calloc((size_t)s->max_rows, sizeof *s->want, err);
    s->got = squad_calloc((size_t)s->max_rows, sizeof *s->got, err);
    s->routed = squad_calloc((size_t)s->max_rows, sizeof *s->routed, err);
    if (!s->slots || !s->batch || !s->chunks || !s->sub || !s->want || !s->got || !s->routed) return SQUAD_E_NOMEM;
    return 0;
}

void squad_sched_row_free(squad_sched_row *r) {
    if (!r) return;
    squad_router_feat_free(&r->feat);
    free(r->chunk_sum);
    free(r->key_ids);
    free(r->positions);
    free(r->img_embeds);
    free(r);
}

/* A row with images: its M-RoPE positions, and (keys) the key view the cache sees; the embeddings
 * wait for a chunk that needs them (images_ready). Nothing for a text-only row. */
static int row_image_views(const squad_sched *s, squad_sched_row *r, int keys, squad_err *err) {
    const squad_row *row = &r->row;
    if (row->n_images <= 0) return 0;
    r->positions = squad_malloc((size_t)row->n_ids * 3 * sizeof *r->positions, err);
    if (!r->positions) return SQUAD_E_NOMEM;
    squad_image_row_positions(&s->be->model->cfg, row, r->positions);
    if (!keys) return 0;
    if (!(r->key_ids = squad_malloc((size_t)row->n_ids * sizeof *r->key_ids, err))) return SQUAD_E_NOMEM;
    squad_image_row_key_ids(row, r->key_ids);
    r->krow.ids = r->key_ids;
    r->krow.images = NULL;
    r->krow.n_images = 0;
    return 0;
}

squad_sched_row *squad_sched_row_new(const squad_sched *s, const squad_row *row, const squad_score_opts *opts,
                                     squad_result *out, squad_done_fn done, void *ctx, squad_err *err) {
    squad_sched_row *r = squad_calloc(1, sizeof *r, err);
    if (!r) return NULL;
    r->row = *row;
    if (opts) r->opts = *opts;
    r->out = out;
    r->done = done;
    r->ctx = ctx;
    r->seq = -1;
    r->forced = s->sp ? row->specialist - 1 : 0;
    r->krow = *row;
    if (row_image_views(s, r, 1, err)) {
        squad_sched_row_free(r);
        return NULL;
    }
    if (s->sp) {
        if (squad_router_feat_init(&r->feat, s->sp->hidden, err) ||
            !(r->chunk_sum = squad_calloc((size_t)s->sp->hidden, sizeof *r->chunk_sum, err))) {
            squad_sched_row_free(r);
            return NULL;
        }
    }
    return r;
}

void squad_sched_enqueue(squad_sched *s, squad_sched_row *r) {
    r->next = NULL;
    if (s->queue_tail) s->queue_tail->next = r;
    else s->queue_head = r;
    s->queue_tail = r;
    s->n_queued++;
}

int squad_sched_pending(const squad_sched *s) { return s->n_queued + s->n_flight; }

/* ---- ending a row ---------------------------------------------------------------------------- */

static void plan_close(squad_sched *s, squad_sched_row *r, squad_plan_end how) {
    if (!r->plan_open) return;
    r->plan_open = 0;
    squad_cache_plan_close(s->cache, &r->plan, how, &r->krow, r->computed, r->out);
}

static void slot_free(squad_sched *s, squad_sched_row *r) {
    if (r->seq < 0) return;
    s->slots[r->seq] = NULL;
    s->n_flight--;
    r->seq = -1;
}

/* The row leaves the scheduler (its plan closed, its slot freed) onto the step's ended list. */
static void row_leave(squad_sched *s, squad_sched_row *r, squad_sched_end end, int rc, const squad_err *why) {
    memset(&r->err, 0, sizeof r->err);
    if (why) r->err = *why;
    if (rc && !r->err.code) r->err.code = rc;
    r->end = (int)end;
    r->rc = rc;
    plan_close(s, r, rc ? SQUAD_PLAN_FAILED : SQUAD_PLAN_DONE);
    slot_free(s, r);
    r->next = NULL;
    if (s->ended_tail) s->ended_tail->next = r;
    else s->ended_head = r;
    s->ended_tail = r;
}

/* Answered (its last pass done), or failed alone with rc and why. */
static void row_end(squad_sched *s, squad_sched_row *r, int rc, const squad_err *why) {
    row_leave(s, r, rc ? SQUAD_SCHED_FAILED : SQUAD_SCHED_ANSWERED, rc, why);
}

static int cancelled(const squad_sched_row *r) { return r->opts.cancelled && r->opts.cancelled(r->opts.cancel_ctx); }

static void row_cancel(squad_sched *s, squad_sched_row *r) {
    squad_err err = {0};
    squad_fail(&err, SQUAD_E_CANCELLED, "row cancelled by the caller at token %d of %d", r->seq >= 0 ? r->pos : 0,
               r->row.n_ids);
    row_end(s, r, SQUAD_E_CANCELLED, &err);
}

static void free_list(squad_sched_row *r) {
    while (r) {
        squad_sched_row *next = r->next;
        squad_sched_row_free(r);
        r = next;
    }
}

void squad_sched_free(squad_sched *s) {
    for (int i = 0; s->slots && i < s->max_rows; i++) {
        squad_sched_row *r = s->slots[i];
        if (!r) continue;
        plan_close(s, r, SQUAD_PLAN_FAILED);
        squad_sched_row_free(r);
    }
    free_list(s->queue_head);
    free_list(s->ended_head);
    free(s->slots);
    free(s->batch);
    free(s->chunks);
    free(s->sub);
    free(s->want);
    free(s->got);
    free(s->routed);
    memset(s, 0, sizeof *s);
}

/* ---- starting a pass ------------------------------------------------------------------------- */

static int first_slot_from(const squad_row *row, int pos) {
    int i = 0;
    while (i < row->n_slots && row->slots[i] < pos) i++;
    return i;
}

/* A pass of the row in its slot: on the cache's path, a plan (route < 0: guess) and its restore;
 * else a reset. route: the route the pass must run with (-1: the router decides afterwards). */
static int pass_start(squad_sched *s, squad_sched_row *r, int route, squad_err *err) {
    squad_backend *be = s->be;
    squad_router_feat *feat = s->sp ? &r->feat : NULL;
    r->guessed = s->sp && route < 0;
    r->committed = 0;
    r->bound = 0;
    if (r->cached) {
        const int want = s->sp ? route : 0;
        int rc = squad_cache_plan_open_at(s->cache, &r->krow, r->opts.end_checkpoint_only, r->opts.checkpoints,
                                          r->opts.n_checkpoints, want, s->guess_route, &r->plan, err);
        if (rc) return rc;
        r->plan_open = 1;
        r->route = r->plan.route;
        r->pos = r->plan.c0;
        r->out->reused = r->plan.c0;
        rc = squad_plan_restore(be, r->seq, &r->plan, feat, err);
        if (rc) return rc;
        if (r->plan.n_bounds == 0 && !r->guessed) { /* a hit on a certain route: nothing to commit */
            rc = squad_plan_commit(s->cache, be, r->seq, &r->krow, &r->plan, err);
            if (rc) return rc;
            r->committed = 1;
        }
    } else {
        r->route = route >= 0 ? route : s->guess_route;
        r->pos = 0;
        if (feat) squad_router_feat_reset(feat);
        int rc = be->reset(be, r->seq, err);
        if (rc) return rc;
    }
    r->out->route = r->route;
    r->next_slot = first_slot_from(&r->row, r->pos);
    return 0;
}

/* ---- admission ------------------------------------------------------------------------------- */

/* The tokens two rows share from the start, up to n. */
static int shared_tokens(const squad_row *a, const squad_row *b, int n) {
    int i = 0;
    while (i < n && a->ids[i] == b->ids[i]) i++;
    return i;
}

/* 1 when two rows hold the same images at the same places. */
static int same_images(const squad_row *a, const squad_row *b) {
    if (a->n_images != b->n_images) return 0;
    for (int k = 0; k < a->n_images; k++) {
        const squad_row_image *x = &a->images[k], *y = &b->images[k];
        if (x->pos != y->pos || x->tokens != y->tokens || memcmp(x->grid, y->grid, sizeof x->grid) ||
            memcmp(x->identity, y->identity, sizeof x->identity))
            return 0;
    }
    return 1;
}

/* 1 when two rows are the same request (what the memo's key covers). */
static int same_request(const squad_row *a, const squad_row *b) {
    return a->n_ids == b->n_ids && same_images(a, b) && a->n_slots == b->n_slots && a->n_letters == b->n_letters &&
           a->state_len == b->state_len && a->specialist == b->specialist &&
           !memcmp(a->ids, b->ids, (size_t)a->n_ids * sizeof *a->ids) &&
           !memcmp(a->slots, b->slots, (size_t)a->n_slots * sizeof *a->slots) &&
           !memcmp(a->nopts, b->nopts, (size_t)a->n_slots * sizeof *a->nopts) &&
           !memcmp(a->letters, b->letters, (size_t)a->n_letters * sizeof *a->letters);
}

/* 1 when a queued row should wait: its exact twin is in flight (the memo answers it once the twin
 * is done), or an in-flight row's open plan will commit a checkpoint of the prefix the row shares
 * with it, deeper than what the cache can restore for the row now. */
static int must_wait(squad_sched *s, const squad_sched_row *r) {
    for (int i = 0; s->memo && i < s->max_rows; i++)
        if (s->slots[i] && same_request(&r->row, &s->slots[i]->row)) return 1;
    if (!s->cache || !squad_cache_eligible(s->cache, &r->krow)) return 0;
    const int route = s->sp ? r->forced : 0;
    const int align = s->align;
    const int p = r->krow.state_len - r->krow.state_len % align;
    int have = -1; /* looked up once, and only when some plan could give more */
    for (int i = 0; i < s->max_rows; i++) {
        const squad_sched_row *o = s->slots[i];
        if (!o || !o->plan_open || o->committed) continue;
        if (route >= 0 && o->route != route) continue; /* its checkpoints will be of another route */
        const squad_cache_plan *pl = &o->plan;
        if (pl->first_kept >= pl->n_bounds) continue; /* it keeps nothing */
        const int shared = shared_tokens(&r->krow, &o->krow, min_int(p, pl->p));
        int deepest = 0;
        for (int b = pl->n_bounds - 1; b >= pl->first_kept; b--)
            if (pl->bounds[b] <= shared) {
                deepest = pl->bounds[b];
                break;
            }
        if (deepest == 0) continue;
        if (have < 0) have = squad_cache_restorable(s->cache, &r->krow, route);
        if (deepest > have) return 1;
    }
    return 0;
}

/* The row into a free slot: its first pass starts. A row the memo answers now (a twin answered
 * while it queued) leaves at once, without the slot. */
static void row_start(squad_sched *s, squad_sched_row *r, int seq) {
    if (s->memo && squad_memo_lookup(s->memo, &r->row, r->opts.want_vocab, r->out)) {
        row_leave(s, r, SQUAD_SCHED_MEMO, 0, NULL);
        return;
    }
    r->seq = seq;
    r->order = s->joined++;
    r->shorted = 0;
    s->slots[seq] = r;
    s->n_flight++;
    r->cached = s->cache && squad_cache_eligible(s->cache, &r->krow);
    squad_err err = {0};
    const int rc = pass_start(s, r, r->forced, &err);
    if (rc) row_end(s, r, rc, &err);
}

/* Queued rows into free slots, oldest first; a row that must wait, or finds no slot, stays queued
 * (polled for a cancel there, so a caller gone does not hold its place). */
static void admit(squad_sched *s) {
    squad_sched_row **link = &s->queue_head, *prev = NULL;
    while (*link) {
        squad_sched_row *r = *link;
        const int go = s->n_flight < s->max_rows && !must_wait(s, r);
        if (!go && !cancelled(r)) {
            prev = r;
            link = &r->next;
            continue;
        }
        *link = r->next; /* out of the queue: into a slot, or cancelled */
        if (s->queue_tail == r) s->queue_tail = prev;
        s->n_queued--;
        r->next = NULL;
        if (!go) {
            row_cancel(s, r);
            continue;
        }
        int seq = 0;
        while (s->slots[seq]) seq++;
        row_start(s, r, seq);
    }
}

/* Rows in flight whose caller asked them to stop leave now, at the step boundary (one poll per row
 * a step; a row just admitted is polled here, not in admit). */
static void drop_cancelled(squad_sched *s) {
    for (int i = 0; i < s->max_rows; i++)
        if (s->slots[i] && cancelled(s->slots[i])) row_cancel(s, s->slots[i]);
}

/* ---- packing --------------------------------------------------------------------------------- */

/* The step's budget and the longest chunk, from the backend's limits as they are now. */
static int batch_tokens(const squad_sched *s) { return min_int(s->batch_tokens, s->be->max_batch_tokens); }
static int chunk_cap(const squad_sched *s) { return min_int(s->be->max_chunk, batch_tokens(s)); }

/* Where the row's next chunk must stop: the plan's next bound in the prefix, else the row's end. */
static int chunk_target(const squad_sched_row *r) {
    if (r->cached && r->bound < r->plan.n_bounds) return r->plan.bounds[r->bound];
    return r->row.n_ids;
}

/* The chunk of `len` tokens from the row's position, on its slot, with its answer slots. */
static void fill_chunk(squad_sched *s, squad_sched_row *r, int len, squad_chunk *ck) {
    const squad_row *row = &r->row;
    memset(ck, 0, sizeof *ck);
    ck->seq = r->seq;
    ck->ids = row->ids + r->pos;
    ck->start = r->pos;
    ck->len = len;
    ck->letters = row->letters;
    ck->n_letters = row->n_letters;
    r->ck_first = r->next_slot;
    for (int i = r->next_slot; i < row->n_slots && row->slots[i] < r->pos + len; i++) {
        ck->slots[ck->n_slots] = row->slots[i] - r->pos;
        ck->nopts[ck->n_slots] = row->nopts[i];
        ck->n_slots++;
    }
    r->ck_n = ck->n_slots;
    r->ck_len = len;
    if (r->opts.want_vocab && ck->n_slots) ck->vocab = r->vocab;
    if (r->positions) ck->positions = r->positions + 3 * (size_t)r->pos; /* a row with images */
    if (s->sp) {
        ck->route = r->route;
        ck->router_sum = r->chunk_sum;
    }
    ck->probs = ck->n_slots ? &r->probs[0][0] : NULL;
}

int squad_sched_want(const squad_sched *s, const squad_sched_row *r) {
    return min_int(chunk_target(r) - r->pos, chunk_cap(s));
}

/* Orders candidates: starved rows first, oldest first among them; then the shortest wants, then the
 * oldest. */
static int before(const squad_sched_row *a, int wa, const squad_sched_row *b, int wb) {
    const int sa = a->shorted >= SCHED_STARVE_STEPS, sb = b->shorted >= SCHED_STARVE_STEPS;
    if (sa != sb) return sa;
    if (sa) return a->order < b->order; /* starved rows in the order they came: none waits on ever-shorter ones */
    if (wa != wb) return wa < wb;
    return a->order < b->order;
}

/* Picks this step's chunks (the policy in the header comment); returns how many. */
static int pack(squad_sched *s) {
    squad_sched_row **cand = s->batch;
    int *want = s->want, *got = s->got;
    int n = 0;
    for (int i = 0; i < s->max_rows; i++) {
        squad_sched_row *r = s->slots[i];
        if (!r) continue;
        /* insertion by the order above */
        const int w = squad_sched_want(s, r);
        int j = n++;
        for (; j > 0 && before(r, w, cand[j - 1], want[j - 1]); j--) {
            cand[j] = cand[j - 1];
            want[j] = want[j - 1];
        }
        cand[j] = r;
        want[j] = w;
    }
    int left = batch_tokens(s);
    for (int j = 0; j < n; j++) { /* whole wants while they fit (the first always does) */
        got[j] = want[j] <= left ? want[j] : 0;
        left -= got[j];
    }
    for (int pass_left = 1; pass_left && left >= SCHED_CUT_ALIGN;) { /* cuts, oldest first */
        int oldest = -1;
        for (int j = 0; j < n; j++)
            if (!got[j] && (oldest < 0 || cand[j]->order < cand[oldest]->order)) oldest = j;
        if (oldest < 0) break;
        got[oldest] = left - left % SCHED_CUT_ALIGN;
        left -= got[oldest];
        pass_left = got[oldest] > 0;
    }
    int m = 0;
    for (int j = 0; j < n; j++) {
        squad_sched_row *r = cand[j];
        r->shorted = got[j] < want[j] ? r->shorted + 1 : 0;
        if (!got[j]) continue;
        fill_chunk(s, r, got[j], &s->chunks[m]);
        cand[m++] = r;
    }
    return m;
}

/* ---- images ---------------------------------------------------------------------------------- */

/* One image's tower output into dst (rows x out_hidden): the encoder cache's copy, or the
 * processor's pixel values through the backend's tower (then kept in the encoder cache). */
static int image_embed(squad_sched *s, const squad_row_image *im, float *dst, squad_err *err) {
    squad_backend *be = s->be;
    const squad_model *m = be->model;
    const size_t n = (size_t)im->tokens * (size_t)m->cfg.hidden_size;
    if (squad_encoder_cache_get(s->encoder, im->identity, dst, n)) {
        s->encoder_hits++;
        return 0;
    }
    if (!be->vision_forward)
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "images: the %s backend has no vision tower", be->name);
    if (!m->has_image_proc)
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "images: the model has no image processor configuration");
    squad_image_patches pp;
    int rc = squad_image_preprocess_threads(&m->image_proc, im->image, s->image_threads, &pp, err);
    if (rc) return rc;
    if (memcmp(pp.grid, im->grid, sizeof pp.grid) != 0 || pp.n_tokens != im->tokens)
        rc = squad_fail(err, SQUAD_E_INVALID, "images: the processor made grid %dx%dx%d, the row says %dx%dx%d", pp.grid[0],
                        pp.grid[1], pp.grid[2], im->grid[0], im->grid[1], im->grid[2]);
    if (!rc) rc = be->vision_forward(be, pp.pixel_values, pp.grid, dst, err);
    squad_image_patches_free(&pp);
    if (rc) return rc;
    s->towers_run++;
    squad_err put_err = {0}; /* an encoder cache that cannot keep it only misses later */
    squad_encoder_cache_put(s->encoder, im->identity, dst, n, &put_err);
    return 0;
}

/* The row's image rows for tokens [pos, end): every image with tokens there that the row has not
 * got yet (a chunk after the images, or a restore past them, needs none). */
static int images_ready(squad_sched *s, squad_sched_row *r, int pos, int end, squad_err *err) {
    const squad_row *row = &r->row;
    const int H = s->be->model->cfg.hidden_size;
    for (int k = 0; k < row->n_images; k++) {
        const squad_row_image *im = &row->images[k];
        if (r->img_ready[k] || im->pos >= end || im->pos + im->tokens <= pos) continue;
        if (!r->img_embeds &&
            !(r->img_embeds = squad_malloc((size_t)squad_image_row_tokens(row) * (size_t)H * sizeof(float), err)))
            return SQUAD_E_NOMEM;
        float *dst = r->img_embeds + (size_t)squad_image_row_tokens_before(row, im->pos) * (size_t)H;
        int rc = image_embed(s, im, dst, err);
        if (rc) return rc;
        r->img_ready[k] = 1;
    }
    return 0;
}

/* The chunk's image rows (images_ready has filled them): NULL when it holds no image token. */
static void chunk_embeds(const squad_sched *s, const squad_sched_row *r, squad_chunk *ck) {
    const int before = squad_image_row_tokens_before(&r->row, ck->start);
    ck->embeds = NULL;
    if (r->img_embeds && squad_image_row_tokens_before(&r->row, ck->start + ck->len) > before)
        ck->embeds = r->img_embeds + (size_t)before * (size_t)s->be->model->cfg.hidden_size;
}

/* The image rows of the step's n chunks (filled after packing, before the forward); a row whose
 * tower fails leaves now, failed, and its chunk goes from the batch. Returns the chunks left. */
static int batch_images(squad_sched *s, int n) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        squad_sched_row *r = s->batch[i];
        squad_chunk *ck = &s->chunks[i];
        if (r->row.n_images > 0) {
            squad_err err = {0};
            const int rc = images_ready(s, r, ck->start, ck->start + ck->len, &err);
            if (rc) {
                row_end(s, r, rc, &err);
                continue;
            }
            chunk_embeds(s, r, ck);
        }
        s->batch[m] = r;
        s->chunks[m++] = *ck;
    }
    return m;
}

/* ---- forward --------------------------------------------------------------------------------- */

/* The chunks one route at a time (a backend that cannot mix them in one batch). */
static int forward_by_route(squad_sched *s, int n, squad_err *err) {
    unsigned char *done = s->routed;
    memset(done, 0, (size_t)n);
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        int m = 0;
        for (int j = i; j < n; j++)
            if (!done[j] && s->chunks[j].route == s->chunks[i].route) {
                s->sub[m++] = s->chunks[j];
                done[j] = 1;
            }
        int rc = s->be->forward(s->be, s->sub, m, err);
        if (rc) return rc;
    }
    return 0;
}

static int forward(squad_sched *s, int n, squad_err *err) {
    int mixed = 0;
    for (int i = 1; i < n; i++) mixed |= s->chunks[i].route != s->chunks[0].route;
    if (mixed && !s->be->mixed_routes) return forward_by_route(s, n, err);
    int rc = s->be->forward(s->be, s->chunks, n, err);
    /* a backend may refuse a mix it cannot run (before any state changed): one route at a time */
    if (rc == SQUAD_E_UNSUPPORTED && mixed) rc = forward_by_route(s, n, err);
    return rc;
}

/* ---- advancing ------------------------------------------------------------------------------- */

/* The chunk's answers into the row's result, its router features into the row's. */
static void take_chunk(squad_sched_row *r) {
    squad_result *out = r->out;
    for (int i = 0; i < r->ck_n; i++) {
        const int k = r->ck_first + i;
        memcpy(out->probs[k], r->probs[i], sizeof r->probs[i]);
        if (r->opts.want_vocab) {
            out->vocab_lse[k] = r->vocab[i].vocab_lse;
            out->letters_lse[k] = r->vocab[i].letters_lse;
            out->top_logit[k] = r->vocab[i].top_logit;
            out->top_token[k] = r->vocab[i].top_token;
        }
    }
    if (r->chunk_sum) squad_router_feat_add_dsum(&r->feat, r->chunk_sum, r->ck_len);
    r->next_slot = r->ck_first + r->ck_n;
    r->pos += r->ck_len;
    r->computed += (uint64_t)r->ck_len;
    out->computed += r->ck_len;
}

/* The row's pass reached its end: the router confirms or overturns a guess. Returns 1 when the row
 * is answered, 0 when it runs again (a misprediction), negative on failure. */
static int pass_end(squad_sched *s, squad_sched_row *r, squad_err *err) {
    int decided = r->route;
    if (r->guessed) {
        decided = squad_router_route(&s->sp->router, &r->feat, NULL, NULL, err);
        if (decided < 0) return decided;
    }
    if (decided == r->route) {
        if (r->cached && !r->committed) {
            int rc = squad_plan_commit(s->cache, s->be, r->seq, &r->krow, &r->plan, err);
            if (rc) return rc;
            r->committed = 1;
        }
        return 1;
    }
    /* a misprediction: again with the router's route, in the same slot */
    if (r->cached) plan_close(s, r, SQUAD_PLAN_RETRY);
    else s->mispredictions_plain++;
    int rc = pass_start(s, r, decided, err);
    return rc ? rc : 0;
}

/* After the row's chunk ran: its state machine one step on. */
static void advance(squad_sched *s, squad_sched_row *r) {
    squad_err err = {0};
    int rc = 0;
    take_chunk(r);
    if (r->cached && r->bound < r->plan.n_bounds && r->pos == r->plan.bounds[r->bound]) {
        rc = squad_plan_save_bound(s->cache, s->be, r->seq, &r->plan, r->bound, s->sp ? &r->feat : NULL, &err);
        r->bound++;
        if (!rc && r->bound == r->plan.n_bounds && !r->guessed) { /* at p on a certain route */
            rc = squad_plan_commit(s->cache, s->be, r->seq, &r->krow, &r->plan, &err);
            r->committed = !rc;
        }
    }
    if (!rc && r->pos == r->row.n_ids) {
        rc = pass_end(s, r, &err);
        if (rc == 1) {
            row_end(s, r, 0, NULL);
            return;
        }
    }
    if (rc) row_end(s, r, rc, &err);
}

/* The step's ended rows to the caller; the list starts empty for the next step. */
static int hand_back(squad_sched *s, squad_sched_row **ended, int rc) {
    *ended = s->ended_head;
    s->ended_head = s->ended_tail = NULL;
    return rc ? rc : squad_sched_pending(s);
}

int squad_sched_step(squad_sched *s, int last_route, squad_sched_row **ended, squad_err *err) {
    s->guess_route = last_route;
    admit(s);
    drop_cancelled(s);
    int n = pack(s);
    if (n > 0) n = batch_images(s, n);
    if (n == 0) return hand_back(s, ended, 0);
    const int rc = forward(s, n, err);
    if (rc) { /* the backend failed: every row in flight ends with its error */
        for (int i = 0; i < s->max_rows; i++)
            if (s->slots[i]) row_end(s, s->slots[i], rc, err);
        return hand_back(s, ended, rc);
    }
    for (int i = 0; i < n; i++) advance(s, s->batch[i]);
    return hand_back(s, ended, 0);
}

/* ---- one row, one span (squad_engine_run_span) ------------------------------------------------ */

int squad_sched_run_span(squad_sched *s, int seq, int route, const squad_row *row, int start, int end,
                         const squad_score_opts *opts, squad_result *out, squad_err *err) {
    squad_sched_row *r = squad_calloc(1, sizeof *r, err);
    if (!r) return SQUAD_E_NOMEM;
    r->row = *row;
    if (opts) r->opts = *opts;
    r->out = out;
    r->seq = seq;
    r->route = route; /* and no chunk_sum: no router features */
    r->pos = start;
    r->next_slot = first_slot_from(row, start);
    int rc = row_image_views(s, r, 0, err); /* a span is never cached: no key view */
    while (!rc && r->pos < end) {
        if (cancelled(r)) {
            rc = squad_fail(err, SQUAD_E_CANCELLED, "row cancelled by the caller at token %d of %d", r->pos, row->n_ids);
            break;
        }
        squad_chunk ck;
        const int len = min_int(end - r->pos, chunk_cap(s));
        rc = images_ready(s, r, r->pos, r->pos + len, err);
        if (rc) break;
        fill_chunk(s, r, len, &ck);
        chunk_embeds(s, r, &ck);
        rc = s->be->forward(s->be, &ck, 1, err);
        if (!rc) take_chunk(r);
    }
    squad_sched_row_free(r);
    return rc;
}
