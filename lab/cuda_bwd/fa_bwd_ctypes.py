"""fa_bwd_ctypes.py: helpers that fill fa_params (the Python package's ctypes mirror) from torch CUDA tensors for fa_backward / fa_check_backward of libflashattn.so.
Lab code for lab/cuda_bwd, not the Python package."""
import ctypes as C
import importlib.util
import os

_LIB_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "flashattn", "_lib.py")


FaParams = None  # set by Lib(): the package's mirror of fa_params


def _package_params(library_path):
    """FaParams of the Python package (kept in sync with the header by tests/test_abi.py),
    loaded from its file alone (pointed at `library_path`) so the package's __init__ does not run."""
    os.environ["FLASHATTN_LIB"] = os.path.abspath(library_path)
    spec = importlib.util.spec_from_file_location("fa_lib_for_lab", _LIB_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.FaParams


def strides(t, varlen):
    """(batch, row, head) element strides of a [b, s, h, d] (varlen: [total, h, d]) tensor view."""
    if varlen:
        return 0, t.stride(0), t.stride(1)
    return t.stride(0), t.stride(1), t.stride(2)


_NONNULL = []


def ptr(t):
    """data_ptr, or a valid 256-byte-aligned dummy for empty tensors (the API rejects NULL)."""
    if t.numel() > 0:
        return t.data_ptr()
    if not _NONNULL:
        import torch
        _NONNULL.append(torch.zeros(512, dtype=torch.uint8, device=t.device))
    base = _NONNULL[0].data_ptr()
    return base + (-base) % 256


def make_params(q, k, v, o, lse, do, dq, dk, dv, *, cu_q=None, cu_k=None, max_q=0, max_k=0,
                causal=False, window=(-1, -1), softcap=0.0, scale=0.0, alibi=None,
                alibi_batch_stride=0, sinks=None, dsink=None, deterministic=False, stream=0,
                workspace=None):
    import torch
    varlen = cu_q is not None
    p = FaParams()
    p.device = 1
    p.dtype = 2 if q.dtype == torch.bfloat16 else 1
    if varlen:
        p.batch = cu_q.numel() - 1
        p.seqlen_q, p.seqlen_k = max_q, max_k
        p.total_q, p.total_k = q.shape[0], k.shape[0]
        p.cu_seqlens_q, p.cu_seqlens_k = cu_q.data_ptr(), cu_k.data_ptr()
    else:
        p.batch, p.seqlen_q, p.seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    p.heads_q, p.heads_kv = q.shape[-2], k.shape[-2]
    p.head_dim, p.head_dim_v = q.shape[-1], v.shape[-1]
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("dout", do), ("dq", dq), ("dk", dk), ("dv", dv)):
        setattr(p, name, ptr(t))
        prefix = "do" if name == "dout" else name
        bs, rs, hs = strides(t, varlen)
        setattr(p, prefix + "_batch_stride", bs)
        setattr(p, prefix + "_row_stride", rs)
        setattr(p, prefix + "_head_stride", hs)
    p.lse = ptr(lse)
    p.softmax_scale = scale
    p.causal = int(causal)
    p.use_window = int(window[0] >= 0 or window[1] >= 0)
    p.window_left, p.window_right = window
    p.softcap = softcap
    p.alibi_slopes = alibi.data_ptr() if alibi is not None else None
    p.alibi_batch_stride = alibi_batch_stride
    p.sink_logits = sinks.data_ptr() if sinks is not None else None
    p.dsink = ptr(dsink) if dsink is not None else None
    p.deterministic = int(deterministic)
    p.stream = stream
    if workspace is not None:
        p.workspace, p.workspace_bytes = workspace.data_ptr(), workspace.numel()
    return p


class Lib:
    def __init__(self, path):
        global FaParams
        FaParams = _package_params(path)
        self.lib = C.CDLL(path)
        for fn in ("fa_backward", "fa_forward"):
            f = getattr(self.lib, fn)
            f.argtypes = [C.POINTER(FaParams)]
            f.restype = C.c_int
        self.lib.fa_check_backward.argtypes = [C.POINTER(FaParams), C.POINTER(C.c_size_t)]
        self.lib.fa_check_backward.restype = C.c_int
        self.lib.fa_last_error.restype = C.c_char_p

    def backward(self, p):
        return self.lib.fa_backward(C.byref(p))

    def check_backward(self, p):
        ws = C.c_size_t(0)
        st = self.lib.fa_check_backward(C.byref(p), C.byref(ws))
        return st, ws.value

    def last_error(self):
        return self.lib.fa_last_error().decode()
