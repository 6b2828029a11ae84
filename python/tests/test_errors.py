"""Bad input raises ValueError / TypeError / RuntimeError / NotImplementedError; errors the C
library detects carry its own message (fa_last_error) and status name."""

import numpy as np
import pytest

import flashattn

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


def arr(*shape, dtype=np.float32):
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


# ---- detected by the C library: message and status come from fa_last_error ------------------

LIBRARY_ERRORS = [
    # (description, call, exception, status name, text from the library's message)
    ("heads not a multiple",
     lambda: flashattn.flash_attn_func(arr(1, 4, 6, 8), arr(1, 4, 4, 8), arr(1, 4, 4, 8)),
     ValueError, "FA_ERR_HEADS", "heads_q = 6 is not a multiple of heads_kv = 4"),
    ("head dim too large",
     lambda: flashattn.flash_attn_func(arr(1, 2, 1, 600), arr(1, 2, 1, 600), arr(1, 2, 1, 600)),
     ValueError, "FA_ERR_HEAD_DIM", "head_dim = 600"),
    ("negative softcap",
     lambda: flashattn.flash_attn_func(arr(1, 2, 1, 8), arr(1, 2, 1, 8), arr(1, 2, 1, 8),
                                       softcap=-1.0),
     ValueError, "FA_ERR_SOFTCAP", "softcap = -1"),
    ("infinite scale",
     lambda: flashattn.flash_attn_func(arr(1, 2, 1, 8), arr(1, 2, 1, 8), arr(1, 2, 1, 8),
                                       softmax_scale=float("inf")),
     ValueError, "FA_ERR_SCALE", "softmax_scale = inf"),
    ("cu_seqlens decreasing",
     lambda: flashattn.flash_attn_varlen_func(arr(8, 1, 8), arr(8, 1, 8), arr(8, 1, 8),
                                              np.array([0, 5, 3], np.int32),
                                              np.array([0, 4, 8], np.int32), 5, 4),
     ValueError, "FA_ERR_CU_SEQLENS", "cu_seqlens_q decreases"),
    ("cu_seqlens beyond max_seqlen",
     lambda: flashattn.flash_attn_varlen_func(arr(8, 1, 8), arr(8, 1, 8), arr(8, 1, 8),
                                              np.array([0, 6, 8], np.int32),
                                              np.array([0, 4, 8], np.int32), 4, 4),
     ValueError, "FA_ERR_CU_SEQLENS", "more than seqlen_q"),
    ("cu_seqlens past total_q",
     lambda: flashattn.flash_attn_varlen_func(arr(8, 1, 8), arr(8, 1, 8), arr(8, 1, 8),
                                              np.array([0, 4, 9], np.int32),
                                              np.array([0, 4, 8], np.int32), 5, 4),
     ValueError, "FA_ERR_CU_SEQLENS", "exceeds total_q"),
    ("negative strides",
     lambda: flashattn.flash_attn_func(arr(1, 4, 1, 8)[:, ::-1], arr(1, 4, 1, 8),
                                       arr(1, 4, 1, 8)),
     ValueError, "FA_ERR_STRIDE", "is negative"),
]


@pytest.mark.parametrize("case", LIBRARY_ERRORS, ids=[c[0] for c in LIBRARY_ERRORS])
def test_library_errors_carry_message(case):
    _, call, exc, status, text = case
    with pytest.raises(exc) as info:
        call()
    assert isinstance(info.value, flashattn.FlashAttnError)
    assert info.value.status_name == status
    assert status in str(info.value) and text in str(info.value)


# ---- detected in Python before the call -------------------------------------------------------

PYTHON_ERRORS = [
    ("q rank", lambda: flashattn.flash_attn_func(arr(2, 4, 8), arr(2, 4, 8), arr(2, 4, 8)),
     ValueError, "q must have 4 dimensions"),
    ("varlen rank", lambda: flashattn.flash_attn_varlen_func(
        arr(1, 8, 1, 8), arr(8, 1, 8), arr(8, 1, 8), np.array([0, 8], np.int32),
        np.array([0, 8], np.int32), 8, 8), ValueError, "q must have 3 dimensions"),
    ("batch mismatch", lambda: flashattn.flash_attn_func(arr(2, 4, 1, 8), arr(1, 4, 1, 8),
                                                         arr(1, 4, 1, 8)),
     ValueError, "q has batch 2 but k has batch 1"),
    ("k/v mismatch", lambda: flashattn.flash_attn_func(arr(1, 4, 1, 8), arr(1, 4, 1, 8),
                                                       arr(1, 5, 1, 8)),
     ValueError, "v has shape"),
    ("head dim mismatch", lambda: flashattn.flash_attn_func(arr(1, 4, 1, 8), arr(1, 4, 1, 16),
                                                            arr(1, 4, 1, 16)),
     ValueError, "q has head dim 8 but k has 16"),
    ("dtype mismatch", lambda: flashattn.flash_attn_func(arr(1, 4, 1, 8),
                                                         arr(1, 4, 1, 8, dtype=np.float16),
                                                         arr(1, 4, 1, 8)),
     TypeError, "same dtype"),
    ("float64", lambda: flashattn.flash_attn_func(*(arr(1, 4, 1, 8, dtype=np.float64),) * 3),
     TypeError, "unsupported dtype float64"),
    ("int", lambda: flashattn.flash_attn_func(*(np.ones((1, 4, 1, 8), np.int32),) * 3),
     TypeError, "unsupported dtype int32"),
    ("alibi shape", lambda: flashattn.flash_attn_func(*(arr(1, 4, 2, 8),) * 3,
                                                      alibi_slopes=np.ones(3, np.float32)),
     ValueError, "alibi_slopes must have shape"),
    ("sink shape", lambda: flashattn.flash_attn_func(*(arr(1, 4, 2, 8),) * 3,
                                                     sink_logits=np.ones((1, 2), np.float32)),
     ValueError, "sink_logits must have shape"),
    ("only one cu_seqlens", lambda: flashattn.flash_attn_varlen_func(
        arr(8, 1, 8), arr(8, 1, 8), arr(8, 1, 8), np.array([0, 8], np.int32), None, 8, 8),
     ValueError, "give both cu_seqlens_q and cu_seqlens_k"),
    ("cu_seqlens lengths differ", lambda: flashattn.flash_attn_varlen_func(
        arr(8, 1, 8), arr(8, 1, 8), arr(8, 1, 8), np.array([0, 8], np.int32),
        np.array([0, 4, 8], np.int32), 8, 8), ValueError, "cu_seqlens_q has 2 entries"),
    ("packed qkv shape", lambda: flashattn.flash_attn_qkvpacked_func(arr(1, 4, 2, 1, 8)),
     ValueError, "qkv must have shape"),
    ("window not a pair", lambda: flashattn.flash_attn_func(*(arr(1, 4, 1, 8),) * 3,
                                                            window_size=3),
     TypeError, "window_size must be a pair"),
    ("dropout with NumPy", lambda: flashattn.flash_attn_func(*(arr(1, 4, 1, 8),) * 3,
                                                             dropout_p=0.1),
     NotImplementedError, "dropout_p > 0 with NumPy arrays"),
    ("dropout out of range", lambda: flashattn.flash_attn_func(*(arr(1, 4, 1, 8),) * 3,
                                                               dropout_p=1.0),
     ValueError, "dropout_p = 1.0 must be in"),
    ("block_table", lambda: flashattn.flash_attn_varlen_func(
        arr(8, 1, 8), arr(8, 1, 8), arr(8, 1, 8), np.array([0, 8], np.int32),
        np.array([0, 8], np.int32), 8, 8, block_table=np.zeros((1, 1), np.int32)),
     NotImplementedError, "block_table with NumPy arrays"),
    ("kvcache k without v", lambda: flashattn.flash_attn_with_kvcache(
        arr(1, 1, 1, 8), arr(1, 4, 1, 8), arr(1, 4, 1, 8), k=arr(1, 1, 1, 8)),
     ValueError, "give both k and v"),
    ("backward dout shape", lambda: flashattn.flash_attn_backward(
        arr(1, 3, 1, 8), *(arr(1, 4, 1, 8),) * 4, np.zeros((1, 1, 4), np.float32)),
     ValueError, "dout must have shape"),
    ("backward lse shape", lambda: flashattn.flash_attn_backward(
        *(arr(1, 4, 1, 8),) * 5, np.zeros((1, 4), np.float32)),
     ValueError, "lse must have shape"),
]


@pytest.mark.parametrize("case", PYTHON_ERRORS, ids=[c[0] for c in PYTHON_ERRORS])
def test_python_side_errors(case):
    _, call, exc, text = case
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value)


# ---- torch ------------------------------------------------------------------------------------


@needs_torch
def test_torch_errors():
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(TypeError, match="unsupported dtype torch.float64"):
        flashattn.flash_attn_func(q.double(), q.double(), q.double())
    with pytest.raises(TypeError, match="same dtype"):
        flashattn.flash_attn_func(q, q.half(), q)
    with pytest.raises(ValueError, match="k is on meta but q is on cpu"):
        flashattn.flash_attn_func(q, q.to("meta"), q)
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        flashattn.flash_attn_func(q, q.numpy(), q)
    with pytest.raises(TypeError, match="mixing NumPy arrays and torch tensors"):
        flashattn.flash_attn_func(q.numpy(), q, q.numpy())
    with pytest.raises(TypeError, match="alibi_slopes must be torch.float32"):
        flashattn.flash_attn_func(q, q, q, alibi_slopes=torch.ones(2, dtype=torch.float16))
    with pytest.raises(ValueError, match="FA_ERR_HEADS"):
        flashattn.flash_attn_func(torch.randn(1, 4, 3, 8), q, q)
    with pytest.raises(ValueError, match="dropout_p"):
        flashattn.flash_attn_func(q, q, q, dropout_p=-0.5)
    with pytest.raises(ValueError, match="tensors on device meta are not supported"):
        flashattn.flash_attn_func(q.to("meta"), q.to("meta"), q.to("meta"))
    with pytest.raises(TypeError, match="cu_seqlens must be integer"):
        flashattn.flash_attn_varlen_func(q[0], q[0], q[0], torch.tensor([0.0, 4.0]),
                                         torch.tensor([0.0, 4.0]), 4, 4)


@needs_torch
@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="no CUDA device")
def test_torch_mixed_cpu_cuda():
    q = torch.randn(1, 4, 2, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="is on cuda"):
        flashattn.flash_attn_func(q, q.cuda(), q)


@needs_torch
@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="no CUDA device")
def test_torch_fp32_on_cuda_rejected_by_library():
    if not flashattn.cuda_available():
        pytest.skip("libflashattn built without CUDA")
    q = torch.randn(1, 4, 2, 8, device="cuda")
    with pytest.raises(TypeError, match="FA_ERR_DTYPE"):
        flashattn.flash_attn_func(q, q, q)


@needs_torch
@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_with_cpu_only_library():
    if flashattn.cuda_available():
        pytest.skip("library has CUDA")
    q = torch.randn(1, 4, 2, 8, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="FA_ERR_DEVICE"):
        flashattn.flash_attn_func(q, q, q)
