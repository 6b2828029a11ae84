/*
 * kvcache_quant_sm80.cuh: the CUDA KV-cache decode kernels on a quantised cache (fa_kv_dtype),
 * mma.sync tensor cores (sm_80+). Included by instances/kvcache_quant_sm80_hdim<D>.cu. Two
 * siblings of fa_kv_kernel (kvcache_sm80.cuh), reusing its geometry (1), Q load (2), score
 * transform and mask, warp merge and output (4) and fused split merge (6); both copy each tile's
 * cache rows by cp.async as raw bytes (in units of kv_copy_bytes = 16, 8 or 4) into a
 * STAGES-deep pipeline of raw stages, with the int8 rows' scales, so the cache traffic is that
 * of the quantised bytes. Rows, (slab, row) pairs, are found one tile ahead by threads 0..63 (a
 * paged cache's block-table read is issued right after a tile's copies, and the row's K, V and
 * scale addresses are stored to shared memory after the tile's compute, so it never stalls the
 * copies) and read from shared memory by the copies. The append: fa_kvq_append
 * (kvcache_quant.cu) has quantised k_new / v_new into the cache before these kernels, on the
 * same stream, so every slot, appended ones included, comes from the cache (the attention sees
 * the quantised appended keys, as on the CPU); no step 5 here, no rotary (refused with a
 * quantised cache).
 *
 * fa_kvq_regs_kernel, int8 (fp32 scale per token and kv head) and fp8 e4m3 (fp32 scale per kv
 * head): the tensor cores compute in f16 whatever the query dtype, since every int8 and e4m3
 * value is exact in f16. Each warp reads its 16 slots of K and V from the raw stage with
 * ldmatrix (8-bit rows taken as 16-bit columns) and converts them in registers (int8: a byte
 * permute under the exponent of 1024, which gives q + 1152, the offset taken off once per row:
 * 1152 · Σ q off the scores, 1152 · Σ p, a P·V column of ones, off O; e4m3: cvt.rn.f16x2.e4m3x2
 * on sm_89+), so the tile is never rewritten in shared memory and a tile costs one barrier. The
 * scales act on fp32 values: the K scale multiplies the score columns (int8) or the scores
 * (e4m3); the int8 V scale multiplies the probabilities of its column before they are rounded
 * to f16, relative to a unit 2^E per row and warp (the tile's largest p·scale in [1, 2) when the
 * unit moves) so that the terms that matter keep f16's full precision, O being kept in units of
 * 2^E (rescaled with the running max when E moves); the e4m3 V scale multiplies O once at the
 * end. A bf16 query row is scaled by a power of two into f16's range (exact for every element
 * within 2^29 of the row's largest) and the scores unscaled. Scores, softmax and O accumulate in
 * fp32 as elsewhere.
 *
 * fa_kvq_kernel, Q8_0 (an f16 scale per 32-value block, which fits neither a score column nor a
 * probability): the landed tile is dequantised (x = scale · q in fp32, exact, rounded once to
 * the 16-bit compute type) into one K and one V tile in the layout and swizzle the mma loads of
 * fa_kv_kernel read, a barrier, then fa_kv_kernel's tile compute (3) unchanged.
 *
 * Shared memory, register kernel: q_smem [BLOCK_M, D] 16-bit as loaded | q_frag f16 fragments
 * [K_STEPS][32 lanes][4 words] | raw stage s < STAGES: K rows [BLOCK_N][D bytes], V rows (16-byte
 * chunks swizzled), K scales [BLOCK_N] fp32, V scales, the rows' global addresses [BLOCK_N]
 * × (K row, V row, K scale, V scale) u64.
 * Q8_0 kernel: q_smem | k_conv [BLOCK_N, D], v_conv 16-bit swizzled | raw stages as above with
 * rows of RAW_PITCH bytes, unswizzled. The epilogue reuses everything after q_smem.
 */
#ifndef FA_KVCACHE_QUANT_KERNEL_CUH
#define FA_KVCACHE_QUANT_KERNEL_CUH

#include "cuda/kernels/kvcache_sm80.cuh"

/* What both raw-stage layouts below promise, stated once (instantiated by each config): the
 * stage ends with the rows' addresses; one thread per scale of a K and a V tile; the epilogue
 * (the reduction and the fused merge's weights with one split's partial o) fits in the area
 * after Q; at least two stages, as the loop refills the stage computed one iteration earlier. */
template <class Base, int HEAD_DIM, int STAGES, int STAGE_BYTES, int RAW_STAGE_BYTES, int OFF_ROWS>
struct fa_kvq_area_rules {
    static_assert(RAW_STAGE_BYTES == OFF_ROWS + FA_KVQ_ROW_BYTES * Base::BLOCK_N && OFF_ROWS % 16 == 0,
                  "raw stage layout");
    static_assert(Base::THREADS == 2 * Base::BLOCK_N, "one thread per scale of a K and a V tile");
    static_assert(Base::RED_BYTES <= STAGES * STAGE_BYTES, "the epilogue fits in the area");
    static_assert(4 * Base::BLOCK_M * (FA_KV_MAX_SPLITS + 1) + 16 + 4 * Base::BLOCK_M * HEAD_DIM <=
                      STAGES * STAGE_BYTES,
                  "the fused merge's weights and one split's partial o fit in the area");
    static_assert(STAGES >= 2, "the loop refills the stage computed one iteration earlier");
    static constexpr bool ok = true;
};

template <int HEAD_DIM>
struct fa_kvq_config : fa_kv_config<HEAD_DIM> {
    using Base = fa_kv_config<HEAD_DIM>;
    static constexpr int STAGES = fa_kvq_stages(HEAD_DIM); /* raw stages (hides Base's)        */
    static constexpr int RAW_PITCH = fa_kvq_row_pitch(HEAD_DIM);
    static constexpr int RAW_TILE_BYTES = Base::BLOCK_N * RAW_PITCH;
    static constexpr int RAW_STAGE_BYTES = (int)fa_kvq_stage_bytes(HEAD_DIM);
    static constexpr int OFF_SCALES = 2 * RAW_TILE_BYTES;              /* K scales, then V scales */
    static constexpr int OFF_ROWS = OFF_SCALES + 2 * 4 * Base::BLOCK_N; /* the rows' addresses     */
    static constexpr int CONV_BYTES = 2 * Base::TILE_BYTES;             /* dequantised K, V        */
    static constexpr int AREA_BYTES = CONV_BYTES + STAGES * RAW_STAGE_BYTES;
    /* The epilogue's view of the area after Q (fa_kv_merge_splits sizes its batches by
     * STAGES × STAGE_BYTES): at most AREA_BYTES. */
    static constexpr int STAGE_BYTES = AREA_BYTES / STAGES;
    static constexpr size_t SMEM_BYTES = fa_kvq_smem_bytes(HEAD_DIM);
    static_assert(SMEM_BYTES == (size_t)Base::Q_BYTES + (size_t)AREA_BYTES, "smem layout");
    static_assert(RAW_PITCH % 16 == 0 && RAW_PITCH >= HEAD_DIM, "raw rows of whole 16-byte chunks");
    static_assert(fa_kvq_area_rules<Base, HEAD_DIM, STAGES, STAGE_BYTES, RAW_STAGE_BYTES, OFF_ROWS>::ok, "area");
    /* byte `byte` of raw row `row` of a tile, from the tile's start: rows RAW_PITCH apart */
    static __device__ __forceinline__ uint32_t raw_offset(int row, int byte) {
        return (uint32_t)(row * RAW_PITCH + byte);
    }
};

/* The register kernel's layout (fa_kvq_regs_kernel). */
template <int HEAD_DIM>
struct fa_kvq_regs_config : fa_kv_config<HEAD_DIM> {
    using Base = fa_kv_config<HEAD_DIM>;
    static constexpr int STAGES = fa_kvq_regs_stages(HEAD_DIM); /* raw stages (hides Base's)  */
    static constexpr int RAW_PITCH = HEAD_DIM;                  /* bytes per raw row          */
    static constexpr int RAW_CHUNKS = HEAD_DIM / 16;            /* 16-byte chunks per raw row */
    static constexpr int RAW_TILE_BYTES = Base::BLOCK_N * RAW_PITCH;
    static constexpr int RAW_STAGE_BYTES = (int)fa_kvq_regs_stage_bytes(HEAD_DIM);
    static constexpr int OFF_SCALES = 2 * RAW_TILE_BYTES;               /* K scales, then V scales */
    static constexpr int OFF_ROWS = OFF_SCALES + 2 * 4 * Base::BLOCK_N; /* the rows' addresses     */
    static constexpr int QF_BYTES = 16 * 32 * Base::K_STEPS;            /* f16 Q fragments         */
    static constexpr int AREA_BYTES = QF_BYTES + STAGES * RAW_STAGE_BYTES;
    /* the epilogue's view of the area after Q (fa_kv_merge_splits sizes its batches by
     * STAGES × STAGE_BYTES): at most AREA_BYTES */
    static constexpr int STAGE_BYTES = AREA_BYTES / STAGES;
    static constexpr size_t SMEM_BYTES = fa_kvq_regs_smem_bytes(HEAD_DIM);
    static_assert(SMEM_BYTES == (size_t)Base::Q_BYTES + (size_t)AREA_BYTES && QF_BYTES == Base::Q_BYTES, "smem layout");
    static_assert(RAW_CHUNKS >= 4, "raw rows of at least four 16-byte chunks");
    static_assert(fa_kvq_area_rules<Base, HEAD_DIM, STAGES, STAGE_BYTES, RAW_STAGE_BYTES, OFF_ROWS>::ok, "area");
    static_assert((Base::THREADS / RAW_CHUNKS) % 8 == 0, "whole-row copies: a thread's rows share one swizzle");
    static_assert(Base::THREADS == 8 * Base::BLOCK_M, "eight threads per query row find its largest element");
    static_assert(Base::K_STEPS >= Base::WARPS && Base::K_STEPS % 2 == 0 && Base::O_TILES % 4 == 0,
                  "every warp builds Q fragments; ldmatrix.x4 loads two k16 steps of K / two 16-column "
                  "segments of V");
    /* Byte `byte` of raw row `row` of a tile, from the tile's start. The 16-byte chunks are
     * XOR-swizzled so that the 8 rows an ldmatrix phase reads at one logical chunk fall in 8
     * different 16-byte bank groups: rows of 8 or more chunks by row & 7 (as fa_swizzled_chunk),
     * rows of 4 chunks (d 64: two rows per 128 bytes) by (row >> 1) & 3. */
    static __device__ __forceinline__ uint32_t raw_offset(int row, int byte) {
        const int swizzle = RAW_CHUNKS >= 8 ? (row & 7) : ((row >> 1) & 3);
        return (uint32_t)(row * RAW_PITCH + (((byte >> 4) ^ swizzle) << 4) + (byte & 15));
    }
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

    __device__ __forceinline__ fa_kvq_tile_loader(const fa_kv_params &prm_, const fa_kv_block &blk_, uint32_t raw)
        : prm(prm_), blk(blk_), raw_smem(raw) {
        k_head = (const uint8_t *)prm.k + (int64_t)blk.hk * prm.k_head_stride;
        v_head = (const uint8_t *)prm.v + (int64_t)blk.hk * prm.v_head_stride;
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

    /* Row `tid` (< BLOCK_N) of `stage`: the global addresses of its K row, V row and (int8) K and
     * V scales, 0 where it is not read, so that a copy costs one shared load and an add rather
     * than two 64-bit products. */
    __device__ __forceinline__ void store_row(int stage, int tid, fa_kvq_row r) const {
        if (tid < BLOCK_N) {
            uint32_t a[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
            if (r.slab >= 0) {
                const uint64_t k_row = (uint64_t)(uintptr_t)(k_head + (int64_t)r.slab * prm.k_batch_stride +
                                                             (int64_t)r.row * prm.k_row_stride);
                const uint64_t v_row = (uint64_t)(uintptr_t)(v_head + (int64_t)r.slab * prm.v_batch_stride +
                                                             (int64_t)r.row * prm.v_row_stride);
                a[0] = (uint32_t)k_row, a[1] = (uint32_t)(k_row >> 32);
                a[2] = (uint32_t)v_row, a[3] = (uint32_t)(v_row >> 32);
                if (prm.kv_quant == FA_KV_INT8) {
                    const uint64_t k_scale =
                        (uint64_t)(uintptr_t)(prm.k_scale + (int64_t)blk.hk * prm.k_scale_head_stride +
                                              (int64_t)r.slab * prm.k_scale_batch_stride +
                                              (int64_t)r.row * prm.k_scale_row_stride);
                    const uint64_t v_scale =
                        (uint64_t)(uintptr_t)(prm.v_scale + (int64_t)blk.hk * prm.v_scale_head_stride +
                                              (int64_t)r.slab * prm.v_scale_batch_stride +
                                              (int64_t)r.row * prm.v_scale_row_stride);
                    a[4] = (uint32_t)k_scale, a[5] = (uint32_t)(k_scale >> 32);
                    a[6] = (uint32_t)v_scale, a[7] = (uint32_t)(v_scale >> 32);
                }
            }
            const uint32_t at = raw_smem + stage * Cfg::RAW_STAGE_BYTES + Cfg::OFF_ROWS + FA_KVQ_ROW_BYTES * tid;
            st_shared_v4_b32(at, &a[0]);
            st_shared_v4_b32(at + 16, &a[4]);
        }
    }

    /* Bytes [d, RAW_PITCH) of every K row and [dv, RAW_PITCH) of every V row of every stage set
     * to 0 once (the copies write only [0, d) and [0, dv)), for a kernel that reads whole rows
     * (a NaN code there would reach P·V through 0 · NaN). d and dv are multiples of 8. */
    __device__ __forceinline__ void zero_row_ends(int tid) const {
        constexpr int UNITS = Cfg::RAW_PITCH / 8; /* 8-byte units per row */
        const int k_first = prm.head_dim / 8, v_first = prm.head_dim_v / 8;
        if (k_first == UNITS && v_first == UNITS) return; /* block-uniform */
        for (int i = tid; i < Cfg::STAGES * 2 * BLOCK_N * UNITS; i += THREADS) {
            const int u = i % UNITS, r = (i / UNITS) % BLOCK_N, kv = (i / (UNITS * BLOCK_N)) % 2,
                      stage = i / (2 * UNITS * BLOCK_N);
            if (u >= (kv ? v_first : k_first))
                st_shared_u64(raw_smem + stage * Cfg::RAW_STAGE_BYTES + kv * Cfg::RAW_TILE_BYTES +
                                  Cfg::raw_offset(r, 8 * u),
                              0ull);
        }
    }

    /* The copies of one K (which = 0) or V (1) tile of a stage, rows of row_bytes, in units of
     * BYTES: items tid, tid + THREADS, ... of BLOCK_N rows × units copies, walked without a
     * division after the first; rows not read are zero-filled. */
    template <int BYTES>
    __device__ __forceinline__ void issue_tile(uint32_t stage_addr, int which, const uint8_t *base, int row_bytes,
                                               int tid) const {
        const uint32_t dst_tile = stage_addr + which * Cfg::RAW_TILE_BYTES;
        const uint32_t rows = stage_addr + Cfg::OFF_ROWS + 8 * which;
        constexpr int ROW = FA_KVQ_ROW_BYTES;
        const int units = row_bytes / BYTES, step_r = THREADS / units, step_u = THREADS % units;
        int r = tid / units, u = tid % units;
        while (r < BLOCK_N) {
            const uint64_t src_row = ld_shared_u64(rows + ROW * r);
            const void *src = src_row ? (const void *)(src_row + u * BYTES) : (const void *)base;
            const uint32_t dst = dst_tile + Cfg::raw_offset(r, u * BYTES);
            if (BYTES == 16) cp_async_cg_16(dst, src, src_row ? 16 : 0);
            else if (BYTES == 8) cp_async_ca_8(dst, src, src_row ? 8 : 0);
            else cp_async_ca_4(dst, src, src_row ? 4 : 0);
            r += step_r;
            u += step_u;
            if (u >= units) {
                u -= units;
                ++r;
            }
        }
    }

    template <int BYTES>
    __device__ __forceinline__ void issue_units(uint32_t stage_addr, int tid) const {
        const bool q8 = prm.kv_quant == FA_KV_Q8_0;
        const int k_bytes = q8 ? prm.head_dim / 32 * 34 : prm.head_dim;
        const int v_bytes = q8 ? prm.head_dim_v / 32 * 34 : prm.head_dim_v;
        /* K and V rows of exactly RAW_PITCH bytes copied 16 at a time (int8 / e4m3 rows of the
         * bucket's length): the thread copies unit u of rows r, r + STEP, ... of both tiles,
         * rows that share one swizzle, so a row costs one shared load of its two addresses */
        constexpr int FULL_UNITS = Cfg::RAW_PITCH / 16;
        if constexpr (BYTES == 16 && Cfg::RAW_PITCH % 16 == 0 && THREADS % FULL_UNITS == 0 &&
                      (THREADS / FULL_UNITS) % 8 == 0 && BLOCK_N % (THREADS / FULL_UNITS) == 0) {
            constexpr int STEP = THREADS / FULL_UNITS, N = BLOCK_N / STEP;
            if (k_bytes == Cfg::RAW_PITCH && v_bytes == Cfg::RAW_PITCH) { /* block-uniform */
                const int r = tid / FULL_UNITS, u = tid % FULL_UNITS;
                const uint32_t dst = stage_addr + Cfg::raw_offset(r, 16 * u);
#pragma unroll
                for (int i = 0; i < N; ++i) {
                    uint32_t a[4]; /* the row's K address, then its V address */
                    ld_shared_v4_b32(a, stage_addr + Cfg::OFF_ROWS + FA_KVQ_ROW_BYTES * (r + i * STEP));
                    const bool ok = (a[0] | a[1]) != 0u;
                    const uint64_t k_src = ((uint64_t)a[1] << 32 | a[0]) + 16u * (uint32_t)u;
                    const uint64_t v_src = ((uint64_t)a[3] << 32 | a[2]) + 16u * (uint32_t)u;
                    cp_async_cg_16(dst + i * STEP * Cfg::RAW_PITCH, ok ? (const void *)k_src : (const void *)k_head,
                                   ok ? 16 : 0);
                    cp_async_cg_16(dst + Cfg::RAW_TILE_BYTES + i * STEP * Cfg::RAW_PITCH,
                                   ok ? (const void *)v_src : (const void *)v_head, ok ? 16 : 0);
                }
                return;
            }
        }
        issue_tile<BYTES>(stage_addr, 0, k_head, k_bytes, tid);
        issue_tile<BYTES>(stage_addr, 1, v_head, v_bytes, tid);
    }

    /* cp.async of the tile whose rows are in `stage` (stored there one tile earlier): K and V
     * rows, then (int8) thread t < 64 the K scale of row t, thread 64 + t the V scale. */
    __device__ __forceinline__ void issue(int stage, int tid) const {
        const uint32_t stage_addr = raw_smem + stage * Cfg::RAW_STAGE_BYTES;
        switch (prm.kv_copy_bytes) {
        case 16: issue_units<16>(stage_addr, tid); break;
        case 8: issue_units<8>(stage_addr, tid); break;
        default: issue_units<4>(stage_addr, tid); break;
        }
        if (prm.kv_quant == FA_KV_INT8) {
            const bool is_v = tid >= BLOCK_N;
            const int r = is_v ? tid - BLOCK_N : tid;
            const uint64_t src = ld_shared_u64(stage_addr + Cfg::OFF_ROWS + FA_KVQ_ROW_BYTES * r + 16 + 8 * is_v);
            cp_async_ca_4(stage_addr + Cfg::OFF_SCALES + 4 * tid, src ? (const void *)src : (const void *)prm.k_scale,
                          src ? 4 : 0);
        }
    }
};

/* ---- key tiles: dequantisation (Q8_0) --------------------------------------------------------- */

/* The landed raw Q8_0 tile of `stage` (slots c0 ..) into the 16-bit K and V tiles at conv_smem:
 * thread = chunk column tid % CHUNKS, rows tid / CHUNKS + RPP·pass. x = scale · q in fp32 (exact:
 * an f16 scale times an int8), rounded to nearest into the 16-bit type. Chunks past d / dv and
 * rows outside the block's slots are 0 (such a row must stay 0 whatever the scale: 0·NaN would
 * leak into P·V). */
template <class Elem, class Cfg>
__device__ __forceinline__ void fa_kvq_dequant_tile(const fa_kv_params &prm, const fa_kv_block &blk,
                                                    uint32_t stage_addr, uint32_t conv_smem, int c0, int tid) {
    constexpr int CHUNKS = Cfg::CHUNKS, RPP = Cfg::ROWS_PER_PASS;
    const int chunk = tid % CHUNKS, row0 = tid / CHUNKS;
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
        const int n_chunks = (kv ? prm.head_dim_v : prm.head_dim) / 8;
        const uint32_t raw_tile = stage_addr + kv * Cfg::RAW_TILE_BYTES;
        const uint32_t conv_tile = conv_smem + kv * Cfg::TILE_BYTES;
#pragma unroll
        for (int pass = 0; pass < Cfg::LOAD_PASSES; ++pass) {
            const int r = row0 + pass * RPP;
            const int c = c0 + r;
            const bool valid = c >= blk.slot_lo && c < blk.slot_hi;
            uint32_t out[4] = {0u, 0u, 0u, 0u};
            if (valid && chunk < n_chunks) {
                const uint32_t raw_row = raw_tile + Cfg::raw_offset(r, 0);
                /* the block's f16 scale, then 8 of its int8 (2-byte aligned) */
                const uint32_t block = raw_row + 34 * (chunk / 4);
                const float s = __half2float(__ushort_as_half(ld_shared_u16(block)));
                const uint32_t at = block + 2 + 8 * (chunk % 4);
                uint32_t w[2];
                w[0] = (uint32_t)ld_shared_u16(at) | (uint32_t)ld_shared_u16(at + 2) << 16;
                w[1] = (uint32_t)ld_shared_u16(at + 4) | (uint32_t)ld_shared_u16(at + 6) << 16;
                float x[8];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint32_t biased = w[h] ^ 0x80808080u; /* q + 128 per byte */
#pragma unroll
                    for (int i = 0; i < 4; ++i) x[4 * h + i] = __fmul_rn(fa_kvq_i8_to_f32(biased, i), s);
                }
#pragma unroll
                for (int i = 0; i < 4; ++i) out[i] = Elem::pack2(x[2 * i], x[2 * i + 1]);
            }
            st_shared_v4_b32(conv_tile + 16 * fa_swizzled_chunk<CHUNKS>(r, chunk), out);
        }
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

    fa_kv_issue_q<Cfg>(prm, blk, q_smem, tid / Cfg::CHUNKS, tid % Cfg::CHUNKS, prm.head_dim / 8); /* 2. */
    const fa_kvq_tile_loader<Cfg> ld(prm, blk, raw_smem);
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
        fa_kvq_dequant_tile<Elem, Cfg>(prm, blk, raw_smem + (it % STAGES) * Cfg::RAW_STAGE_BYTES, conv_smem, c0, tid);
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

/* ---- the register kernel (int8, e4m3) ------------------------------------------------------------ */

/* Two e4m3 codes, the low (HIGH = 0) or high (1) 16 bits of w (its low byte -> the low half)
 * -> f16x2, exact, NaN codes to NaN. */
template <int HIGH>
__device__ __forceinline__ uint32_t fa_kvq_e4m3x2_to_f16x2(uint32_t w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    return HIGH ? cvt_rn_f16x2_e4m3x2_hi(w) : cvt_rn_f16x2_e4m3x2_lo(w);
#else
    const uint32_t codes = HIGH ? w >> 16 : w & 0xffffu;
    uint32_t r = cvt_rn_f16x2_f32(fa_e4m3_byte_to_f32(codes, 0), fa_e4m3_byte_to_f32(codes, 1));
    if (fa_e4m3_bytes_have_nan(codes)) { /* rare: S.1111.111 decodes to NaN */
        if ((codes & 0x7fu) == 0x7fu) r = (r & 0xffff0000u) | 0x7e00u;
        if ((codes & 0x7f00u) == 0x7f00u) r = (r & 0x0000ffffu) | 0x7e000000u;
    }
    return r;
#endif
}

/* The int8 offset: an int8 q reaches the tensor cores as the f16 q + FA_KVQ_I8_OFFSET (exact),
 * and the kernel takes FA_KVQ_I8_OFFSET · Σ once per row off the scores (Σ of the row's query
 * elements) and off O (Σ of the row's probabilities, a P·V column of ones) rather than 1152
 * from every pair. */
#define FA_KVQ_I8_OFFSET 1152.0f

/* Two int8 of `biased` (each byte q + 128), picked by `selector` into bytes 0 and 2, -> f16x2:
 * under the high byte 0x64 a byte u is the f16 1024 + u = q + FA_KVQ_I8_OFFSET. */
__device__ __forceinline__ uint32_t fa_kvq_i8x2_to_f16x2_offset(uint32_t biased, uint32_t selector) {
    return __byte_perm(biased, 0x64646464u, selector);
}

/* K: register w of an ldmatrix of a K tile holds dims 4t .. 4t+3 of one slot (bytes x0..x3);
 * b[0] = (x0, x1) is the slot's k pair (2t, 2t+1) of the k16 step, b[1] = (x2, x3) the pair
 * (2t + 8, 2t + 9). The Q fragments follow the same order (fa_kvq_regs_build_q). int8: values
 * plus FA_KVQ_I8_OFFSET. */
template <int QUANT>
__device__ __forceinline__ void fa_kvq_k_frag(uint32_t w, uint32_t (&b)[2]) {
    if (QUANT == FA_KV_INT8) {
        const uint32_t biased = w ^ 0x80808080u;
        b[0] = fa_kvq_i8x2_to_f16x2_offset(biased, 0x4140u);
        b[1] = fa_kvq_i8x2_to_f16x2_offset(biased, 0x4342u);
    } else {
        b[0] = fa_kvq_e4m3x2_to_f16x2<0>(w);
        b[1] = fa_kvq_e4m3x2_to_f16x2<1>(w);
    }
}

/* V: register w of an ldmatrix.trans of a V tile holds slots (2t, 2t+1) × columns (2g, 2g+1) of
 * an 8-slot, 16-column block, bytes [a0 a1 b0 b1] (a: slot 2t); column 2g + delta is the f16x2
 * (a_delta, b_delta), the slots' k pair of the B fragment. int8: values plus FA_KVQ_I8_OFFSET. */
template <int QUANT>
__device__ __forceinline__ void fa_kvq_v_pairs(uint32_t w, uint32_t &col0, uint32_t &col1) {
    if (QUANT == FA_KV_INT8) {
        const uint32_t biased = w ^ 0x80808080u;
        col0 = fa_kvq_i8x2_to_f16x2_offset(biased, 0x4240u);
        col1 = fa_kvq_i8x2_to_f16x2_offset(biased, 0x4341u);
    } else {
        const uint32_t pairs = __byte_perm(w, 0u, 0x3120u); /* [a0 b0 a1 b1] */
        col0 = fa_kvq_e4m3x2_to_f16x2<0>(pairs);
        col1 = fa_kvq_e4m3x2_to_f16x2<1>(pairs);
    }
}

/* Q (landed in q_smem, the query dtype, swizzled) -> f16 A fragments in qf_smem, [k16 step][lane]
 * [a0..a3], step ks's k pair (2t, 2t+1) being dims 16ks + 4t + {0, 1} and (2t + 8, 2t + 9) dims
 * 16ks + 4t + {2, 3} (fa_kvq_k_frag's order). bf16: row r is multiplied by row_mul[r] = 2^e,
 * e = 141 - E of its largest finite |element| 2^(E-127)·1.x (at most 2^126), into [2^14, 2^15):
 * exact for every element above 2^-24 after scaling, infinities and NaN kept. Warp w builds
 * steps w, w + 4, ... Ends with a barrier. */
template <class Elem, class Cfg>
__device__ __forceinline__ void fa_kvq_regs_build_q(uint32_t q_smem, uint32_t qf_smem, float *row_mul, int tid) {
    constexpr int CHUNKS = Cfg::CHUNKS;
    constexpr bool BF16 = fa_kv_convert<Elem>::BF16; /* bf16 queries are scaled into f16's range */
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    if constexpr (BF16) {
        const int r = tid / 8, part = tid % 8; /* eight threads per row, chunks part, part + 8, ... */
        uint32_t m = 0;
        for (int c = part; c < CHUNKS; c += 8) {
            uint32_t w[4];
            ld_shared_v4_b32(w, q_smem + 16 * fa_swizzled_chunk<CHUNKS>(r, c));
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const uint32_t a = (w[i / 2] >> (16 * (i % 2))) & 0x7fffu;
                if (a < 0x7f80u) m = max(m, a); /* finite */
            }
        }
#pragma unroll
        for (int off = 1; off < 8; off *= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
        if (part == 0) row_mul[r] = __uint_as_float((uint32_t)(127 + min(141 - (int)(m >> 7), 126)) << 23);
        __syncthreads(); /* row_mul visible */
    }
    for (int ks = warp; ks < Cfg::K_STEPS; ks += Cfg::WARPS) {
        uint32_t a[4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = g + 8 * h;
            const uint64_t x =
                ld_shared_u64(q_smem + 16 * fa_swizzled_chunk<CHUNKS>(row, 2 * ks + t / 2) + 8 * (t % 2));
            uint32_t lo = (uint32_t)x, hi = (uint32_t)(x >> 32);
            if constexpr (BF16) {
                const float mul = row_mul[row];
                lo = cvt_rn_f16x2_f32(__uint_as_float(lo << 16) * mul, __uint_as_float(lo & 0xffff0000u) * mul);
                hi = cvt_rn_f16x2_f32(__uint_as_float(hi << 16) * mul, __uint_as_float(hi & 0xffff0000u) * mul);
            }
            a[h] = lo;
            a[2 + h] = hi;
        }
        st_shared_v4_b32(qf_smem + 16 * (ks * 32 + lane), a);
    }
    __syncthreads(); /* the fragments visible to every warp */
}

/* The register kernel: steps 1, 2, 4, 6 as fa_kv_kernel; the key loop reads the raw stages
 * directly. QUANT: FA_KV_INT8 or FA_KV_FP8_E4M3. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FA_KVQ_REGS_SM90 0 /* the launch bounds of an sm_80 / sm_86 / sm_89 build */
#else
#define FA_KVQ_REGS_SM90 1
#endif
template <class Elem, int HEAD_DIM, int QUANT>
__global__ void __launch_bounds__(fa_kv_config<HEAD_DIM>::THREADS, fa_kvq_regs_min_blocks(HEAD_DIM, FA_KVQ_REGS_SM90))
    fa_kvq_regs_kernel(const fa_kv_params prm) {
    using Cfg = fa_kvq_regs_config<HEAD_DIM>;
    using Cvt = fa_kv_convert<Elem>;
    constexpr int STAGES = Cfg::STAGES, BLOCK_N = Cfg::BLOCK_N, WARP_N = Cfg::WARP_N;
    constexpr bool INT8 = QUANT == FA_KV_INT8;
    constexpr bool BF16 = fa_kv_convert<Elem>::BF16;

    extern __shared__ __align__(128) uint8_t smem_raw[];
    __shared__ float q_row_mul[Cfg::BLOCK_M];
    const uint32_t q_smem = smem_u32addr(smem_raw);
    const uint32_t qf_smem = q_smem + Cfg::Q_BYTES;
    const uint32_t raw_smem = qf_smem + Cfg::QF_BYTES;

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int quad_row = lane / 4, quad_col = lane % 4;

    const fa_kv_block blk = fa_kv_block_geometry<Cfg>(prm, quad_row); /* 1. */
    float k_head_scale = 1.0f, v_head_scale = 1.0f;
    if (!INT8) {
        k_head_scale = prm.k_scale[blk.hk];
        v_head_scale = prm.v_scale[blk.hk];
    }

    fa_kv_issue_q<Cfg>(prm, blk, q_smem, tid / Cfg::CHUNKS, tid % Cfg::CHUNKS, prm.head_dim / 8); /* 2. */
    const fa_kvq_tile_loader<Cfg> ld(prm, blk, raw_smem);
    /* Prologue: the rows of tiles 0 .. STAGES-1 and the zeroed row ends, a barrier, the copies of
     * tiles 0 .. STAGES-2 (one commit each, empty or not: the wait counts of the loop and of
     * fa_kv_land_q are constants). Group order: Q, tile 0, tile 1, ... */
#pragma unroll
    for (int st = 0; st < STAGES; ++st)
        if (st < blk.n_tiles) ld.store_row(st, tid, ld.fetch_row(blk.tile_first + st, tid));
    ld.zero_row_ends(tid);
    __syncthreads(); /* the rows visible to every copying thread */
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (st < blk.n_tiles) ld.issue(st, tid);
        cp_async_commit_group();
    }

    fa_kv_land_q<Cfg, Cvt>(prm, blk, q_smem, 0, tid);
    fa_kvq_regs_build_q<Elem, Cfg>(q_smem, qf_smem, q_row_mul, tid);
    uint32_t q_rmem[Cfg::Q_IN_REGS ? Cfg::K_STEPS : 1][4];
    if (Cfg::Q_IN_REGS) {
#pragma unroll
        for (int ks = 0; ks < (Cfg::Q_IN_REGS ? Cfg::K_STEPS : 1); ++ks)
            ld_shared_v4_b32(q_rmem[ks], qf_smem + 16 * (ks * 32 + lane));
    }
    /* the factor of the scores of the lane's rows g, g + 8: the bf16 row's 2^-e, times the e4m3
     * K scale (int8: the column's scale comes per tile) */
    float row_k_mul[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float unscale = BF16 ? __uint_as_float(0x7f000000u - __float_as_uint(q_row_mul[quad_row + 8 * h])) : 1.0f;
        row_k_mul[h] = unscale * k_head_scale;
    }

    /* int8: FA_KVQ_I8_OFFSET · Σ of the f16 query elements of the lane's rows, the scores' offset */
    float row_offset[2] = {0.0f, 0.0f};
    if (INT8) {
#pragma unroll
        for (int ks = 0; ks < Cfg::K_STEPS; ++ks) {
            uint32_t a[4];
            if (Cfg::Q_IN_REGS) {
#pragma unroll
                for (int x = 0; x < 4; ++x) a[x] = q_rmem[Cfg::Q_IN_REGS ? ks : 0][x];
            } else {
                ld_shared_v4_b32(a, qf_smem + 16 * (ks * 32 + lane));
            }
#pragma unroll
            for (int x = 0; x < 4; ++x) /* a[0], a[2]: row g; a[1], a[3]: row g + 8 */
                row_offset[x % 2] += __half2float(__ushort_as_half((unsigned short)(a[x] & 0xffffu))) +
                                     __half2float(__ushort_as_half((unsigned short)(a[x] >> 16)));
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) row_offset[h] = FA_KVQ_I8_OFFSET * fa_quad_sum(row_offset[h]);
    }

    /* The lane's ldmatrix rows. K (non-trans): matrix m = lane / 8 is slots 8·(m / 2) .. + 7 of
     * the warp at the chunk 2kp + m % 2, so r[j] / r[2 + j] are the B fragments of k16 step
     * 2kp + j for slots 0-7 / 8-15. V (trans): matrix m is slots 8·(m % 2) .. + 7 at the chunk
     * 2sp + m / 2, so r[2j] / r[2j + 1] give slots (2t, 2t+1) / (8 + 2t, 9 + 2t) of the 16-column
     * segment 2sp + j. */
    const int k_slot = warp * WARP_N + 8 * (lane / 16) + lane % 8, k_chunk_lo = (lane / 8) % 2;
    const int v_slot = warp * WARP_N + 8 * ((lane / 8) % 2) + lane % 8, v_chunk_lo = lane / 16;

    float o_rmem[Cfg::O_TILES][4];
#pragma unroll
    for (int ot = 0; ot < Cfg::O_TILES; ++ot)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_rmem[ot][e] = 0.0f;
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
    float row_sum[2] = {0.0f, 0.0f};                    /* this lane's share; quad-summed in the epilogue */
    uint32_t o_unit_bits[2] = {127u << 23, 127u << 23}; /* int8: O's rows in units 2^E, these bits */
    float o_ones[4] = {0.0f, 0.0f, 0.0f, 0.0f};         /* int8: Σ P per row (a P·V column of ones), as O */
    const float score_mul = prm.score_mul;

    for (int it = 0; it < blk.n_tiles; ++it) {
        cp_async_wait_group<STAGES - 2>(); /* raw tile it landed (this thread's copies)       */
        __syncthreads();                   /* everyone's; every warp finished tile it-1, so raw
                                              stage it-1 can be refilled                       */
        const int next = it + STAGES - 1;
        if (next < blk.n_tiles) ld.issue(next % STAGES, tid);
        cp_async_commit_group();
        const bool more = next + 1 < blk.n_tiles;
        fa_kvq_row pending = {-1, 0};
        if (more) pending = ld.fetch_row(blk.tile_first + next + 1, tid); /* consumed after the compute */

        const uint32_t stage_addr = raw_smem + (it % STAGES) * Cfg::RAW_STAGE_BYTES;
        const int cw = (blk.tile_first + it) * BLOCK_N + warp * WARP_N;

        /* S = Q Kᵀ of the warp's 16 slots: s_rmem[nt][e] = (row g + 8·(e>>1), slot 8nt + 2t + (e&1)) */
        float s_rmem[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s_rmem[nt][e] = 0.0f;
#pragma unroll
        for (int kp = 0; kp < Cfg::K_STEPS / 2; ++kp) {
            uint32_t r[4];
            ldmatrix_x4(r, stage_addr + Cfg::raw_offset(k_slot, 16 * (2 * kp + k_chunk_lo)));
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int ks = 2 * kp + j;
                uint32_t a[4];
                if (Cfg::Q_IN_REGS) {
#pragma unroll
                    for (int x = 0; x < 4; ++x) a[x] = q_rmem[Cfg::Q_IN_REGS ? ks : 0][x];
                } else {
                    ld_shared_v4_b32(a, qf_smem + 16 * (ks * 32 + lane));
                }
                uint32_t b0[2], b1[2];
                fa_kvq_k_frag<QUANT>(r[j], b0);
                fa_kvq_k_frag<QUANT>(r[2 + j], b1);
                fa_f16::mma(s_rmem[0], a, b0);
                fa_f16::mma(s_rmem[1], a, b1);
            }
        }
        /* the true scores: the K scale per column (int8) or head (e4m3), the bf16 rows' 2^-e */
        if (INT8) {
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                const float2 ks =
                    ld_shared_v2_f32(stage_addr + Cfg::OFF_SCALES + 4 * (warp * WARP_N + 8 * nt + 2 * quad_col));
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    s_rmem[nt][2 * h] = (s_rmem[nt][2 * h] - row_offset[h]) * row_k_mul[h] * ks.x;
                    s_rmem[nt][2 * h + 1] = (s_rmem[nt][2 * h + 1] - row_offset[h]) * row_k_mul[h] * ks.y;
                }
            }
        } else {
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s_rmem[nt][e] *= row_k_mul[e / 2];
        }
        fa_kv_score_transform<Cfg, false>(prm, blk, cw, quad_col, s_rmem, fa_mods_arg<false>{});

        /* int8: the V scales of the lane's slots */
        float2 v_scale[2] = {make_float2(1.0f, 1.0f), make_float2(1.0f, 1.0f)};
        if (INT8) {
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
                v_scale[nt] = ld_shared_v2_f32(stage_addr + Cfg::OFF_SCALES +
                                               4 * (BLOCK_N + warp * WARP_N + 8 * nt + 2 * quad_col));
        }

        /* Online softmax in base 2 (fa_kv_softmax_pv) to the f16 A fragment of the k16 step.
         * int8: the probabilities times their V scales, p·vs, relative to a unit 2^E per row
         * (and warp) so that the largest of the tile lands in [1, 2) and f16 keeps it at full
         * precision; O is kept in units 2^E. The unit stays while the running max does and the
         * tile's largest p·vs lies within [2^-8, 2^5) of it; otherwise it becomes the tile's (the
         * old unit, times the softmax rescale, stays the floor up to a factor 2^64 so that O's
         * move to the new unit cannot overflow). O is rescaled only when some lane's factor
         * (softmax rescale times unit change) is not 1. */
        uint32_t p_frag[4];
        float o_rescale[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float tile_max =
                fmaxf(fmaxf(s_rmem[0][2 * h], s_rmem[0][2 * h + 1]), fmaxf(s_rmem[1][2 * h], s_rmem[1][2 * h + 1]));
            tile_max = fa_quad_max(tile_max);
            float max_scaled;
            const float rescale = fa_online_max_step(row_max[h], tile_max, score_mul, max_scaled);
            float p[2][2], sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                p[nt][0] = ex2_approx_ftz_f32(fmaf(s_rmem[nt][2 * h], score_mul, -max_scaled));
                p[nt][1] = ex2_approx_ftz_f32(fmaf(s_rmem[nt][2 * h + 1], score_mul, -max_scaled));
                sum += p[nt][0] + p[nt][1];
            }
            row_sum[h] = fmaf(row_sum[h], rescale, sum);
            o_rescale[h] = rescale;
            if (INT8) {
                float m = 0.0f;
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    p[nt][0] *= v_scale[nt].x;
                    p[nt][1] *= v_scale[nt].y;
                    m = fmaxf(m, fmaxf(fabsf(p[nt][0]), fabsf(p[nt][1])));
                }
                const uint32_t tile_bits = __float_as_uint(fa_quad_max(m)) & 0x7f800000u; /* 2^floor(log2 m) */
                const bool tile_ok = tile_bits != 0u && tile_bits <= (253u << 23);        /* normal, below 2^126 */
                const uint32_t old_bits = o_unit_bits[h];
                uint32_t unit_bits = old_bits;
                const float frame = __uint_as_float(old_bits) * rescale; /* the old unit, rescaled */
                if (!(rescale == 1.0f &&
                      (!tile_ok || (tile_bits + (8u << 23) >= old_bits && tile_bits <= old_bits + (4u << 23))))) {
                    const uint32_t frame_bits = __float_as_uint(frame) & 0x7f800000u;
                    const uint32_t floor_bits = frame_bits > (64u << 23) ? frame_bits - (64u << 23) : 0u;
                    unit_bits = tile_ok ? max(tile_bits, floor_bits) : frame_bits != 0u ? frame_bits : old_bits;
                }
                const float inv_unit = __uint_as_float(0x7f000000u - unit_bits); /* 2^-E */
                o_rescale[h] = frame * inv_unit;
                o_unit_bits[h] = unit_bits;
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    p[nt][0] *= inv_unit;
                    p[nt][1] *= inv_unit;
                }
            }
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) p_frag[2 * nt + h] = fa_f16::pack2(p[nt][0], p[nt][1]);
        }
        if (__any_sync(0xffffffffu, o_rescale[0] != 1.0f || o_rescale[1] != 1.0f)) {
#pragma unroll
            for (int ot = 0; ot < Cfg::O_TILES; ++ot) {
                o_rmem[ot][0] *= o_rescale[0];
                o_rmem[ot][1] *= o_rescale[0];
                o_rmem[ot][2] *= o_rescale[1];
                o_rmem[ot][3] *= o_rescale[1];
            }
            if (INT8) {
                o_ones[0] *= o_rescale[0];
                o_ones[1] *= o_rescale[0];
                o_ones[2] *= o_rescale[1];
                o_ones[3] *= o_rescale[1];
            }
        }

        /* O += P V: n-tile 2s + delta of O is columns 16s + 2n + delta (n = 0..7) */
        const uint32_t v_tile = stage_addr + Cfg::RAW_TILE_BYTES;
        if (INT8) {
            const uint32_t ones[2] = {0x3c003c00u, 0x3c003c00u};
            fa_f16::mma(o_ones, p_frag, ones);
        }
#pragma unroll
        for (int sp = 0; sp < Cfg::O_TILES / 4; ++sp) {
            uint32_t r[4];
            ldmatrix_x4_trans(r, v_tile + Cfg::raw_offset(v_slot, 16 * (2 * sp + v_chunk_lo)));
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                uint32_t b_col0[2], b_col1[2];
                fa_kvq_v_pairs<QUANT>(r[2 * j], b_col0[0], b_col1[0]);
                fa_kvq_v_pairs<QUANT>(r[2 * j + 1], b_col0[1], b_col1[1]);
                fa_f16::mma(o_rmem[2 * (2 * sp + j)], p_frag, b_col0);
                fa_f16::mma(o_rmem[2 * (2 * sp + j) + 1], p_frag, b_col1);
            }
        }
        /* stage (next + 1) % STAGES = it % STAGES: its rows were last read by tile it's copies */
        if (more) ld.store_row((next + 1) % STAGES, tid, pending);
    }

    /* O in its true units: less the int8 offset, times 2^E per row (int8) or the e4m3 V scale */
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float o_unit = INT8 ? __uint_as_float(o_unit_bits[h]) : v_head_scale;
        const float o_offset = INT8 ? FA_KVQ_I8_OFFSET * o_ones[2 * h] : 0.0f;
#pragma unroll
        for (int ot = 0; ot < Cfg::O_TILES; ++ot) {
            o_rmem[ot][2 * h] = (o_rmem[ot][2 * h] - o_offset) * o_unit;
            o_rmem[ot][2 * h + 1] = (o_rmem[ot][2 * h + 1] - o_offset) * o_unit;
        }
    }
    fa_kv_merge_warps<Elem, Cfg, true>(prm, blk, qf_smem, o_rmem, row_max, row_sum, tid, score_mul); /* 4. */
    if (prm.num_splits == 1) return;
    if (fa_kv_claim_merge(prm, blk, tid)) fa_kv_merge_splits<Elem, Cfg>(prm, blk, qf_smem, tid); /* 6. */
}

/* Launch the kernel of format QUANT on `stream`: Q8_0 the shared-memory kernel, int8 / e4m3 the
 * register one. The > 48 KiB dynamic shared-memory opt-in is set once per device ordinal and
 * instantiation (a bit per ordinal < 64, set after success). */
template <class Elem, int HEAD_DIM, int QUANT>
static fa_status fa_kvq_launch_format(const fa_kv_params *prm, int device_ordinal, cudaStream_t stream,
                                      const char *name) {
    constexpr bool REGS = QUANT != FA_KV_Q8_0;
    constexpr size_t SMEM = REGS ? fa_kvq_regs_config<HEAD_DIM>::SMEM_BYTES : fa_kvq_config<HEAD_DIM>::SMEM_BYTES;
    void (*kernel)(const fa_kv_params) = nullptr;
    if constexpr (REGS) kernel = fa_kvq_regs_kernel<Elem, HEAD_DIM, QUANT>;
    else kernel = fa_kvq_kernel<Elem, HEAD_DIM>;
    static unsigned long long smem_configured = 0; /* bit i: device i done */
    const unsigned long long bit = device_ordinal >= 0 && device_ordinal < 64 ? 1ull << device_ordinal : 0ull;
    if (SMEM > 48 * 1024 && (bit == 0 || !(__atomic_load_n(&smem_configured, __ATOMIC_ACQUIRE) & bit))) {
        FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM), name);
        __atomic_fetch_or(&smem_configured, bit, __ATOMIC_RELEASE);
    }
    const dim3 grid((unsigned)prm->row_tiles * (unsigned)prm->num_splits, (unsigned)prm->heads_kv,
                    (unsigned)prm->batch);
    kernel<<<grid, 32 * FA_KV_WARPS, SMEM, stream>>>(*prm);
    FA_CUDA_CHECK_LAUNCH(name);
    return FA_OK;
}

/* Launch the kernel of prm->kv_quant. */
template <class Elem, int HEAD_DIM>
static fa_status fa_kvq_launch(const fa_kv_params *prm, int device_ordinal, cudaStream_t stream, const char *name) {
    switch (prm->kv_quant) {
    case FA_KV_Q8_0: return fa_kvq_launch_format<Elem, HEAD_DIM, FA_KV_Q8_0>(prm, device_ordinal, stream, name);
    case FA_KV_INT8: return fa_kvq_launch_format<Elem, HEAD_DIM, FA_KV_INT8>(prm, device_ordinal, stream, name);
    default: return fa_kvq_launch_format<Elem, HEAD_DIM, FA_KV_FP8_E4M3>(prm, device_ordinal, stream, name);
    }
}

#endif /* FA_KVCACHE_QUANT_KERNEL_CUH */
