# private-mkerneld.sh: a private mkerneld for one run on this machine (sourced, not run), used by
# runtime/examples/run_example.sh and tests/gpu/python/run.sh. It serves GPUs 0 .. ranks - 1
# (libfabric shm between ranks it does not serve; ranks on it meet over NVLink), listens for peers
# on a free TCP port, and is stopped by private_mkerneld_stop.
#
#   private_mkerneld_start MKERNELD RANKS DIR [PYTHON]
#       starts it with its runtime folder DIR (config, socket, log in DIR/mkerneld.log) and waits
#       (at most 20 s) for its socket. Returns 0 with MKERNEL_SOCKET and MKERNEL_PEER_PORT
#       exported and private_mkerneld_pid set; otherwise 1 with the reason and the log's tail on
#       stderr. PYTHON (default python3) finds free ports.
#   private_mkerneld_free_port [PYTHON]   prints a free TCP port on 127.0.0.1
#   private_mkerneld_stop                 SIGTERM, then SIGKILL after 10 s; safe to call twice
private_mkerneld_pid=

private_mkerneld_free_port() {
  "${1:-python3}" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"
}

private_mkerneld_start() {
  local mkerneld=$1 ranks=$2 dir=$3 python=${4:-python3} peer_port
  peer_port=$(private_mkerneld_free_port "$python") || { echo "no free TCP port (with $python)" >&2; return 1; }
  cat > "$dir/mkerneld.yaml" << EOF
gpus: {select: list, ids: [$(seq -s ", " 0 $((ranks - 1)))]}
transport: {kind: fabric, provider: "shm"}
proxy: {poll: {mode: spin}, cpu_affinity: none}
timeouts: {command_ms: 5000, rendezvous_ms: 30000}
peer: {listen: ["tcp:127.0.0.1:$peer_port"]}
EOF
  "$mkerneld" --foreground --runtime-dir "$dir" --config "$dir/mkerneld.yaml" > "$dir/mkerneld.log" 2>&1 &
  private_mkerneld_pid=$!
  for _ in $(seq 200); do
    [ -S "$dir/mkerneld.sock" ] && break
    if ! kill -0 "$private_mkerneld_pid" 2> /dev/null; then
      echo "mkerneld exited at start:" >&2
      tail -20 "$dir/mkerneld.log" >&2
      private_mkerneld_pid=
      return 1
    fi
    sleep 0.1
  done
  if [ ! -S "$dir/mkerneld.sock" ]; then
    echo "mkerneld made no socket within 20 s:" >&2
    tail -20 "$dir/mkerneld.log" >&2
    return 1
  fi
  export MKERNEL_SOCKET=$dir/mkerneld.sock MKERNEL_PEER_PORT=$peer_port
}

private_mkerneld_stop() {
  [ -n "$private_mkerneld_pid" ] || return 0
  kill -TERM "$private_mkerneld_pid" 2> /dev/null
  for _ in $(seq 100); do kill -0 "$private_mkerneld_pid" 2> /dev/null || break; sleep 0.1; done
  kill -KILL "$private_mkerneld_pid" 2> /dev/null
  wait "$private_mkerneld_pid" 2> /dev/null
  private_mkerneld_pid=
}
