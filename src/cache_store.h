/*
 * cache_store.h — the disk tier: the state cache's checkpoints in a file that a later engine on the
 * same model reads back (docs/design.md section 7, "Tiers"; the format in cache_store.c).
 *
 * A file is refused whole when its identity (the model's files, the tokenizer, the specialists,
 * the backend's blob layout) or its shapes differ from the reader's, and record by record when a
 * record's checksum, length or contents do not hold: nothing from a file is used before it is
 * checked, and what is valid loads.
 */
#ifndef SQUAD_CACHE_STORE_H
#define SQUAD_CACHE_STORE_H

#include <stdint.h>
#include <stdio.h>

#include "cache.h"
#include "model.h"
#include "specialists.h"
#include "squad.h"

/* The file's name inside the cache directory. */
#define SQUAD_STORE_FILE "squad-cache.bin"

/* What a file must match to be read: the identity and the shapes of its blobs, and the bounds its
 * records are checked against. */
typedef struct squad_store_shape {
    uint64_t identity[2];
    uint64_t gdn_bytes, kv_bytes_per_pos;
    int align, feat_dim;
    int max_positions; /* a group longer than this is refused */
    int vocab;         /* token ids in [0, vocab) */
    int n_routes;      /* routes in [0, n_routes) (1 without specialists) */
} squad_store_shape;

/* The identity of a model directory's config.json and weights (each safetensors file's header and
 * the first bytes of each tensor, so two checkpoints of one architecture differ), a tokenizer file
 * (NULL: none), a specialists set (NULL: none) and the backend's blob layout (its name and
 * precision): 128 bits into out. */
int squad_store_identity(const squad_model *model, const squad_specialists *sp, const char *tokenizer_path,
                         const char *backend, int precision, uint64_t out[2], squad_err *err);

/* Writes every checkpoint of the cache to dir/SQUAD_STORE_FILE (through a temporary file renamed
 * over it, so a crash mid-write leaves the old file). */
int squad_store_save(const squad_cache *cache, const squad_store_shape *shape, const char *dir,
                     squad_cache_store_stats *st, squad_err *err);

/* Reads a file's valid records into host memory. A missing file gives an empty snapshot; a file
 * of another identity or shape gives an empty snapshot, every record counted refused and one log
 * line. NULL only when memory runs out. */
squad_cache_snapshot *squad_store_read(const char *dir, const squad_store_shape *shape,
                                       const squad_cache_store_opts *opts, squad_cache_store_stats *st, squad_err *err);
/* The same from an open stream of `size` bytes (the fuzz target reads memory through it). */
squad_cache_snapshot *squad_store_read_stream(FILE *f, uint64_t size, const squad_store_shape *shape,
                                              const squad_cache_store_opts *opts, squad_cache_store_stats *st,
                                              squad_err *err);

/* Hands a snapshot's checkpoints to the cache (squad_cache_adopt), consuming the snapshot's
 * records: st->checkpoints adopted, st->skipped not taken. The snapshot must have been read
 * against the cache's own shape. */
void squad_store_adopt(squad_cache *cache, squad_cache_snapshot *snap, squad_cache_store_stats *st);

/* Checkpoint records a snapshot holds. */
int squad_store_snapshot_count(const squad_cache_snapshot *snap);

#endif /* SQUAD_CACHE_STORE_H */
