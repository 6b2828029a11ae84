"""01_tolerance_model.py: how far apart can two correct backward kernels be?

Model of tests/gpu/fa_gpu_bwd_paths.c's comparison (default Hopper backward vs portable one):
both recompute S in fp32 (different summation order), round P and dS to the 16-bit dtype before
the MMAs, accumulate in fp32 and round dq/dk/dv to 16 bits. Variant A scales dS before rounding,
variant B after the MMA (a plausible difference between two kernels) and uses P rounded in
dS = P∘(dP - D). Prints max|A - B| / max|A| per tensor and the worst element against the
test's rule |a - b| <= c_abs·max|ref| + c_rel·|ref|. Inputs as in the test: q, k, dO uniform
[-2, 2) / [-1, 1), v offset by 0.5. Usage: python3 01_tolerance_model.py
"""
import numpy as np


def rnd16(x, dtype):
    x = np.asarray(x, np.float32)
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000  # round to nearest even
    return u.astype(np.uint32).view(np.float32)


def backward(q, k, v, do, o, lse, scale, dtype, variant, rng):
    s = (q @ k.T).astype(np.float32)
    if variant == "B":  # a different fp32 summation order: relative noise of a few fp32 ulps
        s = s * (1 + rng.standard_normal(s.shape).astype(np.float32) * 1e-7)
    p = np.exp(s * scale - lse[:, None]).astype(np.float32)
    p16 = rnd16(p, dtype)
    dv = p16.T @ do
    dp = do @ v.T
    dsum = (do * o).sum(1)
    if variant == "A":
        ds16 = rnd16(p * (dp - dsum[:, None]) * scale, dtype)
        dq, dk = ds16 @ k, ds16.T @ q
    else:
        ds16 = rnd16(p16 * (dp - dsum[:, None]), dtype)
        dq, dk = (ds16 @ k) * scale, (ds16.T @ q) * scale
    return [rnd16(t, dtype) for t in (dq, dk, dv)]


def main():
    rng = np.random.default_rng(1)
    for dtype in ("bf16", "f16"):
        for d, n in ((64, 2048), (128, 2048)):
            q = rnd16(rng.uniform(-2, 2, (n, d)), dtype)
            k = rnd16(rng.uniform(-2, 2, (n, d)), dtype)
            v = rnd16(rng.uniform(-2, 2, (n, d)) + 0.5, dtype)
            do = rnd16(rng.uniform(-1, 1, (n, d)), dtype)
            scale = np.float32(1 / np.sqrt(d))
            s = (q.astype(np.float64) @ k.T.astype(np.float64)) * scale
            lse = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
            o = rnd16((np.exp(s - lse[:, None]) @ v).astype(np.float32), dtype)
            lse = lse.astype(np.float32)
            a = backward(q, k, v, do, o, lse, scale, dtype, "A", rng)
            b = backward(q, k, v, do, o, lse, scale, dtype, "B", rng)
            for name, x, y in zip(("dq", "dk", "dv"), a, b):
                m = np.abs(y).max()
                diff = np.abs(x - y)
                need_abs = (diff - 2.0 ** -7 * np.abs(y)).max() / m  # c_abs with c_rel = 2^-7
                print(f"{dtype} d{d} n{n} {name}: max|ref| {m:.3g} max diff/max|ref| {diff.max() / m:.2e} "
                      f"c_abs needed at c_rel 2^-7: {need_abs:.2e}")


if __name__ == "__main__":
    main()
