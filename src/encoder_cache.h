/*
 * encoder_cache.h — the encoder cache (docs/images.md): an image's identity -> the vision tower's
 * output for it (fp32 host rows, one per <|image_pad|>), least recently used out first within a
 * byte budget (squad_engine_opts.encoder_cache_bytes).
 *
 * A new question about a known screenshot whose state checkpoint was evicted, or the same
 * screenshot placed after other text (no shared prefix), skips the tower: the engine asks this
 * cache before running it. The identity is a cryptographic digest of the decoded pixels and the
 * grid (image/identity.h), so an equal identity is trusted without the pixels; the row count joins
 * the key so an output of another shape can never be handed back. A byte-bounded LRU map
 * (lru_map.h) holds the entries: every byte (header, key, rows, buckets) counts.
 */
#ifndef SQUAD_ENCODER_CACHE_H
#define SQUAD_ENCODER_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "squad.h"

typedef struct squad_encoder_cache squad_encoder_cache;

/* A cache of at most budget_bytes (0: one that keeps nothing). */
squad_encoder_cache *squad_encoder_cache_new(size_t budget_bytes, squad_err *err);
void squad_encoder_cache_free(squad_encoder_cache *cache);

/* 1 and the n_floats floats of the image's output into out when held (the entry becomes the most
 * recently used), else 0. */
int squad_encoder_cache_get(squad_encoder_cache *cache, const uint8_t identity[16], float *out, size_t n_floats);

/* Keeps a copy of the image's output (replacing an older one), evicting the least recently used
 * entries; an output larger than the whole budget is not kept. 0, or SQUAD_E_NOMEM (the cache
 * stays valid, without it). */
int squad_encoder_cache_put(squad_encoder_cache *cache, const uint8_t identity[16], const float *rows,
                            size_t n_floats, squad_err *err);

/* Drops every entry. */
void squad_encoder_cache_clear(squad_encoder_cache *cache);

/* Bytes held now and the budget. */
void squad_encoder_cache_bytes(squad_encoder_cache *cache, size_t *held, size_t *budget);

#endif /* SQUAD_ENCODER_CACHE_H */
