/*
 * bench_decode.c: `flashattn bench --mode decode`: fa_kvcache_forward on decode shapes, reported
 * as effective bandwidth (K and V bytes the call must read / time) next to the copy bandwidth
 * of the same device measured in the same run.
 *
 *   flashattn bench --mode decode                      the default sweep (below)
 *   flashattn bench --mode decode --device cuda -b 32 --cache-len 8192 --page-size 0,16
 *
 * Per configuration: batch sequences of `sq` query tokens (1 = decoding), each with cache_len
 * tokens in its cache (contiguous [b, cache_len, hkv, d], or a paged pool with a random block
 * table), optionally appending sq new tokens first (--append 1). kv_bytes = Σ_b keys_b · hkv ·
 * (d + dv) · element size (a latent cache, --latent 1, where v is k's first dv columns: d only);
 * GB/s = kv_bytes / median time; TFLOP/s = 2 · hq · (d + dv) · the keys each query token sees /
 * median time. copy GB/s: a large buffer copied by
 * every thread of the run (CPU: memcpy of 512 MiB, split among the threads; CUDA: one
 * device-to-device cudaMemcpy of 1 GiB), counted as bytes read + bytes written per second: the
 * traffic the memory sustains, which a read-mostly decode kernel can approach.
 * --kv-dtype int8|q8_0|fp8 times a quantised cache (kv_bytes then counts its bytes: 8-bit
 * values plus the int8 per-token scales or the Q8_0 block scales), on either device. The copy is measured between
 * the calls of every configuration (a copy, then a few calls, repeated) and both medians are
 * reported, so a machine whose load changes during the sweep still compares like with like.
 * CUDA inputs are rotated through several copies when one set is smaller than twice the L2, so
 * consecutive calls do not run from a warm L2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_case.h"
#include "cli.h"
#include "cudart.h"
#include "tensors.h"
#include "timing.h"

#define CMD "bench"
#define MAX_SETS 8
#define MIN_CALLS 3
#define TIME_BUDGET_S 1.0
#define CPU_COPY_BYTES ((size_t)512 << 20)
#define CUDA_COPY_BYTES ((size_t)1 << 30)

typedef struct int_list {
    int64_t values[CLI_MAX_LIST];
    int count;
} int_list;

typedef struct decode_options {
    fa_device device;
    int device_given;
    fa_dtype dtypes[3];
    int n_dtypes;
    int_list b, hq, hkv, d, cache_len, page_size;
    int64_t sq, dv; /* dv 0 = d */
    int latent;
    int splits, append, causal, threads, repeats, warmups, json;
    fa_kv_dtype kv_dtypes[4];
    int n_kv_dtypes;
    uint64_t seed;
} decode_options;

typedef struct decode_case {
    fa_device device;
    fa_dtype dtype;
    int64_t b, sq, hq, hkv, d, dv, cache_len, page_size;
    int splits, append, causal, threads;
    int latent; /* v is the first dv columns of k (one cache, each row read once) */
    fa_kv_dtype kv_dtype;
} decode_case;

typedef struct decode_result {
    int ok;
    char note[200];
    double ms;
    int calls;
    double kv_bytes;
    double copy_gbps; /* CPU: median of the copies interleaved with this configuration's calls */
} decode_result;

/* ---- flags ---------------------------------------------------------------------------------- */

static void print_help(void) {
    printf("usage: flashattn bench --mode decode [flags]\n"
           "\n"
           "Times fa_kvcache_forward (KV-cache decoding) and reports the effective bandwidth: the K\n"
           "and V bytes a call must read divided by its median time, next to the copy bandwidth of\n"
           "the device measured in the same run (bytes read + written per second by a large copy:\n"
           "CPU memcpy of 512 MiB by all threads, CUDA device-to-device cudaMemcpy of 1 GiB).\n"
           "Without shape flags: one query token, 32 query / 8 kv heads, d = 128, bf16, batch x\n"
           "context 1 x 8k, 32 x 8k, 8 x 64k, 128 x 2k, contiguous and paged (16) caches.\n"
           "\n"
           "flags (numbers accept lists: --cache-len 2048,8192):\n"
           "  --device cpu|cuda      device (default: cuda if available, else cpu)\n"
           "  --dtype f32|f16|bf16   element type, list allowed (default bf16)\n"
           "  -b N, --batch N        sequences (default 1)\n"
           "  --hq N, --hkv N        query / kv heads (default 32 / 8)\n"
           "  -d N                   head dim (default 128)\n"
           "  --dv N                 head dim of v and o (default: d)\n"
           "  --latent 0|1           1: a latent cache (MLA): v is the first dv columns of k, one\n"
           "                         tensor whose rows are read once (needs dv <= d; kv bytes and\n"
           "                         GB/s count k alone)\n"
           "  --cache-len N          tokens already in each sequence's cache (default 8192)\n"
           "  --page-size N          0 = contiguous cache, else a paged pool with a random block\n"
           "                         table (default 0)\n"
           "  --sq N                 query tokens per sequence (default 1)\n"
           "  --kv-dtype LIST        cache storage: same (default), int8, q8_0, fp8 (e4m3)\n"
           "  --append 0|1           also append sq new tokens per call (default 0)\n"
           "  --causal 0|1           causal mask (default 1)\n"
           "  --splits N             num_splits: 0 = heuristic (default), 1 = none, n = at most n\n"
           "  --threads N            CPU threads (default 0 = all cores)\n"
           "  --repeats N, --warmup N, --seed N, --json (one object per line)\n");
}

static void parse_list(const char *flag, const char *value, int64_t min, int64_t max, int_list *list) {
    list->count = cli_parse_int_list(CMD, flag, value, min, max, list->values);
}

static void set_default(int_list *list, int count, const int64_t *values) {
    if (list->count) return;
    list->count = count;
    memcpy(list->values, values, (size_t)count * sizeof values[0]);
}

static void parse_options(int argc, char **argv, decode_options *o, int *shape_given) {
    static const int64_t big = (int64_t)1 << 31;
    memset(o, 0, sizeof *o);
    o->sq = 1;
    o->causal = 1;
    o->warmups = -1;
    o->seed = 1234;
    *shape_given = 0;
    for (int i = 0; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help();
            exit(0);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--mode"))) {
            if (strcmp(v, "decode")) cli_usage_error(CMD, "--mode decode cannot be combined with --mode %s", v);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--device"))) {
            if (!cli_parse_device(v, &o->device)) cli_usage_error(CMD, "--device: '%s' is not cpu or cuda", v);
            o->device_given = 1;
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--dtype"))) {
            char copy[64];
            snprintf(copy, sizeof copy, "%s", v);
            o->n_dtypes = 0;
            for (char *save = NULL, *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
                if (o->n_dtypes == 3 || !cli_parse_dtype(item, &o->dtypes[o->n_dtypes]))
                    cli_usage_error(CMD, "--dtype: '%s' is not f32, f16 or bf16", item);
                o->n_dtypes++;
            }
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "-b")) ||
                   (v = cli_flag_value(CMD, argc, argv, &i, "--batch"))) {
            parse_list("-b", v, 1, big, &o->b);
            *shape_given = 1;
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--hq"))) {
            parse_list("--hq", v, 1, big, &o->hq);
            *shape_given = 1;
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--hkv"))) {
            parse_list("--hkv", v, 1, big, &o->hkv);
            *shape_given = 1;
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "-d")) ||
                   (v = cli_flag_value(CMD, argc, argv, &i, "--d"))) {
            parse_list("-d", v, 1, FA_MAX_HEAD_DIM, &o->d);
            *shape_given = 1;
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--dv"))) {
            o->dv = cli_parse_int(CMD, "--dv", v, 1, FA_MAX_HEAD_DIM);
            *shape_given = 1;
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--latent"))) {
            o->latent = (int)cli_parse_int(CMD, "--latent", v, 0, 1);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--cache-len"))) {
            parse_list("--cache-len", v, 0, big, &o->cache_len);
            *shape_given = 1;
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--page-size"))) {
            parse_list("--page-size", v, 0, big, &o->page_size);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--sq"))) {
            o->sq = cli_parse_int(CMD, "--sq", v, 1, big);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--kv-dtype"))) {
            char copy[64];
            snprintf(copy, sizeof copy, "%s", v);
            o->n_kv_dtypes = 0;
            for (char *save = NULL, *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
                static const char *const names[4] = {"same", "int8", "q8_0", "fp8"};
                int found = -1;
                for (int k = 0; k < 4; k++)
                    if (!strcmp(item, names[k])) found = k;
                if (o->n_kv_dtypes == 4 || found < 0)
                    cli_usage_error(CMD, "--kv-dtype: '%s' is not same, int8, q8_0 or fp8", item);
                o->kv_dtypes[o->n_kv_dtypes++] = (fa_kv_dtype)found;
            }
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--append"))) {
            o->append = (int)cli_parse_int(CMD, "--append", v, 0, 1);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--causal"))) {
            o->causal = (int)cli_parse_int(CMD, "--causal", v, 0, 1);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--splits"))) {
            o->splits = (int)cli_parse_int(CMD, "--splits", v, 0, 1 << 20);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--threads"))) {
            o->threads = (int)cli_parse_int(CMD, "--threads", v, 0, 4096);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--repeats"))) {
            o->repeats = (int)cli_parse_int(CMD, "--repeats", v, 1, BENCH_MAX_REPEATS);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--warmup"))) {
            o->warmups = (int)cli_parse_int(CMD, "--warmup", v, 0, BENCH_MAX_REPEATS);
        } else if ((v = cli_flag_value(CMD, argc, argv, &i, "--seed"))) {
            o->seed = (uint64_t)cli_parse_int(CMD, "--seed", v, 0, INT64_MAX);
        } else if (!strcmp(argv[i], "--json")) {
            o->json = 1;
        } else {
            cli_usage_error(CMD, "unknown flag '%s' for --mode decode (see --mode decode --help)", argv[i]);
        }
    }
    if (!o->device_given) o->device = fa_cuda_available() ? FA_DEVICE_CUDA : FA_DEVICE_CPU;
    if (o->n_kv_dtypes == 0) o->n_kv_dtypes = 1; /* FA_KV_SAME */
    if (o->n_dtypes == 0) {
        o->dtypes[0] = FA_DTYPE_BF16;
        o->n_dtypes = 1;
    }
    static const int64_t one[] = {1}, h32[] = {32}, h8[] = {8}, d128[] = {128}, ctx8k[] = {8192}, zero[] = {0};
    static const int64_t pages_default[] = {0, 16};
    set_default(&o->hq, 1, h32);
    set_default(&o->hkv, 1, h8);
    set_default(&o->d, 1, d128);
    set_default(&o->b, 1, one);
    set_default(&o->cache_len, 1, ctx8k);
    set_default(&o->page_size, *shape_given ? 1 : 2, *shape_given ? zero : pages_default);
    if (o->warmups < 0) o->warmups = o->device == FA_DEVICE_CUDA ? 3 : 1;
    for (int i = 0; i < o->d.count; i++)
        if (o->latent && (o->dv ? o->dv : o->d.values[i]) > o->d.values[i])
            cli_usage_error(CMD, "--latent 1: v is the first dv columns of k, so --dv must not exceed -d");
    for (int i = 0; i < o->n_kv_dtypes; i++)
        if (o->kv_dtypes[i] != FA_KV_SAME && (o->latent || o->dv))
            cli_usage_error(CMD, "--latent and --dv take an unquantised cache (--kv-dtype same)");
}

/* ---- problem ---------------------------------------------------------------------------------- */

typedef struct decode_host {
    void *q, *o, *k, *v, *k_new, *v_new;
    float *lse, *k_scale, *v_scale;
    int32_t *seqlens, *block_table;
    size_t q_elems, o_elems, kv_elems, v_elems, new_elems, vnew_elems, table_elems;
    size_t kv_bytes, v_bytes, scale_elems; /* bytes of k, of v (0: a latent cache); floats of k_scale (and of v_scale) */
    int64_t num_pages, pages_per_seq, capacity;
} decode_host;

/* Fill a large buffer quickly: 1 Mi normal values, repeated. */
static void fill_repeated(void *buffer, fa_dtype dtype, size_t n, float offset, tool_rng *rng) {
    const size_t block = (size_t)1 << 20, es = cli_dtype_size(dtype);
    size_t first = n < block ? n : block;
    tool_fill_normal(buffer, dtype, first, 1.0f, offset, rng);
    for (size_t at = first; at < n; at += first) {
        size_t count = n - at < first ? n - at : first;
        memcpy((char *)buffer + at * es, buffer, count * es);
    }
}

static void free_host(decode_host *h) {
    free(h->q);
    free(h->o);
    free(h->k);
    free(h->v);
    free(h->k_new);
    free(h->v_new);
    free(h->lse);
    free(h->seqlens);
    free(h->block_table);
    free(h->k_scale);
    free(h->v_scale);
    memset(h, 0, sizeof *h);
}

/* Host tensors and params (host pointers) of one case; 0 when out of memory. */
static int make_host(const decode_case *c, uint64_t seed, decode_host *h, fa_params *p) {
    memset(h, 0, sizeof *h);
    const size_t es = cli_dtype_size(c->dtype);
    const int64_t appended = c->append ? c->sq : 0;
    h->capacity = c->cache_len + appended;
    int64_t slabs, slab_rows;
    if (c->page_size > 0) {
        h->pages_per_seq = (h->capacity + c->page_size - 1) / c->page_size;
        h->num_pages = c->b * h->pages_per_seq;
        slabs = h->num_pages;
        slab_rows = c->page_size;
        h->capacity = h->pages_per_seq * c->page_size;
    } else {
        slabs = c->b;
        slab_rows = h->capacity;
    }
    const int64_t dv = c->dv;
    h->q_elems = (size_t)(c->b * c->sq * c->hq * c->d);
    h->o_elems = (size_t)(c->b * c->sq * c->hq * dv);
    /* a quantised cache: row_units bytes per (slot, head) row instead of d elements */
    const int64_t row_units = c->kv_dtype == FA_KV_Q8_0 ? c->d / 32 * 34 : c->d;
    const size_t kv_es = c->kv_dtype != FA_KV_SAME ? 1 : es;
    h->kv_elems = (size_t)(slabs * slab_rows * c->hkv * row_units);
    h->kv_bytes = h->kv_elems * kv_es;
    /* v: [.., dv] (a latent cache has none: v is k) */
    h->v_elems = c->latent ? 0 : (size_t)(slabs * slab_rows * c->hkv * (c->kv_dtype == FA_KV_SAME ? dv : row_units));
    h->v_bytes = h->v_elems * kv_es;
    h->new_elems = c->append ? (size_t)(c->b * c->sq * c->hkv * c->d) : 0;
    h->vnew_elems = c->append && !c->latent ? (size_t)(c->b * c->sq * c->hkv * dv) : 0;
    h->table_elems = c->page_size > 0 ? (size_t)(c->b * h->pages_per_seq) : 0;
    h->q = tool_alloc_touched(h->q_elems * es);
    h->o = tool_alloc_touched(h->o_elems * es);
    h->k = malloc(h->kv_elems * kv_es);
    h->v = c->latent ? NULL : malloc(h->v_bytes);
    if (c->kv_dtype == FA_KV_INT8 || c->kv_dtype == FA_KV_FP8_E4M3) {
        size_t n = c->kv_dtype == FA_KV_INT8 ? (size_t)(slabs * slab_rows * c->hkv) : (size_t)c->hkv;
        h->scale_elems = n;
        h->k_scale = malloc(n * sizeof(float));
        h->v_scale = malloc(n * sizeof(float));
        for (size_t i = 0; h->k_scale && h->v_scale && i < n; i++) h->k_scale[i] = h->v_scale[i] = 1.0f / 64.0f;
    }
    h->lse = tool_alloc_touched((size_t)(c->b * c->hq * c->sq) * sizeof(float));
    h->seqlens = malloc((size_t)c->b * sizeof(int32_t));
    if (c->append) {
        h->k_new = tool_alloc_touched(h->new_elems * es);
        h->v_new = c->latent ? NULL : tool_alloc_touched(h->vnew_elems * es);
    }
    if (h->table_elems) h->block_table = malloc(h->table_elems * sizeof(int32_t));
    if (!h->q || !h->o || !h->k || (!c->latent && !h->v) || (c->kv_dtype == FA_KV_INT8 && (!h->k_scale || !h->v_scale)) ||
        (c->kv_dtype == FA_KV_FP8_E4M3 && (!h->k_scale || !h->v_scale)) || !h->lse || !h->seqlens || (c->append && (!h->k_new || (!c->latent && !h->v_new))) ||
        (h->table_elems && !h->block_table)) {
        free_host(h);
        return 0;
    }
    tool_rng rng = tool_rng_seeded(seed);
    tool_fill_normal(h->q, c->dtype, h->q_elems, 1.0f, 0.0f, &rng);
    if (c->kv_dtype != FA_KV_SAME) { /* small codes (and, for Q8_0, the block scales 1/64) */
        for (size_t i = 0; i < h->kv_elems; i++) {
            ((unsigned char *)h->k)[i] = (unsigned char)((i * 2654435761u >> 13) % 61);
            ((unsigned char *)h->v)[i] = (unsigned char)((i * 40503u >> 7) % 53);
        }
        if (c->kv_dtype == FA_KV_Q8_0)
            for (size_t i = 0; i < h->kv_elems; i += 34) {
                ((unsigned char *)h->k)[i] = ((unsigned char *)h->v)[i] = 0x00; /* f16 1/64 = 0x2400 */
                ((unsigned char *)h->k)[i + 1] = ((unsigned char *)h->v)[i + 1] = 0x24;
            }
    } else {
        fill_repeated(h->k, c->dtype, h->kv_elems, 0.0f, &rng);
        if (h->v) fill_repeated(h->v, c->dtype, h->v_elems, 0.5f, &rng);
    }
    if (c->append) {
        tool_fill_normal(h->k_new, c->dtype, h->new_elems, 1.0f, 0.0f, &rng);
        if (h->v_new) tool_fill_normal(h->v_new, c->dtype, h->vnew_elems, 1.0f, 0.5f, &rng);
    }
    for (int64_t b = 0; b < c->b; b++) h->seqlens[b] = (int32_t)c->cache_len;
    if (h->table_elems) { /* every page once, in a random order: a fragmented pool */
        uint64_t state = seed;
        for (size_t i = 0; i < h->table_elems; i++) h->block_table[i] = (int32_t)i;
        for (size_t i = h->table_elems - 1; i > 0; i--) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            size_t j = (size_t)(state >> 33) % (i + 1);
            int32_t t = h->block_table[i];
            h->block_table[i] = h->block_table[j];
            h->block_table[j] = t;
        }
    }
    memset(p, 0, sizeof *p);
    p->device = c->device;
    p->dtype = c->dtype;
    p->batch = c->b;
    p->seqlen_q = c->sq;
    p->seqlen_k = h->capacity;
    p->heads_q = c->hq;
    p->heads_kv = c->hkv;
    p->head_dim = c->d;
    p->head_dim_v = dv;
    fa_set_contiguous_strides(p); /* q, o; k / v as [b, capacity, hkv, d], fixed below if paged */
    p->k_batch_stride = slab_rows * c->hkv * row_units;
    p->k_row_stride = c->hkv * row_units;
    p->k_head_stride = row_units;
    const int64_t v_units = c->kv_dtype == FA_KV_SAME ? dv : row_units;
    p->v_batch_stride = c->latent ? p->k_batch_stride : slab_rows * c->hkv * v_units;
    p->v_row_stride = c->latent ? p->k_row_stride : c->hkv * v_units;
    p->v_head_stride = c->latent ? p->k_head_stride : v_units;
    p->kv_dtype = c->kv_dtype;
    p->k_scale = h->k_scale;
    p->v_scale = h->v_scale;
    if (c->kv_dtype == FA_KV_INT8) {
        p->k_scale_batch_stride = p->v_scale_batch_stride = slab_rows * c->hkv;
        p->k_scale_row_stride = p->v_scale_row_stride = c->hkv;
        p->k_scale_head_stride = p->v_scale_head_stride = 1;
    }
    p->knew_batch_stride = c->sq * c->hkv * c->d;
    p->knew_row_stride = c->hkv * c->d;
    p->knew_head_stride = c->d;
    p->vnew_batch_stride = c->latent ? p->knew_batch_stride : c->sq * c->hkv * dv;
    p->vnew_row_stride = c->latent ? p->knew_row_stride : c->hkv * dv;
    p->vnew_head_stride = c->latent ? p->knew_head_stride : dv;
    p->causal = c->causal;
    p->num_splits = c->splits;
    p->num_threads = c->threads;
    if (c->page_size > 0) {
        p->page_size = c->page_size;
        p->num_pages = h->num_pages;
        p->block_table_batch_stride = h->pages_per_seq;
    }
    p->q = h->q;
    p->o = h->o;
    p->k = h->k;
    p->v = c->latent ? h->k : h->v;
    p->lse = h->lse;
    p->cache_seqlens = h->seqlens;
    p->block_table = h->block_table;
    p->k_new = h->k_new;
    p->v_new = c->latent ? h->k_new : h->v_new;
    return 1;
}

static double kv_bytes_of(const decode_case *c) {
    double keys = (double)(c->cache_len + (c->append ? c->sq : 0));
    double row = (double)c->d * (double)cli_dtype_size(c->dtype);
    if (c->kv_dtype == FA_KV_INT8) row = (double)c->d + 4.0;
    else if (c->kv_dtype == FA_KV_Q8_0) row = (double)(c->d / 32 * 34);
    else if (c->kv_dtype == FA_KV_FP8_E4M3) row = (double)c->d;
    if (c->kv_dtype != FA_KV_SAME) return (double)c->b * keys * (double)c->hkv * 2.0 * row;
    /* k, and v unless it is k's first dv columns (a latent cache: each row read once) */
    const double v_row = c->latent ? 0.0 : (double)c->dv * (double)cli_dtype_size(c->dtype);
    return (double)c->b * keys * (double)c->hkv * (row + v_row);
}

/* Multiply-adds × 2 of one call: per query token i of sq, its visible keys (causal: the last
 * query sees every key, each earlier one one fewer) × heads_q × (d + dv). */
static double flops_of(const decode_case *c) {
    const double keys = (double)(c->cache_len + (c->append ? c->sq : 0));
    double seen = 0.0;
    for (int64_t i = 0; i < c->sq; i++) seen += c->causal ? keys - (double)(c->sq - 1 - i) : keys;
    return 2.0 * (double)c->b * (double)c->hq * seen * (double)(c->d + c->dv);
}

/* ---- CPU ---------------------------------------------------------------------------------------- */

/* One memcpy of CPU_COPY_BYTES split among `threads` threads; seconds. */
static char *copy_src, *copy_dst;
static double cpu_copy_once(int threads) { return bench_copy_seconds(copy_dst, copy_src, CPU_COPY_BYTES, threads); }

/* memcpy bandwidth with `threads` threads, (read + written) bytes per second, median of 5. */
static double cpu_copy_gbps(int threads) {
    if (!copy_src) {
        copy_src = tool_alloc_touched(CPU_COPY_BYTES);
        copy_dst = tool_alloc_touched(CPU_COPY_BYTES);
        if (!copy_src || !copy_dst) {
            free(copy_src);
            free(copy_dst);
            copy_src = copy_dst = NULL;
            return -1.0;
        }
    }
    double t[5];
    for (int rep = 0; rep < 5; rep++) t[rep] = cpu_copy_once(threads);
    return 2.0 * (double)CPU_COPY_BYTES / bench_median(t, 5) * 1e-9;
}

static void measure_cpu(const decode_options *o, const decode_case *c, decode_result *r) {
    decode_host h;
    fa_params p;
    if (!make_host(c, o->seed, &h, &p)) {
        snprintf(r->note, sizeof r->note, "out of host memory");
        return;
    }
    fa_status st = fa_check_kvcache(&p, NULL);
    for (int i = 0; st == FA_OK && i < o->warmups; i++) st = fa_kvcache_forward(&p);
    /* rounds of (one copy, CALLS_PER_COPY calls) until the repeats or the time budget are used */
    enum { CALLS_PER_COPY = 3 };
    double samples[BENCH_MAX_REPEATS], copies[BENCH_MAX_REPEATS], total = 0.0;
    int calls = 0, n_copies = 0, max_calls = o->repeats > 0 ? o->repeats : 60;
    while (st == FA_OK && calls < max_calls) {
        if (copy_src && calls % CALLS_PER_COPY == 0) copies[n_copies++] = cpu_copy_once(c->threads);
        double t0 = bench_now_seconds();
        st = fa_kvcache_forward(&p);
        samples[calls] = bench_now_seconds() - t0;
        total += samples[calls++];
        if (o->repeats == 0 && calls >= 3 * CALLS_PER_COPY && total > TIME_BUDGET_S) break;
    }
    if (n_copies) r->copy_gbps = 2.0 * (double)CPU_COPY_BYTES / bench_median(copies, n_copies) * 1e-9;
    if (st != FA_OK) {
        snprintf(r->note, sizeof r->note, "%s: %s", fa_strerror(st), fa_last_error());
    } else {
        r->ok = 1;
        r->ms = 1e3 * bench_median(samples, calls);
        r->calls = calls;
    }
    free_host(&h);
}

/* ---- CUDA --------------------------------------------------------------------------------------- */

typedef struct device_set {
    void *q, *o, *k, *v, *k_new, *v_new, *lse, *seqlens, *table, *k_scale, *v_scale;
} device_set;

static int cuda_ok(const cudart_api *rt, int err, const char *what, decode_result *r) {
    if (err == 0) return 1;
    if (!r->note[0]) snprintf(r->note, sizeof r->note, "%s: %s", what, rt->get_error_string(err));
    return 0;
}

static int upload(const cudart_api *rt, void **dst, const void *src, size_t bytes, decode_result *r) {
    if (!cuda_ok(rt, rt->malloc_(dst, bytes ? bytes : 1), "cudaMalloc", r)) return 0;
    if (!src) return cuda_ok(rt, rt->memset_(*dst, 0, bytes), "cudaMemset", r);
    return cuda_ok(rt, rt->memcpy_(*dst, src, bytes, CUDART_HOST_TO_DEVICE), "cudaMemcpy", r);
}

static void free_sets(const cudart_api *rt, device_set *sets, int n) {
    for (int s = 0; s < n; s++) {
        void *ptrs[] = {sets[s].q, sets[s].o, sets[s].k, sets[s].v, sets[s].k_new, sets[s].v_new,
                        sets[s].lse, sets[s].seqlens, sets[s].table, sets[s].k_scale, sets[s].v_scale};
        for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
            if (ptrs[i]) rt->free_(ptrs[i]);
    }
}

/* Device-to-device copy bandwidth, (read + written) bytes per second, best of 5. */
static double cuda_copy_gbps(const cudart_api *rt) {
    void *a = NULL, *b = NULL, *start = NULL, *end = NULL;
    double gbps = -1.0;
    if (rt->malloc_(&a, CUDA_COPY_BYTES) == 0 && rt->malloc_(&b, CUDA_COPY_BYTES) == 0 &&
        rt->event_create(&start) == 0 && rt->event_create(&end) == 0) {
        rt->memset_(a, 1, CUDA_COPY_BYTES);
        float best = 1e30f;
        for (int rep = 0; rep < 6; rep++) {
            float ms = 0.0f;
            rt->event_record(start, NULL);
            rt->memcpy_(b, a, CUDA_COPY_BYTES, 3 /* cudaMemcpyDeviceToDevice */);
            rt->event_record(end, NULL);
            rt->event_synchronize(end);
            rt->event_elapsed_time(&ms, start, end);
            if (rep > 0 && ms < best) best = ms;
        }
        gbps = 2.0 * (double)CUDA_COPY_BYTES / (best * 1e-3) * 1e-9;
    }
    if (a) rt->free_(a);
    if (b) rt->free_(b);
    if (start) rt->event_destroy(start);
    if (end) rt->event_destroy(end);
    return gbps;
}

static void measure_cuda(const decode_options *o, const decode_case *c, decode_result *r) {
    char why[200];
    const cudart_api *rt = cudart_load(why, sizeof why);
    if (!rt) {
        snprintf(r->note, sizeof r->note, "%s", why);
        return;
    }
    decode_host h;
    fa_params host_p;
    if (!make_host(c, o->seed, &h, &host_p)) {
        snprintf(r->note, sizeof r->note, "out of host memory");
        return;
    }
    const size_t es = cli_dtype_size(c->dtype);
    int l2 = 0, device = 0;
    rt->get_device(&device);
    rt->device_get_attribute(&l2, CUDART_ATTR_L2_BYTES, device);
    double set_bytes = (double)h.kv_bytes + (double)h.v_bytes;
    int n_sets = set_bytes >= 2.0 * l2 ? 1 : (int)(2.0 * l2 / set_bytes) + 1;
    if (n_sets > MAX_SETS) n_sets = MAX_SETS;
    device_set sets[MAX_SETS];
    memset(sets, 0, sizeof sets);
    void *workspace = NULL, *events[2 * BENCH_MAX_REPEATS] = {0};
    int ok = 1, created = 0;
    for (int s = 0; s < n_sets && ok; s++) {
        device_set *d = &sets[s];
        ok = upload(rt, &d->q, h.q, h.q_elems * es, r) && upload(rt, &d->o, NULL, h.o_elems * es, r) &&
             upload(rt, &d->k, h.k, h.kv_bytes, r) && (c->latent || upload(rt, &d->v, h.v, h.v_bytes, r)) &&
             (!h.scale_elems || (upload(rt, &d->k_scale, h.k_scale, h.scale_elems * 4, r) &&
                                 upload(rt, &d->v_scale, h.v_scale, h.scale_elems * 4, r))) &&
             upload(rt, &d->lse, NULL, (size_t)(c->b * c->hq * c->sq) * 4, r) &&
             upload(rt, &d->seqlens, h.seqlens, (size_t)c->b * 4, r) &&
             (!c->append || (upload(rt, &d->k_new, h.k_new, h.new_elems * es, r) &&
                             (c->latent || upload(rt, &d->v_new, h.v_new, h.vnew_elems * es, r)))) &&
             (!h.table_elems || upload(rt, &d->table, h.block_table, h.table_elems * 4, r));
    }
    fa_params p = host_p;
    p.device = FA_DEVICE_CUDA;
    size_t ws = 0;
    if (ok) {
        p.q = sets[0].q, p.o = sets[0].o, p.k = sets[0].k, p.v = c->latent ? sets[0].k : sets[0].v;
        p.lse = sets[0].lse;
        p.cache_seqlens = sets[0].seqlens, p.block_table = sets[0].table;
        p.k_new = sets[0].k_new, p.v_new = c->latent ? sets[0].k_new : sets[0].v_new;
        p.k_scale = (float *)sets[0].k_scale, p.v_scale = (float *)sets[0].v_scale;
        fa_status st = fa_check_kvcache(&p, &ws);
        if (st != FA_OK) {
            snprintf(r->note, sizeof r->note, "%s: %s", fa_strerror(st), fa_last_error());
            ok = 0;
        } else if (ws) {
            ok = cuda_ok(rt, rt->malloc_(&workspace, ws), "cudaMalloc(workspace)", r);
            p.workspace = workspace;
            p.workspace_bytes = ws;
        }
    }
    int warmups = o->warmups > 0 ? o->warmups : 1, calls = o->repeats > 0 ? o->repeats : 50;
    int total_calls = warmups + calls;
    while (ok && created < 2 * total_calls) ok = cuda_ok(rt, rt->event_create(&events[created++]), "cudaEventCreate", r);
    for (int i = 0; ok && i < total_calls; i++) {
        const device_set *d = &sets[i % n_sets];
        p.q = d->q, p.o = d->o, p.k = d->k, p.v = c->latent ? d->k : d->v, p.lse = d->lse;
        p.cache_seqlens = d->seqlens, p.block_table = d->table, p.k_new = d->k_new;
        p.v_new = c->latent ? d->k_new : d->v_new;
        p.k_scale = (float *)d->k_scale, p.v_scale = (float *)d->v_scale;
        ok = cuda_ok(rt, rt->event_record(events[2 * i], NULL), "cudaEventRecord", r);
        fa_status st = ok ? fa_kvcache_forward(&p) : FA_OK;
        if (st != FA_OK) {
            snprintf(r->note, sizeof r->note, "%s: %s", fa_strerror(st), fa_last_error());
            ok = 0;
        }
        ok = ok && cuda_ok(rt, rt->event_record(events[2 * i + 1], NULL), "cudaEventRecord", r);
    }
    if (ok) ok = cuda_ok(rt, rt->event_synchronize(events[2 * total_calls - 1]), "kernel", r);
    if (ok) {
        double samples[BENCH_MAX_REPEATS];
        for (int i = 0; i < calls && ok; i++) {
            float ms = 0.0f;
            ok = cuda_ok(rt, rt->event_elapsed_time(&ms, events[2 * (warmups + i)], events[2 * (warmups + i) + 1]),
                         "cudaEventElapsedTime", r);
            samples[i] = ms;
        }
        if (ok) {
            r->ok = 1;
            r->ms = bench_median(samples, calls);
            r->calls = calls;
        }
    }
    for (int i = 0; i < created; i++) rt->event_destroy(events[i]);
    if (workspace) rt->free_(workspace);
    free_sets(rt, sets, n_sets);
    free_host(&h);
}

/* ---- report ------------------------------------------------------------------------------------- */

static const char *kv_dtype_label(fa_kv_dtype t) {
    static const char *const names[4] = {"same", "int8", "q8_0", "fp8"};
    return (int)t >= 0 && (int)t < 4 ? names[t] : "?";
}

static void report(const decode_options *o, const decode_case *c, const decode_result *r, double copy_gbps) {
    if (r->copy_gbps > 0) copy_gbps = r->copy_gbps;
    double tokens_per_s = r->ok ? (double)(c->b * c->sq) / (r->ms * 1e-3) : -1.0;
    double gbps = r->ok ? r->kv_bytes / (r->ms * 1e-3) * 1e-9 : -1.0;
    if (o->json) {
        printf("{\"impl\":\"flashattn\",\"device\":\"%s\",\"dtype\":\"%s\",\"mode\":\"decode\",\"b\":%lld,"
               "\"sq\":%lld,\"hq\":%lld,\"hkv\":%lld,\"d\":%lld,\"cache_len\":%lld,\"page_size\":%lld,"
               "\"splits\":%d,\"append\":%d,\"causal\":%d,\"threads\":%d,\"kv_dtype\":\"%s\",\"dv\":%lld,"
               "\"latent\":%d,\"status\":\"%s\"",
               cli_device_name(c->device), cli_dtype_name(c->dtype), (long long)c->b, (long long)c->sq,
               (long long)c->hq, (long long)c->hkv, (long long)c->d, (long long)c->cache_len,
               (long long)c->page_size, c->splits, c->append, c->causal, c->threads, kv_dtype_label(c->kv_dtype),
               (long long)c->dv, c->latent, r->ok ? "ok" : "failed");
        if (r->ok)
            printf(",\"ms\":%.6g,\"timed_calls\":%d,\"kv_bytes\":%.0f,\"GBps\":%.6g,\"tokens_per_s\":%.6g,"
                   "\"flops\":%.6g,\"TFLOPs\":%.6g",
                   r->ms, r->calls, r->kv_bytes, gbps, tokens_per_s, flops_of(c), flops_of(c) / (r->ms * 1e-3) * 1e-12);
        else
            printf(",\"ms\":null,\"kv_bytes\":%.0f,\"GBps\":null", r->kv_bytes);
        if (copy_gbps > 0) printf(",\"copy_GBps\":%.6g", copy_gbps);
        else printf(",\"copy_GBps\":null");
        if (r->note[0]) {
            printf(",\"note\":\"");
            for (const char *s = r->note; *s; s++) printf(*s == '"' || *s == '\\' ? "\\%c" : "%c", *s);
            printf("\"");
        }
        printf("}\n");
    } else {
        char kv[32];
        printf("%-4s %-4s %4lld %3lld %4lld %4lld %4lld %7lld %5lld %6d", cli_dtype_name(c->dtype),
               c->kv_dtype == FA_KV_SAME ? cli_dtype_name(c->dtype) : kv_dtype_label(c->kv_dtype), (long long)c->b,
               (long long)c->sq, (long long)c->hq, (long long)c->hkv, (long long)c->d, (long long)c->cache_len,
               (long long)c->page_size, c->splits);
        if (r->ok)
            printf(" %10.3f %9.1f %10s %9.1f %9.1f %6.0f%% %8.1f\n", r->ms, tokens_per_s,
                   cli_format_bytes(r->kv_bytes, kv, sizeof kv), gbps, copy_gbps,
                   copy_gbps > 0 ? 100.0 * gbps / copy_gbps : 0.0, flops_of(c) / (r->ms * 1e-3) * 1e-12);
        else
            printf("  failed: %s\n", r->note);
    }
    fflush(stdout);
}

int bench_decode_main(int argc, char **argv) {
    decode_options o;
    int shape_given;
    parse_options(argc, argv, &o, &shape_given);
    if (o.device == FA_DEVICE_CUDA && !fa_cuda_available()) {
        fprintf(stderr, "flashattn bench: CUDA is not available in this build or machine\n");
        return 1;
    }
    /* the default sweep: the decode shapes of the issue (batch × context) */
    static const int64_t default_pairs[][2] = {{1, 8192}, {32, 8192}, {8, 65536}, {128, 2048}};
    int n_pairs = shape_given ? o.b.count * o.cache_len.count : 4;
    int threads = o.threads ? o.threads : cli_cpu_count();
    double copy_gbps;
    if (o.device == FA_DEVICE_CUDA) {
        char why[200];
        const cudart_api *rt = cudart_load(why, sizeof why);
        copy_gbps = rt ? cuda_copy_gbps(rt) : -1.0;
    } else {
        copy_gbps = cpu_copy_gbps(threads);
    }
    if (!o.json) {
        printf("flashattn %s decode bench on %s", fa_version(), cli_device_name(o.device));
        if (o.device == FA_DEVICE_CPU) printf(" (%s, %d thread%s)", fa_cpu_isa(), threads, threads == 1 ? "" : "s");
        printf("; GB/s = K+V bytes read / median time; copy GB/s = (read + written) / time of a large %s\n",
               o.device == FA_DEVICE_CUDA ? "device-to-device cudaMemcpy"
                                          : "multithreaded memcpy (median of copies interleaved with the calls)");
        printf("%-4s %-4s %4s %3s %4s %4s %4s %7s %5s %6s %10s %9s %10s %9s %9s %7s %8s\n", "type", "kv", "b", "sq", "hq",
               "hkv", "d", "ctx", "page", "splits", "ms", "tok/s", "kv bytes", "GB/s", "copy GB/s", "of copy", "TFLOP/s");
    }
    int failures = 0;
    for (int t = 0; t < o.n_dtypes; t++)
      for (int kd = 0; kd < o.n_kv_dtypes; kd++)
        for (int pair = 0; pair < n_pairs; pair++)
            for (int hi = 0; hi < o.hq.count; hi++)
                for (int ki = 0; ki < o.hkv.count; ki++)
                    for (int di = 0; di < o.d.count; di++)
                        for (int pi = 0; pi < o.page_size.count; pi++) {
                            decode_case c;
                            memset(&c, 0, sizeof c);
                            c.device = o.device;
                            c.dtype = o.dtypes[t];
                            c.kv_dtype = o.kv_dtypes[kd];
                            c.b = shape_given ? o.b.values[pair / o.cache_len.count] : default_pairs[pair][0];
                            c.cache_len = shape_given ? o.cache_len.values[pair % o.cache_len.count]
                                                      : default_pairs[pair][1];
                            c.sq = o.sq;
                            c.hq = o.hq.values[hi];
                            c.hkv = o.hkv.values[ki];
                            c.d = o.d.values[di];
                            c.dv = o.dv ? o.dv : c.d;
                            c.latent = o.latent;
                            c.page_size = o.page_size.values[pi];
                            c.splits = o.splits;
                            c.append = o.append;
                            c.causal = o.causal;
                            c.threads = o.device == FA_DEVICE_CPU ? threads : 0;
                            decode_result r;
                            memset(&r, 0, sizeof r);
                            r.kv_bytes = kv_bytes_of(&c);
                            if (c.device == FA_DEVICE_CUDA) measure_cuda(&o, &c, &r);
                            else measure_cpu(&o, &c, &r);
                            report(&o, &c, &r, copy_gbps);
                            failures += !r.ok;
                        }
    return failures ? 1 : 0;
}
