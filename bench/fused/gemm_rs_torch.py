# gemm_rs_torch.py: PyTorch's GEMM+ReduceScatter on the shapes of gemm_rs_bench, for the
# side-by-side table: torch.ops.symm_mem.fused_matmul_reduce_scatter (`torch_fused`) and matmul
# then reduce_scatter_tensor (`torch_nccl+matmul`). Rank r holds A_r [M, K/world] and
# W_r [N, K/world] (nn.Linear layout) and gets rows r*M/world ... of sum over q of A_q W_q^T.
# Random bf16 inputs, torch_fused checked against torch_nccl+matmul (rel. Frobenius error < 1e-2)
# before timing, 5 warm-up calls, medians of --iters calls timed with CUDA events on rank 0.
# Appends JSON lines like the C++ benchmarks; prints a table last with torch / mkernel, taking
# mkernel's medians from the same --jsonl file (gemm_rs_bench's records of this commit, world and
# machine) when they are there. NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are set here before torch starts).
#   python3 -m torch.distributed.run --nproc_per_node=2 bench/fused/gemm_rs_torch.py \
#       --small-m --odd --jsonl FILE --commit C --machine M
import argparse, datetime, json, os, sys

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
import torch, torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--shapes", default="4096x8192x8192,8192x8192x8192,16384x14336x4096,32768x8192x8192")
p.add_argument("--small-m", action="store_true")
p.add_argument("--odd", action="store_true")
p.add_argument("--iters", type=int, default=50)
p.add_argument("--jsonl", "--json", default="")
p.add_argument("--commit", default="unknown")
p.add_argument("--machine", default="unknown")
a = p.parse_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
import torch.distributed._symmetric_memory as symm_mem
gname = dist.group.WORLD.group_name
try:
    symm_mem.enable_symm_mem_for_group(gname)
except Exception:  # newer versions enable it on demand
    pass
shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",") if s]
if a.small_m:
    shapes += [(m, 8192, k) for m in (128, 256, 512, 1024, 2048) for k in (8192, 28672)]
if a.odd:  # M not a multiple of 128 x world, N a multiple of 8 only (as gemm_rs_bench --odd)
    shapes += [(4104, 8200, 8192), (1000, 4104, 4160), (8200, 1544, 2112)]
for (M, N, K) in shapes:
    if M % world or K % world:
        if rank == 0:
            print(f"gemm_rs_torch: shape {M}x{N}x{K} does not split over {world} ranks (M % world, K % world)")
        sys.exit(2)

def med(fn):
    for _ in range(5): fn()
    torch.cuda.synchronize(); dist.barrier()
    ts = []
    for _ in range(a.iters):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2], ts[len(ts) // 10], ts[min(len(ts) - 1, len(ts) * 9 // 10)]

def rel_err(x, y):
    x, y = x.float(), y.float()
    if not torch.isfinite(x).all(): return float("inf")
    return ((x - y).norm() / y.norm().clamp_min(1e-30)).item()

rows, table, wrong = [], [], []
g = torch.Generator(device="cuda")
for si, (M, N, K) in enumerate(shapes):
    k = K // world
    g.manual_seed(1000 + si * 64 + rank)
    A = torch.rand(M, k, device="cuda", dtype=torch.bfloat16, generator=g) * 2 - 1
    W = torch.rand(N, k, device="cuda", dtype=torch.bfloat16, generator=g) * 2 - 1
    B = W.t()  # [k, N]: A @ B is this rank's partial
    out = torch.empty(M // world, N, device="cuda", dtype=torch.bfloat16)
    def seq():
        dist.reduce_scatter_tensor(out, A @ B)
        return out
    ref = seq().clone()
    res, errs = {}, {}
    fused = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, gname)
    try:
        errs["torch_fused"] = rel_err(fused(), ref)
    except Exception as ex:  # not supported for this shape or world: no record, said here
        if rank == 0: print(f"{M}x{N}x{K}: torch_fused failed: {ex!r}"[:300], flush=True)
    if "torch_fused" in errs:
        good = torch.tensor([1 if errs["torch_fused"] < 1e-2 else 0], device="cuda")
        dist.all_reduce(good, op=dist.ReduceOp.MIN)  # every rank times it, or none does
        if not errs["torch_fused"] < 1e-2:
            wrong.append(f"{M}x{N}x{K} on rank {rank}: rel err {errs['torch_fused']:.3e}")
        if good.item() == 1:
            res["torch_fused"] = med(fused)
    res["torch_nccl+matmul"] = med(seq)
    errs["torch_nccl+matmul"] = 0.0
    if rank == 0:
        for impl, (m50, p10, p90) in res.items():
            rows.append({"benchmark": "gemm_rs", "shape": {"M": M, "N": N, "K": K},
                         "split": "K over world (A columns and W columns); result rows over world", "world": world,
                         "nodes": 1, "impl": impl, "median_ms": round(m50, 4), "p10_ms": round(p10, 4),
                         "p90_ms": round(p90, 4), "iters": a.iters, "rel_err_vs_unfused": float(f"{errs[impl]:.2e}"),
                         "provider": "nvlink" if world > 1 else "none (one rank)", "machine": a.machine,
                         "commit": a.commit, "date": datetime.date.today().isoformat(), "torch": torch.__version__})
        table.append((M, N, K, res))
        print(f"{M}x{N}x{K}: " + ", ".join(f"{i} {v[0]:.4f} ms" for i, v in res.items()), flush=True)
    del A, W, B, out, ref

if rank == 0:
    ours = {}  # gemm_rs_bench's mkernel medians of this commit, world and machine, from the same file
    if a.jsonl and os.path.exists(a.jsonl):
        with open(a.jsonl) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if (r.get("benchmark") == "gemm_rs" and r.get("impl") == "mkernel" and r.get("world") == world
                        and r.get("nodes") == 1 and r.get("commit") == a.commit and r.get("machine") == a.machine):
                    s = r["shape"]
                    ours[(s["M"], s["N"], s["K"])] = r["median_ms"]
        with open(a.jsonl, "a") as f:
            for r in rows: f.write(json.dumps(r) + "\n")
    print(f"\ngemm_rs_torch: world {world}, {a.machine}, commit {a.commit}, torch {torch.__version__}")
    print("checked before timing: torch_fused vs torch_nccl+matmul (rel. Frobenius error < 1e-2)")
    print(f"{'M x N x K':<20} {'torch_fused':>12} {'nccl+matmul':>12} {'mkernel':>10} {'fused/mk':>9} {'seq/mk':>9}")
    for (M, N, K, res) in table:
        mine = ours.get((M, N, K), 0.0)
        tf = res.get("torch_fused", (0.0,))[0]
        ts = res["torch_nccl+matmul"][0]
        ratio = lambda t: f"{t / mine:9.3f}" if mine > 0 and t > 0 else f"{'-':>9}"
        print(f"{f'{M}x{N}x{K}':<20} {tf:12.4f} {ts:12.4f} {mine:10.4f} {ratio(tf)} {ratio(ts)}")
    print("(fused/mk: torch_fused / mkernel; seq/mk: torch_nccl+matmul / mkernel; mkernel from gemm_rs_bench's "
          "records in the same --jsonl file, '-' where there are none)")
dist.barrier(); dist.destroy_process_group()
if wrong:
    print("gemm_rs_torch: torch_fused disagrees with torch_nccl+matmul (bound 1e-2): " + "; ".join(wrong), flush=True)
    sys.exit(1)
