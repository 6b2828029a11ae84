"""Fit the fp32 polynomials used by the CPU engine's vector exp and tanh (lab experiment 01).

exp(r) on |r| <= ln2/2 (after Cody-Waite reduction):  1 + r + r^2*(c2 + c3 r + ... + c6 r^4)
tanh(y)  on |y| <= TANH_SPLIT:                        y + y^3 * P(y^2)
Fits a weighted (relative error) least-squares polynomial on Chebyshev nodes, iterates a few
Lawson reweightings towards minimax, rounds to float32 and measures the fp32 Horner error.
"""
import numpy as np
import mpmath as mp

mp.mp.dps = 40

def lawson(xs, target, basis, weight, iters=60):
    A = np.stack([b(xs) for b in basis], axis=1)
    w = np.ones_like(xs)
    for _ in range(iters):
        W = np.sqrt(w) * weight
        c, *_ = np.linalg.lstsq(A * W[:, None], target * W, rcond=None)
        err = np.abs((A @ c - target) * weight)
        w = w * (err + 1e-300)
        w /= w.sum()
    return c, err.max()

# ---- exp: residual e^r - 1 - r = r^2 * Q(r), Q degree 4 (total degree 6)
half = float(mp.log(2) / 2)
xs = np.cos(np.linspace(0, np.pi, 4001)) * half
ex = np.array([float(mp.exp(mp.mpf(x))) for x in xs])
tgt = np.array([float((mp.exp(mp.mpf(x)) - 1 - mp.mpf(x)) / (mp.mpf(x) ** 2)) if x != 0 else 0.5 for x in xs])
basis = [lambda x, k=k: x ** k for k in range(5)]
c, e = lawson(xs, tgt, basis, xs ** 2 / ex)
print("exp coeffs c2..c6:", ["%.9e" % v for v in c], "fit rel err %.3g" % e)
c32 = c.astype(np.float32)
# simulate fp32 Horner with fma (emulated in float64 then rounded)
def f32(x): return np.float32(x)
r = np.float32(np.linspace(-half, half, 200001))
q = c32[4]
for k in (3, 2, 1, 0):
    q = f32(np.float64(q) * np.float64(r) + np.float64(c32[k]))
r2 = f32(np.float64(r) * np.float64(r))
p = f32(np.float64(q) * np.float64(r2) + np.float64(r))
p = f32(np.float64(p) + 1.0)
ref = np.exp(np.float64(r))
ulp = np.spacing(np.float32(ref)).astype(np.float64)
print("exp fp32 eval max err %.3f ulp" % (np.abs(p - ref) / ulp).max())

# ---- tanh: tanh(y) = y + y^3 * P(y^2) for |y| <= split
for split in (0.5, 0.55, 0.625):
    for deg in (4, 5, 6):
        ys = np.cos(np.linspace(0, np.pi / 2, 4001)) * split + 1e-9
        zs = ys ** 2
        th = np.array([float(mp.tanh(mp.mpf(y))) for y in ys])
        tg = np.array([float((mp.tanh(mp.mpf(y)) - mp.mpf(y)) / mp.mpf(y) ** 3) for y in ys])
        basis = [lambda z, k=k: z ** k for k in range(deg + 1)]
        ct, et = lawson(zs, tg, basis, ys ** 3 / th)
        ct32 = ct.astype(np.float32)
        y = np.float32(np.linspace(1e-6, split, 100001))
        z = f32(np.float64(y) * np.float64(y))
        q = ct32[deg]
        for k in range(deg - 1, -1, -1):
            q = f32(np.float64(q) * np.float64(z) + np.float64(ct32[k]))
        y3 = f32(np.float64(z) * np.float64(y))
        t = f32(np.float64(q) * np.float64(y3) + np.float64(y))
        ref = np.tanh(np.float64(y))
        ulp = np.spacing(np.float32(ref)).astype(np.float64)
        print("tanh split %.3f deg %d: fp32 err %.3f ulp  coeffs %s" % (split, deg, (np.abs(t - ref) / ulp).max(), ["%.9e" % v for v in ct]))
