# ring_attention_torch.py: the unfused rings ring_attention_bench is compared with: PyTorch's
# scaled_dot_product_attention on the K/V chunk a rank holds, while NCCL send/recv
# (batch_isend_irecv) passes K and V to the next rank, one step per rank, double-buffered:
#   full        every chunk in full                                           impl "sdpa_ring"
#   contiguous  causal, rank r holds chunk r: full below r, causal at r,     impl "sdpa_ring"
#               nothing above (unbalanced)                                    (placement "contiguous")
#   causal      causal, zigzag placement (chunks r and 2R-1-r): the visible  impl "sdpa_ring_zigzag"
#               half-chunk pairs only (balanced)
# Like ../shared/baselines/ring_causal_baseline.py (whose numbers the issue quotes), the partial
# outputs are not merged: the times are SDPA plus communication, a lower bound for a real ring.
# With NCCL_P2P_DISABLE=1 in the environment NCCL moves through host memory (the fair baseline for
# two GPUs emulated as two nodes); pass --nodes so the records say nodes = world.
#
#   python3 -m torch.distributed.run --nproc_per_node=2 bench/attention/ring_attention_torch.py \
#       [--seqs 32768,131072] [--heads 32] [--heads-kv 32] [--dim 128] [--mask full,causal,contiguous]
#       [--iters 10] [--nodes] [--jsonl FILE] [--commit C] [--machine M]
import argparse
import datetime
import json
import os

import torch
import torch.distributed as dist
from torch.nn.functional import scaled_dot_product_attention as sdpa


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="32768,131072")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--mask", default="full,causal,contiguous")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--nodes", action="store_true")
    ap.add_argument("--jsonl", default="")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--machine", default="unknown")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    H, Hkv, D = a.heads, a.heads_kv, a.dim
    gqa = H != Hkv

    def att(q, k, v, causal=False):
        return sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)

    def median_ms(fn, warm=3):
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        ts = []
        for _ in range(a.iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        ts.sort()
        return ts[len(ts) // 2], ts[len(ts) // 10], ts[(len(ts) * 9) // 10], len(ts)

    rows = []
    for S in [int(x) for x in a.seqs.split(",")]:
        if S % (2 * world):
            continue
        s = S // world
        q = torch.randn(1, H, s, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, Hkv, s, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        buf = [torch.empty_like(k), torch.empty_like(v), torch.empty_like(k), torch.empty_like(v)]
        nxt, prv = (rank + 1) % world, (rank - 1) % world

        def ring(compute):
            kk, vv, spare = k, v, 0
            for step in range(world):
                reqs = []
                if step < world - 1:
                    kb, vb = buf[2 * spare], buf[2 * spare + 1]
                    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, kk, nxt), dist.P2POp(dist.irecv, kb, prv),
                                                   dist.P2POp(dist.isend, vv, nxt), dist.P2POp(dist.irecv, vb, prv)])
                compute((rank - step) % world, kk, vv)
                for r in reqs:
                    r.wait()
                if reqs:
                    kk, vv, spare = kb, vb, 1 - spare

        def full(j, kk, vv):
            att(q, kk, vv)

        def contiguous(j, kk, vv):
            if j < rank:
                att(q, kk, vv)
            elif j == rank:
                att(q, kk, vv, causal=True)

        h = s // 2
        mine = (rank, 2 * world - 1 - rank)

        def zigzag(j, kk, vv):
            theirs = (j, 2 * world - 1 - j)
            for ai, qc in enumerate(mine):
                for bi, kc in enumerate(theirs):
                    if kc > qc:
                        continue
                    att(q[:, :, ai * h:(ai + 1) * h], kk[:, :, bi * h:(bi + 1) * h], vv[:, :, bi * h:(bi + 1) * h],
                        causal=kc == qc)

        kinds = {"full": (full, "sdpa_ring", "none"), "contiguous": (contiguous, "sdpa_ring", "contiguous"),
                 "causal": (zigzag, "sdpa_ring_zigzag", "zigzag")}
        for m in a.mask.split(","):
            fn, impl, placement = kinds[m]
            med, p10, p90, n = median_ms(lambda: ring(fn))
            rows.append(dict(benchmark="ring_attention",
                             shape=dict(B=1, H=H, H_kv=Hkv, S=S, D=D, causal=m != "full", placement=placement,
                                        layout="BHSD"),
                             world=world, nodes=world if a.nodes else 1, impl=impl, median_ms=round(med, 4),
                             p10_ms=round(p10, 4), p90_ms=round(p90, 4), iters=n,
                             nccl_p2p_disabled=os.environ.get("NCCL_P2P_DISABLE") == "1", machine=a.machine,
                             commit=a.commit, date=datetime.date.today().isoformat(), torch=torch.__version__))
        del q, k, v, buf
        torch.cuda.empty_cache()
    if rank == 0:
        print(f"SDPA + NCCL rings, {world} ranks{' as nodes (NCCL_P2P_DISABLE=1)' if a.nodes else ''}, H {H}/{Hkv}, D {D}")
        for r in rows:
            print(f"  S {r['shape']['S']:>7} {r['shape']['placement']:>10} {r['impl']:<17} {r['median_ms']:9.3f} ms")
        if a.jsonl:
            with open(a.jsonl, "a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
