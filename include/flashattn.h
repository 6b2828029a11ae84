/*
 * flashattn.h: IO-aware exact attention (FlashAttention) with a C ABI.
 *
 *   O = softmax(Q Kᵀ · scale [+ softcap, ALiBi, masks, sinks]) V
 *
 * computed tile by tile with an online softmax, so the seqlen_q × seqlen_k score matrix never
 * reaches main memory. The forward pass returns O and the row log-sum-exp (LSE); the backward
 * pass recomputes the tiles from Q, K, V, O, LSE and dO.
 *
 * One call describes everything through one flat, zero-initialisable struct, `fa_params`, that is
 * shared by the CPU and GPU paths:
 *
 *     fa_params p = {0};
 *     p.dtype = FA_DTYPE_BF16;  p.device = FA_DEVICE_CPU;
 *     p.batch = 2; p.seqlen_q = 1024; p.seqlen_k = 1024; p.heads_q = 16; p.heads_kv = 4;
 *     p.head_dim = 128;                          // head_dim_v = 0 means head_dim
 *     p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse;
 *     fa_set_contiguous_strides(&p);             // or set the *_stride fields by hand
 *     p.causal = 1;
 *     if (fa_forward(&p) != FA_OK) fprintf(stderr, "%s\n", fa_last_error());
 *
 * Tensor layouts (all strides are in ELEMENTS, the last dimension is always contiguous):
 *   q    [batch, seqlen_q, heads_q,  head_dim]      q_batch_stride, q_row_stride, q_head_stride
 *   k    [batch, seqlen_k, heads_kv, head_dim]      k_*_stride
 *   v    [batch, seqlen_k, heads_kv, head_dim_v]    v_*_stride
 *   o    [batch, seqlen_q, heads_q,  head_dim_v]    o_*_stride
 *   lse  [batch, heads_q, seqlen_q] fp32, contiguous (natural log)
 * Variable length (cu_seqlens_q and cu_seqlens_k set): sequences are packed along the token axis,
 * the batch strides are ignored, token t of sequence b lives at row cu_seqlens[b] + t, seqlen_q /
 * seqlen_k are the maxima over the batch, total_q / total_k give the packed row counts, and lse
 * is [heads_q, total_q].
 *
 * Masks (query i of a sequence of length sq, key j of a sequence of length sk, shift = sk - sq):
 *   causal:  key j visible iff j <= i + shift            (aligned to the bottom-right corner)
 *   window:  key j visible iff i + shift - window_left <= j <= i + shift + window_right
 *            (a negative side is unbounded; causal and window combine by intersection)
 * Score of a visible key:  s = scale·(q·k); if softcap > 0: s = softcap·tanh(s / softcap);
 *   if bias: s += bias[b, h, i, j]; if alibi: s -= slope·|i + shift - j|.
 * Block-sparse masks and document ids (kv_num_blocks ..., doc_ids_*) restrict the visible keys
 * further; with a block mask, causal and window apply inside its partial blocks only.
 * Sinks: one logit t_h per query head joins the softmax denominator, contributes no value:
 *   O_i = Σ_j exp(s_ij - LSE_i) v_j,  LSE_i = log(Σ_j exp(s_ij) + exp(t_h)).
 * A row with no visible key and no sink gets O = 0 and LSE = -inf (with a sink: O = 0, LSE = t_h).
 *
 * NaN: a NaN score (a NaN in q, in a visible key, or from an infinite input) makes that row's O
 * and LSE NaN, as in PyTorch; it is never turned into a masked row. Keys outside a row's mask do
 * not affect it. The backward of a NaN row gives NaN dq for the row, NaN dk / dv for the keys it
 * sees and NaN dsink for its head; dk / dv of other keys of the same sequence and kv head may
 * also be NaN (as in PyTorch, whose softmax of such a row is NaN everywhere). Every engine and
 * fa_merge_states (a state with LSE NaN) behaves the same.
 *
 * Memory: every pointer must be aligned to its element (2 or 4 bytes; int32 and fp32 arrays to 4)
 * and the byte span a tensor's strides reach must fit in 64 bits and in the address space
 * (FA_ERR_ALIGNMENT, FA_ERR_OVERFLOW). An output must not share a byte with any other tensor or
 * array of the call, input or output (FA_ERR_OVERLAP, naming both), in-place use (o == q)
 * included. Tensors interleaved in one buffer are fine: q, k, v (or dq, dk, dv) as slices of one
 * [batch, seq, heads_q + 2·heads_kv, dim] tensor, or a key/value cache packed along heads, share no
 * element and are accepted. Inputs may overlap each other freely. Fields a call does not use are
 * ignored whatever they hold (alibi_batch_stride without alibi_slopes, the rotary fields without
 * rotary tables, the backward fields in the forward).
 *
 * Errors: every call returns an fa_status. fa_strerror() names the code, fa_last_error() gives the
 * detailed message of the calling thread's last failed call (which field, which value). On error
 * nothing is written to any output. The library never aborts or exits.
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) && defined(FA_BUILD_SHARED)
#define FA_API __declspec(dllexport)
#elif defined(_WIN32) && defined(FA_USE_SHARED)
#define FA_API __declspec(dllimport)
#elif defined(__GNUC__) || defined(__clang__)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 1
#define FA_VERSION_PATCH 0

/* Largest head_dim / head_dim_v accepted by the CPU path (576: DeepSeek-style MLA decodes with
 * 576-dim queries and keys, 512-dim values); the CUDA fa_forward / fa_backward accept 8..256 in
 * multiples of 8. The CUDA fa_kvcache_forward accepts any 1..256 (others are copied zero-padded
 * into its workspace) and, above 256, multiples of 8 with head_dim <= 576 and head_dim_v <= 512
 * (MLA's latent cache: v the first head_dim_v columns of k; f16 / bf16 caches, no score bias;
 * separate K and V caches need an sm_90-class 227 KiB of shared memory per block).
 * fa_check_* says so precisely for a given configuration. */
#define FA_MAX_HEAD_DIM 576

typedef enum fa_status {
    FA_OK = 0,
    FA_ERR_NULL_POINTER = 1,    /* a required pointer is NULL                                   */
    FA_ERR_INVALID_SIZE = 2,    /* a size is zero/negative where it must be positive, or too big  */
    FA_ERR_OVERFLOW = 3,        /* sizes × strides overflow 64-bit element offsets              */
    FA_ERR_HEADS = 4,           /* heads_q is not a multiple of heads_kv                        */
    FA_ERR_HEAD_DIM = 5,        /* head_dim or head_dim_v out of the supported range            */
    FA_ERR_STRIDE = 6,          /* a stride is negative, or an output stride makes rows overlap */
    FA_ERR_CU_SEQLENS = 7,      /* cu_seqlens does not start at 0, decreases, or exceeds a max  */
    FA_ERR_SOFTCAP = 8,         /* softcap is NaN, infinite or negative                         */
    FA_ERR_SCALE = 9,           /* softmax_scale is NaN or infinite                             */
    FA_ERR_DTYPE = 10,          /* unknown dtype, or a dtype the chosen device does not support */
    FA_ERR_DEVICE = 11,         /* unknown device, or the device is not available in this build */
    FA_ERR_UNSUPPORTED = 12,    /* a valid combination of features this path does not implement */
    FA_ERR_WORKSPACE = 13,      /* caller workspace too small (fa_check_* gives the size)       */
    FA_ERR_ALLOC = 14,          /* host or device memory allocation failed                      */
    FA_ERR_CUDA = 15,           /* a CUDA runtime call or kernel launch failed                  */
    FA_ERR_INVALID_ARGUMENT = 16, /* any other invalid field value (enum out of range, ...)     */
    FA_ERR_ALIGNMENT = 17,      /* a pointer or stride is not aligned as the device path needs  */
    FA_ERR_OVERLAP = 18,        /* an output shares memory with another tensor of the call      */
    FA_STATUS_COUNT_ = 19
} fa_status;

typedef enum fa_dtype {
    FA_DTYPE_F32 = 0, /* float32 (CPU only)                    */
    FA_DTYPE_F16 = 1, /* IEEE half                              */
    FA_DTYPE_BF16 = 2, /* bfloat16                              */
    FA_DTYPE_FP8_E4M3 = 3 /* OCP fp8 e4m3 (max 448, no infinities) q, k, v with the fp32
                             descale factors q_descale / k_descale / v_descale; o (and dout,
                             dq, dk, dv: the gradients of the dequantised q, k, v) bfloat16;
                             dout may be e4m3 as well (dout_e4m3, dout_descale).
                             CPU: fa_forward and fa_backward. CUDA: fa_forward on sm_90
                             (H100 / H200), head dims multiples of 8 up to 256, q / k / v
                             strides multiples of 16 bytes, P·V in e4m3 as FlashAttention-3's;
                             not with ALiBi, a negative scale, dropout, score modifications
                             or a paged K/V; a workspace for V's transposed copy
                             (none where the kernel transposes V: d and dv in 65..128,
                             or up to 64 with at most 4,096 query rows per kv head).
                             fa_backward (sm_80+): the bf16 backward on bf16 copies of the
                             dequantised q, k, v (descale · x rounded to bf16) in the
                             workspace, with its head dims and features; on sm_90 with
                             an e4m3 dout and d or dv in 65..128 (no softcap, ALiBi,
                             negative scale, dropout or score modifications), Sᵀ and
                             dPᵀ from the e4m3 codes on the fp8 tensor cores          */
} fa_dtype;

typedef enum fa_device {
    FA_DEVICE_CPU = 0, /* host memory, computed by the multithreaded SIMD engine               */
    FA_DEVICE_CUDA = 1 /* device memory of the current CUDA device, computed on `stream`       */
} fa_device;

/* Storage of a quantised KV cache (fa_params.kv_dtype; fa_kvcache_forward on the CPU and on
 * CUDA). The cache's strides (k_*_stride, v_*_stride) then count bytes. */
typedef enum fa_kv_dtype {
    FA_KV_SAME = 0,     /* k / v hold dtype values (no quantisation)                            */
    FA_KV_INT8 = 1,     /* int8 q, one fp32 scale per (token, kv head): x = scale · q            */
    FA_KV_Q8_0 = 2,     /* llama.cpp block_q8_0: per 32 values an f16 scale d then 32 int8 q,
                           34 bytes per block, x = d · q; head dims multiples of 32, no scale
                           arrays                                                              */
    FA_KV_FP8_E4M3 = 3  /* OCP fp8 e4m3 (max 448, no infinities), one fp32 scale per kv head:
                           x = scale · fp8                                                     */
} fa_kv_dtype;

/* Everything one attention call needs. Zero-initialise, then set what you use; a zeroed field
 * means "off" or "default" as documented. The same struct drives fa_forward and fa_backward. */
typedef struct fa_params {
    /* ---- where and in what type ---------------------------------------------------------- */
    fa_device device; /* FA_DEVICE_CPU (0) or FA_DEVICE_CUDA                                  */
    fa_dtype dtype;   /* element type of q, k, v, o (and do, dq, dk, dv); F32 (0), F16, BF16   */

    /* ---- sizes ---------------------------------------------------------------------------- */
    int64_t batch;      /* number of sequences, >= 1                                          */
    int64_t seqlen_q;   /* query tokens per sequence (varlen: the maximum), >= 0              */
    int64_t seqlen_k;   /* key tokens per sequence (varlen: the maximum), >= 0                */
    int64_t heads_q;    /* query heads, >= 1, a multiple of heads_kv                          */
    int64_t heads_kv;   /* key/value heads, >= 1 (1 = MQA, < heads_q = GQA)                   */
    int64_t head_dim;   /* d of q and k, 1..FA_MAX_HEAD_DIM                                   */
    int64_t head_dim_v; /* d of v and o; 0 means head_dim                                     */

    /* ---- forward tensors ------------------------------------------------------------------ */
    const void *q; /* [batch, seqlen_q, heads_q, head_dim]                                    */
    const void *k; /* [batch, seqlen_k, heads_kv, head_dim]                                   */
    const void *v; /* [batch, seqlen_k, heads_kv, head_dim_v]                                 */
    void *o;       /* [batch, seqlen_q, heads_q, head_dim_v]  forward output                  */
    float *lse;    /* [batch, heads_q, seqlen_q] (varlen [heads_q, total_q]) fp32; forward
                      output (may be NULL in the forward: then it is not written), backward input */
    int64_t q_batch_stride, q_row_stride, q_head_stride;
    int64_t k_batch_stride, k_row_stride, k_head_stride;
    int64_t v_batch_stride, v_row_stride, v_head_stride;
    int64_t o_batch_stride, o_row_stride, o_head_stride;

    /* ---- variable length ------------------------------------------------------------------ */
    const int32_t *cu_seqlens_q; /* [batch + 1] prefix sums of query lengths, or NULL         */
    const int32_t *cu_seqlens_k; /* [batch + 1] prefix sums of key lengths; both or neither    */
    int64_t total_q; /* varlen only: rows of the packed q/o (>= cu_seqlens_q[batch]); sets the
                        lse layout [heads_q, total_q]. On the GPU cu_seqlens live in device
                        memory and are not read by the host, so these bound every access.      */
    int64_t total_k; /* varlen only: rows of the packed k/v (>= cu_seqlens_k[batch])           */
    int zero_varlen_tail; /* varlen only: nonzero = the rows past the last sequence are written
                             as zeros (fa_forward: rows cu_seqlens_q[batch] .. total_q of o and
                             lse; fa_backward: those of dq and rows cu_seqlens_k[batch] .. total_k
                             of dk and dv), so a caller needs no zero fill of whole buffers;
                             0 = those rows are not written                                     */

    /* ---- score transformation and masks --------------------------------------------------- */
    float softmax_scale; /* multiplies q·k; 0 means 1/sqrt(head_dim)                          */
    int causal;          /* nonzero: bottom-right aligned causal mask                         */
    int use_window;      /* nonzero: apply window_left / window_right                         */
    int32_t window_left;  /* keys visible to the left of the diagonal; < 0: unbounded         */
    int32_t window_right; /* keys visible to the right of the diagonal; < 0: unbounded        */
    float softcap;        /* > 0: s = softcap·tanh(s / softcap); 0: off                        */
    const float *alibi_slopes;     /* [heads_q] or [batch, heads_q] fp32, or NULL             */
    int64_t alibi_batch_stride;    /* 0: one slope per head; heads_q (or more): per batch×head;
                                      ignored when alibi_slopes is NULL                        */
    const float *sink_logits;      /* [heads_q] fp32 learnable sink logits, or NULL           */

    /* ---- backward tensors (fa_backward only) ---------------------------------------------- */
    const void *dout; /* [batch, seqlen_q, heads_q, head_dim_v] gradient of o                 */
    void *dq;         /* [batch, seqlen_q, heads_q, head_dim]   output                        */
    void *dk;         /* [batch, seqlen_k, heads_kv, head_dim]  output (summed over GQA group) */
    void *dv;         /* [batch, seqlen_k, heads_kv, head_dim_v] output (summed over group)   */
    float *dsink;     /* [heads_q] fp32 gradient of sink_logits (overwritten), or NULL        */
    int64_t do_batch_stride, do_row_stride, do_head_stride;
    int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
    int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
    int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
    int deterministic; /* nonzero: GPU backward gives bitwise-identical dq/dk/dv run to run
                          (the CPU path always does for a fixed num_threads)                  */

    /* ---- KV-cache decoding (fa_kvcache_forward; block_table also fa_forward) --------------- */
    /* k and v are the cache: contiguous [cache_batch, seqlen_k, heads_kv, d] (seqlen_k = capacity),
     * or, with block_table, a page pool [num_pages, page_size, heads_kv, d] whose k/v batch
     * stride is the page stride. q holds seqlen_q >= 1 new tokens per sequence.
     * fa_forward with block_table (a paged K/V, e.g. chunked prefill; forward only): k and v are
     * such a page pool, key t of sequence b lives in page block_table[b][t / page_size] at row
     * t % page_size; the key lengths are seqlen_k (batched) or cu_seqlens_k[b + 1] -
     * cu_seqlens_k[b] (varlen: cu_seqlens_k gives lengths only, total_k is ignored);
     * block_table_batch_stride >= ceil(seqlen_k / page_size). cache_* and k_new are not used.
     * A latent cache (DeepSeek-style MLA: v = k with k's strides, head_dim_v <= head_dim, e.g.
     * 576 / 512): v is read as k's first head_dim_v columns, and an append needs v_new = k_new
     * with k_new's strides (no rotary); the cache is one tensor, nothing is copied. */
    const int32_t *cache_seqlens;   /* [batch] tokens already in the cache; NULL = seqlen_k   */
    const int32_t *cache_batch_idx; /* [batch] cache row of sequence b (contiguous only); NULL = b */
    const int32_t *cache_leftpad;   /* [batch] first valid cache token of sequence b; NULL = 0 */
    const int32_t *block_table;     /* [batch, block_table_batch_stride] page ids, or NULL     */
    int64_t block_table_batch_stride; /* >= pages per sequence = ceil(seqlen_k / page_size)   */
    int64_t page_size;              /* tokens per page (>= 1) with block_table                 */
    int64_t num_pages;              /* pages in the pool, bounds every block_table entry       */
    int64_t cache_batch;            /* contiguous caches: rows of k/v; 0 = batch               */
    const void *k_new; /* [batch, seqlen_new, heads_kv, head_dim] written into the cache at
                          cache_seqlens before attending (cache_seqlens required), or NULL      */
    const void *v_new; /* [batch, seqlen_new, heads_kv, head_dim_v], set together with k_new   */
    int64_t knew_batch_stride, knew_row_stride, knew_head_stride;
    int64_t vnew_batch_stride, vnew_row_stride, vnew_head_stride;
    int64_t seqlen_new; /* tokens per sequence in k_new / v_new (their row axis; the strides
                           above step over it); 0 = seqlen_q. May differ from seqlen_q: the
                           seqlen_q queries are the last ones of the cache_seqlens + seqlen_new
                           keys (query i at position cache_seqlens + seqlen_new - seqlen_q + i
                           for the causal / window masks and ALiBi), as flash_attn. Needs k_new. */
    const void *rotary_cos; /* [rotary_seqlen, rotary_dim / 2], dtype of q, or NULL            */
    const void *rotary_sin; /* same shape; rotary applies to q and k_new (as flash_attn does)  */
    int64_t rotary_dim;     /* even, <= head_dim (ignored, like rotary_seqlen and
                               rotary_interleaved, when rotary_cos is NULL)                    */
    int64_t rotary_seqlen;  /* rows of the cos/sin tables                                      */
    int rotary_interleaved; /* nonzero: rotate pairs (0,1),(2,3)..; zero: halves (i, i+dim/2)  */
    int num_splits;         /* split-KV: 0 = heuristic, 1 = no split, n = at most n splits     */

    /* ---- attention dropout (fa_forward / fa_backward) -------------------------------------- */
    /* P_ij (the softmax probability, sinks included in its denominator) is dropped with
     * probability p = round(dropout_p · 256) / 256 (dropout_p quantised to 1/256: 8-bit random
     * numbers; at most 255/256) and kept elements are scaled by 1 / (1 - p), the inverse of the
     * rate actually kept (so E[Z] = 1): O_i = Σ_j Z_ij P_ij v_j, Z_ij = keep_ij / (1 - p).
     * LSE is that of the softmax
     * without dropout. keep_ij comes from a counter-based generator (Philox4x32-7) keyed by
     * dropout_seed at a counter made of dropout_offset and the element's (sequence, query head,
     * query row, key) (src/api/fa_philox.h gives the exact mapping): the same seed and offset
     * give the same mask on every run, thread count and engine, and fa_backward regenerates it
     * from the same three fields (pass the forward's values). Calls sharing a seed get
     * independent masks when their offsets differ by at least ceil(seqlen_k / 16).
     * dropout_p < 1/512 rounds to no dropout. Needs batch·heads_q <= 2^32. CPU and CUDA (the same mask on both); not in
     * fa_kvcache_forward, fa_standard_forward or ring attention. */
    float dropout_p;         /* in [0, 1); 0 = no dropout                                     */
    uint64_t dropout_seed;   /* Philox key                                                     */
    uint64_t dropout_offset; /* Philox counter offset (advance it between calls sharing a seed) */
    float *attn_probs; /* fa_forward, testing at small sizes (CUDA: device memory), or NULL:
                          [batch, heads_q, seqlen_q, seqlen_k] fp32, contiguous (varlen:
                          seqlen_q / seqlen_k are the maxima, entries beyond a sequence's
                          lengths are 0): P_ij, the
                          softmax probabilities before dropout, stored negated (-P_ij) where
                          dropout drops the element (flash_attn's S_dmask encoding; a masked
                          key has P = 0). */

    /* ---- execution ------------------------------------------------------------------------ */
    int num_threads;       /* CPU worker threads; 0 = all online cores                         */
    void *stream;          /* CUDA: cudaStream_t to run on (NULL = default stream)             */
    void *workspace;       /* optional scratch in the device's memory; NULL = library allocates */
    size_t workspace_bytes; /* size of workspace                                               */

    /* ---- quantised KV cache (fa_kvcache_forward, CPU and CUDA) ----------------------------- */
    fa_kv_dtype kv_dtype; /* FA_KV_SAME (0): the cache is in dtype. Otherwise k / v hold the
                             format above (strides in bytes, head dims multiples of 8), the
                             append quantises k_new / v_new (int8 / Q8_0: scale = max|x| / 127
                             per token and head / per block, rounded to nearest; e4m3: x / scale
                             rounded to nearest even, saturating), and rotary is not supported.
                             CUDA: the same bytes as the CPU's append; the caches' addresses and
                             byte strides multiples of 4, Q8_0 head dims multiples of 64      */
    float *k_scale;       /* FA_KV_INT8: [cache rows or pages, rows, heads_kv] fp32 (written by
                             the append); FA_KV_FP8_E4M3: [heads_kv]; FA_KV_Q8_0: NULL. In the
                             memory of the call's device (CUDA: device memory, not checked)   */
    float *v_scale;       /* same for v                                                         */
    int64_t k_scale_batch_stride, k_scale_row_stride, k_scale_head_stride; /* FA_KV_INT8, floats */
    int64_t v_scale_batch_stride, v_scale_row_stride, v_scale_head_stride;

    /* ---- additive score bias (fa_forward, fa_backward, fa_kvcache_forward; CPU and CUDA) -- */
    /* bias[b, h, i, j] is added to the score of query i and key j of sequence b, query head h,
     * after scale and softcap (s = softcap·tanh(scale·q·k / softcap) + bias + ALiBi), before the
     * sinks and the masks; -inf masks the element (a row of -inf behaves like a fully masked
     * row: O = 0, LSE = -inf), NaN propagates into the row. i and j are positions within the
     * sequence: varlen calls index [batch, heads_q, seqlen_q, seqlen_k] with the sequence's own
     * rows (flash_attn's padded layout), fa_kvcache_forward with i = new query, j = cache slot
     * (cache_leftpad included). A stride of 0 broadcasts that axis (per-head tables [1, h, sq,
     * sk], per-batch key padding [b, 1, 1, sk], ...); the key axis is contiguous (1) or
     * broadcast (0). CUDA: not with dropout_p > 0 or a paged K/V in fa_forward / fa_backward
     * (FA_ERR_UNSUPPORTED). */
    const void *bias;     /* or NULL                                                          */
    fa_dtype bias_dtype;  /* F32 (0), F16 or BF16                                              */
    int64_t bias_batch_stride, bias_head_stride, bias_row_stride, bias_col_stride; /* elements */
    /* fa_backward: dL/dbias (overwritten), or NULL, in dbias_dtype: F32 (0), F16 or BF16 (the
     * bias's own dtype saves the caller a conversion pass; sums and the conversion run in fp32).
     * Its strides say its shape: an axis of stride 0 is summed over (dbias of a broadcast bias),
     * so give dbias the bias's own zero strides to get the gradient of the bias as stored. The
     * sums run in a fixed order: results are bitwise identical for any num_threads, and run to
     * run on CUDA (a summed axis costs a batch × heads_q × seqlen_q × seqlen_k fp32 workspace
     * there). */
    void *dbias;
    fa_dtype dbias_dtype;
    int64_t dbias_batch_stride, dbias_head_stride, dbias_row_stride, dbias_col_stride;

    /* ---- block-sparse mask (fa_forward, fa_backward; CPU and CUDA) ------------------------ */
    /* FlexAttention's BlockMask: query block qb = i / block_q of (b, h) attends the key blocks
     * kb (keys [kb·block_k, (kb + 1)·block_k)) listed for it, kv_num_blocks[b, h, qb] of them in
     * kv_indices[b, h, qb, 0..) ("partial": the element masks below apply inside) and
     * full_kv_num_blocks[b, h, qb] in full_kv_indices (every element visible, no element mask);
     * unlisted blocks are masked. Element masks (partial blocks, or everywhere without a block
     * mask): causal / window, document ids, and partial_block_bits. Lists are strictly
     * increasing block indices in [0, kv_blocks), kv_blocks = ceil(seqlen_k / block_k); a block
     * is in at most one of the two lists; entries past the count are not read. Index arrays are
     * [batch, heads_q, q_blocks, kv_blocks] (last axis contiguous), count arrays [batch,
     * heads_q, q_blocks] (last axis contiguous), q_blocks = ceil(seqlen_q / block_q); a stride
     * of 0 broadcasts. Varlen: i and j are positions within sequence b. The engine visits only
     * listed blocks. Any positive block sizes work on the CPU; CUDA wants multiples of its
     * kernels' tiles (FA_ERR_UNSUPPORTED naming block_q / block_k otherwise; 128 × 128 covers
     * all). On CUDA the arrays are device memory, checked on the device before anything is
     * written (one stream synchronisation per call; bad lists: FA_ERR_INVALID_ARGUMENT), unless
     * block_lists_checked says an earlier call accepted them. */
    int64_t block_q, block_k;            /* Q_BLOCK_SIZE, KV_BLOCK_SIZE (>= 1 with a mask)     */
    const int32_t *kv_num_blocks;        /* [batch, heads_q, q_blocks], or NULL: no block mask */
    const int32_t *kv_indices;           /* [batch, heads_q, q_blocks, kv_blocks]              */
    const int32_t *full_kv_num_blocks;   /* same shapes, or both NULL: no full blocks          */
    const int32_t *full_kv_indices;
    int64_t block_count_batch_stride, block_count_head_stride; /* count arrays, elements      */
    int64_t block_index_batch_stride, block_index_head_stride, block_index_row_stride;
    /* Any element pattern inside partial blocks, or NULL: bit (r, c) of query row qb·block_q + r
     * and key kb·block_k + c is 1 where visible, row-major, least significant bit first, in
     * ceil(block_q·block_k / 8) bytes per block; the block listed at kv_indices element offset
     * e (b·block_index_batch_stride + h·block_index_head_stride + qb·block_index_row_stride +
     * n) has its bytes at e·ceil(block_q·block_k / 8). */
    const uint8_t *partial_block_bits;
    /* 1: these block lists (the same arrays, unchanged, for the same batch, heads, seqlen_q,
     * seqlen_k and block sizes) were accepted by an earlier call: CUDA builds its block map
     * without waiting for the device's check (no host synchronisation, so the host runs ahead as
     * with any other call). Lists that are in fact invalid are then not reported: the kernels
     * still stay inside every array, but the outputs are unspecified. 0 (default): the call
     * waits for the check. The CPU checks the lists either way. Only 0 and 1 are valid. */
    int block_lists_checked;
    /* Documents (packed-sequence training): query i sees key j only if doc_ids_q[i] ==
     * doc_ids_k[j]; [batch, seqlen_q] / [batch, seqlen_k] int32 (varlen: [total_q] / [total_k]
     * by packed row); set both or neither. Combine with causal / window by intersection. */
    const int32_t *doc_ids_q, *doc_ids_k;
    int64_t doc_ids_q_batch_stride, doc_ids_k_batch_stride;

    /* ---- fp8 inputs (dtype = FA_DTYPE_FP8_E4M3; FlashAttention-3's names and layout) -------- */
    /* The values attended are q_descale[b, h / group] · q, k_descale[b, kvh] · k and
     * v_descale[b, kvh] · v (each [batch, heads_kv] fp32, contiguous; the query heads of a kv
     * group share q's factor). NULL means 1. Read by the host on the CPU: each must be finite
     * and > 0. On CUDA: device memory, read by the kernel (not checked). Ignored for the other
     * dtypes. */
    const float *q_descale, *k_descale, *v_descale;
    /* fa_backward: dout_e4m3 = 1 takes dout in e4m3 too (as cuDNN's fp8 backward takes dO), the
     * values dout_descale[b, h / group] · dout (dout_descale [batch, heads_kv] fp32 as q_descale,
     * NULL meaning 1), each rounded to bf16 before use: the gradients are those of a bf16 dout
     * holding those values. 0: dout is bf16 (o's dtype). Only with dtype = FA_DTYPE_FP8_E4M3;
     * fa_forward ignores both. */
    int dout_e4m3;
    const float *dout_descale;
} fa_params;

/* ---- calls ---------------------------------------------------------------------------------- */

/* Forward: writes o and (if non-NULL) lse. */
FA_API fa_status fa_forward(const fa_params *p);

/* Backward: reads q, k, v, o, lse, dout; writes dq, dk, dv and (if non-NULL) dsink. */
FA_API fa_status fa_backward(const fa_params *p);

/* Is this configuration supported, and how much workspace does it need? Validates exactly as the
 * call would (pointers included) and runs nothing. *workspace_bytes (if non-NULL) receives the
 * workspace size the call wants when the caller supplies one (0 if none is needed). */
FA_API fa_status fa_check_forward(const fa_params *p, size_t *workspace_bytes);
FA_API fa_status fa_check_backward(const fa_params *p, size_t *workspace_bytes);

/* KV-cache attention (decoding, speculative decoding, chunked prefill), as flash_attn's
 * flash_attn_with_kvcache: optionally rotates q and k_new (rotary_cos/sin), writes the
 * seqlen_new tokens of k_new/v_new into the cache at cache_seqlens[b] (in place, contiguous or
 * paged), then attends q to the valid keys, slots [cache_leftpad[b], cache_seqlens[b] (+
 * seqlen_new if appending)). Every mask feature applies (causal aligns the queries to the end of
 * the keys). Splits the cache across workers when batch × heads do not fill the machine
 * (num_splits) and merges the partial states. Writes o and (if non-NULL) lse.
 * Rotary positions are cache slots, left padding included (flash_attn 2.x): new key t sits at
 * L0 + t (L0 = cache_seqlens[b]); query i at L0 + i when causal or windowed, else every query
 * at L0. Rotary needs k_new, rotary_seqlen >= seqlen_k and, with fewer appended tokens than
 * queries, tables that reach the last query's position L0 + seqlen_q - 1. If two sequences
 * append to the same cache slot (a repeated cache_batch_idx, or shared pages), sequences are
 * appended in order and the last one wins. On the CPU cache_seqlens, cache_batch_idx,
 * cache_leftpad and block_table are host memory and checked; on CUDA they are device memory,
 * not read by the host, and clamped by the kernels. */
FA_API fa_status fa_kvcache_forward(const fa_params *p);
FA_API fa_status fa_check_kvcache(const fa_params *p, size_t *workspace_bytes);

/* Partial attention states (o_s, lse_s) over disjoint key sets, merged into the state over their
 * union: lse = log Σ_s exp(lse_s), o = Σ_s exp(lse_s - lse)·o_s. A state with lse_s = -inf is
 * empty and contributes nothing; if every state is empty, o = 0 and lse = -inf. This is the
 * combine step of split-KV decoding, cascade attention and ring attention. */
typedef struct fa_merge_params {
    fa_device device;
    fa_dtype parts_dtype; /* element type of o_parts (f32 recommended; f16/bf16 allowed)      */
    fa_dtype out_dtype;   /* element type of o (f32 on the CPU only)                          */
    int64_t num_states;   /* >= 1                                                             */
    int64_t rows;         /* query rows, >= 0                                                 */
    int64_t heads;        /* >= 1                                                             */
    int64_t head_dim_v;   /* 1..FA_MAX_HEAD_DIM                                               */
    const void *o_parts;  /* [num_states, rows, heads, head_dim_v]                            */
    int64_t o_parts_state_stride, o_parts_row_stride, o_parts_head_stride;
    const float *lse_parts; /* [num_states, heads, rows] fp32, natural log                    */
    int64_t lse_parts_state_stride, lse_parts_head_stride, lse_parts_row_stride;
    void *o;                /* [rows, heads, head_dim_v] output                               */
    int64_t o_row_stride, o_head_stride;
    float *lse;             /* [heads, rows] output, or NULL                                  */
    int64_t lse_head_stride, lse_row_stride;
    int num_threads;        /* CPU: 0 = all cores                                             */
    void *stream;           /* CUDA stream                                                    */
} fa_merge_params;

FA_API fa_status fa_merge_states(const fa_merge_params *m);

/* Standard (materialised) attention on the CPU, for comparison only: S = Q Kᵀ for a whole
 * (batch, head), softmax, then P V, all in fp32, with every feature above. Allocates O(seqlen_q ×
 * seqlen_k) memory per worker thread. Writes o and lse exactly like fa_forward. */
FA_API fa_status fa_standard_forward(const fa_params *p);

/* Fill every *_stride field (forward and backward tensors) for densely packed
 * [batch, seq, heads, dim] tensors (varlen, i.e. cu_seqlens_q set: [total, heads, dim] with batch
 * strides 0). Sizes must already be set. */
FA_API void fa_set_contiguous_strides(fa_params *p);

/* ---- errors and introspection --------------------------------------------------------------- */

FA_API const char *fa_strerror(fa_status status); /* short name of a status code              */
FA_API const char *fa_last_error(void);           /* detailed message, calling thread only    */
FA_API const char *fa_version(void);              /* "0.1.0"                                  */
FA_API int fa_cuda_available(void);               /* 1 if built with CUDA and a GPU is present */
/* SIMD level the CPU path uses: "avx512", "avx2", "neon", "sve256" or "scalar" */
FA_API const char *fa_cpu_isa(void);

/* ==== context parallelism: ring attention ==================================================== */
/*
 * Self-attention over sequences sharded across W ranks (GPUs of one job, or anything a transport
 * connects): rank r keeps its query shard; the key/value shards travel around the ring (r sends
 * to r + 1 and receives from r - 1, W - 1 steps); at each step every rank runs fa_forward on its
 * queries against the K/V shard it holds and merges the partial (O, LSE) into a running state
 * (fa_merge_states' math, in fp32). The next K/V transfer is posted before the current block is
 * computed, so communication overlaps computation. The backward passes fp32 dK/dV accumulators
 * around the ring with the K/V (one extra hop brings them home) and keeps dQ local; each block
 * pair runs fa_backward with the GLOBAL O and LSE (P = exp(S - LSE), D = rowsum(dO ∘ O)).
 *
 * Sharding: every sequence of L tokens is cut into C chunks (chunk c starts at c·(L/C) +
 * min(c, L%C) and has L/C + (c < L%C ? 1 : 0) tokens):
 *   FA_RING_CONTIGUOUS  C = W, rank r holds chunk r.
 *   FA_RING_ZIGZAG      C = 2W, rank r holds chunk r followed by chunk 2W-1-r: with a causal
 *                       mask every rank then has the same work at every step.
 * A rank's shard holds, for each sequence, its chunks in that order (fa_ring_shard gives them).
 *
 * Masks per block pair (causal): a K/V shard entirely in the queries' past is attended without a
 * mask, the rank's own shard with the causal mask, a shard entirely in the future is skipped
 * (zig-zag: own shard causal; an earlier rank's shard: all queries against its first chunk; a
 * later rank's: the second query chunk against both of its chunks). Supported: causal or not,
 * GQA / MQA, head_dim_v, softcap, softmax_scale, sinks (counted once: only the own-shard block
 * sees them), variable-length batches, f32 (CPU) / f16 / bf16. Not supported (FA_ERR_UNSUPPORTED):
 * sliding windows (use_window) and ALiBi, whose bias depends on global positions. Queries and
 * keys are the same tokens (seqlen_q = seqlen_k per sequence). Precision: every block pair's
 * partial O (dQ, dK, dV) leaves fa_forward (fa_backward) in the dtype before the fp32 merge
 * (sum), so with f16 / bf16 results can differ from one fa_forward over the whole sequence by
 * about one unit in the last place, within the library's accuracy rule.
 */
typedef enum fa_ring_sharding {
    FA_RING_CONTIGUOUS = 0, /* rank r holds chunk r of W                                       */
    FA_RING_ZIGZAG = 1      /* rank r holds chunks r and 2W-1-r of 2W (causal load balance)     */
} fa_ring_sharding;

/* Token ranges of rank `rank` in a sequence of `seqlen` tokens: *num_chunks (1 or 2) chunks,
 * chunk i covering [start[i], start[i] + length[i]) in the sequence, in shard order. */
FA_API fa_status fa_ring_shard(int64_t seqlen, int world_size, int rank, fa_ring_sharding sharding,
                               int64_t start[2], int64_t length[2], int *num_chunks);

/* The transport between neighbours. Every rank posts the same sequence of exchanges.
 *   send_recv: start one exchange: send `bytes` bytes at send_buf to rank (rank + 1) % W and
 *     receive `bytes` bytes into recv_buf from rank (rank + W - 1) % W. The buffers live in the
 *     call's device memory. CUDA: `stream` is the compute stream; the transfer must start after
 *     the work enqueued on it so far (which produced send_buf and last read recv_buf), e.g. by
 *     waiting on an event recorded there, and may complete later. CPU: `stream` is NULL and the
 *     call may complete the exchange before returning.
 *   wait: complete every exchange posted so far: CUDA: make `stream` wait for them (no host
 *     block needed); CPU: return once every receive buffer is filled and every send buffer may
 *     be reused.
 * Both return FA_OK or an error status; the ring call then fails with that status (its message
 * names the rank and the step). */
typedef struct fa_ring_comm {
    fa_status (*send_recv)(void *user, const void *send_buf, void *recv_buf, size_t bytes,
                           void *stream);
    fa_status (*wait)(void *user, void *stream);
    void *user; /* passed to both                                                               */
} fa_ring_comm;

typedef struct fa_ring_params {
    /* This rank's shard, as for fa_forward / fa_backward, with these differences:
     *   batched: seqlen_q = seqlen_k = the shard's tokens per sequence (0: taken from the
     *     sharding); q, k, v, o, dout, dq, dk, dv are [batch, shard tokens, heads, dim] and lse
     *     [batch, heads_q, shard tokens].
     *   varlen: cu_seqlens_q / cu_seqlens_k must be NULL (the ring derives the shard's lengths
     *     from `cu_seqlens` below); the shard packs, sequence after sequence, each sequence's
     *     chunks; total_q / total_k: 0 (= the shard's rows) or more; lse is [heads_q, total_q].
     *   use_window and alibi_slopes must be off; sink_logits may be set; dsink (backward)
     *     receives this rank's contribution: the gradient is its sum over the ranks.
     *   stream (CUDA): the compute stream. attn.workspace is not used: the inner fa_forward /
     *     fa_backward calls take their scratch from the ring's workspace below.
     * Backward: o and lse are this rank's outputs of fa_ring_forward (global O and LSE). */
    fa_params attn;
    int rank;                  /* 0 <= rank < world_size                                       */
    int world_size;            /* W >= 1                                                       */
    fa_ring_sharding sharding;
    int64_t seqlen;            /* batched: tokens per sequence over the whole ring             */
    const int32_t *cu_seqlens; /* varlen: [attn.batch + 1] prefix sums of the GLOBAL sequence
                                  lengths, in HOST memory on every device; NULL = batched       */
    fa_ring_comm comm;         /* send_recv / wait (not called when world_size = 1)            */
    void *workspace;           /* scratch in the device's memory (K/V in flight, the fp32
                                  running state, the inner calls' workspace); NULL = allocated
                                  and freed by each call (CUDA: stream-ordered)               */
    size_t workspace_bytes;    /* fa_ring_check_* gives the size needed                        */
} fa_ring_params;

/* One rank's part of ring attention: writes attn.o and (if non-NULL) attn.lse. Collective: every
 * rank of the ring calls it with matching sizes. Every check is done before any exchange; an
 * error after that (allocation, CUDA, transport) leaves the other ranks waiting, as with any
 * collective, and the communicator should be torn down. */
FA_API fa_status fa_ring_forward(const fa_ring_params *r);
/* Backward: reads attn.q, k, v, o, lse, dout; writes attn.dq, dk, dv and (if non-NULL) dsink. */
FA_API fa_status fa_ring_backward(const fa_ring_params *r);
/* Validate without communicating (every step's inner call included); *workspace_bytes (if
 * non-NULL) receives the workspace the call needs. */
FA_API fa_status fa_ring_check_forward(const fa_ring_params *r, size_t *workspace_bytes);
FA_API fa_status fa_ring_check_backward(const fa_ring_params *r, size_t *workspace_bytes);

/* The NCCL transport: ncclSend / ncclRecv to the neighbours in one NCCL group on `comm_stream`
 * (a cudaStream_t other than the compute stream, so transfers overlap the computation), ordered
 * after the compute stream by events. nccl_comm is an ncclComm_t; *rank and *world_size (if
 * non-NULL) receive its rank and size, to put into fa_ring_params. libnccl.so.2 is the one the
 * process already loaded (e.g. PyTorch's), else opened by name ($FA_NCCL_LIBRARY: a path to use
 * instead). Available when the library was
 * built with CUDA and nccl.h; otherwise FA_ERR_UNSUPPORTED ("built without NCCL"). Release with
 * fa_ring_comm_nccl_release (it does not destroy the NCCL communicator). */
FA_API fa_status fa_ring_comm_nccl(void *nccl_comm, void *comm_stream, fa_ring_comm *comm,
                                   int *rank, int *world_size);
FA_API void fa_ring_comm_nccl_release(fa_ring_comm *comm);
FA_API int fa_ring_nccl_built(void); /* 1 if the NCCL transport is compiled in                 */

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_H */
