"""The GPU cases of torch.ops.mkernel's MoE (moe_dispatch, moe_combine, moe_forward, moe_mlp) and
ring_attention, run by test_fused_ops.py (its harness: every rank runs the cases in the same
order, the verdicts are compared after each).

References are computed with torch on the same inputs, gathered from every rank:

* moe_dispatch: every row of x_expert is bit for bit the row of x its row_source / row_token
  name, with row_score its router score; each local expert gets exactly the (rank, token)
  pairs that chose it, rows by source rank (this rank first) and token order; the offsets
  count them. moe_combine: for each token the score-weighted sum over its choices of the expert
  outputs (every expert a linear layer here), within bf16 rounding (partials travel as bf16;
  sums are fp32); a token with no choice gets a zero row; the same bits when called again.
  int64 topk_ids give the same result as int32. moe_forward (the fused kernel): the same
  reference. moe_mlp: every activation against torch's two products per choice, rounded where
  the op rounds. Eager, torch.compile (inductor) and CUDA graph replay with new routing.
* ring_attention: attention of the rank's queries over the whole sequence in fp32 (causal on
  the original positions, grouped-query heads), out within bf16 rounding and lse within 1e-2;
  placements zigzag and contiguous, layouts bhsd and bshd, head_dim 64 and 128, an S that is
  not a tile multiple; eager, torch.compile and CUDA graph replay.

make_cases(h) takes the harness module (RANK, WORLD, DEV, GNAME, COMM, rand, log, case).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

import mkernel

BF16 = torch.bfloat16

# The shapes below, for the harness's communicator: tokens per rank, hidden, out_hidden, experts
# per rank, top_k; ring: B, Hq, Hkv, s_local (largest), D.
MOE_T, MOE_H, MOE_OH, MOE_EPR, MOE_K = 96, 256, 128, 4, 2
RING_B, RING_HQ, RING_HKV, RING_S, RING_D = 2, 8, 2, 256, 128


def workspace_needs(world: int) -> tuple[int, int]:
    """(workspace bytes, fused-op flags) the cases below need on the harness's communicator."""
    E = MOE_EPR * world
    moe = max(mkernel.moe_workspace_bytes(world, MOE_T, MOE_H, E, MOE_K, out_hidden=out) for out in (MOE_OH, MOE_H))
    ring = mkernel.ring_attention_workspace_bytes(world, RING_B, RING_HQ, RING_HKV, RING_S, RING_D)
    flags = max(mkernel.moe_fused_flags(world, MOE_T, E, MOE_K), mkernel.ring_attention_fused_flags(world))
    return max(moe, ring), flags


def make_cases(h: Any) -> None:
    RANK, WORLD, DEV, GNAME = h.RANK, h.WORLD, h.DEV, h.GNAME
    E = MOE_EPR * WORLD
    case, log = h.case, h.log

    def gen(seed: int) -> torch.Generator:
        return torch.Generator(device=DEV).manual_seed(seed)

    def expert_weights(seed: int, out_hidden: int = MOE_OH) -> torch.Tensor:
        """Every expert's nn.Linear weight [E, out_hidden, hidden], the same on every rank."""
        return (torch.rand(E, out_hidden, MOE_H, generator=gen(seed), device=DEV) / 16).to(BF16)

    def routing(seed: int, tokens: int = MOE_T) -> tuple[torch.Tensor, torch.Tensor]:
        """Distinct experts per token (a random permutation's first top_k), some choices -1: token
        0 chooses nothing, token 1 only its first expert. Scores in (0, 1]."""
        g = gen(seed * 1000 + RANK)
        keys = torch.rand(tokens, E, generator=g, device=DEV)
        ids = keys.argsort(dim=1)[:, :MOE_K].to(torch.int32)
        ids[0, :] = -1
        ids[1, 1:] = -1
        weights = torch.rand(tokens, MOE_K, generator=g, device=DEV) * 0.9 + 0.1
        return ids.contiguous(), weights.contiguous()

    def gather(t: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(t) for _ in range(WORLD)]
        dist.all_gather(parts, t.contiguous())
        return parts

    def expert_rows(x_expert: torch.Tensor, offsets: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        """y_expert: local expert e's rows times its weight (one linear layer per expert); unused rows zero."""
        y = torch.zeros(x_expert.shape[0], W.shape[1], device=DEV, dtype=BF16)
        off = offsets.tolist()
        for e in range(MOE_EPR):
            if off[e + 1] > off[e]:
                y[off[e]:off[e + 1]] = x_expert[off[e]:off[e + 1]] @ W[RANK * MOE_EPR + e].t()
        return y

    def moe_reference(x, ids, weights, W, apply_scores=True) -> torch.Tensor:
        """out[t] = sum over t's choices of score x bf16(x[t] @ W[e].T), in fp32, then bf16."""
        out = torch.zeros(x.shape[0], W.shape[1], device=DEV, dtype=torch.float32)
        for j in range(MOE_K):
            chosen = ids[:, j] >= 0
            e = ids[:, j].clamp(min=0).long()
            y = torch.bmm(x.unsqueeze(1), W[e].transpose(1, 2)).squeeze(1).float()  # per token, bf16 GEMM
            y = y.to(BF16).float()
            s = weights[:, j:j + 1] if apply_scores else torch.ones_like(weights[:, j:j + 1])
            out += torch.where(chosen.unsqueeze(1), s * y, torch.zeros_like(y))
        return out.to(BF16)

    def expect_close(ours: torch.Tensor, ref: torch.Tensor, what: str, rtol=1.6e-2, atol=1e-2) -> None:
        assert ours.shape == ref.shape and ours.dtype == ref.dtype, (
            f"{what}: {tuple(ours.shape)} {ours.dtype} vs {tuple(ref.shape)} {ref.dtype}")
        torch.testing.assert_close(ours.float(), ref.float(), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")

    def check_dispatch(x, ids, weights, outs, what: str) -> None:
        x_expert, offsets, row_source, row_token, row_score = outs
        xs = gather(x)
        idss = [t.cpu().tolist() for t in gather(ids)]
        ws = [t.cpu().tolist() for t in gather(weights)]
        off = offsets.tolist()
        assert off[0] == 0 and all(a <= b for a, b in zip(off, off[1:])), f"{what}: offsets {off}"
        assert off[-1] <= x_expert.shape[0], f"{what}: {off[-1]} rows in a capacity of {x_expert.shape[0]}"
        src, tok, score = row_source.tolist(), row_token.tolist(), row_score.tolist()
        for e in range(MOE_EPR):
            g = RANK * MOE_EPR + e
            expected = [(s, t) for s in range(WORLD) for t in range(MOE_T) if g in idss[s][t]]
            rows = list(range(off[e], off[e + 1]))
            got = [(src[r], tok[r]) for r in rows]
            assert sorted(got) == expected, f"{what}: expert {g} got {len(got)} rows, expected {len(expected)}"
            sources = [s for s, _ in got]
            own = sources.count(RANK)
            assert sources[:own] == [RANK] * own, f"{what}: expert {g}: this rank's rows do not come first"
            for s in set(sources):  # one run per source, in token order
                runs = [i for i, ss in enumerate(sources) if ss == s]
                assert runs == list(range(runs[0], runs[0] + len(runs))), f"{what}: expert {g}: rank {s} split"
                toks = [got[i][1] for i in runs]
                assert toks == sorted(toks), f"{what}: expert {g}: rows from rank {s} not in token order"
            for r, (s, t) in zip(rows, got):
                j = idss[s][t].index(g)
                assert score[r] == ws[s][t][j], f"{what}: row {r} score {score[r]} vs {ws[s][t][j]}"
            if rows:
                want = torch.stack([xs[s][t] for s, t in got])
                assert torch.equal(x_expert[off[e]:off[e + 1]], want), f"{what}: expert {g}: rows differ from x"

    @case
    def moe_dispatch_combine_eager():
        W = expert_weights(301)
        for step in range(2):
            x = h.rand(MOE_T, MOE_H, seed=310 + step)
            ids, weights = routing(320 + step)
            outs = mkernel.moe_dispatch(x, ids, weights, E, GNAME, out_hidden=MOE_OH)
            check_dispatch(x, ids, weights, outs, f"dispatch step {step}")
            y_expert = expert_rows(outs[0], outs[1], W)
            out = mkernel.moe_combine(y_expert, GNAME, num_tokens=MOE_T)
            expect_close(out, moe_reference(x, ids, weights, W), f"combine step {step}")
            assert torch.equal(out[0], torch.zeros_like(out[0])), "a token with no choice got a non-zero row"
            # Again: the same bits (fixed summation order); int64 ids: the same result.
            outs2 = mkernel.moe_dispatch(x, ids.long(), weights, E, GNAME, out_hidden=MOE_OH)
            n = int(outs[1][-1].item())
            assert torch.equal(outs2[1], outs[1]) and torch.equal(outs2[0][:n], outs[0][:n]), "int64 ids dispatch differs"
            again = mkernel.moe_combine(expert_rows(outs2[0], outs2[1], W), GNAME, num_tokens=MOE_T)
            assert torch.equal(again, out), f"step {step}: a second combine differs in {(again != out).sum().item()}"

    @case
    def moe_capacities_and_unweighted_combine():
        """recv_tokens_per_source = tokens (no routing can overflow it), expert_rows_capacity at the
        worst case, and apply_scores=False (combine sums the outputs alone); out_hidden = hidden."""
        W = expert_weights(330, MOE_H)
        x = h.rand(MOE_T, MOE_H, seed=331)
        ids, weights = routing(332)
        rows = WORLD * MOE_T * min(MOE_K, MOE_EPR)
        outs = torch.ops.mkernel.moe_dispatch(x, ids, weights, E, GNAME, recv_tokens_per_source=MOE_T,
                                              expert_rows_capacity=rows, apply_scores=False)
        assert outs[0].shape == (rows, MOE_H)
        check_dispatch(x, ids, weights, outs, "capacities")
        out = torch.ops.mkernel.moe_combine(expert_rows(outs[0], outs[1], W), GNAME, num_tokens=MOE_T)
        expect_close(out, moe_reference(x, ids, weights, W, apply_scores=False), "apply_scores=False")

    @case
    def moe_forward_fused():
        W = expert_weights(340)
        w_local = W[RANK * MOE_EPR:(RANK + 1) * MOE_EPR].contiguous()
        for step in range(2):
            x = h.rand(MOE_T, MOE_H, seed=341 + step)
            ids, weights = routing(343 + step)
            out = mkernel.moe_forward(x, ids, weights, w_local, GNAME)
            expect_close(out, moe_reference(x, ids, weights, W), f"moe_forward step {step}")
            assert torch.equal(mkernel.moe_forward(x, ids.long(), weights, w_local, GNAME), out), "not deterministic"

    @case
    def moe_torch_compile_inductor():
        W_shared = (torch.rand(MOE_OH, MOE_H, generator=gen(350), device=DEV) / 16).to(BF16)
        W = W_shared.unsqueeze(0).expand(E, -1, -1)

        def layer(x, router):
            scores = torch.softmax(x.float() @ router, dim=-1)
            topk_weights, topk_ids = scores.topk(MOE_K, dim=-1)          # int64 ids
            x_expert, _, _, _, _ = torch.ops.mkernel.moe_dispatch(x, topk_ids, topk_weights, E, GNAME,
                                                                  out_hidden=MOE_OH)
            y_expert = x_expert @ W_shared.t()                           # every expert alike: no offsets needed
            return torch.ops.mkernel.moe_combine(y_expert, GNAME, num_tokens=x.shape[0]), topk_ids, topk_weights

        compiled = torch.compile(layer, fullgraph=True)
        for step in range(3):
            x = h.rand(MOE_T, MOE_H, seed=351 + step)
            router = torch.randn(MOE_H, E, generator=gen(360 + step), device=DEV)
            out, ids, weights = compiled(x, router)
            expect_close(out, moe_reference(x, ids.to(torch.int32), weights, W), f"compiled step {step}")

    @case
    def moe_cuda_graph_replay():
        """Warm-up (plans), capture dispatch + experts + combine, replay with new x and new routing."""
        W = expert_weights(370)
        x = h.rand(MOE_T, MOE_H, seed=371)
        ids, weights = routing(372)
        W_local = W[RANK * MOE_EPR:(RANK + 1) * MOE_EPR]

        def step():
            x_expert, offsets, _, _, _ = mkernel.moe_dispatch(x, ids, weights, E, GNAME, out_hidden=MOE_OH)
            # Every local expert applied to every row, then the row's own expert picked (offsets on the
            # device: no host synchronisation inside the graph).
            rows = torch.arange(x_expert.shape[0], device=DEV, dtype=torch.int32)
            expert = (torch.bucketize(rows, offsets[1:], right=True)).clamp(max=MOE_EPR - 1)
            all_y = torch.einsum("rh,eoh->reo", x_expert, W_local)
            y_expert = all_y[torch.arange(x_expert.shape[0], device=DEV), expert].contiguous()
            return mkernel.moe_combine(y_expert, GNAME, num_tokens=MOE_T)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        for replay in range(3):
            x.copy_(h.rand(MOE_T, MOE_H, seed=373 + replay))
            new_ids, new_weights = routing(380 + replay)
            ids.copy_(new_ids)
            weights.copy_(new_weights)
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            h.COMM.check()
            expect_close(out, moe_reference(x, ids, weights, W), f"graph replay {replay}")

    # ---- moe_mlp: the two-matrix expert layer ---------------------------------------------------

    MLP_I = 64

    def mlp_weights(seed: int, activation: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Every expert's w1 [E, w1_rows, hidden] and w2 [E, hidden, inter], the same on every rank,
        signed and scaled so the activation's curved part is used."""
        rows = 2 * MLP_I if activation in ("swiglu", "geglu") else MLP_I
        w1 = ((torch.rand(E, rows, MOE_H, generator=gen(seed), device=DEV) - 0.5) * (4 / math.sqrt(MOE_H))).to(BF16)
        w2 = ((torch.rand(E, MOE_H, MLP_I, generator=gen(seed + 1), device=DEV) - 0.5) * (4 / math.sqrt(MLP_I))).to(BF16)
        return w1, w2

    def mlp_reference(x, ids, weights, W1, W2, activation: str) -> torch.Tensor:
        """out[t] = sum over t's choices of score x bf16(bf16(act(bf16(x[t] W1[e]^T))) W2[e]^T), fp32 sums."""
        act = {"swiglu": torch.nn.functional.silu, "silu": torch.nn.functional.silu,
               "geglu": torch.nn.functional.gelu, "gelu": torch.nn.functional.gelu,
               "relu": torch.nn.functional.relu}[activation]
        out = torch.zeros(x.shape[0], MOE_H, device=DEV, dtype=torch.float32)
        for j in range(MOE_K):
            chosen = ids[:, j] >= 0
            e = ids[:, j].clamp(min=0).long()
            y1 = torch.bmm(x.unsqueeze(1), W1[e].transpose(1, 2)).squeeze(1).to(BF16).float()
            if activation in ("swiglu", "geglu"):
                hh = (act(y1[:, :MLP_I]) * y1[:, MLP_I:]).to(BF16)
            else:
                hh = act(y1).to(BF16)
            y2 = torch.bmm(hh.unsqueeze(1), W2[e].transpose(1, 2)).squeeze(1).to(BF16).float()
            out += torch.where(chosen.unsqueeze(1), weights[:, j:j + 1] * y2, torch.zeros_like(y2))
        return out.to(BF16)

    @case
    def moe_mlp_every_activation_eager():
        for i, activation in enumerate(("swiglu", "geglu", "silu", "gelu", "relu")):
            W1, W2 = mlp_weights(400 + 10 * i, activation)
            local = slice(RANK * MOE_EPR, (RANK + 1) * MOE_EPR)
            w1, w2 = W1[local].contiguous(), W2[local].contiguous()
            x = h.rand(MOE_T, MOE_H, seed=401 + 10 * i)
            ids, weights = routing(402 + 10 * i)
            out = mkernel.moe_mlp(x, ids, weights, w1, w2, GNAME, activation=activation)
            expect_close(out, mlp_reference(x, ids, weights, W1, W2, activation), f"moe_mlp {activation}",
                         rtol=2e-2, atol=2e-2)
            assert torch.equal(out[0], torch.zeros_like(out[0])), "a token with no choice got a non-zero row"
            assert torch.equal(torch.ops.mkernel.moe_mlp(x, ids.long(), weights, w1, w2, GNAME, activation=activation),
                               out), f"moe_mlp {activation}: not deterministic"

    @case
    def moe_mlp_torch_compile_and_graph_replay():
        W1, W2 = mlp_weights(460, "swiglu")
        local = slice(RANK * MOE_EPR, (RANK + 1) * MOE_EPR)
        w1, w2 = W1[local].contiguous(), W2[local].contiguous()

        def layer(x, router):
            scores = torch.softmax(x.float() @ router, dim=-1)
            topk_weights, topk_ids = scores.topk(MOE_K, dim=-1)
            return mkernel.moe_mlp(x, topk_ids, topk_weights, w1, w2, GNAME), topk_ids, topk_weights

        compiled = torch.compile(layer, fullgraph=True)
        for step in range(2):
            x = h.rand(MOE_T, MOE_H, seed=461 + step)
            router = torch.randn(MOE_H, E, generator=gen(470 + step), device=DEV)
            out, ids, weights = compiled(x, router)
            expect_close(out, mlp_reference(x, ids.to(torch.int32), weights, W1, W2, "swiglu"),
                         f"compiled moe_mlp step {step}", rtol=2e-2, atol=2e-2)
        # A graph of the layer, replayed with new inputs and routing (the warm-up call plans it).
        x = h.rand(MOE_T, MOE_H, seed=480)
        ids, weights = routing(481)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            mkernel.moe_mlp(x, ids, weights, w1, w2, GNAME)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = mkernel.moe_mlp(x, ids, weights, w1, w2, GNAME)
        for replay in range(3):
            x.copy_(h.rand(MOE_T, MOE_H, seed=482 + replay))
            new_ids, new_weights = routing(490 + replay)
            ids.copy_(new_ids)
            weights.copy_(new_weights)
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            h.COMM.check()
            expect_close(out, mlp_reference(x, ids, weights, W1, W2, "swiglu"), f"moe_mlp graph replay {replay}",
                         rtol=2e-2, atol=2e-2)

    @case
    def moe_combine_misuse_refused():
        """On a communicator of its own: combine with no dispatch, with the wrong shape, and after
        another op's launch since its dispatch, each refused before anything is launched."""
        group = dist.new_group(list(range(WORLD)))
        comm = mkernel.Communicator.from_process_group(
            group, workspace_bytes=max(h.WORKSPACE, mkernel.moe_workspace_bytes(WORLD, MOE_T, MOE_H, E, MOE_K)),
            fused_flags=h.FUSED_FLAGS)
        try:
            y = torch.zeros(WORLD * MOE_T * MOE_K, MOE_H, device=DEV, dtype=BF16)
            try:
                mkernel.moe_combine(y, group, num_tokens=MOE_T)
            except mkernel.MkernelError as e:
                assert "no moe_dispatch on this communicator waits for its combine" in str(e), str(e)
                assert e.code == "failed precondition", e.code
            else:
                raise AssertionError("a combine with no dispatch went through")
            x = h.rand(MOE_T, MOE_H, seed=390)
            ids, weights = routing(391)
            x_expert = mkernel.moe_dispatch(x, ids, weights, E, group)[0]
            for bad, start in ((y[:, :128], "y_expert: shape"), (None, "num_tokens: ")):
                try:
                    if bad is None:
                        mkernel.moe_combine(x_expert, group, num_tokens=MOE_T - 1)
                    else:
                        mkernel.moe_combine(bad.contiguous(), group, num_tokens=MOE_T)
                except mkernel.ArgumentError as e:
                    assert str(e).startswith(start), str(e)
                else:
                    raise AssertionError(f"not refused: {start}")
            out = mkernel.moe_combine(x_expert, group, num_tokens=MOE_T)  # the dispatch still waits: taken
            torch.cuda.synchronize()
            comm.check()
            assert out.shape == (MOE_T, MOE_H)
            mkernel.moe_dispatch(x, ids, weights, E, group)
            a, w = h.rand(64, 256, seed=392), h.rand(64, 256, seed=393)
            mkernel.fused_all_gather_matmul(a, [w.t()], 0, group)
            try:
                mkernel.moe_combine(x_expert, group, num_tokens=MOE_T)
            except mkernel.MkernelError as e:
                assert "since the dispatch" in str(e), str(e)
            else:
                raise AssertionError("a combine after another launch went through")
            torch.cuda.synchronize()
            comm.check()
        finally:
            comm.close()

    # ---- ring attention ---------------------------------------------------------------------------

    def ring_reference(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole-sequence attention in fp32 ([B, H, S, D]), positions in original order."""
        group = q.shape[1] // k.shape[1]
        kf = k.float().repeat_interleave(group, dim=1)
        vf = v.float().repeat_interleave(group, dim=1)
        s = (q.float() @ kf.transpose(-1, -2)) * scale
        if causal:
            n = q.shape[2]
            s = s.masked_fill(torch.ones(n, n, device=DEV, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        return (torch.softmax(s, dim=-1) @ vf).to(BF16), lse

    def ring_inputs(seed: int, s_local: int, D: int):
        """The whole sequence, the same on every rank."""
        S = WORLD * s_local
        g = gen(seed)
        q = torch.randn(RING_B, RING_HQ, S, D, generator=g, device=DEV).to(BF16)
        k = torch.randn(RING_B, RING_HKV, S, D, generator=g, device=DEV).to(BF16)
        v = torch.randn(RING_B, RING_HKV, S, D, generator=g, device=DEV).to(BF16)
        return q, k, v

    def mine(t: torch.Tensor, zigzag: bool) -> torch.Tensor:
        """This rank's positions of a whole [B, H, S, ...] sequence (dim 2)."""
        if zigzag:
            t = mkernel.zigzag_reorder(t, WORLD, dim=2)
        return t.chunk(WORLD, dim=2)[RANK].contiguous()

    def ring_check(seed, s_local, D, causal, placement="zigzag", layout="bhsd", what=""):
        q, k, v = ring_inputs(seed, s_local, D)
        scale = 1 / math.sqrt(D)
        ref_o, ref_lse = ring_reference(q, k, v, causal, scale)
        zig = causal and placement == "zigzag"
        ql, kl, vl = (mine(t, zig) for t in (q, k, v))
        if layout == "bshd":
            o, lse = mkernel.ring_attention(*(t.transpose(1, 2).contiguous() for t in (ql, kl, vl)), GNAME,
                                            causal=causal, layout="bshd", placement=placement)
            o = o.transpose(1, 2)
        else:
            o, lse = mkernel.ring_attention(ql, kl, vl, GNAME, causal=causal, placement=placement)
        expect_close(o, mine(ref_o, zig), f"{what} out", rtol=2e-2, atol=2e-2)
        expect_close(lse, mine(ref_lse.unsqueeze(-1), zig).squeeze(-1), f"{what} lse", rtol=1e-3, atol=1e-2)

    @case
    def ring_attention_eager():
        for i, (s_local, D, causal, placement, layout) in enumerate([
            (128, 128, False, "zigzag", "bhsd"),
            (128, 128, True, "zigzag", "bhsd"),
            (128, 64, True, "contiguous", "bhsd"),
            (RING_S, 128, True, "zigzag", "bshd"),
            (100, 64, False, "contiguous", "bshd"),   # S not a multiple of the 128-row tile
            (50, 128, True, "zigzag", "bhsd"),
        ]):
            what = f"S {s_local} D {D} causal {causal} {placement} {layout}"
            ring_check(400 + i, s_local, D, causal, placement, layout, what)

    @case
    def ring_attention_torch_compile_inductor():
        def block(q, k, v):
            o, lse = torch.ops.mkernel.ring_attention(q, k, v, GNAME, causal=True)
            return o * 2, lse

        compiled = torch.compile(block, fullgraph=True)
        for step in range(2):
            q, k, v = ring_inputs(420 + step, 128, 128)
            ref_o, ref_lse = ring_reference(q, k, v, True, 1 / math.sqrt(128))
            o, lse = compiled(*(mine(t, True) for t in (q, k, v)))
            expect_close(o, (mine(ref_o, True).float() * 2).to(BF16), f"compiled step {step} out", rtol=2e-2,
                         atol=4e-2)
            expect_close(lse, mine(ref_lse.unsqueeze(-1), True).squeeze(-1), f"compiled step {step} lse",
                         rtol=1e-3, atol=1e-2)

    @case
    def ring_attention_cuda_graph_replay():
        q, k, v = (mine(t, True) for t in ring_inputs(430, 128, 128))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            mkernel.ring_attention(q, k, v, GNAME, causal=True)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o, lse = mkernel.ring_attention(q, k, v, GNAME, causal=True)
        for replay in range(3):
            qf, kf, vf = ring_inputs(440 + replay, 128, 128)
            for dst, src in ((q, qf), (k, kf), (v, vf)):
                dst.copy_(mine(src, True))
            o.zero_()
            graph.replay()
            torch.cuda.synchronize()
            h.COMM.check()
            ref_o, ref_lse = ring_reference(qf, kf, vf, True, 1 / math.sqrt(128))
            expect_close(o, mine(ref_o, True), f"graph replay {replay} out", rtol=2e-2, atol=2e-2)
            expect_close(lse, mine(ref_lse.unsqueeze(-1), True).squeeze(-1), f"graph replay {replay} lse",
                         rtol=1e-3, atol=1e-2)

    @case
    def moe_ring_communicator_made_by_the_op():
        """Groups with no communicator: moe_dispatch makes one sized for the call (then combine
        runs on it), and ring_attention on another group makes its own."""
        group = dist.new_group(list(range(WORLD)))
        x = h.rand(MOE_T, MOE_H, seed=450)
        ids, weights = routing(451)
        W = expert_weights(452, MOE_H)
        made = None
        try:
            outs = mkernel.moe_dispatch(x, ids, weights, E, group)
            made = mkernel.get_communicator(group.group_name)
            assert made is not None and made is not h.COMM, "the op made no communicator"
            need = mkernel.moe_workspace_bytes(WORLD, MOE_T, MOE_H, E, MOE_K)
            assert made.workspace_bytes == max(1, need), (made.workspace_bytes, need)
            out = mkernel.moe_combine(expert_rows(outs[0], outs[1], W), group, num_tokens=MOE_T)
            expect_close(out, moe_reference(x, ids, weights, W), "combine on the made communicator")
            log(made.describe_moe(MOE_T, MOE_H, E, MOE_K).replace("\n", " | "))
        finally:
            if made is not None:
                made.close()
        group2 = dist.new_group(list(range(WORLD)))
        made2 = None
        try:
            ring_q = mine(ring_inputs(453, 64, 64)[0], True)
            ring_k = mine(ring_inputs(453, 64, 64)[1], True)
            o, lse = mkernel.ring_attention(ring_q, ring_k, ring_k, group2, causal=True)
            made2 = mkernel.get_communicator(group2.group_name)
            assert made2 is not None
            torch.cuda.synchronize()
            made2.check()
            log(made2.describe_ring_attention(RING_B, RING_HQ, RING_HKV, 64, 64, causal=True).replace("\n", " | "))
        finally:
            if made2 is not None:
                made2.close()
