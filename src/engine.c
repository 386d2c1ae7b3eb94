/*
 * engine.c — the engine: validates rows, picks the path (memo, state cache, plain) and runs spans
 * of a row through the backend in chunks.
 *
 * The plain path resets the backend's working state and runs the whole row in chunks of at most
 * be->max_chunk tokens; because every chunk continues from the state the previous one left, any
 * split gives the same answer (up to round-off). On the cached path the cache plans the row
 * (cache.c: the checkpoint to restore, the positions to checkpoint) and the executor
 * (cache_exec.c) runs the plan: it restores instead of resetting and runs the rest through
 * squad_engine_run_span.
 *
 * Per-call options (squad_score_opts) live on the engine while the call runs (e->call), so the
 * span runner the executor calls sees them: the cancel callback is polled before every chunk
 * of either path, and a row that wants the full-vocabulary figures passes a vocab array with
 * each chunk that has slots (chunks without slots, and rows that do not ask, pay nothing).
 * A cancelled row leaves the backend's working state half-run, which is harmless: every row
 * starts with a reset or a restore.
 *
 * Specialists (docs/specialists.md): every chunk runs with a route (e->run_route) and returns its
 * router features, which the engine adds to the row's accumulator (e->feat). A row runs with a
 * guessed route: the forced one (squad_row.specialist), else, on the cached path, the route of
 * the checkpoint it restores, else the last row's route. After the last chunk the router decides;
 * a wrong guess (a misprediction) runs the row again with the right route (on the cached path from
 * that route's deepest checkpoint, cache_exec.c; off it from the start). The router runs on forced rows
 * too, so every answer carries the router's probabilities.
 */
#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "cache_exec.h"
#include "memo.h"
#include "model.h"
#include "specialists.h"
#include "util.h"

/* Defaults of docs/design.md section 7. */
#define DEFAULT_CACHE_MB 1024
#define DEFAULT_ALIGN 64
#define DEFAULT_TAIL 16
#define DEFAULT_STRIDE 2048
#define DEFAULT_MIN_PREFIX 256
#define DEFAULT_MAX_SLOTS 4

void squad_engine_opts_default(squad_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = SQUAD_DEVICE_AUTO;
    o->threads = 0;
    o->precision = SQUAD_PRECISION_DEFAULT;
    o->cache.budget_bytes = (size_t)DEFAULT_CACHE_MB << 20;
    o->cache.align = DEFAULT_ALIGN;
    o->cache.tail = DEFAULT_TAIL;
    o->cache.stride = DEFAULT_STRIDE;
    o->cache.min_prefix = DEFAULT_MIN_PREFIX;
    o->cache.max_slots = DEFAULT_MAX_SLOTS;
}

static squad_backend *make_backend(squad_model *model, const squad_engine_opts *opts, int max_context,
                                   squad_err *err) {
    int want_cuda = opts->device == SQUAD_DEVICE_CUDA;
#ifdef SQUAD_HAVE_CUDA
    /* auto picks a usable GPU, specialists or not: the CUDA backend runs them too */
    if (opts->device == SQUAD_DEVICE_AUTO && squad_cuda_device_usable()) want_cuda = 1;
    if (want_cuda) {
        if (squad_cuda_device_count() <= 0) {
            squad_fail(err, SQUAD_E_BACKEND, "--device cuda: no CUDA GPU is available");
            return NULL;
        }
        return squad_cuda_backend_new(model, opts, max_context, err);
    }
#else
    if (want_cuda) {
        squad_fail(err, SQUAD_E_UNSUPPORTED, "--device cuda: this build of squad has no CUDA backend");
        return NULL;
    }
#endif
    return squad_cpu_backend_new(model, opts, max_context, err);
}

/* SQUAD_CACHE_BUDGET_AUTO: on a device, its free memory now (the backend built: weights, state,
 * scratch) less a safety margin and less what the working K / V may still grow by (it follows the
 * rows up to max_context, and the cache must not take the room it grows into), 0 (no cache) when
 * that leaves nothing; checkpoints of a host backend use host memory, which the default budget
 * bounds. */
static int auto_budget(squad_backend *be, size_t *budget, squad_err *err) {
    if (!be->memory_free) {
        *budget = (size_t)DEFAULT_CACHE_MB << 20;
        return 0;
    }
    size_t free_bytes = 0;
    int rc = be->memory_free(be, &free_bytes, err);
    if (rc) return rc;
    const int held = be->kv_positions < be->max_context ? be->kv_positions : be->max_context;
    const size_t keep = SQUAD_AUTO_BUDGET_MARGIN_BYTES + (size_t)(be->max_context - held) * be->kv_bytes_per_pos;
    *budget = free_bytes > keep ? free_bytes - keep : 0;
    return 0;
}

/* Wires the specialists in: the backend applies them, the cache keeps router features. The CPU
 * backend reads the adapters' fp32 host weights in place, so every adapter is resident there and
 * max_adapters bounds nothing on it. */
static int engine_specialists(squad_engine *e, squad_err *err) {
    const squad_specialists *sp = e->opts.specialists;
    if (!e->be->specialists)
        return squad_fail(err, SQUAD_E_UNSUPPORTED, "--specialists: the %s backend does not run specialists yet",
                          e->be->name);
    if (e->opts.max_adapters < 0)
        return squad_fail(err, SQUAD_E_INVALID, "--max-adapters %d: must be 0 (all) or more", e->opts.max_adapters);
    if (sp->hidden != e->model->cfg.hidden_size)
        return squad_fail(err, SQUAD_E_INVALID, "specialists %s were loaded for another model", sp->dir);
    e->sp = sp;
    if (squad_router_feat_init(&e->feat, sp->hidden, err)) return SQUAD_E_NOMEM;
    if (!(e->chunk_sum = squad_calloc((size_t)sp->hidden, sizeof *e->chunk_sum, err))) return SQUAD_E_NOMEM;
    if (e->cache && squad_cache_set_feat_dim(e->cache, sp->hidden, err)) return SQUAD_E_INVALID;
    return 0;
}

/* The longest row before the backend exists: the model's positions, or the option when it asks
 * for fewer. An option past the model's positions is refused rather than silently lowered. */
static int choose_max_tokens(const squad_model *model, const squad_engine_opts *o, int *max_tokens, squad_limit *why,
                             squad_err *err) {
    const int model_max = squad_model_max_tokens(model);
    if (o->max_tokens < 0)
        return squad_fail(err, SQUAD_E_INVALID, "max_tokens %d must be 0 (the model's %d positions) or positive",
                          o->max_tokens, model_max);
    if (o->max_tokens > model_max)
        return squad_fail(err, SQUAD_E_INVALID,
                          "max_tokens %d is past the model's max_position_embeddings (%d)", o->max_tokens, model_max);
    *max_tokens = o->max_tokens > 0 ? o->max_tokens : model_max;
    *why = o->max_tokens > 0 && o->max_tokens < model_max ? SQUAD_LIMIT_OPTION : SQUAD_LIMIT_MODEL;
    return 0;
}

static const char *limit_name(squad_limit why) {
    switch (why) {
    case SQUAD_LIMIT_OPTION: return "the max_tokens option";
    case SQUAD_LIMIT_MEMORY: return "bounded by memory, not the model";
    default: return "the model's max_position_embeddings";
    }
}

squad_engine *squad_engine_new(squad_model *model, const squad_engine_opts *opts_in, squad_err *err) {
    squad_engine_opts defaults;
    if (!opts_in) {
        squad_engine_opts_default(&defaults);
        opts_in = &defaults;
    }
    squad_engine *e = squad_calloc(1, sizeof *e, err);
    if (!e) return NULL;
    e->model = model;
    e->opts = *opts_in;
    if (choose_max_tokens(model, &e->opts, &e->max_tokens, &e->limit, err)) goto fail;
    e->be = make_backend(model, &e->opts, e->max_tokens, err);
    if (!e->be) goto fail;
    if (e->be->max_context < e->max_tokens) { /* the backend could not hold that many positions */
        e->max_tokens = e->be->max_context;
        e->limit = SQUAD_LIMIT_MEMORY;
    }
    if (e->opts.cache.budget_bytes == SQUAD_CACHE_BUDGET_AUTO && auto_budget(e->be, &e->opts.cache.budget_bytes, err))
        goto fail;
    if (e->opts.cache.budget_bytes > 0) {
        e->cache = squad_cache_new(e->be, &e->opts.cache, err);
        if (!e->cache) goto fail;
        e->memo = squad_memo_new(SQUAD_MEMO_DEFAULT_BYTES, err);
        if (!e->memo) goto fail;
    }
    if (e->opts.specialists && engine_specialists(e, err)) goto fail;
    return e;
fail:
    squad_engine_free(e);
    return NULL;
}

void squad_engine_free(squad_engine *e) {
    if (!e) return;
    while (e->jobs_head) {
        squad_engine_job *j = e->jobs_head;
        e->jobs_head = j->next;
        free(j);
    }
    squad_memo_free(e->memo);
    squad_cache_free(e->cache);
    if (e->be) e->be->destroy(e->be);
    squad_router_feat_free(&e->feat);
    free(e->chunk_sum);
    free(e);
}

const char *squad_engine_device(const squad_engine *e) { return e->be->name; }

int squad_engine_max_tokens(const squad_engine *e, squad_limit *why) {
    if (why) *why = e->limit;
    return e->max_tokens;
}

int squad_row_check(const squad_model *model, const squad_row *r, squad_err *err) {
    int V = model->cfg.vocab_size;
    int max_tokens = squad_model_max_tokens(model);
    if (!r->ids || r->n_ids < 1) return squad_fail(err, SQUAD_E_INVALID, "ids is empty");
    if (r->n_ids > max_tokens)
        return squad_fail(err, SQUAD_E_INVALID, "row has %d tokens; the longest supported is %d (%s)", r->n_ids,
                          max_tokens, limit_name(SQUAD_LIMIT_MODEL));
    for (int i = 0; i < r->n_ids; i++)
        if (r->ids[i] < 0 || r->ids[i] >= V)
            return squad_fail(err, SQUAD_E_INVALID, "ids[%d] = %d is outside the vocabulary (0..%d)", i, r->ids[i], V - 1);
    if (r->n_letters < 1 || r->n_letters > SQUAD_MAX_LETTERS || !r->letters)
        return squad_fail(err, SQUAD_E_INVALID, "letters must hold 1..%d token ids (got %d)", SQUAD_MAX_LETTERS,
                          r->n_letters);
    for (int i = 0; i < r->n_letters; i++)
        if (r->letters[i] < 0 || r->letters[i] >= V)
            return squad_fail(err, SQUAD_E_INVALID, "letters[%d] = %d is outside the vocabulary (0..%d)", i,
                              r->letters[i], V - 1);
    if (r->n_slots < 1 || !r->slots || !r->nopts)
        return squad_fail(err, SQUAD_E_INVALID, "a row needs at least one slot");
    if (r->n_slots > SQUAD_MAX_SLOTS_PER_ROW)
        return squad_fail(err, SQUAD_E_INVALID, "%d slots; at most %d per row", r->n_slots, SQUAD_MAX_SLOTS_PER_ROW);
    for (int i = 0; i < r->n_slots; i++) {
        if (r->slots[i] < 0 || r->slots[i] >= r->n_ids)
            return squad_fail(err, SQUAD_E_INVALID, "slots[%d] = %d is outside the row (0..%d)", i, r->slots[i],
                              r->n_ids - 1);
        if (i > 0 && r->slots[i] <= r->slots[i - 1])
            return squad_fail(err, SQUAD_E_INVALID, "slots must be sorted and unique (slots[%d] = %d after %d)", i,
                              r->slots[i], r->slots[i - 1]);
        if (r->nopts[i] < 1 || r->nopts[i] > r->n_letters)
            return squad_fail(err, SQUAD_E_INVALID, "nopts[%d] = %d must be in 1..%d (the number of letters)", i,
                              r->nopts[i], r->n_letters);
    }
    if (r->specialist < 0)
        return squad_fail(err, SQUAD_E_INVALID, "specialist %d: 0 (the router decides) or a route + 1", r->specialist);
    if (r->state_len < -1 || r->state_len > r->n_ids)
        return squad_fail(err, SQUAD_E_INVALID, "state_len %d must be in 0..%d (the row's length)", r->state_len,
                          r->n_ids);
    return 0;
}

int squad_engine_row_check(const squad_engine *e, const squad_row *r, squad_err *err) {
    int rc = squad_row_check(e->model, r, err);
    if (rc) return rc;
    if (r->n_ids > e->max_tokens)
        return squad_fail(err, SQUAD_E_INVALID, "row has %d tokens; the longest supported is %d (%s)", r->n_ids,
                          e->max_tokens, limit_name(e->limit));
    return 0;
}

int squad_engine_run_span(squad_engine *e, const squad_row *row, int start, int end, squad_result *out,
                          squad_err *err) {
    squad_backend *be = e->be;
    const squad_score_opts *call = e->call;
    const int want_vocab = call && call->want_vocab;
    float probs[SQUAD_MAX_SLOTS_PER_ROW][SQUAD_MAX_LETTERS];
    squad_slot_vocab vocab[SQUAD_MAX_SLOTS_PER_ROW];
    int slot = 0; /* the row's first slot not yet answered */
    while (slot < row->n_slots && row->slots[slot] < start) slot++;
    for (int s = start; s < end;) {
        if (call && call->cancelled && call->cancelled(call->cancel_ctx))
            return squad_fail(err, SQUAD_E_CANCELLED, "row cancelled by the caller at token %d of %d", s, row->n_ids);
        int len = end - s < be->max_chunk ? end - s : be->max_chunk;
        squad_chunk ck;
        memset(&ck, 0, sizeof ck);
        ck.ids = row->ids + s;
        ck.start = s;
        ck.len = len;
        ck.letters = row->letters;
        ck.n_letters = row->n_letters;
        int first = slot;
        while (slot < row->n_slots && row->slots[slot] < s + len) {
            ck.slots[ck.n_slots] = row->slots[slot] - s;
            ck.nopts[ck.n_slots] = row->nopts[slot];
            ck.n_slots++;
            slot++;
        }
        if (want_vocab && ck.n_slots) ck.vocab = vocab;
        if (e->sp) {
            ck.route = e->run_route;
            ck.router_sum = e->chunk_sum;
        }
        ck.probs = ck.n_slots ? &probs[0][0] : NULL;
        int rc = be->forward(be, &ck, 1, err);
        if (rc) return rc;
        if (e->sp) squad_router_feat_add_dsum(&e->feat, e->chunk_sum, len);
        for (int i = 0; i < ck.n_slots; i++) memcpy(out->probs[first + i], probs[i], sizeof probs[i]);
        for (int i = 0; ck.vocab && i < ck.n_slots; i++) {
            out->vocab_lse[first + i] = vocab[i].vocab_lse;
            out->letters_lse[first + i] = vocab[i].letters_lse;
            out->top_logit[first + i] = vocab[i].top_logit;
            out->top_token[first + i] = vocab[i].top_token;
        }
        out->computed += len;
        s += len;
    }
    return 0;
}

/* squad_engine_run_span as the cache executor's span runner. */
static int engine_span(void *ctx, const squad_row *row, int start, int end, squad_result *out, squad_err *err) {
    return squad_engine_run_span((squad_engine *)ctx, row, start, end, out, err);
}

/* The router's route on the running row's features. */
static int decide_route(void *ctx, squad_err *err) {
    squad_engine *e = ctx;
    return squad_router_route(&e->sp->router, &e->feat, NULL, NULL, err);
}

/* The whole row from a reset, with the route e->run_route. */
static int run_from_start(squad_engine *e, const squad_row *row, squad_result *out, squad_err *err) {
    if (e->sp) squad_router_feat_reset(&e->feat);
    int rc = e->be->reset(e->be, 0, err);
    if (!rc) rc = squad_engine_run_span(e, row, 0, row->n_ids, out, err);
    return rc;
}

/* forced: the route the row must run with, -1 to let the router decide. */
static int score_plain(squad_engine *e, const squad_row *row, int forced, squad_result *out, squad_err *err) {
    e->run_route = forced >= 0 ? forced : e->last_route;
    int rc = run_from_start(e, row, out, err);
    if (!rc && e->sp && forced < 0) {
        const int route = decide_route(e, err);
        if (route < 0) return route;
        if (route != e->run_route) { /* a misprediction: the row again with the router's route */
            e->mispredictions_plain++;
            e->run_route = route;
            rc = run_from_start(e, row, out, err);
        }
    }
    out->route = e->run_route;
    if (!rc) e->plain_rows++; /* a failed or cancelled row is not counted */
    return rc;
}

/* label_mass from the two log-sum-exps. A share cannot exceed 1; the round-off between the two
 * sums (or a letter listed twice) could put it a hair past, so it is clamped. */
static void fill_label_mass(squad_result *out) {
    for (int i = 0; i < out->n_slots; i++) {
        const double m = exp((double)out->letters_lse[i] - (double)out->vocab_lse[i]);
        out->label_mass[i] = (float)(m < 1.0 ? m : 1.0);
    }
}

static int score_row(squad_engine *e, const squad_row *row, const squad_score_opts *o, squad_result *out,
                     squad_err *err) {
    if (e->memo && squad_memo_lookup(e->memo, row, o->want_vocab, out)) {
        out->reused = row->n_ids;
        out->computed = 0;
        out->memo = 1;
        e->memo_hits++;
        e->tokens_memo += (uint64_t)row->n_ids;
        e->route_rows[out->route]++;
        return 0;
    }
    const int forced = e->sp ? row->specialist - 1 : 0;
    int rc;
    if (e->cache && squad_cache_eligible(e->cache, row)) {
        squad_cache_routing rt = {forced, e->last_route, &e->run_route, &e->feat, decide_route, e, 0};
        rc = squad_cache_exec(e->cache, e->be, engine_span, e, row, o->end_checkpoint_only, o->checkpoints,
                              o->n_checkpoints, e->sp ? &rt : NULL, out, err);
    } else {
        rc = score_plain(e, row, forced, out, err);
    }
    if (rc) return rc;
    if (e->sp) {
        /* the router's view of the row (a forced row's too), from the features of its final pass */
        int r = squad_router_route(&e->sp->router, &e->feat, NULL, out->route_probs, err);
        if (r < 0) return r;
        out->n_routes = e->sp->router.n_labels;
        e->last_route = out->route;
    }
    e->route_rows[out->route]++;
    out->n_slots = row->n_slots;
    if (o->want_vocab) {
        out->has_vocab = 1;
        fill_label_mass(out);
    }
    if (e->memo) squad_memo_put(e->memo, row, out, NULL); /* a memo that cannot grow just misses later */
    return 0;
}

int squad_engine_score_ex(squad_engine *e, const squad_row *row, const squad_score_opts *opts, squad_result *out,
                          squad_err *err) {
    static const squad_score_opts no_opts; /* all zero: squad_engine_score's behaviour */
    memset(out, 0, sizeof *out);
    int rc = squad_engine_row_check(e, row, err);
    if (rc) return rc;
    const int n_routes = e->sp ? e->sp->router.n_labels : 1;
    if (row->specialist < 0 || row->specialist > (e->sp ? n_routes : 0))
        return e->sp ? squad_fail(err, SQUAD_E_INVALID, "specialist %d: 0 (the router decides) or 1..%d (a route + 1)",
                                  row->specialist, n_routes)
                     : squad_fail(err, SQUAD_E_INVALID, "the row forces a specialist but the engine has none");
    out->n_slots = row->n_slots;
    e->call = opts ? opts : &no_opts;
    rc = score_row(e, row, e->call, out, err);
    e->call = NULL;
    if (rc) {
        const int n_slots = out->n_slots;
        memset(out, 0, sizeof *out); /* nothing of a failed row is an answer */
        out->n_slots = n_slots;
    }
    return rc;
}

/* ---- several rows: submit / step ------------------------------------------------------------- */

int squad_engine_submit(squad_engine *e, const squad_row *row, const squad_score_opts *opts, squad_result *out,
                        squad_done_fn done, void *ctx, squad_err *err) {
    int rc = squad_engine_row_check(e, row, err);
    if (rc) return rc;
    squad_engine_job *j = squad_calloc(1, sizeof *j, err);
    if (!j) return SQUAD_E_NOMEM;
    j->row = *row;
    if (opts) {
        j->opts = *opts;
        j->has_opts = 1;
    }
    j->out = out;
    j->done = done;
    j->ctx = ctx;
    if (e->jobs_tail)
        e->jobs_tail->next = j;
    else
        e->jobs_head = j;
    e->jobs_tail = j;
    e->jobs_pending++;
    return 0;
}

int squad_engine_step(squad_engine *e, squad_err *err) {
    (void)err;
    squad_engine_job *j = e->jobs_head;
    if (!j) return 0;
    e->jobs_head = j->next;
    if (!e->jobs_head) e->jobs_tail = NULL;
    e->jobs_pending--;
    squad_err row_err = {0};
    const int rc = squad_engine_score_ex(e, &j->row, j->has_opts ? &j->opts : NULL, j->out, &row_err);
    if (j->done) j->done(j->ctx, rc, &row_err);
    free(j);
    return e->jobs_pending;
}

int squad_engine_pending(const squad_engine *e) { return e->jobs_pending; }

typedef struct batch_done_ctx {
    int *rc;
    squad_err *err;
} batch_done_ctx;

static void batch_row_done(void *ctx, int rc, const squad_err *err) {
    batch_done_ctx *b = ctx;
    *b->rc = rc;
    if (b->err) *b->err = *err;
}

int squad_engine_score_batch(squad_engine *e, const squad_row *rows, int n_rows, const squad_score_opts *opts,
                             squad_result *outs, int *rcs, squad_err *errs, squad_err *err) {
    if (n_rows < 0) return squad_fail(err, SQUAD_E_INVALID, "a batch of %d rows", n_rows);
    int *rc_buf = squad_calloc((size_t)n_rows + 1, sizeof(int), err);
    batch_done_ctx *ctx = squad_calloc((size_t)n_rows + 1, sizeof *ctx, err);
    if (!rc_buf || !ctx) {
        free(rc_buf);
        free(ctx);
        return SQUAD_E_NOMEM;
    }
    int first_rc = 0;
    for (int i = 0; i < n_rows; i++) {
        ctx[i].rc = &rc_buf[i];
        ctx[i].err = errs ? &errs[i] : NULL;
        squad_err row_err = {0};
        const int rc = squad_engine_submit(e, &rows[i], opts, &outs[i], batch_row_done, &ctx[i], &row_err);
        if (rc) {
            memset(&outs[i], 0, sizeof outs[i]);
            rc_buf[i] = rc;
            if (errs) errs[i] = row_err;
        }
    }
    int left;
    while ((left = squad_engine_step(e, err)) > 0) {
    }
    int rc = left < 0 ? left : 0;
    for (int i = 0; i < n_rows; i++) {
        if (rcs) rcs[i] = rc_buf[i];
        if (rc_buf[i] && !first_rc) {
            first_rc = rc_buf[i];
            if (errs && err) *err = errs[i];
            else if (err) squad_fail(err, rc_buf[i], "row %d failed", i);
        }
    }
    free(rc_buf);
    free(ctx);
    return rc ? rc : first_rc;
}

int squad_engine_score(squad_engine *e, const squad_row *row, squad_result *out, squad_err *err) {
    return squad_engine_score_ex(e, row, NULL, out, err);
}

void squad_engine_cache_stats(const squad_engine *e, squad_cache_stats *out) {
    memset(out, 0, sizeof *out);
    if (e->cache) squad_cache_get_stats(e->cache, out);
    else out->budget_bytes = e->opts.cache.budget_bytes;
    out->plain = e->plain_rows;
    out->mispredictions += e->mispredictions_plain;
    out->memo_hits = e->memo_hits;
    out->tokens_memo = e->tokens_memo;
}

uint64_t squad_engine_route_rows(const squad_engine *e, int route) {
    const int n = e->sp ? e->sp->router.n_labels : 1;
    if (route < 0 || route >= n) return 0;
    return e->route_rows[route];
}

void squad_engine_cache_clear(squad_engine *e) {
    if (!e) return;
    squad_cache_clear(e->cache);
    squad_memo_clear(e->memo);
}
