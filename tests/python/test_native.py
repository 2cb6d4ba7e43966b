"""The compiled module without torch and without a GPU: the arrays it refuses (each refusal
naming the argument), runtime errors as Python exceptions, bootstrap errors."""

from __future__ import annotations

import os

import pytest

import mkernel
from conftest import BF16, DL_CPU, DL_CUDA, F16, dl_array
from mkernel import _native


def test_package_imports_and_says_whether_the_module_is_there():
    try:
        from mkernel import _build_info  # written by the build
    except ImportError:
        pytest.skip("running from the source tree: no build to compare with")
    if _build_info.native_skipped_reason:
        assert not mkernel.native_available()
        assert _build_info.native_skipped_reason in mkernel.native_unavailable_reason
        with pytest.raises(mkernel.NotBuiltError, match="built without its compiled module"):
            mkernel.all_gather_matmul_workspace_bytes(2, 128, 256)
    else:
        assert mkernel.native_available(), mkernel.native_unavailable_reason
        assert mkernel.native_unavailable_reason == ""


def test_workspace_sizes(native):
    assert mkernel.all_gather_matmul_workspace_bytes(2, 4096, 8192) == 2 * 4096 * 8192 * 2
    assert mkernel.all_gather_matmul_network_bytes(1, 4096, 8192) == 0
    assert mkernel.all_gather_matmul_network_bytes(2, 4096, 8192) == 2 * 4096 * 8192 * 2


def test_reduce_scatter_sizes(native):
    # NVLink: (gpus - 1) node peers' partial tiles of the own node's bands, 128 x 256 bf16 each
    # (the widest tile: an upper bound); nothing with one GPU per node.
    tile = 128 * 256 * 2
    assert mkernel.matmul_reduce_scatter_workspace_bytes(2, 2048, 1024) == 1 * (2048 // 128) * (1024 // 256) * tile
    assert mkernel.matmul_reduce_scatter_workspace_bytes(8, 1024, 4096) == 7 * 8 * 16 * tile
    assert mkernel.matmul_reduce_scatter_workspace_bytes(1, 2048, 1024) == 0
    assert mkernel.matmul_reduce_scatter_workspace_bytes(2, 2048, 1024, nodes=2) == 0
    assert mkernel.matmul_reduce_scatter_network_bytes(1, 2048, 1024) == 0
    # Between nodes: a receive and a send slot per node, each the largest band's tiles plus one row of tiles.
    assert mkernel.matmul_reduce_scatter_network_bytes(2, 2048, 1024) == 2 * 2 * (2048 // 128 + 1) * 4 * tile
    # Flags: the node's bands' tiles once per node peer (counted for 128-wide tiles), after one per rank.
    assert mkernel.matmul_reduce_scatter_fused_flags(2, 2048, 1024) == max(2 + 16 * 8, 2 * 12)
    assert mkernel.matmul_reduce_scatter_fused_flags(8, 2048, 8192) == 8 + 7 * 16 * 64
    # Between nodes: the flag array's agreement area and arrivals, one per tile of a slot per node.
    assert mkernel.matmul_reduce_scatter_fused_flags(4, 2048, 1024, nodes=4) == 4 * 12 + 4 + 4 * 17 * 8
    assert mkernel.default_fused_flags() >= 4096
    with pytest.raises(mkernel.ArgumentError, match=r"^nodes: 3; expected a positive divisor of world = 8"):
        mkernel.matmul_reduce_scatter_workspace_bytes(8, 128, 128, nodes=3)
    with pytest.raises(mkernel.ArgumentError, match=r"^world: 0; expected a positive int"):
        mkernel.matmul_reduce_scatter_fused_flags(0, 128, 128)


def test_all_reduce_sizes(native):
    # NVLink: the reduce-scatter's staging of the node peers' partial tiles for M rows (bands of
    # M / world rows), plus a result slot per band of every rank: the largest band's m blocks plus
    # one, by the n blocks (counted for 256-wide tiles here; 128-wide ones need the same bytes).
    tile = 128 * 256 * 2
    assert mkernel.matmul_all_reduce_workspace_bytes(2, 4096, 1024) == (1 * 16 * 4 + 2 * 17 * 4) * tile
    assert mkernel.matmul_all_reduce_workspace_bytes(8, 8192, 4096) == (7 * 8 * 16 + 8 * 9 * 16) * tile
    # M not a multiple of world or of 128: bands of 50 rows in one m block.
    assert mkernel.matmul_all_reduce_workspace_bytes(2, 100, 64) == (1 * 1 + 2 * 2) * tile
    # A single row: one band is empty.
    assert mkernel.matmul_all_reduce_workspace_bytes(2, 1, 1024) == (1 * 4 + 2 * 2 * 4) * tile
    assert mkernel.matmul_all_reduce_workspace_bytes(1, 4096, 1024) == 0
    assert mkernel.matmul_all_reduce_workspace_bytes(2, 4096, 1024, nodes=2) == 0
    # Between nodes: the reduce-scatter's receive and send slots per node, a result receive slot
    # per node and one result send slot.
    assert mkernel.matmul_all_reduce_network_bytes(1, 4096, 1024) == 0
    assert mkernel.matmul_all_reduce_network_bytes(2, 4096, 1024) == (3 * 2 + 1) * (2048 // 128 + 1) * 4 * tile
    # Flags (counted for 128-wide tiles): one per rank, the staged tiles once per node peer, then
    # a result flag per tile of every band's slot.
    assert mkernel.matmul_all_reduce_fused_flags(2, 4096, 1024) == 2 + 1 * 16 * 8 + 2 * 17 * 8
    assert mkernel.matmul_all_reduce_fused_flags(1, 4096, 1024) == 1 + 33 * 8
    assert mkernel.matmul_all_reduce_fused_flags(8, 8192, 4096) == 8 + 7 * 8 * 32 + 8 * 9 * 32
    # Between nodes: the flag array's agreement area and arrivals, of partial and result tiles.
    assert mkernel.matmul_all_reduce_fused_flags(4, 2048, 1024, nodes=4) == 4 * 12 + 4 + 2 * 4 * 5 * 8
    # The same tiles as the reduce-scatter's: M = world x m_local rows need its staging and more.
    assert mkernel.matmul_all_reduce_workspace_bytes(2, 4096, 1024) > mkernel.matmul_reduce_scatter_workspace_bytes(
        2, 2048, 1024)
    with pytest.raises(mkernel.ArgumentError, match=r"^nodes: 3; expected a positive divisor of world = 8"):
        mkernel.matmul_all_reduce_workspace_bytes(8, 128, 128, nodes=3)
    with pytest.raises(mkernel.ArgumentError, match=r"^world: 0; expected a positive int"):
        mkernel.matmul_all_reduce_fused_flags(0, 128, 128)


def _args(m_local=64, n_local=32, k=128, world=2):
    return dict(
        a=dl_array([m_local, k]),
        w=dl_array([n_local, k]),
        out=dl_array([world * m_local, n_local]),
        gathered_out=dl_array([world * m_local, k]),
        world=world,
    )


def test_well_formed_arrays_pass(native):
    native.check_all_gather_gemm(**_args())
    args = _args()
    args["gathered_out"] = None
    native.check_all_gather_gemm(**args)


@pytest.mark.parametrize(
    "name, replacement, message",
    [
        ("a", dl_array([64, 128], dtype=F16), r"^a: dtype float16; expected bfloat16"),
        ("w", dl_array([32, 128], device=DL_CPU), r"^w: device cpu; expected a CUDA device"),
        ("a", dl_array([2, 64, 128]), r"^a: shape \(2, 64, 128\); expected a matrix"),
        ("a", dl_array([64, 128], [1, 64]), r"^a: strides \(1, 64\) for shape \(64, 128\); expected packed row-major \(128, 1\)"),
        ("w", dl_array([32, 128], [256, 1]), r"^w: strides \(256, 1\) .*expected packed row-major \(128, 1\)"),
        ("a", dl_array([64, 128], data=0x7F0000000008), r"^a: data at 0x7f0000000008 is not 16-byte aligned"),
        ("w", dl_array([32, 64]), r"^w: shape \(32, 64\); expected \(n_local, 128\)"),
        ("out", dl_array([64, 32]), r"^out: shape \(64, 32\); expected \(128, 32\) = \(world \* m_local, n_local\)"),
        ("gathered_out", dl_array([128, 64]), r"^gathered_out: shape \(128, 64\); expected \(128, 128\)"),
        ("out", dl_array([128, 32], device_id=1), r"^out: on CUDA device 1; expected a's device 0"),
        ("a", dl_array([0, 128]), r"^a: shape \(0, 128\); expected no empty dimension"),
    ],
)
def test_arrays_refused_name_the_argument(native, name, replacement, message):
    args = _args()
    args[name] = replacement
    with pytest.raises(mkernel.ArgumentError, match=message) as info:
        native.check_all_gather_gemm(**args)
    assert isinstance(info.value, ValueError)
    assert info.value.code == "invalid argument"


def test_rows_of_one_take_any_stride(native):
    # DLPack producers differ in the stride they give a dimension of size 1.
    args = _args(m_local=1)
    args["a"] = dl_array([1, 128], [999, 1])
    native.check_all_gather_gemm(**args)


def _rs_args(m_local=64, n=32, k=128, world=2):
    return dict(a=dl_array([world * m_local, k]), w=dl_array([n, k]), out=dl_array([m_local, n]), world=world)


def test_reduce_scatter_well_formed_arrays_pass(native):
    native.check_gemm_reduce_scatter(**_rs_args())
    native.check_gemm_reduce_scatter(**_rs_args(m_local=3, world=4))


@pytest.mark.parametrize(
    "name, replacement, message",
    [
        ("a", dl_array([128, 128], dtype=F16), r"^a: dtype float16; expected bfloat16"),
        ("w", dl_array([32, 128], device=DL_CPU), r"^w: device cpu; expected a CUDA device"),
        ("out", dl_array([64, 32], dtype=F16), r"^out: dtype float16; expected bfloat16"),
        ("a", dl_array([2, 64, 128]), r"^a: shape \(2, 64, 128\); expected a matrix"),
        ("a", dl_array([128, 128], [1, 128]), r"^a: strides \(1, 128\) for shape \(128, 128\); expected packed row-major"),
        ("w", dl_array([32, 128], [256, 1]), r"^w: strides \(256, 1\) .*expected packed row-major \(128, 1\)"),
        ("out", dl_array([64, 32], [64, 1]), r"^out: strides \(64, 1\) .*expected packed row-major \(32, 1\)"),
        ("w", dl_array([32, 128], data=0x7F0000000004), r"^w: data at 0x7f0000000004 is not 16-byte aligned"),
        ("a", dl_array([127, 128]), r"^a: 127 rows; expected M = world \* m_local, a multiple of world = 2"),
        ("w", dl_array([32, 64]), r"^w: shape \(32, 64\); expected \(n, 128\)"),
        ("out", dl_array([128, 32]), r"^out: shape \(128, 32\); expected \(64, 32\) = \(M / world, n\)"),
        ("out", dl_array([64, 16]), r"^out: shape \(64, 16\); expected \(64, 32\)"),
        ("w", dl_array([32, 128], device_id=1), r"^w: on CUDA device 1; expected a's device 0"),
        ("out", dl_array([0, 32]), r"^out: shape \(0, 32\); expected no empty dimension"),
    ],
)
def test_reduce_scatter_arrays_refused_name_the_argument(native, name, replacement, message):
    args = _rs_args()
    args[name] = replacement
    with pytest.raises(mkernel.ArgumentError, match=message) as info:
        native.check_gemm_reduce_scatter(**args)
    assert isinstance(info.value, ValueError)
    assert info.value.code == "invalid argument"


def _ar_args(m=64, n=32, k=128):
    return dict(a=dl_array([m, k]), w=dl_array([n, k]), out=dl_array([m, n]))


def test_all_reduce_well_formed_arrays_pass(native):
    native.check_gemm_all_reduce(**_ar_args())
    # Any M: not a multiple of the group's size (which the check does not take) nor of 128.
    native.check_gemm_all_reduce(**_ar_args(m=3))
    native.check_gemm_all_reduce(**_ar_args(m=1))
    args = _ar_args(m=1)
    args["a"] = dl_array([1, 128], [999, 1])  # a row of one takes any stride
    native.check_gemm_all_reduce(**args)


@pytest.mark.parametrize(
    "name, replacement, message",
    [
        ("a", dl_array([64, 128], dtype=F16), r"^a: dtype float16; expected bfloat16"),
        ("w", dl_array([32, 128], device=DL_CPU), r"^w: device cpu; expected a CUDA device"),
        ("out", dl_array([64, 32], dtype=F16), r"^out: dtype float16; expected bfloat16"),
        ("a", dl_array([2, 64, 128]), r"^a: shape \(2, 64, 128\); expected a matrix"),
        ("a", dl_array([64, 128], [1, 64]), r"^a: strides \(1, 64\) for shape \(64, 128\); expected packed row-major"),
        ("w", dl_array([32, 128], [256, 1]), r"^w: strides \(256, 1\) .*expected packed row-major \(128, 1\)"),
        ("out", dl_array([64, 32], [64, 1]), r"^out: strides \(64, 1\) .*expected packed row-major \(32, 1\)"),
        ("a", dl_array([64, 128], data=0x7F0000000008), r"^a: data at 0x7f0000000008 is not 16-byte aligned"),
        ("w", dl_array([32, 64]), r"^w: shape \(32, 64\); expected \(n, 128\): its rows are k = 128 long like a's"),
        ("out", dl_array([32, 32]), r"^out: shape \(32, 32\); expected \(64, 32\) = \(M, n\)"),
        ("out", dl_array([64, 16]), r"^out: shape \(64, 16\); expected \(64, 32\) = \(M, n\)"),
        ("w", dl_array([32, 128], device_id=1), r"^w: on CUDA device 1; expected a's device 0"),
        ("out", dl_array([64, 32], device_id=2), r"^out: on CUDA device 2; expected a's device 0"),
        ("a", dl_array([0, 128]), r"^a: shape \(0, 128\); expected no empty dimension"),
    ],
)
def test_all_reduce_arrays_refused_name_the_argument(native, name, replacement, message):
    args = _ar_args()
    args[name] = replacement
    with pytest.raises(mkernel.ArgumentError, match=message) as info:
        native.check_gemm_all_reduce(**args)
    assert isinstance(info.value, ValueError)
    assert info.value.code == "invalid argument"


def test_all_reduce_communicator_calls_are_bound(native):
    # What mkernel.Communicator and the op call (a communicator needs a daemon: tests/gpu/python).
    cls = native.Communicator
    for name in ("plan_all_reduce", "has_all_reduce_plan", "describe_all_reduce", "gemm_all_reduce"):
        assert callable(getattr(cls, name, None)), name
    assert cls.plan_all_reduce.__doc__.startswith("plan_all_reduce(self, m: int, n: int, k: int, stream: int = 0)")
    assert cls.gemm_all_reduce.__doc__.startswith("gemm_all_reduce(self, a: ")



def test_communicator_all_reduce_methods_reach_the_module():
    calls = []

    class Native:  # stands in for mkernel._C.Communicator
        closed = False
        device = 0

        def plan_all_reduce(self, *args):
            calls.append(("plan_all_reduce", args))

        def has_all_reduce_plan(self, *args):
            calls.append(("has_all_reduce_plan", args))
            return True

        def describe_all_reduce(self, *args):
            calls.append(("describe_all_reduce", args))
            return "a plan"

    comm = mkernel.Communicator(Native(), "stub")
    comm.plan_matmul_all_reduce(333, 1024, 512, stream=7)
    assert comm.has_matmul_all_reduce_plan(333, 1024, 512) is True
    assert comm.describe_matmul_all_reduce(333, 1024, 512) == "a plan"
    assert calls == [("plan_all_reduce", (333, 1024, 512, 7)), ("has_all_reduce_plan", (333, 1024, 512)),
                     ("describe_all_reduce", (333, 1024, 512))]


# ---- MoE and ring attention arrays --------------------------------------------------------------

I32, U32, F32 = (0, 32), (1, 32), (2, 32)


def _moe_args(tokens=64, hidden=128, top_k=2, rows=256, epr=2):
    return dict(
        x=dl_array([tokens, hidden]),
        topk_ids=dl_array([tokens, top_k], dtype=I32),
        topk_weights=dl_array([tokens, top_k], dtype=F32),
        x_expert=dl_array([rows, hidden]),
        expert_offsets=dl_array([epr + 1], dtype=I32),
        row_source=dl_array([rows], dtype=I32),
        row_token=dl_array([rows], dtype=I32),
        row_score=dl_array([rows], dtype=F32),
    )


def test_moe_well_formed_arrays_pass(native):
    native.check_moe_dispatch(**_moe_args())
    args = _moe_args()
    args.update(row_source=None, row_token=None, row_score=None, expert_offsets=dl_array([3], dtype=U32))
    native.check_moe_dispatch(**args)
    native.check_moe_combine(dl_array([256, 64]), dl_array([64, 64]))
    native.check_moe_forward(dl_array([64, 128]), dl_array([64, 2], dtype=I32), dl_array([64, 2], dtype=F32),
                             dl_array([2, 32, 128]), dl_array([64, 32]))


@pytest.mark.parametrize(
    "name, replacement, message",
    [
        ("x", dl_array([64, 128], dtype=F16), r"^x: dtype float16; expected bfloat16"),
        ("topk_ids", dl_array([64, 2], dtype=(0, 64)), r"^topk_ids: dtype int64; expected int32"),
        ("topk_weights", dl_array([64, 2], dtype=BF16), r"^topk_weights: dtype bfloat16; expected float32"),
        ("topk_ids", dl_array([32, 2], dtype=I32), r"^topk_ids: shape \(32, 2\); expected \(64, top_k\)"),
        ("topk_weights", dl_array([64, 3], dtype=F32), r"^topk_weights: shape \(64, 3\); expected \(64, 2\)"),
        ("x_expert", dl_array([256, 64]), r"^x_expert: shape \(256, 64\); expected \(256, 128\)"),
        ("x_expert", dl_array([256, 128], [256, 1]), r"^x_expert: strides \(256, 1\) for shape \(256, 128\); expected packed \(128, 1\)"),
        ("expert_offsets", dl_array([3], dtype=F32), r"^expert_offsets: dtype float32; expected int32 or uint32"),
        ("expert_offsets", dl_array([3, 1], dtype=I32), r"^expert_offsets: shape \(3, 1\); expected 1 dimension"),
        ("row_source", dl_array([255], dtype=I32), r"^row_source: shape \(255,\); expected \(256,\)"),
        ("row_score", dl_array([256], dtype=I32), r"^row_score: dtype int32; expected float32"),
        ("row_token", dl_array([256], dtype=I32, device=DL_CPU), r"^row_token: device cpu; expected a CUDA device"),
        ("row_token", dl_array([256], dtype=I32, device_id=1), r"^row_token: on CUDA device 1; expected x's device 0"),
        ("topk_ids", dl_array([64, 2], dtype=I32, data=0x7F0000000004), r"^topk_ids: data at 0x7f0000000004 is not 16-byte aligned"),
        ("x", dl_array([0, 128]), r"^x: shape \(0, 128\); expected no empty dimension"),
    ],
)
def test_moe_dispatch_arrays_refused_name_the_argument(native, name, replacement, message):
    args = _moe_args()
    args[name] = replacement
    with pytest.raises(mkernel.ArgumentError, match=message):
        native.check_moe_dispatch(**args)


def test_moe_combine_and_forward_arrays_refused_name_the_argument(native):
    with pytest.raises(mkernel.ArgumentError, match=r"^out: shape \(64, 32\); expected \(tokens, 64\)"):
        native.check_moe_combine(dl_array([256, 64]), dl_array([64, 32]))
    with pytest.raises(mkernel.ArgumentError, match=r"^y_expert: dtype float32; expected bfloat16"):
        native.check_moe_combine(dl_array([256, 64], dtype=F32), dl_array([64, 64]))

    def routing():  # a capsule is consumed by the call it is given to
        return dl_array([64, 128]), dl_array([64, 2], dtype=I32), dl_array([64, 2], dtype=F32)

    with pytest.raises(mkernel.ArgumentError, match=r"^w: shape \(2, 32, 64\); expected \(experts_per_rank, out_hidden, 128\)"):
        native.check_moe_forward(*routing(), dl_array([2, 32, 64]), dl_array([64, 32]))
    with pytest.raises(mkernel.ArgumentError, match=r"^w: shape \(32, 128\); expected 3 dimensions"):
        native.check_moe_forward(*routing(), dl_array([32, 128]), dl_array([64, 32]))
    with pytest.raises(mkernel.ArgumentError, match=r"^out: shape \(64, 16\); expected \(64, 32\)"):
        native.check_moe_forward(*routing(), dl_array([2, 32, 128]), dl_array([64, 16]))


def test_moe_mlp_arrays_checked_naming_the_argument(native):
    def routing():  # a capsule is consumed by the call it is given to
        return dl_array([64, 128]), dl_array([64, 2], dtype=I32), dl_array([64, 2], dtype=F32)

    native.check_moe_mlp(*routing(), dl_array([2, 64, 128]), dl_array([2, 128, 32]), dl_array([64, 128]))
    native.check_moe_mlp(*routing(), dl_array([2, 32, 128]), dl_array([2, 128, 32]), dl_array([64, 128]), "relu")
    with pytest.raises(mkernel.ArgumentError, match=r"^w1: shape \(2, 32, 128\); expected \(2, 64, 128\) = \(experts_per_rank, 2 x inter"):
        native.check_moe_mlp(*routing(), dl_array([2, 32, 128]), dl_array([2, 128, 32]), dl_array([64, 128]))
    with pytest.raises(mkernel.ArgumentError, match=r"^w1: shape \(2, 64, 128\); expected \(2, 32, 128\) = \(experts_per_rank, inter, hidden\)"):
        native.check_moe_mlp(*routing(), dl_array([2, 64, 128]), dl_array([2, 128, 32]), dl_array([64, 128]), "gelu")
    with pytest.raises(mkernel.ArgumentError, match=r"^w2: shape \(2, 64, 32\); expected \(experts_per_rank, 128, inter\)"):
        native.check_moe_mlp(*routing(), dl_array([2, 64, 128]), dl_array([2, 64, 32]), dl_array([64, 128]))
    with pytest.raises(mkernel.ArgumentError, match=r"^w2: shape \(2, 128, 12\); expected .*inter a multiple of 8"):
        native.check_moe_mlp(*routing(), dl_array([2, 24, 128]), dl_array([2, 128, 12]), dl_array([64, 128]))
    with pytest.raises(mkernel.ArgumentError, match=r"^out: shape \(64, 32\); expected \(64, 128\) = \(tokens, hidden\)"):
        native.check_moe_mlp(*routing(), dl_array([2, 64, 128]), dl_array([2, 128, 32]), dl_array([64, 32]))
    with pytest.raises(mkernel.ArgumentError, match=r"^w1: dtype float32; expected bfloat16"):
        native.check_moe_mlp(*routing(), dl_array([2, 64, 128], dtype=F32), dl_array([2, 128, 32]), dl_array([64, 128]))
    with pytest.raises(mkernel.ArgumentError, match=r"^activation: 'tanh'; expected 'swiglu', 'geglu', 'silu', 'gelu' or 'relu'"):
        native.check_moe_mlp(*routing(), dl_array([2, 64, 128]), dl_array([2, 128, 32]), dl_array([64, 128]), "tanh")


def _ring_args(B=2, Hq=8, Hkv=2, S=64, D=128, layout="bhsd"):
    def t(H, dtype=BF16):
        return dl_array([B, H, S, D] if layout == "bhsd" else [B, S, H, D], dtype=dtype)

    return dict(q=t(Hq), k=t(Hkv), v=t(Hkv), out=t(Hq), lse=dl_array([B, Hq, S], dtype=F32), layout=layout)


def test_ring_well_formed_arrays_pass(native):
    native.check_ring_attention(**_ring_args())
    native.check_ring_attention(**_ring_args(layout="bshd"))


@pytest.mark.parametrize(
    "name, replacement, message",
    [
        ("q", dl_array([2, 8, 64, 128], dtype=F16), r"^q: dtype float16; expected bfloat16"),
        ("k", dl_array([2, 2, 32, 128]), r"^k: shape \(2, 2, 32, 128\); expected \[B, H, S, D\] with B, S and D of q"),
        ("v", dl_array([2, 4, 64, 128]), r"^v: shape \(2, 4, 64, 128\); expected \(2, 2, 64, 128\) = k's shape"),
        ("out", dl_array([2, 8, 64, 64]), r"^out: shape \(2, 8, 64, 64\); expected \(2, 8, 64, 128\)"),
        ("lse", dl_array([2, 8, 64], dtype=BF16), r"^lse: dtype bfloat16; expected float32"),
        ("lse", dl_array([2, 64, 8], dtype=F32), r"^lse: shape \(2, 64, 8\); expected \(2, 8, 64\) = \(B, Hq, S\)"),
        ("q", dl_array([2, 8, 64, 128], [65536, 128, 1024, 1]), r"^q: strides \(65536, 128, 1024, 1\) for shape \(2, 8, 64, 128\); expected packed \(65536, 8192, 128, 1\)"),
        ("layout", "sbhd", r"^layout: 'sbhd'; expected 'bhsd' or 'bshd'"),
        ("v", dl_array([2, 2, 64, 128], device_id=1), r"^v: on CUDA device 1; expected q's device 0"),
    ],
)
def test_ring_arrays_refused_name_the_argument(native, name, replacement, message):
    args = _ring_args()
    args[name] = replacement
    with pytest.raises(mkernel.ArgumentError, match=message):
        native.check_ring_attention(**args)


def test_runtime_status_becomes_an_exception_with_code_and_origin(native, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "MKERNEL_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(mkernel.ArgumentError) as info:
        native.Communicator.create_from_env(nvlink_bytes=1 << 20)
    e = info.value
    assert e.code == "invalid argument"
    assert e.message == "RANK: not set; expected a number"
    assert "runtime.cc:" in e.where
    assert str(e).startswith("RANK: not set; expected a number [invalid argument, at runtime.cc:")


def test_from_env_names_a_short_token(native, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("MKERNEL_TOKEN", "short")
    with pytest.raises(mkernel.ArgumentError, match=r"^MKERNEL_TOKEN: 5 bytes; expected the communicator's secret"):
        mkernel.Communicator.from_env(workspace_bytes=1 << 20, register=False)


def test_unique_id_names_the_daemon_socket(native, tmp_path):
    sock = str(tmp_path / "absent.sock")
    with pytest.raises(mkernel.MkernelError, match=f"cannot connect to mkerneld at {sock}") as info:
        native.get_unique_id(sock)
    assert info.value.code == "unavailable"
    assert not isinstance(info.value, ValueError)


def test_bad_unique_id_text(native):
    with pytest.raises(mkernel.ArgumentError, match="unique id"):
        native.Communicator.create(0, 2, "not an id", nvlink_bytes=1 << 20)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(workspace_bytes=0), r"^workspace_bytes: 0; expected an integer number of bytes >= 1"),
        (dict(workspace_bytes=1 << 20, network_workspace_bytes=-1), r"^network_workspace_bytes: -1"),
        (dict(workspace_bytes=1 << 20, rendezvous_timeout=0), r"^rendezvous_timeout: 0; expected a positive time"),
        (dict(workspace_bytes=1 << 20, gpu_memory="sometimes"), r"^gpu_memory: 'sometimes'; expected 'auto'"),
        (dict(workspace_bytes=1 << 20, fused_flags=0), r"^fused_flags: 0; expected None \(libmkernel's default\)"),
        (dict(workspace_bytes=1 << 20, fused_flags=1.5), r"^fused_flags: 1.5; expected None"),
        (dict(workspace_bytes=1 << 20, adaptive_split="yes"), r"^adaptive_split: 'yes'; expected True or False"),
        (dict(workspace_bytes=1 << 20, adaptive_split=1), r"^adaptive_split: 1; expected True or False"),
    ],
)
def test_communicator_options_refused_before_the_runtime(native, kwargs, message):
    with pytest.raises(mkernel.ArgumentError, match=message):
        mkernel.Communicator.from_env(register=False, **kwargs)


def test_errors_module_maps_codes():
    from mkernel import _errors

    e = _errors.from_status("deadline exceeded", "rank 0, launch 2, GEMM waiting: a wait expired", "comm.cuh:1")
    assert type(e) is mkernel.MkernelError and isinstance(e, RuntimeError)
    assert str(e) == "rank 0, launch 2, GEMM waiting: a wait expired [deadline exceeded, at comm.cuh:1]"
    assert isinstance(_errors.from_status("invalid argument", "k: 3", "x.cc:1"), mkernel.ArgumentError)
    assert str(_errors.argument_error("a: bad")) == "a: bad"


def test_reason_when_the_module_is_missing(monkeypatch):
    monkeypatch.setattr(_native, "native", None)
    monkeypatch.setattr(_native, "unavailable_reason", "mkernel was built without its compiled module: no CUDA")
    with pytest.raises(mkernel.NotBuiltError, match="no CUDA"):
        mkernel.Communicator.from_env(workspace_bytes=1 << 20)
    assert os.path.basename(_native.__file__) == "_native.py"


def test_module_built_for_another_python_is_named(native, tmp_path):
    import shutil
    import subprocess
    import sys

    staged = os.path.dirname(mkernel.__file__)
    copy = tmp_path / "mkernel"
    shutil.copytree(staged, copy, ignore=shutil.ignore_patterns("__pycache__", "_C*"))
    (copy / "_C.cpython-39-x86_64-linux-gnu.so").write_bytes(b"")  # no Python 3.9 runs this test
    # cwd: the copy must be the only mkernel in reach (ctest runs this in the staging directory).
    done = subprocess.run([sys.executable, "-c", "import mkernel; print(mkernel.__file__, mkernel.native_unavailable_reason)"],
                          env=dict(os.environ, PYTHONPATH=str(tmp_path)), cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(copy)), done.stdout
    assert "_C.cpython-39-x86_64-linux-gnu.so was built for another Python; this is Python" in done.stdout
