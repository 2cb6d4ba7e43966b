"""mkernel's fused ops as torch ops (``torch.ops.mkernel.*``), for eager mode, torch.compile and
CUDA graphs.

This module is pure Python: it registers the ops with ``torch.library`` and hands tensors to the
compiled module through DLPack, so it works with any PyTorch that has ``torch.library`` (2.4 and
newer) and the compiled module is built once for all of them.

Ops (each mirrors the ``torch.ops.symm_mem`` op of the same name: argument order, defaults and
return structure, so switching is one line):

``fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name, *, return_A=True, allow_copy_B=False)
-> (A | None, [A @ B for B in Bs])``
    AllGather of ``A_shard`` along ``gather_dim`` over the group, times each B. ``allow_copy_B`` is
    mkernel's addition (see mkernel._layout for the layouts taken).

``fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name, *, allow_copy_B=False)
-> Tensor``
    ``reduce_scatter_tensor(A @ B, reduce_op, scatter_dim)`` over the group, by mkernel's
    GEMM+ReduceScatter (sums in fp32 in a fixed order, rounds once: deterministic). ``reduce_op``
    is "sum" (torch's op also takes "avg"); B as ``Bs[0]`` above.

How a call runs (the CUDA implementation):

* Streams: the kernel is enqueued on the caller's current CUDA stream of the tensors' device,
  passed to the compiled module as an integer; outputs are allocated by torch on that stream.
  Nothing synchronises the host. Tensors are exported with ``__dlpack__(stream=-1)``: the
  consumer runs on the producer's own stream, so DLPack's cross-stream synchronisation (an event
  on the legacy default stream, which would break a CUDA graph capture) is neither needed nor done.
* The communicator is the one registered under ``group_name`` (mkernel.Communicator); where
  there is none, one is made from the process group of that name, sized for this call.
* Plans are made on a shape's first call (collectively: every rank must make the same call) and
  kept by the communicator. CUDA graph capture needs the shape planned before the capture (a
  warm-up call, which torch.cuda.graph users make anyway, or Communicator.plan).
* Errors: bad arguments raise mkernel.ArgumentError naming the argument, before anything is
  launched; runtime failures raise mkernel.MkernelError with the runtime's message. A failure on
  the GPU (a peer that died, a wait past its bound) is raised by the next call on the
  communicator, or by Communicator.check() after synchronising.
* Fake implementation (torch.compile, meta tensors): the same checks and the same output shapes
  and strides, computed by the same code (mkernel._layout), with no communicator needed.
* No autograd formula is registered (torch's symm_mem ops have none either).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from . import _layout
from ._errors import ArgumentError, MkernelError
from .communicator import (
    Communicator,
    all_gather_matmul_workspace_bytes,
    default_fused_flags,
    get_communicator,
    matmul_reduce_scatter_fused_flags,
    matmul_reduce_scatter_network_bytes,
    matmul_reduce_scatter_workspace_bytes,
)

_NAMESPACE = "mkernel"
_SCHEMA = (
    "fused_all_gather_matmul(Tensor A, Tensor[] Bs, int gather_dim, str group_name, *, "
    "bool return_A=True, bool allow_copy_B=False) -> (Tensor?, Tensor[])"
)
_RS_SCHEMA = (
    "fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, str group_name, *, "
    "bool allow_copy_B=False) -> Tensor"
)


def _stride_tag() -> tuple[Any, ...]:
    # The kernel reads B's memory as it is laid out (a transposed weight is taken without a copy),
    # so inductor must hand the op the strides eager mode would: exact strides where this torch
    # has that tag, else the stride order.
    tag = getattr(torch._C.Tag, "needs_exact_strides", None) or torch._C.Tag.needs_fixed_stride_order
    return (tag,)


def _world_size(group_name: str) -> int:
    comm = get_communicator(group_name)
    if comm is not None:
        return comm.size
    try:
        import torch.distributed.distributed_c10d as c10d

        return int(c10d._get_group_size_by_name(group_name))
    except Exception as e:  # unknown name, or torch.distributed not initialized
        raise ArgumentError(
            f"group_name: {group_name!r} names neither a registered mkernel.Communicator nor a "
            f"torch.distributed process group ({e})"
        ) from e


def _capturing() -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _make_communicator(group_name: str, device: torch.device, **sizes: Any) -> Communicator:
    """A communicator for the process group named group_name, sized for the call (collective)."""
    if _capturing():
        raise MkernelError(
            f"group_name: no mkernel.Communicator for {group_name!r}, and none can be made while a CUDA "
            "graph is being captured; make it before the capture (Communicator.from_process_group) or "
            "call the op once before capturing",
            "failed precondition",
        )
    import torch.distributed.distributed_c10d as c10d

    group = c10d._resolve_process_group(group_name)
    return Communicator.from_process_group(group, device=device.index, **sizes)


def _communicator_for(group_name: str, A_shard: torch.Tensor, m_local: int, world: int) -> Communicator:
    K = A_shard.shape[-1]
    comm = get_communicator(group_name)
    if comm is None:
        comm = _make_communicator(
            group_name, A_shard.device, workspace_bytes=all_gather_matmul_workspace_bytes(world, m_local, K)
        )
    needed = all_gather_matmul_workspace_bytes(world, m_local, K)
    if needed > comm.workspace_bytes:
        raise ArgumentError(
            f"A_shard: this call needs an NVLink workspace of {needed} bytes (world {world} x m_local {m_local} "
            f"x K {K} x 2); the communicator of {group_name!r} has {comm.workspace_bytes}; make it with "
            f"workspace_bytes >= {needed} (mkernel.all_gather_matmul_workspace_bytes)"
        )
    if comm.device != A_shard.device.index:
        raise ArgumentError(
            f"A_shard: device {A_shard.device}; expected the communicator's device cuda:{comm.device} "
            f"(rank {comm.rank} of {group_name!r})"
        )
    return comm


def _nodes_of(world: int) -> int:
    """How many nodes the group spans, as torchrun's LOCAL_WORLD_SIZE says (1 where it says nothing)."""
    import os

    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and 0 < int(local) < world and world % int(local) == 0:
        return world // int(local)
    return 1


def _communicator_for_reduce_scatter(group_name: str, A: torch.Tensor, m_local: int, n: int, world: int) -> Communicator:
    comm = get_communicator(group_name)
    if comm is None:
        nodes = _nodes_of(world)
        comm = _make_communicator(
            group_name,
            A.device,
            workspace_bytes=max(1, matmul_reduce_scatter_workspace_bytes(world, m_local, n, nodes)),
            network_workspace_bytes=matmul_reduce_scatter_network_bytes(nodes, m_local, n),
            fused_flags=max(default_fused_flags(), matmul_reduce_scatter_fused_flags(world, m_local, n, nodes)),
        )
    nodes = max(1, comm.nodes)
    needed = matmul_reduce_scatter_workspace_bytes(comm.size, m_local, n, nodes)
    if needed > comm.workspace_bytes:
        raise ArgumentError(
            f"A: this call needs an NVLink workspace of {needed} bytes (the partial tiles of a [{m_local}, {n}] "
            f"result from each of {comm.gpus_per_node - 1} node peers); the communicator of {group_name!r} has "
            f"{comm.workspace_bytes}; make it with workspace_bytes >= {needed} "
            "(mkernel.matmul_reduce_scatter_workspace_bytes)"
        )
    if nodes > 1:
        network = matmul_reduce_scatter_network_bytes(nodes, m_local, n)
        if network > comm.network_workspace_bytes:
            raise ArgumentError(
                f"A: this call needs a network workspace of {network} bytes between {nodes} nodes; the communicator "
                f"of {group_name!r} has {comm.network_workspace_bytes}; make it with network_workspace_bytes >= "
                f"{network} (mkernel.matmul_reduce_scatter_network_bytes)"
            )
    if comm.device != A.device.index:
        raise ArgumentError(
            f"A: device {A.device}; expected the communicator's device cuda:{comm.device} "
            f"(rank {comm.rank} of {group_name!r})"
        )
    return comm


def _dlpack(t: torch.Tensor) -> Any:
    # stream=-1: no synchronisation by the producer (module notes); detach: DLPack refuses
    # tensors that require grad, and the op has no autograd formula anyway.
    return t.detach().__dlpack__(stream=-1)


def _fused_all_gather_matmul(
    A_shard: torch.Tensor,
    Bs: Sequence[torch.Tensor],
    gather_dim: int,
    group_name: str,
    *,
    return_A: bool = True,
    allow_copy_B: bool = False,
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    gd = _layout.check_all_gather_matmul(A_shard, Bs, gather_dim, return_A=return_A, allow_copy_B=allow_copy_B)
    world = _world_size(group_name)
    a = _layout.rows_of(A_shard, gd)
    if a.data_ptr() % 16 != 0:  # a view at an odd offset: the kernel's TMA needs 16-byte rows
        a = a.clone()
    comm = _communicator_for(group_name, A_shard, a.shape[0], world)
    w = _layout.weight_of(Bs[0])
    A_flat, outs, unflatten = _layout.outputs_of(A_shard, Bs, gd, world, return_A)
    with torch.cuda.device(A_shard.device):
        stream = torch.cuda.current_stream(A_shard.device).cuda_stream
        comm.native.all_gather_gemm(
            _dlpack(a), _dlpack(w), _dlpack(outs[0]), None if A_flat is None else _dlpack(A_flat), stream
        )
        if A_flat is not None:  # always so when there are Bs[1:] (outputs_of asks for it)
            for B, out in zip(Bs[1:], outs[1:]):
                torch.mm(A_flat, B, out=out)
    return (unflatten(A_flat) if return_A and A_flat is not None else None), [unflatten(o) for o in outs]


def _fused_all_gather_matmul_fake(
    A_shard: torch.Tensor,
    Bs: Sequence[torch.Tensor],
    gather_dim: int,
    group_name: str,
    *,
    return_A: bool = True,
    allow_copy_B: bool = False,
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    gd = _layout.check_all_gather_matmul(A_shard, Bs, gather_dim, return_A=return_A, allow_copy_B=allow_copy_B)
    A_flat, outs, unflatten = _layout.outputs_of(A_shard, Bs, gd, _world_size(group_name), return_A)
    return (unflatten(A_flat) if return_A and A_flat is not None else None), [unflatten(o) for o in outs]


def _checked_reduce_scatter(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: str, allow_copy_B: bool
) -> tuple[int, int]:
    """The arguments' checks both implementations share; returns (scatter_dim, world size)."""
    sd = _layout.check_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, allow_copy_B=allow_copy_B)
    world = _world_size(group_name)
    _layout.check_scatter_world(A, sd, world)
    return sd, world


def _fused_matmul_reduce_scatter(
    A: torch.Tensor,
    B: torch.Tensor,
    reduce_op: str,
    scatter_dim: int,
    group_name: str,
    *,
    allow_copy_B: bool = False,
) -> torch.Tensor:
    sd, world = _checked_reduce_scatter(A, B, reduce_op, scatter_dim, group_name, allow_copy_B)
    a = _layout.rows_of(A, sd)
    if a.data_ptr() % 16 != 0:  # a view at an odd offset: the kernel's TMA needs 16-byte rows
        a = a.clone()
    out, result = _layout.scatter_output_of(A, B, sd, world)
    comm = _communicator_for_reduce_scatter(group_name, A, out.shape[0], out.shape[1], world)
    w = _layout.weight_of(B)
    with torch.cuda.device(A.device):
        stream = torch.cuda.current_stream(A.device).cuda_stream
        comm.native.gemm_reduce_scatter(_dlpack(a), _dlpack(w), _dlpack(out), stream)
    return result(out)


def _fused_matmul_reduce_scatter_fake(
    A: torch.Tensor,
    B: torch.Tensor,
    reduce_op: str,
    scatter_dim: int,
    group_name: str,
    *,
    allow_copy_B: bool = False,
) -> torch.Tensor:
    sd, world = _checked_reduce_scatter(A, B, reduce_op, scatter_dim, group_name, allow_copy_B)
    out, result = _layout.scatter_output_of(A, B, sd, world)
    return result(out)


_lib = torch.library.Library(_NAMESPACE, "DEF")
_lib.define(_SCHEMA, tags=_stride_tag())
_lib.impl(_layout.OP_NAME, _fused_all_gather_matmul, "CUDA")
# CPU tensors reach the same function, so they are refused with its message (naming A_shard's
# device) rather than the dispatcher's "no kernel for CPU".
_lib.impl(_layout.OP_NAME, _fused_all_gather_matmul, "CPU")
torch.library.register_fake(f"{_NAMESPACE}::{_layout.OP_NAME}", _fused_all_gather_matmul_fake, lib=_lib)
_lib.define(_RS_SCHEMA, tags=_stride_tag())
_lib.impl(_layout.RS_OP_NAME, _fused_matmul_reduce_scatter, "CUDA")
_lib.impl(_layout.RS_OP_NAME, _fused_matmul_reduce_scatter, "CPU")
torch.library.register_fake(f"{_NAMESPACE}::{_layout.RS_OP_NAME}", _fused_matmul_reduce_scatter_fake, lib=_lib)


def fused_all_gather_matmul(
    A_shard: torch.Tensor,
    Bs: Sequence[torch.Tensor],
    gather_dim: int,
    group_name: Any,
    *,
    return_A: bool = True,
    allow_copy_B: bool = False,
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """``AllGather(A_shard, gather_dim) @ B`` for each B, and the gathered A when ``return_A``.

    The same call as ``torch.ops.symm_mem.fused_all_gather_matmul`` (``group_name`` may also be
    the process group itself). Runs ``torch.ops.mkernel.fused_all_gather_matmul``; see this
    module's documentation for streams, communicators, plans, errors and layouts.
    """
    if not isinstance(group_name, str) and hasattr(group_name, "group_name"):
        group_name = group_name.group_name
    if not isinstance(Bs, (list, tuple)):
        raise ArgumentError(f"Bs: {type(Bs).__name__}; expected a list of [K, N] tensors")
    A, outs = torch.ops.mkernel.fused_all_gather_matmul(
        A_shard, list(Bs), gather_dim, group_name, return_A=return_A, allow_copy_B=allow_copy_B
    )
    return A, list(outs)


def fused_matmul_reduce_scatter(
    A: torch.Tensor,
    B: torch.Tensor,
    reduce_op: str,
    scatter_dim: int,
    group_name: Any,
    *,
    allow_copy_B: bool = False,
) -> torch.Tensor:
    """``reduce_scatter_tensor(A @ B, reduce_op, scatter_dim)`` over the group, fused.

    The same call as ``torch.ops.symm_mem.fused_matmul_reduce_scatter`` (``group_name`` may also
    be the process group itself; ``reduce_op`` is "sum"). Runs
    ``torch.ops.mkernel.fused_matmul_reduce_scatter``; see this module's documentation for
    streams, communicators, plans, errors and layouts.
    """
    if not isinstance(group_name, str) and hasattr(group_name, "group_name"):
        group_name = group_name.group_name
    return torch.ops.mkernel.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name, allow_copy_B=allow_copy_B)
