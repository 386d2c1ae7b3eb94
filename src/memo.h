/*
 * memo.h — the exact-request memo: a whole repeated row (same ids, slots, nopts, letters and
 * state_len, and the same images) is answered from memory before it reaches the state cache
 * (docs/design.md section 7).
 *
 * Entries are keyed by a 64-bit hash of the row's whole content and verified by comparing the
 * stored copy of the row, so two different rows are never confused. An entry also keeps the
 * answer's full-vocabulary figures when the call that made it asked for them; a later call that
 * asks for them is answered only by an entry that has them. A byte-bounded LRU map (lru_map.h):
 * every byte an entry holds (its header, the row's copy, the answer) and the bucket array count
 * against the budget; the least recently used entries go first.
 */
#ifndef SQUAD_MEMO_H
#define SQUAD_MEMO_H

#include <stddef.h>
#include <stdint.h>

#include "squad.h"

/* A default budget for an engine's memo. */
#define SQUAD_MEMO_DEFAULT_BYTES ((size_t)16 << 20)

typedef struct squad_memo squad_memo;

typedef struct squad_memo_stats {
    uint64_t hits, misses, stored, evicted;
    size_t entries, bytes_held, budget_bytes;
} squad_memo_stats;

/* A memo holding at most budget_bytes (0: a memo that stores nothing). */
squad_memo *squad_memo_new(size_t budget_bytes, squad_err *err);
void squad_memo_free(squad_memo *memo);

/* 1 and *out filled when this exact row was answered before (out->reused and out->computed are 0:
 * nothing restored, nothing computed; probs, n_slots, route and the router's probabilities are the stored answer); 0 when not.
 * A hit makes the entry the most recently used. */
int squad_memo_get(squad_memo *memo, const squad_row *row, squad_result *out);

/* squad_memo_get for a call that needs the full-vocabulary figures (need_vocab = 1): only an entry
 * that holds them answers, and they come back in out (has_vocab = 1). With need_vocab = 0 the
 * figures are left out even when the entry has them (the answer is what such a call computes). */
int squad_memo_lookup(squad_memo *memo, const squad_row *row, int need_vocab, squad_result *out);

/* Stores the answer to a row (replacing an older one for the same row), with its full-vocabulary
 * figures when result->has_vocab. An entry larger than the whole budget is not stored. 0, or SQUAD_E_NOMEM when memory is short (the memo stays valid). */
int squad_memo_put(squad_memo *memo, const squad_row *row, const squad_result *result, squad_err *err);

/* Drops every entry (the counters stay). */
void squad_memo_clear(squad_memo *memo);

void squad_memo_get_stats(const squad_memo *memo, squad_memo_stats *out);

#endif /* SQUAD_MEMO_H */
