"""A tensor-parallel column-linear layer with mkernel's fused AllGather+GEMM (docs/python.md).

Every rank holds m_local rows of the activation x and N/world rows of the weight (nn.Linear
layout); the layer's output is AllGather(x) @ weight_shard.t(). The same call as
torch.ops.symm_mem.fused_all_gather_matmul, checked against it (and against all-gather then
matmul), then captured in a CUDA graph and replayed.

Needs mkerneld running on the node (MKERNEL_SOCKET names its socket if it is not the default):

    torchrun --nproc_per_node=2 python/examples/all_gather_matmul.py [m_local N K]
"""

import os
import sys

import torch
import torch.distributed as dist

import mkernel

m_local, N, K = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (2048, 4096, 4096)
local_rank = int(os.environ.get("LOCAL_RANK", 0))
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
group = dist.group.WORLD
rank, world = group.rank(), group.size()

# One communicator per group, sized for the largest activation it will gather.
comm = mkernel.Communicator.from_process_group(
    group, workspace_bytes=mkernel.all_gather_matmul_workspace_bytes(world, m_local, K))

torch.manual_seed(rank)
x = torch.randn(m_local, K, device="cuda", dtype=torch.bfloat16)
layer = torch.nn.Linear(K, N // world, bias=False, device="cuda", dtype=torch.bfloat16)

with torch.no_grad():
    # weight.t() is [K, N/world] with strides (1, K): the kernel reads the weight as it is.
    gathered, [y] = torch.ops.mkernel.fused_all_gather_matmul(x, [layer.weight.t()], 0, group.group_name)

    reference = torch.empty(world * m_local, K, device="cuda", dtype=torch.bfloat16)
    dist.all_gather_into_tensor(reference, x)
    assert torch.equal(gathered, reference), "the gathered activation differs"
    expected = (reference.float() @ layer.weight.t().float())
    err = (y.float() - expected).abs().max().item() / expected.abs().max().item()
    print(f"rank {rank}: y {tuple(y.shape)}, max |y - all_gather(x) @ W^T| / max |y| = {err:.2g}")
    assert err < 1e-2, "more than bf16 rounding apart"

    try:  # PyTorch's own fused op on the same inputs, where this PyTorch has it
        import torch.distributed._symmetric_memory  # noqa: F401

        _, [y_torch] = torch.ops.symm_mem.fused_all_gather_matmul(x, [layer.weight.t()], 0, group.group_name)
        print(f"rank {rank}: max |y - symm_mem's| = {(y.float() - y_torch.float()).abs().max().item():.3g}")
    except (AttributeError, RuntimeError) as e:
        print(f"rank {rank}: torch.ops.symm_mem.fused_all_gather_matmul not compared: {e}")

    # CUDA graph: the shape is planned (the call above was the warm-up), so it captures.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, [y_graph] = torch.ops.mkernel.fused_all_gather_matmul(x, [layer.weight.t()], 0, group.group_name)
    x.copy_(torch.randn_like(x))
    graph.replay()
    dist.all_gather_into_tensor(reference, x)
    torch.cuda.synchronize()
    comm.check()  # a failure on the GPU (a peer gone, a wait past its bound) is raised here
    expected = (reference.float() @ layer.weight.t().float())
    err = (y_graph.float() - expected).abs().max().item() / expected.abs().max().item()
    print(f"rank {rank}: graph replay on new data, relative error {err:.2g}")
    assert err < 1e-2, "more than bf16 rounding apart"

comm.close()
dist.destroy_process_group()
