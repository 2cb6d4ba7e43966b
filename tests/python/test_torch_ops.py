"""torch.ops.mkernel without a GPU: registration, the arguments refused (naming them), the fake
implementation against torch's own op, tracing by torch.compile, the bootstrap through a
process group's store.

CUDA tensors here are fake (FakeTensorMode makes them without a GPU) and the process group is
torch's "fake" backend: what is checked is metadata, which is all the fake implementation and
the argument checks read. Results on two GPUs are tests/gpu/python's job.
"""

from __future__ import annotations

import datetime

import pytest

from conftest import HAVE_TORCH, needs_native

if not HAVE_TORCH:
    pytest.skip("torch is not installed (scripts/install-deps.sh installs it)", allow_module_level=True)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import mkernel  # noqa: E402
from mkernel import _layout, communicator, ops  # noqa: E402

BF16 = torch.bfloat16


@pytest.fixture
def fake_pg(request):
    """A default process group of the fake backend (world from the test's `world` param, default 2)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = getattr(request, "param", 2)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    yield dist.group.WORLD.group_name
    dist.destroy_process_group()


@pytest.fixture
def fake_mode():
    with FakeTensorMode() as mode:
        yield mode


def cuda(*shape, dtype=BF16):
    return torch.empty(*shape, device="cuda", dtype=dtype)


def weight_t(n, k):
    """Bs entry as a column-parallel layer passes it: weight.t() of a row-major [N, K] weight."""
    return cuda(n, k).t()


def test_op_is_registered_with_symm_mem_arguments():
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem)

    ours = torch.ops.mkernel.fused_all_gather_matmul.default._schema
    theirs = torch.ops.symm_mem.fused_all_gather_matmul.default._schema
    ours_args = [(a.name, str(a.type), a.kwarg_only) for a in ours.arguments]
    theirs_args = [(a.name, str(a.type), a.kwarg_only) for a in theirs.arguments]
    assert ours_args[: len(theirs_args)] == theirs_args  # same order, types, keyword-only-ness
    assert ours_args[len(theirs_args):] == [("allow_copy_B", "bool", True)]
    assert [str(r.type) for r in ours.returns] == [str(r.type) for r in theirs.returns]
    assert mkernel.fused_all_gather_matmul.__module__ == "mkernel.ops"


def test_cpu_tensors_refused_naming_the_device():
    A, B = torch.zeros(4, 16, dtype=BF16), torch.zeros(8, 16, dtype=BF16).t()
    with pytest.raises(mkernel.ArgumentError, match=r"^A_shard: device cpu; expected a CUDA tensor"):
        torch.ops.mkernel.fused_all_gather_matmul(A, [B], 0, "0")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: (cuda(64, 32, dtype=torch.float16), [weight_t(16, 32)], 0), r"^A_shard: dtype torch.float16; expected torch.bfloat16"),
        (lambda: (cuda(64, 32, dtype=torch.float32), [weight_t(16, 32)], 0), r"^A_shard: dtype torch.float32"),
        (lambda: (cuda(32), [weight_t(16, 32)], 0), r"^A_shard: shape \(32,\); expected at least 2 dimensions"),
        (lambda: (cuda(64, 12), [weight_t(16, 12)], 0), r"^A_shard: K = 12 \(last dimension\); expected a multiple of 8"),
        (lambda: (cuda(0, 32), [weight_t(16, 32)], 0), r"^A_shard: shape \(0, 32\); expected no empty dimension"),
        (lambda: (cuda(64, 32), [weight_t(16, 32)], 1), r"^gather_dim: 1 is A_shard's last dimension \(K\)"),
        (lambda: (cuda(8, 64, 32), [weight_t(16, 32)], -1), r"^gather_dim: -1 is A_shard's last dimension"),
        (lambda: (cuda(8, 64, 32), [weight_t(16, 32)], 3), r"^gather_dim: 3; expected -3 \.\. 2"),
        (lambda: (cuda(64, 32), [], 0), r"^Bs: list of 0; expected a non-empty list"),
        (lambda: (cuda(64, 32), [weight_t(16, 32).to(torch.float16)], 0), r"^Bs\[0\]: dtype torch.float16; expected torch.bfloat16"),
        (lambda: (cuda(64, 32), [weight_t(16, 24)], 0), r"^Bs\[0\]: shape \(24, 16\); expected \[K, N\] = \[32, N\]"),
        (lambda: (cuda(64, 32), [weight_t(16, 32), cuda(40, 8)], 0), r"^Bs\[1\]: shape \(40, 8\); expected \[K, N\] = \[32, N\]"),
        (lambda: (cuda(64, 32), [weight_t(12, 32)], 0), r"^Bs\[0\]: N = 12 columns; expected a multiple of 8"),
        (lambda: (cuda(64, 32), [cuda(32, 16)], 0),
         r"^Bs\[0\]: strides \(16, 1\) for shape \(32, 16\); expected \(1, 32\): the transpose of a row-major \[N, K\] "
         r"weight, e\.g\. weight\.t\(\) .*allow_copy_B=True"),
        (lambda: (cuda(64, 32), [cuda(16, 64)[:, :32].t()], 0), r"^Bs\[0\]: strides \(1, 64\) for shape \(32, 16\); expected \(1, 32\)"),
    ],
)
def test_bad_arguments_refused_naming_the_argument(fake_pg, fake_mode, make, message):
    A, Bs, gather_dim = make()
    with pytest.raises(mkernel.ArgumentError, match=message):
        torch.ops.mkernel.fused_all_gather_matmul(A, Bs, gather_dim, fake_pg)


def test_devices_must_match(fake_pg, fake_mode):
    A = cuda(64, 32)
    B = torch.empty(16, 32, device="cuda:1", dtype=BF16).t()
    with pytest.raises(mkernel.ArgumentError, match=r"^Bs\[0\]: device cuda:1; expected A_shard's device cuda:0"):
        torch.ops.mkernel.fused_all_gather_matmul(A, [B], 0, fake_pg)


def test_unknown_group_refused(fake_mode):
    with pytest.raises(mkernel.ArgumentError, match=r"^group_name: 'nobody' names neither a registered"):
        torch.ops.mkernel.fused_all_gather_matmul(cuda(64, 32), [weight_t(16, 32)], 0, "nobody")


CASES = [
    # (A_shard shape, gather_dim, number of Bs, return_A): torch's own test cases (BATCH 8, M 64,
    # K 32, N 16, three Bs, gather dims 0 and 1; its gather_dim 2 is refused above), a 2-D A as
    # its native-kernel test has, and return_A=False.
    ((4, 64, 32), 0, 3, True),
    ((8, 32, 32), 1, 3, True),
    ((8, 32, 32), 1, 1, False),
    ((2048, 1024), 0, 1, True),
    ((2048, 1024), 0, 1, False),
    ((96, 64), 0, 2, False),
]


@pytest.mark.parametrize("fake_pg", [2, 4], indirect=True)
@pytest.mark.parametrize("shape, gather_dim, num_b, return_A", CASES)
def test_fake_outputs_match_torch_symm_mem(fake_pg, fake_mode, shape, gather_dim, num_b, return_A):
    import torch.distributed._symmetric_memory  # noqa: F401

    A = cuda(*shape)
    K = shape[-1]
    Bs = [weight_t(16 * (i + 1), K) for i in range(num_b)]
    a1, o1 = torch.ops.mkernel.fused_all_gather_matmul(A, Bs, gather_dim, fake_pg, return_A=return_A)
    a2, o2 = torch.ops.symm_mem.fused_all_gather_matmul(A, Bs, gather_dim, fake_pg, return_A=return_A)
    if return_A:
        assert (a1.shape, a1.stride(), a1.dtype, a1.device) == (a2.shape, a2.stride(), a2.dtype, a2.device)
    else:
        assert a1 is None and a2 is None
    assert len(o1) == len(o2) == num_b
    for x, y in zip(o1, o2):
        assert (x.shape, x.stride(), x.dtype, x.device) == (y.shape, y.stride(), y.dtype, y.device)


def test_row_major_b_taken_with_allow_copy_B(fake_pg, fake_mode):
    A, B = cuda(64, 32), cuda(32, 16)
    _, [C] = mkernel.fused_all_gather_matmul(A, [B], 0, fake_pg, allow_copy_B=True)
    assert C.shape == (128, 16)


def test_python_wrapper_takes_the_group_itself(fake_pg, fake_mode):
    A, outs = mkernel.fused_all_gather_matmul(cuda(64, 32), [weight_t(16, 32)], 0, dist.group.WORLD)
    assert A.shape == (128, 32) and isinstance(outs, list) and outs[0].shape == (128, 16)


def test_torch_compile_traces_the_op_without_graph_breaks(fake_pg):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def layer(x, weight):
        A, [y] = mkernel.fused_all_gather_matmul(x, [weight.t()], 0, fake_pg)
        return torch.relu(y) + 1, A

    with FakeTensorMode(allow_non_fake_inputs=True):
        x, weight = cuda(64, 32), cuda(16, 32)
        y, A = torch.compile(layer, backend=backend, fullgraph=True)(x, weight)
    assert y.shape == (128, 16) and A.shape == (128, 32)
    assert len(graphs) == 1
    assert "torch.ops.mkernel.fused_all_gather_matmul" in graphs[0].code


def test_make_fx_records_the_op(fake_pg):
    from torch.fx.experimental.proxy_tensor import make_fx

    def layer(x, weight):
        return mkernel.fused_all_gather_matmul(x, [weight.t()], 1, fake_pg, return_A=False)[1][0]

    with FakeTensorMode():
        gm = make_fx(layer)(cuda(8, 4, 32), cuda(16, 32))
    assert "mkernel.fused_all_gather_matmul.default" in gm.code


# ---- how arguments reach the kernel: copies only where the layout needs one --------------------


def test_rows_are_a_view_for_gather_dim_0_and_a_copy_otherwise():
    A = torch.arange(8 * 4 * 16, dtype=torch.float32).reshape(8, 4, 16)
    rows = _layout.rows_of(A, 0)
    assert rows.shape == (32, 16) and rows.data_ptr() == A.data_ptr()
    rows = _layout.rows_of(A, 1)
    assert rows.shape == (32, 16) and rows.data_ptr() != A.data_ptr()
    assert torch.equal(rows.view(4, 8, 16), A.movedim(1, 0))
    # An A_shard restrided so that gather_dim leads in memory is taken as it is.
    restrided = A.movedim(1, 0).contiguous().movedim(0, 1)
    assert _layout.rows_of(restrided, 1).data_ptr() == restrided.data_ptr()


def test_weight_is_taken_as_it_is_when_transposed():
    weight = torch.randn(16, 32)
    assert _layout.weight_of(weight.t()).data_ptr() == weight.data_ptr()
    B = torch.randn(32, 16)
    w = _layout.weight_of(B)
    assert w.is_contiguous() and torch.equal(w, B.t()) and w.data_ptr() != B.data_ptr()


# ---- bootstrap through the process group's store -----------------------------------------------


@pytest.fixture
def store_pg(request):
    """A fake-backend group whose store is real (a HashStore), as rank `param` of 2."""
    rank = getattr(request, "param", 0)
    store = dist.HashStore()
    dist.init_process_group("fake", store=store, rank=rank, world_size=2)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("store_pg", [0], indirect=True)
def test_rank0_without_daemon_tells_the_others_through_the_store(native, store_pg, tmp_path):
    import torch.distributed.distributed_c10d as c10d

    sock = str(tmp_path / "absent.sock")
    with pytest.raises(mkernel.MkernelError, match=f"cannot connect to mkerneld at {sock}"):
        mkernel.Communicator.from_process_group(store_pg, workspace_bytes=1 << 20, device=0, socket_path=sock)
    store = c10d._get_process_group_store(store_pg)
    keys = [f"mkernel/{store_pg.group_name}/{n}/unique_id" for n in range(8)]
    published = [store.get(k).decode() for k in keys if store.check([k])]
    assert len(published) == 1 and published[0].startswith("error:cannot connect to mkerneld")


@pytest.mark.parametrize("store_pg", [1], indirect=True)
def test_other_ranks_wait_for_the_id_within_the_bound(native, store_pg):
    started = datetime.datetime.now()
    with pytest.raises(mkernel.MkernelError, match="rank 0 did not publish mkernel's unique id within 0.5 s") as info:
        mkernel.Communicator.from_process_group(store_pg, workspace_bytes=1 << 20, device=0, rendezvous_timeout=0.5)
    assert info.value.code == "deadline exceeded"
    assert (datetime.datetime.now() - started).total_seconds() < 10


def test_from_process_group_needs_an_initialized_group(native):
    with pytest.raises(mkernel.ArgumentError, match="torch.distributed is not initialized"):
        mkernel.Communicator.from_process_group(workspace_bytes=1 << 20)


# ---- fused_matmul_reduce_scatter ----------------------------------------------------------------


def test_reduce_scatter_op_is_registered_with_symm_mem_arguments():
    import torch.distributed._symmetric_memory  # noqa: F401

    ours = torch.ops.mkernel.fused_matmul_reduce_scatter.default._schema
    theirs = torch.ops.symm_mem.fused_matmul_reduce_scatter.default._schema
    ours_args = [(a.name, str(a.type), a.kwarg_only) for a in ours.arguments]
    theirs_args = [(a.name, str(a.type), a.kwarg_only) for a in theirs.arguments]
    assert ours_args[: len(theirs_args)] == theirs_args
    assert ours_args[len(theirs_args):] == [("allow_copy_B", "bool", True)]
    assert [str(r.type) for r in ours.returns] == [str(r.type) for r in theirs.returns] == ["Tensor"]
    assert mkernel.fused_matmul_reduce_scatter.__module__ == "mkernel.ops"
    tags = torch.ops.mkernel.fused_matmul_reduce_scatter.default.tags
    assert any(t in tags for t in (getattr(torch.Tag, "needs_exact_strides", None), torch.Tag.needs_fixed_stride_order))


def test_reduce_scatter_cpu_tensors_refused_naming_the_device():
    A, B = torch.zeros(4, 16, dtype=BF16), torch.zeros(8, 16, dtype=BF16).t()
    with pytest.raises(mkernel.ArgumentError, match=r"^A: device cpu; expected a CUDA tensor"):
        torch.ops.mkernel.fused_matmul_reduce_scatter(A, B, "sum", 0, "0")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: (cuda(64, 32, dtype=torch.float16), weight_t(16, 32), "sum", 0), r"^A: dtype torch.float16; expected torch.bfloat16"),
        (lambda: (cuda(64, 32, dtype=torch.float32), weight_t(16, 32), "sum", 0), r"^A: dtype torch.float32"),
        (lambda: (cuda(32), weight_t(16, 32), "sum", 0), r"^A: shape \(32,\); expected at least 2 dimensions"),
        (lambda: (cuda(64, 12), weight_t(16, 12), "sum", 0), r"^A: K = 12 \(last dimension\); expected a multiple of 8"),
        (lambda: (cuda(0, 32), weight_t(16, 32), "sum", 0), r"^A: shape \(0, 32\); expected no empty dimension"),
        (lambda: (cuda(64, 32), weight_t(16, 32).to(torch.float16), "sum", 0), r"^B: dtype torch.float16; expected torch.bfloat16"),
        (lambda: (cuda(64, 32), weight_t(16, 24), "sum", 0), r"^B: shape \(24, 16\); expected \[K, N\] = \[32, N\]"),
        (lambda: (cuda(64, 32), cuda(2, 32, 16), "sum", 0), r"^B: shape \(2, 32, 16\); expected \[K, N\]"),
        (lambda: (cuda(64, 32), weight_t(12, 32), "sum", 0), r"^B: N = 12 columns; expected a positive multiple of 8"),
        (lambda: (cuda(64, 32), cuda(32, 16), "sum", 0),
         r"^B: strides \(16, 1\) for shape \(32, 16\); expected \(1, 32\): the transpose of a row-major \[N, K\] "
         r"weight, e\.g\. weight\.t\(\) .*allow_copy_B=True"),
        (lambda: (cuda(64, 32), cuda(16, 64)[:, :32].t(), "sum", 0), r"^B: strides \(1, 64\) for shape \(32, 16\); expected \(1, 32\)"),
        (lambda: (cuda(64, 32), weight_t(16, 32), "avg", 0), r"^reduce_op: 'avg'; expected 'sum' .*divide the sum"),
        (lambda: (cuda(64, 32), weight_t(16, 32), "max", 0), r"^reduce_op: 'max'; expected 'sum'"),
        (lambda: (cuda(64, 32), weight_t(16, 32), "sum", 1), r"^scatter_dim: 1 is the last dimension of the result \(N\)"),
        (lambda: (cuda(8, 64, 32), weight_t(16, 32), "sum", -1), r"^scatter_dim: -1 is the last dimension"),
        (lambda: (cuda(8, 64, 32), weight_t(16, 32), "sum", 3), r"^scatter_dim: 3; expected -3 \.\. 2"),
        (lambda: (cuda(63, 32), weight_t(16, 32), "sum", 0),
         r"^A: shape \(63, 32\) has 63 along scatter_dim 0; expected a multiple of the group's size 2"),
        (lambda: (cuda(8, 5, 32), weight_t(16, 32), "sum", 1), r"^A: shape \(8, 5, 32\) has 5 along scatter_dim 1"),
    ],
)
def test_reduce_scatter_bad_arguments_refused_naming_the_argument(fake_pg, fake_mode, make, message):
    A, B, reduce_op, scatter_dim = make()
    with pytest.raises(mkernel.ArgumentError, match=message):
        torch.ops.mkernel.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, fake_pg)


def test_reduce_scatter_devices_must_match(fake_pg, fake_mode):
    A = cuda(64, 32)
    B = torch.empty(16, 32, device="cuda:1", dtype=BF16).t()
    with pytest.raises(mkernel.ArgumentError, match=r"^B: device cuda:1; expected A's device cuda:0"):
        torch.ops.mkernel.fused_matmul_reduce_scatter(A, B, "sum", 0, fake_pg)


def test_reduce_scatter_unknown_group_refused(fake_mode):
    with pytest.raises(mkernel.ArgumentError, match=r"^group_name: 'nobody' names neither a registered"):
        torch.ops.mkernel.fused_matmul_reduce_scatter(cuda(64, 32), weight_t(16, 32), "sum", 0, "nobody")


@pytest.mark.parametrize("fake_pg", [4], indirect=True)
def test_reduce_scatter_rows_must_split_over_the_whole_group(fake_pg, fake_mode):
    # 8 rows split over 2 but not over 4 ranks.
    torch.ops.mkernel.fused_matmul_reduce_scatter(cuda(8, 32), weight_t(16, 32), "sum", 0, fake_pg)
    with pytest.raises(mkernel.ArgumentError, match=r"^A: shape \(6, 32\) has 6 along scatter_dim 0; .* size 4"):
        torch.ops.mkernel.fused_matmul_reduce_scatter(cuda(6, 32), weight_t(16, 32), "sum", 0, fake_pg)


RS_CASES = [
    # (A shape, scatter_dim, N): torch's own test cases (BATCH 8, M 64, K 32, N 16, scatter dims 0
    # and 1; its scatter over N is refused above), a 2-D A, a 4-D A scattered on an inner
    # dimension, and the size of torch's native-kernel test.
    ((8, 64, 32), 0, 16),
    ((8, 64, 32), 1, 16),
    ((64, 32), 0, 16),
    ((4, 8, 8, 32), 2, 24),
    ((4, 8, 8, 32), -3, 8),
    ((4096, 1024), 0, 1024),
]


@pytest.mark.parametrize("fake_pg", [2, 4], indirect=True)
@pytest.mark.parametrize("shape, scatter_dim, N", RS_CASES)
def test_reduce_scatter_fake_output_matches_torch_symm_mem(fake_pg, fake_mode, shape, scatter_dim, N):
    import torch.distributed._symmetric_memory  # noqa: F401

    A, B = cuda(*shape), weight_t(N, shape[-1])
    ours = torch.ops.mkernel.fused_matmul_reduce_scatter(A, B, "sum", scatter_dim, fake_pg)
    # torch's CUDA implementation refuses a negative scatter_dim; mkernel counts it from the end.
    theirs = torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", scatter_dim % A.dim(), fake_pg)
    assert (ours.shape, ours.stride(), ours.dtype, ours.device) == (theirs.shape, theirs.stride(), theirs.dtype, theirs.device)
    assert ours.is_contiguous()


def test_reduce_scatter_row_major_b_taken_with_allow_copy_B(fake_pg, fake_mode):
    C = mkernel.fused_matmul_reduce_scatter(cuda(64, 32), cuda(32, 16), "sum", 0, fake_pg, allow_copy_B=True)
    assert C.shape == (32, 16)


def test_reduce_scatter_python_wrapper_takes_the_group_itself(fake_pg, fake_mode):
    C = mkernel.fused_matmul_reduce_scatter(cuda(8, 64, 32), weight_t(16, 32), "sum", 1, dist.group.WORLD)
    assert C.shape == (8, 32, 16) and C.is_contiguous()


def test_reduce_scatter_torch_compile_traces_the_op_without_graph_breaks(fake_pg):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def layer(x, weight):
        y = mkernel.fused_matmul_reduce_scatter(x, weight.t(), "sum", 0, fake_pg)
        return torch.relu(y) + 1

    with FakeTensorMode(allow_non_fake_inputs=True):
        x, weight = cuda(64, 32), cuda(16, 32)
        y = torch.compile(layer, backend=backend, fullgraph=True)(x, weight)
    assert y.shape == (32, 16)
    assert len(graphs) == 1
    assert "torch.ops.mkernel.fused_matmul_reduce_scatter" in graphs[0].code


def test_reduce_scatter_make_fx_records_the_op(fake_pg):
    from torch.fx.experimental.proxy_tensor import make_fx

    def layer(x, weight):
        return mkernel.fused_matmul_reduce_scatter(x, weight.t(), "sum", 1, fake_pg)

    with FakeTensorMode():
        gm = make_fx(layer)(cuda(8, 4, 32), cuda(16, 32))
    assert "mkernel.fused_matmul_reduce_scatter.default" in gm.code


def test_reduce_scatter_output_is_the_kernels_rows_put_in_place():
    # What the kernel writes is [m_local, N] in the moved order (scatter_dim first); the result is
    # torch's contiguous layout: a view for scatter_dim 0, one copy otherwise.
    A, B = torch.zeros(4, 6, 32), torch.zeros(32, 8)
    out, result = _layout.scatter_output_of(A, B, 0, 2)
    assert out.shape == (12, 8)
    r = result(out)
    assert r.shape == (2, 6, 8) and r.data_ptr() == out.data_ptr()
    out, result = _layout.scatter_output_of(A, B, 1, 2)
    assert out.shape == (12, 8)
    out.copy_(torch.arange(12 * 8, dtype=torch.float32).view(12, 8))
    r = result(out)
    assert r.shape == (4, 3, 8) and r.is_contiguous() and r.data_ptr() != out.data_ptr()
    assert torch.equal(r, out.view(3, 4, 8).movedim(0, 1))


def test_reduce_scatter_rows_are_rank_bands_of_the_moved_a():
    # Rank r's share of scatter_dim is rows r * m_local ... of A.movedim(scatter_dim, 0) flattened:
    # the band the kernel returns to rank r.
    A = torch.arange(4 * 6 * 8, dtype=torch.float32).reshape(4, 6, 8)
    world = 2
    for sd in (0, 1):
        rows = _layout.rows_of(A, sd)
        m_local = rows.shape[0] // world
        for r in range(world):
            band = rows[r * m_local:(r + 1) * m_local]
            share = A.chunk(world, dim=sd)[r].movedim(sd, 0).reshape(-1, 8)
            assert torch.equal(band, share)



# ---- fused_matmul_all_reduce --------------------------------------------------------------------
# torch.ops.symm_mem has no GEMM+AllReduce: the reference is all_reduce(A @ B), whose shape and
# strides are those of A @ B (torch's functional all_reduce, traced here, keeps them).


def test_all_reduce_op_is_registered_with_its_schema():
    op = torch.ops.mkernel.fused_matmul_all_reduce
    args = [(a.name, str(a.type), a.kwarg_only) for a in op.default._schema.arguments]
    assert args == [("A", "Tensor", False), ("B", "Tensor", False), ("reduce_op", "str", False),
                    ("group_name", "str", False), ("allow_copy_B", "bool", True)]
    assert [a.default_value for a in op.default._schema.arguments][-1] is False
    assert [str(r.type) for r in op.default._schema.returns] == ["Tensor"]
    assert mkernel.fused_matmul_all_reduce.__module__ == "mkernel.ops"
    assert "dist.all_reduce(A @ B)" in mkernel.fused_matmul_all_reduce.__doc__
    tags = op.default.tags
    assert any(t in tags for t in (getattr(torch.Tag, "needs_exact_strides", None), torch.Tag.needs_fixed_stride_order))


def test_all_reduce_cpu_tensors_refused_naming_the_device():
    A, B = torch.zeros(4, 16, dtype=BF16), torch.zeros(8, 16, dtype=BF16).t()
    with pytest.raises(mkernel.ArgumentError, match=r"^A: device cpu; expected a CUDA tensor"):
        torch.ops.mkernel.fused_matmul_all_reduce(A, B, "sum", "0")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: (cuda(64, 32, dtype=torch.float16), weight_t(16, 32), "sum"), r"^A: dtype torch.float16; expected torch.bfloat16"),
        (lambda: (cuda(64, 32, dtype=torch.float32), weight_t(16, 32), "sum"), r"^A: dtype torch.float32"),
        (lambda: (cuda(32), weight_t(16, 32), "sum"), r"^A: shape \(32,\); expected at least 2 dimensions"),
        (lambda: (cuda(64, 12), weight_t(16, 12), "sum"), r"^A: K = 12 \(last dimension\); expected a multiple of 8"),
        (lambda: (cuda(0, 32), weight_t(16, 32), "sum"), r"^A: shape \(0, 32\); expected no empty dimension"),
        (lambda: (cuda(4, 0, 32), weight_t(16, 32), "sum"), r"^A: shape \(4, 0, 32\); expected no empty dimension"),
        (lambda: (cuda(64, 32), weight_t(16, 32).to(torch.float16), "sum"), r"^B: dtype torch.float16; expected torch.bfloat16"),
        (lambda: (cuda(64, 32), weight_t(16, 24), "sum"), r"^B: shape \(24, 16\); expected \[K, N\] = \[32, N\]"),
        (lambda: (cuda(64, 32), cuda(2, 32, 16), "sum"), r"^B: shape \(2, 32, 16\); expected \[K, N\]"),
        (lambda: (cuda(64, 32), weight_t(12, 32), "sum"), r"^B: N = 12 columns; expected a positive multiple of 8"),
        (lambda: (cuda(64, 32), cuda(32, 16), "sum"),
         r"^B: strides \(16, 1\) for shape \(32, 16\); expected \(1, 32\): the transpose of a row-major \[N, K\] "
         r"weight, e\.g\. weight\.t\(\) .*allow_copy_B=True"),
        (lambda: (cuda(64, 32), cuda(16, 64)[:, :32].t(), "sum"), r"^B: strides \(1, 64\) for shape \(32, 16\); expected \(1, 32\)"),
        (lambda: (cuda(64, 32), weight_t(16, 32), "avg"),
         r"^reduce_op: 'avg'; expected 'sum' \(mkernel's GEMM\+AllReduce sums; for 'avg' divide the sum"),
        (lambda: (cuda(64, 32), weight_t(16, 32), "max"), r"^reduce_op: 'max'; expected 'sum'"),
    ],
)
def test_all_reduce_bad_arguments_refused_naming_the_argument(fake_pg, fake_mode, make, message):
    A, B, reduce_op = make()
    with pytest.raises(mkernel.ArgumentError, match=message):
        torch.ops.mkernel.fused_matmul_all_reduce(A, B, reduce_op, fake_pg)


def test_all_reduce_allow_copy_B_must_be_a_bool():
    # The schema's bool refuses anything else before the op; the check itself names it too.
    with FakeTensorMode():
        with pytest.raises(mkernel.ArgumentError, match=r"^allow_copy_B: 1; expected a bool"):
            _layout.check_matmul_all_reduce(cuda(64, 32), weight_t(16, 32), "sum", allow_copy_B=1)


def test_all_reduce_devices_must_match(fake_pg, fake_mode):
    A = cuda(64, 32)
    B = torch.empty(16, 32, device="cuda:1", dtype=BF16).t()
    with pytest.raises(mkernel.ArgumentError, match=r"^B: device cuda:1; expected A's device cuda:0"):
        torch.ops.mkernel.fused_matmul_all_reduce(A, B, "sum", fake_pg)


def test_all_reduce_unknown_group_refused(fake_mode):
    with pytest.raises(mkernel.ArgumentError, match=r"^group_name: 'nobody' names neither a registered"):
        torch.ops.mkernel.fused_matmul_all_reduce(cuda(64, 32), weight_t(16, 32), "sum", "nobody")


AR_CASES = [
    # (A shape, N): torch's test sizes for the fused GEMM ops (BATCH 8, M 64, K 32, N 16), a 2-D
    # A, M not a multiple of the group's size (nor of 128: 63 and 15 rows), a 3-D and a 4-D A, a
    # single row, and the size of torch's native-kernel test.
    ((8, 64, 32), 16),
    ((64, 32), 16),
    ((63, 32), 16),
    ((3, 5, 32), 24),
    ((4, 8, 8, 32), 24),
    ((1, 32), 8),
    ((4096, 1024), 1024),
]


@pytest.mark.parametrize("fake_pg", [1, 2, 4], indirect=True)
@pytest.mark.parametrize("shape, N", AR_CASES)
def test_all_reduce_fake_output_matches_all_reduce_of_the_product(fake_pg, fake_mode, shape, N):
    A, B = cuda(*shape), weight_t(N, shape[-1])
    ours = torch.ops.mkernel.fused_matmul_all_reduce(A, B, "sum", fake_pg)
    theirs = torch.ops._c10d_functional.all_reduce(A @ B, "sum", fake_pg)
    assert (ours.shape, ours.stride(), ours.dtype, ours.device) == (theirs.shape, theirs.stride(), theirs.dtype, theirs.device)
    assert ours.shape == (*shape[:-1], N) and ours.is_contiguous()


def test_all_reduce_output_is_contiguous_for_any_a(fake_pg, fake_mode):
    # A transposed A (not contiguous: its rows are copied once) still gives torch's contiguous shape.
    A = cuda(32, 8, 64).transpose(0, 1)
    y = torch.ops.mkernel.fused_matmul_all_reduce(A, weight_t(24, 64), "sum", fake_pg)
    assert y.shape == (8, 32, 24) and y.is_contiguous()


def test_all_reduce_row_major_b_taken_with_allow_copy_B(fake_pg, fake_mode):
    C = mkernel.fused_matmul_all_reduce(cuda(64, 32), cuda(32, 16), "sum", fake_pg, allow_copy_B=True)
    assert C.shape == (64, 16)


def test_all_reduce_python_wrapper_takes_the_group_itself(fake_pg, fake_mode):
    C = mkernel.fused_matmul_all_reduce(cuda(8, 63, 32), weight_t(16, 32), "sum", dist.group.WORLD)
    assert C.shape == (8, 63, 16) and C.is_contiguous()


def test_all_reduce_torch_compile_traces_the_op_without_graph_breaks(fake_pg):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def layer(x, weight):
        y = mkernel.fused_matmul_all_reduce(torch.relu(x), weight.t(), "sum", fake_pg)
        return torch.relu(y) + 1

    with FakeTensorMode(allow_non_fake_inputs=True):
        x, weight = cuda(4, 33, 32), cuda(16, 32)
        y = torch.compile(layer, backend=backend, fullgraph=True)(x, weight)
    assert y.shape == (4, 33, 16)
    assert len(graphs) == 1
    assert "torch.ops.mkernel.fused_matmul_all_reduce" in graphs[0].code


def test_all_reduce_make_fx_records_the_op(fake_pg):
    from torch.fx.experimental.proxy_tensor import make_fx

    def layer(x, weight):
        return mkernel.fused_matmul_all_reduce(x, weight.t(), "sum", fake_pg)

    with FakeTensorMode():
        gm = make_fx(layer)(cuda(8, 5, 32), cuda(16, 32))
    assert "mkernel.fused_matmul_all_reduce.default" in gm.code


def test_all_reduce_rows_are_a_view_of_a_contiguous_a_and_the_result_a_view_of_the_output():
    A, B = torch.zeros(4, 6, 32), torch.zeros(32, 8)
    rows = _layout.rows_of(A, 0)
    assert rows.shape == (24, 32) and rows.data_ptr() == A.data_ptr()
    rows = _layout.rows_of(A.transpose(0, 1), 0)  # not packed: one copy
    assert rows.shape == (24, 32) and rows.data_ptr() != A.data_ptr()
    out, result = _layout.all_reduce_output_of(A, B)
    assert out.shape == (24, 8)
    r = result(out)
    assert r.shape == (4, 6, 8) and r.is_contiguous() and r.data_ptr() == out.data_ptr()


class _SmallComm:
    """Stands in for a registered Communicator: only what the ops read before launching."""

    closed = False
    size, nodes, device, rank = 2, 1, 0, 0
    workspace_bytes, network_workspace_bytes, fused_flags = 4096, 0, 65536


@needs_native
def test_all_reduce_communicator_too_small_is_named_with_the_size_to_make(fake_pg, fake_mode, monkeypatch):
    A, B = cuda(3, 100, 64), weight_t(128, 64)  # M = 300 rows
    need = mkernel.matmul_all_reduce_workspace_bytes(2, 300, 128)
    monkeypatch.setitem(communicator._registry, fake_pg, _SmallComm())
    with pytest.raises(mkernel.ArgumentError, match=rf"^A: this call needs an NVLink workspace of {need} bytes "
                                                    r"\(the partial tiles of the \[300, 128\] sum .* has 4096; make "
                                                    rf"it with workspace_bytes >= {need} "
                                                    r"\(mkernel.matmul_all_reduce_workspace_bytes\)"):
        ops._fused_matmul_all_reduce(A, B, "sum", fake_pg)
    small = _SmallComm()
    small.workspace_bytes, small.fused_flags = 1 << 30, 8
    monkeypatch.setitem(communicator._registry, fake_pg, small)
    flags = mkernel.matmul_all_reduce_fused_flags(2, 300, 128)
    with pytest.raises(mkernel.ArgumentError, match=rf"^A: this call needs {flags} fused-op flags; .* has 8; make it "
                                                    rf"with fused_flags >= {flags} "
                                                    r"\(mkernel.matmul_all_reduce_fused_flags\)"):
        ops._fused_matmul_all_reduce(A, B, "sum", fake_pg)
    # Two nodes of one GPU: no NVLink workspace, but a network one.
    nodes = _SmallComm()
    nodes.nodes = 2
    monkeypatch.setitem(communicator._registry, fake_pg, nodes)
    network = mkernel.matmul_all_reduce_network_bytes(2, 300, 128)
    with pytest.raises(mkernel.ArgumentError, match=rf"^A: this call needs a network workspace of {network} bytes "
                                                    rf"between 2 nodes; .* network_workspace_bytes >= {network} "
                                                    r"\(mkernel.matmul_all_reduce_network_bytes\)"):
        ops._fused_matmul_all_reduce(A, B, "sum", fake_pg)
    elsewhere = _SmallComm()
    elsewhere.workspace_bytes, elsewhere.device = 1 << 30, 1
    monkeypatch.setitem(communicator._registry, fake_pg, elsewhere)
    with pytest.raises(mkernel.ArgumentError, match=r"^A: device cuda:0; expected the communicator's device cuda:1 "
                                                    rf"\(rank 0 of '{fake_pg}'\)"):
        ops._fused_matmul_all_reduce(A, B, "sum", fake_pg)
