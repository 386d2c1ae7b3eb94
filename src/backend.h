/*
 * backend.h — the one interface between the engine and a compute backend (CPU or CUDA).
 *
 * The engine owns rows, chunking, scheduling and the state cache; a backend owns the weights in its
 * memory, `max_seqs` *sequence slots* and the forward of a batch of chunks.
 *
 * A sequence slot (seq, 0 <= seq < max_seqs) is the working state of one row in flight: per GDN
 * layer the fp32 recurrent state S [nv][dk][dv] and the last K-1 conv inputs; per attention layer
 * the K / V of the positions the row has run (or reads in place from a restored blob). A slot's
 * memory follows its row's length (K / V grow as the row reaches further), not max_context; idle
 * slots cost little. reset / save / load act on one slot and leave the others untouched.
 *
 * A chunk continues its slot's working state: tokens [start, start + len) of a row whose earlier
 * positions [0, start) are already in the slot. forward() runs a *batch*: n_chunks chunks, each on
 * its own slot (no slot twice in one batch), at most max_batch_tokens tokens in all. For each
 * chunk it runs embed -> every layer -> (if the chunk has answer slots) the letter logits at those
 * slots, masked to nopts, softmax into chunk->probs; the projections and MLPs may run as one GEMM
 * over all the chunks' tokens, the mixers per chunk from its own slot. Each chunk's results and
 * its slot's new state equal those of the chunk run alone up to round-off (the CPU's exact
 * precision: identical). After it, each slot holds the state of position start + len.
 * A chunk that fails validation fails the whole call before any state changes.
 *
 * Full-vocabulary figures: when chunk->vocab is not NULL, forward() also fills, for each slot,
 * the log-sum-exp of the logits over the whole vocabulary, the largest logit and its token id
 * (the lowest id on a tie), and the log-sum-exp of the logits of the slot's first nopts letters,
 * all from the same final-normed hidden row and the same fp32 arithmetic as the letter logits the
 * probabilities come from. One pass over the output embedding serves all the chunk's slots and no
 * vocabulary-sized row is kept; a chunk without vocab pays nothing for it.
 *
 * Specialists (docs/specialists.md; a backend built with squad_engine_opts.specialists): the chunk
 * names the route its layers from `split` on run with (0: the trunk). Those layers' projections
 * compute W x + s B (A x) with the route's adapter, never merged into W, so every route shares the
 * weights and one forward serves any route. When chunk->router_sum is not NULL, forward() also
 * fills it with the sum over the chunk's tokens of the weightless RMS-normalised hidden state
 * entering router.layer (squad_router_norm_add's arithmetic): the engine accumulates it chunk by
 * chunk into the row's router features. Layers below `split` (and so the router's features) never
 * depend on the route.
 *
 * Checkpoints (the state cache) are blobs in backend memory (alloc/release), saved from and loaded
 * into one slot:
 *  - save_gdn / load_gdn: every GDN layer's S and conv inputs, gdn_snapshot_bytes in all;
 *  - save_kv / load_kv: K / V of positions [0, n) of every attention layer, n * kv_bytes_per_pos.
 * A blob given to load_kv must stay valid until the next reset() or load_kv() of that slot (a
 * backend may read it in place instead of copying, and several slots may read one blob at once);
 * one given to load_gdn until the slot's next forward(), reset() or load_gdn() (a backend may read
 * the starting state from it in that forward instead of copying it first). The engine keeps the
 * restored checkpoint pinned while its row is in flight, which covers both.
 *
 * Every function returns 0 or a negative squad error code with err filled; none prints or exits.
 */
#ifndef SQUAD_BACKEND_H
#define SQUAD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "squad.h"

/* Full-vocabulary figures of one slot (squad_result's fields of the same names). */
typedef struct squad_slot_vocab {
    float vocab_lse, letters_lse, top_logit;
    int32_t top_token;
} squad_slot_vocab;

typedef struct squad_chunk {
    int seq;            /* the sequence slot this chunk continues */
    const int32_t *ids; /* host memory, [len] */
    int start;          /* absolute position of ids[0] in the row */
    int len;            /* tokens in this chunk, 1..max_chunk */
    int n_slots;        /* answer slots inside this chunk (0: no answer from this chunk) */
    int slots[SQUAD_MAX_SLOTS_PER_ROW]; /* relative to start, ascending */
    int nopts[SQUAD_MAX_SLOTS_PER_ROW];
    const int32_t *letters; /* option letter token ids, [n_letters] */
    int n_letters;
    squad_slot_vocab *vocab; /* NULL, or [n_slots] host memory forward() fills for the slots */
    int route;               /* specialists: the route of the layers >= split (0: the trunk) */
    double *router_sum;      /* specialists: NULL, or [hidden] host memory forward() fills */
    float *probs;            /* [n_slots][SQUAD_MAX_LETTERS] host memory forward() fills (entries
                              * past nopts are 0); may be NULL when n_slots is 0 */
    /* Images (docs/images.md). Both NULL for a text-only chunk, which runs exactly as before.
     * positions: NULL (token i at position start + i on every rotary axis), or [len][3] host
     * memory, the (t, h, w) M-RoPE position of each token; the rotary then takes each frequency's
     * angle from the axis config->mrope_section / mrope_interleaved assign it (transformers'
     * interleaved M-RoPE), which equals the plain rotary when the three are equal.
     * embeds: NULL, or host memory fp32 [n][hidden] with one row for each token of the chunk whose
     * id is config->image_token_id, in token order: such a token's input is that row instead of
     * its embedding (the vision tower's output, already merged). */
    const int32_t *positions;
    const float *embeds;
} squad_chunk;

typedef struct squad_backend squad_backend;
struct squad_backend {
    const char *name; /* "cpu" or "cuda" */
    const squad_model *model;
    int max_seqs;              /* sequence slots: rows in flight at once (at least 1) */
    int max_batch_tokens;      /* the most tokens one forward() takes, all its chunks together
                                * (at least max_chunk) */
    int max_context;           /* positions a slot can hold: what the engine asked for, or
                                * fewer when the memory cannot hold the K / V of that many */
    int kv_positions;          /* positions the K / V of all slots holds now, together (a figure for
                                * logs and tests: it grows in steps as rows get longer) */
    int max_chunk;             /* the longest chunk forward() accepts */
    size_t gdn_snapshot_bytes; /* one save_gdn blob */
    size_t kv_bytes_per_pos;   /* K and V of every attention layer at one position */
    int specialists;           /* 1 when forward() applies opts->specialists (routes, router_sum) */
    int mixed_routes;          /* 1 when one forward() may hold chunks of different routes; else the
                                * engine runs each route's chunks as a batch of their own */

    void *(*alloc)(squad_backend *be, size_t bytes, squad_err *err);
    void (*release)(squad_backend *be, void *p);

    /* A slot to a row start: GDN states and conv inputs zeroed (K / V need no clearing). */
    int (*reset)(squad_backend *be, int seq, squad_err *err);
    int (*save_gdn)(squad_backend *be, int seq, void *dst, squad_err *err);
    int (*load_gdn)(squad_backend *be, int seq, const void *src, squad_err *err);
    /* K / V of positions [0, n) of the slot into dst (a blob of n * kv_bytes_per_pos bytes). */
    int (*save_kv)(squad_backend *be, int seq, void *dst, int n, squad_err *err);
    /* Positions [0, n) from a blob saved with blob_positions positions (n <= blob_positions). */
    int (*load_kv)(squad_backend *be, int seq, const void *src, int blob_positions, int n, squad_err *err);

    /* A batch of n_chunks chunks (1..max_seqs), each on its own slot. */
    int (*forward)(squad_backend *be, const squad_chunk *chunks, int n_chunks, squad_err *err);

    /* Device memory free now, in bytes (what an automatic cache budget is sized from); NULL for a
     * backend whose checkpoints live in host memory (the CPU). */
    int (*memory_free)(squad_backend *be, size_t *free_bytes, squad_err *err);

    /* What the device has done that an operator may want to see (squad_engine_device_stats): graphs
     * captured and the seconds spent capturing them; NULL for a backend without graphs (the CPU). */
    void (*graph_stats)(const squad_backend *be, int *graphs, double *capture_s);

    /* The vision tower on one image (optional: NULL where the backend has none, and the engine
     * refuses images). pixel_values [t h w][C T P P] (the model's vision_config sizes; the caller
     * checks its processor agrees) in the processor's order (src/image/), grid
     * (t, h, w) in patches; out [t (h/m) (w/m)][out_hidden_size], one row per <|image_pad|>. Not at
     * the same time as forward(). */
    int (*vision_forward)(squad_backend *be, const float *pixel_values, const int grid[3], float *out, squad_err *err);

    /* The host-RAM tier and the disk tier (docs/design.md section 7, "Tiers"); all NULL on a
     * backend whose blobs are host memory already (the CPU: the cache then copies with memcpy).
     * host_alloc / host_release: page-locked host memory, taken in large slabs the cache carves up
     * (tier_pool.h: never per checkpoint). The copies are queued, in the order issued, on a copy
     * stream of their own, after the forward()s and saves already issued, and return at once:
     * blob_to_host's host bytes are only read by the host thread after tier_sync; blob_from_host's
     * blob is written before any forward() or save issued after it reads it (the compute stream
     * waits for the copy, not the host thread), and its host bytes must not change until
     * tier_sync. release_copied: a blob given to blob_to_host, released once that copy is done.
     * tier_sync: waits for every copy queued. host_copy_bytes_per_s: the host-to-device bandwidth
     * (0: unknown), measured at creation and updated as copies complete; the cost model's figure. */
    void *(*host_alloc)(squad_backend *be, size_t bytes, squad_err *err);
    void (*host_release)(squad_backend *be, void *p);
    int (*blob_to_host)(squad_backend *be, void *host, const void *blob, size_t bytes, squad_err *err);
    int (*blob_from_host)(squad_backend *be, void *blob, const void *host, size_t bytes, squad_err *err);
    void (*release_copied)(squad_backend *be, void *blob);
    int (*tier_sync)(squad_backend *be, squad_err *err);
    double host_copy_bytes_per_s;
    void *tier_impl; /* the backend's own state for them (CUDA: cuda_host_tier.cu's) */

    void (*destroy)(squad_backend *be);
    void *impl; /* the backend's own state */
};

/* One chunk alone, with its probabilities into probs (tests and benchmarks). */
static inline int squad_backend_forward1(squad_backend *be, squad_chunk *chunk, float *probs, squad_err *err) {
    chunk->probs = probs;
    return be->forward(be, chunk, 1, err);
}

/* The CPU backend (src/cpu/): opts->threads (0: all cores) and opts->precision. max_context is the
 * longest row wanted; a backend lowers its own be->max_context when memory cannot hold it. */
squad_backend *squad_cpu_backend_new(const squad_model *model, const squad_engine_opts *opts, int max_context,
                                     squad_err *err);
/* Test hook: the residual stream (before the final norm) at token t of the first chunk of the last
 * batch the CPU backend ran, H floats into out; SQUAD_E_INVALID for another backend or t outside
 * that chunk. */
int squad_cpu_backend_hidden(const squad_backend *be, int t, float *out, squad_err *err);

/* The CUDA backend (src/cuda/), present when built with SQUAD_HAVE_CUDA. */
int squad_cuda_device_count(void);
/* 1 when the GPU the backend would use (device 0) can run its kernels (compute capability 9.0+):
 * what --device auto asks before choosing CUDA. */
int squad_cuda_device_usable(void);
squad_backend *squad_cuda_backend_new(const squad_model *model, const squad_engine_opts *opts, int max_context,
                                      squad_err *err);
/* Test hook: squad_cpu_backend_hidden's twin (the fp32 residual stream at token t of the last chunk). */
int squad_cuda_backend_hidden(const squad_backend *be, int t, float *out, squad_err *err);

#endif /* SQUAD_BACKEND_H */
