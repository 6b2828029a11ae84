"""flashattn.bert_padding: flash_attn's unpad_input / pad_input semantics, and varlen attention
over unpadded tokens equals per-sequence attention of the padded batch."""

import numpy as np
import pytest

import flashattn
from flashattn.bert_padding import pad_input, unpad_input
from attn_ref import ROUNDERS, check_rule, np_attention


def masks():
    attention = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]],
                         bool)
    unused = np.zeros_like(attention)
    unused[0, 3] = True  # kept in the packed layout, not a real token
    return attention, unused


def test_unpad_pad_numpy():
    attention, unused = masks()
    x = np.arange(4 * 5 * 2, dtype=np.float32).reshape(4, 5, 2)
    flat, indices, cu, max_len, seqused = unpad_input(x, attention)
    np.testing.assert_array_equal(indices, [0, 1, 2, 5, 6, 7, 8, 9, 15])
    np.testing.assert_array_equal(cu, [0, 3, 8, 8, 9])
    assert cu.dtype == np.int32 and max_len == 5
    np.testing.assert_array_equal(seqused, [3, 5, 0, 1])
    np.testing.assert_array_equal(flat, x.reshape(20, 2)[indices])
    back = pad_input(flat, indices, 4, 5)
    np.testing.assert_array_equal(back, np.where(attention[..., None], x, 0))

    flat, indices, cu, max_len, seqused = unpad_input(x, attention, unused)
    np.testing.assert_array_equal(cu, [0, 4, 9, 9, 10])
    np.testing.assert_array_equal(seqused, [3, 5, 0, 1])


def test_unpad_pad_torch():
    torch = pytest.importorskip("torch")
    attention, unused = masks()
    x = torch.randn(4, 5, 3, 2, requires_grad=True)
    flat, indices, cu, max_len, seqused = unpad_input(x, torch.from_numpy(attention),
                                                      torch.from_numpy(unused))
    assert cu.dtype == torch.int32 and seqused.dtype == torch.int32 and isinstance(max_len, int)
    assert cu.tolist() == [0, 4, 9, 9, 10] and seqused.tolist() == [3, 5, 0, 1]
    assert flat.shape == (10, 3, 2)
    back = pad_input(flat * 2, indices, 4, 5)
    back.sum().backward()
    keep = torch.from_numpy(attention | unused)[..., None, None].float()
    torch.testing.assert_close(x.grad, 2 * keep.expand_as(x))


def test_varlen_over_unpadded_equals_per_sequence():
    rng = np.random.default_rng(2)
    attention, _ = masks()
    b, s, h, d = 4, 5, 2, 16
    qkv = rng.standard_normal((b, s, 3, h, d)).astype(np.float16)
    flat, indices, cu, max_len, _ = unpad_input(qkv, attention)
    out = flashattn.flash_attn_varlen_qkvpacked_func(flat, cu, max_len, causal=True)
    padded = pad_input(out, indices, b, s)
    for i in range(b):
        n = int(attention[i].sum())
        if n == 0:
            assert np.all(padded[i] == 0)
            continue
        q, k, v = (qkv[i:i + 1, :n, j] for j in range(3))
        ref = np_attention(q, k, v, causal=True)
        base = np_attention(q, k, v, causal=True, rnd=ROUNDERS["float16"])
        check_rule("seq%d" % i, padded[i:i + 1, :n].astype(np.float64), ref["o"], base["o"],
                   "float16")
        assert np.all(padded[i, n:] == 0)
