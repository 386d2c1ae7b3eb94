/*
 * cache_internal.h — the state cache's internals that tests and benchmarks reach (cache.h is the
 * view of the layers above).
 *
 * The cache only plans rows; a layer above it applies the plans (plan_apply.h: the scheduler in
 * production, squad_plan_run_row with a stand-in span runner in tests), so the index, the LRU, the
 * pins and the byte accounting can be checked in isolation with a fake backend that records what
 * it was given. Nothing here names that layer: the cache exposes what an applier needs (cache.h's
 * plan and its blobs), never the other way round. The placement policy and the prefix hashes are
 * exposed so a test can compute the earlier runtime's reuse independently of the cache's own
 * bookkeeping.
 */
#ifndef SQUAD_CACHE_INTERNAL_H
#define SQUAD_CACHE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "tier_pool.h"

/* The placement policy: the chunk ends of a state of state_len tokens computed from position c0,
 * ascending, each a checkpoint position: the multiples of stride, state_len - tail and state_len
 * (each rounded down to align), and `fork` (the deepest position the row shares with a cached
 * state; 0 for none), above c0 and at most state_len rounded down, plus extra ends so no chunk
 * exceeds max_chunk. Writes at most cap positions and returns how many there are (may exceed cap:
 * call again with more room). */
int squad_cache_bounds(const squad_cache_opts *opts, int max_chunk, int c0, int state_len, int fork, int *out,
                       int cap);
/* The same with the caller's marks as further positions (rounded down to align). */
int squad_cache_bounds_at(const squad_cache_opts *opts, int max_chunk, int c0, int state_len, int fork,
                          const int *marks, int n_marks, int *out, int cap);

/* The 64-bit keys of the row prefixes [0, k * align) for k = 1..n_blocks (keys[k - 1]); every
 * key depends on all tokens before its position and on the position. */
void squad_cache_prefix_keys(const int32_t *ids, int align, int n_blocks, uint64_t *keys);

/* The position of the deepest cached checkpoint whose tokens equal ids[0, pos) with pos <= n
 * (0 when none); does not touch the LRU order or the statistics. */
int squad_cache_lookup(const squad_cache *cache, const int32_t *ids, int n);

/* Bytes held, split into backend blobs (GDN snapshots, K / V) and host memory (structures, token
 * ids, the index's buckets). Their sum is squad_cache_stats.bytes_held. */
void squad_cache_bytes(const squad_cache *cache, size_t *backend_bytes, size_t *host_bytes);

/* Walks every structure (LRU list, index, groups) and checks that they agree with each other and
 * with the byte counters; 0 when consistent, else -1 with a description in why. */
int squad_cache_check(const squad_cache *cache, char *why, size_t why_len);

/* The bytes one checkpoint and one group of n positions cost (what the budget is compared with). */
size_t squad_cache_ckpt_cost(const squad_cache *cache);
size_t squad_cache_group_cost(const squad_cache *cache, int n_positions);

/* Test hook: narrows the index keys to `bits` bits (on an empty cache) so different prefixes
 * collide and only the token comparison tells them apart. */
void squad_cache_debug_key_bits(squad_cache *cache, int bits);

/* Test hook: a host tier of host_budget bytes on an empty cache, also over a backend whose blobs
 * are host memory (the CPU: copies are memcpy), so CPU tests exercise demotion and promotion.
 * force: 1 every host checkpoint a row finds is promoted, -1 none is (the row recomputes from the
 * deepest device one), 0 the cost model decides. Over page-locked slabs the budget is reserved
 * (as squad_cache_new does): 0, or the error code with err filled when that is refused. */
int squad_cache_debug_host_tier(squad_cache *cache, size_t host_budget, int force, squad_err *err);

/* The cost model: 1 when copying `bytes` up at copy_bytes_per_s costs less than recomputing
 * tokens_saved tokens at row_s_per_token seconds each (0 when the rate is unknown). */
int squad_cache_tier_pays(double bytes, int tokens_saved, double copy_bytes_per_s, double row_s_per_token);
/* Test hook: the cost model's figures (a figure <= 0 leaves the measured one). The copy figure is
 * the cache's own (memcpy promotions); a backend that copies asynchronously supplies its own. */
void squad_cache_debug_tier_rates(squad_cache *cache, double copy_bytes_per_s, double row_s_per_token);
/* Test hook: where the host tier's slabs come from (get / put over ctx, `step` bytes each, 0:
 * SQUAD_TIER_POOL_STEP), in place of the backend's; the pool is made again (only while the cache
 * holds nothing), its whole host budget reserved when `reserve` is set, as squad_cache_new does
 * over page-locked memory. 0, or the error code with err filled as squad_cache_new's (the slabs
 * taken stay in the pool until the cache is freed). */
int squad_cache_debug_tier_slabs(squad_cache *cache, squad_tier_slab_get get, squad_tier_slab_put put, void *ctx,
                                 size_t step, int reserve, squad_err *err);
/* Test hook: the host tier's slab pool (its slabs, bytes and consistency). */
const squad_tier_pool *squad_cache_debug_tier_pool(const squad_cache *cache);

#endif /* SQUAD_CACHE_INTERNAL_H */
