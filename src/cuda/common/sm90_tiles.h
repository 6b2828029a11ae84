/*
 * sm90_tiles.h: tile shapes of the Hopper forward kernel (fwd_sm90.cu) and the
 * rule that decides which problems it takes, as pure functions usable from C (host code, tests)
 * and from CUDA (where the kernel takes them as compile-time constants; in C++ they are
 * constexpr).
 *
 * One CTA = BLOCK_M query rows of one (batch, query head): a producer warpgroup issuing TMA
 * loads and BLOCK_M / 64 consumer warpgroups of 64 rows each. Q [BLOCK_M, bucket] stays in shared
 * memory; K and
 * V tiles [BLOCK_N, bucket] stream through a STAGES-deep ring. Every tile is stored as
 * bucket/64 slabs of [rows, 64] 16-bit elements (128-byte rows, 128-byte swizzle).
 */
#ifndef FA_HOPPER_TILES_H
#define FA_HOPPER_TILES_H

#include <stddef.h>

#include "flashattn.h"

#ifdef __cplusplus
#define FA_HOPPER_FN static constexpr inline
#else
#define FA_HOPPER_FN static inline
#endif

/* Head-dim bucket of the forward kernel: d and dv are zero-padded up to its dims by the TMA loads
 * (columns past the tensor's last one read as zeros, output columns past dv are never written).
 * 64, 128, 256 and 512 (d and dv both up to it), and 192: d up to 192 with dv up to 128 (MLA's
 * prefill and training shape, 192 / 128, without padding either to 256); 0 = out of range (below
 * 64, above 512, or not a multiple of 8). Bucket 512 runs in CTA pairs (below). */
FA_HOPPER_FN int fa_hopper_bucket(int head_dim, int head_dim_v) {
    return head_dim < 64 || head_dim > 512 || head_dim % 8 != 0 || head_dim_v < 64 || head_dim_v > 512 ||
                   head_dim_v % 8 != 0
               ? 0
           : head_dim <= 64 && head_dim_v <= 64   ? 64
           : head_dim <= 128 && head_dim_v <= 128 ? 128
           : head_dim <= 192 && head_dim_v <= 128 ? 192
           : head_dim <= 256 && head_dim_v <= 256 ? 256
                                                  : 512;
}

/* CTAs per query tile: 2 at bucket 512, a thread-block cluster whose CTA r runs the bucket-256
 * tile on head-dim columns 256r .. 256r+255 of Q, K, V and O. A warpgroup cannot hold O [64, 512]
 * in fp32 registers (256 per thread), and one CTA cannot stage Q and K / V of 512 columns for 128
 * rows: each CTA computes partial scores over its columns, the two add each other's through
 * distributed shared memory (cuda_common.cuh's fa_pair_exchange), both then run the same softmax
 * on the same S, and each accumulates its own columns of O. No GEMM is computed twice. */
FA_HOPPER_FN int fa_hopper_fwd_cluster_ctas(int bucket) { return bucket == 512 ? 2 : 1; }

/* The bucket's q/k and v/o dims: the bucket itself, except 192 (192 / 128); and one CTA's share
 * of them (half at bucket 512). */
FA_HOPPER_FN int fa_hopper_dqk(int bucket) { return bucket; }
FA_HOPPER_FN int fa_hopper_dv(int bucket) { return bucket == 192 ? 128 : bucket; }
FA_HOPPER_FN int fa_hopper_cta_dqk(int bucket) { return fa_hopper_dqk(bucket) / fa_hopper_fwd_cluster_ctas(bucket); }
FA_HOPPER_FN int fa_hopper_cta_dv(int bucket) { return fa_hopper_dv(bucket) / fa_hopper_fwd_cluster_ctas(bucket); }

/* Query rows per CTA: one consumer warpgroup per 64 rows (the M of wgmma). Bucket 64: 192 rows,
 * 3 consumers (FlashAttention-3's d = 64 tile; +5-16 % over 128 rows on the H200, docs/tuning-log.md);
 * else 128 rows, 2 consumers. */
FA_HOPPER_FN int fa_hopper_block_m(int bucket) { return bucket == 64 ? 192 : 128; }

/* Consumer warpgroups: one per 64 rows. */
FA_HOPPER_FN int fa_hopper_consumers(int bucket) { return fa_hopper_block_m(bucket) / 64; }

/* Keys per tile. Buckets 64, 128 and 192: 128 (S accumulator 64 registers, P 32, O 32/64: fits the
 * consumers' 240 registers with the next S in flight; 192: Q 48 KiB + 2 stages × (K 48 + V 32 KiB)
 * = 208 KiB). 256: 80 (O alone is 128 registers, and Q 64 KiB + 2 stages × (K + V) 40 KiB each =
 * 224 KiB, the shared-memory limit). 512: 64 (per CTA of the pair Q 64 KiB [128, 256] + 2 stages
 * × (K + V) 32 KiB each + the score exchange's receive buffer 32 KiB = 224 KiB). */
FA_HOPPER_FN int fa_hopper_block_n(int bucket) { return bucket == 512 ? 64 : bucket == 256 ? 80 : 128; }

/* K/V ring depth: 3 at bucket 64 (16 KiB per K or V tile), else 2 (bucket 128: 160 KiB in all). */
FA_HOPPER_FN int fa_hopper_stages(int bucket) { return bucket == 64 ? 3 : 2; }

/* Ping-pong between the two consumer warpgroups (one's softmax under the other's GEMMs): up to
 * dv = 128 (buckets 64, 128, 192); at 256 each warpgroup's GEMMs are long enough to hide its own
 * softmax. */
FA_HOPPER_FN int fa_hopper_pingpong(int bucket) { return fa_hopper_dv(bucket) <= 128; }

/* Bytes of one CTA's 16-bit tiles: Q [BLOCK_M, dqk], O [BLOCK_M, dv], and one stage of K
 * [BLOCK_N, dqk] and of V [BLOCK_N, dv] (bucket 512: the CTA's 256 columns of each). */
FA_HOPPER_FN size_t fa_hopper_q_bytes(int bucket) {
    return (size_t)fa_hopper_block_m(bucket) * 2 * (size_t)fa_hopper_cta_dqk(bucket);
}
FA_HOPPER_FN size_t fa_hopper_o_bytes(int bucket) {
    return (size_t)fa_hopper_block_m(bucket) * 2 * (size_t)fa_hopper_cta_dv(bucket);
}
FA_HOPPER_FN size_t fa_hopper_k_bytes(int bucket) {
    return (size_t)fa_hopper_block_n(bucket) * 2 * (size_t)fa_hopper_cta_dqk(bucket);
}
FA_HOPPER_FN size_t fa_hopper_v_bytes(int bucket) {
    return (size_t)fa_hopper_block_n(bucket) * 2 * (size_t)fa_hopper_cta_dv(bucket);
}

/* The CTA pair's score exchange (bucket 512): one receive buffer per consumer, the peer's partial
 * S [64, BLOCK_N] fp32; 0 for the other buckets. */
FA_HOPPER_FN size_t fa_hopper_exchange_bytes(int bucket) {
    return fa_hopper_fwd_cluster_ctas(bucket) == 2
               ? (size_t)fa_hopper_consumers(bucket) * 64 * 4 * (size_t)fa_hopper_block_n(bucket)
               : 0;
}

/* mbarriers: q_full, q_empty, then k_full, v_full, k_empty, v_empty per stage, then (bucket 512)
 * the exchange's full and free per consumer; 8 bytes each; then the 16-byte tile slot (the index
 * of the tile whose Q the producer loads, and its key-tile count) and a 16-byte slot per stage
 * (the key tile's position in a block-mask walk). */
FA_HOPPER_FN int fa_hopper_fwd_barriers(int bucket) {
    return 2 + 4 * fa_hopper_stages(bucket) +
           (fa_hopper_fwd_cluster_ctas(bucket) == 2 ? 2 * fa_hopper_consumers(bucket) : 0);
}
FA_HOPPER_FN size_t fa_hopper_barrier_bytes(int bucket) {
    return 8 * (size_t)fa_hopper_fwd_barriers(bucket) + 16 + 16 * (size_t)fa_hopper_stages(bucket);
}

/* setmaxnreg (docs/hopper.md): under __launch_bounds__(threads, 1) every thread starts at the
 * launch cap, 65,536 / threads rounded down to 8; the producer warpgroup's .dec to producer_regs
 * and the other warpgroups' .inc to consumer_regs move registers within the CTA's own pool,
 * threads × cap (not the multiprocessor's 65,536): a split that does not fit it leaves the
 * consumers' .inc waiting for ever. */
FA_HOPPER_FN int fa_hopper_launch_regs(int threads) { return threads > 0 ? 65536 / threads / 8 * 8 : 0; }
FA_HOPPER_FN int fa_hopper_regs_split_ok(int threads, int producer_regs, int consumer_regs) {
    const int cap = fa_hopper_launch_regs(threads);
    return threads > 128 && producer_regs <= cap && consumer_regs >= cap &&
           128 * producer_regs + (threads - 128) * consumer_regs <= threads * cap;
}

/* Shared memory an H100/H200 block may opt into. */
enum { FA_HOPPER_SMEM_LIMIT = 232448 };

/* The CTA is persistent (it walks several query tiles), so O is staged in its own buffer when
 * that fits: the next tile's Q can then land while this tile's O is written out. Buckets 64 and
 * 128 fit; at 192 (Q 48 + K/V 160 KiB) and 256 (Q 64 + K/V 160 KiB) O reuses Q's buffer and the
 * next Q waits for the store. */
FA_HOPPER_FN int fa_hopper_o_own_buffer(int bucket) {
    return fa_hopper_q_bytes(bucket) + fa_hopper_o_bytes(bucket) +
               (size_t)fa_hopper_stages(bucket) * (fa_hopper_k_bytes(bucket) + fa_hopper_v_bytes(bucket)) +
               fa_hopper_exchange_bytes(bucket) + fa_hopper_barrier_bytes(bucket) + 1024 <=
           FA_HOPPER_SMEM_LIMIT;
}

/* Dynamic shared memory of one CTA: Q, then STAGES K tiles, then STAGES V tiles, then O (when it
 * has its own buffer), then the score exchange (bucket 512), then the mbarriers, plus 1024 bytes
 * to align the window to the swizzle atom. */
FA_HOPPER_FN size_t fa_hopper_smem_bytes(int bucket) {
    return fa_hopper_q_bytes(bucket) + (fa_hopper_o_own_buffer(bucket) ? fa_hopper_o_bytes(bucket) : 0) +
           (size_t)fa_hopper_stages(bucket) * (fa_hopper_k_bytes(bucket) + fa_hopper_v_bytes(bucket)) +
           fa_hopper_exchange_bytes(bucket) + fa_hopper_barrier_bytes(bucket) + 1024;
}

/* Grid shape. Even tiles (no heavy-first order): persistent, one CTA per multiprocessor walking a
 * static share of the tiles (+0-5 % non-causal on the H200); this needs O in its own buffer
 * (buckets 64 and 128, and every fp8 bucket), where the next tile's Q loads while this tile's
 * epilogue runs; otherwise (16-bit buckets 192 and 256: O staged in Q's buffer) one CTA per tile.
 * Causal-like masks (heavy_first), every bucket: the dynamic schedule, one CTA per multiprocessor
 * taking the next tile from a counter, in head-grouped longest-first order (fa_fwd_grouped_tile):
 * uneven tiles stay balanced (as when the hardware hands one CTA per tile to whichever
 * multiprocessor is free), the CTAs running together share K/V in L2, and no CTA start-up sits
 * between two tiles: +19 % at d128 1k, +5-10 % at 2k-4k against one CTA per tile; at buckets 192
 * and 256 (the next Q waits for the epilogue) +1-8 % and +0.3-3 % from 1k to 16k.
 * docs/tuning-log.md has the measurements. Bucket 512's CTA pairs: one cluster per tile, always
 * (a CTA stops exchanging after its tile's last key tile). */
FA_HOPPER_FN int fa_hopper_persistent(int bucket, int heavy_first, int fp8) {
    return fa_hopper_fwd_cluster_ctas(bucket) == 1 && !heavy_first && (fp8 || fa_hopper_o_own_buffer(bucket));
}

FA_HOPPER_FN int fa_hopper_dynamic(int bucket, int heavy_first) {
    return fa_hopper_fwd_cluster_ctas(bucket) == 1 && heavy_first;
}

/* K/V multicast (the forward's 16-bit kernels at buckets 128, 192 and 256): clusters of two CTAs
 * on neighbouring query tiles of one (batch, head), rank 0 loading each K tile and rank 1 each V
 * tile into both CTAs' shared memory (TMA multicast), so every K/V byte leaves L2 once per pair
 * (a gain at d >= 128 under the power cap, none at d64: docs/tuning-log.md); the kernels of
 * those buckets compile the pairs in (fa_hopper_fwd_kv_multicast_bucket). The two tiles must walk
 * the same key tiles in the same order: fixed-length batches without causal masks or windows,
 * unpacked, no score modifications, and an even number of query tiles per head, so that the
 * schedule's neighbouring tiles (fa_hopper_tile_index: tiles 2i and 2i + 1 of a round) never
 * straddle two heads. */
FA_HOPPER_FN int fa_hopper_fwd_kv_multicast_bucket(int bucket) {
    return bucket >= 128 && fa_hopper_fwd_cluster_ctas(bucket) == 1;
}
FA_HOPPER_FN int fa_hopper_fwd_kv_multicast(int bucket, int varlen, int packed, int mods, int window_left,
                                            int window_right, int num_m_blocks) {
    return fa_hopper_fwd_kv_multicast_bucket(bucket) && !varlen && !packed && !mods && window_left < 0 &&
           window_right < 0 && num_m_blocks % 2 == 0;
}

/* The bucket whose MODS instantiations (score modifications, common/mods.cuh) run a problem of
 * bucket `bucket`: bucket 64 runs on bucket 128's kernels, its head dims zero-padded to 128 (at
 * 64 the forward's three consumers at 160 registers spilled 852 bytes with the element rules and
 * the backward's 128-query tile 488; twice the GEMM work is still 4x the portable MODS kernels). */
FA_HOPPER_FN int fa_hopper_mods_bucket(int bucket) { return bucket == 64 ? 128 : bucket; }

/* Score modifications (bias, document ids, block-sparse masks) on the Hopper forward: its MODS
 * instantiations at fa_hopper_mods_bucket(bucket). A block mask's blocks must be whole tiles,
 * block_q a multiple of BLOCK_M and block_k of BLOCK_N, so one map entry holds for a tile
 * (128 × 128 suits d up to 192; at 256, 80 keys per tile: block_k a multiple of 80; at 512,
 * 128 × 64 tiles). Without a block mask (block_q = block_k = 0) any block sizes do. */
FA_HOPPER_FN int fa_hopper_fwd_mods_blocks_ok(int bucket, long long block_q, long long block_k) {
    const int b = fa_hopper_mods_bucket(bucket);
    return bucket > 0 && ((block_q == 0 && block_k == 0) ||
                          (block_q > 0 && block_k > 0 && block_q % fa_hopper_block_m(b) == 0 &&
                           block_k % fa_hopper_block_n(b) == 0));
}

/* ---- fp8 e4m3 inputs (fwd_sm90.cu's FP8 instantiations) -----------------------------------
 * Q and K tiles are slabs of [rows, 128] 8-bit elements (128-byte rows: the 16-bit tiles' slab
 * layout and swizzle, twice the columns). The 8-bit wgmma reads both operands K-major only, so
 * P·V needs V with the keys contiguous: Vᵀ tiles [dv, BLOCK_N keys], the keys permuted within
 * groups of 32 so that P's fp32 accumulator registers are its A fragment as they stand (see
 * fa_hopper_fp8_vt_slot). Buckets 64 and 128 transpose V in the kernel (fa_hopper_fp8_vt_in_kernel);
 * at 256 a pre-pass writes Vᵀ [heads_kv][dv][keys] into the workspace (each sequence padded with
 * zeros to a whole number of key tiles) and the kernel loads tiles of it. O is bf16, staged in its
 * own buffer. */

/* Bucket: 64, 128 or 256 (d and dv up to it, zero-padded; at 64 Q and K rows are 64 bytes, in the
 * 64-byte swizzle); 0 = out of range (d or dv above 256, or not a multiple of 8). */
FA_HOPPER_FN int fa_hopper_fp8_bucket(int head_dim, int head_dim_v) {
    return head_dim < 8 || head_dim > 256 || head_dim % 8 != 0 || head_dim_v < 8 || head_dim_v > 256 ||
                   head_dim_v % 8 != 0
               ? 0
           : head_dim <= 64 && head_dim_v <= 64   ? 64
           : head_dim <= 128 && head_dim_v <= 128 ? 128
                                                  : 256;
}

/* Keys per tile: 128, one 128-byte row of Vᵀ per dv column (S 64 registers, P 16, O 32 / 64 / 128). */
FA_HOPPER_FN int fa_hopper_fp8_block_n(int bucket) { return bucket > 0 ? 128 : 0; }

/* The P·V wait kept after the softmax (fwd_sm90.cu's fa_hopper_order): fp8 at bucket 128 only,
 * where a tile's GEMMs are too short for the other warpgroup's alone to hide a softmax; measured
 * slower at fp8 bucket 64 and in the 16-bit kernels (docs/tuning-log.md). */
FA_HOPPER_FN int fa_hopper_fp8_pv_wait_late(int bucket) { return bucket == 128; }

/* V transposed in the kernel: the producer's TMA loads V's tile as it is stored ([BLOCK_N keys,
 * dv] bytes, K's layout) into a staging ring beside the Vᵀ ring, and the producer warpgroup's
 * three idle warps write it into the Vᵀ stage (ldmatrix.trans, byte permutes, stmatrix). It fits
 * at buckets 64 and 128 (STAGES × 8 or 16 KiB of staging; 256 has 225 KiB without it). The
 * alternative, a pre-pass writing Vᵀ to the workspace, costs a pass over V per call. At bucket 128
 * the kernel's own transpose costs nothing per tile (the consumers keep their 240 registers, the
 * transposing warps one step in flight: H100, d128 16k 1.003× the pre-pass path, 4k 1.11×), so it
 * always transposes; at bucket 64 it runs ~2 % slower per tile (0.98× at 16k, 1.27× at 1k), so it
 * transposes while it is short against V: at most FA_HOPPER_FP8_VT_ROWS query rows per kv head and
 * sequence (seqlen_q · heads_q / heads_kv; the pre-pass reads each kv head's V once for all of
 * them). docs/tuning-log.md, fp8 forward. */
enum { FA_HOPPER_FP8_VT_ROWS = 4096 };
FA_HOPPER_FN int fa_hopper_fp8_vt_fits(int bucket) { return bucket == 64 || bucket == 128; }
FA_HOPPER_FN int fa_hopper_fp8_vt_in_kernel(int bucket, long long seqlen_q, long long heads_q, long long heads_kv) {
    return bucket == 128 ||
           (bucket == 64 && heads_kv > 0 && seqlen_q * (heads_q / heads_kv) <= FA_HOPPER_FP8_VT_ROWS);
}

/* Query rows per CTA and ring depth are the 16-bit kernels' (fa_hopper_block_m, fa_hopper_stages:
 * 192 rows in 3 consumer warpgroups and 3 stages at bucket 64, else 128 rows in 2 and 2 stages).
 * Shared memory: Q [BLOCK_M, d] + STAGES × (K [128, d] + Vᵀ [d, 128]) 8-bit, O [BLOCK_M, dv] bf16,
 * with vt_in_kernel STAGES × V [128, dv] 8-bit (the staging), the mbarriers (with the staging's
 * full and empty per stage), with fa_hopper_fp8_pv_wait_late one 4-byte order word per consumer
 * thread (2 per query row), 1024 bytes of alignment (bucket 64: 73 KiB, 97 with the staging; 128:
 * 114 KiB, 146; 256: 225 KiB). */
FA_HOPPER_FN size_t fa_hopper_fp8_smem_bytes(int bucket, int vt_in_kernel) {
    const size_t staging = (size_t)(vt_in_kernel && fa_hopper_fp8_vt_fits(bucket)) *
                           (size_t)fa_hopper_stages(bucket) *
                           ((size_t)fa_hopper_fp8_block_n(bucket) * (size_t)bucket + 16);
    return (size_t)fa_hopper_block_m(bucket) * (size_t)bucket +
           (size_t)fa_hopper_stages(bucket) * 2 * (size_t)fa_hopper_fp8_block_n(bucket) * (size_t)bucket +
           (size_t)fa_hopper_block_m(bucket) * 2 * (size_t)bucket + staging + fa_hopper_barrier_bytes(bucket) +
           8 * (size_t)fa_hopper_block_m(bucket) * (size_t)fa_hopper_fp8_pv_wait_late(bucket) + 1024;
}

/* Vᵀ's padded key rows: a sequence of len keys takes ceil(len / BLOCK_N) · BLOCK_N of them, so
 * every tile the kernel loads lies inside its own sequence's (zero-filled) rows. Fixed-length
 * batches: batch · ceil(seqlen_k / BLOCK_N) · BLOCK_N; varlen (total_k keys in batch sequences):
 * an upper bound, total_k + batch · (BLOCK_N - 1), rounded up to 16 (TMA strides are multiples of
 * 16 bytes). */
FA_HOPPER_FN long long fa_hopper_fp8_vt_rows(int bucket, int varlen, long long batch, long long seqlen_k,
                                             long long total_k) {
    const long long n = fa_hopper_fp8_block_n(bucket);
    return n == 0 ? 0 : varlen ? (total_k + batch * (n - 1) + 15) / 16 * 16 : batch * ((seqlen_k + n - 1) / n) * n;
}

/* Workspace of the fp8 forward: none where V is transposed in the kernel (vt_in_kernel); else Vᵀ
 * [heads_kv][dv][vt_rows] bytes, then (varlen) each sequence's first Vᵀ row, batch + 1 int32
 * (16-byte aligned). */
FA_HOPPER_FN size_t fa_hopper_fp8_workspace_bytes(int bucket, int vt_in_kernel, int varlen, long long batch,
                                                  long long heads_kv, long long head_dim_v, long long seqlen_k,
                                                  long long total_k) {
    if (vt_in_kernel) return 0;
    const size_t vt = (size_t)heads_kv * (size_t)head_dim_v *
                      (size_t)fa_hopper_fp8_vt_rows(bucket, varlen, batch, seqlen_k, total_k);
    return (vt + 15) / 16 * 16 + (varlen ? (size_t)4 * (size_t)(batch + 1) : 0);
}

/* Position of key `key` (its index within its sequence) in its padded Vᵀ row: the same group of
 * 32, slot s with key = group + σ(s), σ(4q + i) = 2q + (i & 1) + 8(i >> 1) (+16 for the upper
 * 16 slots). The fp32 accumulator of S gives lane quad position q the keys 8j + 2q + {0, 1} of
 * every 8-key column j; the 8-bit A fragment of P·V wants slots 4q .. 4q + 3 and 16 + 4q .. +3.
 * Packing the thread's columns j = 0, 1 (and 2, 3) into one register each is then the A fragment
 * of keys σ(slot), and Vᵀ rows holding key σ(s) at slot s make the product the right one. */
FA_HOPPER_FN int fa_hopper_fp8_vt_slot(int key) {
    const int k = key % 32, half = k / 16, r = k % 16; /* r = 8h + 2q + c */
    const int h = r / 8, q = (r % 8) / 2, c = r % 2;
    return key - k + 16 * half + 4 * q + 2 * h + c;
}

/* The inverse: the key (within its group of 32, plus the group's first) at slot `slot`. */
FA_HOPPER_FN int fa_hopper_fp8_vt_key(int slot) {
    const int s = slot % 32, half = s / 16, r = s % 16; /* r = 4q + 2h + c */
    const int q = r / 4, h = (r % 4) / 2, c = r % 2;
    return slot - s + 16 * half + 8 * h + 2 * q + c;
}

/* NULL when the fp8 forward takes the problem, else why not (fp8 has no portable kernel). */
static inline const char *fa_hopper_fp8_unsupported(int cc_major, int cc_minor, int head_dim, int head_dim_v,
                                                    int has_alibi, float scale_log2, int has_dropout,
                                                    int has_mods, int paged) {
    if (cc_major != 9 || cc_minor != 0) return "needs an sm_90 GPU (H100 / H200)";
    if (fa_hopper_fp8_bucket(head_dim, head_dim_v) == 0) return "needs head_dim and head_dim_v multiples of 8 in 8..256";
    if (has_alibi) return "does not take ALiBi";
    if (!(scale_log2 > 0.0f)) return "needs softmax_scale > 0";
    if (has_dropout) return "does not take dropout";
    if (has_mods) return "does not take a bias, document ids or a block mask";
    if (paged) return "does not take a paged K/V (block_table)";
    return NULL;
}

/* Order of the persistent grid's tiles over G CTAs: 1 = snake (CTA i takes tiles i, 2G - 1 - i,
 * 2G + i, 4G - 1 - i, ...: every other round reversed), which pairs a CTA's long tile of one round
 * with a short one of the next when tiles come longest first; 0 = round robin (i, G + i, ...). */
FA_HOPPER_FN int fa_hopper_snake_order(void) { return 1; }

/* ---- packed GQA/MQA tiles (small seqlen_q) ---------------------------------------------------
 * With seqlen_q <= BLOCK_M / 2 a tile of one query head holds at most half a tile of real rows,
 * and the group's query heads each stream the same K/V. A packed tile instead holds the rows of
 * pack_heads consecutive query heads of one kv head: tile row r = g·pack_rows + i is query row i
 * of query head head_first + g. pack_rows = seqlen_q rounded up to 8, so each head's rows start
 * on a 1024-byte swizzle atom of the 128-byte-swizzled Q slabs (one TMA box {64, pack_rows} per
 * head and slab lands exactly in the layout the unpacked tile has; rows i >= seqlen_q are the
 * box's zero fill). Fixed-length batches only (varlen tiles run unpacked). */

/* Rows one query head occupies in a packed tile. */
FA_HOPPER_FN int fa_hopper_pack_rows(int seqlen_q) { return (seqlen_q + 7) / 8 * 8; }

/* Query heads per packed tile: every whole head that fits into BLOCK_M rows, then balanced over
 * the fewest tiles that hold the group (group 6 at 4 per tile: 3 + 3, not 4 + 2); 0 when fewer
 * than 2 heads fit or the group has one head (packing changes nothing). */
FA_HOPPER_FN int fa_hopper_pack_heads(int bucket, int seqlen_q, int group) {
    const int fit = bucket > 0 && fa_hopper_fwd_cluster_ctas(bucket) == 1 && seqlen_q > 0 ? fa_hopper_block_m(bucket) / fa_hopper_pack_rows(seqlen_q) : 0;
    const int tiles = fit >= 2 && group >= 2 ? (group + fit - 1) / fit : 0;
    return tiles > 0 ? (group + tiles - 1) / tiles : 0;
}

/* Packed tiles per (batch, kv head); 0 when not packing. */
FA_HOPPER_FN int fa_hopper_pack_tiles(int bucket, int seqlen_q, int group) {
    const int heads = fa_hopper_pack_heads(bucket, seqlen_q, group);
    return heads > 0 ? (group + heads - 1) / heads : 0;
}

/* Query heads per tile the Hopper forward runs with: 0 = unpacked (the usual tiles of BLOCK_M
 * rows of one head), else fa_hopper_pack_heads(). mode 0 (default) and 1: pack whenever at
 * least 2 heads fit; -1: never (FA_CUDA_PACK_GQA=0, for timing the two side by side). Packing
 * never costs a wave: every tile of a fixed-length batch with seqlen_q <= BLOCK_M / 2 streams
 * the same key range and computes all BLOCK_M rows whatever number of them is real, so a tile
 * takes the same time packed or not, and the packed grid has group / pack_heads times fewer
 * tiles for the same multiprocessors (docs/tuning-log.md, packed GQA/MQA tiles). Not for
 * varlen batches (their tiles stay unpacked). */
FA_HOPPER_FN int fa_hopper_pack_gqa(int bucket, int seqlen_q, int group, int varlen, int mode) {
    return varlen || mode < 0 ? 0 : fa_hopper_pack_heads(bucket, seqlen_q, group);
}

/* A tensor-map stride the TMA accepts, in bytes: along an axis of extent 1 anything (never
 * stepped along), else a positive multiple of 16 below 2^40. In elements of elem_bytes bytes
 * (fa_hopper_tma_stride_elems_ok; fa_hopper_tma_stride_ok for a 16-bit tensor: a positive
 * multiple of 8 below 2^39). tma.cu's fa_hopper_make_map applies this rule. */
FA_HOPPER_FN int fa_hopper_tma_stride_bytes_ok(long long stride_bytes, long long extent) {
    return extent == 1 || (stride_bytes > 0 && stride_bytes % 16 == 0 && stride_bytes < (1ll << 40));
}
FA_HOPPER_FN int fa_hopper_tma_stride_elems_ok(long long stride, int elem_bytes, long long extent) {
    return extent == 1 || (stride > 0 && stride < (1ll << 40) / elem_bytes &&
                           fa_hopper_tma_stride_bytes_ok(elem_bytes * stride, extent));
}
FA_HOPPER_FN int fa_hopper_tma_stride_ok(long long stride, long long extent) {
    return fa_hopper_tma_stride_elems_ok(stride, 2, extent);
}

/* A tensor [batch, rows, heads, dim] of elem_bytes-byte elements (1: e4m3, 2: 16-bit) the TMA can
 * map: a 16-byte aligned base and fa_hopper_tma_stride_elems_ok strides (tma.cu's
 * fa_hopper_make_map accepts it). */
FA_HOPPER_FN int fa_hopper_tma_tensor_ok(unsigned long long base, int elem_bytes, long long row_stride,
                                         long long head_stride, long long batch_stride, long long rows,
                                         long long heads, long long batch) {
    return base % 16 == 0 && fa_hopper_tma_stride_elems_ok(row_stride, elem_bytes, rows) &&
           fa_hopper_tma_stride_elems_ok(head_stride, elem_bytes, heads) &&
           fa_hopper_tma_stride_elems_ok(batch_stride, elem_bytes, batch);
}

/* A 16-bit tensor [batch, rows, heads, dim] the TMA can map (fa_hopper_tma_tensor_ok). */
FA_HOPPER_FN int fa_hopper_tma_map_ok(unsigned long long base, long long row_stride, long long head_stride,
                                      long long batch_stride, long long rows, long long heads, long long batch) {
    return fa_hopper_tma_tensor_ok(base, 2, row_stride, head_stride, batch_stride, rows, heads, batch);
}

/* The Hopper backward (every bucket) writes dK and dV with the TMA store (from tiles
 * staged in shared memory) when the GQA group is not split (a split writes fp32 partials) and
 * both tensors can be mapped (rows: seqlen_k, varlen total_k; batch: 1 for varlen); else it
 * copies the staged rows out with coalesced stores, as it does for a varlen key block's 64 keys
 * that end inside the sequence's last 64 (the box would overwrite the next sequence's rows). */
FA_HOPPER_FN int fa_hopper_bwd_dkdv_tma(int group_splits, unsigned long long dk_base, long long dk_row_stride,
                                        long long dk_head_stride, long long dk_batch_stride, unsigned long long dv_base,
                                        long long dv_row_stride, long long dv_head_stride, long long dv_batch_stride,
                                        long long rows_k, long long heads_kv, long long batch) {
    return group_splits == 1 &&
           fa_hopper_tma_map_ok(dk_base, dk_row_stride, dk_head_stride, dk_batch_stride, rows_k, heads_kv, batch) &&
           fa_hopper_tma_map_ok(dv_base, dv_row_stride, dv_head_stride, dv_batch_stride, rows_k, heads_kv, batch);
}

/* Rotated query walks of the Hopper backward in deterministic mode (non-causal, no window: every
 * key block of a sequence sees all n_m query blocks). Key block n of n_blocks starts its walk at
 * query block fa_hopper_bwd_walk_offset(n) = floor(n · n_m / n_blocks) and wraps around; used
 * when n_m >= n_blocks (distinct offsets). Each dQ tile m then takes its additions in the order
 * the walks reach it, earliest first: the first is the key block whose walk starts at m or the
 * nearest start below it, so no walk waits at its start and each waits only for a walk that
 * reached the tile earlier in its own steps (with every walk starting at block 0, key block n
 * waited for all higher ones at its first tile, and the whole chain lagged by one step per key
 * block). fa_hopper_bwd_rotated_rank gives key block n's place in that order (0 = first); with
 * n_blocks resident CTAs no wait can deadlock. */
FA_HOPPER_FN int fa_hopper_bwd_walk_offset(int n, int n_blocks, int n_m) {
    return (int)((long long)n * n_m / n_blocks);
}

FA_HOPPER_FN int fa_hopper_bwd_rotated_rank(int n, int n_blocks, int n_m, int m) {
    /* starts at or below m: walks n' < c (offsets increase with n'), the nearest start first */
    long long c = ((long long)(m + 1) * n_blocks + n_m - 1) / n_m;
    if (c > n_blocks) c = n_blocks;
    return n < c ? (int)(c - 1 - n) : (int)(c + n_blocks - 1 - n);
}

/* Whether the backward rotates its walks: deterministic mode (the non-deterministic kernel gained
 * nothing from it: docs/tuning-log.md), no window side (causal
 * is a window side: the query ranges then differ per key block), no score modifications, and the
 * longest sequence's CTAs (one per key block, two at bucket 512; one CTA per multiprocessor) fit
 * the multiprocessors at once. disabled: FA_HOPPER_BWD_ROTATE=0 (timing). */
FA_HOPPER_FN int fa_hopper_bwd_rotate(int window_left, int window_right, int mods, int deterministic,
                                      long long ctas, int sm_count, int disabled) {
    return !disabled && deterministic && window_left < 0 && window_right < 0 && !mods && ctas <= sm_count;
}

/* NULL when the Hopper forward takes the problem, else the reason it does not (the portable
 * kernels then do). scale_log2 = softmax_scale · log2(e); softcap > 0 when on; has_dropout:
 * dropout_p > 0 (covered: the DROPOUT instantiations). */
#ifdef __cplusplus
static inline
#else
static inline
#endif
    const char *
    fa_hopper_fwd_unsupported(int cc_major, int cc_minor, fa_dtype dtype, int head_dim, int head_dim_v,
                              int has_alibi, float scale_log2, float softcap, int has_dropout) {
    if (cc_major != 9 || cc_minor != 0) return "needs compute capability 9.0 (sm_90a code)";
    if (dtype != FA_DTYPE_F16 && dtype != FA_DTYPE_BF16) return "needs f16 or bf16";
    if (fa_hopper_bucket(head_dim, head_dim_v) == 0)
        return "needs head_dim and head_dim_v multiples of 8 in 64..512";
    (void)has_dropout; /* every bucket has DROPOUT instantiations */
    (void)has_alibi; /* ALiBi and a negative scale: scores go to log2 units first (fa_hopper_to_log2) */
    (void)scale_log2;
    (void)softcap;
    return NULL;
}

/* ---- backward (bwd_sm90.cu, buckets 256 and 512: bwd_sm90_hdim256.cu) -------------
 * One CTA = BLOCK_N keys of one (batch, kv head): a producer warpgroup and two consumer
 * warpgroups whose dK and dV stay in fp32 registers while the CTA walks the query blocks
 * (BLOCK_M rows each) of every query head of the kv group. Q and dO tiles stream through a
 * STAGES-deep ring. Buckets 64 and 128: BLOCK_N = 128, each consumer owns 64 keys × all bucket
 * columns of dK/dV. Bucket 256: BLOCK_N = 64 (dK and dV of 64 keys × 256 columns would be 256
 * fp32 registers per thread); each consumer computes Sᵀ and dPᵀ of the 64 keys for half the
 * queries, both halves meet in shared memory, and each consumer owns 128 head-dim columns of dK,
 * dV and dQ (docs/design.md, "Hopper backward"). Bucket 512: a cluster of two such CTAs per key
 * block, CTA r holding head-dim columns 256r .. 256r + 255 of every tile; the partial Sᵀ and dPᵀ
 * over each CTA's columns are added through the peer's shared memory. */

/* Head-dim bucket of the backward: d and dv multiples of 8 in 64..512, the larger one's bucket (64,
 * 128, 256 or 512; columns past d or dv read as zeros); 0 = not covered (the portable kernel). */
FA_HOPPER_FN int fa_hopper_bwd_bucket(int head_dim, int head_dim_v) {
    const int b = fa_hopper_bucket(head_dim, head_dim_v);
    return b == 192 ? 256 : b;
}

/* CTAs per key block: 2 at bucket 512 (a cluster pair, the bucket-256 kernel on each half of the
 * head-dim columns), else 1. */
FA_HOPPER_FN int fa_hopper_bwd_cluster_ctas(int bucket) { return bucket == 512 ? 2 : 1; }

/* Head-dim columns of Q, K, V, dO (and of dQ, dK, dV) one CTA holds. */
FA_HOPPER_FN int fa_hopper_bwd_cta_cols(int bucket) { return bucket / fa_hopper_bwd_cluster_ctas(bucket); }

/* The bucket-128 kernel with 80 query rows per iteration (FlashAttention-3/4's tile at d = 128):
 * a quarter more work per iteration for the same fixed costs (barriers, LSE/D loads, waits, the dQ
 * hand-off). 80 is no multiple of the wgmma M, so dQ is computed transposed (dQᵀ = Kᵀ dSᵀ, N =
 * 80). Taken without a bounded left window side (a sliding window's few query blocks per key
 * block) and, with a bounded right side (causal), only for sequences of at least
 * FA_HOPPER_BWD_ROWS80_MASKED_ROWS query rows on average (mean_rows_q = total_q / batch): below
 * that the diagonal's partial blocks cost more than the tile saves (H100: causal 1k 0.97, 4k
 * 0.99, 8k 1.02, 16k 1.03; non-causal 1k 0.985, from 2k 1.00-1.09). Not with the softcap, LOG2
 * (ALiBi, a negative scale), dropout (its keep bits come in 32-query quads) or score-modification
 * instantiations, which keep 64; deterministic mode included. Window sides -1 = unbounded. */
#define FA_HOPPER_BWD_ROWS80_MASKED_ROWS 8192
FA_HOPPER_FN int fa_hopper_bwd_rows80(int bucket, long long window_left, long long window_right, long long mean_rows_q,
                                      int softcap, int log2, int dropout, int mods) {
    return bucket == 128 && window_left < 0 && (window_right < 0 || mean_rows_q >= FA_HOPPER_BWD_ROWS80_MASKED_ROWS) &&
           !softcap && !log2 && !dropout && !mods;
}

/* MLA's training shape on its own kernel (kernels/bwd_sm90_hdim192.cu: 64 queries × 96 keys per
 * iteration, S not transposed, dK and dV accumulated transposed): bucket 256 with d <= 192 and
 * dv <= 128, on the plain score path (no softcap, ALiBi or negative scale: log2), without
 * dropout; deterministic mode included. The others run the bucket-256 kernel at 256. Its query
 * blocks are bucket 256's (64 rows); its dQ accumulator is tiled (fa_hopper_bwd_dq_tile_cols), so
 * the plan (bwd.cu) makes this choice and passes it on. */
FA_HOPPER_FN int fa_hopper_bwd_d192(int head_dim, int head_dim_v, int softcap, int log2, int dropout) {
    return fa_hopper_bwd_bucket(head_dim, head_dim_v) == 256 && head_dim <= 192 && head_dim_v <= 128 && !softcap &&
           !log2 && !dropout;
}

/* Query rows per iteration: 128 at bucket 64 (Sᵀ and dPᵀ accumulators of 64 fp32 registers each,
 * dK and dV 32 each), 64 at buckets 128 and 256 (dK and dV are 64 registers each, so Sᵀ and dPᵀ
 * get 32; at 256 that is each consumer's 128-column share); 80 at bucket 128 with rows80
 * (fa_hopper_bwd_rows80: Sᵀ and dPᵀ 40 each). */
FA_HOPPER_FN int fa_hopper_bwd_block_m(int bucket, int rows80) {
    return bucket == 64 ? 128 : bucket == 128 && rows80 ? 80 : bucket > 0 ? 64 : 0;
}

/* Keys per CTA: two consumer warpgroups × 64 (the M of wgmma) at buckets 64 and 128; at 256 the
 * two consumers share the same 64 keys (each owns half the head-dim columns). */
FA_HOPPER_FN int fa_hopper_bwd_block_n(int bucket) { return bucket >= 256 ? 64 : bucket > 0 ? 128 : 0; }

/* Q ring depth (with the LSE·log2e and D rows of each stage). */
FA_HOPPER_FN int fa_hopper_bwd_stages(int bucket) { return bucket > 0 ? 2 : 0; }

/* dO ring depth: the Q ring's at buckets 64 and 128 (Q and dO of an iteration share a stage); one
 * stage at 256, where the second dO stage's 32 KiB hold the dQ staging instead: dO is loaded on
 * its own barrier, released once the dV GEMM has read it, and the next one lands while dK and dQ
 * run. */
FA_HOPPER_FN int fa_hopper_bwd_do_stages(int bucket) { return bucket >= 256 ? 1 : fa_hopper_bwd_stages(bucket); }

/* 16-bit [BLOCK_M, BLOCK_N] score tiles per use: dS at buckets 64 and 128 (each consumer writes
 * its 64 keys); Pᵀ and dSᵀ at 256 and 512 (each consumer writes its half of the queries, and the
 * dV, dK and dQ GEMMs read them from shared memory). */
FA_HOPPER_FN int fa_hopper_bwd_score_tiles(int bucket) { return bucket >= 256 ? 2 : 1; }

/* Buffers of those tiles: 2 (iteration t writes buffer t % 2), 1 at bucket 512, whose second
 * buffer's 16 KiB hold the pair's exchange instead (the consumers then meet before rewriting it). */
FA_HOPPER_FN int fa_hopper_bwd_score_buffers(int bucket) { return bucket == 512 ? 1 : 2; }

/* Bucket 512: the receive buffer of the pair's exchange, per consumer one fp32 [64 keys, 32
 * queries] partial Sᵀ or dPᵀ from the peer CTA (16 values per thread). */
FA_HOPPER_FN int fa_hopper_bwd_exchange_bytes(int bucket) { return bucket == 512 ? 2 * 64 * 32 * 4 : 0; }

/* mbarriers: kv_full, STAGES stage_full, then the stage_empty barriers: one per stage at buckets
 * 64 and 128; at 256 one per stage and consumer (each consumer releases the Q stage on its own
 * barrier once its dK GEMM has retired), then do_full and one do_empty per consumer; at 512 also
 * per consumer the exchange's full and free barriers. */
FA_HOPPER_FN int fa_hopper_bwd_barriers(int bucket) {
    return bucket >= 256 ? 1 + 3 * fa_hopper_bwd_stages(bucket) + 3 + (bucket == 512 ? 4 : 0)
                         : 1 + 2 * fa_hopper_bwd_stages(bucket);
}

/* dQ pieces per query block, each with its own turn in deterministic mode: the two consumers'
 * column halves, per CTA of a pair at bucket 512. */
FA_HOPPER_FN int fa_hopper_bwd_dq_pieces(int bucket) { return 2 * fa_hopper_bwd_cluster_ctas(bucket); }

/* Deterministic mode (bwd_sm90_common.cuh, "deterministic dQ"): int32 semaphores
 * [batch, heads_q, query blocks, dq pieces], one per (sequence, query head, query block of BLOCK_M
 * rows, dQ piece; buckets 64 and 128 and the 192 / 128 kernel use piece 0's for the whole tile,
 * their one dQ writer adds both pieces), zeroed before the main kernel. */
FA_HOPPER_FN long long fa_hopper_bwd_semaphores(int bucket, int rows80, long long batch, long long heads_q,
                                                long long seqlen_q) {
    const long long block_m = fa_hopper_bwd_block_m(bucket, rows80);
    return block_m > 0 ? batch * heads_q * ((seqlen_q + block_m - 1) / block_m) * fa_hopper_bwd_dq_pieces(bucket) : 0;
}

/* Splits of a GQA group across CTAs in the backward at buckets 64 and 128 (1 = the whole group
 * in one CTA, dK and dV summed in registers and written once; bucket 256 never splits): a divisor
 * of the group, so every CTA walks the same number of query heads. A CTA walks (its query heads) ×
 * n_m(key block) iterations of BLOCK_M query rows. Two reasons to split: fewer CTAs (batch × kv
 * heads × key blocks) than half the multiprocessors (then split until there is one per
 * multiprocessor), and, in a long kernel (a multiprocessor's share of at least
 * FA_HOPPER_BWD_TAIL_MIN iterations) under causal masks and windows where n_m varies with the key
 * block, a longest CTA above 1 / FA_HOPPER_BWD_TAIL_SHARE of that share (the kernel would end on
 * a tail of long CTAs). The smallest divisor that satisfies both, else the largest allowed. Each
 * split writes fp32 dK/dV partials that bwd.cu sums in a fixed order, which costs more than the
 * tail saves in short kernels (docs/tuning-log.md); at most group / 2 splits, so the partials
 * (splits × seqlen_k × heads_kv × (d + dv) × 4 bytes) stay within FlashAttention-2's
 * per-query-head 16-bit dK/dV (group × the same × 2). Window sides -1 = unbounded, causal folded
 * in; varlen: the longest sequences. forced > 0 (FA_HOPPER_BWD_GROUP_SPLITS, for timing): the
 * largest divisor of the group up to forced. */
#define FA_HOPPER_BWD_TAIL_MIN 1024
#define FA_HOPPER_BWD_TAIL_SHARE 6
FA_HOPPER_FN int fa_hopper_bwd_group_splits(int bucket, long long batch, long long heads_kv, long long group,
                                            long long seqlen_q, long long seqlen_k, long long window_left,
                                            long long window_right, int sm_count, int forced) {
    if ((bucket != 64 && bucket != 128) || group <= 1 || batch <= 0 || heads_kv <= 0 || seqlen_q <= 0 ||
        seqlen_k <= 0 || sm_count <= 0)
        return 1;
    if (forced > 0) {
        long long s = forced < group ? forced : group;
        while (group % s != 0) --s;
        return (int)s;
    }
    /* in 64-row query blocks at bucket 128: the unit of the tail rule, whichever kernel runs */
    const long long block_m = fa_hopper_bwd_block_m(bucket, 0), block_n = fa_hopper_bwd_block_n(bucket);
    const long long shift = seqlen_k - seqlen_q;
    long long max_m = 0, sum_m = 0, key_blocks = 0;
    for (long long n0 = 0; n0 < seqlen_k; n0 += block_n, ++key_blocks) {
        const long long n1 = n0 + block_n < seqlen_k ? n0 + block_n : seqlen_k;
        long long q_lo = 0, q_hi = seqlen_q;
        if (window_right >= 0 && n0 - shift - window_right > 0) q_lo = n0 - shift - window_right;
        if (window_left >= 0 && n1 - 1 - shift + window_left + 1 < seqlen_q) q_hi = n1 - 1 - shift + window_left + 1;
        const long long n_m = q_hi > q_lo ? (q_hi + block_m - 1) / block_m - q_lo / block_m : 0;
        if (n_m > max_m) max_m = n_m;
        sum_m += n_m;
    }
    /* iterations per multiprocessor */
    const double share = (double)batch * (double)heads_kv * (double)group * (double)sum_m / (double)sm_count;
    long long splits = 1;
    for (long long s = 1; 2 * s <= group; ++s) {
        if (group % s != 0) continue;
        splits = s;
        const long long ctas = batch * heads_kv * key_blocks;
        const int fill_ok = 2 * ctas >= sm_count || ctas * s >= sm_count;
        const int tail_ok =
            share < FA_HOPPER_BWD_TAIL_MIN || (double)(group / s * max_m) * FA_HOPPER_BWD_TAIL_SHARE <= share;
        if (fill_ok && tail_ok) break;
    }
    return (int)splits;
}

/* dQ staging: the fp32 dQ pieces go through shared memory to bulk reduce-adds (half the L2
 * reduction traffic of per-thread red.global). Buckets 64 and 128 and the 192 / 128 kernel: the
 * two consumers' pieces of one accumulator tile [block_m, tile columns] ([64, 64] each; [80 rows,
 * 64 columns] with rows80; [64, 96] for 192 / 128) in the tiled accumulator's order
 * (fa_hopper_bwd_dq_tile_cols), added whole by a writer warp (kernels/bwd_sm90_common.cuh); 256:
 * tensor reduce-adds of 32 columns, each of the 8 consumer warps its own two buffers [16 rows, 32
 * columns] and adds its piece [16, 128] itself in four rounds (kernels/bwd_sm90_hdim256.cu). */
FA_HOPPER_FN size_t fa_hopper_bwd_dq_staging_bytes(int bucket, int rows80) {
    return bucket >= 256 ? 8 * 2 * 16 * 32 * 4 : (size_t)fa_hopper_bwd_block_m(bucket, rows80) * (size_t)bucket * 4;
}

/* The bucket of the backward kernel that runs a problem of bucket `bucket`: with score
 * modifications fa_hopper_mods_bucket's (64 runs on 128's kernel), else the bucket itself. */
FA_HOPPER_FN int fa_hopper_bwd_kernel_bucket(int bucket, int mods) {
    return mods ? fa_hopper_mods_bucket(bucket) : bucket;
}

/* The dQ accumulator of the kernels at buckets 64 and 128 (kernels/bwd_sm90.cu) and of the 192 /
 * 128 kernel (kernels/bwd_sm90_hdim192.cu, fa_hopper_bwd_d192) is tiled: per query head, per
 * sequence and per query block of BLOCK_M rows one contiguous fp32 tile [BLOCK_M, tile columns]
 * of two pieces (the two consumers' dQ pieces), each in the register order of the wgmma
 * accumulator: float 4·(128·j + thread) + e of a piece is thread's dq[4j + e], at accumulator row
 * 16·(thread / 32) + (thread % 32) / 4 + 8·(e / 2) and column 8j + 2·(thread % 4) + e % 2. For
 * pieces [64, 64] (block_m 64 and 128) and [64, 96] (192 / 128: its two accumulators, N = 64 and
 * 32, in column order) those are the piece's row and column; the 80-row tile's pieces hold dQᵀ [64
 * columns, 80 rows] (fa_hopper_bwd_dq_transposed): accumulator row = dQ column, accumulator column
 * = dQ row. A consumer stages its piece with 16-byte shared stores at fixed offsets, the dQ writer
 * adds it with one 1-D bulk reduce-add, and bwd.cu's conversion kernel reorders it
 * (FlashAttention-3/4's dQaccum layout). Returns the tile's columns (the kernel's bucket, or 192
 * with d192 = the 192 / 128 kernel runs), 0 for the row layout [heads_q, total_q, d] of the
 * bucket-256 kernel. */
FA_HOPPER_FN int fa_hopper_bwd_dq_tile_cols(int kernel_bucket, int d192) {
    return d192 ? 192 : kernel_bucket == 64 || kernel_bucket == 128 ? kernel_bucket : 0;
}

/* The tiles of block_m rows that no wgmma M divides hold their pieces transposed (above). */
FA_HOPPER_FN int fa_hopper_bwd_dq_transposed(int block_m) { return block_m % 64 != 0; }

/* A tile's two pieces: rows 64c .. 64c + 63 of all columns when block_m = 128 (bucket 64), else
 * columns (tile_cols / 2)·c .. of all block_m rows (bucket 128, 192 / 128). */
FA_HOPPER_FN int fa_hopper_bwd_dq_piece_row0(int block_m, int piece) { return block_m == 128 ? 64 * piece : 0; }
FA_HOPPER_FN int fa_hopper_bwd_dq_piece_col0(int block_m, int tile_cols, int piece) {
    return block_m == 128 ? 0 : tile_cols / 2 * piece;
}

/* fp32 elements of a piece: half the tile ([64, 64], [64, 96], or [64 columns, 80 rows] transposed). */
FA_HOPPER_FN int fa_hopper_bwd_dq_piece_elems(int block_m, int tile_cols) { return block_m * tile_cols / 2; }

/* Sequence b (its first packed row q_start) owns the tiles from q_start / block_m + b on:
 * ceil(len / block_m) of them fit before sequence b + 1's first, since
 * floor((q_start + len) / block_m) + 1 >= floor(q_start / block_m) + ceil(len / block_m). A
 * fixed-length batch is the packed case with q_start = b · seqlen_q. */
FA_HOPPER_FN long long fa_hopper_bwd_dq_tile0(long long q_start, long long b, int block_m) {
    return q_start / block_m + b;
}

/* Tiles per query head: total_q / block_m + batch (each sequence pads its last tile; at most
 * batch · block_m rows more than the packed rows, FlashAttention-2's padding of its dQ
 * accumulator). */
FA_HOPPER_FN long long fa_hopper_bwd_dq_tiles(long long total_q, long long batch, int block_m) {
    return block_m > 0 ? total_q / block_m + batch : 0;
}

/* fp32 elements of the Hopper kernels' dQ accumulator: tiled (tile_cols > 0, above) or
 * [heads_q, total_q, d]. */
FA_HOPPER_FN long long fa_hopper_bwd_dq_elems(int tile_cols, int block_m, long long total_q, long long batch,
                                              long long heads_q, long long head_dim) {
    return tile_cols > 0 ? heads_q * fa_hopper_bwd_dq_tiles(total_q, batch, block_m) * block_m * tile_cols
                         : heads_q * total_q * head_dim;
}

/* Block-mask walks (buckets 64 and 128, whose layout holds the MODS kernels): a 16-byte slot per
 * Q/dO stage for the iteration's position, written by the producer, so the consumers never walk
 * the block map; after the mbarriers, 8 bytes of padding when their count is odd (the slots are
 * read as 16-byte vectors). */
FA_HOPPER_FN size_t fa_hopper_bwd_pos_bytes(int bucket) {
    return bucket <= 128 ? 8 * (size_t)(fa_hopper_bwd_barriers(bucket) % 2) + 16 * (size_t)fa_hopper_bwd_stages(bucket)
                         : 0;
}

/* Dynamic shared memory per CTA (cols = fa_hopper_bwd_cta_cols): K and V [BLOCK_N, cols]; STAGES ×
 * Q and DO_STAGES × dO [BLOCK_M, cols]; score_buffers × score_tiles 16-bit [BLOCK_M, BLOCK_N]
 * tiles; the pair's exchange; the dQ staging; STAGES × (LSE·log2e and D [BLOCK_M] fp32); the
 * mbarriers; the position slots; 1024 bytes to align the window to the swizzle atom. */
FA_HOPPER_FN size_t fa_hopper_bwd_smem_bytes(int bucket, int rows80) {
    const size_t cols = (size_t)fa_hopper_bwd_cta_cols(bucket), block_m = (size_t)fa_hopper_bwd_block_m(bucket, rows80);
    return 2 * (size_t)fa_hopper_bwd_block_n(bucket) * 2 * cols + fa_hopper_bwd_dq_staging_bytes(bucket, rows80) +
           (size_t)(fa_hopper_bwd_stages(bucket) + fa_hopper_bwd_do_stages(bucket)) * block_m * 2 * cols +
           (size_t)fa_hopper_bwd_score_buffers(bucket) * (size_t)fa_hopper_bwd_score_tiles(bucket) * block_m * 2 *
               (size_t)fa_hopper_bwd_block_n(bucket) +
           (size_t)fa_hopper_bwd_exchange_bytes(bucket) + (size_t)fa_hopper_bwd_stages(bucket) * 2 * block_m * 4 +
           8 * (size_t)fa_hopper_bwd_barriers(bucket) + fa_hopper_bwd_pos_bytes(bucket) + 1024;
}

/* The fp8 backward (bwd_sm90.cu's FP8 instantiation: bucket 128, 64 query rows, e4m3 dout): the
 * bucket-128 layout with e4m3 V and K in the V tile's two slabs (V's 16-bit copy is never read:
 * dPᵀ = V dOᵀ runs on the codes), then, 1024-byte aligned after the position slots, e4m3 Q and dO
 * stages [stages][64 rows][128 bytes]: 232,448 bytes, H100 / H200's opt-in limit exactly. */
FA_HOPPER_FN size_t fa_hopper_bwd_fp8_smem_bytes(void) {
    const size_t end = fa_hopper_bwd_smem_bytes(128, 0) - 1024, q8 = (end + 1023) & ~(size_t)1023;
    return q8 + 2 * (size_t)fa_hopper_bwd_stages(128) * (size_t)fa_hopper_bwd_block_m(128, 0) * 128 + 1024;
}

/* The fp8 backward's kernel takes the problem: e4m3 q, k, v and dout (fa_params.dout_e4m3), the
 * bucket-128 kernel's plain path at 64 rows (d or dv in 65..128, no softcap, ALiBi, negative scale,
 * dropout or score modifications; deterministic mode included). The other fp8 problems run the
 * bf16 backward on bf16 copies of the dequantised inputs. */
FA_HOPPER_FN int fa_hopper_bwd_fp8_ok(int head_dim, int head_dim_v, int softcap, int log2, int dropout, int mods) {
    return fa_hopper_bwd_bucket(head_dim, head_dim_v) == 128 && !softcap && !log2 && !dropout && !mods;
}

/* Score modifications (common/mods.cuh) on the Hopper backward (bwd_sm90.cu's MODS
 * instantiations at fa_hopper_mods_bucket: buckets 64 and 128 on bucket 128's kernel), without
 * softcap (the MODS exponent is formed in log2 units as the LOG2 kernels do) and not in
 * deterministic mode (a block mask's key blocks adding into one dQ tile need not be contiguous,
 * which the ordered dQ relies on); a block mask in whole tiles, block_q a multiple of BLOCK_M (64)
 * and block_k of BLOCK_N (128). Dropout never combines with them (mods.cu). block_q = block_k =
 * 0: no block mask. */
FA_HOPPER_FN int fa_hopper_bwd_mods_ok(int bucket, int softcap, int deterministic, long long block_q,
                                       long long block_k) {
    const int b = fa_hopper_mods_bucket(bucket);
    return b == 128 && !softcap && !deterministic &&
           ((block_q == 0 && block_k == 0) ||
            (block_q > 0 && block_k > 0 && block_q % fa_hopper_bwd_block_m(b, 0) == 0 &&
             block_k % fa_hopper_bwd_block_n(b) == 0));
}

/* NULL when the Hopper backward takes the problem, else why not (the portable kernels then do).
 * scale_log2 = softmax_scale · log2(e), softcap > 0 when on. Without softcap any scale and ALiBi
 * are covered: the exponent s·scale_log2 - slope·|i + shift - key| - LSE2 is formed first and the
 * mask writes -inf into it (fa_bwd_sm90_probs). With softcap (the SOFTCAP instantiations, picked
 * for softcap_pre > 0) the mask acts on tanh's output before the exponent, which has no ALiBi
 * term, and a negative scale leaves softcap_pre < 0: both stay on the portable kernel. Both
 * modes: deterministic = 1 orders each dQ tile's additions by key block (the DET
 * instantiations, semaphores), so it is no argument; nor is dropout (the DROPOUT instantiations
 * of every bucket). */
static inline const char *fa_hopper_bwd_unsupported(int cc_major, int cc_minor, fa_dtype dtype, int head_dim,
                                                    int head_dim_v, int has_alibi, float scale_log2, float softcap) {
    if (cc_major != 9 || cc_minor != 0) return "needs compute capability 9.0 (sm_90a code)";
    if (dtype != FA_DTYPE_F16 && dtype != FA_DTYPE_BF16) return "needs f16 or bf16";
    if (fa_hopper_bwd_bucket(head_dim, head_dim_v) == 0)
        return "needs head_dim and head_dim_v multiples of 8 in 64..512";
    if (softcap > 0.0f && has_alibi) return "does not implement ALiBi together with softcap";
    if (softcap > 0.0f && !(scale_log2 > 0.0f)) return "needs a positive softmax_scale with softcap";
    return NULL;
}

#endif /* FA_HOPPER_TILES_H */
