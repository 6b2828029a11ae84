/*
 * cpu_threads.c: the CPU engine's threads and workspace.
 *
 * One process-wide pool of persistent worker threads serves the calls, so a small (decode-size)
 * call pays a condition-variable wake-up rather than thread creation. The pool runs one job at a
 * time: a call takes the pool with a trylock; a call that finds it busy (another user thread is
 * running attention at the same moment) starts its own temporary threads instead of waiting,
 * so concurrent calls are safe and never block each other. Workers are created on demand, up
 * to the largest thread count asked for so far, and live until the process exits.
 *
 * A job is task(ctx, thread_index) run on thread indices 0..n-1, index 0 on the calling thread.
 * Tasks split their work themselves through an atomic item counter, so the result never
 * depends on which thread ran which item.
 *
 * fork(): the child has none of the parent's workers, so a pthread_atfork handler resets the
 * pool there (otherwise the child's first call would wait for workers that do not exist).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu_engine.h"

int fa_cpu_online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > FA_CPU_MAX_THREADS) n = FA_CPU_MAX_THREADS;
    return (int)n;
}

int fa_cpu_thread_count(const fa_problem *pb) {
    long n = pb->p.num_threads;
    if (n <= 0) n = fa_cpu_online_cores();
    if (n > FA_CPU_MAX_THREADS) n = FA_CPU_MAX_THREADS;
    return (int)n;
}

/* ---- the shared pool ---------------------------------------------------------------------------- */

typedef struct fa_cpu_pool {
    pthread_mutex_t job_lock; /* held by the call that owns the pool for its whole job        */
    pthread_mutex_t state_lock; /* protects everything below                                   */
    pthread_cond_t start_cond;  /* workers wait here for a new generation                     */
    pthread_cond_t done_cond;   /* the owner waits here for pending == 0                      */
    int n_workers;              /* workers created so far; worker w runs thread index w + 1    */
    uint64_t generation;        /* incremented once per job                                    */
    fa_cpu_task task;
    void *ctx;
    int job_threads; /* threads of the current job, the caller included                       */
    int pending;     /* workers of the current job still running                              */
} fa_cpu_pool;

static fa_cpu_pool pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                           PTHREAD_COND_INITIALIZER, 0, 0, NULL, NULL, 0, 0};

typedef struct fa_cpu_worker_start {
    int thread_index;
    uint64_t generation_seen;
} fa_cpu_worker_start;

static void *pool_worker(void *arg) {
    fa_cpu_worker_start start = *(fa_cpu_worker_start *)arg;
    free(arg);
    pthread_mutex_lock(&pool.state_lock);
    uint64_t seen = start.generation_seen;
    for (;;) {
        while (pool.generation == seen) pthread_cond_wait(&pool.start_cond, &pool.state_lock);
        seen = pool.generation;
        if (start.thread_index >= pool.job_threads) continue; /* not needed by this job */
        fa_cpu_task task = pool.task;
        void *ctx = pool.ctx;
        pthread_mutex_unlock(&pool.state_lock);
        task(ctx, start.thread_index);
        pthread_mutex_lock(&pool.state_lock);
        if (--pool.pending == 0) pthread_cond_signal(&pool.done_cond);
    }
    return NULL;
}

static void pool_reset_in_child(void) {
    pthread_mutex_init(&pool.job_lock, NULL);
    pthread_mutex_init(&pool.state_lock, NULL);
    pthread_cond_init(&pool.start_cond, NULL);
    pthread_cond_init(&pool.done_cond, NULL);
    pool.n_workers = 0;
    pool.generation = 0;
    pool.job_threads = 0;
    pool.pending = 0;
}

static pthread_once_t pool_fork_handler_once = PTHREAD_ONCE_INIT;
static void pool_register_fork_handler(void) { pthread_atfork(NULL, NULL, pool_reset_in_child); }

/* Grow the pool to `want` workers (called with job_lock held, so generation is stable).
 * Returns the number of workers available. */
static int pool_grow(int want) {
    while (pool.n_workers < want) {
        fa_cpu_worker_start *start = (fa_cpu_worker_start *)malloc(sizeof *start);
        if (!start) break;
        start->thread_index = pool.n_workers + 1;
        pthread_mutex_lock(&pool.state_lock);
        start->generation_seen = pool.generation;
        pthread_mutex_unlock(&pool.state_lock);
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&thread, &attr, pool_worker, start);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            free(start);
            break;
        }
        pool.n_workers++;
    }
    return pool.n_workers;
}

/* ---- temporary threads for a call that finds the pool busy ------------------------------------- */

typedef struct fa_cpu_temp_thread {
    fa_cpu_task task;
    void *ctx;
    int thread_index;
} fa_cpu_temp_thread;

static void *temp_thread_main(void *arg) {
    fa_cpu_temp_thread *t = (fa_cpu_temp_thread *)arg;
    t->task(t->ctx, t->thread_index);
    return NULL;
}

static void run_on_temporary_threads(int thread_count, fa_cpu_task task, void *ctx) {
    fa_cpu_temp_thread *args = (fa_cpu_temp_thread *)malloc((size_t)thread_count * sizeof *args);
    pthread_t *threads = (pthread_t *)malloc((size_t)thread_count * sizeof *threads);
    int started = 1;
    if (args && threads) {
        for (int i = 1; i < thread_count; i++) {
            args[started].task = task;
            args[started].ctx = ctx;
            args[started].thread_index = started;
            if (pthread_create(&threads[started], NULL, temp_thread_main, &args[started]) != 0) break;
            started++;
        }
    }
    task(ctx, 0);
    for (int i = 1; i < started; i++) pthread_join(threads[i], NULL);
    free(args);
    free(threads);
}

void fa_cpu_parallel_run(int thread_count, fa_cpu_task task, void *ctx) {
    if (thread_count <= 1) {
        task(ctx, 0);
        return;
    }
    pthread_once(&pool_fork_handler_once, pool_register_fork_handler);
    if (pthread_mutex_trylock(&pool.job_lock) != 0) {
        run_on_temporary_threads(thread_count, task, ctx);
        return;
    }
    int workers = pool_grow(thread_count - 1);
    int job_threads = workers + 1 < thread_count ? workers + 1 : thread_count;
    pthread_mutex_lock(&pool.state_lock);
    pool.task = task;
    pool.ctx = ctx;
    pool.job_threads = job_threads;
    pool.pending = job_threads - 1;
    pool.generation++;
    pthread_cond_broadcast(&pool.start_cond);
    pthread_mutex_unlock(&pool.state_lock);

    task(ctx, 0);

    pthread_mutex_lock(&pool.state_lock);
    while (pool.pending > 0) pthread_cond_wait(&pool.done_cond, &pool.state_lock);
    pthread_mutex_unlock(&pool.state_lock);
    pthread_mutex_unlock(&pool.job_lock);
}

/* ---- workspace ----------------------------------------------------------------------------------- */

int fa_cpu_workspace_acquire(const fa_problem *pb, size_t bytes, fa_cpu_workspace *ws) {
    /* `bytes` already includes 64 bytes of slack for aligning an unaligned caller buffer */
    ws->owned = NULL;
    if (pb->p.workspace && pb->p.workspace_bytes >= bytes) {
        ws->base = (char *)(((uintptr_t)pb->p.workspace + 63) & ~(uintptr_t)63);
        return 1;
    }
    ws->owned = malloc(bytes ? bytes : 1);
    if (!ws->owned) {
        fa_set_error(FA_ERR_ALLOC, "CPU engine: cannot allocate %zu bytes of workspace", bytes);
        return 0;
    }
    ws->base = (char *)(((uintptr_t)ws->owned + 63) & ~(uintptr_t)63);
    return 1;
}

void fa_cpu_workspace_release(fa_cpu_workspace *ws) {
    free(ws->owned);
    ws->owned = NULL;
}
