"""The tiered closed-loop report: tables and figures from ``tiers_study``'s results, nothing typed.

Every number in ``reports/closed-loop-tiers.md`` is computed here from the measured runs and
the tiered simulator's predictions; each goal is judged by ``results.goal_verdict`` ("met" only
when the whole interval meets it, at every measured point).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.crashtest import report
from experiments.crashtest.report import (
    MARKERS,
    _ci,
    _params,
    _pm,
    policies_figure,
    prediction_figure,
)
from simulator.engines.results import goal_verdict, mean_ci

__all__ = ["render_figures", "summarise", "write_report"]

FIGURE_COLUMNS = ("label", "repeat", "wall_s", "adj_s", "own_s", "replay_s", "speed_spread")
STEADY = 1.25
"""A run whose launches' median step times stayed within this ratio ran at about one speed."""


def summarise(study: dict) -> dict:
    """Paired comparisons with the best single tier, and the goals' verdicts.

    Each comparison is made on the measured wall time and on the *speed-adjusted* one (the
    run's useful compute, the same steps in every run, timed at the study's pooled seconds per
    step instead of its own: on a shared machine the speed drifts whatever the policy, and the
    adjustment leaves every second a policy can change — saves, lost work, restarts — as
    measured; ``report.summarise`` does the same for the single-tier study).
    """
    df = pd.DataFrame(study["rows"])
    labels = list(study["specs"])
    single = next(k for k in labels if study["specs"][k]["kind"] == "fixed")
    step_s = float(df.useful_s.sum() / (study["steps"] * len(df)))
    df["adj_s"] = df.wall_s - df.useful_s + study["steps"] * step_s
    table = df.pivot(index="repeat", columns="label", values="wall_s")[labels]
    adj = df.pivot(index="repeat", columns="label", values="adj_s")[labels]
    exp = study["expected"]
    vs = {}
    for k in labels:
        if k == single:
            continue
        vs[k] = dict(
            diff=table[k] / table[single] - 1.0,
            adj=adj[k] / adj[single] - 1.0,
            predicted=exp[k]["mean_s"] / exp[single]["mean_s"] - 1.0,
        )
    tiered = df[df.label != single]
    commits = [c for cs in tiered.preempt_commit_s for c in cs]
    grace = study["cfg"].grace_s
    verdicts = dict(
        bit_exact=goal_verdict([(float(b),) * 3 for b in df.bit_exact], at_least=1.0),
        prediction=goal_verdict([(abs(e),) * 3 for e in df.own_err], at_most=0.05),
        grace=goal_verdict(
            [(float(c <= grace),) * 3 for c in commits]
            + [(0.0,) * 3] * int(tiered.preemptions.sum() - len(commits)),
            at_least=1.0,
        ),
    )
    for v in vs.values():
        for key in ("diff", "adj"):
            mean, lo, hi = mean_ci(v[key])
            beats = goal_verdict([(mean, lo, hi)], at_most=0.0)
            if beats == "met" and hi == 0.0:  # an interval touching zero shows no gain
                beats = "not shown"
            v[f"{key}_verdict"] = beats
            inside = bool(lo <= v["predicted"] <= hi) if np.isfinite(lo) else None
            v[f"{key}_prediction_in_ci"] = inside
    return dict(
        df=df, labels=labels, single=single, table=table, adj=adj, vs=vs, verdicts=verdicts,
        commits=commits, tiered=tiered, step_s=step_s,
    )  # fmt: skip


def plot(study: dict, s: dict, figdir: Path, stem: str) -> list[Path]:
    """The closed loop's two figures (drawn by its own functions) and the speed figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figdir.mkdir(parents=True, exist_ok=True)
    df, labels = s["df"], s["labels"]
    p1 = prediction_figure(
        df, labels, figdir / f"{stem}-prediction.png", simulator="tiered simulator",
        events="failures",
    )  # fmt: skip
    p2 = policies_figure(
        study["expected"], df, labels, figdir / f"{stem}-policies.png", events="failures"
    )
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.axhspan(-5, 5, color="0.92", zorder=0, label="±5 %")
    ax.axvline(STEADY, color="0.5", ls=":", lw=1, label=f"spread {STEADY:g}")
    for i, label in enumerate(labels):
        d = df[df.label == label]
        err = (d.own_s / d.wall_s - 1.0) * 100
        ax.scatter(d.speed_spread, err, label=label, color=f"C{i}",
                   marker=MARKERS[i % len(MARKERS)], s=32, alpha=0.75, zorder=3)  # fmt: skip
    ax.set(xlabel="slowest / fastest launch of the run (median seconds per step)",
           ylabel="replay error, own parameters (%)")  # fmt: skip
    ax.set_title("The simulator runs at one speed; the shared machine did not", fontsize=9)
    ax.legend(fontsize=6)
    p3 = figdir / f"{stem}-speed.png"
    fig.tight_layout()
    fig.savefig(p3, dpi=120)
    plt.close(fig)
    return [p1, p2, p3]


def save_figure_data(study: dict, s: dict, path: Path) -> Path:
    """What the figures draw, per run (the speed spread too)."""
    return report.save_figure_data(study, s, path, FIGURE_COLUMNS)


def render_figures(path: Path, figdir: Path, stem: str) -> list[Path]:
    """Redraw the figures from :func:`save_figure_data`'s file, running nothing."""
    return report.render_figures(path, figdir, stem, draw=plot)


def _classes(cfg) -> str:
    return ", ".join(f"{k} {v:.0%}" for k, v in cfg.shares.items())


def write_report(
    study: dict, out: Path, figdir: Path, *, command: str, elapsed_s: float | None
) -> Path:
    s = summarise(study)
    figs = plot(study, s, figdir, out.stem)
    save_figure_data(study, s, out.parent / "data" / f"{out.stem}-runs.json")
    cfg, p0, df = study["cfg"], study["pilot"], s["df"]
    pooled = study["pooled"][s["labels"][0]]
    reps = df.repeat.nunique()
    load = study.get("load")
    load_text = (
        f"The machine ({load['cpus']} CPUs) was shared with other work: 1-minute load average "
        f"{load['start']:.1f} at the start and {load['end']:.1f} at the end"
        + (
            f", {np.mean(load['samples']):.1f} on average and {max(load['samples']):.1f} at "
            "most in between (sampled every 30 s)."
            if load.get("samples")
            else " (not sampled in between)."
        )
        + f" Per-run step times ranged {df.step_s.min() * 1e3:.1f}–{df.step_s.max() * 1e3:.1f} "
        f"ms (the pilot's: {p0.step_s * 1e3:.1f} ms)."
        if load
        else "The machine's load during the runs was not recorded."
    )
    L = [
        "# Closed loop with tiers: a failure mix, two checkpoint tiers, the model's prediction",
        "",
        f"Generated by `{command}` "
        + (f"in {elapsed_s / 60:.1f} min" if elapsed_s is not None else "from earlier runs")
        + f"; the runs took {study.get('runs_span_s', float('nan')) / 60:.1f} min from the "
        "pilot's first launch to the last job's exit. Do not edit by hand.",
        "",
        "## Method",
        "",
        f"- Job: the closed-loop study's {_params(cfg)} GPT (`experiments/crashtest/`), one CPU "
        f"thread per process, {study['steps']} useful steps, checkpointed by "
        "`AdaptiveCheckpointer` (weights, AdamW, LR schedule; synchronous saves).",
        f"- Tiers: *local* = `local_dir` in `/dev/shm` (host memory); *persistent* = this "
        f"machine's disk, fsynced, slowed to {cfg.persistent_bytes_per_s / 1e6:g} MB/s by "
        "`experiments/crashtest/slowstore.py` (it writes the checkpoint under a hidden name, "
        "waits as a link of that speed would, then renames it into place; reads are not "
        "slowed) so that a persistent save costs about 30 local ones, the ratio of the "
        "`llama3-tiers` preset (60 s to Tectonic, 2 s to host memory). Measured stalls: local "
        f"{pooled.local_s * 1e3:.0f} ms, persistent {pooled.persistent_s * 1e3:.0f} ms "
        f"(pilot: {p0.local_s * 1e3:.0f} and {p0.persistent_s * 1e3:.0f} ms).",
        f"- Failures: one exponential clock, MTBF {cfg.mtbf_s:g} s for every class together, "
        f"one lifetime per launch drawn up front with a seeded generator, each ending in a "
        f"class drawn by its share ({_classes(cfg)}). *process*: SIGKILL (the local tier "
        "survives); *node*: SIGKILL and the job's local tier wiped; *hang*: SIGSTOP, noticed "
        f"{cfg.hang_timeout_s:g} s later, then SIGKILL; *preemption*: SIGTERM, SIGKILL "
        f"{cfg.grace_s:g} s later if the job has not exited (every policy runs with "
        f"`preemption_grace_s={cfg.grace_s:g}`). The supervisor waits {cfg.restart_delay_s:g} s "
        "after a process is gone and relaunches it; the job resumes from its newest checkpoint.",
        f"- Common random numbers: {reps} repeats, each one list of lifetimes and classes that "
        f"every policy meets; {cfg.workers} jobs at once, shuffled per repeat. One more job ran "
        "without failures: the reference for bit-exact resumption.",
        "- Policies (intervals from the pilot through the model's own functions, "
        "`simulator.model.tiers`): the best single tier (`single_tier_plan`: the persistent "
        "tier at the first-order optimum for every class; a preemption cannot save in time "
        "there, so it is a failure); the model's two-tier plan (`first_order_plan`: τℓ = "
        "√(2Cℓ/λℓ), run as a fixed `TierSchedule`); hand-set round step counts; and the "
        "adaptive tiered controller (`policy=None` with `local_dir`: its prior the clock's mix "
        "as a scenario with `[[failure_class]]` and `[[tier]]` tables, then learning each tier's "
        "stall and each class's rate from its own run log).",
        "- Simulator: `simulator.engines.des_tiers` (the tiered DES) with per-class rates, "
        "detection (a hang's timeout) and restart, per-tier stalls, and a preemption that "
        "commits as a just-in-time save kept in the tier it went to "
        "(`experiments/crashtest/predict_tiers.py`). *Replay*: the run's own failures (time and "
        "class) with its own measured parameters (filled markers) or the study's pooled ones "
        "(hollow); *expected*: Monte-Carlo over the clock "
        f"({cfg.replicas} replicas). Both add the measured first start-up.",
        f"- {load_text}",
        "",
        "## Results",
        "",
        "| policy | measured wall (s) | simulator expected (s) | failures (process/node/hang/"
        "preemption) | lost steps | local / persistent saves | saving (s) | recovery (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    exp = study["expected"]
    for k in s["labels"]:
        d = df[df.label == k]
        counts = "/".join(
            f"{np.mean([cs.count(c) for cs in d.classes]):.1f}"
            for c in ("process", "node", "hang", "preemption")
        )
        L.append(
            f"| {k} | {_pm(d.wall_s, 1.0, '{:.1f}')} | {exp[k]['mean_s']:.1f} "
            f"(sd {exp[k]['sd_s']:.1f}) | {counts} | {d.lost_steps.mean():.0f} | "
            f"{d.local_saves.mean():.0f} / {d.persistent_saves.mean():.0f} | "
            f"{d.saving_s.mean():.1f} | {d.recovery_s.mean():.1f} |"
        )
    L += [
        "",
        f"Means ± sd over the {reps} repeats; the reference (no failures) took "
        f"{study['reference']['wall_s']:.1f} s. Intervals the runs kept (seconds of compute, "
        "mean over runs): "
        + "; ".join(
            f"{k}: " + ", ".join(f"{t} {v:.2f}" for t, v in exp[k]["intervals_s"].items())
            for k in s["labels"]
        )
        + ".",
        "",
        "## Goals",
        "",
    ]
    v = s["verdicts"]
    steady = df[df.speed_spread <= STEADY]
    unsteady = df[df.speed_spread > STEADY]
    L += [
        f"- **Every run resumes bit-exactly** (final weights and AdamW moments equal to the "
        f"reference, tensor by tensor): {int(df.bit_exact.sum())} of {len(df)} runs — "
        f"{v['bit_exact']}.",
        f"- **Prediction within 5 % of the measured wall time, per run** (replay with the run's "
        f"own parameters): error {_pm(df.own_err)} % (mean ± sd over {len(df)} runs), largest "
        f"{df.own_err.abs().max() * 100:.1f} %, {(df.own_err.abs() <= 0.05).sum()} of "
        f"{len(df)} within 5 % — {v['prediction']} (every run is a point). With the pooled "
        f"parameters: {_pm(df.replay_err)} %, largest {df.replay_err.abs().max() * 100:.1f} %. "
        f"The simulator runs a job at one speed; the machine's did not stay put: per run, the "
        f"slowest launch's median step took {df.speed_spread.median():.2f}x the fastest's "
        f"(median over runs; up to {df.speed_spread.max():.2f}x). Of the {len(steady)} runs "
        f"that stayed within {STEADY:g}x, {(steady.own_err.abs() <= 0.05).sum()} were predicted "
        f"within 5 % (largest error {steady.own_err.abs().max() * 100:.1f} %); of the "
        f"{len(unsteady)} others, {(unsteady.own_err.abs() <= 0.05).sum()} (the third figure "
        "shows every run). Outside 5 %: "
        + (
            "; ".join(
                f"repeat {r.repeat} {r.label} {r.own_err * 100:+.1f} % (failures "
                f"{', '.join(r.classes)}; speed spread {r.speed_spread:.2f}x)"
                for r in df[df.own_err.abs() > 0.05].itertuples()
            )
            or "none"
        )
        + ". A replay at one speed can also put a failure on the other side of a save than "
        "the run met it, which matters most where that save is a rare persistent one.",
    ]
    where = {True: "inside it", False: "outside it", None: "no interval to hold it"}
    for k, c in s["vs"].items():
        L.append(
            f"- **{k} against the best single tier** (wall time, paired over the repeats; "
            f"the model's prediction is the simulator's expected ratio − 1: "
            f"{c['predicted'] * 100:+.1f} %): measured {_ci(c['diff'])}, "
            f"{where[c['diff_prediction_in_ci']]} — beats it: {c['diff_verdict']}; "
            f"speed-adjusted {_ci(c['adj'])}, {where[c['adj_prediction_in_ci']]} — beats it: "
            f"{c['adj_verdict']}."
        )
    tiered = s["tiered"]
    n_pre = int(tiered.preemptions.sum())
    within = sum(c <= cfg.grace_s for c in s["commits"])
    longest = max(s["commits"]) if s["commits"] else float("nan")
    single = df[df.label == s["single"]]
    single_commits = [c for cs in single.preempt_commit_s for c in cs]
    L += [
        f"- **A SIGTERM turned into a committed checkpoint within the {cfg.grace_s:g} s grace "
        f"period** (policies with a local tier; from the SIGTERM until the job logged the "
        f"committed save): {within} of {n_pre} tries, longest "
        f"{longest:.3f} s — {v['grace']}. The single tier, whose persistent save takes "
        f"{study['pooled'][s['single']].persistent_s:.2f} s, committed {len(single_commits)} of "
        f"{int(single.preemptions.sum())} before the kill.",
        "",
        f"Per repeat, measured wall / speed-adjusted wall (s; useful compute at the pooled "
        f"{s['step_s'] * 1e3:.1f} ms per step; per-run step times ranged "
        f"{df.step_s.min() * 1e3:.1f}–{df.step_s.max() * 1e3:.1f} ms), and the failures the "
        "schedule dealt (each policy meets them in this order, as many as its run lasted):",
        "",
        "| repeat | failures dealt | " + " | ".join(s["labels"]) + " |",
        "|---|---" + "|---" * len(s["labels"]) + "|",
    ]
    for r in s["table"].index:
        d = df[df.repeat == r]
        dealt = max(d.classes, key=len)
        cells = [f"{s['table'].loc[r, k]:.1f} / {s['adj'].loc[r, k]:.1f}" for k in s["labels"]]
        L.append(f"| {r} | {', '.join(dealt)} | " + " | ".join(cells) + " |")
    L += ["", *[f"![{f.stem}](figures/{f.name})" for f in figs], ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(L), encoding="utf-8")
    return out
