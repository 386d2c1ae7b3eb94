/*
 * http.h — the server's HTTP transport on libmicrohttpd (http.c): the daemon's start, quiescence
 * (stop accepting) and stop, which the lifecycle (lifecycle.c) calls.
 */
#ifndef SQUAD_SERVER_HTTP_H
#define SQUAD_SERVER_HTTP_H

#include "server/request.h"

/* Starts the daemon on opts.host:opts.port; srv->port gets the port it listens on. */
int srv_http_start(squad_server *srv, squad_err *err);
/* Stops accepting; connections already open go on. */
void srv_http_quiesce(squad_server *srv);
void srv_http_stop(squad_server *srv);

#endif /* SQUAD_SERVER_HTTP_H */
