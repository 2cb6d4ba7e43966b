#!/usr/bin/env bash
# run_example_test.sh: runtime/examples/run_example.sh without a GPU. Stand-ins for nvidia-smi,
# mkerneld, torchrun and an example program check what the script does around the example: its
# refusals (exit 2, with the reason), the daemon's configuration and socket, the environment and
# arguments every rank gets, the example's exit status passed on, the daemon's log on failure,
# the time bound (exit 124), and that the daemon is stopped and its folder removed afterwards.
#   tests/cpu/run_example_test.sh PATH/TO/run_example.sh
set -u
script=${1:?usage: run_example_test.sh PATH/TO/run_example.sh}
work=$(mktemp -d /tmp/run-example-test-XXXXXX)
trap 'rm -rf "$work"' EXIT
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}

fake=$work/bin
mkdir -p "$fake"
# nvidia-smi: FAKE_GPUS lines of indices.
cat > "$fake/nvidia-smi" << 'EOF'
#!/usr/bin/env bash
for ((i = 0; i < ${FAKE_GPUS:-0}; ++i)); do echo "$i"; done
EOF
# mkerneld: keeps its config, binds the socket, records its pid, runs until SIGTERM.
cat > "$fake/mkerneld" << 'EOF'
#!/usr/bin/env python3
import os, signal, socket, sys, time
args = sys.argv[1:]
rdir = args[args.index("--runtime-dir") + 1]
cfg = args[args.index("--config") + 1]
out = os.environ["FAKE_OUT"]
with open(cfg) as f, open(os.path.join(out, "mkerneld.yaml"), "w") as g:
    g.write(f.read())
if os.environ.get("FAKE_DAEMON_FAIL"):
    print("fake mkerneld: bad config", flush=True)
    sys.exit(1)
with open(os.path.join(out, "daemon.pid"), "w") as f:
    f.write(str(os.getpid()))
with open(os.path.join(out, "runtime_dir"), "w") as f:
    f.write(rdir)
s = socket.socket(socket.AF_UNIX)
s.bind(os.path.join(rdir, "mkerneld.sock"))
s.listen()
print("fake mkerneld: serving", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(0.05)
EOF
# torchrun --no-python --nproc_per_node=N --master_addr=A --master_port=P PROGRAM ARGS...: checks
# the environment run_example.sh sets, then runs N ranks of PROGRAM and returns the first failure.
cat > "$fake/torchrun" << 'EOF'
#!/usr/bin/env bash
[ "$1" = --no-python ] || { echo "torchrun stand-in: expected --no-python first, got $1"; exit 9; }
n=${2#--nproc_per_node=}
[[ $3 == --master_addr=127.0.0.1 && $4 =~ ^--master_port=[0-9]+$ ]] || { echo "torchrun stand-in: bad $3 $4"; exit 9; }
shift 4
[ -S "${MKERNEL_SOCKET:-}" ] || { echo "torchrun stand-in: MKERNEL_SOCKET '${MKERNEL_SOCKET:-}' is no socket"; exit 9; }
[[ ${MKERNEL_TOKEN:-} =~ ^[0-9a-f]{32}$ ]] || { echo "torchrun stand-in: MKERNEL_TOKEN '${MKERNEL_TOKEN:-}'"; exit 9; }
[[ ${MKERNEL_PEER_PORT:-} =~ ^[0-9]+$ ]] || { echo "torchrun stand-in: MKERNEL_PEER_PORT"; exit 9; }
[ "${NCCL_NVLS_ENABLE:-}" = 0 ] || { echo "torchrun stand-in: NCCL_NVLS_ENABLE '${NCCL_NVLS_ENABLE:-}'"; exit 9; }
pids=()
for ((r = 0; r < n; ++r)); do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do
  wait "$p" || { s=$?; [ $rc -eq 0 ] && rc=$s; }
done
exit $rc
EOF
# The example: records its rank and arguments, sleeps FAKE_SLEEP, exits FAKE_RC.
cat > "$fake/example" << 'EOF'
#!/usr/bin/env bash
echo "rank $RANK of $WORLD_SIZE: $*" > "$FAKE_OUT/rank$RANK"
sleep "${FAKE_SLEEP:-0}"
exit "${FAKE_RC:-0}"
EOF
chmod +x "$fake"/*

# run NAME EXPECTED_RC [VAR=VALUE...] -- ARGS...: runs the script with the stand-ins; its stderr
# and stdout in $work/NAME.log.
run() {
  local name=$1 want=$2
  shift 2
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  export FAKE_OUT=$work/$name
  mkdir -p "$FAKE_OUT"
  timeout 60 env PATH="$fake:$PATH" MKERNELD="$fake/mkerneld" TORCHRUN="$fake/torchrun" FAKE_GPUS=2 "${envs[@]}" \
    bash "$script" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && [ "$want" -ne 124 ] && fail "$name: the script did not end within 60 s"
  [ $rc -eq "$want" ] || fail "$name: exit $rc, expected $want; output: $(tr '\n' '|' < "$work/$name.log")"
}
expect_log() {  # NAME TEXT
  grep -qF -- "$2" "$work/$1.log" || fail "$1: output lacks \"$2\": $(tr '\n' '|' < "$work/$1.log")"
}
daemon_gone() {  # NAME
  local pid
  pid=$(cat "$work/$1/daemon.pid" 2> /dev/null) || { fail "$1: the daemon never started"; return; }
  kill -0 "$pid" 2> /dev/null && fail "$1: the daemon (pid $pid) still runs after the script ended"
  local rdir
  rdir=$(cat "$work/$1/runtime_dir")
  [ -e "$rdir" ] && fail "$1: the daemon's folder $rdir is still there"
}

# Refusals, each with the reason.
run bad_n 2 -- abc "$fake/example"
expect_log bad_n "N = 'abc'"
run zero_n 2 -- 0 "$fake/example"
expect_log zero_n "expected a positive number of ranks"
run no_program 2 -- 1 "$work/nothing"
expect_log no_program "is not an executable"
run no_daemon 2 MKERNELD=$work/nothing -- 1 "$fake/example"
expect_log no_daemon "no mkerneld"
run no_torchrun 2 TORCHRUN=$work/nothing -- 1 "$fake/example"
expect_log no_torchrun "no torchrun"
run few_gpus 2 FAKE_GPUS=1 -- 2 "$fake/example"
expect_log few_gpus "2 rank(s) need as many GPUs; nvidia-smi sees 1"
run daemon_fails 2 FAKE_DAEMON_FAIL=1 -- 1 "$fake/example"
expect_log daemon_fails "mkerneld exited at start"
expect_log daemon_fails "fake mkerneld: bad config"

# Two ranks: every rank runs with the arguments; the daemon serves GPUs 0 and 1 over shm.
run two_ranks 0 -- 2 "$fake/example" 4096 7168
for r in 0 1; do
  grep -qx "rank $r of 2: 4096 7168" "$work/two_ranks/rank$r" 2> /dev/null ||
    fail "two_ranks: rank $r did not run with the arguments ($(cat "$work/two_ranks/rank$r" 2> /dev/null))"
done
grep -q 'ids: \[0, 1\]' "$work/two_ranks/mkerneld.yaml" || fail "two_ranks: the daemon's GPUs: $(cat "$work/two_ranks/mkerneld.yaml")"
grep -q 'provider: "shm"' "$work/two_ranks/mkerneld.yaml" || fail "two_ranks: the daemon's provider"
daemon_gone two_ranks

# The example's failure is passed on, with the daemon's log.
run example_fails 3 FAKE_RC=3 -- 1 "$fake/example"
expect_log example_fails "mkerneld's log"
expect_log example_fails "fake mkerneld: serving"
daemon_gone example_fails

# The bound: an example that runs past EXAMPLE_TIMEOUT ends with 124 and says so.
run too_long 124 FAKE_SLEEP=30 EXAMPLE_TIMEOUT=1 -- 1 "$fake/example"
expect_log too_long "did not finish within 1 s"
daemon_gone too_long

if [ $fails -ne 0 ]; then
  echo "run_example_test: $fails check(s) failed"
  exit 1
fi
echo "run_example_test: all checks passed"
