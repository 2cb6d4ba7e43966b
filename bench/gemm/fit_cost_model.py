#!/usr/bin/env python3
"""Fits the GEMM cost model (kernels/gemm/sm90_bf16_gemm_schedule.h) to benchmark records.

    fit_cost_model.py [--eval BUILD/bench/gemm/gemm_model_eval] [--records FILE ...]
                      [--commits C1,C2,...] [--fit NAME,NAME,...] [--set NAME=VALUE ...]
                      [--holdout-seed SEED] [--iterations N] [--max-regret R]

Reads gemm_bench's JSON lines (bench/results/gemm.jsonl by default), keeps the rows of our
kernel timed on all SMs at the given commits in configurations the rule may choose (without
--opt-in: no 256- or 64-row tiles, no deterministic fix-up, no
L2 promotion but the default), and groups them by (commit, seed, shape): one
group is the configurations of one shape timed in the same interleaved rounds. For a set of
costs it reports
  * the rms error of log(predicted / measured) over every row, and
  * the regret: in each group with two or more configurations, the measured time of the
    configuration the model ranks fastest over the fastest measured one (geometric mean, the
    share of groups where the model's pick is more than 5% slower, and the worst groups).
The rule picks the lowest prediction, so regret is what a choice costs; the error is what the
fit minimises (regret is a step function of the costs). With --fit it minimises, over the named
costs (names as gemm_model_eval takes them), the squared log error within each group (each
prediction's error less its group's mean error: only ratios decide a choice, and the GPU's clock
moves whole runs by several percent), a small weight of the absolute error (so that predicted
times stay times), and a smooth surrogate of the regret (a softmin of each group's predictions weighted by the measured times), reports both
measures before and after, and prints the fitted values as name=value. --holdout-seed leaves
the groups of one random-family seed out of the fit and reports them apart. --max-regret makes
it a check (the CPU test gemm_model_records_test): exit 1 when the given costs' picks on the
records average more than R times the fastest measured configuration.
"""
import argparse
import collections
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def load(records, commits, opt_in=False):
    rows = []
    for path in records:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if commits and r.get("commit") not in commits:
                    continue
                if not r.get("impl", "").startswith("mkernel") or r.get("sms"):
                    continue
                cfg = r.get("config", "")
                if not cfg or r.get("median_ms", 0) <= 0:
                    continue
                # configurations the rule never chooses on its own: opt-in tile heights and the
                # deterministic fix-up (and split tail tiles, which were taken out), and an L2
                # promotion other than the default (" pr<bytes>": the model does not see it)
                if not opt_in and (" det" in cfg or "m256 " in cfg or "m64 " in cfg or "split-tail" in cfg
                                   or " pr" in cfg):
                    continue
                s = r["shape"]
                rows.append((r["commit"], r.get("seed"), s["M"], s["N"], s["K"], cfg, r["median_ms"] * 1000.0))
    # one time per (group, configuration): the fastest of its rows (the same configuration timed
    # under two variant names in one round)
    best = {}
    for c, seed, m, n, k, cfg, t in rows:
        key = (c, seed, m, n, k, cfg)
        if key not in best or t < best[key]:
            best[key] = t
    return [(k[0], k[1], k[2], k[3], k[4], k[5], t) for k, t in best.items()]


def predict(evaluator, rows, params):
    args = [evaluator] + ["%s=%r" % (k, float(v)) for k, v in params.items()]
    text = "".join("%d %d %d %s\n" % (m, n, k, cfg) for _, _, m, n, k, cfg, _ in rows)
    out = subprocess.run(args, input=text, capture_output=True, text=True, check=True).stdout.split()
    if len(out) != len(rows):
        raise RuntimeError("gemm_model_eval returned %d values for %d rows" % (len(out), len(rows)))
    return [float(x) for x in out]


def groups_of(rows):
    g = collections.defaultdict(list)
    for i, r in enumerate(rows):
        g[(r[0], r[1], r[2], r[3], r[4])].append(i)
    return {k: v for k, v in g.items() if len(v) >= 2}


def measures(rows, pred, groups):
    errs = [math.log(p / r[6]) for r, p in zip(rows, pred) if p > 0 and math.isfinite(p)]
    rms = math.sqrt(sum(e * e for e in errs) / len(errs))
    regrets = []
    for key, idx in groups.items():
        pick = min(idx, key=lambda i: pred[i])
        fastest = min(rows[i][6] for i in idx)
        regrets.append((rows[pick][6] / fastest, key, rows[pick][5]))
    geo = math.exp(sum(math.log(r[0]) for r in regrets) / len(regrets))
    over = sum(r[0] > 1.05 for r in regrets) / len(regrets)
    regrets.sort(key=lambda r: r[0], reverse=True)
    return rms, geo, over, regrets


def report(name, rows, pred, groups, worst=8):
    rms, geo, over, regrets = measures(rows, pred, groups)
    print("%s: %d rows, rms log error %.3f; %d groups, regret geometric mean %.4f, %.1f%% over 1.05, worst %.3f"
          % (name, len(rows), rms, len(groups), geo, 100 * over, regrets[0][0]))
    for r, key, cfg in regrets[:worst]:
        print("    %.3f  %s %dx%dx%d  picked [%s]" % (r, key[0], key[2], key[3], key[4], cfg))
    return rms, geo


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", default=os.path.join(ROOT, "build", "bench", "gemm", "gemm_model_eval"))
    ap.add_argument("--records", nargs="+", default=[os.path.join(ROOT, "bench", "results", "gemm.jsonl")])
    ap.add_argument("--commits", default="")
    ap.add_argument("--fit", default="")
    ap.add_argument("--set", nargs="*", default=[])
    ap.add_argument("--holdout-seed", type=int, default=None)
    ap.add_argument("--iterations", type=int, default=3000)
    ap.add_argument("--regret-weight", type=float, default=1.0)
    ap.add_argument("--absolute-weight", type=float, default=0.1,
                    help="weight of the absolute log error beside the error within each run's group")
    ap.add_argument("--max-regret", type=float, default=None,
                    help="exit 1 when the given costs' regret (geometric mean over the groups) exceeds this")
    ap.add_argument("--m-min", type=int, default=1, help="rows with M >= this only")
    ap.add_argument("--m-max", type=int, default=1 << 40, help="rows with M <= this only")
    ap.add_argument("--opt-in", action="store_true", help="keep 256- and 64-row tiles and the deterministic fix-up")
    a = ap.parse_args()
    if not os.access(a.eval, os.X_OK):
        sys.exit("fit_cost_model: %s is not an executable (build the target gemm_model_eval)" % a.eval)
    commits = set(x for x in a.commits.split(",") if x)
    rows = [r for r in load(a.records, commits, a.opt_in) if a.m_min <= r[2] <= a.m_max]
    if not rows:
        sys.exit("fit_cost_model: no rows of our kernel at commits %s in %s" % (sorted(commits), a.records))
    base = {}
    for s in a.set:
        k, _, v = s.partition("=")
        base[k] = float(v)
    hold = [r for r in rows if a.holdout_seed is not None and r[1] == a.holdout_seed]
    train = [r for r in rows if not (a.holdout_seed is not None and r[1] == a.holdout_seed)]
    gtrain = groups_of(train)
    _, given_regret = report("given costs, fit rows", train, predict(a.eval, train, base), gtrain)
    if a.max_regret is not None and given_regret > a.max_regret:
        print("fit_cost_model: the costs' picks average %.4f of the fastest measured configuration, over the "
              "limit %.4f" % (given_regret, a.max_regret))
        sys.exit(1)
    if hold:
        report("given costs, held-out seed %d" % a.holdout_seed, hold, predict(a.eval, hold, base), groups_of(hold))
    names = [x for x in a.fit.split(",") if x]
    if not names:
        return
    try:
        from scipy.optimize import minimize
    except ImportError:
        sys.exit("fit_cost_model: --fit needs scipy (pip install scipy)")
    # starting values: the model's own (gemm_model_eval prints nothing for them, so take them
    # from --set or probe the header's defaults by name)
    start = []
    for nme in names:
        if nme in base:
            start.append(base[nme])
        else:
            start.append(default_value(nme))
    gl = list(gtrain.values())
    times = [r[6] for r in train]

    def objective(x):
        if any(v <= 0 for v in x):
            return 1e9
        params = dict(base)
        params.update(dict(zip(names, x)))
        pred = predict(a.eval, train, params)
        res = [math.log(p / t) for p, t in zip(pred, times)]
        err = a.absolute_weight * sum(e * e for e in res) / len(res)
        # within a group (one run) only the ratios of the predictions matter: the error of
        # each prediction relative to its group's mean error
        within, count = 0.0, 0
        for idx in gl:
            mu = sum(res[i] for i in idx) / len(idx)
            within += sum((res[i] - mu) ** 2 for i in idx)
            count += len(idx)
        err += within / count
        reg = 0.0
        for idx in gl:
            lp = [math.log(pred[i]) for i in idx]
            lo = min(lp)
            w = [math.exp(-(v - lo) / 0.03) for v in lp]
            fastest = min(times[i] for i in idx)
            reg += sum(wi * math.log(times[i] / fastest) for wi, i in zip(w, idx)) / sum(w)
        return err + a.regret_weight * reg / len(gl)

    res = minimize(objective, start, method="Nelder-Mead",
                   options={"maxiter": a.iterations, "maxfev": a.iterations, "xatol": 1e-4, "fatol": 1e-6})
    fitted = dict(base)
    fitted.update(dict(zip(names, res.x)))
    print("fit: %s after %d evaluations, objective %.5f" % (res.message, res.nfev, res.fun))
    report("fitted costs, fit rows", train, predict(a.eval, train, fitted), gtrain)
    if hold:
        report("fitted costs, held-out seed %d" % a.holdout_seed, hold, predict(a.eval, hold, fitted), groups_of(hold))
    print(" ".join("%s=%.4g" % (k, v) for k, v in fitted.items()))


def default_value(name):
    """The header's default for one cost, read from the source (the evaluator has no print)."""
    text = open(os.path.join(ROOT, "kernels", "gemm", "sm90_bf16_gemm_schedule.h")).read()
    regime_fields = ["launch_us", "iter_us_n256_c2", "iter_us_n256_c1", "iter_us_n128_c2", "iter_us_n128_c1",
                     "concurrency", "tile_us_n256", "tile_us_n128", "fixup_latency_us", "sum_latency_us",
                     "partial_bytes_per_us", "dram_bytes_per_us", "cta_bytes_per_us", "sk_iter_factor", "sk_item_us", "cluster2_launch_us",
                     "clusterk_launch_us", "clusterk_reduce_us", "clusterk_wide"]
    if "." in name:
        regime, field = name.split(".", 1)
        marker = "GemmCostRegime %s{" % regime
        start = text.index(marker) + len(marker)
        values = [float(v) for v in text[start:text.index("}", start)].split(",")]
        i = regime_fields.index(field)
        return values[i] if i < len(values) else {"sk_iter_factor": 1.0, "sk_item_us": 0.0, "cluster2_launch_us": 0.0,
                                                          "clusterk_launch_us": 0.0, "clusterk_reduce_us": 1.2,
                                                          "clusterk_wide": 1.0}[field]
    marker = "double %s = " % name
    start = text.index(marker) + len(marker)
    return float(text[start:text.index(";", start)])


if __name__ == "__main__":
    main()
