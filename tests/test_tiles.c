/*
 * test_tiles.c: the tile-shape functions of the CUDA forward and backward kernels (fwd_tiles.h,
 * bwd_tiles.h: the portable mma.sync kernels; sm90_tiles.h, the sm_90a kernels) and of the KV-cache decode kernels
 * (kvcache_tiles.h, unquantised and quantised caches) are pure C functions:
 * checked here on the CPU, so a tile change that cannot fit a GPU fails CI before any GPU run.
 */
#include <stddef.h>
#include <stdlib.h>

#include "cuda/common/bwd_tiles.h"
#include "cuda/common/fwd_tiles.h"
#include "cuda/common/kvcache_tiles.h"
#include "cuda/common/sm90_tiles.h"
#include "test.h"

/* Opt-in shared memory per block: A100 (sm_80) 163 KiB, H100/H200 (sm_90) 227 KiB. */
enum { SMEM_SM80 = 166912, SMEM_SM90 = 232448 };

FA_TEST(tiles_portable_forward) {
    static const int buckets[] = {64, 128, 256, 512, 576};
    for (int i = 0; i < 5; i++) {
        int b = buckets[i];
        const int limit = b == 576 ? SMEM_SM90 : SMEM_SM80; /* 576: sm_90 only */
        FA_CHECK(fa_fwd_smem_bytes(b) <= (size_t)limit, "bucket %d: %zu bytes of smem > %d", b,
                 fa_fwd_smem_bytes(b), limit);
        const int row_warps = fa_fwd_warps(b) / fa_fwd_dv_split(b);
        FA_CHECK(fa_fwd_block_m(b) % (16 * row_warps) == 0, "bucket %d: rows split over row groups", b);
        FA_CHECK(fa_fwd_block_n(b) % 32 == 0, "bucket %d: whole k16 steps of P·V, whole dropout words", b);
        FA_CHECK(fa_fwd_dv_split(b) == 1 ||
                     (b / 16 % 2 == 0 && fa_fwd_bucket_dv(b) / 8 / fa_fwd_dv_split(b) % 8 == 0 &&
                      fa_fwd_bucket_dv(b) / (2 * fa_fwd_dv_split(b)) <= 128),
                 "bucket %d: a dv split halves the k16 steps and O in 128-byte groups, <= 128 O registers", b);
    }
    FA_CHECK(fa_fwd_hdim_bucket(8, 8) == 64 && fa_fwd_hdim_bucket(64, 72) == 128 &&
                 fa_fwd_hdim_bucket(256, 8) == 256 && fa_fwd_hdim_bucket(264, 8) == 512 &&
                 fa_fwd_hdim_bucket(512, 512) == 512 && fa_fwd_hdim_bucket(520, 512) == 576 &&
                 fa_fwd_hdim_bucket(576, 512) == 576 && fa_fwd_hdim_bucket(576, 520) == 0 &&
                 fa_fwd_hdim_bucket(584, 8) == 0 && fa_fwd_hdim_bucket(8, 520) == 0,
             "portable buckets: max(d, dv) rounded up to 64/128/256/512, 576 for d <= 576 with dv <= 512");
    FA_CHECK(fa_fwd_bucket_dv(576) == 512 && fa_fwd_bucket_dv(512) == 512 && fa_fwd_bucket_dv(128) == 128,
             "bucket 576 pads v/o to 512");
    FA_CHECK(fa_fwd_smem_bytes(512) == 153600 && fa_fwd_smem_bytes(576) == 169984,
             "large heads: Q + one K and one V tile of 32 keys, row sums, pointers, the 16 KiB score exchange");
    FA_CHECK(fa_fwd_heavy_first(-1, 0) && !fa_fwd_heavy_first(-1, -1) && !fa_fwd_heavy_first(16, 0),
             "heavy-first order exactly for causal-like masks (right bounded, left unbounded)");
}

FA_TEST(tiles_portable_backward) {
    static const int buckets[] = {64, 128, 256, 512, 576};
    for (int i = 0; i < 5; i++) {
        int b = buckets[i];
        const int limit = b >= 256 ? SMEM_SM90 : SMEM_SM80; /* 256 and up: sm_90 only */
        FA_CHECK(fa_bwd_smem_bytes(b) <= (size_t)limit, "bucket %d: %zu bytes of smem > %d", b,
                 fa_bwd_smem_bytes(b), limit);
        FA_CHECK(fa_bwd_block_k(b) == 16 * fa_bwd_warps(b) / fa_bwd_split_d(b), "bucket %d: 16 keys per key warp", b);
        FA_CHECK(b / fa_bwd_split_d(b) <= 144, "bucket %d: dK and dV columns of a warp <= 144 (144 registers)", b);
        FA_CHECK(fa_bwd_block_q(b) / fa_bwd_split_d(b) >= 16, "bucket %d: whole m16n8 pairs of queries per warp", b);
    }
    FA_CHECK(fa_bwd_split_d(512) == 4 && fa_bwd_block_k(512) == 32 && fa_bwd_q_stages(512) == 1 &&
                 fa_bwd_q_stages(256) == 2 && fa_bwd_smem_bytes(512) == 205312 && fa_bwd_smem_bytes(256) == 214016,
             "d = 512: 4 column parts, 32 keys, one Q/dO stage, 200.5 KiB; d = 256 unchanged (209 KiB)");
    FA_CHECK(fa_bwd_hdim_bucket(512, 512) == 512 && fa_bwd_hdim_bucket(264, 128) == 512 &&
                 fa_bwd_hdim_bucket(576, 512) == 576 && fa_bwd_hdim_bucket(128, 128) == 128 &&
                 fa_bwd_hdim_bucket(576, 520) == 0 && fa_bwd_smem_bytes(576) == 229888,
             "backward buckets: the forward's; 576: 224.5 KiB");
}

FA_TEST(tiles_hopper_forward) {
    static const int buckets[] = {64, 128, 192, 256, 512};
    for (int i = 0; i < 5; i++) {
        int b = buckets[i];
        size_t smem = fa_hopper_smem_bytes(b);
        FA_CHECK(smem <= SMEM_SM90, "bucket %d: %zu bytes of smem > %d", b, smem, SMEM_SM90);
        int m = fa_hopper_block_m(b), n = fa_hopper_block_n(b);
        FA_CHECK(m % 64 == 0 && fa_hopper_consumers(b) >= 2 && fa_hopper_consumers(b) <= 3 &&
                     fa_hopper_consumers(b) == m / 64,
                 "bucket %d: 2 or 3 consumer warpgroups (%d rows), one per 64 rows", b, m);
        FA_CHECK(n % 16 == 0 && n <= 256 && (size_t)n * 128 % 1024 == 0,
                 "bucket %d: BLOCK_N %d: k16 steps, TMA box <= 256, slabs on 1024-byte atoms", b, n);
        FA_CHECK(fa_hopper_stages(b) >= 2, "bucket %d: a ring of at least 2 stages", b);
        /* every region starts 1024-byte aligned: Q and each K/V stage are whole slabs */
        FA_CHECK(fa_hopper_q_bytes(b) % 1024 == 0 && fa_hopper_o_bytes(b) % 1024 == 0 &&
                     fa_hopper_k_bytes(b) % 1024 == 0 && fa_hopper_v_bytes(b) % 1024 == 0,
                 "bucket %d: alignment", b);
        FA_CHECK(fa_hopper_dv(b) <= fa_hopper_dqk(b) && fa_hopper_cta_dqk(b) % 64 == 0 && fa_hopper_cta_dv(b) % 64 == 0 &&
                     fa_hopper_cta_dqk(b) <= 256 && fa_hopper_cta_dqk(b) * fa_hopper_fwd_cluster_ctas(b) == fa_hopper_dqk(b),
                 "bucket %d: whole slabs per CTA, at most 256 columns (wgmma N), O fits Q's buffer", b);
        size_t with_o = fa_hopper_q_bytes(b) + fa_hopper_o_bytes(b) +
                        (size_t)fa_hopper_stages(b) * (fa_hopper_k_bytes(b) + fa_hopper_v_bytes(b)) +
                        fa_hopper_exchange_bytes(b) + fa_hopper_barrier_bytes(b) + 1024;
        FA_CHECK(fa_hopper_o_own_buffer(b) == (with_o <= SMEM_SM90), "bucket %d: own O buffer iff it fits", b);
        const int one_cta = fa_hopper_fwd_cluster_ctas(b) == 1;
        FA_CHECK(fa_hopper_persistent(b, 0, 0) == (one_cta && fa_hopper_o_own_buffer(b)) && !fa_hopper_persistent(b, 1, 0) &&
                     fa_hopper_dynamic(b, 1) == one_cta && !fa_hopper_dynamic(b, 0) &&
                     fa_hopper_persistent(b, 0, 1) == one_cta,
                 "bucket %d: own O (or fp8): persistent for even tiles; the dynamic schedule for causal-like "
                 "tiles at every one-CTA bucket; CTA pairs: one cluster per tile", b);
        /* K/V multicast pairs: one-CTA buckets from 128, unmasked fixed-length unpacked tiles without
         * score modifications, an even number of query tiles per head */
        FA_CHECK(fa_hopper_fwd_kv_multicast_bucket(b) == (one_cta && b >= 128) &&
                     fa_hopper_fwd_kv_multicast(b, 0, 0, 0, -1, -1, 32) == (one_cta && b >= 128) &&
                     !fa_hopper_fwd_kv_multicast(b, 0, 0, 0, -1, -1, 31) && !fa_hopper_fwd_kv_multicast(b, 1, 0, 0, -1, -1, 32) &&
                     !fa_hopper_fwd_kv_multicast(b, 0, 1, 0, -1, -1, 32) && !fa_hopper_fwd_kv_multicast(b, 0, 0, 1, -1, -1, 32) &&
                     !fa_hopper_fwd_kv_multicast(b, 0, 0, 0, -1, 0, 32) && !fa_hopper_fwd_kv_multicast(b, 0, 0, 0, 100, -1, 32),
                 "bucket %d: K/V multicast pairs only where both tiles of a pair walk the same key tiles", b);
    }
    FA_CHECK(fa_hopper_fwd_mods_blocks_ok(128, 128, 128) && fa_hopper_fwd_mods_blocks_ok(192, 256, 384) &&
                 fa_hopper_fwd_mods_blocks_ok(64, 0, 0) && fa_hopper_fwd_mods_blocks_ok(256, 0, 0) &&
                 fa_hopper_fwd_mods_blocks_ok(64, 128, 128) && !fa_hopper_fwd_mods_blocks_ok(64, 192, 128) &&
                 fa_hopper_mods_bucket(64) == 128 && fa_hopper_mods_bucket(192) == 192 &&
                 !fa_hopper_fwd_mods_blocks_ok(256, 128, 128) && fa_hopper_fwd_mods_blocks_ok(256, 128, 160) &&
                 !fa_hopper_fwd_mods_blocks_ok(128, 64, 128) && !fa_hopper_fwd_mods_blocks_ok(128, 128, 0),
             "Hopper forward MODS: bucket 64 on 128's kernels, a block mask in whole tiles (128 x 128 up to bucket 192)");
    FA_CHECK(fa_hopper_bwd_mods_ok(128, 0, 0, 128, 128) && fa_hopper_bwd_mods_ok(64, 0, 0, 128, 256) &&
                 fa_hopper_bwd_mods_ok(128, 0, 0, 64, 128) && fa_hopper_bwd_mods_ok(64, 0, 0, 0, 0) &&
                 fa_hopper_bwd_mods_ok(128, 0, 0, 0, 0) && !fa_hopper_bwd_mods_ok(256, 0, 0, 0, 0) &&
                 !fa_hopper_bwd_mods_ok(192, 0, 0, 128, 128) && !fa_hopper_bwd_mods_ok(128, 1, 0, 128, 128) &&
                 !fa_hopper_bwd_mods_ok(128, 0, 1, 0, 0) && !fa_hopper_bwd_mods_ok(128, 0, 0, 128, 64),
             "Hopper backward MODS: buckets 64 / 128 on 128's kernel, no softcap or determinism, whole tiles");
    FA_CHECK(fa_hopper_o_own_buffer(64) && fa_hopper_o_own_buffer(128) && !fa_hopper_o_own_buffer(192) &&
                 !fa_hopper_o_own_buffer(256),
             "own O buffer at 64 and 128 only (192 and 256: Q + K/V leave no room)");
    FA_CHECK(fa_hopper_smem_bytes(192) == 48 * 1024 + 2 * (48 + 32) * 1024 + 8 * 10 + 16 + 16 * 2 + 1024 &&
                 fa_hopper_pingpong(192),
             "bucket 192 (192 / 128): Q 48 KiB + 2 stages of K 48 and V 32 KiB, barriers, the tile slot and a "
             "position slot per stage, ping-pong");
    /* buckets: d and dv in 64..256, multiples of 8; the larger one's bucket */
    FA_CHECK(fa_hopper_bucket(64, 64) == 64 && fa_hopper_bucket(96, 128) == 128 && fa_hopper_bucket(192, 256) == 256,
             "hopper buckets");
    FA_CHECK(fa_hopper_bucket(192, 128) == 192 && fa_hopper_bucket(136, 64) == 192 && fa_hopper_bucket(192, 136) == 256 &&
                 fa_hopper_bucket(64, 128) == 128 && fa_hopper_bucket(128, 64) == 128 && fa_hopper_bucket(64, 256) == 256 &&
                 fa_hopper_bucket(128, 192) == 256,
             "d and dv in different buckets: 192 / 128 (MLA) its own, otherwise the larger bucket");
    FA_CHECK(fa_hopper_bucket(32, 32) == 0 && fa_hopper_bucket(32, 128) == 0 && fa_hopper_bucket(100, 100) == 0 &&
                 fa_hopper_bucket(520, 512) == 0 && fa_hopper_bucket(576, 512) == 0 && fa_hopper_bucket(512, 516) == 0,
             "below 64, non-multiples of 8 and > 512 are not covered");
    /* bucket 512: CTA pairs, each the bucket-256 tile (128 rows, two consumers) on 256 columns, 64 keys */
    FA_CHECK(fa_hopper_bucket(264, 264) == 512 && fa_hopper_bucket(512, 512) == 512 && fa_hopper_bucket(320, 64) == 512 &&
                 fa_hopper_bucket(128, 512) == 512 && fa_hopper_fwd_cluster_ctas(512) == 2 &&
                 fa_hopper_fwd_cluster_ctas(256) == 1 && fa_hopper_cta_dqk(512) == 256 && fa_hopper_cta_dv(512) == 256 &&
                 fa_hopper_cta_dqk(256) == 256 && fa_hopper_cta_dv(192) == 128 && fa_hopper_block_m(512) == 128 &&
                 fa_hopper_block_n(512) == 64 && fa_hopper_consumers(512) == 2,
             "d or dv in 264..512: bucket 512, a CTA pair per 128 x 64 tile, 256 columns per CTA");
    FA_CHECK(fa_hopper_smem_bytes(512) == 64 * 1024 + 2 * (32 + 32) * 1024 + 32 * 1024 + 8 * 14 + 16 + 16 * 2 + 1024 &&
                 fa_hopper_smem_bytes(512) <= SMEM_SM90 && fa_hopper_exchange_bytes(512) == 32 * 1024 &&
                 fa_hopper_exchange_bytes(256) == 0 && fa_hopper_fwd_barriers(512) == 14 &&
                 fa_hopper_fwd_barriers(256) == 10 && !fa_hopper_o_own_buffer(512) && !fa_hopper_pingpong(512),
             "bucket 512: Q 64 KiB + 2 stages of K and V 32 KiB + two receive buffers of 16 KiB, four exchange "
             "barriers; O in Q's buffer");
    FA_CHECK(fa_hopper_bwd_bucket(512, 512) == 512 && fa_hopper_bwd_bucket(264, 128) == 512 &&
                 fa_hopper_pack_heads(512, 4, 8) == 0,
             "bucket 512: the Hopper backward's CTA pairs; no packed GQA tiles in the forward");
    FA_CHECK(fa_hopper_fwd_mods_blocks_ok(512, 0, 0) && fa_hopper_fwd_mods_blocks_ok(512, 128, 64) &&
                 fa_hopper_fwd_mods_blocks_ok(512, 128, 128) && !fa_hopper_fwd_mods_blocks_ok(512, 64, 32) &&
                 !fa_hopper_fwd_mods_blocks_ok(512, 128, 96),
             "bucket 512 with score modifications: a block mask in whole 128 x 64 tiles");
}

/* The head-grouped heavy-first order visits every (unit, query block) exactly once; within a
 * group the query blocks never increase (longest first) and only the group's units appear; groups
 * come in unit order. */
FA_TEST(tiles_grouped_order) {
    const int64_t units_list[] = {1, 3, 8, 128, 130};
    const int m_list[] = {1, 2, 11, 16, 64};
    const int group_list[] = {1, 4, 8, 9, 200};
    for (size_t ui = 0; ui < sizeof units_list / sizeof units_list[0]; ++ui)
        for (size_t mi = 0; mi < sizeof m_list / sizeof m_list[0]; ++mi)
            for (size_t gi = 0; gi < sizeof group_list / sizeof group_list[0]; ++gi) {
                const int64_t units = units_list[ui];
                const int m = m_list[mi], group = group_list[gi];
                const int64_t total = units * m;
                unsigned char *seen = calloc((size_t)total, 1);
                FA_CHECK(seen != NULL, "allocation");
                if (seen == NULL) return;
                int ok_range = 1, ok_once = 1, ok_order = 1;
                fa_tile_pos prev = {-1, m};
                for (int64_t t = 0; t < total; ++t) {
                    const fa_tile_pos pos = fa_fwd_grouped_tile(t, units, m, group);
                    if (pos.unit < 0 || pos.unit >= units || pos.m_block < 0 || pos.m_block >= m) {
                        ok_range = 0;
                        break;
                    }
                    const int64_t idx = pos.unit * m + pos.m_block;
                    if (seen[idx]) ok_once = 0;
                    seen[idx] = 1;
                    const int64_t g = t / ((int64_t)group * m), gp = prev.unit < 0 ? g : prev.unit / group;
                    if (pos.unit / group != g) ok_order = 0;                     /* the group's units only */
                    if (gp == g && t % ((int64_t)group * m) != 0 && pos.m_block > prev.m_block)
                        ok_order = 0;                                            /* longest first        */
                    prev = pos;
                }
                free(seen);
                FA_CHECK(ok_range && ok_once && ok_order,
                         "grouped order units %lld, m blocks %d, group %d: range %d, once %d, order %d",
                         (long long)units, m, group, ok_range, ok_once, ok_order);
            }
    /* group >= units: the plain longest-first order over all units (unit fastest) */
    const fa_tile_pos a = fa_fwd_grouped_tile(0, 5, 3, 8), b = fa_fwd_grouped_tile(5, 5, 3, 8);
    FA_CHECK(a.unit == 0 && a.m_block == 2 && b.unit == 0 && b.m_block == 1, "one group = unit-fastest longest first");
    FA_CHECK(fa_fwd_head_group(16, 132) == 9 && fa_fwd_head_group(64, 132) == 3 && fa_fwd_head_group(11, 132) == 12 &&
                 fa_fwd_head_group(132, 132) == 1 && fa_fwd_head_group(1000, 132) == 1 && fa_fwd_head_group(0, 132) == 1,
             "head group: ceil(sm_count / m blocks), at least 1");
}

FA_TEST(tiles_hopper_dispatch) {
    const float scale_log2 = 0.1275f; /* 1/sqrt(128) · log2(e) */
    FA_CHECK(fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_BF16, 128, 128, 0, scale_log2, 0.0f, 0) == NULL,
             "sm_90 bf16 d = 128 takes the Hopper kernel");
    FA_CHECK(fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_F16, 96, 96, 0, scale_log2, 30.0f, 0) == NULL,
             "f16, d = 96 (bucket 128), softcap");
    FA_CHECK(fa_hopper_fwd_unsupported(8, 0, FA_DTYPE_BF16, 128, 128, 0, scale_log2, 0.0f, 0) != NULL,
             "sm_80: portable");
    FA_CHECK(fa_hopper_fwd_unsupported(10, 0, FA_DTYPE_BF16, 128, 128, 0, scale_log2, 0.0f, 0) != NULL,
             "sm_100: the sm_90a code does not run there");
    FA_CHECK(fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_F32, 128, 128, 0, scale_log2, 0.0f, 0) != NULL, "f32");
    FA_CHECK(fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_BF16, 128, 128, 1, scale_log2, 0.0f, 0) == NULL,
             "ALiBi: Hopper (scores in log2 units before the mask)");
    FA_CHECK(fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_BF16, 256, 256, 1, scale_log2, 30.0f, 0) == NULL,
             "ALiBi with softcap: Hopper");
    FA_CHECK(fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_BF16, 128, 128, 0, -scale_log2, 0.0f, 0) == NULL,
             "negative scale without softcap: Hopper (scores in log2 units before the max)");
    FA_CHECK(fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_BF16, 128, 128, 0, -scale_log2, 10.0f, 0) == NULL,
             "negative scale with softcap: the scores are transformed first");
    FA_CHECK(fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_BF16, 32, 32, 0, scale_log2, 0.0f, 0) != NULL, "d = 32");
    FA_CHECK(fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_BF16, 512, 512, 1, scale_log2, 30.0f, 0) == NULL &&
                 fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_F16, 320, 256, 0, -scale_log2, 0.0f, 0) == NULL &&
                 fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_BF16, 512, 512, 0, scale_log2, 0.0f, 1) == NULL &&
                 fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_BF16, 576, 512, 0, scale_log2, 0.0f, 0) != NULL,
             "d = 512: ALiBi, softcap, negative scale, dropout; 576 / 512 not at all");
    FA_CHECK(fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_BF16, 128, 128, 0, scale_log2, 0.0f, 1) == NULL,
             "dropout: Hopper (the DROPOUT instantiations)");
    FA_CHECK(fa_hopper_fwd_unsupported(9, 0, FA_DTYPE_BF16, 256, 256, 1, scale_log2, 0.0f, 1) == NULL,
             "dropout with ALiBi at d = 256: Hopper");
    FA_CHECK(fa_hopper_fwd_unsupported(8, 0, FA_DTYPE_BF16, 128, 128, 0, scale_log2, 0.0f, 1) != NULL,
             "dropout on sm_80: portable");
}

FA_TEST(tiles_hopper_pack_gqa) {
    FA_CHECK(fa_hopper_pack_rows(1) == 8 && fa_hopper_pack_rows(8) == 8 && fa_hopper_pack_rows(9) == 16 &&
                 fa_hopper_pack_rows(64) == 64,
             "a packed head's rows: seqlen_q rounded up to 8 (a 1024-byte swizzle atom)");
    FA_CHECK(fa_hopper_pack_heads(128, 4, 8) == 8 && fa_hopper_pack_heads(128, 4, 32) == 16 &&
                 fa_hopper_pack_heads(128, 13, 6) == 6,
             "small sq: the whole group (up to 16 heads of 8 rows) in one tile");
    FA_CHECK(fa_hopper_pack_heads(128, 40, 6) == 3 && fa_hopper_pack_heads(128, 48, 6) == 2 &&
                 fa_hopper_pack_heads(256, 33, 8) == 3 && fa_hopper_pack_tiles(256, 33, 8) == 3,
             "heads per tile: what fits, balanced over the fewest tiles");
    FA_CHECK(fa_hopper_pack_heads(64, 96, 2) == 2 && fa_hopper_pack_heads(64, 97, 2) == 0,
             "bucket 64: 192-row tiles hold 2 heads up to sq 96");
    FA_CHECK(fa_hopper_pack_heads(128, 65, 4) == 0 && fa_hopper_pack_heads(128, 4, 1) == 0 &&
                 fa_hopper_pack_heads(0, 4, 8) == 0 && fa_hopper_pack_heads(128, 0, 8) == 0,
             "no packing: one head per tile, MHA, no bucket, no rows");
    static const int buckets[] = {64, 128, 192, 256};
    for (int bi = 0; bi < 4; bi++)
        for (int sq = 1; sq <= 200; sq++)
            for (int group = 1; group <= 64; group++) {
                const int b = buckets[bi], heads = fa_hopper_pack_heads(b, sq, group);
                const int tiles = fa_hopper_pack_tiles(b, sq, group), rows = fa_hopper_pack_rows(sq);
                if (heads == 0) {
                    FA_CHECK(tiles == 0 && (group < 2 || 2 * rows > fa_hopper_block_m(b)),
                             "bucket %d sq %d group %d: unpacked only when nothing packs", b, sq, group);
                    continue;
                }
                const int fit = fa_hopper_block_m(b) / rows;
                FA_CHECK(heads >= 2 && heads <= group && heads * rows <= fa_hopper_block_m(b),
                         "bucket %d sq %d group %d: %d heads of %d rows fit the tile", b, sq, group, heads, rows);
                FA_CHECK(tiles == (group + fit - 1) / fit && tiles * heads >= group && (tiles - 1) * heads < group,
                         "bucket %d sq %d group %d: fewest tiles, none empty", b, sq, group);
                FA_CHECK(rows % 8 == 0 && rows * 128 % 1024 == 0, "every head starts on a swizzle atom");
            }
    FA_CHECK(fa_hopper_pack_gqa(128, 4, 4, 0, 0) == 4 && fa_hopper_pack_gqa(128, 4, 4, 0, 1) == 4 &&
                 fa_hopper_pack_gqa(128, 4, 4, 0, -1) == 0,
             "hq 32 / hkv 8, sq 4, d 128: 4 heads per tile by default and forced, none when off");
    FA_CHECK(fa_hopper_pack_gqa(128, 4, 4, 1, 1) == 0, "varlen: never packed");
    FA_CHECK(fa_hopper_pack_gqa(128, 100, 4, 0, 1) == 0 && fa_hopper_pack_gqa(64, 96, 4, 0, 0) == 2,
             "sq 100: one head per 128-row tile; bucket 64 (192 rows): 2");
}

FA_TEST(tiles_hopper_setmaxnreg) {
    FA_CHECK(fa_hopper_launch_regs(384) == 168 && fa_hopper_launch_regs(512) == 128, "launch caps 168 and 128");
    FA_CHECK(fa_hopper_regs_split_ok(384, 24, 240) && fa_hopper_regs_split_ok(512, 24, 160) &&
                 fa_hopper_regs_split_ok(512, 32, 160),
             "the splits the kernels use fit their CTA's pool");
    /* 128·32 + 256·240 = 65,536 fits the register file but not 384 × 168: it hung on the H200 */
    FA_CHECK(!fa_hopper_regs_split_ok(384, 32, 240) && !fa_hopper_regs_split_ok(384, 24, 160) &&
                 !fa_hopper_regs_split_ok(384, 176, 240) && !fa_hopper_regs_split_ok(128, 24, 240),
             "a split past the pool, an .inc below the cap, a .dec above it, no consumers: rejected");
}

FA_TEST(tiles_hopper_fp8) {
    FA_CHECK(fa_hopper_fp8_bucket(8, 64) == 64 && fa_hopper_fp8_bucket(64, 72) == 128 &&
                 fa_hopper_fp8_bucket(128, 96) == 128 && fa_hopper_fp8_bucket(136, 128) == 256 &&
                 fa_hopper_fp8_bucket(256, 256) == 256 && fa_hopper_fp8_bucket(264, 256) == 0 &&
                 fa_hopper_fp8_bucket(60, 64) == 0,
             "fp8 buckets 64, 128 and 256, multiples of 8 only");
    for (int b = 64; b <= 256; b *= 2)
        for (int vt = 0; vt <= 1; vt++)
            FA_CHECK(fa_hopper_fp8_smem_bytes(b, vt) <= SMEM_SM90, "fp8 bucket %d (V transposed in the kernel: %d): "
                     "%zu bytes of smem", b, vt, fa_hopper_fp8_smem_bytes(b, vt));
    FA_CHECK(fa_hopper_fp8_pv_wait_late(128) && !fa_hopper_fp8_pv_wait_late(64) && !fa_hopper_fp8_pv_wait_late(256) &&
                 fa_hopper_fp8_smem_bytes(128, 0) == 128 * 128 + 2 * 2 * 128 * 128 + 128 * 2 * 128 + 8 * 10 + 16 +
                                                         16 * 2 + 8 * 128 + 1024 &&
                 fa_hopper_fp8_smem_bytes(128, 1) == fa_hopper_fp8_smem_bytes(128, 0) + 2 * (128 * 128 + 16),
             "fp8 bucket 128: the P·V wait after the softmax, one order word per consumer thread; the V staging "
             "with its two mbarriers per stage");
    FA_CHECK(fa_hopper_fp8_vt_fits(64) && fa_hopper_fp8_vt_fits(128) && !fa_hopper_fp8_vt_fits(256) &&
                 fa_hopper_fp8_smem_bytes(256, 1) == fa_hopper_fp8_smem_bytes(256, 0),
             "fp8: the V staging fits at buckets 64 and 128; bucket 256 has no room for it");
    FA_CHECK(fa_hopper_fp8_vt_in_kernel(128, 4096, 16, 16) && fa_hopper_fp8_vt_in_kernel(128, 65536, 64, 1) &&
                 fa_hopper_fp8_vt_in_kernel(64, 4096, 32, 32) && !fa_hopper_fp8_vt_in_kernel(64, 8192, 32, 32) &&
                 !fa_hopper_fp8_vt_in_kernel(256, 1024, 8, 8) && fa_hopper_fp8_vt_in_kernel(64, 512, 64, 8) &&
                 !fa_hopper_fp8_vt_in_kernel(64, 1024, 64, 8) && !fa_hopper_fp8_vt_in_kernel(64, 1, 1, 0),
             "fp8: V transposed in the kernel at bucket 128 always, at 64 up to 4096 query rows per kv head and "
             "sequence, never at 256");
    /* the slot order is a permutation of each group of 32 keys, and the two functions invert each other */
    int seen[64] = {0};
    for (int key = 0; key < 64; key++) {
        const int slot = fa_hopper_fp8_vt_slot(key);
        FA_CHECK(slot / 32 == key / 32 && fa_hopper_fp8_vt_key(slot) == key, "key %d: slot %d, back %d", key, slot,
                 fa_hopper_fp8_vt_key(slot));
        seen[slot & 63]++;
    }
    int perm = 1;
    for (int i = 0; i < 64; i++) perm &= seen[i] == 1;
    FA_CHECK(perm, "every slot taken once");
    /* lane quad position q holds keys 8j + 2q + {0, 1}: its register for columns j = 0, 1 is slots 4q .. 4q + 3 */
    for (int q = 0; q < 4; q++)
        FA_CHECK(fa_hopper_fp8_vt_key(4 * q) == 2 * q && fa_hopper_fp8_vt_key(4 * q + 1) == 2 * q + 1 &&
                     fa_hopper_fp8_vt_key(4 * q + 2) == 8 + 2 * q && fa_hopper_fp8_vt_key(4 * q + 3) == 9 + 2 * q &&
                     fa_hopper_fp8_vt_key(16 + 4 * q) == 16 + 2 * q,
                 "quad position %d: the accumulator's keys at the A fragment's slots", q);
    FA_CHECK(fa_hopper_fp8_vt_rows(128, 0, 3, 200, 0) == 3 * 256 && fa_hopper_fp8_vt_rows(256, 0, 2, 256, 0) == 512 &&
                 fa_hopper_fp8_vt_rows(128, 1, 3, 0, 1000) == (1000 + 3 * 127 + 15) / 16 * 16,
             "Vt rows: whole tiles per sequence, varlen's bound");
    FA_CHECK(fa_hopper_fp8_workspace_bytes(128, 0, 0, 2, 4, 128, 100, 0) == (size_t)4 * 128 * 256 &&
                 fa_hopper_fp8_workspace_bytes(128, 0, 1, 2, 1, 64, 100, 300) ==
                     (size_t)64 * ((300 + 2 * 127 + 15) / 16 * 16) + 12 &&
                 fa_hopper_fp8_workspace_bytes(128, 1, 0, 2, 4, 128, 100, 0) == 0 &&
                 fa_hopper_fp8_workspace_bytes(64, 1, 1, 2, 1, 64, 100, 300) == 0,
             "fp8 workspace: Vt, then the varlen starts; none where V is transposed in the kernel");
    FA_CHECK(fa_hopper_persistent(128, 0, 0) && !fa_hopper_persistent(256, 0, 0) && fa_hopper_persistent(256, 0, 1) &&
                 fa_hopper_dynamic(128, 1) && fa_hopper_dynamic(192, 1) && fa_hopper_dynamic(256, 1) &&
                 !fa_hopper_dynamic(512, 1) && !fa_hopper_dynamic(256, 0),
             "grid: 16-bit d256 even tiles one CTA per tile, fp8 (always O's own buffer) persistent; causal-like "
             "tiles dynamic up to bucket 256");
    FA_CHECK(fa_hopper_fp8_unsupported(9, 0, 128, 128, 0, 0.1f, 0, 0, 0) == NULL &&
                 fa_hopper_fp8_unsupported(8, 0, 128, 128, 0, 0.1f, 0, 0, 0) != NULL &&
                 fa_hopper_fp8_unsupported(9, 0, 128, 128, 1, 0.1f, 0, 0, 0) != NULL &&
                 fa_hopper_fp8_unsupported(9, 0, 128, 128, 0, -0.1f, 0, 0, 0) != NULL &&
                 fa_hopper_fp8_unsupported(9, 0, 128, 128, 0, 0.1f, 1, 0, 0) != NULL &&
                 fa_hopper_fp8_unsupported(9, 0, 128, 128, 0, 0.1f, 0, 1, 0) != NULL &&
                 fa_hopper_fp8_unsupported(9, 0, 128, 128, 0, 0.1f, 0, 0, 1) != NULL,
             "fp8: sm_90 only; no ALiBi, negative scale, dropout, score modifications, paged K/V");
}

/* The tiled dQ accumulator: each sequence's tiles lie inside the per-head count and never
 * meet the next sequence's, for every combination of three lengths in 0..300 at a step that
 * crosses each tile boundary (exhaustive, so no seed). */
FA_TEST(tiles_hopper_backward_dq_tiles) {
    FA_CHECK(fa_hopper_bwd_dq_tile_cols(64, 0) == 64 && fa_hopper_bwd_dq_tile_cols(128, 0) == 128 &&
                 fa_hopper_bwd_dq_tile_cols(256, 0) == 0 && fa_hopper_bwd_dq_tile_cols(256, 1) == 192,
             "tiled dQ at kernel buckets 64 and 128 and for the 192 / 128 kernel, rows at 256");
    FA_CHECK(fa_hopper_bwd_kernel_bucket(64, 1) == 128 && fa_hopper_bwd_kernel_bucket(64, 0) == 64 &&
                 fa_hopper_bwd_kernel_bucket(128, 1) == 128 && fa_hopper_bwd_kernel_bucket(256, 0) == 256,
             "the MODS kernels run bucket 64 at 128");
    FA_CHECK(fa_hopper_bwd_dq_piece_row0(128, 1) == 64 && fa_hopper_bwd_dq_piece_col0(128, 64, 1) == 0 &&
                 fa_hopper_bwd_dq_piece_row0(64, 1) == 0 && fa_hopper_bwd_dq_piece_col0(64, 128, 1) == 64 &&
                 fa_hopper_bwd_dq_piece_row0(64, 0) == 0 && fa_hopper_bwd_dq_piece_col0(128, 64, 0) == 0,
             "pieces: rows 64c.. of a 128-row tile, columns 64c.. of a 64-row one");
    FA_CHECK(fa_hopper_bwd_dq_piece_row0(80, 1) == 0 && fa_hopper_bwd_dq_piece_col0(80, 128, 1) == 64 &&
                 fa_hopper_bwd_dq_transposed(80) && !fa_hopper_bwd_dq_transposed(64) &&
                 !fa_hopper_bwd_dq_transposed(128) && fa_hopper_bwd_dq_piece_elems(80, 128) == 64 * 80 &&
                 fa_hopper_bwd_dq_piece_elems(64, 128) == 4096 && fa_hopper_bwd_dq_piece_elems(128, 64) == 4096,
             "80-row tiles: two transposed pieces of 64 columns x 80 rows");
    FA_CHECK(fa_hopper_bwd_dq_piece_row0(64, 1) == 0 && fa_hopper_bwd_dq_piece_col0(64, 192, 1) == 96 &&
                 fa_hopper_bwd_dq_piece_elems(64, 192) == 64 * 96 && !fa_hopper_bwd_dq_transposed(64),
             "192 / 128: two pieces of 64 rows x 96 columns");
    static const int lens[] = {0, 1, 63, 64, 65, 79, 80, 81, 127, 128, 129, 191, 255, 256, 257, 300};
    const int nl = (int)(sizeof lens / sizeof lens[0]);
    static const int block_ms[] = {64, 80, 128};
    for (int bi = 0; bi < 3; bi++) {
        const int bm = block_ms[bi];
        for (int a = 0; a < nl; a++)
            for (int b = 0; b < nl; b++)
                for (int c = 0; c < nl; c++) {
                    const long long len[3] = {lens[a], lens[b], lens[c]};
                    const long long total = len[0] + len[1] + len[2];
                    const long long tiles = fa_hopper_bwd_dq_tiles(total, 3, bm);
                    long long start = 0, prev_end = 0;
                    for (int s = 0; s < 3; s++) {
                        const long long t0 = fa_hopper_bwd_dq_tile0(start, s, bm), used = (len[s] + bm - 1) / bm;
                        FA_CHECK(t0 >= prev_end && t0 + used <= tiles,
                                 "block_m %d, lengths %lld %lld %lld: sequence %d's tiles [%lld, %lld) after %lld, within %lld",
                                 bm, len[0], len[1], len[2], s, t0, t0 + used, prev_end, tiles);
                        prev_end = t0 + used;
                        start += len[s];
                    }
                }
    }
    /* 16k tokens, 16 heads: 32 KiB tiles, one padding tile per sequence */
    FA_CHECK(fa_hopper_bwd_dq_elems(128, 64, 16384, 8, 16, 128) == 16LL * (16384 / 64 + 8) * 64 * 128 &&
                 fa_hopper_bwd_dq_elems(128, 80, 16384, 8, 16, 128) == 16LL * (16384 / 80 + 8) * 80 * 128 &&
                 fa_hopper_bwd_dq_elems(64, 128, 16384, 8, 16, 64) == 16LL * (16384 / 128 + 8) * 128 * 64 &&
                 fa_hopper_bwd_dq_elems(192, 64, 16384, 8, 16, 160) == 16LL * (16384 / 64 + 8) * 64 * 192 &&
                 fa_hopper_bwd_dq_elems(0, 64, 16384, 8, 16, 200) == 16LL * 16384 * 200,
             "dQ accumulator sizes: tiled at 64 and 128 (64 or 80 rows) and 192 / 128, rows at 256");
}

FA_TEST(tiles_hopper_backward) {
    static const int buckets[] = {64, 128, 256, 512};
    for (int i = 0; i < 4; i++) {
        int b = buckets[i];
        size_t smem = fa_hopper_bwd_smem_bytes(b, 0);
        FA_CHECK(smem <= SMEM_SM90, "bucket %d: %zu bytes of smem > sm_90's %d", b, smem, SMEM_SM90);
        int m = fa_hopper_bwd_block_m(b, 0), n = fa_hopper_bwd_block_n(b);
        FA_CHECK(fa_hopper_bwd_block_m(b, 1) == (b == 128 ? 80 : m), "bucket %d: 80 rows at bucket 128 only", b);
        FA_CHECK(fa_hopper_bwd_stages(b) >= 2, "bucket %d: Q/dO ring of at least 2 stages", b);
        if (b <= 128) {
            FA_CHECK(n == 128, "bucket %d: two consumer warpgroups of 64 keys", b);
            FA_CHECK(m % 64 == 0 && (m / 64) * (b / 64) == 2, "bucket %d: one m64 x n64 dQ piece per consumer", b);
            /* consumer accumulators: Sᵀ and dPᵀ (m/2 fp32 each) + dK and dV (b/2 each) per thread */
            FA_CHECK(m + b <= 192, "bucket %d: accumulators %d registers leave room in 240", b, m + b);
            FA_CHECK(fa_hopper_bwd_score_tiles(b) == 1 && fa_hopper_bwd_do_stages(b) == fa_hopper_bwd_stages(b) &&
                         fa_hopper_bwd_barriers(b) == 1 + 2 * fa_hopper_bwd_stages(b),
                     "bucket %d: one shared dS, one empty barrier per stage", b);
            /* block-mask position slots: 16 bytes per stage, 16-byte aligned after the odd count of
             * mbarriers (8 bytes each) */
            FA_CHECK(fa_hopper_bwd_pos_bytes(b) == 8 + 16 * (size_t)fa_hopper_bwd_stages(b),
                     "bucket %d: %zu bytes of position slots", b, fa_hopper_bwd_pos_bytes(b));
        } else {
            /* both consumers on the same 64 keys, each with half the queries of Sᵀ and dPᵀ and 128
             * columns of dK, dV and dQ */
            const int cols = fa_hopper_bwd_cta_cols(b);
            FA_CHECK(n == 64 && m == 64, "bucket %d: 64 keys x 64 queries", b);
            /* dK, dV and the dQ piece of 128 columns (64 each) in flight together */
            FA_CHECK(3 * (cols / 4) <= 200, "bucket %d: accumulators %d registers leave room in 240", b, 3 * (cols / 4));
            FA_CHECK(fa_hopper_bwd_score_tiles(b) == 2 && fa_hopper_bwd_do_stages(b) == 1,
                     "bucket %d: P and dS tiles, one dO buffer", b);
            FA_CHECK(fa_hopper_bwd_dq_staging_bytes(b, 0) == 8 * 2 * 16 * 32 * 4,
                     "bucket %d: two [16, 32] fp32 buffers per consumer warp", b);
            const int pair = b == 512;
            FA_CHECK(fa_hopper_bwd_cluster_ctas(b) == 1 + pair && fa_hopper_bwd_cta_cols(b) == 256 &&
                         fa_hopper_bwd_dq_pieces(b) == 2 + 2 * pair,
                     "bucket %d: %d CTA(s) of 256 columns per key block, a dQ piece per consumer and CTA", b, 1 + pair);
            /* empty barriers per consumer; at 512 also the exchange's full and free per consumer */
            FA_CHECK(fa_hopper_bwd_score_buffers(b) == 2 - pair &&
                         fa_hopper_bwd_exchange_bytes(b) == (pair ? 2 * 128 * 16 * 4 : 0) &&
                         fa_hopper_bwd_barriers(b) == 1 + 3 * fa_hopper_bwd_stages(b) + 3 + 4 * pair,
                     "bucket %d: score buffers, the pair's exchange (16 fp32 per consumer thread), barriers", b);
            /* bucket 512: the second score buffer's 16 KiB hold the exchange, + 4 mbarriers */
            FA_CHECK(smem == (pair ? 231504 + 32 : 231504) && fa_hopper_bwd_pos_bytes(b) == 0,
                     "bucket %d: %zu bytes of smem (kernel layout: 231504, + 32 at 512), no position slots", b, smem);
        }
    }
    FA_CHECK(fa_hopper_bwd_bucket(512, 512) == 512 && fa_hopper_bwd_bucket(264, 264) == 512 &&
                 fa_hopper_bwd_bucket(128, 512) == 512 && fa_hopper_bwd_bucket(576, 512) == 0 &&
                 fa_hopper_bwd_semaphores(512, 0, 2, 3, 100) == 2 * 3 * 2 * 4 &&
                 fa_hopper_bwd_semaphores(256, 0, 2, 3, 100) == 2 * 3 * 2 * 2,
             "backward bucket 512: d and dv in 264..512, four dQ turns per query block; 576 portable");
    FA_CHECK(fa_hopper_bwd_smem_bytes(64, 0) == 199720 + 40 && fa_hopper_bwd_smem_bytes(128, 0) == 198696 + 40,
             "buckets 64 and 128: smem as the kernel lays it out, position slots included (%zu, %zu)",
             fa_hopper_bwd_smem_bytes(64, 0), fa_hopper_bwd_smem_bytes(128, 0));
    /* fp8 (e4m3 dout): bucket 128's layout up to the position slots, then e4m3 Q and dO stages from
     * the next 1024-byte boundary: the opt-in limit exactly */
    FA_CHECK(fa_hopper_bwd_fp8_smem_bytes() == 198656 + 2 * 2 * 64 * 128 + 1024 &&
                 fa_hopper_bwd_fp8_smem_bytes() <= SMEM_SM90,
             "fp8 backward: %zu bytes of smem", fa_hopper_bwd_fp8_smem_bytes());
    FA_CHECK(fa_hopper_bwd_fp8_ok(128, 128, 0, 0, 0, 0) && fa_hopper_bwd_fp8_ok(96, 72, 0, 0, 0, 0) &&
                 fa_hopper_bwd_fp8_ok(64, 128, 0, 0, 0, 0) && !fa_hopper_bwd_fp8_ok(64, 64, 0, 0, 0, 0) &&
                 !fa_hopper_bwd_fp8_ok(256, 256, 0, 0, 0, 0) && !fa_hopper_bwd_fp8_ok(128, 128, 1, 0, 0, 0) &&
                 !fa_hopper_bwd_fp8_ok(128, 128, 0, 1, 0, 0) && !fa_hopper_bwd_fp8_ok(128, 128, 0, 0, 1, 0) &&
                 !fa_hopper_bwd_fp8_ok(128, 128, 0, 0, 0, 1),
             "fp8 backward kernel: bucket 128's plain path only");
    /* its e4m3 maps: strides in bytes, multiples of 16 (d = 72 rows: 72 bytes, not mappable) */
    FA_CHECK(fa_hopper_tma_tensor_ok(256, 1, 128, 16 * 128, 0, 100, 16, 1) &&
                 !fa_hopper_tma_tensor_ok(256, 1, 72, 72 * 4, 0, 100, 4, 1) &&
                 fa_hopper_tma_tensor_ok(256, 1, 72, 0, 0, 1, 1, 1) && !fa_hopper_tma_tensor_ok(264, 1, 128, 0, 0, 100, 1, 1) &&
                 fa_hopper_tma_map_ok(256, 72, 72 * 4, 0, 100, 4, 1),
             "8-bit TMA maps: byte strides multiples of 16 (a 16-bit tensor's 72-element rows are 144 bytes)");
    /* 80 rows: K, V 64 KiB; Q, dO 2 x 2 x 20 KiB; dS 2 x 20 KiB; dQ staging 40 KiB; LSE2 / D 1280 B */
    FA_CHECK(fa_hopper_bwd_smem_bytes(128, 1) == 65536 + 81920 + 40960 + 40960 + 1280 + 40 + 40 + 1024 &&
                 fa_hopper_bwd_smem_bytes(128, 1) <= SMEM_SM90 &&
                 fa_hopper_bwd_dq_staging_bytes(128, 1) == 80 * 128 * 4,
             "bucket 128, 80 rows: %zu bytes of smem", fa_hopper_bwd_smem_bytes(128, 1));
    /* 80 rows: bucket 128 without softcap, LOG2, dropout or score modifications */
    FA_CHECK(fa_hopper_bwd_rows80(128, -1, -1, 100, 0, 0, 0, 0) &&
                 !fa_hopper_bwd_rows80(64, -1, -1, 100, 0, 0, 0, 0) &&
                 !fa_hopper_bwd_rows80(256, -1, -1, 100, 0, 0, 0, 0) &&
                 !fa_hopper_bwd_rows80(128, -1, -1, 100, 1, 0, 0, 0) &&
                 !fa_hopper_bwd_rows80(128, -1, -1, 100, 0, 1, 0, 0) &&
                 !fa_hopper_bwd_rows80(128, -1, -1, 100, 0, 0, 1, 0) &&
                 !fa_hopper_bwd_rows80(128, -1, -1, 100, 0, 0, 0, 1),
             "80-row query blocks: bucket 128 without softcap, LOG2, dropout or score modifications");
    /* causal (right side 0) from 8,192 query rows per sequence on average; a left window never */
    FA_CHECK(fa_hopper_bwd_rows80(128, -1, 0, 8192, 0, 0, 0, 0) &&
                 !fa_hopper_bwd_rows80(128, -1, 0, 8191, 0, 0, 0, 0) &&
                 fa_hopper_bwd_rows80(128, -1, 100, 16384, 0, 0, 0, 0) &&
                 !fa_hopper_bwd_rows80(128, 1000, -1, 16384, 0, 0, 0, 0) &&
                 !fa_hopper_bwd_rows80(128, 1000, 0, 16384, 0, 0, 0, 0),
             "80-row query blocks with masks: causal from 8k rows, no sliding window");
    /* the 192 / 128 kernel: bucket 256 with d <= 192, dv <= 128, plain path without dropout */
    FA_CHECK(fa_hopper_bwd_d192(192, 128, 0, 0, 0) && fa_hopper_bwd_d192(136, 64, 0, 0, 0) &&
                 fa_hopper_bwd_d192(184, 96, 0, 0, 0) && !fa_hopper_bwd_d192(128, 128, 0, 0, 0) &&
                 !fa_hopper_bwd_d192(200, 128, 0, 0, 0) && !fa_hopper_bwd_d192(192, 136, 0, 0, 0) &&
                 !fa_hopper_bwd_d192(192, 128, 1, 0, 0) && !fa_hopper_bwd_d192(192, 128, 0, 1, 0) &&
                 !fa_hopper_bwd_d192(192, 128, 0, 0, 1),
             "192 / 128 backward kernel: d in 136..192 with dv <= 128, plain path without dropout");
    FA_CHECK(fa_hopper_bwd_bucket(64, 64) == 64 && fa_hopper_bwd_bucket(96, 128) == 128 &&
                 fa_hopper_bwd_bucket(128, 72) == 128,
             "backward buckets 64 and 128");
    FA_CHECK(fa_hopper_bwd_bucket(256, 256) == 256 && fa_hopper_bwd_bucket(192, 192) == 256 &&
                 fa_hopper_bwd_bucket(136, 256) == 256,
             "backward bucket 256: d and dv in 136..256");
    FA_CHECK(fa_hopper_bwd_bucket(192, 128) == 256 && fa_hopper_bwd_bucket(136, 64) == 256 &&
                 fa_hopper_bwd_bucket(64, 128) == 128 &&
                 fa_hopper_bwd_bucket(128, 256) == 256,
             "backward, d and dv in different buckets: the larger one");
    FA_CHECK(fa_hopper_bwd_bucket(32, 32) == 0 && fa_hopper_bwd_bucket(584, 512) == 0 &&
                 fa_hopper_bwd_bucket(200, 196) == 0,
             "d < 64, d > 512 and d not a multiple of 8: portable");
    const float scale_log2 = 0.1275f; /* 1/sqrt(128) · log2(e) */
    FA_CHECK(fa_hopper_bwd_unsupported(9, 0, FA_DTYPE_BF16, 256, 256, 0, scale_log2, 0.0f) == NULL, "sm_90 bf16 d = 256");
    FA_CHECK(fa_hopper_bwd_unsupported(9, 0, FA_DTYPE_F16, 192, 192, 0, scale_log2, 0.0f) == NULL, "sm_90 f16 d = 192");
    FA_CHECK(fa_hopper_bwd_unsupported(9, 0, FA_DTYPE_BF16, 128, 128, 0, scale_log2, 0.0f) == NULL, "sm_90 bf16 d = 128");
    FA_CHECK(fa_hopper_bwd_unsupported(9, 0, FA_DTYPE_F16, 64, 64, 0, scale_log2, 0.0f) == NULL, "sm_90 f16 d = 64");
    FA_CHECK(fa_hopper_bwd_unsupported(8, 0, FA_DTYPE_BF16, 128, 128, 0, scale_log2, 0.0f) != NULL, "sm_80: portable");
    FA_CHECK(fa_hopper_bwd_unsupported(9, 0, FA_DTYPE_BF16, 128, 128, 1, scale_log2, 0.0f) == NULL, "ALiBi: Hopper");
    FA_CHECK(fa_hopper_bwd_unsupported(9, 0, FA_DTYPE_BF16, 256, 256, 1, -scale_log2, 0.0f) == NULL,
             "ALiBi, negative scale, d = 256: Hopper");
    FA_CHECK(fa_hopper_bwd_unsupported(9, 0, FA_DTYPE_BF16, 128, 128, 0, -scale_log2, 0.0f) == NULL,
             "negative scale: Hopper (the mask writes -inf into the exponent, after the scale)");
    FA_CHECK(fa_hopper_bwd_unsupported(9, 0, FA_DTYPE_BF16, 128, 128, 0, scale_log2, 30.0f) == NULL,
             "softcap, positive scale: Hopper (SOFTCAP)");
    FA_CHECK(fa_hopper_bwd_unsupported(9, 0, FA_DTYPE_BF16, 128, 128, 1, scale_log2, 30.0f) != NULL,
             "ALiBi with softcap: portable");
    FA_CHECK(fa_hopper_bwd_unsupported(9, 0, FA_DTYPE_BF16, 128, 128, 0, -scale_log2, 30.0f) != NULL,
             "negative scale with softcap: portable");
    /* deterministic mode: one int32 semaphore per (sequence, query head, query block, dQ piece) */
    FA_CHECK(fa_hopper_bwd_semaphores(128, 0, 2, 8, 1000) == 2 * 8 * 16 * 2 &&
                 fa_hopper_bwd_semaphores(128, 1, 2, 8, 1000) == 2 * 8 * 13 * 2 &&
                 fa_hopper_bwd_semaphores(64, 0, 2, 8, 1000) == 2 * 8 * 8 * 2 &&
                 fa_hopper_bwd_semaphores(256, 0, 1, 4, 64) == 4 * 1 * 2 && fa_hopper_bwd_semaphores(0, 0, 1, 1, 1) == 0,
             "dQ semaphores: batch x heads_q x ceil(seqlen_q / BLOCK_M) x 2");
    FA_CHECK(fa_hopper_tma_stride_ok(1024, 16) && fa_hopper_tma_stride_ok(3, 1) && !fa_hopper_tma_stride_ok(12, 2) &&
                 !fa_hopper_tma_stride_ok(0, 2) && !fa_hopper_tma_stride_ok(1ll << 39, 2),
             "TMA strides: positive multiples of 8 below 2^39, anything along an axis of extent 1");
    /* dK / dV [b = 2, sk = 1000, hkv = 4, d = 128] contiguous at a 256-byte aligned base */
    FA_CHECK(fa_hopper_tma_map_ok(0x10000, 512, 128, 512000, 1000, 4, 2) &&
                 !fa_hopper_tma_map_ok(0x10008, 512, 128, 512000, 1000, 4, 2) &&
                 !fa_hopper_tma_map_ok(0x10000, 516, 128, 516000, 1000, 4, 2) &&
                 fa_hopper_tma_map_ok(0x10000, 512, 128, 7, 1000, 4, 1),
             "a mappable tensor: 16-byte aligned base, TMA strides (a batch of one: any batch stride)");
    FA_CHECK(fa_hopper_bwd_dkdv_tma(1, 0x10000, 512, 128, 512000, 0x90000, 512, 128, 512000, 1000, 4, 2),
             "dK / dV by the TMA store: whole group, mappable");
    FA_CHECK(fa_hopper_bwd_dkdv_tma(1, 0x10000, 512, 128, 7, 0x90000, 512, 128, 7, 2000, 4, 1),
             "varlen (total_k rows, a batch of one): the TMA store too (whole 64-key slabs)");
    FA_CHECK(!fa_hopper_bwd_dkdv_tma(2, 0x10000, 512, 128, 512000, 0x90000, 512, 128, 512000, 1000, 4, 2),
             "a split GQA group writes fp32 partials");
    FA_CHECK(!fa_hopper_bwd_dkdv_tma(1, 0x10000, 512, 128, 512000, 0x90004, 512, 128, 512000, 1000, 4, 2) &&
                 !fa_hopper_bwd_dkdv_tma(1, 0x10000, 512, 128, 512000, 0x90000, 516, 128, 516000, 1000, 4, 2),
             "dV unaligned or with a row stride the TMA cannot step: st.global");
}

/* Rotated walks: each key block starts at its own query block (distinct offsets when n_m >= n_blocks),
 * and a tile's deterministic order is the order the walks reach it: ranks 0 .. n_blocks - 1, by
 * increasing step (m - offset) mod n_m, checked against that definition directly. */
FA_TEST(tiles_hopper_bwd_rotated_walks) {
    for (int n_blocks = 1; n_blocks <= 40; n_blocks++)
        for (int n_m = n_blocks; n_m <= 3 * n_blocks + 5; n_m++) {
            int bad = 0;
            for (int n = 0; n < n_blocks; n++) {
                const int o = fa_hopper_bwd_walk_offset(n, n_blocks, n_m);
                if (o < 0 || o >= n_m || (n > 0 && o <= fa_hopper_bwd_walk_offset(n - 1, n_blocks, n_m))) bad++;
            }
            for (int m = 0; m < n_m && !bad; m++) {
                unsigned long long seen = 0;
                for (int n = 0; n < n_blocks; n++) {
                    const int step = (m - fa_hopper_bwd_walk_offset(n, n_blocks, n_m) + n_m) % n_m;
                    int rank = 0;
                    for (int n2 = 0; n2 < n_blocks; n2++)
                        rank += (m - fa_hopper_bwd_walk_offset(n2, n_blocks, n_m) + n_m) % n_m < step;
                    const int got = fa_hopper_bwd_rotated_rank(n, n_blocks, n_m, m);
                    if (got != rank || got < 0 || got >= n_blocks || (seen >> got) & 1) bad++;
                    if (got >= 0 && got < 64) seen |= 1ull << got;
                }
            }
            FA_CHECK(bad == 0, "n_blocks %d, n_m %d: %d offsets or ranks wrong", n_blocks, n_m, bad);
        }
    FA_CHECK(fa_hopper_bwd_rotate(-1, -1, 0, 1, 132, 132, 0) && fa_hopper_bwd_rotate(-1, -1, 0, 1, 2, 132, 0),
             "deterministic, non-causal without a window, key blocks fit the multiprocessors: rotated");
    FA_CHECK(!fa_hopper_bwd_rotate(-1, -1, 0, 0, 16, 132, 0) && !fa_hopper_bwd_rotate(-1, 0, 0, 1, 16, 132, 0) &&
                 !fa_hopper_bwd_rotate(128, -1, 0, 1, 16, 132, 0) && !fa_hopper_bwd_rotate(-1, -1, 1, 1, 16, 132, 0) &&
                 !fa_hopper_bwd_rotate(-1, -1, 0, 1, 133, 132, 0) && !fa_hopper_bwd_rotate(-1, -1, 0, 1, 16, 132, 1),
             "not deterministic, causal or a window, score mods, more key blocks than multiprocessors, or "
             "disabled: not rotated");
}

FA_TEST(tiles_hopper_bwd_group_splits) {
    /* 132 multiprocessors (H200); window sides -1 = unbounded, causal = (-1, 0) */
    const int sms = 132;
    FA_CHECK(fa_hopper_bwd_group_splits(128, 1, 8, 8, 16384, 16384, -1, 0, sms, 0) == 2,
             "GQA 64/8 causal 16k: the longest CTA (8 heads x 256 blocks) is 1/4 of a multiprocessor's share -> 2");
    FA_CHECK(fa_hopper_bwd_group_splits(128, 1, 8, 8, 16384, 16384, -1, -1, sms, 0) == 1,
             "GQA 64/8 non-causal 16k: equal CTAs, 1024 of them -> no split");
    FA_CHECK(fa_hopper_bwd_group_splits(128, 16, 16, 1, 1024, 1024, -1, 0, sms, 0) == 1, "MHA: nothing to split");
    FA_CHECK(fa_hopper_bwd_group_splits(256, 1, 8, 8, 16384, 16384, -1, 0, sms, 0) == 1, "bucket 256 never splits");
    FA_CHECK(fa_hopper_bwd_group_splits(64, 1, 1, 16, 2048, 2048, -1, -1, sms, 0) == 8,
             "MQA 16/1, 2k keys: 16 CTAs -> the most splits allowed (group / 2)");
    FA_CHECK(fa_hopper_bwd_group_splits(128, 1, 2, 2, 4096, 4096, -1, 0, sms, 0) == 1,
             "group 2: at most group / 2 = 1 split (partials within FlashAttention-2's memory)");
    FA_CHECK(fa_hopper_bwd_group_splits(128, 2, 2, 8, 512, 512, -1, -1, sms, 0) == 4,
             "16 CTAs of 8 heads -> 4 splits of 2 heads");
    FA_CHECK(fa_hopper_bwd_group_splits(128, 1, 8, 8, 16384, 16384, -1, 0, sms, 3) == 2 &&
                 fa_hopper_bwd_group_splits(128, 1, 8, 8, 16384, 16384, -1, 0, sms, 4) == 4 &&
                 fa_hopper_bwd_group_splits(128, 1, 8, 8, 16384, 16384, -1, 0, sms, 99) == 8,
             "forced: the largest divisor of the group up to the request");
    FA_CHECK(fa_hopper_bwd_group_splits(128, 4, 8, 8, 4096, 4096, -1, 0, sms, 0) == 2,
             "GQA 64/8 causal b4 4k: long enough, tail share 1/4 -> 2");
    FA_CHECK(fa_hopper_bwd_group_splits(128, 8, 8, 4, 2048, 2048, -1, 0, sms, 0) == 1,
             "GQA 32/8 causal b8 2k: short kernel, the partials would cost more than the tail");
    FA_CHECK(fa_hopper_bwd_group_splits(64, 2, 2, 16, 4096, 4096, -1, -1, sms, 0) == 1,
             "GQA 32/2 b2 4k: 128 equal CTAs, about one per multiprocessor -> no split");
    FA_CHECK(fa_hopper_bwd_group_splits(64, 1, 1, 6, 1024, 1024, -1, -1, sms, 0) == 3,
             "group 6, 8 CTAs: the largest divisor up to group / 2");
    for (int group = 2; group <= 16; ++group)
        for (int b = 1; b <= 4; b *= 2)
            for (int sk = 100; sk <= 9000; sk += 2231) {
                const int s = fa_hopper_bwd_group_splits(64, b, 3, group, sk, sk, -1, 0, sms, 0);
                FA_CHECK(s >= 1 && group % s == 0 && (s == 1 || 2 * s <= group),
                         "group %d b %d sk %d: %d splits, a divisor of the group, at most group / 2", group, b, sk, s);
            }
}

FA_TEST(tiles_kvcache_decode) {
    static const int buckets[] = {64, 128, 256};
    /* sm_90: 228 KiB per SM; the decode kernels' launch bounds promise 3 / 2 / 1 blocks */
    static const int blocks_sm90[] = {3, 2, 1};
    const size_t sm90_per_sm = 233472;
    for (int i = 0; i < 3; i++) {
        const int b = buckets[i];
        FA_CHECK(fa_kv_smem_bytes(b) <= SMEM_SM80 && fa_kvq_smem_bytes(b) <= SMEM_SM80,
                 "bucket %d: %zu / %zu bytes of smem > sm_80's %d", b, fa_kv_smem_bytes(b), fa_kvq_smem_bytes(b),
                 SMEM_SM80);
        FA_CHECK(fa_kv_blocks_per_sm(fa_kvq_smem_bytes(b), sm90_per_sm) >= blocks_sm90[i] &&
                     fa_kv_blocks_per_sm(fa_kv_smem_bytes(b), sm90_per_sm) >= blocks_sm90[i],
                 "bucket %d: fewer than %d blocks per sm_90 SM", b, blocks_sm90[i]);
        /* a raw row holds the largest quantised row of the bucket (Q8_0: d / 32 blocks of 34 bytes) */
        FA_CHECK(fa_kvq_row_pitch(b) % 16 == 0 && fa_kvq_row_pitch(b) >= b / 32 * 34 && fa_kvq_row_pitch(b) >= b,
                 "bucket %d: raw row pitch %d", b, fa_kvq_row_pitch(b));
        /* half the bytes per stage: the quantised pipeline keeps at least as many tiles in flight */
        FA_CHECK(fa_kvq_stages(b) >= fa_kv_stages(b) && fa_kvq_stages(b) >= 2, "bucket %d: %d raw stages", b,
                 fa_kvq_stages(b));
    }
    FA_CHECK(fa_kv_blocks_per_sm(200000, 233472) == 1 && fa_kv_blocks_per_sm(1000, 233472) == 8,
             "blocks per SM: at least 1, at most 8");
    /* the int8 / e4m3 register kernel: its launch bounds promise exactly the blocks its shared
     * memory allows on sm_90 and sm_80 (the split heuristic counts the same workers), and those
     * keep at least 35 KB of cache bytes in flight per SM (HBM bandwidth × loaded latency) */
    const size_t sm80_per_sm = 167936;
    for (int i = 0; i < 3; i++) {
        const int b = buckets[i];
        const size_t smem = fa_kvq_regs_smem_bytes(b);
        FA_CHECK(smem <= SMEM_SM80, "bucket %d: register kernel %zu bytes of smem > sm_80's %d", b, smem, SMEM_SM80);
        FA_CHECK(fa_kv_blocks_per_sm(smem, sm90_per_sm) == fa_kvq_regs_min_blocks(b, 1) &&
                     fa_kv_blocks_per_sm(smem, sm80_per_sm) == fa_kvq_regs_min_blocks(b, 0),
                 "bucket %d: register kernel %d / %d blocks per SM (sm_90 / sm_80), launch bounds %d / %d", b,
                 fa_kv_blocks_per_sm(smem, sm90_per_sm), fa_kv_blocks_per_sm(smem, sm80_per_sm),
                 fa_kvq_regs_min_blocks(b, 1), fa_kvq_regs_min_blocks(b, 0));
        const size_t in_flight = (size_t)(fa_kvq_regs_stages(b) - 1) * 2 * FA_KV_BLOCK_N * (size_t)b *
                                 (size_t)fa_kvq_regs_min_blocks(b, 1);
        FA_CHECK(fa_kvq_regs_stages(b) >= 2 && in_flight >= 35 * 1024,
                 "bucket %d: %zu cache bytes in flight per sm_90 SM", b, in_flight);
        FA_CHECK(fa_kvq_regs_stage_bytes(b) == (size_t)(2 * FA_KV_BLOCK_N * b + (8 + FA_KVQ_ROW_BYTES) * FA_KV_BLOCK_N),
                 "bucket %d: a register-kernel stage holds 8-bit K and V rows, their scales and row addresses", b);
    }
}

/* The large-head decode kernel (kvcache_large_sm80.cuh): which head dims it takes, how dv splits
 * between the two warps of a row group, and that its blocks fit: a latent cache on sm_80, separate
 * K and V caches on sm_90, each with room for the fused merge's weights and one split's o. */
FA_TEST(tiles_kvcache_large_heads) {
    FA_CHECK(!fa_kvl_wanted(256, 256) && !fa_kvl_wanted(8, 256) && fa_kvl_wanted(264, 8) && fa_kvl_wanted(128, 264) &&
                 fa_kvl_wanted(576, 512),
             "the large-head kernel exactly when max(d, dv) > 256");
    for (int d = 1; d <= 600; d++)
        for (int dv = 1; dv <= 600; dv += 7) {
            const int ok = d % 8 == 0 && dv % 8 == 0 && d <= 576 && dv <= 512;
            FA_CHECK(fa_kvl_dims_ok(d, dv) == ok, "d %d dv %d: dims_ok %d, want %d", d, dv, fa_kvl_dims_ok(d, dv), ok);
        }
    for (int dv = 8; dv <= FA_KVL_MAX_DV; dv += 8) {
        const int split = fa_kvl_dv_split(dv), rest = dv - split;
        /* whole 16-column pairs, at most 256 columns (32 n8 tiles) per warp, the first half the larger,
         * and no more than one pair apart */
        FA_CHECK(split % 16 == 0 && split <= 256 && split >= rest && split - rest <= 16 + 8,
                 "dv %d: split %d / %d", dv, split, rest);
    }
    FA_CHECK(fa_kvl_dv_split(512) == 256 && fa_kvl_dv_split(320) == 160 && fa_kvl_dv_split(264) == 144 &&
                 fa_kvl_dv_split(8) == 16,
             "dv split of 512, 320, 264, 8");
    FA_CHECK(fa_kvl_stage_bytes(1) == (size_t)2 * 32 * 576 && fa_kvl_stage_bytes(0) == (size_t)2 * 32 * (576 + 512),
             "a stage: 32 rows of K (and of V)");
    FA_CHECK(fa_kvl_exchange_bytes() == (size_t)8 * 16 * 32 * 4, "each warp's 16 × 32 fp32 partial scores");
    FA_CHECK(fa_kvl_smem_bytes(1) == 163840 && fa_kvl_smem_bytes(1) + 128 <= SMEM_SM80,
             "latent cache: %zu bytes of smem (and 128 static) fit sm_80's %d", fa_kvl_smem_bytes(1), SMEM_SM80);
    FA_CHECK(fa_kvl_smem_bytes(0) == 229376 && fa_kvl_smem_bytes(0) > SMEM_SM80 &&
                 fa_kvl_smem_bytes(0) + 128 <= SMEM_SM90,
             "separate caches: %zu bytes of smem fit sm_90's %d (not sm_80's)", fa_kvl_smem_bytes(0), SMEM_SM90);
    for (int v_in_k = 0; v_in_k < 2; v_in_k++) {
        /* fa_kv_merge_splits: weights [64][splits] fp32, the row inverses, one split's o [64][512] fp32 */
        const size_t merge = (size_t)4 * FA_KVL_BLOCK_M * (FA_KVL_MAX_SPLITS + 1) + 16 +
                             (size_t)4 * FA_KVL_BLOCK_M * FA_KVL_MAX_DV;
        FA_CHECK(merge <= fa_kvl_smem_bytes(v_in_k), "v_in_k %d: the fused merge needs %zu bytes", v_in_k, merge);
        FA_CHECK(fa_kv_blocks_per_sm(fa_kvl_smem_bytes(v_in_k), 233472) == 1, "one block per sm_90 SM");
    }
    /* the wgmma variant: sm_90 with dv = 512 and no rotary; 1024 more bytes (the slabs' 1024-byte
     * alignment), and with the kernel's 1152 static bytes (the fused merge's) both cache kinds fit */
    FA_CHECK(fa_kvl_wgmma_ok(9, 0, 576, 512, 0) && fa_kvl_wgmma_ok(9, 0, 512, 512, 0) && fa_kvl_wgmma_ok(9, 0, 8, 512, 0) &&
                 !fa_kvl_wgmma_ok(9, 0, 576, 512, 1) && !fa_kvl_wgmma_ok(8, 0, 576, 512, 0) &&
                 !fa_kvl_wgmma_ok(8, 9, 576, 512, 0) && !fa_kvl_wgmma_ok(10, 0, 576, 512, 0) &&
                 !fa_kvl_wgmma_ok(9, 0, 576, 504, 0) && !fa_kvl_wgmma_ok(9, 0, 584, 512, 0) &&
                 !fa_kvl_wgmma_ok(9, 0, 572, 512, 0) && !fa_kvl_wgmma_ok(9, 0, 320, 320, 0),
             "wgmma variant: sm_90, dv 512, d a multiple of 8 up to 576, no rotary");
    for (int v_in_k = 0; v_in_k < 2; v_in_k++)
        FA_CHECK(fa_kvl_wgmma_smem_bytes(v_in_k) == fa_kvl_smem_bytes(v_in_k) + 1024 &&
                     fa_kvl_wgmma_smem_bytes(v_in_k) + 1152 <= SMEM_SM90,
                 "v_in_k %d: the wgmma variant's %zu bytes fit sm_90's %d", v_in_k, fa_kvl_wgmma_smem_bytes(v_in_k),
                 SMEM_SM90);
    /* the latent-cache wgmma kernel: factors, alignment, Q, two 64-slot stages, P; with its static
     * bytes inside sm_90's opt-in, and room for the fused merge */
    FA_CHECK(fa_kvl_latent_smem_bytes() == (size_t)4736 + 1024 + 73728 + 2 * 73728 &&
                 fa_kvl_latent_header_bytes() == 128 + 64 * 8 + 128 * 32 && 13 * 8 <= FA_KVL_LATENT_BARRIER_BYTES &&
                 fa_kvl_latent_smem_bytes() + 1152 <= SMEM_SM90 &&
                 fa_kvl_smem_bytes(1) <= fa_kvl_latent_smem_bytes() - fa_kvl_latent_header_bytes() - 1024 &&
                 FA_KVL_LATENT_BLOCK_N % 16 == 0 && FA_KVL_LATENT_BLOCK_N % (128 / 8) == 0,
             "latent wgmma kernel: %zu bytes", fa_kvl_latent_smem_bytes());
    FA_CHECK(FA_KVL_MAX_SPLITS >= 32 && FA_KVL_MAX_SPLITS % 32 == 0, "split cap: whole 32-flag words of the fused merge");
    FA_CHECK(FA_KVL_BLOCK_M == 16 * FA_KVL_WARPS / 2 && FA_KVL_BLOCK_N == 32 && FA_KVL_STAGES == 2,
             "4 row groups of 16 rows × 2 warps; 32-slot tiles, two stages");
}
