# moe_mlp_torch.py: the expert-parallel MoE MLP layer in PyTorch, the comparison for moe_bench --mlp
# (mkernel's MoeMlp). Per rank: route (sort the token choices by expert), gather the rows, NCCL
# all_to_all to the experts' ranks (with one rank a local copy), torch._grouped_mm with w1 (gate
# and up, [E_local, H, 2I]), silu(gate) * up, torch._grouped_mm with w2 ([E_local, I, H]),
# all_to_all back, and the score-weighted sum per token (index_add_). Timed whole ("layer", what a
# model runs) and as the two grouped GEMMs with the activation alone ("experts"), medians of CUDA
# events after warm-up, on the same shapes and routings as moe_bench (uniform; zipf_logits is
# moe_baseline.py's Zipf: top-k of Gaussian logits over a Zipf prior).
#
#   OUT=dir torchrun --nproc_per_node=N moe_mlp_torch.py [--tokens 128,4096] [--routing uniform,zipf_logits]
#                    [--iters 20] [--commit C] [--machine M]
# Rows go to $OUT/moe_mlp_torch.jsonl (impl torch_mlp_layer, torch_mlp_experts) and a table to stdout
# on rank 0.
import argparse
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="128,4096")
    ap.add_argument("--routing", default="uniform,zipf_logits")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--machine", default="unknown")
    a = ap.parse_args()
    if not hasattr(torch, "_grouped_mm"):
        print("moe_mlp_torch: this torch has no torch._grouped_mm; nothing to compare", file=sys.stderr)
        return 1
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    H, I, E, K = a.hidden, a.inter, a.experts, a.top_k
    if E % world:
        print(f"moe_mlp_torch: --experts {E} is not a multiple of the world size {world}", file=sys.stderr)
        return 1
    El = E // world
    g = torch.Generator(device="cuda").manual_seed(1234 + rank)
    w1 = torch.randn(El, H, 2 * I, device="cuda", dtype=torch.bfloat16, generator=g) * 0.03
    w2 = torch.randn(El, I, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.03

    def med_ms(fn, iters, warm=3):
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        ts = []
        for _ in range(iters):
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        ts.sort()
        return ts[len(ts) // 2]

    rows = []
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    for T in [int(t) for t in a.tokens.split(",")]:
        for routing in a.routing.split(","):
            if routing not in ("uniform", "zipf_logits"):
                print(f"moe_mlp_torch: --routing {routing}; expected uniform or zipf_logits", file=sys.stderr)
                return 2
            x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g)
            logits = torch.randn(T, E, device="cuda", generator=g)
            if routing == "zipf_logits":
                prior = 1.0 / torch.arange(1, E + 1, device="cuda").float() ** 1.1
                logits = torch.log(prior)[None, :] + logits
            topv, topi = logits.topk(K, dim=1)
            scores = torch.softmax(topv, dim=1)

            def layer(keep=None):
                flat_e = topi.reshape(-1)
                order = torch.argsort(flat_e, stable=True)
                tok = torch.arange(T, device="cuda").repeat_interleave(K)[order]
                dest = flat_e[order] // El
                send = torch.bincount(dest, minlength=world)
                recv = torch.empty_like(send)
                dist.all_to_all_single(recv, send)
                sc, rc = send.tolist(), recv.tolist()
                xin = torch.empty(sum(rc), H, device="cuda", dtype=torch.bfloat16)
                dist.all_to_all_single(xin, x[tok], rc, sc)
                eid = torch.empty(sum(rc), device="cuda", dtype=torch.int64)
                dist.all_to_all_single(eid, flat_e[order] % El, rc, sc)
                o2 = torch.argsort(eid, stable=True)
                xs = xin[o2]
                offs = torch.cumsum(torch.bincount(eid, minlength=El), 0).to(torch.int32)
                if keep is not None:
                    keep.update(xs=xs, offs=offs)
                y1 = torch._grouped_mm(xs, w1, offs=offs)
                h = torch.nn.functional.silu(y1[:, :I]) * y1[:, I:]
                y2 = torch._grouped_mm(h, w2, offs=offs)
                back_in = torch.empty_like(y2)
                back_in[o2] = y2
                back = torch.empty(T * K, H, device="cuda", dtype=torch.bfloat16)
                dist.all_to_all_single(back, back_in, sc, rc)
                out = torch.zeros(T, H, device="cuda", dtype=torch.float32)
                out.index_add_(0, tok, back.float() * scores.reshape(-1)[order][:, None])
                return out.to(torch.bfloat16)

            keep = {}
            layer(keep)
            xs, offs = keep["xs"], keep["offs"]

            def experts():
                y1 = torch._grouped_mm(xs, w1, offs=offs)
                h = torch.nn.functional.silu(y1[:, :I]) * y1[:, I:]
                return torch._grouped_mm(h, w2, offs=offs)

            t_layer = med_ms(layer, a.iters)
            t_exp = med_ms(experts, a.iters)
            for impl, ms in (("torch_mlp_layer", t_layer), ("torch_mlp_experts", t_exp)):
                rows.append({"bench": "moe", "date": date, "machine": a.machine, "commit": a.commit, "impl": impl,
                             "world": world, "shape": {"T": T, "H": H, "I": I, "E": E, "top_k": K,
                                                       "routing": routing, "mlp": "swiglu"},
                             "median_ms": round(ms, 4), "iters": a.iters, "rows_recv": int(xs.shape[0])})
    if rank == 0:
        out = os.environ.get("OUT", ".")
        with open(os.path.join(out, "moe_mlp_torch.jsonl"), "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        print(f"moe_mlp_torch: world {world}, H {H}, I {I}, E {E}, top-{K}, medians of {a.iters} (ms)")
        print(f"{'T':>7} {'routing':<12} {'layer':>9} {'experts':>9} {'rows':>8}")
        for i in range(0, len(rows), 2):
            r = rows[i]
            print(f"{r['shape']['T']:>7} {r['shape']['routing']:<12} {r['median_ms']:>9.3f} "
                  f"{rows[i + 1]['median_ms']:>9.3f} {r['rows_recv']:>8}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
