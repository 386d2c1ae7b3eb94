/*
 * pool.c — the CPU thread pool (pool.h): n - 1 worker threads plus the caller.
 *
 * Protocol of one cpu_pool_run. The job is announced by one 64-bit atomic, `ticket`: the job
 * generation in the high 32 bits, the number of tasks not yet handed out in the low 32.
 *   1. the caller writes the job (fn, ctx, n_tasks), zeroes `done`, then stores
 *      ticket = (gen + 1, n_tasks);
 *   2. a thread claims a task by a compare-and-swap that decrements the low half while the high
 *      half still names the job it saw; the task index is the remaining count minus one (tasks go
 *      out in descending order). Only after a successful claim does it read fn / ctx, and it
 *      increments `done` when the task returns;
 *   3. the caller claims tasks the same way and returns once done == n_tasks.
 * Completion counts tasks, not threads: a worker the OS has descheduled does not hold the caller
 * up when the others (or the caller alone) have run every task, and when it wakes its claim fails
 * because the generation moved on. A claim keeps its job alive (done < n_tasks until the task
 * ends), so the job fields a claimer reads cannot be rewritten under it.
 * Waiting: a worker spins (with a pause hint) for WORKER_SPIN_ROUNDS checks of the generation
 * before it sleeps on `wake`; the caller broadcasts only when some worker is asleep (`sleepers` >
 * 0). Sleeper count and ticket are sequentially consistent atomics, and a worker increments
 * `sleepers` and rechecks the ticket under the mutex the caller takes to broadcast, so a wake-up
 * is never lost. The caller, its own tasks done, spins for tasks still running elsewhere and
 * yields the core after CALLER_SPIN_ROUNDS (the machine may be shared).
 */
#define _GNU_SOURCE
#include "cpu/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Checks of the generation a worker makes before sleeping: tens of microseconds, longer than the gap
 * between the kernels of one layer, far shorter than a scheduler tick. */
#define WORKER_SPIN_ROUNDS 20000
/* Checks of `done` the caller makes before it starts yielding its core to the stragglers. */
#define CALLER_SPIN_ROUNDS 4000
/* Threads a pool may have: far beyond any machine this runs on, a guard against nonsense. */
#define POOL_MAX_THREADS 1024

typedef struct pool_worker {
    cpu_pool *pool;
    int index; /* 1 .. threads-1; the caller is 0 */
    pthread_t thread;
} pool_worker;

struct cpu_pool {
    int threads; /* the caller included */
    cpu_isa isa;
    pool_worker *workers; /* threads - 1 */
    int started;          /* workers successfully created */

    /* The current job, written by the caller before it publishes the ticket. */
    void (*fn)(void *ctx, int task, int n_tasks);
    void (*fn_indexed)(void *ctx, int task, int n_tasks, int thread);
    void *ctx;
    int n_tasks;
    unsigned gen; /* the caller's count of jobs published */

    _Atomic uint64_t ticket; /* (generation << 32) | tasks not yet claimed */
    atomic_int done;         /* tasks of the current job finished */
    atomic_int sleepers;     /* workers waiting on wake */
    atomic_int stop;

    pthread_mutex_t mu;
    pthread_cond_t wake;

    void *scratch;
    size_t scratch_bytes;
};

cpu_isa cpu_detect_isa(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl")) {
#if defined(__clang__) || __GNUC__ >= 10
        if (__builtin_cpu_supports("avx512bf16")) return CPU_ISA_AVX512_BF16;
#endif
        return CPU_ISA_AVX512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CPU_ISA_AVX2;
#endif
    return CPU_ISA_SCALAR;
}

const char *cpu_isa_name(cpu_isa isa) {
    switch (isa) {
    case CPU_ISA_AVX512_BF16: return "avx512-bf16";
    case CPU_ISA_AVX512: return "avx512";
    case CPU_ISA_AVX2: return "avx2";
    default: return "scalar";
    }
}

int cpu_isa_parse(const char *name, cpu_isa *isa) {
    static const struct {
        const char *name;
        cpu_isa isa;
    } names[] = {{"scalar", CPU_ISA_SCALAR},        {"avx2", CPU_ISA_AVX2},
                 {"avx512", CPU_ISA_AVX512},        {"avx512f", CPU_ISA_AVX512},
                 {"avx512-bf16", CPU_ISA_AVX512_BF16}, {"avx512bf16", CPU_ISA_AVX512_BF16}};
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i].name)) {
            *isa = names[i].isa;
            return 0;
        }
    return -1;
}

int cpu_effective_isa(cpu_isa *isa, squad_err *err) {
    *isa = cpu_detect_isa();
    const char *forced = getenv(CPU_ISA_ENV);
    if (!forced || !*forced) return 0;
    cpu_isa want;
    if (cpu_isa_parse(forced, &want))
        return squad_fail(err, SQUAD_E_INVALID, "%s=%s: expected scalar, avx2, avx512 or avx512-bf16", CPU_ISA_ENV,
                          forced);
    if (want < *isa) *isa = want; /* only ever lowers: a level the CPU lacks would crash */
    return 0;
}

int cpu_available_cores(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Runs tasks of job generation g until none are left to claim; returns at once when the pool has
 * moved past g. */
static void pool_drain(cpu_pool *p, uint32_t g, int thread) {
    uint64_t cur = atomic_load(&p->ticket);
    for (;;) {
        if ((uint32_t)(cur >> 32) != g || (uint32_t)cur == 0) return;
        if (!atomic_compare_exchange_weak(&p->ticket, &cur, cur - 1)) continue; /* cur reloaded */
        int task = (int)(uint32_t)cur - 1;
        if (p->fn_indexed)
            p->fn_indexed(p->ctx, task, p->n_tasks, thread);
        else
            p->fn(p->ctx, task, p->n_tasks);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        cur = atomic_load(&p->ticket);
    }
}

static void *pool_worker_main(void *arg) {
    pool_worker *w = arg;
    cpu_pool *p = w->pool;
    uint32_t seen = 0; /* the pool starts at generation 0 with no job */
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = (uint32_t)(atomic_load(&p->ticket) >> 32)) == seen && !atomic_load(&p->stop)) {
            if (++spins < WORKER_SPIN_ROUNDS) {
                CPU_RELAX();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((uint32_t)(atomic_load(&p->ticket) >> 32) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        pool_drain(p, g, w->index);
    }
    return NULL;
}

static void pool_wake_all(cpu_pool *p) {
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
}

cpu_pool *cpu_pool_new(int threads, squad_err *err) {
    if (threads < 0 || threads > POOL_MAX_THREADS) {
        squad_fail(err, SQUAD_E_INVALID, "thread count %d out of range (0..%d)", threads, POOL_MAX_THREADS);
        return NULL;
    }
    if (threads == 0) threads = cpu_available_cores();
    cpu_pool *p = squad_calloc(1, sizeof *p, err);
    if (!p) return NULL;
    p->threads = threads;
    if (cpu_effective_isa(&p->isa, err)) {
        free(p);
        return NULL;
    }
    atomic_init(&p->ticket, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        squad_fail(err, SQUAD_E_NOMEM, "cannot create a mutex for the thread pool");
        return NULL;
    }
    if (pthread_cond_init(&p->wake, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        squad_fail(err, SQUAD_E_NOMEM, "cannot create a condition variable for the thread pool");
        return NULL;
    }
    if (threads > 1) {
        p->workers = squad_calloc((size_t)threads - 1, sizeof *p->workers, err);
        if (!p->workers) {
            cpu_pool_free(p);
            return NULL;
        }
        for (int i = 0; i < threads - 1; i++) {
            p->workers[i].pool = p;
            p->workers[i].index = i + 1;
            if (pthread_create(&p->workers[i].thread, NULL, pool_worker_main, &p->workers[i]) != 0) {
                cpu_pool_free(p);
                squad_fail(err, SQUAD_E_NOMEM, "cannot start thread %d of %d for the thread pool", i + 2, threads);
                return NULL;
            }
            p->started++;
        }
    }
    return p;
}

void cpu_pool_free(cpu_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++) pthread_join(p->workers[i].thread, NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    squad_aligned_free(p->scratch);
    free(p);
}

int cpu_pool_threads(const cpu_pool *p) { return p->threads; }

cpu_isa cpu_pool_isa(const cpu_pool *p) { return p->isa; }

void cpu_pool_set_isa(cpu_pool *p, cpu_isa isa) {
    cpu_isa best = cpu_detect_isa();
    p->isa = isa > best ? best : isa;
}

static void pool_run(cpu_pool *p, void (*fn)(void *, int, int), void (*fn_indexed)(void *, int, int, int), void *ctx,
                     int n_tasks) {
    if (n_tasks <= 0) return;
    if (p->started == 0 || n_tasks == 1) {
        /* Nothing to share: run inline and skip the handshake. */
        for (int t = 0; t < n_tasks; t++) {
            if (fn_indexed)
                fn_indexed(ctx, t, n_tasks, 0);
            else
                fn(ctx, t, n_tasks);
        }
        return;
    }
    p->fn = fn;
    p->fn_indexed = fn_indexed;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    p->gen++;
    /* seq_cst: publishes the job, and is ordered before the sleeper check in pool_wake_all. */
    atomic_store(&p->ticket, (uint64_t)p->gen << 32 | (uint32_t)n_tasks);
    pool_wake_all(p);
    pool_drain(p, p->gen, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks) {
        if (++spins < CALLER_SPIN_ROUNDS)
            CPU_RELAX();
        else
            sched_yield();
    }
}

void cpu_pool_run(cpu_pool *p, void (*fn)(void *ctx, int task, int n_tasks), void *ctx, int n_tasks) {
    pool_run(p, fn, NULL, ctx, n_tasks);
}

void cpu_pool_run_indexed(cpu_pool *p, void (*fn)(void *ctx, int task, int n_tasks, int thread), void *ctx,
                          int n_tasks) {
    pool_run(p, NULL, fn, ctx, n_tasks);
}

void *cpu_pool_scratch(cpu_pool *p, size_t bytes, squad_err *err) {
    if (bytes <= p->scratch_bytes && p->scratch) return p->scratch;
    /* Grow by half again so a slowly rising demand does not reallocate every call. */
    size_t want = bytes + bytes / 2;
    if (want < bytes) want = bytes;
    void *fresh = squad_aligned_alloc(want, err);
    if (!fresh) {
        fresh = squad_aligned_alloc(bytes, err);
        if (!fresh) return NULL;
        want = bytes;
    }
    squad_aligned_free(p->scratch);
    p->scratch = fresh;
    p->scratch_bytes = want;
    return fresh;
}
