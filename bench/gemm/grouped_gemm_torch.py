#!/usr/bin/env python3
"""torch._grouped_mm on the grouped GEMM benchmark's cases, and the combined table.

    python3 grouped_gemm_torch.py --cases CASES.json [--json FILE] [--iters N] [--commit SHA]
    python3 grouped_gemm_torch.py --report FILE [--commit SHA]

The first form times torch._grouped_mm (PyTorch's grouped GEMM, called as in
../shared/baselines/moe_baseline.py: packed rows, a [G, K, N] weight, int32 cumulative row ends
as `offs`) on the counts grouped_gemm_bench wrote with --cases-out, so both see the same
routing. The weight is the benchmark's [G, N, K] tensor (nn.Linear layout) passed transposed,
[G, K, N] with K contiguous, which is the layout _grouped_mm takes without a copy on Hopper; if
this PyTorch refuses it, a contiguous [G, K, N] copy is timed instead and the record says so.
Median of per-call event times after warm-up, random bf16 inputs; one JSON line per case
(impl torch_grouped_mm) appended to FILE.

The second form prints the table of the last run (one commit) from FILE: mkernel,
cublas_loop, mkernel_dense, torch_grouped_mm per case, and the ratios the issue asks for.
"""
import argparse
import datetime
import json
import subprocess
import sys


def commit_here():
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], stderr=subprocess.DEVNULL,
                                       text=True).strip()
    except Exception:
        return "unknown"


def time_cases(args):
    try:
        import torch
    except ImportError:
        print(f"SKIPPED grouped_gemm_torch: no torch in {sys.executable} (the GPU machine has it at "
              "/opt/torch/.venv/bin/python3)")
        return 77
    if args.machine is None:  # the GPU that ran the records
        args.machine = "1x" + torch.cuda.get_device_name(0).replace(" ", "_") if torch.cuda.is_available() else "unknown"
    if not torch.cuda.is_available():
        print("SKIPPED grouped_gemm_torch: no CUDA device")
        return 77
    if not hasattr(torch, "_grouped_mm"):
        print(f"SKIPPED grouped_gemm_torch: torch {torch.__version__} has no _grouped_mm")
        return 77
    spec = json.load(open(args.cases))
    G = spec["experts"]
    torch.manual_seed(spec["seed"])
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = open(args.json, "a") if args.json else None
    for c in spec["cases"]:
        counts = c["counts"]
        rows, N, K = sum(counts), c["N"], c["K"]
        x = torch.randn(rows, K, device="cuda", dtype=torch.bfloat16)
        w_nk = torch.randn(G, N, K, device="cuda", dtype=torch.bfloat16) * 0.05
        offs = torch.cumsum(torch.tensor(counts, device="cuda", dtype=torch.int64), 0).to(torch.int32)
        layout = "w [G,N,K] transposed (K-major)"
        w = w_nk.transpose(-2, -1)
        try:
            y = torch._grouped_mm(x, w, offs=offs)
        except Exception as e:  # this PyTorch wants another layout: time a copy, say so
            w = w_nk.transpose(-2, -1).contiguous()
            layout = f"w [G,K,N] contiguous copy ({type(e).__name__})"
            y = torch._grouped_mm(x, w, offs=offs)
        # Spot check: the largest group against a plain matmul.
        g = max(range(G), key=lambda i: counts[i])
        lo = sum(counts[:g])
        ref = x[lo:lo + counts[g]].float() @ w_nk[g].float().t()
        err = ((y[lo:lo + counts[g]].float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()

        def call():
            torch._grouped_mm(x, w, offs=offs)

        for _ in range(args.warmup):
            call()
        torch.cuda.synchronize()
        ts = []
        for _ in range(args.iters):
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            call()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        ts.sort()
        med, p10, p90 = ts[len(ts) // 2], ts[len(ts) // 10], ts[(len(ts) * 9) // 10]
        tflops = 2.0 * rows * N * K / (med * 1e-3) / 1e12
        print(f"{c['case']:22s} torch_grouped_mm {med:.3f} ms {tflops:.1f} TFLOP/s (largest group rel err {err:.2e}; {layout})")
        rec = {"benchmark": "grouped_gemm",
               "shape": {"case": c["case"], "experts": G, "tokens": c["tokens"], "topk": spec["topk"], "rows": rows,
                         "N": N, "K": K, "routing": c["routing"], "max_rows": max(counts),
                         "empty_experts": sum(1 for v in counts if v == 0)},
               "world": 1, "nodes": 1, "impl": "torch_grouped_mm", "median_ms": round(med, 4),
               "p10_ms": round(p10, 4), "p90_ms": round(p90, 4), "iters": len(ts), "tflops": round(tflops, 1),
               "config": f"torch {torch.__version__}; {layout}; spot rel err {err:.2e}", "seed": spec["seed"],
               "machine": args.machine, "commit": args.commit or commit_here(), "date": date}
        if out:
            out.write(json.dumps(rec) + "\n")
        del x, w, w_nk, y, ref
        torch.cuda.empty_cache()
    return 0


def report(args):
    try:
        recs = [json.loads(l) for l in open(args.report) if l.strip()]
    except FileNotFoundError:
        print(f"no records: {args.report} does not exist (did the benchmark run?)")
        return 1
    recs = [r for r in recs if r.get("benchmark") == "grouped_gemm"]
    if not recs:
        print("no grouped_gemm records in", args.report)
        return 1
    commit = args.commit or recs[-1]["commit"]
    by = {}
    order = []
    for r in recs:
        if r["commit"] != commit:
            continue
        key = r["shape"]["case"]
        if key not in by:
            order.append(key)
            by[key] = {"shape": r["shape"]}
        by[key][r["impl"]] = r  # the last record of an impl wins
    print(f"\ngrouped GEMM, commit {commit} (TFLOP/s from medians; ratios are times: other / mkernel)")
    hdr = f"{'case':22s} {'rows':>7s} {'max':>6s} {'empty':>5s} | {'mkernel':>8s} {'torch':>8s} {'cub_loop':>8s} " \
          f"{'mk_dense':>8s} | {'vs torch':>8s} {'vs loop':>8s} {'vs dense':>8s}"
    print(hdr)
    print("-" * len(hdr))

    def tf(d, impl):
        return f"{d[impl]['tflops']:8.1f}" if impl in d else f"{'-':>8s}"

    def ratio(d, impl):
        if impl in d and "mkernel" in d:
            return f"{d[impl]['median_ms'] / d['mkernel']['median_ms']:8.3f}"
        return f"{'-':>8s}"

    for key in order:
        d = by[key]
        s = d["shape"]
        print(f"{key:22s} {s['rows']:7d} {s['max_rows']:6d} {s['empty_experts']:5d} | {tf(d, 'mkernel')} "
              f"{tf(d, 'torch_grouped_mm')} {tf(d, 'cublas_loop')} {tf(d, 'mkernel_dense')} | "
              f"{ratio(d, 'torch_grouped_mm')} {ratio(d, 'cublas_loop')} {ratio(d, 'mkernel_dense')}")
    print("goals (issue 13): vs torch >= 1.0 on every case; vs dense >= 0.9 with uniform routing")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", help="cases file written by grouped_gemm_bench --cases-out")
    p.add_argument("--report", help="print the table of the last run from this JSON lines file")
    p.add_argument("--json", help="append one JSON line per case here")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--commit", default="")
    p.add_argument("--machine", default=None)
    args = p.parse_args()
    if args.report:
        return report(args)
    if args.cases:
        return time_cases(args)
    p.error("one of --cases or --report is needed")


if __name__ == "__main__":
    sys.exit(main())
