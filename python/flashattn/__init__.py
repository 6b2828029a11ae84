"""flashattn: IO-aware exact attention (FlashAttention) over the libflashattn C library.

The functions mirror flash_attn 2.x (same names, arguments, defaults and return values) and take
PyTorch tensors (CPU or CUDA, with autograd and torch.compile support) or NumPy arrays (CPU).
See python/README.md for what differs from flash_attn.
"""

from ._lib import (FlashAttnError, FlashAttnNotImplementedError, FlashAttnRuntimeError,
                   FlashAttnTypeError, FlashAttnValueError, cpu_isa, cuda_available,
                   library_path)
from ._lib import version as library_version
from ._core import get_num_threads, set_num_threads
from .flash_attn_interface import (flash_attn_backward, flash_attn_forward, flash_attn_func,
                                   flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                                   flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                                   flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
from . import bert_padding
from ._alias import FLASH_ATTN_API_VERSION, register_as_flash_attn

try:  # programmable attention (bias, block-sparse masks): needs torch
    from ._mods_impl import (BlockSparseMask, causal_block_mask, document_block_mask,
                             flex_attention, prefix_lm_block_mask, sliding_window_block_mask)
except ImportError:  # NumPy-only installs
    pass

__version__ = "0.1.0"

__all__ = [
    "flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
    "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache", "flash_attn_forward",
    "flash_attn_backward", "bert_padding", "set_num_threads", "get_num_threads",
    "library_path", "library_version", "cpu_isa", "cuda_available", "FlashAttnError",
    "FlashAttnValueError", "FlashAttnTypeError", "FlashAttnRuntimeError",
    "FlashAttnNotImplementedError", "register_as_flash_attn", "FLASH_ATTN_API_VERSION",
]
