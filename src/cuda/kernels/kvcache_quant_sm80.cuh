/*
 * kvcache_quant_sm80.cuh: the CUDA KV-cache decode kernel on a quantised cache (fa_kv_dtype:
 * int8 with an fp32 scale per token and kv head, llama.cpp Q8_0 blocks, fp8 e4m3 with an fp32
 * scale per kv head), mma.sync tensor cores (sm_80+). Included by
 * instances/kvcache_quant_sm80_hdim<D>.cu. A kernel of its own next to fa_kv_kernel
 * (kvcache_sm80.cuh), whose steps it reuses unchanged: geometry (1), Q (2), the scores, softmax
 * and P·V of a tile (3), the warp merge and output (4), the fused split merge (6). What differs:
 *
 *   - the key tiles: each tile's cache rows are copied by cp.async as raw bytes (d bytes for
 *     int8 / e4m3, d / 32 blocks of 34 bytes for Q8_0, in copies of kv_copy_bytes = 16, 8 or 4
 *     bytes) into a STAGES-deep pipeline of raw stages, with the int8 rows' scales; the landed
 *     tile is dequantised (x = scale · q in fp32, rounded once to the 16-bit compute type) into
 *     one K and one V tile in the layout and swizzle the mma loads of fa_kv_kernel read, then a
 *     barrier, then the unchanged tile compute. Half (e4m3, int8) or 0.53 (Q8_0) of the
 *     unquantised traffic; the cost is one more barrier and the conversion per tile;
 *   - the rows' (slab, row) pairs: computed one tile ahead by threads 0..63 (a paged cache's
 *     block-table read is issued right after a tile's copies and stored to shared memory after
 *     its compute, so it never stalls the copies) and read from shared memory by the copies;
 *   - the append: fa_kvq_append (kvcache_quant.cu) has quantised k_new / v_new into the cache
 *     before this kernel, on the same stream, so every slot, appended ones included, comes from
 *     the cache (the attention sees the quantised appended keys, as on the CPU); no step 5 here,
 *     no rotary (refused with a quantised cache).
 *
 * Shared memory: q_smem [BLOCK_M, D] 16-bit | k_conv [BLOCK_N, D], v_conv [BLOCK_N, D] 16-bit
 * swizzled | raw stage s < STAGES: K rows [BLOCK_N][RAW_PITCH], V rows, K scales [BLOCK_N] fp32,
 * V scales, (slab, row) [BLOCK_N] int32 pairs. The epilogue reuses everything after q_smem.
 */
#ifndef FA_KVCACHE_QUANT_KERNEL_CUH
#define FA_KVCACHE_QUANT_KERNEL_CUH

#include "cuda/kernels/kvcache_sm80.cuh"

template <int HEAD_DIM>
struct fa_kvq_config : fa_kv_config<HEAD_DIM> {
    using Base = fa_kv_config<HEAD_DIM>;
    static constexpr int STAGES = fa_kvq_stages(HEAD_DIM); /* raw stages (hides Base's)        */
    static constexpr int RAW_PITCH = fa_kvq_row_pitch(HEAD_DIM);
    static constexpr int RAW_TILE_BYTES = Base::BLOCK_N * RAW_PITCH;
    static constexpr int RAW_STAGE_BYTES = (int)fa_kvq_stage_bytes(HEAD_DIM);
    static constexpr int OFF_SCALES = 2 * RAW_TILE_BYTES;              /* K scales, then V scales */
    static constexpr int OFF_ROWS = OFF_SCALES + 2 * 4 * Base::BLOCK_N; /* (slab, row) pairs       */
    static constexpr int CONV_BYTES = 2 * Base::TILE_BYTES;             /* dequantised K, V        */
    static constexpr int AREA_BYTES = CONV_BYTES + STAGES * RAW_STAGE_BYTES;
    /* The epilogue's view of the area after Q (fa_kv_merge_splits sizes its batches by
     * STAGES × STAGE_BYTES): at most AREA_BYTES. */
    static constexpr int STAGE_BYTES = AREA_BYTES / STAGES;
    static constexpr size_t SMEM_BYTES = fa_kvq_smem_bytes(HEAD_DIM);
    static_assert(SMEM_BYTES == (size_t)Base::Q_BYTES + (size_t)AREA_BYTES, "smem layout");
    static_assert(RAW_STAGE_BYTES == OFF_ROWS + 8 * Base::BLOCK_N && RAW_PITCH % 16 == 0 && RAW_PITCH >= HEAD_DIM,
                  "raw stage layout");
    static_assert(Base::THREADS == 2 * Base::BLOCK_N, "one thread per scale of a K and a V tile");
    static_assert(Base::RED_BYTES <= STAGES * STAGE_BYTES, "the epilogue fits in the area");
    static_assert(4 * Base::BLOCK_M * (FA_KV_MAX_SPLITS + 1) + 16 + 4 * Base::BLOCK_M * HEAD_DIM <=
                      STAGES * STAGE_BYTES,
                  "the fused merge's weights and one split's partial o fit in the area");
    static_assert(STAGES >= 2, "the loop refills the stage computed one iteration earlier");
};

/* ---- conversions, shared with the append (kvcache_quant.cu) --------------------------------- */

/* The conversions use the fp32 pipe and the integer ALU rather than the conversion instructions
 * (I2F runs at a fraction of the fp32 rate, and at HBM speed an SM dequantises ~20 values per
 * clock); every result is exact before the scale's single rounding. */

/* Byte i (0..3) of w, an int8 q, -> (float)q: the byte + 128 under the exponent of 2^23 is the
 * float 2^23 + q + 128, minus 2^23 + 128 exactly. */
__device__ __forceinline__ float fa_kvq_i8_to_f32(uint32_t w_biased, int i) {
    return __fsub_rn(__uint_as_float(__byte_perm(w_biased, 0x4b000000u, 0x7650u + (uint32_t)i)), 8388736.0f);
}

/* Byte i of w, an e4m3 code, -> its value: sign and the 7 magnitude bits placed as an fp32 with
 * exponent field e and 3 mantissa bits, times 2^120 (bias 127 vs 7; a subnormal code becomes an
 * fp32 subnormal and lands exactly too: no flush to zero in this build). NaN codes: the caller. */
__device__ __forceinline__ float fa_kvq_e4m3_to_f32(uint32_t w, int i) {
    const uint32_t b = (w >> (8 * i)) & 0xffu;
    return __fmul_rn(__uint_as_float(((b & 0x7fu) << 20) | ((b & 0x80u) << 24)), 0x1p120f);
}

/* Whether a byte of w has the magnitude bits 0x7f (e4m3 NaN): adding 1 to each 7-bit magnitude
 * carries into bit 7 only there. */
__device__ __forceinline__ bool fa_kvq_e4m3_has_nan(uint32_t w) {
    return (((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) != 0;
}

/* ---- key tiles: raw copies -------------------------------------------------------------------- */

/* Where a tile row lives: slab (cache row or page, -1 = not read: outside the block's slots)
 * and the row within it. */
struct fa_kvq_row {
    int slab, row;
};

template <class Cfg>
struct fa_kvq_tile_loader {
    static constexpr int BLOCK_N = Cfg::BLOCK_N, THREADS = Cfg::THREADS;
    const fa_kv_params &prm;
    const fa_kv_block &blk;
    uint32_t raw_smem; /* raw stage 0                                                   */
    const uint8_t *k_head, *v_head; /* the cache at kv head hk                          */
    const float *ks_head, *vs_head; /* int8: the scales at kv head hk                    */
    /* The thread's copies of a K (V) tile: items tid, tid + THREADS, ... of BLOCK_N rows × units
     * copies, walked without a division: first (row, unit), then + (step_r, step_u) with carry. */
    int k_units, k_row0, k_unit0, k_step_r, k_step_u;
    int v_units, v_row0, v_unit0, v_step_r, v_step_u;

    __device__ __forceinline__ fa_kvq_tile_loader(const fa_kv_params &prm_, const fa_kv_block &blk_, uint32_t raw,
                                                  int tid)
        : prm(prm_), blk(blk_), raw_smem(raw) {
        const bool q8 = prm.kv_quant == FA_KV_Q8_0;
        const int k_bytes = q8 ? prm.head_dim / 32 * 34 : prm.head_dim;
        const int v_bytes = q8 ? prm.head_dim_v / 32 * 34 : prm.head_dim_v;
        k_units = k_bytes / prm.kv_copy_bytes;
        v_units = v_bytes / prm.kv_copy_bytes;
        k_row0 = tid / k_units, k_unit0 = tid % k_units, k_step_r = THREADS / k_units, k_step_u = THREADS % k_units;
        v_row0 = tid / v_units, v_unit0 = tid % v_units, v_step_r = THREADS / v_units, v_step_u = THREADS % v_units;
        k_head = (const uint8_t *)prm.k + (int64_t)blk.hk * prm.k_head_stride;
        v_head = (const uint8_t *)prm.v + (int64_t)blk.hk * prm.v_head_stride;
        const bool i8 = prm.kv_quant == FA_KV_INT8;
        ks_head = i8 ? prm.k_scale + (int64_t)blk.hk * prm.k_scale_head_stride : nullptr;
        vs_head = i8 ? prm.v_scale + (int64_t)blk.hk * prm.v_scale_head_stride : nullptr;
    }

    /* Row `tid` (< BLOCK_N) of tile m, clamped as fa_kv_append clamps (device arrays the host
     * never checked). A paged cache reads its block-table entry here. */
    __device__ __forceinline__ fa_kvq_row fetch_row(int m, int tid) const {
        fa_kvq_row r = {-1, 0};
        const int c = m * BLOCK_N + tid;
        if (tid < BLOCK_N && c >= blk.slot_lo && c < blk.slot_hi) {
            if (blk.paged) {
                const int pidx = min(c / prm.page_size, blk.table_last);
                r.slab = min(max(blk.block_table_row[pidx], 0), prm.num_pages - 1);
                r.row = min(c - pidx * prm.page_size, prm.page_size - 1);
            } else {
                r.slab = blk.cache_row;
                r.row = c;
            }
        }
        return r;
    }

    __device__ __forceinline__ void store_row(int stage, int tid, fa_kvq_row r) const {
        if (tid < BLOCK_N)
            st_shared_u64(raw_smem + stage * Cfg::RAW_STAGE_BYTES + Cfg::OFF_ROWS + 8 * tid,
                          (uint64_t)(uint32_t)r.slab | ((uint64_t)(uint32_t)r.row << 32));
    }

    /* The copies of one K or V tile of a stage in units of BYTES; rows not read are zero-filled. */
    template <int BYTES>
    __device__ __forceinline__ void issue_tile(uint32_t stage_addr, uint32_t dst_tile, const uint8_t *base, int64_t bs,
                                               int64_t rs, int units, int r, int u, int step_r, int step_u) const {
        while (r < BLOCK_N) {
            const uint64_t sr = ld_shared_u64(stage_addr + Cfg::OFF_ROWS + 8 * r);
            const int slab = (int)(uint32_t)sr, row = (int)(uint32_t)(sr >> 32);
            const bool ok = slab >= 0;
            const void *src = ok ? (const void *)(base + (int64_t)slab * bs + (int64_t)row * rs + u * BYTES)
                                 : (const void *)base;
            const uint32_t dst = dst_tile + r * Cfg::RAW_PITCH + u * BYTES;
            if (BYTES == 16) cp_async_cg_16(dst, src, ok ? 16 : 0);
            else if (BYTES == 8) cp_async_ca_8(dst, src, ok ? 8 : 0);
            else cp_async_ca_4(dst, src, ok ? 4 : 0);
            r += step_r;
            u += step_u;
            if (u >= units) {
                u -= units;
                ++r;
            }
        }
    }

    template <int BYTES>
    __device__ __forceinline__ void issue_units(uint32_t stage_addr) const {
        issue_tile<BYTES>(stage_addr, stage_addr, k_head, prm.k_batch_stride, prm.k_row_stride, k_units, k_row0, k_unit0,
                          k_step_r, k_step_u);
        issue_tile<BYTES>(stage_addr, stage_addr + Cfg::RAW_TILE_BYTES, v_head, prm.v_batch_stride, prm.v_row_stride,
                          v_units, v_row0, v_unit0, v_step_r, v_step_u);
    }

    /* cp.async of the tile whose rows are in `stage` (stored there one tile earlier): K and V
     * rows, then (int8) thread t < 64 the K scale of row t, thread 64 + t the V scale. */
    __device__ __forceinline__ void issue(int stage, int tid) const {
        const uint32_t stage_addr = raw_smem + stage * Cfg::RAW_STAGE_BYTES;
        switch (prm.kv_copy_bytes) {
        case 16: issue_units<16>(stage_addr); break;
        case 8: issue_units<8>(stage_addr); break;
        default: issue_units<4>(stage_addr); break;
        }
        if (prm.kv_quant == FA_KV_INT8) {
            const bool is_v = tid >= BLOCK_N;
            const int r = is_v ? tid - BLOCK_N : tid;
            const uint64_t sr = ld_shared_u64(stage_addr + Cfg::OFF_ROWS + 8 * r);
            const int slab = (int)(uint32_t)sr, row = (int)(uint32_t)(sr >> 32);
            const float *base = is_v ? vs_head : ks_head;
            const int64_t bs = is_v ? prm.v_scale_batch_stride : prm.k_scale_batch_stride;
            const int64_t rs = is_v ? prm.v_scale_row_stride : prm.k_scale_row_stride;
            const bool ok = slab >= 0;
            cp_async_ca_4(stage_addr + Cfg::OFF_SCALES + 4 * tid,
                          ok ? (const void *)(base + (int64_t)slab * bs + (int64_t)row * rs) : (const void *)base,
                          ok ? 4 : 0);
        }
    }
};

/* ---- key tiles: dequantisation ---------------------------------------------------------------- */

/* The landed raw tile of `stage` (slots c0 ..) into the 16-bit K and V tiles at conv_smem:
 * thread = chunk column tid % CHUNKS, rows tid / CHUNKS + RPP·pass. x = scale · q in fp32 (exact
 * for Q8_0: an f16 scale times an int8; int8 and e4m3 round once there), rounded to nearest
 * into the 16-bit type. Chunks past d / dv and rows outside the block's slots are 0 (such a row
 * must stay 0 whatever the scale: 0·NaN would leak into P·V). One instantiation per format
 * (QUANT: fa_kv_dtype), picked once per tile. */
template <class Elem, class Cfg, int QUANT>
__device__ __forceinline__ void fa_kvq_dequant_format(const fa_kv_params &prm, const fa_kv_block &blk,
                                                      uint32_t stage_addr, uint32_t conv_smem, int c0, int tid,
                                                      float k_head_scale, float v_head_scale) {
    constexpr int CHUNKS = Cfg::CHUNKS, RPP = Cfg::ROWS_PER_PASS;
    constexpr int quant = QUANT;
    const int chunk = tid % CHUNKS, row0 = tid / CHUNKS;
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
        const int n_chunks = (kv ? prm.head_dim_v : prm.head_dim) / 8;
        const float head_scale = kv ? v_head_scale : k_head_scale;
        const uint32_t raw_tile = stage_addr + kv * Cfg::RAW_TILE_BYTES;
        const uint32_t conv_tile = conv_smem + kv * Cfg::TILE_BYTES;
#pragma unroll
        for (int pass = 0; pass < Cfg::LOAD_PASSES; ++pass) {
            const int r = row0 + pass * RPP;
            const int c = c0 + r;
            const bool valid = c >= blk.slot_lo && c < blk.slot_hi;
            uint32_t out[4] = {0u, 0u, 0u, 0u};
            if (valid && chunk < n_chunks) {
                const uint32_t raw_row = raw_tile + r * Cfg::RAW_PITCH;
                float x[8];
                uint32_t w[2];
                float s;
                if (quant == FA_KV_Q8_0) { /* the block's f16 scale, then 8 of its int8 (2-byte aligned) */
                    const uint32_t block = raw_row + 34 * (chunk / 4);
                    s = __half2float(__ushort_as_half(ld_shared_u16(block)));
                    const uint32_t at = block + 2 + 8 * (chunk % 4);
                    w[0] = (uint32_t)ld_shared_u16(at) | (uint32_t)ld_shared_u16(at + 2) << 16;
                    w[1] = (uint32_t)ld_shared_u16(at + 4) | (uint32_t)ld_shared_u16(at + 6) << 16;
                } else {
                    const uint64_t w64 = ld_shared_u64(raw_row + 8 * chunk);
                    w[0] = (uint32_t)w64;
                    w[1] = (uint32_t)(w64 >> 32);
                    s = quant == FA_KV_INT8 ? ld_shared_f32(stage_addr + Cfg::OFF_SCALES + 4 * (kv * Cfg::BLOCK_N + r))
                                            : head_scale;
                }
                if (quant == FA_KV_FP8_E4M3) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
#pragma unroll
                        for (int i = 0; i < 4; ++i) x[4 * h + i] = __fmul_rn(fa_kvq_e4m3_to_f32(w[h], i), s);
                        if (fa_kvq_e4m3_has_nan(w[h])) /* rare: S.1111.111 decodes to NaN */
#pragma unroll
                            for (int i = 0; i < 4; ++i)
                                if (((w[h] >> (8 * i)) & 0x7fu) == 0x7fu) x[4 * h + i] = CUDART_NAN_F;
                    }
                } else {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const uint32_t biased = w[h] ^ 0x80808080u; /* q + 128 per byte */
#pragma unroll
                        for (int i = 0; i < 4; ++i) x[4 * h + i] = __fmul_rn(fa_kvq_i8_to_f32(biased, i), s);
                    }
                }
#pragma unroll
                for (int i = 0; i < 4; ++i) out[i] = Elem::pack2(x[2 * i], x[2 * i + 1]);
            }
            st_shared_v4_b32(conv_tile + 16 * fa_swizzled_chunk<CHUNKS>(r, chunk), out);
        }
    }
}

template <class Elem, class Cfg>
__device__ __forceinline__ void fa_kvq_dequant_tile(const fa_kv_params &prm, const fa_kv_block &blk, uint32_t stage_addr,
                                                    uint32_t conv_smem, int c0, int tid, float k_head_scale,
                                                    float v_head_scale) {
    switch (prm.kv_quant) { /* block-uniform */
    case FA_KV_INT8:
        fa_kvq_dequant_format<Elem, Cfg, FA_KV_INT8>(prm, blk, stage_addr, conv_smem, c0, tid, k_head_scale,
                                                     v_head_scale);
        break;
    case FA_KV_Q8_0:
        fa_kvq_dequant_format<Elem, Cfg, FA_KV_Q8_0>(prm, blk, stage_addr, conv_smem, c0, tid, k_head_scale,
                                                     v_head_scale);
        break;
    default:
        fa_kvq_dequant_format<Elem, Cfg, FA_KV_FP8_E4M3>(prm, blk, stage_addr, conv_smem, c0, tid, k_head_scale,
                                                         v_head_scale);
        break;
    }
}

/* ---- the kernel ------------------------------------------------------------------------------------ */

template <class Elem, int HEAD_DIM>
__global__ void __launch_bounds__(fa_kv_config<HEAD_DIM>::THREADS, fa_kv_min_blocks(HEAD_DIM))
    fa_kvq_kernel(const fa_kv_params prm) {
    using Cfg = fa_kvq_config<HEAD_DIM>;
    using Cvt = fa_kv_convert<Elem>;
    constexpr int STAGES = Cfg::STAGES, BLOCK_N = Cfg::BLOCK_N;

    extern __shared__ __align__(128) uint8_t smem_raw[];
    const uint32_t q_smem = smem_u32addr(smem_raw);
    const uint32_t conv_smem = q_smem + Cfg::Q_BYTES;
    const uint32_t raw_smem = conv_smem + Cfg::CONV_BYTES;

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int quad_row = lane / 4, quad_col = lane % 4;

    const fa_kv_block blk = fa_kv_block_geometry<Cfg>(prm, quad_row); /* 1. */
    float k_head_scale = 0.0f, v_head_scale = 0.0f;
    if (prm.kv_quant == FA_KV_FP8_E4M3) {
        k_head_scale = prm.k_scale[blk.hk];
        v_head_scale = prm.v_scale[blk.hk];
    }

    fa_kv_issue_q<Cfg>(prm, blk, q_smem, tid / Cfg::CHUNKS, tid % Cfg::CHUNKS, prm.head_dim / 8); /* 2. */
    const fa_kvq_tile_loader<Cfg> ld(prm, blk, raw_smem, tid);
    /* Prologue: the rows of tiles 0 .. STAGES-1, a barrier, the copies of tiles 0 .. STAGES-2
     * (one commit each, empty or not: the wait counts of the loop and of fa_kv_land_q are
     * constants). Group order: Q, tile 0, tile 1, ... */
#pragma unroll
    for (int st = 0; st < STAGES; ++st)
        if (st < blk.n_tiles) ld.store_row(st, tid, ld.fetch_row(blk.tile_first + st, tid));
    __syncthreads(); /* the rows visible to every copying thread */
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (st < blk.n_tiles) ld.issue(st, tid);
        cp_async_commit_group();
    }

    fa_kv_land_q<Cfg, Cvt>(prm, blk, q_smem, 0, tid);
    fa_kv_fragments<Cfg> frag;
    fa_kv_load_fragments<Cfg>(frag, q_smem, lane);

    float o_rmem[Cfg::O_TILES][4];
#pragma unroll
    for (int ot = 0; ot < Cfg::O_TILES; ++ot)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_rmem[ot][e] = 0.0f;
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float row_sum[2] = {0.0f, 0.0f};
    const float score_mul = prm.score_mul;
    const uint32_t k_tile = conv_smem, v_tile = conv_smem + Cfg::TILE_BYTES;

    for (int it = 0; it < blk.n_tiles; ++it) {
        cp_async_wait_group<STAGES - 2>(); /* raw tile it landed (this thread's copies)       */
        __syncthreads();                   /* everyone's; every warp finished tile it-1, so the
                                              16-bit tiles and raw stage it-1 can be refilled  */
        const int next = it + STAGES - 1;
        if (next < blk.n_tiles) ld.issue(next % STAGES, tid);
        cp_async_commit_group();
        const bool more = next + 1 < blk.n_tiles;
        fa_kvq_row pending = {-1, 0};
        if (more) pending = ld.fetch_row(blk.tile_first + next + 1, tid); /* consumed after the compute */

        const int c0 = (blk.tile_first + it) * BLOCK_N;
        fa_kvq_dequant_tile<Elem, Cfg>(prm, blk, raw_smem + (it % STAGES) * Cfg::RAW_STAGE_BYTES, conv_smem, c0, tid,
                                       k_head_scale, v_head_scale);
        __syncthreads(); /* the dequantised tile visible to every warp */

        float s_rmem[2][4];
        fa_kv_scores<Elem, Cfg, false>(prm, blk, frag, q_smem, k_tile, c0 + warp * Cfg::WARP_N, warp, quad_col, s_rmem,
                                       fa_mods_arg<false>{}); /* no score bias on a quantised cache */
        fa_kv_softmax_pv<Elem, Cfg>(frag, v_tile, warp, score_mul, s_rmem, o_rmem, row_max, row_sum);
        /* stage (next + 1) % STAGES = it % STAGES: its rows were last read by tile it's copies */
        if (more) ld.store_row((next + 1) % STAGES, tid, pending);
    }

    fa_kv_merge_warps<Elem, Cfg>(prm, blk, conv_smem, o_rmem, row_max, row_sum, tid, score_mul); /* 4. */
    if (prm.num_splits == 1) return;
    if (fa_kv_claim_merge(prm, blk, tid)) fa_kv_merge_splits<Elem, Cfg>(prm, blk, conv_smem, tid); /* 6. */
}

/* Launch one instantiation on `stream` (the shared-memory opt-in as fa_kv_launch). */
template <class Elem, int HEAD_DIM>
static fa_status fa_kvq_launch(const fa_kv_params *prm, int device_ordinal, cudaStream_t stream, const char *name) {
    using Cfg = fa_kvq_config<HEAD_DIM>;
    static unsigned long long smem_configured = 0; /* bit i: device i done */
    const unsigned long long bit = device_ordinal >= 0 && device_ordinal < 64 ? 1ull << device_ordinal : 0ull;
    if (Cfg::SMEM_BYTES > 48 * 1024 && (bit == 0 || !(__atomic_load_n(&smem_configured, __ATOMIC_ACQUIRE) & bit))) {
        FA_CUDA_CHECK(cudaFuncSetAttribute(fa_kvq_kernel<Elem, HEAD_DIM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)Cfg::SMEM_BYTES),
                      name);
        __atomic_fetch_or(&smem_configured, bit, __ATOMIC_RELEASE);
    }
    const dim3 grid((unsigned)prm->row_tiles * (unsigned)prm->num_splits, (unsigned)prm->heads_kv,
                    (unsigned)prm->batch);
    fa_kvq_kernel<Elem, HEAD_DIM><<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(*prm);
    FA_CUDA_CHECK_LAUNCH(name);
    return FA_OK;
}

#endif /* FA_KVCACHE_QUANT_KERNEL_CUH */
