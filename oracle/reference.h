/*
 * reference.h: the test oracle and the tools every test shares.
 *
 *   - dtype conversion (f32 <-> f16 / bf16, round to nearest even), element load/store by dtype;
 *   - a float64 attention oracle, forward and backward, with every feature of fa_params;
 *   - the "standard attention in the input dtype" baseline that sets the tolerance: fp32 scores
 *     from dtype inputs, fp32 softmax, P rounded to the dtype before P·V, outputs rounded (what
 *     plain PyTorch attention in that dtype gives), forward and backward;
 *   - the tolerance rule: ok iff max|ours - ref64| <= 2·max|baseline - ref64| + floor;
 *   - test problems: host tensors with random strides, padding and layouts (BHSD, slices of a
 *     packed QKV buffer), random fills, NaN poisoning and checks that every output element was
 *     written and nothing around it was.
 *   - score modifications of a problem drawn at random (bias in every broadcast shape, a poisoned
 *     dbias, block-sparse lists with bit masks, document ids), the same for the CPU and CUDA tests.
 *
 * Canonical layouts of reference results (row r = b·seqlen + i, or cu_seqlens[b] + i in varlen;
 * rows_q = batch·seqlen_q or total_q, rows_k likewise):
 *   o  [rows_q, heads_q, head_dim_v]   dq [rows_q, heads_q, head_dim]
 *   dk [rows_k, heads_kv, head_dim]    dv [rows_k, heads_kv, head_dim_v]
 *   lse in the library's own layout ([batch, heads_q, seqlen_q] or [heads_q, total_q])
 *   dsink [heads_q]
 */
#ifndef FA_TESTS_REFERENCE_H
#define FA_TESTS_REFERENCE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "flashattn.h"

/* ---- dtypes ------------------------------------------------------------------------------- */

uint16_t fa_test_f32_to_f16(float x); /* round to nearest even; overflow -> inf; NaN kept   */
float fa_test_f16_to_f32(uint16_t h);
uint16_t fa_test_f32_to_bf16(float x);
float fa_test_bf16_to_f32(uint16_t h);
float fa_test_round_to(fa_dtype dtype, float x); /* x rounded to dtype, returned as float    */
size_t fa_test_dtype_size(fa_dtype dtype);
const char *fa_test_dtype_name(fa_dtype dtype);
int fa_test_mantissa_bits(fa_dtype dtype); /* explicit mantissa bits: 23, 10, 7              */
double fa_test_load(const void *base, fa_dtype dtype, int64_t index);
void fa_test_store(void *base, fa_dtype dtype, int64_t index, double value);

/* ---- random numbers (splitmix64 + Box-Muller) --------------------------------------------- */

typedef struct fa_test_rng {
    uint64_t state;
} fa_test_rng;

void fa_test_rng_seed(fa_test_rng *rng, uint64_t seed);
uint64_t fa_test_rng_next(fa_test_rng *rng);
double fa_test_rng_uniform(fa_test_rng *rng);                    /* [0, 1)               */
int64_t fa_test_rng_int(fa_test_rng *rng, int64_t lo, int64_t hi); /* lo..hi inclusive     */
double fa_test_rng_normal(fa_test_rng *rng);
uint64_t fa_test_fresh_seed(void); /* from /dev/urandom, else time and pid               */

/* ---- float64 oracle on canonical double arrays --------------------------------------------- */

/* A problem in canonical dense double arrays (the layouts above). The finite-difference test
 * perturbs these arrays directly. */
typedef struct fa_ref_problem {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
    const int32_t *cu_seqlens_q, *cu_seqlens_k; /* both or neither (varlen)                   */
    int64_t rows_q, rows_k;                     /* batch·seqlen, or total_q / total_k        */
    double scale;                               /* softmax scale, already defaulted          */
    double softcap;                             /* 0 = off                                   */
    int64_t window_left, window_right;          /* effective (causal folded in), -1 unbounded */
    const double *slopes; /* [batch, heads_q] expanded ALiBi slopes, or NULL                  */
    const double *sinks;  /* [heads_q] sink logits, or NULL                                   */
    const double *q, *k, *v, *dout;             /* canonical; dout only for the backward     */
    /* attention dropout (fa_params.dropout_*): P_ij of sequence b, head h is multiplied by
     * Z_ij = keep ? 256 / (256 - threshold) : 0 with keep and threshold = round(p · 256) from
     * src/api/fa_philox.h, the library's mask */
    float dropout_p; /* 0 = off                                                                */
    uint64_t dropout_seed, dropout_offset;
    /* score bias and element visibility, dense [batch, heads_q, seqlen_q, seqlen_k] by position
     * within the sequence (fa_ref_mod_index): bias added after softcap; visible (0/1), when set,
     * replaces the window's key range (fa_ref_gather derives it from the block mask, document
     * ids and the window). NULL: none. */
    const double *bias;
    const unsigned char *visible;
} fa_ref_problem;

/* Index of (b, h, i, j) in the dense bias / visible / dbias arrays. */
static inline int64_t fa_ref_mod_index(const fa_ref_problem *rp, int64_t b, int64_t h, int64_t i, int64_t j) {
    return ((b * rp->heads_q + h) * rp->seqlen_q + i) * rp->seqlen_k + j;
}

/* Z_ij of element (b, h, i, j) (1 without dropout). */
double fa_ref_dropout_factor(const fa_ref_problem *rp, int64_t b, int64_t h, int64_t i, int64_t j);

/* Outputs, canonical. Any pointer may be NULL when not wanted (forward: o, lse; backward: all).
 * The *_mag arrays (float64 oracle only) hold each element's term magnitude: the sum of the
 * absolute values of the terms the element is a sum of, e.g. for dq_i
 * scale·Σ_j P_ij (|dP_ij| + |D_i|) |k_j|. fp32 rounding noise scales with it, not with the
 * (possibly cancelled) value; see fa_test_floor. */
typedef struct fa_ref_outputs {
    double *o, *lse, *dq, *dk, *dv, *dsink;
    double *o_mag, *dq_mag, *dk_mag, *dv_mag, *dsink_mag;
    double *dbias;   /* backward with rp->bias: dL/dbias dense (fa_ref_mod_index), unreduced   */
    double *dbias_mag; /* its term magnitudes (float64 oracle)                                  */
    double *lse_mag; /* per row: max |score| over the visible keys and the sink; the fp32 noise
                        of LSE = m + log Σ exp(s - m) scales with it (exp2/log approximations
                        on GPUs act on arguments of that size)                               */
    double *dq_dnoise, *dk_dnoise; /* float64 oracle: the spread dq / dk get from D = rowsum(dO∘O)
                        taken from O rounded to its storage dtype, per 2^-mantissa of that dtype
                        (fa_test_compare: docs/testing.md, "The accuracy rule"); dk's summed
                        over rows as variances (rows round independently)                    */
} fa_ref_outputs;

/* float64 forward (o, lse) and backward (dq, dk, dv, dsink; also o, lse if given). */
void fa_ref64_run(const fa_ref_problem *rp, int backward, fa_ref_outputs *out);
/* The dtype baseline (fp32 math, rounding to `dtype` where PyTorch would), same outputs. dtype
 * FA_DTYPE_FP8_E4M3 (forward, on a problem holding the dequantised fp8 values): P·V takes
 * exp(s - max) rounded to e4m3 (FlashAttention-3's fp8 product), o is rounded to bf16. */
void fa_ref_baseline_run(const fa_ref_problem *rp, fa_dtype dtype, int backward,
                         fa_ref_outputs *out);

/* Index of (sequence b, head h, row i) in the lse layout. */
int64_t fa_ref_lse_index(const fa_ref_problem *rp, int64_t b, int64_t h, int64_t i);

/* A dbias result (host memory `dbias` with p's dbias strides and dbias_dtype) against the float64
 * oracle's dense dbias summed over the axes those strides broadcast: err = max |ours - ref|,
 * tol = 2 × the dtype baseline's error summed the same way and stored in dbias_dtype + a floor
 * (fp32 dots of head_dim terms: up to (head_dim + 64)·eps times the terms' magnitude),
 * unwritten = NaN elements. */
typedef struct fa_ref_dbias_check {
    double err, tol, base_err, ref_max;
    int64_t unwritten;
} fa_ref_dbias_check;
int fa_ref_dbias_compare(const fa_params *p, const void *dbias, const fa_ref_problem *rp,
                         const fa_ref_outputs *ref64, const fa_ref_outputs *base,
                         fa_ref_dbias_check *out); /* 0, or -1 out of memory */

/* Host problem described by fa_params -> canonical doubles (inputs read through the strides in
 * p's dtype). Owns its arrays; free with fa_ref_gathered_free. */
typedef struct fa_ref_gathered {
    fa_ref_problem rp;
    double *q, *k, *v, *dout, *slopes, *sinks, *bias;
    unsigned char *visible;
} fa_ref_gathered;

int fa_ref_gather(const fa_params *p, fa_ref_gathered *g); /* 0 ok, -1 out of memory         */
void fa_ref_gathered_free(fa_ref_gathered *g);

/* Allocate (zeroed) canonical outputs for rp: forward o, lse; with backward also dq, dk, dv and
 * dsink (if sinks). Returns 0, or -1 out of memory. */
int fa_ref_outputs_alloc(const fa_ref_problem *rp, int backward, fa_ref_outputs *out);
void fa_ref_outputs_free(fa_ref_outputs *out);

/* All of the above for one host problem: gather p, then the float64 reference and the `dtype`
 * baseline (with backward: gradients too). Returns 0, or -1 out of memory with nothing left to
 * free. Free with fa_ref_references_free. */
int fa_ref_references(const fa_params *p, fa_dtype dtype, int backward, fa_ref_gathered *g, fa_ref_outputs *ref64,
                      fa_ref_outputs *baseline);
void fa_ref_references_free(fa_ref_gathered *g, fa_ref_outputs *ref64, fa_ref_outputs *baseline);

/* ---- test problems ----------------------------------------------------------------------- */

typedef enum fa_test_layout {
    FA_TEST_LAYOUT_CONTIGUOUS = 0, /* fa_set_contiguous_strides                                */
    FA_TEST_LAYOUT_PADDED = 1,     /* random padding after each head, row, batch, and in front */
    FA_TEST_LAYOUT_BHSD = 2,       /* [batch, heads, seq, dim] in memory (varlen [heads, total, dim]) */
    FA_TEST_LAYOUT_PACKED_QKV = 3, /* q, k, v (and dq, dk, dv) slices of one [.., hq+2hkv, d] buffer */
    FA_TEST_LAYOUT_COUNT = 4
} fa_test_layout;

typedef enum fa_test_alibi {
    FA_TEST_ALIBI_NONE = 0,
    FA_TEST_ALIBI_HEAD = 1,       /* slopes [heads_q], alibi_batch_stride = 0              */
    FA_TEST_ALIBI_BATCH_HEAD = 2  /* slopes [batch, heads_q + pad], per batch×head         */
} fa_test_alibi;

typedef struct fa_test_spec {
    fa_dtype dtype;
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v; /* dv 0 = d  */
    int varlen;                   /* lengths drawn in [0, seqlen] (one at the max, some empty) */
    const int32_t *lens_q, *lens_k; /* optional [batch] fixed varlen lengths                 */
    int causal, use_window;
    int32_t window_left, window_right;
    float softcap, softmax_scale;
    fa_test_alibi alibi;
    int sinks;
    fa_test_layout layout;        /* packed QKV needs equal q/k lengths and d == dv, otherwise
                                     PADDED is used instead (the problem's spec says which)    */
    int pad_align;                /* padding granularity in elements (1 if 0)                 */
    int backward;                 /* allocate dout, dq, dk, dv, dsink                         */
    double q_amplitude;           /* q = amplitude·randn (0 means 1): > 1 sharpens softmax    */
    float dropout_p;              /* attention dropout (0 = off), with the two fields below  */
    uint64_t dropout_seed, dropout_offset;
    int deterministic;            /* fa_params.deterministic of the problem                   */
    uint64_t seed;
} fa_test_spec;

enum fa_test_tensor {
    FA_T_Q, FA_T_K, FA_T_V, FA_T_O, FA_T_DO, FA_T_DQ, FA_T_DK, FA_T_DV, /* strided 4-D      */
    FA_T_LSE, FA_T_DSINK, FA_T_CU_Q, FA_T_CU_K, FA_T_ALIBI, FA_T_SINK,   /* flat             */
    FA_T_COUNT
};
#define FA_T_STRIDED_COUNT (FA_T_DV + 1)

typedef struct fa_test_view {
    int buffer;     /* which fa_test_problem.buffer holds it (-1: tensor absent)              */
    int64_t offset; /* first element within that buffer                                    */
    int64_t batch_stride, row_stride, head_stride;
} fa_test_view;

typedef struct fa_test_buffer {
    void *host;     /* NULL: unused                                                          */
    size_t bytes;
    size_t elem_size;
    void *device;   /* mirror in device memory (managed by the sweep), or NULL              */
    void *saved;    /* inputs: copy taken at creation, to prove the library did not write   */
    int is_output;
} fa_test_buffer;

typedef struct fa_test_problem {
    fa_test_spec spec; /* as used: layout possibly replaced, lengths filled in             */
    int64_t rows_q, rows_k, total_q, total_k;
    int32_t lens_q_storage[64], lens_k_storage[64];
    fa_test_view view[FA_T_COUNT];
    fa_test_buffer buffer[FA_T_COUNT];
    fa_params params; /* host pointers, everything set (num_threads 0)                     */
} fa_test_problem;

#define FA_TEST_MAX_BATCH 64

/* Quiet-NaN bit patterns with a marker payload: an output element still holding one was never
 * written (a NaN the library computes has another payload). */
#define FA_TEST_POISON_F32 0x7fc5a5a5u
#define FA_TEST_POISON_F16 0x7f5au
#define FA_TEST_POISON_BF16 0x7fe5u

/* Allocate, fill inputs, poison outputs. Returns 0, or -1 (bad spec / out of memory). */
int fa_test_problem_create(fa_test_problem *tp, const fa_test_spec *spec);
void fa_test_problem_destroy(fa_test_problem *tp);
/* fa_params with device pointers (buffer[i].device) instead of host ones. */
fa_params fa_test_problem_device_params(const fa_test_problem *tp);
/* Poison (NaN with a marker payload) whole output buffers: forward (o, lse) or backward ones. */
void fa_test_poison_forward_outputs(fa_test_problem *tp);
void fa_test_poison_backward_outputs(fa_test_problem *tp);
/* 1 if every input buffer is bit-identical to its state at creation. */
int fa_test_inputs_unchanged(const fa_test_problem *tp);
/* 1 if the buffer of `tensor` still holds only poison (bit-identical). */
int fa_test_buffer_all_poison(const fa_test_problem *tp, int tensor);
/* Copy the current output buffer contents (for later bitwise comparison); caller frees. */
void *fa_test_snapshot(const fa_test_problem *tp, int tensor);
int fa_test_same_as_snapshot(const fa_test_problem *tp, int tensor, const void *snapshot);
/* Feature summary like "causal+window(3,-1)+softcap+alibi(bh)+sink"; "plain" if none. */
void fa_test_describe(const fa_test_problem *tp, char *buf, size_t size);

/* ---- comparison --------------------------------------------------------------------------- */

typedef struct fa_test_check {
    double err;        /* max |ours - ref64| over finite reference elements                  */
    double ref_max;    /* max |ref64|                                                         */
    double base_err;   /* max |baseline - ref64|                                              */
    double term_max;   /* max term magnitude (0 where not tracked)                            */
    double dnoise_max; /* dq, dk: max spread from O's storage rounding through D, per 2^-mantissa */
    double floor;      /* absolute floor of the tolerance                                     */
    double tol;        /* 2·base_err + floor                                                  */
    int64_t checked;   /* logical elements compared                                           */
    int64_t unwritten; /* logical elements still holding the poison pattern                  */
    int64_t nonfinite; /* ours NaN/inf where ref finite, or -inf mismatches (lse)            */
    int64_t clobbered; /* non-logical elements of the buffer that changed (padding, unused rows) */
    int ok;
} fa_test_check;

/* Rows the oracle finds fully masked (LSE = -inf, no sinks) must be exact in tp's host buffers:
 * O = 0 and LSE = -inf. Returns the number of elements that are not. */
int64_t fa_test_masked_rows_inexact(const fa_test_problem *tp, const fa_ref_outputs *ref64);

/* Compare output tensor FA_T_O / LSE / DQ / DK / DV / DSINK of tp (host buffer) against the
 * canonical float64 reference (fa_ref64_run) and baseline (fa_ref_baseline_run). */
fa_test_check fa_test_compare(const fa_test_problem *tp, int tensor, const fa_ref_outputs *ref64,
                              const fa_ref_outputs *baseline);

/* The LSE floor the fp8 tensor cores add (e4m3 inputs on CUDA): the hardware keeps about 14 bits
 * of a k32 step's sum, aligned to the step's largest product, and the baseline's model of that
 * (fp8_mma_step) may cut a step at another of those bits (where exactly the hardware aligns and
 * rounds is not documented): one unit of the 14th bit per step, the zero step of a padded head dim
 * included. With the largest score magnitude (term_max of the LSE check) standing for a step's
 * largest product, steps · 2^-13 · term_max: 2.4e-4 of |s| at d = 64, far below a semantic
 * error (a key of weight 1e-2 moves LSE by 1e-2). O needs none: P is rounded to e4m3 after S. */
double fa_test_fp8_score_noise(int64_t head_dim, double term_max);

/* Adds `extra` to a finished check's floor and tolerance and re-judges it. */
void fa_test_check_widen(fa_test_check *c, double extra);

/* ---- fp8 inputs (FA_DTYPE_FP8_E4M3) -------------------------------------------------------
 * An fp8 call is tested through a problem created in bf16: each valid q / k / v element x of
 * sequence b and head h becomes ds · e4m3(x / ds) in place, ds = descale[b·heads_kv + h / group]
 * a power of two (2^-3 .. 2^3, drawn from `seed`; 1 when !scaled), so it stays exact in bf16 and
 * the float64 reference and the bf16 baseline of the problem are those of the fp8 call; the codes
 * go into byte arrays of the buffers' shapes. The inputs' saved copies are refreshed. */
typedef struct fa_test_fp8 {
    uint8_t *code[4], *saved[4]; /* q, k, v, dout: one byte per element of their buffers; a copy
                                    (dout: only after fa_test_fp8_quantise_dout)             */
    size_t count[4];
    float *descale[4];           /* q, k, v, dout: [batch, heads_kv]                         */
} fa_test_fp8;
double fa_test_e4m3_value(uint8_t code);     /* the oracle's own e4m3 decoding (NaN for S.1111.111) */
uint8_t fa_test_e4m3_nearest(double x);      /* nearest code, ties to even, saturating at ±448  */
int fa_test_fp8_quantise(fa_test_problem *tp, int scaled, uint64_t seed, fa_test_fp8 *f); /* 0, or -1 (memory) */
/* dout too, the same way (its own powers of two from `seed`): fa_test_fp8_params then passes it
 * in e4m3 (dout_e4m3 = 1, dout_descale). 0, or -1 (memory; fa_test_fp8_free still frees). */
int fa_test_fp8_quantise_dout(fa_test_problem *tp, uint64_t seed, fa_test_fp8 *f);
void fa_test_fp8_free(fa_test_fp8 *f);
/* tp's parameters with dtype FA_DTYPE_FP8_E4M3, q / k / v the codes (at the views' offsets) and,
 * with_descales, the descale arrays; dout's codes and factors once quantised. */
fa_params fa_test_fp8_params(const fa_test_problem *tp, const fa_test_fp8 *f, int with_descales);
/* 1 if the codes still equal their state after quantisation. */
int fa_test_fp8_unchanged(const fa_test_fp8 *f);
/* Tolerance floor for a tensor whose values are stored or limited by `dtype`: the larger of one
 * unit in the last place of the dtype at magnitude max|ref| + 0.3 (FlashAttention-3's atol) and
 * eight fp32 units at the largest term magnitude (see reference.c). */
double fa_test_floor(fa_dtype dtype, double ref_max, double term_max);
/* The canonical array of `tensor` (FA_T_O ... FA_T_DSINK) in outputs, or NULL. */
double *fa_ref_tensor(const fa_ref_outputs *outputs, int tensor);
double *fa_ref_tensor_magnitude(const fa_ref_outputs *outputs, int tensor);
/* Max |a - b| between two runs' outputs of `tensor` over logical elements (NaN-aware: a NaN
 * anywhere gives inf). */
double fa_test_max_diff(const fa_test_problem *tp, int tensor, const void *a_host,
                        const void *b_host);
const char *fa_test_tensor_name(int tensor);

/* ---- score modifications of a test problem: bias, dbias, block masks, document ids ---------- */

typedef enum fa_test_bias_kind {
    FA_TEST_BIAS_NONE = 0,
    FA_TEST_BIAS_FULL,   /* [b, h, sq, sk]                                                      */
    FA_TEST_BIAS_HEAD,   /* [1, h, sq, sk]: batch stride 0                                      */
    FA_TEST_BIAS_KEYPAD, /* [b, 1, 1, sk]: a padding mask, -inf on some keys (some whole rows)   */
    FA_TEST_BIAS_ROW,    /* [b, h, sq, 1]: key stride 0                                         */
} fa_test_bias_kind;

typedef struct fa_test_mods_spec {
    fa_test_bias_kind bias;
    fa_dtype bias_dtype;
    int neg_inf_rows; /* FULL / HEAD: some rows entirely -inf, some elements -inf             */
    int dbias;        /* a NaN-poisoned dbias (dbias_dtype) with the bias's strides            */
    int blocks;       /* random block mask                                                    */
    int64_t block_q, block_k;
    int broadcast_blocks; /* lists shared by every batch and head (strides 0)                 */
    int bits, docs;       /* partial-block bit masks; document ids                             */
    fa_dtype dbias_dtype; /* dbias's dtype: F32 (0), F16 or BF16                               */
} fa_test_mods_spec;

/* How the random block lists and documents are drawn: a block row has no blocks with
 * probability empty_row; otherwise each key block is partial with probability partial, else
 * full below the cumulative probability partial_or_full; a new document starts at each query
 * token with probability new_document (keys follow the queries' proportions). */
typedef struct fa_test_mods_odds {
    double empty_row, partial, partial_or_full, new_document;
} fa_test_mods_odds;

enum {
    FA_TEST_MOD_BIAS, FA_TEST_MOD_DBIAS, FA_TEST_MOD_COUNTS, FA_TEST_MOD_INDICES, FA_TEST_MOD_FULL_COUNTS,
    FA_TEST_MOD_FULL_INDICES, FA_TEST_MOD_BITS, FA_TEST_MOD_DOC_Q, FA_TEST_MOD_DOC_K, FA_TEST_MOD_COUNT
};

/* The host arrays of one problem's modifications (NULL where unused) and their sizes in bytes. */
typedef struct fa_test_mods {
    void *array[FA_TEST_MOD_COUNT];
    size_t bytes[FA_TEST_MOD_COUNT];
} fa_test_mods;

/* Draws the modifications of ms from rng into host arrays owned by m and attaches them to p
 * (pointers and strides; the strides are padded). Returns 0, or -1 out of memory with nothing
 * attached or left to free. Free with fa_test_mods_free. */
int fa_test_mods_make(fa_test_mods *m, fa_params *p, const fa_test_mods_spec *ms, const fa_test_mods_odds *odds,
                      fa_test_rng *rng);
void fa_test_mods_free(fa_test_mods *m);

/* ==== KV-cache decoding and state merging ================================================== */

/* A fa_kvcache_forward test problem: q, caches (contiguous or paged), optional appended k/v,
 * rotary tables, cache_seqlens / cache_batch_idx / cache_leftpad / block_table, every mask
 * feature. Cache slots no sequence attends hold large values (+-300) so a wrong slot read shows;
 * block-table entries no call reads hold out-of-range ids. Outputs are NaN-poisoned. */
typedef struct fa_kv_spec {
    fa_dtype dtype;
    int64_t batch, seqlen_q, heads_q, heads_kv, head_dim, head_dim_v; /* dv 0 = d            */
    int64_t capacity;            /* seqlen_k: tokens per cache row / per sequence (paged)     */
    int64_t page_size;           /* 0: contiguous cache; >= 1: paged                          */
    int append;                  /* k_new / v_new written at cache_seqlens before attending   */
    int64_t seqlen_new;          /* tokens appended per sequence (append): 0 = seqlen_q       */
    int64_t rotary_dim;          /* 0: off (needs append)                                     */
    int rotary_interleaved;
    int no_seqlens;              /* cache_seqlens NULL (every sequence holds `capacity` keys) */
    int batch_idx;               /* contiguous: cache_batch_idx into a larger cache            */
    int leftpad;                 /* cache_leftpad drawn in [0, cache_seqlens]                  */
    int full;                    /* every cache_seqlens at the maximum (no random lengths)    */
    int causal, use_window;
    int32_t window_left, window_right;
    float softcap, softmax_scale;
    fa_test_alibi alibi;
    int sinks;
    int no_lse;                  /* lse = NULL                                                 */
    int num_splits;
    int padded;                  /* random padding in every stride                            */
    int pad_align;               /* padding granularity in elements (1 if 0)                  */
    double q_amplitude;          /* 0 means 1                                                 */
    uint64_t seed;
} fa_kv_spec;

enum fa_kv_buffer {
    FA_KV_Q, FA_KV_KCACHE, FA_KV_VCACHE, FA_KV_KNEW, FA_KV_VNEW, FA_KV_O, FA_KV_LSE, FA_KV_COS,
    FA_KV_SIN, FA_KV_ALIBI, FA_KV_SINK, FA_KV_SEQLENS, FA_KV_BATCH_IDX, FA_KV_LEFTPAD,
    FA_KV_BLOCK_TABLE, FA_KV_BUFFER_COUNT
};

typedef struct fa_kv_problem {
    fa_kv_spec spec;                 /* as used (dv, amplitude, alignment defaulted)           */
    fa_test_buffer buffer[FA_KV_BUFFER_COUNT]; /* host (and device) copies; saved = initial   */
    int32_t cached[FA_TEST_MAX_BATCH], start[FA_TEST_MAX_BATCH]; /* cache_seqlens, leftpad     */
    int64_t cache_rows;              /* contiguous: rows of the cache; paged: num_pages        */
    fa_params params;                /* host pointers, everything set (num_threads 0)          */
} fa_kv_problem;

int fa_kv_problem_create(fa_kv_problem *kp, const fa_kv_spec *spec); /* 0, or -1 bad spec / OOM */
void fa_kv_problem_destroy(fa_kv_problem *kp);
/* fa_params pointing at the buffers' device copies instead of the host ones. */
fa_params fa_kv_problem_device_params(const fa_kv_problem *kp);
/* Restore the caches to their initial contents and poison o / lse again (to rerun a call). */
void fa_kv_problem_reset(fa_kv_problem *kp);
/* "bf16 b=3 sq=1 hq=8 hkv=2 d=64 cap=300 paged(3) append rotary(32,i) causal ..." */
void fa_kv_describe(const fa_kv_spec *s, char *buf, size_t size);

/* Result of checking a finished call against the float64 oracle. */
typedef struct fa_kv_check {
    fa_test_check o, lse;            /* as fa_test_compare (lse.checked = 0 without lse)       */
    int64_t masked_violations;       /* rows with no key: O != 0 or LSE not -inf / the sink    */
    int64_t cache_k_bad;             /* appended k elements off by more than one dtype ulp     */
    int64_t cache_v_bad;             /* appended v elements not bit-identical to v_new         */
    int64_t cache_clobbered;         /* other cache elements that changed                      */
    int inputs_unchanged;            /* q, k_new, v_new, tables, slopes, sinks bit-identical   */
    int ok;
} fa_kv_check;

/* Compare the host buffers of kp (after a successful call) with the oracle: o and lse by the
 * 2·baseline + floor rule, the cache update element by element, inputs, padding. */
fa_kv_check fa_kv_verify(const fa_kv_problem *kp);
/* After a failed call: 1 if no output and no cache element changed (o / lse still poison). */
int fa_kv_untouched(const fa_kv_problem *kp);
/* " o 1.2e-3/4.0e-3 lse ... cache ok" */
void fa_kv_format(const fa_kv_check *c, char *buf, size_t size);

/* A fa_merge_states test problem: num_states partial states per (row, head), a share of them
 * empty (lse = -inf, their o rows NaN: they must not be read), some rows with every state
 * empty. */
typedef struct fa_merge_spec {
    fa_dtype parts_dtype, out_dtype;
    int64_t num_states, rows, heads, head_dim_v;
    double empty_share;              /* probability that a state is empty                      */
    int no_lse;                      /* lse output NULL                                         */
    int padded;
    int pad_align;
    uint64_t seed;
} fa_merge_spec;

enum fa_merge_buffer { FA_MG_PARTS, FA_MG_LSE_PARTS, FA_MG_O, FA_MG_LSE, FA_MG_BUFFER_COUNT };

typedef struct fa_merge_problem {
    fa_merge_spec spec;
    fa_test_buffer buffer[FA_MG_BUFFER_COUNT];
    fa_merge_params params;          /* host pointers                                          */
} fa_merge_problem;

int fa_merge_problem_create(fa_merge_problem *mp, const fa_merge_spec *spec);
void fa_merge_problem_destroy(fa_merge_problem *mp);
fa_merge_params fa_merge_problem_device_params(const fa_merge_problem *mp);
void fa_merge_describe(const fa_merge_spec *s, char *buf, size_t size);
/* o against a float64 merge (tolerance: 2·error of an fp32 merge rounded to out_dtype + floor),
 * lse likewise, all-empty rows exact (0 / -inf), padding untouched, inputs unchanged. */
typedef struct fa_merge_check {
    fa_test_check o, lse;
    int64_t empty_violations;
    int inputs_unchanged;
    int ok;
} fa_merge_check;
fa_merge_check fa_merge_verify(const fa_merge_problem *mp);

#endif /* FA_TESTS_REFERENCE_H */
