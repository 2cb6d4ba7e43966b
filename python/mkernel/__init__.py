"""mkernel: fused multi-GPU kernels for Hopper GPUs, from Python (docs/python.md).

    import mkernel, torch.distributed as dist
    comm = mkernel.Communicator.from_process_group(dist.group.WORLD, workspace_bytes=...)
    A, [C] = mkernel.fused_all_gather_matmul(A_shard, [weight.t()], 0, dist.group.WORLD.group_name)
    y = mkernel.fused_matmul_reduce_scatter(C, weight2.t(), "sum", 0, dist.group.WORLD.group_name)
    y = mkernel.fused_matmul_all_reduce(C, weight2.t(), "sum", dist.group.WORLD.group_name)  # the whole sum, every rank
    x_expert, offsets, *_ = mkernel.moe_dispatch(x, topk_ids, topk_weights, num_experts, group_name)
    out = mkernel.moe_combine(experts(x_expert, offsets), group_name, num_tokens=x.shape[0])
    out = mkernel.moe_forward(x, topk_ids, topk_weights, w, group_name)        # fused, one kernel
    out = mkernel.moe_mlp(x, topk_ids, topk_weights, w1, w2, group_name)       # the expert MLP, SwiGLU
    o, lse = mkernel.ring_attention(q, k, v, group_name, causal=True)

The ops are also ``torch.ops.mkernel.*`` (registered when torch is importable); the GEMM ones
have the same arguments and results as their ``torch.ops.symm_mem`` counterparts (which has no
GEMM+AllReduce: ``fused_matmul_all_reduce`` is ``dist.all_reduce(A @ B)``). The compiled module
(mkernel._C) does not link torch: tensors pass through DLPack and streams as integers.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from . import _native
from ._errors import ArgumentError, MkernelError, NotBuiltError
from .communicator import (
    Communicator,
    all_gather_matmul_network_bytes,
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

try:
    from ._build_info import version as __version__  # type: ignore[import-not-found]
except ImportError:  # the source tree, not a build
    __version__ = "0.1.0"

#: Why torch.ops.mkernel is not registered ("" when it is).
torch_unavailable_reason = ""
if importlib.util.find_spec("torch") is None:
    torch_unavailable_reason = "torch is not installed: mkernel's torch ops need PyTorch 2.4 or newer"
else:
    try:
        from ._ring import zigzag_permutation, zigzag_reorder
        from .ops import (
            fused_all_gather_matmul,
            fused_matmul_all_reduce,
            fused_matmul_reduce_scatter,
            moe_combine,
            moe_dispatch,
            moe_forward,
            moe_mlp,
            ring_attention,
        )
    except ImportError as e:  # a torch that does not import (or predates torch.library's API)
        torch_unavailable_reason = f"mkernel's torch ops are not registered: {e}"

if torch_unavailable_reason:

    def fused_all_gather_matmul(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
        """Needs torch (see torch_unavailable_reason)."""
        raise NotBuiltError(torch_unavailable_reason)

    def fused_matmul_reduce_scatter(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
        """Needs torch (see torch_unavailable_reason)."""
        raise NotBuiltError(torch_unavailable_reason)

    fused_matmul_all_reduce = fused_matmul_reduce_scatter  # type: ignore[misc]
    moe_dispatch = moe_combine = moe_forward = moe_mlp = ring_attention = fused_matmul_reduce_scatter  # type: ignore[misc]
    zigzag_permutation = zigzag_reorder = fused_matmul_reduce_scatter  # type: ignore[misc]


def native_available() -> bool:
    """Whether the compiled module loaded (see native_unavailable_reason otherwise)."""
    return _native.available()


#: Why the compiled module is not available ("" when it is).
native_unavailable_reason = _native.unavailable_reason

__all__ = [
    "ArgumentError",
    "Communicator",
    "MkernelError",
    "NotBuiltError",
    "all_gather_matmul_network_bytes",
    "all_gather_matmul_workspace_bytes",
    "default_fused_flags",
    "fused_all_gather_matmul",
    "fused_matmul_all_reduce",
    "fused_matmul_reduce_scatter",
    "get_communicator",
    "matmul_all_reduce_fused_flags",
    "matmul_all_reduce_network_bytes",
    "matmul_all_reduce_workspace_bytes",
    "matmul_reduce_scatter_fused_flags",
    "matmul_reduce_scatter_network_bytes",
    "matmul_reduce_scatter_workspace_bytes",
    "moe_combine",
    "moe_dispatch",
    "moe_forward",
    "moe_fused_flags",
    "moe_mlp",
    "moe_network_bytes",
    "moe_workspace_bytes",
    "native_available",
    "native_unavailable_reason",
    "ring_attention",
    "ring_attention_fused_flags",
    "ring_attention_network_bytes",
    "ring_attention_workspace_bytes",
    "torch_unavailable_reason",
    "zigzag_permutation",
    "zigzag_reorder",
]
