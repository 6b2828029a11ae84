/*
 * probs.cu: fa_forward's optional attn_probs output on CUDA (flash_attn's S_dmask, for tests at
 * small sizes), the same encoding as the CPU engine's (src/cpu/cpu_probs.c): P_ij, the softmax
 * probabilities [batch, heads_q, seqlen_q, seqlen_k] fp32 (varlen: the maxima, entries beyond a
 * sequence's lengths 0), negated where dropout drops the element (fa_dropout_keep, the mask every
 * engine shares).
 *
 * A plain pass, correctness over speed: one thread per query row recomputes its scores in fp32
 * from the dtype inputs (scale, softcap, ALiBi, the row's key range fa_key_range), takes the
 * row's max and sum in float64 (the sink in the denominator), then writes exp(s - LSE). The
 * output is batch·heads_q·seqlen_q·seqlen_k floats, a size only tests ask for.
 */
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "api/fa_philox.h"
#include "cuda/common/cuda_common.cuh"

struct fa_probs_params {
    fa_kernel_base base;
    int bf16;
    uint64_t dropout_seed, dropout_offset;
    uint32_t dropout_threshold;
    int has_dropout;
    float softmax_scale, softcap;
    float *probs; /* [batch, heads_q, seqlen_q, seqlen_k] */
};

__device__ __forceinline__ float fa_probs_elem(const uint16_t *x, int64_t i, int bf16) {
    const uint16_t bits = x[i];
    return bf16 ? __uint_as_float((uint32_t)bits << 16) : __half2float(__ushort_as_half(bits));
}

/* fp32 dot product of a q row and a k row of head_dim elements (16-bit inputs). */
__device__ __forceinline__ float fa_probs_dot(const uint16_t *q_row, const uint16_t *k_row, int d, int bf16) {
    float s = 0.0f;
    for (int c = 0; c < d; ++c) s = __fadd_rn(s, __fmul_rn(fa_probs_elem(q_row, c, bf16), fa_probs_elem(k_row, c, bf16)));
    return s;
}

__global__ void __launch_bounds__(128) fa_probs_kernel(const fa_probs_params pp) {
    const fa_kernel_base &prm = pp.base;
    const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t rows = (int64_t)prm.batch * prm.heads_q * prm.seqlen_q;
    if (row >= rows) return;
    const int i = (int)(row % prm.seqlen_q);
    const int h = (int)(row / prm.seqlen_q % prm.heads_q);
    const int b = (int)(row / prm.seqlen_q / prm.heads_q);
    const fa_seq_rows seq = fa_sequence_rows(prm.cu_seqlens_q, prm.cu_seqlens_k, prm.total_q, prm.total_k,
                                             prm.seqlen_q, prm.seqlen_k, b);
    if (i >= seq.len_q) return; /* zeroed before */
    const bool varlen = prm.cu_seqlens_q != nullptr;
    const int hk = h / prm.group;
    const uint16_t *q_row = (const uint16_t *)prm.q + h * prm.q_head_stride +
                            (varlen ? (seq.q_start + i) * prm.q_row_stride
                                    : b * prm.q_batch_stride + (int64_t)i * prm.q_row_stride);
    const uint16_t *k_seq = (const uint16_t *)prm.k + hk * prm.k_head_stride +
                            (varlen ? seq.k_start * prm.k_row_stride : b * prm.k_batch_stride);
    const float slope = prm.alibi_slopes != nullptr ? prm.alibi_slopes[b * prm.alibi_batch_stride + h] : 0.0f;
    int64_t lo, hi;
    fa_key_range(i, seq.len_q, seq.len_k, prm.window_left, prm.window_right, &lo, &hi);
    auto score = [&](int64_t j) -> float {
        float s = fa_probs_dot(q_row, k_seq + j * prm.k_row_stride, prm.head_dim, pp.bf16) * pp.softmax_scale;
        if (pp.softcap > 0.0f) s = pp.softcap * tanhf(s / pp.softcap);
        if (prm.alibi_slopes != nullptr) s += fa_alibi_bias(slope, i, j, seq.len_q, seq.len_k);
        return s;
    };
    /* max and sum in float64, online (the sink starts the row) */
    double row_max = prm.sink_logits != nullptr ? (double)prm.sink_logits[h] : -INFINITY;
    double sum = prm.sink_logits != nullptr ? 1.0 : 0.0;
    for (int64_t j = lo; j < hi; ++j) {
        const double s = score(j);
        if (s > row_max) {
            sum = sum * exp(row_max - s) + 1.0;
            row_max = s;
        } else {
            sum += exp(s - row_max);
        }
    }
    if (row_max == -INFINITY) return; /* nothing visible, no sink: P = 0 */
    const double lse = row_max + log(sum);
    float *out = pp.probs + row * prm.seqlen_k;
    for (int64_t j = lo; j < hi; ++j) {
        float prob = (float)exp((double)score(j) - lse);
        if (pp.has_dropout && !fa_dropout_keep(pp.dropout_seed, pp.dropout_offset, pp.dropout_threshold, b, h,
                                               prm.heads_q, i, j))
            prob = -prob;
        out[j] = prob;
    }
}

/* attn_probs of a validated problem whose checks fa_cuda_forward has run, on p->stream. */
extern "C" fa_status fa_cuda_attn_probs(const fa_problem *pb) {
    const fa_params *p = &pb->p;
    cudaStream_t stream = (cudaStream_t)p->stream;
    const int64_t rows = p->batch * p->heads_q * p->seqlen_q;
    const size_t bytes = sizeof(float) * (size_t)rows * (size_t)p->seqlen_k;
    if (bytes == 0) return FA_OK;
    FA_CUDA_CHECK(cudaMemsetAsync(p->attn_probs, 0, bytes, stream), "cudaMemsetAsync(attn_probs)");
    fa_probs_params pp;
    fa_cuda_fill_kernel_base(&pp.base, pb);
    pp.bf16 = p->dtype == FA_DTYPE_BF16;
    pp.has_dropout = pb->has_dropout;
    pp.dropout_seed = p->dropout_seed;
    pp.dropout_offset = p->dropout_offset;
    pp.dropout_threshold = pb->dropout_threshold;
    pp.softmax_scale = p->softmax_scale;
    pp.softcap = p->softcap;
    pp.probs = p->attn_probs;
    const int64_t blocks = (rows + 127) / 128;
    if (blocks > INT32_MAX) return fa_set_error(FA_ERR_INVALID_SIZE, "attn_probs: too many rows for the CUDA grid");
    fa_probs_kernel<<<(unsigned)blocks, 128, 0, stream>>>(pp);
    FA_CUDA_CHECK_LAUNCH("attn_probs kernel launch");
    return FA_OK;
}
