/*
 * conn_guard.h — the deadlines libmicrohttpd does not keep (conn_guard.c): every open connection's
 * phase, and a thread that closes a connection whose request's headers or body arrive too slowly
 * however it trickles bytes, and the oldest idle connections when the connection limit nears.
 *
 * libmicrohttpd's own timeout (MHD_OPTION_CONNECTION_TIMEOUT) is an idleness timeout: any byte
 * resets it, so a client sending one byte a second holds its connection for ever. The transport
 * (http.c) reports each connection's open, phase changes and close here; this file only reads the
 * clock and, past a deadline, shuts the socket down (shutdown(2), under the lock that the close
 * notice also takes: libmicrohttpd notifies the close before it closes the descriptor, so the
 * descriptor shut down is always this connection's). libmicrohttpd then sees the end of the
 * socket and closes the connection itself, in its own thread.
 */
#ifndef SQUAD_SERVER_CONN_GUARD_H
#define SQUAD_SERVER_CONN_GUARD_H

#include "util.h"

typedef enum {
    SRV_CONN_WAITING,   /* no request yet, or between requests (keep-alive): headers may come */
    SRV_CONN_RECEIVING, /* headers in, the body arriving */
    SRV_CONN_WORKING,   /* the whole request in: parsing, the engine, the answer */
} srv_conn_phase;

typedef struct srv_conn_limits {
    int max_conns;        /* the daemon's connection limit (the guard closes idle ones near it) */
    double header_s;      /* a new connection's first request's headers arrive within this */
    double body_s;        /* a request's body arrives within this of its headers */
    double keepalive_s;   /* an idle keep-alive connection's next request's headers arrive within
                             this + header_s of its last answer */
} srv_conn_limits;

typedef struct srv_conns srv_conns;
typedef struct srv_conn srv_conn;

/* Starts the guard's thread. */
srv_conns *srv_conns_start(const srv_conn_limits *lim, squad_err *err);
void srv_conns_stop(srv_conns *g);

/* A connection opened on socket fd (NULL when out of memory: it is then not guarded). */
srv_conn *srv_conns_open(srv_conns *g, int fd);
/* Its phase changed (WAITING restarts the keep-alive clock). */
void srv_conns_phase(srv_conns *g, srv_conn *c, srv_conn_phase phase);
/* It closes: forgotten before its descriptor is closed. */
void srv_conns_close(srv_conns *g, srv_conn *c);

/* Counters for the log and the tests: connections open, closed for a deadline, closed for room. */
void srv_conns_counts(srv_conns *g, int *open, uint64_t *late, uint64_t *for_room);

#endif /* SQUAD_SERVER_CONN_GUARD_H */
