/*
 * forward_timer.h — the backend's forward, timed, for the benchmark programs (bench_cache,
 * bench_gpu): a row's time minus its forward time is the engine's own work (the memo, the cache's
 * plan, restore and saves, the scheduler).
 *
 * The backend's functions take no user pointer, so the wrapper finds the real forward and the clock
 * in one static record: a program includes this once (a single-file benchmark) and every engine it
 * wraps must share one backend implementation, which forward_timer_wrap checks.
 */
#ifndef SQUAD_BENCH_FORWARD_TIMER_H
#define SQUAD_BENCH_FORWARD_TIMER_H

#include "backend.h"

static struct {
    int (*forward)(squad_backend *, const squad_chunk *, int, squad_err *);
    double (*now)(void);
    double seconds; /* the forwards' time since the caller last zeroed it */
} forward_timer;

static int forward_timer_forward(squad_backend *be, const squad_chunk *ck, int n_chunks, squad_err *err) {
    const double t0 = forward_timer.now();
    const int rc = forward_timer.forward(be, ck, n_chunks, err);
    forward_timer.seconds += forward_timer.now() - t0;
    return rc;
}

/* be's forward through the timer, read by `now`: 0, or -1 (be left as it was) when be's forward is
 * another function than the one already wrapped. */
static int forward_timer_wrap(squad_backend *be, double (*now)(void)) {
    forward_timer.now = now;
    if (be->forward == forward_timer_forward) return 0;
    if (forward_timer.forward && forward_timer.forward != be->forward) return -1;
    forward_timer.forward = be->forward;
    be->forward = forward_timer_forward;
    return 0;
}

#endif
