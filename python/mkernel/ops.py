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

``fused_matmul_all_reduce(A, B, reduce_op, group_name, *, allow_copy_B=False) -> Tensor``
    ``all_reduce(A @ B, reduce_op)`` over the group, by mkernel's GEMM+AllReduce (the same kernel
    as GEMM+ReduceScatter, each finished band then passed to every rank: every rank gets the same
    bits). torch.ops.symm_mem has no such op: the reference is ``dist.all_reduce(A @ B)``. A any
    rank >= 2 (M, the product of its leading dimensions, any positive number); ``reduce_op``
    "sum"; B as above.

``moe_dispatch(x, topk_ids, topk_weights, num_experts, group_name, *, out_hidden=None,
recv_tokens_per_source=None, expert_rows_capacity=None, apply_scores=True)
-> (x_expert, expert_offsets, row_source, row_token, row_score)``
    Expert parallelism: sends each token to the ranks hosting its experts; x_expert gets this
    rank's experts' rows, expert by expert (mkernel._moe for the shapes).

``moe_combine(y_expert, group_name, *, num_tokens) -> out``
    The expert outputs in the rows of the last moe_dispatch on the communicator, back to their
    tokens: out [num_tokens, out_hidden] = per token the score-weighted sum over its choices.

``moe_forward(x, topk_ids, topk_weights, w, group_name, *, recv_tokens_per_source=None,
expert_rows_capacity=None, apply_scores=True) -> out``
    Dispatch, one GEMM per local expert (w [experts_per_rank, out_hidden, hidden]) and combine in
    one kernel.

``moe_mlp(x, topk_ids, topk_weights, w1, w2, group_name, *, activation="swiglu",
recv_tokens_per_source=None, expert_rows_capacity=None, apply_scores=True) -> out``
    The whole expert layer: dispatch, each expert's w1 (gate and up), the activation, its w2,
    combine; out [num_tokens, hidden] (libmkernel's MoeMlp, five launches).

``ring_attention(q, k, v, group_name, *, causal=False, layout="bhsd", placement="zigzag",
scale=None) -> (out, lse)``
    Attention of this rank's queries over every rank's keys and values (sequence parallelism),
    one persistent kernel passing K/V around the ring (mkernel._ring for layouts and placement).

How a call runs (the CUDA implementation):

* Streams: the kernel is enqueued on the caller's current CUDA stream of the tensors' device,
  passed to the compiled module as an integer; outputs are allocated by torch on that stream.
  Nothing synchronises the host. Tensors are exported with ``__dlpack__(stream=-1)``: the
  consumer runs on the producer's own stream, so DLPack's cross-stream synchronisation (an event
  on the legacy default stream, which would break a CUDA graph capture) is neither needed nor done.
* The communicator is the one registered under ``group_name`` (mkernel.Communicator); where
  there is none, one is made from the process group of that name, sized for this call.
* Plans are made on a shape's first call (collectively: every rank must make the same call) and
  kept by the communicator. A moe_combine runs on the plan of the last moe_dispatch on the
  communicator (note on moe_combine below). CUDA graph capture needs the shape planned before the capture (a
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

from . import _layout, _moe, _ring
from ._errors import ArgumentError, MkernelError
from .communicator import (
    Communicator,
    all_gather_matmul_workspace_bytes,
    default_fused_flags,
    get_communicator,
    matmul_all_reduce_fused_flags,
    matmul_all_reduce_network_bytes,
    matmul_all_reduce_workspace_bytes,
    matmul_reduce_scatter_fused_flags,
    matmul_reduce_scatter_network_bytes,
    matmul_reduce_scatter_workspace_bytes,
    moe_fused_flags,
    moe_network_bytes,
    moe_workspace_bytes,
    ring_attention_fused_flags,
    ring_attention_network_bytes,
    ring_attention_workspace_bytes,
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
_AR_SCHEMA = (
    "fused_matmul_all_reduce(Tensor A, Tensor B, str reduce_op, str group_name, *, bool allow_copy_B=False) -> Tensor"
)

_MOE_DISPATCH_SCHEMA = (
    "moe_dispatch(Tensor x, Tensor topk_ids, Tensor topk_weights, int num_experts, str group_name, *, "
    "int? out_hidden=None, int? recv_tokens_per_source=None, int? expert_rows_capacity=None, "
    "bool apply_scores=True) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)
_MOE_COMBINE_SCHEMA = "moe_combine(Tensor y_expert, str group_name, *, int num_tokens) -> Tensor"
_MOE_FORWARD_SCHEMA = (
    "moe_forward(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w, str group_name, *, "
    "int? recv_tokens_per_source=None, int? expert_rows_capacity=None, bool apply_scores=True) -> Tensor"
)
_MOE_MLP_SCHEMA = (
    "moe_mlp(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w1, Tensor w2, str group_name, *, "
    "str activation=\"swiglu\", int? recv_tokens_per_source=None, int? expert_rows_capacity=None, "
    "bool apply_scores=True) -> Tensor"
)
_RING_SCHEMA = (
    "ring_attention(Tensor q, Tensor k, Tensor v, str group_name, *, bool causal=False, str layout=\"bhsd\", "
    "str placement=\"zigzag\", float? scale=None) -> (Tensor, Tensor)"
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


def _check_sized(
    comm: Communicator, group_name: str, arg: str, what: str, workspace: int, network: int, flags: int,
    sizes_fn: str, flags_fn: str,
) -> None:
    """A communicator's workspace, network workspace and fused-op flags hold what a call needs,
    else ArgumentError saying what to make it with."""
    if workspace > comm.workspace_bytes:
        raise ArgumentError(
            f"{arg}: this call needs an NVLink workspace of {workspace} bytes ({what}); the communicator of "
            f"{group_name!r} has {comm.workspace_bytes}; make it with workspace_bytes >= {workspace} "
            f"(mkernel.{sizes_fn}_workspace_bytes)"
        )
    if network > comm.network_workspace_bytes:
        raise ArgumentError(
            f"{arg}: this call needs a network workspace of {network} bytes between {comm.nodes} nodes; the "
            f"communicator of {group_name!r} has {comm.network_workspace_bytes}; make it with "
            f"network_workspace_bytes >= {network} (mkernel.{sizes_fn}_network_bytes)"
        )
    if flags > comm.fused_flags:
        raise ArgumentError(
            f"{arg}: this call needs {flags} fused-op flags; the communicator of {group_name!r} has "
            f"{comm.fused_flags}; make it with fused_flags >= {flags} (mkernel.{flags_fn}_fused_flags)"
        )


def _check_comm_device(comm: Communicator, group_name: str, arg: str, t: torch.Tensor) -> None:
    if comm.device != t.device.index:
        raise ArgumentError(
            f"{arg}: device {t.device}; expected the communicator's device cuda:{comm.device} "
            f"(rank {comm.rank} of {group_name!r})"
        )


def _communicator_for_all_reduce(group_name: str, A: torch.Tensor, m: int, n: int, world: int) -> Communicator:
    def sizes(w: int, nodes: int) -> tuple[int, int, int]:
        return (
            matmul_all_reduce_workspace_bytes(w, m, n, nodes),
            matmul_all_reduce_network_bytes(nodes, m, n),
            matmul_all_reduce_fused_flags(w, m, n, nodes),
        )

    comm = get_communicator(group_name)
    if comm is None:
        nodes = _nodes_of(world)
        workspace, network, flags = sizes(world, nodes)
        comm = _make_communicator(group_name, A.device, workspace_bytes=max(1, workspace),
                                  network_workspace_bytes=network, fused_flags=max(default_fused_flags(), flags))
    workspace, network, flags = sizes(comm.size, max(1, comm.nodes))
    _check_sized(comm, group_name, "A", f"the partial tiles of the [{m}, {n}] sum its node peers stage with it and "
                 "the finished tiles passed on to it", workspace, network, flags, "matmul_all_reduce",
                 "matmul_all_reduce")
    _check_comm_device(comm, group_name, "A", A)
    return comm


def _communicator_for_moe(group_name: str, x: torch.Tensor, plan: Any, world: int) -> Communicator:
    def sizes(w: int, nodes: int) -> tuple[int, int, int]:
        common = dict(out_hidden=plan.out_hidden, nodes=nodes, recv_tokens_per_source=plan.recv or None,
                      expert_rows_capacity=plan.rows_cap or None)
        return (
            moe_workspace_bytes(w, plan.tokens, plan.hidden, plan.experts, plan.top_k, **common),
            moe_network_bytes(w, plan.tokens, plan.hidden, plan.experts, plan.top_k, **common) if nodes > 1 else 0,
            moe_fused_flags(w, plan.tokens, plan.experts, plan.top_k, nodes=nodes,
                            recv_tokens_per_source=plan.recv or None, expert_rows_capacity=plan.rows_cap or None),
        )

    comm = get_communicator(group_name)
    if comm is None:
        nodes = _nodes_of(world)
        workspace, network, flags = sizes(world, nodes)
        comm = _make_communicator(group_name, x.device, workspace_bytes=max(1, workspace),
                                  network_workspace_bytes=network, fused_flags=max(default_fused_flags(), flags))
    workspace, network, flags = sizes(comm.size, max(1, comm.nodes))
    _check_sized(comm, group_name, "x", f"{plan.tokens} tokens of {plan.hidden} from each rank and their partial "
                 f"rows of {plan.out_hidden}", workspace, network, flags, "moe", "moe")
    _check_comm_device(comm, group_name, "x", x)
    return comm


def _communicator_for_ring(group_name: str, q: torch.Tensor, call: Any, world: int) -> Communicator:
    def sizes(w: int, nodes: int) -> tuple[int, int, int]:
        return (
            ring_attention_workspace_bytes(w, call.batch, call.heads_q, call.heads_kv, call.s_local, call.head_dim,
                                           nodes=nodes),
            ring_attention_network_bytes(nodes, call.batch, call.heads_kv, call.s_local, call.head_dim)
            if nodes > 1 else 0,
            ring_attention_fused_flags(w, nodes),
        )

    comm = get_communicator(group_name)
    if comm is None:
        nodes = _nodes_of(world)
        workspace, network, flags = sizes(world, nodes)
        comm = _make_communicator(group_name, q.device, workspace_bytes=max(1, workspace),
                                  network_workspace_bytes=network, fused_flags=max(default_fused_flags(), flags))
    workspace, network, flags = sizes(comm.size, max(1, comm.nodes))
    _check_sized(comm, group_name, "k", "the K/V chunks a rank holds at once", workspace, network, flags,
                 "ring_attention", "ring_attention")
    _check_comm_device(comm, group_name, "q", q)
    return comm


def _packed(t: torch.Tensor) -> torch.Tensor:
    """t packed and 16-byte aligned, as the kernels read it: itself when it is, else a copy."""
    return _ring.packed(t)


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


# ---- fused_matmul_all_reduce --------------------------------------------------------------------


def _checked_all_reduce(A: torch.Tensor, B: torch.Tensor, reduce_op: str, group_name: str, allow_copy_B: bool) -> int:
    """The arguments' checks both implementations share; returns the group's size."""
    _layout.check_matmul_all_reduce(A, B, reduce_op, allow_copy_B=allow_copy_B)
    return _world_size(group_name)


def _fused_matmul_all_reduce(
    A: torch.Tensor,
    B: torch.Tensor,
    reduce_op: str,
    group_name: str,
    *,
    allow_copy_B: bool = False,
) -> torch.Tensor:
    world = _checked_all_reduce(A, B, reduce_op, group_name, allow_copy_B)
    # The communicator first: one too small is refused before anything is copied or allocated.
    comm = _communicator_for_all_reduce(group_name, A, A.numel() // A.shape[-1], B.shape[1], world)
    a = _layout.rows_of(A, 0)
    if a.data_ptr() % 16 != 0:  # a view at an odd offset: the kernel's TMA needs 16-byte rows
        a = a.clone()
    out, result = _layout.all_reduce_output_of(A, B)
    w = _layout.weight_of(B)
    with torch.cuda.device(A.device):
        stream = torch.cuda.current_stream(A.device).cuda_stream
        comm.native.gemm_all_reduce(_dlpack(a), _dlpack(w), _dlpack(out), stream)
    return result(out)


def _fused_matmul_all_reduce_fake(
    A: torch.Tensor,
    B: torch.Tensor,
    reduce_op: str,
    group_name: str,
    *,
    allow_copy_B: bool = False,
) -> torch.Tensor:
    _checked_all_reduce(A, B, reduce_op, group_name, allow_copy_B)
    out, result = _layout.all_reduce_output_of(A, B)
    return result(out)


# ---- MoE ----------------------------------------------------------------------------------------


def _routing_of(topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's int32 choices (an int64 topk_ids converted on the device) and fp32 scores, packed."""
    ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int32)
    return _packed(ids), _packed(topk_weights)


def _moe_dispatch(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    group_name: str,
    *,
    out_hidden: int | None = None,
    recv_tokens_per_source: int | None = None,
    expert_rows_capacity: int | None = None,
    apply_scores: bool = True,
) -> tuple[torch.Tensor, ...]:
    _moe.check_routing(x, topk_ids, topk_weights)  # the tensors first, as the fake implementation
    world = _world_size(group_name)
    plan = _moe.DispatchPlan(x, topk_ids, topk_weights, num_experts, world, out_hidden, recv_tokens_per_source,
                             expert_rows_capacity, apply_scores)
    comm = _communicator_for_moe(group_name, x, plan, world)
    outs = plan.outputs(x)
    with torch.cuda.device(x.device):
        stream = torch.cuda.current_stream(x.device).cuda_stream
        ids, weights = _routing_of(topk_ids, topk_weights)
        comm.native.moe_dispatch(
            _dlpack(_packed(x)), _dlpack(ids), _dlpack(weights), *(_dlpack(t) for t in outs), stream,
            experts=plan.experts, out_hidden=plan.out_hidden, recv_tokens_per_source=plan.recv,
            expert_rows_capacity=plan.rows_cap, apply_scores=plan.apply_scores,
        )
    return outs


def _moe_dispatch_fake(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    group_name: str,
    *,
    out_hidden: int | None = None,
    recv_tokens_per_source: int | None = None,
    expert_rows_capacity: int | None = None,
    apply_scores: bool = True,
) -> tuple[torch.Tensor, ...]:
    _moe.check_routing(x, topk_ids, topk_weights)
    plan = _moe.DispatchPlan(x, topk_ids, topk_weights, num_experts, _world_size(group_name), out_hidden,
                             recv_tokens_per_source, expert_rows_capacity, apply_scores)
    return plan.outputs(x)


def _moe_combine(y_expert: torch.Tensor, group_name: str, *, num_tokens: int) -> torch.Tensor:
    _moe.check_combine(y_expert, num_tokens)
    _world_size(group_name)
    comm = get_communicator(group_name)
    if comm is None:
        raise MkernelError(
            f"moe_combine: no mkernel.Communicator for {group_name!r}; expected moe_dispatch on that group first "
            "(moe_combine returns the expert outputs of its rows)",
            "failed precondition",
        )
    _check_comm_device(comm, group_name, "y_expert", y_expert)
    out = _moe.combine_output(y_expert, num_tokens)
    with torch.cuda.device(y_expert.device):
        stream = torch.cuda.current_stream(y_expert.device).cuda_stream
        comm.native.moe_combine(_dlpack(_packed(y_expert)), _dlpack(out), stream)
    return out


def _moe_combine_fake(y_expert: torch.Tensor, group_name: str, *, num_tokens: int) -> torch.Tensor:
    _moe.check_combine(y_expert, num_tokens)
    _world_size(group_name)
    return _moe.combine_output(y_expert, num_tokens)


def _moe_forward(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w: torch.Tensor,
    group_name: str,
    *,
    recv_tokens_per_source: int | None = None,
    expert_rows_capacity: int | None = None,
    apply_scores: bool = True,
) -> torch.Tensor:
    _moe.check_routing(x, topk_ids, topk_weights)
    world = _world_size(group_name)
    plan = _moe.ForwardPlan(x, topk_ids, topk_weights, w, world, recv_tokens_per_source, expert_rows_capacity,
                            apply_scores)
    comm = _communicator_for_moe(group_name, x, plan, world)
    out = plan.output(x)
    with torch.cuda.device(x.device):
        stream = torch.cuda.current_stream(x.device).cuda_stream
        ids, weights = _routing_of(topk_ids, topk_weights)
        comm.native.moe_forward(
            _dlpack(_packed(x)), _dlpack(ids), _dlpack(weights), _dlpack(_packed(w)), _dlpack(out), stream,
            recv_tokens_per_source=plan.recv, expert_rows_capacity=plan.rows_cap, apply_scores=plan.apply_scores,
        )
    return out


def _moe_forward_fake(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w: torch.Tensor,
    group_name: str,
    *,
    recv_tokens_per_source: int | None = None,
    expert_rows_capacity: int | None = None,
    apply_scores: bool = True,
) -> torch.Tensor:
    _moe.check_routing(x, topk_ids, topk_weights)
    plan = _moe.ForwardPlan(x, topk_ids, topk_weights, w, _world_size(group_name), recv_tokens_per_source,
                            expert_rows_capacity, apply_scores)
    return plan.output(x)


def _moe_mlp(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    group_name: str,
    *,
    activation: str = "swiglu",
    recv_tokens_per_source: int | None = None,
    expert_rows_capacity: int | None = None,
    apply_scores: bool = True,
) -> torch.Tensor:
    _moe.check_routing(x, topk_ids, topk_weights)
    world = _world_size(group_name)
    plan = _moe.MlpPlan(x, topk_ids, topk_weights, w1, w2, world, activation, recv_tokens_per_source,
                        expert_rows_capacity, apply_scores)
    comm = _communicator_for_moe(group_name, x, plan, world)
    out = plan.output(x)
    with torch.cuda.device(x.device):
        stream = torch.cuda.current_stream(x.device).cuda_stream
        ids, weights = _routing_of(topk_ids, topk_weights)
        comm.native.moe_mlp(
            _dlpack(_packed(x)), _dlpack(ids), _dlpack(weights), _dlpack(w1), _dlpack(w2), _dlpack(out), stream,
            activation=plan.activation, recv_tokens_per_source=plan.recv, expert_rows_capacity=plan.rows_cap,
            apply_scores=plan.apply_scores,
        )
    return out


def _moe_mlp_fake(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    group_name: str,
    *,
    activation: str = "swiglu",
    recv_tokens_per_source: int | None = None,
    expert_rows_capacity: int | None = None,
    apply_scores: bool = True,
) -> torch.Tensor:
    _moe.check_routing(x, topk_ids, topk_weights)
    plan = _moe.MlpPlan(x, topk_ids, topk_weights, w1, w2, _world_size(group_name), activation,
                        recv_tokens_per_source, expert_rows_capacity, apply_scores)
    return plan.output(x)


# ---- ring attention -----------------------------------------------------------------------------


def _ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group_name: str,
    *,
    causal: bool = False,
    layout: str = "bhsd",
    placement: str = "zigzag",
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    call = _ring.RingCall(q, k, v, causal=causal, layout=layout, placement=placement, scale=scale)
    world = _world_size(group_name)
    comm = _communicator_for_ring(group_name, q, call, world)
    out, lse = call.outputs(q)
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        comm.native.ring_attention(
            _dlpack(_packed(q)), _dlpack(_packed(k)), _dlpack(_packed(v)), _dlpack(out), _dlpack(lse), stream,
            layout=call.layout, placement=call.placement, scale=call.scale,
        )
    return out, lse


def _ring_attention_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group_name: str,
    *,
    causal: bool = False,
    layout: str = "bhsd",
    placement: str = "zigzag",
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    call = _ring.RingCall(q, k, v, causal=causal, layout=layout, placement=placement, scale=scale)
    _world_size(group_name)
    return call.outputs(q)


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
_lib.define(_AR_SCHEMA, tags=_stride_tag())
_lib.impl(_layout.AR_OP_NAME, _fused_matmul_all_reduce, "CUDA")
_lib.impl(_layout.AR_OP_NAME, _fused_matmul_all_reduce, "CPU")
torch.library.register_fake(f"{_NAMESPACE}::{_layout.AR_OP_NAME}", _fused_matmul_all_reduce_fake, lib=_lib)
for _schema, _name, _real, _fake in (
    (_MOE_DISPATCH_SCHEMA, _moe.DISPATCH, _moe_dispatch, _moe_dispatch_fake),
    (_MOE_COMBINE_SCHEMA, _moe.COMBINE, _moe_combine, _moe_combine_fake),
    (_MOE_FORWARD_SCHEMA, _moe.FORWARD, _moe_forward, _moe_forward_fake),
    (_MOE_MLP_SCHEMA, _moe.MLP, _moe_mlp, _moe_mlp_fake),
    (_RING_SCHEMA, _ring.OP_NAME, _ring_attention, _ring_attention_fake),
):
    _lib.define(_schema, tags=_stride_tag())
    _lib.impl(_name, _real, "CUDA")
    _lib.impl(_name, _real, "CPU")  # refused with the op's own message, naming the device
    torch.library.register_fake(f"{_NAMESPACE}::{_name}", _fake, lib=_lib)


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


def fused_matmul_all_reduce(
    A: torch.Tensor,
    B: torch.Tensor,
    reduce_op: str,
    group_name: Any,
    *,
    allow_copy_B: bool = False,
) -> torch.Tensor:
    """``all_reduce(A @ B, reduce_op)`` over the group, fused: the row-parallel linear layer of
    tensor parallelism when every rank needs the whole output.

    ``A`` [..., K] (K this rank's share of the reduction dimension; any leading dimensions, M
    their product any positive number) and ``B`` [K, N] (this rank's weight shard,
    ``weight.t()`` of an nn.Linear weight [N, K]), bf16; ``reduce_op`` is "sum". Returns
    ``A.shape[:-1] + (N,)``, contiguous, bf16: the same bits on every rank and from call to call
    (mkernel sums in fp32 in a fixed order and rounds once). torch.ops.symm_mem has no fused
    op for this; the reference is ``dist.all_reduce(A @ B)``, which agrees within bf16 rounding
    (torch rounds each rank's product to bf16 before the sum). ``group_name`` may also be the
    process group itself. Runs ``torch.ops.mkernel.fused_matmul_all_reduce``; see this module's
    documentation for streams, communicators, plans, errors and layouts.
    """
    return torch.ops.mkernel.fused_matmul_all_reduce(A, B, reduce_op, _name_of(group_name), allow_copy_B=allow_copy_B)


def _name_of(group_name: Any) -> Any:
    if not isinstance(group_name, str) and hasattr(group_name, "group_name"):
        return group_name.group_name
    return group_name


def moe_dispatch(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    group_name: Any,
    *,
    out_hidden: int | None = None,
    recv_tokens_per_source: int | None = None,
    expert_rows_capacity: int | None = None,
    apply_scores: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sends every token to the ranks hosting its experts (expert parallelism over the group).

    ``x`` [num_tokens, hidden] bf16, ``topk_ids`` [num_tokens, top_k] int32 or int64 (an expert in
    [0, num_experts) or -1: no choice; int64 is converted to int32 on the device), ``topk_weights``
    [num_tokens, top_k] float32. Rank d hosts experts [d E / world, (d + 1) E / world).

    Returns ``(x_expert, expert_offsets, row_source, row_token, row_score)``: x_expert [rows, hidden]
    holds this rank's experts' rows, expert by expert (local expert e's rows are
    ``[expert_offsets[e], expert_offsets[e + 1])``, int32 [experts_per_rank + 1], on the device:
    no host synchronisation); within an expert, by source rank (this rank first) and token. Per
    row, row_source / row_token (int32) name the token's home rank and index there and row_score
    (float32) its router score. ``rows`` is the plan's capacity (by default the worst case, world x
    num_tokens x min(top_k, experts per rank); smaller with ``recv_tokens_per_source`` (tokens one
    rank may send one rank) or ``expert_rows_capacity``): rows from ``expert_offsets[-1]`` on are
    unused. Routing beyond a capacity given ends the launch on every rank, named by the next call.

    Run the experts on x_expert (e.g. a grouped GEMM over the offsets), then :func:`moe_combine`
    with their outputs [rows, out_hidden] (``out_hidden``, default hidden, is fixed here: the plan
    sizes the partial rows). ``apply_scores=False``: combine sums the outputs without the scores.
    Runs ``torch.ops.mkernel.moe_dispatch``; ``group_name`` may also be the process group.
    """
    return tuple(torch.ops.mkernel.moe_dispatch(  # type: ignore[return-value]
        x, topk_ids, topk_weights, num_experts, _name_of(group_name), out_hidden=out_hidden,
        recv_tokens_per_source=recv_tokens_per_source, expert_rows_capacity=expert_rows_capacity,
        apply_scores=apply_scores,
    ))


def moe_combine(y_expert: torch.Tensor, group_name: Any, *, num_tokens: int) -> torch.Tensor:
    """Returns the experts' outputs to their tokens: out [num_tokens, out_hidden] bf16, for each
    token the sum over its choices of score x the expert's output row (fp32 sums in a fixed
    order: the same bits from run to run; a token with no choice gets a zero row).

    Pairs with the **last moe_dispatch on the group's communicator**: ``y_expert`` [rows,
    out_hidden] bf16 holds the expert outputs in that dispatch's rows, and ``num_tokens`` is its
    x.shape[0]. Refused, before anything is launched, when no dispatch waits for its combine
    (none ran, or its combine already did: mkernel.MkernelError, "failed precondition"), or when
    y_expert or num_tokens do not match that dispatch (mkernel.ArgumentError naming them);
    refused by libmkernel when another op of the communicator was launched between the dispatch
    and the combine (the combine reads the dispatch's routing records). Runs
    ``torch.ops.mkernel.moe_combine``.
    """
    return torch.ops.mkernel.moe_combine(y_expert, _name_of(group_name), num_tokens=num_tokens)


def moe_forward(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w: torch.Tensor,
    group_name: Any,
    *,
    recv_tokens_per_source: int | None = None,
    expert_rows_capacity: int | None = None,
    apply_scores: bool = True,
) -> torch.Tensor:
    """Dispatch, one linear layer per expert and combine in one kernel (mkernel's fused MoE):
    out [num_tokens, out_hidden] = for each token the sum over its choices of score x
    (x_token @ w[e].T), with w [experts_per_rank, out_hidden, hidden] bf16 this rank's experts'
    nn.Linear weights (packed; num_experts = experts_per_rank x world). Expert outputs are rounded
    to bf16 before they are weighted, as :func:`moe_combine` does. Arguments as for
    :func:`moe_dispatch`. Runs ``torch.ops.mkernel.moe_forward``.

    Measured on one GPU (docs/kernels.md section 14), where it has nothing to overlap, this fused
    kernel is correct and about as fast as :func:`moe_dispatch`, a grouped GEMM and
    :func:`moe_combine`, not faster; prefer those three until two GPUs have measured it.
    """
    return torch.ops.mkernel.moe_forward(
        x, topk_ids, topk_weights, w, _name_of(group_name), recv_tokens_per_source=recv_tokens_per_source,
        expert_rows_capacity=expert_rows_capacity, apply_scores=apply_scores,
    )


def moe_mlp(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    group_name: Any,
    *,
    activation: str = "swiglu",
    recv_tokens_per_source: int | None = None,
    expert_rows_capacity: int | None = None,
    apply_scores: bool = True,
) -> torch.Tensor:
    """An expert-parallel MoE MLP layer (mkernel's MoeMlp): dispatch, each expert's first linear
    layer, the activation, its second, combine. out [num_tokens, hidden] = for each token the sum
    over its choices (e, s) of s x (act(x_token @ w1[e].T) @ w2[e].T).

    w1 [experts_per_rank, w1_rows, hidden] and w2 [experts_per_rank, hidden, inter], bf16, packed:
    this rank's experts' nn.Linear weights (num_experts = experts_per_rank x world). ``activation``:
    "swiglu" (silu(gate) x up) or "geglu" (gelu(gate) x up), with w1's rows the gate's [0, inter)
    then the up projection's [inter, 2 inter); or "silu", "gelu" (erf form), "relu" with w1_rows =
    inter. Each linear layer's output and the activation are rounded to bf16 once; the combine's
    sums are fp32 in a fixed order (bit-identical from run to run). Other arguments as for
    :func:`moe_dispatch`. A CUDA graph capture needs the shape planned first: run the call once
    before capturing. Runs ``torch.ops.mkernel.moe_mlp``.
    """
    return torch.ops.mkernel.moe_mlp(
        x, topk_ids, topk_weights, w1, w2, _name_of(group_name), activation=activation,
        recv_tokens_per_source=recv_tokens_per_source, expert_rows_capacity=expert_rows_capacity,
        apply_scores=apply_scores,
    )


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group_name: Any,
    *,
    causal: bool = False,
    layout: str = "bhsd",
    placement: str = "zigzag",
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over a sequence split across the group (sequence parallelism): this rank's
    queries over every rank's keys and values, by one persistent kernel that passes K and V around
    the ring while it computes.

    ``q`` [B, Hq, S, D], ``k``, ``v`` [B, Hkv, S, D] (``layout="bhsd"``, SDPA's) or [B, S, H, D]
    (``layout="bshd"``), bf16, D 64 or 128, Hq a multiple of Hkv (grouped-query attention): this
    rank's S positions. ``causal`` masks later keys; ``placement`` says which positions a rank
    holds: "zigzag" (chunks r and 2 world - 1 - r of 2 world; see :func:`zigzag_reorder`) or
    "contiguous" (positions [r S, (r + 1) S)); without ``causal`` both are the same. ``scale``
    defaults to 1 / sqrt(D). Returns ``(out, lse)``: out in q's shape and layout, bf16; lse
    [B, Hq, S] float32, the natural-log log-sum-exp of each query's scores (for a backward pass
    or to merge with other attention). Runs ``torch.ops.mkernel.ring_attention``.
    """
    out, lse = torch.ops.mkernel.ring_attention(
        q, k, v, _name_of(group_name), causal=causal, layout=layout, placement=placement, scale=scale
    )
    return out, lse
