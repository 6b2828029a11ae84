"""compare_outputs.py: bf16 fwd + bwd outputs of two libflashattn builds on identical inputs.

    FLASHATTN_LIB=<base>/libflashattn.so PYTHONPATH=python python compare_outputs.py run base.pt
    FLASHATTN_LIB=<new>/libflashattn.so  PYTHONPATH=python python compare_outputs.py run new.pt
    python compare_outputs.py compare base.pt new.pt

Prints, per tensor, how many elements differ, the max |new - base| and both errors against a
float64 reference (GQA folded back by summing dK / dV over the group).
"""
import sys

import torch

SHAPES = {"s2048d64": (1, 2048, 16, 16, 64, False), "s1024d128c": (2, 1024, 8, 2, 128, True),
          "s333d59": (2, 333, 4, 4, 59, False)}


def run(path):
    import flashattn
    torch.manual_seed(0)
    out = {}
    for name, (b, s, h, hkv, d, causal) in SHAPES.items():
        q = torch.randn(b, s, h, d, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, s, hkv, d, dtype=torch.bfloat16, requires_grad=True)
        v = (torch.randn(b, s, hkv, d) + 0.5).to(torch.bfloat16).requires_grad_()
        o = flashattn.flash_attn_func(q, k, v, causal=causal)
        do = torch.randn_like(o)
        o.backward(do)
        rep = h // hkv
        qf = q.detach().double().requires_grad_()
        kf = k.detach().double().repeat_interleave(rep, 2).requires_grad_()
        vf = v.detach().double().repeat_interleave(rep, 2).requires_grad_()
        scores = torch.einsum("bihd,bjhd->bhij", qf, kf) / d ** 0.5
        if causal:
            scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        ref = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), vf)
        ref.backward(do.double())
        out[name] = dict(o=o.detach().float(), dq=q.grad.float(), dk=k.grad.float(), dv=v.grad.float(),
                         ref_o=ref.detach(), ref_dq=qf.grad, ref_dk=kf.grad.view(b, s, hkv, rep, d).sum(3),
                         ref_dv=vf.grad.view(b, s, hkv, rep, d).sum(3))
    torch.save(out, path)


def compare(path_a, path_b):
    a, b = torch.load(path_a), torch.load(path_b)
    for name in a:
        for t in ("o", "dq", "dk", "dv"):
            x, y, r = a[name][t], b[name][t], a[name]["ref_" + t]
            diff = (x - y).abs()
            print(f"{name:11s} {t:3s} differ {int((diff != 0).sum()):6d}/{diff.numel():8d}  max|new-base| {diff.max():.2e}"
                  f"  max|base-ref64| {(x.double() - r).abs().max():.3e}  max|new-ref64| {(y.double() - r).abs().max():.3e}")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2])
    else:
        compare(sys.argv[2], sys.argv[3])
