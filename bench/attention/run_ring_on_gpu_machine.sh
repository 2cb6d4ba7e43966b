#!/usr/bin/env bash
# run_ring_on_gpu_machine.sh: the ring-attention benchmark on the GPU machine, one call: the fused
# ring (ring_attention_bench) beside R x our core alone and the SDPA + NCCL rings
# (ring_attention_torch.py) over NVLink, then with --nodes every GPU as a node through the proxies
# beside the same rings with NCCL_P2P_DISABLE=1; appended to $OUT/ring_attention.jsonl, then a
# table of ratios read back from it.
#   bench/attention/run_ring_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE [--nodes]
set -u
bundle=${1:?usage: run_ring_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE [--nodes]}
commit=${2:?commit}
machine=${3:?machine}
nodes=${4:-}
OUT=${OUT:-./ring-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/../gpu_machine_env.sh"
jl="$OUT/ring_attention.jsonl"
common=(--jsonl "$jl" --commit "$commit" --machine "$machine")
shapes=(--seqs 32768,131072 --heads 32 --heads-kv 32 --dim 128)

echo "== ring_attention_bench, $gpus GPUs over NVLink"
timeout 500 "$bundle/bin/ring_attention_bench" --world "$gpus" "${shapes[@]}" --mask full,causal,contiguous \
  --iters 12 --rounds 3 "${common[@]}" > "$OUT/ring_nvlink.log" 2>&1
echo "exit $?"
echo "== SDPA + NCCL rings over NVLink"
timeout 400 "$py" -m torch.distributed.run --nproc_per_node="$gpus" bench/attention/ring_attention_torch.py \
  "${shapes[@]}" --mask full,causal,contiguous --iters 10 "${common[@]}" > "$OUT/ring_torch.log" 2>&1
echo "exit $?"
if [ "$nodes" = "--nodes" ]; then
  echo "== ring_attention_bench, $gpus GPUs as nodes through the proxies (shm)"
  timeout 500 "$bundle/bin/ring_attention_bench" --world "$gpus" --nodes "${shapes[@]}" --mask causal \
    --iters 6 --rounds 2 "${common[@]}" > "$OUT/ring_nodes.log" 2>&1
  echo "exit $?"
  echo "== SDPA + NCCL rings through host memory (NCCL_P2P_DISABLE=1)"
  NCCL_P2P_DISABLE=1 timeout 400 "$py" -m torch.distributed.run --nproc_per_node="$gpus" \
    bench/attention/ring_attention_torch.py "${shapes[@]}" --mask causal --nodes --iters 6 "${common[@]}" \
    > "$OUT/ring_torch_nodes.log" 2>&1
  echo "exit $?"
fi
cat "$OUT"/ring_nvlink.log "$OUT"/ring_torch.log 2>/dev/null | tail -30
[ "$nodes" = "--nodes" ] && cat "$OUT"/ring_nodes.log "$OUT"/ring_torch_nodes.log 2>/dev/null | tail -20
# Ratios from this commit's records: ours / each baseline (below 1: ours faster).
"$py" - "$jl" "$commit" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
recs = [r for r in recs if r.get("commit") == sys.argv[2] and r.get("world", 1) > 1]
key = lambda r: (r["shape"]["S"], r["shape"].get("causal", False), r["nodes"])
by = {}
for r in recs:
    name = r["impl"] + ("_contiguous" if r["shape"].get("placement") == "contiguous" else "")
    by.setdefault(key(r), {})[name] = r["median_ms"]
print(f"{'S':>7} {'causal':>6} {'nodes':>5} {'mkernel':>9}  ours / each other row (below 1: ours faster)")
for (S, causal, nodes), m in sorted(by.items()):
    ours = m.get("mkernel")
    others = " ".join(f"{k} {v:.3f} ms ({ours / v:.2f})" for k, v in sorted(m.items()) if k != "mkernel" and ours)
    print(f"{S:>7} {str(causal):>6} {nodes:>5} {ours or 0:9.3f}  {others}")
EOF
