"""How ``ring_attention`` arguments map onto mkernel's ring attention (libmkernel's
``RingAttention``: docs/api.md, "Ring attention"), and the zigzag placement.

Both the real implementation and the fake one go through these functions (same checks, same
output shapes); they read metadata only.

Sequence parallelism over ``world`` ranks: rank r holds ``q`` [B, Hq, S, D] and ``k``, ``v``
[B, Hkv, S, D] (``layout="bhsd"``, PyTorch's SDPA layout) or [B, S, H, D] (``layout="bshd"``,
the layout before the transpose), its S = s_local positions of the sequence. It gets ``out``
(q's shape, bf16) and ``lse`` [B, Hq, S] float32 (natural log). Both layouts are native to the
kernel; a tensor that is not packed in its layout is copied once (a ``q.transpose(1, 2)`` view of
[B, S, H, D] memory is packed as "bshd": pass the untransposed tensor with ``layout="bshd"``).

Placement (which positions a rank holds): without ``causal`` rank r holds positions
[r S, (r + 1) S) (any placement gives the same result without a mask). With ``causal``:
``placement="zigzag"`` (default) cuts the sequence into 2 x world chunks and rank r holds chunks
r and 2 world - 1 - r, so every rank does the same work (S even); ``placement="contiguous"``
places as without a mask (rank world - 1 then does world times the work of rank 0).
:func:`zigzag_reorder` puts a whole sequence into zigzag order and back.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._errors import ArgumentError

OP_NAME = "ring_attention"
LAYOUTS = ("bhsd", "bshd")
PLACEMENTS = ("zigzag", "contiguous")


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


class RingCall:
    """One ring_attention call, checked: its sizes and the runtime's placement name."""

    def __init__(self, q: Any, k: Any, v: Any, *, causal: Any, layout: Any, placement: Any, scale: Any) -> None:
        if not isinstance(layout, str) or layout not in LAYOUTS:
            raise ArgumentError(f"layout: {layout!r}; expected 'bhsd' ([B, H, S, D], SDPA's) or 'bshd' ([B, S, H, D])")
        self.layout = layout
        h, s = (1, 2) if layout == "bhsd" else (2, 1)
        form = "[B, H, S, D]" if layout == "bhsd" else "[B, S, H, D]"
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise ArgumentError(f"{name}: {type(t).__name__}; expected a torch.Tensor")
            if t.dtype != torch.bfloat16:
                raise ArgumentError(f"{name}: dtype {t.dtype}; expected torch.bfloat16")
            if t.device.type != "cuda":
                raise ArgumentError(f"{name}: device {t.device}; expected a CUDA tensor on this rank's GPU")
            if name != "q" and t.device != q.device:
                raise ArgumentError(f"{name}: device {t.device}; expected q's device {q.device}")
            if t.dim() != 4:
                raise ArgumentError(f"{name}: shape {_shape(t)}; expected {form} (layout {layout!r}), 4 dimensions")
            if t.numel() == 0:
                raise ArgumentError(f"{name}: shape {_shape(t)}; expected no empty dimension")
        self.batch, self.heads_q, self.s_local, self.head_dim = q.shape[0], q.shape[h], q.shape[s], q.shape[3]
        if self.head_dim not in (64, 128):
            raise ArgumentError(f"q: head_dim = {self.head_dim} (last dimension); expected 64 or 128")
        if k.shape[0] != self.batch or k.shape[s] != self.s_local or k.shape[3] != self.head_dim:
            raise ArgumentError(
                f"k: shape {_shape(k)}; expected {form} with B, S and D of q {_shape(q)} (layout {layout!r})"
            )
        if tuple(v.shape) != tuple(k.shape):
            raise ArgumentError(f"v: shape {_shape(v)}; expected k's shape {_shape(k)}")
        self.heads_kv = k.shape[h]
        if self.heads_q % self.heads_kv != 0:
            raise ArgumentError(
                f"k: {self.heads_kv} heads; expected a divisor of q's {self.heads_q} heads (grouped-query attention: "
                "query head i reads key/value head i // (Hq / Hkv))"
            )
        for name, d in (("batch", self.batch), ("heads", self.heads_q), ("S", self.s_local)):
            if d > (1 << 31) - 1:
                raise ArgumentError(f"q: {name} = {d}; expected at most 2^31 - 1")
        if not isinstance(causal, bool):
            raise ArgumentError(f"causal: {causal!r}; expected a bool")
        if not isinstance(placement, str) or placement not in PLACEMENTS:
            raise ArgumentError(f"placement: {placement!r}; expected 'zigzag' or 'contiguous'")
        if causal and placement == "zigzag" and self.s_local % 2 != 0:
            raise ArgumentError(
                f"q: S = {self.s_local} positions on this rank with causal zigzag placement; expected an even number "
                "(two chunks of S / 2 per rank; the sequence is world x S)"
            )
        if scale is None:
            self.scale = 0.0  # the runtime's 1 / sqrt(head_dim)
        elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (0 < scale < 1e30):
            raise ArgumentError(f"scale: {scale!r}; expected None (1 / sqrt(head_dim)) or a positive finite number")
        else:
            self.scale = float(scale)
        self.causal = causal
        self.placement = "non_causal" if not causal else f"causal_{placement}"

    def outputs(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """out (q's shape, packed) and lse [B, Hq, S] float32."""
        return q.new_empty(tuple(q.shape)), q.new_empty((self.batch, self.heads_q, self.s_local), dtype=torch.float32)


def packed(t: torch.Tensor) -> torch.Tensor:
    """t packed in its own dimension order and 16-byte aligned: itself when it is, else a copy."""
    if not t.is_contiguous():
        t = t.contiguous()
    if t.data_ptr() % 16 != 0:
        t = t.clone()
    return t


# ---- zigzag placement ---------------------------------------------------------------------------


def _check_zigzag(seq: Any, world: Any) -> None:
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ArgumentError(f"world: {world!r}; expected a positive int")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1 or seq % (2 * world) != 0:
        raise ArgumentError(
            f"seq: {seq!r}; expected a positive multiple of 2 x world = {2 * world} (zigzag placement cuts the "
            "sequence into 2 x world equal chunks)"
        )


def zigzag_permutation(seq: int, world: int) -> list[int]:
    """Zigzag placement of a sequence of ``seq`` positions over ``world`` ranks:
    ``perm[placed] = original``. Rank r's positions are ``perm[r * seq // world:(r + 1) * seq // world]``:
    chunks r and 2 world - 1 - r of the 2 world chunks. libmkernel's rule (rt::zigzag_permutation)."""
    _check_zigzag(seq, world)
    s_local = seq // world
    c = s_local // 2
    perm = []
    for r in range(world):
        perm.extend(range(r * c, (r + 1) * c))
        perm.extend(range((2 * world - 1 - r) * c, (2 * world - r) * c))
    return perm


def zigzag_index(seq: int, world: int, *, inverse: bool = False, device: Any = None) -> torch.Tensor:
    """The permutation as an int64 index tensor (its inverse with ``inverse=True``)."""
    perm = torch.tensor(zigzag_permutation(seq, world), dtype=torch.int64, device=device)
    if not inverse:
        return perm
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(seq, dtype=torch.int64, device=device)
    return inv


def zigzag_reorder(x: torch.Tensor, world: int, *, dim: int = 2, inverse: bool = False) -> torch.Tensor:
    """A whole sequence (dimension ``dim`` of ``x``, e.g. 2 for [B, H, S, D], 1 for [B, S, H, D])
    put into zigzag placement, so that rank r's part is ``x.chunk(world, dim)[r]``; with
    ``inverse=True`` placed back into order (e.g. outputs gathered from the ranks). One gather
    (``index_select``) on any device and dtype; differentiable and traceable by torch.compile."""
    if not isinstance(x, torch.Tensor):
        raise ArgumentError(f"x: {type(x).__name__}; expected a torch.Tensor")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < max(1, x.dim()):
        raise ArgumentError(f"dim: {dim!r}; expected -{x.dim()} .. {x.dim() - 1} for x of shape {_shape(x)}")
    seq = x.shape[dim]
    _check_zigzag(seq, world)
    return x.index_select(dim, zigzag_index(seq, world, inverse=inverse, device=x.device))


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
