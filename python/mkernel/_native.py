"""The compiled module, mkernel._C, or the reason it is not there.

The pure-Python package imports without the compiled module (where mkernel was built without
CUDA, or for another Python); what needs the module raises :class:`NotBuiltError` saying why.
"""

from __future__ import annotations

import glob
import importlib.machinery
import os
import sys
from types import ModuleType

from ._errors import NotBuiltError

_here = os.path.dirname(os.path.abspath(__file__))


def _skipped_reason() -> str:
    """What the build recorded about the module (python/CMakeLists.txt writes _build_info.py)."""
    try:
        from . import _build_info  # type: ignore[attr-defined]
    except ImportError:
        return ""
    return getattr(_build_info, "native_skipped_reason", "")


def _load() -> tuple[ModuleType | None, str]:
    try:
        from . import _C  # type: ignore[attr-defined]
    except ImportError as e:
        built = glob.glob(os.path.join(_here, "_C*.so")) + glob.glob(os.path.join(_here, "_C*.pyd"))
        skipped = _skipped_reason()
        if skipped:
            return None, f"mkernel was built without its compiled module: {skipped}"
        here_version = f"{sys.version_info.major}.{sys.version_info.minor}"
        loadable = {"_C" + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES}
        if built and not any(os.path.basename(f) in loadable for f in built):
            # Python only loads _C<suffix> for one of its own suffixes (cpython-311-..., abi3, ...).
            return None, (
                f"mkernel's compiled module {os.path.basename(built[0])} was built for another Python; "
                f"this is Python {here_version} (build it for this interpreter: docs/python.md)"
            )
        if built:
            # The right name, but it did not load: usually a shared library it needs (protobuf).
            return None, (
                f"mkernel's compiled module {os.path.basename(built[0])} did not load into Python "
                f"{here_version}: {e}"
            )
        return None, (
            "mkernel's compiled module is not in this package (running from the source tree? build "
            "it with CMake and put <build>/python on PYTHONPATH, or pip install the repository: "
            "docs/python.md)"
        )
    return _C, ""


native, unavailable_reason = _load()


def require() -> ModuleType:
    """The compiled module, or NotBuiltError with the reason."""
    if native is None:
        raise NotBuiltError(unavailable_reason)
    return native


def available() -> bool:
    """Whether the compiled module loaded."""
    return native is not None
