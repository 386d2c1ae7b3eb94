/*
 * engine.h — the engine object (internal view): a model, a backend, the state cache, the memo and
 * the batching scheduler.
 *
 * squad_engine_submit (squad.h) validates a row and answers an exact repeat from the memo; the
 * scheduler (scheduler.c), an object the engine owns, runs the other rows in batched steps, each
 * row in flight in its own sequence slot of the backend, through the state cache when eligible,
 * else down the plain path (reset, then the whole row in chunks), and hands each finished row back
 * to the engine, which answers it (router view, memo, counters, done). squad_engine_score_ex and
 * squad_engine_score_batch are submit plus steps until their rows are done, so every row goes
 * through the batched path.
 *
 * The stack is one-way (docs/design.md section 2): engine -> scheduler -> plan_apply -> cache ->
 * backend; nothing below includes this header or calls the engine.
 */
#ifndef SQUAD_ENGINE_H
#define SQUAD_ENGINE_H

#include "backend.h"
#include "encoder_cache.h"
#include "scheduler.h"
#include "specialists.h"
#include "squad.h"

typedef struct squad_cache squad_cache;
typedef struct squad_memo squad_memo;

/* An automatic cache budget on a device: its free memory after the backend is built, less this
 * much for what comes later (graphs captured on first use, cuBLASLt's and the driver's own
 * allocations, the checkpoint allocations' rounding). */
#define SQUAD_AUTO_BUDGET_MARGIN_BYTES ((size_t)2 << 30)

struct squad_engine {
    squad_model *model;
    squad_backend *be;
    squad_cache *cache; /* NULL when the budget is 0 */
    squad_memo *memo;   /* exact repeats; NULL when the cache is off */
    squad_encoder_cache *encoder; /* image identity -> tower output; NULL without a tower or budget */
    squad_engine_opts opts;
    int max_tokens;    /* the longest row: the model's positions, the option, or the memory */
    squad_limit limit; /* which of the three bounds max_tokens */
    uint64_t plain_rows; /* rows answered off the cache */
    uint64_t memo_hits, tokens_memo;
    uint64_t image_rows, image_tokens; /* answered rows with images, and their image tokens */
    /* the options squad_engine_run_span reads (tests drive it directly; NULL: none) */
    const squad_score_opts *call;
    /* specialists (NULL: none; every row the trunk) */
    const squad_specialists *sp;
    int last_route;                /* the route of the last row answered: the guess when no
                                    * checkpoint gives one */
    uint64_t route_rows[SQUAD_MAX_ROUTES];
    squad_sched sched;             /* the rows taken in (scheduler.c): the engine's, over its
                                    * backend, cache, memo and specialists */
};

/* Runs row->ids[start, end) on sequence slot 0 from the backend's working state there (which must
 * hold [0, start)), in chunks of at most the scheduler's chunk length, with the trunk's route; the
 * row's slots inside [start, end) are answered into out (out->probs indexed by the row's slot
 * index, and the full-vocabulary figures when e->call asks for them). out->computed grows by
 * end - start. e->call's cancel callback is polled before every chunk. For tests of chunk splits:
 * the engine's own rows go through the scheduler. */
int squad_engine_run_span(squad_engine *e, const squad_row *row, int start, int end, squad_result *out,
                          squad_err *err);

#endif /* SQUAD_ENGINE_H */
