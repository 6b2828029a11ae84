import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # NumPy has no bfloat16 of its own
    BF16 = None

NUMPY_DTYPES = ["float32", "float16"] + (["bfloat16"] if BF16 is not None else [])


def np_dtype(name):
    return BF16 if name == "bfloat16" else np.dtype(name)


@pytest.fixture
def captured(monkeypatch):
    """Records (call, FaParams copy) for every library call made through flashattn._lib."""
    import ctypes

    import flashattn._lib as lib

    calls = []

    def wrap(name, fn):
        def recorder(params, alloc=None):
            copy = lib.FaParams()
            ctypes.pointer(copy)[0] = params
            calls.append((name, copy))
            return fn(params, alloc)
        return recorder

    monkeypatch.setattr(lib, "forward", wrap("forward", lib.forward))
    monkeypatch.setattr(lib, "backward", wrap("backward", lib.backward))
    return calls
