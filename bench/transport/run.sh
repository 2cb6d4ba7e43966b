#!/usr/bin/env bash
# run.sh: the proxy path against raw libfabric on the same provider, in one run.
#
#   bench/transport/run.sh BUILD_DIR [--record] [--providers "tcp;ofi_rxm,shm"]
#                          [--sizes 4096,65536,1048576] [--window 16] [--runs 5]
#                          [--rounds 1] [--quiet-wait SECONDS] [--producer-wait yield|sleep]
#                          [--raw-memory anon|memfd]
#
# Builds nothing: BUILD_DIR must hold daemon/mkerneld and bench/transport/mkernel-{raw-fabric,
# proxy}-bench. For each provider and size: the raw fi_writedata baseline runs first, with no
# daemon running (on a small machine idle spinning proxies would take its cores), then two
# mkerneld processes (node A and node B, own runtime dirs and configs, spin polling) are started,
# mkernel-proxy-bench carries the same writes through them, and they are stopped again. Prints a
# table; with --record appends one JSON line per (provider, size, implementation) to
# bench/results/transport.jsonl. Every step is bounded; daemons are killed on exit.
# --rounds: raw and proxy alternate this many times per size (each a full set of runs); the
# table gives the median over rounds. --quiet-wait: before each round, wait up to SECONDS for
# a second in which the CPUs are less than 10% busy. --producer-wait: how the proxy bench's
# rank 0 waits for its window (yield: spin; sleep: 50 us naps, like a GPU producer that costs
# the host nothing). --raw-memory: the raw bench's buffers (memfd: shared pages like the
# regions clients give mkerneld). other% says how much CPU other work took meanwhile.
set -euo pipefail

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 ]] || usage
BUILD=$(cd "$1" && pwd)
shift
REPO=$(cd "$(dirname "$0")/../.." && pwd)
RECORD=0
PROVIDERS="tcp;ofi_rxm,shm"
SIZES="4096,65536,1048576"
WINDOW=16
RUNS=5
QUIET_WAIT=0
ROUNDS=1
RAW_MEMORY=anon
PRODUCER_WAIT=yield
while [[ $# -gt 0 ]]; do
  case "$1" in
    --record) RECORD=1 ;;
    --providers) PROVIDERS=$2; shift ;;
    --sizes) SIZES=$2; shift ;;
    --window) WINDOW=$2; shift ;;
    --runs) RUNS=$2; shift ;;
    --quiet-wait) QUIET_WAIT=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --raw-memory) RAW_MEMORY=$2; shift ;;
    --producer-wait) PRODUCER_WAIT=$2; shift ;;
    *) usage ;;
  esac
  shift
done

MKERNELD=$BUILD/daemon/mkerneld
RAW=$BUILD/bench/transport/mkernel-raw-fabric-bench
PROXY=$BUILD/bench/transport/mkernel-proxy-bench
for bin in "$MKERNELD" "$RAW" "$PROXY"; do
  [[ -x $bin ]] || { echo "run.sh: $bin not built" >&2; exit 2; }
done

WORK=$(mktemp -d /tmp/mk-tbench.XXXXXX)
DAEMON_PIDS=()
stop_daemons() {
  local pid
  for pid in "${DAEMON_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${DAEMON_PIDS[@]}"; do
    # Bounded: TERM, then KILL after 10 s.
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  DAEMON_PIDS=()
}
cleanup() {
  stop_daemons
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_daemons PROVIDER: nodes a and b, each with its own runtime dir and config.
start_daemons() {
  local provider=$1 nic node dir
  if [[ $provider == shm ]]; then nic=auto; else nic=lo; fi
  for node in a b; do
    dir=$WORK/$node
    rm -rf "$dir"
    mkdir -p "$dir"
    cat >"$dir/mkerneld.yaml" <<EOF
node:
  name: "bench-$node"
  runtime_dir: "$dir"
gpus:
  select: host_slots
  host_slots: 1
proxy:
  cpu_affinity: none
  poll:
    mode: spin
transport:
  kind: fabric
  provider: "$provider"
  nic: "$nic"
peer:
  listen: ["unix:peer.sock"]
grpc:
  listen: ["unix:admin.sock"]
logging:
  level: warn
EOF
    "$MKERNELD" --foreground --config "$dir/mkerneld.yaml" --runtime-dir "$dir" \
      >"$dir/stdout.log" 2>"$dir/stderr.log" &
    DAEMON_PIDS+=($!)
  done
  for node in a b; do
    dir=$WORK/$node
    for _ in $(seq 150); do
      [[ -S $dir/mkerneld.sock && -S $dir/peer.sock ]] && break
      sleep 0.1
    done
    if [[ ! -S $dir/mkerneld.sock || ! -S $dir/peer.sock ]]; then
      echo "run.sh: mkerneld for node $node ($provider) did not open its sockets within 15 s:" >&2
      tail -20 "$dir/stderr.log" >&2
      return 1
    fi
  done
}

# busy_percent: share of all CPUs busy over the next second (from /proc/stat).
busy_percent() {
  local a b
  a=$(awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat)
  sleep 1
  b=$(awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat)
  awk -v a="$a" -v b="$b" 'BEGIN{split(a,x," "); split(b,y," "); busy=y[1]-x[1]; idle=y[2]-x[2];
    total=busy+idle; if (total <= 0) total=1; printf "%d\n", 100*busy/total + 0.5}'
}
# wait_quiet: bounded by --quiet-wait; prints the last busy share.
wait_quiet() {
  local deadline=$((SECONDS + QUIET_WAIT)) busy
  busy=$(busy_percent)
  while [[ $busy -ge 10 && $SECONDS -lt $deadline ]]; do
    sleep 4
    busy=$(busy_percent)
  done
  echo "$busy"
}

RESULTS=$WORK/results.jsonl
: >"$RESULTS"
OTHER=$WORK/other
: >"$OTHER"
FAILED=0

# CPU accounting in clock ticks, to say how much of the machine other work took during each
# measurement: all busy ticks minus those of our processes (the benches, which this shell waits
# for, and the daemons).
ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat; }
children_ticks() { awk '{print $16+$17}' "/proc/$$/stat"; }
daemon_ticks() {
  local sum=0 pid t
  for pid in "${DAEMON_PIDS[@]}"; do
    t=$(awk '{print $14+$15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
    sum=$((sum + t))
  done
  echo "$sum"
}
MEASURE_START=""
measure_start() { MEASURE_START="$(ticks) $(children_ticks) $(daemon_ticks)"; }
# measure_end IMPL PROVIDER SIZE: appends the share of CPU time other work took.
measure_end() {
  local now
  now="$(ticks) $(children_ticks) $(daemon_ticks)"
  awk -v a="$MEASURE_START" -v b="$now" -v tag="$1|$2|$3" 'BEGIN{split(a,x," "); split(b,y," ");
    busy=y[1]-x[1]; idle=y[2]-x[2]; ours=(y[3]-x[3])+(y[4]-x[4]); total=busy+idle;
    if (total <= 0) total=1; other=busy-ours; if (other < 0) other=0;
    printf "%s|%d\n", tag, 100*other/total + 0.5}' >>"$OTHER"
}

IFS=',' read -r -a PROVIDER_LIST <<<"$PROVIDERS"
IFS=',' read -r -a SIZE_LIST <<<"$SIZES"
for provider in "${PROVIDER_LIST[@]}"; do
  if [[ $provider == shm ]]; then domain=""; else domain=lo; fi
  for size in "${SIZE_LIST[@]}"; do
    for round in $(seq "$ROUNDS"); do
      busy=$(wait_quiet)
      [[ $busy -lt 10 ]] || echo "run.sh: the CPUs were ${busy}% busy with other work before this round" >&2
      echo "== $provider, $size bytes, round $round: raw fi_writedata" >&2
      measure_start
      if timeout 600 "$RAW" --provider "$provider" --domain "$domain" --sizes "$size" \
          --window "$WINDOW" --runs "$RUNS" --memory "$RAW_MEMORY" >>"$RESULTS"; then
        measure_end raw "$provider" "$size"
      else
        echo "run.sh: raw bench failed ($provider, $size bytes)" >&2
        FAILED=1
      fi
      echo "== $provider, $size bytes, round $round: proxy path (mkerneld A -> mkerneld B)" >&2
      if start_daemons "$provider"; then
        measure_start
        if timeout 600 "$PROXY" --socket-a "$WORK/a/mkerneld.sock" --socket-b "$WORK/b/mkerneld.sock" \
            --provider "$provider" --sizes "$size" --window "$WINDOW" --runs "$RUNS" \
            --producer-wait "$PRODUCER_WAIT" >>"$RESULTS"; then
          measure_end proxy "$provider" "$size"
        else
          echo "run.sh: proxy bench failed ($provider, $size bytes); daemon logs:" >&2
          for node in a b; do echo "-- node $node" >&2; tail -20 "$WORK/$node/stderr.log" >&2; done
          FAILED=1
        fi
      else
        FAILED=1
      fi
      stop_daemons
    done
  done
done

COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=false
[[ -n $(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null) ]] && DIRTY=true
LIBFABRIC=$(pkg-config --modversion libfabric 2>/dev/null || echo unknown)
MACHINE="$(uname -n) ($(nproc) cores)"
OUTFILE=""
[[ $RECORD == 1 ]] && OUTFILE=$REPO/bench/results/transport.jsonl

python3 - "$RESULTS" "$OTHER" "$COMMIT" "$DIRTY" "$LIBFABRIC" "$MACHINE" "$OUTFILE" <<'EOF'
import datetime, json, statistics, sys
results, other_file, commit, dirty, libfabric, machine, outfile = sys.argv[1:8]
# (provider, bytes) -> impl -> one result per round
rounds = {}
for line in open(results):
    line = line.strip()
    if line.startswith("{"):
        r = json.loads(line)
        impl = "raw" if r["bench"] == "raw_fi_writedata" else "proxy"
        rounds.setdefault((r["provider"], r["bytes"]), {}).setdefault(impl, []).append(r)
other = {}
for line in open(other_file):
    impl, prov, size, pct = line.strip().split("|")
    other.setdefault((prov, int(size), impl), []).append(int(pct))

def combine(rs):
    if not rs:
        return None
    out = dict(rs[0])
    out["gbytes_per_s"] = statistics.median(r["gbytes_per_s"] for r in rs)
    out["ops_per_s"] = statistics.median(r["ops_per_s"] for r in rs)
    out["gbytes_per_s_min"] = min(r["gbytes_per_s_min"] for r in rs)
    out["gbytes_per_s_max"] = max(r["gbytes_per_s_max"] for r in rs)
    out["runs"] = sum(r["runs"] for r in rs)
    out["rounds"] = len(rs)
    out["round_medians"] = [round(r["gbytes_per_s"], 4) for r in rs]
    return out

print(f"\nproxy path vs raw fi_writedata, {machine}, libfabric {libfabric}, commit {commit}"
      f"{' (dirty)' if dirty == 'true' else ''}")
hdr = (f"{'provider':<12} {'bytes':>8} {'raw GB/s':>9} {'proxy GB/s':>10} {'ratio':>6} {'raw ops/s':>10} "
       f"{'proxy ops/s':>11} {'other%':>7}")
print(hdr)
print("-" * len(hdr))
date = datetime.date.today().isoformat()
records = []
for (prov, size), impls in rounds.items():
    raw, proxy = combine(impls.get("raw", [])), combine(impls.get("proxy", []))
    ratio = proxy["gbytes_per_s"] / raw["gbytes_per_s"] if raw and proxy else None
    fmt = lambda r, k, f: format(r[k], f) if r else "-"
    oth = max(other.get((prov, size, "raw"), [0]) + other.get((prov, size, "proxy"), [0]))
    print(f"{prov:<12} {size:>8} {fmt(raw, 'gbytes_per_s', '.3f'):>9} {fmt(proxy, 'gbytes_per_s', '.3f'):>10} "
          f"{(format(ratio, '.2f') if ratio is not None else '-'):>6} {fmt(raw, 'ops_per_s', '.0f'):>10} "
          f"{fmt(proxy, 'ops_per_s', '.0f'):>11} {oth:>7}")
    for impl, key, r in (("raw_fi_writedata", "raw", raw), ("mkernel_proxy", "proxy", proxy)):
        if not r:
            continue
        rec = {"benchmark": "transport", "impl": impl,
               "shape": {"provider": prov, "bytes": size, "window": r["window"], "op": "write+signal"},
               "world": 2, "nodes": 1, "provider": prov, "libfabric": libfabric,
               "ops_per_s": r["ops_per_s"], "gbytes_per_s": r["gbytes_per_s"],
               "gbytes_per_s_min": r["gbytes_per_s_min"], "gbytes_per_s_max": r["gbytes_per_s_max"],
               "round_medians": r["round_medians"], "rounds": r["rounds"], "runs": r["runs"],
               "ops_per_run": r["ops_per_run"], "other_cpu_pct": other.get((prov, size, key), []),
               "machine": machine, "commit": commit, "dirty": dirty == "true", "date": date}
        if key == "raw":
            rec["completion"] = r.get("completion", "")
            rec["memory"] = r.get("memory", "anon")
        else:
            rec["transport"] = r.get("transport", "")
            rec["producer_wait"] = r.get("producer_wait", "")
            if ratio is not None:
                rec["ratio_to_raw"] = round(ratio, 4)
        records.append(rec)
print("\nGB/s: median over rounds of each round's median run; ratio = proxy GB/s / raw GB/s (goal: at "
      "least 0.8 at 64 KiB and above); other% = the largest share of the machine's CPU time that "
      "work other than these benches and daemons took during one of the size's measurements")
if outfile:
    with open(outfile, "a") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
    print(f"appended {len(records)} lines to {outfile}")
EOF
exit $FAILED
