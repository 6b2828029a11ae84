"""flashattn.register_as_flash_attn: programs written against flash_attn 2.8 import its module
names and run on flashattn."""

import sys
import types

import pytest

import flashattn

NAMES = ("flash_attn", "flash_attn.flash_attn_interface", "flash_attn.bert_padding",
         "flash_attn.layers", "flash_attn.layers.rotary", "flash_attn.ops",
         "flash_attn.ops.triton", "flash_attn.ops.triton.rotary")


@pytest.fixture
def clean_modules():
    saved = {n: sys.modules.pop(n) for n in NAMES if n in sys.modules}
    yield
    for n in NAMES:
        sys.modules.pop(n, None)
    sys.modules.update(saved)


def test_flash_attn_imports_resolve_to_flashattn(clean_modules):
    torch = pytest.importorskip("torch")
    module = flashattn.register_as_flash_attn()
    assert flashattn.register_as_flash_attn() is module, "not idempotent"
    import flash_attn
    from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
    from flash_attn.bert_padding import pad_input, unpad_input
    from flash_attn.flash_attn_interface import _flash_attn_backward, _flash_attn_forward
    from flash_attn.layers.rotary import apply_rotary_emb
    from flash_attn.ops.triton.rotary import apply_rotary
    import importlib.util
    assert flash_attn is module and importlib.util.find_spec("flash_attn") is not None
    assert flash_attn.__version__ == flashattn.FLASH_ATTN_API_VERSION == "2.8.3"
    assert flash_attn_func is flashattn.flash_attn_func
    assert flash_attn_varlen_func is flashattn.flash_attn_varlen_func
    assert flash_attn_with_kvcache is flashattn.flash_attn_with_kvcache
    assert unpad_input is flashattn.bert_padding.unpad_input and pad_input is flashattn.bert_padding.pad_input
    assert _flash_attn_forward is flashattn.flash_attn_interface._flash_attn_forward
    assert _flash_attn_backward is flashattn.flash_attn_interface._flash_attn_backward
    assert apply_rotary_emb is flashattn.layers.rotary.apply_rotary_emb
    assert apply_rotary is flashattn.layers.rotary.apply_rotary
    q = torch.randn(1, 6, 2, 8)
    assert torch.equal(flash_attn.flash_attn_func(q, q, q, causal=True),
                       flashattn.flash_attn_func(q, q, q, causal=True))


def test_another_flash_attn_is_not_shadowed(clean_modules):
    other = types.ModuleType("flash_attn")
    sys.modules["flash_attn"] = other
    with pytest.raises(RuntimeError, match="already imported"):
        flashattn.register_as_flash_attn()
    assert sys.modules["flash_attn"] is other
    assert "flash_attn.bert_padding" not in sys.modules
