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
 *
 * Hostile clients (docs/server.md, Limits): the connection limit is sized from the process's file
 * limit (its soft limit raised to the hard one first), one address may hold --max-conns-per-ip,
 * MHD's own timeout is the keep-alive idleness, and the connection guard (conn_guard.h) keeps the
 * deadlines for a request's headers and body that MHD cannot (its timeout restarts at every byte)
 * and closes idle connections when the limit nears. MHD is strict about the client (HTTP/1.1
 * without Host is refused); what it lets through, this file refuses before routing: a repeated
 * Content-Length that disagrees, and chunked request bodies (MHD would wait for a chunk of any
 * declared size; a body must declare its length, which the body budget then holds up front).
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/conn_guard.h"
#include "server/http.h"
#include "server/router.h"

/* Seconds an idle keep-alive connection is kept (MHD's timeout: no byte for this long). */
#define SRV_IDLE_TIMEOUT_S 30
/* Seconds a new connection's request headers have to arrive, however slowly bytes trickle in. */
#define SRV_HEADER_DEADLINE_S 10.0
/* Seconds a request's body has to arrive once its headers are in (8 MiB at 300 KB/s). */
#define SRV_BODY_DEADLINE_S 30.0
/* Memory MHD gives each connection for its headers and buffers. */
#define SRV_CONN_MEMORY (64u << 10)
/* File descriptors kept for everything but connections (the model's files, logs, the listener,
 * epoll, the threads' pipes). */
#define SRV_FD_RESERVE 256
/* The most connections whatever the file limit allows (each may take SRV_CONN_MEMORY). */
#define SRV_MAX_CONNECTIONS 16384

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
    if (r->close_after || atomic_load(&r->srv->stopping))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ok;
}

/* Counts the Content-Length headers and notes whether they disagree. */
typedef struct length_headers {
    const char *first;
    int n, differ;
} length_headers;

static enum MHD_Result count_lengths(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    length_headers *h = cls;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) return MHD_YES;
    if (h->n++ == 0) h->first = value;
    else if (strcmp(h->first ? h->first : "", value ? value : "")) h->differ = 1;
    return MHD_YES;
}

/* A request whose framing this server refuses: 1 after answering (the connection then closes, since
 * where its body ends is not known). */
static int refuse_framing(srv_req *r, struct MHD_Connection *c) {
    length_headers h = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_lengths, &h);
    const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (h.differ) {
        r->close_after = 1;
        srv_fail(r, 400, NULL, "the request has %d Content-Length headers that disagree", h.n);
        return 1;
    }
    if (te) {
        r->close_after = 1;
        srv_fail(r, 411, NULL, "a request body must come with a Content-Length (Transfer-Encoding is not taken)");
        return 1;
    }
    return 0;
}

static srv_conn *guard_entry(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
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
        r->guard = guard_entry(c);
        srv_conns_phase(srv->conns, r->guard, SRV_CONN_RECEIVING);
        if (refuse_framing(r, c)) return send_answer(c, r);
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
        if (r->state != SRV_REQ_NEW) return MHD_YES;
        if (atomic_load(&srv->stopping)) {
            /* the rest of the body is read and dropped, and the 503 goes once it is in (MHD queues
               no answer mid-body); the shutdown closes those that do not finish sending soon */
            r->close_after = 1;
            srv_fail(r, 503, NULL, "the server is shutting down");
        } else if (r->too_big) {
            /* past a limit mid-body (a body longer than it declared): MHD cannot answer before the
               body is in, so the connection closes */
            srv_req_prepare(r);
            return MHD_NO;
        }
        return MHD_YES;
    }
    if (r->state == SRV_REQ_NEW) srv_conns_phase(srv->conns, r->guard, SRV_CONN_WORKING);
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
    squad_server *srv = cls;
    srv_req *r = *con_cls;
    if (r) {
        srv_conns_phase(srv->conns, r->guard, SRV_CONN_WAITING);
        srv_req_end(r, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
    }
    *con_cls = NULL;
}

/* Each connection's open and close, for the guard: its entry is the connection's socket context. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    squad_server *srv = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? srv_conns_open(srv->conns, ci->connect_fd) : NULL;
    } else {
        srv_conns_close(srv->conns, *socket_context);
        *socket_context = NULL;
    }
}

/* Raises the soft file limit to the hard one and sizes the connection limit from it: each connection
 * is a descriptor, and a process out of descriptors can accept nobody. */
static int connection_limit(squad_server *srv) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1000;
    const rlim_t soft = rl.rlim_cur;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) rl.rlim_cur = soft;
    }
    rlim_t room = rl.rlim_cur > SRV_FD_RESERVE * 2 ? rl.rlim_cur - SRV_FD_RESERVE : rl.rlim_cur / 2;
    if (room > SRV_MAX_CONNECTIONS) room = SRV_MAX_CONNECTIONS;
    srv_log(srv, "connections: at most %u (open files: soft limit %llu, raised to %llu, hard %llu), %d per client "
            "address; request headers within %g s, bodies within %g s, idle keep-alive %d s", (unsigned)room,
            (unsigned long long)soft, (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
            srv->opts.max_conns_per_ip, SRV_HEADER_DEADLINE_S, SRV_BODY_DEADLINE_S, SRV_IDLE_TIMEOUT_S);
    return (int)room;
}

/* MHD's messages, at most SRV_MHD_LOG_PER_S a second: a flood of broken connections would otherwise
 * write a line each; the count left out is said with the next second's first line. */
#define SRV_MHD_LOG_PER_S 5
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    squad_server *srv = cls;
    const long now = (long)squad_now_seconds();
    long second = atomic_load(&srv->mhd_log_second);
    if (second != now && atomic_compare_exchange_strong(&srv->mhd_log_second, &second, now)) {
        const int left_out = atomic_exchange(&srv->mhd_log_lines, 0) - SRV_MHD_LOG_PER_S;
        if (left_out > 0) srv_log(srv, "http: %d more messages like these left out", left_out);
    }
    if (atomic_fetch_add(&srv->mhd_log_lines, 1) >= SRV_MHD_LOG_PER_S) return;
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
    srv->max_conns = connection_limit(srv);
    const srv_conn_limits lim = {srv->max_conns, SRV_HEADER_DEADLINE_S, SRV_BODY_DEADLINE_S, SRV_IDLE_TIMEOUT_S};
    if (!(srv->conns = srv_conns_start(&lim, err))) return err->code;
    srv->daemon = MHD_start_daemon(flags, (uint16_t)srv->opts.port, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER,
                                   on_mhd_log, srv, MHD_OPTION_SOCK_ADDR,
                                   addr, MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_NOTIFY_COMPLETED,
                                   on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
                                   MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)SRV_IDLE_TIMEOUT_S,
                                   MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)SRV_CONN_MEMORY,
                                   MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->max_conns,
                                   MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)srv->opts.max_conns_per_ip,
                                   MHD_OPTION_STRICT_FOR_CLIENT, 1, MHD_OPTION_END);
    if (!srv->daemon) {
        srv_conns_stop(srv->conns);
        srv->conns = NULL;
        return squad_fail(err, SQUAD_E_IO, "cannot listen on %s:%d (in use, or not allowed)", host, srv->opts.port);
    }
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
    srv_conns_stop(srv->conns); /* after the daemon: it has closed every connection */
    srv->conns = NULL;
}
