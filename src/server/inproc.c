/*
 * inproc.c — the in-process transport: squad_server_handle answers one request without sockets,
 * through the same life (router.h) the HTTP transport drives, waiting on a condition variable for
 * the job. For tests and fuzzing (tests/fuzz/fuzz_http.c).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/router.h"

/* The mark is set under the waiter's lock, which the waiter holds while it tests the mark: it cannot
   see the request done, return and free it (with the lock and condition on its stack) before this
   unlocks. The lock and condition are read into locals first; after the unlock nothing is touched. */
static void wake_cond(srv_job *job) {
    srv_req *r = job->owner;
    pthread_mutex_t *lock = r->wait_lock;
    pthread_cond_t *cond = r->wait_cond;
    pthread_mutex_lock(lock);
    atomic_store_explicit(&r->job_done, 1, memory_order_release);
    pthread_cond_signal(cond);
    pthread_mutex_unlock(lock);
}

int squad_server_handle(squad_server *srv, const char *method, const char *path, const char *const *headers,
                        int n_headers, const char *body, size_t len, int *status, char **resp_body, size_t *resp_len,
                        const char **content_type) {
    *status = 0;
    *resp_body = NULL;
    *resp_len = 0;
    *content_type = SRV_CT_JSON;
    srv_req *r = srv_req_new(srv);
    if (!r) return SQUAD_E_NOMEM;
    const char *auth = NULL;
    for (int i = 0; i < n_headers; i++) {
        if (!headers[2 * i]) continue;
        if (!strcasecmp(headers[2 * i], "Authorization")) auth = headers[2 * i + 1];
        else if (!strcasecmp(headers[2 * i], SRV_HEADER_SESSION)) srv_req_set_session_header(r, headers[2 * i + 1]);
    }
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    r->wait_lock = &lock;
    r->wait_cond = &cond;
    r->wake = wake_cond;
    if (!srv_req_route(r, method ? method : "", path ? path : "", auth, (long long)len)) {
        srv_req_body(r, body, len);
        if (!srv_req_prepare(r)) {
            pthread_mutex_lock(&lock);
            if (!srv_req_submit(r)) {
                while (!atomic_load_explicit(&r->job_done, memory_order_acquire)) pthread_cond_wait(&cond, &lock);
                pthread_mutex_unlock(&lock);
                srv_req_finish(r);
            } else {
                pthread_mutex_unlock(&lock);
            }
        }
    }
    *status = r->status;
    *resp_body = r->resp;
    *resp_len = r->resp_len;
    *content_type = r->ctype ? r->ctype : SRV_CT_JSON;
    r->resp = NULL;
    srv_req_end(r, 1);
    pthread_cond_destroy(&cond);
    pthread_mutex_destroy(&lock);
    return 0;
}
