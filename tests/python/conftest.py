"""Shared pieces of the Python package's CPU tests (run by ctest as python_package_test).

ctest puts the staged package (<build>/python) on PYTHONPATH. Run by hand without it, the
tests take the source tree's package: the pure-Python parts are tested and what needs the
compiled module is skipped, saying so.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys

import pytest

_repo = os.environ.get("MKERNEL_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if importlib.util.find_spec("mkernel") is None:
    sys.path.insert(0, os.path.join(_repo, "python"))

import mkernel  # noqa: E402
from mkernel import _native  # noqa: E402

HAVE_TORCH = importlib.util.find_spec("torch") is not None

needs_native = pytest.mark.skipif(
    not _native.available(), reason=f"mkernel's compiled module is not available: {_native.unavailable_reason}"
)
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (scripts/install-deps.sh installs it)")


# ---- DLPack arrays made by hand -----------------------------------------------------------------
# The compiled module's checks read metadata only, so a capsule that claims CUDA memory at an
# address nothing owns exercises them on a machine without a GPU (nothing ever dereferences it).


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


DL_CPU, DL_CUDA = 1, 2
BF16 = (4, 16)  # DLPack type code Bfloat, 16 bits
F16 = (2, 16)

_keep_alive: list[object] = []  # the structures behind capsules handed out (tests are short)


def dl_array(shape, strides=None, *, dtype=BF16, device=DL_CUDA, device_id=0, data=0x7F0000000000):
    """A DLPack capsule ("dltensor") describing an array that does not exist."""
    ndim = len(shape)
    if strides is None:
        strides, step = [], 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
    shape_arr = (ctypes.c_int64 * ndim)(*shape)
    strides_arr = (ctypes.c_int64 * ndim)(*strides)
    managed = _DLManagedTensor()
    managed.dl_tensor = _DLTensor(
        data, _DLDevice(device, device_id), ndim, _DLDataType(dtype[0], dtype[1], 1), shape_arr, strides_arr, 0
    )
    _keep_alive.extend([shape_arr, strides_arr, managed])
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new_capsule(ctypes.addressof(managed), b"dltensor", None)


@pytest.fixture
def native():
    if not _native.available():
        pytest.skip(f"mkernel's compiled module is not available: {_native.unavailable_reason}")
    return _native.native
