"""How ``moe_dispatch``, ``moe_combine``, ``moe_forward`` and ``moe_mlp`` arguments map onto
mkernel's MoE (libmkernel's ``MoeDispatchCombine`` and ``MoeMlp``: docs/api.md, "MoE dispatch and
combine").

Both the real implementation and the fake one (torch.compile's tracing) go through these
functions, so they check the same things and make outputs of the same shapes. Everything here
reads tensor metadata only: it runs on fake and meta tensors, without a GPU.

Expert parallelism over ``world`` ranks: ``num_experts`` experts, ``num_experts / world`` on each
rank (rank d hosts experts [d E / world, (d + 1) E / world)). Every rank holds its tokens:

* ``x`` [num_tokens, hidden] bf16 (hidden a multiple of 8);
* ``topk_ids`` [num_tokens, top_k], int32 or int64: an expert in [0, num_experts), or -1 for no
  choice. The kernel reads int32: an int64 tensor is converted on the device (one small kernel on
  the caller's stream; values are truncated to 32 bits, so an expert id beyond int32 is not seen
  as such). An expert out of range, or one expert twice for a token, ends the launch on every
  rank and is raised by the next call (or ``Communicator.check()``), naming rank, token and choice;
  it cannot be checked here without reading the device's memory, which would block the host;
* ``topk_weights`` [num_tokens, top_k] float32 (the router's scores).

Dispatch's outputs have the plan's fixed number of rows (``rows_capacity``: by default the worst
case ``world x tokens x min(top_k, experts per rank)``, or ``world x recv_tokens_per_source x ...``,
or ``expert_rows_capacity`` when given), so nothing waits for the host to learn how many rows
came: rows of local expert e are ``[expert_offsets[e], expert_offsets[e + 1])``, and rows from
``expert_offsets[-1]`` on are unused (their contents undefined).
"""

from __future__ import annotations

from typing import Any

import torch

from ._errors import ArgumentError

DISPATCH = "moe_dispatch"
COMBINE = "moe_combine"
FORWARD = "moe_forward"
MLP = "moe_mlp"
# moe_mlp's activations, in libmkernel's MoeActivation order; the gated ones take w1 as the gate
# rows [0, inter) then the up rows [inter, 2 inter).
ACTIVATIONS = ("swiglu", "geglu", "silu", "gelu", "relu")
GATED = ("swiglu", "geglu")
MAX_TOP_K = 32  # kernels' kMoeMaxTopK
_INT31 = (1 << 31) - 1


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_tensor(name: str, t: Any, dtypes: tuple[torch.dtype, ...], expected: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"{name}: {type(t).__name__}; expected a torch.Tensor")
    if t.dtype not in dtypes:
        raise ArgumentError(f"{name}: dtype {t.dtype}; expected {expected}")
    if t.device.type != "cuda":
        raise ArgumentError(f"{name}: device {t.device}; expected a CUDA tensor on this rank's GPU")


def _check_same_device(name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    if t.device != x.device:
        raise ArgumentError(f"{name}: device {t.device}; expected x's device {x.device}")


def _check_optional_count(name: str, v: Any, at_most: int | None, what: str) -> int:
    """None (0 for the runtime: its default) or an int 1 .. at_most."""
    if v is None:
        return 0
    if not _is_int(v) or v < 1 or (at_most is not None and v > at_most):
        bound = f"1 .. {at_most}" if at_most is not None else "a positive int"
        raise ArgumentError(f"{name}: {v!r}; expected None ({what}) or {bound}")
    return v


def check_routing(x: Any, topk_ids: Any, topk_weights: Any) -> tuple[int, int, int]:
    """x, topk_ids and topk_weights (module notes); returns (num_tokens, hidden, top_k)."""
    _check_tensor("x", x, (torch.bfloat16,), "torch.bfloat16")
    if x.dim() != 2:
        raise ArgumentError(f"x: shape {_shape(x)}; expected [num_tokens, hidden] (2 dimensions)")
    tokens, hidden = x.shape
    if tokens == 0 or hidden == 0:
        raise ArgumentError(f"x: shape {_shape(x)}; expected no empty dimension")
    if tokens > _INT31:
        raise ArgumentError(f"x: {tokens} tokens; expected at most 2^31 - 1")
    if hidden % 8 != 0:
        raise ArgumentError(f"x: hidden = {hidden} (last dimension); expected a multiple of 8 (16-byte rows)")
    _check_tensor("topk_ids", topk_ids, (torch.int32, torch.int64), "torch.int32 or torch.int64 (expert ids, -1: none)")
    _check_same_device("topk_ids", topk_ids, x)
    if topk_ids.dim() != 2 or topk_ids.shape[0] != tokens or topk_ids.shape[1] == 0:
        raise ArgumentError(f"topk_ids: shape {_shape(topk_ids)}; expected [num_tokens, top_k] = [{tokens}, top_k], top_k >= 1")
    top_k = topk_ids.shape[1]
    _check_tensor("topk_weights", topk_weights, (torch.float32,),
                  "torch.float32 (the router's scores; convert with .float())")
    _check_same_device("topk_weights", topk_weights, x)
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ArgumentError(f"topk_weights: shape {_shape(topk_weights)}; expected topk_ids' shape {_shape(topk_ids)}")
    return tokens, hidden, top_k


def check_experts(num_experts: Any, top_k: int, world: int) -> int:
    """num_experts spread evenly over the group; top_k within it. Returns experts per rank."""
    if not _is_int(num_experts) or num_experts < 1 or num_experts % world != 0 or num_experts > 0xFFFFFFFF:
        raise ArgumentError(
            f"num_experts: {num_experts!r}; expected a positive multiple of the group's size {world} "
            "(experts are spread evenly over the ranks)"
        )
    if top_k > min(num_experts, MAX_TOP_K):
        raise ArgumentError(
            f"topk_ids: top_k = {top_k} choices per token; expected 1 .. {min(num_experts, MAX_TOP_K)} "
            f"(at most num_experts = {num_experts} and {MAX_TOP_K})"
        )
    return num_experts // world


def check_capacities(
    tokens: int, top_k: int, experts_per_rank: int, world: int, recv_tokens_per_source: Any, expert_rows_capacity: Any
) -> tuple[int, int]:
    """The optional capacities (None: the worst case); returns them as the runtime takes them
    (0: the worst case)."""
    recv = _check_optional_count("recv_tokens_per_source", recv_tokens_per_source, tokens,
                                 "the worst case, num_tokens: no routing overflows it")
    worst_rows = world * (recv or tokens) * min(top_k, experts_per_rank)
    rows = _check_optional_count("expert_rows_capacity", expert_rows_capacity, worst_rows,
                                 f"the worst case, {worst_rows} rows: no routing overflows it")
    if (rows or worst_rows) > _INT31:
        raise ArgumentError(
            f"expert_rows_capacity: {rows or worst_rows} rows (the worst case when None); expected below 2^31: give "
            "a smaller expert_rows_capacity or recv_tokens_per_source"
        )
    return recv, rows


def rows_capacity(tokens: int, top_k: int, experts_per_rank: int, world: int, recv: int, rows: int) -> int:
    """The rows dispatch's outputs have: libmkernel's MoeGeometry::rows_capacity (the communicator
    compares it with the plan's when it launches)."""
    if rows:
        return rows
    return world * (recv or tokens) * min(top_k, experts_per_rank)


def check_out_hidden(out_hidden: Any, hidden: int) -> int:
    if out_hidden is None:
        return hidden
    if not _is_int(out_hidden) or out_hidden < 1 or out_hidden % 8 != 0 or out_hidden > _INT31:
        raise ArgumentError(
            f"out_hidden: {out_hidden!r}; expected None (= hidden, {hidden}) or a positive multiple of 8: the width of "
            "the expert outputs moe_combine takes"
        )
    return out_hidden


def check_bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ArgumentError(f"{name}: {v!r}; expected a bool")
    return v


class DispatchPlan:
    """What one dispatch call is: its checked sizes and the outputs' shapes."""

    def __init__(
        self,
        x: Any,
        topk_ids: Any,
        topk_weights: Any,
        num_experts: Any,
        world: int,
        out_hidden: Any,
        recv_tokens_per_source: Any,
        expert_rows_capacity: Any,
        apply_scores: Any,
    ) -> None:
        self.tokens, self.hidden, self.top_k = check_routing(x, topk_ids, topk_weights)
        self.experts = num_experts
        self.experts_per_rank = check_experts(num_experts, self.top_k, world)
        self.out_hidden = check_out_hidden(out_hidden, self.hidden)
        self.recv, self.rows_cap = check_capacities(
            self.tokens, self.top_k, self.experts_per_rank, world, recv_tokens_per_source, expert_rows_capacity
        )
        self.apply_scores = check_bool("apply_scores", apply_scores)
        self.rows = rows_capacity(self.tokens, self.top_k, self.experts_per_rank, world, self.recv, self.rows_cap)

    def outputs(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x_expert [rows, hidden] bf16, expert_offsets [experts_per_rank + 1] int32, row_source,
        row_token [rows] int32, row_score [rows] float32."""
        rows = self.rows
        return (
            x.new_empty((rows, self.hidden)),
            x.new_empty((self.experts_per_rank + 1,), dtype=torch.int32),
            x.new_empty((rows,), dtype=torch.int32),
            x.new_empty((rows,), dtype=torch.int32),
            x.new_empty((rows,), dtype=torch.float32),
        )


def check_combine(y_expert: Any, num_tokens: Any) -> None:
    """y_expert [rows, out_hidden] bf16; num_tokens the dispatch's (checked against it by the
    communicator: the fake implementation has no dispatch to compare with)."""
    _check_tensor("y_expert", y_expert, (torch.bfloat16,), "torch.bfloat16")
    if y_expert.dim() != 2 or y_expert.numel() == 0:
        raise ArgumentError(f"y_expert: shape {_shape(y_expert)}; expected [rows, out_hidden] (x_expert's rows), none empty")
    if y_expert.shape[1] % 8 != 0:
        raise ArgumentError(f"y_expert: out_hidden = {y_expert.shape[1]}; expected a multiple of 8 (16-byte rows)")
    if not _is_int(num_tokens) or not 1 <= num_tokens <= _INT31:
        raise ArgumentError(f"num_tokens: {num_tokens!r}; expected the dispatch's number of tokens (x.shape[0]), >= 1")


def combine_output(y_expert: torch.Tensor, num_tokens: int) -> torch.Tensor:
    return y_expert.new_empty((num_tokens, y_expert.shape[1]))


class ForwardPlan:
    """What one fused forward call is: w [experts_per_rank, out_hidden, hidden], the experts'
    nn.Linear weights (out = x @ w[e].T per expert), taken as they are: packed."""

    def __init__(
        self,
        x: Any,
        topk_ids: Any,
        topk_weights: Any,
        w: Any,
        world: int,
        recv_tokens_per_source: Any,
        expert_rows_capacity: Any,
        apply_scores: Any,
    ) -> None:
        self.tokens, self.hidden, self.top_k = check_routing(x, topk_ids, topk_weights)
        _check_tensor("w", w, (torch.bfloat16,), "torch.bfloat16")
        _check_same_device("w", w, x)
        if w.dim() != 3 or w.shape[2] != self.hidden or w.shape[0] == 0 or w.shape[1] == 0:
            raise ArgumentError(
                f"w: shape {_shape(w)}; expected [experts_per_rank, out_hidden, hidden] = [E / world, out_hidden, "
                f"{self.hidden}]: each local expert's nn.Linear weight, hidden from x"
            )
        if w.shape[1] % 8 != 0:
            raise ArgumentError(f"w: out_hidden = {w.shape[1]}; expected a multiple of 8 (16-byte rows)")
        _check_packed("w", w, "the kernel reads every expert's [out_hidden, hidden] rows")
        self.experts_per_rank = w.shape[0]
        self.experts = self.experts_per_rank * world
        self.out_hidden = w.shape[1]
        check_experts(self.experts, self.top_k, world)
        self.recv, self.rows_cap = check_capacities(
            self.tokens, self.top_k, self.experts_per_rank, world, recv_tokens_per_source, expert_rows_capacity
        )
        self.apply_scores = check_bool("apply_scores", apply_scores)

    def output(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_empty((self.tokens, self.out_hidden))


def _check_packed(name: str, t: torch.Tensor, what: str) -> None:
    if not t.is_contiguous():
        raise ArgumentError(
            f"{name}: strides {tuple(t.stride())} for shape {_shape(t)}; expected packed "
            f"{tuple(torch.empty(tuple(t.shape), device='meta').stride())} ({what}; stack the experts' weights once, "
            "e.g. torch.stack, and keep that)"
        )


class MlpPlan:
    """What one moe_mlp call is: w1 [experts_per_rank, w1_rows, hidden] (gated activations: the gate
    rows, then the up rows, w1_rows = 2 inter; plain ones: w1_rows = inter) and w2
    [experts_per_rank, hidden, inter], each expert's nn.Linear weights, packed; out [num_tokens,
    hidden]."""

    def __init__(
        self,
        x: Any,
        topk_ids: Any,
        topk_weights: Any,
        w1: Any,
        w2: Any,
        world: int,
        activation: Any,
        recv_tokens_per_source: Any,
        expert_rows_capacity: Any,
        apply_scores: Any,
    ) -> None:
        self.tokens, self.hidden, self.top_k = check_routing(x, topk_ids, topk_weights)
        if not isinstance(activation, str) or activation not in ACTIVATIONS:
            raise ArgumentError(f"activation: {activation!r}; expected one of {', '.join(map(repr, ACTIVATIONS))}")
        self.activation = activation
        self.gated = activation in GATED
        _check_tensor("w2", w2, (torch.bfloat16,), "torch.bfloat16")
        _check_same_device("w2", w2, x)
        if w2.dim() != 3 or w2.shape[1] != self.hidden or w2.shape[0] == 0 or w2.shape[2] == 0:
            raise ArgumentError(
                f"w2: shape {_shape(w2)}; expected [experts_per_rank, hidden, inter] = [E / world, {self.hidden}, "
                "inter]: each local expert's second nn.Linear weight, hidden from x"
            )
        self.inter = w2.shape[2]
        if self.inter % 8 != 0:
            raise ArgumentError(f"w2: inter = {self.inter} (last dimension); expected a multiple of 8 (16-byte rows)")
        rows = 2 * self.inter if self.gated else self.inter
        _check_tensor("w1", w1, (torch.bfloat16,), "torch.bfloat16")
        _check_same_device("w1", w1, x)
        if tuple(w1.shape) != (w2.shape[0], rows, self.hidden):
            kind = f"2 x inter = {rows} rows (gate, then up) for {activation!r}" if self.gated else \
                f"inter = {rows} rows for {activation!r}"
            raise ArgumentError(
                f"w1: shape {_shape(w1)}; expected [experts_per_rank, w1_rows, hidden] = [{w2.shape[0]}, {rows}, "
                f"{self.hidden}] ({kind}; experts_per_rank from w2, hidden from x)"
            )
        _check_packed("w1", w1, "the kernel reads every expert's rows")
        _check_packed("w2", w2, "the kernel reads every expert's rows")
        self.experts_per_rank = w2.shape[0]
        self.experts = self.experts_per_rank * world
        self.out_hidden = self.hidden
        check_experts(self.experts, self.top_k, world)
        self.recv, self.rows_cap = check_capacities(
            self.tokens, self.top_k, self.experts_per_rank, world, recv_tokens_per_source, expert_rows_capacity
        )
        self.apply_scores = check_bool("apply_scores", apply_scores)

    def output(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_empty((self.tokens, self.hidden))
