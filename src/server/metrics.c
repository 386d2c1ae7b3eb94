/*
 * metrics.c — the counters of metrics.h and their Prometheus / JSON text. Metric names are listed
 * in docs/server.md; every name is prefixed squad_.
 */
#include "server/metrics.h"

#include <inttypes.h>
#include <stdio.h>

#include "answer_json.h"

const char *const SRV_EP_PATH[SRV_EP_COUNT] = {"/v1/ask",  "/v1/score", "/v1/decisions", "/v1/systemone",
                                               "/v1/models", "/health", "/ready",       "/metrics",
                                               "/v1/stats", "/v1/cache/clear", "other"};

/* Latency bucket upper bounds in seconds: from a memo hit (tens of us) to a cold long page. */
static const double SRV_LAT_BOUNDS[SRV_LAT_BUCKETS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                      0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,     10};

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define ADD(x, v) atomic_fetch_add_explicit(&(x), (v), memory_order_relaxed)

void srv_metrics_request(srv_metrics *m, srv_endpoint ep, int status, double seconds) {
    if (status >= SRV_STATUS_MIN && status < SRV_STATUS_MIN + SRV_STATUS_SLOTS)
        ADD(m->requests[ep][status - SRV_STATUS_MIN], 1);
    int b = 0;
    while (b < SRV_LAT_BUCKETS && seconds > SRV_LAT_BOUNDS[b]) b++;
    ADD(m->lat_bucket[ep][b], 1);
    ADD(m->lat_sum_ns[ep], (uint64_t)(seconds > 0 ? seconds * 1e9 : 0));
}

static void counter(squad_buf *b, const char *name, const char *help, uint64_t v) {
    squad_buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %" PRIu64 "\n", name, help, name, name, v);
}

/* A counter whose value is not a whole number (seconds). */
static void counter_f(squad_buf *b, const char *name, const char *help, double v) {
    squad_buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %.9g\n", name, help, name, name, v);
}

static void gauge(squad_buf *b, const char *name, const char *help, double v) {
    squad_buf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", name, help, name, name, v);
}

/* The state cache's tiers (docs/design.md section 7): the host tier under the device budget and
 * the disk tier's records. */
static void tier_metrics(squad_buf *b, const squad_cache_stats *c) {
    gauge(b, "squad_cache_host_checkpoints", "Checkpoints the host-RAM tier holds.", (double)c->host_checkpoints);
    gauge(b, "squad_cache_host_bytes", "Bytes the host-RAM tier holds.", (double)c->host_bytes_held);
    gauge(b, "squad_cache_host_budget_bytes", "The host-RAM tier's budget (0: off).", (double)c->host_budget_bytes);
    counter(b, "squad_cache_demotions_total", "Checkpoints moved from the device budget to the host tier.", c->demotions);
    counter(b, "squad_cache_promotions_total", "Checkpoints moved back from the host tier for a row.", c->promotions);
    counter(b, "squad_cache_host_recomputed_total",
            "Rows that found their state only in the host tier and recomputed it (cheaper by the cost model).",
            c->host_recomputed);
    counter(b, "squad_cache_host_evictions_total", "Checkpoints dropped from the host tier for room.", c->host_evicted);
    counter(b, "squad_cache_host_slabs_reserved_total",
            "Host-tier slabs pinned when the cache was made (its whole budget, off the request path).",
            c->host_slabs_reserved);
    counter(b, "squad_cache_host_slabs_sync_total", "Host-tier slabs pinned inside a demotion (0 when reserved).",
            c->host_slabs_sync);
    gauge(b, "squad_cache_host_reserve_seconds", "Seconds pinning the host tier's budget took at startup.",
          c->host_reserve_seconds);
    squad_buf_printf(b, "# HELP squad_cache_tier_seconds_total Seconds spent moving checkpoints between tiers.\n"
                        "# TYPE squad_cache_tier_seconds_total counter\n"
                        "squad_cache_tier_seconds_total{kind=\"promote\"} %.6f\n"
                        "squad_cache_tier_seconds_total{kind=\"demote\"} %.6f\n",
                     c->promote_seconds, c->demote_seconds);
    squad_buf_printf(b, "# HELP squad_cache_disk_records_total Checkpoint records of the disk tier (--cache-dir).\n"
                        "# TYPE squad_cache_disk_records_total counter\n"
                        "squad_cache_disk_records_total{kind=\"saved\"} %" PRIu64 "\n"
                        "squad_cache_disk_records_total{kind=\"loaded\"} %" PRIu64 "\n"
                        "squad_cache_disk_records_total{kind=\"refused\"} %" PRIu64 "\n",
                     c->disk_saved, c->disk_loaded, c->disk_refused);
}

/* A histogram without labels from its bucket counts (SRV_STEP_BUCKETS bounds, then +Inf). */
static void histogram(squad_buf *b, const char *name, const char *help, const double *bounds, const uint64_t *bucket,
                      double sum) {
    squad_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int k = 0; k <= SRV_STEP_BUCKETS; k++) {
        cum += bucket[k];
        if (k < SRV_STEP_BUCKETS) squad_buf_printf(b, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, bounds[k], cum);
        else squad_buf_printf(b, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
    }
    squad_buf_printf(b, "%s_sum %.17g\n%s_count %" PRIu64 "\n", name, sum, name, cum);
}

/* The JSON of one such histogram: {"count", "sum", "buckets": {"le": cumulative count, ...}}. */
static void histogram_json(squad_buf *b, const double *bounds, const uint64_t *bucket, double sum) {
    uint64_t cum = 0, total = 0;
    for (int k = 0; k <= SRV_STEP_BUCKETS; k++) total += bucket[k];
    squad_buf_printf(b, "{\"count\": %" PRIu64 ", \"sum\": %.17g, \"buckets\": {", total, sum);
    for (int k = 0; k <= SRV_STEP_BUCKETS; k++) {
        cum += bucket[k];
        if (k < SRV_STEP_BUCKETS) squad_buf_printf(b, "%s\"%g\": %" PRIu64, k ? ", " : "", bounds[k], cum);
        else squad_buf_printf(b, ", \"+Inf\": %" PRIu64, cum);
    }
    squad_buf_puts(b, "}}");
}

/* A Prometheus label value: backslash, double quote and newline escaped. */
static void label_value(squad_buf *b, const char *s) {
    for (; s && *s; s++) {
        if (*s == '\\') squad_buf_puts(b, "\\\\");
        else if (*s == '"') squad_buf_puts(b, "\\\"");
        else if (*s == '\n') squad_buf_puts(b, "\\n");
        else squad_buf_put(b, s, 1);
    }
}

/* Images (docs/images.md): rows that held images, their image tokens, and the encoder cache. */
static void images_prometheus(squad_buf *b, const squad_cache_stats *c) {
    counter(b, "squad_image_rows_total", "Rows that held images.", c->image_rows);
    counter(b, "squad_image_tokens_total", "Image tokens (<|image_pad|>) in the rows answered.", c->image_tokens);
    counter(b, "squad_encoder_cache_hits_total", "Images whose vision tower output the encoder cache held.",
            c->encoder_hits);
    counter(b, "squad_encoder_cache_misses_total", "Images the vision tower ran for.", c->encoder_misses);
    gauge(b, "squad_encoder_cache_bytes", "Bytes the encoder cache holds.", (double)c->encoder_bytes);
    gauge(b, "squad_encoder_cache_budget_bytes", "The encoder cache's budget.", (double)c->encoder_budget_bytes);
}

static void images_json(squad_buf *b, const squad_cache_stats *c) {
    squad_buf_printf(b,
                     ", \"images\": {\"rows\": %" PRIu64 ", \"tokens\": %" PRIu64 ", \"encoder_hits\": %" PRIu64
                     ", \"encoder_misses\": %" PRIu64 ", \"encoder_bytes\": %zu, \"encoder_budget_bytes\": %zu}",
                     c->image_rows, c->image_tokens, c->encoder_hits, c->encoder_misses, c->encoder_bytes,
                     c->encoder_budget_bytes);
}

void srv_metrics_prometheus(squad_buf *b, const srv_metrics_view *v) {
    const srv_metrics *m = v->m;
    const squad_cache_stats *c = &v->jobs.cache;
    squad_buf_puts(b, "# HELP squad_http_requests_total HTTP requests answered, by endpoint and status.\n"
                      "# TYPE squad_http_requests_total counter\n");
    for (int e = 0; e < SRV_EP_COUNT; e++)
        for (int s = 0; s < SRV_STATUS_SLOTS; s++) {
            uint64_t n = LOAD(m->requests[e][s]);
            if (n)
                squad_buf_printf(b, "squad_http_requests_total{endpoint=\"%s\",code=\"%d\"} %" PRIu64 "\n",
                                 SRV_EP_PATH[e], s + SRV_STATUS_MIN, n);
        }
    squad_buf_puts(b, "# HELP squad_http_request_duration_seconds Time from a request's arrival to its answer.\n"
                      "# TYPE squad_http_request_duration_seconds histogram\n");
    for (int e = 0; e < SRV_EP_COUNT; e++) {
        uint64_t cum = 0;
        for (int k = 0; k <= SRV_LAT_BUCKETS; k++) cum += LOAD(m->lat_bucket[e][k]);
        if (!cum) continue;
        cum = 0;
        for (int k = 0; k <= SRV_LAT_BUCKETS; k++) {
            cum += LOAD(m->lat_bucket[e][k]);
            if (k < SRV_LAT_BUCKETS)
                squad_buf_printf(b, "squad_http_request_duration_seconds_bucket{endpoint=\"%s\",le=\"%g\"} %" PRIu64 "\n",
                                 SRV_EP_PATH[e], SRV_LAT_BOUNDS[k], cum);
            else
                squad_buf_printf(b, "squad_http_request_duration_seconds_bucket{endpoint=\"%s\",le=\"+Inf\"} %" PRIu64 "\n",
                                 SRV_EP_PATH[e], cum);
        }
        squad_buf_printf(b, "squad_http_request_duration_seconds_sum{endpoint=\"%s\"} %.9f\n", SRV_EP_PATH[e],
                         (double)LOAD(m->lat_sum_ns[e]) * 1e-9);
        squad_buf_printf(b, "squad_http_request_duration_seconds_count{endpoint=\"%s\"} %" PRIu64 "\n", SRV_EP_PATH[e],
                         cum);
    }
    gauge(b, "squad_ready", "1 when the engine is loaded and ready.", v->jobs.ready);
    gauge(b, "squad_uptime_seconds", "Seconds since the server started.", v->uptime_s);
    gauge(b, "squad_requests_in_flight", "Requests being handled (parsing, waiting or running).",
          (double)LOAD(m->in_flight));
    gauge(b, "squad_queue_depth", "Jobs waiting for the scheduler.", v->jobs.queue_depth);
    gauge(b, "squad_queue_capacity", "Jobs that may wait (--queue).", v->jobs.queue_capacity);
    gauge(b, "squad_rows_running", "Rows the engine's last step ran (0 when idle).", v->jobs.rows_running);
    gauge(b, "squad_rows_in_flight", "Rows submitted to the engine and not yet done.", v->jobs.rows_in_flight);
    gauge(b, "squad_requests_running", "Requests with rows in the engine (a gateway's requests running).",
          v->jobs.jobs_running);
    gauge(b, "squad_engine_max_rows", "Rows the engine runs at once (--max-rows).", v->jobs.max_rows);
    gauge(b, "squad_engine_batch_tokens", "Tokens one engine step runs at most (--batch-tokens).", v->jobs.batch_tokens);
    counter(b, "squad_engine_steps_total", "Batched engine steps that ran rows.", v->jobs.steps);
    gauge(b, "squad_device_graphs", "CUDA chunk graphs captured (a batch shape's on its first step).",
          v->jobs.device_stats.graphs);
    counter_f(b, "squad_device_graph_capture_seconds_total", "Seconds spent capturing CUDA chunk graphs.",
              v->jobs.device_stats.capture_s);
    histogram(b, "squad_engine_step_rows", "Rows one engine step ran.", SRV_STEP_ROWS_BOUNDS, v->jobs.step_rows_bucket,
              (double)v->jobs.step_rows_sum);
    histogram(b, "squad_engine_step_tokens", "Tokens one engine step computed.", SRV_STEP_TOKENS_BOUNDS,
              v->jobs.step_tokens_bucket, (double)v->jobs.step_tokens_sum);
    histogram(b, "squad_engine_step_seconds", "Wall time of one engine step (a CUDA graph's capture included).",
              SRV_STEP_SECONDS_BOUNDS, v->jobs.step_seconds_bucket, v->jobs.step_seconds_sum);
    counter(b, "squad_rows_submitted_total", "Rows handed to the scheduler.", LOAD(m->rows_submitted));
    counter(b, "squad_jobs_timeout_total", "Requests whose --timeout passed while waiting or running.",
            v->jobs.jobs_timeout);
    counter(b, "squad_jobs_cancelled_total", "Requests cancelled because their client disconnected.",
            v->jobs.jobs_cancelled);
    counter(b, "squad_jobs_failed_total", "Requests the engine failed on (500).", v->jobs.jobs_failed);
    counter(b, "squad_request_memo_hits_total", "Requests answered by the request memo (exact repeats).",
            LOAD(m->memo_hits));
    counter(b, "squad_request_memo_misses_total", "Requests the request memo did not hold.", LOAD(m->memo_misses));
    gauge(b, "squad_request_memo_bytes", "Bytes the request memo holds.", (double)v->memo.bytes_held);
    gauge(b, "squad_request_memo_budget_bytes", "The request memo's budget (--memo-mb).", (double)v->memo.budget_bytes);
    gauge(b, "squad_request_memo_entries", "Responses the request memo holds.", (double)v->memo.entries);
    counter(b, "squad_request_memo_evictions_total", "Request memo entries dropped for room.", v->memo.evicted);
    counter(b, "squad_engine_memo_hits_total", "Rows the engine's row memo answered.", c->memo_hits);
    squad_buf_puts(b, "# HELP squad_cache_rows_total Rows by how the state cache served them.\n"
                      "# TYPE squad_cache_rows_total counter\n");
    squad_buf_printf(b, "squad_cache_rows_total{kind=\"hit\"} %" PRIu64 "\n", c->hits);
    squad_buf_printf(b, "squad_cache_rows_total{kind=\"partial\"} %" PRIu64 "\n", c->partial);
    squad_buf_printf(b, "squad_cache_rows_total{kind=\"cold\"} %" PRIu64 "\n", c->cold);
    squad_buf_printf(b, "squad_cache_rows_total{kind=\"plain\"} %" PRIu64 "\n", c->plain);
    counter(b, "squad_cache_tokens_reused_total", "Tokens restored from the state cache.", c->tokens_reused);
    counter(b, "squad_cache_tokens_computed_total", "Tokens run through the model.", c->tokens_computed);
    counter(b, "squad_router_mispredictions_total",
            "Rows whose guessed route the router overturned (run again on the right route).", c->mispredictions);
    if (v->sp && v->jobs.n_routes > 0) {
        squad_buf_puts(b, "# HELP squad_route_rows_total Rows the engine answered, by specialist route.\n"
                          "# TYPE squad_route_rows_total counter\n");
        for (int i = 0; i < v->jobs.n_routes; i++) {
            squad_buf_puts(b, "squad_route_rows_total{route=\"");
            label_value(b, squad_specialists_label(v->sp, i));
            squad_buf_printf(b, "\"} %" PRIu64 "\n", v->jobs.route_rows[i]);
        }
    }
    counter(b, "squad_cache_uncacheable_total", "Rows whose state did not fit the cache budget.", c->uncacheable);
    counter(b, "squad_cache_checkpoints_made_total", "Checkpoints saved.", c->checkpoints_made);
    counter(b, "squad_cache_evictions_total", "Checkpoints evicted for room.", c->evicted);
    gauge(b, "squad_cache_checkpoints", "Checkpoints held.", (double)c->checkpoints);
    gauge(b, "squad_cache_bytes", "Bytes the state cache holds.", (double)c->bytes_held);
    gauge(b, "squad_cache_budget_bytes", "The state cache's budget.", (double)c->budget_bytes);
    gauge(b, "squad_cache_usage_ratio", "The state cache's bytes held as a fraction of its budget (0..1).",
          c->budget_bytes ? (double)c->bytes_held / (double)c->budget_bytes : 0.0);
    tier_metrics(b, c);
    images_prometheus(b, c);
    counter(b, "squad_token_cache_hits_total", "Texts whose token ids the token cache held.", v->tokens.hits);
    counter(b, "squad_token_cache_misses_total", "Texts the token cache did not hold.", v->tokens.misses);
    gauge(b, "squad_token_cache_bytes", "Bytes the token cache holds.", (double)v->tokens.bytes_held);
    gauge(b, "squad_token_cache_entries", "Texts the token cache holds.", (double)v->tokens.entries);
    counter(b, "squad_token_cache_evictions_total", "Token cache entries dropped for room.", v->tokens.evicted);
}

void srv_metrics_json(squad_buf *b, const srv_metrics_view *v) {
    const srv_metrics *m = v->m;
    const squad_cache_stats *c = &v->jobs.cache;
    squad_buf_puts(b, "{\"requests\": {");
    int first_ep = 1;
    for (int e = 0; e < SRV_EP_COUNT; e++) {
        int first = 1;
        uint64_t lat_n = 0;
        for (int k = 0; k <= SRV_LAT_BUCKETS; k++) lat_n += LOAD(m->lat_bucket[e][k]);
        if (!lat_n) continue;
        squad_buf_printf(b, "%s\"%s\": {\"by_status\": {", first_ep ? "" : ", ", SRV_EP_PATH[e]);
        first_ep = 0;
        for (int s = 0; s < SRV_STATUS_SLOTS; s++) {
            uint64_t n = LOAD(m->requests[e][s]);
            if (!n) continue;
            squad_buf_printf(b, "%s\"%d\": %" PRIu64, first ? "" : ", ", s + SRV_STATUS_MIN, n);
            first = 0;
        }
        squad_buf_printf(b, "}, \"count\": %" PRIu64 ", \"seconds_sum\": %.9f}", lat_n,
                         (double)LOAD(m->lat_sum_ns[e]) * 1e-9);
    }
    squad_buf_printf(b,
                     "}, \"ready\": %s, \"device\": \"%s\", \"uptime_s\": %.3f, \"in_flight\": %" PRIu64
                     ", \"queue\": {\"depth\": %d, \"capacity\": %d}, \"rows_running\": %d, \"rows_submitted\": %" PRIu64
                     ", \"jobs\": {\"done\": %" PRIu64 ", \"timeout\": %" PRIu64 ", \"cancelled\": %" PRIu64
                     ", \"failed\": %" PRIu64 "}",
                     v->jobs.ready ? "true" : "false", v->jobs.device, v->uptime_s, LOAD(m->in_flight),
                     v->jobs.queue_depth, v->jobs.queue_capacity, v->jobs.rows_running, LOAD(m->rows_submitted),
                     v->jobs.jobs_done, v->jobs.jobs_timeout, v->jobs.jobs_cancelled, v->jobs.jobs_failed);
    squad_buf_printf(b,
                     ", \"batching\": {\"max_rows\": %d, \"batch_tokens\": %d, \"lookahead\": %d, \"rows_in_flight\": %d"
                     ", \"steps\": %" PRIu64 ", \"rows_per_step\": ",
                     v->jobs.max_rows, v->jobs.batch_tokens, v->jobs.lookahead, v->jobs.rows_in_flight, v->jobs.steps);
    histogram_json(b, SRV_STEP_ROWS_BOUNDS, v->jobs.step_rows_bucket, (double)v->jobs.step_rows_sum);
    squad_buf_puts(b, ", \"tokens_per_step\": ");
    histogram_json(b, SRV_STEP_TOKENS_BOUNDS, v->jobs.step_tokens_bucket, (double)v->jobs.step_tokens_sum);
    squad_buf_puts(b, ", \"seconds_per_step\": ");
    histogram_json(b, SRV_STEP_SECONDS_BOUNDS, v->jobs.step_seconds_bucket, v->jobs.step_seconds_sum);
    squad_buf_printf(b, ", \"graphs\": %d, \"graph_capture_s\": %.3f}", v->jobs.device_stats.graphs,
                     v->jobs.device_stats.capture_s);
    squad_buf_printf(b,
                     ", \"request_memo\": {\"hits\": %" PRIu64 ", \"misses\": %" PRIu64 ", \"entries\": %zu, \"bytes\": %zu"
                     ", \"budget_bytes\": %zu, \"evicted\": %" PRIu64 "}",
                     LOAD(m->memo_hits), LOAD(m->memo_misses), v->memo.entries, v->memo.bytes_held, v->memo.budget_bytes,
                     v->memo.evicted);
    squad_buf_printf(b,
                     ", \"cache\": {\"rows\": %" PRIu64 ", \"hits\": %" PRIu64 ", \"partial\": %" PRIu64 ", \"cold\": %" PRIu64
                     ", \"plain\": %" PRIu64 ", \"memo_hits\": %" PRIu64 ", \"tokens_memo\": %" PRIu64
                     ", \"tokens_reused\": %" PRIu64 ", \"tokens_computed\": %" PRIu64 ", \"uncacheable\": %" PRIu64
                     ", \"checkpoints_made\": %" PRIu64 ", \"evicted\": %" PRIu64 ", \"checkpoints\": %" PRIu64
                     ", \"groups\": %" PRIu64 ", \"bytes_held\": %zu, \"budget_bytes\": %zu"
                     ", \"host_checkpoints\": %" PRIu64 ", \"host_bytes_held\": %zu, \"host_budget_bytes\": %zu"
                     ", \"demotions\": %" PRIu64 ", \"promotions\": %" PRIu64 ", \"host_recomputed\": %" PRIu64
                     ", \"host_evicted\": %" PRIu64 ", \"host_slabs_reserved\": %" PRIu64 ", \"host_slabs_sync\": %" PRIu64
                     ", \"host_reserve_seconds\": %.6f, \"promote_seconds\": %.6f, \"demote_seconds\": %.6f"
                     ", \"disk_saved\": %" PRIu64 ", \"disk_loaded\": %" PRIu64 ", \"disk_refused\": %" PRIu64 "}",
                     c->rows, c->hits, c->partial, c->cold, c->plain, c->memo_hits, c->tokens_memo, c->tokens_reused,
                     c->tokens_computed, c->uncacheable, c->checkpoints_made, c->evicted, c->checkpoints, c->groups,
                     c->bytes_held, c->budget_bytes, c->host_checkpoints, c->host_bytes_held, c->host_budget_bytes,
                     c->demotions, c->promotions, c->host_recomputed, c->host_evicted, c->host_slabs_reserved,
                     c->host_slabs_sync, c->host_reserve_seconds, c->promote_seconds,
                     c->demote_seconds, c->disk_saved, c->disk_loaded, c->disk_refused);
    squad_buf_printf(b, ", \"router\": {\"mispredictions\": %" PRIu64 ", \"routes\": {", c->mispredictions);
    for (int i = 0; v->sp && i < v->jobs.n_routes; i++) {
        if (i) squad_buf_puts(b, ", ");
        squad_buf_json_string(b, squad_specialists_label(v->sp, i));
        squad_buf_printf(b, ": %" PRIu64, v->jobs.route_rows[i]);
    }
    squad_buf_puts(b, "}}");
    images_json(b, c);
    squad_buf_printf(b,
                     ", \"token_cache\": {\"hits\": %" PRIu64 ", \"misses\": %" PRIu64 ", \"entries\": %zu, \"bytes\": %zu"
                     ", \"budget_bytes\": %zu, \"evicted\": %" PRIu64 "}}",
                     v->tokens.hits, v->tokens.misses, v->tokens.entries, v->tokens.bytes_held, v->tokens.budget_bytes,
                     v->tokens.evicted);
}
