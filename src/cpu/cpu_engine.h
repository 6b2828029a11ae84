/*
 * cpu_engine.h: what the files of the CPU engine share (not part of the library's interface).
 *
 * Layout of the engine
 *   cpu_forward.c    tiled forward (online softmax), work items and their tiling
 *   cpu_backward.c   tiled backward (FlashAttention-2 math, recomputation from LSE)
 *   cpu_standard.c   the materialised "standard attention" baseline
 *   cpu_kvcache.c    fa_kvcache_forward: rotary, cache append, split-KV attention over a cache
 *   cpu_item.c       per-row state of the forward's and the decode's work items (key ranges,
 *                    masks, the normalised output row) and the tile transpose the drivers share
 *   cpu_threads.c    persistent thread pool and the parallel-for used by the three drivers
 *   cpu_dispatch.c   picks the SIMD kernels at run time (FA_CPU_ISA can force a lower level)
 *   kernels_*.c      one set of inner kernels per instruction set (scalar C, AVX2, AVX-512,
 *                    AArch64 NEON), all generated from kernels_impl.h over a small vector
 *                    abstraction
 *   gemm_bf16_avx512.c  the bf16 × bf16 score GEMM on AVX512-BF16 (vdpbf16ps), used by the
 *                    AVX-512 level when the CPU has it
 *   cpu_convert.h    scalar f16 / bf16 <-> f32 conversions (round to nearest even)
 *
 * Every inner kernel works on fp32 tiles in per-thread scratch memory; the drivers convert the
 * caller's f16 / bf16 / f32 rows into those tiles and round the results back on store. The one
 * exception is gemm_bf16 (AVX512-BF16 CPUs, bf16 problems): the score GEMMs S = Q Kᵀ and
 * dP = dO Vᵀ read bf16 rows in place and bf16-pair tiles, and write fp32.
 *
 * Tile vocabulary used throughout (a "row" is one query row, a "key" one key/value row):
 *   keys-major score tile   s[key][row]  rows are the SIMD lanes (forward, dQ pass)
 *   rows-major score tile   s[row][key]  keys are the SIMD lanes (dK/dV pass)
 * Leading dimensions of tiles that are loaded as vectors are multiples of FA_CPU_PAD floats.
 */
#ifndef FA_CPU_ENGINE_H
#define FA_CPU_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "api/fa_internal.h"

/* Widest SIMD vector in floats; tile leading dimensions and padded head dims are multiples of it. */
#define FA_CPU_PAD 16
/* Tile sizes (experiments override them with -D; docs/tuning-log.md, "CPU tile sweep").
 * Query rows per forward / dQ work item (lanes of a keys-major tile; a multiple of FA_CPU_PAD). */
#ifndef FA_CPU_BLOCK_ROWS
#define FA_CPU_BLOCK_ROWS 64
#endif

/* How one sequence's query rows of a GQA group become work items of at most FA_CPU_BLOCK_ROWS
 * rows: a long sequence gives each query head q_blocks blocks; a short one packs heads_per_item
 * heads of the group into one block, and head_chunks items cover the group (len_q <= 0: no
 * item). Shared by the forward and the KV-cache decode. */
typedef struct fa_cpu_row_packing {
    int64_t heads_per_item, head_chunks, q_blocks;
} fa_cpu_row_packing;

static inline fa_cpu_row_packing fa_cpu_pack_rows(int64_t len_q, int64_t group) {
    fa_cpu_row_packing r = {1, 0, 0};
    if (len_q <= 0) return r;
    if (len_q >= FA_CPU_BLOCK_ROWS) {
        r.q_blocks = (len_q + FA_CPU_BLOCK_ROWS - 1) / FA_CPU_BLOCK_ROWS;
    } else {
        r.q_blocks = 1;
        r.heads_per_item = FA_CPU_BLOCK_ROWS / len_q;
        if (r.heads_per_item > group) r.heads_per_item = group;
    }
    r.head_chunks = (group + r.heads_per_item - 1) / r.heads_per_item;
    return r;
}

/* Keys per tile of the forward and of the dQ pass. */
#ifndef FA_CPU_BLOCK_KEYS
#define FA_CPU_BLOCK_KEYS 128
#endif
/* Keys per dK/dV work item and query rows per tile of the dK/dV pass. */
#ifndef FA_CPU_BWD_BLOCK_KEYS
#define FA_CPU_BWD_BLOCK_KEYS 64
#endif
#ifndef FA_CPU_BWD_BLOCK_ROWS
#define FA_CPU_BWD_BLOCK_ROWS 64
#endif
/* Items with at most this many query rows compute their scores with fa_cpu_kernels.keys_dot. */
#define FA_CPU_DOT_MAX_ROWS 4
/* ALiBi distances are computed in int32 lanes, clamped to ±2^30 (farther than any sequence). */
#define FA_CPU_DIAG_LIMIT ((int64_t)1 << 30)
/* The compiler knows AVX512-BF16 (target attribute and intrinsics): gemm_bf16_avx512.c is built. */
#if (defined(__x86_64__) || defined(_M_X64)) &&                                                                   \
    ((defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define FA_CPU_HAVE_BF16DOT 1
#endif
/* The compiler knows AMX-TILE / AMX-BF16 (GCC 11, clang 12) and the OS is Linux, whose
 * arch_prctl grants a process the tile state: gemm_bf16_amx.c is built. */
#if (defined(__x86_64__) || defined(_M_X64)) && defined(__linux__) &&                                             \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define FA_CPU_HAVE_AMX 1
#endif
/* AArch64 with GCC / clang: kernels_neon.c and decode_neon.c are built (Makefile) and selectable
 * (the NEON decode kernels serve the SVE level too). */
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define FA_CPU_HAVE_NEON_KERNELS 1
#endif
/* AArch64 Linux with a compiler that has fixed-length SVE types (arm_sve_vector_bits: GCC 10,
 * clang 12): kernels_sve256.c is built and selectable (on a CPU whose SVE vectors are 256 bits). */
#if defined(__aarch64__) && defined(__linux__) &&                                                               \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define FA_CPU_HAVE_SVE256_KERNELS 1
#endif
/* AArch64 Linux with a compiler that has the BF16 intrinsics (GCC 11, clang 11): gemm_bf16_neon.c
 * (BFDOT) is built, for CPUs with HWCAP2_BF16. */
#if defined(__aarch64__) && defined(__linux__) &&                                                               \
    ((defined(__clang__) && __clang_major__ >= 11) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define FA_CPU_HAVE_BF16DOT_NEON 1
#endif
/* Upper bound on worker threads (num_threads is clamped to it). */
#define FA_CPU_MAX_THREADS 256

#if defined(__GNUC__) || defined(__clang__)
#define FA_CPU_ALWAYS_INLINE inline __attribute__((always_inline))
#define FA_CPU_NOINLINE __attribute__((noinline))
#define FA_CPU_PREFETCH(address) __builtin_prefetch(address)
#else
#define FA_CPU_ALWAYS_INLINE inline
#define FA_CPU_NOINLINE
#define FA_CPU_PREFETCH(address) ((void)(address))
#endif

static inline int64_t fa_cpu_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* ---- inner kernel arguments ------------------------------------------------------------------ */

typedef enum fa_cpu_gemm_mode {
    FA_CPU_GEMM_STORE = 0,      /* C = alpha · (A B)                                            */
    FA_CPU_GEMM_ACCUMULATE = 1, /* C = C + A B                                                 */
    FA_CPU_GEMM_SCALE_ROWS = 2  /* C = C · row_scale[m] + A B   (online-softmax rescale of O)   */
} fa_cpu_gemm_mode;

/* C[m][n] (op)= sum_k A(m, k) · B[k][n], fp32.
 * A is read one element at a time (broadcast) at a[m·a_row_step + k·a_k_step], so it may be any
 * strided view (a caller's rows, or a transposed tile). B and C are row-major with leading
 * dimensions ldb / ldc; n is a multiple of FA_CPU_PAD (B's padding columns must be finite). */
typedef struct fa_cpu_gemm_args {
    int64_t m, n, k;
    const float *a;
    int64_t a_row_step, a_k_step;
    const float *b;
    int64_t ldb;
    float *c;
    int64_t ldc;
    fa_cpu_gemm_mode mode;
    float alpha;            /* FA_CPU_GEMM_STORE                                               */
    const float *row_scale; /* FA_CPU_GEMM_SCALE_ROWS: [m]                                     */
} fa_cpu_gemm_args;

/* C[m][n] = alpha · sum_k A[m][k] · B[k][n] with both operands bf16 (AVX512-BF16): every product
 * of two bf16 is exact in fp32 and the sums are fp32, so this is the fp32 GEMM of the same values
 * up to the order of the additions (and denormal inputs / results, which vdpbf16ps flushes to 0).
 * A: rows of bf16 at a + m·lda, k elements each (read in place, e.g. the caller's K rows).
 * B: packed in pairs of k, b[(k/2)·2·ldb + 2·n + k%2] (fa_cpu_pack_pairs_bf16); n is a
 * multiple of FA_CPU_PAD, columns n..ldb-1 and an odd k's last second slot are 0. */
typedef struct fa_cpu_gemm_bf16_args {
    int64_t m, n, k;
    const uint16_t *a;
    int64_t lda;
    const uint16_t *b;
    int64_t ldb;
    float *c;
    int64_t ldc;
    float alpha;
} fa_cpu_gemm_bf16_args;

/* Score transformation of one tile, in place: softcap, ALiBi, then the key-range mask.
 * Masks and biases are given per query row relative to the tile's first key j0, so a kernel
 * only compares small integers:
 *   key j of the tile (0 <= j < n_keys) is visible to row r iff lo_rel[r] <= j < hi_rel[r];
 *   ALiBi distance of (r, j) is |diag_rel[r] - j|, bias -slope[r]·distance.
 * The softcap kernel expects the GEMM to have stored y = scale·q·k / softcap and writes
 * softcap·tanh(y); if tanh_out is non-NULL it also stores tanh(y) there (same layout) for the
 * backward's chain rule. Masked entries become -inf. */
typedef struct fa_cpu_score_tile {
    float *s;            /* keys-major [n_keys][ld] or rows-major [n_rows][ld]                  */
    float *tanh_out;     /* same layout as s, or NULL                                         */
    int64_t ld;
    int64_t n_keys;      /* keys-major: rows of s; rows-major: columns (multiple of FA_CPU_PAD) */
    int64_t n_rows;      /* keys-major: columns (multiple of FA_CPU_PAD); rows-major: rows      */
    int keys_major;
    int apply_softcap, apply_alibi, apply_mask;
    float softcap;
    const int32_t *lo_rel;   /* [n_rows] */
    const int32_t *hi_rel;   /* [n_rows] */
    const int32_t *diag_rel; /* [n_rows] */
    const float *slope;      /* [n_rows] */
} fa_cpu_score_tile;

/* Backward elementwise step on one tile, in place:
 *   p  = exp(s - lse[r])           (0 for rows with lse = -inf)          s  -> p
 *   ds = p · (dp - dsum[r]) · (1 - t²) · scale   (t = tanh tile if any)  dp -> ds
 * Layout as in fa_cpu_score_tile (keys-major: rows are lanes). */
typedef struct fa_cpu_grad_tile {
    float *s;                /* in: scores, out: probabilities                                  */
    float *dp;               /* in: dO·Vᵀ, out: dS (already multiplied by softmax_scale)        */
    const float *tanh_vals;  /* softcap tanh values, or NULL                                   */
    int64_t ld;
    int64_t n_keys, n_rows;
    int keys_major;
    const float *lse;        /* [n_rows] natural-log LSE of each row                           */
    const float *dsum;       /* [n_rows] D = rowsum(dO ∘ O)                                    */
    float scale;             /* softmax_scale                                                  */
} fa_cpu_grad_tile;

/* One SIMD level's inner kernels. */
typedef struct fa_cpu_kernels {
    const char *name;        /* "avx512", "avx2", "neon", "sve256", "scalar"                  */
    int64_t gemm_panel;      /* columns of C one pass of the GEMM micro-kernel covers         */
    void (*gemm)(const fa_cpu_gemm_args *g);
    void (*transform_scores)(const fa_cpu_score_tile *t);
    /* Forward online-softmax step on a keys-major tile s[n_keys][ld] (n_rows lanes, a multiple
     * of FA_CPU_PAD): row_max[r] = max(row_max[r], max_j s[j][r]); s -> exp(s - max);
     * row_sum[r] = row_sum[r]·alpha[r] + sum_j p[j][r]; alpha[r] = exp(old max - new max). */
    void (*softmax_step)(float *s, int64_t ld, int64_t n_keys, int64_t n_rows, float *row_max,
                         float *row_sum, float *alpha);
    void (*grad_scores)(const fa_cpu_grad_tile *t);
    /* Keys-major scores by dot products along the head dim, for tiles with at most
     * FA_CPU_DOT_MAX_ROWS query rows (decoding), where the GEMM would fill 16 lanes for 1-4 rows:
     * s[j][r] = alpha · k_j · q_r  (k_j at k + j·ldk, q_r at q + r·ldq, d elements each);
     * lanes n_rows..n_lanes-1 of s are set to 0. Such tiles are memory-bound: the kernel also
     * prefetches the rows of the value tile (v_j at v + j·ldv, dv elements) for the P V step. */
    void (*keys_dot)(const float *k, int64_t ldk, int64_t n_keys, const float *q, int64_t ldq, int64_t n_rows,
                     int64_t d, float alpha, float *s, int64_t lds, int64_t n_lanes, const float *v, int64_t ldv,
                     int64_t dv);
    /* dst[i] = (float)src[i] for n elements of dtype; and back with round-to-nearest-even. */
    void (*to_f32)(float *dst, const void *src, int64_t n, fa_dtype dtype);
    void (*from_f32)(void *dst, const float *src, int64_t n, fa_dtype dtype);
    /* bf16 × bf16 GEMM (fa_cpu_gemm_bf16_args), or NULL: the drivers then use gemm on fp32
     * copies. Set only in the AVX-512 level's table for CPUs with AVX512-BF16 and in the NEON
     * and SVE levels' tables for CPUs with the BF16 extension (BFDOT). */
    void (*gemm_bf16)(const fa_cpu_gemm_bf16_args *g);
} fa_cpu_kernels;

const fa_cpu_kernels *fa_cpu_kernels_scalar(void);
#if defined(__x86_64__) || defined(_M_X64)
const fa_cpu_kernels *fa_cpu_kernels_avx2(void);
const fa_cpu_kernels *fa_cpu_kernels_avx512(void);
#ifdef FA_CPU_HAVE_BF16DOT
/* the AVX-512 table with gemm_bf16 set (only for CPUs with AVX512-BF16) */
const fa_cpu_kernels *fa_cpu_kernels_avx512_bf16(void);
void fa_cpu_gemm_bf16_avx512(const fa_cpu_gemm_bf16_args *g);
#endif
#ifdef FA_CPU_HAVE_AMX
/* the AVX-512 table with gemm_bf16 on AMX tiles (only where fa_cpu_amx_usable) */
const fa_cpu_kernels *fa_cpu_kernels_avx512_amx(void);
void fa_cpu_gemm_bf16_amx(const fa_cpu_gemm_bf16_args *g);
#endif
#endif
/* 1 if this CPU and OS let the process use AMX-BF16 tiles (asked for once, cached; 0 off x86-64) */
int fa_cpu_amx_usable(void);
#ifdef FA_CPU_HAVE_NEON_KERNELS
const fa_cpu_kernels *fa_cpu_kernels_neon(void);
#endif
#ifdef FA_CPU_HAVE_SVE256_KERNELS
const fa_cpu_kernels *fa_cpu_kernels_sve256(void);
#endif
#ifdef FA_CPU_HAVE_BF16DOT_NEON
/* the NEON and SVE tables with gemm_bf16 set (only for CPUs with the BF16 extension) */
void fa_cpu_gemm_bf16_neon(const fa_cpu_gemm_bf16_args *g);
const fa_cpu_kernels *fa_cpu_kernels_neon_bf16(void);
#ifdef FA_CPU_HAVE_SVE256_KERNELS
const fa_cpu_kernels *fa_cpu_kernels_sve256_bf16(void);
#endif
#endif

/* The kernels this call should use: the best level the CPU supports, lowered by FA_CPU_ISA. */
const fa_cpu_kernels *fa_cpu_select_kernels(void);

/* The x86-64 CPU's vendor, family and model (CPUID leaves 0 and 1, read once; family and model
 * with the extended fields folded in), for choices that depend on the microarchitecture and not
 * only on the ISA level; all zero on other architectures. */
typedef struct fa_cpu_model_id {
    int amd; /* the vendor is AMD ("AuthenticAMD") */
    int family, model;
} fa_cpu_model_id;
fa_cpu_model_id fa_cpu_identify(void);

/* fa_forward's attn_probs output for a validated problem (cpu_probs.c). */
fa_status fa_cpu_attn_probs(const fa_problem *pb);

/* ---- threads ----------------------------------------------------------------------------------- */

/* Worker threads a call of this problem uses: num_threads, or all online cores when 0. */
int fa_cpu_thread_count(const fa_problem *pb);
/* Online cores of this machine (at least 1, at most FA_CPU_MAX_THREADS). */
int fa_cpu_online_cores(void);

/* Run task(ctx, thread_index) on thread_count threads (the caller is thread 0) and return when
 * all are done. Thread indices are 0..thread_count-1, each used once; a task distributes its
 * work itself (see fa_cpu_next_item). If threads cannot be started the call still completes,
 * with fewer threads. Safe to call from several user threads at once. */
typedef void (*fa_cpu_task)(void *ctx, int thread_index);
void fa_cpu_parallel_run(int thread_count, fa_cpu_task task, void *ctx);

/* ---- scratch memory ---------------------------------------------------------------------------- */

/* Bump allocator over a 64-byte aligned region: take() returns aligned slices. With base NULL
 * it only measures (take() returns NULL and `used` grows), which sizes the workspace. */
typedef struct fa_cpu_arena {
    char *base;
    size_t used;
} fa_cpu_arena;

static inline size_t fa_cpu_align64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

static inline void *fa_cpu_take(fa_cpu_arena *arena, size_t bytes) {
    void *p = arena->base ? arena->base + arena->used : NULL;
    arena->used += fa_cpu_align64(bytes);
    return p;
}

/* Workspace of `bytes` for a call: the caller's (pb->p.workspace) when large enough, else
 * malloc'ed. Returns the 64-byte aligned start, or NULL after fa_set_error(FA_ERR_ALLOC). */
typedef struct fa_cpu_workspace {
    char *base;
    void *owned; /* free() this when done (NULL if the caller's memory is used) */
} fa_cpu_workspace;

int fa_cpu_workspace_acquire(const fa_problem *pb, size_t bytes, fa_cpu_workspace *ws);
void fa_cpu_workspace_release(fa_cpu_workspace *ws);

/* fp8 inputs (FA_DTYPE_FP8_E4M3): the descale factors of (batch b, kv head), 1 for the other
 * dtypes and for NULL arrays. The forward and backward fold q's · k's into the score scale and
 * v's into o (forward) or dP = dO Vᵀ (backward); the backward's dQ takes k's and dK q's. */
typedef struct fa_cpu_descale {
    float qk, q, k, v;
} fa_cpu_descale;

static inline fa_cpu_descale fa_cpu_descale_of(const fa_params *p, int64_t b, int64_t kv_head) {
    fa_cpu_descale f = {1.0f, 1.0f, 1.0f, 1.0f};
    if (p->dtype != FA_DTYPE_FP8_E4M3) return f;
    const int64_t at = b * p->heads_kv + kv_head;
    f.q = p->q_descale ? p->q_descale[at] : 1.0f;
    f.k = p->k_descale ? p->k_descale[at] : 1.0f;
    f.v = p->v_descale ? p->v_descale[at] : 1.0f;
    f.qk = f.q * f.k;
    return f;
}

/* x[0..n) *= f (nothing when f = 1): a row times its descale factor before it is stored. */
static inline void fa_cpu_scale_row(float *x, int64_t n, float f) {
    if (f != 1.0f)
        for (int64_t i = 0; i < n; i++) x[i] *= f;
}

/* ---- work items -------------------------------------------------------------------------------- */

static inline int32_t fa_cpu_clamp_i32(int64_t x, int64_t lo, int64_t hi) {
    return (int32_t)(x < lo ? lo : x > hi ? hi : x);
}

/* Sequence that holds global item `item`, with item_start [batch + 1] the prefix counts of the
 * sequences' items (binary search). */
static inline int64_t fa_cpu_item_sequence(const int64_t *item_start, int64_t batch, int64_t item) {
    int64_t lo = 0, hi = batch - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (item_start[mid] <= item) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* A forward or decode work item (cpu_forward.c, cpu_kvcache.c) holds up to FA_CPU_BLOCK_ROWS
 * query rows, the lanes of its keys-major tiles (n_pad = rows rounded up to FA_CPU_PAD); row r
 * is one (query head, query) pair. Its per-row state, FA_CPU_BLOCK_ROWS entries per array: */
typedef struct fa_cpu_item_rows {
    int64_t *head, *query;               /* [n_rows] set by the driver                         */
    int64_t *lo, *hi;                    /* [n_rows] visible keys [lo, hi)                     */
    float *slope;                        /* [n_pad] ALiBi slope, 0 on padding lanes            */
    float *max, *sum, *alpha;            /* [n_pad] online-softmax state (softmax_step)        */
    int32_t *lo_rel, *hi_rel, *diag_rel; /* [n_pad] the current tile's mask (score tile)       */
} fa_cpu_item_rows;

/* The keys an item visits: [begin, end) covers every row's non-empty range; every row sees all
 * of [full_begin, full_end) (tiles inside it need no mask). */
typedef struct fa_cpu_key_span {
    int64_t begin, end, full_begin, full_end;
} fa_cpu_key_span;

/* Takes the arrays of `rows` from the arena (base NULL: only measures). */
void fa_cpu_item_rows_take(fa_cpu_arena *arena, fa_cpu_item_rows *rows);

/* For rows 0..n_rows-1 (head and query set) of sequence b (len_q queries, len_k keys): each row's
 * key range (fa_key_range) clipped to [clip_begin, clip_end), its ALiBi slope (lanes n_rows..
 * n_pad-1: 0), the online-softmax state reset; returns the item's key span. */
fa_cpu_key_span fa_cpu_item_rows_start(const fa_cpu_item_rows *rows, const fa_problem *pb, int64_t b,
                                       int64_t len_q, int64_t len_k, int64_t n_rows, int64_t n_pad,
                                       int64_t clip_begin, int64_t clip_end);

/* Softcap, ALiBi and (needs_mask) the rows' key ranges on the keys-major score tile
 * s_t [n_keys][n_pad] of keys [j0, j0 + n_keys); row r's diagonal is key query[r] + shift
 * (shift = len_k - len_q). Nothing happens when none of the three applies. */
void fa_cpu_item_transform(const fa_cpu_kernels *kern, const fa_cpu_item_rows *rows, const fa_params *p, float *s_t,
                           int64_t n_rows, int64_t n_pad, int64_t j0, int64_t n_keys, int64_t shift, int needs_mask);

/* Row r's output out[0..dv) = its accumulator o_row divided by the softmax sum, with the sink of
 * its head in the denominator when p->sink_logits (a row without keys: 0). Returns the row's
 * LSE: max + log(sum), with the sink included; -inf for no key and no sink. */
double fa_cpu_item_finish_row(const fa_cpu_item_rows *rows, const fa_params *p, int64_t r, const float *o_row,
                              int64_t dv, float *out);

/* Transpose: dst[k][r] = src[r·width + k] for r < n_rows, k < width; lanes n_rows..ld-1 zero. */
void fa_cpu_transpose_rows(float *dst, int64_t ld, const float *src, int64_t n_rows, int64_t width);

/* The B operand of gemm_bf16 from fp32 rows that hold bf16 values (converted from bf16, so the
 * high 16 bits are exact): dst[(k/2)·2·ld + 2·r + k%2] = src[r·src_ld + k] for r < n_rows,
 * k < width; lanes n_rows..ld-1 and, for odd width, the last pair's second slot are 0. */
void fa_cpu_pack_pairs_bf16(uint16_t *dst, int64_t ld, const float *src, int64_t src_ld, int64_t n_rows,
                            int64_t width);

/* ---- score modifications: bias, document ids, block mask (cpu_mods.c) ------------------------ */

/* The rows of a score tile as the modifications see them: row r is query row query[r] (or
 * query0 + r) of head head[r] (or head0) of sequence b; key j0 + c of the tile is the sequence's
 * key j0 + c and bias column bias_col0 + j0 + c (fa_kvcache_forward: bias_col0 = the first
 * attended cache slot). Only rows 0 .. n_rows-1 are touched (padding lanes are left alone). */
typedef struct fa_cpu_mod_rows {
    int64_t b;
    fa_seq seq;
    int64_t bias_col0;
    const int64_t *head, *query;
    int64_t head0, query0;
    int64_t n_rows;
} fa_cpu_mod_rows;

/* On a score tile after softcap and ALiBi (keys-major s[key][row] or rows-major s[row][key],
 * leading dimension ld, keys j0 .. j0 + n_keys): visible elements get the bias added, the others
 * become -inf (the rules are in cpu_mods.c). Call only when pb->has_mods. */
void fa_cpu_apply_mods(const fa_problem *pb, const fa_cpu_mod_rows *m, float *s, int64_t ld, int keys_major,
                       int64_t j0, int64_t n_keys);
/* 0 when a block mask lists no block of keys [j0, j1) for any of the rows (the tile can be
 * skipped); 1 otherwise, and always 1 without a block mask (for a non-empty range). */
int fa_cpu_mods_see_keys(const fa_problem *pb, const fa_cpu_mod_rows *m, int64_t j0, int64_t j1);

/* Geometry of sequence b of a KV-cache call (host arrays, validated). */
typedef struct fa_cpu_kv_sequence {
    int64_t cache_row; /* contiguous cache: row of k / v (cache_batch_idx[b] or b)             */
    int64_t start;     /* first attended slot (cache_leftpad[b])                               */
    int64_t cached;    /* tokens in the cache before the append (cache_seqlens[b])             */
    int64_t len_k;     /* keys attended: cached + appended - start                              */
} fa_cpu_kv_sequence;

/* Fill seqs[0 .. batch) from p; returns the longest len_k. */
static inline int64_t fa_cpu_kv_sequences(const fa_params *p, fa_cpu_kv_sequence *seqs) {
    const int64_t appended = p->k_new ? p->seqlen_new : 0;
    int64_t longest = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        fa_cpu_kv_sequence *s = &seqs[b];
        s->cache_row = p->cache_batch_idx ? p->cache_batch_idx[b] : b;
        s->cached = p->cache_seqlens ? p->cache_seqlens[b] : p->seqlen_k;
        s->start = p->cache_leftpad ? p->cache_leftpad[b] : 0;
        s->len_k = s->cached + appended - s->start;
        if (s->len_k > longest) longest = s->len_k;
    }
    return longest;
}

/* The workspace of a KV-cache call, in 64-byte aligned pieces: the sequences, the slot ids of the
 * appended tokens (with_slot_ids and an append), the splits' fp32 partial states (splits > 1: o
 * [splits][rows][head_dim_v], lse [splits][rows], rows = batch·heads_q·seqlen_q), then `threads`
 * scratch regions of per_thread bytes; total includes 64 bytes of alignment slack. */
typedef struct fa_cpu_kv_plan {
    size_t sequences, slot_ids, o_part, lse_part, per_thread, total;
} fa_cpu_kv_plan;

static inline fa_cpu_kv_plan fa_cpu_kv_plan_of(const fa_params *p, int with_slot_ids, int64_t splits,
                                               size_t scratch_bytes, int threads) {
    fa_cpu_kv_plan w;
    const int64_t rows = p->batch * p->heads_q * p->seqlen_q;
    w.sequences = fa_cpu_align64(sizeof(fa_cpu_kv_sequence) * (size_t)p->batch);
    w.slot_ids = with_slot_ids && p->k_new ? fa_cpu_align64(sizeof(int64_t) * (size_t)(p->batch * p->seqlen_new)) : 0;
    w.o_part = splits > 1 ? fa_cpu_align64(sizeof(float) * (size_t)(splits * rows * p->head_dim_v)) : 0;
    w.lse_part = splits > 1 ? fa_cpu_align64(sizeof(float) * (size_t)(splits * rows)) : 0;
    w.per_thread = fa_cpu_align64(scratch_bytes);
    w.total = 64 + w.sequences + w.slot_ids + w.o_part + w.lse_part + (size_t)threads * w.per_thread;
    return w;
}

/* The pieces of plan w in a workspace at base (64-byte aligned). */
typedef struct fa_cpu_kv_pieces {
    fa_cpu_kv_sequence *seqs;
    int64_t *slot_ids;
    float *o_part, *lse_part;
    char *scratch;
} fa_cpu_kv_pieces;

static inline fa_cpu_kv_pieces fa_cpu_kv_pieces_at(const fa_cpu_kv_plan *w, char *base) {
    fa_cpu_kv_pieces at;
    at.seqs = (fa_cpu_kv_sequence *)base;
    at.slot_ids = (int64_t *)(base + w->sequences);
    at.o_part = (float *)(base + w->sequences + w->slot_ids);
    at.lse_part = (float *)(base + w->sequences + w->slot_ids + w->o_part);
    at.scratch = base + w->sequences + w->slot_ids + w->o_part + w->lse_part;
    return at;
}

#endif /* FA_CPU_ENGINE_H */
