/*
 * http.c — the server's HTTP transport on libmicrohttpd: a daemon with its own pool of connection
 * threads (epoll), each request driven through its life (router.h) and its answer sent here. Only
 * the lifecycle (lifecycle.c) calls into this file; the router never does (a job's end reaches
 * the connection through the wake this file puts in the request).
 *
 * A request that needs the engine suspends its connection (MHD_suspend_connection) before its job
 * is submitted, so no pool thread ever waits on the engine; the job's completion resumes it from the
 * scheduler thread and MHD calls the handler again, which renders and queues the answer. Suspending
 * first means a job that ends at once cannot resume a connection that is not yet suspended. While
 * suspended, MHD does not watch the socket: the scheduler's cancel check peeks at it instead
 * (router.c client_gone). The request object lives from the handler's first call to MHD's
 * completion notice, which ends it (metrics, log, free).
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/http.h"
#include "server/router.h"

/* Seconds an idle keep-alive connection is kept. */
#define SRV_IDLE_TIMEOUT_S 120
/* Memory MHD gives each connection for its headers and buffers. */
#define SRV_CONN_MEMORY (64u << 10)

/* Marks the request done, then resumes its connection. The connection is suspended until the resume,
   so no pool thread can see the mark and end the request before it; the connection is read first
   because once resumed the request may be freed at any moment. */
static void wake_resume(srv_job *job) {
    srv_req *r = job->owner;
    struct MHD_Connection *c = r->conn;
    atomic_store_explicit(&r->job_done, 1, memory_order_release);
    MHD_resume_connection(c);
}

/* host:port of the replica as the client reached it (the connection's local address: right behind a
 * balancer and when listening on a wildcard address), for X-Squad-Replica; the listening address
 * when the socket cannot say. */
static void replica_name(const srv_req *r, char *out, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "";
    int port = r->srv->port;
    if (r->client_fd >= 0 && getsockname(r->client_fd, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
            if (inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host)) port = ntohs(a->sin6_port);
        } else if (ss.ss_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
            if (inet_ntop(AF_INET, &a->sin_addr, host, sizeof host)) port = ntohs(a->sin_port);
        }
    }
    if (!host[0]) snprintf(host, sizeof host, "%s", r->srv->listen_host ? r->srv->listen_host : "127.0.0.1");
    const int v6 = strchr(host, ':') != NULL; /* an IPv6 address goes in brackets before its port */
    snprintf(out, cap, "%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", port);
}

static enum MHD_Result send_answer(struct MHD_Connection *c, srv_req *r) {
    if (r->sent) return MHD_YES; /* queued already (an early answer while the body still arrives) */
    r->sent = 1;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(r->resp_len, r->resp ? r->resp : (void *)"", r->resp ? MHD_RESPMEM_MUST_FREE
                                                                                               : MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    r->resp = NULL; /* MHD frees it */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->ctype ? r->ctype : "application/json");
    if (r->retry_after) {
        char s[16];
        snprintf(s, sizeof s, "%d", r->retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, s);
    }
    if (r->allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
    char replica[INET6_ADDRSTRLEN + 16];
    replica_name(r, replica, sizeof replica);
    MHD_add_response_header(resp, SRV_HEADER_REPLICA, replica);
    if (atomic_load(&r->srv->stopping)) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    squad_server *srv = cls;
    srv_req *r = *con_cls;
    if (!r) {
        r = srv_req_new(srv);
        if (!r) return MHD_NO;
        *con_cls = r;
        r->conn = c;
        r->wake = wake_resume;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        r->client_fd = ci ? ci->connect_fd : -1;
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        srv_req_set_session_header(r, MHD_lookup_connection_value(c, MHD_HEADER_KIND, SRV_HEADER_SESSION));
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        long long len = cl ? strtoll(cl, NULL, 10) : -1;
        if (srv_req_route(r, method, url, auth, len)) return send_answer(c, r);
        return MHD_YES;
    }
    if (*upload_size) {
        srv_req_body(r, upload_data, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->state == SRV_REQ_PENDING) {
        if (!atomic_load_explicit(&r->job_done, memory_order_acquire)) return MHD_YES; /* not ours yet */
        srv_req_finish(r);
        return send_answer(c, r);
    }
    if (r->state == SRV_REQ_ANSWERED) return send_answer(c, r);
    if (srv_req_prepare(r)) return send_answer(c, r);
    MHD_suspend_connection(c);
    if (srv_req_submit(r)) MHD_resume_connection(c); /* answered at once (503): send it next call */
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv_req *r = *con_cls;
    if (r) srv_req_end(r, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = 0;
    srv_log(cls, "http: %s", line);
}

int srv_http_start(squad_server *srv, squad_err *err) {
    const char *host = srv->listen_host ? srv->listen_host : "127.0.0.1";
    struct sockaddr_storage ss;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    /* An address, or a name such as localhost: its first address. */
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0 || !ai || ai->ai_addrlen > sizeof ss) {
        if (ai) freeaddrinfo(ai);
        return squad_fail(err, SQUAD_E_INVALID, "--host %s is not an address this machine can listen on", host);
    }
    memset(&ss, 0, sizeof ss);
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    if (ss.ss_family == AF_INET6) {
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)srv->opts.port);
        flags |= MHD_USE_IPv6;
    } else {
        ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)srv->opts.port);
    }
    struct sockaddr *addr = (struct sockaddr *)&ss;
    unsigned threads = srv->opts.http_threads > 0 ? (unsigned)srv->opts.http_threads : 0;
    if (!threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (unsigned)n : 1;
    }
    srv->daemon = MHD_start_daemon(flags, (uint16_t)srv->opts.port, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER,
                                   on_mhd_log, srv, MHD_OPTION_SOCK_ADDR,
                                   addr, MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_NOTIFY_COMPLETED,
                                   on_completed, srv, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)SRV_IDLE_TIMEOUT_S,
                                   MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)SRV_CONN_MEMORY,
                                   MHD_OPTION_END);
    if (!srv->daemon) return squad_fail(err, SQUAD_E_IO, "cannot listen on %s:%d (in use, or not allowed)", host, srv->opts.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : srv->opts.port;
    return 0;
}

void srv_http_quiesce(squad_server *srv) {
    MHD_socket s = MHD_quiesce_daemon(srv->daemon);
    if (s != MHD_INVALID_SOCKET) close(s);
}

void srv_http_stop(squad_server *srv) {
    MHD_stop_daemon(srv->daemon);
    srv->daemon = NULL;
}
