/*
 * request_memo.c — the request memo (request_memo.h): the lookup that fills a stored answer's holes,
 * and the answer that fills a rendered text's placeholders for the client and for the memo.
 */
#define _GNU_SOURCE /* memmem */
#include "server/request_memo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>

#include "hash_index.h"

#define MEMO_MAX_HOLES 8

typedef struct memo_fill {
    srv_req *r;
    char *out;
    size_t len;
} memo_fill;

static size_t hole_text(srv_req *r, int kind, char *buf, size_t cap) {
    switch (kind) {
    case SRV_HOLE_MS: return (size_t)snprintf(buf, cap, "%.1f", 1000.0 * (squad_now_seconds() - r->t0));
    case SRV_HOLE_CREATED: return (size_t)snprintf(buf, cap, "%ld", (long)time(NULL));
    default:
        return (size_t)snprintf(buf, cap, "\"decision-%s%012llx\"", r->srv->hole_nonce + 16,
                                (unsigned long long)atomic_fetch_add(&r->srv->next_id, 1));
    }
}

/* The map's use of a hit: the stored text with its holes filled. */
static int memo_copy(void *ctx, const void *val, size_t vlen) {
    memo_fill *f = ctx;
    const unsigned char *v = val;
    uint32_t nh;
    memcpy(&nh, v, 4);
    size_t head = 4 + (size_t)nh * 8;
    if (nh > MEMO_MAX_HOLES || head > vlen) return -2;
    const char *text = (const char *)v + head;
    size_t tlen = vlen - head;
    char *out = malloc(tlen + (size_t)nh * 64 + 1);
    if (!out) return -2;
    size_t o = 0, at = 0;
    for (uint32_t i = 0; i < nh; i++) {
        uint32_t off, kind;
        memcpy(&off, v + 4 + i * 8, 4);
        memcpy(&kind, v + 8 + i * 8, 4);
        memcpy(out + o, text + at, off - at);
        o += off - at;
        at = off;
        o += hole_text(f->r, (int)kind, out + o, 64);
    }
    memcpy(out + o, text + at, tlen - at);
    o += tlen - at;
    out[o] = 0;
    f->out = out;
    f->len = o;
    return 1;
}

/* The memo's key: the endpoint, then the body. */
static void memo_key(srv_req *r, squad_bytes key[2]) {
    r->memo_tag = (uint32_t)r->ep;
    key[0] = (squad_bytes){&r->memo_tag, sizeof r->memo_tag};
    key[1] = (squad_bytes){srv_req_body_text(r), r->body.n};
}

/* 1 when the memo answered r. */
int srv_memo_lookup(srv_req *r) {
    squad_server *srv = r->srv;
    if (!srv->memo) return 0;
    squad_bytes key[2];
    memo_key(r, key);
    r->memo_hash = squad_hash_bytes((uint32_t)r->ep, key[1].p, key[1].n);
    memo_fill f = {r, NULL, 0};
    int rc = squad_lru_map_get(srv->memo, r->memo_hash, key, 2, memo_copy, &f);
    if (rc != 1) {
        atomic_fetch_add_explicit(&srv->metrics.memo_misses, 1, memory_order_relaxed);
        return 0;
    }
    atomic_fetch_add_explicit(&srv->metrics.memo_hits, 1, memory_order_relaxed);
    r->memo_hit = 1;
    srv_answer(r, 200, f.out, f.len, SRV_CT_JSON);
    return 1;
}

void srv_memo_placeholder(char *out, size_t cap, const squad_server *srv, int kind, int row) {
    snprintf(out, cap, "\"%s-%d.%d\"", srv->hole_nonce, kind, row);
}

void srv_memo_hole(squad_buf *b, const squad_server *srv, int kind, int row) {
    char ph[SRV_HOLE_TEXT];
    srv_memo_placeholder(ph, sizeof ph, srv, kind, row);
    squad_buf_puts(b, ph);
}

json_t *srv_memo_hole_json(const squad_server *srv, int kind, int row) {
    char ph[SRV_HOLE_TEXT];
    srv_memo_placeholder(ph, sizeof ph, srv, kind, row);
    return json_stringn(ph + 1, strlen(ph) - 2);
}

static int per_call(int kind) { return kind == SRV_HOLE_MS || kind == SRV_HOLE_ID || kind == SRV_HOLE_CREATED; }

/* A figure of the rows [from, to): this call's (the results) or the memo's. */
static long figure(const srv_req *r, int kind, int row, int memo) {
    const int from = row < 0 ? 0 : row, to = row < 0 ? r->job.n_rows : row + 1;
    long v = 0;
    for (int i = from; i < to && i < r->job.n_rows; i++) {
        const squad_result *res = &r->results[i];
        if (kind == SRV_HOLE_REUSED) v += memo ? r->row_ptrs[i]->n_ids : res->reused;
        else if (kind == SRV_HOLE_COMPUTED) v += memo ? 0 : res->computed;
        else v += memo ? 0 : res->cache_written;
    }
    return v;
}

/* A figure hole's text: this call's value, or the memo's. */
static void put_figure(squad_buf *b, const srv_req *r, int kind, int row, int memo) {
    if (kind == SRV_HOLE_MEMO) squad_buf_puts(b, memo ? "true" : "false");
    else squad_buf_printf(b, "%ld", figure(r, kind, row, memo));
}

/* A per-call hole's text for the client's answer. */
static void put_per_call(squad_buf *b, const srv_req *r, int kind) {
    if (kind == SRV_HOLE_MS) {
        squad_buf_printf(b, "%.1f", 1000.0 * (squad_now_seconds() - r->t0));
    } else if (kind == SRV_HOLE_CREATED) {
        squad_buf_printf(b, "%ld", (long)time(NULL));
    } else {
        char id[64];
        squad_dapi_new_id(id, sizeof id);
        squad_buf_printf(b, "\"%s\"", id);
    }
}

/* A placeholder at p (after its opening quote and the nonce's "<nonce>-"): its kind and row, and
 * the byte after its closing quote; NULL when p does not hold one. */
static const char *parse_hole(const char *p, const char *end, int *kind, int *row) {
    char *e = NULL;
    long k = strtol(p, &e, 10);
    if (e == p || e >= end || *e != '.') return NULL;
    const char *q = e + 1;
    long w = strtol(q, &e, 10);
    if (e == q || e >= end || *e != '"' || k < SRV_HOLE_MS || k > SRV_HOLE_WRITTEN || w < -1 || w > INT32_MAX) return NULL;
    *kind = (int)k;
    *row = (int)w;
    return e + 1;
}

void srv_memo_answer(srv_req *r, squad_buf *rendered) {
    squad_server *srv = r->srv;
    if (rendered->oom) {
        squad_buf_free(rendered);
        srv_fail(r, 500, NULL, "out of memory rendering the answer");
        return;
    }
    const char *text = rendered->s ? rendered->s : "";
    const size_t len = rendered->n;
    int keep = srv->memo && r->memo_ok; /* the memo's copy is wanted */
    squad_buf live = {0}, memo = {0};
    uint32_t holes[MEMO_MAX_HOLES][2];
    uint32_t nh = 0;
    char pat[SRV_HOLE_TEXT];
    const int plen = snprintf(pat, sizeof pat, "\"%s-", srv->hole_nonce);
    size_t at = 0;
    for (;;) {
        const char *p = memmem(text + at, len - at, pat, (size_t)plen);
        if (!p) break;
        int kind, row;
        const char *after = parse_hole(p + plen, text + len, &kind, &row);
        const size_t upto = (size_t)(p - text) + (after ? 0 : 1);
        squad_buf_put(&live, text + at, upto - at);
        if (keep) squad_buf_put(&memo, text + at, upto - at);
        at = upto;
        if (!after) continue; /* not a placeholder after all: its first byte is copied, look on */
        if (per_call(kind)) {
            put_per_call(&live, r, kind);
            if (keep && nh < MEMO_MAX_HOLES) {
                holes[nh][0] = (uint32_t)memo.n;
                holes[nh][1] = (uint32_t)kind;
                nh++;
            } else {
                keep = 0;
            }
        } else {
            put_figure(&live, r, kind, row, 0);
            if (keep) put_figure(&memo, r, kind, row, 1);
        }
        at = (size_t)(after - text);
    }
    squad_buf_put(&live, text + at, len - at);
    if (keep) squad_buf_put(&memo, text + at, len - at);
    squad_buf_free(rendered);
    if (keep && !memo.oom && memo.n <= UINT32_MAX) {
        squad_bytes key[2];
        memo_key(r, key);
        const squad_bytes val[3] = {{&nh, 4}, {holes, (size_t)nh * 8}, {memo.s, memo.n}};
        squad_lru_map_put(srv->memo, r->memo_hash, key, 2, val, 3, NULL); /* a cache may forget */
    }
    squad_buf_free(&memo);
    srv_answer_buf(r, 200, &live, SRV_CT_JSON);
}
