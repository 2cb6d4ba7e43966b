#!/usr/bin/env python3
# attention_bench.py: the attention core (kernels/attention) beside PyTorch's
# scaled_dot_product_attention with the flash backend, on the same inputs in one process.
#
#   python3 bench/attention/attention_bench.py --lib BUILD/bench/attention/libmkernel_attention_capi.so \
#       [--jsonl bench/results/ring_attention.jsonl --commit C --machine 1xH200] [--variants] [--check-only]
#
# 1. Correctness against SDPA (output and log-sum-exp) and against fp32 attention on upcast inputs
#    (smaller shapes): causal and not, head dim 64 and 128, grouped-query, [B, S, H, D] inputs.
# 2. Timing (B = 1, H = 32, D = 128, S = 8K / 16K / 32K, causal and not; --head-dims 64,128 and
#    --kv-heads for other head dims and grouped-query attention): medians of CUDA-event
#    timings, the implementations interleaved round by round so drift of the card's clocks hits
#    all alike; TFLOP/s = 4 B H D (visible query-key pairs) / time, the same count for all.
#    SDPA three ways: `sdpa` (PyTorch's own backend choice, what the baselines in
#    ../shared/baselines measured), `sdpa_flash` and `sdpa_cudnn` (that backend forced). Ratios are
#    against the fastest of them. Appends one JSON line per (shape, implementation) to --jsonl.
import argparse, ctypes, datetime, json, math, os, sys, time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

p = argparse.ArgumentParser()
p.add_argument("--lib", required=True)
p.add_argument("--jsonl", default="")
p.add_argument("--commit", default="unknown")
p.add_argument("--machine", default=None)
p.add_argument("--seqs", default="8192,16384,32768")
p.add_argument("--heads", type=int, default=32)
p.add_argument("--head-dims", default="128", help="head dims to time, e.g. 64,128")
p.add_argument("--kv-heads", type=int, default=0, help="K/V heads for the timing (grouped-query); 0: as many as Q")
p.add_argument("--variants", action="store_true", help="also time every built configuration")
p.add_argument("--promo", action="store_true",
               help="also time the default configuration with each other L2 promotion of the q, k and v loads")
p.add_argument("--check-only", action="store_true")
p.add_argument("--rounds", type=int, default=3)
a = p.parse_args()
if a.machine is None:  # the GPU that ran the records
    a.machine = "1x" + torch.cuda.get_device_name(0).replace(" ", "_") if torch.cuda.is_available() else "unknown"

lib = ctypes.CDLL(a.lib)
lib.mk_attention_fwd.restype = ctypes.c_int
lib.mk_attention_fwd.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_void_p] + [ctypes.c_longlong] * 6 + \
    [ctypes.c_int] * 6 + [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
lib.mk_attention_status.restype = ctypes.c_int
lib.mk_attention_status.argtypes = [ctypes.c_char_p, ctypes.c_int]
lib.mk_attention_config.restype = ctypes.c_int
lib.mk_attention_config.argtypes = [ctypes.c_char_p, ctypes.c_int]
ERR = ctypes.create_string_buffer(1024)
BHSD, BSHD = 0, 1


def ours(q, k, v, o, lse, causal, layout=BHSD, block_n=0, pingpong=-1, order=-1, promo=-1):
    """q, k, v, o in `layout` (BHSD: [B, H, S, D]; BSHD: [B, S, H, D]); lse [B, H, S] fp32."""
    if layout == BHSD:
        B, H, S, D = q.shape
        Hkv, Skv = k.shape[1], k.shape[2]
    else:
        B, S, H, D = q.shape
        Skv, Hkv = k.shape[1], k.shape[2]
    rc = lib.mk_attention_fwd(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), B, H, Hkv, S,
                              Skv, D, layout, int(causal), block_n, pingpong, order, promo,
                              ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ERR, 1024)
    if rc != 0:
        raise RuntimeError("mk_attention_fwd: " + ERR.value.decode())


def config_string():
    buf = ctypes.create_string_buffer(128)
    lib.mk_attention_config(buf, 128)
    return buf.value.decode()


def device_status():
    buf = ctypes.create_string_buffer(512)
    code = lib.mk_attention_status(buf, 512)
    return code, buf.value.decode()


def sdpa(q, k, v, causal, backend=None):
    gqa = k.shape[1] != q.shape[1]  # [B, H, S, D]: fewer K/V heads (grouped-query)
    if backend is None:  # PyTorch's own choice, as an application gets it (cuDNN on this H200)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def sdpa_with_lse(q, k, v, causal):
    if k.shape[1] != q.shape[1]:  # the flash op takes as many K/V heads as Q heads
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)
    return r[0], r[1]


def rel(x, ref):
    x, ref = x.float(), ref.float()
    return ((x - ref).norm() / ref.norm()).item()


def flops(B, H, S, Skv, D, causal):
    pairs = S * (S + 1) // 2 if causal else S * Skv
    return 4.0 * B * H * D * pairs


failures = 0


def check_case(B, H, Hkv, S, D, causal, layout, fp32_ref):
    global failures
    dev = "cuda"
    q = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, S, D, device=dev, dtype=torch.bfloat16)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((B, H, S), float("nan"), device=dev, dtype=torch.float32)
    if layout == BSHD:
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        ot = torch.full_like(qt, float("nan"))
        ours(qt, kt, vt, ot, lse, causal, BSHD)
        o = ot.transpose(1, 2)
    else:
        ours(q, k, v, o, lse, causal)
    torch.cuda.synchronize()
    code, msg = device_status()
    kr, vr = (k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)) if Hkv != H else (k, v)
    o_sdpa, lse_sdpa = sdpa_with_lse(q, kr, vr, causal)
    e_o = rel(o, o_sdpa)
    e_lse = (lse - lse_sdpa.float()).abs().max().item()
    line = f"B{B} H{H} Hkv{Hkv} S{S} D{D} {'causal' if causal else 'full  '} {'BSHD' if layout == BSHD else 'BHSD'}: " \
           f"vs SDPA O {e_o:.2e} lse {e_lse:.2e}"
    e_ref = None
    if fp32_ref:
        ref = F.scaled_dot_product_attention(q.float(), kr.float(), vr.float(), is_causal=causal)
        e_ref = rel(o, ref)
        e_sdpa_ref = rel(o_sdpa, ref)
        line += f"; vs fp32 O {e_ref:.2e} (SDPA vs fp32 {e_sdpa_ref:.2e})"
    nan = torch.isnan(o).sum().item() + torch.isnan(lse).sum().item()
    ok = code == 0 and nan == 0 and e_o < 2e-2 and e_lse < 5e-3 and (e_ref is None or e_ref < 1e-2)
    if not ok:
        failures += 1
    print(("ok    " if ok else "FAIL  ") + line + (f"; NaN {nan}" if nan else "") + ("" if code == 0 else "; status " + msg),
          flush=True)


def time_fn(fn, iters, reps):
    """iters samples, each the mean of reps back-to-back calls between two events (the queue stays
    full, so host-side call overhead, larger through ctypes than for SDPA, is not timed)."""
    ts = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / reps)
    return ts


def main():
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).multi_processor_count} SMs",
          flush=True)
    torch.manual_seed(int(time.time()))
    print("== correctness", flush=True)
    for (B, H, Hkv, S, D, causal, layout, ref) in [
            (2, 8, 8, 1024, 128, False, BHSD, True), (2, 8, 8, 1024, 128, True, BHSD, True),
            (1, 16, 4, 2000, 64, True, BHSD, True), (1, 16, 4, 2000, 64, False, BSHD, True),
            (1, 8, 2, 3000, 128, True, BSHD, True), (1, 32, 32, 8192, 128, False, BHSD, False),
            (1, 32, 32, 8192, 128, True, BHSD, False), (1, 8, 1, 5000, 64, True, BHSD, False)]:
        check_case(B, H, Hkv, S, D, causal, layout, ref)
    if a.check_only:
        return

    print("== timing", flush=True)
    B, H = 1, a.heads
    Hkv = a.kv_heads or H
    if H % Hkv != 0:
        sys.exit(f"attention_bench: --kv-heads {Hkv} does not divide --heads {H}")
    variants = [("default", 0, -1, -1, -1)]
    if a.variants:
        variants += [("n128", 128, 1, -1, -1), ("n160", 160, 1, -1, -1), ("n192", 192, 1, -1, -1),
                     ("static order", 0, -1, 0, -1)]
    if a.promo:
        variants += [(f"pr{pr}", 0, -1, -1, pr) for pr in (0, 128, 256)]
    rows = []
    table = []
    for D, S, causal in [(d, s_, c) for d in (int(x) for x in a.head_dims.split(",") if x)
                         for s_ in (int(x) for x in a.seqs.split(",") if x) for c in (False, True)]:
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
        o = torch.empty_like(q)
        lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
        fl = flops(B, H, S, S, D, causal)
        # Correctness on the timed inputs too.
        ours(q, k, v, o, lse, causal)
        o_s, lse_s = sdpa_with_lse(q, k, v, causal)
        torch.cuda.synchronize()
        e_o, e_l = rel(o, o_s), (lse - lse_s.float()).abs().max().item()
        impls = {}
        for name, backend in (("sdpa", None), ("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                sdpa(q, k, v, causal, backend)
                torch.cuda.synchronize()
                impls[name] = ((lambda backend=backend: sdpa(q, k, v, causal, backend)),
                               "default backend" if backend is None else str(backend))
            except RuntimeError as ex:
                print(f"  {name}: {str(ex)[:200]}", flush=True)
        for (name, bn, pp, order, pr) in variants:
            try:
                ours(q, k, v, o, lse, causal, BHSD, bn, pp, order, pr)
                torch.cuda.synchronize()
                impls["mkernel_attention" if name == "default" else "mkernel_attention " + name] = (
                    (lambda bn=bn, pp=pp, order=order, pr=pr: ours(q, k, v, o, lse, causal, BHSD, bn, pp, order, pr)),
                    config_string())
            except RuntimeError as ex:
                print(f"  {name}: {ex}", flush=True)
        if a.variants:  # the same inputs held [B, S, H, D]
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
            ot = torch.empty_like(qt)
            ours(qt, kt, vt, ot, lse, causal, BSHD)
            torch.cuda.synchronize()
            impls["mkernel_attention bshd"] = ((lambda: ours(qt, kt, vt, ot, lse, causal, BSHD)),
                                               config_string() + " BSHD")
        est_ms = fl / 600e12 * 1e3
        reps = max(1, int(8 / est_ms))
        iters = max(5, min(30, int(250 / (est_ms * reps))))
        samples = {n: [] for n in impls}
        for fn, _ in impls.values():  # warm-up
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        for r in range(a.rounds):
            order = list(impls) if r % 2 == 0 else list(reversed(list(impls)))
            for n in order:
                samples[n] += time_fn(impls[n][0], iters, reps)
        code, msg = device_status()
        if code != 0:
            print("  device status: " + msg, flush=True)
        for ts in samples.values():
            ts.sort()
        base = min(ts[len(ts) // 2] for n, ts in samples.items() if n.startswith("sdpa"))
        for n, ts in samples.items():
            med = ts[len(ts) // 2]
            tf = fl / (med * 1e-3) / 1e12
            table.append((D, S, causal, n, med, tf, base / med, impls[n][1]))
            shape = {"B": B, "H": H, "H_kv": Hkv, "S": S, "D": D, "causal": causal, "layout": "BHSD"}
            rows.append({"benchmark": "ring_attention", "shape": shape, "world": 1, "nodes": 1,
                         "impl": n.replace(" ", "_"), "median_ms": round(med, 4),
                         "p10_ms": round(ts[len(ts) // 10], 4), "p90_ms": round(ts[min(len(ts) - 1, len(ts) * 9 // 10)], 4),
                         "iters": len(ts) * reps, "tflops": round(tf, 1), "config": impls[n][1],
                         "max_err_vs_sdpa": {"o_rel": float(f"{e_o:.3g}"), "lse_abs": float(f"{e_l:.3g}")},
                         "machine": a.machine, "commit": a.commit, "date": datetime.date.today().isoformat(),
                         "torch": torch.__version__})
        print(f"D={D} S={S} {'causal' if causal else 'full'}: ours vs SDPA O {e_o:.2e} lse {e_l:.2e}; " +
              ", ".join(f"{n} {sorted(ts)[len(ts) // 2]:.3f} ms" for n, ts in samples.items()), flush=True)
        del q, k, v, o, lse, o_s, lse_s, impls
        qt = kt = vt = ot = None
        torch.cuda.empty_cache()
    if a.jsonl:
        with open(a.jsonl, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"\n  D      S  mask    impl (H {H}, K/V heads {Hkv})      ms   TFLOP/s vs best sdpa  config")
    for (D, S, causal, n, med, tf, ratio, cfg) in table:
        print(f"{D:3d} {S:6d}  {'causal' if causal else 'full  '}  {n:26s} {med:8.3f} {tf:8.1f} {ratio:7.3f}  {cfg[:34]}")


main()
print(f"attention_bench: {'PASS' if failures == 0 else 'FAIL'} ({failures} correctness failure(s))")
sys.exit(1 if failures else 0)
