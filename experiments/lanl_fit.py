"""Fit per-node times between failures and per-cause repair times to the LANL record.

Run from the repository root:  ``.venv/bin/python -m experiments.lanl_fit``

When the released file (``../shared/data/lanl/LA-UR-05-7318-failure-data-1996-2005.csv.xz``,
or ``--source``) is present, ``simulator/data/lanl_failures.csv.gz`` is rebuilt from it first;
otherwise the committed table is used. Every number in ``reports/lanl-fit.md`` is computed
here. Checks, not assumes, the published findings (Schroeder and Gibson, DSN 2006): a
decreasing hazard (Weibull shape < 1) for times between failures, lognormal repair times.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from simulator import analytic, optimize
from simulator.fitting import fit, lanl
from simulator.model.scenario import Scenario
from simulator.model.trace import TraceStart
from simulator.optimize import paired_excess
from simulator.policies import FixedInterval

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "lanl-fit.md"
TABLE = ROOT / "simulator" / "data" / "lanl_failures.csv.gz"
_REL = "shared/data/lanl/LA-UR-05-7318-failure-data-1996-2005.csv.xz"
SOURCE = next(
    (p / _REL for p in (ROOT.parent, ROOT.parent.parent) if (p / _REL).exists()), ROOT.parent / _REL
)
LARGE = (18, 19, 20)  # the systems of 512 nodes or more
HOUR, DAY = 3600.0, 86400.0


def tbf_section(table) -> list[str]:
    out = ["## Per-node time between failures", ""]
    for system in LARGE:
        nl = lanl.node_lifetimes(table, system)
        fits = fit.fit_all(nl.durations_s, nl.observed)
        w = next(f for f in fits if f.family == "weibull")
        lo, hi = w.ci95["shape"]
        verdict = (
            "decreasing hazard (shape < 1, the whole 95% CI below 1)"
            if hi < 1
            else "increasing hazard (shape > 1)"
            if lo > 1
            else "shape not distinguishable from 1"
        )
        nodes = int(table.loc[table.system == system, "nodes"].iloc[0])
        out += [
            f"### System {system} ({nodes} nodes)",
            "",
            f"{int(nl.observed.sum())} failures, {int((~nl.observed).sum())} censored lifetimes "
            f"({nl.nodes_seen} nodes with failures, {nl.nodes_never_failed} never failed and "
            f"enter as censored; {nl.before_production} nodes had a failure before their "
            "production date, their clock starts there). Best by AIC: "
            f"**{fits[0].family}**. Weibull shape {w.params['shape']:.3f} "
            f"(95% CI {lo:.3f}–{hi:.3f}): {verdict}.",
            "",
            fit.fits_table(fits, DAY, "d"),
            "",
            _km_lines(nl.durations_s, nl.observed, fits),
            "",
        ]
    return out


def _km_lines(t, obs, fits) -> str:
    parts = []
    for f in fits:
        km = fit.km_check(t, obs, f)
        parts.append(
            f"{f.family}: largest gap from Kaplan–Meier {km['max_gap']:.3f}, inside its 95% "
            f"band at {100 * km['in_band']:.0f}% of failure times"
        )
    return "Against Kaplan–Meier: " + "; ".join(parts) + "."


def repair_section(table) -> list[str]:
    rows = table[table.system.isin(LARGE)]
    bad = int((rows.down_min <= 0).sum())
    out = [
        "## Repair (down) times by root cause, systems " + ", ".join(map(str, LARGE)),
        "",
        f"{len(rows)} failures; {bad} with a non-positive down time are left out. Down times "
        "are complete (no censoring).",
        "",
        "| cause | repairs | best by AIC | lognormal ΔAIC | lognormal σ (95% CI) | "
        "median, h | mean, h | lognormal KM gap |",
        "| --- | ---: | --- | ---: | --- | ---: | ---: | ---: |",
    ]
    detail = []
    for cause in sorted(rows.cause.unique()):
        r = rows.loc[(rows.cause == cause) & (rows.down_min > 0), "down_min"].to_numpy(float)
        if r.size < 10:
            continue
        t, obs = r * 60.0, np.ones(r.size, bool)
        fits = fit.fit_all(t, obs)
        ln = next(f for f in fits if f.family == "lognormal")
        lo, hi = ln.ci95["sigma"]
        km = fit.km_check(t, obs, ln)
        out.append(
            f"| {cause} | {r.size} | {fits[0].family} | {ln.aic - fits[0].aic:.1f} | "
            f"{ln.params['sigma']:.3f} ({lo:.3f}–{hi:.3f}) | {np.median(r) / 60:.2f} | "
            f"{r.mean() / 60:.2f} | {km['max_gap']:.3f} |"
        )
        detail += [f"### {cause}", "", fit.fits_table(fits, HOUR, "h"), ""]
    return [*out, "", *detail]


# The replayed job: assumed (not from the record), HPC-era costs for a whole-system job.
REPLAY = {"system": 18, "checkpoint_s": 300.0, "restart_s": 1800.0, "work_h": 168.0}
REPLICAS = 400
SEED = 2006


def system_failure_times(table, system: int) -> np.ndarray:
    """Sorted distinct failure start times of one system (seconds from its first)."""
    import pandas as pd

    t = pd.to_datetime(table.loc[table.system == system, "start"]).to_numpy("datetime64[s]")
    t = np.unique(t.astype(np.int64)).astype(float)
    return t - t[0]


def replay_section(table) -> list[str]:
    sysno, work_h = REPLAY["system"], REPLAY["work_h"]
    times = system_failure_times(table, sysno)
    gaps = np.diff(times)
    fits = fit.fit_all(gaps, np.ones(gaps.size, bool))
    expo = next(f for f in fits if f.family == "exponential")
    best = fits[0]
    nodes = int(table.loc[table.system == sysno, "nodes"].iloc[0])
    base = dict(
        gpus=nodes,
        gpus_per_node=1,
        checkpoint_s=REPLAY["checkpoint_s"],
        restart_s=REPLAY["restart_s"],
        work_h=work_h,
        usd_per_gpu_hour=1.0,
    )
    tau_exp = float(analytic.optimal_interval(REPLAY["checkpoint_s"], expo.mean_s))
    s_best = Scenario(
        name="lanl-best", mtbf_h=best.mean_s / HOUR, failure=fit.failure_spec(best), **base
    )
    res = optimize.optimize_by_simulation(
        s_best, replicas=REPLICAS, seed=SEED, adaptive=False, bootstrap=50, baselines=()
    )
    tau_best = res["interval_s"]
    # Each replica replays the real record from its own uniform start, with at least four
    # times the job's work still ahead of it.
    trace = TraceStart(times, keep_s=4.0 * work_h * HOUR)

    s_trace = Scenario(name="lanl-trace", mtbf_h=expo.mean_s / HOUR, **base)
    taus = [tau_exp, tau_best, 3600.0]
    labels = ["exponential fit (Young/Daly exact)", f"best fit ({best.family}, simulated)", "1 h"]
    out = optimize.evaluate(
        s_trace, [FixedInterval(t) for t in taus], replicas=REPLICAS, seed=SEED + 1,
        failure_times=trace,
    )  # fmt: skip
    cost, wall = out["cost_usd"], out["wall_s"]
    rows = [
        "| interval from | interval, min | mean waste | excess cost vs best fit's (95% CI) |",
        "| --- | ---: | ---: | --- |",
    ]
    for i, (lab, t) in enumerate(zip(labels, taus, strict=True)):
        ex = paired_excess(cost[i], cost[1])
        ref = cost[1].mean()
        rows.append(
            f"| {lab} | {t / 60:.1f} | {100 * (1 - work_h * HOUR / wall[i].mean()):.2f}% | "
            f"{100 * ex['mean'] / ref:+.2f}% ({100 * ex['lo'] / ref:+.2f}% to "
            f"{100 * ex['hi'] / ref:+.2f}%) |"
        )
    return [
        f"## Replaying system {sysno}'s failures against a job",
        "",
        f"System {sysno}'s {times.size} distinct failure times (any node: each stops a "
        f"whole-system job) give {gaps.size} gaps; best fit by AIC **{best.family}** "
        f"({', '.join(f'{k} = {v:.4g}' for k, v in best.params.items())}), exponential mean "
        f"{expo.mean_s / HOUR:.2f} h. Assumed job (not from the record): {work_h:.0f} h of "
        f"work on all {nodes} nodes, a {REPLAY['checkpoint_s']:.0f} s save, "
        f"{REPLAY['restart_s']:.0f} s restart. The exponential fit's interval is the exact "
        f"closed-form optimum; the best fit's is `optimize_by_simulation` on a renewal process "
        f"of that family ({REPLICAS} replicas). Each replica then replays the real failures "
        f"from a random start in the record ({REPLICAS} replicas, the same windows for every "
        "interval).",
        "",
        fit.fits_table(fits, HOUR, "h"),
        "",
        *rows,
        "",
        f"The best fit's interval is {100 * (tau_best / tau_exp - 1):+.1f}% from the "
        "exponential fit's (the best fit's search has its own noise: 95% CI "
        f"{res['interval_ci_s'][0] / 60:.1f}–{res['interval_ci_s'][1] / 60:.1f} min); the "
        "table's excess is what that difference costs on the real failures.",
        "",
    ]


def classes_section(table) -> list[str]:
    """System 20's causes as failure classes: what ``ckptsim fit --scenario-out`` writes from
    the committed log (``experiments/example_log.py`` commits that scenario), computed here
    by the same functions, so the table and the file agree."""
    from experiments import example_log
    from simulator.fitting.faillog import read_failure_log

    log = read_failure_log(example_log.OUT, repair_unit="min")
    result = fit.fit_log(log)
    total = log.events
    study = int(lanl.node_lifetimes(table, example_log.SYSTEM).observed.sum())
    rel = example_log.SCENARIO.relative_to(ROOT)
    out = [
        "## Failure classes: system 20's causes",
        "",
        f"`{rel}` is the class mix `ckptsim fit {example_log.OUT.relative_to(ROOT)} "
        f"{' '.join(example_log.CLASSES_ARGS)} --scenario-out FILE` writes "
        "(`experiments/example_log.py` regenerates it). The log has no production or "
        "decommission dates, so its lifetimes are the gaps between one node's failures (the "
        f"section above times first failures from production and censors at decommission: "
        f"{total:,} failures here against its {study:,}). Each cause with a fit of its own is "
        "a class: its best family whose mean the log supports, fitted with the gaps other "
        "causes ended censored, as a node's "
        "MTBF; its restart the mean of its best fitted down time, which stands in for the "
        "restart cost (a job restarting on a spare waits less).",
        "",
        "| class | failures (share) | family | node MTBF, h | restart (mean down time), h |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    classes = fit.cause_classes(log, result, system=False)
    for cls, _ in classes:
        events = result["causes"].get(cls["name"], {}).get("events")
        share = f"{events:,} ({100 * events / total:.1f} %)" if events else "pooled"
        restart = f"{cls['restart_s'] / HOUR:.2f}" if "restart_s" in cls else "scenario's"
        out.append(
            f"| {cls['name']} | {share} | {cls['failure']} | {cls['gpu_mtbf_h']:,.0f} | {restart} |"
        )
    passed = [c for c, _ in classes if c["failure"].split(":")[0] != result["causes"].get(
        c["name"], {}).get("best", c["failure"].split(":")[0])]  # fmt: skip
    out += [
        "",
        f"{len(passed)} of {len(classes)} classes take a family other than their cause's best "
        f"by AIC: that fit's mean lies more than {fit.PLAUSIBLE_FACTOR:g}x from the cause's "
        "own failures per exposure, or its shape is one no simulation samples (the comments "
        "in the file say which family each passed over). `--cause-column none` writes the whole "
        "log's fit instead.",
        "",
    ]
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=SOURCE)
    args = parser.parse_args([] if argv is None else argv)  # run_all calls main()
    if args.source.exists():
        # mtime 0: a rebuild from the same release is byte-identical, so git sees no change.
        lanl.build_table(args.source).to_csv(
            TABLE, index=False, compression={"method": "gzip", "mtime": 0}
        )
    table = lanl.load_table()
    lines = [
        "# LANL failure record (1996–2005): hazard shape and repair times",
        "",
        "Generated by `experiments/lanl_fit.py` from `simulator/data/lanl_failures.csv.gz` "
        "(derived from LANL's release LA-UR-05-7318; see `simulator/data/PROVENANCE.md`). "
        "Censored maximum-likelihood fits from `simulator.fitting.fit`; lifetimes from "
        "`simulator.fitting.lanl.node_lifetimes` (its docstring says how censoring and "
        "inconsistent rows are treated). Published analysis: B. Schroeder and G. A. Gibson, "
        "DSN 2006.",
        "",
        *tbf_section(table),
        *repair_section(table),
        *classes_section(table),
        *replay_section(table),
    ]
    REPORT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {REPORT.relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
