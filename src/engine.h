/*
 * engine.h — the engine object (internal view): a model, a backend, the state cache, the memo.
 *
 * squad_engine_score_ex (squad.h) validates a row, answers an exact repeat from the memo, sends an
 * eligible row through the state cache and any other row down the plain path (reset, then the
 * whole row in chunks). The cache plans a cached row and the executor (cache_exec.c) runs the plan
 * on the backend, its spans through squad_engine_run_span, which reads the running call's options
 * (cancellation, vocabulary figures) from the engine: one call runs at a time on an engine.
 */
#ifndef SQUAD_ENGINE_H
#define SQUAD_ENGINE_H

#include "backend.h"
#include "specialists.h"
#include "squad.h"

typedef struct squad_cache squad_cache;
typedef struct squad_memo squad_memo;

/* An automatic cache budget on a device: its free memory after the backend is built, less this
 * much for what comes later (graphs captured on first use, cuBLASLt's and the driver's own
 * allocations, the checkpoint allocations' rounding). */
#define SQUAD_AUTO_BUDGET_MARGIN_BYTES ((size_t)2 << 30)

/* A row taken in by squad_engine_submit and not yet done. */
typedef struct squad_engine_job {
    squad_row row;
    squad_score_opts opts;
    int has_opts;
    squad_result *out;
    squad_done_fn done;
    void *ctx;
    struct squad_engine_job *next;
} squad_engine_job;

struct squad_engine {
    squad_model *model;
    squad_backend *be;
    squad_cache *cache; /* NULL when the budget is 0 */
    squad_memo *memo;   /* exact repeats; NULL when the cache is off */
    squad_engine_opts opts;
    int max_tokens;    /* the longest row: the model's positions, the option, or the memory */
    squad_limit limit; /* which of the three bounds max_tokens */
    uint64_t plain_rows;
    uint64_t memo_hits, tokens_memo;
    const squad_score_opts *call; /* the running call's options (never NULL while a row runs) */
    /* specialists (NULL: none; every row the trunk) */
    const squad_specialists *sp;
    int last_route;         /* the route of the last row: the guess when no checkpoint gives one */
    int run_route;          /* the route the running row's chunks run with */
    squad_router_feat feat; /* the running row's router features, grown chunk by chunk */
    double *chunk_sum;      /* [hidden]: one chunk's router features from the backend */
    uint64_t mispredictions_plain; /* second passes of rows off the cache */
    uint64_t route_rows[SQUAD_MAX_ROUTES];
    /* rows taken in by squad_engine_submit, oldest first */
    squad_engine_job *jobs_head, *jobs_tail;
    int jobs_pending;
};

/* Runs row->ids[start, end) from the backend's working state (which must hold [0, start)), in
 * chunks of at most be->max_chunk tokens; the row's slots inside [start, end) are answered into out
 * (out->probs indexed by the row's slot index, and the full-vocabulary figures when the running
 * call asks for them). out->computed grows by end - start. With specialists the chunks run with
 * e->run_route and add their router features to e->feat. Before every chunk the running call's
 * cancel callback is polled: SQUAD_E_CANCELLED when it says stop. */
int squad_engine_run_span(squad_engine *e, const squad_row *row, int start, int end, squad_result *out,
                          squad_err *err);

#endif /* SQUAD_ENGINE_H */
