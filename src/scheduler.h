/*
 * scheduler.h — the engine's batching scheduler (internal): rows taken in by squad_engine_submit
 * wait in a FIFO queue, run in flight each in a sequence slot of the backend, and advance together
 * in batched steps. src/scheduler.c's header comment is the design; docs/batching.md the whole
 * story.
 *
 * The stack is one-way: the engine owns a squad_sched and lends it the lower layers it runs rows
 * on (backend, state cache, memo, specialists) at squad_sched_init; squad_sched_step runs one
 * batched step and *returns* the rows that left in it (answered, answered by the memo, or failed),
 * plans closed and slots freed. The scheduler never calls up: the engine then does what belongs to
 * a finished row above the scheduler (the router's view, the memo insert, the counters, the done
 * callback) and frees it.
 */
#ifndef SQUAD_SCHEDULER_H
#define SQUAD_SCHEDULER_H

#include <stdint.h>

#include "backend.h"
#include "cache.h"
#include "encoder_cache.h"
#include "memo.h"
#include "specialists.h"
#include "squad.h"

/* A cut row's chunk is a multiple of this many tokens (the cache's align and the CUDA delta
 * rule's block), and a budget left over smaller than it cuts nothing. */
#define SCHED_CUT_ALIGN 64
/* A row the budget gave less than its whole want this many steps in a row goes first, whole, at
 * the next step. */
#define SCHED_STARVE_STEPS 2

/* One row from submit to done: the caller's request, then its state machine while in flight. */
typedef struct squad_sched_row {
    /* the caller's (arrays and *out borrowed until done is called) */
    squad_row row;
    squad_score_opts opts; /* zero when the caller gave none */
    squad_result *out;
    squad_done_fn done;
    void *ctx;
    int forced; /* the route every pass must run with; -1: the router decides */

    /* images (docs/images.md; all NULL / 0 for a text-only row): krow is the row the state cache
     * and the twin checks see (its ids the key view of image_rows.h, key_ids; for a text-only row
     * the row itself); positions its M-RoPE positions [n_ids][3]; img_embeds the vision tower's
     * rows of all its images in token order, each image's filled (img_ready) the first time a
     * chunk holding its tokens runs */
    squad_row krow;
    int32_t *key_ids;
    int32_t *positions;
    float *img_embeds;
    unsigned char img_ready[SQUAD_MAX_IMAGES_PER_ROW];

    /* specialists: the row's router features, grown chunk by chunk, and one chunk's sum */
    squad_router_feat feat;
    double *chunk_sum;

    /* in flight */
    int seq;          /* its sequence slot; -1 while queued */
    uint64_t order;   /* when it joined the rows in flight (older rows are cut last) */
    int cached;       /* on the state cache's path (else the plain path) */
    int plan_open;
    squad_cache_plan plan; /* the cache's plan of this pass (its address is on the cache's list) */
    int committed;    /* the plan's checkpoints joined the cache (or it had none to commit) */
    int route;        /* the route this pass runs with */
    int guessed;      /* 1 while the route is a guess the router has still to confirm */
    int pos;          /* the next token to run: the slot holds [0, pos) */
    int bound;        /* the plan's next bound (the prefix phase while bound < plan.n_bounds) */
    int next_slot;    /* the row's first answer slot not yet answered */
    uint64_t computed; /* tokens run over every pass (the cache's row count) */
    int shorted;      /* consecutive steps the token budget gave it less than its whole want (a cut,
                       * or nothing) */

    /* this step's chunk: its length and the row's slots it answers */
    int ck_len, ck_first, ck_n;
    float probs[SQUAD_MAX_SLOTS_PER_ROW][SQUAD_MAX_LETTERS];
    squad_slot_vocab vocab[SQUAD_MAX_SLOTS_PER_ROW];

    /* how it left (squad_sched_step's ended list) */
    int end;       /* a squad_sched_end */
    int rc;        /* SQUAD_SCHED_FAILED: why, with err */
    squad_err err;

    struct squad_sched_row *next; /* the queue, then the ended list */
} squad_sched_row;

/* How a row left the scheduler. */
typedef enum {
    SQUAD_SCHED_ANSWERED = 1, /* its last pass is done: out holds its answers and route, r->feat the
                               * router features of that pass; its plan closed (counted) */
    SQUAD_SCHED_MEMO,         /* a twin answered it while it queued: out filled from the memo */
    SQUAD_SCHED_FAILED,       /* failed or cancelled alone (rc, err): its plan abandoned; out->computed
                               * counts the tokens it ran, the rest of out is not an answer */
} squad_sched_end;

typedef struct squad_sched {
    /* the lower layers, lent by the owner for the scheduler's lifetime */
    squad_backend *be;
    squad_cache *cache;           /* NULL: every row down the plain path */
    squad_memo *memo;             /* NULL: no exact repeats (a twin does not wait for its twin) */
    squad_encoder_cache *encoder; /* NULL: every image's tower runs (the owner sets it after init) */
    uint64_t encoder_hits;        /* images whose tower output the encoder cache gave */
    uint64_t towers_run;          /* images run through the vision tower */
    const squad_specialists *sp;  /* NULL: every row the trunk */
    int align;                    /* the cache's align (its checkpoints' positions) */
    int image_threads;            /* the image processor's threads: the CPU backend's option, else 0 (the cores) */

    int max_rows;     /* rows in flight at once: min(max_rows option, the backend's slots) */
    int batch_tokens; /* tokens one step runs, all its chunks together; the longest chunk is the
                       * smaller of it and the backend's max_chunk */
    squad_sched_row **slots; /* [max_rows]: the row in each sequence slot, NULL when free */
    int n_flight;
    squad_sched_row *queue_head, *queue_tail;
    int n_queued;
    uint64_t joined; /* rows that have joined the rows in flight (their order) */
    /* one step's scratch, [max_rows] each */
    squad_sched_row **batch;
    squad_chunk *chunks;
    squad_chunk *sub; /* one route's chunks when a backend cannot mix routes */
    int *want, *got;  /* each candidate's wanted and granted tokens */
    unsigned char *routed; /* chunks already run, when they run one route at a time */
    uint64_t mispredictions_plain; /* second passes of rows off the cache (the cache counts its own) */
    squad_sched_row *ended_head, *ended_tail; /* the rows that left in the current step */
    int guess_route; /* the current step's last_route (squad_sched_step) */
} squad_sched;

/* A scheduler over be (and cache, memo, sp; each may be NULL) with opts->max_rows and
 * opts->batch_tokens (0: the backend's; more than it has: what it has; negative: refused). */
int squad_sched_init(squad_sched *s, squad_backend *be, squad_cache *cache, squad_memo *memo,
                     const squad_specialists *sp, const squad_engine_opts *opts, squad_err *err);
/* Drops every row still taken in (their plans abandoned, done not called) and the scratch. */
void squad_sched_free(squad_sched *s);

/* A row for the queue (validated by the caller, its images too): NULL and err when memory is short. */
squad_sched_row *squad_sched_row_new(const squad_sched *s, const squad_row *row, const squad_score_opts *opts,
                                     squad_result *out, squad_done_fn done, void *ctx, squad_err *err);
void squad_sched_enqueue(squad_sched *s, squad_sched_row *r);
/* A row squad_sched_step handed back, once its owner is done with it. */
void squad_sched_row_free(squad_sched_row *r);

/* One batched step: admission, the cancel polls of the rows in flight, packing, one forward (or one per route), each row's state machine
 * one step on. last_route: the route a row no checkpoint routes guesses (the route of the last row
 * answered). *ended gets the rows that left in the step, in the order they left, linked by next
 * (their slots already free; done not called: the caller's, then squad_sched_row_free). Returns the
 * rows still taken in, or a negative code with err filled when the backend failed (every row in
 * flight then left, failed with it). */
int squad_sched_step(squad_sched *s, int last_route, squad_sched_row **ended, squad_err *err);
int squad_sched_pending(const squad_sched *s);
/* The tokens a row in flight wants at the next step: to its next chunk target, at most the longest
 * chunk (what the packing gives it whole, or cuts; tests read it). */
int squad_sched_want(const squad_sched *s, const squad_sched_row *r);

/* Runs row->ids[start, end) on sequence slot `seq` in chunks of at most the longest chunk with
 * `route` (no router features), answering the row's slots in the span into out; polls opts'
 * cancel callback and asks for the vocabulary figures as opts says (opts may be NULL). The
 * one-row span runner of squad_engine_run_span. */
int squad_sched_run_span(squad_sched *s, int seq, int route, const squad_row *row, int start, int end,
                         const squad_score_opts *opts, squad_result *out, squad_err *err);

#endif /* SQUAD_SCHEDULER_H */
