#!/usr/bin/env python3
"""daemon_bench.py: mkerneld's figures on this machine, from one run.

  - commands per second through validation into the loopback transport on one proxy
    (mkernel-demo-client's rate phase: one host producer thread, 8-byte write+signal commands)
  - session setup time (connect, hello, ring, region and flags for two ranks)
  - daemon resident memory idle and under load

Usage: daemon_bench.py --build-dir build [--runs 5] [--jsonl bench/results/daemon.jsonl]
Prints a table last; appends one JSON object per figure to --jsonl.
"""
import argparse
import datetime
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def wait_socket(path, proc, bound=15.0):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mkerneld exited with {proc.returncode}")
        if os.path.exists(path):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                s.connect(path)
                return
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.05)
    raise RuntimeError(f"{path} did not appear within {bound} s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rate-commands", type=int, default=4000000)
    ap.add_argument("--jsonl", default="")
    ap.add_argument("--machine", default=f"{os.cpu_count()}-core CPU")
    args = ap.parse_args()
    mkerneld = os.path.join(args.build_dir, "daemon", "mkerneld")
    client = os.path.join(args.build_dir, "daemon", "mkernel-demo-client")
    rundir = tempfile.mkdtemp(prefix="mkerneld-bench.")
    proc = subprocess.Popen([mkerneld, "--foreground", "--runtime-dir", rundir, "--log-level", "warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_socket(os.path.join(rundir, "mkerneld.sock"), proc)
        time.sleep(0.5)
        idle = rss_kib(proc.pid)
        rates, setups, peak = [], [], idle
        for _ in range(args.runs):
            stop = threading.Event()

            def sample():
                nonlocal peak
                while not stop.is_set():
                    peak = max(peak, rss_kib(proc.pid))
                    time.sleep(0.01)

            t = threading.Thread(target=sample)
            t.start()
            out = subprocess.run([client, "--runtime-dir", rundir, "--commands", "2000",
                                  "--rate-commands", str(args.rate_commands)],
                                 capture_output=True, text=True, timeout=300)
            stop.set()
            t.join()
            if out.returncode != 0:
                print(out.stdout, out.stderr, file=sys.stderr)
                return 1
            rates.append(float(re.search(r"([0-9.]+) M commands/s", out.stdout).group(1)))
            setups.append(float(re.search(r"set up in ([0-9.]+) ms", out.stdout).group(1)))
        idle_after = rss_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    date = datetime.date.today().isoformat()
    rows = [
        ("loopback_commands_per_s", "M commands/s (median)", statistics.median(rates), {"min": min(rates), "max": max(rates)}),
        ("session_setup_ms", "ms for two sessions (median)", statistics.median(setups), {"min": min(setups), "max": max(setups)}),
        ("rss_idle_kib", "KiB resident, idle", idle, {}),
        ("rss_load_kib", "KiB resident, peak under load", peak, {}),
        ("rss_idle_after_kib", "KiB resident, idle after load", idle_after, {}),
    ]
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            for name, _, value, extra in rows:
                rec = {"benchmark": "daemon", "shape": {"figure": name, "proxies": 1,
                                                         "transport": "loopback", "runs": args.runs},
                       "world": 1, "nodes": 1, "impl": "mkernel", "value": value, **extra,
                       "machine": args.machine, "commit": commit, "date": date}
                f.write(json.dumps(rec) + "\n")
    print(f"\nmkerneld on {args.machine}, {args.runs} runs, commit {commit}")
    print(f"{'figure':<36} {'value':>12}")
    for _, label, value, _ in rows:
        print(f"{label:<36} {value:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
