"""The exceptions mkernel raises.

Every failure of the runtime arrives as a :class:`MkernelError` carrying the runtime's status:
``code`` (e.g. ``"deadline exceeded"``), ``message`` (what was wrong: the field, the value and
what was expected; for a failure on the GPU the rank, the launch, the step and the cause) and
``where`` (the source line that made it and the lines that passed it up). An argument that is
refused, whether by the Python layer, the compiled module or the runtime, is an
:class:`ArgumentError`, which is also a ``ValueError``.

The compiled module builds its exceptions through :func:`from_status` and
:func:`argument_error`, so both halves of the package raise the same classes.
"""

from __future__ import annotations


class MkernelError(RuntimeError):
    """A failure reported by mkernel's runtime (or found by the package on its behalf)."""

    def __init__(self, message: str, code: str = "", where: str = "") -> None:
        self.message = message
        self.code = code
        self.where = where
        super().__init__(message)

    def __str__(self) -> str:
        # The runtime's errors say where they were made (like Status::to_string); the package's
        # own refusals are their message alone.
        return f"{self.message} [{self.code}, at {self.where}]" if self.where else self.message


class ArgumentError(MkernelError, ValueError):
    """An argument refused before anything was launched; the message names it."""

    def __init__(self, message: str, code: str = "invalid argument", where: str = "") -> None:
        super().__init__(message, code, where)


class NotBuiltError(MkernelError):
    """The compiled module is missing (or failed to load); the message says why."""


def from_status(code: str, message: str, where: str) -> MkernelError:
    """The exception for a runtime Status (called by the compiled module)."""
    if code == "invalid argument":
        return ArgumentError(message, code, where)
    return MkernelError(message, code, where)


def argument_error(message: str) -> ArgumentError:
    """The exception for an array the compiled module refused (it names the argument)."""
    return ArgumentError(message)
