/*
 * bench_server.c — a load generator for `squad serve`: sends a workload of HTTP/1.1 requests over
 * keep-alive connections at a fixed concurrency and reports requests/s, latency percentiles, the
 * server's request-memo and state-cache hit rates over the run (GET /v1/stats before and after:
 * requests the memo answered, engine rows that restored a cached state fully or partly, tokens
 * restored out of all the rows' tokens) and
 * the server's peak resident memory (VmHWM in /proc/PID/status). Questions/s counts each trace
 * row's answer slots (a row asks one question a slot); with --bodies a request counts as one.
 *
 *   bench_server --port P [--host 127.0.0.1] [--pid PID] (--trace FILE | --bodies FILE)
 *                [--path /v1/score] [--concurrency 1,8,32,128] [--requests N] [--memo]
 *                [--threads T] [--api-key KEY] [--label TEXT]
 *
 * Workloads:
 *   --trace FILE   rows as JSON lines (bench/agent_trace.py's output: the agent workload of the
 *                  state-cache issue); each line is sent as POST /v1/score {"rows": [LINE]}, in the
 *                  trace's order (the next request goes to whichever connection is free first).
 *   --bodies FILE  request bodies, one a line, sent as they are to --path.
 *   --memo         the first body only, repeated: after one warm-up request every request is an
 *                  exact repeat, so the server's request memo answers all of them (its throughput
 *                  is the server's own overhead: HTTP, the memo lookup, the response).
 * --requests N caps the requests per concurrency level (default: the whole workload once; with
 * --memo 20000). Every answer must be HTTP 200; anything else is counted and reported.
 *
 * Design: a client must cost less than the server it measures, and this machine's cores are shared
 * with the server. So each of --threads threads (default: 1 at concurrency 1, else 2) drives its
 * share of the connections with non-blocking sockets and epoll rather than a blocking thread per
 * connection; requests are prebuilt byte strings; a response is complete when its headers and
 * Content-Length bytes have arrived (the server always sends Content-Length).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONCURRENCY 4096
#define MAX_LEVELS 16
#define RESPONSE_BUF_START 65536
#define MEMO_DEFAULT_REQUESTS 20000
#define EVENTS_PER_WAIT 64
#define IO_TIMEOUT_MS 600000 /* a request unanswered this long fails the run */

typedef struct workload {
    char **req;      /* full HTTP requests (request line, headers, body) */
    size_t *req_len;
    int *questions;  /* per request: the answer slots of its row (1 for --bodies) */
    size_t n;
} workload;

typedef struct options {
    const char *host;
    int port;
    int pid;
    const char *trace;
    const char *bodies;
    const char *path;
    const char *api_key;
    const char *label;
    int levels[MAX_LEVELS];
    int n_levels;
    long requests;
    int memo;
    int threads;
} options;

/* One connection's state inside a thread's event loop. */
typedef struct conn {
    int fd;
    long index;        /* the request in flight: its number in this level */
    size_t req;        /* its body in the workload */
    size_t sent;       /* bytes of it written */
    int writing;       /* 1 until the whole request is written */
    char *buf;         /* the response so far */
    size_t len, cap;
    size_t body_at;    /* where the body starts, 0 until the headers are complete */
    size_t content_len;
    double t_start;
    int busy;
} conn;

/* What the threads share for one concurrency level. */
typedef struct run {
    const options *opt;
    const workload *w;
    atomic_long next;      /* the next request to send */
    long total;            /* requests in this level */
    double *latency_ms;    /* per request, by index */
    atomic_long errors;    /* non-200 answers and broken connections */
    atomic_long done;
    atomic_long questions; /* answer slots of the requests answered */
    char first_error[256];
    pthread_mutex_t err_lock;
} run;

typedef struct worker {
    run *r;
    int n_conns;
} worker;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void die(const char *msg) {
    fprintf(stderr, "bench_server: %s\n", msg);
    exit(2);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory");
    return p;
}

static int connect_to(const options *o) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host, &a.sin_addr) != 1) die("--host must be an IPv4 address");
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* ---- one blocking request (stats, warm-up) ------------------------------------------------- */

/* Sends a complete request and reads the response; returns the body (malloc'd) and the status. */
static char *blocking_request(const options *o, const char *req, size_t len, int *status) {
    int fd = connect_to(o);
    if (fd < 0) return NULL;
    for (size_t off = 0; off < len;) {
        ssize_t k = write(fd, req + off, len - off);
        if (k <= 0) { close(fd); return NULL; }
        off += (size_t)k;
    }
    size_t cap = RESPONSE_BUF_START, n = 0;
    char *buf = xmalloc(cap + 1);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            char *b = realloc(buf, cap + 1);
            if (!b) die("out of memory");
            buf = b;
        }
        ssize_t k = read(fd, buf + n, cap - n);
        if (k <= 0) break;
        n += (size_t)k;
        buf[n] = 0;
        char *hdr_end = strstr(buf, "\r\n\r\n");
        if (!hdr_end) continue;
        char *cl = strcasestr(buf, "\r\ncontent-length:");
        if (cl && cl < hdr_end && n >= (size_t)(hdr_end + 4 - buf) + strtoul(cl + 17, NULL, 10)) break;
    }
    close(fd);
    buf[n] = 0;
    *status = n > 12 ? atoi(buf + 9) : 0;
    char *body = strstr(buf, "\r\n\r\n");
    char *out = strdup(body ? body + 4 : "");
    free(buf);
    if (!out) die("out of memory");
    return out;
}

static char *build_request(const options *o, const char *method, const char *path, const char *body, size_t body_len,
                           size_t *out_len) {
    size_t cap = body_len + strlen(path) + 512 + (o->api_key ? strlen(o->api_key) : 0);
    char *r = xmalloc(cap);
    int h = snprintf(r, cap,
                     "%s %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: keep-alive\r\n%s%s%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, o->host, o->port, o->api_key ? "Authorization: Bearer " : "",
                     o->api_key ? o->api_key : "", o->api_key ? "\r\n" : "", body_len);
    memcpy(r + h, body, body_len);
    *out_len = (size_t)h + body_len;
    return r;
}

/* ---- the workload ---------------------------------------------------------------------------- */

/* The answer slots of a trace row: the numbers in its "slots" array (at least 1). */
static int row_slots(const char *row) {
    const char *p = strstr(row, "\"slots\":");
    if (!p || !(p = strchr(p, '['))) return 1;
    int n = 0, in_number = 0;
    for (p++; *p && *p != ']'; p++) {
        int digit = *p >= '0' && *p <= '9';
        if (digit && !in_number) n++;
        in_number = digit;
    }
    return n > 0 ? n : 1;
}

static void load_workload(const options *o, workload *w) {
    const char *file = o->trace ? o->trace : o->bodies;
    FILE *f = fopen(file, "r");
    if (!f) {
        fprintf(stderr, "bench_server: cannot open %s\n", file);
        exit(2);
    }
    size_t cap = 1024;
    w->req = xmalloc(cap * sizeof *w->req);
    w->req_len = xmalloc(cap * sizeof *w->req_len);
    w->questions = xmalloc(cap * sizeof *w->questions);
    w->n = 0;
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t len;
    while ((len = getline(&line, &line_cap, f)) > 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        if (w->n == cap) {
            cap *= 2;
            w->req = realloc(w->req, cap * sizeof *w->req);
            w->req_len = realloc(w->req_len, cap * sizeof *w->req_len);
            w->questions = realloc(w->questions, cap * sizeof *w->questions);
            if (!w->req || !w->req_len || !w->questions) die("out of memory");
        }
        char *body = line;
        size_t body_len = (size_t)len;
        char *wrapped = NULL;
        if (o->trace) { /* a row -> a /v1/score request of one row */
            body_len = (size_t)len + 12;
            wrapped = xmalloc(body_len + 1);
            snprintf(wrapped, body_len + 1, "{\"rows\": [%s]}", line);
            body = wrapped;
        }
        w->questions[w->n] = o->trace ? row_slots(line) : 1;
        w->req[w->n] = build_request(o, "POST", o->path, body, body_len, &w->req_len[w->n]);
        w->n++;
        free(wrapped);
        if (o->memo) break;
    }
    free(line);
    fclose(f);
    if (w->n == 0) die("the workload file has no requests");
}

/* ---- the event loop of one thread ------------------------------------------------------------- */

static void record_error(run *r, const char *what) {
    atomic_fetch_add(&r->errors, 1);
    pthread_mutex_lock(&r->err_lock);
    if (!r->first_error[0]) snprintf(r->first_error, sizeof r->first_error, "%s", what);
    pthread_mutex_unlock(&r->err_lock);
}

/* Takes the next request for c, or marks it idle when the level is over. */
static int start_next(run *r, conn *c) {
    long i = atomic_fetch_add(&r->next, 1);
    if (i >= r->total) {
        c->busy = 0;
        return 0;
    }
    c->index = i;
    c->req = r->opt->memo ? 0 : (size_t)i % r->w->n;
    c->sent = 0;
    c->writing = 1;
    c->len = 0;
    c->body_at = 0;
    c->content_len = 0;
    c->t_start = now_ms();
    c->busy = 1;
    r->latency_ms[i] = -1; /* filled when answered */
    return 1;
}

static int try_write(run *r, conn *c) {
    const char *req = r->w->req[c->req];
    size_t len = r->w->req_len[c->req];
    while (c->sent < len) {
        ssize_t k = write(c->fd, req + c->sent, len - c->sent);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (k <= 0) return -1;
        c->sent += (size_t)k;
    }
    return 1;
}

/* Reads what has arrived on c; returns 1 when its response is complete, 0 when more is to come,
   -1 when the connection broke. */
static int read_response(run *r, conn *c) {
    for (;;) {
        if (c->len == c->cap) {
            c->cap *= 2;
            char *b = realloc(c->buf, c->cap + 1);
            if (!b) die("out of memory");
            c->buf = b;
        }
        ssize_t k = read(c->fd, c->buf + c->len, c->cap - c->len);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (k <= 0) {
            record_error(r, "the server closed a connection");
            return -1;
        }
        c->len += (size_t)k;
        c->buf[c->len] = 0;
        if (!c->body_at) {
            char *end = strstr(c->buf, "\r\n\r\n");
            if (!end) continue;
            char *cl = strcasestr(c->buf, "\r\ncontent-length:");
            if (!cl || cl > end) {
                record_error(r, "a response without Content-Length");
                return -1;
            }
            c->body_at = (size_t)(end + 4 - c->buf);
            c->content_len = strtoul(cl + 17, NULL, 10);
        }
        if (c->len > c->body_at + c->content_len) record_error(r, "bytes after a response");
        if (c->len >= c->body_at + c->content_len) return 1;
    }
}

/* Writes the rest of c's request and, once it is out, returns 1; 0 when the socket is full;
   -1 when it broke. */
static int write_request(run *r, conn *c) {
    if (!c->writing) return 1;
    int w = try_write(r, c);
    if (w < 0) record_error(r, "write failed (connection closed by the server?)");
    if (w == 1) c->writing = 0;
    return w;
}

static void *worker_main(void *arg) {
    worker *wk = arg;
    run *r = wk->r;
    int ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1 failed");
    conn *cs = calloc((size_t)wk->n_conns, sizeof *cs);
    if (!cs) die("out of memory");
    int live = 0;
    for (int i = 0; i < wk->n_conns; i++) {
        conn *c = &cs[i];
        c->fd = connect_to(r->opt);
        if (c->fd < 0) {
            record_error(r, "connect failed");
            continue;
        }
        fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
        c->cap = RESPONSE_BUF_START;
        c->buf = xmalloc(c->cap + 1);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.ptr = c};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) != 0) die("epoll_ctl failed");
        if (start_next(r, c)) {
            live++;
            if (write_request(r, c) < 0) {
                c->busy = 0;
                live--;
            }
        }
    }
    struct epoll_event evs[EVENTS_PER_WAIT];
    while (live > 0) {
        int n = epoll_wait(ep, evs, EVENTS_PER_WAIT, IO_TIMEOUT_MS);
        if (n == 0) {
            record_error(r, "no answer within the I/O timeout");
            break;
        }
        for (int e = 0; e < n; e++) {
            conn *c = evs[e].data.ptr;
            if (!c->busy) continue;
            /* a request larger than the socket buffer goes out as EPOLLOUT allows */
            int w = write_request(r, c);
            if (w == 0) continue;
            int got = w < 0 ? -1 : read_response(r, c);
            if (got == 0) continue;
            if (got == 1) {
                int status = atoi(c->buf + 9);
                r->latency_ms[c->index] = now_ms() - c->t_start;
                if (status != 200) {
                    char what[200];
                    snprintf(what, sizeof what, "HTTP %d: %.150s", status, c->buf + c->body_at);
                    record_error(r, what);
                }
                atomic_fetch_add(&r->done, 1);
                atomic_fetch_add(&r->questions, r->w->questions[c->req]);
                if (start_next(r, c) && write_request(r, c) >= 0) continue;
            }
            c->busy = 0;
            live--;
        }
    }
    for (int i = 0; i < wk->n_conns; i++) {
        if (cs[i].fd >= 0) close(cs[i].fd);
        free(cs[i].buf);
    }
    free(cs);
    close(ep);
    return NULL;
}

/* ---- reporting -------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double percentile(const double *sorted, long n, double p) {
    if (n == 0) return 0;
    long i = (long)(p * (double)(n - 1) + 0.5);
    return sorted[i];
}

/* The number after "key": inside the object "section": {...} of a JSON text (the first
   occurrence of each; the stats object's sections hold no nested objects), or -1. */
static double json_number(const char *json, const char *section, const char *key) {
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\": {", section);
    const char *p = json ? strstr(json, pat) : NULL;
    if (!p) return -1;
    const char *end = strchr(p + strlen(pat), '}');
    snprintf(pat, sizeof pat, "\"%s\":", key);
    p = strstr(p, pat);
    if (!p || (end && p > end)) return -1;
    p += strlen(pat);
    while (*p == ' ') p++;
    return strtod(p, NULL);
}

static char *get_stats(const options *o) {
    size_t len;
    char *req = build_request(o, "GET", "/v1/stats", "", 0, &len);
    int status = 0;
    char *body = blocking_request(o, req, len, &status);
    free(req);
    if (!body || status != 200) {
        free(body);
        return NULL;
    }
    return body;
}

static double peak_rss_mb(int pid) {
    if (pid <= 0) return -1;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = strtod(line + 6, NULL);
    fclose(f);
    return kb < 0 ? -1 : kb / 1024.0;
}

/* The counters of GET /v1/stats that the report uses: section, key. */
#define STAT_MEMO "request_memo"
#define STAT_CACHE "cache"

static double delta(const char *before, const char *after, const char *section, const char *key) {
    double a = json_number(before, section, key), b = json_number(after, section, key);
    return a < 0 || b < 0 ? -1 : b - a;
}

static void print_rate(double num, double den) {
    if (num < 0 || den <= 0) printf(" | n/a");
    else printf(" | %.1f%%", 100.0 * num / den);
}

static int run_level(const options *o, const workload *w, int concurrency) {
    run r = {.opt = o, .w = w};
    atomic_init(&r.next, 0);
    atomic_init(&r.errors, 0);
    atomic_init(&r.done, 0);
    atomic_init(&r.questions, 0);
    pthread_mutex_init(&r.err_lock, NULL);
    r.total = o->requests > 0 ? o->requests : (o->memo ? MEMO_DEFAULT_REQUESTS : (long)w->n);
    r.latency_ms = xmalloc((size_t)r.total * sizeof *r.latency_ms);
    int threads = o->threads > 0 ? o->threads : (concurrency == 1 ? 1 : 2);
    if (threads > concurrency) threads = concurrency;
    char *before = get_stats(o);
    double t0 = now_ms();
    pthread_t tid[64];
    worker wk[64];
    if (threads > 64) threads = 64;
    for (int t = 0; t < threads; t++) {
        wk[t] = (worker){.r = &r, .n_conns = concurrency / threads + (t < concurrency % threads)};
        if (pthread_create(&tid[t], NULL, worker_main, &wk[t]) != 0) die("pthread_create failed");
    }
    for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    double wall = now_ms() - t0;
    char *after = get_stats(o);
    long done = atomic_load(&r.done);
    long answered = 0;
    for (long i = 0; i < r.total; i++)
        if (r.latency_ms[i] >= 0) r.latency_ms[answered++] = r.latency_ms[i];
    qsort(r.latency_ms, (size_t)answered, sizeof *r.latency_ms, cmp_double);
    long errors = atomic_load(&r.errors) + (r.total - done);
    printf("| %s | %d | %ld | %ld | %.0f | %.0f | %.2f | %.2f", o->label ? o->label : (o->memo ? "memo" : "trace"),
           concurrency, done, errors, done / (wall / 1e3), (double)atomic_load(&r.questions) / (wall / 1e3),
           percentile(r.latency_ms, answered, 0.50), percentile(r.latency_ms, answered, 0.99));
    double memo_hits = delta(before, after, STAT_MEMO, "hits");
    double memo_misses = delta(before, after, STAT_MEMO, "misses");
    print_rate(memo_hits, memo_hits < 0 || memo_misses < 0 ? -1 : memo_hits + memo_misses);
    double rows = delta(before, after, STAT_CACHE, "rows");
    double hits = delta(before, after, STAT_CACHE, "hits"), partial = delta(before, after, STAT_CACHE, "partial");
    print_rate(hits < 0 || partial < 0 ? -1 : hits + partial, rows);
    double reused = delta(before, after, STAT_CACHE, "tokens_reused");
    double computed = delta(before, after, STAT_CACHE, "tokens_computed");
    print_rate(reused, reused < 0 || computed < 0 ? -1 : reused + computed);
    double rss = peak_rss_mb(o->pid);
    if (rss < 0) printf(" | n/a |\n");
    else printf(" | %.0f |\n", rss);
    if (r.first_error[0]) fprintf(stderr, "bench_server: %ld errors; the first: %s\n", errors, r.first_error);
    fflush(stdout);
    free(before);
    free(after);
    free(r.latency_ms);
    return errors == 0 ? 0 : 1;
}

static void usage(void) {
    fprintf(stderr,
            "usage: bench_server --port P [--host 127.0.0.1] [--pid PID] (--trace FILE | --bodies FILE)\n"
            "                    [--path /v1/score] [--concurrency 1,8,32,128] [--requests N] [--memo]\n"
            "                    [--threads T] [--api-key KEY] [--label TEXT]\n");
    exit(2);
}

int main(int argc, char **argv) {
    options o = {.host = "127.0.0.1", .path = "/v1/score", .levels = {1, 8, 32, 128}, .n_levels = 4};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--memo")) { o.memo = 1; continue; }
        if (!v) usage();
        i++;
        if (!strcmp(a, "--host")) o.host = v;
        else if (!strcmp(a, "--port")) o.port = atoi(v);
        else if (!strcmp(a, "--pid")) o.pid = atoi(v);
        else if (!strcmp(a, "--trace")) o.trace = v;
        else if (!strcmp(a, "--bodies")) o.bodies = v;
        else if (!strcmp(a, "--path")) o.path = v;
        else if (!strcmp(a, "--api-key")) o.api_key = v;
        else if (!strcmp(a, "--label")) o.label = v;
        else if (!strcmp(a, "--requests")) o.requests = atol(v);
        else if (!strcmp(a, "--threads")) o.threads = atoi(v);
        else if (!strcmp(a, "--concurrency")) {
            o.n_levels = 0;
            for (char *s = (char *)v; *s && o.n_levels < MAX_LEVELS;) {
                int c = (int)strtol(s, &s, 10);
                if (c < 1 || c > MAX_CONCURRENCY) die("--concurrency: each level must be 1..4096");
                o.levels[o.n_levels++] = c;
                if (*s == ',') s++;
                else if (*s) die("--concurrency: a comma-separated list of numbers");
            }
        } else usage();
    }
    if (o.port <= 0 || (!o.trace == !o.bodies)) usage();
    if (o.trace && strcmp(o.path, "/v1/score")) die("--trace rows go to /v1/score");
    workload w;
    load_workload(&o, &w);
    if (o.memo) { /* one warm-up: later copies of this body are exact repeats */
        int status = 0;
        char *body = blocking_request(&o, w.req[0], w.req_len[0], &status);
        if (status != 200) {
            fprintf(stderr, "bench_server: the warm-up request got HTTP %d: %.300s\n", status, body ? body : "");
            return 1;
        }
        free(body);
    }
    printf("| workload | concurrency | answered | errors | requests/s | questions/s | p50 ms | p99 ms | request memo | "
           "cache hits (rows) | tokens reused | server peak RSS MB |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    int status = 0;
    for (int l = 0; l < o.n_levels; l++) status |= run_level(&o, &w, o.levels[l]);
    for (size_t i = 0; i < w.n; i++) free(w.req[i]);
    free(w.req);
    free(w.req_len);
    free(w.questions);
    return status;
}
