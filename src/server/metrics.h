/*
 * metrics.h — the server's counters and their two renderings: Prometheus text (GET /metrics) and
 * JSON (GET /v1/stats), from one snapshot so both always say the same.
 *
 * Request counters (by endpoint and status) and latency histograms are lock-free atomics bumped by
 * the connection threads; the engine's figures come from the scheduler's published snapshot, the
 * memo's and the token cache's from their own locks.
 */
#ifndef SQUAD_SERVER_METRICS_H
#define SQUAD_SERVER_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "lru_map.h"
#include "server/jobs.h"
#include "util.h"

typedef enum {
    SRV_EP_ASK,
    SRV_EP_SCORE,
    SRV_EP_DECISIONS,
    SRV_EP_SYSTEMONE,
    SRV_EP_MODELS,
    SRV_EP_HEALTH,
    SRV_EP_READY,
    SRV_EP_METRICS,
    SRV_EP_STATS,
    SRV_EP_CACHE_CLEAR,
    SRV_EP_OTHER, /* unknown paths */
    SRV_EP_COUNT
} srv_endpoint;

/* The path of each endpoint ("other" for SRV_EP_OTHER). */
extern const char *const SRV_EP_PATH[SRV_EP_COUNT];

#define SRV_STATUS_MIN 100
#define SRV_STATUS_SLOTS 500 /* statuses 100..599 */
#define SRV_LAT_BUCKETS 16   /* upper bounds in SRV_LAT_BOUNDS, then +Inf */

typedef struct srv_metrics {
    _Atomic uint64_t requests[SRV_EP_COUNT][SRV_STATUS_SLOTS];
    _Atomic uint64_t lat_bucket[SRV_EP_COUNT][SRV_LAT_BUCKETS + 1];
    _Atomic uint64_t lat_sum_ns[SRV_EP_COUNT];
    _Atomic uint64_t memo_hits, memo_misses; /* the request memo, per request */
    _Atomic uint64_t rows_submitted;
    _Atomic uint64_t in_flight; /* requests begun and not yet completed (a gauge) */
} srv_metrics;

/* One finished request. */
void srv_metrics_request(srv_metrics *m, srv_endpoint ep, int status, double seconds);

/* Everything /metrics and /v1/stats report. */
typedef struct srv_metrics_view {
    const srv_metrics *m;
    const squad_specialists *sp; /* labels for the per-route counts; NULL: none */
    srv_jobs_stats jobs;
    squad_lru_map_stats memo, tokens;
    double uptime_s;
} srv_metrics_view;

void srv_metrics_prometheus(squad_buf *b, const srv_metrics_view *v);
void srv_metrics_json(squad_buf *b, const srv_metrics_view *v);

#endif /* SQUAD_SERVER_METRICS_H */
