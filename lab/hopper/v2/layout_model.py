"""layout_model.py: a numpy model of hopper_fwd.cu's data path, run on the CPU (no GPU here).

Hardware behaviour is modelled from ../shared/research/hopper-kernel-notes.md (the parts verified
on an H200 are marked there): the 128-byte swizzle phys = a ^ (((a >> 7) & 7) << 4) on shared
addresses; TMA boxes laid out innermost dimension first; wgmma K-major SW128 operands (8-row groups
SBO apart, rows 128 B apart, start address advanced by 32 B per k16 step), MN-major SW128 B
operands (64-column slabs LBO apart, 8-key groups SBO apart); the accumulator layout and the
register-A fragment layout. The kernel side is transcribed from hopper_fwd.cu: shared-memory
offsets, descriptor starts and steps, TMA coordinates, the causal/length mask, the online softmax,
the P packing, the O rescale, the epilogue's swizzled st.shared addresses and the TMA store.
It catches index and offset slips, not races (pipeline_model.py covers the synchronisation).

Usage: python3 lab/hopper/v2/layout_model.py
"""
import math
import sys

import numpy as np

CFG = {64: (128, 3), 128: (128, 2), 256: (80, 2)}  # d -> (BLOCK_N, STAGES), as hopper_fwd.cu
BLOCK_M = 128


def swz(addr):
    return addr ^ (((addr >> 7) & 7) << 4)


def to_bf16_bits(x):
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def from_bf16_bits(u):
    return (np.asarray(u, dtype=np.uint32) << 16).view(np.float32)


class Smem:
    def __init__(self, nbytes):
        self.mem = np.zeros(nbytes // 2, dtype=np.uint16)  # 16-bit cells, addresses even

    def write16(self, addr, val):
        assert (addr % 2 == 0).all()
        self.mem[addr // 2] = val

    def read16(self, addr):
        return self.mem[addr // 2]


def tma_load(smem, dst, tensor, r0, h, b, box_rows, box_slabs):
    """tensor [b, rows, heads, d] uint16; box {64, box_rows, box_slabs, 1, 1} at (0, r0, 0, h, b)."""
    assert dst % 1024 == 0
    sl, r, c = np.meshgrid(np.arange(box_slabs), np.arange(box_rows), np.arange(64), indexing="ij")
    logical = dst + ((sl * box_rows) + r) * 128 + c * 2
    rows = tensor.shape[1]
    inside = (r0 + r) < rows
    vals = np.zeros(logical.shape, dtype=np.uint16)
    vals[inside] = tensor[b, (r0 + r)[inside], h, (sl * 64 + c)[inside]]
    smem.write16(swz(logical), vals)


def tma_store(smem, src, out, r0, slab, h, b):
    """box {64, 64, 1, 1, 1} from src to out[b, r0 + r, h, 64·slab + c], rows past the end clipped."""
    r, c = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    vals = smem.read16(swz(src + r * 128 + c * 2))
    inside = (r0 + r) < out.shape[1]
    out[b, (r0 + r)[inside], h, (slab * 64 + c)[inside]] = vals[inside]


def read_kmajor(smem, start, rows):
    """wgmma K-major SW128 operand [rows, 16] at descriptor start (SBO 1024)."""
    m, k = np.meshgrid(np.arange(rows), np.arange(16), indexing="ij")
    return from_bf16_bits(smem.read16(swz(start + (m // 8) * 1024 + (m % 8) * 128 + 2 * k))).astype(np.float64)


def read_mnmajor(smem, start, lbo, n):
    """wgmma MN-major SW128 B operand [16 keys, n] at descriptor start (LBO = slab stride, SBO 1024)."""
    k, col = np.meshgrid(np.arange(16), np.arange(n), indexing="ij")
    addr = start + (col // 64) * lbo + (k // 8) * 1024 + (k % 8) * 128 + (col % 64) * 2
    return from_bf16_bits(smem.read16(swz(addr))).astype(np.float64)


T = np.arange(128)
WARP, LANE = T // 32, T % 32


def acc_rc(i):
    """(row, col) of accumulator register i for every thread of the warpgroup."""
    return 16 * WARP + LANE // 4 + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (LANE % 4) + (i & 1)


def acc_regs(mat, count):
    regs = np.zeros((128, count))
    for i in range(count):
        r, c = acc_rc(i)
        regs[:, i] = mat[r, c]
    return regs


def a_fragment_matrix(p_regs_kk):
    """Register-A fragment (4 packed regs per thread) -> A[64, 16] (hardware layout, notes §4)."""
    a = np.zeros((64, 16))
    r0 = 16 * WARP + LANE // 4
    c0 = 2 * (LANE % 4)
    for x, (dr, dc) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
        lo = from_bf16_bits(p_regs_kk[:, x] & 0xFFFF)
        hi = from_bf16_bits(p_regs_kk[:, x] >> 16)
        a[r0 + dr, c0 + dc] = lo
        a[r0 + dr, c0 + dc + 1] = hi
    return a


def quad(x, op):
    g = x.reshape(32, 4)
    return np.repeat(op(g, axis=1), 4)


def run_cta(d, q, k, v, o_out, lse_out, m_block, head, batch, causal, scale):
    block_n, stages = CFG[d]
    slabs = d // 64
    q_slab, kv_slab = BLOCK_M * 128, block_n * 128
    q_bytes, kv_bytes = q_slab * slabs, kv_slab * slabs
    smem_base = 1024
    smem = Smem(smem_base + q_bytes + 2 * stages * kv_bytes + 1024)
    q_smem = smem_base
    k_stage = lambda s: smem_base + q_bytes + s * kv_bytes  # noqa: E731
    v_stage = lambda s: smem_base + q_bytes + stages * kv_bytes + s * kv_bytes  # noqa: E731
    len_q, len_k = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    head_kv = head // group
    m0 = m_block * BLOCK_M
    shift = len_k - len_q
    key_end = len_k
    if causal:
        key_end = max(0, min(len_k, min(m0 + BLOCK_M, len_q) - 1 + shift + 1))
    n_tiles = (key_end + block_n - 1) // block_n
    scale_log2 = np.float32(scale * 1.4426950408889634)

    tma_load(smem, q_smem, q, m0, head, batch, BLOCK_M, slabs)

    def load_k(j):
        tma_load(smem, k_stage(j % stages), k, (n_tiles - 1 - j) * block_n, head_kv, batch, block_n, slabs)

    def load_v(j):
        tma_load(smem, v_stage(j % stages), v, (n_tiles - 1 - j) * block_n, head_kv, batch, block_n, slabs)

    o_regs = {c: np.zeros((128, d // 2), dtype=np.float32) for c in (0, 1)}
    row_max = {c: np.full((128, 2), -np.inf, dtype=np.float32) for c in (0, 1)}
    row_sum = {c: np.zeros((128, 2), dtype=np.float32) for c in (0, 1)}
    p_regs = {c: None for c in (0, 1)}

    def qk(c, ks):
        q_wg = q_smem + c * 64 * 128
        s = np.zeros((64, block_n))
        for kk in range(d // 16):
            q_step = (kk // 4) * q_slab + (kk % 4) * 32
            k_step = (kk // 4) * kv_slab + (kk % 4) * 32
            s += read_kmajor(smem, q_wg + q_step, 64) @ read_kmajor(smem, k_stage(ks) + k_step, block_n).T
        return acc_regs(s, block_n // 2).astype(np.float32)

    def pv(c, vs):
        acc = np.zeros((64, d))
        for kk in range(block_n // 16):
            acc += a_fragment_matrix(p_regs[c][:, kk, :]) @ read_mnmajor(smem, v_stage(vs) + kk * 2048, kv_slab, d)
        o_regs[c] += acc_regs(acc, d // 2).astype(np.float32)

    def mask_softmax(c, s, n0):
        row0 = m0 + 64 * c + 16 * WARP + LANE // 4
        if n0 + block_n > len_k or (causal and n0 + block_n - 1 > m0 + 64 * c + shift):
            col0 = n0 + 2 * (LANE % 4)
            for h in range(2):
                limit = np.full(128, len_k)
                if causal:
                    limit = np.minimum(limit, row0 + 8 * h + shift + 1)
                visible = limit - col0
                for jj in range(block_n // 8):
                    for cc in range(2):
                        s[8 * jj + cc >= visible, 4 * jj + 2 * h + cc] = -np.inf
        alpha = np.zeros((128, 2), dtype=np.float32)
        for h in range(2):
            m = row_max[c][:, h].copy()
            for jj in range(block_n // 8):
                m = np.maximum(m, np.maximum(s[:, 4 * jj + 2 * h], s[:, 4 * jj + 2 * h + 1]))
            m = quad(m, np.max)
            m_scaled = np.where(m == -np.inf, np.float32(0), m * scale_log2).astype(np.float32)
            with np.errstate(invalid="ignore"):
                alpha[:, h] = np.exp2(row_max[c][:, h] * scale_log2 - m_scaled)
            row_max[c][:, h] = m
            tot = np.zeros(128, dtype=np.float32)
            for jj in range(block_n // 8):
                for cc in range(2):
                    p = np.exp2(s[:, 4 * jj + 2 * h + cc] * scale_log2 - m_scaled).astype(np.float32)
                    s[:, 4 * jj + 2 * h + cc] = p
                    tot += p
            row_sum[c][:, h] = row_sum[c][:, h] * alpha[:, h] + tot
        return alpha

    def convert(c, s):
        p = np.zeros((128, block_n // 16, 4), dtype=np.uint32)
        for kk in range(block_n // 16):
            for x in range(4):
                lo = to_bf16_bits(s[:, 8 * kk + 2 * x]).astype(np.uint32)
                hi = to_bf16_bits(s[:, 8 * kk + 2 * x + 1]).astype(np.uint32)
                p[:, kk, x] = lo | (hi << 16)
        p_regs[c] = p

    if n_tiles > 0:
        load_k(0)
        for c in (0, 1):
            s = qk(c, 0)
            mask_softmax(c, s, (n_tiles - 1) * block_n)
            convert(c, s)
        for j in range(1, n_tiles):
            load_k(j)
            load_v(j - 1)
            for c in (0, 1):
                s = qk(c, j % stages)
                pv(c, (j - 1) % stages)
                alpha = mask_softmax(c, s, (n_tiles - 1 - j) * block_n)
                for i in range(d // 2):
                    o_regs[c][:, i] *= alpha[:, (i >> 1) & 1]
                convert(c, s)
        load_v(n_tiles - 1)
        for c in (0, 1):
            pv(c, (n_tiles - 1) % stages)

    for c in (0, 1):
        row0 = m0 + 64 * c + 16 * WARP + LANE // 4
        inv = np.zeros((128, 2), dtype=np.float32)
        for h in range(2):
            tot = quad(row_sum[c][:, h], np.sum)
            inv[:, h] = np.where(tot > 0, 1.0 / np.where(tot > 0, tot, 1), 0)
            row = row0 + 8 * h
            with np.errstate(divide="ignore"):
                lse = np.where(tot > 0, (row_max[c][:, h] * scale_log2 + np.log2(np.where(tot > 0, tot, 1)))
                               * 0.6931471805599453, -np.inf)
            sel = (LANE % 4 == 0) & (row < len_q)
            lse_out[batch, head, row[sel]] = lse[sel]
        r = 64 * c + 16 * WARP + LANE // 4
        for j in range(d // 8):
            for h in range(2):
                addr = q_smem + (j // 8) * q_slab + (r + 8 * h) * 128 + (((j % 8) ^ (r % 8)) * 16) + (LANE % 4) * 4
                lo = to_bf16_bits(o_regs[c][:, 4 * j + 2 * h] * inv[:, h])
                hi = to_bf16_bits(o_regs[c][:, 4 * j + 2 * h + 1] * inv[:, h])
                smem.write16(addr, lo)
                smem.write16(addr + 2, hi)
        wg_row_first = m0 + 64 * c
        if wg_row_first < len_q:
            for slab in range(slabs):
                tma_store(smem, q_smem + c * 64 * 128 + slab * q_slab, o_out, wg_row_first, slab, head, batch)


def attention(q, k, v, causal, scale, plain):
    """float64 reference, or 'plain': fp32 softmax with P rounded to bf16 (o [b, sq, hq, d])."""
    qf, kf, vf = (from_bf16_bits(x).astype(np.float64) for x in (q, k, v))
    b, sq, hq, d = qf.shape
    sk, hkv = kf.shape[1], kf.shape[2]
    o = np.zeros((b, sq, hq, d))
    lse = np.full((b, hq, sq), -np.inf)
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    vis = (j <= i + sk - sq) if causal else np.ones((sq, sk), bool)
    for bi in range(b):
        for h in range(hq):
            s = qf[bi, :, h] @ kf[bi, :, h // (hq // hkv)].T * scale
            s = np.where(vis, s, -np.inf)
            m = s.max(axis=1, keepdims=True, initial=-np.inf)
            m = np.where(np.isinf(m), 0, m)
            p = np.exp(s - m)
            tot = p.sum(axis=1, keepdims=True)
            p = p / np.where(tot > 0, tot, 1)
            if plain:
                p = from_bf16_bits(to_bf16_bits(p.astype(np.float32))).astype(np.float64)
            o[bi, :, h] = p @ vf[bi, :, h // (hq // hkv)]
            with np.errstate(divide="ignore"):
                lse[bi, h] = np.where(tot[:, 0] > 0, np.log(np.where(tot[:, 0] > 0, tot[:, 0], 1)) + m[:, 0], -np.inf)
    return o, lse


def case(d, b, sq, sk, hq, hkv, causal, rng):
    q = to_bf16_bits(rng.standard_normal((b, sq, hq, d)).astype(np.float32))
    k = to_bf16_bits(rng.standard_normal((b, sk, hkv, d)).astype(np.float32))
    v = to_bf16_bits((rng.standard_normal((b, sk, hkv, d)) + 0.5).astype(np.float32))
    o = np.full((b, sq, hq, d), 0xFFFF, dtype=np.uint16)  # NaN pattern: must be overwritten
    lse = np.full((b, hq, sq), np.nan)
    scale = 1 / math.sqrt(d)
    for bi in range(b):
        for h in range(hq):
            for mb in range((sq + BLOCK_M - 1) // BLOCK_M):
                run_cta(d, q, k, v, o, lse, mb, h, bi, causal, scale)
    ref, ref_lse = attention(q, k, v, causal, scale, False)
    plain, _ = attention(q, k, v, causal, scale, True)
    got = from_bf16_bits(o).astype(np.float64)
    err = np.nanmax(np.abs(got - ref)) if not np.isnan(got).any() else float("nan")
    err_plain = np.abs(plain - ref).max()
    fin = np.isfinite(ref_lse)
    lerr = np.abs(lse[fin] - ref_lse[fin]).max() if fin.any() else 0.0
    ok = (not np.isnan(got).any()) and err <= 2 * err_plain + 1e-3 and lerr < 1e-3 and \
        np.array_equal(np.isinf(lse), np.isinf(ref_lse)) and (got[np.isinf(ref_lse).transpose(0, 2, 1)] == 0).all()
    print(f"{'ok  ' if ok else 'FAIL'} d{d} b{b} sq{sq} sk{sk} h{hq}/{hkv} causal{causal}: "
          f"o err {err:.2e} (plain {err_plain:.2e}), lse err {lerr:.2e}")
    return ok


def main():
    rng = np.random.default_rng(0)
    cases = [(64, 1, 200, 333, 2, 1, 0), (64, 1, 200, 333, 2, 1, 1), (128, 1, 130, 130, 2, 2, 1),
             (128, 1, 300, 100, 1, 1, 1), (128, 1, 77, 0, 1, 1, 0), (256, 1, 129, 170, 2, 1, 1),
             (256, 1, 64, 64, 1, 1, 0), (128, 2, 1, 257, 2, 1, 0)]
    fails = sum(not case(*c, rng) for c in cases)
    print(f"layout model: {len(cases) - fails} passed, {fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
