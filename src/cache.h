/*
 * cache.h — the cross-request state cache (docs/design.md section 7).
 *
 * A row is [state prefix | question suffix]. Checkpoints of the model state at chosen positions
 * of the prefix (p, p - tail, multiples of stride; aligned) are kept in backend memory, LRU within
 * a byte budget; a later row restores the deepest checkpoint whose tokens it shares and computes
 * only the rest. Lookup goes through an index of aligned token blocks (never a scan over all
 * cached states), and a candidate is always verified against the tokens.
 */
#ifndef SQUAD_CACHE_H
#define SQUAD_CACHE_H

#include "backend.h"
#include "squad.h"

typedef struct squad_cache squad_cache;
struct squad_engine;

squad_cache *squad_cache_new(squad_backend *be, const squad_cache_opts *opts, squad_err *err);
void squad_cache_free(squad_cache *cache);

/* 1 when the row may take the cached path (state_len given, p >= min_prefix, slots in the suffix,
 * at most max_slots slots, fits the backend); 0 otherwise. */
int squad_cache_eligible(const squad_cache *cache, const squad_row *row);

/* Answers an eligible row: restore, run the rest through squad_engine_run_span, checkpoint, evict.
 * end_only: checkpoint the state at its end (p) only. Fills out->reused and out->cache_written.
 * When the span runner fails (an error, a cancelled row) the checkpoints the row had pending are
 * released, those it had committed stay (valid states), and the cache stays consistent. */
int squad_cache_score(squad_cache *cache, struct squad_engine *e, const squad_row *row, int end_only,
                      squad_result *out, squad_err *err);

/* Drops every checkpoint and group (the counters stay; a clear is not counted as evictions). */
void squad_cache_clear(squad_cache *cache);

void squad_cache_get_stats(const squad_cache *cache, squad_cache_stats *out);

#endif /* SQUAD_CACHE_H */
