# ag_gemm_torch.py: PyTorch's AllGather+GEMM on the shapes of ag_gemm_bench, for the side-by-side
# table: torch.ops.symm_mem.fused_all_gather_matmul (`torch_fused`) and all_gather_into_tensor then
# matmul (`torch_nccl+matmul`). Random bf16 inputs, 5 warm-up calls, medians of --iters calls
# timed with CUDA events on rank 0. Appends JSON lines like the C++ benchmarks.
#   python3 -m torch.distributed.run --nproc_per_node=2 bench/fused/ag_gemm_torch.py \
#       --shapes 8192x8192x8192,... --jsonl FILE --commit C --machine M
import argparse, datetime, json, os
import torch, torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--shapes", default="4096x8192x8192,8192x8192x8192,16384x14336x4096,32768x8192x8192")
p.add_argument("--small-m", action="store_true")
p.add_argument("--iters", type=int, default=50)
p.add_argument("--jsonl", default="")
p.add_argument("--commit", default="unknown")
p.add_argument("--machine", default="unknown")
a = p.parse_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
import torch.distributed._symmetric_memory as symm_mem
gname = dist.group.WORLD.group_name
try:
    symm_mem.enable_symm_mem_for_group(gname)
except Exception as ex:  # newer versions enable it on demand
    pass
shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",") if s]
if a.small_m:
    shapes += [(m, n, 8192) for m in (128, 256, 512, 1024, 2048) for n in (8192, 28672)]

def med(fn):
    for _ in range(5): fn()
    torch.cuda.synchronize(); dist.barrier()
    ts = []
    for _ in range(a.iters):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2], ts[len(ts) // 10], ts[min(len(ts) - 1, len(ts) * 9 // 10)]

rows = []
for (M, N, K) in shapes:
    A = torch.randn(M // world, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N // world, device="cuda", dtype=torch.bfloat16)
    Ag = torch.empty(M, K, device="cuda", dtype=torch.bfloat16)
    res = {}
    try:
        res["torch_fused"] = med(lambda: torch.ops.symm_mem.fused_all_gather_matmul(A, [B], 0, gname))
    except Exception as ex:
        if rank == 0: print(f"{M}x{N}x{K}: torch_fused failed: {ex!r}"[:300])
    def seq():
        dist.all_gather_into_tensor(Ag, A)
        return Ag @ B
    res["torch_nccl+matmul"] = med(seq)
    if rank == 0:
        for impl, (m50, p10, p90) in res.items():
            rows.append({"benchmark": "ag_gemm", "shape": {"M": M, "N": N, "K": K},
                         "split": "A rows and W rows over world", "world": world, "nodes": 1, "impl": impl,
                         "median_ms": round(m50, 4), "p10_ms": round(p10, 4), "p90_ms": round(p90, 4),
                         "iters": a.iters, "provider": "nvlink", "machine": a.machine, "commit": a.commit,
                         "date": datetime.date.today().isoformat(), "torch": torch.__version__})
        print(f"{M}x{N}x{K}: " + ", ".join(f"{k} {v[0]:.4f} ms" for k, v in res.items()), flush=True)
if rank == 0 and a.jsonl:
    with open(a.jsonl, "a") as f:
        for r in rows: f.write(json.dumps(r) + "\n")
dist.barrier(); dist.destroy_process_group()
