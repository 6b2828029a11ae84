/*
 * fwd_sm90.cu: the forward kernel for Hopper (sm_90a), FlashAttention-3's design in our
 * own code: TMA loads, wgmma, warp specialisation, ping-pong consumers, intra-warpgroup overlap.
 * Compiled for `arch=compute_90a,code=sm_90a` only (the Makefile's *_sm90a.cu rule); fwd.cu
 * calls fa_fwd_launch_hopper() on compute capability 9.0 for the problems
 * fa_hopper_fwd_unsupported() (sm90_tiles.h) accepts, and the portable kernels otherwise.
 *
 * Covers: f16 / bf16; d and dv multiples of 8 in 64..512 in a bucket (64, 128, 192 = 192 / 128, 256, 512;
 * columns up to the bucket read as zeros; 512 runs in CTA pairs, below, without packed tiles);
 * MHA / GQA / MQA; fixed-length and varlen batches; causal (bottom-right) and sliding windows; softcap; sink logits. O and LSE exactly as fa_forward
 * defines them (a row with no visible key: O = 0, LSE = -inf, or the sink's logit with a sink).
 * ALiBi and a negative scale: the LOG2 instantiations put the scores in log2 units before the
 * mask (fa_hopper_to_log2). Attention dropout: the DROPOUT instantiations (never packed), see
 * "Dropout" below. Score modifications (common/mods.cuh: bias, document ids, block-sparse masks;
 * buckets 128-256, bucket 64 on 128's, block masks in whole tiles, sm90_tiles.h): the MODS
 * instantiations (masks only, or with a bias: FA_HOPPER_MODS_*), in log2 units and unpacked;
 * with a block mask the key tiles walked are those of the query block's listed key blocks
 * (fa_mods_first_tile / fa_mods_prev_tile over the dense block map, by the producer, which
 * passes each tile's position to the consumers in a slot beside its K stage), full blocks
 * unmasked but for keys past the sequence, partial ones through fa_hopper_mods.
 *
 * One CTA = BLOCK_M query rows of one (batch, query head) (sm90_tiles.h: 192 at bucket 64, else
 * 128); one producer warpgroup and C = BLOCK_M / 64 consumer warpgroups (512 or 384 threads):
 *
 *   warpgroup 0, producer (setmaxnreg 24): one thread issues every TMA load. Q [BLOCK_M, bucket]
 *     once, then the tile range's key tiles from the last to the first, K_j and V_j
 *     [BLOCK_N, bucket] each into a STAGES-deep ring of shared-memory stages, in the order the
 *     consumers need them: K_0, K_1, V_0, K_2, V_1, ... (j counts tiles in processing order).
 *   warpgroups 1 .. C, consumers (setmaxnreg 240 with 2, 160 with 3): consumer c owns rows 64c .. 64c+63 of
 *     the tile. Per key tile j (FlashAttention-3's intra-warpgroup overlap, paper Alg. 2):
 *       issue S_j = Q K_jᵀ          (wgmma m64nBLOCK_Nk16, A = Q and B = K from smem, K-major)
 *       issue O += P_{j-1} V_{j-1}  (wgmma m64nBUCKETk16, A = P from registers, B = V MN-major)
 *       wait for S_j only; release K_j's stage; softcap; mask; online softmax of S_j (exp2, the
 *       scale in one FFMA) while the P·V wgmma still runs;
 *       wait for P·V; release V_{j-1}'s stage; O *= exp2(m_old - m_new); P_j = 16-bit(S_j).
 *     Ping-pong (bucket <= 128): named barriers make the consumers issue their GEMMs in turns
 *     (round robin), so one warpgroup's softmax overlaps another's GEMMs (paper §3.1).
 *     What runs: ptxas moves the operand-less P·V wait to the top of the softmax's basic block, so
 *     a warpgroup's softmax follows both of its GEMMs and only the other warpgroups' GEMMs cover
 *     it; the 16-bit kernels measured faster that way than with the wait held after the softmax.
 *     The fp8 kernels at bucket 128 hold it there (Cfg::PV_WAIT_LATE, fa_hopper_order).
 *   Epilogue: sink, O /= rowsum, LSE by the lane holding column 0 of each row; O staged through
 *   shared memory (its own buffer at buckets 64/128, else this warpgroup's rows of the Q tile;
 *   same 128-byte swizzle), then written by a TMA store (the tensor map clips rows past seqlen_q
 *   and columns past dv; varlen: warpgroups whose 64 rows lie inside the sequence) or by 16-byte
 *   st.global of the valid rows (a varlen warpgroup at its sequence's end: the next sequence's
 *   rows follow).
 *
 * Grid (sm90_tiles.h's rules, fa_hopper_schedule): one CTA per tile (numbered longest first in
 * head groups under causal masks); persistent, one CTA per multiprocessor walking the tiles in
 * rounds of gridDim.x, snake order (fa_hopper_tile_index), for even tiles; or the dynamic schedule
 * for causal-like masks: CTA i takes tile i, then gridDim.x + atomicAdd(tile_counter, 1) (zeroed
 * before the launch) until the tiles run out, in the head-grouped longest-first numbering. The
 * producer alone decides the next tile and passes its index to the consumers in the tile slot
 * (written before its arrival on q_full, read after their wait; -1 ends the walk). With more than
 * one tile per CTA the producer loads the next tile's Q as soon as the consumers release Q's buffer
 * (q_empty: after their last S GEMM with an own O buffer, after the O store otherwise) and its
 * first K/V stages while they still run this tile's epilogue, so per-tile start-up latency hides
 * behind work.
 *
 * K/V multicast pairs (sm90_tiles.h's fa_hopper_fwd_kv_multicast: non-causal fixed-length tiles
 * at buckets 128-256, prm.kv_multicast): clusters of two CTAs, whose static walks take the
 * neighbouring query tiles of one head in every round; rank 0 issues each K tile and rank 1 each V
 * tile as a TMA multicast into both CTAs. Each producer still waits for its empty barrier and arms
 * its own full barrier with the whole tile's bytes (the peer's copy may land before or after the
 * arming, within the phase); each consumer warp frees a stage on both CTAs' empty barriers, so a
 * stage is refilled only when both CTAs are done with it. A cluster barrier at the end keeps
 * either CTA from exiting while the other may still load into it or arrive on its barriers.
 *
 * Shared-memory ring (full/empty mbarriers per stage, separate for K and V):
 *   k_full[s], v_full[s]: 1 arrival (the producer's arrive.expect_tx) + the TMA's bytes.
 *   k_empty[s], v_empty[s]: 4·C arrivals, lane 0 of each consumer warp, after that warp's
 *     wgmma.wait_group has retired the GEMM that read the stage; 8·C in the kernels that may
 *     multicast (each warp arrives once on its own CTA's and once on the peer's, or twice on its
 *     own without multicast).
 *   Use u of stage s (u = g / STAGES, g counting key tiles across the CTA's query tiles) is
 *   phase u: consumers wait full[s] with parity u & 1; the producer waits empty[s] with parity
 *   (u & 1) ^ 1, which passes at once for u = 0. q_full / q_empty: phase = query tiles done.
 *
 * Every tile in shared memory (Q and K: DQK/64, V and O: DV/64) is slabs of [rows, 64] 16-bit
 * elements (128-byte rows), 1024-byte aligned, 128-byte swizzled; the slab layout and the wgmma
 * descriptors are documented in src/cuda/common/ptx.cuh's Hopper section. The TMA maps view a tensor as 4-D
 * {d, rows, heads, batch} (innermost first; varlen: {d, total, heads, 1}); one box
 * {64, rows, 1, 1} at column 64·s lands as slab s, zero-filled past the last column and, for a
 * fixed-length batch, past the sequence's last row.
 *
 * CTA pairs (bucket 512, Cfg::CTAS = 2; sm90_tiles.h's fa_hopper_fwd_cluster_ctas): a thread-block
 * cluster of two CTAs per query tile (blockIdx.x = 2t + r for tile t, one tile per cluster: never
 * persistent or dynamic). CTA r (cluster rank) is the bucket-256 tile on head-dim columns 256r ..
 * 256r + 255: it loads those columns of Q, K and V (TMA boxes at column 256r + 64s), so its S GEMM
 * gives partial scores; each consumer sends its partial S to the same consumer of the peer and adds
 * the peer's (cuda_common.cuh's fa_pair_exchange: st.async into the peer's receive buffer, counted
 * on its xchg_full mbarrier, the buffer freed by remote arrivals on xchg_free) right after the S
 * wait, while its P·V GEMM still runs; both CTAs then hold the same S (a + b = b + a) and run the
 * same mask, softmax and dropout bits, and CTA r accumulates and stores O's columns 256r ... LSE by
 * rank 0. 64-key tiles (Q 64 KiB, 2 stages of K and V 32 KiB each, receive buffers 32 KiB), O
 * staged in Q's buffer. Nothing is sent to the peer after its last message, so a CTA may exit
 * without a cluster barrier.
 *
 * Packed GQA/MQA tiles (template flag PACK; sm90_tiles.h's fa_hopper_pack_gqa decides, fixed-length
 * batches with seqlen_q <= BLOCK_M / 2 only): one CTA = the seqlen_q rows of pack_heads consecutive
 * query heads of one kv head, tile row r = g·pack_rows + i (pack_rows = seqlen_q rounded up to 8)
 * being query row i of head head_first + g, so one K/V stream serves the whole group. Q: one TMA
 * box {64, pack_rows, 1, 1} per head and slab (a map of its own), at slab row g·pack_rows, a
 * multiple of 8 rows: every head starts on a 1024-byte swizzle atom and the slab's layout is the
 * unpacked one; rows i >= seqlen_q are the box's zero fill; rows past the tile's last head keep
 * whatever the buffer held (finite or not: every operation on them stays in their own row, and
 * nothing of them is stored). The mask uses i, not r; LSE, the sink and O go per (head, i); O by
 * 16-byte st.global from the staging tile (as a varlen sequence's end). The unpacked instantiations are the code
 * they were (PACK = false compiles the packed branches out).
 *
 * Varlen: a tile may run past its sequence into the next one (or into the rows after the last
 * sequence, which may hold anything, NaN included). Those query rows are computed and dropped;
 * those keys are masked (their scores are overwritten with -inf); those V rows are zeroed in
 * shared memory before the P·V that would read them (P = 0 there, but 0 · NaN = NaN).
 *
 * Dropout (template flag DROPOUT; off, the kernel is the code it was): the wgmma accumulator of a
 * warp is, per 8 key columns, an mma.sync m16n8 C fragment, so common/dropout.cuh's
 * fa_dropout_keep_qk4 gives the keep bits of four such chunks with one Philox call per lane (the
 * 16 numbers of one (row, 16 keys) group; bucket 256's 80 keys end with a qk2 call of two
 * chunks). A tile's BLOCK_N / 2 bits (bit i for s_rmem[i]) are two words. At bucket 128
 * (DROPOUT_SPLIT) the first is drawn right after the tile's GEMMs are issued, while the warp
 * would otherwise wait for S (integer work under the tensor cores'), and the second inside the
 * softmax between the row maxima and the exponentials (fa_hopper_softmax's mid hook: in one basic
 * block with them, its Philox chains fill their latency; with both before the S wait, the draws
 * outlasted the S GEMM). The first tile, and every tile at buckets 192 and 256, draws both right
 * after the GEMM issue; at bucket 64 (three consumers at 160 registers) after the P·V wait
 * (DROPOUT_LATE). After the online softmax has added P to the row sums, the dropped elements of
 * P are zeroed, and the epilogue folds 1 / (1 - p) into O's scale: O =
 * Σ Z∘P·V / Σ P, LSE the one without dropout (as the portable kernels and the CPU engine). The
 * draws stay in the consumer warps: the producer warpgroup's three idle warps cannot draw a tile's
 * 32 warp-calls as fast as eight consumer warps partly under their GEMMs (a keep-bit ring filled
 * by them was slower in each of the four variants measured, docs/tuning-log.md).
 *
 * fp8 e4m3 inputs (template argument FP8 non-zero, buckets 64 / 128 / 256, o bf16; sm90_tiles.h's
 * fp8 section):
 * Q and K tiles hold 128 (bucket 64: 64, in the 64-byte swizzle) e4m3 columns per slab row; S and
 * P·V are e4m3 wgmma (k32); P goes to e4m3 straight from the accumulator registers, four per
 * register as they stand (fa_hopper_convert_p), and P·V reads Vᵀ, [dv rows][128 keys] per tile in
 * the slot order that makes those registers the A fragment. With FP8 = FA_HOPPER_FP8_VT_IN_KERNEL
 * (buckets 64 and 128, short problems: fwd.cu decides) the producer warpgroup's idle warps write
 * each Vᵀ tile from V as stored (fa_hopper_fp8_transpose_v, keys past the sequence zeroed); with
 * FA_HOPPER_FP8_VT_PREPASS it comes from the pre-pass at the end of this file, each sequence's Vᵀ
 * zero-padded to whole tiles. Either way varlen needs no V zeroing in the consumers.
 * q_descale · k_descale fold into the tile's score multiplier (fa_hopper_muls), v_descale into o's
 * normalisation. Not with PACK, LOG2, DROPOUT or MODS.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>
#include <math_constants.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/common/cuda_common.cuh"
#include "cuda/common/dropout.cuh"
#include "cuda/common/fwd_tiles.h"
#include "cuda/common/fwd_launch.h"
#include "cuda/common/mods.cuh"
#include "cuda/common/sm90_tiles.h"
#include "cuda/common/tma.h"

/* ---- configuration --------------------------------------------------------------------------- */

/* The score-modification instantiations (the kernel's MODS_KIND): none; masks only (block map,
 * document ids, partial-block bits); or masks and a bias, whose 32 early-loaded registers per
 * thread and loads the masks-only kernels leave out (ptxas then keeps their loop state in
 * registers). */
enum { FA_HOPPER_MODS_NONE = 0, FA_HOPPER_MODS_MASKS = 1, FA_HOPPER_MODS_BIAS = 2 };

/* The input kind of a forward kernel (its FP8 template argument): 16-bit; fp8 with Vᵀ from the
 * pre-pass; fp8 with V transposed in the kernel (sm90_tiles.h, fa_hopper_fp8_vt_in_kernel). */
enum { FA_HOPPER_16BIT = 0, FA_HOPPER_FP8_VT_PREPASS = 1, FA_HOPPER_FP8_VT_IN_KERNEL = 2 };

template <int BUCKET, int FP8 = FA_HOPPER_16BIT>
struct fa_hopper_config {
    /* bucket 512: a pair of CTAs (cluster ranks 0, 1), each on 256 of the head-dim columns; DQK and
     * DV are one CTA's columns */
    static constexpr int CTAS = fa_hopper_fwd_cluster_ctas(BUCKET);
    static constexpr int DQK = fa_hopper_cta_dqk(BUCKET), DV = fa_hopper_cta_dv(BUCKET);
    static constexpr int BLOCK_M = fa_hopper_block_m(BUCKET);
    static constexpr int BLOCK_N = FP8 ? fa_hopper_fp8_block_n(BUCKET) : fa_hopper_block_n(BUCKET);
    static constexpr int STAGES = fa_hopper_stages(BUCKET);
    static constexpr bool PINGPONG = fa_hopper_pingpong(BUCKET) != 0;
    /* Q and K: bytes and elements per slab row, 128-byte rows in the 128-byte swizzle (16-bit: 64
     * elements, fp8: 128), or for fp8 at bucket 64 64-byte rows in the 64-byte swizzle; O and V
     * (16-bit) are slabs of 64 elements in 128-byte rows either way */
    static constexpr int QK_ROW_BYTES = FP8 && DQK == 64 ? 64 : 128;
    static constexpr int SLAB_COLS = FP8 ? QK_ROW_BYTES : 64;
    static constexpr uint32_t QK_ATOM_BYTES = 8 * QK_ROW_BYTES; /* 8 rows: the SBO of K-major Q and K */
    /* k-steps of the GEMMs: k16 for 16-bit inputs, k32 for fp8 (32 bytes of a 128-byte row either
     * way); P's A fragments, one per k-step of P·V */
    static constexpr int K_STEP = FP8 ? 32 : 16;
    static constexpr int P_STEPS = BLOCK_N / K_STEP;
    static constexpr int CONSUMER_WGS = fa_hopper_consumers(BUCKET);
    static constexpr int THREADS = 128 * (1 + CONSUMER_WGS);
    /* fp8 with V transposed in the kernel: the staging ring below, and the producer warpgroup's
     * warps 1-3 write the staged V into the Vᵀ stage */
    static constexpr bool VT_IN_KERNEL = FP8 == FA_HOPPER_FP8_VT_IN_KERNEL;
    /* registers per thread after setmaxnreg: the producer gives back what the consumers take. With
     * V transposed in the kernel, bucket 64 gives the producer warpgroup 56 (8 from each of the 3
     * consumers' 160: its transposing warps keep two steps in flight), bucket 128 keeps the
     * consumers' 240 (one step in flight fits the producer's 24; the consumers' 240 were worth
     * more than the second step: docs/tuning-log.md) */
    static constexpr int PRODUCER_REGS = VT_IN_KERNEL && CONSUMER_WGS == 3 ? 56 : 24;
    static constexpr int CONSUMER_REGS = CONSUMER_WGS == 2 ? 240 : (VT_IN_KERNEL ? 152 : 160);
    /* transposing steps in flight (fa_hopper_fp8_transpose_full) */
    static constexpr int VT_STEPS_IN_FLIGHT = PRODUCER_REGS >= 40 ? 2 : 1;
    static constexpr int SLABS_QK = DQK / SLAB_COLS;     /* 128-byte-row slabs of Q and K       */
    static constexpr int SLABS_V = DV / 64;              /* 64-column slabs of V (16-bit) and O */
    static constexpr uint32_t Q_SLAB_BYTES = BLOCK_M * QK_ROW_BYTES;
    static constexpr uint32_t KV_SLAB_BYTES = BLOCK_N * QK_ROW_BYTES; /* K (and 16-bit V) slabs */
    static constexpr uint32_t O_SLAB_BYTES = BLOCK_M * 128;
    static constexpr uint32_t Q_BYTES = Q_SLAB_BYTES * SLABS_QK; /* also the Q loads' tx bytes */
    static constexpr uint32_t O_BYTES = O_SLAB_BYTES * SLABS_V;
    static constexpr uint32_t K_BYTES = KV_SLAB_BYTES * SLABS_QK; /* one K stage            */
    /* one V stage: [BLOCK_N, DV] 16-bit, or fp8 Vᵀ [DV, BLOCK_N] (one slab of DV 128-byte rows) */
    static constexpr uint32_t V_BYTES = FP8 ? DV * BLOCK_N : KV_SLAB_BYTES * SLABS_V;
    static constexpr bool O_OWN = FP8 || fa_hopper_o_own_buffer(BUCKET) != 0; /* O staged apart from Q */
    static constexpr uint32_t K_OFFSET = Q_BYTES;
    static constexpr uint32_t V_OFFSET = Q_BYTES + STAGES * K_BYTES;
    static constexpr uint32_t O_OFFSET = O_OWN ? V_OFFSET + STAGES * V_BYTES : 0;
    /* VT_IN_KERNEL: the staging ring, one V tile [BLOCK_N keys, DV] per stage as it is stored, in
     * K's layout and swizzle (DV = the 128- or 64-byte rows of Q and K at these buckets) */
    static constexpr uint32_t VRAW_BYTES = VT_IN_KERNEL ? BLOCK_N * DV : 0; /* one staging stage */
    static constexpr uint32_t VRAW_OFFSET = V_OFFSET + STAGES * V_BYTES + (O_OWN ? O_BYTES : 0);
    /* the producer warpgroup's warps 1-3, which write the staged V into the Vᵀ stage, a tile in
     * VT_STEPS steps of 16 columns of two 16-key groups (fa_hopper_fp8_transpose_v) */
    static constexpr int TRANSPOSE_THREADS = 96;
    static constexpr int VT_STEPS = (BLOCK_N / 32) * (DV / 16);
    /* the pair's receive buffers: [consumer][BLOCK_N / 8 float4][128 threads] fp32 (the peer's
     * partial S, cuda_common.cuh's partial-score layout) */
    static constexpr uint32_t X_OFFSET = VRAW_OFFSET + STAGES * VRAW_BYTES;
    static constexpr uint32_t X_BYTES = (uint32_t)fa_hopper_exchange_bytes(BUCKET);
    static constexpr uint32_t X_WG_BYTES = 128 * 4 * (BLOCK_N / 2); /* one consumer's message */
    static constexpr uint32_t BAR_OFFSET = X_OFFSET + X_BYTES;
    /* mbarriers: q_full, q_empty, k_full[S], v_full[S], k_empty[S], v_empty[S]; pair:
     * xchg_full[C], xchg_free[C]; VT_IN_KERNEL: vraw_full[S], vraw_empty[S] */
    static constexpr int NUM_BARRIERS = fa_hopper_fwd_barriers(BUCKET) + (VT_IN_KERNEL ? 2 * STAGES : 0);
    /* after the mbarriers: the 16-byte tile slot, the index of the tile the producer loads Q for
     * (-1: no more tiles; MODS: then its key-tile count, int32), written before its arrival on
     * q_full and read by the consumers after their wait; then one 16-byte position slot per stage
     * (MODS: the walk's position {tile, kb, entry} of the key tile in that K stage, written before
     * the arrival on k_full, read before the arrival on k_empty): the consumers never walk the
     * block map themselves, so its loads stay off their path */
    static constexpr uint32_t TILE_SLOT_OFFSET = BAR_OFFSET + 8 * NUM_BARRIERS;
    static constexpr uint32_t POS_SLOT_OFFSET = TILE_SLOT_OFFSET + 16;
    /* the P·V wait after the softmax (fa_hopper_order): after the slots, one 4-byte word per
     * consumer thread */
    static constexpr bool PV_WAIT_LATE = FP8 && fa_hopper_fp8_pv_wait_late(BUCKET) != 0;
    static constexpr uint32_t ORDER_OFFSET = POS_SLOT_OFFSET + 16 * STAGES;
    static constexpr uint32_t ORDER_BYTES = PV_WAIT_LATE ? 4 * 128 * CONSUMER_WGS : 0;
    static constexpr int EMPTY_ARRIVALS = 4 * CONSUMER_WGS; /* lane 0 of every consumer warp */
    /* q_empty: lane 0 of every consumer warp (the lane that read the tile slot) once its last S
     * GEMM has read Q (own O buffer), or once its warpgroup's O is out of the buffer it shares
     * with Q (thread 0 after the TMA store has read it; the others after the epilogue barrier) */
    static constexpr int Q_EMPTY_ARRIVALS = 4 * CONSUMER_WGS;
    static constexpr uint32_t SMEM_BYTES =
        (uint32_t)(FP8 ? fa_hopper_fp8_smem_bytes(BUCKET, VT_IN_KERNEL) : fa_hopper_smem_bytes(BUCKET));
    static constexpr int KEEP_WORDS = (BLOCK_N / 2 + 31) / 32; /* dropout: one bit per S element of a thread */
    /* dropout: with 3 consumers (160 registers) the keep bits are drawn after the P·V wait, when
     * P's 16-bit fragments are dead (drawn under the GEMMs, ptxas spilled 124-300 bytes) */
    static constexpr bool DROPOUT_LATE = CONSUMER_WGS == 3;
    /* dropout: the second keep word drawn inside the softmax at bucket 128 (the file comment); at
     * 192 and 256 ptxas 13 spilled 56-100 bytes that way, 12-40 with both words before the S wait */
    static constexpr bool DROPOUT_SPLIT = BUCKET == 128;

    static_assert(ORDER_OFFSET + ORDER_BYTES + 1024 == SMEM_BYTES, "sm90_tiles.h smem formula");
    static_assert(TILE_SLOT_OFFSET % 16 == 0, "16-byte slots");
    static_assert(!FP8 || (BLOCK_N == 128 && DQK % SLAB_COLS == 0 && DV == DQK),
                  "fp8: one 128-byte Vᵀ row per dv column, whole Q/K slabs");
    static_assert(!VT_IN_KERNEL || (fa_hopper_fp8_vt_fits(BUCKET) && DV == QK_ROW_BYTES && DV % 32 == 0 && VRAW_BYTES % 1024 == 0 &&
                                    VRAW_OFFSET % 1024 == 0),
                  "fp8 V staging: one Q/K-layout row per key, whole 16-column transpose steps, swizzle atoms");
    static_assert(DQK % 64 == 0 && DV % 64 == 0 && DV <= DQK && DQK <= 256 && DV <= 256,
                  "bucket: whole 64-column slabs, wgmma N <= 256, O fits Q's buffer");
    static_assert(CTAS == 1 || (CTAS == 2 && X_BYTES == CONSUMER_WGS * X_WG_BYTES && DQK == DV && !O_OWN &&
                                !PINGPONG && NUM_BARRIERS == 2 + 4 * STAGES + 2 * CONSUMER_WGS),
                  "pair: one receive buffer per consumer; the same columns of Q / K and V / O per CTA; one "
                  "tile per cluster (O in Q's buffer, never persistent)");
    static_assert(BLOCK_N % 16 == 0 && BLOCK_N <= 256,
                  "key tile: whole k16 steps of P V (and pairs of 8-key dropout chunks); TMA box <= 256");
    static_assert(KV_SLAB_BYTES % 1024 == 0 && Q_SLAB_BYTES % 1024 == 0 && O_SLAB_BYTES % 1024 == 0,
                  "every slab starts on a 1024-byte swizzle atom (descriptor base offset 0)");
    static_assert(CONSUMER_WGS == 2 || CONSUMER_WGS == 3, "named barrier ids below: at most 3 consumers");
    static_assert(fa_hopper_regs_split_ok(THREADS, PRODUCER_REGS, CONSUMER_REGS),
                  "setmaxnreg: .dec / .inc from the launch cap, within the CTA's register pool");
    static_assert(SMEM_BYTES <= FA_HOPPER_SMEM_LIMIT, "H100/H200 opt-in shared memory per block");
};

/* Named barrier ids (0 is __syncthreads). */
enum fa_hopper_named_barrier {
    FA_HOPPER_BAR_SCHED_FIRST = 1,    /* 1 + c: consumer c may issue its GEMMs (256 threads: c and the
                                         consumer before it in the round robin)                      */
    FA_HOPPER_BAR_EPILOGUE_FIRST = 4, /* 4 + c: consumer c's O tile is in smem (128 threads)        */
    FA_HOPPER_BAR_V_TAIL = 7          /* varlen: V rows past the sequence zeroed (all consumers)    */
};

/* Kernel arguments besides the tensor maps: the forward's fa_fwd_params (q, k and v unread: the
 * tensor maps stand for them; transform_scores unread: softcap is the only transform here, see
 * score_mul) and the tile schedule. score_mul is overridden: log2 units per raw score,
 * scale·log2(e), or softcap·log2(e) after softcap's tanh. */
struct fa_hopper_params : fa_fwd_params {
    int64_t total_tiles;           /* num_m_blocks · heads_q · batch query tiles                    */
    /* dynamic schedule: a counter zeroed before the launch (device memory); CTA i takes tile i
     * first, then gridDim.x + atomicAdd(counter, 1) until the tiles run out. NULL: the static walk
     * (fa_hopper_tile_index) */
    unsigned int *tile_counter;
    int snake;                     /* fa_hopper_snake_order: every other round of tiles reversed    */
    int kv_multicast;              /* fa_hopper_fwd_kv_multicast: clusters of two CTAs share K/V loads */
    int tma_store;                 /* 1: O through the TMA store (varlen: warpgroups inside a sequence) */
    /* packed tiles (kernel template flag PACK) only: */
    int pack_rows;                 /* rows per query head in a tile: seqlen_q rounded up to 8       */
    int pack_heads;                /* query heads per tile (the last tile of a group may have fewer) */
    int pack_tiles;                /* tiles per (batch, kv head); total_tiles = b · heads_kv · this   */
    float log2_mul;                /* log2 units per raw (softcapped) score; the LOG2 kernels take it
                                      in fa_hopper_to_log2 and run the softmax with score_mul = 1   */
    fa_dropout_params dropout;     /* read by the DROPOUT kernels only                              */
    /* FP8 kernels only: the descale factors [batch, heads_kv] (device memory; NULL = 1) and Vᵀ's
     * first row of sequence b: vt_start[b] (varlen) or b · vt_seq_rows */
    const float *q_descale, *k_descale, *v_descale;
    const int *vt_start;
    int vt_seq_rows;
};

/* The multipliers a tile's scores go through: softcap's pre-tanh factor, the log2-unit factor
 * (LOG2 kernels) and the softmax's score_mul; fp8 folds q_descale · k_descale into the first of
 * them that applies. */
struct fa_hopper_muls {
    float softcap_pre, log2_mul, score_mul;
};

/* ---- device functions ------------------------------------------------------------------------ */

/* Keeps the P·V wait after the softmax (Cfg::PV_WAIT_LATE). ptxas places a wgmma.wait_group (no
 * operands) as early in its basic block as it likes and puts the P·V wait above the whole softmax,
 * so a warpgroup's exponentials never overlap its own P·V GEMM. The 16-bit kernels are faster that
 * way (docs/tuning-log.md); at fp8 bucket 128 a tile's GEMMs take half the time and the softmax no
 * longer fits under the other warpgroup's alone. A shared-memory store of the softmax's last
 * result stays ahead of the wait (ptxas keeps the two in order); each consumer thread stores to its
 * own word (order_word), which nothing reads. */
__device__ __forceinline__ void fa_hopper_order(uint32_t order_word, float x) {
    st_shared_b32(order_word, __float_as_uint(x));
}

template <bool BF16>
__device__ __forceinline__ uint32_t fa_hopper_pack2(float lo, float hi) {
    return BF16 ? cvt_rn_bf16x2_f32(lo, hi) : cvt_rn_f16x2_f32(lo, hi);
}

/* S = Q K_jᵀ for this consumer's 64 rows: DQK/K_STEP wgmma (k16 steps over the head dim, k32
 * for fp8; bucket 512: this CTA's 256 columns of it, partial scores). A = Q rows [64c, 64c+64) at
 * q_wg, B = the K stage's slabs at k_tile, both K-major: step kk reads slab kk/4 at +32·(kk%4)
 * bytes (32 bytes of a 128-byte row for either element size). The first step has scale-d = 0 (S
 * is overwritten). Issued and committed as one wgmma group; nothing waits here. */
template <class Cfg, bool BF16, bool FP8>
__device__ __forceinline__ void fa_hopper_issue_qk(float (&s_rmem)[Cfg::BLOCK_N / 2], uint32_t q_wg, uint32_t k_tile) {
    const uint64_t q_desc = Cfg::QK_ROW_BYTES == 64 ? wgmma_desc_sw64(q_wg, 16, Cfg::QK_ATOM_BYTES)
                                                   : wgmma_desc_sw128(q_wg, 16, Cfg::QK_ATOM_BYTES);
    const uint64_t k_desc = Cfg::QK_ROW_BYTES == 64 ? wgmma_desc_sw64(k_tile, 16, Cfg::QK_ATOM_BYTES)
                                                   : wgmma_desc_sw128(k_tile, 16, Cfg::QK_ATOM_BYTES);
#pragma unroll
    for (int i = 0; i < Cfg::BLOCK_N / 2; ++i) wgmma_fence_operand(s_rmem[i]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::DQK / Cfg::K_STEP; ++kk) {
        /* descriptors advance in 16-byte units in their low bits (start-address field) */
        constexpr int STEPS_PER_ROW = Cfg::QK_ROW_BYTES / 32;
        const uint64_t q_step = ((kk / STEPS_PER_ROW) * Cfg::Q_SLAB_BYTES + (kk % STEPS_PER_ROW) * 32) >> 4;
        const uint64_t k_step = ((kk / STEPS_PER_ROW) * Cfg::KV_SLAB_BYTES + (kk % STEPS_PER_ROW) * 32) >> 4;
        if constexpr (FP8)
            wgmma_ss_f32_e4m3<Cfg::BLOCK_N>(s_rmem, q_desc + q_step, k_desc + k_step, kk > 0 ? 1 : 0);
        else
            wgmma_ss_f32<Cfg::BLOCK_N, BF16>(s_rmem, q_desc + q_step, k_desc + k_step, kk > 0 ? 1 : 0);
    }
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < Cfg::BLOCK_N / 2; ++i) wgmma_fence_operand(s_rmem[i]);
}

/* O += P V_j: P_STEPS wgmma over the keys. 16-bit: k16 steps, A = P from registers (p_rmem[kk]
 * is the A fragment of keys 16kk .. 16kk+15, see src/cuda/common/ptx.cuh), B = the V stage at
 * v_tile read MN-major: LBO = slab stride (BLOCK_N·128 B), SBO = 1024 B (8 keys), k16 step =
 * +2048 B. fp8: k32 steps, B = the Vᵀ stage [DV rows][128 key bytes] K-major like K in S
 * (step kk at +32·kk bytes; the keys in Vᵀ's slot order, fa_hopper_fp8_vt_slot). One wgmma group;
 * nothing waits here. */
template <class Cfg, bool BF16, bool FP8>
__device__ __forceinline__ void fa_hopper_issue_pv(float (&o_rmem)[Cfg::DV / 2], uint32_t (&p_rmem)[Cfg::P_STEPS][4],
                                                   uint32_t v_tile) {
    const uint64_t v_desc = FP8 ? wgmma_desc_sw128(v_tile, 16, 1024) : wgmma_desc_sw128(v_tile, Cfg::KV_SLAB_BYTES, 1024);
#pragma unroll
    for (int i = 0; i < Cfg::DV / 2; ++i) wgmma_fence_operand(o_rmem[i]);
#pragma unroll
    for (int kk = 0; kk < Cfg::P_STEPS; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) wgmma_fence_operand(p_rmem[kk][x]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::P_STEPS; ++kk) {
        if constexpr (FP8)
            wgmma_rs_f32_e4m3<Cfg::DV>(o_rmem, p_rmem[kk], v_desc + ((kk * 32) >> 4), 1);
        else
            wgmma_rs_f32_transb<Cfg::DV, BF16>(o_rmem, p_rmem[kk], v_desc + ((kk * 2048) >> 4), 1);
    }
    wgmma_commit_group();
#pragma unroll
    for (int i = 0; i < Cfg::DV / 2; ++i) wgmma_fence_operand(o_rmem[i]);
}

/* One query tile of the persistent schedule and everything both roles derive from it. Tiles are
 * numbered 0 .. total_tiles-1: with heavy_first (causal-like masks) in head groups, longest
 * first within a group (fa_fwd_grouped_tile: the CTAs running together share K/V in L2, and the
 * hardware hands out the longest tiles first); otherwise the query block varies fastest
 * (neighbouring CTAs share K/V in L2). Packed tiles (one m block, m0 = 0): the tile of the
 * group varies fastest, then the kv head, then the batch. */
struct fa_hopper_work {
    int m0, head, batch, head_kv;  /* packed: head = the tile's first query head                    */
    int pack_heads;                /* packed: query heads in this tile                              */
    int len_q, len_k, shift;       /* shift = len_k - len_q: row i's diagonal key is i + shift     */
    int q_row, k_row, tma_batch;   /* TMA coordinates of the tile's first Q row / the sequence's K row 0 */
    int64_t q_start;               /* varlen: first packed row of the sequence                      */
    int tile_hi, n_tiles;          /* key tiles [tile_hi - n_tiles, tile_hi), processed last first;
                                      MODS with a block mask: tile_hi - 1 is the first, n_tiles
                                      the count of the listed blocks' tiles, walked downwards   */
    const int32_t *map_row;        /* MODS: the block-map row of the tile's query block, or NULL */
    int tiles_per_block, key_tiles; /* MODS with map_row: block_k / BLOCK_N, ceil(len_k / BLOCK_N) */
    int qb;                        /* MODS with map_row: the query block                          */
    fa_mods_k_pos first;           /* MODS: the walk's first position (tile tile_hi - 1; with
                                      map_row set by fa_hopper_walk_start, the producer's)         */
};

/* Scores to log2 units before the mask (template flag LOG2: ALiBi, or a negative scale without softcap): s·log2_mul - slope·log2(e)·|i + shift - key|
 * (the ALiBi term; skipped without ALiBi), so a masked -inf stays -inf and the max orders the
 * scores whatever the sign of the scale. Element layout as in fa_hopper_mask; packed rows take
 * their own head's slope. */
template <class Cfg, bool PACK>
__device__ __forceinline__ void fa_hopper_to_log2(float (&s_rmem)[Cfg::BLOCK_N / 2], const fa_hopper_params &prm,
                                                  float log2_mul, int batch, int head, int pack_heads, int n0, int row0,
                                                  const int (&pack_g)[2], const int (&pack_i)[2], int lane, int shift) {
    if (prm.alibi_slopes == nullptr) { /* no distance term (uniform): one FMUL per score, none for 1 */
        if (log2_mul != 1.0f) {
#pragma unroll
            for (int i = 0; i < Cfg::BLOCK_N / 2; ++i) s_rmem[i] *= log2_mul;
        }
        return;
    }
    const int col0 = n0 + 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int hq = head + (PACK ? min(pack_g[h], pack_heads - 1) : 0);
        const float slope = prm.alibi_slopes[(int64_t)batch * prm.alibi_batch_stride + hq] * 1.4426950408889634f;
        /* signed distance of local column 8j + c from the row's diagonal key: rel - (8j + c) */
        const float rel = (float)((PACK ? pack_i[h] : row0 + 8 * h) + shift - col0);
#pragma unroll
        for (int j = 0; j < Cfg::BLOCK_N / 8; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                float &x = s_rmem[4 * j + 2 * h + c];
                x = fmaf(x, log2_mul, -slope * fabsf(rel - (float)(8 * j + c)));
            }
    }
}

/* Online softmax of one S tile, base 2. For each of this thread's 2 rows: new max m (raw score
 * units, the quad's 4 lanes agree), alpha = 2^((m_old - m)·score_mul) (returned: O must be
 * multiplied by it), s <- 2^(s·score_mul - m·score_mul) in place (one FFMA + one MUFU.EX2 per
 * score), row_sum = row_sum·alpha + Σ s (this thread's columns only; the quad is summed once at
 * the end). A row whose max is still -inf uses 0 in place of m·score_mul: every exp2 is then
 * 2^-inf = 0 and no inf - inf appears. The maxima and sums run as ACC interleaved chains, not
 * one: a chain of BLOCK_N / 4 dependent FMNMX / FADD is latency the warp waits out on the path
 * to the P·V issue. mid() runs between the maxima and the exponentials, in the same basic block
 * as the exponentials, so its independent integer work (the dropout draws of the tile's second
 * half) fills their latency. */
struct fa_hopper_no_mid {
    __device__ __forceinline__ void operator()() const {}
};
template <class Cfg, class Mid = fa_hopper_no_mid>
__device__ __forceinline__ void fa_hopper_softmax(float (&s_rmem)[Cfg::BLOCK_N / 2], float (&row_max)[2],
                                                  float (&row_sum)[2], float (&alpha)[2], float score_mul,
                                                  const Mid &mid = Mid()) {
    constexpr int ACC = Cfg::BLOCK_N / 8 % 4 == 0 ? 4 : 2;
    static_assert(Cfg::BLOCK_N / 8 % ACC == 0, "whole rounds of the interleaved chains");
    float m_scaled[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        /* each chain starts from its first pair (chain 0 also takes the old max): no operation on
         * a -inf or zero seed */
        float m_acc[ACC];
#pragma unroll
        for (int j = 0; j < Cfg::BLOCK_N / 8; ++j) {
            const float pair = fmaxf(s_rmem[4 * j + 2 * h], s_rmem[4 * j + 2 * h + 1]);
            m_acc[j % ACC] = j >= ACC ? fmaxf(m_acc[j % ACC], pair) : j == 0 ? fmaxf(row_max[h], pair) : pair;
        }
#pragma unroll
        for (int a = 1; a < ACC; ++a) m_acc[0] = fmaxf(m_acc[0], m_acc[a]);
        const float m = fa_quad_max(m_acc[0]);
        m_scaled[h] = m == -CUDART_INF_F ? 0.0f : m * score_mul;
        alpha[h] = ex2_approx_ftz_f32(row_max[h] * score_mul - m_scaled[h]);
        row_max[h] = m;
    }
    mid();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float sum_acc[ACC];
#pragma unroll
        for (int j = 0; j < Cfg::BLOCK_N / 8; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const float p = ex2_approx_ftz_f32(fmaf(s_rmem[4 * j + 2 * h + c], score_mul, -m_scaled[h]));
                s_rmem[4 * j + 2 * h + c] = p;
                sum_acc[j % ACC] = j < ACC && c == 0 ? p : sum_acc[j % ACC] + p;
            }
#pragma unroll
        for (int a = 1; a < ACC; ++a) sum_acc[0] += sum_acc[a];
        row_sum[h] = fmaf(row_sum[h], alpha[h], sum_acc[0]);
    }
}

/* The bias of a tile at key n0 that can be loaded before its S GEMM is waited for (loads in flight
 * while the GEMM runs): no per-element rule (no document ids or partial-block bits), a 16-bit bias
 * in aligned pairs of keys, and the whole tile inside the keys. Pair p = 2j + h of this thread:
 * keys col0 + 8j, + 1 of row row0 + 8h (rows past the sequence read the last row's: they are
 * dropped), s_rmem[4j + 2h], [4j + 2h + 1]. */
template <class Cfg>
__device__ __forceinline__ bool fa_hopper_bias_early(const fa_mods_params &mp, const fa_hopper_work &w, int n0) {
    return mp.bias != nullptr && mp.doc_ids_q == nullptr && mp.partial_block_bits == nullptr &&
           fa_mods_bias_pairs_ok(mp) && n0 + Cfg::BLOCK_N <= w.len_k;
}
template <class Cfg>
__device__ __forceinline__ void fa_hopper_bias_load(uint32_t (&bias_rmem)[Cfg::BLOCK_N / 4], const fa_mods_params &mp,
                                                    const fa_hopper_work &w, int n0, int row0, int lane) {
    const int64_t base = w.batch * mp.bias_batch_stride + w.head * mp.bias_head_stride + n0 + 2 * (lane % 4);
    const int64_t row[2] = {base + (int64_t)min(row0, w.len_q - 1) * mp.bias_row_stride,
                            base + (int64_t)min(row0 + 8, w.len_q - 1) * mp.bias_row_stride};
    fa_mods_bias_load_pairs(mp, bias_rmem, [&](int p) { return row[p & 1] + 8 * (p >> 1); });
}

/* Score modifications (MODS, scores already in log2 units): the tile's block-map status decides
 * (pos: the walk's position of the tile at key n0, its key block and map entry).
 * A full block: only keys past len_k are masked (no window there); a partial block, or no block
 * mask: the element window (mods.elem_window_*), after a bias with contiguous keys (loaded early
 * into bias_rmem when fa_hopper_bias_early, else here, a chunk of loads at a time); with document
 * ids or partial-block bits (or a bias at the sequence's end or with strided keys) every element
 * goes through fa_mods_score (mods.cuh: the rule written down once), the bias in log2 units.
 * Element layout as in fa_hopper_mask. */
template <class Cfg, bool BIAS>
__device__ __forceinline__ void fa_hopper_mods(float (&s_rmem)[Cfg::BLOCK_N / 2], const fa_mods_params &mp,
                                               const fa_hopper_work &w, const fa_mods_k_pos &pos, bool varlen,
                                               int n0, int row0, int lane,
                                               const uint32_t (&bias_rmem)[BIAS ? Cfg::BLOCK_N / 4 : 1],
                                               bool bias_early) {
    const bool bias = BIAS && mp.bias != nullptr; /* BIAS = false: the instantiation without a bias */
    /* a full block inside the keys without a bias (uniform): nothing to do */
    if (w.map_row != nullptr && pos.entry == 1 && !bias && n0 + Cfg::BLOCK_N <= w.len_k) return;
    const fa_mods_tile t = fa_mods_tile_of(mp, w.batch, w.head, varlen, w.q_start, w.k_row, w.qb, pos.kb, pos.entry);
    const int no_pack[2] = {0, 0};
    const int col0 = n0 + 2 * (lane % 4);
    if (mp.doc_ids_q == nullptr && t.bits == nullptr &&
        (!bias || (mp.bias_col_stride == 1 && n0 + Cfg::BLOCK_N <= w.len_k))) {
        /* no per-element rule but the window: a bias with contiguous keys is added without the
         * element rule's tests, at a row's offset plus constants (rows past the sequence read the
         * last row's: they are dropped), then the mask overwrites with -inf */
        if constexpr (BIAS) {
            if (bias_early) fa_mods_bias_add_pairs(mp, s_rmem, bias_rmem, 1.4426950408889634f);
        }
        if (bias && !bias_early) {
            const int64_t row[2] = {t.bias_base + (int64_t)min(row0, w.len_q - 1) * mp.bias_row_stride + col0,
                                    t.bias_base + (int64_t)min(row0 + 8, w.len_q - 1) * mp.bias_row_stride + col0};
            /* element e = 4j + 2h + c: row h, key col0 + 8j + c */
            fa_mods_bias_add_chunked<8>(mp, s_rmem,
                                        [&](int e) { return row[(e >> 1) & 1] + 8 * (e >> 2) + (e & 1); },
                                        1.4426950408889634f);
        }
        if (t.status != FA_MODS_FULL)
            fa_hopper_mask<Cfg::BLOCK_N, false>(s_rmem, n0, row0, no_pack, lane, w.len_k, w.shift, mp.elem_window_left,
                                       mp.elem_window_right);
        else if (n0 + Cfg::BLOCK_N > w.len_k)
            fa_hopper_mask<Cfg::BLOCK_N, false>(s_rmem, n0, row0, no_pack, lane, w.len_k, w.shift, -1, -1);
        return;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int i = row0 + 8 * h, diag = i + w.shift;
        const int hi = mp.elem_window_right >= 0 ? min(w.len_k, diag + mp.elem_window_right + 1) : w.len_k;
        const int lo = mp.elem_window_left >= 0 ? diag - mp.elem_window_left : 0;
#pragma unroll
        for (int j = 0; j < Cfg::BLOCK_N / 8; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int key = col0 + 8 * j + c;
                float &x = s_rmem[4 * j + 2 * h + c];
                x = fa_mods_score<BIAS>(mp, t, i, key, i < w.len_q && key < w.len_k, key >= lo && key < hi, x,
                                        1.4426950408889634f);
            }
    }
}

/* Softcap, ALiBi, mask and online softmax of a ready S tile (the score path shared by every
 * round; pos: MODS, the walk's position of the tile; BIAS: MODS with a bias); mid:
 * fa_hopper_softmax's. */
template <class Cfg, bool PACK, bool LOG2, bool MODS, bool BIAS, class Mid = fa_hopper_no_mid>
__device__ __forceinline__ void fa_hopper_scores(float (&s_rmem)[Cfg::BLOCK_N / 2], float (&row_max)[2],
                                                 float (&row_sum)[2], float (&alpha)[2], const fa_hopper_params &prm,
                                                 const fa_hopper_muls &mul, const fa_mods_arg<MODS> &mods, const fa_hopper_work &w,
                                                 const fa_mods_k_pos &pos, bool needs_mask, int n0, int row0, const int (&pack_g)[2],
                                                 const int (&pack_i)[2], int lane,
                                                 const uint32_t (&bias_rmem)[BIAS ? Cfg::BLOCK_N / 4 : 1],
                                                 bool bias_early, const Mid &mid = Mid()) {
    const int len_k = w.len_k, shift = w.shift;
    if (prm.softcap_pre != 0.0f) {
#pragma unroll
        for (int i = 0; i < Cfg::BLOCK_N / 2; ++i) s_rmem[i] = fa_tanh(s_rmem[i] * mul.softcap_pre);
    }
    if constexpr (LOG2)
        fa_hopper_to_log2<Cfg, PACK>(s_rmem, prm, mul.log2_mul, w.batch, w.head, w.pack_heads, n0, row0, pack_g, pack_i, lane, shift);
    if constexpr (MODS) {
        static_assert(LOG2 && !PACK, "MODS: scores in log2 units, unpacked tiles");
        fa_hopper_mods<Cfg, BIAS>(s_rmem, mods, w, pos, prm.cu_seqlens_q != nullptr, n0, row0, lane, bias_rmem,
                                  bias_early);
    } else if (needs_mask) {
        fa_hopper_mask<Cfg::BLOCK_N, PACK>(s_rmem, n0, row0, pack_i, lane, len_k, shift, prm.window_left,
                                           prm.window_right);
    }
    fa_hopper_softmax<Cfg>(s_rmem, row_max, row_sum, alpha, mul.score_mul, mid);
}

/* Dropout keep bits of a key tile for this warp's 16 rows (query0: the first, in the sequence) and
 * the keys n0 .. n0 + BLOCK_N - 1: bit i % 32 of keep[i / 32] says s_rmem[i] is kept. Quad q of
 * 8-column chunks (4q .. 4q + 3) is one fa_dropout_keep_qk4 call (bit 4c + e = element e of chunk
 * 4q + c = s_rmem[16q + 4c + e]), so its 16 bits belong at bit 16q, and a last pair of chunks
 * (BLOCK_N = 80) is one fa_dropout_keep_qk2 call, 8 bits at 16·(BLOCK_N / 32). One word at a
 * time, all its calls in flight: keep[0] while the S GEMM runs, keep[1] inside the softmax (its
 * mid hook, DROPOUT_SPLIT), where the two Philox chains fill the exponentials' latency. */
template <class Cfg, int WORD>
__device__ __forceinline__ uint32_t fa_hopper_dropout_word(const fa_dropout_params &dp, int batch, int head, int heads_q,
                                                           int query0, int n0) {
    constexpr int QUADS = Cfg::BLOCK_N / 32, PAIR = Cfg::BLOCK_N % 32 / 16;
    static_assert(QUADS <= 4 && Cfg::BLOCK_N % 16 == 0 && Cfg::KEEP_WORDS == (Cfg::BLOCK_N > 64 ? 2 : 1),
                  "two words of keep bits (one for the 64-key tiles of bucket 512)");
    uint32_t word = 0;
#pragma unroll
    for (int q = 2 * WORD; q < 2 * WORD + 2 && q < QUADS; ++q)
        word |= fa_dropout_keep_qk4(dp, batch, head, heads_q, query0, n0 + 32 * q) << (16 * (q - 2 * WORD));
    if constexpr (PAIR != 0 && QUADS / 2 == WORD)
        word |= fa_dropout_keep_qk2(dp, batch, head, heads_q, query0, n0 + 32 * QUADS) << (16 * (QUADS % 2));
    return word;
}

template <class Cfg>
__device__ __forceinline__ void fa_hopper_dropout_bits(uint32_t (&keep)[Cfg::KEEP_WORDS], const fa_dropout_params &dp,
                                                       int batch, int head, int heads_q, int query0, int n0) {
    keep[0] = fa_hopper_dropout_word<Cfg, 0>(dp, batch, head, heads_q, query0, n0);
    if constexpr (Cfg::KEEP_WORDS == 2) keep[1] = fa_hopper_dropout_word<Cfg, 1>(dp, batch, head, heads_q, query0, n0);
}

/* P -> keep∘P (the row sums already hold P whole; 1 / (1 - p) is applied in the epilogue). */
template <class Cfg>
__device__ __forceinline__ void fa_hopper_dropout_apply(float (&s_rmem)[Cfg::BLOCK_N / 2],
                                                        const uint32_t (&keep)[Cfg::KEEP_WORDS]) {
#pragma unroll
    for (int i = 0; i < Cfg::BLOCK_N / 2; ++i)
        if (!((keep[i / 32] >> (i % 32)) & 1u)) s_rmem[i] = 0.0f;
}

/* P (fp32, accumulator layout) -> the A fragments of the P V GEMM. 16-bit: k-slice kk of keys
 * 16kk .. 16kk+15 is s_rmem[8kk .. 8kk+7], packed pairwise (see src/cuda/common/ptx.cuh). fp8:
 * k-slice kk of keys 32kk .. 32kk+31 is s_rmem[16kk .. 16kk+15]; the 8-bit A fragment holds 4
 * consecutive k of row r (a0, a2: k 4q.., 16+4q..) and of row r+8 (a1, a3), and this thread's
 * accumulator holds keys 8j + 2q + {0, 1}: register x packs the columns j = 2(x/2), 2(x/2)+1 of
 * row x%2 as they stand, which are the keys Vᵀ stores at those slots (fa_hopper_fp8_vt_slot). */
template <class Cfg, bool BF16, bool FP8>
__device__ __forceinline__ void fa_hopper_convert_p(const float (&s_rmem)[Cfg::BLOCK_N / 2],
                                                    uint32_t (&p_rmem)[Cfg::P_STEPS][4]) {
#pragma unroll
    for (int kk = 0; kk < Cfg::P_STEPS; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            if constexpr (FP8) {
                const int e = 16 * kk + 8 * (x / 2) + 2 * (x % 2); /* column j = 4kk + 2(x/2), row x%2 */
                p_rmem[kk][x] = cvt_rn_satfinite_e4m3x4_f32(s_rmem[e], s_rmem[e + 1], s_rmem[e + 4], s_rmem[e + 5]);
            } else {
                p_rmem[kk][x] = fa_hopper_pack2<BF16>(s_rmem[8 * kk + 2 * x], s_rmem[8 * kk + 2 * x + 1]);
            }
        }
}

/* Ping-pong turn-taking (see the file comment), round robin 0, 1, .., C-1, 0, ...: consumer c
 * waits on barrier SCHED_FIRST + c before issuing its GEMMs and then arrives on the next
 * consumer's barrier. The last consumer pre-arrives once on SCHED_FIRST (consumer 0 goes first)
 * and skips its arrival after its last round, so every barrier ends balanced (n syncs by its
 * consumer, n arrivals by the one before). Modelled for 2 and 3 consumers (no deadlock, balanced)
 * (docs/hopper.md, "Named barriers"; the model: docs/tuning-log.md). */
template <class Cfg>
__device__ __forceinline__ void fa_hopper_wait_turn(int consumer) {
    if (Cfg::PINGPONG) bar_sync(FA_HOPPER_BAR_SCHED_FIRST + consumer, 256);
}

template <class Cfg>
__device__ __forceinline__ void fa_hopper_pass_turn(int consumer, bool last_round) {
    if (!Cfg::PINGPONG) return;
    const bool last_consumer = consumer == Cfg::CONSUMER_WGS - 1;
    if (!(last_consumer && last_round))
        bar_arrive(last_consumer ? FA_HOPPER_BAR_SCHED_FIRST : FA_HOPPER_BAR_SCHED_FIRST + consumer + 1, 256);
}

/* Tile of round k of this CTA's walk (may be >= total_tiles in the last round: skipped). */
__device__ __forceinline__ int64_t fa_hopper_tile_index(int64_t k, const fa_hopper_params &prm) {
    const int64_t i = (prm.snake && (k & 1)) ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    return k * gridDim.x + i;
}

template <class Cfg, bool PACK, bool MODS>
__device__ __forceinline__ bool fa_hopper_work_at(int64_t t, const fa_hopper_params &prm, const fa_mods_arg<MODS> &mods,
                                                  fa_hopper_work &w) {
    if (PACK) {
        const int64_t units = (int64_t)prm.heads_kv * prm.pack_tiles;
        const int unit = (int)(t % units);
        w.batch = (int)(t / units);
        w.head_kv = unit / prm.pack_tiles;
        const int first = (unit % prm.pack_tiles) * prm.pack_heads;
        w.head = w.head_kv * prm.group + first;
        w.pack_heads = min(prm.pack_heads, prm.group - first);
        w.m0 = 0;
    } else if (prm.heavy_first) {
        const fa_tile_pos pos =
            fa_fwd_grouped_tile(t, (int64_t)prm.heads_q * prm.batch, prm.num_m_blocks, prm.head_group);
        w.head = (int)(pos.unit % prm.heads_q);
        w.batch = (int)(pos.unit / prm.heads_q);
        w.m0 = pos.m_block * Cfg::BLOCK_M;
    } else {
        w.m0 = (int)(t % prm.num_m_blocks) * Cfg::BLOCK_M;
        const int64_t rest = t / prm.num_m_blocks;
        w.head = (int)(rest % prm.heads_q);
        w.batch = (int)(rest / prm.heads_q);
    }
    const bool varlen = !PACK && prm.cu_seqlens_q != nullptr;
    const fa_seq_rows seq = fa_sequence_rows(PACK ? nullptr : prm.cu_seqlens_q, prm.cu_seqlens_k, prm.total_q, prm.total_k,
                                             prm.seqlen_q, prm.seqlen_k, w.batch);
    w.len_q = seq.len_q;
    w.len_k = seq.len_k;
    if (w.m0 >= w.len_q) return false; /* past this sequence's last query row: skipped by both roles */
    w.q_start = seq.q_start;
    w.q_row = (varlen ? (int)seq.q_start : 0) + w.m0; /* varlen maps are {d, total, heads, 1} */
    w.k_row = varlen ? (int)seq.k_start : 0;
    w.tma_batch = varlen ? 0 : w.batch;
    w.shift = w.len_k - w.len_q;
    if (!PACK) w.head_kv = w.head / prm.group;
    /* Keys [key_lo, key_hi) are visible to some row of the tile (rows m0 .. last_row):
     * fa_key_lo(first row), fa_key_hi(last row), in int32. */
    const int last_row = min(w.m0 + Cfg::BLOCK_M, w.len_q) - 1;
    int key_lo = 0, key_hi = w.len_k;
    if (prm.window_left >= 0) key_lo = max(0, w.m0 + w.shift - prm.window_left);
    if (prm.window_right >= 0) key_hi = max(0, min(w.len_k, last_row + w.shift + prm.window_right + 1));
    w.tile_hi = (key_hi + Cfg::BLOCK_N - 1) / Cfg::BLOCK_N;
    w.n_tiles = key_hi > key_lo ? w.tile_hi - key_lo / Cfg::BLOCK_N : 0;
    w.first = fa_mods_k_pos{w.tile_hi - 1, 0, 0};
    if constexpr (MODS) {
        w.map_row = nullptr;
        w.qb = 0;
        /* a block mask: the tiles of the row's listed blocks (the window then holds inside the
         * partial ones only: prm.window_* are unbounded, see fa_hopper_mods) */
        if (mods.block_map != nullptr) {
            w.map_row = fa_mods_map_row(mods, w.batch, w.head, w.m0);
            w.qb = w.m0 / mods.block_q;
            w.tiles_per_block = mods.block_k / Cfg::BLOCK_N;
            w.key_tiles = (w.len_k + Cfg::BLOCK_N - 1) / Cfg::BLOCK_N;
        }
    }
    return true;
}

/* MODS with a block mask: the walk's first tile and the tile count, from the map row's summary
 * (the producer's; the consumers read the count from the tile slot and each position from its
 * stage's slot). */
template <bool MODS>
__device__ __forceinline__ void fa_hopper_walk_start(const fa_mods_arg<MODS> &mods, fa_hopper_work &w) {
    if constexpr (MODS) {
        if (w.map_row != nullptr) {
            w.first = fa_mods_first_tile(mods, w.batch, w.head, w.qb, w.map_row, w.tiles_per_block, w.key_tiles,
                                         &w.n_tiles);
            w.tile_hi = w.first.tile + 1;
        }
    }
}

/* Key tiles in processing order, from tile_hi - 1 downwards (varlen relies on the last tile
 * coming first: its V rows past the sequence are zeroed in round 0). Without MODS round j's tile
 * is tile_hi - 1 - j; MODS walks a position (`pos`: round j's tile, its key block and map entry,
 * from w.first), advanced by fa_hopper_key_walk_next to the next listed tile below when there is
 * a block mask (fa_mods_prev_tile). Only the producer walks; the consumers read each position
 * from the slot of the K stage it loaded. */
template <bool MODS>
__device__ __forceinline__ int fa_hopper_key_tile(const fa_hopper_work &w, int j, const fa_mods_k_pos &pos) {
    return MODS ? pos.tile : w.tile_hi - 1 - j;
}
template <bool MODS>
__device__ __forceinline__ void fa_hopper_key_walk_next(const fa_hopper_work &w, fa_mods_k_pos &pos) {
    if constexpr (MODS) {
        if (w.map_row != nullptr)
            fa_mods_prev_tile(w.map_row, w.tiles_per_block, w.key_tiles, pos);
        else
            --pos.tile;
    }
}

/* One step of the fp8 Vᵀ transpose (fa_hopper_fp8_transpose_v): the load of 16 columns of key
 * groups a and a ^ 2, then the byte permutes, the key mask of a partial tile (`valid` keys; a
 * constant BLOCK_N compiles it out) and the store. raw_lane / vt_lane: the lane's row and swizzle
 * term in the staged tile and in the Vᵀ stage (1024-byte aligned, so a column block or key group
 * XORs into the swizzle term alone); flip: 2 for the lanes of matrices 2-3 (group a ^ 2 = a + 2,
 * a's bit 1 being 0). */
template <class Cfg>
__device__ __forceinline__ void fa_hopper_fp8_vt_load(uint32_t (&r)[4], uint32_t raw_lane, int step, int flip) {
    const int pair = step % 4, cc16 = step / 4, a = (pair & 1) | ((pair & 2) << 1);
    ldmatrix_x4_trans(r, (raw_lane ^ (uint32_t)(cc16 << 4)) + (uint32_t)(16 * Cfg::QK_ROW_BYTES * (a + flip)));
}
template <class Cfg>
__device__ __forceinline__ void fa_hopper_fp8_vt_store(const uint32_t (&r)[4], uint32_t vt_lane, int step, int flip,
                                                       int lane, int valid) {
    const int pair = step % 4, cc16 = step / 4, a = (pair & 1) | ((pair & 2) << 1);
    const int p = lane / 4, q = lane % 4;
    /* [A0 A2 B0 B2] is column cc + 2p, [A1 A3 B1 B3] column cc + 2p + 1 */
    const uint32_t sel_even = p < 4 ? 0x6420u : 0x7531u, sel_odd = p < 4 ? 0x7531u : 0x6420u;
    uint32_t o[4] = {__byte_perm(r[0], r[1], sel_even), __byte_perm(r[0], r[1], sel_odd),
                     __byte_perm(r[2], r[3], sel_even), __byte_perm(r[2], r[3], sel_odd)};
    if (valid < Cfg::BLOCK_N) { /* bytes 0-3 of a word: keys 2q, + 1, + 8, + 9 of its group */
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int k0 = 16 * (h ? a ^ 2 : a) + 2 * q;
            const uint32_t keep = (k0 < valid ? 0xffu : 0u) | (k0 + 1 < valid ? 0xff00u : 0u) |
                                  (k0 + 8 < valid ? 0xff0000u : 0u) | (k0 + 9 < valid ? 0xff000000u : 0u);
            o[2 * h] &= keep;
            o[2 * h + 1] &= keep;
        }
    }
    stmatrix_x4((vt_lane ^ (uint32_t)((a ^ flip) << 4)) + (uint32_t)(2048 * cc16), o);
}

/* A full tile's steps of transposing warp W (W, W + 3, ..), unrolled: every address is a lane
 * constant plus an immediate. Cfg::VT_STEPS_IN_FLIGHT loads before their stores: two need the
 * 8 + 8 words and addresses of the producer warpgroup's 56 registers (bucket 64), one fits 24. */
template <class Cfg, int W>
__device__ __forceinline__ void fa_hopper_fp8_transpose_full(uint32_t raw_lane, uint32_t vt_lane, int flip, int lane) {
    constexpr int STEPS = Cfg::VT_STEPS, N = Cfg::VT_STEPS_IN_FLIGHT;
#pragma unroll
    for (int step0 = W; step0 < STEPS; step0 += 3 * N) {
        uint32_t r[N][4];
#pragma unroll
        for (int u = 0; u < N; ++u)
            if (step0 + 3 * u < STEPS) fa_hopper_fp8_vt_load<Cfg>(r[u], raw_lane, step0 + 3 * u, flip);
#pragma unroll
        for (int u = 0; u < N; ++u)
            if (step0 + 3 * u < STEPS) fa_hopper_fp8_vt_store<Cfg>(r[u], vt_lane, step0 + 3 * u, flip, lane, Cfg::BLOCK_N);
    }
}

/* fp8 with V transposed in the kernel (Cfg::VT_IN_KERNEL): warps 1-3 of the producer warpgroup
 * (`warp` 0-2 here) turn each staged V tile [BLOCK_N keys, DV] (K's layout: one QK_ROW_BYTES row
 * per key in the 128- or 64-byte swizzle) into the Vᵀ stage [DV rows, BLOCK_N key slots] (128-byte
 * rows in the 128-byte swizzle, the keys in fa_hopper_fp8_vt_slot's order), zero the keys past the
 * tile's valid count (varlen: rows of the next sequence), then arrive on v_full (after
 * fence.proxy.async: the wgmma reads the stage through the async proxy) and on vraw_empty.
 * A step of a warp moves 16 columns cc.. of two 16-key groups a and b = a ^ 2: ldmatrix.x4.trans
 * of the 8 × 8 b16 blocks (keys 16a.., 16a + 8.., 16b.., 16b + 8..) gives lane (p = lane / 4,
 * q = lane % 4) the byte pairs of columns cc + 2p, + 1 at keys 2q, + 1 (A) and 2q + 8, + 9 (B) of
 * each group; a byte permute of A and B is the word of Vᵀ row cc + 2p (or + 1) at slots 4q .. 4q + 3
 * of the group, which hold exactly those keys (the slot order); stmatrix.x4 stores the four words.
 * Its matrices mix the even rows of lanes p < 4 with the odd rows of p >= 4 (the other matrix the
 * rest), and the groups a, a ^ 2 differ in the swizzle's second bit: the 8 rows of a matrix, and
 * row j of the four, land in different 16-byte bank groups. A full tile runs each warp's steps
 * unrolled (fa_hopper_fp8_transpose_full<W>); a partial one (varlen: a sequence's last) the same
 * steps as a loop with the key mask. */
template <class Cfg>
__device__ __forceinline__ void fa_hopper_fp8_transpose_v(int warp, int lane, uint32_t vraw_smem, uint32_t vt_smem,
                                                          uint32_t vraw_full0, uint32_t v_full0, uint32_t v_empty0,
                                                          uint32_t pos_slot0) {
    constexpr int STAGES = Cfg::STAGES, BLOCK_N = Cfg::BLOCK_N, ROW = Cfg::QK_ROW_BYTES, STEPS = Cfg::VT_STEPS;
    static_assert(Cfg::TRANSPOSE_THREADS == 96 && BLOCK_N == 128, "three warps; 8 groups of 16 keys");
    const int m = lane / 8, j = lane % 8, flip = m < 2 ? 0 : 2;
    /* ldmatrix: this lane addresses row j of matrix m, key 16·(m < 2 ? a : b) + 8(m % 2) + j; its
     * swizzle term is the same for every group (K's: key % 8 for 128-byte rows, (key / 2) % 4 for
     * 64-byte rows) */
    const int swz = ROW == 128 ? j : (j / 2) % 4;
    const uint32_t ld_lane = (uint32_t)((8 * (m % 2) + j) * ROW) + (uint32_t)(swz << 4);
    /* stmatrix: row j of matrix m is Vᵀ row cc + 2j + (odd), odd = j >= 4 for even m, j < 4 for odd
     * m, in group m < 2 ? a : b; its swizzle term is st_row % 8 */
    const int st_row = 2 * j + ((m % 2) ? (j < 4) : (j >= 4));
    const uint32_t st_lane = (uint32_t)(st_row * 128) + (uint32_t)((st_row % 8) << 4);
    for (uint32_t g = 0;; ++g) {
        const uint32_t s = g % STAGES, phase = (g / STAGES) & 1;
        mbarrier_wait_parity(vraw_full0 + 8u * s, phase);
        const int valid = (int)(int64_t)ld_shared_u64(pos_slot0 + 16u * s);
        if (valid < 0) return;
        mbarrier_wait_parity(v_empty0 + 8u * s, phase ^ 1);
        const uint32_t raw = vraw_smem + s * Cfg::VRAW_BYTES + ld_lane, vt = vt_smem + s * Cfg::V_BYTES + st_lane;
        if (valid >= BLOCK_N) {
            if (warp == 0)
                fa_hopper_fp8_transpose_full<Cfg, 0>(raw, vt, flip, lane);
            else if (warp == 1)
                fa_hopper_fp8_transpose_full<Cfg, 1>(raw, vt, flip, lane);
            else
                fa_hopper_fp8_transpose_full<Cfg, 2>(raw, vt, flip, lane);
        } else {
#pragma unroll 1
            for (int step = warp; step < STEPS; step += 3) {
                uint32_t r[4];
                fa_hopper_fp8_vt_load<Cfg>(r, raw, step, flip);
                fa_hopper_fp8_vt_store<Cfg>(r, vt, step, flip, lane, valid);
            }
        }
        fence_proxy_async_shared_cta(); /* the stores, before the wgmma's async-proxy reads */
        mbarrier_arrive(v_full0 + 8u * s);
        mbarrier_arrive(vraw_full0 + 8u * (STAGES + s)); /* vraw_empty[s] */
    }
}

template <int BUCKET, bool BF16, bool PACK, bool LOG2, bool DROPOUT, int MODS_KIND, int FP8>
__global__ void __launch_bounds__(fa_hopper_config<BUCKET, FP8>::THREADS, 1)
    fa_hopper_fwd_kernel(const __grid_constant__ CUtensorMap tmap_q, /* {d, sq, hq, b} (varlen {d, total_q, hq, 1}), box {64, BLOCK_M, 1, 1}; PACK: box {64, pack_rows, 1, 1} */
                         const __grid_constant__ CUtensorMap tmap_k, /* {d, sk, hkv, b}, box {64, BLOCK_N, 1, 1}                       */
                         const __grid_constant__ CUtensorMap tmap_v, /* {dv, sk, hkv, b}, box {64, BLOCK_N, 1, 1}; FP8: box {DV, BLOCK_N, 1, 1} (VT_IN_KERNEL), else Vᵀ {vt_rows, dv, hkv, 1}, box {BLOCK_N, DV, 1, 1} */
                         const __grid_constant__ CUtensorMap tmap_o, /* {dv, sq, hq, b}, box {64, 64, 1, 1} (TMA-store path only)      */
                         const fa_hopper_params prm,
                         const __grid_constant__ fa_mods_arg<MODS_KIND != FA_HOPPER_MODS_NONE> mods) { /* MODS only: bias, doc ids, block map */
    using Cfg = fa_hopper_config<BUCKET, FP8>;
    constexpr bool MODS = MODS_KIND != FA_HOPPER_MODS_NONE, BIAS = MODS_KIND == FA_HOPPER_MODS_BIAS;
    static_assert(!FP8 || (BF16 && !PACK && !LOG2 && !DROPOUT && !MODS), "fp8: bf16 out, plain scores only");
    constexpr int BLOCK_N = Cfg::BLOCK_N, STAGES = Cfg::STAGES;

    /* Shared memory, aligned up to 1024 bytes (the swizzle atom): q [SLABS_QK][BLOCK_M][64] |
     * k [STAGES][SLABS_QK][BLOCK_N][64] | v [STAGES][SLABS_V][BLOCK_N][64] | o [SLABS_V][BLOCK_M][64]
     * (own buffer only) | mbarriers. */
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t smem = (smem_u32addr(smem_raw) + 1023u) & ~1023u;
    const uint32_t q_smem = smem;
    const uint32_t o_smem = Cfg::O_OWN ? smem + Cfg::O_OFFSET : q_smem;
    auto k_stage = [&](uint32_t s) -> uint32_t { return smem + Cfg::K_OFFSET + s * Cfg::K_BYTES; };
    auto v_stage = [&](uint32_t s) -> uint32_t { return smem + Cfg::V_OFFSET + s * Cfg::V_BYTES; };
    const uint32_t bars = smem + Cfg::BAR_OFFSET;
    const uint32_t q_full = bars, q_empty = bars + 8u;
    const uint32_t tile_slot = smem + Cfg::TILE_SLOT_OFFSET;
    auto pos_slot = [&](uint32_t s) -> uint32_t { return smem + Cfg::POS_SLOT_OFFSET + 16u * s; };
    auto k_full = [&](uint32_t s) -> uint32_t { return bars + 8u * (2u + s); };
    auto v_full = [&](uint32_t s) -> uint32_t { return bars + 8u * (2u + STAGES + s); };
    auto k_empty = [&](uint32_t s) -> uint32_t { return bars + 8u * (2u + 2 * STAGES + s); };
    auto v_empty = [&](uint32_t s) -> uint32_t { return bars + 8u * (2u + 3 * STAGES + s); };
    /* pair: xchg_full[c] (1 arrival: consumer c's thread 0 arming the next message with its bytes,
     * + the peer's st.async bytes) and xchg_free[c] (4 arrivals: the peer's consumer c warps have
     * read our last message) */
    auto xchg_full = [&](int c) -> uint32_t { return bars + 8u * (uint32_t)(2 + 4 * STAGES + c); };
    auto xchg_free = [&](int c) -> uint32_t { return bars + 8u * (uint32_t)(2 + 4 * STAGES + Cfg::CONSUMER_WGS + c); };
    /* VT_IN_KERNEL: vraw_full[s] (1 arrival + the staged V tile's bytes) and vraw_empty[s] (the
     * transposing threads have read it); the staging stage s and the valid keys of its tile in
     * pos_slot(s) (written before the arrival on vraw_full; -1: no more tiles) */
    auto vraw_full = [&](uint32_t s) -> uint32_t { return bars + 8u * (2u + 4 * STAGES + s); };
    auto vraw_empty = [&](uint32_t s) -> uint32_t { return bars + 8u * (2u + 5 * STAGES + s); };
    auto vraw_stage = [&](uint32_t s) -> uint32_t { return smem + Cfg::VRAW_OFFSET + s * Cfg::VRAW_BYTES; };
    /* pair: this CTA's first head-dim column of Q, K, V and O */
    const int rank = Cfg::CTAS == 2 ? (int)cluster_ctarank() : 0;
    const int col_base = rank * Cfg::DQK;
    /* K/V multicast pair (16-bit, one CTA per tile): cluster rank 0 loads K, 1 loads V, into both CTAs,
     * and every consumer warp frees a stage in both CTAs. The kernels that may multicast count two
     * arrivals per consumer warp on each empty barrier either way (without multicast both on its own
     * CTA's), so the release is one code path, without a branch in the consumers' loop. */
    constexpr bool MCAST_OK = fa_hopper_fwd_kv_multicast_bucket(BUCKET) && !FP8 && !PACK && !MODS;
    const bool mcast = MCAST_OK && prm.kv_multicast != 0;

    /* ---- barriers: initialised by one thread, made visible to every thread and to the TMA unit
     * (fence.mbarrier_init), then a CTA barrier before anyone waits or arrives. */
    if (threadIdx.x == 0) {
        mbarrier_init(q_full, 1);
        mbarrier_init(q_empty, Cfg::Q_EMPTY_ARRIVALS);
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(k_full(s), 1);
            mbarrier_init(v_full(s), Cfg::VT_IN_KERNEL ? Cfg::TRANSPOSE_THREADS : 1);
            mbarrier_init(k_empty(s), (MCAST_OK ? 2 : 1) * Cfg::EMPTY_ARRIVALS);
            mbarrier_init(v_empty(s), (MCAST_OK ? 2 : 1) * Cfg::EMPTY_ARRIVALS);
            if constexpr (Cfg::VT_IN_KERNEL) {
                mbarrier_init(vraw_full(s), 1);
                mbarrier_init(vraw_empty(s), Cfg::TRANSPOSE_THREADS);
            }
        }
        if constexpr (Cfg::CTAS == 2)
            for (int c = 0; c < Cfg::CONSUMER_WGS; ++c) {
                mbarrier_init(xchg_full(c), 1);
                mbarrier_init(xchg_free(c), 4);
            }
        fence_mbarrier_init_release_cluster();
        if constexpr (Cfg::CTAS == 2) /* message 0's bytes expected */
            for (int c = 0; c < Cfg::CONSUMER_WGS; ++c) mbarrier_arrive_expect_tx(xchg_full(c), Cfg::X_WG_BYTES);
    }
    /* pair, multicast pair: the peer's barriers are initialised before any remote store or arrival */
    if (Cfg::CTAS == 2 || mcast) cluster_sync();
    else __syncthreads();

    /* The producer picks the tiles (static walk or counter) and hands each to the consumers in
     * the tile slot; both roles count the processed ones (tiles_done: phase of q_full / q_empty)
     * and the key tiles so far (kv_base: use g of the K/V ring is stage g % STAGES, phase
     * g / STAGES, continuing across query tiles). */
    const int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
        /* ================= producer ================= */
        setmaxnreg_dec<Cfg::PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            tma_prefetch_tensormap(&tmap_q);
            tma_prefetch_tensormap(&tmap_k);
            tma_prefetch_tensormap(&tmap_v);
            int tiles_done = 0;
            uint32_t kv_base = 0; /* unsigned: the stage and phase are a mask and a shift */
            for (int64_t k = 0;; ++k) {
                /* the next tile: dynamic (the counter, fetched before the q_empty wait so its
                 * round trip hides behind this tile's work) or this CTA's static walk */
                int64_t t;
                if (Cfg::CTAS == 2) { /* one tile per cluster (fa_hopper_schedule) */
                    if (k > 0) break;
                    t = (int64_t)(blockIdx.x / Cfg::CTAS);
                } else if (prm.tile_counter != nullptr)
                    t = k == 0 ? (int64_t)blockIdx.x : (int64_t)gridDim.x + atomicAdd(prm.tile_counter, 1u);
                else if (k * gridDim.x < prm.total_tiles)
                    t = fa_hopper_tile_index(k, prm);
                else
                    break;
                if (t >= prm.total_tiles) {
                    if (prm.tile_counter != nullptr) break;
                    continue;
                }
                fa_hopper_work w;
                if (!fa_hopper_work_at<Cfg, PACK, MODS>(t, prm, mods, w)) continue;
                fa_hopper_walk_start<MODS>(mods, w);
                /* Q: the previous tile's consumers must be done with the buffer. One box per
                 * 64-column slab; rows past the tensor and columns past d are zero-filled but
                 * still counted in the transaction bytes (the full box lands). Packed: one box
                 * of pack_rows rows per head and slab, head g at slab row g·pack_rows (a multiple
                 * of 8: a 1024-byte swizzle atom), pack_heads · SLABS_QK boxes in the transaction. */
                if (tiles_done > 0) mbarrier_wait_parity(q_empty, (tiles_done - 1) & 1);
                st_shared_u64(tile_slot, (uint64_t)t); /* released by the arrival on q_full below */
                if constexpr (MODS) st_shared_b32(tile_slot + 8u, (uint32_t)w.n_tiles);
                if (PACK) {
                    const uint32_t head_bytes = (uint32_t)prm.pack_rows * 128u;
                    mbarrier_arrive_expect_tx(q_full, (uint32_t)w.pack_heads * Cfg::SLABS_QK * head_bytes);
                    for (int g = 0; g < w.pack_heads; ++g)
#pragma unroll
                        for (int slab = 0; slab < Cfg::SLABS_QK; ++slab)
                            tma_load_4d(q_smem + (uint32_t)slab * Cfg::Q_SLAB_BYTES + (uint32_t)g * head_bytes,
                                        &tmap_q, q_full, Cfg::SLAB_COLS * slab, 0, w.head + g, w.batch);
                } else {
                    mbarrier_arrive_expect_tx(q_full, Cfg::Q_BYTES);
#pragma unroll
                    for (int slab = 0; slab < Cfg::SLABS_QK; ++slab)
                        tma_load_4d(q_smem + (uint32_t)slab * Cfg::Q_SLAB_BYTES, &tmap_q, q_full,
                                    col_base + Cfg::SLAB_COLS * slab, w.q_row, w.head, w.tma_batch);
                }
                /* Tile j (processing order) is fa_hopper_key_tile(w, j, k_pos) (MODS: the walk's
                 * position k_pos; V one round behind it, v_pos). Order K_0, then K_j before V_{j-1}: the
                 * consumers' round j needs K_j first. */
                fa_mods_k_pos k_pos = w.first, v_pos = k_pos;
                for (int j = 0; j <= w.n_tiles; ++j) {
                    if (j < w.n_tiles) {
                        const uint32_t g = kv_base + j, s = g % STAGES;
                        mbarrier_wait_parity(k_empty(s), ((g / STAGES) & 1) ^ 1);
                        if constexpr (MODS) { /* released by the arrival on k_full */
                            const uint32_t pos[4] = {(uint32_t)k_pos.tile, (uint32_t)k_pos.kb, (uint32_t)k_pos.entry, 0u};
                            st_shared_v4_b32(pos_slot(s), pos);
                        }
                        /* multicast: both CTAs expect the whole tile, which rank 0 sends to both */
                        mbarrier_arrive_expect_tx(k_full(s), Cfg::K_BYTES);
                        if (mcast && cluster_ctarank() == 0) {
#pragma unroll
                            for (int slab = 0; slab < Cfg::SLABS_QK; ++slab)
                                tma_load_4d_multicast(k_stage(s) + (uint32_t)slab * Cfg::KV_SLAB_BYTES, &tmap_k,
                                                      k_full(s), Cfg::SLAB_COLS * slab,
                                                      w.k_row + fa_hopper_key_tile<MODS>(w, j, k_pos) * BLOCK_N,
                                                      w.head_kv, w.tma_batch, 3);
                        } else if (!mcast) {
#pragma unroll
                            for (int slab = 0; slab < Cfg::SLABS_QK; ++slab)
                                tma_load_4d(k_stage(s) + (uint32_t)slab * Cfg::KV_SLAB_BYTES, &tmap_k, k_full(s),
                                            col_base + Cfg::SLAB_COLS * slab,
                                            w.k_row + fa_hopper_key_tile<MODS>(w, j, k_pos) * BLOCK_N, w.head_kv,
                                            w.tma_batch);
                        }
                    }
                    if (j > 0 && Cfg::VT_IN_KERNEL) { /* V as stored, into the staging (transposed below) */
                        const uint32_t g = kv_base + j - 1, s = g % STAGES;
                        const int key_tile = fa_hopper_key_tile<MODS>(w, j - 1, v_pos);
                        mbarrier_wait_parity(vraw_empty(s), ((g / STAGES) & 1) ^ 1);
                        st_shared_u64(pos_slot(s), (uint64_t)(int64_t)min(BLOCK_N, w.len_k - key_tile * BLOCK_N));
                        mbarrier_arrive_expect_tx(vraw_full(s), Cfg::VRAW_BYTES);
                        tma_load_4d(vraw_stage(s), &tmap_v, vraw_full(s), 0, w.k_row + key_tile * BLOCK_N, w.head_kv,
                                    w.tma_batch);
                    } else if (j > 0) {
                        const uint32_t g = kv_base + j - 1, s = g % STAGES;
                        mbarrier_wait_parity(v_empty(s), ((g / STAGES) & 1) ^ 1);
                        mbarrier_arrive_expect_tx(v_full(s), Cfg::V_BYTES);
                        if constexpr (FP8) { /* Vᵀ rows of the sequence's padded keys: one box {BLOCK_N, DV} */
                            const int vt_row0 = prm.vt_start != nullptr ? prm.vt_start[w.batch]
                                                                        : w.batch * prm.vt_seq_rows;
                            tma_load_4d(v_stage(s), &tmap_v, v_full(s),
                                        vt_row0 + fa_hopper_key_tile<MODS>(w, j - 1, v_pos) * BLOCK_N, 0, w.head_kv, 0);
                        } else if (mcast) {
                            if (cluster_ctarank() == 1)
#pragma unroll
                                for (int slab = 0; slab < Cfg::SLABS_V; ++slab)
                                    tma_load_4d_multicast(v_stage(s) + (uint32_t)slab * Cfg::KV_SLAB_BYTES, &tmap_v,
                                                          v_full(s), 64 * slab,
                                                          w.k_row + fa_hopper_key_tile<MODS>(w, j - 1, v_pos) * BLOCK_N,
                                                          w.head_kv, w.tma_batch, 3);
                        } else
#pragma unroll
                        for (int slab = 0; slab < Cfg::SLABS_V; ++slab)
                            tma_load_4d(v_stage(s) + (uint32_t)slab * Cfg::KV_SLAB_BYTES, &tmap_v, v_full(s),
                                        col_base + 64 * slab, w.k_row + fa_hopper_key_tile<MODS>(w, j - 1, v_pos) * BLOCK_N,
                                        w.head_kv, w.tma_batch);
                    }
                    if constexpr (MODS) {
                        v_pos = k_pos;
                        if (j < w.n_tiles) fa_hopper_key_walk_next<MODS>(w, k_pos);
                    }
                }
                kv_base += w.n_tiles;
                ++tiles_done;
            }
            /* no more tiles: -1 in the slot (once the consumers have read the last index) and a
             * plain arrival completes q_full's phase without a transaction */
            if (tiles_done > 0) mbarrier_wait_parity(q_empty, (tiles_done - 1) & 1);
            st_shared_u64(tile_slot, ~0ull);
            mbarrier_arrive(q_full);
            if constexpr (Cfg::VT_IN_KERNEL) { /* and -1 in the next staging slot: the transposing warps stop */
                const uint32_t s = kv_base % STAGES;
                mbarrier_wait_parity(vraw_empty(s), ((kv_base / STAGES) & 1) ^ 1);
                st_shared_u64(pos_slot(s), ~0ull);
                mbarrier_arrive(vraw_full(s));
            }
        } else if constexpr (Cfg::VT_IN_KERNEL) {
            if (threadIdx.x >= 32)
                fa_hopper_fp8_transpose_v<Cfg>(threadIdx.x / 32 - 1, threadIdx.x % 32, smem + Cfg::VRAW_OFFSET,
                                               smem + Cfg::V_OFFSET, vraw_full(0), v_full(0), v_empty(0),
                                               smem + Cfg::POS_SLOT_OFFSET);
        }
        /* multicast pair: no CTA exits while the peer may still load into its shared memory or
         * arrive on its barriers (the consumers meet here after their last release) */
        if (mcast) cluster_sync();
        return;
    }

    /* ================= consumers ================= */
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    /* from lane 0, which ptxas knows to be warp-uniform: the shared-memory descriptors that
     * depend on the consumer are then formed in uniform registers, not per thread and moved over
     * by R2UR before every wgmma */
    const int consumer = __shfl_sync(0xffffffffu, warpgroup - 1, 0);
    const int tid = threadIdx.x % 128;
    const int warp = tid / 32, lane = tid % 32;
    /* rows 64c.. of slab 0 */
    const uint32_t q_wg = q_smem + (uint32_t)consumer * 64 * Cfg::QK_ROW_BYTES;
    const uint32_t o_wg = o_smem + (uint32_t)consumer * 64 * 128;
    /* pair: consumer c exchanges with consumer c of the peer (cuda_common.cuh's fa_pair_exchange);
     * message m is the partial S of the m-th key tile of the cluster's one query tile */
    [[maybe_unused]] fa_pair_link link = {};
    if constexpr (Cfg::CTAS == 2)
        link = fa_pair_link_of(smem + Cfg::X_OFFSET + (uint32_t)consumer * Cfg::X_WG_BYTES, xchg_full(consumer),
                               xchg_free(consumer), tid, (uint32_t)rank ^ 1u);
    const uint32_t order_word = smem + Cfg::ORDER_OFFSET + 4u * (uint32_t)(128 * consumer + tid);
    const bool varlen = !PACK && prm.cu_seqlens_q != nullptr;
    /* Packed: this thread's two tile rows (h = 0, 1: 8 apart) as (head offset g, query row i);
     * fixed for the whole kernel (pack_rows is). */
    int pack_g[2] = {0, 0}, pack_i[2] = {0, 0};
    if (PACK) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = 64 * consumer + 16 * warp + lane / 4 + 8 * h;
            pack_g[h] = r / prm.pack_rows;
            pack_i[h] = r - pack_g[h] * prm.pack_rows;
        }
    }

    /* lane 0 frees a K or V stage: on this CTA's barrier, and (MCAST_OK) through its cluster address
     * on the peer's (multicast) or again on this CTA's */
    const uint32_t release_rank = MCAST_OK ? cluster_ctarank() ^ (uint32_t)mcast : 0u;
    auto release_stage = [&](uint32_t empty_bar) {
        if (lane == 0) {
            mbarrier_arrive(empty_bar);
            if constexpr (MCAST_OK) mbarrier_arrive_remote(mapa_shared_cluster(empty_bar, release_rank));
        }
    };

    int tiles_done = 0;
    uint32_t kv_base = 0;
    for (;;) {
        /* the producer's next tile (its Q landed with it), or -1: done */
        mbarrier_wait_parity_spin(q_full, tiles_done & 1);
        /* read by lane 0, the lane that (with its warp's accesses behind it) arrives on q_empty,
         * which the producer waits for before the slot's next write */
        long long t_lane0 = 0;
        int n_tiles_lane0 = 0; /* MODS: the producer's count of the walk's tiles */
        if constexpr (MODS) {
            if (lane == 0) {
                uint32_t slot[4];
                ld_shared_v4_b32(slot, tile_slot);
                t_lane0 = (long long)((uint64_t)slot[1] << 32 | slot[0]);
                n_tiles_lane0 = (int)slot[2];
            }
        } else if (lane == 0) {
            t_lane0 = (long long)ld_shared_u64(tile_slot);
        }
        const int64_t t = __shfl_sync(0xffffffffu, t_lane0, 0);
        if (t < 0) break;
        fa_hopper_work w;
        fa_hopper_work_at<Cfg, PACK, MODS>(t, prm, mods, w); /* true: the producer sends no other */
        if constexpr (MODS) w.n_tiles = __shfl_sync(0xffffffffu, n_tiles_lane0, 0);
        const int len_k = w.len_k, shift = w.shift, n_tiles = w.n_tiles;
        const int row0 = w.m0 + 64 * consumer + 16 * warp + lane / 4; /* query row of d[i], (i>>1)&1 = 0 */
        const int wg_row_first = w.m0 + 64 * consumer, wg_row_last = wg_row_first + 63;
        /* the query rows of this warpgroup span [mask_row_first, mask_row_last] (packed: any row
         * of a head may sit in any warpgroup) */
        const int mask_row_first = PACK ? 0 : wg_row_first, mask_row_last = PACK ? w.len_q - 1 : wg_row_last;

        /* Does the tile at key n0 need a mask for this warpgroup's rows? Past the keys, right of
         * the first row's window end, or left of the last row's window start (!fa_tile_all_visible):
         * keys [free_lo, free_hi) are visible to every row, bounds formed once per query tile so
         * that a round spends two compares on it. */
        const int free_hi = (int)min((int64_t)len_k, prm.window_right >= 0
                                                         ? (int64_t)mask_row_first + shift + prm.window_right + 1
                                                         : (int64_t)len_k);
        const int free_lo = prm.window_left >= 0
                                ? (int)max((int64_t)0, (int64_t)mask_row_last + shift - prm.window_left)
                                : 0;
        auto needs_mask = [&](int n0) -> bool { return n0 + BLOCK_N > free_hi || n0 < free_lo; };
        /* Own O buffer: Q is free for the next tile once this warp's last S GEMM has read it. */
        auto release_q = [&]() {
            if (Cfg::O_OWN && lane == 0) mbarrier_arrive(q_empty);
        };

        float o_rmem[Cfg::DV / 2];
#pragma unroll
        for (int i = 0; i < Cfg::DV / 2; ++i) o_rmem[i] = 0.0f;
        float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
        float row_sum[2] = {0.0f, 0.0f};
        uint32_t p_rmem[Cfg::P_STEPS][4];
        /* the multipliers of this tile's scores; fp8: q_descale · k_descale folded in, v_descale
         * applied with the normalisation */
        fa_hopper_muls mul = {prm.softcap_pre, prm.log2_mul, prm.score_mul};
        float v_descale = 1.0f;
        if constexpr (FP8) {
            const int64_t dsc = (int64_t)w.batch * prm.heads_kv + w.head_kv;
            const float qk = (prm.q_descale != nullptr ? prm.q_descale[dsc] : 1.0f) *
                             (prm.k_descale != nullptr ? prm.k_descale[dsc] : 1.0f);
            if (prm.softcap_pre != 0.0f) mul.softcap_pre *= qk;
            else mul.score_mul *= qk;
            v_descale = prm.v_descale != nullptr ? prm.v_descale[dsc] : 1.0f;
        }

        /* MODS: the current round's key tile (fa_hopper_key_tile), read from its K stage's slot by
         * lane 0 (which arrives on k_empty after its warp is done with the slot) */
        fa_mods_k_pos key_pos = {0, 0, 0};
        auto read_key_pos = [&](int ks) {
            uint32_t pos[4] = {0u, 0u, 0u, 0u};
            if (lane == 0) ld_shared_v4_b32(pos, pos_slot(ks));
            key_pos.tile = __shfl_sync(0xffffffffu, (int)pos[0], 0);
            key_pos.kb = __shfl_sync(0xffffffffu, (int)pos[1], 0);
            key_pos.entry = __shfl_sync(0xffffffffu, (int)pos[2], 0);
        };
        if (n_tiles > 0) {
            if (Cfg::PINGPONG && consumer == Cfg::CONSUMER_WGS - 1)
                bar_arrive(FA_HOPPER_BAR_SCHED_FIRST, 256); /* consumer 0 goes first */
            auto issue_s = [&](float (&s_rmem)[Cfg::BLOCK_N / 2], uint32_t ks) {
                fa_hopper_issue_qk<Cfg, BF16, FP8 != 0>(s_rmem, q_wg, k_stage(ks));
            };
            /* pair: + the peer's partial scores of key tile j (nothing sent after the last) */
            auto pair_add = [&](float (&s_rmem)[Cfg::BLOCK_N / 2], int j) {
                if constexpr (Cfg::CTAS == 2) fa_pair_exchange<Cfg::BLOCK_N / 8>(link, s_rmem, j, j == n_tiles - 1, tid, lane);
            };

            /* ---- round 0: S_0 alone */
            {
                const uint32_t g = kv_base, ks = g % STAGES;
                float s_rmem[BLOCK_N / 2];
                mbarrier_wait_parity_spin(k_full(ks), (g / STAGES) & 1);
                fa_hopper_wait_turn<Cfg>(consumer);
                issue_s(s_rmem, ks);
                fa_hopper_pass_turn<Cfg>(consumer, n_tiles == 1);
                if constexpr (MODS) read_key_pos(ks);
                uint32_t keep[DROPOUT ? Cfg::KEEP_WORDS : 1];
                if constexpr (DROPOUT) /* while S is computed (no P·V in flight: late or not alike) */
                    fa_hopper_dropout_bits<Cfg>(keep, prm.dropout, w.batch, w.head, prm.heads_q, row0 - lane / 4,
                                                fa_hopper_key_tile<MODS>(w, 0, key_pos) * BLOCK_N);
                uint32_t bias_rmem[BIAS ? BLOCK_N / 4 : 1]; /* BIAS: the tile's bias, loaded while S runs */
                bool bias_early = false;
                if constexpr (BIAS) {
                    const int n0 = fa_hopper_key_tile<MODS>(w, 0, key_pos) * BLOCK_N;
                    bias_early = fa_hopper_bias_early<Cfg>(mods, w, n0);
                    if (bias_early) fa_hopper_bias_load<Cfg>(bias_rmem, mods, w, n0, row0, lane);
                }
                wgmma_wait_group<0>();
#pragma unroll
                for (int i = 0; i < BLOCK_N / 2; ++i) wgmma_fence_operand(s_rmem[i]);
                release_stage(k_empty(ks)); /* this warp is done reading K_0 */
                pair_add(s_rmem, 0);
                if (n_tiles == 1) release_q();
                const int n0 = fa_hopper_key_tile<MODS>(w, 0, key_pos) * BLOCK_N;
                float alpha[2]; /* O = 0: unused */
                fa_hopper_scores<Cfg, PACK, LOG2, MODS, BIAS>(s_rmem, row_max, row_sum, alpha, prm, mul, mods, w, key_pos,
                                                        needs_mask(n0), n0, row0, pack_g, pack_i, lane, bias_rmem,
                                                        bias_early);
                if constexpr (DROPOUT) fa_hopper_dropout_apply<Cfg>(s_rmem, keep);
                fa_hopper_convert_p<Cfg, BF16, FP8 != 0>(s_rmem, p_rmem);

                /* Varlen: V_0's rows past the sequence belong to the next one (or to the unused
                 * rows after the last, possibly NaN). All consumers zero them (each a share of
                 * the chunks) and then meet on a named barrier; fence.proxy.async orders the
                 * st.shared before the wgmma (async proxy) reads of round 1. Placed after this
                 * round's GEMM issue, so no consumer can be waiting for another one's ping-pong
                 * turn here. */
                if (!FP8 && varlen && n0 + BLOCK_N > len_k) { /* fp8: Vᵀ's padding is zeros */
                    const int vs = g % STAGES;
                    mbarrier_wait_parity_spin(v_full(vs), (g / STAGES) & 1);
                    const int valid = max(0, len_k - n0);
                    const int chunks_per_slab = (BLOCK_N - valid) * 8;
                    for (int idx = consumer * 128 + tid; idx < chunks_per_slab * Cfg::SLABS_V;
                         idx += 128 * Cfg::CONSUMER_WGS) {
                        const int slab = idx / chunks_per_slab, rest = idx % chunks_per_slab;
                        const uint32_t addr = v_stage(vs) + (uint32_t)slab * Cfg::KV_SLAB_BYTES +
                                              (uint32_t)(valid + rest / 8) * 128 + (uint32_t)(rest % 8) * 16;
                        const uint32_t zero[4] = {0u, 0u, 0u, 0u};
                        st_shared_v4_b32(addr, zero);
                    }
                    fence_proxy_async_shared_cta();
                    bar_sync(FA_HOPPER_BAR_V_TAIL, 128 * Cfg::CONSUMER_WGS);
                }
            }

            /* ---- rounds 1 .. n_tiles-1: S_j = Q K_jᵀ and O += P_{j-1} V_{j-1} in flight together */
            for (int j = 1; j < n_tiles; ++j) {
                const uint32_t g = kv_base + j, ks = g % STAGES, vs = (g - 1) % STAGES;
                float s_rmem[BLOCK_N / 2];
                mbarrier_wait_parity_spin(k_full(ks), (g / STAGES) & 1);
                fa_hopper_wait_turn<Cfg>(consumer);
                issue_s(s_rmem, ks);
                mbarrier_wait_parity_spin(v_full(vs), ((g - 1) / STAGES) & 1);
                fa_hopper_issue_pv<Cfg, BF16, FP8 != 0>(o_rmem, p_rmem, v_stage(vs));
                fa_hopper_pass_turn<Cfg>(consumer, j == n_tiles - 1);
                if constexpr (MODS) read_key_pos(ks); /* round j's tile */
                uint32_t keep[DROPOUT ? Cfg::KEEP_WORDS : 1];
                /* dropout: the first word while S_j is computed, the second inside its softmax
                 * (DROPOUT_SPLIT; else both while S_j is computed) */
                if constexpr (DROPOUT && Cfg::DROPOUT_SPLIT)
                    keep[0] = fa_hopper_dropout_word<Cfg, 0>(prm.dropout, w.batch, w.head, prm.heads_q, row0 - lane / 4,
                                                             fa_hopper_key_tile<MODS>(w, j, key_pos) * BLOCK_N);
                else if constexpr (DROPOUT && !Cfg::DROPOUT_LATE)
                    fa_hopper_dropout_bits<Cfg>(keep, prm.dropout, w.batch, w.head, prm.heads_q, row0 - lane / 4,
                                                fa_hopper_key_tile<MODS>(w, j, key_pos) * BLOCK_N);
                auto draw_second_word = [&]() {
                    if constexpr (DROPOUT && Cfg::DROPOUT_SPLIT)
                        keep[1] = fa_hopper_dropout_word<Cfg, 1>(prm.dropout, w.batch, w.head, prm.heads_q,
                                                                 row0 - lane / 4,
                                                                 fa_hopper_key_tile<MODS>(w, j, key_pos) * BLOCK_N);
                };

                uint32_t bias_rmem[BIAS ? BLOCK_N / 4 : 1]; /* BIAS: the tile's bias, loaded while S_j runs */
                bool bias_early = false;
                if constexpr (BIAS) {
                    const int n0 = fa_hopper_key_tile<MODS>(w, j, key_pos) * BLOCK_N;
                    bias_early = fa_hopper_bias_early<Cfg>(mods, w, n0);
                    if (bias_early) fa_hopper_bias_load<Cfg>(bias_rmem, mods, w, n0, row0, lane);
                }

                wgmma_wait_group<1>(); /* S_j is ready; P_{j-1} V_{j-1} may still run */
#pragma unroll
                for (int i = 0; i < BLOCK_N / 2; ++i) wgmma_fence_operand(s_rmem[i]);
                release_stage(k_empty(ks));
                pair_add(s_rmem, j);
                if (j == n_tiles - 1) release_q();
                const int n0 = fa_hopper_key_tile<MODS>(w, j, key_pos) * BLOCK_N;
                float alpha[2];
                fa_hopper_scores<Cfg, PACK, LOG2, MODS, BIAS>(s_rmem, row_max, row_sum, alpha, prm, mul, mods, w, key_pos,
                                                        needs_mask(n0), n0, row0, pack_g, pack_i, lane, bias_rmem, bias_early,
                                                        draw_second_word);
                if constexpr (DROPOUT && !Cfg::DROPOUT_LATE) fa_hopper_dropout_apply<Cfg>(s_rmem, keep);

                if constexpr (Cfg::PV_WAIT_LATE) fa_hopper_order(order_word, row_sum[0] + row_sum[1]);
                wgmma_wait_group<0>(); /* P_{j-1} V_{j-1} done: O and P_{j-1} are ours again */
#pragma unroll
                for (int i = 0; i < Cfg::DV / 2; ++i) wgmma_fence_operand(o_rmem[i]);
#pragma unroll
                for (int kk = 0; kk < Cfg::P_STEPS; ++kk)
#pragma unroll
                    for (int x = 0; x < 4; ++x) wgmma_fence_operand(p_rmem[kk][x]);
                release_stage(v_empty(vs));
                /* O was relative to the old max; P_j (next round's A) is relative to the new one */
#pragma unroll
                for (int i = 0; i < Cfg::DV / 2; ++i) o_rmem[i] *= alpha[(i >> 1) & 1];
                if constexpr (DROPOUT && Cfg::DROPOUT_LATE) {
                    fa_hopper_dropout_bits<Cfg>(keep, prm.dropout, w.batch, w.head, prm.heads_q, row0 - lane / 4, n0);
                    fa_hopper_dropout_apply<Cfg>(s_rmem, keep);
                }
                fa_hopper_convert_p<Cfg, BF16, FP8 != 0>(s_rmem, p_rmem);
            }

            /* ---- last: O += P_{n-1} V_{n-1} */
            {
                const uint32_t g = kv_base + n_tiles - 1, vs = g % STAGES;
                mbarrier_wait_parity_spin(v_full(vs), (g / STAGES) & 1);
                fa_hopper_issue_pv<Cfg, BF16, FP8 != 0>(o_rmem, p_rmem, v_stage(vs));
                wgmma_wait_group<0>();
#pragma unroll
                for (int i = 0; i < Cfg::DV / 2; ++i) wgmma_fence_operand(o_rmem[i]);
                release_stage(v_empty(vs));
            }
        } else {
            release_q(); /* no key tile: Q was never read */
        }
        kv_base += n_tiles;

        /* ---- epilogue: sink, normalisation, LSE (fa_row_end_with_sink) */
        const float sink_tile =
            !PACK && prm.sink_logits != nullptr ? prm.sink_logits[w.head] * 1.4426950408889634f : -CUDART_INF_F;
        const int64_t lse_row0 = varlen ? (int64_t)w.head * prm.total_q + w.q_start
                                        : ((int64_t)w.batch * prm.heads_q + w.head) * prm.seqlen_q;
        float inv_sum[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            /* packed: row h is query row pack_i[h] of head w.head + pack_g[h]; real iff that head is
             * in the tile and the row in the sequence (the clamp keeps the sink's load in bounds) */
            const bool pack_real = PACK && pack_g[h] < w.pack_heads && pack_i[h] < w.len_q;
            const float sink = !PACK ? sink_tile
                               : prm.sink_logits != nullptr
                                   ? prm.sink_logits[w.head + min(pack_g[h], w.pack_heads - 1)] * 1.4426950408889634f
                                   : -CUDART_INF_F;
            const float sum = fa_quad_sum(row_sum[h]);
            const fa_row_end e = fa_row_end_with_sink(row_max[h], mul.score_mul, sum, sink, prm.sink_logits != nullptr);
            /* no visible key: O = 0; a NaN score: NaN. Dropout: O = Σ Z∘P·V / Σ P, Z = keep / (1 - p) */
            inv_sum[h] =
                fa_row_scale(DROPOUT ? e.corr * prm.dropout.keep_scale : FP8 ? e.corr * v_descale : e.corr, e.sum);
            if (PACK) {
                if (prm.lse != nullptr && lane % 4 == 0 && pack_real)
                    prm.lse[lse_row0 + (int64_t)pack_g[h] * prm.seqlen_q + pack_i[h]] = fa_row_lse(e.m, e.sum);
                continue;
            }
            const int row = row0 + 8 * h;
            if (prm.lse != nullptr && lane % 4 == 0 && row < w.len_q && rank == 0)
                prm.lse[lse_row0 + row] = fa_row_lse(e.m, e.sum);
        }

        /* The staging rows are free again: the previous tile's TMA store has read them (thread 0
         * issued it and waits here), or this warpgroup's st.global copy of them is done (the
         * barrier). With O in Q's buffer, the Q TMA of this tile is complete (q_full above). */
        if (!PACK && prm.tma_store && tid == 0) tma_store_wait_group_read<0>();
        bar_sync(FA_HOPPER_BAR_EPILOGUE_FIRST + consumer, 128);

        /* O -> this consumer's 64 rows of the staging tile (pair: this CTA's columns), in
         * the 128-byte swizzle: element (r, col) of slab col/64 sits at r·128 + ((col%64/8) ^ (r%8))·16 +
         * (col%8)·2. Each thread stores the pair d[4j+2h], d[4j+2h+1] (row r0 + 8h, columns
         * 8j + 2(l%4) + {0,1}): one 4-byte store; per store instruction the 8 rows of a warp hit 8
         * different 16-byte chunks and the 4 lanes of a quad the 4 words of each, so the 32 lanes
         * cover all 32 banks. */
        const int tile_row = 64 * consumer + 16 * warp + lane / 4; /* row of h = 0; (r + 8) % 8 == r % 8 */
#pragma unroll
        for (int j = 0; j < Cfg::DV / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint32_t addr = o_smem + (uint32_t)(j / 8) * Cfg::O_SLAB_BYTES +
                                      (uint32_t)(tile_row + 8 * h) * 128 +
                                      (uint32_t)(((j % 8) ^ (tile_row % 8)) * 16) + (uint32_t)(lane % 4) * 4;
                st_shared_b32(addr, fa_hopper_pack2<BF16>(o_rmem[4 * j + 2 * h] * inv_sum[h],
                                                          o_rmem[4 * j + 2 * h + 1] * inv_sum[h]));
            }

        /* the TMA store's box clips rows at the map's end: a fixed-length sequence's, but only the
         * last varlen sequence's (the next sequence's rows follow), so a varlen warpgroup whose
         * rows end inside the sequence's last 64 stores them with st.global */
        if (!PACK && prm.tma_store && (!varlen || wg_row_first + 64 <= w.len_q)) {
            /* st.shared (generic proxy) -> TMA store (async proxy): each writer fences, then the
             * warpgroup's 128 threads meet before one of them issues the stores. Its completion
             * is awaited only before the buffer is written again (next tile, or kernel end). */
            fence_proxy_async_shared_cta();
            bar_sync(FA_HOPPER_BAR_EPILOGUE_FIRST + consumer, 128);
            if (tid == 0) {
                if (wg_row_first < w.len_q) /* else every row is past the sequence */
#pragma unroll
                    for (int slab = 0; slab < Cfg::SLABS_V; ++slab) {
                        const int col = col_base + 64 * slab;
                        if (Cfg::CTAS == 1 || col < prm.head_dim_v) /* pair: rank 1 may hold only padding */
                            tma_store_4d(&tmap_o, o_wg + (uint32_t)slab * Cfg::O_SLAB_BYTES, col,
                                         wg_row_first + (varlen ? (int)w.q_start : 0), w.head, varlen ? 0 : w.batch);
                    }
                tma_store_commit_group();
                if (!Cfg::O_OWN) {
                    tma_store_wait_group_read<0>(); /* Q's buffer is read: the next Q may land */
                    mbarrier_arrive(q_empty);
                }
            } else if (!Cfg::O_OWN && lane == 0) {
                mbarrier_arrive(q_empty); /* this warp's O is in smem (the barrier) and its slot read done */
            }
        } else {
            /* The warpgroup's rows are complete in smem after its barrier; then 16-byte chunks of
             * the valid rows (< len_q) and columns (< dv) go out, consecutive threads on
             * consecutive chunks of a row. */
            bar_sync(FA_HOPPER_BAR_EPILOGUE_FIRST + consumer, 128);
            uint16_t *o_gmem = static_cast<uint16_t *>(prm.o) + (int64_t)w.head * prm.o_head_stride +
                               (varlen ? w.q_start * prm.o_row_stride : (int64_t)w.batch * prm.o_batch_stride);
            /* this CTA's 16-byte chunks of a row below dv (pair: of its columns; the staging tile
             * holds them from chunk 0) */
            const int chunk_lo = col_base / 8;
            const int row_chunks = Cfg::CTAS == 2 ? max(0, min(Cfg::DV / 8, prm.head_dim_v / 8 - chunk_lo))
                                                  : prm.head_dim_v / 8;
            /* packed: every row of the warpgroup is looked at, the real ones (head g < pack_heads,
             * i < len_q) go to head w.head + g, row i */
            const int rows = PACK ? 64 : max(0, min(64, w.len_q - wg_row_first));
            for (int idx = tid; idx < rows * row_chunks; idx += 128) {
                const int r = idx / row_chunks, chunk = idx % row_chunks; /* in the staging tile */
                const int tr = 64 * consumer + r;
                const int pg = PACK ? tr / prm.pack_rows : 0, pi = PACK ? tr - pg * prm.pack_rows : 0;
                if (PACK && (pg >= w.pack_heads || pi >= w.len_q)) continue;
                uint32_t v4[4];
                ld_shared_v4_b32(v4, o_smem + (uint32_t)(chunk / 8) * Cfg::O_SLAB_BYTES + (uint32_t)tr * 128 +
                                         (uint32_t)(((chunk % 8) ^ (tr % 8)) * 16));
                if (PACK)
                    st_global_v4_b32(o_gmem + (int64_t)pg * prm.o_head_stride + (int64_t)pi * prm.o_row_stride +
                                         chunk * 8,
                                     v4);
                else
                    st_global_v4_b32(o_gmem + (int64_t)(wg_row_first + r) * prm.o_row_stride + (chunk_lo + chunk) * 8,
                                     v4);
            }
            if (!Cfg::O_OWN) {
                bar_sync(FA_HOPPER_BAR_EPILOGUE_FIRST + consumer, 128); /* every read of Q's buffer done */
                if (lane == 0) mbarrier_arrive(q_empty);
            }
        }
        ++tiles_done;
    }
    /* the shared-memory source of the last TMA store must outlive its reads */
    if (!PACK && prm.tma_store && tid == 0) tma_store_wait_group_read<0>();
    if (mcast) cluster_sync(); /* with the producer warpgroup: see its end */
}

/* ---- host ------------------------------------------------------------------------------------ */

/* Packing mode from the environment (sm90_tiles.h's fa_hopper_pack_gqa): FA_CUDA_PACK_GQA=0
 * never packs (timing, bisecting), =1 packs whenever at least 2 query heads fit in a tile, unset
 * or anything else: the default. */
static int fa_hopper_pack_mode(void) {
    const char *mode = getenv("FA_CUDA_PACK_GQA");
    if (mode == nullptr) return 0;
    return strcmp(mode, "1") == 0 ? 1 : strcmp(mode, "0") == 0 ? -1 : 0;
}

/* The grid of a launch (sm90_tiles.h's rules): persistent (one CTA per multiprocessor walking a
 * static share, snake order, every unit in one head group), dynamic (one CTA per multiprocessor
 * taking tiles from a counter, heavy-first tiles in head groups) or one CTA per tile (heavy-first
 * tiles in head groups, fa_cuda_head_group). Sets prm.snake, prm.head_group and prm.tile_counter;
 * *grid = 0 when there is no tile. The dynamic schedule's counter is allocated in *counter and
 * zeroed on the stream here; the caller releases it after the launch (fa_cuda_workspace_release;
 * nothing to release otherwise). More tiles than a grid dimension holds always take a persistent
 * grid; the counter is 32-bit: more tiles than it counts fall back to the static walk. `ctas`: CTAs
 * per tile (bucket 512's pairs, one tile per cluster: the grid counts tiles, and half as many tiles
 * as multiprocessors run at once). */
static fa_status fa_hopper_schedule(fa_hopper_params &prm, bool persistent, bool dynamic, int ctas, int device_ordinal,
                                    cudaStream_t stream, int64_t *grid, fa_cuda_workspace *counter) {
    counter->base = nullptr;
    counter->owned = false;
    prm.tile_counter = nullptr;
    int sm_count = 0;
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device_ordinal),
                  "cudaDeviceGetAttribute(multiprocessor count)");
    /* FA_HOPPER_FWD_GRID_MAX=n caps the persistent and dynamic grids at n CTAs (tests: many tiles
     * per CTA on small problems, for compute-sanitizer) */
    const char *grid_max = getenv("FA_HOPPER_FWD_GRID_MAX");
    if (grid_max != nullptr && atoi(grid_max) > 0 && atoi(grid_max) < sm_count) sm_count = atoi(grid_max);
    if (prm.total_tiles > INT32_MAX) persistent = true; /* more tiles than a grid dimension holds */
    if (prm.total_tiles > (int64_t)UINT32_MAX - sm_count) dynamic = false;
    if (prm.total_tiles <= sm_count) dynamic = false; /* every CTA has its tile: nothing to hand out */
    prm.snake = persistent && !dynamic && fa_hopper_snake_order();
    /* heavy-first tiles: head groups for one CTA per tile (one resident per multiprocessor) and
     * for the dynamic schedule, which hands them out in the same order; the static persistent
     * grid's snake split takes them longest first over all units */
    const int64_t units = (int64_t)prm.heads_q * prm.batch;
    prm.head_group = persistent && !dynamic ? (int)(units < INT32_MAX ? units : INT32_MAX)
                                            : fa_cuda_head_group(prm.num_m_blocks, sm_count / ctas);
    *grid = (persistent || dynamic) && prm.total_tiles > sm_count ? sm_count : prm.total_tiles;
    if (!dynamic) return FA_OK;
    fa_status s = fa_cuda_workspace_acquire(nullptr, sizeof(unsigned int), stream, "tile counter", counter);
    if (s != FA_OK) return s;
    const cudaError_t e = cudaMemsetAsync(counter->base, 0, sizeof(unsigned int), stream);
    if (e != cudaSuccess)
        return fa_cuda_workspace_release(counter, stream, "tile counter",
                                         fa_set_error(FA_ERR_CUDA, "cudaMemsetAsync(tile counter): %s",
                                                      cudaGetErrorString(e)));
    prm.tile_counter = reinterpret_cast<unsigned int *>(counter->base);
    return FA_OK;
}

/* FA_HOPPER_FWD_SCHEDULE=static / dynamic forces the schedule of the tile rules' grids (timing):
 * static = the persistent walk for even tiles and one CTA per tile for heavy-first ones (the rule
 * before the dynamic schedule), dynamic = the dynamic schedule for every tile order. 0 = the rule. */
static int fa_hopper_schedule_forced() {
    const char *mode = getenv("FA_HOPPER_FWD_SCHEDULE");
    if (mode == nullptr) return 0;
    return strcmp(mode, "static") == 0 ? 1 : strcmp(mode, "dynamic") == 0 ? 2 : 0;
}

/* Sets the kernel's shared-memory opt-in (once per device and instantiation) and launches it. */
template <int BUCKET, bool BF16, bool PACK, bool LOG2, bool DROPOUT, int MODS_KIND = FA_HOPPER_MODS_NONE,
          int FP8 = FA_HOPPER_16BIT>
static fa_status fa_hopper_run(const CUtensorMap &tmap_q, const CUtensorMap &tmap_k, const CUtensorMap &tmap_v,
                               const CUtensorMap &tmap_o, const fa_hopper_params &prm, int64_t grid,
                               int device_ordinal, cudaStream_t stream, const fa_mods_params *mods = nullptr) {
    using Cfg = fa_hopper_config<BUCKET, FP8>;
    /* > 48 KiB of dynamic shared memory needs the per-device opt-in, set once per device. */
    static unsigned long long configured = 0;
    const unsigned long long bit = device_ordinal < 64 ? 1ull << device_ordinal : 0ull;
    if (bit == 0 || !(__atomic_load_n(&configured, __ATOMIC_ACQUIRE) & bit)) {
        FA_CUDA_CHECK(cudaFuncSetAttribute(fa_hopper_fwd_kernel<BUCKET, BF16, PACK, LOG2, DROPOUT, MODS_KIND, FP8>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Cfg::SMEM_BYTES),
                      "cudaFuncSetAttribute(Hopper forward shared memory)");
        __atomic_fetch_or(&configured, bit, __ATOMIC_RELEASE);
    }
    constexpr bool MODS = MODS_KIND != FA_HOPPER_MODS_NONE;
    fa_mods_arg<MODS> mods_arg;
    if constexpr (MODS) static_cast<fa_mods_params &>(mods_arg) = *mods;
    auto kernel = fa_hopper_fwd_kernel<BUCKET, BF16, PACK, LOG2, DROPOUT, MODS_KIND, FP8>;
    /* K/V multicast: clusters of two CTAs on neighbouring tiles (grid counts CTAs, an even number);
     * a persistent grid no larger than the pairs that can be resident at once, so that no CTA's
     * share waits for another cluster to finish */
    if (prm.kv_multicast) {
        grid = grid >= 2 ? grid / 2 * 2 : 2;
        static int max_pairs[64]; /* per device, once: the occupancy query costs a driver call */
        if (grid < prm.total_tiles && device_ordinal >= 0 && device_ordinal < 64) {
            if (__atomic_load_n(&max_pairs[device_ordinal], __ATOMIC_ACQUIRE) == 0) {
                int clusters = 0;
                FA_CUDA_CHECK(fa_cuda_max_clusters(kernel, Cfg::THREADS, Cfg::SMEM_BYTES, 2, &clusters),
                              "cudaOccupancyMaxActiveClusters(Hopper forward)");
                __atomic_store_n(&max_pairs[device_ordinal], clusters > 0 ? clusters : 1, __ATOMIC_RELEASE);
            }
            const int pairs = __atomic_load_n(&max_pairs[device_ordinal], __ATOMIC_ACQUIRE);
            if (grid > 2 * (int64_t)pairs) grid = 2 * (int64_t)pairs;
        }
    }
    /* bucket 512: clusters of two CTAs along x, the pair of one query tile (grid counts tiles) */
    const int ctas = prm.kv_multicast ? 2 : Cfg::CTAS;
    FA_CUDA_CHECK(fa_cuda_launch_clusters(kernel, dim3((unsigned)(grid * Cfg::CTAS)), Cfg::THREADS, Cfg::SMEM_BYTES,
                                          stream, ctas, tmap_q, tmap_k, tmap_v, tmap_o, prm, mods_arg),
                  "Hopper forward kernel launch");
    FA_CUDA_CHECK_LAUNCH("Hopper forward kernel launch");
    return FA_OK;
}

template <int BUCKET, bool BF16>
static fa_status fa_hopper_dispatch(const CUtensorMap &tmap_q, const CUtensorMap &tmap_k, const CUtensorMap &tmap_v,
                                    const CUtensorMap &tmap_o, const fa_hopper_params &prm, int64_t grid, bool pack,
                                    bool log2, bool dropout, const fa_mods_params *mods, int device_ordinal,
                                    cudaStream_t stream);

template <int BUCKET, bool BF16>
static fa_status fa_hopper_launch(const fa_fwd_params *p, const fa_dropout_params *dropout,
                                  const fa_mods_params *mods, int device_ordinal, cudaStream_t stream) {
    using Cfg = fa_hopper_config<BUCKET>;
    const CUtensorMapDataType type = BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const bool varlen = p->cu_seqlens_q != nullptr;
    /* Packed GQA/MQA tiles (sm90_tiles.h): query heads per tile, 0 = unpacked. */
    /* ALiBi, or a negative scale without softcap: the LOG2 kernel (scores in log2 units before the
     * mask and the max), never packed */
    const float log2_mul = p->softcap_pre != 0.0f ? p->softcap_post_log2 : p->scale_log2;
    /* score modifications (MODS): always in log2 units (the bias is added there), never packed */
    const bool log2 = p->alibi_slopes != nullptr || !(log2_mul > 0.0f) || mods != nullptr;
    /* dropout (its own instantiations, LOG2 or not): never packed, the mask's rows are (head, i) */
    const int pack_heads = log2 || dropout != nullptr
                               ? 0
                               : fa_hopper_pack_gqa(BUCKET, p->seqlen_q, p->group, varlen, fa_hopper_pack_mode());
    const bool pack = pack_heads > 0;
    /* Varlen maps: the packed rows, batch extent 1. No key row at all: no key tile is ever
     * loaded, but the maps must still be valid (they then point at q). */
    const int64_t rows_q = varlen ? p->total_q : p->seqlen_q;
    const int64_t rows_k = varlen ? p->total_k : p->seqlen_k;
    const int64_t map_batch = varlen ? 1 : p->batch;
    const bool no_keys = rows_k == 0;
    static const char *const path = "the Hopper forward";
    CUtensorMap tmap_q, tmap_k, tmap_v, tmap_o;
    fa_status st;
    /* packed: one box per query head, pack_rows rows (seqlen_q rounded up to 8) */
    const int q_box_rows = pack ? fa_hopper_pack_rows(p->seqlen_q) : Cfg::BLOCK_M;
    if ((st = fa_hopper_make_map(&tmap_q, path, "q", type, p->q, p->head_dim, rows_q, p->heads_q, map_batch,
                                 p->q_row_stride, p->q_head_stride, p->q_batch_stride, q_box_rows)) != FA_OK ||
        (st = fa_hopper_make_map(&tmap_k, path, "k", type, no_keys ? p->q : p->k, p->head_dim, no_keys ? 1 : rows_k,
                                 no_keys ? 1 : p->heads_kv, no_keys ? 1 : map_batch, p->k_row_stride,
                                 p->k_head_stride, p->k_batch_stride, Cfg::BLOCK_N)) != FA_OK ||
        (st = fa_hopper_make_map(&tmap_v, path, "v", type, no_keys ? p->q : p->v, p->head_dim_v, no_keys ? 1 : rows_k,
                                 no_keys ? 1 : p->heads_kv, no_keys ? 1 : map_batch, p->v_row_stride,
                                 p->v_head_stride, p->v_batch_stride, Cfg::BLOCK_N)) != FA_OK)
        return st;
    if (!pack) {
        if ((st = fa_hopper_make_map(&tmap_o, path, "o", type, p->o, p->head_dim_v, rows_q, p->heads_q, map_batch,
                                     p->o_row_stride, p->o_head_stride, p->o_batch_stride, 64)) != FA_OK)
            return st;
    } else {
        tmap_o = tmap_q; /* unused: the packed epilogue stores with st.global */
    }

    fa_hopper_params prm;
    static_cast<fa_fwd_params &>(prm) = *p;
    prm.log2_mul = log2_mul;
    prm.score_mul = log2 ? 1.0f : log2_mul;
    if (mods != nullptr && mods->bias == nullptr && p->alibi_slopes == nullptr && log2_mul > 0.0f) {
        /* masks alone are -inf in any unit: the MODS kernel keeps raw scores (fa_hopper_to_log2
         * skips a multiplier of 1) and the softmax scales them, as the plain kernels do */
        prm.log2_mul = 1.0f;
        prm.score_mul = log2_mul;
    }
    prm.tma_store = !pack;
    prm.dropout = dropout != nullptr ? *dropout : fa_dropout_params{};
    if (pack) {
        prm.pack_rows = fa_hopper_pack_rows(p->seqlen_q);
        prm.pack_heads = pack_heads;
        prm.pack_tiles = (p->group + pack_heads - 1) / pack_heads;
        prm.num_m_blocks = 1;
        prm.total_tiles = (int64_t)prm.pack_tiles * p->heads_kv * p->batch;
        prm.heavy_first = 0; /* every packed tile streams the same key range */
    } else {
        prm.pack_rows = prm.pack_heads = prm.pack_tiles = 0;
        prm.num_m_blocks = (p->seqlen_q + Cfg::BLOCK_M - 1) / Cfg::BLOCK_M;
        prm.total_tiles = (int64_t)prm.num_m_blocks * p->heads_q * p->batch;
        prm.heavy_first = fa_fwd_heavy_first(p->window_left, p->window_right);
        /* a block mask: tiles of uneven length, later query blocks usually the longer ones (causal,
         * prefix-LM, document masks): the heavy-first schedules, longest first */
        if (mods != nullptr && mods->block_map != nullptr) prm.heavy_first = 1;
    }
    /* The grid (sm90_tiles.h's rules; a block map is heavy-first: the dynamic schedule). */
    const int forced = fa_hopper_schedule_forced();
    /* bucket 512's pairs walk one tile per cluster: never persistent or dynamic */
    const bool dynamic = Cfg::CTAS == 1 && (forced == 2 || (forced == 0 && fa_hopper_dynamic(BUCKET, prm.heavy_first)));
    const bool persistent = fa_hopper_persistent(BUCKET, prm.heavy_first, 0);
    if (Cfg::CTAS == 2 && prm.total_tiles > INT32_MAX / 2)
        return fa_set_error(FA_ERR_INVALID_SIZE, "%s: %lld query tiles (d or dv > 256) exceed a grid of CTA pairs", path,
                            (long long)prm.total_tiles);
    /* K/V multicast pairs: the static walk only (FA_HOPPER_FWD_MULTICAST=0 turns them off: timing) */
    const char *mc_env = getenv("FA_HOPPER_FWD_MULTICAST");
    prm.kv_multicast = !dynamic && !(mc_env != nullptr && strcmp(mc_env, "0") == 0) &&
                       fa_hopper_fwd_kv_multicast(BUCKET, varlen, pack, mods != nullptr, p->window_left,
                                                  p->window_right, prm.num_m_blocks);
    int64_t grid = 0;
    fa_cuda_workspace counter;
    fa_status st_grid = fa_hopper_schedule(prm, persistent, dynamic, Cfg::CTAS, device_ordinal, stream, &grid, &counter);
    if (st_grid != FA_OK || grid == 0) return st_grid;
    return fa_cuda_workspace_release(&counter, stream, "tile counter",
                                     fa_hopper_dispatch<BUCKET, BF16>(tmap_q, tmap_k, tmap_v, tmap_o, prm, grid, pack,
                                                                      log2, dropout != nullptr, mods, device_ordinal,
                                                                      stream));
}

/* The instantiation of a launch: MODS, DROPOUT (LOG2 or not), LOG2, packed or plain. */
template <int BUCKET, bool BF16>
static fa_status fa_hopper_dispatch(const CUtensorMap &tmap_q, const CUtensorMap &tmap_k, const CUtensorMap &tmap_v,
                                    const CUtensorMap &tmap_o, const fa_hopper_params &prm, int64_t grid, bool pack,
                                    bool log2, bool dropout, const fa_mods_params *mods, int device_ordinal,
                                    cudaStream_t stream) {
    const fa_fwd_params *p = &prm;
    if (mods != nullptr) {
        if constexpr (BUCKET == 64) /* fa_hopper_mods_bucket: never sent here */
            return fa_set_error(FA_ERR_UNSUPPORTED, "head_dim = %d: no Hopper forward with score modifications",
                                p->head_dim);
        else if (mods->bias != nullptr)
            return fa_hopper_run<BUCKET, BF16, false, true, false, FA_HOPPER_MODS_BIAS>(
                tmap_q, tmap_k, tmap_v, tmap_o, prm, grid, device_ordinal, stream, mods);
        else
            return fa_hopper_run<BUCKET, BF16, false, true, false, FA_HOPPER_MODS_MASKS>(
                tmap_q, tmap_k, tmap_v, tmap_o, prm, grid, device_ordinal, stream, mods);
    }
    if (dropout)
        return log2 ? fa_hopper_run<BUCKET, BF16, false, true, true>(tmap_q, tmap_k, tmap_v, tmap_o, prm, grid,
                                                                     device_ordinal, stream)
                    : fa_hopper_run<BUCKET, BF16, false, false, true>(tmap_q, tmap_k, tmap_v, tmap_o, prm, grid,
                                                                      device_ordinal, stream);
    if (log2)
        return fa_hopper_run<BUCKET, BF16, false, true, false>(tmap_q, tmap_k, tmap_v, tmap_o, prm, grid,
                                                               device_ordinal, stream);
    if constexpr (fa_hopper_fwd_cluster_ctas(BUCKET) == 1) { /* bucket 512 is never packed (fa_hopper_pack_heads) */
        if (pack)
            return fa_hopper_run<BUCKET, BF16, true, false, false>(tmap_q, tmap_k, tmap_v, tmap_o, prm, grid,
                                                                   device_ordinal, stream);
    }
    return fa_hopper_run<BUCKET, BF16, false, false, false>(tmap_q, tmap_k, tmap_v, tmap_o, prm, grid,
                                                            device_ordinal, stream);
}

extern "C" fa_status fa_fwd_launch_hopper(const fa_fwd_params *prm, const fa_dropout_params *dropout,
                                          const fa_mods_params *mods, fa_dtype dtype, int device_ordinal,
                                          cudaStream_t stream) {
    const bool bf16 = dtype == FA_DTYPE_BF16;
    const int bucket = fa_hopper_bucket(prm->head_dim, prm->head_dim_v);
    switch (mods != nullptr ? fa_hopper_mods_bucket(bucket) : bucket) {
    case 64:
        return bf16 ? fa_hopper_launch<64, true>(prm, dropout, mods, device_ordinal, stream)
                    : fa_hopper_launch<64, false>(prm, dropout, mods, device_ordinal, stream);
    case 128:
        return bf16 ? fa_hopper_launch<128, true>(prm, dropout, mods, device_ordinal, stream)
                    : fa_hopper_launch<128, false>(prm, dropout, mods, device_ordinal, stream);
    case 192: /* d <= 192, dv <= 128 */
        return bf16 ? fa_hopper_launch<192, true>(prm, dropout, mods, device_ordinal, stream)
                    : fa_hopper_launch<192, false>(prm, dropout, mods, device_ordinal, stream);
    case 256:
        return bf16 ? fa_hopper_launch<256, true>(prm, dropout, mods, device_ordinal, stream)
                    : fa_hopper_launch<256, false>(prm, dropout, mods, device_ordinal, stream);
    case 512: /* CTA pairs: d, dv <= 512 */
        return bf16 ? fa_hopper_launch<512, true>(prm, dropout, mods, device_ordinal, stream)
                    : fa_hopper_launch<512, false>(prm, dropout, mods, device_ordinal, stream);
    default:
        return fa_set_error(FA_ERR_HEAD_DIM, "head_dim = %d, head_dim_v = %d: no Hopper forward kernel",
                            prm->head_dim, prm->head_dim_v);
    }
}

/* ---- fp8: Vᵀ pre-pass and launch ------------------------------------------------------------- */

/* Varlen: vt_start[b] = Σ_{i<b} ceil(len_k(i) / BLOCK_N) · BLOCK_N (the clamped lengths the
 * forward walks), vt_start[batch] = the total. One block of 1024 threads: each sums a contiguous
 * run of sequences, the run totals are scanned in shared memory, then each writes its run. */
template <int BLOCK_N>
__global__ void __launch_bounds__(1024) fa_hopper_fp8_vt_start_kernel(const int32_t *cu_seqlens_k, /* [batch + 1] */
                                                                      int64_t total_k, int batch,
                                                                      int *vt_start) { /* [batch + 1] */
    __shared__ long long run_smem[1024];
    const int per = (batch + 1023) / 1024, lo = min(batch, (int)threadIdx.x * per), hi = min(batch, lo + per);
    auto padded = [&](int b) -> long long {
        const fa_seq_rows r = fa_sequence_rows(cu_seqlens_k, cu_seqlens_k, total_k, total_k, 0, 0, b);
        return ((long long)r.len_k + BLOCK_N - 1) / BLOCK_N * BLOCK_N;
    };
    long long sum = 0;
    for (int b = lo; b < hi; ++b) sum += padded(b);
    run_smem[threadIdx.x] = sum;
    __syncthreads();
    /* inclusive Hillis-Steele scan over the 1024 run totals */
    for (int off = 1; off < 1024; off *= 2) {
        const long long add = threadIdx.x >= (unsigned)off ? run_smem[threadIdx.x - off] : 0;
        __syncthreads();
        run_smem[threadIdx.x] += add;
        __syncthreads();
    }
    long long start = run_smem[threadIdx.x] - sum;
    for (int b = lo; b < hi; ++b) {
        vt_start[b] = (int)min(start, (long long)INT32_MAX);
        start += padded(b);
    }
    if (threadIdx.x == 1023) vt_start[batch] = (int)min(run_smem[1023], (long long)INT32_MAX);
}

/* Vᵀ for the fp8 forward: for kv head blockIdx.y of sequence blockIdx.z, every key tile t
 * (t = blockIdx.x, + gridDim.x, ...) of BLOCK_N keys: vt[h][c][row0 + t·BLOCK_N + slot(key)] =
 * v[key][c] for c < dv, zeros for keys past the sequence (fa_hopper_fp8_vt_slot's order). The
 * tile goes through shared memory [BLOCK_N keys][dv + 8] (8-byte loads in, 16 slots of one
 * column out per store; the 8-byte pad spreads a column's bytes over the banks). Tiles that
 * would end past vt_rows (only for cu_seqlens that overlap) are not written. */
template <int BLOCK_N>
__global__ void __launch_bounds__(256) fa_hopper_fp8_vt_kernel(const uint8_t *v, /* [b, sk, hkv, dv] or [total_k, hkv, dv] */
                                                               int64_t v_batch_stride, int64_t v_row_stride,
                                                               int64_t v_head_stride, const int32_t *cu_seqlens_k,
                                                               int64_t total_k, int seqlen_k, int head_dim_v,
                                                               uint8_t *vt, /* [hkv][dv][vt_rows] */
                                                               int64_t vt_rows, const int *vt_start, int vt_seq_rows) {
    extern __shared__ __align__(16) uint8_t vtile_smem[];
    const int h = blockIdx.y, b = blockIdx.z, dv = head_dim_v, pitch = dv + 8, chunks = dv / 8;
    const fa_seq_rows seq = fa_sequence_rows(cu_seqlens_k, cu_seqlens_k, total_k, total_k, seqlen_k, seqlen_k, b);
    const int64_t row0 = cu_seqlens_k != nullptr ? vt_start[b] : (int64_t)b * vt_seq_rows;
    const uint8_t *src = v + (int64_t)h * v_head_stride +
                         (cu_seqlens_k != nullptr ? seq.k_start * v_row_stride : (int64_t)b * v_batch_stride);
    for (int t = blockIdx.x; (int64_t)t * BLOCK_N < seq.len_k; t += gridDim.x) {
        if (row0 + (int64_t)(t + 1) * BLOCK_N > vt_rows) return;
        __syncthreads(); /* the previous tile's reads of the staging are done */
        for (int idx = threadIdx.x; idx < BLOCK_N * chunks; idx += 256) {
            const int key = idx / chunks, c = idx % chunks;
            const int64_t k = (int64_t)t * BLOCK_N + key;
            uint2 x = make_uint2(0u, 0u);
            if (k < seq.len_k) x = *reinterpret_cast<const uint2 *>(src + k * v_row_stride + 8 * c);
            *reinterpret_cast<uint2 *>(vtile_smem + key * pitch + 8 * c) = x;
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < dv * (BLOCK_N / 16); idx += 256) {
            const int c = idx / (BLOCK_N / 16), s0 = idx % (BLOCK_N / 16) * 16;
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                const uint32_t byte = vtile_smem[fa_hopper_fp8_vt_key(s0 + i) * pitch + c];
                w[i / 4] = (i % 4 == 0 ? 0u : w[i / 4]) | byte << (8 * (i % 4));
            }
            *reinterpret_cast<uint4 *>(vt + ((int64_t)h * dv + c) * vt_rows + row0 + (int64_t)t * BLOCK_N + s0) =
                make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

template <int BUCKET, int FP8>
static fa_status fa_hopper_fp8_launch(const fa_fwd_params *p, const float *q_descale, const float *k_descale,
                                      const float *v_descale, void *workspace, int device_ordinal,
                                      cudaStream_t stream) {
    using Cfg = fa_hopper_config<BUCKET, FP8>;
    static const char *const path = "the Hopper fp8 forward";
    const bool varlen = p->cu_seqlens_q != nullptr;
    const int64_t rows_q = varlen ? p->total_q : p->seqlen_q;
    const int64_t rows_k = varlen ? p->total_k : p->seqlen_k;
    const int64_t map_batch = varlen ? 1 : p->batch;
    const bool no_keys = rows_k == 0;
    const int64_t vt_rows = fa_hopper_fp8_vt_rows(BUCKET, varlen, p->batch, p->seqlen_k, p->total_k);
    uint8_t *vt = static_cast<uint8_t *>(workspace);
    int *vt_start = varlen ? reinterpret_cast<int *>(vt + ((size_t)p->heads_kv * p->head_dim_v * vt_rows + 15) / 16 * 16)
                           : nullptr;
    CUtensorMap tmap_q, tmap_k, tmap_v, tmap_o;
    fa_status st;
    const CUtensorMapDataType u8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;
    if ((st = fa_hopper_make_map_rows(&tmap_q, path, "q", u8, p->q, p->head_dim, rows_q, p->heads_q, map_batch,
                                      p->q_row_stride, p->q_head_stride, p->q_batch_stride, Cfg::BLOCK_M,
                                      Cfg::QK_ROW_BYTES)) != FA_OK ||
        (st = fa_hopper_make_map_rows(&tmap_k, path, "k", u8, no_keys ? p->q : p->k, p->head_dim,
                                      no_keys ? 1 : rows_k, no_keys ? 1 : p->heads_kv, no_keys ? 1 : map_batch,
                                      p->k_row_stride, p->k_head_stride, p->k_batch_stride, Cfg::BLOCK_N,
                                      Cfg::QK_ROW_BYTES)) != FA_OK)
        return st;
    /* V transposed in the kernel: V as stored, K's map (box {DV, BLOCK_N}, columns past dv read as
     * zeros); else Vᵀ {vt_rows, dv, hkv, 1}: box {BLOCK_N keys, DV columns} */
    if (no_keys) {
        tmap_v = tmap_k;
    } else if (Cfg::VT_IN_KERNEL) {
        if ((st = fa_hopper_make_map_rows(&tmap_v, path, "v", u8, p->v, p->head_dim_v, rows_k, p->heads_kv, map_batch,
                                          p->v_row_stride, p->v_head_stride, p->v_batch_stride, Cfg::BLOCK_N,
                                          Cfg::QK_ROW_BYTES)) != FA_OK)
            return st;
    } else if ((st = fa_hopper_make_map(&tmap_v, path, "v (transposed copy)", u8, vt, vt_rows, p->head_dim_v,
                                        p->heads_kv, 1, vt_rows, (int64_t)p->head_dim_v * vt_rows, 16, Cfg::DV)) != FA_OK)
        return st;
    const bool tma_store = !varlen;
    if (tma_store) {
        if ((st = fa_hopper_make_map(&tmap_o, path, "o", CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, p->o, p->head_dim_v, rows_q,
                                     p->heads_q, map_batch, p->o_row_stride, p->o_head_stride, p->o_batch_stride,
                                     64)) != FA_OK)
            return st;
    } else {
        tmap_o = tmap_q; /* unused: the varlen epilogue stores with st.global */
    }
    /* V's 8-byte loads in the pre-pass */
    if (!Cfg::VT_IN_KERNEL && (((uintptr_t)p->v & 7u) != 0 || p->v_row_stride % 8 != 0 ||
                               p->v_head_stride % 8 != 0 || (!varlen && p->v_batch_stride % 8 != 0)))
        return fa_set_error(FA_ERR_STRIDE, "v: %s needs 8-byte aligned rows", path);

    if (!no_keys && !Cfg::VT_IN_KERNEL) {
        if (varlen) {
            fa_hopper_fp8_vt_start_kernel<Cfg::BLOCK_N><<<1, 1024, 0, stream>>>(p->cu_seqlens_k, p->total_k, p->batch,
                                                                                vt_start);
            FA_CUDA_CHECK_LAUNCH("fp8 forward: Vᵀ sequence starts");
        }
        const int tiles = (p->seqlen_k + Cfg::BLOCK_N - 1) / Cfg::BLOCK_N;
        static_assert(Cfg::BLOCK_N * (Cfg::DV + 8) <= 48 * 1024, "the Vᵀ staging needs no shared-memory opt-in");
        const size_t smem = (size_t)Cfg::BLOCK_N * (size_t)(p->head_dim_v + 8);
        if (tiles > 0) {
            fa_hopper_fp8_vt_kernel<Cfg::BLOCK_N><<<dim3((unsigned)tiles, (unsigned)p->heads_kv, (unsigned)p->batch), 256,
                                                    smem, stream>>>(
                static_cast<const uint8_t *>(p->v), p->v_batch_stride, p->v_row_stride, p->v_head_stride,
                p->cu_seqlens_k, p->total_k, p->seqlen_k, p->head_dim_v, vt, vt_rows, vt_start,
                (int)(vt_rows / (varlen ? 1 : p->batch)));
            FA_CUDA_CHECK_LAUNCH("fp8 forward: Vᵀ");
        }
    }

    fa_hopper_params prm;
    static_cast<fa_fwd_params &>(prm) = *p;
    prm.log2_mul = p->scale_log2;
    prm.score_mul = p->softcap_pre != 0.0f ? p->softcap_post_log2 : p->scale_log2;
    prm.tma_store = tma_store;
    prm.kv_multicast = 0;
    prm.dropout = fa_dropout_params{};
    prm.pack_rows = prm.pack_heads = prm.pack_tiles = 0;
    prm.num_m_blocks = (p->seqlen_q + Cfg::BLOCK_M - 1) / Cfg::BLOCK_M;
    prm.total_tiles = (int64_t)prm.num_m_blocks * p->heads_q * p->batch;
    prm.heavy_first = fa_fwd_heavy_first(p->window_left, p->window_right);
    prm.q_descale = q_descale;
    prm.k_descale = k_descale;
    prm.v_descale = v_descale;
    prm.vt_start = vt_start;
    prm.vt_seq_rows = varlen ? 0 : (int)(vt_rows / p->batch);
    int64_t grid = 0;
    fa_cuda_workspace counter;
    if ((st = fa_hopper_schedule(prm, fa_hopper_persistent(BUCKET, prm.heavy_first, 1),
                                 fa_hopper_dynamic(BUCKET, prm.heavy_first), 1, device_ordinal, stream, &grid,
                                 &counter)) != FA_OK ||
        grid == 0)
        return st;
    return fa_cuda_workspace_release(&counter, stream, "tile counter",
                                     fa_hopper_run<BUCKET, true, false, false, false, FA_HOPPER_MODS_NONE, FP8>(
                                         tmap_q, tmap_k, tmap_v, tmap_o, prm, grid, device_ordinal, stream));
}

extern "C" fa_status fa_fwd_launch_hopper_fp8(const fa_fwd_params *prm, const float *q_descale,
                                              const float *k_descale, const float *v_descale, void *workspace,
                                              int vt_in_kernel, int device_ordinal, cudaStream_t stream) {
    const int bucket = fa_hopper_fp8_bucket(prm->head_dim, prm->head_dim_v);
    const bool vt = vt_in_kernel != 0 && fa_hopper_fp8_vt_fits(bucket);
    constexpr int IN_KERNEL = FA_HOPPER_FP8_VT_IN_KERNEL, PREPASS = FA_HOPPER_FP8_VT_PREPASS;
    switch (bucket) {
    case 64:
        return vt ? fa_hopper_fp8_launch<64, IN_KERNEL>(prm, q_descale, k_descale, v_descale, workspace, device_ordinal,
                                                        stream)
                  : fa_hopper_fp8_launch<64, PREPASS>(prm, q_descale, k_descale, v_descale, workspace, device_ordinal,
                                                      stream);
    case 128:
        return vt ? fa_hopper_fp8_launch<128, IN_KERNEL>(prm, q_descale, k_descale, v_descale, workspace,
                                                         device_ordinal, stream)
                  : fa_hopper_fp8_launch<128, PREPASS>(prm, q_descale, k_descale, v_descale, workspace,
                                                       device_ordinal, stream);
    case 256:
        return fa_hopper_fp8_launch<256, PREPASS>(prm, q_descale, k_descale, v_descale, workspace, device_ordinal,
                                                  stream);
    default:
        return fa_set_error(FA_ERR_HEAD_DIM, "head_dim = %d, head_dim_v = %d: no Hopper fp8 forward kernel",
                            prm->head_dim, prm->head_dim_v);
    }
}
