/*
 * conn_guard.c — the connection deadlines and the room near the connection limit (conn_guard.h).
 *
 * The open connections are a doubly linked list under one lock; a thread wakes every
 * GUARD_TICK_S, walks it, and shuts down the sockets of connections past a deadline:
 *   - WAITING, never served: the first request's headers did not arrive within header_s of the
 *     connection's opening (a slow-headers client, or a connection opened and left);
 *   - WAITING, served before: the next request's headers did not arrive within keepalive_s +
 *     header_s of the last answer (an idle keep-alive client, or one trickling a request);
 *   - RECEIVING: the body did not arrive within body_s of the headers.
 * A WORKING connection is never touched: its request is the engine's or being answered, and the
 * request's own --timeout governs it.
 * When more than GUARD_HIGH of max_conns are open, the WAITING connections are closed, those that
 * were served before first (idle keep-alive), then the oldest, until GUARD_LOW of max_conns remain:
 * a client that is sending a request, or waiting for its answer, keeps its connection.
 */
#define _POSIX_C_SOURCE 200809L
#include "server/conn_guard.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

/* How often the guard looks (seconds): a deadline is kept to within this. */
#define GUARD_TICK_S 0.2
/* Open connections, as fractions of the limit, above which idle ones are closed, and down to which. */
#define GUARD_HIGH 0.90
#define GUARD_LOW 0.80

struct srv_conn {
    srv_conn *prev, *next;
    int fd;
    srv_conn_phase phase;
    double since; /* when the phase began */
    int served;   /* requests answered on it */
    int shut;     /* its socket was shut down (libmicrohttpd closes it soon) */
};

struct srv_conns {
    srv_conn_limits lim;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    int stop;
    srv_conn *head;
    int n_open;
    uint64_t closed_late, closed_for_room;
};

/* Shuts c's socket down (the lock is held): libmicrohttpd reads its end and closes it. */
static void shut(srv_conn *c) {
    if (c->shut) return;
    c->shut = 1;
    shutdown(c->fd, SHUT_RDWR);
}

static int past_deadline(const srv_conns *g, const srv_conn *c, double now) {
    const double age = now - c->since;
    switch (c->phase) {
    case SRV_CONN_WAITING: return age > (c->served ? g->lim.keepalive_s + g->lim.header_s : g->lim.header_s);
    case SRV_CONN_RECEIVING: return age > g->lim.body_s;
    default: return 0;
    }
}

/* Idle connections to close for room first: served before (keep-alive), then the longest waiting. */
static int room_order(const void *a, const void *b) {
    const srv_conn *x = *(srv_conn *const *)a, *y = *(srv_conn *const *)b;
    if (!!x->served != !!y->served) return y->served ? 1 : -1;
    return x->since < y->since ? -1 : x->since > y->since;
}

static void make_room(srv_conns *g) {
    const int high = (int)(g->lim.max_conns * GUARD_HIGH), low = (int)(g->lim.max_conns * GUARD_LOW);
    int live = 0;
    for (srv_conn *c = g->head; c; c = c->next) live += !c->shut;
    if (g->lim.max_conns <= 0 || live <= high) return;
    srv_conn **idle = malloc((size_t)live * sizeof *idle);
    if (!idle) return;
    int n = 0;
    for (srv_conn *c = g->head; c; c = c->next)
        if (!c->shut && c->phase == SRV_CONN_WAITING) idle[n++] = c;
    qsort(idle, (size_t)n, sizeof *idle, room_order);
    for (int i = 0; i < n && live > low; i++, live--) {
        shut(idle[i]);
        g->closed_for_room++;
    }
    free(idle);
}

static void *guard_main(void *arg) {
    srv_conns *g = arg;
    pthread_mutex_lock(&g->lock);
    while (!g->stop) {
        const double now = squad_now_seconds();
        for (srv_conn *c = g->head; c; c = c->next)
            if (!c->shut && past_deadline(g, c, now)) {
                shut(c);
                g->closed_late++;
            }
        make_room(g);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(GUARD_TICK_S * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->wake, &g->lock, &ts);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

srv_conns *srv_conns_start(const srv_conn_limits *lim, squad_err *err) {
    srv_conns *g = squad_calloc(1, sizeof *g, err);
    if (!g) return NULL;
    g->lim = *lim;
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->wake, NULL);
    if (pthread_create(&g->thread, NULL, guard_main, g) != 0) {
        pthread_cond_destroy(&g->wake);
        pthread_mutex_destroy(&g->lock);
        free(g);
        squad_fail(err, SQUAD_E_IO, "cannot start the connection guard's thread");
        return NULL;
    }
    return g;
}

void srv_conns_stop(srv_conns *g) {
    if (!g) return;
    pthread_mutex_lock(&g->lock);
    g->stop = 1;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->lock);
    pthread_join(g->thread, NULL);
    /* the daemon is stopped first: every connection was closed and forgotten */
    while (g->head) {
        srv_conn *c = g->head;
        g->head = c->next;
        free(c);
    }
    pthread_cond_destroy(&g->wake);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

srv_conn *srv_conns_open(srv_conns *g, int fd) {
    srv_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->fd = fd;
    c->phase = SRV_CONN_WAITING;
    c->since = squad_now_seconds();
    pthread_mutex_lock(&g->lock);
    c->next = g->head;
    if (g->head) g->head->prev = c;
    g->head = c;
    g->n_open++;
    pthread_mutex_unlock(&g->lock);
    return c;
}

void srv_conns_phase(srv_conns *g, srv_conn *c, srv_conn_phase phase) {
    if (!c) return;
    pthread_mutex_lock(&g->lock);
    if (phase == SRV_CONN_WAITING && c->phase != SRV_CONN_WAITING) c->served++;
    if (phase != c->phase) c->since = squad_now_seconds();
    c->phase = phase;
    pthread_mutex_unlock(&g->lock);
}

void srv_conns_close(srv_conns *g, srv_conn *c) {
    if (!c) return;
    pthread_mutex_lock(&g->lock);
    if (c->prev) c->prev->next = c->next;
    else g->head = c->next;
    if (c->next) c->next->prev = c->prev;
    g->n_open--;
    pthread_mutex_unlock(&g->lock);
    free(c);
}

void srv_conns_counts(srv_conns *g, int *open, uint64_t *late, uint64_t *for_room) {
    pthread_mutex_lock(&g->lock);
    *open = g->n_open;
    *late = g->closed_late;
    *for_room = g->closed_for_room;
    pthread_mutex_unlock(&g->lock);
}
