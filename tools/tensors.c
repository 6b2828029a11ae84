/*
 * tensors.c: RNG, buffer filling and touched allocations for the tool (see tensors.h).
 */
#include "tensors.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "oracle/reference.h"

tool_rng tool_rng_seeded(uint64_t seed) {
    tool_rng rng = {seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull, 0.0, 0};
    return rng;
}

/* splitmix64 -> [0, 1) with 53 random bits. */
static double rng_uniform(tool_rng *rng) {
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

double tool_rng_normal(tool_rng *rng) {
    if (rng->has_spare) {
        rng->has_spare = 0;
        return rng->spare;
    }
    double u1 = rng_uniform(rng), u2 = rng_uniform(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    double radius = sqrt(-2.0 * log(u1)), angle = 6.283185307179586 * u2;
    rng->spare = radius * sin(angle);
    rng->has_spare = 1;
    return radius * cos(angle);
}

/* Filling runs in chunks, each with its own generator seeded from (seed, chunk), so the values do
 * not depend on how many threads fill them. */
#define FILL_CHUNK ((size_t)1 << 20)
#define FILL_MAX_THREADS 64

typedef struct fill_job {
    void *buffer;
    fa_dtype dtype;
    size_t n;
    float scale, offset;
    uint64_t seed;
    size_t first_chunk, chunk_step;
} fill_job;

static void *fill_chunks(void *arg) {
    const fill_job *job = arg;
    for (size_t chunk = job->first_chunk; chunk * FILL_CHUNK < job->n; chunk += job->chunk_step) {
        tool_rng rng = tool_rng_seeded(job->seed ^ (chunk * 0xD1B54A32D192ED03ull));
        size_t end = (chunk + 1) * FILL_CHUNK < job->n ? (chunk + 1) * FILL_CHUNK : job->n;
        for (size_t i = chunk * FILL_CHUNK; i < end; i++)
            fa_test_store(job->buffer, job->dtype, (int64_t)i,
                          tool_rng_normal(&rng) * job->scale + job->offset);
    }
    return NULL;
}

void tool_fill_normal(void *buffer, fa_dtype dtype, size_t n, float scale, float offset,
                      tool_rng *rng) {
    uint64_t seed = rng->state;
    size_t chunks = (n + FILL_CHUNK - 1) / FILL_CHUNK;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n_threads = chunks < (size_t)(cores > 0 ? cores : 1) ? chunks : (size_t)cores;
    if (n_threads > FILL_MAX_THREADS) n_threads = FILL_MAX_THREADS;
    if (n_threads < 1) n_threads = 1;
    rng->state += 0x9E3779B97F4A7C15ull; /* the next tensor gets different values */
    fill_job jobs[FILL_MAX_THREADS];
    pthread_t threads[FILL_MAX_THREADS];
    size_t started = 1;
    for (size_t t = 0; t < n_threads; t++)
        jobs[t] = (fill_job){buffer, dtype, n, scale, offset, seed, t, n_threads};
    for (size_t t = 1; t < n_threads; t++, started++)
        if (pthread_create(&threads[t], NULL, fill_chunks, &jobs[t]) != 0) break;
    /* Chunks of threads that could not start are filled here. */
    for (size_t t = started; t < n_threads; t++) fill_chunks(&jobs[t]);
    fill_chunks(&jobs[0]);
    for (size_t t = 1; t < started; t++) pthread_join(threads[t], NULL);
}

void *tool_alloc_touched(size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    void *buffer = aligned_alloc(64, rounded);
    if (buffer) memset(buffer, 0, rounded);
    return buffer;
}
