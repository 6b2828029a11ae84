"""Loading libflashattn and describing its C ABI with ctypes.

`FaParams` mirrors `fa_params` from include/flashattn.h field by field (same order, same types);
tests/test_abi.py checks every offset against the C compiler. Nothing here knows about NumPy or
PyTorch: callers fill an `FaParams` and call `forward` / `backward`, which raise a Python
exception carrying the library's own message on failure.
"""

import ctypes
import glob
import os
import sys

LIBRARY_FILE = "libflashattn.dylib" if sys.platform == "darwin" else "libflashattn.so"
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# ---- statuses and enums (flashattn.h) ----------------------------------------------------------

FA_OK = 0
FA_ERR_NULL_POINTER = 1
FA_ERR_INVALID_SIZE = 2
FA_ERR_OVERFLOW = 3
FA_ERR_HEADS = 4
FA_ERR_HEAD_DIM = 5
FA_ERR_STRIDE = 6
FA_ERR_CU_SEQLENS = 7
FA_ERR_SOFTCAP = 8
FA_ERR_SCALE = 9
FA_ERR_DTYPE = 10
FA_ERR_DEVICE = 11
FA_ERR_UNSUPPORTED = 12
FA_ERR_WORKSPACE = 13
FA_ERR_ALLOC = 14
FA_ERR_CUDA = 15
FA_ERR_INVALID_ARGUMENT = 16
FA_ERR_ALIGNMENT = 17
FA_ERR_OVERLAP = 18

STATUS_NAMES = {
    FA_OK: "FA_OK",
    FA_ERR_NULL_POINTER: "FA_ERR_NULL_POINTER",
    FA_ERR_INVALID_SIZE: "FA_ERR_INVALID_SIZE",
    FA_ERR_OVERFLOW: "FA_ERR_OVERFLOW",
    FA_ERR_HEADS: "FA_ERR_HEADS",
    FA_ERR_HEAD_DIM: "FA_ERR_HEAD_DIM",
    FA_ERR_STRIDE: "FA_ERR_STRIDE",
    FA_ERR_CU_SEQLENS: "FA_ERR_CU_SEQLENS",
    FA_ERR_SOFTCAP: "FA_ERR_SOFTCAP",
    FA_ERR_SCALE: "FA_ERR_SCALE",
    FA_ERR_DTYPE: "FA_ERR_DTYPE",
    FA_ERR_DEVICE: "FA_ERR_DEVICE",
    FA_ERR_UNSUPPORTED: "FA_ERR_UNSUPPORTED",
    FA_ERR_WORKSPACE: "FA_ERR_WORKSPACE",
    FA_ERR_ALLOC: "FA_ERR_ALLOC",
    FA_ERR_CUDA: "FA_ERR_CUDA",
    FA_ERR_INVALID_ARGUMENT: "FA_ERR_INVALID_ARGUMENT",
    FA_ERR_ALIGNMENT: "FA_ERR_ALIGNMENT",
    FA_ERR_OVERLAP: "FA_ERR_OVERLAP",
}

FA_DTYPE_F32 = 0
FA_DTYPE_F16 = 1
FA_DTYPE_BF16 = 2
FA_DTYPE_FP8_E4M3 = 3

FA_DEVICE_CPU = 0
FA_DEVICE_CUDA = 1


# ---- exceptions -----------------------------------------------------------------------------


class FlashAttnError(Exception):
    """Base of every error the C library reports; `status` is the fa_status code and
    `status_name` its name (e.g. "FA_ERR_HEADS")."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status
        self.status_name = STATUS_NAMES.get(status, "") if status is not None else ""


class FlashAttnValueError(FlashAttnError, ValueError):
    """A size, shape, stride or scalar the library rejects."""


class FlashAttnTypeError(FlashAttnError, TypeError):
    """A dtype the library (or the chosen device path) does not support."""


class FlashAttnRuntimeError(FlashAttnError, RuntimeError):
    """Device unavailable, allocation or CUDA failure."""


class FlashAttnNotImplementedError(FlashAttnError, NotImplementedError):
    """A valid combination of features the chosen path does not implement."""


_STATUS_EXCEPTIONS = {
    FA_ERR_DTYPE: FlashAttnTypeError,
    FA_ERR_DEVICE: FlashAttnRuntimeError,
    FA_ERR_ALLOC: FlashAttnRuntimeError,
    FA_ERR_CUDA: FlashAttnRuntimeError,
    FA_ERR_UNSUPPORTED: FlashAttnNotImplementedError,
}


# ---- fa_params ------------------------------------------------------------------------------

_i64 = ctypes.c_int64
_ptr = ctypes.c_void_p


def _strides(prefix):
    return [(prefix + "_batch_stride", _i64), (prefix + "_row_stride", _i64),
            (prefix + "_head_stride", _i64)]


class FaParams(ctypes.Structure):
    """ctypes mirror of `fa_params` (include/flashattn.h). Zero-initialised on construction."""

    _fields_ = (
        [
            ("device", ctypes.c_int),  # fa_device (a C enum: int)
            ("dtype", ctypes.c_int),  # fa_dtype
            ("batch", _i64),
            ("seqlen_q", _i64),
            ("seqlen_k", _i64),
            ("heads_q", _i64),
            ("heads_kv", _i64),
            ("head_dim", _i64),
            ("head_dim_v", _i64),
            ("q", _ptr),
            ("k", _ptr),
            ("v", _ptr),
            ("o", _ptr),
            ("lse", _ptr),  # float *
        ]
        + _strides("q") + _strides("k") + _strides("v") + _strides("o")
        + [
            ("cu_seqlens_q", _ptr),  # const int32_t *
            ("cu_seqlens_k", _ptr),
            ("total_q", _i64),
            ("total_k", _i64),
            ("zero_varlen_tail", ctypes.c_int),
            ("softmax_scale", ctypes.c_float),
            ("causal", ctypes.c_int),
            ("use_window", ctypes.c_int),
            ("window_left", ctypes.c_int32),
            ("window_right", ctypes.c_int32),
            ("softcap", ctypes.c_float),
            ("alibi_slopes", _ptr),  # const float *
            ("alibi_batch_stride", _i64),
            ("sink_logits", _ptr),  # const float *
            ("dout", _ptr),
            ("dq", _ptr),
            ("dk", _ptr),
            ("dv", _ptr),
            ("dsink", _ptr),  # float *
        ]
        + _strides("do") + _strides("dq") + _strides("dk") + _strides("dv")
        + [
            ("deterministic", ctypes.c_int),
            # KV-cache decoding (fa_kvcache_forward only)
            ("cache_seqlens", _ptr),  # const int32_t *
            ("cache_batch_idx", _ptr),
            ("cache_leftpad", _ptr),
            ("block_table", _ptr),
            ("block_table_batch_stride", _i64),
            ("page_size", _i64),
            ("num_pages", _i64),
            ("cache_batch", _i64),
            ("k_new", _ptr),
            ("v_new", _ptr),
        ]
        + _strides("knew") + _strides("vnew")
        + [
            ("seqlen_new", _i64),
            ("rotary_cos", _ptr),
            ("rotary_sin", _ptr),
            ("rotary_dim", _i64),
            ("rotary_seqlen", _i64),
            ("rotary_interleaved", ctypes.c_int),
            ("num_splits", ctypes.c_int),
            # attention dropout (fa_forward / fa_backward)
            ("dropout_p", ctypes.c_float),
            ("dropout_seed", ctypes.c_uint64),
            ("dropout_offset", ctypes.c_uint64),
            ("attn_probs", _ptr),  # float *
            # execution
            ("num_threads", ctypes.c_int),
            ("stream", _ptr),
            ("workspace", _ptr),
            ("workspace_bytes", ctypes.c_size_t),
            # quantised KV cache (fa_kvcache_forward on the CPU; 0 / NULL = the cache is in dtype)
            ("kv_dtype", ctypes.c_int),
            ("k_scale", _ptr),  # float *
            ("v_scale", _ptr),
        ]
        + [("k_scale_" + axis + "_stride", _i64) for axis in ("batch", "row", "head")]
        + [("v_scale_" + axis + "_stride", _i64) for axis in ("batch", "row", "head")]
        + [
            # additive score bias and its gradient (CPU)
            ("bias", _ptr),
            ("bias_dtype", ctypes.c_int),
        ]
        + [("bias_" + axis + "_stride", _i64) for axis in ("batch", "head", "row", "col")]
        + [("dbias", _ptr), ("dbias_dtype", ctypes.c_int)]
        + [("dbias_" + axis + "_stride", _i64) for axis in ("batch", "head", "row", "col")]
        + [
            # block-sparse mask (FlexAttention's BlockMask) and document ids (CPU)
            ("block_q", _i64),
            ("block_k", _i64),
            ("kv_num_blocks", _ptr),  # const int32_t *
            ("kv_indices", _ptr),
            ("full_kv_num_blocks", _ptr),
            ("full_kv_indices", _ptr),
            ("block_count_batch_stride", _i64),
            ("block_count_head_stride", _i64),
            ("block_index_batch_stride", _i64),
            ("block_index_head_stride", _i64),
            ("block_index_row_stride", _i64),
            ("partial_block_bits", _ptr),  # const uint8_t *
            ("block_lists_checked", ctypes.c_int),
            ("doc_ids_q", _ptr),  # const int32_t *
            ("doc_ids_k", _ptr),
            ("doc_ids_q_batch_stride", _i64),
            ("doc_ids_k_batch_stride", _i64),
            ("q_descale", _ptr),  # const float *
            ("k_descale", _ptr),
            ("v_descale", _ptr),
            ("dout_e4m3", ctypes.c_int),
            ("dout_descale", _ptr),  # const float *
        ]
    )

    # Not a field (Python-side only, not copied with the struct): the cached plan of the call's
    # signature (_core.PlanCache), where `_with_workspace` remembers the workspace size that
    # fa_check_* reported, so that this second full validation runs once per signature. None:
    # ask fa_check_* on every call.
    plan = None


# Every address in FaParams (tensors, tables, stream, workspace).
POINTER_FIELDS = tuple(name for name, kind in FaParams._fields_ if kind is _ptr)


# ---- finding and loading the library ----------------------------------------------------------


def _candidates():
    """(where, path) pairs in search order: the package itself, $FLASHATTN_LIB, the repo build."""
    found = []
    for sub in ("lib", ""):
        found.append(("package", os.path.join(PACKAGE_DIR, sub, LIBRARY_FILE)))
    env = os.environ.get("FLASHATTN_LIB")
    if env:
        path = os.path.join(env, LIBRARY_FILE) if os.path.isdir(env) else env
        found.append(("FLASHATTN_LIB", os.path.abspath(path)))
    repo_root = os.path.dirname(os.path.dirname(PACKAGE_DIR))
    found.append(("repository build", os.path.join(repo_root, "build", LIBRARY_FILE)))
    return found


def _preload_cuda_runtime():
    """A CUDA build of libflashattn needs libcudart; when the dynamic loader cannot find it,
    try the toolkit ($CUDA_HOME, /usr/local/cuda) and the copies that pip's NVIDIA packages
    (PyTorch's dependencies) install. Returns True if one was loaded."""
    dirs = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs.append(os.path.join(os.environ[var], "lib64"))
    dirs.append("/usr/local/cuda/lib64")
    for entry in sys.path:
        dirs.extend(glob.glob(os.path.join(entry, "nvidia", "cu*", "lib")))
        dirs.extend(glob.glob(os.path.join(entry, "nvidia", "cuda_runtime", "lib")))
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "libcudart.so*")), reverse=True):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return True
            except OSError:
                continue
    return False


def _open(path):
    try:
        return ctypes.CDLL(path)
    except OSError as err:
        if "libcudart" in str(err) and _preload_cuda_runtime():
            return ctypes.CDLL(path)
        raise


def _declare(lib):
    params_p = ctypes.POINTER(FaParams)
    for name in ("fa_forward", "fa_backward", "fa_standard_forward"):
        fn = getattr(lib, name)
        fn.argtypes = [params_p]
        fn.restype = ctypes.c_int
    for name in ("fa_kvcache_forward",):
        fn = getattr(lib, name)
        fn.argtypes = [params_p]
        fn.restype = ctypes.c_int
    for name in ("fa_check_forward", "fa_check_backward", "fa_check_kvcache"):
        fn = getattr(lib, name)
        fn.argtypes = [params_p, ctypes.POINTER(ctypes.c_size_t)]
        fn.restype = ctypes.c_int
    lib.fa_set_contiguous_strides.argtypes = [params_p]
    lib.fa_set_contiguous_strides.restype = None
    lib.fa_strerror.argtypes = [ctypes.c_int]
    for name in ("fa_strerror", "fa_last_error", "fa_version", "fa_cpu_isa"):
        getattr(lib, name).restype = ctypes.c_char_p
    for name in ("fa_last_error", "fa_version", "fa_cpu_isa", "fa_cuda_available"):
        getattr(lib, name).argtypes = []
    lib.fa_cuda_available.restype = ctypes.c_int


def _load():
    tried = []
    for where, path in _candidates():
        if not os.path.isfile(path):
            tried.append("  %s: %s (not found)" % (where, path))
            continue
        try:
            lib = _open(path)
            _declare(lib)
        except (OSError, AttributeError) as err:
            tried.append("  %s: %s (%s)" % (where, path, err))
            continue
        return lib, path
    raise ImportError(
        "flashattn: cannot load %s. Looked in:\n%s\n"
        "Install the package with `pip install ./python` (it builds the C library with make), or "
        "build it with `make lib` at the repository root, or point FLASHATTN_LIB at the shared "
        "library." % (LIBRARY_FILE, "\n".join(tried)))


lib, library_path = _load()


def version():
    """Version string of the loaded C library."""
    return lib.fa_version().decode()


def cpu_isa():
    """SIMD level the CPU path uses ("avx512", "avx2", "scalar")."""
    return lib.fa_cpu_isa().decode()


def cuda_available():
    """True if the loaded library was built with CUDA and sees a GPU."""
    return bool(lib.fa_cuda_available())


def _raise_for(status, call):
    detail = lib.fa_last_error().decode(errors="replace")
    name = STATUS_NAMES.get(status, "status %d" % status)
    cls = _STATUS_EXCEPTIONS.get(status, FlashAttnValueError)
    raise cls("flashattn: %s failed (%s): %s" % (call, name, detail), status)


def _with_workspace(params, check_name, alloc):
    """When `alloc` is given (CUDA calls from PyTorch), ask the library how much scratch the call
    wants (fa_check_*) and hand it memory from `alloc(nbytes)` (PyTorch's caching allocator)
    instead of letting it cudaMallocAsync / cudaFreeAsync on every call. The size depends only on
    what a call signature fixes (shapes, strides, dtypes, options, device), so with `params.plan`
    set it is asked once per signature and remembered there. Returns the buffer, which must stay
    alive until the call has been enqueued. Errors are left to the call itself."""
    if alloc is None:
        return None
    plan = params.plan
    nbytes = None if plan is None else plan.workspace_bytes
    if nbytes is None:
        size = ctypes.c_size_t(0)
        if getattr(lib, check_name)(ctypes.byref(params), ctypes.byref(size)) != FA_OK:
            return None
        nbytes = size.value
        if plan is not None:
            plan.workspace_bytes = nbytes
    if nbytes == 0:
        return None
    buf, address = alloc(nbytes)
    params.workspace = address
    params.workspace_bytes = nbytes
    return buf


def _call(entry, check_name, params, alloc):
    keep = _with_workspace(params, check_name, alloc)
    status = getattr(lib, entry)(ctypes.byref(params))
    if status == FA_ERR_WORKSPACE and keep is not None and params.plan is not None:
        # The remembered size no longer suffices (an environment switch such as
        # FA_CUDA_BACKWARD=portable changed the kernel's plan): ask again. Nothing was written.
        params.plan.workspace_bytes = None
        params.workspace, params.workspace_bytes = None, 0
        keep = _with_workspace(params, check_name, alloc)  # noqa: F841 (alive during the call)
        status = getattr(lib, entry)(ctypes.byref(params))
    if status != FA_OK:
        _raise_for(status, entry)


def forward(params, alloc=None):
    _call("fa_forward", "fa_check_forward", params, alloc)


def backward(params, alloc=None):
    _call("fa_backward", "fa_check_backward", params, alloc)


def kvcache_forward(params, alloc=None):
    _call("fa_kvcache_forward", "fa_check_kvcache", params, alloc)


def standard_forward(params):
    status = lib.fa_standard_forward(ctypes.byref(params))
    if status != FA_OK:
        _raise_for(status, "fa_standard_forward")
