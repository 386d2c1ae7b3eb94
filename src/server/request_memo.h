/*
 * request_memo.h — the server's request memo (docs/server.md): an exact body sent again to the
 * same endpoint is answered from memory, without parsing, the queue or the engine.
 *
 * It is a locked LRU map (lru_map.h) keyed by the endpoint and the body. What it stores is the
 * answer as the memo will say it (usage all cached, "memo": true) with the per-call fields cut out
 * as holes: [u32 n_holes][n_holes x (u32 offset, u32 kind)][text]. A renderer writes each per-call
 * field as a placeholder (srv_memo_hole: a JSON string "<nonce>-<kind>", the nonce random per
 * start so request text cannot fake one); storing cuts the placeholders out. A hit copies the
 * text, filling each hole (a new id, the time, the elapsed ms), so it costs a hash, a compare and a
 * copy.
 */
#ifndef SQUAD_SERVER_REQUEST_MEMO_H
#define SQUAD_SERVER_REQUEST_MEMO_H

#include "server/request.h"

/* The per-call fields a memo answer fills anew. */
enum { SRV_HOLE_MS = 1, SRV_HOLE_ID = 2, SRV_HOLE_CREATED = 3 };

/* 1 when the memo answered r (r->memo_hit set), 0 on a miss. */
int srv_memo_lookup(srv_req *r);
/* Stores text (with its placeholders) as r's memo answer, when the memo is on and r may be stored. */
void srv_memo_store(srv_req *r, const char *text, size_t len);
/* Appends the placeholder of a hole of this kind. */
void srv_memo_hole(squad_buf *b, const squad_server *srv, int kind);
/* The placeholder's string (without quotes) into out: for a JSON tree's string value. */
void srv_memo_placeholder(char *out, size_t cap, const squad_server *srv, int kind);

#endif /* SQUAD_SERVER_REQUEST_MEMO_H */
