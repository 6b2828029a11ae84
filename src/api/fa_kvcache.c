/*
 * fa_kvcache.c: the public KV-cache entry points (fa_kvcache_forward, fa_check_kvcache) and the
 * merge of partial attention states (fa_merge_states). Validation follows fa_api.c: everything
 * is checked before anything is written, the first failure is reported with the field and value,
 * and the engines receive a resolved fa_problem (or the validated fa_merge_params).
 *
 * fa_kvcache_forward, validation order:
 *   1. params pointer, then what every call shares (fa_validate_common: device, dtype, threads,
 *      sizes, heads, scalars, window folded with causal); seqlen_q >= 1, no cu_seqlens,
 *      num_splits >= 0
 *   2. tensor pointers: q, k, v, o; k_new and v_new together and only with cache_seqlens;
 *      seqlen_new (0 = seqlen_q) only with k_new; rotary
 *      tables together, only with k_new (as flash_attn), rotary_dim even in [2, head_dim],
 *      rotary_seqlen >= seqlen_k (every appended slot; on the CPU also every query position,
 *      cache_seqlens[b] + seqlen_q - 1 when causal or windowed, step 5)
 *   3. cache geometry: paged (block_table: page_size >= 1, num_pages >= 1, the table's row
 *      stride covers ceil(seqlen_k / page_size) pages, no cache_batch_idx) or contiguous
 *      (cache_batch defaulted to batch, >= batch without cache_batch_idx; page fields zero)
 *   4. strides of q, o, the caches (outputs when appending), k_new, v_new; sizes of the tables
 *   5. on the CPU only (the arrays are host memory there), their contents: cache_seqlens >= 0 and
 *      within the capacity (with the new tokens), leftpad in [0, cache_seqlens], cache_batch_idx
 *      in [0, cache_batch), every block_table entry a call reads in [0, num_pages). On CUDA
 *      they are device memory and the kernels clamp.
 *   6. the engine's own limits (fa_cuda_check_kvcache), then the caller's workspace size
 */
#include <math.h>
#include <string.h>

#include "api/fa_internal.h"
#include "api/fa_validate.h"

/* ---- fa_kvcache_forward ------------------------------------------------------------------- */

static fa_tensor_view view_of(const char *name, int is_output, int64_t n0, int64_t n1, int64_t n2,
                              int64_t dim, int64_t s0, int64_t s1, int64_t s2) {
    fa_tensor_view t;
    memset(&t, 0, sizeof t);
    t.name = name;
    t.is_output = is_output;
    t.extent[0] = n0;
    t.extent[1] = n1;
    t.extent[2] = n2;
    t.stride[0] = s0;
    t.stride[1] = s1;
    t.stride[2] = s2;
    t.dim = dim;
    return t;
}

/* view_of with the pointer, the element size and the pointer field's name */
static fa_tensor_view tensor_of(fa_tensor_view t, const void *ptr, int64_t elem_bytes, const char *field) {
    t.ptr = ptr;
    t.elem_bytes = elem_bytes;
    t.field = field;
    return t;
}

/* Pointers and the rotary fields (step 2). */
static fa_status check_pointers(fa_params *p) {
    FA_REQUIRE_PTR(p->q, "q");
    FA_REQUIRE_PTR(p->k, "k (the key cache)");
    FA_REQUIRE_PTR(p->v, "v (the value cache)");
    FA_REQUIRE_PTR(p->o, "o");
    if ((p->k_new == NULL) != (p->v_new == NULL))
        return fa_set_error(FA_ERR_NULL_POINTER,
                            "%s is set but %s is NULL: give both new keys and new values to "
                            "append, or neither",
                            p->k_new ? "k_new" : "v_new", p->k_new ? "v_new" : "k_new");
    if (p->k_new != NULL && p->cache_seqlens == NULL)
        return fa_set_error(FA_ERR_NULL_POINTER,
                            "k_new / v_new are set but cache_seqlens is NULL: appending needs "
                            "cache_seqlens (where the new tokens go)");
    if ((p->rotary_cos == NULL) != (p->rotary_sin == NULL))
        return fa_set_error(FA_ERR_NULL_POINTER, "%s is set but %s is NULL: give both tables or neither",
                            p->rotary_cos ? "rotary_cos" : "rotary_sin",
                            p->rotary_cos ? "rotary_sin" : "rotary_cos");
    if (p->rotary_cos == NULL) {
        /* no tables: rotary_dim, rotary_seqlen and rotary_interleaved are unused and ignored */
        p->rotary_dim = 0;
        p->rotary_seqlen = 0;
        p->rotary_interleaved = 0;
    } else {
        if (p->k_new == NULL)
            return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                                "rotary_cos / rotary_sin are set but k_new is NULL: rotary "
                                "embedding applies to q and the appended keys (as flash_attn), so "
                                "it needs k_new / v_new");
        if (p->rotary_dim < 2 || p->rotary_dim > p->head_dim || p->rotary_dim % 2 != 0)
            return fa_set_error(FA_ERR_INVALID_SIZE,
                                "rotary_dim = %lld must be even and in [2, head_dim = %lld]",
                                (long long)p->rotary_dim, (long long)p->head_dim);
        /* every appended key's slot; a query's position (L0 + i when fewer tokens are appended
         * than there are queries) is checked against the tables per sequence (check_host_arrays) */
        if (p->rotary_seqlen < p->seqlen_k || p->rotary_seqlen > FA_MAX_EXTENT)
            return fa_set_error(FA_ERR_INVALID_SIZE,
                                "rotary_seqlen = %lld: the cos/sin tables need at least seqlen_k = "
                                "%lld rows (the cache capacity)",
                                (long long)p->rotary_seqlen, (long long)p->seqlen_k);
    }
    return FA_OK;
}

/* seqlen_new (step 2): tokens of k_new / v_new, defaulted to seqlen_q when appending; 0 when
 * not appending. */
static fa_status check_seqlen_new(fa_params *p) {
    if (p->k_new == NULL) {
        if (p->seqlen_new != 0)
            return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                                "seqlen_new = %lld is set but k_new / v_new are NULL (it counts the "
                                "appended tokens; 0 without an append)",
                                (long long)p->seqlen_new);
        return FA_OK;
    }
    if (p->seqlen_new == 0) p->seqlen_new = p->seqlen_q;
    /* the new tokens must fit the cache (cache_seqlens[b] + seqlen_new <= seqlen_k, step 5) */
    if (p->seqlen_new < 1 || p->seqlen_new > p->seqlen_k)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "seqlen_new = %lld is out of range [1, seqlen_k = %lld] (0 = seqlen_q: "
                            "one new key per query; the new tokens must fit the cache)",
                            (long long)p->seqlen_new, (long long)p->seqlen_k);
    return FA_OK;
}

/* Cache geometry (step 3): paged or contiguous. */
static fa_status check_cache_geometry(fa_params *p) {
    if (p->block_table != NULL) {
        if (p->page_size < 1 || p->page_size > FA_MAX_EXTENT)
            return fa_set_error(FA_ERR_INVALID_SIZE,
                                "page_size = %lld: a paged cache (block_table set) needs pages of "
                                "at least 1 token",
                                (long long)p->page_size);
        FA_REQUIRE_RANGE(p->num_pages, 1, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "num_pages");
        int64_t pages_per_sequence = (p->seqlen_k + p->page_size - 1) / p->page_size;
        if (p->block_table_batch_stride < pages_per_sequence)
            return fa_set_error(FA_ERR_STRIDE,
                                "block_table_batch_stride = %lld is less than the pages per "
                                "sequence ceil(seqlen_k / page_size) = %lld",
                                (long long)p->block_table_batch_stride, (long long)pages_per_sequence);
        if (p->cache_batch_idx != NULL)
            return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                                "cache_batch_idx is set with a paged cache (block_table): the "
                                "block table already says where each sequence lives");
        return FA_OK;
    }
    if (p->page_size != 0 || p->num_pages != 0)
        return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                            "page_size = %lld / num_pages = %lld are set but block_table is NULL "
                            "(set block_table for a paged cache, or zero them)",
                            (long long)p->page_size, (long long)p->num_pages);
    if (p->cache_batch == 0) p->cache_batch = p->batch;
    FA_REQUIRE_RANGE(p->cache_batch, 1, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "cache_batch");
    if (p->cache_batch_idx == NULL && p->cache_batch < p->batch)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "cache_batch = %lld is less than batch = %lld and cache_batch_idx is "
                            "NULL (sequence b uses cache row b)",
                            (long long)p->cache_batch, (long long)p->batch);
    return FA_OK;
}

/* A latent cache (DeepSeek-style MLA): v is the first head_dim_v columns of k, the same pointer
 * and strides (dv <= d); appending then writes k_new, whose first dv columns are v_new (the same
 * pointer and strides), and the engines write those values once or twice, identically. */
int fa_kv_latent_cache(const fa_params *p) {
    return p->kv_dtype == FA_KV_SAME && p->v == p->k && p->head_dim_v <= p->head_dim &&
           p->v_batch_stride == p->k_batch_stride && p->v_row_stride == p->k_row_stride &&
           p->v_head_stride == p->k_head_stride;
}

/* A latent cache's appends and rotary (step 4). */
static fa_status check_latent_cache(const fa_params *p) {
    if (!fa_kv_latent_cache(p) || p->k_new == NULL) return FA_OK;
    if (p->v_new != p->k_new || p->vnew_batch_stride != p->knew_batch_stride ||
        p->vnew_row_stride != p->knew_row_stride || p->vnew_head_stride != p->knew_head_stride)
        return fa_set_error(FA_ERR_OVERLAP,
                            "v is the first head_dim_v columns of k (a latent cache): v_new must likewise be "
                            "k_new with k_new's strides, or the two appends would write different values "
                            "to the same memory");
    if (p->rotary_cos != NULL)
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "rotary_cos is set with a latent cache (v is k's first head_dim_v columns): rotating "
                            "the appended keys would rotate the values too; apply the rotary part before the call");
    return FA_OK;
}

/* Strides, byte spans and alignment of every array the call touches (step 4); outputs (o, lse,
 * and the caches when appending) must not share memory with anything else. */
static fa_status check_strides(fa_params *p) {
    const int64_t b = p->batch, sq = p->seqlen_q, hq = p->heads_q, hkv = p->heads_kv;
    const int64_t d = p->head_dim, dv = p->head_dim_v;
    const int paged = p->block_table != NULL, append = p->k_new != NULL;
    const int64_t slabs = paged ? p->num_pages : p->cache_batch; /* pages or cache rows      */
    const int64_t slab_rows = paged ? p->page_size : p->seqlen_k;
    const int64_t e = fa_dtype_bytes(p->dtype);
    int64_t elements;
    if (!fa_mul_add_ok(b * hq, sq, 0, &elements))
        return fa_set_error(FA_ERR_OVERFLOW, "batch × heads_q × seqlen_q overflows");
    const int64_t lse_elems = elements;
    if (paged && !fa_mul_add_ok(b, p->block_table_batch_stride, 0, &elements))
        return fa_set_error(FA_ERR_OVERFLOW, "batch × block_table_batch_stride overflows");
    if (p->rotary_cos && !fa_mul_add_ok(p->rotary_seqlen, p->rotary_dim / 2, 0, &elements))
        return fa_set_error(FA_ERR_OVERFLOW, "rotary_seqlen × rotary_dim / 2 overflows");
    fa_tensor_view views[16];
    int n = 0;
    views[n++] = tensor_of(view_of("q", 0, b, sq, hq, d, p->q_batch_stride, p->q_row_stride, p->q_head_stride),
                           p->q, e, "q");
    views[n++] = tensor_of(view_of("o", 1, b, sq, hq, dv, p->o_batch_stride, p->o_row_stride, p->o_head_stride),
                           p->o, e, "o");
    views[n++] = fa_array_view("lse", 1, p->lse, lse_elems, 4);
    /* a quantised cache's byte strides and blocks: fa_validate_kv_quant */
    const int same_kv = p->kv_dtype == FA_KV_SAME;
    /* a latent cache (MLA): v is k's first dv columns, inside k's views, so only k is checked */
    const int latent = fa_kv_latent_cache(p);
    if (same_kv) {
        views[n++] = tensor_of(view_of("k", append, slabs, slab_rows, hkv, d, p->k_batch_stride, p->k_row_stride,
                                       p->k_head_stride),
                               p->k, e, "k (the key cache)");
        if (!latent)
            views[n++] = tensor_of(view_of("v", append, slabs, slab_rows, hkv, dv, p->v_batch_stride,
                                           p->v_row_stride, p->v_head_stride),
                                   p->v, e, "v (the value cache)");
    }
    if (append) {
        views[n++] = tensor_of(view_of("knew", 0, b, p->seqlen_new, hkv, d, p->knew_batch_stride,
                                       p->knew_row_stride, p->knew_head_stride),
                               p->k_new, e, "k_new");
        if (!latent)
            views[n++] = tensor_of(view_of("vnew", 0, b, p->seqlen_new, hkv, dv, p->vnew_batch_stride,
                                           p->vnew_row_stride, p->vnew_head_stride),
                                   p->v_new, e, "v_new");
    }
    fa_tensor_view alibi = fa_array_view("alibi_slopes", 0, p->alibi_slopes, hq, 4);
    alibi.extent[0] = b;
    alibi.stride[0] = p->alibi_batch_stride;
    views[n++] = alibi;
    views[n++] = fa_array_view("sink_logits", 0, p->sink_logits, hq, 4);
    views[n++] = fa_array_view("cache_seqlens", 0, p->cache_seqlens, b, 4);
    views[n++] = fa_array_view("cache_batch_idx", 0, p->cache_batch_idx, b, 4);
    views[n++] = fa_array_view("cache_leftpad", 0, p->cache_leftpad, b, 4);
    if (paged) {
        fa_tensor_view table = fa_array_view("block_table", 0, p->block_table,
                                             (p->seqlen_k + p->page_size - 1) / p->page_size, 4);
        table.extent[0] = b;
        table.stride[0] = p->block_table_batch_stride;
        views[n++] = table;
    }
    if (p->rotary_cos) {
        views[n++] = fa_array_view("rotary_cos", 0, p->rotary_cos, p->rotary_seqlen * (p->rotary_dim / 2), e);
        views[n++] = fa_array_view("rotary_sin", 0, p->rotary_sin, p->rotary_seqlen * (p->rotary_dim / 2), e);
    }
    fa_status s = fa_check_views(views, n);
    if (s != FA_OK || p->device != FA_DEVICE_CPU) return s;
    fa_zero_unused_strides(b, &p->q_batch_stride, sq, &p->q_row_stride, hq, &p->q_head_stride);
    fa_zero_unused_strides(b, &p->o_batch_stride, sq, &p->o_row_stride, hq, &p->o_head_stride);
    if (same_kv) {
        fa_zero_unused_strides(slabs, &p->k_batch_stride, slab_rows, &p->k_row_stride, hkv, &p->k_head_stride);
        fa_zero_unused_strides(slabs, &p->v_batch_stride, slab_rows, &p->v_row_stride, hkv, &p->v_head_stride);
    }
    fa_zero_unused_strides(b, &p->knew_batch_stride, p->seqlen_new, &p->knew_row_stride, hkv, &p->knew_head_stride);
    fa_zero_unused_strides(b, &p->vnew_batch_stride, p->seqlen_new, &p->vnew_row_stride, hkv, &p->vnew_head_stride);
    if (b <= 1) p->alibi_batch_stride = 0;
    return FA_OK;
}

/* Host-memory contents of the int32 arrays (step 5, CPU only). */
static fa_status check_host_arrays(const fa_params *p) {
    const int64_t append = p->k_new != NULL ? p->seqlen_new : 0;
    for (int64_t b = 0; b < p->batch; ++b) {
        int64_t cached = p->cache_seqlens ? p->cache_seqlens[b] : p->seqlen_k;
        if (cached < 0)
            return fa_set_error(FA_ERR_INVALID_SIZE, "cache_seqlens[%lld] = %lld is negative",
                                (long long)b, (long long)cached);
        if (cached + append > p->seqlen_k)
            return fa_set_error(FA_ERR_INVALID_SIZE,
                                "cache_seqlens[%lld] = %lld%s exceeds the cache capacity seqlen_k = "
                                "%lld",
                                (long long)b, (long long)cached,
                                append ? " plus the seqlen_new new tokens" : "", (long long)p->seqlen_k);
        /* query i rotates at L0 + i (causal / windowed): past the tables only when fewer tokens
         * are appended than there are queries */
        const int per_query = p->causal || p->window_left >= 0 || p->window_right >= 0;
        if (p->rotary_cos && per_query && cached + p->seqlen_q > p->rotary_seqlen)
            return fa_set_error(FA_ERR_INVALID_SIZE,
                                "rotary_seqlen = %lld: query %lld of sequence %lld rotates at "
                                "cache_seqlens[%lld] + %lld = %lld, past the cos/sin tables",
                                (long long)p->rotary_seqlen, (long long)(p->seqlen_q - 1), (long long)b,
                                (long long)b, (long long)(p->seqlen_q - 1),
                                (long long)(cached + p->seqlen_q - 1));
        int64_t pad = p->cache_leftpad ? p->cache_leftpad[b] : 0;
        if (pad < 0 || pad > cached)
            return fa_set_error(FA_ERR_INVALID_SIZE,
                                "cache_leftpad[%lld] = %lld is out of range [0, cache_seqlens[%lld] "
                                "= %lld]",
                                (long long)b, (long long)pad, (long long)b, (long long)cached);
        if (p->cache_batch_idx) {
            int64_t row = p->cache_batch_idx[b];
            if (row < 0 || row >= p->cache_batch)
                return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                                    "cache_batch_idx[%lld] = %lld is out of range [0, cache_batch = "
                                    "%lld)",
                                    (long long)b, (long long)row, (long long)p->cache_batch);
        }
        if (p->block_table) {
            int64_t end = cached + append; /* slots [pad, end) are read or written           */
            for (int64_t page = pad / p->page_size; pad < end && page * p->page_size < end; ++page) {
                int64_t id = p->block_table[b * p->block_table_batch_stride + page];
                if (id < 0 || id >= p->num_pages)
                    return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                                        "block_table[%lld][%lld] = %lld is out of range [0, "
                                        "num_pages = %lld)",
                                        (long long)b, (long long)page, (long long)id,
                                        (long long)p->num_pages);
            }
        }
    }
    return FA_OK;
}

static fa_status validate_kvcache(const fa_params *in, fa_problem *pb) {
    if (in == NULL) return fa_set_error(FA_ERR_NULL_POINTER, "params is NULL");
    memset(pb, 0, sizeof *pb);
    pb->p = *in;
    fa_params *p = &pb->p;

    /* 1. */
    fa_status s = fa_validate_common(pb);
    if (s != FA_OK) return s;
    if (p->dtype == FA_DTYPE_FP8_E4M3)
        return fa_set_error(FA_ERR_DTYPE, "dtype = FA_DTYPE_FP8_E4M3: fa_kvcache_forward takes f32 / f16 / "
                                          "bf16 queries (an fp8 cache: kv_dtype = FA_KV_FP8_E4M3)");
    if ((s = fa_validate_dropout(pb, "fa_kvcache_forward")) != FA_OK) return s;
    if (p->seqlen_q < 1)
        return fa_set_error(FA_ERR_INVALID_SIZE,
                            "seqlen_q = %lld: fa_kvcache_forward needs at least one query token "
                            "per sequence",
                            (long long)p->seqlen_q);
    if (p->cu_seqlens_q != NULL || p->cu_seqlens_k != NULL)
        return fa_set_error(FA_ERR_UNSUPPORTED,
                            "cu_seqlens_q / cu_seqlens_k are set: fa_kvcache_forward takes a fixed "
                            "seqlen_q per sequence and the cache lengths in cache_seqlens");
    if (p->num_splits < 0)
        return fa_set_error(FA_ERR_INVALID_ARGUMENT,
                            "num_splits = %d is negative (0 = heuristic, 1 = no split, n = at most n)",
                            p->num_splits);
    pb->varlen = 0;
    p->total_q = p->batch * p->seqlen_q;
    p->total_k = p->batch * p->seqlen_k;

    /* 2.-4. */
    if ((s = check_pointers(p)) != FA_OK) return s;
    if ((s = check_seqlen_new(p)) != FA_OK) return s;
    if ((s = check_cache_geometry(p)) != FA_OK) return s;
    /* a quantised cache's fields and its byte-strided k / v first; check_strides then skips them */
    if ((s = fa_validate_kv_quant(p)) != FA_OK) return s; /* kv_dtype, k_scale / v_scale */
    if ((s = check_latent_cache(p)) != FA_OK) return s;
    if ((s = check_strides(p)) != FA_OK) return s;
    /* the score bias over (query, cache slot); block masks and document ids are rejected */
    if ((s = fa_validate_score_mods(pb, NULL, 0, 1)) != FA_OK) return s;
    if (pb->has_mods) {
        fa_tensor_view mods[FA_SCORE_MOD_VIEWS];
        if ((s = fa_check_views(mods, fa_score_mod_views(pb, 0, mods))) != FA_OK) return s;
    }

    /* 5. */
    if (p->device == FA_DEVICE_CPU && (s = check_host_arrays(p)) != FA_OK) return s;
    return FA_OK;
}

static fa_status prepare_kvcache(const fa_params *in, fa_problem *pb, size_t *ws_out) {
    fa_status s = validate_kvcache(in, pb);
    if (s != FA_OK) return s;
    size_t ws = 0;
    if (pb->p.device == FA_DEVICE_CUDA) {
        s = fa_cuda_check_kvcache(pb, &ws);
        if (s != FA_OK) return s;
    } else {
        ws = fa_cpu_kvcache_workspace(pb);
    }
    if ((s = fa_check_workspace_size(&pb->p, ws)) != FA_OK) return s;
    if (ws_out) *ws_out = ws;
    return FA_OK;
}

fa_status fa_check_kvcache(const fa_params *p, size_t *workspace_bytes) {
    fa_problem pb;
    return prepare_kvcache(p, &pb, workspace_bytes);
}

fa_status fa_kvcache_forward(const fa_params *p) {
    fa_problem pb;
    fa_status s = prepare_kvcache(p, &pb, NULL);
    if (s != FA_OK) return s;
    return pb.p.device == FA_DEVICE_CUDA ? fa_cuda_kvcache_forward(&pb) : fa_cpu_kvcache_forward(&pb);
}

/* ---- fa_merge_states ---------------------------------------------------------------------- */

static fa_status validate_merge(const fa_merge_params *m) {
    static const char *const parts_axes[3] = {"state", "row", "head"};
    static const char *const lse_parts_axes[3] = {"state", "head", "row"};
    static const char *const out_axes[3] = {"-", "row", "head"};
    static const char *const lse_axes[3] = {"-", "head", "row"};
    if (m == NULL) return fa_set_error(FA_ERR_NULL_POINTER, "merge params is NULL");
    if (m->device != FA_DEVICE_CPU && m->device != FA_DEVICE_CUDA)
        return fa_set_error(FA_ERR_DEVICE, "device = %d is not a fa_device value", (int)m->device);
    if (m->device == FA_DEVICE_CUDA && !fa_cuda_built())
        return fa_set_error(FA_ERR_DEVICE,
                            "device = FA_DEVICE_CUDA but this libflashattn was built without CUDA");
    if (m->device == FA_DEVICE_CUDA && !fa_cuda_is_available())
        return fa_set_error(FA_ERR_DEVICE, "device = FA_DEVICE_CUDA but no usable CUDA GPU is present");
    if (m->parts_dtype != FA_DTYPE_F32 && m->parts_dtype != FA_DTYPE_F16 && m->parts_dtype != FA_DTYPE_BF16)
        return fa_set_error(FA_ERR_DTYPE, "parts_dtype = %d is not a fa_dtype value", (int)m->parts_dtype);
    if (m->out_dtype != FA_DTYPE_F32 && m->out_dtype != FA_DTYPE_F16 && m->out_dtype != FA_DTYPE_BF16)
        return fa_set_error(FA_ERR_DTYPE, "out_dtype = %d is not a fa_dtype value", (int)m->out_dtype);
    if (m->device == FA_DEVICE_CUDA && m->out_dtype == FA_DTYPE_F32)
        return fa_set_error(FA_ERR_DTYPE,
                            "out_dtype = f32 is not supported on CUDA (use f16 or bf16; f32 runs on "
                            "the CPU)");
    if (m->num_threads < 0)
        return fa_set_error(FA_ERR_INVALID_ARGUMENT, "num_threads = %d is negative (0 = all cores)",
                            m->num_threads);
    FA_REQUIRE_RANGE(m->num_states, 1, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "num_states");
    FA_REQUIRE_RANGE(m->rows, 0, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "rows");
    FA_REQUIRE_RANGE(m->heads, 1, FA_MAX_EXTENT, FA_ERR_INVALID_SIZE, "heads");
    FA_REQUIRE_RANGE(m->head_dim_v, 1, FA_MAX_HEAD_DIM, FA_ERR_HEAD_DIM, "head_dim_v");
    FA_REQUIRE_PTR(m->o_parts, "o_parts");
    FA_REQUIRE_PTR(m->lse_parts, "lse_parts");
    FA_REQUIRE_PTR(m->o, "o");
    const int64_t parts_e = fa_dtype_bytes(m->parts_dtype), out_e = fa_dtype_bytes(m->out_dtype);
    fa_tensor_view views[4];
    int n = 0;
    views[n] = tensor_of(view_of("o_parts", 0, m->num_states, m->rows, m->heads, m->head_dim_v,
                                 m->o_parts_state_stride, m->o_parts_row_stride, m->o_parts_head_stride),
                         m->o_parts, parts_e, "o_parts");
    views[n++].axis_names = parts_axes;
    views[n] = tensor_of(view_of("lse_parts", 0, m->num_states, m->heads, m->rows, 1, m->lse_parts_state_stride,
                                 m->lse_parts_head_stride, m->lse_parts_row_stride),
                         m->lse_parts, 4, "lse_parts");
    views[n++].axis_names = lse_parts_axes;
    views[n] = tensor_of(view_of("o", 1, 1, m->rows, m->heads, m->head_dim_v, 0, m->o_row_stride, m->o_head_stride),
                         m->o, out_e, "o");
    views[n++].axis_names = out_axes;
    if (m->lse) {
        views[n] = tensor_of(view_of("lse", 1, 1, m->heads, m->rows, 1, 0, m->lse_head_stride, m->lse_row_stride),
                             m->lse, 4, "lse");
        views[n++].axis_names = lse_axes;
    }
    return fa_check_views(views, n);
}

fa_status fa_merge_states(const fa_merge_params *m) {
    fa_status s = validate_merge(m);
    if (s != FA_OK) return s;
    if (m->rows == 0) return FA_OK;
    if (m->device == FA_DEVICE_CUDA) return fa_cuda_merge_states(m);
    fa_merge_params r = *m; /* strides of axes of extent 1 are unused: zeroed for the engine */
    fa_zero_unused_strides(r.num_states, &r.o_parts_state_stride, r.rows, &r.o_parts_row_stride, r.heads,
                           &r.o_parts_head_stride);
    fa_zero_unused_strides(r.num_states, &r.lse_parts_state_stride, r.heads, &r.lse_parts_head_stride, r.rows,
                           &r.lse_parts_row_stride);
    int64_t unused = 0;
    fa_zero_unused_strides(1, &unused, r.rows, &r.o_row_stride, r.heads, &r.o_head_stride);
    fa_zero_unused_strides(1, &unused, r.heads, &r.lse_head_stride, r.rows, &r.lse_row_stride);
    return fa_cpu_merge_states(&r);
}
