"""register_as_flash_attn: flashattn under flash_attn's module names, so that a program written
against flash_attn 2.8 (`from flash_attn import flash_attn_func`, `from flash_attn.bert_padding
import unpad_input`, `from flash_attn.flash_attn_interface import _flash_attn_forward`, ...) runs
on flashattn unchanged once this has been called."""

import importlib.machinery
import sys
import types

# The flash_attn release whose interface flashattn mirrors: what `flash_attn.__version__` reads
# once registered (programs gate features on it: windows from 2.3, softcap from 2.6, ...).
FLASH_ATTN_API_VERSION = "2.8.3"


def _module(name, doc, **attrs):
    m = types.ModuleType(name, doc)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    m.__flashattn_alias__ = True
    for key, value in attrs.items():
        setattr(m, key, value)
    return m


def register_as_flash_attn():
    """Installs modules named flash_attn, flash_attn.flash_attn_interface, flash_attn.bert_padding
    and (with torch) flash_attn.layers.rotary and flash_attn.ops.triton.rotary in sys.modules,
    backed by flashattn. Returns the flash_attn module. Idempotent; raises RuntimeError if another
    module is already imported as flash_attn (flash_attn itself: nothing is shadowed)."""
    present = sys.modules.get("flash_attn")
    if present is not None:
        if getattr(present, "__flashattn_alias__", False):
            return present
        raise RuntimeError("flashattn: a module named flash_attn is already imported (%r); "
                           "register_as_flash_attn() must run before anything imports flash_attn"
                           % (getattr(present, "__file__", None) or present,))
    import flashattn
    from . import bert_padding, flash_attn_interface

    public = {name: getattr(flashattn, name) for name in flashattn.__all__
              if name.startswith("flash_attn_")}
    modules = {
        "flash_attn": _module("flash_attn", "flashattn registered as flash_attn "
                              "(flashattn.register_as_flash_attn)", __version__=FLASH_ATTN_API_VERSION,
                              flashattn_version=flashattn.__version__,
                              flash_attn_interface=flash_attn_interface, bert_padding=bert_padding,
                              **public),
        "flash_attn.flash_attn_interface": flash_attn_interface,
        "flash_attn.bert_padding": bert_padding,
    }
    try:
        from .layers import rotary
    except ImportError:  # NumPy-only installs: no rotary layers
        rotary = None
    if rotary is not None:
        layers = _module("flash_attn.layers", "flash_attn.layers (flashattn.layers)", rotary=rotary)
        triton = _module("flash_attn.ops.triton", "flash_attn.ops.triton (flashattn.layers.rotary)",
                         rotary=rotary)
        ops = _module("flash_attn.ops", "flash_attn.ops (rotary only)", triton=triton)
        modules["flash_attn"].layers = layers
        modules["flash_attn"].ops = ops
        modules.update({"flash_attn.layers": layers, "flash_attn.layers.rotary": rotary,
                        "flash_attn.ops": ops, "flash_attn.ops.triton": triton,
                        "flash_attn.ops.triton.rotary": rotary})
    sys.modules.update(modules)
    return modules["flash_attn"]
