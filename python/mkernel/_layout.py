"""How torch's ``fused_all_gather_matmul`` and ``fused_matmul_reduce_scatter`` arguments map onto
mkernel's AllGather+GEMM and GEMM+ReduceScatter (the latter further down), and those of mkernel's
``fused_matmul_all_reduce`` onto its GEMM+AllReduce (at the end of this file).

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


def _check_activation(name: str, t: Any) -> int:
    """Refuses an activation the ops do not take (a bf16 CUDA tensor of at least 2 dimensions, none
    empty, K a multiple of 8), naming it; returns K."""
    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"{name}: {type(t).__name__}; expected a torch.Tensor")
    if t.dtype != torch.bfloat16:
        raise ArgumentError(f"{name}: dtype {t.dtype}; expected torch.bfloat16 (bf16 in, fp32 accumulate)")
    if t.device.type != "cuda":
        raise ArgumentError(f"{name}: device {t.device}; expected a CUDA tensor on this rank's GPU")
    if t.dim() < 2:
        raise ArgumentError(f"{name}: shape {_shape(t)}; expected at least 2 dimensions ([..., K])")
    K = t.shape[-1]
    if t.numel() == 0:
        raise ArgumentError(f"{name}: shape {_shape(t)}; expected no empty dimension")
    if K % 8 != 0:
        raise ArgumentError(f"{name}: K = {K} (last dimension); expected a multiple of 8 (16-byte rows)")
    return K


def check_all_gather_matmul(
    A_shard: Any, Bs: Any, gather_dim: Any, *, return_A: Any = True, allow_copy_B: Any = False
) -> int:
    """Refuses arguments the op does not take (ArgumentError naming the argument); returns
    gather_dim made non-negative. Reads metadata only."""
    K = _check_activation("A_shard", A_shard)
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


# ---- fused_matmul_reduce_scatter ----------------------------------------------------------------
#
# The kernel computes, on rank r, ``out = rows r * m_local ... of sum over ranks of a @ w^T`` with
# ``a`` [M, k] (M = world * m_local), ``w`` [n, k] packed row-major and ``out`` [m_local, n], bf16.
# torch's op takes ``A`` (any rank >= 2, [..., K]) and ``B`` [K, N] and returns
# ``reduce_scatter_tensor(A @ B, reduce_op, scatter_dim)``, contiguous. So:
#
# * ``A`` is moved so that ``scatter_dim`` leads (``A.movedim(scatter_dim, 0)``) and flattened to
#   rows [M, K]: rank r's share of the scattered dimension is then rows r * m_local ... of that
#   matrix. A view when packed (scatter_dim 0 of a contiguous A, or an A restrided for it, e.g. by
#   torch's ``restride_A_for_fused_matmul_reduce_scatter``), else one copy, as torch's op makes.
#   Scattering the last dimension (N) is refused: the kernel scatters rows (torch's op has that
#   case). ``A.shape[scatter_dim]`` must be a multiple of the group's size.
# * ``B`` is taken like ``Bs[0]`` of fused_all_gather_matmul: a transposed [N, K] weight as it
#   is, a row-major [K, N] B refused unless ``allow_copy_B=True``.
# * The output is contiguous with torch's shape (``A.shape[:-1] + (N,)``, ``scatter_dim`` divided
#   by the group's size). For scatter_dim 0 the kernel writes it directly; otherwise the kernel's
#   rows are in the moved order and one copy puts them in place (torch's op also writes its
#   result through a transposing reduction).

RS_OP_NAME = "fused_matmul_reduce_scatter"
REDUCE_OPS = ("sum",)


def _check_summed_matmul(A: Any, B: Any, reduce_op: Any, allow_copy_B: Any, op: str) -> None:
    """What GEMM+ReduceScatter and GEMM+AllReduce (``op`` names it) both refuse: A as an
    activation, B [K, N] as a transposed weight (or any layout with allow_copy_B), a reduce_op
    other than "sum"."""
    K = _check_activation("A", A)
    if not isinstance(B, torch.Tensor):
        raise ArgumentError(f"B: {type(B).__name__}; expected a torch.Tensor")
    if B.dtype != torch.bfloat16:
        raise ArgumentError(f"B: dtype {B.dtype}; expected torch.bfloat16 like A")
    if B.device != A.device:
        raise ArgumentError(f"B: device {B.device}; expected A's device {A.device}")
    if B.dim() != 2 or B.shape[0] != K:
        raise ArgumentError(f"B: shape {_shape(B)}; expected [K, N] = [{K}, N] (K from A)")
    N = B.shape[1]
    if N == 0 or N % 8 != 0:
        raise ArgumentError(f"B: N = {N} columns; expected a positive multiple of 8 (16-byte weight rows)")
    if not is_weight_transposed(B) and not allow_copy_B:
        raise ArgumentError(
            f"B: strides {_strides(B)} for shape {_shape(B)}; expected (1, {K}): the transpose of a row-major "
            f"[N, K] weight, e.g. weight.t() of an nn.Linear weight (mkernel's GEMM reads W [N, K] rows); pass "
            "allow_copy_B=True to copy B into that layout on every call"
        )
    if not isinstance(reduce_op, str) or reduce_op not in REDUCE_OPS:
        raise ArgumentError(
            f"reduce_op: {reduce_op!r}; expected 'sum' (mkernel's {op} sums; for 'avg' divide the sum by the "
            "group's size)"
        )


def check_matmul_reduce_scatter(A: Any, B: Any, reduce_op: Any, scatter_dim: Any, *, allow_copy_B: Any = False) -> int:
    """Refuses arguments fused_matmul_reduce_scatter does not take (ArgumentError naming the
    argument); returns scatter_dim made non-negative. Reads metadata only. The group's size is
    checked against A by check_scatter_world."""
    _check_summed_matmul(A, B, reduce_op, allow_copy_B, "GEMM+ReduceScatter")
    if isinstance(scatter_dim, bool) or not isinstance(scatter_dim, int):
        raise ArgumentError(f"scatter_dim: {scatter_dim!r}; expected an int")
    nd = A.dim()
    if not -nd <= scatter_dim < nd:
        raise ArgumentError(f"scatter_dim: {scatter_dim}; expected -{nd} .. {nd - 1} for A of shape {_shape(A)}")
    sd = scatter_dim % nd
    if sd == nd - 1:
        raise ArgumentError(
            f"scatter_dim: {scatter_dim} is the last dimension of the result (N); mkernel's GEMM+ReduceScatter "
            "scatters rows, so scatter a leading dimension (torch.ops.symm_mem.fused_matmul_reduce_scatter "
            "has that case)"
        )
    if not isinstance(allow_copy_B, bool):
        raise ArgumentError(f"allow_copy_B: {allow_copy_B!r}; expected a bool")
    return sd


def check_scatter_world(A: torch.Tensor, sd: int, world: int) -> None:
    """A's scattered dimension splits evenly over the group (every rank gets as many rows)."""
    if A.shape[sd] % world != 0:
        raise ArgumentError(
            f"A: shape {_shape(A)} has {A.shape[sd]} along scatter_dim {sd}; expected a multiple of the group's "
            f"size {world} (every rank gets an equal part)"
        )


def scatter_output_of(
    A: torch.Tensor, B: torch.Tensor, sd: int, world: int
) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The flat output the kernel writes [m_local, N] and the function that makes the op's
    result of it (contiguous, torch's shape)."""
    moved_shape = list(A.movedim(sd, 0).shape)
    leading = moved_shape[:-1]
    leading[0] //= world
    N = B.shape[1]
    out = A.new_empty((math.prod(leading), N))

    def result(t: torch.Tensor) -> torch.Tensor:
        viewed = t.view(*leading, N)
        return viewed if sd == 0 else viewed.movedim(0, sd).contiguous()

    return out, result


# ---- fused_matmul_all_reduce --------------------------------------------------------------------
#
# The kernel computes, on every rank, ``out = sum over ranks of a @ w^T`` with ``a`` [M, k], ``w``
# [n, k] packed row-major and ``out`` [M, n], bf16; M is any positive number (the kernel's bands
# need not be equal, and some are empty when M < world). The op takes ``A`` (any rank >= 2,
# [..., K]) and ``B`` [K, N] and returns ``all_reduce(A @ B, reduce_op)``, contiguous, every rank
# the same bits. So:
#
# * ``A`` is flattened to rows [M, K] (M the product of its leading dimensions): a view when A is
#   contiguous, else one copy.
# * ``B`` as for fused_matmul_reduce_scatter: a transposed [N, K] weight as it is, a row-major
#   [K, N] B refused unless ``allow_copy_B=True``.
# * The output [M, N] the kernel writes is the result, viewed as ``A.shape[:-1] + (N,)``.

AR_OP_NAME = "fused_matmul_all_reduce"


def check_matmul_all_reduce(A: Any, B: Any, reduce_op: Any, *, allow_copy_B: Any = False) -> None:
    """Refuses arguments fused_matmul_all_reduce does not take (ArgumentError naming the
    argument). Reads metadata only; the group's size does not constrain A."""
    _check_summed_matmul(A, B, reduce_op, allow_copy_B, "GEMM+AllReduce")
    if not isinstance(allow_copy_B, bool):
        raise ArgumentError(f"allow_copy_B: {allow_copy_B!r}; expected a bool")


def all_reduce_output_of(
    A: torch.Tensor, B: torch.Tensor
) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The flat output the kernel writes [M, N] and the function that makes the op's result of it
    (a view: contiguous, ``A.shape[:-1] + (N,)``)."""
    leading = list(A.shape[:-1])
    N = B.shape[1]
    out = A.new_empty((math.prod(leading), N))

    def result(t: torch.Tensor) -> torch.Tensor:
        return t.view(*leading, N)

    return out, result
