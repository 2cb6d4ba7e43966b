#!/usr/bin/env python3
"""daemon_bench.py: mkerneld's figures on this machine, from one run.

  - commands per second through validation into the loopback transport on one proxy
    (mkernel-demo-client's rate phase: one host producer thread, 8-byte write+signal commands)
  - session setup time (connect, hello, ring, region and flags for two ranks)
  - daemon resident memory idle and under load
  - with --attacks: what hostile and careless clients do (run by mkernel-hostile-client): per attack
    the daemon's resident memory and descriptors, a healthy client's hello and ping latency and
    failures beside it, admin health, and whether everything recovers once the attacker leaves

Usage: daemon_bench.py --build-dir build [--runs 5] [--jsonl bench/results/daemon.jsonl]
       daemon_bench.py --build-dir build --attacks [--only NAME,...] [--jsonl ...]
Prints a table last; appends one JSON object per figure (or per attack) to --jsonl.
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


# ---- attacks --------------------------------------------------------------------------------

# name -> (mkerneld config, attacker invocations, probe seconds). The built-in default config,
# as an attacker on the node meets it, except where an attack needs the metrics endpoint.
METRICS_CONFIG = "metrics:\n  enabled: true\n  listen: \"127.0.0.1:{port}\"\n"
ATTACKS = {
    "none": ("", [], 3),
    "idle-connections": ("", [["idle-connections", "--count", "10000"]], 3),
    "regions": ("", [["regions", "--count", "4", "--per", "1000", "--bytes", "4096"]], 3),
    "handles": ("", [["handles", "--count", "16", "--per", "64"]], 3),
    "slots": ("", [["slots", "--count", "64"]], 3),
    "world": ("", [["world", "--count", "60", "--world", str(1 << 20)]], 3),
    "big-rings": ("", [["big-rings", "--count", "2", "--per", "16", "--log2", "20"]], 3),
    "slow-readers": ("", [["slow-readers", "--count", "8"]], 5),
    "malformed": ("", [["malformed", "--count", "20"]], 2),
    "log-inject": ("", [["log-inject"]], 1),
    "networks": ("", [["networks", "--count", "16"]], 2),
    "metrics-idle": (METRICS_CONFIG, [["metrics-idle", "--count", "2"]], 2),
    "combined": ("", [["slow-readers", "--count", "8"], ["idle-connections", "--count", "10000"],
                      ["world", "--count", "60", "--world", str(1 << 20)]], 5),
}


def status_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def num_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def scrape_ms(port, bound=35.0):
    """One GET /metrics: (milliseconds, body) or (None, error)."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=bound) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            chunks = []
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        return (time.monotonic() - t0) * 1000, b"".join(chunks).decode(errors="replace")
    except OSError as e:
        return None, str(e)


def run_attack(args, name, commit, date):
    import resource
    config, attackers, probe_s = ATTACKS[name]
    tool = os.path.join(args.build_dir, "tests", "integration", "mkernel-hostile-client")
    mkerneld = os.path.join(args.build_dir, "daemon", "mkerneld")
    rundir = tempfile.mkdtemp(prefix="mkerneld-attack.")
    port = 0
    cmd = [mkerneld, "--foreground", "--runtime-dir", rundir]
    if config:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        path = os.path.join(rundir, "mkerneld.yaml")
        with open(path, "w") as f:
            f.write(config.format(port=port))
        cmd += ["--config", path]
    log_path = os.path.join(rundir, "mkerneld.log")
    nofile = args.daemon_nofile

    def limit():
        # The soft limit as systemd (DefaultLimitNOFILE=1024:524288) or a shell gives it; the hard
        # limit stays. (The "before" figures were taken with the hard limit at 1024 too: the
        # daemon then never raised its soft limit, so they are the same.)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(nofile, hard), hard))

    log = open(log_path, "wb")
    daemon = subprocess.Popen(cmd, stdout=log, stderr=log, preexec_fn=limit)
    sock = os.path.join(rundir, "mkerneld.sock")
    admin = "unix:" + os.path.join(rundir, "admin.sock")
    row = {"attack": name}
    procs = []
    try:
        wait_socket(sock, daemon)
        time.sleep(0.3)
        row["rss_idle_kib"] = status_kib(daemon.pid, "VmRSS")
        row["fds_idle"] = num_fds(daemon.pid)
        log_before = os.path.getsize(log_path)
        peak = {"rss": row["rss_idle_kib"], "fds": row["fds_idle"]}
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak["rss"] = max(peak["rss"], status_kib(daemon.pid, "VmRSS"))
                peak["fds"] = max(peak["fds"], num_fds(daemon.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        ready = []
        t0 = time.monotonic()
        for a in attackers:
            extra = ["--port", str(port)] if a[0] == "metrics-idle" else []
            p = subprocess.Popen([tool, "--socket", sock, "--hold", "120"] + a + extra,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            procs.append(p)
            line = p.stdout.readline()
            try:
                ready.append(json.loads(line))
            except ValueError:
                ready.append({"ready": a[0], "error": line.strip()[:200]})
        row["setup_s"] = round(time.monotonic() - t0, 2)
        row["attackers"] = ready
        if name == "metrics-idle":
            ms, body = scrape_ms(port)
            row["scrape_ms_beside_idle"] = ms
            row["scrape_nan_spelling_ok"] = ms is not None and "Nan" not in body
        probe = subprocess.run([tool, "--socket", sock, "--admin", admin, "probe", "--seconds", str(probe_s)],
                               capture_output=True, text=True, timeout=probe_s + 120)
        row["during"] = json.loads(probe.stdout.strip().splitlines()[-1])
        stop.set()
        sampler.join()
        row["rss_peak_kib"] = peak["rss"]
        row["fds_peak"] = peak["fds"]
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        time.sleep(1.5)
        after = subprocess.run([tool, "--socket", sock, "--admin", admin, "probe", "--seconds", "1.5"],
                               capture_output=True, text=True, timeout=120)
        row["after"] = json.loads(after.stdout.strip().splitlines()[-1])
        row["rss_after_kib"] = status_kib(daemon.pid, "VmRSS")
        row["fds_after"] = num_fds(daemon.pid)
        row["log_bytes"] = os.path.getsize(log_path) - log_before
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        daemon.terminate()
        try:
            daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()
    row["recovered"] = (row.get("after", {}).get("hello", {}).get("failures", 1) == 0 and
                        row.get("after", {}).get("health", {}).get("failures", 1) == 0)
    return row


def run_attacks(args):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    date = datetime.date.today().isoformat()
    names = [n for n in args.only.split(",") if n] or list(ATTACKS)
    rows = []
    for name in names:
        row = run_attack(args, name, commit, date)
        rows.append(row)
        d = row["during"]
        print(f"{name:<17} rss {row['rss_idle_kib']:>7}->{row['rss_peak_kib']:>8}->{row['rss_after_kib']:>7} KiB  "
              f"fds {row['fds_idle']:>4}->{row['fds_peak']:>5}->{row['fds_after']:>4}  "
              f"hello p99 {d['hello']['p99_ms']:>8.2f} ms fail {d['hello']['failures']:>3}  "
              f"ping p99 {d['ping']['p99_ms']:>8.2f} ms  health fail {d['health']['failures']:>3}  "
              f"recovered {row['recovered']}  log {row['log_bytes']} B", flush=True)
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            for row in rows:
                rec = {"benchmark": "daemon", "shape": {"figure": "attack", "attack": row["attack"],
                                                         "daemon_nofile": args.daemon_nofile},
                       "world": 1, "nodes": 1, "impl": "mkernel", "label": args.label,
                       **{k: v for k, v in row.items() if k != "attack"},
                       "machine": args.machine, "commit": commit, "date": date}
                f.write(json.dumps(rec) + "\n")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rate-commands", type=int, default=4000000)
    ap.add_argument("--jsonl", default="")
    ap.add_argument("--machine", default=f"{os.cpu_count()}-core CPU")
    ap.add_argument("--attacks", action="store_true", help="measure the attacks instead")
    ap.add_argument("--only", default="", help="--attacks: comma-separated attack names")
    ap.add_argument("--label", default="", help="--attacks: recorded as 'label' (e.g. before, after)")
    ap.add_argument("--daemon-nofile", type=int, default=1024,
                    help="--attacks: the daemon's descriptor limit (systemd's default is 1024)")
    args = ap.parse_args()
    if args.attacks:
        return run_attacks(args)
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
