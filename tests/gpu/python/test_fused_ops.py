"""The Python package on two GPUs, one rank per GPU, under torchrun (started by run.sh, which
also starts the mkerneld both ranks use).

Every case compares mkernel's op with torch.ops.symm_mem's op of the same name on the same
inputs, with equal strides:

* fused_all_gather_matmul: the gathered A bit for bit, the products within bf16 rounding (both
  accumulate in fp32 and round once). The cases are those torch's own tests cover for the op
  (A_shard [8, 64, 32] gathered on dims 0 and 1 with three Bs, 2-D A with B row-major or
  transposed, return_A=False, capture in a CUDA graph) plus a larger shape, under eager mode,
  torch.compile and CUDA graph replay, both ways to bootstrap, and a communicator with the
  adaptive split (the same bits whatever split each call ran with).
* MoE dispatch/combine/forward and ring attention (cases moe_*, ring_*): moe_ring_cases.py,
  against torch references on the same inputs gathered from every rank.
* fused_matmul_reduce_scatter (cases rs_*): within bf16 rounding (torch rounds each rank's
  partial to bf16 before summing, mkernel sums in fp32 and rounds once), and mkernel's result
  the same bits when called again. torch's test cases (A [8, 64, 32] scattered on dims 0 and 1),
  a 2-D and a 4-D A, its native-kernel size with B row-major or transposed, a larger shape, under
  eager mode, torch.compile, CUDA graph replay and reduce-overhead; AllGather+GEMM feeding
  GEMM+ReduceScatter on one communicator (a tensor-parallel MLP); a communicator the op makes
  itself, for a shape of more tiles than libmkernel's default fused-op flags hold.
* fused_matmul_all_reduce (cases ar_*): torch.ops.symm_mem has no such op, so the reference is
  dist.all_reduce of torch's A @ B on the same inputs; within bf16 rounding (torch rounds each
  rank's product to bf16 and NCCL sums those, mkernel sums in fp32 and rounds once, as for the
  reduce-scatter), equal shape and strides, mkernel's result the same bits when called again and
  the same bits on every rank (gathered and compared). torch's test sizes, a 2-D, 3-D and 4-D A,
  M not a multiple of the group's size or of 128 (a single row too), its native-kernel size with
  B row-major or transposed, a larger shape, under eager mode, torch.compile and CUDA graph
  replay; a tensor-parallel MLP (column-parallel GEMM, then GEMM+AllReduce); a communicator the
  op makes itself; argument errors.

Both ranks run the cases in the same order (every op is collective). After each case the ranks
compare verdicts; at the first failure anywhere they stop, since a rank that refused a call
leaves its peer's kernel waiting (until its bound) and the communicator failed.
Prints one line per case and rank, and on rank 0 'N passed, M failed' last.
MKERNEL_PY_TEST_CASES=name,prefix,... runs only the cases whose names start with one of those.
MKERNEL_PY_TEST_KEEP_GOING=1 runs the rest after a failure too (a failed communicator may then
fail the cases after it; the first failure is the one to read).
"""

from __future__ import annotations

import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import mkernel

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL = int(os.environ.get("LOCAL_RANK", RANK))
torch.cuda.set_device(LOCAL)
DEV = torch.device("cuda", LOCAL)
dist.init_process_group("nccl", device_id=DEV)
GROUP = dist.group.WORLD
GNAME = GROUP.group_name

import torch.distributed._symmetric_memory as symm_mem  # noqa: E402

import moe_ring_cases  # noqa: E402  (beside this file: the MoE and ring attention cases)

try:  # older torch needs this once per group; newer enables it on demand (and warns)
    symm_mem.enable_symm_mem_for_group(GNAME)
except Exception:
    pass

BF16 = torch.bfloat16
# The largest calls below: AllGather+GEMM m_local 2048 x k 4096 (the 4096 x 1024 x 1024 case needs
# less); GEMM+ReduceScatter [2048, 2048] per rank; GEMM+AllReduce [4096, 2048] on every rank. The
# ops take turns with one workspace. The MoE and ring attention cases (moe_ring_cases.py) add
# their needs.
_MOE_RING_WORKSPACE, _MOE_RING_FLAGS = moe_ring_cases.workspace_needs(WORLD)
WORKSPACE = max(mkernel.all_gather_matmul_workspace_bytes(WORLD, 2048, 4096),
                mkernel.matmul_reduce_scatter_workspace_bytes(WORLD, 2048, 2048),
                mkernel.matmul_all_reduce_workspace_bytes(WORLD, 4096, 2048), _MOE_RING_WORKSPACE)
FUSED_FLAGS = max(mkernel.default_fused_flags(), mkernel.matmul_reduce_scatter_fused_flags(WORLD, 2048, 2048),
                  mkernel.matmul_all_reduce_fused_flags(WORLD, 4096, 2048), _MOE_RING_FLAGS)
COMM = mkernel.Communicator.from_process_group(GROUP, workspace_bytes=WORKSPACE, fused_flags=FUSED_FLAGS)


def log(msg: str) -> None:
    print(f"rank {RANK}: {msg}", flush=True)


def rand(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed * 1000 + RANK)
    return torch.rand(*shape, generator=g, device=DEV, dtype=torch.float32).to(BF16)


def reference(A_shard, Bs, gather_dim, return_A=True):
    return torch.ops.symm_mem.fused_all_gather_matmul(A_shard, Bs, gather_dim, GNAME, return_A=return_A)


def expect_same(ours, theirs, what: str) -> None:
    (a1, o1), (a2, o2) = ours, theirs
    if a2 is None:
        assert a1 is None, f"{what}: A returned though return_A=False"
    else:
        assert a1.shape == a2.shape and a1.stride() == a2.stride(), (
            f"{what}: gathered A {tuple(a1.shape)} {a1.stride()} vs torch {tuple(a2.shape)} {a2.stride()}")
        assert torch.equal(a1, a2), f"{what}: gathered A differs from torch's in {(a1 != a2).sum().item()} elements"
    assert len(o1) == len(o2), f"{what}: {len(o1)} outputs vs torch's {len(o2)}"
    for i, (x, y) in enumerate(zip(o1, o2)):
        assert x.shape == y.shape and x.stride() == y.stride(), (
            f"{what}: outs[{i}] {tuple(x.shape)} {x.stride()} vs torch {tuple(y.shape)} {y.stride()}")
        # Within two bf16 steps of each other (rand inputs: every output is positive and large).
        torch.testing.assert_close(x.float(), y.float(), rtol=1.6e-2, atol=1e-2, msg=lambda m: f"{what}: outs[{i}]: {m}")


CASES = []
KEEP_GOING = False


def case(fn):
    CASES.append(fn)
    return fn


@case
def torch_test_cases_eager():
    """torch's test: A_shard [8, 64, 32] split on gather_dim 0 or 1, three Bs [32, 16]."""
    for gather_dim in (0, 1):
        shape = [8, 64, 32]
        shape[gather_dim] //= WORLD
        A = rand(*shape, seed=1 + gather_dim)
        # Bs[0] goes through the fused kernel: a transposed [N, K] weight; the others any layout.
        Bs = [rand(16, 32, seed=10).t(), rand(32, 16, seed=11), rand(16, 32, seed=12).t()]
        for return_A in (True, False):
            ours = mkernel.fused_all_gather_matmul(A, Bs, gather_dim, GNAME, return_A=return_A)
            expect_same(ours, reference(A, Bs, gather_dim, return_A), f"gather_dim {gather_dim}, return_A {return_A}")


@case
def last_dim_and_bad_arguments_refused():
    A, W = rand(8, 32, 32, seed=3), rand(16, 32, seed=4)
    checks = [
        (lambda: mkernel.fused_all_gather_matmul(A, [W.t()], 2, GNAME), "gather_dim: 2 is A_shard's last dimension"),
        (lambda: mkernel.fused_all_gather_matmul(A.half(), [W.t()], 0, GNAME), "A_shard: dtype torch.float16"),
        (lambda: mkernel.fused_all_gather_matmul(A, [W.t().contiguous()], 0, GNAME), "Bs[0]: strides (16, 1)"),
        (lambda: mkernel.fused_all_gather_matmul(A.cpu(), [W.t()], 0, GNAME), "A_shard: device cpu"),
    ]
    for call, start in checks:
        try:
            call()
        except mkernel.ArgumentError as e:
            assert str(e).startswith(start), f"message {str(e)!r} does not start with {start!r}"
        else:
            raise AssertionError(f"not refused: {start}")


@case
def native_sized_with_b_row_major_or_transposed():
    """torch's native-kernel test: M 4096, N 1024, K 1024, bf16, B row-major or transposed."""
    A = rand(4096 // WORLD, 1024, seed=5)
    W = rand(1024, 1024, seed=6)
    expect_same(mkernel.fused_all_gather_matmul(A, [W.t()], 0, GNAME), reference(A, [W.t()], 0), "B = W.t()")
    B = W.t().contiguous()  # row-major [K, N]: copied into [N, K] on every call when allowed
    expect_same(mkernel.fused_all_gather_matmul(A, [B], 0, GNAME, allow_copy_B=True), reference(A, [B], 0),
                "row-major B, allow_copy_B")


@case
def larger_shape_and_torch_ops_entry():
    A, W = rand(2048, 4096, seed=7), rand(2048, 4096, seed=8)
    ours = torch.ops.mkernel.fused_all_gather_matmul(A, [W.t()], 0, GNAME)
    expect_same((ours[0], list(ours[1])), reference(A, [W.t()], 0), "2048 x 2048 x 4096 per rank")


@case
def torch_compile_inductor():
    def layer(x, weight, fused):
        op = torch.ops.mkernel if fused == "mkernel" else torch.ops.symm_mem
        A, outs = op.fused_all_gather_matmul(x, [weight.t()], 1, GNAME)
        return torch.relu(outs[0]) * 2 + 1, A

    compiled = torch.compile(layer, fullgraph=True)
    for step in range(3):  # new data each time, the same graph
        x, w = rand(8, 64 // WORLD, 256, seed=20 + step), rand(128, 256, seed=30 + step)
        y1, A1 = compiled(x, w, "mkernel")
        y2, A2 = layer(x, w, "symm_mem")
        expect_same((A1, [y1]), (A2, [y2]), f"torch.compile step {step}")


@case
def cuda_graph_replay():
    """Warm-up (plans the shape), capture, replay three times with new data in the inputs."""
    x, w = rand(512, 1024, seed=40), rand(768, 1024, seed=41)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mkernel.fused_all_gather_matmul(x, [w.t()], 0, GNAME)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        A, [y] = mkernel.fused_all_gather_matmul(x, [w.t()], 0, GNAME)
    for replay in range(3):
        x.copy_(rand(512, 1024, seed=50 + replay))
        w.copy_(rand(768, 1024, seed=60 + replay))
        A.zero_()
        y.zero_()
        graph.replay()
        torch.cuda.synchronize()
        COMM.check()
        expect_same((A, [y]), reference(x, [w.t()], 0), f"graph replay {replay}")


@case
def torch_compile_reduce_overhead():
    """torch.compile's CUDA graphs (cudagraph trees): warm-up runs first, then replays."""
    compiled = torch.compile(lambda x, w: torch.ops.mkernel.fused_all_gather_matmul(x, [w.t()], 0, GNAME)[1][0],
                             mode="reduce-overhead", fullgraph=True)
    for step in range(4):
        x, w = rand(256, 512, seed=70 + step), rand(256, 512, seed=80 + step)
        y = compiled(x, w).clone()
        expect_same((None, [y]), (None, reference(x, [w.t()], 0, return_A=False)[1]), f"reduce-overhead step {step}")


@case
def opcheck_schema_and_fake():
    op = torch.ops.mkernel.fused_all_gather_matmul.default
    A, W = rand(4, 16, 64, seed=90), rand(32, 64, seed=91)
    torch.library.opcheck(op, (A, [W.t()], 0, GNAME), test_utils=("test_schema", "test_faketensor"))


@case
def bootstrap_from_env():
    """torchrun's variables plus MKERNEL_TOKEN and MKERNEL_PEER_PORT (run.sh sets both)."""
    env = mkernel.Communicator.from_env(workspace_bytes=mkernel.all_gather_matmul_workspace_bytes(WORLD, 128, 256),
                                        name="from-env")
    try:
        assert (env.rank, env.size, env.device) == (RANK, WORLD, LOCAL), repr(env)
        A, W = rand(128, 256, seed=95), rand(64, 256, seed=96)
        ours = mkernel.fused_all_gather_matmul(A, [W.t()], 0, "from-env")
        expect_same(ours, reference(A, [W.t()], 0), "communicator from the environment")
        torch.cuda.synchronize()
        env.check()
    finally:
        env.close()


@case
def adaptive_split_same_bits():
    """A communicator with adaptive_split: 24 calls on the same inputs, the policy moving the
    split between them; every result the same bits, right against torch's, and split_report
    names the plan."""
    ad = mkernel.Communicator.from_process_group(
        GROUP, workspace_bytes=mkernel.all_gather_matmul_workspace_bytes(WORLD, 1024, 1024), adaptive_split=True,
        register=False)
    try:
        ad.register("adaptive")
        A, W = rand(1024, 1024, seed=191), rand(1024, 1024, seed=192)
        first = mkernel.fused_all_gather_matmul(A, [W.t()], 0, "adaptive")
        expect_same(first, reference(A, [W.t()], 0), "adaptive split, first call")
        for i in range(24):
            again = mkernel.fused_all_gather_matmul(A, [W.t()], 0, "adaptive")
            assert torch.equal(again[1][0], first[1][0]), f"call {i + 2}: the product's bits changed with the split"
            assert torch.equal(again[0], first[0]), f"call {i + 2}: the gathered A changed"
        torch.cuda.synchronize()
        ad.check()
        report = ad.split_report()
        assert "all_gather_gemm" in report and "adaptive" in report, f"split_report: {report!r}"
        if RANK == 0:
            log("adaptive split: " + report.strip())
    finally:
        ad.close()


@case
def ranks_disagreeing_on_a_shape_are_told():
    """Each rank calls with another K: planning finds it on every rank, naming both values."""
    if WORLD < 2:
        log("ranks_disagreeing_on_a_shape_are_told: one rank cannot disagree; nothing to check")
        return
    k = 64 + 8 * RANK
    try:
        mkernel.fused_all_gather_matmul(rand(32, k, seed=97), [rand(16, k, seed=98).t()], 0, GNAME)
    except mkernel.ArgumentError as e:
        assert "ranks disagree on k" in str(e), str(e)
    else:
        raise AssertionError("a disagreement on k went through")


# ---- fused_matmul_reduce_scatter ----------------------------------------------------------------


def rs_reference(A, B, scatter_dim):
    # torch's op refuses a negative scatter_dim ("Invalid gather_dim"); mkernel's counts it from the end.
    return torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", scatter_dim % A.dim(), GNAME)


def expect_same_rs(ours, theirs, what: str) -> None:
    assert ours.shape == theirs.shape and ours.stride() == theirs.stride() and ours.dtype == theirs.dtype, (
        f"{what}: {tuple(ours.shape)} {ours.stride()} {ours.dtype} vs torch {tuple(theirs.shape)} {theirs.stride()} "
        f"{theirs.dtype}")
    # torch rounds each rank's partial to bf16 before the sum; mkernel rounds the fp32 sum once.
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=1.6e-2, atol=1e-2, msg=lambda m: f"{what}: {m}")


def rs_call(A, B, scatter_dim, what, **kw):
    """mkernel's op against torch's, and mkernel's again: the same bits (a fixed summation order)."""
    ours = mkernel.fused_matmul_reduce_scatter(A, B, "sum", scatter_dim, GNAME, **kw)
    expect_same_rs(ours, rs_reference(A, B, scatter_dim), what)
    again = mkernel.fused_matmul_reduce_scatter(A, B, "sum", scatter_dim, GNAME, **kw)
    assert torch.equal(ours, again), f"{what}: a second call differs in {(ours != again).sum().item()} elements"
    return ours


@case
def rs_torch_test_cases_eager():
    """torch's test: A [8, 64, 32] scattered on dim 0 or 1, B [32, 16]; a 2-D and a 4-D A."""
    for scatter_dim in (0, 1):
        A = rand(8, 64, 32, seed=101 + scatter_dim)
        B = rand(16, 32, seed=103).t()  # each rank's weight shard [N, K_local], as B = weight.t()
        rs_call(A, B, scatter_dim, f"[8, 64, 32] scatter_dim {scatter_dim}")
    rs_call(rand(64 * WORLD, 32, seed=104), rand(16, 32, seed=105).t(), 0, "2-D A")
    rs_call(rand(4, 2 * WORLD, 8, 64, seed=106), rand(24, 64, seed=107).t(), 1, "4-D A, scatter_dim 1")
    rs_call(rand(4, 3, 4 * WORLD, 64, seed=108), rand(8, 64, seed=109).t(), -2, "4-D A, scatter_dim -2")


@case
def rs_bad_arguments_refused():
    A, W = rand(8, 32, 32, seed=110), rand(16, 32, seed=111)
    checks = [
        (lambda: mkernel.fused_matmul_reduce_scatter(A, W.t(), "avg", 0, GNAME), "reduce_op: 'avg'; expected 'sum'"),
        (lambda: mkernel.fused_matmul_reduce_scatter(A, W.t(), "sum", 2, GNAME), "scatter_dim: 2 is the last dimension"),
        (lambda: mkernel.fused_matmul_reduce_scatter(A.half(), W.t(), "sum", 0, GNAME), "A: dtype torch.float16"),
        (lambda: mkernel.fused_matmul_reduce_scatter(A, W.t().contiguous(), "sum", 0, GNAME), "B: strides (16, 1)"),
        (lambda: mkernel.fused_matmul_reduce_scatter(A.cpu(), W.t(), "sum", 0, GNAME), "A: device cpu"),
        (lambda: mkernel.fused_matmul_reduce_scatter(A[:, :, :12], W.t()[:12], "sum", 0, GNAME), "A: K = 12"),
    ]
    if WORLD > 1:
        checks.append((lambda: mkernel.fused_matmul_reduce_scatter(rand(2 * WORLD + 1, 32, seed=112), W.t(), "sum", 0,
                                                                   GNAME), "A: shape"))
    for call, start in checks:
        try:
            call()
        except mkernel.ArgumentError as e:
            assert str(e).startswith(start), f"message {str(e)!r} does not start with {start!r}"
        else:
            raise AssertionError(f"not refused: {start}")


@case
def rs_native_sized_with_b_row_major_or_transposed():
    """torch's native-kernel size: M 4096, N 1024, K 1024 (each rank's share), B transposed or row-major."""
    A, W = rand(4096, 1024, seed=113), rand(1024, 1024, seed=114)
    rs_call(A, W.t(), 0, "B = W.t()")
    rs_call(A, W.t().contiguous(), 0, "row-major B, allow_copy_B", allow_copy_B=True)


@case
def rs_larger_shape_and_torch_ops_entry():
    A, W = rand(2048 * WORLD, 4096, seed=115), rand(2048, 4096, seed=116)
    ours = torch.ops.mkernel.fused_matmul_reduce_scatter(A, W.t(), "sum", 0, GNAME)
    expect_same_rs(ours, rs_reference(A, W.t(), 0), f"{2048 * WORLD} x 2048 x 4096 per rank")


@case
def rs_torch_compile_inductor():
    def layer(x, weight, fused):
        op = torch.ops.mkernel if fused == "mkernel" else torch.ops.symm_mem
        y = op.fused_matmul_reduce_scatter(torch.relu(x), weight.t(), "sum", 1, GNAME)
        return y * 2 + 1

    compiled = torch.compile(layer, fullgraph=True)
    for step in range(3):  # new data each time, the same graph
        x, w = rand(8, 32 * WORLD, 256, seed=120 + step), rand(128, 256, seed=130 + step)
        expect_same_rs(compiled(x, w, "mkernel"), layer(x, w, "symm_mem"), f"torch.compile step {step}")


@case
def rs_cuda_graph_replay():
    """Warm-up (plans the shape), capture, replay three times with new data in the inputs."""
    x, w = rand(512 * WORLD, 1024, seed=140), rand(768, 1024, seed=141)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mkernel.fused_matmul_reduce_scatter(x, w.t(), "sum", 0, GNAME)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = mkernel.fused_matmul_reduce_scatter(x, w.t(), "sum", 0, GNAME)
    for replay in range(3):
        x.copy_(rand(512 * WORLD, 1024, seed=150 + replay))
        w.copy_(rand(768, 1024, seed=160 + replay))
        y.zero_()
        graph.replay()
        torch.cuda.synchronize()
        COMM.check()
        expect_same_rs(y, rs_reference(x, w.t(), 0), f"graph replay {replay}")


@case
def rs_torch_compile_reduce_overhead():
    """torch.compile's CUDA graphs (cudagraph trees): warm-up runs first, then replays."""
    compiled = torch.compile(lambda x, w: torch.ops.mkernel.fused_matmul_reduce_scatter(x, w.t(), "sum", 0, GNAME),
                             mode="reduce-overhead", fullgraph=True)
    for step in range(4):
        x, w = rand(256 * WORLD, 512, seed=170 + step), rand(256, 512, seed=180 + step)
        y = compiled(x, w).clone()
        expect_same_rs(y, rs_reference(x, w.t(), 0), f"reduce-overhead step {step}")


@case
def rs_opcheck_schema_and_fake():
    op = torch.ops.mkernel.fused_matmul_reduce_scatter.default
    A, W = rand(4 * WORLD, 16, 64, seed=190), rand(32, 64, seed=191)
    torch.library.opcheck(op, (A, W.t(), "sum", 0, GNAME), test_utils=("test_schema", "test_faketensor"))


@case
def rs_after_all_gather_on_one_communicator():
    """A tensor-parallel MLP: AllGather+GEMM (column-parallel) then GEMM+ReduceScatter
    (row-parallel), both through the one communicator, three times; against symm_mem's pair."""
    hidden, ffn_local = 512, 768
    w1, w2 = rand(ffn_local, hidden, seed=200), rand(hidden, ffn_local, seed=201)

    def mlp(x, ops):
        _, [h] = ops.fused_all_gather_matmul(x, [w1.t()], 0, GNAME, return_A=False)
        return ops.fused_matmul_reduce_scatter(torch.relu(h - 64), w2.t(), "sum", 0, GNAME)

    for step in range(3):
        x = rand(256, hidden, seed=210 + step)
        expect_same_rs(mlp(x, torch.ops.mkernel), mlp(x, torch.ops.symm_mem), f"MLP step {step}")


@case
def rs_communicator_made_by_the_op():
    """A group with no communicator: the op makes one sized for the call (workspace and fused-op
    flags), then refuses a larger call naming the workspace to make it with."""
    group = dist.new_group(list(range(WORLD)))
    m_local, n, k = 4096, 4096, 64
    A, W = rand(m_local * WORLD, k, seed=220), rand(n, k, seed=221)
    ours = mkernel.fused_matmul_reduce_scatter(A, W.t(), "sum", 0, group)
    made = mkernel.get_communicator(group.group_name)
    try:
        assert made is not None and made is not COMM, "the op made no communicator"
        needed = mkernel.matmul_reduce_scatter_workspace_bytes(WORLD, m_local, n)
        assert made.workspace_bytes == max(1, needed), (made.workspace_bytes, needed)
        flags = mkernel.matmul_reduce_scatter_fused_flags(WORLD, m_local, n)
        assert made.fused_flags == max(mkernel.default_fused_flags(), flags), (made.fused_flags, flags)
        if WORLD > 1:
            try:
                mkernel.fused_matmul_reduce_scatter(rand(2 * m_local * WORLD, k, seed=222), W.t(), "sum", 0, group)
            except mkernel.ArgumentError as e:
                assert "workspace_bytes >=" in str(e), str(e)
            else:
                raise AssertionError("a call larger than the made communicator went through")
        expect_same_rs(ours, rs_reference(A, W.t(), 0), f"[{m_local}, {n}] per rank, k {k}")
        torch.cuda.synchronize()
        made.check()
        log(made.describe_matmul_reduce_scatter(m_local, n, k).replace("\n", " | "))
    finally:
        if made is not None:
            made.close()


@case
def rs_ranks_disagreeing_on_a_shape_are_told():
    """Each rank calls with another K: planning finds it on every rank, naming both values."""
    if WORLD < 2:
        log("rs_ranks_disagreeing_on_a_shape_are_told: one rank cannot disagree; nothing to check")
        return
    k = 64 + 8 * RANK
    try:
        mkernel.fused_matmul_reduce_scatter(rand(32 * WORLD, k, seed=230), rand(16, k, seed=231).t(), "sum", 0, GNAME)
    except mkernel.ArgumentError as e:
        assert "ranks disagree on k" in str(e), str(e)
    else:
        raise AssertionError("a disagreement on k went through")


# ---- fused_matmul_all_reduce --------------------------------------------------------------------
# torch.ops.symm_mem has no GEMM+AllReduce: the reference is dist.all_reduce of torch's product.
# Every collective of a case (mkernel's calls, the reference, the gather of the results) runs
# before its first assertion, so a rank whose check fails never leaves the other waiting in one.


def ar_reference(A, B):
    ref = torch.matmul(A, B).contiguous()  # bf16, rounded once per rank
    dist.all_reduce(ref)
    return ref


def gathered(t):
    """t of every rank, in rank order."""
    out = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(out, t.contiguous())
    return out


def expect_same_ar(ours, theirs, what: str, everyone=None) -> None:
    assert ours.shape == theirs.shape and ours.stride() == theirs.stride() and ours.dtype == theirs.dtype, (
        f"{what}: {tuple(ours.shape)} {ours.stride()} {ours.dtype} vs torch {tuple(theirs.shape)} {theirs.stride()} "
        f"{theirs.dtype}")
    assert ours.is_contiguous(), f"{what}: strides {ours.stride()} for shape {tuple(ours.shape)}; expected contiguous"
    # torch rounds each rank's product to bf16 before the sum; mkernel rounds the fp32 sum once.
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=1.6e-2, atol=1e-2, msg=lambda m: f"{what}: {m}")
    if everyone is not None:  # every rank got the same bits (the owner of a band rounds it once)
        for r, theirs_r in enumerate(everyone):
            assert torch.equal(theirs_r, everyone[0]), (
                f"{what}: rank {r}'s result differs from rank 0's in {(theirs_r != everyone[0]).sum().item()} elements")


def ar_call(A, B, what, **kw):
    """mkernel's op against all_reduce(A @ B), mkernel's again (the same bits: a fixed summation
    order), and every rank's result against rank 0's."""
    ours = mkernel.fused_matmul_all_reduce(A, B, "sum", GNAME, **kw)
    theirs = ar_reference(A, B)
    again = mkernel.fused_matmul_all_reduce(A, B, "sum", GNAME, **kw)
    everyone = gathered(ours)
    expect_same_ar(ours, theirs, what, everyone)
    assert torch.equal(ours, again), f"{what}: a second call differs in {(ours != again).sum().item()} elements"
    return ours


@case
def ar_torch_test_sizes_eager():
    """torch's sizes for the fused GEMM ops (A [8, 64, 32], B [32, 16]); a 2-D, 3-D and 4-D A."""
    ar_call(rand(8, 64, 32, seed=301), rand(16, 32, seed=302).t(), "[8, 64, 32]")
    ar_call(rand(64 * WORLD, 32, seed=303), rand(16, 32, seed=304).t(), "2-D A")
    ar_call(rand(4, 50, 256, seed=305), rand(128, 256, seed=306).t(), "3-D A [4, 50, 256]")
    ar_call(rand(2, 3, 8, 64, seed=307), rand(24, 64, seed=308).t(), "4-D A [2, 3, 8, 64]")


@case
def ar_rows_not_a_multiple_of_world_or_128():
    """M any positive number: bands of unequal rows, tiles shared by bands, empty bands (M < world)."""
    for M in (333, 2 * WORLD + 1, 129, 1):
        ar_call(rand(M, 512, seed=310 + M), rand(256, 512, seed=309).t(), f"M {M}")


@case
def ar_bad_arguments_refused():
    A, W = rand(8, 32, 32, seed=320), rand(16, 32, seed=321)
    checks = [
        (lambda: mkernel.fused_matmul_all_reduce(A, W.t(), "avg", GNAME), "reduce_op: 'avg'; expected 'sum'"),
        (lambda: mkernel.fused_matmul_all_reduce(A.half(), W.t(), "sum", GNAME), "A: dtype torch.float16"),
        (lambda: mkernel.fused_matmul_all_reduce(A, W.t().contiguous(), "sum", GNAME), "B: strides (16, 1)"),
        (lambda: mkernel.fused_matmul_all_reduce(A.cpu(), W.t(), "sum", GNAME), "A: device cpu"),
        (lambda: mkernel.fused_matmul_all_reduce(A[:, :, :12], W.t()[:12], "sum", GNAME), "A: K = 12"),
        (lambda: mkernel.fused_matmul_all_reduce(A, rand(12, 32, seed=322).t(), "sum", GNAME), "B: N = 12 columns"),
    ]
    for call, start in checks:
        try:
            call()
        except mkernel.ArgumentError as e:
            assert str(e).startswith(start), f"message {str(e)!r} does not start with {start!r}"
        else:
            raise AssertionError(f"not refused: {start}")


@case
def ar_native_sized_with_b_row_major_or_transposed():
    """torch's native-kernel size: M 4096, N 1024, K 1024 (each rank's share), B transposed or row-major."""
    A, W = rand(4096, 1024, seed=330), rand(1024, 1024, seed=331)
    ar_call(A, W.t(), "B = W.t()")
    ar_call(A, W.t().contiguous(), "row-major B, allow_copy_B", allow_copy_B=True)


@case
def ar_larger_shape_and_torch_ops_entry():
    A, W = rand(4096, 1024, seed=332), rand(2048, 1024, seed=333)
    ours = torch.ops.mkernel.fused_matmul_all_reduce(A, W.t(), "sum", GNAME)
    theirs = ar_reference(A, W.t())
    expect_same_ar(ours, theirs, "4096 x 2048 x 1024 per rank", gathered(ours))


@case
def ar_torch_compile_inductor():
    def layer(x, weight):
        y = torch.ops.mkernel.fused_matmul_all_reduce(torch.relu(x), weight.t(), "sum", GNAME)
        return y * 2 + 1

    compiled = torch.compile(layer, fullgraph=True)
    for step in range(3):  # new data each time, the same graph
        x, w = rand(8, 33, 256, seed=340 + step), rand(128, 256, seed=350 + step)
        ours = compiled(x, w)
        theirs = ar_reference(torch.relu(x), w.t()) * 2 + 1
        expect_same_ar(ours, theirs, f"torch.compile step {step}", gathered(ours))


@case
def ar_cuda_graph_replay():
    """Warm-up (plans the shape), capture, replay three times with new data in the inputs."""
    x, w = rand(500, 1024, seed=360), rand(768, 1024, seed=361)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mkernel.fused_matmul_all_reduce(x, w.t(), "sum", GNAME)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = mkernel.fused_matmul_all_reduce(x, w.t(), "sum", GNAME)
    for replay in range(3):
        x.copy_(rand(500, 1024, seed=370 + replay))
        w.copy_(rand(768, 1024, seed=380 + replay))
        y.zero_()
        graph.replay()
        torch.cuda.synchronize()
        COMM.check()
        expect_same_ar(y, ar_reference(x, w.t()), f"graph replay {replay}", gathered(y))


@case
def ar_opcheck_schema_and_fake():
    op = torch.ops.mkernel.fused_matmul_all_reduce.default
    A, W = rand(4, 15, 64, seed=390), rand(32, 64, seed=391)
    torch.library.opcheck(op, (A, W.t(), "sum", GNAME), test_utils=("test_schema", "test_faketensor"))


@case
def ar_tensor_parallel_mlp():
    """Megatron's MLP: a column-parallel GEMM (each rank its ffn shard, no communication), then the
    row-parallel one with its all-reduce fused, three times; against torch's matmuls and all_reduce."""
    hidden, ffn_local = 512, 768
    w1, w2 = rand(ffn_local, hidden, seed=400), rand(hidden, ffn_local, seed=401)
    for step in range(3):
        x = rand(3, 100, hidden, seed=410 + step)
        h = torch.relu(x @ w1.t() - 64)
        ours = mkernel.fused_matmul_all_reduce(h, w2.t(), "sum", GROUP)
        theirs = ar_reference(h, w2.t())
        expect_same_ar(ours, theirs, f"MLP step {step}", gathered(ours))


@case
def ar_communicator_made_by_the_op():
    """A group with no communicator: the op makes one sized for the call (workspace and fused-op
    flags), then refuses a larger call naming the workspace to make it with."""
    group = dist.new_group(list(range(WORLD)))
    m, n, k = 4096, 4096, 64
    A, W = rand(m, k, seed=420), rand(n, k, seed=421)
    ours = mkernel.fused_matmul_all_reduce(A, W.t(), "sum", group)
    theirs = ar_reference(A, W.t())
    everyone = gathered(ours)
    made = mkernel.get_communicator(group.group_name)
    try:
        assert made is not None and made is not COMM, "the op made no communicator"
        needed = mkernel.matmul_all_reduce_workspace_bytes(WORLD, m, n)
        assert made.workspace_bytes == max(1, needed), (made.workspace_bytes, needed)
        flags = mkernel.matmul_all_reduce_fused_flags(WORLD, m, n)
        assert made.fused_flags == max(mkernel.default_fused_flags(), flags), (made.fused_flags, flags)
        if WORLD > 1:  # one rank needs no workspace at any size
            try:
                mkernel.fused_matmul_all_reduce(rand(2 * m, k, seed=422), W.t(), "sum", group)
            except mkernel.ArgumentError as e:
                assert "workspace_bytes >=" in str(e), str(e)
            else:
                raise AssertionError("a call larger than the made communicator went through")
        expect_same_ar(ours, theirs, f"[{m}, {n}], k {k}", everyone)
        torch.cuda.synchronize()
        made.check()
        log(made.describe_matmul_all_reduce(m, n, k).replace("\n", " | "))
    finally:
        if made is not None:
            made.close()


@case
def ar_ranks_disagreeing_on_a_shape_are_told():
    """Each rank calls with another K: planning finds it on every rank, naming both values."""
    if WORLD < 2:
        log("ar_ranks_disagreeing_on_a_shape_are_told: one rank cannot disagree; nothing to check")
        return
    k = 64 + 8 * RANK
    try:
        mkernel.fused_matmul_all_reduce(rand(32, k, seed=430), rand(16, k, seed=431).t(), "sum", GNAME)
    except mkernel.ArgumentError as e:
        assert "ranks disagree on k" in str(e), str(e)
    else:
        raise AssertionError("a disagreement on k went through")


# The MoE (moe_*) and ring attention (ring_*) cases, after the GEMM ones.
moe_ring_cases.make_cases(sys.modules[__name__])


def main() -> int:
    log(f"{COMM!r}; staging {COMM.staging}, transport {COMM.transport}")
    passed = failed = 0
    only = [p for p in os.environ.get("MKERNEL_PY_TEST_CASES", "").split(",") if p]
    # MKERNEL_PY_TEST_KEEP_GOING=1: run every selected case even after a failure (for a first
    # run of many cases on a machine that is hard to get; the ranks still agree on each verdict).
    global KEEP_GOING
    KEEP_GOING = os.environ.get("MKERNEL_PY_TEST_KEEP_GOING", "") == "1"
    selected = [fn for fn in CASES if not only or any(fn.__name__.startswith(p) for p in only)]
    if only:
        log(f"MKERNEL_PY_TEST_CASES={','.join(only)}: {len(selected)} of {len(CASES)} cases")
    for fn in selected:
        start = time.monotonic()
        try:
            fn()
            torch.cuda.synchronize()
            COMM.check()
            ok, detail = True, ""
        except Exception as e:  # every failure is reported, then the ranks agree to stop
            ok, detail = False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        log(f"{'PASS' if ok else 'FAIL'} {fn.__name__} ({time.monotonic() - start:.1f} s){' ' + detail if detail else ''}")
        verdict = torch.tensor([0 if ok else 1], device=DEV)
        dist.all_reduce(verdict)
        if verdict.item() == 0:
            passed += 1
        else:
            failed += 1
            if not KEEP_GOING:
                break
    not_run = len(selected) - passed - failed
    if RANK == 0:
        print(f"{passed} passed, {failed} failed" + (f" ({not_run} not run after the failure)" if not_run else ""),
              flush=True)
    COMM.close()
    dist.destroy_process_group()
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
