"""torch.ops.mkernel's MoE (moe_dispatch, moe_combine, moe_forward, moe_mlp) and ring_attention without a
GPU: registration, the arguments refused (naming them), the fake implementations' shapes and
dtypes, tracing by torch.compile and make_fx, communicator sizes, the zigzag placement.

As in test_torch_ops.py, CUDA tensors are fake (FakeTensorMode) and the process group is torch's
"fake" backend. Results on GPUs are tests/gpu/python's job.
"""

from __future__ import annotations

import pytest

from conftest import HAVE_TORCH, needs_native

if not HAVE_TORCH:
    pytest.skip("torch is not installed (scripts/install-deps.sh installs it)", allow_module_level=True)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import mkernel  # noqa: E402
from mkernel import _moe, _ring, communicator, ops  # noqa: E402

BF16, I32, I64, F32 = torch.bfloat16, torch.int32, torch.int64, torch.float32


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


def routing(tokens=64, top_k=2, ids=I32):
    return cuda(tokens, top_k, dtype=ids), cuda(tokens, top_k, dtype=F32)


def schema_args(op):
    return [(a.name, str(a.type), a.kwarg_only) for a in op.default._schema.arguments]


# ---- registration -------------------------------------------------------------------------------


def test_moe_and_ring_ops_are_registered_with_their_schemas():
    assert schema_args(torch.ops.mkernel.moe_dispatch) == [
        ("x", "Tensor", False), ("topk_ids", "Tensor", False), ("topk_weights", "Tensor", False),
        ("num_experts", "int", False), ("group_name", "str", False), ("out_hidden", "Optional[int]", True),
        ("recv_tokens_per_source", "Optional[int]", True), ("expert_rows_capacity", "Optional[int]", True),
        ("apply_scores", "bool", True),
    ]
    assert len(torch.ops.mkernel.moe_dispatch.default._schema.returns) == 5
    assert schema_args(torch.ops.mkernel.moe_combine) == [
        ("y_expert", "Tensor", False), ("group_name", "str", False), ("num_tokens", "int", True)]
    assert schema_args(torch.ops.mkernel.moe_forward)[:5] == [
        ("x", "Tensor", False), ("topk_ids", "Tensor", False), ("topk_weights", "Tensor", False),
        ("w", "Tensor", False), ("group_name", "str", False)]
    assert schema_args(torch.ops.mkernel.moe_mlp) == [
        ("x", "Tensor", False), ("topk_ids", "Tensor", False), ("topk_weights", "Tensor", False),
        ("w1", "Tensor", False), ("w2", "Tensor", False), ("group_name", "str", False), ("activation", "str", True),
        ("recv_tokens_per_source", "Optional[int]", True), ("expert_rows_capacity", "Optional[int]", True),
        ("apply_scores", "bool", True),
    ]
    assert schema_args(torch.ops.mkernel.ring_attention) == [
        ("q", "Tensor", False), ("k", "Tensor", False), ("v", "Tensor", False), ("group_name", "str", False),
        ("causal", "bool", True), ("layout", "str", True), ("placement", "str", True), ("scale", "Optional[float]", True),
    ]
    assert len(torch.ops.mkernel.ring_attention.default._schema.returns) == 2
    for name in ("moe_dispatch", "moe_combine", "moe_forward", "moe_mlp", "ring_attention"):
        assert getattr(mkernel, name).__module__ == "mkernel.ops"


def test_cpu_tensors_refused_naming_the_device():
    x = torch.zeros(4, 16, dtype=BF16)
    ids, weights = torch.zeros(4, 2, dtype=I32), torch.zeros(4, 2, dtype=F32)
    with pytest.raises(mkernel.ArgumentError, match=r"^x: device cpu; expected a CUDA tensor"):
        torch.ops.mkernel.moe_dispatch(x, ids, weights, 4, "0")
    with pytest.raises(mkernel.ArgumentError, match=r"^y_expert: device cpu; expected a CUDA tensor"):
        torch.ops.mkernel.moe_combine(x, "0", num_tokens=4)
    with pytest.raises(mkernel.ArgumentError, match=r"^x: device cpu"):
        torch.ops.mkernel.moe_forward(x, ids, weights, torch.zeros(2, 8, 16, dtype=BF16), "0")
    with pytest.raises(mkernel.ArgumentError, match=r"^x: device cpu"):
        torch.ops.mkernel.moe_mlp(x, ids, weights, torch.zeros(2, 16, 16, dtype=BF16), torch.zeros(2, 16, 8, dtype=BF16), "0")
    q = torch.zeros(1, 2, 8, 64, dtype=BF16)
    with pytest.raises(mkernel.ArgumentError, match=r"^q: device cpu; expected a CUDA tensor"):
        torch.ops.mkernel.ring_attention(q, q, q, "0")


# ---- moe_dispatch -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: (cuda(64, 32, dtype=torch.float16), *routing(), 4, {}), r"^x: dtype torch.float16; expected torch.bfloat16"),
        (lambda: (cuda(64), *routing(), 4, {}), r"^x: shape \(64,\); expected \[num_tokens, hidden\]"),
        (lambda: (cuda(64, 12), *routing(), 4, {}), r"^x: hidden = 12 \(last dimension\); expected a multiple of 8"),
        (lambda: (cuda(0, 32), *routing(0), 4, {}), r"^x: shape \(0, 32\); expected no empty dimension"),
        (lambda: (cuda(64, 32), cuda(64, 2, dtype=torch.int16), cuda(64, 2, dtype=F32), 4, {}),
         r"^topk_ids: dtype torch.int16; expected torch.int32 or torch.int64"),
        (lambda: (cuda(64, 32), *routing(32), 4, {}), r"^topk_ids: shape \(32, 2\); expected \[num_tokens, top_k\] = \[64, top_k\]"),
        (lambda: (cuda(64, 32), cuda(64, 2, dtype=I32), cuda(64, 2, dtype=BF16), 4, {}),
         r"^topk_weights: dtype torch.bfloat16; expected torch.float32 .*\.float\(\)"),
        (lambda: (cuda(64, 32), cuda(64, 2, dtype=I32), cuda(64, 3, dtype=F32), 4, {}),
         r"^topk_weights: shape \(64, 3\); expected topk_ids' shape \(64, 2\)"),
        (lambda: (cuda(64, 32), *routing(), 5, {}), r"^num_experts: 5; expected a positive multiple of the group's size 2"),
        (lambda: (cuda(64, 32), *routing(), 0, {}), r"^num_experts: 0; expected a positive multiple"),
        (lambda: (cuda(64, 32), *routing(top_k=6), 4, {}), r"^topk_ids: top_k = 6 choices per token; expected 1 \.\. 4"),
        (lambda: (cuda(64, 32), *routing(), 4, dict(out_hidden=12)), r"^out_hidden: 12; expected None \(= hidden, 32\)"),
        (lambda: (cuda(64, 32), *routing(), 4, dict(recv_tokens_per_source=65)),
         r"^recv_tokens_per_source: 65; expected None \(the worst case, num_tokens.*\) or 1 \.\. 64"),
        (lambda: (cuda(64, 32), *routing(), 4, dict(recv_tokens_per_source=0)), r"^recv_tokens_per_source: 0"),
        (lambda: (cuda(64, 32), *routing(), 4, dict(expert_rows_capacity=257)),
         r"^expert_rows_capacity: 257; expected None \(the worst case, 256 rows.*\) or 1 \.\. 256"),
    ],
)
def test_dispatch_bad_arguments_refused_naming_the_argument(fake_pg, fake_mode, make, message):
    x, ids, weights, experts, kw = make()
    with pytest.raises(mkernel.ArgumentError, match=message):
        torch.ops.mkernel.moe_dispatch(x, ids, weights, experts, fake_pg, **kw)


def test_dispatch_devices_must_match(fake_pg, fake_mode):
    ids = torch.empty(64, 2, device="cuda:1", dtype=I32)
    with pytest.raises(mkernel.ArgumentError, match=r"^topk_ids: device cuda:1; expected x's device cuda:0"):
        torch.ops.mkernel.moe_dispatch(cuda(64, 32), ids, cuda(64, 2, dtype=F32), 4, fake_pg)


def test_dispatch_unknown_group_refused(fake_mode):
    with pytest.raises(mkernel.ArgumentError, match=r"^group_name: 'nobody' names neither a registered"):
        torch.ops.mkernel.moe_dispatch(cuda(64, 32), *routing(), 4, "nobody")


DISPATCH_CASES = [
    # (tokens, hidden, experts per rank, top_k, keyword arguments, expected rows at world W)
    (64, 32, 2, 2, {}, lambda W: W * 64 * 2),
    (64, 32, 1, 2, {}, lambda W: W * 64 * 1),  # one expert per rank: a token lands once per rank
    (64, 32, 4, 8, {}, lambda W: W * 64 * 4),
    (64, 32, 2, 2, dict(recv_tokens_per_source=16), lambda W: W * 16 * 2),
    (64, 32, 2, 2, dict(expert_rows_capacity=100), lambda W: 100),
    (7, 1024, 8, 1, dict(out_hidden=4096), lambda W: W * 7),
]


@pytest.mark.parametrize("fake_pg", [2, 4], indirect=True)
@pytest.mark.parametrize("tokens, hidden, epr, top_k, kw, rows", DISPATCH_CASES)
@pytest.mark.parametrize("ids_dtype", [I32, I64])
def test_dispatch_fake_outputs(fake_pg, fake_mode, tokens, hidden, epr, top_k, kw, rows, ids_dtype):
    world = dist.get_world_size()
    x = cuda(tokens, hidden)
    outs = torch.ops.mkernel.moe_dispatch(x, *routing(tokens, top_k, ids_dtype), epr * world, fake_pg, **kw)
    x_expert, offsets, row_source, row_token, row_score = outs
    R = rows(world)
    assert (tuple(x_expert.shape), x_expert.dtype, x_expert.device) == ((R, hidden), BF16, x.device)
    assert (tuple(offsets.shape), offsets.dtype) == ((epr + 1,), I32)
    assert (tuple(row_source.shape), row_source.dtype) == ((R,), I32)
    assert (tuple(row_token.shape), row_token.dtype) == ((R,), I32)
    assert (tuple(row_score.shape), row_score.dtype) == ((R,), F32)
    # combine of those rows: [tokens, out_hidden]
    out_hidden = kw.get("out_hidden", hidden)
    y = torch.ops.mkernel.moe_combine(cuda(R, out_hidden), fake_pg, num_tokens=tokens)
    assert (tuple(y.shape), y.dtype) == ((tokens, out_hidden), BF16)


def test_rows_capacity_is_the_runtimes_rule():
    # libmkernel's MoeGeometry::rows_capacity: expert_rows_capacity, else world x capacity x
    # min(top_k, experts per rank), capacity = recv_tokens_per_source or tokens.
    assert _moe.rows_capacity(4096, 8, 32, 8, 0, 0) == 8 * 4096 * 8
    assert _moe.rows_capacity(4096, 8, 4, 8, 0, 0) == 8 * 4096 * 4
    assert _moe.rows_capacity(4096, 8, 32, 8, 1024, 0) == 8 * 1024 * 8
    assert _moe.rows_capacity(4096, 8, 32, 8, 1024, 5000) == 5000


# ---- moe_combine --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: (cuda(256, 32, dtype=F32), 64), r"^y_expert: dtype torch.float32; expected torch.bfloat16"),
        (lambda: (cuda(256), 64), r"^y_expert: shape \(256,\); expected \[rows, out_hidden\]"),
        (lambda: (cuda(256, 12), 64), r"^y_expert: out_hidden = 12; expected a multiple of 8"),
        (lambda: (cuda(256, 32), 0), r"^num_tokens: 0; expected the dispatch's number of tokens"),
        (lambda: (cuda(256, 32), -1), r"^num_tokens: -1; expected"),
    ],
)
def test_combine_bad_arguments_refused_naming_the_argument(fake_pg, fake_mode, make, message):
    y, num_tokens = make()
    with pytest.raises(mkernel.ArgumentError, match=message):
        torch.ops.mkernel.moe_combine(y, fake_pg, num_tokens=num_tokens)


def test_combine_without_a_dispatch_is_refused(fake_pg, fake_mode):
    # The real implementation: no communicator on the group, so no dispatch ran on it.
    with pytest.raises(mkernel.MkernelError, match=r"^moe_combine: no mkernel.Communicator for '.*'; expected "
                                                   r"moe_dispatch on that group first") as info:
        ops._moe_combine(cuda(256, 32), fake_pg, num_tokens=64)
    assert info.value.code == "failed precondition" and not isinstance(info.value, ValueError)


# ---- moe_forward --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: (cuda(64, 32), *routing(), cuda(2, 16, 32, dtype=torch.float16)), r"^w: dtype torch.float16; expected torch.bfloat16"),
        (lambda: (cuda(64, 32), *routing(), cuda(16, 32)), r"^w: shape \(16, 32\); expected \[experts_per_rank, out_hidden, hidden\] = \[E / world, out_hidden, 32\]"),
        (lambda: (cuda(64, 32), *routing(), cuda(2, 16, 64)), r"^w: shape \(2, 16, 64\); expected"),
        (lambda: (cuda(64, 32), *routing(), cuda(2, 12, 32)), r"^w: out_hidden = 12; expected a multiple of 8"),
        (lambda: (cuda(64, 32), *routing(), cuda(2, 32, 16).transpose(1, 2)),
         r"^w: strides \(512, 1, 16\) for shape \(2, 16, 32\); expected packed \(512, 32, 1\)"),
        (lambda: (cuda(64, 32), *routing(top_k=3), cuda(1, 16, 32)), r"^topk_ids: top_k = 3 choices per token; expected 1 \.\. 2"),
        (lambda: (cuda(64, 12), *routing(), cuda(2, 16, 12)), r"^x: hidden = 12"),
    ],
)
def test_forward_bad_arguments_refused_naming_the_argument(fake_pg, fake_mode, make, message):
    x, ids, weights, w = make()
    with pytest.raises(mkernel.ArgumentError, match=message):
        torch.ops.mkernel.moe_forward(x, ids, weights, w, fake_pg)


@pytest.mark.parametrize("fake_pg", [2, 4], indirect=True)
@pytest.mark.parametrize("ids_dtype", [I32, I64])
def test_forward_fake_output(fake_pg, fake_mode, ids_dtype):
    x, w = cuda(48, 256), cuda(3, 512, 256)
    out = torch.ops.mkernel.moe_forward(x, *routing(48, 4, ids_dtype), w, fake_pg, recv_tokens_per_source=16)
    assert (tuple(out.shape), out.dtype, out.device, out.is_contiguous()) == ((48, 512), BF16, x.device, True)


# ---- moe_mlp ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: (cuda(64, 32), *routing(), cuda(2, 32, 32, dtype=torch.float16), cuda(2, 32, 16), {}),
         r"^w1: dtype torch.float16; expected torch.bfloat16"),
        (lambda: (cuda(64, 32), *routing(), cuda(2, 32, 32), cuda(2, 32, 16, dtype=F32), {}),
         r"^w2: dtype torch.float32; expected torch.bfloat16"),
        (lambda: (cuda(64, 32), *routing(), cuda(2, 32, 32), cuda(2, 64, 16), {}),
         r"^w2: shape \(2, 64, 16\); expected \[experts_per_rank, hidden, inter\] = \[E / world, 32, inter\]"),
        (lambda: (cuda(64, 32), *routing(), cuda(2, 24, 32), cuda(2, 32, 12), {}),
         r"^w2: inter = 12 \(last dimension\); expected a multiple of 8"),
        (lambda: (cuda(64, 32), *routing(), cuda(2, 16, 32), cuda(2, 32, 16), {}),
         r"^w1: shape \(2, 16, 32\); expected \[experts_per_rank, w1_rows, hidden\] = \[2, 32, 32\] \(2 x inter = 32 rows "
         r"\(gate, then up\) for 'swiglu'"),
        (lambda: (cuda(64, 32), *routing(), cuda(2, 32, 32), cuda(2, 32, 16), dict(activation="relu")),
         r"^w1: shape \(2, 32, 32\); expected \[experts_per_rank, w1_rows, hidden\] = \[2, 16, 32\] \(inter = 16 rows for 'relu'"),
        (lambda: (cuda(64, 32), *routing(), cuda(2, 32, 32), cuda(2, 32, 16), dict(activation="tanh")),
         r"^activation: 'tanh'; expected one of 'swiglu', 'geglu', 'silu', 'gelu', 'relu'"),
        (lambda: (cuda(64, 32), *routing(), cuda(2, 32, 32), cuda(2, 16, 32).transpose(1, 2), {}),
         r"^w2: strides \(512, 1, 32\) for shape \(2, 32, 16\); expected packed \(512, 16, 1\)"),
        (lambda: (cuda(64, 32), *routing(top_k=5), cuda(2, 32, 32), cuda(2, 32, 16), {}),
         r"^topk_ids: top_k = 5 choices per token; expected 1 \.\. 4"),
    ],
)
def test_mlp_bad_arguments_refused_naming_the_argument(fake_pg, fake_mode, make, message):
    x, ids, weights, w1, w2, kwargs = make()
    with pytest.raises(mkernel.ArgumentError, match=message):
        torch.ops.mkernel.moe_mlp(x, ids, weights, w1, w2, fake_pg, **kwargs)


@pytest.mark.parametrize("fake_pg", [2, 4], indirect=True)
@pytest.mark.parametrize("activation, rows", [("swiglu", 512), ("geglu", 512), ("silu", 256), ("gelu", 256), ("relu", 256)])
def test_mlp_fake_output(fake_pg, fake_mode, activation, rows):
    x = cuda(48, 128)
    out = mkernel.moe_mlp(x, *routing(48, 4, I64), cuda(3, rows, 128), cuda(3, 128, 256), fake_pg, activation=activation,
                          recv_tokens_per_source=16)
    assert (tuple(out.shape), out.dtype, out.device, out.is_contiguous()) == ((48, 128), BF16, x.device, True)


def test_mlp_traces_under_make_fx(fake_pg):
    from torch.fx.experimental.proxy_tensor import make_fx

    def layer(x, ids, weights, w1, w2):
        return mkernel.moe_mlp(x, ids, weights, w1, w2, fake_pg) * 2

    with FakeTensorMode():
        graph = make_fx(layer)(cuda(16, 64), *routing(16, 2), cuda(1, 64, 64), cuda(1, 64, 32))
    assert any(n.target is torch.ops.mkernel.moe_mlp.default for n in graph.graph.nodes)


# ---- ring_attention -----------------------------------------------------------------------------


def qkv(B=2, Hq=8, Hkv=2, S=64, D=128, layout="bhsd"):
    def make(H):
        return cuda(B, H, S, D) if layout == "bhsd" else cuda(B, S, H, D)

    return make(Hq), make(Hkv), make(Hkv)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: (*(t.float() for t in qkv()), {}), r"^q: dtype torch.float32; expected torch.bfloat16"),
        (lambda: (cuda(8, 64, 128), *qkv()[1:], {}), r"^q: shape \(8, 64, 128\); expected \[B, H, S, D\] \(layout 'bhsd'\)"),
        (lambda: (*qkv(D=96), {}), r"^q: head_dim = 96 \(last dimension\); expected 64 or 128"),
        (lambda: (*qkv(Hq=6, Hkv=4), {}), r"^k: 4 heads; expected a divisor of q's 6 heads"),
        (lambda: (qkv()[0], *qkv(S=32)[1:], {}), r"^k: shape \(2, 2, 32, 128\); expected \[B, H, S, D\] with B, S and D of q"),
        (lambda: (*qkv()[:2], cuda(2, 4, 64, 128), {}), r"^v: shape \(2, 4, 64, 128\); expected k's shape \(2, 2, 64, 128\)"),
        (lambda: (*qkv(S=63), dict(causal=True)), r"^q: S = 63 positions on this rank with causal zigzag placement; expected an even number"),
        (lambda: (*qkv(), dict(layout="sbhd")), r"^layout: 'sbhd'; expected 'bhsd'"),
        (lambda: (*qkv(), dict(placement="striped")), r"^placement: 'striped'; expected 'zigzag' or 'contiguous'"),
        (lambda: (*qkv(), dict(scale=0.0)), r"^scale: 0.0; expected None \(1 / sqrt\(head_dim\)\) or a positive finite number"),
        (lambda: (*qkv(), dict(scale=float("inf"))), r"^scale: inf"),
        (lambda: (*qkv(), dict(layout="bshd")),
         r"^k: shape \(2, 2, 64, 128\); expected \[B, S, H, D\] with B, S and D of q \(2, 8, 64, 128\) \(layout 'bshd'\)"),
    ],
)
def test_ring_bad_arguments_refused_naming_the_argument(fake_pg, fake_mode, make, message):
    q, k, v, kw = make()
    with pytest.raises(mkernel.ArgumentError, match=message):
        torch.ops.mkernel.ring_attention(q, k, v, fake_pg, **kw)


def test_ring_odd_s_is_taken_without_zigzag(fake_pg, fake_mode):
    # An odd S is fine without a mask and with contiguous causal placement.
    torch.ops.mkernel.ring_attention(*qkv(S=63), fake_pg)
    torch.ops.mkernel.ring_attention(*qkv(S=63), fake_pg, causal=True, placement="contiguous")


RING_CASES = [
    # (B, Hq, Hkv, S, D, layout, causal)
    (1, 32, 8, 1024, 128, "bhsd", True),
    (2, 8, 8, 100, 64, "bhsd", False),
    (2, 16, 4, 256, 128, "bshd", True),
    (4, 4, 1, 7, 64, "bshd", False),
]


@pytest.mark.parametrize("fake_pg", [2, 4], indirect=True)
@pytest.mark.parametrize("B, Hq, Hkv, S, D, layout, causal", RING_CASES)
def test_ring_fake_outputs(fake_pg, fake_mode, B, Hq, Hkv, S, D, layout, causal):
    q, k, v = qkv(B, Hq, Hkv, S, D, layout)
    out, lse = torch.ops.mkernel.ring_attention(q, k, v, fake_pg, causal=causal, layout=layout)
    assert (tuple(out.shape), out.stride(), out.dtype, out.device) == (tuple(q.shape), q.stride(), BF16, q.device)
    assert (tuple(lse.shape), lse.dtype, lse.is_contiguous()) == ((B, Hq, S), F32, True)


def test_ring_non_packed_inputs_are_copied_once():
    # A q.transpose(1, 2) of [B, S, H, D] memory is not packed as [B, H, S, D]: copied.
    base = torch.randn(2, 16, 4, 64)
    t = base.transpose(1, 2)
    p = _ring.packed(t)
    assert p.is_contiguous() and p.data_ptr() != base.data_ptr() and torch.equal(p, t)
    assert _ring.packed(base).data_ptr() == base.data_ptr()


# ---- tracing ------------------------------------------------------------------------------------


def test_torch_compile_traces_a_moe_layer_without_graph_breaks(fake_pg):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def layer(x, router, w_up):
        scores = torch.softmax(x.float() @ router, dim=-1)
        topk_weights, topk_ids = scores.topk(2, dim=-1)  # int64 ids, as torch.topk gives them
        x_expert, offsets, _, _, _ = mkernel.moe_dispatch(x, topk_ids, topk_weights, 4, fake_pg)
        y_expert = torch.relu(x_expert @ w_up.t())       # one expert MLP for every row, as a stand-in
        return mkernel.moe_combine(y_expert, fake_pg, num_tokens=x.shape[0]), offsets

    with FakeTensorMode(allow_non_fake_inputs=True):
        x, router, w_up = cuda(64, 32), cuda(32, 4, dtype=F32), cuda(48, 32)
        out, offsets = torch.compile(layer, backend=backend, fullgraph=True)(x, router, w_up)
    assert tuple(out.shape) == (64, 48) and tuple(offsets.shape) == (3,)
    assert len(graphs) == 1
    assert "torch.ops.mkernel.moe_dispatch" in graphs[0].code and "torch.ops.mkernel.moe_combine" in graphs[0].code


def test_torch_compile_traces_moe_forward_and_ring_attention(fake_pg):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def block(x, ids, weights, w, q, k, v):
        y = mkernel.moe_forward(x, ids, weights, w, fake_pg)
        o, lse = mkernel.ring_attention(q, k, v, fake_pg, causal=True)
        return y * 2, o + 1, lse.exp()

    with FakeTensorMode(allow_non_fake_inputs=True):
        y, o, lse = torch.compile(block, backend=backend, fullgraph=True)(
            cuda(64, 32), *routing(64, 2, I64), cuda(2, 16, 32), *qkv(S=32))
    assert tuple(y.shape) == (64, 16) and tuple(o.shape) == (2, 8, 32, 128) and tuple(lse.shape) == (2, 8, 32)
    assert len(graphs) == 1
    assert "torch.ops.mkernel.moe_forward" in graphs[0].code and "torch.ops.mkernel.ring_attention" in graphs[0].code


def test_make_fx_records_the_ops(fake_pg):
    from torch.fx.experimental.proxy_tensor import make_fx

    def layer(x, ids, weights, q):
        x_expert = mkernel.moe_dispatch(x, ids, weights, 2, fake_pg)[0]
        y = mkernel.moe_combine(x_expert, fake_pg, num_tokens=x.shape[0])
        return y, mkernel.ring_attention(q, q, q, fake_pg, layout="bshd")[0]

    with FakeTensorMode():
        gm = make_fx(layer)(cuda(16, 32), *routing(16, 1), cuda(1, 8, 2, 64))
    for name in ("moe_dispatch", "moe_combine", "ring_attention"):
        assert f"mkernel.{name}.default" in gm.code


# ---- communicator sizes -------------------------------------------------------------------------


class _SmallComm:
    """Stands in for a registered Communicator: only what the ops read before launching."""

    closed = False
    size, nodes, device, rank = 2, 1, 0, 0
    workspace_bytes, network_workspace_bytes, fused_flags = 4096, 0, 65536


@needs_native
def test_a_communicator_too_small_is_named_with_the_size_to_make(fake_pg, fake_mode, monkeypatch):
    monkeypatch.setitem(communicator._registry, fake_pg, _SmallComm())
    need = mkernel.moe_workspace_bytes(2, 64, 32, 4, 2)
    with pytest.raises(mkernel.ArgumentError, match=rf"^x: this call needs an NVLink workspace of {need} bytes .* "
                                                    rf"has 4096; make it with workspace_bytes >= {need} "
                                                    r"\(mkernel.moe_workspace_bytes\)"):
        ops._moe_dispatch(cuda(64, 32), *routing(), 4, fake_pg)
    need = mkernel.ring_attention_workspace_bytes(2, 2, 8, 2, 64, 128)
    with pytest.raises(mkernel.ArgumentError, match=rf"^k: this call needs an NVLink workspace of {need} bytes .*"
                                                    r"\(mkernel.ring_attention_workspace_bytes\)"):
        ops._ring_attention(*qkv(), fake_pg)
    small = _SmallComm()
    small.workspace_bytes, small.fused_flags = 1 << 30, 8
    monkeypatch.setitem(communicator._registry, fake_pg, small)
    flags = mkernel.ring_attention_fused_flags(2)
    with pytest.raises(mkernel.ArgumentError, match=rf"^k: this call needs {flags} fused-op flags; .* has 8; make it "
                                                    rf"with fused_flags >= {flags}"):
        ops._ring_attention(*qkv(), fake_pg)


@needs_native
def test_moe_and_ring_sizes():
    # Ring: K and V of one rank's chunk per slot; slots default to at most world - 1 (4 at most).
    chunk = 2 * 2 * 8 * 1024 * 128 * 2  # K and V, B 2, Hkv 8, S 1024, D 128, bf16
    assert mkernel.ring_attention_workspace_bytes(1, 2, 32, 8, 1024, 128) == 0
    assert mkernel.ring_attention_workspace_bytes(2, 2, 32, 8, 1024, 128) == chunk
    assert mkernel.ring_attention_workspace_bytes(8, 2, 32, 8, 1024, 128) == 4 * chunk
    assert mkernel.ring_attention_network_bytes(1, 2, 8, 1024, 128) == 0
    assert mkernel.ring_attention_network_bytes(2, 2, 8, 1024, 128) > 0
    assert 0 < mkernel.ring_attention_fused_flags(8) <= mkernel.default_fused_flags()
    # MoE: token rows of every source plus the partial rows returned; smaller capacities need less.
    full = mkernel.moe_workspace_bytes(8, 4096, 7168, 256, 8)
    assert full >= 8 * 4096 * 7168 * 2 + 8 * 4096 * 7168 * 2
    assert mkernel.moe_workspace_bytes(8, 4096, 7168, 256, 8, recv_tokens_per_source=1024) < full
    assert mkernel.moe_workspace_bytes(8, 4096, 7168, 256, 8, out_hidden=1024) < full
    assert mkernel.moe_network_bytes(8, 4096, 7168, 256, 8) == 0
    assert mkernel.moe_network_bytes(8, 4096, 7168, 256, 8, nodes=2) > 0
    assert mkernel.moe_fused_flags(8, 4096, 256, 8) > 0
    with pytest.raises(mkernel.ArgumentError, match=r"^nodes: 3; expected a positive divisor of world = 8"):
        mkernel.moe_workspace_bytes(8, 64, 64, 8, 2, nodes=3)


# ---- zigzag placement ---------------------------------------------------------------------------


@pytest.mark.parametrize("seq, world", [(2, 1), (8, 2), (24, 4), (64, 8), (48, 3)])
def test_zigzag_permutation_places_chunks_r_and_2w_minus_1_minus_r(seq, world):
    perm = mkernel.zigzag_permutation(seq, world)
    assert sorted(perm) == list(range(seq))
    chunk, s_local = seq // (2 * world), seq // world
    for r in range(world):
        mine = perm[r * s_local:(r + 1) * s_local]
        assert mine == list(range(r * chunk, (r + 1) * chunk)) + list(range((2 * world - 1 - r) * chunk,
                                                                             (2 * world - r) * chunk))


@needs_native
@pytest.mark.parametrize("seq, world", [(2, 1), (8, 2), (24, 4), (64, 8), (48, 3), (4096, 8)])
def test_zigzag_permutation_is_libmkernels(native, seq, world):
    assert mkernel.zigzag_permutation(seq, world) == list(native.zigzag_permutation(seq, world))


def test_zigzag_reorder_round_trip_and_rank_parts():
    world, B, H, S, D = 4, 2, 3, 16, 4
    x = torch.arange(B * H * S * D, dtype=torch.float32).reshape(B, H, S, D)
    placed = mkernel.zigzag_reorder(x, world, dim=2)
    perm = mkernel.zigzag_permutation(S, world)
    for r, part in enumerate(placed.chunk(world, dim=2)):
        assert torch.equal(part, x[:, :, perm[r * S // world:(r + 1) * S // world]])
    assert torch.equal(mkernel.zigzag_reorder(placed, world, dim=2, inverse=True), x)
    bshd = x.transpose(1, 2).contiguous()
    assert torch.equal(mkernel.zigzag_reorder(bshd, world, dim=1), placed.transpose(1, 2))


def test_zigzag_refusals():
    with pytest.raises(mkernel.ArgumentError, match=r"^seq: 12; expected a positive multiple of 2 x world = 8"):
        mkernel.zigzag_permutation(12, 4)
    with pytest.raises(mkernel.ArgumentError, match=r"^world: 0; expected a positive int"):
        mkernel.zigzag_permutation(8, 0)
    with pytest.raises(mkernel.ArgumentError, match=r"^dim: 4; expected -4 \.\. 3"):
        mkernel.zigzag_reorder(torch.zeros(1, 2, 8, 4), 2, dim=4)
    with pytest.raises(mkernel.ArgumentError, match=r"^seq: 6; expected a positive multiple of 2 x world = 4"):
        mkernel.zigzag_reorder(torch.zeros(1, 2, 6, 4), 2)
