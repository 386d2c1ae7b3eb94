/*
 * request_memo.c — the request memo (request_memo.h): the lookup that fills a stored answer's holes,
 * and the store that cuts a rendered answer's placeholders into holes.
 */
#define _GNU_SOURCE /* memmem */
#include "server/request_memo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* The memo's text of an answer: placeholders "<nonce>-<kind>" (with their quotes) become holes. */
void srv_memo_store(srv_req *r, const char *text, size_t len) {
    squad_server *srv = r->srv;
    if (!srv->memo || !r->memo_ok) return;
    char pat[64];
    uint32_t holes[MEMO_MAX_HOLES][2];
    uint32_t nh = 0;
    squad_buf out = {0};
    size_t at = 0;
    int plen = snprintf(pat, sizeof pat, "\"%s-", srv->hole_nonce);
    while (at < len) {
        const char *p = memmem(text + at, len - at, pat, (size_t)plen);
        if (!p || nh == MEMO_MAX_HOLES) break;
        const char *kind = p + plen;
        const char *end = memchr(kind, '"', (size_t)(text + len - kind));
        if (!end) break;
        squad_buf_put(&out, text + at, (size_t)(p - (text + at)));
        holes[nh][0] = (uint32_t)out.n;
        holes[nh][1] = (uint32_t)atoi(kind);
        nh++;
        at = (size_t)(end + 1 - text);
    }
    squad_buf_put(&out, text + at, len - at);
    if (out.oom || out.n > UINT32_MAX) {
        squad_buf_free(&out);
        return;
    }
    squad_bytes key[2];
    memo_key(r, key);
    const squad_bytes val[3] = {{&nh, 4}, {holes, (size_t)nh * 8}, {out.s, out.n}};
    squad_lru_map_put(srv->memo, r->memo_hash, key, 2, val, 3, NULL); /* a cache may forget */
    squad_buf_free(&out);
}

/* A placeholder the memo turns into a hole (a JSON string: "<nonce>-<kind>"). */
void srv_memo_hole(squad_buf *b, const squad_server *srv, int kind) {
    squad_buf_printf(b, "\"%s-%d\"", srv->hole_nonce, kind);
}
