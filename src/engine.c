/*
 * engine.c — the engine: validates rows, answers exact repeats from the memo, and hands the other
 * rows to the batching scheduler (scheduler.c), which runs them in batched steps through the state
 * cache or down the plain path; what is left here is the bookkeeping around a row (the router's
 * view, the memo, the counters).
 *
 * The layers are one-way, as in a decode loop over a memory that plans and a caller that applies:
 * the cache plans a row's pass (cache.c), the scheduler applies the plan on a sequence slot
 * (plan_apply.c) and runs the batched steps, and squad_sched_step returns the rows that left in
 * the step. Only then, here, does a row become an answer: the router's view of it, its memo entry,
 * the counters, the done callback. Nothing below calls back up into the engine.
 *
 * Every way in is the scheduler: squad_engine_submit queues a row, squad_engine_step runs one
 * batched step, and squad_engine_score_ex / squad_engine_score_batch are submit plus steps until
 * their rows are done. With max_rows 1 that is one row at a time, chunk by chunk, as a caller
 * without batching would run it.
 *
 * Images (docs/images.md): a row's images are checked here (image_rows.h) with the rest of the
 * row; the scheduler gives the backend their positions and, lazily, their tower rows, consulting
 * the encoder cache the engine owns (identity -> tower output, LRU within encoder_cache_bytes).
 *
 * Specialists (docs/specialists.md): each row in flight has its own route and router features;
 * scheduler.c runs the guess, the router's decision and a misprediction's second pass.
 */
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "image_rows.h"
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
    o->encoder_cache_bytes = SQUAD_ENCODER_CACHE_DEFAULT_BYTES;
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

/* SQUAD_CACHE_HOST_AUTO: the host tier sized from the machine where the backend has one (its
 * checkpoints in device memory): HOST_TIER_AUTO_DEVICE_X times the device budget (a host tier is
 * for states the device cannot keep, so it is sized as a multiple of what the device keeps),
 * at most 1 / HOST_TIER_AUTO_RAM_DIV of the physical memory and 1 / HOST_TIER_AUTO_AVAIL_DIV of
 * what is available now (the tier is pinned at start and never given back while serving: it must
 * leave the rest of the machine its memory); 0 under HOST_TIER_AUTO_MIN_BYTES. */
#define HOST_TIER_AUTO_DEVICE_X 2
#define HOST_TIER_AUTO_RAM_DIV 8
#define HOST_TIER_AUTO_AVAIL_DIV 2
#define HOST_TIER_AUTO_MIN_BYTES ((size_t)256 << 20)

/* MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read. */
static size_t mem_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb << 10;
}

static size_t auto_host_budget(const squad_backend *be, size_t device_budget) {
    if (!be->host_alloc || !be->blob_to_host) return 0;
    size_t bytes = device_budget > SIZE_MAX / HOST_TIER_AUTO_DEVICE_X ? SIZE_MAX : device_budget * HOST_TIER_AUTO_DEVICE_X;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) {
        const size_t ram = (size_t)pages * (size_t)page / HOST_TIER_AUTO_RAM_DIV;
        if (ram < bytes) bytes = ram;
    }
    const size_t avail = mem_available_bytes() / HOST_TIER_AUTO_AVAIL_DIV;
    if (avail > 0 && avail < bytes) bytes = avail;
    bytes = bytes >> 20 << 20;
    return bytes < HOST_TIER_AUTO_MIN_BYTES ? 0 : bytes;
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
    const int host_auto = e->opts.cache.host_budget_bytes == SQUAD_CACHE_HOST_AUTO;
    if (host_auto) e->opts.cache.host_budget_bytes = auto_host_budget(e->be, e->opts.cache.budget_bytes);
    if (e->opts.cache.budget_bytes > 0) {
        e->cache = squad_cache_new(e->be, &e->opts.cache, err);
        if (!e->cache && host_auto && err && err->code == SQUAD_E_NOMEM && e->opts.cache.host_budget_bytes > 0) {
            /* a size the engine chose and the system would not pin: on without the tier */
            e->opts.cache.host_budget_bytes = 0;
            *err = (squad_err){0};
            e->cache = squad_cache_new(e->be, &e->opts.cache, err);
        }
        if (!e->cache) goto fail;
        e->memo = squad_memo_new(SQUAD_MEMO_DEFAULT_BYTES, err);
        if (!e->memo) goto fail;
    }
    if (e->opts.specialists && engine_specialists(e, err)) goto fail;
    if (model->cfg.has_vision && e->opts.encoder_cache_bytes > 0 &&
        !(e->encoder = squad_encoder_cache_new(e->opts.encoder_cache_bytes, err)))
        goto fail;
    if (squad_sched_init(&e->sched, e->be, e->cache, e->memo, e->sp, &e->opts, err)) goto fail;
    e->sched.encoder = e->encoder;
    return e;
fail:
    squad_engine_free(e);
    return NULL;
}

void squad_engine_free(squad_engine *e) {
    if (!e) return;
    squad_sched_free(&e->sched); /* rows still taken in are dropped (their plans first) */
    squad_memo_free(e->memo);
    squad_encoder_cache_free(e->encoder);
    squad_cache_free(e->cache);
    if (e->be) e->be->destroy(e->be);
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
    return squad_image_row_check(model, r, err);
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
    return squad_sched_run_span(&e->sched, 0, 0, row, start, end, e->call, out, err);
}

/* label_mass from the two log-sum-exps. A share cannot exceed 1; the round-off between the two
 * sums (or a letter listed twice) could put it a hair past, so it is clamped. */
static void fill_label_mass(squad_result *out) {
    for (int i = 0; i < out->n_slots; i++) {
        const double m = exp((double)out->letters_lse[i] - (double)out->vocab_lse[i]);
        out->label_mass[i] = (float)(m < 1.0 ? m : 1.0);
    }
}

/* An answered row's images in the counters. */
static void count_images(squad_engine *e, const squad_row *row) {
    if (row->n_images <= 0) return;
    e->image_rows++;
    e->image_tokens += (uint64_t)squad_image_row_tokens(row);
}

/* A row the memo answered (out filled by the lookup): its figures and the counters. */
static void memo_answered(squad_engine *e, const squad_row *row, squad_result *out) {
    out->reused = row->n_ids;
    out->computed = 0;
    out->memo = 1;
    e->memo_hits++;
    e->tokens_memo += (uint64_t)row->n_ids;
    e->route_rows[out->route]++;
    count_images(e, row);
}

/* 1 when the memo answers the row (out filled, the counters counted), else 0. */
static int memo_answer(squad_engine *e, const squad_row *row, const squad_score_opts *o, squad_result *out) {
    if (!e->memo || !squad_memo_lookup(e->memo, row, o && o->want_vocab, out)) return 0;
    memo_answered(e, row, out);
    return 1;
}

/* A row whose last pass is done (out holds its answers and route): the router's view, the route
 * and memo bookkeeping, the vocabulary figures' label mass. 0, or a negative code with err filled. */
static int row_answered(squad_engine *e, squad_sched_row *r, squad_err *err) {
    squad_result *out = r->out;
    if (e->sp) {
        /* the router's view of the row (a forced row's too), from the features of its final pass */
        int rc = squad_router_route(&e->sp->router, &r->feat, NULL, out->route_probs, err);
        if (rc < 0) return rc;
        out->n_routes = e->sp->router.n_labels;
        e->last_route = out->route;
    }
    e->route_rows[out->route]++;
    out->n_slots = r->row.n_slots;
    if (r->opts.want_vocab) {
        out->has_vocab = 1;
        fill_label_mass(out);
    }
    if (e->memo) squad_memo_put(e->memo, &r->row, out, NULL); /* a memo that cannot grow just misses later */
    return 0;
}

/* A row the scheduler handed back: answered (or failed) here, its done called, freed. */
static void row_ended(squad_engine *e, squad_sched_row *r) {
    int rc = r->rc;
    squad_err err = r->err;
    if (r->end == SQUAD_SCHED_MEMO) {
        memo_answered(e, &r->row, r->out);
    } else if (!rc) {
        if (!r->cached) e->plain_rows++;
        rc = row_answered(e, r, &err);
    }
    if (!rc && r->end != SQUAD_SCHED_MEMO) count_images(e, &r->row);
    if (rc) { /* nothing of a failed row is an answer; the tokens it ran still count */
        const int computed = r->out->computed;
        memset(r->out, 0, sizeof *r->out);
        r->out->n_slots = r->row.n_slots;
        r->out->computed = computed;
        if (!err.code) err.code = rc;
    }
    if (r->done) r->done(r->ctx, rc, &err);
    squad_sched_row_free(r);
}

/* ---- rows in: submit / step ------------------------------------------------------------------ */

int squad_engine_submit(squad_engine *e, const squad_row *row, const squad_score_opts *opts, squad_result *out,
                        squad_done_fn done, void *ctx, squad_err *err) {
    int rc = squad_engine_row_check(e, row, err);
    if (rc) return rc;
    const int n_routes = e->sp ? e->sp->router.n_labels : 1;
    if (row->specialist < 0 || row->specialist > (e->sp ? n_routes : 0))
        return e->sp ? squad_fail(err, SQUAD_E_INVALID, "specialist %d: 0 (the router decides) or 1..%d (a route + 1)",
                                  row->specialist, n_routes)
                     : squad_fail(err, SQUAD_E_INVALID, "the row forces a specialist but the engine has none");
    memset(out, 0, sizeof *out);
    out->n_slots = row->n_slots;
    if (memo_answer(e, row, opts, out)) {
        if (done) done(ctx, 0, &(squad_err){0});
        return 0;
    }
    squad_sched_row *r = squad_sched_row_new(&e->sched, row, opts, out, done, ctx, err);
    if (!r) return SQUAD_E_NOMEM;
    squad_sched_enqueue(&e->sched, r);
    return 0;
}

/* One scheduler step, then the rows it handed back, in the order they left. */
int squad_engine_step(squad_engine *e, squad_err *err) {
    squad_sched_row *ended = NULL;
    const int rc = squad_sched_step(&e->sched, e->last_route, &ended, err);
    while (ended) {
        squad_sched_row *r = ended;
        ended = r->next;
        row_ended(e, r);
    }
    return rc < 0 ? rc : squad_sched_pending(&e->sched);
}

int squad_engine_pending(const squad_engine *e) { return squad_sched_pending(&e->sched); }

void squad_engine_batching(const squad_engine *e, int *max_rows, int *batch_tokens) {
    if (max_rows) *max_rows = e->sched.max_rows;
    if (batch_tokens) *batch_tokens = e->sched.batch_tokens;
}

void squad_engine_device_stats(const squad_engine *e, squad_device_stats *out) {
    memset(out, 0, sizeof *out);
    if (e->be->graph_stats) e->be->graph_stats(e->be, &out->graphs, &out->capture_s);
}

/* How one row of a caller waiting for it ended. */
typedef struct row_wait {
    int finished;
    int rc;
    squad_err *err; /* where its error goes: the caller's, or own */
    squad_err own;
} row_wait;

static void row_waited(void *ctx, int rc, const squad_err *err) {
    row_wait *w = ctx;
    w->finished = 1;
    w->rc = rc;
    if (rc) *w->err = *err;
}

/* Steps until every waited row finished. A failed step has ended the rows in flight (theirs among
 * them when they were); rows still queued go on in the next steps. */
static int step_until(squad_engine *e, const row_wait *waits, int n, squad_err *err) {
    int step_rc = 0;
    for (;;) {
        int open = 0;
        for (int i = 0; i < n; i++) open += !waits[i].finished;
        if (!open) return step_rc;
        squad_err step_err = {0};
        const int left = squad_engine_step(e, &step_err);
        if (left < 0 && !step_rc) {
            step_rc = left;
            if (err) *err = step_err;
        }
        if (left == 0) { /* idle with rows unfinished: cannot happen; never spin */
            int unanswered = 0;
            for (int i = 0; i < n; i++) unanswered += !waits[i].finished;
            if (unanswered)
                return squad_fail(err, SQUAD_E_BACKEND, "the scheduler went idle with %d rows unanswered", unanswered);
        }
    }
}

int squad_engine_score_ex(squad_engine *e, const squad_row *row, const squad_score_opts *opts, squad_result *out,
                          squad_err *err) {
    memset(out, 0, sizeof *out);
    row_wait w;
    memset(&w, 0, sizeof w);
    w.err = err ? err : &w.own;
    int rc = squad_engine_submit(e, row, opts, out, row_waited, &w, err);
    if (rc) return rc;
    squad_err step_err = {0};
    rc = step_until(e, &w, 1, &step_err);
    if (!w.finished) { /* the scheduler failed around it */
        if (err) *err = step_err;
        return rc ? rc : SQUAD_E_BACKEND;
    }
    return w.rc;
}

int squad_engine_score_batch(squad_engine *e, const squad_row *rows, int n_rows, const squad_score_opts *opts,
                             squad_result *outs, int *rcs, squad_err *errs, squad_err *err) {
    if (n_rows < 0) return squad_fail(err, SQUAD_E_INVALID, "a batch of %d rows", n_rows);
    row_wait *waits = squad_calloc((size_t)n_rows + 1, sizeof *waits, err);
    if (!waits) return SQUAD_E_NOMEM;
    for (int i = 0; i < n_rows; i++) {
        squad_err *row_err = errs ? &errs[i] : &waits[i].own;
        memset(row_err, 0, sizeof *row_err);
        waits[i].err = row_err;
        squad_err submit_err = {0};
        const int rc = squad_engine_submit(e, &rows[i], opts, &outs[i], row_waited, &waits[i], &submit_err);
        if (rc) { /* refused at once: it fails alone */
            memset(&outs[i], 0, sizeof outs[i]);
            waits[i].finished = 1;
            waits[i].rc = rc;
            *row_err = submit_err;
        }
    }
    squad_err step_err = {0};
    const int step_rc = step_until(e, waits, n_rows, &step_err);
    int first_rc = 0;
    for (int i = 0; i < n_rows; i++) {
        if (rcs) rcs[i] = waits[i].rc;
        if (waits[i].rc && !first_rc) {
            first_rc = waits[i].rc;
            if (err) *err = *waits[i].err;
        }
    }
    free(waits);
    if (step_rc && !first_rc) {
        if (err) *err = step_err;
        return step_rc;
    }
    return first_rc;
}

int squad_engine_score(squad_engine *e, const squad_row *row, squad_result *out, squad_err *err) {
    return squad_engine_score_ex(e, row, NULL, out, err);
}

void squad_engine_cache_stats(const squad_engine *e, squad_cache_stats *out) {
    memset(out, 0, sizeof *out);
    if (e->cache) squad_cache_get_stats(e->cache, out);
    else out->budget_bytes = e->opts.cache.budget_bytes;
    out->disk_saved = e->disk_saved;
    out->disk_loaded = e->disk_loaded;
    out->disk_refused = e->disk_refused;
    out->plain = e->plain_rows;
    out->mispredictions += e->sched.mispredictions_plain;
    out->memo_hits = e->memo_hits;
    out->tokens_memo = e->tokens_memo;
    out->image_rows = e->image_rows;
    out->image_tokens = e->image_tokens;
    out->encoder_hits = e->sched.encoder_hits;
    out->encoder_misses = e->sched.towers_run;
    squad_encoder_cache_bytes(e->encoder, &out->encoder_bytes, &out->encoder_budget_bytes);
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
