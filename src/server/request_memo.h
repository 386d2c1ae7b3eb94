/*
 * request_memo.h — the server's request memo (docs/server.md) and the one rendering every answer of
 * an engine endpoint goes through: an exact body sent again to the same endpoint is answered from
 * memory, without parsing, the queue or the engine.
 *
 * The memo is a locked LRU map (lru_map.h) keyed by the endpoint and the body. An answer is
 * rendered once, with a placeholder (a JSON string "<nonce>-<kind>.<row>", the nonce random per
 * start so request text cannot fake one) for each field the client's answer and the memo's copy
 * differ in: the per-call fields (the elapsed ms, a System One id, the time) and the figures of
 * this call (tokens restored, computed, written; "memo": false). srv_memo_answer fills that one
 * text twice: every placeholder with this call's values for the client, and the figures with the
 * memo's (every token cached, none computed or written, "memo": true) for the memo, whose per-call
 * fields stay holes: [u32 n_holes][n_holes x (u32 offset, u32 kind)][text]. A hit copies the text,
 * filling each hole (a new id, the time, the elapsed ms), so it costs a hash, a compare and a copy.
 */
#ifndef SQUAD_SERVER_REQUEST_MEMO_H
#define SQUAD_SERVER_REQUEST_MEMO_H

#include "server/request.h"

/* The fields a placeholder stands for. */
enum {
    SRV_HOLE_MS = 1,       /* per call: the elapsed ms */
    SRV_HOLE_ID = 2,       /* per call: System One's id (a JSON string) */
    SRV_HOLE_CREATED = 3,  /* per call: the time (Unix seconds) */
    SRV_HOLE_MEMO = 4,     /* "memo": false for the client, true in the memo */
    SRV_HOLE_REUSED = 5,   /* tokens restored (row -1: all rows); in the memo every token of the rows */
    SRV_HOLE_COMPUTED = 6, /* tokens computed; in the memo 0 */
    SRV_HOLE_WRITTEN = 7   /* state positions newly written; in the memo 0 */
};

/* Room for a placeholder's text, its quotes included. */
#define SRV_HOLE_TEXT 64

/* 1 when the memo answered r (r->memo_hit set), 0 on a miss. */
int srv_memo_lookup(srv_req *r);
/* The placeholder of a field, with its quotes (row: the engine row it is about, -1 for all). */
void srv_memo_placeholder(char *out, size_t cap, const squad_server *srv, int kind, int row);
/* The same appended to b. */
void srv_memo_hole(squad_buf *b, const squad_server *srv, int kind, int row);
/* The same as a JSON string value (without the quotes, which the JSON writer adds), for a tree. */
json_t *srv_memo_hole_json(const squad_server *srv, int kind, int row);
/* Answers r (200) with the rendered text (its placeholders filled with this call's values) and, when
 * the memo is on and r may be stored, stores the memo's copy. An out-of-memory render (b->oom)
 * answers 500. */
void srv_memo_answer(srv_req *r, squad_buf *rendered);

#endif /* SQUAD_SERVER_REQUEST_MEMO_H */
