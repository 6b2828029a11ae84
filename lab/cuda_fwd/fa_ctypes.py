"""fa_ctypes.py: fa_params as a ctypes Structure (mirrors include/flashattn.h) and a call helper
that runs a forward on torch CUDA tensors through a library exporting `fn_name` (lab_forward in
build-lab/liblabfwd.so, or fa_forward in libflashattn.so). Lab code, not the Python package."""
import ctypes as C

I64 = C.c_int64
VP = C.c_void_p


class FaParams(C.Structure):
    _fields_ = [
        ("device", C.c_int), ("dtype", C.c_int),
        ("batch", I64), ("seqlen_q", I64), ("seqlen_k", I64), ("heads_q", I64), ("heads_kv", I64),
        ("head_dim", I64), ("head_dim_v", I64),
        ("q", VP), ("k", VP), ("v", VP), ("o", VP), ("lse", VP),
        ("q_batch_stride", I64), ("q_row_stride", I64), ("q_head_stride", I64),
        ("k_batch_stride", I64), ("k_row_stride", I64), ("k_head_stride", I64),
        ("v_batch_stride", I64), ("v_row_stride", I64), ("v_head_stride", I64),
        ("o_batch_stride", I64), ("o_row_stride", I64), ("o_head_stride", I64),
        ("cu_seqlens_q", VP), ("cu_seqlens_k", VP), ("total_q", I64), ("total_k", I64),
        ("softmax_scale", C.c_float), ("causal", C.c_int), ("use_window", C.c_int),
        ("window_left", C.c_int32), ("window_right", C.c_int32), ("softcap", C.c_float),
        ("alibi_slopes", VP), ("alibi_batch_stride", I64), ("sink_logits", VP),
        ("dout", VP), ("dq", VP), ("dk", VP), ("dv", VP), ("dsink", VP),
        ("do_batch_stride", I64), ("do_row_stride", I64), ("do_head_stride", I64),
        ("dq_batch_stride", I64), ("dq_row_stride", I64), ("dq_head_stride", I64),
        ("dk_batch_stride", I64), ("dk_row_stride", I64), ("dk_head_stride", I64),
        ("dv_batch_stride", I64), ("dv_row_stride", I64), ("dv_head_stride", I64),
        ("deterministic", C.c_int), ("num_threads", C.c_int),
        ("stream", VP), ("workspace", VP), ("workspace_bytes", C.c_size_t),
    ]


def _strides(t, varlen):
    """(batch, row, head) strides of a [b, s, h, d] (or varlen [total, h, d]) tensor."""
    if varlen:
        return 0, t.stride(0), t.stride(1)
    return t.stride(0), t.stride(1), t.stride(2)


def make_params(q, k, v, o, lse=None, *, cu_q=None, cu_k=None, max_q=0, max_k=0, causal=False,
                window=(-1, -1), softcap=0.0, scale=0.0, alibi=None, alibi_batch_stride=0,
                sinks=None, stream=0, ptr_offset=None):
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
    p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    if ptr_offset:
        p.q += ptr_offset
    p.lse = lse.data_ptr() if lse is not None else None
    p.q_batch_stride, p.q_row_stride, p.q_head_stride = _strides(q, varlen)
    p.k_batch_stride, p.k_row_stride, p.k_head_stride = _strides(k, varlen)
    p.v_batch_stride, p.v_row_stride, p.v_head_stride = _strides(v, varlen)
    p.o_batch_stride, p.o_row_stride, p.o_head_stride = _strides(o, varlen)
    p.softmax_scale = scale
    p.causal = int(causal)
    p.use_window = int(window[0] >= 0 or window[1] >= 0)
    p.window_left, p.window_right = window
    p.softcap = softcap
    p.alibi_slopes = alibi.data_ptr() if alibi is not None else None
    p.alibi_batch_stride = alibi_batch_stride
    p.sink_logits = sinks.data_ptr() if sinks is not None else None
    p.stream = stream
    return p


def load(path, fn_name="lab_forward", err_name="lab_last_error"):
    lib = C.CDLL(path)
    fn = getattr(lib, fn_name)
    fn.argtypes = [C.POINTER(FaParams)]
    fn.restype = C.c_int
    err = getattr(lib, err_name)
    err.restype = C.c_char_p

    def call(p):
        return fn(C.byref(p))

    def last_error():
        return err().decode()

    return call, last_error
