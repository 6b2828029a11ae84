/*
 * kvcache_tiles.h: tile sizes of the CUDA KV-cache decode kernel (kvcache_sm80.cuh) as
 * pure functions of the head-dim bucket, usable from C (host code, tests) and from CUDA (where
 * the kernel takes them as compile-time constants; in C++ they are constexpr).
 *
 * One block = the BLOCK_M packed query rows ("GQA packing": the group's query heads × the query
 * tokens, row r = token (r / group), head (r % group)) of one (batch, kv head, split). The block
 * streams the split's key tiles of BLOCK_N cache slots through a STAGES-deep cp.async pipeline;
 * each of the 4 warps owns 16 slots of every tile (keys split across warps, not rows), keeps its
 * own online-softmax state for all 16 rows, and the 4 states are merged in shared memory at the
 * end. Each K/V byte is read from memory once per block, whatever the group size.
 */
#ifndef FA_KVCACHE_TILES_H
#define FA_KVCACHE_TILES_H

#include <stddef.h>

#ifdef __cplusplus
#define FA_KV_TILES_FN static constexpr inline
#else
#define FA_KV_TILES_FN static inline
#endif

/* Head-dim buckets (d and dv padded up to the bucket of max(d, dv) by zero-filled loads, as the
 * forward does): 64, 128, 256; 0 = none fits (> 256). */
FA_KV_TILES_FN int fa_kv_hdim_bucket(int head_dim, int head_dim_v) {
    return (head_dim > head_dim_v ? head_dim : head_dim_v) <= 64    ? 64
           : (head_dim > head_dim_v ? head_dim : head_dim_v) <= 128 ? 128
           : (head_dim > head_dim_v ? head_dim : head_dim_v) <= 256 ? 256
                                                                    : 0;
}

/* Packed query rows per block: one m16 tile of mma.m16n8k16. Decoding has group × seqlen_q rows
 * (4 for 32 q / 8 kv heads, one token): the tile is mostly zero padding, which costs tensor-core
 * time the kernel has plenty of (it is bound by memory: ~4 FLOP per cache byte at 4 rows). */
enum { FA_KV_BLOCK_M = 16 };

/* Cache slots per tile: 64, 16 per warp (one k16 step of P·V per warp and tile). */
enum { FA_KV_BLOCK_N = 64 };

enum { FA_KV_WARPS = 4 };

/* The split heuristic's floor: a split streams at least this many key tiles (kvcache.cu). */
enum { FA_KV_MIN_SPLIT_TILES = 8 };

/* Pipeline depth. The kernel is bound by HBM bandwidth: at 4.8 TB/s and ~1 µs loaded latency the
 * chip needs ~4-5 MB in flight, ~35 KB per SM. A stage holds K and V of one tile: 16 KB (d 64),
 * 32 KB (d 128), 64 KB (d 256). d 64: 4 stages (3 in flight, 66 KB/block, 3 blocks/SM on sm_90);
 * d 128: 3 stages (2 in flight, 100 KB/block, 2 blocks/SM); d 256: 2 stages (1 in flight,
 * 136 KB, 1 block/SM; 3 would not fit the 163 KB of an sm_80 block). */
FA_KV_TILES_FN int fa_kv_stages(int bucket) { return bucket <= 64 ? 4 : bucket <= 128 ? 3 : 2; }

/* The kernel's launch bounds: the blocks per SM its shared memory allows on sm_90 (3 / 2 / 1 at
 * d 64 / 128 / 256), so ptxas budgets registers for them (without a minimum it caps d 64 at 128
 * registers and spills). */
FA_KV_TILES_FN int fa_kv_min_blocks(int bucket) { return bucket <= 64 ? 3 : bucket <= 128 ? 2 : 1; }

/* Q fragments stay in registers for the whole loop up to d 128 (32 registers); at 256 the O
 * accumulator (128 registers) leaves no room and Q is re-read from shared memory each tile. */
FA_KV_TILES_FN int fa_kv_q_in_regs(int bucket) { return bucket <= 128; }

/* Dynamic shared memory of one block: the Q tile, then STAGES × (K tile + V tile), 2 bytes per
 * element. After the loop the stage area is reused for the warps' fp32 partial states. */
FA_KV_TILES_FN size_t fa_kv_smem_bytes(int bucket) {
    return (size_t)2 * (size_t)FA_KV_BLOCK_M * (size_t)bucket +
           (size_t)fa_kv_stages(bucket) * (size_t)2 * 2 * (size_t)FA_KV_BLOCK_N * (size_t)bucket;
}

/* Resident blocks per SM the shared memory allows for a block of smem_bytes (fa_kv_smem_bytes or
 * fa_kvq_smem_bytes; the heuristic's "workers" per SM); registers (<= 255 × 128 threads) and
 * threads (128) never limit below this. 1 KB per block is reserved by the hardware on
 * sm_80/sm_90. */
FA_KV_TILES_FN int fa_kv_blocks_per_sm(size_t smem_bytes, size_t smem_per_sm) {
    return smem_bytes + 1024 > smem_per_sm                    ? 1
           : (int)(smem_per_sm / (smem_bytes + 1024)) > 8 ? 8
                                                            : (int)(smem_per_sm / (smem_bytes + 1024));
}

/* ---- quantised caches (kvcache_quant_sm80.cuh) ----------------------------------------------
 * Both quantised kernels copy a tile's cache rows as raw bytes into a STAGES-deep pipeline of
 * raw stages: a stage holds half the bytes of an unquantised one (Q8_0: 0.53), and so does the
 * cache traffic.
 *
 * int8 and e4m3 (a scale per token or per kv head): the register kernel reads each warp's K and
 * V bytes straight from the raw stage into its mma fragments (ldmatrix on byte rows), converts
 * them to f16 in registers (both formats are exact in f16) and applies the scales to the fp32
 * scores and probabilities. Its stages hold 8-bit rows of the bucket's length (pitch = bucket
 * bytes, 16-byte chunks swizzled), the int8 scales and the rows' (slab, row) pairs; no 16-bit
 * tiles, so more blocks fit an SM. */

/* Bytes per row of a raw stage's row table: the global addresses of the row's K and V bytes and
 * of its int8 K and V scales (0 where the row is not read), written once per tile by the thread
 * that finds the row, so that a copy costs a shared load and an add. */
enum { FA_KVQ_ROW_BYTES = 32 };

/* Raw stages of the register kernel: d 64: 4 (a stage is 10.5 KB: 3 in flight, 46 KB per block,
 * 4 blocks per sm_90 SM); d 128: 3 (18.5 KB: 2 in flight, 63.5 KB, 3 blocks); d 256: 2 (34.5 KB:
 * 1 in flight, 85 KB, 2 blocks). In flight per SM: 96 / 96 / 64 KB of cache bytes, against the
 * ~35 KB an SM needs at HBM bandwidth (the unquantised kernel's 64-100 KB). */
FA_KV_TILES_FN int fa_kvq_regs_stages(int bucket) { return bucket <= 64 ? 4 : bucket <= 128 ? 3 : 2; }

/* One stage of the register kernel: K rows, V rows (BLOCK_N × bucket bytes each), the int8
 * scales of K and of V (fp32 per row), the row table. */
FA_KV_TILES_FN size_t fa_kvq_regs_stage_bytes(int bucket) {
    return (size_t)2 * (size_t)FA_KV_BLOCK_N * (size_t)bucket + (size_t)2 * 4 * FA_KV_BLOCK_N +
           (size_t)FA_KVQ_ROW_BYTES * FA_KV_BLOCK_N;
}

/* Dynamic shared memory of one register-kernel block: the Q tile as loaded (16-bit), the Q
 * fragments in f16 (same size), the stages. The epilogue reuses everything after the Q tile. */
FA_KV_TILES_FN size_t fa_kvq_regs_smem_bytes(int bucket) {
    return (size_t)2 * 2 * (size_t)FA_KV_BLOCK_M * (size_t)bucket +
           (size_t)fa_kvq_regs_stages(bucket) * fa_kvq_regs_stage_bytes(bucket);
}

/* The register kernel's launch bounds: the blocks per SM its shared memory allows, sm_90
 * (228 KB per SM: 4 / 3 / 2 at d 64 / 128 / 256) or sm_80 (164 KB: 3 / 2 / 1), so ptxas budgets
 * registers for them and no more (at 3 blocks, d 128 has 168 registers). */
FA_KV_TILES_FN int fa_kvq_regs_min_blocks(int bucket, int sm90) {
    return sm90 ? (bucket <= 64 ? 4 : bucket <= 128 ? 3 : 2) : (bucket <= 64 ? 3 : bucket <= 128 ? 2 : 1);
}

/* Q8_0 (a scale per 32-value block): the shared-memory kernel dequantises the landed tile into
 * one 16-bit K tile and one V tile (the layout the mma loads of the unquantised kernel read). */

/* Bytes of one raw tile row in shared memory: the largest row of the bucket (Q8_0's), padded to
 * 16 bytes. */
FA_KV_TILES_FN int fa_kvq_row_pitch(int bucket) { return (bucket / 32 * 34 + 15) / 16 * 16; }

/* Raw stages: d 64: 4 (3 in flight, 64 KB/block, 3 blocks/SM on sm_90); d 128: 3 (2 in flight,
 * 95 KB, 2 blocks/SM); d 256: 2 (144 KB: 3 would not fit an sm_80 block). */
FA_KV_TILES_FN int fa_kvq_stages(int bucket) { return bucket <= 64 ? 4 : bucket <= 128 ? 3 : 2; }

/* One raw stage: K rows, V rows (BLOCK_N × pitch each), the int8 scales of K and of V (fp32 per
 * row), the row table. */
FA_KV_TILES_FN size_t fa_kvq_stage_bytes(int bucket) {
    return (size_t)2 * (size_t)FA_KV_BLOCK_N * (size_t)fa_kvq_row_pitch(bucket) + (size_t)2 * 4 * FA_KV_BLOCK_N +
           (size_t)FA_KVQ_ROW_BYTES * FA_KV_BLOCK_N;
}

/* Dynamic shared memory of one quantised block: Q tile, the dequantised K and V tiles, the raw
 * stages. The epilogue reuses everything after Q. */
FA_KV_TILES_FN size_t fa_kvq_smem_bytes(int bucket) {
    return (size_t)2 * (size_t)FA_KV_BLOCK_M * (size_t)bucket + (size_t)2 * 2 * (size_t)FA_KV_BLOCK_N * (size_t)bucket +
           (size_t)fa_kvq_stages(bucket) * fa_kvq_stage_bytes(bucket);
}

/* ---- large heads (kvcache_large_sm80.cuh): 256 < max(d, dv), d <= 576, dv <= 512 ------------
 * DeepSeek-style MLA decodes 128 query heads on one latent kv head (d 576, dv 512, 1-4 query
 * tokens), so a block packs 64 query rows (four m16 tiles) to read each cache byte for more rows,
 * and no warp holds a 512-wide fp32 O accumulator (256 registers per thread): 8 warps = 4 row
 * groups of 16 rows × 2 halves. For S = Q Kᵀ of a 32-slot key tile the two warps of a row group
 * split the k16 steps of d (each 16 rows × all 32 slots over half the steps); they swap their
 * partial scores through shared memory and both finish the same softmax on the sum, so P needs no
 * exchange; each then computes P·V for its half of dv's columns (at most 256: 128 fp32
 * registers). Tiles: Q [64][576] and K [32][576] rows of 72 16-byte chunks, V [32][512] rows of
 * 64 chunks; a latent cache (V = the first dv columns of K) has no V tile: P·V reads the K tile. */
enum { FA_KVL_MAX_D = 576, FA_KVL_MAX_DV = 512 };
enum { FA_KVL_BLOCK_M = 64, FA_KVL_BLOCK_N = 32, FA_KVL_WARPS = 8 };

/* Pipeline depth: 2 (one tile in flight while one is computed). A tile costs ~3 µs of mma.sync
 * and shared-memory traffic per block against ~1 µs of load latency, so a second tile in flight
 * adds little, and with 2 stages a latent block (160 KiB) still fits an sm_80 SM. */
enum { FA_KVL_STAGES = 2 };

/* Splits per (batch, kv head, row tile) at most: the fused merge stages one split's fp32 partial
 * o (64 rows × 512 columns, 128 KiB) and the splits' weights in the block's shared memory. */
enum { FA_KVL_MAX_SPLITS = 64 };

/* The large-head kernel runs when the wider of d and dv exceeds 256 (fa_kv_hdim_bucket's 0). */
FA_KV_TILES_FN int fa_kvl_wanted(int head_dim, int head_dim_v) { return head_dim > 256 || head_dim_v > 256; }

/* Head dims the large-head kernel takes: multiples of 8, 8 <= d <= 576, 8 <= dv <= 512. */
FA_KV_TILES_FN int fa_kvl_dims_ok(int head_dim, int head_dim_v) {
    return head_dim >= 8 && head_dim <= FA_KVL_MAX_D && head_dim % 8 == 0 && head_dim_v >= 8 &&
           head_dim_v <= FA_KVL_MAX_DV && head_dim_v % 8 == 0;
}

/* Columns of dv the row group's first warp computes (the second: the rest): whole pairs of n8
 * tiles (one ldmatrix.x4.trans each), the first warp taking the larger half; <= 256. */
FA_KV_TILES_FN int fa_kvl_dv_split(int head_dim_v) { return 16 * ((head_dim_v + 31) / 32); }

/* One stage: the K tile, and (v_in_k = 0) the V tile. */
FA_KV_TILES_FN size_t fa_kvl_stage_bytes(int v_in_k) {
    return (size_t)2 * FA_KVL_BLOCK_N * (size_t)(FA_KVL_MAX_D + (v_in_k ? 0 : FA_KVL_MAX_DV));
}

/* The partial scores the two warps of a row group swap: 16 rows × 32 slots fp32 per warp. */
FA_KV_TILES_FN size_t fa_kvl_exchange_bytes(void) { return (size_t)4 * 16 * FA_KVL_BLOCK_N * FA_KVL_WARPS; }

/* Dynamic shared memory of one block: Q, the stages, the score exchange. Latent cache:
 * 163840 bytes (fits sm_80's 163 KiB); separate K and V: 229376 (sm_90's 227 KiB). */
FA_KV_TILES_FN size_t fa_kvl_smem_bytes(int v_in_k) {
    return (size_t)2 * FA_KVL_BLOCK_M * FA_KVL_MAX_D + (size_t)FA_KVL_STAGES * fa_kvl_stage_bytes(v_in_k) +
           fa_kvl_exchange_bytes();
}

/* The wgmma kernels for large heads (kernels/kvcache_large_sm90.cu, sm_90a), dv = 512 only (each
 * warpgroup's P·V is one m64n256 accumulator of half of dv). Separate K and V caches: the large-head
 * kernel's WGMMA instantiations, the same blocks, loads, softmax and merge, with the two warps of a
 * row group being warps w and w + 4, one of each warpgroup: each warpgroup computes the 64 rows'
 * partial scores over every other k16 step of d (m64n32k16, Q and K from shared memory) and P·V
 * for its 256 columns (P from registers); tiles stored as slabs of 64 columns in wgmma's 128-byte
 * swizzle, 1024-byte aligned (1024 more bytes). A latent cache: fa_kvl_latent_kernel (below).
 * Rotary (separate caches only: it rotates Q and appended keys in shared memory, in the mma.sync
 * tiles' layout) stays on the mma.sync kernel. */
FA_KV_TILES_FN int fa_kvl_wgmma_ok(int cc_major, int cc_minor, int head_dim, int head_dim_v, int rotary) {
    return cc_major == 9 && cc_minor == 0 && head_dim_v == FA_KVL_MAX_DV && fa_kvl_dims_ok(head_dim, head_dim_v) &&
           !rotary;
}

FA_KV_TILES_FN size_t fa_kvl_wgmma_smem_bytes(int v_in_k) { return fa_kvl_smem_bytes(v_in_k) + 1024; }

/* On a latent cache the wgmma path is its own kernel (kvcache_large_sm90.cu, fa_kvl_latent_kernel):
 * 64-slot tiles in pairs, FlashMLA's "seesaw" schedule: two consumer warpgroups, each computing
 * one tile's scores and softmax for all 64 rows (m64n64: the tensor cores' rate from shared
 * memory) and P·V for its half of dv with both tiles' P, and a producer warpgroup issuing the
 * copies (TMA boxes for whole tiles of cache rows). Shared memory: a header (13 mbarriers, then
 * the softmax statistics the two warpgroups hand each other: {max, factor} per row one way,
 * {max, factor, sum} of its two rows per consumer thread the other), the alignment, Q [64][576]
 * and two tiles [64][576]; P travels through a tile's last slab (columns 512..575, free once the
 * tile's scores are done). 226944 bytes. */
enum { FA_KVL_LATENT_BLOCK_N = 64 };
enum { FA_KVL_LATENT_BARRIER_BYTES = 128, FA_KVL_LATENT_STATS_BYTES = 8 * FA_KVL_BLOCK_M + 32 * 128 };

FA_KV_TILES_FN size_t fa_kvl_latent_header_bytes(void) {
    return (size_t)FA_KVL_LATENT_BARRIER_BYTES + FA_KVL_LATENT_STATS_BYTES;
}

FA_KV_TILES_FN size_t fa_kvl_latent_smem_bytes(void) {
    return fa_kvl_latent_header_bytes() + 1024 + (size_t)2 * FA_KVL_BLOCK_M * FA_KVL_MAX_D +
           (size_t)2 * 2 * FA_KVL_LATENT_BLOCK_N * FA_KVL_MAX_D;
}

#endif /* FA_KVCACHE_TILES_H */
