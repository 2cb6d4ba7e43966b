"""How torch's ``fused_all_gather_matmul`` arguments map onto mkernel's AllGather+GEMM.

Both the real implementation and the fake one (torch.compile's tracing) go through these
functions, so they check the same things and produce outputs of the same shapes and strides.
Everything here reads tensor metadata only: it runs on fake and meta tensors, without a GPU.

The kernel computes ``out = AllGather(a) @ w^T`` with ``a`` [m_local, k] and ``w`` [n_local, k]
packed row-major, bf16. torch's op takes ``A_shard`` (any rank >= 2) gathered along
``gather_dim`` and ``Bs``, each [K, N]. So:

* ``A_shard`` is moved so that ``gather_dim`` leads (``A_shard.movedim(gather_dim, 0)``) and
  flattened to rows [m_local, K]. When that view is already packed (gather_dim 0 of a contiguous
  A_shard, or an A_shard restrided for it) no copy is made; otherwise it is copied once, as
  torch's op does. The gathered dimension cannot be the last one: gathering K is a matmul whose
  partial products are summed over ranks, which this kernel does not do, so it is refused.
* ``Bs[0]`` goes through the fused kernel. ``B.t()`` must be ``w``: a B of strides (1, K), the
  transpose of a row-major [N, K] weight (``weight.t()`` of an ``nn.Linear``), is taken as it is.
  A row-major [K, N] B is refused, naming its strides, unless ``allow_copy_B=True``, which
  copies it into that layout on every call (documented cost: one read and write of B).
* ``Bs[1:]``, when given, are multiplied with torch's GEMM on the gathered A the kernel wrote
  (the gather is done once, on the same stream); any layout torch.mm takes is fine there.
* Outputs are made [world * m_local, N] and returned as views with A_shard's dimension order,
  like torch's op: the same shapes and strides.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from ._errors import ArgumentError

OP_NAME = "fused_all_gather_matmul"


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def _strides(t: torch.Tensor) -> str:
    return str(tuple(t.stride()))


def is_weight_transposed(B: torch.Tensor) -> bool:
    """Whether B [K, N] is the transpose of a packed row-major [N, K] matrix (strides (1, K))."""
    K, N = B.shape
    return (K <= 1 or B.stride(0) == 1) and (N <= 1 or B.stride(1) == K)


def check_all_gather_matmul(
    A_shard: Any, Bs: Any, gather_dim: Any, *, return_A: Any = True, allow_copy_B: Any = False
) -> int:
    """Refuses arguments the op does not take (ArgumentError naming the argument); returns
    gather_dim made non-negative. Reads metadata only."""
    if not isinstance(A_shard, torch.Tensor):
        raise ArgumentError(f"A_shard: {type(A_shard).__name__}; expected a torch.Tensor")
    if A_shard.dtype != torch.bfloat16:
        raise ArgumentError(f"A_shard: dtype {A_shard.dtype}; expected torch.bfloat16 (bf16 in, fp32 accumulate)")
    if A_shard.device.type != "cuda":
        raise ArgumentError(f"A_shard: device {A_shard.device}; expected a CUDA tensor on this rank's GPU")
    if A_shard.dim() < 2:
        raise ArgumentError(f"A_shard: shape {_shape(A_shard)}; expected at least 2 dimensions ([..., K])")
    K = A_shard.shape[-1]
    if A_shard.numel() == 0:
        raise ArgumentError(f"A_shard: shape {_shape(A_shard)}; expected no empty dimension")
    if K % 8 != 0:
        raise ArgumentError(f"A_shard: K = {K} (last dimension); expected a multiple of 8 (16-byte rows)")
    if isinstance(gather_dim, bool) or not isinstance(gather_dim, int):
        raise ArgumentError(f"gather_dim: {gather_dim!r}; expected an int")
    nd = A_shard.dim()
    if not -nd <= gather_dim < nd:
        raise ArgumentError(f"gather_dim: {gather_dim}; expected -{nd} .. {nd - 1} for A_shard of shape {_shape(A_shard)}")
    gd = gather_dim % nd
    if gd == nd - 1:
        raise ArgumentError(
            f"gather_dim: {gather_dim} is A_shard's last dimension (K); gathering K makes a matmul whose "
            "products are summed over ranks, which mkernel's AllGather+GEMM does not do; gather a "
            "leading dimension (torch.ops.symm_mem.fused_all_gather_matmul has that case)"
        )
    if not isinstance(return_A, bool):
        raise ArgumentError(f"return_A: {return_A!r}; expected a bool")
    if not isinstance(allow_copy_B, bool):
        raise ArgumentError(f"allow_copy_B: {allow_copy_B!r}; expected a bool")
    if not isinstance(Bs, (list, tuple)) or len(Bs) == 0:
        raise ArgumentError(f"Bs: {type(Bs).__name__} of {len(Bs) if isinstance(Bs, (list, tuple)) else '?'}; "
                            "expected a non-empty list of [K, N] tensors")
    for i, B in enumerate(Bs):
        name = f"Bs[{i}]"
        if not isinstance(B, torch.Tensor):
            raise ArgumentError(f"{name}: {type(B).__name__}; expected a torch.Tensor")
        if B.dtype != torch.bfloat16:
            raise ArgumentError(f"{name}: dtype {B.dtype}; expected torch.bfloat16 like A_shard")
        if B.device != A_shard.device:
            raise ArgumentError(f"{name}: device {B.device}; expected A_shard's device {A_shard.device}")
        if B.dim() != 2 or B.shape[0] != K:
            raise ArgumentError(f"{name}: shape {_shape(B)}; expected [K, N] = [{K}, N] (K from A_shard)")
        if B.shape[1] == 0:
            raise ArgumentError(f"{name}: shape {_shape(B)}; expected N > 0")
    B0 = Bs[0]
    N0 = B0.shape[1]
    if N0 % 8 != 0:
        raise ArgumentError(f"Bs[0]: N = {N0} columns; expected a multiple of 8 (16-byte weight rows)")
    if not is_weight_transposed(B0) and not allow_copy_B:
        raise ArgumentError(
            f"Bs[0]: strides {_strides(B0)} for shape {_shape(B0)}; expected (1, {K}): the transpose of a "
            f"row-major [N, K] weight, e.g. weight.t() of an nn.Linear weight (mkernel's GEMM reads W "
            "[N, K] rows); pass allow_copy_B=True to copy B into that layout on every call"
        )
    return gd


def rows_of(A_shard: torch.Tensor, gd: int) -> torch.Tensor:
    """A_shard as the kernel's rows [m_local, K]: a view when the moved layout is packed,
    else a copy (module notes)."""
    moved = A_shard.movedim(gd, 0)
    if not moved.is_contiguous():
        moved = moved.contiguous()
    return moved.reshape(-1, A_shard.shape[-1])


def weight_of(B: torch.Tensor) -> torch.Tensor:
    """B [K, N] as the kernel's w [N, K] packed row-major: B.t() itself when B is a transposed
    weight, else a copy (allowed by allow_copy_B)."""
    w = B.t()
    return w if w.is_contiguous() else w.contiguous()


def outputs_of(
    A_shard: torch.Tensor, Bs: Sequence[torch.Tensor], gd: int, world: int, return_A: bool
) -> tuple[torch.Tensor | None, list[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """The flat outputs the kernel writes and the function that views them as the op returns
    them: gathered A [world * m_local, K] (None when neither returned nor needed by Bs[1:]),
    one [world * m_local, N] per B."""
    moved_shape = list(A_shard.movedim(gd, 0).shape)
    leading, K = moved_shape[:-1], moved_shape[-1]
    m_local = math.prod(leading)
    M = world * m_local
    need_gathered = return_A or len(Bs) > 1
    A_flat = A_shard.new_empty((M, K)) if need_gathered else None
    outs = [A_shard.new_empty((M, B.shape[1])) for B in Bs]

    def unflatten(t: torch.Tensor) -> torch.Tensor:
        # [world * m_local, X] -> the gathered dimension first, then A_shard's order back.
        return t.view(world * leading[0], *leading[1:], t.shape[-1]).movedim(0, gd)

    return A_flat, outs, unflatten
