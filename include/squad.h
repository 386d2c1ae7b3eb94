/*
 * squad.h — the public API of libsquad.
 *
 * squad answers multiple-choice questions with a Qwen3.5-architecture model (Gated DeltaNet +
 * gated attention). The unit of work is a *row*: token ids, the positions ("slots") whose output
 * predicts an answer letter, how many options each slot has, and the letter token ids. A row may
 * name the length of its state prefix (`state_len`); the engine then keeps model states of that
 * prefix (the state cache) so a later row sharing it costs only its own suffix.
 *
 * Design: every call returns 0 on success and a negative value on failure, filling a squad_err
 * with a one-line message. The library never prints and never exits. Objects are opaque; an
 * engine is single-threaded (one caller at a time), a model may be shared by several engines.
 */
#ifndef SQUAD_H
#define SQUAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SQUAD_ERR_MSG 512

/* Error codes (squad_err.code). */
enum {
    SQUAD_OK = 0,
    SQUAD_E_INVALID = -1, /* bad input: a row, a request, an option */
    SQUAD_E_MODEL = -2,   /* a model directory that is missing, unreadable or inconsistent */
    SQUAD_E_NOMEM = -3,   /* an allocation failed */
    SQUAD_E_IO = -4,      /* a file could not be read or written */
    SQUAD_E_BACKEND = -5, /* the compute backend failed (e.g. a CUDA error) */
    SQUAD_E_UNSUPPORTED = -6,
    SQUAD_E_CANCELLED = -7 /* the caller's cancel callback asked the row to stop */
};

typedef struct squad_err {
    int code;
    char msg[SQUAD_ERR_MSG];
} squad_err;

typedef struct squad_model squad_model;
typedef struct squad_engine squad_engine;
typedef struct squad_specialists squad_specialists;

/* The largest number of answer slots one row may have. */
#define SQUAD_MAX_SLOTS_PER_ROW 64
/* The largest number of options (letters) a slot may have. */
#define SQUAD_MAX_LETTERS 26

/* One image of a row (docs/images.md). In the row's ids the image is `<|vision_start|>`, a run of
 * `tokens` `<|image_pad|>` ids starting at ids[pos], then `<|vision_end|>`; the engine feeds the run
 * the vision tower's output rows and gives it M-RoPE positions (t, row, column), and text after the
 * image continues at the run's first position + max(grid h, grid w) / merge. squad_image_load fills
 * one from encoded bytes; the caller sets pos. */
typedef struct squad_row_image {
    int pos;               /* index in ids of the image's first <|image_pad|> */
    int tokens;            /* the run's length: grid t x h x w / merge^2 */
    int grid[3];           /* t, h, w in patches */
    uint8_t identity[16];  /* BLAKE2b-128 of the decoded pixels and the grid: the caches' key */
    const struct squad_image *image; /* the decoded RGB image the tower reads (src/image/decode.h);
                                      * owned by whoever filled the struct (squad_row_image_free) */
} squad_row_image;

/* The encoder cache's default budget: 256 MiB, about 32 full-HD screenshots of the 0.8B model. */
#define SQUAD_ENCODER_CACHE_DEFAULT_BYTES ((size_t)256 << 20)

/* The most images one row may hold. */
#define SQUAD_MAX_IMAGES_PER_ROW 16

/* A row (docs/design.md section 5). Arrays are borrowed from the caller for the duration of a call. */
typedef struct squad_row {
    const int32_t *ids;
    int n_ids;
    const int32_t *slots; /* sorted, unique, each in [0, n_ids) */
    const int32_t *nopts; /* per slot, 1..n_letters */
    int n_slots;
    const int32_t *letters; /* option letter token ids */
    int n_letters;
    int state_len; /* length of the shareable state prefix, or -1 when not given */
    /* With specialists: 0 lets the router decide (the default, so a zero-initialised row routes
     * automatically); r + 1 forces route r (0: the trunk). Without specialists only 0 is valid. */
    int specialist;
    /* Images (docs/images.md): n_images runs of <|image_pad|> in ids, ascending by pos and not
     * overlapping; NULL / 0 for a text-only row, which runs exactly as before. */
    const squad_row_image *images;
    int n_images;
} squad_row;

/* The most routes (router labels, the trunk included) a specialists directory may declare. */
#define SQUAD_MAX_ROUTES 64

/* The answer to a row. probs is [n_slots][SQUAD_MAX_LETTERS]; entries past nopts[i] are 0. */
typedef struct squad_result {
    int n_slots;
    float probs[SQUAD_MAX_SLOTS_PER_ROW][SQUAD_MAX_LETTERS];
    int reused;        /* tokens restored from the state cache (a memo answer: the whole row) */
    int computed;      /* tokens run through the model for this row */
    int route;         /* specialist route index (0: the trunk) */
    int n_routes;      /* with specialists: the number of routes, and the router's probabilities */
    float route_probs[SQUAD_MAX_ROUTES]; /* over them (softmax of its logits); 0 without */
    int memo;          /* 1 when the row memo answered (nothing restored, nothing computed) */
    int cache_written; /* state positions this row newly made restorable: its deepest new
                        * checkpoint minus `reused` (0 when it made none) */
    /* Full-vocabulary figures at each slot, filled when squad_score_opts.want_vocab asked
     * (has_vocab = 1). With z the slot's logits over the whole vocabulary:
     *   vocab_lse   = log sum_v exp(z_v)
     *   letters_lse = log sum over the slot's first nopts letters of exp(z_letter)
     *   top_logit   = max_v z_v, top_token its id (the lowest id on a tie)
     *   label_mass  = exp(letters_lse - vocab_lse): the letters' share of the full softmax. */
    int has_vocab;
    float vocab_lse[SQUAD_MAX_SLOTS_PER_ROW];
    float letters_lse[SQUAD_MAX_SLOTS_PER_ROW];
    float top_logit[SQUAD_MAX_SLOTS_PER_ROW];
    int32_t top_token[SQUAD_MAX_SLOTS_PER_ROW];
    float label_mass[SQUAD_MAX_SLOTS_PER_ROW];
} squad_result;

/* Per-call options of squad_engine_score_ex. Zero-initialised means the squad_engine_score
 * behaviour. */
typedef struct squad_score_opts {
    int want_vocab; /* fill the result's full-vocabulary figures (one extra pass over the output
                     * embedding for the row's slots; rows that do not ask do not pay it) */
    int end_checkpoint_only; /* a new state is checkpointed at its end (p) only, without the tail
                              * and stride checkpoints: what a new state gives up under load */
    /* More checkpoint positions of the row's state the caller asks for (a client's cache
     * breakpoints): each rounded down to the cache's align, at most 8 (more are ignored), those
     * outside the part the row computes ignored; end_checkpoint_only drops them too. */
    const int *checkpoints;
    int n_checkpoints;
    /* Polled before every chunk; a nonzero return stops the row with SQUAD_E_CANCELLED (the
     * engine stays usable, the state cache consistent; no answer, memo entry or row count is kept;
     * checkpoints the row had completed before the stop stay, as valid states a retry restores). */
    int (*cancelled)(void *ctx);
    void *cancel_ctx;
} squad_score_opts;

typedef enum { SQUAD_DEVICE_AUTO = 0, SQUAD_DEVICE_CPU = 1, SQUAD_DEVICE_CUDA = 2 } squad_device;

/* budget_bytes value that asks the engine to size the cache from the device memory left after the
 * weights and the backend's scratch (CUDA), or the default budget on the CPU. */
#define SQUAD_CACHE_BUDGET_AUTO ((size_t)-1)
/* host_budget_bytes value that asks the engine to size the host tier from the machine (CUDA only):
 * twice the device budget, at most an eighth of the physical memory and half of what is available
 * now; off when that is under 256 MB, and off (not an error) when the system will not pin it. */
#define SQUAD_CACHE_HOST_AUTO ((size_t)-1)

/* State-cache policy (docs/design.md section 7). Zero-initialise and call squad_engine_opts_default. */
typedef struct squad_cache_opts {
    size_t budget_bytes; /* 0 disables the cache; SQUAD_CACHE_BUDGET_AUTO sizes it */
    int align;           /* checkpoints and chunk starts at multiples of this (64) */
    int tail;            /* a checkpoint at p - tail (16) */
    int stride;          /* a checkpoint at every multiple of stride (2048) */
    int min_prefix;      /* rows with a shorter state take the plain path (256) */
    int max_slots;       /* rows with more slots take the plain path (4) */
    /* The host-RAM tier (docs/design.md section 7, "Tiers"): on a backend whose checkpoints live in
     * device memory (CUDA), a checkpoint evicted from budget_bytes moves to host memory bounded by
     * this many bytes, and comes back when a row needs it (or is recomputed when that is cheaper).
     * 0: off; SQUAD_CACHE_HOST_AUTO sizes it from the machine. The CPU backend's checkpoints are
     * host memory already: there it is ignored. */
    size_t host_budget_bytes;
} squad_cache_opts;

/* Arithmetic of the projections. BF16 (the default; the earlier runtime's numerics and the fast
 * path on both backends): activations rounded to bf16 for the bf16 dot-product / tensor-core
 * GEMMs. EXACT: fp32 activations times bf16 weights, equal to an fp32 forward up to summation
 * order: the reference path that verification uses. */
typedef enum { SQUAD_PRECISION_EXACT = 0, SQUAD_PRECISION_BF16 = 1 } squad_precision;
#define SQUAD_PRECISION_DEFAULT SQUAD_PRECISION_BF16

/* The largest GPU index --device cuda:N takes (a bound on the option, not on the hardware). */
#define SQUAD_MAX_DEVICE_INDEX 255

typedef struct squad_engine_opts {
    squad_device device;
    int device_index; /* CUDA: which GPU (--device cuda:N; 0 the first): one process per GPU */
    int threads; /* CPU threads; 0: all available cores */
    squad_precision precision;
    squad_cache_opts cache;
    int precapture; /* CUDA: capture every chunk graph at start */
    /* The encoder cache's budget in bytes (the vision tower's outputs by image identity, LRU);
     * 0 disables it. squad_engine_opts_default sets SQUAD_ENCODER_CACHE_DEFAULT_BYTES. */
    size_t encoder_cache_bytes;
    /* Specialists (squad_specialists_load; borrowed: it must outlive the engine). NULL: the model
     * alone, every row the trunk. */
    const struct squad_specialists *specialists;
    int max_adapters; /* adapters resident at once (the rest loaded on demand, least recently
                       * used out first); 0: all of them */
    /* The longest row the engine takes, in tokens; 0: the model's max_position_embeddings. More
     * than the model's positions, or negative, is refused. The engine lowers it further when the
     * device cannot hold the K / V of that many positions (squad_engine_max_tokens says what it
     * took and why). Memory follows use either way: the working K / V grows with the rows. */
    int max_tokens;
    /* Batching (docs/batching.md). max_rows: rows in flight at once, each in its own sequence slot
     * of the backend; 0: the backend's default. batch_tokens: the most tokens one batched step runs,
     * all its rows' chunks together; 0: the backend's default (its largest batch). */
    int max_rows;
    int batch_tokens;
} squad_engine_opts;

/* What bounds an engine's longest row (squad_engine_max_tokens). */
typedef enum {
    SQUAD_LIMIT_MODEL = 0,  /* the model's max_position_embeddings */
    SQUAD_LIMIT_OPTION = 1, /* squad_engine_opts.max_tokens */
    SQUAD_LIMIT_MEMORY = 2  /* the device memory: the K / V of more positions would not fit */
} squad_limit;

typedef struct squad_cache_stats {
    uint64_t rows, hits, partial, cold, plain;
    uint64_t memo_hits;   /* rows the row memo answered (not counted in rows / hits / plain) */
    uint64_t tokens_memo; /* their tokens (neither restored nor computed) */
    uint64_t tokens_reused, tokens_computed;
    uint64_t uncacheable; /* eligible rows whose state did not fit the budget (run uncached) */
    uint64_t checkpoints_made, evicted;
    uint64_t mispredictions; /* rows whose guessed route the router overturned (a second pass) */
    uint64_t checkpoints, groups;
    size_t bytes_held, budget_bytes;
    /* Images (docs/images.md): rows that held images and their <|image_pad|> tokens; the encoder
     * cache (image identity -> the tower's output): lookups it answered, towers run, bytes held. */
    uint64_t image_rows, image_tokens;
    uint64_t encoder_hits, encoder_misses;
    size_t encoder_bytes, encoder_budget_bytes;
    /* The host-RAM tier (0 when off): checkpoints and bytes held there against its budget;
     * demotions (device -> host on eviction), promotions (host -> device for a row) and the seconds
     * they took; host_recomputed: rows that found their deepest checkpoint only in host memory and
     * recomputed it because the cost model said that was cheaper; host_evicted: checkpoints dropped
     * from the host tier for room; host_slabs_reserved: the host tier's page-locked slabs pinned
     * when the cache was made (its whole budget, off the request path), in host_reserve_seconds;
     * host_slabs_sync: slabs taken on demand inside a demotion (0 when the budget was reserved). */
    uint64_t host_checkpoints;
    size_t host_bytes_held, host_budget_bytes;
    uint64_t demotions, promotions, host_recomputed, host_evicted;
    uint64_t host_slabs_reserved, host_slabs_sync;
    double host_reserve_seconds;
    double promote_seconds, demote_seconds;
    /* The disk tier (squad_engine_cache_save / _load): checkpoint records saved, loaded into the
     * cache, and refused (mismatched identity, corrupt or truncated), over the engine's life. */
    uint64_t disk_saved, disk_loaded, disk_refused;
} squad_cache_stats;

void squad_engine_opts_default(squad_engine_opts *opts);

/* Loads config.json and the safetensors weights of a Hugging Face model directory. */
squad_model *squad_model_load(const char *dir, squad_err *err);
void squad_model_free(squad_model *model);
/* Model facts a caller needs to build rows. squad_model_max_tokens is the model's own limit
 * (max_position_embeddings); an engine's may be lower (squad_engine_max_tokens). */
int squad_model_vocab_size(const squad_model *model);
int squad_model_max_tokens(const squad_model *model);

/* An image for a row: decodes PNG / JPEG / WebP bytes (max_pixels > 0 bounds width x height
 * before anything is decoded; 0: the default), computes the grid the model's image processor
 * (preprocessor_config.json) gives it, its token count and identity, and keeps the decoded pixels
 * in out->image. out->pos is left 0. SQUAD_E_INVALID with a message for a bad image,
 * SQUAD_E_UNSUPPORTED for a model without a vision tower. Free with squad_row_image_free. */
int squad_image_load(const squad_model *model, const uint8_t *bytes, size_t len, int64_t max_pixels,
                     squad_row_image *out, squad_err *err);
void squad_row_image_free(squad_row_image *image);

squad_engine *squad_engine_new(squad_model *model, const squad_engine_opts *opts, squad_err *err);
void squad_engine_free(squad_engine *engine);
/* "cpu" or "cuda": the backend the engine runs on. */
const char *squad_engine_device(const squad_engine *engine);
/* The longest row the engine takes, and (when why is not NULL) what bounds it: the model, the
 * max_tokens option, or the device's memory (a caller may log "bounded by memory, not the model"). */
int squad_engine_max_tokens(const squad_engine *engine, squad_limit *why);

/* Validates a row against the model (its vocabulary and positions); 0 when it can be scored, else
 * SQUAD_E_INVALID and why. squad_engine_row_check adds the engine's own longest row. */
int squad_row_check(const squad_model *model, const squad_row *row, squad_err *err);
int squad_engine_row_check(const squad_engine *engine, const squad_row *row, squad_err *err);

/* Answers one row. On a bad row returns SQUAD_E_INVALID and the engine stays usable. */
int squad_engine_score(squad_engine *engine, const squad_row *row, squad_result *out, squad_err *err);
/* The same with per-call options (opts may be NULL). */
int squad_engine_score_ex(squad_engine *engine, const squad_row *row, const squad_score_opts *opts,
                          squad_result *out, squad_err *err);

/* Several rows at once: answered together in batched steps (rows in flight share each step's
 * passes over the weights). rcs[i] and errs[i] (either may be NULL) say how row i ended; a row
 * that fails (a bad row, a cancelled one) fails alone and the others are answered. Returns 0 when
 * every row was answered, else the first failing row's code with err filled from it. */
int squad_engine_score_batch(squad_engine *engine, const squad_row *rows, int n_rows, const squad_score_opts *opts,
                             squad_result *outs, int *rcs, squad_err *errs, squad_err *err);

/* Continuous batching, for a caller with its own queue (the server). squad_engine_submit validates
 * a row and takes it in (its arrays, *opts and *out are borrowed until done is called; opts may
 * be NULL); a bad row is refused at once (SQUAD_E_INVALID, nothing queued, done not called).
 * squad_engine_step runs one batched step over the rows taken in (rows join and leave between
 * steps) and calls done(ctx, rc, err) for each row that ended in it: rc 0 answered (out filled),
 * else failed or cancelled with err saying why. done may also be called from inside submit (a
 * repeat the memo answers). squad_engine_step returns the number of rows taken in and not yet done
 * (0: idle), or a negative code when the backend failed (every row in flight then ended with it). */
typedef void (*squad_done_fn)(void *ctx, int rc, const squad_err *err);
int squad_engine_submit(squad_engine *engine, const squad_row *row, const squad_score_opts *opts, squad_result *out,
                        squad_done_fn done, void *ctx, squad_err *err);
int squad_engine_step(squad_engine *engine, squad_err *err);
/* Rows taken in and not yet done. */
int squad_engine_pending(const squad_engine *engine);
/* The batching limits the engine took: rows in flight at once (max_rows, capped by the backend's
 * sequence slots) and tokens a step (batch_tokens, capped by the backend's largest batch). */
void squad_engine_batching(const squad_engine *engine, int *max_rows, int *batch_tokens);

/* What the engine's device has done that an operator may want to see. On CUDA: the chunk graphs
 * captured so far (the single-row ones at start; a batch shape's on its first step, which that step
 * waits for) and the seconds spent capturing them. Zeros on the CPU. */
typedef struct squad_device_stats {
    int graphs;
    double capture_s;
} squad_device_stats;
void squad_engine_device_stats(const squad_engine *engine, squad_device_stats *out);

/* Specialists (docs/specialists.md): a router and LoRA adapters over the model's upper layers,
 * loaded from a directory holding squad-specialists.json. Loading validates every file and tensor
 * against the model; anything squad cannot apply exactly is refused with a message naming the
 * adapter and the tensor or field. Routes are numbered by the router's labels, 0 the trunk. */
squad_specialists *squad_specialists_load(const squad_model *model, const char *dir, squad_err *err);
void squad_specialists_free(squad_specialists *specialists);
/* The number of routes (labels), the trunk included. */
int squad_specialists_count(const squad_specialists *specialists);
/* The label of a route, NULL when out of range. */
const char *squad_specialists_label(const squad_specialists *specialists, int route);
/* The route of a label, -1 when none has it. */
int squad_specialists_find(const squad_specialists *specialists, const char *label);

/* Rows the engine answered with route `route` (memo answers included); 0 out of range. */
uint64_t squad_engine_route_rows(const squad_engine *engine, int route);

void squad_engine_cache_stats(const squad_engine *engine, squad_cache_stats *out);
/* Drops every checkpoint of the state cache and every memo entry. */
void squad_engine_cache_clear(squad_engine *engine);

/* The disk tier (docs/design.md section 7, "Tiers"): the state cache's checkpoints written to a
 * directory and read back by a later engine on the same model, so a restart keeps its states.
 *
 * The file (DIR/squad-cache.bin) carries the engine's identity: a hash of config.json, the weights'
 * safetensors headers, the tokenizer file (tokenizer_path; NULL: none), the specialists directory
 * (its router file and its adapters' files) and the backend's blob layout. A file of another
 * identity is refused whole; each record has its own checksum, and a corrupt, truncated or
 * inconsistent record is refused alone (log receives one line each; may be NULL) while the valid
 * ones load. Nothing read from the file is trusted before it is checked. */
typedef struct squad_cache_store_opts {
    const char *dir;
    const char *tokenizer_path;
    void (*log)(void *ctx, const char *line);
    void *log_ctx;
    /* Polled between records while reading; nonzero stops the read (what was read is kept). */
    int (*stop)(void *ctx);
    void *stop_ctx;
} squad_cache_store_opts;

typedef struct squad_cache_store_stats {
    uint64_t checkpoints; /* checkpoint records written, read (valid), or adopted by the cache */
    uint64_t groups;      /* K / V group records written or read */
    uint64_t refused;     /* records refused (or every record of a refused file) */
    uint64_t skipped;     /* valid checkpoints the cache did not take (no room, already held) */
    size_t bytes;         /* file bytes written or read */
    double seconds;
} squad_cache_store_stats;

/* Writes every checkpoint the cache holds (both tiers), most recently used first, to opts->dir
 * (created if missing; the file replaced atomically). */
int squad_engine_cache_save(squad_engine *engine, const squad_cache_store_opts *opts, squad_cache_store_stats *st,
                            squad_err *err);
/* Reads opts->dir's file and adopts its valid checkpoints (squad_engine_cache_read, then _adopt).
 * A missing file is not an error (nothing loaded). */
int squad_engine_cache_load(squad_engine *engine, const squad_cache_store_opts *opts, squad_cache_store_stats *st,
                            squad_err *err);
/* The two halves, so a server reads in the background while its engine answers: _read checks and
 * holds a file's valid records in host memory; it reads only what the engine fixed at its creation
 * (the model, the specialists, the backend's shapes), so it may run on another thread while the
 * engine works. _adopt (on the engine's thread) puts them into the cache, in the device budget
 * while it has room, then the host tier, never evicting what the cache already holds; the
 * snapshot is consumed. */
typedef struct squad_cache_snapshot squad_cache_snapshot;
squad_cache_snapshot *squad_engine_cache_read(const squad_engine *engine, const squad_cache_store_opts *opts,
                                              squad_cache_store_stats *st, squad_err *err);
int squad_engine_cache_adopt(squad_engine *engine, squad_cache_snapshot *snap, squad_cache_store_stats *st,
                             squad_err *err);
void squad_cache_snapshot_free(squad_cache_snapshot *snap);

#ifdef __cplusplus
}
#endif
#endif /* SQUAD_H */
